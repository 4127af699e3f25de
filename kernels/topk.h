/*
 * The routers' top-k selection, one definition for the cpu kernels and their
 * cuda twins (kernels/cpu/router.c, router_group.c; kernels/cuda/routing.cu):
 * (v, e) inserted into the descending list w/idx of at most cap entries, n of
 * them so far; a later entry displaces an earlier one only when strictly
 * larger, so ties keep the lower index first.
 */
#ifndef MF_KERNELS_TOPK_H
#define MF_KERNELS_TOPK_H

#include <stdint.h>

#ifdef __CUDACC__
#define MF_TOPK_FN static inline __host__ __device__
#else
#define MF_TOPK_FN static inline
#endif

MF_TOPK_FN void mf_topk_insert(float v, int32_t e, float *w, int32_t *idx, int64_t *n, int64_t cap) {
  if (*n == cap && !(v > w[cap - 1])) return;
  int64_t j = *n < cap ? (*n)++ : cap - 1;
  while (j > 0 && v > w[j - 1]) {
    w[j] = w[j - 1];
    idx[j] = idx[j - 1];
    j--;
  }
  w[j] = v;
  idx[j] = e;
}

/* gpt-oss's router row (ROUTER_FWD mode 1), one body for both twins: the top-k
 * logits (descending, l read through LD(l, e) as float), their softmax into w,
 * and p the softmax over all E of w scattered into a row of zeros (what
 * gpt-oss's aux loss reads). QUAL: the function's storage class (and template
 * head), LT: the logits' element type. */
#define MF_ROUTER_TOPK_FIRST_ROW(QUAL, NAME, LT, LD)                                     \
  QUAL void NAME(const LT *l, int64_t E, int64_t K, float *p, int32_t *idx, float *w) {  \
    int64_t n = 0;                                                                       \
    for (int64_t e = 0; e < E; e++) mf_topk_insert(LD(l, e), (int32_t)e, w, idx, &n, K); \
    const float top = w[0];                                                              \
    float s = 0.0f;                                                                      \
    for (int64_t j = 0; j < K; j++) {                                                    \
      w[j] = expf(w[j] - top);                                                           \
      s += w[j];                                                                         \
    }                                                                                    \
    for (int64_t j = 0; j < K; j++) w[j] = w[j] / s;                                     \
    for (int64_t e = 0; e < E; e++) p[e] = 0.0f;                                         \
    for (int64_t j = 0; j < K; j++) p[idx[j]] = w[j];                                    \
    float m = p[0];                                                                      \
    for (int64_t e = 1; e < E; e++) m = p[e] > m ? p[e] : m;                             \
    float z = 0.0f;                                                                      \
    for (int64_t e = 0; e < E; e++) {                                                    \
      p[e] = expf(p[e] - m);                                                             \
      z += p[e];                                                                         \
    }                                                                                    \
    for (int64_t e = 0; e < E; e++) p[e] = p[e] / z;                                     \
  }

#endif /* MF_KERNELS_TOPK_H */
