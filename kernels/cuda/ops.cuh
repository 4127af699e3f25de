// The cuda backend's op kernels (nvcc only): one launcher per kernel kind of
// kernels/backend.h, with the semantics of its cpu twin in kernels/cpu/cpu_ops.h
// (the reference), fp32 storage and fp32 math (double where the twin uses it).
// A launcher is named as its twin, mf_cuda_<name> for mf_cpu_<name> (<name> =
// mf_kernel_name of its kind), and takes the twin's arguments in the twin's
// order, less the twin's trailing mf_kctx, plus its own trailing context: the
// cuBLASLt state or scratch it needs, then the stream.
//
// Every launcher enqueues its work on `s` and returns after the launch (a launch
// error is reported at once as MF_ERR_CUDA; a fault during execution surfaces at
// the next synchronisation). Sizes of 0 launch nothing. Like their cpu twins the
// launchers trust their operands (the program builder checks shapes); the
// backend (backend_cuda.cu) checks that required operands are present.
//
// Determinism: no floating-point atomics. Every output element is written by one
// thread, and every reduction runs in an order fixed by the shapes alone (a
// thread's strided partial sums, then a fixed shared-memory tree), so two runs of
// one call give the same bits whatever the timing.
#ifndef MF_KERNELS_CUDA_OPS_CUH
#define MF_KERNELS_CUDA_OPS_CUH

#include <cuda_runtime.h>
#include <stdint.h>

#include "src/core/core.h"

// Threads per block of every kernel; the reduction trees assume this exact size.
#define MF_CUDA_BLOCK 256

// Blocks for a grid-stride loop over n items (at least 1, at most 2^20).
static inline unsigned mf_cuda_grid(int64_t n) {
  int64_t g = (n + MF_CUDA_BLOCK - 1) / MF_CUDA_BLOCK;
  if (g > (1 << 20)) g = 1 << 20;
  return g > 0 ? (unsigned)g : 1u;
}
// Blocks for a loop with one block per item (rows): at most 2^20.
static inline unsigned mf_cuda_grid_rows(int64_t rows) {
  return rows > (1 << 20) ? (1u << 20) : (rows > 0 ? (unsigned)rows : 1u);
}

// RMSNorm backward's dw partials: row blocks for a call of R rows (shape only),
// and the scratch floats they need (parts * C).
int64_t mf_cuda_rmsnorm_dw_parts(int64_t R);

// ---------------------------------------------------------- elementwise.cu
mf_status mf_cuda_embed_fwd(const int32_t *ids, int64_t T, const float *table, int64_t V, int64_t H,
                            float *out, cudaStream_t s);
mf_status mf_cuda_embed_bwd(const int32_t *ids, int64_t T, const float *dout, int64_t V, int64_t H,
                            float *dtable, cudaStream_t s);
mf_status mf_cuda_rmsnorm_fwd(const float *x, const float *w, int64_t R, int64_t C, float eps, float *y,
                              float *rstd, cudaStream_t s);
// scratch: mf_cuda_rmsnorm_dw_parts(R) * C floats.
mf_status mf_cuda_rmsnorm_bwd(const float *dy, const float *x, const float *w, const float *rstd, int64_t R,
                              int64_t C, float *dx, float *dw, int accumulate, float *scratch,
                              cudaStream_t s);
mf_status mf_cuda_rope_fwd(float *x, int64_t T, int64_t nh, int64_t D, const int32_t *pos, float theta,
                           cudaStream_t s);
mf_status mf_cuda_rope_bwd(float *dx, int64_t T, int64_t nh, int64_t D, const int32_t *pos, float theta,
                           cudaStream_t s);
mf_status mf_cuda_swiglu_fwd(const float *g, const float *u, int64_t n, float *act, cudaStream_t s);
mf_status mf_cuda_swiglu_bwd(const float *g, const float *u, const float *dact, int64_t n, float *dg,
                             float *du, cudaStream_t s);
mf_status mf_cuda_sigmoid_gate_fwd(const float *gl, const float *x, int64_t R, int64_t C, float *y,
                                   cudaStream_t s);
mf_status mf_cuda_sigmoid_gate_bwd(const float *gl, const float *x, const float *dy, int64_t R, int64_t C,
                                   float *dx, float *dgl, cudaStream_t s);
mf_status mf_cuda_add(const float *x, int64_t n, float *y, cudaStream_t s);

// -------------------------------------------------------------- routing.cu
mf_status mf_cuda_router_fwd(const float *logits, int64_t T, int64_t E, int64_t K, int norm_topk,
                             float *probs, int32_t *topk_idx, float *topk_w, cudaStream_t s);
mf_status mf_cuda_router_bwd(const float *probs, const int32_t *topk_idx, const float *topk_w,
                             const float *dtopk_w, const float *dprobs_extra, int64_t T, int64_t E, int64_t K,
                             int norm_topk, float *dlogits, cudaStream_t s);
mf_status mf_cuda_moe_dispatch(const int32_t *topk_idx, int64_t T, int64_t K, int64_t E, int64_t *counts,
                               int64_t *offsets, int32_t *row_of, int32_t *token_of_row, cudaStream_t s);
mf_status mf_cuda_moe_gather(const float *x, const int32_t *token_of_row, int64_t R, int64_t H, float *xe,
                             cudaStream_t s);
mf_status mf_cuda_moe_gather_bwd(const float *dxe, const int32_t *row_of, int64_t T, int64_t K, int64_t H,
                                 float *dx, int accumulate, cudaStream_t s);
mf_status mf_cuda_moe_combine(const float *ye, const float *w, const int32_t *row_of, int64_t T, int64_t K,
                              int64_t H, float *y, cudaStream_t s);
mf_status mf_cuda_moe_combine_bwd(const float *dy, const float *ye, const float *w, const int32_t *row_of,
                                  int64_t T, int64_t K, int64_t H, float *dye, float *dw, cudaStream_t s);
mf_status mf_cuda_aux_accumulate(const float *probs, const int32_t *topk_idx, int64_t T, int64_t E, int64_t K,
                                 int64_t *counts, double *psum, cudaStream_t s);
mf_status mf_cuda_aux_value(const int64_t *counts, const double *psum, int64_t E, int64_t n_rows, double *aux,
                            cudaStream_t s);
mf_status mf_cuda_aux_grad(const int64_t *counts, int64_t E, int64_t n_rows, double coef, int64_t T,
                           float *dprobs, cudaStream_t s);

// ------------------------------------------------------------ attention.cu
// Causal GQA attention (kernels/cpu/attention.c's maths): q, o, dout, dq
// [B*S, Hq, D]; k, v, dk, dv [B*S, Hkv, D]; lse [B, Hq, S]; Hq % Hkv == 0,
// D <= 256 (MF_ERR_UNSUPPORTED above). Forward writes o and lse. Backward writes
// dq, dk, dv (never added) with three launches and no scratch: it stashes
// do.o per row in dq before overwriting it, so dq must not alias an input.
mf_status mf_cuda_attn_fwd(const float *q, const float *k, const float *v, int64_t B, int64_t S, int64_t Hq,
                           int64_t Hkv, int64_t D, float scale, float *o, float *lse, cudaStream_t s);
mf_status mf_cuda_attn_bwd(const float *q, const float *k, const float *v, const float *o, const float *dout,
                           const float *lse, int64_t B, int64_t S, int64_t Hq, int64_t Hkv, int64_t D,
                           float scale, float *dq, float *dk, float *dv, cudaStream_t s);

// ----------------------------------------------------- gemm.cu, loss.cu
// cuBLASLt state of one backend: a handle, one workspace (GEMMs on different
// streams are serialised on it by an event), and the algorithm cache.
typedef struct mf_cuda_blas mf_cuda_blas;
mf_status mf_cuda_blas_create(int device, size_t workspace_bytes, mf_cuda_blas **out);
void mf_cuda_blas_free(mf_cuda_blas *b);  // NULL is fine; the device must be idle
// Row-major C[M,N] = op(A)[M,K] . op(B)[K,N] (+ C when accumulate) (+ bias[N]):
// op(A) is A [M,K] (lda) or, transA, A stored [K,M]; likewise B. fp32, TF32 off.
mf_status mf_cuda_gemm(mf_cuda_blas *b, int transA, int transB, int64_t M, int64_t N, int64_t K,
                       const float *A, int64_t lda, const float *B, int64_t ldb, float *C, int64_t ldc,
                       int accumulate, const float *bias, cudaStream_t s);
mf_status mf_cuda_linear_fwd(const float *x, const float *W, const float *bias, int64_t M, int64_t N,
                             int64_t K, float *y, int accumulate, mf_cuda_blas *b, cudaStream_t s);
mf_status mf_cuda_linear_bwd_data(const float *dy, const float *W, int64_t M, int64_t N, int64_t K, float *dx,
                                  int accumulate, mf_cuda_blas *b, cudaStream_t s);
// dW += dy^T . x; db (may be NULL) += column sums of dy.
mf_status mf_cuda_linear_bwd_weight(const float *dy, const float *x, int64_t M, int64_t N, int64_t K,
                                    float *dW, float *db, mf_cuda_blas *b, cudaStream_t s);
// Grouped expert GEMMs (one launch each): R = rows of xe / ye (an upper bound on
// offsets[E]), W / dW: E device pointers (host array), NULL for experts without
// rows; E at most MF_CUDA_MAX_EXPERTS (backend_cuda.h).
mf_status mf_cuda_expert_fwd(const float *xe, const float *const *W, const int64_t *offsets, int64_t R,
                             int64_t E, int64_t N, int64_t Kd, float *ye, cudaStream_t s);
mf_status mf_cuda_expert_bwd_data(const float *dye, const float *const *W, const int64_t *offsets, int64_t R,
                                  int64_t E, int64_t N, int64_t Kd, float *dxe, cudaStream_t s);
mf_status mf_cuda_expert_bwd_weight(const float *dye, const float *xe, const int64_t *offsets, int64_t E,
                                    int64_t N, int64_t Kd, float *const *dW, cudaStream_t s);
// MF_K_CROSS_ENTROPY: scalars (device, 2 doubles) = {loss_sum, n_valid}.
mf_status mf_cuda_cross_entropy(const float *h, const float *W, const int32_t *target, int64_t T, int64_t V,
                                int64_t H, int64_t chunk, float loss_scale, float *ws, float *lse,
                                double *scalars, float *dh, float *dW, mf_cuda_blas *b, cudaStream_t s);
// ------------------------------------------------------- device helpers
#ifdef __CUDACC__
// Sum of one value per thread over a block of exactly MF_CUDA_BLOCK threads, in
// a fixed tree; every thread gets the result. sh: MF_CUDA_BLOCK elements of
// shared memory. All threads of the block must call it.
template <typename T>
__device__ __forceinline__ T mf_block_sum(T v, T *sh) {
  sh[threadIdx.x] = v;
  __syncthreads();
  for (int w = MF_CUDA_BLOCK / 2; w > 0; w >>= 1) {
    if ((int)threadIdx.x < w) sh[threadIdx.x] += sh[threadIdx.x + w];
    __syncthreads();
  }
  T r = sh[0];
  __syncthreads();
  return r;
}
#endif

#endif  // MF_KERNELS_CUDA_OPS_CUH
