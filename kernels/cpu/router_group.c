/*
 * The sigmoid router of DeepSeek-V3 and GLM-4.5 ("noaux_tc": scores with a
 * correction bias for the choice only, group-limited top-k), and its
 * backward. As transformers' DeepseekV3TopkRouter (and Glm4MoeTopkRouter)
 * compute it over router logits l [T, E], per row:
 *   s[e] = sigmoid(l[e]) = 1 / (1 + expf(-l[e]))          (written: scores)
 *   c[e] = s[e] + bias[e]                                 (the choice; bias
 *                                                          gets no gradient)
 *   group g (E / n_group experts each): its score is the sum of its two
 *   largest c, the larger first; the topk_group groups of largest score are
 *   kept, and c of every expert outside them is set to 0.0 (not -inf: an
 *   expert outside the kept groups is chosen over one inside whose c is
 *   negative, as transformers' masked_fill(..., 0.0) does)
 *   idx = the K largest c, descending (ties: the lower expert first)
 *   w[j] = s[idx[j]];  norm_topk: w[j] /= (sum_j w[j] + 1e-20);  w[j] *= scaling
 * With n_group 1 (or topk_group = n_group) no group is masked.
 *
 * Backward, per row, with g[j] = d w[j] (the choice is piecewise constant):
 *   u[j] = g[j] * scaling
 *   norm_topk: D = sum_j s[idx[j]] + 1e-20 (the forward's sum, same order),
 *              ds[idx[j]] = (u[j] - sum_i u[i] s[idx[i]] / D) / D
 *   otherwise: ds[idx[j]] = u[j]
 *   dl[e] = ds[e] * s[e] * (1 - s[e]), 0 for an expert not chosen.
 *
 * Threads own contiguous ranges of rows; every reduction is inside one row
 * in a fixed order, so the bits do not depend on the thread count. Scores,
 * weights and dlogits are fp32 routing quantities.
 */
#include <math.h>
#include <string.h>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/topk.h"

#define GROUPS_MAX 64

typedef struct {
  const float *logits, *bias;
  int64_t T, E, K, n_group, topk_group;
  int norm_topk;
  float scaling;
  float *scores;
  int32_t *topk_idx;
  float *topk_w;
} group_fwd_args;

static void group_fwd_row(const group_fwd_args *a, int64_t t) {
  const int64_t E = a->E, K = a->K, G = a->n_group, per = E / G;
  const float *l = a->logits + t * E;
  float *s = a->scores + t * E;
  int32_t *idx = a->topk_idx + t * K;
  float *w = a->topk_w + t * K;
  for (int64_t e = 0; e < E; e++) s[e] = 1.0f / (1.0f + expf(-l[e]));
  /* the kept groups */
  uint8_t kept[GROUPS_MAX];
  memset(kept, G == 1 || a->topk_group >= G, sizeof kept);
  if (G > 1 && a->topk_group < G) {
    float gs[GROUPS_MAX], gw[GROUPS_MAX];
    int32_t gi[GROUPS_MAX];
    for (int64_t g = 0; g < G; g++) {
      float top[2];
      int32_t ti[2];
      int64_t n = 0;
      for (int64_t e = g * per; e < (g + 1) * per; e++)
        mf_topk_insert(s[e] + (a->bias ? a->bias[e] : 0.0f), (int32_t)e, top, ti, &n, 2);
      gs[g] = top[0] + top[1];
    }
    int64_t n = 0;
    for (int64_t g = 0; g < G; g++) mf_topk_insert(gs[g], (int32_t)g, gw, gi, &n, a->topk_group);
    for (int64_t j = 0; j < n; j++) kept[gi[j]] = 1;
  }
  int64_t n = 0;
  for (int64_t e = 0; e < E; e++) {
    const float c = kept[e / per] ? s[e] + (a->bias ? a->bias[e] : 0.0f) : 0.0f;
    mf_topk_insert(c, (int32_t)e, w, idx, &n, K);
  }
  for (int64_t j = 0; j < K; j++) w[j] = s[idx[j]];
  if (a->norm_topk) {
    float S = 0.0f;
    for (int64_t j = 0; j < K; j++) S += w[j];
    S += 1e-20f;
    for (int64_t j = 0; j < K; j++) w[j] = w[j] / S;
  }
  for (int64_t j = 0; j < K; j++) w[j] = w[j] * a->scaling;
}

static void group_fwd_task(void *vctx, int i, int n) {
  const group_fwd_args *a = (const group_fwd_args *)vctx;
  size_t b, e;
  mf_partition((size_t)a->T, 1, i, n, &b, &e);
  for (size_t t = b; t < e; t++) group_fwd_row(a, (int64_t)t);
}

static mf_status group_check(int64_t E, int64_t K, int64_t n_group, int64_t topk_group) {
  if (E <= 0 || K <= 0 || K > E)
    return MF_ERR(MF_ERR_INVALID_ARG, "group router: K=%lld experts of E=%lld", (long long)K, (long long)E);
  if (n_group < 1 || n_group > GROUPS_MAX || E % n_group != 0 || (n_group > 1 && E / n_group < 2))
    return MF_ERR(MF_ERR_INVALID_ARG,
                  "group router: n_group %lld must divide E=%lld into groups of 2 or more, at most %d groups",
                  (long long)n_group, (long long)E, GROUPS_MAX);
  if (topk_group < 1 || topk_group > n_group || topk_group * (E / n_group) < K)
    return MF_ERR(MF_ERR_INVALID_ARG,
                  "group router: topk_group %lld of %lld groups of %lld cannot hold K=%lld",
                  (long long)topk_group, (long long)n_group, (long long)(E / n_group), (long long)K);
  return MF_OK;
}

mf_status mf_cpu_router_group_fwd(const float *logits, const float *bias, int64_t T, int64_t E, int64_t K,
                                  int64_t n_group, int64_t topk_group, int norm_topk, float scaling,
                                  float *scores, int32_t *topk_idx, float *topk_w, const mf_kctx *ctx) {
  MF_CHECK(group_check(E, K, n_group, topk_group));
  if (T <= 0) return MF_OK;
  group_fwd_args a = {logits,     bias,      T,       E,      K,        n_group,
                      topk_group, norm_topk, scaling, scores, topk_idx, topk_w};
  mf_threadpool_run(ctx ? ctx->pool : NULL, group_fwd_task, &a);
  return MF_OK;
}

typedef struct {
  const float *scores;
  const int32_t *topk_idx;
  const float *dtopk_w;
  int64_t T, E, K;
  int norm_topk;
  float scaling;
  float *dlogits;
} group_bwd_args;

static void group_bwd_row(const group_bwd_args *a, int64_t t) {
  const int64_t E = a->E, K = a->K;
  const float *s = a->scores + t * E;
  const int32_t *idx = a->topk_idx + t * K;
  const float *g = a->dtopk_w + t * K;
  float *dl = a->dlogits + t * E;
  memset(dl, 0, (size_t)E * sizeof(float));
  if (a->norm_topk) {
    float D = 0.0f, us = 0.0f;
    for (int64_t j = 0; j < K; j++) D += s[idx[j]];
    D += 1e-20f;
    for (int64_t j = 0; j < K; j++) us += g[j] * a->scaling * s[idx[j]];
    for (int64_t j = 0; j < K; j++) dl[idx[j]] = (g[j] * a->scaling - us / D) / D;
  } else {
    for (int64_t j = 0; j < K; j++) dl[idx[j]] = g[j] * a->scaling;
  }
  for (int64_t j = 0; j < K; j++) {
    const int32_t e = idx[j];
    dl[e] = dl[e] * s[e] * (1.0f - s[e]);
  }
}

static void group_bwd_task(void *vctx, int i, int n) {
  const group_bwd_args *a = (const group_bwd_args *)vctx;
  size_t b, e;
  mf_partition((size_t)a->T, 1, i, n, &b, &e);
  for (size_t t = b; t < e; t++) group_bwd_row(a, (int64_t)t);
}

mf_status mf_cpu_router_group_bwd(const float *scores, const int32_t *topk_idx, const float *dtopk_w,
                                  int64_t T, int64_t E, int64_t K, int norm_topk, float scaling,
                                  float *dlogits, const mf_kctx *ctx) {
  if (E <= 0 || K <= 0 || K > E)
    return MF_ERR(MF_ERR_INVALID_ARG, "group router: K=%lld experts of E=%lld", (long long)K, (long long)E);
  if (T <= 0) return MF_OK;
  group_bwd_args a = {scores, topk_idx, dtopk_w, T, E, K, norm_topk, scaling, dlogits};
  mf_threadpool_run(ctx ? ctx->pool : NULL, group_bwd_task, &a);
  return MF_OK;
}
