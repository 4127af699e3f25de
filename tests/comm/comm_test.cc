// comm/ over MPI with two ranks. Started by Bazel as one process, the test
// re-launches itself under mpirun (own TMPDIR and shared-memory directory, so
// concurrent tests do not collide); rank 0 alone writes the XML results and the
// exit status is the worst of both ranks.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "comm/comm.h"
#include "src/core/core.h"

namespace {

mf_comm *g_comm = nullptr;

TEST(Comm, WorldHasTwoRanks) {
  EXPECT_EQ(mf_comm_size(g_comm), 2);
  EXPECT_TRUE(mf_comm_uses_mpi(g_comm));
  EXPECT_EQ(mf_comm_local_size(g_comm), 2);
  EXPECT_EQ(mf_comm_local_rank(g_comm), mf_comm_rank(g_comm));
}

TEST(Comm, BroadcastFromEitherRoot) {
  for (int root = 0; root < 2; root++) {
    std::vector<int> v(1000, mf_comm_rank(g_comm) == root ? 7 + root : -1);
    ASSERT_EQ(mf_comm_broadcast(g_comm, v.data(), v.size() * sizeof(int), root), MF_OK) << mf_last_error();
    for (int x : v) ASSERT_EQ(x, 7 + root);
  }
  int x = 0;
  EXPECT_EQ(mf_comm_broadcast(g_comm, &x, sizeof x, 5), MF_ERR_INVALID_ARG);
}

TEST(Comm, AllreduceSumIsRankOrderedAndIdentical) {
  const int r = mf_comm_rank(g_comm);
  const size_t n = 100001;
  std::vector<float> v(n);
  for (size_t i = 0; i < n; i++) v[i] = (r == 0 ? 1e8f : 1.0f) * (float)((i % 13) + 1) + (r == 0 ? 0.0f : 0.3f);
  std::vector<float> want(n);
  for (size_t i = 0; i < n; i++) {
    float a = 1e8f * (float)((i % 13) + 1), b = 1.0f * (float)((i % 13) + 1) + 0.3f;
    want[i] = a + b;  // rank 0's value first, then rank 1's
  }
  ASSERT_EQ(mf_comm_allreduce_sum_f32(g_comm, v.data(), n), MF_OK) << mf_last_error();
  EXPECT_EQ(memcmp(v.data(), want.data(), n * sizeof(float)), 0);
}

TEST(Comm, AllreduceMax) {
  int64_t v[3] = {mf_comm_rank(g_comm), -mf_comm_rank(g_comm), 5};
  ASSERT_EQ(mf_comm_allreduce_max_i64(g_comm, v, 3), MF_OK);
  EXPECT_EQ(v[0], 1);
  EXPECT_EQ(v[1], 0);
  EXPECT_EQ(v[2], 5);
  EXPECT_EQ(mf_comm_barrier(g_comm), MF_OK);
}

int relaunch_under_mpirun(int argc, char **argv) {
  char self[4096];
  ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0) return 1;
  self[n] = 0;
  char tmpl[] = "/tmp/mpitest.XXXXXX";
  if (!mkdtemp(tmpl)) return 1;
  setenv("TMPDIR", tmpl, 1);
  // Open MPI's own allocations live until exit; tests/lsan.supp names its
  // libraries, which only matches with full (slow) stacks: MPI tests alone.
  const char *lsan = getenv("LSAN_OPTIONS");
  std::string lsan_opts = std::string(lsan ? lsan : "") + (lsan && *lsan ? ":" : "") + "fast_unwind_on_malloc=0";
  setenv("LSAN_OPTIONS", lsan_opts.c_str(), 1);
  setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1);
  setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
  std::vector<std::string> args = {"mpirun", "-np", "2", "--oversubscribe",
                                   "--mca", "pml", "ob1", "--mca", "btl", "self,vader",
                                   "--mca", "btl_vader_single_copy_mechanism", "none",
                                   "--mca", "btl_vader_backing_directory", tmpl, self};
  for (int i = 1; i < argc; i++) args.push_back(argv[i]);
  pid_t pid = fork();
  if (pid == 0) {
    std::vector<char *> cargv;
    for (auto &a : args) cargv.push_back(a.data());
    cargv.push_back(nullptr);
    execvp("mpirun", cargv.data());
    perror("execvp mpirun");
    _exit(127);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  std::string rm = std::string("rm -rf ") + tmpl;
  if (system(rm.c_str()) != 0) fprintf(stderr, "could not remove %s\n", tmpl);
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  fprintf(stderr, "mpirun ended by signal %d\n", WTERMSIG(status));
  return 1;
}

}  // namespace

int main(int argc, char **argv) {
  if (!getenv("OMPI_COMM_WORLD_SIZE")) return relaunch_under_mpirun(argc, argv);
  if (mf_comm_init(&argc, &argv, &g_comm) != MF_OK) {
    fprintf(stderr, "comm init: %s\n", mf_last_error());
    return 1;
  }
  if (mf_comm_rank(g_comm) != 0) {
    unsetenv("XML_OUTPUT_FILE");
    unsetenv("GTEST_OUTPUT");
    unsetenv("TEST_PREMATURE_EXIT_FILE");
    unsetenv("TEST_SHARD_STATUS_FILE");
  }
  // gtest read XML_OUTPUT_FILE into its output flag during static
  // initialisation, and InitGoogleTest installs the XML writer from the flag:
  // clear it first on the other ranks, or they race rank 0 for Bazel's file.
  if (mf_comm_rank(g_comm) != 0) GTEST_FLAG_SET(output, "");
  ::testing::InitGoogleTest(&argc, argv);
  int64_t failed = RUN_ALL_TESTS() != 0;
  mf_comm_allreduce_max_i64(g_comm, &failed, 1);
  mf_comm_free(g_comm);
  return failed ? 1 : 0;
}
