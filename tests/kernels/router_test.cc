// Router: softmax + top-k (+ renormalisation) forward against a double
// reference, tie order, the backward against finite differences (renorm on and
// off, with and without the aux gradient), and bit-identical results for
// thread pools of 1, 2 and 3 workers. Mode 1 (gpt-oss's GptOssTopKRouter: the
// top-k logits, their softmax, probs the softmax of the scattered weights) the
// same way, its backward against finite differences of sum(c1 topk_w) +
// sum(c2 probs) through its forward.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <string>
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

Fwd run_fwd(const mf_kctx &ctx, const std::vector<float> &logits, int64_t T, int64_t E, int64_t K, int norm,
            int mode = 0) {
  Fwd f;
  f.probs.assign((size_t)(T * E), 0.0f);
  f.w.assign((size_t)(T * K), 0.0f);
  f.idx.assign((size_t)(T * K), -1);
  EXPECT_EQ(
      mf_cpu_router_fwd(logits.data(), T, E, K, norm, mode, f.probs.data(), f.idx.data(), f.w.data(), &ctx),
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
                                  extra ? cp.data() : nullptr, s.T, s.E, s.K, norm, 0, dl.data(), &ctx),
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
                                1, 0, dl.data(), &ctx),
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

// Mode 1 in double: the top-k of the fp32 logits (descending, ties to the
// lower index), their softmax, and the softmax over E of the scattered weights.
struct TopkFirstRef {
  std::vector<int> idx;
  std::vector<double> w, probs;
};
TopkFirstRef topk_first_ref(const float *l, int64_t E, int64_t K) {
  TopkFirstRef r;
  std::vector<int> order((size_t)E);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return l[a] > l[b]; });
  r.idx.assign(order.begin(), order.begin() + K);
  double s = 0;
  for (int64_t j = 0; j < K; j++) s += std::exp((double)l[r.idx[(size_t)j]] - (double)l[r.idx[0]]);
  std::vector<double> z((size_t)E, 0.0);
  for (int64_t j = 0; j < K; j++) {
    r.w.push_back(std::exp((double)l[r.idx[(size_t)j]] - (double)l[r.idx[0]]) / s);
    z[(size_t)r.idx[(size_t)j]] = r.w.back();
  }
  const double m = *std::max_element(z.begin(), z.end());
  double zs = 0;
  for (double v : z) zs += std::exp(v - m);
  for (double v : z) r.probs.push_back(std::exp(v - m) / zs);
  return r;
}

TEST_P(RouterTest, TopkFirstForwardMatchesDoubleReference) {
  const auto s = GetParam();
  auto logits = mf_fd::random_vec((size_t)(s.T * s.E), 12, 2.0f);
  mf_kctx ctx = {nullptr, 0};
  const Fwd f = run_fwd(ctx, logits, s.T, s.E, s.K, 0, 1);
  for (int64_t t = 0; t < s.T; t++) {
    const TopkFirstRef r = topk_first_ref(&logits[(size_t)(t * s.E)], s.E, s.K);
    for (int64_t j = 0; j < s.K; j++) {
      ASSERT_EQ(f.idx[(size_t)(t * s.K + j)], r.idx[(size_t)j]) << "row " << t << " choice " << j;
      EXPECT_NEAR(f.w[(size_t)(t * s.K + j)], r.w[(size_t)j], 1e-6) << t << "," << j;
    }
    for (int64_t e = 0; e < s.E; e++)
      EXPECT_NEAR(f.probs[(size_t)(t * s.E + e)], r.probs[(size_t)e], 1e-6) << t << "," << e;
  }
  // norm_topk is mode 0's: mode 1 ignores it.
  const Fwd g = run_fwd(ctx, logits, s.T, s.E, s.K, 1, 1);
  EXPECT_TRUE(same_bits(g.probs, f.probs));
  EXPECT_TRUE(same_bits(g.w, f.w));
  EXPECT_EQ(g.idx, f.idx);
}

// L = sum(c1 * topk_w) + sum(c2 * probs) (c2 only with dprobs_extra) through
// mode 1's forward; the experts not chosen get exactly 0.
TEST_P(RouterTest, TopkFirstBackwardMatchesFiniteDifferences) {
  const auto s = GetParam();
  mf_kctx ctx = {nullptr, 0};
  auto cw = mf_fd::random_vec((size_t)(s.T * s.K), 23);
  auto cp = mf_fd::random_vec((size_t)(s.T * s.E), 24, 0.5f);
  for (int extra = 0; extra <= 1; extra++) {
    auto logits = separated_logits(s.T, s.E, 35 + (uint32_t)extra);
    Fwd f = run_fwd(ctx, logits, s.T, s.E, s.K, 1, 1);
    std::vector<float> dl((size_t)(s.T * s.E), 123.0f);
    ASSERT_EQ(mf_cpu_router_bwd(f.probs.data(), f.idx.data(), f.w.data(), cw.data(),
                                extra ? cp.data() : nullptr, s.T, s.E, s.K, 1, 1, dl.data(), &ctx),
              MF_OK);
    for (int64_t t = 0; t < s.T; t++)
      for (int64_t e = 0; e < s.E; e++) {
        const int32_t *row = &f.idx[(size_t)(t * s.K)];
        if (std::find(row, row + s.K, (int32_t)e) == row + s.K) {
          EXPECT_EQ(dl[(size_t)(t * s.E + e)], 0.0f) << "row " << t << " expert " << e << " was not chosen";
        }
      }
    auto loss = [&]() {
      Fwd g = run_fwd(ctx, logits, s.T, s.E, s.K, 1, 1);
      EXPECT_EQ(g.idx, f.idx) << "a finite-difference step changed the selection";
      double L = mf_fd::dot(cw, g.w.data());
      if (extra) L += mf_fd::dot(cp, g.probs.data());
      return L;
    };
    mf_fd::check_grad("mode 1 dlogits extra=" + std::to_string(extra), logits, dl, loss, 1e-2, 96, 2e-2,
                      1e-4);
  }
}

TEST_P(RouterTest, TopkFirstBitIdenticalAcrossPoolSizes) {
  const auto s = GetParam();
  auto logits = mf_fd::random_vec((size_t)(s.T * s.E), 44, 3.0f);
  auto cw = mf_fd::random_vec((size_t)(s.T * s.K), 45);
  auto cp = mf_fd::random_vec((size_t)(s.T * s.E), 46);
  Fwd ref;
  std::vector<float> dref;
  for (int n = 1; n <= 3; n++) {
    mf_kt::Pool pool(n);
    ASSERT_EQ(pool.status, MF_OK);
    mf_kctx ctx = {pool.p, 0};
    Fwd f = run_fwd(ctx, logits, s.T, s.E, s.K, 0, 1);
    std::vector<float> dl((size_t)(s.T * s.E));
    ASSERT_EQ(mf_cpu_router_bwd(f.probs.data(), f.idx.data(), f.w.data(), cw.data(), cp.data(), s.T, s.E, s.K,
                                0, 1, dl.data(), &ctx),
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
  ASSERT_EQ(mf_cpu_router_bwd(a.probs.data(), a.idx.data(), a.w.data(), cw.data(), nullptr, T, E, K, 1, 0,
                              da.data(), &plain),
            MF_OK);
  ASSERT_EQ(mf_cpu_router_bwd(b.probs.data(), b.idx.data(), b.w.data(), cw.data(), nullptr, T, E, K, 1, 0,
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

TEST(Router, TopkFirstTiesGoToTheLowerIndex) {
  mf_kctx ctx = {nullptr, 0};
  // Row 0: all equal. Row 1: two equal maxima and two equal runners-up.
  std::vector<float> logits = {0, 0, 0, 0, 0, /**/ 1, 2, 0.5f, 2, 1};
  Fwd f = run_fwd(ctx, logits, 2, 5, 4, 0, 1);
  EXPECT_EQ(f.idx, (std::vector<int32_t>{0, 1, 2, 3, /**/ 1, 3, 0, 4}));
  for (int j = 0; j < 4; j++) EXPECT_EQ(f.w[(size_t)j], 0.25f);
  EXPECT_EQ(f.w[4], f.w[5]);
  EXPECT_EQ(f.w[6], f.w[7]);
  EXPECT_NEAR(f.w[4], 1.0 / (2.0 + 2.0 * std::exp(-1.0)), 1e-7);
  // probs: the softmax of {w at the chosen, 0 elsewhere}.
  const double z = 4.0 * std::exp(0.25) + 1.0;
  EXPECT_NEAR(f.probs[0], std::exp(0.25) / z, 1e-7);
  EXPECT_NEAR(f.probs[4], 1.0 / z, 1e-7);
}

TEST(Router, ModesOtherThanZeroAndOneAreRefused) {
  mf_kctx ctx = {nullptr, 0};
  std::vector<float> logits(8, 0.0f), probs(8), w(2), dw(2), dl(8);
  std::vector<int32_t> idx(2, 0);
  for (int mode : {-1, 2}) {
    EXPECT_EQ(mf_cpu_router_fwd(logits.data(), 1, 8, 2, 0, mode, probs.data(), idx.data(), w.data(), &ctx),
              MF_ERR_INVALID_ARG);
    EXPECT_NE(std::string(mf_last_error()).find("mode"), std::string::npos) << mf_last_error();
    EXPECT_EQ(mf_cpu_router_bwd(probs.data(), idx.data(), w.data(), dw.data(), nullptr, 1, 8, 2, 0, mode,
                                dl.data(), &ctx),
              MF_ERR_INVALID_ARG);
  }
}

// Mode 0 keeps its bits: the same logits through mode 0 give what the router
// gave before modes (softmax first; checked against the reference above), and
// differ from mode 1's.
TEST(Router, ModeZeroIsSoftmaxThenTopk) {
  const int64_t T = 6, E = 8, K = 2;
  auto logits = mf_fd::random_vec((size_t)(T * E), 71, 2.0f);
  mf_kctx ctx = {nullptr, 0};
  Fwd a = run_fwd(ctx, logits, T, E, K, 0, 0), b = run_fwd(ctx, logits, T, E, K, 0, 1);
  EXPECT_EQ(a.idx, b.idx) << "both take the largest logits";
  for (int64_t t = 0; t < T; t++) {
    double s = 0;
    for (int64_t e = 0; e < E; e++) s += a.probs[(size_t)(t * E + e)];
    EXPECT_NEAR(s, 1.0, 1e-6);
    for (int64_t j = 0; j < K; j++)  // mode 0's weights are the probs themselves
      EXPECT_EQ(a.w[(size_t)(t * K + j)], a.probs[(size_t)(t * E + a.idx[(size_t)(t * K + j)])]);
    double ws = 0;
    for (int64_t j = 0; j < K; j++) ws += b.w[(size_t)(t * K + j)];
    EXPECT_NEAR(ws, 1.0, 1e-6) << "mode 1's weights are a softmax over the k";
  }
}

}  // namespace
