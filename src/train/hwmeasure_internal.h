/* Internal to the profile measurement (hwmeasure.h): the benchmarks through
 * a backend's interface (hwmeasure.c) and the timer of one training step's
 * kernel calls, which fills compute.kernels (hwmeasure_prog.c). */
#ifndef MF_TRAIN_HWMEASURE_INTERNAL_H
#define MF_TRAIN_HWMEASURE_INTERNAL_H

#include <stdint.h>

#include "kernels/backend.h"
#include "planner/hwprofile.h"
#include "src/config/config.h"
#include "src/core/core.h"
#include "src/model/params.h"

/* ------------------------------------------------------------ benches */

typedef mf_status (*bench_fn)(void *ctx);

/* How a figure is taken: the best of `reps` runs, each of enough calls to
 * last min_run seconds (at least one), after one warm-up call. */
typedef struct mf_bench_run {
  int quick, reps;
  double min_run;
} mf_bench_run;

/* A stream timed by two timed events of its backend. */
typedef struct mf_bench_clock {
  mf_backend *b;
  mf_stream *s;
  mf_event *e0, *e1;
} mf_bench_clock;

/* One backend measured as the executor drives it: copies and kernels on its
 * stream (clk.s; a second stream for copies both ways at once), operands in
 * its arena, host buffers from its host_alloc (pinned on cuda). */
typedef struct mf_bench {
  mf_backend *b;
  mf_bench_clock clk;
  mf_stream *s2;
  mf_event *fork, *join;
  uint8_t *arena, *host;
  size_t arena_bytes, host_bytes;
  mf_dtype storage; /* of the kernels' FLOAT operands */
  size_t elt;       /* its bytes */
} mf_bench;

/* The attention shapes: {S, D} pairs, Hq query and Hkv kv heads, B = tokens
 * / S sequences (tokens 0: B = 1). */
typedef struct mf_bench_attn {
  const int64_t (*shapes)[2];
  int64_t hq, hkv, tokens;
} mf_bench_attn;

/* The copies' size: mf_bench_links needs twice this in the arena and the host buffer. */
#define MF_BENCH_COPY_BYTES ((size_t)64 << 20)

/* Best seconds per call of fn, timed by c (NULL: the host's clock). */
mf_status mf_bench_best(bench_fn fn, void *ctx, const mf_bench_clock *c, const mf_bench_run *ri, double *best);
/* x to `digits` significant digits; rounded down with `down` (so a time it divides grows). */
double mf_bench_round_sig(double x, int digits, int down);

/* scratch_bytes: the backend's kernel scratch (kernels/registry.h mf_backend_params; 0: default). */
mf_status mf_bench_create(const char *backend, mf_threadpool *pool, mf_dtype storage, size_t arena_bytes,
                          size_t host_bytes, uint64_t scratch_bytes, mf_bench *kb);
void mf_bench_free(mf_bench *kb); /* a zeroed bench is fine */
mf_status mf_bench_upload(mf_bench *kb, void *dst, size_t n, uint32_t seed);
void mf_bench_operand(const mf_bench *kb, mf_kernel_call *k, int j, void *ptr, size_t bytes);

/* The figures (each described in `moefit profile --help`). */
mf_status mf_bench_links(mf_hwprofile *p, mf_bench *kb, const mf_bench_run *ri, int both, double *duplex,
                         double *d2d);
mf_status mf_bench_dispatch(mf_threadpool *pool, const mf_bench_run *ri, double *launch_s);
mf_status mf_bench_launch(mf_bench *kb, const mf_bench_run *ri, double *launch_s);
mf_status mf_bench_bandwidth(mf_bench *kb, const mf_bench_run *ri, double launch_s, double *bw);
mf_status mf_bench_gemm(mf_hwprofile *p, mf_bench *kb, const mf_bench_run *ri, const int64_t *sizes, int n_sizes);
mf_status mf_bench_attention(mf_hwprofile *p, mf_bench *kb, const mf_bench_run *ri, const mf_bench_attn *a,
                             int n_shapes);
mf_status mf_bench_adamw(mf_hwprofile *p, mf_threadpool *pool, const mf_bench_run *ri);
void mf_bench_cpu_model(char *buf, size_t cap);

/* ------------------------------------------------------- program kernels */

typedef struct mf_hwmeasure_prog mf_hwmeasure_prog;

typedef struct mf_hwmeasure_prog_opts {
  const char *backend;   /* the backend the calls run on, by name (kernels/registry.h) */
  mf_threadpool *pool;   /* the cpu backend's kernels */
  mf_dtype storage;      /* the program's device storage (F32 or BF16) */
  uint64_t device_room;  /* the device bytes the step may take all resident; 0: no limit (cpu) */
  int rounds, per_round; /* timed steps: rounds of per_round, each after a warm-up step */
} mf_hwmeasure_prog_opts;

/* The timer of cfg's training step on model table t (NULL: built from
 * cfg's model.init; a model.path config then is MF_ERR_CONFIG). A step over
 * o->device_room all resident: MF_ERR_OUT_OF_MEMORY naming both, before
 * anything is allocated on the device. */
mf_status mf_hwmeasure_prog_create(const mf_config *cfg, const mf_param_table *t, const mf_hwmeasure_prog_opts *o,
                                   mf_hwmeasure_prog **out);
/* One round: a warm-up step, then per_round timed steps. */
mf_status mf_hwmeasure_prog_round(mf_hwmeasure_prog *pt);
/* Fills p->kernels from the steps timed; *n_calls: the compute calls of a
 * step, *dropped: keys left out past MF_HW_MAX_KERNELS, *steps: steps timed. */
mf_status mf_hwmeasure_prog_finish(mf_hwmeasure_prog *pt, mf_hwprofile *p, int *n_calls, int *dropped, int *steps);
void mf_hwmeasure_prog_free(mf_hwmeasure_prog *pt); /* NULL is fine */

#endif /* MF_TRAIN_HWMEASURE_INTERNAL_H */
