// The step program and the operand table agree on every operand's dtype: for
// each family, F32 and BF16 storage, training and evaluation, every op's call
// as the executor builds it (each operand with its tensor's dtype) passes
// mf_kernel_call_dtype and computes in the program's storage — or in F32 for
// the ops over fp32 gradient sums (ADD of a gradient, ZERO) and ops without
// FLOAT operands. A tensor the builder made in the wrong dtype, or a table
// entry typed wrongly, fails here instead of in a kernel.
#include <gtest/gtest.h>

#include <string>

#include "kernels/backend.h"
#include "src/core/core.h"
#include "src/model/params.h"
#include "src/model/program.h"

namespace {

mf_model_spec spec_of(mf_family f) {
  mf_model_spec s;
  mf_model_spec_defaults(f, &s);
  s.hidden = 32, s.layers = 2, s.heads = 4, s.kv_heads = 2, s.head_dim = 8, s.experts = 8, s.top_k = 2;
  s.expert_ffn = 16, s.vocab = 64, s.max_seq = 64;
  if (f == MF_FAMILY_QWEN2_MOE) s.shared_ffn = 24;
  if (f == MF_FAMILY_QWEN2_MOE || f == MF_FAMILY_QWEN3_MOE) s.dense_ffn = 20;
  if (f == MF_FAMILY_QWEN2_MOE) s.n_mlp_only = 1, s.mlp_only_layers[0] = 0;
  if (f == MF_FAMILY_QWEN3_MOE) s.decoder_sparse_step = 2;
  if (f == MF_FAMILY_DEEPSEEK_V3) {  // latent attention, a low-rank q, the group router
    s.kv_heads = 4, s.q_lora_rank = 12, s.kv_lora_rank = 10, s.qk_nope_dim = 6, s.qk_rope_dim = 4;
    s.v_head_dim = 6, s.head_dim = 10, s.dense_ffn = 20, s.shared_ffn = 16, s.n_group = 2, s.topk_group = 1;
    s.first_dense = 1;
  }
  if (f == MF_FAMILY_GLM4_MOE) {  // every switch on: the router's bias, shared experts, a dense layer
    s.dense_ffn = 20, s.shared_ffn = 16, s.n_group = 2, s.topk_group = 1, s.routed_scaling = 2.5;
    s.qkv_bias = 1, s.qk_norm = MF_QK_NORM_PER_HEAD;
  }
  if (f == MF_FAMILY_GPT_OSS) s.sliding_window = 4;  // sinks, biases, the clamped SwiGLU; layer 0 slides
  return s;
}

TEST(ProgramDtypes, EveryOpAgreesWithTheOperandTable) {
  static uint8_t dummy[16];
  for (int f = MF_FAMILY_MIXTRAL; f < MF_FAMILY_COUNT_; f++) {
    const mf_model_spec s = spec_of((mf_family)f);
    mf_param_table *t = nullptr;
    ASSERT_EQ(mf_param_table_build(&s, &t), MF_OK) << mf_last_error();
    for (mf_dtype storage : {MF_DTYPE_F32, MF_DTYPE_BF16})
      for (int fwd : {0, 1}) {
        mf_program_opts o{};
        o.micro_batch = 2, o.seq_len = 8, o.grad_accum = fwd ? 1 : 2;
        o.aux_coef = s.router != MF_ROUTER_SIGMOID_GROUP ? 0.01 : 0.0;  // GLM-4.5's loss has none
        o.forward_only = fwd, o.storage = storage;
        mf_program *p = nullptr;
        ASSERT_EQ(mf_program_build(t, &o, &p), MF_OK) << mf_last_error();
        int in_storage = 0;
        for (int32_t i = 0; i < p->n_ops; i++) {
          const mf_pop *op = &p->ops[i];
          mf_kernel_call c{};
          c.kind = op->kind;
          c.label = op->label;
          for (int j = 0; j < MF_KBUF_MAX; j++)
            if (op->t[j] >= 0) c.b[j] = mf_kbuf{dummy, 1, 0, p->tensors[op->t[j]].dtype};
          void *experts[1] = {dummy};
          if (op->experts_at >= 0) {
            c.experts = experts;
            c.expert_dtype = p->tensors[p->id_pool[op->experts_at]].dtype;
          }
          mf_dtype got = MF_DTYPE_INVALID;
          ASSERT_EQ(mf_kernel_call_dtype(&c, &got), MF_OK)
              << mf_family_name((mf_family)f) << " " << mf_dtype_name(storage) << ": " << mf_last_error();
          EXPECT_TRUE(got == storage || got == MF_DTYPE_F32) << op->label;
          in_storage += got == storage;
        }
        EXPECT_GT(in_storage, p->n_ops / 2) << "most ops compute in the storage dtype";
        mf_program_free(p);
      }
    mf_param_table_free(t);
  }
}

}  // namespace
