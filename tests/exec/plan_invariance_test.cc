// Plan invariance through the whole user path: for the demo model and two
// other shapes (a dense layer and a shared expert; many small experts), five
// training steps under everything resident, the planner's plan at 50% of the
// resident need and at the minimum feasible budget, each baseline plan
// (memory.plan), and a plan file give bit-identical weights and losses.
//
// Every run goes through mf_config_load + mf_train, as `moefit train` does.
// The budgets come from the planner API on the program train builds (the
// resident plan's arena, the least-memory plan's arena); which plan a run
// really followed comes from train's own start-up line ("plan: NAME, arena
// ...; weights R resident / S streamed; gradients ...; activations ..."),
// so the test cannot pass by running the same plan every time.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "planner/plan.h"
#include "src/config/config.h"
#include "src/core/core.h"
#include "src/io/tokens.h"
#include "src/model/params.h"
#include "src/model/program.h"
#include "src/train/train.h"
#include "tests/exec/phrases.h"

namespace {

const char kProfile[] = "configs/hw/cpu-2core.yaml";

void spit(const std::string &path, const std::string &text) {
  std::ofstream f(path, std::ios::binary);
  f << text;
}

// What one mf_train run left: status, message, log, results.
struct TrainRun {
  mf_status st = MF_OK;
  std::string err, log, dir;
  mf_train_summary sum{};
  // From the "plan: ..." start-up line (every run is planned).
  bool found = false;
  std::string name;
  long w_res = 0, w_stream = 0, g_dev = 0, g_stream = 0, a_keep = 0, a_off = 0, a_rec = 0;
  long o_dev = -1, o_host = -1;  // optimizer on the device / on the host
  long moved() const { return w_stream + g_stream + a_off + a_rec; }
};

// The losses of every step from metrics.jsonl, as written (timings and
// traffic, which differ by plan and run, left out).
std::string losses(const std::string &dir) {
  static const char *const keys[] = {"step",      "loss",   "ce_loss", "aux_loss",  "lr",
                                     "grad_norm", "tokens", "skipped", "eval_loss", "expert_imbalance"};
  std::istringstream in(slurp(dir + "/metrics.jsonl"));
  std::string line, out;
  while (std::getline(in, line)) {
    for (const char *k : keys) {
      std::string key = std::string("\"") + k + "\":";
      size_t a = line.find(key);
      if (a == std::string::npos) {
        out += std::string(k) + "=missing ";
        continue;
      }
      a += key.size();
      size_t b = line.find_first_of(",}", a);
      out += std::string(k) + "=" + line.substr(a, b - a) + " ";
    }
    out += "\n";
  }
  return out;
}

class Shape {
 public:
  // `base`: a config file; every run applies the common overrides to it,
  // and `own` (e.g. train.lora).
  Shape(const std::string &name, const std::string &base, const std::vector<std::string> &own = {})
      : name_(name), base_(base), own_(own) {}

  std::vector<std::string> common(const std::string &dir) const {
    static const std::string train = phrase_tokens("train.tokens", 300, 11),
                             valid = phrase_tokens("valid.tokens", 12, 11);
    return {"data.train=" + train,
            "data.valid=" + valid,
            "data.seq_len=16",
            "train.micro_batch=2",
            "train.grad_accum=2",
            "train.micro_batch_order=micro",
            "train.steps=5",
            "train.warmup=1",
            "train.log_every=1",
            "train.eval_every=0",
            "train.threads=2",
            "output.dir=" + dir,
            "output.checkpoint_every=0",
            std::string("hardware.profile=") + kProfile,
            "backend=cpu"};
  }

  mf_config *load(const std::string &tag, const std::string &budget, const std::string &plan,
                  const std::vector<std::string> &extra = {}) const {
    std::vector<std::string> ov = common(dir(tag));
    ov.insert(ov.end(), own_.begin(), own_.end());
    ov.push_back("memory.device_budget=" + budget);
    ov.push_back("memory.plan=" + plan);
    for (const auto &e : extra) ov.push_back(e);
    std::vector<const char *> p;
    for (const auto &o : ov) p.push_back(o.c_str());
    mf_config *cfg = nullptr;
    EXPECT_EQ(mf_config_load(base_.c_str(), p.data(), p.size(), &cfg), MF_OK) << mf_last_error();
    return cfg;
  }

  std::string dir(const std::string &tag) const { return tmp() + "/" + name_ + "_" + tag; }

  TrainRun train(const std::string &tag, const std::string &budget, const std::string &plan,
                 const std::vector<std::string> &extra = {}) const {
    TrainRun r;
    r.dir = dir(tag);
    mf_config *cfg = load(tag, budget, plan, extra);
    if (!cfg) {
      r.st = MF_ERR_CONFIG;
      r.err = mf_last_error();
      return r;
    }
    FILE *f = tmpfile();
    mf_log_set_level(MF_LOG_INFO);
    mf_log_set_stream(f);
    mf_error_clear();
    r.st = mf_train(cfg, 0, &r.sum);
    mf_log_set_stream(nullptr);
    if (r.st != MF_OK) r.err = mf_last_error();
    fflush(f);
    long n = ftell(f);
    r.log.resize(n > 0 ? (size_t)n : 0);
    rewind(f);
    if (n > 0) {
      EXPECT_EQ(fread(&r.log[0], 1, (size_t)n, f), (size_t)n);
    }
    fclose(f);
    mf_config_free(cfg);
    // "plan: NAME, arena ...; weights R resident / S streamed; gradients ...; activations ..."
    const size_t a = r.log.find("plan: ");
    if (a != std::string::npos) {
      const size_t end = r.log.find('\n', a), comma = r.log.find(", arena ", a),
                   w = r.log.find("weights ", a);
      if (comma < end && w < end) {
        r.name = r.log.substr(a + 6, comma - a - 6);
        r.found = sscanf(r.log.c_str() + w,
                         "weights %ld resident / %ld streamed; gradients %ld on the device / %ld streamed; "
                         "activations %ld kept / %ld offloaded / %ld recomputed",
                         &r.w_res, &r.w_stream, &r.g_dev, &r.g_stream, &r.a_keep, &r.a_off, &r.a_rec) == 7;
        const size_t o = r.log.find("optimizer ", w);
        if (o < end && sscanf(r.log.c_str() + o, "optimizer %ld on the device / %ld on the host", &r.o_dev,
                              &r.o_host) != 2)
          r.found = false;
      }
    }
    return r;
  }

 private:
  std::string name_, base_;
  std::vector<std::string> own_;
};

// The program train builds for a config (micro-batch-major, as the runs pin
// train.micro_batch_order), and the planner's figures on it.
struct Planner {
  mf_param_table *t = nullptr;
  mf_program *p = nullptr;
  mf_hwprofile hw{};
  explicit Planner(const mf_config *cfg) {
    EXPECT_EQ(mf_hwprofile_load(kProfile, &hw), MF_OK) << mf_last_error();
    EXPECT_EQ(mf_run_model_table(cfg, nullptr, nullptr, &t), MF_OK)
        << mf_last_error();  // with train.lora's adapters
    mf_program_opts po{};
    po.micro_batch = cfg->train.micro_batch;
    po.seq_len = cfg->data.seq_len;
    po.grad_accum = cfg->train.grad_accum;
    po.aux_coef = cfg->train.aux_loss_coef;
    po.order = MF_ORDER_MICRO_MAJOR;
    EXPECT_EQ(mf_program_build(t, &po, &p), MF_OK) << mf_last_error();
  }
  ~Planner() {
    mf_program_free(p);
    mf_param_table_free(t);
  }
  uint64_t arena(mf_plan_kind k) {
    mf_plan *pl = nullptr;
    EXPECT_EQ(mf_plan_baseline(p, &hw, k, UINT64_MAX, &pl), MF_OK) << mf_last_error();
    uint64_t a = pl ? pl->s->arena_bytes : 0;
    mf_plan_free(pl);
    return a;
  }
};

// Same bits as the resident run: weights byte for byte, every step's losses
// in metrics.jsonl, and the summary's doubles exactly.
void ExpectSameBits(const TrainRun &ref, const TrainRun &r, const std::string &what) {
  SCOPED_TRACE(what);
  ASSERT_EQ(r.st, MF_OK) << r.err;
  EXPECT_EQ(r.sum.steps, 5);
  // the model, or a LoRA run's adapters (final/ a PEFT adapter dir)
  const char *f = access((ref.dir + "/final/model.safetensors").c_str(), R_OK) == 0
                      ? "/final/model.safetensors"
                      : "/final/adapter_model.safetensors";
  const std::string w = slurp(r.dir + f);
  EXPECT_FALSE(w.empty());
  EXPECT_TRUE(w == slurp(ref.dir + f)) << "the final weights differ";
  EXPECT_EQ(losses(r.dir), losses(ref.dir));
  EXPECT_EQ(r.sum.first_loss, ref.sum.first_loss);
  EXPECT_EQ(r.sum.final_loss, ref.sum.final_loss);
  EXPECT_EQ(r.sum.valid_loss, ref.sum.valid_loss);
}

void CheckShape(const Shape &s) {
  // (a) everything resident: budget auto (the profile's device memory, far
  // more than these models need), plan auto.
  const TrainRun ref = s.train("resident", "auto", "auto");
  ASSERT_EQ(ref.st, MF_OK) << ref.err;
  ASSERT_TRUE(ref.found) << ref.log;
  EXPECT_EQ(ref.w_stream + ref.a_off + ref.a_rec, 0) << "budget auto keeps weights and activations on the "
                                                        "device:\n"
                                                     << ref.log;
  const std::string ref_losses = losses(ref.dir);
  ASSERT_EQ(std::count(ref_losses.begin(), ref_losses.end(), '\n'), 5) << "a metrics line per step";
  EXPECT_EQ(ref_losses.find("missing"), std::string::npos) << ref_losses;
  EXPECT_LT(ref.sum.final_loss, ref.sum.first_loss) << "it trains";

  mf_config *cfg = s.load("resident", "auto", "auto");
  ASSERT_NE(cfg, nullptr);
  Planner pl(cfg);
  mf_config_free(cfg);
  ASSERT_NE(pl.p, nullptr);
  const uint64_t need = pl.arena(MF_PLAN_RESIDENT), least = pl.arena(MF_PLAN_LEAST_MEMORY);
  const uint64_t half = need / 2;
  ASSERT_GT(least, 0u);
  ASSERT_LT(least, half) << "the shape must leave the planner room between the minimum and 50%";

  // (b) the planner's plan at 50% of the resident need and at the minimum.
  for (uint64_t budget : {half, least}) {
    const std::string b = std::to_string(budget);
    const TrainRun r = s.train("budget_" + b, b, "auto");
    ExpectSameBits(ref, r, "planner at " + b + " bytes");
    ASSERT_TRUE(r.found) << r.log;
    EXPECT_EQ(r.name, "the planner's choice");
    EXPECT_GT(r.moved(), 0) << "a plan under the resident need streams, offloads or recomputes:\n" << r.log;
  }
  // One byte under the minimum is refused, saying so.
  const TrainRun tiny = s.train("below_min", std::to_string(least - 1), "auto");
  EXPECT_EQ(tiny.st, MF_ERR_CONFIG);
  EXPECT_NE(tiny.err.find("below the minimum"), std::string::npos) << tiny.err;

  // (c) every baseline by name, its own arena as the budget.
  const struct {
    const char *word, *name;
  } baselines[] = {{"resident", "all resident"},
                   {"zero_offload", "ZeRO-Offload-like"},
                   {"megatrain", "MegaTrain-like"},
                   {"checkpoint", "checkpoint every layer"},
                   {"least_memory", "least memory"}};
  for (const auto &b : baselines) {
    const TrainRun r = s.train(std::string("plan_") + b.word, "auto", b.word);
    ExpectSameBits(ref, r, std::string("memory.plan=") + b.word);
    ASSERT_TRUE(r.found) << r.log;
    EXPECT_EQ(r.name, b.name);
    if (std::string(b.word) == "resident") {
      EXPECT_EQ(r.moved(), 0) << r.log;
    } else {
      EXPECT_GT(r.moved(), 0) << b.word << " streams, offloads or recomputes:\n" << r.log;
    }
  }
  // A named plan that does not fit an explicit budget is an error naming both.
  const TrainRun big = s.train("resident_over", std::to_string(half), "resident");
  EXPECT_EQ(big.st, MF_ERR_CONFIG);
  EXPECT_NE(big.err.find("memory.plan: resident: all resident needs a device arena of"), std::string::npos)
      << big.err;
  EXPECT_NE(big.err.find("memory.device_budget"), std::string::npos) << big.err;
  // One that fits it runs within it.
  const TrainRun lm = s.train("least_at_min", std::to_string(least), "least_memory");
  ExpectSameBits(ref, lm, "memory.plan=least_memory at the minimum budget");

  // A plan file of the planner's choice at 50%, as `moefit plan --json` writes it.
  mf_plan *chosen = nullptr;
  ASSERT_EQ(mf_plan_choose(pl.p, &pl.hw, half, nullptr, nullptr, &chosen), MF_OK) << mf_last_error();
  const std::string file = s.dir("chosen") + ".json";
  mf_plan_figures fig = {half, chosen->s->peak_live_bytes, chosen->s->arena_bytes, chosen->sim.step_seconds};
  snprintf(fig.expert_gemm, sizeof fig.expert_gemm, "cpu");
  snprintf(fig.attention, sizeof fig.attention, "cpu");
  ASSERT_EQ(mf_plan_write_json(pl.p, chosen->d, &fig, file.c_str()), MF_OK) << mf_last_error();
  mf_plan_free(chosen);
  for (const std::string &budget : {std::string("auto"), std::to_string(half)}) {
    const TrainRun r = s.train("file_" + budget, budget, file);
    ExpectSameBits(ref, r, "memory.plan=" + file + " with budget " + budget);
    ASSERT_TRUE(r.found) << r.log;
    EXPECT_EQ(r.name, file);
    EXPECT_GT(r.moved(), 0) << r.log;
  }
}

std::string demo() {
  return "configs/demo.yaml";
}

// A config file for a shape given as its model.init map; data and train come
// from the common overrides.
std::string shape_config(const std::string &name, const std::string &init) {
  std::string path = tmp() + "/" + name + ".yaml";
  spit(path, "model:\n  init: " + init + "\ndata: {train: x.tokens}\ntrain: {steps: 5}\n");
  return path;
}

const char kDenseShared[] =
    "{family: qwen2_moe, hidden: 32, layers: 3, heads: 4, kv_heads: 2, experts: 4, top_k: 2, expert_ffn: 32, "
    "shared_ffn: 48, dense_ffn: 64, mlp_only_layers: [0], vocab: 64, max_seq: 32, seed: 3}";
const char kManySmall[] =
    "{family: qwen3_moe, hidden: 32, layers: 2, heads: 4, kv_heads: 2, experts: 32, top_k: 4, expert_ffn: 8, "
    "vocab: 64, max_seq: 32, seed: 4}";

// GLM-4.5: partial RoPE, q/k/v biases, a dense first layer, the shared
// experts added ungated, the sigmoid router in 2 groups (1 kept) with its
// frozen correction bias and scaled weights.
const char kGlm[] =
    "{family: glm4_moe, hidden: 32, layers: 3, heads: 4, kv_heads: 2, head_dim: 8, partial_rotary: 0.5, "
    "experts: 8, top_k: 2, expert_ffn: 16, shared_ffn: 32, dense_ffn: 64, first_dense: 1, n_group: 2, "
    "topk_group: 1, routed_scaling: 2.5, qkv_bias: true, vocab: 64, max_seq: 32, seed: 5}";

// DeepSeek-V3: latent attention with a low-rank q and interleaved RoPE
// (value heads narrower than q/k heads), the group router and shared experts.
const char kDeepseek[] =
    "{family: deepseek_v3, hidden: 32, layers: 3, heads: 4, kv_heads: 4, q_lora_rank: 16, kv_lora_rank: 16, "
    "qk_nope_dim: 8, qk_rope_dim: 4, v_head_dim: 6, experts: 8, top_k: 2, expert_ffn: 16, shared_ffn: 16, "
    "dense_ffn: 32, first_dense: 1, n_group: 2, topk_group: 1, routed_scaling: 2.5, vocab: 64, max_seq: 32, "
    "seed: 7}";

// gpt-oss: sinks, q/k/v/o biases, a sliding window (layer 0) and a full layer,
// YaRN, the router's bias, top-k then softmax, expert biases and the clamped SwiGLU.
const char kGptOss[] =
    "{family: gpt_oss, hidden: 32, layers: 2, heads: 4, kv_heads: 2, head_dim: 8, experts: 8, top_k: 2, "
    "expert_ffn: 16, sliding_window: 5, vocab: 64, max_seq: 64, seed: 9}";

TEST(PlanInvariance, DemoModel) {
  CheckShape(Shape("demo", demo()));
}

TEST(PlanInvariance, DenseLayerAndSharedExpert) {
  CheckShape(Shape("dense_shared", shape_config("dense_shared", kDenseShared)));
}

TEST(PlanInvariance, ManySmallExperts) {
  CheckShape(Shape("many_small", shape_config("many_small", kManySmall)));
}

TEST(PlanInvariance, Glm4Moe) {
  CheckShape(Shape("glm", shape_config("glm", kGlm)));
}

TEST(PlanInvariance, DeepseekV3) {
  CheckShape(Shape("deepseek", shape_config("deepseek", kDeepseek)));
}

TEST(PlanInvariance, GptOss) {
  CheckShape(Shape("gpt_oss", shape_config("gpt_oss", kGptOss)));
}

TEST(PlanInvariance, LoraGptOssAndRouters) {
  CheckShape(Shape("lora_gpt_oss", shape_config("lora_gpt_oss", kGptOss),
                   {"train.lora.rank=4", "train.lora.alpha=8", "train.lr=1e-2",
                    "train.lora.train_router=true", "train.lora.targets=[q_proj, k_proj, v_proj, o_proj]"}));
}

TEST(PlanInvariance, LoraDeepseekV3) {
  CheckShape(
      Shape("lora_deepseek", shape_config("lora_deepseek", kDeepseek),
            {"train.lora.rank=4", "train.lora.alpha=8", "train.lr=1e-2",
             "train.lora.targets=[q_a_proj, q_b_proj, kv_a_proj_with_mqa, kv_b_proj, o_proj, gate_proj, "
             "up_proj, down_proj]"}));
}

// LoRA (train.lora): adapters over a frozen base, on the attention and every
// MLP projection (routed experts, the shared expert, dense layers), the
// routers trained too in the second shape: the same checks.
const std::vector<std::string> kLora = {"train.lora.rank=4", "train.lora.alpha=8", "train.lr=1e-2",
                                        "train.lora.targets=[q_proj, k_proj, v_proj, o_proj, w1, w2, w3]"};

TEST(PlanInvariance, LoraDemoModel) {
  CheckShape(Shape("lora_demo", demo(), kLora));
}

TEST(PlanInvariance, LoraDenseLayerSharedExpertAndRouters) {
  CheckShape(
      Shape("lora_dense_shared", shape_config("lora_dense_shared", kDenseShared),
            {"train.lora.rank=4", "train.lora.alpha=8", "train.lr=1e-2", "train.lora.train_router=true",
             "train.lora.targets=[q_proj, v_proj, o_proj, gate_proj, up_proj, down_proj]"}));
}

TEST(PlanInvariance, LoraGlm4MoeAndRouters) {
  CheckShape(
      Shape("lora_glm", shape_config("lora_glm", kGlm),
            {"train.lora.rank=4", "train.lora.alpha=8", "train.lr=1e-2", "train.lora.train_router=true",
             "train.lora.targets=[q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj]"}));
}

// QLoRA (train.lora.base_dtype): the frozen base stored quantized at home
// (its blobs what the plans copy and keep on the device), dequantized before
// each use; the dense layer, shared expert, its gate and the routers are
// quantized too. NF4 double quantized in blocks of 32, and FP8: the same checks.
TEST(PlanInvariance, QloraNf4DoubleQuantDenseLayerSharedExpert) {
  CheckShape(Shape("qlora_nf4", shape_config("qlora_nf4", kDenseShared),
                   {"train.lora.rank=4", "train.lora.alpha=8", "train.lr=1e-2", "train.lora.base_dtype=nf4",
                    "train.lora.base_blocksize=32", "train.lora.base_double_quant=true",
                    "train.lora.targets=[q_proj, v_proj, o_proj, gate_proj, up_proj, down_proj]"}));
}

TEST(PlanInvariance, QloraFp8DemoModel) {
  std::vector<std::string> own = kLora;
  own.push_back("train.lora.base_dtype=fp8");
  CheckShape(Shape("qlora_fp8", demo(), own));
}

// train.lora.experts: hot — adapters on each MoE layer's two most-routed
// experts by a routing file (skewed counts: experts 0 and 2 in layer 0, 1 and
// 5 in layer 1), the other experts' rows through the base alone (their
// adapters absent from the expert GEMMs' pools): the same checks.
TEST(PlanInvariance, LoraHotExperts) {
  const std::string routing = tmp() + "/lora_hot_routing.json";
  spit(routing,
       R"({"format": "moefit-routing", "version": 1,
           "model": {"family": "mixtral", "layers": 2, "experts": 8, "top_k": 2}, "tokens": 100,
           "counts": [[60, 10, 50, 5, 40, 5, 20, 10], [5, 70, 5, 5, 5, 60, 40, 10]]})");
  std::vector<std::string> own = kLora;
  own.push_back("train.lora.experts=hot");
  own.push_back("memory.routing=" + routing);
  Shape s("lora_hot", demo(), own);
  mf_config *cfg = s.load("hot_table", "64MiB", "auto");
  ASSERT_NE(cfg, nullptr);
  Planner pl(cfg);
  mf_config_free(cfg);
  ASSERT_NE(pl.t, nullptr);
  ASSERT_NE(pl.t->lora.hot, nullptr);
  for (int64_t l = 0; l < 2; l++)
    for (int64_t e = 0; e < 8; e++)
      EXPECT_EQ(mf_lora_expert_hot(pl.t, l, e),
                (l == 0 && (e == 0 || e == 2)) || (l == 1 && (e == 1 || e == 5)))
          << "layer " << l << " expert " << e;
  CheckShape(s);
}

// LoRA with the host optimizer overlapped behind the next step, and with
// layer 1's adapters updated on the device (an override that matches frozen
// weights too: it moves only the adapters' optimizer): the same bits.
TEST(PlanInvariance, LoraOverlappedAndDeviceOptimizer) {
  Shape s("lora_overlap", demo(), kLora);
  const TrainRun ref = s.train("ref", "auto", "auto", {"train.overlap_optimizer=false"});
  ASSERT_EQ(ref.st, MF_OK) << ref.err;
  for (const std::string overlap : {"false", "true"}) {
    const TrainRun o =
        s.train("overlap_" + overlap, "auto", "zero_offload", {"train.overlap_optimizer=" + overlap});
    ExpectSameBits(ref, o, "zero_offload, overlap_optimizer=" + overlap);
    const TrainRun d = s.train("dev_" + overlap, "auto", "zero_offload",
                               {"train.overlap_optimizer=" + overlap,
                                "memory.overrides=[{match: 'model.layers.1.*', optimizer: device}]"});
    ExpectSameBits(ref, d, "layer 1's adapters on the device, overlap_optimizer=" + overlap);
    ASSERT_TRUE(d.found) << d.log;
    EXPECT_GT(d.o_dev, 0) << d.log;
    EXPECT_GT(d.o_host, 0) << d.log;
  }
}

// memory.overrides pin decisions on top of a baseline; same bits.
TEST(PlanInvariance, OverridesApplyOnTopOfABaseline) {
  Shape s("demo_ov", demo());
  const TrainRun ref = s.train("resident", "auto", "auto");
  ASSERT_EQ(ref.st, MF_OK) << ref.err;
  const TrainRun r =
      s.train("resident_ov", "auto", "resident",
              {"memory.overrides=[{match: 'model.layers.0.*', params: stream, grads: stream}]"});
  ExpectSameBits(ref, r, "resident with layer 0 streamed");
  ASSERT_TRUE(r.found) << r.log;
  EXPECT_EQ(r.name, "all resident with memory.overrides");
  EXPECT_GT(r.w_stream, 0) << r.log;
  EXPECT_GT(r.g_stream, 0) << r.log;
  EXPECT_GT(r.w_res, 0) << "layer 1 stays resident:\n" << r.log;
}

// The optimizer on the device (the resident baseline: every parameter's;
// overrides: some layers'), with fp32 and bf16 moments and with the host
// part overlapped: the same bits as the host optimizer's unscheduled run —
// the final weights, every step's loss and gradient norm, and the validation
// loss (the device's weights brought home before the evaluation).
TEST(PlanInvariance, OptimizerOnTheDevice) {
  Shape s("demo_devopt", demo());
  for (const std::string moments : {"fp32", "bf16"}) {
    SCOPED_TRACE("train.adam_moments=" + moments);
    const std::vector<std::string> m = {"train.adam_moments=" + moments};
    const TrainRun ref = s.train("resident_" + moments, "auto", "auto", m);
    ASSERT_EQ(ref.st, MF_OK) << ref.err;
    const TrainRun all = s.train("dev_all_" + moments, "auto", "resident", m);
    ExpectSameBits(ref, all, "every optimizer on the device");
    ASSERT_TRUE(all.found) << all.log;
    EXPECT_GT(all.o_dev, 0) << all.log;
    EXPECT_EQ(all.o_host, 0) << all.log;
    for (const std::string overlap : {"false", "true"}) {
      std::vector<std::string> ov = m;
      ov.push_back("train.overlap_optimizer=" + overlap);
      ov.push_back("memory.overrides=[{match: 'model.layers.1.*', optimizer: device}]");
      const TrainRun mixed = s.train("dev_mixed_" + moments + "_" + overlap, "auto", "zero_offload", ov);
      ExpectSameBits(ref, mixed, "layer 1's optimizer on the device, overlap_optimizer=" + overlap);
      ASSERT_TRUE(mixed.found) << mixed.log;
      EXPECT_GT(mixed.o_dev, 0) << mixed.log;
      EXPECT_GT(mixed.o_host, 0) << mixed.log;
      EXPECT_GT(mixed.g_stream, 0) << "the other layers stream their gradients home:\n" << mixed.log;
    }
  }
}

// Copies through the pinned staging arena (memory.staging=true; on the cpu
// backend auto leaves them straight): the same bits under the least-memory
// plan (weights and gradients streamed, activations offloaded or recomputed),
// a plan with the optimizer on the device for one layer and the host part
// overlapped (gradients handed over from the copy-outs), and unplanned (a
// resident schedule simulated for the layout); the start-up line says so and
// metrics.jsonl has the host's staging seconds. A pinned_limit under the
// largest copy is refused, naming the key.
TEST(PlanInvariance, StagedCopies) {
  Shape s("demo_staged", demo());
  const TrainRun ref = s.train("resident", "auto", "auto");
  ASSERT_EQ(ref.st, MF_OK) << ref.err;
  EXPECT_EQ(ref.log.find("copies staged"), std::string::npos) << "auto: not on cpu\n" << ref.log;
  const struct {
    const char *tag, *plan;
    std::vector<std::string> extra;
  } runs[] = {
      {"least", "least_memory", {}},
      {"devopt",
       "zero_offload",
       {"train.overlap_optimizer=true", "memory.overrides=[{match: 'model.layers.1.*', optimizer: device}]"}},
      {"unplanned", "auto", {}},
  };
  for (const auto &c : runs) {
    std::vector<std::string> ov = c.extra;
    ov.push_back("memory.staging=true");
    const TrainRun r = s.train(std::string("staged_") + c.tag, "auto", c.plan, ov);
    ExpectSameBits(ref, r, std::string("staged, memory.plan=") + c.plan);
    EXPECT_NE(r.log.find("copies staged: "), std::string::npos) << r.log;
    const std::string m = slurp(r.dir + "/metrics.jsonl");
    EXPECT_NE(m.find("\"staging_fill_s\":"), std::string::npos);
    EXPECT_EQ(m.find("\"staging_fill_s\":null"), std::string::npos) << "measured on every line:\n" << m;
  }
  const TrainRun tight =
      s.train("staged_tight", "auto", "least_memory", {"memory.staging=true", "memory.pinned_limit=1KiB"});
  EXPECT_EQ(tight.st, MF_ERR_CONFIG);
  EXPECT_NE(tight.err.find("memory.pinned_limit"), std::string::npos) << tight.err;
}

// BF16 storage (train.precision=bf16: on the cpu backend every kernel stores
// bf16, the twin of the cuda kernels): the host uploads the bf16 working
// copy, the device optimizer keeps the fp32 master in its state. Plans still
// give the same bits — streamed and offloaded, the optimizer on the device
// with and without the overlapped host part, copies staged — and the run
// trains about as well as fp32 (final and validation losses within 2%) while
// not being the fp32 run.
TEST(PlanInvariance, Bf16Storage) {
  Shape s("demo_bf16", demo());
  const std::vector<std::string> bf16 = {"train.precision=bf16"};
  const TrainRun ref = s.train("resident", "auto", "auto", bf16);
  ASSERT_EQ(ref.st, MF_OK) << ref.err;
  EXPECT_NE(ref.log.find("BF16"), std::string::npos) << "the start-up lines say the storage:\n" << ref.log;
  const struct {
    const char *tag, *plan;
    std::vector<std::string> extra;
  } runs[] = {
      {"least", "least_memory", {}},
      {"dev_all", "resident", {}},
      {"dev_mixed",
       "zero_offload",
       {"train.overlap_optimizer=true", "memory.overrides=[{match: 'model.layers.1.*', optimizer: device}]"}},
      {"staged", "least_memory", {"memory.staging=true"}},
  };
  for (const auto &c : runs) {
    std::vector<std::string> ov = c.extra;
    ov.insert(ov.end(), bf16.begin(), bf16.end());
    const TrainRun r = s.train(std::string("bf16_") + c.tag, "auto", c.plan, ov);
    ExpectSameBits(ref, r, std::string("bf16, memory.plan=") + c.plan + " " + c.tag);
  }
  const TrainRun f32 = s.train("fp32", "auto", "auto", {"train.precision=fp32"});
  ASSERT_EQ(f32.st, MF_OK) << f32.err;
  EXPECT_NE(losses(f32.dir), losses(ref.dir)) << "bf16 storage rounds: it is not the fp32 run";
  EXPECT_NEAR(ref.sum.final_loss, f32.sum.final_loss, 0.02 * f32.sum.final_loss);
  EXPECT_NEAR(ref.sum.valid_loss, f32.sum.valid_loss, 0.02 * f32.sum.valid_loss);
}

// The pinned home (memory.pinned_home, on by default; planner/run_plan.h):
// the bf16 working copy of streamed weights, gradient sums that land home
// once a step (layer-major order) and offloaded activations copied straight
// from and into pinned host memory — beside the staging arena, with no
// staging arena, and with a pinned_limit that pins a region in part — give
// the same bits as resident and as staging every copy (pinned_home=false).
// The start-up lines say what was pinned and what was staged.
TEST(PlanInvariance, PinnedHome) {
  Shape s("demo_home", demo());
  const std::vector<std::string> base = {"train.precision=bf16", "train.micro_batch_order=layer"};
  const TrainRun ref = s.train("resident", "auto", "auto", base);
  ASSERT_EQ(ref.st, MF_OK) << ref.err;
  const struct {
    const char *tag, *plan;
    std::vector<std::string> extra;
    bool home, staged;
    const char *pinned, *unpinned; /* in the "pinned home:" line, and not in it */
  } runs[] = {
      {"home_staged", "least_memory", {"memory.staging=true"}, true, true, "offloaded activations", nullptr},
      {"home_straight", "least_memory", {"memory.staging=false"}, true, false, "gradient sums", nullptr},
      {"all_staged",
       "least_memory",
       {"memory.staging=true", "memory.pinned_home=false"},
       false,
       true,
       nullptr,
       nullptr},
      {"home_megatrain", "megatrain", {"memory.staging=true"}, true, true, "bf16 working copy", nullptr},
      // room for the working copy (882.62 KiB) and the activations, and a part of the gradient sums (1.72
      // MiB)
      {"home_part",
       "least_memory",
       {"memory.staging=true", "memory.pinned_limit=1280KiB"},
       true,
       true,
       "(part)",
       nullptr},
  };
  for (const auto &c : runs) {
    std::vector<std::string> ov = c.extra;
    ov.insert(ov.end(), base.begin(), base.end());
    const TrainRun r = s.train(std::string("home_") + c.tag, "auto", c.plan, ov);
    ExpectSameBits(ref, r, std::string("pinned home, ") + c.tag);
    ASSERT_TRUE(r.found) << r.log;
    EXPECT_GT(r.moved(), 0) << r.log;
    EXPECT_EQ(r.log.find("pinned home: ") != std::string::npos, c.home) << c.tag << "\n" << r.log;
    EXPECT_EQ(r.log.find("copies staged: ") != std::string::npos, c.staged) << c.tag << "\n" << r.log;
    const size_t at = r.log.find("pinned home: ");
    const std::string line = at == std::string::npos ? "" : r.log.substr(at, r.log.find('\n', at) - at);
    if (c.pinned) {
      EXPECT_NE(line.find(c.pinned), std::string::npos) << c.tag << ": " << line;
    }
    if (c.unpinned) {
      EXPECT_EQ(line.find(c.unpinned), std::string::npos) << c.tag << ": " << line;
    }
  }
}

// Plan files that cannot be followed: clean errors naming the file.
TEST(PlanInvariance, BadPlanFilesAreErrorsNamingTheFile) {
  Shape s("demo_bad", demo());
  const std::string malformed = tmp() + "/malformed.json";
  spit(malformed, "{\"format\": \"moefit-plan\", \"version\": 1, \"tensors\": [");
  const TrainRun a = s.train("malformed", "auto", malformed);
  EXPECT_EQ(a.st, MF_ERR_FORMAT) << a.err;
  EXPECT_NE(a.err.find(malformed), std::string::npos) << a.err;

  // A valid plan for another model (the many-small-experts shape).
  Shape other("other", shape_config("other", kManySmall));
  mf_config *cfg = other.load("x", "auto", "auto");
  ASSERT_NE(cfg, nullptr);
  Planner pl(cfg);
  mf_config_free(cfg);
  mf_plan *least = nullptr;
  ASSERT_EQ(mf_plan_baseline(pl.p, &pl.hw, MF_PLAN_LEAST_MEMORY, UINT64_MAX, &least), MF_OK)
      << mf_last_error();
  const std::string mismatched = tmp() + "/other_model.json";
  mf_plan_figures fig = {least->s->arena_bytes, least->s->peak_live_bytes, least->s->arena_bytes,
                         least->sim.step_seconds};
  snprintf(fig.expert_gemm, sizeof fig.expert_gemm, "cpu");
  snprintf(fig.attention, sizeof fig.attention, "cpu");
  ASSERT_EQ(mf_plan_write_json(pl.p, least->d, &fig, mismatched.c_str()), MF_OK) << mf_last_error();
  mf_plan_free(least);
  const TrainRun b = s.train("mismatched", "auto", mismatched);
  EXPECT_EQ(b.st, MF_ERR_CONFIG) << b.err;
  EXPECT_NE(b.err.find(mismatched), std::string::npos) << b.err;

  const std::string missing = tmp() + "/no_such_plan.json";
  const TrainRun c = s.train("missing", "auto", missing);
  EXPECT_NE(c.st, MF_OK);
  EXPECT_NE(c.err.find(missing), std::string::npos) << c.err;
}

}  // namespace
