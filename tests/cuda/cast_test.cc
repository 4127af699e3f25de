// kernels/cuda casts against their cpu twins (src/core), bit for bit, on data
// that includes NaN, Inf, denormals and exact ties. Skips without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/cuda/cuda.h"
#include "tests/cuda/gpu_test_util.h"
#include "src/core/core.h"

namespace {

class CudaCast : public ::testing::Test {
 protected:
  void SetUp() override {
    MF_SKIP_WITHOUT_GPU();
  }
};

std::vector<float> tricky_floats(size_t n) {
  std::mt19937 rng(3);
  std::vector<float> v(n);
  const uint32_t special[] = {0x7fc00000u, 0xffc00001u, 0x7f800001u, 0x7f800000u, 0xff800000u,
                              0x00000001u, 0x807fffffu, 0x3f808000u, 0x3f818000u, 0x7f7fffffu, 0};
  for (size_t i = 0; i < n; i++) {
    uint32_t u = i < sizeof special / 4 ? special[i] : (uint32_t)rng();
    memcpy(&v[i], &u, 4);
  }
  return v;
}

TEST_F(CudaCast, F32ToBf16MatchesCpuTwin) {
  const size_t n = (1u << 20) + 13;
  std::vector<float> x = tricky_floats(n);
  std::vector<uint16_t> want(n), got(n);
  mf_fp32_to_bf16_n(x.data(), want.data(), n);
  void *dx = nullptr, *dy = nullptr;
  ASSERT_EQ(mf_cuda_malloc(n * 4, &dx), MF_OK) << mf_last_error();
  ASSERT_EQ(mf_cuda_malloc(n * 2, &dy), MF_OK) << mf_last_error();
  ASSERT_EQ(mf_cuda_memcpy_h2d(dx, x.data(), n * 4), MF_OK);
  ASSERT_EQ(mf_cuda_cast_f32_to_bf16((const float *)dx, (uint16_t *)dy, n, nullptr), MF_OK) << mf_last_error();
  ASSERT_EQ(mf_cuda_memcpy_d2h(got.data(), dy, n * 2), MF_OK);
  EXPECT_EQ(memcmp(got.data(), want.data(), n * 2), 0);
  mf_cuda_free(dx);
  mf_cuda_free(dy);
}

TEST_F(CudaCast, Bf16ToF32IsExact) {
  const size_t n = 65536;
  std::vector<uint16_t> h(n);
  for (size_t i = 0; i < n; i++) h[i] = (uint16_t)i;
  std::vector<float> want(n), got(n);
  mf_bf16_to_fp32_n(h.data(), want.data(), n);
  void *dx = nullptr, *dy = nullptr;
  ASSERT_EQ(mf_cuda_malloc(n * 2, &dx), MF_OK);
  ASSERT_EQ(mf_cuda_malloc(n * 4, &dy), MF_OK);
  ASSERT_EQ(mf_cuda_memcpy_h2d(dx, h.data(), n * 2), MF_OK);
  ASSERT_EQ(mf_cuda_cast_bf16_to_f32((const uint16_t *)dx, (float *)dy, n, nullptr), MF_OK);
  ASSERT_EQ(mf_cuda_memcpy_d2h(got.data(), dy, n * 4), MF_OK);
  EXPECT_EQ(memcmp(got.data(), want.data(), n * 4), 0);
  mf_cuda_free(dx);
  mf_cuda_free(dy);
}

TEST(CudaDevice, CountIsReportedNotFatal) {
  int n = -1;
  char why[256] = "";
  ASSERT_EQ(mf_cuda_device_count(&n, why, sizeof why), MF_OK);
  EXPECT_GE(n, 0);
  if (n == 0) {
    EXPECT_STRNE(why, "");
  }
}

}  // namespace
