// The routing kernels of the cuda backend with BF16 storage against the cpu
// backend with round_bf16 (tests/cuda/bf16_twin.h): router fwd/bwd, dispatch,
// gather, combine and their backward. Inputs are bf16-representable, so both
// sides start from the same numbers and compute in fp32; they differ only in
// the order of fp32 sums, fma contraction on the device, the device expf, and
// where a side stores fp32 that the other rounds to bf16.
//
// Tolerances, per element |gpu - cpu| <= atol + rtol * |cpu| (why):
//   dispatch: every output equal (integers; the row order inside an expert is
//     the token order, on a skewed routing over many tiles too).
//   moe_gather, moe_gather_bwd, combine_bwd's dye: equal bits — a copy, sums of
//     plain adds in j order, one product: the same IEEE operations on both
//     sides, then one rounding of the same fp32 value.
//   router_fwd probs, topk_w: fp32 on both sides, rtol 1e-5 (the device expf and
//     the host's are a few ulps apart); topk_idx equal (logits spaced far beyond
//     that, plus rows of exact ties: the tie rule must agree).
//   kBf16Ulp = 2^-7 for every bf16 output that the two sides form in fp32 in a
//     different order (combine; router_bwd's dlogits, combine_bwd's dw, which
//     the cpu may also keep in fp32): two fp32 values a few ulps apart can round
//     to neighbouring bf16 values, one bf16 ulp, at most 2^-7 of the value (8
//     significant bits, at the bottom of a binade); plus an atol for the fp32
//     difference itself where the value is formed by cancellation.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "tests/cuda/bf16_twin.h"

namespace {

constexpr float kBf16Ulp = 1.0f / 128.0f;

using Op = MfTwinOperand;
using Res = MfTwinResult;

mf_kernel_call call_of(mf_kernel kind, std::initializer_list<int64_t> i, const std::string &label) {
  mf_kernel_call c = {};
  c.kind = kind;
  int j = 0;
  for (int64_t v : i) c.i[j++] = v;
  c.label = label.c_str();
  return c;
}

std::string shape(const char *op, std::initializer_list<int64_t> dims) {
  std::string s = op;
  for (int64_t d : dims) s += " " + std::to_string(d);
  return s;
}

std::vector<float> f32_of(const Res &r, int j, bool gpu) {
  return Res::as<float>(gpu ? r.gpu[j] : r.cpu[j]);
}

// K distinct experts of E per token, each drawn with the given weights (a
// repeat is drawn again); weights of 1: uniform, and K = E: a permutation.
std::vector<int32_t> draw_topk(std::mt19937 &rng, int64_t T, int64_t E, int64_t K,
                               const std::vector<double> &wt) {
  std::discrete_distribution<int32_t> pick(wt.begin(), wt.end());
  std::vector<int32_t> v((size_t)(T * K));
  for (int64_t t = 0; t < T; t++) {
    const auto row = v.begin() + t * K;
    for (int64_t j = 0; j < K;) {
      const int32_t e = pick(rng);
      if (std::find(row, row + j, e) == row + j) row[j++] = e;
    }
  }
  return v;
}
std::vector<int32_t> uniform_topk(std::mt19937 &rng, int64_t T, int64_t E, int64_t K) {
  return draw_topk(rng, T, E, K, std::vector<double>((size_t)E, 1.0));
}
// Weights (e+1)^-1.5 over the first 4/5 of the experts: a few experts take
// most rows, the rest none.
std::vector<int32_t> skewed_topk(std::mt19937 &rng, int64_t T, int64_t E, int64_t K) {
  std::vector<double> wt((size_t)E, 0.0);
  for (int64_t e = 0; e < E * 4 / 5; e++) wt[(size_t)e] = std::pow((double)(e + 1), -1.5);
  return draw_topk(rng, T, E, K, wt);
}

// Router logits, exact in bf16 for E <= 128 (multiples of 1/16 below 8): a row
// is a permutation of E steps of 1/16 around a shift — far apart beyond the
// ulps of expf — except every third row: all tied (row % 3 == 1) or tied in
// pairs (row % 3 == 2).
std::vector<float> router_logits(std::mt19937 &rng, int64_t T, int64_t E) {
  const std::vector<int32_t> perm = uniform_topk(rng, T, E, E);
  std::vector<float> l(perm.size());
  for (size_t x = 0; x < l.size(); x++) {
    const int64_t t = (int64_t)x / E, kind = t % 3;
    const float shift = (float)(t % 49 - 24) / 16.0f;
    const int32_t rank = kind == 2 ? perm[x] / 2 : perm[x] - (int32_t)E / 2;
    l[x] = kind == 1 ? 0.5f : shift + 0.0625f * (float)rank;
  }
  return l;
}

class Bf16Routing : public MfBf16Twin {
 protected:
  // Operand j equal on both sides, byte for byte.
  static void expect_equal(const Res &r, int j, const char *what) {
    EXPECT_EQ(r.cpu[j].size(), r.gpu[j].size()) << what;
    EXPECT_TRUE(r.cpu[j] == r.gpu[j]) << what << ": cuda and cpu differ";
  }
  // Dispatch of topk on both sides: every output equal. Returns both.
  Res dispatch(const std::vector<int32_t> &topk, int64_t T, int64_t K, int64_t E, const std::string &name) {
    SCOPED_TRACE(name);
    const size_t R = (size_t)(T * K);
    Res r = run(call_of(MF_K_MOE_DISPATCH, {T, K, E}, name),
                {Op::of(topk), Op::of(std::vector<int64_t>((size_t)E, -7)),
                 Op::of(std::vector<int64_t>((size_t)E + 1, -7)), Op::of(std::vector<int32_t>(R, -7)),
                 Op::of(std::vector<int32_t>(R, -7))});
    expect_equal(r, 1, "counts");
    expect_equal(r, 2, "offsets");
    expect_equal(r, 3, "row_of");
    expect_equal(r, 4, "token_of_row");
    return r;
  }
  // The router forward of logits on both sides (compared); the cpu's outputs
  // (probs, topk_idx, topk_w) are the backward's inputs.
  Res router_fwd(const std::vector<float> &logits, int64_t T, int64_t E, int64_t K, int norm) {
    const std::string name = shape("router_fwd", {T, E, K, norm});
    SCOPED_TRACE(name);
    Res r = run(call_of(MF_K_ROUTER_FWD, {T, E, K, norm}, name),
                {Op::of(logits), Op::of(std::vector<float>((size_t)(T * E), NAN)),
                 Op::of(std::vector<int32_t>((size_t)(T * K), -7)),
                 Op::of(std::vector<float>((size_t)(T * K), NAN))});
    EXPECT_TRUE(mf_test_close(f32_of(r, 1, true), f32_of(r, 1, false), 1e-5f, 1e-7f)) << "probs";
    expect_equal(r, 2, "topk_idx");
    EXPECT_TRUE(mf_test_close(f32_of(r, 3, true), f32_of(r, 3, false), 1e-5f, 1e-7f)) << "topk_w";
    return r;
  }
  void gather(const Res &rt, int64_t T, int64_t K, int64_t H, std::mt19937 &rng);
  void combine(const Res &rt, int64_t T, int64_t K, int64_t H, std::mt19937 &rng);
};

const int64_t kRouter[][3] = {{1, 4, 4}, {37, 8, 2}, {300, 64, 8}, {129, 60, 4}, {512, 128, 8}};

TEST_F(Bf16Routing, RouterFwdAndBwd) {
  std::mt19937 rng(1);
  for (auto &s : kRouter) {
    const int64_t T = s[0], E = s[1], K = s[2];
    for (int norm = 0; norm < 2; norm++) {
      const Res f = router_fwd(router_logits(rng, T, E), T, E, K, norm);
      for (int extra = 0; extra < 2; extra++) {
        const std::string name = shape("router_bwd", {T, E, K, norm, extra});
        SCOPED_TRACE(name);
        std::vector<float> dprobs;
        if (extra) {
          std::uniform_real_distribution<float> d(-0.1f, 0.1f);
          dprobs.resize((size_t)(T * E));
          for (auto &x : dprobs) x = d(rng);
        }
        Res r = run(
            call_of(MF_K_ROUTER_BWD, {T, E, K, norm}, name),
            {Op{f.cpu[1]}, Op{f.cpu[2]}, Op{f.cpu[3]}, Op::of(mf_test_bf16_values((size_t)(T * K), rng())),
             Op::of(dprobs), Op::of(std::vector<float>((size_t)(T * E), NAN))});
        // atol: dl = p*(dp - sum_e p*dp). The terms p*dp of the chosen experts
        // are at most ~2 (p <= S), the others tiny; gw and the sum, fma-
        // contracted on the device, leave fp32 differences of a few 1e-7.
        EXPECT_TRUE(mf_test_close(f32_of(r, 5, true), f32_of(r, 5, false), kBf16Ulp, 1e-5f)) << "dlogits";
      }
    }
  }
}

TEST_F(Bf16Routing, DispatchSmallAndTileEdges) {
  std::mt19937 rng(3);
  // (T, K, E): one row; more experts than rows (one tile); just over one tile
  // (256 entries at E = 128); two tiles with E large against the rows.
  const int64_t shapes[][3] = {{1, 1, 1},      {3, 4, 64},     {129, 2, 128},
                               {1000, 8, 128}, {300, 8, 1024}, {1000, 2, 600}};
  for (auto &s : shapes) {
    const int64_t T = s[0], K = s[1], E = s[2];
    dispatch(uniform_topk(rng, T, E, K), T, K, E, shape("moe_dispatch", {T, K, E}));
  }
  const int64_t T = 700;
  dispatch(std::vector<int32_t>((size_t)T, 2), T, 1, 4, "moe_dispatch all to expert 2");
}

TEST_F(Bf16Routing, DispatchSkewedAtScale) {
  std::mt19937 rng(4);
  const int64_t T = 4096, K = 8, E = 128;
  dispatch(skewed_topk(rng, T, E, K), T, K, E, "moe_dispatch 4096 8 128 skewed");
  // Every token to experts 0..K-1 in a shuffled order: K experts own every row.
  std::vector<int32_t> same((size_t)(T * K));
  std::vector<int32_t> first((size_t)K);
  std::iota(first.begin(), first.end(), 0);
  for (int64_t t = 0; t < T; t++) {
    std::shuffle(first.begin(), first.end(), rng);
    std::copy(first.begin(), first.end(), same.begin() + t * K);
  }
  dispatch(same, T, K, E, "moe_dispatch 4096 8 128 all to 8 experts");
}

// H: one; unaligned rows (7: 14-byte bf16 rows); aligned rows with a tail; whole vectors.
const int64_t kHidden[] = {1, 7, 129, 1024};
const int64_t kMoe[][3] = {{1, 2, 16}, {37, 2, 8}, {300, 4, 60}, {512, 8, 128}};

// Gather and its backward along the routing rt (a dispatch result): equal bits.
void Bf16Routing::gather(const Res &rt, int64_t T, int64_t K, int64_t H, std::mt19937 &rng) {
  const int64_t R = T * K;
  const std::string name = shape("moe_gather", {R, H});
  SCOPED_TRACE(name);
  Res g = run(call_of(MF_K_MOE_GATHER, {R, H}, name),
              {Op::of(mf_test_bf16_values((size_t)(T * H), rng())), Op{rt.cpu[4]},
               Op::of(std::vector<float>((size_t)(R * H), NAN))});
  expect_equal(g, 2, "xe");
  for (int acc = 0; acc < 2; acc++) {
    const std::string bname = shape("moe_gather_bwd", {T, K, H, acc});
    SCOPED_TRACE(bname);
    Res b = run(call_of(MF_K_MOE_GATHER_BWD, {T, K, H, acc}, bname),
                {Op::of(mf_test_bf16_values((size_t)(R * H), rng())), Op{rt.cpu[3]},
                 Op::of(acc ? mf_test_bf16_values((size_t)(T * H), rng())
                            : std::vector<float>((size_t)(T * H), NAN))});
    expect_equal(b, 2, "dx");
  }
}

// Combine and its backward along the routing rt.
void Bf16Routing::combine(const Res &rt, int64_t T, int64_t K, int64_t H, std::mt19937 &rng) {
  const int64_t R = T * K;
  const auto ye = mf_test_bf16_values((size_t)(R * H), rng());
  std::vector<float> w((size_t)(T * K));
  std::uniform_real_distribution<float> d(0.0f, 1.0f);
  for (auto &x : w) x = d(rng);
  const std::string name = shape("moe_combine", {T, K, H});
  SCOPED_TRACE(name);
  Res c = run(call_of(MF_K_MOE_COMBINE, {T, K, H}, name),
              {Op::of(ye), Op::of(w), Op{rt.cpu[3]}, Op::of(mf_test_bf16_values((size_t)(T * H), rng()))});
  // atol: y + a sum of K <= 8 products of magnitude <= 1, fma-contracted on
  // the device: the fp32 values differ by at most a few ulps of 9 (~1e-6 each).
  EXPECT_TRUE(mf_test_close(f32_of(c, 3, true), f32_of(c, 3, false), kBf16Ulp, 1e-5f)) << "y";

  const std::string bname = shape("moe_combine_bwd", {T, K, H});
  SCOPED_TRACE(bname);
  const mf_kernel_call call = call_of(MF_K_MOE_COMBINE_BWD, {T, K, H}, bname);
  const std::vector<Op> ops = {Op::of(mf_test_bf16_values((size_t)(T * H), rng())),
                               Op::of(ye),
                               Op::of(w),
                               Op{rt.cpu[3]},
                               Op::of(std::vector<float>((size_t)(R * H), NAN)),
                               Op::of(std::vector<float>((size_t)(T * K), NAN))};
  Res b = run(call, ops);
  expect_equal(b, 4, "dye");
  // atol: dw is a dot of H <= 1024 products of magnitude <= 1 summed in a
  // block tree on the device, in order on the cpu: their fp32 values differ by
  // well under 1e-4 (a bf16 ulp of a typical |dw| ~ sqrt(H)/3 is 2^-5).
  EXPECT_TRUE(mf_test_close(f32_of(b, 5, true), f32_of(b, 5, false), kBf16Ulp, 1e-4f)) << "dw";
  Res again = run(call, ops);
  EXPECT_TRUE(again.gpu[4] == b.gpu[4] && again.gpu[5] == b.gpu[5]) << "two cuda runs differ in bits";
}

TEST_F(Bf16Routing, GatherCombineAndBackward) {
  std::mt19937 rng(5);
  for (auto &s : kMoe) {
    const int64_t T = s[0], K = s[1], E = s[2];
    const Res rt = dispatch(skewed_topk(rng, T, E, K), T, K, E, shape("moe_dispatch", {T, K, E}));
    for (int64_t H : kHidden) {
      gather(rt, T, K, H, rng);
      combine(rt, T, K, H, rng);
    }
  }
}

}  // namespace
