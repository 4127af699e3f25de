// Dense GEMMs through cuBLASLt and the grouped expert GEMM (kernels/cuda/ops.cuh),
// over fp32 or bf16 storage.
//
// Dense (LINEAR_FWD / BWD_DATA / BWD_WEIGHT, and the LM head's GEMMs in
// loss.cu): row-major C[M,N] = op(A)[M,K] . op(B)[K,N] (+ beta C) (+ bias[N]),
// run as the column-major product C^T = op(B)^T . op(A)^T, so no operand is
// copied or transposed. mf_cuda_gemm<TA, TC>: A and B of type TA, C (= D) and
// bias of type TC, always CUBLAS_COMPUTE_32F with an fp32 scale type:
//   <float, float>      fp32 FMA with TF32 off (the compute type without _FAST_TF32);
//   <mf_bf16, mf_bf16>  bf16 tensor cores: bf16 products are exact in fp32 and summed
//                       in fp32; without bias and beta, AB is rounded to bf16
//                       once, when D is stored; with either, cuBLASLt on an
//                       H100 (CUDA 13, measured 2026-11-27) behaves as if it
//                       rounded AB to bf16 first and again after adding them:
//                       two roundings where the cpu twin has one
//                       (tests/cuda/bf16_gemm_test.cc);
//   <mf_bf16, float>    the same products into fp32 C / D (weight gradients, logits).
// The accumulate flags are beta = 1 (beta = 0 never reads C). The bias is
// cuBLASLt's BIAS epilogue, whose vector has D's type (cublasLt.h,
// CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE), so TC for all three pairs: no kernel of
// ours adds it. LINEAR_FWD / BWD_DATA<T> are <T, T>; LINEAR_BWD_WEIGHT<T> is
// <T, float> with beta = 1 (dW is an fp32 sum), and db += the column sums of
// the T dy in fp32 (dbias_kernel: a fixed row split and a fixed tree, no
// atomics).
//
// Algorithm choice: cublasLtMatmulAlgoGetHeuristic once per (shape, layout,
// types, epilogue, operand alignment) key, cached in a fixed table of
// GEMM_CACHE entries (round-robin replacement), so a shape always runs the same
// algorithm — its split of K and reduction scheme included — and the step
// allocates nothing: descriptors are the stack-initialised ("Init") kind. The
// heuristic may use no more workspace than the one allocated at create (the
// budget's). Split-K is allowed only with reductions of a fixed order whose
// partial sums are fp32: NONE, COMPUTE_TYPE (fp32 partials in the workspace,
// reduced in a separate step) and, for fp32 output only, OUTPUT_TYPE. Left out:
// INPLACE (parts added into the output itself in the output type, ordered by
// counters in the workspace: sequential by its documentation, but it writes
// partial sums into C while beta = 1 reads it), and OUTPUT_TYPE for bf16
// output (each part rounded to bf16: more roundings than the one of D). cuBLAS
// documents run-to-run bit-wise reproducibility on one GPU model for
// cublasLtMatmul with the caller's workspace, as here; the tests check it (two
// runs, two streams, and a bf16 contraction of 65536 where the heuristic splits
// K).
//
// One cuBLASLt workspace per backend: GEMMs on different streams are
// serialised on it by an event under a mutex (as the kernel scratch is).
//
// Expert GEMMs (EXPERT_FWD / BWD_DATA / BWD_WEIGHT): cuBLAS's grouped GEMM
// (cublasGemmGroupedBatchedEx, present in the installed cuBLAS 13.1) takes the
// groups' m/n/k as host arrays, but the rows per expert exist only on the
// device (`offsets`, written by MOE_DISPATCH on the stream): using it would need
// a device-to-host copy and a stream synchronisation per call. So this is our
// own tiled grouped kernel, one launch per call: each block finds its (expert,
// row tile) from `offsets` on the device; experts with no rows get no block and
// their weight pointers (which may be NULL) are never read; an expert with rows
// and no weights (NULL: a cold expert's LoRA adapter) gets zero rows. The expert weight
// pointers travel as a kernel parameter (up to MF_CUDA_MAX_EXPERTS of them:
// CUDA >= 12.1 allows 32 KiB of parameters on sm_70+), so nothing is staged.
// T operands are widened to fp32 as the shared-memory tiles are loaded (CUDA
// cores, fp32 FMA), T outputs stored with mf_st (one rounding), dW fp32. This
// is the kernel of fp32 storage; BF16 storage runs on tensor cores
// (expert_mma.cu: mma.sync, fp32 accumulators, the same tile enumeration)
// whenever N and Kd are multiples of 8 and its pointers 16-byte aligned, and
// on this kernel otherwise.
// Every output element is one dot product summed sequentially (fma) over the
// contraction index in order, from 0 (from the old dW for BWD_WEIGHT, which is
// added) — deterministic and independent of the tiling.
#include <cublasLt.h>
#include <cuda_runtime.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#include <type_traits>

#include "kernels/cuda/backend_cuda.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/ops.cuh"

#define GEMM_CACHE 64

typedef struct gemm_key {
  int64_t m, n, k, lda, ldb, ldc; /* the column-major problem */
  int opa, opb, bias, beta1;
  int align;             /* min alignment in bytes of A, B, C (and bias), capped at 256 */
  cudaDataType_t ta, tc; /* of A and B; of C, D and bias */
} gemm_key;

// One row-major GEMM of mf_cuda_gemm, its operands untyped: A and B of type
// ta, C and bias of type tc.
typedef struct gemm_call {
  int transA, transB;
  int64_t M, N, K;
  const void *A, *B, *bias;
  int64_t lda, ldb, ldc;
  void *C;
  int accumulate;
  cudaDataType_t ta, tc;
} gemm_call;

// cuBLASLt's data type of a storage type.
template <typename T>
constexpr cudaDataType_t lt_type();
template <>
constexpr cudaDataType_t lt_type<float>() {
  return CUDA_R_32F;
}
template <>
constexpr cudaDataType_t lt_type<mf_bf16>() {
  return CUDA_R_16BF;
}

static const char *type_name(cudaDataType_t t) {
  return t == CUDA_R_16BF ? "bf16" : "fp32";
}
static int type_bytes(cudaDataType_t t) {
  return t == CUDA_R_16BF ? 2 : 4;
}

typedef struct gemm_entry {
  int used;
  gemm_key key;
  cublasLtMatmulAlgo_t algo;
} gemm_entry;

struct mf_cuda_blas {
  int device;
  cublasLtHandle_t lt;
  void *workspace;
  size_t workspace_bytes;
  cudaEvent_t ws_done; /* recorded after the last GEMM that used the workspace */
  int have_event;
  pthread_mutex_t lock; /* the workspace order and the cache */
  gemm_entry cache[GEMM_CACHE];
  int next_victim;
};

// A cuBLAS status as an mf_status: out of memory, unsupported and invalid
// arguments keep their meaning; the rest (execution failures, internal errors,
// architecture mismatches) are MF_ERR_CUDA. Messages carry the status name.
static mf_status status_of(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_SUCCESS:
      return MF_OK;
    case CUBLAS_STATUS_ALLOC_FAILED:
      return MF_ERR_OUT_OF_MEMORY;
    case CUBLAS_STATUS_NOT_SUPPORTED:
    case CUBLAS_STATUS_ARCH_MISMATCH:
      return MF_ERR_UNSUPPORTED;
    case CUBLAS_STATUS_INVALID_VALUE:
      return MF_ERR_INVALID_ARG;
    default:
      return MF_ERR_CUDA;
  }
}

#define LT_CHECK(call)                                                                       \
  do {                                                                                       \
    cublasStatus_t mf_s_ = (call);                                                           \
    if (mf_s_ != CUBLAS_STATUS_SUCCESS)                                                      \
      return mf_error_set(status_of(mf_s_), __FILE__, __LINE__, "%s failed: %s (%d)", #call, \
                          cublasLtGetStatusName(mf_s_), (int)mf_s_);                         \
  } while (0)

mf_status mf_cuda_blas_create(int device, size_t workspace_bytes, mf_cuda_blas **out) {
  *out = NULL;
  mf_cuda_blas *b = (mf_cuda_blas *)calloc(1, sizeof *b);
  if (!b) return MF_ERR(MF_ERR_OUT_OF_MEMORY, "cuBLASLt setup: out of host memory");
  b->device = device;
  pthread_mutex_init(&b->lock, NULL);
  mf_status st = MF_OK;
  cublasStatus_t s = cublasLtCreate(&b->lt);
  if (s != CUBLAS_STATUS_SUCCESS) {
    b->lt = NULL;
    st = MF_ERR(status_of(s), "cuBLASLt setup on device %d: cublasLtCreate failed: %s (%d)", device,
                cublasLtGetStatusName(s), (int)s);
  }
  if (st == MF_OK && workspace_bytes) {
    cudaError_t e = cudaMalloc(&b->workspace, workspace_bytes);
    if (e != cudaSuccess) {
      cudaGetLastError();
      b->workspace = NULL;
      st = MF_ERR(MF_ERR_CUDA,
                  "cuBLASLt setup on device %d: cudaMalloc of a %zu-byte workspace failed: %s (%s)", device,
                  workspace_bytes, cudaGetErrorString(e), cudaGetErrorName(e));
    } else {
      b->workspace_bytes = workspace_bytes;
    }
  }
  if (st == MF_OK) {
    cudaError_t e = cudaEventCreateWithFlags(&b->ws_done, cudaEventDisableTiming);
    if (e != cudaSuccess) {
      cudaGetLastError();
      st = MF_ERR(MF_ERR_CUDA, "cuBLASLt setup on device %d: cudaEventCreate failed: %s", device,
                  cudaGetErrorString(e));
    } else {
      b->have_event = 1;
    }
  }
  if (st != MF_OK) {
    mf_cuda_blas_free(b);
    return st;
  }
  *out = b;
  return MF_OK;
}

void mf_cuda_blas_free(mf_cuda_blas *b) {
  if (!b) return;
  if (b->workspace) cudaFree(b->workspace);
  if (b->have_event) cudaEventDestroy(b->ws_done);
  if (b->lt) cublasLtDestroy(b->lt);
  pthread_mutex_destroy(&b->lock);
  free(b);
}

// The alignment in bytes of p, from 256 down to its element's size `floor`.
static int align_of(const void *p, int floor) {
  uintptr_t u = (uintptr_t)p;
  int a = 256;
  while (a > floor && (u & (uintptr_t)(a - 1))) a >>= 1;
  return a;
}

static int key_eq(const gemm_key *a, const gemm_key *b) {
  return memcmp(a, b, sizeof *a) == 0;
}

// The cached algorithm for `key`, or a new heuristic pick (called with b->lock held).
static mf_status pick_algo(mf_cuda_blas *b, const gemm_key *key, cublasLtMatmulDesc_t desc,
                           cublasLtMatrixLayout_t la, cublasLtMatrixLayout_t lb, cublasLtMatrixLayout_t lc,
                           cublasLtMatmulAlgo_t *algo) {
  for (int i = 0; i < GEMM_CACHE; i++)
    if (b->cache[i].used && key_eq(&b->cache[i].key, key)) {
      *algo = b->cache[i].algo;
      return MF_OK;
    }
  cublasLtMatmulPreferenceOpaque_t pref_mem;
  cublasLtMatmulPreference_t pref = &pref_mem;
  LT_CHECK(cublasLtMatmulPreferenceInit(pref));
  uint64_t ws = b->workspace_bytes;
  LT_CHECK(
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
  // Split-K only with fp32 partials reduced in a fixed order (the header).
  uint32_t schemes = CUBLASLT_REDUCTION_SCHEME_NONE | CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
  if (key->tc == CUDA_R_32F) schemes |= CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE;
  LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &schemes,
                                                sizeof schemes));
  uint32_t al = (uint32_t)key->align;
  LT_CHECK(
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al, sizeof al));
  LT_CHECK(
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al, sizeof al));
  LT_CHECK(
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al, sizeof al));
  LT_CHECK(
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al, sizeof al));
  cublasLtMatmulHeuristicResult_t res;
  int found = 0;
  LT_CHECK(cublasLtMatmulAlgoGetHeuristic(b->lt, desc, la, lb, lc, lc, pref, 1, &res, &found));
  if (found < 1 || res.state != CUBLAS_STATUS_SUCCESS)
    return MF_ERR(MF_ERR_UNSUPPORTED,
                  "cuBLASLt has no %s x %s -> %s algorithm for m=%lld n=%lld k=%lld (ops %c%c, alignment %d "
                  "bytes, workspace %zu bytes)",
                  type_name(key->ta), type_name(key->ta), type_name(key->tc), (long long)key->m,
                  (long long)key->n, (long long)key->k, key->opa ? 'T' : 'N', key->opb ? 'T' : 'N',
                  key->align, b->workspace_bytes);
  gemm_entry *e = &b->cache[b->next_victim];
  b->next_victim = (b->next_victim + 1) % GEMM_CACHE;
  e->used = 1;
  e->key = *key;
  e->algo = res.algo;
  *algo = res.algo;
  return MF_OK;
}

// C = beta * C (beta 0: written 0) plus bias[col]: the GEMM with an empty contraction.
template <typename TC>
__global__ void empty_k_kernel(TC *C, int64_t M, int64_t N, int64_t ldc, int keep, const TC *bias) {
  const int64_t n = M * N;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t r = i / N, c = i % N;
    float v = 0.0f;
    if (bias) v += mf_ld(bias + c);
    if (keep) v = mf_ld(C + r * ldc + c) + v;
    mf_st(C + r * ldc + c, v);
  }
}

static mf_status gemm_locked(mf_cuda_blas *b, const gemm_call *g, cudaStream_t s) {
  // Column-major: C^T[N, M] = opB(B)^T [N, K] . opA(A)^T [K, M]; matrix "a" is B, "b" is A.
  const int64_t M = g->M, N = g->N, K = g->K;
  gemm_key key;
  memset(&key, 0, sizeof key);
  key.m = N, key.n = M, key.k = K;
  key.lda = g->ldb, key.ldb = g->lda, key.ldc = g->ldc;
  key.opa = g->transB ? 1 : 0;
  key.opb = g->transA ? 1 : 0;
  key.bias = g->bias != NULL;
  key.beta1 = g->accumulate != 0;
  key.ta = g->ta, key.tc = g->tc;
  const int ea = type_bytes(g->ta), ec = type_bytes(g->tc);
  int al = align_of(g->A, ea);
  if (align_of(g->B, ea) < al) al = align_of(g->B, ea);
  if (align_of(g->C, ec) < al) al = align_of(g->C, ec);
  if (g->bias && align_of(g->bias, ec) < al) al = align_of(g->bias, ec);
  key.align = al;

  cublasLtMatmulDescOpaque_t desc_mem;
  cublasLtMatmulDesc_t desc = &desc_mem;
  LT_CHECK(cublasLtMatmulDescInit(desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  cublasOperation_t opa = key.opa ? CUBLAS_OP_T : CUBLAS_OP_N, opb = key.opb ? CUBLAS_OP_T : CUBLAS_OP_N;
  LT_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa));
  LT_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb));
  if (g->bias) {
    cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
    int32_t bt = (int32_t)g->tc;  // D's type, as cuBLASLt's default would be
    LT_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
    LT_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof bt));
    LT_CHECK(
        cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g->bias, sizeof g->bias));
  }
  // Stored shapes (rows x cols, column-major) of the two operands.
  cublasLtMatrixLayoutOpaque_t la_mem, lb_mem, lc_mem;
  cublasLtMatrixLayout_t la = &la_mem, lb = &lb_mem, lc = &lc_mem;
  LT_CHECK(cublasLtMatrixLayoutInit(la, g->ta, key.opa ? K : N, key.opa ? N : K, g->ldb));
  LT_CHECK(cublasLtMatrixLayoutInit(lb, g->ta, key.opb ? M : K, key.opb ? K : M, g->lda));
  LT_CHECK(cublasLtMatrixLayoutInit(lc, g->tc, N, M, g->ldc));
  cublasLtMatmulAlgo_t algo;
  MF_CHECK(pick_algo(b, &key, desc, la, lb, lc, &algo));
  const float alpha = 1.0f, beta = g->accumulate ? 1.0f : 0.0f;
  MF_CUDA_CHECK(cudaStreamWaitEvent(s, b->ws_done, 0));
  LT_CHECK(cublasLtMatmul(b->lt, desc, &alpha, g->B, la, g->A, lb, &beta, g->C, lc, g->C, lc, &algo,
                          b->workspace, b->workspace_bytes, s));
  MF_CUDA_CHECK(cudaEventRecord(b->ws_done, s));
  return MF_OK;
}

static mf_status gemm_run(mf_cuda_blas *b, const gemm_call *g, cudaStream_t s) {
  if (!b) return MF_ERR(MF_ERR_INTERNAL, "cuda gemm: the backend has no cuBLASLt handle");
  pthread_mutex_lock(&b->lock);
  mf_status st = gemm_locked(b, g, s);
  pthread_mutex_unlock(&b->lock);
  if (st != MF_OK)
    mf_error_prefix("cuBLASLt GEMM %lldx%lldx%lld (op %c%c, %s -> %s)", (long long)g->M, (long long)g->N,
                    (long long)g->K, g->transA ? 'T' : 'N', g->transB ? 'T' : 'N', type_name(g->ta),
                    type_name(g->tc));
  return st;
}

template <typename TA, typename TC>
mf_status mf_cuda_gemm(mf_cuda_blas *b, int transA, int transB, int64_t M, int64_t N, int64_t K, const TA *A,
                       int64_t lda, const TA *B, int64_t ldb, TC *C, int64_t ldc, int accumulate,
                       const TC *bias, cudaStream_t s) {
  if (M <= 0 || N <= 0) return MF_OK;
  if (K <= 0) {
    empty_k_kernel<TC><<<mf_cuda_grid(M * N), MF_CUDA_BLOCK, 0, s>>>(C, M, N, ldc, accumulate, bias);
    MF_CUDA_CHECK_LAUNCH();
    return MF_OK;
  }
  gemm_call g;
  g.transA = transA, g.transB = transB, g.M = M, g.N = N, g.K = K;
  g.A = A, g.B = B, g.bias = bias, g.lda = lda, g.ldb = ldb, g.ldc = ldc, g.C = C;
  g.accumulate = accumulate, g.ta = lt_type<TA>(), g.tc = lt_type<TC>();
  return gemm_run(b, &g, s);
}

// db[c] += sum over rows r (in a fixed split) of dy[r, c], in fp32: blocks of
// 32 columns x 8 row slices; slice j sums rows j, j+8, ... in order, then the 8
// slice sums are added in a fixed tree.
template <typename T>
__global__ void dbias_kernel(const T *dy, int64_t M, int64_t N, float *db) {
  __shared__ float sh[8][33];
  const int cx = threadIdx.x & 31, sl = threadIdx.x >> 5;
  const int64_t c = blockIdx.x * (int64_t)32 + cx;
  float acc = 0.0f;
  if (c < N)
    for (int64_t r = sl; r < M; r += 8) acc += mf_ld(dy + r * N + c);
  sh[sl][cx] = acc;
  __syncthreads();
  if (sl == 0 && c < N) {
    const float s = ((sh[0][cx] + sh[1][cx]) + (sh[2][cx] + sh[3][cx])) +
                    ((sh[4][cx] + sh[5][cx]) + (sh[6][cx] + sh[7][cx]));
    db[c] += s;
  }
}

template <typename T>
mf_status mf_cuda_linear_fwd(const T *x, const T *W, const T *bias, int64_t M, int64_t N, int64_t K, T *y,
                             int accumulate, mf_cuda_blas *b, cudaStream_t s) {
  return mf_cuda_gemm<T, T>(b, 0, 1, M, N, K, x, K, W, K, y, N, accumulate, bias, s);
}

template <typename T>
mf_status mf_cuda_linear_bwd_data(const T *dy, const T *W, int64_t M, int64_t N, int64_t K, T *dx,
                                  int accumulate, mf_cuda_blas *b, cudaStream_t s) {
  return mf_cuda_gemm<T, T>(b, 0, 0, M, K, N, dy, N, W, K, dx, K, accumulate, (const T *)NULL, s);
}

template <typename T>
mf_status mf_cuda_linear_bwd_weight(const T *dy, const T *x, int64_t M, int64_t N, int64_t K, float *dW,
                                    float *db, mf_cuda_blas *b, cudaStream_t s) {
  MF_CHECK((mf_cuda_gemm<T, float>(b, 1, 0, N, K, M, dy, N, x, K, dW, K, 1, (const float *)NULL, s)));
  if (db && N > 0) {
    dbias_kernel<T><<<(unsigned)((N + 31) / 32), MF_CUDA_BLOCK, 0, s>>>(dy, M, N, db);
    MF_CUDA_CHECK_LAUNCH();
  }
  return MF_OK;
}

// ------------------------------------------------------- grouped expert GEMM

enum { EBM = 64, EBN = 64, EBK = 16 };

template <typename P>
struct expert_ptrs {
  const P *p[MF_CUDA_MAX_EXPERTS];
};

// The three products, as C[m, n] = sum_k A(m, k) B(k, n) per expert:
//   FWD:  A = xe rows (contiguous in k), B(k,n) = W[n*Kd + k] (contiguous in k)
//   DATA: A = dye rows (contiguous in k), B(k,n) = W[k*Kd + n] (contiguous in n)
//   WGT:  A(m,k) = dye[(r0+k)*N + m] (contiguous in m), B(k,n) = xe[(r0+k)*Kd + n]
enum { KIND_FWD = 0, KIND_DATA = 1, KIND_WGT = 2 };

// One 64x64 tile of C: acc[i][j] for row ty + 16 i, column tx + 16 j. A(m, k) =
// A[m*sam + k*sak] (m < Mt, k < Kt), B(k, n) = B[k*sbk + n*sbn] (n < Nt), of
// storage T, widened to fp32 into the shared tiles.
// A_K_CONTIG / B_K_CONTIG: which index is contiguous, for coalesced tile loads.
template <bool A_K_CONTIG, bool B_K_CONTIG, typename T>
__device__ __forceinline__ void tile_mma(const T *A, int64_t sam, int64_t sak, int64_t Mt, const T *B,
                                         int64_t sbk, int64_t sbn, int64_t Nt, int64_t Kt, float acc[4][4]) {
  __shared__ float As[EBK][EBM + 1];
  __shared__ float Bs[EBK][EBN + 1];
  const int tid = threadIdx.x, tx = tid & 15, ty = tid >> 4;
  for (int64_t k0 = 0; k0 < Kt; k0 += EBK) {
#pragma unroll
    for (int q = 0; q < (EBM * EBK) / MF_CUDA_BLOCK; q++) {
      const int e = tid + q * MF_CUDA_BLOCK;
      const int kk = A_K_CONTIG ? e % EBK : e / EBM, mm = A_K_CONTIG ? e / EBK : e % EBM;
      const int64_t k = k0 + kk;
      As[kk][mm] = (mm < Mt && k < Kt) ? mf_ld(A + mm * sam + k * sak) : 0.0f;
    }
#pragma unroll
    for (int q = 0; q < (EBN * EBK) / MF_CUDA_BLOCK; q++) {
      const int e = tid + q * MF_CUDA_BLOCK;
      const int kk = B_K_CONTIG ? e % EBK : e / EBN, nn = B_K_CONTIG ? e / EBK : e % EBN;
      const int64_t k = k0 + kk;
      Bs[kk][nn] = (nn < Nt && k < Kt) ? mf_ld(B + k * sbk + nn * sbn) : 0.0f;
    }
    __syncthreads();
    const int kn = Kt - k0 < EBK ? (int)(Kt - k0) : EBK;
    for (int kk = 0; kk < kn; kk++) {
      float a[4], bv[4];
#pragma unroll
      for (int i = 0; i < 4; i++) a[i] = As[kk][ty + 16 * i];
#pragma unroll
      for (int j = 0; j < 4; j++) bv[j] = Bs[kk][tx + 16 * j];
#pragma unroll
      for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 4; j++) acc[i][j] = fmaf(a[i], bv[j], acc[i][j]);
    }
    __syncthreads();
  }
}

// FWD / DATA: blockIdx.x enumerates (expert, row tile) over the experts with
// rows, in expert order; blockIdx.y the column tile. In: the row width Kin,
// out: the row width Nout.
template <int KIND, typename T>
__global__ void __launch_bounds__(MF_CUDA_BLOCK)
    expert_rows_kernel(const T *in, const int64_t *offsets, int64_t E, int64_t Kin, int64_t Nout,
                       const expert_ptrs<T> W, T *out) {
  __shared__ int64_t s_e, s_r0, s_rows;
  if (threadIdx.x == 0) {
    int64_t t = blockIdx.x;
    s_e = -1;
    for (int64_t e = 0; e < E; e++) {
      const int64_t r0 = offsets[e], cnt = offsets[e + 1] - r0;
      const int64_t nt = cnt > 0 ? (cnt + EBM - 1) / EBM : 0;
      if (t < nt) {
        s_e = e;
        s_r0 = r0 + t * EBM;
        s_rows = cnt - t * EBM < EBM ? cnt - t * EBM : EBM;
        break;
      }
      t -= nt;
    }
  }
  __syncthreads();
  const int64_t e = s_e;
  if (e < 0) return;  // past the last tile
  const int64_t r0 = s_r0, rows = s_rows, n0 = blockIdx.y * (int64_t)EBN;
  const int64_t cols = Nout - n0 < EBN ? Nout - n0 : EBN;
  const int tx = threadIdx.x & 15, ty = threadIdx.x >> 4;
  const T *w = W.p[e];
  if (!w) {  // rows but no weights (a cold expert's LoRA adapter): zeros
    for (int i = 0; i < 4; i++)
      for (int j = 0; j < 4; j++)
        if (ty + 16 * i < rows && tx + 16 * j < cols)
          mf_st(out + (r0 + ty + 16 * i) * Nout + n0 + tx + 16 * j, 0.0f);
    return;
  }
  float acc[4][4];
#pragma unroll
  for (int i = 0; i < 4; i++)
#pragma unroll
    for (int j = 0; j < 4; j++) acc[i][j] = 0.0f;
  if (KIND == KIND_FWD)  // B(k, n) = W[(n0+n)*Kin + k]
    tile_mma<true, true>(in + r0 * Kin, Kin, 1, rows, w + n0 * Kin, 1, Kin, cols, Kin, acc);
  else  // DATA: B(k, n) = W[k*Nout + n0 + n]
    tile_mma<true, false>(in + r0 * Kin, Kin, 1, rows, w + n0, Nout, 1, cols, Kin, acc);
#pragma unroll
  for (int i = 0; i < 4; i++)
#pragma unroll
    for (int j = 0; j < 4; j++)
      if (ty + 16 * i < rows && tx + 16 * j < cols)
        mf_st(out + (r0 + ty + 16 * i) * Nout + n0 + tx + 16 * j, acc[i][j]);
}

// WGT: dW[e][n, k] += sum over the expert's rows r (in order) dye[r, n] xe[r, k],
// dW fp32. blockIdx.x = e * n_tiles + n tile, blockIdx.y = k tile.
template <typename T>
__global__ void __launch_bounds__(MF_CUDA_BLOCK)
    expert_wgt_kernel(const T *dye, const T *xe, const int64_t *offsets, int64_t N, int64_t Kd,
                      int64_t n_tiles, const expert_ptrs<float> dW) {
  const int64_t e = blockIdx.x / n_tiles, n0 = (blockIdx.x % n_tiles) * (int64_t)EBM;
  const int64_t k0 = blockIdx.y * (int64_t)EBN;
  const int64_t r0 = offsets[e], cnt = offsets[e + 1] - r0;
  float *w = (float *)dW.p[e];
  if (cnt <= 0 || !w) return;
  const int64_t rows = N - n0 < EBM ? N - n0 : EBM, cols = Kd - k0 < EBN ? Kd - k0 : EBN;
  const int tx = threadIdx.x & 15, ty = threadIdx.x >> 4;
  float acc[4][4];
#pragma unroll
  for (int i = 0; i < 4; i++)
#pragma unroll
    for (int j = 0; j < 4; j++)
      acc[i][j] =
          (ty + 16 * i < rows && tx + 16 * j < cols) ? w[(n0 + ty + 16 * i) * Kd + k0 + tx + 16 * j] : 0.0f;
  tile_mma<false, false>(dye + r0 * N + n0, 1, N, rows, xe + r0 * Kd + k0, Kd, 1, cols, cnt, acc);
#pragma unroll
  for (int i = 0; i < 4; i++)
#pragma unroll
    for (int j = 0; j < 4; j++)
      if (ty + 16 * i < rows && tx + 16 * j < cols) w[(n0 + ty + 16 * i) * Kd + k0 + tx + 16 * j] = acc[i][j];
}

template <typename P>
static mf_status expert_args(int64_t E, const P *const *experts, expert_ptrs<P> *p) {
  if (E <= 0) return MF_OK;
  if (E > MF_CUDA_MAX_EXPERTS)
    return MF_ERR(MF_ERR_UNSUPPORTED, "cuda expert GEMM: %lld experts; at most %d", (long long)E,
                  MF_CUDA_MAX_EXPERTS);
  if (!experts) return MF_ERR(MF_ERR_INVALID_ARG, "cuda expert GEMM: no expert weight list");
  memset(p, 0, sizeof *p);
  for (int64_t e = 0; e < E; e++) p->p[e] = experts[e];
  return MF_OK;
}

template <typename T>
static mf_status expert_rows(int kind, const T *in, const int64_t *offsets, int64_t R, int64_t E, int64_t Kin,
                             int64_t Nout, const T *const *experts, T *out, cudaStream_t s) {
  if (R <= 0 || E <= 0 || Nout <= 0) return MF_OK;
  expert_ptrs<T> p;
  MF_CHECK(expert_args(E, experts, &p));
  const int64_t row_tiles = (R + EBM - 1) / EBM + E, col_tiles = (Nout + EBN - 1) / EBN;
  if (row_tiles > INT32_MAX || col_tiles > 65535)
    return MF_ERR(MF_ERR_UNSUPPORTED, "cuda expert GEMM: %lld rows x %lld columns is too large a grid",
                  (long long)R, (long long)Nout);
  if (Kin <= 0) {  // empty contraction: the output rows are 0
    MF_CUDA_CHECK(cudaMemsetAsync(out, 0, (size_t)R * (size_t)Nout * sizeof(T), s));  // 0 in fp32 and bf16
    return MF_OK;
  }
  dim3 grid((unsigned)row_tiles, (unsigned)col_tiles);
  if (kind == KIND_FWD)
    expert_rows_kernel<KIND_FWD, T><<<grid, MF_CUDA_BLOCK, 0, s>>>(in, offsets, E, Kin, Nout, p, out);
  else
    expert_rows_kernel<KIND_DATA, T><<<grid, MF_CUDA_BLOCK, 0, s>>>(in, offsets, E, Kin, Nout, p, out);
  MF_CUDA_CHECK_LAUNCH();
  return MF_OK;
}

static uint64_t mma_calls[2];  // MF_CUDA_MMA_EXPERT, MF_CUDA_MMA_ATTENTION

void mf_cuda_mma_count(int which) {
  __atomic_add_fetch(&mma_calls[which & 1], 1, __ATOMIC_RELAXED);
}

uint64_t mf_cuda_mma_calls(int which) {
  return __atomic_load_n(&mma_calls[which & 1], __ATOMIC_RELAXED);
}

// BF16 storage runs on tensor cores (expert_mma.cu) where its alignment allows;
// fp32 storage, and the bf16 calls it does not take, on the kernels above.
template <typename T>
mf_status mf_cuda_expert_fwd(const T *xe, const T *const *W, const int64_t *offsets, int64_t R, int64_t E,
                             int64_t N, int64_t Kd, T *ye, cudaStream_t s) {
  if constexpr (std::is_same<T, mf_bf16>::value) {
    int ran = 0;
    MF_CHECK(mf_cuda_expert_mma_fwd(xe, W, offsets, R, E, N, Kd, ye, &ran, s));
    if (ran) {
      mf_cuda_mma_count(MF_CUDA_MMA_EXPERT);
      return MF_OK;
    }
  }
  return expert_rows<T>(KIND_FWD, xe, offsets, R, E, Kd, N, W, ye, s);
}

template <typename T>
mf_status mf_cuda_expert_bwd_data(const T *dye, const T *const *W, const int64_t *offsets, int64_t R,
                                  int64_t E, int64_t N, int64_t Kd, T *dxe, cudaStream_t s) {
  if constexpr (std::is_same<T, mf_bf16>::value) {
    int ran = 0;
    MF_CHECK(mf_cuda_expert_mma_bwd_data(dye, W, offsets, R, E, N, Kd, dxe, &ran, s));
    if (ran) {
      mf_cuda_mma_count(MF_CUDA_MMA_EXPERT);
      return MF_OK;
    }
  }
  return expert_rows<T>(KIND_DATA, dye, offsets, R, E, N, Kd, W, dxe, s);
}

template <typename T>
mf_status mf_cuda_expert_bwd_weight(const T *dye, const T *xe, const int64_t *offsets, int64_t E, int64_t N,
                                    int64_t Kd, float *const *dW, cudaStream_t s) {
  if constexpr (std::is_same<T, mf_bf16>::value) {
    int ran = 0;
    MF_CHECK(mf_cuda_expert_mma_bwd_weight(dye, xe, offsets, E, N, Kd, dW, &ran, s));
    if (ran) {
      mf_cuda_mma_count(MF_CUDA_MMA_EXPERT);
      return MF_OK;
    }
  }
  if (E <= 0 || N <= 0 || Kd <= 0) return MF_OK;
  expert_ptrs<float> p;
  MF_CHECK(expert_args<float>(E, (const float *const *)dW, &p));
  const int64_t n_tiles = (N + EBM - 1) / EBM, k_tiles = (Kd + EBN - 1) / EBN;
  if (E * n_tiles > INT32_MAX || k_tiles > 65535)
    return MF_ERR(MF_ERR_UNSUPPORTED, "cuda expert GEMM: dW of %lld x %lld is too large a grid", (long long)N,
                  (long long)Kd);
  dim3 grid((unsigned)(E * n_tiles), (unsigned)k_tiles);
  expert_wgt_kernel<T><<<grid, MF_CUDA_BLOCK, 0, s>>>(dye, xe, offsets, N, Kd, n_tiles, p);
  MF_CUDA_CHECK_LAUNCH();
  return MF_OK;
}

// ------------------------------------------------------- instantiations

template mf_status mf_cuda_gemm<float, float>(mf_cuda_blas *, int, int, int64_t, int64_t, int64_t,
                                              const float *, int64_t, const float *, int64_t, float *,
                                              int64_t, int, const float *, cudaStream_t);
template mf_status mf_cuda_gemm<mf_bf16, mf_bf16>(mf_cuda_blas *, int, int, int64_t, int64_t, int64_t,
                                                  const mf_bf16 *, int64_t, const mf_bf16 *, int64_t,
                                                  mf_bf16 *, int64_t, int, const mf_bf16 *, cudaStream_t);
template mf_status mf_cuda_gemm<mf_bf16, float>(mf_cuda_blas *, int, int, int64_t, int64_t, int64_t,
                                                const mf_bf16 *, int64_t, const mf_bf16 *, int64_t, float *,
                                                int64_t, int, const float *, cudaStream_t);

// The launchers of one storage type T.
#define GEMM_LAUNCHERS(T)                                                                                   \
  template mf_status mf_cuda_linear_fwd<T>(const T *, const T *, const T *, int64_t, int64_t, int64_t, T *, \
                                           int, mf_cuda_blas *, cudaStream_t);                              \
  template mf_status mf_cuda_linear_bwd_data<T>(const T *, const T *, int64_t, int64_t, int64_t, T *, int,  \
                                                mf_cuda_blas *, cudaStream_t);                              \
  template mf_status mf_cuda_linear_bwd_weight<T>(const T *, const T *, int64_t, int64_t, int64_t, float *, \
                                                  float *, mf_cuda_blas *, cudaStream_t);                   \
  template mf_status mf_cuda_expert_fwd<T>(const T *, const T *const *, const int64_t *, int64_t, int64_t,  \
                                           int64_t, int64_t, T *, cudaStream_t);                            \
  template mf_status mf_cuda_expert_bwd_data<T>(const T *, const T *const *, const int64_t *, int64_t,      \
                                                int64_t, int64_t, int64_t, T *, cudaStream_t);              \
  template mf_status mf_cuda_expert_bwd_weight<T>(const T *, const T *, const int64_t *, int64_t, int64_t,  \
                                                  int64_t, float *const *, cudaStream_t);
GEMM_LAUNCHERS(float)
GEMM_LAUNCHERS(mf_bf16)
