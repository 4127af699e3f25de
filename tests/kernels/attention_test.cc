// Causal GQA attention on the cpu backend (kernels/cpu/attention.c): forward and
// lse against a double-precision full-softmax reference, gradients against
// finite differences and a double reference, causality, thread-count
// invariance, bf16 rounding, edge cases and large scores; and all of it again
// where the value head dim Dv differs from the query/key head dim D
// (DeepSeek-V3's latent attention: D 192, Dv 128), and with gpt-oss's sliding
// windows and learned sink logits (and their gradient).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "kernels/cpu/cpu_ops.h"
#include "src/core/env.h"
#include "tests/kernels/fd.h"
#include "tests/kernels/kernel_test_util.h"

namespace {

using mf_kt::Pool;
using mf_kt::same_bits;
using Vec = std::vector<float>;

// Dv: the value head dim, passed to the kernels as it is (0: D, as every
// caller before Dv existed).
struct Shape {
  int64_t B, S, Hq, Hkv, D, Dv = 0;
  int64_t dv() const { return Dv ? Dv : D; }
  int64_t nq() const { return B * S * Hq * D; }      // q, dq
  int64_t no() const { return B * S * Hq * dv(); }   // o, dout
  int64_t nkv() const { return B * S * Hkv * D; }    // k, dk
  int64_t nv() const { return B * S * Hkv * dv(); }  // v, dv
  int64_t nlse() const { return B * Hq * S; }
  float scale() const { return 1.0f / std::sqrt((float)D); }
};

struct Ref {
  std::vector<double> o, lse, dq, dk, dv, dsinks;
};

// Naive full-softmax attention in double; the gradients when dout is given.
// window > 0: keys i - window < j <= i only; sinks [Hq]: one more logit per
// row, in the denominator only (its gradient in dsinks).
Ref reference(const Shape &sh, const Vec &q, const Vec &k, const Vec &v, const Vec *dout, double scale,
              int64_t window = 0, const Vec *sinks = nullptr) {
  const int64_t B = sh.B, S = sh.S, Hq = sh.Hq, Hkv = sh.Hkv, D = sh.D, Dv = sh.dv(), G = Hq / Hkv;
  Ref r;
  r.o.assign(sh.no(), 0.0);
  r.lse.assign(sh.nlse(), 0.0);
  if (dout) {
    r.dq.assign(sh.nq(), 0.0);
    r.dk.assign(sh.nkv(), 0.0);
    r.dv.assign(sh.nv(), 0.0);
    r.dsinks.assign(Hq, 0.0);
  }
  auto qi = [&](int64_t b, int64_t i, int64_t h) { return ((b * S + i) * Hq + h) * D; };
  auto oi = [&](int64_t b, int64_t i, int64_t h) { return ((b * S + i) * Hq + h) * Dv; };
  auto ki = [&](int64_t b, int64_t j, int64_t g) { return ((b * S + j) * Hkv + g) * D; };
  auto vi = [&](int64_t b, int64_t j, int64_t g) { return ((b * S + j) * Hkv + g) * Dv; };
  std::vector<double> p(S), dp(S);
  for (int64_t b = 0; b < B; b++)
    for (int64_t h = 0; h < Hq; h++) {
      const int64_t g = h / G;
      const double sink = sinks ? (double)(*sinks)[h] : -INFINITY;
      for (int64_t i = 0; i < S; i++) {
        const int64_t j0 = window > 0 ? std::max<int64_t>(0, i - window + 1) : 0;
        double mx = sink;
        for (int64_t j = j0; j <= i; j++) {
          p[j] = mf_kt::ref_dot(q.data() + qi(b, i, h), 1, k.data() + ki(b, j, g), 1, D) * scale;
          mx = std::max(mx, p[j]);
        }
        double sum = sinks ? std::exp(sink - mx) : 0.0;
        for (int64_t j = j0; j <= i; j++) sum += std::exp(p[j] - mx);
        const double lse = mx + std::log(sum);
        r.lse[(b * Hq + h) * S + i] = lse;
        for (int64_t j = j0; j <= i; j++) {
          p[j] = std::exp(p[j] - mx) / sum;
          for (int64_t d = 0; d < Dv; d++) r.o[oi(b, i, h) + d] += p[j] * v[vi(b, j, g) + d];
        }
        if (!dout) continue;
        double di = 0;
        for (int64_t d = 0; d < Dv; d++) di += (double)(*dout)[oi(b, i, h) + d] * r.o[oi(b, i, h) + d];
        if (sinks) r.dsinks[h] -= std::exp(sink - lse) * di;
        for (int64_t j = j0; j <= i; j++) {
          const double t = mf_kt::ref_dot(dout->data() + oi(b, i, h), 1, v.data() + vi(b, j, g), 1, Dv);
          const double ds = p[j] * (t - di);
          for (int64_t d = 0; d < D; d++) {
            r.dq[qi(b, i, h) + d] += scale * ds * k[ki(b, j, g) + d];
            r.dk[ki(b, j, g) + d] += scale * ds * q[qi(b, i, h) + d];
          }
          for (int64_t d = 0; d < Dv; d++) r.dv[vi(b, j, g) + d] += p[j] * (*dout)[oi(b, i, h) + d];
        }
      }
    }
  return r;
}

// max |a - b| / (atol + rtol |b|) over all elements; <= 1 passes.
double worst(const Vec &a, const std::vector<double> &b, double atol, double rtol) {
  double w = 0;
  for (size_t i = 0; i < a.size(); i++) {
    if (!std::isfinite(a[i])) return INFINITY;
    w = std::max(w, std::fabs(a[i] - b[i]) / (atol + rtol * std::fabs(b[i])));
  }
  return w;
}

// max |a - b| / max |b|: an error measured against the tensor's scale.
double err_to_max(const Vec &a, const std::vector<double> &b) {
  double err = 0, mag = 0;
  for (size_t i = 0; i < a.size(); i++) {
    if (!std::isfinite(a[i])) return INFINITY;
    err = std::max(err, std::fabs(a[i] - b[i]));
    mag = std::max(mag, std::fabs(b[i]));
  }
  return err / mag;
}

struct Result {
  Vec o, lse, dq, dk, dv, dsinks;
};

// window and sinks as the kernels take them; with sinks and dout, dsinks
// (added into) starts at 0.
Result run(const Shape &sh, const Vec &q, const Vec &k, const Vec &v, const Vec *dout,
           mf_threadpool *pool = nullptr, int round_bf16 = 0, float scale = 0.0f, int64_t window = 0,
           const Vec *sinks = nullptr) {
  mf_kctx ctx = {pool, round_bf16};
  if (scale == 0.0f) scale = sh.scale();
  const float *sk = sinks ? sinks->data() : nullptr;
  Result r;
  r.o.assign(sh.no(), NAN);
  r.lse.assign(sh.nlse(), NAN);
  EXPECT_EQ(mf_cpu_attn_fwd(q.data(), k.data(), v.data(), sh.B, sh.S, sh.Hq, sh.Hkv, sh.D, sh.Dv, window, sk,
                            scale, r.o.data(), r.lse.data(), &ctx),
            MF_OK)
      << mf_last_error();
  if (dout) {
    r.dq.assign(sh.nq(), NAN);
    r.dk.assign(sh.nkv(), NAN);
    r.dv.assign(sh.nv(), NAN);
    if (sinks) r.dsinks.assign(sh.Hq, 0.0f);
    EXPECT_EQ(mf_cpu_attn_bwd(q.data(), k.data(), v.data(), r.o.data(), dout->data(), r.lse.data(), sh.B,
                              sh.S, sh.Hq, sh.Hkv, sh.D, sh.Dv, window, sk, scale, r.dq.data(), r.dk.data(),
                              r.dv.data(), sinks ? r.dsinks.data() : nullptr, &ctx),
              MF_OK)
        << mf_last_error();
  }
  return r;
}

std::string name(const Shape &s) {
  return "B=" + std::to_string(s.B) + " S=" + std::to_string(s.S) + " Hq=" + std::to_string(s.Hq) +
         " Hkv=" + std::to_string(s.Hkv) + " D=" + std::to_string(s.D) +
         (s.Dv ? " Dv=" + std::to_string(s.Dv) : std::string());
}

const int64_t kHeads[][2] = {{4, 4}, {4, 2}, {8, 1}};

// dq, dk, dv of the backward against central differences of the probe loss
// L = c . o (c: one coefficient per element of o).
// With a window and sinks (non-NULL): dsinks too.
void check_grads_fd(const Shape &sh, Vec &q, Vec &k, Vec &v, const Vec &c, int64_t window = 0,
                    Vec *sinks = nullptr) {
  Result r = run(sh, q, k, v, &c, nullptr, 0, 0.0f, window, sinks);
  Vec o(sh.no()), lse(sh.nlse());
  mf_kctx ctx = {nullptr, 0};
  auto loss = [&]() {
    EXPECT_EQ(mf_cpu_attn_fwd(q.data(), k.data(), v.data(), sh.B, sh.S, sh.Hq, sh.Hkv, sh.D, sh.Dv, window,
                              sinks ? sinks->data() : nullptr, sh.scale(), o.data(), lse.data(), &ctx),
              MF_OK);
    return mf_fd::dot(c, o.data());
  };
  const std::string what = name(sh) + " window " + std::to_string(window) + (sinks ? " sinks" : "");
  mf_fd::check_grad("dq " + what, q, r.dq, loss);
  mf_fd::check_grad("dk " + what, k, r.dk, loss);
  mf_fd::check_grad("dv " + what, v, r.dv, loss);
  if (sinks) mf_fd::check_grad("dsinks " + what, *sinks, r.dsinks, loss);
}

TEST(Attention, ForwardAndLseMatchReference) {
  uint32_t seed = 10;
  for (int64_t S : {1, 2, 7, 64, 130})
    for (int64_t D : {8, 16, 64, 128})
      for (int hi = 0; hi < 3; hi++)
        for (int64_t B : {1, 3}) {
          if (B == 3 && S * D > 64 * 64) continue;  // keep the double reference quick
          Shape sh{B, S, kHeads[hi][0], kHeads[hi][1], D};
          Vec q = mf_fd::random_vec(sh.nq(), seed++), k = mf_fd::random_vec(sh.nkv(), seed++),
              v = mf_fd::random_vec(sh.nkv(), seed++);
          Result r = run(sh, q, k, v, nullptr);
          Ref ref = reference(sh, q, k, v, nullptr, sh.scale());
          EXPECT_LE(worst(r.o, ref.o, 2e-6, 1e-5), 1.0) << name(sh);
          EXPECT_LE(worst(r.lse, ref.lse, 2e-6, 1e-6), 1.0) << name(sh);
        }
}

TEST(Attention, BackwardMatchesDoubleReference) {
  uint32_t seed = 100;
  for (int64_t S : {1, 2, 7, 64, 130})
    for (int64_t D : {8, 16, 64, 128})
      for (int hi = 0; hi < 3; hi++) {
        const int64_t B = 1 + (S + D + hi) % 3;
        if (B * S * D > 2 * 130 * 64) continue;
        Shape sh{B, S, kHeads[hi][0], kHeads[hi][1], D};
        Vec q = mf_fd::random_vec(sh.nq(), seed++), k = mf_fd::random_vec(sh.nkv(), seed++),
            v = mf_fd::random_vec(sh.nkv(), seed++), dout = mf_fd::random_vec(sh.nq(), seed++);
        Result r = run(sh, q, k, v, &dout);
        Ref ref = reference(sh, q, k, v, &dout, sh.scale());
        EXPECT_LE(worst(r.dq, ref.dq, 1e-5, 1e-4), 1.0) << name(sh);
        EXPECT_LE(worst(r.dk, ref.dk, 1e-5, 1e-4), 1.0) << name(sh);
        EXPECT_LE(worst(r.dv, ref.dv, 1e-5, 1e-4), 1.0) << name(sh);
      }
}

// Head dims that are not a multiple of the vector width, lengths that end
// mid-tile: the kernels' tail paths.
TEST(Attention, OddShapesMatchReference) {
  const Shape shapes[] = {
      {1, 5, 2, 1, 1}, {2, 33, 4, 2, 3}, {1, 97, 3, 1, 12}, {1, 70, 2, 2, 20}, {1, 45, 2, 1, 200}};
  uint32_t seed = 150;
  for (const Shape &sh : shapes) {
    Vec q = mf_fd::random_vec(sh.nq(), seed++), k = mf_fd::random_vec(sh.nkv(), seed++),
        v = mf_fd::random_vec(sh.nkv(), seed++), dout = mf_fd::random_vec(sh.nq(), seed++);
    Result r = run(sh, q, k, v, &dout);
    Ref ref = reference(sh, q, k, v, &dout, sh.scale());
    EXPECT_LE(worst(r.o, ref.o, 2e-6, 1e-5), 1.0) << name(sh);
    EXPECT_LE(worst(r.lse, ref.lse, 2e-6, 1e-6), 1.0) << name(sh);
    EXPECT_LE(worst(r.dq, ref.dq, 1e-5, 1e-4), 1.0) << name(sh);
    EXPECT_LE(worst(r.dk, ref.dk, 1e-5, 1e-4), 1.0) << name(sh);
    EXPECT_LE(worst(r.dv, ref.dv, 1e-5, 1e-4), 1.0) << name(sh);
  }
}

TEST(Attention, GradientsMatchFiniteDifferences) {
  const Shape shapes[] = {
      {1, 7, 4, 2, 8}, {2, 5, 8, 1, 16}, {1, 70, 4, 4, 8}, {3, 2, 4, 2, 16}, {1, 1, 4, 1, 8}};
  uint32_t seed = 200;
  for (const Shape &sh : shapes) {
    Vec q = mf_fd::random_vec(sh.nq(), seed++), k = mf_fd::random_vec(sh.nkv(), seed++),
        v = mf_fd::random_vec(sh.nkv(), seed++), c = mf_fd::random_vec(sh.nq(), seed++);
    check_grads_fd(sh, q, k, v, c);
  }
}

TEST(Attention, FutureKeysDoNotChangeEarlierOutputs) {
  const Shape sh{2, 130, 4, 2, 16};
  Vec q = mf_fd::random_vec(sh.nq(), 1), k = mf_fd::random_vec(sh.nkv(), 2),
      v = mf_fd::random_vec(sh.nkv(), 3), dout = mf_fd::random_vec(sh.nq(), 4);
  Result base = run(sh, q, k, v, &dout);
  for (int64_t j : {1, 31, 32, 33, 64, 100, 129}) {
    Vec k2 = k, v2 = v;
    for (int64_t b = 0; b < sh.B; b++)
      for (int64_t e = 0; e < sh.Hkv * sh.D; e++) {
        k2[(b * sh.S + j) * sh.Hkv * sh.D + e] += 3.0f;
        v2[(b * sh.S + j) * sh.Hkv * sh.D + e] -= 5.0f;
      }
    Result r = run(sh, q, k2, v2, &dout);
    for (int64_t b = 0; b < sh.B; b++) {
      const int64_t row = sh.Hq * sh.D;
      const int64_t a0 = (b * sh.S) * row, a1 = (b * sh.S + j) * row;
      // Positions before j: o and dq bit for bit; position j changes.
      EXPECT_EQ(std::memcmp(&r.o[a0], &base.o[a0], (a1 - a0) * sizeof(float)), 0) << "o, key " << j;
      EXPECT_EQ(std::memcmp(&r.dq[a0], &base.dq[a0], (a1 - a0) * sizeof(float)), 0) << "dq, key " << j;
      EXPECT_NE(std::memcmp(&r.o[a1], &base.o[a1], row * sizeof(float)), 0) << "o at key " << j;
      for (int64_t h = 0; h < sh.Hq; h++)
        for (int64_t i = 0; i < j; i++)
          EXPECT_EQ(r.lse[(b * sh.Hq + h) * sh.S + i], base.lse[(b * sh.Hq + h) * sh.S + i]);
    }
  }
}

TEST(Attention, BitIdenticalForAnyThreadCount) {
  const Shape shapes[] = {{3, 130, 4, 2, 16}, {1, 67, 8, 1, 64}, {2, 7, 4, 4, 8}};
  for (const Shape &sh : shapes) {
    Vec q = mf_fd::random_vec(sh.nq(), 5), k = mf_fd::random_vec(sh.nkv(), 6),
        v = mf_fd::random_vec(sh.nkv(), 7), dout = mf_fd::random_vec(sh.nq(), 8);
    for (int rb : {0, 1}) {
      Result ref = run(sh, q, k, v, &dout, nullptr, rb);
      for (int n : {1, 2, 3}) {
        Pool pool(n);
        Result r = run(sh, q, k, v, &dout, pool.p, rb);
        EXPECT_TRUE(same_bits(r.o, ref.o)) << name(sh) << " threads " << n;
        EXPECT_TRUE(same_bits(r.lse, ref.lse)) << name(sh) << " threads " << n;
        EXPECT_TRUE(same_bits(r.dq, ref.dq)) << name(sh) << " threads " << n;
        EXPECT_TRUE(same_bits(r.dk, ref.dk)) << name(sh) << " threads " << n;
        EXPECT_TRUE(same_bits(r.dv, ref.dv)) << name(sh) << " threads " << n;
      }
    }
  }
}

// attention.c is compiled for the baseline ISA and for AVX2 (chosen at run
// time; MF_CPU_SIMD=base forces the baseline): the two must agree bit for bit.
TEST(Attention, SimdVariantsGiveSameBits) {
  const Shape shapes[] = {{2, 130, 4, 2, 16}, {1, 75, 8, 1, 64}, {1, 33, 4, 2, 8}, {1, 20, 2, 1, 200}};
  for (const Shape &sh : shapes) {
    Vec q = mf_fd::random_vec(sh.nq(), 51), k = mf_fd::random_vec(sh.nkv(), 52),
        v = mf_fd::random_vec(sh.nkv(), 53), dout = mf_fd::random_vec(sh.nq(), 54);
    Result best = run(sh, q, k, v, &dout);
    ASSERT_EQ(setenv("MF_CPU_SIMD", "base", 1), 0);
    mf_env_reload();
    Result base = run(sh, q, k, v, &dout);
    unsetenv("MF_CPU_SIMD");
    mf_env_reload();
    EXPECT_TRUE(same_bits(best.o, base.o)) << name(sh);
    EXPECT_TRUE(same_bits(best.lse, base.lse)) << name(sh);
    EXPECT_TRUE(same_bits(best.dq, base.dq)) << name(sh);
    EXPECT_TRUE(same_bits(best.dk, base.dk)) << name(sh);
    EXPECT_TRUE(same_bits(best.dv, base.dv)) << name(sh);
  }
}

TEST(Attention, RoundBf16OutputsAreRepresentableAndClose) {
  const Shape sh{2, 70, 4, 2, 16};
  Vec q = mf_fd::random_vec(sh.nq(), 11), k = mf_fd::random_vec(sh.nkv(), 12),
      v = mf_fd::random_vec(sh.nkv(), 13), dout = mf_fd::random_vec(sh.nq(), 14);
  Result exact = run(sh, q, k, v, &dout, nullptr, 0);
  Result r = run(sh, q, k, v, &dout, nullptr, 1);
  EXPECT_TRUE(same_bits(r.lse, exact.lse)) << "lse stays fp32";
  auto check = [&](const char *what, const Vec &got, const Vec &want) {
    int changed = 0;
    for (size_t i = 0; i < got.size(); i++) {
      ASSERT_EQ(got[i], mf_round_to_bf16(got[i])) << what << "[" << i << "] is not a bf16 value";
      ASSERT_LE(std::fabs(got[i] - want[i]), std::ldexp(1.0, -8) * std::fabs(want[i]) + 1e-6)
          << what << "[" << i << "]";
      changed += got[i] != want[i];
    }
    EXPECT_GT(changed, 0) << what << ": rounding did nothing";
  };
  check("o", r.o, exact.o);
  // The backward reads the rounded o, so compare it with an exact backward from that same o.
  Vec dq(sh.nq()), dk(sh.nkv()), dv(sh.nkv());
  mf_kctx ctx = {nullptr, 0};
  ASSERT_EQ(mf_cpu_attn_bwd(q.data(), k.data(), v.data(), r.o.data(), dout.data(), r.lse.data(), sh.B, sh.S,
                            sh.Hq, sh.Hkv, sh.D, sh.Dv, 0, nullptr, sh.scale(), dq.data(), dk.data(),
                            dv.data(), nullptr, &ctx),
            MF_OK);
  check("dq", r.dq, dq);
  check("dk", r.dk, dk);
  check("dv", r.dv, dv);
}

TEST(Attention, SingleTokenIsValueAndScaledDot) {
  const Shape sh{2, 1, 8, 2, 16};
  Vec q = mf_fd::random_vec(sh.nq(), 21), k = mf_fd::random_vec(sh.nkv(), 22),
      v = mf_fd::random_vec(sh.nkv(), 23), dout = mf_fd::random_vec(sh.nq(), 24);
  Result r = run(sh, q, k, v, &dout);
  const int64_t G = sh.Hq / sh.Hkv;
  for (int64_t b = 0; b < sh.B; b++)
    for (int64_t h = 0; h < sh.Hq; h++) {
      const float *qr = &q[(b * sh.Hq + h) * sh.D], *kr = &k[(b * sh.Hkv + h / G) * sh.D];
      float dot = 0.0f;  // fp32 in order, then the scale: transformers' eager logits
      for (int64_t d = 0; d < sh.D; d++) dot += qr[d] * kr[d];
      EXPECT_EQ(r.lse[b * sh.Hq + h], dot * sh.scale());
      for (int64_t d = 0; d < sh.D; d++) {
        EXPECT_EQ(r.o[(b * sh.Hq + h) * sh.D + d], v[(b * sh.Hkv + h / G) * sh.D + d]);
        EXPECT_EQ(r.dq[(b * sh.Hq + h) * sh.D + d], 0.0f);
      }
    }
  for (int64_t b = 0; b < sh.B; b++)
    for (int64_t g = 0; g < sh.Hkv; g++)
      for (int64_t d = 0; d < sh.D; d++) {
        float want = 0.0f;
        for (int64_t h = g * G; h < (g + 1) * G; h++) want += dout[(b * sh.Hq + h) * sh.D + d];
        EXPECT_EQ(r.dk[(b * sh.Hkv + g) * sh.D + d], 0.0f);
        EXPECT_NEAR(r.dv[(b * sh.Hkv + g) * sh.D + d], want, 1e-6);
      }
}

TEST(Attention, LargeScoresStayFiniteAndCorrect) {
  // q, k ~ N(0, 4^2) in D = 64 with scale 1/8: scale*q.k has a spread of 16
  // and reaches about +-80; softmax rows are nearly one-hot.
  const Shape sh{2, 130, 4, 2, 64};
  Vec q = mf_fd::random_vec(sh.nq(), 31, 4.0f), k = mf_fd::random_vec(sh.nkv(), 32, 4.0f),
      v = mf_fd::random_vec(sh.nkv(), 33), dout = mf_fd::random_vec(sh.nq(), 34);
  Result r = run(sh, q, k, v, &dout);
  Ref ref = reference(sh, q, k, v, &dout, sh.scale());
  double maxlogit = 0;
  for (double l : ref.lse) maxlogit = std::max(maxlogit, std::fabs(l));
  EXPECT_GT(maxlogit, 70.0);
  EXPECT_LE(worst(r.o, ref.o, 1e-5, 1e-4), 1.0);
  EXPECT_LE(worst(r.lse, ref.lse, 1e-5, 1e-6), 1.0);
  // Large logits amplify the fp32 rounding of the scores: s = scale*q.k near
  // 80 is off by about an ulp of 80 (7.6e-6), which p = exp(s - lse) turns into
  // a relative error of that size. A gradient element then errs by that much
  // of the gradient's scale, not of its own size (dq[i] = scale sum_j p_j
  // (dp_j - D_i) k_j cancels down to small values whose error stays), so the
  // bound is on max |err| / max |ref|: 2 ulps of 80, 1.5e-5. Measured here
  // (the same bits on every SIMD body and thread count): 4.3e-6 (dq), 4.5e-6
  // (dk), 1.3e-6 (dv). An elementwise relative bound would need 7e-4 for dk
  // at an absolute floor of 1e-5.
  EXPECT_LE(err_to_max(r.dq, ref.dq), 1.5e-5);
  EXPECT_LE(err_to_max(r.dk, ref.dk), 1.5e-5);
  EXPECT_LE(err_to_max(r.dv, ref.dv), 1.5e-5);
}

TEST(Attention, LargeHeadDimsWorkAndTooLargeIsRefused) {
  for (int64_t D : {256, 512}) {
    const Shape sh{1, 40, 2, 1, D};
    Vec q = mf_fd::random_vec(sh.nq(), 41), k = mf_fd::random_vec(sh.nkv(), 42),
        v = mf_fd::random_vec(sh.nkv(), 43), dout = mf_fd::random_vec(sh.nq(), 44);
    Result r = run(sh, q, k, v, &dout);
    Ref ref = reference(sh, q, k, v, &dout, sh.scale());
    EXPECT_LE(worst(r.o, ref.o, 2e-6, 1e-5), 1.0) << name(sh);
    EXPECT_LE(worst(r.lse, ref.lse, 2e-6, 1e-6), 1.0) << name(sh);
    EXPECT_LE(worst(r.dq, ref.dq, 1e-5, 1e-4), 1.0) << name(sh);
    EXPECT_LE(worst(r.dk, ref.dk, 1e-5, 1e-4), 1.0) << name(sh);
    EXPECT_LE(worst(r.dv, ref.dv, 1e-5, 1e-4), 1.0) << name(sh);
  }

  // Past the kernel's stack tile: refused with a message, nothing written.
  const int64_t D = 520;
  Vec big(D, 0.5f), o(D, 7.0f), lse(1, 7.0f), g(D);
  mf_kctx ctx = {nullptr, 0};
  EXPECT_EQ(mf_cpu_attn_fwd(big.data(), big.data(), big.data(), 1, 1, 1, 1, D, 0, 0, nullptr, 1.0f, o.data(),
                            lse.data(), &ctx),
            MF_ERR_UNSUPPORTED);
  EXPECT_NE(std::strstr(mf_last_error(), "D=520"), nullptr) << mf_last_error();
  EXPECT_EQ(o[0], 7.0f);
  EXPECT_EQ(lse[0], 7.0f);
  EXPECT_EQ(mf_cpu_attn_bwd(big.data(), big.data(), big.data(), big.data(), big.data(), lse.data(), 1, 1, 1,
                            1, D, 0, 0, nullptr, 1.0f, g.data(), g.data(), g.data(), nullptr, &ctx),
            MF_ERR_UNSUPPORTED);
  EXPECT_EQ(mf_cpu_attn_fwd(big.data(), big.data(), big.data(), 1, 1, 3, 2, 8, 0, 0, nullptr, 1.0f, o.data(),
                            lse.data(), &ctx),
            MF_ERR_INVALID_ARG);
}

// ------------------------------------------ value head dim Dv != D

// Dv below and above D, with GQA ratios 1 to 4: DeepSeek-V3's D 192 / Dv 128
// at small S, the reverse, Dv past the 32-row query block (bq from the larger
// dim), and odd small dims (the tails of every vector loop).
const Shape kDvShapes[] = {
    {1, 7, 4, 2, 192, 128}, {2, 33, 4, 1, 192, 128}, {1, 70, 2, 2, 64, 128},
    {2, 45, 8, 2, 16, 40},  {1, 40, 2, 1, 128, 512}, {1, 35, 2, 1, 512, 64},
    {1, 5, 2, 1, 3, 1},     {2, 9, 3, 1, 1, 5},      {1, 130, 4, 2, 24, 8},
};

TEST(Attention, ValueHeadDimMatchesReference) {
  uint32_t seed = 300;
  for (const Shape &sh : kDvShapes) {
    Vec q = mf_fd::random_vec(sh.nq(), seed++), k = mf_fd::random_vec(sh.nkv(), seed++),
        v = mf_fd::random_vec(sh.nv(), seed++), dout = mf_fd::random_vec(sh.no(), seed++);
    Result r = run(sh, q, k, v, &dout);
    Ref ref = reference(sh, q, k, v, &dout, sh.scale());
    ASSERT_EQ(r.o.size(), (size_t)sh.no()) << name(sh);
    EXPECT_LE(worst(r.o, ref.o, 2e-6, 1e-5), 1.0) << name(sh);
    EXPECT_LE(worst(r.lse, ref.lse, 2e-6, 1e-6), 1.0) << name(sh);
    EXPECT_LE(worst(r.dq, ref.dq, 1e-5, 1e-4), 1.0) << name(sh);
    EXPECT_LE(worst(r.dk, ref.dk, 1e-5, 1e-4), 1.0) << name(sh);
    EXPECT_LE(worst(r.dv, ref.dv, 1e-5, 1e-4), 1.0) << name(sh);
  }
}

TEST(Attention, ValueHeadDimGradientsMatchFiniteDifferences) {
  const Shape shapes[] = {{1, 7, 4, 2, 24, 16},
                          {2, 5, 4, 1, 8, 20},
                          {1, 70, 2, 1, 12, 8},
                          {1, 6, 2, 1, 192, 128},
                          {1, 4, 2, 2, 3, 1}};
  uint32_t seed = 400;
  for (const Shape &sh : shapes) {
    Vec q = mf_fd::random_vec(sh.nq(), seed++), k = mf_fd::random_vec(sh.nkv(), seed++),
        v = mf_fd::random_vec(sh.nv(), seed++), c = mf_fd::random_vec(sh.no(), seed++);
    check_grads_fd(sh, q, k, v, c);
  }
}

// Dv = 0 is D: the same bits as Dv = D, forward and backward.
TEST(Attention, ValueHeadDimZeroMeansD) {
  const Shape zero{2, 70, 4, 2, 24}, same{2, 70, 4, 2, 24, 24};
  Vec q = mf_fd::random_vec(zero.nq(), 61), k = mf_fd::random_vec(zero.nkv(), 62),
      v = mf_fd::random_vec(zero.nv(), 63), dout = mf_fd::random_vec(zero.no(), 64);
  Result a = run(zero, q, k, v, &dout), b = run(same, q, k, v, &dout);
  EXPECT_TRUE(same_bits(a.o, b.o));
  EXPECT_TRUE(same_bits(a.lse, b.lse));
  EXPECT_TRUE(same_bits(a.dq, b.dq));
  EXPECT_TRUE(same_bits(a.dk, b.dk));
  EXPECT_TRUE(same_bits(a.dv, b.dv));
}

// The thread split and the two SIMD bodies give the same bits with Dv != D,
// in both rounding modes.
TEST(Attention, ValueHeadDimBitIdenticalForAnyThreadCountAndSimd) {
  const Shape shapes[] = {{2, 70, 4, 2, 192, 128}, {1, 67, 4, 1, 16, 48}, {3, 9, 2, 1, 5, 3}};
  for (const Shape &sh : shapes) {
    Vec q = mf_fd::random_vec(sh.nq(), 71), k = mf_fd::random_vec(sh.nkv(), 72),
        v = mf_fd::random_vec(sh.nv(), 73), dout = mf_fd::random_vec(sh.no(), 74);
    for (int rb : {0, 1}) {
      Result ref = run(sh, q, k, v, &dout, nullptr, rb);
      auto same = [&](const Result &r, const std::string &how) {
        EXPECT_TRUE(same_bits(r.o, ref.o)) << name(sh) << how;
        EXPECT_TRUE(same_bits(r.lse, ref.lse)) << name(sh) << how;
        EXPECT_TRUE(same_bits(r.dq, ref.dq)) << name(sh) << how;
        EXPECT_TRUE(same_bits(r.dk, ref.dk)) << name(sh) << how;
        EXPECT_TRUE(same_bits(r.dv, ref.dv)) << name(sh) << how;
      };
      for (int n : {1, 2, 3}) {
        Pool pool(n);
        same(run(sh, q, k, v, &dout, pool.p, rb), " threads " + std::to_string(n));
      }
      ASSERT_EQ(setenv("MF_CPU_SIMD", "base", 1), 0);
      mf_env_reload();
      Result base = run(sh, q, k, v, &dout, nullptr, rb);
      unsetenv("MF_CPU_SIMD");
      mf_env_reload();
      same(base, " baseline SIMD");
    }
  }
}

// bf16 rounding with Dv != D: each output is the exact (fp32) output rounded
// once, o and dv over Dv columns, dq and dk over D; lse stays fp32.
TEST(Attention, ValueHeadDimRoundBf16RoundsEachOutputOnce) {
  const Shape sh{2, 40, 4, 2, 192, 128};
  Vec q = mf_fd::random_vec(sh.nq(), 81), k = mf_fd::random_vec(sh.nkv(), 82),
      v = mf_fd::random_vec(sh.nv(), 83), dout = mf_fd::random_vec(sh.no(), 84);
  Result exact = run(sh, q, k, v, nullptr, nullptr, 0);
  Result r = run(sh, q, k, v, &dout, nullptr, 1);
  EXPECT_TRUE(mf_kt::rounded_once(r.o, exact.o)) << "o";
  EXPECT_TRUE(same_bits(r.lse, exact.lse)) << "lse stays fp32";
  // The backward reads the rounded o: the exact backward from that same o.
  Vec dq(sh.nq()), dk(sh.nkv()), dv(sh.nv());
  mf_kctx ctx = {nullptr, 0};
  ASSERT_EQ(mf_cpu_attn_bwd(q.data(), k.data(), v.data(), r.o.data(), dout.data(), r.lse.data(), sh.B, sh.S,
                            sh.Hq, sh.Hkv, sh.D, sh.Dv, 0, nullptr, sh.scale(), dq.data(), dk.data(),
                            dv.data(), nullptr, &ctx),
            MF_OK);
  EXPECT_TRUE(mf_kt::rounded_once(r.dq, dq)) << "dq";
  EXPECT_TRUE(mf_kt::rounded_once(r.dk, dk)) << "dk";
  EXPECT_TRUE(mf_kt::rounded_once(r.dv, dv)) << "dv";
}

// One token: o is the value row (Dv wide) and dv the group's sum of dout.
TEST(Attention, ValueHeadDimSingleTokenIsValue) {
  const Shape sh{2, 1, 4, 2, 12, 20};
  Vec q = mf_fd::random_vec(sh.nq(), 91), k = mf_fd::random_vec(sh.nkv(), 92),
      v = mf_fd::random_vec(sh.nv(), 93), dout = mf_fd::random_vec(sh.no(), 94);
  Result r = run(sh, q, k, v, &dout);
  const int64_t G = sh.Hq / sh.Hkv, Dv = sh.Dv;
  for (int64_t b = 0; b < sh.B; b++)
    for (int64_t h = 0; h < sh.Hq; h++)
      for (int64_t d = 0; d < Dv; d++)
        EXPECT_EQ(r.o[(b * sh.Hq + h) * Dv + d], v[(b * sh.Hkv + h / G) * Dv + d]);
  for (int64_t b = 0; b < sh.B; b++)
    for (int64_t g = 0; g < sh.Hkv; g++)
      for (int64_t d = 0; d < Dv; d++) {
        float want = 0.0f;
        for (int64_t h = g * G; h < (g + 1) * G; h++) want += dout[(b * sh.Hq + h) * Dv + d];
        EXPECT_NEAR(r.dv[(b * sh.Hkv + g) * Dv + d], want, 1e-6);
      }
  for (float x : r.dk) EXPECT_EQ(x, 0.0f);
  for (float x : r.dq) EXPECT_EQ(x, 0.0f);
}

TEST(Attention, ValueHeadDimOutOfRangeIsRefused) {
  Vec big(8 * 520, 0.5f), o(520, 7.0f), lse(1, 7.0f), g(8 * 520);
  mf_kctx ctx = {nullptr, 0};
  EXPECT_EQ(mf_cpu_attn_fwd(big.data(), big.data(), big.data(), 1, 1, 1, 1, 8, 520, 0, nullptr, 1.0f,
                            o.data(), lse.data(), &ctx),
            MF_ERR_UNSUPPORTED);
  EXPECT_NE(std::strstr(mf_last_error(), "Dv=520"), nullptr) << mf_last_error();
  EXPECT_EQ(o[0], 7.0f);
  EXPECT_EQ(lse[0], 7.0f);
  EXPECT_EQ(mf_cpu_attn_bwd(big.data(), big.data(), big.data(), big.data(), big.data(), lse.data(), 1, 1, 1,
                            1, 8, 520, 0, nullptr, 1.0f, g.data(), g.data(), g.data(), nullptr, &ctx),
            MF_ERR_UNSUPPORTED);
  EXPECT_EQ(mf_cpu_attn_fwd(big.data(), big.data(), big.data(), 1, 1, 1, 1, 8, -4, 0, nullptr, 1.0f, o.data(),
                            lse.data(), &ctx),
            MF_ERR_INVALID_ARG);
  EXPECT_NE(std::strstr(mf_last_error(), "Dv=-4"), nullptr) << mf_last_error();
}

// ------------------------------ sliding windows and sink logits (gpt-oss)

// One learned logit per query head, of a few magnitudes: a large one (+5,
// most of a row's mass), negative ones, some near the scores.
Vec sinks_for(int64_t Hq) {
  const float pick[] = {5.0f, -3.0f, 0.5f, -0.25f, 2.0f, -8.0f, 1.0f, 0.0f};
  Vec s(Hq);
  for (int64_t h = 0; h < Hq; h++) s[h] = pick[h % 8];
  return s;
}

std::string what(const Shape &sh, int64_t window, bool sinks) {
  return name(sh) + " window=" + std::to_string(window) + (sinks ? " sinks" : "");
}

// The bounds of the tests above; dsinks is a sum over B*S rows of terms up to
// |Di|, so its floor is 1e-4.
void expect_near(const Result &r, const Ref &ref, const std::string &w) {
  EXPECT_LE(worst(r.o, ref.o, 2e-6, 1e-5), 1.0) << w;
  EXPECT_LE(worst(r.lse, ref.lse, 2e-6, 1e-6), 1.0) << w;
  if (r.dq.empty()) return;
  EXPECT_LE(worst(r.dq, ref.dq, 1e-5, 1e-4), 1.0) << w;
  EXPECT_LE(worst(r.dk, ref.dk, 1e-5, 1e-4), 1.0) << w;
  EXPECT_LE(worst(r.dv, ref.dv, 1e-5, 1e-4), 1.0) << w;
  if (!r.dsinks.empty()) {
    EXPECT_LE(worst(r.dsinks, ref.dsinks, 1e-4, 1e-4), 1.0) << w;
  }
}

void expect_same(const Result &a, const Result &b, const std::string &w) {
  EXPECT_TRUE(same_bits(a.o, b.o)) << w;
  EXPECT_TRUE(same_bits(a.lse, b.lse)) << w;
  EXPECT_TRUE(same_bits(a.dq, b.dq)) << w;
  EXPECT_TRUE(same_bits(a.dk, b.dk)) << w;
  EXPECT_TRUE(same_bits(a.dv, b.dv)) << w;
  EXPECT_TRUE(same_bits(a.dsinks, b.dsinks)) << w;
}

// Windows of 1 (a row sees itself), 2, 3, past a key tile (64 keys) and at or
// past S (no key hidden), with and without sinks; GQA; S not a multiple of the
// tiles, so windows skip several key tiles of the later query blocks.
TEST(AttentionSinksWindow, MatchReference) {
  const Shape shapes[] = {
      {1, 70, 4, 2, 16}, {2, 130, 4, 2, 8}, {1, 130, 2, 1, 64}, {2, 33, 8, 1, 12}, {1, 200, 4, 4, 32}};
  uint32_t seed = 500;
  for (const Shape &sh : shapes) {
    Vec q = mf_fd::random_vec(sh.nq(), seed++), k = mf_fd::random_vec(sh.nkv(), seed++),
        v = mf_fd::random_vec(sh.nv(), seed++), dout = mf_fd::random_vec(sh.no(), seed++);
    const Vec sinks = sinks_for(sh.Hq);
    for (int64_t window :
         {(int64_t)0, (int64_t)1, (int64_t)2, (int64_t)3, (int64_t)17, (int64_t)65, sh.S - 1, sh.S, sh.S + 7})
      for (bool with : {false, true}) {
        if (window == 0 && !with) continue;  // the tests above
        const Vec *sk = with ? &sinks : nullptr;
        Result r = run(sh, q, k, v, &dout, nullptr, 0, 0.0f, window, sk);
        expect_near(r, reference(sh, q, k, v, &dout, sh.scale(), window, sk), what(sh, window, with));
      }
  }
}

// A window with the value head dim Dv != D (its products and masks over Dv).
TEST(AttentionSinksWindow, ValueHeadDimMatchesReference) {
  const Shape shapes[] = {{1, 70, 4, 2, 24, 16}, {2, 45, 4, 1, 192, 128}, {1, 130, 2, 1, 16, 40}};
  uint32_t seed = 600;
  for (const Shape &sh : shapes) {
    Vec q = mf_fd::random_vec(sh.nq(), seed++), k = mf_fd::random_vec(sh.nkv(), seed++),
        v = mf_fd::random_vec(sh.nv(), seed++), dout = mf_fd::random_vec(sh.no(), seed++);
    const Vec sinks = sinks_for(sh.Hq);
    for (int64_t window : {1, 5, 40})
      for (bool with : {false, true}) {
        const Vec *sk = with ? &sinks : nullptr;
        Result r = run(sh, q, k, v, &dout, nullptr, 0, 0.0f, window, sk);
        expect_near(r, reference(sh, q, k, v, &dout, sh.scale(), window, sk), what(sh, window, with));
      }
  }
}

// dq, dk, dv and dsinks against central differences of L = c . o.
TEST(AttentionSinksWindow, GradientsMatchFiniteDifferences) {
  struct C {
    Shape sh;
    int64_t window;
    bool sinks;
  };
  const C cases[] = {{{1, 7, 4, 2, 8}, 3, true},     {{1, 70, 4, 2, 8}, 5, true},
                     {{2, 5, 4, 1, 8, 12}, 2, true}, {{1, 70, 2, 1, 8}, 66, false},
                     {{1, 9, 4, 2, 8}, 0, true},     {{1, 40, 2, 2, 16, 8}, 1, true},
                     {{3, 4, 4, 2, 8}, 0, true}};
  uint32_t seed = 700;
  for (const C &c : cases) {
    Vec q = mf_fd::random_vec(c.sh.nq(), seed++), k = mf_fd::random_vec(c.sh.nkv(), seed++),
        v = mf_fd::random_vec(c.sh.nv(), seed++), co = mf_fd::random_vec(c.sh.no(), seed++);
    Vec sinks = sinks_for(c.sh.Hq);
    check_grads_fd(c.sh, q, k, v, co, c.window, c.sinks ? &sinks : nullptr);
  }
}

// The thread split and the two SIMD bodies give the same bits with windows
// and sinks (dsinks included), in both rounding modes.
TEST(AttentionSinksWindow, BitIdenticalForAnyThreadCountAndSimd) {
  struct C {
    Shape sh;
    int64_t window;
    bool sinks;
  };
  const C cases[] = {{{3, 130, 4, 2, 16}, 3, true},
                     {{1, 67, 8, 1, 64}, 40, true},
                     {{2, 70, 4, 2, 24, 16}, 1, true},
                     {{2, 7, 4, 4, 8}, 2, false},
                     {{2, 100, 4, 2, 8}, 0, true}};
  for (const C &c : cases) {
    const Shape &sh = c.sh;
    Vec q = mf_fd::random_vec(sh.nq(), 81), k = mf_fd::random_vec(sh.nkv(), 82),
        v = mf_fd::random_vec(sh.nv(), 83), dout = mf_fd::random_vec(sh.no(), 84);
    const Vec sinks = sinks_for(sh.Hq);
    const Vec *sk = c.sinks ? &sinks : nullptr;
    const std::string w = what(sh, c.window, c.sinks);
    for (int rb : {0, 1}) {
      Result ref = run(sh, q, k, v, &dout, nullptr, rb, 0.0f, c.window, sk);
      for (int n : {1, 2, 3}) {
        Pool pool(n);
        expect_same(run(sh, q, k, v, &dout, pool.p, rb, 0.0f, c.window, sk), ref,
                    w + " threads " + std::to_string(n));
      }
      ASSERT_EQ(setenv("MF_CPU_SIMD", "base", 1), 0);
      mf_env_reload();
      Result base = run(sh, q, k, v, &dout, nullptr, rb, 0.0f, c.window, sk);
      unsetenv("MF_CPU_SIMD");
      mf_env_reload();
      expect_same(base, ref, w + " baseline SIMD");
    }
  }
}

// No window and no sink are the kernels as they were: a window at or past S
// hides nothing and gives the same bits as window 0, and sinks of -inf (a
// term exp(-inf) = 0) give the same bits as no sinks, with dsinks unchanged.
TEST(AttentionSinksWindow, NoWindowAndNoSinkAreTheSameBits) {
  const Shape shapes[] = {{2, 130, 4, 2, 16}, {1, 70, 4, 2, 24, 16}, {1, 5, 2, 1, 8}};
  for (const Shape &sh : shapes) {
    Vec q = mf_fd::random_vec(sh.nq(), 91), k = mf_fd::random_vec(sh.nkv(), 92),
        v = mf_fd::random_vec(sh.nv(), 93), dout = mf_fd::random_vec(sh.no(), 94);
    const Vec sinks = sinks_for(sh.Hq), none(sh.Hq, -INFINITY);
    for (int rb : {0, 1}) {
      const Result plain = run(sh, q, k, v, &dout, nullptr, rb);
      expect_same(run(sh, q, k, v, &dout, nullptr, rb, 0.0f, sh.S), plain, name(sh) + " window S");
      expect_same(run(sh, q, k, v, &dout, nullptr, rb, 0.0f, sh.S + 100), plain, name(sh) + " window > S");
      expect_same(run(sh, q, k, v, &dout, nullptr, rb, 0.0f, sh.S, &sinks),
                  run(sh, q, k, v, &dout, nullptr, rb, 0.0f, 0, &sinks), name(sh) + " window S, sinks");
      Result inf = run(sh, q, k, v, &dout, nullptr, rb, 0.0f, 0, &none);
      for (float d : inf.dsinks) EXPECT_EQ(d, 0.0f) << name(sh) << ": dsinks of -inf sinks";
      inf.dsinks.clear();
      expect_same(inf, plain, name(sh) + " sinks -inf");
    }
  }
}

// dsinks is added into, and may be absent (frozen sinks): the other gradients
// do not change; keys outside a row's window do not touch its outputs.
TEST(AttentionSinksWindow, DsinksAddsAndWindowHidesKeys) {
  const Shape sh{2, 200, 4, 2, 16};
  const int64_t W = 17;
  Vec q = mf_fd::random_vec(sh.nq(), 101), k = mf_fd::random_vec(sh.nkv(), 102),
      v = mf_fd::random_vec(sh.nv(), 103), dout = mf_fd::random_vec(sh.no(), 104);
  const Vec sinks = sinks_for(sh.Hq);
  const Result base = run(sh, q, k, v, &dout, nullptr, 0, 0.0f, W, &sinks);
  mf_kctx ctx = {nullptr, 0};
  Vec dq(sh.nq()), dk(sh.nkv()), dv(sh.nv()), ds(sh.Hq);
  for (int64_t h = 0; h < sh.Hq; h++) ds[h] = 0.25f * (float)(h + 1);
  const Vec before = ds;
  ASSERT_EQ(mf_cpu_attn_bwd(q.data(), k.data(), v.data(), base.o.data(), dout.data(), base.lse.data(), sh.B,
                            sh.S, sh.Hq, sh.Hkv, sh.D, sh.Dv, W, sinks.data(), sh.scale(), dq.data(),
                            dk.data(), dv.data(), ds.data(), &ctx),
            MF_OK)
      << mf_last_error();
  for (int64_t h = 0; h < sh.Hq; h++) EXPECT_EQ(ds[h], before[h] + base.dsinks[h]) << "head " << h;
  ASSERT_EQ(mf_cpu_attn_bwd(q.data(), k.data(), v.data(), base.o.data(), dout.data(), base.lse.data(), sh.B,
                            sh.S, sh.Hq, sh.Hkv, sh.D, sh.Dv, W, sinks.data(), sh.scale(), dq.data(),
                            dk.data(), dv.data(), nullptr, &ctx),
            MF_OK)
      << mf_last_error();
  EXPECT_TRUE(same_bits(dq, base.dq));
  EXPECT_TRUE(same_bits(dk, base.dk));
  EXPECT_TRUE(same_bits(dv, base.dv));

  // Key j changed: rows i in [j, j + W) change, all others keep their bits.
  for (int64_t j : {0, 5, 63, 64, 100, 199}) {
    Vec k2 = k, v2 = v;
    for (int64_t b = 0; b < sh.B; b++)
      for (int64_t e = 0; e < sh.Hkv * sh.D; e++) {
        k2[(b * sh.S + j) * sh.Hkv * sh.D + e] += 3.0f;
        v2[(b * sh.S + j) * sh.Hkv * sh.D + e] -= 5.0f;
      }
    const Result r = run(sh, q, k2, v2, &dout, nullptr, 0, 0.0f, W, &sinks);
    const int64_t row = sh.Hq * sh.D;
    for (int64_t b = 0; b < sh.B; b++)
      for (int64_t i = 0; i < sh.S; i++) {
        const int64_t at = (b * sh.S + i) * row;
        const bool seen = i >= j && i < j + W;
        EXPECT_EQ(std::memcmp(&r.o[at], &base.o[at], row * sizeof(float)) != 0, seen)
            << "o row " << i << " key " << j;
        if (!seen) {
          EXPECT_EQ(std::memcmp(&r.dq[at], &base.dq[at], row * sizeof(float)), 0)
              << "dq row " << i << " key " << j;
          for (int64_t h = 0; h < sh.Hq; h++)
            EXPECT_EQ(r.lse[(b * sh.Hq + h) * sh.S + i], base.lse[(b * sh.Hq + h) * sh.S + i]);
        }
      }
  }
}

// One token per window: o[i] = v[i] e^s / (e^s + e^sink), written out.
TEST(AttentionSinksWindow, WindowOfOneIsTheTokenAgainstItsSink) {
  const Shape sh{1, 9, 2, 1, 8};
  Vec q = mf_fd::random_vec(sh.nq(), 111), k = mf_fd::random_vec(sh.nkv(), 112),
      v = mf_fd::random_vec(sh.nv(), 113);
  const Vec sinks = {5.0f, -2.0f};
  const Result r = run(sh, q, k, v, nullptr, nullptr, 0, 0.0f, 1, &sinks);
  for (int64_t i = 0; i < sh.S; i++)
    for (int64_t h = 0; h < sh.Hq; h++) {
      const double s = mf_kt::ref_dot(&q[(i * sh.Hq + h) * sh.D], 1, &k[i * sh.D], 1, sh.D) * sh.scale();
      const double p = 1.0 / (1.0 + std::exp(sinks[h] - s));
      EXPECT_NEAR(r.lse[h * sh.S + i], std::log(std::exp(s) + std::exp((double)sinks[h])), 2e-6);
      for (int64_t d = 0; d < sh.D; d++)
        EXPECT_NEAR(r.o[(i * sh.Hq + h) * sh.D + d], p * v[i * sh.D + d],
                    2e-6 * (1 + std::fabs(v[i * sh.D + d])));
    }
}

TEST(AttentionSinksWindow, NegativeWindowIsRefused) {
  Vec x(64, 0.5f), o(64, 7.0f), lse(8, 7.0f);
  mf_kctx ctx = {nullptr, 0};
  EXPECT_EQ(mf_cpu_attn_fwd(x.data(), x.data(), x.data(), 1, 2, 1, 1, 8, 0, -1, nullptr, 1.0f, o.data(),
                            lse.data(), &ctx),
            MF_ERR_INVALID_ARG);
  EXPECT_NE(std::strstr(mf_last_error(), "window -1"), nullptr) << mf_last_error();
  EXPECT_EQ(o[0], 7.0f);
  EXPECT_EQ(mf_cpu_attn_bwd(x.data(), x.data(), x.data(), x.data(), x.data(), lse.data(), 1, 2, 1, 1, 8, 0,
                            -3, nullptr, 1.0f, o.data(), o.data(), o.data(), nullptr, &ctx),
            MF_ERR_INVALID_ARG);
}

}  // namespace
