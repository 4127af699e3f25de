/* `moefit bench optim`: the host AdamW's updates/s and bytes/s beside this
 * machine's STREAM triad, measured in the same run on the same thread pool.
 *
 * AdamW moves 30 bytes per parameter: reads p, g, m, v (4 x 4 B), writes p, m,
 * v (3 x 4 B) and the bf16 copy (2 B); with bf16 moments (train.adam_moments)
 * 22: m and v are 2 B each, read and written. The summary line is the fp32
 * moments' figure. Triad is STREAM's a[i] = b[i] + s*c[i]
 * on doubles (3 x 8 B counted per element, as STREAM counts; write-allocate
 * traffic is not counted by either), each array at least 4x the last-level
 * cache. Every figure is the best of several repeats (a shared machine is
 * noisy one way: slower); triad is measured before and after the AdamW sizes
 * and the better kept. `moefit bench kernels` is cmd_bench_kernels.c;
 * `transfer` is not built yet. */
#if defined(__GNUC__) && !defined(__clang__)
/* STREAM is built vectorized; GCC's -O2 cost model vectorizes no loop of
 * unknown length (clang's does). Baseline ISA only: no -m flags here. */
#pragma GCC optimize("vect-cost-model=dynamic")
#endif

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "src/cli/commands.h"
#include "src/core/core.h"
#include "src/core/hostbuf.h"
#include "src/optim/optim.h"

static const char k_usage[] =
    "usage: moefit bench optim [--sizes 64M,256M,1G] [--threads N] [--reps R] [--impl NAME]\n"
    "       moefit bench kernels CONFIG [key=value ...] [--reps R] [--json FILE]\n"
    "       moefit bench transfer   (not built yet)\n"
    "\n"
    "optim: measures the host AdamW (mf_adamw_update with the bf16 copy, the loop body\n"
    "chosen from this CPU's flags) at each size, with fp32 moments and with bf16\n"
    "moments (train.adam_moments: bf16), and this machine's STREAM triad bandwidth with\n"
    "the same thread pool, and ends with one line:\n"
    "  optim: <X> GB/s, triad <Y> GB/s, ratio <X/Y>\n"
    "where X is the best AdamW GB/s over the sizes with fp32 moments (the bf16-moments\n"
    "best is on the line before it).\n"
    "\n"
    "  --sizes LIST   parameter counts, comma-separated; K/M/G are powers of 1024\n"
    "                 (default 64M,256M, and 1G on a machine with 32 GiB or more). Each\n"
    "                 size needs 18 bytes per parameter (fp32 p, g, m, v and a bf16 copy:\n"
    "                 1G needs 18 GiB); a size that does not fit in MemAvailable is\n"
    "                 skipped with a note.\n"
    "  --threads N    threads in the pool (default: all online CPUs, or MF_THREADS)\n"
    "  --reps R       timed repeats per figure, the best kept (default 5; triad 2R)\n"
    "  --impl NAME    AdamW body: auto (default), avx512, avx2, fma, scalar\n"
    "\n"
    "Bytes counted: AdamW 30 per parameter (read p, g, m, v: 16; write p, m, v: 12;\n"
    "bf16 copy: 2); with bf16 moments 22 (m and v: 2 bytes each, read and written).\n"
    "Triad: a[i] = b[i] + s*c[i] on doubles, as STREAM, 24 bytes per element, arrays\n"
    "of max(4 x last-level cache, 64 MiB) each. GB = 1e9 bytes.\n";

/* ------------------------------------------------------------ machine */

static size_t llc_bytes(void) {
  long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE), l2 = sysconf(_SC_LEVEL2_CACHE_SIZE);
  if (l3 > 0) return (size_t)l3;
  if (l2 > 0) return (size_t)l2;
  return (size_t)32 << 20; /* unknown: assume a large one */
}

/* -------------------------------------------------------------- triad */

typedef struct triad_job {
  double *a, *b, *c;
  double s;
  size_t n;
  int init;
} triad_job;

static void triad_task(void *ctx, int i, int n_threads) {
  const triad_job *j = (const triad_job *)ctx;
  size_t b, e;
  mf_partition(j->n, 4096, i, n_threads, &b, &e);
  double *restrict a = j->a;
  const double *restrict bb = j->b, *restrict c = j->c;
  if (j->init) { /* first touch by the thread that will stream the part */
    for (size_t k = b; k < e; k++) {
      j->a[k] = 0.0;
      j->b[k] = 1.0;
      j->c[k] = 2.0;
    }
    return;
  }
  const double s = j->s;
  for (size_t k = b; k < e; k++) a[k] = bb[k] + s * c[k];
}

/* Best triad GB/s over reps runs of arrays of n doubles (already touched). */
static double triad_best(triad_job *j, mf_threadpool *pool, int reps) {
  double best = INFINITY;
  for (int r = 0; r < reps; r++) {
    double t0 = mf_time_now();
    mf_threadpool_run(pool, triad_task, j);
    double dt = mf_time_now() - t0;
    if (dt < best) best = dt;
  }
  return 24.0 * (double)j->n / best / 1e9;
}

/* -------------------------------------------------------------- AdamW */

typedef struct fill_job {
  float *p, *g;
  void *m, *v; /* fp32, or bf16 with bf16_moments */
  uint16_t *bf16;
  size_t n;
  int bf16_moments;
} fill_job;

static void fill_task(void *ctx, int i, int n_threads) {
  const fill_job *j = (const fill_job *)ctx;
  size_t b, e;
  mf_partition(j->n, MF_ADAMW_GRAIN, i, n_threads, &b, &e); /* the update's own split */
  for (size_t k = b; k < e; k++) {
    j->p[k] = 0.02f * (float)((int)(k % 1999) - 999) / 999.0f;
    j->g[k] = 1e-3f * (float)((int)(k % 2003) - 1001) / 1001.0f;
    if (j->bf16_moments) {
      ((uint16_t *)j->m)[k] = 0;
      ((uint16_t *)j->v)[k] = 0;
    } else {
      ((float *)j->m)[k] = 0.0f;
      ((float *)j->v)[k] = 0.0f;
    }
    j->bf16[k] = 0;
  }
}

/* Best seconds of one update (with the bf16 copy; fp32 or bf16 moments) over
 * reps, on fresh buffers. */
static mf_status adamw_best(size_t n, mf_threadpool *pool, int reps, int bf16_moments, double *best_s) {
  /* One block, each buffer starting STAGGER bytes further past a 4 KiB boundary
   * than the previous one: buffers a power of two apart would put all five
   * streams on the same cache sets and alias in the load/store unit (4K
   * aliasing), which measures the layout, not the update. */
  enum { STAGGER = 17 * 64 };
  const size_t fbytes = (n * sizeof(float) + 4095) / 4096 * 4096 + 4096;
  char *buf = NULL;
  MF_CHECK(mf_malloc(4 * fbytes + n * sizeof(uint16_t) + 4096 + 4 * STAGGER, "bench optim buffers",
                     (void **)&buf));
  char *base = (char *)(((uintptr_t)buf + 4095) & ~(uintptr_t)4095);
  fill_job f = {(float *)(base),
                (float *)(base + fbytes + STAGGER),
                base + 2 * fbytes + 2 * STAGGER,
                base + 3 * fbytes + 3 * STAGGER,
                (uint16_t *)(base + 4 * fbytes + 4 * STAGGER),
                n,
                bf16_moments};
  mf_threadpool_run(pool, fill_task, &f);
  mf_adamw_hparams h = {1e-4, 0.9, 0.999, 1e-8, 0.01};
  const mf_dtype md = bf16_moments ? MF_DTYPE_BF16 : MF_DTYPE_F32;
  const mf_adamw_bufs b = {f.p, f.g, f.m, f.v, f.bf16, n, MF_DTYPE_F32, md};
  mf_status st = mf_adamw_update_bufs(&h, 1, &b, pool); /* warm-up */
  double best = INFINITY;
  for (int r = 0; st == MF_OK && r < reps; r++) {
    double t0 = mf_time_now();
    st = mf_adamw_update_bufs(&h, 2 + r, &b, pool);
    double dt = mf_time_now() - t0;
    if (dt < best) best = dt;
  }
  free(buf);
  *best_s = best;
  return st;
}

/* ------------------------------------------------------------ options */

static int parse_count(const char *s, size_t *out) {
  char *end;
  double x = strtod(s, &end);
  double mul = 1;
  switch (*end) {
    case 'K':
    case 'k':
      mul = 1024.0;
      end++;
      break;
    case 'M':
    case 'm':
      mul = 1048576.0;
      end++;
      break;
    case 'G':
    case 'g':
      mul = 1073741824.0;
      end++;
      break;
    default:
      break;
  }
  if (end == s || *end != '\0' || !(x >= 1) || x * mul > 1e13) return -1;
  *out = (size_t)(x * mul);
  return 0;
}

static void fmt_count(size_t n, char *buf, size_t cap) {
  if (n % (1u << 30) == 0)
    snprintf(buf, cap, "%zuG", n >> 30);
  else if (n % (1u << 20) == 0)
    snprintf(buf, cap, "%zuM", n >> 20);
  else
    snprintf(buf, cap, "%zu", n);
}

#define MAX_SIZES 16

static int bench_optim(int argc, char **argv) {
  const char *cmd = "bench optim";
  size_t sizes[MAX_SIZES];
  int n_sizes = 0, threads = 0, reps = 5;
  const char *impl = "auto";
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (i + 1 >= argc &&
        (!strcmp(a, "--sizes") || !strcmp(a, "--threads") || !strcmp(a, "--reps") || !strcmp(a, "--impl")))
      return mf_cli_usage_error(cmd, "%s needs a value", a);
    if (!strcmp(a, "--sizes")) {
      char list[512];
      snprintf(list, sizeof list, "%s", argv[++i]);
      n_sizes = 0;
      for (char *save = NULL, *tok = strtok_r(list, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        if (n_sizes == MAX_SIZES) return mf_cli_usage_error(cmd, "at most %d sizes", MAX_SIZES);
        if (parse_count(tok, &sizes[n_sizes]) != 0)
          return mf_cli_usage_error(cmd, "bad size \"%s\" (e.g. 64M, 1G, 1000000)", tok);
        n_sizes++;
      }
      if (n_sizes == 0) return mf_cli_usage_error(cmd, "--sizes: no sizes given");
    } else if (!strcmp(a, "--threads")) {
      char *end;
      long t = strtol(argv[++i], &end, 10);
      if (*end || t < 1 || t > 4096) return mf_cli_usage_error(cmd, "bad --threads \"%s\"", argv[i]);
      threads = (int)t;
    } else if (!strcmp(a, "--reps")) {
      char *end;
      long r = strtol(argv[++i], &end, 10);
      if (*end || r < 1 || r > 1000) return mf_cli_usage_error(cmd, "bad --reps \"%s\"", argv[i]);
      reps = (int)r;
    } else if (!strcmp(a, "--impl")) {
      impl = argv[++i];
    } else {
      return mf_cli_usage_error(cmd, "unknown argument \"%s\"", a);
    }
  }
  const uint64_t total = mf_hostbuf_machine_memory(0, NULL, 0);
  if (n_sizes == 0) {
    sizes[n_sizes++] = (size_t)64 << 20;
    sizes[n_sizes++] = (size_t)256 << 20;
    if (total >= ((uint64_t)32 << 30)) sizes[n_sizes++] = (size_t)1 << 30;
  }

  mf_status st = mf_adamw_select_impl(impl);
  if (st != MF_OK) return mf_cli_fail(cmd, st);
  mf_threadpool *pool = NULL;
  st = mf_threadpool_create(threads, &pool);
  if (st != MF_OK) return mf_cli_fail(cmd, st);
  char b1[32], b2[32];
  printf("bench optim: %d threads, adamw body %s, memory %s available of %s\n", mf_threadpool_size(pool),
         mf_adamw_impl_name(), mf_format_bytes(mf_hostbuf_machine_memory(1, NULL, 0), b1, sizeof b1),
         mf_format_bytes(total, b2, sizeof b2));

  /* triad arrays: >= 4x the last-level cache each (and at least 64 MiB) */
  size_t llc = llc_bytes(), arr = 4 * llc < ((size_t)64 << 20) ? (size_t)64 << 20 : 4 * llc;
  triad_job tj = {NULL, NULL, NULL, 3.0, arr / sizeof(double), 1};
  /* staggered past 4 KiB boundaries, as the AdamW buffers (adamw_best) */
  const size_t stride = arr + 4096 + 17 * 64;
  char *triad_buf = NULL;
  st = mf_malloc(3 * stride + 4096, "triad arrays", (void **)&triad_buf);
  if (st != MF_OK) {
    mf_threadpool_free(pool);
    return mf_cli_fail(cmd, st);
  }
  char *tbase = (char *)(((uintptr_t)triad_buf + 4095) & ~(uintptr_t)4095);
  tj.a = (double *)tbase;
  tj.b = (double *)(tbase + stride);
  tj.c = (double *)(tbase + 2 * stride);
  mf_threadpool_run(pool, triad_task, &tj);
  tj.init = 0;
  mf_threadpool_run(pool, triad_task, &tj); /* warm-up */
  double triad = triad_best(&tj, pool, 2 * reps);
  printf("triad (double, 24 B/element, 3 x %s, last-level cache %s): %.2f GB/s\n",
         mf_format_bytes(arr, b1, sizeof b1), mf_format_bytes(llc, b2, sizeof b2), triad);
  fflush(stdout);

  double best_gbs = 0, best_gbs16 = 0;
  int measured = 0;
  for (int s = 0; s < n_sizes; s++) {
    const size_t n = sizes[s];
    char name[32];
    fmt_count(n, name, sizeof name);
    const uint64_t need = (uint64_t)n * 18u;
    const uint64_t avail = mf_hostbuf_machine_memory(1, NULL, 0);
    if (need > avail / 10 * 9) {
      printf("adamw n=%-6s skipped: needs %s, %s available\n", name, mf_format_bytes(need, b1, sizeof b1),
             mf_format_bytes(avail, b2, sizeof b2));
      continue;
    }
    double t, t16;
    st = adamw_best(n, pool, reps, 0, &t);
    if (st == MF_OK) st = adamw_best(n, pool, reps, 1, &t16);
    if (st != MF_OK) {
      free(triad_buf);
      mf_threadpool_free(pool);
      return mf_cli_fail(cmd, st);
    }
    const double gbs = 30.0 * (double)n / t / 1e9, gbs16 = 22.0 * (double)n / t16 / 1e9;
    printf("adamw n=%-6s %.4f s/update, %8.1f M updates/s, %6.2f GB/s (30 B/param)\n", name, t,
           (double)n / t / 1e6, gbs);
    printf("adamw n=%-6s %.4f s/update, %8.1f M updates/s, %6.2f GB/s (22 B/param, bf16 moments)\n", name,
           t16, (double)n / t16 / 1e6, gbs16);
    fflush(stdout);
    if (gbs > best_gbs) best_gbs = gbs;
    if (gbs16 > best_gbs16) best_gbs16 = gbs16;
    measured++;
  }

  const double triad2 = triad_best(&tj, pool, 2 * reps); /* again: the machine may have been busier */
  printf("triad again: %.2f GB/s\n", triad2);
  if (triad2 > triad) triad = triad2;
  free(triad_buf);
  mf_threadpool_free(pool);
  if (!measured) {
    fprintf(stderr, "moefit %s: no size fits in available memory\n", cmd);
    return MF_EXIT_FAIL;
  }
  printf("optim bf16 moments: %.2f GB/s, triad %.2f GB/s, ratio %.2f\n", best_gbs16, triad,
         best_gbs16 / triad);
  printf("optim: %.2f GB/s, triad %.2f GB/s, ratio %.2f\n", best_gbs, triad, best_gbs / triad);
  return MF_EXIT_OK;
}

int mf_cli_bench(int argc, char **argv) {
  if (argc < 2 || (argv[1][0] == '-' && mf_cli_wants_help(argc, argv))) {
    printf("%s\n%s", k_usage, mf_cli_bench_kernels_usage);
    return argc < 2 ? MF_EXIT_USAGE : MF_EXIT_OK;
  }
  if (!strcmp(argv[1], "optim")) {
    if (mf_cli_wants_help(argc - 1, argv + 1)) {
      printf("%s", k_usage);
      return MF_EXIT_OK;
    }
    return bench_optim(argc - 1, argv + 1);
  }
  if (!strcmp(argv[1], "kernels")) {
    if (mf_cli_wants_help(argc - 1, argv + 1)) {
      printf("%s", mf_cli_bench_kernels_usage);
      return MF_EXIT_OK;
    }
    return mf_cli_bench_kernels(argc - 1, argv + 1);
  }
  if (!strcmp(argv[1], "transfer")) {
    fprintf(stderr, "moefit bench %s: not built yet: comes with the cuda backend work\n", argv[1]);
    return MF_EXIT_FAIL;
  }
  return mf_cli_usage_error("bench", "unknown benchmark \"%s\" (optim, kernels, transfer)", argv[1]);
}
