/* The planner's choice and the baselines (see plan.h). */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "planner/plan.h"

const char *mf_plan_kind_name(mf_plan_kind k) {
  static const char *const names[MF_PLAN_KIND_COUNT_] = {"chosen", "all resident", "ZeRO-Offload-like",
                                                          "MegaTrain-like", "checkpoint every layer",
                                                          "least memory"};
  return ((int)k >= 0 && k < MF_PLAN_KIND_COUNT_) ? names[k] : "unknown";
}

const char *mf_plan_profile_path(const char *setting) {
  if (setting && strcmp(setting, "auto") != 0) return setting;
  if (access("runs/hw/cpu.yaml", R_OK) == 0) return "runs/hw/cpu.yaml";
  return "configs/hw/cpu-2core.yaml";
}

void mf_plan_free(mf_plan *pl) {
  if (!pl) return;
  mf_decisions_free(pl->d);
  mf_schedule_free(pl->s);
  mf_sim_result_free(&pl->sim);
  free(pl);
}

mf_status mf_plan_evaluate(const mf_program *p, const mf_hwprofile *hw, const mf_decisions *d, uint64_t budget,
                           mf_plan_kind kind, mf_plan **out) {
  *out = NULL;
  mf_plan *pl = (mf_plan *)calloc(1, sizeof *pl);
  if (!pl) return MF_ERR(MF_ERR_OUT_OF_MEMORY, "plan: out of memory");
  pl->kind = kind;
  pl->prog = p;
  pl->budget = budget;
  mf_status st = MF_OK;
  MF_CHECK_GOTO(mf_decisions_create(p, &pl->d), st, fail);
  MF_CHECK_GOTO(mf_decisions_copy(d, pl->d), st, fail);
  MF_CHECK_GOTO(mf_schedule_build(p, pl->d, &pl->s), st, fail);
  MF_CHECK_GOTO(mf_simulate(pl->s, hw, NULL, &pl->sim), st, fail);
  pl->fits = pl->s->arena_bytes <= budget;
  *out = pl;
  return MF_OK;
fail:
  mf_plan_free(pl);
  return st;
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
static void least_activations(const mf_program *p, const uint8_t *opt, mf_decisions *d) {
  for (int32_t t = 0; t < p->n_tensors; t++) {
    if (!opt[t]) continue;
    d->act[t] = (opt[t] == 3 && !is_layer_output(p, t)) ? MF_ACT_RECOMPUTE : MF_ACT_OFFLOAD;
  }
}

static mf_status baseline_decisions(const mf_program *p, mf_plan_kind kind, mf_decisions *d) {
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
  }
  memset(d->act, MF_ACT_KEEP, (size_t)d->n_tensors);
  if (kind == MF_PLAN_LEAST_MEMORY) least_activations(p, opt, d);
  /* Both keep each layer's input and recompute the layer from it. */
  if (kind == MF_PLAN_MEGATRAIN || kind == MF_PLAN_CHECKPOINT)
    for (int32_t t = 0; t < p->n_tensors; t++)
      if (opt[t] == 3 && !is_layer_output(p, t)) d->act[t] = MF_ACT_RECOMPUTE;
  free(opt);
  return MF_OK;
}

mf_status mf_plan_baseline(const mf_program *p, const mf_hwprofile *hw, mf_plan_kind kind, uint64_t budget,
                           mf_plan **out) {
  mf_decisions *d = NULL;
  MF_CHECK(mf_decisions_create(p, &d));
  mf_status st = baseline_decisions(p, kind, d);
  if (st == MF_OK) st = mf_plan_evaluate(p, hw, d, budget, kind, out);
  mf_decisions_free(d);
  return st;
}

/* ------------------------------------------------------------ the choice */

typedef enum cand_kind { C_PARAMS_RESIDENT = 0, C_GRADS_DEVICE, C_ACT_KEEP, C_ACT_OFFLOAD } cand_kind;

typedef struct cand {
  cand_kind kind;
  int32_t layer;       /* C_PARAMS_*, C_GRADS_*: the layer (-1: embeddings, final norm, head) */
  int32_t klass;       /* C_ACT_*: index of the activation class, or -1 for the whole layer */
  double gain;         /* predicted seconds saved against the least-memory plan */
  double bytes;        /* extra arena bytes */
  double score;
} cand;

/* The "class" of a per-micro-batch tensor is its name without "mbN.". */
static const char *class_name(const char *name) {
  if (name[0] == 'm' && name[1] == 'b') {
    const char *dot = strchr(name, '.');
    if (dot) return dot + 1;
  }
  return name;
}

static int cmp_class(const void *a, const void *b, void *arg) {
  const mf_program *p = (const mf_program *)arg;
  int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
  int c = strcmp(class_name(p->tensors[x].name), class_name(p->tensors[y].name));
  return c ? c : x - y;
}

typedef struct chooser {
  const mf_program *p;
  const mf_hwprofile *hw;
  uint64_t budget;
  const mf_plan_pins *pins;
  int32_t *klass;      /* [n_tensors] activation class id, -1 for others */
  int32_t n_klass;
  int32_t *klass_layer;
  int coarse;          /* one activation candidate per layer instead of per class */
} chooser;

static int pinned_param(const chooser *c, int32_t i) { return c->pins && c->pins->param[i]; }
static int pinned_grad(const chooser *c, int32_t i) { return c->pins && c->pins->grad[i]; }
static int pinned_act(const chooser *c, int32_t t) { return c->pins && c->pins->act[t]; }

/* Applies candidate k to d; returns how many decisions it changed. */
static int apply(const chooser *c, const cand *k, mf_decisions *d) {
  const mf_program *p = c->p;
  int changed = 0;
  if (k->kind == C_PARAMS_RESIDENT || k->kind == C_GRADS_DEVICE) {
    for (int32_t i = 0; i < d->n_params; i++) {
      if (p->params->params[i].layer != k->layer) continue;
      if (k->kind == C_PARAMS_RESIDENT && !pinned_param(c, i) && d->param[i] != MF_PARAM_RESIDENT)
        d->param[i] = MF_PARAM_RESIDENT, changed++;
      if (k->kind == C_GRADS_DEVICE && !pinned_grad(c, i) && d->grad[i] != MF_GRAD_DEVICE)
        d->grad[i] = MF_GRAD_DEVICE, changed++;
    }
    return changed;
  }
  for (int32_t t = 0; t < p->n_tensors; t++) {
    if (c->klass[t] < 0 || pinned_act(c, t)) continue;
    int match = k->klass >= 0 ? c->klass[t] == k->klass : p->tensors[t].layer == k->layer;
    if (!match) continue;
    if (k->kind == C_ACT_KEEP && d->act[t] != MF_ACT_KEEP) d->act[t] = MF_ACT_KEEP, changed++;
    if (k->kind == C_ACT_OFFLOAD && d->act[t] == MF_ACT_RECOMPUTE && mf_schedule_can_offload(p, t))
      d->act[t] = MF_ACT_OFFLOAD, changed++;
  }
  return changed;
}

static int cmp_score(const void *a, const void *b) {
  const cand *x = (const cand *)a, *y = (const cand *)b;
  if (x->score != y->score) return x->score > y->score ? -1 : 1;
  if (x->kind != y->kind) return (int)x->kind - (int)y->kind;
  if (x->layer != y->layer) return x->layer - y->layer;
  return x->klass - y->klass;
}

/* A budget below the least-memory plan: say what it needs and what takes it. */
static mf_status too_small(const chooser *c, const mf_plan *least) {
  const mf_program *p = c->p;
  const mf_schedule *s = least->s;
  char need[32], have[32], list[1024];
  size_t n = 0;
  list[0] = 0;
  /* The largest slots alive at the peak. */
  for (int round = 0; round < 4; round++) {
    int32_t best = -1;
    for (int32_t i = 0; i < s->n_slots; i++) {
      const mf_slot *x = &s->slots[i];
      if (x->first > s->peak_instr || x->last < s->peak_instr) continue;
      size_t b = p->tensors[x->tensor].bytes;
      int already = strstr(list, p->tensors[x->tensor].name) != NULL;
      if (!already && (best < 0 || b > p->tensors[s->slots[best].tensor].bytes)) best = i;
    }
    if (best < 0) break;
    char sz[32];
    n += (size_t)snprintf(list + n, sizeof list - n, "%s%s (%s)", round ? ", " : "",
                          p->tensors[s->slots[best].tensor].name,
                          mf_format_bytes(p->tensors[s->slots[best].tensor].bytes, sz, sizeof sz));
    if (n >= sizeof list) break;
  }
  return MF_ERR(MF_ERR_CONFIG,
                "memory.device_budget %s is below the minimum this model and batch need, %s (every weight and "
                "gradient streamed, every activation recomputed or offloaded); at its peak (%s) the largest tensors "
                "on the device are %s",
                mf_format_bytes(c->budget, have, sizeof have), mf_format_bytes(s->arena_bytes, need, sizeof need),
                s->instr[s->peak_instr].op >= 0 ? p->ops[s->instr[s->peak_instr].op].label : "a copy", list);
}

mf_status mf_plan_choose(const mf_program *p, const mf_hwprofile *hw, uint64_t budget, const mf_decisions *fixed,
                         const mf_plan_pins *pins, mf_plan **out) {
  *out = NULL;
  chooser c = {p, hw, budget, pins, NULL, 0, NULL, 0};
  mf_status st = MF_OK;
  mf_plan *least = NULL, *best = NULL, *trial = NULL;
  mf_decisions *d = NULL, *work = NULL;
  cand *cands = NULL;
  int32_t n_cands = 0;

  MF_CHECK_GOTO(mf_decisions_create(p, &d), st, done);
  MF_CHECK_GOTO(baseline_decisions(p, MF_PLAN_LEAST_MEMORY, d), st, done);
  if (fixed && pins) {
    for (int32_t i = 0; i < d->n_params; i++) {
      if (pins->param[i]) d->param[i] = fixed->param[i];
      if (pins->grad[i]) d->grad[i] = fixed->grad[i];
    }
    for (int32_t t = 0; t < d->n_tensors; t++)
      if (pins->act[t]) d->act[t] = fixed->act[t];
  }
  MF_CHECK_GOTO(mf_plan_evaluate(p, hw, d, budget, MF_PLAN_LEAST_MEMORY, &least), st, done);
  if (!least->fits) {
    st = too_small(&c, least);
    goto done;
  }

  /* Activation classes: one per name (all micro-batches together). */
  MF_CHECK_GOTO(mf_calloc((size_t)p->n_tensors, sizeof(int32_t), "plan", (void **)&c.klass), st, done);
  MF_CHECK_GOTO(mf_calloc((size_t)p->n_tensors, sizeof(int32_t), "plan", (void **)&c.klass_layer), st, done);
  {
    /* Sort the offloadable tensors by class name; equal names get one id. */
    int32_t n = 0;
    int32_t *order = NULL;
    MF_CHECK_GOTO(mf_calloc((size_t)p->n_tensors + 1, sizeof(int32_t), "plan", (void **)&order), st, done);
    for (int32_t t = 0; t < p->n_tensors; t++) {
      c.klass[t] = -1;
      if (mf_schedule_can_offload(p, t)) order[n++] = t;
    }
    qsort_r(order, (size_t)n, sizeof(int32_t), cmp_class, (void *)p);
    for (int32_t i = 0; i < n; i++) {
      const int32_t t = order[i];
      if (i > 0 && strcmp(class_name(p->tensors[t].name), class_name(p->tensors[order[i - 1]].name)) == 0) {
        c.klass[t] = c.klass[order[i - 1]];
      } else {
        c.klass_layer[c.n_klass] = p->tensors[t].layer;
        c.klass[t] = c.n_klass++;
      }
    }
    free(order);
  }
  /* Large programs get one activation candidate per layer, so planning stays fast. */
  const int32_t L = (int32_t)p->spec.layers;
  c.coarse = (double)least->s->n_instr * (double)(2 * c.n_klass) > 2e7;
  const int32_t max_cands = 2 * (L + 1) + 2 * (c.coarse ? L : c.n_klass);
  MF_CHECK_GOTO(mf_calloc((size_t)max_cands, sizeof(cand), "plan", (void **)&cands), st, done);
  for (int32_t l = -1; l < L; l++) {
    cands[n_cands++] = (cand){C_PARAMS_RESIDENT, l, -1, 0, 0, 0};
    if (!p->forward_only) cands[n_cands++] = (cand){C_GRADS_DEVICE, l, -1, 0, 0, 0};
  }
  if (c.coarse)
    for (int32_t l = 0; l < L; l++) {
      cands[n_cands++] = (cand){C_ACT_KEEP, l, -1, 0, 0, 0};
      cands[n_cands++] = (cand){C_ACT_OFFLOAD, l, -1, 0, 0, 0};
    }
  else
    for (int32_t k = 0; k < c.n_klass; k++) {
      cands[n_cands++] = (cand){C_ACT_KEEP, c.klass_layer[k], k, 0, 0, 0};
      cands[n_cands++] = (cand){C_ACT_OFFLOAD, c.klass_layer[k], k, 0, 0, 0};
    }

  /* Score every candidate once against the least-memory plan. */
  MF_CHECK_GOTO(mf_decisions_create(p, &work), st, done);
  for (int32_t k = 0; k < n_cands; k++) {
    MF_CHECK_GOTO(mf_decisions_copy(least->d, work), st, done);
    if (apply(&c, &cands[k], work) == 0) {
      cands[k].score = -INFINITY;
      continue;
    }
    MF_CHECK_GOTO(mf_plan_evaluate(p, hw, work, budget, MF_PLAN_CHOSEN, &trial), st, done);
    cands[k].gain = least->sim.step_seconds - trial->sim.step_seconds;
    cands[k].bytes = (double)trial->s->arena_bytes - (double)least->s->arena_bytes;
    cands[k].score = cands[k].gain > 0 ? cands[k].gain / (cands[k].bytes > 64 ? cands[k].bytes : 64) : -INFINITY;
    mf_plan_free(trial);
    trial = NULL;
  }
  qsort(cands, (size_t)n_cands, sizeof *cands, cmp_score);

  /* Apply in order while the arena fits. */
  MF_CHECK_GOTO(mf_decisions_copy(least->d, work), st, done);
  for (int32_t k = 0; k < n_cands && cands[k].score > -INFINITY; k++) {
    MF_CHECK_GOTO(mf_decisions_copy(work, d), st, done);
    if (apply(&c, &cands[k], d) == 0) continue;
    mf_schedule *s = NULL;
    MF_CHECK_GOTO(mf_schedule_build(p, d, &s), st, done);
    int fits = s->arena_bytes <= budget;
    mf_schedule_free(s);
    if (fits) MF_CHECK_GOTO(mf_decisions_copy(d, work), st, done);
  }
  MF_CHECK_GOTO(mf_plan_evaluate(p, hw, work, budget, MF_PLAN_CHOSEN, &best), st, done);
  if (best->sim.step_seconds > least->sim.step_seconds) {
    /* Never worse than where it started. */
    mf_plan_free(best);
    MF_CHECK_GOTO(mf_plan_evaluate(p, hw, least->d, budget, MF_PLAN_CHOSEN, &best), st, done);
  }
  /* Never predicted slower than a baseline that fits (and respects the pins). */
  for (int k = MF_PLAN_RESIDENT; k <= MF_PLAN_CHECKPOINT; k++) {
    if (pins) break; /* baselines ignore overrides */
    MF_CHECK_GOTO(mf_plan_baseline(p, hw, (mf_plan_kind)k, budget, &trial), st, done);
    if (trial->fits && trial->sim.step_seconds < best->sim.step_seconds) {
      mf_plan_free(best);
      best = trial;
      best->kind = MF_PLAN_CHOSEN;
    } else {
      mf_plan_free(trial);
    }
    trial = NULL;
  }
  *out = best;
  best = NULL;
done:
  mf_plan_free(least);
  mf_plan_free(best);
  mf_plan_free(trial);
  mf_decisions_free(d);
  mf_decisions_free(work);
  free(cands);
  free(c.klass);
  free(c.klass_layer);
  return st;
}
