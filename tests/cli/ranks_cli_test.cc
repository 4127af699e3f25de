// issue 27: `mpirun -np N moefit train` as a user meets it.
//  - The README's multi-rank example runs right after the demo (its own
//    output.dir; Open MPI's --allow-run-as-root where the test runs as root);
//    the example without output.dir is refused once, naming the used dir.
//  - An error every rank meets alike is printed once, by rank 0 (a bad
//    override, a data file whose vocabulary the model cannot take); every
//    rank exits with status 1 without MPI_Abort.
//  - A stop: SIGUSR1 to mpirun (Open MPI forwards it) stops every rank after
//    the same step with a complete checkpoint, and mpirun exits 0; SIGTERM to
//    mpirun does the same, but Open MPI makes mpirun exit 1, and rank 0's last
//    line says so.
//  - `moefit plan --ranks 2` on the cpu backend prices a rank's step on its
//    share of the machine's cores.
//
// mpirun runs as the test's user with --oversubscribe and its shared-memory
// transport confined to the test's TEST_TMPDIR (tests/cli/ranks_test.cc).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <regex>
#include <string>

#include "cli_util.h"

namespace {

std::string Corpus() {
  return text_tokens("ranks_cli_corpus", 60000);
}

// The test's runfiles root (where ./moefit and configs/ are).
std::string Root() {
  char buf[4096];
  return getcwd(buf, sizeof buf) ? buf : ".";
}

// mpirun's options for a test: as root, Open MPI's root flag in the form
// `root_flag` gives (the README's --allow-run-as-root, or the two variables).
std::string MpirunLine(int n, bool root_flag_on_the_command_line = false) {
  const std::string vader = tmpdir() + "/vader";
  shell("mkdir -p " + vader);
  const bool root = geteuid() == 0;
  // Under ASan the suppressions (Open MPI's allocations kept to its exit) by
  // their absolute path: the README's example runs in another directory.
  std::string env = "LSAN_OPTIONS=\"$LSAN_OPTIONS${LSAN_OPTIONS:+:}fast_unwind_on_malloc=0:suppressions=" + Root() +
                    "/tests/lsan.supp\" OMPI_MCA_mca_base_component_disable_dlclose=1 TMPDIR=" + tmpdir() + " ";
  if (root && !root_flag_on_the_command_line)
    env += "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 ";
  return env + "mpirun " + (root && root_flag_on_the_command_line ? "--allow-run-as-root " : "") + "-np " +
         std::to_string(n) +
         " --oversubscribe --mca pml ob1 --mca btl self,vader --mca btl_vader_single_copy_mechanism none "
         "--mca btl_vader_backing_directory " +
         vader + " -x LSAN_OPTIONS -x OMPI_MCA_mca_base_component_disable_dlclose ";
}

Result Mpirun(int n, const std::string &args) {
  return shell(MpirunLine(n) + "./moefit " + args + " 2>&1");
}

size_t Count(const std::string &text, const std::string &what) {
  size_t n = 0, at = 0;
  while ((at = text.find(what, at)) != std::string::npos) n++, at++;
  return n;
}

// The demo shortened: 32-token sequences of 2, every step logged.
std::string Args(const std::string &out, const std::string &extra, int steps = 6) {
  return "train configs/demo.yaml hardware.profile=configs/hw/cpu-2core.yaml data.valid=null data.seq_len=32 "
         "train.micro_batch=2 train.warmup=2 train.log_every=1 train.steps=" +
         std::to_string(steps) + " data.train=" + Corpus() + " output.dir=" + out + " " + extra;
}

// The README: `./tools/demo`, then its multi-rank example. Run where the demo
// runs (a directory with configs/demo.yaml and runs/demo/data), shortened
// by overrides that change nothing else: the demo has trained into
// runs/demo, so the example as the README gave it first is refused (once),
// and with its own output.dir it trains.
TEST(RanksCli, TheReadmeExampleRunsAfterTheDemo) {
  const std::string dir = fresh_dir("readme"), bin = Root() + "/moefit";
  ASSERT_EQ(shell("mkdir -p " + dir + "/configs " + dir + "/runs/demo/data && cp " + Root() +
                  "/configs/demo.yaml " + dir + "/configs/ && cp " + Corpus() + " " + dir +
                  "/runs/demo/data/train.tokens")
                .code,
            0);
  const std::string shorter = " train.steps=3 train.warmup=1 data.seq_len=32 data.valid=null";
  Result demo = shell("cd " + dir + " && " + bin + " train configs/demo.yaml" + shorter + " 2>&1");
  ASSERT_EQ(demo.code, 0) << demo.out;
  const std::string example = "train configs/demo.yaml train.micro_batch=4 train.grad_accum=1";
  Result used = shell("cd " + dir + " && " + MpirunLine(2, true) + bin + " " + example + shorter + " 2>&1");
  EXPECT_NE(used.code, 0) << used.out;
  EXPECT_EQ(Count(used.out, "error: output.dir runs/demo holds an earlier run"), 1u) << used.out;
  Result ok = shell("cd " + dir + " && " + MpirunLine(2, true) + bin + " " + example +
                    " output.dir=runs/demo-2ranks" + shorter + " 2>&1");
  ASSERT_EQ(ok.code, 0) << ok.out;
  EXPECT_NE(ok.out.find("step: 2 ranks (1 node) x 1 x 4 sequences of 32 tokens = 256 tokens"),
            std::string::npos)
      << ok.out;
  EXPECT_FALSE(read_file(dir + "/runs/demo-2ranks/final/model.safetensors").empty()) << ok.out;
}

// A bad override: every rank reads the same config; rank 0 says what is
// wrong, once, and every rank exits 1 (no MPI_Abort).
TEST(RanksCli, AConfigErrorIsPrintedOnce) {
  Result r = Mpirun(2, Args(fresh_dir("bad_lr"), "train.lr=-1"));
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_EQ(Count(r.out, "train.lr must be in (0, 1000]"), 1u) << r.out;
  EXPECT_EQ(r.out.find("MPI_ABORT"), std::string::npos) << r.out;
}

// An error met in setup by every rank (the data file's vocabulary is larger
// than the model's: each rank opens it): rank 0's message alone, without a
// rank number, and no MPI_Abort.
TEST(RanksCli, AnErrorEveryRankMeetsInSetupIsPrintedOnce) {
  Result r = Mpirun(2, Args(fresh_dir("bad_vocab"), "model.init.vocab=100"));
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_EQ(Count(r.out, "its vocabulary (256) is larger than the model's (100)"), 1u) << r.out;
  EXPECT_NE(r.out.find("moefit train: error: data.train: "), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find(" of 2: "), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("MPI_ABORT"), std::string::npos) << r.out;
}

// `mpirun ... moefit ARGS` in the background (mpi_opts: more of mpirun's
// options), its output read as it comes; Signal() goes to mpirun itself.
std::string JobCommand(const std::string &args, const std::string &mpi_opts = "") {
  return "exec env " + MpirunLine(2) + mpi_opts + " ./moefit " + args;
}

// The step the run stopped after, from "stopped by SIG after step K of N:
// checkpoint DIR/checkpoints/step-00000K", or -1.
int StoppedAfter(const std::string &out, const std::string &sig, const std::string &dir) {
  std::smatch m;
  if (!std::regex_search(out, m,
                         std::regex("stopped by " + sig + " after step ([0-9]+) of 2000: checkpoint " + dir +
                                    "/checkpoints/step-0*([0-9]+)")) ||
      m[1] != m[2])
    return -1;
  return std::stoi(m[1]);
}

bool Complete(const std::string &dir, int step) {
  char name[64];
  snprintf(name, sizeof name, "/checkpoints/step-%06d/COMPLETE", step);
  return access((dir + name).c_str(), F_OK) == 0;
}

// SIGUSR1 to mpirun: Open MPI forwards it to every rank at once; they stop
// after the same step with a checkpoint and exit 0, and so does mpirun.
TEST(RanksCli, Sigusr1ToMpirunStopsWithACheckpointAndStatus0) {
  const std::string dir = fresh_dir("usr1");
  Background j(JobCommand(Args(dir, "", 2000)));
  ASSERT_TRUE(j.WaitFor(std::regex("\nstep +3/"))) << j.out();
  j.Signal(SIGUSR1);
  EXPECT_EQ(j.Finish(), 0) << j.out();
  const int step = StoppedAfter(j.out(), "SIGUSR1", dir);
  ASSERT_GE(step, 3) << j.out();
  EXPECT_TRUE(Complete(dir, step)) << j.out();
  EXPECT_EQ(j.out().find("mpirun will exit with status 1"), std::string::npos) << j.out();
}

// SIGTERM to mpirun: Open MPI sends the ranks SIGTERM 1 s later and SIGKILL
// 1 s after that (odls_base_sigkill_timeout: 2 s here, for a loaded machine
// and ASan); they stop after the same step with a checkpoint, but mpirun
// exits 1 whatever they return, and rank 0's last line says so and why.
TEST(RanksCli, SigtermToMpirunStopsWithACheckpointAndSaysMpirunExits1) {
  const std::string dir = fresh_dir("term");
  Background j(JobCommand(Args(dir, "", 2000), "--mca odls_base_sigkill_timeout 2"));
  ASSERT_TRUE(j.WaitFor(std::regex("\nstep +3/"))) << j.out();
  j.Signal(SIGTERM);
  EXPECT_EQ(j.Finish(), 1) << j.out();
  const int step = StoppedAfter(j.out(), "SIGTERM", dir);
  ASSERT_GE(step, 3) << j.out();
  EXPECT_TRUE(Complete(dir, step)) << j.out();
  EXPECT_EQ(Count(j.out(), "mpirun will exit with status 1, not 0: the SIGTERM came from mpirun"), 1u)
      << j.out();
  EXPECT_NE(j.out().find("`kill -USR1 <mpirun's pid>` stops the ranks the same way with status 0"),
            std::string::npos)
      << j.out();
}

// plan --ranks: "the planner's choice: S s/step predicted".
double PredictedStep(const std::string &out) {
  std::smatch m;
  if (!std::regex_search(out, m, std::regex("the planner's choice: ([0-9.e+-]+) s/step predicted")))
    return NAN;
  return std::stod(m[1]);
}

// The cpu backend's ranks on one machine share its cores (each runs cores /
// ranks threads), and the profile is measured on all of them: a rank's step
// of the same work is predicted slower than one process's (about 2x here,
// less the per-kernel launch cost the profile keeps); ranks on nodes of
// their own (--node-ranks 1) have the machine each, as one process does.
TEST(RanksCli, PlanWithRanksPricesTheSharedCores) {
  const std::string base = Args(fresh_dir("plan_cores"), "").replace(0, 5, "plan");
  Result one = moefit(base);
  ASSERT_EQ(one.code, 0) << one.out;
  Result two = moefit(base + " --ranks 2");
  ASSERT_EQ(two.code, 0) << two.out;
  Result apart = moefit(base + " --ranks 2 --node-ranks 1");
  ASSERT_EQ(apart.code, 0) << apart.out;
  const double t1 = PredictedStep(one.out), t2 = PredictedStep(two.out), ta = PredictedStep(apart.out);
  printf("predicted s/step: one process %.4g, a rank of 2 on one machine %.4g (%.2fx), of 2 apart %.4g\n", t1,
         t2, t2 / t1, ta);
  EXPECT_GE(t2, 1.6 * t1) << two.out;
  EXPECT_NEAR(ta, t1, 1e-3 * t1) << apart.out;
  EXPECT_NE(two.out.find("(a rank's 1/"), std::string::npos) << two.out;
  EXPECT_EQ(one.out.find("(a rank's 1/"), std::string::npos) << one.out;
}

}  // namespace
