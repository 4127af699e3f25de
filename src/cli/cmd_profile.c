/* `moefit profile`: measures this machine's hardware profile for the planner's
 * cost model (planner/hwprofile.h) and writes it as YAML.
 *
 * On the cpu backend the "device" is host memory and every kernel is one of
 * moefit's cpu kernels on the thread pool; each figure is measured through the
 * cpu backend itself (kernels/backend.h: its copy and run, operands in its
 * arena), as the executor drives it. Every measurement is the best of several runs (a
 * shared machine is noisy one way: slower), each run long enough (~20 ms) for
 * the clock. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "kernels/backend.h"
#include "planner/hwprofile.h"
#include "planner/simulate.h"
#include "src/cli/commands.h"
#include "src/config/config.h"
#include "src/core/core.h"
#include "src/core/hostbuf.h"
#include "src/exec/exec.h"
#include "src/model/params.h"
#include "src/model/program.h"
#include "src/optim/optim.h"

static const char k_usage[] =
    "usage: moefit profile [--backend cpu|cuda] [--out FILE.yaml] [--quick] [--config CONFIG.yaml]\n"
    "\n"
    "Measures this machine's hardware profile for the planner's cost model and writes it\n"
    "as YAML (the format is in planner/hwprofile.h; configs/hw/ has bundled profiles).\n"
    "\n"
    "  --backend cpu|cuda  what to measure (default cpu). cpu: the device is host memory and\n"
    "                      the kernels are moefit's cpu kernels on all cores (MF_THREADS=N\n"
    "                      to use fewer). cuda: not built yet.\n"
    "  --out FILE          where to write (default runs/hw/cpu.yaml; directories are created;\n"
    "                      the file is replaced atomically)\n"
    "  --quick             fewer shapes and repeats: about 10 s on 2 cores (default about 60 s)\n"
    "  --config CONFIG     also time every kernel call of the config's training step (its model,\n"
    "                      micro-batch, sequence length and accumulation) and write them to\n"
    "                      compute.kernels: the planner then prices those calls by their measured\n"
    "                      time instead of the rate tables (threads: the config's train.threads)\n"
    "\n"
    "Measured on cpu, each figure the best of several runs; copies and kernels are submitted to\n"
    "the cpu backend (its copy and run) with their device operands in its arena:\n"
    "  links.h2d / d2h          the backend's copies (a one-thread memcpy) of 64 MiB each way;\n"
    "                           latency from 4 KiB copies\n"
    "  compute.gemm             linear_fwd kernels (fp32) at square shapes 64^3 .. 1024^3\n"
    "                           (.. 2048^3 without --quick)\n"
    "  compute.attention        attn_fwd + attn_bwd kernels, causal, 8 query / 2 kv heads\n"
    "  compute.launch_us        an empty mf_threadpool_run (what each parallel cpu kernel pays)\n"
    "  compute.elementwise_bandwidth, host.memory_bandwidth\n"
    "                           an add kernel over 16M floats (12 bytes moved per element)\n"
    "  host.adamw_params_per_s  mf_adamw_update over 16M fp32 parameters, with the bf16 copy\n"
    "  host.memory              physical memory (the cgroup limit when lower)\n"
    "  compute.kernels          (--config) each kernel call of one training step, run by the\n"
    "                           executor with every tensor resident on random weights and tokens,\n"
    "                           in 5 rounds between the other measurements: each call's median over\n"
    "                           the fastest half of the steps, averaged over the calls with the\n"
    "                           same kernel, sizes and operand bytes\n"
    "Set, not measured: device.memory = half of host memory, device.reserve = 0,\n"
    "copies_overlap_compute = false (the cpu backend copies on the compute thread), no nvme.\n";

/* ------------------------------------------------------------ timing */

typedef mf_status (*bench_fn)(void *ctx);

typedef struct {
  int quick, reps, threads;
  double min_run; /* seconds one timed run lasts at least */
  const char *adamw_impl;
} run_info;

/* Best seconds per call of fn: one warm-up call, then ri->reps runs of enough
 * calls to last ri->min_run (at least one). */
static mf_status best_seconds(bench_fn fn, void *ctx, const run_info *ri, double *best) {
  double t0 = mf_time_now();
  MF_CHECK(fn(ctx));
  double one = mf_time_now() - t0;
  long inner = one > 0 ? (long)(ri->min_run / one) : 1000;
  if (inner < 1) inner = 1;
  if (inner > 100000) inner = 100000;
  *best = INFINITY;
  for (int r = 0; r < ri->reps; r++) {
    t0 = mf_time_now();
    for (long i = 0; i < inner; i++) MF_CHECK(fn(ctx));
    double t = (mf_time_now() - t0) / (double)inner;
    if (t < *best) *best = t;
  }
  if (!(*best > 0)) *best = 1e-9; /* a clock too coarse for the call: keep rates finite */
  return MF_OK;
}

/* x to `digits` significant digits, rounded down (so a time it divides grows). */
static double round_sig(double x, int digits, int down) {
  if (!(x > 0) || !isfinite(x)) return x;
  double e = pow(10.0, floor(log10(x)) - (digits - 1));
  double r = (down ? floor(x / e) : nearbyint(x / e)) * e;
  return r > 0 ? r : x;
}

static void fill(float *x, size_t n, uint32_t seed) {
  for (size_t i = 0; i < n; i++) {
    seed = seed * 1664525u + 1013904223u;
    x[i] = (float)((double)(seed >> 8) / 16777216.0 - 0.5);
  }
}

/* ------------------------------------------------------------ benches */

/* The copies and kernels are timed as the executor runs them: submitted to
 * the cpu backend (copy, run) on its one stream, with their device operands
 * in its arena, each timed call followed by a stream_sync (which returns at
 * once on the cpu backend's immediate streams). */
typedef struct kbench {
  mf_backend *b;
  mf_stream *s;
  uint8_t *arena; /* the device arena, arena_bytes */
  size_t arena_bytes;
  float *host; /* host staging, host_bytes: what uploads go through */
  size_t host_bytes;
} kbench;

/* The device arena's size: the largest measurement's operands (links, add:
 * two 64 MiB buffers; gemm at 2048^3: 48 MiB; attention at S = 2048: 40 MiB). */
#define KBENCH_ARENA ((size_t)128 << 20)
#define KBENCH_HOST ((size_t)64 << 20)

static void kbench_free(kbench *kb) {
  if (!kb->b) return;
  if (kb->host) kb->b->host_free(kb->b, kb->host);
  if (kb->s) kb->b->stream_free(kb->b, kb->s);
  mf_backend_free(kb->b);
  memset(kb, 0, sizeof *kb);
}

static mf_status kbench_create(mf_threadpool *pool, kbench *kb) {
  memset(kb, 0, sizeof *kb);
  mf_cpu_backend_opts o = {.pool = pool, .round_bf16 = 0, .checking = 0, .streams = MF_CPU_STREAMS_IMMEDIATE};
  mf_status st = mf_backend_cpu_create(&o, &kb->b);
  void *base = NULL, *host = NULL;
  if (st == MF_OK) st = kb->b->stream_create(kb->b, &kb->s);
  if (st == MF_OK) st = kb->b->arena_create(kb->b, KBENCH_ARENA, &base);
  if (st == MF_OK) st = kb->b->host_alloc(kb->b, KBENCH_HOST, &host);
  kb->arena = base;
  kb->arena_bytes = KBENCH_ARENA;
  kb->host = host;
  kb->host_bytes = KBENCH_HOST;
  if (st != MF_OK) kbench_free(kb);
  return st;
}

/* dst (n floats of the arena) = fill(seed), uploaded through the host staging. */
static mf_status upload(kbench *kb, float *dst, size_t n, uint32_t seed) {
  if (n * sizeof(float) > kb->host_bytes || (uint8_t *)(dst + n) > kb->arena + kb->arena_bytes)
    return MF_ERR(MF_ERR_INTERNAL, "profile: %zu floats do not fit the benchmark's buffers", n);
  fill(kb->host, n, seed);
  MF_CHECK(kb->b->copy(kb->b, dst, kb->host, n * sizeof(float), MF_COPY_H2D, kb->s));
  return kb->b->stream_sync(kb->b, kb->s);
}

/* Operand j of call k: ptr, bytes, whether the kernel writes it and its
 * dtype with fp32 storage (the operand table's words). */
static void operand(mf_kernel_call *k, int j, void *ptr, size_t bytes) {
  k->b[j] = (mf_kbuf){ptr, bytes, (int)(mf_kernel_writes(k) >> j & 1u),
                      mf_kop_type_dtype(mf_kernel_info_of(k->kind)->b[j].type, MF_DTYPE_F32)};
}

typedef struct {
  kbench *kb;
  mf_kernel_call call;
} kernel_job;

static mf_status run_kernel(void *ctx) {
  kernel_job *j = ctx;
  MF_CHECK(j->kb->b->run(j->kb->b, &j->call, j->kb->s));
  return j->kb->b->stream_sync(j->kb->b, j->kb->s);
}

typedef struct {
  kbench *kb;
  void *dst;
  const void *src;
  size_t bytes;
  mf_copy_kind kind;
} copy_job;

static mf_status run_copy(void *ctx) {
  copy_job *j = ctx;
  MF_CHECK(j->kb->b->copy(j->kb->b, j->dst, j->src, j->bytes, j->kind, j->kb->s));
  return j->kb->b->stream_sync(j->kb->b, j->kb->s);
}

static void empty_task(void *ctx, int i, int n) {}

static mf_status run_dispatch(void *ctx) {
  mf_threadpool_run(ctx, empty_task, NULL);
  return MF_OK;
}

typedef struct {
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

/* ------------------------------------------------------------ machine */

static void cpu_model(char *buf, size_t cap) {
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


/* ------------------------------------------------------------ profile */

static mf_status measure_links(mf_hwprofile *p, kbench *kb, const run_info *ri) {
  const size_t big = (size_t)64 << 20, small = 4096;
  memset(kb->host, 1, big); /* fault the pages in before timing */
  copy_job up = {kb, kb->arena, kb->host, big, MF_COPY_H2D},
           down = {kb, kb->host, kb->arena, big, MF_COPY_D2H};
  copy_job tiny = {kb, kb->arena, kb->host, small, MF_COPY_H2D};
  MF_CHECK(run_copy(&up));
  double t_h2d, t_d2h, t_small;
  MF_CHECK(best_seconds(run_copy, &up, ri, &t_h2d));
  MF_CHECK(best_seconds(run_copy, &down, ri, &t_d2h));
  MF_CHECK(best_seconds(run_copy, &tiny, ri, &t_small));
  p->h2d_bandwidth = round_sig((double)big / t_h2d, 3, 0);
  p->d2h_bandwidth = round_sig((double)big / t_d2h, 3, 0);
  double bw = p->h2d_bandwidth > p->d2h_bandwidth ? p->h2d_bandwidth : p->d2h_bandwidth;
  double lat = t_small - (double)small / bw;
  p->h2d_latency_s = p->d2h_latency_s = lat > 0 ? round_sig(lat * 1e6, 2, 0) / 1e6 : 0;
  return MF_OK;
}

static mf_status measure_add(mf_hwprofile *p, kbench *kb, mf_threadpool *pool, const run_info *ri) {
  const int64_t n = (int64_t)16 << 20;
  const size_t bytes = (size_t)n * sizeof(float);
  double t_dispatch, t_big;
  MF_CHECK(best_seconds(run_dispatch, pool, ri, &t_dispatch));
  p->launch_s = round_sig(t_dispatch * 1e6, 2, 0) / 1e6;
  float *x = (float *)kb->arena, *y = x + n;
  MF_CHECK(upload(kb, x, (size_t)n, 1));
  kernel_job zero = {kb, {.kind = MF_K_ZERO, .label = "profile y"}};
  operand(&zero.call, 0, y, bytes);
  MF_CHECK(run_kernel(&zero));
  kernel_job add = {kb, {.kind = MF_K_ADD, .i = {n, 0}, .label = "profile add"}};
  operand(&add.call, 0, x, bytes);
  operand(&add.call, 1, y, bytes);
  MF_CHECK(best_seconds(run_kernel, &add, ri, &t_big));
  double t = t_big - p->launch_s > 0.5 * t_big ? t_big - p->launch_s : 0.5 * t_big;
  p->elementwise_bandwidth = round_sig(12.0 * (double)n / t, 3, 0);
  p->host_memory_bandwidth = p->elementwise_bandwidth;
  return MF_OK;
}

static mf_status measure_gemm(mf_hwprofile *p, kbench *kb, const run_info *ri) {
  static const int64_t sizes[] = {64, 128, 256, 512, 1024, 2048};
  const int n_sizes = ri->quick ? 5 : 6;
  const int64_t max = sizes[n_sizes - 1];
  float *x = (float *)kb->arena, *w = x + max * max, *y = w + max * max;
  MF_CHECK(upload(kb, x, (size_t)(max * max), 2));
  MF_CHECK(upload(kb, w, (size_t)(max * max), 3));
  double prev_t = 0;
  for (int i = 0; i < n_sizes; i++) {
    const int64_t s = sizes[i];
    const size_t bytes = (size_t)(s * s) * sizeof(float);
    kernel_job j = {kb, {.kind = MF_K_LINEAR_FWD, .i = {s, s, s, 0}, .label = "profile gemm"}};
    operand(&j.call, 0, x, bytes);
    operand(&j.call, 1, w, bytes);
    operand(&j.call, 3, y, bytes);
    double t;
    MF_CHECK(best_seconds(run_kernel, &j, ri, &t));
    double work = 2.0 * (double)s * (double)s * (double)s;
    /* the profile adds launch_s to every GEMM: the table's rate is the rest */
    double tc = t - p->launch_s > 0.5 * t ? t - p->launch_s : 0.5 * t;
    double rate = round_sig(work / tc, 3, 0);
    if (work / rate < prev_t)
      rate = round_sig(work / prev_t, 3, 1); /* noise: a bigger GEMM is never faster */
    prev_t = work / rate;
    p->gemm[i] = (mf_hw_gemm_point){.m = (double)s, .n = (double)s, .k = (double)s, .flops = rate};
  }
  p->n_gemm = n_sizes;
  return MF_OK;
}

/* The attention figures' heads: 8 query heads, 2 kv heads (GQA), B = 1. */
#define ATTN_HQ 8
#define ATTN_HKV 2

/* Causal attention forward and backward at S tokens, head_dim D: the calls
 * over buffers laid out for the largest shape (nq, nkv floats per q, kv). */
static void attention_calls(float *buf, size_t nq, size_t nkv, int64_t S, int64_t D, kernel_job *fwd,
                            kernel_job *bwd) {
  const int64_t hq = ATTN_HQ, hkv = ATTN_HKV;
  float *q = buf, *k = buf + nq, *v = buf + nq + nkv, *dout = buf + nq + 2 * nkv, *o = buf + 2 * nq + 2 * nkv;
  float *dq = buf + 3 * nq + 2 * nkv, *dk = buf + 4 * nq + 2 * nkv, *dv = buf + 4 * nq + 3 * nkv;
  float *lse = buf + 4 * nq + 4 * nkv;
  const size_t bq = (size_t)(S * hq * D) * sizeof(float), bkv = (size_t)(S * hkv * D) * sizeof(float);
  const size_t bl = (size_t)(S * hq) * sizeof(float);
  fwd->call = (mf_kernel_call){.kind = MF_K_ATTN_FWD, .i = {1, S, hq, hkv, D}, .f = {1.0f / sqrtf((float)D)}};
  bwd->call = (mf_kernel_call){.kind = MF_K_ATTN_BWD, .i = {1, S, hq, hkv, D}, .f = {1.0f / sqrtf((float)D)}};
  float *const fb[] = {q, k, v, o, lse}, *const bb[] = {q, k, v, o, dout, lse, dq, dk, dv};
  const size_t fs[] = {bq, bkv, bkv, bq, bl}, bs[] = {bq, bkv, bkv, bq, bq, bl, bq, bkv, bkv};
  for (int j = 0; j < 5; j++) operand(&fwd->call, j, fb[j], fs[j]);
  for (int j = 0; j < 9; j++) operand(&bwd->call, j, bb[j], bs[j]);
}

static mf_status measure_attention(mf_hwprofile *p, kbench *kb, const run_info *ri) {
  static const int64_t shapes[][2] = {{128, 64}, {256, 64}, {512, 64}, {512, 128}, {1024, 128}, {2048, 128}};
  const int n_shapes = ri->quick ? 4 : 6;
  const int64_t hq = ATTN_HQ, max_s = shapes[n_shapes - 1][0], max_d = shapes[n_shapes - 1][1];
  size_t nq = (size_t)(max_s * hq * max_d), nkv = (size_t)(max_s * ATTN_HKV * max_d);
  /* q, o, dout, dq: nq each; k, v, dk, dv: nkv each; lse: hq * max_s */
  float *buf = (float *)kb->arena;
  if ((4 * nq + 4 * nkv + (size_t)(hq * max_s)) * sizeof(float) > kb->arena_bytes)
    return MF_ERR(MF_ERR_INTERNAL, "profile: the attention buffers do not fit the benchmark's arena");
  MF_CHECK(upload(kb, buf, 4 * nq + 4 * nkv, 4));
  for (int i = 0; i < n_shapes; i++) {
    const int64_t S = shapes[i][0], D = shapes[i][1];
    kernel_job fwd = {.kb = kb}, bwd = {.kb = kb};
    attention_calls(buf, nq, nkv, S, D, &fwd, &bwd);
    double tf, tb;
    MF_CHECK(best_seconds(run_kernel, &fwd, ri, &tf));
    MF_CHECK(best_seconds(run_kernel, &bwd, ri, &tb));
    double flops = mf_hw_attention_flops(1, (double)S, (double)hq, (double)D, 0) +
                   mf_hw_attention_flops(1, (double)S, (double)hq, (double)D, 1);
    double t = tf + tb - 2 * p->launch_s > 0.5 * (tf + tb) ? tf + tb - 2 * p->launch_s : 0.5 * (tf + tb);
    p->attn[i] = (mf_hw_attn_point){.s = (double)S, .d = (double)D, .flops = round_sig(flops / t, 3, 0)};
  }
  p->n_attn = n_shapes;
  return MF_OK;
}

static mf_status measure_adamw(mf_hwprofile *p, mf_threadpool *pool, run_info *ri) {
  const size_t n = (size_t)16 << 20;
  float *buf = NULL;
  uint16_t *bf16 = NULL;
  mf_status st = mf_malloc(4 * n * sizeof(float), "AdamW buffers", (void **)&buf);
  if (st == MF_OK) st = mf_malloc(n * sizeof(uint16_t), "AdamW bf16 copy", (void **)&bf16);
  if (st == MF_OK) {
    fill(buf, 2 * n, 5);                           /* p, g */
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
    MF_CHECK_GOTO(best_seconds(run_adamw, &j, ri, &t), st, done);
    p->host_adamw_params_per_s = round_sig((double)n / t, 3, 0);
    ri->adamw_impl = mf_adamw_impl_name();
  }
done:
  free(buf);
  free(bf16);
  return st;
}

/* ------------------------------------------------------- program kernels */

typedef struct kacc {
  const char *kernel; /* mf_kernel_name: static */
  int64_t sizes[8];
  int n_sizes;
  double bytes;
  double sum; /* of the instances' medians */
  int n;
} kacc;

static int cmp_dbl(const void *a, const void *b) {
  const double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y ? 1 : 0;
}

typedef struct step_rank {
  double total;
  int rep;
} step_rank;

static int cmp_rank(const void *a, const void *b) {
  const step_rank *x = (const step_rank *)a, *y = (const step_rank *)b;
  return x->total < y->total ? -1 : x->total > y->total ? 1 : x->rep - y->rep;
}

static int cmp_kacc_total(const void *a, const void *b) {
  const kacc *x = (const kacc *)a, *y = (const kacc *)b;
  return x->sum < y->sum ? 1 : x->sum > y->sum ? -1 : 0;
}

/* Times every compute instruction of the config's step (all tensors
 * resident: every op once, in program order; a planned schedule runs the same
 * calls, recomputes included, so their keys and times carry over). The steps
 * are taken in rounds spread over the whole profile run (a round between each
 * of the other measurements), and each call's time is its median over the
 * fastest half of all those steps: another process taking a core for a while
 * slows whole steps, and this is the "best of several runs" of the other
 * figures for calls too short to time one by one (a call's own best-of would
 * be a lucky draw; the median is what a step pays). Times are averaged per key
 * (mf_sim_instr_key); more keys than MF_HW_MAX_KERNELS: those with the least
 * time per step are left to the rate model. Nothing here allocates per step. */
typedef struct prog_timer {
  mf_param_table *t;
  mf_program *prog;
  mf_backend *be;
  mf_exec *x;
  mf_decisions *dec;
  mf_schedule *sched;
  float *w, *g;
  int32_t **ids, **tg;
  int64_t G;
  int32_t n;     /* instructions */
  int per_round; /* timed steps per round (after one warm-up step) */
  int steps;     /* timed so far */
  int cap;       /* rounds * per_round */
  double *times; /* [n][cap] */
} prog_timer;

static void prog_timer_free(prog_timer *pt) {
  if (!pt) return;
  for (int64_t m = 0; m < pt->G; m++) {
    if (pt->ids) free(pt->ids[m]);
    if (pt->tg) free(pt->tg[m]);
  }
  free(pt->ids);
  free(pt->tg);
  free(pt->w);
  free(pt->g);
  free(pt->times);
  mf_exec_free(pt->x);
  mf_schedule_free(pt->sched);
  mf_decisions_free(pt->dec);
  mf_backend_free(pt->be);
  mf_program_free(pt->prog);
  mf_param_table_free(pt->t);
  free(pt);
}

static mf_status prog_timer_create(const mf_config *cfg, mf_threadpool *pool, int rounds, int per_round,
                                   prog_timer **out) {
  *out = NULL;
  if (!cfg->model.has_init)
    return MF_ERR(MF_ERR_CONFIG, "profile --config: model: only a model.init config can be timed (a profile reads "
                  "no checkpoint)");
  prog_timer *pt = NULL;
  MF_CHECK(mf_calloc(1, sizeof *pt, "program timer", (void **)&pt));
  mf_status st = MF_OK;
  pt->G = cfg->train.grad_accum;
  pt->per_round = per_round;
  pt->cap = rounds * per_round;
  MF_CHECK_GOTO(mf_param_table_build(&cfg->model.init, &pt->t), st, fail);
  const mf_param_table *t = pt->t;
  const double aux = isnan(cfg->train.aux_loss_coef) ? t->spec.router_aux_loss_coef : cfg->train.aux_loss_coef;
  mf_program_opts po = {.micro_batch = cfg->train.micro_batch,
                        .seq_len = cfg->data.seq_len,
                        .grad_accum = pt->G,
                        .aux_coef = aux,
                        .order = cfg->train.micro_batch_order == MF_CONFIG_MB_ORDER_LAYER ? MF_ORDER_LAYER_MAJOR
                                                                                            : MF_ORDER_MICRO_MAJOR};
  MF_CHECK_GOTO(mf_program_build(t, &po, &pt->prog), st, fail);
  mf_cpu_backend_opts bo = {pool, 0, 0, NULL, MF_CPU_STREAMS_IMMEDIATE};
  MF_CHECK_GOTO(mf_backend_cpu_create(&bo, &pt->be), st, fail);
  MF_CHECK_GOTO(mf_decisions_create(pt->prog, &pt->dec), st, fail);
  MF_CHECK_GOTO(mf_schedule_build(pt->prog, pt->dec, &pt->sched), st, fail);
  MF_CHECK_GOTO(mf_exec_create_scheduled(pt->prog, pt->sched, pt->be, &pt->x), st, fail);
  MF_CHECK_GOTO(mf_exec_set_instr_timing(pt->x, 1), st, fail);
  pt->n = pt->sched->n_instr;
  const size_t np = (size_t)t->total_numel, T = (size_t)(pt->prog->B * pt->prog->S);
  MF_CHECK_GOTO(mf_malloc(np * sizeof(float), "weights", (void **)&pt->w), st, fail);
  MF_CHECK_GOTO(mf_malloc(np * sizeof(float), "gradients", (void **)&pt->g), st, fail);
  mf_params_init_random(t, t->spec.seed, 0.02f, pt->w);
  MF_CHECK_GOTO(mf_calloc((size_t)pt->G, sizeof(int32_t *), "token pointers", (void **)&pt->ids), st, fail);
  MF_CHECK_GOTO(mf_calloc((size_t)pt->G, sizeof(int32_t *), "token pointers", (void **)&pt->tg), st, fail);
  uint32_t seed = 12345;
  for (int64_t m = 0; m < pt->G; m++) {
    MF_CHECK_GOTO(mf_malloc(T * sizeof(int32_t), "token ids", (void **)&pt->ids[m]), st, fail);
    MF_CHECK_GOTO(mf_malloc(T * sizeof(int32_t), "targets", (void **)&pt->tg[m]), st, fail);
    for (size_t i = 0; i < T; i++) {
      seed = seed * 1664525u + 1013904223u;
      pt->ids[m][i] = (int32_t)((seed >> 8) % (uint32_t)t->spec.vocab);
      seed = seed * 1664525u + 1013904223u;
      pt->tg[m][i] = (int32_t)((seed >> 8) % (uint32_t)t->spec.vocab);
    }
  }
  MF_CHECK_GOTO(mf_malloc((size_t)pt->n * (size_t)pt->cap * sizeof(double) + 1, "kernel times", (void **)&pt->times),
                st, fail);
  *out = pt;
  return MF_OK;
fail:
  prog_timer_free(pt);
  return st;
}

/* One round: a warm-up step, then per_round timed steps. */
static mf_status prog_timer_round(prog_timer *pt) {
  for (int r = -1; r < pt->per_round && pt->steps < pt->cap; r++) {
    mf_step_result sr;
    MF_CHECK(mf_exec_step(pt->x, pt->w, (const int32_t *const *)pt->ids, (const int32_t *const *)pt->tg, pt->g, &sr));
    if (r < 0) continue;
    const double *is = mf_exec_instr_seconds(pt->x);
    for (int32_t i = 0; i < pt->n; i++) pt->times[(size_t)i * (size_t)pt->cap + (size_t)pt->steps] = is[i];
    pt->steps++;
  }
  return MF_OK;
}

/* Fills p->kernels from the steps timed (see prog_timer). */
static mf_status prog_timer_finish(prog_timer *pt, mf_hwprofile *p, int *n_calls, int *dropped) {
  const int reps = pt->steps, cap = pt->cap;
  const int32_t n = pt->n;
  if (reps < 1) return MF_ERR(MF_ERR_INTERNAL, "profile: no program step was timed");
  double *kept = NULL;
  step_rank *rank = NULL;
  kacc *acc = NULL;
  int n_acc = 0;
  mf_status st = MF_OK;
  *n_calls = 0;
  MF_CHECK_GOTO(mf_malloc((size_t)reps * sizeof(step_rank), "step order", (void **)&rank), st, done);
  for (int r = 0; r < reps; r++) {
    rank[r] = (step_rank){0, r};
    for (int32_t i = 0; i < n; i++) rank[r].total += pt->times[(size_t)i * (size_t)cap + (size_t)r];
  }
  qsort(rank, (size_t)reps, sizeof *rank, cmp_rank);
  const int keep = reps / 2 > 0 ? reps / 2 : 1;
  MF_CHECK_GOTO(mf_malloc((size_t)keep * sizeof(double), "kernel times", (void **)&kept), st, done);
  MF_CHECK_GOTO(mf_calloc((size_t)n + 1, sizeof(kacc), "kernel keys", (void **)&acc), st, done);
  for (int32_t i = 0; i < n; i++) {
    kacc k = {0};
    if (!mf_sim_instr_key(pt->sched, i, &k.kernel, k.sizes, &k.n_sizes, &k.bytes)) continue;
    ++*n_calls;
    while (k.n_sizes > 0 && k.sizes[k.n_sizes - 1] == 0) k.n_sizes--;
    const double *ti = pt->times + (size_t)i * (size_t)cap;
    for (int r = 0; r < keep; r++) kept[r] = ti[rank[r].rep];
    qsort(kept, (size_t)keep, sizeof(double), cmp_dbl);
    const double med = keep % 2 ? kept[keep / 2] : 0.5 * (kept[keep / 2 - 1] + kept[keep / 2]);
    int j = 0;
    for (; j < n_acc; j++)
      if (strcmp(acc[j].kernel, k.kernel) == 0 && acc[j].n_sizes == k.n_sizes && acc[j].bytes == k.bytes &&
          memcmp(acc[j].sizes, k.sizes, sizeof k.sizes) == 0)
        break;
    if (j == n_acc) acc[n_acc++] = k;
    acc[j].sum += med;
    acc[j].n++;
  }
  qsort(acc, (size_t)n_acc, sizeof *acc, cmp_kacc_total);
  *dropped = n_acc > MF_HW_MAX_KERNELS ? n_acc - MF_HW_MAX_KERNELS : 0;
  p->n_kernels = 0;
  for (int j = 0; j < n_acc && p->n_kernels < MF_HW_MAX_KERNELS; j++) {
    mf_hw_kernel_point *q = &p->kernels[p->n_kernels++];
    memset(q, 0, sizeof *q);
    snprintf(q->kernel, sizeof q->kernel, "%s", acc[j].kernel);
    memcpy(q->sizes, acc[j].sizes, sizeof q->sizes);
    q->n_sizes = acc[j].n_sizes;
    q->bytes = acc[j].bytes;
    char txt[32]; /* 3 significant digits, as the shortest text that reads back */
    snprintf(txt, sizeof txt, "%.3g", acc[j].sum / acc[j].n);
    const double sec = strtod(txt, NULL);
    q->seconds = sec > 0 ? sec : 1e-9; /* a clock too coarse for the call: keep it > 0 */
  }
done:
  free(acc);
  free(rank);
  free(kept);
  return st;
}

static mf_status measure_cpu(mf_hwprofile *p, run_info *ri, const char *cmdline, const mf_config *cfg,
                             const char *cfg_path) {
  mf_threadpool *pool = NULL;
  MF_CHECK(mf_threadpool_create(cfg ? (int)cfg->train.threads : 0, &pool));
  ri->threads = mf_threadpool_size(pool);
  mf_status st = MF_OK;
  prog_timer *pt = NULL;
  kbench kb = {0};
  const int rounds = 5, per_round = ri->quick ? 5 : 9;
  if (cfg) MF_CHECK_GOTO(prog_timer_create(cfg, pool, rounds, per_round, &pt), st, done);
  MF_CHECK_GOTO(kbench_create(pool, &kb), st, done);
  /* The program's rounds go between the other measurements, spread in time. */
  MF_CHECK_GOTO(measure_links(p, &kb, ri), st, done);
  if (pt) MF_CHECK_GOTO(prog_timer_round(pt), st, done);
  /* add before the kernels: launch_s comes off their times */
  MF_CHECK_GOTO(measure_add(p, &kb, pool, ri), st, done);
  if (pt) MF_CHECK_GOTO(prog_timer_round(pt), st, done);
  MF_CHECK_GOTO(measure_gemm(p, &kb, ri), st, done);
  if (pt) MF_CHECK_GOTO(prog_timer_round(pt), st, done);
  MF_CHECK_GOTO(measure_attention(p, &kb, ri), st, done);
  if (pt) MF_CHECK_GOTO(prog_timer_round(pt), st, done);
  MF_CHECK_GOTO(measure_adamw(p, pool, ri), st, done);
  if (pt) MF_CHECK_GOTO(prog_timer_round(pt), st, done);
  p->host_memory = mf_hostbuf_machine_memory(0, NULL, 0) >> 20 << 20; /* whole MiB: readable, and exact enough */
  if (p->host_memory == 0) {
    st = MF_ERR(MF_ERR_IO, "cannot tell this machine's memory (sysconf and /proc)");
    goto done;
  }
  const uint64_t grain = (uint64_t)256 << 20;
  p->device_memory = p->host_memory / 2 / grain * grain;
  if (p->device_memory == 0) p->device_memory = p->host_memory / 2;
  p->device_reserve = 0;
  p->copies_overlap_compute = 0;
  p->nvme_bandwidth = 0;
  char kern_note[600] = "";
  if (pt) {
    int dropped = 0, n_calls = 0;
    const int reps = pt->steps;
    MF_CHECK_GOTO(prog_timer_finish(pt, p, &n_calls, &dropped), st, done);
    snprintf(kern_note, sizeof kern_note,
             " compute.kernels: the %d compute calls of one training step of %s (B=%lld, S=%lld, G=%lld, all "
             "tensors resident, random weights and tokens), each the median over the fastest half of %d steps "
             "timed in %d rounds spread over the run, averaged over the calls of the same kernel, sizes and "
             "operand bytes%s.",
             n_calls, cfg_path, (long long)cfg->train.micro_batch, (long long)cfg->data.seq_len,
             (long long)cfg->train.grad_accum, reps, rounds, dropped ? " (the keys with the least time left out)" : "");
  }

  char model[200], date[32];
  cpu_model(model, sizeof model);
  time_t now = time(NULL);
  struct tm tm;
  gmtime_r(&now, &tm);
  strftime(date, sizeof date, "%Y-%m-%d %H:%M UTC", &tm);
  snprintf(p->name, sizeof p->name, "cpu backend: %s, %d threads", model, ri->threads);
  snprintf(p->source, sizeof p->source,
           "Measured on this machine by `%s` on %s, %d threads; each figure the best of %d runs. "
           "Copies and kernels run through the cpu backend (copy, run), device operands in its arena. "
           "links: its copies, a one-thread memcpy of 64 MiB (latency: 4 KiB copies less bytes/bandwidth). "
           "gemm: linear_fwd, fp32, square shapes. attention: attn_fwd+attn_bwd, causal, B=1, "
           "Hq=8, Hkv=2, rate = fwd+bwd FLOPs (mf_hw_attention_flops) / time. launch_us: an empty "
           "mf_threadpool_run (what each parallel cpu kernel pays), taken off the gemm and attention times. "
           "elementwise_bandwidth and "
           "host.memory_bandwidth: add over 16M floats, 12 bytes per element. adamw: mf_adamw_update over "
           "16M fp32 params with the bf16 copy (%s body). host.memory: physical memory or the cgroup limit. "
           "Figures rounded to 3 significant digits. Not measured: device.memory is half of host memory and "
           "device.reserve 0 (cpu-backend defaults), copies_overlap_compute false (the cpu backend copies on "
           "the compute thread), no nvme.%s",
           cmdline, date, ri->threads, ri->reps, ri->adamw_impl ? ri->adamw_impl : "?", kern_note);
done:
  kbench_free(&kb);
  prog_timer_free(pt);
  mf_threadpool_free(pool);
  return st;
}

static void print_summary(const mf_hwprofile *p, const run_info *ri, const char *out, double secs) {
  char a[32], b[32];
  printf("moefit profile: %s\n", p->name);
  printf("  host memory      %s (device memory set to %s: half, the cpu backend's default)\n",
         mf_format_bytes(p->host_memory, a, sizeof a), mf_format_bytes(p->device_memory, b, sizeof b));
  printf("  copies (memcpy)  h2d %.2f GB/s, d2h %.2f GB/s, latency %.2g us\n", p->h2d_bandwidth / 1e9,
         p->d2h_bandwidth / 1e9, p->h2d_latency_s * 1e6);
  printf("  kernel launch    %.2g us (thread-pool dispatch)\n", p->launch_s * 1e6);
  printf("  elementwise      %.2f GB/s (add kernel, 12 bytes/element; also host.memory_bandwidth)\n",
         p->elementwise_bandwidth / 1e9);
  printf("  gemm (fp32)     ");
  for (int i = 0; i < p->n_gemm; i++) printf(" %.0f^3 %.3g", p->gemm[i].m, p->gemm[i].flops / 1e9);
  printf("  GFLOP/s\n  attention       ");
  for (int i = 0; i < p->n_attn; i++)
    printf(" s%.0f/d%.0f %.3g", p->attn[i].s, p->attn[i].d, p->attn[i].flops / 1e9);
  printf("  GFLOP/s (fwd+bwd)\n");
  printf("  host AdamW       %.0f M params/s (%s body; %.1f GB/s at the ~30 bytes an update moves per param)\n",
         p->host_adamw_params_per_s / 1e6, ri->adamw_impl ? ri->adamw_impl : "?",
         p->host_adamw_params_per_s * 30 / 1e9);
  if (p->n_kernels > 0)
    printf("  program kernels  %d kernel calls timed at the config's shapes (compute.kernels), the longest %s "
           "%.3g ms\n",
           p->n_kernels, p->kernels[0].kernel, p->kernels[0].seconds * 1e3);
  printf("wrote %s (%.1f s, best of %d runs each)\n", out, secs, ri->reps);
}

int mf_cli_profile(int argc, char **argv) {
  const char *cmd = "profile", *backend = "cpu", *out = "runs/hw/cpu.yaml", *config = NULL;
  int quick = 0;
  if (mf_cli_wants_help(argc, argv)) {
    printf("%s", k_usage);
    return MF_EXIT_OK;
  }
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (strcmp(a, "--quick") == 0) {
      quick = 1;
    } else if (strcmp(a, "--backend") == 0 || strcmp(a, "--out") == 0 || strcmp(a, "--config") == 0) {
      if (i + 1 >= argc) return mf_cli_usage_error(cmd, "%s needs a value", a);
      if (strcmp(a, "--backend") == 0)
        backend = argv[++i];
      else if (strcmp(a, "--out") == 0)
        out = argv[++i];
      else
        config = argv[++i];
    } else {
      return mf_cli_usage_error(cmd, "unexpected argument '%s'", a);
    }
  }
  if (!*out) return mf_cli_usage_error(cmd, "--out needs a file name");
  if (strcmp(backend, "cuda") == 0) {
    fprintf(stderr,
            "moefit profile: not built yet: measuring the cuda backend (copies, cuBLAS GEMMs, attention) "
            "comes with "
            "the cuda backend work. Use --backend cpu, or a bundled GPU profile in configs/hw/ (spec-sheet "
            "estimates).\n");
    return MF_EXIT_FAIL;
  }
  if (strcmp(backend, "cpu") != 0)
    return mf_cli_usage_error(cmd, "--backend must be cpu or cuda, not '%s'", backend);

  if (config && !*config) return mf_cli_usage_error(cmd, "--config needs a file name");
  mf_config *cfg = NULL;
  if (config) {
    mf_status cst = mf_config_load(config, NULL, 0, &cfg);
    if (cst != MF_OK) return mf_cli_fail(cmd, cst);
  }
  char cmdline[1200];
  snprintf(cmdline, sizeof cmdline, "moefit profile --backend cpu%s%s%s", quick ? " --quick" : "",
           config ? " --config " : "", config ? config : "");
  run_info ri = {.quick = quick, .reps = quick ? 5 : 7, .min_run = quick ? 0.02 : 0.05};
  mf_hwprofile *p = NULL;
  mf_status st = mf_calloc(1, sizeof *p, "hardware profile", (void **)&p);
  if (st != MF_OK) {
    mf_config_free(cfg);
    return mf_cli_fail(cmd, st);
  }
  double t0 = mf_time_now();
  st = mf_mkdir_parents(out); /* before measuring: a bad --out fails at once */
  if (st == MF_OK) {
    fprintf(stderr, "moefit profile: measuring the cpu backend%s ...\n", quick ? " (quick)" : "");
    st = measure_cpu(p, &ri, cmdline, cfg, config);
  }
  if (st == MF_OK) st = mf_hwprofile_save(p, out);
  mf_hwprofile *back = NULL; /* what the planner will read */
  if (st == MF_OK) st = mf_calloc(1, sizeof *back, "hardware profile", (void **)&back);
  if (st == MF_OK) {
    st = mf_hwprofile_load(out, back);
    if (st == MF_OK && !mf_hwprofile_equal(p, back))
      st = MF_ERR(MF_ERR_INTERNAL, "%s: the written profile does not read back equal", out);
  }
  if (st == MF_OK) print_summary(p, &ri, out, mf_time_now() - t0);
  free(back);
  free(p);
  mf_config_free(cfg);
  return st == MF_OK ? MF_EXIT_OK : mf_cli_fail(cmd, st);
}
