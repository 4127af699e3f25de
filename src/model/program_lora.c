/* The step program's LoRA ops beside an adapted weight's (program_build.h). */
#include <stdio.h>

#include "src/model/program_build.h"
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
static mf_pop *lora_dropout(const mb *z, int32_t l, mf_param_role role, const char *what, int32_t x,
                            int32_t y, int64_t n, mf_phase ph) {
  mf_pop *o = mf_pb_op(z->b, MF_K_DROPOUT, ph, z->m, l, "L%d %s dropout", l, what);
  SET(o, x, y);
  INTS(o, n, (int64_t)(l + 1) * 64 + role, MF_PROGRAM_SEED_RUNTIME); /* 64: roles are bits of a uint64_t */
  o->f[0] = z->c->pt->lora.dropout;
  o->flops = (double)n;
  return o;
}

/* The same over layer l's expert rows: with expert parallelism, the rows this rank's experts received,
 * each masked as its source masks it (the parts' starts and seeds, from the dispatch). */
static void lora_experts_dropout(const mb *z, int32_t l, mf_param_role role, const char *what, int32_t x,
                                 int32_t y, int64_t K, mf_phase ph) {
  const layer_acts *a = &z->A[l];
  const int64_t R = z->T * z->TK * z->b->p->ep;
  mf_pop *o = lora_dropout(z, l, role, what, x, y, R * K, ph);
  if (a->starts < 0) return;
  o->t[2] = a->segs;
  o->t[3] = a->starts;
  o->t[4] = a->seeds;
  o->i[3] = K;
  o->i[4] = z->b->p->ep;
  o->i[5] = z->E * z->b->p->ep;
}

/* x *= s (the adapters' scale; nothing when it is 1). */
static void lora_scale(const mb *z, int32_t l, const char *what, int32_t x, int64_t n, mf_phase ph) {
  const double s = z->c->pt->lora.scale;
  if (s == 1.0) return;
  mf_pop *o = mf_pb_op(z->b, MF_K_SCALE, ph, z->m, l, "L%d %s scale", l, what);
  SET(o, x);
  INTS(o, n);
  o->f[0] = s;
  o->flops = (double)n;
}

/* Weight `role` of layer l, y (+)= x W^T [T, N] done: its adapter's part added. */
void mf_pb_lora_fwd(const mb *z, int32_t l, mf_param_role role, const char *what, int32_t x, int32_t y,
                    int64_t N, int64_t K) {
  const ctx *c = z->c;
  const int32_t ia = lora_a(c, role, l, -1);
  if (ia < 0) return;
  const int64_t r = c->pt->lora.rank;
  const mf_program *p = z->b->p;
  int32_t a =
      mf_pb_tensor(z->b, MF_T_ACT, MF_DTYPE_F32, z->T * r, z->m, l, LNAME "%s.lora_A.out", z->m, l, what);
  char lab[48];
  snprintf(lab, sizeof lab, "%s lora_A", what);
  if (lora_drops(z)) {
    const int32_t xd =
        mf_pb_tensor(z->b, MF_T_ACT, MF_DTYPE_F32, z->T * K, z->m, l, LNAME "%s.lora_A.in", z->m, l, what);
    lora_dropout(z, l, role, lab, x, xd, z->T * K, MF_PHASE_FWD);
    z->A[l].lora_in[role] = x = xd;
  }
  mf_pb_linear_fwd(c, l, lab, x, p->param_tensor[ia], -1, a, r, K, 0);
  lora_scale(z, l, lab, a, z->T * r, MF_PHASE_FWD);
  snprintf(lab, sizeof lab, "%s lora_B", what);
  mf_pb_linear_fwd(c, l, lab, a, p->param_tensor[ia + 1], -1, y, N, r, 1);
  z->A[l].lora[role] = a;
}

/* Its backward, after the base's (which wrote or added dx [T, K]). */
void mf_pb_lora_bwd(const mb *z, int32_t l, mf_param_role role, const char *what, int32_t dy, int32_t x,
                    int32_t dx, int64_t N, int64_t K) {
  const ctx *c = z->c;
  const int32_t ia = lora_a(c, role, l, -1);
  if (ia < 0) return;
  const int64_t r = c->pt->lora.rank;
  const mf_program *p = z->b->p;
  int32_t da = mf_pb_tensor(z->b, MF_T_ACT_GRAD, MF_DTYPE_F32, z->T * r, z->m, l, LNAME "%s.lora_A.out.grad",
                            z->m, l, what);
  char lab[48];
  snprintf(lab, sizeof lab, "%s lora_B", what);
  mf_pb_linear_bwd(c, l, lab, dy, z->A[l].lora[role], p->param_tensor[ia + 1], p->grad_tensor[ia + 1], -1, da,
                   N, r, 0);
  snprintf(lab, sizeof lab, "%s lora_A", what);
  lora_scale(z, l, lab, da, z->T * r, MF_PHASE_BWD);
  if (!lora_drops(z)) {
    mf_pb_linear_bwd(c, l, lab, da, x, p->param_tensor[ia], p->grad_tensor[ia], -1, dx, r, K, 1);
    return;
  }
  /* dA from the dropped input; dx through the same mask */
  mf_pb_linear_bwd(c, l, lab, da, z->A[l].lora_in[role], p->param_tensor[ia], p->grad_tensor[ia], -1, -1, r,
                   K, 0);
  const int32_t t0 = mf_pb_tensor(z->b, MF_T_ACT_GRAD, MF_DTYPE_F32, z->T * K, z->m, l,
                                  LNAME "%s.lora_A.in.grad", z->m, l, what);
  const int32_t t1 = mf_pb_tensor(z->b, MF_T_ACT_GRAD, MF_DTYPE_F32, z->T * K, z->m, l,
                                  LNAME "%s.lora_A.in.grad_kept", z->m, l, what);
  mf_pb_linear_bwd(c, l, lab, da, x, p->param_tensor[ia], -1, -1, t0, r, K, 0);
  lora_dropout(z, l, role, lab, t0, t1, z->T * K, MF_PHASE_BWD);
  mf_pb_simple(c, MF_K_ADD, MF_PHASE_BWD, l, lab, t1, dx, -1, -1, -1, z->T * K);
}

/* The id pool entry of layer l's experts' adapters of `role`: A's (b = 0) or
 * B's (b = 1) parameter (grads: gradient) tensors, -1 for a cold expert's
 * (train.lora.experts: hot; the kernels give its rows zeros); -1 when no
 * expert of the layer is adapted. */
static int32_t lora_experts_of(const ctx *c, mf_param_role role, int64_t l, int b, int grads) {
  for (int64_t e = 0; e < c->s->experts; e++)
    if (lora_a(c, role, l, e) >= 0) return mf_pb_experts_of(c, role, l, grads, b);
  return -1;
}

int mf_pb_lora_experts_drop(const mb *z, int32_t l) {
  if (!lora_drops(z)) return 0;
  for (mf_param_role r = MF_P_EXPERT_GATE; r <= MF_P_EXPERT_DOWN; r++)
    if (lora_experts_of(z->c, r, l, 0, 0) >= 0) return 1;
  return 0;
}

/* The routed experts' projection `role` (xe [R, K] -> y [R, N]) done: the
 * adapters' part added, over the same permutation. */
void mf_pb_lora_experts_fwd(const mb *z, int32_t l, mf_param_role role, const char *what, int32_t x,
                            int32_t y, int64_t N, int64_t K) {
  const ctx *c = z->c;
  const int32_t at_a = lora_experts_of(c, role, l, 0, 0);
  if (at_a < 0) return;
  const int32_t at_b = lora_experts_of(c, role, l, 1, 0);
  /* the expert rows: with expert parallelism, those this rank's experts received */
  const int64_t r = c->pt->lora.rank, R = z->T * z->TK * z->b->p->ep;
  const int32_t offsets = z->A[l].offsets;
  int32_t a = mf_pb_tensor(z->b, MF_T_ACT, MF_DTYPE_F32, R * r, z->m, l, LNAME "mlp.experts.%s.lora_A.out",
                           z->m, l, what);
  int32_t u = mf_pb_tensor(z->b, MF_T_ACT, MF_DTYPE_F32, R * N, z->m, l, LNAME "mlp.experts.%s.lora_B.out",
                           z->m, l, what);
  char lab[48];
  snprintf(lab, sizeof lab, "experts %s lora_A", what);
  if (lora_drops(z)) {
    const int32_t xd = mf_pb_tensor(z->b, MF_T_ACT, MF_DTYPE_F32, R * K, z->m, l,
                                    LNAME "mlp.experts.%s.lora_A.in", z->m, l, what);
    lora_experts_dropout(z, l, role, lab, x, xd, K, MF_PHASE_FWD);
    z->A[l].lora_in[role] = x = xd;
  }
  mf_pb_expert_op(z, MF_K_EXPERT_FWD, MF_PHASE_FWD, l, lab, x, offsets, a, r, K, at_a);
  lora_scale(z, l, lab, a, R * r, MF_PHASE_FWD);
  snprintf(lab, sizeof lab, "experts %s lora_B", what);
  mf_pb_expert_op(z, MF_K_EXPERT_FWD, MF_PHASE_FWD, l, lab, a, offsets, u, N, r, at_b);
  mf_pb_simple(c, MF_K_ADD, MF_PHASE_FWD, l, lab, u, y, -1, -1, -1, R * N);
  z->A[l].lora[role] = a;
}

/* Its backward, after the base's data gradient (dx [R, K] written). */
void mf_pb_lora_experts_bwd(const mb *z, int32_t l, mf_param_role role, const char *what, int32_t dy,
                            int32_t x, int32_t dx, int64_t N, int64_t K) {
  const ctx *c = z->c;
  const int32_t at_a = lora_experts_of(c, role, l, 0, 0);
  if (at_a < 0) return;
  const int32_t at_b = lora_experts_of(c, role, l, 1, 0);
  const int32_t ga = lora_experts_of(c, role, l, 0, 1), gb = lora_experts_of(c, role, l, 1, 1);
  /* the expert rows: with expert parallelism, those this rank's experts received */
  const int64_t r = c->pt->lora.rank, R = z->T * z->TK * z->b->p->ep;
  const int32_t offsets = z->A[l].offsets;
  int32_t da = mf_pb_tensor(z->b, MF_T_ACT_GRAD, MF_DTYPE_F32, R * r, z->m, l,
                            LNAME "mlp.experts.%s.lora_A.out.grad", z->m, l, what);
  int32_t dxa = mf_pb_tensor(z->b, MF_T_ACT_GRAD, MF_DTYPE_F32, R * K, z->m, l,
                             LNAME "mlp.experts.%s.lora_A.in.grad", z->m, l, what);
  char lab[48];
  snprintf(lab, sizeof lab, "experts %s lora_B dW", what);
  mf_pb_expert_op(z, MF_K_EXPERT_BWD_WEIGHT, MF_PHASE_BWD, l, lab, dy, z->A[l].lora[role], offsets, N, r, gb);
  snprintf(lab, sizeof lab, "experts %s lora_B dx", what);
  mf_pb_expert_op(z, MF_K_EXPERT_BWD_DATA, MF_PHASE_BWD, l, lab, dy, offsets, da, N, r, at_b);
  lora_scale(z, l, lab, da, R * r, MF_PHASE_BWD);
  snprintf(lab, sizeof lab, "experts %s lora_A dW", what);
  mf_pb_expert_op(z, MF_K_EXPERT_BWD_WEIGHT, MF_PHASE_BWD, l, lab, da,
                  lora_drops(z) ? z->A[l].lora_in[role] : x, offsets, r, K, ga);
  snprintf(lab, sizeof lab, "experts %s lora_A dx", what);
  mf_pb_expert_op(z, MF_K_EXPERT_BWD_DATA, MF_PHASE_BWD, l, lab, da, offsets, dxa, r, K, at_a);
  if (lora_drops(z)) { /* through the forward's mask */
    const int32_t kept = mf_pb_tensor(z->b, MF_T_ACT_GRAD, MF_DTYPE_F32, R * K, z->m, l,
                                      LNAME "mlp.experts.%s.lora_A.in.grad_kept", z->m, l, what);
    lora_experts_dropout(z, l, role, lab, dxa, kept, K, MF_PHASE_BWD);
    dxa = kept;
  }
  mf_pb_simple(c, MF_K_ADD, MF_PHASE_BWD, l, lab, dxa, dx, -1, -1, -1, R * K);
}
