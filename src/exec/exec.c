/* Runs a step program under a schedule on a backend (see exec.h). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "src/exec/exec.h"
#include "src/exec/exec_internal.h"

#include "experts/experts.h"

static int cmp_first(const void *a, const void *b, void *arg) {
  const mf_schedule *s = (const mf_schedule *)arg;
  int32_t x = s->slots[*(const int32_t *)a].first, y = s->slots[*(const int32_t *)b].first;
  return x != y ? (x < y ? -1 : 1) : *(const int32_t *)a - *(const int32_t *)b;
}
static int cmp_last(const void *a, const void *b, void *arg) {
  const mf_schedule *s = (const mf_schedule *)arg;
  int32_t x = s->slots[*(const int32_t *)a].last, y = s->slots[*(const int32_t *)b].last;
  return x != y ? (x < y ? -1 : 1) : *(const int32_t *)a - *(const int32_t *)b;
}

mf_status mf_exec_create(mf_program *p, mf_backend *b, mf_exec **out) {
  *out = NULL;
  mf_decisions *d = NULL;
  mf_schedule *s = NULL;
  MF_CHECK(mf_decisions_create(p, &d));
  mf_status st = mf_schedule_build(p, d, &s);
  if (st == MF_OK) st = mf_exec_create_scheduled(p, s, b, out);
  if (st != MF_OK) {
    mf_schedule_free(s);
    mf_decisions_free(d);
    return st;
  }
  (*out)->owned = s;
  (*out)->owned_dec = d;
  return MF_OK;
}

/* grad_final (after which instruction each gradient is complete at home) and
 * upload_order (parameters by their first upload). */
static mf_status param_order(mf_exec *x) {
  const mf_program *p = x->p;
  const mf_schedule *s = x->s;
  const int32_t np = (int32_t)p->params->n;
  int32_t *last = NULL;
  uint8_t *seen = NULL;
  mf_status st = MF_OK;
  MF_CHECK_GOTO(mf_malloc((size_t)(np ? np : 1) * sizeof(int32_t), "executor parameter marks", (void **)&last), st,
                done);
  MF_CHECK_GOTO(mf_calloc((size_t)(np ? np : 1), 1, "executor parameter marks", (void **)&seen), st, done);
  for (int32_t i = 0; i < np; i++) last[i] = -1;
  int32_t n = 0;
  for (int32_t i = 0; i < s->n_instr; i++) {
    const mf_instr *in = &s->instr[i];
    x->grad_final[i] = -1;
    if (in->kind != MF_I_H2D && in->kind != MF_I_D2H) continue;
    const mf_ptensor *t = &p->tensors[s->slots[in->slot].tensor];
    if (t->param < 0 || t->param >= np) continue;
    if (in->kind == MF_I_H2D && t->kind == MF_T_PARAM && !seen[t->param]) {
      seen[t->param] = 1;
      x->upload_order[n++] = t->param;
    }
    if (in->kind == MF_I_D2H && t->kind == MF_T_GRAD) last[t->param] = i;
  }
  for (int32_t i = 0; i < np; i++) {
    if (!seen[i]) x->upload_order[n++] = i;
    if (last[i] >= 0) x->grad_final[last[i]] = i;
  }
done:
  free(last);
  free(seen);
  return st;
}

/* The op whose routed counts the executor reads (its operand `*counts`):
 * a layer's dispatch or, with expert parallelism, its forward exchange (the
 * rows this rank's experts received). */
static int route_op(const mf_program *p, const mf_pop *o, int *counts) {
  if (o->micro < 0) return 0;
  if (p->exchanges) {
    *counts = 5;
    return o->kind == MF_K_EP_DISPATCH && o->t[5] >= 0;
  }
  *counts = 1;
  return o->kind == MF_K_MOE_DISPATCH;
}

/* Whether micro-batch m's routing of layer l has landed at home, without
 * waiting: the copy of its counts was issued this step and its event is done. */
static int route_known(mf_exec *x, int64_t ml) {
  if (x->route_state[ml] != 1) return x->route_state[ml] == 2;
  int done = 0;
  if (!x->b->event_query || x->b->event_query(x->b, x->route_ev[ml], &done) != MF_OK || !done) return 0;
  x->route_state[ml] = 2;
  return 1;
}

/* 1 when slot (an expert's weight or gradient) serves only micro-batches whose
 * routing is known and sends that expert no token: its weights are not read
 * (an expert with no rows) and its gradient is all zeros. */
static int expert_idle(mf_exec *x, int32_t slot) {
  const mf_program *p = x->p;
  const mf_ptensor *t = &p->tensors[x->s->slots[slot].tensor];
  if ((t->kind != MF_T_PARAM && t->kind != MF_T_GRAD) || t->param < 0 || x->slot_mlo[slot] < 0) return 0;
  const mf_param *pr = &p->params->params[t->param];
  if (pr->expert < 0 || pr->layer < 0) return 0;
  const int64_t L = p->spec.layers;
  for (int32_t m = x->slot_mlo[slot]; m <= x->slot_mhi[slot]; m++)
    if (!route_known(x, m * L + pr->layer)) return 0;
  return mf_experts_idle(x->route_host, L, p->spec.experts, pr->layer, pr->expert, x->slot_mlo[slot],
                         x->slot_mhi[slot]);
}

/* 1 when a DEQUANT op turns the weights of an expert to which its
 * micro-batch, whose routing is known, sends no token: the expert op that
 * reads them skips that expert (and its upload was skipped too). */
static int dequant_idle(mf_exec *x, const mf_pop *o) {
  const mf_program *p = x->p;
  const mf_ptensor *t = &p->tensors[o->t[0]];
  if (t->param < 0 || o->micro < 0) return 0;
  const mf_param *pr = &p->params->params[t->param];
  if (pr->expert < 0 || pr->layer < 0) return 0;
  const int64_t L = p->spec.layers;
  if (!route_known(x, o->micro * L + pr->layer)) return 0;
  return mf_experts_idle(x->route_host, L, p->spec.experts, pr->layer, pr->expert, o->micro, o->micro);
}

static mf_status sync_all(mf_exec *x) {
  for (int k = 0; k < MF_EXEC_STREAMS; k++) MF_CHECK(x->b->stream_sync(x->b, x->st[k]));
  return x->sg ? mf_exec_sg_sync(x) : MF_OK;
}

/* The schedule's stream numbers are the executor's. */
_Static_assert((int)MF_EXEC_COMPUTE == MF_SCHED_COMPUTE && (int)MF_EXEC_H2D == MF_SCHED_H2D &&
                   (int)MF_EXEC_D2H == MF_SCHED_D2H && (int)MF_EXEC_STREAMS == MF_SCHED_STREAMS,
               "stream numbers");

/* The order between the streams is the schedule's (mf_schedule_waits):
 * events for the instructions something waits for, recorded after them. */
static mf_status order_events(mf_exec *x) {
  const mf_schedule *s = x->s;
  MF_CHECK(mf_schedule_waits(s, &x->wait_on));
  MF_CHECK(mf_calloc((size_t)(s->n_instr ? s->n_instr : 1), sizeof(mf_event *), "executor events",
                     (void **)&x->ev));
  for (size_t k = 0; k < 3 * (size_t)s->n_instr; k++) {
    const int32_t j = x->wait_on[k];
    if (j >= 0 && !x->ev[j]) MF_CHECK(x->b->event_create(x->b, &x->ev[j]));
  }
  return MF_OK;
}

/* inside: the executor whose arena this one uses (NULL: one of its own). */
static mf_status create(const mf_program *p, const mf_schedule *s, mf_backend *b, const mf_exec *inside,
                        int acts_pinned, mf_exec **out) {
  *out = NULL;
  if (s->prog != p) return MF_ERR(MF_ERR_INVALID_ARG, "executor: the schedule belongs to another program");
  mf_exec *x = (mf_exec *)calloc(1, sizeof *x);
  if (!x) return MF_ERR(MF_ERR_OUT_OF_MEMORY, "executor: out of memory");
  x->p = p;
  x->s = s;
  x->b = b;
  x->timed = b->event_create_timed && b->event_elapsed; /* exec.h, "timing" */
  x->host_prof = mf_log_enabled(MF_LOG_DEBUG, "exec");
  mf_status st = MF_OK;
  const int64_t E = p->spec.experts > 0 ? p->spec.experts : 1;
  size_t max_param = 1;
  for (int64_t i = 0; i < p->params->n; i++)
    if ((size_t)p->params->params[i].numel > max_param) max_param = (size_t)p->params->params[i].numel;
  x->expert_ptrs = (void **)calloc((size_t)E, sizeof(void *));
  x->starts = (int32_t *)malloc((size_t)(s->n_slots ? s->n_slots : 1) * sizeof(int32_t));
  x->ends = (int32_t *)malloc((size_t)(s->n_slots ? s->n_slots : 1) * sizeof(int32_t));
  x->expert_tokens = (int64_t *)calloc((size_t)(p->spec.layers * E), sizeof(int64_t));
  x->grad_scratch = (float *)malloc(max_param * sizeof(float));
  x->grad_final = (int32_t *)malloc((size_t)(s->n_instr ? s->n_instr : 1) * sizeof(int32_t));
  x->upload_order = (int32_t *)malloc((size_t)(p->params->n ? p->params->n : 1) * sizeof(int32_t));
  x->homes = (home_ctx *)calloc((size_t)(p->params->n ? p->params->n : 1), sizeof(home_ctx));
  x->n_valid = (int64_t *)calloc((size_t)(p->G > 0 ? p->G : 1), sizeof(int64_t));
  x->pos = (int32_t *)malloc((size_t)(p->B * p->S > 0 ? p->B * p->S : 1) * sizeof(int32_t));
  const size_t GL = (size_t)(p->G > 0 ? p->G : 1) * (size_t)(p->spec.layers > 0 ? p->spec.layers : 1);
  x->slot_mlo = (int32_t *)malloc((size_t)(s->n_slots ? s->n_slots : 1) * sizeof(int32_t));
  x->slot_mhi = (int32_t *)malloc((size_t)(s->n_slots ? s->n_slots : 1) * sizeof(int32_t));
  x->route_ev = (mf_event **)calloc(GL, sizeof(mf_event *));
  x->route_state = (uint8_t *)calloc(GL, 1);
  /* The loss scalars the host reads: a cross-entropy and an aux value per micro-batch at most. */
  for (int32_t i = 0; i < s->optim_begin; i++)
    if (s->instr[i].kind == MF_I_RUN && !s->instr[i].recompute) {
      const mf_pop *o = &p->ops[s->instr[i].op];
      x->max_reads += o->kind == MF_K_CROSS_ENTROPY || o->kind == MF_K_AUX_VALUE || o->kind == MF_K_ZERO;
    }
  x->read_kind = (uint8_t *)calloc((size_t)x->max_reads + 1, 1);
  if (!x->expert_ptrs || !x->starts || !x->ends || !x->expert_tokens || !x->grad_scratch || !x->grad_final ||
      !x->upload_order || !x->homes || !x->n_valid || !x->pos || !x->slot_mlo || !x->slot_mhi || !x->route_ev ||
      !x->route_state || !x->read_kind) {
    st = MF_ERR(MF_ERR_OUT_OF_MEMORY, "executor: out of memory");
    goto fail;
  }
  for (int64_t bq = 0; bq < p->B; bq++) /* positions: the same every step */
    for (int64_t q = 0; q < p->S; q++) x->pos[bq * p->S + q] = (int32_t)q;
  mf_schedule_expert_micros(s, x->slot_mlo, x->slot_mhi);
  MF_CHECK_GOTO(param_order(x), st, fail);
  for (int32_t i = 0; i < s->n_slots; i++) x->starts[i] = x->ends[i] = i;
  qsort_r(x->starts, (size_t)s->n_slots, sizeof(int32_t), cmp_first, (void *)s);
  qsort_r(x->ends, (size_t)s->n_slots, sizeof(int32_t), cmp_last, (void *)s);
  if (inside) {
    x->arena = inside->arena;
  } else {
    void *base = NULL;
    MF_CHECK_GOTO(b->arena_create(b, s->arena_bytes, &base), st, fail);
    x->arena = (uint8_t *)base;
  }
  if (s->host_act_bytes > 0 && acts_pinned) {
    void *h = NULL;
    MF_CHECK_GOTO(b->host_alloc(b, s->host_act_bytes, &h), st, fail);
    x->host_act = (uint8_t *)h;
    x->host_act_pinned = 1;
  } else if (s->host_act_bytes > 0) {
    MF_CHECK_GOTO(mf_malloc(s->host_act_bytes, "the offloaded activations' host copies", (void **)&x->host_act),
                  st, fail);
  }
  if (s->n_optim_device > 0) {
    void *h = NULL;
    MF_CHECK_GOTO(b->host_alloc(b, (size_t)(p->norm_chunks > 0 ? p->norm_chunks : 1) * sizeof(double), &h), st,
                  fail);
    x->norm_host = (double *)h;
  }
  {
    void *h = NULL; /* landing places of the small results the host reads (pinned on cuda) */
    MF_CHECK_GOTO(b->host_alloc(b, GL * (size_t)E * sizeof(int64_t), &h), st, fail);
    x->route_host = (int64_t *)h;
    MF_CHECK_GOTO(b->host_alloc(b, 2 * ((size_t)x->max_reads + 1) * sizeof(double), &h), st, fail);
    x->scalars = (double *)h;
  }
  for (int32_t i = 0; i < s->optim_begin; i++) { /* a dispatch's counts are read without a wait */
    int unused = 0;
    if (s->instr[i].kind == MF_I_RUN && !s->instr[i].recompute &&
        route_op(p, &p->ops[s->instr[i].op], &unused)) {
      const mf_pop *o = &p->ops[s->instr[i].op];
      const size_t ml = (size_t)o->micro * (size_t)p->spec.layers + (size_t)o->layer;
      if (ml < GL && !x->route_ev[ml]) MF_CHECK_GOTO(b->event_create(b, &x->route_ev[ml]), st, fail);
    }
  }
  for (int k = 0; k < MF_EXEC_STREAMS; k++) MF_CHECK_GOTO(b->stream_create(b, &x->st[k]), st, fail);
  MF_CHECK_GOTO(order_events(x), st, fail);
  if (x->timed) {
    const size_t n = (size_t)(s->n_instr ? s->n_instr : 1);
    MF_CHECK_GOTO(mf_calloc(n, sizeof(mf_event *), "executor timing events", (void **)&x->t0), st, fail);
    MF_CHECK_GOTO(mf_calloc(n, sizeof(mf_event *), "executor timing events", (void **)&x->t1), st, fail);
    for (int32_t i = 0; i < s->n_instr; i++) {
      MF_CHECK_GOTO(b->event_create_timed(b, &x->t0[i]), st, fail);
      MF_CHECK_GOTO(b->event_create_timed(b, &x->t1[i]), st, fail);
    }
  }
  *out = x;
  return MF_OK;
fail:
  mf_exec_free(x);
  return st;
}

mf_status mf_exec_create_scheduled(const mf_program *p, const mf_schedule *s, mf_backend *b, mf_exec **out) {
  return create(p, s, b, NULL, 1, out);
}

mf_status mf_exec_create_home(const mf_program *p, const mf_schedule *s, mf_backend *b, int acts_pinned,
                              mf_exec **out) {
  return create(p, s, b, NULL, acts_pinned, out);
}

mf_status mf_exec_create_inside(const mf_program *p, const mf_schedule *s, const mf_exec *host, mf_exec **out) {
  *out = NULL;
  if (s->arena_bytes > host->s->arena_bytes) {
    char a[32], b[32];
    return MF_ERR(MF_ERR_INTERNAL, "executor: an arena of %s inside one of %s",
                  mf_format_bytes(s->arena_bytes, a, sizeof a), mf_format_bytes(host->s->arena_bytes, b, sizeof b));
  }
  return create(p, s, host->b, host, 1, out);
}

void mf_exec_free_events(mf_backend *b, mf_event **ev, size_t n) {
  if (ev)
    for (size_t i = 0; i < n; i++)
      if (ev[i]) b->event_free(b, ev[i]);
  free(ev);
}

void mf_exec_free(mf_exec *x) {
  if (!x) return;
  mf_exec_sg_free(x);
  for (int k = 0; k < MF_EXEC_STREAMS; k++)
    if (x->st[k]) x->b->stream_free(x->b, x->st[k]);
  const size_t GL =
      (size_t)(x->p->G > 0 ? x->p->G : 1) * (size_t)(x->p->spec.layers > 0 ? x->p->spec.layers : 1);
  mf_exec_free_events(x->b, x->ev, (size_t)x->s->n_instr);
  mf_exec_free_events(x->b, x->t0, (size_t)x->s->n_instr);
  mf_exec_free_events(x->b, x->t1, (size_t)x->s->n_instr);
  mf_exec_free_events(x->b, x->route_ev, GL);
  if (x->route_host) x->b->host_free(x->b, x->route_host);
  if (x->scalars) x->b->host_free(x->b, x->scalars);
  free(x->route_state);
  free(x->read_kind);
  if (x->host_act && x->host_act_pinned)
    x->b->host_free(x->b, x->host_act);
  else
    free(x->host_act);
  if (x->norm_host) x->b->host_free(x->b, x->norm_host);
  free(x->expert_ptrs);
  free(x->starts);
  free(x->ends);
  free(x->expert_tokens);
  free(x->grad_scratch);
  free(x->instr_s);
  free(x->grad_final);
  free(x->homes);
  free(x->upload_order);
  free(x->n_valid);
  free(x->pos);
  free(x->slot_mlo);
  free(x->slot_mhi);
  mf_schedule_free(x->owned);
  mf_decisions_free(x->owned_dec);
  free(x);
}

size_t mf_exec_arena_bytes(const mf_exec *x) { return x->s->arena_bytes; }
size_t mf_exec_peak_live_bytes(const mf_exec *x) { return x->peak_live; }
const int64_t *mf_exec_expert_tokens(const mf_exec *x) { return x->expert_tokens; }
void mf_exec_capture_final_hidden(mf_exec *x, float *out) { x->capture = out; }
void mf_exec_traffic(const mf_exec *x, uint64_t *h2d, uint64_t *d2h) {
  *h2d = x->h2d;
  *d2h = x->d2h;
}

void mf_exec_stats_get(const mf_exec *x, mf_exec_stats *out) { *out = x->stats; }

mf_status mf_exec_set_instr_timing(mf_exec *x, int on) {
  if (!on) {
    free(x->instr_s);
    x->instr_s = NULL;
    return MF_OK;
  }
  if (x->instr_s || !x->timed) return MF_OK;
  x->instr_s = (double *)calloc((size_t)(x->s->n_instr > 0 ? x->s->n_instr : 1), sizeof(double));
  if (!x->instr_s) return MF_ERR(MF_ERR_OUT_OF_MEMORY, "executor: out of memory for per-instruction times");
  return MF_OK;
}

const double *mf_exec_instr_seconds(const mf_exec *x) { return x->instr_s; }

void mf_exec_set_param_hooks(mf_exec *x, const mf_exec_param_hooks *h) {
  if (h)
    x->hooks = *h;
  else
    memset(&x->hooks, 0, sizeof x->hooks);
}

void mf_exec_set_grads_add(mf_exec *x, int add) {
  x->grads_add = add != 0;
}

void mf_exec_set_grads_own(mf_exec *x, const uint8_t *own) {
  x->grads_own = own;
}

void mf_exec_set_exchange(mf_exec *x, const mf_exec_exchange *e) {
  if (e)
    x->exchange = *e;
  else
    memset(&x->exchange, 0, sizeof x->exchange);
}

const int32_t *mf_exec_param_upload_order(const mf_exec *x) { return x->upload_order; }

/* The hand-off's wait before an instruction touching a parameter's host copies. */
mf_status mf_exec_param_gate(mf_exec *x, const mf_instr *in, int grad_wait) {
  if (in->kind != MF_I_H2D && in->kind != MF_I_D2H) return MF_OK;
  const mf_ptensor *t = &x->p->tensors[x->s->slots[in->slot].tensor];
  const int grad = in->kind == MF_I_D2H && t->kind == MF_T_GRAD;
  const int seed = in->kind == MF_I_H2D && t->kind == MF_T_GRAD; /* the sum this rank adds to (grad_seed) */
  if ((in->kind == MF_I_H2D && t->kind == MF_T_PARAM) || grad || seed)
    if (x->hooks.wait) MF_CHECK(x->hooks.wait(x->hooks.ctx, t->param));
  /* A seed reads the sum once the ranks before have added theirs, wherever its copy is submitted. */
  if (((grad && grad_wait) || seed) && x->hooks.grad_wait)
    MF_CHECK(x->hooks.grad_wait(x->hooks.ctx, t->param));
  return MF_OK;
}

static mf_status d2h(mf_exec *x, int32_t slot, void *dst) {
  return x->b->copy(x->b, dst, mf_exec_slot_ptr(x, slot), mf_exec_slot_bytes(x, slot), MF_COPY_D2H,
                    x->st[MF_EXEC_D2H]);
}

/* Copies a small result (a loss scalar, expert counts) out of a slot on the
 * compute stream, after the kernel that wrote it, into host_alloc'd memory the
 * host reads once the step is synced (or once an event says it landed): no
 * wait inside the step. */
static mf_status copy_small(mf_exec *x, int32_t slot, void *dst) {
  return x->b->copy(x->b, dst, mf_exec_slot_ptr(x, slot), mf_exec_slot_bytes(x, slot), MF_COPY_D2H,
                    x->st[MF_EXEC_COMPUTE]);
}

static void src_add(mf_exec_src *src, const void *p, size_t bytes) {
  src->part[src->n] = p;
  src->bytes[src->n++] = bytes;
}

void mf_exec_src_copy(const mf_exec_src *src, uint8_t *dst, size_t a, size_t e) {
  size_t at = 0;
  for (int k = 0; k < src->n && at < e; k++) {
    const size_t lo = a > at ? a : at, hi = e < at + src->bytes[k] ? e : at + src->bytes[k];
    if (lo < hi) memcpy(dst + lo, (const uint8_t *)src->part[k] + (lo - at), hi - lo);
    at += src->bytes[k];
  }
}

/* AdamW state from the host: with BF16 storage the fp32 master (the last
 * step's params) first, then m and v. */
static mf_status state_source(mf_exec *x, const mf_ptensor *pt, mf_exec_src *src) {
  const mf_program *p = x->p;
  const mf_param *q = &p->params->params[pt->param];
  if (!x->m_host || !x->v_host)
    return MF_ERR(MF_ERR_INTERNAL, "executor: the optimizer on the device has no host moments "
                                   "(mf_exec_set_optim_state)");
  const size_t ms = mf_dtype_size(p->moments), off = (size_t)q->toff * ms, n = (size_t)q->numel * ms;
  if (p->storage == MF_DTYPE_BF16) {
    if (!x->params_host)
      return MF_ERR(MF_ERR_INTERNAL, "executor: the optimizer on the device needs the master weights of a step");
    src_add(src, x->params_host + q->offset, (size_t)q->numel * sizeof(float));
  }
  src_add(src, (const uint8_t *)x->m_host + off, n);
  src_add(src, (const uint8_t *)x->v_host + off, n);
  return MF_OK;
}

/* A parameter's weights as the device stores them: the fp32 master itself,
 * or with BF16 storage its bf16 working copy. */
static mf_status weight_source(mf_exec *x, const mf_ptensor *pt, const step_io *io, mf_exec_src *src) {
  const mf_program *p = x->p;
  const mf_param *q = &p->params->params[pt->param];
  const int64_t off = q->offset;
  if (q->quant) { /* LoRA's base stored quantized: its blob in the table's quantized home */
    if (!p->params->qhome)
      return MF_ERR(MF_ERR_INTERNAL, "executor: %s is quantized and the table has no quantized home", q->name);
    src_add(src, p->params->qhome + q->qoff, pt->bytes);
    return MF_OK;
  }
  if (p->storage != MF_DTYPE_BF16) {
    src_add(src, io->params + off, pt->bytes);
    return MF_OK;
  }
  if (!x->working)
    return MF_ERR(MF_ERR_INTERNAL, "executor: BF16 storage without the host's bf16 working copy "
                                   "(mf_exec_set_working_copy)");
  src_add(src, x->working + off, pt->bytes);
  return MF_OK;
}

mf_status mf_exec_h2d_source(mf_exec *x, int32_t slot, const step_io *io, mf_exec_src *src) {
  const mf_program *p = x->p;
  const int32_t t = x->s->slots[slot].tensor;
  const mf_ptensor *pt = &p->tensors[t];
  memset(src, 0, sizeof *src);
  if (pt->kind == MF_T_OPT) {
    if (x->state_current) return MF_OK; /* the device's state is current */
    return state_source(x, pt, src);
  }
  if (pt->kind == MF_T_PARAM && x->s->slots[slot].persist) {
    if (x->weights_current) return MF_OK; /* the device's copy is the truth */
    MF_CHECK(weight_source(x, pt, io, src));
  } else if (pt->kind == MF_T_PARAM) {
    if (expert_idle(x, slot)) { /* no token routed to it: its weights are not read */
      x->h2d_skipped += pt->bytes;
      return MF_OK;
    }
    MF_CHECK(weight_source(x, pt, io, src));
  } else if (pt->kind == MF_T_GRAD) { /* seeded: the host's sum it adds to (mf_program.grad_seed) */
    if (!io->grads)
      return MF_ERR(MF_ERR_INTERNAL, "executor: %s starts from the host's sum, and there is none", pt->name);
    if (expert_idle(x, slot)) { /* nothing added to it: the host's sum stays as it is (mf_exec_d2h_target) */
      x->h2d_skipped += pt->bytes;
      return MF_OK;
    }
    src_add(src, io->grads + p->params->params[pt->param].toff, pt->bytes);
  } else if (pt->kind == MF_T_INPUT) {
    if (t == p->io[0].positions)
      src_add(src, io->positions, pt->bytes);
    else if (pt->micro >= 0 && t == p->io[pt->micro].ids)
      src_add(src, io->ids[pt->micro], pt->bytes);
    else if (pt->micro >= 0 && t == p->io[pt->micro].targets)
      src_add(src, io->targets[pt->micro], pt->bytes);
  } else if (x->s->host_offset[t] != SIZE_MAX) {
    src_add(src, x->host_act + x->s->host_offset[t], pt->bytes);
  }
  if (src->n == 0 || !src->part[0]) return MF_ERR(MF_ERR_INTERNAL, "executor: no host source for %s", pt->name);
  x->h2d += pt->bytes; /* a persistent weight's first fill counts as the step's traffic */
  return MF_OK;
}

mf_status mf_exec_d2h_target(mf_exec *x, const mf_instr *in, const step_io *io, void **dst, d2h_mode *mode) {
  const mf_program *p = x->p;
  const int32_t t = x->s->slots[in->slot].tensor;
  const mf_ptensor *pt = &p->tensors[t];
  *dst = NULL;
  *mode = D2H_NONE;
  if (t == p->norm_sums) {
    *dst = x->norm_host;
  } else if (pt->kind == MF_T_GRAD) {
    if (!io->grads) return MF_OK;
    *dst = io->grads + p->params->params[pt->param].toff;
    /* A seeded gradient holds the sum the host had, and its own share: it is the new sum. */
    const int seeded = p->grad_seed && p->grad_seed[pt->param];
    const int add = x->grads_add && !(x->grads_own && x->grads_own[pt->param]) && !seeded;
    if (expert_idle(x, in->slot)) { /* an expert no token reached: its gradient is zeros */
      x->d2h_skipped += pt->bytes;
      if (!in->accumulate && !add && !seeded) *mode = D2H_ZERO; /* seeded: the host's sum is the step's */
      return MF_OK;
    }
    if (in->accumulate || add) *mode = D2H_ADD;
  } else if (x->s->host_offset[t] != SIZE_MAX) {
    *dst = x->host_act + x->s->host_offset[t];
  } else {
    return MF_ERR(MF_ERR_INTERNAL, "executor: no host copy for %s", pt->name);
  }
  if (*mode == D2H_NONE) *mode = D2H_COPY;
  x->d2h += pt->bytes;
  return MF_OK;
}

/* An H2D straight from host memory (no staging arena). */
static mf_status do_h2d(mf_exec *x, int32_t slot, const step_io *io) {
  mf_exec_src src;
  MF_CHECK(mf_exec_h2d_source(x, slot, io, &src));
  uint8_t *dst = mf_exec_slot_ptr(x, slot);
  for (int k = 0; k < src.n; k++) {
    MF_CHECK(x->b->copy(x->b, dst, src.part[k], src.bytes[k], MF_COPY_H2D, x->st[MF_EXEC_H2D]));
    dst += src.bytes[k];
  }
  return MF_OK;
}

/* A D2H straight into host memory (no staging arena): a gradient added into
 * the host's sum goes through the scratch buffer, which the host reads. */
static mf_status do_d2h(mf_exec *x, const mf_instr *in, const step_io *io) {
  void *dst = NULL;
  d2h_mode mode = D2H_NONE;
  MF_CHECK(mf_exec_d2h_target(x, in, io, &dst, &mode));
  const mf_ptensor *pt = &x->p->tensors[x->s->slots[in->slot].tensor];
  switch (mode) {
    case D2H_NONE:
      return MF_OK;
    case D2H_ZERO:
      memset(dst, 0, pt->bytes);
      return MF_OK;
    case D2H_COPY:
      return d2h(x, in->slot, dst);
    case D2H_ADD: {
      MF_CHECK(d2h(x, in->slot, x->grad_scratch));
      MF_CHECK(x->b->stream_sync(x->b, x->st[MF_EXEC_D2H]));
      float *g = (float *)dst;
      for (int64_t i = 0; i < pt->numel; i++) g[i] += x->grad_scratch[i];
      return MF_OK;
    }
  }
  return MF_OK;
}

static mf_status mark(mf_exec *x, int32_t slot, int live) {
  if (!x->b->mark) return MF_OK;
  return x->b->mark(x->b, mf_exec_slot_ptr(x, slot), mf_exec_slot_bytes(x, slot), live);
}

/* After a RUN: send home the losses and routing counts the host needs, read
 * after the step (mf_exec_step) or, for the counts, once they landed. */
static mf_status after_run(mf_exec *x, const mf_instr *in, const mf_kernel_call *call) {
  const mf_program *p = x->p;
  const mf_pop *o = &p->ops[in->op];
  if (in->recompute || o->micro < 0) return MF_OK;
  const int32_t *ops = x->s->slot_pool + in->operands;
  const mf_program_io *io = &p->io[o->micro];
  int counts = 0;
  if (route_op(p, o, &counts)) {
    const int64_t ml = (int64_t)o->micro * p->spec.layers + o->layer;
    MF_CHECK(copy_small(x, ops[counts], x->route_host + ml * p->spec.experts));
    MF_CHECK(x->b->event_record(x->b, x->route_ev[ml], x->st[MF_EXEC_COMPUTE]));
    x->route_state[ml] = 1;
  }
  const int aux = (o->kind == MF_K_AUX_VALUE && o->t[2] == io->aux_scalars) ||
                  (o->kind == MF_K_ZERO && o->t[0] == io->aux_scalars);
  if (aux || o->kind == MF_K_CROSS_ENTROPY) {
    if (x->n_reads >= x->max_reads) return MF_ERR(MF_ERR_INTERNAL, "executor: more loss reads than counted");
    const int32_t sl = ops[o->kind == MF_K_CROSS_ENTROPY ? 5 : o->kind == MF_K_AUX_VALUE ? 2 : 0];
    if (mf_exec_slot_bytes(x, sl) > 2 * sizeof(double))
      return MF_ERR(MF_ERR_INTERNAL, "executor: a loss scalar slot of %zu bytes", mf_exec_slot_bytes(x, sl));
    x->read_kind[x->n_reads] = aux ? READ_AUX : READ_CE;
    MF_CHECK(copy_small(x, sl, x->scalars + 2 * (size_t)x->n_reads));
    x->n_reads++;
  }
  if (o->kind == MF_K_CROSS_ENTROPY && o->micro == 0 && x->capture) {
    /* bf16 storage lands in the buffer's first half; widened after the step's sync */
    const mf_ptensor *h = &p->tensors[o->t[0]];
    MF_CHECK(x->b->copy(x->b, x->capture, call->b[0].ptr, h->bytes, MF_COPY_D2H, x->st[MF_EXEC_COMPUTE]));
    x->captured = h->dtype == MF_DTYPE_BF16 ? h->numel : 0;
  }
  return MF_OK;
}

static void home_fn(void *ctx) {
  const home_ctx *h = (const home_ctx *)ctx;
  h->x->hooks.grad_home(h->x->hooks.ctx, h->param);
}

/* Parameter `param`'s gradient, copied straight home, handed to the hooks once
 * its copy has landed: by a host function behind it on the D2H stream, so
 * that the submission goes on (the hooks may be called from another thread:
 * exec.h); a backend without host functions syncs the stream first. */
static mf_status hand_home(mf_exec *x, int32_t param) {
  if (!x->b->host_fn) {
    MF_CHECK(x->b->stream_sync(x->b, x->st[MF_EXEC_D2H]));
    x->hooks.grad_home(x->hooks.ctx, param);
    return MF_OK;
  }
  home_ctx *h = &x->homes[param];
  h->x = x;
  h->param = param;
  return x->b->host_fn(x->b, x->st[MF_EXEC_D2H], home_fn, h);
}

/* Runs instructions [from, to) of the schedule: the step's part or the
 * optimizer's (opt: its hyper-parameters; NULL in the step's part). Slot
 * marks, live bytes and the peak carry over in x between the two. */
static mf_status run_range(mf_exec *x, int32_t from, int32_t to, const step_io *io, const mf_exec_optim *opt,
                           int64_t count[MF_EXEC_STREAMS]) {
  const mf_program *p = x->p;
  const mf_schedule *s = x->s;
  mf_status st = MF_OK;
  for (int32_t i = from; i < to; i++) {
    for (; x->ns < s->n_slots && s->slots[x->starts[x->ns]].first == i; x->ns++) {
      MF_CHECK_GOTO(mark(x, x->starts[x->ns], 1), st, done);
      x->live += mf_exec_slot_bytes(x, x->starts[x->ns]);
    }
    if (x->live > x->peak_live) x->peak_live = x->live;
    const double t_host = x->host_prof ? mf_time_now() : 0.0;
    const mf_instr *in = &s->instr[i];
    /* A copy the layout left out goes straight (from or into a pinned home). */
    const int staged = x->sg && (in->kind == MF_I_H2D || in->kind == MF_I_D2H) && x->sg->L->copy_of_instr[i] >= 0;
    /* Staged uploads pass the gate when their slab is filled (mf_exec_sg_before). */
    if ((x->hooks.wait || x->hooks.grad_wait) && !(staged && in->kind == MF_I_H2D))
      MF_CHECK_GOTO(mf_exec_param_gate(x, in, !staged), st, done);
    if (staged) MF_CHECK_GOTO(mf_exec_sg_before(x, i, io), st, done);
    const int sk = mf_schedule_stream(in->kind);
    for (int k = 0; k < MF_EXEC_STREAMS; k++) {
      const int32_t j = x->wait_on[3 * (size_t)i + (size_t)k];
      if (j >= 0) MF_CHECK_GOTO(x->b->stream_wait(x->b, x->st[sk], x->ev[j]), st, done);
    }
    if (x->t0) MF_CHECK_GOTO(x->b->event_record(x->b, x->t0[i], x->st[sk]), st, done);
    switch (in->kind) {
      case MF_I_H2D:
        MF_CHECK_GOTO(staged ? mf_exec_sg_copy(x, i) : do_h2d(x, in->slot, io), st, done);
        break;
      case MF_I_D2H:
        MF_CHECK_GOTO(staged ? mf_exec_sg_copy(x, i) : do_d2h(x, in, io), st, done);
        break;
      case MF_I_ZERO: {
        mf_kernel_call call;
        memset(&call, 0, sizeof call);
        call.kind = MF_K_ZERO;
        call.b[0].ptr = mf_exec_slot_ptr(x, in->slot);
        call.b[0].bytes = mf_exec_slot_bytes(x, in->slot);
        call.b[0].dtype = p->tensors[s->slots[in->slot].tensor].dtype;
        call.label = "zero gradient slot";
        MF_CHECK_GOTO(x->b->run(x->b, &call, x->st[MF_EXEC_COMPUTE]), st, done);
        break;
      }
      case MF_I_ACCUM: {
        mf_kernel_call call;
        memset(&call, 0, sizeof call);
        call.kind = MF_K_ADD;
        call.b[0].ptr = mf_exec_slot_ptr(x, in->slot);
        call.b[0].bytes = mf_exec_slot_bytes(x, in->slot);
        call.b[1].ptr = mf_exec_slot_ptr(x, in->slot2);
        call.b[1].bytes = mf_exec_slot_bytes(x, in->slot2);
        call.b[0].dtype = p->tensors[s->slots[in->slot].tensor].dtype;
        call.b[1].dtype = p->tensors[s->slots[in->slot2].tensor].dtype;
        call.i[0] = p->tensors[s->slots[in->slot].tensor].numel;
        call.i[1] = 1; /* a gradient: fp32 even when activations are rounded to bf16 */
        call.label = "accumulate gradient";
        MF_CHECK_GOTO(x->b->run(x->b, &call, x->st[MF_EXEC_COMPUTE]), st, done);
        break;
      }
      case MF_I_RUN: {
        const mf_pop *o = &p->ops[in->op];
        mf_kernel_call call;
        memset(&call, 0, sizeof call);
        call.kind = o->kind;
        call.label = o->label;
        const int32_t *sl = s->slot_pool + in->operands;
        for (int j = 0; j < MF_KBUF_MAX; j++) {
          if (sl[j] < 0) continue;
          call.b[j].ptr = mf_exec_slot_ptr(x, sl[j]);
          call.b[j].bytes = mf_exec_slot_bytes(x, sl[j]);
          call.b[j].dtype = p->tensors[s->slots[sl[j]].tensor].dtype;
        }
        memcpy(call.i, o->i, sizeof call.i);
        memcpy(call.f, o->f, sizeof call.f);
        if (o->experts_at >= 0) {
          int32_t first = -1; /* a slot of the pool's: a cold expert's adapter has none (NULL) */
          for (int64_t e = 0; e < p->spec.experts; e++) {
            const int32_t se = sl[MF_KBUF_MAX + e];
            x->expert_ptrs[e] = se >= 0 ? mf_exec_slot_ptr(x, se) : NULL;
            if (first < 0 && se >= 0) first = se;
          }
          call.experts = x->expert_ptrs;
          call.expert_bytes = first >= 0 ? mf_exec_slot_bytes(x, first) : 0;
          call.expert_dtype = first >= 0 ? p->tensors[s->slots[first].tensor].dtype : MF_DTYPE_F32;
        }
        if (o->kind == MF_K_CROSS_ENTROPY && o->f[0] == MF_PROGRAM_LOSS_SCALE_RUNTIME) {
          int64_t nv = io->n_valid[o->micro];
          call.f[0] = nv > 0 ? 1.0 / (mf_program_loss_divisor(p) * (double)nv) : 0.0;
        }
        if (o->kind == MF_K_DEQUANT && dequant_idle(x, o)) break; /* an expert no token reaches: not read */
        /* The micro-batch's dropout seed where the program leaves it to the run: DROPOUT's mask, and the
         * dispatch's, which its receivers' masks follow (its place in i[]: kernels/backend.c). */
        const int seed_at = o->kind == MF_K_DROPOUT ? 2 : o->kind == MF_K_EP_DISPATCH ? 4 : -1;
        if (seed_at >= 0 && o->i[seed_at] == MF_PROGRAM_SEED_RUNTIME) {
          if (!x->dropout_seeds) {
            st = MF_ERR(MF_ERR_INTERNAL,
                        "executor: %s needs the step's dropout seeds (mf_exec_set_dropout_seeds)", o->label);
            goto done;
          }
          call.i[seed_at] = (int64_t)x->dropout_seeds[o->micro];
        }
        if (mf_kernel_is_exchange(o->kind)) { /* between ranks: after all before it, on this thread */
          if (!x->exchange.run) {
            st = MF_ERR(MF_ERR_INTERNAL,
                        "executor: %s needs an exchange between ranks (mf_exec_set_exchange)", o->label);
            goto done;
          }
          if (x->exchange.wait) MF_CHECK_GOTO(x->exchange.wait(x->exchange.ctx), st, done);
          MF_CHECK_GOTO(x->b->stream_sync(x->b, x->st[MF_EXEC_COMPUTE]), st, done);
          MF_CHECK_GOTO(x->exchange.run(x->exchange.ctx, &call, x->b, x->st[MF_EXEC_COMPUTE]), st, done);
          MF_CHECK_GOTO(after_run(x, in, &call), st, done);
          break;
        }
        if (o->kind == MF_K_ADAMW) {
          const int32_t pi = p->tensors[o->t[0]].param;
          if (!opt || !opt->update[pi]) break; /* no gradient this step: left alone, as PyTorch does */
          call.i[1] = opt->step[pi];
          call.f[0] = opt->lr;
          call.f[1] = opt->beta1;
          call.f[2] = opt->beta2;
          call.f[3] = opt->eps;
          call.f[4] = !opt->decays || opt->decays[pi] ? opt->weight_decay : 0.0;
          call.f[5] = opt->coef;
        }
        MF_CHECK_GOTO(x->b->run(x->b, &call, x->st[MF_EXEC_COMPUTE]), st, done);
        MF_CHECK_GOTO(after_run(x, in, &call), st, done);
        break;
      }
      default:
        st = MF_ERR(MF_ERR_INTERNAL, "executor: unknown instruction %d", (int)in->kind);
        goto done;
    }
    if (x->t1) MF_CHECK_GOTO(x->b->event_record(x->b, x->t1[i], x->st[sk]), st, done);
    if (x->ev[i]) MF_CHECK_GOTO(x->b->event_record(x->b, x->ev[i], x->st[sk]), st, done);
    if (x->host_prof) {
      const int kk = in->kind == MF_I_RUN     ? (int)p->ops[in->op].kind
                     : in->kind == MF_I_ZERO  ? (int)MF_K_ZERO
                     : in->kind == MF_I_ACCUM ? (int)MF_K_ADD
                                              : (int)MF_K_COUNT_;
      x->host_kind_s[kk] += mf_time_now() - t_host;
      x->host_kind_n[kk]++;
    }
    if (staged) MF_CHECK_GOTO(mf_exec_sg_after(x, i), st, done);
    count[sk]++;
    /* A staged gradient is handed over by its slab's copy-out (exec_staging.c). */
    if (!staged && x->hooks.grad_home && x->grad_final[i] >= 0 && io->grads)
      MF_CHECK_GOTO(hand_home(x, x->grad_final[i]), st, done);
    for (; x->ne < s->n_slots && s->slots[x->ends[x->ne]].last == i; x->ne++) {
      /* A persistent slot keeps its bytes: its contents are the next step's. */
      if (!s->slots[x->ends[x->ne]].persist) MF_CHECK_GOTO(mark(x, x->ends[x->ne], 0), st, done);
      x->live -= mf_exec_slot_bytes(x, x->ends[x->ne]);
    }
  }
done:
  return st;
}

/* After the step's last sync: the loss scalars in the order they were copied
 * (the sums' order, so the same bits as reading each at once), and the
 * tokens each expert got. */
static void read_results(mf_exec *x, mf_step_result *r) {
  const mf_program *p = x->p;
  for (int32_t k = 0; k < x->n_reads; k++) {
    const double *v = x->scalars + 2 * (size_t)k;
    if (x->read_kind[k] == READ_AUX) {
      r->aux_loss += v[0] / mf_program_loss_divisor(p);
    } else {
      r->ce_loss += (v[1] > 0 ? v[0] / v[1] : 0.0) / mf_program_loss_divisor(p);
      r->tokens += (int64_t)v[1];
    }
  }
  r->loss = r->ce_loss + p->aux_coef * r->aux_loss;
  const int64_t L = p->spec.layers, E = p->spec.experts;
  for (int64_t m = 0; m < p->G; m++)
    for (int64_t l = 0; l < L; l++) {
      if (!x->route_state[m * L + l]) continue;
      for (int64_t e = 0; e < E; e++) x->expert_tokens[l * E + e] += x->route_host[(m * L + l) * E + e];
    }
}

/* Busy seconds of each stream over instructions [from, to), from the timed
 * events around each (exec.h, "timing"); per instruction too when asked. */
static mf_status stream_busy(mf_exec *x, int32_t from, int32_t to, double busy[MF_EXEC_STREAMS]) {
  for (int32_t i = from; i < to; i++) {
    double dt = 0;
    MF_CHECK(x->b->event_elapsed(x->b, x->t0[i], x->t1[i], &dt));
    busy[mf_schedule_stream(x->s->instr[i].kind)] += dt;
    if (x->instr_s) x->instr_s[i] = dt;
  }
  return MF_OK;
}

/* MF_LOG=debug: where the host's submitting time went, by kernel kind (the
 * kinds over 2% of it), then zeroed for the next step. */
static void log_host_submit(mf_exec *x, double submit_s, double wall_s) {
  char line[1024];
  int n = snprintf(line, sizeof line, "step submitted in %.2f ms of %.2f ms:", 1e3 * submit_s, 1e3 * wall_s);
  for (int k = 0; k <= MF_K_COUNT_; k++) {
    if (x->host_kind_n[k] > 0 && x->host_kind_s[k] > 0.02 * submit_s && n > 0 && (size_t)n < sizeof line)
      n += snprintf(line + n, sizeof line - (size_t)n, " %s %lld x %.1f us",
                    k == MF_K_COUNT_ ? "copies" : mf_kernel_name((mf_kernel)k), (long long)x->host_kind_n[k],
                    1e6 * x->host_kind_s[k] / (double)x->host_kind_n[k]);
    x->host_kind_s[k] = 0;
    x->host_kind_n[k] = 0;
  }
  MF_LOGD("exec", "%s", line);
}

mf_status mf_exec_step(mf_exec *x, const float *params, const int32_t *const *ids, const int32_t *const *targets,
                       float *grads, mf_step_result *r) {
  const mf_program *p = x->p;
  const mf_schedule *s = x->s;
  const double t0 = mf_time_now();
  memset(r, 0, sizeof *r);
  x->h2d = x->d2h = 0;
  int64_t *n_valid = x->n_valid;
  const int32_t *pos = x->pos;
  mf_status st = MF_OK;
  for (int64_t m = 0; m < p->G; m++) {
    n_valid[m] = 0;
    for (int64_t i = 0; i < p->B * p->S; i++) n_valid[m] += targets[m][i] >= 0;
  }
  memset(x->expert_tokens, 0,
         (size_t)(p->spec.layers * (p->spec.experts > 0 ? p->spec.experts : 1)) * sizeof(int64_t));
  memset(x->route_state, 0,
         (size_t)(p->G > 0 ? p->G : 1) * (size_t)(p->spec.layers > 0 ? p->spec.layers : 1));
  x->n_reads = 0;
  x->h2d_skipped = x->d2h_skipped = 0;
  step_io io = {params, ids, targets, pos, grads, n_valid};
  x->params_host = params;

  x->peak_live = 0;
  double busy[MF_EXEC_STREAMS] = {0, 0, 0}, t_submitted = t0;
  int64_t count[MF_EXEC_STREAMS] = {0, 0, 0};
  x->ns = x->ne = 0;
  x->live = 0;
  x->step_done = 0;
  MF_CHECK_GOTO(run_range(x, 0, s->optim_begin, &io, NULL, count), st, done);
  t_submitted = mf_time_now();
  if (x->exchange.wait) MF_CHECK_GOTO(x->exchange.wait(x->exchange.ctx), st, done);
  MF_CHECK_GOTO(sync_all(x), st, done);
  r->seconds = mf_time_now() - t0;
  read_results(x, r);
  if (x->captured > 0) { /* bf16 hidden states widened in place, from the end */
    const uint16_t *h = (const uint16_t *)x->capture;
    for (int64_t i = x->captured - 1; i >= 0; i--) x->capture[i] = mf_bf16_to_fp32(h[i]);
    x->captured = 0;
  }
  if (x->timed) MF_CHECK_GOTO(stream_busy(x, 0, s->optim_begin, busy), st, done);
  if (x->host_prof) log_host_submit(x, t_submitted - t0, r->seconds);
  {
    mf_exec_stats *z = &x->stats;
    z->timed = x->timed;
    z->wall_s = r->seconds;
    z->submit_s = t_submitted - t0;
    for (int k = 0; k < MF_EXEC_STREAMS; k++) {
      z->busy_s[k] = x->timed ? busy[k] : NAN;
      z->idle_s[k] = x->timed ? r->seconds - busy[k] : NAN;
      z->optim_busy_s[k] = x->timed ? 0.0 : NAN;
      z->instr[k] = count[k];
    }
    z->h2d_bytes = x->h2d;
    z->d2h_bytes = x->d2h;
    z->h2d_skipped_bytes = x->h2d_skipped;
    z->d2h_skipped_bytes = x->d2h_skipped;
    z->peak_live_bytes = x->peak_live;
    z->optimizer_s = 0;
    z->staged = x->sg != NULL;
    z->fill_s = z->drain_s = NAN;
    if (x->sg && x->timed) MF_CHECK_GOTO(mf_exec_sg_busy(x, &z->fill_s, &z->drain_s), st, done);
  }
  x->weights_current = 1;
  x->step_done = 1;
done:
  return st;
}

int32_t mf_exec_optim_on_device(const mf_exec *x) { return x->s->n_optim_device; }
const double *mf_exec_norm_sums(const mf_exec *x) { return x->norm_host; }

void mf_exec_set_optim_state(mf_exec *x, void *m, void *v) {
  x->m_host = m;
  x->v_host = v;
}

void mf_exec_set_working_copy(mf_exec *x, uint16_t *working) { x->working = working; }

void mf_exec_set_dropout_seeds(mf_exec *x, const uint64_t *seeds) {
  x->dropout_seeds = seeds;
}

void mf_exec_invalidate(mf_exec *x) { x->weights_current = x->state_current = 0; }

mf_status mf_exec_optimize(mf_exec *x, const mf_exec_optim *a) {
  const mf_schedule *s = x->s;
  if (s->n_optim_device == 0) return MF_OK;
  if (!x->step_done)
    return MF_ERR(MF_ERR_INTERNAL, "executor: the optimizer part runs only after a successful step");
  if (!a || !a->step || !a->update) return MF_ERR(MF_ERR_INVALID_ARG, "executor: optimizer step without its arguments");
  x->step_done = 0;
  const double t0 = mf_time_now();
  step_io io;
  memset(&io, 0, sizeof io);
  io.n_valid = x->n_valid;
  int64_t count[MF_EXEC_STREAMS] = {0, 0, 0};
  const mf_exec_param_hooks hooks = x->hooks;
  memset(&x->hooks, 0, sizeof x->hooks); /* the host optimizer's hand-off is the step's */
  mf_status st = run_range(x, s->optim_begin, s->n_instr, &io, a, count);
  x->hooks = hooks;
  MF_CHECK(st);
  MF_CHECK(sync_all(x));
  x->state_current = 1;
  x->stats.optimizer_s = mf_time_now() - t0;
  if (x->timed) MF_CHECK(stream_busy(x, s->optim_begin, s->n_instr, x->stats.optim_busy_s));
  return MF_OK;
}

mf_status mf_exec_sync_home(mf_exec *x, float *params, int state) {
  const mf_program *p = x->p;
  const mf_schedule *s = x->s;
  if (s->n_optim_device == 0) return MF_OK;
  const size_t ms = mf_dtype_size(p->moments);
  const int bf16 = p->storage == MF_DTYPE_BF16;
  mf_stream *d = x->st[MF_EXEC_D2H];
  for (int32_t i = 0; i < s->n_slots; i++) {
    if (!s->slots[i].persist) continue;
    const mf_ptensor *t = &p->tensors[s->slots[i].tensor];
    const mf_param *q = &p->params->params[t->param];
    if (q->frozen) continue; /* a resident frozen weight: its home copy is what the device holds */
    const uint8_t *dev = mf_exec_slot_ptr(x, i);
    /* The weights: fp32 storage holds the master itself; BF16 storage its
     * working copy, the master being the state's first part. */
    if (t->kind == MF_T_PARAM && x->weights_current && !bf16 && params)
      MF_CHECK(x->b->copy(x->b, params + q->offset, dev, t->bytes, MF_COPY_D2H, d));
    if (t->kind == MF_T_PARAM && x->weights_current && bf16 && x->working)
      MF_CHECK(x->b->copy(x->b, x->working + q->offset, dev, t->bytes, MF_COPY_D2H, d));
    if (t->kind != MF_T_OPT || !x->state_current) continue;
    const size_t master = bf16 ? (size_t)q->numel * sizeof(float) : 0;
    if (bf16 && params) MF_CHECK(x->b->copy(x->b, params + q->offset, dev, master, MF_COPY_D2H, d));
    if (state && x->m_host && x->v_host) {
      const size_t n = (size_t)q->numel * ms;
      MF_CHECK(
          x->b->copy(x->b, (uint8_t *)x->m_host + (size_t)q->toff * ms, dev + master, n, MF_COPY_D2H, d));
      MF_CHECK(
          x->b->copy(x->b, (uint8_t *)x->v_host + (size_t)q->toff * ms, dev + master + n, n, MF_COPY_D2H, d));
    }
  }
  return x->b->stream_sync(x->b, d);
}
