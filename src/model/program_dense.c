/* The step program's dense MLP block, forward and backward (program_build.h). */
#include <stdio.h>

#include "src/model/program_build.h"
/* Layer l's dense MLP, written into the layer's output. */
void mf_pb_dense_fwd(const mb *z, int32_t l) {
  pb *b = z->b;
  const ctx *c = z->c;
  const mf_model_spec *s = z->s;
  const int32_t m = z->m;
  const int64_t T = z->T, H = z->H;
  int32_t *resid = z->resid;
  layer_acts *a = &z->A[l];
  const int64_t Id = s->dense_ffn;
  a->dg = mf_pb_tensor(b, MF_T_ACT, MF_DTYPE_F32, T * Id, m, l, LNAME "mlp.gate", m, l);
  a->du = mf_pb_tensor(b, MF_T_ACT, MF_DTYPE_F32, T * Id, m, l, LNAME "mlp.up", m, l);
  a->da = mf_pb_tensor(b, MF_T_ACT, MF_DTYPE_F32, T * Id, m, l, LNAME "mlp.act", m, l);
  mf_pb_linear_fwd(c, l, "gate_proj", a->xn2, mf_pb_P(c, MF_P_DENSE_GATE, l), -1, a->dg, Id, H, 0);
  mf_pb_lora_fwd(z, l, MF_P_DENSE_GATE, "mlp.gate_proj", a->xn2, a->dg, Id, H);
  mf_pb_linear_fwd(c, l, "up_proj", a->xn2, mf_pb_P(c, MF_P_DENSE_UP, l), -1, a->du, Id, H, 0);
  mf_pb_lora_fwd(z, l, MF_P_DENSE_UP, "mlp.up_proj", a->xn2, a->du, Id, H);
  mf_pb_simple(c, MF_K_SWIGLU_FWD, MF_PHASE_FWD, l, "swiglu", a->dg, a->du, a->da, -1, -1, T * Id);
  mf_pb_linear_fwd(c, l, "down_proj", a->da, mf_pb_P(c, MF_P_DENSE_DOWN, l), -1, resid[l + 1], H, Id, 1);
  mf_pb_lora_fwd(z, l, MF_P_DENSE_DOWN, "mlp.down_proj", a->da, resid[l + 1], H, Id);
}

void mf_pb_dense_bwd(const mb *z, int32_t l, int32_t gres, int32_t dxn2) {
  pb *b = z->b;
  const ctx *c = z->c;
  const mf_model_spec *s = z->s;
  const int32_t m = z->m;
  const int64_t T = z->T, H = z->H;
  const layer_acts *a = &z->A[l];
  const int64_t Id = s->dense_ffn;
  int32_t dda = mf_pb_tensor(b, MF_T_ACT_GRAD, MF_DTYPE_F32, T * Id, m, l, LNAME "mlp.act.grad", m, l);
  int32_t ddg = mf_pb_tensor(b, MF_T_ACT_GRAD, MF_DTYPE_F32, T * Id, m, l, LNAME "mlp.gate.grad", m, l);
  int32_t ddu = mf_pb_tensor(b, MF_T_ACT_GRAD, MF_DTYPE_F32, T * Id, m, l, LNAME "mlp.up.grad", m, l);
  mf_pb_linear_bwd(c, l, "down_proj", gres, a->da, mf_pb_P(c, MF_P_DENSE_DOWN, l),
                   mf_pb_G(c, MF_P_DENSE_DOWN, l), -1, dda, H, Id, 0);
  mf_pb_lora_bwd(z, l, MF_P_DENSE_DOWN, "mlp.down_proj", gres, a->da, dda, H, Id);
  mf_pb_simple(c, MF_K_SWIGLU_BWD, MF_PHASE_BWD, l, "swiglu bwd", a->dg, a->du, dda, ddg, ddu, T * Id);
  mf_pb_linear_bwd(c, l, "gate_proj", ddg, a->xn2, mf_pb_P(c, MF_P_DENSE_GATE, l),
                   mf_pb_G(c, MF_P_DENSE_GATE, l), -1, dxn2, Id, H, 0);
  mf_pb_lora_bwd(z, l, MF_P_DENSE_GATE, "mlp.gate_proj", ddg, a->xn2, dxn2, Id, H);
  mf_pb_linear_bwd(c, l, "up_proj", ddu, a->xn2, mf_pb_P(c, MF_P_DENSE_UP, l), mf_pb_G(c, MF_P_DENSE_UP, l),
                   -1, dxn2, Id, H, 1);
  mf_pb_lora_bwd(z, l, MF_P_DENSE_UP, "mlp.up_proj", ddu, a->xn2, dxn2, Id, H);
}
