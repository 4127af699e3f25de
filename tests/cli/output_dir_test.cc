// issue 16 item 4: `moefit train` never overwrites an earlier run. Into an
// output dir that holds one (metrics.jsonl, final/, checkpoints/) it refuses
// before changing anything — the message names the dir, what it holds and
// --resume (when a complete checkpoint is there) or another output.dir — and
// the tree is byte for byte what it was. A missing or empty dir, or one with
// only what `moefit plan --json` and the demo's data put there, is trained
// into; --resume continues a used one.
#include <gtest/gtest.h>

#include <string>

#include "cli_util.h"

namespace {

std::string Corpus() { return text_tokens("outdir_corpus", 30000); }

std::string Args(const std::string &out, int steps) {
  return "train configs/demo.yaml hardware.profile=configs/hw/cpu-2core.yaml data.valid=null data.seq_len=32 "
         "train.micro_batch=2 train.warmup=1 train.log_every=1 output.checkpoint_every=2 train.steps=" +
         std::to_string(steps) + " data.train=" + Corpus() + " output.dir=" + out;
}

// Every path under dir with its type, size, mode, mtime and content checksum.
std::string Tree(const std::string &dir) {
  Result r = shell("cd '" + dir +
                   "' && find . -printf '%p %y %s %m %T@\\n' | sort && "
                   "find . -type f -print0 | sort -z | xargs -0 -r sha256sum");
  EXPECT_EQ(r.code, 0) << r.out;
  return r.out;
}

bool has(const std::string &s, const std::string &what) {
  return s.find(what) != std::string::npos;
}

TEST(OutputDir, AUsedDirIsRefusedAndLeftAsItWas) {
  const std::string d = tmpdir() + "/used";
  Result first = moefit(Args(d, 4));
  ASSERT_EQ(first.code, 0) << first.out;
  const std::string before = Tree(d);
  Result again = moefit(Args(d, 4));
  EXPECT_EQ(again.code, 1) << again.out;
  EXPECT_TRUE(
      has(again.out, "moefit train: error: output.dir " + d +
                         " holds an earlier run (metrics.jsonl, final/, checkpoints/; newest complete "
                         "checkpoint " +
                         d + "/checkpoints/step-000004)"))
      << again.out;
  // The command that continues it is the one that was run, with --resume.
  EXPECT_TRUE(has(again.out, "Continue it with `./moefit " + Args(d, 4) + " --resume`")) << again.out;
  EXPECT_TRUE(has(again.out, "another output.dir")) << again.out;
  EXPECT_FALSE(has(again.out, "step ")) << "refused before training:\n" << again.out;
  EXPECT_EQ(Tree(d), before) << "the refused run changed the directory";

  // --resume continues it: metrics.jsonl gets the resume mark and the new steps.
  Result resumed = moefit(Args(d, 6) + " --resume");
  ASSERT_EQ(resumed.code, 0) << resumed.out;
  const std::string m = read_file(d + "/metrics.jsonl");
  EXPECT_TRUE(has(m, "{\"resumed_from\":\"" + d + "/checkpoints/step-000004\",\"resume_step\":4}")) << m;
  EXPECT_TRUE(has(m, "{\"step\":6,")) << m;
}

// A run without a complete checkpoint (one that died early, or whose
// checkpoints were removed): no --resume to suggest.
TEST(OutputDir, WithoutACheckpointSuggestsAnotherDir) {
  const std::string d = tmpdir() + "/no_ckpt";
  ASSERT_EQ(shell("mkdir -p " + d + "/final && echo '{}' > " + d + "/metrics.jsonl").code, 0);
  const std::string before = Tree(d);
  Result r = moefit(Args(d, 2));
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(
      has(r.out, "output.dir " + d + " holds an earlier run (metrics.jsonl, final/; no complete checkpoint"))
      << r.out;
  EXPECT_TRUE(has(r.out, "output.dir=" + d + "-2")) << r.out;
  EXPECT_FALSE(has(r.out, "--resume")) << r.out;
  EXPECT_EQ(Tree(d), before);
}

// Not a run: an empty dir; plan.json from `moefit plan --json` (plan first,
// train after), the demo's data/ and a routing.json copied in.
TEST(OutputDir, EmptyOrPlannedDirsAreTrainedInto) {
  const std::string empty = tmpdir() + "/empty";
  ASSERT_EQ(shell("mkdir -p " + empty).code, 0);
  Result e = moefit(Args(empty, 2));
  EXPECT_EQ(e.code, 0) << e.out;

  const std::string planned = tmpdir() + "/planned";
  ASSERT_EQ(shell("mkdir -p " + planned + "/data && cp " + Corpus() + " " + planned + "/data/").code, 0);
  Result p = moefit("plan" + Args(planned, 2).substr(5) + " --json " + planned + "/plan.json");
  ASSERT_EQ(p.code, 0) << p.out;
  ASSERT_EQ(shell("cp " + empty + "/routing.json " + planned + "/routing.json").code, 0);
  Result t = moefit(Args(planned, 2));
  EXPECT_EQ(t.code, 0) << t.out;
  EXPECT_TRUE(has(read_file(planned + "/metrics.jsonl"), "{\"step\":2,"));
}

}  // namespace
