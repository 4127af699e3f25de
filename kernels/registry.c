/* Backends by name (see registry.h). */
#include "kernels/registry.h"

#include <stdio.h>
#include <string.h>

#include "kernels/cuda/backend_cuda.h"
#include "kernels/cuda/cuda.h"

static int gpu_visible(void) {
  if (!mf_cuda_compiled()) return 0;
  int n = 0;
  return mf_cuda_device_count(&n, NULL, 0) == MF_OK && n > 0;
}

int mf_backend_device_count(void) {
  if (!mf_cuda_compiled()) return 0;
  int n = 0;
  return mf_cuda_device_count(&n, NULL, 0) == MF_OK ? n : 0;
}

mf_status mf_backend_resolve(const char *name, const char **out) {
  *out = NULL;
  if (!name || strcmp(name, "auto") == 0) {
    *out = gpu_visible() ? "cuda" : "cpu";
    return MF_OK;
  }
  if (strcmp(name, "cpu") == 0 || strcmp(name, "cuda") == 0) {
    *out = strcmp(name, "cpu") == 0 ? "cpu" : "cuda";
    return MF_OK;
  }
  return MF_ERR(MF_ERR_INVALID_ARG, "backend '%s': not a backend (cpu, cuda or auto)", name);
}

mf_status mf_backend_query_memory(const char *name, const mf_backend_params *p, int ask_device,
                                  mf_backend_memory *out) {
  memset(out, 0, sizeof *out);
  const char *r = NULL;
  MF_CHECK(mf_backend_resolve(name, &r));
  snprintf(out->name, sizeof out->name, "%s", r);
  if (strcmp(r, "cpu") == 0) return MF_OK; /* its device is host memory: nothing beside the arena */
  out->workspace_bytes = MF_CUDA_GEMM_WORKSPACE_DEFAULT;
  out->scratch_bytes =
      p && p->scratch_bytes > MF_CUDA_SCRATCH_DEFAULT ? p->scratch_bytes : MF_CUDA_SCRATCH_DEFAULT;
  out->attn_scratch_bytes = out->scratch_bytes - MF_CUDA_SCRATCH_DEFAULT;
  out->context_bytes = MF_CUDA_CONTEXT_RESERVE;
  out->total_bytes = out->workspace_bytes + out->scratch_bytes + out->context_bytes;
  if (!ask_device || !gpu_visible()) return MF_OK;
  const int dev = p ? p->device : 0;
  MF_CHECK(mf_cuda_device_memory(dev, &out->device_free_bytes, &out->device_total_bytes));
  MF_CHECK(mf_cuda_device_name(dev, out->device_name, sizeof out->device_name));
  out->device_known = 1;
  /* Asking made the context: it is already outside the free memory measured. */
  out->total_bytes -= out->context_bytes;
  out->context_bytes = 0;
  return MF_OK;
}

mf_status mf_backend_create(const char *name, const mf_backend_params *p, mf_backend **out) {
  *out = NULL;
  const char *r = NULL;
  MF_CHECK(mf_backend_resolve(name, &r));
  const mf_backend_params none = {0};
  if (!p) p = &none;
  if (strcmp(r, "cuda") == 0) {
    const mf_cuda_backend_opts co = {p->device, (size_t)p->scratch_bytes, 0, MF_CUDA_EXPERT_GEMM_AUTO,
                                     MF_CUDA_ATTENTION_AUTO};
    mf_status st = mf_backend_cuda_create(&co, out);
    if (st != MF_OK) mf_error_prefix("backend: cuda");
    return st;
  }
  const mf_cpu_backend_opts co = {p->pool, p->round_bf16, p->checking, p->optim, p->streams};
  return mf_backend_cpu_create(&co, out);
}

uint64_t mf_backend_attention_scratch(const char *name, mf_dtype storage, int cudnn, int64_t B, int64_t S,
                                      int64_t Hq, int64_t Hkv, int64_t D) {
  if (!name || strcmp(name, "cuda") != 0 || storage != MF_DTYPE_BF16) return 0;
  if (!cudnn) return 0;
  const uint64_t ws = mf_cuda_attn_cudnn_workspace_bound(B, S, Hq, Hkv, D); /* 0 built without CUDA */
  return ws ? MF_CUDA_SCRATCH_DEFAULT + ws : 0;
}

const char *mf_backend_attention(const mf_backend *b) {
  return b && strcmp(b->name, "cuda") == 0 ? mf_backend_cuda_attention(b) : NULL;
}

const char *mf_backend_expert_gemm(const mf_backend *b) {
  return b && strcmp(b->name, "cuda") == 0 ? mf_backend_cuda_expert_gemm(b) : NULL;
}

/* A kernel choice by name ("mma" or `other`) on a cuda backend: `what` names
 * the choice in errors; set is the cuda backend's switch. */
static mf_status set_kernel(mf_backend *b, const char *name, const char *what, const char *other, int mma,
                            int alt, mf_status (*set)(mf_backend *, int)) {
  int which = -1;
  if (name && strcmp(name, "mma") == 0) which = mma;
  if (name && strcmp(name, other) == 0) which = alt;
  if (which < 0)
    return MF_ERR(MF_ERR_INVALID_ARG, "%s '%s': expected mma or %s", what, name ? name : "", other);
  if (!b || strcmp(b->name, "cuda") != 0)
    return MF_ERR(MF_ERR_UNSUPPORTED, "the %s backend has one %s", b ? b->name : "(none)", what);
  return set(b, which);
}

mf_status mf_backend_set_expert_gemm(mf_backend *b, const char *name) {
  return set_kernel(b, name, "expert GEMM kernel", "cutlass", MF_CUDA_EXPERT_GEMM_MMA,
                    MF_CUDA_EXPERT_GEMM_CUTLASS, mf_backend_cuda_set_expert_gemm);
}

mf_status mf_backend_set_attention(mf_backend *b, const char *name) {
  return set_kernel(b, name, "attention kernel", "cudnn", MF_CUDA_ATTENTION_MMA, MF_CUDA_ATTENTION_CUDNN,
                    mf_backend_cuda_set_attention);
}

mf_status mf_backend_set_kernels(mf_backend *b, const char *expert_gemm, const char *attention) {
  if (!b || strcmp(b->name, "cuda") != 0) return MF_OK; /* one kernel of each */
  if (strcmp(expert_gemm, "cuda-core") != 0) MF_CHECK(mf_backend_set_expert_gemm(b, expert_gemm));
  if (strcmp(attention, "cuda-core") != 0) MF_CHECK(mf_backend_set_attention(b, attention));
  return MF_OK;
}
