/* Measuring a hardware profile on the cpu or the cuda backend (hwmeasure.h):
 * the timing, the benchmarks through the backend interface, the machine.
 * The profile's notes and hardware.profile auto are in hwmeasure_run.c, the
 * step program's timer in hwmeasure_prog.c. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/registry.h"
#include "src/optim/optim.h"
#include "src/train/hwmeasure_internal.h"

/* ------------------------------------------------------------ timing */

/* n calls of fn: on the host's clock (c NULL: fn does host work), or between
 * two timed events on c's stream (fn submits work to it; the stream is then
 * synchronized, so the time is the stream's, queueing included). */
static mf_status time_calls(bench_fn fn, void *ctx, const mf_bench_clock *c, long n, double *sec) {
  if (!c) {
    const double t0 = mf_time_now();
    for (long i = 0; i < n; i++) MF_CHECK(fn(ctx));
    *sec = mf_time_now() - t0;
    return MF_OK;
  }
  MF_CHECK(c->b->event_record(c->b, c->e0, c->s));
  for (long i = 0; i < n; i++) MF_CHECK(fn(ctx));
  MF_CHECK(c->b->event_record(c->b, c->e1, c->s));
  MF_CHECK(c->b->stream_sync(c->b, c->s));
  return c->b->event_elapsed(c->b, c->e0, c->e1, sec);
}

mf_status mf_bench_best(bench_fn fn, void *ctx, const mf_bench_clock *c, const mf_bench_run *ri, double *best) {
  double one = 0;
  MF_CHECK(time_calls(fn, ctx, c, 1, &one)); /* warm-up, and how many calls make a run */
  long inner = one > 0 ? (long)(ri->min_run / one) : 1000;
  if (inner < 1) inner = 1;
  if (inner > 100000) inner = 100000;
  *best = INFINITY;
  for (int r = 0; r < ri->reps; r++) {
    double t = 0;
    MF_CHECK(time_calls(fn, ctx, c, inner, &t));
    t /= (double)inner;
    if (t < *best) *best = t;
  }
  if (!(*best > 0)) *best = 1e-9; /* a clock too coarse for the call: keep rates finite */
  return MF_OK;
}

double mf_bench_round_sig(double x, int digits, int down) {
  if (!(x > 0) || !isfinite(x)) return x;
  double e = pow(10.0, floor(log10(x)) - (digits - 1));
  double r = (down ? floor(x / e) : nearbyint(x / e)) * e;
  return r > 0 ? r : x;
}

/* x[0, n) of dtype dt (F32 or BF16) = values in [-0.5, 0.5) from seed. */
static void fill(void *x, size_t n, uint32_t seed, mf_dtype dt) {
  for (size_t i = 0; i < n; i++) {
    seed = seed * 1664525u + 1013904223u;
    const float v = (float)((double)(seed >> 8) / 16777216.0 - 0.5);
    if (dt == MF_DTYPE_BF16)
      ((uint16_t *)x)[i] = mf_fp32_to_bf16(v);
    else
      ((float *)x)[i] = v;
  }
}

/* ------------------------------------------------------------ the bench */

void mf_bench_free(mf_bench *kb) {
  if (!kb->b) return;
  mf_backend *b = kb->b;
  if (kb->host) b->host_free(b, kb->host);
  mf_event *ev[] = {kb->clk.e0, kb->clk.e1, kb->fork, kb->join};
  for (int i = 0; i < 4; i++)
    if (ev[i]) b->event_free(b, ev[i]);
  if (kb->s2) b->stream_free(b, kb->s2);
  if (kb->clk.s) b->stream_free(b, kb->clk.s);
  mf_backend_free(b);
  memset(kb, 0, sizeof *kb);
}

mf_status mf_bench_create(const char *backend, mf_threadpool *pool, mf_dtype storage, size_t arena_bytes,
                          size_t host_bytes, uint64_t scratch_bytes, mf_bench *kb) {
  memset(kb, 0, sizeof *kb);
  const mf_backend_params bp = {
      .pool = pool, .streams = MF_CPU_STREAMS_IMMEDIATE, .scratch_bytes = scratch_bytes};
  MF_CHECK(mf_backend_create(backend, &bp, &kb->b));
  mf_backend *b = kb->b;
  kb->storage = storage;
  kb->elt = mf_dtype_size(storage);
  kb->clk.b = b;
  mf_status st = MF_OK;
  if (!b->event_create_timed || !b->event_elapsed)
    MF_CHECK_GOTO(MF_ERR(MF_ERR_UNSUPPORTED, "profile: the %s backend does not time its streams", b->name), st, fail);
  MF_CHECK_GOTO(b->stream_create(b, &kb->clk.s), st, fail);
  MF_CHECK_GOTO(b->stream_create(b, &kb->s2), st, fail);
  MF_CHECK_GOTO(b->event_create_timed(b, &kb->clk.e0), st, fail);
  MF_CHECK_GOTO(b->event_create_timed(b, &kb->clk.e1), st, fail);
  MF_CHECK_GOTO(b->event_create(b, &kb->fork), st, fail);
  MF_CHECK_GOTO(b->event_create(b, &kb->join), st, fail);
  void *base = NULL, *host = NULL;
  MF_CHECK_GOTO(b->arena_create(b, arena_bytes, &base), st, fail);
  kb->arena = base;
  kb->arena_bytes = arena_bytes;
  MF_CHECK_GOTO(b->host_alloc(b, host_bytes, &host), st, fail);
  kb->host = host;
  kb->host_bytes = host_bytes;
  return MF_OK;
fail:
  mf_bench_free(kb);
  return st;
}

/* dst (n elements of the bench's storage, in the arena) = fill(seed),
 * uploaded through the host buffer a part at a time. */
mf_status mf_bench_upload(mf_bench *kb, void *dst, size_t n, uint32_t seed) {
  if ((uint8_t *)dst + n * kb->elt > kb->arena + kb->arena_bytes)
    return MF_ERR(MF_ERR_INTERNAL, "profile: %zu elements do not fit the benchmark's arena", n);
  const size_t part = kb->host_bytes / kb->elt;
  for (size_t at = 0; at < n; at += part) {
    const size_t m = n - at < part ? n - at : part;
    fill(kb->host, m, seed + (uint32_t)(at / part), kb->storage);
    MF_CHECK(kb->b->copy(kb->b, (uint8_t *)dst + at * kb->elt, kb->host, m * kb->elt, MF_COPY_H2D, kb->clk.s));
    MF_CHECK(kb->b->stream_sync(kb->b, kb->clk.s)); /* before the host buffer is filled again */
  }
  return MF_OK;
}

/* Operand j of call k (its kind and sizes set): ptr, bytes, whether the
 * kernel writes it, and its dtype in the bench's storage (the operand table's words). */
void mf_bench_operand(const mf_bench *kb, mf_kernel_call *k, int j, void *ptr, size_t bytes) {
  k->b[j] = (mf_kbuf){ptr, bytes, (int)(mf_kernel_writes(k) >> j & 1u),
                      mf_kop_type_dtype(mf_kernel_info_of(k->kind)->b[j].type, kb->storage)};
}

/* ------------------------------------------------------------ benches */

typedef struct kernel_job {
  mf_bench *kb;
  mf_kernel_call call;
} kernel_job;

static mf_status run_kernel(void *ctx) {
  kernel_job *j = ctx;
  return j->kb->b->run(j->kb->b, &j->call, j->kb->clk.s);
}

typedef struct copy_job {
  mf_bench *kb;
  void *dst;
  const void *src;
  size_t bytes;
  mf_copy_kind kind;
} copy_job;

static mf_status run_copy(void *ctx) {
  copy_job *j = ctx;
  return j->kb->b->copy(j->kb->b, j->dst, j->src, j->bytes, j->kind, j->kb->clk.s);
}

/* An upload on the timed stream and a download on the second at once: the
 * second forks from the first and joins it again, so the timed stream's
 * events span both. */
typedef struct duplex_job {
  copy_job up, down;
} duplex_job;

static mf_status run_duplex(void *ctx) {
  duplex_job *j = ctx;
  mf_bench *kb = j->up.kb;
  mf_backend *b = kb->b;
  MF_CHECK(b->event_record(b, kb->fork, kb->clk.s));
  MF_CHECK(b->stream_wait(b, kb->s2, kb->fork));
  MF_CHECK(run_copy(&j->up));
  MF_CHECK(b->copy(b, j->down.dst, j->down.src, j->down.bytes, j->down.kind, kb->s2));
  MF_CHECK(b->event_record(b, kb->join, kb->s2));
  return b->stream_wait(b, kb->clk.s, kb->join);
}

static void empty_task(void *ctx, int i, int n) {}

static mf_status run_dispatch(void *ctx) {
  mf_threadpool_run(ctx, empty_task, NULL);
  return MF_OK;
}

/* links.h2d / d2h: 64 MiB copies each way, latency from 4 KiB ones; with
 * `both` (cuda) also both directions at once (*duplex: each direction's
 * bytes/s) and a device-to-device copy (*d2d: bytes read + written per s). */
mf_status mf_bench_links(mf_hwprofile *p, mf_bench *kb, const mf_bench_run *ri, int both, double *duplex,
                         double *d2d) {
  const size_t big = MF_BENCH_COPY_BYTES, small = 4096;
  if (2 * big > kb->host_bytes || 2 * big > kb->arena_bytes)
    return MF_ERR(MF_ERR_INTERNAL, "profile: the copies do not fit the benchmark's buffers");
  uint8_t *dev2 = kb->arena + big, *host2 = kb->host + big;
  memset(kb->host, 1, 2 * big); /* fault the pages in before timing */
  copy_job up = {kb, kb->arena, kb->host, big, MF_COPY_H2D}, down = {kb, host2, dev2, big, MF_COPY_D2H};
  copy_job tiny = {kb, kb->arena, kb->host, small, MF_COPY_H2D};
  MF_CHECK(run_copy(&up));
  double t_h2d, t_d2h, t_small;
  MF_CHECK(mf_bench_best(run_copy, &up, &kb->clk, ri, &t_h2d));
  MF_CHECK(mf_bench_best(run_copy, &down, &kb->clk, ri, &t_d2h));
  MF_CHECK(mf_bench_best(run_copy, &tiny, &kb->clk, ri, &t_small));
  p->h2d_bandwidth = mf_bench_round_sig((double)big / t_h2d, 3, 0);
  p->d2h_bandwidth = mf_bench_round_sig((double)big / t_d2h, 3, 0);
  double bw = p->h2d_bandwidth > p->d2h_bandwidth ? p->h2d_bandwidth : p->d2h_bandwidth;
  double lat = t_small - (double)small / bw;
  p->h2d_latency_s = p->d2h_latency_s = lat > 0 ? mf_bench_round_sig(lat * 1e6, 2, 0) / 1e6 : 0;
  *duplex = *d2d = 0;
  if (!both) return MF_OK;
  duplex_job dj = {up, down};
  copy_job dd = {kb, dev2, kb->arena, big, MF_COPY_D2D};
  double t_both, t_dd;
  MF_CHECK(mf_bench_best(run_duplex, &dj, &kb->clk, ri, &t_both));
  MF_CHECK(mf_bench_best(run_copy, &dd, &kb->clk, ri, &t_dd));
  *duplex = mf_bench_round_sig((double)big / t_both, 3, 0);
  *d2d = mf_bench_round_sig(2.0 * (double)big / t_dd, 3, 0);
  return MF_OK;
}

mf_status mf_bench_dispatch(mf_threadpool *pool, const mf_bench_run *ri, double *launch_s) {
  double t;
  MF_CHECK(mf_bench_best(run_dispatch, pool, NULL, ri, &t));
  *launch_s = mf_bench_round_sig(t * 1e6, 2, 0) / 1e6;
  return MF_OK;
}

/* An add kernel of n elements over x, y at the arena's start. */
static kernel_job add_job(mf_bench *kb, int64_t n) {
  const size_t bytes = (size_t)n * kb->elt;
  kernel_job add = {kb, {.kind = MF_K_ADD, .i = {n, 0}, .label = "profile add"}};
  mf_bench_operand(kb, &add.call, 0, kb->arena, bytes);
  mf_bench_operand(kb, &add.call, 1, kb->arena + bytes, bytes);
  return add;
}

mf_status mf_bench_launch(mf_bench *kb, const mf_bench_run *ri, double *launch_s) {
  const int64_t n = 256;
  MF_CHECK(mf_bench_upload(kb, kb->arena, 2 * (size_t)n, 7));
  kernel_job add = add_job(kb, n);
  double t;
  MF_CHECK(mf_bench_best(run_kernel, &add, &kb->clk, ri, &t));
  *launch_s = mf_bench_round_sig(t * 1e6, 2, 0) / 1e6;
  return MF_OK;
}

mf_status mf_bench_bandwidth(mf_bench *kb, const mf_bench_run *ri, double launch_s, double *bw) {
  const int64_t n = (int64_t)16 << 20;
  const size_t bytes = (size_t)n * kb->elt;
  MF_CHECK(mf_bench_upload(kb, kb->arena, (size_t)n, 1));
  kernel_job zero = {kb, {.kind = MF_K_ZERO, .label = "profile y"}};
  mf_bench_operand(kb, &zero.call, 0, kb->arena + bytes, bytes);
  MF_CHECK(run_kernel(&zero));
  kernel_job add = add_job(kb, n);
  double t_big;
  MF_CHECK(mf_bench_best(run_kernel, &add, &kb->clk, ri, &t_big));
  double t = t_big - launch_s > 0.5 * t_big ? t_big - launch_s : 0.5 * t_big;
  *bw = mf_bench_round_sig(3.0 * (double)bytes / t, 3, 0); /* x read, y read and written */
  return MF_OK;
}

mf_status mf_bench_gemm(mf_hwprofile *p, mf_bench *kb, const mf_bench_run *ri, const int64_t *sizes, int n_sizes) {
  const int64_t max = sizes[n_sizes - 1];
  const size_t mm = (size_t)(max * max);
  uint8_t *x = kb->arena, *w = x + mm * kb->elt, *y = w + mm * kb->elt;
  if (y + mm * kb->elt > kb->arena + kb->arena_bytes)
    return MF_ERR(MF_ERR_INTERNAL, "profile: the GEMM operands do not fit the benchmark's arena");
  MF_CHECK(mf_bench_upload(kb, x, mm, 2));
  MF_CHECK(mf_bench_upload(kb, w, mm, 3));
  double prev_t = 0;
  for (int i = 0; i < n_sizes; i++) {
    const int64_t s = sizes[i];
    const size_t bytes = (size_t)(s * s) * kb->elt;
    kernel_job j = {kb, {.kind = MF_K_LINEAR_FWD, .i = {s, s, s, 0}, .label = "profile gemm"}};
    mf_bench_operand(kb, &j.call, 0, x, bytes);
    mf_bench_operand(kb, &j.call, 1, w, bytes);
    mf_bench_operand(kb, &j.call, 3, y, bytes);
    double t;
    MF_CHECK(mf_bench_best(run_kernel, &j, &kb->clk, ri, &t));
    double work = 2.0 * (double)s * (double)s * (double)s;
    /* the profile adds launch_s to every GEMM: the table's rate is the rest */
    double tc = t - p->launch_s > 0.5 * t ? t - p->launch_s : 0.5 * t;
    double rate = mf_bench_round_sig(work / tc, 3, 0);
    if (work / rate < prev_t)
      rate = mf_bench_round_sig(work / prev_t, 3, 1); /* noise: a bigger GEMM is never faster */
    prev_t = work / rate;
    p->gemm[i] = (mf_hw_gemm_point){.m = (double)s, .n = (double)s, .k = (double)s, .flops = rate};
  }
  p->n_gemm = n_sizes;
  return MF_OK;
}

/* Causal attention forward and backward at B sequences of S tokens, head
 * dim D: the calls over buffers laid out for the largest shape (nq, nkv
 * elements per q, kv; then lse, fp32). */
static void attention_calls(mf_bench *kb, const mf_bench_attn *a, size_t nq, size_t nkv, int64_t B, int64_t S,
                            int64_t D, kernel_job *fwd, kernel_job *bwd) {
  const size_t e = kb->elt;
  uint8_t *buf = kb->arena;
  uint8_t *q = buf, *k = buf + nq * e, *v = buf + (nq + nkv) * e, *dout = buf + (nq + 2 * nkv) * e;
  uint8_t *o = buf + (2 * nq + 2 * nkv) * e, *dq = buf + (3 * nq + 2 * nkv) * e, *dk = buf + (4 * nq + 2 * nkv) * e;
  uint8_t *dv = buf + (4 * nq + 3 * nkv) * e, *lse = buf + (4 * nq + 4 * nkv) * e;
  const size_t bq = (size_t)(B * S * a->hq * D) * e, bkv = (size_t)(B * S * a->hkv * D) * e;
  const size_t bl = (size_t)(B * S * a->hq) * sizeof(float);
  const int64_t i[] = {B, S, a->hq, a->hkv, D};
  fwd->call = (mf_kernel_call){.kind = MF_K_ATTN_FWD, .f = {1.0f / sqrtf((float)D)}, .label = "profile attn"};
  bwd->call = (mf_kernel_call){.kind = MF_K_ATTN_BWD, .f = {1.0f / sqrtf((float)D)}, .label = "profile attn"};
  memcpy(fwd->call.i, i, sizeof i);
  memcpy(bwd->call.i, i, sizeof i);
  uint8_t *const fb[] = {q, k, v, o, lse}, *const bb[] = {q, k, v, o, dout, lse, dq, dk, dv};
  const size_t fs[] = {bq, bkv, bkv, bq, bl}, bs[] = {bq, bkv, bkv, bq, bq, bl, bq, bkv, bkv};
  for (int j = 0; j < 5; j++) mf_bench_operand(kb, &fwd->call, j, fb[j], fs[j]);
  for (int j = 0; j < 9; j++) mf_bench_operand(kb, &bwd->call, j, bb[j], bs[j]);
}

mf_status mf_bench_attention(mf_hwprofile *p, mf_bench *kb, const mf_bench_run *ri, const mf_bench_attn *a,
                             int n_shapes) {
  size_t nq = 0, nkv = 0, nl = 0; /* the largest shape's elements */
  for (int i = 0; i < n_shapes; i++) {
    const int64_t S = a->shapes[i][0], D = a->shapes[i][1], B = a->tokens ? a->tokens / S : 1;
    if ((size_t)(B * S * a->hq * D) > nq) nq = (size_t)(B * S * a->hq * D);
    if ((size_t)(B * S * a->hkv * D) > nkv) nkv = (size_t)(B * S * a->hkv * D);
    if ((size_t)(B * S * a->hq) > nl) nl = (size_t)(B * S * a->hq);
  }
  /* q, o, dout, dq: nq each; k, v, dk, dv: nkv each; then lse (fp32) */
  if ((4 * nq + 4 * nkv) * kb->elt + nl * sizeof(float) > kb->arena_bytes)
    return MF_ERR(MF_ERR_INTERNAL, "profile: the attention buffers do not fit the benchmark's arena");
  MF_CHECK(mf_bench_upload(kb, kb->arena, 4 * nq + 4 * nkv, 4));
  for (int i = 0; i < n_shapes; i++) {
    const int64_t S = a->shapes[i][0], D = a->shapes[i][1], B = a->tokens ? a->tokens / S : 1;
    kernel_job fwd = {.kb = kb}, bwd = {.kb = kb};
    attention_calls(kb, a, nq, nkv, B, S, D, &fwd, &bwd);
    double tf, tb; /* the forward first: the backward reads its o and lse */
    MF_CHECK(mf_bench_best(run_kernel, &fwd, &kb->clk, ri, &tf));
    MF_CHECK(mf_bench_best(run_kernel, &bwd, &kb->clk, ri, &tb));
    double flops = mf_hw_attention_flops((double)B, (double)S, (double)a->hq, (double)D, 0) +
                   mf_hw_attention_flops((double)B, (double)S, (double)a->hq, (double)D, 1);
    double t = tf + tb - 2 * p->launch_s > 0.5 * (tf + tb) ? tf + tb - 2 * p->launch_s : 0.5 * (tf + tb);
    p->attn[i] = (mf_hw_attn_point){.s = (double)S, .d = (double)D, .flops = mf_bench_round_sig(flops / t, 3, 0)};
  }
  p->n_attn = n_shapes;
  return MF_OK;
}

typedef struct adamw_job {
  mf_adamw_hparams h;
  float *p, *g, *m, *v;
  uint16_t *bf16;
  size_t n;
  mf_threadpool *pool;
  int64_t step;
} adamw_job;

static mf_status run_adamw(void *ctx) {
  adamw_job *j = ctx;
  return mf_adamw_update(&j->h, ++j->step, j->p, j->g, j->m, j->v, j->n, j->bf16, j->pool);
}

mf_status mf_bench_adamw(mf_hwprofile *p, mf_threadpool *pool, const mf_bench_run *ri) {
  const size_t n = (size_t)16 << 20;
  float *buf = NULL;
  uint16_t *bf16 = NULL;
  mf_status st = mf_malloc(4 * n * sizeof(float), "AdamW buffers", (void **)&buf);
  if (st == MF_OK) st = mf_malloc(n * sizeof(uint16_t), "AdamW bf16 copy", (void **)&bf16);
  if (st == MF_OK) {
    fill(buf, 2 * n, 5, MF_DTYPE_F32);             /* p, g */
    memset(buf + 2 * n, 0, 2 * n * sizeof(float)); /* m, v */
    adamw_job j = {.h = {.lr = 1e-4, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1},
                   .p = buf,
                   .g = buf + n,
                   .m = buf + 2 * n,
                   .v = buf + 3 * n,
                   .bf16 = bf16,
                   .n = n,
                   .pool = pool};
    double t;
    st = mf_bench_best(run_adamw, &j, NULL, ri, &t);
    if (st == MF_OK) p->host_adamw_params_per_s = mf_bench_round_sig((double)n / t, 3, 0);
  }
  free(buf);
  free(bf16);
  return st;
}

/* ------------------------------------------------------------ machine */

void mf_bench_cpu_model(char *buf, size_t cap) {
  snprintf(buf, cap, "unknown CPU");
  FILE *f = fopen("/proc/cpuinfo", "r");
  if (!f) return;
  char line[512];
  while (fgets(line, sizeof line, f)) {
    if (strncmp(line, "model name", 10) != 0) continue;
    const char *v = strchr(line, ':');
    if (!v) break;
    for (v++; *v == ' ' || *v == '\t'; v++) {
    }
    snprintf(buf, cap, "%s", v);
    buf[strcspn(buf, "\n")] = 0;
    break;
  }
  fclose(f);
}
