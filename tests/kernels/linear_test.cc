// kernels/cpu linear.c: mf_cpu_linear_fwd / _bwd_data / _bwd_weight against a
// double reference, the documented summation order (bit for bit), finite
// differences, written vs added, thread-count invariance, bf16 rounding, edge
// shapes around the tile sizes. The throughput figures: kernels_bench.cc.
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
  int64_t M, N, K;
};

// Around the tiles (MR 4, NR 8, MC 64, NC 64, KC 256): single elements, odd
// sizes, exact multiples, one past, and K over several chunks.
const Shape kShapes[] = {{1, 1, 1},    {1, 17, 33},  {3, 5, 7},     {4, 8, 256},  {5, 9, 257},
                         {64, 64, 64}, {65, 63, 13}, {67, 70, 300}, {130, 65, 1}, {2, 200, 520}};

// y = x.W^T (+ b) in double.
vector<double> ref_fwd(const vector<float> &x, const vector<float> &W, const float *b, Shape s) {
  vector<double> y((size_t)(s.M * s.N));
  for (int64_t m = 0; m < s.M; m++)
    for (int64_t n = 0; n < s.N; n++)
      y[m * s.N + n] = mf_kt::ref_dot(x.data() + m * s.K, 1, W.data() + n * s.K, 1, s.K, b ? b[n] : 0.0);
  return y;
}

// |got - ref| within 1e-6 of the sum of the magnitudes of the terms (fp32
// summation of K terms in order) plus a small absolute floor.
void expect_close_to_ref(const char *what, const vector<float> &got, const vector<double> &ref,
                         const vector<double> &mag, double rel = 1e-6) {
  ASSERT_EQ(got.size(), ref.size());
  for (size_t i = 0; i < got.size(); i++)
    ASSERT_LE(std::fabs(got[i] - ref[i]), rel * mag[i] + 1e-30) << what << "[" << i << "]";
}

vector<double> fwd_magnitude(const vector<float> &x, const vector<float> &W, const float *b, Shape s) {
  vector<double> g((size_t)(s.M * s.N));
  for (int64_t m = 0; m < s.M; m++)
    for (int64_t n = 0; n < s.N; n++) {
      double acc = b ? std::fabs(b[n]) : 0.0;
      for (int64_t k = 0; k < s.K; k++) acc += std::fabs((double)x[m * s.K + k] * W[n * s.K + k]);
      g[m * s.N + n] = acc * std::max(1.0, std::sqrt((double)s.K) / 4);
    }
  return g;
}

TEST(Linear, ForwardMatchesDoubleReference) {
  mf_kctx ctx = {nullptr, 0};
  for (const Shape &s : kShapes) {
    SCOPED_TRACE(testing::Message() << "M=" << s.M << " N=" << s.N << " K=" << s.K);
    auto x = random_vec(s.M * s.K, 1), W = random_vec(s.N * s.K, 2), b = random_vec(s.N, 3);
    for (int with_bias = 0; with_bias < 2; with_bias++) {
      const float *bp = with_bias ? b.data() : nullptr;
      vector<float> y(s.M * s.N, NAN);
      ASSERT_EQ(mf_cpu_linear_fwd(x.data(), W.data(), bp, s.M, s.N, s.K, y.data(), 0, &ctx), MF_OK);
      expect_close_to_ref("y", y, ref_fwd(x, W, bp, s), fwd_magnitude(x, W, bp, s));
    }
  }
}

// The header's promise, checked exactly: out = old + (sum_k in order + b).
TEST(Linear, SummationOrderIsFixed) {
  Pool pool(3);
  mf_kctx ctx = {pool.p, 0};
  Shape s = {67, 70, 600};
  auto x = random_vec(s.M * s.K, 4), W = random_vec(s.N * s.K, 5), b = random_vec(s.N, 6);
  auto y = random_vec(s.M * s.N, 7);
  vector<float> expect(y.size());
  for (int64_t m = 0; m < s.M; m++)
    for (int64_t n = 0; n < s.N; n++) {
      float acc = 0.0f;
      for (int64_t k = 0; k < s.K; k++) acc += x[m * s.K + k] * W[n * s.K + k];
      acc += b[n];
      expect[m * s.N + n] = y[m * s.N + n] + acc;
    }
  ASSERT_EQ(mf_cpu_linear_fwd(x.data(), W.data(), b.data(), s.M, s.N, s.K, y.data(), 1, &ctx), MF_OK);
  EXPECT_TRUE(same_bits(y, expect));
}

TEST(Linear, BackwardMatchesDoubleReference) {
  mf_kctx ctx = {nullptr, 0};
  for (const Shape &s : kShapes) {
    SCOPED_TRACE(testing::Message() << "M=" << s.M << " N=" << s.N << " K=" << s.K);
    auto x = random_vec(s.M * s.K, 11), W = random_vec(s.N * s.K, 12), dy = random_vec(s.M * s.N, 13);
    vector<float> dx(s.M * s.K, NAN), dW(s.N * s.K, 0.0f), db(s.N, 0.0f);
    ASSERT_EQ(mf_cpu_linear_bwd_data(dy.data(), W.data(), s.M, s.N, s.K, dx.data(), 0, &ctx), MF_OK);
    ASSERT_EQ(mf_cpu_linear_bwd_weight(dy.data(), x.data(), s.M, s.N, s.K, dW.data(), db.data(), &ctx),
              MF_OK);
    vector<double> rdx(dx.size()), mdx(dx.size()), rdW(dW.size()), mdW(dW.size()), rdb(db.size()),
        mdb(db.size());
    for (int64_t m = 0; m < s.M; m++)
      for (int64_t k = 0; k < s.K; k++)
        for (int64_t n = 0; n < s.N; n++) {
          double t = (double)dy[m * s.N + n] * W[n * s.K + k];
          rdx[m * s.K + k] += t, mdx[m * s.K + k] += std::fabs(t);
          double u = (double)dy[m * s.N + n] * x[m * s.K + k];
          rdW[n * s.K + k] += u, mdW[n * s.K + k] += std::fabs(u);
        }
    for (int64_t m = 0; m < s.M; m++)
      for (int64_t n = 0; n < s.N; n++) rdb[n] += dy[m * s.N + n], mdb[n] += std::fabs(dy[m * s.N + n]);
    double grow_n = std::max(1.0, std::sqrt((double)s.N) / 4), grow_m = std::max(1.0, std::sqrt((double)s.M) / 4);
    for (auto &v : mdx) v *= grow_n;
    for (auto &v : mdW) v *= grow_m;
    for (auto &v : mdb) v *= grow_m;
    expect_close_to_ref("dx", dx, rdx, mdx);
    expect_close_to_ref("dW", dW, rdW, mdW);
    expect_close_to_ref("db", db, rdb, mdb);
  }
}

// Every input gradient against central differences of L = sum c*y, the loss
// evaluated in double from the current inputs.
TEST(Linear, GradientsMatchFiniteDifferences) {
  mf_kctx ctx = {nullptr, 0};
  for (Shape s : {Shape{3, 5, 7}, Shape{9, 13, 300}, Shape{70, 9, 11}}) {
    SCOPED_TRACE(testing::Message() << "M=" << s.M << " N=" << s.N << " K=" << s.K);
    auto x = random_vec(s.M * s.K, 21), W = random_vec(s.N * s.K, 22), b = random_vec(s.N, 23);
    auto c = random_vec(s.M * s.N, 24);
    auto loss = [&]() {
      auto y = ref_fwd(x, W, b.data(), s);
      double L = 0;
      for (size_t i = 0; i < y.size(); i++) L += c[i] * y[i];
      return L;
    };
    vector<float> dx(x.size()), dW(W.size(), 0.0f), db(b.size(), 0.0f);
    ASSERT_EQ(mf_cpu_linear_bwd_data(c.data(), W.data(), s.M, s.N, s.K, dx.data(), 0, &ctx), MF_OK);
    ASSERT_EQ(mf_cpu_linear_bwd_weight(c.data(), x.data(), s.M, s.N, s.K, dW.data(), db.data(), &ctx), MF_OK);
    mf_fd::check_grad("dx", x, dx, loss);
    mf_fd::check_grad("dW", W, dW, loss);
    mf_fd::check_grad("db", b, db, loss);
  }
}

// Added outputs are old + the written result, bit for bit; weight gradients
// always add.
TEST(Linear, AccumulateAddsToTheWrittenResult) {
  mf_kctx ctx = {nullptr, 0};
  Shape s = {67, 70, 300};
  auto x = random_vec(s.M * s.K, 31), W = random_vec(s.N * s.K, 32), b = random_vec(s.N, 33);
  auto dy = random_vec(s.M * s.N, 34), old_y = random_vec(s.M * s.N, 35), old_dx = random_vec(s.M * s.K, 36);
  auto old_dW = random_vec(s.N * s.K, 37), old_db = random_vec(s.N, 38);

  vector<float> y(s.M * s.N), y_add = old_y;
  mf_cpu_linear_fwd(x.data(), W.data(), b.data(), s.M, s.N, s.K, y.data(), 0, &ctx);
  mf_cpu_linear_fwd(x.data(), W.data(), b.data(), s.M, s.N, s.K, y_add.data(), 1, &ctx);
  for (size_t i = 0; i < y.size(); i++) ASSERT_EQ(y_add[i], old_y[i] + y[i]) << i;

  vector<float> dx(s.M * s.K), dx_add = old_dx;
  mf_cpu_linear_bwd_data(dy.data(), W.data(), s.M, s.N, s.K, dx.data(), 0, &ctx);
  mf_cpu_linear_bwd_data(dy.data(), W.data(), s.M, s.N, s.K, dx_add.data(), 1, &ctx);
  for (size_t i = 0; i < dx.size(); i++) ASSERT_EQ(dx_add[i], old_dx[i] + dx[i]) << i;

  vector<float> dW(s.N * s.K, 0.0f), db(s.N, 0.0f), dW_add = old_dW, db_add = old_db;
  mf_cpu_linear_bwd_weight(dy.data(), x.data(), s.M, s.N, s.K, dW.data(), db.data(), &ctx);
  mf_cpu_linear_bwd_weight(dy.data(), x.data(), s.M, s.N, s.K, dW_add.data(), db_add.data(), &ctx);
  for (size_t i = 0; i < dW.size(); i++) ASSERT_EQ(dW_add[i], old_dW[i] + dW[i]) << i;
  for (size_t i = 0; i < db.size(); i++) ASSERT_EQ(db_add[i], old_db[i] + db[i]) << i;

  // db == NULL leaves the bias gradient alone and dW unchanged.
  vector<float> dW2 = old_dW;
  mf_cpu_linear_bwd_weight(dy.data(), x.data(), s.M, s.N, s.K, dW2.data(), nullptr, &ctx);
  EXPECT_TRUE(same_bits(dW2, dW_add));
}

struct AllOutputs {
  vector<float> y, dx, dW, db;
};

AllOutputs run_all(mf_threadpool *pool, int round_bf16, Shape s, int accumulate) {
  mf_kctx ctx = {pool, round_bf16};
  auto x = random_vec(s.M * s.K, 41), W = random_vec(s.N * s.K, 42), b = random_vec(s.N, 43);
  auto dy = random_vec(s.M * s.N, 44);
  AllOutputs o;
  o.y = random_vec(s.M * s.N, 45);
  o.dx = random_vec(s.M * s.K, 46);
  o.dW = random_vec(s.N * s.K, 47);
  o.db = random_vec(s.N, 48);
  EXPECT_EQ(mf_cpu_linear_fwd(x.data(), W.data(), b.data(), s.M, s.N, s.K, o.y.data(), accumulate, &ctx),
            MF_OK);
  EXPECT_EQ(mf_cpu_linear_bwd_data(dy.data(), W.data(), s.M, s.N, s.K, o.dx.data(), accumulate, &ctx), MF_OK);
  EXPECT_EQ(mf_cpu_linear_bwd_weight(dy.data(), x.data(), s.M, s.N, s.K, o.dW.data(), o.db.data(), &ctx),
            MF_OK);
  return o;
}

TEST(Linear, BitIdenticalForAnyThreadCount) {
  mf_kt::Pools pools;
  for (Shape s : {Shape{130, 70, 300}, Shape{1, 300, 1000}, Shape{1000, 1, 300}, Shape{257, 129, 64}}) {
    for (int acc = 0; acc < 2; acc++) {
      SCOPED_TRACE(testing::Message() << "M=" << s.M << " N=" << s.N << " K=" << s.K << " acc=" << acc);
      AllOutputs a = run_all(nullptr, 0, s, acc);
      for (mf_threadpool *p : pools.all()) {
        AllOutputs b = run_all(p, 0, s, acc);
        EXPECT_TRUE(same_bits(a.y, b.y));
        EXPECT_TRUE(same_bits(a.dx, b.dx));
        EXPECT_TRUE(same_bits(a.dW, b.dW));
        EXPECT_TRUE(same_bits(a.db, b.db));
      }
    }
  }
}

TEST(Linear, RoundBf16RoundsActivationsOnly) {
  Pool p3(3);
  for (int acc = 0; acc < 2; acc++) {
    Shape s = {67, 70, 300};
    AllOutputs f = run_all(p3.p, 0, s, acc), r = run_all(p3.p, 1, s, acc);
    ASSERT_TRUE(mf_kt::rounded_once(r.y, f.y));  // the fp32 result, rounded once at the store
    ASSERT_TRUE(mf_kt::rounded_once(r.dx, f.dx));
    EXPECT_TRUE(same_bits(f.dW, r.dW)) << "weight gradients stay fp32";
    EXPECT_TRUE(same_bits(f.db, r.db));
  }
}

TEST(Linear, EmptyAndDegenerateShapes) {
  mf_kctx ctx = {nullptr, 0};
  const float sentinel = 12345.0f;
  // M = 0 or N = 0: nothing to write; nothing read or written.
  vector<float> x(64, 1.0f), W(64, 1.0f), b(8, 1.0f), y(64, sentinel), dW(64, sentinel), db(8, sentinel);
  EXPECT_EQ(mf_cpu_linear_fwd(x.data(), W.data(), b.data(), 0, 8, 8, y.data(), 0, &ctx), MF_OK);
  EXPECT_EQ(mf_cpu_linear_fwd(x.data(), W.data(), b.data(), 8, 0, 8, y.data(), 0, &ctx), MF_OK);
  EXPECT_EQ(mf_cpu_linear_bwd_data(y.data(), W.data(), 0, 8, 8, x.data(), 0, &ctx), MF_OK);
  for (float v : y) EXPECT_EQ(v, sentinel);
  for (float v : x) EXPECT_EQ(v, 1.0f);
  // M = 0 for the weight gradient: an empty sum, dW and db unchanged.
  EXPECT_EQ(mf_cpu_linear_bwd_weight(y.data(), x.data(), 0, 8, 8, dW.data(), db.data(), &ctx), MF_OK);
  for (float v : dW) EXPECT_EQ(v, sentinel);
  for (float v : db) EXPECT_EQ(v, sentinel);
  // K = 0: y = b (written) or old + b (added); bwd_data over N = 0 gives zeros.
  auto bb = random_vec(8, 51);
  vector<float> y2(3 * 8, NAN);
  EXPECT_EQ(mf_cpu_linear_fwd(x.data(), W.data(), bb.data(), 3, 8, 0, y2.data(), 0, &ctx), MF_OK);
  for (int m = 0; m < 3; m++)
    for (int n = 0; n < 8; n++) EXPECT_EQ(y2[m * 8 + n], bb[n]);
  EXPECT_EQ(mf_cpu_linear_fwd(x.data(), W.data(), nullptr, 3, 8, 0, y2.data(), 1, &ctx), MF_OK);
  for (int m = 0; m < 3; m++)
    for (int n = 0; n < 8; n++) EXPECT_EQ(y2[m * 8 + n], bb[n]);
  vector<float> dx(3 * 5, NAN);
  EXPECT_EQ(mf_cpu_linear_bwd_data(y2.data(), W.data(), 3, 0, 5, dx.data(), 0, &ctx), MF_OK);
  for (float v : dx) EXPECT_EQ(v, 0.0f);
}

}  // namespace
