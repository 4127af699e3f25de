/* Runs a step program on a backend (see exec.h). */
#include <stdlib.h>
#include <string.h>

#include "src/exec/exec.h"

struct mf_exec {
  mf_program *p;
  mf_backend *b;
  mf_stream *stream;
  uint8_t *arena;
  void **expert_ptrs;
  int32_t *births; /* tensors ordered by first_op */
  int32_t *deaths; /* tensors ordered by last_op */
  int32_t *micro_first_op; /* [G] first op of each micro-batch */
  size_t peak_live;
  float *capture; /* host copy of micro-batch 0's final hidden states, or NULL */
  int64_t *expert_tokens; /* [L * E] */
  int64_t *counts_tmp;    /* [E] */
};

static int cmp_first(const void *a, const void *b, void *arg) {
  const mf_program *p = (const mf_program *)arg;
  int32_t x = p->tensors[*(const int32_t *)a].first_op, y = p->tensors[*(const int32_t *)b].first_op;
  return x != y ? (x < y ? -1 : 1) : *(const int32_t *)a - *(const int32_t *)b;
}
static int cmp_last(const void *a, const void *b, void *arg) {
  const mf_program *p = (const mf_program *)arg;
  int32_t x = p->tensors[*(const int32_t *)a].last_op, y = p->tensors[*(const int32_t *)b].last_op;
  return x != y ? (x < y ? -1 : 1) : *(const int32_t *)a - *(const int32_t *)b;
}

mf_status mf_exec_create(mf_program *p, mf_backend *b, mf_exec **out) {
  *out = NULL;
  if (p->arena_bytes == 0) MF_CHECK(mf_program_plan_memory(p));
  mf_exec *x = (mf_exec *)calloc(1, sizeof *x);
  if (!x) return MF_ERR(MF_ERR_OUT_OF_MEMORY, "executor: out of memory");
  x->p = p;
  x->b = b;
  mf_status st = MF_OK;
  x->expert_ptrs = (void **)calloc((size_t)(p->spec.experts > 0 ? p->spec.experts : 1), sizeof(void *));
  x->births = (int32_t *)malloc((size_t)p->n_tensors * sizeof(int32_t));
  x->deaths = (int32_t *)malloc((size_t)p->n_tensors * sizeof(int32_t));
  x->micro_first_op = (int32_t *)malloc((size_t)p->G * sizeof(int32_t));
  const int64_t E = p->spec.experts > 0 ? p->spec.experts : 1;
  x->expert_tokens = (int64_t *)calloc((size_t)(p->spec.layers * E), sizeof(int64_t));
  x->counts_tmp = (int64_t *)calloc((size_t)E, sizeof(int64_t));
  if (!x->expert_ptrs || !x->births || !x->deaths || !x->micro_first_op || !x->expert_tokens || !x->counts_tmp) {
    st = MF_ERR(MF_ERR_OUT_OF_MEMORY, "executor: out of memory");
    goto fail;
  }
  for (int32_t i = 0; i < p->n_tensors; i++) x->births[i] = x->deaths[i] = i;
  qsort_r(x->births, (size_t)p->n_tensors, sizeof(int32_t), cmp_first, p);
  qsort_r(x->deaths, (size_t)p->n_tensors, sizeof(int32_t), cmp_last, p);
  for (int32_t m = 0; m < (int32_t)p->G; m++) x->micro_first_op[m] = -1;
  for (int32_t k = 0; k < p->n_ops; k++) {
    int32_t m = p->ops[k].micro;
    if (m >= 0 && x->micro_first_op[m] < 0) x->micro_first_op[m] = k;
  }
  void *base = NULL;
  MF_CHECK_GOTO(b->arena_create(b, p->arena_bytes, &base), st, fail);
  x->arena = (uint8_t *)base;
  MF_CHECK_GOTO(b->stream_create(b, &x->stream), st, fail);
  *out = x;
  return MF_OK;
fail:
  mf_exec_free(x);
  return st;
}

void mf_exec_free(mf_exec *x) {
  if (!x) return;
  if (x->stream) x->b->stream_free(x->b, x->stream);
  free(x->expert_ptrs);
  free(x->births);
  free(x->deaths);
  free(x->micro_first_op);
  free(x->expert_tokens);
  free(x->counts_tmp);
  free(x);
}

size_t mf_exec_arena_bytes(const mf_exec *x) { return x->p->arena_bytes; }
const int64_t *mf_exec_expert_tokens(const mf_exec *x) { return x->expert_tokens; }
size_t mf_exec_peak_live_bytes(const mf_exec *x) { return x->peak_live; }

static mf_status copy_h2d(mf_exec *x, int32_t t, const void *src) {
  const mf_ptensor *pt = &x->p->tensors[t];
  return x->b->copy(x->b, x->arena + pt->offset, src, pt->bytes, MF_COPY_H2D, x->stream);
}

static mf_status copy_d2h(mf_exec *x, int32_t t, void *dst) {
  const mf_ptensor *pt = &x->p->tensors[t];
  return x->b->copy(x->b, dst, x->arena + pt->offset, pt->bytes, MF_COPY_D2H, x->stream);
}

static mf_status mark(mf_exec *x, int32_t t, int live) {
  if (!x->b->mark) return MF_OK;
  const mf_ptensor *pt = &x->p->tensors[t];
  return x->b->mark(x->b, x->arena + pt->offset, pt->bytes, live);
}

mf_status mf_exec_step(mf_exec *x, const float *params, const int32_t *const *ids, const int32_t *const *targets,
                       float *grads, mf_step_result *r) {
  mf_program *p = x->p;
  const mf_param_table *pt = p->params;
  const double t0 = mf_time_now();
  memset(r, 0, sizeof *r);
  int64_t *n_valid = (int64_t *)calloc((size_t)p->G, sizeof(int64_t));
  int32_t *pos = (int32_t *)malloc((size_t)(p->B * p->S) * sizeof(int32_t));
  mf_status st = MF_OK;
  if (!n_valid || !pos) {
    st = MF_ERR(MF_ERR_OUT_OF_MEMORY, "executor: out of memory");
    goto done;
  }
  for (int64_t bq = 0; bq < p->B; bq++)
    for (int64_t s = 0; s < p->S; s++) pos[bq * p->S + s] = (int32_t)s;
  for (int64_t m = 0; m < p->G; m++)
    for (int64_t i = 0; i < p->B * p->S; i++) n_valid[m] += targets[m][i] >= 0;
  memset(x->expert_tokens, 0, (size_t)(p->spec.layers * (p->spec.experts > 0 ? p->spec.experts : 1)) * sizeof(int64_t));

  /* Tensors of the whole step are live from the start; the rest by lifetime. */
  size_t live_bytes = 0;
  x->peak_live = 0;
  int32_t nb = 0, nd = 0;
  for (; nb < p->n_tensors && p->tensors[x->births[nb]].first_op <= 0; nb++) {
    const mf_ptensor *t = &p->tensors[x->births[nb]];
    if (t->first_op < 0) continue;
    MF_CHECK_GOTO(mark(x, x->births[nb], 1), st, done);
    live_bytes += t->bytes;
  }
  for (int64_t i = 0; i < pt->n; i++) MF_CHECK_GOTO(copy_h2d(x, p->param_tensor[i], params + pt->params[i].offset), st, done);
  MF_CHECK_GOTO(copy_h2d(x, p->io[0].positions, pos), st, done);

  for (int32_t k = 0; k < p->n_ops; k++) {
    for (; nb < p->n_tensors && p->tensors[x->births[nb]].first_op == k; nb++) {
      MF_CHECK_GOTO(mark(x, x->births[nb], 1), st, done);
      live_bytes += p->tensors[x->births[nb]].bytes;
    }
    if (live_bytes > x->peak_live) x->peak_live = live_bytes;
    const mf_pop *o = &p->ops[k];
    if (o->micro >= 0 && x->micro_first_op[o->micro] == k) {
      MF_CHECK_GOTO(copy_h2d(x, p->io[o->micro].ids, ids[o->micro]), st, done);
      MF_CHECK_GOTO(copy_h2d(x, p->io[o->micro].targets, targets[o->micro]), st, done);
    }
    mf_kernel_call call;
    mf_program_kernel_call(p, k, x->arena, x->expert_ptrs, &call);
    if (o->kind == MF_K_CROSS_ENTROPY && o->f[0] == MF_PROGRAM_LOSS_SCALE_RUNTIME) {
      int64_t nv = n_valid[o->micro];
      call.f[0] = nv > 0 ? 1.0 / ((double)p->G * (double)nv) : 0.0;
    }
    MF_CHECK_GOTO(x->b->run(x->b, &call, x->stream), st, done);
    if (o->kind == MF_K_MOE_DISPATCH) {
      const int64_t E = p->spec.experts;
      MF_CHECK_GOTO(copy_d2h(x, o->t[1], x->counts_tmp), st, done);
      for (int64_t e = 0; e < E; e++) x->expert_tokens[o->layer * E + e] += x->counts_tmp[e];
    }
    /* Read the micro-batch's losses right after the op that writes them, before
     * their memory can be reused. */
    if (o->micro >= 0 && o->t[o->kind == MF_K_AUX_VALUE ? 2 : 0] == p->io[o->micro].aux_scalars &&
        (o->kind == MF_K_AUX_VALUE || o->kind == MF_K_ZERO)) {
      double aux = 0;
      MF_CHECK_GOTO(copy_d2h(x, p->io[o->micro].aux_scalars, &aux), st, done);
      r->aux_loss += aux / (double)p->G;
    }
    if (o->kind == MF_K_CROSS_ENTROPY) {
      double ce[2];
      MF_CHECK_GOTO(copy_d2h(x, p->io[o->micro].ce_scalars, ce), st, done);
      double ce_mean = ce[1] > 0 ? ce[0] / ce[1] : 0.0;
      r->ce_loss += ce_mean / (double)p->G;
      r->tokens += (int64_t)ce[1];
      if (o->micro == 0 && x->capture) MF_CHECK_GOTO(copy_d2h(x, p->io[0].final_hidden, x->capture), st, done);
    }
    for (; nd < p->n_tensors && p->tensors[x->deaths[nd]].last_op == k; nd++) {
      const mf_ptensor *t = &p->tensors[x->deaths[nd]];
      if (k == p->n_ops - 1 || t->first_op < 0) continue; /* whole-step tensors stay */
      if (t->kind == MF_T_PARAM || t->kind == MF_T_GRAD || t->micro < 0) continue;
      MF_CHECK_GOTO(mark(x, x->deaths[nd], 0), st, done);
      live_bytes -= t->bytes;
    }
  }
  r->loss = r->ce_loss + p->aux_coef * r->aux_loss;
  if (grads && !p->forward_only)
    for (int64_t i = 0; i < pt->n; i++) MF_CHECK_GOTO(copy_d2h(x, p->grad_tensor[i], grads + pt->params[i].offset), st, done);
  MF_CHECK_GOTO(x->b->stream_sync(x->b, x->stream), st, done);
  r->seconds = mf_time_now() - t0;
done:
  free(n_valid);
  free(pos);
  return st;
}

void mf_exec_capture_final_hidden(mf_exec *x, float *out) { x->capture = out; }
