// src/config: YAML configs into mf_config — values and defaults, every kind of
// malformed input (with file:line:column and key path in the message),
// command-line overrides, print -> load round trips and configs/demo.yaml.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "src/config/config.h"

namespace {

std::string TmpPath(const std::string &name) {
  const char *dir = getenv("TEST_TMPDIR");
  return std::string(dir ? dir : "/tmp") + "/" + name;
}

std::string WriteFile(const std::string &name, const std::string &text) {
  std::string path = TmpPath(name);
  std::ofstream f(path, std::ios::binary);
  f << text;
  return path;
}

struct Loaded {
  mf_status st = MF_OK;
  mf_config *cfg = nullptr;
  std::string err;
  Loaded() = default;
  Loaded(const Loaded &) = delete;
  Loaded &operator=(const Loaded &) = delete;
  Loaded(Loaded &&o) noexcept : st(o.st), cfg(o.cfg), err(std::move(o.err)) { o.cfg = nullptr; }
  ~Loaded() { mf_config_free(cfg); }
};

Loaded LoadPath(const std::string &path, const std::vector<std::string> &ovs = {}) {
  std::vector<const char *> p;
  for (const auto &o : ovs) p.push_back(o.c_str());
  Loaded r;
  mf_error_clear();
  r.st = mf_config_load(path.c_str(), p.data(), p.size(), &r.cfg);
  if (r.st != MF_OK) {
    r.err = mf_last_error();
    EXPECT_EQ(r.cfg, nullptr);
  }
  return r;
}

// Writes `text` to TEST_TMPDIR/<name> and loads it.
Loaded Load(const std::string &text, const std::vector<std::string> &ovs = {},
            const std::string &name = "c.yaml") {
  return LoadPath(WriteFile(name, text), ovs);
}

const char kInit[] =
    "model:\n"
    "  init:\n"
    "    family: mixtral\n"
    "    hidden: 64\n"
    "    layers: 2\n"
    "    heads: 4\n"
    "    kv_heads: 2\n"
    "    experts: 8\n"
    "    top_k: 2\n"
    "    expert_ffn: 128\n"
    "    vocab: 256\n";

const char kRest[] =
    "data:\n"
    "  train: t.tokens\n"
    "train:\n"
    "  steps: 100\n";

std::string Minimal() {
  return std::string(kInit) + kRest;
}

// Expects a config error whose message contains every one of `parts`.
#define EXPECT_CONFIG_ERROR(r, ...)                                                                     \
  do {                                                                                                  \
    EXPECT_EQ((r).st, MF_ERR_CONFIG) << (r).err;                                                        \
    for (const char *part_ : {__VA_ARGS__})                                                             \
      EXPECT_NE((r).err.find(part_), std::string::npos) << "missing '" << part_ << "' in: " << (r).err; \
  } while (0)

// ------------------------------------------------------------- valid

TEST(ConfigLoad, MinimalGetsDefaults) {
  Loaded r = Load(Minimal(), {}, "minimal.yaml");
  ASSERT_EQ(r.st, MF_OK) << r.err;
  const mf_config *c = r.cfg;
  EXPECT_NE(std::string(c->source).find("minimal.yaml"), std::string::npos);
  ASSERT_TRUE(c->model.has_init);
  EXPECT_EQ(c->model.path, nullptr);
  const mf_model_spec &s = c->model.init;
  EXPECT_EQ(s.family, MF_FAMILY_MIXTRAL);
  EXPECT_EQ(s.hidden, 64);
  EXPECT_EQ(s.layers, 2);
  EXPECT_EQ(s.heads, 4);
  EXPECT_EQ(s.kv_heads, 2);
  EXPECT_EQ(s.head_dim, 16);  // hidden / heads
  EXPECT_EQ(s.experts, 8);
  EXPECT_EQ(s.top_k, 2);
  EXPECT_EQ(s.expert_ffn, 128);
  EXPECT_EQ(s.vocab, 256);
  EXPECT_EQ(s.max_seq, 4096 * 32);  // Mixtral's default
  EXPECT_DOUBLE_EQ(s.rope_theta, 1e6);
  EXPECT_EQ(s.norm_topk_prob, 1);
  EXPECT_EQ(s.seed, 1u);
  EXPECT_STREQ(c->data.train, "t.tokens");
  EXPECT_EQ(c->data.valid, nullptr);
  EXPECT_EQ(c->data.seq_len, 256);
  EXPECT_EQ(c->train.micro_batch, 1);
  EXPECT_EQ(c->train.grad_accum, 1);
  EXPECT_EQ(c->train.steps, 100);
  EXPECT_DOUBLE_EQ(c->train.lr, 1e-4);
  EXPECT_DOUBLE_EQ(c->train.min_lr, 0.0);
  EXPECT_EQ(c->train.warmup, 0);
  EXPECT_EQ(c->train.schedule, MF_CONFIG_SCHEDULE_COSINE);
  EXPECT_DOUBLE_EQ(c->train.weight_decay, 0.0);
  EXPECT_DOUBLE_EQ(c->train.beta1, 0.9);
  EXPECT_DOUBLE_EQ(c->train.beta2, 0.999);
  EXPECT_DOUBLE_EQ(c->train.eps, 1e-8);
  EXPECT_DOUBLE_EQ(c->train.grad_clip, 1.0);
  EXPECT_DOUBLE_EQ(c->train.aux_loss_coef, 0.001);  // the model's router_aux_loss_coef
  EXPECT_EQ(c->train.seed, 1u);
  EXPECT_EQ(c->train.threads, 0);
  EXPECT_EQ(c->train.log_every, 10);
  EXPECT_EQ(c->train.eval_every, 0);
  EXPECT_EQ(c->memory.device_budget, (uint64_t)MF_CONFIG_SIZE_AUTO);
  EXPECT_EQ(c->memory.pinned_limit, (uint64_t)MF_CONFIG_SIZE_AUTO);
  EXPECT_EQ(c->memory.host_limit, (uint64_t)MF_CONFIG_SIZE_AUTO);
  EXPECT_EQ(c->memory.nvme_dir, nullptr);
  EXPECT_EQ(c->memory.n_overrides, 0u);
  EXPECT_STREQ(c->hardware.profile, "auto");
  EXPECT_STREQ(c->output.dir, "runs/minimal");
  EXPECT_EQ(c->output.checkpoint_every, 0);
  EXPECT_EQ(c->backend, MF_CONFIG_BACKEND_AUTO);
}

const char kFull[] =
    "# every section\n"
    "model:\n"
    "  init:\n"
    "    family: qwen2_moe\n"
    "    hidden: 96\n"
    "    layers: 4\n"
    "    heads: 4\n"
    "    kv_heads: 4\n"
    "    head_dim: 32\n"
    "    experts: 6\n"
    "    top_k: 2\n"
    "    expert_ffn: 48\n"
    "    dense_ffn: 192\n"
    "    shared_ffn: 64\n"
    "    vocab: 1000\n"
    "    max_seq: 512\n"
    "    rope_theta: 500000\n"
    "    norm_eps: 1e-6\n"
    "    norm_topk_prob: true\n"
    "    tie_embeddings: true\n"
    "    qkv_bias: false\n"
    "    decoder_sparse_step: 2\n"
    "    mlp_only_layers: [3]\n"
    "    router_aux_loss_coef: 0.02\n"
    "    router_jitter: 0.01\n"
    "    clip_qkv: 0\n"
    "    seed: 18446744073709551615\n"
    "data: {train: a.tokens, valid: 'b.tokens', seq_len: 512}\n"
    "train:\n"
    "  micro_batch: 4\n"
    "  grad_accum: 8\n"
    "  steps: 1e3\n"
    "  lr: 3e-4\n"
    "  min_lr: 3e-5\n"
    "  warmup: 20\n"
    "  schedule: linear\n"
    "  weight_decay: 0.1\n"
    "  beta1: 0.8\n"
    "  beta2: 0.95\n"
    "  eps: 1e-6\n"
    "  grad_clip: 0\n"
    "  aux_loss_coef: 0.05\n"
    "  seed: 7\n"
    "  threads: 3\n"
    "  log_every: 5\n"
    "  eval_every: 50\n"
    "memory:\n"
    "  device_budget: 24GiB\n"
    "  pinned_limit: \"512MiB\"\n"
    "  host_limit: 1.5GB\n"
    "  nvme_dir: /mnt/nvme/moefit\n"
    "  overrides:\n"
    "    - match: model.layers.*.mlp.experts.*\n"
    "      params: host\n"
    "      optimizer: host\n"
    "    - {match: \"*.attn.out\", activations: recompute}\n"
    "hardware:\n"
    "  profile: configs/hw/h100.yaml\n"
    "output:\n"
    "  dir: \"runs/my run #1\"\n"
    "  checkpoint_every: 100\n"
    "backend: cuda\n";

TEST(ConfigLoad, EverySectionGiven) {
  Loaded r = Load(kFull);
  ASSERT_EQ(r.st, MF_OK) << r.err;
  const mf_config *c = r.cfg;
  const mf_model_spec &s = c->model.init;
  EXPECT_EQ(s.family, MF_FAMILY_QWEN2_MOE);
  EXPECT_EQ(s.head_dim, 32);
  EXPECT_EQ(s.dense_ffn, 192);
  EXPECT_EQ(s.shared_ffn, 64);
  EXPECT_DOUBLE_EQ(s.rope_theta, 5e5);
  EXPECT_DOUBLE_EQ(s.norm_eps, 1e-6);
  EXPECT_EQ(s.tie_embeddings, 1);
  EXPECT_EQ(s.qkv_bias, 0);
  EXPECT_EQ(s.decoder_sparse_step, 2);
  ASSERT_EQ(s.n_mlp_only, 1);
  EXPECT_EQ(s.mlp_only_layers[0], 3);
  EXPECT_DOUBLE_EQ(s.router_jitter, 0.01);
  EXPECT_EQ(s.seed, UINT64_MAX);
  EXPECT_STREQ(c->data.train, "a.tokens");
  EXPECT_STREQ(c->data.valid, "b.tokens");
  EXPECT_EQ(c->data.seq_len, 512);
  EXPECT_EQ(c->train.micro_batch, 4);
  EXPECT_EQ(c->train.grad_accum, 8);
  EXPECT_EQ(c->train.steps, 1000);
  EXPECT_DOUBLE_EQ(c->train.lr, 3e-4);
  EXPECT_DOUBLE_EQ(c->train.min_lr, 3e-5);
  EXPECT_EQ(c->train.schedule, MF_CONFIG_SCHEDULE_LINEAR);
  EXPECT_DOUBLE_EQ(c->train.weight_decay, 0.1);
  EXPECT_DOUBLE_EQ(c->train.beta2, 0.95);
  EXPECT_DOUBLE_EQ(c->train.grad_clip, 0.0);
  EXPECT_DOUBLE_EQ(c->train.aux_loss_coef, 0.05);
  EXPECT_EQ(c->train.threads, 3);
  EXPECT_EQ(c->memory.device_budget, 24ull << 30);
  EXPECT_EQ(c->memory.pinned_limit, 512ull << 20);
  EXPECT_EQ(c->memory.host_limit, 1500000000ull);
  EXPECT_STREQ(c->memory.nvme_dir, "/mnt/nvme/moefit");
  ASSERT_EQ(c->memory.n_overrides, 2u);
  EXPECT_STREQ(c->memory.overrides[0].match, "model.layers.*.mlp.experts.*");
  EXPECT_STREQ(c->memory.overrides[0].params, "host");
  EXPECT_STREQ(c->memory.overrides[0].optimizer, "host");
  EXPECT_EQ(c->memory.overrides[0].activations, nullptr);
  EXPECT_NE(std::string(c->memory.overrides[0].where).find("c.yaml:53:7"), std::string::npos)
      << c->memory.overrides[0].where;
  EXPECT_STREQ(c->memory.overrides[1].match, "*.attn.out");
  EXPECT_STREQ(c->memory.overrides[1].activations, "recompute");
  EXPECT_STREQ(c->hardware.profile, "configs/hw/h100.yaml");
  EXPECT_STREQ(c->output.dir, "runs/my run #1");
  EXPECT_EQ(c->output.checkpoint_every, 100);
  EXPECT_EQ(c->backend, MF_CONFIG_BACKEND_CUDA);
}

TEST(ConfigLoad, CheckpointPath) {
  Loaded r = Load("model: {path: /models/Mixtral-8x7B}\n" + std::string(kRest) + "backend: cpu\n");
  ASSERT_EQ(r.st, MF_OK) << r.err;
  EXPECT_STREQ(r.cfg->model.path, "/models/Mixtral-8x7B");
  EXPECT_FALSE(r.cfg->model.has_init);
  EXPECT_TRUE(std::isnan(r.cfg->train.aux_loss_coef));  // taken from the checkpoint later
  EXPECT_EQ(r.cfg->backend, MF_CONFIG_BACKEND_CPU);
}

TEST(ConfigLoad, NullSectionsAndAnchorsAreFine) {
  Loaded r = Load(Minimal() + "memory:\nhardware:  # defaults\noutput: {dir: &d out}\n");
  ASSERT_EQ(r.st, MF_OK) << r.err;
  EXPECT_STREQ(r.cfg->output.dir, "out");  // an anchor without an alias is harmless
  EXPECT_STREQ(r.cfg->hardware.profile, "auto");
}

TEST(ConfigLoad, FreeAcceptsNull) {
  mf_config_free(nullptr);
}

// --------------------------------------------------------- malformed

TEST(ConfigErrors, UnknownKeySuggestsTheKnownOne) {
  Loaded r = Load(Minimal() + "  lrr: 1e-4\n", {}, "x.yaml");
  EXPECT_CONFIG_ERROR(r, "x.yaml:16:3: unknown key 'train.lrr' (did you mean 'train.lr'?)");
  Loaded s = Load(std::string(kInit) + "data: {train: t}\ntrian:\n  steps: 3\n", {}, "x.yaml");
  EXPECT_CONFIG_ERROR(s, "x.yaml:13:1: unknown key 'trian' (did you mean 'train'?)");
  Loaded t = Load(Minimal() + "  seq_len: 64\n");
  EXPECT_CONFIG_ERROR(t, "c.yaml:16:3:", "'train.seq_len' (did you mean 'data.seq_len'?)");
  Loaded u = Load(Minimal() + "  zzzzzz: 1\n");
  EXPECT_CONFIG_ERROR(u, "unknown key 'train.zzzzzz' (known keys in 'train': micro_batch,");
  Loaded v = Load(Minimal() + "train.lr: 1\n");
  EXPECT_CONFIG_ERROR(v, "c.yaml:16:1:", "contains '.'");
}

TEST(ConfigErrors, WrongTypes) {
  Loaded a = Load(Minimal() + "  lr: bogus\n");
  EXPECT_CONFIG_ERROR(a, "c.yaml:16:7: train.lr must be a number (got 'bogus')");
  Loaded b = Load(Minimal() + "  lr: \"3e-4\"\n");
  EXPECT_CONFIG_ERROR(b, "c.yaml:16:7: train.lr must be a number, not the quoted string '3e-4'");
  Loaded c = Load(Minimal() + "  micro_batch: 1.5\n");
  EXPECT_CONFIG_ERROR(c, "c.yaml:16:16: train.micro_batch must be a whole number (got '1.5')");
  Loaded d = Load(Minimal() + "  lr: [1]\n");
  EXPECT_CONFIG_ERROR(d, "c.yaml:16:7: train.lr must be a number (got a list)");
  Loaded e = Load(Minimal() + "  schedule: cosin\n");
  EXPECT_CONFIG_ERROR(e, "c.yaml:16:13: train.schedule must be one of constant|linear|cosine (got 'cosin')");
  Loaded f = Load(Minimal() + "memory: {device_budget: 8 gigs}\n");
  EXPECT_CONFIG_ERROR(f, "c.yaml:16:25: memory.device_budget must be a size such as 24GiB");
  Loaded g = Load(std::string(kInit) + "    tie_embeddings: yes\n" + kRest);
  EXPECT_CONFIG_ERROR(g, "c.yaml:12:21: model.init.tie_embeddings must be true or false (got 'yes')");
  Loaded h = Load(Minimal() + "backend: gpu\n");
  EXPECT_CONFIG_ERROR(h, "c.yaml:16:10: backend must be one of auto|cpu|cuda (got 'gpu')");
  Loaded i = Load(Minimal() + "  lr: 1e999\n");
  EXPECT_CONFIG_ERROR(i, "train.lr must be a finite number");
  Loaded j = Load(Minimal() + "  lr: .nan\n");
  EXPECT_CONFIG_ERROR(j, "train.lr must be a number (got '.nan')");
  Loaded k = Load(Minimal() + "  seed: -1\n");
  EXPECT_CONFIG_ERROR(k, "train.seed must be a non-negative integer (got '-1')");
  Loaded l = Load("model: {path: null}\n" + std::string(kRest));
  EXPECT_CONFIG_ERROR(l, "c.yaml:1:1:", "missing required key 'model.path' or 'model.init'");
  Loaded m = Load("model: {path: \"\"}\n" + std::string(kRest));
  EXPECT_CONFIG_ERROR(m, "c.yaml:1:15: model.path must not be empty");
  Loaded n = Load("model: {path: \"a\\0b\"}\n" + std::string(kRest));
  EXPECT_CONFIG_ERROR(n, "c.yaml:1:15: model.path must not contain a NUL character");
  Loaded o = Load(std::string(kInit) + "data:\n  train: null\ntrain: {steps: 1}\n");
  EXPECT_CONFIG_ERROR(o, "c.yaml:13:10: data.train must be a string (got null)");
  Loaded q = Load(std::string(kInit) + "    mlp_only_layers: [0, x]\n" + kRest);
  EXPECT_CONFIG_ERROR(q, "c.yaml:12:26: model.init.mlp_only_layers[1] must be an integer (got 'x')");
}

TEST(ConfigErrors, DuplicateKeys) {
  Loaded r = Load(Minimal() + "data:\n  valid: v.tokens\n", {}, "dup.yaml");
  EXPECT_CONFIG_ERROR(r, "dup.yaml:16:1: duplicate key 'data' (first at line 12, column 1)");
  Loaded q = Load(std::string(kInit) + "    family: olmoe\n" + kRest);
  EXPECT_CONFIG_ERROR(q, "c.yaml:12:5: duplicate key 'model.init.family' (first at line 3, column 5)");
  Loaded f = Load("train: {steps: 1, steps: 2}\n", {}, "flow.yaml");
  EXPECT_CONFIG_ERROR(f, "flow.yaml:1:19: duplicate key 'train.steps' (first at line 1, column 9)");
}

TEST(ConfigErrors, ScalarWhereAMapIsExpected) {
  Loaded a = Load(std::string(kInit) + "data: {train: t}\ntrain: 5\n");
  EXPECT_CONFIG_ERROR(a, "c.yaml:13:8: train must be a map of keys (got '5')");
  Loaded b = Load("model:\n  init: [1, 2]\n" + std::string(kRest));
  EXPECT_CONFIG_ERROR(b, "c.yaml:2:9: model.init must be a map of keys (got a list)");
  Loaded c = Load("just a string\n");
  EXPECT_CONFIG_ERROR(c, "c.yaml:1:1: a config is a map of sections", "not 'just a string'");
  Loaded d = Load("- model\n- data\n");
  EXPECT_CONFIG_ERROR(d, "c.yaml:1:1:", "not a list");
  Loaded e = Load(Minimal() + "memory:\n  overrides: {match: x}\n");
  EXPECT_CONFIG_ERROR(e, "c.yaml:17:14: memory.overrides must be a list");
}

TEST(ConfigErrors, OutOfRange) {
  Loaded a = Load(Minimal() + "  micro_batch: 0\n");
  EXPECT_CONFIG_ERROR(a, "c.yaml:16:16: train.micro_batch must be in [1, 1048576] (got '0')");
  Loaded b = Load(Minimal() + "  lr: -1\n");
  EXPECT_CONFIG_ERROR(b, "c.yaml:16:7: train.lr must be in (0, 1000] (got '-1')");
  Loaded c = Load(Minimal() + "  lr: 0\n");
  EXPECT_CONFIG_ERROR(c, "train.lr must be in (0, 1000] (got '0')");
  Loaded d = Load(Minimal() + "  weight_decay: -0.1\n");
  EXPECT_CONFIG_ERROR(d, "train.weight_decay must be >= 0 (got '-0.1')");
  Loaded e = Load(Minimal() + "  grad_clip: -1\n");
  EXPECT_CONFIG_ERROR(e, "train.grad_clip must be >= 0");
  Loaded g = Load(std::string(kInit) + "data: {train: t, seq_len: 0}\ntrain: {steps: 1}\n");
  EXPECT_CONFIG_ERROR(g, "c.yaml:12:27: data.seq_len must be in [1, 16777216] (got '0')");
  Loaded h = Load(std::string(kInit) + "data: {train: t}\ntrain: {steps: 0}\n");
  EXPECT_CONFIG_ERROR(h, "c.yaml:13:16: train.steps must be in [1, 1000000000000] (got '0')");
  Loaded i = Load(Minimal() + "output: {checkpoint_every: -5}\n");
  EXPECT_CONFIG_ERROR(i, "output.checkpoint_every must be in [0, ");
  Loaded j = Load(Minimal() + "memory: {device_budget: 0}\n");
  EXPECT_CONFIG_ERROR(j, "c.yaml:16:25: memory.device_budget must be more than 0 bytes");
  Loaded k = Load(std::string(kInit) + "    norm_eps: 1\n" + kRest);
  EXPECT_CONFIG_ERROR(k, "c.yaml:12:15: model.init.norm_eps must be in (0, 1) (got '1')");
  Loaded m = Load(Minimal() + "  micro_batch: 99999999999999999999\n");
  EXPECT_CONFIG_ERROR(m, "train.micro_batch must be in [1, 1048576] (got '99999999999999999999')");
}

TEST(ConfigErrors, CrossFieldChecks) {
  Loaded a = Load(Minimal() + "  warmup: 200\n");
  EXPECT_CONFIG_ERROR(a, "c.yaml:16:3: train.warmup (200) must be <= train.steps (100)");
  Loaded b = Load(Minimal() + "  min_lr: 1\n");
  EXPECT_CONFIG_ERROR(b, "c.yaml:16:3: train.min_lr (1) must be <= train.lr (0.0001)");
  Loaded c = Load(Minimal() + "memory:\n  pinned_limit: 8GiB\n  host_limit: 4GiB\n");
  EXPECT_CONFIG_ERROR(c,
                      "c.yaml:17:3: memory.pinned_limit (8.00 GiB) must be <= memory.host_limit (4.00 GiB)");
  Loaded d = Load(std::string(kInit) + "    max_seq: 64\n" + kRest);
  EXPECT_CONFIG_ERROR(d, "c.yaml:12:5: data.seq_len (256) exceeds model.init.max_seq (64)");
  std::string init3 = kInit;
  init3.replace(init3.find("kv_heads: 2"), 11, "kv_heads: 3");
  Loaded f = Load(init3 + kRest);
  EXPECT_CONFIG_ERROR(f, "c.yaml:7:5: model.init.heads (4) must be a multiple of model.init.kv_heads (3)");
  std::string init65 = kInit;
  init65.replace(init65.find("hidden: 64"), 10, "hidden: 66");
  Loaded g = Load(init65 + kRest);
  EXPECT_CONFIG_ERROR(g, "c.yaml:4:5: model.init: hidden (66) is not a multiple of heads (4): give head_dim",
                      "; model.init.heads is set at ", "c.yaml:6:5");
  std::string init9 = kInit;
  init9.replace(init9.find("top_k: 2"), 8, "top_k: 9");
  Loaded h = Load(init9 + kRest);
  EXPECT_CONFIG_ERROR(h, "c.yaml:9:5: model.init.top_k (9) exceeds model.init.experts (8)");
  Loaded j = Load(Minimal(), {"model.init.mlp_only_layers=[0, 2]"});
  EXPECT_CONFIG_ERROR(
      j, "command line: model.init.mlp_only_layers=[0, 2]: model.init.mlp_only_layers[1] = 2 is not a layer");
  std::string init18 = kInit;
  init18.replace(init18.find("hidden: 64"), 10, "hidden: 72");
  Loaded k = Load(init18 + kRest);  // head_dim 18 is fine; odd head_dim is not
  EXPECT_EQ(k.st, MF_OK) << k.err;
  Loaded l = Load(Minimal(), {"model.init.head_dim=15"});
  EXPECT_CONFIG_ERROR(l, "command line: model.init.head_dim=15: model.init (set at ",
                      "c.yaml:2:3): ", "head_dim (15) must be even");
  Loaded i = Load(std::string(kInit) + "    shared_ffn: 64\n" + kRest);
  EXPECT_CONFIG_ERROR(i, "c.yaml:2:3: model.init:", "shared expert is only defined for qwen2_moe");
}

TEST(ConfigErrors, MissingRequiredKeys) {
  Loaded a = Load(std::string(kInit) + "train: {steps: 1}\n");
  EXPECT_CONFIG_ERROR(a, "c.yaml:1:1: missing required key 'data.train'");
  Loaded b = Load(std::string(kInit) + "data:\n  seq_len: 8\ntrain: {steps: 1}\n");
  EXPECT_CONFIG_ERROR(b, "c.yaml:12:1: missing required key 'data.train'");
  Loaded c = Load(std::string(kInit) + "data: {train: t}\ntrain:\n");
  EXPECT_CONFIG_ERROR(c, "c.yaml:13:1: missing required key 'train.steps'");
  Loaded d = Load(std::string(kRest));
  EXPECT_CONFIG_ERROR(d, "c.yaml:1:1: missing required key 'model.path' or 'model.init'");
  Loaded e = Load("model:\n  init: {hidden: 8}\n" + std::string(kRest));
  EXPECT_CONFIG_ERROR(e, "c.yaml:2:3: missing required key 'model.init.family'");
  Loaded f = Load("model:\n  init: {family: gpt2}\n" + std::string(kRest));
  EXPECT_CONFIG_ERROR(f,
                      "c.yaml:2:18: model.init.family must be one of "
                      "mixtral|qwen2_moe|qwen3_moe|olmoe|glm4_moe|deepseek_v3|gpt_oss (got 'gpt2')");
  Loaded g = Load(Minimal() + "memory:\n  overrides:\n    - {params: host}\n");
  EXPECT_CONFIG_ERROR(g, "c.yaml:18:7: missing required key 'memory.overrides[0].match'");
  Loaded h = Load(Minimal() + "memory:\n  overrides:\n    - {match: x, parms: host}\n");
  EXPECT_CONFIG_ERROR(h, "c.yaml:18:18: unknown key 'memory.overrides[0].parms' (did you mean 'params'?)");
  Loaded i = Load(Minimal() + "memory:\n  overrides:\n    - {match: x}\n");
  EXPECT_CONFIG_ERROR(i, "c.yaml:18:7: memory.overrides[0] decides nothing");
}

// issue 13: an error between two keys names both places, and is blamed on the
// override that made the pair inconsistent rather than on the file's line.
TEST(ConfigErrors, CrossKeyErrorsNameBothPlaces) {
  Loaded a = Load(Minimal() + "  warmup: 200\n");  // both in the file: blamed on warmup, steps named too
  EXPECT_CONFIG_ERROR(a,
                      "c.yaml:16:3: train.warmup (200) must be <= train.steps (100); train.steps is set at ",
                      "c.yaml:15:3");
  Loaded b = Load(Minimal() + "  min_lr: 1\n");  // the other one not given: said so
  EXPECT_CONFIG_ERROR(
      b, "c.yaml:16:3: train.min_lr (1) must be <= train.lr (0.0001); train.lr is not set: its default");
  Loaded c = Load(std::string(kInit) + "    max_seq: 64\n" + kRest);
  EXPECT_CONFIG_ERROR(
      c, "c.yaml:12:5: data.seq_len (256) exceeds model.init.max_seq (64); data.seq_len is not set");
  Loaded d = Load(Minimal() + "memory:\n  pinned_limit: 8GiB\n  host_limit: 4GiB\n");
  EXPECT_CONFIG_ERROR(d,
                      "c.yaml:17:3: memory.pinned_limit (8.00 GiB) must be <= memory.host_limit (4.00 GiB); ",
                      "memory.host_limit is set at ", "c.yaml:18:3");
}

// Keys only Qwen's decoder reads are refused for the other families, which
// would ignore them (every Mixtral and OLMoE layer is MoE).
TEST(ConfigErrors, QwenOnlyKeysForOtherFamilies) {
  Loaded a = Load(Minimal(), {"model.init.mlp_only_layers=[0]"});
  EXPECT_CONFIG_ERROR(a,
                      "command line: model.init.mlp_only_layers=[0]: model.init.mlp_only_layers is a "
                      "qwen2_moe / qwen3_moe key: every layer of mixtral is MoE");
  Loaded b = Load(Minimal(), {"model.init.family=olmoe", "model.init.decoder_sparse_step=2"});
  EXPECT_CONFIG_ERROR(
      b, "model.init.decoder_sparse_step is a qwen2_moe / qwen3_moe key: every layer of olmoe is MoE");
  Loaded q = Load(Minimal(), {"model.init.family=qwen3_moe", "model.init.mlp_only_layers=[0]"});
  EXPECT_EQ(q.st, MF_OK) << q.err;
  Loaded none = Load(Minimal(), {"model.init.mlp_only_layers=[]"});
  EXPECT_EQ(none.st, MF_OK) << none.err;
}

// GLM-4.5's keys: read for glm4_moe, refused (naming the key) for a family
// whose decoder would ignore them; its loss has no aux term.
TEST(ConfigErrors, GlmOnlyKeysForOtherFamilies) {
  Loaded a = Load(Minimal(), {"model.init.n_group=2"});
  EXPECT_CONFIG_ERROR(a, "model.init.n_group is a glm4_moe / deepseek_v3 key: mixtral does not read it");
  Loaded b = Load(Minimal(), {"model.init.family=qwen3_moe", "model.init.partial_rotary=0.5"});
  EXPECT_CONFIG_ERROR(b, "model.init.partial_rotary is a glm4_moe key: qwen3_moe does not read it");
  Loaded g =
      Load(Minimal(), {"model.init.family=glm4_moe", "model.init.head_dim=16", "model.init.n_group=2",
                       "model.init.topk_group=1", "model.init.routed_scaling=2.5", "model.init.first_dense=1",
                       "model.init.dense_ffn=32", "model.init.shared_ffn=32"});
  ASSERT_EQ(g.st, MF_OK) << g.err;
  const mf_model_spec &s = g.cfg->model.init;
  EXPECT_EQ(s.router, MF_ROUTER_SIGMOID_GROUP);
  EXPECT_EQ(s.n_group, 2);
  EXPECT_EQ(s.topk_group, 1);
  EXPECT_EQ(s.routed_scaling, 2.5);
  EXPECT_EQ(s.first_dense, 1);
  EXPECT_EQ(s.partial_rotary, 0.5);
  EXPECT_EQ(mf_model_spec_rope_dim(&s), 8);
  EXPECT_EQ(g.cfg->train.aux_loss_coef, 0.0) << "GLM-4.5's loss has no aux term";
  Loaded odd = Load(Minimal(), {"model.init.family=glm4_moe", "model.init.head_dim=6"});
  EXPECT_CONFIG_ERROR(odd, "RoPE rotates int(head_dim 6 * partial_rotary_factor 0.5) = 3 dims");
  Loaded groups = Load(Minimal(), {"model.init.family=glm4_moe", "model.init.n_group=3"});
  EXPECT_CONFIG_ERROR(groups, "n_group 3 must divide the");
}

// DeepSeek-V3's keys: read for deepseek_v3 (head_dim is nope + rope), refused
// for a family that does not read them; its LoRA targets reach the latent
// attention's projections.
TEST(ConfigErrors, DeepseekOnlyKeysForOtherFamilies) {
  Loaded a = Load(Minimal(), {"model.init.kv_lora_rank=16"});
  EXPECT_CONFIG_ERROR(a, "model.init.kv_lora_rank is a deepseek_v3 key: mixtral does not read it");
  Loaded d =
      Load(Minimal(), {"model.init.family=deepseek_v3", "model.init.kv_heads=4", "model.init.q_lora_rank=16",
                       "model.init.kv_lora_rank=16", "model.init.qk_nope_dim=8", "model.init.qk_rope_dim=4",
                       "model.init.v_head_dim=6", "model.init.n_group=1", "model.init.topk_group=1",
                       "model.init.first_dense=0", "train.lora.rank=4",
                       "train.lora.targets=[q_a_proj, kv_a_proj_with_mqa, kv_b_proj]"});
  ASSERT_EQ(d.st, MF_OK) << d.err;
  const mf_model_spec &s = d.cfg->model.init;
  EXPECT_EQ(s.head_dim, 12);
  EXPECT_EQ(mf_model_spec_v_dim(&s), 6);
  EXPECT_EQ(mf_model_spec_rope_dim(&s), 4);
  EXPECT_EQ(s.rope_interleave, 1) << "DeepseekV3Config's default";
  EXPECT_STREQ(d.cfg->train.lora.targets[1], "kv_a_proj_with_mqa");
  Loaded kv =
      Load(Minimal(), {"model.init.family=deepseek_v3", "model.init.kv_heads=2", "model.init.n_group=1",
                       "model.init.topk_group=1", "model.init.first_dense=0"});
  EXPECT_CONFIG_ERROR(kv, "latent attention makes a key and a value for each of the 4 heads");
}

// train.lora (issue 18): read and checked; names at their places.
TEST(ConfigLoad, LoraDefaultsAndValues) {
  Loaded off = Load(Minimal());
  ASSERT_EQ(off.st, MF_OK) << off.err;
  const mf_config_lora *d = &off.cfg->train.lora;
  EXPECT_EQ(d->rank, 0);
  EXPECT_TRUE(std::isnan(d->alpha));
  EXPECT_EQ(d->dropout, 0.0);
  ASSERT_EQ(d->n_targets, 4);
  EXPECT_STREQ(d->targets[0], "q_proj");
  EXPECT_STREQ(d->targets[3], "o_proj");
  EXPECT_EQ(d->experts, MF_CONFIG_LORA_EXPERTS_ALL);
  EXPECT_EQ(d->hot_fraction, 0.25);
  EXPECT_EQ(d->train_router, 0);
  Loaded on = Load(Minimal() +
                   "  lora:\n    rank: 16\n    alpha: 32\n    dropout: 0.05\n"
                   "    targets: [q_proj, v_proj, w1, w2, w3]\n    experts: hot\n"
                   "    hot_fraction: 0.5\n    train_router: true\n");
  ASSERT_EQ(on.st, MF_OK) << on.err;
  const mf_config_lora *l = &on.cfg->train.lora;
  EXPECT_EQ(l->rank, 16);
  EXPECT_EQ(l->alpha, 32.0);
  EXPECT_EQ(l->dropout, 0.05);
  ASSERT_EQ(l->n_targets, 5);
  EXPECT_STREQ(l->targets[4], "w3");
  EXPECT_EQ(l->experts, MF_CONFIG_LORA_EXPERTS_HOT);
  EXPECT_EQ(l->train_router, 1);
  // Printed and read back: the same config.
  char *text = nullptr;
  size_t len = 0;
  FILE *f = open_memstream(&text, &len);
  ASSERT_EQ(mf_config_print(on.cfg, f), MF_OK);
  fclose(f);
  Loaded back = Load(std::string(text, len), {}, "printed.yaml");
  free(text);
  ASSERT_EQ(back.st, MF_OK) << back.err;
  const char *keys[64];
  EXPECT_EQ(mf_config_diff(on.cfg, back.cfg, keys, 64), 0u);
}

TEST(ConfigErrors, LoraTargetsAndRank) {
  Loaded a = Load(Minimal() + "  lora:\n    rank: 8\n    targets: [q_proj, qproj]\n");
  EXPECT_CONFIG_ERROR(
      a,
      "c.yaml:18:23: train.lora.targets[1] must be one of q_proj|k_proj|v_proj|o_proj|gate_proj|"
      "up_proj|down_proj|w1|w2|w3|q_a_proj|q_b_proj|kv_a_proj_with_mqa|kv_b_proj (got 'qproj')");
  Loaded b = Load(Minimal() + "  lora:\n    rank: 8\n    targets: [v_proj, v_proj]\n");
  EXPECT_CONFIG_ERROR(b, "c.yaml:18:23: train.lora.targets[1]: v_proj is named twice");
  Loaded c = Load(Minimal() + "  lora:\n    rank: 8\n    targets: [gate_proj]\n");
  EXPECT_CONFIG_ERROR(c,
                      "train.lora.targets[0]: mixtral names its experts' projections w1 (gate), w3 (up) and "
                      "w2 (down), not gate_proj");
  Loaded d = Load(Minimal(), {"model.init.family=qwen3_moe", "train.lora.rank=4", "train.lora.targets=[w2]"});
  EXPECT_CONFIG_ERROR(d,
                      "command line: train.lora.targets=[w2]: train.lora.targets[0]: qwen3_moe names its MLP "
                      "projections gate_proj, up_proj and down_proj; w2 is Mixtral's");
  Loaded f = Load(Minimal(), {"train.lora.rank=8", "train.lora.dropout=1"});
  EXPECT_CONFIG_ERROR(f, "train.lora.dropout");
  Loaded g = Load(Minimal(), {"train.lora.rank=8", "train.lora.targets=q_proj"});
  EXPECT_CONFIG_ERROR(g, "train.lora.targets must be a list of module names like [q_proj, v_proj] (got ");
  Loaded q = Load(Minimal(), {"model.init.family=qwen3_moe", "train.lora.rank=4",
                              "train.lora.targets=[q_proj, gate_proj, up_proj, down_proj]"});
  EXPECT_EQ(q.st, MF_OK) << q.err;
}

TEST(ConfigOverrides, CrossKeyErrorsBlameTheOverride) {
  const std::string warm = Minimal() + "  warmup: 30\n";
  Loaded a = Load(warm, {"train.steps=20"});  // was blamed on the file's warmup line
  EXPECT_CONFIG_ERROR(a, "command line: train.steps=20: train.warmup (30) must be <= train.steps (20); ",
                      "train.warmup is set at ", "c.yaml:16:3");
  EXPECT_EQ(a.err.rfind("command line: ", 0), 0u) << a.err;
  Loaded b = Load(warm, {"train.lr=1e-3", "train.warmup=50", "train.steps=40"});  // the later override
  EXPECT_CONFIG_ERROR(b, "command line: train.steps=40: train.warmup (50) must be <= train.steps (40); ",
                      "train.warmup is set by override 2 'train.warmup=50'");
  Loaded c = Load(warm, {"train.steps=40", "train.warmup=50"});
  EXPECT_CONFIG_ERROR(c,
                      "command line: train.warmup=50: ", "train.steps is set by override 1 'train.steps=40'");
  Loaded d = Load(Minimal() + "  min_lr: 1e-4\n", {"train.lr=1e-5"});
  EXPECT_CONFIG_ERROR(d, "command line: train.lr=1e-5: train.min_lr (0.0001) must be <= train.lr (1e-05); ",
                      "train.min_lr is set at ", "c.yaml:16:3");
  Loaded e = Load(std::string(kInit) + "    max_seq: 512\n" + kRest, {"data.seq_len=1024"});
  EXPECT_CONFIG_ERROR(
      e, "command line: data.seq_len=1024: data.seq_len (1024) exceeds model.init.max_seq (512); ",
      "model.init.max_seq is set at ", "c.yaml:12:5");
  Loaded f = Load(Minimal(), {"model.init.experts=1"});
  EXPECT_CONFIG_ERROR(
      f, "command line: model.init.experts=1: model.init.top_k (2) exceeds model.init.experts (1); ",
      "model.init.top_k is set at ", "c.yaml:9:5");
  Loaded g = Load(Minimal() + "memory: {pinned_limit: 2GiB}\n", {"memory.host_limit=1GiB"});
  EXPECT_CONFIG_ERROR(g, "command line: memory.host_limit=1GiB: memory.pinned_limit (2.00 GiB) must be <= ",
                      "memory.pinned_limit is set at ", "c.yaml:16:10");
  Loaded h = Load(Minimal(), {"model.init.heads=3"});
  EXPECT_CONFIG_ERROR(h, "command line: model.init.heads=3: ");
}

// A required key missing because an override emptied or replaced its section
// is blamed on that override, not on the section's line in the file.
TEST(ConfigOverrides, MissingKeysBlameTheOverrideThatRemovedThem) {
  Loaded a = Load(Minimal(), {"train="});
  EXPECT_CONFIG_ERROR(a, "command line: train=: missing required key 'train.steps'");
  Loaded b = Load(Minimal(), {"train={lr: 1e-3}"});
  EXPECT_CONFIG_ERROR(b, "command line: train={lr: 1e-3}: missing required key 'train.steps'");
  Loaded c = Load(Minimal(), {"data=null"});
  EXPECT_CONFIG_ERROR(c, "command line: data=null: missing required key 'data.train'");
  Loaded d = Load(Minimal(), {"model="});
  EXPECT_CONFIG_ERROR(d, "command line: model=: missing required key 'model.path' or 'model.init'");
  Loaded e = Load(Minimal(), {"model.init={hidden: 8}"});
  EXPECT_CONFIG_ERROR(e, "command line: model.init={hidden: 8}: missing required key 'model.init.family'");
  Loaded f = Load(Minimal(), {"model.init=null", "model.path=/m"});  // a switch, as the message suggests
  EXPECT_EQ(f.st, MF_OK) << f.err;
}

// Where each value came from stays with the config, for checks made later
// (eval's data.seq_len against the model it loads).
TEST(ConfigOverrides, WhereEachValueCameFrom) {
  Loaded a = Load(Minimal() + "  lr: 1e-3\n", {"train.steps=7"});
  ASSERT_EQ(a.st, MF_OK) << a.err;
  const char *lr = mf_config_where(a.cfg, "train.lr"), *steps = mf_config_where(a.cfg, "train.steps");
  ASSERT_NE(lr, nullptr);
  EXPECT_NE(std::string(lr).find("c.yaml:16:3"), std::string::npos) << lr;
  ASSERT_NE(steps, nullptr);
  EXPECT_STREQ(steps, "command line: train.steps=7");
  EXPECT_EQ(mf_config_where(a.cfg, "data.seq_len"), nullptr);  // its default
  EXPECT_EQ(mf_config_where(a.cfg, "no.such.key"), nullptr);
  EXPECT_EQ(mf_config_where(nullptr, "train.lr"), nullptr);
}

TEST(ConfigErrors, TabIndentationSaysSo) {
  Loaded a = Load("model:\n  init:\n  \tfamily: mixtral\n");
  EXPECT_CONFIG_ERROR(a, "c.yaml:3:3: YAML syntax error: tabs are not allowed for indentation in YAML",
                      "(in 'model.init')");
  Loaded b = Load("model:\n  init: {family: mixtral}\n\ttrain: 1\n");
  EXPECT_CONFIG_ERROR(b, "c.yaml:3:1: YAML syntax error: tabs are not allowed for indentation in YAML");
  // after a multi-byte character the column counts characters, and the tab is still found
  Loaded c = Load("model:\n  path: \xc3\xa9t\xc3\xa9\n\tdata: 1\n");
  EXPECT_CONFIG_ERROR(c, "c.yaml:3:1: YAML syntax error: tabs are not allowed for indentation in YAML");
  Loaded d = Load(Minimal() + "  lr:\t1e-3\n");  // a tab after the colon separates, as a space does
  EXPECT_EQ(d.st, MF_OK) << d.err;
}

// A size that is a fraction of a byte says so and what would be accepted.
TEST(ConfigErrors, FractionalSizesSayWhy) {
  Loaded a = Load(Minimal(), {"memory.device_budget=1.3MiB"});
  EXPECT_CONFIG_ERROR(
      a,
      "command line: memory.device_budget=1.3MiB: memory.device_budget must be a whole number of bytes "
      "(got '1.3MiB' = 1363148.8 bytes): write e.g. 1331KiB or 1363148");
  Loaded b = Load(Minimal() + "memory: {host_limit: 0.5}\n");
  EXPECT_CONFIG_ERROR(
      b,
      "c.yaml:16:22: memory.host_limit must be a whole number of bytes (got '0.5' = 0.5 bytes): "
      "write e.g. 1");
  Loaded c = Load(Minimal(), {"memory.device_budget=1.5MiB"});  // whole bytes: fine
  ASSERT_EQ(c.st, MF_OK) << c.err;
  EXPECT_EQ(c.cfg->memory.device_budget, 3ull << 19);
  Loaded d = Load(Minimal(), {"memory.device_budget=12 parsecs"});  // not a size at all: the general message
  EXPECT_CONFIG_ERROR(
      d, "memory.device_budget must be a size such as 24GiB or 512MiB, or auto (got '12 parsecs')");
}

TEST(ConfigErrors, PathAndInitTogether) {
  Loaded r = Load(std::string(kInit) + "  path: /m\n" + kRest);
  EXPECT_CONFIG_ERROR(r, "c.yaml:12:3: give exactly one of 'model.path' and 'model.init' (the other is at ",
                      "c.yaml:2:3); override the other with null");
}

TEST(ConfigErrors, YamlSyntax) {
  Loaded a = Load(Minimal() + "  lr: [1, 2\n");
  EXPECT_CONFIG_ERROR(a, "c.yaml:17:1: YAML syntax error: did not find expected ',' or ']'");
  Loaded b = Load("model:\n  init: {family: mixtral}\n bad: 1\n");
  EXPECT_CONFIG_ERROR(b, "c.yaml:3:", "YAML syntax error");
  Loaded c = Load("model:\n\tinit: 1\n");
  EXPECT_CONFIG_ERROR(c, "c.yaml:2:1: YAML syntax error: tabs are not allowed for indentation in YAML");
  Loaded d = Load("train: {steps: 1\n");
  EXPECT_CONFIG_ERROR(d, "c.yaml:2:1: YAML syntax error");
  Loaded e = Load("data: 'unterminated\n");
  EXPECT_CONFIG_ERROR(e, "c.yaml:2:1: YAML syntax error: found unexpected end of stream");
}

TEST(ConfigErrors, AliasesAndTagsAreRejectedClearly) {
  Loaded a = Load(Minimal() + "  lr: &x 1e-4\n  min_lr: *x\n");
  EXPECT_CONFIG_ERROR(a, "c.yaml:17:11: aliases (*x) are not supported", "(in 'train.min_lr')");
  Loaded b = Load(Minimal() + "  lr: !!float 1e-4\n");
  EXPECT_CONFIG_ERROR(b, "c.yaml:16:7: YAML tags (tag:yaml.org,2002:float) are not supported",
                      "(in 'train.lr')");
  Loaded c = Load("---\n" + Minimal() + "---\nother: 1\n");
  EXPECT_CONFIG_ERROR(c, "c.yaml:17:1: a second YAML document");
  Loaded d = Load("? [a, b]\n: 1\n");
  EXPECT_CONFIG_ERROR(d, "c.yaml:1:3: a map key must be a plain name, not a list");
}

TEST(ConfigErrors, EmptyBinaryAndNonUtf8Files) {
  Loaded a = Load("", {}, "empty.yaml");
  EXPECT_CONFIG_ERROR(a, "empty.yaml:1:1: the config is empty");
  Loaded b = Load("# only a comment\n\n", {}, "comment.yaml");
  EXPECT_CONFIG_ERROR(b, "comment.yaml:1:1: the config is empty");
  Loaded c = Load("---\n...\n", {}, "null.yaml");
  EXPECT_CONFIG_ERROR(c, "null.yaml:1:1: the config is empty");
  Loaded d = Load(std::string("model:\n  path: ab\0cd\n", 19), {}, "nul.yaml");
  EXPECT_CONFIG_ERROR(d, "nul.yaml:2:11: NUL byte: a binary file");
  Loaded e = Load("model:\n  path: caf\xe9\n", {}, "latin1.yaml");
  EXPECT_CONFIG_ERROR(e, "latin1.yaml:2:12: not UTF-8 text (byte 0xe9)");
  Loaded f = Load(std::string("\x89PNG\r\n\x1a\n\0\0\0\rIHDR", 16), {}, "img.yaml");
  EXPECT_CONFIG_ERROR(f, "img.yaml:1:1: not UTF-8 text (byte 0x89)");
  Loaded g = Load(
      "model:\n  path: a\x01"
      "b\n",
      {}, "ctl.yaml");
  EXPECT_CONFIG_ERROR(g, "ctl.yaml:2:10: not a YAML file: control characters are not allowed");
  Loaded h = Load("\xef\xbb\xbf" + Minimal(), {}, "bom.yaml");  // a UTF-8 BOM is fine
  EXPECT_EQ(h.st, MF_OK) << h.err;
  Loaded i = Load("model:\n  path: \xc3\xa9t\xc3\xa9\n" + std::string(kRest), {}, "utf8.yaml");
  ASSERT_EQ(i.st, MF_OK) << i.err;
  EXPECT_STREQ(i.cfg->model.path, "\xc3\xa9t\xc3\xa9");
}

TEST(ConfigErrors, DeepNesting) {
  std::string deep(100000, '[');
  Loaded a = Load("model: " + deep + "\n", {}, "deep.yaml");
  EXPECT_CONFIG_ERROR(a, "deep.yaml:1:39: nested deeper than 32 levels");
  std::string block;
  for (int i = 0; i < 40; i++) block += std::string(2 * i, ' ') + "k" + std::to_string(i) + ":\n";
  Loaded b = Load(block, {}, "deep2.yaml");
  EXPECT_CONFIG_ERROR(b, "deep2.yaml:33:", "nested deeper than 32 levels", "(in 'k0.k1.k2");
}

TEST(ConfigErrors, UnreadableFile) {
  Loaded a = LoadPath(TmpPath("does-not-exist.yaml"));
  EXPECT_EQ(a.st, MF_ERR_IO);
  EXPECT_NE(a.err.find("does-not-exist.yaml: cannot open the config"), std::string::npos) << a.err;
  Loaded b = LoadPath(getenv("TEST_TMPDIR") ? getenv("TEST_TMPDIR") : "/tmp");
  EXPECT_EQ(b.st, MF_ERR_IO) << b.err;
  EXPECT_NE(b.err.find(": not a regular file but a directory; a config is read only from a regular file"),
            std::string::npos)
      << b.err;
  Loaded c = Load(std::string(5 << 20, '#'), {}, "huge.yaml");
  EXPECT_CONFIG_ERROR(c, "huge.yaml: 5242880 bytes is too large for a config");
}

// --------------------------------------------------------- overrides

TEST(ConfigOverrides, ApplyAfterTheFile) {
  Loaded a = Load(std::string(kInit) + "data: {train: t, valid: v}\ntrain: {steps: 10, lr: 1e-3}\n",
                  {"train.lr=1e-4", "memory.device_budget=4GiB", "model.init.layers=4", "data.valid=null",
                   "hardware.profile=configs/hw/x.yaml", "train.schedule='constant'", "train.lr=2e-4",
                   "model.init.mlp_only_layers=[]", "output.dir=", "output.dir=\"out dir\""});
  ASSERT_EQ(a.st, MF_OK) << a.err;
  EXPECT_DOUBLE_EQ(a.cfg->train.lr, 2e-4);  // the last one wins
  EXPECT_EQ(a.cfg->memory.device_budget, 4ull << 30);
  EXPECT_EQ(a.cfg->model.init.layers, 4);
  EXPECT_EQ(a.cfg->data.valid, nullptr);
  EXPECT_STREQ(a.cfg->hardware.profile, "configs/hw/x.yaml");
  EXPECT_EQ(a.cfg->train.schedule, MF_CONFIG_SCHEDULE_CONSTANT);
  EXPECT_STREQ(a.cfg->output.dir, "out dir");
  EXPECT_EQ(a.cfg->train.steps, 10);
}

TEST(ConfigOverrides, ReplaceWholeEntriesAndSwitchModels) {
  Loaded a = Load(Minimal() + "  lr: 1e-3\n", {"train={steps: 5}"});
  ASSERT_EQ(a.st, MF_OK) << a.err;
  EXPECT_EQ(a.cfg->train.steps, 5);
  EXPECT_DOUBLE_EQ(a.cfg->train.lr, 1e-4);  // the file's train map was replaced
  Loaded b = Load(Minimal(), {"model.path=/ckpt", "model.init=null"});
  ASSERT_EQ(b.st, MF_OK) << b.err;
  EXPECT_STREQ(b.cfg->model.path, "/ckpt");
  EXPECT_FALSE(b.cfg->model.has_init);
  Loaded c = Load(Minimal(), {"memory.overrides=[{match: 'x.*', grads: host}]"});
  ASSERT_EQ(c.st, MF_OK) << c.err;
  ASSERT_EQ(c.cfg->memory.n_overrides, 1u);
  EXPECT_STREQ(c.cfg->memory.overrides[0].grads, "host");
  EXPECT_STREQ(c.cfg->memory.overrides[0].where,
               "command line: memory.overrides=[{match: 'x.*', grads: host}]");
  Loaded d = Load("model:\n" + std::string(kRest), {"model.init.family=olmoe", "model.init.layers=2"});
  ASSERT_EQ(d.st, MF_OK) << d.err;
  EXPECT_EQ(d.cfg->model.init.family, MF_FAMILY_OLMOE);
  EXPECT_EQ(d.cfg->model.init.layers, 2);
  EXPECT_EQ(d.cfg->model.init.hidden, 2048);  // OLMoE's default
}

TEST(ConfigOverrides, Errors) {
  Loaded a = Load(Minimal(), {"train.lr=bogus"});
  EXPECT_CONFIG_ERROR(a, "command line: train.lr=bogus: train.lr must be a number (got 'bogus')");
  EXPECT_EQ(a.err.rfind("command line: ", 0), 0u) << a.err;
  Loaded b = Load(Minimal(), {"train.lrr=1"});
  EXPECT_CONFIG_ERROR(b, "command line: train.lrr=1: unknown key 'train.lrr' (did you mean 'train.lr'?)");
  Loaded c = Load(Minimal(), {"train.micro_batch=0"});
  EXPECT_CONFIG_ERROR(
      c, "command line: train.micro_batch=0: train.micro_batch must be in [1, 1048576] (got '0')");
  Loaded d = Load(Minimal(), {"train.lr"});
  EXPECT_CONFIG_ERROR(d, "command line: 'train.lr': an override is key.path=value");
  Loaded e = Load(Minimal(), {"model.path=/ckpt"});
  EXPECT_CONFIG_ERROR(e, "command line: model.path=/ckpt: give exactly one of 'model.path' and 'model.init'",
                      "(the other is at ", "c.yaml:2:3)");
  Loaded f = Load(Minimal(), {"train.lr=[1"});
  EXPECT_CONFIG_ERROR(f, "command line: train.lr=[1: not a valid YAML value");
  Loaded g = Load(Minimal(), {"train.warmup=1000"});
  EXPECT_CONFIG_ERROR(g, "command line: train.warmup=1000: train.warmup (1000) must be <= train.steps (100)");
  Loaded h = Load(Minimal() + "hardware: auto\n", {"hardware.profile=x"});
  EXPECT_CONFIG_ERROR(h, "command line: hardware.profile=x: cannot set 'hardware.profile': 'hardware' at ",
                      "c.yaml:16:11 is 'auto', not a map");
  Loaded i = Load(Minimal(), {"=1"});
  EXPECT_CONFIG_ERROR(i, "an override is key.path=value");
  Loaded m = Load(Minimal(), {"hardware.profile.x=1"});
  EXPECT_CONFIG_ERROR(m, "unknown key 'hardware.profile.x' (known keys in 'hardware': profile)");
  Loaded j = Load(Minimal(), {"trian.steps=5"});
  EXPECT_CONFIG_ERROR(j, "unknown key 'trian.steps' (did you mean 'train.steps'?)");
  Loaded k = Load(Minimal(), {"train.lr=\xff"});
  EXPECT_CONFIG_ERROR(k, "command line: train.lr=\xff: not UTF-8 text");
  Loaded l = Load(Minimal(), {"data.train=null"});
  EXPECT_CONFIG_ERROR(l, "command line: data.train=null: data.train must be a string (got null)");
}

// -------------------------------------------------------- round trip

std::string Print(const mf_config *c) {
  char *buf = nullptr;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  EXPECT_EQ(mf_config_print(c, f), MF_OK);
  fclose(f);
  std::string s(buf, len);
  free(buf);
  return s;
}

void ExpectRoundTrip(const std::string &text, const std::vector<std::string> &ovs = {}) {
  Loaded a = Load(text, ovs, "rt.yaml");
  ASSERT_EQ(a.st, MF_OK) << a.err;
  std::string printed = Print(a.cfg);
  Loaded b = Load(printed, {}, "rt2.yaml");
  ASSERT_EQ(b.st, MF_OK) << b.err << "\n" << printed;
  EXPECT_TRUE(mf_config_equal(a.cfg, b.cfg)) << printed;
  std::string again = Print(b.cfg);
  // the same text, but for the first line that names the source
  EXPECT_EQ(printed.substr(printed.find('\n')), again.substr(again.find('\n')));
}

TEST(ConfigPrint, RoundTrips) {
  ExpectRoundTrip(Minimal());
  ExpectRoundTrip(kFull);
  ExpectRoundTrip(
      "model: {path: \"/models/a b: c #d\"}\n" + std::string(kRest) +
      "output: {dir: \"t\\u00e9st\\ttab\\\"q\\\\\"}\nmemory: {host_limit: 1000001, nvme_dir: \"null\"}\n");
  ExpectRoundTrip(Minimal(), {"train.lr=0.1", "train.min_lr=1e-300", "memory.pinned_limit=1536MiB",
                              "data.train='123'", "hardware.profile=yes", "train.aux_loss_coef=0"});
}

// optimizer: device in memory.overrides is kept as written (the planner checks
// and applies it, planner/plan_io.h), from the file or the command line, and
// prints and loads back the same.
TEST(ConfigPrint, OptimizerDeviceOverrideIsKeptAsWritten) {
  const std::string text =
      Minimal() + "memory:\n  overrides:\n    - {match: \"model.layers.*\", optimizer: device}\n";
  Loaded a = Load(text);
  ASSERT_EQ(a.st, MF_OK) << a.err;
  ASSERT_EQ(a.cfg->memory.n_overrides, 1u);
  EXPECT_STREQ(a.cfg->memory.overrides[0].match, "model.layers.*");
  EXPECT_STREQ(a.cfg->memory.overrides[0].optimizer, "device");
  EXPECT_EQ(a.cfg->memory.overrides[0].params, nullptr);  // what device needs is the planner's to pin
  EXPECT_EQ(a.cfg->memory.overrides[0].grads, nullptr);
  EXPECT_NE(Print(a.cfg).find("optimizer: device"), std::string::npos) << Print(a.cfg);
  ExpectRoundTrip(text);
  Loaded b = Load(Minimal(), {"memory.overrides=[{match: \"*.self_attn.*\", optimizer: device}]"});
  ASSERT_EQ(b.st, MF_OK) << b.err;
  ASSERT_EQ(b.cfg->memory.n_overrides, 1u);
  EXPECT_STREQ(b.cfg->memory.overrides[0].optimizer, "device");
  EXPECT_NE(std::string(b.cfg->memory.overrides[0].where).find("command line"), std::string::npos)
      << b.cfg->memory.overrides[0].where;
  ExpectRoundTrip(Minimal(), {"memory.overrides=[{match: \"*.self_attn.*\", optimizer: device}]"});
}

TEST(ConfigPrint, WritesEveryDefault) {
  Loaded a = Load(Minimal());
  ASSERT_EQ(a.st, MF_OK) << a.err;
  std::string s = Print(a.cfg);
  for (const char *want :
       {"\nmodel:\n  init:\n    family: mixtral\n", "    head_dim: 16\n", "    rope_theta: 1000000.0\n",
        "    mlp_only_layers: []\n", "  lr: 0.0001\n", "  schedule: cosine\n", "  device_budget: auto\n",
        "  nvme_dir: null\n", "  overrides: []\n", "  dir: runs/rt\n", "\nbackend: auto\n", "  valid: null\n",
        "  aux_loss_coef: 0.001\n"}) {
    if (std::string(want) == "  dir: runs/rt\n") continue;  // name differs here
    EXPECT_NE(s.find(want), std::string::npos) << "missing '" << want << "' in\n" << s;
  }
  Loaded b = Load("model: {path: /m}\n" + std::string(kRest));
  ASSERT_EQ(b.st, MF_OK) << b.err;
  std::string t = Print(b.cfg);
  EXPECT_NE(t.find("model:\n  path: /m\n\n"), std::string::npos) << t;
  EXPECT_NE(t.find("  aux_loss_coef: null\n"), std::string::npos) << t;
  EXPECT_EQ(mf_config_print(nullptr, stdout), MF_ERR_INVALID_ARG);
}

TEST(ConfigPrint, KeyListHasEveryKeyWithItsDefault) {
  char *buf = nullptr;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  mf_config_print_keys(f);
  fclose(f);
  std::string s(buf, len);
  free(buf);
  for (const char *want : {"train.lr", "1e-4", "data.train", "(required)", "memory.device_budget", "backend",
                           "model.init.mlp_only_layers", "auto|cpu|cuda", "memory.overrides"})
    EXPECT_NE(s.find(want), std::string::npos) << want << "\n" << s;
  int lines = 0;
  for (char ch : s) lines += ch == '\n';
  EXPECT_GT(lines, 50);
}

// ----------------------------------------------------------- memory.plan

TEST(ConfigMemoryPlan, WordsAndPlanFiles) {
  Loaded d = Load(Minimal());
  ASSERT_EQ(d.st, MF_OK) << d.err;
  EXPECT_STREQ(d.cfg->memory.plan, "auto");
  EXPECT_EQ(d.cfg->memory.plan_kind, MF_CONFIG_PLAN_AUTO);
  const struct {
    const char *word;
    mf_config_plan kind;
  } words[] = {{"auto", MF_CONFIG_PLAN_AUTO},
               {"resident", MF_CONFIG_PLAN_RESIDENT},
               {"zero_offload", MF_CONFIG_PLAN_ZERO_OFFLOAD},
               {"megatrain", MF_CONFIG_PLAN_MEGATRAIN},
               {"checkpoint", MF_CONFIG_PLAN_CHECKPOINT},
               {"least_memory", MF_CONFIG_PLAN_LEAST_MEMORY}};
  for (const auto &w : words) {
    Loaded r = Load(Minimal() + "memory:\n  plan: " + w.word + "\n");
    ASSERT_EQ(r.st, MF_OK) << r.err;
    EXPECT_EQ(r.cfg->memory.plan_kind, w.kind) << w.word;
    EXPECT_STREQ(mf_config_plan_word(w.kind), w.word);
  }
  EXPECT_EQ(mf_config_plan_word(MF_CONFIG_PLAN_FILE), nullptr);
  // A path ending in .json is a plan file, kept as written (as every path is).
  Loaded f = Load(Minimal(), {"memory.plan=runs/plans/demo plan.json"});
  ASSERT_EQ(f.st, MF_OK) << f.err;
  EXPECT_EQ(f.cfg->memory.plan_kind, MF_CONFIG_PLAN_FILE);
  EXPECT_STREQ(f.cfg->memory.plan, "runs/plans/demo plan.json");
  ExpectRoundTrip(Minimal(), {"memory.plan=runs/plans/demo plan.json"});
  ExpectRoundTrip(Minimal(), {"memory.plan=zero_offload"});
  // Printed with every default.
  EXPECT_NE(Print(d.cfg).find("  plan: auto\n"), std::string::npos) << Print(d.cfg);
}

TEST(ConfigMemoryPlan, UnknownWordsAreErrorsListingTheChoices) {
  Loaded a = Load(Minimal() + "memory:\n  plan: megatrian\n", {}, "x.yaml");
  EXPECT_CONFIG_ERROR(
      a,
      "x.yaml:17:9: memory.plan must be auto, resident, zero_offload, megatrain, checkpoint, "
      "least_memory or a plan file ending in .json (got 'megatrian') (did you mean 'megatrain'?)");
  Loaded b = Load(Minimal(), {"memory.plan=bogus"});
  EXPECT_CONFIG_ERROR(b, "command line: memory.plan=bogus: memory.plan must be auto,", "(got 'bogus')");
  EXPECT_EQ(b.err.find("did you mean"), std::string::npos) << b.err;
  Loaded c = Load(Minimal(), {"memory.plan=plan.yaml"});
  EXPECT_CONFIG_ERROR(c, "a plan file ending in .json (got 'plan.yaml')");
  Loaded e = Load(Minimal(), {"memory.plan=.json"});
  EXPECT_CONFIG_ERROR(e, "(got '.json')");
  Loaded n = Load(Minimal(), {"memory.plan=null"});
  EXPECT_CONFIG_ERROR(n, "memory.plan must be a string (got null)");
  Loaded m = Load(Minimal(), {"memory.plan=[resident]"});
  EXPECT_CONFIG_ERROR(m, "memory.plan must be a string");
}

// -------------------------------------------------------------- demo

std::string DemoPath() {
  const char *srcdir = getenv("TEST_SRCDIR"), *ws = getenv("TEST_WORKSPACE");
  if (srcdir && ws) {
    std::string p = std::string(srcdir) + "/" + ws + "/configs/demo.yaml";
    if (FILE *f = fopen(p.c_str(), "r")) {
      fclose(f);
      return p;
    }
  }
  return "configs/demo.yaml";
}

TEST(ConfigDemo, Loads) {
  Loaded r = LoadPath(DemoPath());
  ASSERT_EQ(r.st, MF_OK) << r.err;
  const mf_config *c = r.cfg;
  ASSERT_TRUE(c->model.has_init);
  const mf_model_spec &s = c->model.init;
  EXPECT_EQ(s.family, MF_FAMILY_MIXTRAL);
  EXPECT_EQ(s.hidden, 64);
  EXPECT_EQ(s.layers, 2);
  EXPECT_EQ(s.heads, 4);
  EXPECT_EQ(s.kv_heads, 2);
  EXPECT_EQ(s.experts, 8);
  EXPECT_EQ(s.top_k, 2);
  EXPECT_EQ(s.expert_ffn, 128);
  EXPECT_EQ(s.vocab, 256);
  EXPECT_STREQ(c->data.train, "runs/demo/data/train.tokens");
  EXPECT_STREQ(c->data.valid, "runs/demo/data/valid.tokens");
  EXPECT_EQ(c->data.seq_len, 128);
  EXPECT_EQ(c->train.micro_batch, 8);
  EXPECT_EQ(c->train.grad_accum, 1);
  EXPECT_EQ(c->train.schedule, MF_CONFIG_SCHEDULE_COSINE);
  EXPECT_GT(c->train.warmup, 0);
  EXPECT_LE(c->train.warmup, c->train.steps);
  EXPECT_STREQ(c->output.dir, "runs/demo");
  EXPECT_EQ(c->backend, MF_CONFIG_BACKEND_CPU);
  EXPECT_NE(c->memory.device_budget, (uint64_t)MF_CONFIG_SIZE_AUTO);
  std::string printed = Print(c);
  Loaded b = Load(printed, {}, "demo_printed.yaml");
  ASSERT_EQ(b.st, MF_OK) << b.err;
  EXPECT_TRUE(mf_config_equal(c, b.cfg));
}

// ------------------------------------------------- micro_batch_order

TEST(ConfigMicroBatchOrder, DefaultFileOverrideAndRoundTrip) {
  Loaded a = Load(Minimal());
  ASSERT_EQ(a.st, MF_OK) << a.err;
  EXPECT_EQ(a.cfg->train.micro_batch_order, MF_CONFIG_MB_ORDER_AUTO);
  EXPECT_NE(Print(a.cfg).find("  micro_batch_order: auto\n"), std::string::npos) << Print(a.cfg);

  Loaded b = Load(Minimal() + "  micro_batch_order: layer\n");
  ASSERT_EQ(b.st, MF_OK) << b.err;
  EXPECT_EQ(b.cfg->train.micro_batch_order, MF_CONFIG_MB_ORDER_LAYER);
  EXPECT_FALSE(mf_config_equal(a.cfg, b.cfg));

  Loaded c = Load(Minimal() + "  micro_batch_order: layer\n", {"train.micro_batch_order=micro"});
  ASSERT_EQ(c.st, MF_OK) << c.err;
  EXPECT_EQ(c.cfg->train.micro_batch_order, MF_CONFIG_MB_ORDER_MICRO);

  ExpectRoundTrip(Minimal() + "  micro_batch_order: layer\n");
  ExpectRoundTrip(Minimal(), {"train.micro_batch_order=micro"});
  EXPECT_STREQ(mf_config_mb_order_name(MF_CONFIG_MB_ORDER_AUTO), "auto");
  EXPECT_STREQ(mf_config_mb_order_name(MF_CONFIG_MB_ORDER_LAYER), "layer");
  EXPECT_STREQ(mf_config_mb_order_name(MF_CONFIG_MB_ORDER_MICRO), "micro");

  char *buf = nullptr;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  mf_config_print_keys(f);
  fclose(f);
  std::string keys(buf, len);
  free(buf);
  EXPECT_NE(keys.find("train.micro_batch_order"), std::string::npos) << keys;
  EXPECT_NE(keys.find("auto|layer|micro"), std::string::npos) << keys;
}

TEST(ConfigMicroBatchOrder, OtherValuesAreErrors) {
  // Line 16 of Minimal() + one line: the value starts at column 22.
  Loaded a = Load(Minimal() + "  micro_batch_order: layers\n");
  EXPECT_CONFIG_ERROR(a,
                      "c.yaml:16:22: train.micro_batch_order must be one of auto|layer|micro (got 'layers')");
  Loaded b = Load(Minimal() + "  micro_batch_order: 1\n");
  EXPECT_CONFIG_ERROR(b, "train.micro_batch_order must be one of auto|layer|micro");
  Loaded c = Load(Minimal() + "  micro_batch_order: [layer]\n");
  EXPECT_CONFIG_ERROR(c, "train.micro_batch_order must be one of auto|layer|micro");
  Loaded d = Load(Minimal(), {"train.micro_batch_order=null"});
  EXPECT_CONFIG_ERROR(d, "command line: train.micro_batch_order=null", "must be one of auto|layer|micro");
  Loaded e = Load(Minimal(), {"train.micro_batch_order=Layer"});
  EXPECT_CONFIG_ERROR(e, "train.micro_batch_order must be one of auto|layer|micro (got 'Layer')");
}

// ------------------------------------------------------ adam_moments

TEST(ConfigAdamMoments, DefaultFileOverrideRoundTripAndErrors) {
  Loaded a = Load(Minimal());
  ASSERT_EQ(a.st, MF_OK) << a.err;
  EXPECT_EQ(a.cfg->train.adam_moments, MF_CONFIG_MOMENTS_FP32);
  EXPECT_EQ(a.cfg->memory.adam_moments, MF_CONFIG_MOMENTS_FP32);
  EXPECT_NE(Print(a.cfg).find("  adam_moments: fp32\n"), std::string::npos) << Print(a.cfg);

  Loaded b = Load(Minimal() + "  adam_moments: bf16\n");
  ASSERT_EQ(b.st, MF_OK) << b.err;
  EXPECT_EQ(b.cfg->train.adam_moments, MF_CONFIG_MOMENTS_BF16);
  EXPECT_EQ(b.cfg->memory.adam_moments, MF_CONFIG_MOMENTS_BF16) << "copied for the host accounting";
  EXPECT_FALSE(mf_config_equal(a.cfg, b.cfg));

  Loaded c = Load(Minimal() + "  adam_moments: bf16\n", {"train.adam_moments=fp32"});
  ASSERT_EQ(c.st, MF_OK) << c.err;
  EXPECT_EQ(c.cfg->train.adam_moments, MF_CONFIG_MOMENTS_FP32);
  EXPECT_EQ(c.cfg->memory.adam_moments, MF_CONFIG_MOMENTS_FP32);

  ExpectRoundTrip(Minimal() + "  adam_moments: bf16\n");
  EXPECT_STREQ(mf_config_moments_name(MF_CONFIG_MOMENTS_FP32), "fp32");
  EXPECT_STREQ(mf_config_moments_name(MF_CONFIG_MOMENTS_BF16), "bf16");

  Loaded d = Load(Minimal() + "  adam_moments: fp16\n");
  EXPECT_CONFIG_ERROR(d, "c.yaml:16:17: train.adam_moments must be one of fp32|bf16 (got 'fp16')");
  Loaded e = Load(Minimal(), {"train.adam_moments=BF16"});
  EXPECT_CONFIG_ERROR(e, "train.adam_moments must be one of fp32|bf16 (got 'BF16')");
}

}  // namespace

// ------------------------------------------------- overlap_optimizer

// auto, true and false are read as written (what auto means for a backend is
// the run plan's: tests/planner:run_plan_test); other words are errors.
TEST(ConfigOverlapOptimizer, AutoTrueFalse) {
  Loaded a = Load(Minimal());
  ASSERT_EQ(a.st, MF_OK) << a.err;
  EXPECT_EQ(a.cfg->train.overlap_optimizer, MF_CONFIG_OVERLAP_AUTO);
  Loaded c = Load(Minimal() + "  overlap_optimizer: true\n", {"backend=cpu"});
  ASSERT_EQ(c.st, MF_OK) << c.err;
  EXPECT_EQ(c.cfg->train.overlap_optimizer, MF_CONFIG_OVERLAP_ON);
  Loaded d = Load(Minimal() + "  overlap_optimizer: false\n", {"backend=cuda"});
  ASSERT_EQ(d.st, MF_OK) << d.err;
  EXPECT_EQ(d.cfg->train.overlap_optimizer, MF_CONFIG_OVERLAP_OFF);
  ExpectRoundTrip(Minimal() + "  overlap_optimizer: false\n");
  ExpectRoundTrip(Minimal(), {"train.overlap_optimizer=true"});
  Loaded e = Load(Minimal() + "  overlap_optimizer: yes\n");
  EXPECT_CONFIG_ERROR(e, "train.overlap_optimizer must be one of auto|true|false (got 'yes')");
}

// ------------------------------------------------------- memory.routing

// auto (the default) and none are words; a path ending in .json is a routing
// file, kept as written; anything else is an error naming the choices.
TEST(ConfigMemoryRouting, WordsAndRoutingFiles) {
  Loaded d = Load(Minimal());
  ASSERT_EQ(d.st, MF_OK) << d.err;
  EXPECT_STREQ(d.cfg->memory.routing, "auto");
  EXPECT_EQ(d.cfg->memory.routing_kind, MF_CONFIG_ROUTING_AUTO);
  Loaded n = Load(Minimal() + "memory:\n  routing: none\n");
  ASSERT_EQ(n.st, MF_OK) << n.err;
  EXPECT_EQ(n.cfg->memory.routing_kind, MF_CONFIG_ROUTING_NONE);
  Loaded a = Load(Minimal(), {"memory.routing=auto"});
  ASSERT_EQ(a.st, MF_OK) << a.err;
  EXPECT_EQ(a.cfg->memory.routing_kind, MF_CONFIG_ROUTING_AUTO);
  Loaded f = Load(Minimal(), {"memory.routing=runs/old run/routing.json"});
  ASSERT_EQ(f.st, MF_OK) << f.err;
  EXPECT_EQ(f.cfg->memory.routing_kind, MF_CONFIG_ROUTING_FILE);
  EXPECT_STREQ(f.cfg->memory.routing, "runs/old run/routing.json");
  ExpectRoundTrip(Minimal(), {"memory.routing=runs/old run/routing.json"});
  ExpectRoundTrip(Minimal(), {"memory.routing=none"});
  EXPECT_NE(Print(d.cfg).find("  routing: auto\n"), std::string::npos) << Print(d.cfg);
  // The kind is derived from the text, so configs differing in it differ.
  EXPECT_FALSE(mf_config_equal(d.cfg, n.cfg));
  EXPECT_TRUE(mf_config_equal(d.cfg, a.cfg));
}

TEST(ConfigMemoryRouting, OtherValuesAreErrors) {
  Loaded a = Load(Minimal() + "memory:\n  routing: none2\n", {}, "x.yaml");
  EXPECT_CONFIG_ERROR(a,
                      "x.yaml:17:12: memory.routing must be auto, none or a routing file ending in .json "
                      "(got 'none2') (did you mean 'none'?)");
  Loaded b = Load(Minimal(), {"memory.routing=uniform"});
  EXPECT_CONFIG_ERROR(b, "command line: memory.routing=uniform: memory.routing must be auto, none",
                      "(got 'uniform')");
  EXPECT_EQ(b.err.find("did you mean"), std::string::npos) << b.err;
  Loaded c = Load(Minimal(), {"memory.routing=routing.yaml"});
  EXPECT_CONFIG_ERROR(c, "a routing file ending in .json (got 'routing.yaml')");
  Loaded e = Load(Minimal(), {"memory.routing=.json"});
  EXPECT_CONFIG_ERROR(e, "(got '.json')");
  Loaded n = Load(Minimal(), {"memory.routing=null"});
  EXPECT_CONFIG_ERROR(n, "memory.routing must be a string (got null)");
  Loaded m = Load(Minimal(), {"memory.routing=[auto]"});
  EXPECT_CONFIG_ERROR(m, "memory.routing must be a string");
}

// ------------------------------------------------------- required keys per use

// Each command requires only the keys it uses: plan and eval need the model
// only (no data.train, no train.steps); train needs all three. train.warmup is
// checked against train.steps only where steps is given.
TEST(ConfigUse, PlanAndEvalNeedOnlyTheModel) {
  const std::string path = WriteFile("model_only.yaml", std::string(kInit) + "train:\n  warmup: 30\n");
  for (mf_config_use use : {MF_CONFIG_FOR_PLAN, MF_CONFIG_FOR_EVAL}) {
    mf_config *cfg = nullptr;
    ASSERT_EQ(mf_config_load_for(path.c_str(), nullptr, 0, use, &cfg), MF_OK) << mf_last_error();
    EXPECT_EQ(cfg->data.train, nullptr);
    EXPECT_EQ(cfg->train.warmup, 30);
    mf_config_free(cfg);
  }
  mf_config *cfg = nullptr;
  EXPECT_EQ(mf_config_load_for(path.c_str(), nullptr, 0, MF_CONFIG_FOR_TRAIN, &cfg), MF_ERR_CONFIG);
  EXPECT_NE(std::string(mf_last_error()).find("missing required key 'data.train'"), std::string::npos)
      << mf_last_error();
  EXPECT_EQ(cfg, nullptr);
  // eval may run another model (--model DIR): data.seq_len is checked against
  // the model eval loads (src/train/eval.c), not model.init; plan and train check it here.
  const char *const long_seq[] = {"model.init.max_seq=128", "data.seq_len=4096"};
  mf_config *ev = nullptr;
  ASSERT_EQ(mf_config_load_for(path.c_str(), long_seq, 2, MF_CONFIG_FOR_EVAL, &ev), MF_OK) << mf_last_error();
  EXPECT_EQ(ev->data.seq_len, 4096);
  mf_config_free(ev);
  mf_config *pl = nullptr;
  EXPECT_EQ(mf_config_load_for(path.c_str(), long_seq, 2, MF_CONFIG_FOR_PLAN, &pl), MF_ERR_CONFIG);
  EXPECT_NE(std::string(mf_last_error()).find("data.seq_len (4096) exceeds model.init.max_seq"),
            std::string::npos)
      << mf_last_error();
  // Given, train.steps is still checked against warmup for every use.
  const std::string bad =
      WriteFile("warmup.yaml", std::string(kInit) + "train:\n  steps: 10\n  warmup: 30\n");
  EXPECT_EQ(mf_config_load_for(bad.c_str(), nullptr, 0, MF_CONFIG_FOR_PLAN, &cfg), MF_ERR_CONFIG);
  EXPECT_NE(std::string(mf_last_error()).find("train.warmup (30) must be <= train.steps (10)"),
            std::string::npos)
      << mf_last_error();
  // The model stays required everywhere.
  const std::string none = WriteFile("no_model.yaml", "data:\n  train: t.tokens\n");
  EXPECT_EQ(mf_config_load_for(none.c_str(), nullptr, 0, MF_CONFIG_FOR_EVAL, &cfg), MF_ERR_CONFIG);
  EXPECT_NE(std::string(mf_last_error()).find("model.path' or 'model.init'"), std::string::npos)
      << mf_last_error();
}
