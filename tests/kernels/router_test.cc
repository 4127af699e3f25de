// Router: softmax + top-k (+ renormalisation) forward against a double
// reference, tie order, the backward against finite differences (renorm on and
// off, with and without the aux gradient), and bit-identical results for
// thread pools of 1, 2 and 3 workers.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "kernels/cpu/cpu_ops.h"
#include "tests/kernels/fd.h"
#include "tests/kernels/kernel_test_util.h"

namespace {

using mf_kt::same_bits;

// Logits whose values per row are at least 0.2 apart, so a finite-difference
// step of 1e-2 never changes the top-k selection.
std::vector<float> separated_logits(int64_t T, int64_t E, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> noise(-0.05f, 0.05f);
  std::vector<float> l((size_t)(T * E));
  std::vector<int> perm((size_t)E);
  for (int64_t t = 0; t < T; t++) {
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    for (int64_t e = 0; e < E; e++)
      l[(size_t)(t * E + e)] = 0.3f * (float)perm[(size_t)e] - 1.0f + noise(rng);
  }
  return l;
}

struct Fwd {
  std::vector<float> probs, w;
  std::vector<int32_t> idx;
};

Fwd run_fwd(const mf_kctx &ctx, const std::vector<float> &logits, int64_t T, int64_t E, int64_t K, int norm) {
  Fwd f;
  f.probs.assign((size_t)(T * E), 0.0f);
  f.w.assign((size_t)(T * K), 0.0f);
  f.idx.assign((size_t)(T * K), -1);
  EXPECT_EQ(mf_cpu_router_fwd(logits.data(), T, E, K, norm, f.probs.data(), f.idx.data(), f.w.data(), &ctx),
            MF_OK);
  return f;
}

struct RouterShape {
  int64_t T, E, K;
};

class RouterTest : public ::testing::TestWithParam<RouterShape> {};

TEST_P(RouterTest, ForwardMatchesDoubleReference) {
  const auto s = GetParam();
  auto logits = mf_fd::random_vec((size_t)(s.T * s.E), 11, 2.0f);
  mf_kctx ctx = {nullptr, 0};
  for (int norm = 0; norm <= 1; norm++) {
    Fwd f = run_fwd(ctx, logits, s.T, s.E, s.K, norm);
    for (int64_t t = 0; t < s.T; t++) {
      const float *l = &logits[(size_t)(t * s.E)];
      double m = *std::max_element(l, l + s.E), sum = 0;
      std::vector<double> p((size_t)s.E);
      for (int64_t e = 0; e < s.E; e++) sum += p[(size_t)e] = std::exp((double)l[e] - m);
      for (int64_t e = 0; e < s.E; e++) {
        p[(size_t)e] /= sum;
        EXPECT_NEAR(f.probs[(size_t)(t * s.E + e)], p[(size_t)e], 1e-6 * std::max(1.0, p[(size_t)e]))
            << t << "," << e;
      }
      // Top-k of the kernel's fp32 probs: descending, ties to the lower index.
      std::vector<int> order((size_t)s.E);
      std::iota(order.begin(), order.end(), 0);
      const float *pf = &f.probs[(size_t)(t * s.E)];
      std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return pf[a] > pf[b]; });
      double sel = 0;
      for (int64_t j = 0; j < s.K; j++) sel += p[(size_t)order[(size_t)j]];
      for (int64_t j = 0; j < s.K; j++) {
        ASSERT_EQ(f.idx[(size_t)(t * s.K + j)], order[(size_t)j]) << "row " << t << " choice " << j;
        double want = p[(size_t)order[(size_t)j]] / (norm ? sel : 1.0);
        EXPECT_NEAR(f.w[(size_t)(t * s.K + j)], want, 2e-6 * std::max(1.0, want));
      }
    }
  }
}

TEST_P(RouterTest, BackwardMatchesFiniteDifferences) {
  const auto s = GetParam();
  mf_kctx ctx = {nullptr, 0};
  auto cw = mf_fd::random_vec((size_t)(s.T * s.K), 21);
  auto cp = mf_fd::random_vec((size_t)(s.T * s.E), 22, 0.5f);
  for (int norm = 0; norm <= 1; norm++) {
    for (int extra = 0; extra <= 1; extra++) {
      auto logits = separated_logits(s.T, s.E, 31 + (uint32_t)(2 * norm + extra));
      Fwd f = run_fwd(ctx, logits, s.T, s.E, s.K, norm);
      std::vector<float> dl((size_t)(s.T * s.E), 123.0f);
      ASSERT_EQ(mf_cpu_router_bwd(f.probs.data(), f.idx.data(), f.w.data(), cw.data(),
                                  extra ? cp.data() : nullptr, s.T, s.E, s.K, norm, dl.data(), &ctx),
                MF_OK);
      auto loss = [&]() {
        Fwd g = run_fwd(ctx, logits, s.T, s.E, s.K, norm);
        EXPECT_EQ(g.idx, f.idx) << "a finite-difference step changed the selection";
        double L = mf_fd::dot(cw, g.w.data());
        if (extra) L += mf_fd::dot(cp, g.probs.data());
        return L;
      };
      std::string what =
          std::string("dlogits norm=") + std::to_string(norm) + " extra=" + std::to_string(extra);
      mf_fd::check_grad(what, logits, dl, loss, 1e-2, 96, 2e-2, 1e-4);
    }
  }
}

TEST_P(RouterTest, BitIdenticalAcrossPoolSizes) {
  const auto s = GetParam();
  auto logits = mf_fd::random_vec((size_t)(s.T * s.E), 41, 3.0f);
  auto cw = mf_fd::random_vec((size_t)(s.T * s.K), 42);
  auto cp = mf_fd::random_vec((size_t)(s.T * s.E), 43);
  Fwd ref;
  std::vector<float> dref;
  for (int n = 1; n <= 3; n++) {
    mf_kt::Pool pool(n);
    ASSERT_EQ(pool.status, MF_OK);
    mf_kctx ctx = {pool.p, 0};
    Fwd f = run_fwd(ctx, logits, s.T, s.E, s.K, 1);
    std::vector<float> dl((size_t)(s.T * s.E));
    ASSERT_EQ(mf_cpu_router_bwd(f.probs.data(), f.idx.data(), f.w.data(), cw.data(), cp.data(), s.T, s.E, s.K,
                                1, dl.data(), &ctx),
              MF_OK);
    if (n == 1) {
      ref = f;
      dref = dl;
      continue;
    }
    EXPECT_TRUE(same_bits(f.probs, ref.probs)) << n << " threads";
    EXPECT_TRUE(same_bits(f.w, ref.w)) << n << " threads";
    EXPECT_EQ(f.idx, ref.idx) << n << " threads";
    EXPECT_TRUE(same_bits(dl, dref)) << n << " threads";
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, RouterTest,
                         ::testing::Values(RouterShape{13, 8, 2}, RouterShape{9, 6, 6},
                                           RouterShape{17, 16, 4}, RouterShape{5, 4, 1},
                                           RouterShape{1, 60, 4}));

TEST(Router, TiesGoToTheLowerIndex) {
  mf_kctx ctx = {nullptr, 0};
  const int64_t E = 5;
  // Row 0: all equal. Row 1: two equal maxima and two equal runners-up.
  std::vector<float> logits = {0, 0, 0, 0, 0, /**/ 1, 2, 0.5f, 2, 1};
  Fwd f = run_fwd(ctx, logits, 2, E, 4, 0);
  EXPECT_EQ(f.idx, (std::vector<int32_t>{0, 1, 2, 3, /**/ 1, 3, 0, 4}));
  for (int j = 0; j < 4; j++) EXPECT_FLOAT_EQ(f.w[(size_t)j], 0.2f);
  Fwd g = run_fwd(ctx, logits, 2, E, 2, 1);
  EXPECT_EQ(g.idx, (std::vector<int32_t>{0, 1, 1, 3}));
  EXPECT_EQ(g.w[2], 0.5f);
  EXPECT_EQ(g.w[3], 0.5f);
}

TEST(Router, OutputsAreFp32EvenWithRoundBf16) {
  // probs, topk_w and dlogits are routing quantities: never rounded.
  const int64_t T = 7, E = 8, K = 2;
  auto logits = mf_fd::random_vec((size_t)(T * E), 51);
  auto cw = mf_fd::random_vec((size_t)(T * K), 52);
  mf_kctx plain = {nullptr, 0}, rounded = {nullptr, 1};
  Fwd a = run_fwd(plain, logits, T, E, K, 1), b = run_fwd(rounded, logits, T, E, K, 1);
  EXPECT_TRUE(same_bits(a.probs, b.probs));
  EXPECT_TRUE(same_bits(a.w, b.w));
  std::vector<float> da((size_t)(T * E)), db((size_t)(T * E));
  ASSERT_EQ(mf_cpu_router_bwd(a.probs.data(), a.idx.data(), a.w.data(), cw.data(), nullptr, T, E, K, 1,
                              da.data(), &plain),
            MF_OK);
  ASSERT_EQ(mf_cpu_router_bwd(b.probs.data(), b.idx.data(), b.w.data(), cw.data(), nullptr, T, E, K, 1,
                              db.data(), &rounded),
            MF_OK);
  EXPECT_TRUE(same_bits(da, db));
  EXPECT_FALSE(mf_kt::bf16_representable(a.probs)) << "probs look bf16-rounded";
}

TEST(Router, RenormalisedWeightsSumToOne) {
  const int64_t T = 32, E = 64, K = 6;
  auto logits = mf_fd::random_vec((size_t)(T * E), 61, 4.0f);
  mf_kctx ctx = {nullptr, 0};
  Fwd f = run_fwd(ctx, logits, T, E, K, 1);
  for (int64_t t = 0; t < T; t++) {
    double s = 0;
    for (int64_t j = 0; j < K; j++) {
      s += f.w[(size_t)(t * K + j)];
      if (j) {
        EXPECT_GE(f.w[(size_t)(t * K + j - 1)], f.w[(size_t)(t * K + j)]);
      }
    }
    EXPECT_NEAR(s, 1.0, 1e-6);
  }
}

}  // namespace
