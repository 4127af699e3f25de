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
 * Partial sums are kept in the fp32 output between blocks of the contraction
 * (an fp32 store and load is exact), so blocking changes speed, never bits.
 * The work is split into tasks (expert, row block, column block) — or (expert,
 * n block, k block) for dW — each owning its output elements; tasks are dealt
 * to threads by their cost, which affects only the timing.
 */
#include <string.h>

#include "kernels/cpu/cpu_ops.h"

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

mf_status mf_cpu_moe_gather(const mf_kctx *ctx, const float *x, const int32_t *token_of_row, int64_t R,
                            int64_t H, float *xe) {
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

mf_status mf_cpu_moe_gather_bwd(const mf_kctx *ctx, const float *dxe, const int32_t *row_of, int64_t T,
                                int64_t K, int64_t H, float *dx, int accumulate) {
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

mf_status mf_cpu_moe_combine(const mf_kctx *ctx, const float *ye, const float *w, const int32_t *row_of,
                             int64_t T, int64_t K, int64_t H, float *y) {
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

mf_status mf_cpu_moe_combine_bwd(const mf_kctx *ctx, const float *dy, const float *ye, const float *w,
                                 const int32_t *row_of, int64_t T, int64_t K, int64_t H, float *dye,
                                 float *dw) {
  if (T <= 0) return MF_OK;
  combine_args a = {ye, w, dy, row_of, T, K, H, NULL, dye, dw, round_of(ctx)};
  mf_threadpool_run(pool_of(ctx), combine_bwd_task, &a);
  return MF_OK;
}

/* --------------------------------------------------- grouped expert GEMM */

/* The micro-kernel: C[i, j] over an mr x nr tile (mr <= MR, nr <= NR),
 *   acc = load_c ? C[i,j] : 0;  for d in [0, depth): acc += A(i, d) * B(d, j);
 *   C[i,j] = round ? bf16(acc) : acc
 * with A(i, d) = a[i*sai + d*sad] and B(d, j) = b[d*ldb + j]. The accumulation
 * order is the same for a full and an edge tile. */
enum { MR = 4, NR = 8 };

/* Four-lane vectors through the compiler's generic vector extension (SSE on
 * baseline x86-64, NEON on arm64): lane-wise mul and add, so each lane is the
 * same scalar sequence as the edge kernel. */
typedef float v4f __attribute__((vector_size(16)));
static inline v4f load4(const float *p) {
  v4f v;
  memcpy(&v, p, sizeof v);
  return v;
}
static inline void store4(float *p, v4f v) {
  memcpy(p, &v, sizeof v);
}

static __attribute__((noinline)) void micro_full(const float *a, int64_t sai, int64_t sad, const float *b,
                                                 int64_t ldb, int64_t depth, float *c, int64_t ldc,
                                                 int load_c, int round) {
  v4f acc[MR][2];
  for (int i = 0; i < MR; i++) {
    if (load_c) {
      acc[i][0] = load4(c + i * ldc);
      acc[i][1] = load4(c + i * ldc + 4);
    } else {
      acc[i][0] = (v4f){0.0f, 0.0f, 0.0f, 0.0f};
      acc[i][1] = acc[i][0];
    }
  }
  for (int64_t d = 0; d < depth; d++) {
    const v4f b0 = load4(b + d * ldb), b1 = load4(b + d * ldb + 4);
    const float *ad = a + d * sad;
    for (int i = 0; i < MR; i++) {
      const float s = ad[i * sai];
      const v4f ai = {s, s, s, s};
      acc[i][0] += ai * b0;
      acc[i][1] += ai * b1;
    }
  }
  for (int i = 0; i < MR; i++) {
    if (round) {
      for (int j = 0; j < 4; j++) {
        c[i * ldc + j] = mf_round_to_bf16(acc[i][0][j]);
        c[i * ldc + 4 + j] = mf_round_to_bf16(acc[i][1][j]);
      }
    } else {
      store4(c + i * ldc, acc[i][0]);
      store4(c + i * ldc + 4, acc[i][1]);
    }
  }
}

static __attribute__((noinline)) void micro_edge(const float *a, int64_t sai, int64_t sad, const float *b,
                                                 int64_t ldb, int64_t depth, float *c, int64_t ldc,
                                                 int load_c, int round, int mr, int nr) {
  for (int i = 0; i < mr; i++) {
    for (int j = 0; j < nr; j++) {
      float acc = load_c ? c[i * ldc + j] : 0.0f;
      for (int64_t d = 0; d < depth; d++) acc += a[i * sai + d * sad] * b[d * ldb + j];
      c[i * ldc + j] = round ? mf_round_to_bf16(acc) : acc;
    }
  }
}

/* C[m x n] (ldc) over depth, tiled into micro-kernel calls. */
static void tile_gemm(const float *a, int64_t sai, int64_t sad, const float *b, int64_t ldb, int64_t depth,
                      float *c, int64_t ldc, int64_t m, int64_t n, int load_c, int round) {
  for (int64_t i = 0; i < m; i += MR) {
    int mr = m - i < MR ? (int)(m - i) : MR;
    for (int64_t j = 0; j < n; j += NR) {
      int nr = n - j < NR ? (int)(n - j) : NR;
      const float *ai = a + i * sai;
      float *cij = c + i * ldc + j;
      if (mr == MR && nr == NR) {
        micro_full(ai, sai, sad, b + j, ldb, depth, cij, ldc, load_c, round);
      } else {
        micro_edge(ai, sai, sad, b + j, ldb, depth, cij, ldc, load_c, round, mr, nr);
      }
    }
  }
}

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
} gemm_args;

/* Blocking: FWD_CB output columns x FWD_KC depth of W[e] is packed (transposed,
 * depth-major) on the stack and reused by every row of the task. */
enum {
  GEMM_RB = 64,
  FWD_CB = 32,
  FWD_KC = 256,
  BWD_CB = 64,
  BWD_DC = 256,
  WGT_NB = 16,
  WGT_KB = 64,
  WGT_DC = 128
};

static void fwd_task(const void *vargs, int64_t e, int64_t r0, int64_t r1, int64_t cb) {
  const gemm_args *a = (const gemm_args *)vargs;
  const int64_t N = a->N, Kd = a->Kd;
  const int64_t n0 = cb * FWD_CB, nc = N - n0 < FWD_CB ? N - n0 : FWD_CB;
  const float *W = a->W[e];
  float panel[FWD_KC * FWD_CB];
  for (int64_t k0 = 0; k0 < Kd; k0 += FWD_KC) {
    const int64_t kc = Kd - k0 < FWD_KC ? Kd - k0 : FWD_KC;
    for (int64_t j = 0; j < nc; j++) {
      const float *wr = W + (n0 + j) * Kd + k0;
      for (int64_t d = 0; d < kc; d++) panel[d * FWD_CB + j] = wr[d];
    }
    const int last = k0 + kc == Kd;
    tile_gemm(a->x + r0 * Kd + k0, Kd, 1, panel, FWD_CB, kc, a->out + r0 * N + n0, N, r1 - r0, nc, k0 > 0,
              last && a->round);
  }
  if (Kd == 0) { /* an empty contraction still writes zeros */
    for (int64_t r = r0; r < r1; r++)
      for (int64_t j = 0; j < nc; j++) a->out[r * N + n0 + j] = 0.0f;
  }
}

mf_status mf_cpu_expert_linear_fwd(const mf_kctx *ctx, const float *xe, const float *const *W,
                                   const int64_t *offsets, int64_t E, int64_t N, int64_t Kd, float *ye) {
  if (E <= 0 || N <= 0) return MF_OK;
  gemm_args a = {xe, NULL, W, NULL, N, Kd, ye, round_of(ctx)};
  expert_tasks et = {offsets, E, GEMM_RB, (N + FWD_CB - 1) / FWD_CB, fwd_task, &a};
  mf_threadpool_run(pool_of(ctx), expert_tasks_run, &et);
  return MF_OK;
}

static void bwd_data_task(const void *vargs, int64_t e, int64_t r0, int64_t r1, int64_t cb) {
  const gemm_args *a = (const gemm_args *)vargs;
  const int64_t N = a->N, Kd = a->Kd;
  const int64_t c0 = cb * BWD_CB, cc = Kd - c0 < BWD_CB ? Kd - c0 : BWD_CB;
  const float *W = a->W[e];
  for (int64_t n0 = 0; n0 < N; n0 += BWD_DC) {
    const int64_t nc = N - n0 < BWD_DC ? N - n0 : BWD_DC;
    const int last = n0 + nc == N;
    tile_gemm(a->x + r0 * N + n0, N, 1, W + n0 * Kd + c0, Kd, nc, a->out + r0 * Kd + c0, Kd, r1 - r0, cc,
              n0 > 0, last && a->round);
  }
}

mf_status mf_cpu_expert_linear_bwd_data(const mf_kctx *ctx, const float *dye, const float *const *W,
                                        const int64_t *offsets, int64_t E, int64_t N, int64_t Kd,
                                        float *dxe) {
  if (E <= 0 || Kd <= 0) return MF_OK;
  if (N <= 0) {
    for (int64_t r = offsets[0] * Kd; r < offsets[E] * Kd; r++) dxe[r] = 0.0f;
    return MF_OK;
  }
  gemm_args a = {dye, NULL, W, NULL, N, Kd, dxe, round_of(ctx)};
  expert_tasks et = {offsets, E, GEMM_RB, (Kd + BWD_CB - 1) / BWD_CB, bwd_data_task, &a};
  mf_threadpool_run(pool_of(ctx), expert_tasks_run, &et);
  return MF_OK;
}

/* dW[e] blocks of WGT_NB x WGT_KB, over all the expert's rows in row chunks of
 * WGT_DC; cb enumerates (n block, k block). */
static void bwd_weight_task(const void *vargs, int64_t e, int64_t r0, int64_t r1, int64_t cb) {
  const gemm_args *a = (const gemm_args *)vargs;
  const int64_t N = a->N, Kd = a->Kd;
  const int64_t nkb = (Kd + WGT_KB - 1) / WGT_KB;
  const int64_t n0 = (cb / nkb) * WGT_NB, k0 = (cb % nkb) * WGT_KB;
  const int64_t nn = N - n0 < WGT_NB ? N - n0 : WGT_NB, kk = Kd - k0 < WGT_KB ? Kd - k0 : WGT_KB;
  float *dW = a->dW[e];
  /* Both operands are packed: their rows are N and Kd floats apart (often a
   * multiple of 4 KiB, which would make every row hit the same L1 set). */
  float ap[WGT_DC * WGT_NB], bp[WGT_DC * WGT_KB];
  for (int64_t rc = r0; rc < r1; rc += WGT_DC) {
    const int64_t depth = r1 - rc < WGT_DC ? r1 - rc : WGT_DC;
    for (int64_t d = 0; d < depth; d++) {
      memcpy(ap + d * WGT_NB, a->x + (rc + d) * N + n0, (size_t)nn * sizeof(float));
      memcpy(bp + d * WGT_KB, a->y + (rc + d) * Kd + k0, (size_t)kk * sizeof(float));
    }
    /* A(i, d) = dye[rc + d, n0 + i];  B(d, j) = xe[rc + d, k0 + j] */
    tile_gemm(ap, 1, WGT_NB, bp, WGT_KB, depth, dW + n0 * Kd + k0, Kd, nn, kk, 1, 0);
  }
}

mf_status mf_cpu_expert_linear_bwd_weight(const mf_kctx *ctx, const float *dye, const float *xe,
                                          const int64_t *offsets, int64_t E, int64_t N, int64_t Kd,
                                          float *const *dW) {
  if (E <= 0 || N <= 0 || Kd <= 0) return MF_OK;
  gemm_args a = {dye, xe, NULL, dW, N, Kd, NULL, 0};
  int64_t ncb = ((N + WGT_NB - 1) / WGT_NB) * ((Kd + WGT_KB - 1) / WGT_KB);
  expert_tasks et = {offsets, E, 0, ncb, bwd_weight_task, &a};
  mf_threadpool_run(pool_of(ctx), expert_tasks_run, &et);
  return MF_OK;
}
