/* A program and its plans for a training run or `moefit plan` (see plan.h
 * mf_plan_for): memory.plan, the micro-batch order, host memory and NVMe. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "planner/host.h"
#include "planner/plan.h"
#include "planner/plan_internal.h"

/* memory.overrides onto d. A forward-only program has no gradients: what the
 * overrides say about them is for the training step, not for eval. (The
 * optimizer's placement: mf_plan_apply_overrides keeps it consistent.) */
static mf_status apply_overrides(const mf_program *p, const mf_config_memory *mem, mf_decisions *d,
                                 mf_plan_pins *pins) {
  MF_CHECK(mf_plan_apply_overrides(p, mem, d, pins));
  if (p->forward_only)
    for (int32_t i = 0; i < d->n_params; i++) {
      d->grad[i] = MF_GRAD_DEVICE;
      pins->grad[i] = 0;
    }
  return MF_OK;
}

/* Expert parallelism with more than one micro-batch a rank, in micro-batch-major order, on a node of
 * several ranks: a gradient its ranks add into the node's sum in turn (any but a rank's own expert's)
 * comes home once a step, from the device. Copied home after each micro-batch, a rank's first copy would
 * wait for the rank before it to add its last — which waits in its next micro-batch's exchanges for this
 * rank. Pinned (pins may be NULL). */
static int relays_per_micro_batch(const mf_program *p) {
  return p->exchanges && p->ranks > 1 && p->node_ranks > 1 && p->G > 1 && p->order == MF_ORDER_MICRO_MAJOR &&
         !p->forward_only;
}
static void keep_relayed_grads(const mf_program *p, mf_decisions *d, mf_plan_pins *pins) {
  if (!relays_per_micro_batch(p)) return;
  for (int32_t i = 0; i < d->n_params; i++) {
    if (p->grad_tensor[i] < 0 || p->params->params[i].expert >= 0) continue;
    d->grad[i] = MF_GRAD_DEVICE;
    if (pins) pins->grad[i] = 1;
  }
}

static mf_plan_kind kind_of(mf_config_plan c) {
  switch (c) {
    case MF_CONFIG_PLAN_RESIDENT:
      return MF_PLAN_RESIDENT;
    case MF_CONFIG_PLAN_ZERO_OFFLOAD:
      return MF_PLAN_ZERO_OFFLOAD;
    case MF_CONFIG_PLAN_MEGATRAIN:
      return MF_PLAN_MEGATRAIN;
    case MF_CONFIG_PLAN_CHECKPOINT:
      return MF_PLAN_CHECKPOINT;
    case MF_CONFIG_PLAN_LEAST_MEMORY:
      return MF_PLAN_LEAST_MEMORY;
    default:
      return MF_PLAN_CHOSEN;
  }
}

/* A named plan (memory.plan: a baseline or a file) for p, memory.overrides on
 * top; it must fit the budget (UINT64_MAX: none, its own arena is the budget). */
static mf_status named_plan(const mf_plan_request *rq, const mf_sim_opts *so, const mf_program *p,
                            mf_plan **all) {
  const mf_config_memory *mem = rq->memory;
  const mf_plan_kind kind = kind_of(mem->plan_kind);
  mf_decisions *d = NULL;
  mf_plan_pins pins = {NULL, NULL, NULL, NULL};
  mf_plan *pl = NULL;
  mf_status st = MF_OK;
  char name[sizeof((mf_plan *)0)->name];
  MF_CHECK_GOTO(mf_decisions_create(p, &d), st, done);
  MF_CHECK_GOTO(mf_plan_pins_create(p, &pins), st, done);
  if (mem->plan_kind == MF_CONFIG_PLAN_FILE) {
    MF_CHECK_GOTO(mf_plan_read_json(p, mem->plan, d, NULL), st, done);
    snprintf(name, sizeof name, "%s", mem->plan);
  } else {
    MF_CHECK_GOTO(mf_plan_baseline_decisions(p, kind, d), st, done);
    snprintf(name, sizeof name, "%s", mf_plan_kind_name(kind));
  }
  if (mem->n_overrides) {
    MF_CHECK_GOTO(apply_overrides(p, mem, d, &pins), st, done);
    const size_t n = strlen(name);
    snprintf(name + n, sizeof name - n, " with memory.overrides");
  }
  keep_relayed_grads(p, d, &pins);
  MF_CHECK_GOTO(mf_plan_eval(p, rq->hw, so, d, rq->budget, kind, &pl), st, done);
  snprintf(pl->name, sizeof pl->name, "%s", name);
  if (rq->budget == UINT64_MAX) {
    pl->budget = pl->s->arena_bytes;
    pl->fits = 1;
  } else if (!pl->fits) {
    char need[32], have[32];
    st =
        MF_ERR(MF_ERR_CONFIG,
               "memory.plan: %s: %s needs a device arena of %s, more than memory.device_budget %s (raise the "
               "budget, or set memory.plan: auto to let the planner fit one)",
               mem->plan, name, mf_format_bytes(pl->s->arena_bytes, need, sizeof need),
               mf_format_bytes(rq->budget, have, sizeof have));
    goto done;
  }
  all[MF_PLAN_CHOSEN] = pl;
  pl = NULL;
  st = mf_plan_all_baselines(p, rq->hw, so, all[MF_PLAN_CHOSEN]->budget, 1, all);
done:
  mf_plan_free(pl);
  mf_plan_pins_free(&pins);
  mf_decisions_free(d);
  return st;
}

/* Host bytes left for offloaded activations: memory.host_limit (auto: the
 * profile's host memory) less what must stay in host memory — the working copy
 * (a device storage dtype other than fp32), the pinned staging limit, and,
 * without NVMe (memory.nvme_dir and a profile NVMe bandwidth), the fp32
 * master weights, gradient sums and Adam moments, which with NVMe can spill
 * (planner/host.h); each as mf_host_account counts it (so a frozen LoRA base
 * has no gradient or moments, and a bf16 one no fp32 master). UINT64_MAX
 * without a memory section. */
static uint64_t host_act_budget(const mf_plan_request *rq, const mf_program *p) {
  const mf_config_memory *mem = rq->memory;
  if (!mem) return UINT64_MAX;
  mf_host_usage u;
  if (mf_host_account(p, NULL, 0, mem, rq->hw, &u) != MF_OK) return 0;
  uint64_t keep = mem->pinned_limit + u.working_bytes;
  if (!u.nvme) keep += u.master_bytes + u.grad_bytes + u.moment_bytes;
  return u.host_limit > keep ? u.host_limit - keep : 0;
}

/* mf_plan_for's failure after it had a result: frees it, returns st. */
static mf_status drop_all(mf_status st, mf_program **prog, mf_plan **all) {
  for (int k = 0; k < MF_PLAN_KIND_COUNT_; k++) {
    mf_plan_free(all[k]);
    all[k] = NULL;
  }
  mf_program_free(*prog);
  *prog = NULL;
  return st;
}

/* One order's program and plans (a task of mf_plan_for). */
typedef struct order_job {
  const mf_plan_request *rq;
  mf_config_plan which;
  int n; /* orders planned */
  mf_program_order order[2];
  mf_sim_opts so[2]; /* the request's, with the NVMe floor of each order's program */
  int host_fits[2];  /* its host memory (estimated before planning) fits host_limit and NVMe */
  mf_program *prog[2];
  mf_plan *plans[2][MF_PLAN_KIND_COUNT_];
  mf_status st[2];
  char msg[2][1024];
} order_job;

static void order_task(void *ctx, int i, int nw) {
  order_job *j = (order_job *)ctx;
  const mf_plan_request *rq = j->rq;
  const mf_config_memory *mem = rq->memory;
  for (int o = i; o < j->n; o += nw) {
    mf_program_opts po = rq->opts;
    po.order = j->order[o];
    mf_decisions *fixed = NULL;
    mf_plan_pins pins = {NULL, NULL, NULL, NULL};
    const int overrides = mem && mem->n_overrides > 0;
    mf_progress_note("the %s step program", mf_program_order_name(po.order));
    mf_status st = mf_program_build(rq->params, &po, &j->prog[o]);
    const int relayed = st == MF_OK && relays_per_micro_batch(j->prog[o]);
    /* Optimizer state spilled to NVMe bounds the host optimizer (an estimate
     * before planning: no offloaded activations, no staging). */
    j->so[o] = rq->sim;
    j->so[o].expert_share = rq->expert_share;
    j->host_fits[o] = 1;
    if (st == MF_OK && mem) {
      mf_host_usage u;
      st = mf_host_account(j->prog[o], NULL, 0, mem, rq->hw, &u);
      j->host_fits[o] = st == MF_OK && u.unplaced_bytes == 0;
      const double spill =
          rq->hw->nvme_bandwidth > 0 ? (double)mf_host_spill_traffic_bytes(&u) / rq->hw->nvme_bandwidth : 0.0;
      if (st == MF_OK && spill > j->so[o].optimizer_floor_seconds) j->so[o].optimizer_floor_seconds = spill;
    }
    if (st == MF_OK && j->which != MF_CONFIG_PLAN_AUTO) {
      st = named_plan(rq, &j->so[o], j->prog[o], j->plans[o]);
    } else if (st == MF_OK) {
      if (overrides || relayed) st = mf_decisions_create(j->prog[o], &fixed);
      if (st == MF_OK && (overrides || relayed)) st = mf_plan_pins_create(j->prog[o], &pins);
      if (st == MF_OK && overrides) st = apply_overrides(j->prog[o], mem, fixed, &pins);
      if (st == MF_OK && relayed) keep_relayed_grads(j->prog[o], fixed, &pins);
      if (st == MF_OK)
        st = mf_plan_choose_so(j->prog[o], rq->hw, &j->so[o], rq->budget, host_act_budget(rq, j->prog[o]),
                               fixed, overrides || relayed ? &pins : NULL, 1, j->plans[o]);
    }
    mf_plan_pins_free(&pins);
    mf_decisions_free(fixed);
    j->st[o] = st;
    if (st != MF_OK) snprintf(j->msg[o], sizeof j->msg[o], "%s", mf_last_error());
  }
}

mf_status mf_plan_for(const mf_plan_request *rq, mf_program **prog, mf_plan **all) {
  *prog = NULL;
  for (int k = 0; k < MF_PLAN_KIND_COUNT_; k++) all[k] = NULL;
  const mf_config_memory *mem = rq->memory;
  order_job *j = (order_job *)calloc(1, sizeof *j);
  if (!j) return MF_ERR(MF_ERR_OUT_OF_MEMORY, "plan: out of memory");
  j->rq = rq;
  j->which = mem ? mem->plan_kind : MF_CONFIG_PLAN_AUTO;
  /* A plan file describes the training step (its gradients, its micro-batches). */
  if (j->which == MF_CONFIG_PLAN_FILE && rq->opts.forward_only) j->which = MF_CONFIG_PLAN_AUTO;
  j->order[0] = rq->opts.order;
  j->n = 1;
  if (rq->choose_order) {
    j->order[0] = MF_ORDER_MICRO_MAJOR;
    /* One micro-batch: both orders are the same program. Tied embeddings: the
     * shared matrix's gradient adds up in another grouping in layer-major
     * order (src/model/program.h), so only micro-batch-major keeps the bits of
     * a run that fits. */
    if (rq->opts.grad_accum > 1 && !rq->params->spec.tie_embeddings && !rq->opts.forward_only)
      j->order[j->n++] = MF_ORDER_LAYER_MAJOR;
  }
  /* Both orders at once, on two threads (each plans on its own threads too). */
  mf_threadpool *two = NULL;
  if (j->n > 1 && mf_threadpool_create(2, &two) != MF_OK) two = NULL;
  if (two)
    mf_threadpool_run(two, order_task, j);
  else
    order_task(j, 0, 1);
  mf_threadpool_free(two);
  const int n = j->n;
  mf_status first_err = MF_OK;
  const char *first_msg = "";
  int kept_fits = 0;
  for (int o = 0; o < n; o++) {
    if (j->st[o] != MF_OK) {
      if (first_err == MF_OK) first_err = j->st[o], first_msg = j->msg[o];
      continue;
    }
    MF_LOGD("plan", "%s order: %.4f s/step predicted (host optimizer at least %.3f s); host memory %s",
            mf_program_order_name(j->order[o]), j->plans[o][MF_PLAN_CHOSEN]->sim.step_seconds,
            j->so[o].optimizer_floor_seconds, j->host_fits[o] ? "fits" : "does not fit");
    /* One whose host memory fits over one whose does not; then the faster;
     * on a tie the first (micro-batch-major). */
    const int better = !*prog || j->host_fits[o] > kept_fits ||
                       (j->host_fits[o] == kept_fits && j->plans[o][MF_PLAN_CHOSEN]->sim.step_seconds <
                                                            all[MF_PLAN_CHOSEN]->sim.step_seconds);
    if (better) {
      kept_fits = j->host_fits[o];
      for (int k = 0; k < MF_PLAN_KIND_COUNT_; k++) { /* the slower one kept before */
        mf_plan_free(all[k]);
        all[k] = j->plans[o][k];
        j->plans[o][k] = NULL;
      }
      mf_program_free(*prog);
      *prog = j->prog[o];
      j->prog[o] = NULL;
    }
  }
  for (int o = 0; o < n; o++) {
    for (int k = 0; k < MF_PLAN_KIND_COUNT_; k++) mf_plan_free(j->plans[o][k]);
    mf_program_free(j->prog[o]);
  }
  if (!*prog) {
    mf_status st = MF_ERR(first_err, "%s", first_msg);
    free(j);
    return st;
  }
  free(j);
  if (mem) {
    /* The NVMe floor again, now with the chosen plan's offloaded activations
     * (which leave less host memory to the optimizer's state): every plan
     * shown is simulated again with it, so they compare alike. */
    mf_plan *c = all[MF_PLAN_CHOSEN];
    /* Every parameter counted as the host's, as the estimate did: the
     * simulation scales the floor by the host's share of the parameters
     * (mf_sim_opts.optimizer_floor_seconds), so it is the figure for all of
     * them. */
    mf_schedule every_host = *c->s;
    every_host.optim_device = NULL;
    mf_host_usage u;
    mf_status st = mf_host_account(*prog, &every_host, 0, mem, rq->hw, &u);
    const double floor =
        rq->hw->nvme_bandwidth > 0 ? (double)mf_host_spill_traffic_bytes(&u) / rq->hw->nvme_bandwidth : 0.0;
    if (st == MF_OK && floor > c->so.optimizer_floor_seconds) {
      mf_sim_opts so = c->so;
      so.optimizer_floor_seconds = floor;
      for (int k = 0; k < MF_PLAN_KIND_COUNT_; k++)
        if (all[k]) mf_plan_set_sim_opts(all[k], &so);
    }
    if (st != MF_OK) return drop_all(st, prog, all);
  }
  /* What is not simulated: the baselines over the budget of the order kept,
   * and every plan after a new NVMe floor. */
  for (int k = 0; k < MF_PLAN_KIND_COUNT_; k++) {
    const mf_status st = all[k] ? mf_plan_simulate(all[k]) : MF_OK;
    if (st != MF_OK) return drop_all(st, prog, all);
  }
  return MF_OK;
}
