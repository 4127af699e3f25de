// The grouped expert GEMMs of BF16 storage on tensor cores, on both kernels the
// cuda backend has for them — kernels/cuda/expert_mma.cu (mma.sync) and
// kernels/cuda/expert_cutlass.cu (CUTLASS's sm90 grouped GEMM, wgmma + TMA;
// skipped, saying why, where it is not available) — against the cpu twin in
// its bf16-rounding mode
// (MfBf16Twin, tests/cuda/bf16_twin.h): EXPERT_FWD, EXPERT_BWD_DATA and
// EXPERT_BWD_WEIGHT at the 644M shape's sizes, at Qwen3-like ones (many small
// experts: the 64-row tile), at odd sizes (ragged row, column and contraction
// tiles, rows past offsets[E], and one shape just off the tensor-core path's
// alignment, which runs the CUDA-core kernel), and two runs of one call giving
// the same bits. Routed rows are skewed over the experts, with idle experts
// (no rows, NULL weights) and 1-row ones.
//
// Tolerances (why). Inputs are bf16 values in [-1, 1], so both sides start
// from the same numbers and every product is exact in fp32; the fp32 sums differ
// only in their order (the cpu sums each dot product sequentially, the tensor
// cores in k16 groups). For a contraction of depth K the sums are about
// sqrt(K) / 3 in size (products of variance 1/9) and at most sqrt(K) in
// practice; round-to-nearest adds in another order move them by about
// sqrt(K) 2^-24 of that, and a tensor core whose fp32 accumulation truncates
// once per k16 step (biased, no cancellation) by at most (K / 16) 2^-23
// sqrt(K) = K^1.5 2^-27, which is below kSumSlack K = 1e-6 K for K up to
// 16384 (here K <= 2816 for FWD / DATA, an expert's rows, < 4000, for WGT).
//   ye, dxe (bf16): both sides round their sum once; sums that straddle a
//     rounding boundary land one bf16 ulp apart, at most 2^-7 of the value:
//     |gpu - cpu| <= kUlp |cpu| + kSumSlack K. Over a whole output the
//     straddles are rare (the sums' difference is far below an ulp), so the
//     relative RMS difference stays below 2^-9, while one lost contraction
//     term would make it about 1 / sqrt(K) (> 2^-6 here).
//   dW (fp32, starting from fp32 values, the sum added once):
//     |gpu - cpu| <= 1e-5 |cpu| + kSumSlack rows.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cuda/backend_cuda.h"
#include "tests/cuda/bf16_twin.h"

namespace {

constexpr float kUlp = 1.0f / 128;  // one bf16 ulp, relative
constexpr double kSumSlack = 1e-6;  // per contraction term: fp32 sums in another order
constexpr double kRelRms = 1.0 / 512;

// Rows per expert: `idle` experts get none, `ones` one each, the other rows
// go to the rest with Zipf-like weights 1 / (rank + 1) over a shuffled rank.
std::vector<int64_t> skewed_counts(int64_t rows, int64_t E, const std::vector<int> &idle,
                                   const std::vector<int> &ones, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::vector<int64_t> counts((size_t)E, 0);
  std::vector<int> rank((size_t)E);
  for (int e = 0; e < E; e++) rank[(size_t)e] = e;
  std::shuffle(rank.begin(), rank.end(), g);
  std::vector<double> w((size_t)E);
  for (int e = 0; e < E; e++) {
    const bool fixed = std::count(idle.begin(), idle.end(), e) || std::count(ones.begin(), ones.end(), e);
    w[(size_t)e] = fixed ? 0.0 : 1.0 / (rank[(size_t)e] + 1);
  }
  for (int e : ones) counts[(size_t)e] = 1;
  std::discrete_distribution<int> d(w.begin(), w.end());
  for (int64_t r = (int64_t)ones.size(); r < rows; r++) counts[(size_t)d(g)]++;
  return counts;
}

std::vector<int64_t> offsets_of(const std::vector<int64_t> &counts) {
  std::vector<int64_t> off(counts.size() + 1, 0);
  for (size_t e = 0; e < counts.size(); e++) off[e + 1] = off[e] + counts[e];
  return off;
}

// One grouped-GEMM shape: rows per expert, R >= their sum (the rows past it
// stay untouched), W_e [N, Kd].
struct Shape {
  const char *name;
  std::vector<int64_t> counts;
  int64_t R, N, Kd;
};

// |gpu - cpu| <= rtol |cpu| + atol on the first n elements; over them the RMS
// of gpu - cpu is at most rel_rms of the RMS of cpu (rel_rms < 0: not checked);
// the elements from n on are NaN on both sides (never written).
::testing::AssertionResult close_rows(const std::vector<float> &gpu, const std::vector<float> &cpu, size_t n,
                                      float rtol, double atol, double rel_rms) {
  if (gpu.size() != cpu.size() || gpu.size() < n)
    return ::testing::AssertionFailure()
           << "sizes " << gpu.size() << " and " << cpu.size() << ", " << n << " compared";
  double d2 = 0, c2 = 0;
  for (size_t i = 0; i < n; i++) {
    const double d = std::fabs((double)gpu[i] - (double)cpu[i]);
    if (!(d <= atol + rtol * std::fabs((double)cpu[i])))
      return ::testing::AssertionFailure()
             << "element " << i << ": " << gpu[i] << " vs " << cpu[i] << " (|diff| " << d << " > " << atol
             << " + " << rtol << " * |cpu|)";
    d2 += d * d, c2 += (double)cpu[i] * cpu[i];
  }
  if (rel_rms >= 0 && !(std::sqrt(d2) <= rel_rms * std::sqrt(c2)))
    return ::testing::AssertionFailure()
           << "relative RMS difference " << std::sqrt(d2 / c2) << " > " << rel_rms;
  for (size_t i = n; i < gpu.size(); i++)
    if (!std::isnan(gpu[i]) || !std::isnan(cpu[i]))
      return ::testing::AssertionFailure() << "element " << i << " past offsets[E] was written: " << gpu[i]
                                           << " (gpu), " << cpu[i] << " (cpu)";
  return ::testing::AssertionSuccess();
}

std::vector<float> as_f32(const std::vector<uint8_t> &b) {
  return MfTwinResult::as<float>(b);
}

std::vector<float> nans(int64_t n) {
  return std::vector<float>((size_t)n, std::numeric_limits<float>::quiet_NaN());
}

mf_kernel_call expert_call(mf_kernel kind, const Shape &s, const char *label) {
  mf_kernel_call c = {};
  c.kind = kind;
  c.i[0] = (int64_t)s.counts.size(), c.i[1] = s.N, c.i[2] = s.Kd;
  c.label = label;
  return c;
}

// The calls of one shape, their operands made once from `seed`.
struct ExpertCalls {
  Shape s;
  std::vector<int64_t> off;
  std::vector<std::vector<float>> W, dW0;  // per expert; empty for idle experts
  std::vector<float> xe, dye;

  // cold: experts with rows but no weights (NULL: a cold expert's LoRA
  // adapter), whose FWD / DATA rows are zeros and whose WGT is skipped.
  ExpertCalls(const Shape &shape, uint64_t seed, const std::vector<int> &cold = {})
      : s(shape), off(offsets_of(shape.counts)) {
    const int64_t E = (int64_t)s.counts.size();
    for (int64_t e = 0; e < E; e++) {
      const bool live = s.counts[(size_t)e] > 0 && !std::count(cold.begin(), cold.end(), (int)e);
      W.push_back(live ? mf_test_bf16_values((size_t)(s.N * s.Kd), seed + 2 * e) : std::vector<float>());
      std::vector<float> d =
          live ? mf_test_bf16_values((size_t)(s.N * s.Kd), seed + 2 * e + 1) : std::vector<float>();
      for (auto &x : d) x += 1.0f / 3;  // fp32 starting values bf16 cannot hold
      dW0.push_back(d);
    }
    xe = mf_test_bf16_values((size_t)(s.R * s.Kd), seed + 2 * E);
    dye = mf_test_bf16_values((size_t)(s.R * s.N), seed + 2 * E + 1);
  }
  int64_t used_rows() const { return off.back(); }
  int64_t max_rows() const { return *std::max_element(s.counts.begin(), s.counts.end()); }

  std::vector<MfTwinOperand> fwd_ops() const {
    return {MfTwinOperand::of(xe), MfTwinOperand::of(off), MfTwinOperand::of(nans(s.R * s.N))};
  }
  std::vector<MfTwinOperand> data_ops() const {
    return {MfTwinOperand::of(dye), MfTwinOperand::of(off), MfTwinOperand::of(nans(s.R * s.Kd))};
  }
  std::vector<MfTwinOperand> wgt_ops() const {
    return {MfTwinOperand::of(dye), MfTwinOperand::of(xe), MfTwinOperand::of(off)};
  }
};

// The twin with a pooled cpu backend: the cpu side of the 644M-sized calls is
// tens of GFLOP (its bits do not depend on the thread count).
// The parameter: MF_CUDA_EXPERT_GEMM_MMA or _CUTLASS.
class Bf16ExpertMma : public MfBf16Twin, public ::testing::WithParamInterface<int> {
 protected:
  void SetUp() override {
    MfBf16Twin::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    if (mf_backend_cuda_set_expert_gemm(gpu_, GetParam()) != MF_OK) GTEST_SKIP() << mf_last_error();
    ASSERT_EQ(mf_threadpool_create(0, &pool_), MF_OK) << mf_last_error();
    cpu_->stream_free(cpu_, cpu_s_);
    mf_backend_free(cpu_);
    cpu_ = nullptr, cpu_s_ = nullptr;
    mf_cpu_backend_opts co = {};
    co.round_bf16 = 1;
    co.pool = pool_;
    ASSERT_EQ(mf_backend_cpu_create(&co, &cpu_), MF_OK) << mf_last_error();
    ASSERT_EQ(cpu_->stream_create(cpu_, &cpu_s_), MF_OK) << mf_last_error();
  }
  void TearDown() override {
    MfBf16Twin::TearDown();
    mf_threadpool_free(pool_);
  }

  // The calls counted so far: on the cutlass kernel (this backend's), on
  // mma.sync (the process's).
  struct Ran {
    uint64_t cutlass, mma;
  };
  Ran ran_so_far() const { return {mf_backend_cuda_cutlass_calls(gpu_), mf_backend_cuda_mma_calls(0)}; }

  // With the cutlass parameter, the `calls` expert GEMMs since `before` ran on
  // it (not on mma.sync) when the shape is one it takes (N, Kd multiples of 8),
  // none otherwise; with mma, they ran on mma.sync where it takes the shape
  // (the same multiples of 8), on the CUDA-core kernel otherwise: a silent
  // fall-back from either tensor-core kernel fails here.
  void expect_path(const Shape &s, Ran before, uint64_t calls) {
    const bool fits = s.N % 8 == 0 && s.Kd % 8 == 0 && s.R > 0;
    const bool cutlass = GetParam() == MF_CUDA_EXPERT_GEMM_CUTLASS && fits;
    const Ran now = ran_so_far();
    EXPECT_EQ(now.cutlass - before.cutlass, cutlass ? calls : 0) << "expert GEMM calls run by the cutlass kernel";
    EXPECT_EQ(now.mma - before.mma, fits && !cutlass ? calls : 0) << "expert GEMM calls run by mma.sync";
  }

  // EXPERT_FWD, EXPERT_BWD_DATA and EXPERT_BWD_WEIGHT of c against the twin.
  void check_kinds(const ExpertCalls &c) {
    const Shape &s = c.s;
    SCOPED_TRACE(s.name);
    const Ran before = ran_so_far();
    const size_t used = (size_t)c.used_rows();
    {
      MfTwinResult r = run(expert_call(MF_K_EXPERT_FWD, s, "expert_fwd"), c.fwd_ops(), c.W);
      EXPECT_TRUE(close_rows(as_f32(r.gpu[2]), as_f32(r.cpu[2]), used * s.N, kUlp, kSumSlack * s.Kd, kRelRms))
          << "expert_fwd";
    }
    {
      MfTwinResult r = run(expert_call(MF_K_EXPERT_BWD_DATA, s, "expert_bwd_data"), c.data_ops(), c.W);
      EXPECT_TRUE(close_rows(as_f32(r.gpu[2]), as_f32(r.cpu[2]), used * s.Kd, kUlp, kSumSlack * s.N, kRelRms))
          << "expert_bwd_data";
    }
    MfTwinResult r = run(expert_call(MF_K_EXPERT_BWD_WEIGHT, s, "expert_bwd_weight"), c.wgt_ops(), c.dW0);
    ASSERT_EQ(r.gpu_experts.size(), s.counts.size());
    ASSERT_EQ(r.cpu_experts.size(), s.counts.size());
    for (size_t e = 0; e < s.counts.size(); e++) {
      const int64_t rows = s.counts[e];
      if (rows == 0 || c.W[e].empty()) {
        EXPECT_TRUE(r.gpu_experts[e].empty() && r.cpu_experts[e].empty()) << "idle or cold expert " << e;
        continue;
      }
      EXPECT_TRUE(close_rows(as_f32(r.gpu_experts[e]), as_f32(r.cpu_experts[e]), (size_t)(s.N * s.Kd), 1e-5f,
                             kSumSlack * rows, -1))
          << "expert_bwd_weight, expert " << e << " (" << rows << " rows)";
    }
    expect_path(s, before, 3);
  }

  mf_threadpool *pool_ = nullptr;
};

// hidden 1024, expert_ffn 2816, 8 experts, 4096 tokens top-2: the gate / up
// projections (N = 2816, Kd = 1024) and the down one (N = 1024, Kd = 2816);
// 128-row tiles. Expert 5 idle, expert 2 one row.
TEST_P(Bf16ExpertMma, Shape644M) {
  const std::vector<int64_t> counts = skewed_counts(8192, 8, {5}, {2}, 11);
  const int64_t dims[2][2] = {{2816, 1024}, {1024, 2816}};
  for (auto &d : dims) {
    SCOPED_TRACE("N " + std::to_string(d[0]) + " Kd " + std::to_string(d[1]));
    check_kinds(ExpertCalls({"644M", counts, 8192, d[0], d[1]}, 100 + d[0]));
  }
}

// Qwen3-MoE-like: many small experts, expert_ffn 768, 8192 routed rows (1024
// tokens top-8). 128 experts (a gate / up projection, hidden scaled to 512 to
// fit the twin's arena): 64 rows an expert on average, the 64-row tiles; 64
// experts (a down projection from 768 to 1024): 128 on average, 128-row tiles.
TEST_P(Bf16ExpertMma, QwenLikeSmallExperts) {
  check_kinds(ExpertCalls(
      {"qwen E=128", skewed_counts(8192, 128, {3, 17, 64, 100}, {7, 90}, 21), 8192, 768, 512}, 200));
  check_kinds(ExpertCalls({"qwen E=64", skewed_counts(8192, 64, {0, 40}, {63}, 22), 8192, 1024, 768}, 300));
}

// Cold experts (LoRA's train.lora.experts hot: an adapter pool with NULL for
// the experts without adapters): experts 2 and 5 have rows but no weights;
// their FWD / DATA rows are +0 on the GPU exactly (and the twin's), their dW
// skipped; the other experts as before.
TEST_P(Bf16ExpertMma, ColdExpertsGiveZeroRows) {
  const ExpertCalls c({"cold", skewed_counts(2048, 8, {1}, {6}, 41), 2048, 768, 1024}, 800, {2, 5});
  ASSERT_GT(c.s.counts[2], 0);
  ASSERT_GT(c.s.counts[5], 0);
  check_kinds(c);
  for (mf_kernel k : {MF_K_EXPERT_FWD, MF_K_EXPERT_BWD_DATA}) {
    const bool fwd = k == MF_K_EXPERT_FWD;
    MfTwinResult r =
        run(expert_call(k, c.s, fwd ? "cold fwd" : "cold data"), fwd ? c.fwd_ops() : c.data_ops(), c.W);
    const std::vector<float> g = as_f32(r.gpu[2]);
    const int64_t width = fwd ? c.s.N : c.s.Kd;
    for (int e : {2, 5})
      for (int64_t i = c.off[(size_t)e] * width; i < c.off[(size_t)e + 1] * width; i++)
        ASSERT_TRUE(g[(size_t)i] == 0.0f && !std::signbit(g[(size_t)i]))
            << (fwd ? "fwd" : "data") << ": cold expert " << e << " element " << i << " = " << g[(size_t)i];
  }
}

// Ragged tiles everywhere: K = 1000 (31 full steps and one 8 deep), N = 72 (a
// 72-column tile), experts of 0, 1, 77, 130, 200 rows (no multiple of a tile)
// with rows past offsets[E]; at both tile heights. Then N = 70, Kd = 1001: off
// the 16-byte rows, so the CUDA-core kernel runs it (the dispatch's other side).
TEST_P(Bf16ExpertMma, OddSizes) {
  check_kinds(ExpertCalls({"odd, 64-row tiles", {0, 1, 77, 130, 200}, 413, 72, 1000}, 400));
  check_kinds(ExpertCalls({"odd, 128-row tiles", {300, 0, 1, 129, 257}, 690, 72, 1000}, 500));
  check_kinds(ExpertCalls({"unaligned rows", {0, 1, 77, 130, 200}, 413, 70, 1001}, 600));
}

// The same call twice gives the same bits (each output tile owned by one CTA,
// the contraction in a fixed order), and matches the twin.
TEST_P(Bf16ExpertMma, TwoRunsSameBits) {
  const ExpertCalls c({"determinism", skewed_counts(2048, 8, {1}, {6}, 31), 2048, 768, 1024}, 700);
  const Shape &s = c.s;
  const size_t used = (size_t)c.used_rows();
  const Ran before = ran_so_far();
  {
    const mf_kernel_call k = expert_call(MF_K_EXPERT_FWD, s, "expert_fwd twice");
    MfTwinResult a = run(k, c.fwd_ops(), c.W), b = run(k, c.fwd_ops(), c.W);
    EXPECT_TRUE(a.gpu[2] == b.gpu[2]) << "expert_fwd: two runs differ";
    EXPECT_TRUE(close_rows(as_f32(a.gpu[2]), as_f32(a.cpu[2]), used * s.N, kUlp, kSumSlack * s.Kd, kRelRms));
  }
  {
    const mf_kernel_call k = expert_call(MF_K_EXPERT_BWD_DATA, s, "expert_bwd_data twice");
    MfTwinResult a = run(k, c.data_ops(), c.W), b = run(k, c.data_ops(), c.W);
    EXPECT_TRUE(a.gpu[2] == b.gpu[2]) << "expert_bwd_data: two runs differ";
    EXPECT_TRUE(close_rows(as_f32(a.gpu[2]), as_f32(a.cpu[2]), used * s.Kd, kUlp, kSumSlack * s.N, kRelRms));
  }
  const mf_kernel_call k = expert_call(MF_K_EXPERT_BWD_WEIGHT, s, "expert_bwd_weight twice");
  MfTwinResult a = run(k, c.wgt_ops(), c.dW0), b = run(k, c.wgt_ops(), c.dW0);
  ASSERT_EQ(a.gpu_experts.size(), s.counts.size());
  ASSERT_EQ(b.gpu_experts.size(), s.counts.size());
  for (size_t e = 0; e < s.counts.size(); e++)
    EXPECT_TRUE(a.gpu_experts[e] == b.gpu_experts[e])
        << "expert_bwd_weight, expert " << e << ": two runs differ";
  expect_path(s, before, 6);
}

INSTANTIATE_TEST_SUITE_P(Kernels, Bf16ExpertMma,
                         ::testing::Values(MF_CUDA_EXPERT_GEMM_MMA, MF_CUDA_EXPERT_GEMM_CUTLASS),
                         [](const ::testing::TestParamInfo<int> &p) {
                           return std::string(p.param == MF_CUDA_EXPERT_GEMM_CUTLASS ? "Cutlass" : "Mma");
                         });

}  // namespace
