// issue 28 (never silently wrong): a seeded mutation campaign against an
// adapter dir, a LoRA run's final/ (adapter_model.safetensors,
// adapter_config.json and moefit_base.json, the record of the base with the
// checksums of the other two). Each case copies the dir, damages it and
// evaluates it through mf_eval: it must be refused with a message naming a
// damaged file (or the dir, for a file gone), or give exactly the undamaged
// dir's loss and logits, bit for bit. Damages: bytes flipped, cut short,
// bytes appended, a file deleted, emptied, swapped with another, replaced by
// the same file of another run over the same base (a valid file with other
// values), a JSON number or key edited, and files added (evaluated the same).
// MF_ADAPTER_MUTATION_SEED and MF_ADAPTER_MUTATION_CASES vary the campaign.
#include <gtest/gtest.h>
#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <random>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "src/config/config.h"
#include "src/core/core.h"
#include "src/io/tokens.h"
#include "src/train/train.h"
#include "tests/ckpt/ckpt_util.h"

namespace {

const char *const kRecord = "moefit_base.json";
const char *const kWeights = "adapter_model.safetensors";
const char *const kAdapterConfig = "adapter_config.json";

// Two windows of 32 tokens of a vocabulary of 64: what each case evaluates.
std::string Tokens(const std::string &dir, int n) {
  const std::string path = dir + "/tokens_" + std::to_string(n) + ".tokens";
  mf_tokens_writer *w = nullptr;
  EXPECT_EQ(mf_tokens_writer_create(path.c_str(), 64, 2, 0, &w), MF_OK) << mf_last_error();
  std::vector<uint32_t> ids;
  uint32_t s = 11;
  for (int i = 0; i < n; i++) {
    s = s * 1103515245u + 12345u;
    ids.push_back((s >> 16) % 64);
  }
  EXPECT_EQ(mf_tokens_writer_append(w, ids.data(), nullptr, ids.size()), MF_OK);
  EXPECT_EQ(mf_tokens_writer_end_document(w), MF_OK);
  EXPECT_EQ(mf_tokens_writer_finish(w), MF_OK) << mf_last_error();
  mf_tokens_writer_free(w);
  return path;
}

mf_config *LoraConfig(const std::string &out, const std::string &train, const char *lr) {
  const std::string y =
      "model:\n  init: {family: mixtral, hidden: 32, layers: 2, heads: 4, kv_heads: 2, experts: 4, top_k: 2,\n"
      "         expert_ffn: 32, vocab: 64, max_seq: 32, seed: 5}\n"
      "data: {train: " +
      train + ", valid: null, seq_len: 32}\n" +
      "train: {micro_batch: 2, steps: 3, warmup: 1, lr: " + lr +
      ", threads: 1, log_every: 10,\n"
      "        lora: {rank: 4, alpha: 8, targets: [q_proj, v_proj, w1, w2]}}\n"
      "output: {dir: " +
      out + "}\nbackend: cpu\n";
  mf_config *cfg = nullptr;
  EXPECT_EQ(mf_config_load_string(y.c_str(), y.size(), "test.yaml", nullptr, 0, &cfg), MF_OK) << mf_last_error();
  return cfg;
}

struct Outcome {
  mf_status st;
  std::string error, loss_bits, logits;
};

Outcome Evaluate(const mf_config *cfg, const std::string &dir, const std::string &tokens,
                 const std::string &logits) {
  unlink(logits.c_str());
  mf_eval_opts o = {tokens.c_str(), dir.c_str(), logits.c_str()};
  mf_eval_result r;
  Outcome out;
  out.st = mf_eval(cfg, &o, &r);
  if (out.st != MF_OK) {
    out.error = mf_last_error();
    return out;
  }
  out.loss_bits.assign((const char *)&r.loss, sizeof r.loss);
  out.logits = Slurp(logits);
  return out;
}

// One kind of damage applied to a copy of the files.
struct Damage {
  std::string what;
  std::set<std::string> blamed;  // an error must name one of these
};

// A decimal number in a JSON text, edited.
bool EditNumber(std::string &text, std::mt19937_64 &rng) {
  std::vector<std::pair<size_t, size_t>> nums;
  const std::regex re(R"([:\[,] ?(-?[0-9]+(\.[0-9]+)?))");
  for (auto it = std::sregex_iterator(text.begin(), text.end(), re); it != std::sregex_iterator(); ++it)
    nums.emplace_back((size_t)it->position(1), (size_t)it->length(1));
  if (nums.empty()) return false;
  const auto [at, len] = nums[rng() % nums.size()];
  const std::string old = text.substr(at, len);
  std::string now = std::to_string(std::atoll(old.c_str()) + 1 + (long long)(rng() % 7));
  if (now == old) now += "1";
  text.replace(at, len, now);
  return true;
}

// A JSON key renamed, or its line deleted.
bool EditKey(std::string &text, std::mt19937_64 &rng, bool remove) {
  std::vector<std::pair<size_t, size_t>> keys;
  const std::regex re("\"([a-z_]+)\":");
  for (auto it = std::sregex_iterator(text.begin(), text.end(), re); it != std::sregex_iterator(); ++it)
    keys.emplace_back((size_t)it->position(1), (size_t)it->length(1));
  if (keys.empty()) return false;
  const auto [at, len] = keys[rng() % keys.size()];
  if (!remove) {
    text.insert(at + len, "_x");
    return true;
  }
  const size_t b = text.rfind('\n', at), e = text.find('\n', at);
  if (b == std::string::npos || e == std::string::npos) return false;
  text.erase(b, e - b);
  return true;
}

TEST(AdapterMutation, EveryDamageIsRefusedOrChangesNothing) {
  const std::string dir = TestDir();
  const std::string train = Tokens(dir, 4000), eval = Tokens(dir, 64);
  mf_config *cfg = LoraConfig(dir + "/run", train, "1e-2");
  mf_config *other = LoraConfig(dir + "/other", train, "3e-2");
  mf_train_summary sum;
  ASSERT_EQ(mf_train(cfg, 1, &sum), MF_OK) << mf_last_error();
  ASSERT_EQ(mf_train(other, 1, &sum), MF_OK) << mf_last_error();
  const Files good = ReadDir(dir + "/run/final"), theirs = ReadDir(dir + "/other/final");
  ASSERT_EQ(good.size(), 3u);
  ASSERT_TRUE(good.count(kRecord) && good.count(kWeights) && good.count(kAdapterConfig));
  ASSERT_NE(good.at(kWeights), theirs.at(kWeights)) << "the other run must train other values";

  const std::string logits = dir + "/logits.f32", work = dir + "/case";
  const Outcome ref = Evaluate(cfg, dir + "/run/final", eval, logits);
  ASSERT_EQ(ref.st, MF_OK) << ref.error;
  ASSERT_FALSE(ref.logits.empty());

  const char *seed_env = getenv("MF_ADAPTER_MUTATION_SEED"), *cases_env = getenv("MF_ADAPTER_MUTATION_CASES");
  const uint64_t seed = seed_env ? strtoull(seed_env, nullptr, 10) : 28;
  const int cases = cases_env ? atoi(cases_env) : 300;
  std::mt19937_64 rng(seed);
  const std::vector<std::string> names = {kWeights, kAdapterConfig, kRecord};
  int refused = 0, same = 0;
  std::map<std::string, int> kinds;
  for (int c = 0; c < cases; c++) {
    Files f = good;
    Damage d;
    const std::string &name = names[rng() % names.size()];
    std::string &bytes = f[name];
    const int kind = (int)(rng() % 10);
    bool text = name != kWeights;
    switch (kind) {
      case 0: {  // bytes flipped (1 to 3)
        const int n = 1 + (int)(rng() % 3);
        for (int i = 0; i < n; i++) bytes[rng() % bytes.size()] ^= (char)(1 + rng() % 255);
        d = {"flip " + std::to_string(n) + " byte(s) of " + name, {name}};
        break;
      }
      case 1: {  // cut short
        bytes.resize(rng() % bytes.size());
        d = {"cut " + name + " to " + std::to_string(bytes.size()) + " bytes", {name}};
        break;
      }
      case 2: {  // bytes appended
        const size_t n = 1 + rng() % 64;
        for (size_t i = 0; i < n; i++) bytes.push_back(text ? ' ' + (char)(rng() % 90) : (char)rng());
        d = {"append " + std::to_string(n) + " bytes to " + name, {name}};
        break;
      }
      case 3:  // deleted: the record's absence is a warning, the base the same
        f.erase(name);
        d = {"delete " + name, {name}};
        break;
      case 4:  // the same file of another run over the same base
        bytes = theirs.at(name);
        d = {"replace " + name + " with the other run's", {name, kWeights, kAdapterConfig}};
        break;
      case 5: {  // swapped with another file of the dir
        const std::string &b = names[(std::find(names.begin(), names.end(), name) - names.begin() + 1) % 3];
        std::swap(f[name], f[b]);
        d = {"swap " + name + " and " + b, {name, b}};
        break;
      }
      case 6:  // a number edited
        if (!text || !EditNumber(bytes, rng)) bytes[rng() % bytes.size()] ^= 0x20;
        d = {"edit a number of " + name, {name}};
        break;
      case 7:  // a key renamed or its line deleted
        if (!text || !EditKey(bytes, rng, rng() % 2)) bytes[rng() % bytes.size()] ^= 0x01;
        d = {"edit a key of " + name, {name}};
        break;
      case 8:  // emptied
        bytes.clear();
        d = {"empty " + name, {name}};
        break;
      default:  // files added beside: nothing reads them
        f["README.md"] = "an adapter\n";
        f["adapter_model.bin"] = std::string(100, '\0');
        d = {"add README.md and adapter_model.bin", {}};
        break;
    }
    SCOPED_TRACE("case " + std::to_string(c) + " (seed " + std::to_string(seed) + "): " + d.what);
    kinds[d.what.substr(0, d.what.find(' '))]++;
    WriteDir(work, f);
    const Outcome o = Evaluate(cfg, work, eval, logits);
    if (o.st != MF_OK) {
      refused++;
      bool named = false;
      for (const std::string &b : d.blamed) named = named || o.error.find(b) != std::string::npos;
      EXPECT_TRUE(named) << "refused without naming the damaged file: " << o.error;
    } else {
      same++;
      EXPECT_EQ(o.loss_bits, ref.loss_bits) << "evaluated to another loss: a damage read as valid";
      EXPECT_EQ(o.logits, ref.logits) << "evaluated to other logits: a damage read as valid";
    }
  }
  printf("%d cases (seed %llu): %d refused naming the file, %d evaluated to the undamaged bits\n", cases,
         (unsigned long long)seed, refused, same);
  for (const auto &kv : kinds) printf("  %-8s %d\n", kv.first.c_str(), kv.second);
  EXPECT_GT(refused, cases / 2);
  mf_config_free(cfg);
  mf_config_free(other);
}

}  // namespace
