// The planner's choice: it fits the budget, is never predicted slower than a
// baseline that fits, gets faster (or no slower) as the budget grows, says what
// the minimum budget is when it cannot fit, and respects pinned decisions.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "planner/plan.h"
#include "src/core/core.h"
#include "tests/planner/planner_test_util.h"
#include "src/model/params.h"
#include "src/model/program.h"

namespace {

using namespace mf_pt;

class Planner : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    mf_model_spec s;
    mf_model_spec_defaults(MF_FAMILY_QWEN2_MOE, &s);
    s.hidden = 32, s.layers = 3, s.heads = 4, s.kv_heads = 2, s.head_dim = 8, s.experts = 8, s.top_k = 2;
    s.expert_ffn = 16, s.shared_ffn = 24, s.dense_ffn = 20, s.vocab = 64, s.max_seq = 64, s.n_mlp_only = 1;
    s.mlp_only_layers[0] = 0;
    ASSERT_EQ(mf_param_table_build(&s, &t_), MF_OK) << mf_last_error();
    mf_program_opts po = {2, 32, 2, 0.01, 16, 0};
    ASSERT_EQ(mf_program_build(t_, &po, &p_), MF_OK) << mf_last_error();
    hw_ = small_profile(GetParam());
  }
  void TearDown() override {
    mf_program_free(p_);
    mf_param_table_free(t_);
  }
  mf_param_table *t_ = nullptr;
  mf_program *p_ = nullptr;
  mf_hwprofile hw_;
};

TEST_P(Planner, FitsAndBeatsTheBaselinesThatFit) {
  mf_plan *least = nullptr, *resident = nullptr;
  ASSERT_EQ(mf_plan_baseline(p_, &hw_, MF_PLAN_LEAST_MEMORY, UINT64_MAX, &least), MF_OK) << mf_last_error();
  ASSERT_EQ(mf_plan_baseline(p_, &hw_, MF_PLAN_RESIDENT, UINT64_MAX, &resident), MF_OK);
  const uint64_t lo = least->s->arena_bytes, hi = resident->s->arena_bytes;
  ASSERT_LT(lo, hi);
  double prev = 1e30;
  for (int i = 0; i <= 4; i++) {
    const uint64_t budget = lo + (hi - lo) * (uint64_t)i / 4;
    mf_plan *c = nullptr;
    ASSERT_EQ(mf_plan_choose(p_, &hw_, budget, nullptr, nullptr, &c), MF_OK) << mf_last_error();
    EXPECT_LE(c->s->arena_bytes, budget);
    EXPECT_TRUE(c->fits);
    for (int k = MF_PLAN_RESIDENT; k < MF_PLAN_KIND_COUNT_; k++) {
      mf_plan *b = nullptr;
      ASSERT_EQ(mf_plan_baseline(p_, &hw_, (mf_plan_kind)k, budget, &b), MF_OK);
      if (b->fits) {
        EXPECT_LE(c->sim.step_seconds, b->sim.step_seconds) << mf_plan_kind_name((mf_plan_kind)k) << " at " << budget;
      }
      mf_plan_free(b);
    }
    EXPECT_LE(c->sim.step_seconds, prev * (1 + 1e-12)) << "more budget, slower plan at " << budget;
    prev = c->sim.step_seconds;
    mf_plan_free(c);
  }
  mf_plan_free(least);
  mf_plan_free(resident);
}

TEST_P(Planner, TooSmallABudgetNamesTheMinimum) {
  mf_plan *c = nullptr;
  EXPECT_EQ(mf_plan_choose(p_, &hw_, 4096, nullptr, nullptr, &c), MF_ERR_CONFIG);
  EXPECT_EQ(c, nullptr);
  std::string msg = mf_last_error();
  EXPECT_NE(msg.find("below the minimum"), std::string::npos) << msg;
  EXPECT_NE(msg.find("largest tensors"), std::string::npos) << msg;
}

TEST_P(Planner, PinnedDecisionsStay) {
  mf_decisions *fixed = nullptr;
  ASSERT_EQ(mf_decisions_create(p_, &fixed), MF_OK);
  mf_plan_pins pins{};
  ASSERT_EQ(mf_plan_pins_create(p_, &pins), MF_OK);
  // Pin every expert weight to streaming; give the planner all the memory it wants.
  int pinned = 0;
  for (int32_t i = 0; i < fixed->n_params; i++)
    if (t_->params[i].expert >= 0) fixed->param[i] = MF_PARAM_STREAM, pins.param[i] = 1, pinned++;
  ASSERT_GT(pinned, 0);
  mf_plan *c = nullptr;
  ASSERT_EQ(mf_plan_choose(p_, &hw_, UINT64_MAX, fixed, &pins, &c), MF_OK) << mf_last_error();
  for (int32_t i = 0; i < fixed->n_params; i++)
    if (pins.param[i]) {
      EXPECT_EQ(c->d->param[i], MF_PARAM_STREAM) << t_->params[i].name;
    }
  mf_plan_free(c);
  mf_plan_pins_free(&pins);
  mf_decisions_free(fixed);
}

INSTANTIATE_TEST_SUITE_P(Profiles, Planner, ::testing::Values(0, 1),
                         [](const ::testing::TestParamInfo<int> &i) {
                           return std::string(i.param ? "overlapping_copies" : "serial");
                         });

}  // namespace
