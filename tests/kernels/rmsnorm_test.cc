// kernels/cpu rmsnorm.c: mf_cpu_rmsnorm_fwd / _bwd against a double reference,
// finite differences, written vs added, in-place use, thread-count invariance,
// bf16 rounding and edge shapes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
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

struct Shape {
  int64_t R, C;
};
// Lane count 16: sizes below, at and around multiples of it, and a layer width.
const Shape kShapes[] = {{1, 1}, {3, 7}, {5, 16}, {4, 17}, {33, 130}, {2, 4096}, {1, 33}};

// y in double from float inputs.
vector<double> ref_fwd(const vector<float> &x, const vector<float> &w, Shape s, float eps, vector<double> *rstd) {
  vector<double> y(x.size());
  if (rstd) rstd->assign(s.R, 0.0);
  for (int64_t r = 0; r < s.R; r++) {
    const double ss = mf_kt::ref_dot(x.data() + r * s.C, 1, x.data() + r * s.C, 1, s.C);
    double rs = 1.0 / std::sqrt(ss / s.C + eps);
    if (rstd) (*rstd)[r] = rs;
    for (int64_t c = 0; c < s.C; c++) y[r * s.C + c] = w[c] * (x[r * s.C + c] * rs);
  }
  return y;
}

TEST(RmsNorm, ForwardMatchesDoubleReference) {
  mf_kctx ctx = {nullptr, 0};
  for (const Shape &s : kShapes)
    for (float eps : {1e-6f, 1e-5f}) {
      SCOPED_TRACE(testing::Message() << "R=" << s.R << " C=" << s.C << " eps=" << eps);
      auto x = random_vec(s.R * s.C, 1), w = random_vec(s.C, 2);
      vector<float> y(x.size(), NAN), rstd(s.R, NAN);
      ASSERT_EQ(mf_cpu_rmsnorm_fwd(x.data(), w.data(), s.R, s.C, eps, y.data(), rstd.data(), &ctx), MF_OK);
      vector<double> rrstd;
      auto ry = ref_fwd(x, w, s, eps, &rrstd);
      for (int64_t r = 0; r < s.R; r++) ASSERT_NEAR(rstd[r], rrstd[r], 1e-6 * rrstd[r]) << r;
      for (size_t i = 0; i < y.size(); i++) ASSERT_NEAR(y[i], ry[i], 1e-6 * std::fabs(ry[i]) + 1e-30) << i;
    }
}

TEST(RmsNorm, ForwardInPlaceMatchesOutOfPlace) {
  Pool p2(2);
  mf_kctx ctx = {p2.p, 0};
  Shape s = {65, 300};
  auto x = random_vec(s.R * s.C, 3), w = random_vec(s.C, 4);
  vector<float> y(x.size()), rstd(s.R), rstd2(s.R), xy = x;
  mf_cpu_rmsnorm_fwd(x.data(), w.data(), s.R, s.C, 1e-6f, y.data(), rstd.data(), &ctx);
  mf_cpu_rmsnorm_fwd(xy.data(), w.data(), s.R, s.C, 1e-6f, xy.data(), rstd2.data(), &ctx);
  EXPECT_TRUE(same_bits(y, xy));
  EXPECT_TRUE(same_bits(rstd, rstd2));
}

// The backward formula against a double reference of the same maths.
TEST(RmsNorm, BackwardMatchesDoubleReference) {
  mf_kctx ctx = {nullptr, 0};
  for (const Shape &s : kShapes) {
    SCOPED_TRACE(testing::Message() << "R=" << s.R << " C=" << s.C);
    auto x = random_vec(s.R * s.C, 5), w = random_vec(s.C, 6), dy = random_vec(s.R * s.C, 7);
    vector<float> y(x.size()), rstd(s.R), dx(x.size(), NAN), dw(s.C, 0.0f);
    mf_cpu_rmsnorm_fwd(x.data(), w.data(), s.R, s.C, 1e-5f, y.data(), rstd.data(), &ctx);
    ASSERT_EQ(mf_cpu_rmsnorm_bwd(dy.data(), x.data(), w.data(), rstd.data(), s.R, s.C, dx.data(), dw.data(),
                                 0, &ctx),
              MF_OK);
    vector<double> rdw(s.C, 0.0), mdw(s.C, 0.0);
    for (int64_t r = 0; r < s.R; r++) {
      double rs = rstd[r], m = 0, mag = 0;
      for (int64_t c = 0; c < s.C; c++) {
        double t = (double)w[c] * dy[r * s.C + c] * x[r * s.C + c] * rs;
        m += t, mag += std::fabs(t);
      }
      m /= s.C, mag /= s.C;
      for (int64_t c = 0; c < s.C; c++) {
        double xh = x[r * s.C + c] * rs;
        double ref = rs * ((double)w[c] * dy[r * s.C + c] - xh * m);
        double scale = rs * (std::fabs((double)w[c] * dy[r * s.C + c]) + std::fabs(xh) * mag);
        ASSERT_NEAR(dx[r * s.C + c], ref, 1e-6 * scale + 1e-30) << r << "," << c;
        rdw[c] += dy[r * s.C + c] * xh;
        mdw[c] += std::fabs(dy[r * s.C + c] * xh);
      }
    }
    for (int64_t c = 0; c < s.C; c++) ASSERT_NEAR(dw[c], rdw[c], 1e-6 * mdw[c] * std::max(1.0, std::sqrt(s.R / 16.0)));
  }
}

// dx and dw against central differences of L = sum c*y (y from a double forward).
TEST(RmsNorm, GradientsMatchFiniteDifferences) {
  mf_kctx ctx = {nullptr, 0};
  for (Shape s : {Shape{3, 7}, Shape{4, 33}, Shape{2, 300}}) {
    SCOPED_TRACE(testing::Message() << "R=" << s.R << " C=" << s.C);
    const float eps = 1e-5f;
    auto x = random_vec(s.R * s.C, 11), w = random_vec(s.C, 12), c = random_vec(s.R * s.C, 13);
    vector<float> y(x.size()), rstd(s.R), dx(x.size()), dw(s.C, 0.0f);
    mf_cpu_rmsnorm_fwd(x.data(), w.data(), s.R, s.C, eps, y.data(), rstd.data(), &ctx);
    mf_cpu_rmsnorm_bwd(c.data(), x.data(), w.data(), rstd.data(), s.R, s.C, dx.data(), dw.data(), 0, &ctx);
    auto loss = [&]() {
      auto ry = ref_fwd(x, w, s, eps, nullptr);
      double L = 0;
      for (size_t i = 0; i < ry.size(); i++) L += c[i] * ry[i];
      return L;
    };
    mf_fd::check_grad("dx", x, dx, loss, 1e-3);
    mf_fd::check_grad("dw", w, dw, loss, 1e-2);
  }
}

struct Outs {
  vector<float> y, rstd, dx, dw;
};

Outs run_all(mf_threadpool *pool, int round_bf16, Shape s, int accumulate) {
  mf_kctx ctx = {pool, round_bf16};
  auto x = random_vec(s.R * s.C, 21), w = random_vec(s.C, 22), dy = random_vec(s.R * s.C, 23);
  Outs o;
  o.y.assign(x.size(), NAN);
  o.rstd.assign(s.R, NAN);
  o.dx = random_vec(x.size(), 24);
  o.dw = random_vec(s.C, 25);
  EXPECT_EQ(mf_cpu_rmsnorm_fwd(x.data(), w.data(), s.R, s.C, 1e-6f, o.y.data(), o.rstd.data(), &ctx), MF_OK);
  EXPECT_EQ(mf_cpu_rmsnorm_bwd(dy.data(), x.data(), w.data(), o.rstd.data(), s.R, s.C, o.dx.data(),
                               o.dw.data(), accumulate, &ctx),
            MF_OK);
  return o;
}

TEST(RmsNorm, AccumulateAddsToTheWrittenResult) {
  Shape s = {33, 130};
  Outs wr = run_all(nullptr, 0, s, 0), ad = run_all(nullptr, 0, s, 1);
  auto old_dx = random_vec(s.R * s.C, 24), old_dw = random_vec(s.C, 25);
  // The written run also added into dw (always added): old_dw + sum.
  for (size_t i = 0; i < wr.dx.size(); i++) ASSERT_EQ(ad.dx[i], old_dx[i] + wr.dx[i]) << i;
  EXPECT_TRUE(same_bits(wr.dw, ad.dw));
  // dw from zero, added to old_dw, gives the same bits: the rows are summed first.
  mf_kctx ctx = {nullptr, 0};
  auto x = random_vec(s.R * s.C, 21), w = random_vec(s.C, 22), dy = random_vec(s.R * s.C, 23);
  vector<float> dx(x.size()), dw0(s.C, 0.0f);
  mf_cpu_rmsnorm_bwd(dy.data(), x.data(), w.data(), wr.rstd.data(), s.R, s.C, dx.data(), dw0.data(), 0, &ctx);
  for (int64_t c = 0; c < s.C; c++) ASSERT_EQ(wr.dw[c], old_dw[c] + dw0[c]) << c;
}

TEST(RmsNorm, BitIdenticalForAnyThreadCount) {
  mf_kt::Pools pools;
  for (Shape s : {Shape{130, 300}, Shape{3, 8192}, Shape{1000, 17}}) {
    SCOPED_TRACE(testing::Message() << "R=" << s.R << " C=" << s.C);
    for (int acc = 0; acc < 2; acc++) {
      Outs a = run_all(nullptr, 0, s, acc);
      for (mf_threadpool *p : pools.all()) {
        Outs b = run_all(p, 0, s, acc);
        EXPECT_TRUE(same_bits(a.y, b.y));
        EXPECT_TRUE(same_bits(a.rstd, b.rstd));
        EXPECT_TRUE(same_bits(a.dx, b.dx));
        EXPECT_TRUE(same_bits(a.dw, b.dw));
      }
    }
  }
}

TEST(RmsNorm, RoundBf16RoundsActivationsOnly) {
  Pool p3(3);
  Shape s = {130, 300};
  for (int acc = 0; acc < 2; acc++) {
    Outs f = run_all(p3.p, 0, s, acc), r = run_all(p3.p, 1, s, acc);
    EXPECT_TRUE(same_bits(f.rstd, r.rstd)) << "rstd stays fp32";
    ASSERT_TRUE(mf_kt::rounded_once(r.y, f.y));
    // The backward reads the same (fp32) x and rstd, so dx is the fp32 dx rounded once.
    ASSERT_TRUE(mf_kt::rounded_once(r.dx, f.dx));
    EXPECT_TRUE(same_bits(f.dw, r.dw)) << "dw stays fp32";
  }
}

TEST(RmsNorm, EmptyRowsAndZeroInput) {
  mf_kctx ctx = {nullptr, 0};
  vector<float> x(8, 0.0f), w(8, 1.0f), y(8, 7.0f), rstd(1, 7.0f), dx(8, 7.0f), dw(8, 7.0f);
  // R = 0: nothing touched.
  EXPECT_EQ(mf_cpu_rmsnorm_fwd(x.data(), w.data(), 0, 8, 1e-6f, y.data(), rstd.data(), &ctx), MF_OK);
  EXPECT_EQ(
      mf_cpu_rmsnorm_bwd(x.data(), x.data(), w.data(), rstd.data(), 0, 8, dx.data(), dw.data(), 0, &ctx),
      MF_OK);
  for (float v : y) EXPECT_EQ(v, 7.0f);
  for (float v : dx) EXPECT_EQ(v, 7.0f);
  for (float v : dw) EXPECT_EQ(v, 7.0f);
  EXPECT_EQ(rstd[0], 7.0f);
  // An all-zero row: rstd = 1/sqrt(eps), y = 0, finite gradients.
  EXPECT_EQ(mf_cpu_rmsnorm_fwd(x.data(), w.data(), 1, 8, 1e-6f, y.data(), rstd.data(), &ctx), MF_OK);
  EXPECT_FLOAT_EQ(rstd[0], 1000.0f);
  for (float v : y) EXPECT_EQ(v, 0.0f);
  auto dy = random_vec(8, 31);
  EXPECT_EQ(
      mf_cpu_rmsnorm_bwd(dy.data(), x.data(), w.data(), rstd.data(), 1, 8, dx.data(), dw.data(), 0, &ctx),
      MF_OK);
  for (int c = 0; c < 8; c++) EXPECT_FLOAT_EQ(dx[c], 1000.0f * dy[c]);
}

}  // namespace
