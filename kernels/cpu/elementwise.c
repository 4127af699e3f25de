/*
 * Elementwise ops on the cpu backend: SwiGLU, Qwen2-MoE's sigmoid shared-expert
 * gate, and the residual add.
 *
 *   swiglu fwd:  act = silu(g) * u                         (written)   g, u, act [n]
 *   swiglu bwd:  dg = dact * u * silu'(g),  du = dact * silu(g)   (written)
 *                silu(g) = g / (1 + e^-g),  silu'(g) = s * (1 + g*(1 - s)),  s = sigmoid(g)
 *   gate fwd:    y[r,:] += sigmoid(gl[r]) * x[r,:]          (added)    gl [R], x, y [R,C]
 *   gate bwd:    dx[r,:] = s*dy[r,:],  dgl[r] = s*(1-s) * dot(dy[r,:], x[r,:])   (written)
 *   add:         y += x
 *
 * All in fp32. For large |g|, e^-g overflows to +inf or underflows to 0 and
 * every formula above still gives a finite result (silu(-100) = -0, s = 0 or 1);
 * no form that divides inf by inf is used. Each element depends only on its own
 * inputs (the gate's row dot product is computed by one thread in a fixed lane
 * order), so any thread count gives the same bits.
 */
#include <math.h>

#include "kernels/backend.h"
#include "kernels/cpu/cpu_ops.h"

#define EW_GRAIN 4096 /* elements per partition unit (contiguous, cache-line multiples) */
#define EW_PARALLEL_MIN (1 << 15)
#define LANES 16

static inline float sigmoidf_(float v) { return 1.0f / (1.0f + expf(-v)); }

typedef struct ew_args {
  const float *g, *u, *dact, *x, *dy;
  float *out0, *out1;
  int64_t n, R, C;
  float s; /* scale */
  int round_bf16;
} ew_args;

static void ew_run(const mf_kctx *ctx, mf_task_fn fn, ew_args *a, double work) {
  if (work < EW_PARALLEL_MIN)
    fn(a, 0, 1);
  else
    mf_threadpool_run(ctx->pool, fn, a);
}

static inline float rnd(int round_bf16, float v) { return round_bf16 ? mf_round_to_bf16(v) : v; }

/* ---------------------------------------------------------------- swiglu */

static void swiglu_fwd_task(void *arg, int i, int n) {
  const ew_args *a = (const ew_args *)arg;
  size_t b, e;
  mf_partition((size_t)a->n, EW_GRAIN, i, n, &b, &e);
  for (size_t k = b; k < e; k++) {
    float g = a->g[k];
    float silu = g / (1.0f + expf(-g));
    a->out0[k] = rnd(a->round_bf16, silu * a->u[k]);
  }
}

static void swiglu_bwd_task(void *arg, int i, int n) {
  const ew_args *a = (const ew_args *)arg;
  size_t b, e;
  mf_partition((size_t)a->n, EW_GRAIN, i, n, &b, &e);
  for (size_t k = b; k < e; k++) {
    float g = a->g[k], d = a->dact[k];
    float s = sigmoidf_(g);
    float silu = g / (1.0f + expf(-g));
    float dsilu = s * (1.0f + g * (1.0f - s));
    a->out0[k] = rnd(a->round_bf16, d * a->u[k] * dsilu);
    a->out1[k] = rnd(a->round_bf16, d * silu);
  }
}

mf_status mf_cpu_swiglu_fwd(const float *g, const float *u, int64_t n, float *act, const mf_kctx *ctx) {
  if (n <= 0) return MF_OK;
  ew_args a = {0};
  a.g = g, a.u = u, a.out0 = act, a.n = n, a.round_bf16 = ctx->round_bf16;
  ew_run(ctx, swiglu_fwd_task, &a, (double)n);
  return MF_OK;
}

mf_status mf_cpu_swiglu_bwd(const float *g, const float *u, const float *dact, int64_t n, float *dg,
                            float *du, const mf_kctx *ctx) {
  if (n <= 0) return MF_OK;
  ew_args a = {0};
  a.g = g, a.u = u, a.dact = dact, a.out0 = dg, a.out1 = du, a.n = n, a.round_bf16 = ctx->round_bf16;
  ew_run(ctx, swiglu_bwd_task, &a, (double)n);
  return MF_OK;
}

/* ---------------------------------------------------------- sigmoid gate */

static void gate_fwd_task(void *arg, int i, int n) {
  const ew_args *a = (const ew_args *)arg;
  size_t r0, r1;
  mf_partition((size_t)a->R, 1, i, n, &r0, &r1);
  for (size_t r = r0; r < r1; r++) {
    float s = sigmoidf_(a->g[r]);
    const float *x = a->x + (int64_t)r * a->C;
    float *y = a->out0 + (int64_t)r * a->C;
    for (int64_t c = 0; c < a->C; c++) y[c] = rnd(a->round_bf16, y[c] + s * x[c]);
  }
}

static void gate_bwd_task(void *arg, int i, int n) {
  const ew_args *a = (const ew_args *)arg;
  size_t r0, r1;
  mf_partition((size_t)a->R, 1, i, n, &r0, &r1);
  const int64_t C = a->C;
  for (size_t r = r0; r < r1; r++) {
    float s = sigmoidf_(a->g[r]);
    const float *x = a->x + (int64_t)r * C, *dy = a->dy + (int64_t)r * C;
    float *dx = a->out0 + (int64_t)r * C;
    float acc[LANES] = {0};
    int64_t c = 0;
    for (; c + LANES <= C; c += LANES)
      for (int j = 0; j < LANES; j++) acc[j] += dy[c + j] * x[c + j];
    for (int j = 0; c + j < C; j++) acc[j] += dy[c + j] * x[c + j];
    for (int w = LANES / 2; w > 0; w /= 2)
      for (int j = 0; j < w; j++) acc[j] += acc[j + w];
    a->out1[r] = rnd(a->round_bf16, s * (1.0f - s) * acc[0]);
    for (c = 0; c < C; c++) dx[c] = rnd(a->round_bf16, s * dy[c]);
  }
}

mf_status mf_cpu_sigmoid_gate_fwd(const float *gl, const float *x, int64_t R, int64_t C, float *y,
                                  const mf_kctx *ctx) {
  if (R <= 0) return MF_OK;
  ew_args a = {0};
  a.g = gl, a.x = x, a.out0 = y, a.R = R, a.C = C, a.round_bf16 = ctx->round_bf16;
  ew_run(ctx, gate_fwd_task, &a, (double)R * (double)C);
  return MF_OK;
}

mf_status mf_cpu_sigmoid_gate_bwd(const float *gl, const float *x, const float *dy, int64_t R, int64_t C,
                                  float *dx, float *dgl, const mf_kctx *ctx) {
  if (R <= 0) return MF_OK;
  ew_args a = {0};
  a.g = gl, a.x = x, a.dy = dy, a.out0 = dx, a.out1 = dgl, a.R = R, a.C = C, a.round_bf16 = ctx->round_bf16;
  ew_run(ctx, gate_bwd_task, &a, (double)R * (double)C);
  return MF_OK;
}

/* ------------------------------------------------------------------- add */

static void add_task(void *arg, int i, int n) {
  const ew_args *a = (const ew_args *)arg;
  size_t b, e;
  mf_partition((size_t)a->n, EW_GRAIN, i, n, &b, &e);
  if (a->round_bf16) {
    for (size_t k = b; k < e; k++) a->out0[k] = mf_round_to_bf16(a->out0[k] + a->x[k]);
  } else {
    for (size_t k = b; k < e; k++) a->out0[k] += a->x[k];
  }
}

mf_status mf_cpu_add(const float *x, int64_t n, float *y, const mf_kctx *ctx) {
  if (n <= 0) return MF_OK;
  ew_args a = {0};
  a.x = x, a.out0 = y, a.n = n, a.round_bf16 = ctx->round_bf16;
  ew_run(ctx, add_task, &a, (double)n);
  return MF_OK;
}

/* --------------------------------------------------------------- dropout */

typedef struct drop_args {
  const float *x;
  float *y;
  int64_t n;
  uint64_t stream, seed;
  uint32_t threshold;
  float s;
  int round_bf16;
} drop_args;

static void dropout_task(void *arg, int i, int n) {
  const drop_args *a = (const drop_args *)arg;
  size_t b, e;
  mf_partition((size_t)a->n, EW_GRAIN, i, n, &b, &e);
  for (size_t k = b; k < e; k++)
    a->y[k] =
        mf_dropout_bits(a->seed, a->stream, k) >= a->threshold ? rnd(a->round_bf16, a->x[k] * a->s) : 0.0f;
}

mf_status mf_cpu_dropout(const float *x, int64_t n, uint64_t stream, uint64_t seed, double p, float *y,
                         const mf_kctx *ctx) {
  if (n <= 0) return MF_OK;
  if (!(p >= 0 && p < 1)) return MF_ERR(MF_ERR_INVALID_ARG, "dropout: p %g is outside [0, 1)", p);
  drop_args a = {x, y, n, stream, seed, mf_dropout_threshold(p), (float)(1.0 / (1.0 - p)), ctx->round_bf16};
  if ((double)n < EW_PARALLEL_MIN)
    dropout_task(&a, 0, 1);
  else
    mf_threadpool_run(ctx->pool, dropout_task, &a);
  return MF_OK;
}

typedef struct drop_parts_args {
  drop_args d;
  int64_t row, sources, parts;
  const int64_t *segments, *starts, *seeds;
} drop_parts_args;

/* The part holding row r: the last k with segments[k] <= r (segments rise), or -1 outside them all. */
static int64_t part_of(const drop_parts_args *a, int64_t r) {
  if (a->parts <= 0 || r < a->segments[0] || r >= a->segments[a->parts]) return -1;
  int64_t lo = 0, hi = a->parts; /* segments[lo] <= r < segments[hi] */
  while (hi - lo > 1) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (a->segments[mid] <= r)
      lo = mid;
    else
      hi = mid;
  }
  return lo;
}

static void dropout_parts_task(void *arg, int i, int n) {
  const drop_parts_args *a = (const drop_parts_args *)arg;
  const drop_args *d = &a->d;
  size_t b, e;
  mf_partition((size_t)d->n, EW_GRAIN, i, n, &b, &e);
  for (size_t k = b; k < e; k++) {
    const int64_t r = (int64_t)k / a->row, c = (int64_t)k % a->row, part = part_of(a, r);
    if (part < 0) {
      d->y[k] = 0.0f;
      continue;
    }
    const uint64_t j = (uint64_t)((a->starts[part] + r - a->segments[part]) * a->row + c);
    const uint64_t seed = (uint64_t)a->seeds[part % a->sources];
    d->y[k] = mf_dropout_bits(seed, d->stream, j) >= d->threshold ? rnd(d->round_bf16, d->x[k] * d->s) : 0.0f;
  }
}

mf_status mf_cpu_dropout_parts(const float *x, int64_t n, uint64_t stream, double p, int64_t row,
                               const int64_t *segments, const int64_t *starts, const int64_t *seeds,
                               int64_t sources, int64_t parts, float *y, const mf_kctx *ctx) {
  if (n <= 0) return MF_OK;
  if (!(p >= 0 && p < 1)) return MF_ERR(MF_ERR_INVALID_ARG, "dropout: p %g is outside [0, 1)", p);
  MF_CHECK(mf_dropout_parts_sizes(n, row, sources, parts, segments && starts && seeds));
  for (int64_t k = 0; k <= parts; k++) {
    const int ok = segments[k] >= 0 && segments[k] <= n / row && (k == 0 || segments[k] >= segments[k - 1]) &&
                   (k == parts || starts[k] >= 0);
    if (!ok)
      return MF_ERR(MF_ERR_INVALID_ARG,
                    "dropout: part %lld: segment %lld, start %lld, in %lld rows (segments rise; starts >= 0)",
                    (long long)k, (long long)segments[k], k < parts ? (long long)starts[k] : 0LL,
                    (long long)(n / row));
  }
  const float sc = (float)(1.0 / (1.0 - p));
  const drop_args d = {x, y, n, stream, 0, mf_dropout_threshold(p), sc, ctx->round_bf16};
  drop_parts_args a = {d, row, sources, parts, segments, starts, seeds};
  if ((double)n < EW_PARALLEL_MIN)
    dropout_parts_task(&a, 0, 1);
  else
    mf_threadpool_run(ctx->pool, dropout_parts_task, &a);
  return MF_OK;
}

/* ----------------------------------------------------------------- scale */

static void scale_task(void *arg, int i, int n) {
  const ew_args *a = (const ew_args *)arg;
  size_t b, e;
  mf_partition((size_t)a->n, EW_GRAIN, i, n, &b, &e);
  for (size_t k = b; k < e; k++) a->out0[k] = rnd(a->round_bf16, a->out0[k] * a->s);
}

mf_status mf_cpu_scale(float *x, int64_t n, float s, const mf_kctx *ctx) {
  if (n <= 0) return MF_OK;
  ew_args a = {0};
  a.out0 = x, a.n = n, a.s = s, a.round_bf16 = ctx->round_bf16;
  ew_run(ctx, scale_task, &a, (double)n);
  return MF_OK;
}
