// Checkpoints shipped quantized (issue 30). tests/fixtures/bnb4
// (tools/make_bnb_fixtures.py): the four families loaded 4-bit NF4 (double
// quantized; mixtral_plain without) by transformers + bitsandbytes on the
// CPU and written by save_pretrained. tests/fixtures/fp8ckpt
// (tools/make_fp8_fixtures.py): two families with their linear weights in
// FP8 e4m3 and 128 x 128 block scales, quantized by transformers'
// FineGrainedFP8 quantizer, as DeepSeek-V3 and Qwen3-FP8 ship them. Each with
// PEFT adapters saved over it. moefit reads them as shipped
// (train.lora.base_dtype auto): the blobs dequantize to the reference's
// bits, the logits are the quantized model's (1e-5 relative) and with the
// adapters PeftModel's; without adapters the base is dequantized at load to
// the same logits. Damaged or mismatched files and configs are refused
// naming the tensor or the key.
#include <dirent.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "src/config/config.h"
#include "src/io/quant.h"
#include "src/model/hf_config.h"
#include "src/train/train.h"
#include "tests/model/parity_util.h"

namespace {

using namespace mf_parity;

const char kFixtures[] = "tests/fixtures";

// "bnb4/<name>", "fp8ckpt/<name>": every fixture dir with its expected.safetensors.
std::vector<std::string> fixture_dirs() {
  std::vector<std::string> out;
  for (const char *root : {"bnb4", "fp8ckpt"}) {
    const std::string r = std::string(kFixtures) + "/" + root;
    DIR *d = opendir(r.c_str());
    if (!d) continue;
    while (dirent *e = readdir(d)) {
      const std::string n = e->d_name;
      if (n[0] != '.' && access((r + "/" + n + "/expected.safetensors").c_str(), R_OK) == 0)
        out.push_back(std::string(root) + "/" + n);
    }
    closedir(d);
  }
  std::sort(out.begin(), out.end());
  return out;
}

// An eval config over model.path `dir` (YAML lines `extra` under train.lora).
mf_config *config_for(const std::string &dir, const std::string &lora = "", const char *const *ov = nullptr,
                      size_t n_ov = 0) {
  const std::string y = "model: {path: " + dir + "}\ndata: {seq_len: 8}\ntrain: {micro_batch: 1" +
                        (lora.empty() ? "" : ", lora: {" + lora + "}") + "}\nbackend: cpu\n";
  mf_config *cfg = nullptr;
  EXPECT_EQ(mf_config_load_string_for(y.c_str(), y.size(), "test.yaml", ov, n_ov, MF_CONFIG_FOR_EVAL, &cfg),
            MF_OK)
      << mf_last_error();
  return cfg;
}

class Shipped : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    dir_ = std::string(kFixtures) + "/" + GetParam();
    fp8_ = GetParam().rfind("fp8ckpt/", 0) == 0;
    ASSERT_EQ(mf_safetensors_open((dir_ + "/expected.safetensors").c_str(), &ex_), MF_OK) << mf_last_error();
    const mf_st_tensor *ids = mf_safetensors_find(ex_, "input_ids");
    ASSERT_TRUE(ids && ids->dtype == MF_DTYPE_I32 && ids->ndim == 2) << "input_ids [B, S] I32";
    B_ = ids->shape[0], S_ = ids->shape[1];
    ids_ = (const int32_t *)ids->data;
    targets_.assign((size_t)(B_ * S_), -1);
    for (int64_t r = 0; r < B_; r++)
      for (int64_t s = 0; s + 1 < S_; s++) targets_[r * S_ + s] = ids_[r * S_ + s + 1];
  }
  void TearDown() override {
    mf_safetensors_close(ex_);
    mf_param_table_free(t_);
    mf_config_free(cfg_);
  }
  // The table as `moefit eval --model ADAPTERS` builds it over this base: PEFT's
  // adapters, the base stored as the config says against the checkpoint;
  // then the weights and (adapters) the adapters loaded into w_.
  mf_status open_with_adapters(const char *const *ov = nullptr, size_t n_ov = 0) {
    cfg_ = config_for(dir_, "", ov, n_ov);
    if (!cfg_) return MF_ERR_CONFIG;
    mf_model_spec spec;
    MF_CHECK(mf_hf_config_load(dir_.c_str(), &spec));
    MF_CHECK(mf_param_table_build(&spec, &t_));
    mf_lora l;
    MF_CHECK(mf_lora_read_adapter_config(dir_.c_str(), t_, &l));
    const mf_status st = mf_param_table_add_lora(t_, &l);
    free(l.hot);
    MF_CHECK(st);
    MF_CHECK(mf_run_quantize_base(cfg_, dir_.c_str(), t_));
    MF_CHECK(mf_param_table_alloc_qhome(t_));
    w_.assign((size_t)t_->total_numel, 0.0f);
    MF_CHECK(mf_params_load(t_, dir_.c_str(), w_.data()));
    return mf_params_load_adapters(t_, dir_.c_str(), w_.data());
  }
  Result run(const std::vector<float> &w) const {
    return run_model(t_, w, ids_, targets_, B_, S_, t_->spec.router_aux_loss_coef);
  }
  const float *expected(const char *name) const { return f32(ex_, name, B_ * S_ * t_->spec.vocab); }
  std::string dir_;
  bool fp8_ = false;
  mf_safetensors *ex_ = nullptr;
  int64_t B_ = 0, S_ = 0;
  const int32_t *ids_ = nullptr;
  std::vector<int32_t> targets_;
  mf_config *cfg_ = nullptr;
  mf_param_table *t_ = nullptr;
  std::vector<float> w_;
};

// As shipped: exactly the weights the file stores quantized are, in its
// format (NF4: its blocks and double quantization), and they dequantize to
// the reference's bits (bitsandbytes' dequantize_4bit; FP8: torch's
// weight.float() * scale_inv over each 128 x 128 block).
TEST_P(Shipped, TheBaseIsReadAsShipped) {
  ASSERT_EQ(open_with_adapters(), MF_OK) << mf_last_error();
  EXPECT_EQ(t_->base_shipped, 1);
  EXPECT_EQ(t_->base_quant, fp8_ ? MF_QUANT_FP8 : MF_QUANT_NF4);
  EXPECT_EQ(t_->base_nested, !fp8_ && GetParam() != "bnb4/mixtral_plain");
  mf_safetensors *st = nullptr;
  ASSERT_EQ(mf_safetensors_open(dir_.c_str(), &st), MF_OK) << mf_last_error();
  int64_t quantized = 0, checked = 0;
  for (int64_t i = 0; i < t_->n_base; i++) {
    const mf_param &p = t_->params[i];
    EXPECT_EQ(p.quant, (int)mf_shipped_kind(st, p.name)) << p.name;
    if (!p.quant) continue;
    quantized++;
    if (!fp8_) {
      EXPECT_EQ(t_->base_blocksize, 64) << "transformers' Linear4bit blocks";
    }
    const float *ref = f32(ex_, std::string("deq.") + p.name, p.numel);
    if (!ref) continue;
    const mf_qweight q = mf_param_qweight(t_, i);
    std::vector<float> got((size_t)p.numel);
    mf_qweight_dequantize_f32(&q, 0, q.rows, got.data());
    EXPECT_EQ(memcmp(got.data(), ref, got.size() * 4), 0) << p.name;
    checked++;
  }
  mf_safetensors_close(st);
  EXPECT_GT(quantized, 0);
  EXPECT_GE(checked, 2) << "expected.safetensors names deq.<weight> of an attention and an expert projection";
}

// The quantized model's logits: the adapters with B = 0 (PEFT's identity).
TEST_P(Shipped, LogitsAreTheQuantizedModels) {
  ASSERT_EQ(open_with_adapters(), MF_OK) << mf_last_error();
  std::vector<float> w = w_;
  for (int64_t i = t_->n_base; i < t_->n; i++)
    if (t_->params[i].role == MF_P_LORA_B)
      std::fill(w.begin() + t_->params[i].offset, w.begin() + t_->params[i].offset + t_->params[i].numel,
                0.0f);
  const Result r = run(w);
  const float *want = expected("logits");
  ASSERT_NE(want, nullptr) << "logits [B, S, V] F32";
  EXPECT_LT(rel_err(r.logits.data(), want, (int64_t)r.logits.size()), 1e-5);
}

// PEFT's adapters saved over the quantized model: PeftModel's logits; and
// they matter (the quantized model's logits are far from them).
TEST_P(Shipped, PeftAdaptersGivePeftModelsLogits) {
  ASSERT_EQ(open_with_adapters(), MF_OK) << mf_last_error();
  const Result r = run(w_);
  const float *want = expected("peft_logits"), *base = expected("logits");
  ASSERT_TRUE(want && base);
  EXPECT_LT(rel_err(r.logits.data(), want, (int64_t)r.logits.size()), 1e-5);
  EXPECT_GT(rel_err(base, want, (int64_t)r.logits.size()), 1e-3) << "the fixture's adapters change nothing";
}

// No adapters (a full model, rank 0): the base dequantized at load into the
// float weights, the same logits.
TEST_P(Shipped, WithoutAdaptersTheBaseIsDequantizedAtLoad) {
  cfg_ = config_for(dir_);
  ASSERT_NE(cfg_, nullptr);
  float *w = nullptr;
  char desc[256];
  ASSERT_EQ(mf_run_load_model(cfg_, nullptr, &t_, &w, desc, sizeof desc), MF_OK) << mf_last_error();
  EXPECT_EQ(t_->base_quant, MF_QUANT_NONE);
  EXPECT_EQ(t_->qhome_bytes, 0);
  w_.assign(w, w + t_->total_numel);
  free(w);
  const Result r = run(w_);
  const float *want = expected("logits");
  ASSERT_NE(want, nullptr);
  EXPECT_LT(rel_err(r.logits.data(), want, (int64_t)r.logits.size()), 1e-5);
}

// base_dtype bf16 with adapters: dequantized at load as well, PeftModel's logits.
TEST_P(Shipped, Bf16DequantizesAtLoad) {
  const char *ov[] = {"train.lora.base_dtype=bf16"};
  ASSERT_EQ(open_with_adapters(ov, 1), MF_OK) << mf_last_error();
  EXPECT_EQ(t_->base_quant, MF_QUANT_NONE);
  const Result r = run(w_);
  const float *want = expected("peft_logits");
  ASSERT_NE(want, nullptr);
  EXPECT_LT(rel_err(r.logits.data(), want, (int64_t)r.logits.size()), 1e-5);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, Shipped, ::testing::ValuesIn(fixture_dirs()),
                         [](const ::testing::TestParamInfo<std::string> &i) {
                           std::string n = i.param;
                           std::replace(n.begin(), n.end(), '/', '_');
                           return n;
                         });

TEST(ShippedFixtures, ArePresent) {
  const std::vector<std::string> d = fixture_dirs();
  EXPECT_EQ(std::count_if(d.begin(), d.end(), [](const std::string &n) { return n.rfind("bnb4/", 0) == 0; }),
            5)
      << "tests/fixtures/bnb4: the four families and mixtral_plain";
  EXPECT_EQ(
      std::count_if(d.begin(), d.end(), [](const std::string &n) { return n.rfind("fp8ckpt/", 0) == 0; }), 2)
      << "tests/fixtures/fp8ckpt: qwen3_moe and mixtral";
}

// ------------------------------------------------------------ refusals

// A copy of fixture's model.safetensors with tensor `name`
// replaced by `repl` (dtype, shape, bytes), or removed (repl NULL), written
// with its config.json into a fresh dir; returns the dir.
struct Damage {
  std::string name;
  bool remove = false;
  mf_dtype dtype = MF_DTYPE_INVALID;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};

std::string damaged_copy(const std::string &label, const Damage &d, const std::string &fixture) {
  const char *tmp = getenv("TEST_TMPDIR");
  const std::string src = std::string(kFixtures) + "/" + fixture,
                    out = std::string(tmp ? tmp : "/tmp") + "/shipped_" + label;
  EXPECT_EQ(system(("rm -rf " + out + " && mkdir -p " + out + " && cp " + src + "/config.json " + src +
                    "/adapter_config.json " + src + "/adapter_model.safetensors " + out + "/")
                       .c_str()),
            0);
  mf_safetensors *st = nullptr;
  EXPECT_EQ(mf_safetensors_open((src + "/model.safetensors").c_str(), &st), MF_OK) << mf_last_error();
  std::vector<mf_st_tensor> ts;
  for (size_t i = 0; i < mf_safetensors_count(st); i++) {
    mf_st_tensor x = *mf_safetensors_get(st, i);
    if (d.name == x.name) {
      if (d.remove) continue;
      x.dtype = d.dtype;
      x.ndim = (int)d.shape.size();
      x.numel = 1;
      for (size_t k = 0; k < d.shape.size(); k++) x.shape[k] = d.shape[k], x.numel *= (uint64_t)d.shape[k];
      x.nbytes = d.bytes.size();
      x.data = d.bytes.data();
    }
    ts.push_back(x);
  }
  EXPECT_EQ(mf_safetensors_write((out + "/model.safetensors").c_str(), ts.data(), ts.size(), nullptr, 0),
            MF_OK)
      << mf_last_error();
  mf_safetensors_close(st);
  return out;
}

// One of a fixture's quantized weights and its pieces' bytes.
struct Piece {
  std::string fixture, weight;
  std::vector<uint8_t> bytes(const std::string &suffix) const {
    mf_safetensors *st = nullptr;
    EXPECT_EQ(
        mf_safetensors_open((std::string(kFixtures) + "/" + fixture + "/model.safetensors").c_str(), &st),
        MF_OK);
    const mf_st_tensor *x = mf_safetensors_find(st, (weight + suffix).c_str());
    std::vector<uint8_t> out;
    if (x) out.assign((const uint8_t *)x->data, (const uint8_t *)x->data + x->nbytes);
    mf_safetensors_close(st);
    return out;
  }
};

// Loads dir as `moefit eval --model dir` would; *msg: the last error. keep
// (not NULL): the table is handed over instead of freed.
mf_status load_damaged(const std::string &dir, std::string *msg, mf_param_table **keep = nullptr) {
  mf_config *cfg = config_for(dir);
  mf_model_spec spec;
  mf_param_table *t = nullptr;
  mf_status st = mf_hf_config_load(dir.c_str(), &spec);
  if (st == MF_OK) st = mf_param_table_build(&spec, &t);
  mf_lora l;
  if (st == MF_OK) st = mf_lora_read_adapter_config(dir.c_str(), t, &l);
  if (st == MF_OK) {
    st = mf_param_table_add_lora(t, &l);
    free(l.hot);
  }
  if (st == MF_OK) st = mf_run_quantize_base(cfg, dir.c_str(), t);
  if (st == MF_OK) st = mf_param_table_alloc_qhome(t);
  std::vector<float> w(t ? (size_t)t->total_numel : 0);
  if (st == MF_OK) st = mf_params_load(t, dir.c_str(), w.data());
  *msg = mf_last_error();
  if (keep && st == MF_OK)
    *keep = t;
  else
    mf_param_table_free(t);
  mf_config_free(cfg);
  return st;
}

// One damaged copy per case: refused (MF_ERR_FORMAT) naming the dir and each of want.
struct DamageCase {
  const char *label;
  Damage d;
  const char *want[3];
};

void expect_refused(const DamageCase *cases, size_t n, const std::string &fixture) {
  for (size_t i = 0; i < n; i++) {
    const DamageCase &c = cases[i];
    SCOPED_TRACE(c.label);
    Damage d = c.d;
    if (d.shape.empty() && !d.remove) d.shape = {(int64_t)d.bytes.size()};
    const std::string dir = damaged_copy(c.label, d, fixture);
    std::string msg;
    const mf_status st = load_damaged(dir, &msg);
    EXPECT_EQ(st, MF_ERR_FORMAT) << msg;
    EXPECT_NE(msg.find(dir), std::string::npos) << msg;
    for (const char *w : c.want) {
      if (!w) continue;
      EXPECT_NE(msg.find(w), std::string::npos) << "'" << w << "' not in: " << msg;
    }
  }
}

TEST(ShippedDamaged, Bnb4IsRefusedNamingTheTensorAndTheFault) {
  const Piece q{"bnb4/mixtral", "model.layers.0.self_attn.q_proj.weight"};
  const std::vector<uint8_t> absmax = q.bytes(".absmax"), map = q.bytes(".quant_map"),
                             qs = q.bytes(".quant_state.bitsandbytes__nf4"), packed = q.bytes("");
  ASSERT_FALSE(absmax.empty() || map.empty() || qs.empty() || packed.empty())
      << q.weight << " is not stored 4-bit, double quantized, in the mixtral fixture";
  const std::string js(qs.begin(), qs.end());
  auto json_bytes = [](const std::string &s) { return std::vector<uint8_t>(s.begin(), s.end()); };
  auto replace = [&](const std::string &from, const std::string &to) {
    std::string s = js;
    const size_t at = s.find(from);
    EXPECT_NE(at, std::string::npos) << from << " not in " << js;
    if (at != std::string::npos) s.replace(at, from.size(), to);
    return s;
  };
  std::vector<uint8_t> bad_map = map;
  bad_map[4 * 3] ^= 1;
  std::vector<uint8_t> short_absmax(absmax.begin(), absmax.end() - 1);
  const std::string qsn = q.weight + ".quant_state.bitsandbytes__nf4";
  const DamageCase cases[] = {
      {"absmax_short",
       {q.weight + ".absmax", false, MF_DTYPE_U8, {(int64_t)short_absmax.size()}, short_absmax},
       {".absmax", "U8 [", "double-quantized"}},
      {"absmax_missing", {q.weight + ".nested_absmax", true}, {".nested_absmax", "missing", nullptr}},
      {"quant_map",
       {q.weight + ".quant_map", false, MF_DTYPE_F32, {16}, bad_map},
       {".quant_map[3]", "NF4", nullptr}},
      {"shape",
       {qsn, false, MF_DTYPE_U8, {}, json_bytes(replace("\"shape\": [", "\"shape\": [2"))},
       {"quant_state", "shape", "the config says"}},
      {"shape_rank",
       {qsn, false, MF_DTYPE_U8, {}, json_bytes(replace("\"shape\": [", "\"shape\": [1, "))},
       {"quant_state", "shape must be [rows, cols]", nullptr}},
      {"blocksize",
       {qsn, false, MF_DTYPE_U8, {}, json_bytes(replace("\"blocksize\": 64", "\"blocksize\": 48"))},
       {"blocksize 48", "power of two", nullptr}},
      {"json",
       {qsn, false, MF_DTYPE_U8, {}, json_bytes(js.substr(0, js.size() / 2))},
       {"invalid JSON", nullptr, nullptr}},
      {"packed_short",
       {q.weight,
        false,
        MF_DTYPE_U8,
        {(int64_t)packed.size() - 1, 1},
        std::vector<uint8_t>(packed.begin(), packed.end() - 1)},
       {q.weight.c_str(), "packed in U8", nullptr}},
  };
  expect_refused(cases, sizeof cases / sizeof cases[0], q.fixture);
}

TEST(ShippedDamaged, Fp8IsRefusedNamingTheTensorAndTheFault) {
  const Piece q{"fp8ckpt/qwen3_moe", "model.layers.0.self_attn.q_proj.weight"};
  const std::vector<uint8_t> codes = q.bytes(""), scales = q.bytes("_scale_inv");
  ASSERT_FALSE(codes.empty() || scales.empty()) << q.weight << " is not stored fp8 in " << q.fixture;
  mf_safetensors *st = nullptr;
  ASSERT_EQ(mf_safetensors_open((std::string(kFixtures) + "/" + q.fixture).c_str(), &st), MF_OK)
      << mf_last_error();
  const mf_st_tensor *w = mf_safetensors_find(st, q.weight.c_str()),
                     *s = mf_safetensors_find(st, (q.weight + "_scale_inv").c_str());
  ASSERT_TRUE(w && s && w->ndim == 2 && s->ndim == 2);
  const std::vector<int64_t> wshape = {(int64_t)w->shape[0], (int64_t)w->shape[1]},
                             sshape = {(int64_t)s->shape[0], (int64_t)s->shape[1]};
  mf_safetensors_close(st);
  std::vector<uint8_t> nan_code = codes, inf_scale = scales, neg_scale = scales;
  nan_code[wshape[1] + 3] = 0xff;  // [1, 3]: -NaN
  const float inf = INFINITY, neg = -0.5f;
  memcpy(inf_scale.data(), &inf, 4);
  memcpy(neg_scale.data() + inf_scale.size() - 4, &neg, 4);
  const std::string sn = q.weight + "_scale_inv";
  const DamageCase cases[] = {
      {"fp8_scale_missing", {sn, true}, {q.weight.c_str(), "F8_E4M3", "_scale_inv are missing"}},
      {"fp8_scale_shape",
       {sn, false, MF_DTYPE_F32, {sshape[0] * sshape[1] * 2, 1}, std::vector<uint8_t>(scales.size() * 2)},
       {"_scale_inv is F32 [", "the scales of a", nullptr}},
      {"fp8_scale_dtype",
       {sn, false, MF_DTYPE_F16, {sshape[0], sshape[1] * 2}, scales},
       {"_scale_inv is F16", nullptr, nullptr}},
      {"fp8_weight_dtype", {q.weight, false, MF_DTYPE_U8, wshape, codes}, {"is U8 [", "F8_E4M3 [", nullptr}},
      {"fp8_weight_shape",
       {q.weight, false, MF_DTYPE_F8_E4M3, {wshape[1], wshape[0]}, codes},
       {"F8_E4M3 [", nullptr, nullptr}},
      {"fp8_nan",
       {q.weight, false, MF_DTYPE_F8_E4M3, wshape, nan_code},
       {"element [1, 3]", "e4m3 NaN", nullptr}},
      {"fp8_scale_inf",
       {sn, false, MF_DTYPE_F32, sshape, inf_scale},
       {"weight_scale_inv[0, 0]", "inf", nullptr}},
      {"fp8_scale_negative",
       {sn, false, MF_DTYPE_F32, sshape, neg_scale},
       {"weight_scale_inv[", "-0.5", nullptr}},
  };
  expect_refused(cases, sizeof cases / sizeof cases[0], q.fixture);
}

// Block scales stored BF16 (as some FP8 releases store them) are widened
// exactly: each element is its e4m3 code times the bf16 scale of its block.
TEST(ShippedFp8, Bf16ScalesAreWidenedExactly) {
  const Piece q{"fp8ckpt/qwen3_moe", "model.layers.0.self_attn.q_proj.weight"};
  const std::vector<uint8_t> codes = q.bytes(""), scales = q.bytes("_scale_inv");
  ASSERT_FALSE(codes.empty() || scales.empty());
  const size_t nb = scales.size() / 4;
  std::vector<uint8_t> half(2 * nb);
  std::vector<float> widened(nb);
  for (size_t k = 0; k < nb; k++) {
    float f;
    memcpy(&f, scales.data() + 4 * k, 4);
    const uint16_t b = mf_fp32_to_bf16(f);
    memcpy(half.data() + 2 * k, &b, 2);
    widened[k] = mf_bf16_to_fp32(b);
    EXPECT_NE(widened[k], f) << "scale " << k << " is bf16 already: the test would not see a widening";
  }
  mf_safetensors *st = nullptr;
  ASSERT_EQ(mf_safetensors_open((std::string(kFixtures) + "/" + q.fixture).c_str(), &st), MF_OK);
  const mf_st_tensor *s = mf_safetensors_find(st, (q.weight + "_scale_inv").c_str());
  ASSERT_TRUE(s && s->ndim == 2);
  const int64_t sr = (int64_t)s->shape[0], sc = (int64_t)s->shape[1];
  mf_safetensors_close(st);
  const std::string dir = damaged_copy(
      "fp8_scale_bf16", {q.weight + "_scale_inv", false, MF_DTYPE_BF16, {sr, sc}, half}, q.fixture);
  std::string msg;
  mf_param_table *t = nullptr;
  ASSERT_EQ(load_damaged(dir, &msg, &t), MF_OK) << msg;
  const int64_t i = mf_param_find(t, q.weight.c_str());
  ASSERT_GE(i, 0);
  ASSERT_EQ(t->params[i].quant, MF_QUANT_FP8);
  const mf_qweight w = mf_param_qweight(t, i);
  std::vector<float> got((size_t)(w.rows * w.cols));
  mf_qweight_dequantize_f32(&w, 0, w.rows, got.data());
  size_t bad = 0;
  for (int64_t r = 0; r < w.rows; r++)
    for (int64_t c = 0; c < w.cols; c++) {
      const float want = mf_qf_e4m3(codes[r * w.cols + c]) * widened[(r / 128) * sc + c / 128];
      bad += memcmp(&got[r * w.cols + c], &want, 4) != 0;
    }
  EXPECT_EQ(bad, 0u);
  mf_param_table_free(t);
}

// `moefit plan` needs only config.json: without the weights the base is laid
// out as transformers quantizes (every linear weight but the LM head) in
// Linear4bit's blocks of 64, as shipped.
TEST(ShippedConfig, PlannedFromTheConfigAlone) {
  const char *tmp = getenv("TEST_TMPDIR");
  for (const char *fixture : {"bnb4/qwen3_moe", "fp8ckpt/mixtral"}) {
    SCOPED_TRACE(fixture);
    const bool fp8 = strncmp(fixture, "fp8", 3) == 0;
    const std::string dir = std::string(tmp ? tmp : "/tmp") + "/config_only_" + (fp8 ? "fp8" : "bnb4");
    ASSERT_EQ(system(("rm -rf " + dir + " && mkdir -p " + dir + " && cp " + kFixtures + "/" + fixture +
                      "/config.json " + dir)
                         .c_str()),
              0);
    mf_config *cfg = config_for(dir, "rank: 4");
    ASSERT_NE(cfg, nullptr);
    mf_param_table *t = nullptr;
    ASSERT_EQ(mf_run_model_table(cfg, nullptr, nullptr, &t), MF_OK) << mf_last_error();
    EXPECT_EQ(t->base_shipped, 1);
    EXPECT_EQ(t->base_quant, fp8 ? MF_QUANT_FP8 : MF_QUANT_NF4);
    if (!fp8) {
      EXPECT_EQ(t->base_blocksize, 64);
    }
    EXPECT_EQ(t->base_nested, fp8 ? 0 : 1);
    EXPECT_EQ(t->qhome, nullptr) << "a plan allocates no quantized home";
    EXPECT_GT(t->qhome_bytes, 0);
    for (int64_t i = 0; i < t->n_base; i++) {
      const mf_param &p = t->params[i];
      EXPECT_EQ(p.quant != 0, p.frozen && p.ndim == 2 && p.role != MF_P_EMBED && i != mf_param_lm_head(t))
          << p.name;
    }
    mf_param_table_free(t);
    mf_config_free(cfg);
  }
}

// A format set against the checkpoint's is refused naming the key.
TEST(ShippedConfig, SettingsAgainstTheCheckpointAreRefused) {
  const struct {
    const char *fixture, *ov, *want;
  } cases[] = {
      {"bnb4/mixtral", "train.lora.base_dtype=fp8", "not quantized again"},
      {"bnb4/mixtral", "train.lora.base_blocksize=128", "ships nf4 in blocks of 64"},
      {"bnb4/mixtral", "train.lora.base_double_quant=false", "ships nf4 double quantized"},
      {"fp8ckpt/qwen3_moe", "train.lora.base_dtype=nf4", "not quantized again"},
      {"fp8ckpt/qwen3_moe", "train.lora.base_double_quant=true", "ships fp8 without double quantization"},
  };
  for (const auto &c : cases) {
    SCOPED_TRACE(c.ov);
    const std::string dir = std::string(kFixtures) + "/" + c.fixture;
    mf_config *cfg = config_for(dir, "rank: 4", &c.ov, 1);
    ASSERT_NE(cfg, nullptr);
    mf_param_table *t = nullptr;
    EXPECT_EQ(mf_run_model_table(cfg, nullptr, nullptr, &t), MF_ERR_CONFIG);
    const std::string msg = mf_last_error();
    EXPECT_NE(msg.find(c.want), std::string::npos) << msg;
    EXPECT_NE(msg.find(c.ov, 0, strchr(c.ov, '=') - c.ov), std::string::npos) << msg;
    mf_param_table_free(t);
    mf_config_free(cfg);
  }
}

}  // namespace
