// Plan invariance on the cpu backend (checking mode on): streamed weights,
// streamed gradients, offloaded and recomputed activations, in any mix, give
// bit-identical losses and gradients to the all-resident schedule; the
// executor's measured peak equals the schedule's; and the decisions cut the
// device memory they should.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "planner/schedule.h"
#include "src/core/core.h"
#include "tests/planner/planner_test_util.h"
#include "src/exec/exec.h"
#include "src/model/params.h"
#include "src/model/program.h"

namespace {

using namespace mf_pt;

struct Out {
  double loss = 0, aux = 0;
  std::vector<float> grads;
  size_t peak = 0, sched_peak = 0, arena = 0;
  uint64_t h2d = 0, d2h = 0;
  uint64_t skipped = 0;  // copies of idle experts' weights and gradients the step skipped
};

class Invariance : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    sh_ = make_shape(GetParam());
    ASSERT_EQ(mf_param_table_build(&sh_.spec, &t_), MF_OK) << mf_last_error();
    w_.resize((size_t)t_->total_numel);
    mf_params_init_random(t_, 11, 0.2f, w_.data());
    // Enough tokens that activations, not weights, dominate the device memory.
    mf_program_opts po = {2, 48, 2, 0.01, 16, 0};
    ASSERT_EQ(mf_program_build(t_, &po, &p_), MF_OK) << mf_last_error();
    std::mt19937 rng(5);
    for (int m = 0; m < 2; m++) {
      ids_[m].resize(96);
      tg_[m].resize(96);
      for (auto &v : ids_[m]) v = (int32_t)(rng() % sh_.spec.vocab);
      for (auto &v : tg_[m]) v = rng() % 6 == 0 ? -1 : (int32_t)(rng() % sh_.spec.vocab);
    }
  }
  void TearDown() override {
    mf_program_free(p_);
    mf_param_table_free(t_);
  }
  Out run(const mf_decisions *d) {
    Out o;
    mf_schedule *s = nullptr;
    EXPECT_EQ(mf_schedule_build(p_, d, &s), MF_OK) << mf_last_error();
    if (!s) return o;
    mf_cpu_backend_opts bo = {nullptr, 0, 1, nullptr};
    mf_backend *b = nullptr;
    EXPECT_EQ(mf_backend_cpu_create(&bo, &b), MF_OK);
    mf_exec *x = nullptr;
    EXPECT_EQ(mf_exec_create_scheduled(p_, s, b, &x), MF_OK) << mf_last_error();
    const int32_t *ip[2] = {ids_[0].data(), ids_[1].data()}, *tp[2] = {tg_[0].data(), tg_[1].data()};
    o.grads.assign(w_.size(), 0.0f);
    mf_step_result r;
    EXPECT_EQ(mf_exec_step(x, w_.data(), ip, tp, o.grads.data(), &r), MF_OK) << mf_last_error();
    o.loss = r.loss;
    o.aux = r.aux_loss;
    o.peak = mf_exec_peak_live_bytes(x);
    o.sched_peak = s->peak_live_bytes;
    o.arena = s->arena_bytes;
    mf_exec_traffic(x, &o.h2d, &o.d2h);
    // What the step moved plus what routing let it skip (experts no token
    // reached) is what the schedule has.
    mf_exec_stats z;
    mf_exec_stats_get(x, &z);
    EXPECT_EQ(o.h2d + z.h2d_skipped_bytes, s->h2d_bytes);
    EXPECT_EQ(o.d2h + z.d2h_skipped_bytes, s->d2h_bytes);
    o.skipped = z.h2d_skipped_bytes + z.d2h_skipped_bytes;
    mf_exec_free(x);
    mf_backend_free(b);
    mf_schedule_free(s);
    return o;
  }
  mf_decisions *fresh() {
    mf_decisions *d = nullptr;
    EXPECT_EQ(mf_decisions_create(p_, &d), MF_OK);
    return d;
  }
  void expect_same(const Out &a, const Out &b, const std::string &what) {
    EXPECT_EQ(a.loss, b.loss) << what;
    EXPECT_EQ(a.aux, b.aux) << what;
    ASSERT_EQ(a.grads.size(), b.grads.size());
    EXPECT_EQ(0, memcmp(a.grads.data(), b.grads.data(), a.grads.size() * sizeof(float))) << what << ": gradients differ";
    EXPECT_EQ(b.peak, b.sched_peak) << what << ": executor peak vs schedule peak";
  }
  Shape sh_;
  mf_param_table *t_ = nullptr;
  std::vector<float> w_;
  mf_program *p_ = nullptr;
  std::vector<int32_t> ids_[2], tg_[2];
};

TEST_P(Invariance, EveryDecisionGivesTheSameBits) {
  mf_decisions *d = fresh();
  Out base = run(d);
  ASSERT_TRUE(std::isfinite(base.loss));
  EXPECT_EQ(base.peak, base.sched_peak);

  // Stream every weight.
  for (int32_t i = 0; i < d->n_params; i++) d->param[i] = MF_PARAM_STREAM;
  Out stream = run(d);
  expect_same(base, stream, "weights streamed");
  EXPECT_LT(stream.peak, base.peak);
  EXPECT_GT(stream.h2d, base.h2d);

  // And gradients streamed home per micro-batch (added up on the host).
  for (int32_t i = 0; i < d->n_params; i++) d->grad[i] = MF_GRAD_STREAM;
  Out gstream = run(d);
  expect_same(base, gstream, "weights and gradients streamed");
  EXPECT_LT(gstream.peak, stream.peak);

  // Offload every activation the backward needs.
  mf_decisions *o = fresh();
  int offloadable = 0, recomputable = 0;
  for (int32_t t = 0; t < p_->n_tensors; t++) {
    offloadable += mf_schedule_can_offload(p_, t);
    recomputable += mf_schedule_can_recompute(p_, t);
    if (mf_schedule_can_offload(p_, t)) o->act[t] = MF_ACT_OFFLOAD;
  }
  EXPECT_GT(offloadable, 10);
  EXPECT_GT(recomputable, 10);
  Out off = run(o);
  expect_same(base, off, "activations offloaded");
  EXPECT_LE(off.peak, base.peak);
  // With weights and gradients streamed, activations dominate: offloading cuts the peak.
  for (int32_t i = 0; i < o->n_params; i++) o->param[i] = MF_PARAM_STREAM, o->grad[i] = MF_GRAD_STREAM;
  Out off_all = run(o);
  expect_same(base, off_all, "everything streamed and offloaded");
  EXPECT_LT(off_all.peak, gstream.peak);

  // Recompute every activation that can be.
  mf_decisions *rc = fresh();
  for (int32_t t = 0; t < p_->n_tensors; t++)
    if (mf_schedule_can_recompute(p_, t)) rc->act[t] = MF_ACT_RECOMPUTE;
  Out rec = run(rc);
  expect_same(base, rec, "activations recomputed");
  EXPECT_LE(rec.peak, base.peak);
  for (int32_t i = 0; i < rc->n_params; i++) rc->param[i] = MF_PARAM_STREAM, rc->grad[i] = MF_GRAD_STREAM;
  Out rec_all = run(rc);
  expect_same(base, rec_all, "everything streamed and recomputed");
  EXPECT_LE(rec_all.peak, gstream.peak);  // lower unless the peak sits where everything is needed anyway
  EXPECT_EQ(rec_all.d2h, gstream.d2h);  // recompute sends nothing home
  EXPECT_GT(off_all.d2h, gstream.d2h);  // offload does

  // Random mixes of everything.
  std::mt19937 rng(17);
  for (int trial = 0; trial < 6; trial++) {
    mf_decisions *mx = fresh();
    for (int32_t i = 0; i < mx->n_params; i++) {
      mx->param[i] = rng() % 2;
      mx->grad[i] = rng() % 2;
    }
    for (int32_t t = 0; t < p_->n_tensors; t++) {
      int r = (int)(rng() % 3);
      if (r == 1 && mf_schedule_can_offload(p_, t)) mx->act[t] = MF_ACT_OFFLOAD;
      if (r == 2 && mf_schedule_can_recompute(p_, t)) mx->act[t] = MF_ACT_RECOMPUTE;
    }
    Out m = run(mx);
    expect_same(base, m, "mix " + std::to_string(trial));
    mf_decisions_free(mx);
  }
  mf_decisions_free(d);
  mf_decisions_free(o);
  mf_decisions_free(rc);
}

// Few tokens over many experts: most experts get none. Streamed, their
// weights are not uploaded and their (zero) gradients not copied home once
// the routing is known — and the bits are those of everything resident.
TEST(IdleExperts, MoveNothingAndChangeNothing) {
  mf_model_spec spec = make_shape(2).spec;
  spec.experts = 64;
  mf_param_table *t = nullptr;
  ASSERT_EQ(mf_param_table_build(&spec, &t), MF_OK) << mf_last_error();
  std::vector<float> w((size_t)t->total_numel);
  mf_params_init_random(t, 3, 0.02f, w.data());
  for (mf_program_order order : {MF_ORDER_MICRO_MAJOR, MF_ORDER_LAYER_MAJOR}) {
    mf_program_opts po = {1, 4, 2, 0.01, 16, 0, order, MF_DTYPE_F32};  // 4 tokens x top-4: at most 16 of 64
    mf_program *p = nullptr;
    ASSERT_EQ(mf_program_build(t, &po, &p), MF_OK) << mf_last_error();
    std::vector<int32_t> ids[2], tg[2];
    for (int m = 0; m < 2; m++) ids[m] = {1, 7, 3, 9 + m}, tg[m] = {7, 3, 9, -1};
    const int32_t *ip[2] = {ids[0].data(), ids[1].data()}, *tp[2] = {tg[0].data(), tg[1].data()};
    std::vector<float> g[2];
    uint64_t skipped = 0;
    for (int streamed = 0; streamed < 2; streamed++) {
      mf_decisions *d = nullptr;
      ASSERT_EQ(mf_decisions_create(p, &d), MF_OK);
      if (streamed)
        for (int32_t i = 0; i < d->n_params; i++) d->param[i] = MF_PARAM_STREAM, d->grad[i] = MF_GRAD_STREAM;
      mf_schedule *s = nullptr;
      ASSERT_EQ(mf_schedule_build(p, d, &s), MF_OK) << mf_last_error();
      mf_cpu_backend_opts bo = {nullptr, 0, 1, nullptr};
      mf_backend *b = nullptr;
      ASSERT_EQ(mf_backend_cpu_create(&bo, &b), MF_OK);
      mf_exec *x = nullptr;
      ASSERT_EQ(mf_exec_create_scheduled(p, s, b, &x), MF_OK) << mf_last_error();
      g[streamed].assign(w.size(), 1.0f);
      mf_step_result r;
      ASSERT_EQ(mf_exec_step(x, w.data(), ip, tp, g[streamed].data(), &r), MF_OK) << mf_last_error();
      mf_exec_stats z;
      mf_exec_stats_get(x, &z);
      EXPECT_EQ(z.h2d_bytes + z.h2d_skipped_bytes, s->h2d_bytes);
      EXPECT_EQ(z.d2h_bytes + z.d2h_skipped_bytes, s->d2h_bytes);
      if (streamed) skipped = z.h2d_skipped_bytes + z.d2h_skipped_bytes;
      mf_exec_free(x);
      mf_backend_free(b);
      mf_schedule_free(s);
      mf_decisions_free(d);
    }
    EXPECT_GT(skipped, 0u) << mf_program_order_name(order);
    EXPECT_EQ(0, memcmp(g[0].data(), g[1].data(), g[0].size() * sizeof(float)))
        << mf_program_order_name(order) << ": gradients differ";
    mf_program_free(p);
  }
  mf_param_table_free(t);
}

TEST_P(Invariance, ImpossibleDecisionsAreErrors) {
  mf_decisions *d = fresh();
  // A parameter is not an activation to offload.
  d->act[p_->param_tensor[0]] = MF_ACT_OFFLOAD;
  mf_schedule *s = nullptr;
  EXPECT_EQ(mf_schedule_build(p_, d, &s), MF_ERR_CONFIG);
  EXPECT_NE(std::string(mf_last_error()).find(p_->tensors[p_->param_tensor[0]].name), std::string::npos);
  mf_decisions_free(d);
}

// A schedule that releases a slot before its last reader is caught by the
// checking mode: the kernel that reads it fails with a residency error.
TEST_P(Invariance, CheckingCatchesASlotReleasedTooEarly) {
  mf_decisions *d = fresh();
  mf_schedule *s = nullptr;
  ASSERT_EQ(mf_schedule_build(p_, d, &s), MF_OK) << mf_last_error();
  int32_t victim = -1;
  for (int32_t i = 0; i < s->n_slots; i++)
    if (strstr(p_->tensors[s->slots[i].tensor].name, "layers.1.self_attn.attn_out") &&
        !strstr(p_->tensors[s->slots[i].tensor].name, "grad"))
      victim = i;
  ASSERT_GE(victim, 0);
  s->slots[victim].last = s->slots[victim].first;  // released right after the attention writes it
  mf_cpu_backend_opts bo = {nullptr, 0, 1, nullptr};
  mf_backend *b = nullptr;
  ASSERT_EQ(mf_backend_cpu_create(&bo, &b), MF_OK);
  mf_exec *x = nullptr;
  ASSERT_EQ(mf_exec_create_scheduled(p_, s, b, &x), MF_OK);
  const int32_t *ip[2] = {ids_[0].data(), ids_[1].data()}, *tp[2] = {tg_[0].data(), tg_[1].data()};
  std::vector<float> grads(w_.size());
  mf_step_result r;
  EXPECT_EQ(mf_exec_step(x, w_.data(), ip, tp, grads.data(), &r), MF_ERR_INTERNAL);
  EXPECT_NE(std::string(mf_last_error()).find("residency check"), std::string::npos) << mf_last_error();
  mf_exec_free(x);
  mf_backend_free(b);
  mf_schedule_free(s);
  mf_decisions_free(d);
}

INSTANTIATE_TEST_SUITE_P(Shapes, Invariance, ::testing::Values(0, 1, 2),
                         [](const ::testing::TestParamInfo<int> &i) { return std::string(make_shape(i.param).name); });

// ------------------------------------------------ micro-batch order

// Bytes the schedule uploads into parameter slots.
uint64_t param_h2d_bytes(const mf_program *p, const mf_schedule *s) {
  uint64_t n = 0;
  for (int32_t i = 0; i < s->n_instr; i++)
    if (s->instr[i].kind == MF_I_H2D && p->tensors[s->slots[s->instr[i].slot].tensor].kind == MF_T_PARAM)
      n += p->tensors[s->slots[s->instr[i].slot].tensor].bytes;
  return n;
}

class MicroBatchOrder : public ::testing::TestWithParam<int> {
 protected:
  static constexpr int64_t kG = 3;
  void SetUp() override {
    sh_ = make_shape(GetParam());
    ASSERT_EQ(mf_param_table_build(&sh_.spec, &t_), MF_OK) << mf_last_error();
    mf_program_opts mo = {2, 48, kG, 0.01, 16, 0, MF_ORDER_MICRO_MAJOR, MF_DTYPE_F32};
    mf_program_opts lo = {2, 48, kG, 0.01, 16, 0, MF_ORDER_LAYER_MAJOR, MF_DTYPE_F32};
    ASSERT_EQ(mf_program_build(t_, &mo, &mm_), MF_OK) << mf_last_error();
    ASSERT_EQ(mf_program_build(t_, &lo, &lm_), MF_OK) << mf_last_error();
  }
  void TearDown() override {
    mf_program_free(mm_);
    mf_program_free(lm_);
    mf_param_table_free(t_);
  }
  Shape sh_;
  mf_param_table *t_ = nullptr;
  mf_program *mm_ = nullptr, *lm_ = nullptr;
};

// Every weight streamed, gradients on the device, activations kept. A streamed
// weight is uploaded once per stretch of consecutive ops of one layer and one
// direction that read it. Layer-major runs each layer's forward, and each
// layer's backward, of all micro-batches as one stretch: a weight is uploaded
// once for each direction whose ops read it — a layer's matrices and norms
// twice (the backward reads W for dx, w for the norm's gradient), a bias once
// (only the forward reads it), the final norm twice, the embedding table once
// (its backward reads only ids and the gradient), lm_head once (only the
// loss part's cross-entropy reads it, one stretch for all micro-batches).
// Micro-batch-major uploads the same per micro-batch: G times as much.
TEST_P(MicroBatchOrder, StreamedWeightsLoadOncePerDirectionInLayerMajor) {
  // Directions that read each parameter, from the program's operands (1 forward or loss, 2 backward).
  std::vector<int> dirs(t_->n, 0);
  for (int32_t k = 0; k < lm_->n_ops; k++) {
    const mf_pop &o = lm_->ops[k];
    std::vector<int32_t> ids(o.t, o.t + MF_KBUF_MAX);
    if (o.experts_at >= 0) ids.insert(ids.end(), lm_->id_pool + o.experts_at, lm_->id_pool + o.experts_at + lm_->spec.experts);
    for (int32_t t : ids)
      if (t >= 0 && lm_->tensors[t].kind == MF_T_PARAM) dirs[lm_->tensors[t].param] |= o.phase == MF_PHASE_BWD ? 2 : 1;
  }
  uint64_t want = 0, all = 0;
  int once = 0;
  for (int64_t i = 0; i < t_->n; i++) {
    const uint64_t bytes = lm_->tensors[lm_->param_tensor[i]].bytes;
    const int n = (dirs[i] & 1) + (dirs[i] >> 1 & 1);
    EXPECT_GE(n, 1) << t_->params[i].name;
    once += n == 1;
    want += (uint64_t)n * bytes;
    all += bytes;
  }
  EXPECT_GE(once, 2);  // the embedding table and lm_head at least
  EXPECT_LT(want, 2 * all);
  mf_decisions *d = nullptr;
  ASSERT_EQ(mf_decisions_create(lm_, &d), MF_OK);
  for (int32_t i = 0; i < d->n_params; i++) d->param[i] = MF_PARAM_STREAM;
  mf_schedule *sl = nullptr, *sm = nullptr;
  ASSERT_EQ(mf_schedule_build(lm_, d, &sl), MF_OK) << mf_last_error();
  ASSERT_EQ(mf_schedule_build(mm_, d, &sm), MF_OK) << mf_last_error();
  EXPECT_EQ(param_h2d_bytes(lm_, sl), want);
  EXPECT_EQ(param_h2d_bytes(mm_, sm), (uint64_t)kG * want);
  // The rest of the traffic (inputs; gradients home once) is the same.
  EXPECT_EQ(sl->h2d_bytes - param_h2d_bytes(lm_, sl), sm->h2d_bytes - param_h2d_bytes(mm_, sm));
  EXPECT_EQ(sl->d2h_bytes, sm->d2h_bytes);
  mf_schedule_free(sl);
  mf_schedule_free(sm);
  mf_decisions_free(d);
}

// Bytes the schedule copies home from gradient slots.
uint64_t grad_d2h_bytes(const mf_program *p, const mf_schedule *s) {
  uint64_t n = 0;
  for (int32_t i = 0; i < s->n_instr; i++)
    if (s->instr[i].kind == MF_I_D2H && p->tensors[s->slots[s->instr[i].slot].tensor].kind == MF_T_GRAD)
      n += p->tensors[s->slots[s->instr[i].slot].tensor].bytes;
  return n;
}

// Every gradient streamed. Layer-major computes a parameter's gradients of all
// micro-batches in one stretch (untied embeddings: each gradient is written in
// one direction, one stretch); they add up on the device and the sum goes
// home once: the gradient bytes once. Micro-batch-major sends each
// micro-batch's home: G times. Same bits either way (the Invariance tests and
// tests/model:order_test run these decisions).
TEST_P(MicroBatchOrder, StreamedGradientsGoHomeOncePerStepInLayerMajor) {
  ASSERT_FALSE(t_->spec.tie_embeddings);
  uint64_t grads = 0;
  for (int64_t i = 0; i < t_->n; i++) grads += lm_->tensors[lm_->grad_tensor[i]].bytes;
  mf_decisions *d = nullptr;
  ASSERT_EQ(mf_decisions_create(lm_, &d), MF_OK);
  for (int32_t i = 0; i < d->n_params; i++) d->grad[i] = MF_GRAD_STREAM;
  mf_schedule *sl = nullptr, *sm = nullptr;
  ASSERT_EQ(mf_schedule_build(lm_, d, &sl), MF_OK) << mf_last_error();
  ASSERT_EQ(mf_schedule_build(mm_, d, &sm), MF_OK) << mf_last_error();
  EXPECT_EQ(grad_d2h_bytes(lm_, sl), grads);
  EXPECT_EQ(grad_d2h_bytes(mm_, sm), (uint64_t)kG * grads);
  // Of the gradient copies home, exactly one per parameter does not add to the host's sum.
  int overwrite = 0;
  for (int32_t i = 0; i < sl->n_instr; i++)
    if (sl->instr[i].kind == MF_I_D2H && lm_->tensors[sl->slots[sl->instr[i].slot].tensor].kind == MF_T_GRAD)
      overwrite += !sl->instr[i].accumulate;
  EXPECT_EQ(overwrite, (int)t_->n);
  mf_schedule_free(sl);
  mf_schedule_free(sm);
  mf_decisions_free(d);
}

// Layer-major holds every micro-batch's kept activations at once: a larger
// arena when activations are kept (here by about G times the activation part,
// checked only as larger).
TEST_P(MicroBatchOrder, LayerMajorHoldsMoreActivations) {
  mf_decisions *d = nullptr;
  ASSERT_EQ(mf_decisions_create(lm_, &d), MF_OK);
  for (int pass = 0; pass < 2; pass++) {
    if (pass == 1)
      for (int32_t i = 0; i < d->n_params; i++) d->param[i] = MF_PARAM_STREAM, d->grad[i] = MF_GRAD_STREAM;
    mf_schedule *sl = nullptr, *sm = nullptr;
    ASSERT_EQ(mf_schedule_build(lm_, d, &sl), MF_OK) << mf_last_error();
    ASSERT_EQ(mf_schedule_build(mm_, d, &sm), MF_OK) << mf_last_error();
    EXPECT_GT(sl->peak_live_bytes, sm->peak_live_bytes) << "pass " << pass;
    EXPECT_GT(sl->arena_bytes, sm->arena_bytes) << "pass " << pass;
    mf_schedule_free(sl);
    mf_schedule_free(sm);
  }
  // Every weight and gradient streamed: what stays is activations, so
  // layer-major's peak is well over micro-batch-major's.
  mf_schedule *sl = nullptr, *sm = nullptr;
  ASSERT_EQ(mf_schedule_build(lm_, d, &sl), MF_OK);
  ASSERT_EQ(mf_schedule_build(mm_, d, &sm), MF_OK);
  EXPECT_GT((double)sl->peak_live_bytes, 1.5 * (double)sm->peak_live_bytes);
  mf_schedule_free(sl);
  mf_schedule_free(sm);
  mf_decisions_free(d);
}

INSTANTIATE_TEST_SUITE_P(Shapes, MicroBatchOrder, ::testing::Values(0, 1, 2),
                         [](const ::testing::TestParamInfo<int> &i) { return std::string(make_shape(i.param).name); });

}  // namespace
