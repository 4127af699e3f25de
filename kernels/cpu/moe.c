/*
 * Token dispatch to experts and the grouped expert GEMMs.
 *
 * Shapes: T tokens, K choices per token, E experts, R = T*K expert rows,
 * H hidden; the expert GEMM maps Kd input features to N output features.
 *   topk_idx, w, dw  [T, K]     row_of [T*K]    token_of_row [R]
 *   counts [E]  offsets [E+1]   x, dx, y, dy [T, H]   xe, dxe, ye, dye [R, H]
 *   grouped GEMM: xe [R, Kd], ye [R, N], W[e] [N, Kd]
 *
 * Dispatch is a counting sort: expert-major rows, (token, choice) order inside
 * an expert. Gather, scatter-add (gather_bwd), combine and its backward are
 * partitioned over rows or tokens: each output row has one owner and its sums
 * run in j order.
 *
 * Grouped GEMM. Every output element is one dot product evaluated in a fixed
 * sequential order over the contraction index, starting from 0 (or from the old
 * dW for the weight gradient, which is added), whatever the tiling:
 *   fwd:        ye[r,n]   = sum_k  xe[r,k]  * W[n,k]      (k = 0..Kd-1)
 *   bwd_data:   dxe[r,k]  = sum_n  dye[r,n] * W[n,k]      (n = 0..N-1)
 *   bwd_weight: dW[n,k]  += dye[r,n] * xe[r,k] for the expert's rows in order
 *               (in parts: each part summed from 0 in row order, then added
 *               into dW in part order; expert parallelism's rows by source rank)
 * Each task is one mf_cpu_gemm call (gemm_impl.h), whose blocking changes
 * speed, never bits.
 * The work is split into tasks (expert, row block, column block) — or (expert,
 * n block, k block) for dW — each owning its output elements; tasks are dealt
 * to threads by their cost, which affects only the timing.
 */
#include <string.h>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/gemm_impl.h"

static inline mf_threadpool *pool_of(const mf_kctx *ctx) {
  return ctx ? ctx->pool : NULL;
}
static inline int round_of(const mf_kctx *ctx) {
  return ctx ? ctx->round_bf16 : 0;
}

/* ------------------------------------------------------------- dispatch */

mf_status mf_cpu_moe_dispatch(const int32_t *topk_idx, int64_t T, int64_t K, int64_t E, int64_t *counts,
                              int64_t *offsets, int32_t *row_of, int32_t *token_of_row) {
  if (E <= 0 || K <= 0 || T < 0)
    return MF_ERR(MF_ERR_INVALID_ARG, "moe dispatch: T=%lld K=%lld E=%lld", (long long)T, (long long)K,
                  (long long)E);
  if (T * K > INT32_MAX)
    return MF_ERR(MF_ERR_INVALID_ARG, "moe dispatch: %lld rows do not fit int32 row indices",
                  (long long)(T * K));
  const int64_t R = T * K;
  for (int64_t e = 0; e < E; e++) counts[e] = 0;
  for (int64_t i = 0; i < R; i++) {
    int32_t e = topk_idx[i];
    if (e < 0 || e >= E)
      return MF_ERR(MF_ERR_INVALID_ARG, "moe dispatch: topk_idx[%lld] = %d is not an expert of %lld",
                    (long long)i, (int)e, (long long)E);
    counts[e]++;
  }
  offsets[0] = 0;
  for (int64_t e = 0; e < E; e++) offsets[e + 1] = offsets[e] + counts[e];
  /* counts doubles as the fill cursor and ends where it started. */
  for (int64_t e = 0; e < E; e++) counts[e] = 0;
  for (int64_t i = 0; i < R; i++) {
    int32_t e = topk_idx[i];
    int64_t r = offsets[e] + counts[e]++;
    row_of[i] = (int32_t)r;
    token_of_row[r] = (int32_t)(i / K);
  }
  return MF_OK;
}

/* --------------------------------------------------------------- gather */

typedef struct {
  const float *x;
  const int32_t *token_of_row;
  int64_t R, H;
  float *xe;
  int round;
} gather_args;

static void gather_task(void *vctx, int i, int n) {
  const gather_args *a = (const gather_args *)vctx;
  size_t b, e;
  mf_partition((size_t)a->R, 1, i, n, &b, &e);
  const size_t H = (size_t)a->H;
  for (size_t r = b; r < e; r++) {
    const float *src = a->x + (size_t)a->token_of_row[r] * H;
    float *dst = a->xe + r * H;
    if (a->round) {
      for (size_t h = 0; h < H; h++) dst[h] = mf_round_to_bf16(src[h]);
    } else {
      memcpy(dst, src, H * sizeof(float));
    }
  }
}

mf_status mf_cpu_moe_gather(const float *x, const int32_t *token_of_row, int64_t R, int64_t H, float *xe,
                            const mf_kctx *ctx) {
  if (R <= 0 || H <= 0) return MF_OK;
  gather_args a = {x, token_of_row, R, H, xe, round_of(ctx)};
  mf_threadpool_run(pool_of(ctx), gather_task, &a);
  return MF_OK;
}

/* Column blocks for the per-token sums below: bounded stack accumulators. */
enum { ROW_BLOCK = 256 };

typedef struct {
  const float *dxe;
  const int32_t *row_of;
  int64_t T, K, H;
  float *dx;
  int accumulate, round;
} gather_bwd_args;

static void gather_bwd_task(void *vctx, int i, int n) {
  const gather_bwd_args *a = (const gather_bwd_args *)vctx;
  size_t b, e;
  mf_partition((size_t)a->T, 1, i, n, &b, &e);
  const int64_t H = a->H, K = a->K;
  float acc[ROW_BLOCK];
  for (size_t t = b; t < e; t++) {
    float *dst = a->dx + t * (size_t)H;
    for (int64_t h0 = 0; h0 < H; h0 += ROW_BLOCK) {
      int64_t hn = H - h0 < ROW_BLOCK ? H - h0 : ROW_BLOCK;
      for (int64_t h = 0; h < hn; h++) acc[h] = 0.0f;
      for (int64_t j = 0; j < K; j++) {
        const float *src = a->dxe + (size_t)a->row_of[t * (size_t)K + (size_t)j] * (size_t)H + h0;
        for (int64_t h = 0; h < hn; h++) acc[h] += src[h];
      }
      for (int64_t h = 0; h < hn; h++) {
        float v = a->accumulate ? dst[h0 + h] + acc[h] : acc[h];
        dst[h0 + h] = a->round ? mf_round_to_bf16(v) : v;
      }
    }
  }
}

mf_status mf_cpu_moe_gather_bwd(const float *dxe, const int32_t *row_of, int64_t T, int64_t K, int64_t H,
                                float *dx, int accumulate, const mf_kctx *ctx) {
  if (T <= 0 || H <= 0) return MF_OK;
  gather_bwd_args a = {dxe, row_of, T, K, H, dx, accumulate, round_of(ctx)};
  mf_threadpool_run(pool_of(ctx), gather_bwd_task, &a);
  return MF_OK;
}

/* -------------------------------------------------------------- combine */

typedef struct {
  const float *ye, *w, *dy;
  const int32_t *row_of;
  int64_t T, K, H;
  float *y, *dye, *dw;
  int round;
} combine_args;

static void combine_task(void *vctx, int i, int n) {
  const combine_args *a = (const combine_args *)vctx;
  size_t b, e;
  mf_partition((size_t)a->T, 1, i, n, &b, &e);
  const int64_t H = a->H, K = a->K;
  float acc[ROW_BLOCK];
  for (size_t t = b; t < e; t++) {
    float *dst = a->y + t * (size_t)H;
    for (int64_t h0 = 0; h0 < H; h0 += ROW_BLOCK) {
      int64_t hn = H - h0 < ROW_BLOCK ? H - h0 : ROW_BLOCK;
      for (int64_t h = 0; h < hn; h++) acc[h] = 0.0f;
      for (int64_t j = 0; j < K; j++) {
        const float wj = a->w[t * (size_t)K + (size_t)j];
        const float *src = a->ye + (size_t)a->row_of[t * (size_t)K + (size_t)j] * (size_t)H + h0;
        for (int64_t h = 0; h < hn; h++) acc[h] += wj * src[h];
      }
      for (int64_t h = 0; h < hn; h++) {
        float v = dst[h0 + h] + acc[h];
        dst[h0 + h] = a->round ? mf_round_to_bf16(v) : v;
      }
    }
  }
}

mf_status mf_cpu_moe_combine(const float *ye, const float *w, const int32_t *row_of, int64_t T, int64_t K,
                             int64_t H, float *y, const mf_kctx *ctx) {
  if (T <= 0 || H <= 0) return MF_OK;
  combine_args a = {ye, w, NULL, row_of, T, K, H, y, NULL, NULL, round_of(ctx)};
  mf_threadpool_run(pool_of(ctx), combine_task, &a);
  return MF_OK;
}

static void combine_bwd_task(void *vctx, int i, int n) {
  const combine_args *a = (const combine_args *)vctx;
  size_t b, e;
  mf_partition((size_t)a->T, 1, i, n, &b, &e);
  const int64_t H = a->H, K = a->K;
  for (size_t t = b; t < e; t++) {
    const float *g = a->dy + t * (size_t)H;
    for (int64_t j = 0; j < K; j++) {
      const size_t tj = t * (size_t)K + (size_t)j;
      const size_t r = (size_t)a->row_of[tj];
      const float wj = a->w[tj];
      const float *src = a->ye + r * (size_t)H;
      float *dst = a->dye + r * (size_t)H;
      float d = 0.0f;
      for (int64_t h = 0; h < H; h++) d += g[h] * src[h];
      a->dw[tj] = d;
      if (a->round) {
        for (int64_t h = 0; h < H; h++) dst[h] = mf_round_to_bf16(wj * g[h]);
      } else {
        for (int64_t h = 0; h < H; h++) dst[h] = wj * g[h];
      }
    }
  }
}

mf_status mf_cpu_moe_combine_bwd(const float *dy, const float *ye, const float *w, const int32_t *row_of,
                                 int64_t T, int64_t K, int64_t H, float *dye, float *dw, const mf_kctx *ctx) {
  if (T <= 0) return MF_OK;
  combine_args a = {ye, w, dy, row_of, T, K, H, NULL, dye, dw, round_of(ctx)};
  mf_threadpool_run(pool_of(ctx), combine_bwd_task, &a);
  return MF_OK;
}

/* --------------------------------------------------- grouped expert GEMM */

/* Tasks over experts with rows: expert e has n_rb(e) * ncb tasks of equal cost
 * (its rows per task). Thread i of n runs the tasks whose cumulative cost start
 * lies in [ceil(i*C/n), ceil((i+1)*C/n)). */
typedef void (*expert_task_fn)(const void *args, int64_t e, int64_t r0, int64_t r1, int64_t cb);

typedef struct {
  const int64_t *offsets;
  int64_t E;
  int64_t rb;  /* rows per task; 0: all the expert's rows in one task */
  int64_t ncb; /* column blocks */
  expert_task_fn fn;
  const void *args;
} expert_tasks;

static void expert_tasks_run(void *vctx, int i, int n) {
  const expert_tasks *et = (const expert_tasks *)vctx;
  int64_t total = 0;
  for (int64_t e = 0; e < et->E; e++) {
    int64_t cnt = et->offsets[e + 1] - et->offsets[e];
    if (cnt <= 0) continue;
    int64_t nrb = et->rb ? (cnt + et->rb - 1) / et->rb : 1;
    int64_t cost = et->rb && et->rb < cnt ? et->rb : cnt;
    total += nrb * et->ncb * cost;
  }
  if (total == 0) return;
  const int64_t lo = (total * i + n - 1) / n, hi = (total * (i + 1) + n - 1) / n;
  int64_t base = 0;
  for (int64_t e = 0; e < et->E && base < hi; e++) {
    int64_t r_begin = et->offsets[e], cnt = et->offsets[e + 1] - r_begin;
    if (cnt <= 0) continue;
    int64_t nrb = et->rb ? (cnt + et->rb - 1) / et->rb : 1;
    int64_t cost = et->rb && et->rb < cnt ? et->rb : cnt;
    int64_t ntask = nrb * et->ncb;
    int64_t end = base + ntask * cost;
    if (end > lo) {
      /* tasks k with lo <= base + k*cost < hi */
      int64_t k0 = lo > base ? (lo - base + cost - 1) / cost : 0;
      int64_t k1 = (hi - base + cost - 1) / cost;
      if (k1 > ntask) k1 = ntask;
      for (int64_t k = k0; k < k1; k++) {
        /* column block outer: consecutive tasks reuse the same weight columns */
        int64_t cb = k / nrb, rbk = k % nrb;
        int64_t r0 = et->rb ? r_begin + rbk * et->rb : r_begin;
        int64_t r1 = et->rb && r0 + et->rb < r_begin + cnt ? r0 + et->rb : r_begin + cnt;
        et->fn(et->args, e, r0, r1, cb);
      }
    }
    base = end;
  }
}

typedef struct {
  const float *x;        /* xe (fwd), dye (bwd_data, bwd_weight) */
  const float *y;        /* xe (bwd_weight) */
  const float *const *W; /* W (fwd, bwd_data) */
  float *const *dW;
  int64_t N, Kd;
  float *out; /* ye (fwd), dxe (bwd_data) */
  int round;
  const int64_t *segments; /* bwd_weight in parts: expert e's rows in `sources` parts (NULL: one) */
  int64_t sources;
} gemm_args;

/* Task sizes: row blocks of GEMM_RB rows by FWD_CB (fwd) or BWD_CB (bwd_data)
 * output columns; dW blocks of WGT_NB x WGT_KB over all the expert's rows. */
enum { GEMM_RB = 64, FWD_CB = 32, BWD_CB = 64, WGT_NB = 16, WGT_KB = 64 };

/* rows x cols of out (row stride ld) set to zero */
static void zero_block(float *out, int64_t ld, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; r++) memset(out + r * ld, 0, (size_t)cols * sizeof *out);
}

/* ye[r0..r1, n0..] = xe[r0..r1, :] . W[e][n0.., :]^T */
static void fwd_task(const void *vargs, int64_t e, int64_t r0, int64_t r1, int64_t cb) {
  const gemm_args *a = (const gemm_args *)vargs;
  const int64_t N = a->N, Kd = a->Kd;
  const int64_t n0 = cb * FWD_CB, nc = N - n0 < FWD_CB ? N - n0 : FWD_CB;
  if (!a->W[e]) { /* a cold expert's adapter: zero rows */
    zero_block(a->out + r0 * N + n0, N, r1 - r0, nc);
    return;
  }
  mf_cpu_gemm(MF_CPU_GEMM_NT, a->x + r0 * Kd, Kd, a->W[e] + n0 * Kd, Kd, r1 - r0, nc, Kd,
              a->out + r0 * N + n0, N, 0, a->round);
}

mf_status mf_cpu_expert_fwd(const float *xe, const float *const *W, const int64_t *offsets, int64_t R,
                            int64_t E, int64_t N, int64_t Kd, float *ye, const mf_kctx *ctx) {
  if (E <= 0 || N <= 0) return MF_OK;
  gemm_args a = {xe, NULL, W, NULL, N, Kd, ye, round_of(ctx), NULL, 0};
  expert_tasks et = {offsets, E, GEMM_RB, (N + FWD_CB - 1) / FWD_CB, fwd_task, &a};
  mf_threadpool_run(pool_of(ctx), expert_tasks_run, &et);
  return MF_OK;
}

/* dxe[r0..r1, c0..] = dye[r0..r1, :] . W[e][:, c0..] */
static void bwd_data_task(const void *vargs, int64_t e, int64_t r0, int64_t r1, int64_t cb) {
  const gemm_args *a = (const gemm_args *)vargs;
  const int64_t N = a->N, Kd = a->Kd;
  const int64_t c0 = cb * BWD_CB, cc = Kd - c0 < BWD_CB ? Kd - c0 : BWD_CB;
  if (!a->W[e]) { /* a cold expert's adapter: zero rows */
    zero_block(a->out + r0 * Kd + c0, Kd, r1 - r0, cc);
    return;
  }
  mf_cpu_gemm(MF_CPU_GEMM_NN, a->x + r0 * N, N, a->W[e] + c0, Kd, r1 - r0, cc, N, a->out + r0 * Kd + c0, Kd,
              0, a->round);
}

mf_status mf_cpu_expert_bwd_data(const float *dye, const float *const *W, const int64_t *offsets, int64_t R,
                                 int64_t E, int64_t N, int64_t Kd, float *dxe, const mf_kctx *ctx) {
  if (E <= 0 || Kd <= 0) return MF_OK;
  if (N <= 0) {
    for (int64_t r = offsets[0] * Kd; r < offsets[E] * Kd; r++) dxe[r] = 0.0f;
    return MF_OK;
  }
  gemm_args a = {dye, NULL, W, NULL, N, Kd, dxe, round_of(ctx), NULL, 0};
  expert_tasks et = {offsets, E, GEMM_RB, (Kd + BWD_CB - 1) / BWD_CB, bwd_data_task, &a};
  mf_threadpool_run(pool_of(ctx), expert_tasks_run, &et);
  return MF_OK;
}

/* dW[e][n0.., k0..] += dye[r0..r1, n0..]^T . xe[r0..r1, k0..]; cb enumerates
 * (n block, k block). */
static void bwd_weight_task(const void *vargs, int64_t e, int64_t r0, int64_t r1, int64_t cb) {
  const gemm_args *a = (const gemm_args *)vargs;
  const int64_t N = a->N, Kd = a->Kd;
  const int64_t nkb = (Kd + WGT_KB - 1) / WGT_KB;
  const int64_t n0 = (cb / nkb) * WGT_NB, k0 = (cb % nkb) * WGT_KB;
  const int64_t nn = N - n0 < WGT_NB ? N - n0 : WGT_NB, kk = Kd - k0 < WGT_KB ? Kd - k0 : WGT_KB;
  if (!a->dW[e]) return; /* a cold expert's adapter: no gradient */
  float *dW = a->dW[e] + n0 * Kd + k0;
  if (!a->segments) {
    mf_cpu_gemm(MF_CPU_GEMM_TN, a->x + r0 * N + n0, N, a->y + r0 * Kd + k0, Kd, nn, kk, r1 - r0, dW, Kd, 1,
                0);
    return;
  }
  /* In parts: each part's sum from 0, then added (one rank's micro-batches, each on its own) */
  float part[WGT_NB * WGT_KB];
  for (int64_t s = 0; s < a->sources; s++) {
    const int64_t p0 = a->segments[e * a->sources + s], p1 = a->segments[e * a->sources + s + 1];
    if (p1 <= p0) continue;
    mf_cpu_gemm(MF_CPU_GEMM_TN, a->x + p0 * N + n0, N, a->y + p0 * Kd + k0, Kd, nn, kk, p1 - p0, part, kk, 0,
                0);
    for (int64_t n = 0; n < nn; n++)
      for (int64_t k = 0; k < kk; k++) dW[n * Kd + k] += part[n * kk + k];
  }
}

mf_status mf_cpu_expert_bwd_weight(const float *dye, const float *xe, const int64_t *offsets, int64_t E,
                                   int64_t N, int64_t Kd, float *const *dW, const mf_kctx *ctx) {
  return mf_cpu_expert_bwd_weight_parts(dye, xe, offsets, NULL, E, N, Kd, 1, dW, ctx);
}

mf_status mf_cpu_expert_parts_check(const char *what, const int64_t *offsets, const int64_t *segments,
                                    int64_t E, int64_t sources) {
  if (sources < 1) return MF_ERR(MF_ERR_INVALID_ARG, "%s: %lld sources", what, (long long)sources);
  for (int64_t e = 0; e < E; e++) {
    const int64_t *g = segments + e * sources;
    int ok = g[0] == offsets[e] && g[sources] == offsets[e + 1];
    for (int64_t s = 0; s < sources && ok; s++) ok = g[s + 1] >= g[s];
    if (!ok)
      return MF_ERR(MF_ERR_INVALID_ARG,
                    "%s: expert %lld's parts [%lld, %lld] do not cover its rows [%lld, %lld) in order", what,
                    (long long)e, (long long)g[0], (long long)g[sources], (long long)offsets[e],
                    (long long)offsets[e + 1]);
  }
  return MF_OK;
}

mf_status mf_cpu_expert_bwd_weight_parts(const float *dye, const float *xe, const int64_t *offsets,
                                         const int64_t *segments, int64_t E, int64_t N, int64_t Kd,
                                         int64_t sources, float *const *dW, const mf_kctx *ctx) {
  if (E <= 0 || N <= 0 || Kd <= 0) return MF_OK;
  if (segments) MF_CHECK(mf_cpu_expert_parts_check("expert_bwd_weight", offsets, segments, E, sources));
  gemm_args a = {dye, xe, NULL, dW, N, Kd, NULL, 0, segments, sources};
  int64_t ncb = ((N + WGT_NB - 1) / WGT_NB) * ((Kd + WGT_KB - 1) / WGT_KB);
  expert_tasks et = {offsets, E, 0, ncb, bwd_weight_task, &a};
  mf_threadpool_run(pool_of(ctx), expert_tasks_run, &et);
  return MF_OK;
}
