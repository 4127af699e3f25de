/* Decisions -> schedule: the instruction list and its slots (see schedule.h). */
#include <stdlib.h>
#include <string.h>

#include "planner/schedule.h"
#include "src/core/interval.h"

const char *mf_param_dec_name(mf_param_dec d) {
  return d == MF_PARAM_STREAM ? "stream" : "resident";
}
const char *mf_grad_dec_name(mf_grad_dec d) {
  return d == MF_GRAD_STREAM ? "stream" : "device";
}
const char *mf_act_dec_name(mf_act_dec d) {
  return d == MF_ACT_OFFLOAD ? "offload" : d == MF_ACT_RECOMPUTE ? "recompute" : "keep";
}
const char *mf_optim_dec_name(mf_optim_dec d) {
  return d == MF_OPTIM_DEVICE ? "device" : "host";
}

mf_status mf_decisions_create(const mf_program *p, mf_decisions **out) {
  *out = NULL;
  mf_decisions *d = (mf_decisions *)calloc(1, sizeof *d);
  if (!d) return MF_ERR(MF_ERR_OUT_OF_MEMORY, "decisions: out of memory");
  d->n_params = (int32_t)p->params->n;
  d->n_tensors = p->n_tensors;
  d->param = (uint8_t *)calloc((size_t)d->n_params + 1, 1);
  d->grad = (uint8_t *)calloc((size_t)d->n_params + 1, 1);
  d->act = (uint8_t *)calloc((size_t)d->n_tensors + 1, 1);
  d->optim = (uint8_t *)calloc((size_t)d->n_params + 1, 1);
  if (!d->param || !d->grad || !d->act || !d->optim) {
    mf_decisions_free(d);
    return MF_ERR(MF_ERR_OUT_OF_MEMORY, "decisions: out of memory");
  }
  *out = d;
  return MF_OK;
}

void mf_decisions_free(mf_decisions *d) {
  if (!d) return;
  free(d->param);
  free(d->grad);
  free(d->act);
  free(d->optim);
  free(d);
}

mf_status mf_decisions_copy(const mf_decisions *from, mf_decisions *to) {
  if (from->n_params != to->n_params || from->n_tensors != to->n_tensors)
    return MF_ERR(MF_ERR_INVALID_ARG, "decisions: copying between different programs");
  memcpy(to->param, from->param, (size_t)from->n_params);
  memcpy(to->grad, from->grad, (size_t)from->n_params);
  memcpy(to->act, from->act, (size_t)from->n_tensors);
  memcpy(to->optim, from->optim, (size_t)from->n_params);
  return MF_OK;
}

int mf_schedule_can_offload(const mf_program *p, int32_t t) {
  const mf_ptensor *x = &p->tensors[t];
  if (x->micro < 0 || x->layer < 0 || x->first_op < 0) return 0;
  if (x->kind != MF_T_ACT && x->kind != MF_T_STAT) return 0;
  /* Worth it only when the backward reads it. */
  return p->ops[x->last_op].phase == MF_PHASE_BWD && p->ops[x->first_op].phase == MF_PHASE_FWD;
}

static int can_recompute_depth(const mf_program *p, int32_t t, int depth, int8_t *memo);

/* A writer's input the backward can count on: a weight, the step's inputs, an
 * activation the backward reads anyway, or one that can itself be recomputed. */
static int available_in_bwd(const mf_program *p, int32_t u, int depth, int8_t *memo) {
  const mf_ptensor *x = &p->tensors[u];
  if (x->kind == MF_T_PARAM || x->kind == MF_T_INPUT) return 1;
  if (x->first_op < 0) return 0;
  if (p->ops[x->last_op].phase == MF_PHASE_BWD) return 1;
  return can_recompute_depth(p, u, depth + 1, memo);
}

/* Every op that writes t is a forward op whose written operands are
 * activations of the same layer and micro-batch (no side effects elsewhere),
 * and whose inputs the backward still has. */
static int can_recompute_depth(const mf_program *p, int32_t t, int depth, int8_t *memo) {
  if (memo && memo[t] >= 0) return memo[t];
  const mf_ptensor *x = &p->tensors[t];
  int ok = 1;
  if (depth > 64 || x->micro < 0 || x->layer < 0 || x->first_op < 0 ||
      (x->kind != MF_T_ACT && x->kind != MF_T_STAT) || p->ops[x->first_op].phase != MF_PHASE_FWD) {
    ok = 0;
    goto out;
  }
  for (int32_t u = p->use_start[t]; u < p->use_start[t + 1] && ok; u++) {
    const int32_t k = p->use_ops[u];
    const mf_pop *o = &p->ops[k];
    const uint32_t r = o->reads, w = o->writes;
    int writes_t = 0;
    for (int i = 0; i < MF_KBUF_MAX; i++)
      if (o->t[i] == t && (w >> i & 1)) writes_t = 1;
    if (!writes_t) continue;
    if (o->phase != MF_PHASE_FWD ||
        mf_kernel_is_exchange(o->kind)) { /* an exchange runs once, on every rank */
      ok = 0;
      break;
    }
    for (int i = 0; i < MF_KBUF_MAX && ok; i++) {
      if (o->t[i] < 0) continue;
      const mf_ptensor *v = &p->tensors[o->t[i]];
      if (w >> i & 1) {
        if (v->micro != x->micro || v->layer != x->layer || (v->kind != MF_T_ACT && v->kind != MF_T_STAT))
          ok = 0;
      } else if ((r >> i & 1) && o->t[i] != t && !available_in_bwd(p, o->t[i], depth, memo)) {
        ok = 0;
      }
    }
    if (o->experts_at >= 0)
      for (int64_t e = 0; e < p->spec.experts && ok; e++)
        if (p->id_pool[o->experts_at + e] >= 0 &&
            !available_in_bwd(p, p->id_pool[o->experts_at + e], depth, memo))
          ok = 0;
  }
out:
  if (memo && depth <= 64) memo[t] = (int8_t)ok;
  return ok;
}

mf_status mf_schedule_act_options(const mf_program *p, uint8_t *out) {
  int8_t *memo = (int8_t *)malloc((size_t)p->n_tensors + 1);
  if (!memo) return MF_ERR(MF_ERR_OUT_OF_MEMORY, "schedule: out of memory");
  memset(memo, -1, (size_t)p->n_tensors + 1);
  for (int32_t t = 0; t < p->n_tensors; t++) {
    out[t] = 0;
    if (!mf_schedule_can_offload(p, t)) continue;
    out[t] = can_recompute_depth(p, t, 0, memo) ? 3 : 1;
  }
  free(memo);
  return MF_OK;
}

int mf_schedule_can_recompute(const mf_program *p, int32_t t) {
  if (!mf_schedule_can_offload(p, t)) return 0;
  return can_recompute_depth(p, t, 0, NULL);
}

/* ------------------------------------------------------------- builder */

typedef struct builder {
  const mf_program *p;
  const mf_decisions *d;
  mf_schedule *s;
  int32_t cap_instr, cap_slots;
  int64_t cap_pool;
  int32_t *cur;             /* [n_tensors] resident slot or -1 */
  int32_t *last_fwd_writer; /* [n_tensors] */
  uint8_t *host_valid;      /* offloaded activation has its host copy */
  uint8_t *grad_home;       /* streamed gradient has reached the host once */
  int32_t *acc_slot;        /* [n_params] the step's gradient sum on the device (DEVICE), or -1 */
  uint8_t *acc_fresh;       /* [n_params] 1 while acc_slot holds the step's zeros alone */
  uint8_t *seeded;          /* [n_params] a seeded gradient's first slot was filled from home (grad_seed) */
  int32_t *run_acc;         /* [n_params] a streamed gradient's sum over the current run, or -1 */
  int8_t *memo;             /* [n_tensors] structurally recomputable: -1 unknown, 0, 1 */
  int32_t *temps;           /* tensors a recompute chain produced only as inputs of the chain */
  int32_t *group;           /* [n_ops] each op's streaming group (group_of) */
  int32_t n_temps, cap_temps;
  uint8_t *skip;      /* [n_ops] ops the schedule does not run: the NORM and OPTIM ops of
                         parameters the host updates */
  int32_t last_sumsq; /* the last GRAD_SUMSQ op that runs, or -1 */
  int depth;
  mf_status st;
} builder;

static int32_t param_of(const builder *b, int32_t t) {
  return b->p->tensors[t].param;
}

static mf_instr *emit(builder *b, mf_instr_kind kind) {
  static mf_instr sink;
  if (b->st != MF_OK) return &sink;
  mf_schedule *s = b->s;
  if (s->n_instr == b->cap_instr) {
    int32_t cap = b->cap_instr ? 2 * b->cap_instr : 4096;
    mf_instr *q = (mf_instr *)realloc(s->instr, (size_t)cap * sizeof *q);
    if (!q) {
      b->st = MF_ERR(MF_ERR_OUT_OF_MEMORY, "schedule: out of memory");
      return &sink;
    }
    s->instr = q;
    b->cap_instr = cap;
  }
  mf_instr *in = &s->instr[s->n_instr++];
  memset(in, 0, sizeof *in);
  in->kind = kind;
  in->op = in->slot = in->slot2 = in->operands = -1;
  return in;
}

static int32_t new_slot(builder *b, int32_t t) {
  if (b->st != MF_OK) return -1;
  mf_schedule *s = b->s;
  if (s->n_slots == b->cap_slots) {
    int32_t cap = b->cap_slots ? 2 * b->cap_slots : 4096;
    mf_slot *q = (mf_slot *)realloc(s->slots, (size_t)cap * sizeof *q);
    if (!q) {
      b->st = MF_ERR(MF_ERR_OUT_OF_MEMORY, "schedule: out of memory");
      return -1;
    }
    s->slots = q;
    b->cap_slots = cap;
  }
  mf_slot *sl = &s->slots[s->n_slots];
  sl->tensor = t;
  sl->first = sl->last = -1;
  sl->offset = 0;
  b->cur[t] = s->n_slots;
  return s->n_slots++;
}

static int64_t pool_reserve(builder *b, int64_t n) {
  if (b->st != MF_OK) return -1;
  mf_schedule *s = b->s;
  if (s->n_pool + n > b->cap_pool) {
    int64_t cap = b->cap_pool ? 2 * b->cap_pool : 65536;
    while (cap < s->n_pool + n) cap *= 2;
    int32_t *q = (int32_t *)realloc(s->slot_pool, (size_t)cap * sizeof *q);
    if (!q) {
      b->st = MF_ERR(MF_ERR_OUT_OF_MEMORY, "schedule: out of memory");
      return -1;
    }
    s->slot_pool = q;
    b->cap_pool = cap;
  }
  int64_t at = s->n_pool;
  s->n_pool += n;
  return at;
}

/* The first program use of t at or after op `from` that the schedule runs, or -1. */
static int32_t next_use(const builder *b, int32_t t, int32_t from) {
  int32_t lo = b->p->use_start[t], hi = b->p->use_start[t + 1];
  while (lo < hi) { /* the first use at or after `from`: a tensor's uses are in op order */
    const int32_t mid = lo + (hi - lo) / 2;
    if (b->p->use_ops[mid] < from)
      lo = mid + 1;
    else
      hi = mid;
  }
  for (int32_t u = lo; u < b->p->use_start[t + 1]; u++)
    if (!b->skip[b->p->use_ops[u]]) return b->p->use_ops[u];
  return -1;
}

/* The optimizer on the device: NORM and OPTIM ops. */
static int optim_phase(const mf_pop *o) {
  return o->phase == MF_PHASE_NORM || o->phase == MF_PHASE_OPTIM;
}

/* Weights stream in groups: a run of consecutive program ops that share the
 * direction (backward, or not) and the layer, whatever their micro-batch — one
 * layer's forward or backward of one micro-batch in micro-batch-major order, of
 * every micro-batch in layer-major order. A recompute belongs to the backward
 * op it serves (maybe_drop's ctx). Numbers the groups of every op. */
static void number_groups(const mf_program *p, int32_t *group) {
  int32_t g = 0;
  for (int32_t k = 0; k < p->n_ops; k++) {
    const mf_pop *o = &p->ops[k], *prev = k > 0 ? &p->ops[k - 1] : NULL;
    if (prev && ((o->phase == MF_PHASE_BWD) != (prev->phase == MF_PHASE_BWD) || o->layer != prev->layer)) g++;
    group[k] = g;
  }
}

static int32_t group_of(const builder *b, int32_t k) {
  return b->group[k];
}

/* Whether tensor x stays on the device across steps (a persistent slot): the
 * weights and AdamW state the device updates, and a frozen weight (LoRA's
 * base) kept resident, which nothing ever changes, so its first upload holds
 * for every step after it. */
static int persists(const mf_program *p, const mf_decisions *d, const mf_ptensor *x) {
  if (x->kind == MF_T_OPT) return 1;
  if (x->kind != MF_T_PARAM) return 0;
  return d->optim[x->param] == MF_OPTIM_DEVICE ||
         (p->params->params[x->param].frozen && d->param[x->param] == MF_PARAM_RESIDENT);
}

static void run_op(builder *b, int32_t k, int recompute, int32_t ctx);

/* Brings t onto the device holding its value, for op `ctx` (a program op). */
static void materialize(builder *b, int32_t t, int32_t ctx) {
  const mf_program *p = b->p;
  const mf_ptensor *x = &p->tensors[t];
  if (b->st != MF_OK || b->cur[t] >= 0) return;
  if (x->kind == MF_T_PARAM || x->kind == MF_T_INPUT || x->kind == MF_T_OPT) {
    mf_instr *in = emit(b, MF_I_H2D);
    in->slot = new_slot(b, t);
    in->persist = persists(p, b->d, x);
    return;
  }
  if (x->kind == MF_T_GRAD) {
    /* The step's first contribution to a gradient summed on the device adds
     * straight into the step's zeroed sum: 0 + c is c bit for bit (c cannot be
     * -0 when its own sum starts at +0), so this equals a fresh zeroed slot
     * added in afterwards, as later micro-batches' are — one ZERO and one
     * ACCUM less per parameter and step (on an H100, 644M shape: 4 ms of a
     * 54 ms step). */
    const int32_t pi = param_of(b, t);
    if (p->grad_seed && p->grad_seed[pi] && !b->seeded[pi]) {
      /* The step's first slot starts from the host's sum (mf_program.grad_seed): the other expert-parallel
       * groups' before this rank's, which its contributions add to, as one rank's later micro-batches do. */
      mf_instr *in = emit(b, MF_I_H2D);
      in->slot = new_slot(b, t);
      b->seeded[pi] = 1;
      if (b->d->grad[pi] == MF_GRAD_DEVICE) b->acc_slot[pi] = in->slot;
      return;
    }
    if (b->acc_slot[pi] >= 0 && b->acc_fresh[pi] && b->d->grad[pi] == MF_GRAD_DEVICE) {
      b->cur[t] = b->acc_slot[pi];
      b->acc_fresh[pi] = 0;
      return;
    }
    mf_instr *in = emit(b, MF_I_ZERO);
    in->slot = new_slot(b, t);
    return;
  }
  mf_act_dec dec = (mf_act_dec)b->d->act[t];
  if (dec == MF_ACT_OFFLOAD && b->host_valid[t]) {
    mf_instr *in = emit(b, MF_I_H2D);
    in->slot = new_slot(b, t);
    return;
  }
  /* A tensor the forward no longer holds is produced again when it can be: the
   * decision RECOMPUTE, or an input of another recompute (e.g. routing state). */
  if (dec == MF_ACT_RECOMPUTE || can_recompute_depth(p, t, 0, b->memo)) {
    if (++b->depth > 4096) {
      b->st = MF_ERR(MF_ERR_INTERNAL, "schedule: recompute chain too deep at %s", x->name);
      return;
    }
    /* Run again, in order, every forward op that wrote t. */
    for (int32_t u = b->p->use_start[t]; u < b->p->use_start[t + 1] && b->st == MF_OK; u++) {
      int32_t w = b->p->use_ops[u];
      if (w > b->last_fwd_writer[t]) break;
      const uint32_t wm = p->ops[w].writes;
      int writes = 0;
      for (int i = 0; i < MF_KBUF_MAX; i++)
        if (p->ops[w].t[i] == t && (wm >> i & 1)) writes = 1;
      if (writes) run_op(b, w, 1, ctx);
    }
    b->depth--;
    if (b->cur[t] < 0 && b->st == MF_OK)
      b->st = MF_ERR(MF_ERR_INTERNAL, "schedule: recomputing %s did not produce it", x->name);
    if (b->depth == 0) {
      for (int32_t i = 0; i < b->n_temps; i++)
        if (b->temps[i] != t) b->cur[b->temps[i]] = -1;
      b->n_temps = 0;
    }
    return;
  }
  b->st = MF_ERR(MF_ERR_INTERNAL, "schedule: %s is read at op %d (%s) but is not on the device", x->name, ctx,
                 p->ops[ctx].label);
}

/* After a use: give up the device copy when the decisions say so. ctx is the
 * program op being served (for a recompute, the backward op that needs it). */
static void maybe_drop(builder *b, int32_t t, int32_t after, int32_t ctx) {
  const mf_program *p = b->p;
  const mf_ptensor *x = &p->tensors[t];
  int32_t slot = b->cur[t];
  if (slot < 0 || b->st != MF_OK) return;
  int32_t nu = next_use(b, t, after);
  if (x->kind == MF_T_PARAM) {
    if (nu < 0 || (b->d->param[param_of(b, t)] == MF_PARAM_STREAM && group_of(b, nu) != group_of(b, ctx)))
      b->cur[t] = -1;
    return;
  }
  if (x->kind == MF_T_GRAD) {
    const int32_t pi = param_of(b, t);
    if (optim_phase(&p->ops[ctx])) { /* read by the device optimizer: done after its update */
      if (nu < 0) b->cur[t] = -1;
      return;
    }
    if (nu >= 0 && p->ops[nu].micro == p->ops[ctx].micro) return;
    if (b->d->grad[pi] == MF_GRAD_STREAM) {
      /* The micro-batches of one run (layer-major order) add up on the device
       * and the run's sum goes home once; else each micro-batch's goes home. */
      int32_t acc = b->run_acc[pi];
      if (acc < 0) {
        acc = slot;
      } else if (slot != acc) {
        mf_instr *in = emit(b, MF_I_ACCUM);
        in->slot = slot;
        in->slot2 = acc;
      }
      if (nu >= 0 && group_of(b, nu) == group_of(b, ctx)) {
        b->run_acc[pi] = acc;
      } else {
        mf_instr *in = emit(b, MF_I_D2H);
        in->slot = acc;
        in->accumulate = b->grad_home[pi];
        b->grad_home[pi] = 1;
        b->run_acc[pi] = -1;
      }
    } else {
      /* A later micro-batch's gradient joins the step's sum. */
      const int32_t acc = b->acc_slot[pi];
      if (slot != acc) {
        mf_instr *in = emit(b, MF_I_ACCUM);
        in->slot = slot;
        in->slot2 = acc;
      }
      if (nu >= 0 && optim_phase(&p->ops[nu])) { /* the step's sum stays for the device optimizer */
        b->cur[t] = acc;
        return;
      }
      if (nu < 0) {
        mf_instr *in = emit(b, MF_I_D2H);
        in->slot = acc;
      }
    }
    b->cur[t] = -1;
    return;
  }
  if (nu < 0) {
    /* Inside a recompute chain, an input made only for the chain stays until
     * the chain is done. */
    if (b->depth > 0) {
      if (b->n_temps < b->cap_temps)
        b->temps[b->n_temps++] = t;
      else
        b->st = MF_ERR(MF_ERR_INTERNAL, "schedule: recompute chain too long at %s", x->name);
      return;
    }
    b->cur[t] = -1;
    return;
  }
  mf_act_dec dec = (mf_act_dec)b->d->act[t];
  if (dec != MF_ACT_KEEP && p->ops[ctx].phase != MF_PHASE_BWD && p->ops[nu].phase == MF_PHASE_BWD)
    b->cur[t] = -1;
}

static void run_op(builder *b, int32_t k, int recompute, int32_t ctx) {
  const mf_program *p = b->p;
  const mf_pop *o = &p->ops[k];
  if (b->st != MF_OK) return;
  const uint32_t r = o->reads, w = o->writes;
  const int64_t E = o->experts_at >= 0 ? p->spec.experts : 0;
  /* Operands: read ones must hold their value; written-only ones just need a slot. */
  for (int i = 0; i < MF_KBUF_MAX; i++) {
    int32_t t = o->t[i];
    if (t < 0) continue;
    if (r >> i & 1) {
      materialize(b, t, ctx);
    } else if (b->cur[t] < 0) {
      int32_t sl = new_slot(b, t);
      /* The first slot of a device-accumulated gradient (the step's zeroing) holds the sum. */
      if (p->tensors[t].kind == MF_T_GRAD && b->acc_slot[param_of(b, t)] < 0) {
        b->acc_slot[param_of(b, t)] = sl;
        b->acc_fresh[param_of(b, t)] = o->kind == MF_K_ZERO;
      }
    }
  }
  /* Expert operands hold their value whether read or added into (gradients);
   * a cold expert's adapter (-1) has no tensor and gets no slot. */
  const int32_t *ex = E ? p->id_pool + o->experts_at : NULL;
  for (int64_t e = 0; e < E; e++)
    if (ex[e] >= 0) materialize(b, ex[e], ctx);
  if (b->st != MF_OK) return;
  int64_t at = pool_reserve(b, MF_KBUF_MAX + E);
  if (at < 0) return;
  for (int i = 0; i < MF_KBUF_MAX; i++) b->s->slot_pool[at + i] = o->t[i] >= 0 ? b->cur[o->t[i]] : -1;
  for (int64_t e = 0; e < E; e++) b->s->slot_pool[at + MF_KBUF_MAX + e] = ex[e] >= 0 ? b->cur[ex[e]] : -1;
  mf_instr *in = emit(b, MF_I_RUN);
  in->op = k;
  in->operands = (int32_t)at;
  in->recompute = (uint8_t)recompute;
  if (recompute) b->s->recomputed_ops++;
  /* An offloaded activation goes home once its last forward writer has run. */
  if (!recompute)
    for (int i = 0; i < MF_KBUF_MAX; i++) {
      int32_t t = o->t[i];
      if (t < 0 || !(w >> i & 1) || b->d->act[t] != MF_ACT_OFFLOAD || b->last_fwd_writer[t] != k) continue;
      mf_instr *d2h = emit(b, MF_I_D2H);
      d2h->slot = b->cur[t];
      b->host_valid[t] = 1;
    }
  /* The norm chunk sums go home once the last of them is written. */
  if (k == b->last_sumsq && !recompute) {
    mf_instr *d2h = emit(b, MF_I_D2H);
    d2h->slot = b->cur[o->t[1]];
  }
  const int32_t after = recompute ? ctx : k + 1;
  for (int i = 0; i < MF_KBUF_MAX; i++)
    if (o->t[i] >= 0) maybe_drop(b, o->t[i], after, recompute ? ctx : k);
  for (int64_t e = 0; e < E; e++)
    if (ex[e] >= 0) maybe_drop(b, ex[e], after, recompute ? ctx : k);
}

static mf_status validate(const mf_program *p, int8_t *memo, const mf_decisions *d) {
  if (d->n_params != (int32_t)p->params->n || d->n_tensors != p->n_tensors)
    return MF_ERR(MF_ERR_INVALID_ARG, "schedule: the decisions belong to another program");
  for (int32_t t = 0; t < p->n_tensors; t++) {
    mf_act_dec a = (mf_act_dec)d->act[t];
    if (a == MF_ACT_KEEP) continue;
    if (a == MF_ACT_OFFLOAD && !mf_schedule_can_offload(p, t))
      return MF_ERR(MF_ERR_CONFIG, "plan: %s cannot be offloaded (only activations the backward reads)",
                    p->tensors[t].name);
    if (a == MF_ACT_RECOMPUTE && !can_recompute_depth(p, t, 0, memo))
      return MF_ERR(MF_ERR_CONFIG,
                    "plan: %s cannot be recomputed (its writers have side effects or it is not an "
                    "activation of one layer)",
                    p->tensors[t].name);
    if (a > MF_ACT_RECOMPUTE)
      return MF_ERR(MF_ERR_CONFIG, "plan: bad decision %d for %s", a, p->tensors[t].name);
  }
  for (int32_t i = 0; i < d->n_params; i++) {
    if (d->param[i] > MF_PARAM_STREAM || d->grad[i] > MF_GRAD_STREAM || d->optim[i] > MF_OPTIM_DEVICE)
      return MF_ERR(MF_ERR_CONFIG, "plan: bad decision for %s", p->params->params[i].name);
    if (d->optim[i] == MF_OPTIM_DEVICE && (d->param[i] != MF_PARAM_RESIDENT || d->grad[i] != MF_GRAD_DEVICE))
      return MF_ERR(
          MF_ERR_CONFIG,
          "plan: %s: the optimizer on the device needs its weights resident and its gradient on the "
          "device (params: resident, grads: device)",
          p->params->params[i].name);
    if (d->optim[i] == MF_OPTIM_DEVICE && (p->forward_only || !p->adamw_op))
      return MF_ERR(MF_ERR_CONFIG, "plan: a forward-only program has no optimizer (%s)",
                    p->params->params[i].name);
    if (d->optim[i] == MF_OPTIM_DEVICE && p->adamw_op[i] < 0)
      return MF_ERR(MF_ERR_CONFIG,
                    "plan: %s is frozen (LoRA's base, or a buffer of the checkpoint): it has no optimizer "
                    "(optimizer: host)",
                    p->params->params[i].name);
  }
  if (p->forward_only)
    for (int32_t i = 0; i < d->n_params; i++)
      if (d->grad[i] != MF_GRAD_DEVICE)
        return MF_ERR(MF_ERR_CONFIG, "plan: a forward-only program has no gradients");
  return MF_OK;
}

/* ---------------------------------------------------------- memory plan */

#define ALIGN 64
static size_t align_up(size_t x) {
  return (x + ALIGN - 1) & ~(size_t)(ALIGN - 1);
}

/* Slot ids ordered by key (first or last instruction), ties by id: a
 * counting sort over the instructions, O(slots + instructions). */
static mf_status sort_slots(const mf_schedule *s, int by_last, int32_t *out) {
  int32_t *count = (int32_t *)calloc((size_t)s->n_instr + 1, sizeof(int32_t));
  if (!count) return MF_ERR(MF_ERR_OUT_OF_MEMORY, "schedule: out of memory");
  for (int32_t i = 0; i < s->n_slots; i++) {
    const int32_t key = by_last ? s->slots[i].last : s->slots[i].first;
    if (key < 0 || key >= s->n_instr) {
      free(count);
      return MF_ERR(MF_ERR_INTERNAL, "schedule: slot %d of %s is never used", (int)i,
                    s->prog->tensors[s->slots[i].tensor].name);
    }
    count[key + 1]++;
  }
  for (int32_t k = 0; k < s->n_instr; k++) count[k + 1] += count[k];
  for (int32_t i = 0; i < s->n_slots; i++) out[count[by_last ? s->slots[i].last : s->slots[i].first]++] = i;
  free(count);
  return MF_OK;
}

/* Static placement in instruction order: a slot takes the best-fitting free
 * block when it is first filled (or grows the arena) and gives its bytes back
 * after its last use, so slots alive at the same instruction never share
 * bytes. O(slots x free blocks). Also measures the live-bytes peak. */
static mf_status pack(mf_schedule *s) {
  const mf_program *p = s->prog;
  const int32_t n = s->n_slots;
  int32_t *by_first = (int32_t *)malloc((size_t)(n ? n : 1) * sizeof(int32_t));
  int32_t *by_last = (int32_t *)malloc((size_t)(n ? n : 1) * sizeof(int32_t));
  mf_packer pk;
  memset(&pk, 0, sizeof pk);
  mf_status st = MF_OK;
  if (!by_first || !by_last) {
    st = MF_ERR(MF_ERR_OUT_OF_MEMORY, "schedule: out of memory");
    goto done;
  }
  MF_CHECK_GOTO(sort_slots(s, 0, by_first), st, done);
  MF_CHECK_GOTO(sort_slots(s, 1, by_last), st, done);
  size_t live = 0;
  s->peak_live_bytes = 0;
  int32_t a = 0, r = 0;
  for (int32_t i = 0; i < s->n_instr && st == MF_OK; i++) {
    for (; a < n && s->slots[by_first[a]].first == i; a++) {
      mf_slot *x = &s->slots[by_first[a]];
      x->offset = mf_packer_take(&pk, align_up(p->tensors[x->tensor].bytes));
      live += p->tensors[x->tensor].bytes;
    }
    if (live > s->peak_live_bytes) {
      s->peak_live_bytes = live;
      s->peak_instr = i;
    }
    for (; r < n && s->slots[by_last[r]].last == i; r++) {
      const mf_slot *x = &s->slots[by_last[r]];
      live -= p->tensors[x->tensor].bytes;
      if (st == MF_OK) st = mf_packer_give(&pk, x->offset, align_up(p->tensors[x->tensor].bytes), "schedule");
    }
  }
  s->arena_bytes = pk.top;
done:
  free(by_first);
  free(by_last);
  mf_packer_free(&pk);
  return st;
}

/* ------------------------------------------------- order between streams */

/* What the walk over the instructions remembers (mf_schedule_waits). */
typedef struct order {
  const mf_schedule *s;
  int32_t *last_write;         /* [n_slots] the last instruction writing the slot */
  int32_t *last_read;          /* [3 n_slots] per stream, the last one reading it since that write */
  int32_t *last_acc;           /* [3 n_slots] per stream, the last one touching it */
  int32_t *host_writer;        /* [n_tensors] the last D2H of the tensor */
  int32_t *by_first, *by_last; /* [n_slots] slots by first and by last instruction */
  int32_t *lo, *hi;            /* [n_slots] each slot's elementary intervals of the arena */
  size_t *ranges;              /* [2 n_slots] the slots' offsets, then their bytes */
  mf_segtree *tree;            /* a lane per stream: the last instruction touching each arena byte's slots
                                  that are done */
} order;

static void need(int32_t *w, int q, int32_t j) {
  if (j > w[q]) w[q] = j;
}

/* Instruction i (on stream k) reads and/or writes `slot`: what it waits for
 * (RAW/WAW: the last write; WAR: the reads since), then the bookkeeping. */
static void order_access(order *o, int32_t i, int k, int32_t slot, int rd, int wr, int32_t *w) {
  const size_t b = 3 * (size_t)slot;
  const int32_t lw = o->last_write[slot];
  if (lw >= 0) need(w, mf_schedule_stream(o->s->instr[lw].kind), lw);
  if (wr) {
    for (int q = 0; q < MF_SCHED_STREAMS; q++) {
      need(w, q, o->last_read[b + (size_t)q]);
      o->last_read[b + (size_t)q] = -1;
    }
    o->last_write[slot] = i;
  } else if (rd) {
    o->last_read[b + (size_t)k] = i;
  }
  o->last_acc[b + (size_t)k] = i;
}

/* Every slot instruction i touches, and how. */
static void order_instr(order *o, int32_t i, int k, int32_t *w) {
  const mf_schedule *s = o->s;
  const mf_program *p = s->prog;
  const mf_instr *in = &s->instr[i];
  switch (in->kind) {
    case MF_I_H2D: {
      const int32_t t = s->slots[in->slot].tensor;
      if (s->host_offset[t] != SIZE_MAX) need(w, MF_SCHED_D2H, o->host_writer[t]);
      order_access(o, i, k, in->slot, 0, 1, w);
      break;
    }
    case MF_I_D2H:
      order_access(o, i, k, in->slot, 1, 0, w);
      o->host_writer[s->slots[in->slot].tensor] = i;
      break;
    case MF_I_ZERO:
      order_access(o, i, k, in->slot, 0, 1, w);
      break;
    case MF_I_ACCUM:
      order_access(o, i, k, in->slot, 1, 0, w);
      order_access(o, i, k, in->slot2, 1, 1, w);
      break;
    case MF_I_RUN: {
      const mf_pop *op = &p->ops[in->op];
      const int32_t *sl = s->slot_pool + in->operands;
      for (int j = 0; j < MF_KBUF_MAX; j++)
        if (sl[j] >= 0)
          order_access(o, i, k, sl[j], (int)(op->reads >> j & 1), (int)(op->writes >> j & 1), w);
      if (op->experts_at >= 0)
        for (int64_t e = 0; e < p->spec.experts; e++)
          if (sl[MF_KBUF_MAX + e] >= 0) order_access(o, i, k, sl[MF_KBUF_MAX + e], 1, op->writes_experts, w);
      break;
    }
    default:
      break;
  }
}

/* The walk's memory, in two allocations: eleven arrays of n_slots and one of
 * n_tensors, and the slots' byte ranges; then the arena's elementary
 * intervals and a tree over them with a lane per stream. */
static mf_status order_init(order *o, const mf_schedule *s) {
  const int32_t ns = s->n_slots;
  memset(o, 0, sizeof *o);
  o->s = s;
  MF_CHECK(mf_malloc((11 * (size_t)ns + (size_t)s->prog->n_tensors + 1) * sizeof(int32_t), "schedule order",
                     (void **)&o->last_write));
  MF_CHECK(mf_malloc((2 * (size_t)ns + 1) * sizeof(size_t), "schedule order", (void **)&o->ranges));
  o->last_read = o->last_write + ns;
  o->last_acc = o->last_read + 3 * (size_t)ns;
  o->by_first = o->last_acc + 3 * (size_t)ns;
  o->by_last = o->by_first + ns;
  o->lo = o->by_last + ns;
  o->hi = o->lo + ns;
  o->host_writer = o->hi + ns;
  memset(o->last_write, 0xff, 7 * (size_t)ns * sizeof(int32_t)); /* -1: none yet */
  memset(o->host_writer, 0xff, (size_t)s->prog->n_tensors * sizeof(int32_t));
  MF_CHECK(sort_slots(s, 0, o->by_first));
  MF_CHECK(sort_slots(s, 1, o->by_last));
  for (int32_t x = 0; x < ns; x++) {
    o->ranges[x] = s->slots[x].offset;
    o->ranges[ns + x] = s->prog->tensors[s->slots[x].tensor].bytes;
  }
  int32_t leaves = 0;
  MF_CHECK(mf_interval_leaves(ns, o->ranges, o->ranges + ns, o->lo, o->hi, &leaves));
  return mf_segtree_create(leaves, MF_SCHED_STREAMS, &o->tree);
}

static void order_free(order *o) {
  mf_segtree_free(o->tree);
  free(o->last_write);
  free(o->ranges);
}

/* One walk in instruction order: waits[3 n_instr] (see mf_schedule_waits). */
static mf_status order_build(const mf_schedule *s, int32_t *waits) {
  const int32_t n = s->n_instr, ns = s->n_slots;
  order o;
  mf_status st = order_init(&o, s);
  int32_t a = 0, r = 0;
  for (int32_t i = 0; i < n && st == MF_OK; i++) {
    const int k = mf_schedule_stream(s->instr[i].kind);
    int32_t w[MF_SCHED_STREAMS] = {-1, -1, -1};
    /* Memory: a slot first filled here waits for what held its bytes. */
    for (; a < ns && s->slots[o.by_first[a]].first == i; a++) {
      const int32_t x = o.by_first[a];
      int32_t held[MF_SCHED_STREAMS];
      mf_segtree_max(o.tree, o.lo[x], o.hi[x], held);
      for (int q = 0; q < MF_SCHED_STREAMS; q++) need(w, q, held[q]);
    }
    order_instr(&o, i, k, w);
    for (int q = 0; q < MF_SCHED_STREAMS; q++) waits[3 * (size_t)i + (size_t)q] = q == k ? -1 : w[q];
    /* Slots whose last instruction this is: their bytes are free once every
     * stream is past its last touch of them. */
    for (; r < ns && s->slots[o.by_last[r]].last == i; r++) {
      const int32_t x = o.by_last[r];
      if (!s->slots[x].persist) mf_segtree_chmax(o.tree, o.lo[x], o.hi[x], o.last_acc + 3 * (size_t)x);
    }
  }
  order_free(&o);
  return st;
}

mf_status mf_schedule_waits(const mf_schedule *s, const int32_t **out) {
  int32_t *w = __atomic_load_n(&s->waits, __ATOMIC_ACQUIRE);
  if (!w) {
    MF_CHECK(mf_malloc((3 * (size_t)s->n_instr + 1) * sizeof(int32_t), "schedule order", (void **)&w));
    const mf_status st = order_build(s, w);
    if (st != MF_OK) {
      free(w);
      return st;
    }
    /* Memoised in the schedule (allocated writable by mf_schedule_build):
     * the first of threads racing here publishes, the others free theirs. */
    int32_t *none = NULL;
    if (!__atomic_compare_exchange_n(&((mf_schedule *)s)->waits, &none, w, 0, __ATOMIC_ACQ_REL,
                                     __ATOMIC_ACQUIRE)) {
      free(w);
      w = none;
    }
  }
  *out = w;
  return MF_OK;
}

/* Slot ranges, transfer volume, persistent slots, host copies of offloaded
 * activations: what the instruction list says about the slots. */
static void slot_ranges(mf_schedule *s, const mf_decisions *d) {
  const mf_program *p = s->prog;
  const int32_t nt = p->n_tensors;
  for (int32_t i = 0; i < s->n_instr; i++) {
    const mf_instr *in = &s->instr[i];
    if (in->kind == MF_I_RUN) {
      const mf_pop *o = &p->ops[in->op];
      const int64_t n = MF_KBUF_MAX + (o->experts_at >= 0 ? p->spec.experts : 0);
      for (int64_t j = 0; j < n; j++) {
        int32_t sl = s->slot_pool[in->operands + j];
        if (sl < 0) continue;
        if (s->slots[sl].first < 0) s->slots[sl].first = i;
        s->slots[sl].last = i;
      }
    } else {
      if (in->kind == MF_I_ACCUM) {
        mf_slot *dst = &s->slots[in->slot2];
        if (dst->first < 0) dst->first = i;
        dst->last = i;
      }
      mf_slot *sl = &s->slots[in->slot];
      if (sl->first < 0) sl->first = i;
      sl->last = i;
      size_t bytes = p->tensors[sl->tensor].bytes;
      if (in->kind == MF_I_H2D && !in->persist) s->h2d_bytes += bytes;
      if (in->kind == MF_I_D2H) s->d2h_bytes += bytes;
    }
  }
  /* Persistent slots hold their bytes for the whole step, so no other slot
   * ever shares them and their contents survive from step to step. */
  for (int32_t i = 0; i < s->n_slots; i++) {
    const mf_ptensor *x = &p->tensors[s->slots[i].tensor];
    s->slots[i].persist = persists(p, d, x);
    if (!s->slots[i].persist) continue;
    s->slots[i].first = 0;
    s->slots[i].last = s->n_instr - 1;
    s->persist_bytes += x->bytes;
  }
  for (int32_t t = 0; t < nt; t++) {
    s->host_offset[t] = SIZE_MAX;
    if (d->act[t] == MF_ACT_OFFLOAD) {
      s->host_offset[t] = s->host_act_bytes;
      s->host_act_bytes += align_up(p->tensors[t].bytes);
    }
  }
}

mf_status mf_schedule_build(const mf_program *p, const mf_decisions *d, mf_schedule **out) {
  *out = NULL;
  if (d->n_params != (int32_t)p->params->n || d->n_tensors != p->n_tensors)
    return MF_ERR(MF_ERR_INVALID_ARG, "schedule: the decisions belong to another program");
  mf_schedule *s = (mf_schedule *)calloc(1, sizeof *s);
  if (!s) return MF_ERR(MF_ERR_OUT_OF_MEMORY, "schedule: out of memory");
  s->prog = p;
  builder b;
  memset(&b, 0, sizeof b);
  b.p = p;
  b.d = d;
  b.s = s;
  const int32_t nt = p->n_tensors;
  b.cur = (int32_t *)malloc((size_t)nt * sizeof(int32_t));
  b.last_fwd_writer = (int32_t *)malloc((size_t)nt * sizeof(int32_t));
  b.host_valid = (uint8_t *)calloc((size_t)nt, 1);
  b.grad_home = (uint8_t *)calloc((size_t)p->params->n + 1, 1);
  b.acc_slot = (int32_t *)malloc((size_t)(p->params->n + 1) * sizeof(int32_t));
  b.run_acc = (int32_t *)malloc((size_t)(p->params->n + 1) * sizeof(int32_t));
  b.acc_fresh = (uint8_t *)calloc((size_t)p->params->n + 1, 1);
  b.seeded = (uint8_t *)calloc((size_t)p->params->n + 1, 1);
  if (b.acc_slot)
    for (int64_t i = 0; i <= p->params->n; i++) b.acc_slot[i] = -1;
  if (b.run_acc)
    for (int64_t i = 0; i <= p->params->n; i++) b.run_acc[i] = -1;
  b.memo = (int8_t *)malloc((size_t)nt);
  b.cap_temps = 8 * nt + 16;
  b.temps = (int32_t *)malloc((size_t)b.cap_temps * sizeof(int32_t));
  b.group = (int32_t *)malloc((size_t)(p->n_ops + 1) * sizeof(int32_t));
  if (b.group) number_groups(p, b.group);
  if (b.memo) memset(b.memo, -1, (size_t)nt);
  s->host_offset = (size_t *)malloc((size_t)nt * sizeof(size_t));
  s->optim_device = (uint8_t *)calloc((size_t)p->params->n + 1, 1);
  b.skip = (uint8_t *)calloc((size_t)p->n_ops + 1, 1);
  b.last_sumsq = -1;
  {
    /* First capacities from the program's size: about a RUN per op (and
     * recomputes), copies and zeros per tensor, each RUN's operands. Unused
     * room costs address space only, while growing copies every page again
     * (planning a real-size model builds hundreds of schedules). */
    int64_t pool = 0;
    for (int32_t k = 0; k < p->n_ops; k++)
      pool += MF_KBUF_MAX + (p->ops[k].experts_at >= 0 ? p->spec.experts : 0);
    b.cap_instr = 2 * p->n_ops + 4 * nt + 4096;
    b.cap_slots = 3 * nt + 4096;
    b.cap_pool = 2 * pool + 65536;
    s->instr = (mf_instr *)malloc((size_t)b.cap_instr * sizeof *s->instr);
    s->slots = (mf_slot *)malloc((size_t)b.cap_slots * sizeof *s->slots);
    s->slot_pool = (int32_t *)malloc((size_t)b.cap_pool * sizeof *s->slot_pool);
  }
  if (!b.cur || !b.last_fwd_writer || !b.host_valid || !b.grad_home || !b.acc_slot || !b.acc_fresh ||
      !b.seeded || !b.run_acc || !b.memo || !b.temps || !b.group || !s->host_offset || !s->optim_device ||
      !b.skip || !s->instr || !s->slots || !s->slot_pool) {
    b.st = MF_ERR(MF_ERR_OUT_OF_MEMORY, "schedule: out of memory");
    goto done;
  }
  b.st = validate(p, b.memo, d);
  if (b.st != MF_OK) goto done;
  for (int32_t k = 0; k < p->n_ops; k++) {
    const mf_pop *o = &p->ops[k];
    if (!optim_phase(o)) continue;
    const int32_t pi = p->tensors[o->t[0]].param; /* the weight (ADAMW) or the gradient (GRAD_SUMSQ) */
    b.skip[k] = d->optim[pi] != MF_OPTIM_DEVICE;
    if (!b.skip[k] && o->kind == MF_K_GRAD_SUMSQ) b.last_sumsq = k;
  }
  for (int32_t i = 0; i < d->n_params; i++) {
    s->optim_device[i] = d->optim[i] == MF_OPTIM_DEVICE;
    s->n_optim_device += s->optim_device[i];
  }
  for (int32_t t = 0; t < nt; t++) b.cur[t] = b.last_fwd_writer[t] = -1;
  for (int32_t k = 0; k < p->n_ops; k++) {
    const mf_pop *o = &p->ops[k];
    if (o->phase != MF_PHASE_FWD) continue;
    for (int i = 0; i < MF_KBUF_MAX; i++)
      if (o->t[i] >= 0 && (o->writes >> i & 1)) b.last_fwd_writer[o->t[i]] = k;
  }

  s->optim_begin = -1;
  int home_done = 0;
  for (int32_t k = 0; k <= p->n_ops && b.st == MF_OK; k++) {
    const mf_pop *o = k < p->n_ops ? &p->ops[k] : NULL;
    if (!home_done && (!o || optim_phase(o))) {
      /* Whatever is still on the device and holds a gradient the host
       * updates goes home (before the device optimizer's part). */
      home_done = 1;
      for (int32_t t = 0; t < nt; t++)
        if (b.cur[t] >= 0 && p->tensors[t].kind == MF_T_GRAD &&
            d->optim[param_of(&b, t)] != MF_OPTIM_DEVICE) {
          int32_t pi = param_of(&b, t);
          mf_instr *in = emit(&b, MF_I_D2H);
          in->slot = b.cur[t];
          in->accumulate = b.grad_home[pi];
          b.grad_home[pi] = 1;
          b.cur[t] = -1;
        }
    }
    if (!o) break;
    if (b.skip[k]) continue;
    if (o->phase == MF_PHASE_OPTIM && s->optim_begin < 0) s->optim_begin = s->n_instr;
    /* A streamed gradient is zeroed where its slot starts, not for the whole step; a seeded one is
     * filled from home there. */
    if (o->kind == MF_K_ZERO && o->phase == MF_PHASE_SETUP && o->t[0] >= 0 &&
        p->tensors[o->t[0]].kind == MF_T_GRAD &&
        (d->grad[param_of(&b, o->t[0])] == MF_GRAD_STREAM ||
         (p->grad_seed && p->grad_seed[param_of(&b, o->t[0])])))
      continue;
    run_op(&b, k, 0, k);
  }
  if (b.st != MF_OK) goto done;
  if (s->optim_begin < 0) s->optim_begin = s->n_instr;

  slot_ranges(s, d);
  b.st = pack(s);
done:
  free(b.cur);
  free(b.last_fwd_writer);
  free(b.host_valid);
  free(b.grad_home);
  free(b.acc_slot);
  free(b.acc_fresh);
  free(b.seeded);
  free(b.run_acc);
  free(b.memo);
  free(b.temps);
  free(b.group);
  free(b.skip);
  if (b.st != MF_OK) {
    mf_schedule_free(s);
    return b.st;
  }
  *out = s;
  return MF_OK;
}

void mf_schedule_free(mf_schedule *s) {
  if (!s) return;
  free(s->instr);
  free(s->slots);
  free(s->slot_pool);
  free(s->host_offset);
  free(s->optim_device);
  free(s->waits);
  free(s);
}

void mf_schedule_expert_micros(const mf_schedule *s, int32_t *lo, int32_t *hi) {
  const mf_program *p = s->prog;
  const int64_t E = p->spec.experts;
  for (int32_t x = 0; x < s->n_slots; x++) lo[x] = hi[x] = -1;
  for (int32_t i = 0; i < s->n_instr; i++) {
    const mf_instr *in = &s->instr[i];
    if (in->kind == MF_I_ACCUM) {
      const int32_t a = in->slot, b = in->slot2;
      if (lo[a] < 0) continue;
      if (lo[b] < 0 || lo[a] < lo[b]) lo[b] = lo[a];
      if (hi[a] > hi[b]) hi[b] = hi[a];
      continue;
    }
    if (in->kind != MF_I_RUN || p->ops[in->op].experts_at < 0 || p->ops[in->op].micro < 0) continue;
    const int32_t m = p->ops[in->op].micro;
    for (int64_t e = 0; e < E; e++) {
      const int32_t sl = s->slot_pool[in->operands + MF_KBUF_MAX + e];
      if (sl < 0) continue;
      if (lo[sl] < 0 || m < lo[sl]) lo[sl] = m;
      if (m > hi[sl]) hi[sl] = m;
    }
  }
}
