// Bad input is an error, never a crash: the planner's three file readers (plan
// JSON, routing JSON, hardware-profile YAML) fed thousands of deterministic
// mutations of a valid file — bit flips, random bytes, syntax characters,
// tokens of the format, cut, duplicated and deleted runs. Each read either
// succeeds or fails with a status of its contract and a message naming the
// file; a plan that reads back schedules cleanly, and the plan reader's own
// JSON parser judges each text as jansson does. Under --config=asan (CI runs
// it) any out-of-bounds access, leak or undefined behaviour fails the test.
#include <gtest/gtest.h>
#include <jansson.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "planner/hwprofile.h"
#include "planner/plan.h"
#include "planner/plan_io.h"
#include "experts/routing.h"
#include "planner/schedule.h"
#include "src/core/core.h"
#include "src/model/params.h"
#include "src/model/program.h"
#include "tests/planner/planner_test_util.h"

namespace {

using namespace mf_pt;

std::string tmp() {
  const char *t = getenv("TEST_TMPDIR");
  return t ? t : "/tmp";
}

std::string slurp(const std::string &path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

void spit(const std::string &path, const std::string &text) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f << text;
}

// One to four edits of `s`, from `tokens` (the format's own words) and bytes.
std::string mutate(std::string s, std::mt19937_64 &rng, const std::vector<std::string> &tokens) {
  const int edits = 1 + (int)(rng() % 4);
  static const char k_syntax[] = "{}[]\",:-.0123456789eE \n\t#&*!|>'\\\x00\xff";
  for (int k = 0; k < edits; k++) {
    const size_t n = s.size(), at = n ? rng() % n : 0;
    switch (rng() % 8) {
      case 0:
        if (n) s[at] = (char)(s[at] ^ (1 << (rng() % 8)));
        break;
      case 1:
        if (n) s[at] = (char)rng();
        break;
      case 2:
        if (n) s[at] = k_syntax[rng() % (sizeof k_syntax - 1)];
        break;
      case 3:
        s.insert(at, tokens[rng() % tokens.size()]);
        break;
      case 4:
        s.resize(at);  // cut
        break;
      case 5: {  // delete a run
        const size_t len = 1 + rng() % 16;
        s.erase(at, len);
        break;
      }
      case 6: {  // duplicate a run
        const size_t len = 1 + rng() % 64;
        s.insert(at, s.substr(at, len));
        break;
      }
      default: {  // swap two runs' bytes
        if (n > 2) {
          const size_t b = rng() % n;
          std::swap(s[at], s[b]);
        }
        break;
      }
    }
  }
  return s;
}

// The reader's verdict on mutated text: OK, or one of `allowed` naming the file.
template <typename Read>
void hammer(const std::string &name, const std::string &good, const std::vector<std::string> &tokens,
            const std::vector<mf_status> &allowed, Read read, int *accepted) {
  std::mt19937_64 rng(20261121);
  const std::string path = tmp() + "/" + name;
  const int iters = 2500;
  for (int i = 0; i < iters; i++) {
    const std::string text = mutate(good, rng, tokens);
    spit(path, text);
    mf_error_clear();
    const mf_status st = read(path);
    if (st == MF_OK) {
      (*accepted)++;
      continue;
    }
    bool ok = false;
    for (mf_status a : allowed) ok = ok || st == a;
    ASSERT_TRUE(ok) << name << " iteration " << i << ": status " << mf_status_name(st) << ": "
                    << mf_last_error();
    ASSERT_NE(std::string(mf_last_error()).find(path), std::string::npos)
        << name << " iteration " << i << ": the message does not name the file: " << mf_last_error();
  }
}

class Mutation : public ::testing::Test {
 protected:
  void SetUp() override {
    spec_ = make_shape(1).spec;  // a dense layer and a shared expert
    ASSERT_EQ(mf_param_table_build(&spec_, &t_), MF_OK) << mf_last_error();
    mf_program_opts po = {2, 16, 2, 0.01, 16, 0};
    ASSERT_EQ(mf_program_build(t_, &po, &p_), MF_OK) << mf_last_error();
  }
  void TearDown() override {
    mf_program_free(p_);
    mf_param_table_free(t_);
  }
  mf_model_spec spec_;
  mf_param_table *t_ = nullptr;
  mf_program *p_ = nullptr;
};

TEST_F(Mutation, PlanFiles) {
  mf_hwprofile hw = small_profile(1);
  mf_plan *pl = nullptr;
  ASSERT_EQ(mf_plan_choose(p_, &hw, UINT64_MAX / 2, nullptr, nullptr, &pl), MF_OK) << mf_last_error();
  const std::string good_path = tmp() + "/good.plan.json";
  mf_plan_figures fig{};
  fig.arena_bytes = pl->s->arena_bytes;
  snprintf(fig.expert_gemm, sizeof fig.expert_gemm, "cpu");
  snprintf(fig.attention, sizeof fig.attention, "cpu");
  ASSERT_EQ(mf_plan_write_json(p_, pl->d, &fig, good_path.c_str()), MF_OK) << mf_last_error();
  mf_plan_free(pl);
  const std::string good = slurp(good_path);
  ASSERT_FALSE(good.empty());
  mf_decisions *d = nullptr;
  ASSERT_EQ(mf_decisions_create(p_, &d), MF_OK);
  int accepted = 0;
  hammer(
      "m.plan.json", good,
      {"\"param\"", "\"act\"", "\"grad\"", "\"stream\"", "\"recompute\"", "\"offload\"", "\"layer-major\"",
       "\"version\"", "\"optimizer\"", "\"device\"", "\"host\"", "null", "[]", "{}", "-1", "1e308",
       "18446744073709551616", "\"\\u0000\""},
      {MF_ERR_FORMAT, MF_ERR_CONFIG, MF_ERR_UNSUPPORTED, MF_ERR_IO},
      [&](const std::string &path) {
        mf_status st = mf_plan_read_json(p_, path.c_str(), d, nullptr);
        // The plan reader parses JSON itself: it must take what jansson
        // (JSON_REJECT_DUPLICATES) takes and refuse what it refuses. Not
        // compared: nesting (refused at 16 levels, jansson's limit is 2048),
        // and NUL bytes, which the reader always refuses but jansson drops
        // after a number ("[1, 2\0]" loads as [1, 2]).
        const std::string msg = st == MF_OK ? "" : mf_last_error(), text = slurp(path);
        if (msg.find("nests deeper") == std::string::npos && text.find('\0') == std::string::npos) {
          json_error_t e;
          json_t *j = json_loadb(text.data(), text.size(), JSON_REJECT_DUPLICATES, &e);
          const bool refused =
              msg.find("invalid JSON") != std::string::npos || msg.find("is empty") != std::string::npos;
          EXPECT_EQ(refused, j == nullptr)
              << "moefit: " << (msg.empty() ? "accepted" : msg) << "; jansson: " << (j ? "accepted" : e.text);
          json_decref(j);
        }
        if (st == MF_OK) {
          mf_schedule *s = nullptr;
          EXPECT_EQ(mf_schedule_build(p_, d, &s), MF_OK)
              << "a plan that reads back schedules: " << mf_last_error();
          mf_schedule_free(s);
        }
        return st;
      },
      &accepted);
  mf_decisions_free(d);
  EXPECT_GT(accepted, 0) << "some mutations (e.g. in whitespace) leave a valid plan";
}

TEST_F(Mutation, RoutingFiles) {
  std::vector<int64_t> counts((size_t)(spec_.layers * spec_.experts), 0);
  const uint64_t tokens = 100;
  // A valid spread: k distinct experts per token, so tokens * k over the experts.
  for (int64_t l = 0; l < spec_.layers; l++) {
    if (!mf_model_spec_layer_is_moe(&spec_, l)) continue;
    for (int64_t j = 0; j < (int64_t)tokens * spec_.top_k; j++)
      counts[(size_t)(l * spec_.experts + j % spec_.experts)]++;
  }
  const std::string good_path = tmp() + "/good.routing.json";
  ASSERT_EQ(mf_routing_write(good_path.c_str(), &spec_, counts.data(), tokens), MF_OK) << mf_last_error();
  const std::string good = slurp(good_path);
  int accepted = 0;
  hammer(
      "m.routing.json", good,
      {"\"counts\"", "\"tokens\"", "\"model\"", "\"moefit-routing\"", "null", "[]", "{}", "-1", "0", "1e308",
       "9223372036854775807", "[[0]]"},
      {MF_ERR_FORMAT, MF_ERR_CONFIG, MF_ERR_UNSUPPORTED, MF_ERR_IO},
      [&](const std::string &path) {
        mf_routing r;
        mf_status st = mf_routing_read(path.c_str(), &spec_, &r);
        if (st == MF_OK) {
          for (int64_t l = 0; l < r.layers; l++) {
            double sum = 0;
            for (int64_t e = 0; e < r.experts; e++) sum += r.share[l * r.experts + e];
            EXPECT_TRUE(sum == 0 || std::abs(sum - 1) < 1e-9) << "layer " << l << " shares sum to " << sum;
          }
        }
        mf_routing_free(&r);
        return st;
      },
      &accepted);
  EXPECT_GT(accepted, 0);
}

TEST_F(Mutation, HardwareProfiles) {
  mf_hwprofile hw;
  ASSERT_EQ(mf_hwprofile_load("configs/hw/h100-pcie.yaml", &hw), MF_OK) << mf_last_error();
  const std::string good_path = tmp() + "/good.hw.yaml";
  ASSERT_EQ(mf_hwprofile_save(&hw, good_path.c_str()), MF_OK) << mf_last_error();
  const std::string good = slurp(good_path);
  int accepted = 0;
  hammer(
      "m.hw.yaml", good, {"gemm:",       "attention:", "- {m: 1, n: 1, k: 1, flops: 1}",
                          "bandwidth: ", "1e400",      "-1",
                          "0",           "nan",        "&a",
                          "*a",          "<<: *a",     "!!str",
                          "? ",          "---\n",      "...\n",
                          "  ",          "\n  - ",     "{",
                          "}",           "[",          "]"},
      {MF_ERR_FORMAT, MF_ERR_CONFIG, MF_ERR_UNSUPPORTED, MF_ERR_IO},
      [&](const std::string &path) {
        mf_hwprofile out;
        mf_status st = mf_hwprofile_load(path.c_str(), &out);
        if (st == MF_OK) {
          EXPECT_EQ(mf_hwprofile_validate(&out), MF_OK) << mf_last_error();
        }
        return st;
      },
      &accepted);
  EXPECT_GT(accepted, 0);
}

}  // namespace
