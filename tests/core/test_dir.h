// A fresh directory under TEST_TMPDIR for the running test (the core tests
// that touch files share it).
#ifndef MF_TESTS_CORE_TEST_DIR_H
#define MF_TESTS_CORE_TEST_DIR_H

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstdlib>
#include <string>

// TEST_TMPDIR/<suite>.<test>, created when missing.
inline std::string TestDir() {
  const char *base = std::getenv("TEST_TMPDIR");
  const ::testing::TestInfo *info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::string dir = std::string(base ? base : "/tmp") + "/" + info->test_suite_name() + "." + info->name();
  mkdir(dir.c_str(), 0755);
  return dir;
}

#endif  // MF_TESTS_CORE_TEST_DIR_H
