// Issue 27 item 2 under mpirun: a rank-0 failure after a checkpoint prints
// the command that continues the run, mpirun's own words included (read from
// the parent process, the mpirun that started the ranks); typed as printed,
// it resumes the run on the same ranks.
//
// mpirun as in ranks_test: the test's user (root in CI), --oversubscribe, the
// shared-memory transport confined to this test's TEST_TMPDIR.
#include <gtest/gtest.h>

#include <string>

#include "tests/cli/cli_util.h"

namespace {

std::string After(const std::string &text, const std::string &lead) {
  const size_t at = text.find(lead);
  if (at == std::string::npos) return "";
  const size_t from = at + lead.size();
  return text.substr(from, text.find('\n', from) - from);
}

TEST(ResumeHintMpi, RepeatsTheMpirunCommandLine) {
  const std::string vader = tmpdir() + "/vader", out = fresh_dir("mpi_run");
  shell("mkdir -p " + vader);
  const std::string env = "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 TMPDIR=" + tmpdir() +
                          " OMPI_MCA_mca_base_component_disable_dlclose=1 "
                          "LSAN_OPTIONS=\"$LSAN_OPTIONS${LSAN_OPTIONS:+:}fast_unwind_on_malloc=0\" ";
  const std::string mpirun =
      "mpirun -np 2 --oversubscribe --mca pml ob1 --mca btl self,vader --mca btl_vader_single_copy_mechanism "
      "none "
      "--mca btl_vader_backing_directory " +
      vader + " -x LSAN_OPTIONS -x OMPI_MCA_mca_base_component_disable_dlclose";
  const std::string args =
      "train configs/demo.yaml hardware.profile=configs/hw/cpu-2core.yaml data.valid=null data.seq_len=32 "
      "train.micro_batch=2 train.warmup=1 train.steps=6 output.checkpoint_every=2 "
      "output.checkpoint_async=false "
      "data.train=" +
      text_tokens("mpi_hint_corpus", 30000) + " output.dir=" + out;
  // The failure asked for through the environment (mpirun's local ranks inherit it), not the command line;
  // a test-only hook, which the test build moefit_test reads.
  Result failed = shell("MF_INJECT_FAIL=0:4 " + env + mpirun + " ./moefit_test " + args + " 2>&1");
  ASSERT_NE(failed.code, 0) << failed.out;
  const std::string hint = After(failed.out, "\nresume with: ");
  EXPECT_EQ(hint, mpirun + " ./moefit_test " + args + " --resume") << failed.out;
  // As printed (with the environment the test needs for mpirun), on the same ranks.
  Result resumed = shell(env + hint + " 2>&1");
  ASSERT_EQ(resumed.code, 0) << resumed.out;
  EXPECT_NE(resumed.out.find("resumed from " + out + "/checkpoints/step-000002 (step 2)"), std::string::npos)
      << resumed.out;
  EXPECT_NE(resumed.out.find("\ndone: 4 steps (3-6) in "), std::string::npos) << resumed.out;
}

}  // namespace
