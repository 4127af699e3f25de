// Causal GQA attention on the cuda backend against the cpu backend (the
// reference, fp32 storage: round_bf16 off), on fresh random data at several
// (B, S, Hq, Hkv, D): S = 1, odd S, S not a multiple of the tiles, GQA ratios
// 1, 2 and 4, D = 64 and 128 (the models), plus D = 40, 96 and 256 (padding of
// the head dim, the largest tile), and value head dims Dv unlike D (DeepSeek-V3's
// D 192 / Dv 128, Dv above D, odd small dims), and gpt-oss's sliding windows
// and learned sink logits (i[6], the sinks operand; dsinks added into, compared
// as the gradients). Outputs start as NaN, so an element the cuda
// kernels never write fails the comparison; two cuda runs of one call must give
// the same bits (no atomics, fixed reduction orders).
//
// Comparison: NMSE = sum (gpu - cpu)^2 / sum cpu^2 per output operand.
// Tolerances (why):
//   o, lse: 1e-10 — the cpu runs its online softmax over 64-key tiles with a
//     Cephes exp and sequential dots, the gpu over 32-key tiles with the device
//     expf and fma-contracted dots: a few ulps per value (NMSE ~1e-14 expected).
//   dq, dk, dv: 1e-8 — as above, plus the cancellation in ds = p * (dp - Di) and
//     sums over up to S x (Hq/Hkv) terms in a different order.
// The backward's inputs o and lse come from the cpu forward, so the backward is
// compared on its own.
// The reference's mean square is floored at (1e-2)^2: where the exact gradient
// is 0 (S = 1: p = 1, o = v, so dp - Di = do.v - do.o cancels), both sides are
// rounding noise (the cpu's happens to be exactly 0) and the check becomes an
// RMS error of at most 1e-6; elsewhere the gradients' RMS is well above the floor.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cuda/backend_cuda.h"
#include "src/core/core.h"
#include "tests/cuda/gpu_test_util.h"
#include "tests/cuda/twin_fixture.h"

namespace {

// Dv: the value head dim (i[5]; 0: D); W the sliding window (i[6]; 0: none);
// sinks: whether the call has sink logits (and the backward dsinks).
struct Shape {
  int64_t B, S, Hq, Hkv, D, Dv = 0, W = 0;
  bool sinks = false;
  int64_t dv() const { return Dv ? Dv : D; }
};

std::string name_of(const char *op, const Shape &s) {
  return std::string(op) + " B=" + std::to_string(s.B) + " S=" + std::to_string(s.S) +
         " Hq=" + std::to_string(s.Hq) + " Hkv=" + std::to_string(s.Hkv) + " D=" + std::to_string(s.D) +
         (s.Dv ? " Dv=" + std::to_string(s.Dv) : std::string()) +
         (s.W ? " window=" + std::to_string(s.W) : std::string()) + (s.sinks ? " sinks" : "");
}

std::vector<float> uniform(std::mt19937 &rng, size_t n, float lo, float hi) {
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto &x : v) x = d(rng);
  return v;
}

// NMSE with the reference's mean square floored at kRmsFloor^2 (see the top).
constexpr double kRmsFloor = 1e-2;
double nmse(const std::vector<float> &want, const std::vector<float> &got) {
  double num = 0, den = 0;
  for (size_t k = 0; k < want.size(); k++) {
    const double a = want[k], b = got[k];
    num += (b - a) * (b - a);
    den += a * a;
  }
  den = std::max(den, (double)want.size() * kRmsFloor * kRmsFloor);
  return std::isfinite(num) ? num / den : INFINITY;
}

constexpr double kTolFwd = 1e-10;
constexpr double kTolBwd = 1e-8;

class CudaAttention : public CudaTwin<(size_t)512 << 20> {
 protected:
  // A tiny kernel scratch: attention must need none (no S x S matrix anywhere).
  const mf_cuda_backend_opts *cuda_opts() override {
    static const mf_cuda_backend_opts go = {0, 4096};
    return &go;
  }

  static mf_kernel_call call(mf_kernel kind, const Shape &s, float scale, const char *label) {
    mf_kernel_call k = {};
    k.kind = kind;
    k.i[0] = s.B, k.i[1] = s.S, k.i[2] = s.Hq, k.i[3] = s.Hkv, k.i[4] = s.D, k.i[5] = s.Dv, k.i[6] = s.W;
    k.f[0] = scale;
    k.label = label;
    return k;
  }

  // Runs `kind` on the cpu in place on bufs (the outputs are in bufs too).
  mf_status run_cpu(mf_kernel kind, const Shape &s, float scale, std::vector<std::vector<float>> &bufs) {
    mf_kernel_call k = call(kind, s, scale, "cpu");
    for (size_t j = 0; j < bufs.size(); j++) k.b[j] = {bufs[j].data(), bufs[j].size() * sizeof(float), 0};
    return cpu_->run(cpu_, &k, cpu_s_);
  }

  // Copies bufs to the arena, runs `kind` on the gpu, returns every buffer after.
  mf_status run_gpu(mf_kernel kind, const Shape &s, float scale, const std::vector<std::vector<float>> &bufs,
                    std::vector<std::vector<float>> *out) {
    mf_kernel_call k = call(kind, s, scale, "gpu");
    size_t off = 0;
    std::vector<uint8_t *> dev(bufs.size());
    for (size_t j = 0; j < bufs.size(); j++) {
      const size_t bytes = bufs[j].size() * sizeof(float);
      dev[j] = arena_ + off;
      off += (bytes + 255) / 256 * 256 + 256;
      if (off > kArena) return MF_ERR(MF_ERR_OUT_OF_MEMORY, "test arena too small");
      MF_CHECK(gpu_->copy(gpu_, dev[j], bufs[j].data(), bytes, MF_COPY_H2D, gpu_s_));
      k.b[j] = {dev[j], bytes, 0};
    }
    MF_CHECK(gpu_->run(gpu_, &k, gpu_s_));
    out->assign(bufs.size(), {});
    for (size_t j = 0; j < bufs.size(); j++) {
      (*out)[j].resize(bufs[j].size());
      MF_CHECK(
          gpu_->copy(gpu_, (*out)[j].data(), dev[j], bufs[j].size() * sizeof(float), MF_COPY_D2H, gpu_s_));
    }
    return gpu_->stream_sync(gpu_, gpu_s_);
  }

  // Forward and backward of one shape; q scaled by q_amp (large: peaked softmax).
  void check(const Shape &s, uint32_t seed, float q_amp = 1.0f) {
    SCOPED_TRACE(name_of("attention", s));
    std::mt19937 rng(seed);
    const size_t nq = (size_t)(s.B * s.S * s.Hq * s.D), nk = (size_t)(s.B * s.S * s.Hkv * s.D);
    const size_t no = (size_t)(s.B * s.S * s.Hq * s.dv()), nv = (size_t)(s.B * s.S * s.Hkv * s.dv());
    const size_t nl = (size_t)(s.B * s.Hq * s.S);
    const float scale = 1.0f / std::sqrt((float)s.D);
    const float nan = std::nanf("");
    auto q = uniform(rng, nq, -q_amp, q_amp), k = uniform(rng, nk, -1, 1), v = uniform(rng, nv, -1, 1);
    auto dout = uniform(rng, no, -1, 1);
    std::vector<float> sinks;  // one large (most of a row's mass), the others of either sign
    if (s.sinks) {
      sinks = uniform(rng, (size_t)s.Hq, -3, 3);
      sinks[0] = 5.0f;
    }

    // forward: b = {q, k, v, o, lse} (, sinks)
    std::vector<std::vector<float>> fwd = {q, k, v, std::vector<float>(no, nan), std::vector<float>(nl, nan)};
    if (s.sinks) fwd.push_back(sinks);
    std::vector<std::vector<float>> want_f = fwd, got_f, again_f;
    ASSERT_EQ(run_cpu(MF_K_ATTN_FWD, s, scale, want_f), MF_OK) << mf_last_error();
    ASSERT_EQ(run_gpu(MF_K_ATTN_FWD, s, scale, fwd, &got_f), MF_OK) << mf_last_error();
    ASSERT_EQ(run_gpu(MF_K_ATTN_FWD, s, scale, fwd, &again_f), MF_OK) << mf_last_error();
    const char *fnames[] = {"o", "lse"};
    for (int j = 3; j < 5; j++) {
      const double e = nmse(want_f[j], got_f[j]);
      EXPECT_LE(e, kTolFwd) << fnames[j - 3] << ": NMSE " << e;
      EXPECT_EQ(memcmp(got_f[j].data(), again_f[j].data(), got_f[j].size() * sizeof(float)), 0)
          << fnames[j - 3] << ": two cuda runs differ in bits";
    }
    // The inputs are left as they were.
    for (int j = 0; j < (int)fwd.size(); j++) {
      if (j < 3 || j > 4) {
        EXPECT_EQ(memcmp(got_f[j].data(), fwd[j].data(), fwd[j].size() * sizeof(float)), 0) << "input " << j;
      }
    }

    // backward: b = {q, k, v, o, do, lse, dq, dk, dv}, o and lse from the cpu forward
    std::vector<std::vector<float>> bwd = {q,
                                           k,
                                           v,
                                           want_f[3],
                                           dout,
                                           want_f[4],
                                           std::vector<float>(nq, nan),
                                           std::vector<float>(nk, nan),
                                           std::vector<float>(nv, nan)};
    if (s.sinks) {  // (, sinks, dsinks): dsinks is added into
      bwd.push_back(sinks);
      bwd.push_back(uniform(rng, (size_t)s.Hq, -1, 1));
    }
    std::vector<std::vector<float>> want_b = bwd, got_b, again_b;
    ASSERT_EQ(run_cpu(MF_K_ATTN_BWD, s, scale, want_b), MF_OK) << mf_last_error();
    ASSERT_EQ(run_gpu(MF_K_ATTN_BWD, s, scale, bwd, &got_b), MF_OK) << mf_last_error();
    ASSERT_EQ(run_gpu(MF_K_ATTN_BWD, s, scale, bwd, &again_b), MF_OK) << mf_last_error();
    const char *bnames[] = {"dq", "dk", "dv", "sinks", "dsinks"};
    for (int j = 6; j < (int)bwd.size(); j++) {
      if (j == 9) continue;  // sinks: an input
      const double e = nmse(want_b[j], got_b[j]);
      EXPECT_LE(e, kTolBwd) << bnames[j - 6] << ": NMSE " << e;
      EXPECT_EQ(memcmp(got_b[j].data(), again_b[j].data(), got_b[j].size() * sizeof(float)), 0)
          << bnames[j - 6] << ": two cuda runs differ in bits";
    }
    for (int j = 0; j < (int)bwd.size(); j++) {
      if (j < 6 || j == 9) {
        EXPECT_EQ(memcmp(got_b[j].data(), bwd[j].data(), bwd[j].size() * sizeof(float)), 0) << "input " << j;
      }
    }
  }
};

TEST_F(CudaAttention, SingleToken) {
  check({1, 1, 1, 1, 64}, 1);
  check({3, 1, 4, 2, 128}, 2);
}

TEST_F(CudaAttention, OddLengthsAndGqaRatios) {
  uint32_t seed = 10;
  for (int64_t S : {2, 31, 33, 37, 65, 100}) {
    check({2, S, 2, 2, 64}, seed++);   // ratio 1
    check({1, S, 4, 2, 128}, seed++);  // ratio 2
    check({2, S, 8, 2, 64}, seed++);   // ratio 4
    check({1, S, 4, 1, 128}, seed++);  // ratio 4, one kv head
  }
}

TEST_F(CudaAttention, HeadDimPadding) {
  check({1, 45, 2, 1, 40}, 50);
  check({2, 70, 3, 1, 96}, 51);
  check({1, 77, 4, 2, 256}, 52);
  check({1, 9, 2, 2, 1}, 53);
}

TEST_F(CudaAttention, PeakedSoftmax) {
  // Scores of tens: the running max moves by large steps across key tiles.
  check({1, 129, 2, 1, 64}, 60, 12.0f);
  check({2, 97, 4, 4, 128}, 61, 8.0f);
}

TEST_F(CudaAttention, LongSequence) {
  // S = 4096: one head's S x S scores (64 MiB) fit neither the 4 KiB kernel
  // scratch nor, with the rest, anything but a tiled kernel.
  check({1, 4096, 2, 1, 64}, 70);
}

// Value heads unlike the query/key heads (i[5] = Dv): DeepSeek-V3's D 192 /
// Dv 128 with GQA (tiles 256 wide), Dv above D, both inside one padded width,
// odd small dims, and the widest value tile.
TEST_F(CudaAttention, ValueHeadDimDiffers) {
  check({1, 37, 4, 2, 192, 128}, 80);
  check({2, 5, 4, 1, 192, 128}, 81);
  check({2, 70, 4, 1, 64, 128}, 82);
  check({1, 33, 2, 2, 40, 24}, 83);
  check({1, 9, 3, 1, 3, 5}, 84);
  check({1, 65, 2, 1, 128, 256}, 85);
  check({3, 1, 4, 2, 16, 8}, 86);
}

// gpt-oss: sliding windows (1, 3, past a 32-key tile, gpt-oss's 128 over
// many skipped tiles, at S: none) and sink logits with and without one, GQA,
// odd S, Dv != D with both.
TEST_F(CudaAttention, SinksAndSlidingWindows) {
  check({1, 70, 4, 2, 64, 0, 3, true}, 90);
  check({2, 130, 4, 2, 64, 0, 1, true}, 91);
  check({1, 100, 8, 2, 128, 0, 40, false}, 92);
  check({1, 65, 2, 1, 64, 0, 0, true}, 93);
  check({1, 37, 4, 2, 192, 128, 16, true}, 94);
  check({1, 33, 2, 2, 40, 0, 33, true}, 95);
  check({1, 1000, 2, 1, 64, 0, 128, true}, 96);
}

TEST_F(CudaAttention, RefusesBadShapes) {
  std::vector<std::vector<float>> bufs(5, std::vector<float>(64, 0.0f)), out;
  EXPECT_EQ(run_gpu(MF_K_ATTN_FWD, {1, 1, 1, 1, 300}, 1.0f, bufs, &out), MF_ERR_UNSUPPORTED);
  EXPECT_NE(std::string(mf_last_error()).find("head_dim"), std::string::npos) << mf_last_error();
  EXPECT_EQ(run_gpu(MF_K_ATTN_FWD, {1, 1, 3, 2, 8}, 1.0f, bufs, &out), MF_ERR_INVALID_ARG);
  EXPECT_EQ(run_gpu(MF_K_ATTN_FWD, {1, 1, 1, 1, 8, 300}, 1.0f, bufs, &out), MF_ERR_UNSUPPORTED);
  EXPECT_NE(std::string(mf_last_error()).find("Dv=300"), std::string::npos) << mf_last_error();
  EXPECT_EQ(run_gpu(MF_K_ATTN_FWD, {1, 1, 1, 1, 8, -2}, 1.0f, bufs, &out), MF_ERR_INVALID_ARG);
  EXPECT_EQ(run_gpu(MF_K_ATTN_FWD, {1, 2, 1, 1, 8, 0, -1}, 1.0f, bufs, &out), MF_ERR_INVALID_ARG);
  EXPECT_NE(std::string(mf_last_error()).find("window -1"), std::string::npos) << mf_last_error();
}

}  // namespace
