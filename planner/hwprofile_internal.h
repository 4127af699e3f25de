/*
 * Private to planner/: helpers the hardware-profile reader (hwprofile.c), its
 * writer (hwprofile_write.c) and the cost model (hwprofile_cost.c) share.
 */
#ifndef MF_PLANNER_HWPROFILE_INTERNAL_H
#define MF_PLANNER_HWPROFILE_INTERNAL_H

#include <string.h>

#include "planner/hwprofile.h"

static inline int trim_sizes(const int64_t *sizes, int n) {
  while (n > 0 && sizes[n - 1] == 0) n--;
  return n;
}

static inline int same_key(const mf_hw_kernel_point *a, const char *kernel, const int64_t *sizes, int n_sizes,
                           double bytes) {
  if (a->n_sizes != n_sizes || a->bytes != bytes || strcmp(a->kernel, kernel) != 0) return 0;
  for (int i = 0; i < n_sizes; i++)
    if (a->sizes[i] != sizes[i]) return 0;
  return 1;
}

static inline double gemm_work(const mf_hw_gemm_point *g) {
  return 2.0 * g->m * g->n * g->k;
}

#endif /* MF_PLANNER_HWPROFILE_INTERNAL_H */
