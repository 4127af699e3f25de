// Chunked cross-entropy through the LM head: loss, lse, dh and dW against a
// direct double reference and finite differences, for chunk sizes 1, 7 (V not a
// multiple), V and more than V, with ignored tokens; bit-identical for pools of
// 1, 2 and 3 workers; dh bf16-representable with round_bf16.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "kernels/cpu/cpu_ops.h"
#include "tests/kernels/fd.h"
#include "tests/kernels/kernel_test_util.h"

namespace {

using mf_kt::bf16_representable;
using mf_kt::same_bits;

struct Problem {
  int64_t T, V, H;
  std::vector<float> h, W;
  std::vector<int32_t> target;
};

Problem make_problem(int64_t T, int64_t V, int64_t H, uint32_t seed) {
  Problem p{T,
            V,
            H,
            mf_fd::random_vec((size_t)(T * H), seed, 1.0f),
            mf_fd::random_vec((size_t)(V * H), seed + 1, 1.0f / std::sqrt((float)H) * 2.0f),
            {}};
  std::mt19937 rng(seed + 2);
  for (int64_t t = 0; t < T; t++) {
    int32_t v = (int32_t)(rng() % (uint32_t)V);
    p.target.push_back(t % 5 == 3 ? -1 : v);  // every fifth token ignored
  }
  return p;
}

struct Result {
  double loss = 0;
  int64_t n_valid = 0;
  std::vector<float> lse, dh, dW;
};

Result run(const mf_kctx &ctx, const Problem &p, int64_t chunk, float scale, bool backward,
           const std::vector<float> *dW0 = nullptr) {
  Result r;
  std::vector<float> ws((size_t)(p.T * chunk), NAN);
  r.lse.assign((size_t)p.T, NAN);
  if (backward) {
    r.dh.assign((size_t)(p.T * p.H), NAN);  // written: must not be read
    r.dW = dW0 ? *dW0 : std::vector<float>((size_t)(p.V * p.H), 0.0f);
  }
  double scalars[2] = {NAN, NAN};  // {loss_sum, n_valid}: written
  EXPECT_EQ(mf_cpu_cross_entropy(p.h.data(), p.W.data(), p.target.data(), p.T, p.V, p.H, chunk, scale,
                                 ws.data(), r.lse.data(), scalars, backward ? r.dh.data() : nullptr,
                                 backward ? r.dW.data() : nullptr, &ctx),
            MF_OK);
  r.loss = scalars[0];
  r.n_valid = (int64_t)scalars[1];
  EXPECT_EQ((double)r.n_valid, scalars[1]);
  return r;
}

struct Reference {
  double loss = 0;
  int64_t n_valid = 0;
  std::vector<double> lse, dh, dW;
};

Reference reference(const Problem &p, double scale) {
  Reference r;
  r.lse.assign((size_t)p.T, 0);
  r.dh.assign((size_t)(p.T * p.H), 0);
  r.dW.assign((size_t)(p.V * p.H), 0);
  std::vector<double> l((size_t)p.V);
  for (int64_t t = 0; t < p.T; t++) {
    double m = -INFINITY;
    for (int64_t v = 0; v < p.V; v++) {
      const double s = mf_kt::ref_dot(p.h.data() + t * p.H, 1, p.W.data() + v * p.H, 1, p.H);
      l[(size_t)v] = s;
      m = std::max(m, s);
    }
    double z = 0;
    for (int64_t v = 0; v < p.V; v++) z += std::exp(l[(size_t)v] - m);
    double lse = m + std::log(z);
    r.lse[(size_t)t] = lse;
    int32_t tg = p.target[(size_t)t];
    if (tg < 0) continue;
    r.n_valid++;
    r.loss += lse - l[(size_t)tg];
    for (int64_t v = 0; v < p.V; v++) {
      double g = scale * (std::exp(l[(size_t)v] - lse) - (v == tg ? 1.0 : 0.0));
      for (int64_t k = 0; k < p.H; k++) {
        r.dh[(size_t)(t * p.H + k)] += g * p.W[(size_t)(v * p.H + k)];
        r.dW[(size_t)(v * p.H + k)] += g * p.h[(size_t)(t * p.H + k)];
      }
    }
  }
  return r;
}

void expect_close(const std::vector<float> &got, const std::vector<double> &want, double tol,
                  const char *what) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); i++)
    ASSERT_NEAR(got[i], want[i], tol * (1 + std::fabs(want[i]))) << what << "[" << i << "]";
}

class CrossEntropyChunk : public ::testing::TestWithParam<int64_t> {};

TEST_P(CrossEntropyChunk, MatchesDoubleReference) {
  const Problem p = make_problem(21, 23, 16, 1);
  const int64_t chunk = GetParam() > 0 ? GetParam() : p.V;
  const float scale = 0.37f;
  mf_kctx ctx = {nullptr, 0};
  auto dW0 = mf_fd::random_vec((size_t)(p.V * p.H), 9);
  Result r = run(ctx, p, chunk, scale, true, &dW0);
  Reference ref = reference(p, scale);
  EXPECT_EQ(r.n_valid, ref.n_valid);
  EXPECT_NEAR(r.loss, ref.loss, 1e-5 * std::fabs(ref.loss));
  expect_close(r.lse, ref.lse, 1e-6, "lse");
  expect_close(r.dh, ref.dh, 1e-5, "dh");
  for (size_t i = 0; i < dW0.size(); i++) ref.dW[i] += dW0[i];  // added
  expect_close(r.dW, ref.dW, 1e-5, "dW");
  for (int64_t t = 0; t < p.T; t++) {
    if (p.target[(size_t)t] >= 0) continue;
    for (int64_t k = 0; k < p.H; k++) ASSERT_EQ(r.dh[(size_t)(t * p.H + k)], 0.0f) << "ignored token " << t;
  }
  // The forward alone gives the same loss and lse bits.
  Result f = run(ctx, p, chunk, scale, false);
  EXPECT_EQ(f.loss, r.loss);
  EXPECT_EQ(f.n_valid, r.n_valid);
  EXPECT_TRUE(same_bits(f.lse, r.lse));
}

TEST_P(CrossEntropyChunk, BackwardMatchesFiniteDifferences) {
  Problem p = make_problem(9, 23, 12, 2);
  const int64_t chunk = GetParam() > 0 ? GetParam() : p.V;
  const float scale = 0.5f;
  mf_kctx ctx = {nullptr, 0};
  Result r = run(ctx, p, chunk, scale, true);
  auto loss = [&]() {
    Result f = run(ctx, p, chunk, scale, false);
    return (double)scale * f.loss;
  };
  mf_fd::check_grad("dh", p.h, r.dh, loss, 1e-2, 96, 2e-2, 2e-4);
  mf_fd::check_grad("dW", p.W, r.dW, loss, 1e-2, 128, 2e-2, 2e-4);
}

// 0: chunk = V.  7: V = 23 is not a multiple.  100: chunk > V.
INSTANTIATE_TEST_SUITE_P(Chunks, CrossEntropyChunk, ::testing::Values(1, 7, 0, 100));

TEST(CrossEntropy, LargerThanTheTilesMatchesReference) {
  // T > the 64-token block, H > the 256-deep and 256-wide blocks, chunk > the
  // 32-row panel and not a divisor of V.
  const Problem p = make_problem(70, 90, 300, 3);
  mf_kctx ctx = {nullptr, 0};
  Result r = run(ctx, p, 41, 1.0f / 70, true);
  Reference ref = reference(p, 1.0 / 70);
  EXPECT_EQ(r.n_valid, ref.n_valid);
  EXPECT_NEAR(r.loss, ref.loss, 1e-5 * std::fabs(ref.loss));
  expect_close(r.lse, ref.lse, 1e-5, "lse");
  expect_close(r.dh, ref.dh, 1e-5, "dh");
  expect_close(r.dW, ref.dW, 1e-5, "dW");
}

TEST(CrossEntropy, BitIdenticalAcrossPoolSizes) {
  const Problem p = make_problem(83, 57, 40, 4);
  for (int round = 0; round <= 1; round++) {
    Result ref;
    for (int n = 1; n <= 3; n++) {
      mf_kt::Pool pool(n);
      ASSERT_EQ(pool.status, MF_OK);
      mf_kctx ctx = {pool.p, round};
      Result r = run(ctx, p, 13, 0.01f, true);
      if (n == 1) {
        ref = r;
        continue;
      }
      EXPECT_EQ(r.loss, ref.loss) << n;
      EXPECT_EQ(r.n_valid, ref.n_valid) << n;
      EXPECT_TRUE(same_bits(r.lse, ref.lse)) << n;
      EXPECT_TRUE(same_bits(r.dh, ref.dh)) << n;
      EXPECT_TRUE(same_bits(r.dW, ref.dW)) << n;
    }
  }
}

TEST(CrossEntropy, RoundBf16RoundsOnlyDh) {
  const Problem p = make_problem(30, 50, 24, 5);
  mf_kctx plain = {nullptr, 0}, rounded = {nullptr, 1};
  Result a = run(plain, p, 16, 1.0f, true), b = run(rounded, p, 16, 1.0f, true);
  ASSERT_TRUE(bf16_representable(b.dh));
  ASSERT_TRUE(mf_kt::rounded_once(b.dh, a.dh));  // rounded once, at the end
  EXPECT_FALSE(bf16_representable(a.dh));
  EXPECT_EQ(a.loss, b.loss);
  EXPECT_TRUE(same_bits(a.lse, b.lse));
  EXPECT_TRUE(same_bits(a.dW, b.dW));
}

TEST(CrossEntropy, AllIgnoredAndBadTargets) {
  Problem p = make_problem(6, 10, 8, 6);
  for (auto &t : p.target) t = -1;
  mf_kctx ctx = {nullptr, 0};
  auto dW0 = mf_fd::random_vec((size_t)(p.V * p.H), 7);
  Result r = run(ctx, p, 4, 1.0f, true, &dW0);
  EXPECT_EQ(r.n_valid, 0);
  EXPECT_EQ(r.loss, 0.0);
  for (float v : r.dh) EXPECT_EQ(v, 0.0f);
  EXPECT_TRUE(same_bits(r.dW, dW0));

  p.target[2] = 10;  // == V
  std::vector<float> ws((size_t)(p.T * 4)), lse((size_t)p.T);
  double scalars[2];
  EXPECT_EQ(mf_cpu_cross_entropy(p.h.data(), p.W.data(), p.target.data(), p.T, p.V, p.H, 4, 1.0f, ws.data(),
                                 lse.data(), scalars, nullptr, nullptr, &ctx),
            MF_ERR_INVALID_ARG);
}

}  // namespace
