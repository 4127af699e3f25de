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

#endif /* MF_KERNELS_TOPK_H */
