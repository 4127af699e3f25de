/*
 * Backends by name: the one place outside a backend's own folder that knows
 * which backends exist. Library code creates a backend, and learns what it
 * keeps on the device beside the arena, through this header and
 * kernels/backend.h only — nothing outside kernels/ includes kernels/cpu or
 * kernels/cuda headers (tests/arch checks it).
 *
 *   "cpu"   the reference backend: its "device" is host memory, it keeps
 *           nothing beside the arena, and its kernels compute fp32 storage
 *           and, as the twin of cuda's, BF16 storage (widened, computed
 *           with round_bf16, narrowed);
 *   "cuda"  one GPU: beside the arena it keeps the cuBLASLt workspace, the
 *           kernels' scratch and the CUDA context (an estimate until measured
 *           on the GPU), all allocated when it is created;
 *   "auto"  cuda when this build has it and a GPU is visible, else cpu.
 *
 * The memory a backend keeps is known without creating it (mf_backend_memory
 * asks no GPU unless `ask_device`), so `moefit plan` can plan a cuda run on a
 * machine without a GPU, and `moefit train` plans before it creates the
 * backend: the plan it writes is the one `moefit plan` shows.
 */
#ifndef MF_KERNELS_REGISTRY_H
#define MF_KERNELS_REGISTRY_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/backend.h"
#include "src/core/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What a backend is created with; each backend reads its own fields. */
typedef struct mf_backend_params {
  /* cpu */
  mf_threadpool *pool; /* runs the kernels (NULL: one thread) */
  int round_bf16;      /* store activations rounded to bf16 precision */
  int checking;        /* the checking mode (kernels/backend.h) */
  mf_status (*optim)(const mf_kernel_call *call, mf_threadpool *pool); /* GRAD_SUMSQ, ADAMW */
  mf_cpu_streams streams;
  /* cuda */
  int device;             /* CUDA device ordinal */
  uint64_t scratch_bytes; /* the kernels' scratch, at least the default (mf_backend_attention_scratch); 0:
                             default */
} mf_backend_params;

/* The device memory a backend keeps beside its arena, and the device. */
typedef struct mf_backend_memory {
  char name[16];             /* the backend: "cpu" or "cuda" (auto resolved) */
  uint64_t workspace_bytes;  /* library workspaces (cuBLASLt) */
  uint64_t scratch_bytes;    /* the kernels' scratch */
  uint64_t
      attn_scratch_bytes;    /* of it, beside the default: cuDNN attention's workspace (mf_backend_params) */
  uint64_t context_bytes;    /* the CUDA context and the kernels' module images (an estimate); 0 once the
                                device was asked: the context then exists, outside its free memory */
  uint64_t total_bytes;      /* the sum: what the device budget loses before the arena */
  /* The device, when asked and present (ask_device on a machine with the GPU). */
  int device_known;
  uint64_t device_free_bytes, device_total_bytes;
  char device_name[128];
} mf_backend_memory;

/* The CUDA context's device memory before the arena, as budgeted: an estimate
 * (not yet measured on a GPU) covering the primary context with lazy module
 * loading and the cuBLAS handle. */
#define MF_CUDA_CONTEXT_RESERVE ((uint64_t)512 << 20)

/* "cpu" or "cuda" for `name` ("auto", "cpu" or "cuda"): auto is cuda when this
 * build has it and a GPU is visible. An unknown name: MF_ERR_INVALID_ARG. */
mf_status mf_backend_resolve(const char *name, const char **out);

/* What backend `name` keeps on the device beside its arena (p may be NULL:
 * defaults). With ask_device and a GPU present, also the device's free and
 * total memory (creating its context); without a GPU device_known stays 0 and
 * that is not an error. */
mf_status mf_backend_query_memory(const char *name, const mf_backend_params *p, int ask_device,
                                  mf_backend_memory *out);

/* Creates backend `name` (auto resolved). No GPU for cuda: MF_ERR_NO_DEVICE;
 * a build without CUDA: MF_ERR_UNSUPPORTED. *out is NULL on failure. */
mf_status mf_backend_create(const char *name, const mf_backend_params *p, mf_backend **out);

/* The CUDA devices this process sees (0: none, or built without CUDA). */
int mf_backend_device_count(void);

/* The kernel scratch backend `name` ("cpu" or "cuda") is to be created with
 * for a training step whose attention is B sequences of S tokens, Hq query
 * and Hkv key/value heads of D, in `storage`: on cuda with BF16 storage and
 * attention on cuDNN (cudnn 1), the
 * default plus cuDNN's attention backward's workspace (an upper bound); else
 * 0 (the default; also in a build without CUDA). Asks no GPU. */
uint64_t mf_backend_attention_scratch(const char *name, mf_dtype storage, int cudnn, int64_t B, int64_t S,
                                      int64_t Hq, int64_t Hkv, int64_t D);

/* The kernels a backend runs BF16 storage's attention on, in words ("mma.sync",
 * the default, or "cudnn": mf_backend_set_attention); NULL
 * for a backend with one kernel only (cpu). */
const char *mf_backend_attention(const mf_backend *b);

/* Switches it: "mma" or "cudnn" (cuda only). Where cuDNN cannot be loaded
 * (cpu; no libcudnn.so.9; a build without its frontend's headers):
 * MF_ERR_UNSUPPORTED saying why, the kernels unchanged. */
mf_status mf_backend_set_attention(mf_backend *b, const char *name);

/* The kernel a backend runs BF16 storage's grouped expert GEMMs on, in words
 * (cuda: "mma.sync", the default, or "cutlass sm90 (wgmma + TMA)":
 * mf_backend_set_expert_gemm); NULL for a
 * backend with one kernel only (cpu). */
const char *mf_backend_expert_gemm(const mf_backend *b);

/* Switches it: "mma" or "cutlass" (cuda only). Where that kernel is not
 * available (cpu; a build without CUTLASS's headers; not an sm_90 GPU):
 * MF_ERR_UNSUPPORTED saying why, the kernel unchanged. */
mf_status mf_backend_set_expert_gemm(mf_backend *b, const char *name);

/* Both, by the words a run plan records (planner/run_plan.h mf_run_kernels):
 * on cuda "mma" or "cutlass", "mma" or "cudnn" ("cuda-core": fp32 storage,
 * nothing to set); nothing on another backend. The first that cannot run
 * here is the error, as above. */
mf_status mf_backend_set_kernels(mf_backend *b, const char *expert_gemm, const char *attention);

#ifdef __cplusplus
}
#endif

#endif /* MF_KERNELS_REGISTRY_H */
