// issue 28: a base's identity (src/model/base_id.h): written and read back
// whole; two records compared name the first spec field that differs (with
// its config.json key), the first tensor whose checksum differs or that one
// of them lacks, both values, and the way out; a malformed record is refused
// naming the key.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <string>

#include "src/model/base_id.h"
#include "src/model/hf_config.h"

namespace {

bool has(const std::string &s, const std::string &what) {
  return s.find(what) != std::string::npos;
}

class BaseId : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(mf_hf_config_load("tests/fixtures/qwen2_moe", &spec_), MF_OK) << mf_last_error();
    ASSERT_EQ(mf_param_table_build(&spec_, &t_), MF_OK) << mf_last_error();
    ASSERT_EQ(mf_base_id_init(&a_, t_, "tests/fixtures/qwen2_moe", 0, 0), MF_OK) << mf_last_error();
    for (int64_t i = 0; i < a_.n; i++) a_.tensors[i].sum = 0x1234567890abcdefull * (uint64_t)(i + 1);
  }
  void TearDown() override {
    mf_base_id_free(&a_);
    mf_param_table_free(t_);
  }
  // a_ written and read back as b.
  void RoundTrip(mf_base_id *b) {
    char *json = nullptr;
    ASSERT_EQ(mf_base_id_format(&a_, &json), MF_OK) << mf_last_error();
    ASSERT_EQ(mf_base_id_parse(json, strlen(json), "rec.json", b), MF_OK) << mf_last_error() << "\n" << json;
    free(json);
  }
  // The compare's message of rec a_ against have b ("" when they agree).
  std::string Compare(const mf_base_id &b) {
    const mf_status st = mf_base_id_compare(&a_, "rec.json", &b, "the run", "WAY OUT");
    if (st == MF_OK) return "";
    EXPECT_EQ(st, MF_ERR_CONFIG);
    return mf_last_error();
  }
  mf_model_spec spec_{};
  mf_param_table *t_ = nullptr;
  mf_base_id a_{};
};

TEST_F(BaseId, AWrittenRecordReadsBackAsTheSameBase) {
  EXPECT_EQ(a_.n, t_->n_base) << "a full fine-tune records every tensor";
  mf_base_id b{};
  RoundTrip(&b);
  EXPECT_EQ(Compare(b), "");
  EXPECT_EQ(b.n, a_.n);
  EXPECT_EQ(b.spec.rope_theta, spec_.rope_theta);
  EXPECT_EQ(b.spec.norm_eps, spec_.norm_eps);
  EXPECT_EQ(b.spec.n_mlp_only, spec_.n_mlp_only);
  EXPECT_EQ(b.from_init, 0);
  EXPECT_EQ(b.path[0], '/') << "model.path as the dir it resolves to: " << b.path;
  for (int64_t i = 0; i < b.n; i++) {
    EXPECT_STREQ(b.tensors[i].name, t_->params[i].name);
    EXPECT_EQ(b.tensors[i].sum, a_.tensors[i].sum);
  }
  mf_base_id_free(&b);
}

TEST_F(BaseId, TheFirstDifferingFieldIsNamedWithItsConfigKeyAndBothValues) {
  const struct {
    void (*edit)(mf_model_spec *);
    std::string want;
  } cases[] = {
      {[](mf_model_spec *s) { s->rope_theta = 10000.0; }, "rec.json: rope_theta: the run trained on a base"},
      {[](mf_model_spec *s) { s->norm_eps = 1e-5; }, "norm_eps (config.json: rms_norm_eps)"},
      {[](mf_model_spec *s) { s->top_k = 1; }, "top_k (config.json: num_experts_per_tok)"},
      {[](mf_model_spec *s) { s->experts = 4; }, "experts (config.json: num_experts)"},
      {[](mf_model_spec *s) { s->norm_topk_prob = !s->norm_topk_prob; }, "norm_topk_prob"},
      {[](mf_model_spec *s) { s->router_aux_loss_coef = 0.5; }, "router_aux_loss_coef"},
      {[](mf_model_spec *s) {
         s->n_mlp_only = s->n_mlp_only ? 0 : 1;
         s->mlp_only_layers[0] = 1;
       },
       "mlp_only_layers"},
  };
  for (const auto &c : cases) {
    SCOPED_TRACE(c.want);
    mf_base_id b{};
    RoundTrip(&b);
    c.edit(&b.spec);
    const std::string m = Compare(b);
    EXPECT_TRUE(has(m, c.want)) << m;
    EXPECT_TRUE(has(m, "the base loaded now (model.path ")) << m;
    EXPECT_TRUE(has(m, ": WAY OUT")) << m;
    mf_base_id_free(&b);
  }
  mf_base_id b{};
  RoundTrip(&b);
  b.spec.rope_theta = 10000.0;
  const std::string m = Compare(b);
  ASSERT_EQ(spec_.rope_theta, 1e6);
  EXPECT_TRUE(has(m, "with rope_theta 1000000.0; ") && has(m, "has rope_theta 10000.0: ")) << m;
  mf_base_id_free(&b);
}

TEST_F(BaseId, TheFirstDifferingOrMissingTensorIsNamed) {
  mf_base_id b{};
  RoundTrip(&b);
  b.tensors[3].sum ^= 1;
  b.tensors[5].sum ^= 1;
  std::string m = Compare(b);
  EXPECT_TRUE(has(m, std::string("rec.json: weights: ") + t_->params[3].name + ": ")) << m;
  char want[64];
  snprintf(want, sizeof want, "checksum %016llx; ", (unsigned long long)a_.tensors[3].sum);
  EXPECT_TRUE(has(m, want)) << m;
  snprintf(want, sizeof want, "has checksum %016llx (fp32 values)", (unsigned long long)b.tensors[3].sum);
  EXPECT_TRUE(has(m, want)) << m;
  b.tensors[3].sum ^= 1;
  b.tensors[5].sum ^= 1;
  EXPECT_EQ(Compare(b), "");
  b.n--;  // the base loaded now lacks the last tensor
  m = Compare(b);
  EXPECT_TRUE(has(m, std::string("weights: ") + t_->params[t_->n_base - 1].name + ": ") &&
              has(m, "no such tensor"))
      << m;
  b.n++;
  snprintf(b.tensors[0].name, sizeof b.tensors[0].name, "model.extra.weight");
  m = Compare(b);
  EXPECT_TRUE(has(m, "weights: model.extra.weight: the run trained on a base") &&
              has(m, "with no such tensor"))
      << m;
  mf_base_id_free(&b);
  // The spec alone (no weights known yet) agrees whatever the checksums.
  mf_base_id s{};
  mf_base_id_init_spec(&s, &spec_, "tests/fixtures/qwen2_moe");
  EXPECT_EQ(Compare(s), "");
}

TEST_F(BaseId, AModelInitBaseIsItsSeed) {
  mf_base_id i{}, j{};
  ASSERT_EQ(mf_base_id_init(&i, t_, nullptr, 1, 1), MF_OK);
  i.spec.seed = 7;
  char *json = nullptr;
  ASSERT_EQ(mf_base_id_format(&i, &json), MF_OK);
  EXPECT_TRUE(has(json, "\"model\": \"model.init\",\n  \"seed\": 7,")) << json;
  ASSERT_EQ(mf_base_id_parse(json, strlen(json), "init.json", &j), MF_OK) << mf_last_error();
  free(json);
  EXPECT_EQ(j.from_init, 1);
  EXPECT_EQ(j.bf16, 1);
  EXPECT_EQ(j.frozen_only, 1);
  EXPECT_EQ(j.n, 0) << "nothing is frozen in a table without adapters";
  j.spec.seed = 8;
  EXPECT_NE(mf_base_id_compare(&i, "init.json", &j, "the run", "WAY OUT"), MF_OK);
  EXPECT_TRUE(has(mf_last_error(),
                  "init.json: model.init.seed: the run trained on a base (model.init (qwen2_moe, "
                  "seed 7)) with seed 7; the base loaded now (model.init (qwen2_moe, seed 8)) has "
                  "seed 8"))
      << mf_last_error();
  mf_base_id_free(&i);
  mf_base_id_free(&j);
}

// An adapter dir's files (name, size, checksum) go into the record and come
// back; a record of version 1 has none.
TEST_F(BaseId, TheAdapterFilesReadBack) {
  a_.n_files = 2;
  a_.files[0] = {"adapter_model.safetensors", 81920, 0x0123456789abcdefull};
  a_.files[1] = {"adapter_config.json", 492, 0xfedcba9876543210ull};
  mf_base_id b{};
  RoundTrip(&b);
  EXPECT_EQ(b.version, MF_BASE_ID_VERSION);
  ASSERT_EQ(b.n_files, 2);
  for (int i = 0; i < 2; i++) {
    EXPECT_STREQ(b.files[i].name, a_.files[i].name);
    EXPECT_EQ(b.files[i].bytes, a_.files[i].bytes);
    EXPECT_EQ(b.files[i].sum, a_.files[i].sum);
  }
  mf_base_id_free(&b);
}

TEST(BaseIdParse, AMalformedRecordIsRefusedNamingTheKey) {
  const struct {
    std::string json, want;
  } cases[] = {
      {"{", "rec.json: line 1"},
      {"[]", "rec.json: (top level): expected an object"},
      {R"({"moefit_base": 9, "model": "model.init"})", "version 9, written by a newer moefit"},
      {R"({"moefit_base": 1, "model": "hub"})", "rec.json: model: expected \"model.path\" or \"model.init\""},
      {R"({"moefit_base": 1, "model": "model.init", "spec": {"family": "gpt2"}})",
       "spec.family: not a family"},
      {R"({"moefit_base": 1, "model": "model.init", "spec": {"family": "mixtral"}})",
       "spec.hidden: expected an integer"},
  };
  // "files", on an otherwise valid record (a model.init one, every tensor)
  std::string valid;
  {
    mf_model_spec spec{};
    ASSERT_EQ(mf_hf_config_load("tests/fixtures/qwen2_moe", &spec), MF_OK) << mf_last_error();
    mf_base_id i{};
    mf_base_id_init_spec(&i, &spec, nullptr);
    char *json = nullptr;
    ASSERT_EQ(mf_base_id_format(&i, &json), MF_OK) << mf_last_error();
    valid.assign(json, strlen(json) - 2);  // without its closing "}\n"
    free(json);
  }
  const struct {
    std::string files, want;
  } bad_files[] = {
      {R"("files": {})", "files: expected a list of at most 4"},
      {R"("files": [1, 2, 3, 4, 5])", "files: expected a list of at most 4"},
      {R"("files": [["a", 1]])", "files[0]: expected [a file name, its size in bytes, 16 hex digits]"},
      {R"("files": [["a/b", 1, "0123456789abcdef"]])", "files[0]: expected [a file name"},
      {R"("files": [["a", -1, "0123456789abcdef"]])", "files[0]: expected [a file name"},
      {R"("files": [["a", 1, "0123456789abcdeg"]])", "files[0]: the checksum is not 16 hex digits"},
  };
  for (const auto &c : bad_files) {
    SCOPED_TRACE(c.files);
    const std::string json = valid + ",\n  " + c.files + "\n}\n";
    mf_base_id b{};
    EXPECT_NE(mf_base_id_parse(json.data(), json.size(), "rec.json", &b), MF_OK) << json;
    EXPECT_TRUE(has(mf_last_error(), "rec.json: " + c.want)) << mf_last_error();
  }
  for (const auto &c : cases) {
    SCOPED_TRACE(c.json);
    mf_base_id b{};
    EXPECT_NE(mf_base_id_parse(c.json.data(), c.json.size(), "rec.json", &b), MF_OK);
    EXPECT_TRUE(has(mf_last_error(), c.want)) << mf_last_error();
    EXPECT_EQ(b.tensors, nullptr);
  }
}

// gpt_oss's fields: o_bias and sliding_window with their config.json keys, and
// the sliding layers (layer_types) as a list of indices; a record without them
// (written before gpt_oss) has the family's defaults.
TEST(BaseIdGptOss, TheSlidingLayersAndBiasesAreRecordedAndCompared) {
  mf_model_spec spec{};
  mf_model_spec_defaults(MF_FAMILY_GPT_OSS, &spec);
  spec.layers = 4, spec.experts = 8, spec.sliding_layers[2] = 0, spec.sliding_layers[3] = 1;
  mf_base_id a{};
  mf_base_id_init_spec(&a, &spec, nullptr);
  a.spec.seed = 3;
  char *json = nullptr;
  ASSERT_EQ(mf_base_id_format(&a, &json), MF_OK) << mf_last_error();
  const std::string text = json;
  free(json);
  for (const char *want : {"\"o_bias\": true,", "\"sliding_window\": 128,", "\"sliding_layers\": [0, 3]\n"})
    EXPECT_TRUE(has(text, want)) << want << " not in " << text;
  mf_base_id b{};
  ASSERT_EQ(mf_base_id_parse(text.data(), text.size(), "rec.json", &b), MF_OK) << mf_last_error();
  EXPECT_EQ(mf_base_id_compare(&a, "rec.json", &b, "the run", "WAY OUT"), MF_OK) << mf_last_error();
  for (int64_t l = 0; l < 4; l++) EXPECT_EQ(b.spec.sliding_layers[l], l == 0 || l == 3) << l;
  const struct {
    void (*edit)(mf_model_spec *);
    std::string want;
  } cases[] = {
      {[](mf_model_spec *s) { s->sliding_layers[1] = 1; },
       "sliding_layers (config.json: layer_types): the run trained on a base (model.init (gpt_oss, seed 3)) "
       "with sliding_layers [0, 3]; the base loaded now (model.init (gpt_oss, seed 3)) has sliding_layers "
       "[0, 1, 3]"},
      {[](mf_model_spec *s) { s->o_bias = 0; }, "o_bias (config.json: attention_bias)"},
      {[](mf_model_spec *s) { s->qkv_bias = 0; }, "qkv_bias (config.json: attention_bias)"},
      {[](mf_model_spec *s) { s->sliding_window = 64; }, "sliding_window: the run"},
      {[](mf_model_spec *s) { s->experts = 4; }, "experts (config.json: num_local_experts)"},
      {[](mf_model_spec *s) { s->expert_ffn = 4; }, "expert_ffn (config.json: intermediate_size)"},
  };
  for (const auto &c : cases) {
    SCOPED_TRACE(c.want);
    mf_base_id h = b;
    c.edit(&h.spec);
    EXPECT_EQ(mf_base_id_compare(&a, "rec.json", &h, "the run", "WAY OUT"), MF_ERR_CONFIG);
    EXPECT_TRUE(has(mf_last_error(), "rec.json: " + c.want)) << mf_last_error();
  }
  mf_base_id_free(&b);
  // Without the three keys: gpt_oss's defaults (layer_types' even layers).
  std::string old = text;
  for (const char *key : {"    \"o_bias\": true,\n", "    \"sliding_window\": 128,\n"})
    old.erase(old.find(key), strlen(key));
  old.replace(old.find(",\n    \"sliding_layers\": [0, 3]"), strlen(",\n    \"sliding_layers\": [0, 3]"), "");
  ASSERT_EQ(mf_base_id_parse(old.data(), old.size(), "old.json", &b), MF_OK) << mf_last_error() << old;
  EXPECT_EQ(b.spec.o_bias, 1);
  EXPECT_EQ(b.spec.sliding_window, 128);
  for (int64_t l = 0; l < 4; l++) EXPECT_EQ(b.spec.sliding_layers[l], l % 2 == 0) << l;
  mf_base_id_free(&b);
  // deepseek_v3's experts and expert_ffn keys
  mf_model_spec_defaults(MF_FAMILY_DEEPSEEK_V3, &spec);
  mf_base_id d{}, e{};
  mf_base_id_init_spec(&d, &spec, nullptr);
  e = d;
  e.spec.experts = 128;
  EXPECT_EQ(mf_base_id_compare(&d, "rec.json", &e, "the run", "WAY OUT"), MF_ERR_CONFIG);
  EXPECT_TRUE(has(mf_last_error(), "experts (config.json: n_routed_experts)")) << mf_last_error();
  e = d;
  e.spec.expert_ffn = 1024;
  EXPECT_EQ(mf_base_id_compare(&d, "rec.json", &e, "the run", "WAY OUT"), MF_ERR_CONFIG);
  EXPECT_TRUE(has(mf_last_error(), "expert_ffn (config.json: moe_intermediate_size)")) << mf_last_error();
}

TEST(BaseIdRead, AMissingFileIsNotFound) {
  mf_base_id b{};
  int found = 1;
  EXPECT_EQ(mf_base_id_read("/nonexistent/moefit_base.json", &b, &found), MF_OK) << mf_last_error();
  EXPECT_EQ(found, 0);
}

}  // namespace
