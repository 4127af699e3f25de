/*
 * The cuda backend: kernels/backend.h filled with CUDA runtime calls.
 *
 *   arena_create  one cudaMalloc of exactly the bytes asked, once per backend
 *   host_alloc    pinned host memory (cudaHostAlloc, portable), host_free frees it
 *   streams       cudaStreamNonBlocking streams; events without timing
 *   copy          cudaMemcpyAsync of the given kind on the given stream
 *   run           the kernels of kernels/cuda/ops.h, launched on the stream;
 *                 kinds not built yet fail with MF_ERR_UNSUPPORTED naming them
 *
 * Nothing is allocated on the device after mf_backend_cuda_create except the
 * one arena: kernel scratch (opts.scratch_bytes) is allocated at create.
 * Storage is fp32 (the program's F32 storage) with fp32 math; every kernel is
 * deterministic (no floating-point atomics, fixed reduction orders), so two
 * runs of one call give the same bits.
 *
 * Errors: every CUDA call is checked and reported as MF_ERR_CUDA with the CUDA
 * error string. Built without the toolkit (--config=nocuda), create fails with
 * MF_ERR_UNSUPPORTED; on a machine without a GPU with MF_ERR_NO_DEVICE.
 * A stream argument of NULL means the device's default stream.
 */
#ifndef MF_KERNELS_CUDA_BACKEND_CUDA_H
#define MF_KERNELS_CUDA_BACKEND_CUDA_H

#include <stddef.h>

#include "kernels/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mf_cuda_backend_opts {
  int device;           /* CUDA device ordinal (0 = the first visible GPU) */
  size_t scratch_bytes; /* device scratch for the kernels' partial sums; 0 = MF_CUDA_SCRATCH_DEFAULT */
} mf_cuda_backend_opts;

/* 16 MiB: RMSNorm's dw partials (at most 32 row blocks x C floats) for C up to 131072. */
#define MF_CUDA_SCRATCH_DEFAULT ((size_t)16 << 20)

/* opts may be NULL (device 0, default scratch). *out is NULL on failure. */
mf_status mf_backend_cuda_create(const mf_cuda_backend_opts *opts, mf_backend **out);

#ifdef __cplusplus
}
#endif

#endif /* MF_KERNELS_CUDA_BACKEND_CUDA_H */
