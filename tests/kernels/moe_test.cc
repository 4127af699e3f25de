// Dispatch, gather, combine and the grouped expert GEMMs: invariants of the
// permutation, forwards against direct double references, every backward
// against finite differences, bit-identical results for pools of 1, 2 and 3
// workers, bf16-representable outputs with round_bf16, and experts with no
// rows leaving their gradients untouched.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "kernels/cpu/cpu_ops.h"
#include "tests/kernels/fd.h"
#include "tests/kernels/kernel_test_util.h"

namespace {

using mf_kt::bf16_representable;
using mf_kt::same_bits;

// Distinct experts per token, drawn from the first `used` experts.
std::vector<int32_t> random_topk(int64_t T, int64_t K, int64_t used, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> idx((size_t)(T * K));
  std::vector<int32_t> perm((size_t)used);
  for (int64_t t = 0; t < T; t++) {
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    for (int64_t j = 0; j < K; j++) idx[(size_t)(t * K + j)] = perm[(size_t)j];
  }
  return idx;
}

struct Dispatch {
  std::vector<int64_t> counts, offsets;
  std::vector<int32_t> row_of, token_of_row;
};

Dispatch dispatch(const std::vector<int32_t> &idx, int64_t T, int64_t K, int64_t E) {
  Dispatch d;
  d.counts.assign((size_t)E, -7);
  d.offsets.assign((size_t)E + 1, -7);
  d.row_of.assign((size_t)(T * K), -7);
  d.token_of_row.assign((size_t)(T * K), -7);
  EXPECT_EQ(mf_cpu_moe_dispatch(idx.data(), T, K, E, d.counts.data(), d.offsets.data(), d.row_of.data(),
                                d.token_of_row.data()),
            MF_OK);
  return d;
}

void check_dispatch_invariants(const std::vector<int32_t> &idx, int64_t T, int64_t K, int64_t E,
                               const Dispatch &d) {
  const int64_t R = T * K;
  int64_t sum = 0;
  ASSERT_EQ(d.offsets[0], 0);
  for (int64_t e = 0; e < E; e++) {
    EXPECT_GE(d.counts[(size_t)e], 0);
    EXPECT_EQ(d.offsets[(size_t)e + 1] - d.offsets[(size_t)e], d.counts[(size_t)e]);
    sum += d.counts[(size_t)e];
  }
  EXPECT_EQ(sum, R);
  EXPECT_EQ(d.offsets[(size_t)E], R);
  std::vector<int> seen((size_t)R, 0);
  std::vector<int64_t> last((size_t)E, -1);  // rows of one expert follow (token, choice) order
  for (int64_t i = 0; i < R; i++) {
    int32_t r = d.row_of[(size_t)i];
    ASSERT_GE(r, 0);
    ASSERT_LT(r, R);
    seen[(size_t)r]++;
    int32_t e = idx[(size_t)i];
    EXPECT_GE(r, d.offsets[(size_t)e]);
    EXPECT_LT(r, d.offsets[(size_t)e + 1]);
    EXPECT_GT(r, last[(size_t)e]);
    last[(size_t)e] = r;
    EXPECT_EQ(d.token_of_row[(size_t)r], i / K);
  }
  for (int64_t r = 0; r < R; r++) EXPECT_EQ(seen[(size_t)r], 1) << "row " << r;
  // Expert-major and dense: consecutive rows are filled expert by expert.
  for (int64_t e = 0; e < E; e++) {
    if (d.counts[(size_t)e]) {
      EXPECT_EQ(last[(size_t)e], d.offsets[(size_t)e + 1] - 1);
    }
  }
}

TEST(MoeDispatch, RandomRoutingIsABijection) {
  const int64_t T = 37, K = 3, E = 8;
  auto idx = random_topk(T, K, E, 1);
  auto d = dispatch(idx, T, K, E);
  check_dispatch_invariants(idx, T, K, E, d);
}

TEST(MoeDispatch, ExpertsWithNoTokens) {
  const int64_t T = 20, K = 2, E = 8;
  auto idx = random_topk(T, K, 4, 2);  // experts 4..7 get nothing
  auto d = dispatch(idx, T, K, E);
  check_dispatch_invariants(idx, T, K, E, d);
  for (int64_t e = 4; e < E; e++) EXPECT_EQ(d.counts[(size_t)e], 0);
  for (int64_t e = 4; e <= E; e++) EXPECT_EQ(d.offsets[(size_t)e], T * K);
}

TEST(MoeDispatch, AllTokensToOneExpert) {
  const int64_t T = 15, K = 1, E = 6;
  std::vector<int32_t> idx((size_t)T, 3);
  auto d = dispatch(idx, T, K, E);
  check_dispatch_invariants(idx, T, K, E, d);
  EXPECT_EQ(d.counts[3], T);
  for (int64_t t = 0; t < T; t++) EXPECT_EQ(d.row_of[(size_t)t], t);
}

TEST(MoeDispatch, NoTokensAndBadIndices) {
  Dispatch d;
  d.counts.assign(4, 9);
  d.offsets.assign(5, 9);
  ASSERT_EQ(mf_cpu_moe_dispatch(nullptr, 0, 2, 4, d.counts.data(), d.offsets.data(), nullptr, nullptr),
            MF_OK);
  for (int e = 0; e < 4; e++) EXPECT_EQ(d.counts[(size_t)e], 0);
  for (int e = 0; e <= 4; e++) EXPECT_EQ(d.offsets[(size_t)e], 0);
  std::vector<int32_t> bad = {0, 4};
  std::vector<int32_t> r(2), tr(2);
  EXPECT_EQ(mf_cpu_moe_dispatch(bad.data(), 1, 2, 4, d.counts.data(), d.offsets.data(), r.data(), tr.data()),
            MF_ERR_INVALID_ARG);
}

// ---------------------------------------------------------------- gather / combine

struct Routing {
  int64_t T, K, E, H;
  std::vector<int32_t> idx;
  Dispatch d;
};

Routing make_routing(int64_t T, int64_t K, int64_t E, int64_t H, int64_t used, uint32_t seed) {
  Routing r{T, K, E, H, random_topk(T, K, used, seed), {}};
  r.d = dispatch(r.idx, T, K, E);
  return r;
}

TEST(MoeGather, ForwardAndBackward) {
  auto rt = make_routing(19, 3, 7, 33, 7, 3);
  const int64_t R = rt.T * rt.K, H = rt.H;
  mf_kctx ctx = {nullptr, 0};
  auto x = mf_fd::random_vec((size_t)(rt.T * H), 4);
  std::vector<float> xe((size_t)(R * H));
  ASSERT_EQ(mf_cpu_moe_gather(x.data(), rt.d.token_of_row.data(), R, H, xe.data(), &ctx), MF_OK);
  for (int64_t r = 0; r < R; r++)
    for (int64_t h = 0; h < H; h++)
      ASSERT_EQ(xe[(size_t)(r * H + h)], x[(size_t)(rt.d.token_of_row[(size_t)r] * H + h)]);

  auto c = mf_fd::random_vec((size_t)(R * H), 5);
  std::vector<float> dx((size_t)(rt.T * H), 99.0f);
  ASSERT_EQ(mf_cpu_moe_gather_bwd(c.data(), rt.d.row_of.data(), rt.T, rt.K, H, dx.data(), 0, &ctx), MF_OK);
  auto loss = [&]() {
    std::vector<float> y((size_t)(R * H));
    mf_cpu_moe_gather(x.data(), rt.d.token_of_row.data(), R, H, y.data(), &ctx);
    return mf_fd::dot(c, y.data());
  };
  mf_fd::check_grad("gather dx", x, dx, loss, 1e-2, 128, 1e-3, 1e-4);

  // accumulate adds to what is there
  auto base = mf_fd::random_vec((size_t)(rt.T * H), 6);
  std::vector<float> acc = base;
  ASSERT_EQ(mf_cpu_moe_gather_bwd(c.data(), rt.d.row_of.data(), rt.T, rt.K, H, acc.data(), 1, &ctx), MF_OK);
  for (size_t i = 0; i < acc.size(); i++) EXPECT_NEAR(acc[i], base[i] + dx[i], 1e-5f);
}

TEST(MoeCombine, ForwardMatchesReferenceAndBackwardMatchesFiniteDifferences) {
  auto rt = make_routing(23, 2, 5, 300, 5, 7);  // H crosses the 256-column block
  const int64_t T = rt.T, K = rt.K, R = T * K, H = rt.H;
  mf_kctx ctx = {nullptr, 0};
  auto ye = mf_fd::random_vec((size_t)(R * H), 8);
  auto w = mf_fd::random_vec((size_t)(T * K), 9, 0.5f);
  auto y0 = mf_fd::random_vec((size_t)(T * H), 10);
  std::vector<float> y = y0;
  ASSERT_EQ(mf_cpu_moe_combine(ye.data(), w.data(), rt.d.row_of.data(), T, K, H, y.data(), &ctx), MF_OK);
  for (int64_t t = 0; t < T; t++)
    for (int64_t h = 0; h < H; h++) {
      double s = y0[(size_t)(t * H + h)];
      for (int64_t j = 0; j < K; j++)
        s += (double)w[(size_t)(t * K + j)] * ye[(size_t)(rt.d.row_of[(size_t)(t * K + j)] * H + h)];
      ASSERT_NEAR(y[(size_t)(t * H + h)], s, 1e-5 * (1 + std::fabs(s)));
    }

  auto c = mf_fd::random_vec((size_t)(T * H), 11);
  std::vector<float> dye((size_t)(R * H), 77.0f), dw((size_t)(T * K), 77.0f);
  ASSERT_EQ(mf_cpu_moe_combine_bwd(c.data(), ye.data(), w.data(), rt.d.row_of.data(), T, K, H, dye.data(),
                                   dw.data(), &ctx),
            MF_OK);
  auto loss = [&]() {
    std::vector<float> out((size_t)(T * H), 0.0f);
    mf_cpu_moe_combine(ye.data(), w.data(), rt.d.row_of.data(), T, K, H, out.data(), &ctx);
    return mf_fd::dot(c, out.data());
  };
  mf_fd::check_grad("combine dye", ye, dye, loss, 1e-2, 128, 1e-3, 1e-4);
  mf_fd::check_grad("combine dw", w, dw, loss, 1e-2, 64, 1e-3, 1e-3);
}

// ------------------------------------------------------------ grouped GEMM

struct Experts {
  int64_t E, N, Kd;
  std::vector<int64_t> offsets;
  std::vector<std::vector<float>> W;  // empty for experts with no rows
  std::vector<const float *> Wp;
  int64_t R() const { return offsets[(size_t)E]; }
};

// counts per expert given explicitly (zeros and multiples of the tiles included).
Experts make_experts(const std::vector<int64_t> &counts, int64_t N, int64_t Kd, uint32_t seed) {
  Experts x{(int64_t)counts.size(), N, Kd, {0}, {}, {}};
  for (size_t e = 0; e < counts.size(); e++) {
    x.offsets.push_back(x.offsets.back() + counts[e]);
    x.W.push_back(counts[e] ? mf_fd::random_vec((size_t)(N * Kd), seed + (uint32_t)e, 0.2f)
                            : std::vector<float>());
  }
  for (auto &w : x.W) x.Wp.push_back(w.empty() ? nullptr : w.data());
  return x;
}

int64_t expert_of_row(const Experts &x, int64_t r) {
  int64_t e = 0;
  while (x.offsets[(size_t)e + 1] <= r) e++;
  return e;
}

const std::vector<int64_t> kCounts = {70, 0, 5, 129, 0, 1, 64};

TEST(ExpertLinear, ForwardAndBackwardMatchDoubleReferences) {
  auto x = make_experts(kCounts, 37, 300, 100);  // Kd crosses the 256-deep block
  const int64_t R = x.R(), N = x.N, Kd = x.Kd;
  mf_kctx ctx = {nullptr, 0};
  auto xe = mf_fd::random_vec((size_t)(R * Kd), 12);
  std::vector<float> ye((size_t)(R * N), 55.0f);
  ASSERT_EQ(mf_cpu_expert_fwd(xe.data(), x.Wp.data(), x.offsets.data(), R, x.E, N, Kd, ye.data(), &ctx),
            MF_OK);
  auto dye = mf_fd::random_vec((size_t)(R * N), 13);
  std::vector<float> dxe((size_t)(R * Kd), 55.0f);
  ASSERT_EQ(
      mf_cpu_expert_bwd_data(dye.data(), x.Wp.data(), x.offsets.data(), R, x.E, N, Kd, dxe.data(), &ctx),
      MF_OK);
  std::vector<std::vector<float>> dW(x.W.size());
  std::vector<float *> dWp;
  for (size_t e = 0; e < x.W.size(); e++) {
    dW[e] = x.W[e].empty() ? std::vector<float>() : mf_fd::random_vec((size_t)(N * Kd), 200 + (uint32_t)e);
    dWp.push_back(dW[e].empty() ? nullptr : dW[e].data());
  }
  auto dW0 = dW;
  ASSERT_EQ(mf_cpu_expert_bwd_weight(dye.data(), xe.data(), x.offsets.data(), x.E, N, Kd, dWp.data(), &ctx),
            MF_OK);

  for (int64_t r = 0; r < R; r++) {
    const float *W = x.Wp[(size_t)expert_of_row(x, r)];
    for (int64_t n = 0; n < N; n++) {
      const double s = mf_kt::ref_dot(xe.data() + r * Kd, 1, W + n * Kd, 1, Kd);
      ASSERT_NEAR(ye[(size_t)(r * N + n)], s, 1e-5 * (1 + std::fabs(s))) << r << "," << n;
    }
    for (int64_t k = 0; k < Kd; k++) {
      const double s = mf_kt::ref_dot(dye.data() + r * N, 1, W + k, Kd, N);
      ASSERT_NEAR(dxe[(size_t)(r * Kd + k)], s, 1e-5 * (1 + std::fabs(s))) << r << "," << k;
    }
  }
  for (int64_t e = 0; e < x.E; e++) {
    if (dW[(size_t)e].empty()) continue;
    const int64_t r0 = x.offsets[(size_t)e], rows = x.offsets[(size_t)e + 1] - r0;
    for (int64_t n = 0; n < N; n++)
      for (int64_t k = 0; k < Kd; k++) {
        const double s = mf_kt::ref_dot(dye.data() + r0 * N + n, N, xe.data() + r0 * Kd + k, Kd, rows,
                                        dW0[(size_t)e][(size_t)(n * Kd + k)]);
        ASSERT_NEAR(dW[(size_t)e][(size_t)(n * Kd + k)], s, 1e-5 * (1 + std::fabs(s)))
            << e << "," << n << "," << k;
      }
  }
}

TEST(ExpertLinear, BackwardMatchesFiniteDifferences) {
  auto x = make_experts({9, 0, 3, 17, 1}, 11, 13, 300);
  const int64_t R = x.R(), N = x.N, Kd = x.Kd;
  mf_kctx ctx = {nullptr, 0};
  auto xe = mf_fd::random_vec((size_t)(R * Kd), 14);
  auto c = mf_fd::random_vec((size_t)(R * N), 15);
  auto loss = [&]() {
    std::vector<float> ye((size_t)(R * N));
    mf_cpu_expert_fwd(xe.data(), x.Wp.data(), x.offsets.data(), R, x.E, N, Kd, ye.data(), &ctx);
    return mf_fd::dot(c, ye.data());
  };
  std::vector<float> dxe((size_t)(R * Kd));
  ASSERT_EQ(mf_cpu_expert_bwd_data(c.data(), x.Wp.data(), x.offsets.data(), R, x.E, N, Kd, dxe.data(), &ctx),
            MF_OK);
  mf_fd::check_grad("expert dxe", xe, dxe, loss, 1e-2, 128, 1e-3, 1e-4);

  std::vector<std::vector<float>> dW(x.W.size());
  std::vector<float *> dWp;
  for (size_t e = 0; e < x.W.size(); e++) {
    if (!x.W[e].empty()) dW[e].assign((size_t)(N * Kd), 0.0f);
    dWp.push_back(dW[e].empty() ? nullptr : dW[e].data());
  }
  ASSERT_EQ(mf_cpu_expert_bwd_weight(c.data(), xe.data(), x.offsets.data(), x.E, N, Kd, dWp.data(), &ctx),
            MF_OK);
  for (size_t e = 0; e < x.W.size(); e++) {
    if (x.W[e].empty()) continue;
    mf_fd::check_grad("expert dW[" + std::to_string(e) + "]", x.W[e], dW[e], loss, 1e-2, 64, 1e-3, 1e-4);
  }
}

TEST(ExpertLinear, ExpertWithNoRowsKeepsItsGradientBitForBit) {
  auto x = make_experts({6, 0, 4, 0}, 9, 10, 400);
  const int64_t R = x.R(), N = x.N, Kd = x.Kd;
  // Expert 1 has no rows but a weight and a gradient; expert 3 has neither (NULL).
  std::vector<float> w1 = mf_fd::random_vec((size_t)(N * Kd), 401);
  x.Wp[1] = w1.data();
  mf_kctx ctx = {nullptr, 0};
  auto xe = mf_fd::random_vec((size_t)(R * Kd), 16);
  auto dye = mf_fd::random_vec((size_t)(R * N), 17);
  std::vector<float> g0((size_t)(N * Kd)), g1((size_t)(N * Kd)), g2((size_t)(N * Kd));
  for (size_t i = 0; i < g1.size(); i++) {
    uint32_t bits = 0x7fc01234u + (uint32_t)i;  // NaN payloads: any write would show
    std::memcpy(&g1[i], &bits, 4);
  }
  std::vector<float> g1_before = g1;
  std::vector<float *> dWp = {g0.data(), g1.data(), g2.data(), nullptr};
  ASSERT_EQ(mf_cpu_expert_bwd_weight(dye.data(), xe.data(), x.offsets.data(), x.E, N, Kd, dWp.data(), &ctx),
            MF_OK);
  EXPECT_TRUE(same_bits(g1, g1_before));
  std::vector<float> ye((size_t)(R * N)), dxe((size_t)(R * Kd));
  EXPECT_EQ(mf_cpu_expert_fwd(xe.data(), x.Wp.data(), x.offsets.data(), R, x.E, N, Kd, ye.data(), &ctx),
            MF_OK);
  EXPECT_EQ(
      mf_cpu_expert_bwd_data(dye.data(), x.Wp.data(), x.offsets.data(), R, x.E, N, Kd, dxe.data(), &ctx),
      MF_OK);
  // No rows at all: nothing is touched.
  std::vector<int64_t> none = {0, 0, 0, 0, 0};
  EXPECT_EQ(mf_cpu_expert_bwd_weight(dye.data(), xe.data(), none.data(), 4, N, Kd, dWp.data(), &ctx), MF_OK);
  EXPECT_TRUE(same_bits(g1, g1_before));
}

// An expert with rows and no weights (NULL: a cold expert's LoRA adapter under
// train.lora.experts hot): its rows come out +0 from the forward and the data
// backward, its gradient is not asked for (NULL) and nothing else is touched;
// the other experts' rows are those of a call where it had weights.
TEST(ExpertLinear, ExpertWithRowsButNoWeightsGivesZeroRows) {
  auto x = make_experts({5, 7, 0, 3}, 9, 10, 500);
  const int64_t R = x.R(), N = x.N, Kd = x.Kd;
  mf_kctx ctx = {nullptr, 0};
  auto xe = mf_fd::random_vec((size_t)(R * Kd), 18);
  auto dye = mf_fd::random_vec((size_t)(R * N), 19);
  std::vector<float> ye_all((size_t)(R * N)), dxe_all((size_t)(R * Kd));
  ASSERT_EQ(mf_cpu_expert_fwd(xe.data(), x.Wp.data(), x.offsets.data(), R, x.E, N, Kd, ye_all.data(), &ctx),
            MF_OK);
  ASSERT_EQ(
      mf_cpu_expert_bwd_data(dye.data(), x.Wp.data(), x.offsets.data(), R, x.E, N, Kd, dxe_all.data(), &ctx),
      MF_OK);
  std::vector<const float *> cold = x.Wp;
  cold[1] = nullptr;  // expert 1 has 7 rows
  std::vector<float> ye((size_t)(R * N), NAN), dxe((size_t)(R * Kd), NAN);
  ASSERT_EQ(mf_cpu_expert_fwd(xe.data(), cold.data(), x.offsets.data(), R, x.E, N, Kd, ye.data(), &ctx),
            MF_OK);
  ASSERT_EQ(
      mf_cpu_expert_bwd_data(dye.data(), cold.data(), x.offsets.data(), R, x.E, N, Kd, dxe.data(), &ctx),
      MF_OK);
  // Rows of width w: expert 1's +0, the others' the bits of the call with its weights.
  auto check = [&](const std::vector<float> &got, const std::vector<float> &all, int64_t w,
                   const char *what) {
    for (int64_t r = 0; r < R; r++)
      for (int64_t j = 0; j < w; j++) {
        const float v = got[(size_t)(r * w + j)];
        if (expert_of_row(x, r) == 1)
          ASSERT_TRUE(v == 0.0f && !std::signbit(v)) << what << " row " << r;
        else
          ASSERT_EQ(memcmp(&v, &all[(size_t)(r * w + j)], 4), 0) << what << " row " << r;
      }
  };
  check(ye, ye_all, N, "ye");
  check(dxe, dxe_all, Kd, "dxe");
  std::vector<float> g0((size_t)(N * Kd), 0.0f), g3((size_t)(N * Kd), 0.0f);
  std::vector<float *> dWp = {g0.data(), nullptr, nullptr, g3.data()};
  EXPECT_EQ(mf_cpu_expert_bwd_weight(dye.data(), xe.data(), x.offsets.data(), x.E, N, Kd, dWp.data(), &ctx),
            MF_OK);
}

// ------------------------------------------------ pools and bf16 rounding

struct AllOutputs {
  std::vector<float> xe, dx, y, dye_c, dw, ye, dxe;
  std::vector<std::vector<float>> dW;
};

AllOutputs run_all(const mf_kctx &ctx, uint32_t seed) {
  const int64_t T = 67, K = 2, E = 6, H = 40, I = 70;
  auto rt = make_routing(T, K, E, H, 5, seed);  // expert 5 gets nothing
  const int64_t R = T * K;
  Experts up = make_experts(std::vector<int64_t>(rt.d.counts.begin(), rt.d.counts.end()), I, H, seed + 10);
  AllOutputs o;
  auto x = mf_fd::random_vec((size_t)(T * H), seed + 1);
  o.xe.assign((size_t)(R * H), 0.0f);
  EXPECT_EQ(mf_cpu_moe_gather(x.data(), rt.d.token_of_row.data(), R, H, o.xe.data(), &ctx), MF_OK);
  o.ye.assign((size_t)(R * I), 0.0f);
  EXPECT_EQ(mf_cpu_expert_fwd(o.xe.data(), up.Wp.data(), up.offsets.data(), R, E, I, H, o.ye.data(), &ctx),
            MF_OK);
  auto dye = mf_fd::random_vec((size_t)(R * I), seed + 2);
  o.dxe.assign((size_t)(R * H), 0.0f);
  EXPECT_EQ(
      mf_cpu_expert_bwd_data(dye.data(), up.Wp.data(), up.offsets.data(), R, E, I, H, o.dxe.data(), &ctx),
      MF_OK);
  o.dW.resize((size_t)E);
  std::vector<float *> dWp;
  for (int64_t e = 0; e < E; e++) {
    if (!up.W[(size_t)e].empty()) o.dW[(size_t)e] = mf_fd::random_vec((size_t)(I * H), seed + 3);
    dWp.push_back(o.dW[(size_t)e].empty() ? nullptr : o.dW[(size_t)e].data());
  }
  EXPECT_EQ(mf_cpu_expert_bwd_weight(dye.data(), o.xe.data(), up.offsets.data(), E, I, H, dWp.data(), &ctx),
            MF_OK);
  o.dx = mf_fd::random_vec((size_t)(T * H), seed + 4);
  EXPECT_EQ(mf_cpu_moe_gather_bwd(o.dxe.data(), rt.d.row_of.data(), T, K, H, o.dx.data(), 1, &ctx), MF_OK);
  auto ye2 = mf_fd::random_vec((size_t)(R * H), seed + 5);
  auto w = mf_fd::random_vec((size_t)(T * K), seed + 6);
  o.y = mf_fd::random_vec((size_t)(T * H), seed + 7);
  EXPECT_EQ(mf_cpu_moe_combine(ye2.data(), w.data(), rt.d.row_of.data(), T, K, H, o.y.data(), &ctx), MF_OK);
  auto dy = mf_fd::random_vec((size_t)(T * H), seed + 8);
  o.dye_c.assign((size_t)(R * H), 0.0f);
  o.dw.assign((size_t)(T * K), 0.0f);
  EXPECT_EQ(mf_cpu_moe_combine_bwd(dy.data(), ye2.data(), w.data(), rt.d.row_of.data(), T, K, H,
                                   o.dye_c.data(), o.dw.data(), &ctx),
            MF_OK);
  return o;
}

TEST(MoeKernels, BitIdenticalAcrossPoolSizes) {
  for (int round = 0; round <= 1; round++) {
    AllOutputs ref;
    for (int n = 1; n <= 3; n++) {
      mf_kt::Pool pool(n);
      ASSERT_EQ(pool.status, MF_OK);
      mf_kctx ctx = {pool.p, round};
      AllOutputs o = run_all(ctx, 500);
      if (n == 1) {
        ref = o;
        continue;
      }
      EXPECT_TRUE(same_bits(o.xe, ref.xe)) << n;
      EXPECT_TRUE(same_bits(o.ye, ref.ye)) << n;
      EXPECT_TRUE(same_bits(o.dxe, ref.dxe)) << n;
      EXPECT_TRUE(same_bits(o.dx, ref.dx)) << n;
      EXPECT_TRUE(same_bits(o.y, ref.y)) << n;
      EXPECT_TRUE(same_bits(o.dye_c, ref.dye_c)) << n;
      EXPECT_TRUE(same_bits(o.dw, ref.dw)) << n;
      for (size_t e = 0; e < o.dW.size(); e++) EXPECT_TRUE(same_bits(o.dW[e], ref.dW[e])) << n << " dW " << e;
    }
  }
}

TEST(MoeKernels, RoundBf16OutputsAreRepresentable) {
  mf_kctx plain = {nullptr, 0}, rounded = {nullptr, 1};
  AllOutputs p = run_all(plain, 600), r = run_all(rounded, 600);
  EXPECT_FALSE(bf16_representable(p.ye)) << "the fp32 run should not be bf16 already";
  EXPECT_TRUE(bf16_representable(r.xe));
  EXPECT_TRUE(bf16_representable(r.ye));
  EXPECT_TRUE(bf16_representable(r.dxe));
  EXPECT_TRUE(bf16_representable(r.dx));
  EXPECT_TRUE(bf16_representable(r.y));
  EXPECT_TRUE(bf16_representable(r.dye_c));
  // Routing-weight gradients stay fp32: the same bits as the fp32 run.
  EXPECT_TRUE(same_bits(r.dw, p.dw));
  EXPECT_FALSE(bf16_representable(r.dw));
}

}  // namespace

namespace {

// The weight gradient in parts (expert parallelism's rows by source rank):
// each part summed from zero in row order, then added into dW in part order —
// the bits of one rank computing each part as a micro-batch's gradient on a
// zeroed slot and adding it to the sum. Parts of 0 rows, an expert without
// rows, 1 and 2 threads; and unlike the one-pass sum (else the test shows
// nothing).
TEST(ExpertLinear, WeightGradientInPartsIsEachPartSummedThenAdded) {
  const std::vector<int64_t> counts = {70, 0, 37, 9};
  const int64_t S = 3;  // sources
  // Expert e's rows split into S parts: sizes per (expert, source)
  const std::vector<std::vector<int64_t>> parts = {{30, 0, 40}, {0, 0, 0}, {1, 35, 1}, {0, 9, 0}};
  auto x = make_experts(counts, 21, 70, 700);
  const int64_t R = x.R(), N = x.N, Kd = x.Kd;
  std::vector<int64_t> seg = {0};
  for (size_t e = 0; e < counts.size(); e++)
    for (int64_t s = 0; s < S; s++) seg.push_back(seg.back() + parts[e][(size_t)s]);
  // a part's bound is the next part's start: seg has E S + 1 entries
  ASSERT_EQ(seg.size(), counts.size() * S + 1);
  auto dye = mf_fd::random_vec((size_t)(R * N), 701);
  auto xe = mf_fd::random_vec((size_t)(R * Kd), 702);
  const size_t E = counts.size();
  auto start = [&](uint32_t seed) {
    std::vector<std::vector<float>> dW(E);
    for (size_t e = 0; e < E; e++) dW[e] = mf_fd::random_vec((size_t)(N * Kd), seed + (uint32_t)e);
    return dW;
  };
  auto ptrs = [](std::vector<std::vector<float>> &dW) {
    std::vector<float *> p;
    for (auto &w : dW) p.push_back(w.data());
    return p;
  };
  // The reference: each part on a zeroed gradient by the one-pass kernel, then added.
  auto ref = start(710);
  mf_kctx one = {nullptr, 0};
  for (int64_t s = 0; s < S; s++) {
    std::vector<int64_t> offs = {0};
    for (size_t e = 0; e < E; e++) offs.push_back(0);
    // part s of each expert as its own group: rows [seg[e S + s], seg[e S + s + 1])
    std::vector<std::vector<float>> part(E, std::vector<float>((size_t)(N * Kd), 0.0f));
    for (size_t e = 0; e < E; e++) {
      std::vector<int64_t> o(E + 1, seg[e * S + s]);
      for (size_t q = e + 1; q <= E; q++) o[q] = seg[e * S + s + 1];
      std::vector<float *> pp(E, nullptr);
      pp[e] = part[e].data();
      ASSERT_EQ(mf_cpu_expert_bwd_weight(dye.data(), xe.data(), o.data(), (int64_t)E, N, Kd, pp.data(), &one),
                MF_OK);
      for (size_t i = 0; i < part[e].size(); i++) ref[e][i] += part[e][i];
    }
  }
  for (int n = 1; n <= 2; n++) {
    mf_kt::Pool pool(n);
    ASSERT_EQ(pool.status, MF_OK);
    mf_kctx ctx = {pool.p, 0};
    auto got = start(710);
    auto gp = ptrs(got);
    ASSERT_EQ(mf_cpu_expert_bwd_weight_parts(dye.data(), xe.data(), x.offsets.data(), seg.data(), (int64_t)E,
                                             N, Kd, S, gp.data(), &ctx),
              MF_OK);
    for (size_t e = 0; e < E; e++) EXPECT_TRUE(same_bits(got[e], ref[e])) << n << " threads, expert " << e;
  }
  auto whole = start(710);
  auto wp = ptrs(whole);
  ASSERT_EQ(
      mf_cpu_expert_bwd_weight(dye.data(), xe.data(), x.offsets.data(), (int64_t)E, N, Kd, wp.data(), &one),
      MF_OK);
  EXPECT_FALSE(same_bits(whole[0], ref[0]))
      << "the parts give the one-pass sum's bits: the test shows nothing";
  // Parts that do not cover an expert's rows are refused.
  auto bad = seg;
  bad[2] = bad[1] - 1;  // expert 0's second part starts before its first ends
  EXPECT_EQ(mf_cpu_expert_bwd_weight_parts(dye.data(), xe.data(), x.offsets.data(), bad.data(), (int64_t)E, N,
                                           Kd, S, wp.data(), &one),
            MF_ERR_INVALID_ARG);
  EXPECT_NE(std::string(mf_last_error()).find("parts"), std::string::npos) << mf_last_error();
}

}  // namespace
