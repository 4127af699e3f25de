// kernels/cpu embedding.c: mf_cpu_embed_fwd / _bwd: exact gathers, the
// gradient summed in token order, finite differences, thread-count invariance
// with repeated ids, bf16 rounding and edge shapes.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
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

// Ids with many repeats (small V) so the backward has real collisions.
vector<int32_t> random_ids(int64_t T, int64_t V, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> d(0, (int32_t)V - 1);
  vector<int32_t> ids(T);
  for (auto &i : ids) i = d(rng);
  return ids;
}

struct Shape {
  int64_t T, V, H;
};
const Shape kShapes[] = {{1, 1, 1}, {1, 5, 17}, {7, 3, 9}, {64, 10, 64}, {33, 50, 130}, {5, 1000, 4096}};

TEST(Embedding, ForwardCopiesRows) {
  mf_kctx ctx = {nullptr, 0};
  for (const Shape &s : kShapes) {
    SCOPED_TRACE(testing::Message() << "T=" << s.T << " V=" << s.V << " H=" << s.H);
    auto table = random_vec(s.V * s.H, 1);
    auto ids = random_ids(s.T, s.V, 2);
    vector<float> out(s.T * s.H, NAN);
    ASSERT_EQ(mf_cpu_embed_fwd(ids.data(), s.T, table.data(), s.V, s.H, out.data(), &ctx), MF_OK);
    for (int64_t t = 0; t < s.T; t++)
      ASSERT_EQ(0, memcmp(&out[t * s.H], &table[ids[t] * s.H], s.H * sizeof(float))) << t;
  }
}

// dtable[v] = old + dout[t1] + dout[t2] + ... for the tokens of v, in token order,
// checked bit for bit; and within 1e-6 of the double sum.
TEST(Embedding, BackwardSumsTokensInOrder) {
  mf_kctx ctx = {nullptr, 0};
  for (const Shape &s : kShapes) {
    SCOPED_TRACE(testing::Message() << "T=" << s.T << " V=" << s.V << " H=" << s.H);
    auto ids = random_ids(s.T, s.V, 3);
    auto dout = random_vec(s.T * s.H, 4), dtable = random_vec(s.V * s.H, 5);
    vector<float> expect = dtable;
    vector<double> ref(dtable.begin(), dtable.end()), mag(dtable.size());
    for (int64_t t = 0; t < s.T; t++)
      for (int64_t c = 0; c < s.H; c++) {
        expect[ids[t] * s.H + c] += dout[t * s.H + c];
        ref[ids[t] * s.H + c] += dout[t * s.H + c];
        mag[ids[t] * s.H + c] += std::fabs(dout[t * s.H + c]);
      }
    ASSERT_EQ(mf_cpu_embed_bwd(ids.data(), s.T, dout.data(), s.V, s.H, dtable.data(), &ctx), MF_OK);
    EXPECT_TRUE(same_bits(dtable, expect));
    for (size_t i = 0; i < dtable.size(); i++)
      ASSERT_NEAR(dtable[i], ref[i], 1e-6 * (mag[i] + std::fabs(ref[i])) + 1e-30) << i;
  }
}

TEST(Embedding, GradientMatchesFiniteDifferences) {
  mf_kctx ctx = {nullptr, 0};
  Shape s = {40, 6, 11};
  auto table = random_vec(s.V * s.H, 11), c = random_vec(s.T * s.H, 12);
  auto ids = random_ids(s.T, s.V, 13);
  vector<float> dtable(table.size(), 0.0f);
  ASSERT_EQ(mf_cpu_embed_bwd(ids.data(), s.T, c.data(), s.V, s.H, dtable.data(), &ctx), MF_OK);
  auto loss = [&]() {
    double L = 0;
    for (int64_t t = 0; t < s.T; t++)
      L = mf_kt::ref_dot(c.data() + t * s.H, 1, table.data() + ids[t] * s.H, 1, s.H, L);
    return L;
  };
  mf_fd::check_grad("dtable", table, dtable, loss, 1e-2, 66);
}

TEST(Embedding, BitIdenticalForAnyThreadCount) {
  mf_kt::Pools pools;
  for (Shape s : {Shape{300, 20, 200}, Shape{5000, 3, 17}, Shape{64, 1000, 1030}}) {
    SCOPED_TRACE(testing::Message() << "T=" << s.T << " V=" << s.V << " H=" << s.H);
    auto table = random_vec(s.V * s.H, 21), dout = random_vec(s.T * s.H, 22);
    auto ids = random_ids(s.T, s.V, 23);
    auto run = [&](mf_threadpool *p, vector<float> *out, vector<float> *dtable) {
      mf_kctx ctx = {p, 0};
      out->assign(s.T * s.H, NAN);
      *dtable = random_vec(s.V * s.H, 24);
      EXPECT_EQ(mf_cpu_embed_fwd(ids.data(), s.T, table.data(), s.V, s.H, out->data(), &ctx), MF_OK);
      EXPECT_EQ(mf_cpu_embed_bwd(ids.data(), s.T, dout.data(), s.V, s.H, dtable->data(), &ctx), MF_OK);
    };
    vector<float> out0, dt0;
    run(nullptr, &out0, &dt0);
    for (mf_threadpool *p : pools.all()) {
      vector<float> out, dt;
      run(p, &out, &dt);
      EXPECT_TRUE(same_bits(out0, out));
      EXPECT_TRUE(same_bits(dt0, dt));
    }
  }
}

TEST(Embedding, RoundBf16RoundsTheOutputOnly) {
  Pool p2(2);
  mf_kctx f = {p2.p, 0}, r = {p2.p, 1};
  Shape s = {300, 20, 200};
  auto table = random_vec(s.V * s.H, 31), dout = random_vec(s.T * s.H, 32);
  auto ids = random_ids(s.T, s.V, 33);
  vector<float> out(s.T * s.H), dt_f(s.V * s.H, 0.0f), dt_r(s.V * s.H, 0.0f);
  ASSERT_EQ(mf_cpu_embed_fwd(ids.data(), s.T, table.data(), s.V, s.H, out.data(), &r), MF_OK);
  for (int64_t t = 0; t < s.T; t++)
    for (int64_t c = 0; c < s.H; c++) {
      float v = table[ids[t] * s.H + c];
      ASSERT_EQ(out[t * s.H + c], mf_round_to_bf16(v));
      ASSERT_LE(std::fabs(out[t * s.H + c] - v), std::ldexp(std::fabs(v), -8));
    }
  mf_cpu_embed_bwd(ids.data(), s.T, dout.data(), s.V, s.H, dt_f.data(), &f);
  mf_cpu_embed_bwd(ids.data(), s.T, dout.data(), s.V, s.H, dt_r.data(), &r);
  EXPECT_TRUE(same_bits(dt_f, dt_r)) << "dtable is a weight gradient: fp32";
}

TEST(Embedding, EmptyAndUnusedRows) {
  mf_kctx ctx = {nullptr, 0};
  vector<float> table(12, 1.0f), out(12, 7.0f), dt(12, 7.0f), dout(12, 1.0f);
  vector<int32_t> ids = {2, 2, 2};
  EXPECT_EQ(mf_cpu_embed_fwd(ids.data(), 0, table.data(), 3, 4, out.data(), &ctx), MF_OK);
  EXPECT_EQ(mf_cpu_embed_bwd(ids.data(), 0, dout.data(), 3, 4, dt.data(), &ctx), MF_OK);
  for (float v : out) EXPECT_EQ(v, 7.0f);
  for (float v : dt) EXPECT_EQ(v, 7.0f);
  // Rows no token uses keep their gradient.
  EXPECT_EQ(mf_cpu_embed_bwd(ids.data(), 3, dout.data(), 3, 4, dt.data(), &ctx), MF_OK);
  for (int i = 0; i < 8; i++) EXPECT_EQ(dt[i], 7.0f);
  for (int i = 8; i < 12; i++) EXPECT_EQ(dt[i], 10.0f);
}

}  // namespace
