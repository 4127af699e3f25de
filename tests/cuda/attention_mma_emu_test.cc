// Host emulation of kernels/cuda/attention_mma.cu, a CPU test of CI: runs the
// tensor-core attention kernels' device code on the CPU (tests/cuda/mma_emu.h:
// 128 threads a CTA as coroutines, emulated ldmatrix / mma / cp.async) at small
// shapes (B = 2, Hq = 4, Hkv = 2: GQA groups of 2; S = 1, 17, 64, 130: one
// partial tile, one full tile, three tiles with a 2-row last one; D = 16, 64,
// 128 and 80: both padded widths DP and a D that stops inside one) and checks:
//   - shared memory hazards, ldmatrix bank conflicts, cp.async bounds and
//     alignment, warp collectives, copies in flight at exit (mma_emu.h);
//   - every element of o written exactly once, guard bands untouched, every
//     lse of a real row written;
//   - the results against a double-precision reference of attention.cu's maths
//     on the same bf16 inputs.
// Tolerances (per element, worst cases rather than statistics; why):
//   o: 2^-8 (sum_j p|v| / l) for the bf16 rounding of p before P V (half an
//     ulp: at most 2^-8 of each p), + 2^-8 |o| for o's own rounding to bf16,
//     + 1e-5 for fp32 sums and expf (a few ulps over at most 130 keys).
//   lse: 2e-5 (1 + |lse|): fp32 dot, exp, sum and log, a few ulps each.
// The kernel file comes in as kernels/cuda/attention_mma_cu.inc (the genrule
// in kernels/cuda/BUILD). Under AddressSanitizer the test is skipped.
#include <gtest/gtest.h>

#include "tests/cuda/mma_emu.h"

#include "kernels/cuda/attention_mma_cu.inc"

namespace {

struct Shape {
  int64_t B, S, Hq, Hkv, D;
};

// The inputs of a shape, as bf16 and as doubles.
struct Inputs {
  Shape s;
  float scale;
  std::vector<mf_bf16> q, k, v, dout;
  double Q(int64_t b, int64_t i, int64_t h, int64_t d) const { return at(q, s.Hq, b, i, h, d); }
  double K(int64_t b, int64_t j, int64_t g, int64_t d) const { return at(k, s.Hkv, b, j, g, d); }
  double V(int64_t b, int64_t j, int64_t g, int64_t d) const { return at(v, s.Hkv, b, j, g, d); }
  double dO(int64_t b, int64_t i, int64_t h, int64_t d) const { return at(dout, s.Hq, b, i, h, d); }
  double at(const std::vector<mf_bf16> &x, int64_t H, int64_t b, int64_t i, int64_t h, int64_t d) const {
    return emu_bf(x[((b * s.S + i) * H + h) * s.D + d].x);
  }
};

Inputs make_inputs(const Shape &s) {
  Inputs in;
  in.s = s;
  in.scale = 1.0f / std::sqrt((float)s.D);
  const size_t nq = s.B * s.S * s.Hq * s.D, nk = s.B * s.S * s.Hkv * s.D;
  in.q = emu_bf16_rand(nq, -2, 2);  // scores of a few units: a peaked softmax
  in.k = emu_bf16_rand(nk, -2, 2);
  in.v = emu_bf16_rand(nk);
  in.dout = emu_bf16_rand(nq);
  return in;
}

// The reference softmax row of query (b, i, h): p[j] for j <= i, and lse.
double ref_row(const Inputs &in, int64_t b, int64_t i, int64_t h, std::vector<double> &p) {
  const Shape &s = in.s;
  const int64_t g = h / (s.Hq / s.Hkv);
  p.assign(i + 1, 0.0);
  double m = -INFINITY;
  for (int64_t j = 0; j <= i; j++) {
    double dot = 0;
    for (int64_t d = 0; d < s.D; d++) dot += in.Q(b, i, h, d) * in.K(b, j, g, d);
    p[j] = dot * in.scale;
    m = std::max(m, p[j]);
  }
  double l = 0;
  for (int64_t j = 0; j <= i; j++) l += (p[j] = std::exp(p[j] - m));
  for (int64_t j = 0; j <= i; j++) p[j] /= l;
  return m + std::log(l);
}

EmuBuf *buf_of(const std::vector<mf_bf16> &x) {
  EmuBuf *b = new EmuBuf(x.size() * 2);
  memcpy(b->p, x.data(), x.size() * 2);
  return b;
}

EmuBuf *out_buf(size_t n, size_t elem, unsigned char fill) {
  EmuBuf *b = new EmuBuf(n * elem);
  memset(b->p, fill, n * elem);
  return b;
}

#define BF(b) ((mf_bf16 *)(b)->p)

void test_fwd(const Inputs &in) {
  const Shape &s = in.s;
  const size_t nq = s.B * s.S * s.Hq * s.D, nl = s.B * s.Hq * s.S;
  g_regions.clear();
  g_tracked.clear();
  EmuBuf *q = buf_of(in.q), *k = buf_of(in.k), *v = buf_of(in.v);
  EmuBuf *o = out_buf(nq, 2, 0xee), *lse = out_buf(nl, 4, 0xff);  // lse: NaN until written
  emu_track(o->p, nq);
  const unsigned nqb = (unsigned)((s.S + AROWS - 1) / AROWS);
  const int S = (int)s.S, Hq = (int)s.Hq, Hkv = (int)s.Hkv, D = (int)s.D;
  float *lp = (float *)lse->p;
  if (D <= 64)
    emu_run_grid(nqb, Hq, (unsigned)s.B, ANT, fwd_smem<64>(),
                 [&] { attn_fwd_mma<64>(BF(q), BF(k), BF(v), S, Hq, Hkv, D, in.scale, BF(o), lp); });
  else
    emu_run_grid(nqb, Hq, (unsigned)s.B, ANT, fwd_smem<128>(),
                 [&] { attn_fwd_mma<128>(BF(q), BF(k), BF(v), S, Hq, Hkv, D, in.scale, BF(o), lp); });
  o->check_guards("o");
  lse->check_guards("lse");
  g_fail = 0;
  std::vector<double> p;
  for (int64_t b = 0; b < s.B; b++)
    for (int64_t h = 0; h < s.Hq; h++)
      for (int64_t i = 0; i < s.S; i++) {
        const int64_t g = h / (s.Hq / s.Hkv);
        const double ref_lse = ref_row(in, b, i, h, p);
        const size_t li = (b * s.Hq + h) * s.S + i;
        emu_check_close("lse", lp[li], ref_lse, 2e-5 * (1 + std::fabs(ref_lse)), li);
        for (int64_t d = 0; d < s.D; d++) {
          double ref = 0, mag = 0;
          for (int64_t j = 0; j <= i; j++)
            ref += p[j] * in.V(b, j, g, d), mag += p[j] * std::fabs(in.V(b, j, g, d));
          const size_t oi = ((b * s.S + i) * s.Hq + h) * s.D + d;
          if (emu_writes(0, oi) != 1)
            emu_die("o element written " + std::to_string(emu_writes(0, oi)) + " times");
          const double tol = std::ldexp(mag, -8) + std::ldexp(std::fabs(ref), -8) + 1e-5;
          emu_check_close("o", emu_bf(BF(o)[oi].x), ref, tol, oi);
        }
      }
  printf("FWD B=%lld S=%lld Hq=%lld Hkv=%lld D=%lld: %s (%d bad)\n", (long long)s.B, (long long)s.S,
         (long long)s.Hq, (long long)s.Hkv, (long long)s.D, g_fail ? "FAIL" : "ok", g_fail);
  for (EmuBuf *x : {q, k, v, o, lse}) delete x;
  if (g_fail) emu_die("forward results off");
}

int run_all() {
  for (int64_t S : {1, 17, 64, 130})
    for (int64_t D : {16, 64, 128}) {
      const Inputs in = make_inputs({2, S, 4, 2, D});
      test_fwd(in);
    }
  const Inputs in = make_inputs({1, 70, 2, 1, 80});
  test_fwd(in);
  printf("all ok\n");
  return 0;
}

}  // namespace

// A failure ends the process (emu_die: _exit(1)) naming what the emulator caught.
TEST(AttentionMmaEmulated, HazardsWritesAndResults) {
#ifdef MF_EMU_UNDER_ASAN
  GTEST_SKIP()
      << "the emulator's coroutines switch stacks (swapcontext), which AddressSanitizer does not follow";
#else
  EXPECT_EQ(run_all(), 0);
#endif
}
