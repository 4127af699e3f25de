// The planner's choice: it fits the budget, is never predicted slower than a
// baseline that fits, gets faster (or no slower) as the budget grows, says what
// the minimum budget is when it cannot fit, and respects pinned decisions.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "planner/plan.h"
#include "src/core/core.h"
#include "src/core/env.h"
#include "tests/planner/planner_test_util.h"
#include "src/model/params.h"
#include "src/model/program.h"

namespace {

using namespace mf_pt;

// A model's parameter table and step program, freed with the fixture.
struct Built {
  void build(const mf_model_spec &s, mf_program_opts po) {
    ASSERT_EQ(mf_param_table_build(&s, &t_), MF_OK) << mf_last_error();
    ASSERT_EQ(mf_program_build(t_, &po, &p_), MF_OK) << mf_last_error();
  }
  ~Built() {
    mf_program_free(p_);
    mf_param_table_free(t_);
  }
  mf_param_table *t_ = nullptr;
  mf_program *p_ = nullptr;
  mf_hwprofile hw_;
};

class Planner : public ::testing::TestWithParam<int>, protected Built {
 protected:
  void SetUp() override {
    build(make_shape(1).spec, {2, 32, 2, 0.01, 16, 0});  // a dense layer and a shared expert
    hw_ = small_profile(GetParam());
  }
};

TEST_P(Planner, FitsAndBeatsTheBaselinesThatFit) {
  mf_plan *least = nullptr, *resident = nullptr;
  ASSERT_EQ(mf_plan_baseline(p_, &hw_, MF_PLAN_LEAST_MEMORY, UINT64_MAX, &least), MF_OK) << mf_last_error();
  ASSERT_EQ(mf_plan_baseline(p_, &hw_, MF_PLAN_RESIDENT, UINT64_MAX, &resident), MF_OK);
  const uint64_t lo = least->s->arena_bytes, hi = resident->s->arena_bytes;
  ASSERT_LT(lo, hi);
  double prev = 1e30;
  for (int i = 0; i <= 4; i++) {
    const uint64_t budget = lo + (hi - lo) * (uint64_t)i / 4;
    mf_plan *c = nullptr;
    ASSERT_EQ(mf_plan_choose(p_, &hw_, budget, nullptr, nullptr, &c), MF_OK) << mf_last_error();
    EXPECT_LE(c->s->arena_bytes, budget);
    EXPECT_TRUE(c->fits);
    for (int k = MF_PLAN_RESIDENT; k < MF_PLAN_KIND_COUNT_; k++) {
      mf_plan *b = nullptr;
      ASSERT_EQ(mf_plan_baseline(p_, &hw_, (mf_plan_kind)k, budget, &b), MF_OK);
      if (b->fits) {
        EXPECT_LE(c->sim.step_seconds, b->sim.step_seconds) << mf_plan_kind_name((mf_plan_kind)k) << " at " << budget;
      }
      mf_plan_free(b);
    }
    EXPECT_LE(c->sim.step_seconds, prev * (1 + 1e-12)) << "more budget, slower plan at " << budget;
    prev = c->sim.step_seconds;
    mf_plan_free(c);
  }
  mf_plan_free(least);
  mf_plan_free(resident);
}

TEST_P(Planner, TooSmallABudgetNamesTheMinimum) {
  mf_plan *c = nullptr;
  EXPECT_EQ(mf_plan_choose(p_, &hw_, 4096, nullptr, nullptr, &c), MF_ERR_CONFIG);
  EXPECT_EQ(c, nullptr);
  std::string msg = mf_last_error();
  EXPECT_NE(msg.find("below the minimum"), std::string::npos) << msg;
  EXPECT_NE(msg.find("largest tensors"), std::string::npos) << msg;
}

TEST_P(Planner, PinnedDecisionsStay) {
  mf_decisions *fixed = nullptr;
  ASSERT_EQ(mf_decisions_create(p_, &fixed), MF_OK);
  mf_plan_pins pins{};
  ASSERT_EQ(mf_plan_pins_create(p_, &pins), MF_OK);
  // Pin every expert weight to streaming; give the planner all the memory it wants.
  int pinned = 0;
  for (int32_t i = 0; i < fixed->n_params; i++)
    if (t_->params[i].expert >= 0) fixed->param[i] = MF_PARAM_STREAM, pins.param[i] = 1, pinned++;
  ASSERT_GT(pinned, 0);
  mf_plan *c = nullptr;
  ASSERT_EQ(mf_plan_choose(p_, &hw_, UINT64_MAX, fixed, &pins, &c), MF_OK) << mf_last_error();
  for (int32_t i = 0; i < fixed->n_params; i++)
    if (pins.param[i]) {
      EXPECT_EQ(c->d->param[i], MF_PARAM_STREAM) << t_->params[i].name;
    }
  mf_plan_free(c);
  mf_plan_pins_free(&pins);
  mf_decisions_free(fixed);
}

// The optimizer on the device: the resident and checkpointing baselines put
// every parameter's there, the offloading ones and the least-memory plan keep
// it at home.
TEST_P(Planner, BaselinesPlaceTheOptimizer) {
  for (int k = MF_PLAN_RESIDENT; k < MF_PLAN_KIND_COUNT_; k++) {
    mf_plan *b = nullptr;
    ASSERT_EQ(mf_plan_baseline(p_, &hw_, (mf_plan_kind)k, UINT64_MAX, &b), MF_OK) << mf_last_error();
    const bool dev = k == MF_PLAN_RESIDENT || k == MF_PLAN_CHECKPOINT;
    int n = 0;
    for (int32_t i = 0; i < b->d->n_params; i++) n += b->d->optim[i] == MF_OPTIM_DEVICE;
    EXPECT_EQ(n, dev ? b->d->n_params : 0) << mf_plan_kind_name((mf_plan_kind)k);
    EXPECT_EQ(b->s->n_optim_device, n) << mf_plan_kind_name((mf_plan_kind)k);
    if (dev) {
      // Its arena holds every parameter's AdamW state for the whole step.
      uint64_t state = 0;
      for (int32_t i = 0; i < b->d->n_params; i++) state += p_->tensors[p_->state_tensor[i]].bytes;
      EXPECT_GE(b->s->persist_bytes, state);
      EXPECT_GE(b->s->arena_bytes, state);
      EXPECT_GT(b->sim.device_optimizer_seconds, 0);
      EXPECT_EQ(b->sim.optimizer_seconds, 0) << "nothing left for the host";
    } else {
      EXPECT_EQ(b->sim.device_optimizer_seconds, 0);
      EXPECT_GT(b->sim.optimizer_seconds, 0);
    }
    mf_plan_free(b);
  }
  // A forward-only program has no optimizer to place.
  mf_program_opts po = {2, 32, 2, 0.01, 16, 1};
  mf_program *ev = nullptr;
  ASSERT_EQ(mf_program_build(t_, &po, &ev), MF_OK) << mf_last_error();
  mf_plan *r = nullptr;
  ASSERT_EQ(mf_plan_baseline(ev, &hw_, MF_PLAN_RESIDENT, UINT64_MAX, &r), MF_OK) << mf_last_error();
  EXPECT_EQ(r->s->n_optim_device, 0);
  mf_plan_free(r);
  mf_program_free(ev);
}

// train.micro_batch_order auto: the planner plans both orders and keeps the
// one predicted faster; with one micro-batch or tied embeddings only
// micro-batch-major is considered.
TEST_P(Planner, ChoosesTheFasterMicroBatchOrder) {
  mf_plan_request rq{};
  rq.params = t_;
  rq.opts = {2, 32, 3, 0.01, 16, 0};
  rq.hw = &hw_;
  mf_plan *least = nullptr;
  ASSERT_EQ(mf_plan_baseline(p_, &hw_, MF_PLAN_LEAST_MEMORY, UINT64_MAX, &least), MF_OK);
  double fixed_order[2];
  for (uint64_t budget : {(uint64_t)least->s->arena_bytes * 3, (uint64_t)UINT64_MAX}) {
    rq.budget = budget;
    for (int o = 0; o < 2; o++) {
      rq.choose_order = 0;
      rq.opts.order = o ? MF_ORDER_LAYER_MAJOR : MF_ORDER_MICRO_MAJOR;
      mf_program *p = nullptr;
      mf_plan *all[MF_PLAN_KIND_COUNT_];
      ASSERT_EQ(mf_plan_for(&rq, &p, all), MF_OK) << mf_last_error();
      EXPECT_EQ(p->order, rq.opts.order);
      fixed_order[o] = all[MF_PLAN_CHOSEN]->sim.step_seconds;
      for (int k = 0; k < MF_PLAN_KIND_COUNT_; k++) mf_plan_free(all[k]);
      mf_program_free(p);
    }
    rq.choose_order = 1;
    rq.opts.order = MF_ORDER_MICRO_MAJOR;
    mf_program *p = nullptr;
    mf_plan *all[MF_PLAN_KIND_COUNT_];
    ASSERT_EQ(mf_plan_for(&rq, &p, all), MF_OK) << mf_last_error();
    const int expect_layer = fixed_order[1] < fixed_order[0];
    EXPECT_EQ(p->order, expect_layer ? MF_ORDER_LAYER_MAJOR : MF_ORDER_MICRO_MAJOR)
        << "micro " << fixed_order[0] << " s, layer " << fixed_order[1] << " s";
    EXPECT_EQ(all[MF_PLAN_CHOSEN]->sim.step_seconds, fixed_order[expect_layer]);
    EXPECT_EQ(all[MF_PLAN_CHOSEN]->prog, p);
    for (int k = 0; k < MF_PLAN_KIND_COUNT_; k++) {
      ASSERT_NE(all[k], nullptr) << k;
      EXPECT_EQ(all[k]->prog, p) << k;
      mf_plan_free(all[k]);
    }
    mf_program_free(p);
  }
  mf_plan_free(least);
  // One micro-batch, or tied embeddings: micro-batch-major only.
  for (int variant = 0; variant < 2; variant++) {
    mf_model_spec s = t_->spec;
    if (variant) s.tie_embeddings = 1;
    mf_param_table *t = nullptr;
    ASSERT_EQ(mf_param_table_build(&s, &t), MF_OK);
    rq.params = t;
    rq.opts.grad_accum = variant ? 3 : 1;
    rq.budget = UINT64_MAX;
    rq.choose_order = 1;
    mf_program *p = nullptr;
    mf_plan *all[MF_PLAN_KIND_COUNT_];
    ASSERT_EQ(mf_plan_for(&rq, &p, all), MF_OK) << mf_last_error();
    EXPECT_EQ(p->order, MF_ORDER_MICRO_MAJOR) << variant;
    for (int k = 0; k < MF_PLAN_KIND_COUNT_; k++) mf_plan_free(all[k]);
    mf_program_free(p);
    mf_param_table_free(t);
  }
  // A budget no order can meet: the error names the minimum.
  rq.params = t_;
  rq.opts.grad_accum = 3;
  rq.budget = 4096;
  mf_program *p = nullptr;
  mf_plan *all[MF_PLAN_KIND_COUNT_];
  EXPECT_EQ(mf_plan_for(&rq, &p, all), MF_ERR_CONFIG);
  EXPECT_EQ(p, nullptr);
  EXPECT_NE(std::string(mf_last_error()).find("below the minimum"), std::string::npos) << mf_last_error();
}

INSTANTIATE_TEST_SUITE_P(Profiles, Planner, ::testing::Values(0, 1),
                         [](const ::testing::TestParamInfo<int> &i) {
                           return std::string(i.param ? "overlapping_copies" : "serial");
                         });

}  // namespace

namespace {

// A GPU-like machine (the device's bandwidth far above the host's AdamW) and
// layers large enough that the device's per-kernel launch cost does not
// decide: the device optimizer pays.
class DeviceOptimizer : public ::testing::Test, protected Built {
 protected:
  void SetUp() override {
    mf_model_spec s = make_shape(1).spec;  // a dense layer and a shared expert
    s.hidden = 256, s.head_dim = 64, s.expert_ffn = 256, s.shared_ffn = 256, s.dense_ffn = 512, s.vocab = 512;
    build(s, {1, 32, 2, 0.01, 16, 0});
    hw_ = small_profile(1);
    hw_.elementwise_bandwidth = 2e12;
    hw_.gemm[0].flops = 5e12;
    hw_.gemm[1].flops = 5e13;
    hw_.attn[0].flops = 5e12;
    hw_.h2d_bandwidth = hw_.d2h_bandwidth = 2e10;
    hw_.host_adamw_params_per_s = 1e9;
  }
};

// Between the least memory and everything resident the planner puts some
// layers' optimizer on the device when that saves time — a GPU-like profile,
// where the host AdamW is slow beside the device — and the plan is still
// never slower than a baseline that fits; the least-memory plan keeps the host
// optimizer.
TEST_F(DeviceOptimizer, PutsSomeOnTheDevice) {
  mf_plan *least = nullptr, *resident = nullptr;
  ASSERT_EQ(mf_plan_baseline(p_, &hw_, MF_PLAN_LEAST_MEMORY, UINT64_MAX, &least), MF_OK) << mf_last_error();
  ASSERT_EQ(mf_plan_baseline(p_, &hw_, MF_PLAN_RESIDENT, UINT64_MAX, &resident), MF_OK);
  EXPECT_EQ(least->s->n_optim_device, 0);
  const uint64_t lo = least->s->arena_bytes, hi = resident->s->arena_bytes;
  for (int i = 1; i <= 4; i++) {
    const uint64_t budget = lo + (hi - lo) * (uint64_t)i / 4;
    mf_plan *all[MF_PLAN_KIND_COUNT_];
    ASSERT_EQ(mf_plan_choose_all(p_, &hw_, budget, nullptr, nullptr, all), MF_OK) << mf_last_error();
    const mf_plan *c = all[MF_PLAN_CHOSEN];
    EXPECT_TRUE(c->fits);
    EXPECT_EQ(all[MF_PLAN_LEAST_MEMORY]->s->n_optim_device, 0) << budget;
    EXPECT_GT(c->s->n_optim_device, 0) << "budget " << budget << " of " << hi;
    for (int32_t p = 0; p < c->d->n_params; p++)
      if (c->d->optim[p] == MF_OPTIM_DEVICE) {
        EXPECT_EQ(c->d->param[p], MF_PARAM_RESIDENT);
        EXPECT_EQ(c->d->grad[p], MF_GRAD_DEVICE);
      }
    for (int k = MF_PLAN_RESIDENT; k <= MF_PLAN_CHECKPOINT; k++)
      if (all[k]->fits) {
        EXPECT_LE(c->sim.step_seconds, all[k]->sim.step_seconds) << mf_plan_kind_name((mf_plan_kind)k);
      }
    // The host optimizer prices only what the host still updates.
    int64_t host = 0;
    for (int32_t p = 0; p < c->d->n_params; p++)
      if (c->d->optim[p] != MF_OPTIM_DEVICE) host += t_->params[p].numel;
    EXPECT_NEAR(c->sim.optimizer_seconds, mf_hw_adamw_seconds(&hw_, (double)host), 1e-12);
    for (int k = 0; k < MF_PLAN_KIND_COUNT_; k++) mf_plan_free(all[k]);
  }
  mf_plan_free(least);
  mf_plan_free(resident);
}

// Pinned optimizer placements stay: host where the planner would have put
// the device's, device where it would not; and a layer with a weight pinned to
// streaming gets no optimizer candidate (it would change the pin).
TEST_F(DeviceOptimizer, PinnedDecisionsStay) {
  mf_plan *free_choice = nullptr;
  ASSERT_EQ(mf_plan_choose(p_, &hw_, UINT64_MAX, nullptr, nullptr, &free_choice), MF_OK) << mf_last_error();
  int was_device = 0;
  for (int32_t i = 0; i < free_choice->d->n_params; i++)
    was_device += free_choice->d->optim[i] == MF_OPTIM_DEVICE;
  ASSERT_GT(was_device, 0) << "with all the memory it wants, some optimizer goes to the device";
  mf_decisions *fixed = nullptr;
  ASSERT_EQ(mf_decisions_create(p_, &fixed), MF_OK);
  mf_plan_pins pins{};
  ASSERT_EQ(mf_plan_pins_create(p_, &pins), MF_OK);
  // The first half of the device's parameters pinned home; the embedding pinned to the device.
  int pinned_home = 0, pinned_dev = -1, streamed_layer = -1;
  for (int32_t i = 0; i < fixed->n_params; i++) {
    if (free_choice->d->optim[i] == MF_OPTIM_DEVICE && pinned_home < (was_device + 1) / 2) {
      fixed->optim[i] = MF_OPTIM_HOST, pins.optim[i] = 1, pinned_home++;
    } else if (pinned_dev < 0 && t_->params[i].layer < 0 && !pins.optim[i]) {
      fixed->optim[i] = MF_OPTIM_DEVICE, pins.optim[i] = 1, pinned_dev = i;
    }
  }
  // The last layer's first weight pinned to streaming.
  const int32_t L = (int32_t)t_->spec.layers;
  for (int32_t i = 0; i < fixed->n_params && streamed_layer < 0; i++)
    if (t_->params[i].layer == L - 1 && !pins.optim[i])
      fixed->param[i] = MF_PARAM_STREAM, pins.param[i] = 1, streamed_layer = L - 1;
  ASSERT_GT(pinned_home, 0);
  ASSERT_GE(pinned_dev, 0);
  ASSERT_GE(streamed_layer, 0);
  mf_plan *c = nullptr;
  ASSERT_EQ(mf_plan_choose(p_, &hw_, UINT64_MAX, fixed, &pins, &c), MF_OK) << mf_last_error();
  int still_device = 0;
  for (int32_t i = 0; i < fixed->n_params; i++) {
    if (pins.optim[i]) {
      EXPECT_EQ(c->d->optim[i], fixed->optim[i]) << t_->params[i].name;
    }
    if (pins.param[i]) {
      EXPECT_EQ(c->d->param[i], fixed->param[i]) << t_->params[i].name;
    }
    if (t_->params[i].layer == streamed_layer) {
      EXPECT_EQ(c->d->optim[i], MF_OPTIM_HOST)
          << t_->params[i].name << ": its layer has a weight pinned to stream";
    }
    still_device += c->d->optim[i] == MF_OPTIM_DEVICE && !pins.optim[i];
  }
  EXPECT_EQ(c->d->param[pinned_dev], MF_PARAM_RESIDENT);
  EXPECT_EQ(c->d->grad[pinned_dev], MF_GRAD_DEVICE);
  EXPECT_EQ(c->s->optim_device[pinned_dev], 1);
  mf_plan_free(c);
  mf_plan_free(free_choice);
  mf_plan_pins_free(&pins);
  mf_decisions_free(fixed);
  (void)still_device;
}

}  // namespace

namespace {

// With measured routing the planner can keep a layer's hottest experts
// resident, the hot ones before the cold ones (the cold ones' copies rarely
// happen, so keeping them saves little); without routing only whole layers.
class PlannerRouting : public ::testing::TestWithParam<int> {};

// 0: 2 layers scored exactly; 1: 6 layers scored on the proxy.
TEST_P(PlannerRouting, HotExpertsGoResidentFirst) {
  const int proxy = GetParam();
  setenv("MF_PLAN_SCORING", proxy ? "proxy" : "exact", 1);
  mf_env_reload();
  mf_model_spec spec = make_shape(2).spec;  // many small experts, top-4
  spec.experts = 16;
  spec.layers = proxy ? 6 : 2;
  mf_param_table *t = nullptr;
  ASSERT_EQ(mf_param_table_build(&spec, &t), MF_OK) << mf_last_error();
  mf_hwprofile hw = small_profile(1);
  hw.h2d_bandwidth = hw.d2h_bandwidth = 2e8;  // copies dominate
  // Experts 0..3 take every token, the rest none.
  std::vector<double> share((size_t)(spec.layers * spec.experts), 0.0);
  for (int64_t l = 0; l < spec.layers; l++)
    for (int e = 0; e < 4; e++) share[(size_t)(l * spec.experts + e)] = 0.25;
  mf_plan_request rq{};
  rq.params = t;
  rq.opts = {1, 8, 2, 0.01, 16, 0, MF_ORDER_MICRO_MAJOR, MF_DTYPE_F32};
  rq.hw = &hw;
  mf_program *p0 = nullptr;
  ASSERT_EQ(mf_program_build(t, &rq.opts, &p0), MF_OK);
  // Budgets between the least memory and every weight and gradient on the
  // device with the optimizer at home (the weights are what this is about).
  mf_plan *least = nullptr, *resident = nullptr;
  mf_decisions *all_res = nullptr;
  ASSERT_EQ(mf_decisions_create(p0, &all_res), MF_OK);
  ASSERT_EQ(mf_plan_baseline(p0, &hw, MF_PLAN_LEAST_MEMORY, UINT64_MAX, &least), MF_OK);
  ASSERT_EQ(mf_plan_evaluate(p0, &hw, all_res, UINT64_MAX, MF_PLAN_RESIDENT, &resident), MF_OK);
  mf_decisions_free(all_res);
  const uint64_t lo = least->s->arena_bytes, hi = resident->s->arena_bytes;
  mf_plan_free(least);
  mf_plan_free(resident);
  mf_program_free(p0);
  int saw_hot_only = 0;
  for (int step = 1; step <= 4; step++) {
    rq.budget = lo + (hi - lo) * (uint64_t)step / 8;
    double secs[2] = {0, 0};
    for (int routed = 0; routed < 2; routed++) {
      rq.expert_share = routed ? share.data() : nullptr;
      mf_program *p = nullptr;
      mf_plan *all[MF_PLAN_KIND_COUNT_];
      ASSERT_EQ(mf_plan_for(&rq, &p, all), MF_OK) << mf_last_error();
      const mf_plan *c = all[MF_PLAN_CHOSEN];
      EXPECT_LE(c->s->arena_bytes, rq.budget);
      secs[routed] = c->sim.step_seconds;
      std::vector<int> hot((size_t)spec.layers, 0), cold((size_t)spec.layers, 0);
      int partial = 0;
      for (int64_t i = 0; i < t->n; i++) {
        const mf_param &x = t->params[i];
        if (x.expert < 0 || c->d->param[i] != MF_PARAM_RESIDENT) continue;
        (x.expert < 4 ? hot : cold)[(size_t)x.layer]++;
      }
      int hot_n = 0, cold_n = 0;
      for (int64_t l = 0; l < spec.layers; l++) {
        hot_n += hot[(size_t)l];
        cold_n += cold[(size_t)l];
        if (hot[(size_t)l] + cold[(size_t)l] > 0 && hot[(size_t)l] + cold[(size_t)l] < 3 * 16) partial++;
        if (routed && cold[(size_t)l] > 0) {
          EXPECT_EQ(hot[(size_t)l], 3 * 4) << "layer " << l << ": a cold expert kept before every hot one";
        }
      }
      if (!routed) {
        EXPECT_EQ(partial, 0) << "without routing a layer's experts are kept all or none";
      } else if (hot_n > 0 && cold_n == 0) {
        saw_hot_only++;
      }
      for (int k = 0; k < MF_PLAN_KIND_COUNT_; k++) mf_plan_free(all[k]);
      mf_program_free(p);
    }
    EXPECT_LE(secs[1], secs[0] * (1 + 1e-12)) << "routing at budget step " << step;
  }
  EXPECT_GT(saw_hot_only, 0) << "at some budget only hot experts are kept";
  mf_param_table_free(t);
  unsetenv("MF_PLAN_SCORING");
  mf_env_reload();
}

INSTANTIATE_TEST_SUITE_P(Scoring, PlannerRouting, ::testing::Values(0, 1),
                         [](const ::testing::TestParamInfo<int> &i) { return std::string(i.param ? "proxy" : "exact"); });

}  // namespace
