// Helpers of the training tests of tests/exec: the test's temporary dir, a
// file read whole, a config from text with overrides, and a token file of short English phrases over a 64-token
// vocabulary (something a tiny model learns, and every test shape's vocab).
#ifndef MF_TESTS_EXEC_PHRASES_H
#define MF_TESTS_EXEC_PHRASES_H

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "src/config/config.h"
#include "src/core/core.h"
#include "src/io/tokens.h"

namespace {

inline std::string tmp() {
  const char *t = getenv("TEST_TMPDIR");
  return t ? t : "/tmp";
}

inline std::string slurp(const std::string &path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

// TMP/name: `n` phrases drawn by a linear congruential generator from `seed`.
inline std::string phrase_tokens(const std::string &name, int n, uint32_t seed) {
  const std::string path = tmp() + "/" + name;
  mf_tokens_writer *w = nullptr;
  EXPECT_EQ(mf_tokens_writer_create(path.c_str(), 64, 2, 0, &w), MF_OK) << mf_last_error();
  const char *phrases[] = {"the cat sat on the mat. ", "a dog ran in the park. ", "birds sing at dawn. "};
  for (int i = 0; i < n; i++) {
    seed = seed * 1103515245u + 12345u;
    std::vector<uint32_t> ids;
    for (const char *c = phrases[(seed >> 16) % 3]; *c; c++) ids.push_back((uint32_t)(*c) % 64);
    EXPECT_EQ(mf_tokens_writer_append(w, ids.data(), nullptr, ids.size()), MF_OK);
  }
  EXPECT_EQ(mf_tokens_writer_end_document(w), MF_OK);
  EXPECT_EQ(mf_tokens_writer_finish(w), MF_OK) << mf_last_error();
  mf_tokens_writer_free(w);
  return path;
}

// The config of `yaml` (named `name` in messages) with the overrides `ov`
// then `extra`, in order; NULL (a failed expectation) when it does not load.
inline mf_config *load_config(const char *yaml, const char *name, std::vector<std::string> ov,
                              const std::vector<std::string> &extra) {
  ov.insert(ov.end(), extra.begin(), extra.end());
  std::vector<const char *> p;
  for (const auto &o : ov) p.push_back(o.c_str());
  mf_config *cfg = nullptr;
  EXPECT_EQ(mf_config_load_string(yaml, strlen(yaml), name, p.data(), p.size(), &cfg), MF_OK) << mf_last_error();
  return cfg;
}

}  // namespace

#endif  // MF_TESTS_EXEC_PHRASES_H
