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
 *     the chunk's logits (the same GEMM call, so the same bits as pass 1), turn
 *     them into g in ws, add g . W_chunk into dh; (b) threads own vocabulary
 *     rows of the chunk: dW_chunk += g^T . h.
 *  3. the target logit of every token is recomputed (the same dot order) into
 *     ws[t] and the loss summed in token order on the calling thread.
 * Every output element and every sum has one owner and one order, so the bits
 * do not depend on the thread count. With round_bf16, dh is rounded once it is
 * complete; lse, the loss and dW stay fp32/double.
 */
#include <math.h>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/gemm_impl.h"

/* ------------------------------------------------------------ the passes */

/* Token blocks of TB; dW tasks of DW_VB vocabulary rows x DW_KB columns. */
enum { TB = 64, DW_VB = 16, DW_KB = 64 };

typedef struct {
  const float *h, *W;
  const int32_t *target;
  int64_t T, V, H, chunk;
  float scale;
  float *ws, *lse, *dh, *dW;
  int round;
  int64_t v0, vc; /* the chunk of pass 2 */
} ce_args;

/* ws[t, 0..vc) = logits of tokens [t0, t0+nt) against W rows [v0, v0+vc). */
static void logits_block(const ce_args *a, int64_t t0, int64_t nt, int64_t v0, int64_t vc) {
  mf_cpu_gemm(MF_CPU_GEMM_NT, a->h + t0 * a->H, a->H, a->W + v0 * a->H, a->H, nt, vc, a->H,
              a->ws + t0 * a->chunk, a->chunk, 0, 0);
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
    mf_cpu_gemm(MF_CPU_GEMM_NN, a->ws + t0 * ld, ld, a->W + v0 * H, H, nt, H, vc, a->dh + t0 * H, H, v0 > 0,
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
  for (int64_t task = (int64_t)b; task < (int64_t)e; task++) {
    const int64_t j0 = (task / nkb) * DW_VB, k0 = (task % nkb) * DW_KB;
    const int64_t nj = a->vc - j0 < DW_VB ? a->vc - j0 : DW_VB, nk = H - k0 < DW_KB ? H - k0 : DW_KB;
    mf_cpu_gemm(MF_CPU_GEMM_TN, a->ws + j0, ld, a->h + k0, H, nj, nk, a->T, a->dW + (a->v0 + j0) * H + k0, H,
                1, 0);
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

mf_status mf_cpu_cross_entropy(const float *h, const float *W, const int32_t *target, int64_t T, int64_t V,
                               int64_t H, int64_t chunk, float loss_scale, float *ws, float *lse,
                               double *scalars, float *dh, float *dW, const mf_kctx *ctx) {
  scalars[0] = scalars[1] = 0.0;
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
  scalars[0] = sum;
  scalars[1] = (double)nv;
  return MF_OK;
}
