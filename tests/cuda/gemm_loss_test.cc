// The cuda backend's GEMM kinds (LINEAR_*, EXPERT_*) and CROSS_ENTROPY against
// the cpu backend (the reference, fp32 storage) on random data, at ones, odd
// sizes and small versions of the training shapes' aspect ratios (MoE with
// hidden 2048, expert width 768, 128 experts top-8, vocabulary 152k, scaled
// down), plus determinism: two cuda runs of one call give the same bits.
//
// Comparison per output: NMSE = sum (gpu - cpu)^2 / sum cpu^2 at most the
// stated tolerance. Tolerances (why):
//   linear fwd / bwd_data / bwd_weight, dbias: 1e-10 — fp32 products summed in
//     another order (cuBLASLt's tiles vs the cpu's sequential dot): per element
//     about sqrt(K) ulps, NMSE ~ K * 1e-14 for K <= 1000.
//   expert fwd / bwd_data / bwd_weight: 1e-10 — a sequential fma dot vs the
//     cpu's dot in the same order but unfused.
//   cross-entropy lse: 1e-11 (values ~ log V; an online merge of chunk sums vs a
//     running max); {loss_sum, n_valid}: 1e-10; dh, dW: 1e-9 (g = p - onehot
//     from logits that differ in the last bits, then a GEMM).
// Experts without rows have NULL weights (as the program passes them); the
// GPU must not read them.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cuda/backend_cuda.h"
#include "src/core/core.h"
#include "tests/cuda/gpu_test_util.h"
#include "tests/cuda/twin_fixture.h"

namespace {

// One operand: bytes, its tolerance when the kernel writes it (the operand
// table's word, kernels/backend.h: written operands are compared after the
// call, except scratch), and whether it is a double buffer (else fp32, or
// integers, which no kind here writes).
struct Slot {
  std::vector<uint8_t> data;
  bool present = false, f64 = false;
  bool scratch = false;  // written by the kernel, but with contents of its own: not compared
  double tol = 0;
};

template <typename T>
Slot slot(const std::vector<T> &v, double tol = 0) {
  Slot s;
  s.data.resize(v.size() * sizeof(T));
  if (!v.empty()) memcpy(s.data.data(), v.data(), s.data.size());
  s.present = true;
  s.tol = tol;
  s.f64 = sizeof(T) == 8 && std::is_floating_point<T>::value;
  return s;
}

struct Case {
  std::string name;
  mf_kernel kind;
  std::vector<Slot> b;
  std::vector<Slot> experts;  // absent (present = false): NULL pointer
  double experts_tol = 0;     // when the kind writes them
  int64_t i[8] = {0};
  double f[2] = {0, 0};
  size_t misalign = 0;  // bytes added to every device operand's offset (multiple of 4)
};

std::vector<float> uniform(std::mt19937 &rng, size_t n, float lo = -1, float hi = 1) {
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto &x : v) x = d(rng);
  return v;
}

double nmse(const Slot &s, const std::vector<uint8_t> &want, const std::vector<uint8_t> &got) {
  double num = 0, den = 0;
  const size_t w = s.f64 ? 8 : 4, n = s.data.size() / w;
  for (size_t k = 0; k < n; k++) {
    double a, b;
    if (s.f64) {
      memcpy(&a, &want[k * 8], 8);
      memcpy(&b, &got[k * 8], 8);
    } else {
      float x, y;
      memcpy(&x, &want[k * 4], 4);
      memcpy(&y, &got[k * 4], 4);
      a = x, b = y;
    }
    if (std::isnan(a) != std::isnan(b)) return INFINITY;
    if (std::isnan(a)) continue;
    num += (b - a) * (b - a);
    den += a * a;
  }
  return num / std::max(den, 1e-300);
}

typedef std::vector<std::vector<uint8_t>> Mem;

class CudaGemm : public CudaTwin<(size_t)256 << 20> {
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
      EXPECT_TRUE(c.b[j].present || t->b[j].optional) << c.name << ": operand " << t->b[j].name << " absent";
    EXPECT_EQ(!c.experts.empty(), t && t->experts.name != nullptr) << c.name;
    if (!c.experts.empty()) {
      for (auto &e : c.experts)
        if (e.present) k.expert_bytes = e.data.size();
    }
    return k;
  }

  // Outputs of the cpu reference: slots, then experts.
  void run_cpu(const Case &c, Mem *slots, Mem *experts) {
    *slots = Mem(c.b.size());
    *experts = Mem(c.experts.size());
    mf_kernel_call k = call_of(c);
    for (size_t j = 0; j < c.b.size(); j++) {
      if (!c.b[j].present) continue;
      (*slots)[j] = c.b[j].data;
      k.b[j] = {(*slots)[j].data(), c.b[j].data.size(), (int)(mf_kernel_writes(&k) >> j & 1u)};
    }
    std::vector<void *> ptrs(c.experts.size(), nullptr);
    for (size_t e = 0; e < c.experts.size(); e++) {
      if (!c.experts[e].present) continue;
      (*experts)[e] = c.experts[e].data;
      ptrs[e] = (*experts)[e].data();
    }
    k.experts = ptrs.empty() ? nullptr : ptrs.data();
    EXPECT_EQ(cpu_->run(cpu_, &k, cpu_s_), MF_OK) << c.name << ": " << mf_last_error();
  }

  void run_gpu(const Case &c, Mem *slots, Mem *experts) {
    *slots = Mem(c.b.size());
    *experts = Mem(c.experts.size());
    mf_kernel_call k = call_of(c);
    size_t off = 0;
    auto place = [&](const std::vector<uint8_t> &data) -> uint8_t * {
      uint8_t *p = arena_ + off + c.misalign;
      off += (data.size() + c.misalign + 255) / 256 * 256 + 256;
      if (off > kArena) return nullptr;
      EXPECT_EQ(gpu_->copy(gpu_, p, data.data(), data.size(), MF_COPY_H2D, gpu_s_), MF_OK) << mf_last_error();
      return p;
    };
    std::vector<uint8_t *> dev(c.b.size(), nullptr), edev(c.experts.size(), nullptr);
    for (size_t j = 0; j < c.b.size(); j++) {
      if (!c.b[j].present) continue;
      dev[j] = place(c.b[j].data);
      ASSERT_NE(dev[j], nullptr) << c.name << ": the test arena is too small";
      k.b[j] = {dev[j], c.b[j].data.size(), (int)(mf_kernel_writes(&k) >> j & 1u)};
    }
    std::vector<void *> ptrs(c.experts.size(), nullptr);
    for (size_t e = 0; e < c.experts.size(); e++) {
      if (!c.experts[e].present) continue;
      edev[e] = place(c.experts[e].data);
      ASSERT_NE(edev[e], nullptr) << c.name << ": the test arena is too small";
      ptrs[e] = edev[e];
    }
    k.experts = ptrs.empty() ? nullptr : ptrs.data();
    EXPECT_EQ(gpu_->run(gpu_, &k, gpu_s_), MF_OK) << c.name << ": " << mf_last_error();
    for (size_t j = 0; j < c.b.size(); j++) {
      if (!c.b[j].present) continue;
      (*slots)[j].resize(c.b[j].data.size());
      EXPECT_EQ(gpu_->copy(gpu_, (*slots)[j].data(), dev[j], c.b[j].data.size(), MF_COPY_D2H, gpu_s_), MF_OK);
    }
    for (size_t e = 0; e < c.experts.size(); e++) {
      if (!c.experts[e].present) continue;
      (*experts)[e].resize(c.experts[e].data.size());
      EXPECT_EQ(
          gpu_->copy(gpu_, (*experts)[e].data(), edev[e], c.experts[e].data.size(), MF_COPY_D2H, gpu_s_),
          MF_OK);
    }
    EXPECT_EQ(gpu_->stream_sync(gpu_, gpu_s_), MF_OK) << c.name << ": " << mf_last_error();
  }

  void compare(const std::string &what, const Slot &s, const std::vector<uint8_t> &want,
               const std::vector<uint8_t> &got, const std::vector<uint8_t> &again) {
    ASSERT_EQ(got.size(), s.data.size()) << what;
    ASSERT_EQ(again.size(), s.data.size()) << what;
    EXPECT_TRUE(got == again) << what << ": two cuda runs differ (not deterministic)";
    const double err = nmse(s, want, got);
    EXPECT_LE(err, s.tol) << what << " (" << s.data.size() / (s.f64 ? 8 : 4) << " values): NMSE " << err;
  }

  void check(const Case &c) {
    SCOPED_TRACE(c.name);
    Mem want, want_e, got, got_e, again, again_e;
    run_cpu(c, &want, &want_e);
    run_gpu(c, &got, &got_e);
    run_gpu(c, &again, &again_e);
    const mf_kernel_call k = call_of(c);
    int compared = 0;
    for (size_t j = 0; j < c.b.size(); j++) {
      if (!c.b[j].present || c.b[j].scratch || !(mf_kernel_writes(&k) >> j & 1u)) continue;
      compare(std::string("operand ") + mf_kernel_info_of(c.kind)->b[j].name, c.b[j], want[j], got[j],
              again[j]);
      compared++;
    }
    if (mf_kernel_writes_experts(c.kind)) {
      for (size_t e = 0; e < c.experts.size(); e++) {
        if (!c.experts[e].present) continue;
        Slot s = c.experts[e];
        s.tol = c.experts_tol;
        compare("expert " + std::to_string(e), s, want_e[e], got_e[e], again_e[e]);
        compared++;
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

// {M, N, K}: ones, odd, the attention / MLP projections' aspect ratios scaled
// down (hidden 2048 -> 128: q/k/v/o, gate 2048 -> 128 x 128 experts -> 16).
const int64_t kLinear[][3] = {{1, 1, 1},       {37, 129, 65},  {300, 33, 511},
                              {256, 128, 128}, {130, 16, 128}, {64, 512, 96}};

TEST_F(CudaGemm, LinearFwd) {
  std::mt19937 rng(11);
  for (auto &s : kLinear) {
    const int64_t M = s[0], N = s[1], K = s[2];
    for (int acc = 0; acc < 2; acc++)
      for (int bias = 0; bias < 2; bias++) {
        Case c{shape(acc ? "linear_fwd acc" : "linear_fwd", {M, N, K, bias}), MF_K_LINEAR_FWD};
        std::vector<float> y0 =
            acc ? uniform(rng, (size_t)(M * N)) : std::vector<float>((size_t)(M * N), NAN);
        c.b = {slot(uniform(rng, (size_t)(M * K))), slot(uniform(rng, (size_t)(N * K))),
               bias ? slot(uniform(rng, (size_t)N)) : Slot(), slot(y0, 1e-10)};
        c.i[0] = M, c.i[1] = N, c.i[2] = K, c.i[3] = acc;
        c.misalign = (bias && acc) ? 4 : 0;  // operands only 4-byte aligned
        check(c);
      }
  }
}

TEST_F(CudaGemm, LinearBwdData) {
  std::mt19937 rng(12);
  for (auto &s : kLinear) {
    const int64_t M = s[0], N = s[1], K = s[2];
    for (int acc = 0; acc < 2; acc++) {
      Case c{shape(acc ? "linear_bwd_data acc" : "linear_bwd_data", {M, N, K}), MF_K_LINEAR_BWD_DATA};
      std::vector<float> dx0 = acc ? uniform(rng, (size_t)(M * K)) : std::vector<float>((size_t)(M * K), NAN);
      c.b = {slot(uniform(rng, (size_t)(M * N))), slot(uniform(rng, (size_t)(N * K))), slot(dx0, 1e-10)};
      c.i[0] = M, c.i[1] = N, c.i[2] = K, c.i[3] = acc;
      c.misalign = acc ? 8 : 0;
      check(c);
    }
  }
}

TEST_F(CudaGemm, LinearBwdWeight) {
  std::mt19937 rng(13);
  for (auto &s : kLinear) {
    const int64_t M = s[0], N = s[1], K = s[2];
    for (int bias = 0; bias < 2; bias++) {
      Case c{shape("linear_bwd_weight", {M, N, K, bias}), MF_K_LINEAR_BWD_WEIGHT};
      c.b = {slot(uniform(rng, (size_t)(M * N))), slot(uniform(rng, (size_t)(M * K))),
             slot(uniform(rng, (size_t)(N * K)), 1e-10),
             bias ? slot(uniform(rng, (size_t)N), 1e-10) : Slot()};
      c.i[0] = M, c.i[1] = N, c.i[2] = K;
      check(c);
    }
  }
}

// Host dispatch: offsets of T*K rows over E experts, where the experts in
// `empty` get no rows.
std::vector<int64_t> expert_offsets(std::mt19937 &rng, int64_t R, int64_t E, const std::vector<int> &empty) {
  std::vector<int64_t> counts((size_t)E, 0);
  std::vector<int> live;
  for (int e = 0; e < E; e++)
    if (std::find(empty.begin(), empty.end(), e) == empty.end()) live.push_back(e);
  std::uniform_int_distribution<size_t> d(0, live.size() - 1);
  for (int64_t r = 0; r < R; r++) counts[(size_t)live[d(rng)]]++;
  std::vector<int64_t> off((size_t)E + 1, 0);
  for (int64_t e = 0; e < E; e++) off[(size_t)e + 1] = off[(size_t)e] + counts[(size_t)e];
  return off;
}

// {T*K rows, E, N, Kd}: ones, odd, the MoE up/gate (N = 2*width) and down
// projections scaled down, one expert with many rows.
const int64_t kExpert[][4] = {
    {1, 1, 1, 1}, {37, 5, 129, 65}, {512, 16, 96, 128}, {512, 16, 128, 48}, {200, 3, 70, 33}};

TEST_F(CudaGemm, Experts) {
  std::mt19937 rng(14);
  for (auto &s : kExpert) {
    const int64_t R = s[0], E = s[1], N = s[2], Kd = s[3];
    std::vector<int> empty;
    if (E >= 5) empty = {1, (int)E - 1};  // experts without rows, their weights absent
    if (E == 3) empty = {0};
    auto off = expert_offsets(rng, R, E, empty);
    auto weights = [&]() {
      std::vector<Slot> w((size_t)E);
      for (int64_t e = 0; e < E; e++)
        if (off[(size_t)e + 1] > off[(size_t)e]) w[(size_t)e] = slot(uniform(rng, (size_t)(N * Kd)));
      return w;
    };
    Case f{shape("expert_fwd", {R, E, N, Kd}), MF_K_EXPERT_FWD};
    f.b = {slot(uniform(rng, (size_t)(R * Kd))), slot(off),
           slot(std::vector<float>((size_t)(R * N), NAN), 1e-10)};
    f.experts = weights();
    f.i[0] = E, f.i[1] = N, f.i[2] = Kd;
    check(f);
    Case d{shape("expert_bwd_data", {R, E, N, Kd}), MF_K_EXPERT_BWD_DATA};
    d.b = {slot(uniform(rng, (size_t)(R * N))), slot(off),
           slot(std::vector<float>((size_t)(R * Kd), NAN), 1e-10)};
    d.experts = weights();
    d.i[0] = E, d.i[1] = N, d.i[2] = Kd;
    check(d);
    Case w{shape("expert_bwd_weight", {R, E, N, Kd}), MF_K_EXPERT_BWD_WEIGHT};
    w.b = {slot(uniform(rng, (size_t)(R * N))), slot(uniform(rng, (size_t)(R * Kd))), slot(off)};
    w.experts = weights();
    w.experts_tol = 1e-10;
    w.i[0] = E, w.i[1] = N, w.i[2] = Kd;
    check(w);
  }
}

// {T, V, H, chunk}: ones, odd with a ragged last chunk, one chunk, the LM
// head's aspect ratio scaled down (V / H ~ 74 -> 3000 / 40).
const int64_t kCe[][4] = {{1, 1, 1, 1}, {37, 1001, 65, 256}, {64, 300, 96, 300}, {96, 3000, 40, 512}};

TEST_F(CudaGemm, CrossEntropy) {
  std::mt19937 rng(15);
  for (auto &s : kCe) {
    const int64_t T = s[0], V = s[1], H = s[2], chunk = s[3];
    for (int grads = 0; grads < 3; grads++) {                        // none, dh only, dh and dW
      std::uniform_int_distribution<int32_t> d(-1, (int32_t)V - 1);  // -1: ignored
      std::vector<int32_t> target((size_t)T);
      for (auto &t : target) t = d(rng);
      if (T > 1) target[0] = -1;
      Case c{shape("cross_entropy", {T, V, H, chunk, grads}), MF_K_CROSS_ENTROPY};
      c.b = {slot(uniform(rng, (size_t)(T * H), -2, 2)),
             slot(uniform(rng, (size_t)(V * H), -0.5f, 0.5f)),
             slot(target),
             slot(std::vector<float>((size_t)(T * chunk), NAN)),  // ws: scratch
             slot(std::vector<float>((size_t)T, NAN), 1e-11),
             slot(std::vector<double>{NAN, NAN}, 1e-10),
             grads >= 1 ? slot(std::vector<float>((size_t)(T * H), NAN), 1e-9) : Slot(),
             grads >= 2 ? slot(uniform(rng, (size_t)(V * H)), 1e-9) : Slot()};
      c.b[3].scratch = true;
      c.i[0] = T, c.i[1] = V, c.i[2] = H, c.i[3] = chunk;
      c.f[0] = grads == 2 ? 1.0 / 1024 : 1.0;
      check(c);
    }
  }
}

// GEMMs on two streams at once share the one cuBLASLt workspace: the backend
// orders them, so each result is the bits of a lone call. A tall-skinny
// weight gradient (a long contraction, where split-K is likely) on both.
TEST_F(CudaGemm, TwoStreamsShareTheWorkspace) {
  std::mt19937 rng(16);
  const int64_t M = 8192, N = 64, K = 96;
  const std::vector<float> dy = uniform(rng, (size_t)(M * N)), x = uniform(rng, (size_t)(M * K)),
                           dw0 = uniform(rng, (size_t)(N * K));
  mf_stream *s2 = nullptr;
  ASSERT_EQ(gpu_->stream_create(gpu_, &s2), MF_OK) << mf_last_error();
  uint8_t *p_dy = arena_, *p_x = p_dy + dy.size() * 4, *p_w[3];
  p_w[0] = p_x + x.size() * 4;
  p_w[1] = p_w[0] + dw0.size() * 4;
  p_w[2] = p_w[1] + dw0.size() * 4;
  ASSERT_EQ(gpu_->copy(gpu_, p_dy, dy.data(), dy.size() * 4, MF_COPY_H2D, gpu_s_), MF_OK);
  ASSERT_EQ(gpu_->copy(gpu_, p_x, x.data(), x.size() * 4, MF_COPY_H2D, gpu_s_), MF_OK);
  for (int j = 0; j < 3; j++)
    ASSERT_EQ(gpu_->copy(gpu_, p_w[j], dw0.data(), dw0.size() * 4, MF_COPY_H2D, gpu_s_), MF_OK);
  ASSERT_EQ(gpu_->stream_sync(gpu_, gpu_s_), MF_OK);
  auto call = [&](uint8_t *w) {
    mf_kernel_call k = {};
    k.kind = MF_K_LINEAR_BWD_WEIGHT;
    k.b[0] = {p_dy, dy.size() * 4, 0};
    k.b[1] = {p_x, x.size() * 4, 0};
    k.b[2] = {w, dw0.size() * 4, 1};
    k.i[0] = M, k.i[1] = N, k.i[2] = K;
    return k;
  };
  mf_kernel_call lone = call(p_w[0]);
  ASSERT_EQ(gpu_->run(gpu_, &lone, gpu_s_), MF_OK) << mf_last_error();
  ASSERT_EQ(gpu_->stream_sync(gpu_, gpu_s_), MF_OK) << mf_last_error();
  mf_kernel_call a = call(p_w[1]), b = call(p_w[2]);
  ASSERT_EQ(gpu_->run(gpu_, &a, gpu_s_), MF_OK) << mf_last_error();
  ASSERT_EQ(gpu_->run(gpu_, &b, s2), MF_OK) << mf_last_error();
  ASSERT_EQ(gpu_->stream_sync(gpu_, gpu_s_), MF_OK) << mf_last_error();
  ASSERT_EQ(gpu_->stream_sync(gpu_, s2), MF_OK) << mf_last_error();
  std::vector<float> w[3];
  for (int j = 0; j < 3; j++) {
    w[j].resize(dw0.size());
    ASSERT_EQ(gpu_->copy(gpu_, w[j].data(), p_w[j], dw0.size() * 4, MF_COPY_D2H, gpu_s_), MF_OK);
  }
  ASSERT_EQ(gpu_->stream_sync(gpu_, gpu_s_), MF_OK);
  gpu_->stream_free(gpu_, s2);
  EXPECT_EQ(memcmp(w[0].data(), w[1].data(), dw0.size() * 4), 0) << "stream 1 differs from a lone call";
  EXPECT_EQ(memcmp(w[0].data(), w[2].data(), dw0.size() * 4), 0) << "stream 2 differs from a lone call";
  EXPECT_NE(memcmp(w[0].data(), dw0.data(), dw0.size() * 4), 0) << "dW was not updated";
}

// More experts than one launch's pointer table holds: a clean error, no launch.
TEST_F(CudaGemm, TooManyExperts) {
  const int64_t E = MF_CUDA_MAX_EXPERTS + 1;
  std::vector<void *> w((size_t)E, nullptr);
  mf_kernel_call k = {};
  k.kind = MF_K_EXPERT_FWD;
  k.b[0] = {arena_, 4 * 8, 0};
  k.b[1] = {arena_ + 256, (size_t)(E + 1) * 8, 0};
  k.b[2] = {arena_ + 65536, 4 * 8, 1};
  k.i[0] = E, k.i[1] = 1, k.i[2] = 1;
  k.experts = w.data();
  EXPECT_EQ(gpu_->run(gpu_, &k, gpu_s_), MF_ERR_UNSUPPORTED);
  EXPECT_NE(std::string(mf_last_error()).find("experts"), std::string::npos) << mf_last_error();
}

}  // namespace
