// Casts between fp32 and bf16.
//   f32 -> bf16: dst[i] = round_nearest_even(src[i]), NaN stays NaN (quiet, sign kept)
//   bf16 -> f32: exact
// Shapes: flat, n elements. Thread mapping: a grid-stride loop, one element per
// thread per iteration. The bit arithmetic is the cpu twin's (src/core/core.h),
// so the two agree bit for bit rather than trusting the intrinsic's NaN handling.
#include <cuda_runtime.h>
#include <stdint.h>

#include "kernels/cuda/cuda.h"
#include "kernels/cuda/cuda_check.h"

__device__ __forceinline__ uint16_t f32_to_bf16_rne(float f) {
  uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x0040u);
  return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

__global__ void cast_f32_to_bf16_kernel(const float *__restrict__ src, uint16_t *__restrict__ dst, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    dst[i] = f32_to_bf16_rne(src[i]);
}

__global__ void cast_bf16_to_f32_kernel(const uint16_t *__restrict__ src, float *__restrict__ dst, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    dst[i] = __uint_as_float((uint32_t)src[i] << 16);
}

static unsigned grid_for(size_t n, unsigned block) {
  size_t g = (n + block - 1) / block;
  if (g > 65535u * 8u) g = 65535u * 8u;
  return g ? (unsigned)g : 1u;
}

extern "C" mf_status mf_cuda_cast_f32_to_bf16(const float *src, uint16_t *dst, size_t n, void *stream) {
  if (n == 0) return MF_OK;
  cast_f32_to_bf16_kernel<<<grid_for(n, 256), 256, 0, (cudaStream_t)stream>>>(src, dst, n);
  MF_CUDA_CHECK_LAUNCH();
  return MF_OK;
}

extern "C" mf_status mf_cuda_cast_bf16_to_f32(const uint16_t *src, float *dst, size_t n, void *stream) {
  if (n == 0) return MF_OK;
  cast_bf16_to_f32_kernel<<<grid_for(n, 256), 256, 0, (cudaStream_t)stream>>>(src, dst, n);
  MF_CUDA_CHECK_LAUNCH();
  return MF_OK;
}
