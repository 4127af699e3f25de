// planner/host: the host memory of a plan, part by part, recounted from the
// parameter table; the limits; the NVMe spill order (moments, then master
// weights) and its per-step cost; no spill without NVMe.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>

#include "planner/host.h"
#include "planner/schedule.h"
#include "src/config/config.h"
#include "src/core/core.h"
#include "src/model/params.h"
#include "src/model/program.h"
#include "tests/planner/planner_test_util.h"

namespace {

struct Fixture {
  mf_param_table *t = nullptr;
  mf_program *p = nullptr;
  mf_decisions *d = nullptr;
  mf_schedule *s = nullptr;
  uint64_t numel = 0;  // every parameter, from the table
  void Build(mf_dtype storage, int forward_only, bool offload) {
    mf_pt::Shape sh = mf_pt::make_shape(1);
    ASSERT_EQ(mf_param_table_build(&sh.spec, &t), MF_OK) << mf_last_error();
    mf_program_opts po{};
    po.micro_batch = 1, po.seq_len = 16, po.grad_accum = forward_only ? 1 : 2, po.aux_coef = 0.01;
    po.forward_only = forward_only, po.storage = storage;
    ASSERT_EQ(mf_program_build(t, &po, &p), MF_OK) << mf_last_error();
    ASSERT_EQ(mf_decisions_create(p, &d), MF_OK);
    if (offload)
      for (int32_t i = 0; i < p->n_tensors; i++)
        if (mf_schedule_can_offload(p, i)) d->act[i] = MF_ACT_OFFLOAD;
    ASSERT_EQ(mf_schedule_build(p, d, &s), MF_OK) << mf_last_error();
    for (int64_t i = 0; i < t->n; i++) numel += (uint64_t)t->params[i].numel;
  }
  ~Fixture() {
    mf_schedule_free(s);
    mf_decisions_free(d);
    mf_program_free(p);
    mf_param_table_free(t);
  }
};

mf_config_memory Mem(uint64_t host, uint64_t pinned, const char *nvme) {
  mf_config_memory m;
  std::memset(&m, 0, sizeof m);
  m.host_limit = host;
  m.pinned_limit = pinned;
  m.nvme_dir = const_cast<char *>(nvme);
  return m;
}

TEST(Host, PartsAreCountedAndSum) {
  Fixture f;
  f.Build(MF_DTYPE_F32, 0, true);
  ASSERT_NE(f.s, nullptr);
  mf_hwprofile hw = mf_pt::small_profile(1);
  mf_host_usage u;
  ASSERT_EQ(mf_host_account(f.p, f.s, 12345, nullptr, &hw, &u), MF_OK) << mf_last_error();
  EXPECT_EQ(u.master_bytes, 4 * f.numel);
  EXPECT_EQ(u.working_bytes, 0u) << "fp32 storage uploads the master itself";
  EXPECT_EQ(u.grad_bytes, 4 * f.numel);
  EXPECT_EQ(u.moment_bytes, 8 * f.numel);
  EXPECT_GT(u.act_bytes, 0u);
  EXPECT_EQ(u.act_bytes, f.s->host_act_bytes);
  EXPECT_EQ(u.pinned_bytes, 12345u);
  EXPECT_EQ(u.total_bytes, 16 * f.numel + u.act_bytes + 12345u);
  EXPECT_EQ(u.host_limit, hw.host_memory) << "auto host_limit is the profile's host memory";
  EXPECT_TRUE(u.host_fits);
  EXPECT_TRUE(u.pinned_fits);
  EXPECT_EQ(u.unplaced_bytes, 0u);
  EXPECT_EQ(mf_host_spill_seconds(&u, &hw), 0.0);
}

TEST(Host, Bf16StorageAddsAWorkingCopyAndForwardOnlyHasNoState) {
  Fixture b;
  b.Build(MF_DTYPE_BF16, 0, false);
  ASSERT_NE(b.s, nullptr);
  mf_hwprofile hw = mf_pt::small_profile(1);
  mf_host_usage u;
  ASSERT_EQ(mf_host_account(b.p, b.s, 0, nullptr, &hw, &u), MF_OK) << mf_last_error();
  EXPECT_EQ(u.working_bytes, 2 * b.numel);
  EXPECT_EQ(u.act_bytes, 0u);
  EXPECT_EQ(u.total_bytes, 18 * b.numel);
  Fixture e;
  e.Build(MF_DTYPE_F32, 1, false);
  ASSERT_NE(e.s, nullptr);
  ASSERT_EQ(mf_host_account(e.p, e.s, 0, nullptr, &hw, &u), MF_OK) << mf_last_error();
  EXPECT_EQ(u.grad_bytes, 0u);
  EXPECT_EQ(u.moment_bytes, 0u);
  EXPECT_EQ(u.total_bytes, 4 * e.numel);
}

// The optimizer on the device for every other parameter: those count their
// master weights and, with BF16 storage, their working copy (no gradient sum
// or moments at home).
TEST(Host, OptimizerOnTheDeviceKeepsOnlyTheMasterAtHome) {
  for (mf_dtype storage : {MF_DTYPE_F32, MF_DTYPE_BF16}) {
    Fixture f;
    f.Build(storage, 0, false);
    ASSERT_NE(f.s, nullptr);
    uint64_t dev = 0;
    for (int32_t i = 0; i < f.d->n_params; i++)
      if (i % 2) {
        f.d->optim[i] = MF_OPTIM_DEVICE;
        dev += (uint64_t)f.t->params[i].numel;
      }
    ASSERT_GT(dev, 0u);
    mf_schedule *s = nullptr;
    ASSERT_EQ(mf_schedule_build(f.p, f.d, &s), MF_OK) << mf_last_error();
    mf_hwprofile hw = mf_pt::small_profile(1);
    mf_host_usage u;
    ASSERT_EQ(mf_host_account(f.p, s, 0, nullptr, &hw, &u), MF_OK) << mf_last_error();
    const uint64_t host = f.numel - dev;
    EXPECT_EQ(u.master_bytes, 4 * f.numel);
    EXPECT_EQ(u.working_bytes, storage == MF_DTYPE_BF16 ? 2 * f.numel : 0u);
    EXPECT_EQ(u.grad_bytes, 4 * host);
    EXPECT_EQ(u.moment_bytes, 8 * host);
    EXPECT_EQ(u.cold_master_bytes, 4 * dev);
    // Past host_limit with NVMe, the cold master weights spill first and
    // cost no per-step traffic; then the moments.
    mf_hwprofile nv = hw;
    nv.nvme_bandwidth = 1e9;
    mf_config_memory m = Mem(u.total_bytes - 4 * dev, 0, "/nvme");
    mf_host_usage c;
    ASSERT_EQ(mf_host_account(f.p, s, 0, &m, &nv, &c), MF_OK) << mf_last_error();
    EXPECT_EQ(c.spill_cold_master_bytes, 4 * dev);
    EXPECT_EQ(c.spill_moment_bytes, 0u);
    EXPECT_EQ(mf_host_spill_traffic_bytes(&c), 0u);
    m.host_limit -= 1000;
    ASSERT_EQ(mf_host_account(f.p, s, 0, &m, &nv, &c), MF_OK) << mf_last_error();
    EXPECT_EQ(c.spill_moment_bytes, 1000u);
    EXPECT_EQ(mf_host_spill_traffic_bytes(&c), 2000u);
    mf_schedule_free(s);
  }
}

TEST(Host, SpillsMomentsThenMasterToNvme) {
  Fixture f;
  f.Build(MF_DTYPE_F32, 0, false);
  ASSERT_NE(f.s, nullptr);
  mf_hwprofile hw = mf_pt::small_profile(1);
  hw.nvme_bandwidth = 1e9;
  const uint64_t total = 16 * f.numel, pinned = 1000;
  mf_host_usage u;
  // Short by less than the moments: only moments spill.
  mf_config_memory m = Mem(total + pinned - 3 * f.numel, 0, "/nvme");
  ASSERT_EQ(mf_host_account(f.p, f.s, pinned, &m, &hw, &u), MF_OK);
  EXPECT_FALSE(u.host_fits);
  EXPECT_TRUE(u.nvme);
  EXPECT_EQ(u.spill_moment_bytes, 3 * f.numel);
  EXPECT_EQ(u.spill_master_bytes, 0u);
  EXPECT_EQ(u.unplaced_bytes, 0u);
  EXPECT_EQ(mf_host_spill_traffic_bytes(&u), 6 * f.numel);
  EXPECT_DOUBLE_EQ(mf_host_spill_seconds(&u, &hw), 6.0 * (double)f.numel / 1e9);
  // Short by more than the moments: master weights next.
  m = Mem(total + pinned - 10 * f.numel, 0, "/nvme");
  ASSERT_EQ(mf_host_account(f.p, f.s, pinned, &m, &hw, &u), MF_OK);
  EXPECT_EQ(u.spill_moment_bytes, 8 * f.numel);
  EXPECT_EQ(u.spill_master_bytes, 2 * f.numel);
  EXPECT_EQ(u.unplaced_bytes, 0u);
  EXPECT_DOUBLE_EQ(mf_host_spill_seconds(&u, &hw), 20.0 * (double)f.numel / 1e9);
  // Short by more than both: the gradient sums next — here they land home
  // once a step (kept on the device over the micro-batches).
  m = Mem(2 * f.numel, 0, "/nvme");
  ASSERT_EQ(mf_host_account(f.p, f.s, pinned, &m, &hw, &u), MF_OK);
  EXPECT_EQ(u.spill_moment_bytes, 8 * f.numel);
  EXPECT_EQ(u.spill_master_bytes, 4 * f.numel);
  EXPECT_EQ(u.spill_grad_bytes, total + pinned - 2 * f.numel - 12 * f.numel);
  EXPECT_EQ(u.unplaced_bytes, 0u);
  EXPECT_EQ(mf_host_spill_traffic_bytes(&u), 2 * (total + pinned - 2 * f.numel));
  // Short by more than all three: the rest is unplaced, and the cost infinite.
  m = Mem(1, 0, "/nvme");  // one byte of host memory (0 would be auto)
  ASSERT_EQ(mf_host_account(f.p, f.s, pinned, &m, &hw, &u), MF_OK);
  EXPECT_EQ(u.spill_grad_bytes, 4 * f.numel);
  EXPECT_EQ(u.unplaced_bytes, pinned - 1);
  EXPECT_TRUE(std::isinf(mf_host_spill_seconds(&u, &hw)));
}

// BF16 storage's working copy spills after the master weights and before the
// gradient sums, read and written once a step like them.
TEST(Host, TheWorkingCopySpillsAfterTheMaster) {
  Fixture b;
  b.Build(MF_DTYPE_BF16, 0, false);
  ASSERT_NE(b.s, nullptr);
  mf_hwprofile hw = mf_pt::small_profile(1);
  hw.nvme_bandwidth = 1e9;
  mf_host_usage u;
  ASSERT_EQ(mf_host_account(b.p, b.s, 0, nullptr, &hw, &u), MF_OK) << mf_last_error();
  ASSERT_EQ(u.total_bytes, 18 * b.numel);
  // Short by moments + master + 1 byte a parameter: that much of the working copy.
  mf_config_memory m = Mem(u.total_bytes - 13 * b.numel, 0, "/nvme");
  ASSERT_EQ(mf_host_account(b.p, b.s, 0, &m, &hw, &u), MF_OK) << mf_last_error();
  EXPECT_EQ(u.spill_moment_bytes, 8 * b.numel);
  EXPECT_EQ(u.spill_master_bytes, 4 * b.numel);
  EXPECT_EQ(u.spill_working_bytes, 1 * b.numel);
  EXPECT_EQ(u.spill_grad_bytes, 0u);
  EXPECT_EQ(mf_host_spill_bytes(&u), 13 * b.numel);
  EXPECT_EQ(mf_host_spill_traffic_bytes(&u), 26 * b.numel);
  // Short by 15 bytes a parameter: the whole working copy, then gradient sums.
  m = Mem(u.total_bytes - 15 * b.numel, 0, "/nvme");
  ASSERT_EQ(mf_host_account(b.p, b.s, 0, &m, &hw, &u), MF_OK) << mf_last_error();
  EXPECT_EQ(u.spill_working_bytes, 2 * b.numel);
  EXPECT_EQ(u.spill_grad_bytes, 1 * b.numel);
  EXPECT_EQ(u.unplaced_bytes, 0u);
}

// train.adam_moments: bf16 (copied into the memory section): m and v take 4
// bytes per parameter instead of 8, so the total and the spill shrink with them.
TEST(Host, Bf16MomentsHalveTheMoments) {
  Fixture f;
  f.Build(MF_DTYPE_F32, 0, false);
  ASSERT_NE(f.s, nullptr);
  mf_hwprofile hw = mf_pt::small_profile(1);
  hw.nvme_bandwidth = 1e9;
  mf_host_usage u32, u16;
  mf_config_memory m = Mem(MF_CONFIG_SIZE_AUTO, 0, nullptr);
  ASSERT_EQ(mf_host_account(f.p, f.s, 0, &m, &hw, &u32), MF_OK);
  m.adam_moments = MF_CONFIG_MOMENTS_BF16;
  ASSERT_EQ(mf_host_account(f.p, f.s, 0, &m, &hw, &u16), MF_OK);
  EXPECT_EQ(u32.moment_bytes, 8 * f.numel);
  EXPECT_EQ(u16.moment_bytes, 4 * f.numel);
  EXPECT_EQ(u32.total_bytes - u16.total_bytes, 4 * f.numel);
  EXPECT_EQ(u16.master_bytes, u32.master_bytes);
  EXPECT_EQ(u16.grad_bytes, u32.grad_bytes);
  // Short of host memory by 6 bytes a parameter: fp32 moments cover it alone,
  // bf16 moments (4) are spilled whole and master weights give the rest.
  m = Mem(u16.total_bytes - 6 * f.numel, 0, "/nvme");
  m.adam_moments = MF_CONFIG_MOMENTS_BF16;
  ASSERT_EQ(mf_host_account(f.p, f.s, 0, &m, &hw, &u16), MF_OK);
  EXPECT_EQ(u16.spill_moment_bytes, 4 * f.numel);
  EXPECT_EQ(u16.spill_master_bytes, 2 * f.numel);
  EXPECT_EQ(u16.unplaced_bytes, 0u);
  // Forward-only: no moments whatever their dtype.
  Fixture e;
  e.Build(MF_DTYPE_F32, 1, false);
  ASSERT_EQ(mf_host_account(e.p, e.s, 0, &m, &hw, &u16), MF_OK);
  EXPECT_EQ(u16.moment_bytes, 0u);
}

// Gradients that micro-batches add into on the host (streamed, one copy home
// per micro-batch in micro-batch-major order) never spill.
TEST(Host, GradientSumsAddedIntoAtHomeStay) {
  Fixture f;
  f.Build(MF_DTYPE_F32, 0, false);
  ASSERT_NE(f.s, nullptr);
  for (int32_t i = 0; i < f.d->n_params; i++) f.d->grad[i] = MF_GRAD_STREAM;
  mf_schedule *s = nullptr;
  ASSERT_EQ(mf_schedule_build(f.p, f.d, &s), MF_OK) << mf_last_error();
  mf_hwprofile hw = mf_pt::small_profile(1);
  hw.nvme_bandwidth = 1e9;
  mf_host_usage u;
  mf_config_memory m = Mem(1, 0, "/nvme");
  ASSERT_EQ(mf_host_account(f.p, s, 1, &m, &hw, &u), MF_OK);
  EXPECT_EQ(u.spill_moment_bytes, 8 * f.numel);
  EXPECT_EQ(u.spill_master_bytes, 4 * f.numel);
  EXPECT_EQ(u.spill_grad_bytes, 0u);
  EXPECT_EQ(u.unplaced_bytes, 4 * f.numel);
  mf_schedule_free(s);
}

TEST(Host, NoNvmeNoSpillAndThePinnedLimit) {
  Fixture f;
  f.Build(MF_DTYPE_F32, 0, false);
  ASSERT_NE(f.s, nullptr);
  mf_hwprofile hw = mf_pt::small_profile(1);
  hw.nvme_bandwidth = 1e9;
  mf_host_usage u;
  mf_config_memory m = Mem(4 * f.numel, 100, nullptr);  // no nvme_dir
  ASSERT_EQ(mf_host_account(f.p, f.s, 101, &m, &hw, &u), MF_OK);
  EXPECT_FALSE(u.nvme);
  EXPECT_FALSE(u.pinned_fits);
  EXPECT_EQ(u.spill_moment_bytes + u.spill_master_bytes, 0u);
  EXPECT_EQ(u.unplaced_bytes, u.total_bytes - 4 * f.numel);
  EXPECT_TRUE(std::isinf(mf_host_spill_seconds(&u, &hw)));
  hw.nvme_bandwidth = 0;  // nvme_dir set, but the profile has no NVMe
  m = Mem(4 * f.numel, 101, "/nvme");
  ASSERT_EQ(mf_host_account(f.p, f.s, 101, &m, &hw, &u), MF_OK);
  EXPECT_FALSE(u.nvme);
  EXPECT_TRUE(u.pinned_fits);
  EXPECT_GT(u.unplaced_bytes, 0u);
  // A schedule of another program is refused.
  Fixture g;
  g.Build(MF_DTYPE_F32, 0, false);
  EXPECT_EQ(mf_host_account(f.p, g.s, 0, nullptr, &hw, &u), MF_ERR_INVALID_ARG);
}

}  // namespace
