// The executor's per-step stream statistics on the cpu backend: busy time per
// stream within the step's wall time, instruction counts, bytes and peak equal
// to the schedule's, and the optional per-instruction times adding up to the
// busy times (off by default).
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "kernels/backend.h"
#include "planner/schedule.h"
#include "src/core/core.h"
#include "src/exec/exec.h"
#include "src/model/params.h"
#include "src/model/program.h"
#include "src/model/spec.h"

namespace {

class ExecStats : public ::testing::Test {
 protected:
  void SetUp() override {
    mf_model_spec s;
    mf_model_spec_defaults(MF_FAMILY_MIXTRAL, &s);
    s.hidden = 32, s.layers = 2, s.heads = 4, s.kv_heads = 2, s.head_dim = 8, s.experts = 4, s.top_k = 2;
    s.expert_ffn = 32, s.vocab = 64, s.max_seq = 64, s.rope_theta = 10000.0;
    ASSERT_EQ(mf_param_table_build(&s, &t_), MF_OK) << mf_last_error();
    w_.resize((size_t)t_->total_numel);
    g_.resize(w_.size());
    mf_params_init_random(t_, 3, 0.2f, w_.data());
    mf_program_opts po = {};
    po.micro_batch = 2, po.seq_len = 32, po.grad_accum = 2, po.aux_coef = 0.01;
    ASSERT_EQ(mf_program_build(t_, &po, &p_), MF_OK) << mf_last_error();
    std::mt19937 rng(9);
    for (int m = 0; m < 2; m++) {
      ids_[m].resize(64);
      tg_[m].resize(64);
      for (auto &v : ids_[m]) v = (int32_t)(rng() % 64);
      for (auto &v : tg_[m]) v = (int32_t)(rng() % 64);
    }
    // Streamed weights and gradients, offloaded activations: every stream works.
    ASSERT_EQ(mf_decisions_create(p_, &d_), MF_OK);
    for (int32_t i = 0; i < d_->n_params; i++) d_->param[i] = MF_PARAM_STREAM, d_->grad[i] = MF_GRAD_STREAM;
    for (int32_t t = 0; t < p_->n_tensors; t++)
      if (mf_schedule_can_offload(p_, t)) d_->act[t] = MF_ACT_OFFLOAD;
    ASSERT_EQ(mf_schedule_build(p_, d_, &s_), MF_OK) << mf_last_error();
    mf_cpu_backend_opts bo = {nullptr, 0, 0, nullptr};
    ASSERT_EQ(mf_backend_cpu_create(&bo, &b_), MF_OK);
    ASSERT_EQ(mf_exec_create_scheduled(p_, s_, b_, &x_), MF_OK) << mf_last_error();
  }
  void TearDown() override {
    mf_exec_free(x_);
    mf_backend_free(b_);
    mf_schedule_free(s_);
    mf_decisions_free(d_);
    mf_program_free(p_);
    mf_param_table_free(t_);
  }
  mf_step_result step() {
    const int32_t *ip[2] = {ids_[0].data(), ids_[1].data()}, *tp[2] = {tg_[0].data(), tg_[1].data()};
    mf_step_result r;
    EXPECT_EQ(mf_exec_step(x_, w_.data(), ip, tp, g_.data(), &r), MF_OK) << mf_last_error();
    return r;
  }
  mf_param_table *t_ = nullptr;
  mf_program *p_ = nullptr;
  mf_decisions *d_ = nullptr;
  mf_schedule *s_ = nullptr;
  mf_backend *b_ = nullptr;
  mf_exec *x_ = nullptr;
  std::vector<float> w_, g_;
  std::vector<int32_t> ids_[2], tg_[2];
};

TEST_F(ExecStats, BusyWithinWallAndTrafficMatchesSchedule) {
  mf_exec_stats z;
  mf_exec_stats_get(x_, &z);
  EXPECT_EQ(z.wall_s, 0.0) << "nothing measured before the first step";
  ASSERT_GT(s_->h2d_bytes, 0u);
  ASSERT_GT(s_->d2h_bytes, 0u);
  for (int rep = 0; rep < 2; rep++) {
    mf_step_result r = step();
    mf_exec_stats_get(x_, &z);
    EXPECT_EQ(z.timed, 1);
    EXPECT_EQ(z.wall_s, r.seconds);
    double sum = 0;
    for (int k = 0; k < MF_EXEC_STREAMS; k++) {
      EXPECT_GT(z.busy_s[k], 0.0) << "stream " << k;
      EXPECT_LE(z.busy_s[k], z.wall_s) << "stream " << k;
      EXPECT_DOUBLE_EQ(z.idle_s[k], z.wall_s - z.busy_s[k]);
      sum += z.busy_s[k];
    }
    // One timeline on the cpu backend: the streams' busy times add up to at most the step.
    EXPECT_LE(sum, z.wall_s);
    EXPECT_EQ(z.h2d_bytes, s_->h2d_bytes);
    EXPECT_EQ(z.d2h_bytes, s_->d2h_bytes);
    EXPECT_EQ(z.peak_live_bytes, s_->peak_live_bytes);
    int64_t want[MF_EXEC_STREAMS] = {0, 0, 0};
    for (int32_t i = 0; i < s_->n_instr; i++)
      want[s_->instr[i].kind == MF_I_H2D   ? MF_EXEC_H2D
           : s_->instr[i].kind == MF_I_D2H ? MF_EXEC_D2H
                                           : MF_EXEC_COMPUTE]++;
    for (int k = 0; k < MF_EXEC_STREAMS; k++) EXPECT_EQ(z.instr[k], want[k]) << "stream " << k;
  }
}

TEST_F(ExecStats, PerInstructionTimesAddUpToBusy) {
  EXPECT_EQ(mf_exec_instr_seconds(x_), nullptr) << "off by default";
  ASSERT_EQ(mf_exec_set_instr_timing(x_, 1), MF_OK);
  const double *is = mf_exec_instr_seconds(x_);
  ASSERT_NE(is, nullptr);
  step();
  mf_exec_stats z;
  mf_exec_stats_get(x_, &z);
  double sum[MF_EXEC_STREAMS] = {0, 0, 0};
  for (int32_t i = 0; i < s_->n_instr; i++) {
    EXPECT_GE(is[i], 0.0);
    const int k = s_->instr[i].kind == MF_I_H2D   ? MF_EXEC_H2D
                  : s_->instr[i].kind == MF_I_D2H ? MF_EXEC_D2H
                                                  : MF_EXEC_COMPUTE;
    sum[k] += is[i];  // the executor adds them in the same order
  }
  for (int k = 0; k < MF_EXEC_STREAMS; k++) EXPECT_EQ(sum[k], z.busy_s[k]) << "stream " << k;
  ASSERT_EQ(mf_exec_set_instr_timing(x_, 0), MF_OK);
  EXPECT_EQ(mf_exec_instr_seconds(x_), nullptr);
  step();  // and the step still runs without it
}

// A backend without timed events gets no busy times: NaN, not host submission
// times passed off as a kernel's.
TEST_F(ExecStats, BackendsWithoutTimedEventsAreNotTimed) {
  mf_cpu_backend_opts bo = {nullptr, 0, 0, nullptr};
  mf_backend *untimed = nullptr;
  ASSERT_EQ(mf_backend_cpu_create(&bo, &untimed), MF_OK);
  untimed->event_create_timed = nullptr;
  untimed->event_elapsed = nullptr;
  mf_exec *y = nullptr;
  ASSERT_EQ(mf_exec_create_scheduled(p_, s_, untimed, &y), MF_OK) << mf_last_error();
  ASSERT_EQ(mf_exec_set_instr_timing(y, 1), MF_OK);
  EXPECT_EQ(mf_exec_instr_seconds(y), nullptr);
  const int32_t *ip[2] = {ids_[0].data(), ids_[1].data()}, *tp[2] = {tg_[0].data(), tg_[1].data()};
  mf_step_result r;
  ASSERT_EQ(mf_exec_step(y, w_.data(), ip, tp, g_.data(), &r), MF_OK) << mf_last_error();
  mf_exec_stats z;
  mf_exec_stats_get(y, &z);
  EXPECT_EQ(z.timed, 0);
  EXPECT_TRUE(std::isnan(z.busy_s[MF_EXEC_COMPUTE]));
  EXPECT_TRUE(std::isnan(z.idle_s[MF_EXEC_H2D]));
  EXPECT_EQ(z.h2d_bytes, s_->h2d_bytes);
  EXPECT_EQ(z.peak_live_bytes, s_->peak_live_bytes);
  mf_exec_free(y);
  mf_backend_free(untimed);
}

// Streams that run beside the host (here the cpu backend's deferred streams,
// whose work runs when something needs it, not when it is submitted): busy
// time is what the events around each instruction saw when the stream reached
// them, so each instruction's time is its own work, whenever it ran.
TEST_F(ExecStats, DeferredStreamsAreTimedByTheirEvents) {
  for (mf_cpu_streams mode : {MF_CPU_STREAMS_LAZY, MF_CPU_STREAMS_COPIES_FIRST}) {
    mf_cpu_backend_opts bo = {nullptr, 0, 0, nullptr, mode};
    mf_backend *b = nullptr;
    ASSERT_EQ(mf_backend_cpu_create(&bo, &b), MF_OK);
    mf_exec *y = nullptr;
    ASSERT_EQ(mf_exec_create_scheduled(p_, s_, b, &y), MF_OK) << mf_last_error();
    ASSERT_EQ(mf_exec_set_instr_timing(y, 1), MF_OK);
    const int32_t *ip[2] = {ids_[0].data(), ids_[1].data()}, *tp[2] = {tg_[0].data(), tg_[1].data()};
    mf_step_result r;
    ASSERT_EQ(mf_exec_step(y, w_.data(), ip, tp, g_.data(), &r), MF_OK) << mf_last_error();
    mf_exec_stats z;
    mf_exec_stats_get(y, &z);
    EXPECT_EQ(z.timed, 1);
    const double *is = mf_exec_instr_seconds(y);
    ASSERT_NE(is, nullptr);
    double sum = 0;
    for (int32_t i = 0; i < s_->n_instr; i++) EXPECT_GE(is[i], 0.0) << "instruction " << i;
    for (int k = 0; k < MF_EXEC_STREAMS; k++) {
      EXPECT_GT(z.busy_s[k], 0.0) << "stream " << k;
      sum += z.busy_s[k];
    }
    // All of it ran on this thread, within the step.
    EXPECT_LE(sum, z.wall_s);
    EXPECT_TRUE(std::isnan(z.fill_s)) << "no staging arena";
    mf_exec_free(y);
    mf_backend_free(b);
  }
}

}  // namespace
