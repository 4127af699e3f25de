/*
 * Dense linear layers on the cpu backend: forward, backward to the input and
 * backward to the weight, each through the kernels' one GEMM (gemm_impl.h).
 *
 *   fwd:         y[M,N]  (+)= x[M,K] . W[N,K]^T (+ b[N])                 NT
 *   bwd_data:    dx[M,K] (+)= dy[M,N] . W[N,K]                           NN
 *   bwd_weight:  dW[N,K]  += dy[M,N]^T . x[M,K];   db[N] += sum_m dy[m,:]  TN
 *
 * The GEMM's layouts read the operands through row strides, so the three
 * products need no transposed copies. Outputs are split into MC x NC blocks; a
 * thread takes a contiguous range of blocks. Per block, mf_cpu_gemm writes the
 * sums into a stack tile and store_block adds the bias and the old value.
 *
 * Determinism: every C element is the sum over p = 0..K-1, in order, of
 * A(m,p)*B(p,n), started from 0.0f, then the bias is added, then (when the
 * output accumulates) the old value is added: out = old + (sum + b). The same
 * operations happen whatever the thread count or block boundaries, so the bits
 * never depend on the partition. Bias sums (db) are split over columns, each
 * summing the rows in order.
 *
 * Stack use per thread: a tile of MC*NC floats (16 KiB) and the GEMM's panels
 * (at most 40 KiB); nothing is allocated.
 */
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/gemm_impl.h"

#define MC 64
#define NC 64

/* Below this many multiply-adds a GEMM runs on the calling thread: waking the
 * pool costs more than it saves. The result is the same either way. */
#define GEMM_PARALLEL_MIN (1 << 18)

typedef struct gemm_args {
  mf_cpu_gemm_layout layout;
  const float *A, *B; /* C[M,N] = A(M x K) B(K x N) as the layout reads them */
  int64_t lda, ldb;
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

static inline int64_t min64(int64_t a, int64_t b) {
  return a < b ? a : b;
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
  float ct[MC * NC];
  const int64_t n_mb = (g->M + MC - 1) / MC;
  for (int64_t b = b0; b < b1; b++) {
    int64_t nb = b / n_mb, mb = b % n_mb;
    int64_t m0 = mb * MC, n0 = nb * NC;
    int64_t mc = min64(MC, g->M - m0), nc = min64(NC, g->N - n0);
    /* rows m0.. of A and columns n0.. of B, as the layout stores them */
    const float *a = g->A + (g->layout == MF_CPU_GEMM_TN ? m0 : m0 * g->lda);
    const float *bb = g->B + (g->layout == MF_CPU_GEMM_NT ? n0 * g->ldb : n0);
    mf_cpu_gemm(g->layout, a, g->lda, bb, g->ldb, mc, nc, g->K, ct, NC, 0, 0);
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

mf_status mf_cpu_linear_fwd(const float *x, const float *W, const float *bias, int64_t M, int64_t N,
                            int64_t K, float *y, int accumulate, const mf_kctx *ctx) {
  gemm_args g = {0};
  g.layout = MF_CPU_GEMM_NT;
  g.A = x, g.lda = K;
  g.B = W, g.ldb = K;
  g.C = y, g.ldc = N;
  g.bias = bias;
  g.M = M, g.N = N, g.K = K;
  g.accumulate = accumulate, g.round_bf16 = ctx->round_bf16;
  gemm_run(ctx, &g);
  return MF_OK;
}

mf_status mf_cpu_linear_bwd_data(const float *dy, const float *W, int64_t M, int64_t N, int64_t K, float *dx,
                                 int accumulate, const mf_kctx *ctx) {
  gemm_args g = {0};
  g.layout = MF_CPU_GEMM_NN;
  g.A = dy, g.lda = N;
  g.B = W, g.ldb = K;
  g.C = dx, g.ldc = K;
  g.M = M, g.N = K, g.K = N;
  g.accumulate = accumulate, g.round_bf16 = ctx->round_bf16;
  gemm_run(ctx, &g);
  return MF_OK;
}

mf_status mf_cpu_linear_bwd_weight(const float *dy, const float *x, int64_t M, int64_t N, int64_t K,
                                   float *dW, float *db, const mf_kctx *ctx) {
  gemm_args g = {0};
  g.layout = MF_CPU_GEMM_TN;
  g.A = dy, g.lda = N;
  g.B = x, g.ldb = K;
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
