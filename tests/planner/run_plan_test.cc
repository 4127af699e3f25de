// The run plan (planner/run_plan.h): what it decides from a config and a
// backend — the budget and its split, the device storage, staging and the
// optimizer's overlap by backend, the program for train and for eval — and
// that the plan file it writes is the same bytes every time.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "kernels/registry.h"
#include "planner/run_plan.h"
#include "src/config/config.h"
#include "src/core/core.h"
#include "src/model/params.h"

namespace {

const char kConfig[] =
    "model:\n"
    "  init: {family: mixtral, hidden: 32, layers: 2, heads: 4, kv_heads: 2, experts: 4, top_k: 2,\n"
    "         expert_ffn: 48, vocab: 64, max_seq: 16}\n"
    "data: {seq_len: 16}\n"
    "train: {micro_batch: 2, grad_accum: 2}\n"
    "hardware: {profile: configs/hw/cpu-2core.yaml}\n"
    "memory: {routing: none}\n";

struct Planned {
  mf_config *cfg = nullptr;
  mf_param_table *t = nullptr;
  mf_run_plan *rp = nullptr;
  mf_status st = MF_OK;
  std::string err;
  ~Planned() {
    mf_run_plan_free(rp);
    mf_param_table_free(t);
    mf_config_free(cfg);
  }
};

void make(Planned *r, std::vector<const char *> overrides, mf_run_use use = MF_RUN_TRAIN) {
  const char *p = getenv("TEST_TMPDIR");
  const std::string path = std::string(p ? p : "/tmp") + "/run_plan.yaml";
  std::ofstream(path) << kConfig;
  ASSERT_EQ(mf_config_load_for(path.c_str(), overrides.data(), overrides.size(), MF_CONFIG_FOR_PLAN, &r->cfg), MF_OK)
      << mf_last_error();
  ASSERT_EQ(mf_param_table_build(&r->cfg->model.init, &r->t), MF_OK) << mf_last_error();
  r->st = mf_run_plan_make(r->cfg, r->t, use, 1, &r->rp);
  if (r->st != MF_OK) r->err = mf_last_error();
}

bool gpu_present() {
  const char *b = nullptr;
  return mf_backend_resolve("auto", &b) == MF_OK && std::string(b) == "cuda";
}

TEST(RunPlan, CpuBudgetAutoIsTheProfilesDeviceMemory) {
  Planned r;
  make(&r, {"backend=cpu"});
  ASSERT_EQ(r.st, MF_OK) << r.err;
  EXPECT_STREQ(r.rp->dev.name, "cpu");
  EXPECT_EQ(r.rp->dev.total_bytes, 0u);
  EXPECT_EQ(r.rp->budget, r.rp->hw.device_memory - r.rp->hw.device_reserve);
  EXPECT_EQ(r.rp->arena_limit, r.rp->budget);
  EXPECT_EQ(r.rp->prog->storage, MF_DTYPE_F32);
  EXPECT_FALSE(r.rp->staged) << "memory.staging auto: off on cpu";
  EXPECT_FALSE(r.rp->overlap_optimizer) << "train.overlap_optimizer auto: off on cpu";
  EXPECT_EQ(r.rp->staging, nullptr);
  EXPECT_EQ(r.rp->fig.staging_bytes, 0u);
  EXPECT_EQ(r.rp->fig.device_budget_bytes, r.rp->budget);
  EXPECT_EQ(r.rp->fig.device_backend_bytes, 0u);
  EXPECT_EQ(r.rp->prog->G, 2);
  EXPECT_FALSE(r.rp->prog->forward_only);
}

TEST(RunPlan, CudaBudgetCoversWhatTheBackendKeeps) {
  if (gpu_present()) GTEST_SKIP() << "a GPU is present: the budget would be its free memory";
  Planned r;
  make(&r, {"backend=cuda", "memory.device_budget=600MiB"});
  ASSERT_EQ(r.st, MF_OK) << r.err;
  EXPECT_STREQ(r.rp->dev.name, "cuda");
  EXPECT_EQ(r.rp->dev.total_bytes, r.rp->dev.workspace_bytes + r.rp->dev.scratch_bytes + r.rp->dev.context_bytes);
  EXPECT_GT(r.rp->dev.workspace_bytes, 0u);
  EXPECT_GT(r.rp->dev.context_bytes, 0u);
  EXPECT_EQ(r.rp->budget, 600ull << 20);
  EXPECT_EQ(r.rp->arena_limit, r.rp->budget - r.rp->dev.total_bytes);
  EXPECT_LE(r.rp->plan->s->arena_bytes, r.rp->arena_limit);
  EXPECT_EQ(r.rp->fig.device_backend_bytes, r.rp->dev.total_bytes);
  EXPECT_EQ(r.rp->prog->storage, r.rp->dev.storage) << "the plan sizes tensors as the backend stores them";
  EXPECT_TRUE(r.rp->staged) << "memory.staging auto: on for cuda";
  EXPECT_TRUE(r.rp->overlap_optimizer) << "train.overlap_optimizer auto: on for cuda";
  ASSERT_NE(r.rp->staging, nullptr);
  EXPECT_EQ(r.rp->fig.staging_bytes, r.rp->staging->arena_bytes);
  EXPECT_EQ(r.rp->host.pinned_bytes, r.rp->staging->arena_bytes) << "the staging arena counts in host memory";
  // The settings say what they say, whatever the backend.
  Planned off;
  make(&off, {"backend=cuda", "memory.device_budget=600MiB", "memory.staging=false", "train.overlap_optimizer=false"});
  ASSERT_EQ(off.st, MF_OK) << off.err;
  EXPECT_FALSE(off.rp->staged);
  EXPECT_FALSE(off.rp->overlap_optimizer);
  EXPECT_EQ(off.rp->host.pinned_bytes, 0u);
}

TEST(RunPlan, ABudgetBelowTheBackendsOwnMemoryIsAnError) {
  Planned r;
  make(&r, {"backend=cuda", "memory.device_budget=100MiB"});
  EXPECT_EQ(r.st, MF_ERR_CONFIG);
  EXPECT_NE(r.err.find("memory.device_budget 100.00 MiB: the cuda backend keeps"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("raise memory.device_budget"), std::string::npos) << r.err;
  EXPECT_EQ(r.rp, nullptr);
}

TEST(RunPlan, EvalPlansOneMicroBatchForward) {
  Planned r;
  make(&r, {"backend=cpu", "memory.device_budget=1MiB"}, MF_RUN_EVAL);
  ASSERT_EQ(r.st, MF_OK) << r.err;
  EXPECT_TRUE(r.rp->prog->forward_only);
  EXPECT_EQ(r.rp->prog->G, 1);
  EXPECT_FALSE(r.rp->overlap_optimizer) << "no optimizer in eval";
  EXPECT_LE(r.rp->plan->s->arena_bytes, 1u << 20);
}

std::string slurp(const std::string &path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

// The plan file is a function of the config: two makes write the same bytes.
TEST(RunPlan, ThePlanFileIsTheSameBytesEveryTime) {
  const char *p = getenv("TEST_TMPDIR");
  const std::string dir = p ? p : "/tmp";
  std::string files[2];
  for (int i = 0; i < 2; i++) {
    Planned r;
    make(&r, {"backend=cpu", "memory.device_budget=600KiB"});
    ASSERT_EQ(r.st, MF_OK) << r.err;
    files[i] = dir + "/same" + std::to_string(i) + ".json";
    ASSERT_EQ(mf_run_plan_write_json(r.rp, files[i].c_str()), MF_OK) << mf_last_error();
  }
  EXPECT_FALSE(slurp(files[0]).empty());
  EXPECT_EQ(slurp(files[0]), slurp(files[1]));
}

}  // namespace
