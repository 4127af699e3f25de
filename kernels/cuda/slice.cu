// Strided column blocks (kernels/cpu/slice.c's contract and orders): one
// thread per destination element; the backward sums its rep rows in h order,
// as the cpu twin does, so both give the same bits. Arithmetic in fp32.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "kernels/backend.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/ops.cuh"

template <typename T>
static __global__ void slice_kernel(const T *__restrict__ x, int64_t R, int64_t C, int64_t xs, int64_t xo,
                                    int64_t ys, int64_t yo, int64_t rep, int acc, T *__restrict__ y) {
  for (int64_t k = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; k < R * C;
       k += (int64_t)gridDim.x * blockDim.x) {
    const int64_t r = k / C, j = k - r * C;
    T *d = y + r * ys + yo + j;
    const float v = mf_ld(x + (r / rep) * xs + xo + j);
    mf_st(d, acc ? mf_ld(d) + v : v);
  }
}

template <typename T>
static __global__ void slice_bwd_kernel(const T *__restrict__ dy, int64_t Q, int64_t C, int64_t xs,
                                        int64_t xo, int64_t ys, int64_t yo, int64_t rep, int acc,
                                        T *__restrict__ dx) {
  for (int64_t k = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; k < Q * C;
       k += (int64_t)gridDim.x * blockDim.x) {
    const int64_t q = k / C, j = k - q * C;
    T *d = dx + q * xs + xo + j;
    float s = acc ? mf_ld(d) : 0.0f;
    for (int64_t h = 0; h < rep; h++) s += mf_ld(dy + (q * rep + h) * ys + yo + j);
    mf_st(d, s);
  }
}

template <typename T>
mf_status mf_cuda_slice(const T *x, int64_t R, int64_t C, int64_t xs, int64_t xo, int64_t ys, int64_t yo,
                        int64_t rep, int acc, T *y, cudaStream_t s) {
  MF_CHECK(mf_kernel_slice_check("slice", R, C, xs, xo, ys, yo, rep));
  if (R * C <= 0) return MF_OK;
  slice_kernel<T><<<mf_cuda_grid(R * C), MF_CUDA_BLOCK, 0, s>>>(x, R, C, xs, xo, ys, yo, rep, acc, y);
  MF_CUDA_CHECK_LAUNCH();
  return MF_OK;
}

template <typename T>
mf_status mf_cuda_slice_bwd(const T *dy, int64_t Q, int64_t C, int64_t xs, int64_t xo, int64_t ys, int64_t yo,
                            int64_t rep, int acc, T *dx, cudaStream_t s) {
  MF_CHECK(mf_kernel_slice_check("slice_bwd", Q, C, xs, xo, ys, yo, rep));
  if (Q * C <= 0) return MF_OK;
  slice_bwd_kernel<T><<<mf_cuda_grid(Q * C), MF_CUDA_BLOCK, 0, s>>>(dy, Q, C, xs, xo, ys, yo, rep, acc, dx);
  MF_CUDA_CHECK_LAUNCH();
  return MF_OK;
}

#define MF_SLICE_LAUNCHERS(T)                                                                              \
  template mf_status mf_cuda_slice<T>(const T *, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,     \
                                      int64_t, int, T *, cudaStream_t);                                    \
  template mf_status mf_cuda_slice_bwd<T>(const T *, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, \
                                          int64_t, int, T *, cudaStream_t);

MF_SLICE_LAUNCHERS(float)
MF_SLICE_LAUNCHERS(mf_bf16)
