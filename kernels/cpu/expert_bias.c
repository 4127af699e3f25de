/*
 * A per-expert bias over the expert-sorted rows of the grouped expert GEMMs
 * (gpt-oss's gate_up_proj_bias [E, 2I] and down_proj_bias [E, H]). Rows of
 * expert e are [offsets[e], offsets[e+1]) (offsets int64 [E+1], as
 * mf_cpu_expert_fwd's); y, dy [R, N]; bias [E, N]; db [E, N] fp32.
 *
 *   fwd:  y[r,:] += bias[e,:]  for every row r of e                (added)
 *   bwd:  db[e,:] += sum over r of e, in row order, of dy[r,:]      (added, fp32)
 *
 * The forward's threads own contiguous ranges of rows (each element is one
 * add); the backward's own (expert, block of BB columns) units, each summing
 * its rows in order into a local sum that is then added to db once — so the
 * bits never depend on the thread count. An expert without rows keeps its db
 * as it is (not even 0 added: -0 stays -0).
 */
#include <string.h>

#include "kernels/cpu/cpu_ops.h"

#define BB 256       /* columns per backward unit */
#define FWD_GRAIN 16 /* rows per forward partition unit */

typedef struct eb_args {
  const float *in;
  const int64_t *offsets;
  float *out;
  int64_t E, N;
  int round_bf16;
  const int64_t *segments; /* bwd in parts: expert e's rows in `sources` parts (NULL: one) */
  int64_t sources;
} eb_args;

static void fwd_task(void *arg, int i, int n) {
  const eb_args *a = (const eb_args *)arg;
  const int64_t E = a->E, N = a->N;
  size_t b, end;
  mf_partition((size_t)a->offsets[E], FWD_GRAIN, i, n, &b, &end);
  int64_t e = 0;
  for (int64_t r = (int64_t)b; r < (int64_t)end; r++) {
    while (e < E && a->offsets[e + 1] <= r) e++; /* the expert whose rows hold r */
    const float *bias = a->in + e * N;
    float *y = a->out + r * N;
    if (a->round_bf16)
      for (int64_t c = 0; c < N; c++) y[c] = mf_round_to_bf16(y[c] + bias[c]);
    else
      for (int64_t c = 0; c < N; c++) y[c] += bias[c];
  }
}

static void bwd_task(void *arg, int i, int n) {
  const eb_args *a = (const eb_args *)arg;
  const int64_t N = a->N, blocks = (N + BB - 1) / BB;
  size_t b, end;
  mf_partition((size_t)(a->E * blocks), 1, i, n, &b, &end);
  for (size_t q = b; q < end; q++) {
    const int64_t e = (int64_t)q / blocks, c0 = ((int64_t)q % blocks) * BB;
    const int64_t w = N - c0 < BB ? N - c0 : BB;
    const int64_t parts = a->segments ? a->sources : 1;
    for (int64_t p = 0; p < parts; p++) { /* each part summed from 0, then added */
      const int64_t r0 = a->segments ? a->segments[e * parts + p] : a->offsets[e];
      const int64_t r1 = a->segments ? a->segments[e * parts + p + 1] : a->offsets[e + 1];
      if (r1 <= r0) continue;
      float s[BB];
      memset(s, 0, sizeof s);
      for (int64_t r = r0; r < r1; r++) {
        const float *dy = a->in + r * N + c0;
        for (int64_t c = 0; c < w; c++) s[c] += dy[c];
      }
      float *db = a->out + e * N + c0;
      for (int64_t c = 0; c < w; c++) db[c] += s[c];
    }
  }
}

mf_status mf_cpu_expert_bias_fwd(const float *bias, const int64_t *offsets, int64_t R, int64_t E, int64_t N,
                                 float *y, const mf_kctx *ctx) {
  if (E <= 0 || N <= 0) return MF_OK;
  if (offsets[0] != 0 || offsets[E] > R)
    return MF_ERR(MF_ERR_INVALID_ARG, "expert_bias_fwd: offsets from %lld to %lld over %lld rows",
                  (long long)offsets[0], (long long)offsets[E], (long long)R);
  eb_args a = {bias, offsets, y, E, N, ctx->round_bf16, NULL, 0};
  if (offsets[E] * N < (1 << 15))
    fwd_task(&a, 0, 1);
  else
    mf_threadpool_run(ctx->pool, fwd_task, &a);
  return MF_OK;
}

mf_status mf_cpu_expert_bias_bwd(const float *dy, const int64_t *offsets, int64_t E, int64_t N, float *db,
                                 const mf_kctx *ctx) {
  return mf_cpu_expert_bias_bwd_parts(dy, offsets, NULL, E, N, 1, db, ctx);
}

mf_status mf_cpu_expert_bias_bwd_parts(const float *dy, const int64_t *offsets, const int64_t *segments,
                                       int64_t E, int64_t N, int64_t sources, float *db, const mf_kctx *ctx) {
  if (E <= 0 || N <= 0) return MF_OK;
  if (segments) MF_CHECK(mf_cpu_expert_parts_check("expert_bias_bwd", offsets, segments, E, sources));
  eb_args a = {dy, offsets, db, E, N, 0, segments, sources}; /* db is an fp32 gradient sum: never rounded */
  if (offsets[E] * N < (1 << 15))
    bwd_task(&a, 0, 1);
  else
    mf_threadpool_run(ctx->pool, bwd_task, &a);
  return MF_OK;
}
