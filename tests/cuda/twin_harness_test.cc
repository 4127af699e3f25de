// The twin harness (as ggml's test-backend-ops): every kernel kind of
// kernels/backend.h, in each storage dtype it computes in (F32, BF16), at
// every shape of its entry in tests/cuda/twin_case_table.cc, on the cuda
// backend against the cpu backend — the same operand bytes on both, every
// operand the operand table says the call writes compared with the entry's
// tolerance for it. One test per kind and storage ("rmsnorm_fwd_BF16"; a kind
// that computes in one storage, "moe_dispatch"); a kind without an entry gets
// a test that fails. A failure names the case
// (kind, shape, storage), the operand and its worst element.
//
// The cpu side runs BF16 cases on its BF16 path, which is the round_bf16 twin
// (tests/cuda/bf16_twin.h) with the FLOAT operands narrowed (twin_cases.h);
// it runs GRAD_SUMSQ and ADAMW with the host optimizer (src/optim). The
// hand-written twin tests of tests/cuda stay: they hold some kinds to tighter
// per-element bounds, at larger shapes, and check determinism and streams.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <ostream>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cuda/backend_cuda.h"
#include "src/core/core.h"
#include "src/optim/optim.h"
#include "tests/cuda/gpu_test_util.h"
#include "tests/cuda/twin_cases.h"
#include "tests/cuda/twin_fixture.h"

namespace {

struct Param {
  mf_kernel kind;
  mf_dtype storage;
};

// Every kind, in each storage its entry lists (F32 alone for a kind without one).
std::vector<Param> params() {
  std::vector<Param> v;
  for (int k = 0; k < MF_K_COUNT_; k++) {
    if (mf_kernel_is_exchange((mf_kernel)k)) continue;  // between ranks, not a kernel
    const MfCaseEntry *e = mf_case_entry((mf_kernel)k);
    if (!e) {
      v.push_back({(mf_kernel)k, MF_DTYPE_F32});
      continue;
    }
    for (mf_dtype st : mf_case_storages(*e)) v.push_back({(mf_kernel)k, st});
  }
  return v;
}

void PrintTo(const Param &p, std::ostream *os) {
  *os << mf_kernel_name(p.kind) << " " << mf_dtype_name(p.storage);
}

std::string param_name(const ::testing::TestParamInfo<Param> &p) {
  const MfCaseEntry *e = mf_case_entry(p.param.kind);
  std::string s = mf_kernel_name(p.param.kind);
  if (!e || !e->one_storage) s += std::string("_") + mf_dtype_name(p.param.storage);
  return s;
}

// Operands in the cuda backend's arena, at 256-byte boundaries from its start.
class DeviceMemory : public MfCaseMemory {
 public:
  DeviceMemory(mf_backend *b, mf_stream *s, uint8_t *arena, size_t cap)
      : b_(b), s_(s), arena_(arena), cap_(cap) {}
  void *put(const std::vector<uint8_t> &bytes, std::string *why) override {
    const size_t at = off_;
    off_ += (bytes.size() + 255) / 256 * 256;
    if (off_ > cap_) {
      *why = "the arena is full";
      return nullptr;
    }
    if (b_->copy(b_, arena_ + at, bytes.data(), bytes.size(), MF_COPY_H2D, s_) != MF_OK ||
        b_->stream_sync(b_, s_) != MF_OK) {
      *why = mf_last_error();
      return nullptr;
    }
    return arena_ + at;
  }
  bool get(const void *p, std::vector<uint8_t> *out, std::string *why) override {
    if (b_->copy(b_, out->data(), p, out->size(), MF_COPY_D2H, s_) != MF_OK ||
        b_->stream_sync(b_, s_) != MF_OK) {
      *why = mf_last_error();
      return false;
    }
    return true;
  }

 private:
  mf_backend *b_;
  mf_stream *s_;
  uint8_t *arena_;
  size_t cap_, off_ = 0;
};

class TwinHarness : public CudaTwin<(size_t)256 << 20>, public ::testing::WithParamInterface<Param> {
 protected:
  void SetUp() override {
    CudaTwin::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    mf_cpu_backend_opts o = {};
    o.optim = mf_optim_run_kernel;  // GRAD_SUMSQ, ADAMW on the host optimizer
    ASSERT_EQ(mf_backend_cpu_create(&o, &ref_), MF_OK) << mf_last_error();
    ASSERT_EQ(ref_->stream_create(ref_, &ref_s_), MF_OK) << mf_last_error();
  }
  void TearDown() override {
    if (ref_) {
      if (ref_s_) ref_->stream_free(ref_, ref_s_);
      mf_backend_free(ref_);
    }
    CudaTwin::TearDown();
  }
  mf_backend *ref_ = nullptr;
  mf_stream *ref_s_ = nullptr;
};

TEST_P(TwinHarness, EveryShapeMatchesTheCpuTwin) {
  const Param p = GetParam();
  ASSERT_NE(mf_case_entry(p.kind), nullptr)
      << mf_kernel_name(p.kind)
      << " has no entry in tests/cuda/twin_case_table.cc: it is not checked on the GPU";
  for (const MfKernelCase &c : mf_case_all(p.kind, p.storage)) {
    SCOPED_TRACE(c.name);
    const std::vector<std::string> bad = mf_case_problems(c);
    if (!bad.empty()) {
      for (const std::string &m : bad) ADD_FAILURE() << m;
      continue;
    }
    MfCaseHostMemory host;
    const MfCaseOut want = mf_case_run(ref_, ref_s_, c, &host);
    DeviceMemory dev(gpu_, gpu_s_, arena_, kArena);
    const MfCaseOut got = mf_case_run(gpu_, gpu_s_, c, &dev);
    for (const std::string &m : mf_case_compare(c, want, got)) ADD_FAILURE() << m;
  }
}

INSTANTIATE_TEST_SUITE_P(EveryKind, TwinHarness, ::testing::ValuesIn(params()), param_name);

}  // namespace
