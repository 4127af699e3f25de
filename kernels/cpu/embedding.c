/*
 * Token embedding on the cpu backend.
 *
 *   fwd: out[t,:] = table[ids[t],:]            (written)   ids[T], table[V,H], out[T,H]
 *   bwd: dtable[ids[t],:] += dout[t,:]         (added, fp32)
 *
 * Threads: the forward splits tokens; the backward splits the H columns, and each
 * thread walks all tokens in order over its columns, so a vocabulary row hit by
 * several tokens always receives their gradients in token order, whatever the
 * thread count. (Splitting tokens would race on repeated ids.)
 */
#include <string.h>

#include "kernels/cpu/cpu_ops.h"

/* Elements below which a call stays on the calling thread. */
#define EMB_PARALLEL_MIN (1 << 15)

typedef struct emb_args {
  const int32_t *ids;
  int64_t T, H;
  const float *src; /* table (fwd) or dout (bwd) */
  float *dst;       /* out (fwd) or dtable (bwd) */
  int round_bf16;
} emb_args;

static void emb_fwd_task(void *arg, int i, int n) {
  const emb_args *a = (const emb_args *)arg;
  size_t t0, t1;
  mf_partition((size_t)a->T, 1, i, n, &t0, &t1);
  for (size_t t = t0; t < t1; t++) {
    const float *row = a->src + (int64_t)a->ids[t] * a->H;
    float *out = a->dst + (int64_t)t * a->H;
    if (a->round_bf16) {
      for (int64_t c = 0; c < a->H; c++) out[c] = mf_round_to_bf16(row[c]);
    } else {
      memcpy(out, row, sizeof(float) * (size_t)a->H);
    }
  }
}

static void emb_bwd_task(void *arg, int i, int n) {
  const emb_args *a = (const emb_args *)arg;
  size_t c0, c1;
  mf_partition((size_t)a->H, 16, i, n, &c0, &c1); /* 64-byte column groups: no false sharing */
  if (c0 >= c1) return;
  for (int64_t t = 0; t < a->T; t++) {
    const float *g = a->src + t * a->H;
    float *d = a->dst + (int64_t)a->ids[t] * a->H;
    for (size_t c = c0; c < c1; c++) d[c] += g[c];
  }
}

static void emb_run(const mf_kctx *ctx, mf_task_fn fn, emb_args *a) {
  if ((double)a->T * (double)a->H < EMB_PARALLEL_MIN)
    fn(a, 0, 1);
  else
    mf_threadpool_run(ctx->pool, fn, a);
}

/* An id outside the table is an error, not a read past it (as cross-entropy
 * checks its targets): the ids reach the kernel through copies. */
static mf_status check_ids(const int32_t *ids, int64_t T, int64_t V) {
  for (int64_t t = 0; t < T; t++)
    if (ids[t] < 0 || ids[t] >= V)
      return MF_ERR(MF_ERR_INVALID_ARG, "embedding: ids[%lld] = %d is outside [0, %lld)", (long long)t,
                    (int)ids[t], (long long)V);
  return MF_OK;
}

mf_status mf_cpu_embed_fwd(const int32_t *ids, int64_t T, const float *table, int64_t V, int64_t H,
                           float *out, const mf_kctx *ctx) {
  emb_args a = {ids, T, H, table, out, ctx->round_bf16};
  if (T <= 0 || H <= 0) return MF_OK;
  MF_CHECK(check_ids(ids, T, V));
  emb_run(ctx, emb_fwd_task, &a);
  return MF_OK;
}

mf_status mf_cpu_embed_bwd(const int32_t *ids, int64_t T, const float *dout, int64_t V, int64_t H,
                           float *dtable, const mf_kctx *ctx) {
  emb_args a = {ids, T, H, dout, dtable, 0};
  if (T <= 0 || H <= 0) return MF_OK;
  MF_CHECK(check_ids(ids, T, V));
  emb_run(ctx, emb_bwd_task, &a);
  return MF_OK;
}
