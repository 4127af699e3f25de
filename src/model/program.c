/* Builds the step program (see program.h) and plans its device memory. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "src/model/program.h"

const char *mf_tensor_kind_name(mf_tensor_kind k) {
  static const char *const names[MF_T_KIND_COUNT_] = {"param", "grad", "input", "act", "act_grad", "stat", "work",
                                                              "opt"};
  return ((int)k >= 0 && k < MF_T_KIND_COUNT_) ? names[k] : "unknown";
}

/* ------------------------------------------------------------- building */

typedef struct pb {
  mf_program *p;
  int32_t cap_t, cap_o;
  int64_t cap_pool;
  int32_t stage;     /* the stage of the ops being built (see STAGE_*) */
  int32_t *stage_of; /* [cap_o] each op's stage, for the layer-major reorder */
  /* DEQUANT ops made for the op being built (dequant()): they take its phase
   * when it is made (op()). */
  int32_t *pending;
  int32_t n_pending, cap_pending;
  mf_status st;
} pb;

/* A micro-batch's ops fall into stages, in build order: the embedding's
 * forward, each layer's forward, the loss part, the final norm's backward, each
 * layer's backward (last layer first), the embedding's backward. Layer-major
 * order runs each stage for every micro-batch before the next stage. The
 * final norm's backward is a stage of its own so that the loss part (the
 * lm_head's one use) runs for all micro-batches in one stretch. */
#define STAGE_SETUP (-1)
#define STAGE_EMBED 0
#define STAGE_FWD(l) (1 + (l))
#define STAGE_LOSS(L) ((L) + 1)
#define STAGE_NORM_BWD(L) ((L) + 2)
#define STAGE_BWD(L, l) ((L) + 3 + ((L) - 1 - (l)))
#define STAGE_EMBED_BWD(L) (2 * (L) + 3)

static int32_t tensor(pb *b, mf_tensor_kind kind, mf_dtype dtype, int64_t numel, int32_t micro, int32_t layer,
                      const char *fmt, ...) __attribute__((format(printf, 7, 8)));

static int32_t tensor(pb *b, mf_tensor_kind kind, mf_dtype dtype, int64_t numel, int32_t micro, int32_t layer,
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
static int32_t keep_fp32(pb *b, int32_t t) {
  if (t < 0) return t;
  mf_ptensor *x = &b->p->tensors[t];
  x->dtype = MF_DTYPE_F32;
  x->bytes = (size_t)x->numel * sizeof(float);
  return t;
}

/* A new op; operands default to absent. The pointer is valid until the next op. */
static mf_pop *op(pb *b, mf_kernel kind, mf_phase phase, int32_t micro, int32_t layer, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));

static mf_pop *op(pb *b, mf_kernel kind, mf_phase phase, int32_t micro, int32_t layer, const char *fmt, ...) {
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

static int32_t pool_put(pb *b, const int32_t *ids, int64_t n) {
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

/* Operand shorthands. */
#define SET(o, ...)                                        \
  do {                                                     \
    const int32_t ids_[] = {__VA_ARGS__};                  \
    for (size_t j_ = 0; j_ < sizeof ids_ / sizeof ids_[0]; j_++) (o)->t[j_] = ids_[j_]; \
  } while (0)
#define INTS(o, ...)                                       \
  do {                                                     \
    const int64_t v_[] = {__VA_ARGS__};                    \
    for (size_t j_ = 0; j_ < sizeof v_ / sizeof v_[0]; j_++) (o)->i[j_] = v_[j_]; \
  } while (0)

typedef struct ctx {
  pb *b;
  const mf_param_table *pt;
  const mf_model_spec *s;
  int32_t m;
  int64_t T;
} ctx;

/* Parameter i's weights as an op reads them: its tensor, or for a weight
 * stored quantized (LoRA's base, mf_param_table_quantize_base) a DEQUANT of
 * its blob made just before the op being built, into an activation of the
 * storage dtype that lives until that op has read it (each use its own, so
 * no bf16 copy of the weight outlives an op; a recomputed op recomputes its
 * DEQUANT from the blob). */
static int32_t weight_of(const ctx *c, int32_t i) {
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
  const int32_t y = tensor(b, MF_T_ACT, MF_DTYPE_F32, q->numel, c->m, q->layer, "mb%d.%s.deq%d", c->m, q->name,
                           b->p->n_ops);
  const int32_t k = b->p->n_ops;
  mf_pop *o = op(b, MF_K_DEQUANT, MF_PHASE_FWD, c->m, q->layer, "dequant %s", q->name);
  SET(o, b->p->param_tensor[i], y);
  INTS(o, q->quant, q->shape[0], q->shape[1], c->pt->base_blocksize, c->pt->base_nested);
  if (b->st == MF_OK) b->pending[b->n_pending++] = k;
  return y;
}

static int32_t P(const ctx *c, mf_param_role role, int64_t layer) {
  return weight_of(c, mf_param_index(c->pt, role, layer, -1));
}
static int32_t G(const ctx *c, mf_param_role role, int64_t layer) {
  int32_t i = mf_param_index(c->pt, role, layer, -1);
  return i < 0 ? -1 : c->b->p->grad_tensor[i];
}

/* The id pool entry of layer `layer`'s routed experts' weights of `role`
 * (lora -1), or of their LoRA adapters' A (lora 0) or B (lora 1): their
 * parameter tensors, or with grads their gradients. */
static int32_t experts_of(const ctx *c, mf_param_role role, int64_t layer, int grads, int lora) {
  const int64_t E = c->s->experts;
  int32_t *ids = (int32_t *)malloc((size_t)E * sizeof *ids);
  if (!ids) {
    if (c->b->st == MF_OK) c->b->st = MF_ERR(MF_ERR_OUT_OF_MEMORY, "step program: out of memory");
    return -1;
  }
  for (int64_t e = 0; e < E; e++) {
    int32_t pi = mf_param_index(c->pt, role, layer, e);
    if (lora >= 0) pi = c->pt->lora_a[pi] < 0 ? -1 : c->pt->lora_a[pi] + lora; /* -1: a cold expert */
    ids[e] = pi < 0 ? -1 : grads ? c->b->p->grad_tensor[pi] : weight_of(c, pi);
  }
  int32_t at = pool_put(c->b, ids, E);
  free(ids);
  return at;
}

/* Layer l's routed experts' weights of `role` are frozen (LoRA's base). */
static int experts_frozen(const ctx *c, mf_param_role role, int64_t layer) {
  return c->pt->params[mf_param_index(c->pt, role, layer, 0)].frozen;
}

static void linear_fwd(const ctx *c, int32_t l, const char *what, int32_t x, int32_t W, int32_t bias, int32_t y,
                       int64_t N, int64_t K, int acc) {
  mf_pop *o = op(c->b, MF_K_LINEAR_FWD, MF_PHASE_FWD, c->m, l, "L%d %s", l, what);
  SET(o, x, W, bias, y);
  INTS(o, c->T, N, K, acc);
  o->flops = 2.0 * (double)c->T * (double)N * (double)K;
}

/* dW (+ db) and dx for y = x W^T (+ b): weight gradient first, then data. */
static void linear_bwd(const ctx *c, int32_t l, const char *what, int32_t dy, int32_t x, int32_t W, int32_t dW,
                       int32_t db, int32_t dx, int64_t N, int64_t K, int acc) {
  mf_pop *o;
  if (dW >= 0) { /* else a frozen weight (LoRA's base): no gradient */
    o = op(c->b, MF_K_LINEAR_BWD_WEIGHT, MF_PHASE_BWD, c->m, l, "L%d %s dW", l, what);
    SET(o, dy, x, dW, db);
    INTS(o, c->T, N, K);
    o->flops = 2.0 * (double)c->T * (double)N * (double)K;
  }
  if (dx < 0) return;
  o = op(c->b, MF_K_LINEAR_BWD_DATA, MF_PHASE_BWD, c->m, l, "L%d %s dx", l, what);
  SET(o, dy, W, dx);
  INTS(o, c->T, N, K, acc);
  o->flops = 2.0 * (double)c->T * (double)N * (double)K;
}

static void rmsnorm_fwd(const ctx *c, int32_t l, const char *what, int32_t x, int32_t w, int32_t y, int32_t rstd,
                        int64_t R, int64_t C) {
  mf_pop *o = op(c->b, MF_K_RMSNORM_FWD, MF_PHASE_FWD, c->m, l, "L%d %s", l, what);
  SET(o, x, w, y, rstd);
  INTS(o, R, C);
  o->f[0] = c->s->norm_eps;
  o->flops = 4.0 * (double)R * (double)C;
}

static void rmsnorm_bwd(const ctx *c, int32_t l, const char *what, int32_t dy, int32_t x, int32_t w, int32_t rstd,
                        int32_t dx, int32_t dw, int64_t R, int64_t C, int acc) {
  mf_pop *o = op(c->b, MF_K_RMSNORM_BWD, MF_PHASE_BWD, c->m, l, "L%d %s bwd", l, what);
  SET(o, dy, x, w, rstd, dx, dw);
  INTS(o, R, C, acc);
  o->flops = 8.0 * (double)R * (double)C;
}

static void simple(const ctx *c, mf_kernel k, mf_phase ph, int32_t l, const char *what, int32_t a, int32_t bb,
                   int32_t cc, int32_t d, int32_t e, int64_t n) {
  mf_pop *o = op(c->b, k, ph, c->m, l, "L%d %s", l, what);
  SET(o, a, bb, cc, d, e);
  INTS(o, n);
  o->flops = (double)n;
}

/* Names of per-micro-batch tensors: "mb0.model.layers.3.self_attn.q". */
#define LNAME "mb%d.model.layers.%d."

/* A layer's forward activations, kept for its backward. */
typedef struct layer_acts {
  int32_t xn1, rstd1, q, k, v, qn, kn, qr, kr, qa, ka, att, lse, hmid, xn2, rstd2;
  int32_t rl, probs, tki, tkw, counts, offsets, row_of, tor, xe, eg, eu, ea, ey;
  int32_t sg, su, sa, sy, sgl, dg, du, da;
  int32_t lora[MF_P_ROLE_COUNT_];    /* the LoRA adapter's scaled x A^T of each adapted weight of the layer */
  int32_t lora_in[MF_P_ROLE_COUNT_]; /* with dropout: the adapter's input after it */
} layer_acts;

/* One micro-batch's build: its sizes, the residual stream and each layer's
 * activations, the aux-loss statistics. */
typedef struct mb {
  pb *b;
  const ctx *c;
  const mf_model_spec *s;
  int32_t m, pos;
  int64_t B, S, T, H, D, Hq, Hkv, E, TK, I, V;
  float scale;
  int32_t aux_counts, aux_psum;
  int64_t aux_rows;
  int32_t *resid;         /* [L + 1] the residual stream into each layer, and out of the last */
  layer_acts *A;          /* [L] */
  int32_t hf, rstdf, dhf; /* the final norm's output, its rstd, the output's gradient */
} mb;

/* ------------------------------------------------------------------ LoRA
 *
 * An adapted weight W [N, K] (params.h mf_lora) adds s (x A^T) B^T to its
 * output, s = alpha / rank:
 *   forward   a = x A^T [T, r];  a *= s;  y += a B^T
 *   backward  dB += dy^T a;  da = dy B;  da *= s;  dA += da^T x;  dx += da A
 * (a is kept for the backward, already scaled, so dB is s dy^T (x A^T) as
 * PEFT's). The base's own ops run first (their dW skipped: it is frozen), so
 * the adapter's only adds into what they wrote. Routed experts: the same over
 * the layer's dispatch permutation, a second pair of grouped GEMMs with each
 * expert's A and B, added into the experts' output (and input gradient). */

/* The A adapter of layer l's weight of `role` (expert e, else -1), or -1 when it has none (B is the next). */
static int32_t lora_a(const ctx *c, mf_param_role role, int64_t l, int64_t e) {
  const mf_param_table *t = c->pt;
  if (!t->lora_a) return -1;
  const int32_t i = mf_param_index(t, role, l, e);
  return i < 0 ? -1 : t->lora_a[i];
}

/* The adapters' input dropout (training only): y = dropout(x) over n
 * elements, the mask drawn from the micro-batch's seed (set at run time) and
 * a stream of the layer, the role and the routed experts or not, so a
 * backward's call draws its forward's mask. */
static int lora_drops(const mb *z) {
  return z->c->pt->lora.dropout > 0 && !z->b->p->forward_only;
}
static void lora_dropout(const mb *z, int32_t l, mf_param_role role, const char *what, int32_t x, int32_t y,
                         int64_t n, mf_phase ph) {
  mf_pop *o = op(z->b, MF_K_DROPOUT, ph, z->m, l, "L%d %s dropout", l, what);
  SET(o, x, y);
  INTS(o, n, (int64_t)(l + 1) * MF_P_ROLE_COUNT_ + role, MF_PROGRAM_SEED_RUNTIME);
  o->f[0] = z->c->pt->lora.dropout;
  o->flops = (double)n;
}

/* x *= s (the adapters' scale; nothing when it is 1). */
static void lora_scale(const mb *z, int32_t l, const char *what, int32_t x, int64_t n, mf_phase ph) {
  const double s = z->c->pt->lora.scale;
  if (s == 1.0) return;
  mf_pop *o = op(z->b, MF_K_SCALE, ph, z->m, l, "L%d %s scale", l, what);
  SET(o, x);
  INTS(o, n);
  o->f[0] = s;
  o->flops = (double)n;
}

/* Weight `role` of layer l, y (+)= x W^T [T, N] done: its adapter's part added. */
static void lora_fwd(const mb *z, int32_t l, mf_param_role role, const char *what, int32_t x, int32_t y,
                     int64_t N, int64_t K) {
  const ctx *c = z->c;
  const int32_t ia = lora_a(c, role, l, -1);
  if (ia < 0) return;
  const int64_t r = c->pt->lora.rank;
  const mf_program *p = z->b->p;
  int32_t a = tensor(z->b, MF_T_ACT, MF_DTYPE_F32, z->T * r, z->m, l, LNAME "%s.lora_A.out", z->m, l, what);
  char lab[48];
  snprintf(lab, sizeof lab, "%s lora_A", what);
  if (lora_drops(z)) {
    const int32_t xd =
        tensor(z->b, MF_T_ACT, MF_DTYPE_F32, z->T * K, z->m, l, LNAME "%s.lora_A.in", z->m, l, what);
    lora_dropout(z, l, role, lab, x, xd, z->T * K, MF_PHASE_FWD);
    z->A[l].lora_in[role] = x = xd;
  }
  linear_fwd(c, l, lab, x, p->param_tensor[ia], -1, a, r, K, 0);
  lora_scale(z, l, lab, a, z->T * r, MF_PHASE_FWD);
  snprintf(lab, sizeof lab, "%s lora_B", what);
  linear_fwd(c, l, lab, a, p->param_tensor[ia + 1], -1, y, N, r, 1);
  z->A[l].lora[role] = a;
}

/* Its backward, after the base's (which wrote or added dx [T, K]). */
static void lora_bwd(const mb *z, int32_t l, mf_param_role role, const char *what, int32_t dy, int32_t x,
                     int32_t dx, int64_t N, int64_t K) {
  const ctx *c = z->c;
  const int32_t ia = lora_a(c, role, l, -1);
  if (ia < 0) return;
  const int64_t r = c->pt->lora.rank;
  const mf_program *p = z->b->p;
  int32_t da =
      tensor(z->b, MF_T_ACT_GRAD, MF_DTYPE_F32, z->T * r, z->m, l, LNAME "%s.lora_A.out.grad", z->m, l, what);
  char lab[48];
  snprintf(lab, sizeof lab, "%s lora_B", what);
  linear_bwd(c, l, lab, dy, z->A[l].lora[role], p->param_tensor[ia + 1], p->grad_tensor[ia + 1], -1, da, N, r,
             0);
  snprintf(lab, sizeof lab, "%s lora_A", what);
  lora_scale(z, l, lab, da, z->T * r, MF_PHASE_BWD);
  if (!lora_drops(z)) {
    linear_bwd(c, l, lab, da, x, p->param_tensor[ia], p->grad_tensor[ia], -1, dx, r, K, 1);
    return;
  }
  /* dA from the dropped input; dx through the same mask */
  linear_bwd(c, l, lab, da, z->A[l].lora_in[role], p->param_tensor[ia], p->grad_tensor[ia], -1, -1, r, K, 0);
  const int32_t t0 =
      tensor(z->b, MF_T_ACT_GRAD, MF_DTYPE_F32, z->T * K, z->m, l, LNAME "%s.lora_A.in.grad", z->m, l, what);
  const int32_t t1 = tensor(z->b, MF_T_ACT_GRAD, MF_DTYPE_F32, z->T * K, z->m, l,
                            LNAME "%s.lora_A.in.grad_kept", z->m, l, what);
  linear_bwd(c, l, lab, da, x, p->param_tensor[ia], -1, -1, t0, r, K, 0);
  lora_dropout(z, l, role, lab, t0, t1, z->T * K, MF_PHASE_BWD);
  simple(c, MF_K_ADD, MF_PHASE_BWD, l, lab, t1, dx, -1, -1, -1, z->T * K);
}

/* The id pool entry of layer l's experts' adapters of `role`: A's (b = 0) or
 * B's (b = 1) parameter (grads: gradient) tensors, -1 for a cold expert's
 * (train.lora.experts: hot; the kernels give its rows zeros); -1 when no
 * expert of the layer is adapted. */
static int32_t lora_experts_of(const ctx *c, mf_param_role role, int64_t l, int b, int grads) {
  for (int64_t e = 0; e < c->s->experts; e++)
    if (lora_a(c, role, l, e) >= 0) return experts_of(c, role, l, grads, b);
  return -1;
}

static void expert_op(const mb *z, mf_kernel k, mf_phase ph, int32_t l, const char *what, int32_t a0,
                      int32_t a1, int32_t a2, int64_t N, int64_t K, int32_t experts_at) {
  mf_pop *o = op(z->b, k, ph, z->m, l, "L%d %s", l, what);
  SET(o, a0, a1, a2);
  INTS(o, z->E, N, K);
  o->experts_at = experts_at;
  o->flops = 2.0 * (double)(z->T * z->TK) * (double)N * (double)K;
}

/* The routed experts' projection `role` (xe [R, K] -> y [R, N]) done: the
 * adapters' part added, over the same permutation. */
static void lora_experts_fwd(const mb *z, int32_t l, mf_param_role role, const char *what, int32_t x,
                             int32_t y, int64_t N, int64_t K) {
  const ctx *c = z->c;
  const int32_t at_a = lora_experts_of(c, role, l, 0, 0);
  if (at_a < 0) return;
  const int32_t at_b = lora_experts_of(c, role, l, 1, 0);
  const int64_t r = c->pt->lora.rank, R = z->T * z->TK;
  const int32_t offsets = z->A[l].offsets;
  int32_t a =
      tensor(z->b, MF_T_ACT, MF_DTYPE_F32, R * r, z->m, l, LNAME "mlp.experts.%s.lora_A.out", z->m, l, what);
  int32_t u =
      tensor(z->b, MF_T_ACT, MF_DTYPE_F32, R * N, z->m, l, LNAME "mlp.experts.%s.lora_B.out", z->m, l, what);
  char lab[48];
  snprintf(lab, sizeof lab, "experts %s lora_A", what);
  if (lora_drops(z)) {
    const int32_t xd =
        tensor(z->b, MF_T_ACT, MF_DTYPE_F32, R * K, z->m, l, LNAME "mlp.experts.%s.lora_A.in", z->m, l, what);
    lora_dropout(z, l, role, lab, x, xd, R * K, MF_PHASE_FWD);
    z->A[l].lora_in[role] = x = xd;
  }
  expert_op(z, MF_K_EXPERT_FWD, MF_PHASE_FWD, l, lab, x, offsets, a, r, K, at_a);
  lora_scale(z, l, lab, a, R * r, MF_PHASE_FWD);
  snprintf(lab, sizeof lab, "experts %s lora_B", what);
  expert_op(z, MF_K_EXPERT_FWD, MF_PHASE_FWD, l, lab, a, offsets, u, N, r, at_b);
  simple(c, MF_K_ADD, MF_PHASE_FWD, l, lab, u, y, -1, -1, -1, R * N);
  z->A[l].lora[role] = a;
}

/* Its backward, after the base's data gradient (dx [R, K] written). */
static void lora_experts_bwd(const mb *z, int32_t l, mf_param_role role, const char *what, int32_t dy,
                             int32_t x, int32_t dx, int64_t N, int64_t K) {
  const ctx *c = z->c;
  const int32_t at_a = lora_experts_of(c, role, l, 0, 0);
  if (at_a < 0) return;
  const int32_t at_b = lora_experts_of(c, role, l, 1, 0);
  const int32_t ga = lora_experts_of(c, role, l, 0, 1), gb = lora_experts_of(c, role, l, 1, 1);
  const int64_t r = c->pt->lora.rank, R = z->T * z->TK;
  const int32_t offsets = z->A[l].offsets;
  int32_t da = tensor(z->b, MF_T_ACT_GRAD, MF_DTYPE_F32, R * r, z->m, l,
                      LNAME "mlp.experts.%s.lora_A.out.grad", z->m, l, what);
  int32_t dxa = tensor(z->b, MF_T_ACT_GRAD, MF_DTYPE_F32, R * K, z->m, l,
                       LNAME "mlp.experts.%s.lora_A.in.grad", z->m, l, what);
  char lab[48];
  snprintf(lab, sizeof lab, "experts %s lora_B dW", what);
  expert_op(z, MF_K_EXPERT_BWD_WEIGHT, MF_PHASE_BWD, l, lab, dy, z->A[l].lora[role], offsets, N, r, gb);
  snprintf(lab, sizeof lab, "experts %s lora_B dx", what);
  expert_op(z, MF_K_EXPERT_BWD_DATA, MF_PHASE_BWD, l, lab, dy, offsets, da, N, r, at_b);
  lora_scale(z, l, lab, da, R * r, MF_PHASE_BWD);
  snprintf(lab, sizeof lab, "experts %s lora_A dW", what);
  expert_op(z, MF_K_EXPERT_BWD_WEIGHT, MF_PHASE_BWD, l, lab, da, lora_drops(z) ? z->A[l].lora_in[role] : x,
            offsets, r, K, ga);
  snprintf(lab, sizeof lab, "experts %s lora_A dx", what);
  expert_op(z, MF_K_EXPERT_BWD_DATA, MF_PHASE_BWD, l, lab, da, offsets, dxa, r, K, at_a);
  if (lora_drops(z)) { /* through the forward's mask */
    const int32_t kept = tensor(z->b, MF_T_ACT_GRAD, MF_DTYPE_F32, R * K, z->m, l,
                                LNAME "mlp.experts.%s.lora_A.in.grad_kept", z->m, l, what);
    lora_dropout(z, l, role, lab, dxa, kept, R * K, MF_PHASE_BWD);
    dxa = kept;
  }
  simple(c, MF_K_ADD, MF_PHASE_BWD, l, lab, dxa, dx, -1, -1, -1, R * K);
}

/* Layer l's attention block and its norms; the layer's output zeroed for the MLP to add into. */
static void fwd_attention(const mb *z, int32_t l) {
  pb *b = z->b;
  const ctx *c = z->c;
  const mf_model_spec *s = z->s;
  const int32_t m = z->m, pos = z->pos;
  const int64_t B = z->B, S = z->S, T = z->T, H = z->H, D = z->D, Hq = z->Hq, Hkv = z->Hkv;
  int32_t *resid = z->resid;
  layer_acts *a = &z->A[l];
  a->xn1 = tensor(b, MF_T_ACT, MF_DTYPE_F32, T * H, m, l, LNAME "input_layernorm.out", m, l);
  a->rstd1 = tensor(b, MF_T_STAT, MF_DTYPE_F32, T, m, l, LNAME "input_layernorm.rstd", m, l);
  rmsnorm_fwd(c, l, "input_layernorm", resid[l], P(c, MF_P_ATTN_NORM, l), a->xn1, a->rstd1, T, H);
  a->q = tensor(b, MF_T_ACT, MF_DTYPE_F32, T * Hq * D, m, l, LNAME "self_attn.q", m, l);
  a->k = tensor(b, MF_T_ACT, MF_DTYPE_F32, T * Hkv * D, m, l, LNAME "self_attn.k", m, l);
  a->v = tensor(b, MF_T_ACT, MF_DTYPE_F32, T * Hkv * D, m, l, LNAME "self_attn.v", m, l);
  linear_fwd(c, l, "q_proj", a->xn1, P(c, MF_P_Q, l), P(c, MF_P_Q_BIAS, l), a->q, Hq * D, H, 0);
  linear_fwd(c, l, "k_proj", a->xn1, P(c, MF_P_K, l), P(c, MF_P_K_BIAS, l), a->k, Hkv * D, H, 0);
  linear_fwd(c, l, "v_proj", a->xn1, P(c, MF_P_V, l), P(c, MF_P_V_BIAS, l), a->v, Hkv * D, H, 0);
  lora_fwd(z, l, MF_P_Q, "self_attn.q_proj", a->xn1, a->q, Hq * D, H);
  lora_fwd(z, l, MF_P_K, "self_attn.k_proj", a->xn1, a->k, Hkv * D, H);
  lora_fwd(z, l, MF_P_V, "self_attn.v_proj", a->xn1, a->v, Hkv * D, H);
  a->qa = a->q;
  a->ka = a->k;
  if (s->qk_norm != MF_QK_NORM_NONE) {
    const int per_head = s->qk_norm == MF_QK_NORM_PER_HEAD;
    const int64_t Rq = per_head ? T * Hq : T, Cq = per_head ? D : Hq * D;
    const int64_t Rk = per_head ? T * Hkv : T, Ck = per_head ? D : Hkv * D;
    a->qn = tensor(b, MF_T_ACT, MF_DTYPE_F32, T * Hq * D, m, l, LNAME "self_attn.q_norm.out", m, l);
    a->kn = tensor(b, MF_T_ACT, MF_DTYPE_F32, T * Hkv * D, m, l, LNAME "self_attn.k_norm.out", m, l);
    a->qr = tensor(b, MF_T_STAT, MF_DTYPE_F32, Rq, m, l, LNAME "self_attn.q_norm.rstd", m, l);
    a->kr = tensor(b, MF_T_STAT, MF_DTYPE_F32, Rk, m, l, LNAME "self_attn.k_norm.rstd", m, l);
    rmsnorm_fwd(c, l, "q_norm", a->q, P(c, MF_P_Q_NORM, l), a->qn, a->qr, Rq, Cq);
    rmsnorm_fwd(c, l, "k_norm", a->k, P(c, MF_P_K_NORM, l), a->kn, a->kr, Rk, Ck);
    a->qa = a->qn;
    a->ka = a->kn;
  }
  mf_pop *o = op(b, MF_K_ROPE_FWD, MF_PHASE_FWD, m, l, "L%d rope q", l);
  SET(o, a->qa, pos);
  INTS(o, T, Hq, D);
  o->f[0] = s->rope_theta;
  o = op(b, MF_K_ROPE_FWD, MF_PHASE_FWD, m, l, "L%d rope k", l);
  SET(o, a->ka, pos);
  INTS(o, T, Hkv, D);
  o->f[0] = s->rope_theta;
  a->att = tensor(b, MF_T_ACT, MF_DTYPE_F32, T * Hq * D, m, l, LNAME "self_attn.attn_out", m, l);
  a->lse = tensor(b, MF_T_STAT, MF_DTYPE_F32, B * Hq * S, m, l, LNAME "self_attn.lse", m, l);
  o = op(b, MF_K_ATTN_FWD, MF_PHASE_FWD, m, l, "L%d attention", l);
  SET(o, a->qa, a->ka, a->v, a->att, a->lse);
  INTS(o, B, S, Hq, Hkv, D);
  o->f[0] = z->scale;
  o->flops = 2.0 * 2.0 * (double)B * (double)Hq * (double)D * (double)S * (double)(S + 1) / 2.0;
  a->hmid = tensor(b, MF_T_ACT, MF_DTYPE_F32, T * H, m, l, LNAME "self_attn.residual_out", m, l);
  linear_fwd(c, l, "o_proj", a->att, P(c, MF_P_O, l), -1, a->hmid, H, Hq * D, 0);
  lora_fwd(z, l, MF_P_O, "self_attn.o_proj", a->att, a->hmid, H, Hq * D);
  simple(c, MF_K_ADD, MF_PHASE_FWD, l, "attn residual", resid[l], a->hmid, -1, -1, -1, T * H);
  a->xn2 = tensor(b, MF_T_ACT, MF_DTYPE_F32, T * H, m, l, LNAME "post_attention_layernorm.out", m, l);
  a->rstd2 = tensor(b, MF_T_STAT, MF_DTYPE_F32, T, m, l, LNAME "post_attention_layernorm.rstd", m, l);
  rmsnorm_fwd(c, l, "post_attention_layernorm", a->hmid, P(c, MF_P_MLP_NORM, l), a->xn2, a->rstd2, T, H);
  resid[l + 1] = tensor(b, MF_T_ACT, MF_DTYPE_F32, T * H, m, l, LNAME "out", m, l);
  simple(c, MF_K_ZERO, MF_PHASE_FWD, l, "mlp out = 0", resid[l + 1], -1, -1, -1, -1, T * H);
}

/* Layer l's routed experts (and shared expert), added into the layer's output. */
static void fwd_moe(const mb *z, int32_t l) {
  pb *b = z->b;
  const ctx *c = z->c;
  const mf_model_spec *s = z->s;
  const int32_t m = z->m;
  const int64_t T = z->T, H = z->H, E = z->E, TK = z->TK, I = z->I;
  int32_t *resid = z->resid;
  layer_acts *a = &z->A[l];
  const int32_t aux_counts = z->aux_counts, aux_psum = z->aux_psum;
  mf_pop *o;
  const int64_t R = T * TK;
  a->rl = tensor(b, MF_T_ACT, MF_DTYPE_F32, T * E, m, l, LNAME "mlp.router_logits", m, l);
  linear_fwd(c, l, "router", a->xn2, P(c, MF_P_ROUTER, l), -1, a->rl, E, H, 0);
  a->probs = tensor(b, MF_T_STAT, MF_DTYPE_F32, T * E, m, l, LNAME "mlp.router_probs", m, l);
  a->tki = tensor(b, MF_T_STAT, MF_DTYPE_I32, T * TK, m, l, LNAME "mlp.topk_idx", m, l);
  a->tkw = tensor(b, MF_T_STAT, MF_DTYPE_F32, T * TK, m, l, LNAME "mlp.topk_w", m, l);
  o = op(b, MF_K_ROUTER_FWD, MF_PHASE_FWD, m, l, "L%d router top-k", l);
  SET(o, a->rl, a->probs, a->tki, a->tkw);
  INTS(o, T, E, TK, s->norm_topk_prob);
  o = op(b, MF_K_AUX_ACCUMULATE, MF_PHASE_FWD, m, l, "L%d aux stats", l);
  SET(o, a->probs, a->tki, aux_counts, aux_psum);
  INTS(o, T, E, TK);
  a->counts = tensor(b, MF_T_STAT, MF_DTYPE_I64, E, m, l, LNAME "mlp.expert_counts", m, l);
  a->offsets = tensor(b, MF_T_STAT, MF_DTYPE_I64, E + 1, m, l, LNAME "mlp.expert_offsets", m, l);
  a->row_of = tensor(b, MF_T_STAT, MF_DTYPE_I32, R, m, l, LNAME "mlp.row_of", m, l);
  a->tor = tensor(b, MF_T_STAT, MF_DTYPE_I32, R, m, l, LNAME "mlp.token_of_row", m, l);
  o = op(b, MF_K_MOE_DISPATCH, MF_PHASE_FWD, m, l, "L%d dispatch", l);
  SET(o, a->tki, a->counts, a->offsets, a->row_of, a->tor);
  INTS(o, T, TK, E);
  a->xe = tensor(b, MF_T_ACT, MF_DTYPE_F32, R * H, m, l, LNAME "mlp.experts.in", m, l);
  o = op(b, MF_K_MOE_GATHER, MF_PHASE_FWD, m, l, "L%d gather", l);
  SET(o, a->xn2, a->tor, a->xe);
  INTS(o, R, H);
  a->eg = tensor(b, MF_T_ACT, MF_DTYPE_F32, R * I, m, l, LNAME "mlp.experts.gate", m, l);
  a->eu = tensor(b, MF_T_ACT, MF_DTYPE_F32, R * I, m, l, LNAME "mlp.experts.up", m, l);
  a->ea = tensor(b, MF_T_ACT, MF_DTYPE_F32, R * I, m, l, LNAME "mlp.experts.act", m, l);
  a->ey = tensor(b, MF_T_ACT, MF_DTYPE_F32, R * H, m, l, LNAME "mlp.experts.out", m, l);
  const struct {
    mf_param_role role;
    int32_t in, out;
    int64_t N, K;
    const char *what, *hf;
  } proj[3] = {{MF_P_EXPERT_GATE, a->xe, a->eg, I, H, "experts gate_proj", "gate_proj"},
               {MF_P_EXPERT_UP, a->xe, a->eu, I, H, "experts up_proj", "up_proj"},
               {MF_P_EXPERT_DOWN, a->ea, a->ey, H, I, "experts down_proj", "down_proj"}};
  for (int j = 0; j < 3; j++) {
    if (j == 2)
      simple(c, MF_K_SWIGLU_FWD, MF_PHASE_FWD, l, "experts swiglu", a->eg, a->eu, a->ea, -1, -1, R * I);
    int32_t at = experts_of(c, proj[j].role, l, 0, -1);
    o = op(b, MF_K_EXPERT_FWD, MF_PHASE_FWD, m, l, "L%d %s", l, proj[j].what);
    SET(o, proj[j].in, a->offsets, proj[j].out);
    INTS(o, E, proj[j].N, proj[j].K);
    o->experts_at = at;
    o->flops = 2.0 * (double)R * (double)proj[j].N * (double)proj[j].K;
    lora_experts_fwd(z, l, proj[j].role, proj[j].hf, proj[j].in, proj[j].out, proj[j].N, proj[j].K);
  }
  o = op(b, MF_K_MOE_COMBINE, MF_PHASE_FWD, m, l, "L%d combine", l);
  SET(o, a->ey, a->tkw, a->row_of, resid[l + 1]);
  INTS(o, T, TK, H);
  if (s->shared_ffn > 0) {
    const int64_t Is = s->shared_ffn;
    a->sg = tensor(b, MF_T_ACT, MF_DTYPE_F32, T * Is, m, l, LNAME "mlp.shared_expert.gate", m, l);
    a->su = tensor(b, MF_T_ACT, MF_DTYPE_F32, T * Is, m, l, LNAME "mlp.shared_expert.up", m, l);
    a->sa = tensor(b, MF_T_ACT, MF_DTYPE_F32, T * Is, m, l, LNAME "mlp.shared_expert.act", m, l);
    a->sy = tensor(b, MF_T_ACT, MF_DTYPE_F32, T * H, m, l, LNAME "mlp.shared_expert.out", m, l);
    a->sgl = tensor(b, MF_T_ACT, MF_DTYPE_F32, T, m, l, LNAME "mlp.shared_expert_gate.out", m, l);
    linear_fwd(c, l, "shared gate_proj", a->xn2, P(c, MF_P_SHARED_GATE, l), -1, a->sg, Is, H, 0);
    lora_fwd(z, l, MF_P_SHARED_GATE, "mlp.shared_expert.gate_proj", a->xn2, a->sg, Is, H);
    linear_fwd(c, l, "shared up_proj", a->xn2, P(c, MF_P_SHARED_UP, l), -1, a->su, Is, H, 0);
    lora_fwd(z, l, MF_P_SHARED_UP, "mlp.shared_expert.up_proj", a->xn2, a->su, Is, H);
    simple(c, MF_K_SWIGLU_FWD, MF_PHASE_FWD, l, "shared swiglu", a->sg, a->su, a->sa, -1, -1, T * Is);
    linear_fwd(c, l, "shared down_proj", a->sa, P(c, MF_P_SHARED_DOWN, l), -1, a->sy, H, Is, 0);
    lora_fwd(z, l, MF_P_SHARED_DOWN, "mlp.shared_expert.down_proj", a->sa, a->sy, H, Is);
    linear_fwd(c, l, "shared_expert_gate", a->xn2, P(c, MF_P_SHARED_EXPERT_GATE, l), -1, a->sgl, 1, H, 0);
    o = op(b, MF_K_SIGGATE_FWD, MF_PHASE_FWD, m, l, "L%d shared gate", l);
    SET(o, a->sgl, a->sy, resid[l + 1]);
    INTS(o, T, H);
  }
}

/* Layer l's dense MLP, written into the layer's output. */
static void fwd_dense(const mb *z, int32_t l) {
  pb *b = z->b;
  const ctx *c = z->c;
  const mf_model_spec *s = z->s;
  const int32_t m = z->m;
  const int64_t T = z->T, H = z->H;
  int32_t *resid = z->resid;
  layer_acts *a = &z->A[l];
  const int64_t Id = s->dense_ffn;
  a->dg = tensor(b, MF_T_ACT, MF_DTYPE_F32, T * Id, m, l, LNAME "mlp.gate", m, l);
  a->du = tensor(b, MF_T_ACT, MF_DTYPE_F32, T * Id, m, l, LNAME "mlp.up", m, l);
  a->da = tensor(b, MF_T_ACT, MF_DTYPE_F32, T * Id, m, l, LNAME "mlp.act", m, l);
  linear_fwd(c, l, "gate_proj", a->xn2, P(c, MF_P_DENSE_GATE, l), -1, a->dg, Id, H, 0);
  lora_fwd(z, l, MF_P_DENSE_GATE, "mlp.gate_proj", a->xn2, a->dg, Id, H);
  linear_fwd(c, l, "up_proj", a->xn2, P(c, MF_P_DENSE_UP, l), -1, a->du, Id, H, 0);
  lora_fwd(z, l, MF_P_DENSE_UP, "mlp.up_proj", a->xn2, a->du, Id, H);
  simple(c, MF_K_SWIGLU_FWD, MF_PHASE_FWD, l, "swiglu", a->dg, a->du, a->da, -1, -1, T * Id);
  linear_fwd(c, l, "down_proj", a->da, P(c, MF_P_DENSE_DOWN, l), -1, resid[l + 1], H, Id, 1);
  lora_fwd(z, l, MF_P_DENSE_DOWN, "mlp.down_proj", a->da, resid[l + 1], H, Id);
}

/* The final norm, the aux loss's value and the cross-entropy. */
static void fwd_loss(mb *z) {
  pb *b = z->b;
  const ctx *c = z->c;
  mf_program *p = b->p;
  const mf_param_table *pt = c->pt;
  const int32_t m = z->m;
  const int64_t T = z->T, H = z->H, E = z->E, V = z->V, L = z->s->layers;
  mf_program_io *io = &p->io[m];
  int32_t hf = tensor(b, MF_T_ACT, MF_DTYPE_F32, T * H, m, -1, "mb%d.model.norm.out", m);
  int32_t rstdf = tensor(b, MF_T_STAT, MF_DTYPE_F32, T, m, -1, "mb%d.model.norm.rstd", m);
  rmsnorm_fwd(c, -1, "final norm", z->resid[L], P(c, MF_P_FINAL_NORM, -1), hf, rstdf, T, H);
  if (z->aux_counts >= 0) {
    mf_pop *o = op(b, MF_K_AUX_VALUE, MF_PHASE_LOSS, m, -1, "aux loss");
    SET(o, z->aux_counts, z->aux_psum, io->aux_scalars);
    INTS(o, E, z->aux_rows);
  } else {
    simple(c, MF_K_ZERO, MF_PHASE_LOSS, -1, "aux loss = 0", io->aux_scalars, -1, -1, -1, -1, 1);
  }
  const int64_t chunk = p->ce_chunk < V ? p->ce_chunk : V;
  int32_t ce_ws = tensor(b, MF_T_WORK, MF_DTYPE_F32, T * chunk, m, -1, "mb%d.loss.workspace", m);
  int32_t ce_lse = tensor(b, MF_T_STAT, MF_DTYPE_F32, T, m, -1, "mb%d.loss.lse", m);
  io->final_hidden = hf;
  int32_t dhf = p->forward_only
                    ? -1
                    : tensor(b, MF_T_ACT_GRAD, MF_DTYPE_F32, T * H, m, -1, "mb%d.model.norm.out.grad", m);
  {
    const int32_t lm = mf_param_lm_head(pt);
    io->ce_op = p->n_ops;
    mf_pop *o = op(b, MF_K_CROSS_ENTROPY, MF_PHASE_LOSS, m, -1, "cross-entropy");
    SET(o, hf, p->param_tensor[lm], io->targets, ce_ws, ce_lse, io->ce_scalars, p->forward_only ? -1 : dhf,
        p->forward_only ? -1 : p->grad_tensor[lm]);
    INTS(o, T, V, H, chunk);
    o->f[0] = MF_PROGRAM_LOSS_SCALE_RUNTIME;
    o->flops = 4.0 * 2.0 * (double)T * (double)V * (double)H; /* two logit passes + two gradient GEMMs */
  }
  z->hf = hf;
  z->rstdf = rstdf;
  z->dhf = dhf;
}

/* Layer l's routed experts (and shared expert) backward: into dxn2, the
 * gradient of the post-attention norm's output. */
static void bwd_moe(const mb *z, int32_t l, int32_t gres, int32_t dxn2) {
  pb *b = z->b;
  const ctx *c = z->c;
  const mf_model_spec *s = z->s;
  const mf_program *p = b->p;
  const int32_t m = z->m;
  const int64_t T = z->T, H = z->H, E = z->E, TK = z->TK, I = z->I;
  const layer_acts *a = &z->A[l];
  const int32_t aux_counts = z->aux_counts;
  const int64_t aux_rows = z->aux_rows;
  mf_pop *o;
  const int64_t R = T * TK;
  int32_t dye = tensor(b, MF_T_ACT_GRAD, MF_DTYPE_F32, R * H, m, l, LNAME "mlp.experts.out.grad", m, l);
  int32_t dtkw = tensor(b, MF_T_ACT_GRAD, MF_DTYPE_F32, T * TK, m, l, LNAME "mlp.topk_w.grad", m, l);
  o = op(b, MF_K_MOE_COMBINE_BWD, MF_PHASE_BWD, m, l, "L%d combine bwd", l);
  SET(o, gres, a->ey, a->tkw, a->row_of, dye, dtkw);
  INTS(o, T, TK, H);
  int32_t dea = tensor(b, MF_T_ACT_GRAD, MF_DTYPE_F32, R * I, m, l, LNAME "mlp.experts.act.grad", m, l);
  int32_t deg = tensor(b, MF_T_ACT_GRAD, MF_DTYPE_F32, R * I, m, l, LNAME "mlp.experts.gate.grad", m, l);
  int32_t deu = tensor(b, MF_T_ACT_GRAD, MF_DTYPE_F32, R * I, m, l, LNAME "mlp.experts.up.grad", m, l);
  int32_t dxe = tensor(b, MF_T_ACT_GRAD, MF_DTYPE_F32, R * H, m, l, LNAME "mlp.experts.in.grad", m, l);
  int32_t dxe2 = tensor(b, MF_T_ACT_GRAD, MF_DTYPE_F32, R * H, m, l, LNAME "mlp.experts.in.grad_up", m, l);
  /* down: dW (unless frozen) then dx */
  if (!experts_frozen(c, MF_P_EXPERT_DOWN, l)) {
    o = op(b, MF_K_EXPERT_BWD_WEIGHT, MF_PHASE_BWD, m, l, "L%d experts down_proj dW", l);
    SET(o, dye, a->ea, a->offsets);
    INTS(o, E, H, I);
    o->experts_at = experts_of(c, MF_P_EXPERT_DOWN, l, 1, -1);
    o->flops = 2.0 * (double)R * (double)H * (double)I;
  }
  const int32_t down_w = experts_of(c, MF_P_EXPERT_DOWN, l, 0, -1); /* before the op: it may dequantize */
  o = op(b, MF_K_EXPERT_BWD_DATA, MF_PHASE_BWD, m, l, "L%d experts down_proj dx", l);
  SET(o, dye, a->offsets, dea);
  INTS(o, E, H, I);
  o->experts_at = down_w;
  o->flops = 2.0 * (double)R * (double)H * (double)I;
  lora_experts_bwd(z, l, MF_P_EXPERT_DOWN, "down_proj", dye, a->ea, dea, H, I);
  o = op(b, MF_K_SWIGLU_BWD, MF_PHASE_BWD, m, l, "L%d experts swiglu bwd", l);
  SET(o, a->eg, a->eu, dea, deg, deu);
  INTS(o, R * I);
  const struct {
    mf_param_role role;
    int32_t dy, dx;
    const char *what;
  } gu[2] = {{MF_P_EXPERT_GATE, deg, dxe, "gate_proj"}, {MF_P_EXPERT_UP, deu, dxe2, "up_proj"}};
  for (int j = 0; j < 2; j++) {
    if (!experts_frozen(c, gu[j].role, l)) {
      o = op(b, MF_K_EXPERT_BWD_WEIGHT, MF_PHASE_BWD, m, l, "L%d experts %s dW", l, gu[j].what);
      SET(o, gu[j].dy, a->xe, a->offsets);
      INTS(o, E, I, H);
      o->experts_at = experts_of(c, gu[j].role, l, 1, -1);
      o->flops = 2.0 * (double)R * (double)I * (double)H;
    }
    const int32_t w = experts_of(c, gu[j].role, l, 0, -1);
    o = op(b, MF_K_EXPERT_BWD_DATA, MF_PHASE_BWD, m, l, "L%d experts %s dx", l, gu[j].what);
    SET(o, gu[j].dy, a->offsets, gu[j].dx);
    INTS(o, E, I, H);
    o->experts_at = w;
    o->flops = 2.0 * (double)R * (double)I * (double)H;
    lora_experts_bwd(z, l, gu[j].role, gu[j].what, gu[j].dy, a->xe, gu[j].dx, I, H);
  }
  simple(c, MF_K_ADD, MF_PHASE_BWD, l, "experts dx sum", dxe2, dxe, -1, -1, -1, R * H);
  o = op(b, MF_K_MOE_GATHER_BWD, MF_PHASE_BWD, m, l, "L%d gather bwd", l);
  SET(o, dxe, a->row_of, dxn2);
  INTS(o, T, TK, H, 0);
  int32_t dprobs = -1;
  if (p->aux_coef > 0) {
    dprobs = keep_fp32(b, tensor(b, MF_T_ACT_GRAD, MF_DTYPE_F32, T * E, m, l, LNAME "mlp.router_probs.grad", m, l));
    o = op(b, MF_K_AUX_GRAD, MF_PHASE_BWD, m, l, "L%d aux grad", l);
    SET(o, aux_counts, dprobs);
    INTS(o, E, aux_rows, T);
    o->f[0] = p->aux_coef / mf_program_loss_divisor(p);
  }
  int32_t drl = tensor(b, MF_T_ACT_GRAD, MF_DTYPE_F32, T * E, m, l, LNAME "mlp.router_logits.grad", m, l);
  o = op(b, MF_K_ROUTER_BWD, MF_PHASE_BWD, m, l, "L%d router bwd", l);
  SET(o, a->probs, a->tki, a->tkw, dtkw, dprobs, drl);
  INTS(o, T, E, TK, s->norm_topk_prob);
  linear_bwd(c, l, "router", drl, a->xn2, P(c, MF_P_ROUTER, l), G(c, MF_P_ROUTER, l), -1, dxn2, E, H, 1);
  if (s->shared_ffn > 0) {
    const int64_t Is = s->shared_ffn;
    int32_t dsy =
        tensor(b, MF_T_ACT_GRAD, MF_DTYPE_F32, T * H, m, l, LNAME "mlp.shared_expert.out.grad", m, l);
    int32_t dsgl =
        tensor(b, MF_T_ACT_GRAD, MF_DTYPE_F32, T, m, l, LNAME "mlp.shared_expert_gate.out.grad", m, l);
    o = op(b, MF_K_SIGGATE_BWD, MF_PHASE_BWD, m, l, "L%d shared gate bwd", l);
    SET(o, a->sgl, a->sy, gres, dsy, dsgl);
    INTS(o, T, H);
    linear_bwd(c, l, "shared_expert_gate", dsgl, a->xn2, P(c, MF_P_SHARED_EXPERT_GATE, l),
               G(c, MF_P_SHARED_EXPERT_GATE, l), -1, dxn2, 1, H, 1);
    int32_t dsa =
        tensor(b, MF_T_ACT_GRAD, MF_DTYPE_F32, T * Is, m, l, LNAME "mlp.shared_expert.act.grad", m, l);
    int32_t dsg =
        tensor(b, MF_T_ACT_GRAD, MF_DTYPE_F32, T * Is, m, l, LNAME "mlp.shared_expert.gate.grad", m, l);
    int32_t dsu =
        tensor(b, MF_T_ACT_GRAD, MF_DTYPE_F32, T * Is, m, l, LNAME "mlp.shared_expert.up.grad", m, l);
    linear_bwd(c, l, "shared down_proj", dsy, a->sa, P(c, MF_P_SHARED_DOWN, l), G(c, MF_P_SHARED_DOWN, l), -1,
               dsa, H, Is, 0);
    lora_bwd(z, l, MF_P_SHARED_DOWN, "mlp.shared_expert.down_proj", dsy, a->sa, dsa, H, Is);
    simple(c, MF_K_SWIGLU_BWD, MF_PHASE_BWD, l, "shared swiglu bwd", a->sg, a->su, dsa, dsg, dsu, T * Is);
    linear_bwd(c, l, "shared gate_proj", dsg, a->xn2, P(c, MF_P_SHARED_GATE, l), G(c, MF_P_SHARED_GATE, l),
               -1, dxn2, Is, H, 1);
    lora_bwd(z, l, MF_P_SHARED_GATE, "mlp.shared_expert.gate_proj", dsg, a->xn2, dxn2, Is, H);
    linear_bwd(c, l, "shared up_proj", dsu, a->xn2, P(c, MF_P_SHARED_UP, l), G(c, MF_P_SHARED_UP, l), -1,
               dxn2, Is, H, 1);
    lora_bwd(z, l, MF_P_SHARED_UP, "mlp.shared_expert.up_proj", dsu, a->xn2, dxn2, Is, H);
  }
}

static void bwd_dense(const mb *z, int32_t l, int32_t gres, int32_t dxn2) {
  pb *b = z->b;
  const ctx *c = z->c;
  const mf_model_spec *s = z->s;
  const int32_t m = z->m;
  const int64_t T = z->T, H = z->H;
  const layer_acts *a = &z->A[l];
  const int64_t Id = s->dense_ffn;
  int32_t dda = tensor(b, MF_T_ACT_GRAD, MF_DTYPE_F32, T * Id, m, l, LNAME "mlp.act.grad", m, l);
  int32_t ddg = tensor(b, MF_T_ACT_GRAD, MF_DTYPE_F32, T * Id, m, l, LNAME "mlp.gate.grad", m, l);
  int32_t ddu = tensor(b, MF_T_ACT_GRAD, MF_DTYPE_F32, T * Id, m, l, LNAME "mlp.up.grad", m, l);
  linear_bwd(c, l, "down_proj", gres, a->da, P(c, MF_P_DENSE_DOWN, l), G(c, MF_P_DENSE_DOWN, l), -1, dda, H,
             Id, 0);
  lora_bwd(z, l, MF_P_DENSE_DOWN, "mlp.down_proj", gres, a->da, dda, H, Id);
  simple(c, MF_K_SWIGLU_BWD, MF_PHASE_BWD, l, "swiglu bwd", a->dg, a->du, dda, ddg, ddu, T * Id);
  linear_bwd(c, l, "gate_proj", ddg, a->xn2, P(c, MF_P_DENSE_GATE, l), G(c, MF_P_DENSE_GATE, l), -1, dxn2, Id,
             H, 0);
  lora_bwd(z, l, MF_P_DENSE_GATE, "mlp.gate_proj", ddg, a->xn2, dxn2, Id, H);
  linear_bwd(c, l, "up_proj", ddu, a->xn2, P(c, MF_P_DENSE_UP, l), G(c, MF_P_DENSE_UP, l), -1, dxn2, Id, H,
             1);
  lora_bwd(z, l, MF_P_DENSE_UP, "mlp.up_proj", ddu, a->xn2, dxn2, Id, H);
}

/* Layer l's attention block backward, from the post-attention norm down to the
 * input norm: the residual gradient gres updated. */
static void bwd_attention(const mb *z, int32_t l, int32_t gres, int32_t dxn2) {
  pb *b = z->b;
  const ctx *c = z->c;
  const mf_model_spec *s = z->s;
  const int32_t m = z->m, pos = z->pos;
  const int64_t B = z->B, S = z->S, T = z->T, H = z->H, D = z->D, Hq = z->Hq, Hkv = z->Hkv;
  const layer_acts *a = &z->A[l];
  mf_pop *o;
  rmsnorm_bwd(c, l, "post_attention_layernorm", dxn2, a->hmid, P(c, MF_P_MLP_NORM, l), a->rstd2, gres,
              G(c, MF_P_MLP_NORM, l), T, H, 1);
  /* Attention. */
  int32_t datt =
      tensor(b, MF_T_ACT_GRAD, MF_DTYPE_F32, T * Hq * D, m, l, LNAME "self_attn.attn_out.grad", m, l);
  linear_bwd(c, l, "o_proj", gres, a->att, P(c, MF_P_O, l), G(c, MF_P_O, l), -1, datt, H, Hq * D, 0);
  lora_bwd(z, l, MF_P_O, "self_attn.o_proj", gres, a->att, datt, H, Hq * D);
  int32_t dqa = tensor(b, MF_T_ACT_GRAD, MF_DTYPE_F32, T * Hq * D, m, l, LNAME "self_attn.q_rope.grad", m, l);
  int32_t dka =
      tensor(b, MF_T_ACT_GRAD, MF_DTYPE_F32, T * Hkv * D, m, l, LNAME "self_attn.k_rope.grad", m, l);
  int32_t dv = tensor(b, MF_T_ACT_GRAD, MF_DTYPE_F32, T * Hkv * D, m, l, LNAME "self_attn.v.grad", m, l);
  o = op(b, MF_K_ATTN_BWD, MF_PHASE_BWD, m, l, "L%d attention bwd", l);
  SET(o, a->qa, a->ka, a->v, a->att, datt, a->lse, dqa, dka, dv);
  INTS(o, B, S, Hq, Hkv, D);
  o->f[0] = z->scale;
  o->flops = 2.5 * 2.0 * 2.0 * (double)B * (double)Hq * (double)D * (double)S * (double)(S + 1) / 2.0;
  o = op(b, MF_K_ROPE_BWD, MF_PHASE_BWD, m, l, "L%d rope q bwd", l);
  SET(o, dqa, pos);
  INTS(o, T, Hq, D);
  o->f[0] = s->rope_theta;
  o = op(b, MF_K_ROPE_BWD, MF_PHASE_BWD, m, l, "L%d rope k bwd", l);
  SET(o, dka, pos);
  INTS(o, T, Hkv, D);
  o->f[0] = s->rope_theta;
  int32_t dq = dqa, dk = dka;
  if (s->qk_norm != MF_QK_NORM_NONE) {
    const int per_head = s->qk_norm == MF_QK_NORM_PER_HEAD;
    dq = tensor(b, MF_T_ACT_GRAD, MF_DTYPE_F32, T * Hq * D, m, l, LNAME "self_attn.q.grad", m, l);
    dk = tensor(b, MF_T_ACT_GRAD, MF_DTYPE_F32, T * Hkv * D, m, l, LNAME "self_attn.k.grad", m, l);
    rmsnorm_bwd(c, l, "q_norm", dqa, a->q, P(c, MF_P_Q_NORM, l), a->qr, dq, G(c, MF_P_Q_NORM, l),
                per_head ? T * Hq : T, per_head ? D : Hq * D, 0);
    rmsnorm_bwd(c, l, "k_norm", dka, a->k, P(c, MF_P_K_NORM, l), a->kr, dk, G(c, MF_P_K_NORM, l),
                per_head ? T * Hkv : T, per_head ? D : Hkv * D, 0);
  }
  int32_t dxn1 = tensor(b, MF_T_ACT_GRAD, MF_DTYPE_F32, T * H, m, l, LNAME "input_layernorm.out.grad", m, l);
  linear_bwd(c, l, "q_proj", dq, a->xn1, P(c, MF_P_Q, l), G(c, MF_P_Q, l), G(c, MF_P_Q_BIAS, l), dxn1, Hq * D,
             H, 0);
  lora_bwd(z, l, MF_P_Q, "self_attn.q_proj", dq, a->xn1, dxn1, Hq * D, H);
  linear_bwd(c, l, "k_proj", dk, a->xn1, P(c, MF_P_K, l), G(c, MF_P_K, l), G(c, MF_P_K_BIAS, l), dxn1,
             Hkv * D, H, 1);
  lora_bwd(z, l, MF_P_K, "self_attn.k_proj", dk, a->xn1, dxn1, Hkv * D, H);
  linear_bwd(c, l, "v_proj", dv, a->xn1, P(c, MF_P_V, l), G(c, MF_P_V, l), G(c, MF_P_V_BIAS, l), dxn1,
             Hkv * D, H, 1);
  lora_bwd(z, l, MF_P_V, "self_attn.v_proj", dv, a->xn1, dxn1, Hkv * D, H);
  rmsnorm_bwd(c, l, "input_layernorm", dxn1, z->resid[l], P(c, MF_P_ATTN_NORM, l), a->rstd1, gres,
              G(c, MF_P_ATTN_NORM, l), T, H, 1);
}

static void build_micro(pb *b, const mf_param_table *pt, int32_t m) {
  mf_program *p = b->p;
  const mf_model_spec *s = &pt->spec;
  const int64_t L = s->layers;
  const int32_t Li = (int32_t)L;
  ctx cx = {b, pt, s, m, p->B * p->S};
  const ctx *c = &cx;
  mb z = {b,
          c,
          s,
          m,
          -1,
          p->B,
          p->S,
          p->B * p->S,
          s->hidden,
          s->head_dim,
          s->heads,
          s->kv_heads,
          s->experts,
          s->top_k,
          s->expert_ffn,
          s->vocab,
          (float)(1.0 / sqrt((double)s->head_dim)),
          -1,
          -1,
          0,
          NULL,
          NULL,
          -1,
          -1,
          -1};
  const int64_t T = z.T, H = z.H, E = z.E, V = z.V;
  int64_t n_moe = 0;
  for (int64_t l = 0; l < L; l++) n_moe += mf_model_spec_layer_is_moe(s, l);
  z.aux_rows = n_moe * T;

  mf_program_io *io = &p->io[m];
  io->ids = tensor(b, MF_T_INPUT, MF_DTYPE_I32, T, m, -1, "mb%d.input_ids", m);
  io->targets = tensor(b, MF_T_INPUT, MF_DTYPE_I32, T, m, -1, "mb%d.targets", m);
  io->positions = p->io[0].positions;
  io->ce_scalars = tensor(b, MF_T_WORK, MF_DTYPE_F64, 2, m, -1, "mb%d.loss.ce", m);
  io->aux_scalars = tensor(b, MF_T_WORK, MF_DTYPE_F64, 1, m, -1, "mb%d.loss.aux", m);
  z.pos = io->positions;
  b->stage = STAGE_EMBED;
  if (n_moe > 0) {
    z.aux_counts = tensor(b, MF_T_STAT, MF_DTYPE_I64, E, m, -1, "mb%d.aux.counts", m);
    z.aux_psum = tensor(b, MF_T_STAT, MF_DTYPE_F64, E, m, -1, "mb%d.aux.psum", m);
    simple(c, MF_K_ZERO, MF_PHASE_FWD, -1, "aux counts = 0", z.aux_counts, -1, -1, -1, -1, E);
    simple(c, MF_K_ZERO, MF_PHASE_FWD, -1, "aux psum = 0", z.aux_psum, -1, -1, -1, -1, E);
  }
  z.resid = (int32_t *)calloc((size_t)L + 1, sizeof(int32_t));
  z.A = (layer_acts *)calloc((size_t)L, sizeof(layer_acts));
  if (!z.resid || !z.A) {
    free(z.resid);
    free(z.A);
    b->st = MF_ERR(MF_ERR_OUT_OF_MEMORY, "step program: out of memory");
    return;
  }
  int32_t *resid = z.resid;
  resid[0] = tensor(b, MF_T_ACT, MF_DTYPE_F32, T * H, m, -1, "mb%d.model.embed_tokens.out", m);
  {
    mf_pop *o = op(b, MF_K_EMBED_FWD, MF_PHASE_FWD, m, -1, "embed");
    SET(o, io->ids, P(c, MF_P_EMBED, -1), resid[0]);
    INTS(o, T, V, H);
  }
  for (int32_t l = 0; l < Li; l++) {
    b->stage = STAGE_FWD(l);
    fwd_attention(&z, l);
    if (mf_model_spec_layer_is_moe(s, l))
      fwd_moe(&z, l);
    else
      fwd_dense(&z, l);
    simple(c, MF_K_ADD, MF_PHASE_FWD, l, "mlp residual", z.A[l].hmid, resid[l + 1], -1, -1, -1, T * H);
  }
  b->stage = STAGE_LOSS(Li);
  fwd_loss(&z);
  if (!p->forward_only) {
    /* Backward. gres is the gradient of the residual stream, updated layer by layer. */
    b->stage = STAGE_NORM_BWD(Li);
    int32_t gres = tensor(b, MF_T_ACT_GRAD, MF_DTYPE_F32, T * H, m, -1, "mb%d.residual.grad", m);
    rmsnorm_bwd(c, -1, "final norm", z.dhf, resid[L], P(c, MF_P_FINAL_NORM, -1), z.rstdf, gres,
                G(c, MF_P_FINAL_NORM, -1), T, H, 0);
    for (int32_t l = Li - 1; l >= 0; l--) {
      b->stage = STAGE_BWD(Li, l);
      int32_t dxn2 = tensor(b, MF_T_ACT_GRAD, MF_DTYPE_F32, T * H, m, l,
                            LNAME "post_attention_layernorm.out.grad", m, l);
      if (mf_model_spec_layer_is_moe(s, l))
        bwd_moe(&z, l, gres, dxn2);
      else
        bwd_dense(&z, l, gres, dxn2);
      bwd_attention(&z, l, gres, dxn2);
    }
    b->stage = STAGE_EMBED_BWD(Li);
    if (G(c, MF_P_EMBED, -1) >= 0) { /* else frozen */
      mf_pop *o = op(b, MF_K_EMBED_BWD, MF_PHASE_BWD, m, -1, "embed bwd");
      SET(o, io->ids, gres, G(c, MF_P_EMBED, -1));
      INTS(o, T, V, H);
    }
  }
  free(z.resid);
  free(z.A);
}

/* The optimizer on the device, after the backward (program.h MF_PHASE_NORM,
 * MF_PHASE_OPTIM): every parameter's norm chunk sums, then every parameter's
 * update, in parameter order. The planner runs them only for the parameters
 * whose optimizer it places on the device. */
static void build_optimizer(pb *b, const mf_param_table *pt) {
  mf_program *p = b->p;
  const size_t n = (size_t)(pt->n ? pt->n : 1);
  p->state_tensor = (int32_t *)malloc(n * sizeof(int32_t));
  p->sumsq_op = (int32_t *)malloc(n * sizeof(int32_t));
  p->adamw_op = (int32_t *)malloc(n * sizeof(int32_t));
  p->norm_first = (int64_t *)malloc(n * sizeof(int64_t));
  if (!p->state_tensor || !p->sumsq_op || !p->adamw_op || !p->norm_first) {
    b->st = MF_ERR(MF_ERR_OUT_OF_MEMORY, "step program: out of memory");
    return;
  }
  const int64_t chunk = 65536; /* MF_OPTIM_NORM_CHUNK (kernels/backend.h MF_K_GRAD_SUMSQ) */
  p->norm_chunks = 0;
  for (int64_t i = 0; i < pt->n; i++) { /* a frozen parameter has no chunk */
    p->norm_first[i] = p->norm_chunks;
    if (!pt->params[i].frozen) p->norm_chunks += (pt->params[i].numel + chunk - 1) / chunk;
  }
  b->stage = INT32_MAX;
  p->norm_sums = tensor(b, MF_T_WORK, MF_DTYPE_F64, p->norm_chunks > 0 ? p->norm_chunks : 1, -1, -1,
                        "optimizer.norm_chunk_sums");
  const size_t ms = mf_dtype_size(p->moments);
  for (int64_t i = 0; i < pt->n; i++) p->state_tensor[i] = p->sumsq_op[i] = p->adamw_op[i] = -1;
  for (int64_t i = 0; i < pt->n && b->st == MF_OK; i++) {
    const mf_param *q = &pt->params[i];
    if (q->frozen) continue;
    int32_t t = tensor(b, MF_T_OPT, p->moments, 2 * q->numel, -1, q->layer, "adam.%s", q->name);
    if (t < 0) return;
    /* BF16 storage: the fp32 master beside the moments (cuda). */
    p->tensors[t].bytes = (size_t)q->numel * (2 * ms + (p->storage == MF_DTYPE_BF16 ? 4 : 0));
    p->tensors[t].param = (int32_t)i;
    p->state_tensor[i] = t;
  }
  for (int64_t i = 0; i < pt->n && b->st == MF_OK; i++) {
    const mf_param *q = &pt->params[i];
    if (q->frozen) continue;
    mf_pop *o = op(b, MF_K_GRAD_SUMSQ, MF_PHASE_NORM, -1, q->layer, "norm %s", q->name);
    if (b->st != MF_OK) return;
    o->t[0] = p->grad_tensor[i];
    o->t[1] = p->norm_sums;
    o->i[0] = q->numel;
    o->i[1] = p->norm_first[i];
    p->sumsq_op[i] = p->n_ops - 1;
  }
  for (int64_t i = 0; i < pt->n && b->st == MF_OK; i++) {
    const mf_param *q = &pt->params[i];
    if (q->frozen) continue;
    mf_pop *o = op(b, MF_K_ADAMW, MF_PHASE_OPTIM, -1, q->layer, "adamw %s", q->name);
    if (b->st != MF_OK) return;
    o->t[0] = p->param_tensor[i];
    o->t[1] = p->grad_tensor[i];
    o->t[2] = p->state_tensor[i];
    o->i[0] = q->numel;
    o->i[1] = 0; /* t: the executor's, at run time, as lr, coef and the rest of f[] */
    o->i[2] = p->moments == MF_DTYPE_BF16;
    p->adamw_op[i] = p->n_ops - 1;
  }
}

/* Each op's operand roles (mf_pop.reads, writes, writes_experts), derived
 * here once so that the planner and the executor never re-derive them. */
static void set_roles(mf_program *p) {
  for (int32_t k = 0; k < p->n_ops; k++) {
    mf_pop *o = &p->ops[k];
    mf_kernel_call c;
    memset(&c, 0, sizeof c);
    c.kind = o->kind;
    memcpy(c.i, o->i, sizeof c.i);
    o->reads = mf_kernel_reads(&c);
    o->writes = mf_kernel_writes(&c);
    o->writes_experts = (uint8_t)(mf_kernel_writes_experts(o->kind) != 0);
  }
}

static void compute_lifetimes(mf_program *p) {
  for (int32_t k = 0; k < p->n_ops; k++) {
    const mf_pop *o = &p->ops[k];
    int32_t ids[MF_KBUF_MAX];
    for (int i = 0; i < MF_KBUF_MAX; i++) ids[i] = o->t[i];
    for (int i = 0; i < MF_KBUF_MAX; i++) {
      if (ids[i] < 0) continue;
      mf_ptensor *t = &p->tensors[ids[i]];
      if (t->first_op < 0) t->first_op = k;
      t->last_op = k;
    }
    if (o->experts_at >= 0)
      for (int64_t e = 0; e < p->spec.experts; e++) {
        if (p->id_pool[o->experts_at + e] < 0) continue; /* a cold expert's adapter: none */
        mf_ptensor *t = &p->tensors[p->id_pool[o->experts_at + e]];
        if (t->first_op < 0) t->first_op = k;
        t->last_op = k;
      }
  }
  /* A micro-batch's inputs are uploaded before its first op, so they live from there. */
  for (int32_t i = 0; i < p->n_tensors; i++) {
    mf_ptensor *t = &p->tensors[i];
    if (t->kind != MF_T_INPUT || t->micro < 0) continue;
    for (int32_t k = 0; k < p->n_ops; k++)
      if (p->ops[k].micro == t->micro) {
        if (t->first_op < 0 || k < t->first_op) t->first_op = k;
        break;
      }
  }
  /* Parameters, gradients and positions live for the whole step. */
  for (int32_t i = 0; i < p->n_tensors; i++) {
    mf_ptensor *t = &p->tensors[i];
    if (t->kind == MF_T_PARAM || t->kind == MF_T_GRAD || t->micro < 0) {
      t->first_op = 0;
      t->last_op = p->n_ops - 1;
    }
  }
}

/* p->use_start and p->use_ops (see program.h): counted, then filled. */
static mf_status index_uses(mf_program *p) {
  const int32_t nt = p->n_tensors;
  int32_t *last = NULL;
  MF_CHECK(mf_calloc((size_t)nt + 1, sizeof(int32_t), "the program's tensor uses", (void **)&p->use_start));
  MF_CHECK(mf_malloc(((size_t)nt + 1) * sizeof(int32_t), "the program's tensor uses", (void **)&last));
  for (int pass = 0; pass < 2; pass++) {
    for (int32_t t = 0; t < nt; t++) last[t] = -1;
    for (int32_t k = 0; k < p->n_ops; k++) {
      const mf_pop *o = &p->ops[k];
      const int64_t E = o->experts_at >= 0 ? p->spec.experts : 0;
      for (int64_t j = 0; j < MF_KBUF_MAX + E; j++) {
        const int32_t t = j < MF_KBUF_MAX ? o->t[j] : p->id_pool[o->experts_at + (j - MF_KBUF_MAX)];
        if (t < 0 || last[t] == k) continue;
        last[t] = k;
        if (pass == 0)
          p->use_start[t + 1]++;
        else
          p->use_ops[p->use_start[t]++] = k;
      }
    }
    if (pass == 0) {
      for (int32_t t = 0; t < nt; t++) p->use_start[t + 1] += p->use_start[t];
      const mf_status st = mf_malloc(((size_t)p->use_start[nt] + 1) * sizeof(int32_t),
                                     "the program's tensor uses", (void **)&p->use_ops);
      if (st != MF_OK) {
        free(last);
        return st;
      }
    }
  }
  /* The fill advanced each start to the next tensor's: shift back. */
  for (int32_t t = nt; t > 0; t--) p->use_start[t] = p->use_start[t - 1];
  p->use_start[0] = 0;
  free(last);
  return MF_OK;
}

const char *mf_program_order_name(mf_program_order o) {
  return o == MF_ORDER_LAYER_MAJOR ? "layer-major" : "micro-batch-major";
}

typedef struct op_key {
  int32_t stage, micro, k;
} op_key;

static int cmp_op_key(const void *a, const void *b) {
  const op_key *x = (const op_key *)a, *y = (const op_key *)b;
  if (x->stage != y->stage) return x->stage < y->stage ? -1 : 1;
  if (x->micro != y->micro) return x->micro < y->micro ? -1 : 1;
  return x->k < y->k ? -1 : x->k > y->k;
}

/* Layer-major order: the ops sorted by (stage, micro-batch), keeping build
 * order inside each (the build order is micro-batch-major), then every op
 * index kept outside the op list moved with its op. Runs before lifetimes. */
static mf_status reorder_layer_major(mf_program *p, const int32_t *stage_of) {
  const int32_t n = p->n_ops;
  op_key *key = (op_key *)malloc((size_t)(n + 1) * sizeof *key);
  mf_pop *ops = (mf_pop *)malloc((size_t)(n + 1) * sizeof *ops);
  int32_t *moved_to = (int32_t *)malloc((size_t)(n + 1) * sizeof *moved_to);
  if (!key || !ops || !moved_to) {
    free(key);
    free(ops);
    free(moved_to);
    return MF_ERR(MF_ERR_OUT_OF_MEMORY, "step program: out of memory");
  }
  for (int32_t k = 0; k < n; k++) key[k] = (op_key){stage_of[k], p->ops[k].micro, k};
  qsort(key, (size_t)n, sizeof *key, cmp_op_key);
  for (int32_t j = 0; j < n; j++) {
    ops[j] = p->ops[key[j].k];
    moved_to[key[j].k] = j;
  }
  free(p->ops);
  p->ops = ops;
  for (int64_t m = 0; m < p->G; m++) p->io[m].ce_op = moved_to[p->io[m].ce_op];
  free(key);
  free(moved_to);
  return MF_OK;
}

double mf_program_loss_divisor(const mf_program *p) {
  return (double)(p->G * p->ranks);
}

mf_status mf_program_build(const mf_param_table *pt, const mf_program_opts *opts, mf_program **out) {
  *out = NULL;
  const mf_model_spec *s = &pt->spec;
  if (opts->micro_batch < 1 || opts->seq_len < 1 || opts->grad_accum < 1)
    return MF_ERR(MF_ERR_INVALID_ARG, "step program: batch sizes must be positive (B=%lld S=%lld G=%lld)",
                  (long long)opts->micro_batch, (long long)opts->seq_len, (long long)opts->grad_accum);
  if (opts->seq_len > s->max_seq)
    return MF_ERR(MF_ERR_CONFIG, "data.seq_len %lld exceeds the model's max_seq %lld", (long long)opts->seq_len,
                  (long long)s->max_seq);
  if (s->clip_qkv > 0)
    return MF_ERR(MF_ERR_UNSUPPORTED, "model: clip_qkv (OLMoE) is not implemented yet; set it to 0");
  if (s->router_jitter > 0)
    return MF_ERR(MF_ERR_UNSUPPORTED, "model: router jitter noise is not implemented yet; set it to 0");
  if (s->experts > 65536) return MF_ERR(MF_ERR_UNSUPPORTED, "model: more than 65536 experts");
  if (opts->order != MF_ORDER_MICRO_MAJOR && opts->order != MF_ORDER_LAYER_MAJOR)
    return MF_ERR(MF_ERR_INVALID_ARG, "step program: unknown micro-batch order %d", (int)opts->order);
  if (opts->moments != MF_DTYPE_INVALID && opts->moments != MF_DTYPE_F32 && opts->moments != MF_DTYPE_BF16)
    return MF_ERR(MF_ERR_INVALID_ARG, "step program: AdamW moments must be F32 or BF16 (got %s)",
                  mf_dtype_name(opts->moments));
  if (opts->storage != MF_DTYPE_INVALID && opts->storage != MF_DTYPE_F32 && opts->storage != MF_DTYPE_BF16)
    return MF_ERR(MF_ERR_INVALID_ARG, "step program: device storage must be F32 or BF16 (got %s)",
                  mf_dtype_name(opts->storage));
  const double tokens = (double)opts->micro_batch * (double)opts->seq_len * (double)s->top_k;
  if (tokens > 2147483647.0)
    return MF_ERR(MF_ERR_UNSUPPORTED, "step program: micro_batch x seq_len x top_k is too large for 32-bit rows");

  mf_program *p = (mf_program *)calloc(1, sizeof *p);
  if (!p) return MF_ERR(MF_ERR_OUT_OF_MEMORY, "step program: out of memory");
  p->params = pt;
  p->spec = *s;
  p->B = opts->micro_batch;
  p->S = opts->seq_len;
  p->G = opts->grad_accum;
  p->ranks = opts->ranks > 1 ? opts->ranks : 1;
  p->node_ranks = opts->node_ranks > 0 && opts->node_ranks < p->ranks ? opts->node_ranks : p->ranks;
  p->aux_coef = opts->aux_coef;
  p->ce_chunk = opts->ce_chunk > 0 ? opts->ce_chunk : 4096;
  p->forward_only = opts->forward_only;
  p->order = opts->order;
  p->storage = opts->storage == MF_DTYPE_BF16 ? MF_DTYPE_BF16 : MF_DTYPE_F32;
  p->moments = opts->moments == MF_DTYPE_BF16 ? MF_DTYPE_BF16 : MF_DTYPE_F32;
  p->norm_sums = -1;
  p->io = (mf_program_io *)calloc((size_t)p->G, sizeof(mf_program_io));
  p->param_tensor = (int32_t *)malloc((size_t)pt->n * sizeof(int32_t));
  p->grad_tensor = (int32_t *)malloc((size_t)pt->n * sizeof(int32_t));
  pb b;
  memset(&b, 0, sizeof b);
  b.p = p;
  b.stage = STAGE_SETUP;
  b.st = MF_OK;
  if (!p->io || !p->param_tensor || !p->grad_tensor) b.st = MF_ERR(MF_ERR_OUT_OF_MEMORY, "step program: out of memory");
  for (int64_t i = 0; i < pt->n && b.st == MF_OK; i++) {
    const mf_param *q = &pt->params[i];
    /* a weight stored quantized: its blob's bytes (src/core/qformat.h) */
    p->param_tensor[i] = q->quant ? tensor(&b, MF_T_PARAM, MF_DTYPE_U8, q->qbytes, -1, q->layer, "%s", q->name)
                                  : tensor(&b, MF_T_PARAM, MF_DTYPE_F32, q->numel, -1, q->layer, "%s", q->name);
    p->grad_tensor[i] = p->forward_only || q->frozen
                            ? -1
                            : tensor(&b, MF_T_GRAD, MF_DTYPE_F32, q->numel, -1, q->layer, "grad.%s", q->name);
    if (b.st == MF_OK) {
      p->tensors[p->param_tensor[i]].param = (int32_t)i;
      if (p->grad_tensor[i] >= 0) p->tensors[p->grad_tensor[i]].param = (int32_t)i;
    }
  }
  if (b.st == MF_OK)
    p->io[0].positions = tensor(&b, MF_T_INPUT, MF_DTYPE_I32, p->B * p->S, -1, -1, "positions");
  /* Gradients start at zero and accumulate over the micro-batches. */
  for (int64_t i = 0; i < pt->n && b.st == MF_OK && !p->forward_only; i++) {
    if (p->grad_tensor[i] < 0) continue; /* frozen */
    mf_pop *o = op(&b, MF_K_ZERO, MF_PHASE_SETUP, -1, pt->params[i].layer, "zero grad");
    o->t[0] = p->grad_tensor[i];
  }
  for (int32_t m = 0; m < (int32_t)p->G && b.st == MF_OK; m++) build_micro(&b, pt, m);
  if (b.st == MF_OK && p->order == MF_ORDER_LAYER_MAJOR) {
    b.st = reorder_layer_major(p, b.stage_of);
    b.cap_o = p->n_ops + 1; /* the reordered list's room */
  }
  if (b.st == MF_OK && !p->forward_only) build_optimizer(&b, pt);
  if (b.st == MF_OK && b.n_pending)
    b.st = MF_ERR(MF_ERR_INTERNAL, "step program: a dequantized weight that no op reads");
  free(b.stage_of);
  free(b.pending);
  if (b.st != MF_OK) {
    mf_program_free(p);
    return b.st;
  }
  for (int32_t k = 0; k < p->n_ops; k++) p->flops += p->ops[k].flops;
  set_roles(p);
  compute_lifetimes(p);
  const mf_status st = index_uses(p);
  if (st != MF_OK) {
    mf_program_free(p);
    return st;
  }
  *out = p;
  return MF_OK;
}

void mf_program_free(mf_program *p) {
  if (!p) return;
  free(p->tensors);
  free(p->ops);
  free(p->id_pool);
  free(p->io);
  free(p->param_tensor);
  free(p->grad_tensor);
  free(p->state_tensor);
  free(p->sumsq_op);
  free(p->adamw_op);
  free(p->norm_first);
  free(p->use_start);
  free(p->use_ops);
  free(p);
}

void mf_program_dump(const mf_program *p, FILE *f) {
  fprintf(f, "program: %d tensors, %d ops, %.3g FLOPs, %s, %s storage\n", p->n_tensors, p->n_ops, p->flops,
          mf_program_order_name(p->order), mf_dtype_name(p->storage));
  for (int32_t i = 0; i < p->n_tensors; i++) {
    const mf_ptensor *t = &p->tensors[i];
    fprintf(f, "  t%-5d %-8s %-4s %10zu B  ops [%d, %d]  %s\n", i, mf_tensor_kind_name(t->kind),
            mf_dtype_name(t->dtype), t->bytes, t->first_op, t->last_op, t->name);
  }
  for (int32_t k = 0; k < p->n_ops; k++) {
    const mf_pop *o = &p->ops[k];
    fprintf(f, "  op%-5d %-18s mb%d  %s\n", k, mf_kernel_name(o->kind), o->micro, o->label);
  }
}
