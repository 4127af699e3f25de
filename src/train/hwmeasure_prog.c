/* The timer of one training step's kernel calls (hwmeasure_internal.h):
 * what fills a profile's compute.kernels, on the cpu or the cuda backend.
 *
 * Every compute instruction of the config's step is timed (all tensors
 * resident: every op once, in program order; a planned schedule runs the
 * same calls, recomputes included, so their keys and times carry over) by
 * the executor's per-instruction timing (the backend's timed events). The
 * program is built as the run builds it in the storage it would use
 * (mf_run_plan_storage: on BF16 the executor uploads a bf16 working copy of
 * the weights, rounded here once), so each call's key (mf_sim_instr_key:
 * kernel, sizes, operand bytes) is the one the planner looks up. The steps
 * are taken in rounds spread over the whole profile run (a round between
 * each of the other measurements), and each call's time is its median over
 * the fastest half of all those steps: another process taking a core for a
 * while slows whole steps, and this is the "best of several runs" of the
 * other figures for calls too short to time one by one (a call's own
 * best-of would be a lucky draw; the median is what a step pays). Times are
 * averaged per key; more keys than MF_HW_MAX_KERNELS: those with the least
 * time per step are left to the rate model. Nothing allocates per step. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/registry.h"
#include "planner/run_plan.h"
#include "planner/schedule.h"
#include "planner/simulate.h"
#include "src/exec/exec.h"
#include "src/model/program.h"
#include "src/train/hwmeasure_internal.h"

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

struct mf_hwmeasure_prog {
  mf_param_table *own_t; /* built from model.init (else the caller's table is used) */
  const mf_param_table *t;
  mf_program *prog;
  mf_backend *be;
  mf_exec *x;
  mf_decisions *dec;
  mf_schedule *sched;
  float *w, *g;
  uint16_t *working; /* BF16 storage: the weights rounded, what the executor uploads */
  int32_t **ids, **tg;
  int64_t G;
  int32_t n;     /* instructions */
  int per_round; /* timed steps per round (after one warm-up step) */
  int steps;     /* timed so far */
  int cap;       /* rounds * per_round */
  double *times; /* [n][cap] */
};

void mf_hwmeasure_prog_free(mf_hwmeasure_prog *pt) {
  if (!pt) return;
  for (int64_t m = 0; m < pt->G; m++) {
    if (pt->ids) free(pt->ids[m]);
    if (pt->tg) free(pt->tg[m]);
  }
  free(pt->ids);
  free(pt->tg);
  free(pt->w);
  free(pt->g);
  free(pt->working);
  free(pt->times);
  mf_exec_free(pt->x);
  mf_schedule_free(pt->sched);
  mf_decisions_free(pt->dec);
  mf_backend_free(pt->be);
  mf_program_free(pt->prog);
  mf_param_table_free(pt->own_t);
  free(pt);
}

/* The step program as the run builds it, and its all-resident schedule. */
static mf_status build_program(mf_hwmeasure_prog *pt, const mf_config *cfg, const mf_hwmeasure_prog_opts *o) {
  const mf_param_table *t = pt->t;
  const double aux = isnan(cfg->train.aux_loss_coef) ? t->spec.router_aux_loss_coef : cfg->train.aux_loss_coef;
  mf_program_opts po = {.micro_batch = cfg->train.micro_batch,
                        .seq_len = cfg->data.seq_len,
                        .grad_accum = pt->G,
                        .aux_coef = aux,
                        .order = cfg->train.micro_batch_order == MF_CONFIG_MB_ORDER_LAYER ? MF_ORDER_LAYER_MAJOR
                                                                                            : MF_ORDER_MICRO_MAJOR,
                        .storage = o->storage,
                        .moments = cfg->train.adam_moments == MF_CONFIG_MOMENTS_BF16 ? MF_DTYPE_BF16
                                                                                      : MF_DTYPE_F32};
  MF_CHECK(mf_program_build(t, &po, &pt->prog));
  MF_CHECK(mf_decisions_create(pt->prog, &pt->dec));
  MF_CHECK(mf_schedule_build(pt->prog, pt->dec, &pt->sched));
  if (o->device_room > 0 && pt->sched->arena_bytes > o->device_room) {
    char a[32], b[32];
    return MF_ERR(MF_ERR_OUT_OF_MEMORY,
                  "timing the training step needs %s on the device with every tensor resident, over the %s "
                  "the GPU has free beside the benchmarks: compute.kernels needs a smaller step (train.micro_batch, "
                  "data.seq_len) or model",
                  mf_format_bytes(pt->sched->arena_bytes, a, sizeof a), mf_format_bytes(o->device_room, b, sizeof b));
  }
  return MF_OK;
}

/* Random weights (and their bf16 working copy) and tokens. */
static mf_status make_inputs(mf_hwmeasure_prog *pt, mf_dtype storage) {
  const mf_param_table *t = pt->t;
  const size_t np = (size_t)t->total_numel, T = (size_t)(pt->prog->B * pt->prog->S);
  MF_CHECK(mf_malloc(np * sizeof(float), "weights", (void **)&pt->w));
  MF_CHECK(mf_malloc(np * sizeof(float), "gradients", (void **)&pt->g));
  mf_params_init_random(t, t->spec.seed, 0.02f, pt->w);
  if (storage == MF_DTYPE_BF16) {
    MF_CHECK(mf_malloc((np ? np : 1) * sizeof(uint16_t), "the bf16 working copy", (void **)&pt->working));
    mf_fp32_to_bf16_n(pt->w, pt->working, np);
    mf_exec_set_working_copy(pt->x, pt->working);
  }
  MF_CHECK(mf_calloc((size_t)pt->G, sizeof(int32_t *), "token pointers", (void **)&pt->ids));
  MF_CHECK(mf_calloc((size_t)pt->G, sizeof(int32_t *), "token pointers", (void **)&pt->tg));
  uint32_t seed = 12345;
  for (int64_t m = 0; m < pt->G; m++) {
    MF_CHECK(mf_malloc(T * sizeof(int32_t), "token ids", (void **)&pt->ids[m]));
    MF_CHECK(mf_malloc(T * sizeof(int32_t), "targets", (void **)&pt->tg[m]));
    for (size_t i = 0; i < T; i++) {
      seed = seed * 1664525u + 1013904223u;
      pt->ids[m][i] = (int32_t)((seed >> 8) % (uint32_t)t->spec.vocab);
      seed = seed * 1664525u + 1013904223u;
      pt->tg[m][i] = (int32_t)((seed >> 8) % (uint32_t)t->spec.vocab);
    }
  }
  return MF_OK;
}

mf_status mf_hwmeasure_prog_create(const mf_config *cfg, const mf_param_table *t, const mf_hwmeasure_prog_opts *o,
                                   mf_hwmeasure_prog **out) {
  *out = NULL;
  if (!t && !cfg->model.has_init)
    return MF_ERR(MF_ERR_CONFIG, "profile --config: model: only a model.init config can be timed (a profile reads "
                  "no checkpoint)");
  mf_hwmeasure_prog *pt = NULL;
  MF_CHECK(mf_calloc(1, sizeof *pt, "program timer", (void **)&pt));
  mf_status st = MF_OK;
  pt->G = cfg->train.grad_accum;
  pt->per_round = o->per_round;
  pt->cap = o->rounds * o->per_round;
  if (!t) MF_CHECK_GOTO(mf_param_table_build(&cfg->model.init, &pt->own_t), st, fail);
  pt->t = t ? t : pt->own_t;
  MF_CHECK_GOTO(build_program(pt, cfg, o), st, fail);
  mf_run_kernels k; /* the kernels the config's run would run */
  mf_run_plan_kernels(cfg, o->backend, o->storage, &k);
  const mf_backend_params bp = {.pool = o->pool,
                                .streams = MF_CPU_STREAMS_IMMEDIATE,
                                .scratch_bytes = mf_backend_attention_scratch(
                                    o->backend, o->storage, strcmp(k.attention, "cudnn") == 0,
                                    cfg->train.micro_batch, cfg->data.seq_len, pt->t->spec.heads,
                                    pt->t->spec.kv_heads, pt->t->spec.head_dim)};
  MF_CHECK_GOTO(mf_backend_create(o->backend, &bp, &pt->be), st, fail);
  MF_CHECK_GOTO(mf_backend_set_kernels(pt->be, k.expert_gemm, k.attention), st, fail);
  MF_CHECK_GOTO(mf_exec_create_scheduled(pt->prog, pt->sched, pt->be, &pt->x), st, fail);
  MF_CHECK_GOTO(mf_exec_set_instr_timing(pt->x, 1), st, fail);
  pt->n = pt->sched->n_instr;
  MF_CHECK_GOTO(make_inputs(pt, o->storage), st, fail);
  MF_CHECK_GOTO(mf_malloc((size_t)pt->n * (size_t)pt->cap * sizeof(double) + 1, "kernel times", (void **)&pt->times),
                st, fail);
  *out = pt;
  return MF_OK;
fail:
  mf_hwmeasure_prog_free(pt);
  return st;
}

mf_status mf_hwmeasure_prog_round(mf_hwmeasure_prog *pt) {
  for (int r = -1; r < pt->per_round && pt->steps < pt->cap; r++) {
    mf_step_result sr;
    MF_CHECK(mf_exec_step(pt->x, pt->w, (const int32_t *const *)pt->ids, (const int32_t *const *)pt->tg, pt->g, &sr));
    if (r < 0) continue;
    const double *is = mf_exec_instr_seconds(pt->x);
    if (!is) return MF_ERR(MF_ERR_UNSUPPORTED, "profile: the %s backend does not time its streams", pt->be->name);
    for (int32_t i = 0; i < pt->n; i++) pt->times[(size_t)i * (size_t)pt->cap + (size_t)pt->steps] = is[i];
    pt->steps++;
  }
  return MF_OK;
}

mf_status mf_hwmeasure_prog_finish(mf_hwmeasure_prog *pt, mf_hwprofile *p, int *n_calls, int *dropped, int *steps) {
  const int reps = pt->steps, cap = pt->cap;
  const int32_t n = pt->n;
  if (reps < 1) return MF_ERR(MF_ERR_INTERNAL, "profile: no program step was timed");
  double *kept = NULL;
  step_rank *rank = NULL;
  kacc *acc = NULL;
  int n_acc = 0;
  mf_status st = MF_OK;
  *n_calls = 0;
  *dropped = 0;
  *steps = reps;
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

