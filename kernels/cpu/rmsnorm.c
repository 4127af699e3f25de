/*
 * RMSNorm on the cpu backend, rows of C over R rows (x[R,C], w[C], rstd[R]).
 *
 *   fwd: rstd[r] = 1/sqrt(mean_c x[r,c]^2 + eps);  y[r,c] = w[c] * (x[r,c]*rstd[r])
 *   bwd: xhat = x*rstd;  m = mean_c(w*dy*xhat);  dx = rstd * (w*dy - xhat*m)
 *        dw[c] += sum_r dy[r,c]*xhat[r,c]
 *
 * Row sums (sum of squares, the mean in the backward) use LANES interleaved fp32
 * partial sums combined in a fixed tree: vectorisable, more accurate than one
 * running sum, and the same bits on any thread count because a row is never
 * split. Threads: rows for y/rstd/dx; columns for dw, each thread summing the
 * rows of its columns in order.
 */
#include <math.h>

#include "kernels/cpu/cpu_ops.h"

#define LANES 16
#define DW_CHUNK 256 /* columns of dw summed at a time (stack accumulators) */
#define NORM_PARALLEL_MIN (1 << 14)

/* sum_c a[c]*b[c] in LANES partial sums, then a fixed pairwise tree. */
static float dot_lanes(const float *restrict a, const float *restrict b, int64_t n) {
  float s[LANES] = {0};
  int64_t c = 0;
  for (; c + LANES <= n; c += LANES)
    for (int j = 0; j < LANES; j++) s[j] += a[c + j] * b[c + j];
  for (int j = 0; c + j < n; j++) s[j] += a[c + j] * b[c + j];
  for (int w = LANES / 2; w > 0; w /= 2)
    for (int j = 0; j < w; j++) s[j] += s[j + w];
  return s[0];
}

/* sum_c w[c]*dy[c]*(x[c]*rstd), same lane layout. */
static float dot3_lanes(const float *restrict w, const float *restrict dy, const float *restrict x, float rstd,
                        int64_t n) {
  float s[LANES] = {0};
  int64_t c = 0;
  for (; c + LANES <= n; c += LANES)
    for (int j = 0; j < LANES; j++) s[j] += (w[c + j] * dy[c + j]) * (x[c + j] * rstd);
  for (int j = 0; c + j < n; j++) s[j] += (w[c + j] * dy[c + j]) * (x[c + j] * rstd);
  for (int k = LANES / 2; k > 0; k /= 2)
    for (int j = 0; j < k; j++) s[j] += s[j + k];
  return s[0];
}

typedef struct norm_args {
  const float *x, *w, *dy;
  float *y, *rstd_out;
  const float *rstd;
  float *dx, *dw;
  int64_t R, C;
  float eps;
  int accumulate, round_bf16;
} norm_args;

static void norm_fwd_task(void *arg, int i, int n) {
  const norm_args *a = (const norm_args *)arg;
  size_t r0, r1;
  mf_partition((size_t)a->R, 1, i, n, &r0, &r1);
  const int64_t C = a->C;
  for (size_t r = r0; r < r1; r++) {
    const float *x = a->x + (int64_t)r * C;
    float *y = a->y + (int64_t)r * C;
    float ms = C > 0 ? dot_lanes(x, x, C) / (float)C : 0.0f;
    float rs = 1.0f / sqrtf(ms + a->eps);
    a->rstd_out[r] = rs;
    if (a->round_bf16) {
      for (int64_t c = 0; c < C; c++) y[c] = mf_round_to_bf16(a->w[c] * (x[c] * rs));
    } else {
      for (int64_t c = 0; c < C; c++) y[c] = a->w[c] * (x[c] * rs);
    }
  }
}

static void norm_bwd_task(void *arg, int i, int n) {
  const norm_args *a = (const norm_args *)arg;
  const int64_t C = a->C;
  size_t r0, r1;
  mf_partition((size_t)a->R, 1, i, n, &r0, &r1);
  for (size_t r = r0; r < r1; r++) {
    const float *x = a->x + (int64_t)r * C, *dy = a->dy + (int64_t)r * C;
    float *dx = a->dx + (int64_t)r * C;
    float rs = a->rstd[r];
    float m = C > 0 ? dot3_lanes(a->w, dy, x, rs, C) / (float)C : 0.0f;
    for (int64_t c = 0; c < C; c++) {
      float v = rs * (a->w[c] * dy[c] - (x[c] * rs) * m);
      if (a->accumulate) v = dx[c] + v;
      if (a->round_bf16) v = mf_round_to_bf16(v);
      dx[c] = v;
    }
  }

  if (!a->dw) return; /* a frozen weight: no gradient */
  size_t c0, c1;
  mf_partition((size_t)C, 16, i, n, &c0, &c1);
  float acc[DW_CHUNK];
  for (size_t j0 = c0; j0 < c1; j0 += DW_CHUNK) {
    size_t wd = c1 - j0 < DW_CHUNK ? c1 - j0 : DW_CHUNK;
    for (size_t j = 0; j < wd; j++) acc[j] = 0.0f;
    for (int64_t r = 0; r < a->R; r++) {
      const float *x = a->x + r * C + j0, *dy = a->dy + r * C + j0;
      float rs = a->rstd[r];
      for (size_t j = 0; j < wd; j++) acc[j] += dy[j] * (x[j] * rs);
    }
    for (size_t j = 0; j < wd; j++) a->dw[j0 + j] += acc[j];
  }
}

static void norm_run(const mf_kctx *ctx, mf_task_fn fn, norm_args *a) {
  if ((double)a->R * (double)a->C < NORM_PARALLEL_MIN)
    fn(a, 0, 1);
  else
    mf_threadpool_run(ctx->pool, fn, a);
}

mf_status mf_cpu_rmsnorm_fwd(const float *x, const float *w, int64_t R, int64_t C, float eps, float *y,
                             float *rstd, const mf_kctx *ctx) {
  if (R <= 0) return MF_OK;
  norm_args a = {0};
  a.x = x, a.w = w, a.y = y, a.rstd_out = rstd;
  a.R = R, a.C = C, a.eps = eps, a.round_bf16 = ctx->round_bf16;
  norm_run(ctx, norm_fwd_task, &a);
  return MF_OK;
}

mf_status mf_cpu_rmsnorm_bwd(const float *dy, const float *x, const float *w, const float *rstd, int64_t R,
                             int64_t C, float *dx, float *dw, int accumulate, const mf_kctx *ctx) {
  if (R <= 0 || C <= 0) return MF_OK;
  norm_args a = {0};
  a.x = x, a.w = w, a.dy = dy, a.rstd = rstd, a.dx = dx, a.dw = dw;
  a.R = R, a.C = C, a.accumulate = accumulate, a.round_bf16 = ctx->round_bf16;
  norm_run(ctx, norm_bwd_task, &a);
  return MF_OK;
}
