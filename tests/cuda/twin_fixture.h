// The fixture of the GPU tests that compare a cuda kernel with its cpu twin:
// a cpu backend and a cuda backend, each with a stream, and a device arena of
// kArena bytes. Without a GPU the test is skipped (tests/cuda/gpu_test_util.h).
#ifndef MF_TESTS_CUDA_TWIN_FIXTURE_H
#define MF_TESTS_CUDA_TWIN_FIXTURE_H

#include <gtest/gtest.h>

#include <cstdint>

#include "kernels/backend.h"
#include "kernels/cuda/backend_cuda.h"
#include "src/core/core.h"
#include "tests/cuda/gpu_test_util.h"

template <size_t kArenaBytes>
class CudaTwin : public ::testing::Test {
 protected:
  static constexpr size_t kArena = kArenaBytes;

  // The cuda backend's options (NULL: defaults); a test may narrow them.
  virtual const mf_cuda_backend_opts *cuda_opts() { return nullptr; }
  // The cpu twin's bf16 rounding (mf_cpu_backend_opts.round_bf16).
  virtual int cpu_round_bf16() { return 0; }

  void SetUp() override {
    MF_SKIP_WITHOUT_GPU();
    mf_cpu_backend_opts co = {};
    co.round_bf16 = cpu_round_bf16();
    ASSERT_EQ(mf_backend_cpu_create(&co, &cpu_), MF_OK) << mf_last_error();
    ASSERT_EQ(cpu_->stream_create(cpu_, &cpu_s_), MF_OK) << mf_last_error();
    ASSERT_EQ(mf_backend_cuda_create(cuda_opts(), &gpu_), MF_OK) << mf_last_error();
    ASSERT_EQ(gpu_->stream_create(gpu_, &gpu_s_), MF_OK) << mf_last_error();
    void *base = nullptr;
    ASSERT_EQ(gpu_->arena_create(gpu_, kArena, &base), MF_OK) << mf_last_error();
    arena_ = static_cast<uint8_t *>(base);
  }
  void TearDown() override {
    if (gpu_) {
      if (gpu_s_) gpu_->stream_free(gpu_, gpu_s_);
      mf_backend_free(gpu_);
    }
    if (cpu_) {
      if (cpu_s_) cpu_->stream_free(cpu_, cpu_s_);
      mf_backend_free(cpu_);
    }
  }

  mf_backend *cpu_ = nullptr, *gpu_ = nullptr;
  mf_stream *cpu_s_ = nullptr, *gpu_s_ = nullptr;
  uint8_t *arena_ = nullptr;
};

#endif  // MF_TESTS_CUDA_TWIN_FIXTURE_H
