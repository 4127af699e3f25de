// Device AdamW (mf_cuda_adamw_update) against src/optim's scalar body, bit for
// bit, and the device norm chunk sums (mf_cuda_grad_chunk_sumsq) against
// mf_optim_grad_chunk_sumsq, bit for bit: random data with the special values
// of tests/optim/special_values.h (NaN of both signs, +-Inf, denormals, +-0,
// FLT_MAX, ...) mixed in, every gradient / moment dtype combination, both lerp
// forms, with and without the bf16 working copy, odd sizes.
//
// One exception, from optim.h: where the gradient and a moment are both NaN the
// host body's NaN comes from the instruction's operand order, which the C
// source does not pin; there the device must give a NaN, any NaN.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/cuda/backend_cuda.h"
#include "kernels/cuda/cuda.h"
#include "src/core/core.h"
#include "src/optim/optim.h"
#include "tests/cuda/gpu_test_util.h"
#include "tests/optim/special_values.h"

namespace {

std::vector<float> mixed(std::mt19937 &rng, size_t n, float lo, float hi, size_t stride, size_t phase) {
  std::uniform_real_distribution<float> d(lo, hi);
  const std::vector<float> sp = mf_ot::special_values();
  std::vector<float> v(n);
  for (size_t i = 0; i < n; i++) v[i] = d(rng);
  for (size_t i = phase, k = 0; i < n; i += stride, k++) v[i] = sp[k % sp.size()];
  return v;
}

std::vector<uint16_t> to_bf16(const std::vector<float> &v) {
  std::vector<uint16_t> o(v.size());
  for (size_t i = 0; i < v.size(); i++) o[i] = mf_fp32_to_bf16(v[i]);
  return o;
}

// Device buffer of `bytes`, freed at scope end.
struct Dev {
  void *p = nullptr;
  explicit Dev(size_t bytes) { EXPECT_EQ(mf_cuda_malloc(bytes ? bytes : 4, &p), MF_OK) << mf_last_error(); }
  ~Dev() { mf_cuda_free(p); }
  void put(const void *src, size_t bytes) {
    EXPECT_EQ(mf_cuda_memcpy_h2d(p, src, bytes), MF_OK) << mf_last_error();
  }
  void get(void *dst, size_t bytes) {
    EXPECT_EQ(mf_cuda_memcpy_d2h(dst, p, bytes), MF_OK) << mf_last_error();
  }
};

template <typename T>
size_t bit_mismatches(const std::vector<T> &want, const std::vector<T> &got, const std::vector<char> &loose,
                      size_t *first) {
  size_t bad = 0;
  for (size_t i = 0; i < want.size(); i++) {
    if (memcmp(&want[i], &got[i], sizeof(T)) == 0) continue;
    if (loose[i]) {  // both sides must be NaN
      float a, b;
      if (sizeof(T) == 4) {
        memcpy(&a, &want[i], 4);
        memcpy(&b, &got[i], 4);
      } else {
        uint16_t x, y;
        memcpy(&x, &want[i], 2);
        memcpy(&y, &got[i], 2);
        a = mf_bf16_to_fp32(x), b = mf_bf16_to_fp32(y);
      }
      if (std::isnan(a) && std::isnan(b)) continue;
    }
    if (bad++ == 0) *first = i;
  }
  return bad;
}

class CudaOptim : public ::testing::Test {
 protected:
  void SetUp() override {
    MF_SKIP_WITHOUT_GPU();
    ASSERT_EQ(mf_adamw_select_impl("scalar"), MF_OK) << mf_last_error();
  }
  void TearDown() override { mf_adamw_select_impl("auto"); }
};

void adamw_case(size_t n, const mf_adamw_hparams &h, int64_t step, bool gbf, bool mbf, bool out,
                uint32_t seed) {
  SCOPED_TRACE("n " + std::to_string(n) + " step " + std::to_string(step) + " beta1 " +
               std::to_string(h.beta1) + (gbf ? " g bf16" : " g f32") + (mbf ? " m bf16" : " m f32") +
               (out ? " bf16 out" : ""));
  std::mt19937 rng(seed);
  std::vector<float> p = mixed(rng, n, -2, 2, 7, 0), g = mixed(rng, n, -1, 1, 11, 3),
                     m = mixed(rng, n, -0.1f, 0.1f, 13, 5), v = mixed(rng, n, 0, 0.01f, 17, 2);
  // The one place where the host's NaN is not pinned: gradient and a moment both NaN.
  std::vector<char> loose(n, 0);
  for (size_t i = 0; i < n; i++) loose[i] = std::isnan(g[i]) && (std::isnan(m[i]) || std::isnan(v[i]));
  std::vector<uint16_t> gh = to_bf16(g), mh = to_bf16(m), vh = to_bf16(v);
  if (gbf)
    for (size_t i = 0; i < n; i++)
      loose[i] = std::isnan(mf_bf16_to_fp32(gh[i])) && (std::isnan(m[i]) || std::isnan(v[i]));

  // Host reference.
  std::vector<float> hp = p, hm = m, hv = v;
  std::vector<uint16_t> hmh = mh, hvh = vh, hout(n, 0x1234);
  mf_adamw_bufs b = {hp.data(),
                     gbf ? (const void *)gh.data() : (const void *)g.data(),
                     mbf ? (void *)hmh.data() : (void *)hm.data(),
                     mbf ? (void *)hvh.data() : (void *)hv.data(),
                     out ? hout.data() : nullptr,
                     n,
                     gbf ? MF_DTYPE_BF16 : MF_DTYPE_F32,
                     mbf ? MF_DTYPE_BF16 : MF_DTYPE_F32};
  ASSERT_EQ(mf_adamw_update_bufs(&h, step, &b, nullptr), MF_OK) << mf_last_error();

  // Device.
  const size_t gs = gbf ? 2 : 4, ms = mbf ? 2 : 4;
  Dev dp(n * 4), dg(n * gs), dm(n * ms), dv(n * ms), dout(n * 2);
  dp.put(p.data(), n * 4);
  dg.put(gbf ? (const void *)gh.data() : (const void *)g.data(), n * gs);
  dm.put(mbf ? (const void *)mh.data() : (const void *)m.data(), n * ms);
  dv.put(mbf ? (const void *)vh.data() : (const void *)v.data(), n * ms);
  std::vector<uint16_t> init_out(n, 0x1234);
  dout.put(init_out.data(), n * 2);
  const mf_cuda_adamw_step hs = {h.lr, h.beta1, h.beta2, h.eps, h.weight_decay, step};
  ASSERT_EQ(mf_cuda_adamw_update(&hs, (float *)dp.p, dg.p, gbf, dm.p, dv.p, mbf,
                                 out ? (uint16_t *)dout.p : nullptr, n, nullptr),
            MF_OK)
      << mf_last_error();
  ASSERT_EQ(mf_cuda_stream_sync(nullptr), MF_OK) << mf_last_error();
  std::vector<float> gp(n), gm(n), gv(n);
  std::vector<uint16_t> gmh(n), gvh(n), gout(n);
  dp.get(gp.data(), n * 4);
  if (mbf) {
    dm.get(gmh.data(), n * 2);
    dv.get(gvh.data(), n * 2);
  } else {
    dm.get(gm.data(), n * 4);
    dv.get(gv.data(), n * 4);
  }
  dout.get(gout.data(), n * 2);

  size_t first = 0, bad;
  bad = bit_mismatches(hp, gp, loose, &first);
  EXPECT_EQ(bad, 0u) << "param differs, first at " << first << ": host " << hp[first] << " device "
                     << gp[first];
  if (mbf) {
    bad = bit_mismatches(hmh, gmh, loose, &first);
    EXPECT_EQ(bad, 0u) << "m (bf16) differs, first at " << first;
    bad = bit_mismatches(hvh, gvh, loose, &first);
    EXPECT_EQ(bad, 0u) << "v (bf16) differs, first at " << first;
  } else {
    bad = bit_mismatches(hm, gm, loose, &first);
    EXPECT_EQ(bad, 0u) << "m differs, first at " << first << ": host " << hm[first] << " device "
                       << gm[first];
    bad = bit_mismatches(hv, gv, loose, &first);
    EXPECT_EQ(bad, 0u) << "v differs, first at " << first << ": host " << hv[first] << " device "
                       << gv[first];
  }
  bad = bit_mismatches(hout, gout, loose, &first);
  EXPECT_EQ(bad, 0u) << "bf16 copy differs, first at " << first;
}

TEST_F(CudaOptim, AdamwBitIdentical) {
  mf_adamw_hparams small = {1e-3, 0.9, 0.999, 1e-8, 0.1};  // |1 - beta1| < 0.5: lerp from m
  mf_adamw_hparams large = {3e-2, 0.3, 0.95, 1e-6, 0.0};   // lerp from g, no decay
  uint32_t seed = 100;
  for (size_t n : {size_t(1), size_t(1000), size_t(100003)})
    for (const mf_adamw_hparams *h : {&small, &large})
      for (int64_t step : {int64_t(1), int64_t(7), int64_t(5000)})
        for (int kind = 0; kind < 4; kind++)
          for (int out = 0; out < 2; out++) adamw_case(n, *h, step, kind & 1, kind & 2, out, seed++);
}

// Argument checks come before any CUDA call, so this runs without a GPU too
// (built without CUDA every entry point reports MF_ERR_NO_DEVICE instead).
TEST(CudaOptimArgs, AdamwRejectsBadArguments) {
  const mf_status want = mf_cuda_compiled() ? MF_ERR_INVALID_ARG : MF_ERR_NO_DEVICE;
  mf_cuda_adamw_step h = {1e-3, 0.9, 0.999, 1e-8, 0.0, 0};
  float x = 0;
  EXPECT_EQ(mf_cuda_adamw_update(&h, &x, &x, 0, &x, &x, 0, nullptr, 1, nullptr), want);
  h.step = 1;
  h.beta1 = 1.0;
  EXPECT_EQ(mf_cuda_adamw_update(&h, &x, &x, 0, &x, &x, 0, nullptr, 1, nullptr), want);
  h.beta1 = 0.9;
  h.lr = NAN;
  EXPECT_EQ(mf_cuda_adamw_update(&h, &x, &x, 0, &x, &x, 0, nullptr, 1, nullptr), want);
  h.lr = 1e-3;
  EXPECT_EQ(mf_cuda_adamw_update(&h, nullptr, &x, 0, &x, &x, 0, nullptr, 1, nullptr), want);
  EXPECT_EQ(mf_cuda_adamw_update(nullptr, &x, &x, 0, &x, &x, 0, nullptr, 1, nullptr), want);
  EXPECT_EQ(mf_cuda_grad_chunk_sumsq(nullptr, 5, nullptr, nullptr), want);
}

// The clipped update (the backend's MF_K_ADAMW) checks as the plain one does,
// with and without scaling.
TEST(CudaOptimArgs, AdamwScaledRejectsBadArguments) {
  const mf_status want = mf_cuda_compiled() ? MF_ERR_INVALID_ARG : MF_ERR_NO_DEVICE;
  mf_cuda_adamw_step h = {1e-3, 0.9, 0.999, 1e-8, 0.0, 0};
  float x = 0;
  for (double coef : {0.5, 1.0}) {
    SCOPED_TRACE("coef " + std::to_string(coef));
    h.step = 0;
    EXPECT_EQ(mf_cuda_adamw_update_scaled(&h, &x, &x, coef, &x, &x, 0, nullptr, 1, nullptr), want);
    h.step = 1;
    h.eps = -1;
    EXPECT_EQ(mf_cuda_adamw_update_scaled(&h, &x, &x, coef, &x, &x, 0, nullptr, 1, nullptr), want);
    h.eps = 1e-8;
    EXPECT_EQ(mf_cuda_adamw_update_scaled(&h, &x, nullptr, coef, &x, &x, 1, nullptr, 1, nullptr), want);
    EXPECT_EQ(mf_cuda_adamw_update_scaled(nullptr, &x, &x, coef, &x, &x, 0, nullptr, 1, nullptr), want);
  }
}

TEST_F(CudaOptim, NormChunkSumsBitIdentical) {
  static_assert(MF_CUDA_NORM_CHUNK == MF_OPTIM_NORM_CHUNK, "the device norm chunk must be src/optim's");
  std::mt19937 rng(7);
  for (size_t n : {size_t(1), size_t(9), size_t(65536), size_t(65537), size_t(3 * 65536 + 12345)}) {
    SCOPED_TRACE("n " + std::to_string(n));
    std::uniform_real_distribution<float> d(-3, 3);
    std::vector<float> g(n);
    for (auto &x : g) x = d(rng);
    // denormals and large values: exact squares in double either way
    for (size_t i = 5; i < n; i += 97) g[i] = (i % 2) ? 1e-41f : 3e30f;
    const size_t chunks = mf_optim_norm_chunks(n);
    std::vector<double> want(chunks), got(chunks);
    ASSERT_EQ(mf_optim_grad_chunk_sumsq(g.data(), n, nullptr, want.data()), MF_OK) << mf_last_error();
    Dev dg(n * 4), ds(chunks * 8);
    dg.put(g.data(), n * 4);
    ASSERT_EQ(mf_cuda_grad_chunk_sumsq((const float *)dg.p, n, (double *)ds.p, nullptr), MF_OK)
        << mf_last_error();
    ASSERT_EQ(mf_cuda_stream_sync(nullptr), MF_OK) << mf_last_error();
    ds.get(got.data(), chunks * 8);
    for (size_t k = 0; k < chunks; k++)
      EXPECT_EQ(memcmp(&want[k], &got[k], 8), 0)
          << "chunk " << k << ": host " << want[k] << " device " << got[k];
    // and the host combine of the device sums gives the norm's bits
    double sum = 0;
    for (double s : got) sum += s;
    mf_optim_buf buf = {g.data(), n};
    double norm = 0;
    ASSERT_EQ(mf_optim_grad_norm(&buf, 1, nullptr, &norm), MF_OK);
    EXPECT_EQ(std::sqrt(sum), norm);
  }
}

}  // namespace
