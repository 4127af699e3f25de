/*
 * gpt-oss's clamped SwiGLU on the cpu backend (transformers' GptOssExperts._apply_gate):
 *
 *   fwd:  g' = min(g, limit)   (no lower clamp)
 *         u' = clamp(u, -limit, limit)
 *         s  = sigmoid(alpha * g'),  glu = g' * s
 *         act = (u' + 1) * glu                                      (written)   g, u, act [n]
 *   bwd:  dg = dact * (u' + 1) * (s + alpha * g' * s * (1 - s))   where g <= limit, else 0
 *         du = dact * glu                                          where -limit <= u <= limit, else 0
 *                                                                   (written)
 *
 * torch.clamp passes the gradient where min <= x <= max (inclusive), so at
 * g = limit the gate still gets one. A NaN g or u stays NaN in the forward (the
 * clamps are comparisons, not fminf) and gets no gradient. All in fp32; for
 * large |g| e^(-alpha g') overflows to inf (s = 0) or underflows (s = 1) and
 * every formula stays finite. Each element depends only on its own inputs, so
 * any thread count gives the same bits.
 */
#include <math.h>

#include "kernels/cpu/cpu_ops.h"

#define SC_GRAIN 4096 /* elements per partition unit */
#define SC_PARALLEL_MIN (1 << 15)

typedef struct sc_args {
  const float *g, *u, *dact;
  float *out0, *out1;
  int64_t n;
  float limit, alpha;
  int round_bf16;
} sc_args;

static inline float rnd(int round_bf16, float v) {
  return round_bf16 ? mf_round_to_bf16(v) : v;
}

static void run(const mf_kctx *ctx, mf_task_fn fn, sc_args *a) {
  if (a->n < SC_PARALLEL_MIN || !ctx->pool)
    fn(a, 0, 1);
  else
    mf_threadpool_run(ctx->pool, fn, a);
}

static void fwd_task(void *arg, int i, int n) {
  const sc_args *a = (const sc_args *)arg;
  size_t b, e;
  mf_partition((size_t)a->n, SC_GRAIN, i, n, &b, &e);
  const float lim = a->limit;
  for (size_t k = b; k < e; k++) {
    const float g = a->g[k] > lim ? lim : a->g[k];
    const float u = a->u[k] > lim ? lim : a->u[k] < -lim ? -lim : a->u[k];
    const float s = 1.0f / (1.0f + expf(-(a->alpha * g)));
    const float glu = g * s;
    a->out0[k] = rnd(a->round_bf16, (u + 1.0f) * glu);
  }
}

static void bwd_task(void *arg, int i, int n) {
  const sc_args *a = (const sc_args *)arg;
  size_t b, e;
  mf_partition((size_t)a->n, SC_GRAIN, i, n, &b, &e);
  const float lim = a->limit, alpha = a->alpha;
  for (size_t k = b; k < e; k++) {
    const float g0 = a->g[k], u0 = a->u[k], d = a->dact[k];
    const float g = g0 > lim ? lim : g0;
    const float u = u0 > lim ? lim : u0 < -lim ? -lim : u0;
    const float s = 1.0f / (1.0f + expf(-(alpha * g)));
    const float glu = g * s;
    const float dglu = s + alpha * g * s * (1.0f - s);
    a->out0[k] = rnd(a->round_bf16, g0 <= lim ? d * (u + 1.0f) * dglu : 0.0f);
    a->out1[k] = rnd(a->round_bf16, u0 >= -lim && u0 <= lim ? d * glu : 0.0f);
  }
}

mf_status mf_cpu_swiglu_clamp_fwd(const float *g, const float *u, int64_t n, float limit, float alpha,
                                  float *act, const mf_kctx *ctx) {
  if (n <= 0) return MF_OK;
  sc_args a = {0};
  a.g = g, a.u = u, a.out0 = act, a.n = n, a.limit = limit, a.alpha = alpha, a.round_bf16 = ctx->round_bf16;
  run(ctx, fwd_task, &a);
  return MF_OK;
}

mf_status mf_cpu_swiglu_clamp_bwd(const float *g, const float *u, const float *dact, int64_t n, float limit,
                                  float alpha, float *dg, float *du, const mf_kctx *ctx) {
  if (n <= 0) return MF_OK;
  sc_args a = {0};
  a.g = g, a.u = u, a.dact = dact, a.out0 = dg, a.out1 = du, a.n = n, a.limit = limit, a.alpha = alpha;
  a.round_bf16 = ctx->round_bf16;
  run(ctx, bwd_task, &a);
  return MF_OK;
}
