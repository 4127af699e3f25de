// Helpers shared by the cpu kernel tests: thread pools for one scope, bit for
// bit and bf16 checks, and double-precision reference dot products. Random
// inputs and finite-difference checks are in fd.h.
//
// The checks return testing::AssertionResult, so a test chooses EXPECT_ or
// ASSERT_ and a failure names the first element at fault.
#ifndef MF_TESTS_KERNELS_KERNEL_TEST_UTIL_H
#define MF_TESTS_KERNELS_KERNEL_TEST_UTIL_H

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels/cpu/cpu_ops.h"
#include "src/core/core.h"

namespace mf_kt {

// A pool of n workers (0: one per core), freed at the end of the scope. A
// failed creation is a test failure and leaves p NULL (the calling thread);
// a test that must stop there asserts on status.
struct Pool {
  mf_threadpool *p = nullptr;
  mf_status status;
  explicit Pool(int n) : status(mf_threadpool_create(n, &p)) { EXPECT_EQ(status, MF_OK) << "pool of " << n; }
  ~Pool() { mf_threadpool_free(p); }
  Pool(const Pool &) = delete;
  Pool &operator=(const Pool &) = delete;
};

// Pools of 1, 2 and 3 workers: the partitions a thread-count invariance test
// compares with the result on the calling thread.
struct Pools {
  Pool one{1}, two{2}, three{3};
  std::vector<mf_threadpool *> all() const { return {one.p, two.p, three.p}; }
};

// The same length and the same bits (signed zeros and NaN payloads included).
inline testing::AssertionResult same_bits(const std::vector<float> &a, const std::vector<float> &b) {
  if (a.size() != b.size())
    return testing::AssertionFailure() << "lengths " << a.size() << " and " << b.size();
  if (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0)
    return testing::AssertionSuccess();
  size_t i = 0;
  while (std::memcmp(&a[i], &b[i], sizeof(float)) == 0) i++;
  return testing::AssertionFailure() << "first differing element [" << i << "]: " << a[i] << " vs " << b[i];
}

// Every element is a bf16 value: rounding it to bf16 leaves it unchanged.
inline testing::AssertionResult bf16_representable(const std::vector<float> &v) {
  for (size_t i = 0; i < v.size(); i++)
    if (mf_round_to_bf16(v[i]) != v[i])
      return testing::AssertionFailure() << "[" << i << "] = " << v[i] << " is not a bf16 value";
  return testing::AssertionSuccess() << "every element is a bf16 value";
}

// got is fp32 rounded once to bf16: got[i] == bf16(fp32[i]), and so within
// 2^-8 |fp32[i]|.
inline testing::AssertionResult rounded_once(const std::vector<float> &got, const std::vector<float> &fp32) {
  if (got.size() != fp32.size())
    return testing::AssertionFailure() << "lengths " << got.size() << " and " << fp32.size();
  for (size_t i = 0; i < got.size(); i++) {
    if (got[i] != mf_round_to_bf16(fp32[i]))
      return testing::AssertionFailure() << "[" << i << "] = " << got[i] << ", not bf16(" << fp32[i]
                                         << ") = " << mf_round_to_bf16(fp32[i]);
    if (!(std::fabs(got[i] - fp32[i]) <= std::ldexp(std::fabs(fp32[i]), -8)))
      return testing::AssertionFailure()
             << "[" << i << "] = " << got[i] << " is not within 2^-8 of " << fp32[i];
  }
  return testing::AssertionSuccess();
}

// init + sum_{i<n} a[i*sa] * b[i*sb], accumulated in double in order of i.
inline double ref_dot(const float *a, int64_t sa, const float *b, int64_t sb, int64_t n, double init = 0.0) {
  double s = init;
  for (int64_t i = 0; i < n; i++) s += (double)a[i * sa] * (double)b[i * sb];
  return s;
}

}  // namespace mf_kt

#endif  // MF_TESTS_KERNELS_KERNEL_TEST_UTIL_H
