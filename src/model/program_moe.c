/* The step program's MoE block, routed and shared experts, forward and backward (program_build.h). */
#include <stdio.h>

#include "src/model/program_build.h"
/* A module name of layer l's shared expert: Qwen2-MoE's "mlp.shared_expert.<proj>", gated; GLM-4.5's
 * "mlp.shared_experts.<proj>", added as it is. */
static const char *shared_name(const mf_model_spec *s, const char *proj, char *buf, size_t cap) {
  snprintf(buf, cap, "mlp.%s.%s", mf_model_spec_shared_gated(s) ? "shared_expert" : "shared_experts", proj);
  return buf;
}

/* Layer l's shared expert, added into the layer's output (through Qwen2-MoE's sigmoid gate). */
static void shared_fwd(const mb *z, int32_t l) {
  pb *b = z->b;
  const ctx *c = z->c;
  const mf_model_spec *s = z->s;
  const int32_t m = z->m;
  const int64_t T = z->T, H = z->H, Is = s->shared_ffn;
  const int gated = mf_model_spec_shared_gated(s);
  const int32_t out = z->resid[l + 1];
  layer_acts *a = &z->A[l];
  char nm[64];
  a->sg = mf_pb_tensor(b, MF_T_ACT, MF_DTYPE_F32, T * Is, m, l, LNAME "%s", m, l,
                       shared_name(s, "gate", nm, sizeof nm));
  a->su = mf_pb_tensor(b, MF_T_ACT, MF_DTYPE_F32, T * Is, m, l, LNAME "%s", m, l,
                       shared_name(s, "up", nm, sizeof nm));
  a->sa = mf_pb_tensor(b, MF_T_ACT, MF_DTYPE_F32, T * Is, m, l, LNAME "%s", m, l,
                       shared_name(s, "act", nm, sizeof nm));
  /* ungated, the down projection adds into the layer's output itself */
  a->sy =
      gated ? mf_pb_tensor(b, MF_T_ACT, MF_DTYPE_F32, T * H, m, l, LNAME "mlp.shared_expert.out", m, l) : out;
  mf_pb_linear_fwd(c, l, "shared gate_proj", a->xn2, mf_pb_P(c, MF_P_SHARED_GATE, l), -1, a->sg, Is, H, 0);
  mf_pb_lora_fwd(z, l, MF_P_SHARED_GATE, shared_name(s, "gate_proj", nm, sizeof nm), a->xn2, a->sg, Is, H);
  mf_pb_linear_fwd(c, l, "shared up_proj", a->xn2, mf_pb_P(c, MF_P_SHARED_UP, l), -1, a->su, Is, H, 0);
  mf_pb_lora_fwd(z, l, MF_P_SHARED_UP, shared_name(s, "up_proj", nm, sizeof nm), a->xn2, a->su, Is, H);
  mf_pb_simple(c, MF_K_SWIGLU_FWD, MF_PHASE_FWD, l, "shared swiglu", a->sg, a->su, a->sa, -1, -1, T * Is);
  mf_pb_linear_fwd(c, l, "shared down_proj", a->sa, mf_pb_P(c, MF_P_SHARED_DOWN, l), -1, a->sy, H, Is,
                   !gated);
  mf_pb_lora_fwd(z, l, MF_P_SHARED_DOWN, shared_name(s, "down_proj", nm, sizeof nm), a->sa, a->sy, H, Is);
  if (!gated) return;
  a->sgl = mf_pb_tensor(b, MF_T_ACT, MF_DTYPE_F32, T, m, l, LNAME "mlp.shared_expert_gate.out", m, l);
  mf_pb_linear_fwd(c, l, "shared_expert_gate", a->xn2, mf_pb_P(c, MF_P_SHARED_EXPERT_GATE, l), -1, a->sgl, 1,
                   H, 0);
  mf_pop *o = mf_pb_op(b, MF_K_SIGGATE_FWD, MF_PHASE_FWD, m, l, "L%d shared gate", l);
  SET(o, a->sgl, a->sy, out);
  INTS(o, T, H);
}

/* Its backward: the gradient of the layer's output gres into dxn2. */
static void shared_bwd(const mb *z, int32_t l, int32_t gres, int32_t dxn2) {
  pb *b = z->b;
  const ctx *c = z->c;
  const mf_model_spec *s = z->s;
  const int32_t m = z->m;
  const int64_t T = z->T, H = z->H, Is = s->shared_ffn;
  const layer_acts *a = &z->A[l];
  char nm[64];
  int32_t dsy = gres; /* ungated: the output's gradient is the layer's */
  if (mf_model_spec_shared_gated(s)) {
    dsy = mf_pb_tensor(b, MF_T_ACT_GRAD, MF_DTYPE_F32, T * H, m, l, LNAME "mlp.shared_expert.out.grad", m, l);
    int32_t dsgl =
        mf_pb_tensor(b, MF_T_ACT_GRAD, MF_DTYPE_F32, T, m, l, LNAME "mlp.shared_expert_gate.out.grad", m, l);
    mf_pop *o = mf_pb_op(b, MF_K_SIGGATE_BWD, MF_PHASE_BWD, m, l, "L%d shared gate bwd", l);
    SET(o, a->sgl, a->sy, gres, dsy, dsgl);
    INTS(o, T, H);
    mf_pb_linear_bwd(c, l, "shared_expert_gate", dsgl, a->xn2, mf_pb_P(c, MF_P_SHARED_EXPERT_GATE, l),
                     mf_pb_G(c, MF_P_SHARED_EXPERT_GATE, l), -1, dxn2, 1, H, 1);
  }
  int32_t dsa = mf_pb_tensor(b, MF_T_ACT_GRAD, MF_DTYPE_F32, T * Is, m, l, LNAME "%s.grad", m, l,
                             shared_name(s, "act", nm, sizeof nm));
  int32_t dsg = mf_pb_tensor(b, MF_T_ACT_GRAD, MF_DTYPE_F32, T * Is, m, l, LNAME "%s.grad", m, l,
                             shared_name(s, "gate", nm, sizeof nm));
  int32_t dsu = mf_pb_tensor(b, MF_T_ACT_GRAD, MF_DTYPE_F32, T * Is, m, l, LNAME "%s.grad", m, l,
                             shared_name(s, "up", nm, sizeof nm));
  mf_pb_linear_bwd(c, l, "shared down_proj", dsy, a->sa, mf_pb_P(c, MF_P_SHARED_DOWN, l),
                   mf_pb_G(c, MF_P_SHARED_DOWN, l), -1, dsa, H, Is, 0);
  mf_pb_lora_bwd(z, l, MF_P_SHARED_DOWN, shared_name(s, "down_proj", nm, sizeof nm), dsy, a->sa, dsa, H, Is);
  mf_pb_simple(c, MF_K_SWIGLU_BWD, MF_PHASE_BWD, l, "shared swiglu bwd", a->sg, a->su, dsa, dsg, dsu, T * Is);
  mf_pb_linear_bwd(c, l, "shared gate_proj", dsg, a->xn2, mf_pb_P(c, MF_P_SHARED_GATE, l),
                   mf_pb_G(c, MF_P_SHARED_GATE, l), -1, dxn2, Is, H, 1);
  mf_pb_lora_bwd(z, l, MF_P_SHARED_GATE, shared_name(s, "gate_proj", nm, sizeof nm), dsg, a->xn2, dxn2, Is,
                 H);
  mf_pb_linear_bwd(c, l, "shared up_proj", dsu, a->xn2, mf_pb_P(c, MF_P_SHARED_UP, l),
                   mf_pb_G(c, MF_P_SHARED_UP, l), -1, dxn2, Is, H, 1);
  mf_pb_lora_bwd(z, l, MF_P_SHARED_UP, shared_name(s, "up_proj", nm, sizeof nm), dsu, a->xn2, dxn2, Is, H);
}

/* The routed experts' bias `role` of layer l (gpt-oss's) over the expert-sorted rows: added into y [R, N]
 * (bwd 0), or its gradient summed from dy [R, N] (bwd 1); nothing when the layer has no such bias or it
 * is frozen. what: "experts gate_proj" ... */
static void expert_bias(const mb *z, int32_t l, int bwd, mf_param_role role, int32_t y, int64_t N,
                        const char *what) {
  const int32_t bias = bwd ? mf_pb_G(z->c, role, l) : mf_pb_P(z->c, role, l);
  if (bias < 0) return;
  mf_pop *o =
      mf_pb_op(z->b, bwd ? MF_K_EXPERT_BIAS_BWD : MF_K_EXPERT_BIAS_FWD, bwd ? MF_PHASE_BWD : MF_PHASE_FWD,
               z->m, l, "L%d %s bias%s", l, what, bwd ? " grad" : "");
  SET(o, y, z->A[l].offsets, bias, bwd ? z->A[l].segs : -1); /* the gradient: by source rank's part */
  INTS(o, z->E, N, bwd && z->b->p->exchanges ? z->b->p->ep : 0);
  o->flops = (double)(z->T * z->TK) * (double)N;
}

/* Expert parallelism: this micro-batch's expert-sorted rows x [R, C] of layer l to their experts' ranks,
 * the rows of this rank's experts from every rank into y [ep R, C]. The forward's (fwd 1) writes the
 * received layout (the expert ops' offsets and the parts by source) and the routed counts the executor
 * reads; the backward's the same layout again, which its ops leave unread (they read the forward's). */
static void ep_dispatch(const mb *z, int32_t l, int32_t x, int32_t y, int64_t C, int fwd) {
  pb *b = z->b;
  const mf_program *p = b->p;
  const int32_t m = z->m;
  const int64_t E = z->E;
  layer_acts *a = &z->A[l];
  const char *sfx = fwd ? "" : ".bwd";
  const int32_t offs =
      mf_pb_tensor(b, MF_T_STAT, MF_DTYPE_I64, E + 1, m, l, LNAME "mlp.ep_offsets%s", m, l, sfx);
  const int32_t segs =
      mf_pb_tensor(b, MF_T_STAT, MF_DTYPE_I64, E * p->ep + 1, m, l, LNAME "mlp.ep_parts%s", m, l, sfx);
  const int32_t counts =
      fwd ? mf_pb_tensor(b, MF_T_STAT, MF_DTYPE_I64, E, m, l, LNAME "mlp.ep_counts", m, l) : -1;
  /* adapter dropout on the experts: where each part's rows were in their source, and its seed */
  const int drops = fwd && mf_pb_lora_experts_drop(z, l);
  const int32_t starts =
      drops ? mf_pb_tensor(b, MF_T_STAT, MF_DTYPE_I64, E * p->ep, m, l, LNAME "mlp.ep_starts", m, l) : -1;
  const int32_t seeds =
      drops ? mf_pb_tensor(b, MF_T_STAT, MF_DTYPE_I64, p->ep, m, l, LNAME "mlp.ep_seeds", m, l) : -1;
  mf_pop *o = mf_pb_op(b, MF_K_EP_DISPATCH, fwd ? MF_PHASE_FWD : MF_PHASE_BWD, m, l, "L%d ep dispatch%s", l,
                       fwd ? "" : " bwd");
  SET(o, x, a->loffs, y, offs, segs, counts, starts, seeds);
  INTS(o, E, p->ep, C, p->ep_rank, drops ? MF_PROGRAM_SEED_RUNTIME : 0);
  if (fwd) a->offsets = offs, a->segs = segs, a->starts = starts, a->seeds = seeds;
}

/* ... and back: y [ep R, C] (the received layout) to the ranks that sent its rows, into x [R, C]. */
static void ep_combine(const mb *z, int32_t l, mf_phase ph, int32_t y, int32_t x, int64_t C) {
  const mf_program *p = z->b->p;
  const layer_acts *a = &z->A[l];
  mf_pop *o =
      mf_pb_op(z->b, MF_K_EP_COMBINE, ph, z->m, l, "L%d ep combine%s", l, ph == MF_PHASE_FWD ? "" : " bwd");
  SET(o, y, a->offsets, a->segs, a->loffs, x);
  INTS(o, z->E, p->ep, C, p->ep_rank);
}

/* Layer l's routed experts (and shared expert), added into the layer's output. */
void mf_pb_moe_fwd(const mb *z, int32_t l) {
  pb *b = z->b;
  const ctx *c = z->c;
  const mf_model_spec *s = z->s;
  const int32_t m = z->m;
  const int64_t T = z->T, H = z->H, E = z->E, TK = z->TK, I = z->I;
  int32_t *resid = z->resid;
  layer_acts *a = &z->A[l];
  const int32_t aux_counts = z->aux_counts, aux_psum = z->aux_psum;
  const mf_program *p = b->p;
  mf_pop *o;
  const int64_t R = T * TK;
  a->rl = mf_pb_tensor(b, MF_T_ACT, MF_DTYPE_F32, T * E, m, l, LNAME "mlp.router_logits", m, l);
  mf_pb_linear_fwd(c, l, "router", a->xn2, mf_pb_P(c, MF_P_ROUTER, l), mf_pb_P(c, MF_P_ROUTER_LINEAR_BIAS, l),
                   a->rl, E, H, 0);
  a->probs = mf_pb_tensor(b, MF_T_STAT, MF_DTYPE_F32, T * E, m, l, LNAME "mlp.router_probs", m, l);
  a->tki = mf_pb_tensor(b, MF_T_STAT, MF_DTYPE_I32, T * TK, m, l, LNAME "mlp.topk_idx", m, l);
  a->tkw = mf_pb_tensor(b, MF_T_STAT, MF_DTYPE_F32, T * TK, m, l, LNAME "mlp.topk_w", m, l);
  if (s->router == MF_ROUTER_SIGMOID_GROUP) { /* probs: the sigmoid scores; no aux loss */
    o = mf_pb_op(b, MF_K_ROUTER_GROUP_FWD, MF_PHASE_FWD, m, l, "L%d router group top-k", l);
    SET(o, a->rl, mf_pb_P(c, MF_P_ROUTER_BIAS, l), a->probs, a->tki, a->tkw);
    INTS(o, T, E, TK, s->n_group, s->topk_group, s->norm_topk_prob);
    o->f[0] = s->routed_scaling;
  } else {
    /* mode 1 (gpt-oss): the top-k logits, softmax over them; probs what its aux loss reads */
    const int topk_first = s->router == MF_ROUTER_TOPK_SOFTMAX;
    o = mf_pb_op(b, MF_K_ROUTER_FWD, MF_PHASE_FWD, m, l, "L%d router top-k", l);
    SET(o, a->rl, a->probs, a->tki, a->tkw);
    INTS(o, T, E, TK, topk_first ? 0 : s->norm_topk_prob, topk_first);
    o = mf_pb_op(b, MF_K_AUX_ACCUMULATE, MF_PHASE_FWD, m, l, "L%d aux stats", l);
    SET(o, a->probs, a->tki, aux_counts, aux_psum);
    INTS(o, T, E, TK);
  }
  a->counts = mf_pb_tensor(b, MF_T_STAT, MF_DTYPE_I64, E, m, l, LNAME "mlp.expert_counts", m, l);
  a->offsets = mf_pb_tensor(b, MF_T_STAT, MF_DTYPE_I64, E + 1, m, l, LNAME "mlp.expert_offsets", m, l);
  a->row_of = mf_pb_tensor(b, MF_T_STAT, MF_DTYPE_I32, R, m, l, LNAME "mlp.row_of", m, l);
  a->tor = mf_pb_tensor(b, MF_T_STAT, MF_DTYPE_I32, R, m, l, LNAME "mlp.token_of_row", m, l);
  o = mf_pb_op(b, MF_K_MOE_DISPATCH, MF_PHASE_FWD, m, l, "L%d dispatch", l);
  SET(o, a->tki, a->counts, a->offsets, a->row_of, a->tor);
  INTS(o, T, TK, E);
  a->loffs = a->offsets;
  a->segs = a->starts = a->seeds = -1;
  const int ep = p->exchanges;
  const int64_t Rr = p->ep * R; /* the rows this rank's experts may receive */
  a->xe = mf_pb_tensor(b, MF_T_ACT, MF_DTYPE_F32, R * H, m, l, LNAME "mlp.experts.in%s", m, l,
                       ep ? ".local" : "");
  o = mf_pb_op(b, MF_K_MOE_GATHER, MF_PHASE_FWD, m, l, "L%d gather", l);
  SET(o, a->xn2, a->tor, a->xe);
  INTS(o, R, H);
  if (ep) { /* the rows go to their experts' ranks; this rank's experts get every rank's */
    const int32_t xl = a->xe;
    a->xe = mf_pb_tensor(b, MF_T_ACT, MF_DTYPE_F32, Rr * H, m, l, LNAME "mlp.experts.in", m, l);
    ep_dispatch(z, l, xl, a->xe, H, 1);
  }
  a->eg = mf_pb_tensor(b, MF_T_ACT, MF_DTYPE_F32, Rr * I, m, l, LNAME "mlp.experts.gate", m, l);
  a->eu = mf_pb_tensor(b, MF_T_ACT, MF_DTYPE_F32, Rr * I, m, l, LNAME "mlp.experts.up", m, l);
  a->ea = mf_pb_tensor(b, MF_T_ACT, MF_DTYPE_F32, Rr * I, m, l, LNAME "mlp.experts.act", m, l);
  const int32_t eyr = mf_pb_tensor(b, MF_T_ACT, MF_DTYPE_F32, Rr * H, m, l, LNAME "mlp.experts.out%s", m, l,
                                   ep ? ".sent" : "");
  const struct {
    mf_param_role role;
    int32_t in, out;
    int64_t N, K;
    const char *what, *hf;
  } proj[3] = {{MF_P_EXPERT_GATE, a->xe, a->eg, I, H, "experts gate_proj", "gate_proj"},
               {MF_P_EXPERT_UP, a->xe, a->eu, I, H, "experts up_proj", "up_proj"},
               {MF_P_EXPERT_DOWN, a->ea, eyr, H, I, "experts down_proj", "down_proj"}};
  static const mf_param_role bias_of[3] = {MF_P_EXPERT_GATE_BIAS, MF_P_EXPERT_UP_BIAS, MF_P_EXPERT_DOWN_BIAS};
  const int clamped = mf_model_spec_swiglu_clamped(s); /* gpt-oss: the clamped SwiGLU */
  for (int j = 0; j < 3; j++) {
    if (j == 2 && clamped) {
      o = mf_pb_op(b, MF_K_SWIGLU_CLAMP_FWD, MF_PHASE_FWD, m, l, "L%d experts clamped swiglu", l);
      SET(o, a->eg, a->eu, a->ea);
      INTS(o, Rr * I);
      o->f[0] = MF_GPT_OSS_SWIGLU_LIMIT, o->f[1] = MF_GPT_OSS_SWIGLU_ALPHA;
      o->flops = 8.0 * (double)R * (double)I;
    } else if (j == 2) {
      mf_pb_simple(c, MF_K_SWIGLU_FWD, MF_PHASE_FWD, l, "experts swiglu", a->eg, a->eu, a->ea, -1, -1,
                   Rr * I);
    }
    int32_t at = mf_pb_experts_of(c, proj[j].role, l, 0, -1);
    o = mf_pb_op(b, MF_K_EXPERT_FWD, MF_PHASE_FWD, m, l, "L%d %s", l, proj[j].what);
    SET(o, proj[j].in, a->offsets, proj[j].out);
    INTS(o, E, proj[j].N, proj[j].K);
    o->experts_at = at;
    o->flops = 2.0 * (double)R * (double)proj[j].N * (double)proj[j].K;
    mf_pb_lora_experts_fwd(z, l, proj[j].role, proj[j].hf, proj[j].in, proj[j].out, proj[j].N, proj[j].K);
    expert_bias(z, l, 0, bias_of[j], proj[j].out, proj[j].N, proj[j].what);
  }
  a->ey = eyr;
  if (ep) { /* the rows come back to the ranks that sent them */
    a->ey = mf_pb_tensor(b, MF_T_ACT, MF_DTYPE_F32, R * H, m, l, LNAME "mlp.experts.out", m, l);
    ep_combine(z, l, MF_PHASE_FWD, eyr, a->ey, H);
  }
  o = mf_pb_op(b, MF_K_MOE_COMBINE, MF_PHASE_FWD, m, l, "L%d combine", l);
  SET(o, a->ey, a->tkw, a->row_of, resid[l + 1]);
  INTS(o, T, TK, H);
  if (s->shared_ffn > 0) shared_fwd(z, l);
}

/* Layer l's routed experts (and shared expert) backward: into dxn2, the
 * gradient of the post-attention norm's output. */
void mf_pb_moe_bwd(const mb *z, int32_t l, int32_t gres, int32_t dxn2) {
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
  const int ep = p->exchanges;
  const int64_t Rr = p->ep * R; /* the rows this rank's experts received */
  int32_t dye = mf_pb_tensor(b, MF_T_ACT_GRAD, MF_DTYPE_F32, R * H, m, l, LNAME "mlp.experts.out.grad", m, l);
  int32_t dtkw = mf_pb_tensor(b, MF_T_ACT_GRAD, MF_DTYPE_F32, T * TK, m, l, LNAME "mlp.topk_w.grad", m, l);
  o = mf_pb_op(b, MF_K_MOE_COMBINE_BWD, MF_PHASE_BWD, m, l, "L%d combine bwd", l);
  SET(o, gres, a->ey, a->tkw, a->row_of, dye, dtkw);
  INTS(o, T, TK, H);
  if (ep) { /* the rows' gradients go to the experts' ranks, as the rows did */
    const int32_t dyl = dye;
    dye = mf_pb_tensor(b, MF_T_ACT_GRAD, MF_DTYPE_F32, Rr * H, m, l, LNAME "mlp.experts.out.grad.sent", m, l);
    ep_dispatch(z, l, dyl, dye, H, 0);
  }
  int32_t dea =
      mf_pb_tensor(b, MF_T_ACT_GRAD, MF_DTYPE_F32, Rr * I, m, l, LNAME "mlp.experts.act.grad", m, l);
  int32_t deg =
      mf_pb_tensor(b, MF_T_ACT_GRAD, MF_DTYPE_F32, Rr * I, m, l, LNAME "mlp.experts.gate.grad", m, l);
  int32_t deu = mf_pb_tensor(b, MF_T_ACT_GRAD, MF_DTYPE_F32, Rr * I, m, l, LNAME "mlp.experts.up.grad", m, l);
  int32_t dxe = mf_pb_tensor(b, MF_T_ACT_GRAD, MF_DTYPE_F32, Rr * H, m, l, LNAME "mlp.experts.in.grad%s", m,
                             l, ep ? ".sent" : "");
  int32_t dxe2 =
      mf_pb_tensor(b, MF_T_ACT_GRAD, MF_DTYPE_F32, Rr * H, m, l, LNAME "mlp.experts.in.grad_up", m, l);
  const int clamped = mf_model_spec_swiglu_clamped(s);
  expert_bias(z, l, 1, MF_P_EXPERT_DOWN_BIAS, dye, H, "experts down_proj");
  /* down: dW (unless frozen) then dx */
  if (!mf_pb_experts_frozen(c, MF_P_EXPERT_DOWN, l)) /* with expert parallelism: by source rank's part */
    mf_pb_expert_op(z, MF_K_EXPERT_BWD_WEIGHT, MF_PHASE_BWD, l, "experts down_proj dW", dye, a->ea,
                    a->offsets, H, I, mf_pb_experts_of(c, MF_P_EXPERT_DOWN, l, 1, -1));
  const int32_t down_w =
      mf_pb_experts_of(c, MF_P_EXPERT_DOWN, l, 0, -1); /* before the op: it may dequantize */
  o = mf_pb_op(b, MF_K_EXPERT_BWD_DATA, MF_PHASE_BWD, m, l, "L%d experts down_proj dx", l);
  SET(o, dye, a->offsets, dea);
  INTS(o, E, H, I);
  o->experts_at = down_w;
  o->flops = 2.0 * (double)R * (double)H * (double)I;
  mf_pb_lora_experts_bwd(z, l, MF_P_EXPERT_DOWN, "down_proj", dye, a->ea, dea, H, I);
  if (clamped) {
    o = mf_pb_op(b, MF_K_SWIGLU_CLAMP_BWD, MF_PHASE_BWD, m, l, "L%d experts clamped swiglu bwd", l);
    SET(o, a->eg, a->eu, dea, deg, deu);
    INTS(o, Rr * I);
    o->f[0] = MF_GPT_OSS_SWIGLU_LIMIT, o->f[1] = MF_GPT_OSS_SWIGLU_ALPHA;
    o->flops = 12.0 * (double)R * (double)I;
  } else {
    o = mf_pb_op(b, MF_K_SWIGLU_BWD, MF_PHASE_BWD, m, l, "L%d experts swiglu bwd", l);
    SET(o, a->eg, a->eu, dea, deg, deu);
    INTS(o, Rr * I);
  }
  expert_bias(z, l, 1, MF_P_EXPERT_GATE_BIAS, deg, I, "experts gate_proj");
  expert_bias(z, l, 1, MF_P_EXPERT_UP_BIAS, deu, I, "experts up_proj");
  const struct {
    mf_param_role role;
    int32_t dy, dx;
    const char *what;
  } gu[2] = {{MF_P_EXPERT_GATE, deg, dxe, "gate_proj"}, {MF_P_EXPERT_UP, deu, dxe2, "up_proj"}};
  for (int j = 0; j < 2; j++) {
    if (!mf_pb_experts_frozen(c, gu[j].role, l)) {
      char lab[48];
      snprintf(lab, sizeof lab, "experts %s dW", gu[j].what);
      mf_pb_expert_op(z, MF_K_EXPERT_BWD_WEIGHT, MF_PHASE_BWD, l, lab, gu[j].dy, a->xe, a->offsets, I, H,
                      mf_pb_experts_of(c, gu[j].role, l, 1, -1));
    }
    const int32_t w = mf_pb_experts_of(c, gu[j].role, l, 0, -1);
    o = mf_pb_op(b, MF_K_EXPERT_BWD_DATA, MF_PHASE_BWD, m, l, "L%d experts %s dx", l, gu[j].what);
    SET(o, gu[j].dy, a->offsets, gu[j].dx);
    INTS(o, E, I, H);
    o->experts_at = w;
    o->flops = 2.0 * (double)R * (double)I * (double)H;
    mf_pb_lora_experts_bwd(z, l, gu[j].role, gu[j].what, gu[j].dy, a->xe, gu[j].dx, I, H);
  }
  mf_pb_simple(c, MF_K_ADD, MF_PHASE_BWD, l, "experts dx sum", dxe2, dxe, -1, -1, -1, Rr * H);
  if (ep) { /* the rows' input gradients back to the ranks whose rows they are */
    const int32_t dxr = dxe;
    dxe = mf_pb_tensor(b, MF_T_ACT_GRAD, MF_DTYPE_F32, R * H, m, l, LNAME "mlp.experts.in.grad", m, l);
    ep_combine(z, l, MF_PHASE_BWD, dxr, dxe, H);
  }
  o = mf_pb_op(b, MF_K_MOE_GATHER_BWD, MF_PHASE_BWD, m, l, "L%d gather bwd", l);
  SET(o, dxe, a->row_of, dxn2);
  INTS(o, T, TK, H, 0);
  int32_t dprobs = -1;
  if (p->aux_coef > 0 && s->router != MF_ROUTER_SIGMOID_GROUP) {
    dprobs = mf_pb_keep_fp32(
        b, mf_pb_tensor(b, MF_T_ACT_GRAD, MF_DTYPE_F32, T * E, m, l, LNAME "mlp.router_probs.grad", m, l));
    o = mf_pb_op(b, MF_K_AUX_GRAD, MF_PHASE_BWD, m, l, "L%d aux grad", l);
    SET(o, aux_counts, dprobs);
    INTS(o, E, aux_rows, T);
    o->f[0] = p->aux_coef / mf_program_loss_divisor(p);
  }
  int32_t drl =
      mf_pb_tensor(b, MF_T_ACT_GRAD, MF_DTYPE_F32, T * E, m, l, LNAME "mlp.router_logits.grad", m, l);
  if (s->router == MF_ROUTER_SIGMOID_GROUP) { /* the bias and the choice get no gradient */
    o = mf_pb_op(b, MF_K_ROUTER_GROUP_BWD, MF_PHASE_BWD, m, l, "L%d router group bwd", l);
    SET(o, a->probs, a->tki, dtkw, drl);
    INTS(o, T, E, TK, s->n_group, s->topk_group, s->norm_topk_prob);
    o->f[0] = s->routed_scaling;
  } else {
    const int topk_first = s->router == MF_ROUTER_TOPK_SOFTMAX;
    o = mf_pb_op(b, MF_K_ROUTER_BWD, MF_PHASE_BWD, m, l, "L%d router bwd", l);
    SET(o, a->probs, a->tki, a->tkw, dtkw, dprobs, drl);
    INTS(o, T, E, TK, topk_first ? 0 : s->norm_topk_prob, topk_first);
  }
  mf_pb_linear_bwd(c, l, "router", drl, a->xn2, mf_pb_P(c, MF_P_ROUTER, l), mf_pb_G(c, MF_P_ROUTER, l),
                   mf_pb_G(c, MF_P_ROUTER_LINEAR_BIAS, l), dxn2, E, H, 1);
  if (s->shared_ffn > 0) shared_bwd(z, l, gres, dxn2);
}
