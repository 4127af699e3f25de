/* Gradient checks, the global L2 norm and clipping over a list of buffers.
 *
 * The buffers are cut into chunks of MF_OPTIM_NORM_CHUNK elements (a buffer's
 * last chunk may be shorter); the chunk list, in buffer order, is handed to the
 * pool up to ROUND chunks at a time, each thread taking a contiguous run of
 * them. Per-chunk results land in a slot per chunk and are combined by the
 * caller in chunk order, so no result depends on the number of threads, and
 * nothing is allocated (a round lives on the caller's stack). */
#include <math.h>
#include <string.h>

#include "src/optim/optim.h"

#define ROUND 512 /* chunks per pool run: 32M elements */

typedef enum { OP_CHECK, OP_SUMSQ, OP_SCALE } chunk_op;

typedef struct round_job {
  chunk_op op;
  float scale;
  size_t count;
  float *data[ROUND];
  size_t len[ROUND];
  double sum[ROUND]; /* OP_SUMSQ: the chunk's sum of squares */
  int bad[ROUND];    /* OP_CHECK: 1 when the chunk holds a NaN or Inf */
} round_job;

/* MF_OPTIM_NORM_LANES lanes, element i into lane i % LANES, each lane summed in
 * order in double, then the lanes folded pairwise: for h = LANES/2, ..., 1,
 * lane t += lane t + h for t < h (a lane with no elements holds 0). The cuda
 * twin gives each lane a thread and folds in shared memory, so a chunk is
 * LANES threads wide there, not 8 (kernels/cuda/adamw.cu). A float squared is
 * exact in double, so fma(x, x, acc) == acc + x*x and contraction changes
 * nothing. */
static double chunk_sumsq(const float *x, size_t n) {
  double a[MF_OPTIM_NORM_LANES];
  memset(a, 0, sizeof a);
  size_t i = 0;
  for (; i + MF_OPTIM_NORM_LANES <= n; i += MF_OPTIM_NORM_LANES)
    for (size_t l = 0; l < MF_OPTIM_NORM_LANES; l++) a[l] += (double)x[i + l] * (double)x[i + l];
  for (size_t l = 0; i < n; i++, l++) a[l] += (double)x[i] * (double)x[i];
  for (size_t h = MF_OPTIM_NORM_LANES / 2; h >= 1; h /= 2)
    for (size_t t = 0; t < h; t++) a[t] += a[t + h];
  return a[0];
}

static int chunk_has_nonfinite(const float *x, size_t n) {
  uint32_t bad = 0;
  for (size_t i = 0; i < n; i++) {
    uint32_t u;
    memcpy(&u, &x[i], sizeof u);
    bad |= (uint32_t)((u & 0x7f800000u) == 0x7f800000u);
  }
  return (int)bad;
}

static void chunk_scale(float *x, size_t n, float s) {
  for (size_t i = 0; i < n; i++) x[i] *= s;
}

static void round_task(void *ctx, int i, int n_threads) {
  round_job *j = (round_job *)ctx;
  size_t b, e;
  mf_partition(j->count, 1, i, n_threads, &b, &e);
  for (size_t k = b; k < e; k++) {
    switch (j->op) {
      case OP_CHECK:
        j->bad[k] = chunk_has_nonfinite(j->data[k], j->len[k]);
        break;
      case OP_SUMSQ:
        j->sum[k] = chunk_sumsq(j->data[k], j->len[k]);
        break;
      case OP_SCALE:
        chunk_scale(j->data[k], j->len[k], j->scale);
        break;
    }
  }
}

/* Runs a full round and folds its results, in chunk order, into *sum / *bad;
 * keep, when not NULL, receives the round's chunk sums (OP_SUMSQ). */
static void run_round(round_job *j, mf_threadpool *pool, double *sum, int *bad, double *keep) {
  if (j->count == 0) return;
  size_t elems = 0;
  for (size_t k = 0; k < j->count; k++) elems += j->len[k];
  if (!pool || j->count == 1 || elems <= MF_OPTIM_NORM_CHUNK)
    round_task(j, 0, 1);
  else
    mf_threadpool_run(pool, round_task, j);
  for (size_t k = 0; k < j->count; k++) {
    if (j->op == OP_SUMSQ) *sum += j->sum[k];
    if (j->op == OP_CHECK) *bad |= j->bad[k];
  }
  if (keep && j->op == OP_SUMSQ) memcpy(keep, j->sum, j->count * sizeof(double));
  j->count = 0;
}

static mf_status for_chunks_ext(const mf_optim_buf *bufs, size_t n_bufs, const double *const *ext,
                                mf_threadpool *pool, chunk_op op, float scale, double *sum, int *bad) {
  if (n_bufs > 0 && !bufs)
    return MF_ERR(MF_ERR_INVALID_ARG, "gradients: %zu buffers but a NULL list", n_bufs);
  round_job j;
  j.op = op;
  j.scale = scale;
  j.count = 0;
  *sum = 0.0;
  *bad = 0;
  for (size_t b = 0; b < n_bufs; b++) {
    if (ext && ext[b] && bufs[b].n > 0) {
      /* Chunk sums computed elsewhere: added at this buffer's place in the order. */
      run_round(&j, pool, sum, bad, NULL);
      if (op == OP_SUMSQ)
        for (size_t k = 0; k < mf_optim_norm_chunks(bufs[b].n); k++) *sum += ext[b][k];
      continue;
    }
    if (!bufs[b].data || bufs[b].n == 0) continue; /* no gradient: an expert without tokens */
    for (size_t off = 0; off < bufs[b].n; off += MF_OPTIM_NORM_CHUNK) {
      size_t left = bufs[b].n - off;
      j.data[j.count] = bufs[b].data + off;
      j.len[j.count] = left < MF_OPTIM_NORM_CHUNK ? left : MF_OPTIM_NORM_CHUNK;
      if (++j.count == ROUND) run_round(&j, pool, sum, bad, NULL);
    }
  }
  run_round(&j, pool, sum, bad, NULL);
  return MF_OK;
}

static mf_status for_chunks(const mf_optim_buf *bufs, size_t n_bufs, mf_threadpool *pool, chunk_op op,
                            float scale, double *sum, int *bad) {
  return for_chunks_ext(bufs, n_bufs, NULL, pool, op, scale, sum, bad);
}

mf_status mf_optim_grad_chunk_sumsq(const float *g, size_t n, mf_threadpool *pool, double *sums) {
  if (n == 0) return MF_OK;
  if (!g || !sums) return MF_ERR(MF_ERR_INVALID_ARG, "gradient chunk sums: %zu elements but a NULL buffer", n);
  round_job j;
  j.op = OP_SUMSQ;
  j.scale = 1.0f;
  j.count = 0;
  double unused_sum = 0.0;
  int unused_bad = 0;
  size_t done = 0;
  for (size_t off = 0; off < n; off += MF_OPTIM_NORM_CHUNK) {
    size_t left = n - off;
    j.data[j.count] = (float *)(uintptr_t)(g + off); /* OP_SUMSQ only reads */
    j.len[j.count] = left < MF_OPTIM_NORM_CHUNK ? left : MF_OPTIM_NORM_CHUNK;
    if (++j.count == ROUND) {
      run_round(&j, pool, &unused_sum, &unused_bad, sums + done);
      done += ROUND;
    }
  }
  run_round(&j, pool, &unused_sum, &unused_bad, sums + done);
  return MF_OK;
}

mf_status mf_optim_grad_check(const mf_optim_buf *bufs, size_t n_bufs, mf_threadpool *pool, int *all_finite) {
  if (!all_finite) return MF_ERR(MF_ERR_INVALID_ARG, "gradient check: no result pointer");
  double unused;
  int bad;
  MF_CHECK(for_chunks(bufs, n_bufs, pool, OP_CHECK, 1.0f, &unused, &bad));
  *all_finite = !bad;
  return MF_OK;
}

mf_status mf_optim_grad_norm(const mf_optim_buf *bufs, size_t n_bufs, mf_threadpool *pool, double *norm) {
  if (!norm) return MF_ERR(MF_ERR_INVALID_ARG, "gradient norm: no result pointer");
  double sum;
  int unused;
  MF_CHECK(for_chunks(bufs, n_bufs, pool, OP_SUMSQ, 1.0f, &sum, &unused));
  *norm = sqrt(sum);
  return MF_OK;
}

mf_status mf_optim_grad_norm_ext(const mf_optim_buf *bufs, size_t n_bufs, const double *const *ext,
                                 mf_threadpool *pool, double *norm) {
  if (!norm) return MF_ERR(MF_ERR_INVALID_ARG, "gradient norm: no result pointer");
  double sum;
  int unused;
  MF_CHECK(for_chunks_ext(bufs, n_bufs, ext, pool, OP_SUMSQ, 1.0f, &sum, &unused));
  *norm = sqrt(sum);
  return MF_OK;
}

double mf_optim_clip_coef(double total_norm, double max_norm) {
  if (!(max_norm > 0) || !isfinite(total_norm)) return 1.0;
  double coef = max_norm / (total_norm + 1e-6);
  return coef < 1.0 ? coef : 1.0;
}

mf_status mf_optim_grad_scale(const mf_optim_buf *bufs, size_t n_bufs, double coef, mf_threadpool *pool) {
  double unused_sum;
  int unused_bad;
  return for_chunks(bufs, n_bufs, pool, OP_SCALE, (float)coef, &unused_sum, &unused_bad);
}

mf_status mf_optim_clip_grad_norm(const mf_optim_buf *bufs, size_t n_bufs, double max_norm,
                                  mf_threadpool *pool, double *norm, double *coef) {
  double total;
  MF_CHECK(mf_optim_grad_norm(bufs, n_bufs, pool, &total));
  double c = mf_optim_clip_coef(total, max_norm);
  if (c < 1.0) MF_CHECK(mf_optim_grad_scale(bufs, n_bufs, c, pool));
  if (norm) *norm = total;
  if (coef) *coef = c;
  return MF_OK;
}
