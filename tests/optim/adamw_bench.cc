// AdamW's update rate: printed, not asserted (machines vary), so not part of the
// test run (tagged bench). Run with
//   bazel test //tests/optim:adamw_bench --test_output=all
// The CLI's fuller benchmark: `moefit bench optim`.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "src/core/core.h"
#include "src/optim/optim.h"

namespace {

#if defined(__SANITIZE_ADDRESS__)
constexpr int kReps = 1;  // the numbers mean little under a sanitizer: keep it short
const std::vector<const char *> kBodies = {"auto"};
#else
constexpr int kReps = 3;
const std::vector<const char *> kBodies = {"avx512", "avx2", "fma", "scalar"};
#endif

// Updates/s at n = 16M with the bf16 copy off (16 B read + 12 B written per
// parameter) and on (+2 B written), for each SIMD body and 1 and 2 threads.
TEST(AdamW, Throughput) {
  const size_t n = (size_t)16 << 20;
  std::vector<float> p(n, 0.5f), g(n, 1e-3f), m(n, 0.0f), v(n, 0.0f);
  std::vector<uint16_t> bf16(n);
  for (size_t i = 0; i < n; i++) g[i] = (float)((int)(i % 2001) - 1000) * 1e-6f;
  mf_adamw_hparams h;
  h.lr = 1e-4;
  h.beta1 = 0.9;
  h.beta2 = 0.999;
  h.eps = 1e-8;
  h.weight_decay = 0.01;
  for (const char *body : kBodies) {
    if (mf_adamw_select_impl(body) == MF_ERR_UNSUPPORTED) continue;
    ASSERT_EQ(mf_adamw_select_impl(body), MF_OK);
    for (int threads : {1, 2}) {
      mf_threadpool *pool = nullptr;
      ASSERT_EQ(mf_threadpool_create(threads, &pool), MF_OK) << mf_last_error();
      for (int with_bf16 = 0; with_bf16 < 2; with_bf16++) {
        uint16_t *out = with_bf16 ? bf16.data() : nullptr;
        int64_t t = 1;
        ASSERT_EQ(mf_adamw_update(&h, t++, p.data(), g.data(), m.data(), v.data(), n, out, pool), MF_OK);
        double best = 1e30;
        for (int r = 0; r < kReps; r++) {
          double t0 = mf_time_now();
          ASSERT_EQ(mf_adamw_update(&h, t++, p.data(), g.data(), m.data(), v.data(), n, out, pool), MF_OK);
          best = std::min(best, mf_time_now() - t0);
        }
        const double bytes = with_bf16 ? 30.0 : 28.0;
        std::printf(
            "adamw %-6s n=16M threads=%d bf16=%s: %.4f s, %6.1f M updates/s, %5.2f GB/s (%.0f B/param)\n",
            mf_adamw_impl_name(), threads, with_bf16 ? "on " : "off", best, n / best / 1e6,
            n * bytes / best / 1e9, bytes);
      }
      mf_threadpool_free(pool);
    }
  }
  ASSERT_EQ(mf_adamw_select_impl("auto"), MF_OK);
}

}  // namespace
