// A per-expert bias over the expert-sorted rows on the cuda backend (gpt-oss's
// expert projection biases), over fp32 or bf16 storage T; the cpu twin is
// kernels/cpu/expert_bias.c. Rows of expert e are [offsets[e], offsets[e+1])
// (offsets int64 [E+1], on the device); y, dy [R, N]; bias [E, N]; db [E, N] fp32.
//
//   fwd  y[r,:] += bias[e,:] for every row r of e (added): one block per row
//        r < R (R: the rows of y, a bound on offsets[E]; rows at or past
//        offsets[E] are left alone), its expert found by a binary search of
//        offsets (the last e with offsets[e] <= r), a thread per column; one
//        fp32 add per element, rounded once (mf_st).
//   bwd  db[e,:] += the sum over the rows of e of dy[r,:] (added, fp32): one
//        thread per (e, column) sums its rows in row order from 0, then adds
//        the sum to db once; an expert without rows is not written. The cpu
//        twin does the same adds in the same order: the same bits.
#include <cuda_runtime.h>
#include <stdint.h>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/ops.cuh"

template <typename T>
static __global__ void expert_bias_fwd_kernel(const T *__restrict__ bias, const int64_t *__restrict__ offsets,
                                              int64_t R, int64_t E, int64_t N, T *__restrict__ y) {
  const int64_t last = offsets[E];
  for (int64_t r = blockIdx.x; r < R && r < last; r += gridDim.x) {
    int64_t lo = 0, hi = E - 1;  // the last e in [0, E) with offsets[e] <= r
    while (lo < hi) {
      const int64_t mid = (lo + hi + 1) / 2;
      if (offsets[mid] <= r)
        lo = mid;
      else
        hi = mid - 1;
    }
    const T *b = bias + lo * N;
    T *row = y + r * N;
    for (int64_t c = threadIdx.x; c < N; c += blockDim.x) mf_st(row + c, mf_ld(row + c) + mf_ld(b + c));
  }
}

template <typename T>
static __global__ void expert_bias_bwd_kernel(const T *__restrict__ dy, const int64_t *__restrict__ offsets,
                                              int64_t E, int64_t N, float *__restrict__ db) {
  for (int64_t k = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; k < E * N;
       k += (int64_t)gridDim.x * blockDim.x) {
    const int64_t e = k / N, c = k - e * N, r0 = offsets[e], r1 = offsets[e + 1];
    if (r1 <= r0) continue;
    float s = 0.0f;
    for (int64_t r = r0; r < r1; r++) s += mf_ld(dy + r * N + c);
    db[k] += s;
  }
}

template <typename T>
mf_status mf_cuda_expert_bias_fwd(const T *bias, const int64_t *offsets, int64_t R, int64_t E, int64_t N,
                                  T *y, cudaStream_t s) {
  if (R <= 0 || E <= 0 || N <= 0) return MF_OK;
  expert_bias_fwd_kernel<T><<<mf_cuda_grid_rows(R), MF_CUDA_BLOCK, 0, s>>>(bias, offsets, R, E, N, y);
  MF_CUDA_CHECK_LAUNCH();
  return MF_OK;
}

template <typename T>
mf_status mf_cuda_expert_bias_bwd(const T *dy, const int64_t *offsets, int64_t E, int64_t N, float *db,
                                  cudaStream_t s) {
  if (E <= 0 || N <= 0) return MF_OK;
  expert_bias_bwd_kernel<T><<<mf_cuda_grid(E * N), MF_CUDA_BLOCK, 0, s>>>(dy, offsets, E, N, db);
  MF_CUDA_CHECK_LAUNCH();
  return MF_OK;
}

#define MF_EXPERT_BIAS_LAUNCHERS(T)                                                                         \
  template mf_status mf_cuda_expert_bias_fwd<T>(const T *, const int64_t *, int64_t, int64_t, int64_t, T *, \
                                                cudaStream_t);                                              \
  template mf_status mf_cuda_expert_bias_bwd<T>(const T *, const int64_t *, int64_t, int64_t, float *,      \
                                                cudaStream_t);

MF_EXPERT_BIAS_LAUNCHERS(float)
MF_EXPERT_BIAS_LAUNCHERS(mf_bf16)
