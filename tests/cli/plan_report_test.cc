// Issue 27 items 2-4, as `moefit plan` prints them: what bounds the step (one
// closing line whose parts add up to the step), the table's exp.xfer/exp.opt
// explained, train.overlap_optimizer auto taking the setting predicted faster,
// --sweep, the plans tried instead when host memory is short, and progress on
// a terminal.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "cli_util.h"

namespace {

bool has(const std::string &s, const std::string &what) { return s.find(what) != std::string::npos; }

std::vector<std::string> lines_of(const std::string &s) {
  std::vector<std::string> v;
  std::istringstream in(s);
  std::string line;
  while (std::getline(in, line)) v.push_back(line);
  return v;
}

std::string line_with(const std::string &out, const std::string &what) {
  for (const std::string &l : lines_of(out))
    if (has(l, what)) return l;
  return "";
}

// The number after `key` in `line` (NaN when absent).
double number_after(const std::string &line, const std::string &key) {
  const size_t at = line.find(key);
  if (at == std::string::npos) return NAN;
  return strtod(line.c_str() + at + key.size(), nullptr);
}

// The demo on the cuda backend's planning (no GPU needed: the plan only).
const std::string kCuda = "plan configs/demo.yaml backend=cuda hardware.profile=configs/hw/h100-pcie.yaml";

TEST(PlanReport, EndsWithTheBoundAndItsPartsAddUp) {
  for (const std::string &cmd : {std::string("plan configs/demo.yaml hardware.profile=configs/hw/cpu-2core.yaml"),
                                 kCuda + " memory.device_budget=566MiB"}) {
    SCOPED_TRACE(cmd);
    Result r = moefit(cmd);
    ASSERT_EQ(r.code, 0) << r.out;
    const std::string bound = line_with(r.out, "bound: ");
    ASSERT_EQ(bound.rfind("bound: ", 0), 0u) << r.out;
    bool named = false;
    for (const char *k : {"compute", "uploads", "copies home", "host optimizer", "NVMe"})
      named = named || bound.rfind(std::string("bound: ") + k + ": ", 0) == 0;
    EXPECT_TRUE(named) << bound;
    const double step = number_after(bound, "the "), compute = number_after(bound, " is compute "),
                 xfer = number_after(bound, " s + "), opt = number_after(bound, "s) + ");
    ASSERT_FALSE(std::isnan(step + compute + xfer + opt)) << bound;
    EXPECT_NEAR(compute + xfer + opt, step, 1e-3 * step) << bound;
    // The table says what its columns mean.
    EXPECT_TRUE(has(r.out, "\nseconds a step: step s = compute + exp.xfer + exp.opt; exp.xfer: ")) << r.out;
  }
  Result help = moefit("plan --help");
  EXPECT_TRUE(has(help.out, "exp.xfer the time it waits on copies")) << help.out;
  EXPECT_TRUE(has(help.out, "--sweep KEY=V1,V2")) << help.out;
}

// train.overlap_optimizer auto on cuda takes whichever the planner predicts
// faster: behind the next step where the uploads gain from it, after each step
// where the first uploads would wait for a large host update (the embedding,
// pinned to the host, while the device updates the rest).
TEST(PlanReport, OverlapAutoTakesThePredictedFaster) {
  struct Case {
    const char *overrides, *expect;
  } cases[] = {
      {" memory.device_budget=566MiB", "behind the next step's device work"},
      {" memory.device_budget=2GiB model.init.vocab=32000 'memory.overrides=[{match: \"model.embed_tokens.weight\", "
       "params: stream, optimizer: host}, {match: \"model.layers.*\", optimizer: device}, {match: \"lm_head.weight\", "
       "optimizer: device}, {match: \"model.norm.weight\", optimizer: device}]'",
       "after each step"},
  };
  for (const Case &c : cases) {
    SCOPED_TRACE(c.overrides);
    double step[3];
    std::string said;
    const char *settings[3] = {"true", "false", "auto"};
    for (int k = 0; k < 3; k++) {
      Result r = moefit(kCuda + c.overrides + " train.overlap_optimizer=" + settings[k]);
      ASSERT_EQ(r.code, 0) << r.out;
      const std::string line = line_with(r.out, " s/step predicted = ");
      step[k] = number_after(line, "the planner's choice: ");
      if (k == 2) said = line;
    }
    EXPECT_TRUE(has(said, c.expect)) << said;
    EXPECT_EQ(step[2], std::min(step[0], step[1])) << said;
    EXPECT_NE(step[0], step[1]) << "a case where the two settings differ";
  }
}

TEST(PlanReport, SweepPrintsARowPerValue) {
  Result r = moefit("plan configs/demo.yaml hardware.profile=configs/hw/cpu-2core.yaml --sweep "
                    "memory.device_budget=1MiB,9MiB,15MiB --sweep train.micro_batch=4,8");
  ASSERT_EQ(r.code, 0) << r.out;
  const std::string head = line_with(r.out, "  memory.device_budget  train.micro_batch");
  EXPECT_TRUE(has(head, "fits") && has(head, "host memory") && has(head, "tokens/s") && has(head, "bound")) << r.out;
  int rows = 0, over = 0;
  for (const std::string &l : lines_of(r.out))
    if (l.rfind("  1MiB ", 0) == 0 || l.rfind("  9MiB ", 0) == 0 || l.rfind("  15MiB ", 0) == 0) {
      rows++;
      over += has(l, "error") || has(l, "over");
    }
  EXPECT_EQ(rows, 6) << r.out;
  EXPECT_GE(over, 2) << "1 MiB is below what the demo needs:\n" << r.out;
  EXPECT_TRUE(has(r.out, "of 6 fit")) << r.out;

  Result none = moefit("plan configs/demo.yaml --sweep memory.device_budget=1KiB,2KiB");
  EXPECT_EQ(none.code, 1) << none.out;
  EXPECT_TRUE(has(none.out, "0 of 2 fit")) << none.out;
  EXPECT_EQ(moefit("plan configs/demo.yaml --sweep memory.device_budget").code, 2);
  EXPECT_EQ(moefit("plan configs/demo.yaml --sweep memory.device_budget=1MiB,,2MiB").code, 2);
  EXPECT_EQ(moefit("plan configs/demo.yaml --sweep train.lr=1e-3 --json x.json").code, 2);
}

// Over host memory: the line before the closing error lists the plans tried
// instead, each with its host memory and predicted step; train refuses with
// the same, before it allocates anything.
TEST(PlanReport, OverHostMemoryListsWhatWouldRun) {
  Result r = moefit(
      "plan tests/planner/data/mixtral-8x7b.yaml memory.nvme_dir=null memory.host_limit=120GiB");
  EXPECT_EQ(r.code, 1) << r.out;
  const std::vector<std::string> lines = lines_of(r.out);
  ASSERT_GE(lines.size(), 2u);
  EXPECT_EQ(lines.back().rfind("moefit plan: error: the plan cannot run: host memory: ", 0), 0u) << r.out;
  const std::string alt = line_with(r.out, "planned instead: ");
  ASSERT_FALSE(alt.empty()) << r.out;
  EXPECT_TRUE(has(alt, "train.adam_moments=bf16: ")) << alt;
  EXPECT_TRUE(has(alt, "train.lora.rank=16 ")) << alt;
  EXPECT_TRUE(has(alt, "'train.lora.targets=[q_proj, k_proj, v_proj, o_proj, w1, w3, w2]'")) << alt;
  const size_t lora = alt.find("train.lora.rank=16");
  EXPECT_TRUE(has(alt.substr(lora), " of host memory, ")) << alt;
  EXPECT_TRUE(has(alt.substr(lora), " s/step predicted")) << alt;
  EXPECT_TRUE(has(alt, "memory.nvme_dir=DIR on an NVMe drive")) << alt;
  EXPECT_TRUE(has(alt, " on NVMe, ")) << alt;

  // A plan that fits lists nothing.
  Result fits = moefit("plan configs/demo.yaml");
  EXPECT_EQ(fits.code, 0);
  EXPECT_FALSE(has(fits.out, "planned instead")) << fits.out;

  // train: the same refusal, with the alternatives, before the arena or the data.
  const std::string out = fresh_dir("plan_report_refused");
  Result t = moefit("train configs/demo.yaml memory.host_limit=1MiB train.steps=2 train.warmup=1 output.dir=" + out +
                    " data.train=" + text_tokens("plan_report", 20000) + " data.valid=null");
  EXPECT_EQ(t.code, 1) << t.out;
  EXPECT_TRUE(has(t.out, "moefit train: error: the plan cannot run: host memory: ")) << t.out;
  EXPECT_TRUE(has(t.out, "planned instead: train.adam_moments=bf16: ")) << t.out;
  EXPECT_FALSE(std::ifstream(out + "/metrics.jsonl").good());
}

// LoRA with everything resident: the frozen base is uploaded at the first step
// only (nothing changes it), as the plan predicts: later steps move the
// adapters and the batch, not the base.
TEST(PlanReport, LoraBaseResidentIsUploadedOnce) {
  const std::string base = fresh_dir("plan_report_base"), out = fresh_dir("plan_report_lora");
  ASSERT_EQ(moefit("init --family mixtral --preset tiny --out " + base).code, 0);
  const std::string cmd = "train configs/demo.yaml model.init=null model.path=" + base +
                          " train.lora.rank=4 'train.lora.targets=[q_proj, v_proj]' memory.plan=resident "
                          "memory.device_budget=auto data.seq_len=32 train.micro_batch=2 train.steps=3 "
                          "train.warmup=0 train.log_every=1 data.valid=null output.dir=" + out +
                          " data.train=" + text_tokens("plan_report_lora", 20000);
  Result r = moefit(cmd);
  ASSERT_EQ(r.code, 0) << r.out;
  const std::string m = read_file(out + "/metrics.jsonl");
  std::vector<double> h2d;
  for (size_t at = m.find("\"h2d_bytes\":"); at != std::string::npos; at = m.find("\"h2d_bytes\":", at + 1))
    h2d.push_back(strtod(m.c_str() + at + 12, nullptr));
  ASSERT_EQ(h2d.size(), 3u) << m;
  const double weights = (double)read_file(base + "/model.safetensors").size();
  EXPECT_GT(h2d[0], 0.5 * weights) << "step 1 uploads the base";
  EXPECT_LT(h2d[1], 0.1 * weights) << "step 2 uploads the base again:\n" << m;
  EXPECT_LT(h2d[2], 0.1 * weights) << m;
}

// Planning longer than the threshold shows a progress line on a terminal
// (MF_PROGRESS_AFTER=0: from the first second), and nothing of it elsewhere.
TEST(PlanReport, ProgressOnATerminalOnly) {
  const std::string cmd = "./moefit plan configs/demo.yaml";
  Result tty = shell("MF_PROGRESS_AFTER=0 script -qec '" + cmd + "' /dev/null 2>&1");
  EXPECT_EQ(tty.code, 0) << tty.out;
  EXPECT_TRUE(has(tty.out, "\r\033[Kplanning: ")) << tty.out.substr(0, 2000);
  EXPECT_TRUE(has(tty.out, "\r\033[K")) << "the line is wiped when planning ends";
  Result pipe = shell("MF_PROGRESS_AFTER=0 " + cmd + " 2>&1");
  EXPECT_EQ(pipe.code, 0) << pipe.out;
  EXPECT_FALSE(has(pipe.out, "planning: ")) << pipe.out.substr(0, 2000);
}

}  // namespace
