// What the parity tests against transformers (parity_test) and PEFT
// (lora_parity_test) share: fixture tensors, the relative error, and one
// forward/backward of a fixture batch on the cpu backend in fp32.
#ifndef MF_TESTS_MODEL_PARITY_UTIL_H
#define MF_TESTS_MODEL_PARITY_UTIL_H

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "src/core/core.h"
#include "src/exec/exec.h"
#include "src/io/safetensors.h"
#include "src/model/params.h"
#include "src/model/program.h"

namespace mf_parity {

inline const float *f32(const mf_safetensors *st, const std::string &name, int64_t numel) {
  const mf_st_tensor *t = mf_safetensors_find(st, name.c_str());
  if (!t || t->dtype != MF_DTYPE_F32 || (int64_t)t->numel != numel) return nullptr;
  return (const float *)t->data;
}

// Parameter i of t in the fixture tensor `prefix` + its name ("grad.", "after."): as it is,
// or, a part of a fused tensor (gpt-oss's experts, mf_param_packed), gathered from that
// into buf. nullptr when the fixture has none.
inline const float *param_ref(const mf_safetensors *st, const char *prefix, const mf_param_table *t,
                              int64_t i, std::vector<float> *buf) {
  const mf_param &p = t->params[i];
  mf_param_src src;
  if (!mf_param_packed(t, i, &src)) return f32(st, std::string(prefix) + p.name, p.numel);
  int64_t total = 1;
  for (int d = 0; d < src.ndim; d++) total *= src.shape[d];
  const float *x = f32(st, std::string(prefix) + src.name, total);
  if (!x) return nullptr;
  const int64_t rows = p.shape[0], cols = p.ndim == 2 ? p.shape[1] : 1;
  buf->resize((size_t)p.numel);
  for (int64_t r = 0; r < rows; r++)
    for (int64_t c = 0; c < cols; c++) (*buf)[(size_t)(r * cols + c)] = x[src.base + r * src.rs + c * src.cs];
  return buf->data();
}

inline double meta_num(const mf_safetensors *st, const char *key) {
  const char *v = mf_safetensors_metadata(st, key);
  return v ? atof(v) : NAN;
}

// Relative error in norm: ||a - b|| / ||b|| (absolute when b is 0).
inline double rel_err(const float *a, const float *b, int64_t n) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < n; i++) {
    double d = (double)a[i] - (double)b[i];
    num += d * d;
    den += (double)b[i] * (double)b[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

struct Result {
  double loss = 0, ce = 0, aux = 0;
  std::vector<float> logits, grads;
  std::vector<int64_t> expert_tokens;
};

// logits[T, V] = hidden[T, H] . lm_head[V, H]^T: a LINEAR_FWD kernel on a cpu
// backend of its own (fp32), operands copied into its arena and the result out.
inline void logits_of(const float *hidden, const float *lm_head, int64_t T, int64_t V, int64_t H,
                      float *logits) {
  mf_backend *b = nullptr;
  mf_cpu_backend_opts bo = {};
  ASSERT_EQ(mf_backend_cpu_create(&bo, &b), MF_OK) << mf_last_error();
  mf_stream *s = nullptr;
  void *base = nullptr;
  const size_t bh = (size_t)(T * H) * 4, bw = (size_t)(V * H) * 4, by = (size_t)(T * V) * 4;
  EXPECT_EQ(b->stream_create(b, &s), MF_OK) << mf_last_error();
  EXPECT_EQ(b->arena_create(b, bh + bw + by, &base), MF_OK) << mf_last_error();
  if (s && base) {
    uint8_t *x = static_cast<uint8_t *>(base), *w = x + bh, *y = w + bw;
    mf_kernel_call k = {};
    k.kind = MF_K_LINEAR_FWD;
    k.b[0] = {x, bh, 0};
    k.b[1] = {w, bw, 0};
    k.b[3] = {y, by, 1};
    k.i[0] = T, k.i[1] = V, k.i[2] = H, k.i[3] = 0;
    k.label = "logits";
    EXPECT_EQ(b->copy(b, x, hidden, bh, MF_COPY_H2D, s), MF_OK) << mf_last_error();
    EXPECT_EQ(b->copy(b, w, lm_head, bw, MF_COPY_H2D, s), MF_OK) << mf_last_error();
    EXPECT_EQ(b->run(b, &k, s), MF_OK) << mf_last_error();
    EXPECT_EQ(b->copy(b, logits, y, by, MF_COPY_D2H, s), MF_OK) << mf_last_error();
    EXPECT_EQ(b->stream_sync(b, s), MF_OK) << mf_last_error();
  }
  if (s) b->stream_free(b, s);
  mf_backend_free(b);
}

// One forward/backward of the fixture batch on the cpu backend (checking mode on).
inline Result run_model(const mf_param_table *t, const std::vector<float> &w, const int32_t *ids,
                        const std::vector<int32_t> &targets, int64_t B, int64_t S, double aux_coef) {
  Result r;
  mf_threadpool *pool = nullptr;
  EXPECT_EQ(mf_threadpool_create(2, &pool), MF_OK);
  mf_cpu_backend_opts bo = {pool, 0, 1, nullptr};
  mf_backend *b = nullptr;
  EXPECT_EQ(mf_backend_cpu_create(&bo, &b), MF_OK);
  mf_program_opts po = {B, S, 1, aux_coef, 13, 0};  // a chunk that does not divide the vocabulary
  mf_program *p = nullptr;
  EXPECT_EQ(mf_program_build(t, &po, &p), MF_OK) << mf_last_error();
  mf_exec *x = nullptr;
  EXPECT_EQ(mf_exec_create(p, b, &x), MF_OK) << mf_last_error();
  const int64_t T = B * S, H = t->spec.hidden, V = t->spec.vocab;
  std::vector<float> hidden((size_t)(T * H));
  mf_exec_capture_final_hidden(x, hidden.data());
  r.grads.assign((size_t)t->total_numel, 0.0f);
  const int32_t *ip[1] = {ids}, *tp[1] = {targets.data()};
  mf_step_result sr;
  EXPECT_EQ(mf_exec_step(x, w.data(), ip, tp, r.grads.data(), &sr), MF_OK) << mf_last_error();
  r.loss = sr.loss;
  r.ce = sr.ce_loss;
  r.aux = sr.aux_loss;
  r.expert_tokens.assign(mf_exec_expert_tokens(x),
                         mf_exec_expert_tokens(x) + t->spec.layers * t->spec.experts);
  r.logits.assign((size_t)(T * V), 0.0f);
  logits_of(hidden.data(), w.data() + t->params[mf_param_lm_head(t)].offset, T, V, H, r.logits.data());
  mf_exec_free(x);
  mf_program_free(p);
  mf_backend_free(b);
  mf_threadpool_free(pool);
  return r;
}

// A fixture's batch: input_ids and labels [B, S] (I32); the target of
// position s is the label at s + 1, -100 (ignored) becoming -1; the aux-loss
// coefficient from the metadata. false when the tensors are not there.
struct Batch {
  int64_t B = 0, S = 0;
  const int32_t *ids = nullptr;
  std::vector<int32_t> targets;
  double aux_coef = NAN;
};
inline bool batch_of(const mf_safetensors *fx, Batch *b) {
  const mf_st_tensor *ids = mf_safetensors_find(fx, "input_ids");
  const mf_st_tensor *labels = mf_safetensors_find(fx, "labels");
  if (!ids || !labels || ids->ndim != 2 || ids->dtype != MF_DTYPE_I32 || labels->dtype != MF_DTYPE_I32 ||
      labels->numel != ids->numel)
    return false;
  b->B = ids->shape[0];
  b->S = ids->shape[1];
  b->ids = (const int32_t *)ids->data;
  const int32_t *lab = (const int32_t *)labels->data;
  b->targets.assign((size_t)(b->B * b->S), -1);
  for (int64_t r = 0; r < b->B; r++)
    for (int64_t s = 0; s + 1 < b->S; s++) {
      const int32_t y = lab[r * b->S + s + 1];
      b->targets[r * b->S + s] = y == -100 ? -1 : y;
    }
  b->aux_coef = meta_num(fx, "router_aux_loss_coef");
  return std::isfinite(b->aux_coef);
}

// The run's logits [B*S, V], loss, cross-entropy and aux loss against the
// fixture's (1e-5 relative).
inline void expect_logits_and_losses(const Result &r, const mf_safetensors *fx, int64_t n_logits) {
  const float *logits = f32(fx, "logits", n_logits);
  ASSERT_NE(logits, nullptr);
  EXPECT_LT(rel_err(r.logits.data(), logits, n_logits), 1e-5);
  const float *loss = f32(fx, "loss", 1), *ce = f32(fx, "ce_loss", 1), *aux = f32(fx, "aux_loss", 1);
  ASSERT_TRUE(loss && ce && aux);
  EXPECT_NEAR(r.loss, *loss, 1e-5 * std::fabs(*loss)) << "loss";
  EXPECT_NEAR(r.ce, *ce, 1e-5 * std::fabs(*ce)) << "cross-entropy";
  EXPECT_NEAR(r.aux, *aux, 1e-5 * std::fabs(*aux)) << "aux loss";
}

// A test over one fixture dir: its model's table and weights (the subclass's
// SetUp loads them), its fixture.safetensors and batch; run() is one step.
class FixtureTest : public ::testing::TestWithParam<std::string> {
 protected:
  void TearDown() override {
    mf_safetensors_close(fx_);
    mf_param_table_free(t_);
  }
  Result run(const std::vector<float> &w) const {
    return run_model(t_, w, bt_.ids, bt_.targets, bt_.B, bt_.S, bt_.aux_coef);
  }
  int64_t n_logits() const { return bt_.B * bt_.S * spec_.vocab; }
  std::string dir_;
  mf_model_spec spec_{};
  mf_param_table *t_ = nullptr;
  std::vector<float> w_;
  mf_safetensors *fx_ = nullptr;
  Batch bt_;
};

}  // namespace mf_parity

#endif  // MF_TESTS_MODEL_PARITY_UTIL_H
