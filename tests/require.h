// A check that needs a tool from outside the build (a python with torch and
// transformers, cuDNN's library) is skipped where the tool is missing, saying
// which: a developer's machine need not have them. CI sets MF_TEST_REQUIRE=1
// (tools/test passes it to every test): there a missing tool fails the check,
// so that a broken install cannot turn a check into a silent skip.
#ifndef MF_TESTS_REQUIRE_H
#define MF_TESTS_REQUIRE_H

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>

inline bool mf_test_tools_required() {
  const char *s = std::getenv("MF_TEST_REQUIRE");
  return s && std::strcmp(s, "1") == 0;
}

// Use as a statement in a TEST body: skips, or fails under MF_TEST_REQUIRE=1.
#define MF_TOOL_MISSING(why)                                                               \
  do {                                                                                     \
    if (mf_test_tools_required()) {                                                        \
      FAIL() << why << " (MF_TEST_REQUIRE=1: this check must run on this machine)";      \
    } else {                                                                               \
      GTEST_SKIP() << why;                                                                 \
    }                                                                                      \
  } while (0)

#endif  // MF_TESTS_REQUIRE_H
