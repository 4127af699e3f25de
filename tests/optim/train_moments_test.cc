// train.adam_moments through the training loop: bf16 moments train, change the
// result against fp32 moments (so the setting reaches the optimizer), give the
// same bits run to run, with 1 and 2 threads, and on the overlapped optimizer
// (train.overlap_optimizer) and the plain one alike.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "src/config/config.h"
#include "src/core/core.h"
#include "src/train/train.h"
#include "src/io/tokens.h"

namespace {

std::string tmp() {
  const char *t = getenv("TEST_TMPDIR");
  return t ? t : "/tmp";
}

// Three short phrases in a random order: enough structure to learn in a few steps.
std::string corpus() {
  static std::string path;
  if (!path.empty()) return path;
  path = tmp() + "/moments.tokens";
  mf_tokens_writer *w = nullptr;
  EXPECT_EQ(mf_tokens_writer_create(path.c_str(), 64, 2, 0, &w), MF_OK) << mf_last_error();
  const char *phrases[] = {"one two three four. ", "red green blue. ", "up and down again. "};
  uint32_t state = 11;
  for (int i = 0; i < 400; i++) {
    state = state * 1664525u + 1013904223u;
    std::vector<uint32_t> ids;
    for (const char *c = phrases[(state >> 20) % 3]; *c; c++) ids.push_back((uint32_t)(*c) % 64);
    EXPECT_EQ(mf_tokens_writer_append(w, ids.data(), nullptr, ids.size()), MF_OK);
  }
  EXPECT_EQ(mf_tokens_writer_end_document(w), MF_OK);
  EXPECT_EQ(mf_tokens_writer_finish(w), MF_OK) << mf_last_error();
  mf_tokens_writer_free(w);
  return path;
}

struct TrainRun {
  mf_train_summary sum{};
  std::string weights;  // final/model.safetensors
};

TrainRun train(const std::string &name, const char *moments, int threads, bool overlap) {
  std::ostringstream y;
  y << "model:\n  init: {family: mixtral, hidden: 32, layers: 2, heads: 4, kv_heads: 2, experts: 4, top_k: "
       "2,\n"
       "         expert_ffn: 32, vocab: 64, max_seq: 32, seed: 3}\n"
    << "data: {train: " << corpus() << ", seq_len: 32}\n"
    << "train: {micro_batch: 2, grad_accum: 2, steps: 12, lr: 1e-2, warmup: 2, log_every: 100, threads: "
    << threads << ", adam_moments: " << moments << ", overlap_optimizer: " << (overlap ? "true" : "false")
    << "}\n"
    << "output: {dir: " << tmp() << "/" << name << "}\nbackend: cpu\n";
  const std::string text = y.str();
  mf_config *cfg = nullptr;
  TrainRun r;
  EXPECT_EQ(mf_config_load_string(text.c_str(), text.size(), "moments.yaml", nullptr, 0, &cfg), MF_OK)
      << mf_last_error();
  if (!cfg) return r;
  EXPECT_EQ(mf_train(cfg, 1, &r.sum), MF_OK) << mf_last_error();
  mf_config_free(cfg);
  std::ifstream f(tmp() + "/" + name + "/final/model.safetensors", std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  r.weights = s.str();
  return r;
}

TEST(TrainMoments, Bf16MomentsTrainDifferFromFp32AndAreDeterministic) {
  const TrainRun f32 = train("m_fp32", "fp32", 2, true);
  const TrainRun a = train("m_bf16_a", "bf16", 2, true);
  const TrainRun b = train("m_bf16_b", "bf16", 2, true);
  const TrainRun one = train("m_bf16_1", "bf16", 1, true);
  const TrainRun plain = train("m_bf16_plain", "bf16", 2, false);
  std::printf("losses: fp32 moments first %.6f final %.6f; bf16 moments first %.6f final %.6f\n",
              f32.sum.first_loss, f32.sum.final_loss, a.sum.first_loss, a.sum.final_loss);
  ASSERT_FALSE(f32.weights.empty());
  ASSERT_FALSE(a.weights.empty());
  EXPECT_EQ(a.sum.steps, 12);
  EXPECT_EQ(a.sum.skipped, 0);
  // it trains
  EXPECT_LT(a.sum.final_loss, a.sum.first_loss - 0.5);
  // the setting is used: other weights than fp32 moments, yet close in loss
  EXPECT_NE(a.weights, f32.weights);
  EXPECT_NE(a.sum.final_loss, f32.sum.final_loss);
  EXPECT_EQ(a.sum.first_loss, f32.sum.first_loss) << "the first step's loss precedes every update";
  EXPECT_NEAR(a.sum.final_loss, f32.sum.final_loss, 0.1 * f32.sum.final_loss);
  // deterministic: run to run, 1 or 2 threads, overlapped or plain optimizer
  EXPECT_EQ(a.weights, b.weights);
  EXPECT_EQ(a.weights, one.weights);
  EXPECT_EQ(a.weights, plain.weights);
  EXPECT_EQ(a.sum.final_loss, b.sum.final_loss);
  EXPECT_EQ(a.sum.final_loss, plain.sum.final_loss);
}

}  // namespace
