/*
 * Strided column blocks on the cpu backend: the copies that take a tensor
 * apart and put it together (DeepSeek-V3's multi-head latent attention splits
 * kv_a_proj_with_mqa's rows into the compressed kv and the shared rope key,
 * kv_b_proj's into each head's key and value, and broadcasts the rope key to
 * every head), and their backward.
 *
 *   slice:     y[r*ys + yo + j]  =(+=)  x[(r / rep)*xs + xo + j]              r < R, j < C
 *   slice_bwd: x[q*xs + xo + j]  =(+=)  sum over h < rep of y[(q*rep + h)*ys + yo + j]   q < Q
 *
 * slice reads row r / rep of x for row r of y (rep 1: a copy; rep H: one row
 * broadcast to H consecutive rows); slice_bwd is its transpose, the sum over
 * the rep rows taken in h order, so any thread count gives the same bits.
 * With acc the result is added to what the destination holds. In fp32; with
 * ctx->round_bf16 each stored value is rounded once (a copy of a bf16 value
 * is exact).
 */
#include "kernels/cpu/cpu_ops.h"

#define SLICE_GRAIN 64 /* rows per partition unit */
#define SLICE_PARALLEL_MIN (1 << 15)

typedef struct slice_args {
  const float *src;
  float *dst;
  int64_t rows, C, xs, xo, ys, yo, rep;
  int acc, round_bf16;
} slice_args;

static inline float rnd(int round_bf16, float v) {
  return round_bf16 ? mf_round_to_bf16(v) : v;
}

static void slice_task(void *arg, int i, int n) {
  const slice_args *a = (const slice_args *)arg;
  size_t b, e;
  mf_partition((size_t)a->rows, SLICE_GRAIN, i, n, &b, &e);
  for (size_t r = b; r < e; r++) {
    const float *x = a->src + ((int64_t)r / a->rep) * a->xs + a->xo;
    float *y = a->dst + (int64_t)r * a->ys + a->yo;
    for (int64_t j = 0; j < a->C; j++) y[j] = rnd(a->round_bf16, a->acc ? y[j] + x[j] : x[j]);
  }
}

static void slice_bwd_task(void *arg, int i, int n) {
  const slice_args *a = (const slice_args *)arg;
  size_t b, e;
  mf_partition((size_t)a->rows, SLICE_GRAIN, i, n, &b, &e);
  for (size_t q = b; q < e; q++) {
    float *x = a->dst + (int64_t)q * a->xs + a->xo;
    for (int64_t j = 0; j < a->C; j++) {
      float s = a->acc ? x[j] : 0.0f;
      for (int64_t h = 0; h < a->rep; h++) s += a->src[((int64_t)q * a->rep + h) * a->ys + a->yo + j];
      x[j] = rnd(a->round_bf16, s);
    }
  }
}

/* The sizes a call names stay inside both operands' rows. */
static void run(const mf_kctx *ctx, mf_task_fn fn, slice_args *a) {
  if ((double)a->rows * (double)a->C * (double)a->rep < SLICE_PARALLEL_MIN)
    fn(a, 0, 1);
  else
    mf_threadpool_run(ctx->pool, fn, a);
}

mf_status mf_cpu_slice(const float *x, int64_t R, int64_t C, int64_t xs, int64_t xo, int64_t ys, int64_t yo,
                       int64_t rep, int acc, float *y, const mf_kctx *ctx) {
  MF_CHECK(mf_kernel_slice_check("slice", R, C, xs, xo, ys, yo, rep));
  slice_args a = {x, y, R, C, xs, xo, ys, yo, rep, acc, ctx->round_bf16};
  run(ctx, slice_task, &a);
  return MF_OK;
}

mf_status mf_cpu_slice_bwd(const float *dy, int64_t Q, int64_t C, int64_t xs, int64_t xo, int64_t ys,
                           int64_t yo, int64_t rep, int acc, float *dx, const mf_kctx *ctx) {
  MF_CHECK(mf_kernel_slice_check("slice_bwd", Q, C, xs, xo, ys, yo, rep));
  slice_args a = {dy, dx, Q, C, xs, xo, ys, yo, rep, acc, ctx->round_bf16};
  run(ctx, slice_bwd_task, &a);
  return MF_OK;
}
