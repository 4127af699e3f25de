// The training loop end to end on a tiny model: it learns (the loss falls below
// the corpus's unigram entropy), two runs with the same seed give the same bits,
// and 1 and 2 threads give the same bits; metrics.jsonl and the final weights
// are written; eval reads the weights back.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "src/config/config.h"
#include "src/core/core.h"
#include "src/exec/train.h"
#include "src/io/tokens.h"

namespace {

std::string tmp() {
  const char *t = getenv("TEST_TMPDIR");
  return t ? t : "/tmp";
}

// A small corpus with structure a model can learn: repeated phrases.
std::string make_corpus() {
  static std::string path;
  if (!path.empty()) return path;
  path = tmp() + "/corpus.tokens";
  mf_tokens_writer *w = nullptr;
  EXPECT_EQ(mf_tokens_writer_create(path.c_str(), 64, 2, 0, &w), MF_OK) << mf_last_error();
  const char *phrases[] = {"the cat sat on the mat. ", "a dog ran in the park. ", "birds sing at dawn. "};
  uint32_t state = 7;
  for (int i = 0; i < 600; i++) {
    state = state * 1103515245u + 12345u;
    const char *s = phrases[(state >> 16) % 3];
    std::vector<uint32_t> ids;
    for (const char *c = s; *c; c++) ids.push_back((uint32_t)(*c) % 64);
    EXPECT_EQ(mf_tokens_writer_append(w, ids.data(), nullptr, ids.size()), MF_OK);
  }
  EXPECT_EQ(mf_tokens_writer_end_document(w), MF_OK);
  EXPECT_EQ(mf_tokens_writer_finish(w), MF_OK) << mf_last_error();
  mf_tokens_writer_free(w);
  return path;
}

mf_config *config(const std::string &out, int threads, int steps = 40, const char *memory = nullptr) {
  std::string corpus = make_corpus();
  std::ostringstream y;
  y << "model:\n  init: {family: mixtral, hidden: 32, layers: 2, heads: 4, kv_heads: 2, experts: 4, top_k: 2,\n"
       "         expert_ffn: 32, vocab: 64, max_seq: 32, seed: 5}\n"
    << "data: {train: " << corpus << ", valid: " << corpus << ", seq_len: 32}\n"
    << "train: {micro_batch: 4, grad_accum: 2, steps: " << steps
    << ", lr: 1e-2, warmup: " << (steps < 5 ? steps : 5) << ", weight_decay: 0.01, log_every: 10, threads: " << threads << "}\n"
    << "output: {dir: " << out << "}\nbackend: cpu\n";
  if (memory) y << "memory: " << memory << "\nhardware: {profile: configs/hw/cpu-2core.yaml}\n";
  std::string text = y.str();
  mf_config *cfg = nullptr;
  EXPECT_EQ(mf_config_load_string(text.c_str(), text.size(), "test.yaml", nullptr, 0, &cfg), MF_OK) << mf_last_error();
  return cfg;
}

std::string slurp(const std::string &path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

// metrics.jsonl without the timing fields, which differ run to run.
std::string losses_of(const std::string &metrics) {
  std::string out;
  std::istringstream in(metrics);
  std::string line;
  while (std::getline(in, line)) {
    size_t a = line.find("\"loss\""), b = line.find("\"lr\"");
    if (a != std::string::npos && b != std::string::npos) out += line.substr(a, b - a) + "\n";
  }
  return out;
}

TEST(Train, LearnsAndIsDeterministic) {
  mf_train_summary a, b, c;
  mf_config *ca = config(tmp() + "/run_a", 2), *cb = config(tmp() + "/run_b", 2), *cc = config(tmp() + "/run_c", 1);
  ASSERT_EQ(mf_train(ca, 1, &a), MF_OK) << mf_last_error();
  ASSERT_EQ(mf_train(cb, 1, &b), MF_OK) << mf_last_error();
  ASSERT_EQ(mf_train(cc, 1, &c), MF_OK) << mf_last_error();
  EXPECT_EQ(a.steps, 40);
  EXPECT_EQ(a.skipped, 0);
  EXPECT_LT(a.final_loss, a.first_loss - 1.0);
  EXPECT_LT(a.valid_loss, a.entropy_nats) << "the model should beat the unigram entropy";
  // Same seed, same bits; 1 and 2 threads, same bits.
  EXPECT_EQ(a.final_loss, b.final_loss);
  EXPECT_EQ(a.valid_loss, c.valid_loss);
  std::string wa = slurp(tmp() + "/run_a/final/model.safetensors");
  ASSERT_FALSE(wa.empty());
  EXPECT_EQ(wa, slurp(tmp() + "/run_b/final/model.safetensors"));
  EXPECT_EQ(wa, slurp(tmp() + "/run_c/final/model.safetensors"));
  std::string ma = slurp(tmp() + "/run_a/metrics.jsonl");
  EXPECT_NE(ma.find("\"step\":40"), std::string::npos) << ma;
  EXPECT_NE(ma.find("\"aux_loss\""), std::string::npos);
  EXPECT_NE(ma.find("\"tokens_per_s\""), std::string::npos);
  EXPECT_EQ(losses_of(ma), losses_of(slurp(tmp() + "/run_c/metrics.jsonl")));

  // eval reads the trained weights back (OUTPUT/final) and agrees with training's last validation.
  mf_eval_opts eo = {nullptr, nullptr, nullptr};
  mf_eval_result er;
  ASSERT_EQ(mf_eval(ca, &eo, &er), MF_OK) << mf_last_error();
  EXPECT_EQ(er.loss, a.valid_loss);
  EXPECT_NEAR(er.perplexity, std::exp(er.loss), 1e-9 * er.perplexity);
  mf_config_free(ca);
  mf_config_free(cb);
  mf_config_free(cc);
}

// A device budget too small for everything resident: the planner streams
// weights and recomputes or offloads activations, and training gives the same
// bits as with everything resident (plan invariance over 5 steps).
TEST(Train, PlannedRunMatchesResidentRun) {
  mf_train_summary a, b;
  mf_config *ca = config(tmp() + "/run_resident", 2, 5);
  ASSERT_EQ(mf_train(ca, 1, &a), MF_OK) << mf_last_error();
  mf_config *cb = config(tmp() + "/run_planned", 2, 5, "{device_budget: 700KiB}");
  ASSERT_EQ(mf_train(cb, 1, &b), MF_OK) << mf_last_error();
  EXPECT_EQ(a.final_loss, b.final_loss);
  EXPECT_EQ(a.valid_loss, b.valid_loss);
  EXPECT_EQ(slurp(tmp() + "/run_resident/final/model.safetensors"), slurp(tmp() + "/run_planned/final/model.safetensors"));
  mf_config_free(ca);
  mf_config_free(cb);
  // Below the least-memory plan: an error that says what the minimum is.
  mf_config *cc = config(tmp() + "/run_tiny", 2, 5, "{device_budget: 8KiB}");
  EXPECT_EQ(mf_train(cc, 1, &b), MF_ERR_CONFIG);
  EXPECT_NE(std::string(mf_last_error()).find("below the minimum"), std::string::npos) << mf_last_error();
  mf_config_free(cc);
}

TEST(Train, BadInputsAreErrors) {
  mf_config *cfg = config(tmp() + "/run_bad", 1, 2);
  free(cfg->data.train);
  cfg->data.train = strdup((tmp() + "/missing.tokens").c_str());
  mf_train_summary s;
  EXPECT_NE(mf_train(cfg, 1, &s), MF_OK);
  EXPECT_NE(std::string(mf_last_error()).find("missing.tokens"), std::string::npos) << mf_last_error();
  mf_config_free(cfg);

  cfg = config(tmp() + "/run_cuda", 1, 2);
  cfg->backend = MF_CONFIG_BACKEND_CUDA;
  EXPECT_EQ(mf_train(cfg, 1, &s), MF_ERR_NOT_IMPLEMENTED);
  mf_config_free(cfg);
}

}  // namespace
