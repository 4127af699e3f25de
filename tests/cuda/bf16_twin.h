// The bf16 twin runner of the GPU tests: one kernel call, described with fp32
// host operands as the cpu twin takes them, run twice —
//   cpu:  the cpu backend with round_bf16 (every stored output rounded to bf16),
//         on the host operands as given;
//   cuda: the cuda backend with BF16 storage: every FLOAT operand of the call
//         (kernels/backend.c's operand table) narrowed to bf16 in device memory,
//         the other operands (F32, F64, I32, I64) copied as they are —
// and every operand the call writes read back (FLOAT ones widened to fp32), so a
// test compares the two with a tolerance. Inputs should be bf16-representable
// (mf_test_bf16_values) so both sides start from the same numbers. Without a GPU
// the caller skips (MF_SKIP_WITHOUT_GPU).
#ifndef MF_TESTS_CUDA_BF16_TWIN_H
#define MF_TESTS_CUDA_BF16_TWIN_H

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cuda/backend_cuda.h"
#include "src/core/core.h"
#include "tests/cuda/gpu_test_util.h"
#include "tests/cuda/twin_fixture.h"

// n values uniform in [-scale, scale], rounded to bf16 (exactly representable).
inline std::vector<float> mf_test_bf16_values(size_t n, uint64_t seed, float scale = 1.0f) {
  std::mt19937_64 g(seed);
  std::uniform_real_distribution<float> d(-scale, scale);
  std::vector<float> v(n);
  for (auto &x : v) x = mf_bf16_to_fp32(mf_fp32_to_bf16(d(g)));
  return v;
}

// One operand of a twin call: host bytes (fp32 for a FLOAT operand) or absent.
struct MfTwinOperand {
  std::vector<uint8_t> host;  // the operand as the cpu twin takes it; empty: absent
  template <typename V>
  static MfTwinOperand of(const std::vector<V> &v) {
    MfTwinOperand o;
    o.host.resize(v.size() * sizeof(V));
    if (!v.empty()) std::memcpy(o.host.data(), v.data(), o.host.size());
    return o;
  }
};

// What the runner gives back: per operand slot (and per expert, for an
// EXPERT_BWD_WEIGHT call), the bytes after the call on each side; FLOAT
// operands widened to fp32 on the cuda side so both are fp32 arrays.
struct MfTwinResult {
  std::vector<uint8_t> cpu[MF_KBUF_MAX], gpu[MF_KBUF_MAX];
  std::vector<std::vector<uint8_t>> cpu_experts, gpu_experts;
  template <typename V>
  static std::vector<V> as(const std::vector<uint8_t> &b) {
    std::vector<V> v(b.size() / sizeof(V));
    if (!v.empty()) std::memcpy(v.data(), b.data(), v.size() * sizeof(V));
    return v;
  }
};

class MfBf16Twin : public CudaTwin<((size_t)256 << 20)> {
 protected:
  int cpu_round_bf16() override { return 1; }

  // Runs `call` (its kind, i[], f[], label; b[] and experts are filled here
  // from `ops` and `experts`) on both backends. ops[j] is operand j's host
  // bytes (empty: absent). experts: E expert weights (fp32 host arrays; an
  // empty one stands for an expert without rows: NULL) for the EXPERT_* kinds.
  MfTwinResult run(mf_kernel_call call, const std::vector<MfTwinOperand> &ops,
                   const std::vector<std::vector<float>> &experts = {}) {
    MfTwinResult r;
    const mf_kernel_info *info = mf_kernel_info_of(call.kind);
    EXPECT_NE(info, nullptr);
    if (!info) return r;
    const int n = mf_kernel_n_operands(call.kind);
    // cpu: host operands as given.
    std::vector<std::vector<uint8_t>> host(MF_KBUF_MAX);
    std::vector<std::vector<float>> host_experts = experts;
    std::vector<void *> cpu_eptr(experts.size(), nullptr);
    mf_kernel_call c = call;
    for (int j = 0; j < MF_KBUF_MAX; j++) {
      c.b[j] = mf_kbuf{};
      if (j < (int)ops.size() && !ops[j].host.empty()) {
        host[j] = ops[j].host;
        c.b[j].ptr = host[j].data();
        c.b[j].bytes = host[j].size();
      }
    }
    for (size_t e = 0; e < host_experts.size(); e++)
      cpu_eptr[e] = host_experts[e].empty() ? nullptr : host_experts[e].data();
    if (!experts.empty()) {
      c.experts = cpu_eptr.data();
      c.expert_bytes = 0;
      for (auto &w : experts) c.expert_bytes = std::max(c.expert_bytes, w.size() * sizeof(float));
    }
    EXPECT_EQ(cpu_->run(cpu_, &c, cpu_s_), MF_OK) << mf_last_error();
    EXPECT_EQ(cpu_->stream_sync(cpu_, cpu_s_), MF_OK) << mf_last_error();
    for (int j = 0; j < n; j++) r.cpu[j] = host[j];
    for (auto &w : host_experts) {
      std::vector<uint8_t> b(w.size() * sizeof(float));
      if (!b.empty()) std::memcpy(b.data(), w.data(), b.size());
      r.cpu_experts.push_back(b);
    }

    // cuda: FLOAT operands narrowed to bf16 in the arena.
    size_t off = 0;
    auto place = [&](size_t bytes) {
      uint8_t *p = arena_ + off;
      off += (bytes + 255) / 256 * 256;
      EXPECT_LE(off, kArena) << "the twin's operands do not fit its arena";
      return p;
    };
    auto narrow = [](const std::vector<uint8_t> &f32) {
      std::vector<uint8_t> b(f32.size() / 2);
      mf_fp32_to_bf16_n(reinterpret_cast<const float *>(f32.data()), reinterpret_cast<uint16_t *>(b.data()),
                        f32.size() / 4);
      return b;
    };
    mf_kernel_call g = call;
    std::vector<uint8_t *> dev(MF_KBUF_MAX, nullptr);
    std::vector<int> is_float(MF_KBUF_MAX, 0);
    for (int j = 0; j < MF_KBUF_MAX; j++) {
      g.b[j] = mf_kbuf{};
      if (j >= (int)ops.size() || ops[j].host.empty()) continue;
      const mf_kop_type t = j < n ? info->b[j].type : MF_KT_BYTES;
      is_float[j] = t == MF_KT_FLOAT;
      std::vector<uint8_t> bytes = is_float[j] ? narrow(ops[j].host) : ops[j].host;
      dev[j] = place(bytes.size());
      if (off > kArena) return r;
      EXPECT_EQ(gpu_->copy(gpu_, dev[j], bytes.data(), bytes.size(), MF_COPY_H2D, gpu_s_), MF_OK)
          << mf_last_error();
      EXPECT_EQ(gpu_->stream_sync(gpu_, gpu_s_), MF_OK) << mf_last_error();
      g.b[j].ptr = dev[j];
      g.b[j].bytes = bytes.size();
      g.b[j].dtype = is_float[j] ? MF_DTYPE_BF16 : mf_kop_type_dtype(t, MF_DTYPE_BF16);
    }
    const int experts_float = info->experts.name && info->experts.type == MF_KT_FLOAT;
    std::vector<void *> gpu_eptr(experts.size(), nullptr);
    size_t ebytes = 0;
    for (size_t e = 0; e < experts.size(); e++) {
      if (experts[e].empty()) continue;
      std::vector<uint8_t> f(experts[e].size() * sizeof(float));
      std::memcpy(f.data(), experts[e].data(), f.size());
      std::vector<uint8_t> bytes = experts_float ? narrow(f) : f;
      uint8_t *p = place(bytes.size());
      if (off > kArena) return r;
      EXPECT_EQ(gpu_->copy(gpu_, p, bytes.data(), bytes.size(), MF_COPY_H2D, gpu_s_), MF_OK) << mf_last_error();
      gpu_eptr[e] = p;
      ebytes = std::max(ebytes, bytes.size());
    }
    if (!experts.empty()) {
      g.experts = gpu_eptr.data();
      g.expert_bytes = ebytes;
      g.expert_dtype = experts_float ? MF_DTYPE_BF16 : MF_DTYPE_F32;
    }
    EXPECT_EQ(gpu_->stream_sync(gpu_, gpu_s_), MF_OK) << mf_last_error();
    EXPECT_EQ(gpu_->run(gpu_, &g, gpu_s_), MF_OK) << mf_last_error();
    EXPECT_EQ(gpu_->stream_sync(gpu_, gpu_s_), MF_OK) << mf_last_error();
    auto widen_back = [&](const uint8_t *p, size_t bytes, int f) {
      std::vector<uint8_t> b(bytes);
      EXPECT_EQ(gpu_->copy(gpu_, b.data(), p, bytes, MF_COPY_D2H, gpu_s_), MF_OK) << mf_last_error();
      EXPECT_EQ(gpu_->stream_sync(gpu_, gpu_s_), MF_OK) << mf_last_error();
      if (!f) return b;
      std::vector<uint8_t> w(bytes * 2);
      mf_bf16_to_fp32_n(reinterpret_cast<const uint16_t *>(b.data()), reinterpret_cast<float *>(w.data()),
                        bytes / 2);
      return w;
    };
    for (int j = 0; j < n; j++)
      if (dev[j]) r.gpu[j] = widen_back(dev[j], g.b[j].bytes, is_float[j]);
    for (size_t e = 0; e < experts.size(); e++) {
      if (!gpu_eptr[e]) {
        r.gpu_experts.emplace_back();
        continue;
      }
      const size_t bytes = experts_float ? experts[e].size() * 2 : experts[e].size() * 4;
      r.gpu_experts.push_back(widen_back(static_cast<uint8_t *>(gpu_eptr[e]), bytes, experts_float));
    }
    return r;
  }

};

// Relative closeness of two fp32 arrays: every |a - b| <= atol + rtol * |b|.
inline ::testing::AssertionResult mf_test_close(const std::vector<float> &a, const std::vector<float> &b, float rtol,
                                                float atol) {
  if (a.size() != b.size())
    return ::testing::AssertionFailure() << "sizes differ: " << a.size() << " vs " << b.size();
  for (size_t i = 0; i < a.size(); i++) {
    const float d = std::fabs(a[i] - b[i]);
    if (!(d <= atol + rtol * std::fabs(b[i])))
      return ::testing::AssertionFailure() << "element " << i << ": " << a[i] << " vs " << b[i] << " (|diff| " << d
                                           << " > " << atol << " + " << rtol << " * |ref|)";
  }
  return ::testing::AssertionSuccess();
}

#endif  // MF_TESTS_CUDA_BF16_TWIN_H
