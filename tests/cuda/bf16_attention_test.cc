// Causal GQA attention of the cuda backend with BF16 storage against the cpu
// backend with round_bf16 (tests/cuda/bf16_twin.h): q, k, v, dout are
// bf16-representable, so both sides compute from the same numbers and round
// o, dq, dk, dv once; lse is fp32 on both. The backward's o and lse are the
// cpu forward's (o already bf16), so it is compared on its own. Two cuda runs
// of the backward must give the same bits.
//
// Paths: D a multiple of 16 up to 128 takes the tensor-core kernels
// (kernels/cuda/attention_mma.cu: 64-row tiles, P and dS rounded to bf16 as
// mma operands); other D (40, 256) the CUDA-core kernels of attention.cu.
// Shapes: the models' head dims D = 64 and 128 with GQA (Hq/Hkv = 4 and 2) at
// S = 256 (four 64-row tiles), S = 130 with D = 96 and S = 70 with D = 16 (a
// ragged last tile, a D that stops inside the padded tile width), an odd S
// with D = 40 and S = 65 with D = 256 (fallbacks), S = 1. Value heads unlike
// the query/key heads (Dv != D, i[5]: DeepSeek-V3's D 192 / Dv 128, and a D of
// 64 the tensor cores would take) run on the CUDA-core kernels with either
// parameter: neither attention_mma.cu nor cuDNN is given them; and so do
// gpt-oss's sliding windows (i[6]) and sink logits (dsinks, fp32 on both
// sides from the same bf16 o and dout: rtol and atol 1e-5).
//
// Tolerances, per element |gpu - cpu| <= atol + rtol * |cpu| (why):
//   o: rtol kBf16Ulp = 2^-7 — the sides' fp32 values may round to
//     neighbouring bf16 values: one bf16 ulp, at most 2^-7 of the value;
//     atol 2^-8 max|v|: the tensor-core path rounds each p to bf16 before
//     P V (at most 2^-8 of p, half an ulp), which moves o = sum p v / l by at
//     most 2^-8 max|v| (sum p / l = 1); 1e-5 on the CUDA-core path's fp32.
//   lse: fp32 on both sides, rtol and atol 1e-5 (a few ulps of log-sum-exp).
//   dq, dk, dv on the CUDA-core path: rtol 2^-7 as o, atol 8e-3 x the
//     reference's RMS: the fp32 gradients differ by the cancellation in
//     ds = p * (dp - Di) and sums over up to S x Hq/Hkv terms in another order
//     (the fp32 twin test bounds that by an RMS error of 1e-4 of the RMS).
//   dq, dk, dv on the tensor-core path: p and ds are rounded to bf16 as mma
//     operands (as FlashAttention-2 does), 2^-9 of each term. Measured on an
//     H100 (2026-11-27) that broke the per-element bound above by 2 to 3 bf16
//     ulps on a few elements of every shape; a model of that rounding in double
//     (torch: P and dS rounded to bf16, the rest exact; S = 256, D = 64, GQA
//     4:1, uniform inputs) gives a relative error of the whole gradient of
//     2.6e-3 and a largest element error of 0.08 x the RMS — the largest
//     where a key's gradient sums many queries. So there: ||gpu - cpu|| <=
//     1e-2 ||cpu|| and each element within 2^-7 |cpu| + 0.25 x the RMS (about
//     4x and 3x the model's). A wrong mask, tile or missing term moves whole
//     rows by O(1) of the RMS; the emulator test (attention_mma_emu_test)
//     checks each element against a double reference with the rounding's
//     bound, term by term.
//   The RMS is floored at 1e-2: where the exact gradient is 0 (S = 1: p = 1,
//     o = v, dp - Di cancels) both sides hold rounding noise.
//
// Every case runs on both attention kernels of the backend (the parameter,
// mf_backend_cuda_set_attention): Mma, the paths above, and Cudnn, cuDNN's
// fused flash kernels (kernels/cuda/attention_cudnn.h; skipped where cuDNN
// cannot be loaded). cuDNN also rounds P and dS to bf16 as tensor-core
// operands, so the tensor-core tolerances above hold for it; its lse comes
// from exp2 of log2(e)-scaled scores, so there atol is 1e-4 (a few fp32 ulps
// of scores up to about 10). The shapes the models use (D = 64 and 128) must
// run on cuDNN with the Cudnn parameter; the others may fall back to the Mma
// paths (a shape cuDNN refuses is warned about and runs there), and the
// tolerance follows the kernel that ran (mf_backend_cuda_cudnn_calls). Its
// backward is cuDNN's deterministic algorithm: two runs give the same bits.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cuda/backend_cuda.h"
#include "tests/cuda/bf16_twin.h"

namespace {

constexpr float kBf16Ulp = 1.0f / 128.0f;

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

mf_kernel_call call_of(mf_kernel kind, const Shape &s, float scale, const std::string &label) {
  mf_kernel_call k = {};
  k.kind = kind;
  k.i[0] = s.B, k.i[1] = s.S, k.i[2] = s.Hq, k.i[3] = s.Hkv, k.i[4] = s.D, k.i[5] = s.Dv, k.i[6] = s.W;
  k.f[0] = scale;
  k.label = label.c_str();
  return k;
}

// The RMS of v, at least 1e-2 (see the top).
float rms_floored(const std::vector<float> &v) {
  double s = 0;
  for (float x : v) s += (double)x * x;
  const float r = v.empty() ? 0.0f : (float)std::sqrt(s / (double)v.size());
  return r > 1e-2f ? r : 1e-2f;
}

using Op = MfTwinOperand;
using Res = MfTwinResult;

// The parameter: MF_CUDA_ATTENTION_MMA or _CUDNN.
class Bf16Attention : public MfBf16Twin, public ::testing::WithParamInterface<int> {
 protected:
  void SetUp() override {
    MfBf16Twin::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    if (mf_backend_cuda_set_attention(gpu_, GetParam()) != MF_OK) GTEST_SKIP() << mf_last_error();
  }

  // Whether the call just made ran on cuDNN (calls counted since `before`).
  bool ran_cudnn(uint64_t before) const { return mf_backend_cuda_cudnn_calls(gpu_) > before; }
  // With Mma, cuDNN never runs; with Cudnn, it must where `want` says so.
  void expect_path(bool cudnn, bool want, const char *what) const {
    if (GetParam() != MF_CUDA_ATTENTION_CUDNN) {
      EXPECT_FALSE(cudnn) << "the " << what << " ran on cuDNN with the mma kernels chosen";
    } else if (want) {
      EXPECT_TRUE(cudnn) << "the " << what << " did not run on cuDNN (see the warning above)";
    }
  }

  // want_cudnn: with the Cudnn parameter, both calls must run on cuDNN.
  void check(const Shape &s, uint64_t seed, bool want_cudnn = false) {
    const std::string fname = name_of("attn_fwd", s), bname = name_of("attn_bwd", s);
    SCOPED_TRACE(fname);
    const size_t nq = (size_t)(s.B * s.S * s.Hq * s.D), nk = (size_t)(s.B * s.S * s.Hkv * s.D);
    const size_t no = (size_t)(s.B * s.S * s.Hq * s.dv()), nv = (size_t)(s.B * s.S * s.Hkv * s.dv());
    const size_t nl = (size_t)(s.B * s.Hq * s.S);
    const float scale = 1.0f / std::sqrt((float)s.D);
    const auto q = mf_test_bf16_values(nq, seed), k = mf_test_bf16_values(nk, seed + 1);
    const auto v = mf_test_bf16_values(nv, seed + 2), dout = mf_test_bf16_values(no, seed + 3);
    // the tensor-core kernels and cuDNN have one head dim, no window and no
    // sinks: other calls stay on the CUDA cores
    const bool one_dim = s.dv() == s.D && !s.sinks && (s.W == 0 || s.W >= s.S);
    std::vector<float> sinks;  // bf16 values, one large (most of a row's mass)
    if (s.sinks) {
      sinks = mf_test_bf16_values((size_t)s.Hq, seed + 4, 3.0f);
      sinks[0] = 5.0f;
    }

    // forward: b = {q, k, v, o, lse} (, sinks)
    uint64_t before = mf_backend_cuda_cudnn_calls(gpu_), mma_before = mf_backend_cuda_mma_calls(1);
    std::vector<Op> fops = {Op::of(q), Op::of(k), Op::of(v), Op::of(std::vector<float>(no, NAN)),
                            Op::of(std::vector<float>(nl, NAN))};
    if (s.sinks) fops.push_back(Op::of(sinks));
    Res f = run(call_of(MF_K_ATTN_FWD, s, scale, fname), fops);
    const auto o_cpu = Res::as<float>(f.cpu[3]), lse_cpu = Res::as<float>(f.cpu[4]);
    const bool cudnn_fwd = ran_cudnn(before);
    expect_path(cudnn_fwd, want_cudnn, "forward");
    if (!one_dim) {
      EXPECT_FALSE(cudnn_fwd) << "the forward with Dv != D, a window or sinks ran on cuDNN";
    }
    // tensor cores: attention_mma.cu or cuDNN (both round p to bf16)
    const bool mma_fwd = cudnn_fwd || (one_dim && s.D % 16 == 0 && s.D <= 128);
    // the tensor-core kernel that should have run did (a silent fall-back to
    // the CUDA-core one, more exact, would pass the tolerances below)
    const bool runs = s.B > 0 && s.S > 0;
    EXPECT_EQ(mf_backend_cuda_mma_calls(1) - mma_before, runs && mma_fwd && !cudnn_fwd ? 1u : 0u)
        << "forward calls run by attention_mma.cu";
    float vmax = 0;
    for (float x : v) vmax = std::fmax(vmax, std::fabs(x));
    EXPECT_TRUE(
        mf_test_close(Res::as<float>(f.gpu[3]), o_cpu, kBf16Ulp, mma_fwd ? std::ldexp(vmax, -8) : 1e-5f))
        << "o";
    EXPECT_TRUE(mf_test_close(Res::as<float>(f.gpu[4]), lse_cpu, 1e-5f, cudnn_fwd ? 1e-4f : 1e-5f)) << "lse";

    // backward: b = {q, k, v, o, dout, lse, dq, dk, dv} (, sinks, dsinks), o and lse from the cpu
    SCOPED_TRACE(bname);
    const mf_kernel_call c = call_of(MF_K_ATTN_BWD, s, scale, bname);
    std::vector<Op> ops = {Op::of(q),
                           Op::of(k),
                           Op::of(v),
                           Op::of(o_cpu),
                           Op::of(dout),
                           Op::of(lse_cpu),
                           Op::of(std::vector<float>(nq, NAN)),
                           Op::of(std::vector<float>(nk, NAN)),
                           Op::of(std::vector<float>(nv, NAN))};
    if (s.sinks) {  // dsinks (fp32) is added into
      ops.push_back(Op::of(sinks));
      ops.push_back(Op::of(mf_test_bf16_values((size_t)s.Hq, seed + 5)));
    }
    before = mf_backend_cuda_cudnn_calls(gpu_), mma_before = mf_backend_cuda_mma_calls(1);
    Res b = run(c, ops);
    const bool cudnn_bwd = ran_cudnn(before);
    expect_path(cudnn_bwd, want_cudnn, "backward");
    if (!one_dim) {
      EXPECT_FALSE(cudnn_bwd) << "the backward with Dv != D, a window or sinks ran on cuDNN";
    }
    const bool mma = cudnn_bwd || (one_dim && s.D % 16 == 0 && s.D <= 128);
    EXPECT_EQ(mf_backend_cuda_mma_calls(1) - mma_before, runs && mma && !cudnn_bwd ? 1u : 0u)
        << "backward calls run by attention_mma.cu";
    const char *names[] = {"dq", "dk", "dv"};
    for (int j = 6; j < 9; j++) {
      const auto want = Res::as<float>(b.cpu[j]), got = Res::as<float>(b.gpu[j]);
      EXPECT_TRUE(mf_test_close(got, want, kBf16Ulp, (mma ? 0.25f : 8e-3f) * rms_floored(want)))
          << names[j - 6];
      if (mma) {
        double num = 0, den = 0;
        for (size_t e = 0; e < want.size(); e++) {
          const double d = (double)got[e] - (double)want[e];
          num += d * d, den += (double)want[e] * want[e];
        }
        // den floored as the RMS is: S = 1's exact gradient is 0 (see the top).
        const double floor = 1e-4 * (double)want.size();
        EXPECT_LE(std::sqrt(num), 1e-2 * std::sqrt(den > floor ? den : floor))
            << names[j - 6] << ": relative error of the whole";
      }
    }
    if (s.sinks) {
      EXPECT_TRUE(mf_test_close(Res::as<float>(b.gpu[10]), Res::as<float>(b.cpu[10]), 1e-5f, 1e-5f))
          << "dsinks";
    }
    Res again = run(c, ops);
    for (int j = 6; j < 9; j++)
      EXPECT_TRUE(again.gpu[j] == b.gpu[j]) << names[j - 6] << ": two cuda runs differ";
    if (s.sinks) {
      EXPECT_TRUE(again.gpu[10] == b.gpu[10]) << "dsinks: two cuda runs differ";
    }
  }
};

TEST_P(Bf16Attention, GqaHeadDim64) {
  check({2, 256, 8, 2, 64}, 100, true);
}

TEST_P(Bf16Attention, GqaHeadDim128) {
  check({1, 256, 4, 2, 128}, 200, true);
}

TEST_P(Bf16Attention, OddLengthPaddedHeadDimAndOneToken) {
  check({1, 37, 4, 1, 40}, 300);
  check({3, 1, 4, 2, 64}, 400);
}

// The tensor-core path with a ragged last tile and D inside the padded width
// (96 of 128, 16 of 64); the CUDA-core fallback at D = 256.
TEST_P(Bf16Attention, TensorCoreRaggedTilesAndWideFallback) {
  check({2, 130, 4, 2, 96}, 500);
  check({1, 70, 4, 1, 16}, 600);
  check({1, 65, 2, 2, 256}, 700);
}

// Dv != D: DeepSeek-V3's D 192 / Dv 128 with GQA, Dv above D at a D the
// tensor cores would take alone, odd small dims.
TEST_P(Bf16Attention, ValueHeadDimDiffersRunsOnCudaCores) {
  check({1, 37, 4, 2, 192, 128}, 800);
  check({2, 64, 4, 1, 64, 128}, 900);
  check({1, 9, 2, 1, 8, 3}, 1000);
}

// gpt-oss: sliding windows and sink logits at head dims the tensor cores and
// cuDNN would take alone (64, 128), GQA, odd S; a window at S is none (those
// paths may take it).
TEST_P(Bf16Attention, SinksAndSlidingWindowsRunOnCudaCores) {
  check({1, 130, 8, 2, 64, 0, 3, true}, 1100);
  check({2, 70, 4, 2, 128, 0, 32, false}, 1200);
  check({1, 65, 4, 1, 64, 0, 0, true}, 1300);
  check({1, 256, 4, 2, 64, 0, 128, true}, 1400);
  check({1, 37, 4, 2, 192, 128, 5, true}, 1500);
  check({1, 64, 4, 2, 64, 0, 64, false}, 1600);
}

TEST_P(Bf16Attention, ForwardAtHeadDimOne) {
  const Shape s = {1, 9, 2, 2, 1};
  const size_t n = 18;
  Res f = run(call_of(MF_K_ATTN_FWD, s, 1.0f, "attn_fwd D=1"),
              {Op::of(mf_test_bf16_values(n, 1)), Op::of(mf_test_bf16_values(n, 2)),
               Op::of(mf_test_bf16_values(n, 3)), Op::of(std::vector<float>(n, NAN)),
               Op::of(std::vector<float>(n, NAN))});
  EXPECT_TRUE(mf_test_close(Res::as<float>(f.gpu[3]), Res::as<float>(f.cpu[3]), kBf16Ulp, 1e-5f)) << "o";
}

// The backward stashes the fp32 Di in two bf16 elements of a row of dq: at
// D = 1 there is no room, and the call is refused naming the kernel, the head
// dim and the storage.
TEST_P(Bf16Attention, BackwardRefusesHeadDimOne) {
  mf_kernel_call c = call_of(MF_K_ATTN_BWD, {1, 4, 2, 2, 1}, 1.0f, "attn_bwd D=1");
  const mf_kernel_info *info = mf_kernel_info_of(MF_K_ATTN_BWD);
  ASSERT_NE(info, nullptr);
  for (int j = 0; j < mf_kernel_n_operands(MF_K_ATTN_BWD); j++)
    c.b[j] = {arena_ + (size_t)j * 4096, 64, 0,
              info->b[j].type == MF_KT_FLOAT ? MF_DTYPE_BF16 : MF_DTYPE_F32};
  EXPECT_EQ(gpu_->run(gpu_, &c, gpu_s_), MF_ERR_UNSUPPORTED);
  const std::string err = mf_last_error();
  EXPECT_NE(err.find("attn_bwd"), std::string::npos) << err;
  EXPECT_NE(err.find("D=1"), std::string::npos) << err;
  EXPECT_NE(err.find("bf16"), std::string::npos) << err;
}

INSTANTIATE_TEST_SUITE_P(Kernels, Bf16Attention,
                         ::testing::Values((int)MF_CUDA_ATTENTION_MMA, (int)MF_CUDA_ATTENTION_CUDNN),
                         [](const ::testing::TestParamInfo<int> &p) {
                           return std::string(p.param == MF_CUDA_ATTENTION_CUDNN ? "Cudnn" : "Mma");
                         });

}  // namespace
