// The kernels of kernels/cuda/elementwise.cu with BF16 storage against their cpu
// twins in round_bf16 mode (tests/cuda/bf16_twin.h), at shapes that take the
// 16-byte vector paths (rows of a multiple of 8 elements, several 2048-element
// tiles of a row sum) and the element-by-element ones (odd widths, C not a
// multiple of 8, tails); and the embedding backward's bucketed sum at T = 4096
// with many repeated ids, in fp32 and bf16, exact against the cpu and the same
// bits on two runs.
//
// Tolerances (why). bf16 keeps 8 significant bits, so the spacing of bf16
// values near v is at most 2^-7 |v|. Where both sides compute one fp32 value up
// to a few fp32 ulps (device expf/powf/cosf vs libm, an fma vs a multiply and
// an add, fp32 sums in another fixed order) and round it to nearest, they land
// on the same or adjacent bf16 values: |gpu - cpu| <= 2^-7 |cpu| (kUlp, with a
// little room). atol covers what is absolute rather than relative: cancellation
// after a sum (rmsnorm's m, the gate's dot) or an angle (rope), bounded per test.
// Exact (0, 0) where both sides do the same IEEE operations in the same order:
// copies (embed_fwd), one fp32 addition rounded once (add), the token-order
// sums of embed_bwd.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <random>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "src/core/core.h"
#include "tests/cuda/bf16_twin.h"

namespace {

constexpr float kUlp = 1.0f / 128 + 1.0f / 4096;  // one bf16 spacing, relative, with room

// Row shapes (rows, columns): ones; odd widths (scalar rows, misaligned from
// row 1 on); multiples of 8 (16-byte rows); over one 2048-element tile of a
// staged row sum; an odd width over one tile.
const int64_t kRows[][2] = {{1, 1}, {37, 129}, {64, 1024}, {3, 4104}, {5, 3001}};

mf_kernel_call call_of(mf_kernel kind, std::initializer_list<int64_t> sizes, double f0 = 0) {
  mf_kernel_call c = {};
  c.kind = kind;
  int j = 0;
  for (int64_t v : sizes) c.i[j++] = v;
  c.f[0] = f0;
  return c;
}

template <typename V>
MfTwinOperand op(const std::vector<V> &v) {
  return MfTwinOperand::of(v);
}

std::string shape(const char *what, std::initializer_list<int64_t> dims) {
  std::string s = what;
  for (int64_t d : dims) s += " " + std::to_string(d);
  return s;
}

// T ids in [0, V), many repeated: a quarter are one id, a quarter among ten.
std::vector<int32_t> repeated_ids(int64_t T, int64_t V, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::uniform_int_distribution<int32_t> any(0, (int32_t)V - 1), few(0, V > 10 ? 9 : (int32_t)V - 1);
  std::vector<int32_t> ids((size_t)T);
  for (auto &id : ids) {
    const uint64_t k = g() % 4;
    id = k == 0 ? (int32_t)(V / 3) : k == 1 ? few(g) : any(g);
  }
  return ids;
}

// fp32 values in [-1, 1] that are not bf16-representable (fp32 calls).
std::vector<float> f32_values(size_t n, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (auto &x : v) x = d(g);
  return v;
}

class Bf16Elementwise : public MfBf16Twin {
 protected:
  // Operand j after the call on both sides (fp32), within (rtol, atol) of the cpu.
  void expect_close(const MfTwinResult &r, int j, float rtol, float atol, const std::string &what) {
    ASSERT_FALSE(r.cpu[j].empty()) << what << ": operand " << j << " not read back";
    EXPECT_TRUE(
        mf_test_close(MfTwinResult::as<float>(r.gpu[j]), MfTwinResult::as<float>(r.cpu[j]), rtol, atol))
        << what << ", operand " << j;
  }

  // embed_bwd with F32 storage (operands as given, not narrowed as run()
  // narrows dout) on the cuda backend: dtable after the call.
  std::vector<float> gpu_embed_bwd_f32(int64_t T, int64_t V, int64_t H, const std::vector<int32_t> &ids,
                                       const std::vector<float> &dout, const std::vector<float> &dtable) {
    const size_t off_dout = (ids.size() * 4 + 255) / 256 * 256;
    const size_t off_dt = off_dout + (dout.size() * 4 + 255) / 256 * 256;
    EXPECT_LE(off_dt + dtable.size() * 4, kArena);
    mf_kernel_call c = call_of(MF_K_EMBED_BWD, {T, V, H});
    c.b[0] = {arena_, ids.size() * 4, 0, MF_DTYPE_I32};
    c.b[1] = {arena_ + off_dout, dout.size() * 4, 0, MF_DTYPE_F32};
    c.b[2] = {arena_ + off_dt, dtable.size() * 4, 1, MF_DTYPE_F32};
    for (int j = 0; j < 3; j++) {
      const void *src = j == 0   ? (const void *)ids.data()
                        : j == 1 ? (const void *)dout.data()
                                 : dtable.data();
      EXPECT_EQ(gpu_->copy(gpu_, c.b[j].ptr, src, c.b[j].bytes, MF_COPY_H2D, gpu_s_), MF_OK)
          << mf_last_error();
    }
    EXPECT_EQ(gpu_->run(gpu_, &c, gpu_s_), MF_OK) << mf_last_error();
    std::vector<float> out(dtable.size());
    EXPECT_EQ(gpu_->copy(gpu_, out.data(), c.b[2].ptr, c.b[2].bytes, MF_COPY_D2H, gpu_s_), MF_OK)
        << mf_last_error();
    EXPECT_EQ(gpu_->stream_sync(gpu_, gpu_s_), MF_OK) << mf_last_error();
    return out;
  }
};

TEST_F(Bf16Elementwise, EmbedFwdCopiesRowsExactly) {
  const int64_t shapes[][3] = {{1, 1, 1}, {37, 50, 129}, {64, 1000, 1024}, {33, 7, 1003}};
  uint64_t seed = 100;
  for (auto &s : shapes) {
    const int64_t T = s[0], V = s[1], H = s[2];
    mf_kernel_call c = call_of(MF_K_EMBED_FWD, {T, V, H});
    MfTwinResult r = run(c, {op(repeated_ids(T, V, seed)), op(mf_test_bf16_values((size_t)(V * H), seed + 1)),
                             op(std::vector<float>((size_t)(T * H), 7.0f))});
    seed += 2;
    expect_close(r, 2, 0, 0, shape("embed_fwd", {T, V, H}));
  }
}

TEST_F(Bf16Elementwise, EmbedBwdAddsInTokenOrderExactly) {
  // (T, V, H): small; the acceptance shape with repeated ids, 16-byte rows and
  // an odd width; a 32000-row vocabulary (the count scan's several tiles).
  const int64_t shapes[][3] = {
      {1, 1, 1}, {37, 50, 129}, {4096, 1000, 136}, {4096, 1000, 131}, {4096, 32000, 16}};
  uint64_t seed = 200;
  for (auto &s : shapes) {
    const int64_t T = s[0], V = s[1], H = s[2];
    mf_kernel_call c = call_of(MF_K_EMBED_BWD, {T, V, H});
    MfTwinResult r = run(c, {op(repeated_ids(T, V, seed)), op(mf_test_bf16_values((size_t)(T * H), seed + 1)),
                             op(f32_values((size_t)(V * H), seed + 2))});
    seed += 3;
    expect_close(r, 2, 0, 0, shape("embed_bwd bf16", {T, V, H}));
  }
}

TEST_F(Bf16Elementwise, EmbedBwdF32ManyRepeatedIdsExactly) {
  for (int64_t H : {136, 131}) {
    const int64_t T = 4096, V = 1000;
    const auto ids = repeated_ids(T, V, 300 + H);
    const auto dout = f32_values((size_t)(T * H), 301 + H);
    const auto dtable = f32_values((size_t)(V * H), 302 + H);
    // The cpu twin (round_bf16 leaves embed_bwd alone: dtable is fp32).
    mf_kernel_call c = call_of(MF_K_EMBED_BWD, {T, V, H});
    std::vector<float> cpu = dtable;
    c.b[0] = {(void *)ids.data(), ids.size() * 4, 0, MF_DTYPE_I32};
    c.b[1] = {(void *)dout.data(), dout.size() * 4, 0, MF_DTYPE_F32};
    c.b[2] = {cpu.data(), cpu.size() * 4, 1, MF_DTYPE_F32};
    ASSERT_EQ(cpu_->run(cpu_, &c, cpu_s_), MF_OK) << mf_last_error();
    ASSERT_EQ(cpu_->stream_sync(cpu_, cpu_s_), MF_OK) << mf_last_error();
    const std::vector<float> gpu = gpu_embed_bwd_f32(T, V, H, ids, dout, dtable);
    EXPECT_TRUE(mf_test_close(gpu, cpu, 0, 0)) << shape("embed_bwd f32", {T, V, H});
  }
}

TEST_F(Bf16Elementwise, EmbedBwdTwoRunsGiveTheSameBits) {
  const int64_t T = 4096, V = 1000, H = 136;
  const auto ids = repeated_ids(T, V, 400);
  const auto dout = mf_test_bf16_values((size_t)(T * H), 401);
  const auto dtable = f32_values((size_t)(V * H), 402);
  mf_kernel_call c = call_of(MF_K_EMBED_BWD, {T, V, H});
  MfTwinResult a = run(c, {op(ids), op(dout), op(dtable)});
  MfTwinResult b = run(c, {op(ids), op(dout), op(dtable)});
  ASSERT_FALSE(a.gpu[2].empty());
  EXPECT_TRUE(a.gpu[2] == b.gpu[2]) << "bf16: two runs differ";
  const auto f32_dout = f32_values((size_t)(T * H), 403);
  std::vector<float> x = gpu_embed_bwd_f32(T, V, H, ids, f32_dout, dtable);
  std::vector<float> y = gpu_embed_bwd_f32(T, V, H, ids, f32_dout, dtable);
  EXPECT_EQ(std::memcmp(x.data(), y.data(), x.size() * sizeof(float)), 0) << "fp32: two runs differ";
}

TEST_F(Bf16Elementwise, RmsnormFwd) {
  uint64_t seed = 500;
  for (auto &s : kRows) {
    const int64_t R = s[0], C = s[1];
    mf_kernel_call c = call_of(MF_K_RMSNORM_FWD, {R, C}, 1e-6);
    MfTwinResult r =
        run(c, {op(mf_test_bf16_values((size_t)(R * C), seed, 2.0f)),
                op(mf_test_bf16_values((size_t)C, seed + 1, 1.5f)),
                op(std::vector<float>((size_t)(R * C), 0.0f)), op(std::vector<float>((size_t)R, 0.0f))});
    seed += 2;
    // y = w*(x*rstd): relative errors only (rstd's), then one rounding each.
    expect_close(r, 2, kUlp, 1e-7f, shape("rmsnorm_fwd y", {R, C}));
    // rstd (fp32): a sum of C <= 4104 squares in two fixed orders (the cpu's
    // 16 lanes, the block's tree), ~sqrt(C) 2^-24 = 4e-6 relative apart in
    // practice, halved by 1/sqrt: 1e-4 leaves 25x room.
    expect_close(r, 3, 1e-4f, 0, shape("rmsnorm_fwd rstd", {R, C}));
  }
}

TEST_F(Bf16Elementwise, RmsnormBwd) {
  const int64_t shapes[][2] = {{1, 1}, {37, 129}, {300, 1000}, {70, 4104}, {5, 3001}};
  uint64_t seed = 600;
  for (auto &s : shapes) {
    for (int acc = 0; acc < 2; acc++) {
      const int64_t R = s[0], C = s[1];
      mf_kernel_call c = call_of(MF_K_RMSNORM_BWD, {R, C, acc});
      std::vector<float> rstd(f32_values((size_t)R, seed));
      for (auto &v : rstd) v = 1.25f + 0.75f * v;  // [0.5, 2]
      MfTwinResult r =
          run(c, {op(mf_test_bf16_values((size_t)(R * C), seed + 1)),
                  op(mf_test_bf16_values((size_t)(R * C), seed + 2)),
                  op(mf_test_bf16_values((size_t)C, seed + 3, 1.5f)), op(rstd),
                  op(mf_test_bf16_values((size_t)(R * C), seed + 4)), op(f32_values((size_t)C, seed + 5))});
      seed += 6;
      // dx = rstd*(w*dy - xhat*m): m, a mean of C terms |t| <= 3 summed in
      // two fixed orders, moves by about 2^-24 * rms(t) (the sums' rounding,
      // divided by C), which dx scales by rstd^2 |x| <= 4: ~1e-6, far under
      // atol 1e-4 (dx may cancel, so that part is absolute); then kUlp.
      expect_close(r, 4, kUlp, 1e-4f, shape("rmsnorm_bwd dx", {R, C, acc}));
      // dw (fp32): sums of R <= 300 terms |dy x rstd| <= 2 in two fixed orders
      // (row parts, fma): ~sqrt(R) 2^-24 * sum |t| apart in practice.
      expect_close(r, 5, 1e-4f, 1e-4f, shape("rmsnorm_bwd dw", {R, C, acc}));
    }
  }
}

TEST_F(Bf16Elementwise, RopeFwdBwd) {
  uint64_t seed = 700;
  for (int64_t D : {2, 64, 130}) {
    for (mf_kernel k : {MF_K_ROPE_FWD, MF_K_ROPE_BWD}) {
      const int64_t T = 37, nh = 3;
      std::vector<int32_t> pos((size_t)T);
      std::mt19937_64 g(seed);
      for (auto &p : pos) p = (int32_t)(g() % 512);
      mf_kernel_call c = call_of(k, {T, nh, D}, 10000.0);
      MfTwinResult r = run(c, {op(mf_test_bf16_values((size_t)(T * nh * D), seed + 1)), op(pos)});
      seed += 2;
      // Angles up to 511 rad from powf one ulp apart differ by ~511 * 2^-24
      // = 3e-5 rad: |x| <= 1 moves by as much before the rounding.
      expect_close(r, 0, kUlp, 1e-4f, shape(k == MF_K_ROPE_FWD ? "rope_fwd" : "rope_bwd", {T, nh, D}));
    }
  }
  // DeepSeek-V3's q heads: the tail 64 of 192 interleaved, YaRN (factor 40 over 4096, betas 32 / 1),
  // attention factor 1.25 (the same angles' margin, times 1.25)
  for (mf_kernel k : {MF_K_ROPE_FWD, MF_K_ROPE_BWD}) {
    const int64_t T = 37, nh = 3, D = 192;
    std::vector<int32_t> pos((size_t)T);
    std::mt19937_64 g(seed);
    for (auto &p : pos) p = (int32_t)(g() % 512);
    mf_kernel_call c = call_of(k, {T, nh, D, 64, 128, 1, 0}, 10000.0);
    const double f[6] = {10000.0, 40.0, 4096.0, 32.0, 1.0, 1.25};
    for (int j = 0; j < 6; j++) c.f[j] = f[j];
    MfTwinResult r = run(c, {op(mf_test_bf16_values((size_t)(T * nh * D), seed + 1)), op(pos)});
    seed += 2;
    expect_close(r, 0, kUlp, 1.25e-4f,
                 shape(k == MF_K_ROPE_FWD ? "rope_fwd deepseek" : "rope_bwd deepseek", {T, nh, D}));
  }
}

TEST_F(Bf16Elementwise, SwigluFwdBwd) {
  uint64_t seed = 800;
  for (int64_t n : {1, 7, 1000, 4099}) {
    const auto g = mf_test_bf16_values((size_t)n, seed, 4.0f);
    const auto u = mf_test_bf16_values((size_t)n, seed + 1);
    const auto d = mf_test_bf16_values((size_t)n, seed + 2);
    seed += 3;
    MfTwinResult f =
        run(call_of(MF_K_SWIGLU_FWD, {n}), {op(g), op(u), op(std::vector<float>((size_t)n, 0.0f))});
    // silu(g)*u: relative errors of expf only.
    expect_close(f, 2, kUlp, 1e-6f, shape("swiglu_fwd act", {n}));
    MfTwinResult b =
        run(call_of(MF_K_SWIGLU_BWD, {n}), {op(g), op(u), op(d), op(std::vector<float>((size_t)n, 0.0f)),
                                            op(std::vector<float>((size_t)n, 0.0f))});
    // silu' = s(1 + g(1-s)) cancels near g = -1.28: absolute ~|g| * ulp(s) there.
    expect_close(b, 3, kUlp, 1e-5f, shape("swiglu_bwd dg", {n}));
    expect_close(b, 4, kUlp, 1e-6f, shape("swiglu_bwd du", {n}));
  }
}

TEST_F(Bf16Elementwise, SigmoidGateFwdBwd) {
  uint64_t seed = 900;
  for (auto &s : kRows) {
    const int64_t R = s[0], C = s[1];
    const auto gl = mf_test_bf16_values((size_t)R, seed, 3.0f);
    const auto x = mf_test_bf16_values((size_t)(R * C), seed + 1);
    const auto y = mf_test_bf16_values((size_t)(R * C), seed + 2);
    const auto dy = mf_test_bf16_values((size_t)(R * C), seed + 3);
    seed += 4;
    MfTwinResult f = run(call_of(MF_K_SIGGATE_FWD, {R, C}), {op(gl), op(x), op(y)});
    // y + s*x may cancel: s's few ulps (expf) and an fma's single rounding
    // move it by ~1e-7 absolute before the bf16 rounding.
    expect_close(f, 2, kUlp, 1e-6f, shape("sigmoid_gate_fwd y", {R, C}));
    MfTwinResult b = run(call_of(MF_K_SIGGATE_BWD, {R, C}),
                         {op(gl), op(x), op(dy), op(std::vector<float>((size_t)(R * C), 0.0f)),
                          op(std::vector<float>((size_t)R, 0.0f))});
    expect_close(b, 3, kUlp, 1e-7f, shape("sigmoid_gate_bwd dx", {R, C}));
    // dgl = s(1-s) dot: a dot of C <= 4104 terms |dy x| <= 1 in two orders
    // (~sqrt(C) 2^-24 * sum|t| apart), times s(1-s) <= 1/4.
    expect_close(b, 4, kUlp, 1e-4f, shape("sigmoid_gate_bwd dgl", {R, C}));
  }
}

TEST_F(Bf16Elementwise, AddIsExact) {
  uint64_t seed = 1000;
  for (int64_t n : {1, 9, 4096, 10007}) {
    MfTwinResult r = run(call_of(MF_K_ADD, {n, 0}), {op(mf_test_bf16_values((size_t)n, seed)),
                                                     op(mf_test_bf16_values((size_t)n, seed + 1))});
    seed += 2;
    expect_close(r, 1, 0, 0, shape("add", {n}));
  }
}

TEST_F(Bf16Elementwise, DropoutIsExact) {  // the same mask, one fp32 multiply rounded once
  uint64_t seed = 3000;
  for (int64_t n : {1, 9, 4096, 10007}) {
    MfTwinResult r =
        run(call_of(MF_K_DROPOUT, {n, 4, 77}, 0.2),
            {op(mf_test_bf16_values((size_t)n, seed)), op(mf_test_bf16_values((size_t)n, seed + 1))});
    seed += 2;
    expect_close(r, 1, 0, 0, shape("dropout", {n}));
  }
}

TEST_F(Bf16Elementwise, ScaleIsExact) {  // one fp32 multiply rounded once
  uint64_t seed = 2000;
  for (int64_t n : {1, 9, 4096, 10007}) {
    MfTwinResult r = run(call_of(MF_K_SCALE, {n}, 0.375), {op(mf_test_bf16_values((size_t)n, seed++))});
    expect_close(r, 0, 0, 0, shape("scale", {n}));
  }
}

}  // namespace
