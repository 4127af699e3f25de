// The per-expert bias over the expert-sorted rows (kernels/cpu/expert_bias.c,
// gpt-oss's expert projection biases): the forward adds each expert's bias to
// its rows and leaves the rows past offsets[E] alone; the backward sums each
// expert's rows in row order and adds the sum once (the same bits as that loop
// in fp32; near the double sums), leaves an expert without rows untouched, and
// is the gradient of the forward (finite differences); round_bf16 rounds the
// forward's y once and never db; the same bits for thread pools of 1, 2 and 3.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "kernels/cpu/cpu_ops.h"
#include "tests/kernels/fd.h"
#include "tests/kernels/kernel_test_util.h"

namespace {

using mf_kt::same_bits;

// Experts 2 and 5 without rows (5 the last); two spare rows past offsets[E].
const std::vector<int64_t> kOffsets = {0, 3, 7, 7, 12, 13, 13};
constexpr int64_t kE = 6, kN = 37, kR = 15;

int64_t expert_of(const std::vector<int64_t> &off, int64_t r) {
  int64_t e = 0;
  while (off[(size_t)e + 1] <= r) e++;
  return e;
}

TEST(ExpertBias, ForwardAddsEachExpertsBiasToItsRows) {
  const std::vector<float> bias = mf_fd::random_vec((size_t)(kE * kN), 1);
  const std::vector<float> y0 = mf_fd::random_vec((size_t)(kR * kN), 2);
  for (int round = 0; round <= 1; round++) {
    std::vector<float> y = y0, want = y0;
    for (int64_t r = 0; r < kOffsets[kE]; r++)
      for (int64_t c = 0; c < kN; c++) {
        float &w = want[(size_t)(r * kN + c)];
        w = w + bias[(size_t)(expert_of(kOffsets, r) * kN + c)];
        if (round) w = mf_round_to_bf16(w);
      }
    mf_kctx ctx = {nullptr, round};
    ASSERT_EQ(mf_cpu_expert_bias_fwd(bias.data(), kOffsets.data(), kR, kE, kN, y.data(), &ctx), MF_OK);
    EXPECT_TRUE(same_bits(y, want)) << "round_bf16 " << round;
    // The spare rows are not the call's: their bits stay.
    EXPECT_TRUE(same_bits(std::vector<float>(y.begin() + 13 * kN, y.end()),
                          std::vector<float>(y0.begin() + 13 * kN, y0.end())));
  }
}

TEST(ExpertBias, ForwardRefusesOffsetsPastTheRows) {
  std::vector<float> bias((size_t)(kE * kN)), y((size_t)(12 * kN));
  mf_kctx ctx = {nullptr, 0};
  EXPECT_EQ(mf_cpu_expert_bias_fwd(bias.data(), kOffsets.data(), 12, kE, kN, y.data(), &ctx),
            MF_ERR_INVALID_ARG);
}

TEST(ExpertBias, BackwardSumsEachExpertsRowsInOrder) {
  std::vector<float> dy = mf_fd::random_vec((size_t)(kR * kN), 3);
  for (int64_t k = 13 * kN; k < kR * kN; k++) dy[(size_t)k] = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> db0 = mf_fd::random_vec((size_t)(kE * kN), 4);
  for (int64_t c = 0; c < kN; c++) db0[(size_t)(2 * kN + c)] = -0.0f;  // an expert without rows: kept
  for (int round = 0; round <= 1; round++) {
    std::vector<float> db = db0, want = db0;
    for (int64_t e = 0; e < kE; e++)
      for (int64_t c = 0; c < kN; c++) {
        if (kOffsets[(size_t)e + 1] == kOffsets[(size_t)e]) continue;
        float s = 0.0f;
        double sd = db0[(size_t)(e * kN + c)];
        for (int64_t r = kOffsets[(size_t)e]; r < kOffsets[(size_t)e + 1]; r++) {
          s += dy[(size_t)(r * kN + c)];
          sd += dy[(size_t)(r * kN + c)];
        }
        want[(size_t)(e * kN + c)] += s;
        EXPECT_NEAR(want[(size_t)(e * kN + c)], sd, 1e-5);
      }
    mf_kctx ctx = {nullptr, round};  // db is an fp32 gradient sum: never rounded
    ASSERT_EQ(mf_cpu_expert_bias_bwd(dy.data(), kOffsets.data(), kE, kN, db.data(), &ctx), MF_OK);
    EXPECT_TRUE(same_bits(db, want)) << "round_bf16 " << round;
    EXPECT_TRUE(std::signbit(db[(size_t)(2 * kN)])) << "an expert without rows is not written (-0 stays)";
  }
}

// L = sum c * y_out through the forward: dL/dbias = the backward of dy = c.
TEST(ExpertBias, BackwardIsTheForwardsGradient) {
  std::vector<float> bias = mf_fd::random_vec((size_t)(kE * kN), 5);
  const std::vector<float> y0 = mf_fd::random_vec((size_t)(kR * kN), 6),
                           c = mf_fd::random_vec((size_t)(kR * kN), 7);
  mf_kctx ctx = {nullptr, 0};
  std::vector<float> db((size_t)(kE * kN), 0.0f), y;
  ASSERT_EQ(mf_cpu_expert_bias_bwd(c.data(), kOffsets.data(), kE, kN, db.data(), &ctx), MF_OK);
  auto loss = [&]() {
    y = y0;
    EXPECT_EQ(mf_cpu_expert_bias_fwd(bias.data(), kOffsets.data(), kR, kE, kN, y.data(), &ctx), MF_OK);
    double L = 0;
    for (int64_t k = 0; k < kOffsets[kE] * kN; k++) L += (double)c[(size_t)k] * y[(size_t)k];
    return L;
  };
  mf_fd::check_grad("dbias", bias, db, loss, 1e-2, 96, 2e-2, 2e-3);
}

TEST(ExpertBias, BitIdenticalAcrossPoolSizes) {
  // 2000 rows of 300 (past the parallel threshold); expert 3 of 8 without rows.
  const int64_t E = 8, N = 300;
  const std::vector<int64_t> off = {0, 250, 700, 1000, 1000, 1400, 1600, 1999, 2000};
  const int64_t R = off[(size_t)E];
  const std::vector<float> bias = mf_fd::random_vec((size_t)(E * N), 8),
                           y0 = mf_fd::random_vec((size_t)(R * N), 9);
  const std::vector<float> db0 = mf_fd::random_vec((size_t)(E * N), 10);
  std::vector<float> yref, dbref;
  mf_kt::Pools pools;
  std::vector<mf_threadpool *> all = pools.all();
  all.insert(all.begin(), nullptr);
  for (mf_threadpool *p : all) {
    mf_kctx ctx = {p, 1};
    std::vector<float> y = y0, db = db0;
    ASSERT_EQ(mf_cpu_expert_bias_fwd(bias.data(), off.data(), R, E, N, y.data(), &ctx), MF_OK);
    ASSERT_EQ(mf_cpu_expert_bias_bwd(y0.data(), off.data(), E, N, db.data(), &ctx), MF_OK);
    if (!p) {
      yref = y, dbref = db;
      continue;
    }
    EXPECT_TRUE(same_bits(y, yref));
    EXPECT_TRUE(same_bits(db, dbref));
  }
}

TEST(ExpertBias, NoExpertsOrColumnsIsANoOp) {
  mf_kctx ctx = {nullptr, 0};
  const int64_t off[1] = {0};
  float x = 3.0f;
  EXPECT_EQ(mf_cpu_expert_bias_fwd(&x, off, 0, 0, 4, &x, &ctx), MF_OK);
  EXPECT_EQ(mf_cpu_expert_bias_bwd(&x, off, 0, 4, &x, &ctx), MF_OK);
  EXPECT_EQ(x, 3.0f);
}

// In parts (expert parallelism's rows by source rank): each part summed from
// zero in row order, then added in part order; parts that do not cover an
// expert's rows are refused.
TEST(ExpertBias, BackwardInPartsAddsEachPartsSum) {
  // 2 sources: expert 0's 3 rows as 1 + 2, expert 1's 4 as 4 + 0, expert 3's 5 as 2 + 3, expert 4's 1 as 0 +
  // 1
  const std::vector<int64_t> seg = {0, 1, 3, 7, 7, 7, 7, 9, 12, 12, 13, 13, 13};
  const std::vector<float> dy = mf_fd::random_vec((size_t)(kR * kN), 40);
  const std::vector<float> db0 = mf_fd::random_vec((size_t)(kE * kN), 41);
  std::vector<float> want = db0;
  for (int64_t e = 0; e < kE; e++)
    for (int64_t p = 0; p < 2; p++)
      for (int64_t c = 0; c < kN; c++) {
        const int64_t r0 = seg[(size_t)(e * 2 + p)], r1 = seg[(size_t)(e * 2 + p + 1)];
        if (r1 <= r0) continue;
        float s = 0.0f;
        for (int64_t r = r0; r < r1; r++) s += dy[(size_t)(r * kN + c)];
        want[(size_t)(e * kN + c)] += s;
      }
  mf_kctx ctx = {nullptr, 0};
  std::vector<float> db = db0;
  ASSERT_EQ(mf_cpu_expert_bias_bwd_parts(dy.data(), kOffsets.data(), seg.data(), kE, kN, 2, db.data(), &ctx),
            MF_OK);
  EXPECT_TRUE(same_bits(db, want));
  std::vector<float> whole = db0;
  ASSERT_EQ(mf_cpu_expert_bias_bwd(dy.data(), kOffsets.data(), kE, kN, whole.data(), &ctx), MF_OK);
  EXPECT_FALSE(same_bits(db, whole)) << "the parts give the one-pass sum's bits: the test shows nothing";
  std::vector<int64_t> bad = seg;
  bad[1] = 4;  // expert 0's first part runs past its rows
  EXPECT_EQ(mf_cpu_expert_bias_bwd_parts(dy.data(), kOffsets.data(), bad.data(), kE, kN, 2, db.data(), &ctx),
            MF_ERR_INVALID_ARG);
}

}  // namespace
