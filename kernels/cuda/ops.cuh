// The cuda backend's op kernels (nvcc only): one launcher per kernel kind of
// kernels/backend.h, with the semantics of its cpu twin in kernels/cpu/cpu_ops.h
// (the reference), fp32 math (double where the twin uses it) over fp32 or bf16
// storage (below).
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

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "kernels/rope.h"
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

// Storage. Every launcher whose twin takes float weights, activations or their
// gradients is a template over the storage type T: float (F32 storage) or
// mf_bf16 (BF16 storage), both instantiated in the launcher's .cu file. A T
// operand is read widened to fp32 (exact) and written rounded to nearest even
// (mf_st); all arithmetic is fp32 (double where the twin uses it), so a BF16
// call equals its cpu twin run on the same values with round_bf16 — the
// rounding of each stored output — up to the order of fp32 sums. Operands that
// are fp32 whatever the storage (kernels/backend.c's F32 types: gradients of
// weights, rstd, lse, the router's probabilities) stay float.
typedef __nv_bfloat16 mf_bf16;

// ---------------------------------------------------------- elementwise.cu
template <typename T>
mf_status mf_cuda_embed_fwd(const int32_t *ids, int64_t T_, const T *table, int64_t V, int64_t H, T *out,
                            cudaStream_t s);
// scratch: mf_cuda_embed_bwd_scratch_bytes(T_, V) bytes, 4-byte aligned (the
// tokens bucketed by id: 4 * (V + 1 + 2 T_)).
size_t mf_cuda_embed_bwd_scratch_bytes(int64_t T_, int64_t V);
template <typename T>
mf_status mf_cuda_embed_bwd(const int32_t *ids, int64_t T_, const T *dout, int64_t V, int64_t H,
                            float *dtable, int32_t *scratch, cudaStream_t s);
template <typename T>
mf_status mf_cuda_rmsnorm_fwd(const T *x, const T *w, int64_t R, int64_t C, float eps, T *y, float *rstd,
                              cudaStream_t s);
// scratch: mf_cuda_rmsnorm_dw_parts(R) * C floats.
template <typename T>
mf_status mf_cuda_rmsnorm_bwd(const T *dy, const T *x, const T *w, const float *rstd, int64_t R, int64_t C,
                              T *dx, float *dw, int accumulate, float *scratch, cudaStream_t s);
template <typename T>
mf_status mf_cuda_rope_fwd(T *x, int64_t T_, int64_t nh, int64_t D, const int32_t *pos, mf_rope_args a,
                           cudaStream_t s);
template <typename T>
mf_status mf_cuda_rope_bwd(T *dx, int64_t T_, int64_t nh, int64_t D, const int32_t *pos, mf_rope_args a,
                           cudaStream_t s);
template <typename T>
mf_status mf_cuda_swiglu_fwd(const T *g, const T *u, int64_t n, T *act, cudaStream_t s);
template <typename T>
mf_status mf_cuda_swiglu_bwd(const T *g, const T *u, const T *dact, int64_t n, T *dg, T *du, cudaStream_t s);
template <typename T>
mf_status mf_cuda_sigmoid_gate_fwd(const T *gl, const T *x, int64_t R, int64_t C, T *y, cudaStream_t s);
template <typename T>
mf_status mf_cuda_sigmoid_gate_bwd(const T *gl, const T *x, const T *dy, int64_t R, int64_t C, T *dx, T *dgl,
                                   cudaStream_t s);
template <typename T>
mf_status mf_cuda_add(const T *x, int64_t n, T *y, cudaStream_t s);
// Strided column blocks and their transpose (kernels/cpu/slice.c; slice.cu).
template <typename T>
mf_status mf_cuda_slice(const T *x, int64_t R, int64_t C, int64_t xs, int64_t xo, int64_t ys, int64_t yo,
                        int64_t rep, int acc, T *y, cudaStream_t s);
template <typename T>
mf_status mf_cuda_slice_bwd(const T *dy, int64_t Q, int64_t C, int64_t xs, int64_t xo, int64_t ys, int64_t yo,
                            int64_t rep, int acc, T *dx, cudaStream_t s);
template <typename T>
mf_status mf_cuda_scale(T *x, int64_t n, float sc, cudaStream_t s);
// gpt-oss's clamped SwiGLU (kernels/cpu/swiglu_clamp.c; swiglu_clamp.cu).
template <typename T>
mf_status mf_cuda_swiglu_clamp_fwd(const T *g, const T *u, int64_t n, float limit, float alpha, T *act,
                                   cudaStream_t s);
template <typename T>
mf_status mf_cuda_swiglu_clamp_bwd(const T *g, const T *u, const T *dact, int64_t n, float limit, float alpha,
                                   T *dg, T *du, cudaStream_t s);
// A per-expert bias over the expert-sorted rows (kernels/cpu/expert_bias.c;
// expert_bias.cu): offsets on the device; R (the rows of y, at least
// offsets[E]) the forward's bound; db fp32, added.
template <typename T>
mf_status mf_cuda_expert_bias_fwd(const T *bias, const int64_t *offsets, int64_t R, int64_t E, int64_t N, T *y,
                                  cudaStream_t s);
template <typename T>
mf_status mf_cuda_expert_bias_bwd(const T *dy, const int64_t *offsets, int64_t E, int64_t N, float *db,
                                  cudaStream_t s);
template <typename T>
mf_status mf_cuda_dropout(const T *x, int64_t n, uint64_t stream, uint64_t seed, double p, T *y,
                          cudaStream_t s);
template <typename T>
mf_status mf_cuda_dropout_parts(const T *x, int64_t n, uint64_t stream, double p, int64_t row,
                                const int64_t *segments, const int64_t *starts, const int64_t *seeds,
                                int64_t sources, int64_t parts, T *y, cudaStream_t s);

// -------------------------------------------------------------- dequant.cu
template <typename T>
mf_status mf_cuda_dequant(const uint8_t *qw, int64_t kind, int64_t rows, int64_t cols, int64_t blocksize,
                          int64_t nested, T *y, cudaStream_t s);

// -------------------------------------------------------------- routing.cu
// mode 0: softmax then top-k; 1: gpt-oss's top-k then softmax (kernels/cpu/router.c).
template <typename T>
mf_status mf_cuda_router_fwd(const T *logits, int64_t T_, int64_t E, int64_t K, int norm_topk, int mode,
                             float *probs, int32_t *topk_idx, float *topk_w, cudaStream_t s);
template <typename T>
mf_status mf_cuda_router_bwd(const float *probs, const int32_t *topk_idx, const float *topk_w,
                             const T *dtopk_w, const float *dprobs_extra, int64_t T_, int64_t E, int64_t K,
                             int norm_topk, int mode, T *dlogits, cudaStream_t s);
// DeepSeek-V3's sigmoid router (kernels/cpu/router_group.c's maths and orders).
template <typename T>
mf_status mf_cuda_router_group_fwd(const T *logits, const T *bias, int64_t T_, int64_t E, int64_t K,
                                   int64_t n_group, int64_t topk_group, int norm_topk, float scaling, float *scores,
                                   int32_t *topk_idx, float *topk_w, cudaStream_t s);
template <typename T>
mf_status mf_cuda_router_group_bwd(const float *scores, const int32_t *topk_idx, const T *dtopk_w, int64_t T_,
                                   int64_t E, int64_t K, int norm_topk, float scaling, T *dlogits, cudaStream_t s);
mf_status mf_cuda_moe_dispatch(const int32_t *topk_idx, int64_t T, int64_t K, int64_t E, int64_t *counts,
                               int64_t *offsets, int32_t *row_of, int32_t *token_of_row, cudaStream_t s);
template <typename T>
mf_status mf_cuda_moe_gather(const T *x, const int32_t *token_of_row, int64_t R, int64_t H, T *xe,
                             cudaStream_t s);
template <typename T>
mf_status mf_cuda_moe_gather_bwd(const T *dxe, const int32_t *row_of, int64_t T_, int64_t K, int64_t H, T *dx,
                                 int accumulate, cudaStream_t s);
template <typename T>
mf_status mf_cuda_moe_combine(const T *ye, const float *w, const int32_t *row_of, int64_t T_, int64_t K,
                              int64_t H, T *y, cudaStream_t s);
template <typename T>
mf_status mf_cuda_moe_combine_bwd(const T *dy, const T *ye, const float *w, const int32_t *row_of, int64_t T_,
                                  int64_t K, int64_t H, T *dye, T *dw, cudaStream_t s);
mf_status mf_cuda_aux_accumulate(const float *probs, const int32_t *topk_idx, int64_t T, int64_t E, int64_t K,
                                 int64_t *counts, double *psum, cudaStream_t s);
mf_status mf_cuda_aux_value(const int64_t *counts, const double *psum, int64_t E, int64_t n_rows, double *aux,
                            cudaStream_t s);
mf_status mf_cuda_aux_grad(const int64_t *counts, int64_t E, int64_t n_rows, double coef, int64_t T,
                           float *dprobs, cudaStream_t s);

// ------------------------------------------------------------ attention.cu
// Causal GQA attention (kernels/cpu/attention.c's maths): q, dq [B*S, Hq, D];
// k, dk [B*S, Hkv, D]; v, dv [B*S, Hkv, Dv]; o, dout [B*S, Hq, Dv] (Dv, the
// value head dim, 0: D); lse [B, Hq, S] (fp32); Hq % Hkv == 0, D and Dv <= 256
// (MF_ERR_UNSUPPORTED above; also D = 1 for the bf16 backward). window > 0: a
// sliding window (keys i - window < j <= i; 0 none); sinks [Hq] (T, NULL: none):
// gpt-oss's learned logits in every row's denominator, lse includes them.
// Forward writes o and lse. Backward writes dq, dk, dv (never added) and needs
// no scratch; dq must not alias an input; dsinks [Hq] (fp32, NULL: not wanted)
// is added into.
template <typename T>
mf_status mf_cuda_attn_fwd(const T *q, const T *k, const T *v, int64_t B, int64_t S, int64_t Hq, int64_t Hkv,
                           int64_t D, int64_t Dv, int64_t window, const T *sinks, float scale, T *o,
                           float *lse, cudaStream_t s);
template <typename T>
mf_status mf_cuda_attn_bwd(const T *q, const T *k, const T *v, const T *o, const T *dout, const float *lse,
                           int64_t B, int64_t S, int64_t Hq, int64_t Hkv, int64_t D, int64_t Dv,
                           int64_t window, const T *sinks, float scale, T *dq, T *dk, T *dv, float *dsinks,
                           cudaStream_t s);

// ------------------------------------------------------- attention_mma.cu
// Causal GQA attention of BF16 storage on tensor cores (mma.sync), called by
// attention.cu's mf_cuda_attn_*<mf_bf16>: their operands, plus *ran: 1 when
// launched; 0 (MF_OK, nothing launched) for a call the path does not take —
// D not a multiple of 16 or above 128, an operand not 16-byte aligned — which
// the caller then runs on its CUDA-core kernels. The caller checks the shape.
// One head dim for q, k and v, no window and no sinks: attention.cu never
// calls these with Dv != D, a window or sinks.
mf_status mf_cuda_attn_mma_fwd(const mf_bf16 *q, const mf_bf16 *k, const mf_bf16 *v, int64_t B, int64_t S,
                               int64_t Hq, int64_t Hkv, int64_t D, float scale, mf_bf16 *o, float *lse,
                               int *ran, cudaStream_t s);
// Launches 2 and 3 of the backward (dk, dv; dq): dq holds the Di stash of
// launch 1 (attention.cu), which the dq launch reads and overwrites.
mf_status mf_cuda_attn_mma_bwd(const mf_bf16 *q, const mf_bf16 *k, const mf_bf16 *v, const mf_bf16 *dout,
                               const float *lse, int64_t B, int64_t S, int64_t Hq, int64_t Hkv, int64_t D,
                               float scale, mf_bf16 *dq, mf_bf16 *dk, mf_bf16 *dv, int *ran, cudaStream_t s);

// ----------------------------------------------------- gemm.cu, loss.cu
// cuBLASLt state of one backend: a handle, one workspace (GEMMs on different
// streams are serialised on it by an event), and the algorithm cache.
typedef struct mf_cuda_blas mf_cuda_blas;
mf_status mf_cuda_blas_create(int device, size_t workspace_bytes, mf_cuda_blas **out);
void mf_cuda_blas_free(mf_cuda_blas *b);  // NULL is fine; the device must be idle
// Row-major C[M,N] = op(A)[M,K] . op(B)[K,N] (+ C when accumulate) (+ bias[N]):
// op(A) is A [M,K] (lda) or, transA, A stored [K,M]; likewise B. A and B of
// type TA, C and bias of type TC: (float, float) fp32 with TF32 off; (mf_bf16,
// mf_bf16) and (mf_bf16, float) bf16 tensor cores with fp32 compute.
template <typename TA, typename TC>
mf_status mf_cuda_gemm(mf_cuda_blas *b, int transA, int transB, int64_t M, int64_t N, int64_t K, const TA *A,
                       int64_t lda, const TA *B, int64_t ldb, TC *C, int64_t ldc, int accumulate,
                       const TC *bias, cudaStream_t s);
template <typename T>
mf_status mf_cuda_linear_fwd(const T *x, const T *W, const T *bias, int64_t M, int64_t N, int64_t K, T *y,
                             int accumulate, mf_cuda_blas *b, cudaStream_t s);
template <typename T>
mf_status mf_cuda_linear_bwd_data(const T *dy, const T *W, int64_t M, int64_t N, int64_t K, T *dx,
                                  int accumulate, mf_cuda_blas *b, cudaStream_t s);
// dW += dy^T . x; db (may be NULL) += column sums of dy. dW and db are fp32.
template <typename T>
mf_status mf_cuda_linear_bwd_weight(const T *dy, const T *x, int64_t M, int64_t N, int64_t K, float *dW,
                                    float *db, mf_cuda_blas *b, cudaStream_t s);
// Grouped expert GEMMs (one launch each): R = rows of xe / ye (an upper bound on
// offsets[E]), W / dW: E device pointers (host array), NULL for experts without
// rows, or with rows and no weights (a cold expert's LoRA adapter: FWD and
// DATA write its rows as zeros, WGT skips it); E at most MF_CUDA_MAX_EXPERTS
// (backend_cuda.h). dW is fp32.
template <typename T>
mf_status mf_cuda_expert_fwd(const T *xe, const T *const *W, const int64_t *offsets, int64_t R, int64_t E,
                             int64_t N, int64_t Kd, T *ye, cudaStream_t s);
template <typename T>
mf_status mf_cuda_expert_bwd_data(const T *dye, const T *const *W, const int64_t *offsets, int64_t R,
                                  int64_t E, int64_t N, int64_t Kd, T *dxe, cudaStream_t s);
template <typename T>
mf_status mf_cuda_expert_bwd_weight(const T *dye, const T *xe, const int64_t *offsets, int64_t E, int64_t N,
                                    int64_t Kd, float *const *dW, cudaStream_t s);
// MF_K_CROSS_ENTROPY: scalars (device, 2 doubles) = {loss_sum, n_valid}; ws,
// lse and dW fp32.
template <typename T>
mf_status mf_cuda_cross_entropy(const T *h, const T *W, const int32_t *target, int64_t T_, int64_t V,
                                int64_t H, int64_t chunk, float loss_scale, float *ws, float *lse,
                                double *scalars, T *dh, float *dW, mf_cuda_blas *b, cudaStream_t s);

// How many calls of BF16 storage ran on the mma.sync kernels, process-wide
// (every cuda backend's; counted by gemm.cu and attention.cu where the path
// took the call): which: 0 the expert GEMMs, 1 attention.
enum { MF_CUDA_MMA_EXPERT = 0, MF_CUDA_MMA_ATTENTION = 1 };
uint64_t mf_cuda_mma_calls(int which);
void mf_cuda_mma_count(int which);

// ---------------------------------------------------------- expert_mma.cu
// The grouped expert GEMMs of BF16 storage on tensor cores (mma.sync), called by
// gemm.cu's mf_cuda_expert_*<mf_bf16>: the operands and results of
// mf_cuda_expert_*, plus *ran: 1 when launched; 0 (MF_OK, nothing launched)
// for a call the path does not take — N or Kd not a multiple of 8, a
// row-operand or expert pointer not 16-byte aligned, an empty shape, E out of
// range — which the caller then runs on its CUDA-core kernel.
mf_status mf_cuda_expert_mma_fwd(const mf_bf16 *xe, const mf_bf16 *const *W, const int64_t *offsets,
                                 int64_t R, int64_t E, int64_t N, int64_t Kd, mf_bf16 *ye, int *ran,
                                 cudaStream_t s);
mf_status mf_cuda_expert_mma_bwd_data(const mf_bf16 *dye, const mf_bf16 *const *W, const int64_t *offsets,
                                      int64_t R, int64_t E, int64_t N, int64_t Kd, mf_bf16 *dxe, int *ran,
                                      cudaStream_t s);
mf_status mf_cuda_expert_mma_bwd_weight(const mf_bf16 *dye, const mf_bf16 *xe, const int64_t *offsets,
                                        int64_t E, int64_t N, int64_t Kd, float *const *dW, int *ran,
                                        cudaStream_t s);

// ------------------------------------------------------ expert_cutlass.cu
// The same grouped expert GEMMs of BF16 storage on Hopper's wgmma + TMA
// (CUTLASS's sm90 grouped GEMM): the operands of mf_cuda_expert_*, plus the
// kernel scratch (the group arrays and CUTLASS's workspace are written there;
// the backend serialises its users) and *ran, 0 (MF_OK, nothing launched) for
// a call the path does not take: not built with CUTLASS, not an sm_90 device,
// N or Kd not a multiple of 8, a pointer not 16-byte aligned, E out of range,
// too little scratch.
int mf_cuda_expert_cutlass_built(void);
mf_status mf_cuda_expert_cutlass_fwd(const mf_bf16 *xe, const mf_bf16 *const *W, const int64_t *offsets,
                                     int64_t R, int64_t E, int64_t N, int64_t Kd, mf_bf16 *ye, void *scratch,
                                     size_t scratch_bytes, int *ran, cudaStream_t s);
mf_status mf_cuda_expert_cutlass_bwd_data(const mf_bf16 *dye, const mf_bf16 *const *W, const int64_t *offsets,
                                          int64_t R, int64_t E, int64_t N, int64_t Kd, mf_bf16 *dxe,
                                          void *scratch, size_t scratch_bytes, int *ran, cudaStream_t s);
mf_status mf_cuda_expert_cutlass_bwd_weight(const mf_bf16 *dye, const mf_bf16 *xe, const int64_t *offsets,
                                            int64_t E, int64_t N, int64_t Kd, float *const *dW, void *scratch,
                                            size_t scratch_bytes, int *ran, cudaStream_t s);

// ------------------------------------------------------- device helpers
#ifdef __CUDACC__
// A stored element widened to fp32 (exact), and an fp32 value stored: as is,
// or rounded to the nearest even bf16 (NaN stays NaN).
__device__ __forceinline__ float mf_ld(const float *p) {
  return *p;
}
__device__ __forceinline__ float mf_ld(const mf_bf16 *p) {
  return __bfloat162float(*p);
}
__device__ __forceinline__ void mf_st(float *p, float v) {
  *p = v;
}
__device__ __forceinline__ void mf_st(mf_bf16 *p, float v) {
  *p = __float2bfloat16_rn(v);
}
// Elements of T in one 16-byte vector access (4 fp32, 8 bf16).
template <typename T>
struct mf_vec {
  static constexpr int n = 16 / (int)sizeof(T);
};

// Inclusive prefix sum of one int per lane over a warp (every lane of the
// warp calls it): lane i gets v[0] + ... + v[i], in a fixed order.
__device__ __forceinline__ int32_t mf_warp_inclusive_scan(int32_t v) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int d = 1; d < 32; d <<= 1) {
    const int32_t o = __shfl_up_sync(0xffffffffu, v, d);
    if (lane >= d) v += o;
  }
  return v;
}

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
