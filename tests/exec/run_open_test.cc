// issue 29 item 1: one run, opened the same way by every command
// (src/train/run.h). `plan` opens it up to its plan, `bench kernels` up to
// its backend, `train` and `eval` up to the executor, `profile --config` up
// to its table; each stage is the same code whichever command asks.
//   - opening in steps (table, then plan, then executor: train's way) and at
//     once give the same plan, byte for byte as plan JSON, and the same as the
//     plan.json `train` writes for the config;
//   - the backend stage creates the backend the plan names; bench kernels'
//     kernel scratch (cuDNN's whichever attention runs) does not change the
//     plan;
//   - the table stage has train.lora's adapters (what `profile --config`
//     times: before, it built a table without them);
//   - a run inside another uses that run's backend and arena, and plans
//     within its arena; inside a run not opened to its executor is an error;
//   - a stage that fails leaves what was opened for mf_run_close (ASan
//     checks nothing leaks), and a bad stage is refused.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "planner/run_plan.h"
#include "src/config/config.h"
#include "src/core/core.h"
#include "src/train/run.h"
#include "src/train/train.h"
#include "tests/exec/phrases.h"

namespace {

const char kModel[] =
    "model:\n  init: {family: mixtral, hidden: 32, layers: 2, heads: 4, kv_heads: 2, experts: 4, top_k: 2,\n"
    "         expert_ffn: 32, vocab: 64, max_seq: 32, seed: 5}\n"
    "train: {micro_batch: 2, grad_accum: 2, steps: 2, warmup: 1, lr: 1e-2, log_every: 1, threads: 2}\n"
    "backend: cpu\n";

mf_config *load(const std::string &dir, const std::vector<std::string> &extra) {
  static const std::string train = phrase_tokens("run_open.tokens", 200, 3);
  return load_config(kModel, "run_open.yaml",
                     {"data.train=" + train, "data.seq_len=16", "output.dir=" + dir,
                      "hardware.profile=configs/hw/cpu-2core.yaml"},
                     extra);
}

std::string plan_json(const mf_run &r, const std::string &name) {
  const std::string path = tmp() + "/" + name + ".json";
  EXPECT_EQ(mf_run_plan_write_json(r.rp, path.c_str()), MF_OK) << mf_last_error();
  return slurp(path);
}

struct Case {
  const char *tag;
  std::vector<std::string> extra;
};

const std::vector<Case> &cases() {
  static const std::vector<Case> c = {
      {"resident", {"memory.device_budget=64MiB"}},
      {"least_memory", {"memory.device_budget=64MiB", "memory.plan=least_memory"}},
      {"lora", {"memory.device_budget=64MiB", "train.lora.rank=4", "train.lora.alpha=8"}},
      {"bf16_tight", {"memory.device_budget=320KiB", "train.precision=bf16"}},
  };
  return c;
}

class RunOpen : public ::testing::TestWithParam<int> {};

TEST_P(RunOpen, EveryStageOpensTheSameRun) {
  const Case &c = cases()[(size_t)GetParam()];
  SCOPED_TRACE(c.tag);
  const std::string dir = tmp() + "/run_open_" + c.tag;
  mf_config *cfg = load(dir, c.extra);
  ASSERT_NE(cfg, nullptr);
  mf_threadpool *pool = nullptr;
  ASSERT_EQ(mf_threadpool_create(2, &pool), MF_OK);

  // train's way: the table, then the rest
  mf_run steps;
  memset(&steps, 0, sizeof steps);
  mf_run_opts o = {};
  o.use = MF_RUN_TRAIN;
  o.pool = pool;
  o.upto = MF_RUN_TABLE;
  ASSERT_EQ(mf_run_open(cfg, &o, &steps), MF_OK) << mf_last_error();
  EXPECT_EQ(steps.stage, MF_RUN_TABLE);
  ASSERT_NE(steps.t, nullptr);
  EXPECT_EQ(steps.rp, nullptr);
  o.upto = MF_RUN_PLANNED;
  ASSERT_EQ(mf_run_open(cfg, &o, &steps), MF_OK) << mf_last_error();
  EXPECT_EQ(steps.backend, nullptr) << "plan opens no backend";
  const mf_param_table *table = steps.t;
  o.upto = MF_RUN_EXECUTOR;
  ASSERT_EQ(mf_run_open(cfg, &o, &steps), MF_OK) << mf_last_error();
  EXPECT_EQ(steps.t, table) << "the table opened first is the run's";
  ASSERT_NE(steps.exec, nullptr);
  EXPECT_EQ(steps.G, 2);
  // a lower stage asked again changes nothing
  o.upto = MF_RUN_TABLE;
  ASSERT_EQ(mf_run_open(cfg, &o, &steps), MF_OK);
  EXPECT_EQ(steps.stage, MF_RUN_EXECUTOR);

  // plan's way (up to the plan) and bench kernels' (up to the backend)
  mf_run plan, bench;
  memset(&plan, 0, sizeof plan);
  memset(&bench, 0, sizeof bench);
  mf_run_opts po = {};
  po.use = MF_RUN_TRAIN;
  po.upto = MF_RUN_PLANNED;
  ASSERT_EQ(mf_run_open(cfg, &po, &plan), MF_OK) << mf_last_error();
  mf_run_opts bo = {};
  bo.use = MF_RUN_TRAIN;
  bo.upto = MF_RUN_BACKEND;
  bo.pool = pool;
  bo.cudnn_scratch = 1;
  ASSERT_EQ(mf_run_open(cfg, &bo, &bench), MF_OK) << mf_last_error();
  ASSERT_NE(bench.backend, nullptr);
  EXPECT_STREQ(bench.backend->name, bench.rp->dev.name);
  EXPECT_EQ(bench.exec, nullptr) << "bench kernels makes its own arena";

  const std::string a = plan_json(steps, std::string(c.tag) + "_steps"),
                    b = plan_json(plan, std::string(c.tag) + "_plan"),
                    k = plan_json(bench, std::string(c.tag) + "_bench");
  EXPECT_FALSE(a.empty());
  EXPECT_EQ(a, b) << "train's plan and plan's";
  EXPECT_EQ(a, k) << "train's plan and bench kernels'";

  // the table has train.lora's adapters (profile --config times that step)
  const bool lora = std::string(c.tag) == "lora";
  EXPECT_EQ(table->lora_a != nullptr, lora);
  EXPECT_EQ(table->trainable_numel < table->total_numel, lora);

  // an evaluation inside the training run: its backend, planned within its arena
  mf_run ev;
  memset(&ev, 0, sizeof ev);
  mf_run_opts eo = {};
  eo.use = MF_RUN_EVAL;
  eo.upto = MF_RUN_EXECUTOR;
  eo.table = steps.t;
  eo.inside = &steps;
  ASSERT_EQ(mf_run_open(cfg, &eo, &ev), MF_OK) << mf_last_error();
  EXPECT_EQ(ev.backend, steps.backend);
  EXPECT_EQ(ev.t, steps.t);
  EXPECT_TRUE(ev.rp->inside);
  EXPECT_LE(ev.rp->plan->s->arena_bytes, steps.rp->plan->s->arena_bytes);
  mf_run_close(&ev);
  // inside a run without its executor
  mf_run bad;
  memset(&bad, 0, sizeof bad);
  eo.inside = &plan;
  EXPECT_EQ(mf_run_open(cfg, &eo, &bad), MF_ERR_INTERNAL);
  EXPECT_NE(std::string(mf_last_error()).find("without its executor"), std::string::npos) << mf_last_error();
  mf_run_close(&bad);

  mf_run_close(&bench);
  mf_run_close(&plan);
  mf_run_close(&steps);
  EXPECT_EQ(steps.t, nullptr);

  // train writes the plan its run opened: the same bytes
  mf_train_summary sum;
  ASSERT_EQ(mf_train(cfg, 1, &sum), MF_OK) << mf_last_error();
  EXPECT_EQ(slurp(dir + "/plan.json"), a) << "train's plan.json";
  mf_threadpool_free(pool);
  mf_config_free(cfg);
}

INSTANTIATE_TEST_SUITE_P(Plans, RunOpen, ::testing::Range(0, (int)cases().size()),
                         [](const ::testing::TestParamInfo<int> &i) { return std::string(cases()[i.param].tag); });

TEST(RunOpen, AFailedStageLeavesWhatWasOpenedToClose) {
  // a budget smaller than the backend's own device memory: the plan refuses it
  mf_config *cfg = load(tmp() + "/run_open_fail", {"memory.device_budget=1KiB"});
  ASSERT_NE(cfg, nullptr);
  mf_run r;
  memset(&r, 0, sizeof r);
  mf_run_opts o = {};
  o.use = MF_RUN_TRAIN;
  o.upto = MF_RUN_EXECUTOR;
  const mf_status st = mf_run_open(cfg, &o, &r);
  EXPECT_NE(st, MF_OK);
  EXPECT_NE(std::string(mf_last_error()).find("memory.device_budget"), std::string::npos) << mf_last_error();
  EXPECT_EQ(r.stage, MF_RUN_TABLE) << "the table opened, the plan not";
  EXPECT_NE(r.t, nullptr);
  mf_run_close(&r);
  EXPECT_EQ(r.t, nullptr);

  o.upto = (mf_run_stage)7;
  EXPECT_EQ(mf_run_open(cfg, &o, &r), MF_ERR_INVALID_ARG);
  o.upto = MF_RUN_NONE;
  EXPECT_EQ(mf_run_open(cfg, &o, &r), MF_ERR_INVALID_ARG);
  mf_config_free(cfg);
}

}  // namespace
