// One run plan: `moefit plan CONFIG --json F` writes exactly the plan that
// `moefit train CONFIG` writes to OUTPUT/plan.json and runs, for the same
// config and overrides — the demo on the cpu backend at several budgets (the
// planner's choice streaming and recomputing below 17 MiB), and the real-size
// configs on the cuda backend, whose train stops at "no GPU" here after
// writing the plan.
#include <gtest/gtest.h>
#include <unistd.h>

#include <string>

#include "tests/cli/cli_util.h"

namespace {

// A byte-level corpus long enough for a few windows of 4096 tokens.
std::string corpus_tokens() {
  static std::string toks;
  if (!toks.empty()) return toks;
  const std::string text = tmpdir() + "/plan_train_corpus.txt";
  std::string corpus;
  for (int i = 0; i < 600; i++) corpus += "the quick brown fox jumps over the lazy dog " + std::to_string(i) + "\n";
  write_file(text, corpus);
  toks = tmpdir() + "/plan_train_corpus.tokens";
  Result r = moefit("data bytes " + text + " " + toks);
  EXPECT_EQ(r.code, 0) << r.out;
  return toks;
}

// Plans with `moefit plan --json`, then trains (or tries to) with the same
// overrides; returns the train's result and checks the two plan files.
// `plan_code`: moefit plan's exit status (1: the plan cannot run here, which
// it still shows and writes).
Result plan_then_train(const std::string &config, const std::string &tag, const std::string &overrides,
                       int plan_code = 0) {
  const std::string dir = tmpdir() + "/plan_train_" + tag;
  const std::string common = " data.train=" + corpus_tokens() + " data.valid=null output.dir=" + dir + overrides;
  const std::string shown = dir + ".plan.json";
  Result p = moefit("plan " + config + common + " --json " + shown);
  EXPECT_EQ(p.code, plan_code) << p.out;
  Result t = moefit("train " + config + common);
  const std::string ran = read_file(dir + "/plan.json");
  EXPECT_FALSE(ran.empty()) << tag << ": train wrote no plan.json:\n" << t.out;
  EXPECT_TRUE(read_file(shown) == ran) << tag << ": moefit plan --json and train's plan.json differ";
  return t;
}

TEST(PlanIsWhatTrainRuns, DemoAtSeveralBudgets) {
  for (const char *budget : {"auto", "15MiB", "9MiB"}) {
    Result t = plan_then_train("configs/demo.yaml", std::string("demo_") + budget,
                               std::string(" memory.device_budget=") + budget + " train.steps=2 train.warmup=1");
    EXPECT_EQ(t.code, 0) << t.out;
  }
  // The 9 MiB plan streams and recomputes (the demo's resident arena is ~21 MiB).
  const std::string plan9 = read_file(tmpdir() + "/plan_train_demo_9MiB/plan.json");
  EXPECT_NE(plan9.find("\"recompute\""), std::string::npos);
  EXPECT_NE(plan9.find("\"stream\""), std::string::npos);
}

TEST(PlanIsWhatTrainRuns, RealSizeConfigsOnCuda) {
  const char *why = "a GPU is present: train would run the real-size model";
  Result probe = moefit("plan configs/demo.yaml backend=cuda memory.device_budget=auto");
  if (probe.out.find("auto: the free memory of") != std::string::npos) GTEST_SKIP() << why;
  struct Case {
    const char *config, *tag, *overrides;
  } cases[] = {
      {"tests/planner/data/qwen3-30b-a3b.yaml", "qwen3", ""},
      {"tests/planner/data/qwen3-30b-a3b.yaml", "qwen3_40g", " memory.device_budget=40GiB"},
      {"tests/planner/data/mixtral-8x7b.yaml", "mixtral_24g", " memory.device_budget=24GiB"},
  };
  // Each spills its host state to NVMe: into a directory that is not there,
  // so `moefit plan` says the plan cannot run here (and exits 1), and shows
  // and writes it all the same.
  const std::string nvme = " memory.nvme_dir=" + tmpdir() + "/no-nvme-here";
  for (const Case &c : cases) {
    Result t = plan_then_train(c.config, c.tag, std::string(c.overrides) + nvme, 1);
    EXPECT_EQ(t.code, 1) << c.tag << ": " << t.out;
    EXPECT_TRUE(t.out.find("no usable GPU") != std::string::npos ||
                t.out.find("built without CUDA") != std::string::npos)
        << c.tag << ": " << t.out;
  }
}

}  // namespace
