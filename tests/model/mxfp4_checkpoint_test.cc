// gpt-oss's experts as OpenAI ships them: MXFP4 codes and e8m0 scales
// (tests/fixtures/mxfp4/gpt_oss, tools/make_mxfp4_fixtures.py; the reference is
// transformers' convert_moe_packed_tensors of the same tensors, and its eager
// fp32 forward with them). Dequantized at load they give transformers' experts
// bit for bit and its logits (1e-5 relative); read as shipped under LoRA
// (train.lora.base_dtype auto) exactly the expert weights are MXFP4 blobs,
// dequantizing to the same bits; where only the config.json is there (moefit
// plan) the same weights are laid out MXFP4. A damaged file is refused naming
// the tensor.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "src/config/config.h"
#include "src/io/quant.h"
#include "src/model/hf_config.h"
#include "src/train/train.h"
#include "tests/model/parity_util.h"

namespace {

using namespace mf_parity;

const char kDir[] = "tests/fixtures/mxfp4/gpt_oss";

class Mxfp4 : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(mf_hf_config_load_quant(kDir, &spec_, &q_), MF_OK) << mf_last_error();
    ASSERT_EQ(spec_.family, MF_FAMILY_GPT_OSS);
    ASSERT_EQ(q_.kind, MF_QUANT_MXFP4);
    ASSERT_EQ(mf_safetensors_open((std::string(kDir) + "/expected.safetensors").c_str(), &ex_), MF_OK)
        << mf_last_error();
  }
  void TearDown() override {
    mf_safetensors_close(ex_);
    mf_param_table_free(t_);
    mf_config_free(cfg_);
  }
  // Expert weight i's reference values: transformers' dequantized fused tensor, at i's place in it.
  std::vector<float> reference(int64_t i) const {
    mf_param_src src;
    EXPECT_TRUE(mf_param_packed(t_, i, &src));
    const mf_param &p = t_->params[i];
    const bool down = p.role == MF_P_EXPERT_DOWN;
    char name[64];
    snprintf(name, sizeof name, "deq.%d.%s", p.layer, down ? "down_proj" : "gate_up_proj");
    const float *x = f32(ex_, name, src.shape[0] * src.shape[1] * src.shape[2]);
    EXPECT_NE(x, nullptr) << name;
    std::vector<float> out((size_t)p.numel);
    for (int64_t r = 0; x && r < p.shape[0]; r++)
      for (int64_t c = 0; c < p.shape[1]; c++)
        out[(size_t)(r * p.shape[1] + c)] = x[src.base + r * src.rs + c * src.cs];
    return out;
  }
  mf_model_spec spec_{};
  mf_hf_quant q_{};
  mf_safetensors *ex_ = nullptr;
  mf_param_table *t_ = nullptr;
  mf_config *cfg_ = nullptr;
};

int64_t expert_weights(const mf_param_table *t) {
  int64_t n = 0;
  for (int64_t i = 0; i < t->n_base; i++) n += t->params[i].expert >= 0;
  return n;
}

// Dequantized at load: transformers' experts bit for bit, and its logits.
TEST_F(Mxfp4, DequantizedAtLoadGivesTransformersExpertsAndLogits) {
  ASSERT_EQ(mf_param_table_build(&spec_, &t_), MF_OK) << mf_last_error();
  std::vector<float> w((size_t)t_->total_numel);
  ASSERT_EQ(mf_params_load(t_, (std::string(kDir) + "/model.safetensors").c_str(), w.data()), MF_OK)
      << mf_last_error();
  int64_t checked = 0;
  for (int64_t i = 0; i < t_->n_base; i++) {
    const mf_param &p = t_->params[i];
    if (p.expert < 0) continue;
    const std::vector<float> ref = reference(i);
    ASSERT_EQ(memcmp(ref.data(), w.data() + p.offset, ref.size() * sizeof(float)), 0) << p.name;
    checked++;
  }
  EXPECT_EQ(checked, spec_.layers * spec_.experts * 3);
  const mf_st_tensor *ids = mf_safetensors_find(ex_, "input_ids");
  ASSERT_TRUE(ids && ids->dtype == MF_DTYPE_I32 && ids->ndim == 2);
  const int64_t B = ids->shape[0], S = ids->shape[1];
  std::vector<int32_t> targets((size_t)(B * S), -1);
  Result r = run_model(t_, w, (const int32_t *)ids->data, targets, B, S, 0.0);
  const float *logits = f32(ex_, "logits", B * S * spec_.vocab);
  ASSERT_NE(logits, nullptr);
  EXPECT_LT(rel_err(r.logits.data(), logits, B * S * spec_.vocab), 1e-5);
}

// As shipped under LoRA: exactly the expert weights are MXFP4 blobs, each the file's codes and scales,
// dequantizing to transformers' bits; the attention, routers and biases stay float.
TEST_F(Mxfp4, ReadAsShippedUnderLora) {
  const std::string y =
      std::string("model: {path: ") + kDir +
      "}\ndata: {seq_len: 8}\ntrain: {micro_batch: 1, lora: {rank: 4, targets: [q_proj, o_proj]}}\n"
      "backend: cpu\n";
  ASSERT_EQ(
      mf_config_load_string_for(y.c_str(), y.size(), "test.yaml", nullptr, 0, MF_CONFIG_FOR_EVAL, &cfg_),
      MF_OK)
      << mf_last_error();
  ASSERT_EQ(mf_param_table_build(&spec_, &t_), MF_OK) << mf_last_error();
  mf_lora l = {4, 2.0, MF_ROLE_BIT(MF_P_Q) | MF_ROLE_BIT(MF_P_O), 0, 0.0, nullptr};
  ASSERT_EQ(mf_param_table_add_lora(t_, &l), MF_OK) << mf_last_error();
  ASSERT_EQ(mf_run_quantize_base(cfg_, kDir, t_), MF_OK) << mf_last_error();
  EXPECT_EQ(t_->base_shipped, 1);
  EXPECT_EQ(t_->base_quant, MF_QUANT_MXFP4);
  ASSERT_EQ(mf_param_table_alloc_qhome(t_), MF_OK) << mf_last_error();
  std::vector<float> w((size_t)t_->total_numel);
  ASSERT_EQ(mf_params_load(t_, kDir, w.data()), MF_OK) << mf_last_error();
  int64_t quantized = 0;
  for (int64_t i = 0; i < t_->n_base; i++) {
    const mf_param &p = t_->params[i];
    EXPECT_EQ(p.quant != 0, p.expert >= 0) << p.name;
    if (!p.quant) continue;
    quantized++;
    const mf_qweight q = mf_param_qweight(t_, i);
    std::vector<float> got((size_t)p.numel);
    mf_qweight_dequantize_f32(&q, 0, q.rows, got.data());
    const std::vector<float> ref = reference(i);
    ASSERT_EQ(memcmp(ref.data(), got.data(), ref.size() * sizeof(float)), 0) << p.name;
  }
  EXPECT_EQ(quantized, expert_weights(t_));
}

// Where only the config.json is there (moefit plan before the download): the same weights laid out MXFP4.
TEST_F(Mxfp4, PlannedFromTheConfigAlone) {
  ASSERT_EQ(mf_param_table_build(&spec_, &t_), MF_OK) << mf_last_error();
  mf_lora l = {4, 2.0, MF_ROLE_BIT(MF_P_Q), 0, 0.0, nullptr};
  ASSERT_EQ(mf_param_table_add_lora(t_, &l), MF_OK) << mf_last_error();
  ASSERT_EQ(mf_param_table_quantize_set(t_, MF_QUANT_MXFP4, 64, 0, nullptr), MF_OK) << mf_last_error();
  int64_t quantized = 0;
  for (int64_t i = 0; i < t_->n_base; i++) {
    const mf_param &p = t_->params[i];
    EXPECT_EQ(p.quant != 0, p.expert >= 0) << p.name;
    quantized += p.quant != 0;
  }
  EXPECT_EQ(quantized, expert_weights(t_));
}

// A scale of 255 (e8m0's NaN) in the file is refused naming the tensor.
TEST_F(Mxfp4, ANanScaleIsRefused) {
  std::ifstream in(std::string(kDir) + "/model.safetensors", std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  std::string bytes = ss.str();
  uint64_t hl = 0;
  memcpy(&hl, bytes.data(), 8);
  const std::string header = bytes.substr(8, hl);
  const std::string key = "\"model.layers.1.mlp.experts.down_proj_scales\":";
  const size_t at = header.find(key);
  ASSERT_NE(at, std::string::npos);
  const size_t offs = header.find("\"data_offsets\":[", at);
  ASSERT_NE(offs, std::string::npos);
  const unsigned long long first = std::stoull(header.substr(offs + 16));
  bytes[8 + hl + first + 5] = (char)255;
  char path[] = "/tmp/mxfp4_nan_XXXXXX";
  const int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(write(fd, bytes.data(), bytes.size()), (ssize_t)bytes.size());
  close(fd);
  ASSERT_EQ(mf_param_table_build(&spec_, &t_), MF_OK) << mf_last_error();
  std::vector<float> w((size_t)t_->total_numel);
  EXPECT_NE(mf_params_load(t_, path, w.data()), MF_OK);
  EXPECT_NE(std::string(mf_last_error()).find("down_proj_blocks"), std::string::npos) << mf_last_error();
  EXPECT_NE(std::string(mf_last_error()).find("255"), std::string::npos) << mf_last_error();
  unlink(path);
}

}  // namespace
