// gpt-oss's clamped SwiGLU (kernels/cpu/swiglu_clamp.c): the forward and the
// backward against a double-precision reference of transformers'
// GptOssExperts._apply_gate (limit 7, alpha 1.702), the backward against finite
// differences away from the clamps' kinks, the clamps reached on both sides
// (beyond +-7: no gradient; at +-7 exactly: torch.clamp's gradient still
// passes), round_bf16 rounding each output once, and the same bits for thread
// pools of 1, 2 and 3 workers.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "kernels/cpu/cpu_ops.h"
#include "tests/kernels/fd.h"
#include "tests/kernels/kernel_test_util.h"

namespace {

using mf_kt::same_bits;

constexpr float kLimit = 7.0f, kAlpha = 1.702f;

std::vector<float> uniform(size_t n, float lo, float hi, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto &x : v) x = d(rng);
  return v;
}

// Inputs over both clamps: uniform in [-12, 12], and the edge values at the front.
struct Inputs {
  std::vector<float> g, u, dact;
};
Inputs inputs(size_t n, uint32_t seed) {
  Inputs in{uniform(n, -12, 12, seed), uniform(n, -12, 12, seed + 1), mf_fd::random_vec(n, seed + 2)};
  const float gs[] = {7.0f, -7.0f, 7.5f, -7.5f, 100.0f, -100.0f, 0.0f, 6.99f, 7.0f, 20.0f};
  const float us[] = {7.0f, -7.0f, 7.5f, -7.5f, 3.0f, -3.0f, -1.0f, 100.0f, -100.0f, 6.99f};
  for (size_t k = 0; k < 10 && k < n; k++) in.g[k] = gs[k], in.u[k] = us[k];
  return in;
}

struct Ref {
  double act, dg, du;
};
// transformers' maths in double (torch.clamp's gradient: min <= x <= max).
Ref reference(double g, double u, double d) {
  const double lim = kLimit, alpha = kAlpha;
  const double gc = std::min(g, lim), uc = std::max(-lim, std::min(u, lim));
  const double s = 1.0 / (1.0 + std::exp(-alpha * gc)), glu = gc * s;
  Ref r;
  r.act = (uc + 1.0) * glu;
  r.dg = g <= lim ? d * (uc + 1.0) * (s + alpha * gc * s * (1.0 - s)) : 0.0;
  r.du = u >= -lim && u <= lim ? d * glu : 0.0;
  return r;
}

struct Out {
  std::vector<float> act, dg, du;
};
Out run(const Inputs &in, const mf_kctx &ctx) {
  const int64_t n = (int64_t)in.g.size();
  Out o{std::vector<float>(in.g.size()), std::vector<float>(in.g.size()), std::vector<float>(in.g.size())};
  EXPECT_EQ(mf_cpu_swiglu_clamp_fwd(in.g.data(), in.u.data(), n, kLimit, kAlpha, o.act.data(), &ctx), MF_OK);
  EXPECT_EQ(mf_cpu_swiglu_clamp_bwd(in.g.data(), in.u.data(), in.dact.data(), n, kLimit, kAlpha, o.dg.data(),
                                    o.du.data(), &ctx),
            MF_OK);
  return o;
}

TEST(SwigluClamp, MatchesDoubleReference) {
  const Inputs in = inputs(4099, 1);
  mf_kctx ctx = {nullptr, 0};
  const Out o = run(in, ctx);
  for (size_t k = 0; k < in.g.size(); k++) {
    const Ref r = reference(in.g[k], in.u[k], in.dact[k]);
    EXPECT_NEAR(o.act[k], r.act, 1e-6 * std::max(1.0, std::fabs(r.act))) << k;
    EXPECT_NEAR(o.dg[k], r.dg, 1e-6 * std::max(1.0, std::fabs(r.dg))) << k;
    EXPECT_NEAR(o.du[k], r.du, 1e-6 * std::max(1.0, std::fabs(r.du))) << k;
  }
}

// Beyond the limit the gate is 7 and gets no gradient; u beyond +-7 is +-7 and
// gets none; at exactly +-7 the gradient passes. There is no lower clamp on g.
TEST(SwigluClamp, ClampsOnBothSides) {
  Inputs in;
  in.g = {7.0f, 7.5f, 1e4f, -7.5f, -100.0f, 2.0f, 2.0f, 2.0f, 2.0f, 2.0f};
  in.u = {1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 7.0f, 9.0f, -7.0f, -9.0f, 1e4f};
  in.dact.assign(in.g.size(), 0.75f);
  mf_kctx ctx = {nullptr, 0};
  const Out o = run(in, ctx);
  // g = 7.5 and 1e4 act as g = 7; their dg is 0, g = 7's is not.
  EXPECT_EQ(o.act[1], o.act[0]);
  EXPECT_EQ(o.act[2], o.act[0]);
  EXPECT_NE(o.dg[0], 0.0f);
  EXPECT_EQ(o.dg[1], 0.0f);
  EXPECT_EQ(o.dg[2], 0.0f);
  EXPECT_NEAR(o.act[0], 2.0 * 7.0 / (1.0 + std::exp(-7.0 * kAlpha)), 1e-5);
  // No lower clamp: g = -7.5 is not g = -7, and keeps a gradient.
  EXPECT_NE(o.dg[3], 0.0f);
  EXPECT_NEAR(o.act[3], 2.0 * -7.5 / (1.0 + std::exp(7.5 * kAlpha)), 1e-9);
  EXPECT_EQ(o.act[4], -0.0f) << "e^(170) overflows: s = 0, g' s = -0";
  EXPECT_TRUE(std::isfinite(o.dg[4]));
  // u: +-7 inside (the gradient passes), beyond clamped to +-7 without one.
  EXPECT_NE(o.du[5], 0.0f);
  EXPECT_NE(o.du[7], 0.0f);
  EXPECT_EQ(o.act[6], o.act[5]);
  EXPECT_EQ(o.act[9], o.act[5]);
  EXPECT_EQ(o.act[8], o.act[7]);
  EXPECT_EQ(o.du[6], 0.0f);
  EXPECT_EQ(o.du[8], 0.0f);
  EXPECT_EQ(o.du[9], 0.0f);
  EXPECT_EQ(o.dg[6], o.dg[5]) << "a clamped u still scales the gate's gradient by u' + 1";
  EXPECT_NEAR(o.act[7], -6.0 * 2.0 / (1.0 + std::exp(-2.0 * kAlpha)), 1e-5) << "u = -7: u' + 1 = -6";
}

TEST(SwigluClamp, NaNStaysNaN) {
  Inputs in;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  in.g = {nan, 1.0f};
  in.u = {1.0f, nan};
  in.dact = {1.0f, 1.0f};
  mf_kctx ctx = {nullptr, 0};
  const Out o = run(in, ctx);
  EXPECT_TRUE(std::isnan(o.act[0]));
  EXPECT_TRUE(std::isnan(o.act[1]));
  EXPECT_EQ(o.dg[0], 0.0f) << "NaN <= limit is false: no gradient, as torch's mask";
  EXPECT_EQ(o.du[1], 0.0f);
}

// L = sum c * act, away from the kinks at g = 7 and u = +-7 (h = 1e-2).
TEST(SwigluClamp, BackwardMatchesFiniteDifferences) {
  const size_t n = 301;
  Inputs in = inputs(n, 7);
  for (size_t k = 0; k < n; k++) {
    if (std::fabs(in.g[k] - kLimit) < 0.05f) in.g[k] = kLimit - 0.5f;
    if (std::fabs(std::fabs(in.u[k]) - kLimit) < 0.05f) in.u[k] = 0.5f;
  }
  mf_kctx ctx = {nullptr, 0};
  const Out o = run(in, ctx);
  std::vector<float> act(n);
  auto loss = [&]() {
    EXPECT_EQ(mf_cpu_swiglu_clamp_fwd(in.g.data(), in.u.data(), (int64_t)n, kLimit, kAlpha, act.data(), &ctx),
              MF_OK);
    return mf_fd::dot(in.dact, act.data());
  };
  mf_fd::check_grad("dg", in.g, o.dg, loss, 1e-2, n, 2e-2, 2e-3);
  mf_fd::check_grad("du", in.u, o.du, loss, 1e-2, n, 2e-2, 2e-3);
}

TEST(SwigluClamp, RoundBf16RoundsEachOutputOnce) {
  const Inputs in = inputs(1001, 11);
  mf_kctx plain = {nullptr, 0}, rounded = {nullptr, 1};
  const Out a = run(in, plain), b = run(in, rounded);
  EXPECT_TRUE(mf_kt::rounded_once(b.act, a.act));
  EXPECT_TRUE(mf_kt::rounded_once(b.dg, a.dg));
  EXPECT_TRUE(mf_kt::rounded_once(b.du, a.du));
}

TEST(SwigluClamp, BitIdenticalAcrossPoolSizes) {
  const Inputs in = inputs(70001, 21);  // past the parallel threshold, not a multiple of the grain
  const Out ref = run(in, mf_kctx{nullptr, 0});
  mf_kt::Pools pools;
  for (mf_threadpool *p : pools.all()) {
    const Out o = run(in, mf_kctx{p, 0});
    EXPECT_TRUE(same_bits(o.act, ref.act));
    EXPECT_TRUE(same_bits(o.dg, ref.dg));
    EXPECT_TRUE(same_bits(o.du, ref.du));
  }
}

TEST(SwigluClamp, EmptyIsANoOp) {
  mf_kctx ctx = {nullptr, 0};
  float x = 1.0f, y = 5.0f, z = 6.0f;
  EXPECT_EQ(mf_cpu_swiglu_clamp_fwd(&x, &x, 0, kLimit, kAlpha, &y, &ctx), MF_OK);
  EXPECT_EQ(mf_cpu_swiglu_clamp_bwd(&x, &x, &x, 0, kLimit, kAlpha, &y, &z, &ctx), MF_OK);
  EXPECT_EQ(y, 5.0f);
  EXPECT_EQ(z, 6.0f);
}

}  // namespace
