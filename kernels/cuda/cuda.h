/*
 * The CUDA side of moefit, as plain C. Built with nvcc where the toolkit is
 * present; with --config=nocuda (or no toolkit) the same functions exist and
 * report that there is no GPU, so callers need no #ifdefs.
 */
#ifndef MF_KERNELS_CUDA_H
#define MF_KERNELS_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include "src/core/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* 1 when this build contains the cuda backend. */
int mf_cuda_compiled(void);

/* Number of usable GPUs. No driver, no device or a driver too old is not an
 * error: *count = 0 and `why` (if given) says which. */
mf_status mf_cuda_device_count(int *count, char *why, size_t why_cap);
mf_status mf_cuda_device_name(int device, char *buf, size_t cap);
/* The device's free and total memory now (cudaMemGetInfo; creates the
 * device's context when it has none yet, so the context is no longer free). */
mf_status mf_cuda_device_memory(int device, uint64_t *free_bytes, uint64_t *total_bytes);

/* Device buffers for tests and tools (the executor uses its one arena). */
mf_status mf_cuda_malloc(size_t bytes, void **out);
void mf_cuda_free(void *p);
mf_status mf_cuda_memcpy_h2d(void *dst, const void *src, size_t bytes);
mf_status mf_cuda_memcpy_d2h(void *dst, const void *src, size_t bytes);

/* Cast: dst[i] = bf16(src[i]), round to nearest even, NaN kept.
 * cpu twin: mf_fp32_to_bf16_n (src/core). stream: a cudaStream_t (NULL = default). */
mf_status mf_cuda_cast_f32_to_bf16(const float *src, uint16_t *dst, size_t n, void *stream);
/* Cast: dst[i] = float(src[i]) (exact). cpu twin: mf_bf16_to_fp32_n. */
mf_status mf_cuda_cast_bf16_to_f32(const uint16_t *src, float *dst, size_t n, void *stream);
mf_status mf_cuda_stream_sync(void *stream);

#ifdef __cplusplus
}
#endif

#endif /* MF_KERNELS_CUDA_H */
