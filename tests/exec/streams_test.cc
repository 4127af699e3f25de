// The executor's three streams (compute, h2d, d2h) and the order between
// them. On a GPU they run concurrently; here the cpu backend's deferred
// streams (kernels/backend.h MF_CPU_STREAMS_LAZY, _COPIES_FIRST) run each
// stream's work as late, or its copies as early, as the declared waits allow.
// First the harness itself: a missing wait gives a wrong result under it, the
// wait a right one. Then the executor: every kind of plan gives the same
// losses, gradients and (with the optimizer on the device) weights under
// both deferred modes as with work run when submitted.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "planner/schedule.h"
#include "src/core/core.h"
#include "src/exec/exec.h"
#include "src/model/params.h"
#include "src/model/program.h"
#include "src/model/spec.h"
#include "src/optim/optim.h"

namespace {

struct Backend {
  mf_backend *b = nullptr;
  float *arena = nullptr;
  mf_stream *s1 = nullptr, *s2 = nullptr;
  mf_event *e = nullptr;
  explicit Backend(mf_cpu_streams mode) {
    mf_cpu_backend_opts o = {nullptr, 0, 0, nullptr, mode};
    EXPECT_EQ(mf_backend_cpu_create(&o, &b), MF_OK) << mf_last_error();
    void *base = nullptr;
    EXPECT_EQ(b->arena_create(b, 64 * sizeof(float), &base), MF_OK);
    arena = (float *)base;
    EXPECT_EQ(b->stream_create(b, &s1), MF_OK);
    EXPECT_EQ(b->stream_create(b, &s2), MF_OK);
    EXPECT_EQ(b->event_create(b, &e), MF_OK);
  }
  ~Backend() {
    b->event_free(b, e);
    b->stream_free(b, s1);
    b->stream_free(b, s2);
    mf_backend_free(b);
  }
  mf_kernel_call add(float *x, float *y, int64_t n) {  // y += x
    mf_kernel_call c;
    std::memset(&c, 0, sizeof c);
    c.kind = MF_K_ADD;
    c.b[0] = {x, n * sizeof(float), 0};
    c.b[1] = {y, n * sizeof(float), 1};
    c.i[0] = n;
    c.i[1] = 1;
    return c;
  }
};

// Lazy: a copy home that does not wait for the upload before it reads the
// old value (its stream is synced first); with the wait, the new one.
TEST(DeferredStreams, LazyRunsAReaderBeforeAnUnawaitedWriter) {
  for (bool wait : {false, true}) {
    Backend k(MF_CPU_STREAMS_LAZY);
    const float one = 1.0f, two = 2.0f;
    float out = 0;
    ASSERT_EQ(k.b->copy(k.b, k.arena, &one, sizeof one, MF_COPY_H2D, k.s1), MF_OK);
    ASSERT_EQ(k.b->stream_sync(k.b, k.s1), MF_OK);
    ASSERT_EQ(k.b->copy(k.b, k.arena, &two, sizeof two, MF_COPY_H2D, k.s1), MF_OK);
    ASSERT_EQ(k.b->event_record(k.b, k.e, k.s1), MF_OK);
    if (wait) {
      ASSERT_EQ(k.b->stream_wait(k.b, k.s2, k.e), MF_OK);
    }
    ASSERT_EQ(k.b->copy(k.b, &out, k.arena, sizeof out, MF_COPY_D2H, k.s2), MF_OK);
    ASSERT_EQ(k.b->stream_sync(k.b, k.s2), MF_OK);
    EXPECT_EQ(out, wait ? 2.0f : 1.0f);
    ASSERT_EQ(k.b->stream_sync(k.b, k.s1), MF_OK);
  }
}

// Copies first: an upload that does not wait for a queued kernel still
// reading its memory overwrites it first; with the wait the kernel runs first.
TEST(DeferredStreams, CopiesFirstOverwriteUnawaitedReaders) {
  for (bool wait : {false, true}) {
    Backend k(MF_CPU_STREAMS_COPIES_FIRST);
    float *x = k.arena, *y = k.arena + 8;
    const float three = 3.0f, five = 5.0f;
    ASSERT_EQ(k.b->copy(k.b, x, &three, sizeof three, MF_COPY_H2D, k.s1), MF_OK);
    y[0] = 0;
    const mf_kernel_call c = k.add(x, y, 1);
    ASSERT_EQ(k.b->run(k.b, &c, k.s2), MF_OK);  // queued, not run
    ASSERT_EQ(k.b->event_record(k.b, k.e, k.s2), MF_OK);
    if (wait) {
      ASSERT_EQ(k.b->stream_wait(k.b, k.s1, k.e), MF_OK);
    }
    ASSERT_EQ(k.b->copy(k.b, x, &five, sizeof five, MF_COPY_H2D, k.s1), MF_OK);  // runs now
    ASSERT_EQ(k.b->stream_sync(k.b, k.s2), MF_OK);
    EXPECT_EQ(y[0], wait ? 3.0f : 5.0f);
  }
}

// Host functions (the staging arena's fills and copy-outs) run in their
// stream's order: at once on immediate streams; lazy runs one as soon as its
// waits allow, so a host copy over memory a queued upload still reads shows
// without the wait.
struct Probe {
  const float *from;
  float got = -1;
  static void Read(void *ctx) {
    Probe *p = (Probe *)ctx;
    p->got = *p->from;
  }
};

TEST(DeferredStreams, LazyRunsHostFunctionsEarly) {
  for (bool wait : {false, true}) {
    Backend k(MF_CPU_STREAMS_LAZY);
    const float one = 1.0f, two = 2.0f;
    ASSERT_EQ(k.b->copy(k.b, k.arena, &one, sizeof one, MF_COPY_H2D, k.s1), MF_OK);
    ASSERT_EQ(k.b->stream_sync(k.b, k.s1), MF_OK);
    ASSERT_EQ(k.b->copy(k.b, k.arena, &two, sizeof two, MF_COPY_H2D, k.s1), MF_OK);  // queued
    ASSERT_EQ(k.b->event_record(k.b, k.e, k.s1), MF_OK);
    if (wait) {
      ASSERT_EQ(k.b->stream_wait(k.b, k.s2, k.e), MF_OK);
    }
    Probe p{k.arena};
    ASSERT_EQ(k.b->host_fn(k.b, k.s2, Probe::Read, &p), MF_OK);
    EXPECT_EQ(p.got, wait ? 2.0f : 1.0f) << "ran when given, after what it waits for";
    ASSERT_EQ(k.b->stream_sync(k.b, k.s1), MF_OK);
  }
}

// Copies first: a host function runs as late as possible, so a copy over the
// memory it reads (here a copy home into the host buffer it reads) runs before
// it without the wait.
TEST(DeferredStreams, CopiesFirstRunHostFunctionsLate) {
  for (bool wait : {false, true}) {
    Backend k(MF_CPU_STREAMS_COPIES_FIRST);
    float host = 3.0f;
    k.arena[0] = 7.0f;
    Probe p{&host};
    ASSERT_EQ(k.b->host_fn(k.b, k.s2, Probe::Read, &p), MF_OK);
    EXPECT_EQ(p.got, -1.0f) << "not run yet";
    ASSERT_EQ(k.b->event_record(k.b, k.e, k.s2), MF_OK);
    if (wait) {
      ASSERT_EQ(k.b->stream_wait(k.b, k.s1, k.e), MF_OK);
    }
    ASSERT_EQ(k.b->copy(k.b, &host, k.arena, sizeof host, MF_COPY_D2H, k.s1), MF_OK);  // runs now
    ASSERT_EQ(k.b->stream_sync(k.b, k.s2), MF_OK);
    EXPECT_EQ(p.got, wait ? 3.0f : 7.0f);
  }
}

TEST(DeferredStreams, HostFunctionsRunAtOnceOnImmediateStreams) {
  Backend k(MF_CPU_STREAMS_IMMEDIATE);
  k.arena[0] = 5.0f;
  Probe p{k.arena};
  ASSERT_EQ(k.b->host_fn(k.b, k.s1, Probe::Read, &p), MF_OK);
  EXPECT_EQ(p.got, 5.0f);
  EXPECT_EQ(k.b->host_fn(k.b, k.s1, nullptr, &p), MF_ERR_INVALID_ARG);
}

// event_query says whether the work before a record has run, without running
// it; timed events give the seconds between two records once both are reached.
TEST(DeferredStreams, EventQueryAndElapsedTime) {
  for (mf_cpu_streams mode : {MF_CPU_STREAMS_IMMEDIATE, MF_CPU_STREAMS_LAZY}) {
    Backend k(mode);
    mf_event *t0 = nullptr, *t1 = nullptr;
    ASSERT_EQ(k.b->event_create_timed(k.b, &t0), MF_OK);
    ASSERT_EQ(k.b->event_create_timed(k.b, &t1), MF_OK);
    int done = -1;
    ASSERT_EQ(k.b->event_query(k.b, k.e, &done), MF_OK);
    EXPECT_EQ(done, 1) << "never recorded";
    ASSERT_EQ(k.b->event_record(k.b, t0, k.s1), MF_OK);
    const mf_kernel_call c = k.add(k.arena, k.arena + 32, 32);
    for (int r = 0; r < 2000; r++) ASSERT_EQ(k.b->run(k.b, &c, k.s1), MF_OK);
    ASSERT_EQ(k.b->event_record(k.b, t1, k.s1), MF_OK);
    ASSERT_EQ(k.b->event_record(k.b, k.e, k.s1), MF_OK);
    ASSERT_EQ(k.b->event_query(k.b, k.e, &done), MF_OK);
    EXPECT_EQ(done, mode == MF_CPU_STREAMS_IMMEDIATE ? 1 : 0);
    double sec = -1;
    if (mode == MF_CPU_STREAMS_LAZY) {
      EXPECT_EQ(k.b->event_elapsed(k.b, t0, t1, &sec), MF_ERR_INVALID_ARG) << "not reached yet";
    }
    ASSERT_EQ(k.b->stream_sync(k.b, k.s1), MF_OK);
    ASSERT_EQ(k.b->event_query(k.b, k.e, &done), MF_OK);
    EXPECT_EQ(done, 1);
    ASSERT_EQ(k.b->event_elapsed(k.b, t0, t1, &sec), MF_OK);
    EXPECT_GT(sec, 0.0);
    EXPECT_LT(sec, 10.0);
    EXPECT_EQ(k.b->event_elapsed(k.b, t0, k.e, &sec), MF_ERR_INVALID_ARG) << "an event without timing";
    k.b->event_free(k.b, t0);
    k.b->event_free(k.b, t1);
  }
}

TEST(DeferredStreams, UnknownModeIsRefused) {
  mf_cpu_backend_opts o = {nullptr, 0, 0, nullptr, (mf_cpu_streams)7};
  mf_backend *b = nullptr;
  EXPECT_EQ(mf_backend_cpu_create(&o, &b), MF_ERR_INVALID_ARG);
  EXPECT_EQ(b, nullptr);
}

// The executor under every kind of plan.
enum class Plan { kResident, kStreamOffload, kStreamRecompute, kDeviceOptimizer };

struct Result {
  std::vector<double> losses;
  std::vector<float> grads, w;
};

class ExecStreams : public ::testing::TestWithParam<std::tuple<Plan, mf_program_order>> {
 protected:
  void SetUp() override {
    mf_model_spec s;
    mf_model_spec_defaults(MF_FAMILY_QWEN2_MOE, &s);
    s.hidden = 32, s.layers = 3, s.heads = 4, s.kv_heads = 2, s.head_dim = 8, s.experts = 8, s.top_k = 2;
    s.expert_ffn = 16, s.shared_ffn = 24, s.dense_ffn = 48, s.vocab = 64, s.max_seq = 64, s.rope_theta = 1e4;
    s.n_mlp_only = 1, s.mlp_only_layers[0] = 0;
    ASSERT_EQ(mf_param_table_build(&s, &t_), MF_OK) << mf_last_error();
    mf_program_opts po = {};
    po.micro_batch = 2, po.seq_len = 16, po.grad_accum = 2, po.aux_coef = 0.01,
    po.order = std::get<1>(GetParam());
    ASSERT_EQ(mf_program_build(t_, &po, &p_), MF_OK) << mf_last_error();
    ASSERT_EQ(mf_decisions_create(p_, &d_), MF_OK);
    const Plan plan = std::get<0>(GetParam());
    for (int32_t i = 0; i < d_->n_params; i++) {
      if (plan == Plan::kStreamOffload || plan == Plan::kStreamRecompute)
        d_->param[i] = MF_PARAM_STREAM, d_->grad[i] = MF_GRAD_STREAM;
      if (plan == Plan::kDeviceOptimizer && i % 2) d_->optim[i] = MF_OPTIM_DEVICE;
      if (plan == Plan::kDeviceOptimizer && i % 2 == 0 && i % 4 == 0) d_->param[i] = MF_PARAM_STREAM;
    }
    for (int32_t x = 0; x < p_->n_tensors; x++) {
      if (plan == Plan::kStreamOffload && mf_schedule_can_offload(p_, x)) d_->act[x] = MF_ACT_OFFLOAD;
      if (plan == Plan::kStreamRecompute && mf_schedule_can_recompute(p_, x)) d_->act[x] = MF_ACT_RECOMPUTE;
    }
    ASSERT_EQ(mf_schedule_build(p_, d_, &s_), MF_OK) << mf_last_error();
    std::mt19937 rng(5);
    for (int m = 0; m < 2 * kSteps; m++) {
      ids_.emplace_back(32);
      tg_.emplace_back(32);
      for (auto &v : ids_.back()) v = (int32_t)(rng() % 64);
      for (auto &v : tg_.back()) v = (int32_t)(rng() % 64);
    }
  }
  void TearDown() override {
    mf_schedule_free(s_);
    mf_decisions_free(d_);
    mf_program_free(p_);
    mf_param_table_free(t_);
  }

  // kSteps steps: losses, every step's gradients; with the optimizer on the
  // device, an unclipped AdamW there each step (the host's parameters keep
  // their weights: the steps differ only through the device's updates).
  Result run(mf_cpu_streams mode) {
    Result out;
    const size_t n = (size_t)t_->total_numel;
    out.w.resize(n);
    mf_params_init_random(t_, 9, 0.3f, out.w.data());
    std::vector<float> g(n), m(n), v(n);
    std::vector<int64_t> step((size_t)t_->n, 0);
    std::vector<uint8_t> update((size_t)t_->n, 0);
    mf_cpu_backend_opts o = {nullptr, 0, 0, mf_optim_run_kernel, mode};
    mf_backend *b = nullptr;
    EXPECT_EQ(mf_backend_cpu_create(&o, &b), MF_OK);
    mf_exec *x = nullptr;
    EXPECT_EQ(mf_exec_create_scheduled(p_, s_, b, &x), MF_OK) << mf_last_error();
    if (!x) {
      mf_backend_free(b);
      return out;
    }
    mf_exec_set_optim_state(x, m.data(), v.data());
    for (int st = 0; st < kSteps; st++) {
      const int32_t *ip[2] = {ids_[2 * st].data(), ids_[2 * st + 1].data()};
      const int32_t *tp[2] = {tg_[2 * st].data(), tg_[2 * st + 1].data()};
      std::fill(g.begin(), g.end(), 0.0f);
      mf_step_result r;
      EXPECT_EQ(mf_exec_step(x, out.w.data(), ip, tp, g.data(), &r), MF_OK) << mf_last_error();
      out.losses.push_back(r.loss);
      out.grads.insert(out.grads.end(), g.begin(), g.end());
      if (s_->n_optim_device) {
        for (int32_t i = 0; i < d_->n_params; i++) {
          update[i] = s_->optim_device[i];
          step[i] += update[i];
        }
        const mf_exec_optim a = {1e-2, 0.9, 0.95, 1e-8, 0.1, 1.0, step.data(), update.data(), nullptr};
        EXPECT_EQ(mf_exec_optimize(x, &a), MF_OK) << mf_last_error();
        const double *sums = mf_exec_norm_sums(x);  // the device's gradients' chunk sums
        for (int32_t i = 0; i < d_->n_params; i++)
          if (s_->optim_device[i])
            for (size_t c = 0; c < mf_optim_norm_chunks((size_t)t_->params[i].numel); c++)
              out.losses.push_back(sums[p_->norm_first[i] + (int64_t)c]);
      }
    }
    EXPECT_EQ(mf_exec_sync_home(x, out.w.data(), 1), MF_OK);
    out.w.insert(out.w.end(), m.begin(), m.end());
    mf_exec_free(x);
    mf_backend_free(b);
    return out;
  }

  static constexpr int kSteps = 3;
  mf_param_table *t_ = nullptr;
  mf_program *p_ = nullptr;
  mf_decisions *d_ = nullptr;
  mf_schedule *s_ = nullptr;
  std::vector<std::vector<int32_t>> ids_, tg_;
};

TEST_P(ExecStreams, DeferredStreamsGiveTheSameBits) {
  const Result ref = run(MF_CPU_STREAMS_IMMEDIATE);
  ASSERT_FALSE(HasFailure());
  ASSERT_GE(ref.losses.size(), (size_t)kSteps);
  for (mf_cpu_streams mode : {MF_CPU_STREAMS_LAZY, MF_CPU_STREAMS_COPIES_FIRST}) {
    SCOPED_TRACE(mode == MF_CPU_STREAMS_LAZY ? "lazy" : "copies first");
    const Result r = run(mode);
    ASSERT_FALSE(HasFailure());
    EXPECT_EQ(r.losses, ref.losses);
    EXPECT_TRUE(r.grads == ref.grads) << "gradients differ";
    EXPECT_TRUE(r.w == ref.w) << "weights or moments differ";
  }
}

std::string PlanName(const ::testing::TestParamInfo<ExecStreams::ParamType> &i) {
  static const char *const names[] = {"resident", "stream_offload", "stream_recompute", "device_optimizer"};
  return std::string(names[(int)std::get<0>(i.param)]) +
         (std::get<1>(i.param) == MF_ORDER_LAYER_MAJOR ? "_layer_major" : "_micro_major");
}

INSTANTIATE_TEST_SUITE_P(Plans, ExecStreams,
                         ::testing::Combine(::testing::Values(Plan::kResident, Plan::kStreamOffload,
                                                              Plan::kStreamRecompute, Plan::kDeviceOptimizer),
                                            ::testing::Values(MF_ORDER_MICRO_MAJOR, MF_ORDER_LAYER_MAJOR)),
                         PlanName);

}  // namespace
