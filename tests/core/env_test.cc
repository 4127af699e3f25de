// The environment table (src/core/env.h):
//  - no library source but src/core/env.c calls getenv for an MF_ variable
//    (every getenv elsewhere takes a string literal that is not MF_...), and
//    docs/cli.md's Environment section names exactly the table's variables;
//  - a value is read once: a setenv after it changes nothing until
//    mf_env_reload;
//  - a value a variable does not take is ignored with one warning (two
//    variables refuse it where used instead);
//  - this test is a test build: the test-only hooks are read.
#include <dirent.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "src/core/core.h"
#include "src/core/env.h"

namespace {

std::string read_file(const std::string &path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

// Every C, C++ and CUDA source under `dir` of the runfiles tree (the test's data).
void walk(const std::string &dir, std::vector<std::string> *out) {
  static const std::regex source(R"(.*\.(c|h|cc|cu|cuh)$)");
  DIR *d = opendir(dir.c_str());
  if (!d) return;
  while (struct dirent *e = readdir(d)) {
    const std::string name = e->d_name;
    if (name == "." || name == "..") continue;
    const std::string path = dir + "/" + name;
    struct stat st;
    if (stat(path.c_str(), &st) != 0) continue;
    if (S_ISDIR(st.st_mode))
      walk(path, out);
    else if (std::regex_match(name, source))
      out->push_back(path);
  }
  closedir(d);
}

// The library's folders (their `sources` filegroups are this test's data).
const char *const kLibrary[] = {"comm", "experts", "kernels", "planner", "src"};

TEST(Env, OnlyEnvReadsMfVariables) {
  std::vector<std::string> files;
  for (const char *dir : kLibrary) walk(dir, &files);
  std::set<std::string> seen(files.begin(), files.end());
  for (const char *must : {"src/core/env.c", "planner/choose.c", "kernels/cuda/backend_cuda.cu",
                           "comm/comm_mpi.c", "src/train/train.c", "src/ckpt/write.c", "src/core/log.c"})
    ASSERT_TRUE(seen.count(must)) << must << " is not in the test's data";
  // getenv / secure_getenv and what it is given up to the first ')' or ','.
  static const std::regex call(R"(\b(secure_)?getenv\s*\(\s*([^),]*))");
  static const std::regex foreign_literal(R"(^"(?!MF_)[A-Za-z0-9_]+"\s*$)");
  int calls = 0;
  for (const std::string &f : files) {
    if (f == "src/core/env.c") continue;
    const std::string text = read_file(f);
    for (std::sregex_iterator it(text.begin(), text.end(), call), end; it != end; ++it) {
      calls++;
      const std::string arg = (*it)[2];
      const size_t line = 1 + std::count(text.begin(), text.begin() + it->position(), '\n');
      EXPECT_TRUE(std::regex_match(arg, foreign_literal))
          << f << ":" << line << ": getenv(" << arg
          << "): an MF_ variable (or a name not written out) read outside src/core/env.c; add it to its "
             "table";
    }
  }
  EXPECT_GT(calls, 0) << "the BUILD_WORKING_DIRECTORY and OMPI_ reads were not seen: is the scan blind?";
}

// The MF_ names of docs/cli.md's "## Environment" section.
std::set<std::string> documented() {
  const std::string doc = read_file("docs/cli.md");
  const size_t from = doc.find("\n## Environment\n");
  EXPECT_NE(from, std::string::npos) << "docs/cli.md has no Environment section";
  if (from == std::string::npos) return {};
  const size_t to = doc.find("\n## ", from + 1);
  const std::string section = doc.substr(from, to == std::string::npos ? std::string::npos : to - from);
  static const std::regex name(R"(\bMF_[A-Z0-9_]*[A-Z0-9])");
  std::set<std::string> names;
  for (std::sregex_iterator it(section.begin(), section.end(), name), end; it != end; ++it)
    names.insert(it->str());
  return names;
}

TEST(Env, TheDocsNameEveryVariableOfTheTable) {
  std::set<std::string> table;
  for (int i = 0; i < MF_ENV_COUNT_; i++) {
    const mf_env_var *v = mf_env_var_of(i);
    ASSERT_NE(v, nullptr) << i;
    EXPECT_TRUE(v->takes && *v->takes && v->does && *v->does) << v->name;
    const std::string n = v->name;
    EXPECT_EQ(v->test_only != 0, n == "MF_INJECT_FAIL" || n.rfind("MF_TEST_", 0) == 0) << n;
    table.insert(n);
  }
  EXPECT_EQ(mf_env_var_of(MF_ENV_COUNT_), nullptr);
  EXPECT_EQ(mf_env_var_of(-1), nullptr);
  EXPECT_EQ(table.size(), static_cast<size_t>(MF_ENV_COUNT_)) << "a name twice in the table";
  const std::set<std::string> docs = documented();
  for (const std::string &n : table)
    EXPECT_TRUE(docs.count(n)) << n << " is not in docs/cli.md's Environment";
  for (const std::string &n : docs) EXPECT_TRUE(table.count(n)) << n << " (docs/cli.md) is not in the table";
}

// The log of `fn` at debug level.
template <class Fn>
std::string logged(Fn fn) {
  FILE *f = tmpfile();
  mf_log_set_level(MF_LOG_DEBUG);
  mf_log_set_stream(f);
  fn();
  mf_log_set_stream(nullptr);
  mf_log_set_level(MF_LOG_INFO);
  std::string out;
  rewind(f);
  char buf[512];
  while (fgets(buf, sizeof buf, f)) out += buf;
  fclose(f);
  return out;
}

size_t count(const std::string &text, const std::string &part) {
  size_t n = 0;
  for (size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) n++;
  return n;
}

TEST(Env, AValueIsReadOnce) {
  setenv("MF_PLAN_SCORING", "proxy", 1);
  setenv("MF_THREADS", "3", 1);
  const std::string log = logged([] { mf_env_reload(); });
  EXPECT_TRUE(log.find("[debug env] MF_PLAN_SCORING=proxy\n") != std::string::npos) << log;
  EXPECT_TRUE(log.find("[debug env] MF_THREADS=3\n") != std::string::npos) << log;
  EXPECT_STREQ(mf_env_string(MF_ENV_PLAN_SCORING), "proxy");
  setenv("MF_PLAN_SCORING", "exact", 1);
  setenv("MF_THREADS", "5", 1);
  double v = 0;
  EXPECT_STREQ(mf_env_string(MF_ENV_PLAN_SCORING), "proxy");
  EXPECT_TRUE(mf_env_number(MF_ENV_THREADS, &v));
  EXPECT_EQ(v, 3);
  unsetenv("MF_PLAN_SCORING");
  unsetenv("MF_THREADS");
  EXPECT_STREQ(mf_env_string(MF_ENV_PLAN_SCORING), "proxy");
  // Read again: unset now.
  mf_env_reload();
  EXPECT_EQ(mf_env_string(MF_ENV_PLAN_SCORING), nullptr);
  v = -1;
  EXPECT_FALSE(mf_env_number(MF_ENV_THREADS, &v));
  EXPECT_EQ(v, -1) << "untouched when unset";
}

TEST(Env, ABadValueIsIgnoredWithOneWarning) {
  setenv("MF_THREADS", "abc", 1);
  setenv("MF_ATTENTION", "flash", 1);
  setenv("MF_COMM_TIMEOUT_S", "0", 1);  // above 0
  setenv("MF_PROGRESS_EVERY", "inf", 1);
  setenv("MF_HOST_MEMORY", "lots", 1);  // an error where used, not a warning
  double v = 7;
  uint64_t b = 7;
  const std::string log = logged([&] {
    mf_env_reload();
    EXPECT_FALSE(mf_env_number(MF_ENV_THREADS, &v));
    EXPECT_EQ(mf_env_string(MF_ENV_ATTENTION), nullptr);
    EXPECT_FALSE(mf_env_number(MF_ENV_COMM_TIMEOUT_S, &v));
    EXPECT_FALSE(mf_env_number(MF_ENV_PROGRESS_EVERY, &v));
    EXPECT_FALSE(mf_env_bytes(MF_ENV_HOST_MEMORY, &b));
  });
  EXPECT_EQ(v, 7);
  EXPECT_EQ(b, 7u);
  EXPECT_EQ(count(log,
                  "[warn env] MF_THREADS='abc' is not a number of threads (a whole number from 1 to 1024): "
                  "using the machine's online CPUs\n"),
            1u)
      << log;
  EXPECT_EQ(count(log, "[warn env] MF_ATTENTION='flash' is not one of mma|cudnn: ignored\n"), 1u) << log;
  EXPECT_EQ(
      count(log, "[warn env] MF_COMM_TIMEOUT_S='0' is not a number of seconds above 0: waiting 600 s\n"), 1u)
      << log;
  EXPECT_EQ(count(log, "[warn env] MF_PROGRESS_EVERY='inf' is not a number of seconds >= 0: using 2\n"), 1u)
      << log;
  EXPECT_EQ(count(log, "[warn env] MF_HOST_MEMORY"), 0u) << log;
  EXPECT_EQ(mf_env_check(MF_ENV_THREADS), MF_OK) << "warned and ignored, not an error";
  EXPECT_EQ(mf_env_check(MF_ENV_HOST_MEMORY), MF_ERR_CONFIG);
  EXPECT_NE(strstr(mf_last_error(), "MF_HOST_MEMORY='lots' is not a size above 0 such as 64GiB"), nullptr)
      << mf_last_error();
  // Asked again: no second warning.
  const std::string again = logged([&] {
    EXPECT_FALSE(mf_env_number(MF_ENV_THREADS, &v));
    EXPECT_EQ(mf_env_string(MF_ENV_ATTENTION), nullptr);
  });
  EXPECT_EQ(again, "");
  for (const char *n :
       {"MF_THREADS", "MF_ATTENTION", "MF_COMM_TIMEOUT_S", "MF_PROGRESS_EVERY", "MF_HOST_MEMORY"})
    unsetenv(n);
  mf_env_reload();
}

TEST(Env, TheKindsOfValue) {
  setenv("MF_LOG_SUBSYS", "io,config", 1);
  setenv("MF_HOST_MEMORY", "1.5GiB", 1);
  setenv("MF_COMM_TIMEOUT_S", "0.25", 1);
  setenv("MF_EXPERT_GEMM", "cutlass", 1);
  setenv("MF_CPU_SIMD", "BASE", 1);  // words are exact but for MF_LOG's
  mf_env_reload();
  EXPECT_STREQ(mf_env_string(MF_ENV_LOG_SUBSYS), "io,config");
  uint64_t b = 0;
  EXPECT_TRUE(mf_env_bytes(MF_ENV_HOST_MEMORY, &b));
  EXPECT_EQ(b, 3ull << 29);
  EXPECT_EQ(mf_env_check(MF_ENV_HOST_MEMORY), MF_OK);
  double v = 0;
  EXPECT_TRUE(mf_env_number(MF_ENV_COMM_TIMEOUT_S, &v));
  EXPECT_EQ(v, 0.25);
  EXPECT_STREQ(mf_env_string(MF_ENV_COMM_TIMEOUT_S), "0.25");
  EXPECT_STREQ(mf_env_string(MF_ENV_EXPERT_GEMM), "cutlass");
  EXPECT_EQ(mf_env_string(MF_ENV_CPU_SIMD), nullptr);
  for (const char *n :
       {"MF_LOG_SUBSYS", "MF_HOST_MEMORY", "MF_COMM_TIMEOUT_S", "MF_EXPERT_GEMM", "MF_CPU_SIMD"})
    unsetenv(n);
  mf_env_reload();
}

TEST(Env, TestOnlyHooksAreReadInATestBuild) {
  EXPECT_EQ(mf_env_test_build(), 1) << "//src/core:test_build is linked into every mf_test";
  setenv("MF_INJECT_FAIL", "1:3", 1);
  setenv("MF_TEST_CKPT_PAUSE_MS", "150", 1);
  setenv("MF_TEST_SHM_FREE", "1048576", 1);
  const std::string log = logged([] { mf_env_reload(); });
  int64_t at[2] = {0, 0};
  EXPECT_TRUE(mf_env_pair(MF_ENV_INJECT_FAIL, at));
  EXPECT_EQ(at[0], 1);
  EXPECT_EQ(at[1], 3);
  double ms = 0;
  EXPECT_TRUE(mf_env_number(MF_ENV_TEST_CKPT_PAUSE_MS, &ms));
  EXPECT_EQ(ms, 150);
  uint64_t b = 0;
  EXPECT_TRUE(mf_env_bytes(MF_ENV_TEST_SHM_FREE, &b));
  EXPECT_EQ(b, 1048576u);
  EXPECT_EQ(count(log, "[warn env] MF_INJECT_FAIL=1:3: a test-only hook is on\n"), 1u) << log;
  EXPECT_EQ(count(log, "[warn env] MF_TEST_CKPT_PAUSE_MS=150: a test-only hook is on\n"), 1u) << log;
  EXPECT_EQ(count(log, "not a test build"), 0u) << log;
  setenv("MF_INJECT_FAIL", "1:x", 1);
  const std::string bad = logged([] { mf_env_reload(); });
  EXPECT_FALSE(mf_env_pair(MF_ENV_INJECT_FAIL, at));
  EXPECT_EQ(count(bad, "[warn env] MF_INJECT_FAIL='1:x' is not RANK:STEP (two whole numbers): ignored\n"), 1u)
      << bad;
  for (const char *n : {"MF_INJECT_FAIL", "MF_TEST_CKPT_PAUSE_MS", "MF_TEST_SHM_FREE"}) unsetenv(n);
  mf_env_reload();
}

}  // namespace
