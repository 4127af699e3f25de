/*
 * Router: softmax over the E expert logits of each token, top-k selection,
 * optional renormalisation of the selected weights, and the backward; and
 * gpt-oss's router (mode 1), top-k first, then the softmax of the chosen.
 *
 * Shapes: logits, probs, dlogits [T, E]; topk_idx, topk_w, dtopk_w [T, K].
 *
 * Forward, per row (as torch `softmax(logits, dim=-1, dtype=torch.float)` then
 * `topk`, then `w /= w.sum(-1)` when norm_topk):
 *   m = max_e l[e];  z[e] = expf(l[e] - m);  s = sum_e z[e] (in e order);
 *   p[e] = z[e] / s;
 *   (w, idx) = the K largest p, descending, ties to the lower expert index;
 *   norm_topk: S = sum_j w[j] (in j order), w[j] /= S.
 *
 * Backward, per row: with g[j] = d w[j],
 *   norm_topk:  dp[idx[j]] = (g[j] - sum_i g[i] w[i]) / S   (w the normalised weights)
 *   otherwise:  dp[idx[j]] = g[j]
 * (the selection is piecewise constant: no gradient through it), plus
 * dprobs_extra[e] (the aux loss), then the softmax backward
 *   dl[e] = p[e] * (dp[e] - sum_e' p[e'] dp[e']).
 * The row of dlogits holds dp while it is formed, so no scratch is needed.
 *
 * Mode 1 (transformers' GptOssTopKRouter), per row:
 *   (v, idx) = the K largest l, descending, ties to the lower expert index;
 *   w[j] = expf(v[j] - v[0]) / s,  s = sum_j expf(v[j] - v[0]) (in j order);
 *   probs = softmax over E of the row z with z[idx[j]] = w[j], 0 elsewhere (as
 *   above: max, expf, sum in e order) — gpt-oss's router_scores, which its aux
 *   loss takes the softmax of.
 * Backward, per row: with x = dprobs_extra (absent: ds = 0),
 *   ds[e] = p[e] * (x[e] - sum_e' p[e'] x[e']),  dw[j] = g[j] + ds[idx[j]],
 *   dl[idx[j]] = w[j] * (dw[j] - sum_i w[i] dw[i]),  every other dl 0.
 * Only ds at the chosen experts is needed: each is formed where it is used.
 *
 * Threads own contiguous ranges of rows; every reduction is inside one row in a
 * fixed order, so the bits do not depend on the thread count. probs, topk_w and
 * dlogits are fp32 routing quantities and are never rounded to bf16.
 */
#include <math.h>
#include <string.h>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/topk.h"

typedef struct {
  const float *logits;
  int64_t T, E, K;
  int norm_topk, mode;
  float *probs;
  int32_t *topk_idx;
  float *topk_w;
} router_fwd_args;

static void router_fwd_row(const float *l, int64_t E, int64_t K, int norm_topk, float *p, int32_t *idx,
                           float *w) {
  float m = l[0];
  for (int64_t e = 1; e < E; e++) m = l[e] > m ? l[e] : m;
  float s = 0.0f;
  for (int64_t e = 0; e < E; e++) {
    p[e] = expf(l[e] - m);
    s += p[e];
  }
  for (int64_t e = 0; e < E; e++) p[e] = p[e] / s;

  int64_t n = 0; /* ties keep the lower index first (kernels/topk.h) */
  for (int64_t e = 0; e < E; e++) mf_topk_insert(p[e], (int32_t)e, w, idx, &n, K);
  if (norm_topk) {
    float S = 0.0f;
    for (int64_t j = 0; j < K; j++) S += w[j];
    for (int64_t j = 0; j < K; j++) w[j] = w[j] / S;
  }
}

/* Mode 1: the top-k of the logits, their softmax, and probs from them (kernels/topk.h). */
#define LD_F32(l, e) ((l)[e])
MF_ROUTER_TOPK_FIRST_ROW(static, router_fwd_row_topk_first, float, LD_F32)
#undef LD_F32

static void router_fwd_task(void *vctx, int i, int n) {
  const router_fwd_args *a = (const router_fwd_args *)vctx;
  size_t b, e;
  mf_partition((size_t)a->T, 1, i, n, &b, &e);
  for (size_t t = b; t < e; t++) {
    if (a->mode == 1)
      router_fwd_row_topk_first(a->logits + t * a->E, a->E, a->K, a->probs + t * a->E, a->topk_idx + t * a->K,
                                a->topk_w + t * a->K);
    else
      router_fwd_row(a->logits + t * a->E, a->E, a->K, a->norm_topk, a->probs + t * a->E,
                     a->topk_idx + t * a->K, a->topk_w + t * a->K);
  }
}

static mf_status check_router(int64_t E, int64_t K, int mode) {
  if (E <= 0 || K <= 0 || K > E)
    return MF_ERR(MF_ERR_INVALID_ARG, "router: K=%lld experts of E=%lld", (long long)K, (long long)E);
  if (mode != 0 && mode != 1)
    return MF_ERR(MF_ERR_INVALID_ARG,
                  "router: mode %d (0: softmax then top-k, 1: gpt-oss's top-k then softmax)", mode);
  return MF_OK;
}

mf_status mf_cpu_router_fwd(const float *logits, int64_t T, int64_t E, int64_t K, int norm_topk, int mode,
                            float *probs, int32_t *topk_idx, float *topk_w, const mf_kctx *ctx) {
  if (T <= 0) return MF_OK;
  MF_CHECK(check_router(E, K, mode));
  router_fwd_args a = {logits, T, E, K, norm_topk, mode, probs, topk_idx, topk_w};
  mf_threadpool_run(ctx ? ctx->pool : NULL, router_fwd_task, &a);
  return MF_OK;
}

typedef struct {
  const float *probs;
  const int32_t *topk_idx;
  const float *topk_w;
  const float *dtopk_w;
  const float *dprobs_extra;
  int64_t T, E, K;
  int norm_topk, mode;
  float *dlogits;
} router_bwd_args;

/* Mode 1's dw[j]: dtopk_w[j] plus ds at the chosen expert (pd: sum_e p[e] x[e]). */
static inline float topk_first_dw(const float *p, const float *x, float pd, const int32_t *idx,
                                  const float *g, int64_t j) {
  return x ? g[j] + p[idx[j]] * (x[idx[j]] - pd) : g[j];
}

static void router_bwd_row_topk_first(const router_bwd_args *a, int64_t t) {
  const int64_t E = a->E, K = a->K;
  const float *p = a->probs + t * E;
  const int32_t *idx = a->topk_idx + t * K;
  const float *w = a->topk_w + t * K;
  const float *g = a->dtopk_w + t * K;
  const float *x = a->dprobs_extra ? a->dprobs_extra + t * E : NULL;
  float *dl = a->dlogits + t * E;
  float pd = 0.0f, wd = 0.0f;
  if (x)
    for (int64_t e = 0; e < E; e++) pd += p[e] * x[e];
  for (int64_t j = 0; j < K; j++) wd += w[j] * topk_first_dw(p, x, pd, idx, g, j);
  memset(dl, 0, (size_t)E * sizeof(float));
  for (int64_t j = 0; j < K; j++) dl[idx[j]] = w[j] * (topk_first_dw(p, x, pd, idx, g, j) - wd);
}

static void router_bwd_row(const router_bwd_args *a, int64_t t) {
  const int64_t E = a->E, K = a->K;
  const float *p = a->probs + t * E;
  const int32_t *idx = a->topk_idx + t * K;
  const float *w = a->topk_w + t * K;
  const float *g = a->dtopk_w + t * K;
  float *dp = a->dlogits + t * E;

  if (a->dprobs_extra) {
    memcpy(dp, a->dprobs_extra + t * E, (size_t)E * sizeof(float));
  } else {
    memset(dp, 0, (size_t)E * sizeof(float));
  }
  if (a->norm_topk) {
    float S = 0.0f, gw = 0.0f;
    for (int64_t j = 0; j < K; j++) S += p[idx[j]]; /* the forward's sum, same order */
    for (int64_t j = 0; j < K; j++) gw += g[j] * w[j];
    for (int64_t j = 0; j < K; j++) dp[idx[j]] += (g[j] - gw) / S;
  } else {
    for (int64_t j = 0; j < K; j++) dp[idx[j]] += g[j];
  }
  float pd = 0.0f;
  for (int64_t e = 0; e < E; e++) pd += p[e] * dp[e];
  for (int64_t e = 0; e < E; e++) dp[e] = p[e] * (dp[e] - pd);
}

static void router_bwd_task(void *vctx, int i, int n) {
  const router_bwd_args *a = (const router_bwd_args *)vctx;
  size_t b, e;
  mf_partition((size_t)a->T, 1, i, n, &b, &e);
  for (size_t t = b; t < e; t++) {
    if (a->mode == 1)
      router_bwd_row_topk_first(a, (int64_t)t);
    else
      router_bwd_row(a, (int64_t)t);
  }
}

mf_status mf_cpu_router_bwd(const float *probs, const int32_t *topk_idx, const float *topk_w,
                            const float *dtopk_w, const float *dprobs_extra, int64_t T, int64_t E, int64_t K,
                            int norm_topk, int mode, float *dlogits, const mf_kctx *ctx) {
  if (T <= 0) return MF_OK;
  MF_CHECK(check_router(E, K, mode));
  router_bwd_args a = {probs, topk_idx, topk_w, dtopk_w, dprobs_extra, T, E, K, norm_topk, mode, dlogits};
  mf_threadpool_run(ctx ? ctx->pool : NULL, router_bwd_task, &a);
  return MF_OK;
}
