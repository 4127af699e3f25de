/* The step program's tensors and ops, and the ops every block builds (program_build.h). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "src/model/program_build.h"
int32_t mf_pb_tensor(pb *b, mf_tensor_kind kind, mf_dtype dtype, int64_t numel, int32_t micro, int32_t layer,
                     const char *fmt, ...) {
  if (b->st != MF_OK) return -1;
  mf_program *p = b->p;
  if (p->n_tensors == b->cap_t) {
    int32_t cap = b->cap_t ? 2 * b->cap_t : 1024;
    mf_ptensor *t = (mf_ptensor *)realloc(p->tensors, (size_t)cap * sizeof *t);
    if (!t) {
      b->st = MF_ERR(MF_ERR_OUT_OF_MEMORY, "step program: out of memory");
      return -1;
    }
    p->tensors = t;
    b->cap_t = cap;
  }
  mf_ptensor *t = &p->tensors[p->n_tensors];
  memset(t, 0, sizeof *t);
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(t->name, sizeof t->name, fmt, ap);
  va_end(ap);
  t->kind = kind;
  /* Device storage: weights, activations and their gradients in the storage
   * dtype; gradient sums, statistics, workspaces and inputs as built. */
  if (p->storage == MF_DTYPE_BF16 && dtype == MF_DTYPE_F32 &&
      (kind == MF_T_PARAM || kind == MF_T_ACT || kind == MF_T_ACT_GRAD))
    dtype = MF_DTYPE_BF16;
  t->dtype = dtype;
  t->numel = numel;
  t->bytes = (size_t)numel * mf_dtype_size(dtype);
  t->param = -1;
  t->micro = micro;
  t->layer = layer;
  t->first_op = t->last_op = -1;
  return p->n_tensors++;
}

/* Tensor t stays fp32 whatever the storage: the gradient of an fp32
 * statistic (the router's probabilities). */
int32_t mf_pb_keep_fp32(pb *b, int32_t t) {
  if (t < 0) return t;
  mf_ptensor *x = &b->p->tensors[t];
  x->dtype = MF_DTYPE_F32;
  x->bytes = (size_t)x->numel * sizeof(float);
  return t;
}

mf_pop *mf_pb_op(pb *b, mf_kernel kind, mf_phase phase, int32_t micro, int32_t layer, const char *fmt, ...) {
  static mf_pop sink; /* absorbs writes after an error */
  if (b->st != MF_OK) return &sink;
  mf_program *p = b->p;
  if (p->n_ops == b->cap_o) {
    int32_t cap = b->cap_o ? 2 * b->cap_o : 1024;
    mf_pop *o = (mf_pop *)realloc(p->ops, (size_t)cap * sizeof *o);
    if (o) p->ops = o;
    int32_t *sg = o ? (int32_t *)realloc(b->stage_of, (size_t)cap * sizeof *sg) : NULL;
    if (sg) b->stage_of = sg;
    if (!o || !sg) {
      b->st = MF_ERR(MF_ERR_OUT_OF_MEMORY, "step program: out of memory");
      return &sink;
    }
    b->cap_o = cap;
  }
  b->stage_of[p->n_ops] = b->stage;
  mf_pop *o = &p->ops[p->n_ops++];
  memset(o, 0, sizeof *o);
  o->kind = kind;
  o->phase = phase;
  o->micro = micro;
  o->layer = layer;
  o->experts_at = -1;
  for (int i = 0; i < MF_KBUF_MAX; i++) o->t[i] = -1;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(o->label, sizeof o->label, fmt, ap);
  va_end(ap);
  if (kind != MF_K_DEQUANT) {
    for (int32_t k = 0; k < b->n_pending; k++) p->ops[b->pending[k]].phase = phase;
    b->n_pending = 0;
  }
  return o;
}

int32_t mf_pb_pool_put(pb *b, const int32_t *ids, int64_t n) {
  if (b->st != MF_OK) return -1;
  mf_program *p = b->p;
  if (p->n_pool + n > b->cap_pool) {
    int64_t cap = b->cap_pool ? 2 * b->cap_pool : 4096;
    while (cap < p->n_pool + n) cap *= 2;
    int32_t *q = (int32_t *)realloc(p->id_pool, (size_t)cap * sizeof *q);
    if (!q) {
      b->st = MF_ERR(MF_ERR_OUT_OF_MEMORY, "step program: out of memory");
      return -1;
    }
    p->id_pool = q;
    b->cap_pool = cap;
  }
  memcpy(p->id_pool + p->n_pool, ids, (size_t)n * sizeof *ids);
  int32_t at = (int32_t)p->n_pool;
  p->n_pool += n;
  return at;
}

/* Parameter i's weights as an op reads them: its tensor, or for a weight
 * stored quantized (LoRA's base, mf_param_table_quantize_base) a DEQUANT of
 * its blob made just before the op being built, into an activation of the
 * storage dtype that lives until that op has read it (each use its own, so
 * no bf16 copy of the weight outlives an op; a recomputed op recomputes its
 * DEQUANT from the blob). */
int32_t mf_pb_weight_of(const ctx *c, int32_t i) {
  pb *b = c->b;
  if (i < 0) return -1;
  const mf_param *q = &c->pt->params[i];
  if (!q->quant) return b->p->param_tensor[i];
  if (b->st != MF_OK) return -1;
  if (b->n_pending == b->cap_pending) {
    const int32_t cap = b->cap_pending ? 2 * b->cap_pending : 64;
    int32_t *pd = (int32_t *)realloc(b->pending, (size_t)cap * sizeof *pd);
    if (!pd) {
      b->st = MF_ERR(MF_ERR_OUT_OF_MEMORY, "step program: out of memory");
      return -1;
    }
    b->pending = pd;
    b->cap_pending = cap;
  }
  const int32_t y = mf_pb_tensor(b, MF_T_ACT, MF_DTYPE_F32, q->numel, c->m, q->layer, "mb%d.%s.deq%d", c->m,
                                 q->name, b->p->n_ops);
  const int32_t k = b->p->n_ops;
  mf_pop *o = mf_pb_op(b, MF_K_DEQUANT, MF_PHASE_FWD, c->m, q->layer, "dequant %s", q->name);
  SET(o, b->p->param_tensor[i], y);
  INTS(o, q->quant, q->shape[0], q->shape[1], c->pt->base_blocksize, c->pt->base_nested);
  if (b->st == MF_OK) b->pending[b->n_pending++] = k;
  return y;
}

int32_t mf_pb_P(const ctx *c, mf_param_role role, int64_t layer) {
  return mf_pb_weight_of(c, mf_param_index(c->pt, role, layer, -1));
}
int32_t mf_pb_G(const ctx *c, mf_param_role role, int64_t layer) {
  int32_t i = mf_param_index(c->pt, role, layer, -1);
  return i < 0 ? -1 : c->b->p->grad_tensor[i];
}

/* The id pool entry of layer `layer`'s routed experts' weights of `role`
 * (lora -1), or of their LoRA adapters' A (lora 0) or B (lora 1): their
 * parameter tensors, or with grads their gradients. */
int32_t mf_pb_experts_of(const ctx *c, mf_param_role role, int64_t layer, int grads, int lora) {
  const int64_t E = c->s->experts;
  int32_t *ids = (int32_t *)malloc((size_t)E * sizeof *ids);
  if (!ids) {
    if (c->b->st == MF_OK) c->b->st = MF_ERR(MF_ERR_OUT_OF_MEMORY, "step program: out of memory");
    return -1;
  }
  for (int64_t e = 0; e < E; e++) {
    int32_t pi = mf_program_owns_expert(c->b->p, e) ? mf_param_index(c->pt, role, layer, e) : -1;
    if (lora >= 0 && pi >= 0)
      pi = c->pt->lora_a[pi] < 0 ? -1 : c->pt->lora_a[pi] + lora; /* -1: a cold expert */
    ids[e] = pi < 0 ? -1 : grads ? c->b->p->grad_tensor[pi] : mf_pb_weight_of(c, pi);
  }
  int32_t at = mf_pb_pool_put(c->b, ids, E);
  free(ids);
  return at;
}

/* Layer l's routed experts' weights of `role` are frozen (LoRA's base). */
int mf_pb_experts_frozen(const ctx *c, mf_param_role role, int64_t layer) {
  return c->pt->params[mf_param_index(c->pt, role, layer, 0)].frozen;
}

void mf_pb_linear_fwd(const ctx *c, int32_t l, const char *what, int32_t x, int32_t W, int32_t bias,
                      int32_t y, int64_t N, int64_t K, int acc) {
  mf_pop *o = mf_pb_op(c->b, MF_K_LINEAR_FWD, MF_PHASE_FWD, c->m, l, "L%d %s", l, what);
  SET(o, x, W, bias, y);
  INTS(o, c->T, N, K, acc);
  o->flops = 2.0 * (double)c->T * (double)N * (double)K;
}

/* dW (+ db) and dx for y = x W^T (+ b): weight gradient first, then data. */
void mf_pb_linear_bwd(const ctx *c, int32_t l, const char *what, int32_t dy, int32_t x, int32_t W, int32_t dW,
                      int32_t db, int32_t dx, int64_t N, int64_t K, int acc) {
  mf_pop *o;
  if (dW >= 0) { /* else a frozen weight (LoRA's base): no gradient */
    o = mf_pb_op(c->b, MF_K_LINEAR_BWD_WEIGHT, MF_PHASE_BWD, c->m, l, "L%d %s dW", l, what);
    SET(o, dy, x, dW, db);
    INTS(o, c->T, N, K);
    o->flops = 2.0 * (double)c->T * (double)N * (double)K;
  }
  if (dx < 0) return;
  o = mf_pb_op(c->b, MF_K_LINEAR_BWD_DATA, MF_PHASE_BWD, c->m, l, "L%d %s dx", l, what);
  SET(o, dy, W, dx);
  INTS(o, c->T, N, K, acc);
  o->flops = 2.0 * (double)c->T * (double)N * (double)K;
}

void mf_pb_rmsnorm_fwd(const ctx *c, int32_t l, const char *what, int32_t x, int32_t w, int32_t y,
                       int32_t rstd, int64_t R, int64_t C) {
  mf_pb_rmsnorm_fwd_eps(c, l, what, x, w, y, rstd, R, C, c->s->norm_eps);
}

void mf_pb_rmsnorm_fwd_eps(const ctx *c, int32_t l, const char *what, int32_t x, int32_t w, int32_t y,
                           int32_t rstd, int64_t R, int64_t C, double eps) {
  mf_pop *o = mf_pb_op(c->b, MF_K_RMSNORM_FWD, MF_PHASE_FWD, c->m, l, "L%d %s", l, what);
  SET(o, x, w, y, rstd);
  INTS(o, R, C);
  o->f[0] = eps;
  o->flops = 4.0 * (double)R * (double)C;
}

void mf_pb_rmsnorm_bwd(const ctx *c, int32_t l, const char *what, int32_t dy, int32_t x, int32_t w,
                       int32_t rstd, int32_t dx, int32_t dw, int64_t R, int64_t C, int acc) {
  mf_pop *o = mf_pb_op(c->b, MF_K_RMSNORM_BWD, MF_PHASE_BWD, c->m, l, "L%d %s bwd", l, what);
  SET(o, dy, x, w, rstd, dx, dw);
  INTS(o, R, C, acc);
  o->flops = 8.0 * (double)R * (double)C;
}

void mf_pb_simple(const ctx *c, mf_kernel k, mf_phase ph, int32_t l, const char *what, int32_t a, int32_t bb,
                  int32_t cc, int32_t d, int32_t e, int64_t n) {
  mf_pop *o = mf_pb_op(c->b, k, ph, c->m, l, "L%d %s", l, what);
  SET(o, a, bb, cc, d, e);
  INTS(o, n);
  o->flops = (double)n;
}

void mf_pb_expert_op(const mb *z, mf_kernel k, mf_phase ph, int32_t l, const char *what, int32_t a0,
                     int32_t a1, int32_t a2, int64_t N, int64_t K, int32_t experts_at) {
  mf_pop *o = mf_pb_op(z->b, k, ph, z->m, l, "L%d %s", l, what);
  SET(o, a0, a1, a2);
  INTS(o, z->E, N, K);
  o->experts_at = experts_at;
  if (k == MF_K_EXPERT_BWD_WEIGHT && z->b->p->exchanges) { /* the rows by source rank's part */
    o->t[3] = z->A[l].segs;
    o->i[3] = z->b->p->ep;
  }
  o->flops = 2.0 * (double)(z->T * z->TK) * (double)N * (double)K;
}

void mf_pb_rope(const mb *z, int32_t l, mf_kernel kind, const char *what, int32_t x, int64_t nh, int64_t D,
                int64_t rot, int64_t off) {
  const mf_model_spec *s = z->s;
  mf_pop *o =
      mf_pb_op(z->b, kind, kind == MF_K_ROPE_FWD ? MF_PHASE_FWD : MF_PHASE_BWD, z->m, l, "L%d %s", l, what);
  SET(o, x, z->pos);
  /* truncate: 1 true, -1 false (0 would be transformers' default, true) */
  INTS(o, z->T, nh, D, rot, off, s->rope_interleave, s->yarn_factor > 0 ? (s->yarn_truncate ? 1 : -1) : 0);
  o->f[0] = s->rope_theta;
  if (s->yarn_factor > 0) {
    o->f[1] = s->yarn_factor;
    o->f[2] = (double)s->yarn_original_max;
    o->f[3] = s->yarn_beta_fast;
    o->f[4] = s->yarn_beta_slow;
    o->f[5] = mf_model_spec_yarn_attention_factor(s);
  }
}

double mf_program_loss_divisor(const mf_program *p) {
  return (double)(p->G * p->ranks);
}
