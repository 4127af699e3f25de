// The optimizer kinds through the backends' run(): MF_K_GRAD_SUMSQ and
// MF_K_ADAMW on the cuda backend (device buffers from its arena) against the
// same calls on the cpu backend running them with the host optimizer
// (mf_cpu_backend_opts.optim = mf_optim_run_kernel; the AdamW body chosen from
// the CPU's flags, a two-thread pool), bit for bit: params, the gradient (left
// scaled in place when coef < 1, untouched otherwise), m and v (fp32 and bf16
// moments, one state operand: m then v) and the chunk sums, at sizes that are
// and are not multiples of the norm chunk, over three consecutive steps on one
// state with clipping factors below, at and just under 1 ((float)coef == 1:
// the host still multiplies, which quiets a signalling NaN).
//
// The data mixes in special values (tests/optim/special_values.h, plus
// signalling NaNs and NaNs with payloads). The one place where optim.h leaves
// the host's NaN unpinned (a gradient NaN meeting a moment NaN in one element)
// is kept out of the data, so every bit is compared. The chunk sums are
// compared on finite gradients and with +-Inf in them (NaN gradients give NaN
// sums whose bits the norm does not define: the step is skipped).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cuda/backend_cuda.h"
#include "src/core/core.h"
#include "src/optim/optim.h"
#include "tests/cuda/gpu_test_util.h"
#include "tests/cuda/twin_fixture.h"
#include "tests/optim/special_values.h"

namespace {

constexpr size_t kArenaBytes = size_t(16) << 20;
constexpr size_t kBig = 3 * 65536 + 4321;  // four norm chunks, the last one partial

float from_bits(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}
uint32_t bits_of(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}

std::vector<float> grad_specials() {
  std::vector<float> s = mf_ot::special_values();
  s.push_back(from_bits(0x7f800001u));  // signalling NaN
  s.push_back(from_bits(0xff812345u));  // negative signalling NaN with a payload
  s.push_back(from_bits(0x7fc01234u));  // quiet NaN with a payload
  return s;
}

// Random values in [lo, hi) with sp[k] written at phase, phase + stride, ...
std::vector<float> mixed(std::mt19937 &rng, size_t n, float lo, float hi, size_t stride, size_t phase,
                         const std::vector<float> &sp) {
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (size_t i = 0; i < n; i++) v[i] = d(rng);
  for (size_t i = phase, k = 0; i < n; i += stride, k++) v[i] = sp[k % sp.size()];
  return v;
}

// Element i of moment `which` (0 = m, 1 = v) of a state operand of n elements per moment.
float moment_at(const std::vector<uint8_t> &st, int which, size_t i, bool mbf, size_t n) {
  if (mbf) {
    uint16_t h;
    memcpy(&h, st.data() + ((size_t)which * n + i) * 2, 2);
    return mf_bf16_to_fp32(h);
  }
  float f;
  memcpy(&f, st.data() + ((size_t)which * n + i) * 4, 4);
  return f;
}

// Index of the first element (of `es` bytes) where a and b differ in a bit; -1 if none.
long first_diff(const void *a, const void *b, size_t n, size_t es) {
  const uint8_t *x = static_cast<const uint8_t *>(a), *y = static_cast<const uint8_t *>(b);
  for (size_t i = 0; i < n; i++)
    if (memcmp(x + i * es, y + i * es, es) != 0) return (long)i;
  return -1;
}

size_t count_diff(const void *a, const void *b, size_t n, size_t es) {
  const uint8_t *x = static_cast<const uint8_t *>(a), *y = static_cast<const uint8_t *>(b);
  size_t c = 0;
  for (size_t i = 0; i < n; i++) c += memcmp(x + i * es, y + i * es, es) != 0;
  return c;
}

std::string hex32(float f) {
  char buf[16];
  snprintf(buf, sizeof buf, "0x%08x", bits_of(f));
  return buf;
}

mf_kbuf kb(void *p, size_t bytes, int write) {
  mf_kbuf b;
  b.ptr = p;
  b.bytes = bytes;
  b.write = write;
  return b;
}

// The cuda backend and its arena (CudaTwin), plus a cpu backend that runs the
// optimizer kinds with src/optim on a two-thread pool.
class CudaOptimBackend : public CudaTwin<kArenaBytes> {
 protected:
  void SetUp() override {
    CudaTwin::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    ASSERT_EQ(mf_threadpool_create(2, &pool_), MF_OK) << mf_last_error();
    mf_cpu_backend_opts co = {};
    co.pool = pool_;
    co.optim = mf_optim_run_kernel;
    ASSERT_EQ(mf_backend_cpu_create(&co, &host_), MF_OK) << mf_last_error();
    ASSERT_EQ(host_->stream_create(host_, &host_s_), MF_OK) << mf_last_error();
  }
  void TearDown() override {
    if (host_) {
      if (host_s_) host_->stream_free(host_, host_s_);
      mf_backend_free(host_);
    }
    mf_threadpool_free(pool_);
    CudaTwin::TearDown();
  }

  // `bytes` of the device arena, 256-aligned; reset() gives it all back.
  void *dev(size_t bytes) {
    const size_t at = (used_ + 255) / 256 * 256;
    EXPECT_LE(at + bytes, kArena) << "the test's device arena is too small";
    if (at + bytes > kArena) return nullptr;
    used_ = at + bytes;
    return arena_ + at;
  }
  void reset() { used_ = 0; }
  void put(void *d, const void *h, size_t bytes) {
    ASSERT_EQ(gpu_->copy(gpu_, d, h, bytes, MF_COPY_H2D, gpu_s_), MF_OK) << mf_last_error();
    ASSERT_EQ(gpu_->stream_sync(gpu_, gpu_s_), MF_OK) << mf_last_error();
  }
  void get(void *h, const void *d, size_t bytes) {
    ASSERT_EQ(gpu_->copy(gpu_, h, d, bytes, MF_COPY_D2H, gpu_s_), MF_OK) << mf_last_error();
    ASSERT_EQ(gpu_->stream_sync(gpu_, gpu_s_), MF_OK) << mf_last_error();
  }
  // The call on the cpu backend (host) and on the cuda backend, then waits for the device.
  void run_both(const mf_kernel_call &on_host, const mf_kernel_call &on_dev) {
    ASSERT_EQ(host_->run(host_, &on_host, host_s_), MF_OK) << mf_last_error();
    ASSERT_EQ(gpu_->run(gpu_, &on_dev, gpu_s_), MF_OK) << mf_last_error();
    ASSERT_EQ(gpu_->stream_sync(gpu_, gpu_s_), MF_OK) << mf_last_error();
  }

  void adamw_case(size_t n, bool mbf, const mf_adamw_hparams &h, const double coefs[3], uint32_t seed);

  mf_threadpool *pool_ = nullptr;
  mf_backend *host_ = nullptr;
  mf_stream *host_s_ = nullptr;
  size_t used_ = 0;
};

// Three AdamW steps (t = 1, 2, 3) on one parameter with clipping factors coefs[t-1].
void CudaOptimBackend::adamw_case(size_t n, bool mbf, const mf_adamw_hparams &h, const double coefs[3],
                                  uint32_t seed) {
  char what[160];
  snprintf(what, sizeof what, "n %zu, %s moments, beta1 %g, coefs %.17g %.17g %.17g", n,
           mbf ? "bf16" : "fp32", h.beta1, coefs[0], coefs[1], coefs[2]);
  SCOPED_TRACE(what);
  reset();
  std::mt19937 rng(seed);
  const std::vector<float> sp = mf_ot::special_values(), gsp = grad_specials();
  const size_t ms = mbf ? 2 : 4, state_bytes = 2 * n * ms;

  // Host (cpu backend) operands and their device twins, starting equal.
  std::vector<float> p = mixed(rng, n, -2, 2, 7, 0, sp);
  std::vector<uint8_t> st(state_bytes);
  {
    const std::vector<float> m = mixed(rng, n, -0.1f, 0.1f, 13, 5, sp),
                             v = mixed(rng, n, 0, 0.01f, 17, 2, sp);
    for (size_t i = 0; i < n; i++) {
      if (mbf) {
        const uint16_t a = mf_fp32_to_bf16(m[i]), b = mf_fp32_to_bf16(v[i]);
        memcpy(st.data() + i * 2, &a, 2);
        memcpy(st.data() + (n + i) * 2, &b, 2);
      } else {
        memcpy(st.data() + i * 4, &m[i], 4);
        memcpy(st.data() + (n + i) * 4, &v[i], 4);
      }
    }
  }
  float *dp = static_cast<float *>(dev(n * 4)), *dg = static_cast<float *>(dev(n * 4));
  void *dst = dev(state_bytes);
  ASSERT_TRUE(dp && dg && dst);
  put(dp, p.data(), n * 4);
  put(dst, st.data(), state_bytes);

  std::vector<float> gp(n), gg(n);
  std::vector<uint8_t> gst(state_bytes);
  for (int64_t t = 1; t <= 3; t++) {
    SCOPED_TRACE("step " + std::to_string(t));
    const double coef = coefs[t - 1];
    std::vector<float> g = mixed(rng, n, -1, 1, 11, (size_t)t, gsp);
    // Keep out the unpinned case: a gradient NaN where m or v is NaN now.
    for (size_t i = 0; i < n; i++)
      if (std::isnan(g[i]) &&
          (std::isnan(moment_at(st, 0, i, mbf, n)) || std::isnan(moment_at(st, 1, i, mbf, n))))
        g[i] = 0.5f;
    const std::vector<float> g0 = g, p0 = p;
    put(dg, g.data(), n * 4);

    mf_kernel_call hc = {};
    hc.kind = MF_K_ADAMW;
    hc.i[0] = (int64_t)n;
    hc.i[1] = t;
    hc.i[2] = mbf;
    hc.f[0] = h.lr;
    hc.f[1] = h.beta1;
    hc.f[2] = h.beta2;
    hc.f[3] = h.eps;
    hc.f[4] = h.weight_decay;
    hc.f[5] = coef;
    hc.label = "optim_backend_test adamw";
    mf_kernel_call dc = hc;
    hc.b[0] = kb(p.data(), n * 4, 1);
    hc.b[1] = kb(g.data(), n * 4, 1);
    hc.b[2] = kb(st.data(), state_bytes, 1);
    dc.b[0] = kb(dp, n * 4, 1);
    dc.b[1] = kb(dg, n * 4, 1);
    dc.b[2] = kb(dst, state_bytes, 1);
    run_both(hc, dc);
    if (HasFatalFailure()) return;
    get(gp.data(), dp, n * 4);
    get(gg.data(), dg, n * 4);
    get(gst.data(), dst, state_bytes);

    long at = first_diff(p.data(), gp.data(), n, 4);
    EXPECT_EQ(at, -1) << count_diff(p.data(), gp.data(), n, 4) << " params differ, first at " << at
                      << ": cpu " << (at >= 0 ? hex32(p[at]) : "") << " cuda "
                      << (at >= 0 ? hex32(gp[at]) : "");
    at = first_diff(g.data(), gg.data(), n, 4);
    EXPECT_EQ(at, -1) << count_diff(g.data(), gg.data(), n, 4) << " gradient elements differ, first at " << at
                      << ": cpu " << (at >= 0 ? hex32(g[at]) : "") << " cuda "
                      << (at >= 0 ? hex32(gg[at]) : "") << " (before " << (at >= 0 ? hex32(g0[at]) : "")
                      << ")";
    at = first_diff(st.data(), gst.data(), 2 * n, ms);
    EXPECT_EQ(at, -1) << count_diff(st.data(), gst.data(), 2 * n, ms) << " moment elements differ, first at "
                      << (at >= 0 && (size_t)at >= n ? "v[" : "m[") << (at >= 0 ? at % (long)n : at) << "]";

    // The call did what it says, independently of either side: the gradient is
    // g * (float)coef when coef < 1 (finite elements), else untouched; the
    // update moved some parameter.
    size_t scale_bad = 0, moved = 0;
    for (size_t i = 0; i < n; i++) {
      if (coef < 1.0) {
        if (std::isfinite(g0[i]) && bits_of(gg[i]) != bits_of(g0[i] * (float)coef)) scale_bad++;
      } else if (bits_of(gg[i]) != bits_of(g0[i])) {
        scale_bad++;
      }
      moved += bits_of(gp[i]) != bits_of(p0[i]);
    }
    EXPECT_EQ(scale_bad, 0u) << "the device gradient is not the clipped one";
    if (n >= 100) {
      EXPECT_GT(moved, 0u) << "no parameter moved";
    }
    if (HasFailure()) return;
  }
}

TEST_F(CudaOptimBackend, AdamwBitIdenticalToCpu) {
  const mf_adamw_hparams small = {1e-3, 0.9, 0.999, 1e-8, 0.1};  // |1 - beta1| < 0.5: lerp from m
  const mf_adamw_hparams large = {3e-2, 0.3, 0.95, 1e-6, 0.0};   // lerp from g, no decay
  // Per step: no clipping; clipping every step; (float)coef == 1 but coef < 1,
  // then none, then some; a denormal fp32 factor, then 0.5, then none.
  const double coefs[4][3] = {
      {1.0, 1.0, 1.0}, {0.37, 0.37, 0.37}, {1.0 - 1e-12, 1.0, 0.37}, {1e-41, 0.5, 1.0}};
  uint32_t seed = 1000;
  for (size_t n : {size_t(1), size_t(1000), kBig})
    for (int mbf = 0; mbf < 2; mbf++)
      for (const mf_adamw_hparams *h : {&small, &large})
        for (const auto &c : coefs) {
          adamw_case(n, mbf, *h, c, seed++);
          if (HasFailure()) return;
        }
}

TEST_F(CudaOptimBackend, GradSumsqBitIdenticalToCpu) {
  std::mt19937 rng(11);
  const int64_t first = 3;  // the parameter's chunks start at slot 3 of the shared sums
  const double sentinel = -7.25;
  for (size_t n : {size_t(1), size_t(9), size_t(65536), size_t(65537), kBig})
    for (int with_inf = 0; with_inf < 2; with_inf++) {
      SCOPED_TRACE("n " + std::to_string(n) + (with_inf ? " with Inf" : ""));
      reset();
      std::uniform_real_distribution<float> d(-3, 3);
      std::vector<float> g(n);
      for (auto &x : g) x = d(rng);
      for (size_t i = 5; i < n; i += 97) g[i] = (i % 2) ? 1e-41f : -3e30f;  // denormals, large squares
      if (with_inf) {
        g[n / 2] = std::numeric_limits<float>::infinity();
        g[n - 1] = -std::numeric_limits<float>::infinity();
      }
      const size_t chunks = mf_optim_norm_chunks(n), total = (size_t)first + chunks + 2;
      std::vector<double> sums(total, sentinel), got(total);
      float *dg = static_cast<float *>(dev(n * 4));
      double *ds = static_cast<double *>(dev(total * 8));
      ASSERT_TRUE(dg && ds);
      put(dg, g.data(), n * 4);
      put(ds, sums.data(), total * 8);

      mf_kernel_call hc = {};
      hc.kind = MF_K_GRAD_SUMSQ;
      hc.i[0] = (int64_t)n;
      hc.i[1] = first;
      hc.label = "optim_backend_test grad_sumsq";
      mf_kernel_call dc = hc;
      hc.b[0] = kb(g.data(), n * 4, 0);
      hc.b[1] = kb(sums.data(), total * 8, 1);
      dc.b[0] = kb(dg, n * 4, 0);
      dc.b[1] = kb(ds, total * 8, 1);
      run_both(hc, dc);
      if (HasFatalFailure()) return;
      get(got.data(), ds, total * 8);

      for (size_t k = 0; k < total; k++)
        EXPECT_EQ(memcmp(&sums[k], &got[k], 8), 0)
            << "slot " << k << ": cpu " << sums[k] << " cuda " << got[k];
      // Only slots [first, first + chunks) are written.
      for (size_t k = 0; k < total; k++)
        if (k < (size_t)first || k >= (size_t)first + chunks) {
          EXPECT_EQ(got[k], sentinel) << "slot " << k;
        }
      // Added in chunk order they give the host norm's bits (finite) or +Inf.
      double sum = 0;
      for (size_t k = 0; k < chunks; k++) sum += got[(size_t)first + k];
      mf_optim_buf buf = {g.data(), n};
      double norm = 0;
      ASSERT_EQ(mf_optim_grad_norm(&buf, 1, nullptr, &norm), MF_OK) << mf_last_error();
      if (with_inf)
        EXPECT_EQ(sum, std::numeric_limits<double>::infinity());
      else
        EXPECT_EQ(std::sqrt(sum), norm);
      if (HasFailure()) return;
    }
}

// Operands that do not fit, a step 0 or a negative count: MF_ERR_INVALID_ARG,
// and nothing is launched (the parameter keeps its bits).
TEST_F(CudaOptimBackend, RefusesOperandsThatDoNotFit) {
  const size_t n = 1000;
  float *dp = static_cast<float *>(dev(n * 4)), *dg = static_cast<float *>(dev(n * 4));
  void *dst = dev(2 * n * 4);
  double *ds = static_cast<double *>(dev(8));
  float *dg2 = static_cast<float *>(dev(65537 * 4));
  ASSERT_TRUE(dp && dg && dst && ds && dg2);
  std::vector<float> ones(n, 1.0f), p_after(n);
  put(dp, ones.data(), n * 4);

  mf_kernel_call c = {};
  c.kind = MF_K_ADAMW;
  c.i[0] = (int64_t)n;
  c.i[1] = 1;
  c.i[2] = 0;
  c.f[0] = 1e-3;
  c.f[1] = 0.9;
  c.f[2] = 0.999;
  c.f[3] = 1e-8;
  c.f[5] = 0.5;
  c.b[0] = kb(dp, n * 4, 1);
  c.b[1] = kb(dg, n * 4, 1);
  c.b[2] = kb(dst, 2 * n * 2, 1);  // fp32 moments need 2 * n * 4 bytes
  EXPECT_EQ(gpu_->run(gpu_, &c, gpu_s_), MF_ERR_INVALID_ARG);
  c.b[2].bytes = 2 * n * 4;
  c.i[1] = 0;  // steps count from 1
  EXPECT_EQ(gpu_->run(gpu_, &c, gpu_s_), MF_ERR_INVALID_ARG);
  c.i[1] = 1;
  c.i[0] = -1;
  EXPECT_EQ(gpu_->run(gpu_, &c, gpu_s_), MF_ERR_INVALID_ARG);
  ASSERT_EQ(gpu_->stream_sync(gpu_, gpu_s_), MF_OK) << mf_last_error();
  get(p_after.data(), dp, n * 4);
  EXPECT_EQ(first_diff(ones.data(), p_after.data(), n, 4), -1) << "a refused call wrote the parameter";

  mf_kernel_call s = {};
  s.kind = MF_K_GRAD_SUMSQ;
  s.i[0] = 65537;  // two chunks into a one-slot sums buffer
  s.i[1] = 0;
  s.b[0] = kb(dg2, 65537 * 4, 0);
  s.b[1] = kb(ds, 8, 1);
  EXPECT_EQ(gpu_->run(gpu_, &s, gpu_s_), MF_ERR_INVALID_ARG);
  s.i[0] = 1;
  s.i[1] = 1;  // slot 1 of a one-slot buffer
  EXPECT_EQ(gpu_->run(gpu_, &s, gpu_s_), MF_ERR_INVALID_ARG);
}

}  // namespace
