/*
 * Dense linear layers on the cpu backend: forward, backward to the input and
 * backward to the weight, all through one blocked GEMM.
 *
 *   fwd:         y[M,N]  (+)= x[M,K] . W[N,K]^T (+ b[N])
 *   bwd_data:    dx[M,K] (+)= dy[M,N] . W[N,K]
 *   bwd_weight:  dW[N,K]  += dy[M,N]^T . x[M,K];   db[N] += sum_m dy[m,:]
 *
 * The GEMM computes C[m,n] = sum_p A(m,p) B(p,n) with A and B read through
 * strides, so the three products above need no transposed copies. Outputs are
 * split into MC x NC blocks; a thread takes a contiguous range of blocks. Per
 * block, KC-long slices of A and B are packed (zero-padded to the micro-tile)
 * into stack panels and an MR x NR micro-kernel accumulates into a stack tile
 * of the block's sums. Its loops have fixed trip counts and no cross-lane
 * reduction, so gcc -O3 vectorises them over NR with plain SSE2.
 *
 * Determinism: every C element is the sum over p = 0..K-1, in order, of
 * A(m,p)*B(p,n), started from 0.0f, then the bias is added, then (when the
 * output accumulates) the old value is added: out = old + (sum + b). The same
 * operations happen whatever the thread count, block or chunk boundaries, so
 * the bits never depend on the partition. Bias sums (db) are split over columns,
 * each summing the rows in order.
 *
 * Stack use per thread: panels of MC*KC + KC*NC floats and a tile of MC*NC
 * floats (144 KiB); nothing is allocated.
 */
#include <string.h>

#include "kernels/cpu/cpu_ops.h"

/* An MR x NR micro-tile keeps its 8 SSE accumulators in registers (16 would
 * spill); the panels fit L1 (KC x NR of B) and L2 (MC x KC of A). */
#define MR 4
#define NR 8
#define MC 64 /* multiple of MR */
#define NC 64 /* multiple of NR */
#define KC 256

/* Below this many multiply-adds a GEMM runs on the calling thread: waking the
 * pool costs more than it saves. The result is the same either way. */
#define GEMM_PARALLEL_MIN (1 << 18)

typedef struct gemm_args {
  const float *A;
  int64_t a_rs, a_cs; /* A(m,p) = A[m*a_rs + p*a_cs] */
  const float *B;
  int64_t b_rs, b_cs; /* B(p,n) = B[p*b_rs + n*b_cs] */
  float *C;
  int64_t ldc;
  const float *bias; /* [N] or NULL */
  int64_t M, N, K;
  int accumulate, round_bf16;
  /* db pass of bwd_weight (columns of dy summed over rows), NULL otherwise. */
  const float *db_src;
  float *db;
  int64_t db_rows, db_cols;
} gemm_args;

static inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

/* Ap[p*MR + i] = A(m0+i, k0+p) for i < mr, 0 for mr <= i < MR, whole MR groups. */
static void pack_a(const gemm_args *g, int64_t m0, int64_t mc, int64_t k0, int64_t kc, float *restrict Ap) {
  for (int64_t i0 = 0; i0 < mc; i0 += MR) {
    float *dst = Ap + i0 * kc;
    int64_t mr = min64(MR, mc - i0);
    if (mr < MR) memset(dst, 0, sizeof(float) * (size_t)(kc * MR));
    if (g->a_cs == 1) {
      for (int64_t i = 0; i < mr; i++) {
        const float *src = g->A + (m0 + i0 + i) * g->a_rs + k0;
        for (int64_t p = 0; p < kc; p++) dst[p * MR + i] = src[p];
      }
    } else {
      for (int64_t p = 0; p < kc; p++) {
        const float *src = g->A + (k0 + p) * g->a_cs + (m0 + i0) * g->a_rs;
        for (int64_t i = 0; i < mr; i++) dst[p * MR + i] = src[i * g->a_rs];
      }
    }
  }
}

/* Bp[p*NR + j] = B(k0+p, n0+j) per NR group, zero beyond nc. */
static void pack_b(const gemm_args *g, int64_t n0, int64_t nc, int64_t k0, int64_t kc, float *restrict Bp) {
  for (int64_t j0 = 0; j0 < nc; j0 += NR) {
    float *dst = Bp + j0 * kc;
    int64_t nr = min64(NR, nc - j0);
    if (nr < NR) memset(dst, 0, sizeof(float) * (size_t)(kc * NR));
    if (g->b_rs == 1) {
      for (int64_t j = 0; j < nr; j++) {
        const float *src = g->B + (n0 + j0 + j) * g->b_cs + k0;
        for (int64_t p = 0; p < kc; p++) dst[p * NR + j] = src[p];
      }
    } else {
      for (int64_t p = 0; p < kc; p++) {
        const float *src = g->B + (k0 + p) * g->b_rs + (n0 + j0) * g->b_cs;
        for (int64_t j = 0; j < nr; j++) dst[p * NR + j] = src[j * g->b_cs];
      }
    }
  }
}

/* ct[MR x NR, row stride NC] (= 0 when first, else +=) sum_p Ap[p,:] x Bp[p,:]. */
static void micro_kernel(int64_t kc, const float *restrict Ap, const float *restrict Bp, float *restrict ct,
                         int first) {
  float acc[MR][NR];
  for (int i = 0; i < MR; i++)
    for (int j = 0; j < NR; j++) acc[i][j] = first ? 0.0f : ct[i * NC + j];
  for (int64_t p = 0; p < kc; p++) {
    const float *a = Ap + p * MR;
    const float *b = Bp + p * NR;
    for (int i = 0; i < MR; i++)
      for (int j = 0; j < NR; j++) acc[i][j] += a[i] * b[j];
  }
  for (int i = 0; i < MR; i++)
    for (int j = 0; j < NR; j++) ct[i * NC + j] = acc[i][j];
}

/* C block (m0, n0, mc x nc) from the finished sums in ct. */
static void store_block(const gemm_args *g, int64_t m0, int64_t mc, int64_t n0, int64_t nc, const float *ct) {
  for (int64_t i = 0; i < mc; i++) {
    float *c = g->C + (m0 + i) * g->ldc + n0;
    const float *s = ct + i * NC;
    for (int64_t j = 0; j < nc; j++) {
      float v = s[j];
      if (g->bias) v += g->bias[n0 + j];
      if (g->accumulate) v = c[j] + v;
      if (g->round_bf16) v = mf_round_to_bf16(v);
      c[j] = v;
    }
  }
}

static void gemm_blocks(const gemm_args *g, int64_t b0, int64_t b1) {
  float Ap[MC * KC];
  float Bp[KC * NC];
  float ct[MC * NC];
  const int64_t n_mb = (g->M + MC - 1) / MC;
  const int single_chunk = g->K <= KC;
  int64_t packed_nb = -1; /* the block column whose B panel Bp holds (single chunk) */
  for (int64_t b = b0; b < b1; b++) {
    int64_t nb = b / n_mb, mb = b % n_mb;
    int64_t m0 = mb * MC, n0 = nb * NC;
    int64_t mc = min64(MC, g->M - m0), nc = min64(NC, g->N - n0);
    if (g->K == 0) memset(ct, 0, sizeof ct);
    for (int64_t k0 = 0; k0 < g->K; k0 += KC) {
      int64_t kc = min64(KC, g->K - k0);
      if (!single_chunk || packed_nb != nb) {
        pack_b(g, n0, nc, k0, kc, Bp);
        packed_nb = nb;
      }
      pack_a(g, m0, mc, k0, kc, Ap);
      for (int64_t j = 0; j < nc; j += NR)
        for (int64_t i = 0; i < mc; i += MR) micro_kernel(kc, Ap + i * kc, Bp + j * kc, ct + i * NC + j, k0 == 0);
    }
    store_block(g, m0, mc, n0, nc, ct);
  }
}

/* db[n] += sum_m src[m, n] over this thread's columns, rows in order. */
static void bias_grad_cols(const gemm_args *g, int i, int n) {
  size_t c0, c1;
  mf_partition((size_t)g->db_cols, 16, i, n, &c0, &c1);
  float acc[256];
  for (size_t j0 = c0; j0 < c1; j0 += 256) {
    size_t w = c1 - j0 < 256 ? c1 - j0 : 256;
    for (size_t j = 0; j < w; j++) acc[j] = 0.0f;
    for (int64_t m = 0; m < g->db_rows; m++) {
      const float *row = g->db_src + m * g->db_cols + j0;
      for (size_t j = 0; j < w; j++) acc[j] += row[j];
    }
    for (size_t j = 0; j < w; j++) g->db[j0 + j] += acc[j];
  }
}

static void gemm_task(void *arg, int i, int n) {
  const gemm_args *g = (const gemm_args *)arg;
  if (g->M > 0 && g->N > 0) {
    int64_t n_blocks = ((g->M + MC - 1) / MC) * ((g->N + NC - 1) / NC);
    size_t b0, b1;
    mf_partition((size_t)n_blocks, 1, i, n, &b0, &b1);
    gemm_blocks(g, (int64_t)b0, (int64_t)b1);
  }
  if (g->db) bias_grad_cols(g, i, n);
}

static void gemm_run(const mf_kctx *ctx, gemm_args *g) {
  double work = (double)g->M * (double)g->N * (double)(g->K > 0 ? g->K : 1);
  if (g->db) work += (double)g->db_rows * (double)g->db_cols;
  if (work < GEMM_PARALLEL_MIN)
    gemm_task(g, 0, 1);
  else
    mf_threadpool_run(ctx->pool, gemm_task, g);
}

mf_status mf_cpu_linear_fwd(const mf_kctx *ctx, const float *x, const float *W, const float *b, int64_t M,
                            int64_t N, int64_t K, float *y, int accumulate) {
  gemm_args g = {0};
  g.A = x, g.a_rs = K, g.a_cs = 1;
  g.B = W, g.b_rs = 1, g.b_cs = K;
  g.C = y, g.ldc = N;
  g.bias = b;
  g.M = M, g.N = N, g.K = K;
  g.accumulate = accumulate, g.round_bf16 = ctx->round_bf16;
  gemm_run(ctx, &g);
  return MF_OK;
}

mf_status mf_cpu_linear_bwd_data(const mf_kctx *ctx, const float *dy, const float *W, int64_t M, int64_t N,
                                 int64_t K, float *dx, int accumulate) {
  gemm_args g = {0};
  g.A = dy, g.a_rs = N, g.a_cs = 1;
  g.B = W, g.b_rs = K, g.b_cs = 1;
  g.C = dx, g.ldc = K;
  g.M = M, g.N = K, g.K = N;
  g.accumulate = accumulate, g.round_bf16 = ctx->round_bf16;
  gemm_run(ctx, &g);
  return MF_OK;
}

mf_status mf_cpu_linear_bwd_weight(const mf_kctx *ctx, const float *dy, const float *x, int64_t M, int64_t N,
                                   int64_t K, float *dW, float *db) {
  gemm_args g = {0};
  g.A = dy, g.a_rs = 1, g.a_cs = N;
  g.B = x, g.b_rs = K, g.b_cs = 1;
  g.C = dW, g.ldc = K;
  g.M = N, g.N = K, g.K = M;
  g.accumulate = 1, g.round_bf16 = 0;
  if (db && N > 0) {
    g.db_src = dy, g.db = db;
    g.db_rows = M, g.db_cols = N;
  }
  gemm_run(ctx, &g);
  return MF_OK;
}
