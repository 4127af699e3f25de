// The command that continues a run (issue 27 item 2): the command line as
// it was typed, its overrides and options in their order, each word quoted
// where a shell needs it, `--resume [DIR]` replaced by `--resume` at the
// end; under mpirun with a launcher that cannot be read back, `mpirun -np N`
// and a note; under `bazel run`, bazel's command.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "src/cli/commands.h"

namespace {

std::string Resume(std::vector<std::string> words, int ranks = 1, int *exact_out = nullptr) {
  std::vector<char *> argv;
  for (std::string &w : words) argv.push_back(&w[0]);
  mf_cli_remember_command(static_cast<int>(argv.size()), argv.data());
  char buf[4096];
  int exact = -1;
  const size_t n = mf_cli_resume_command(ranks, buf, sizeof buf, &exact);
  EXPECT_EQ(n, std::string(buf).size());
  if (exact_out) *exact_out = exact;
  return buf;
}

TEST(ResumeCommand, RepeatsTheCommandLineWithResume) {
  unsetenv("BUILD_WORKING_DIRECTORY");
  int exact = 0;
  EXPECT_EQ(Resume({"./moefit", "train", "configs/x.yaml", "train.lr=1e-4", "output.dir=runs/x"}, 1, &exact),
            "./moefit train configs/x.yaml train.lr=1e-4 output.dir=runs/x --resume");
  EXPECT_EQ(exact, 1);
  // --resume DIR (and --resume=DIR) give way to --resume: the newest checkpoint, the one just written.
  EXPECT_EQ(Resume({"moefit", "train", "c.yaml", "--resume", "runs/x/checkpoints/step-000010",
                    "train.steps=90", "--verbose"}),
            "moefit train c.yaml train.steps=90 --verbose --resume");
  EXPECT_EQ(Resume({"moefit", "train", "c.yaml", "--resume=runs/x/checkpoints/step-000010"}),
            "moefit train c.yaml --resume");
  // --resume before the config: the config is not its DIR.
  EXPECT_EQ(Resume({"moefit", "train", "--resume", "c.yaml", "a.b=1"}), "moefit train c.yaml a.b=1 --resume");
  // Words a shell would split or expand are quoted so that the line reads back as it ran.
  EXPECT_EQ(
      Resume({"/opt/moefit/bin/moefit", "train", "my configs/x.yaml", "output.dir=runs/it's",
              "data.train=$HOME/t", "train.lr=*", ""}),
      "/opt/moefit/bin/moefit train 'my configs/x.yaml' 'output.dir=runs/it'\\''s' 'data.train=$HOME/t' "
      "'train.lr=*' '' --resume");
}

TEST(ResumeCommand, UnderMpirunAndBazelRun) {
  unsetenv("BUILD_WORKING_DIRECTORY");
  // This test's parent is not the mpirun of the command line: -np from the ranks, the rest unknown.
  int exact = 1;
  EXPECT_EQ(Resume({"moefit", "train", "c.yaml", "train.steps=9"}, 4, &exact),
            "mpirun -np 4 moefit train c.yaml train.steps=9 --resume");
  EXPECT_EQ(exact, 0);
  setenv("BUILD_WORKING_DIRECTORY", "/home/me/moefit", 1);
  EXPECT_EQ(Resume({"/root/.cache/bazel/x/moefit", "train", "c.yaml"}),
            "bazel run //:moefit -- train c.yaml --resume");
  unsetenv("BUILD_WORKING_DIRECTORY");
  // Nothing remembered: nothing to say.
  mf_cli_remember_command(0, nullptr);
  char buf[64] = "x";
  EXPECT_EQ(mf_cli_resume_command(1, buf, sizeof buf, &exact), 0u);
  EXPECT_STREQ(buf, "");
}

}  // namespace
