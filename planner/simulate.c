/* The event simulation of a schedule's streams (see simulate.h). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "planner/simulate.h"

#include "experts/experts.h"

/* The schedule's stream numbers are the simulator's (its order between
 * streams is indexed by them). */
_Static_assert((int)MF_SIM_COMPUTE == MF_SCHED_COMPUTE && (int)MF_SIM_H2D == MF_SCHED_H2D &&
                   (int)MF_SIM_D2H == MF_SCHED_D2H && (int)MF_SIM_STREAMS == MF_SCHED_STREAMS,
               "stream numbers");

const char *mf_sim_stream_name(mf_sim_stream s) {
  switch (s) {
    case MF_SIM_COMPUTE:
      return "compute";
    case MF_SIM_H2D:
      return "h2d";
    case MF_SIM_D2H:
      return "d2h";
    default:
      return "?";
  }
}

/* ------------------------------------------------------------------ costs */

static double gemm(const mf_hwprofile *hw, double m, double n, double k) {
  return mf_hw_gemm_seconds(hw, m, n, k);
}

/* Bytes an elementwise op touches: each operand tensor once; an embedding
 * table only in the T rows the tokens select. */
static double op_bytes(const mf_program *p, const mf_pop *o) {
  /* The device optimizer: GRAD_SUMSQ reads the gradient (its chunk sums are a
   * few bytes); ADAMW reads and writes the weight and the state, and reads
   * the gradient. */
  if (o->kind == MF_K_GRAD_SUMSQ) return o->t[0] >= 0 ? (double)p->tensors[o->t[0]].bytes : 0.0;
  if (o->kind == MF_K_ADAMW) {
    double b = 0;
    if (o->t[0] >= 0) b += 2.0 * (double)p->tensors[o->t[0]].bytes;
    if (o->t[1] >= 0) b += (double)p->tensors[o->t[1]].bytes;
    if (o->t[2] >= 0) b += 2.0 * (double)p->tensors[o->t[2]].bytes;
    return b;
  }
  double bytes = 0;
  for (int i = 0; i < MF_KBUF_MAX; i++) {
    const int32_t t = o->t[i];
    if (t < 0) continue;
    int dup = 0;
    for (int j = 0; j < i; j++) dup |= o->t[j] == t;
    if (dup) continue;
    double b = (double)p->tensors[t].bytes;
    if ((o->kind == MF_K_EMBED_FWD || o->kind == MF_K_EMBED_BWD) &&
        i == (o->kind == MF_K_EMBED_FWD ? 1 : 2) && o->i[1] > 0 && o->i[0] < o->i[1])
      b = b / (double)o->i[1] * (double)o->i[0];
    bytes += b;
  }
  return bytes;
}

/* A grouped GEMM over R = T*K routed rows: each of the experts expected to
 * get rows (E (1 - (1 - K/E)^T)) takes an even share; one launch for all. */
static double expert_seconds(const mf_program *p, const mf_pop *o, const mf_hwprofile *hw) {
  const double E = (double)o->i[0], N = (double)o->i[1], Kd = (double)o->i[2];
  const double T = (double)(p->B * p->S), K = (double)p->spec.top_k;
  if (!(E > 0) || !(T > 0) || !(K > 0)) return 0;
  const double R = T * K; /* with expert parallelism: the rows this rank's experts get, on average */
  /* its E / ep experts, busy with the tokens of every rank's micro-batch */
  const double active = mf_experts_expected_busy(o->i[0], p->spec.top_k, T * (double)p->ep) / (double)p->ep;
  const double m = R / active;
  double one;
  if (o->kind == MF_K_EXPERT_FWD)
    one = gemm(hw, m, N, Kd); /* y[m,N] = x[m,Kd] W^T */
  else if (o->kind == MF_K_EXPERT_BWD_DATA)
    one = gemm(hw, m, Kd, N); /* dx[m,Kd] = dy[m,N] W */
  else
    one = gemm(hw, N, Kd, m); /* dW[N,Kd] = dy^T x */
  if (!(one > 0)) return one; /* no work (0), or a profile that cannot price it (NAN) */
  const double work = one - hw->launch_s;
  return active * (work > 0 ? work : 0) + hw->launch_s;
}

/* A RUN's key sizes: the call's i[]; GRAD_SUMSQ's without where its sums go
 * (i[1], first), which is no part of the work. */
static void op_sizes(const mf_pop *o, int64_t sizes[8]) {
  memcpy(sizes, o->i, 8 * sizeof(int64_t));
  if (o->kind == MF_K_GRAD_SUMSQ) sizes[1] = 0;
}

int mf_sim_instr_key(const mf_schedule *s, int32_t i, const char **kernel, int64_t sizes[8], int *n_sizes,
                     double *bytes) {
  const mf_program *p = s->prog;
  const mf_instr *in = &s->instr[i];
  memset(sizes, 0, 8 * sizeof(int64_t));
  *n_sizes = 0;
  *bytes = 0;
  switch (in->kind) {
    case MF_I_RUN: {
      const mf_pop *o = &p->ops[in->op];
      *kernel = mf_kernel_name(o->kind);
      op_sizes(o, sizes);
      *n_sizes = 8;
      *bytes = op_bytes(p, o);
      return 1;
    }
    case MF_I_ZERO:
      *kernel = mf_kernel_name(MF_K_ZERO);
      *bytes = (double)p->tensors[s->slots[in->slot].tensor].bytes;
      return 1;
    case MF_I_ACCUM:
      *kernel = mf_kernel_name(MF_K_ADD);
      sizes[0] = p->tensors[s->slots[in->slot].tensor].numel;
      sizes[1] = 1;
      *n_sizes = 2;
      *bytes = (double)p->tensors[s->slots[in->slot].tensor].bytes +
               (double)p->tensors[s->slots[in->slot2].tensor].bytes;
      return 1;
    default:
      *kernel = "";
      return 0;
  }
}

/* The profile's measured time for a key, or NAN. */
static double measured(const mf_hwprofile *hw, const char *kernel, const int64_t *sizes, int n_sizes,
                       double bytes) {
  return hw->n_kernels > 0 ? mf_hw_kernel_seconds(hw, kernel, sizes, n_sizes, bytes) : NAN;
}

double mf_sim_op_seconds(const mf_program *p, int32_t k, const mf_hwprofile *hw) {
  const mf_pop *o = &p->ops[k];
  if (hw->n_kernels > 0) {
    int64_t sizes[8];
    op_sizes(o, sizes);
    const double m = measured(hw, mf_kernel_name(o->kind), sizes, 8, op_bytes(p, o));
    if (!isnan(m)) return m;
  }
  switch (o->kind) {
    case MF_K_LINEAR_FWD: /* y[M,N] = x[M,K] W^T */
      return gemm(hw, (double)o->i[0], (double)o->i[1], (double)o->i[2]);
    case MF_K_LINEAR_BWD_DATA: /* dx[M,K] = dy[M,N] W */
      return gemm(hw, (double)o->i[0], (double)o->i[2], (double)o->i[1]);
    case MF_K_LINEAR_BWD_WEIGHT: /* dW[N,K] = dy^T x */
      return gemm(hw, (double)o->i[1], (double)o->i[2], (double)o->i[0]);
    case MF_K_EXPERT_FWD:
    case MF_K_EXPERT_BWD_DATA:
    case MF_K_EXPERT_BWD_WEIGHT:
      return expert_seconds(p, o, hw);
    case MF_K_CROSS_ENTROPY: {
      const int64_t T = o->i[0], V = o->i[1], H = o->i[2];
      int64_t chunk = o->i[3];
      if (T <= 0 || V <= 0 || H <= 0) return 0;
      if (chunk <= 0 || chunk > V) chunk = V;
      const double passes = o->flops / (2.0 * (double)T * (double)V * (double)H);
      const int64_t full = V / chunk, rem = V % chunk;
      double one = (double)full * gemm(hw, (double)T, (double)chunk, (double)H);
      if (rem) one += gemm(hw, (double)T, (double)rem, (double)H);
      return passes * one;
    }
    case MF_K_ATTN_FWD:
    case MF_K_ATTN_BWD:
      return mf_hw_attention_seconds(hw, o->flops, (double)o->i[1], (double)o->i[4]);
    case MF_K_EP_DISPATCH:
    case MF_K_EP_COMBINE: { /* the rows for other ranks out and theirs in, on average (ep - 1) / ep of R */
      const double ep = (double)p->ep,
                   rows_bytes = (double)p->tensors[o->t[o->kind == MF_K_EP_DISPATCH ? 2 : 0]].bytes;
      const double share = ep > 1 ? rows_bytes / ep / ep : 0; /* to or from each other rank */
      /* A group over several nodes: the other nodes' shares cross the network meanwhile (a profile
       * without network.bandwidth: all at the link's). */
      const double here = p->ep > p->node_ranks && hw->network_bandwidth > 0 ? (double)p->node_ranks : ep;
      const double link = share * (here - 1) / mf_hw_link_bandwidth(hw),
                   net = hw->network_bandwidth > 0 ? share * (ep - here) / hw->network_bandwidth : 0;
      return (link > net ? link : net) + hw->launch_s;
    }
    case MF_K_ADAMW:
      /* On a serial profile (the cpu backend) the device's optimizer is the
       * host's own code, at its rate; on a GPU a bandwidth-bound kernel. */
      if (!hw->copies_overlap_compute) {
        const int32_t pi = o->t[0] >= 0 ? p->tensors[o->t[0]].param : -1;
        const double n = pi >= 0 && pi < p->params->n ? (double)p->params->params[pi].numel : (double)o->i[0];
        return mf_hw_adamw_seconds(hw, n);
      }
      return mf_hw_elementwise_seconds(hw, op_bytes(p, o));
    default:
      return mf_hw_elementwise_seconds(hw, op_bytes(p, o));
  }
}

/* ------------------------------------------------------------- simulation */

typedef struct scratch {
  double *op_cost; /* [n_ops] */
  double *end;     /* [n_instr] a pass's end times when they are not the result's */
  int64_t *delta;  /* [n_instr + 1] live bytes, as differences */
  double *gate;    /* [n_instr] overlap_optimizer: when the update of the parameter the instruction first
                      uploads is done, else -1 */
  uint8_t *seen;   /* [n_params] */
  float *use;      /* [n_slots] the chance the slot's copies happen (expert_share), or NULL: 1 */
} scratch;

static void scratch_free(scratch *w) {
  free(w->op_cost);
  free(w->end);
  free(w->delta);
  free(w->gate);
  free(w->seen);
  free(w->use);
}

void mf_sim_result_free(mf_sim_result *r) {
  if (!r) return;
  free(r->stream);
  free(r->cost);
  free(r->start);
  free(r->end);
  free(r->live_bytes);
  memset(r, 0, sizeof *r);
}

/* The cost of instruction i in seconds (see simulate.h). */
static double instr_cost(const mf_schedule *s, const mf_hwprofile *hw, const scratch *w, int32_t i) {
  const mf_program *p = s->prog;
  const mf_instr *in = &s->instr[i];
  switch (in->kind) {
    case MF_I_RUN:
      return w->op_cost[in->op];
    case MF_I_H2D:
    case MF_I_D2H: {
      const int h2d = in->kind == MF_I_H2D;
      /* A persistent slot's fill: the device copy is current in the steady state. */
      double cost = in->persist && h2d
                        ? 0.0
                        : mf_hw_copy_seconds(hw, h2d, (double)p->tensors[s->slots[in->slot].tensor].bytes);
      if (w->use) cost *= (double)w->use[in->slot];
      return cost;
    }
    case MF_I_ZERO:
    case MF_I_ACCUM: {
      const char *kname;
      int64_t sizes[8];
      int ns;
      double bytes;
      mf_sim_instr_key(s, i, &kname, sizes, &ns, &bytes);
      const double cost = measured(hw, kname, sizes, ns, bytes);
      return isnan(cost) ? mf_hw_elementwise_seconds(hw, bytes) : cost;
    }
    default:
      return 0;
  }
}

static mf_status validate(const mf_schedule *s) {
  const mf_program *p = s->prog;
  for (int32_t i = 0; i < s->n_instr; i++) {
    const mf_instr *in = &s->instr[i];
    if (in->kind == MF_I_RUN) {
      if (in->op < 0 || in->op >= p->n_ops || in->operands < 0 ||
          in->operands + MF_KBUF_MAX + (p->ops[in->op].experts_at >= 0 ? p->spec.experts : 0) > s->n_pool)
        return MF_ERR(MF_ERR_INVALID_ARG, "simulate: instruction %d runs a bad op or operand list", i);
      continue;
    }
    if ((int)in->kind < 0 || in->kind >= MF_I_KIND_COUNT_)
      return MF_ERR(MF_ERR_INVALID_ARG, "simulate: instruction %d has a bad kind", i);
    if (in->slot < 0 || in->slot >= s->n_slots ||
        (in->kind == MF_I_ACCUM && (in->slot2 < 0 || in->slot2 >= s->n_slots)))
      return MF_ERR(MF_ERR_INVALID_ARG, "simulate: instruction %d names a bad slot", i);
  }
  if (s->optim_begin < 0 || s->optim_begin > s->n_instr)
    return MF_ERR(MF_ERR_INVALID_ARG,
                  "simulate: the optimizer part begins at %d, outside the %d instructions", s->optim_begin,
                  s->n_instr);
  for (int64_t k = 0; k < s->n_pool; k++)
    if (s->slot_pool[k] >= s->n_slots)
      return MF_ERR(MF_ERR_INVALID_ARG, "simulate: operand %lld names a bad slot", (long long)k);
  for (int32_t x = 0; x < s->n_slots; x++) {
    const mf_slot *sl = &s->slots[x];
    if (sl->tensor < 0 || sl->tensor >= p->n_tensors || sl->last >= s->n_instr || sl->first > sl->last)
      return MF_ERR(MF_ERR_INVALID_ARG, "simulate: slot %d has a bad tensor or range", x);
  }
  return MF_OK;
}

static mf_status alloc_all(const mf_schedule *s, scratch *w, mf_sim_result *r) {
  const mf_program *p = s->prog;
  const size_t ni = (size_t)s->n_instr + 1;
  r->stream = (uint8_t *)malloc(ni);
  r->cost = (double *)malloc(ni * sizeof(double));
  r->start = (double *)malloc(ni * sizeof(double));
  r->end = (double *)malloc(ni * sizeof(double));
  r->live_bytes = (size_t *)malloc(ni * sizeof(size_t));
  w->op_cost = (double *)malloc(((size_t)p->n_ops + 1) * sizeof(double));
  w->end = (double *)malloc(ni * sizeof(double));
  w->delta = (int64_t *)calloc(ni + 1, sizeof(int64_t));
  w->gate = (double *)malloc(ni * sizeof(double));
  w->seen = (uint8_t *)calloc((size_t)p->params->n + 1, 1);
  if (!r->stream || !r->cost || !r->start || !r->end || !r->live_bytes || !w->op_cost || !w->end ||
      !w->delta || !w->gate || !w->seen)
    return MF_ERR(MF_ERR_OUT_OF_MEMORY, "simulate: out of memory");
  return MF_OK;
}

/* expert_share: the chance each expert weight's or gradient's copies happen.
 * The executor skips the copies of an expert that no token of the
 * micro-batches its slot serves was routed to, once their routing is known
 * (src/exec/exec.h): for a weight, when every one of those micro-batches'
 * dispatch runs before the upload; for a gradient, always (the backward comes
 * after). A token picks expert e with chance q = min(1, K share_e); with T
 * tokens a micro-batch over n micro-batches, use = 1 - (1 - q)^(T n). */
static mf_status expert_use(const mf_schedule *s, const mf_sim_opts *o, scratch *w) {
  const mf_program *p = s->prog;
  const int64_t L = p->spec.layers, E = p->spec.experts, G = p->G > 0 ? p->G : 1;
  if (!o->expert_share || E <= 0 || L <= 0) return MF_OK;
  const int32_t ns = s->n_slots;
  int32_t *lo = (int32_t *)malloc(((size_t)ns + 1) * sizeof(int32_t));
  int32_t *hi = (int32_t *)malloc(((size_t)ns + 1) * sizeof(int32_t));
  int32_t *disp = (int32_t *)malloc((size_t)(G * L) * sizeof(int32_t));
  w->use = (float *)malloc(((size_t)ns + 1) * sizeof(float));
  if (!lo || !hi || !disp || !w->use) {
    free(lo);
    free(hi);
    free(disp);
    return MF_ERR(MF_ERR_OUT_OF_MEMORY, "simulate: out of memory");
  }
  for (int32_t x = 0; x < ns; x++) w->use[x] = 1.0f;
  mf_schedule_expert_micros(s, lo, hi);
  /* Where each micro-batch's routing of each layer is first known: its dispatch. */
  for (int64_t i = 0; i < G * L; i++) disp[i] = INT32_MAX;
  for (int32_t i = 0; i < s->n_instr; i++) {
    const mf_instr *in = &s->instr[i];
    if (in->kind != MF_I_RUN) continue;
    const mf_pop *op = &p->ops[in->op];
    if (op->kind == MF_K_MOE_DISPATCH && op->micro >= 0 && op->layer >= 0 &&
        disp[op->micro * L + op->layer] == INT32_MAX)
      disp[op->micro * L + op->layer] = i;
  }
  const double T = (double)(p->B * p->S);
  for (int32_t x = 0; x < ns; x++) {
    const mf_ptensor *t = &p->tensors[s->slots[x].tensor];
    if (lo[x] < 0 || t->param < 0 || (t->kind != MF_T_PARAM && t->kind != MF_T_GRAD)) continue;
    const mf_param *pr = &p->params->params[t->param];
    if (pr->expert < 0 || pr->layer < 0) continue;
    int known = 1;
    for (int32_t m = lo[x]; m <= hi[x] && known; m++)
      if (t->kind == MF_T_PARAM && disp[m * L + pr->layer] >= s->slots[x].first) known = 0;
    if (!known) continue;
    w->use[x] = (float)mf_experts_use_chance(o->expert_share[pr->layer * E + pr->expert], p->spec.top_k,
                                             T * (double)(hi[x] - lo[x] + 1));
  }
  free(lo);
  free(hi);
  free(disp);
  return MF_OK;
}

/* Per-op costs and the live-bytes curve. */
static mf_status prepare(const mf_schedule *s, const mf_hwprofile *hw, scratch *w, mf_sim_result *r) {
  const mf_program *p = s->prog;
  for (int32_t k = 0; k < p->n_ops; k++) w->op_cost[k] = mf_sim_op_seconds(p, k, hw);
  for (int32_t x = 0; x < s->n_slots; x++) {
    const mf_slot *sl = &s->slots[x];
    if (sl->first < 0) continue;
    const int64_t bytes = (int64_t)p->tensors[sl->tensor].bytes;
    w->delta[sl->first] += bytes;
    w->delta[sl->last + 1] -= bytes;
  }
  int64_t live = 0;
  r->peak_live_bytes = 0;
  r->peak_instr = 0;
  for (int32_t i = 0; i < s->n_instr; i++) {
    live += w->delta[i];
    r->live_bytes[i] = (size_t)live;
    if ((size_t)live > r->peak_live_bytes) {
      r->peak_live_bytes = (size_t)live;
      r->peak_instr = i;
    }
  }
  return MF_OK;
}

/* Whether parameter i's optimizer is on the device (the schedule runs its
 * AdamW; the host does not update it). */
static int on_device(const mf_schedule *s, int32_t i) {
  return s->optim_device && s->optim_device[i];
}

/* overlap_optimizer, in the steady state of train.overlap_optimizer: the
 * previous step's host updates run on the host from t = 0, one parameter
 * after another in the order the step first uploads them (those it never
 * uploads last), each costing mf_hw_adamw_seconds of its size; the first H2D
 * of each parameter waits for its update (w->gate). Parameters whose
 * optimizer is on the device are not updated by the host (and their weights
 * are never uploaded per step), and frozen ones (LoRA's base) have none.
 * Returns the updates' total. */
static double set_gates(const mf_schedule *s, const mf_hwprofile *hw, double scale, scratch *w) {
  const mf_program *p = s->prog;
  const int32_t np = (int32_t)p->params->n;
  double t = 0;
  memset(w->seen, 0, (size_t)np + 1);
  for (int32_t i = 0; i < s->n_instr; i++) {
    const mf_instr *in = &s->instr[i];
    w->gate[i] = -1.0;
    if (in->kind != MF_I_H2D) continue;
    const mf_ptensor *x = &p->tensors[s->slots[in->slot].tensor];
    if (x->kind != MF_T_PARAM || x->param < 0 || x->param >= np || w->seen[x->param] ||
        on_device(s, x->param) || p->params->params[x->param].frozen)
      continue;
    w->seen[x->param] = 1;
    t += scale * mf_hw_adamw_seconds(hw, (double)p->params->params[x->param].numel);
    w->gate[i] = t;
  }
  for (int32_t k = 0; k < np; k++)
    if (!w->seen[k] && !on_device(s, k) && !p->params->params[k].frozen)
      t += scale * mf_hw_adamw_seconds(hw, (double)p->params->params[k].numel);
  return t;
}

/* Each instruction's stream and cost (r->stream, r->cost), the streams' busy
 * time and the bytes moved; a cost the profile cannot give is an error. */
static mf_status price(const mf_schedule *s, const mf_hwprofile *hw, const scratch *w, mf_sim_result *r) {
  const mf_program *p = s->prog;
  for (int32_t i = 0; i < s->n_instr; i++) {
    const mf_instr *in = &s->instr[i];
    const int stream = mf_schedule_stream(in->kind);
    const double cost = instr_cost(s, hw, w, i);
    if (!(cost >= 0) || isinf(cost))
      return MF_ERR(
          MF_ERR_INVALID_ARG,
          "simulate: profile \"%s\" cannot price instruction %d (%s): %g s (it lacks gemm or attention "
          "points, or a bandwidth)",
          hw->name, i,
          in->kind == MF_I_RUN ? p->ops[in->op].label : mf_sim_stream_name((mf_sim_stream)stream), cost);
    r->stream[i] = (uint8_t)stream;
    r->cost[i] = cost;
    r->busy[stream] += cost;
    if (in->kind == MF_I_H2D && !in->persist) r->h2d_bytes += p->tensors[s->slots[in->slot].tensor].bytes;
    if (in->kind == MF_I_D2H) r->d2h_bytes += p->tensors[s->slots[in->slot].tensor].bytes;
  }
  return MF_OK;
}

/* One pass of the streams over the instructions: each starts when its stream
 * is free and the instructions it waits for (mf_schedule_waits; NULL on a
 * serial profile, where everything is one timeline) have ended, and not
 * before the barrier (when the last instruction before s->optim_begin ends)
 * if it is in the optimizer part, nor before gate[i] (when gate is not NULL).
 * Writes each start (when `start` is not NULL) and end; *makespan gets when
 * the last one ends, *barrier (when not NULL) the barrier, *delayed (when not
 * NULL) whether some gate held an instruction back. */
static void run_streams(const mf_schedule *s, const int32_t *waits, const mf_sim_result *r,
                        const double *gate, double *start, double *end, double *makespan_out,
                        double *barrier_out, int *delayed) {
  if (delayed) *delayed = 0;
  double free_at[MF_SIM_STREAMS] = {0, 0, 0}, t = 0, makespan = 0, barrier = 0;
  for (int32_t i = 0; i < s->n_instr; i++) {
    /* The optimizer part runs once the host has the global norm: after
     * everything before it (serial: already so). */
    if (i == s->optim_begin) barrier = waits ? makespan : t;
    const int stream = r->stream[i];
    double ready = t;
    if (waits) {
      ready = free_at[stream];
      for (int q = 0; q < MF_SIM_STREAMS; q++) {
        const int32_t j = waits[3 * (size_t)i + (size_t)q];
        if (j >= 0 && end[j] > ready) ready = end[j];
      }
    }
    if (i >= s->optim_begin && barrier > ready) ready = barrier;
    if (gate && gate[i] > ready) {
      ready = gate[i];
      if (delayed) *delayed = 1;
    }
    const double e = ready + r->cost[i];
    t = e;
    free_at[stream] = e;
    if (e > makespan) makespan = e;
    if (start) start[i] = ready;
    end[i] = e;
  }
  *makespan_out = waits ? makespan : t;
  if (s->optim_begin >= s->n_instr) barrier = *makespan_out;
  if (barrier_out) *barrier_out = barrier;
}

mf_status mf_simulate(const mf_schedule *s, const mf_hwprofile *hw, const mf_sim_opts *o,
                      mf_sim_result *out) {
  if (!out) return MF_ERR(MF_ERR_INVALID_ARG, "simulate: no result to fill");
  memset(out, 0, sizeof *out);
  if (!s || !hw || !s->prog)
    return MF_ERR(MF_ERR_INVALID_ARG, "simulate: no schedule or no hardware profile");
  const mf_sim_opts defaults = {0};
  if (!o) o = &defaults;
  MF_CHECK(validate(s));
  const mf_program *p = s->prog;
  scratch w;
  memset(&w, 0, sizeof w);
  mf_sim_result r;
  memset(&r, 0, sizeof r);
  r.n_instr = s->n_instr;
  mf_status st = alloc_all(s, &w, &r);
  if (st == MF_OK) st = prepare(s, hw, &w, &r);
  if (st == MF_OK) st = expert_use(s, o, &w);
  /* The host optimizer, over the parameters whose optimizer is not on the
   * device: after the step part (the whole of it exposed, beside the device's
   * optimizer part), or overlapped (set_gates). Exposed then = how much later
   * the streams end with the uploads waiting for their updates than without,
   * plus the part of the updates the streams are too short to hold (a step's
   * updates must be done before the next step's begin). */
  const int has_opt = !p->forward_only && p->params->n > 0;
  const int overlap = has_opt && o->overlap_optimizer;
  int64_t host_numel = 0;
  for (int32_t i = 0; has_opt && i < (int32_t)p->params->n; i++)
    if (!on_device(s, i) && !p->params->params[i].frozen) host_numel += p->params->params[i].numel;
  /* A floor on the updates' total (optimizer state streaming from NVMe, an
   * estimate for every parameter) slows every host update alike. */
  const double all = has_opt ? mf_hw_adamw_seconds(hw, (double)p->params->trainable_numel) : 0.0;
  double scale = o->optimizer_floor_seconds > all && all > 0 ? o->optimizer_floor_seconds / all : 1.0;
  double updates = host_numel > 0 ? scale * mf_hw_adamw_seconds(hw, (double)host_numel) : 0.0;
  /* Overlapped, the step's staged host copies share the host's memory with the updates. */
  if (overlap && o->host_copy_seconds > 0 && updates > 0 && isfinite(updates)) {
    scale *= (updates + o->host_copy_seconds) / updates;
    updates += o->host_copy_seconds;
  }
  if (st == MF_OK && overlap) updates = set_gates(s, hw, scale, &w);
  if (st == MF_OK && (!(updates >= 0) || isinf(updates)))
    st = MF_ERR(MF_ERR_INVALID_ARG,
                "simulate: profile \"%s\" cannot price the host optimizer (adamw_params_per_s)", hw->name);
  int delayed = 0;
  double ungated = 0, barrier = 0;
  if (st == MF_OK) st = price(s, hw, &w, &r);
  /* The order between the streams, once per schedule (a serial profile's
   * one timeline needs none). */
  const int32_t *waits = NULL;
  if (st == MF_OK && hw->copies_overlap_compute) st = mf_schedule_waits(s, &waits);
  if (st == MF_OK) {
    run_streams(s, waits, &r, overlap ? w.gate : NULL, r.start, r.end, &r.streams_seconds, &barrier,
                &delayed);
    ungated = r.streams_seconds;
    if (delayed) run_streams(s, waits, &r, NULL, NULL, w.end, &ungated, NULL, NULL);
  }
  if (st != MF_OK) {
    scratch_free(&w);
    mf_sim_result_free(&r);
    return st;
  }
  r.compute_seconds = r.busy[MF_SIM_COMPUTE];
  r.exposed_transfer_seconds = ungated - r.compute_seconds;
  if (r.exposed_transfer_seconds < 0) r.exposed_transfer_seconds = 0;
  r.optimizer_seconds = updates;
  for (int32_t i = 0; i < s->n_instr; i++)
    if (s->instr[i].kind == MF_I_RUN &&
        (p->ops[s->instr[i].op].phase == MF_PHASE_NORM || p->ops[s->instr[i].op].phase == MF_PHASE_OPTIM))
      r.device_optimizer_seconds += r.cost[i];
  r.optimizer_barrier = barrier;
  if (!has_opt) {
    r.optimizer_start = r.streams_seconds;
    r.step_seconds = r.streams_seconds;
  } else if (overlap) {
    r.optimizer_start = 0;
    r.step_seconds = r.streams_seconds > updates ? r.streams_seconds : updates;
  } else if (!hw->copies_overlap_compute) {
    /* One timeline: the host updates after every instruction. */
    r.optimizer_start = r.streams_seconds;
    r.step_seconds = r.streams_seconds + updates;
  } else {
    /* From the barrier, beside the device's optimizer part. */
    r.optimizer_start = barrier;
    r.step_seconds = barrier + updates > r.streams_seconds ? barrier + updates : r.streams_seconds;
  }
  r.exposed_optimizer_seconds = r.step_seconds - ungated;
  if (r.exposed_optimizer_seconds < 0) r.exposed_optimizer_seconds = 0;
  for (int k = 0; k < MF_SIM_STREAMS; k++) r.idle[k] = r.step_seconds - r.busy[k];
  scratch_free(&w);
  *out = r;
  return MF_OK;
}
