/*
 * Causal-LM cross-entropy through the LM head, chunked over the vocabulary so
 * the [T, V] logits never exist.
 *
 * Shapes: h [T, H], W [V, H], target [T] (-1: ignored), ws [T, chunk] (row
 * stride `chunk`), lse [T], dh [T, H], dW [V, H].
 *   logit[t, v] = sum_k h[t,k] * W[v,k]   (fp32, k = 0..H-1 in order, from 0)
 *   lse[t]      = log sum_v exp(logit[t, v])
 *   loss_sum    = sum_{valid t} (lse[t] - logit[t, target[t]])      (double)
 *   g[t, v]     = loss_scale * (exp(logit[t,v] - lse[t]) - [v == target[t]]),
 *                 0 for ignored tokens
 *   dh[t, :]    = sum_v g[t,v] W[v,:]     (written; v in order over all chunks)
 *   dW[v, :]   += sum_t g[t,v] h[t,:]     (added; t in order)
 *
 * Passes:
 *  1. threads own token ranges and sweep the vocabulary chunk by chunk for a
 *     block of TB tokens at a time, keeping the running max and sum of each
 *     token on the stack: lse.
 *  2. (only when dh != NULL) chunk by chunk: (a) threads own tokens: recompute
 *     the chunk's logits (the same tile code, so the same bits as pass 1), turn
 *     them into g in ws, add g . W_chunk into dh; (b) threads own vocabulary
 *     rows of the chunk: dW_chunk += g^T . h.
 *  3. the target logit of every token is recomputed (the same dot order) into
 *     ws[t] and the loss summed in token order on the calling thread.
 * Every output element and every sum has one owner and one order, so the bits
 * do not depend on the thread count. With round_bf16, dh is rounded once it is
 * complete; lse, the loss and dW stay fp32/double.
 */
#include <math.h>
#include <string.h>

#include "kernels/cpu/cpu_ops.h"

/* ---- tile GEMM (private; the same scheme as the grouped GEMM in moe.c) ----
 * C[i, j] (mr x nr <= MR x NR): acc = load_c ? C : 0; acc += A(i,d) * B(d,j) for
 * d in order; C = round ? bf16(acc) : acc.  A(i,d) = a[i*sai + d*sad],
 * B(d,j) = b[d*ldb + j]. Full and edge tiles accumulate in the same order. */
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

static void tile_gemm(const float *a, int64_t sai, int64_t sad, const float *b, int64_t ldb, int64_t depth,
                      float *c, int64_t ldc, int64_t m, int64_t n, int load_c, int round) {
  for (int64_t i = 0; i < m; i += MR) {
    int mr = m - i < MR ? (int)(m - i) : MR;
    for (int64_t j = 0; j < n; j += NR) {
      int nr = n - j < NR ? (int)(n - j) : NR;
      if (mr == MR && nr == NR) {
        micro_full(a + i * sai, sai, sad, b + j, ldb, depth, c + i * ldc + j, ldc, load_c, round);
      } else {
        micro_edge(a + i * sai, sai, sad, b + j, ldb, depth, c + i * ldc + j, ldc, load_c, round, mr, nr);
      }
    }
  }
}

/* tile_gemm blocked over columns and depth so the B block stays in cache; the
 * partial sums wait in C, so the per-element order is unchanged. */
enum { BLK_N = 256, BLK_D = 256 };

static void blocked_gemm(const float *a, int64_t sai, int64_t sad, const float *b, int64_t ldb, int64_t depth,
                         float *c, int64_t ldc, int64_t m, int64_t n, int load_c, int round) {
  for (int64_t j0 = 0; j0 < n; j0 += BLK_N) {
    const int64_t nn = n - j0 < BLK_N ? n - j0 : BLK_N;
    for (int64_t d0 = 0; d0 < depth; d0 += BLK_D) {
      const int64_t dd = depth - d0 < BLK_D ? depth - d0 : BLK_D;
      tile_gemm(a + d0 * sad, sai, sad, b + d0 * ldb + j0, ldb, dd, c + j0, ldc, m, nn, load_c || d0 > 0,
                round && d0 + dd == depth);
    }
  }
}

/* ------------------------------------------------------------ the passes */

enum { TB = 64, LG_CB = 32, LG_KC = 256, DW_VB = 16, DW_KB = 64, DW_TC = 128 };

typedef struct {
  const float *h, *W;
  const int32_t *target;
  int64_t T, V, H, chunk;
  float scale;
  float *ws, *lse, *dh, *dW;
  int round;
  int64_t v0, vc; /* the chunk of pass 2 */
} ce_args;

/* ws[t, 0..vc) = logits of tokens [t0, t0+nt) against W rows [v0, v0+vc).
 * W is packed (transposed) LG_CB rows x LG_KC columns at a time on the stack. */
static void logits_block(const ce_args *a, int64_t t0, int64_t nt, int64_t v0, int64_t vc) {
  const int64_t H = a->H, ld = a->chunk;
  float panel[LG_KC * LG_CB];
  for (int64_t c0 = 0; c0 < vc; c0 += LG_CB) {
    const int64_t cc = vc - c0 < LG_CB ? vc - c0 : LG_CB;
    for (int64_t k0 = 0; k0 < H; k0 += LG_KC) {
      const int64_t kc = H - k0 < LG_KC ? H - k0 : LG_KC;
      for (int64_t j = 0; j < cc; j++) {
        const float *wr = a->W + (v0 + c0 + j) * H + k0;
        for (int64_t d = 0; d < kc; d++) panel[d * LG_CB + j] = wr[d];
      }
      tile_gemm(a->h + t0 * H + k0, H, 1, panel, LG_CB, kc, a->ws + t0 * ld + c0, ld, nt, cc, k0 > 0, 0);
    }
  }
}

static void pass1_task(void *vctx, int i, int n) {
  const ce_args *a = (const ce_args *)vctx;
  size_t b, e;
  mf_partition((size_t)a->T, 1, i, n, &b, &e);
  float m[TB], s[TB];
  for (int64_t t0 = (int64_t)b; t0 < (int64_t)e; t0 += TB) {
    const int64_t nt = (int64_t)e - t0 < TB ? (int64_t)e - t0 : TB;
    for (int64_t t = 0; t < nt; t++) {
      m[t] = -INFINITY;
      s[t] = 0.0f;
    }
    for (int64_t v0 = 0; v0 < a->V; v0 += a->chunk) {
      const int64_t vc = a->V - v0 < a->chunk ? a->V - v0 : a->chunk;
      logits_block(a, t0, nt, v0, vc);
      for (int64_t t = 0; t < nt; t++) {
        const float *row = a->ws + (t0 + t) * a->chunk;
        float cm = row[0];
        for (int64_t j = 1; j < vc; j++) cm = row[j] > cm ? row[j] : cm;
        if (cm > m[t]) {
          s[t] *= expf(m[t] - cm);
          m[t] = cm;
        }
        float cs = 0.0f;
        for (int64_t j = 0; j < vc; j++) cs += expf(row[j] - m[t]);
        s[t] += cs;
      }
    }
    for (int64_t t = 0; t < nt; t++) a->lse[t0 + t] = m[t] + logf(s[t]);
  }
}

/* Pass 2a: g for the chunk, and dh += g . W_chunk, for the thread's tokens. */
static void pass2_tokens_task(void *vctx, int i, int n) {
  const ce_args *a = (const ce_args *)vctx;
  size_t b, e;
  mf_partition((size_t)a->T, 1, i, n, &b, &e);
  const int64_t H = a->H, ld = a->chunk, v0 = a->v0, vc = a->vc;
  const int last = v0 + vc == a->V;
  for (int64_t t0 = (int64_t)b; t0 < (int64_t)e; t0 += TB) {
    const int64_t nt = (int64_t)e - t0 < TB ? (int64_t)e - t0 : TB;
    logits_block(a, t0, nt, v0, vc);
    for (int64_t t = t0; t < t0 + nt; t++) {
      float *row = a->ws + t * ld;
      const int32_t tg = a->target[t];
      if (tg < 0) {
        for (int64_t j = 0; j < vc; j++) row[j] = 0.0f;
        continue;
      }
      const float l = a->lse[t];
      for (int64_t j = 0; j < vc; j++) row[j] = a->scale * (expf(row[j] - l) - (v0 + j == tg ? 1.0f : 0.0f));
    }
    /* dh[t0.., :] (+)= g[t0.., 0..vc) . W[v0.., :] — zero before the first chunk */
    blocked_gemm(a->ws + t0 * ld, ld, 1, a->W + v0 * H, H, vc, a->dh + t0 * H, H, nt, H, v0 > 0,
                 last && a->round);
  }
}

/* Pass 2b: dW[v0 + j, :] += sum_t g[t, j] h[t, :]; tasks of DW_VB rows x DW_KB columns. */
static void pass2_vocab_task(void *vctx, int i, int n) {
  const ce_args *a = (const ce_args *)vctx;
  const int64_t H = a->H, ld = a->chunk;
  const int64_t nkb = (H + DW_KB - 1) / DW_KB, ntask = ((a->vc + DW_VB - 1) / DW_VB) * nkb;
  size_t b, e;
  mf_partition((size_t)ntask, 1, i, n, &b, &e);
  float ap[DW_TC * DW_VB], bp[DW_TC * DW_KB];
  for (int64_t task = (int64_t)b; task < (int64_t)e; task++) {
    const int64_t j0 = (task / nkb) * DW_VB, k0 = (task % nkb) * DW_KB;
    const int64_t nj = a->vc - j0 < DW_VB ? a->vc - j0 : DW_VB, nk = H - k0 < DW_KB ? H - k0 : DW_KB;
    for (int64_t tc = 0; tc < a->T; tc += DW_TC) {
      const int64_t depth = a->T - tc < DW_TC ? a->T - tc : DW_TC;
      /* A(i, d) = g[tc + d, j0 + i];  B(d, k) = h[tc + d, k0 + k], both packed
       * (their rows are `chunk` and H floats apart, often a multiple of 4 KiB). */
      for (int64_t d = 0; d < depth; d++) {
        memcpy(ap + d * DW_VB, a->ws + (tc + d) * ld + j0, (size_t)nj * sizeof(float));
        memcpy(bp + d * DW_KB, a->h + (tc + d) * H + k0, (size_t)nk * sizeof(float));
      }
      tile_gemm(ap, 1, DW_VB, bp, DW_KB, depth, a->dW + (a->v0 + j0) * H + k0, H, nj, nk, 1, 0);
    }
  }
}

/* ws[t] = logit[t, target[t]] (0 for ignored tokens), the same dot order as the tiles. */
static void target_logit_task(void *vctx, int i, int n) {
  const ce_args *a = (const ce_args *)vctx;
  size_t b, e;
  mf_partition((size_t)a->T, 1, i, n, &b, &e);
  for (size_t t = b; t < e; t++) {
    const int32_t tg = a->target[t];
    float s = 0.0f;
    if (tg >= 0) {
      const float *x = a->h + t * (size_t)a->H, *w = a->W + (size_t)tg * (size_t)a->H;
      for (int64_t k = 0; k < a->H; k++) s += x[k] * w[k];
    }
    a->ws[t] = s;
  }
}

mf_status mf_cpu_cross_entropy(const mf_kctx *ctx, const float *h, const float *W, const int32_t *target,
                               int64_t T, int64_t V, int64_t H, int64_t chunk, float loss_scale, float *ws,
                               float *lse, double *loss_sum, int64_t *n_valid, float *dh, float *dW) {
  *loss_sum = 0.0;
  *n_valid = 0;
  if (T <= 0) return MF_OK;
  if (V <= 0 || H <= 0 || chunk <= 0)
    return MF_ERR(MF_ERR_INVALID_ARG, "cross-entropy: V=%lld H=%lld chunk=%lld", (long long)V, (long long)H,
                  (long long)chunk);
  for (int64_t t = 0; t < T; t++) {
    if (target[t] < -1 || target[t] >= V)
      return MF_ERR(MF_ERR_INVALID_ARG, "cross-entropy: target[%lld] = %d is outside [-1, %lld)",
                    (long long)t, (int)target[t], (long long)V);
  }
  mf_threadpool *pool = ctx ? ctx->pool : NULL;
  ce_args a = {h, W, target, T, V, H, chunk, loss_scale, ws, lse, dh, dW, ctx ? ctx->round_bf16 : 0, 0, 0};
  mf_threadpool_run(pool, pass1_task, &a);
  if (dh) {
    for (int64_t v0 = 0; v0 < V; v0 += chunk) {
      a.v0 = v0;
      a.vc = V - v0 < chunk ? V - v0 : chunk;
      mf_threadpool_run(pool, pass2_tokens_task, &a);
      if (dW) mf_threadpool_run(pool, pass2_vocab_task, &a);
    }
  }
  mf_threadpool_run(pool, target_logit_task, &a);
  double sum = 0.0;
  int64_t nv = 0;
  for (int64_t t = 0; t < T; t++) {
    if (target[t] < 0) continue;
    sum += (double)lse[t] - (double)ws[t];
    nv++;
  }
  *loss_sum = sum;
  *n_valid = nv;
  return MF_OK;
}
