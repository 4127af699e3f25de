// Helpers of the checkpoint tests: a small model's config and state, a
// checkpoint of it written through the C API, files read and written whole,
// and a manifest edited the way a buggy writer would leave it (its entries
// and its seal made to agree with files changed after it).
#ifndef MF_TESTS_CKPT_UTIL_H
#define MF_TESTS_CKPT_UTIL_H

#include <gtest/gtest.h>
#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "src/ckpt/ckpt.h"
#include "src/config/config.h"
#include "src/core/core.h"
#include "src/model/params.h"
#include "tests/core/test_dir.h"

namespace {

const char kModel[] =
    "{family: mixtral, hidden: 32, layers: 2, heads: 4, kv_heads: 2, experts: 4, top_k: 2,\n"
    "         expert_ffn: 32, vocab: 64, max_seq: 32, seed: 5}";

inline mf_config *Config(const std::string &out, const std::string &extra, const std::string &model = kModel) {
  const std::string text = "model:\n  init: " + model +
                           "\n"
                           "data: {train: x.tokens, seq_len: 16}\n"
                           "train: {micro_batch: 2, steps: 10, lr: 1e-3}\n"
                           "output: {dir: " +
                           out + ", " + extra + "}\nbackend: cpu\n";
  mf_config *cfg = nullptr;
  EXPECT_EQ(mf_config_load_string(text.c_str(), text.size(), "test.yaml", nullptr, 0, &cfg), MF_OK)
      << mf_last_error();
  return cfg;
}

inline bool Exists(const std::string &p) { return access(p.c_str(), F_OK) == 0; }

inline std::string Slurp(const std::string &path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

inline void Spit(const std::string &path, const std::string &bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f << bytes;
}

// A model's state filled with a pattern of `seed` (AdamW step counts of 0 or
// 1, as after SmallState's steps), and buffers to read into.
struct State {
  mf_param_table *t = nullptr;
  std::vector<float> w;
  std::vector<uint8_t> m, v;
  std::vector<int64_t> steps, routed;
  mf_dtype moments;

  State(const mf_config *cfg, mf_dtype mom, uint32_t seed) : moments(mom) {
    EXPECT_EQ(mf_param_table_build(&cfg->model.init, &t), MF_OK) << mf_last_error();
    const size_t n = (size_t)t->total_numel, ms = mf_dtype_size(mom);
    w.resize(n);
    m.resize(n * ms);
    v.resize(n * ms);
    steps.resize((size_t)t->n);
    routed.resize((size_t)(t->spec.layers * t->spec.experts));
    uint32_t x = seed * 2654435761u + 1;
    auto next = [&x] { return x = x * 1664525u + 1013904223u; };
    for (auto &f : w) f = (float)(int32_t)next() * 1e-9f;
    for (auto &b : m) b = (uint8_t)(next() >> 24);
    for (auto &b : v) b = (uint8_t)(next() >> 24);
    for (auto &s : steps) s = (next() >> 16) % 2;
    for (auto &r : routed) r = next() % 1000;
  }
  ~State() { mf_param_table_free(t); }
  State(const State &) = delete;
  State &operator=(const State &) = delete;
  mf_ckpt_data Data() {
    return mf_ckpt_data{t, w.data(), m.data(), v.data(), moments, steps.data(), routed.data(), routed.size()};
  }
};

inline mf_ckpt_state SmallState(int64_t step) {
  mf_ckpt_state s;
  memset(&s, 0, sizeof s);
  s.step = step;
  s.skipped = step > 1 ? 1 : 0;
  s.first_loss = 4.125;
  s.lr = 1e-3;
  s.train_steps = step > 10 ? step : 10;
  s.data_epoch = 2;
  s.data_index = 17;
  s.data_seed = 9;
  s.data_windows = 123;
  s.ranks = 1;
  return s;
}

inline std::string StepDir(const std::string &out, int64_t step) {
  char b[64];
  snprintf(b, sizeof b, "/checkpoints/step-%06lld", (long long)step);
  return out + b;
}

// Writes checkpoint `step` of `st` (with base.json when base_json) under cfg's output.dir.
inline std::string Write(const mf_config *cfg, State &st, int64_t step, mf_ckpt_stats *stats = nullptr,
                         const char *base_json = nullptr) {
  mf_ckpt_writer *w = nullptr;
  EXPECT_EQ(mf_ckpt_writer_create(cfg, &w), MF_OK) << mf_last_error();
  mf_ckpt_data d = st.Data();
  d.base_json = base_json;
  mf_ckpt_state s = SmallState(step);
  mf_ckpt_stats local;
  EXPECT_EQ(mf_ckpt_write(w, &d, &s, stats ? stats : &local), MF_OK) << mf_last_error();
  mf_ckpt_writer_free(w);
  return StepDir(cfg->output.dir, step);
}

// The file at path with the first `from` replaced by `to` (which must be there).
inline void Edit(const std::string &path, const std::string &from, const std::string &to) {
  std::string t = Slurp(path);
  const size_t at = t.find(from);
  ASSERT_NE(at, std::string::npos) << from << " in " << path << ":\n" << t;
  t.replace(at, from.size(), to);
  Spit(path, t);
}

inline std::string Hex16(uint64_t h) {
  char b[17];
  snprintf(b, sizeof b, "%016llx", (unsigned long long)h);
  return b;
}

// The manifest's text with its seal line (when it has one) made again for
// what is above it.
inline std::string Seal(const std::string &manifest) {
  const size_t at = manifest.find("  \"manifest_hash\": \"");
  if (at == std::string::npos) return manifest;
  const std::string body = manifest.substr(0, at);
  return body + "  \"manifest_hash\": \"" + Hex16(mf_ckpt_hash64(body.data(), body.size())) + "\"\n}\n";
}

// dir/manifest.json's entry of `name` made to agree with the file as it now
// is (its bytes and hash; raw_bytes and raw_hash too for a file stored without
// compression), and the manifest sealed again: what a writer that lost track
// of its files would leave. Nothing changes when the manifest lists no such file.
inline void Reseal(const std::string &dir, const std::string &name) {
  const std::string file = Slurp(dir + "/" + name);
  const std::string h = Hex16(mf_ckpt_hash64(file.data(), file.size())), n = std::to_string(file.size());
  std::string text = Slurp(dir + "/manifest.json");
  const size_t at = text.find("{\"name\": \"" + name + "\"");
  if (at == std::string::npos) return;
  const size_t end = text.find('}', at);
  std::string line = text.substr(at, end - at);
  const bool plain = line.find("\"compression\": \"none\"") != std::string::npos;
  line = std::regex_replace(line, std::regex("\"bytes\": [0-9]+"), "\"bytes\": " + n);
  line = std::regex_replace(line, std::regex("\"hash\": \"[0-9a-f]+\""), "\"hash\": \"" + h + "\"");
  if (plain) {
    line = std::regex_replace(line, std::regex("\"raw_bytes\": [0-9]+"), "\"raw_bytes\": " + n);
    line = std::regex_replace(line, std::regex("\"raw_hash\": \"[0-9a-f]+\""), "\"raw_hash\": \"" + h + "\"");
  }
  text.replace(at, end - at, line);
  Spit(dir + "/manifest.json", Seal(text));
}

// A directory's files by name, read and written whole (no subdirectories).
using Files = std::map<std::string, std::string>;

inline std::vector<std::string> ListDir(const std::string &dir) {
  std::vector<std::string> names;
  DIR *d = opendir(dir.c_str());
  for (struct dirent *e; d && (e = readdir(d)) != nullptr;)
    if (e->d_name[0] != '.') names.push_back(e->d_name);
  if (d) closedir(d);
  return names;
}

inline Files ReadDir(const std::string &dir) {
  Files f;
  for (const std::string &name : ListDir(dir)) f[name] = Slurp(dir + "/" + name);
  return f;
}

// dir holding exactly `files` (a checkpoint holds no subdirectories).
inline void WriteDir(const std::string &dir, const Files &files) {
  mkdir(dir.c_str(), 0755);
  for (const std::string &name : ListDir(dir))
    if (!files.count(name)) unlink((dir + "/" + name).c_str());
  for (const auto &kv : files) Spit(dir + "/" + kv.first, kv.second);
}

inline bool Has(const std::string &s, const std::string &part) { return s.find(part) != std::string::npos; }

}  // namespace

#endif  // MF_TESTS_CKPT_UTIL_H
