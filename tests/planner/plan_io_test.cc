// planner/plan_io: plans written and read back unchanged (the optimizer's
// placement included); older versions still read; every kind of malformed or
// ill-fitting plan file an error naming the file, the place in it and the
// fault (decisions untouched); memory.overrides pinning exactly the tensors
// they match (optimizer: device with the weights and gradients it needs), and
// their errors naming the place in the config.
#include <gtest/gtest.h>
#include <jansson.h>

#include <fnmatch.h>
#include <unistd.h>

#include <clocale>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "planner/plan_io.h"
#include "planner/schedule.h"
#include "src/config/config.h"
#include "src/core/core.h"
#include "src/model/params.h"
#include "src/model/program.h"

namespace {

std::string TmpPath(const std::string &name) {
  const char *d = getenv("TEST_TMPDIR");
  return std::string(d ? d : "/tmp") + "/" + name;
}

void WriteText(const std::string &path, const std::string &text) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f << text;
}

std::string Slurp(const std::string &path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// A tiny OLMoE: expert weights are named model.layers.L.mlp.experts.E.*.
mf_model_spec TinySpec() {
  mf_model_spec s;
  mf_model_spec_defaults(MF_FAMILY_OLMOE, &s);
  s.hidden = 32, s.layers = 2, s.heads = 4, s.kv_heads = 4, s.head_dim = 8, s.experts = 4, s.top_k = 2;
  s.expert_ffn = 16, s.vocab = 64, s.max_seq = 64, s.rope_theta = 10000.0;
  return s;
}

struct Prog {
  mf_param_table *t = nullptr;
  mf_program *p = nullptr;
  void Build(int64_t B, int64_t S, int64_t G, int forward_only = 0, mf_dtype storage = MF_DTYPE_F32) {
    mf_model_spec s = TinySpec();
    ASSERT_EQ(mf_param_table_build(&s, &t), MF_OK) << mf_last_error();
    mf_program_opts po = {B, S, G, 0.01, 0, forward_only, MF_ORDER_MICRO_MAJOR, storage, MF_DTYPE_F32};
    ASSERT_EQ(mf_program_build(t, &po, &p), MF_OK) << mf_last_error();
  }
  ~Prog() {
    mf_program_free(p);
    mf_param_table_free(t);
  }
};

bool IsPlanAct(const mf_program *p, int32_t t) {
  mf_tensor_kind k = p->tensors[t].kind;
  return (k == MF_T_ACT || k == MF_T_STAT) && mf_schedule_can_offload(p, t);
}

int32_t FindTensor(const mf_program *p, const char *name) {
  for (int32_t t = 0; t < p->n_tensors; t++)
    if (strcmp(p->tensors[t].name, name) == 0) return t;
  return -1;
}

// No model moefit builds today has an activation that can be offloaded but not
// recomputed, so one is made: rmsnorm writes `out` and `rstd`; moving rstd out
// of the layer (layer -1) makes out's writer write outside its layer.
int32_t MakeUnrecomputable(mf_program *p) {
  int32_t rstd = FindTensor(p, "mb0.model.layers.0.input_layernorm.rstd");
  int32_t out = FindTensor(p, "mb0.model.layers.0.input_layernorm.out");
  if (rstd < 0 || out < 0) return -1;
  p->tensors[rstd].layer = -1;
  if (!mf_schedule_can_offload(p, out) || mf_schedule_can_recompute(p, out)) return -1;
  return out;
}

struct Result {
  mf_status st;
  std::string err;
};

// Expects status `status` and a message containing every one of the parts.
#define EXPECT_ERROR(r, status, ...)                                                                  \
  do {                                                                                                \
    const Result r_ = (r);                                                                            \
    EXPECT_EQ(r_.st, (status)) << mf_status_name(r_.st) << ": " << r_.err;                            \
    for (const char *part_ : {__VA_ARGS__})                                                           \
      EXPECT_NE(r_.err.find(part_), std::string::npos) << "missing '" << part_ << "' in: " << r_.err; \
  } while (0)

class PlanIo : public ::testing::Test {
 protected:
  void SetUp() override {
    prog_.Build(1, 8, 2);
    p_ = prog_.p;
    ASSERT_EQ(mf_decisions_create(p_, &d_), MF_OK);
    // A mix of every decision.
    for (int32_t i = 0; i < d_->n_params; i++) {
      d_->param[i] = i % 3 == 0 ? MF_PARAM_STREAM : MF_PARAM_RESIDENT;
      d_->grad[i] = i % 2 == 0 ? MF_GRAD_STREAM : MF_GRAD_DEVICE;
      // The optimizer on the device wherever it may be, but not everywhere.
      if (d_->param[i] == MF_PARAM_RESIDENT && d_->grad[i] == MF_GRAD_DEVICE && i % 5 != 1) {
        d_->optim[i] = MF_OPTIM_DEVICE;
        n_optim_device_++;
      }
    }
    int k = 0;
    for (int32_t t = 0; t < p_->n_tensors; t++) {
      if (!IsPlanAct(p_, t)) continue;
      n_acts_++;
      int want = k++ % 3;
      if (want == 2 && !mf_schedule_can_recompute(p_, t)) want = 1;
      d_->act[t] = (uint8_t)want;
    }
    fig_ = {8ull << 30, 123456789,  98765, 0.1234567890123456789, 4567, 1u << 20,
            891011,     1ull << 40, 24680, (3ull << 30) + 17, "cutlass", "cudnn", (5ull << 30) + 3};
    base_ = TmpPath("base.plan.json");
    ASSERT_EQ(mf_plan_write_json(p_, d_, &fig_, base_.c_str()), MF_OK) << mf_last_error();
  }
  void TearDown() override { mf_decisions_free(d_); }

  // Reads `path` into decisions preset to a pattern; on failure they must be untouched.
  Result Read(const std::string &path, const mf_program *p = nullptr) {
    if (!p) p = p_;
    mf_decisions *d = nullptr;
    EXPECT_EQ(mf_decisions_create(p, &d), MF_OK);
    for (int32_t i = 0; i < d->n_params; i++) d->param[i] = MF_PARAM_STREAM;
    mf_plan_figures f = {1, 2, 3, 4.0};
    mf_error_clear();
    Result r;
    r.st = mf_plan_read_json(p, path.c_str(), d, &f);
    r.err = mf_last_error();
    if (r.st != MF_OK) {
      for (int32_t i = 0; i < d->n_params; i++)
        EXPECT_EQ(d->param[i], MF_PARAM_STREAM) << "decisions changed";
      for (int32_t i = 0; i < d->n_params; i++) EXPECT_EQ(d->grad[i], MF_GRAD_DEVICE) << "decisions changed";
      for (int32_t t = 0; t < d->n_tensors; t++) EXPECT_EQ(d->act[t], MF_ACT_KEEP) << "decisions changed";
      for (int32_t i = 0; i < d->n_params; i++) EXPECT_EQ(d->optim[i], MF_OPTIM_HOST) << "decisions changed";
      EXPECT_EQ(f.arena_bytes, 3u) << "figures changed";
    }
    mf_decisions_free(d);
    return r;
  }
  // The base plan edited by `edit`, written as `name`.
  std::string Edited(const std::string &name, const std::function<void(json_t *)> &edit) {
    json_error_t e;
    json_t *root = json_load_file(base_.c_str(), 0, &e);
    EXPECT_NE(root, nullptr) << e.text;
    edit(root);
    std::string path = TmpPath(name);
    EXPECT_EQ(json_dump_file(root, path.c_str(), JSON_INDENT(2) | JSON_PRESERVE_ORDER), 0);
    json_decref(root);
    return path;
  }
  static json_t *Entry(json_t *root, size_t i) { return json_array_get(json_object_get(root, "tensors"), i); }
  static void SetDecision(json_t *root, const char *name, const char *decision,
                          const char *key = "decision") {
    size_t i;
    json_t *e;
    json_array_foreach(json_object_get(root, "tensors"), i, e) {
      if (strcmp(json_string_value(json_object_get(e, "name")), name) == 0)
        json_object_set_new(e, key, json_string(decision));
    }
  }
  // The index of the entry named `name` in the base plan, or -1.
  int EntryOf(const char *name) {
    json_error_t e;
    json_t *root = json_load_file(base_.c_str(), 0, &e);
    int at = -1;
    size_t i;
    json_t *x;
    json_array_foreach(json_object_get(root, "tensors"), i, x) {
      if (strcmp(json_string_value(json_object_get(x, "name")), name) == 0) at = (int)i;
    }
    json_decref(root);
    return at;
  }
  // The base plan as an older version wrote it: no storage or backend bytes
  // (version 3), no optimizer placements or persist_bytes (version 2), no
  // staging and host figures or order (version 1).
  static void MakeVersion(json_t *r, int version) {
    json_object_set_new(r, "version", json_integer(version));
    json_object_del(r, "pinned_home_bytes");
    if (version >= 5) return;
    json_object_del(r, "kernels");
    if (version >= 4) return;
    json_object_del(r, "device_backend_bytes");
    json_object_del(json_object_get(r, "batch"), "storage");
    if (version >= 3) return;
    json_object_del(r, "persist_bytes");
    size_t i;
    json_t *e;
    json_array_foreach(json_object_get(r, "tensors"), i, e) {
      json_object_del(e, "optimizer");
    }
    if (version >= 2) return;
    for (const char *k : {"staging_bytes", "staging_slab_limit_bytes", "staging_pool_bytes", "host_bytes"})
      json_object_del(r, k);
    json_object_del(json_object_get(r, "batch"), "order");
  }
  Result ReadFrom(const std::string &name, const std::string &text) {
    std::string path = TmpPath(name);
    WriteText(path, text);
    return Read(path);
  }

  Prog prog_;
  mf_program *p_ = nullptr;
  mf_decisions *d_ = nullptr;
  mf_plan_figures fig_;
  std::string base_;
  int n_acts_ = 0;
  int n_optim_device_ = 0;
};

// ------------------------------------------------------------ round trip

TEST_F(PlanIo, RoundTripGivesTheSameDecisionsAndFigures) {
  mf_decisions *d = nullptr;
  ASSERT_EQ(mf_decisions_create(p_, &d), MF_OK);
  mf_plan_figures f = {0, 0, 0, 0.0};
  ASSERT_EQ(mf_plan_read_json(p_, base_.c_str(), d, &f), MF_OK) << mf_last_error();
  EXPECT_EQ(0, memcmp(d->param, d_->param, (size_t)d->n_params));
  EXPECT_EQ(0, memcmp(d->grad, d_->grad, (size_t)d->n_params));
  EXPECT_EQ(0, memcmp(d->act, d_->act, (size_t)d->n_tensors));
  ASSERT_GT(n_optim_device_, 0);
  ASSERT_LT(n_optim_device_, d->n_params);
  EXPECT_EQ(0, memcmp(d->optim, d_->optim, (size_t)d->n_params));
  EXPECT_EQ(f.device_budget_bytes, fig_.device_budget_bytes);
  EXPECT_EQ(f.peak_device_bytes, fig_.peak_device_bytes);
  EXPECT_EQ(f.arena_bytes, fig_.arena_bytes);
  EXPECT_EQ(f.predicted_step_seconds, fig_.predicted_step_seconds);  // bit-exact
  EXPECT_EQ(f.staging_bytes, fig_.staging_bytes);
  EXPECT_EQ(f.staging_slab_limit_bytes, fig_.staging_slab_limit_bytes);
  EXPECT_EQ(f.staging_pool_bytes, fig_.staging_pool_bytes);
  EXPECT_EQ(f.host_bytes, fig_.host_bytes);
  EXPECT_EQ(f.persist_bytes, fig_.persist_bytes);
  EXPECT_EQ(f.device_backend_bytes, fig_.device_backend_bytes);
  EXPECT_STREQ(f.expert_gemm, "cutlass");
  EXPECT_STREQ(f.attention, "cudnn");
  EXPECT_EQ(f.pinned_home_bytes, fig_.pinned_home_bytes);

  // Written again, the file is the same; figures may be left out when reading.
  std::string again = TmpPath("again.plan.json");
  ASSERT_EQ(mf_plan_write_json(p_, d, &f, again.c_str()), MF_OK) << mf_last_error();
  EXPECT_EQ(Slurp(again), Slurp(base_));
  EXPECT_EQ(mf_plan_read_json(p_, base_.c_str(), d, nullptr), MF_OK) << mf_last_error();
  mf_decisions_free(d);
}

TEST_F(PlanIo, LayoutIsTheDocumentedOne) {
  std::string text = Slurp(base_);
  ASSERT_FALSE(text.empty());
  EXPECT_EQ(text.back(), '\n');
  EXPECT_EQ(access((base_ + ".tmp").c_str(), F_OK), -1) << "temporary file left behind";
  json_error_t e;
  json_t *root = json_loads(text.c_str(), JSON_REJECT_DUPLICATES, &e);
  ASSERT_NE(root, nullptr) << e.text;
  EXPECT_STREQ(json_string_value(json_object_get(root, "format")), "moefit-plan");
  EXPECT_EQ(json_integer_value(json_object_get(root, "version")), 6);
  EXPECT_EQ(json_integer_value(json_object_get(root, "pinned_home_bytes")), (5ll << 30) + 3);
  EXPECT_EQ(json_integer_value(json_object_get(root, "persist_bytes")), 24680);
  EXPECT_EQ(json_integer_value(json_object_get(root, "device_backend_bytes")), (3ll << 30) + 17);
  EXPECT_EQ(json_integer_value(json_object_get(root, "staging_bytes")), 4567);
  EXPECT_EQ(json_integer_value(json_object_get(root, "staging_slab_limit_bytes")), 1 << 20);
  EXPECT_EQ(json_integer_value(json_object_get(root, "staging_pool_bytes")), 891011);
  EXPECT_EQ(json_integer_value(json_object_get(root, "host_bytes")), 1ll << 40);
  json_t *model = json_object_get(root, "model"), *batch = json_object_get(root, "batch");
  EXPECT_STREQ(json_string_value(json_object_get(model, "family")), "olmoe");
  EXPECT_EQ(json_integer_value(json_object_get(model, "experts")), 4);
  EXPECT_EQ(json_integer_value(json_object_get(batch, "seq_len")), 8);
  EXPECT_EQ(json_integer_value(json_object_get(batch, "grad_accum")), 2);
  EXPECT_STREQ(json_string_value(json_object_get(batch, "storage")), "fp32");
  // The documented order of the top level's keys.
  std::string keys;
  for (size_t at = text.find("\n  \""); at != std::string::npos; at = text.find("\n  \"", at + 1))
    keys += text.substr(at + 4, text.find('"', at + 4) - at - 4) + " ";
  EXPECT_EQ(keys,
            "format version model batch device_budget_bytes peak_device_bytes arena_bytes predicted_step_seconds "
            "staging_bytes staging_slab_limit_bytes staging_pool_bytes host_bytes persist_bytes "
            "device_backend_bytes pinned_home_bytes kernels tensors ");
  json_t *kernels = json_object_get(root, "kernels");
  EXPECT_STREQ(json_string_value(json_object_get(kernels, "expert_gemm")), "cutlass");
  EXPECT_STREQ(json_string_value(json_object_get(kernels, "attention")), "cudnn");
  EXPECT_NE(text.find("\"order\": \"micro-batch-major\",\n    \"storage\": \"fp32\"\n  },"),
            std::string::npos);
  json_t *tensors = json_object_get(root, "tensors");
  // Every parameter twice, every offloadable activation (both micro-batches) once.
  ASSERT_EQ(json_array_size(tensors), (size_t)(2 * p_->params->n + n_acts_));
  int kinds[3] = {0, 0, 0}, mb1 = 0, on_device = 0;
  size_t i;
  json_t *e1;
  json_array_foreach(tensors, i, e1) {
    std::string kind = json_string_value(json_object_get(e1, "kind"));
    std::string name = json_string_value(json_object_get(e1, "name"));
    int32_t t = FindTensor(p_, name.c_str());
    ASSERT_GE(t, 0) << name;
    // Only a weight's entry says where its optimizer runs, and every one does.
    json_t *o = json_object_get(e1, "optimizer");
    if (kind == "param") {
      ASSERT_TRUE(json_is_string(o)) << name;
      const std::string w = json_string_value(o);
      EXPECT_EQ(w, d_->optim[p_->tensors[t].param] == MF_OPTIM_DEVICE ? "device" : "host") << name;
      on_device += w == "device";
    } else {
      EXPECT_EQ(o, nullptr) << name;
    }
    EXPECT_EQ((size_t)json_integer_value(json_object_get(e1, "bytes")), p_->tensors[t].bytes) << name;
    kinds[kind == "param" ? 0 : kind == "grad" ? 1 : 2]++;
    mb1 += name.rfind("mb1.", 0) == 0;
  }
  EXPECT_EQ(kinds[0], p_->params->n);
  EXPECT_EQ(kinds[1], p_->params->n);
  EXPECT_EQ(kinds[2], n_acts_);
  EXPECT_EQ(2 * mb1, n_acts_);
  EXPECT_EQ(on_device, n_optim_device_);
  EXPECT_STREQ(json_string_value(json_object_get(Entry(root, 0), "name")), "model.embed_tokens.weight");
  json_decref(root);
}

TEST(PlanIoForwardOnly, NoGradientsListedOrRequired) {
  Prog g;
  g.Build(1, 8, 1, 1);
  mf_decisions *d = nullptr;
  ASSERT_EQ(mf_decisions_create(g.p, &d), MF_OK);
  for (int32_t i = 0; i < d->n_params; i += 2) d->param[i] = MF_PARAM_STREAM;
  mf_plan_figures f = {1, 2, 3, 0.5, 0, 0, 0, 0, 0, 0, "mma", "mma"};
  std::string path = TmpPath("fwd.plan.json");
  ASSERT_EQ(mf_plan_write_json(g.p, d, &f, path.c_str()), MF_OK) << mf_last_error();
  EXPECT_EQ(Slurp(path).find("\"grad\""), std::string::npos);
  EXPECT_EQ(Slurp(path).find("\"device\""), std::string::npos);  // no optimizer on the device
  mf_decisions *back = nullptr;
  ASSERT_EQ(mf_decisions_create(g.p, &back), MF_OK);
  ASSERT_EQ(mf_plan_read_json(g.p, path.c_str(), back, nullptr), MF_OK) << mf_last_error();
  EXPECT_EQ(0, memcmp(back->param, d->param, (size_t)d->n_params));
  // A forward-only program has no optimizer: it is never on the device.
  d->optim[1] = MF_OPTIM_DEVICE;
  d->param[1] = MF_PARAM_RESIDENT;
  EXPECT_EQ(mf_plan_write_json(g.p, d, &f, TmpPath("fwd2.plan.json").c_str()), MF_ERR_INVALID_ARG);
  json_error_t e;
  json_t *root = json_load_file(path.c_str(), 0, &e);
  ASSERT_NE(root, nullptr) << e.text;
  json_t *entry = json_array_get(json_object_get(root, "tensors"), 1);
  ASSERT_STREQ(json_string_value(json_object_get(entry, "decision")), "resident");
  json_object_set_new(entry, "optimizer", json_string("device"));
  ASSERT_EQ(json_dump_file(root, path.c_str(), JSON_INDENT(2)), 0);
  json_decref(root);
  mf_error_clear();
  EXPECT_EQ(mf_plan_read_json(g.p, path.c_str(), back, nullptr), MF_ERR_CONFIG);
  EXPECT_NE(std::string(mf_last_error()).find("fwd.plan.json: tensors[1].optimizer: "), std::string::npos)
      << mf_last_error();
  EXPECT_NE(std::string(mf_last_error()).find("forward-only"), std::string::npos) << mf_last_error();
  mf_decisions_free(back);
  mf_decisions_free(d);
}

TEST_F(PlanIo, WriteRefusesDecisionsTheProgramDoesNotAllow) {
  mf_decisions *d = nullptr;
  ASSERT_EQ(mf_decisions_create(p_, &d), MF_OK);
  std::string path = TmpPath("refused.plan.json");
  d->param[3] = 7;
  EXPECT_EQ(mf_plan_write_json(p_, d, &fig_, path.c_str()), MF_ERR_INVALID_ARG);
  d->param[3] = 0;
  d->act[p_->io[0].ids] = MF_ACT_OFFLOAD;  // an input, not an activation
  EXPECT_EQ(mf_plan_write_json(p_, d, &fig_, path.c_str()), MF_ERR_INVALID_ARG);
  EXPECT_NE(std::string(mf_last_error()).find("mb0.input_ids"), std::string::npos) << mf_last_error();
  d->act[p_->io[0].ids] = MF_ACT_KEEP;
  mf_plan_figures neg = fig_;
  neg.predicted_step_seconds = -1;
  EXPECT_EQ(mf_plan_write_json(p_, d, &neg, path.c_str()), MF_ERR_INVALID_ARG);
  EXPECT_EQ(access(path.c_str(), F_OK), -1);
  int32_t t = MakeUnrecomputable(p_);
  ASSERT_GE(t, 0) << "program layout changed: pick another tensor";
  d->act[t] = MF_ACT_RECOMPUTE;
  EXPECT_EQ(mf_plan_write_json(p_, d, &fig_, path.c_str()), MF_ERR_INVALID_ARG);
  d->act[t] = MF_ACT_KEEP;
  // The optimizer on the device with the weights or the gradient streamed,
  // or a placement out of range.
  d->optim[4] = MF_OPTIM_DEVICE;
  d->param[4] = MF_PARAM_STREAM;
  EXPECT_EQ(mf_plan_write_json(p_, d, &fig_, path.c_str()), MF_ERR_INVALID_ARG);
  EXPECT_NE(std::string(mf_last_error()).find(p_->params->params[4].name), std::string::npos)
      << mf_last_error();
  d->param[4] = MF_PARAM_RESIDENT;
  d->grad[4] = MF_GRAD_STREAM;
  EXPECT_EQ(mf_plan_write_json(p_, d, &fig_, path.c_str()), MF_ERR_INVALID_ARG);
  d->grad[4] = MF_GRAD_DEVICE;
  d->optim[4] = 2;
  EXPECT_EQ(mf_plan_write_json(p_, d, &fig_, path.c_str()), MF_ERR_INVALID_ARG);
  d->optim[4] = MF_OPTIM_DEVICE;
  EXPECT_EQ(mf_plan_write_json(p_, d, &fig_, path.c_str()), MF_OK) << mf_last_error();
  mf_decisions_free(d);
}

// Version 2 (before the optimizer's placement) still reads: every optimizer
// on the host, persist_bytes 0; it must not have the version-3 keys.
TEST_F(PlanIo, Version2ReadsWithTheOptimizerOnTheHost) {
  std::string path = Edited("v2.plan.json", [](json_t *r) { MakeVersion(r, 2); });
  EXPECT_EQ(Slurp(path).find("optimizer"), std::string::npos);
  mf_decisions *d = nullptr;
  ASSERT_EQ(mf_decisions_create(p_, &d), MF_OK);
  memset(d->optim, MF_OPTIM_DEVICE, (size_t)d->n_params);  // every one must be overwritten
  mf_plan_figures f = {9, 9, 9, 9.0, 9, 9, 9, 9, 9, 9};
  ASSERT_EQ(mf_plan_read_json(p_, path.c_str(), d, &f), MF_OK) << mf_last_error();
  EXPECT_EQ(0, memcmp(d->param, d_->param, (size_t)d->n_params));
  EXPECT_EQ(0, memcmp(d->grad, d_->grad, (size_t)d->n_params));
  EXPECT_EQ(0, memcmp(d->act, d_->act, (size_t)d->n_tensors));
  for (int32_t i = 0; i < d->n_params; i++) EXPECT_EQ(d->optim[i], MF_OPTIM_HOST) << i;
  EXPECT_EQ(f.host_bytes, fig_.host_bytes);
  EXPECT_EQ(f.persist_bytes, 0u);
  EXPECT_EQ(f.device_backend_bytes, 0u);
  mf_decisions_free(d);
  // A version-2 file with a version-3 key.
  path = Edited("plan.json", [](json_t *r) {
    MakeVersion(r, 2);
    json_object_set_new(Entry(r, 2), "optimizer", json_string("host"));
  });
  EXPECT_ERROR(Read(path), MF_ERR_FORMAT,
               "plan.json: tensors[2].optimizer: a version-2 plan has no 'optimizer'");
  path = Edited("plan.json", [](json_t *r) {
    MakeVersion(r, 2);
    json_object_set_new(r, "persist_bytes", json_integer(5));
  });
  EXPECT_ERROR(Read(path), MF_ERR_FORMAT,
               "plan.json: persist_bytes: a version-2 plan has no 'persist_bytes'");
  // Version 3 needs both.
  path = Edited("plan.json", [](json_t *r) { json_object_del(r, "persist_bytes"); });
  EXPECT_ERROR(Read(path), MF_ERR_FORMAT, "plan.json: (top level): missing 'persist_bytes'");
  path = Edited("plan.json", [](json_t *r) { json_object_del(Entry(r, 3), "optimizer"); });
  EXPECT_ERROR(Read(path), MF_ERR_FORMAT, "plan.json: tensors[3]: missing 'optimizer' (host, device)");
}

// Version 3 (before the device storage and the backend's bytes) still reads:
// the same decisions and figures, device_backend_bytes 0; it must not have
// the version-4 keys, and version 4 needs both.
TEST_F(PlanIo, Version3StillReads) {
  std::string path = Edited("v3.plan.json", [](json_t *r) { MakeVersion(r, 3); });
  EXPECT_EQ(Slurp(path).find("storage"), std::string::npos);
  EXPECT_EQ(Slurp(path).find("device_backend_bytes"), std::string::npos);
  mf_decisions *d = nullptr;
  ASSERT_EQ(mf_decisions_create(p_, &d), MF_OK);
  mf_plan_figures f = {9, 9, 9, 9.0, 9, 9, 9, 9, 9, 9};
  ASSERT_EQ(mf_plan_read_json(p_, path.c_str(), d, &f), MF_OK) << mf_last_error();
  EXPECT_EQ(0, memcmp(d->param, d_->param, (size_t)d->n_params));
  EXPECT_EQ(0, memcmp(d->grad, d_->grad, (size_t)d->n_params));
  EXPECT_EQ(0, memcmp(d->act, d_->act, (size_t)d->n_tensors));
  EXPECT_EQ(0, memcmp(d->optim, d_->optim, (size_t)d->n_params));
  EXPECT_EQ(f.persist_bytes, fig_.persist_bytes);
  EXPECT_EQ(f.predicted_step_seconds, fig_.predicted_step_seconds);
  EXPECT_EQ(f.device_backend_bytes, 0u);
  mf_decisions_free(d);
  // A version-3 file with a version-4 key.
  path = Edited("plan.json", [](json_t *r) {
    MakeVersion(r, 3);
    json_object_set_new(r, "device_backend_bytes", json_integer(5));
  });
  EXPECT_ERROR(
      Read(path), MF_ERR_FORMAT,
      "plan.json: device_backend_bytes: a version-3 plan has no 'device_backend_bytes' (it came with "
      "version 4)");
  path = Edited("plan.json", [](json_t *r) {
    MakeVersion(r, 3);
    json_object_set_new(json_object_get(r, "batch"), "storage", json_string("fp32"));
  });
  EXPECT_ERROR(Read(path), MF_ERR_FORMAT, "plan.json: batch: unknown key 'storage'");
  // Version 4 needs both, storage one of the two words.
  path = Edited("plan.json", [](json_t *r) { json_object_del(r, "device_backend_bytes"); });
  EXPECT_ERROR(Read(path), MF_ERR_FORMAT, "plan.json: (top level): missing 'device_backend_bytes'");
  path = Edited("plan.json", [](json_t *r) { json_object_del(json_object_get(r, "batch"), "storage"); });
  EXPECT_ERROR(Read(path), MF_ERR_FORMAT, "plan.json: batch: missing 'storage'");
  path = Edited("plan.json",
                [](json_t *r) { json_object_set_new(r, "device_backend_bytes", json_integer(-1)); });
  EXPECT_ERROR(Read(path), MF_ERR_FORMAT, "plan.json: device_backend_bytes: expected a non-negative integer");
  path = Edited("plan.json", [](json_t *r) {
    json_object_set_new(json_object_get(r, "batch"), "storage", json_string("fp16"));
  });
  EXPECT_ERROR(Read(path), MF_ERR_FORMAT,
               "plan.json: batch.storage: expected \"fp32\" or \"bf16\", got 'fp16'");
  path = Edited("plan.json", [](json_t *r) {
    json_object_set_new(json_object_get(r, "batch"), "storage", json_integer(16));
  });
  EXPECT_ERROR(Read(path), MF_ERR_FORMAT, "plan.json: batch.storage: expected", "got an integer");
}

// Version 4 (before the kernels) still reads, kernels "" and without the
// key; version 5 needs "kernels", each word one its key takes.
TEST_F(PlanIo, Version4StillReadsAndVersion5NeedsTheKernels) {
  std::string path = Edited("v4.plan.json", [](json_t *r) { MakeVersion(r, 4); });
  EXPECT_EQ(Slurp(path).find("kernels"), std::string::npos);
  mf_decisions *d = nullptr;
  ASSERT_EQ(mf_decisions_create(p_, &d), MF_OK);
  mf_plan_figures f = fig_;
  ASSERT_EQ(mf_plan_read_json(p_, path.c_str(), d, &f), MF_OK) << mf_last_error();
  EXPECT_STREQ(f.expert_gemm, "");
  EXPECT_STREQ(f.attention, "");
  EXPECT_EQ(f.device_backend_bytes, fig_.device_backend_bytes);
  mf_decisions_free(d);
  path = Edited("plan.json", [](json_t *r) {
    MakeVersion(r, 4);
    json_object_set_new(r, "kernels", json_object());
  });
  EXPECT_ERROR(Read(path), MF_ERR_FORMAT, "plan.json: kernels: a version-4 plan has no 'kernels'");
  path = Edited("plan.json", [](json_t *r) { json_object_del(r, "kernels"); });
  EXPECT_ERROR(Read(path), MF_ERR_FORMAT, "plan.json: (top level): missing 'kernels'");
  path = Edited("plan.json", [](json_t *r) { json_object_set_new(r, "kernels", json_string("mma")); });
  EXPECT_ERROR(Read(path), MF_ERR_FORMAT, "plan.json: kernels: expected an object, got a string");
  path = Edited("plan.json",
                [](json_t *r) { json_object_set_new(json_object_get(r, "kernels"), "attention", json_string("flash")); });
  EXPECT_ERROR(Read(path), MF_ERR_FORMAT, "plan.json: kernels.attention: expected one of cpu, cuda-core, mma, cudnn, got 'flash'");
  path = Edited("plan.json",
                [](json_t *r) { json_object_set_new(json_object_get(r, "kernels"), "expert_gemm", json_string("cudnn")); });
  EXPECT_ERROR(Read(path), MF_ERR_FORMAT, "plan.json: kernels.expert_gemm: expected one of cpu, cuda-core, mma, cutlass");
  path = Edited("plan.json", [](json_t *r) { json_object_del(json_object_get(r, "kernels"), "attention"); });
  EXPECT_ERROR(Read(path), MF_ERR_FORMAT, "plan.json: kernels: missing 'attention'");
  path = Edited("plan.json",
                [](json_t *r) { json_object_set_new(json_object_get(r, "kernels"), "gemm", json_string("mma")); });
  EXPECT_ERROR(Read(path), MF_ERR_FORMAT, "plan.json: kernels: unknown key 'gemm'");
  // the writer refuses a word the reader would
  mf_plan_figures bad = fig_;
  snprintf(bad.attention, sizeof bad.attention, "flash");
  EXPECT_EQ(mf_plan_write_json(p_, d_, &bad, TmpPath("bad.plan.json").c_str()), MF_ERR_INVALID_ARG);
  bad.attention[0] = 0;
  EXPECT_EQ(mf_plan_write_json(p_, d_, &bad, TmpPath("bad.plan.json").c_str()), MF_ERR_INVALID_ARG);
}

// Version 5 (before the pinned home) still reads, pinned_home_bytes 0; it
// must not have the key, and version 6 needs it.
TEST_F(PlanIo, Version5StillReadsAndVersion6NeedsThePinnedHome) {
  std::string path = Edited("v5.plan.json", [](json_t *r) { MakeVersion(r, 5); });
  EXPECT_EQ(Slurp(path).find("pinned_home_bytes"), std::string::npos);
  EXPECT_NE(Slurp(path).find("kernels"), std::string::npos);
  mf_decisions *d = nullptr;
  ASSERT_EQ(mf_decisions_create(p_, &d), MF_OK);
  mf_plan_figures f = fig_;
  ASSERT_EQ(mf_plan_read_json(p_, path.c_str(), d, &f), MF_OK) << mf_last_error();
  EXPECT_EQ(f.pinned_home_bytes, 0u);
  EXPECT_STREQ(f.expert_gemm, "cutlass");
  mf_decisions_free(d);
  path = Edited("plan.json", [](json_t *r) {
    MakeVersion(r, 5);
    json_object_set_new(r, "pinned_home_bytes", json_integer(7));
  });
  EXPECT_ERROR(Read(path), MF_ERR_FORMAT,
               "plan.json: pinned_home_bytes: a version-5 plan has no 'pinned_home_bytes' (it came with version 6)");
  path = Edited("plan.json", [](json_t *r) { json_object_del(r, "pinned_home_bytes"); });
  EXPECT_ERROR(Read(path), MF_ERR_FORMAT, "plan.json: (top level): missing 'pinned_home_bytes'");
  path = Edited("plan.json", [](json_t *r) { json_object_set_new(r, "pinned_home_bytes", json_integer(-2)); });
  EXPECT_ERROR(Read(path), MF_ERR_FORMAT, "plan.json: pinned_home_bytes: expected a non-negative integer");
}

// batch.storage must be the program's: a plan made for fp32 storage does not
// fit a bf16 program of the same shape, nor the other way round.
TEST_F(PlanIo, StorageMismatch) {
  Prog bf16;
  bf16.Build(1, 8, 2, 0, MF_DTYPE_BF16);
  ASSERT_EQ(bf16.p->storage, MF_DTYPE_BF16);
  EXPECT_ERROR(
      Read(base_, bf16.p), MF_ERR_CONFIG,
      "base.plan.json: batch.storage: the plan was made for fp32 device storage, the program stores bf16");
  mf_decisions *d = nullptr;
  ASSERT_EQ(mf_decisions_create(bf16.p, &d), MF_OK);
  const std::string path = TmpPath("bf16.plan.json");
  ASSERT_EQ(mf_plan_write_json(bf16.p, d, &fig_, path.c_str()), MF_OK) << mf_last_error();
  EXPECT_NE(Slurp(path).find("\"storage\": \"bf16\""), std::string::npos);
  EXPECT_EQ(Read(path, bf16.p).st, MF_OK);
  EXPECT_ERROR(
      Read(path), MF_ERR_CONFIG,
      "bf16.plan.json: batch.storage: the plan was made for bf16 device storage, the program stores fp32");
  mf_decisions_free(d);
}

// Numbers are printed one way: integers in decimal, the seconds as jansson
// prints a real ("%.17g", ".0" where that reads as an integer, no '+' or
// leading zeros in the exponent), so a file is the same bytes every time and
// the seconds read back bit-exact.
TEST_F(PlanIo, NumbersPrintedOneWay) {
  for (double sec : {0.0, 2.0, 0.1, 1e-7, 123456789.125, 1e300, 4.9e-324}) {
    SCOPED_TRACE(sec);
    mf_plan_figures f = fig_;
    f.predicted_step_seconds = sec;
    f.device_budget_bytes = (uint64_t)INT64_MAX;
    const std::string a = TmpPath("a.plan.json"), b = TmpPath("b.plan.json");
    ASSERT_EQ(mf_plan_write_json(p_, d_, &f, a.c_str()), MF_OK) << mf_last_error();
    ASSERT_EQ(mf_plan_write_json(p_, d_, &f, b.c_str()), MF_OK) << mf_last_error();
    const std::string text = Slurp(a);
    EXPECT_EQ(text, Slurp(b));
    json_t *real = json_real(sec);
    char *want = json_dumps(real, JSON_ENCODE_ANY);
    EXPECT_NE(text.find("\"predicted_step_seconds\": " + std::string(want) + ",\n"), std::string::npos)
        << want;
    free(want);
    json_decref(real);
    EXPECT_NE(text.find("\"device_budget_bytes\": 9223372036854775807,\n"), std::string::npos);
    mf_decisions *d = nullptr;
    ASSERT_EQ(mf_decisions_create(p_, &d), MF_OK);
    mf_plan_figures back{};
    ASSERT_EQ(mf_plan_read_json(p_, a.c_str(), d, &back), MF_OK) << mf_last_error();
    EXPECT_EQ(back.predicted_step_seconds, sec);
    EXPECT_EQ(back.device_budget_bytes, (uint64_t)INT64_MAX);
    mf_decisions_free(d);
  }
  // The same under a locale whose decimal point is a comma (where the
  // machine has one): numbers are JSON's whatever the caller's locale.
  const char *comma = nullptr;
  for (const char *l : {"de_DE.UTF-8", "de_DE.utf8", "fr_FR.UTF-8", "fr_FR.utf8"})
    if (!comma && setlocale(LC_NUMERIC, l)) comma = l;
  if (comma) {
    SCOPED_TRACE(comma);
    mf_plan_figures f = fig_;
    f.predicted_step_seconds = 2.5;
    const std::string a = TmpPath("comma.plan.json");
    const mf_status st = mf_plan_write_json(p_, d_, &f, a.c_str());
    mf_plan_figures back{};
    mf_decisions *d = nullptr;
    EXPECT_EQ(mf_decisions_create(p_, &d), MF_OK);
    const mf_status rst = mf_plan_read_json(p_, a.c_str(), d, &back);
    setlocale(LC_NUMERIC, "C");
    mf_decisions_free(d);
    ASSERT_EQ(st, MF_OK) << mf_last_error();
    EXPECT_NE(Slurp(a).find("\"predicted_step_seconds\": 2.5,\n"), std::string::npos);
    EXPECT_EQ(rst, MF_OK) << mf_last_error();
    EXPECT_EQ(back.predicted_step_seconds, 2.5);
  }
  // Past int64 is refused, not written.
  mf_plan_figures f = fig_;
  f.device_backend_bytes = (uint64_t)INT64_MAX + 1;
  EXPECT_EQ(mf_plan_write_json(p_, d_, &f, TmpPath("c.plan.json").c_str()), MF_ERR_INVALID_ARG);
}

// Malformed or impossible placements: errors naming the file, the entry and
// the tensor; decisions untouched (Read checks).
TEST_F(PlanIo, OptimizerPlacement) {
  const size_t np = (size_t)p_->params->n;
  const std::string w1 = "for '" + std::string(p_->params->params[1].name) + "'";
  EXPECT_ERROR(
      Read(Edited("plan.json",
                  [](json_t *r) { json_object_set_new(Entry(r, 1), "optimizer", json_string("gpu")); })),
      MF_ERR_FORMAT, "plan.json: tensors[1].optimizer: 'gpu' is not an optimizer placement (host, device)",
      w1.c_str());
  EXPECT_ERROR(
      Read(Edited("plan.json",
                  [](json_t *r) { json_object_set_new(Entry(r, 1), "optimizer", json_integer(1)); })),
      MF_ERR_FORMAT, "plan.json: tensors[1].optimizer: expected a string (host, device) for ", w1.c_str(),
      "got an integer");
  // Only a weight's entry has one (entry np is the first gradient's).
  std::string place = "plan.json: tensors[" + std::to_string(np) + "].optimizer: ";
  EXPECT_ERROR(
      Read(Edited("plan.json",
                  [&](json_t *r) { json_object_set_new(Entry(r, np), "optimizer", json_string("host")); })),
      MF_ERR_FORMAT, place.c_str(), "only a param entry has an optimizer placement, this is a grad");

  // "device" for a weight that is streamed: parameter 0 (i % 3 == 0) is.
  ASSERT_EQ(d_->param[0], MF_PARAM_STREAM);
  const char *w0 = p_->params->params[0].name;
  EXPECT_ERROR(Read(Edited("plan.json", [&](json_t *r) { SetDecision(r, w0, "device", "optimizer"); })),
               MF_ERR_CONFIG, "plan.json: tensors[0].optimizer: '", w0, "' has its optimizer on the device",
               "weights streamed");
  // "device" for a weight whose gradient is streamed: parameter 2 (resident, gradient streamed).
  ASSERT_EQ(d_->param[2], MF_PARAM_RESIDENT);
  ASSERT_EQ(d_->grad[2], MF_GRAD_STREAM);
  const char *w2 = p_->params->params[2].name;
  const int at = EntryOf(w2), gat = EntryOf(p_->tensors[p_->grad_tensor[2]].name);
  ASSERT_GE(at, 0);
  ASSERT_GE(gat, 0);
  place = "plan.json: tensors[" + std::to_string(at) + "].optimizer: '" + w2 + "'";
  const std::string grad_place =
      "tensors[" + std::to_string(gat) + "]: 'grad." + std::string(w2) + "' is stream";
  EXPECT_ERROR(Read(Edited("plan.json", [&](json_t *r) { SetDecision(r, w2, "device", "optimizer"); })),
               MF_ERR_CONFIG, place.c_str(), "gradient streamed", grad_place.c_str());
  // ... and fine once the gradient is on the device.
  std::string ok = Edited("plan.json", [&](json_t *r) {
    SetDecision(r, w2, "device", "optimizer");
    SetDecision(r, p_->tensors[p_->grad_tensor[2]].name, "device");
  });
  mf_decisions *d = nullptr;
  ASSERT_EQ(mf_decisions_create(p_, &d), MF_OK);
  ASSERT_EQ(mf_plan_read_json(p_, ok.c_str(), d, nullptr), MF_OK) << mf_last_error();
  EXPECT_EQ(d->optim[2], MF_OPTIM_DEVICE);
  EXPECT_EQ(d->grad[2], MF_GRAD_DEVICE);
  // What reads back schedules.
  mf_schedule *s = nullptr;
  EXPECT_EQ(mf_schedule_build(p_, d, &s), MF_OK) << mf_last_error();
  if (s) {
    EXPECT_EQ(s->n_optim_device, n_optim_device_ + 1);
  }
  mf_schedule_free(s);
  mf_decisions_free(d);
}

// ------------------------------------------------------- malformed files

TEST_F(PlanIo, NotJson) {
  Result r = ReadFrom("plan.json", "this is not a plan\n");
  EXPECT_ERROR(r, MF_ERR_FORMAT, "plan.json: line 1, column", "invalid JSON");
}

TEST_F(PlanIo, Truncated) {
  std::string text = Slurp(base_);
  Result r = ReadFrom("plan.json", text.substr(0, text.size() / 2));
  EXPECT_ERROR(r, MF_ERR_FORMAT, "plan.json: line ", "invalid JSON");
}

TEST_F(PlanIo, EmptyFile) {
  EXPECT_ERROR(ReadFrom("plan.json", ""), MF_ERR_FORMAT, "plan.json: the file is empty");
  EXPECT_ERROR(ReadFrom("plan.json", " \n\t\n"), MF_ERR_FORMAT, "plan.json: the file is empty");
}

TEST_F(PlanIo, MissingFile) {
  EXPECT_ERROR(Read(TmpPath("no-such.plan.json")), MF_ERR_IO, "no-such.plan.json");
}

TEST_F(PlanIo, NotAnObject) {
  EXPECT_ERROR(ReadFrom("plan.json", "[1, 2]"), MF_ERR_FORMAT, "plan.json: the top level is an array");
}

TEST_F(PlanIo, DuplicateKey) {
  Result r = ReadFrom("plan.json", "{\"format\": \"moefit-plan\", \"format\": \"moefit-plan\"}");
  EXPECT_ERROR(r, MF_ERR_FORMAT, "plan.json: line 1", "duplicate");
}

TEST_F(PlanIo, WrongFormatString) {
  std::string path =
      Edited("plan.json", [](json_t *r) { json_object_set_new(r, "format", json_string("moefit-cfg")); });
  EXPECT_ERROR(Read(path), MF_ERR_FORMAT, "plan.json: format: expected \"moefit-plan\", got 'moefit-cfg'");
  path = Edited("plan.json", [](json_t *r) { json_object_del(r, "format"); });
  EXPECT_ERROR(Read(path), MF_ERR_FORMAT, "plan.json: (top level): missing 'format'");
  EXPECT_ERROR(ReadFrom("plan.json", "{\"a\": 1}"), MF_ERR_FORMAT, "missing 'format'");
}

TEST_F(PlanIo, NewerVersion) {
  std::string path =
      Edited("plan.json", [](json_t *r) { json_object_set_new(r, "version", json_integer(7)); });
  EXPECT_ERROR(Read(path), MF_ERR_UNSUPPORTED, "plan.json: version: ", "version 7", "versions 1 to 6");
  path = Edited("plan.json", [](json_t *r) { json_object_set_new(r, "version", json_integer(0)); });
  EXPECT_ERROR(Read(path), MF_ERR_FORMAT, "plan.json: version: expected a positive integer");
}

// Version 1 (before the staging and host figures) still reads, its new figures 0;
// version 2 needs them, and a version-1 file must not have them.
TEST_F(PlanIo, Version1StillReads) {
  static const char *const v2[] = {"staging_bytes", "staging_slab_limit_bytes", "staging_pool_bytes",
                                   "host_bytes"};
  std::string path = Edited("v1.plan.json", [](json_t *r) { MakeVersion(r, 1); });
  mf_decisions *d = nullptr;
  ASSERT_EQ(mf_decisions_create(p_, &d), MF_OK);
  mf_plan_figures f = {9, 9, 9, 9.0, 9, 9, 9, 9, 9, 9};
  ASSERT_EQ(mf_plan_read_json(p_, path.c_str(), d, &f), MF_OK) << mf_last_error();
  EXPECT_EQ(0, memcmp(d->param, d_->param, (size_t)d->n_params));
  EXPECT_EQ(f.arena_bytes, fig_.arena_bytes);
  EXPECT_EQ(f.device_backend_bytes, 0u);
  EXPECT_EQ(f.staging_bytes, 0u);
  EXPECT_EQ(f.staging_slab_limit_bytes, 0u);
  EXPECT_EQ(f.staging_pool_bytes, 0u);
  EXPECT_EQ(f.host_bytes, 0u);
  mf_decisions_free(d);
  for (const char *k : v2) {
    std::string key = k;
    path = Edited("plan.json", [&](json_t *r) { json_object_del(r, key.c_str()); });
    EXPECT_ERROR(Read(path), MF_ERR_FORMAT, "plan.json: (top level): missing '", k);
    path = Edited("plan.json", [&](json_t *r) {
      const json_int_t keep = json_integer_value(json_object_get(r, key.c_str()));
      MakeVersion(r, 1);
      json_object_set_new(r, key.c_str(), json_integer(keep));
    });
    EXPECT_ERROR(Read(path), MF_ERR_FORMAT, "plan.json: ", k, "a version-1 plan has no");
    path = Edited("plan.json", [&](json_t *r) { json_object_set_new(r, key.c_str(), json_integer(-5)); });
    EXPECT_ERROR(Read(path), MF_ERR_FORMAT, k, "expected a non-negative integer");
  }
}

// batch.order: required from version 2, one of the two words, and the program's.
TEST_F(PlanIo, MicroBatchOrder) {
  std::string path = Edited("plan.json", [](json_t *r) { json_object_del(json_object_get(r, "batch"), "order"); });
  EXPECT_ERROR(Read(path), MF_ERR_FORMAT, "plan.json: batch: missing 'order'");
  path = Edited("plan.json",
                [](json_t *r) { json_object_set_new(json_object_get(r, "batch"), "order", json_string("sideways")); });
  EXPECT_ERROR(Read(path), MF_ERR_FORMAT, "plan.json: batch.order: expected", "got 'sideways'");
  path = Edited("plan.json",
                [](json_t *r) { json_object_set_new(json_object_get(r, "batch"), "order", json_integer(1)); });
  EXPECT_ERROR(Read(path), MF_ERR_FORMAT, "plan.json: batch.order: expected", "got an integer");
  path = Edited("plan.json", [](json_t *r) {
    json_object_set_new(json_object_get(r, "batch"), "order", json_string("layer-major"));
  });
  EXPECT_ERROR(Read(path), MF_ERR_CONFIG, "plan.json: batch.order: the plan was made for the layer-major order",
               "the program is micro-batch-major");
  path = Edited("plan.json", [](json_t *r) {
    MakeVersion(r, 1);
    json_object_set_new(json_object_get(r, "batch"), "order", json_string("micro-batch-major"));
  });
  EXPECT_ERROR(Read(path), MF_ERR_FORMAT, "plan.json: batch: ", "order");  // not a version-1 key
}

TEST_F(PlanIo, WrongTypes) {
  struct Case {
    const char *name;
    std::function<void(json_t *)> edit;
    const char *want;
  } cases[] = {
      {"version", [](json_t *r) { json_object_set_new(r, "version", json_string("1")); },
       "version: expected a positive integer, got a string"},
      {"model", [](json_t *r) { json_object_set_new(r, "model", json_integer(3)); },
       "model: expected an object, got an integer"},
      {"model.layers",
       [](json_t *r) { json_object_set_new(json_object_get(r, "model"), "layers", json_real(2.0)); },
       "model.layers: expected a non-negative integer, got a real number"},
      {"model.family",
       [](json_t *r) { json_object_set_new(json_object_get(r, "model"), "family", json_null()); },
       "model.family: expected a string, got null"},
      {"batch.seq_len",
       [](json_t *r) { json_object_set_new(json_object_get(r, "batch"), "seq_len", json_integer(-8)); },
       "batch.seq_len: expected a non-negative integer, got a negative one"},
      {"figures", [](json_t *r) { json_object_set_new(r, "arena_bytes", json_string("big")); },
       "arena_bytes: expected a non-negative integer, got a string"},
      {"seconds", [](json_t *r) { json_object_set_new(r, "predicted_step_seconds", json_true()); },
       "predicted_step_seconds: expected a non-negative number, got a boolean"},
      {"tensors", [](json_t *r) { json_object_set_new(r, "tensors", json_object()); },
       "tensors: expected an array, got an object"},
      {"entry", [](json_t *r) { json_array_set_new(json_object_get(r, "tensors"), 2, json_integer(1)); },
       "tensors[2]: expected an object, got an integer"},
      {"name", [](json_t *r) { json_object_set_new(Entry(r, 3), "name", json_integer(5)); },
       "tensors[3].name: expected a string, got an integer"},
      {"bytes", [](json_t *r) { json_object_set_new(Entry(r, 3), "bytes", json_string("12")); },
       "tensors[3].bytes: expected a non-negative integer, got a string"},
      {"decision", [](json_t *r) { json_object_set_new(Entry(r, 4), "decision", json_array()); },
       "tensors[4].decision: expected a string, got an array"},
      {"missing", [](json_t *r) { json_object_del(Entry(r, 1), "decision"); },
       "tensors[1]: missing 'decision'"},
      {"unknown key", [](json_t *r) { json_object_set_new(Entry(r, 1), "colour", json_string("red")); },
       "tensors[1]: unknown key 'colour'"},
      {"unknown top key", [](json_t *r) { json_object_set_new(r, "notes", json_string("hi")); },
       "(top level): unknown key 'notes'"},
      {"missing batch", [](json_t *r) { json_object_del(r, "batch"); }, "(top level): missing 'batch'"},
      {"bad kind word", [](json_t *r) { json_object_set_new(Entry(r, 1), "kind", json_string("weight")); },
       "tensors[1].kind: 'weight' is not a tensor kind (param, grad, act)"},
  };
  for (const Case &c : cases) {
    SCOPED_TRACE(c.name);
    EXPECT_ERROR(Read(Edited("plan.json", c.edit)), MF_ERR_FORMAT, "plan.json: ", c.want);
  }
}

TEST_F(PlanIo, BadDecisionWord) {
  std::string path = Edited(
      "plan.json", [](json_t *r) { json_object_set_new(Entry(r, 17), "decision", json_string("sideways")); });
  EXPECT_ERROR(
      Read(path), MF_ERR_FORMAT,
      "plan.json: tensors[17].decision: 'sideways' is not a decision for a param (resident, stream)");
  // A word of another kind is not one of this kind's.
  size_t last = 2 * (size_t)p_->params->n + (size_t)n_acts_ - 1;
  path = Edited("plan.json",
                [&](json_t *r) { json_object_set_new(Entry(r, last), "decision", json_string("stream")); });
  EXPECT_ERROR(Read(path), MF_ERR_FORMAT, "'stream' is not a decision for an act (keep, offload, recompute)");
  // Control bytes from the file are escaped in the message.
  path = Edited("plan.json",
                [](json_t *r) { json_object_set_new(Entry(r, 0), "decision", json_string("a\x1b[2Jb")); });
  EXPECT_ERROR(Read(path), MF_ERR_FORMAT, "'a\\x1b[2Jb' is not a decision");
}

TEST_F(PlanIo, UnknownTensor) {
  std::string path = Edited("plan.json", [](json_t *r) {
    json_object_set_new(Entry(r, 0), "name", json_string("model.layers.9.mlp.experts.0.up_proj.weight"));
  });
  EXPECT_ERROR(Read(path), MF_ERR_CONFIG,
               "plan.json: tensors[0].name: 'model.layers.9.mlp.experts.0.up_proj.weight' is not a tensor");
  // A program tensor a plan does not decide: an input.
  path = Edited("plan.json", [](json_t *r) {
    json_t *e = Entry(r, 0);
    json_object_set_new(e, "name", json_string("mb0.input_ids"));
    json_object_set_new(e, "kind", json_string("act"));
    json_object_set_new(e, "decision", json_string("keep"));
  });
  EXPECT_ERROR(Read(path), MF_ERR_CONFIG, "tensors[0].name: 'mb0.input_ids' is not a tensor a plan decides");
}

TEST_F(PlanIo, WrongKind) {
  std::string path = Edited("plan.json", [](json_t *r) {
    json_object_set_new(Entry(r, 0), "kind", json_string("grad"));
    json_object_set_new(Entry(r, 0), "decision", json_string("device"));
  });
  EXPECT_ERROR(
      Read(path), MF_ERR_CONFIG,
      "plan.json: tensors[0].kind: 'model.embed_tokens.weight' is a param in this program, not a grad");
}

TEST_F(PlanIo, WrongBytes) {
  std::string path =
      Edited("plan.json", [](json_t *r) { json_object_set_new(Entry(r, 2), "bytes", json_integer(4)); });
  EXPECT_ERROR(Read(path), MF_ERR_CONFIG, "plan.json: tensors[2].bytes: the plan has 4 bytes for");
}

TEST_F(PlanIo, RecomputeOfANonRecomputableTensor) {
  int32_t t = MakeUnrecomputable(p_);
  ASSERT_GE(t, 0) << "program layout changed: pick another tensor";
  memset(d_->act, MF_ACT_KEEP, (size_t)d_->n_tensors);  // other recomputes may depend on it
  ASSERT_EQ(mf_plan_write_json(p_, d_, &fig_, base_.c_str()), MF_OK) << mf_last_error();
  const char *name = p_->tensors[t].name;
  std::string path = Edited("plan.json", [&](json_t *r) { SetDecision(r, name, "recompute"); });
  EXPECT_ERROR(Read(path), MF_ERR_CONFIG, "plan.json: tensors[",
               "].decision: 'mb0.model.layers.0.input_layernorm.out'", "cannot be recomputed");
  // Offloading it is fine.
  path = Edited("plan.json", [&](json_t *r) { SetDecision(r, name, "offload"); });
  EXPECT_EQ(Read(path).st, MF_OK);
}

TEST_F(PlanIo, DuplicateEntry) {
  std::string path = Edited("plan.json", [](json_t *r) {
    json_array_append_new(json_object_get(r, "tensors"), json_deep_copy(Entry(r, 5)));
  });
  size_t dup = 2 * (size_t)p_->params->n + (size_t)n_acts_;
  std::string place = "plan.json: tensors[" + std::to_string(dup) + "]: ";
  EXPECT_ERROR(Read(path), MF_ERR_FORMAT, place.c_str(), "appears twice (first at tensors[5])");
}

TEST_F(PlanIo, MissingEntries) {
  std::string path = Edited("plan.json", [](json_t *r) {
    json_t *t = json_object_get(r, "tensors");
    for (int k = 0; k < 7; k++) json_array_remove(t, json_array_size(t) - 1);
    json_array_remove(t, 0);
  });
  EXPECT_ERROR(Read(path), MF_ERR_CONFIG, "plan.json: tensors: 8 of the program's tensors have no decision: ",
               "model.embed_tokens.weight, mb1.", ", ...");
  path = Edited("plan.json", [](json_t *r) { json_array_clear(json_object_get(r, "tensors")); });
  EXPECT_ERROR(Read(path), MF_ERR_CONFIG, "have no decision");
}

TEST_F(PlanIo, PlanForAnotherShape) {
  Prog other;
  other.Build(1, 16, 2);
  mf_decisions *d = nullptr;
  ASSERT_EQ(mf_decisions_create(other.p, &d), MF_OK);
  std::string path = TmpPath("plan.json");
  ASSERT_EQ(mf_plan_write_json(other.p, d, &fig_, path.c_str()), MF_OK) << mf_last_error();
  mf_decisions_free(d);
  EXPECT_ERROR(Read(path), MF_ERR_CONFIG,
               "plan.json: batch.seq_len: the plan was made for seq_len 16, the config has 8");
  path = Edited("plan.json", [](json_t *r) {
    json_object_set_new(json_object_get(r, "batch"), "grad_accum", json_integer(4));
  });
  EXPECT_ERROR(Read(path), MF_ERR_CONFIG,
               "batch.grad_accum: the plan was made for grad_accum 4, the config has 2");
  path = Edited("plan.json", [](json_t *r) {
    json_object_set_new(json_object_get(r, "model"), "hidden", json_integer(4096));
  });
  EXPECT_ERROR(Read(path), MF_ERR_CONFIG,
               "model.hidden: the plan was made for hidden 4096, the model has 32");
  path = Edited("plan.json", [](json_t *r) {
    json_object_set_new(json_object_get(r, "model"), "family", json_string("mixtral"));
  });
  EXPECT_ERROR(Read(path), MF_ERR_CONFIG,
               "model.family: the plan was made for family mixtral, the model is olmoe");
}

TEST_F(PlanIo, DeepNesting) {
  // Far past jansson's own limit; refused before it is parsed.
  std::string deep =
      "{\"format\": \"moefit-plan\", \"x\": " + std::string(200000, '[') + std::string(200000, ']') + "}";
  EXPECT_ERROR(ReadFrom("plan.json", deep), MF_ERR_FORMAT, "plan.json: line 1, column",
               "nests deeper than 16 levels");
  // Just past the plan's cap, on line 3.
  std::string some = "{\n\"a\": 1,\n  \"x\": " + std::string(16, '[') + std::string(16, ']') + "}";
  EXPECT_ERROR(ReadFrom("plan.json", some), MF_ERR_FORMAT, "plan.json: line 3, column 23:", "nests deeper");
  // Brackets inside strings do not count.
  std::string path = Edited("plan.json", [](json_t *r) {
    json_object_set_new(Entry(r, 0), "name", json_string((std::string(100, '[') + "\\\"").c_str()));
  });
  EXPECT_ERROR(Read(path), MF_ERR_CONFIG, "tensors[0].name: '[[[[", "is not a tensor");
}

TEST_F(PlanIo, HugeFile) {
  std::string path = TmpPath("huge.plan.json");
  WriteText(path, "");
  ASSERT_EQ(truncate(path.c_str(), (off_t)(256 << 20) + 1), 0);  // sparse: nothing is written
  EXPECT_ERROR(Read(path), MF_ERR_FORMAT, "huge.plan.json: 268435457 bytes is too large for a plan");
  unlink(path.c_str());
}

TEST_F(PlanIo, GarbageBytes) {
  std::string bin("{\"format\": \"moefit-plan\"\x00\xff\xfe", 27);
  EXPECT_ERROR(ReadFrom("plan.json", bin), MF_ERR_FORMAT, "plan.json: line 1", "invalid JSON");
}

// The reader parses JSON itself (planner/plan_io_json.c): on the corners of
// the syntax it refuses what jansson (JSON_REJECT_DUPLICATES) refuses, with
// "invalid JSON" and the line and column, and takes what jansson takes (none
// of these texts is a plan, so those fail later, as not plans).
TEST_F(PlanIo, JsonSyntaxAsJanssonJudgesIt) {
  std::string many = "{";
  for (int k = 0; k < 40; k++) many += "\"k" + std::to_string(k) + "\": 0, ";
  const std::vector<std::string> texts = {
      // numbers
      "{\"a\": 01}",
      "{\"a\": 1.}",
      "{\"a\": .5}",
      "{\"a\": -}",
      "{\"a\": +1}",
      "{\"a\": 1e}",
      "{\"a\": 1e+}",
      "{\"a\": 1e999}",
      "{\"a\": -1e999}",
      "{\"a\": 1e-999}",
      "{\"a\": -0}",
      "{\"a\": 0.5E+3}",
      "{\"a\": 9223372036854775807}",
      "{\"a\": 9223372036854775808}",
      "{\"a\": -9223372036854775808}",
      "{\"a\": -9223372036854775809}",
      // escapes
      "{\"a\": \"\\u0000\"}",
      "{\"a\": \"\\ud800\"}",
      "{\"a\": \"\\udc00\"}",
      "{\"a\": \"\\ud83d\\ude00\"}",
      "{\"a\": \"\\ud83d\\u0041\"}",
      "{\"a\": \"\\u12\"}",
      "{\"a\": \"\\uZZZZ\"}",
      "{\"a\": \"\\q\"}",
      "{\"a\": \"\\/\\b\\f\\n\\r\\t\\\\\\\"\"}",
      // bytes in strings: control, UTF-8, overlong, surrogate, past U+10FFFF, cut, stray
      "{\"a\": \"\x01\"}",
      "{\"a\": \"\xc3\xa9\"}",
      "{\"a\": \"\xc0\xaf\"}",
      "{\"a\": \"\xed\xa0\x80\"}",
      "{\"a\": \"\xf4\x90\x80\x80\"}",
      "{\"a\": \"\xe2\x82\"}",
      "{\"a\": \"\x80\"}",
      // structure
      "{\"a\": [1,]}",
      "{\"a\": 1,}",
      "{\"a\" 1}",
      "{\"a\": 1} x",
      "{\"a\": 1}\n \t\r",
      "{\"a\": tru}",
      "{\"a\": nul}",
      "{\"a\": true, \"b\": false, \"c\": null}",
      "{a: 1}",
      "{\"a\": 1 \"b\": 2}",
      "{\"a\": [1 2]}",
      "\"plan\"",
      "42",
      "{\"a\": \"unterminated",
      "{\"a\": [",
      "{,}",
      "{\"a\": {}, \"b\": []}",
      "[]",
      std::string("{\"a\": 1}\0", 9),
      // repeated keys (the same once decoded; in a large object)
      "{\"a\": 1, \"a\": 2}",
      "{\"\xc3\xa9\": 1, \"\\u00e9\": 2}",
      many + "\"k7\": 1}",
      many + "\"k40\": 1}",
  };

  for (const std::string &text : texts) {
    SCOPED_TRACE(text);
    json_error_t e;
    json_t *j = json_loadb(text.data(), text.size(), JSON_REJECT_DUPLICATES, &e);
    const Result r = ReadFrom("plan.json", text);
    EXPECT_NE(r.st, MF_OK);
    const bool refused = r.err.find("invalid JSON") != std::string::npos;
    EXPECT_EQ(refused, j == nullptr) << "moefit: " << r.err << "; jansson: " << (j ? "accepted" : e.text);
    if (refused) EXPECT_ERROR(r, MF_ERR_FORMAT, "plan.json: line 1, column ");
    json_decref(j);
  }
  // A NUL byte is refused anywhere (jansson drops one that follows a number).
  EXPECT_ERROR(ReadFrom("plan.json", std::string("{\"a\": [1, 2\0]}", 14)), MF_ERR_FORMAT,
               "plan.json: line 1, column 12: invalid JSON: expected ',' or ']', got byte 0x00");
  // A repeated key in a large object: where it repeats.
  EXPECT_ERROR(ReadFrom("plan.json", many + "\n\"k7\": 1}"), MF_ERR_FORMAT,
               "plan.json: line 2, column 1: ", "invalid JSON: duplicate object key 'k7'");
  EXPECT_ERROR(ReadFrom("plan.json", "{\n  \"a\": 1,\n  \"b\": [1, 2,, 3]}"), MF_ERR_FORMAT,
               "plan.json: line 3, column 14: invalid JSON: expected a value, got ','");
}

// -------------------------------------------------------------- overrides

class Overrides : public ::testing::Test {
 protected:
  void SetUp() override {
    prog_.Build(1, 8, 2);
    p_ = prog_.p;
    ASSERT_EQ(mf_decisions_create(p_, &d_), MF_OK);
    ASSERT_EQ(mf_plan_pins_create(p_, &pins_), MF_OK);
  }
  void TearDown() override {
    mf_plan_pins_free(&pins_);
    mf_decisions_free(d_);
    mf_config_free(cfg_);
  }
  // Loads a config whose memory.overrides are `items` (one "- {...}" per line,
  // from line 9 of x.yaml) and applies them.
  Result Apply(const std::vector<std::string> &items) {
    std::string text =
        "model:\n"
        "  init: {family: olmoe, hidden: 32, layers: 2, heads: 4, kv_heads: 4, experts: 4, top_k: 2, "
        "expert_ffn: 16, vocab: 64}\n"
        "data:\n"
        "  train: t.tokens\n"
        "train:\n"
        "  steps: 1\n"
        "memory:\n"
        "  overrides:\n";
    for (const auto &i : items) text += "    - " + i + "\n";
    mf_config_free(cfg_);
    cfg_ = nullptr;
    Result r;
    r.st = mf_config_load_string(text.c_str(), text.size(), "x.yaml", nullptr, 0, &cfg_);
    EXPECT_EQ(r.st, MF_OK) << mf_last_error();
    if (r.st != MF_OK) return r;
    mf_error_clear();
    r.st = mf_plan_apply_overrides(p_, &cfg_->memory, d_, &pins_);
    r.err = mf_last_error();
    return r;
  }
  int Count(const uint8_t *a, int64_t n) {
    int c = 0;
    for (int64_t i = 0; i < n; i++) c += a[i] != 0;
    return c;
  }
  Prog prog_;
  mf_program *p_ = nullptr;
  mf_decisions *d_ = nullptr;
  mf_plan_pins pins_ = {nullptr, nullptr, nullptr, nullptr};
  mf_config *cfg_ = nullptr;
};

TEST_F(Overrides, ExpertParamsStream) {
  Result r = Apply({"{match: \"model.layers.*.mlp.experts.*\", params: stream}"});
  ASSERT_EQ(r.st, MF_OK) << r.err;
  int pinned = 0;
  for (int64_t i = 0; i < p_->params->n; i++) {
    mf_param_role role = p_->params->params[i].role;
    bool expert = role == MF_P_EXPERT_GATE || role == MF_P_EXPERT_UP || role == MF_P_EXPERT_DOWN;
    EXPECT_EQ(pins_.param[i], expert ? 1 : 0) << p_->params->params[i].name;
    EXPECT_EQ(d_->param[i], expert ? MF_PARAM_STREAM : MF_PARAM_RESIDENT) << p_->params->params[i].name;
    pinned += expert;
  }
  EXPECT_EQ(pinned, 2 * 4 * 3);
  EXPECT_EQ(Count(pins_.grad, p_->params->n), 0);
  EXPECT_EQ(Count(pins_.act, p_->n_tensors), 0);
  EXPECT_EQ(Count(d_->act, p_->n_tensors), 0);
}

TEST_F(Overrides, ActivationsRecomputeEveryMicroBatch) {
  Result r = Apply({"{match: \"model.layers.*.mlp.experts.act\", activations: recompute}"});
  ASSERT_EQ(r.st, MF_OK) << r.err;
  int n = 0;
  for (int32_t t = 0; t < p_->n_tensors; t++) {
    std::string name = p_->tensors[t].name;
    bool want = name.size() > 16 && name.compare(name.size() - 16, 16, ".mlp.experts.act") == 0;
    EXPECT_EQ(pins_.act[t], want ? 1 : 0) << name;
    EXPECT_EQ(d_->act[t], want ? MF_ACT_RECOMPUTE : MF_ACT_KEEP) << name;
    n += want;
  }
  EXPECT_EQ(n, 2 * 2);  // layers x micro-batches
  EXPECT_EQ(Count(pins_.param, p_->params->n), 0);

  // The full name picks one micro-batch.
  r = Apply({"{match: \"mb1.model.layers.0.*\", activations: offload}"});
  ASSERT_EQ(r.st, MF_OK) << r.err;
  for (int32_t t = 0; t < p_->n_tensors; t++)
    if (d_->act[t] == MF_ACT_OFFLOAD) {
      EXPECT_EQ(p_->tensors[t].micro, 1) << p_->tensors[t].name;
      EXPECT_EQ(p_->tensors[t].layer, 0) << p_->tensors[t].name;
    }
  EXPECT_GT(Count(pins_.act, p_->n_tensors), 4);
}

TEST_F(Overrides, GradsAndLaterEntriesWin) {
  Result r =
      Apply({"{match: \"model.layers.*.mlp.experts.*\", params: stream, grads: stream, optimizer: host}",
             "{match: \"model.layers.0.mlp.experts.0.*\", params: resident}"});
  ASSERT_EQ(r.st, MF_OK) << r.err;
  for (int64_t i = 0; i < p_->params->n; i++) {
    const mf_param &q = p_->params->params[i];
    if (q.expert < 0) continue;
    EXPECT_EQ(pins_.param[i], 1);
    EXPECT_EQ(pins_.grad[i], 1);
    EXPECT_EQ(d_->grad[i], MF_GRAD_STREAM);
    EXPECT_EQ(d_->param[i], q.layer == 0 && q.expert == 0 ? MF_PARAM_RESIDENT : MF_PARAM_STREAM) << q.name;
  }
  // optimizer: host pins the placement and nothing else.
  mf_plan_pins_free(&pins_);
  ASSERT_EQ(mf_plan_pins_create(p_, &pins_), MF_OK);
  r = Apply({"{match: \"model.norm.weight\", optimizer: host}"});
  ASSERT_EQ(r.st, MF_OK) << r.err;
  EXPECT_EQ(Count(pins_.optim, p_->params->n), 1);
  EXPECT_EQ(Count(pins_.param, p_->params->n) + Count(pins_.grad, p_->params->n), 0);
}

TEST_F(Overrides, PatternMatchingNothing) {
  Result r = Apply({"{match: \"model.layers.*.block_sparse_moe.*\", params: stream}"});
  EXPECT_ERROR(
      r, MF_ERR_CONFIG,
      "x.yaml:9:7: memory.overrides[0]: match 'model.layers.*.block_sparse_moe.*' matches no parameter");
  // Activation names, not parameter names, for activations.
  r = Apply({"{match: \"model.layers.0.self_attn.q\", activations: keep}",
             "{match: \"model.embed_tokens.weight\", activations: offload}"});
  EXPECT_ERROR(r, MF_ERR_CONFIG,
               "x.yaml:10:7: memory.overrides[1]: match 'model.embed_tokens.weight' matches no activation");
}

static bool InLayer(const mf_param &q, int layer) {
  return std::string(q.name).rfind("model.layers." + std::to_string(layer) + ".", 0) == 0;
}

// optimizer: device alone pins what it needs with it: the weights resident,
// the gradient on the device and the optimizer on the device, for exactly the
// parameters it matches, whatever the decisions were.
TEST_F(Overrides, OptimizerDevicePinsWeightsAndGradients) {
  memset(d_->param, MF_PARAM_STREAM, (size_t)d_->n_params);
  memset(d_->grad, MF_GRAD_STREAM, (size_t)d_->n_params);
  Result r = Apply({"{match: \"model.layers.1.*\", optimizer: device}"});
  ASSERT_EQ(r.st, MF_OK) << r.err;
  int n = 0;
  for (int64_t i = 0; i < p_->params->n; i++) {
    const mf_param &q = p_->params->params[i];
    const bool hit = InLayer(q, 1);
    n += hit;
    EXPECT_EQ(d_->optim[i], hit ? MF_OPTIM_DEVICE : MF_OPTIM_HOST) << q.name;
    EXPECT_EQ(d_->param[i], hit ? MF_PARAM_RESIDENT : MF_PARAM_STREAM) << q.name;
    EXPECT_EQ(d_->grad[i], hit ? MF_GRAD_DEVICE : MF_GRAD_STREAM) << q.name;
    EXPECT_EQ(pins_.optim[i], hit ? 1 : 0) << q.name;
    EXPECT_EQ(pins_.param[i], hit ? 1 : 0) << q.name;
    EXPECT_EQ(pins_.grad[i], hit ? 1 : 0) << q.name;
  }
  EXPECT_GT(n, 4 * 3);  // the layer's experts and more
  EXPECT_LT(n, p_->params->n);
  EXPECT_EQ(Count(pins_.act, p_->n_tensors), 0);
  // The decisions schedule.
  mf_schedule *s = nullptr;
  EXPECT_EQ(mf_schedule_build(p_, d_, &s), MF_OK) << mf_last_error();
  if (s) {
    EXPECT_EQ(s->n_optim_device, n);
  }
  mf_schedule_free(s);
}

TEST_F(Overrides, OptimizerDeviceWithStreamInTheSameEntryIsAnError) {
  Result r = Apply({"{match: \"model.layers.0.*\", activations: offload}",
                    "{match: \"model.layers.*\", params: stream, optimizer: device}"});
  EXPECT_ERROR(r, MF_ERR_CONFIG,
               "x.yaml:10:7: memory.overrides[1]: optimizer: device needs the weights resident",
               "params: stream");
  r = Apply({"{match: \"model.layers.*\", grads: stream, optimizer: device}"});
  EXPECT_ERROR(r, MF_ERR_CONFIG,
               "x.yaml:9:7: memory.overrides[0]: optimizer: device needs the gradients on the device",
               "grads: stream");
  // Nothing changed.
  EXPECT_EQ(
      Count(d_->param, p_->params->n) + Count(d_->grad, p_->params->n) + Count(d_->optim, p_->params->n), 0);
  EXPECT_EQ(Count(pins_.param, p_->params->n) + Count(pins_.optim, p_->params->n), 0);
  EXPECT_EQ(Count(d_->act, p_->n_tensors) + Count(pins_.act, p_->n_tensors), 0);
}

TEST_F(Overrides, OptimizerDeviceOverAnEarlierStreamPinIsAnError) {
  Result r = Apply({"{match: \"model.layers.0.mlp.*\", params: stream}",
                    "{match: \"model.layers.*\", optimizer: device}"});
  EXPECT_ERROR(r, MF_ERR_CONFIG,
               "x.yaml:10:7: memory.overrides[1]: optimizer: device for model.layers.0.mlp.",
               "which 'model.layers.*' matches: memory.overrides[0] (x.yaml:9:7) pins its weights to stream");
  r = Apply({"{match: \"model.layers.1.self_attn.*\", grads: stream}", "{match: \"*\", optimizer: host}",
             "{match: \"model.layers.1.*\", optimizer: device}"});
  EXPECT_ERROR(r, MF_ERR_CONFIG,
               "x.yaml:11:7: memory.overrides[2]: optimizer: device for model.layers.1.self_attn.",
               "memory.overrides[0] (x.yaml:9:7) pins its gradient to stream");
  EXPECT_EQ(
      Count(d_->param, p_->params->n) + Count(d_->grad, p_->params->n) + Count(d_->optim, p_->params->n), 0);
  EXPECT_EQ(Count(pins_.param, p_->params->n) + Count(pins_.grad, p_->params->n) +
                Count(pins_.optim, p_->params->n),
            0);
  // A pin made before the overrides (the caller's) is named as such.
  pins_.param[p_->params->n - 1] = 1;
  d_->param[p_->params->n - 1] = MF_PARAM_STREAM;
  r = Apply({"{match: \"*\", optimizer: device}"});
  EXPECT_ERROR(r, MF_ERR_CONFIG, "x.yaml:9:7: memory.overrides[0]: optimizer: device for ",
               (const char *)p_->params->params[p_->params->n - 1].name,
               "a pin made before memory.overrides");
}

// Later entries win: streaming weights (or gradients) after optimizer: device
// sends those parameters' optimizer home; optimizer: host pins only the placement.
TEST_F(Overrides, LaterStreamSendsTheOptimizerHome) {
  Result r = Apply({"{match: \"model.layers.*\", optimizer: device}",
                    "{match: \"model.layers.0.mlp.*\", params: stream}",
                    "{match: \"model.layers.1.mlp.*\", grads: stream}",
                    "{match: \"model.layers.1.self_attn.*\", optimizer: host}"});
  ASSERT_EQ(r.st, MF_OK) << r.err;
  int dev = 0;
  for (int64_t i = 0; i < p_->params->n; i++) {
    const mf_param &q = p_->params->params[i];
    const std::string name = q.name;
    const bool layer = q.layer >= 0;
    const bool mlp0 = name.rfind("model.layers.0.mlp.", 0) == 0,
               mlp1 = name.rfind("model.layers.1.mlp.", 0) == 0;
    const bool attn1 = name.rfind("model.layers.1.self_attn.", 0) == 0;
    const bool want = layer && !mlp0 && !mlp1 && !attn1;
    dev += want;
    EXPECT_EQ(d_->optim[i], want ? MF_OPTIM_DEVICE : MF_OPTIM_HOST) << name;
    EXPECT_EQ(pins_.optim[i], layer ? 1 : 0) << name;
    EXPECT_EQ(d_->param[i], mlp0 ? MF_PARAM_STREAM : MF_PARAM_RESIDENT) << name;
    EXPECT_EQ(d_->grad[i], mlp1 ? MF_GRAD_STREAM : MF_GRAD_DEVICE) << name;
    EXPECT_EQ(pins_.param[i], layer ? 1 : 0) << name;
  }
  EXPECT_GT(dev, 0);
  mf_schedule *s = nullptr;
  EXPECT_EQ(mf_schedule_build(p_, d_, &s), MF_OK) << mf_last_error();
  mf_schedule_free(s);
}

// Decisions that came with the optimizer on the device (a baseline, a plan
// file): an override streaming the weights sends the optimizer home, unpinned.
TEST_F(Overrides, StreamOverADeviceOptimizerDecision) {
  memset(d_->optim, MF_OPTIM_DEVICE, (size_t)d_->n_params);
  Result r = Apply({"{match: \"model.layers.*.mlp.experts.*\", params: stream}"});
  ASSERT_EQ(r.st, MF_OK) << r.err;
  for (int64_t i = 0; i < p_->params->n; i++) {
    const mf_param &q = p_->params->params[i];
    EXPECT_EQ(d_->optim[i], q.expert >= 0 ? MF_OPTIM_HOST : MF_OPTIM_DEVICE) << q.name;
  }
  EXPECT_EQ(Count(pins_.optim, p_->params->n), 0);
}

// A forward-only program has no optimizer: optimizer overrides change nothing
// (not even the pins optimizer: device implies), but their words are checked.
TEST_F(Overrides, ForwardOnlyIgnoresTheOptimizer) {
  Result r = Apply({"{match: \"model.layers.*\", optimizer: device}",
                    "{match: \"model.layers.0.*\", params: stream, optimizer: device}"});
  ASSERT_NE(r.st, MF_OK);  // a training program refuses the second entry
  Prog fwd;
  fwd.Build(1, 8, 1, 1);
  mf_decisions *d = nullptr;
  mf_plan_pins pins = {nullptr, nullptr, nullptr, nullptr};
  ASSERT_EQ(mf_decisions_create(fwd.p, &d), MF_OK);
  ASSERT_EQ(mf_plan_pins_create(fwd.p, &pins), MF_OK);
  EXPECT_EQ(mf_plan_apply_overrides(fwd.p, &cfg_->memory, d, &pins), MF_OK) << mf_last_error();
  int streamed = 0;
  for (int64_t i = 0; i < fwd.p->params->n; i++) {
    const mf_param &q = fwd.p->params->params[i];
    EXPECT_EQ(d->optim[i], MF_OPTIM_HOST) << q.name;
    EXPECT_EQ(pins.optim[i], 0) << q.name;
    EXPECT_EQ(pins.param[i], InLayer(q, 0) ? 1 : 0) << q.name;
    EXPECT_EQ(d->param[i], InLayer(q, 0) ? MF_PARAM_STREAM : MF_PARAM_RESIDENT) << q.name;
    streamed += d->param[i] == MF_PARAM_STREAM;
  }
  EXPECT_GT(streamed, 0);
  mf_schedule *s = nullptr;
  EXPECT_EQ(mf_schedule_build(fwd.p, d, &s), MF_OK) << mf_last_error();
  mf_schedule_free(s);
  // A bad word is still an error.
  ASSERT_EQ(Apply({"{match: \"*\", optimizer: gpu}"}).st, MF_ERR_CONFIG);
  EXPECT_EQ(mf_plan_apply_overrides(fwd.p, &cfg_->memory, d, &pins), MF_ERR_CONFIG);
  EXPECT_NE(std::string(mf_last_error()).find("optimizer: 'gpu' is not an optimizer placement"),
            std::string::npos)
      << mf_last_error();
  mf_plan_pins_free(&pins);
  mf_decisions_free(d);
}

TEST_F(Overrides, BadWords) {
  EXPECT_ERROR(
      Apply({"{match: \"*\", params: sideways}"}), MF_ERR_CONFIG,
      "x.yaml:9:7: memory.overrides[0]: params: 'sideways' is not a decision for params (resident, stream)");
  EXPECT_ERROR(Apply({"{match: \"*\", params: host}"}), MF_ERR_CONFIG, "'host' is not a decision",
               "is 'stream'");
  EXPECT_ERROR(Apply({"{match: \"*\", grads: nowhere}"}), MF_ERR_CONFIG,
               "grads: 'nowhere' is not a decision");
  EXPECT_ERROR(Apply({"{match: \"*\", activations: evict}"}), MF_ERR_CONFIG,
               "activations: 'evict' is not a decision for activations (keep, offload, recompute)");
  EXPECT_ERROR(Apply({"{match: \"*\", optimizer: nvme}"}), MF_ERR_CONFIG, "optimizer: 'nvme' is not");
}

TEST_F(Overrides, RecomputeImpossible) {
  int32_t t = MakeUnrecomputable(p_);
  ASSERT_GE(t, 0) << "program layout changed: pick another tensor";
  Result r = Apply({"{match: \"model.layers.0.input_layernorm.out\", activations: recompute}"});
  EXPECT_ERROR(r, MF_ERR_CONFIG,
               "x.yaml:9:7: memory.overrides[0]: activations: recompute is impossible for "
               "mb0.model.layers.0.input_layernorm.out");
}

TEST_F(Overrides, AFailingEntryChangesNothing) {
  Result r = Apply({"{match: \"model.layers.*.mlp.experts.*\", params: stream}",
                    "{match: \"model.layers.*.mlp.experts.act\", activations: recompute}",
                    "{match: \"*\", grads: sideways}"});
  EXPECT_ERROR(r, MF_ERR_CONFIG, "x.yaml:11:7: memory.overrides[2]");
  EXPECT_EQ(Count(d_->param, p_->params->n), 0);
  EXPECT_EQ(Count(d_->act, p_->n_tensors), 0);
  EXPECT_EQ(Count(pins_.param, p_->params->n), 0);
  EXPECT_EQ(Count(pins_.act, p_->n_tensors), 0);
}

TEST_F(Overrides, NoOverridesAndNoPins) {
  EXPECT_EQ(mf_plan_apply_overrides(p_, nullptr, d_, &pins_), MF_OK);
  Result r = Apply({"{match: \"model.layers.*.mlp.experts.*\", params: stream}"});
  ASSERT_EQ(r.st, MF_OK);
  mf_decisions *d = nullptr;
  ASSERT_EQ(mf_decisions_create(p_, &d), MF_OK);
  EXPECT_EQ(mf_plan_apply_overrides(p_, &cfg_->memory, d, nullptr), MF_OK) << mf_last_error();
  EXPECT_EQ(Count(d->param, p_->params->n), 24);
  mf_decisions_free(d);
  mf_plan_pins_free(nullptr);
  mf_plan_pins_free(&pins_);
  mf_plan_pins_free(&pins_);  // twice is fine
}

}  // namespace
