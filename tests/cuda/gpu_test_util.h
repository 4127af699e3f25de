// Shared by the GPU tests: skip (counted as skipped) where no GPU is present,
// unless MF_REQUIRE_GPU=1 (tools/gpu_check.sh sets it), which turns a missing
// GPU into a failure so a GPU machine can never pass by skipping.
#ifndef MF_TESTS_CUDA_GPU_TEST_UTIL_H
#define MF_TESTS_CUDA_GPU_TEST_UTIL_H

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <string>

#include "kernels/cuda/cuda.h"
#include "src/core/core.h"

// True when a GPU is usable; otherwise *why says why.
inline bool mf_test_have_gpu(std::string *why) {
  int n = 0;
  char buf[256] = "";
  if (mf_cuda_device_count(&n, buf, sizeof buf) != MF_OK) {
    *why = std::string("device query failed: ") + mf_last_error();
    return false;
  }
  if (n == 0) *why = buf;
  return n > 0;
}

inline bool mf_test_gpu_required() {
  const char *v = std::getenv("MF_REQUIRE_GPU");
  return v && std::strcmp(v, "1") == 0;
}

// In SetUp() or a TEST body: skip without a GPU (fail under MF_REQUIRE_GPU=1).
#define MF_SKIP_WITHOUT_GPU()                                                           \
  do {                                                                                  \
    std::string mf_why_;                                                                \
    if (!mf_test_have_gpu(&mf_why_)) {                                                  \
      if (mf_test_gpu_required()) FAIL() << "MF_REQUIRE_GPU=1 but no GPU: " << mf_why_; \
      GTEST_SKIP() << "no GPU: " << mf_why_;                                            \
    }                                                                                   \
  } while (0)

#endif  // MF_TESTS_CUDA_GPU_TEST_UTIL_H
