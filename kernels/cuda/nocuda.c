/* The cuda entry points in a build without the CUDA toolkit: no GPU, cleanly. */
#include <stdio.h>

#include "kernels/cuda/attention_cudnn.h"
#include "kernels/cuda/backend_cuda.h"
#include "kernels/cuda/cuda.h"

int mf_cuda_compiled(void) { return 0; }

mf_status mf_cuda_device_count(int *count, char *why, size_t why_cap) {
  *count = 0;
  if (why) snprintf(why, why_cap, "moefit was built without CUDA (--config=nocuda or no toolkit)");
  return MF_OK;
}

#define NO_CUDA() MF_ERR(MF_ERR_NO_DEVICE, "moefit was built without CUDA")

mf_status mf_cuda_device_name(int device, char *buf, size_t cap) { return NO_CUDA(); }
mf_status mf_cuda_device_memory(int device, uint64_t *free_bytes, uint64_t *total_bytes) {
  *free_bytes = *total_bytes = 0;
  return NO_CUDA();
}
mf_status mf_cuda_malloc(size_t bytes, void **out) {
  *out = NULL;
  return NO_CUDA();
}
void mf_cuda_free(void *p) {}
mf_status mf_cuda_memcpy_h2d(void *dst, const void *src, size_t bytes) { return NO_CUDA(); }
mf_status mf_cuda_memcpy_d2h(void *dst, const void *src, size_t bytes) { return NO_CUDA(); }
mf_status mf_cuda_cast_f32_to_bf16(const float *src, uint16_t *dst, size_t n, void *stream) { return NO_CUDA(); }
mf_status mf_cuda_cast_bf16_to_f32(const uint16_t *src, float *dst, size_t n, void *stream) { return NO_CUDA(); }
mf_status mf_cuda_stream_sync(void *stream) { return NO_CUDA(); }
mf_status mf_cuda_adamw_update(const mf_cuda_adamw_step *h, float *param, const void *grad, int grad_bf16,
                               void *m, void *v, int moment_bf16, uint16_t *bf16_out, size_t n, void *stream) {
  return NO_CUDA();
}
mf_status mf_cuda_adamw_update_scaled(const mf_cuda_adamw_step *h, float *param, float *grad, double coef,
                                      void *m, void *v, int moment_bf16, uint16_t *bf16_out, size_t n,
                                      void *stream) {
  return NO_CUDA();
}
mf_status mf_cuda_grad_chunk_sumsq(const float *g, size_t n, double *sums, void *stream) { return NO_CUDA(); }

mf_status mf_backend_cuda_create(const mf_cuda_backend_opts *opts, mf_backend **out) {
  *out = NULL;
  return MF_ERR(MF_ERR_UNSUPPORTED, "the cuda backend is not available: moefit was built without CUDA "
                                    "(--config=nocuda or no toolkit)");
}

mf_status mf_backend_cuda_set_expert_gemm(mf_backend *b, int which) {
  return NO_CUDA();
}
const char *mf_backend_cuda_expert_gemm(const mf_backend *b) {
  return NULL;
}
uint64_t mf_backend_cuda_cutlass_calls(const mf_backend *b) {
  return 0;
}
uint64_t mf_backend_cuda_mma_calls(int which) {
  return 0;
}
mf_status mf_backend_cuda_set_attention(mf_backend *b, int which) {
  return NO_CUDA();
}
const char *mf_backend_cuda_attention(const mf_backend *b) {
  return NULL;
}
uint64_t mf_backend_cuda_cudnn_calls(const mf_backend *b) {
  return 0;
}
uint64_t mf_cuda_attn_cudnn_workspace_bound(int64_t B, int64_t S, int64_t Hq, int64_t Hkv, int64_t D) {
  return 0;
}

/* attention_cudnn.h: no cuDNN without CUDA. */
int mf_cuda_cudnn_built(void) {
  return 0;
}
mf_status mf_cuda_cudnn_create(mf_cuda_cudnn **out) {
  *out = NULL;
  return NO_CUDA();
}
void mf_cuda_cudnn_free(mf_cuda_cudnn *c) {
  (void)c;
}
int64_t mf_cuda_cudnn_version(const mf_cuda_cudnn *c) {
  return 0;
}
mf_status mf_cuda_attn_cudnn_fwd(mf_cuda_cudnn *c, const void *q, const void *k, const void *v, int64_t B,
                                 int64_t S, int64_t Hq, int64_t Hkv, int64_t D, float scale, void *o,
                                 float *lse, void *ws, size_t ws_bytes, int *ran, void *stream) {
  *ran = 0;
  return NO_CUDA();
}
mf_status mf_cuda_attn_cudnn_bwd(mf_cuda_cudnn *c, const void *q, const void *k, const void *v, const void *o,
                                 const void *dout, const float *lse, int64_t B, int64_t S, int64_t Hq,
                                 int64_t Hkv, int64_t D, float scale, void *dq, void *dk, void *dv, void *ws,
                                 size_t ws_bytes, int *ran, void *stream) {
  *ran = 0;
  return NO_CUDA();
}
