// issue 28: a checkpoint and an adapter remember their whole base, and eval of
// an adapter is what the adapter says. A run records the base it trained on
// (its config's maths and its weights' checksums: a checkpoint's base.json,
// final/'s moefit_base.json); `train --resume`, `export` and `eval --model
// ADAPTER_DIR` refuse another base (an edited config.json, other weights, a
// config's model.init), naming the field or tensor, both values and the way
// out; eval takes an adapter's rank and alpha from the adapter dir; a loss
// that is not finite is an error naming where the first such logit is.
#include <gtest/gtest.h>

#include <limits.h>
#include <stdlib.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <regex>
#include <string>

#include "cli_util.h"

namespace {

bool has(const std::string &s, const std::string &what) {
  return s.find(what) != std::string::npos;
}

const std::string kDemo =
    " configs/demo.yaml hardware.profile=configs/hw/cpu-2core.yaml data.valid=null data.seq_len=32 "
    "train.micro_batch=2 train.warmup=1 ";

std::string Corpus() {
  return text_tokens("bi_corpus", 12000);
}
std::string Small() {
  return text_tokens("bi_small", 1500);
}
std::string Dir(const std::string &name) {
  return tmpdir() + "/bi_" + name;
}

// A mixtral base (`moefit init`: the demo's family, vocab 272, max_seq 4096)
// under model.path, once per test binary.
std::string Base() {
  static std::string base;
  if (!base.empty()) return base;
  base = Dir("base");
  shell("rm -rf " + base);
  Result r = moefit("init --family mixtral --preset tiny --seed 3 --out " + base);
  EXPECT_EQ(r.code, 0) << r.out;
  return base;
}

// The path a record holds: the dir it resolves to.
std::string Real(const std::string &path) {
  char *r = realpath(path.c_str(), nullptr);
  const std::string s = r ? r : path;
  free(r);
  return s;
}

std::string OnBase() {
  return "model.init=null model.path=" + Base() + " data.train=" + Corpus() + " ";
}
const std::string kLora =
    "train.lora.rank=4 train.lora.alpha=8 train.lr=1e-2 train.lora.targets=[q_proj,v_proj,w1,w2,w3] ";

// Two steps, a checkpoint after each, into output.dir `name`, once per binary.
std::string Run(const std::string &name, const std::string &extra) {
  const std::string out = Dir(name);
  shell("rm -rf " + out);
  Result r = moefit("train" + kDemo + OnBase() + extra +
                    " train.steps=2 output.checkpoint_every=1 output.dir=" + out);
  EXPECT_EQ(r.code, 0) << r.out;
  return out;
}
const std::string &FullRun() {
  static const std::string run = Run("full", "");
  return run;
}
const std::string &LoraRun() {
  static const std::string run = Run("lora", kLora);
  return run;
}
const std::string &QloraRun() {
  static const std::string run = Run("qlora", kLora + "train.lora.base_dtype=nf4 ");
  return run;
}

// The base's config.json with `from` replaced by `to` while it lives; put back after.
class EditedBase {
 public:
  EditedBase(const std::string &from, const std::string &to) : path_(Base() + "/config.json") {
    kept_ = read_file(path_);
    const size_t at = kept_.find(from);
    EXPECT_NE(at, std::string::npos) << from << " in " << kept_;
    std::string edited = kept_;
    if (at != std::string::npos) edited.replace(at, from.size(), to);
    write_file(path_, edited);
  }
  ~EditedBase() { write_file(path_, kept_); }

 private:
  std::string path_, kept_;
};

// The loss line's value, NaN when there is none.
double Loss(const Result &r) {
  std::smatch m;
  return std::regex_search(r.out, m, std::regex("loss ([0-9.]+)  perplexity")) ? std::stod(m[1]) : NAN;
}

Result Eval(const std::string &model_dir, const std::string &config) {
  return moefit("eval" + kDemo + config + " --tokens " + Small() + " --model " + model_dir +
                " output.dir=" + Dir("eval_nothing"));
}

// The message names the record, the field, both values and the way out.
void ExpectRefused(const Result &r, const std::string &record, const std::string &field,
                   const std::string &was, const std::string &now, const std::string &way_out) {
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(has(r.out, record + ": " + field + ": ")) << r.out;
  EXPECT_TRUE(
      has(r.out, "(model.path " + Real(Base()) + ", as it was then) with " + was + "; the base loaded now"))
      << r.out;
  EXPECT_TRUE(has(r.out, " has " + now + ": " + way_out)) << r.out;
}

const char kRunWay[] = "point model.path at the base the run trained on, or start a new run";
const char kAdapterWay[] = "point model.path at the base the adapters were trained on";

TEST(BaseIdentity, AFullFineTuneRefusesAnEditedBaseConfigAtResumeAndExport) {
  const std::string run = FullRun(), ck = run + "/checkpoints/step-000002";
  EXPECT_TRUE(has(read_file(ck + "/base.json"), "\"rope_theta\": 1000000.0"));
  EXPECT_TRUE(has(read_file(run + "/final/moefit_base.json"), "\"of\": \"all\""));
  {
    EditedBase e("\"rope_theta\": 1000000.0", "\"rope_theta\": 10000.0");
    Result r = moefit("train" + kDemo + OnBase() +
                      "train.steps=3 output.checkpoint_every=1 output.dir=" + run + " --resume");
    ExpectRefused(r, ck + "/base.json", "rope_theta", "rope_theta 1000000.0", "rope_theta 10000.0", kRunWay);
    Result x = moefit("export " + run + " --out " + Dir("full_export"));
    ExpectRefused(x, ck + "/base.json", "rope_theta", "rope_theta 1000000.0", "rope_theta 10000.0", kRunWay);
    EXPECT_NE(access(Dir("full_export").c_str(), F_OK), 0) << "nothing exported";
  }
  Result x = moefit("export " + run + " --out " + Dir("full_export"));  // the base as it was: fine
  EXPECT_EQ(x.code, 0) << x.out;
}

TEST(BaseIdentity, ALoraRunRefusesAnEditedBaseConfigAtResumeExportAndEval) {
  const std::string run = LoraRun(), ck = run + "/checkpoints/step-000002";
  {
    EditedBase e("\"num_experts_per_tok\": 2", "\"num_experts_per_tok\": 1");  // the router's top-k
    Result r = moefit("train" + kDemo + OnBase() + kLora +
                      "train.steps=3 output.checkpoint_every=1 output.dir=" + run + " --resume");
    ExpectRefused(r, ck + "/base.json", "top_k (config.json: num_experts_per_tok)", "top_k 2", "top_k 1",
                  kRunWay);
    for (const char *how : {"", " --adapter"}) {
      Result x = moefit("export " + run + " --out " + Dir("lora_export") + how);
      ExpectRefused(x, ck + "/base.json", "top_k (config.json: num_experts_per_tok)", "top_k 2", "top_k 1",
                    kRunWay);
    }
  }
  {
    EditedBase e("\"rms_norm_eps\": 1e-05", "\"rms_norm_eps\": 1e-06");
    Result v = Eval(run + "/final", OnBase());
    ExpectRefused(v, run + "/final/moefit_base.json", "norm_eps (config.json: rms_norm_eps)",
                  "norm_eps 1e-05", "norm_eps 1e-06", kAdapterWay);
    EXPECT_FALSE(has(v.out, "loss ")) << v.out;
  }
  EXPECT_EQ(Eval(run + "/final", OnBase()).code, 0);
}

// QLoRA: adapters trained over a base loaded from model.path and stored NF4
// record how it was stored; eval over it stored otherwise (bf16, FP8, NF4 in
// other blocks) is refused saying so and what to set; as trained, it runs,
// and export merges them into the dequantized base and says so.
TEST(BaseIdentity, QloraAdaptersRecordHowTheBaseWasStored) {
  const std::string run = QloraRun();
  const std::string rec = run + "/final/moefit_base.json";
  EXPECT_TRUE(has(read_file(rec), "\"stored\": \"nf4 b64\"")) << read_file(rec);
  const struct {
    const char *set, *now;
  } other[] = {{"", "in its float dtype (train.lora.base_dtype bf16)"},
               {"train.lora.base_dtype=fp8 ", "fp8"},
               {"train.lora.base_dtype=nf4 train.lora.base_blocksize=128 ", "nf4 b128"}};
  for (const auto &o : other) {
    Result v = Eval(run + "/final", OnBase() + o.set);
    EXPECT_EQ(v.code, 1) << v.out;
    EXPECT_TRUE(has(v.out, rec + ": weights: the adapters of " + run + "/final were trained over the base stored "
                               "nf4 b64 and the base loaded now is stored " + o.now +
                           ": set train.lora.base_dtype"))
        << v.out;
  }
  Result ok = Eval(run + "/final", OnBase() + "train.lora.base_dtype=nf4 ");
  EXPECT_EQ(ok.code, 0) << ok.out;
  EXPECT_TRUE(std::isfinite(Loss(ok))) << ok.out;
  Result x = moefit("export " + run + " --out " + Dir("qlora_export"));
  EXPECT_EQ(x.code, 0) << x.out;
  EXPECT_TRUE(has(x.out, "its nf4 weights dequantized, then the adapters merged")) << x.out;
  // A full fine-tune trains every weight: a quantized base is refused, naming the key.
  Result full = moefit("plan configs/demo.yaml train.lora.base_dtype=fp8");
  EXPECT_EQ(full.code, 1) << full.out;
  EXPECT_TRUE(has(full.out, "train.lora.base_dtype fp8 (command line: train.lora.base_dtype=fp8): a quantized base "
                            "is LoRA's frozen base; with train.lora.rank 0 every weight is trained"))
      << full.out;
}

// eval of an adapter over any other base than its own: a config's model.init
// of the very same shape, or another model.path, is refused naming the first
// tensor whose checksum differs; an adapter dir export --adapter writes is
// checked the same way.
TEST(BaseIdentity, EvalRefusesAnAdapterOverAnotherBase) {
  const std::string run = LoraRun();
  Result own = Eval(run + "/final", OnBase());
  ASSERT_EQ(own.code, 0) << own.out;
  Result init =
      Eval(run + "/final", "data.train=" + Corpus() + " model.init.vocab=272 model.init.max_seq=4096");
  EXPECT_EQ(init.code, 1) << init.out;
  EXPECT_TRUE(has(init.out, "moefit_base.json: weights: model.embed_tokens.weight: the adapters of " + run +
                                "/final were trained on a base (model.path " + Real(Base()) +
                                ", as it was then) with "
                                "checksum "))
      << init.out;
  EXPECT_TRUE(has(init.out, "the base loaded now (model.init (mixtral, seed 1)) has checksum ")) << init.out;
  EXPECT_TRUE(has(init.out, kAdapterWay)) << init.out;
  EXPECT_FALSE(has(init.out, "loss ")) << init.out;

  const std::string other = Dir("other_base"), ad = Dir("exported_adapter");
  shell("rm -rf " + other + " " + ad);
  ASSERT_EQ(moefit("init --family mixtral --preset tiny --seed 4 --out " + other).code, 0);
  Result x = moefit("export " + run + " --out " + ad + " --adapter");
  ASSERT_EQ(x.code, 0) << x.out;
  EXPECT_EQ(read_file(ad + "/moefit_base.json"), read_file(run + "/final/moefit_base.json"));
  for (const std::string &dir : {run + "/final", ad}) {
    Result o = Eval(dir, "model.init=null model.path=" + other);
    EXPECT_EQ(o.code, 1) << o.out;
    EXPECT_TRUE(has(o.out, dir + "/moefit_base.json: weights: model.embed_tokens.weight: ")) << o.out;
  }
}

// eval takes an adapter's rank and alpha from its adapter_config.json, not
// train.lora's: the same loss whatever the config says.
TEST(BaseIdentity, EvalTakesTheAdaptersRankFromTheAdapterDir) {
  const std::string run = LoraRun();
  Result same = Eval(run + "/final", OnBase() + kLora);
  ASSERT_EQ(same.code, 0) << same.out;
  Result other = Eval(run + "/final", OnBase() + kLora + "train.lora.rank=8 train.lora.alpha=3");
  ASSERT_EQ(other.code, 0) << other.out;
  EXPECT_EQ(Loss(other), Loss(same));
  EXPECT_FALSE(std::isnan(Loss(same))) << same.out;
}

// An adapter dir without a record of its base (PEFT's, or an older moefit's):
// a warning that its base cannot be checked; refused where
// base_model_name_or_path names another dir than the config's base.
TEST(BaseIdentity, AnAdapterWithoutARecordIsWarnedAboutOrRefused) {
  const std::string old = Dir("old_adapter");
  ASSERT_EQ(shell("rm -rf " + old + " && cp -r " + LoraRun() + "/final " + old + " && rm " + old +
                  "/moefit_base.json")
                .code,
            0);
  Result ok = Eval(old, OnBase());
  EXPECT_EQ(ok.code, 0) << ok.out;
  EXPECT_TRUE(has(ok.out, old + " has no moefit_base.json")) << ok.out;
  Result init = Eval(old, "data.train=" + Corpus() + " model.init.vocab=272 model.init.max_seq=4096");
  EXPECT_EQ(init.code, 1) << init.out;
  EXPECT_TRUE(
      has(init.out, "base_model_name_or_path names " + Base() + ", and the config's base is model.init"))
      << init.out;
}

// A model whose loss is not finite (a NaN weight) is an error, exit 1, naming
// where the first logit that is not finite is.
void Poison(const std::string &file, const std::string &tensor, size_t element) {
  std::string b = read_file(file);
  ASSERT_GT(b.size(), 8u);
  uint64_t n = 0;
  std::memcpy(&n, b.data(), 8);
  const std::string header = b.substr(8, n);
  std::smatch m;
  ASSERT_TRUE(
      std::regex_search(header, m, std::regex("\"" + tensor + "\":\\{[^}]*\"data_offsets\":\\[([0-9]+),")))
      << header;
  const size_t at = 8 + n + std::stoull(m[1]) + 4 * element;
  const float nan = NAN;
  b.replace(at, 4, reinterpret_cast<const char *>(&nan), 4);
  write_file(file, b);
}

TEST(BaseIdentity, ANonFiniteLossIsAnError) {
  const std::string norm = Dir("nan_norm"), head = Dir("nan_head");
  for (const std::string &d : {norm, head})
    ASSERT_EQ(shell("rm -rf " + d + " && cp -r " + FullRun() + "/final " + d).code, 0);
  Poison(norm + "/model.safetensors", "model.norm.weight", 5);
  Poison(head + "/model.safetensors", "lm_head.weight", 64 * 7 + 3);  // token id 7's row (hidden 64)
  Result n = Eval(norm, OnBase());
  EXPECT_EQ(n.code, 1) << n.out;
  EXPECT_TRUE(
      has(n.out, "moefit eval: error: " + Small() +
                     ": the loss is nan, not a finite number: the first "
                     "logit that is not finite is at sequence 0 (the file's window 0), token 0: its final "
                     "hidden state is not finite"))
      << n.out;
  EXPECT_FALSE(has(n.out, "loss nan ")) << n.out;
  Result h = Eval(head, OnBase());
  EXPECT_EQ(h.code, 1) << h.out;
  EXPECT_TRUE(
      has(h.out, "token 0 (the logit of token id 7): the LM head's row of that token id is not finite"))
      << h.out;
}

}  // namespace
