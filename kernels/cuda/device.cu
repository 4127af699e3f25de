// Device discovery and plain device buffers. A machine without a GPU (no
// driver: cudaErrorInsufficientDriver, or no device) reports zero devices.
#include <stdio.h>

#include "kernels/cuda/cuda.h"
#include "kernels/cuda/cuda_check.h"

extern "C" int mf_cuda_compiled(void) { return 1; }

extern "C" mf_status mf_cuda_device_count(int *count, char *why, size_t why_cap) {
  *count = 0;
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e == cudaErrorInsufficientDriver || e == cudaErrorNoDevice || e == cudaErrorInitializationError) {
    if (why) snprintf(why, why_cap, "%s", cudaGetErrorString(e));
    cudaGetLastError();  // clear the sticky-free error so later calls start clean
    return MF_OK;
  }
  MF_CUDA_CHECK(e);
  *count = n;
  if (why && n == 0) snprintf(why, why_cap, "no CUDA device");
  return MF_OK;
}

extern "C" mf_status mf_cuda_device_name(int device, char *buf, size_t cap) {
  cudaDeviceProp prop;
  MF_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  snprintf(buf, cap, "%s (sm_%d%d, %.1f GiB)", prop.name, prop.major, prop.minor,
           (double)prop.totalGlobalMem / (1024.0 * 1024.0 * 1024.0));
  return MF_OK;
}

extern "C" mf_status mf_cuda_device_memory(int device, uint64_t *free_bytes, uint64_t *total_bytes) {
  *free_bytes = *total_bytes = 0;
  MF_CUDA_CHECK(cudaSetDevice(device));
  size_t f = 0, t = 0;
  MF_CUDA_CHECK(cudaMemGetInfo(&f, &t));
  *free_bytes = f;
  *total_bytes = t;
  return MF_OK;
}

extern "C" mf_status mf_cuda_malloc(size_t bytes, void **out) {
  *out = NULL;
  MF_CUDA_CHECK(cudaMalloc(out, bytes ? bytes : 1));
  return MF_OK;
}

extern "C" void mf_cuda_free(void *p) {
  if (p) cudaFree(p);
}

extern "C" mf_status mf_cuda_memcpy_h2d(void *dst, const void *src, size_t bytes) {
  MF_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice));
  return MF_OK;
}

extern "C" mf_status mf_cuda_memcpy_d2h(void *dst, const void *src, size_t bytes) {
  MF_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost));
  return MF_OK;
}

extern "C" mf_status mf_cuda_stream_sync(void *stream) {
  MF_CUDA_CHECK(cudaStreamSynchronize((cudaStream_t)stream));
  return MF_OK;
}
