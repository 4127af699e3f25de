// The inline-PTX primitives of the tensor-core kernels (expert_mma.cu,
// attention_mma.cu): cp.async with zero-fill, ldmatrix (.trans), mma.sync
// m16n8k16 bf16 -> fp32, bf16x2 packing and stores, and the dynamic shared
// memory. They are the only inline PTX of those files: a host program that
// defines MF_MMA_EMULATE includes a kernel file without this header and
// supplies its own versions (tests/cuda/mma_emu.h), so that the kernels' index
// arithmetic runs on the CPU.
#ifndef MF_KERNELS_CUDA_MMA_CUH
#define MF_KERNELS_CUDA_MMA_CUH

#include <cuda_bf16.h>
#include <stdint.h>

#include "kernels/cuda/ops.cuh"

__device__ __forceinline__ unsigned smem_u32(const void *p) {
  return (unsigned)__cvta_generic_to_shared(p);
}

// 16 bytes from global src to shared dst, asynchronously; when !valid the 16
// bytes are zero-filled and nothing is read (src-size 0).
__device__ __forceinline__ void cp_async16(void *dst, const void *src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(dst)),
               "l"((unsigned long long)__cvta_generic_to_global(src)), "r"(valid ? 16 : 0)
               : "memory");
}

__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}

// Until at most N of this thread's committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// Four 8x8 b16 matrices; lane l gives the address of row l % 8 of matrix l / 8
// and gets, in r[j], row l / 4 elements 2 (l % 4), +1 of matrix j — or with
// TRANS column l / 4, rows 2 (l % 4), +1 (the lower index in the low half).
template <bool TRANS>
__device__ __forceinline__ void ldsm_x4(uint32_t r[4], const mf_bf16 *p) {
  if (TRANS)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_u32(p))
                 : "memory");
  else
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_u32(p))
                 : "memory");
}

// d += a . b on one m16n8k16 tile (bf16 in, fp32 accumulate).
__device__ __forceinline__ void mma_bf16(float d[4], const uint32_t a[4], const uint32_t b[2]) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// lo in the low half, hi in the high half, each rounded to the nearest even bf16:
// an mma operand register made from fp32 values.
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t *>(&v);
}

// p[0] = lo, p[1] = hi, each rounded to the nearest even bf16 (p 4-byte aligned).
__device__ __forceinline__ void st_bf16x2(mf_bf16 *p, float lo, float hi) {
  *reinterpret_cast<__nv_bfloat162 *>(p) = __floats2bfloat162_rn(lo, hi);
}

// The block's dynamic shared memory, 16-byte aligned.
__device__ __forceinline__ unsigned char *mma_smem() {
  extern __shared__ __align__(16) unsigned char mf_mma_smem[];
  return mf_mma_smem;
}

#endif  // MF_KERNELS_CUDA_MMA_CUH
