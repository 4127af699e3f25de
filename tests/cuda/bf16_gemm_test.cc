// The cuda backend's GEMM kinds (LINEAR_*, EXPERT_*) and CROSS_ENTROPY with
// BF16 storage against their cpu twins in the bf16-rounding mode (MfBf16Twin,
// tests/cuda/bf16_twin.h): the same bf16-representable inputs, fp32 sums on
// both sides, each stored FLOAT output rounded to bf16 once. Plus determinism
// of the bf16 cuBLASLt GEMMs at a shape where the heuristic splits K.
//
// Tolerances (why). u = 2^-8 is bf16's unit roundoff (8 significant bits); two
// roundings to bf16 of nearly equal fp32 sums may land one bf16 ulp apart,
// and an ulp is at most 2^-7 of the value: kUlp. Products of bf16 values are
// exact in fp32, so the sums differ only by their order (cuBLASLt's tensor-core
// tiles, the expert kernel's fused multiply-adds, the cpu's sequential loop):
// a few fp32 ulps of the partial sums per accumulation step. For K terms of
// size <= 1 that is about sqrt(K) 2^-24 times the sum's size (~sqrt(K / 9))
// when the roundings are random, K / 16 fp32 ulps of it at worst when a
// tensor core's accumulation truncates (one step per 16 terms); kSumSlack * K
// is above both for every shape here (K <= 512, and 65536 for determinism).
//   linear fwd / bwd_data, expert fwd / bwd_data (bf16 outputs):
//     |gpu - cpu| <= kUlp |cpu| + kSumSlack * K.
//   With a bias or adding to the output (beta = 1), cuBLASLt on an H100
//   (CUDA 13, 2026-11-27) behaves as if it rounded the product to bf16 before
//   adding the bias or C, and rounded again: one more rounding, of the
//   product's size, than the twin's single one (seen: 2 to 6 bf16 ulps of the
//   result where the bias or C cancels most of the product). For those:
//   + u (|AB| + |bias| + |C|) (AB in double here): each partial sum of the
//   three is at most that large, and two extra roundings cost at most u/2 of
//   it each.
//   linear bwd_weight dW, db and expert dW (fp32 outputs, sums added to fp32):
//     |gpu - cpu| <= 1e-5 |cpu| + kSumSlack * K (the sums' order only).
//   cross-entropy: lse and the loss come from fp32 logits (order only): 1e-5
//     relative + 1e-4 absolute per token. The backward rounds where the twin
//     does not (kernels/cuda/loss.cu): g is stored in bf16 (error <= u |g|) and
//     dh, added chunk by chunk in bf16, is rounded once per chunk. With
//     S = sum_v |g[t,v]| |W[v,k]| (every partial sum of dh is at most S):
//     dh: |gpu - cpu| <= kUlp |cpu| + (n_chunks + 1) u S;
//     dW: |gpu - cpu| <= 1e-5 |cpu| + u sum_t |g[t,v]| |h[t,k]| + kSumSlack * T;
//     g is recomputed on the host in double to size S; 5% on top covers the
//     fp32 differences of g itself.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "tests/cuda/bf16_twin.h"

namespace {

constexpr float kUlp = 1.0f / 128;  // one bf16 ulp, relative
constexpr double kU = 1.0 / 256;    // bf16's unit roundoff
constexpr float kSumSlack = 1e-6f;  // per contraction term: fp32 sums in another order
const float kNaN = std::numeric_limits<float>::quiet_NaN();

typedef std::vector<MfTwinOperand> Ops;

mf_kernel_call call_of(mf_kernel kind, std::initializer_list<int64_t> i, const char *label) {
  mf_kernel_call c = {};
  c.kind = kind;
  int j = 0;
  for (int64_t v : i) c.i[j++] = v;
  c.label = label;
  return c;
}

std::vector<float> nans(size_t n) {
  return std::vector<float>(n, kNaN);
}

// |a - b| <= rtol |b| + atol[i] elementwise (atol of one value, or one per element).
::testing::AssertionResult close_each(const std::vector<float> &a, const std::vector<float> &b, float rtol,
                                      const std::vector<double> &atol) {
  if (a.size() != b.size())
    return ::testing::AssertionFailure() << "sizes differ: " << a.size() << " vs " << b.size();
  for (size_t i = 0; i < a.size(); i++) {
    const double tol = atol.size() == 1 ? atol[0] : atol[i];
    const double d = std::fabs((double)a[i] - (double)b[i]);
    if (!(d <= tol + rtol * std::fabs((double)b[i])))
      return ::testing::AssertionFailure() << "element " << i << ": " << a[i] << " vs " << b[i] << " (|diff| "
                                           << d << " > " << tol << " + " << rtol << " * |ref|)";
  }
  return ::testing::AssertionSuccess();
}

std::vector<float> as_f32(const std::vector<uint8_t> &b) {
  return MfTwinResult::as<float>(b);
}

// An operand of n bf16-representable values in [-scale, scale].
MfTwinOperand bf16s(int64_t n, uint64_t seed, float scale = 1.0f) {
  return MfTwinOperand::of(mf_test_bf16_values((size_t)n, seed, scale));
}

// n fp32 values in [-2/3, 4/3], most of which bf16 cannot hold: the starting
// values of fp32 gradient sums, which must stay fp32.
std::vector<float> fp32_values(int64_t n, uint64_t seed) {
  std::vector<float> v = mf_test_bf16_values((size_t)n, seed);
  for (auto &x : v) x += 1.0f / 3;
  return v;
}

// An output of n values before the call: bf16 values it adds to (acc), or
// NaN where it must be written.
MfTwinOperand out_start(int acc, int64_t n, uint64_t seed) {
  return acc ? bf16s(n, seed) : MfTwinOperand::of(nans((size_t)n));
}

std::string label(const char *op, std::initializer_list<int64_t> dims) {
  std::string s = op;
  for (int64_t d : dims) s += " " + std::to_string(d);
  return s;
}

// {M, N, K}: ones, odd, the projections' aspect ratios scaled down.
const int64_t kLinear[][3] = {{1, 1, 1}, {37, 129, 65}, {256, 128, 128}, {130, 16, 512}, {64, 512, 96}};

// kSumSlack * K + u (|sum_k a(i, k) b(k, j)| + |bias[j]| + |C[i N + j]|) per
// element of an M x N product: a(i, k) = A[i * sai + k * sak], b(k, j) =
// B[k * sbk + j * sbj]; bias and C may be empty (absent).
std::vector<double> product_slack(const std::vector<float> &A, const std::vector<float> &B, int64_t M,
                                  int64_t N, int64_t K, int64_t sai, int64_t sak, int64_t sbk, int64_t sbj,
                                  const std::vector<float> &bias, const std::vector<float> &C) {
  std::vector<double> t((size_t)(M * N));
  for (int64_t i = 0; i < M; i++)
    for (int64_t j = 0; j < N; j++) {
      double ab = 0;
      for (int64_t k = 0; k < K; k++) ab += (double)A[i * sai + k * sak] * (double)B[k * sbk + j * sbj];
      const double rest =
          (bias.empty() ? 0.0 : std::fabs(bias[j])) + (C.empty() ? 0.0 : std::fabs(C[i * N + j]));
      t[i * N + j] = kSumSlack * K + kU * (std::fabs(ab) + rest);
    }
  return t;
}

class Bf16Gemm : public MfBf16Twin {};

TEST_F(Bf16Gemm, LinearFwd) {
  uint64_t seed = 100;
  for (auto &s : kLinear) {
    const int64_t M = s[0], N = s[1], K = s[2];
    for (int acc = 0; acc < 2; acc++)
      for (int bias = 0; bias < 2; bias++) {
        const std::string what = label("linear_fwd M N K acc bias", {M, N, K, acc, bias});
        SCOPED_TRACE(what);
        const auto x = mf_test_bf16_values((size_t)(M * K), seed++),
                   w = mf_test_bf16_values((size_t)(N * K), seed++);
        const auto bv = bias ? mf_test_bf16_values((size_t)N, seed++) : std::vector<float>();
        const auto c0 = acc ? mf_test_bf16_values((size_t)(M * N), seed++) : std::vector<float>();
        Ops ops = {MfTwinOperand::of(x), MfTwinOperand::of(w), bias ? MfTwinOperand::of(bv) : MfTwinOperand(),
                   acc ? MfTwinOperand::of(c0) : out_start(0, M * N, seed++)};
        MfTwinResult r = run(call_of(MF_K_LINEAR_FWD, {M, N, K, acc}, what.c_str()), ops);
        // y = x W^T: a(i, k) = x[i K + k], b(k, j) = W[j K + k].
        const std::vector<double> slack = acc || bias ? product_slack(x, w, M, N, K, K, 1, 1, K, bv, c0)
                                                      : std::vector<double>{kSumSlack * K};
        EXPECT_TRUE(close_each(as_f32(r.gpu[3]), as_f32(r.cpu[3]), kUlp, slack));
      }
  }
}

TEST_F(Bf16Gemm, LinearBwdData) {
  uint64_t seed = 200;
  for (auto &s : kLinear) {
    const int64_t M = s[0], N = s[1], K = s[2];
    for (int acc = 0; acc < 2; acc++) {
      const std::string what = label("linear_bwd_data M N K acc", {M, N, K, acc});
      SCOPED_TRACE(what);
      const auto dy = mf_test_bf16_values((size_t)(M * N), seed++),
                 w = mf_test_bf16_values((size_t)(N * K), seed++);
      const auto c0 = acc ? mf_test_bf16_values((size_t)(M * K), seed++) : std::vector<float>();
      Ops ops = {MfTwinOperand::of(dy), MfTwinOperand::of(w),
                 acc ? MfTwinOperand::of(c0) : out_start(0, M * K, seed++)};
      MfTwinResult r = run(call_of(MF_K_LINEAR_BWD_DATA, {M, N, K, acc}, what.c_str()), ops);
      // dx = dy W: a(i, n) = dy[i N + n], b(n, k) = W[n K + k].
      const std::vector<double> slack =
          acc ? product_slack(dy, w, M, K, N, N, 1, K, 1, {}, c0) : std::vector<double>{kSumSlack * N};
      EXPECT_TRUE(close_each(as_f32(r.gpu[2]), as_f32(r.cpu[2]), kUlp, slack));
    }
  }
}

// dW and db start from fp32 values and stay fp32.
TEST_F(Bf16Gemm, LinearBwdWeightAddsToFp32) {
  uint64_t seed = 300;
  for (auto &s : kLinear) {
    const int64_t M = s[0], N = s[1], K = s[2];
    for (int bias = 0; bias < 2; bias++) {
      const std::string what = label("linear_bwd_weight M N K bias", {M, N, K, bias});
      SCOPED_TRACE(what);
      Ops ops = {bf16s(M * N, seed++), bf16s(M * K, seed++), MfTwinOperand::of(fp32_values(N * K, seed++)),
                 bias ? MfTwinOperand::of(fp32_values(N, seed++)) : MfTwinOperand()};
      MfTwinResult r = run(call_of(MF_K_LINEAR_BWD_WEIGHT, {M, N, K}, what.c_str()), ops);
      EXPECT_TRUE(close_each(as_f32(r.gpu[2]), as_f32(r.cpu[2]), 1e-5f, {kSumSlack * M})) << "dW";
      if (bias) {
        EXPECT_TRUE(close_each(as_f32(r.gpu[3]), as_f32(r.cpu[3]), 1e-5f, {kSumSlack * M})) << "db";
      }
    }
  }
}

// Offsets of R rows over E experts; the experts in `idle` get none.
std::vector<int64_t> expert_offsets(uint64_t seed, int64_t R, int64_t E, const std::vector<int> &idle) {
  std::vector<int> live;
  for (int e = 0; e < E; e++)
    if (std::find(idle.begin(), idle.end(), e) == idle.end()) live.push_back(e);
  std::mt19937 g((uint32_t)seed);
  std::uniform_int_distribution<size_t> d(0, live.size() - 1);
  std::vector<int64_t> counts((size_t)E, 0), off((size_t)E + 1, 0);
  for (int64_t r = 0; r < R; r++) counts[(size_t)live[d(g)]]++;
  for (int64_t e = 0; e < E; e++) off[(size_t)e + 1] = off[(size_t)e] + counts[(size_t)e];
  return off;
}

// {R rows, E, N, Kd} and the idle experts (no rows: their weights absent, NULL).
struct ExpertShape {
  int64_t R, E, N, Kd;
  std::vector<int> idle;
};
const ExpertShape kExpert[] = {
    {1, 1, 1, 1, {}}, {37, 5, 129, 65, {1, 4}}, {512, 16, 96, 128, {0, 7, 15}}, {200, 3, 70, 33, {0}}};

TEST_F(Bf16Gemm, Experts) {
  uint64_t seed = 400;
  for (const ExpertShape &s : kExpert) {
    const int64_t R = s.R, E = s.E, N = s.N, Kd = s.Kd;
    SCOPED_TRACE(label("experts R E N Kd", {R, E, N, Kd}));
    const std::vector<int64_t> off = expert_offsets(seed++, R, E, s.idle);
    // Expert weights (bf16 values) or dW (fp32 values); idle experts: NULL.
    auto weights = [&](bool bf16) {
      std::vector<std::vector<float>> w((size_t)E);
      for (int64_t e = 0; e < E; e++)
        if (off[(size_t)e + 1] > off[(size_t)e])
          w[(size_t)e] = bf16 ? mf_test_bf16_values((size_t)(N * Kd), seed++) : fp32_values(N * Kd, seed++);
      return w;
    };
    {
      Ops ops = {bf16s(R * Kd, seed++), MfTwinOperand::of(off), MfTwinOperand::of(nans((size_t)(R * N)))};
      MfTwinResult r = run(call_of(MF_K_EXPERT_FWD, {E, N, Kd}, "expert_fwd"), ops, weights(true));
      EXPECT_TRUE(close_each(as_f32(r.gpu[2]), as_f32(r.cpu[2]), kUlp, {kSumSlack * Kd})) << "expert_fwd";
    }
    {
      Ops ops = {bf16s(R * N, seed++), MfTwinOperand::of(off), MfTwinOperand::of(nans((size_t)(R * Kd)))};
      MfTwinResult r = run(call_of(MF_K_EXPERT_BWD_DATA, {E, N, Kd}, "expert_bwd_data"), ops, weights(true));
      EXPECT_TRUE(close_each(as_f32(r.gpu[2]), as_f32(r.cpu[2]), kUlp, {kSumSlack * N})) << "expert_bwd_data";
    }
    {
      Ops ops = {bf16s(R * N, seed++), bf16s(R * Kd, seed++), MfTwinOperand::of(off)};
      MfTwinResult r =
          run(call_of(MF_K_EXPERT_BWD_WEIGHT, {E, N, Kd}, "expert_bwd_weight"), ops, weights(false));
      ASSERT_EQ(r.gpu_experts.size(), (size_t)E);
      ASSERT_EQ(r.cpu_experts.size(), (size_t)E);
      for (int64_t e = 0; e < E; e++) {
        EXPECT_EQ(r.gpu_experts[(size_t)e].empty(), r.cpu_experts[(size_t)e].empty()) << "expert " << e;
        const int64_t rows = off[(size_t)e + 1] - off[(size_t)e];
        EXPECT_TRUE(close_each(as_f32(r.gpu_experts[(size_t)e]), as_f32(r.cpu_experts[(size_t)e]), 1e-5f,
                               {kSumSlack * (double)rows}))
            << "expert_bwd_weight, expert " << e;
      }
    }
  }
}

// g[t, v] = scale (softmax(h[t] . W^T)[v] - [v == target[t]]), 0 for ignored
// tokens, in double on the host: only to size the tolerances.
std::vector<double> ce_grad_host(const std::vector<float> &h, const std::vector<float> &W,
                                 const std::vector<int32_t> &target, int64_t T, int64_t V, int64_t H,
                                 double scale) {
  std::vector<double> g((size_t)(T * V), 0.0), l((size_t)V);
  for (int64_t t = 0; t < T; t++) {
    if (target[(size_t)t] < 0) continue;
    double mx = -INFINITY, sum = 0;
    for (int64_t v = 0; v < V; v++) {
      double s = 0;
      for (int64_t k = 0; k < H; k++) s += (double)h[(size_t)(t * H + k)] * W[(size_t)(v * H + k)];
      l[(size_t)v] = s;
      mx = std::max(mx, s);
    }
    for (int64_t v = 0; v < V; v++) sum += std::exp(l[(size_t)v] - mx);
    for (int64_t v = 0; v < V; v++)
      g[(size_t)(t * V + v)] =
          scale * (std::exp(l[(size_t)v] - mx) / sum - (v == target[(size_t)t] ? 1.0 : 0.0));
  }
  return g;
}

// {T, V, H, chunk}: ones, odd with a ragged last chunk, one chunk, the LM
// head's aspect ratio scaled down.
const int64_t kCe[][4] = {{1, 1, 1, 1}, {37, 1001, 65, 256}, {64, 300, 96, 300}, {96, 3000, 40, 512}};

TEST_F(Bf16Gemm, CrossEntropy) {
  uint64_t seed = 500;
  for (auto &s : kCe) {
    const int64_t T = s[0], V = s[1], H = s[2], chunk = s[3];
    const int64_t n_chunks = (V + chunk - 1) / chunk;
    for (int grads = 0; grads < 3; grads++) {  // none, dh only, dh and dW
      const std::string what = label("cross_entropy T V H chunk grads", {T, V, H, chunk, grads});
      SCOPED_TRACE(what);
      std::mt19937 g((uint32_t)seed++);
      std::uniform_int_distribution<int32_t> d(-1, (int32_t)V - 1);  // -1: ignored
      std::vector<int32_t> target((size_t)T);
      for (auto &t : target) t = d(g);
      if (T > 1) target[0] = -1;
      const std::vector<float> h = mf_test_bf16_values((size_t)(T * H), seed++, 2.0f),
                               W = mf_test_bf16_values((size_t)(V * H), seed++, 0.5f);
      const double scale = grads == 2 ? 1.0 / 1024 : 1.0;
      Ops ops = {MfTwinOperand::of(h),
                 MfTwinOperand::of(W),
                 MfTwinOperand::of(target),
                 MfTwinOperand::of(nans((size_t)(T * chunk))),  // ws: scratch, not compared
                 MfTwinOperand::of(nans((size_t)T)),
                 MfTwinOperand::of(std::vector<double>{NAN, NAN}),
                 grads >= 1 ? MfTwinOperand::of(nans((size_t)(T * H))) : MfTwinOperand(),
                 grads >= 2 ? MfTwinOperand::of(fp32_values(V * H, seed++)) : MfTwinOperand()};
      mf_kernel_call c = call_of(MF_K_CROSS_ENTROPY, {T, V, H, chunk}, what.c_str());
      c.f[0] = scale;
      MfTwinResult r = run(c, ops);

      EXPECT_TRUE(close_each(as_f32(r.gpu[4]), as_f32(r.cpu[4]), 1e-5f, {1e-4})) << "lse";
      const std::vector<double> sg = MfTwinResult::as<double>(r.gpu[5]),
                                sc = MfTwinResult::as<double>(r.cpu[5]);
      ASSERT_EQ(sg.size(), 2u);
      ASSERT_EQ(sc.size(), 2u);
      EXPECT_NEAR(sg[0], sc[0], 1e-5 * std::fabs(sc[0]) + 1e-4 * (double)T) << "loss_sum";
      EXPECT_EQ(sg[1], sc[1]) << "n_valid";
      if (grads == 0) continue;

      const std::vector<double> gh = ce_grad_host(h, W, target, T, V, H, scale);
      std::vector<double> atol_dh((size_t)(T * H), 0.0);
      for (int64_t t = 0; t < T; t++)
        for (int64_t v = 0; v < V; v++) {
          const double a = std::fabs(gh[(size_t)(t * V + v)]);
          for (int64_t k = 0; k < H; k++)
            atol_dh[(size_t)(t * H + k)] += a * std::fabs(W[(size_t)(v * H + k)]);
        }
      for (auto &a : atol_dh) a = 1.05 * (double)(n_chunks + 1) * kU * a + 1e-7;
      EXPECT_TRUE(close_each(as_f32(r.gpu[6]), as_f32(r.cpu[6]), kUlp, atol_dh)) << "dh";
      if (grads < 2) continue;

      std::vector<double> atol_dw((size_t)(V * H), 0.0);
      for (int64_t t = 0; t < T; t++)
        for (int64_t v = 0; v < V; v++) {
          const double a = std::fabs(gh[(size_t)(t * V + v)]);
          for (int64_t k = 0; k < H; k++)
            atol_dw[(size_t)(v * H + k)] += a * std::fabs(h[(size_t)(t * H + k)]);
        }
      for (auto &a : atol_dw) a = 1.05 * kU * a + kSumSlack * (double)T;
      EXPECT_TRUE(close_each(as_f32(r.gpu[7]), as_f32(r.cpu[7]), 1e-5f, atol_dw)) << "dW";
    }
  }
}

// Two runs of one call give the same bits, at a shape where cuBLASLt's
// heuristic splits K (a 64 x 64 output is a tile or two; 65536 deep): the bf16
// -> bf16 GEMM (LINEAR_FWD, reduced in fp32 in the workspace) and the bf16 ->
// fp32 one with beta = 1 (LINEAR_BWD_WEIGHT). Each run also matches the cpu.
TEST_F(Bf16Gemm, SplitKShapesAreDeterministic) {
  const int64_t D = 64, L = 65536;
  {
    Ops ops = {bf16s(D * L, 600), bf16s(D * L, 601), MfTwinOperand(),
               MfTwinOperand::of(nans((size_t)(D * D)))};
    const mf_kernel_call c = call_of(MF_K_LINEAR_FWD, {D, D, L, 0}, "linear_fwd 64x64x65536");
    MfTwinResult a = run(c, ops), b = run(c, ops);
    ASSERT_EQ(a.gpu[3].size(), (size_t)(D * D * 4));
    EXPECT_TRUE(a.gpu[3] == b.gpu[3]) << "linear_fwd: two runs differ";
    EXPECT_TRUE(close_each(as_f32(a.gpu[3]), as_f32(a.cpu[3]), kUlp, {kSumSlack * L}));
  }
  {
    Ops ops = {bf16s(L * D, 602), bf16s(L * D, 603), MfTwinOperand::of(fp32_values(D * D, 604)),
               MfTwinOperand()};
    const mf_kernel_call c = call_of(MF_K_LINEAR_BWD_WEIGHT, {L, D, D}, "linear_bwd_weight 65536x64x64");
    MfTwinResult a = run(c, ops), b = run(c, ops);
    ASSERT_EQ(a.gpu[2].size(), (size_t)(D * D * 4));
    EXPECT_TRUE(a.gpu[2] == b.gpu[2]) << "linear_bwd_weight: two runs differ";
    EXPECT_TRUE(close_each(as_f32(a.gpu[2]), as_f32(a.cpu[2]), 1e-5f, {kSumSlack * L}));
  }
}

}  // namespace
