/*
 * The step program's multi-head latent attention (DeepSeek-V3, Moonlight,
 * Kimi-K2; program_build.h), forward and backward, as transformers 4.57's
 * DeepseekV3Attention computes it:
 *
 *   q   = q_b_proj(q_a_layernorm(q_a_proj(x)))  or  q_proj(x)        [T, Hq, D]   D = nope + rope
 *   (both latent norms with eps 1e-6, DeepseekV3RMSNorm's default, whatever rms_norm_eps says)
 *   kva = kv_a_proj_with_mqa(x)                                      [T, rkv + rope]
 *   c   = kva[:, :rkv],  kr = rope(kva[:, rkv:])                     one rope key for every head
 *   kvb = kv_b_proj(kv_a_layernorm(c))                               [T, Hq, nope + Dv]
 *   k   = [kvb[..., :nope] | kr],  v = kvb[..., nope:]               [T, Hq, D], [T, Hq, Dv]
 *   q[..., nope:] = rope(q[..., nope:])
 *   att = attention(q, k, v) with scale D^-0.5 (times YaRN's mscale^2)
 *
 * The blocks are taken apart and put together with SLICE (kernels/cpu/slice.c);
 * the rope key is rotated once and broadcast to the heads, as transformers
 * expands it after its rotation; its gradient is the heads' sum (SLICE_BWD).
 * With rope_interleave RoPE rotates adjacent pairs in place: transformers
 * permutes the slice first, and q and k get the same permutation, so q.k is
 * the same (kernels/cpu/rope.c).
 */
#include <stdio.h>

#include "src/model/program_build.h"

/* q_a_layernorm's and kv_a_layernorm's epsilon: DeepseekV3RMSNorm's default, not rms_norm_eps */
#define MLA_NORM_EPS 1e-6

/* y (+)= a block of x's rows (x row r / rep for y row r); the kernel's sizes in order. */
static void slice_op(const mb *z, int32_t l, mf_kernel kind, const char *what, int32_t x, int32_t y,
                     int64_t rows, int64_t C, int64_t xs, int64_t xo, int64_t ys, int64_t yo, int64_t rep,
                     int acc) {
  mf_pop *o =
      mf_pb_op(z->b, kind, kind == MF_K_SLICE ? MF_PHASE_FWD : MF_PHASE_BWD, z->m, l, "L%d %s", l, what);
  SET(o, x, y);
  INTS(o, rows, C, xs, xo, ys, yo, rep, acc);
  o->flops = (double)rows * (double)C * (double)rep;
}

void mf_pb_mla_fwd(const mb *z, int32_t l) {
  pb *b = z->b;
  const ctx *c = z->c;
  const mf_model_spec *s = z->s;
  const int32_t m = z->m;
  const int64_t B = z->B, S = z->S, T = z->T, H = z->H, D = z->D, Hq = z->Hq, Dv = z->Dv;
  const int64_t dn = s->qk_nope_dim, dr = s->qk_rope_dim, rq = s->q_lora_rank, rkv = s->kv_lora_rank;
  layer_acts *a = &z->A[l];
  /* q */
  a->q = mf_pb_tensor(b, MF_T_ACT, MF_DTYPE_F32, T * Hq * D, m, l, LNAME "self_attn.q", m, l);
  if (rq > 0) {
    a->mqa = mf_pb_tensor(b, MF_T_ACT, MF_DTYPE_F32, T * rq, m, l, LNAME "self_attn.q_a_proj.out", m, l);
    a->mqr = mf_pb_tensor(b, MF_T_STAT, MF_DTYPE_F32, T, m, l, LNAME "self_attn.q_a_layernorm.rstd", m, l);
    a->mqn = mf_pb_tensor(b, MF_T_ACT, MF_DTYPE_F32, T * rq, m, l, LNAME "self_attn.q_a_layernorm.out", m, l);
    mf_pb_linear_fwd(c, l, "q_a_proj", a->xn1, mf_pb_P(c, MF_P_Q_A, l), -1, a->mqa, rq, H, 0);
    mf_pb_lora_fwd(z, l, MF_P_Q_A, "self_attn.q_a_proj", a->xn1, a->mqa, rq, H);
    mf_pb_rmsnorm_fwd_eps(c, l, "q_a_layernorm", a->mqa, mf_pb_P(c, MF_P_Q_A_NORM, l), a->mqn, a->mqr, T, rq,
                          MLA_NORM_EPS);
    mf_pb_linear_fwd(c, l, "q_b_proj", a->mqn, mf_pb_P(c, MF_P_Q_B, l), -1, a->q, Hq * D, rq, 0);
    mf_pb_lora_fwd(z, l, MF_P_Q_B, "self_attn.q_b_proj", a->mqn, a->q, Hq * D, rq);
  } else {
    mf_pb_linear_fwd(c, l, "q_proj", a->xn1, mf_pb_P(c, MF_P_Q, l), -1, a->q, Hq * D, H, 0);
    mf_pb_lora_fwd(z, l, MF_P_Q, "self_attn.q_proj", a->xn1, a->q, Hq * D, H);
  }
  /* the compressed kv and the rope key */
  a->mkva =
      mf_pb_tensor(b, MF_T_ACT, MF_DTYPE_F32, T * (rkv + dr), m, l, LNAME "self_attn.kv_a_proj.out", m, l);
  mf_pb_linear_fwd(c, l, "kv_a_proj_with_mqa", a->xn1, mf_pb_P(c, MF_P_KV_A, l), -1, a->mkva, rkv + dr, H, 0);
  mf_pb_lora_fwd(z, l, MF_P_KV_A, "self_attn.kv_a_proj_with_mqa", a->xn1, a->mkva, rkv + dr, H);
  a->mc = mf_pb_tensor(b, MF_T_ACT, MF_DTYPE_F32, T * rkv, m, l, LNAME "self_attn.compressed_kv", m, l);
  a->mkr = mf_pb_tensor(b, MF_T_ACT, MF_DTYPE_F32, T * dr, m, l, LNAME "self_attn.k_rope", m, l);
  slice_op(z, l, MF_K_SLICE, "compressed kv", a->mkva, a->mc, T, rkv, rkv + dr, 0, rkv, 0, 1, 0);
  slice_op(z, l, MF_K_SLICE, "rope key", a->mkva, a->mkr, T, dr, rkv + dr, rkv, dr, 0, 1, 0);
  mf_pb_rope(z, l, MF_K_ROPE_FWD, "rope k", a->mkr, 1, dr, dr, 0);
  a->mcr = mf_pb_tensor(b, MF_T_STAT, MF_DTYPE_F32, T, m, l, LNAME "self_attn.kv_a_layernorm.rstd", m, l);
  a->mcn = mf_pb_tensor(b, MF_T_ACT, MF_DTYPE_F32, T * rkv, m, l, LNAME "self_attn.kv_a_layernorm.out", m, l);
  mf_pb_rmsnorm_fwd_eps(c, l, "kv_a_layernorm", a->mc, mf_pb_P(c, MF_P_KV_A_NORM, l), a->mcn, a->mcr, T, rkv,
                        MLA_NORM_EPS);
  a->mkvb = mf_pb_tensor(b, MF_T_ACT, MF_DTYPE_F32, T * Hq * (dn + Dv), m, l, LNAME "self_attn.kv_b_proj.out",
                         m, l);
  mf_pb_linear_fwd(c, l, "kv_b_proj", a->mcn, mf_pb_P(c, MF_P_KV_B, l), -1, a->mkvb, Hq * (dn + Dv), rkv, 0);
  mf_pb_lora_fwd(z, l, MF_P_KV_B, "self_attn.kv_b_proj", a->mcn, a->mkvb, Hq * (dn + Dv), rkv);
  /* k = [nope | the rope key, each head], v */
  a->k = mf_pb_tensor(b, MF_T_ACT, MF_DTYPE_F32, T * Hq * D, m, l, LNAME "self_attn.k", m, l);
  a->v = mf_pb_tensor(b, MF_T_ACT, MF_DTYPE_F32, T * Hq * Dv, m, l, LNAME "self_attn.v", m, l);
  mf_pb_simple(c, MF_K_ZERO, MF_PHASE_FWD, l, "k = 0", a->k, -1, -1, -1, -1, T * Hq * D);
  if (dn > 0) slice_op(z, l, MF_K_SLICE, "k nope", a->mkvb, a->k, T * Hq, dn, dn + Dv, 0, D, 0, 1, 1);
  slice_op(z, l, MF_K_SLICE, "k rope to every head", a->mkr, a->k, T * Hq, dr, dr, 0, D, dn, Hq, 1);
  slice_op(z, l, MF_K_SLICE, "v", a->mkvb, a->v, T * Hq, Dv, dn + Dv, dn, Dv, 0, 1, 0);
  mf_pb_rope(z, l, MF_K_ROPE_FWD, "rope q", a->q, Hq, D, dr, dn);
  a->qa = a->q;
  a->ka = a->k;
  a->att = mf_pb_tensor(b, MF_T_ACT, MF_DTYPE_F32, T * Hq * Dv, m, l, LNAME "self_attn.attn_out", m, l);
  a->lse = mf_pb_tensor(b, MF_T_STAT, MF_DTYPE_F32, B * Hq * S, m, l, LNAME "self_attn.lse", m, l);
  mf_pop *o = mf_pb_op(b, MF_K_ATTN_FWD, MF_PHASE_FWD, m, l, "L%d attention", l);
  SET(o, a->q, a->k, a->v, a->att, a->lse);
  INTS(o, B, S, Hq, Hq, D, Dv);
  o->f[0] = z->scale;
  o->flops = 2.0 * (double)B * (double)Hq * (double)(D + Dv) * (double)S * (double)(S + 1) / 2.0;
}

void mf_pb_mla_bwd(const mb *z, int32_t l, int32_t datt, int32_t dxn1) {
  pb *b = z->b;
  const ctx *c = z->c;
  const mf_model_spec *s = z->s;
  const int32_t m = z->m;
  const int64_t B = z->B, S = z->S, T = z->T, H = z->H, D = z->D, Hq = z->Hq, Dv = z->Dv;
  const int64_t dn = s->qk_nope_dim, dr = s->qk_rope_dim, rq = s->q_lora_rank, rkv = s->kv_lora_rank;
  const layer_acts *a = &z->A[l];
  int32_t dq = mf_pb_tensor(b, MF_T_ACT_GRAD, MF_DTYPE_F32, T * Hq * D, m, l, LNAME "self_attn.q.grad", m, l);
  int32_t dk = mf_pb_tensor(b, MF_T_ACT_GRAD, MF_DTYPE_F32, T * Hq * D, m, l, LNAME "self_attn.k.grad", m, l);
  int32_t dv =
      mf_pb_tensor(b, MF_T_ACT_GRAD, MF_DTYPE_F32, T * Hq * Dv, m, l, LNAME "self_attn.v.grad", m, l);
  mf_pop *o = mf_pb_op(b, MF_K_ATTN_BWD, MF_PHASE_BWD, m, l, "L%d attention bwd", l);
  SET(o, a->q, a->k, a->v, a->att, datt, a->lse, dq, dk, dv);
  INTS(o, B, S, Hq, Hq, D, Dv);
  o->f[0] = z->scale;
  o->flops = 2.5 * 2.0 * (double)B * (double)Hq * (double)(D + Dv) * (double)S * (double)(S + 1) / 2.0;
  mf_pb_rope(z, l, MF_K_ROPE_BWD, "rope q bwd", dq, Hq, D, dr, dn);
  /* the rope key's gradient: the heads' sum, rotated back */
  int32_t dkr =
      mf_pb_tensor(b, MF_T_ACT_GRAD, MF_DTYPE_F32, T * dr, m, l, LNAME "self_attn.k_rope.grad", m, l);
  slice_op(z, l, MF_K_SLICE_BWD, "k rope bwd", dk, dkr, T, dr, dr, 0, D, dn, Hq, 0);
  mf_pb_rope(z, l, MF_K_ROPE_BWD, "rope k bwd", dkr, 1, dr, dr, 0);
  /* kv_b's output gradient: [k nope | v] of each head */
  int32_t dkvb = mf_pb_tensor(b, MF_T_ACT_GRAD, MF_DTYPE_F32, T * Hq * (dn + Dv), m, l,
                              LNAME "self_attn.kv_b_proj.out.grad", m, l);
  mf_pb_simple(c, MF_K_ZERO, MF_PHASE_BWD, l, "kv_b grad = 0", dkvb, -1, -1, -1, -1, T * Hq * (dn + Dv));
  if (dn > 0) slice_op(z, l, MF_K_SLICE_BWD, "k nope bwd", dk, dkvb, T * Hq, dn, dn + Dv, 0, D, 0, 1, 1);
  slice_op(z, l, MF_K_SLICE_BWD, "v bwd", dv, dkvb, T * Hq, Dv, dn + Dv, dn, Dv, 0, 1, 1);
  int32_t dcn = mf_pb_tensor(b, MF_T_ACT_GRAD, MF_DTYPE_F32, T * rkv, m, l,
                             LNAME "self_attn.kv_a_layernorm.out.grad", m, l);
  mf_pb_linear_bwd(c, l, "kv_b_proj", dkvb, a->mcn, mf_pb_P(c, MF_P_KV_B, l), mf_pb_G(c, MF_P_KV_B, l), -1,
                   dcn, Hq * (dn + Dv), rkv, 0);
  mf_pb_lora_bwd(z, l, MF_P_KV_B, "self_attn.kv_b_proj", dkvb, a->mcn, dcn, Hq * (dn + Dv), rkv);
  int32_t dc =
      mf_pb_tensor(b, MF_T_ACT_GRAD, MF_DTYPE_F32, T * rkv, m, l, LNAME "self_attn.compressed_kv.grad", m, l);
  mf_pb_rmsnorm_bwd(c, l, "kv_a_layernorm", dcn, a->mc, mf_pb_P(c, MF_P_KV_A_NORM, l), a->mcr, dc,
                    mf_pb_G(c, MF_P_KV_A_NORM, l), T, rkv, 0);
  /* kv_a's output gradient: [compressed kv | rope key] */
  int32_t dkva = mf_pb_tensor(b, MF_T_ACT_GRAD, MF_DTYPE_F32, T * (rkv + dr), m, l,
                              LNAME "self_attn.kv_a_proj.out.grad", m, l);
  mf_pb_simple(c, MF_K_ZERO, MF_PHASE_BWD, l, "kv_a grad = 0", dkva, -1, -1, -1, -1, T * (rkv + dr));
  slice_op(z, l, MF_K_SLICE_BWD, "compressed kv bwd", dc, dkva, T, rkv, rkv + dr, 0, rkv, 0, 1, 1);
  slice_op(z, l, MF_K_SLICE_BWD, "rope key bwd", dkr, dkva, T, dr, rkv + dr, rkv, dr, 0, 1, 1);
  mf_pb_linear_bwd(c, l, "kv_a_proj_with_mqa", dkva, a->xn1, mf_pb_P(c, MF_P_KV_A, l),
                   mf_pb_G(c, MF_P_KV_A, l), -1, dxn1, rkv + dr, H, 0);
  mf_pb_lora_bwd(z, l, MF_P_KV_A, "self_attn.kv_a_proj_with_mqa", dkva, a->xn1, dxn1, rkv + dr, H);
  /* q */
  if (rq > 0) {
    int32_t dqn = mf_pb_tensor(b, MF_T_ACT_GRAD, MF_DTYPE_F32, T * rq, m, l,
                               LNAME "self_attn.q_a_layernorm.out.grad", m, l);
    mf_pb_linear_bwd(c, l, "q_b_proj", dq, a->mqn, mf_pb_P(c, MF_P_Q_B, l), mf_pb_G(c, MF_P_Q_B, l), -1, dqn,
                     Hq * D, rq, 0);
    mf_pb_lora_bwd(z, l, MF_P_Q_B, "self_attn.q_b_proj", dq, a->mqn, dqn, Hq * D, rq);
    int32_t dqa =
        mf_pb_tensor(b, MF_T_ACT_GRAD, MF_DTYPE_F32, T * rq, m, l, LNAME "self_attn.q_a_proj.out.grad", m, l);
    mf_pb_rmsnorm_bwd(c, l, "q_a_layernorm", dqn, a->mqa, mf_pb_P(c, MF_P_Q_A_NORM, l), a->mqr, dqa,
                      mf_pb_G(c, MF_P_Q_A_NORM, l), T, rq, 0);
    mf_pb_linear_bwd(c, l, "q_a_proj", dqa, a->xn1, mf_pb_P(c, MF_P_Q_A, l), mf_pb_G(c, MF_P_Q_A, l), -1,
                     dxn1, rq, H, 1);
    mf_pb_lora_bwd(z, l, MF_P_Q_A, "self_attn.q_a_proj", dqa, a->xn1, dxn1, rq, H);
  } else {
    mf_pb_linear_bwd(c, l, "q_proj", dq, a->xn1, mf_pb_P(c, MF_P_Q, l), mf_pb_G(c, MF_P_Q, l), -1, dxn1,
                     Hq * D, H, 1);
    mf_pb_lora_bwd(z, l, MF_P_Q, "self_attn.q_proj", dq, a->xn1, dxn1, Hq * D, H);
  }
}
