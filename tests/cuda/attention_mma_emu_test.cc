// Host emulation of kernels/cuda/attention_mma.cu, a CPU test of CI: runs the
// tensor-core attention kernels' device code on the CPU (tests/cuda/mma_emu.h:
// 128 threads a CTA as coroutines, emulated ldmatrix / mma / cp.async) at small
// shapes (B = 2, Hq = 4, Hkv = 2: GQA groups of 2; S = 1, 17, 64, 130: one
// partial tile, one full tile, three tiles with a 2-row last one; D = 16, 64,
// 128 and 80: both padded widths DP and a D that stops inside one) and checks:
//   - shared memory hazards, ldmatrix bank conflicts, cp.async bounds and
//     alignment, warp collectives, copies in flight at exit (mma_emu.h);
//   - every element of o (forward), dk, dv, dq (backward) written exactly once,
//     guard bands untouched, every lse of a real row written;
//   - the results against a double-precision reference of attention.cu's maths
//     on the same bf16 inputs.
// Tolerances (per element, worst cases rather than statistics; why):
//   o: 2^-8 (sum_j p|v| / l) for the bf16 rounding of p before P V (half an
//     ulp: at most 2^-8 of each p), + 2^-8 |o| for o's own rounding to bf16,
//     + 1e-5 for fp32 sums and expf (a few ulps over at most 130 keys).
//   lse: 2e-5 (1 + |lse|): fp32 dot, exp, sum and log, a few ulps each.
//   dv = sum p do: 2^-8 sum p|do| (p rounded to bf16 as an mma operand) +
//     2^-8 |dv| (the output's rounding) + 1e-6 (fp32 sums).
//   dk = scale sum ds q, dq = scale sum ds k, ds = p (dp - Di): per term
//     2^-8 |ds| (ds rounded to bf16) + p 1e-5 (sum_d |do v| + |Di|) (dp, Di
//     and p in fp32: a few ulps of their magnitudes), times |q| (|k|) and
//     scale; + 2^-8 of the value (its rounding) + 1e-6.
// The backward's inputs are those of the real pipeline: o the bf16 rounding of
// the reference o, lse the reference's in fp32, Di = do.o in fp32 stashed in
// dq's rows as attention.cu's Di launch does (the emulator does not run that
// CUDA-core kernel).
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

// The reference backward in double of one shape, from the pipeline's o (bf16),
// lse and Di (fp32); the tolerances of the header.
struct BwdRef {
  std::vector<double> dq, dk, dv, tq, tk, tv;
  std::vector<float> lse, di;
  std::vector<mf_bf16> o;
};

void ref_head(const Inputs &in, BwdRef &r, int64_t b, int64_t h) {
  const Shape &s = in.s;
  const int64_t g = h / (s.Hq / s.Hkv), S = s.S, D = s.D;
  std::vector<double> p;
  for (int64_t i = 0; i < S; i++) {
    const double lse = ref_row(in, b, i, h, p);
    r.lse[(b * s.Hq + h) * S + i] = (float)lse;
    double di = 0;
    for (int64_t d = 0; d < D; d++) {
      double o = 0;
      for (int64_t j = 0; j <= i; j++) o += p[j] * in.V(b, j, g, d);
      const uint16_t ob = emu_to_bf((float)o);
      r.o[((b * S + i) * s.Hq + h) * D + d].x = ob;
      di += emu_bf(ob) * in.dO(b, i, h, d);
    }
    r.di[(b * s.Hq + h) * S + i] = (float)di;
  }
  for (int64_t i = 0; i < S; i++) {
    const double lse = r.lse[(b * s.Hq + h) * S + i], di = r.di[(b * s.Hq + h) * S + i];
    for (int64_t j = 0; j <= i; j++) {
      double dot = 0, dp = 0, mag = 0;
      for (int64_t d = 0; d < D; d++) {
        dot += in.Q(b, i, h, d) * in.K(b, j, g, d);
        dp += in.dO(b, i, h, d) * in.V(b, j, g, d);
        mag += std::fabs(in.dO(b, i, h, d) * in.V(b, j, g, d));
      }
      const double pp = std::exp((double)(float)(dot * in.scale) - lse), ds = pp * (dp - di);
      const double ets = std::ldexp(std::fabs(ds), -8) + pp * 1e-5 * (mag + std::fabs(di));
      for (int64_t d = 0; d < D; d++) {
        const size_t qi = ((b * S + i) * s.Hq + h) * D + d, ki = ((b * S + j) * s.Hkv + g) * D + d;
        r.dq[qi] += in.scale * ds * in.K(b, j, g, d);
        r.tq[qi] += in.scale * ets * std::fabs(in.K(b, j, g, d));
        r.dk[ki] += in.scale * ds * in.Q(b, i, h, d);
        r.tk[ki] += in.scale * ets * std::fabs(in.Q(b, i, h, d));
        r.dv[ki] += pp * in.dO(b, i, h, d);
        r.tv[ki] += std::ldexp(pp * std::fabs(in.dO(b, i, h, d)), -8);
      }
    }
  }
}

void check_grad(const char *what, const EmuBuf *got, size_t which, const std::vector<double> &ref,
                const std::vector<double> &tol) {
  for (size_t x = 0; x < ref.size(); x++) {
    if (emu_writes(which, x) != 1)
      emu_die(std::string(what) + " element written " + std::to_string(emu_writes(which, x)) + " times");
    emu_check_close(what, emu_bf(BF(got)[x].x), ref[x], tol[x] + std::ldexp(std::fabs(ref[x]), -8) + 1e-6, x);
  }
}

template <int DP>
void run_bwd(const Inputs &in, EmuBuf *q, EmuBuf *k, EmuBuf *v, EmuBuf *dout, EmuBuf *lse, EmuBuf *dq,
             EmuBuf *dk, EmuBuf *dv) {
  const Shape &s = in.s;
  const unsigned blocks = (unsigned)((s.S + AROWS - 1) / AROWS);
  const int S = (int)s.S, Hq = (int)s.Hq, Hkv = (int)s.Hkv, D = (int)s.D;
  const float *lp = (const float *)lse->p;
  g_tracked.clear();
  emu_track(dk->p, dk->n / 2);
  emu_track(dv->p, dv->n / 2);
  emu_run_grid(blocks, Hkv, (unsigned)s.B, ANT, bwd_smem<DP>(), [&] {
    attn_dkdv_mma<DP>(BF(q), BF(k), BF(v), BF(dout), lp, BF(dq), S, Hq, Hkv, D, in.scale, BF(dk), BF(dv));
  });
  std::vector<EmuTracked> kv = g_tracked;
  g_tracked.clear();
  emu_track(dq->p, dq->n / 2);
  emu_run_grid(blocks, Hq, (unsigned)s.B, ANT, bwd_smem<DP>(),
               [&] { attn_dq_mma<DP>(BF(q), BF(k), BF(v), BF(dout), lp, S, Hq, Hkv, D, in.scale, BF(dq)); });
  g_tracked.insert(g_tracked.end(), kv.begin(), kv.end());  // dq, dk, dv
}

void test_bwd(const Inputs &in) {
  const Shape &s = in.s;
  const size_t nq = s.B * s.S * s.Hq * s.D, nk = s.B * s.S * s.Hkv * s.D, nl = s.B * s.Hq * s.S;
  BwdRef r;
  r.dq.assign(nq, 0), r.tq.assign(nq, 0), r.dk.assign(nk, 0), r.tk.assign(nk, 0), r.dv.assign(nk, 0),
      r.tv.assign(nk, 0), r.lse.assign(nl, 0), r.di.assign(nl, 0), r.o.assign(nq, mf_bf16{0});
  for (int64_t b = 0; b < s.B; b++)
    for (int64_t h = 0; h < s.Hq; h++) ref_head(in, r, b, h);
  g_regions.clear();
  EmuBuf *q = buf_of(in.q), *k = buf_of(in.k), *v = buf_of(in.v), *dout = buf_of(in.dout);
  EmuBuf *lse = out_buf(nl, 4, 0), *dq = out_buf(nq, 2, 0xee), *dk = out_buf(nk, 2, 0xee),
         *dv = out_buf(nk, 2, 0xee);
  memcpy(lse->p, r.lse.data(), nl * 4);
  for (size_t row = 0; row < nl; row++) {  // the Di stash: row (token, head) of dq
    const int64_t b = row / (s.Hq * s.S), h = row / s.S % s.Hq, i = row % s.S;
    uint32_t u;
    memcpy(&u, &r.di[row], 4);
    mf_bf16 *dst = BF(dq) + ((b * s.S + i) * s.Hq + h) * s.D;
    dst[0].x = (uint16_t)(u & 0xffff), dst[1].x = (uint16_t)(u >> 16);
  }
  if (s.D <= 64)
    run_bwd<64>(in, q, k, v, dout, lse, dq, dk, dv);
  else
    run_bwd<128>(in, q, k, v, dout, lse, dq, dk, dv);
  for (auto [x, n] : {std::pair{dq, "dq"}, {dk, "dk"}, {dv, "dv"}, {lse, "lse"}}) x->check_guards(n);
  g_fail = 0;
  check_grad("dq", dq, 0, r.dq, r.tq);
  check_grad("dk", dk, 1, r.dk, r.tk);
  check_grad("dv", dv, 2, r.dv, r.tv);
  printf("BWD B=%lld S=%lld Hq=%lld Hkv=%lld D=%lld: %s (%d bad)\n", (long long)s.B, (long long)s.S,
         (long long)s.Hq, (long long)s.Hkv, (long long)s.D, g_fail ? "FAIL" : "ok", g_fail);
  for (EmuBuf *x : {q, k, v, dout, lse, dq, dk, dv}) delete x;
  if (g_fail) emu_die("backward results off");
}

int run_all() {
  for (int64_t S : {1, 17, 64, 130})
    for (int64_t D : {16, 64, 128}) {
      const Inputs in = make_inputs({2, S, 4, 2, D});
      test_fwd(in);
      test_bwd(in);
    }
  const Inputs in = make_inputs({1, 70, 2, 1, 80});
  test_fwd(in);
  test_bwd(in);
  printf("all ok\n");
  return 0;
}

}  // namespace

// A failure ends the process (emu_die: _exit(1)) naming what the emulator caught.
TEST(AttentionMmaEmulated, HazardsWritesAndResults) {
  MF_EMU_SKIP_UNDER_ASAN();
  EXPECT_EQ(run_all(), 0);
}
