// Parity with PEFT on transformers (fixtures written by
// tools/make_lora_fixtures.py, tests/fixtures/lora/NOTES.md; and QLoRA's, by
// tools/make_qlora_fixtures.py, tests/fixtures/qlora/NOTES.md: the same
// adapters over the base loaded as bitsandbytes NF4, which moefit quantizes
// at load with train.lora.base_dtype nf4 and dequantizes on the device): for each family,
// LoRA adapters (PEFT's own adapter_model.safetensors, non-zero A and B) on
// the attention and every MLP projection over the frozen base of
// tests/fixtures/<family>: one batch through the cpu backend in fp32 must give
// PEFT's logits and loss (1e-5 relative), every adapter's gradient (1e-4
// relative in norm; none for an idle expert's, as PEFT leaves .grad None),
// and the adapters after one AdamW step over them alone; the base gets no
// gradient at all.
#include <dirent.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "src/io/quant.h"
#include "src/model/hf_config.h"
#include "src/optim/optim.h"
#include "tests/model/parity_util.h"

namespace {

using namespace mf_parity;

const char kFixtures[] = "tests/fixtures";

// "lora/<name>" and "qlora/<name>" for each fixture dir.
std::vector<std::string> lora_fixture_names() {
  std::vector<std::string> out;
  for (const char *kind : {"lora", "qlora"}) {
    const std::string root = std::string(kFixtures) + "/" + kind;
    DIR *d = opendir(root.c_str());
    if (!d) continue;
    while (dirent *e = readdir(d)) {
      std::string n = e->d_name;
      if (n[0] == '.') continue;
      if (access((root + "/" + n + "/fixture.safetensors").c_str(), R_OK) == 0) out.push_back(kind + ("/" + n));
    }
    closedir(d);
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::string flat(std::string s) {
  std::replace(s.begin(), s.end(), '/', '_');
  return s;
}

// The quoted names of a JSON list of strings ("[\"q_proj\", \"v_proj\"]").
std::vector<std::string> json_names(const char *list) {
  std::vector<std::string> out;
  for (const char *p = list ? strchr(list, '"') : nullptr; p; p = strchr(p, '"')) {
    const char *e = strchr(p + 1, '"');
    if (!e) break;
    out.emplace_back(p + 1, e);
    p = e + 1;
  }
  return out;
}

class LoraParity : public FixtureTest {
 protected:
  void SetUp() override {
    dir_ = std::string(kFixtures) + "/" + GetParam();
    ASSERT_EQ(mf_safetensors_open((dir_ + "/fixture.safetensors").c_str(), &fx_), MF_OK) << mf_last_error();
    // the base model: the family's fixture, or the one base_fixture names (the hot experts' fixture)
    const char *bf = mf_safetensors_metadata(fx_, "base_fixture");
    const std::string name = GetParam().substr(GetParam().find('/') + 1);
    const std::string base = std::string(kFixtures) + "/" + (bf ? std::string(bf) : name);
    ASSERT_EQ(mf_hf_config_load(base.c_str(), &spec_), MF_OK) << mf_last_error();
    ASSERT_EQ(mf_param_table_build(&spec_, &t_), MF_OK) << mf_last_error();
    // PEFT's own adapter_config.json, read as moefit reads an adapter dir;
    // against the fixture's metadata.
    mf_lora l{};
    ASSERT_EQ(mf_lora_read_adapter_config(dir_.c_str(), t_, &l), MF_OK) << mf_last_error();
    EXPECT_EQ((double)l.rank, meta_num(fx_, "r"));
    EXPECT_EQ(l.scale, meta_num(fx_, "scaling"));
    uint64_t roles = 0; /* short names' roles, and full module names' */
    for (const std::string &m : json_names(mf_safetensors_metadata(fx_, "target_modules"))) {
      roles |= mf_lora_target_roles(spec_.family, m.c_str());
      const int32_t i = mf_param_find(t_, (m + ".weight").c_str());
      if (i >= 0) roles |= MF_ROLE_BIT(t_->params[i].role);
    }
    EXPECT_EQ(l.roles, roles);
    EXPECT_EQ(l.train_router, 0);
    check_hot(l.hot);
    const mf_status added = mf_param_table_add_lora(t_, &l);
    free(l.hot);
    ASSERT_EQ(added, MF_OK) << mf_last_error();
    // QLoRA: the base quantized as the fixture's was (bitsandbytes NF4, blocks of 64)
    const char *bd = mf_safetensors_metadata(fx_, "base_dtype");
    quantized_ = bd != nullptr;
    if (quantized_) {
      ASSERT_STREQ(bd, "nf4");
      ASSERT_STREQ(mf_safetensors_metadata(fx_, "base_double_quant"), "false");
      ASSERT_EQ(mf_param_table_quantize_base(t_, MF_QUANT_NF4, (int64_t)meta_num(fx_, "base_blocksize"), 0), MF_OK)
          << mf_last_error();
      ASSERT_EQ(mf_param_table_alloc_qhome(t_), MF_OK) << mf_last_error();
    }
    w_.resize((size_t)t_->total_numel);
    ASSERT_EQ(mf_params_load(t_, (base + "/model.safetensors").c_str(), w_.data()), MF_OK) << mf_last_error();
    ASSERT_EQ(mf_params_load_adapters(t_, dir_.c_str(), w_.data()), MF_OK) << mf_last_error();
    ASSERT_TRUE(batch_of(fx_, &bt_)) << "input_ids, labels [B, S] I32 and router_aux_loss_coef";
  }
  bool quantized_ = false;
  // PEFT's name of an adapter in adapter_model.safetensors.
  static std::string peft(const mf_param &p) { return std::string("base_model.model.") + p.name; }
  // The hot set read from target_modules against the fixture's lora_hot
  // ([layers, experts] I32 0/1, written where only some routed experts are
  // adapted); none without it.
  void check_hot(const uint8_t *hot) {
    const mf_st_tensor *h = mf_safetensors_find(fx_, "lora_hot");
    if (!h) {
      EXPECT_EQ(hot, nullptr) << "a hot set where the fixture adapts every routed expert";
      return;
    }
    const int64_t LE = spec_.layers * spec_.experts;
    ASSERT_EQ(h->dtype, MF_DTYPE_I32);
    ASSERT_EQ(h->nbytes, (size_t)LE * 4);
    ASSERT_NE(hot, nullptr) << "no hot set read from target_modules";
    const int32_t *want = (const int32_t *)h->data;
    int64_t n = 0;
    for (int64_t i = 0; i < LE; i++) {
      EXPECT_EQ((int)hot[i], want[i]) << "layer " << i / spec_.experts << " expert " << i % spec_.experts;
      n += hot[i];
    }
    EXPECT_GT(n, 0);
    EXPECT_LT(n, LE);
  }
};

// QLoRA: every weight bitsandbytes quantized (every linear but lm_head) is
// quantized here, and dequantizes to its bits (the fixture's deq.<name>, from
// bitsandbytes' dequantize_4bit); LoRA: nothing is quantized.
TEST_P(LoraParity, TheQuantizedBaseIsBitsandbytes) {
  int64_t quantized = 0, deq = 0;
  for (size_t k = 0; k < mf_safetensors_count(fx_); k++)
    deq += strncmp(mf_safetensors_get(fx_, k)->name, "deq.", 4) == 0;
  for (int64_t i = 0; i < t_->n; i++) {
    const mf_param &p = t_->params[i];
    const float *ref = f32(fx_, std::string("deq.") + p.name, p.numel);
    EXPECT_EQ(p.quant != 0, ref != nullptr) << p.name << (p.quant ? " is quantized; bitsandbytes left it" : " is not quantized; bitsandbytes quantized it");
    if (!p.quant || !ref) continue;
    quantized++;
    const mf_qweight q = mf_param_qweight(t_, i);
    std::vector<float> got((size_t)p.numel);
    mf_qweight_dequantize_f32(&q, 0, q.rows, got.data());
    EXPECT_EQ(memcmp(got.data(), ref, got.size() * 4), 0) << p.name;
  }
  EXPECT_EQ(quantized, deq);
  EXPECT_EQ(quantized > 0, quantized_);
}

TEST_P(LoraParity, LogitsAndLoss) {
  Result r = run(w_);
  expect_logits_and_losses(r, fx_, n_logits());
}

// The adapters move the logits: without them (B = 0) the check fails.
TEST_P(LoraParity, TheAdaptersMatter) {
  std::vector<float> w = w_;
  for (int64_t i = t_->n_base; i < t_->n; i++)
    if (t_->params[i].role == MF_P_LORA_B)
      std::fill(w.begin() + t_->params[i].offset, w.begin() + t_->params[i].offset + t_->params[i].numel,
                0.0f);
  Result r = run(w);
  const float *logits = f32(fx_, "logits", n_logits());
  ASSERT_NE(logits, nullptr);
  EXPECT_GT(rel_err(r.logits.data(), logits, n_logits()), 1e-3);
}

TEST_P(LoraParity, EveryAdapterGradientAndNoneForTheBase) {
  Result r = run(w_);
  const std::string no_grad =
      mf_safetensors_metadata(fx_, "no_grad") ? mf_safetensors_metadata(fx_, "no_grad") : "[]";
  // The base has no gradient tensor and no optimizer state in the program;
  // the trained parameters' gradients are laid out at their toff.
  mf_program_opts po = {bt_.B, bt_.S, 1, bt_.aux_coef, 0, 0};
  mf_program *prog = nullptr;
  ASSERT_EQ(mf_program_build(t_, &po, &prog), MF_OK) << mf_last_error();
  int64_t at = 0;
  for (int64_t i = 0; i < t_->n; i++) {
    const mf_param &p = t_->params[i];
    EXPECT_EQ(prog->grad_tensor[i] < 0, (bool)p.frozen) << p.name;
    EXPECT_EQ(prog->state_tensor[i] < 0, (bool)p.frozen) << p.name;
    EXPECT_EQ(p.toff, p.frozen ? -1 : at) << p.name;
    at += p.frozen ? 0 : p.numel;
  }
  EXPECT_EQ(at, t_->trainable_numel);
  for (int32_t k = 0; k < prog->n_tensors; k++)
    if (prog->tensors[k].kind == MF_T_GRAD) {
      EXPECT_FALSE(t_->params[prog->tensors[k].param].frozen);
    }
  mf_program_free(prog);
  int checked = 0, idle = 0;
  for (int64_t i = 0; i < t_->n; i++) {
    const mf_param &p = t_->params[i];
    if (p.frozen) continue;
    const float *got = r.grads.data() + p.toff;
    const float *ref = f32(fx_, "grad." + peft(p), p.numel);
    if (!ref) {  // PEFT left .grad None: an idle expert's adapter
      EXPECT_NE(no_grad.find("\"" + peft(p) + "\""), std::string::npos) << p.name << " has no reference";
      ASSERT_GE(p.expert, 0) << p.name;
      EXPECT_EQ(r.expert_tokens[p.layer * spec_.experts + p.expert], 0) << p.name;
      for (int64_t j = 0; j < p.numel; j++) ASSERT_EQ(got[j], 0.0f) << p.name;
      idle++;
      continue;
    }
    EXPECT_LT(rel_err(got, ref, p.numel), 1e-4) << p.name;
    checked++;
  }
  EXPECT_GT(checked, 0);
  EXPECT_EQ(checked + idle, t_->n - t_->n_base) << "every adapter is trained";
}

// moefit's gradients through AdamW over the adapters alone give PEFT's
// adapters after its step (tolerance as parity_test's end to end).
TEST_P(LoraParity, OneAdamWStepOverTheAdapters) {
  Result r = run(w_);
  const mf_adamw_hparams h = {meta_num(fx_, "lr"), meta_num(fx_, "beta1"), meta_num(fx_, "beta2"),
                              meta_num(fx_, "eps"), meta_num(fx_, "weight_decay")};
  ASSERT_TRUE(std::isfinite(h.lr) && std::isfinite(h.weight_decay));
  const int idle_has_grad = mf_family_idle_expert_has_grad(spec_.family);
  double worst = 0;
  std::string worst_at;
  for (int64_t i = t_->n_base; i < t_->n; i++) {
    const mf_param &p = t_->params[i];
    std::vector<float> w(w_.begin() + p.offset, w_.begin() + p.offset + p.numel);
    std::vector<float> m(w.size(), 0.0f), v(w.size(), 0.0f);
    const bool idle = p.expert >= 0 && r.expert_tokens[p.layer * spec_.experts + p.expert] == 0;
    if (!idle || idle_has_grad) {
      ASSERT_EQ(mf_adamw_update(&h, 1, w.data(), r.grads.data() + p.toff, m.data(), v.data(), w.size(),
                                nullptr, nullptr),
                MF_OK);
    }
    const float *ref = f32(fx_, "after." + peft(p), p.numel), *gref = f32(fx_, "grad." + peft(p), p.numel);
    ASSERT_NE(ref, nullptr) << p.name;
    for (int64_t j = 0; j < p.numel; j++) {
      double tol = 1e-6;
      if (gref) {
        auto ratio = [&](double g) { return g / (std::fabs(g) + h.eps); };
        tol += h.lr * std::fabs(ratio(r.grads[p.toff + j]) - ratio(gref[j]));
      }
      const double d = std::fabs((double)w[j] - (double)ref[j]) / tol;
      if (d > worst) worst = d, worst_at = p.name;
    }
  }
  EXPECT_LE(worst, 1.0) << "largest difference (in tolerances) in " << worst_at;
}

// moefit's adapter dir is PEFT's: the same tensor names, dtypes, shapes and
// bytes as PEFT's adapter_model.safetensors, and a config that reads back as
// the same adapters.
TEST_P(LoraParity, TheExportedAdapterDirIsPeftsFormat) {
  const char *tmp = getenv("TEST_TMPDIR");
  const std::string out = std::string(tmp ? tmp : "/tmp") + "/lora_export_" + flat(GetParam());
  ASSERT_EQ(mf_params_save_adapter_dir(t_, w_.data(), "", out.c_str()), MF_OK) << mf_last_error();
  mf_safetensors *a = nullptr, *b = nullptr;
  ASSERT_EQ(mf_safetensors_open((out + "/adapter_model.safetensors").c_str(), &a), MF_OK) << mf_last_error();
  ASSERT_EQ(mf_safetensors_open((dir_ + "/adapter_model.safetensors").c_str(), &b), MF_OK) << mf_last_error();
  ASSERT_EQ(mf_safetensors_count(a), mf_safetensors_count(b));
  for (size_t i = 0; i < mf_safetensors_count(b); i++) {
    const mf_st_tensor *y = mf_safetensors_get(b, i), *x = mf_safetensors_find(a, y->name);
    ASSERT_NE(x, nullptr) << y->name;
    EXPECT_EQ(x->dtype, y->dtype) << y->name;
    EXPECT_EQ(x->ndim, y->ndim) << y->name;
    EXPECT_EQ(x->shape[0], y->shape[0]) << y->name;
    EXPECT_EQ(x->shape[1], y->shape[1]) << y->name;
    ASSERT_EQ(x->nbytes, y->nbytes) << y->name;
    EXPECT_EQ(memcmp(x->data, y->data, x->nbytes), 0) << y->name;
  }
  mf_safetensors_close(a);
  mf_safetensors_close(b);
  mf_param_table *bare = nullptr; /* the model without adapters, as eval reads an adapter dir onto it */
  ASSERT_EQ(mf_param_table_build(&spec_, &bare), MF_OK) << mf_last_error();
  mf_lora l{};
  const mf_status read = mf_lora_read_adapter_config(out.c_str(), bare, &l);
  mf_param_table_free(bare);
  ASSERT_EQ(read, MF_OK) << mf_last_error();
  EXPECT_EQ(l.rank, t_->lora.rank);
  EXPECT_EQ(l.scale, t_->lora.scale);
  EXPECT_EQ(l.roles, t_->lora.roles);
  const int64_t LE = spec_.layers * spec_.experts;
  ASSERT_EQ(l.hot == nullptr, t_->lora.hot == nullptr);
  if (l.hot) EXPECT_EQ(memcmp(l.hot, t_->lora.hot, (size_t)LE), 0) << "the hot set read back";
  free(l.hot);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, LoraParity, ::testing::ValuesIn(lora_fixture_names()),
                         [](const ::testing::TestParamInfo<std::string> &i) { return flat(i.param); });

// The random init is the same bits on any number of threads; with a bf16 home
// the frozen weights land there rounded and their part of w is never written.
TEST(ParamsInit, ThreadsAndABf16HomeGiveTheSameValues) {
  mf_model_spec spec{};
  ASSERT_EQ(mf_hf_config_load("tests/fixtures/qwen2_moe", &spec), MF_OK) << mf_last_error();
  mf_param_table *t = nullptr;
  ASSERT_EQ(mf_param_table_build(&spec, &t), MF_OK) << mf_last_error();
  mf_lora l{4, 2.0,
            mf_lora_target_roles(spec.family, "q_proj") | mf_lora_target_roles(spec.family, "up_proj"), 0,
            0.0};
  ASSERT_EQ(mf_param_table_add_lora(t, &l), MF_OK) << mf_last_error();
  const size_t n = (size_t)t->total_numel;
  std::vector<float> a(n, NAN), b(n, NAN), c(n, NAN);
  std::vector<uint16_t> home(n, 0xffff);
  mf_params_init_random_home(t, 7, 0.02f, a.data(), nullptr, nullptr);
  mf_threadpool *pool = nullptr;
  ASSERT_EQ(mf_threadpool_create(3, &pool), MF_OK);
  mf_params_init_random_home(t, 7, 0.02f, b.data(), nullptr, pool);
  mf_params_init_random_home(t, 7, 0.02f, c.data(), home.data(), pool);
  mf_threadpool_free(pool);
  int64_t frozen = 0;
  for (int64_t i = 0; i < t->n_base; i++) {
    const mf_param &p = t->params[i];
    for (int64_t j = 0; j < p.numel; j++) {
      const size_t k = (size_t)(p.offset + j);
      ASSERT_EQ(memcmp(&a[k], &b[k], 4), 0) << p.name << "[" << j << "]";
      if (p.frozen) {
        ASSERT_EQ(home[k], mf_fp32_to_bf16(a[k])) << p.name << "[" << j << "]";
        ASSERT_TRUE(std::isnan(c[k])) << p.name << ": the fp32 part of a frozen weight was written";
      } else {
        ASSERT_EQ(memcmp(&a[k], &c[k], 4), 0) << p.name << "[" << j << "]";
        ASSERT_EQ(home[k], 0xffff) << p.name;
      }
    }
    frozen += p.frozen;
  }
  EXPECT_GT(frozen, 0);
  mf_param_table_free(t);
}

// An adapter config moefit cannot compute is refused naming the file and key.
TEST(LoraAdapterConfig, RefusesWhatItDoesNotCompute) {
  const char *tmp = getenv("TEST_TMPDIR");
  const std::string dir = std::string(tmp ? tmp : "/tmp") + "/bad_adapter";
  ASSERT_EQ(mf_mkdir_p(dir.c_str()), MF_OK);
  const std::string ok =
      R"("peft_type": "LORA", "r": 4, "lora_alpha": 8, "target_modules": ["q_proj", "w1"])";
  const struct {
    std::string json, want;
  } cases[] = {
      {"{" + ok + "}", ""},
      {"{" + ok + R"(, "use_rslora": true})", "use_rslora: moefit computes plain LoRA"},
      {"{" + ok + R"(, "use_dora": true})", "use_dora: moefit computes plain LoRA"},
      {"{" + ok + R"(, "bias": "all"})", "bias: moefit computes plain LoRA"},
      {"{" + ok + R"(, "modules_to_save": ["lm_head"]})", "modules_to_save: moefit trains the routers whole"},
      {R"({"peft_type": "LORA", "r": 0, "lora_alpha": 8, "target_modules": ["q_proj"]})", "r must be"},
      {R"({"peft_type": "LORA", "r": 4, "lora_alpha": 8, "target_modules": ["gate_proj"]})",
       "target_modules[0]: the mixtral model has no module named gate_proj"},
      {R"({"peft_type": "IA3", "r": 4})", "peft_type: moefit reads LORA adapters"},
      {"{", "adapter_config.json:"},
  };
  mf_model_spec spec{};
  ASSERT_EQ(mf_hf_config_load("tests/fixtures/mixtral", &spec), MF_OK) << mf_last_error();
  mf_param_table *mixtral = nullptr;
  ASSERT_EQ(mf_param_table_build(&spec, &mixtral), MF_OK) << mf_last_error();
  for (const auto &c : cases) {
    SCOPED_TRACE(c.json);
    ASSERT_EQ(mf_write_file_atomic((dir + "/adapter_config.json").c_str(), c.json.data(), c.json.size()),
              MF_OK);
    mf_lora l{};
    const mf_status st = mf_lora_read_adapter_config(dir.c_str(), mixtral, &l);
    free(l.hot);
    if (c.want.empty()) {
      EXPECT_EQ(st, MF_OK) << mf_last_error();
      EXPECT_EQ(l.rank, 4);
      EXPECT_EQ(l.scale, 2.0);
      continue;
    }
    EXPECT_NE(st, MF_OK);
    EXPECT_NE(std::string(mf_last_error()).find(c.want), std::string::npos) << mf_last_error();
    EXPECT_NE(std::string(mf_last_error()).find(dir + "/adapter_config.json"), std::string::npos)
        << mf_last_error();
  }
  mf_param_table_free(mixtral);
}

// target_modules entries match modules as PEFT matches them (the name, or a
// dot and the name at its end): full names and the short endings PEFT writes
// for long lists give the hot set; what moefit cannot adapt (a role in some
// layers only, experts adapted in one projection and not another) is refused.
TEST(LoraAdapterConfig, HotExpertsByFullNamesAndShortEndings) {
  const char *tmp = getenv("TEST_TMPDIR");
  const std::string dir = std::string(tmp ? tmp : "/tmp") + "/hot_adapter";
  ASSERT_EQ(mf_mkdir_p(dir.c_str()), MF_OK);
  mf_model_spec spec{};
  ASSERT_EQ(mf_hf_config_load("tests/fixtures/mixtral", &spec), MF_OK) << mf_last_error();
  mf_param_table *t = nullptr;
  ASSERT_EQ(mf_param_table_build(&spec, &t), MF_OK) << mf_last_error();
  ASSERT_GE(spec.layers, 2);
  ASSERT_GE(spec.experts, 6);
  const std::string x = "model.layers.1.block_sparse_moe.experts.5.";
  const struct {
    std::string targets, want;
    std::vector<std::pair<int, int>> hot;  // (layer, expert); empty with want "": every expert
  } cases[] = {
      {R"("q_proj", "experts.3.w1", "experts.3.w2", "experts.3.w3")", "", {{0, 3}, {1, 3}}},
      {"\"" + x + "w1\", \"" + x + "w2\", \"" + x + "w3\", \"v_proj\"", "", {{1, 5}}},
      {R"("w1", "w2", "w3")", "", {}},
      {R"("model.layers.0.self_attn.q_proj")",
       "adapts modules like model.layers.1.self_attn.q_proj in some layers",
       {}},
      {R"("experts.3.w1", "experts.4.w2")",
       "moefit takes one set of adapted experts for all their projections",
       {}},
      {R"("q_proj", "experts.99.w1")",
       "target_modules[1]: the mixtral model has no module named experts.99.w1",
       {}},
  };
  for (const auto &c : cases) {
    SCOPED_TRACE(c.targets);
    const std::string json =
        R"({"peft_type": "LORA", "r": 4, "lora_alpha": 8, "target_modules": [)" + c.targets + "]}";
    ASSERT_EQ(mf_write_file_atomic((dir + "/adapter_config.json").c_str(), json.data(), json.size()), MF_OK);
    mf_lora l{};
    const mf_status st = mf_lora_read_adapter_config(dir.c_str(), t, &l);
    if (!c.want.empty()) {
      EXPECT_NE(st, MF_OK);
      EXPECT_NE(std::string(mf_last_error()).find(c.want), std::string::npos) << mf_last_error();
      EXPECT_EQ(l.hot, nullptr);
      continue;
    }
    ASSERT_EQ(st, MF_OK) << mf_last_error();
    EXPECT_TRUE(l.roles & MF_LORA_EXPERT_ROLES);
    if (c.hot.empty()) {
      EXPECT_EQ(l.hot, nullptr) << "every expert adapted: no hot set";
    } else {
      ASSERT_NE(l.hot, nullptr);
      int64_t n = 0;
      for (int64_t i = 0; i < spec.layers * spec.experts; i++) n += l.hot[i];
      EXPECT_EQ(n, (int64_t)c.hot.size());
      for (auto [layer, e] : c.hot) EXPECT_EQ(l.hot[layer * spec.experts + e], 1) << layer << "," << e;
      // the table it gives: adapters on those experts only
      mf_param_table *ta = nullptr;
      ASSERT_EQ(mf_param_table_build(&spec, &ta), MF_OK);
      ASSERT_EQ(mf_param_table_add_lora(ta, &l), MF_OK) << mf_last_error();
      for (int64_t i = 0; i < ta->n_base; i++) {
        const mf_param &p = ta->params[i];
        if (p.expert >= 0)
          EXPECT_EQ(ta->lora_a[i] >= 0, (bool)l.hot[p.layer * spec.experts + p.expert]) << p.name;
      }
      mf_param_table_free(ta);
    }
    free(l.hot);
  }
  mf_param_table_free(t);
}

TEST(LoraParityFixtures, ArePresent) {
  EXPECT_GE(lora_fixture_names().size(), 9u) << "tests/fixtures/lora and qlora have too few fixtures";
}

}  // namespace
