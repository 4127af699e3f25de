/*
 * The cuda backend: kernels/backend.h filled with CUDA runtime calls.
 *
 *   arena_create  one cudaMalloc of exactly the bytes asked, once per backend
 *   host_alloc    pinned host memory (cudaHostAlloc, portable), host_free frees it
 *   streams       cudaStreamNonBlocking streams; events without timing, except
 *                 event_create_timed's (cudaEventElapsedTime gives busy time)
 *   host_fn       cudaLaunchHostFunc; event_query cudaEventQuery
 *   copy          cudaMemcpyAsync of the given kind on the given stream
 *   run           the kernels of kernels/cuda/ops.cuh, launched on the stream,
 *                 after the checks of mf_kernel_call_check (kernels/backend.h:
 *                 a kind of the operand table, required operands present)
 *
 * Nothing is allocated on the device after mf_backend_cuda_create except the
 * one arena: kernel scratch (opts.scratch_bytes) and the cuBLASLt handle and
 * workspace (opts.gemm_workspace_bytes) are allocated at create. The dense
 * GEMMs (LINEAR_*, the LM head of CROSS_ENTROPY) run through cuBLASLt in fp32
 * with TF32 off; the expert GEMMs are a grouped kernel of ours (gemm.cu).
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
#include <stdint.h>

#include "kernels/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mf_cuda_backend_opts {
  int device;           /* CUDA device ordinal (0 = the first visible GPU) */
  size_t scratch_bytes; /* device scratch for the kernels' partial sums; 0 = MF_CUDA_SCRATCH_DEFAULT */
  /* cuBLASLt workspace (split-K partials), allocated at create; 0 = MF_CUDA_GEMM_WORKSPACE_DEFAULT */
  size_t gemm_workspace_bytes;
  int expert_gemm; /* MF_CUDA_EXPERT_GEMM_*: the kernel of BF16 storage's grouped expert GEMMs */
  int attention;   /* MF_CUDA_ATTENTION_*: the kernels of BF16 storage's attention */
} mf_cuda_backend_opts;

/* Which kernel runs the grouped expert GEMMs of BF16 storage (fp32 storage
 * always runs gemm.cu's CUDA-core kernel). */
enum {
  /* mma, the kernel measured on a GPU (a run sets its plan's choice:
   * planner/run_plan.h mf_run_plan_kernels) */
  MF_CUDA_EXPERT_GEMM_AUTO = 0,
  /* expert_mma.cu: mma.sync tiles (sm_80 and later) */
  MF_CUDA_EXPERT_GEMM_MMA = 1,
  /* expert_cutlass.cu: CUTLASS's sm90 grouped GEMM on wgmma + TMA (an sm_90
   * device and a build with CUTLASS); a call it does not take runs on mma */
  MF_CUDA_EXPERT_GEMM_CUTLASS = 2,
};

/* Which kernels run BF16 storage's causal attention (fp32 storage always runs
 * attention.cu's CUDA-core kernels). */
enum {
  /* mma, as for the expert GEMM */
  MF_CUDA_ATTENTION_AUTO = 0,
  /* attention_mma.cu: mma.sync flash kernels (D a multiple of 16 up to 128;
   * attention.cu's CUDA-core kernels for other D) */
  MF_CUDA_ATTENTION_MMA = 1,
  /* cuDNN's fused flash kernels through its graph API (attention_cudnn.h:
   * cuDNN 9 loaded at run time, the deterministic backward, its workspace in
   * the kernel scratch); a shape it does not take runs as MMA */
  MF_CUDA_ATTENTION_CUDNN = 2,
};

/* 32 MiB: what cuBLASLt's heuristics ask for the largest fp32 split-K problems. */
#define MF_CUDA_GEMM_WORKSPACE_DEFAULT ((size_t)32 << 20)

/* 16 MiB: RMSNorm's dw partials (at most 32 row blocks x C floats) for C up to 131072. */
#define MF_CUDA_SCRATCH_DEFAULT ((size_t)16 << 20)

/* The most experts an EXPERT_* call may have (their weight pointers travel as
 * one kernel parameter); more: MF_ERR_UNSUPPORTED. */
#define MF_CUDA_MAX_EXPERTS 1024

/* opts may be NULL (device 0, default scratch). *out is NULL on failure. */
mf_status mf_backend_cuda_create(const mf_cuda_backend_opts *opts, mf_backend **out);

/* Switches a cuda backend's expert GEMM kernel (MF_CUDA_EXPERT_GEMM_MMA or
 * _CUTLASS; AUTO is MMA). CUTLASS where it is not
 * available (not built with it: tools/setup installs its headers; or not an
 * sm_90 device): MF_ERR_UNSUPPORTED saying why, the kernel unchanged. Not
 * while the backend runs kernels on another thread. */
mf_status mf_backend_cuda_set_expert_gemm(mf_backend *b, int which);

/* The kernel a cuda backend runs BF16 expert GEMMs on, in words ("mma.sync",
 * "cutlass sm90 wgmma"); NULL for a backend that is not cuda. */
const char *mf_backend_cuda_expert_gemm(const mf_backend *b);

/* How many expert GEMM calls a cuda backend ran on the cutlass kernel (the
 * others ran on mma.sync or the CUDA-core kernel); 0 for other backends. */
uint64_t mf_backend_cuda_cutlass_calls(const mf_backend *b);

/* Switches a cuda backend's attention kernels (MF_CUDA_ATTENTION_MMA or
 * _CUDNN; AUTO is MMA). cuDNN where it cannot be loaded (no
 * libcudnn.so.9, older than 9, a build without its frontend's headers):
 * MF_ERR_UNSUPPORTED saying why, the kernels unchanged. The backward's
 * workspace comes from the kernel scratch: size it with
 * mf_cuda_attn_cudnn_workspace_bound (a shape whose workspace does not fit runs
 * on mma, with a warning). Not while the backend runs kernels on another
 * thread. */
mf_status mf_backend_cuda_set_attention(mf_backend *b, int which);

/* "cudnn" or "mma.sync"; NULL for a backend that is not cuda. */
const char *mf_backend_cuda_attention(const mf_backend *b);

/* How many attention calls a cuda backend ran on cuDNN; 0 for other backends. */
uint64_t mf_backend_cuda_cudnn_calls(const mf_backend *b);

/* How many BF16 calls ran on the mma.sync kernels in this process (every cuda
 * backend's): which 0 the expert GEMMs, 1 attention; the calls no kernel of
 * the choice took ran on the CUDA-core ones. 0 in a build without CUDA. */
uint64_t mf_backend_cuda_mma_calls(int which);

/* The kernel scratch cuDNN's attention backward of this shape may ask for
 * (attention_cudnn.h; an upper bound), 0 for B, S or D <= 0. Computed without
 * a GPU or cuDNN. */
uint64_t mf_cuda_attn_cudnn_workspace_bound(int64_t B, int64_t S, int64_t Hq, int64_t Hkv, int64_t D);

/* ------------------------------------------------- optimizer kernels
 * Device twins of src/optim, callable from C; the backend's run() runs
 * MF_K_GRAD_SUMSQ through mf_cuda_grad_chunk_sumsq and MF_K_ADAMW through
 * mf_cuda_adamw_update_scaled (kernels/backend.h has their operands).
 * Launched on `stream` (a cudaStream_t; NULL = the default stream); buffers
 * are device memory; a launch error is reported at once (MF_ERR_CUDA). */

/* One AdamW step's hyper-parameters (src/optim/optim.h mf_adamw_hparams, plus
 * the step t >= 1). */
typedef struct mf_cuda_adamw_step {
  double lr, beta1, beta2, eps, weight_decay;
  int64_t step;
} mf_cuda_adamw_step;

/* mf_adamw_update_bufs on the device: the same element arithmetic and the same
 * bits (optim.h). grad is bf16 (uint16_t) when grad_bf16, else fp32; m and v are
 * bf16 when moment_bf16, else fp32; bf16_out (NULL or n elements) receives the
 * new param rounded to bf16 (nearest even, NaN kept). Same argument checks as
 * the host update (MF_ERR_INVALID_ARG, nothing launched). */
mf_status mf_cuda_adamw_update(const mf_cuda_adamw_step *h, float *param, const void *grad, int grad_bf16,
                               void *m, void *v, int moment_bf16, uint16_t *bf16_out, size_t n, void *stream);

/* Clipping, then the update, in one pass over an fp32 gradient (MF_K_ADAMW):
 * when coef < 1, every gradient element is first multiplied by (float)coef and
 * stored back (mf_optim_grad_scale: one fp32 multiply, the same bits, a NaN
 * quieted as x86 does even where (float)coef is 1), and the update reads the
 * scaled value; the result is mf_optim_grad_scale followed by
 * mf_cuda_adamw_update, bit for bit. coef >= 1 or NaN: no scaling, grad only
 * read (mf_cuda_adamw_update). bf16_out (NULL or n elements) receives the new
 * param rounded to bf16: BF16 storage's working copy, param being the fp32
 * master. Same argument checks as mf_cuda_adamw_update, made before anything is
 * launched. */
mf_status mf_cuda_adamw_update_scaled(const mf_cuda_adamw_step *h, float *param, float *grad, double coef,
                                      void *m, void *v, int moment_bf16, uint16_t *bf16_out, size_t n,
                                      void *stream);

/* Elements per chunk of the gradient norm: src/optim's MF_OPTIM_NORM_CHUNK. */
#define MF_CUDA_NORM_CHUNK ((size_t)65536)

/* sums[k] (device, ceil(n / MF_CUDA_NORM_CHUNK) doubles) = the sum of squares of
 * chunk k of g, bit for bit as mf_optim_grad_chunk_sumsq computes it: adding the
 * copied-back sums on the host in chunk order (mf_optim_grad_chunk_sumsq's
 * contract) gives mf_optim_grad_norm's bits. */
mf_status mf_cuda_grad_chunk_sumsq(const float *g, size_t n, double *sums, void *stream);

#ifdef __cplusplus
}
#endif

#endif /* MF_KERNELS_CUDA_BACKEND_CUDA_H */
