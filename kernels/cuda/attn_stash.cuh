// The attention backward's Di stash (attention.cu, attention_mma.cu): Di =
// do[i].o[i] of a (token, query head) row, kept exactly in the first elements
// of that row of dq between the Di launch and the dq launch, which reads it
// before it overwrites the row. A float row holds it in element 0, a bf16 row
// its 32 bits in elements 0 and 1 (so D >= 2 there).
#ifndef MF_KERNELS_CUDA_ATTN_STASH_CUH
#define MF_KERNELS_CUDA_ATTN_STASH_CUH

#ifndef MF_MMA_EMULATE  // the emulator (tests/cuda/mma_emu.h) brings its own mf_bf16
#include "kernels/cuda/ops.cuh"
#endif

__device__ __forceinline__ void stash_put(float *row, float v) {
  row[0] = v;
}
__device__ __forceinline__ void stash_put(mf_bf16 *row, float v) {
  const unsigned u = __float_as_uint(v);
  unsigned short *h = reinterpret_cast<unsigned short *>(row);
  h[0] = (unsigned short)(u & 0xffffu);
  h[1] = (unsigned short)(u >> 16);
}
__device__ __forceinline__ float stash_get(const float *row) {
  return row[0];
}
__device__ __forceinline__ float stash_get(const mf_bf16 *row) {
  const unsigned short *h = reinterpret_cast<const unsigned short *>(row);
  return __uint_as_float((unsigned)h[0] | (unsigned)h[1] << 16);
}

#endif  // MF_KERNELS_CUDA_ATTN_STASH_CUH
