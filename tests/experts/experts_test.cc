// experts/experts.h: heat ranks (ties by index), the hot quarters, use
// chances, the expected busy experts, the idle-expert test, staging groups.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "experts/experts.h"
#include "src/model/params.h"
#include "src/model/program.h"

namespace {

TEST(Experts, HeatRankOrdersBySharesThenIndex) {
  const double row[6] = {0.1, 0.3, 0.1, 0.0, 0.3, 0.2};
  const int32_t want[6] = {3, 0, 4, 5, 1, 2};
  std::vector<int> seen(6, 0);
  for (int e = 0; e < 6; e++) {
    EXPECT_EQ(mf_experts_heat_rank(row, 6, e), want[e]) << e;
    seen[mf_experts_heat_rank(row, 6, e)]++;
  }
  for (int r = 0; r < 6; r++) EXPECT_EQ(seen[r], 1) << "ranks are a permutation";
}

TEST(Experts, HotQuartersSplitTheRanks) {
  int64_t lo, hi;
  mf_experts_hot_quarter(128, 1, &lo, &hi);
  EXPECT_EQ(lo, 0);
  EXPECT_EQ(hi, 32);
  mf_experts_hot_quarter(128, 2, &lo, &hi);
  EXPECT_EQ(lo, 32);
  EXPECT_EQ(hi, 64);
  mf_experts_hot_quarter(6, 1, &lo, &hi);  // 6/4: the first quarter holds one expert
  EXPECT_EQ(lo, 0);
  EXPECT_EQ(hi, 1);
  mf_experts_hot_quarter(6, 2, &lo, &hi);
  EXPECT_EQ(lo, 1);
  EXPECT_EQ(hi, 3);
}

TEST(Experts, UseChance) {
  EXPECT_EQ(mf_experts_use_chance(0.0, 2, 1024), 0.0) << "an expert no token picks";
  EXPECT_EQ(mf_experts_use_chance(0.6, 2, 1), 1.0) << "K share past 1 is certain";
  EXPECT_EQ(mf_experts_use_chance(-0.1, 2, 10), 0.0);
  EXPECT_DOUBLE_EQ(mf_experts_use_chance(0.125, 2, 3), 1.0 - std::pow(0.75, 3));
}

TEST(Experts, ExpectedBusyExperts) {
  EXPECT_DOUBLE_EQ(mf_experts_expected_busy(8, 2, 1e6), 8.0) << "a large batch reaches every expert";
  EXPECT_DOUBLE_EQ(mf_experts_expected_busy(8, 2, 1), 2.0) << "at most tokens x top_k";
  EXPECT_DOUBLE_EQ(mf_experts_expected_busy(64, 8, 4), 64.0 * (1.0 - std::pow(1.0 - 8.0 / 64.0, 4)));
  EXPECT_DOUBLE_EQ(mf_experts_expected_busy(4, 8, 2), 4.0) << "top_k >= E: every expert";
}

TEST(Experts, IdleOverTheMicroBatchesACopyServes) {
  // 2 micro-batches x 2 layers x 3 experts.
  const int64_t counts[12] = {/* m0 l0 */ 5, 0, 1, /* m0 l1 */ 0, 0, 6, /* m1 l0 */ 0, 0, 6, /* m1 l1 */ 3, 0, 3};
  EXPECT_TRUE(mf_experts_idle(counts, 2, 3, 0, 1, 0, 1));
  EXPECT_FALSE(mf_experts_idle(counts, 2, 3, 0, 0, 0, 1));
  EXPECT_TRUE(mf_experts_idle(counts, 2, 3, 0, 0, 1, 1)) << "micro-batch 1 alone sent expert 0 nothing";
  EXPECT_FALSE(mf_experts_idle(counts, 2, 3, 1, 0, 0, 1));
  EXPECT_TRUE(mf_experts_idle(counts, 2, 3, 1, 0, 0, 0));
}

// The staging groups of a small program: one key per (micro-batch, phase,
// layer); a recompute counts as backward.
TEST(Experts, GroupKeysSeparateLayersPhasesAndMicroBatches) {
  mf_model_spec spec{};
  mf_model_spec_defaults(MF_FAMILY_MIXTRAL, &spec);
  spec.hidden = 16, spec.layers = 2, spec.heads = 2, spec.kv_heads = 1, spec.head_dim = 8, spec.experts = 4,
  spec.top_k = 2, spec.expert_ffn = 8, spec.vocab = 32, spec.max_seq = 8;
  mf_param_table *t = nullptr;
  ASSERT_EQ(mf_param_table_build(&spec, &t), MF_OK) << mf_last_error();
  mf_program_opts po{};
  po.micro_batch = 1, po.seq_len = 4, po.grad_accum = 2;
  mf_program *p = nullptr;
  ASSERT_EQ(mf_program_build(t, &po, &p), MF_OK) << mf_last_error();
  for (int32_t a = 0; a < p->n_ops; a++)
    for (int32_t b = 0; b < p->n_ops; b++) {
      const mf_pop &x = p->ops[a], &y = p->ops[b];
      const bool bx = x.phase == MF_PHASE_BWD, by = y.phase == MF_PHASE_BWD;
      const bool same = x.micro == y.micro && x.layer == y.layer && bx == by;
      EXPECT_EQ(mf_experts_group_key(p, a, 0) == mf_experts_group_key(p, b, 0), same) << x.label << " / " << y.label;
    }
  for (int32_t k = 0; k < p->n_ops; k++)
    if (p->ops[k].phase == MF_PHASE_FWD) {
      for (int32_t b = 0; b < p->n_ops; b++)
        if (p->ops[b].phase == MF_PHASE_BWD && p->ops[b].micro == p->ops[k].micro &&
            p->ops[b].layer == p->ops[k].layer) {
          EXPECT_EQ(mf_experts_group_key(p, k, 1), mf_experts_group_key(p, b, 0)) << "a recompute is backward";
          break;
        }
    }
  mf_program_free(p);
  mf_param_table_free(t);
}

}  // namespace
