// Parity with transformers (tests/fixtures/NOTES.md; fixtures written by tools/make_fixtures.py
// with PyTorch and a pinned transformers 4.57): for each tiny model, one batch
// through the cpu backend in fp32 must give the reference logits, loss and aux
// loss (1e-5 relative), every parameter's gradient (1e-4 relative in norm) and
// the parameters after one AdamW step (1e-6).
#include <dirent.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "src/core/core.h"
#include "src/exec/exec.h"
#include "src/io/safetensors.h"
#include "src/model/hf_config.h"
#include "src/model/params.h"
#include "src/model/program.h"
#include "src/optim/optim.h"
#include "tests/model/parity_util.h"

namespace {

using namespace mf_parity;

const char kFixtures[] = "tests/fixtures";

std::vector<std::string> fixture_names() {
  std::vector<std::string> out;
  DIR *d = opendir(kFixtures);
  if (!d) return out;
  while (dirent *e = readdir(d)) {
    std::string n = e->d_name;
    if (n[0] == '.') continue;
    std::string f = std::string(kFixtures) + "/" + n + "/fixture.safetensors";
    if (access(f.c_str(), R_OK) == 0) out.push_back(n);
  }
  closedir(d);
  std::sort(out.begin(), out.end());
  return out;
}

class Parity : public FixtureTest {
 protected:
  void SetUp() override {
    dir_ = std::string(kFixtures) + "/" + GetParam();
    ASSERT_EQ(mf_hf_config_load(dir_.c_str(), &spec_), MF_OK) << mf_last_error();
    ASSERT_EQ(mf_param_table_build(&spec_, &t_), MF_OK) << mf_last_error();
    w_.resize((size_t)t_->total_numel);
    ASSERT_EQ(mf_params_load(t_, (dir_ + "/model.safetensors").c_str(), w_.data()), MF_OK) << mf_last_error();
    ASSERT_EQ(mf_safetensors_open((dir_ + "/fixture.safetensors").c_str(), &fx_), MF_OK) << mf_last_error();
    ASSERT_TRUE(batch_of(fx_, &bt_)) << "input_ids, labels [B, S] I32 and router_aux_loss_coef";
  }
};

TEST_P(Parity, LogitsLossAndAux) {
  Result r = run(w_);
  expect_logits_and_losses(r, fx_, n_logits());
}

TEST_P(Parity, EveryGradient) {
  Result r = run(w_);
  const char *ng = mf_safetensors_metadata(fx_, "no_grad");
  std::string no_grad = ng ? ng : "[]";
  int checked = 0;
  for (int64_t i = 0; i < t_->n; i++) {
    const mf_param &p = t_->params[i];
    std::vector<float> buf;
    const float *ref = param_ref(fx_, "grad.", t_, i, &buf);
    if (p.frozen) {
      // a buffer of the checkpoint (glm4_moe's e_score_correction_bias): no gradient on either side
      EXPECT_EQ(ref, nullptr) << p.name << " is a buffer, yet the reference has its gradient";
      EXPECT_EQ(p.toff, -1) << p.name << " has a place among the gradients";
      continue;
    }
    const float *got = r.grads.data() + p.toff;  // the gradients are the trained parameters' (toff)
    if (!ref) {
      // transformers left .grad None: an expert that got no token. moefit must agree.
      EXPECT_NE(no_grad.find(std::string("\"") + p.name + "\""), std::string::npos)
          << p.name << " has no reference";
      ASSERT_GE(p.expert, 0) << p.name;
      EXPECT_EQ(r.expert_tokens[p.layer * spec_.experts + p.expert], 0) << p.name;
      for (int64_t j = 0; j < p.numel; j++) ASSERT_EQ(got[j], 0.0f) << p.name;
      continue;
    }
    EXPECT_LT(rel_err(got, ref, p.numel), 1e-4) << p.name;
    checked++;
  }
  EXPECT_GT(checked, 0);
}

mf_adamw_hparams fixture_hparams(const mf_safetensors *fx) {
  return {meta_num(fx, "lr"), meta_num(fx, "beta1"), meta_num(fx, "beta2"), meta_num(fx, "eps"),
          meta_num(fx, "weight_decay")};
}

// The optimizer alone: the reference gradients through moefit's AdamW give the
// reference parameters. A parameter without a gradient (.grad None) is skipped.
TEST_P(Parity, OneAdamWStepFromReferenceGradients) {
  mf_adamw_hparams h = fixture_hparams(fx_);
  ASSERT_TRUE(std::isfinite(h.lr) && std::isfinite(h.beta1) && std::isfinite(h.weight_decay));
  double worst = 0;
  std::string worst_name;
  for (int64_t i = 0; i < t_->n; i++) {
    const mf_param &p = t_->params[i];
    std::vector<float> w(w_.begin() + p.offset, w_.begin() + p.offset + p.numel);
    std::vector<float> m(w.size(), 0.0f), v(w.size(), 0.0f);
    std::vector<float> gbuf, rbuf;
    const float *g = param_ref(fx_, "grad.", t_, i, &gbuf);
    if (g) {
      ASSERT_EQ(mf_adamw_update(&h, 1, w.data(), g, m.data(), v.data(), w.size(), nullptr, nullptr), MF_OK);
    }
    const float *ref = param_ref(fx_, "after.", t_, i, &rbuf);
    ASSERT_NE(ref, nullptr) << p.name;
    for (int64_t j = 0; j < p.numel; j++) {
      double d = std::fabs((double)w[j] - (double)ref[j]);
      if (d > worst) worst = d, worst_name = p.name;
    }
  }
  EXPECT_LE(worst, 1e-6) << "largest difference in " << worst_name;
}

// End to end: moefit's own gradients, then AdamW. A first Adam step moves a
// weight by lr * r(g) with r(g) = g / (|g| + eps) (after the decay), so where |g|
// is near eps, fp32 rounding noise in g (well inside the gradient check) moves
// the update: each element may differ by 1e-6 plus lr * |r(g_moefit) - r(g_torch)|,
// the part the two gradients explain, and by nothing more.
TEST_P(Parity, OneAdamWStepEndToEnd) {
  Result r = run(w_);
  mf_adamw_hparams h = fixture_hparams(fx_);
  std::vector<float> w = w_;
  std::vector<float> m(w.size(), 0.0f), v(w.size(), 0.0f);
  const int idle_has_grad = mf_family_idle_expert_has_grad(spec_.family);
  double worst = 0;
  std::string worst_name;
  for (int64_t i = 0; i < t_->n; i++) {
    const mf_param &p = t_->params[i];
    bool idle = p.expert >= 0 && r.expert_tokens[p.layer * spec_.experts + p.expert] == 0;
    if (!p.frozen && (!idle || idle_has_grad)) {
      ASSERT_EQ(mf_adamw_update(&h, 1, w.data() + p.offset, r.grads.data() + p.toff, m.data() + p.offset,
                                v.data() + p.offset, (size_t)p.numel, nullptr, nullptr),
                MF_OK);
    }
    std::vector<float> rbuf, gbuf;
    const float *ref = param_ref(fx_, "after.", t_, i, &rbuf);
    const float *gref = param_ref(fx_, "grad.", t_, i, &gbuf);
    ASSERT_NE(ref, nullptr) << p.name;
    for (int64_t j = 0; j < p.numel; j++) {
      double d = std::fabs((double)w[p.offset + j] - (double)ref[j]);
      double tol = 1e-6;
      if (gref) {
        auto ratio = [&](double g) { return g / (std::fabs(g) + h.eps); };
        tol += h.lr * std::fabs(ratio(r.grads[p.toff + j]) - ratio(gref[j]));
      }
      if (d / tol > worst) {
        worst = d / tol;
        char buf[256];
        snprintf(buf, sizeof buf, "%s[%lld]: moefit %.9g, torch %.9g; gradient moefit %.9g, torch %.9g",
                 p.name, (long long)j, w[p.offset + j], ref[j], p.frozen ? 0.0f : r.grads[p.toff + j],
                 gref ? gref[j] : 0.0f);
        worst_name = buf;
      }
    }
  }
  EXPECT_LE(worst, 1.0) << "largest difference (in tolerances) at " << worst_name;
}

// The parity checks can fail: one weight moved by 1e-3 breaks the logits check.
TEST_P(Parity, APerturbedWeightIsCaught) {
  std::vector<float> w = w_;
  int32_t q = mf_param_index(t_, MF_P_Q, 0, -1);
  if (q < 0) q = mf_param_index(t_, MF_P_Q_B, 0, -1);  // deepseek_v3 with a low-rank q
  ASSERT_GE(q, 0);
  const mf_param &p = t_->params[q];
  w[p.offset + 3] += 1e-3f;
  Result r = run(w);
  const float *logits = f32(fx_, "logits", n_logits());
  ASSERT_NE(logits, nullptr);
  EXPECT_GT(rel_err(r.logits.data(), logits, n_logits()), 1e-5);
}

// The router's correction bias decides the choice (glm4_moe): with it zeroed
// the routing, and so the logits, are no longer the reference's.
TEST_P(Parity, TheRouterBiasIsUsed) {
  int64_t biases = 0;
  std::vector<float> w = w_;
  for (int64_t i = 0; i < t_->n; i++) {
    const mf_param &p = t_->params[i];
    if (p.role != MF_P_ROUTER_BIAS) continue;
    EXPECT_TRUE(p.frozen) << p.name;
    for (int64_t j = 0; j < p.numel; j++) w[p.offset + j] = 0.0f;
    biases++;
  }
  if (biases == 0) GTEST_SKIP() << spec_.family << ": no router bias";
  Result r = run(w);
  const float *logits = f32(fx_, "logits", n_logits());
  ASSERT_NE(logits, nullptr);
  EXPECT_GT(rel_err(r.logits.data(), logits, n_logits()), 1e-5);
}

// gpt-oss's own pieces decide the logits: with the sinks, the expert biases or
// the router bias zeroed, or the sliding window dropped, they are no longer the
// reference's (the fixtures' sinks and biases are drawn like the weights).
TEST_P(Parity, GptOssPiecesAreUsed) {
  if (spec_.family != MF_FAMILY_GPT_OSS) GTEST_SKIP() << "not gpt_oss";
  const float *logits = f32(fx_, "logits", n_logits());
  ASSERT_NE(logits, nullptr);
  const mf_param_role roles[] = {
      MF_P_SINKS, MF_P_EXPERT_GATE_BIAS, MF_P_EXPERT_UP_BIAS, MF_P_EXPERT_DOWN_BIAS, MF_P_ROUTER_LINEAR_BIAS,
      MF_P_O_BIAS};
  for (mf_param_role role : roles) {
    std::vector<float> w = w_;
    int zeroed = 0;
    for (int64_t i = 0; i < t_->n; i++) {
      const mf_param &p = t_->params[i];
      if (p.role != role) continue;
      std::fill(w.begin() + p.offset, w.begin() + p.offset + p.numel, 0.0f);
      zeroed++;
    }
    ASSERT_EQ(zeroed, spec_.layers) << "role " << role;
    Result r = run(w);
    EXPECT_GT(rel_err(r.logits.data(), logits, n_logits()), 1e-5) << "role " << role << " zeroed";
  }
  int64_t sliding = 0;
  for (int64_t l = 0; l < spec_.layers; l++) sliding += spec_.sliding_layers[l];
  if (sliding == 0) return;
  mf_param_table *t = t_;
  const mf_model_spec keep = t->spec;
  for (int64_t l = 0; l < spec_.layers; l++) t->spec.sliding_layers[l] = 0;
  Result r = run(w_);
  t->spec = keep;
  EXPECT_GT(rel_err(r.logits.data(), logits, n_logits()), 1e-5) << "without the sliding window";
}

INSTANTIATE_TEST_SUITE_P(Fixtures, Parity, ::testing::ValuesIn(fixture_names()),
                         [](const ::testing::TestParamInfo<std::string> &i) { return i.param; });

TEST(ParityFixtures, ArePresent) {
  EXPECT_GE(fixture_names().size(), 4u) << "tests/fixtures has too few fixtures";
}

}  // namespace
