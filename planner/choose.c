/* The planner's choice within a budget (see plan.h): candidates scored against
 * the least-memory plan (exactly, or on the proxy program), applied greedily
 * while they fit. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "experts/experts.h"
#include "planner/plan.h"
#include "planner/plan_internal.h"
#include "planner/proxy.h"
#include "src/core/env.h"

/* ------------------------------------------------------------ the choice */

typedef enum cand_kind {
  C_PARAMS_RESIDENT = 0,
  C_GRADS_DEVICE,
  C_ACT_KEEP,
  C_ACT_OFFLOAD,
  C_EXPERTS_HOT,
  C_OPTIM_DEVICE
} cand_kind;
#define N_CAND_KINDS 6

typedef struct cand {
  cand_kind kind;
  int32_t layer; /* C_PARAMS_*, C_GRADS_*, C_OPTIM_*: the layer (-1: embeddings, final norm, head) */
  int32_t klass; /* C_ACT_*: index of the activation class, or -1 for the whole layer */
  double gain;   /* predicted seconds saved against the least-memory plan (C_OPTIM_DEVICE: against it with
                    the layer's weights resident and gradients on the device) */
  double bytes;  /* extra arena bytes (against the same) */
  double host;   /* extra host bytes for offloaded activations */
  double score;
  int32_t
      quarters; /* C_EXPERTS_HOT: q: the layer's q-th hottest quarter of experts resident (1: the hottest) */
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

/* What candidates work on in one program: activation classes (one per name,
 * all micro-batches together, sorted by name) and, for quick application,
 * the tensors of each class and layer and the parameters of each layer. */
typedef struct side {
  const mf_program *p;
  const mf_plan_pins *pins;
  int32_t *klass; /* [n_tensors] class id, -1 for tensors that cannot be offloaded */
  int32_t n_klass;
  int32_t *klass_layer;       /* [n_klass] */
  int32_t *klass_first;       /* [n_klass] its first tensor (for the name) */
  int32_t *kstart, *ktensors; /* class k's tensors: ktensors[kstart[k] .. kstart[k + 1]) */
  int32_t *lstart, *ltensors; /* layer l's classed tensors: ltensors[lstart[l + 1] .. lstart[l + 2]) */
  int32_t *pstart, *pparams;  /* layer l's parameters: pparams[pstart[l + 1] .. pstart[l + 2]) */
  const double *share;        /* measured routing [layers * experts], or NULL */
  int32_t *hot_rank;          /* [n_params] an expert's rank in its layer by share, hottest 0; -1 others */
} side;

static void side_free(side *s) {
  free(s->klass);
  free(s->klass_layer);
  free(s->klass_first);
  free(s->kstart);
  free(s->ktensors);
  free(s->lstart);
  free(s->ltensors);
  free(s->pstart);
  free(s->pparams);
  free(s->hot_rank);
  memset(s, 0, sizeof *s);
}

/* Counting sort of n items by key in [0, nkeys): start[nkeys + 1], items[n]. */
static void bucket(const int32_t *key, int32_t n, int32_t nkeys, int32_t *start, int32_t *items) {
  memset(start, 0, (size_t)(nkeys + 1) * sizeof *start);
  for (int32_t i = 0; i < n; i++)
    if (key[i] >= 0) start[key[i] + 1]++;
  for (int32_t k = 0; k < nkeys; k++) start[k + 1] += start[k];
  for (int32_t i = 0; i < n; i++)
    if (key[i] >= 0) items[start[key[i]]++] = i;
  for (int32_t k = nkeys; k > 0; k--) start[k] = start[k - 1];
  start[0] = 0;
}

static mf_status side_build(const mf_program *p, const mf_plan_pins *pins, const double *share, side *s) {
  memset(s, 0, sizeof *s);
  s->p = p;
  s->pins = pins;
  s->share = p->spec.experts > 0 ? share : NULL;
  const int32_t nt = p->n_tensors, np = (int32_t)p->params->n, L = (int32_t)p->spec.layers;
  mf_status st = MF_OK;
  int32_t *order = NULL, *key = NULL;
  MF_CHECK_GOTO(mf_calloc((size_t)nt + 1, sizeof(int32_t), "plan", (void **)&s->klass), st, fail);
  MF_CHECK_GOTO(mf_calloc((size_t)nt + 1, sizeof(int32_t), "plan", (void **)&s->klass_layer), st, fail);
  MF_CHECK_GOTO(mf_calloc((size_t)nt + 1, sizeof(int32_t), "plan", (void **)&s->klass_first), st, fail);
  MF_CHECK_GOTO(mf_calloc((size_t)nt + 2, sizeof(int32_t), "plan", (void **)&s->kstart), st, fail);
  MF_CHECK_GOTO(mf_calloc((size_t)nt + 1, sizeof(int32_t), "plan", (void **)&s->ktensors), st, fail);
  MF_CHECK_GOTO(mf_calloc((size_t)L + 2, sizeof(int32_t), "plan", (void **)&s->lstart), st, fail);
  MF_CHECK_GOTO(mf_calloc((size_t)nt + 1, sizeof(int32_t), "plan", (void **)&s->ltensors), st, fail);
  MF_CHECK_GOTO(mf_calloc((size_t)L + 2, sizeof(int32_t), "plan", (void **)&s->pstart), st, fail);
  MF_CHECK_GOTO(mf_calloc((size_t)np + 1, sizeof(int32_t), "plan", (void **)&s->pparams), st, fail);
  MF_CHECK_GOTO(mf_calloc((size_t)nt + 1, sizeof(int32_t), "plan", (void **)&order), st, fail);
  MF_CHECK_GOTO(mf_calloc((size_t)(nt > np ? nt : np) + 1, sizeof(int32_t), "plan", (void **)&key), st, fail);
  {
    /* Sort the offloadable tensors by class name; equal names get one id. */
    int32_t n = 0;
    for (int32_t t = 0; t < nt; t++) {
      s->klass[t] = -1;
      if (mf_schedule_can_offload(p, t)) order[n++] = t;
    }
    qsort_r(order, (size_t)n, sizeof(int32_t), cmp_class, (void *)p);
    for (int32_t i = 0; i < n; i++) {
      const int32_t t = order[i];
      if (i > 0 && strcmp(class_name(p->tensors[t].name), class_name(p->tensors[order[i - 1]].name)) == 0) {
        s->klass[t] = s->klass[order[i - 1]];
      } else {
        s->klass_layer[s->n_klass] = p->tensors[t].layer;
        s->klass_first[s->n_klass] = t;
        s->klass[t] = s->n_klass++;
      }
    }
  }
  bucket(s->klass, nt, s->n_klass, s->kstart, s->ktensors);
  for (int32_t t = 0; t < nt; t++) key[t] = s->klass[t] >= 0 ? p->tensors[t].layer + 1 : -1;
  bucket(key, nt, L + 1, s->lstart, s->ltensors);
  for (int32_t i = 0; i < np; i++) key[i] = p->params->params[i].layer + 1;
  bucket(key, np, L + 1, s->pstart, s->pparams);
  if (s->share) {
    /* Each expert's rank by its share of the layer's tokens (ties: lower index first). */
    const int64_t E = p->spec.experts;
    MF_CHECK_GOTO(mf_calloc((size_t)np + 1, sizeof(int32_t), "plan", (void **)&s->hot_rank), st, fail);
    for (int32_t i = 0; i < np; i++) {
      const mf_param *a = &p->params->params[i];
      s->hot_rank[i] = -1;
      if (a->expert < 0 || a->layer < 0) continue;
      s->hot_rank[i] = mf_experts_heat_rank(s->share + a->layer * E, E, a->expert);
    }
  }
  free(order);
  free(key);
  return MF_OK;
fail:
  free(order);
  free(key);
  side_free(s);
  return st;
}

static int pinned_param(const side *s, int32_t i) {
  return s->pins && s->pins->param[i];
}
static int pinned_grad(const side *s, int32_t i) {
  return s->pins && s->pins->grad[i];
}
static int pinned_act(const side *s, int32_t t) {
  return s->pins && s->pins->act[t];
}
static int pinned_optim(const side *s, int32_t i) {
  return s->pins && s->pins->optim && s->pins->optim[i];
}

/* Whether layer l (-1: the parameters of no layer) has a trained parameter. */
static int trains(const side *s, int32_t l) {
  for (int32_t j = s->pstart[l + 1]; j < s->pstart[l + 2]; j++)
    if (!s->p->params->params[s->pparams[j]].frozen) return 1;
  return 0;
}

/* Whether putting layer l's optimizer on the device would change a pinned
 * decision (d holds the pinned ones, which nothing changes). */
static int optim_blocked(const side *s, int32_t l, const mf_decisions *d) {
  for (int32_t j = s->pstart[l + 1]; j < s->pstart[l + 2]; j++) {
    const int32_t i = s->pparams[j];
    if (s->p->params->params[i].frozen) continue;
    if ((pinned_param(s, i) && d->param[i] != MF_PARAM_RESIDENT) ||
        (pinned_grad(s, i) && d->grad[i] != MF_GRAD_DEVICE) ||
        (pinned_optim(s, i) && d->optim[i] != MF_OPTIM_DEVICE))
      return 1;
  }
  return 0;
}

/* C_OPTIM_DEVICE on layer l: every trained parameter of the layer resident,
 * its gradient on the device and its optimizer there (a frozen one, LoRA's
 * base, has none and stays as it is). 0 (nothing changed) when that would
 * change a pinned decision. */
static int apply_optim(const side *s, int32_t l, mf_decisions *d) {
  if (optim_blocked(s, l, d)) return 0;
  int changed = 0;
  for (int32_t j = s->pstart[l + 1]; j < s->pstart[l + 2]; j++) {
    const int32_t i = s->pparams[j];
    if (s->p->params->params[i].frozen) continue;
    changed +=
        d->param[i] != MF_PARAM_RESIDENT || d->grad[i] != MF_GRAD_DEVICE || d->optim[i] != MF_OPTIM_DEVICE;
    d->param[i] = MF_PARAM_RESIDENT;
    d->grad[i] = MF_GRAD_DEVICE;
    d->optim[i] = MF_OPTIM_DEVICE;
  }
  return changed;
}

/* Applies candidate k to d; returns how many decisions it changed. */
static int apply(const side *s, const cand *k, mf_decisions *d) {
  const mf_program *p = s->p;
  int changed = 0;
  if (k->kind == C_OPTIM_DEVICE) return apply_optim(s, k->layer, d);
  if (k->kind == C_PARAMS_RESIDENT || k->kind == C_GRADS_DEVICE || k->kind == C_EXPERTS_HOT) {
    /* C_EXPERTS_HOT: the layer's q-th hottest quarter of experts. */
    int64_t hot_lo = 0, hot_hi = 0;
    if (k->kind == C_EXPERTS_HOT) mf_experts_hot_quarter(p->spec.experts, k->quarters, &hot_lo, &hot_hi);
    for (int32_t j = s->pstart[k->layer + 1]; j < s->pstart[k->layer + 2]; j++) {
      const int32_t i = s->pparams[j];
      if (k->kind == C_EXPERTS_HOT) {
        if (s->hot_rank && s->hot_rank[i] >= hot_lo && s->hot_rank[i] < hot_hi && !pinned_param(s, i) &&
            d->param[i] != MF_PARAM_RESIDENT)
          d->param[i] = MF_PARAM_RESIDENT, changed++;
        continue;
      }
      if (k->kind == C_PARAMS_RESIDENT && !pinned_param(s, i) && d->param[i] != MF_PARAM_RESIDENT)
        d->param[i] = MF_PARAM_RESIDENT, changed++;
      if (k->kind == C_GRADS_DEVICE && !pinned_grad(s, i) && d->grad[i] != MF_GRAD_DEVICE)
        d->grad[i] = MF_GRAD_DEVICE, changed++;
    }
    return changed;
  }
  const int32_t *list =
      k->klass >= 0 ? s->ktensors + s->kstart[k->klass] : s->ltensors + s->lstart[k->layer + 1];
  const int32_t n = k->klass >= 0 ? s->kstart[k->klass + 1] - s->kstart[k->klass]
                                  : s->lstart[k->layer + 2] - s->lstart[k->layer + 1];
  for (int32_t j = 0; j < n; j++) {
    const int32_t t = list[j];
    if (pinned_act(s, t)) continue;
    if (k->kind == C_ACT_KEEP && d->act[t] != MF_ACT_KEEP) d->act[t] = MF_ACT_KEEP, changed++;
    if (k->kind == C_ACT_OFFLOAD && d->act[t] == MF_ACT_RECOMPUTE && mf_schedule_can_offload(p, t))
      d->act[t] = MF_ACT_OFFLOAD, changed++;
  }
  return changed;
}

/* Per layer: weights, gradients, two hot quarters, the optimizer. */
#define MAX_LAYER_CANDS 5

static int cmp_score(const void *a, const void *b) {
  const cand *x = (const cand *)a, *y = (const cand *)b;
  if (x->score != y->score) return x->score > y->score ? -1 : 1;
  if (x->kind != y->kind) return (int)x->kind - (int)y->kind;
  if (x->layer != y->layer) return x->layer - y->layer;
  if (x->quarters != y->quarters) return x->quarters - y->quarters;
  return x->klass - y->klass;
}

/* The candidates of a side: a layer's weights resident and its gradients on
 * the device, with measured routing its hottest and second-hottest quarter
 * of experts resident, and (a training program) its optimizer on the device,
 * for the layers `want` marks (NULL: all, -1 — embeddings, final norm, head —
 * included, as want[l + 1]); its activations kept, or offloaded instead of
 * recomputed — per class, or per layer when `coarse`. `out` holds
 * MAX_LAYER_CANDS (L + 1) + 2 max(L, n_klass) entries. */
static int32_t make_cands(const side *s, const uint8_t *want, int coarse, cand *out) {
  const mf_program *p = s->p;
  const int32_t L = (int32_t)p->spec.layers;
  int32_t n = 0;
  for (int32_t l = -1; l < L; l++) {
    if (want && !want[l + 1]) continue;
    out[n++] = (cand){C_PARAMS_RESIDENT, l, -1, 0, 0, 0, 0, 0};
    if (!p->forward_only) out[n++] = (cand){C_GRADS_DEVICE, l, -1, 0, 0, 0, 0, 0};
    if (s->share && l >= 0 && mf_model_spec_layer_is_moe(&p->spec, l) && p->spec.experts >= 4)
      for (int32_t q = 1; q <= MF_EXPERTS_HOT_QUARTERS; q++) out[n++] = (cand){C_EXPERTS_HOT, l, -1, 0, 0, 0, 0, q};
    if (!p->forward_only && p->adamw_op && p->ranks <= 1 && trains(s, l))
      out[n++] = (cand){C_OPTIM_DEVICE, l, -1, 0, 0, 0, 0, 0};
  }
  if (coarse) {
    for (int32_t l = 0; l < L; l++) {
      if (want && !want[l + 1]) continue;
      out[n++] = (cand){C_ACT_KEEP, l, -1, 0, 0, 0, 0, 0};
      out[n++] = (cand){C_ACT_OFFLOAD, l, -1, 0, 0, 0, 0, 0};
    }
  } else {
    for (int32_t k = 0; k < s->n_klass; k++) {
      if (want && !want[s->klass_layer[k] + 1]) continue;
      out[n++] = (cand){C_ACT_KEEP, s->klass_layer[k], k, 0, 0, 0, 0, 0};
      out[n++] = (cand){C_ACT_OFFLOAD, s->klass_layer[k], k, 0, 0, 0, 0, 0};
    }
  }
  return n;
}

typedef struct score_job {
  mf_plan_par q;
  const side *s;
  const mf_hwprofile *hw;
  const mf_plan *least;
  cand *c;
  int32_t n;
} score_job;

static void score_task(void *ctx, int i, int nw) {
  score_job *j = (score_job *)ctx;
  if (i >= MF_PLAN_MAX_WORKERS) return;
  if (nw > MF_PLAN_MAX_WORKERS) nw = MF_PLAN_MAX_WORKERS;
  mf_decisions *work = NULL;
  mf_plan *trial = NULL, *base = NULL;
  mf_status st = mf_decisions_create(j->s->p, &work);
  for (int32_t k = i; st == MF_OK && k < j->n; k += nw) {
    cand *c = &j->c[k];
    const mf_plan *from = j->least;
    st = mf_decisions_copy(j->least->d, work);
    if (st != MF_OK) break;
    if (c->kind == C_OPTIM_DEVICE) {
      /* Scored against the layer's weights resident and gradients on the
       * device (what it needs, which those candidates score): its gain is
       * the host optimizer's work and the gradients' copies home it saves,
       * its bytes the state's and the longer lifetimes. */
      const cand w = {C_PARAMS_RESIDENT, c->layer, -1, 0, 0, 0, 0, 0};
      const cand g = {C_GRADS_DEVICE, c->layer, -1, 0, 0, 0, 0, 0};
      if (optim_blocked(j->s, c->layer, work)) {
        c->score = -INFINITY;
        continue;
      }
      apply(j->s, &w, work);
      apply(j->s, &g, work);
      st = mf_plan_eval(j->s->p, j->hw, &j->least->so, work, j->least->budget, MF_PLAN_CHOSEN, &base);
      if (st != MF_OK) break;
      from = base;
    }
    if (apply(j->s, c, work) == 0) {
      c->score = -INFINITY;
      mf_plan_free(base);
      base = NULL;
      continue;
    }
    st = mf_plan_eval(j->s->p, j->hw, &j->least->so, work, j->least->budget, MF_PLAN_CHOSEN, &trial);
    if (st != MF_OK) break;
    c->gain = from->sim.step_seconds - trial->sim.step_seconds;
    c->bytes = (double)trial->s->arena_bytes - (double)from->s->arena_bytes;
    c->host = (double)trial->s->host_act_bytes - (double)from->s->host_act_bytes;
    c->score = c->gain > 0 ? c->gain / (c->bytes > 64 ? c->bytes : 64) : -INFINITY;
    mf_plan_free(trial);
    mf_plan_free(base);
    trial = base = NULL;
  }
  if (st != MF_OK) mf_plan_par_fail(&j->q, i, st);
  mf_plan_free(trial);
  mf_plan_free(base);
  mf_decisions_free(work);
}

/* Simulates each candidate once against `least` (on its side's program). */
static mf_status score_cands(const side *s, const mf_hwprofile *hw, const mf_plan *least, cand *c, int32_t n,
                             mf_threadpool *pool) {
  score_job *j = (score_job *)calloc(1, sizeof *j);
  if (!j) return MF_ERR(MF_ERR_OUT_OF_MEMORY, "plan: out of memory");
  j->s = s, j->hw = hw, j->least = least, j->c = c, j->n = n;
  if (pool)
    mf_threadpool_run(pool, score_task, j);
  else
    score_task(j, 0, 1);
  mf_status st = mf_plan_par_status(&j->q, mf_plan_pool_size(pool));
  free(j);
  return st;
}

/* A budget below the least-memory plan: say what it needs and what takes it. */
static mf_status too_small(const mf_program *p, uint64_t budget, const mf_plan *least, int pinned) {
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
  return MF_ERR(
      MF_ERR_CONFIG,
      "memory.device_budget %s is below the minimum this model and batch need, %s (every weight and "
      "gradient streamed%s, every activation recomputed or offloaded); at its peak (%s) the largest tensors "
      "on the device are %s",
      mf_format_bytes(budget, have, sizeof have), mf_format_bytes(s->arena_bytes, need, sizeof need),
      pinned ? " but those pinned (memory.overrides; with expert parallelism and several micro-batches a "
               "rank, the gradients the ranks add in turn stay on the device)"
             : "",
      s->instr[s->peak_instr].op >= 0 ? p->ops[s->instr[s->peak_instr].op].label : "a copy", list);
}

/* How often the experts of the q-th hottest quarter of a layer with routing
 * `row` are used by a micro-batch, summed: each 1 - (1 - K share)^T. */
static double hot_use(const mf_program *p, const double *row, int32_t quarters) {
  const int64_t E = p->spec.experts;
  int64_t lo, hi;
  mf_experts_hot_quarter(E, quarters, &lo, &hi);
  double sum = 0;
  for (int64_t e = 0; e < E; e++) {
    const int32_t r = mf_experts_heat_rank(row, E, e);
    if (r >= lo && r < hi) sum += mf_experts_use_chance(row[e], p->spec.top_k, (double)(p->B * p->S));
  }
  return sum;
}

/* Scores the full program's candidates on the proxy: each full candidate takes
 * the gain and bytes of the proxy candidate of the same kind at its layer's
 * representative (activation classes matched by name). */
static mf_status score_on_proxy(const side *full, const mf_plan *least, const mf_plan_proxy *x,
                                const mf_hwprofile *hw, cand *fc, int32_t nf, mf_threadpool *pool) {
  const mf_program *pp = x->prog, *fp = full->p;
  const int32_t L = (int32_t)fp->spec.layers;
  mf_status st = MF_OK;
  mf_plan_pins ppins = {NULL, NULL, NULL, NULL};
  mf_decisions *pd = NULL;
  mf_plan *pleast = NULL;
  side ps;
  memset(&ps, 0, sizeof ps);
  cand *pc = NULL;
  uint8_t *want = NULL, *opt = NULL;
  int32_t *pcand = NULL; /* [N_CAND_KINDS * nkey]: proxy candidate by (kind, class, layer or hot set) */
  double *pshare = NULL; /* the proxy's routing: each proxy layer the full layer it stands for */

  /* The proxy's least-memory decisions and pins: the full plan's, mapped. */
  MF_CHECK_GOTO(mf_decisions_create(pp, &pd), st, done);
  MF_CHECK_GOTO(mf_plan_pins_create(pp, &ppins), st, done);
  MF_CHECK_GOTO(mf_calloc((size_t)pp->n_tensors + 1, 1, "plan", (void **)&opt), st, done);
  MF_CHECK_GOTO(mf_schedule_act_options(pp, opt), st, done);
  mf_plan_least_activations(pp, opt, pd);
  for (int32_t i = 0; i < pd->n_params; i++) {
    const int32_t f = x->param_full[i];
    pd->param[i] = least->d->param[f];
    pd->grad[i] = least->d->grad[f];
    pd->optim[i] = least->d->optim[f];
    if (full->pins) ppins.param[i] = full->pins->param[f], ppins.grad[i] = full->pins->grad[f];
    if (full->pins && full->pins->optim) ppins.optim[i] = full->pins->optim[f];
  }
  for (int32_t t = 0; t < pd->n_tensors; t++) {
    const int32_t f = x->tensor_full[t];
    if (f < 0 || !opt[t]) continue;
    /* A decision the proxy tensor cannot take (it sits at another place in a shorter model) keeps its own. */
    if (least->d->act[f] == MF_ACT_RECOMPUTE && opt[t] != 3) continue;
    pd->act[t] = least->d->act[f];
    if (full->pins) ppins.act[t] = full->pins->act[f];
  }
  mf_sim_opts pso = least->so;
  if (full->share) {
    const int64_t E = pp->spec.experts;
    MF_CHECK_GOTO(mf_calloc((size_t)(pp->spec.layers * E) + 1, sizeof(double), "plan", (void **)&pshare), st,
                  done);
    for (int64_t r = 0; r < pp->spec.layers; r++)
      memcpy(pshare + r * E, full->share + (int64_t)x->full_layer[r] * E, (size_t)E * sizeof(double));
    pso.expert_share = pshare;
  }
  MF_CHECK_GOTO(mf_plan_eval(pp, hw, &pso, pd, least->budget, MF_PLAN_LEAST_MEMORY, &pleast), st, done);
  MF_CHECK_GOTO(side_build(pp, full->pins ? &ppins : NULL, pshare, &ps), st, done);

  /* Candidates at the embeddings/head and the representative layers. */
  const int32_t PL = (int32_t)pp->spec.layers;
  MF_CHECK_GOTO(mf_calloc((size_t)PL + 1, 1, "plan", (void **)&want), st, done);
  want[0] = 1;
  for (int32_t l = 0; l < L; l++) want[x->rep[l] + 1] = 1;
  const int32_t cap = MAX_LAYER_CANDS * (PL + 1) + 2 * (ps.n_klass > PL ? ps.n_klass : PL);
  MF_CHECK_GOTO(mf_calloc((size_t)cap, sizeof(cand), "plan", (void **)&pc), st, done);
  const int32_t np = make_cands(&ps, want, 0, pc);
  MF_CHECK_GOTO(score_cands(&ps, hw, pleast, pc, np, pool), st, done);
  MF_LOGD("plan", "proxy: %d layers, %d instructions, %d candidates scored", (int)PL, (int)pleast->s->n_instr,
          (int)np);

  /* Index the proxy candidates, then give each full candidate its score. */
  const int32_t nkey = ps.n_klass + PL + 1 + 2 * PL;
  const int32_t hot0 = ps.n_klass + PL + 1; /* hot sets: hot0 + 2 layer + quarters - 1 */
  MF_CHECK_GOTO(mf_calloc((size_t)N_CAND_KINDS * nkey, sizeof(int32_t), "plan", (void **)&pcand), st, done);
  for (int32_t i = 0; i < N_CAND_KINDS * nkey; i++) pcand[i] = -1;
  for (int32_t k = 0; k < np; k++) {
    const int32_t key = pc[k].kind == C_EXPERTS_HOT ? hot0 + 2 * pc[k].layer + pc[k].quarters - 1
                        : pc[k].klass >= 0          ? pc[k].klass
                                                    : ps.n_klass + pc[k].layer + 1;
    pcand[(int32_t)pc[k].kind * nkey + key] = k;
  }
  for (int32_t k = 0; k < nf; k++) {
    cand *c = &fc[k];
    const int32_t rl = c->layer < 0 ? -1 : x->rep[c->layer];
    int32_t key = -1;
    if (c->kind == C_EXPERTS_HOT) {
      key = hot0 + 2 * rl + c->quarters - 1;
    } else if (c->klass < 0) {
      key = ps.n_klass + rl + 1;
    } else {
      /* The class's name at the representative layer, looked up among the proxy's classes (sorted by name).
       */
      char name[sizeof fp->tensors[0].name];
      const char *cn = class_name(fp->tensors[full->klass_first[c->klass]].name);
      if (mf_plan_proxy_rename(cn, c->layer, rl, name, sizeof name)) {
        int32_t lo = 0, hi = ps.n_klass - 1;
        while (lo <= hi) {
          const int32_t mid = lo + (hi - lo) / 2;
          const int cmp = strcmp(class_name(pp->tensors[ps.klass_first[mid]].name), name);
          if (cmp == 0) {
            key = mid;
            break;
          }
          if (cmp < 0)
            lo = mid + 1;
          else
            hi = mid - 1;
        }
      }
    }
    const int32_t j = key >= 0 ? pcand[(int32_t)c->kind * nkey + key] : -1;
    if (j < 0) {
      c->score = -INFINITY;
      continue;
    }
    c->gain = pc[j].gain;
    c->bytes = pc[j].bytes;
    c->host = pc[j].host;
    c->score = pc[j].score;
    if (c->kind == C_EXPERTS_HOT && c->gain > 0) {
      /* The representative's hot set saves in proportion to how often its
       * experts are copied; this layer's may be used more or less. */
      const double uf = hot_use(fp, full->share + (int64_t)c->layer * fp->spec.experts, c->quarters);
      const double up = hot_use(pp, pshare + (int64_t)rl * pp->spec.experts, c->quarters);
      if (up > 0) {
        c->gain *= uf / up;
        c->score *= uf / up;
      }
    }
  }
done:
  free(pcand);
  free(pshare);
  free(want);
  free(opt);
  free(pc);
  side_free(&ps);
  mf_plan_free(pleast);
  mf_decisions_free(pd);
  mf_plan_pins_free(&ppins);
  return st;
}

/* Whether decisions d fit: the arena within the device budget and the
 * offloaded activations' host copies within what host memory leaves them. */
typedef struct limits {
  uint64_t device, host_acts;
} limits;

static mf_status fit_of(const mf_program *p, const mf_decisions *d, const limits *lim, size_t *arena,
                        size_t *host, int *fit) {
  mf_schedule *s = NULL;
  MF_CHECK(mf_schedule_build(p, d, &s));
  *arena = s->arena_bytes;
  *host = s->host_act_bytes;
  *fit = s->arena_bytes <= lim->device && s->host_act_bytes <= lim->host_acts;
  mf_schedule_free(s);
  return MF_OK;
}

/* What the fast path predicts a candidate adds to the arena, given what is
 * already counted: a layer's optimizer on the device brings the layer's
 * weights and gradients with it (their own candidates' bytes, unless
 * counted: it is scored against them), and once it is counted those
 * candidates, and the layer's hot experts, add nothing. */
typedef struct predict {
  const cand *c;
  int32_t *pre; /* [2 (L + 1)]: layer l's C_PARAMS_RESIDENT, C_GRADS_DEVICE candidate at [2 (l + 1) + 0, 1],
                   or -1 */
  uint8_t
      *counted; /* [3 (L + 1)]: layer l's weights, gradients, optimizer counted, at [3 (l + 1) + 0, 1, 2] */
} predict;

static mf_status predict_init(const cand *c, int32_t n, int32_t L, predict *q) {
  memset(q, 0, sizeof *q);
  q->c = c;
  mf_status st = mf_calloc(2 * ((size_t)L + 1), sizeof(int32_t), "plan", (void **)&q->pre);
  if (st == MF_OK) st = mf_calloc(3 * ((size_t)L + 1), 1, "plan", (void **)&q->counted);
  if (st != MF_OK) return st;
  for (int32_t i = 0; i < 2 * (L + 1); i++) q->pre[i] = -1;
  for (int32_t k = 0; k < n; k++)
    if (c[k].kind == C_PARAMS_RESIDENT || c[k].kind == C_GRADS_DEVICE)
      q->pre[2 * (c[k].layer + 1) + (c[k].kind == C_GRADS_DEVICE)] = k;
  return MF_OK;
}

static void predict_free(predict *q) {
  free(q->pre);
  free(q->counted);
}

static double predict_bytes(const predict *q, const cand *k) {
  const uint8_t *f = q->counted + 3 * (k->layer + 1);
  switch (k->kind) {
    case C_PARAMS_RESIDENT:
      return f[0] || f[2] ? 0.0 : k->bytes;
    case C_GRADS_DEVICE:
      return f[1] || f[2] ? 0.0 : k->bytes;
    case C_EXPERTS_HOT:
      return f[2] ? 0.0 : k->bytes;
    case C_OPTIM_DEVICE: {
      double b = k->bytes;
      for (int j = 0; j < 2; j++) {
        const int32_t i = q->pre[2 * (k->layer + 1) + j];
        if (!f[j] && i >= 0 && q->c[i].bytes > 0) b += q->c[i].bytes;
      }
      return b;
    }
    default:
      return k->bytes;
  }
}

static void predict_take(predict *q, const cand *k) {
  uint8_t *f = q->counted + 3 * (k->layer + 1);
  if (k->kind == C_PARAMS_RESIDENT) f[0] = 1;
  if (k->kind == C_GRADS_DEVICE) f[1] = 1;
  if (k->kind == C_OPTIM_DEVICE) f[0] = f[1] = f[2] = 1;
}

/* Applies the sorted candidates to `work` (the least-memory decisions) while
 * they fit (fit_of). Exact: one by one, each checked by building the
 * schedule. Fast (proxy scores): the longest prefix that fits, searched from
 * the prefix the predicted bytes allow — each next probe where the
 * predictions, shifted by the last probe's miss, put the budget's edge, or
 * the middle of what is left after two misses on one side — then a few more
 * candidates predicted to fit in what is left, checked one by one. */
static mf_status apply_greedy(const side *s, const limits *lim, const cand *c, int32_t n, int fast,
                              const mf_schedule *start, mf_decisions *work) {
  const mf_program *p = s->p;
  mf_decisions *d = NULL, *base = NULL;
  mf_status st = MF_OK;
  size_t arena = 0, host = 0;
  int fit = 0;
  int32_t *sel = NULL, nsel = 0;
  double *cum = NULL;    /* [nsel + 1] the predicted arena of each prefix of sel */
  uint8_t *taken = NULL; /* [npos] applied */
  predict q;
  memset(&q, 0, sizeof q);
  MF_CHECK(mf_decisions_create(p, &d));
  MF_CHECK_GOTO(mf_decisions_create(p, &base), st, done);
  int32_t npos = 0;
  while (npos < n && c[npos].score > -INFINITY) npos++;
  if (fast) {
    /* The candidates the predictions say fit, in order (sel); then the
     * longest prefix of them that really fits. */
    MF_CHECK_GOTO(mf_decisions_copy(work, base), st, done);
    MF_CHECK_GOTO(mf_calloc((size_t)npos + 1, sizeof(int32_t), "plan", (void **)&sel), st, done);
    MF_CHECK_GOTO(mf_calloc((size_t)npos + 1, sizeof(double), "plan", (void **)&cum), st, done);
    MF_CHECK_GOTO(predict_init(c, n, (int32_t)p->spec.layers, &q), st, done);
    size_t arena_lo = start->arena_bytes, host_lo = start->host_act_bytes; /* prefix lo's */
    {
      double dev = (double)start->arena_bytes, host = (double)start->host_act_bytes;
      cum[0] = dev;
      for (int32_t k = 0; k < npos; k++) {
        const double b = predict_bytes(&q, &c[k]);
        if (dev + b > (double)lim->device || host + c[k].host > (double)lim->host_acts) continue;
        dev += b;
        host += c[k].host;
        predict_take(&q, &c[k]);
        sel[nsel++] = k;
        cum[nsel] = dev;
      }
    }
    int32_t lo = 0, hi = nsel, builds = 0; /* prefix lo of sel fits; prefixes > hi do not */
    int32_t probe = nsel;
    int last = -1, same = 0; /* the last probe's outcome, and how many in a row gave it */
    while (lo < hi) {
      const int32_t mid = probe;
      MF_CHECK_GOTO(mf_decisions_copy(base, d), st, done);
      for (int32_t k = 0; k < mid; k++) apply(s, &c[sel[k]], d);
      MF_CHECK_GOTO(fit_of(p, d, lim, &arena, &host, &fit), st, done);
      builds++;
      if (fit) {
        lo = mid;
        arena_lo = arena;
        host_lo = host;
        MF_CHECK_GOTO(mf_decisions_copy(d, work), st, done);
      } else {
        hi = mid - 1;
      }
      if (lo >= hi) break;
      same = fit == last ? same + 1 : 1;
      last = fit;
      /* The longest prefix whose predicted arena, shifted by this probe's
       * miss, is within the budget (when the arena is what did not fit). */
      probe = -1;
      if (same < 2 && (fit || (double)arena > (double)lim->device)) {
        const double edge = (double)lim->device - ((double)arena - cum[mid]);
        for (int32_t k = hi; k > lo && probe < 0; k--)
          if (cum[k] <= edge) probe = k;
      }
      if (probe <= lo || probe > hi) probe = lo + (hi - lo + 1) / 2;
    }
    /* Then up to 4 of the others predicted to fit in what is left: first
     * all of them at once, then, when they do not fit together, one by one. */
    arena = arena_lo;
    host = host_lo;
    MF_CHECK_GOTO(mf_calloc((size_t)npos + 1, 1, "plan", (void **)&taken), st, done);
    const size_t ncounted = 3 * ((size_t)p->spec.layers + 1);
    memset(q.counted, 0, ncounted);
    for (int32_t k = 0; k < lo; k++) taken[sel[k]] = 1, predict_take(&q, &c[sel[k]]);
    int tries = 0, kept = 0, one_by_one = 1;
    {
      int32_t batch[4], nb = 0;
      double dev = (double)arena, hb = (double)host;
      MF_CHECK_GOTO(mf_decisions_copy(work, d), st, done);
      for (int32_t k = 0; k < npos && nb < 4; k++) {
        if (taken[k]) continue;
        const double b = predict_bytes(&q, &c[k]);
        if (dev + b > (double)lim->device || hb + c[k].host > (double)lim->host_acts ||
            apply(s, &c[k], d) == 0)
          continue;
        dev += b;
        hb += c[k].host;
        batch[nb++] = k;
        predict_take(&q, &c[k]);
      }
      size_t a = 0, h = 0;
      if (nb > 1) {
        MF_CHECK_GOTO(fit_of(p, d, lim, &a, &h, &fit), st, done);
        tries++;
        one_by_one = !fit;
      }
      if (one_by_one) { /* what the batch counted is not taken */
        memset(q.counted, 0, ncounted);
        for (int32_t k = 0; k < lo; k++) predict_take(&q, &c[sel[k]]);
      } else {
        MF_CHECK_GOTO(mf_decisions_copy(d, work), st, done);
        for (int32_t b = 0; b < nb; b++) taken[batch[b]] = 1;
        kept = nb;
        arena = a;
        host = h;
      }
    }
    for (int32_t k = 0, n1 = 0; one_by_one && k < npos && n1 < 4 && st == MF_OK; k++) {
      if (taken[k] || (double)arena + predict_bytes(&q, &c[k]) > (double)lim->device ||
          (double)host + c[k].host > (double)lim->host_acts)
        continue;
      st = mf_decisions_copy(work, d);
      if (st != MF_OK || apply(s, &c[k], d) == 0) continue;
      size_t a = 0, h = 0;
      st = fit_of(p, d, lim, &a, &h, &fit);
      tries++, n1++;
      if (st == MF_OK && fit) {
        st = mf_decisions_copy(d, work);
        predict_take(&q, &c[k]);
        arena = a;
        host = h;
        kept++;
      }
    }
    MF_LOGD("plan",
            "applied %d of %d candidates (%d predicted to fit; %d schedules), then %d tries (%d kept)",
            (int)lo, (int)npos, (int)nsel, builds, tries, kept);
    goto done;
  }
  for (int32_t k = 0; k < npos; k++) {
    MF_CHECK_GOTO(mf_decisions_copy(work, d), st, done);
    if (apply(s, &c[k], d) == 0) continue;
    MF_CHECK_GOTO(fit_of(p, d, lim, &arena, &host, &fit), st, done);
    if (fit) MF_CHECK_GOTO(mf_decisions_copy(d, work), st, done);
  }
done:
  free(sel);
  free(cum);
  free(taken);
  predict_free(&q);
  mf_decisions_free(d);
  mf_decisions_free(base);
  return st;
}

/* The choice (all[CHOSEN]), its starting point (all[LEAST_MEMORY]) and the
 * baselines (adopted when faster). */
mf_status mf_plan_choose_so(const mf_program *p, const mf_hwprofile *hw, const mf_sim_opts *so,
                            uint64_t budget, uint64_t host_acts, const mf_decisions *fixed,
                            const mf_plan_pins *pins, int lazy, mf_plan **all) {
  for (int k = 0; k < MF_PLAN_KIND_COUNT_; k++) all[k] = NULL;
  mf_status st = MF_OK;
  mf_plan *least = NULL, *best = NULL;
  mf_decisions *work = NULL;
  mf_plan_proxy *proxy = NULL;
  side full;
  memset(&full, 0, sizeof full);
  cand *cands = NULL;
  mf_threadpool *pool = NULL;
  const double t0 = mf_time_now();

  MF_CHECK_GOTO(mf_decisions_create(p, &work), st, done);
  MF_CHECK_GOTO(mf_plan_baseline_decisions(p, MF_PLAN_LEAST_MEMORY, work), st, done);
  if (fixed && pins) {
    for (int32_t i = 0; i < work->n_params; i++) {
      if (pins->param[i]) work->param[i] = fixed->param[i];
      if (pins->grad[i]) work->grad[i] = fixed->grad[i];
      if (pins->optim && pins->optim[i]) {
        work->optim[i] = fixed->optim[i];
        /* The optimizer pinned on the device needs the weights resident and
         * the gradient on the device (unless pinned otherwise: then the
         * schedule says why it cannot be). */
        if (work->optim[i] == MF_OPTIM_DEVICE && !pins->param[i]) work->param[i] = MF_PARAM_RESIDENT;
        if (work->optim[i] == MF_OPTIM_DEVICE && !pins->grad[i]) work->grad[i] = MF_GRAD_DEVICE;
      }
    }
    for (int32_t t = 0; t < work->n_tensors; t++)
      if (pins->act[t]) work->act[t] = fixed->act[t];
  }
  MF_CHECK_GOTO(mf_plan_eval(p, hw, so, work, budget, MF_PLAN_LEAST_MEMORY, &least), st, done);
  if (!least->fits) {
    int pinned = 0;
    for (int32_t i = 0; pins && i < work->n_params && !pinned; i++) pinned = pins->param[i] || pins->grad[i];
    st = too_small(p, budget, least, pinned);
    goto done;
  }
  MF_CHECK_GOTO(side_build(p, pins, so ? so->expert_share : NULL, &full), st, done);
  MF_CHECK_GOTO(mf_threadpool_create(0, &pool), st, done);
  const int32_t L = (int32_t)p->spec.layers;
  const int32_t cap = MAX_LAYER_CANDS * (L + 1) + 2 * (full.n_klass > L ? full.n_klass : L);
  MF_CHECK_GOTO(mf_calloc((size_t)cap, sizeof(cand), "plan", (void **)&cands), st, done);

  /* Scoring every candidate on the full step costs a simulation each; past a
   * few million instruction-simulations, score them on the proxy instead. */
  int32_t n_cands = make_cands(&full, NULL, 0, cands);
  const char *mode = mf_env_string(MF_ENV_PLAN_SCORING);
  int large = (double)least->s->n_instr * (double)n_cands > 4e6;
  if (mode && strcmp(mode, "exact") == 0) large = 0;
  if (mode && strcmp(mode, "proxy") == 0) large = 1;
  if (large) MF_CHECK_GOTO(mf_plan_proxy_build(p, &proxy), st, done);
  mf_progress_note("scoring %d candidates (%s order)", (int)n_cands, mf_program_order_name(p->order));
  if (proxy) {
    MF_CHECK_GOTO(score_on_proxy(&full, least, proxy, hw, cands, n_cands, pool), st, done);
  } else {
    /* Large programs without a proxy get one activation candidate per layer. */
    if (large) n_cands = make_cands(&full, NULL, 1, cands);
    MF_CHECK_GOTO(score_cands(&full, hw, least, cands, n_cands, pool), st, done);
  }
  MF_LOGD("plan", "%d candidates scored%s in %.2f s (least-memory step: %d instructions)", (int)n_cands,
          proxy ? " on the proxy" : "", mf_time_now() - t0, (int)least->s->n_instr);
  qsort(cands, (size_t)n_cands, sizeof *cands, cmp_score);
  mf_progress_note("fitting the best into the budget (%s order)", mf_program_order_name(p->order));
  /* host_acts is an estimate made before planning (every parameter's state at
   * home: optimizers the choice puts on the device leave more). The starting
   * point's own host copies are allowed whatever it says, so a tight limit
   * keeps the greedy from adding host copies, not from spending the device
   * budget; the run plan checks the chosen plan's host memory in full. */
  const limits lim = {budget, host_acts > least->s->host_act_bytes ? host_acts : least->s->host_act_bytes};
  MF_CHECK_GOTO(apply_greedy(&full, &lim, cands, n_cands, proxy != NULL, least->s, work), st, done);
  MF_LOGD("plan", "applied in %.2f s", mf_time_now() - t0);

  MF_CHECK_GOTO(mf_plan_eval(p, hw, so, work, budget, MF_PLAN_CHOSEN, &best), st, done);
  if (best->sim.step_seconds > least->sim.step_seconds || !best->fits) {
    /* Never worse than where it started. */
    mf_plan_free(best);
    MF_CHECK_GOTO(mf_plan_eval(p, hw, so, least->d, budget, MF_PLAN_CHOSEN, &best), st, done);
  }
  mf_progress_note("the baselines (%s order)", mf_program_order_name(p->order));
  /* Never predicted slower than a baseline that fits (baselines ignore
   * overrides, so with overrides they are shown but not taken). */
  MF_CHECK_GOTO(mf_plan_adopt_baselines(p, hw, so, budget, pins != NULL, lazy, pool, &best, all), st, done);
  MF_LOGD("plan", "chosen and baselines in %.2f s", mf_time_now() - t0);
  all[MF_PLAN_CHOSEN] = best;
  all[MF_PLAN_LEAST_MEMORY] = least;
  best = least = NULL;
done:
  if (st != MF_OK)
    for (int k = 0; k < MF_PLAN_KIND_COUNT_; k++) {
      mf_plan_free(all[k]);
      all[k] = NULL;
    }
  mf_plan_free(least);
  mf_plan_free(best);
  mf_decisions_free(work);
  mf_plan_proxy_free(proxy);
  side_free(&full);
  free(cands);
  mf_threadpool_free(pool);
  return st;
}

mf_status mf_plan_choose_all(const mf_program *p, const mf_hwprofile *hw, uint64_t budget,
                             const mf_decisions *fixed, const mf_plan_pins *pins, mf_plan **all) {
  return mf_plan_choose_so(p, hw, NULL, budget, UINT64_MAX, fixed, pins, 0, all);
}

mf_status mf_plan_choose(const mf_program *p, const mf_hwprofile *hw, uint64_t budget,
                         const mf_decisions *fixed, const mf_plan_pins *pins, mf_plan **out) {
  mf_plan *all[MF_PLAN_KIND_COUNT_];
  *out = NULL;
  MF_CHECK(mf_plan_choose_so(p, hw, NULL, budget, UINT64_MAX, fixed, pins, 0, all));
  *out = all[MF_PLAN_CHOSEN];
  for (int k = 0; k < MF_PLAN_KIND_COUNT_; k++)
    if (k != MF_PLAN_CHOSEN) mf_plan_free(all[k]);
  return MF_OK;
}
