// gpt-oss's clamped SwiGLU on the cuda backend, over fp32 or bf16 storage T;
// the maths and its order are the cpu twin's (kernels/cpu/swiglu_clamp.c):
//
//   g' = min(g, limit), u' = clamp(u, -limit, limit)      (comparisons: NaN stays NaN)
//   s = sigmoid(alpha * g') = 1 / (1 + e^-(alpha g')),  glu = g' * s
//   fwd: act = (u' + 1) * glu                               (written)   g, u, act [n]
//   bwd: dg = dact * (u' + 1) * (s + alpha * g' * s * (1 - s))  where g <= limit, else 0
//        du = dact * glu                                    where -limit <= u <= limit, else 0
//
// One thread per element: a T read widened to fp32, each output rounded once
// (mf_st). The device's expf and fma contraction make the fp32 results differ
// from the cpu's by a few ulp, not more.
#include <cuda_runtime.h>
#include <stdint.h>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/ops.cuh"

#define GRID_STRIDE(i, n)                                                   \
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n); \
       i += (int64_t)gridDim.x * blockDim.x)

template <typename T>
static __global__ void swiglu_clamp_fwd_kernel(const T *__restrict__ g, const T *__restrict__ u, int64_t n,
                                               float lim, float alpha, T *__restrict__ act) {
  GRID_STRIDE(k, n) {
    const float g0 = mf_ld(g + k), u0 = mf_ld(u + k);
    const float gc = g0 > lim ? lim : g0;
    const float uc = u0 > lim ? lim : u0 < -lim ? -lim : u0;
    const float s = 1.0f / (1.0f + expf(-(alpha * gc)));
    const float glu = gc * s;
    mf_st(act + k, (uc + 1.0f) * glu);
  }
}

template <typename T>
static __global__ void swiglu_clamp_bwd_kernel(const T *__restrict__ g, const T *__restrict__ u,
                                               const T *__restrict__ dact, int64_t n, float lim, float alpha,
                                               T *__restrict__ dg, T *__restrict__ du) {
  GRID_STRIDE(k, n) {
    const float g0 = mf_ld(g + k), u0 = mf_ld(u + k), d = mf_ld(dact + k);
    const float gc = g0 > lim ? lim : g0;
    const float uc = u0 > lim ? lim : u0 < -lim ? -lim : u0;
    const float s = 1.0f / (1.0f + expf(-(alpha * gc)));
    const float glu = gc * s;
    const float dglu = s + alpha * gc * s * (1.0f - s);
    mf_st(dg + k, g0 <= lim ? d * (uc + 1.0f) * dglu : 0.0f);
    mf_st(du + k, u0 >= -lim && u0 <= lim ? d * glu : 0.0f);
  }
}

template <typename T>
mf_status mf_cuda_swiglu_clamp_fwd(const T *g, const T *u, int64_t n, float limit, float alpha, T *act,
                                   cudaStream_t s) {
  if (n <= 0) return MF_OK;
  swiglu_clamp_fwd_kernel<T><<<mf_cuda_grid(n), MF_CUDA_BLOCK, 0, s>>>(g, u, n, limit, alpha, act);
  MF_CUDA_CHECK_LAUNCH();
  return MF_OK;
}

template <typename T>
mf_status mf_cuda_swiglu_clamp_bwd(const T *g, const T *u, const T *dact, int64_t n, float limit, float alpha,
                                   T *dg, T *du, cudaStream_t s) {
  if (n <= 0) return MF_OK;
  swiglu_clamp_bwd_kernel<T><<<mf_cuda_grid(n), MF_CUDA_BLOCK, 0, s>>>(g, u, dact, n, limit, alpha, dg, du);
  MF_CUDA_CHECK_LAUNCH();
  return MF_OK;
}

#define MF_SWIGLU_CLAMP_LAUNCHERS(T)                                                                     \
  template mf_status mf_cuda_swiglu_clamp_fwd<T>(const T *, const T *, int64_t, float, float, T *,       \
                                                 cudaStream_t);                                          \
  template mf_status mf_cuda_swiglu_clamp_bwd<T>(const T *, const T *, const T *, int64_t, float, float, \
                                                 T *, T *, cudaStream_t);

MF_SWIGLU_CLAMP_LAUNCHERS(float)
MF_SWIGLU_CLAMP_LAUNCHERS(mf_bf16)
