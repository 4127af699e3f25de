// issue 16 item 6: runs that are killed. The shortened demo (constant
// learning rate, a checkpoint every 3 steps) trained once without a break is
// the reference; against it, the same run
//  - SIGKILLed at >= 3 moments a seeded generator picks from its progress (one
//    inside a checkpoint write, held open with the test-only
//    MF_TEST_CKPT_PAUSE_MS) and resumed with --resume after each,
//  - stopped by SIGTERM (status 0, a checkpoint of the step it stopped after),
//  - hit by a second SIGTERM inside the checkpoint write (status 143 at once,
//    the last complete checkpoint intact),
//  - on a full disk (the test-only MF_TEST_CKPT_ENOSPC: status 1 naming the
//    file and the last complete checkpoint, which is kept),
// each resumed to the end: the final weights are byte-identical and every
// step's loss the same; and each launch trained the steps after the checkpoint
// it resumed from, each once (its progress lines: train.log_every=1), not
// again from step 1, which the same bits would hide. And `moefit eval` stops
// on SIGINT (status 130).
// The seed is printed; MF_KILL_SEED=N repeats a run's moments. A launch with
// a test-only hook runs ./moefit_test, the test build that reads them.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "cli_util.h"

namespace {

constexpr int kSteps = 90;

std::string Corpus() { return text_tokens("kill_corpus", 60000); }

// The corpus the tests evaluate while a signal comes: ten times the training
// corpus (about 10 s of evaluation here), so the pass is still running when the
// signal lands even on a loaded machine; a pass that stops as it should reads
// one batch of it.
std::string LongEvalCorpus() { return text_tokens("kill_eval_corpus", 600000); }

std::string Args(const std::string &out) {
  return "train configs/demo.yaml hardware.profile=configs/hw/cpu-2core.yaml data.valid=null data.seq_len=32 "
         "train.micro_batch=2 train.warmup=2 train.log_every=1 train.schedule=constant "
         "output.checkpoint_every=3 "
         "output.checkpoint_compression=zstd-1 "
         "output.keep_checkpoints=3 train.steps=" +
         std::to_string(kSteps) + " data.train=" + Corpus() + " output.dir=" + out;
}

std::string Fresh(const std::string &name) { return fresh_dir(name); }

bool Exists(const std::string &p) { return access(p.c_str(), F_OK) == 0; }

std::map<int, std::string> Losses(const std::string &dir) { return step_losses(dir); }

// The uninterrupted run (once per test binary).
const std::string &Whole() {
  static std::string dir;
  if (!dir.empty()) return dir;
  dir = Fresh("whole");
  Result r = moefit(Args(dir));
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(trained_steps(r.out), step_range(1, kSteps)) << r.out;
  return dir;
}

void ExpectSameAsWhole(const std::string &dir) {
  EXPECT_EQ(read_file(Whole() + "/final/model.safetensors"), read_file(dir + "/final/model.safetensors"))
      << "final weights differ";
  const auto a = Losses(Whole()), b = Losses(dir);
  EXPECT_EQ(b.size(), static_cast<size_t>(kSteps));
  for (int s = 1; s <= kSteps; s++) EXPECT_EQ(a.at(s), b.count(s) ? b.at(s) : "missing") << "step " << s;
}

// `--resume` from the newest complete checkpoint (of step `step`) to the end: the same bits as Whole().
void ResumeToTheEnd(const std::string &dir, int step) {
  Result r = moefit(Args(dir) + " --resume");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("resumed from " + dir + "/checkpoints/"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("(step " + std::to_string(step) + ")"), std::string::npos) << r.out;
  EXPECT_EQ(trained_steps(r.out), step_range(step + 1, kSteps)) << r.out;
  ExpectSameAsWhole(dir);
}

// The newest checkpoint with COMPLETE under dir/checkpoints (0: none).
int NewestComplete(const std::string &dir) {
  int best = 0;
  for (int s = 1; s <= kSteps; s++) {
    char name[64];
    snprintf(name, sizeof name, "/checkpoints/step-%06d/COMPLETE", s);
    if (Exists(dir + name)) best = s;
  }
  return best;
}


// A launch that resumed from the checkpoint of step `from` (0: a fresh start)
// and was cut short: it trained from + 1 on, each step once, in order.
void ExpectTrainedOnFrom(const std::string &out, int from) {
  const std::vector<int> got = trained_steps(out);
  EXPECT_FALSE(got.empty()) << out;
  EXPECT_EQ(got, step_range(from + 1, from + static_cast<int>(got.size()))) << out;
}

std::regex StepLine(int step) { return std::regex("(^|\n)step +" + std::to_string(step) + "/"); }

unsigned Seed() {
  const char *e = getenv("MF_KILL_SEED");
  const unsigned seed = e ? static_cast<unsigned>(std::strtoul(e, nullptr, 10))
                          : static_cast<unsigned>(std::chrono::steady_clock::now().time_since_epoch().count());
  printf("kill_test: seed %u (MF_KILL_SEED=%u repeats it)\n", seed, seed);
  return seed;
}

// SIGKILL at 3 moments after a step line a seeded generator picks (plus a
// random delay of up to 40 ms, and until a checkpoint newer than the launch's
// is complete), the second inside a checkpoint write (with checkpoints
// written beside training, often while steps go on); resumed after each; then
// to the end.
TEST(Kill, SigkillAtRandomMomentsResumesToTheSameBits) {
  Whole();
  std::mt19937 rng(Seed());
  const std::string dir = Fresh("sigkill");
  int kills = 0;
  for (int launch = 1; launch <= 8; launch++) {
    SCOPED_TRACE("launch " + std::to_string(launch));
    const int from = NewestComplete(dir);
    const bool in_write = kills == 1;
    std::vector<std::string> env;
    if (in_write) env.push_back("MF_TEST_CKPT_PAUSE_MS=150");
    // The hook's launch runs the test build, which reads test-only hooks (src/core/env.h).
    Background p(std::string(in_write ? "exec ./moefit_test " : "exec ./moefit ") + Args(dir) +
                     (from > 0 ? " --resume" : ""),
                 env);
    if (from > 0) {
      ASSERT_TRUE(p.WaitFor(std::regex("resumed from " + dir + "/checkpoints/step-0*" + std::to_string(from) + " ")))
          << p.out();
    }
    if (kills < 3) {
      if (in_write) {
        ASSERT_TRUE(p.WaitFor(std::regex("MF_TEST_CKPT_PAUSE_MS: pausing [0-9]+ ms after "))) << p.out();
      } else {
        const int target = std::min(from + 4 + static_cast<int>(rng() % 12), kSteps - 1); // a checkpoint before it
        ASSERT_TRUE(p.WaitFor(StepLine(target))) << p.out();
        std::this_thread::sleep_for(std::chrono::milliseconds(rng() % 40));
        // That checkpoint complete: one written beside training
        // (output.checkpoint_async) is marked so a step or more after its own,
        // and later still under ASan; the run trains on meanwhile.
        for (int i = 0; i < 600 && NewestComplete(dir) <= from; i++) p.WaitFor(std::regex("$^"), p.out().size(), 0.05);
        ASSERT_GT(NewestComplete(dir), from) << p.out();
      }
      p.Signal(SIGKILL);
      int sig = 0;
      const int code = p.Finish(&sig);
      ASSERT_EQ(code, -1) << "finished before the kill: " << p.out();
      ASSERT_EQ(sig, SIGKILL);
      ExpectTrainedOnFrom(p.out(), from);
      kills++;
      printf("kill_test: SIGKILL %d %s; newest complete checkpoint: step %d\n", kills,
             in_write ? "inside a checkpoint write" : "after a step line", NewestComplete(dir));
      if (in_write) {  // the write it cut short stays a .tmp dir, which the next launch passes over
        Result r = shell("ls -d " + dir + "/checkpoints/.tmp-step-* 2>&1");
        EXPECT_EQ(r.code, 0) << r.out;
      }
      continue;
    }
    int sig = 0;
    const int code = p.Finish(&sig);
    ASSERT_EQ(code, 0) << p.out();
    EXPECT_EQ(trained_steps(p.out()), step_range(from + 1, kSteps)) << p.out();
    break;
  }
  ASSERT_EQ(kills, 3);
  ExpectSameAsWhole(dir);
}

// LoRA (train.lora: adapters over the frozen base, their AdamW state in the
// checkpoints): SIGKILL after a step a seeded generator picks, once a
// checkpoint is complete, then --resume: the same bits as the LoRA run never
// killed — the merged final weights, the adapters and every step's loss.
TEST(Kill, LoraSigkillResumesToTheSameBits) {
  const std::string lora =
      " train.lora.rank=4 train.lora.alpha=8 train.lr=1e-2 "
      "train.lora.targets=[q_proj,k_proj,v_proj,o_proj,w1,w2,w3]";
  const std::string whole = Fresh("lora_whole"), dir = Fresh("lora_sigkill");
  Result w = moefit(Args(whole) + lora);
  ASSERT_EQ(w.code, 0) << w.out;
  std::mt19937 rng(Seed());
  {
    Background p(std::string("exec ./moefit ") + Args(dir) + lora, {});
    const int target = 10 + static_cast<int>(rng() % 40);
    ASSERT_TRUE(p.WaitFor(StepLine(target))) << p.out();
    for (int i = 0; i < 600 && NewestComplete(dir) == 0; i++)
      p.WaitFor(std::regex("$^"), p.out().size(), 0.05);
    ASSERT_GT(NewestComplete(dir), 0) << p.out();
    p.Signal(SIGKILL);
    int sig = 0;
    ASSERT_EQ(p.Finish(&sig), -1) << "finished before the kill: " << p.out();
    ASSERT_EQ(sig, SIGKILL);
    ExpectTrainedOnFrom(p.out(), 0);
  }
  const int from = NewestComplete(dir);
  Result r = moefit(Args(dir) + lora + " --resume");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("(step " + std::to_string(from) + ")"), std::string::npos) << r.out;
  EXPECT_EQ(trained_steps(r.out), step_range(from + 1, kSteps)) << r.out;
  for (const char *f : {"/final/adapter_model.safetensors", "/final/adapter_config.json"}) {
    const std::string a = read_file(whole + f);
    EXPECT_FALSE(a.empty()) << f;
    EXPECT_EQ(a, read_file(dir + f)) << f << " differs";
  }
  const auto a = Losses(whole), b = Losses(dir);
  EXPECT_EQ(b.size(), static_cast<size_t>(kSteps));
  for (int s = 1; s <= kSteps; s++) EXPECT_EQ(a.at(s), b.count(s) ? b.at(s) : "missing") << "step " << s;
  EXPECT_LT(std::stod(a.at(kSteps)), std::stod(a.at(1))) << "the adapters train";
}

// SIGTERM: the step under way finishes, a checkpoint of it, status 0; resumed to the same bits.
TEST(Kill, SigtermStopsWithACheckpointAndResumes) {
  Whole();
  std::mt19937 rng(Seed());
  const std::string dir = Fresh("sigterm");
  const int target = 5 + static_cast<int>(rng() % 20);
  Background p(std::string("exec ./moefit ") + Args(dir), {});
  ASSERT_TRUE(p.WaitFor(StepLine(target))) << p.out();
  p.Signal(SIGTERM);
  int sig = 0;
  ASSERT_EQ(p.Finish(&sig), 0) << p.out();
  std::smatch m;
  const std::string out = p.out();
  ASSERT_TRUE(std::regex_search(out, m, std::regex("stopped by SIGTERM after step ([0-9]+) of 90: checkpoint " + dir +
                                                   "/checkpoints/step-0*([0-9]+)\n")))
      << out;
  // The command that continues it: the one that ran, overrides and all, with --resume.
  EXPECT_NE(out.find("\ncontinue with: ./moefit " + Args(dir) + " --resume\n"), std::string::npos) << out;
  const int stopped = std::stoi(m[1]);
  EXPECT_GE(stopped, target);
  EXPECT_LT(stopped, kSteps);
  EXPECT_EQ(std::stoi(m[2]), stopped);
  EXPECT_EQ(trained_steps(out), step_range(1, stopped)) << out;
  EXPECT_EQ(NewestComplete(dir), stopped);
  EXPECT_FALSE(Exists(dir + "/final")) << "a stopped run has no final weights";
  ResumeToTheEnd(dir, stopped);
}

// A second SIGTERM inside the checkpoint write the first one asked for: status
// 143 at once; the write stays a .tmp dir; the last complete checkpoint is
// intact and resumes to the same bits.
// The checkpoints before are written with training paused here, so that the
// one of step 3 is complete when step 4's line is out (beside training,
// output.checkpoint_async, it lands a step or more later).
TEST(Kill, SecondSigtermInsideTheCheckpointWriteExitsAtOnce) {
  Whole();
  const std::string dir = Fresh("sigterm2");
  Background p(std::string("exec ./moefit_test ") + Args(dir) + " output.checkpoint_async=false", {"MF_TEST_CKPT_PAUSE_MS=200"});
  ASSERT_TRUE(p.WaitFor(StepLine(4))) << p.out();  // after checkpoint 3 (complete)
  const int before = NewestComplete(dir);
  EXPECT_GE(before, 3);
  const size_t at = p.out().size();
  p.Signal(SIGTERM);
  ASSERT_TRUE(p.WaitFor(std::regex("MF_TEST_CKPT_PAUSE_MS: pausing [0-9]+ ms after "), at)) << p.out();
  const auto t0 = std::chrono::steady_clock::now();
  p.Signal(SIGTERM);
  int sig = 0;
  EXPECT_EQ(p.Finish(&sig), 128 + SIGTERM) << p.out();
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(waited, 5.0) << "the second signal did not end the process at once";
  EXPECT_EQ(p.out().find("stopped by SIGTERM"), std::string::npos) << p.out();
  EXPECT_EQ(NewestComplete(dir), before);
  Result ls = shell("ls -d " + dir + "/checkpoints/.tmp-step-* 2>&1");
  EXPECT_EQ(ls.code, 0) << ls.out;
  ResumeToTheEnd(dir, before);
}

// A full disk in the second checkpoint (its optimizer file, the 9th file the
// process writes: each checkpoint writes 7, base.json the last): status 1, the file and the fault named, the first
// checkpoint kept and named, nothing half-written left; resumed to the same bits.
TEST(Kill, FullDiskStopsTheRunKeepingTheLastCheckpoint) {
  Whole();
  const std::string dir = Fresh("enospc");
  Result r = shell("MF_TEST_CKPT_ENOSPC=9 ./moefit_test " + Args(dir) + " 2>&1");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("moefit train: error: step 6: checkpoint not written, training stopped (" + dir +
                       "/checkpoints/step-000003, the last complete checkpoint, is kept"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find(dir + "/checkpoints/.tmp-step-000006/optimizer.safetensors.zst"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("No space left on device"), std::string::npos) << r.out;
  EXPECT_EQ(NewestComplete(dir), 3);
  EXPECT_FALSE(Exists(dir + "/checkpoints/.tmp-step-000006"));
  EXPECT_FALSE(Exists(dir + "/checkpoints/step-000006"));
  ResumeToTheEnd(dir, 3);
}

// `moefit eval` on SIGINT: stops after its batch, status 130, no result line.
TEST(Kill, EvalStopsOnSigint) {
  Background p(std::string("exec ./moefit ") + "eval configs/demo.yaml data.seq_len=32 train.micro_batch=2 data.valid=null output.dir=" +
             Fresh("eval") + " --tokens " + LongEvalCorpus(), {});
  ASSERT_TRUE(p.WaitFor(std::regex("model: "))) << p.out();
  p.Signal(SIGINT);
  int sig = 0;
  EXPECT_EQ(p.Finish(&sig), 130) << p.out();
  EXPECT_NE(p.out().find("moefit eval: stopped by SIGINT after "), std::string::npos) << p.out();
  EXPECT_EQ(p.out().find("perplexity"), std::string::npos) << p.out();
}

}  // namespace

namespace {

// SIGTERM while the training's evaluation runs: the pass stops after its
// batch (that step's eval_loss is null: not a validation loss), then the stop
// checkpoint, status 0.
TEST(Kill, SigtermDuringTheEvaluationStopsIt) {
  const std::string dir = Fresh("sigterm_eval");
  Background p(std::string("exec ./moefit ") + Args(dir) + " data.valid=" + LongEvalCorpus() + " train.eval_every=5", {"MF_PROGRESS_EVERY=0"});
  ASSERT_TRUE(p.WaitFor(std::regex("eval [^\n]*: [0-9]+/[0-9]+ windows"))) << p.out();
  p.Signal(SIGTERM);
  int sig = 0;
  ASSERT_EQ(p.Finish(&sig), 0) << p.out();
  EXPECT_NE(p.out().find("stopped by SIGTERM after step 5 of 90: checkpoint " + dir +
                         "/checkpoints/step-000005\n"),
            std::string::npos)
      << p.out();
  EXPECT_EQ(NewestComplete(dir), 5);
  const std::string metrics = read_file(dir + "/metrics.jsonl");
  const size_t at = metrics.find("{\"step\":5,");
  ASSERT_NE(at, std::string::npos) << metrics;
  const std::string line = metrics.substr(at, metrics.find('\n', at) - at);
  EXPECT_NE(line.find("\"eval_loss\":null"), std::string::npos) << line;
}

// More than train.max_skipped_steps non-finite steps (a model with NaN
// weights: every step is skipped): a checkpoint, then status 1 naming the
// key; a resume with the key raised is allowed and stops again past it.
TEST(Kill, TooManySkippedStepsStopTheRunWithACheckpoint) {
  const std::string nan_model = Fresh("nan_model");
  shell("cp -r " + Whole() + "/final " + nan_model);
  std::string st = read_file(nan_model + "/model.safetensors");
  uint64_t header = 0;
  memcpy(&header, st.data(), 8);
  const uint32_t nan_bits = 0x7fc00000u;
  for (size_t i = 8 + header; i < 8 + header + 4096 && i + 4 <= st.size(); i += 4) memcpy(&st[i], &nan_bits, 4);
  write_file(nan_model + "/model.safetensors", st);
  const std::string dir = Fresh("skipped");
  const std::string args = Args(dir) + " model.init=null model.path=" + nan_model;
  Result r = moefit(args + " train.max_skipped_steps=2");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("moefit train: error: train.max_skipped_steps: 3 steps skipped for non-finite gradients or "
                       "loss, more than the 2 allowed (the last at step 3): the run is diverging and stops; "
                       "checkpoint " + dir + "/checkpoints/step-000003."),
            std::string::npos)
      << r.out;
  EXPECT_EQ(NewestComplete(dir), 3);
  Result rr = moefit(args + " train.max_skipped_steps=4 --resume");
  EXPECT_EQ(rr.code, 1) << rr.out;
  EXPECT_NE(rr.out.find("resumed from " + dir + "/checkpoints/step-000003 (step 3)"), std::string::npos) << rr.out;
  EXPECT_NE(rr.out.find("train.max_skipped_steps: 5 steps skipped"), std::string::npos) << rr.out;
  EXPECT_EQ(NewestComplete(dir), 5);
}

}  // namespace
