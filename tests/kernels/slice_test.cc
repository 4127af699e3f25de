// SLICE and SLICE_BWD (kernels/cpu/slice.c): strided column blocks, a row
// broadcast to rep rows, and the transpose summing them, against plain loops
// written here; written or added; the same bits for 1 and 3 threads;
// blocks outside their rows refused.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "kernels/cpu/cpu_ops.h"
#include "src/core/core.h"

namespace {

struct Shape {
  int64_t rows, C, xs, xo, ys, yo, rep;
};

std::vector<float> random(std::mt19937 &g, size_t n) {
  std::uniform_real_distribution<float> d(-1, 1);
  std::vector<float> v(n);
  for (float &x : v) x = d(g);
  return v;
}

const Shape kShapes[] = {
    {5, 3, 8, 5, 3, 0, 1},             // the last 3 of 8 columns into a compact [5, 3]
    {12, 4, 4, 0, 10, 6, 4},           // 3 rows broadcast to 4 each, at column 6 of 10 (MLA's rope key)
    {7, 6, 14, 0, 6, 0, 1},            // the first 6 of 14 (kv_b_proj's key part of a head)
    {300, 64, 576, 512, 192, 128, 1},  // DeepSeek-V3's proportions, threaded
    {2048, 16, 16, 0, 48, 32, 128},    // 16 rows broadcast to 128 heads, threaded
};

TEST(Slice, MatchesLoopsWrittenOrAdded) {
  std::mt19937 g(3);
  for (const Shape &s : kShapes)
    for (int acc : {0, 1}) {
      const int64_t xrows = (s.rows + s.rep - 1) / s.rep;
      const std::vector<float> x = random(g, (size_t)(xrows * s.xs));
      std::vector<float> y = random(g, (size_t)(s.rows * s.ys)), want = y;
      for (int64_t r = 0; r < s.rows; r++)
        for (int64_t j = 0; j < s.C; j++) {
          const float v = x[(size_t)((r / s.rep) * s.xs + s.xo + j)];
          float &d = want[(size_t)(r * s.ys + s.yo + j)];
          d = acc ? d + v : v;
        }
      for (int threads : {0, 3}) {
        mf_threadpool *pool = nullptr;
        ASSERT_EQ(mf_threadpool_create(threads, &pool), MF_OK);
        const mf_kctx ctx = {pool, 0};
        std::vector<float> got = y;
        ASSERT_EQ(mf_cpu_slice(x.data(), s.rows, s.C, s.xs, s.xo, s.ys, s.yo, s.rep, acc, got.data(), &ctx),
                  MF_OK);
        EXPECT_EQ(got, want) << "rows " << s.rows << " rep " << s.rep << " acc " << acc << " threads "
                             << threads;
        mf_threadpool_free(pool);
      }
    }
}

TEST(SliceBwd, IsTheTransposeSummingTheRepRowsInOrder) {
  std::mt19937 g(4);
  for (const Shape &s : kShapes)
    for (int acc : {0, 1}) {
      const int64_t Q = (s.rows + s.rep - 1) / s.rep;
      const std::vector<float> dy = random(g, (size_t)(Q * s.rep * s.ys));
      std::vector<float> dx = random(g, (size_t)(Q * s.xs)), want = dx;
      for (int64_t q = 0; q < Q; q++)
        for (int64_t j = 0; j < s.C; j++) {
          float &d = want[(size_t)(q * s.xs + s.xo + j)];
          float sum = acc ? d : 0.0f;
          for (int64_t h = 0; h < s.rep; h++) sum += dy[(size_t)((q * s.rep + h) * s.ys + s.yo + j)];
          d = sum;
        }
      for (int threads : {0, 3}) {
        mf_threadpool *pool = nullptr;
        ASSERT_EQ(mf_threadpool_create(threads, &pool), MF_OK);
        const mf_kctx ctx = {pool, 0};
        std::vector<float> got = dx;
        ASSERT_EQ(mf_cpu_slice_bwd(dy.data(), Q, s.C, s.xs, s.xo, s.ys, s.yo, s.rep, acc, got.data(), &ctx),
                  MF_OK);
        EXPECT_EQ(got, want) << "Q " << Q << " rep " << s.rep << " acc " << acc << " threads " << threads;
        mf_threadpool_free(pool);
      }
    }
}

// The adjoint identity <slice(x), y> = <x, slice_bwd(y)>: the backward is the forward's transpose.
TEST(SliceBwd, IsTheAdjointOfSlice) {
  std::mt19937 g(5);
  const Shape s = {12, 4, 4, 0, 10, 6, 4};
  const int64_t Q = 3;
  const mf_kctx ctx = {nullptr, 0};
  const std::vector<float> x = random(g, (size_t)(Q * s.xs)), y = random(g, (size_t)(s.rows * s.ys));
  std::vector<float> sx((size_t)(s.rows * s.ys), 0.0f), ty((size_t)(Q * s.xs), 0.0f);
  ASSERT_EQ(mf_cpu_slice(x.data(), s.rows, s.C, s.xs, s.xo, s.ys, s.yo, s.rep, 0, sx.data(), &ctx), MF_OK);
  ASSERT_EQ(mf_cpu_slice_bwd(y.data(), Q, s.C, s.xs, s.xo, s.ys, s.yo, s.rep, 0, ty.data(), &ctx), MF_OK);
  double a = 0, b = 0;
  for (size_t k = 0; k < sx.size(); k++) a += (double)sx[k] * y[k];
  for (size_t k = 0; k < ty.size(); k++) b += (double)x[k] * ty[k];
  EXPECT_NEAR(a, b, 1e-5 * (std::abs(a) + 1));
}

TEST(Slice, BlocksOutsideTheirRowsAreRefused) {
  const mf_kctx ctx = {nullptr, 0};
  float x[16] = {0}, y[16] = {0};
  EXPECT_EQ(mf_cpu_slice(x, 2, 4, 4, 1, 8, 0, 1, 0, y, &ctx), MF_ERR_INVALID_ARG);  // x block past its row
  EXPECT_EQ(mf_cpu_slice(x, 2, 4, 8, 0, 4, 2, 1, 0, y, &ctx), MF_ERR_INVALID_ARG);  // y block past its row
  EXPECT_EQ(mf_cpu_slice(x, 2, 4, 8, 0, 8, 0, 0, 0, y, &ctx), MF_ERR_INVALID_ARG);  // rep 0
  EXPECT_EQ(mf_cpu_slice_bwd(y, 2, 4, 4, 1, 8, 0, 1, 0, x, &ctx), MF_ERR_INVALID_ARG);
}

}  // namespace
