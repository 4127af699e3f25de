// The proxy the planner scores candidates on: a short model whose layers stand
// for the full model's, tensor for tensor; and the planner's choice with proxy
// scoring against exact scoring on the same step.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <string>

#include "planner/plan.h"
#include "planner/proxy.h"
#include "src/core/core.h"
#include "src/core/env.h"
#include "src/model/params.h"
#include "src/model/program.h"
#include "tests/planner/planner_test_util.h"

namespace {

using namespace mf_pt;

// A Qwen2-MoE-like model of `layers` layers, dense where `dense` says.
mf_model_spec qwen2(int layers, std::initializer_list<int> dense) {
  mf_model_spec s;
  mf_model_spec_defaults(MF_FAMILY_QWEN2_MOE, &s);
  s.hidden = 32, s.layers = layers, s.heads = 4, s.kv_heads = 2, s.head_dim = 8, s.experts = 8, s.top_k = 2;
  s.expert_ffn = 16, s.shared_ffn = 24, s.dense_ffn = 20, s.vocab = 64, s.max_seq = 64;
  s.n_mlp_only = 0;
  for (int l : dense) s.mlp_only_layers[s.n_mlp_only++] = l;
  s.rope_theta = 10000.0;
  return s;
}

struct Built {
  mf_param_table *t = nullptr;
  mf_program *p = nullptr;
  explicit Built(const mf_model_spec &s, int64_t G = 2) {
    EXPECT_EQ(mf_param_table_build(&s, &t), MF_OK) << mf_last_error();
    mf_program_opts po;
    memset(&po, 0, sizeof po);
    po.micro_batch = 2, po.seq_len = 32, po.grad_accum = G, po.aux_coef = 0.01, po.ce_chunk = 16;
    EXPECT_EQ(mf_program_build(t, &po, &p), MF_OK) << mf_last_error();
  }
  ~Built() {
    mf_program_free(p);
    mf_param_table_free(t);
  }
};

// Every proxy parameter and tensor has a full counterpart of the same role
// and size at the full layer its proxy layer stands for.
void expect_stands_for(const mf_program *full, const mf_plan_proxy *x) {
  const mf_program *pp = x->prog;
  for (int64_t i = 0; i < pp->params->n; i++) {
    const mf_param &a = pp->params->params[i];
    const mf_param &b = full->params->params[x->param_full[i]];
    EXPECT_EQ(a.role, b.role) << a.name;
    EXPECT_EQ(a.expert, b.expert) << a.name;
    EXPECT_EQ(a.numel, b.numel) << a.name;
    EXPECT_EQ(b.layer, a.layer < 0 ? -1 : x->full_layer[a.layer]) << a.name << " -> " << b.name;
  }
  int mapped = 0;
  for (int32_t t = 0; t < pp->n_tensors; t++) {
    const mf_ptensor &pt = pp->tensors[t];
    if (pt.kind == MF_T_PARAM || pt.kind == MF_T_GRAD || pt.kind == MF_T_OPT) continue;  // by parameter
    if (t == pp->norm_sums) {  // every parameter's chunk sums: no one tensor of the full program's
      EXPECT_EQ(x->tensor_full[t], -1);
      continue;
    }
    const int32_t f = x->tensor_full[t];
    ASSERT_GE(f, 0) << pt.name;
    const mf_ptensor &ft = full->tensors[f];
    EXPECT_EQ(ft.bytes, pt.bytes) << pt.name;
    EXPECT_EQ(ft.kind, pt.kind) << pt.name;
    EXPECT_EQ(ft.micro, pt.micro) << pt.name;
    EXPECT_EQ(ft.layer, pt.layer < 0 ? -1 : x->full_layer[pt.layer]) << pt.name << " -> " << ft.name;
    mapped++;
  }
  EXPECT_GT(mapped, 0);
}

TEST(Proxy, RenamesOnlyTheWholeLayerNumber) {
  char out[128];
  ASSERT_TRUE(mf_plan_proxy_rename("mb1.model.layers.17.mlp.x", 17, 1, out, sizeof out));
  EXPECT_STREQ(out, "mb1.model.layers.1.mlp.x");
  ASSERT_TRUE(mf_plan_proxy_rename("mb0.model.layers.17.a", 1, 3, out, sizeof out));
  EXPECT_STREQ(out, "mb0.model.layers.17.a");  // layer 1 is not layer 17
  ASSERT_TRUE(mf_plan_proxy_rename("model.norm.out", -1, -1, out, sizeof out));
  EXPECT_STREQ(out, "model.norm.out");
  EXPECT_FALSE(mf_plan_proxy_rename("mb0.model.layers.1.mlp.experts.act", 1, 123456, out, 20));
}

TEST(Proxy, DenseAndMoELayersEachGetARepresentative) {
  Built b(qwen2(10, {0, 5}));
  mf_plan_proxy *x = nullptr;
  ASSERT_EQ(mf_plan_proxy_build(b.p, &x), MF_OK) << mf_last_error();
  ASSERT_NE(x, nullptr);
  // Majority kind MoE around each representative: M D M M M.
  ASSERT_EQ(x->n_layers, 5);
  EXPECT_TRUE(mf_model_spec_layer_is_moe(&x->prog->spec, 0));
  EXPECT_FALSE(mf_model_spec_layer_is_moe(&x->prog->spec, 1));
  for (int l = 2; l < 5; l++) EXPECT_TRUE(mf_model_spec_layer_is_moe(&x->prog->spec, l)) << l;
  for (int l = 0; l < 10; l++) EXPECT_EQ(x->rep[l], (l == 0 || l == 5) ? 1 : 3) << l;
  EXPECT_FALSE(mf_model_spec_layer_is_moe(&b.p->spec, x->full_layer[1]));
  EXPECT_TRUE(mf_model_spec_layer_is_moe(&b.p->spec, x->full_layer[3]));
  // The batch is the full program's.
  EXPECT_EQ(x->prog->B, b.p->B);
  EXPECT_EQ(x->prog->S, b.p->S);
  EXPECT_EQ(x->prog->G, b.p->G);
  expect_stands_for(b.p, x);
  mf_plan_proxy_free(x);
}

TEST(Proxy, AllMoEIsThreeLayersAndShortModelsGetNone) {
  {
    mf_model_spec s = make_shape(0).spec;
    s.layers = 6;
    Built b(s, 3);
    mf_plan_proxy *x = nullptr;
    ASSERT_EQ(mf_plan_proxy_build(b.p, &x), MF_OK) << mf_last_error();
    ASSERT_NE(x, nullptr);
    EXPECT_EQ(x->n_layers, 3);
    for (int l = 0; l < 6; l++) EXPECT_EQ(x->rep[l], 1);
    expect_stands_for(b.p, x);
    mf_plan_proxy_free(x);
  }
  {
    mf_model_spec s = make_shape(0).spec;
    s.layers = 3;
    Built b(s);
    mf_plan_proxy *x = reinterpret_cast<mf_plan_proxy *>(1);
    ASSERT_EQ(mf_plan_proxy_build(b.p, &x), MF_OK) << mf_last_error();
    EXPECT_EQ(x, nullptr);  // not smaller than the model
  }
}

// The planner scoring on the proxy: the choice fits, beats where it started
// and every baseline that fits, and is close to what exact scoring finds.
class ProxyChoice : public ::testing::TestWithParam<int> {};

TEST_P(ProxyChoice, FitsAndIsCloseToExactScoring) {
  Built b(qwen2(8, {0}));
  mf_hwprofile hw = small_profile(GetParam());
  mf_plan *resident = nullptr;
  ASSERT_EQ(mf_plan_baseline(b.p, &hw, MF_PLAN_RESIDENT, UINT64_MAX, &resident), MF_OK) << mf_last_error();
  const uint64_t need = resident->s->arena_bytes;
  mf_plan_free(resident);
  for (double frac : {0.3, 0.5, 0.8}) {
    const uint64_t budget = (uint64_t)(frac * (double)need);
    mf_plan *all[2][MF_PLAN_KIND_COUNT_];
    for (int mode = 0; mode < 2; mode++) {
      setenv("MF_PLAN_SCORING", mode ? "proxy" : "exact", 1);
      mf_env_reload();
      ASSERT_EQ(mf_plan_choose_all(b.p, &hw, budget, nullptr, nullptr, all[mode]), MF_OK) << mf_last_error();
    }
    unsetenv("MF_PLAN_SCORING");
    mf_env_reload();
    const mf_plan *px = all[1][MF_PLAN_CHOSEN], *ex = all[0][MF_PLAN_CHOSEN];
    EXPECT_LE(px->s->arena_bytes, budget) << frac;
    EXPECT_TRUE(px->fits);
    EXPECT_LE(px->sim.step_seconds, all[1][MF_PLAN_LEAST_MEMORY]->sim.step_seconds) << frac;
    for (int k = MF_PLAN_RESIDENT; k <= MF_PLAN_CHECKPOINT; k++)
      if (all[1][k]->fits) {
        EXPECT_LE(px->sim.step_seconds, all[1][k]->sim.step_seconds) << frac << " " << k;
      }
    // Proxy scores are estimates: the choice stays within 10% of exact scoring's.
    printf("budget %.0f%% of resident: exact %.6g s, proxy %.6g s (x%.4f)\n", 100 * frac, ex->sim.step_seconds,
           px->sim.step_seconds, px->sim.step_seconds / ex->sim.step_seconds);
    EXPECT_LE(px->sim.step_seconds, 1.10 * ex->sim.step_seconds) << frac;
    // And it really is a different road: something was decided beyond the start.
    EXPECT_LT(px->sim.step_seconds, all[1][MF_PLAN_LEAST_MEMORY]->sim.step_seconds) << frac;
    for (int mode = 0; mode < 2; mode++)
      for (int k = 0; k < MF_PLAN_KIND_COUNT_; k++) mf_plan_free(all[mode][k]);
  }
}

INSTANTIATE_TEST_SUITE_P(Profiles, ProxyChoice, ::testing::Values(0, 1),
                         [](const ::testing::TestParamInfo<int> &i) { return i.param ? "overlap" : "serial"; });

}  // namespace
