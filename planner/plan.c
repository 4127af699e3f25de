/* Plans evaluated (scheduled and simulated) and the baselines (see plan.h);
 * the choice is in choose.c, programs and named plans in plan_for.c. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "planner/plan.h"
#include "planner/plan_internal.h"

const char *mf_plan_kind_name(mf_plan_kind k) {
  static const char *const names[MF_PLAN_KIND_COUNT_] = {
      "chosen",         "all resident",           "ZeRO-Offload-like",
      "MegaTrain-like", "checkpoint every layer", "least memory"};
  return ((int)k >= 0 && k < MF_PLAN_KIND_COUNT_) ? names[k] : "unknown";
}

/* 1 when buf (cap bytes) receives "dir/name" and that file is readable. */
static int readable_in(const char *dir, const char *name, char *buf, size_t cap) {
  if (!dir || !*dir) return 0;
  const int n = snprintf(buf, cap, "%s/%s", dir, name);
  return n > 0 && (size_t)n < cap && access(buf, R_OK) == 0;
}

const char *mf_plan_profile_path(const char *setting, const char *backend, const char *out_dir, char *buf,
                                 size_t cap, mf_plan_profile_origin *origin) {
  const int cuda = backend && strcmp(backend, "cuda") == 0;
  const char *measured = cuda ? "runs/hw/cuda.yaml" : "runs/hw/cpu.yaml";
  mf_plan_profile_origin o = MF_PROFILE_MEASURED;
  if (setting && strcmp(setting, "auto") != 0) {
    o = MF_PROFILE_NAMED;
    snprintf(buf, cap, "%s", setting);
  } else if (cuda && readable_in(out_dir, MF_PLAN_CUDA_PROFILE_CACHE, buf, cap)) {
    /* measured for this run's output dir: buf holds it */
  } else if (access(measured, R_OK) == 0) {
    snprintf(buf, cap, "%s", measured);
  } else {
    o = MF_PROFILE_BUNDLED;
    snprintf(buf, cap, "%s", cuda ? MF_PLAN_CUDA_PROFILE_BUNDLED : MF_PLAN_CPU_PROFILE_BUNDLED);
  }
  if (origin) *origin = o;
  return buf;
}

void mf_plan_free(mf_plan *pl) {
  if (!pl) return;
  mf_decisions_free(pl->d);
  mf_schedule_free(pl->s);
  mf_sim_result_free(&pl->sim);
  free(pl);
}

/* Schedules d and simulates it with so (NULL: defaults): always, or with
 * `lazy` only when it fits the budget (mf_plan_simulate does the rest). */
static mf_status eval(const mf_program *p, const mf_hwprofile *hw, const mf_sim_opts *so, const mf_decisions *d,
                      uint64_t budget, mf_plan_kind kind, int lazy, mf_plan **out) {
  *out = NULL;
  mf_plan *pl = (mf_plan *)calloc(1, sizeof *pl);
  if (!pl) return MF_ERR(MF_ERR_OUT_OF_MEMORY, "plan: out of memory");
  pl->kind = kind;
  pl->prog = p;
  pl->hw = hw;
  if (so) pl->so = *so;
  pl->budget = budget;
  snprintf(pl->name, sizeof pl->name, "%s",
           kind == MF_PLAN_CHOSEN ? "the planner's choice" : mf_plan_kind_name(kind));
  mf_status st = MF_OK;
  MF_CHECK_GOTO(mf_decisions_create(p, &pl->d), st, fail);
  MF_CHECK_GOTO(mf_decisions_copy(d, pl->d), st, fail);
  MF_CHECK_GOTO(mf_schedule_build(p, pl->d, &pl->s), st, fail);
  pl->fits = pl->s->arena_bytes <= budget;
  if (!lazy || pl->fits) MF_CHECK_GOTO(mf_plan_simulate(pl), st, fail);
  *out = pl;
  return MF_OK;
fail:
  mf_plan_free(pl);
  return st;
}

mf_status mf_plan_eval(const mf_program *p, const mf_hwprofile *hw, const mf_sim_opts *so,
                       const mf_decisions *d, uint64_t budget, mf_plan_kind kind, mf_plan **out) {
  return eval(p, hw, so, d, budget, kind, 0, out);
}

void mf_plan_set_sim_opts(mf_plan *pl, const mf_sim_opts *so) {
  mf_sim_result_free(&pl->sim);
  pl->so = *so;
  pl->simulated = 0;
}

mf_status mf_plan_simulate(mf_plan *pl) {
  if (pl->simulated) return MF_OK;
  MF_CHECK(mf_simulate(pl->s, pl->hw, &pl->so, &pl->sim));
  pl->simulated = 1;
  return MF_OK;
}

mf_status mf_plan_evaluate(const mf_program *p, const mf_hwprofile *hw, const mf_decisions *d,
                           uint64_t budget, mf_plan_kind kind, mf_plan **out) {
  return mf_plan_eval(p, hw, NULL, d, budget, kind, out);
}

mf_status mf_plan_evaluate_like(const mf_plan *like, const mf_decisions *d, mf_plan **out) {
  return mf_plan_eval(like->prog, like->hw, &like->so, d, like->budget, like->kind, out);
}

mf_plan_bound_kind mf_plan_bound(const mf_plan *pl) {
  const mf_sim_result *r = &pl->sim;
  const double c = r->compute_seconds, x = r->exposed_transfer_seconds, o = r->exposed_optimizer_seconds;
  if (o > c && o >= x) {
    const double adamw = mf_hw_adamw_seconds(pl->hw, (double)pl->prog->params->trainable_numel);
    return pl->so.optimizer_floor_seconds > adamw ? MF_BOUND_NVME : MF_BOUND_HOST_OPTIMIZER;
  }
  if (x > c) return r->busy[MF_SIM_D2H] > r->busy[MF_SIM_H2D] ? MF_BOUND_COPIES_HOME : MF_BOUND_UPLOADS;
  return MF_BOUND_COMPUTE;
}

const char *mf_plan_bound_name(mf_plan_bound_kind k) {
  static const char *const names[] = {"compute", "uploads", "copies home", "host optimizer", "NVMe"};
  return (int)k >= 0 && k <= MF_BOUND_NVME ? names[k] : "unknown";
}

void mf_plan_bound_line(const mf_plan *pl, int overlap, char *buf, size_t cap) {
  const mf_sim_result *r = &pl->sim;
  const mf_plan_bound_kind k = mf_plan_bound(pl);
  char nvme[96] = "";
  if (k == MF_BOUND_NVME)
    snprintf(nvme, sizeof nvme, "; its state's NVMe traffic alone takes %.4g s", pl->so.optimizer_floor_seconds);
  snprintf(buf, cap,
           "bound: %s: the %.4g s step is compute %.4g s + %.4g s waiting on copies (H2D busy %.4g s, D2H %.4g "
           "s) + %.4g s waiting on the host optimizer (its updates %.4g s%s%s)",
           mf_plan_bound_name(k), r->step_seconds, r->compute_seconds, r->exposed_transfer_seconds,
           r->busy[MF_SIM_H2D], r->busy[MF_SIM_D2H], r->exposed_optimizer_seconds, r->optimizer_seconds,
           r->optimizer_seconds > 0 ? (overlap ? ", behind the next step's device work" : ", after the step") : "",
           nvme);
}

/* A layer's output (the residual stream after it): the checkpoint a layer's
 * recompute starts from. Recomputing it instead would drag every earlier
 * layer's forward into each backward step. */
static int is_layer_output(const mf_program *p, int32_t t) {
  const char *n = strstr(p->tensors[t].name, ".model.layers.");
  if (!n) return 0;
  const char *dot = strchr(n + strlen(".model.layers."), '.');
  return dot && strcmp(dot, ".out") == 0;
}

/* Every activation the backward reads: layer outputs offloaded, the rest
 * recomputed where they can be, else offloaded. opt: mf_schedule_act_options. */
void mf_plan_least_activations(const mf_program *p, const uint8_t *opt, mf_decisions *d) {
  for (int32_t t = 0; t < p->n_tensors; t++) {
    if (!opt[t]) continue;
    d->act[t] = (opt[t] == 3 && !is_layer_output(p, t)) ? MF_ACT_RECOMPUTE : MF_ACT_OFFLOAD;
  }
}

mf_status mf_plan_baseline_decisions(const mf_program *p, mf_plan_kind kind, mf_decisions *d) {
  uint8_t *opt = (uint8_t *)malloc((size_t)p->n_tensors + 1);
  if (!opt) return MF_ERR(MF_ERR_OUT_OF_MEMORY, "plan: out of memory");
  mf_status st = mf_schedule_act_options(p, opt);
  if (st != MF_OK) {
    free(opt);
    return st;
  }
  for (int32_t i = 0; i < d->n_params; i++) {
    int stream_w = kind == MF_PLAN_MEGATRAIN || kind == MF_PLAN_LEAST_MEMORY;
    int stream_g = kind == MF_PLAN_ZERO_OFFLOAD || kind == MF_PLAN_MEGATRAIN || kind == MF_PLAN_LEAST_MEMORY;
    d->param[i] = stream_w ? MF_PARAM_STREAM : MF_PARAM_RESIDENT;
    d->grad[i] = (stream_g && !p->forward_only) ? MF_GRAD_STREAM : MF_GRAD_DEVICE;
    /* All resident and checkpointing update on the device, as plain PyTorch
     * does; the offloading baselines keep the host optimizer, and so does
     * every plan of several data-parallel ranks (their gradients meet at
     * home). */
    const int device_optim = (kind == MF_PLAN_RESIDENT || kind == MF_PLAN_CHECKPOINT) && p->ranks <= 1;
    d->optim[i] = device_optim && !p->forward_only && p->adamw_op && p->adamw_op[i] >= 0 ? MF_OPTIM_DEVICE
                                                                                         : MF_OPTIM_HOST;
  }
  memset(d->act, MF_ACT_KEEP, (size_t)d->n_tensors);
  if (kind == MF_PLAN_LEAST_MEMORY) mf_plan_least_activations(p, opt, d);
  /* Both keep each layer's input and recompute the layer from it. */
  if (kind == MF_PLAN_MEGATRAIN || kind == MF_PLAN_CHECKPOINT)
    for (int32_t t = 0; t < p->n_tensors; t++)
      if (opt[t] == 3 && !is_layer_output(p, t)) d->act[t] = MF_ACT_RECOMPUTE;
  free(opt);
  return MF_OK;
}

mf_status mf_plan_baseline_so(const mf_program *p, const mf_hwprofile *hw, const mf_sim_opts *so,
                              mf_plan_kind kind, uint64_t budget, int lazy, mf_plan **out) {
  mf_decisions *d = NULL;
  MF_CHECK(mf_decisions_create(p, &d));
  mf_status st = mf_plan_baseline_decisions(p, kind, d);
  if (st == MF_OK) st = eval(p, hw, so, d, budget, kind, lazy, out);
  mf_decisions_free(d);
  return st;
}

mf_status mf_plan_baseline(const mf_program *p, const mf_hwprofile *hw, mf_plan_kind kind, uint64_t budget,
                           mf_plan **out) {
  return mf_plan_baseline_so(p, hw, NULL, kind, budget, 0, out);
}

/* Work spread over the planner's threads: worker i takes items i, i + n, ...
 * Each item's result depends on the item only, so any thread count gives the
 * same plan. A failing worker's status and message come back to the caller. */
void mf_plan_par_fail(mf_plan_par *q, int i, mf_status st) {
  q->st[i] = st;
  snprintf(q->msg[i], sizeof q->msg[i], "%s", mf_last_error());
}

mf_status mf_plan_par_status(const mf_plan_par *q, int n) {
  for (int i = 0; i < n; i++)
    if (q->st[i] != MF_OK) return MF_ERR(q->st[i], "%s", q->msg[i]);
  return MF_OK;
}

int mf_plan_pool_size(mf_threadpool *pool) {
  int n = pool ? mf_threadpool_size(pool) : 1;
  return n < MF_PLAN_MAX_WORKERS ? n : MF_PLAN_MAX_WORKERS;
}

typedef struct baseline_job {
  mf_plan_par q;
  const mf_program *p;
  const mf_hwprofile *hw;
  const mf_sim_opts *so;
  uint64_t budget;
  int lazy;
  mf_plan **all;
} baseline_job;

static void baseline_task(void *ctx, int i, int nw) {
  baseline_job *j = (baseline_job *)ctx;
  if (i >= MF_PLAN_MAX_WORKERS) return;
  if (nw > MF_PLAN_MAX_WORKERS) nw = MF_PLAN_MAX_WORKERS;
  for (int k = MF_PLAN_RESIDENT + i; k <= MF_PLAN_CHECKPOINT; k += nw) {
    mf_status st = mf_plan_baseline_so(j->p, j->hw, j->so, (mf_plan_kind)k, j->budget, j->lazy, &j->all[k]);
    if (st != MF_OK) {
      mf_plan_par_fail(&j->q, i, st);
      return;
    }
  }
}

/* Evaluates the baselines into all[RESIDENT..CHECKPOINT] and, unless
 * `pinned`, replaces *best with the fastest that fits when it beats it. */
mf_status mf_plan_adopt_baselines(const mf_program *p, const mf_hwprofile *hw, const mf_sim_opts *so,
                                  uint64_t budget, int pinned, int lazy, mf_threadpool *pool, mf_plan **best,
                                  mf_plan **all) {
  baseline_job *j = (baseline_job *)calloc(1, sizeof *j);
  if (!j) return MF_ERR(MF_ERR_OUT_OF_MEMORY, "plan: out of memory");
  j->p = p, j->hw = hw, j->so = so, j->budget = budget, j->lazy = lazy, j->all = all;
  mf_threadpool_run(pool, baseline_task, j);
  mf_status st = mf_plan_par_status(&j->q, mf_plan_pool_size(pool));
  free(j);
  if (st != MF_OK) return st;
  for (int k = MF_PLAN_RESIDENT; k <= MF_PLAN_CHECKPOINT; k++) {
    if (pinned || !all[k]->fits || all[k]->sim.step_seconds >= (*best)->sim.step_seconds) continue;
    mf_plan *b = NULL;
    MF_CHECK(mf_plan_eval(p, hw, so, all[k]->d, budget, MF_PLAN_CHOSEN, &b));
    mf_plan_free(*best);
    *best = b;
  }
  return MF_OK;
}

/* The baselines of p beside `all[MF_PLAN_CHOSEN]`, on the planner's threads. */
mf_status mf_plan_all_baselines(const mf_program *p, const mf_hwprofile *hw, const mf_sim_opts *so,
                                uint64_t budget, int lazy, mf_plan **all) {
  mf_threadpool *pool = NULL;
  MF_CHECK(mf_threadpool_create(0, &pool));
  baseline_job *j = (baseline_job *)calloc(1, sizeof *j);
  mf_status st = MF_OK;
  if (!j) {
    st = MF_ERR(MF_ERR_OUT_OF_MEMORY, "plan: out of memory");
  } else {
    j->p = p, j->hw = hw, j->so = so, j->budget = budget, j->lazy = lazy, j->all = all;
    mf_threadpool_run(pool, baseline_task, j);
    st = mf_plan_par_status(&j->q, mf_plan_pool_size(pool));
    free(j);
  }
  mf_threadpool_free(pool);
  if (st == MF_OK)
    st = mf_plan_baseline_so(p, hw, so, MF_PLAN_LEAST_MEMORY, budget, lazy, &all[MF_PLAN_LEAST_MEMORY]);
  return st;
}
