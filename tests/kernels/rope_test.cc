// kernels/cpu rope.c: mf_cpu_rope_fwd / _bwd against transformers' float32
// computation (bit for bit), a double-precision rotation, finite differences,
// thread-count invariance, bf16 rounding and edge shapes; and DeepSeek-V3's
// rope (a rotated slice at an offset, interleaved pairs, YaRN frequencies and
// attention factor: kernels/rope.h) against transformers' own modules
// (tests/fixtures/rope, tools/make_rope_fixtures.py).
//
// The reference follows LlamaRotaryEmbedding + apply_rotary_pos_emb in fp32:
//   inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
//   freqs = inv_freq @ position_ids.float();  emb = cat(freqs, freqs)
//   q_embed = q * emb.cos() + rotate_half(q) * emb.sin()
// with powf/cosf/sinf from the C library. (PyTorch's CPU kernels use SLEEF for
// pow/cos/sin, which can differ from glibc by one ulp in a few percent of
// entries; the angle arithmetic itself is identical.) YaRN's frequencies
// (_compute_yarn_parameters) are restated below the same way: the correction
// range in double (Python floats), the ramp and the blend in fp32.
#include <gtest/gtest.h>
#include <jansson.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/rope.h"
#include "src/core/core.h"
#include "src/io/safetensors.h"
#include "tests/kernels/fd.h"
#include "tests/kernels/kernel_test_util.h"

namespace {

using mf_fd::random_vec;
using mf_kt::Pool;
using mf_kt::same_bits;
using std::vector;

// A call's RoPE arguments with only the slots from before DeepSeek-V3's (off,
// interleaved, YaRN) set: every other one 0.
mf_rope_args args(int64_t rot, double theta) {
  mf_rope_args a = {};
  a.rot = rot;
  a.theta = theta;
  return a;
}

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
      ASSERT_EQ(mf_cpu_rope_fwd(x.data(), T, nh, D, pos.data(), args(0, theta), &ctx), MF_OK);
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
      ASSERT_EQ(mf_cpu_rope_fwd(y.data(), T, nh, D, pos.data(), args(rot, 1e6f), &ctx), MF_OK);
      EXPECT_TRUE(same_bits(y, want));
      // the gradient of sum c * rope(x)
      auto c = random_vec(T * nh * D, 43);
      vector<float> dx = c;
      ASSERT_EQ(mf_cpu_rope_bwd(dx.data(), T, nh, D, pos.data(), args(rot, 1e6f), &ctx), MF_OK);
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
    EXPECT_EQ(mf_cpu_rope_fwd(y.data(), 2, 1, 8, p.data(), args(rot, 1e4f), &ctx), MF_ERR_INVALID_ARG) << rot;
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
      ASSERT_EQ(mf_cpu_rope_fwd(y.data(), T, nh, D, pos.data(), args(0, theta), &ctx), MF_OK);
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
      ASSERT_EQ(mf_cpu_rope_bwd(dx.data(), T, nh, D, pos.data(), args(0, theta), &ctx), MF_OK);
      auto loss = [&]() {
        auto y = ref_fwd_f64(x, T, nh, D, pos, theta);
        double L = 0;
        for (size_t i = 0; i < y.size(); i++) L += c[i] * y[i];
        return L;
      };
      mf_fd::check_grad("dx", x, dx, loss);

      vector<float> y = x;
      mf_cpu_rope_fwd(y.data(), T, nh, D, pos.data(), args(0, theta), &ctx);
      mf_cpu_rope_bwd(y.data(), T, nh, D, pos.data(), args(0, theta), &ctx);
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
          EXPECT_EQ(mf_cpu_rope_bwd(y.data(), T, nh, D, pos.data(), args(0, 1e6f), &ctx), MF_OK);
        else
          EXPECT_EQ(mf_cpu_rope_fwd(y.data(), T, nh, D, pos.data(), args(0, 1e6f), &ctx), MF_OK);
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
    op(f.data(), T, nh, D, pos.data(), args(0, 1e4f), &cf);
    op(r.data(), T, nh, D, pos.data(), args(0, 1e4f), &cr);
    ASSERT_TRUE(mf_kt::rounded_once(r, f));
  }
}

TEST(Rope, EdgeCases) {
  mf_kctx ctx = {nullptr, 0};
  // T = 0 touches nothing.
  vector<float> x = random_vec(16, 31), y = x;
  vector<int32_t> pos = {0, 5};
  EXPECT_EQ(mf_cpu_rope_fwd(y.data(), 0, 1, 8, pos.data(), args(0, 1e4f), &ctx), MF_OK);
  EXPECT_TRUE(same_bits(x, y));
  // Position 0 is the identity, bit for bit; T = 1, nh = 1.
  EXPECT_EQ(mf_cpu_rope_fwd(y.data(), 1, 1, 8, pos.data(), args(0, 1e4f), &ctx), MF_OK);
  EXPECT_TRUE(same_bits(x, y));
  // D = 2: one pair rotated by pos * 1 radian.
  vector<float> z = {1.0f, 0.0f};
  vector<int32_t> p1 = {1};
  EXPECT_EQ(mf_cpu_rope_fwd(z.data(), 1, 1, 2, p1.data(), args(0, 1e4f), &ctx), MF_OK);
  EXPECT_EQ(z[0], cosf(1.0f));
  EXPECT_EQ(z[1], sinf(1.0f));
}

// ------------------------------------------------- DeepSeek-V3's rope

// transformers' _compute_yarn_parameters, operation for operation: the
// correction range in Python floats (double), the frequencies in fp32 tensor
// ops (base rounded to fp32; 1.0 / t is t.reciprocal() * 1.0, one quotient).
vector<float> yarn_inv_freq_ref(double base, int64_t dim, double factor, double orig, double beta_fast,
                                double beta_slow, bool truncate) {
  auto correction_dim = [&](double rotations) {
    return (dim * std::log(orig / (rotations * 2 * M_PI))) / (2 * std::log(base));
  };
  double low = correction_dim(beta_fast), high = correction_dim(beta_slow);
  if (truncate) low = std::floor(low), high = std::ceil(high);
  low = std::max(low, 0.0), high = std::min(high, (double)(dim - 1));
  if (low == high) high += 0.001;
  vector<float> inv((size_t)(dim / 2));
  for (int64_t i = 0; i < dim / 2; i++) {
    const float pos_freq = powf((float)base, (float)(2 * i) / (float)dim);
    const float extrap = 1.0f / pos_freq, interp = 1.0f / ((float)factor * pos_freq);
    const float ramp = std::min(std::max(((float)i - (float)low) / (float)(high - low), 0.0f), 1.0f);
    const float ef = 1.0f - ramp;
    const float a = interp * (1.0f - ef), b = extrap * ef;
    inv[(size_t)i] = a + b;
  }
  return inv;
}

// The rotated slice of a head as moefit lays it out: pair i is (x[off + i],
// x[off + i + rot/2]), or (x[off + 2i], x[off + 2i + 1]) interleaved.
struct Slice {
  int64_t off, rot;
  bool interleaved;
  int64_t first(int64_t i) const { return off + (interleaved ? 2 * i : i); }
  int64_t second(int64_t i) const { return interleaved ? off + 2 * i + 1 : off + i + rot / 2; }
};

// transformers' fp32 forward on the slice with frequencies inv and cos, sin
// times attn (rotate_half on the permuted slice when interleaved, written
// back in moefit's order).
vector<float> ref_slice_f32(const vector<float> &x, int64_t T, int64_t nh, int64_t D,
                            const vector<int32_t> &pos, const Slice &sl, const vector<float> &inv,
                            float attn) {
  vector<float> y = x;
  for (int64_t t = 0; t < T; t++)
    for (int64_t i = 0; i < sl.rot / 2; i++) {
      const float f = (float)pos[t] * inv[(size_t)i];
      const float c = cosf(f) * attn, s = sinf(f) * attn;
      for (int64_t h = 0; h < nh; h++) {
        const int64_t r = (t * nh + h) * D;
        const float q1 = x[r + sl.first(i)], q2 = x[r + sl.second(i)];
        y[r + sl.first(i)] = q1 * c + -q2 * s;
        y[r + sl.second(i)] = q2 * c + q1 * s;
      }
    }
  return y;
}

// Off > 0, interleaved pairs, YaRN (DeepSeek-V3's values, others, truncate
// on and off) and an attention factor: bit for bit transformers' arithmetic.
TEST(RopeDeepseek, ForwardMatchesTransformersArithmeticExactly) {
  Pool p2(2);
  mf_kctx ctx = {p2.p, 0};
  struct Yarn {
    double factor, orig, beta_fast, beta_slow;
    int64_t truncate;
    double attn;
  };
  const Yarn none = {0, 0, 0, 0, 0, 0};
  const Yarn v3 = {40, 4096, 32, 1, 0, 0};
  const Yarn scaled = {32, 4096, 32, 1, -1, 0.1 * std::log(32.0) + 1};
  const Yarn narrow = {4, 64, 8, 2, 1, 0.75};  // a short original context: low == high after the clamp
  struct Case {
    int64_t nh, D, off, rot, interleaved;
    double theta;
    Yarn y;
  };
  const Case cases[] = {
      {3, 192, 128, 64, 0, 1e4, none}, {3, 192, 128, 64, 1, 1e4, none}, {1, 576, 512, 0, 1, 1e4, v3},
      {4, 192, 128, 0, 1, 1e4, v3},    {2, 40, 8, 32, 0, 5e4, scaled},  {2, 24, 8, 16, 1, 1e6, narrow},
      {2, 600, 40, 0, 1, 1e4, v3},  // more pairs than the kernel's stack chunk
  };
  for (const Case &c : cases) {
    mf_rope_args a = args(c.rot, c.theta);
    a.off = c.off, a.interleaved = c.interleaved, a.truncate = c.y.truncate;
    a.factor = c.y.factor, a.original_max = c.y.orig, a.beta_fast = c.y.beta_fast,
    a.beta_slow = c.y.beta_slow;
    a.attention_factor = c.y.attn;
    const int64_t rot = c.rot ? c.rot : c.D - c.off;
    SCOPED_TRACE(testing::Message() << "D=" << c.D << " off=" << c.off << " rot=" << rot
                                    << " interleaved=" << c.interleaved << " factor=" << c.y.factor);
    vector<float> inv((size_t)(rot / 2));
    if (c.y.factor > 1) {
      inv = yarn_inv_freq_ref(c.theta, rot, c.y.factor, c.y.orig, c.y.beta_fast, c.y.beta_slow,
                              c.y.truncate >= 0);
    } else {
      for (int64_t i = 0; i < rot / 2; i++)
        inv[(size_t)i] = 1.0f / powf((float)c.theta, (float)(2 * i) / (float)rot);
    }
    mf_rope_plan plan;
    ASSERT_EQ(mf_rope_plan_make(&a, c.D, &plan), MF_OK) << mf_last_error();
    for (int64_t i = 0; i < rot / 2; i++)
      ASSERT_EQ(mf_rope_inv_freq(&plan, i), inv[(size_t)i]) << "inv_freq " << i;
    const int64_t T = 97;
    vector<int32_t> pos(T);
    for (int64_t t = 0; t < T; t++) pos[t] = (int32_t)(t * 1693 % 163840);
    auto x = random_vec(T * c.nh * c.D, (uint32_t)(c.D + c.off));
    const auto want = ref_slice_f32(x, T, c.nh, c.D, pos, {c.off, rot, c.interleaved != 0}, inv,
                                    c.y.attn ? (float)c.y.attn : 1.0f);
    vector<float> y = x;
    ASSERT_EQ(mf_cpu_rope_fwd(y.data(), T, c.nh, c.D, pos.data(), a, &ctx), MF_OK) << mf_last_error();
    EXPECT_TRUE(same_bits(y, want));
  }
}

// rot 0 is the rest of the head; explicit zeros in the new slots are the call from before them.
TEST(RopeDeepseek, DefaultsAreTheOldCall) {
  mf_kctx ctx = {nullptr, 0};
  const int64_t T = 13, nh = 2;
  auto pos = random_positions(T, 51);
  auto x = random_vec(T * nh * 24, 52);
  vector<float> a = x, b = x;
  mf_rope_args r0 = args(0, 1e4), r16 = args(16, 1e4);
  r0.off = 8, r16.off = 8;
  ASSERT_EQ(mf_cpu_rope_fwd(a.data(), T, nh, 24, pos.data(), r0, &ctx), MF_OK);
  ASSERT_EQ(mf_cpu_rope_fwd(b.data(), T, nh, 24, pos.data(), r16, &ctx), MF_OK);
  EXPECT_TRUE(same_bits(a, b));
  // factor 1 (not > 1) with other YaRN slots set, attention factor 1: the default rope
  mf_rope_args y1 = args(0, 1e4);
  y1.factor = 1, y1.original_max = 4096, y1.beta_fast = 32, y1.beta_slow = 1, y1.attention_factor = 1;
  a = x, b = x;
  ASSERT_EQ(mf_cpu_rope_fwd(a.data(), T, nh, 24, pos.data(), y1, &ctx), MF_OK);
  ASSERT_EQ(mf_cpu_rope_fwd(b.data(), T, nh, 24, pos.data(), args(0, 1e4), &ctx), MF_OK);
  EXPECT_TRUE(same_bits(a, b));
}

// DeepSeek-V3's head (nope 128 + rope 64), YaRN, interleaved, attention factor
// != 1: the same bits for any thread count; round_bf16 rounds once; the
// backward is the forward's transpose.
TEST(RopeDeepseek, ThreadsBf16AndTranspose) {
  mf_kt::Pools pools;
  Pool p3(3);
  const int64_t T = 301, nh = 4, D = 192;
  auto pos = random_positions(T, 61);
  auto x = random_vec(T * nh * D, 62), g = random_vec(T * nh * D, 63);
  mf_rope_args a = args(64, 1e4);
  a.off = 128, a.interleaved = 1, a.factor = 40, a.original_max = 4096, a.attention_factor = 1.25;
  for (int bwd = 0; bwd < 2; bwd++) {
    SCOPED_TRACE(testing::Message() << "bwd=" << bwd);
    auto op = bwd ? mf_cpu_rope_bwd : mf_cpu_rope_fwd;
    auto run = [&](const vector<float> &in, mf_threadpool *p, int round) {
      mf_kctx ctx = {p, round};
      vector<float> y = in;
      EXPECT_EQ(op(y.data(), T, nh, D, pos.data(), a, &ctx), MF_OK);
      return y;
    };
    const auto ref = run(x, nullptr, 0);
    for (mf_threadpool *p : pools.all()) EXPECT_TRUE(same_bits(ref, run(x, p, 0)));
    // bf16 inputs (as BF16 storage holds them): the dims left alone stay as they are
    vector<float> xb = x;
    for (float &v : xb) v = mf_round_to_bf16(v);
    EXPECT_TRUE(mf_kt::rounded_once(run(xb, p3.p, 1), run(xb, nullptr, 0)));
  }
  // <bwd(g), x> = <g, fwd(x)>
  mf_kctx ctx = {p3.p, 0};
  vector<float> y = x, dx = g;
  ASSERT_EQ(mf_cpu_rope_fwd(y.data(), T, nh, D, pos.data(), a, &ctx), MF_OK);
  ASSERT_EQ(mf_cpu_rope_bwd(dx.data(), T, nh, D, pos.data(), a, &ctx), MF_OK);
  double l = 0, r = 0, mag = 0;
  for (size_t i = 0; i < x.size(); i++) {
    l += (double)dx[i] * x[i];
    r += (double)g[i] * y[i];
    mag += std::fabs((double)g[i] * y[i]);
  }
  EXPECT_NEAR(l, r, 1e-6 * mag);
}

TEST(RopeDeepseek, RefusesBadArguments) {
  mf_kctx ctx = {nullptr, 0};
  vector<float> y = random_vec(2 * 16, 71);
  vector<int32_t> p = {0, 3};
  auto refused = [&](mf_rope_args a, const char *what) {
    EXPECT_EQ(mf_cpu_rope_fwd(y.data(), 2, 1, 16, p.data(), a, &ctx), MF_ERR_INVALID_ARG) << what;
    EXPECT_NE(std::string(mf_last_error()).find(what), std::string::npos) << mf_last_error();
  };
  mf_rope_args a = args(0, 1e4);
  a.off = 17;
  refused(a, "offset 17 outside a head of 16");
  a.off = -1;
  refused(a, "offset -1 outside a head of 16");
  a = args(10, 1e4), a.off = 8;  // past the head
  refused(a, "10 rotary dims of a head of 16 from dim 8");
  a = args(3, 1e4), a.off = 8;  // odd, not the rest
  refused(a, "3 rotary dims of a head of 16 from dim 8");
  a = args(0, 1e4), a.interleaved = 2;
  refused(a, "interleaved is 2");
  a = args(0, 1e4), a.truncate = 2;
  refused(a, "truncate is 2");
  a = args(0, 1e4), a.factor = 40;  // YaRN without original_max_position_embeddings
  refused(a, "original_max_position_embeddings 0");
  a.original_max = 4096, a.theta = 1;
  refused(a, "theta 1");
  a = args(0, 1e4), a.attention_factor = NAN;
  refused(a, "not all finite");
  // the rest of a head from its last dim, or past an odd rest: nothing to rotate
  vector<float> z = y;
  a = args(0, 1e4), a.off = 16;
  EXPECT_EQ(mf_cpu_rope_fwd(z.data(), 2, 1, 16, p.data(), a, &ctx), MF_OK);
  a.off = 15;
  EXPECT_EQ(mf_cpu_rope_fwd(z.data(), 2, 1, 16, p.data(), a, &ctx), MF_OK);
  EXPECT_TRUE(same_bits(y, z));
}

// YaRN's mscale for the callers (kernels/backend.h): yarn_get_mscale and
// _compute_yarn_parameters' attention factor.
TEST(RopeDeepseek, YarnMscale) {
  EXPECT_EQ(mf_rope_yarn_mscale(1.0, 1.0), 1.0);
  EXPECT_EQ(mf_rope_yarn_mscale(0.5, 2.0), 1.0);
  EXPECT_EQ(mf_rope_yarn_mscale(40.0, 1.0), 0.1 * 1.0 * std::log(40.0) + 1.0);
  EXPECT_EQ(mf_rope_yarn_mscale(40.0, 0.707), 0.1 * 0.707 * std::log(40.0) + 1.0);
  EXPECT_EQ(mf_rope_yarn_attention_factor(40.0, 1.0, 1.0), 1.0);  // DeepSeek-V3
  EXPECT_EQ(mf_rope_yarn_attention_factor(32.0, 1.0, 0.0), 0.1 * std::log(32.0) + 1.0);
  EXPECT_EQ(mf_rope_yarn_attention_factor(32.0, 0.0, 1.0), 0.1 * std::log(32.0) + 1.0);
  EXPECT_EQ(mf_rope_yarn_attention_factor(40.0, 0.707, 1.0),
            (0.1 * 0.707 * std::log(40.0) + 1.0) / (0.1 * std::log(40.0) + 1.0));
  EXPECT_EQ(mf_rope_yarn_attention_factor(0.5, 0.707, 1.0), 1.0);
}

// ---------------------------------------------- against transformers' modules

const char kFixture[] = "tests/fixtures/rope/cases.safetensors";

// One case of tools/make_rope_fixtures.py: q heads with their rotated tail and the
// k row with k_rot at its end, through transformers' DeepseekV3RotaryEmbedding and
// apply_rotary_pos_emb(_interleave).
class RopeFixture : public ::testing::TestWithParam<const char *> {
 protected:
  void SetUp() override {
    ASSERT_EQ(mf_safetensors_open(kFixture, &st_), MF_OK) << mf_last_error();
    const char *m = mf_safetensors_metadata(st_, GetParam());
    ASSERT_NE(m, nullptr) << "no metadata entry " << GetParam();
    json_error_t je;
    meta_ = json_loads(m, 0, &je);
    ASSERT_NE(meta_, nullptr) << je.text;
    T_ = integer("T"), nh_ = integer("nh"), rot_ = integer("rot");
    ASSERT_TRUE(T_ > 0 && nh_ > 0 && rot_ > 0);
    a_ = args(0, number("theta"));
    a_.interleaved = integer("interleaved");
    const double factor = number("factor");
    if (factor > 1) {
      a_.factor = factor, a_.original_max = number("original_max");
      a_.beta_fast = number("beta_fast"), a_.beta_slow = number("beta_slow");
      json_t *tr = json_object_get(meta_, "truncate");
      a_.truncate = !tr || json_is_null(tr) ? 0 : json_is_true(tr) ? 1 : -1;
      a_.attention_factor = mf_rope_yarn_attention_factor(factor, number("mscale"), number("mscale_all_dim"));
    }
  }
  void TearDown() override {
    json_decref(meta_);
    mf_safetensors_close(st_);
  }
  int64_t integer(const char *k) const { return json_integer_value(json_object_get(meta_, k)); }
  double number(const char *k) const { return json_number_value(json_object_get(meta_, k)); }
  template <typename V>
  vector<V> get(const char *what, size_t n) const {
    const mf_st_tensor *x = mf_safetensors_find(st_, (std::string(GetParam()) + "." + what).c_str());
    EXPECT_NE(x, nullptr) << GetParam() << "." << what;
    if (!x) return vector<V>(n);
    EXPECT_EQ(x->nbytes, n * sizeof(V)) << what;
    vector<V> v(n);
    memcpy(v.data(), x->data, std::min(n * sizeof(V), (size_t)x->nbytes));
    return v;
  }
  // The call's arguments for q (heads of Dq, tail from q_off) or the k row.
  mf_rope_args for_q() const {
    mf_rope_args a = a_;
    a.off = integer("q_off");
    return a;
  }
  mf_rope_args for_k() const {
    mf_rope_args a = a_;
    a.off = integer("k_off");
    return a;
  }
  mf_safetensors *st_ = nullptr;
  json_t *meta_ = nullptr;
  int64_t T_ = 0, nh_ = 0, rot_ = 0;
  mf_rope_args a_ = {};
};

// Relative distance in ulps of two finite floats of one sign (or zeros).
int64_t ulps(float a, float b) {
  int32_t ia, ib;
  memcpy(&ia, &a, 4);
  memcpy(&ib, &b, 4);
  if ((ia < 0) != (ib < 0)) return a == b ? 0 : INT64_MAX;
  return std::llabs((int64_t)ia - (int64_t)ib);
}

// The frequencies, cos and sin: transformers' inv_freq (default or
// _compute_yarn_parameters) within one ulp (the same bits where torch's pow is the
// C library's), its emb.cos() * attention_scaling likewise within one ulp of
// the largest; its attention factor and DeepSeek-V3's softmax scale from the helpers.
TEST_P(RopeFixture, FrequenciesAndScalesAreTransformers) {
  mf_rope_plan plan;
  ASSERT_EQ(mf_rope_plan_make(&a_, rot_, &plan), MF_OK) << mf_last_error();
  const int64_t half = rot_ / 2;
  const auto inv = get<float>("inv_freq", (size_t)half);
  for (int64_t i = 0; i < half; i++)
    EXPECT_LE(ulps(mf_rope_inv_freq(&plan, i), inv[i]), 1) << "inv_freq " << i;
  const auto pos = get<int32_t>("pos", (size_t)T_);
  const auto cs = get<float>("cos", (size_t)(T_ * rot_)), sn = get<float>("sin", (size_t)(T_ * rot_));
  const float attn = plan.attn;
  for (int64_t t = 0; t < T_; t++)
    for (int64_t i = 0; i < half; i++) {
      const float f = (float)pos[t] * mf_rope_inv_freq(&plan, i);
      for (int64_t j : {i, i + half}) {
        EXPECT_NEAR(cs[t * rot_ + j], cosf(f) * attn, 1.2e-7 * attn) << "cos t " << t << " i " << i;
        EXPECT_NEAR(sn[t * rot_ + j], sinf(f) * attn, 1.2e-7 * attn) << "sin t " << t << " i " << i;
      }
    }
  EXPECT_EQ(a_.attention_factor ? a_.attention_factor : 1.0, number("attention_factor"));
  const double msa = a_.factor > 1 ? number("mscale_all_dim") : 0;
  const double m = msa ? mf_rope_yarn_mscale(a_.factor, msa) : 1.0;
  EXPECT_EQ(m, number("softmax_mscale"));
  EXPECT_DOUBLE_EQ(std::pow((double)integer("qk_head_dim"), -0.5) * m * m, number("scaling"));
}

// q's rotated tails and the k row's k_rot: each value transformers' within
// the double-rotation test's 1e-6 of the pair's magnitude (times the
// attention factor), the other dims untouched; interleaved, moefit's pair i
// (x[2i], x[2i+1]) holds transformers' permuted outputs i and i + rot/2. The
// scores q_rot . k_rot are transformers'.
TEST_P(RopeFixture, ForwardAndScoresAreTransformers) {
  mf_kctx ctx = {nullptr, 0};
  const int64_t Dq = integer("Dq"), Dk = integer("Dk"), half = rot_ / 2;
  const auto pos = get<int32_t>("pos", (size_t)T_);
  vector<float> yq, yk;
  for (int which = 0; which < 2; which++) {
    const bool isq = which == 0;
    const int64_t nh = isq ? nh_ : 1, D = isq ? Dq : Dk;
    const mf_rope_args a = isq ? for_q() : for_k();
    SCOPED_TRACE(isq ? "q" : "k");
    const auto x = get<float>(isq ? "q" : "k", (size_t)(T_ * nh * D));
    const auto want = get<float>(isq ? "q_out" : "k_out", x.size());
    vector<float> y = x;
    ASSERT_EQ(mf_cpu_rope_fwd(y.data(), T_, nh, D, pos.data(), a, &ctx), MF_OK) << mf_last_error();
    const Slice sl = {a.off, rot_, a.interleaved != 0};
    const double attn = a.attention_factor ? a.attention_factor : 1.0;
    size_t exact = 0;
    for (int64_t r = 0; r < T_ * nh; r++) {
      for (int64_t j = 0; j < a.off; j++)
        ASSERT_EQ(y[r * D + j], x[r * D + j]) << "row " << r << " dim " << j;
      for (int64_t i = 0; i < half; i++) {
        const double scale = attn * (std::fabs(x[r * D + sl.first(i)]) + std::fabs(x[r * D + sl.second(i)]));
        const float g1 = y[r * D + sl.first(i)], g2 = y[r * D + sl.second(i)];
        const float w1 = want[r * D + a.off + i], w2 = want[r * D + a.off + i + half];
        EXPECT_NEAR(g1, w1, 1e-6 * scale) << "row " << r << " pair " << i;
        EXPECT_NEAR(g2, w2, 1e-6 * scale) << "row " << r << " pair " << i;
        exact += (g1 == w1) + (g2 == w2);
      }
    }
    RecordProperty(isq ? "q_exact" : "k_exact", (int)exact);
    (isq ? yq : yk) = y;
  }
  // the scores of every query head and key token: fp32 matmuls of rot products
  const auto scores = get<float>("scores", (size_t)(nh_ * T_ * T_));
  const int64_t qo = integer("q_off"), ko = integer("k_off");
  for (int64_t h = 0; h < nh_; h++)
    for (int64_t t = 0; t < T_; t++)
      for (int64_t s = 0; s < T_; s++) {
        double dot = 0, mag = 0;
        for (int64_t j = 0; j < rot_; j++) {
          const double p = (double)yq[(t * nh_ + h) * Dq + qo + j] * yk[s * Dk + ko + j];
          dot += p;
          mag += std::fabs(p);
        }
        EXPECT_NEAR(dot, scores[(h * T_ + t) * T_ + s], 1e-6 * mag + 1e-7)
            << "head " << h << " q " << t << " k " << s;
      }
}

// The backward: finite differences of transformers' map (its cos and sin, in
// double) for q and the k row, and the forward's transpose.
TEST_P(RopeFixture, BackwardIsTheGradient) {
  mf_kctx ctx = {nullptr, 0};
  const int64_t half = rot_ / 2;
  const auto pos = get<int32_t>("pos", (size_t)T_);
  const auto cs = get<float>("cos", (size_t)(T_ * rot_)), sn = get<float>("sin", (size_t)(T_ * rot_));
  for (int which = 0; which < 2; which++) {
    const bool isq = which == 0;
    const int64_t nh = isq ? nh_ : 1, D = isq ? integer("Dq") : integer("Dk");
    const mf_rope_args a = isq ? for_q() : for_k();
    SCOPED_TRACE(isq ? "q" : "k");
    auto x = get<float>(isq ? "q" : "k", (size_t)(T_ * nh * D));
    const auto c = random_vec(x.size(), 81 + which);
    vector<float> dx = c;
    ASSERT_EQ(mf_cpu_rope_bwd(dx.data(), T_, nh, D, pos.data(), a, &ctx), MF_OK) << mf_last_error();
    const Slice sl = {a.off, rot_, a.interleaved != 0};
    auto loss = [&]() {
      double L = 0;
      for (int64_t t = 0; t < T_; t++)
        for (int64_t h = 0; h < nh; h++) {
          const int64_t r = (t * nh + h) * D;
          for (int64_t j = 0; j < a.off; j++) L += (double)c[r + j] * x[r + j];
          for (int64_t i = 0; i < half; i++) {
            const double co = cs[t * rot_ + i], si = sn[t * rot_ + i];
            const double u = x[r + sl.first(i)], v = x[r + sl.second(i)];
            L += c[r + sl.first(i)] * (u * co - v * si) + c[r + sl.second(i)] * (v * co + u * si);
          }
        }
      return L;
    };
    mf_fd::check_grad("dx", x, dx, loss, 1e-2, 256);
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, RopeFixture,
                         ::testing::Values("offset", "interleaved", "yarn_v3", "yarn_scaled"),
                         [](const testing::TestParamInfo<const char *> &i) { return std::string(i.param); });

}  // namespace
