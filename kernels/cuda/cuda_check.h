/* MF_CUDA_CHECK: maps a CUDA runtime error to MF_ERR_CUDA with the call's text. */
#ifndef MF_KERNELS_CUDA_CHECK_H
#define MF_KERNELS_CUDA_CHECK_H

#include <cuda_runtime.h>

#include "src/core/core.h"

#define MF_CUDA_CHECK(call)                                                                  \
  do {                                                                                       \
    cudaError_t mf_e_ = (call);                                                              \
    if (mf_e_ != cudaSuccess)                                                                \
      return mf_error_set(MF_ERR_CUDA, __FILE__, __LINE__, "%s failed: %s (%s)", #call,      \
                          cudaGetErrorString(mf_e_), cudaGetErrorName(mf_e_));               \
  } while (0)

/* After every launch: a launch error (bad configuration) is reported at once. */
#define MF_CUDA_CHECK_LAUNCH() MF_CUDA_CHECK(cudaGetLastError())

#endif /* MF_KERNELS_CUDA_CHECK_H */
