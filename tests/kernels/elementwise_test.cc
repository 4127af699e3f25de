// kernels/cpu elementwise.c: SwiGLU, the sigmoid shared-expert gate and the
// residual add, against double references, finite differences, written vs added,
// thread-count invariance, bf16 rounding, large |g| and edge sizes.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cpu/cpu_ops.h"
#include "src/core/core.h"
#include "tests/kernels/fd.h"
#include "tests/kernels/kernel_test_util.h"

namespace {

using mf_fd::random_vec;
using mf_kt::Pool;
using mf_kt::same_bits;
using std::vector;

double sigmoid(double v) { return 1.0 / (1.0 + std::exp(-v)); }
double silu(double v) { return v * sigmoid(v); }

vector<float> spread_vec(size_t n, uint32_t seed) { return random_vec(n, seed, 4.0f); }

// ------------------------------------------------------------------ swiglu

TEST(SwiGlu, ForwardAndBackwardMatchDoubleReference) {
  mf_kctx ctx = {nullptr, 0};
  for (int64_t n : {1, 7, 16, 1001}) {
    SCOPED_TRACE(n);
    auto g = spread_vec(n, 1), u = random_vec(n, 2), dact = random_vec(n, 3);
    vector<float> act(n, NAN), dg(n, NAN), du(n, NAN);
    ASSERT_EQ(mf_cpu_swiglu_fwd(g.data(), u.data(), n, act.data(), &ctx), MF_OK);
    ASSERT_EQ(mf_cpu_swiglu_bwd(g.data(), u.data(), dact.data(), n, dg.data(), du.data(), &ctx), MF_OK);
    for (int64_t i = 0; i < n; i++) {
      double s = sigmoid(g[i]), sl = silu(g[i]);
      double ds = s * (1 + g[i] * (1 - s));
      ASSERT_NEAR(act[i], sl * u[i], 1e-6 * std::fabs(sl * u[i]) + 1e-30) << i;
      ASSERT_NEAR(du[i], dact[i] * sl, 1e-6 * std::fabs(dact[i] * sl) + 1e-30) << i;
      // silu' cancels near g = -1.28 (1 + g(1-s) -> 0): scale by its terms.
      double scale = std::fabs((double)dact[i] * u[i]) * s * (1 + std::fabs(g[i] * (1 - s)));
      ASSERT_NEAR(dg[i], dact[i] * u[i] * ds, 1e-6 * scale + 1e-30) << i;
    }
  }
}

TEST(SwiGlu, GradientsMatchFiniteDifferences) {
  mf_kctx ctx = {nullptr, 0};
  const int64_t n = 200;
  auto g = spread_vec(n, 11), u = random_vec(n, 12), c = random_vec(n, 13);
  vector<float> dg(n), du(n);
  ASSERT_EQ(mf_cpu_swiglu_bwd(g.data(), u.data(), c.data(), n, dg.data(), du.data(), &ctx), MF_OK);
  auto loss = [&]() {
    double L = 0;
    for (int64_t i = 0; i < n; i++) L += c[i] * silu(g[i]) * u[i];
    return L;
  };
  mf_fd::check_grad("dg", g, dg, loss, 1e-3, 200);
  mf_fd::check_grad("du", u, du, loss, 1e-2, 200);
}

TEST(SwiGlu, LargeGateIsFinite) {
  mf_kctx ctx = {nullptr, 0};
  vector<float> g = {100.0f, -100.0f, 88.0f, -88.0f, 89.0f, -89.0f, 1e4f, -1e4f, 1e30f, -1e30f, 0.0f, -0.0f};
  const int64_t n = (int64_t)g.size();
  vector<float> u(n, 2.0f), dact(n, 3.0f), act(n), dg(n), du(n);
  ASSERT_EQ(mf_cpu_swiglu_fwd(g.data(), u.data(), n, act.data(), &ctx), MF_OK);
  ASSERT_EQ(mf_cpu_swiglu_bwd(g.data(), u.data(), dact.data(), n, dg.data(), du.data(), &ctx), MF_OK);
  for (int64_t i = 0; i < n; i++) {
    EXPECT_TRUE(std::isfinite(act[i]) && std::isfinite(dg[i]) && std::isfinite(du[i]))
        << "g=" << g[i] << ": " << act[i] << " " << dg[i] << " " << du[i];
    if (g[i] >= 100) {  // e^-g underflows: silu(g) = g, silu'(g) = 1
      EXPECT_EQ(act[i], g[i] * 2.0f);
      EXPECT_EQ(dg[i], 6.0f);
    }
    if (g[i] <= -100) {  // e^-g overflows to inf: silu(g) = -0, silu'(g) = 0
      EXPECT_EQ(act[i], 0.0f);
      EXPECT_EQ(dg[i], 0.0f);
    }
  }
}

// ------------------------------------------------------------ sigmoid gate

TEST(SigmoidGate, ForwardAddsAndBackwardMatchesReference) {
  mf_kctx ctx = {nullptr, 0};
  struct {
    int64_t R, C;
  } shapes[] = {{1, 1}, {3, 7}, {5, 16}, {4, 33}, {17, 2048}};
  for (auto s : shapes) {
    SCOPED_TRACE(testing::Message() << "R=" << s.R << " C=" << s.C);
    auto gl = spread_vec(s.R, 1), x = random_vec(s.R * s.C, 2), dy = random_vec(s.R * s.C, 3);
    auto y0 = random_vec(s.R * s.C, 4), y = y0;
    vector<float> dx(s.R * s.C, NAN), dgl(s.R, NAN);
    ASSERT_EQ(mf_cpu_sigmoid_gate_fwd(gl.data(), x.data(), s.R, s.C, y.data(), &ctx), MF_OK);
    ASSERT_EQ(mf_cpu_sigmoid_gate_bwd(gl.data(), x.data(), dy.data(), s.R, s.C, dx.data(), dgl.data(), &ctx),
              MF_OK);
    for (int64_t r = 0; r < s.R; r++) {
      double sg = sigmoid(gl[r]), dot = 0, mag = 0;
      for (int64_t c = 0; c < s.C; c++) {
        int64_t i = r * s.C + c;
        double ref = y0[i] + sg * x[i];
        ASSERT_NEAR(y[i], ref, 1e-6 * (std::fabs(y0[i]) + std::fabs(sg * x[i])) + 1e-30) << i;
        ASSERT_NEAR(dx[i], sg * dy[i], 1e-6 * std::fabs(sg * dy[i]) + 1e-30) << i;
        dot += (double)dy[i] * x[i];
        mag += std::fabs((double)dy[i] * x[i]);
      }
      double ref = sg * (1 - sg) * dot;
      ASSERT_NEAR(dgl[r], ref, 1e-6 * sg * (1 - sg) * mag + 1e-30) << r;
    }
  }
}

TEST(SigmoidGate, GradientsMatchFiniteDifferences) {
  mf_kctx ctx = {nullptr, 0};
  const int64_t R = 6, C = 37;
  auto gl = spread_vec(R, 21), x = random_vec(R * C, 22), c = random_vec(R * C, 23);
  vector<float> dx(R * C), dgl(R);
  ASSERT_EQ(mf_cpu_sigmoid_gate_bwd(gl.data(), x.data(), c.data(), R, C, dx.data(), dgl.data(), &ctx), MF_OK);
  auto loss = [&]() {
    double L = 0;
    for (int64_t r = 0; r < R; r++)
      for (int64_t k = 0; k < C; k++) L += c[r * C + k] * sigmoid(gl[r]) * x[r * C + k];
    return L;
  };
  mf_fd::check_grad("dx", x, dx, loss);
  mf_fd::check_grad("dgl", gl, dgl, loss, 1e-3);
}

// y (+)= s*x is "added": y0 + (the result on zeros), bit for bit.
TEST(SigmoidGate, ForwardIsAdded) {
  mf_kctx ctx = {nullptr, 0};
  const int64_t R = 9, C = 21;
  auto gl = spread_vec(R, 31), x = random_vec(R * C, 32), y0 = random_vec(R * C, 33), y = y0;
  vector<float> z(R * C, 0.0f);
  mf_cpu_sigmoid_gate_fwd(gl.data(), x.data(), R, C, y.data(), &ctx);
  mf_cpu_sigmoid_gate_fwd(gl.data(), x.data(), R, C, z.data(), &ctx);
  for (int64_t i = 0; i < R * C; i++) ASSERT_EQ(y[i], y0[i] + z[i]) << i;
}

// -------------------------------------------------------------------- add

TEST(Add, AddsExactly) {
  mf_kctx ctx = {nullptr, 0};
  for (int64_t n : {1, 3, 4097, 100003}) {
    auto x = random_vec(n, 41), y0 = random_vec(n, 42), y = y0;
    ASSERT_EQ(mf_cpu_add(x.data(), n, y.data(), &ctx), MF_OK);
    for (int64_t i = 0; i < n; i++) ASSERT_EQ(y[i], y0[i] + x[i]) << i;
  }
}

// ------------------------------------------------------- scale, dropout

TEST(Scale, MultipliesInPlace) {
  mf_kctx ctx = {nullptr, 0};
  auto x0 = random_vec(1001, 43), x = x0;
  ASSERT_EQ(mf_cpu_scale(x.data(), 1001, 2.5f, &ctx), MF_OK);
  for (int64_t i = 0; i < 1001; i++) ASSERT_EQ(x[i], x0[i] * 2.5f) << i;
}

// The mask is a function of (seed, stream, element): kept elements are x /
// (1 - p) exactly, dropped ones 0, the kept share within 5 sigma of 1 - p;
// another seed or stream draws another mask, the same ones the same mask
// (a backward's call gets its forward's), and threads change nothing.
TEST(Dropout, KeepsOneMinusPScaledAndDrawsTheSameMaskAgain) {
  mf_kctx ctx = {nullptr, 0};
  const int64_t n = 200003;
  const double p = 0.1;
  auto x = random_vec(n, 44);
  vector<float> y(n, NAN), y2(n, NAN), z(n, NAN), w(n, NAN);
  ASSERT_EQ(mf_cpu_dropout(x.data(), n, 7, 12345, p, y.data(), &ctx), MF_OK);
  const float s = (float)(1.0 / (1.0 - p));
  int64_t kept = 0;
  for (int64_t i = 0; i < n; i++) {
    const bool keep = mf_dropout_bits(12345, 7, (uint64_t)i) >= mf_dropout_threshold(p);
    ASSERT_EQ(y[i], keep ? x[i] * s : 0.0f) << i;
    kept += keep;
  }
  const double want = (1 - p) * (double)n, sigma = std::sqrt(p * (1 - p) * (double)n);
  EXPECT_LT(std::fabs((double)kept - want), 5 * sigma) << kept << " kept of " << n;
  mf_kt::Pools pools;
  for (mf_threadpool *pl : pools.all()) {
    mf_kctx c2 = {pl, 0};
    ASSERT_EQ(mf_cpu_dropout(x.data(), n, 7, 12345, p, y2.data(), &c2), MF_OK);
    EXPECT_TRUE(same_bits(y, y2));
  }
  ASSERT_EQ(mf_cpu_dropout(x.data(), n, 7, 12346, p, z.data(), &ctx), MF_OK);
  ASSERT_EQ(mf_cpu_dropout(x.data(), n, 8, 12345, p, w.data(), &ctx), MF_OK);
  int64_t differ_seed = 0, differ_stream = 0;
  for (int64_t i = 0; i < n; i++)
    differ_seed += (y[i] == 0) != (z[i] == 0), differ_stream += (y[i] == 0) != (w[i] == 0);
  EXPECT_GT(differ_seed, n / 20);
  EXPECT_GT(differ_stream, n / 20);
  // p = 0 keeps everything as it is; p outside [0, 1) is refused.
  ASSERT_EQ(mf_cpu_dropout(x.data(), n, 7, 1, 0.0, z.data(), &ctx), MF_OK);
  EXPECT_TRUE(same_bits(x, z));
  EXPECT_NE(mf_cpu_dropout(x.data(), n, 7, 1, 1.0, z.data(), &ctx), MF_OK);
}

// Expert parallelism's received rows: two sources' expert-sorted rows (each
// masked by plain dropout with its own seed), gathered expert by expert and
// within an expert by source, some parts empty and spare rows after them; the
// parts' dropout gives each received row its source row's mask, bit for bit,
// and zeros past the parts; threads change nothing; bad layouts are refused.
TEST(Dropout, PartsMaskEachRowAsItsSourceDoes) {
  mf_kctx ctx = {nullptr, 0};
  const int64_t C = 33, E = 3, P = 2, spare = 4;
  const double p = 0.25;
  const uint64_t stream = 9;
  const int64_t seeds[P] = {1234567, 7654321};
  const int64_t offs[P][E + 1] = {{0, 5, 5, 12}, {0, 2, 40, 41}};  // each source's expert offsets
  vector<float> src[P], masked[P];
  for (int64_t q = 0; q < P; q++) {
    const int64_t n = offs[q][E] * C;
    src[q] = random_vec(n, 50 + (uint32_t)q);
    masked[q].assign(n, NAN);
    ASSERT_EQ(mf_cpu_dropout(src[q].data(), n, stream, (uint64_t)seeds[q], p, masked[q].data(), &ctx), MF_OK);
  }
  vector<int64_t> seg, starts;
  vector<float> x, want;
  for (int64_t e = 0; e < E; e++)
    for (int64_t q = 0; q < P; q++) {
      seg.push_back((int64_t)x.size() / C);
      starts.push_back(offs[q][e]);
      x.insert(x.end(), src[q].begin() + offs[q][e] * C, src[q].begin() + offs[q][e + 1] * C);
      want.insert(want.end(), masked[q].begin() + offs[q][e] * C, masked[q].begin() + offs[q][e + 1] * C);
    }
  seg.push_back((int64_t)x.size() / C);
  x.resize(x.size() + spare * C, 1.0f);  // rows no part holds
  want.resize(x.size(), 0.0f);
  const int64_t n = (int64_t)x.size();
  vector<float> y(n, NAN), y2(n, NAN);
  ASSERT_EQ(mf_cpu_dropout_parts(x.data(), n, stream, p, C, seg.data(), starts.data(), seeds, P, E * P,
                                 y.data(), &ctx),
            MF_OK)
      << mf_last_error();
  EXPECT_TRUE(same_bits(y, want));
  mf_kt::Pools pools;
  for (mf_threadpool *pl : pools.all()) {
    mf_kctx c2 = {pl, 0};
    ASSERT_EQ(mf_cpu_dropout_parts(x.data(), n, stream, p, C, seg.data(), starts.data(), seeds, P, E * P,
                                   y2.data(), &c2),
              MF_OK);
    EXPECT_TRUE(same_bits(y, y2));
  }
  // Segments that fall back or run past the rows, a row width that does not divide n: refused.
  vector<int64_t> bad = seg;
  std::swap(bad[1], bad[2]);
  EXPECT_EQ(mf_cpu_dropout_parts(x.data(), n, stream, p, C, bad.data(), starts.data(), seeds, P, E * P,
                                 y.data(), &ctx),
            MF_ERR_INVALID_ARG);
  bad = seg;
  bad.back() = n / C + 1;
  EXPECT_EQ(mf_cpu_dropout_parts(x.data(), n, stream, p, C, bad.data(), starts.data(), seeds, P, E * P,
                                 y.data(), &ctx),
            MF_ERR_INVALID_ARG);
  EXPECT_EQ(mf_cpu_dropout_parts(x.data(), n, stream, p, C + 1, seg.data(), starts.data(), seeds, P, E * P,
                                 y.data(), &ctx),
            MF_ERR_INVALID_ARG);
}

// -------------------------------------------- threads, bf16, empty inputs

struct Outs {
  vector<float> act, dg, du, gy, gdx, gdgl, ay;
};

Outs run_all(mf_threadpool *pool, int round_bf16) {
  mf_kctx ctx = {pool, round_bf16};
  const int64_t n = 100003, R = 301, C = 333;
  auto g = spread_vec(n, 51), u = random_vec(n, 52), dact = random_vec(n, 53);
  auto gl = spread_vec(R, 54), x = random_vec(R * C, 55), dy = random_vec(R * C, 56);
  Outs o;
  o.act.assign(n, NAN), o.dg.assign(n, NAN), o.du.assign(n, NAN);
  EXPECT_EQ(mf_cpu_swiglu_fwd(g.data(), u.data(), n, o.act.data(), &ctx), MF_OK);
  EXPECT_EQ(mf_cpu_swiglu_bwd(g.data(), u.data(), dact.data(), n, o.dg.data(), o.du.data(), &ctx), MF_OK);
  o.gy = random_vec(R * C, 57);
  o.gdx.assign(R * C, NAN), o.gdgl.assign(R, NAN);
  EXPECT_EQ(mf_cpu_sigmoid_gate_fwd(gl.data(), x.data(), R, C, o.gy.data(), &ctx), MF_OK);
  EXPECT_EQ(mf_cpu_sigmoid_gate_bwd(gl.data(), x.data(), dy.data(), R, C, o.gdx.data(), o.gdgl.data(), &ctx),
            MF_OK);
  o.ay = random_vec(n, 58);
  EXPECT_EQ(mf_cpu_add(u.data(), n, o.ay.data(), &ctx), MF_OK);
  return o;
}

TEST(Elementwise, BitIdenticalForAnyThreadCount) {
  mf_kt::Pools pools;
  Outs a = run_all(nullptr, 0);
  for (mf_threadpool *p : pools.all()) {
    Outs b = run_all(p, 0);
    EXPECT_TRUE(same_bits(a.act, b.act));
    EXPECT_TRUE(same_bits(a.dg, b.dg));
    EXPECT_TRUE(same_bits(a.du, b.du));
    EXPECT_TRUE(same_bits(a.gy, b.gy));
    EXPECT_TRUE(same_bits(a.gdx, b.gdx));
    EXPECT_TRUE(same_bits(a.gdgl, b.gdgl));
    EXPECT_TRUE(same_bits(a.ay, b.ay));
  }
}

TEST(Elementwise, RoundBf16RoundsEveryActivationOutputOnce) {
  Pool p3(3);
  Outs f = run_all(p3.p, 0), r = run_all(p3.p, 1);
  EXPECT_TRUE(mf_kt::rounded_once(r.act, f.act)) << "act";
  EXPECT_TRUE(mf_kt::rounded_once(r.dg, f.dg)) << "dg";
  EXPECT_TRUE(mf_kt::rounded_once(r.du, f.du)) << "du";
  EXPECT_TRUE(mf_kt::rounded_once(r.gy, f.gy)) << "gate y";  // y0 + s*x, the sum rounded once
  EXPECT_TRUE(mf_kt::rounded_once(r.gdx, f.gdx)) << "gate dx";
  EXPECT_TRUE(mf_kt::rounded_once(r.gdgl, f.gdgl)) << "gate dgl";
  EXPECT_TRUE(mf_kt::rounded_once(r.ay, f.ay)) << "add";
}

TEST(Elementwise, EmptyInputsTouchNothing) {
  mf_kctx ctx = {nullptr, 0};
  vector<float> a(4, 1.0f), out(4, 7.0f), out2(4, 7.0f);
  EXPECT_EQ(mf_cpu_swiglu_fwd(a.data(), a.data(), 0, out.data(), &ctx), MF_OK);
  EXPECT_EQ(mf_cpu_swiglu_bwd(a.data(), a.data(), a.data(), 0, out.data(), out2.data(), &ctx), MF_OK);
  EXPECT_EQ(mf_cpu_sigmoid_gate_fwd(a.data(), a.data(), 0, 4, out.data(), &ctx), MF_OK);
  EXPECT_EQ(mf_cpu_sigmoid_gate_bwd(a.data(), a.data(), a.data(), 0, 4, out.data(), out2.data(), &ctx),
            MF_OK);
  EXPECT_EQ(mf_cpu_add(a.data(), 0, out.data(), &ctx), MF_OK);
  for (float v : out) EXPECT_EQ(v, 7.0f);
  for (float v : out2) EXPECT_EQ(v, 7.0f);
  // C = 0: the gate's dgl is an empty dot product, 0.
  vector<float> gl = {0.5f, -2.0f}, dgl(2, NAN);
  EXPECT_EQ(mf_cpu_sigmoid_gate_bwd(gl.data(), a.data(), a.data(), 2, 0, out.data(), dgl.data(), &ctx),
            MF_OK);
  EXPECT_EQ(dgl[0], 0.0f);
  EXPECT_EQ(dgl[1], 0.0f);
}

}  // namespace
