// issue 29 item 1: train's evaluation runs inside the training run's backend
// and device arena. A run with data.valid, evaluated every other step,
// against the same run without it, under several plans (everything
// resident; streamed at the least-memory budget; the optimizer on the
// device; LoRA over a resident frozen base; bf16 storage):
//   - the device arenas of the process (every backend's, counted by the
//     backends themselves) never hold more than memory.device_budget at once;
//   - the training losses and the final weights are the same bits: the
//     evaluation between the steps, which overwrites what training keeps in
//     the arena, changes nothing (training fills it again from home);
//   - the last validation loss is what `eval` gives for the final weights.
// Before, a second backend planned its own arena against the whole budget:
// up to twice it on the device.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "src/config/config.h"
#include "src/core/core.h"
#include "src/io/tokens.h"
#include "src/train/train.h"
#include "tests/exec/phrases.h"

namespace {

// metrics.jsonl's training figures, step by step (no timings, no eval).
std::string train_losses(const std::string &dir) {
  static const char *const keys[] = {"step", "loss", "ce_loss", "aux_loss", "grad_norm", "tokens", "skipped"};
  std::istringstream in(slurp(dir + "/metrics.jsonl"));
  std::string line, out;
  while (std::getline(in, line)) {
    if (line.find("\"loss\":") == std::string::npos) continue;
    for (const char *k : keys) {
      const std::string key = std::string("\"") + k + "\":";
      size_t a = line.find(key);
      if (a == std::string::npos) continue;
      a += key.size();
      out += std::string(k) + "=" + line.substr(a, line.find_first_of(",}", a) - a) + " ";
    }
    out += "\n";
  }
  return out;
}

struct TrainRun {
  mf_status st = MF_OK;
  std::string err, dir;
  mf_train_summary sum{};
  uint64_t arena_peak = 0;
};

const char kModel[] =
    "model:\n  init: {family: mixtral, hidden: 32, layers: 2, heads: 4, kv_heads: 2, experts: 4, top_k: 2,\n"
    "         expert_ffn: 32, vocab: 64, max_seq: 32, seed: 5}\n"
    "train: {micro_batch: 2, grad_accum: 2, steps: 5, warmup: 1, lr: 1e-2, log_every: 1, threads: 2}\n"
    "backend: cpu\n";

mf_config *load(const std::string &dir, bool valid, const std::vector<std::string> &extra) {
  static const std::string train = phrase_tokens("train.tokens", 300, 7),
                           val = phrase_tokens("valid.tokens", 12, 11);
  return load_config(kModel, "eval_inside.yaml",
                     {"data.train=" + train, "data.seq_len=16", "output.dir=" + dir,
                      "hardware.profile=configs/hw/cpu-2core.yaml", valid ? "data.valid=" + val : "data.valid=null",
                      "train.eval_every=2"},
                     extra);
}

TrainRun train(const std::string &tag, bool valid, const std::vector<std::string> &extra) {
  TrainRun r;
  r.dir = tmp() + "/" + tag + (valid ? "_valid" : "_plain");
  mf_config *cfg = load(r.dir, valid, extra);
  if (!cfg) {
    r.st = MF_ERR_CONFIG;
    return r;
  }
  mf_backend_arena_peak_reset();
  r.st = mf_train(cfg, 1, &r.sum);
  if (r.st != MF_OK) r.err = mf_last_error();
  r.arena_peak = mf_backend_arena_peak();
  mf_config_free(cfg);
  return r;
}

struct Case {
  const char *tag;
  std::vector<std::string> extra;
};

class EvalInside : public ::testing::TestWithParam<int> {};

const std::vector<Case> &cases() {
  static const std::vector<Case> c = {
      {"resident", {"memory.device_budget=64MiB"}},
      {"least_memory", {"memory.device_budget=64MiB", "memory.plan=least_memory"}},
      {"optimizer_on_device", {"memory.device_budget=64MiB", "memory.plan=resident"}},
      {"lora", {"memory.device_budget=64MiB", "train.lora.rank=4", "train.lora.alpha=8"}},
      {"lora_streamed", {"memory.device_budget=64MiB", "train.lora.rank=4", "memory.plan=least_memory"}},
      {"bf16", {"memory.device_budget=64MiB", "train.precision=bf16", "memory.plan=resident"}},
      // LoRA's training streams part of the frozen base that the evaluation
      // keeps resident, where training's activations come and go
      {"lora_tight_a", {"memory.device_budget=160KiB", "train.lora.rank=4"}},
      {"lora_tight_b", {"memory.device_budget=200KiB", "train.lora.rank=4"}},
      {"lora_tight_c", {"memory.device_budget=240KiB", "train.lora.rank=4"}},
      // the training plan's arena near the budget: a second arena would be over it
      {"tight_budget", {"memory.device_budget=320KiB"}},
  };
  return c;
}

TEST_P(EvalInside, OneArenaWithinTheBudgetAndTheSameBits) {
  const Case &c = cases()[(size_t)GetParam()];
  SCOPED_TRACE(c.tag);
  const TrainRun plain = train(c.tag, false, c.extra);
  ASSERT_EQ(plain.st, MF_OK) << plain.err;
  const TrainRun with = train(c.tag, true, c.extra);
  ASSERT_EQ(with.st, MF_OK) << with.err;
  // the budget: the last extra naming it
  uint64_t budget = 0;
  for (const auto &e : c.extra)
    if (e.rfind("memory.device_budget=", 0) == 0)
      budget = std::stoull(e.substr(21)) << (e.find("MiB") != std::string::npos ? 20 : 10);
  ASSERT_GT(budget, 0u);
  EXPECT_GT(with.arena_peak, 0u);
  EXPECT_LE(with.arena_peak, budget) << "the device arenas held at once, with the evaluation";
  EXPECT_EQ(with.arena_peak, plain.arena_peak) << "the evaluation holds no arena of its own";
  EXPECT_EQ(train_losses(with.dir), train_losses(plain.dir));
  EXPECT_EQ(slurp(with.dir + "/final/" + (std::string(c.tag).rfind("lora", 0) == 0 ? "adapter_model.safetensors"
                                                                             : "model.safetensors")),
            slurp(plain.dir + "/final/" + (std::string(c.tag).rfind("lora", 0) == 0 ? "adapter_model.safetensors"
                                                                              : "model.safetensors")));
  // three evaluations (steps 2, 4 and the last); the last against eval's own
  EXPECT_NE(slurp(with.dir + "/metrics.jsonl").find("\"eval_loss\""), std::string::npos);
  mf_config *cfg = load(with.dir, true, c.extra);
  ASSERT_NE(cfg, nullptr);
  mf_eval_opts o = {nullptr, nullptr, nullptr};
  mf_eval_result er;
  ASSERT_EQ(mf_eval(cfg, &o, &er), MF_OK) << mf_last_error();
  EXPECT_EQ(memcmp(&er.loss, &with.sum.valid_loss, sizeof er.loss), 0)
      << "eval " << er.loss << ", the run's last validation " << with.sum.valid_loss;
  mf_config_free(cfg);
}

INSTANTIATE_TEST_SUITE_P(Plans, EvalInside, ::testing::Range(0, (int)cases().size()), [](const ::testing::TestParamInfo<int> &i) {
  return std::string(cases()[(size_t)i.param].tag);
});

}  // namespace
