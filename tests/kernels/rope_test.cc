// kernels/cpu rope.c: mf_cpu_rope_fwd / _bwd against transformers' float32
// computation (bit for bit), a double-precision rotation, finite differences,
// thread-count invariance, bf16 rounding and edge shapes.
//
// The reference follows LlamaRotaryEmbedding + apply_rotary_pos_emb in fp32:
//   inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
//   freqs = inv_freq @ position_ids.float();  emb = cat(freqs, freqs)
//   q_embed = q * emb.cos() + rotate_half(q) * emb.sin()
// with powf/cosf/sinf from the C library. (PyTorch's CPU kernels use SLEEF for
// pow/cos/sin, which can differ from glibc by one ulp in a few percent of
// entries; the angle arithmetic itself is identical.)
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_ops.h"
#include "src/core/core.h"
#include "tests/kernels/fd.h"
#include "tests/kernels/kernel_test_util.h"

namespace {

using mf_fd::random_vec;
using mf_kt::Pool;
using mf_kt::same_bits;
using std::vector;

// The fp32 angle transformers computes for (pos, i).
float angle_f32(int32_t pos, int64_t i, int64_t D, float theta) {
  float inv_freq = 1.0f / powf(theta, (float)(2 * i) / (float)D);
  return (float)pos * inv_freq;
}

// transformers' float32 forward, operation for operation.
vector<float> ref_fwd_f32(const vector<float> &x, int64_t T, int64_t nh, int64_t D,
                          const vector<int32_t> &pos, float theta) {
  vector<float> y = x;
  const int64_t h = D / 2;
  for (int64_t t = 0; t < T; t++)
    for (int64_t i = 0; i < h; i++) {
      float f = angle_f32(pos[t], i, D, theta);
      float c = cosf(f), s = sinf(f);
      for (int64_t k = 0; k < nh; k++) {
        const float *q = &x[(t * nh + k) * D];
        float q1 = q[i], q2 = q[i + h];
        float rot1 = -q2, rot2 = q1;  // rotate_half(q) = cat(-q2, q1)
        y[(t * nh + k) * D + i] = q1 * c + rot1 * s;
        y[(t * nh + k) * D + i + h] = q2 * c + rot2 * s;
      }
    }
  return y;
}

// The same rotation in double (on the fp32 angle, which is part of the model).
vector<double> ref_fwd_f64(const vector<float> &x, int64_t T, int64_t nh, int64_t D,
                           const vector<int32_t> &pos, float theta) {
  vector<double> y(x.begin(), x.end());
  const int64_t h = D / 2;
  for (int64_t t = 0; t < T; t++)
    for (int64_t i = 0; i < h; i++) {
      double f = angle_f32(pos[t], i, D, theta);
      double c = std::cos(f), s = std::sin(f);
      for (int64_t k = 0; k < nh; k++) {
        double q1 = x[(t * nh + k) * D + i], q2 = x[(t * nh + k) * D + i + h];
        y[(t * nh + k) * D + i] = q1 * c - q2 * s;
        y[(t * nh + k) * D + i + h] = q2 * c + q1 * s;
      }
    }
  return y;
}

vector<int32_t> random_positions(int64_t T, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> d(0, 4095);
  vector<int32_t> p(T);
  for (auto &v : p) v = d(rng);
  if (T > 0) p[0] = 0;
  if (T > 1) p[T - 1] = 4095;
  if (T > 2) p[1] = 1;
  return p;
}

// Every position 0..4095 for theta 1e4 and 1e6 and head dims 8, 64, 128.
TEST(Rope, ForwardMatchesTransformersFloat32Exactly) {
  Pool p2(2);
  mf_kctx ctx = {p2.p, 0};
  for (float theta : {1e4f, 1e6f})
    for (int64_t D : {8, 64, 128}) {
      SCOPED_TRACE(testing::Message() << "theta=" << theta << " D=" << D);
      const int64_t T = 4096, nh = 2;
      vector<int32_t> pos(T);
      for (int64_t t = 0; t < T; t++) pos[t] = (int32_t)t;
      auto x = random_vec(T * nh * D, (uint32_t)D);
      auto expect = ref_fwd_f32(x, T, nh, D, pos, theta);
      ASSERT_EQ(mf_cpu_rope_fwd(x.data(), T, nh, D, 0, pos.data(), theta, &ctx), MF_OK);
      size_t bad = 0;
      for (size_t i = 0; i < x.size(); i++) bad += memcmp(&x[i], &expect[i], sizeof(float)) != 0;
      EXPECT_EQ(bad, 0u);
    }
}

// Partial RoPE (GLM-4.5's partial_rotary_factor, rot = head_dim * factor):
// transformers' float32 apply_rotary_pos_emb on q[..., :rot] with the rotary
// embedding of dim rot, q[..., rot:] passed through unchanged; bit for bit.
// The backward: finite differences of the same map; odd or oversized rot refused.
TEST(Rope, PartialRotatesTheFirstRotDimsAsTransformers) {
  mf_kctx ctx = {nullptr, 0};
  const int64_t T = 29, nh = 3;
  auto pos = random_positions(T, 41);
  for (int64_t D : {8, 64, 128})
    for (int64_t rot : {D / 2, D / 4 * 2, (int64_t)2}) {
      SCOPED_TRACE(testing::Message() << "D=" << D << " rot=" << rot);
      auto x = random_vec(T * nh * D, (uint32_t)(D + rot));
      vector<float> xs((size_t)(T * nh * rot));
      for (int64_t r = 0; r < T * nh; r++)
        for (int64_t k = 0; k < rot; k++) xs[r * rot + k] = x[r * D + k];
      const auto part = ref_fwd_f32(xs, T, nh, rot, pos, 1e6f);
      vector<float> want = x;
      for (int64_t r = 0; r < T * nh; r++)
        for (int64_t k = 0; k < rot; k++) want[r * D + k] = part[r * rot + k];
      vector<float> y = x;
      ASSERT_EQ(mf_cpu_rope_fwd(y.data(), T, nh, D, rot, pos.data(), 1e6f, &ctx), MF_OK);
      EXPECT_TRUE(same_bits(y, want));
      // the gradient of sum c * rope(x)
      auto c = random_vec(T * nh * D, 43);
      vector<float> dx = c;
      ASSERT_EQ(mf_cpu_rope_bwd(dx.data(), T, nh, D, rot, pos.data(), 1e6f, &ctx), MF_OK);
      auto loss = [&]() {
        vector<float> s((size_t)(T * nh * rot));
        for (int64_t r = 0; r < T * nh; r++)
          for (int64_t k = 0; k < rot; k++) s[r * rot + k] = x[r * D + k];
        const auto yr = ref_fwd_f64(s, T, nh, rot, pos, 1e6f);
        double L = 0;
        for (int64_t r = 0; r < T * nh; r++)
          for (int64_t k = 0; k < D; k++)
            L += c[r * D + k] * (k < rot ? yr[r * rot + k] : (double)x[r * D + k]);
        return L;
      };
      mf_fd::check_grad("dx", x, dx, loss);
    }
  vector<float> y = random_vec(2 * 8, 44);
  vector<int32_t> p = {0, 3};
  for (int64_t rot : {3, 10, -2}) {
    EXPECT_EQ(mf_cpu_rope_fwd(y.data(), 2, 1, 8, rot, p.data(), 1e4f, &ctx), MF_ERR_INVALID_ARG) << rot;
    EXPECT_NE(std::string(mf_last_error()).find("rotary dims of a head of 8"), std::string::npos);
  }
}

TEST(Rope, ForwardMatchesDoubleRotation) {
  mf_kctx ctx = {nullptr, 0};
  for (float theta : {1e4f, 1e6f})
    for (int64_t D : {2, 8, 64, 128, 600}) {  // 600: more pairs than the kernel's stack chunk
      SCOPED_TRACE(testing::Message() << "theta=" << theta << " D=" << D);
      const int64_t T = 37, nh = 3;
      auto pos = random_positions(T, 5);
      auto x = random_vec(T * nh * D, 6);
      auto ref = ref_fwd_f64(x, T, nh, D, pos, theta);
      vector<float> y = x;
      ASSERT_EQ(mf_cpu_rope_fwd(y.data(), T, nh, D, 0, pos.data(), theta, &ctx), MF_OK);
      for (int64_t r = 0; r < T * nh; r++)
        for (int64_t i = 0; i < D / 2; i++) {
          double scale = std::fabs(x[r * D + i]) + std::fabs(x[r * D + i + D / 2]);
          ASSERT_NEAR(y[r * D + i], ref[r * D + i], 1e-6 * scale) << r << "," << i;
          ASSERT_NEAR(y[r * D + i + D / 2], ref[r * D + i + D / 2], 1e-6 * scale) << r << "," << i;
        }
    }
}

// The backward is the gradient of L = sum c * rope(x): finite differences, and the
// inverse rotation (bwd(fwd(x)) == x up to rounding).
TEST(Rope, BackwardMatchesFiniteDifferencesAndInverts) {
  mf_kctx ctx = {nullptr, 0};
  for (float theta : {1e4f, 1e6f})
    for (int64_t D : {8, 64, 128}) {
      SCOPED_TRACE(testing::Message() << "theta=" << theta << " D=" << D);
      const int64_t T = 9, nh = 2;
      auto pos = random_positions(T, 7);
      auto x = random_vec(T * nh * D, 8), c = random_vec(T * nh * D, 9);
      vector<float> dx = c;
      ASSERT_EQ(mf_cpu_rope_bwd(dx.data(), T, nh, D, 0, pos.data(), theta, &ctx), MF_OK);
      auto loss = [&]() {
        auto y = ref_fwd_f64(x, T, nh, D, pos, theta);
        double L = 0;
        for (size_t i = 0; i < y.size(); i++) L += c[i] * y[i];
        return L;
      };
      mf_fd::check_grad("dx", x, dx, loss);

      vector<float> y = x;
      mf_cpu_rope_fwd(y.data(), T, nh, D, 0, pos.data(), theta, &ctx);
      mf_cpu_rope_bwd(y.data(), T, nh, D, 0, pos.data(), theta, &ctx);
      for (size_t i = 0; i < y.size(); i++) ASSERT_NEAR(y[i], x[i], 1e-6 * (1 + std::fabs(x[i]))) << i;
    }
}

TEST(Rope, BitIdenticalForAnyThreadCount) {
  mf_kt::Pools pools;
  for (int64_t D : {64, 128, 600}) {
    const int64_t T = 301, nh = 4;
    auto pos = random_positions(T, 11);
    auto x = random_vec(T * nh * D, 12);
    for (int bwd = 0; bwd < 2; bwd++) {
      SCOPED_TRACE(testing::Message() << "D=" << D << " bwd=" << bwd);
      auto run = [&](mf_threadpool *p) {
        mf_kctx ctx = {p, 0};
        vector<float> y = x;
        if (bwd)
          EXPECT_EQ(mf_cpu_rope_bwd(y.data(), T, nh, D, 0, pos.data(), 1e6f, &ctx), MF_OK);
        else
          EXPECT_EQ(mf_cpu_rope_fwd(y.data(), T, nh, D, 0, pos.data(), 1e6f, &ctx), MF_OK);
        return y;
      };
      auto a = run(nullptr);
      for (mf_threadpool *p : pools.all()) EXPECT_TRUE(same_bits(a, run(p)));
    }
  }
}

TEST(Rope, RoundBf16RoundsOnce) {
  Pool p3(3);
  const int64_t T = 200, nh = 4, D = 128;
  auto pos = random_positions(T, 21);
  auto x = random_vec(T * nh * D, 22);
  for (int bwd = 0; bwd < 2; bwd++) {
    vector<float> f = x, r = x;
    mf_kctx cf = {p3.p, 0}, cr = {p3.p, 1};
    auto op = bwd ? mf_cpu_rope_bwd : mf_cpu_rope_fwd;
    op(f.data(), T, nh, D, 0, pos.data(), 1e4f, &cf);
    op(r.data(), T, nh, D, 0, pos.data(), 1e4f, &cr);
    ASSERT_TRUE(mf_kt::rounded_once(r, f));
  }
}

TEST(Rope, EdgeCases) {
  mf_kctx ctx = {nullptr, 0};
  // T = 0 touches nothing.
  vector<float> x = random_vec(16, 31), y = x;
  vector<int32_t> pos = {0, 5};
  EXPECT_EQ(mf_cpu_rope_fwd(y.data(), 0, 1, 8, 0, pos.data(), 1e4f, &ctx), MF_OK);
  EXPECT_TRUE(same_bits(x, y));
  // Position 0 is the identity, bit for bit; T = 1, nh = 1.
  EXPECT_EQ(mf_cpu_rope_fwd(y.data(), 1, 1, 8, 0, pos.data(), 1e4f, &ctx), MF_OK);
  EXPECT_TRUE(same_bits(x, y));
  // D = 2: one pair rotated by pos * 1 radian.
  vector<float> z = {1.0f, 0.0f};
  vector<int32_t> p1 = {1};
  EXPECT_EQ(mf_cpu_rope_fwd(z.data(), 1, 1, 2, 0, p1.data(), 1e4f, &ctx), MF_OK);
  EXPECT_EQ(z[0], cosf(1.0f));
  EXPECT_EQ(z[1], sinf(1.0f));
}

}  // namespace
