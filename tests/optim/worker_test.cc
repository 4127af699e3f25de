// The overlapped optimizer worker (src/optim/worker.h) against the plain
// sequence: its norm (chunk sums kept per buffer, added at the end) has the
// bits of mf_optim_grad_norm over the used buffers, for gradients handed over
// in any order and with any thread counts; its updates (clip scaling, AdamW)
// have the bits of mf_optim_clip_grad_norm + mf_adamw_update; a parameter's
// wait returns only once its update is done; bf16 moments give the plain
// update's bits too; bad calls are errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "src/core/core.h"
#include "src/optim/optim.h"
#include "src/optim/worker.h"

namespace {

struct Params {
  std::vector<std::vector<float>> w, g, m, v;
};

// Sizes across chunk boundaries (MF_OPTIM_NORM_CHUNK = 65536) and AdamW tiles.
const size_t kSizes[] = {3, 65536, 200001, 1, 131072 + 17, 4096, 0, 70000};
const int kN = sizeof kSizes / sizeof kSizes[0];

Params make(uint32_t seed, float gscale) {
  Params p;
  uint32_t s = seed;
  auto rnd = [&s]() {
    s = s * 1664525u + 1013904223u;
    return ((s >> 8) / 16777216.0f) * 2.0f - 1.0f;
  };
  for (int i = 0; i < kN; i++) {
    p.w.emplace_back(kSizes[i]);
    p.g.emplace_back(kSizes[i]);
    p.m.emplace_back(kSizes[i]);
    p.v.emplace_back(kSizes[i]);
    for (size_t k = 0; k < kSizes[i]; k++) {
      p.w[i][k] = rnd();
      p.g[i][k] = gscale * rnd();
      p.m[i][k] = 0.01f * rnd();
      p.v[i][k] = 0.001f * std::fabs(rnd());
    }
  }
  return p;
}

std::vector<mf_optim_tensor> tensors(Params &p) {
  std::vector<mf_optim_tensor> t(kN);
  for (int i = 0; i < kN; i++)
    t[i] = {p.w[i].data(), p.g[i].data(), p.m[i].data(), p.v[i].data(), kSizes[i], MF_DTYPE_F32};
  return t;
}

bool same_bits(const std::vector<float> &a, const std::vector<float> &b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

uint64_t bits(double x) {
  uint64_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
}

TEST(OptimWorker, NormMatchesGradNormInAnyHandOverOrder) {
  Params p = make(11, 0.37f);
  std::vector<uint8_t> used(kN, 1);
  used[2] = 0;  // an expert without tokens: not in the norm
  std::vector<mf_optim_buf> bufs(kN);
  for (int i = 0; i < kN; i++) bufs[i] = {used[i] ? p.g[i].data() : nullptr, used[i] ? kSizes[i] : 0};
  mf_threadpool *pool = nullptr;
  ASSERT_EQ(mf_threadpool_create(3, &pool), MF_OK);
  double want = 0;
  ASSERT_EQ(mf_optim_grad_norm(bufs.data(), kN, pool, &want), MF_OK);
  // The same value with the buffer that was left out: so leaving it out is seen.
  double all = 0;
  std::vector<mf_optim_buf> every(kN);
  for (int i = 0; i < kN; i++) every[i] = {p.g[i].data(), kSizes[i]};
  ASSERT_EQ(mf_optim_grad_norm(every.data(), kN, pool, &all), MF_OK);
  ASSERT_NE(bits(all), bits(want));

  for (int threads : {1, 4}) {
    std::vector<mf_optim_tensor> t = tensors(p);
    mf_optim_worker *wk = nullptr;
    ASSERT_EQ(mf_optim_worker_create(t.data(), kN, threads, &wk), MF_OK) << mf_last_error();
    // Step 1: handed over backwards (as a backward would), one twice, one never.
    for (int i = kN - 1; i >= 0; i--)
      if (i != 4) mf_optim_worker_grad_home(wk, i);
    mf_optim_worker_grad_home(wk, 5);
    mf_optim_worker_grad_home(wk, kN + 3);  // out of range: ignored
    double norm = -1;
    ASSERT_EQ(mf_optim_worker_norm(wk, used.data(), &norm), MF_OK) << mf_last_error();
    EXPECT_EQ(bits(norm), bits(want)) << norm << " vs " << want;
    // Step 2: nothing handed over: the norm pass runs at the end.
    ASSERT_EQ(mf_optim_worker_norm(wk, used.data(), &norm), MF_OK);
    EXPECT_EQ(bits(norm), bits(want));
    mf_optim_worker_free(wk);
  }
  // A non-finite element makes the norm non-finite, as mf_optim_grad_norm.
  p.g[1][12345] = INFINITY;
  std::vector<mf_optim_tensor> t = tensors(p);
  mf_optim_worker *wk = nullptr;
  ASSERT_EQ(mf_optim_worker_create(t.data(), kN, 2, &wk), MF_OK);
  mf_optim_worker_grad_home(wk, 1);
  double norm = 0;
  ASSERT_EQ(mf_optim_worker_norm(wk, used.data(), &norm), MF_OK);
  EXPECT_FALSE(std::isfinite(norm));
  mf_optim_worker_free(wk);
  mf_threadpool_free(pool);
}

// The updates with clipping: the same bits as the sequential loop.
TEST(OptimWorker, UpdatesMatchClipAndAdamW) {
  Params ref = make(5, 3.0f), got = make(5, 3.0f);
  std::vector<uint8_t> used(kN, 1);
  used[6] = 0;
  used[3] = 0;
  mf_adamw_hparams h = {1e-3, 0.9, 0.999, 1e-8, 0.01};
  mf_adamw_hparams h0 = h;
  h0.weight_decay = 0;
  const double max_norm = 0.5;

  mf_threadpool *pool = nullptr;
  ASSERT_EQ(mf_threadpool_create(2, &pool), MF_OK);
  std::vector<mf_optim_tensor> t = tensors(got);
  mf_optim_worker *wk = nullptr;
  ASSERT_EQ(mf_optim_worker_create(t.data(), kN, 3, &wk), MF_OK);
  for (int64_t step = 1; step <= 3; step++) {
    // The worker's previous updates, waited for parameter by parameter (as the
    // next step's uploads do), leave the reference's state.
    for (int i = 0; i < kN; i++) ASSERT_EQ(mf_optim_worker_wait_param(wk, i), MF_OK);
    for (int i = 0; i < kN; i++) {
      ASSERT_TRUE(same_bits(got.w[i], ref.w[i])) << "step " << step << " w " << i;
      ASSERT_TRUE(same_bits(got.v[i], ref.v[i])) << "step " << step << " v " << i;
    }
    // This step's gradients: new values, the same in both.
    Params fresh = make((uint32_t)(100 + step), 3.0f);
    for (int i = 0; i < kN; i++) {  // in place: the worker holds the buffers
      std::copy(fresh.g[i].begin(), fresh.g[i].end(), ref.g[i].begin());
      std::copy(fresh.g[i].begin(), fresh.g[i].end(), got.g[i].begin());
    }
    // Reference: clip over the used buffers, AdamW over them in index order.
    std::vector<mf_optim_buf> bufs(kN);
    for (int i = 0; i < kN; i++) bufs[i] = {used[i] ? ref.g[i].data() : nullptr, used[i] ? kSizes[i] : 0};
    double rnorm = 0, rcoef = 0;
    ASSERT_EQ(mf_optim_clip_grad_norm(bufs.data(), kN, max_norm, pool, &rnorm, &rcoef), MF_OK);
    ASSERT_LT(rcoef, 1.0) << "clipping must be active for this test";
    for (int i = 0; i < kN; i++) {
      if (!used[i]) continue;
      ASSERT_EQ(mf_adamw_update(i % 2 ? &h : &h0, step, ref.w[i].data(), ref.g[i].data(), ref.m[i].data(),
                                ref.v[i].data(), kSizes[i], nullptr, pool),
                MF_OK);
    }
    // Worker: hand the gradients over, norm, queue in another order.
    for (int i = 0; i < kN; i++) mf_optim_worker_grad_home(wk, i);
    double norm = 0;
    ASSERT_EQ(mf_optim_worker_norm(wk, used.data(), &norm), MF_OK);
    EXPECT_EQ(bits(norm), bits(rnorm));
    const double coef = mf_optim_clip_coef(norm, max_norm);
    EXPECT_EQ(bits(coef), bits(rcoef));
    std::vector<mf_optim_update> u;
    for (int i = kN - 1; i >= 0; i--)
      if (used[i]) u.push_back({i, step, i % 2 ? h : h0});
    ASSERT_EQ(mf_optim_worker_update(wk, u.data(), (int32_t)u.size(), coef), MF_OK);
    // A parameter's wait means its update is done: its weights are the reference's.
    const int probe = 4;
    ASSERT_EQ(mf_optim_worker_wait_param(wk, probe), MF_OK);
    EXPECT_TRUE(same_bits(got.w[probe], ref.w[probe])) << "step " << step;
    EXPECT_TRUE(same_bits(got.m[probe], ref.m[probe])) << "step " << step;
  }
  ASSERT_EQ(mf_optim_worker_wait_all(wk), MF_OK);
  for (int i = 0; i < kN; i++) {
    EXPECT_TRUE(same_bits(got.w[i], ref.w[i])) << "w " << i;
    EXPECT_TRUE(same_bits(got.m[i], ref.m[i])) << "m " << i;
    EXPECT_TRUE(same_bits(got.v[i], ref.v[i])) << "v " << i;
    EXPECT_TRUE(same_bits(got.g[i], ref.g[i])) << "g " << i;  // scaled the same way
  }
  double busy = -1, waited = -1;
  mf_optim_worker_stats(wk, &busy, &waited);
  EXPECT_GT(busy, 0.0);
  EXPECT_GE(waited, 0.0);
  mf_optim_worker_free(wk);
  mf_threadpool_free(pool);
}

// bf16 moments (train.adam_moments: bf16): the worker's updates have the bits
// of mf_adamw_update_bufs over the same bf16 moment buffers.
TEST(OptimWorker, Bf16MomentsMatchThePlainUpdate) {
  Params ref = make(7, 1.0f), got = make(7, 1.0f);
  std::vector<std::vector<uint16_t>> rm(kN), rv(kN), gm(kN), gv(kN);
  for (int i = 0; i < kN; i++) {
    rm[i].resize(kSizes[i]);
    rv[i].resize(kSizes[i]);
    mf_fp32_to_bf16_n(ref.m[i].data(), rm[i].data(), kSizes[i]);
    mf_fp32_to_bf16_n(ref.v[i].data(), rv[i].data(), kSizes[i]);
    gm[i] = rm[i];
    gv[i] = rv[i];
  }
  std::vector<mf_optim_tensor> t(kN);
  for (int i = 0; i < kN; i++)
    t[i] = {got.w[i].data(), got.g[i].data(), gm[i].data(), gv[i].data(), kSizes[i], MF_DTYPE_BF16};
  mf_optim_worker *wk = nullptr;
  ASSERT_EQ(mf_optim_worker_create(t.data(), kN, 3, &wk), MF_OK) << mf_last_error();
  const mf_adamw_hparams h = {1e-3, 0.9, 0.999, 1e-8, 0.01};
  std::vector<uint8_t> used(kN, 1);
  for (int64_t step = 1; step <= 3; step++) {
    for (int i = 0; i < kN; i++) {
      const mf_adamw_bufs b = {ref.w[i].data(), ref.g[i].data(), rm[i].data(), rv[i].data(),
                               nullptr,         kSizes[i],       MF_DTYPE_F32, MF_DTYPE_BF16};
      ASSERT_EQ(mf_adamw_update_bufs(&h, step, &b, nullptr), MF_OK);
    }
    double norm = 0;
    ASSERT_EQ(mf_optim_worker_norm(wk, used.data(), &norm), MF_OK);
    std::vector<mf_optim_update> u;
    for (int i = 0; i < kN; i++) u.push_back({i, step, h});
    ASSERT_EQ(mf_optim_worker_update(wk, u.data(), (int32_t)u.size(), 1.0), MF_OK);
    ASSERT_EQ(mf_optim_worker_wait_all(wk), MF_OK);
  }
  for (int i = 0; i < kN; i++) {
    EXPECT_TRUE(same_bits(got.w[i], ref.w[i])) << "w " << i;
    EXPECT_TRUE(gm[i] == rm[i]) << "m " << i;
    EXPECT_TRUE(gv[i] == rv[i]) << "v " << i;
  }
  // the moments really are bf16: the stored m differs from the fp32-moment run's rounded m
  Params f32 = make(7, 1.0f);
  for (int64_t step = 1; step <= 3; step++)
    ASSERT_EQ(mf_adamw_update(&h, step, f32.w[2].data(), f32.g[2].data(), f32.m[2].data(), f32.v[2].data(),
                              kSizes[2], nullptr, nullptr),
              MF_OK);
  EXPECT_FALSE(same_bits(f32.w[2], got.w[2]));
  mf_optim_worker_free(wk);
}

TEST(OptimWorker, BadCallsAreErrors) {
  Params p = make(3, 1.0f);
  std::vector<mf_optim_tensor> t = tensors(p);
  mf_optim_worker *wk = nullptr;
  EXPECT_EQ(mf_optim_worker_create(nullptr, 2, 1, &wk), MF_ERR_INVALID_ARG);
  std::vector<mf_optim_tensor> bad = t;
  bad[1].m = nullptr;
  EXPECT_EQ(mf_optim_worker_create(bad.data(), kN, 1, &wk), MF_ERR_INVALID_ARG);
  EXPECT_NE(std::string(mf_last_error()).find("tensor 1"), std::string::npos) << mf_last_error();
  bad = t;
  bad[2].moments = MF_DTYPE_F16;
  EXPECT_EQ(mf_optim_worker_create(bad.data(), kN, 1, &wk), MF_ERR_INVALID_ARG);
  EXPECT_NE(std::string(mf_last_error()).find("moment dtype"), std::string::npos) << mf_last_error();
  ASSERT_EQ(mf_optim_worker_create(t.data(), kN, 1, &wk), MF_OK);
  mf_adamw_hparams h = {1e-3, 0.9, 0.999, 1e-8, 0.0};
  mf_optim_update twice[2] = {{1, 1, h}, {1, 1, h}};
  EXPECT_EQ(mf_optim_worker_update(wk, twice, 2, 1.0), MF_ERR_INVALID_ARG);
  mf_optim_update out_of_range = {kN, 1, h};
  EXPECT_EQ(mf_optim_worker_update(wk, &out_of_range, 1, 1.0), MF_ERR_INVALID_ARG);
  // A failing update (step 0) comes back at the next wait, naming AdamW.
  mf_optim_update step0 = {0, 0, h};
  ASSERT_EQ(mf_optim_worker_update(wk, &step0, 1, 1.0), MF_OK);
  EXPECT_EQ(mf_optim_worker_wait_all(wk), MF_ERR_INVALID_ARG);
  EXPECT_NE(std::string(mf_last_error()).find("steps count from 1"), std::string::npos) << mf_last_error();
  mf_optim_worker_free(wk);
  mf_optim_worker_free(nullptr);
}

}  // namespace
