// Dense GEMMs through cuBLASLt and the grouped expert GEMM (kernels/cuda/ops.cuh).
//
// Dense (LINEAR_FWD / BWD_DATA / BWD_WEIGHT, and the LM head's GEMMs in
// loss.cu): row-major C[M,N] = op(A)[M,K] . op(B)[K,N] (+ beta C) (+ bias[N]),
// run as the column-major product C^T = op(B)^T . op(A)^T, so no operand is
// copied or transposed. fp32 storage, CUBLAS_COMPUTE_32F (TF32 off), scale type
// fp32. The accumulate flags are beta = 1 (beta = 0 never reads C). The bias is
// cuBLASLt's BIAS epilogue; dbias is a kernel of ours (dbias_kernel: a fixed
// row split and a fixed shared-memory tree, no atomics).
//
// Algorithm choice: cublasLtMatmulAlgoGetHeuristic once per (shape, layout,
// epilogue, operand alignment) key, cached in a fixed table of GEMM_CACHE
// entries (round-robin replacement), so a shape always runs the same algorithm
// and the step allocates nothing: descriptors are the stack-initialised
// ("Init") kind. Reduction schemes are limited to NONE, COMPUTE_TYPE and
// OUTPUT_TYPE (split-K through the workspace, reduced in a fixed order). The
// INPLACE scheme (partial products added into the output, ordered by counters
// in the workspace) is documented as deterministic too, but is left out to be
// safe: it is the one that writes partial sums into C while beta = 1 reads it.
// So a call's result does not depend on timing (never checked on a GPU here:
// the tests check it, two runs and two streams).
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
// their weight pointers (which may be NULL) are never read. The expert weight
// pointers travel as a kernel parameter (up to MF_CUDA_MAX_EXPERTS of them:
// CUDA >= 12.1 allows 32 KiB of parameters on sm_70+), so nothing is staged.
// Every output element is one dot product summed sequentially (fma) over the
// contraction index in order, from 0 (from the old dW for BWD_WEIGHT, which is
// added) — deterministic and independent of the tiling.
#include <cublasLt.h>
#include <cuda_runtime.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#include "kernels/cuda/backend_cuda.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/ops.cuh"

#define GEMM_CACHE 64

typedef struct gemm_key {
  int64_t m, n, k, lda, ldb, ldc; /* the column-major problem */
  int opa, opb, bias, beta1;
  int align; /* min alignment in bytes of A, B, C (and bias), capped at 256 */
} gemm_key;

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

static int align_of(const void *p) {
  uintptr_t u = (uintptr_t)p;
  int a = 256;
  while (a > 4 && (u & (uintptr_t)(a - 1))) a >>= 1;
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
  uint32_t schemes = CUBLASLT_REDUCTION_SCHEME_NONE | CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE |
                     CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE;
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
                  "cuBLASLt has no fp32 algorithm for m=%lld n=%lld k=%lld (ops %c%c, alignment %d bytes, "
                  "workspace %zu bytes)",
                  (long long)key->m, (long long)key->n, (long long)key->k, key->opa ? 'T' : 'N',
                  key->opb ? 'T' : 'N', key->align, b->workspace_bytes);
  gemm_entry *e = &b->cache[b->next_victim];
  b->next_victim = (b->next_victim + 1) % GEMM_CACHE;
  e->used = 1;
  e->key = *key;
  e->algo = res.algo;
  *algo = res.algo;
  return MF_OK;
}

// C = beta * C (beta 0: written 0) plus bias[col]: the GEMM with an empty contraction.
__global__ void empty_k_kernel(float *C, int64_t M, int64_t N, int64_t ldc, int keep, const float *bias) {
  const int64_t n = M * N;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t r = i / N, c = i % N;
    float v = 0.0f;
    if (bias) v += bias[c];
    if (keep) v = C[r * ldc + c] + v;
    C[r * ldc + c] = v;
  }
}

static mf_status gemm_locked(mf_cuda_blas *b, int transA, int transB, int64_t M, int64_t N, int64_t K,
                             const float *A, int64_t lda, const float *B, int64_t ldb, float *C, int64_t ldc,
                             int accumulate, const float *bias, cudaStream_t s) {
  // Column-major: C^T[N, M] = opB(B)^T [N, K] . opA(A)^T [K, M]; matrix "a" is B, "b" is A.
  gemm_key key;
  memset(&key, 0, sizeof key);
  key.m = N, key.n = M, key.k = K;
  key.lda = ldb, key.ldb = lda, key.ldc = ldc;
  key.opa = transB ? 1 : 0;
  key.opb = transA ? 1 : 0;
  key.bias = bias != NULL;
  key.beta1 = accumulate != 0;
  int al = align_of(A);
  if (align_of(B) < al) al = align_of(B);
  if (align_of(C) < al) al = align_of(C);
  if (bias && align_of(bias) < al) al = align_of(bias);
  key.align = al;

  cublasLtMatmulDescOpaque_t desc_mem;
  cublasLtMatmulDesc_t desc = &desc_mem;
  LT_CHECK(cublasLtMatmulDescInit(desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  cublasOperation_t opa = key.opa ? CUBLAS_OP_T : CUBLAS_OP_N, opb = key.opb ? CUBLAS_OP_T : CUBLAS_OP_N;
  LT_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa));
  LT_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb));
  if (bias) {
    cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
    cudaDataType_t bt = CUDA_R_32F;
    LT_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
    LT_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof bt));
    LT_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
  }
  // Stored shapes (rows x cols, column-major) of the two operands.
  cublasLtMatrixLayoutOpaque_t la_mem, lb_mem, lc_mem;
  cublasLtMatrixLayout_t la = &la_mem, lb = &lb_mem, lc = &lc_mem;
  LT_CHECK(cublasLtMatrixLayoutInit(la, CUDA_R_32F, key.opa ? K : N, key.opa ? N : K, ldb));
  LT_CHECK(cublasLtMatrixLayoutInit(lb, CUDA_R_32F, key.opb ? M : K, key.opb ? K : M, lda));
  LT_CHECK(cublasLtMatrixLayoutInit(lc, CUDA_R_32F, N, M, ldc));
  cublasLtMatmulAlgo_t algo;
  MF_CHECK(pick_algo(b, &key, desc, la, lb, lc, &algo));
  const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
  MF_CUDA_CHECK(cudaStreamWaitEvent(s, b->ws_done, 0));
  LT_CHECK(cublasLtMatmul(b->lt, desc, &alpha, B, la, A, lb, &beta, C, lc, C, lc, &algo, b->workspace,
                          b->workspace_bytes, s));
  MF_CUDA_CHECK(cudaEventRecord(b->ws_done, s));
  return MF_OK;
}

mf_status mf_cuda_gemm(mf_cuda_blas *b, int transA, int transB, int64_t M, int64_t N, int64_t K,
                       const float *A, int64_t lda, const float *B, int64_t ldb, float *C, int64_t ldc,
                       int accumulate, const float *bias, cudaStream_t s) {
  if (M <= 0 || N <= 0) return MF_OK;
  if (K <= 0) {
    empty_k_kernel<<<mf_cuda_grid(M * N), MF_CUDA_BLOCK, 0, s>>>(C, M, N, ldc, accumulate, bias);
    MF_CUDA_CHECK_LAUNCH();
    return MF_OK;
  }
  if (!b) return MF_ERR(MF_ERR_INTERNAL, "cuda gemm: the backend has no cuBLASLt handle");
  pthread_mutex_lock(&b->lock);
  mf_status st = gemm_locked(b, transA, transB, M, N, K, A, lda, B, ldb, C, ldc, accumulate, bias, s);
  pthread_mutex_unlock(&b->lock);
  if (st != MF_OK)
    mf_error_prefix("cuBLASLt GEMM %lldx%lldx%lld (op %c%c)", (long long)M, (long long)N, (long long)K,
                    transA ? 'T' : 'N', transB ? 'T' : 'N');
  return st;
}

// db[c] += sum over rows r (in a fixed split) of dy[r, c]: blocks of 32 columns x
// 8 row slices; slice j sums rows j, j+8, ... in order, then the 8 slice sums
// are added in a fixed tree.
__global__ void dbias_kernel(const float *dy, int64_t M, int64_t N, float *db) {
  __shared__ float sh[8][33];
  const int cx = threadIdx.x & 31, sl = threadIdx.x >> 5;
  const int64_t c = blockIdx.x * (int64_t)32 + cx;
  float acc = 0.0f;
  if (c < N)
    for (int64_t r = sl; r < M; r += 8) acc += dy[r * N + c];
  sh[sl][cx] = acc;
  __syncthreads();
  if (sl == 0 && c < N) {
    const float s = ((sh[0][cx] + sh[1][cx]) + (sh[2][cx] + sh[3][cx])) +
                    ((sh[4][cx] + sh[5][cx]) + (sh[6][cx] + sh[7][cx]));
    db[c] += s;
  }
}

mf_status mf_cuda_linear_fwd(const float *x, const float *W, const float *bias, int64_t M, int64_t N,
                             int64_t K, float *y, int accumulate, mf_cuda_blas *b, cudaStream_t s) {
  return mf_cuda_gemm(b, 0, 1, M, N, K, x, K, W, K, y, N, accumulate, bias, s);
}

mf_status mf_cuda_linear_bwd_data(const float *dy, const float *W, int64_t M, int64_t N, int64_t K, float *dx,
                                  int accumulate, mf_cuda_blas *b, cudaStream_t s) {
  return mf_cuda_gemm(b, 0, 0, M, K, N, dy, N, W, K, dx, K, accumulate, NULL, s);
}

mf_status mf_cuda_linear_bwd_weight(const float *dy, const float *x, int64_t M, int64_t N, int64_t K,
                                    float *dW, float *db, mf_cuda_blas *b, cudaStream_t s) {
  MF_CHECK(mf_cuda_gemm(b, 1, 0, N, K, M, dy, N, x, K, dW, K, 1, NULL, s));
  if (db && N > 0) {
    dbias_kernel<<<(unsigned)((N + 31) / 32), MF_CUDA_BLOCK, 0, s>>>(dy, M, N, db);
    MF_CUDA_CHECK_LAUNCH();
  }
  return MF_OK;
}

// ------------------------------------------------------- grouped expert GEMM

enum { EBM = 64, EBN = 64, EBK = 16 };

typedef struct expert_ptrs {
  const float *p[MF_CUDA_MAX_EXPERTS];
} expert_ptrs;

// The three products, as C[m, n] = sum_k A(m, k) B(k, n) per expert:
//   FWD:  A = xe rows (contiguous in k), B(k,n) = W[n*Kd + k] (contiguous in k)
//   DATA: A = dye rows (contiguous in k), B(k,n) = W[k*Kd + n] (contiguous in n)
//   WGT:  A(m,k) = dye[(r0+k)*N + m] (contiguous in m), B(k,n) = xe[(r0+k)*Kd + n]
enum { KIND_FWD = 0, KIND_DATA = 1, KIND_WGT = 2 };

// One 64x64 tile of C: acc[i][j] for row ty + 16 i, column tx + 16 j. A(m, k) =
// A[m*sam + k*sak] (m < Mt, k < Kt), B(k, n) = B[k*sbk + n*sbn] (n < Nt).
// A_K_CONTIG / B_K_CONTIG: which index is contiguous, for coalesced tile loads.
template <bool A_K_CONTIG, bool B_K_CONTIG>
__device__ __forceinline__ void tile_mma(const float *A, int64_t sam, int64_t sak, int64_t Mt, const float *B,
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
      As[kk][mm] = (mm < Mt && k < Kt) ? A[mm * sam + k * sak] : 0.0f;
    }
#pragma unroll
    for (int q = 0; q < (EBN * EBK) / MF_CUDA_BLOCK; q++) {
      const int e = tid + q * MF_CUDA_BLOCK;
      const int kk = B_K_CONTIG ? e % EBK : e / EBN, nn = B_K_CONTIG ? e / EBK : e % EBN;
      const int64_t k = k0 + kk;
      Bs[kk][nn] = (nn < Nt && k < Kt) ? B[k * sbk + nn * sbn] : 0.0f;
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
template <int KIND>
__global__ void __launch_bounds__(MF_CUDA_BLOCK)
    expert_rows_kernel(const float *in, const int64_t *offsets, int64_t E, int64_t Kin, int64_t Nout,
                       const expert_ptrs W, float *out) {
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
  const float *w = W.p[e];
  if (!w) {  // an expert with rows but no weights: a caller bug, made loud
    for (int i = 0; i < 4; i++)
      for (int j = 0; j < 4; j++)
        if (ty + 16 * i < rows && tx + 16 * j < cols)
          out[(r0 + ty + 16 * i) * Nout + n0 + tx + 16 * j] = __int_as_float(0x7fc00000);
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
        out[(r0 + ty + 16 * i) * Nout + n0 + tx + 16 * j] = acc[i][j];
}

// WGT: dW[e][n, k] += sum over the expert's rows r (in order) dye[r, n] xe[r, k].
// blockIdx.x = e * n_tiles + n tile, blockIdx.y = k tile.
__global__ void __launch_bounds__(MF_CUDA_BLOCK)
    expert_wgt_kernel(const float *dye, const float *xe, const int64_t *offsets, int64_t N, int64_t Kd,
                      int64_t n_tiles, const expert_ptrs dW) {
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

static mf_status expert_args(int64_t E, const float *const *experts, expert_ptrs *p) {
  if (E <= 0) return MF_OK;
  if (E > MF_CUDA_MAX_EXPERTS)
    return MF_ERR(MF_ERR_UNSUPPORTED, "cuda expert GEMM: %lld experts; at most %d", (long long)E,
                  MF_CUDA_MAX_EXPERTS);
  if (!experts) return MF_ERR(MF_ERR_INVALID_ARG, "cuda expert GEMM: no expert weight list");
  memset(p, 0, sizeof *p);
  for (int64_t e = 0; e < E; e++) p->p[e] = experts[e];
  return MF_OK;
}

static mf_status expert_rows(int kind, const float *in, const int64_t *offsets, int64_t R, int64_t E,
                             int64_t Kin, int64_t Nout, const float *const *experts, float *out,
                             cudaStream_t s) {
  if (R <= 0 || E <= 0 || Nout <= 0) return MF_OK;
  expert_ptrs p;
  MF_CHECK(expert_args(E, experts, &p));
  const int64_t row_tiles = (R + EBM - 1) / EBM + E, col_tiles = (Nout + EBN - 1) / EBN;
  if (row_tiles > INT32_MAX || col_tiles > 65535)
    return MF_ERR(MF_ERR_UNSUPPORTED, "cuda expert GEMM: %lld rows x %lld columns is too large a grid",
                  (long long)R, (long long)Nout);
  if (Kin <= 0) {  // empty contraction: the output rows are 0
    MF_CUDA_CHECK(cudaMemsetAsync(out, 0, (size_t)R * (size_t)Nout * sizeof(float), s));
    return MF_OK;
  }
  dim3 grid((unsigned)row_tiles, (unsigned)col_tiles);
  if (kind == KIND_FWD)
    expert_rows_kernel<KIND_FWD><<<grid, MF_CUDA_BLOCK, 0, s>>>(in, offsets, E, Kin, Nout, p, out);
  else
    expert_rows_kernel<KIND_DATA><<<grid, MF_CUDA_BLOCK, 0, s>>>(in, offsets, E, Kin, Nout, p, out);
  MF_CUDA_CHECK_LAUNCH();
  return MF_OK;
}

mf_status mf_cuda_expert_fwd(const float *xe, const float *const *W, const int64_t *offsets, int64_t R,
                             int64_t E, int64_t N, int64_t Kd, float *ye, cudaStream_t s) {
  return expert_rows(KIND_FWD, xe, offsets, R, E, Kd, N, W, ye, s);
}

mf_status mf_cuda_expert_bwd_data(const float *dye, const float *const *W, const int64_t *offsets, int64_t R,
                                  int64_t E, int64_t N, int64_t Kd, float *dxe, cudaStream_t s) {
  return expert_rows(KIND_DATA, dye, offsets, R, E, N, Kd, W, dxe, s);
}

mf_status mf_cuda_expert_bwd_weight(const float *dye, const float *xe, const int64_t *offsets, int64_t E,
                                    int64_t N, int64_t Kd, float *const *dW, cudaStream_t s) {
  if (E <= 0 || N <= 0 || Kd <= 0) return MF_OK;
  expert_ptrs p;
  MF_CHECK(expert_args(E, (const float *const *)dW, &p));
  const int64_t n_tiles = (N + EBM - 1) / EBM, k_tiles = (Kd + EBN - 1) / EBN;
  if (E * n_tiles > INT32_MAX || k_tiles > 65535)
    return MF_ERR(MF_ERR_UNSUPPORTED, "cuda expert GEMM: dW of %lld x %lld is too large a grid", (long long)N,
                  (long long)Kd);
  dim3 grid((unsigned)(E * n_tiles), (unsigned)k_tiles);
  expert_wgt_kernel<<<grid, MF_CUDA_BLOCK, 0, s>>>(dye, xe, offsets, N, Kd, n_tiles, p);
  MF_CUDA_CHECK_LAUNCH();
  return MF_OK;
}
