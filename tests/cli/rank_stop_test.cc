// issue 28: no rank can hang an mpirun job. A rank of `mpirun -np 2 moefit
// train` stopped by SIGSTOP (a stuck machine, a process swapped out: stopped,
// not killed, so MPI sees nothing wrong) — the last rank, which used to keep
// rank 0 spinning in the node's barrier for ever, or rank 0 — ends the job
// within MF_COMM_TIMEOUT_S plus 5 s: the rank that waited names the stopped
// one (rank, pid, "stopped by a signal") and the seconds it waited, mpirun
// exits non-zero, and no process of the run is left.
//
// mpirun as in tests/cli/ranks_test.cc: as the test's user (root in CI:
// OMPI_ALLOW_RUN_AS_ROOT), --oversubscribe, the shared-memory transport in
// this test's TEST_TMPDIR.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/time.h>

#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "cli_util.h"

namespace {

// Long enough for rank 0 to plan alone under ASan on a loaded machine while
// the others wait (their wait has the deadline too), short for a test.
const int kTimeoutS = 5;

double Now() {
  struct timeval tv;
  gettimeofday(&tv, nullptr);
  return tv.tv_sec + tv.tv_usec * 1e-6;
}

std::string Corpus() {
  return text_tokens("rank_stop_corpus", 60000);
}

// `mpirun -np 2 ./moefit train ...` (the demo shortened, 2000 steps: it runs
// until a rank stops), as a command for Background.
std::string JobCommand(const std::string &out) {
  const std::string vader = tmpdir() + "/vader";
  shell("mkdir -p " + vader);
  // Under ASan: Open MPI keeps allocations until exit; tests/lsan.supp names
  // its libraries, which match only with full stacks and its plugins still
  // loaded at exit.
  return "exec env LSAN_OPTIONS=\"$LSAN_OPTIONS${LSAN_OPTIONS:+:}fast_unwind_on_malloc=0\" "
         "OMPI_MCA_mca_base_component_disable_dlclose=1 OMPI_ALLOW_RUN_AS_ROOT=1 "
         "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 "
         "TMPDIR=" +
         tmpdir() +
         " mpirun -np 2 --oversubscribe --mca pml ob1 --mca btl self,vader --mca "
         "btl_vader_single_copy_mechanism "
         "none --mca btl_vader_backing_directory " +
         vader + " -x LSAN_OPTIONS -x OMPI_MCA_mca_base_component_disable_dlclose -x MF_COMM_TIMEOUT_S=" +
         std::to_string(kTimeoutS) +
         " ./moefit train configs/demo.yaml hardware.profile=configs/hw/cpu-2core.yaml data.valid=null "
         "data.seq_len=32 train.micro_batch=2 train.warmup=2 train.log_every=1 train.steps=2000 data.train=" +
         Corpus() + " output.dir=" + out;
}

// The processes of the run whose output dir is `out` (its ranks).
std::vector<pid_t> RunPids(const std::string &out) {
  std::vector<pid_t> pids;
  std::istringstream in(shell("pgrep -f 'output.dir=" + out + "( |$)' || true").out);
  for (long p; in >> p;) pids.push_back((pid_t)p);
  return pids;
}

// The world rank of process pid, from its environment (OMPI_COMM_WORLD_RANK), or -1.
int WorldRank(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/environ", std::ios::binary);
  std::string var;
  while (std::getline(f, var, '\0'))
    if (var.rfind("OMPI_COMM_WORLD_RANK=", 0) == 0) return std::stoi(var.substr(21));
  return -1;
}

// Continues and kills what is left of the run (the test's cleanup, also when
// it failed).
void KillStragglers(const std::string &out) {
  for (pid_t p : RunPids(out)) {
    kill(p, SIGCONT);
    kill(p, SIGKILL);
  }
}

// Stops rank `stopped` of a running job after its third step; the job must
// end by itself within the timeout plus 5 s, the other rank naming it.
void StopOneRank(int stopped) {
  const std::string out = fresh_dir("stop" + std::to_string(stopped));
  Background job(JobCommand(out));
  struct Cleanup {
    std::string out;
    ~Cleanup() { KillStragglers(out); }
  } cleanup{out};
  ASSERT_TRUE(job.WaitFor(std::regex("\nstep +3/"))) << job.out();
  pid_t pid = -1;
  for (pid_t p : RunPids(out))
    if (WorldRank(p) == stopped) pid = p;
  ASSERT_GT(pid, 0) << "no process of rank " << stopped << " in " << shell("ps -ef").out;
  ASSERT_EQ(kill(pid, SIGSTOP), 0);
  const double t0 = Now();
  // Reads until the output ends (mpirun and the ranks are gone) or the bound
  // passes ("a^" never matches).
  const double bound = kTimeoutS + 5;
  job.WaitFor(std::regex("a^"), 0, bound + 1);
  const double took = Now() - t0;
  printf("rank %d stopped: the job ended %.1f s later (MF_COMM_TIMEOUT_S=%d)\n", stopped, took, kTimeoutS);
  if (took > bound) {
    ADD_FAILURE() << "the job was still running " << took << " s after rank " << stopped << " stopped\n"
                  << job.out();
    KillStragglers(out);
  }
  EXPECT_NE(job.Finish(), 0) << job.out();
  // Nothing of the run left once mpirun has gone.
  EXPECT_TRUE(RunPids(out).empty()) << "left running: "
                                    << shell("pgrep -af 'output.dir=" + out + "( |$)'").out;
  const int waiter = 1 - stopped;
  const std::string said = "moefit train: rank " + std::to_string(waiter) + " of 2: error: comm: waited " +
                           std::to_string(kTimeoutS) + " s for rank " + std::to_string(stopped) +
                           " (local rank " + std::to_string(stopped) + ", pid " + std::to_string(pid) +
                           ", stopped by a signal) ";
  EXPECT_NE(job.out().find(said), std::string::npos) << "no line starting '" << said << "'\n" << job.out();
  EXPECT_NE(job.out().find(": it stopped or hangs (MF_COMM_TIMEOUT_S)"), std::string::npos) << job.out();
}

// The last rank stopped: rank 0 waited for it in the node's barrier (or a
// collective) without end.
TEST(RankStop, AStoppedLastRankEndsTheJob) {
  StopOneRank(1);
}

// Rank 0 stopped: the last rank waits for it in the relay or a collective.
TEST(RankStop, AStoppedRank0EndsTheJob) {
  StopOneRank(0);
}

}  // namespace
