// DEQUANT, the cuda twin of mf_cpu_dequant (kernels/cpu/dequant.c): a frozen
// weight's blob (src/core/qformat.h) into y in the storage dtype,
// one thread per element through mf_qweight_at, the definition the cpu twin
// and the host code read: the same bits (its products and sums are
// __fmul_rn / __fadd_rn there, which nvcc does not fuse; ldexpf is exact).
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "kernels/backend.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/ops.cuh"
#include "src/core/qformat.h"

template <typename T>
static __global__ void dequant_kernel(mf_qweight w, const uint8_t *__restrict__ qw, T *__restrict__ y) {
  mf_qweight_blob_view(&w, qw);
  const int64_t n = w.rows * w.cols;
  for (int64_t k = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; k < n; k += (int64_t)gridDim.x * blockDim.x)
    mf_st(y + k, mf_qweight_at(&w, k / w.cols, k % w.cols));
}

template <typename T>
mf_status mf_cuda_dequant(const uint8_t *qw, int64_t kind, int64_t rows, int64_t cols, int64_t blocksize,
                          int64_t nested, T *y, cudaStream_t s) {
  if (kind <= MF_QUANT_NONE || kind >= MF_QUANT_COUNT_)
    return MF_ERR(MF_ERR_INVALID_ARG, "dequant: format %lld is not NF4, FP8 or MXFP4", (long long)kind);
  if (rows <= 0 || cols <= 0) return MF_OK;
  mf_qweight w = {};
  w.kind = (int32_t)kind;
  w.nested = (int32_t)nested;
  w.rows = rows;
  w.cols = cols;
  w.blocksize = blocksize;
  dequant_kernel<T><<<mf_cuda_grid(rows * cols), MF_CUDA_BLOCK, 0, s>>>(w, qw, y);
  MF_CUDA_CHECK_LAUNCH();
  return MF_OK;
}

template mf_status mf_cuda_dequant<float>(const uint8_t *, int64_t, int64_t, int64_t, int64_t, int64_t, float *,
                                          cudaStream_t);
template mf_status mf_cuda_dequant<mf_bf16>(const uint8_t *, int64_t, int64_t, int64_t, int64_t, int64_t, mf_bf16 *,
                                            cudaStream_t);
