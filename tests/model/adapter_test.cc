// issue 28: an adapter dir is applied as it says, or refused. Its
// adapter_model.safetensors holds exactly the adapters its
// adapter_config.json describes: a tensor missing, or one more (a bias on
// lora_B, an adapter on a module target_modules does not name, a base weight)
// is refused naming it and why; adapter_config.json keys that change PEFT's
// maths (lora_bias, layer_replication, use_qalora, alora_invocation_tokens)
// are refused naming the key and what it would change.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "src/io/safetensors.h"
#include "src/model/hf_config.h"
#include "src/model/params.h"

namespace {

bool has(const std::string &s, const std::string &what) {
  return s.find(what) != std::string::npos;
}

std::string Tmp(const std::string &name) {
  const char *t = getenv("TEST_TMPDIR");
  return std::string(t ? t : "/tmp") + "/" + name;
}

const std::string kConfig =
    R"("peft_type": "LORA", "r": 4, "lora_alpha": 8, "target_modules": ["q_proj", "w1"])";

class Adapter : public ::testing::Test {
 protected:
  void SetUp() override {
    mf_model_spec spec{};
    ASSERT_EQ(mf_hf_config_load("tests/fixtures/mixtral", &spec), MF_OK) << mf_last_error();
    ASSERT_EQ(mf_param_table_build(&spec, &bare_), MF_OK) << mf_last_error();
    ASSERT_EQ(mf_param_table_build(&spec, &t_), MF_OK) << mf_last_error();
    const mf_lora l = {
        4, 2.0, mf_lora_target_roles(spec.family, "q_proj") | mf_lora_target_roles(spec.family, "w1"),
        0, 0.0, nullptr};
    ASSERT_EQ(mf_param_table_add_lora(t_, &l), MF_OK) << mf_last_error();
    w_.assign((size_t)t_->total_numel, 0.25f);
    dir_ = Tmp("adapter_ok");
    ASSERT_EQ(mf_params_save_adapter_dir(t_, w_.data(), "", dir_.c_str()), MF_OK) << mf_last_error();
  }
  void TearDown() override {
    mf_param_table_free(t_);
    mf_param_table_free(bare_);
  }
  // dir_'s adapters less `drop` (names) plus `add` (name, shape [2, 4]) as a new dir's.
  std::string Rewrite(const std::string &name, const std::vector<std::string> &drop,
                      const std::vector<std::string> &add) {
    const std::string out = Tmp(name);
    EXPECT_EQ(mf_mkdir_p(out.c_str()), MF_OK);
    const std::string cfg = "{" + kConfig + "}";
    EXPECT_EQ(mf_write_file_atomic((out + "/adapter_config.json").c_str(), cfg.data(), cfg.size()), MF_OK);
    mf_safetensors *st = nullptr;
    EXPECT_EQ(mf_safetensors_open((dir_ + "/adapter_model.safetensors").c_str(), &st), MF_OK)
        << mf_last_error();
    std::vector<mf_st_tensor> ts;
    for (size_t i = 0; st && i < mf_safetensors_count(st); i++) {
      const mf_st_tensor *x = mf_safetensors_get(st, i);
      bool dropped = false;
      for (const std::string &d : drop) dropped |= d == x->name;
      if (!dropped) ts.push_back(*x);
    }
    static const float extra[8] = {0};
    for (const std::string &a : add) {
      mf_st_tensor x{};
      x.name = a.c_str();
      x.dtype = MF_DTYPE_F32;
      x.ndim = 2;
      x.shape[0] = 2;
      x.shape[1] = 4;
      x.data = extra;
      ts.push_back(x);
    }
    EXPECT_EQ(
        mf_safetensors_write((out + "/adapter_model.safetensors").c_str(), ts.data(), ts.size(), nullptr, 0),
        MF_OK)
        << mf_last_error();
    mf_safetensors_close(st);
    return out;
  }
  // mf_params_load_adapters' message for dir ("" when it loads).
  std::string Load(const std::string &dir) {
    std::vector<float> w((size_t)t_->total_numel);
    const mf_status st = mf_params_load_adapters(t_, dir.c_str(), w.data());
    return st == MF_OK ? "" : mf_last_error();
  }
  mf_param_table *t_ = nullptr, *bare_ = nullptr;
  std::vector<float> w_;
  std::string dir_;
};

TEST_F(Adapter, ExactlyItsAdaptersLoad) {
  EXPECT_EQ(Load(dir_), "");
}

TEST_F(Adapter, MissingTensorsAreRefusedNamingThem) {
  const std::string a = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight",
                    b = "base_model.model.model.layers.1.block_sparse_moe.experts.3.w1.lora_B.weight";
  const std::string m = Load(Rewrite("adapter_missing", {a, b}, {}));
  EXPECT_TRUE(has(m, "adapter_missing/adapter_model.safetensors: tensor " + a + " is missing (and 1 more)"))
      << m;
  EXPECT_TRUE(has(m, "adapter_config.json's r 4 and target_modules need it")) << m;
}

TEST_F(Adapter, ExtraTensorsAreRefusedNamingThemAndWhy) {
  const struct {
    std::string tensor, why;
  } cases[] = {
      {"base_model.model.model.layers.0.self_attn.q_proj.lora_B.bias", "a bias on lora_B (PEFT's lora_bias)"},
      {"base_model.model.model.layers.0.self_attn.k_proj.lora_A.weight",
       "an adapter on a module adapter_config.json's target_modules does not adapt"},
      {"base_model.model.model.layers.0.self_attn.q_proj.lora_magnitude_vector", "DoRA's magnitude vector"},
      {"base_model.model.model.layers.0.self_attn.o_proj.weight", "a weight of the base"},
      {"something_else", "not a LoRA adapter of this model"},
  };
  for (const auto &c : cases) {
    SCOPED_TRACE(c.tensor);
    const std::string m = Load(Rewrite("adapter_extra", {}, {c.tensor}));
    EXPECT_TRUE(has(m, "adapter_extra/adapter_model.safetensors: tensor " + c.tensor + ": " + c.why)) << m;
  }
}

TEST_F(Adapter, ConfigKeysThatChangeTheMathsAreRefusedNamingThemAndWhy) {
  const struct {
    std::string json, want;
  } cases[] = {
      {R"("lora_bias": true)",
       "lora_bias: moefit computes plain LoRA, and this adapter sets it (a trained bias on lora_B)"},
      {R"("layer_replication": [[0, 2], [1, 2]])",
       "layer_replication: moefit computes plain LoRA, and this adapter "
       "sets it (a model whose layers are repeated from the base's)"},
      {R"("use_qalora": true)", "use_qalora: moefit computes plain LoRA, and this adapter sets it (QALoRA's"},
      {R"("alora_invocation_tokens": [5, 6])",
       "alora_invocation_tokens: moefit computes plain LoRA, and this adapter "
       "sets it (activated LoRA"},
      // their defaults are plain LoRA
      {R"("lora_bias": false, "layer_replication": null, "use_qalora": false, "alora_invocation_tokens": null)",
       ""},
  };
  const std::string dir = Tmp("adapter_keys");
  ASSERT_EQ(mf_mkdir_p(dir.c_str()), MF_OK);
  for (const auto &c : cases) {
    SCOPED_TRACE(c.json);
    const std::string json = "{" + kConfig + ", " + c.json + "}";
    ASSERT_EQ(mf_write_file_atomic((dir + "/adapter_config.json").c_str(), json.data(), json.size()), MF_OK);
    mf_lora l{};
    const mf_status st = mf_lora_read_adapter_config(dir.c_str(), bare_, &l);
    free(l.hot);
    if (c.want.empty()) {
      EXPECT_EQ(st, MF_OK) << mf_last_error();
      continue;
    }
    EXPECT_EQ(st, MF_ERR_UNSUPPORTED);
    EXPECT_TRUE(has(mf_last_error(), dir + "/adapter_config.json: " + c.want)) << mf_last_error();
  }
}

}  // namespace
