/* `moefit profile`: measures this machine's hardware profile for the planner's
 * cost model (planner/hwprofile.h) and writes it as YAML.
 *
 * On the cpu backend the "device" is host memory and every kernel is one of
 * moefit's cpu kernels on the thread pool, so each figure is measured with the
 * code the cpu backend runs. Every measurement is the best of several runs (a
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

#include "kernels/cpu/cpu_ops.h"
#include "planner/hwprofile.h"
#include "src/cli/commands.h"
#include "src/core/core.h"
#include "src/optim/optim.h"

static const char k_usage[] =
    "usage: moefit profile [--backend cpu|cuda] [--out FILE.yaml] [--quick]\n"
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
    "\n"
    "Measured on cpu, each figure the best of several runs:\n"
    "  links.h2d / d2h          one-thread memcpy of 64 MiB each way (what the cpu backend's\n"
    "                           copies do); latency from 4 KiB copies\n"
    "  compute.gemm             mf_cpu_linear_fwd (fp32) at square shapes 64^3 .. 1024^3\n"
    "                           (.. 2048^3 without --quick)\n"
    "  compute.attention        mf_cpu_attention_fwd + _bwd, causal, 8 query / 2 kv heads\n"
    "  compute.launch_us        an empty mf_threadpool_run (what each parallel cpu kernel pays)\n"
    "  compute.elementwise_bandwidth, host.memory_bandwidth\n"
    "                           mf_cpu_add over 16M floats (12 bytes moved per element)\n"
    "  host.adamw_params_per_s  mf_adamw_update over 16M fp32 parameters, with the bf16 copy\n"
    "  host.memory              physical memory (the cgroup limit when lower)\n"
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

typedef struct {
  void *dst;
  const void *src;
  size_t bytes;
} copy_job;

static mf_status run_copy(void *ctx) {
  copy_job *j = ctx;
  memmove(j->dst, j->src, j->bytes);
  return MF_OK;
}

typedef struct {
  const mf_kctx *k;
  const float *x, *w;
  float *y;
  int64_t m, n, kk;
} gemm_job;

static mf_status run_gemm(void *ctx) {
  gemm_job *j = ctx;
  return mf_cpu_linear_fwd(j->k, j->x, j->w, NULL, j->m, j->n, j->kk, j->y, 0);
}

typedef struct {
  const mf_kctx *k;
  const float *q, *kk, *v, *dout;
  float *o, *lse, *dq, *dk, *dv;
  int64_t s, hq, hkv, d;
} attn_job;

static mf_status run_attn_fwd(void *ctx) {
  attn_job *j = ctx;
  return mf_cpu_attention_fwd(j->k, j->q, j->kk, j->v, 1, j->s, j->hq, j->hkv, j->d,
                              1.0f / sqrtf((float)j->d), j->o, j->lse);
}

static mf_status run_attn_bwd(void *ctx) {
  attn_job *j = ctx;
  return mf_cpu_attention_bwd(j->k, j->q, j->kk, j->v, j->o, j->dout, j->lse, 1, j->s, j->hq, j->hkv, j->d,
                              1.0f / sqrtf((float)j->d), j->dq, j->dk, j->dv);
}

typedef struct {
  const mf_kctx *k;
  const float *x;
  float *y;
  int64_t n;
} add_job;

static void empty_task(void *ctx, int i, int n) {}

static mf_status run_dispatch(void *ctx) {
  mf_threadpool_run(ctx, empty_task, NULL);
  return MF_OK;
}

static mf_status run_add(void *ctx) {
  add_job *j = ctx;
  return mf_cpu_add(j->k, j->x, j->n, j->y);
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

static uint64_t host_memory_bytes(void) {
  long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  uint64_t mem = pages > 0 && page > 0 ? (uint64_t)pages * (uint64_t)page : 0;
  static const char *const limits[] = {"/sys/fs/cgroup/memory.max",
                                       "/sys/fs/cgroup/memory/memory.limit_in_bytes"};
  for (size_t i = 0; i < 2; i++) {
    FILE *f = fopen(limits[i], "r");
    if (!f) continue;
    unsigned long long lim;
    if (fscanf(f, "%llu", &lim) == 1 && lim > 0 && (mem == 0 || lim < mem)) mem = lim;
    fclose(f);
  }
  return mem;
}

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

static mf_status measure_links(mf_hwprofile *p, const run_info *ri) {
  const size_t big = (size_t)64 << 20, small = 4096;
  uint8_t *a = NULL, *b = NULL;
  mf_status st = mf_malloc(big, "copy source", (void **)&a);
  if (st == MF_OK) st = mf_malloc(big, "copy destination", (void **)&b);
  if (st == MF_OK) {
    memset(a, 1, big); /* fault the pages in before timing */
    memset(b, 2, big);
    double t_h2d, t_d2h, t_small;
    copy_job up = {b, a, big}, down = {a, b, big}, tiny = {b, a, small};
    MF_CHECK_GOTO(best_seconds(run_copy, &up, ri, &t_h2d), st, done);
    MF_CHECK_GOTO(best_seconds(run_copy, &down, ri, &t_d2h), st, done);
    MF_CHECK_GOTO(best_seconds(run_copy, &tiny, ri, &t_small), st, done);
    p->h2d_bandwidth = round_sig((double)big / t_h2d, 3, 0);
    p->d2h_bandwidth = round_sig((double)big / t_d2h, 3, 0);
    double bw = p->h2d_bandwidth > p->d2h_bandwidth ? p->h2d_bandwidth : p->d2h_bandwidth;
    double lat = t_small - (double)small / bw;
    p->h2d_latency_s = p->d2h_latency_s = lat > 0 ? round_sig(lat * 1e6, 2, 0) / 1e6 : 0;
  }
done:
  free(a);
  free(b);
  return st;
}

static mf_status measure_add(mf_hwprofile *p, const mf_kctx *k, const run_info *ri) {
  const int64_t n = (int64_t)16 << 20;
  double t_dispatch, t_big;
  MF_CHECK(best_seconds(run_dispatch, k->pool, ri, &t_dispatch));
  p->launch_s = round_sig(t_dispatch * 1e6, 2, 0) / 1e6;
  float *x = NULL, *y = NULL;
  mf_status st = mf_malloc((size_t)n * sizeof(float), "add input", (void **)&x);
  if (st == MF_OK) st = mf_malloc((size_t)n * sizeof(float), "add output", (void **)&y);
  if (st == MF_OK) {
    fill(x, (size_t)n, 1);
    memset(y, 0, (size_t)n * sizeof(float));
    add_job big = {k, x, y, n};
    MF_CHECK_GOTO(best_seconds(run_add, &big, ri, &t_big), st, done);
    double t = t_big - p->launch_s > 0.5 * t_big ? t_big - p->launch_s : 0.5 * t_big;
    p->elementwise_bandwidth = round_sig(12.0 * (double)n / t, 3, 0);
    p->host_memory_bandwidth = p->elementwise_bandwidth;
  }
done:
  free(x);
  free(y);
  return st;
}

static mf_status measure_gemm(mf_hwprofile *p, const mf_kctx *k, const run_info *ri) {
  static const int64_t sizes[] = {64, 128, 256, 512, 1024, 2048};
  const int n_sizes = ri->quick ? 5 : 6;
  const int64_t max = sizes[n_sizes - 1];
  float *x = NULL, *w = NULL, *y = NULL;
  size_t bytes = (size_t)(max * max) * sizeof(float);
  mf_status st = mf_malloc(bytes, "gemm input", (void **)&x);
  if (st == MF_OK) st = mf_malloc(bytes, "gemm weight", (void **)&w);
  if (st == MF_OK) st = mf_malloc(bytes, "gemm output", (void **)&y);
  if (st != MF_OK) goto done;
  fill(x, (size_t)(max * max), 2);
  fill(w, (size_t)(max * max), 3);
  double prev_t = 0;
  for (int i = 0; i < n_sizes; i++) {
    int64_t s = sizes[i];
    gemm_job j = {k, x, w, y, s, s, s};
    double t;
    MF_CHECK_GOTO(best_seconds(run_gemm, &j, ri, &t), st, done);
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
done:
  free(x);
  free(w);
  free(y);
  return st;
}

static mf_status measure_attention(mf_hwprofile *p, const mf_kctx *k, const run_info *ri) {
  static const int64_t shapes[][2] = {{128, 64}, {256, 64}, {512, 64}, {512, 128}, {1024, 128}, {2048, 128}};
  const int n_shapes = ri->quick ? 4 : 6;
  const int64_t hq = 8, hkv = 2, max_s = shapes[n_shapes - 1][0], max_d = shapes[n_shapes - 1][1];
  size_t nq = (size_t)(max_s * hq * max_d), nkv = (size_t)(max_s * hkv * max_d);
  float *buf = NULL;
  /* q, o, dout, dq: nq each; k, v, dk, dv: nkv each; lse: hq * max_s */
  mf_status st = mf_malloc((4 * nq + 4 * nkv + (size_t)(hq * max_s)) * sizeof(float), "attention buffers",
                           (void **)&buf);
  if (st != MF_OK) return st;
  fill(buf, 4 * nq + 4 * nkv, 4);
  attn_job j = {.k = k,
                .q = buf,
                .kk = buf + nq,
                .v = buf + nq + nkv,
                .dout = buf + nq + 2 * nkv,
                .o = buf + 2 * nq + 2 * nkv,
                .dq = buf + 3 * nq + 2 * nkv,
                .dk = buf + 4 * nq + 2 * nkv,
                .dv = buf + 4 * nq + 3 * nkv,
                .lse = buf + 4 * nq + 4 * nkv,
                .hq = hq,
                .hkv = hkv};
  for (int i = 0; i < n_shapes; i++) {
    j.s = shapes[i][0];
    j.d = shapes[i][1];
    double tf, tb;
    MF_CHECK_GOTO(best_seconds(run_attn_fwd, &j, ri, &tf), st, done);
    MF_CHECK_GOTO(best_seconds(run_attn_bwd, &j, ri, &tb), st, done);
    double flops = mf_hw_attention_flops(1, (double)j.s, (double)hq, (double)j.d, 0) +
                   mf_hw_attention_flops(1, (double)j.s, (double)hq, (double)j.d, 1);
    double t = tf + tb - 2 * p->launch_s > 0.5 * (tf + tb) ? tf + tb - 2 * p->launch_s : 0.5 * (tf + tb);
    p->attn[i] = (mf_hw_attn_point){.s = (double)j.s, .d = (double)j.d, .flops = round_sig(flops / t, 3, 0)};
  }
  p->n_attn = n_shapes;
done:
  free(buf);
  return st;
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

static mf_status measure_cpu(mf_hwprofile *p, run_info *ri, const char *cmdline) {
  mf_threadpool *pool = NULL;
  MF_CHECK(mf_threadpool_create(0, &pool));
  ri->threads = mf_threadpool_size(pool);
  mf_kctx k = {pool, 0};
  mf_status st = MF_OK;
  MF_CHECK_GOTO(measure_links(p, ri), st, done);
  MF_CHECK_GOTO(measure_add(p, &k, ri), st, done); /* before the kernels: launch_s is taken off their times */
  MF_CHECK_GOTO(measure_gemm(p, &k, ri), st, done);
  MF_CHECK_GOTO(measure_attention(p, &k, ri), st, done);
  MF_CHECK_GOTO(measure_adamw(p, pool, ri), st, done);

  p->host_memory = host_memory_bytes() >> 20 << 20; /* whole MiB: readable, and exact enough */
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

  char model[200], date[32];
  cpu_model(model, sizeof model);
  time_t now = time(NULL);
  struct tm tm;
  gmtime_r(&now, &tm);
  strftime(date, sizeof date, "%Y-%m-%d %H:%M UTC", &tm);
  snprintf(p->name, sizeof p->name, "cpu backend: %s, %d threads", model, ri->threads);
  snprintf(
      p->source, sizeof p->source,
      "Measured on this machine by `%s` on %s, %d threads; each figure the best of %d runs. "
      "links: one-thread memcpy of 64 MiB (latency: 4 KiB copies less bytes/bandwidth). "
      "gemm: mf_cpu_linear_fwd, fp32, square shapes. attention: mf_cpu_attention_fwd+bwd, causal, B=1, "
      "Hq=8, Hkv=2, rate = fwd+bwd FLOPs (mf_hw_attention_flops) / time. launch_us: an empty "
      "mf_threadpool_run (what each parallel cpu kernel pays), taken off the gemm and attention times. "
      "elementwise_bandwidth and "
      "host.memory_bandwidth: mf_cpu_add over 16M floats, 12 bytes per element. adamw: mf_adamw_update over "
      "16M fp32 params with the bf16 copy (%s body). host.memory: physical memory or the cgroup limit. "
      "Figures rounded to 3 significant digits. Not measured: device.memory is half of host memory and "
      "device.reserve 0 (cpu-backend defaults), copies_overlap_compute false (the cpu backend copies on "
      "the compute thread), no nvme.",
      cmdline, date, ri->threads, ri->reps, ri->adamw_impl ? ri->adamw_impl : "?");
done:
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
  printf("  elementwise      %.2f GB/s (mf_cpu_add, 12 bytes/element; also host.memory_bandwidth)\n",
         p->elementwise_bandwidth / 1e9);
  printf("  gemm (fp32)     ");
  for (int i = 0; i < p->n_gemm; i++) printf(" %.0f^3 %.3g", p->gemm[i].m, p->gemm[i].flops / 1e9);
  printf("  GFLOP/s\n  attention       ");
  for (int i = 0; i < p->n_attn; i++)
    printf(" s%.0f/d%.0f %.3g", p->attn[i].s, p->attn[i].d, p->attn[i].flops / 1e9);
  printf("  GFLOP/s (fwd+bwd)\n");
  printf("  host AdamW       %.0f M params/s (%s body; %.1f GB/s at OFFLOAD.md's ~30 bytes/param)\n",
         p->host_adamw_params_per_s / 1e6, ri->adamw_impl ? ri->adamw_impl : "?",
         p->host_adamw_params_per_s * 30 / 1e9);
  printf("wrote %s (%.1f s, best of %d runs each)\n", out, secs, ri->reps);
}

int mf_cli_profile(int argc, char **argv) {
  const char *cmd = "profile", *backend = "cpu", *out = "runs/hw/cpu.yaml";
  int quick = 0;
  if (mf_cli_wants_help(argc, argv)) {
    printf("%s", k_usage);
    return MF_EXIT_OK;
  }
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (strcmp(a, "--quick") == 0) {
      quick = 1;
    } else if (strcmp(a, "--backend") == 0 || strcmp(a, "--out") == 0) {
      if (i + 1 >= argc) return mf_cli_usage_error(cmd, "%s needs a value", a);
      if (strcmp(a, "--backend") == 0)
        backend = argv[++i];
      else
        out = argv[++i];
    } else if (strncmp(a, "--backend=", 10) == 0) {
      backend = a + 10;
    } else if (strncmp(a, "--out=", 6) == 0) {
      out = a + 6;
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

  char cmdline[256];
  snprintf(cmdline, sizeof cmdline, "moefit profile --backend cpu%s", quick ? " --quick" : "");
  run_info ri = {.quick = quick, .reps = quick ? 5 : 7, .min_run = quick ? 0.02 : 0.05};
  mf_hwprofile *p = NULL;
  mf_status st = mf_calloc(1, sizeof *p, "hardware profile", (void **)&p);
  if (st != MF_OK) return mf_cli_fail(cmd, st);
  double t0 = mf_time_now();
  st = mf_mkdir_parents(out); /* before measuring: a bad --out fails at once */
  if (st == MF_OK) {
    fprintf(stderr, "moefit profile: measuring the cpu backend%s ...\n", quick ? " (quick)" : "");
    st = measure_cpu(p, &ri, cmdline);
  }
  if (st == MF_OK) st = mf_hwprofile_save(p, out);
  if (st == MF_OK) {
    mf_hwprofile back; /* what the planner will read */
    st = mf_hwprofile_load(out, &back);
    if (st == MF_OK && !mf_hwprofile_equal(p, &back))
      st = MF_ERR(MF_ERR_INTERNAL, "%s: the written profile does not read back equal", out);
  }
  if (st == MF_OK) print_summary(p, &ri, out, mf_time_now() - t0);
  free(p);
  return st == MF_OK ? MF_EXIT_OK : mf_cli_fail(cmd, st);
}
