// Every kernel kind the cuda backend implements, against the cpu backend (the
// reference, fp32 storage: round_bf16 off) on fresh random data at several
// shapes (ones, odd sizes, a few hundred rows), plus determinism: two cuda runs
// of one call from the same inputs give the same bits.
//
// Each case gives one operand per operand of its kind in the operand table
// (kernels/backend.h mf_kernel_info_of; absent only where optional), and the
// table's roles say which are written: those are compared.
//
// Comparison per output operand: integer outputs must be equal; float and
// double outputs must have NMSE = sum (gpu - cpu)^2 / sum cpu^2 at most the
// operand's tolerance (0 where both sides do the same IEEE operations in the
// same order: copies, sums of plain additions in a fixed order).
// Tolerances (why):
//   zero, embed_fwd/bwd, add, scale, dropout, moe_gather, moe_gather_bwd, combine_bwd's dye: 0
//   rmsnorm_fwd y, rstd: 1e-10 (a block-tree sum of squares vs the cpu's 16 lanes)
//   rmsnorm_bwd dx, dw: 1e-9 (reductions in a different fixed order)
//   rope: 1e-6 (device powf/cosf/sinf vs libm: ulps of angles up to 512 rad)
//   swiglu fwd/bwd: 1e-10 (device expf within 2 ulp, fma contraction)
//   sigmoid gate fwd 1e-10, bwd dx 1e-10, dgl 1e-9 (a row dot product)
//   router_fwd probs, topk_w: 1e-10, topk_idx equal (logits are spaced far
//     beyond rounding, plus rows of exact ties: the tie rule must agree)
//   router_bwd: 1e-9; moe_combine: 1e-10; combine_bwd dw: 1e-9 (dot products)
//   moe_dispatch: all outputs equal
//   aux_accumulate counts equal, psum 1e-24 (double); aux_value 1e-24; aux_grad 1e-20
//   attn_fwd/bwd with Dv != D: o, lse 1e-10; dq, dk, dv 1e-8 (attention_test.cc's)
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cuda/backend_cuda.h"
#include "src/core/core.h"
#include "tests/cuda/gpu_test_util.h"
#include "tests/cuda/twin_fixture.h"

namespace {

enum Ty { NONE, F32, I32, I64, F64 };

size_t ty_size(Ty t) {
  return t == F32 || t == I32 ? 4 : t == NONE ? 0 : 8;
}

// One operand's initial contents. Whether the kernel writes it (and so whether
// it is compared after the call) is the operand table's word (kernels/backend.h
// mf_kernel_writes), not the case's.
struct Buf {
  Ty ty = NONE;
  std::vector<uint8_t> data;  // initial contents
  double tol = 0;             // NMSE tolerance when written (float types)
  int alias = -1;             // >= 0: same memory as that slot (in-place calls)
  size_t count() const { return ty == NONE ? 0 : data.size() / ty_size(ty); }
};

template <typename T>
Buf make(Ty ty, const std::vector<T> &v, double tol) {
  Buf b;
  b.ty = ty;
  b.data.resize(v.size() * sizeof(T));
  if (!v.empty()) memcpy(b.data.data(), v.data(), b.data.size());
  b.tol = tol;
  return b;
}
Buf f32(const std::vector<float> &v, double tol = 0) {
  return make(F32, v, tol);
}
Buf i32(const std::vector<int32_t> &v) {
  return make(I32, v, 0);
}
Buf i32_unset(size_t n) {  // an integer output: -7 until written
  return make(I32, std::vector<int32_t>(n, -7), 0);
}
Buf i64(const std::vector<int64_t> &v) {
  return make(I64, v, 0);
}
Buf f64(const std::vector<double> &v, double tol = 0) {
  return make(F64, v, tol);
}
Buf absent() {
  return Buf();
}

struct Case {
  std::string name;
  mf_kernel kind;
  std::vector<Buf> b;
  int64_t i[8] = {0};
  double f[6] = {0};  // as many as mf_kernel_call's: call_of copies them all
};

std::vector<float> uniform(std::mt19937 &rng, size_t n, float lo, float hi) {
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto &x : v) x = d(rng);
  return v;
}
std::vector<float> nans(size_t n) {
  return std::vector<float>(n, std::nanf(""));
}
std::vector<int32_t> ints(std::mt19937 &rng, size_t n, int32_t lo, int32_t hi) {
  std::uniform_int_distribution<int32_t> d(lo, hi);
  std::vector<int32_t> v(n);
  for (auto &x : v) x = d(rng);
  return v;
}
// K distinct experts of E per token, in random order.
std::vector<int32_t> topk_ids(std::mt19937 &rng, int64_t T, int64_t E, int64_t K) {
  std::vector<int32_t> v((size_t)(T * K)), perm((size_t)E);
  for (int64_t t = 0; t < T; t++) {
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    for (int64_t j = 0; j < K; j++) v[(size_t)(t * K + j)] = perm[(size_t)j];
  }
  return v;
}

double nmse(const Buf &want_b, const std::vector<uint8_t> &want, const std::vector<uint8_t> &got) {
  double num = 0, den = 0;
  size_t n = want_b.count();
  for (size_t k = 0; k < n; k++) {
    double a, b;
    if (want_b.ty == F32) {
      float x, y;
      memcpy(&x, &want[k * 4], 4);
      memcpy(&y, &got[k * 4], 4);
      a = x, b = y;
    } else {
      memcpy(&a, &want[k * 8], 8);
      memcpy(&b, &got[k * 8], 8);
    }
    num += (b - a) * (b - a);
    den += a * a;
  }
  return num / std::max(den, 1e-300);
}

class CudaOps : public CudaTwin<(size_t)256 << 20> {
 protected:
  // The call without its operands; the case's operands checked against the
  // operand table: one per operand of the kind, absent only where optional.
  mf_kernel_call call_of(const Case &c) {
    mf_kernel_call k = {};
    k.kind = c.kind;
    memcpy(k.i, c.i, sizeof k.i);
    memcpy(k.f, c.f, sizeof k.f);
    k.label = c.name.c_str();
    const mf_kernel_info *t = mf_kernel_info_of(c.kind);
    EXPECT_EQ((int)c.b.size(), mf_kernel_n_operands(c.kind)) << c.name;
    for (size_t j = 0; t && j < c.b.size() && j < MF_KBUF_MAX; j++)
      EXPECT_TRUE(c.b[j].ty != NONE || t->b[j].optional)
          << c.name << ": operand " << t->b[j].name << " absent";
    return k;
  }

  // Where operand j's memory is (its alias's for an in-place operand).
  static size_t home(const Case &c, size_t j) { return c.b[j].alias >= 0 ? (size_t)c.b[j].alias : j; }

  // The cpu reference: outputs per slot.
  std::vector<std::vector<uint8_t>> run_cpu(const Case &c) {
    std::vector<std::vector<uint8_t>> mem(c.b.size());
    mf_kernel_call k = call_of(c);
    for (size_t j = 0; j < c.b.size(); j++) {
      if (c.b[j].ty == NONE) continue;
      mem[j] = c.b[j].data;
      mem[j].resize(std::max<size_t>(mem[j].size(), 8));
    }
    for (size_t j = 0; j < c.b.size(); j++) {
      const Buf &b = c.b[j];
      if (b.ty == NONE) continue;
      k.b[j] = {mem[home(c, j)].data(), b.data.size(), (int)(mf_kernel_writes(&k) >> j & 1u)};
    }
    EXPECT_EQ(cpu_->run(cpu_, &k, cpu_s_), MF_OK) << c.name << ": " << mf_last_error();
    return mem;
  }

  // One cuda run from the initial contents: outputs per slot.
  std::vector<std::vector<uint8_t>> run_gpu(const Case &c) {
    std::vector<std::vector<uint8_t>> mem(c.b.size());
    mf_kernel_call k = call_of(c);
    std::vector<uint8_t *> dev(c.b.size(), nullptr);
    size_t off = 0;
    for (size_t j = 0; j < c.b.size(); j++) {
      const Buf &b = c.b[j];
      if (b.ty == NONE || b.alias >= 0) continue;
      dev[j] = arena_ + off;
      off += (b.data.size() + 255) / 256 * 256 + 256;
      EXPECT_LE(off, kArena) << c.name;
      if (off > kArena) return mem;
      EXPECT_EQ(gpu_->copy(gpu_, dev[j], b.data.data(), b.data.size(), MF_COPY_H2D, gpu_s_), MF_OK)
          << mf_last_error();
    }
    for (size_t j = 0; j < c.b.size(); j++) {
      const Buf &b = c.b[j];
      if (b.ty == NONE) continue;
      if (b.alias >= 0) dev[j] = dev[(size_t)b.alias];
      k.b[j] = {dev[j], b.data.size(), (int)(mf_kernel_writes(&k) >> j & 1u)};
    }
    EXPECT_EQ(gpu_->run(gpu_, &k, gpu_s_), MF_OK) << c.name << ": " << mf_last_error();
    for (size_t j = 0; j < c.b.size(); j++) {
      const Buf &b = c.b[j];
      if (b.ty == NONE || b.alias >= 0) continue;
      mem[j].resize(b.data.size());
      EXPECT_EQ(gpu_->copy(gpu_, mem[j].data(), dev[j], b.data.size(), MF_COPY_D2H, gpu_s_), MF_OK)
          << mf_last_error();
    }
    EXPECT_EQ(gpu_->stream_sync(gpu_, gpu_s_), MF_OK) << c.name << ": " << mf_last_error();
    return mem;
  }

  // Every operand the table says the kind writes, compared (in its alias's
  // memory for an in-place operand) with the tolerance its case gives it.
  void check(const Case &c) {
    SCOPED_TRACE(c.name);
    auto want = run_cpu(c);
    auto got = run_gpu(c);
    auto again = run_gpu(c);
    const mf_kernel_call k = call_of(c);
    int compared = 0;
    for (size_t j = 0; j < c.b.size(); j++) {
      const Buf &b = c.b[j];
      if (b.ty == NONE || !(mf_kernel_writes(&k) >> j & 1u)) continue;
      const std::string what = std::string("operand ") + mf_kernel_info_of(c.kind)->b[j].name;
      const size_t m = home(c, j);
      ASSERT_EQ(got[m].size(), b.data.size()) << what;
      ASSERT_EQ(again[m].size(), b.data.size()) << what;
      EXPECT_TRUE(got[m] == again[m]) << what << ": two cuda runs differ (not deterministic)";
      compared++;
      if (b.ty == I32 || b.ty == I64) {
        size_t bad = 0, first = 0;
        for (size_t e = 0; e < b.data.size(); e += ty_size(b.ty))
          if (memcmp(&got[m][e], &want[m][e], ty_size(b.ty)) != 0 && bad++ == 0) first = e / ty_size(b.ty);
        EXPECT_EQ(bad, 0u) << what << ": integer outputs differ, first at element " << first;
      } else {
        double err = nmse(b, want[m], got[m]);
        EXPECT_LE(err, b.tol) << what << " (" << b.count() << " values): NMSE " << err;
        if (b.tol == 0) {
          EXPECT_EQ(memcmp(got[m].data(), want[m].data(), b.data.size()), 0)
              << what << ": expected identical bits";
        }
      }
    }
    EXPECT_GT(compared, 0);
  }
};

std::string shape(const char *op, std::initializer_list<int64_t> dims) {
  std::string s = op;
  for (int64_t d : dims) s += " " + std::to_string(d);
  return s;
}

// Row/column shapes used by most ops: ones, odd, a few hundred rows.
const int64_t kShapes[][2] = {{1, 1}, {37, 129}, {300, 1000}, {5, 3001}};

TEST_F(CudaOps, Zero) {
  std::mt19937 rng(1);
  for (int64_t n : {1, 7, 100003}) {
    Case c{shape("zero", {n}), MF_K_ZERO};
    c.b = {f32(uniform(rng, (size_t)n, -1, 1), 0)};
    check(c);
  }
}

TEST_F(CudaOps, EmbedFwdBwd) {
  std::mt19937 rng(2);
  for (auto &s : kShapes) {
    const int64_t T = s[0], H = s[1];
    for (int64_t V : {int64_t(1), int64_t(5), int64_t(1000)}) {
      auto ids = ints(rng, (size_t)T, 0, (int32_t)V - 1);  // V=1, 5: ids repeat
      Case f{shape("embed_fwd", {T, V, H}), MF_K_EMBED_FWD};
      f.b = {i32(ids), f32(uniform(rng, (size_t)(V * H), -1, 1)), f32(nans((size_t)(T * H)), 0)};
      f.i[0] = T, f.i[1] = V, f.i[2] = H;
      check(f);
      Case b{shape("embed_bwd", {T, V, H}), MF_K_EMBED_BWD};
      b.b = {i32(ids), f32(uniform(rng, (size_t)(T * H), -1, 1)),
             f32(uniform(rng, (size_t)(V * H), -1, 1), 0)};
      b.i[0] = T, b.i[1] = V, b.i[2] = H;
      check(b);
    }
  }
}

TEST_F(CudaOps, RmsnormFwd) {
  std::mt19937 rng(3);
  for (auto &s : kShapes) {
    const int64_t R = s[0], C = s[1];
    Case c{shape("rmsnorm_fwd", {R, C}), MF_K_RMSNORM_FWD};
    c.b = {f32(uniform(rng, (size_t)(R * C), -2, 2)), f32(uniform(rng, (size_t)C, 0.5f, 1.5f)),
           f32(nans((size_t)(R * C)), 1e-10), f32(nans((size_t)R), 1e-10)};
    c.i[0] = R, c.i[1] = C;
    c.f[0] = 1e-6;
    check(c);
    // In place: y is x.
    Case p{shape("rmsnorm_fwd in place", {R, C}), MF_K_RMSNORM_FWD};
    p.b = {f32(uniform(rng, (size_t)(R * C), -2, 2)), f32(uniform(rng, (size_t)C, 0.5f, 1.5f)),
           f32(nans((size_t)(R * C)), 1e-10), f32(nans((size_t)R), 1e-10)};
    p.b[2].alias = 0;
    p.i[0] = R, p.i[1] = C;
    p.f[0] = 1e-5;
    check(p);
  }
}

TEST_F(CudaOps, RmsnormBwd) {
  std::mt19937 rng(4);
  for (auto &s : kShapes) {
    for (int acc = 0; acc < 2; acc++) {
      const int64_t R = s[0], C = s[1];
      Case c{shape("rmsnorm_bwd", {R, C, acc}), MF_K_RMSNORM_BWD};
      c.b = {f32(uniform(rng, (size_t)(R * C), -1, 1)),
             f32(uniform(rng, (size_t)(R * C), -2, 2)),
             f32(uniform(rng, (size_t)C, 0.5f, 1.5f)),
             f32(uniform(rng, (size_t)R, 0.5f, 2.0f)),
             f32(acc ? uniform(rng, (size_t)(R * C), -1, 1) : nans((size_t)(R * C)), 1e-9),
             f32(uniform(rng, (size_t)C, -1, 1), 1e-9)};
      c.i[0] = R, c.i[1] = C, c.i[2] = acc;
      check(c);
    }
    // A frozen weight (LoRA): no dw, dx as before.
    const int64_t R = s[0], C = s[1];
    Case f{shape("rmsnorm_bwd without dw", {R, C}), MF_K_RMSNORM_BWD};
    f.b = {f32(uniform(rng, (size_t)(R * C), -1, 1)), f32(uniform(rng, (size_t)(R * C), -2, 2)),
           f32(uniform(rng, (size_t)C, 0.5f, 1.5f)),  f32(uniform(rng, (size_t)R, 0.5f, 2.0f)),
           f32(nans((size_t)(R * C)), 1e-9),          absent()};
    f.i[0] = R, f.i[1] = C, f.i[2] = 0;
    check(f);
  }
}

// rmsnorm_bwd's dw partial sums live in the backend's one scratch buffer: calls
// on two streams, submitted back to back, must each give the bits of a lone call.
TEST_F(CudaOps, RmsnormBwdOnTwoStreamsSharesScratchSafely) {
  std::mt19937 rng(15);
  const int64_t R = 2000, C = 1024;
  const size_t rc = (size_t)(R * C) * 4, c4 = (size_t)C * 4, r4 = (size_t)R * 4;
  float *p = reinterpret_cast<float *>(arena_);
  float *dy = p, *x = p + R * C, *w = p + 2 * R * C, *rstd = w + C;
  float *out = rstd + R;  // three (dx, dw) pairs: lone call, stream A, stream B
  std::vector<float> h_dy = uniform(rng, (size_t)(R * C), -1, 1), h_x = uniform(rng, (size_t)(R * C), -2, 2),
                     h_w = uniform(rng, (size_t)C, 0.5f, 1.5f), h_r = uniform(rng, (size_t)R, 0.5f, 2.0f);
  ASSERT_EQ(gpu_->copy(gpu_, dy, h_dy.data(), rc, MF_COPY_H2D, gpu_s_), MF_OK);
  ASSERT_EQ(gpu_->copy(gpu_, x, h_x.data(), rc, MF_COPY_H2D, gpu_s_), MF_OK);
  ASSERT_EQ(gpu_->copy(gpu_, w, h_w.data(), c4, MF_COPY_H2D, gpu_s_), MF_OK);
  ASSERT_EQ(gpu_->copy(gpu_, rstd, h_r.data(), r4, MF_COPY_H2D, gpu_s_), MF_OK);
  mf_kernel_call zero = {};
  zero.kind = MF_K_ZERO;
  zero.b[0] = {out, 3 * (rc + c4), 1};
  ASSERT_EQ(gpu_->run(gpu_, &zero, gpu_s_), MF_OK) << mf_last_error();
  ASSERT_EQ(gpu_->stream_sync(gpu_, gpu_s_), MF_OK) << mf_last_error();
  auto call = [&](int which) {
    float *dx = out + (size_t)which * (size_t)(R * C + C), *dw = dx + R * C;
    mf_kernel_call k = {};
    k.kind = MF_K_RMSNORM_BWD;
    k.b[0] = {dy, rc, 0};
    k.b[1] = {x, rc, 0};
    k.b[2] = {w, c4, 0};
    k.b[3] = {rstd, r4, 0};
    k.b[4] = {dx, rc, 1};
    k.b[5] = {dw, c4, 1};
    k.i[0] = R, k.i[1] = C, k.i[2] = 0;
    return k;
  };
  mf_kernel_call lone = call(0), a = call(1), b = call(2);
  ASSERT_EQ(gpu_->run(gpu_, &lone, gpu_s_), MF_OK) << mf_last_error();
  ASSERT_EQ(gpu_->stream_sync(gpu_, gpu_s_), MF_OK) << mf_last_error();
  mf_stream *s2 = nullptr;
  ASSERT_EQ(gpu_->stream_create(gpu_, &s2), MF_OK) << mf_last_error();
  ASSERT_EQ(gpu_->run(gpu_, &a, gpu_s_), MF_OK) << mf_last_error();
  ASSERT_EQ(gpu_->run(gpu_, &b, s2), MF_OK) << mf_last_error();
  ASSERT_EQ(gpu_->stream_sync(gpu_, gpu_s_), MF_OK) << mf_last_error();
  ASSERT_EQ(gpu_->stream_sync(gpu_, s2), MF_OK) << mf_last_error();
  gpu_->stream_free(gpu_, s2);
  std::vector<float> h((size_t)(3 * (R * C + C)));
  ASSERT_EQ(gpu_->copy(gpu_, h.data(), out, h.size() * 4, MF_COPY_D2H, gpu_s_), MF_OK);
  ASSERT_EQ(gpu_->stream_sync(gpu_, gpu_s_), MF_OK) << mf_last_error();
  const size_t one = (size_t)(R * C + C);
  EXPECT_EQ(memcmp(&h[0], &h[one], one * 4), 0) << "stream A differs from the lone call";
  EXPECT_EQ(memcmp(&h[0], &h[2 * one], one * 4), 0) << "stream B differs from the lone call";
  double dw_sq = 0;
  for (int64_t c = 0; c < C; c++) dw_sq += (double)h[(size_t)(R * C + c)] * h[(size_t)(R * C + c)];
  EXPECT_GT(dw_sq, 0.0);  // dw was computed, not left at zero
}

TEST_F(CudaOps, RopeFwdBwd) {
  std::mt19937 rng(5);
  // {T, nh, D, rot}: rot 0 the whole head, else partial RoPE
  const int64_t shapes[][4] = {{1, 1, 2, 0},    {1, 1, 1, 0},    {7, 3, 5, 0},  {37, 4, 64, 0},
                               {300, 8, 128, 0}, {37, 4, 64, 32}, {9, 2, 128, 2}};
  for (auto &s : shapes) {
    const int64_t T = s[0], nh = s[1], D = s[2], rot = s[3];
    for (int bwd = 0; bwd < 2; bwd++) {
      for (double theta : {10000.0, 1000000.0}) {
        Case c{shape(bwd ? "rope_bwd" : "rope_fwd", {T, nh, D, rot, (int64_t)theta}),
               bwd ? MF_K_ROPE_BWD : MF_K_ROPE_FWD};
        c.b = {f32(uniform(rng, (size_t)(T * nh * D), -2, 2), 1e-6), i32(ints(rng, (size_t)T, 0, 511))};
        c.i[0] = T, c.i[1] = nh, c.i[2] = D, c.i[3] = rot;
        c.f[0] = theta;
        check(c);
      }
    }
  }
  // DeepSeek-V3's: {T, nh, D, rot, off, interleaved, truncate} and {theta, factor, original_max,
  // beta_fast, beta_slow, attention_factor}: q heads (nope 128 + rope 64) and the k row (512 + 64)
  // with YaRN (its values; attention factor 1.25), the tail of a head interleaved without YaRN,
  // rotate_half YaRN without truncation
  struct Ds {
    int64_t i[7];
    double f[6];
  };
  const Ds ds[] = {
      {{37, 4, 192, 64, 128, 1, 0}, {10000, 40, 4096, 32, 1, 1.25}},
      {{37, 1, 576, 0, 512, 1, 0}, {10000, 40, 4096, 32, 1, 0}},
      {{9, 3, 24, 16, 8, 1, 0}, {1000000, 0, 0, 0, 0, 0}},
      {{37, 2, 40, 32, 8, 0, -1}, {50000, 32, 4096, 32, 1, 1.3465735902799727}},
  };
  for (const Ds &d : ds) {
    const int64_t T = d.i[0], nh = d.i[1], D = d.i[2];
    for (int bwd = 0; bwd < 2; bwd++) {
      Case c{
          shape(bwd ? "rope_bwd deepseek" : "rope_fwd deepseek", {T, nh, D, d.i[3], d.i[4], d.i[5], d.i[6]}),
          bwd ? MF_K_ROPE_BWD : MF_K_ROPE_FWD};
      // positions within the original 4096: the device's powf may give an inv_freq one ulp
      // from glibc's, which moves an angle by pos x 2^-24 relative (fp32 RoPE's own rounding
      // at long positions; transformers on cpu and cuda differ the same way)
      c.b = {f32(uniform(rng, (size_t)(T * nh * D), -2, 2), 1e-6), i32(ints(rng, (size_t)T, 0, 4095))};
      for (int j = 0; j < 7; j++) c.i[j] = d.i[j];
      for (int j = 0; j < 6; j++) c.f[j] = d.f[j];
      check(c);
    }
  }
}

TEST_F(CudaOps, SwigluFwdBwd) {
  std::mt19937 rng(6);
  for (int64_t n : {1, 3, 1001, 300000}) {
    auto g = uniform(rng, (size_t)n, -8, 8);
    if (n >= 3) g[0] = -100.0f, g[1] = 100.0f, g[2] = 0.0f;  // e^-g overflow / underflow
    auto u = uniform(rng, (size_t)n, -2, 2);
    Case f{shape("swiglu_fwd", {n}), MF_K_SWIGLU_FWD};
    f.b = {f32(g), f32(u), f32(nans((size_t)n), 1e-10)};
    f.i[0] = n;
    check(f);
    Case b{shape("swiglu_bwd", {n}), MF_K_SWIGLU_BWD};
    b.b = {f32(g), f32(u), f32(uniform(rng, (size_t)n, -1, 1)), f32(nans((size_t)n), 1e-10),
           f32(nans((size_t)n), 1e-10)};
    b.i[0] = n;
    check(b);
  }
}

TEST_F(CudaOps, SigmoidGateFwdBwd) {
  std::mt19937 rng(7);
  for (auto &s : kShapes) {
    const int64_t R = s[0], C = s[1];
    auto gl = uniform(rng, (size_t)R, -4, 4);
    auto x = uniform(rng, (size_t)(R * C), -1, 1);
    Case f{shape("sigmoid_gate_fwd", {R, C}), MF_K_SIGGATE_FWD};
    f.b = {f32(gl), f32(x), f32(uniform(rng, (size_t)(R * C), -1, 1), 1e-10)};
    f.i[0] = R, f.i[1] = C;
    check(f);
    Case b{shape("sigmoid_gate_bwd", {R, C}), MF_K_SIGGATE_BWD};
    b.b = {f32(gl), f32(x), f32(uniform(rng, (size_t)(R * C), -1, 1)), f32(nans((size_t)(R * C)), 1e-10),
           f32(nans((size_t)R), 1e-9)};
    b.i[0] = R, b.i[1] = C;
    check(b);
  }
}

TEST_F(CudaOps, Add) {
  std::mt19937 rng(8);
  for (int64_t n : {1, 5, 262147}) {
    for (int fp32 = 0; fp32 < 2; fp32++) {
      Case c{shape("add", {n, fp32}), MF_K_ADD};
      c.b = {f32(uniform(rng, (size_t)n, -1, 1)), f32(uniform(rng, (size_t)n, -1, 1), 0)};
      c.i[0] = n, c.i[1] = fp32;
      check(c);
    }
  }
}

// In place: x *= s, one fp32 multiply each: the same bits as the cpu.
TEST_F(CudaOps, Scale) {
  std::mt19937 rng(9);
  for (int64_t n : {1, 5, 262147}) {
    Case c{shape("scale", {n}), MF_K_SCALE};
    c.b = {f32(uniform(rng, (size_t)n, -1, 1), 0)};
    c.i[0] = n;
    c.f[0] = 2.5;
    check(c);
  }
}

// The same mask (integer hash) and one fp32 multiply: the same bits.
TEST_F(CudaOps, Dropout) {
  std::mt19937 rng(10);
  for (int64_t n : {1, 5, 262147}) {
    Case c{shape("dropout", {n}), MF_K_DROPOUT};
    c.b = {f32(uniform(rng, (size_t)n, -1, 1)), f32(nans((size_t)n), 0)};
    c.i[0] = n, c.i[1] = 3, c.i[2] = 987654321;
    c.f[0] = 0.3;
    check(c);
  }
}

// Router logits: per row a permutation of well-separated values (no near ties),
// except every third row, which holds exact ties (all equal, or equal pairs).
std::vector<float> router_logits(std::mt19937 &rng, int64_t T, int64_t E) {
  std::vector<float> l((size_t)(T * E));
  std::vector<int> perm((size_t)E);
  for (int64_t t = 0; t < T; t++) {
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    float shift = std::uniform_real_distribution<float>(-3, 3)(rng);
    for (int64_t e = 0; e < E; e++) {
      float v = shift + 0.0625f * (float)(perm[(size_t)e] - E / 2);
      if (t % 3 == 1) v = 0.5f;                                          // all tied
      if (t % 3 == 2) v = shift + 0.25f * (float)(perm[(size_t)e] / 2);  // tied pairs
      l[(size_t)(t * E + e)] = v;
    }
  }
  return l;
}

const int64_t kRouter[][3] = {{1, 1, 1}, {1, 4, 4}, {37, 8, 2}, {300, 64, 8}, {129, 60, 4}};

TEST_F(CudaOps, RouterFwd) {
  std::mt19937 rng(9);
  for (auto &s : kRouter) {
    const int64_t T = s[0], E = s[1], K = s[2];
    for (int norm = 0; norm < 2; norm++) {
      Case c{shape("router_fwd", {T, E, K, norm}), MF_K_ROUTER_FWD};
      c.b = {f32(router_logits(rng, T, E)), f32(nans((size_t)(T * E)), 1e-10), i32_unset((size_t)(T * K)),
             f32(nans((size_t)(T * K)), 1e-10)};
      c.i[0] = T, c.i[1] = E, c.i[2] = K, c.i[3] = norm;
      check(c);
    }
  }
}

TEST_F(CudaOps, RouterBwd) {
  std::mt19937 rng(10);
  mf_kctx ctx = {nullptr, 0};
  for (auto &s : kRouter) {
    const int64_t T = s[0], E = s[1], K = s[2];
    for (int norm = 0; norm < 2; norm++) {
      for (int extra = 0; extra < 2; extra++) {
        auto logits = router_logits(rng, T, E);
        std::vector<float> probs((size_t)(T * E)), w((size_t)(T * K));
        std::vector<int32_t> idx((size_t)(T * K));
        ASSERT_EQ(
            mf_cpu_router_fwd(logits.data(), T, E, K, norm, 0, probs.data(), idx.data(), w.data(), &ctx),
            MF_OK);
        Case c{shape("router_bwd", {T, E, K, norm, extra}), MF_K_ROUTER_BWD};
        c.b = {f32(probs),
               i32(idx),
               f32(w),
               f32(uniform(rng, (size_t)(T * K), -1, 1)),
               extra ? f32(uniform(rng, (size_t)(T * E), -0.1f, 0.1f)) : absent(),
               f32(nans((size_t)(T * E)), 1e-9)};
        c.i[0] = T, c.i[1] = E, c.i[2] = K, c.i[3] = norm;
        check(c);
      }
    }
  }
}

// DeepSeek-V3's sigmoid router: {T, E, K, n_group, topk_group}; every shape
// with and without normalisation, bias and scaling. Scores, weights 1e-10
// (device expf), indices equal (logits well separated, the tied rows as above);
// dlogits 1e-9.
const int64_t kRouterGroup[][5] = {{1, 4, 1, 1, 1}, {37, 16, 4, 4, 2}, {129, 64, 8, 8, 4}, {300, 32, 2, 16, 1}};

TEST_F(CudaOps, RouterGroupFwdBwd) {
  std::mt19937 rng(12);
  mf_kctx ctx = {nullptr, 0};
  for (auto &s : kRouterGroup) {
    const int64_t T = s[0], E = s[1], K = s[2], G = s[3], TG = s[4];
    for (int norm = 0; norm < 2; norm++) {
      const double scaling = norm ? 2.5 : 1.0;
      auto logits = router_logits(rng, T, E);
      auto bias = uniform(rng, (size_t)E, -0.05f, 0.05f);
      Case f{shape("router_group_fwd", {T, E, K, G, TG, norm}), MF_K_ROUTER_GROUP_FWD};
      f.b = {f32(logits), norm ? f32(bias) : absent(), f32(nans((size_t)(T * E)), 1e-10),
             i32_unset((size_t)(T * K)), f32(nans((size_t)(T * K)), 1e-10)};
      f.i[0] = T, f.i[1] = E, f.i[2] = K, f.i[3] = G, f.i[4] = TG, f.i[5] = norm;
      f.f[0] = scaling;
      check(f);
      std::vector<float> sc((size_t)(T * E)), w((size_t)(T * K));
      std::vector<int32_t> idx((size_t)(T * K));
      ASSERT_EQ(mf_cpu_router_group_fwd(logits.data(), norm ? bias.data() : nullptr, T, E, K, G, TG, norm,
                                        (float)scaling, sc.data(), idx.data(), w.data(), &ctx),
                MF_OK);
      Case b{shape("router_group_bwd", {T, E, K, G, TG, norm}), MF_K_ROUTER_GROUP_BWD};
      b.b = {f32(sc), i32(idx), f32(uniform(rng, (size_t)(T * K), -1, 1)), f32(nans((size_t)(T * E)), 1e-9)};
      for (int j = 0; j < 6; j++) b.i[j] = f.i[j];
      b.f[0] = scaling;
      check(b);
    }
  }
}

struct Routing {
  std::vector<int32_t> topk, row_of, token_of_row;
  std::vector<int64_t> counts, offsets;
};
Routing routing(std::mt19937 &rng, int64_t T, int64_t E, int64_t K) {
  Routing r;
  r.topk = topk_ids(rng, T, E, K);
  r.counts.resize((size_t)E);
  r.offsets.resize((size_t)E + 1);
  r.row_of.resize((size_t)(T * K) + 1);
  r.token_of_row.resize((size_t)(T * K) + 1);
  EXPECT_EQ(mf_cpu_moe_dispatch(r.topk.data(), T, K, E, r.counts.data(), r.offsets.data(), r.row_of.data(),
                                r.token_of_row.data()),
            MF_OK);
  r.row_of.resize((size_t)(T * K));
  r.token_of_row.resize((size_t)(T * K));
  return r;
}

// (T, E, K): one token; more experts than rows (empty experts); typical.
const int64_t kMoe[][3] = {{1, 1, 1}, {1, 16, 2}, {3, 64, 4}, {37, 8, 2}, {300, 60, 4}, {1000, 128, 8}};

TEST_F(CudaOps, MoeDispatch) {
  std::mt19937 rng(11);
  for (auto &s : kMoe) {
    const int64_t T = s[0], E = s[1], K = s[2];
    Case c{shape("moe_dispatch", {T, K, E}), MF_K_MOE_DISPATCH};
    c.b = {i32(topk_ids(rng, T, E, K)), i64(std::vector<int64_t>((size_t)E, -7)),
           i64(std::vector<int64_t>((size_t)E + 1, -7)), i32_unset((size_t)(T * K)),
           i32_unset((size_t)(T * K))};
    c.i[0] = T, c.i[1] = K, c.i[2] = E;
    check(c);
  }
  // Every token to one expert: one expert owns every row.
  Case one{"moe_dispatch all to expert 2", MF_K_MOE_DISPATCH};
  const int64_t T = 700, K = 1, E = 4;
  one.b = {i32(std::vector<int32_t>((size_t)T, 2)), i64(std::vector<int64_t>((size_t)E, -7)),
           i64(std::vector<int64_t>((size_t)E + 1, -7)), i32_unset((size_t)T), i32_unset((size_t)T)};
  one.i[0] = T, one.i[1] = K, one.i[2] = E;
  check(one);
}

const int64_t kHidden[] = {1, 129, 1000};

TEST_F(CudaOps, MoeGatherAndBwd) {
  std::mt19937 rng(12);
  for (auto &s : kMoe) {
    const int64_t T = s[0], E = s[1], K = s[2], R = T * K;
    Routing rt = routing(rng, T, E, K);
    for (int64_t H : kHidden) {
      Case g{shape("moe_gather", {R, H}), MF_K_MOE_GATHER};
      g.b = {f32(uniform(rng, (size_t)(T * H), -1, 1)), i32(rt.token_of_row), f32(nans((size_t)(R * H)), 0)};
      g.i[0] = R, g.i[1] = H;
      check(g);
      for (int acc = 0; acc < 2; acc++) {
        Case b{shape("moe_gather_bwd", {T, K, H, acc}), MF_K_MOE_GATHER_BWD};
        b.b = {f32(uniform(rng, (size_t)(R * H), -1, 1)), i32(rt.row_of),
               f32(acc ? uniform(rng, (size_t)(T * H), -1, 1) : nans((size_t)(T * H)), 0)};
        b.i[0] = T, b.i[1] = K, b.i[2] = H, b.i[3] = acc;
        check(b);
      }
    }
  }
}

TEST_F(CudaOps, MoeCombineAndBwd) {
  std::mt19937 rng(13);
  for (auto &s : kMoe) {
    const int64_t T = s[0], E = s[1], K = s[2], R = T * K;
    Routing rt = routing(rng, T, E, K);
    for (int64_t H : kHidden) {
      auto ye = uniform(rng, (size_t)(R * H), -1, 1);
      auto w = uniform(rng, (size_t)(T * K), 0, 1);
      Case c{shape("moe_combine", {T, K, H}), MF_K_MOE_COMBINE};
      c.b = {f32(ye), f32(w), i32(rt.row_of), f32(uniform(rng, (size_t)(T * H), -1, 1), 1e-10)};
      c.i[0] = T, c.i[1] = K, c.i[2] = H;
      check(c);
      Case b{shape("moe_combine_bwd", {T, K, H}), MF_K_MOE_COMBINE_BWD};
      b.b = {f32(uniform(rng, (size_t)(T * H), -1, 1)),
             f32(ye),
             f32(w),
             i32(rt.row_of),
             f32(nans((size_t)(R * H)), 0),
             f32(nans((size_t)(T * K)), 1e-9)};
      b.i[0] = T, b.i[1] = K, b.i[2] = H;
      check(b);
    }
  }
}

TEST_F(CudaOps, AuxLoss) {
  std::mt19937 rng(14);
  mf_kctx ctx = {nullptr, 0};
  for (auto &s : kMoe) {
    const int64_t T = s[0], E = s[1], K = s[2];
    auto logits = router_logits(rng, T, E);
    std::vector<float> probs((size_t)(T * E)), w((size_t)(T * K));
    std::vector<int32_t> idx((size_t)(T * K));
    ASSERT_EQ(mf_cpu_router_fwd(logits.data(), T, E, K, 1, 0, probs.data(), idx.data(), w.data(), &ctx),
              MF_OK);
    std::vector<int64_t> counts0((size_t)E);
    std::vector<double> psum0((size_t)E);
    for (auto &v : counts0) v = std::uniform_int_distribution<int64_t>(0, 1000)(rng);
    for (auto &v : psum0) v = std::uniform_real_distribution<double>(0, 100)(rng);

    Case a{shape("aux_accumulate", {T, E, K}), MF_K_AUX_ACCUMULATE};
    a.b = {f32(probs), i32(idx), i64(counts0), f64(psum0, 1e-24)};
    a.i[0] = T, a.i[1] = E, a.i[2] = K;
    check(a);

    const int64_t n_rows = 3 * T + 1;
    Case v{shape("aux_value", {E, n_rows}), MF_K_AUX_VALUE};
    v.b = {i64(counts0), f64(psum0), f64({std::nan("")}, 1e-24)};
    v.i[0] = E, v.i[1] = n_rows;
    check(v);

    Case g{shape("aux_grad", {E, n_rows, T}), MF_K_AUX_GRAD};
    g.b = {i64(counts0), f32(nans((size_t)(T * E)), 1e-20)};
    g.i[0] = E, g.i[1] = n_rows, g.i[2] = T;
    g.f[0] = 0.01;
    check(g);
  }
}

// Attention whose value heads (Dv, i[5]) differ from the query/key heads (D):
// {B, S, Hq, Hkv, D, Dv}, DeepSeek-V3's 192 / 128 with GQA, Dv above D, odd
// dims. The rest of attention is tests/cuda/attention_test.cc's (which says why
// the tolerances: o, lse 1e-10; dq, dk, dv 1e-8). The backward's o and lse
// are the cpu forward's.
const int64_t kAttnDv[][6] = {{1, 37, 4, 2, 192, 128}, {2, 33, 2, 1, 48, 80}, {1, 20, 3, 3, 5, 3}};

TEST_F(CudaOps, AttentionValueHeadDim) {
  std::mt19937 rng(14);
  mf_kctx ctx = {nullptr, 0};
  for (auto &s : kAttnDv) {
    const int64_t B = s[0], S = s[1], Hq = s[2], Hkv = s[3], D = s[4], Dv = s[5];
    const size_t nq = (size_t)(B * S * Hq * D), nk = (size_t)(B * S * Hkv * D);
    const size_t no = (size_t)(B * S * Hq * Dv), nv = (size_t)(B * S * Hkv * Dv), nl = (size_t)(B * Hq * S);
    const float scale = 1.0f / std::sqrt((float)D);
    auto q = uniform(rng, nq, -1, 1), k = uniform(rng, nk, -1, 1), v = uniform(rng, nv, -1, 1);
    auto dout = uniform(rng, no, -1, 1);
    Case f{shape("attn_fwd", {B, S, Hq, Hkv, D, Dv}), MF_K_ATTN_FWD};
    f.b = {f32(q), f32(k), f32(v), f32(nans(no), 1e-10), f32(nans(nl), 1e-10)};
    for (int j = 0; j < 6; j++) f.i[j] = s[j];
    f.f[0] = scale;
    check(f);
    std::vector<float> o(no), lse(nl);
    ASSERT_EQ(mf_cpu_attn_fwd(q.data(), k.data(), v.data(), B, S, Hq, Hkv, D, Dv, 0, nullptr, scale, o.data(),
                              lse.data(), &ctx),
              MF_OK);
    Case b{shape("attn_bwd", {B, S, Hq, Hkv, D, Dv}), MF_K_ATTN_BWD};
    b.b = {f32(q),
           f32(k),
           f32(v),
           f32(o),
           f32(dout),
           f32(lse),
           f32(nans(nq), 1e-8),
           f32(nans(nk), 1e-8),
           f32(nans(nv), 1e-8)};
    for (int j = 0; j < 6; j++) b.i[j] = s[j];
    b.f[0] = scale;
    check(b);
  }
}

}  // namespace
