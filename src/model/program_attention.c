/* The step program's attention block, forward and backward (program_build.h). */
#include <math.h>
#include <stdio.h>

#include "src/model/program_build.h"

/* The (query, key) pairs of one sequence and head the attention scores: the
 * causal triangle, or with a sliding window of W keys its band. */
static double attn_pairs(int64_t S, int64_t W) {
  if (W <= 0 || W >= S) return (double)S * (double)(S + 1) / 2.0;
  return (double)W * (double)(W + 1) / 2.0 + (double)(S - W) * (double)W;
}

/* Grouped-query attention: q, k, v projections, q/k norms, RoPE and the attention into a->att. */
static void gqa_fwd(const mb *z, int32_t l) {
  pb *b = z->b;
  const ctx *c = z->c;
  const mf_model_spec *s = z->s;
  const int32_t m = z->m;
  const int64_t B = z->B, S = z->S, T = z->T, H = z->H, D = z->D, Hq = z->Hq, Hkv = z->Hkv;
  layer_acts *a = &z->A[l];
  a->q = mf_pb_tensor(b, MF_T_ACT, MF_DTYPE_F32, T * Hq * D, m, l, LNAME "self_attn.q", m, l);
  a->k = mf_pb_tensor(b, MF_T_ACT, MF_DTYPE_F32, T * Hkv * D, m, l, LNAME "self_attn.k", m, l);
  a->v = mf_pb_tensor(b, MF_T_ACT, MF_DTYPE_F32, T * Hkv * D, m, l, LNAME "self_attn.v", m, l);
  mf_pb_linear_fwd(c, l, "q_proj", a->xn1, mf_pb_P(c, MF_P_Q, l), mf_pb_P(c, MF_P_Q_BIAS, l), a->q, Hq * D, H,
                   0);
  mf_pb_linear_fwd(c, l, "k_proj", a->xn1, mf_pb_P(c, MF_P_K, l), mf_pb_P(c, MF_P_K_BIAS, l), a->k, Hkv * D,
                   H, 0);
  mf_pb_linear_fwd(c, l, "v_proj", a->xn1, mf_pb_P(c, MF_P_V, l), mf_pb_P(c, MF_P_V_BIAS, l), a->v, Hkv * D,
                   H, 0);
  mf_pb_lora_fwd(z, l, MF_P_Q, "self_attn.q_proj", a->xn1, a->q, Hq * D, H);
  mf_pb_lora_fwd(z, l, MF_P_K, "self_attn.k_proj", a->xn1, a->k, Hkv * D, H);
  mf_pb_lora_fwd(z, l, MF_P_V, "self_attn.v_proj", a->xn1, a->v, Hkv * D, H);
  a->qa = a->q;
  a->ka = a->k;
  if (s->qk_norm != MF_QK_NORM_NONE) {
    const int per_head = s->qk_norm == MF_QK_NORM_PER_HEAD;
    const int64_t Rq = per_head ? T * Hq : T, Cq = per_head ? D : Hq * D;
    const int64_t Rk = per_head ? T * Hkv : T, Ck = per_head ? D : Hkv * D;
    a->qn = mf_pb_tensor(b, MF_T_ACT, MF_DTYPE_F32, T * Hq * D, m, l, LNAME "self_attn.q_norm.out", m, l);
    a->kn = mf_pb_tensor(b, MF_T_ACT, MF_DTYPE_F32, T * Hkv * D, m, l, LNAME "self_attn.k_norm.out", m, l);
    a->qr = mf_pb_tensor(b, MF_T_STAT, MF_DTYPE_F32, Rq, m, l, LNAME "self_attn.q_norm.rstd", m, l);
    a->kr = mf_pb_tensor(b, MF_T_STAT, MF_DTYPE_F32, Rk, m, l, LNAME "self_attn.k_norm.rstd", m, l);
    mf_pb_rmsnorm_fwd(c, l, "q_norm", a->q, mf_pb_P(c, MF_P_Q_NORM, l), a->qn, a->qr, Rq, Cq);
    mf_pb_rmsnorm_fwd(c, l, "k_norm", a->k, mf_pb_P(c, MF_P_K_NORM, l), a->kn, a->kr, Rk, Ck);
    a->qa = a->qn;
    a->ka = a->kn;
  }
  mf_pb_rope(z, l, MF_K_ROPE_FWD, "rope q", a->qa, Hq, D, z->rot, 0);
  mf_pb_rope(z, l, MF_K_ROPE_FWD, "rope k", a->ka, Hkv, D, z->rot, 0);
  a->att = mf_pb_tensor(b, MF_T_ACT, MF_DTYPE_F32, T * Hq * D, m, l, LNAME "self_attn.attn_out", m, l);
  a->lse = mf_pb_tensor(b, MF_T_STAT, MF_DTYPE_F32, B * Hq * S, m, l, LNAME "self_attn.lse", m, l);
  mf_pop *o = mf_pb_op(b, MF_K_ATTN_FWD, MF_PHASE_FWD, m, l, "L%d attention", l);
  SET(o, a->qa, a->ka, a->v, a->att, a->lse, mf_pb_P(c, MF_P_SINKS, l)); /* gpt-oss: sinks, windows */
  INTS(o, B, S, Hq, Hkv, D, D, mf_model_spec_window(s, l));
  o->f[0] = z->scale;
  o->flops = 2.0 * 2.0 * (double)B * (double)Hq * (double)D * attn_pairs(S, mf_model_spec_window(s, l));
}

/* Layer l's attention block and its norms; the layer's output zeroed for the MLP to add into. */
void mf_pb_attention_fwd(const mb *z, int32_t l) {
  pb *b = z->b;
  const ctx *c = z->c;
  const mf_model_spec *s = z->s;
  const int32_t m = z->m;
  const int64_t T = z->T, H = z->H, HV = z->Hq * z->Dv; /* the attention's output width */
  int32_t *resid = z->resid;
  layer_acts *a = &z->A[l];
  a->xn1 = mf_pb_tensor(b, MF_T_ACT, MF_DTYPE_F32, T * H, m, l, LNAME "input_layernorm.out", m, l);
  a->rstd1 = mf_pb_tensor(b, MF_T_STAT, MF_DTYPE_F32, T, m, l, LNAME "input_layernorm.rstd", m, l);
  mf_pb_rmsnorm_fwd(c, l, "input_layernorm", resid[l], mf_pb_P(c, MF_P_ATTN_NORM, l), a->xn1, a->rstd1, T, H);
  if (mf_model_spec_is_mla(s))
    mf_pb_mla_fwd(z, l);
  else
    gqa_fwd(z, l);
  a->hmid = mf_pb_tensor(b, MF_T_ACT, MF_DTYPE_F32, T * H, m, l, LNAME "self_attn.residual_out", m, l);
  mf_pb_linear_fwd(c, l, "o_proj", a->att, mf_pb_P(c, MF_P_O, l), mf_pb_P(c, MF_P_O_BIAS, l), a->hmid, H, HV,
                   0);
  mf_pb_lora_fwd(z, l, MF_P_O, "self_attn.o_proj", a->att, a->hmid, H, HV);
  mf_pb_simple(c, MF_K_ADD, MF_PHASE_FWD, l, "attn residual", resid[l], a->hmid, -1, -1, -1, T * H);
  a->xn2 = mf_pb_tensor(b, MF_T_ACT, MF_DTYPE_F32, T * H, m, l, LNAME "post_attention_layernorm.out", m, l);
  a->rstd2 = mf_pb_tensor(b, MF_T_STAT, MF_DTYPE_F32, T, m, l, LNAME "post_attention_layernorm.rstd", m, l);
  mf_pb_rmsnorm_fwd(c, l, "post_attention_layernorm", a->hmid, mf_pb_P(c, MF_P_MLP_NORM, l), a->xn2, a->rstd2,
                    T, H);
  resid[l + 1] = mf_pb_tensor(b, MF_T_ACT, MF_DTYPE_F32, T * H, m, l, LNAME "out", m, l);
  mf_pb_simple(c, MF_K_ZERO, MF_PHASE_FWD, l, "mlp out = 0", resid[l + 1], -1, -1, -1, -1, T * H);
}

/* Its backward, from the attention's output gradient datt into dxn1, the input norm's output gradient. */
static void gqa_bwd(const mb *z, int32_t l, int32_t datt, int32_t dxn1) {
  pb *b = z->b;
  const ctx *c = z->c;
  const mf_model_spec *s = z->s;
  const int32_t m = z->m;
  const int64_t B = z->B, S = z->S, T = z->T, H = z->H, D = z->D, Hq = z->Hq, Hkv = z->Hkv;
  const layer_acts *a = &z->A[l];
  mf_pop *o;
  int32_t dqa =
      mf_pb_tensor(b, MF_T_ACT_GRAD, MF_DTYPE_F32, T * Hq * D, m, l, LNAME "self_attn.q_rope.grad", m, l);
  int32_t dka =
      mf_pb_tensor(b, MF_T_ACT_GRAD, MF_DTYPE_F32, T * Hkv * D, m, l, LNAME "self_attn.k_rope.grad", m, l);
  int32_t dv =
      mf_pb_tensor(b, MF_T_ACT_GRAD, MF_DTYPE_F32, T * Hkv * D, m, l, LNAME "self_attn.v.grad", m, l);
  o = mf_pb_op(b, MF_K_ATTN_BWD, MF_PHASE_BWD, m, l, "L%d attention bwd", l);
  SET(o, a->qa, a->ka, a->v, a->att, datt, a->lse, dqa, dka, dv, mf_pb_P(c, MF_P_SINKS, l),
      mf_pb_G(c, MF_P_SINKS, l));
  INTS(o, B, S, Hq, Hkv, D, D, mf_model_spec_window(s, l));
  o->f[0] = z->scale;
  o->flops = 2.5 * 2.0 * 2.0 * (double)B * (double)Hq * (double)D * attn_pairs(S, mf_model_spec_window(s, l));
  mf_pb_rope(z, l, MF_K_ROPE_BWD, "rope q bwd", dqa, Hq, D, z->rot, 0);
  mf_pb_rope(z, l, MF_K_ROPE_BWD, "rope k bwd", dka, Hkv, D, z->rot, 0);
  int32_t dq = dqa, dk = dka;
  if (s->qk_norm != MF_QK_NORM_NONE) {
    const int per_head = s->qk_norm == MF_QK_NORM_PER_HEAD;
    dq = mf_pb_tensor(b, MF_T_ACT_GRAD, MF_DTYPE_F32, T * Hq * D, m, l, LNAME "self_attn.q.grad", m, l);
    dk = mf_pb_tensor(b, MF_T_ACT_GRAD, MF_DTYPE_F32, T * Hkv * D, m, l, LNAME "self_attn.k.grad", m, l);
    mf_pb_rmsnorm_bwd(c, l, "q_norm", dqa, a->q, mf_pb_P(c, MF_P_Q_NORM, l), a->qr, dq,
                      mf_pb_G(c, MF_P_Q_NORM, l), per_head ? T * Hq : T, per_head ? D : Hq * D, 0);
    mf_pb_rmsnorm_bwd(c, l, "k_norm", dka, a->k, mf_pb_P(c, MF_P_K_NORM, l), a->kr, dk,
                      mf_pb_G(c, MF_P_K_NORM, l), per_head ? T * Hkv : T, per_head ? D : Hkv * D, 0);
  }
  mf_pb_linear_bwd(c, l, "q_proj", dq, a->xn1, mf_pb_P(c, MF_P_Q, l), mf_pb_G(c, MF_P_Q, l),
                   mf_pb_G(c, MF_P_Q_BIAS, l), dxn1, Hq * D, H, 0);
  mf_pb_lora_bwd(z, l, MF_P_Q, "self_attn.q_proj", dq, a->xn1, dxn1, Hq * D, H);
  mf_pb_linear_bwd(c, l, "k_proj", dk, a->xn1, mf_pb_P(c, MF_P_K, l), mf_pb_G(c, MF_P_K, l),
                   mf_pb_G(c, MF_P_K_BIAS, l), dxn1, Hkv * D, H, 1);
  mf_pb_lora_bwd(z, l, MF_P_K, "self_attn.k_proj", dk, a->xn1, dxn1, Hkv * D, H);
  mf_pb_linear_bwd(c, l, "v_proj", dv, a->xn1, mf_pb_P(c, MF_P_V, l), mf_pb_G(c, MF_P_V, l),
                   mf_pb_G(c, MF_P_V_BIAS, l), dxn1, Hkv * D, H, 1);
  mf_pb_lora_bwd(z, l, MF_P_V, "self_attn.v_proj", dv, a->xn1, dxn1, Hkv * D, H);
}

/* Layer l's attention block backward, from the post-attention norm down to the
 * input norm: the residual gradient gres updated. */
void mf_pb_attention_bwd(const mb *z, int32_t l, int32_t gres, int32_t dxn2) {
  pb *b = z->b;
  const ctx *c = z->c;
  const int32_t m = z->m;
  const int64_t T = z->T, H = z->H, HV = z->Hq * z->Dv;
  const layer_acts *a = &z->A[l];
  mf_pb_rmsnorm_bwd(c, l, "post_attention_layernorm", dxn2, a->hmid, mf_pb_P(c, MF_P_MLP_NORM, l), a->rstd2,
                    gres, mf_pb_G(c, MF_P_MLP_NORM, l), T, H, 1);
  int32_t datt =
      mf_pb_tensor(b, MF_T_ACT_GRAD, MF_DTYPE_F32, T * HV, m, l, LNAME "self_attn.attn_out.grad", m, l);
  mf_pb_linear_bwd(c, l, "o_proj", gres, a->att, mf_pb_P(c, MF_P_O, l), mf_pb_G(c, MF_P_O, l),
                   mf_pb_G(c, MF_P_O_BIAS, l), datt, H, HV, 0);
  mf_pb_lora_bwd(z, l, MF_P_O, "self_attn.o_proj", gres, a->att, datt, H, HV);
  int32_t dxn1 =
      mf_pb_tensor(b, MF_T_ACT_GRAD, MF_DTYPE_F32, T * H, m, l, LNAME "input_layernorm.out.grad", m, l);
  if (mf_model_spec_is_mla(z->s))
    mf_pb_mla_bwd(z, l, datt, dxn1);
  else
    gqa_bwd(z, l, datt, dxn1);
  mf_pb_rmsnorm_bwd(c, l, "input_layernorm", dxn1, z->resid[l], mf_pb_P(c, MF_P_ATTN_NORM, l), a->rstd1, gres,
                    mf_pb_G(c, MF_P_ATTN_NORM, l), T, H, 1);
}
