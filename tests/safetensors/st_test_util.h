// Helpers for the safetensors tests: temp paths and raw file images.
#ifndef MF_TESTS_SAFETENSORS_ST_TEST_UTIL_H
#define MF_TESTS_SAFETENSORS_ST_TEST_UTIL_H

#include <sys/stat.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "gtest/gtest.h"

namespace st_test {

// A fresh directory under TEST_TMPDIR, named after the running test.
inline std::string TestDir() {
  const char *base = std::getenv("TEST_TMPDIR");
  std::string root = base ? base : "/tmp";
  const ::testing::TestInfo *info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::string name = std::string(info->test_suite_name()) + "." + info->name();
  for (char &c : name)
    if (c == '/') c = '_';
  std::string dir = root + "/" + name;
  mkdir(dir.c_str(), 0755);
  return dir;
}

inline void WriteFile(const std::string &path, const std::string &bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), (std::streamsize)bytes.size());
  ASSERT_TRUE(f.good()) << path;
}

inline std::string ReadFile(const std::string &path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

inline bool Exists(const std::string &path) {
  struct stat sb;
  return stat(path.c_str(), &sb) == 0;
}

inline std::string Le64(uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; i++) s[i] = (char)(v >> (8 * i));
  return s;
}

// u64 LE length | header | data.
inline std::string Image(const std::string &header, const std::string &data = "") {
  return Le64(header.size()) + header + data;
}

}  // namespace st_test

#endif  // MF_TESTS_SAFETENSORS_ST_TEST_UTIL_H
