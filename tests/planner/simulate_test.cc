// The stream simulation of a schedule: on an overlapping profile the step is
// compute plus the copies it cannot hide (the first uploads, a slow link's
// streamed weights), a fast link hides streaming, a serial profile gives the
// plain sum of every instruction's cost, the memory curve peaks at the
// schedule's peak, the result is deterministic, and every start time matches a
// naive quadratic re-simulation of the same dependency rules.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "planner/hwprofile.h"
#include "planner/schedule.h"
#include "planner/simulate.h"
#include "src/core/core.h"
#include "tests/planner/planner_test_util.h"
#include "src/model/params.h"
#include "src/model/program.h"

namespace {

using namespace mf_pt;

// An H100-like profile; `link` scales both copy bandwidths.
mf_hwprofile profile(double link, int overlap = 1) {
  mf_hwprofile hw;
  memset(&hw, 0, sizeof hw);
  snprintf(hw.name, sizeof hw.name, "test");
  hw.device_memory = 80ull << 30;
  hw.device_reserve = 2ull << 30;
  hw.copies_overlap_compute = overlap;
  hw.h2d_bandwidth = hw.d2h_bandwidth = 25e9 * link;
  hw.h2d_latency_s = hw.d2h_latency_s = 10e-6;
  hw.gemm[0] = {256, 256, 256, 5e13};
  hw.gemm[1] = {1024, 1024, 1024, 3e14};
  hw.gemm[2] = {4096, 4096, 4096, 7e14};
  hw.n_gemm = 3;
  hw.attn[0] = {512, 64, 5e13};
  hw.attn[1] = {4096, 128, 3.5e14};
  hw.n_attn = 2;
  hw.elementwise_bandwidth = 2e12;
  hw.launch_s = 5e-6;
  hw.host_memory = 128ull << 30;
  hw.host_adamw_params_per_s = 1.2e9;
  hw.host_memory_bandwidth = 40e9;
  return hw;
}

// A copy link so fast that it costs nothing.
mf_hwprofile free_link() {
  mf_hwprofile hw = profile(1);
  hw.h2d_bandwidth = hw.d2h_bandwidth = 1e30;
  hw.h2d_latency_s = hw.d2h_latency_s = 0;
  return hw;
}

// The test's own cost of each instruction, written from the spec.
double gemm(const mf_hwprofile &hw, double m, double n, double k) {
  return mf_hw_gemm_seconds(&hw, m, n, k);
}

double ref_cost(const mf_schedule *s, int32_t i, const mf_hwprofile &hw) {
  const mf_program *p = s->prog;
  const mf_instr &in = s->instr[i];
  auto tbytes = [&](int32_t slot) { return (double)p->tensors[s->slots[slot].tensor].bytes; };
  if (in.kind == MF_I_H2D) return in.persist ? 0.0 : mf_hw_copy_seconds(&hw, 1, tbytes(in.slot));
  if (in.kind == MF_I_D2H) return mf_hw_copy_seconds(&hw, 0, tbytes(in.slot));
  if (in.kind == MF_I_ZERO) return mf_hw_elementwise_seconds(&hw, tbytes(in.slot));
  if (in.kind == MF_I_ACCUM) return mf_hw_elementwise_seconds(&hw, tbytes(in.slot) + tbytes(in.slot2));
  const mf_pop &o = p->ops[in.op];
  const double i0 = (double)o.i[0], i1 = (double)o.i[1], i2 = (double)o.i[2];
  switch (o.kind) {
    case MF_K_LINEAR_FWD:
      return gemm(hw, i0, i1, i2);
    case MF_K_LINEAR_BWD_DATA:
      return gemm(hw, i0, i2, i1);
    case MF_K_LINEAR_BWD_WEIGHT:
      return gemm(hw, i1, i2, i0);
    case MF_K_ATTN_FWD:
    case MF_K_ATTN_BWD:
      return mf_hw_attention_seconds(&hw, o.flops, i1, (double)o.i[4]);
    case MF_K_GRAD_SUMSQ:  // reads the gradient
      return mf_hw_elementwise_seconds(&hw, (double)p->tensors[o.t[0]].bytes);
    case MF_K_ADAMW: {  // serial: the host's AdamW over the parameter; else weight, gradient, state
      if (!hw.copies_overlap_compute)
        return mf_hw_adamw_seconds(&hw, (double)p->params->params[p->tensors[o.t[0]].param].numel);
      return mf_hw_elementwise_seconds(&hw, 2.0 * (double)p->tensors[o.t[0]].bytes +
                                                (double)p->tensors[o.t[1]].bytes +
                                                2.0 * (double)p->tensors[o.t[2]].bytes);
    }
    case MF_K_EXPERT_FWD:
    case MF_K_EXPERT_BWD_DATA:
    case MF_K_EXPERT_BWD_WEIGHT: {
      const double T = (double)(p->B * p->S), K = (double)p->spec.top_k, E = i0, R = T * K;
      const double active = std::min(R, std::max(1.0, E * (1.0 - std::pow(1.0 - std::min(1.0, K / E), T))));
      const double m = R / active;
      double one = o.kind == MF_K_EXPERT_FWD        ? gemm(hw, m, i1, i2)
                   : o.kind == MF_K_EXPERT_BWD_DATA ? gemm(hw, m, i2, i1)
                                                    : gemm(hw, i1, i2, m);
      return one > 0 ? active * std::max(0.0, one - hw.launch_s) + hw.launch_s : one;
    }
    case MF_K_CROSS_ENTROPY: {
      const int64_t T = o.i[0], V = o.i[1], H = o.i[2], c = o.i[3] > 0 && o.i[3] < V ? o.i[3] : V;
      double one = (double)(V / c) * gemm(hw, (double)T, (double)c, (double)H);
      if (V % c) one += gemm(hw, (double)T, (double)(V % c), (double)H);
      return o.flops / (2.0 * (double)T * (double)V * (double)H) * one;
    }
    default: {
      std::vector<int32_t> seen;
      double bytes = 0;
      for (int k = 0; k < MF_KBUF_MAX; k++) {
        int32_t t = o.t[k];
        if (t < 0 || std::find(seen.begin(), seen.end(), t) != seen.end()) continue;
        seen.push_back(t);
        double b = (double)p->tensors[t].bytes;
        bool table = (o.kind == MF_K_EMBED_FWD && k == 1) || (o.kind == MF_K_EMBED_BWD && k == 2);
        if (table && o.i[0] < o.i[1]) b = b / (double)o.i[1] * (double)o.i[0];
        bytes += b;
      }
      return mf_hw_elementwise_seconds(&hw, bytes);
    }
  }
}

struct Touch {
  int32_t slot;
  bool write;
};

std::vector<Touch> touches_of(const mf_schedule *s, int32_t i) {
  const mf_program *p = s->prog;
  const mf_instr &in = s->instr[i];
  std::vector<Touch> v;
  if (in.kind == MF_I_RUN) {
    const mf_pop &o = p->ops[in.op];
    mf_kernel_call c;
    memset(&c, 0, sizeof c);
    c.kind = o.kind;
    memcpy(c.i, o.i, sizeof c.i);
    const uint32_t w = mf_kernel_writes(&c);
    for (int k = 0; k < MF_KBUF_MAX; k++)
      if (s->slot_pool[in.operands + k] >= 0) v.push_back({s->slot_pool[in.operands + k], (w >> k & 1) != 0});
    if (o.experts_at >= 0)
      for (int64_t e = 0; e < p->spec.experts; e++)
        v.push_back({s->slot_pool[in.operands + MF_KBUF_MAX + e], mf_kernel_writes_experts(o.kind) != 0});
  } else if (in.kind == MF_I_ACCUM) {
    v.push_back({in.slot, false});
    v.push_back({in.slot2, true});
  } else {
    v.push_back({in.slot, in.kind != MF_I_D2H});
  }
  return v;
}

// The dependency rules of simulate.h, applied by brute force: every earlier
// instruction is a candidate, with no last-writer bookkeeping and no interval
// structure. Returns the start times.
std::vector<double> naive_starts(const mf_schedule *s, const mf_sim_result &r) {
  const int32_t n = s->n_instr;
  std::vector<std::vector<Touch>> tc(n);
  for (int32_t i = 0; i < n; i++) tc[i] = touches_of(s, i);
  std::vector<std::vector<std::pair<int32_t, bool>>> by_slot(s->n_slots);  // (instruction, writes)
  for (int32_t i = 0; i < n; i++)
    for (const Touch &t : tc[i]) by_slot[t.slot].push_back({i, t.write});
  auto bytes = [&](int32_t x) { return s->prog->tensors[s->slots[x].tensor].bytes; };
  std::vector<double> start(n), end(n);
  for (int32_t i = 0; i < n; i++) {
    double ready = 0;
    for (int32_t j = i - 1; j >= 0; j--)
      if (r.stream[j] == r.stream[i]) {
        ready = end[j];
        break;
      }
    for (const Touch &t : tc[i]) {
      for (auto [j, w] : by_slot[t.slot])
        if (j < i && (w || t.write)) ready = std::max(ready, end[j]);
      if (s->slots[t.slot].first != i) continue;
      const size_t a = s->slots[t.slot].offset, b = a + bytes(t.slot);
      for (int32_t y = 0; y < s->n_slots; y++) {
        const size_t c = s->slots[y].offset, d = c + bytes(y);
        if (y == t.slot || !(c < b && a < d)) continue;
        for (auto [j, w] : by_slot[y])
          if (j < i) ready = std::max(ready, end[j]);
      }
    }
    if (s->instr[i].kind == MF_I_H2D)
      for (int32_t j = 0; j < i; j++)
        if (s->instr[j].kind == MF_I_D2H &&
            s->slots[s->instr[j].slot].tensor == s->slots[s->instr[i].slot].tensor)
          ready = std::max(ready, end[j]);
    if (i >= s->optim_begin)  // the optimizer part: after everything before it
      for (int32_t j = 0; j < s->optim_begin; j++) ready = std::max(ready, end[j]);
    start[i] = ready;
    end[i] = ready + r.cost[i];
  }
  return start;
}

class Simulate : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    sh_ = make_shape(GetParam());
    ASSERT_EQ(mf_param_table_build(&sh_.spec, &t_), MF_OK) << mf_last_error();
    mf_program_opts po = {2, 48, 2, 0.01, 16, 0};
    ASSERT_EQ(mf_program_build(t_, &po, &p_), MF_OK) << mf_last_error();
  }
  void TearDown() override {
    for (mf_schedule *s : scheds_) mf_schedule_free(s);
    for (mf_decisions *d : decs_) mf_decisions_free(d);
    mf_program_free(p_);
    mf_param_table_free(t_);
  }
  mf_decisions *fresh() {
    mf_decisions *d = nullptr;
    EXPECT_EQ(mf_decisions_create(p_, &d), MF_OK);
    decs_.push_back(d);
    return d;
  }
  mf_decisions *streamed() {
    mf_decisions *d = fresh();
    for (int32_t i = 0; i < d->n_params; i++) d->param[i] = MF_PARAM_STREAM;
    return d;
  }
  // Every `every`-th parameter (from `first`) updated on the device (resident,
  // gradient on the device); the others streamed, their gradients streamed.
  mf_decisions *device_optim(int every, int first = 0) {
    mf_decisions *d = fresh();
    for (int32_t i = 0; i < d->n_params; i++) {
      const bool dev = i % every == first;
      d->param[i] = dev ? MF_PARAM_RESIDENT : MF_PARAM_STREAM;
      d->grad[i] = dev ? MF_GRAD_DEVICE : MF_GRAD_STREAM;
      d->optim[i] = dev ? MF_OPTIM_DEVICE : MF_OPTIM_HOST;
    }
    return d;
  }
  const mf_schedule *build(const mf_decisions *d) {
    mf_schedule *s = nullptr;
    EXPECT_EQ(mf_schedule_build(p_, d, &s), MF_OK) << mf_last_error();
    if (s) scheds_.push_back(s);
    return s;
  }
  // Decision mixes that exercise every instruction kind and dependency.
  std::vector<const mf_schedule *> variety() {
    std::vector<const mf_schedule *> v;
    v.push_back(build(fresh()));
    mf_decisions *d = streamed();
    for (int32_t i = 0; i < d->n_params; i++) d->grad[i] = MF_GRAD_STREAM;
    v.push_back(build(d));
    mf_decisions *o = fresh();
    for (int32_t t = 0; t < p_->n_tensors; t++)
      if (mf_schedule_can_offload(p_, t)) o->act[t] = MF_ACT_OFFLOAD;
    for (int32_t i = 0; i < o->n_params; i++) o->param[i] = MF_PARAM_STREAM;
    v.push_back(build(o));
    std::mt19937 rng(23);
    for (int trial = 0; trial < 3; trial++) {
      mf_decisions *mx = fresh();
      for (int32_t i = 0; i < mx->n_params; i++) mx->param[i] = rng() % 2, mx->grad[i] = rng() % 2;
      for (int32_t t = 0; t < p_->n_tensors; t++) {
        int r = (int)(rng() % 3);
        if (r == 1 && mf_schedule_can_offload(p_, t)) mx->act[t] = MF_ACT_OFFLOAD;
        if (r == 2 && mf_schedule_can_recompute(p_, t)) mx->act[t] = MF_ACT_RECOMPUTE;
      }
      v.push_back(build(mx));
    }
    // The optimizer on the device for some parameters (kept last: Deterministic takes [5]).
    v.push_back(build(device_optim(2)));
    mf_decisions *dm = device_optim(3, 1);
    for (int32_t t = 0; t < p_->n_tensors; t++)
      if (mf_schedule_can_recompute(p_, t)) dm->act[t] = MF_ACT_RECOMPUTE;
    v.push_back(build(dm));
    return v;
  }
  Shape sh_;
  mf_param_table *t_ = nullptr;
  mf_program *p_ = nullptr;
  std::vector<mf_schedule *> scheds_;
  std::vector<mf_decisions *> decs_;
};

struct Sim {
  mf_sim_result r;
  Sim(const mf_schedule *s, const mf_hwprofile &hw, int overlap_opt = 0) {
    memset(&r, 0, sizeof r);
    mf_sim_opts o = {overlap_opt};
    EXPECT_EQ(mf_simulate(s, &hw, &o, &r), MF_OK) << mf_last_error();
  }
  ~Sim() { mf_sim_result_free(&r); }
};

void expect_accounting(const mf_schedule *s, const mf_sim_result &r) {
  const double tol = 1e-9 * r.step_seconds;
  EXPECT_NEAR(r.step_seconds, r.compute_seconds + r.exposed_transfer_seconds + r.exposed_optimizer_seconds,
              tol);
  EXPECT_GE(r.exposed_transfer_seconds, 0);
  EXPECT_GE(r.exposed_optimizer_seconds, 0);
  EXPECT_EQ(r.h2d_bytes, s->h2d_bytes);
  EXPECT_EQ(r.d2h_bytes, s->d2h_bytes);
  double busy[MF_SIM_STREAMS] = {0, 0, 0}, last = 0;
  for (int32_t i = 0; i < r.n_instr; i++) {
    busy[r.stream[i]] += r.cost[i];
    last = std::max(last, r.end[i]);
    EXPECT_EQ(r.end[i], r.start[i] + r.cost[i]);
  }
  EXPECT_EQ(last, r.streams_seconds);
  for (int k = 0; k < MF_SIM_STREAMS; k++) {
    EXPECT_NEAR(busy[k], r.busy[k], tol) << mf_sim_stream_name((mf_sim_stream)k);
    EXPECT_NEAR(r.idle[k], r.step_seconds - r.busy[k], tol);
  }
}

TEST_P(Simulate, ResidentIsComputePlusTheFirstUploads) {
  const mf_schedule *s = build(fresh());
  const mf_hwprofile hw = profile(1);
  Sim a(s, hw);
  const mf_sim_result &r = a.r;
  expect_accounting(s, r);
  EXPECT_GT(r.compute_seconds, 0);
  EXPECT_NEAR(r.optimizer_seconds, mf_hw_adamw_seconds(&hw, (double)t_->total_numel), 1e-15);
  // The first kernel waits for exactly the uploads queued before it: nothing
  // has died yet, so the H2D stream runs them back to back from 0.
  int32_t first_run = 0;
  double before = 0;
  while (s->instr[first_run].kind != MF_I_RUN) {
    if (s->instr[first_run].kind == MF_I_H2D) before += r.cost[first_run];
    first_run++;
  }
  EXPECT_NEAR(r.start[first_run], before, 1e-15);
  // Exposed: the lead-in, the gaps on the compute stream, the drain after it.
  double gaps = 0, free_at = 0, last_compute = 0;
  for (int32_t i = 0; i < r.n_instr; i++)
    if (r.stream[i] == MF_SIM_COMPUTE) {
      gaps += r.start[i] - free_at;
      free_at = last_compute = r.end[i];
    }
  EXPECT_NEAR(r.exposed_transfer_seconds, gaps + (r.streams_seconds - last_compute), 1e-9 * r.step_seconds);
  EXPECT_GE(r.exposed_transfer_seconds, before);
  double copies = r.busy[MF_SIM_H2D] + r.busy[MF_SIM_D2H];
  EXPECT_LE(r.exposed_transfer_seconds, copies * (1 + 1e-12));
  // Resident weights mostly overlap the compute: less exposed than all the copies.
  EXPECT_LT(r.exposed_transfer_seconds, copies);
  EXPECT_EQ(r.step_seconds, r.streams_seconds + r.optimizer_seconds);
}

TEST_P(Simulate, StreamingOnASlowLinkIsSlower) {
  const mf_schedule *res = build(fresh());
  const mf_schedule *str = build(streamed());
  ASSERT_GT(str->h2d_bytes, res->h2d_bytes);
  const mf_hwprofile slow = profile(1e-3);  // 25 MB/s
  Sim a(res, slow), b(str, slow);
  expect_accounting(str, b.r);
  EXPECT_GT(b.r.step_seconds, a.r.step_seconds);
  EXPECT_GT(b.r.exposed_transfer_seconds, a.r.exposed_transfer_seconds);
  EXPECT_NEAR(b.r.compute_seconds, a.r.compute_seconds, 1e-12);  // same kernels, more copies
  // And a slower link still is slower again.
  Sim c(str, profile(1e-4));
  EXPECT_GT(c.r.step_seconds, b.r.step_seconds);
  EXPECT_GT(c.r.exposed_transfer_seconds, b.r.exposed_transfer_seconds);
}

TEST_P(Simulate, AFastLinkHidesStreaming) {
  const mf_schedule *str = build(streamed());
  const mf_hwprofile fast = free_link();
  Sim b(str, fast);
  expect_accounting(str, b.r);
  const double compute_only = b.r.compute_seconds + b.r.optimizer_seconds;
  EXPECT_NEAR(b.r.step_seconds, compute_only, 1e-6 * compute_only);
  EXPECT_LT(b.r.exposed_transfer_seconds, 1e-6 * b.r.compute_seconds);
  // The realistic link lies in between.
  Sim c(str, profile(1));
  EXPECT_GT(c.r.step_seconds, b.r.step_seconds);
}

TEST_P(Simulate, SerialProfileIsThePlainSumOfCosts) {
  for (const mf_schedule *s : variety()) {
    const mf_hwprofile hw = profile(1, 0);
    Sim a(s, hw);
    const mf_sim_result &r = a.r;
    expect_accounting(s, r);
    double sum = 0;
    for (int32_t i = 0; i < r.n_instr; i++) {
      EXPECT_DOUBLE_EQ(r.cost[i], ref_cost(s, i, hw)) << "instruction " << i;
      EXPECT_EQ(r.start[i], sum);
      sum += r.cost[i];
    }
    EXPECT_EQ(r.streams_seconds, sum);
    EXPECT_EQ(r.step_seconds, sum + r.optimizer_seconds);
    EXPECT_NEAR(r.exposed_transfer_seconds, r.busy[MF_SIM_H2D] + r.busy[MF_SIM_D2H], 1e-9 * sum);
    // Overlap can only help.
    Sim b(s, profile(1, 1));
    EXPECT_LE(b.r.step_seconds, r.step_seconds);
  }
}

TEST_P(Simulate, MemoryCurvePeaksAtTheSchedulesPeak) {
  for (const mf_schedule *s : variety()) {
    Sim a(s, profile(1));
    const mf_sim_result &r = a.r;
    size_t mx = 0;
    for (int32_t i = 0; i < r.n_instr; i++) {
      size_t live = 0;
      for (int32_t x = 0; x < s->n_slots; x++)
        if (s->slots[x].first <= i && i <= s->slots[x].last) live += p_->tensors[s->slots[x].tensor].bytes;
      ASSERT_EQ(r.live_bytes[i], live) << "instruction " << i;
      mx = std::max(mx, live);
    }
    EXPECT_EQ(r.peak_live_bytes, s->peak_live_bytes);
    EXPECT_EQ(mx, s->peak_live_bytes);
    EXPECT_EQ(r.peak_instr, s->peak_instr);
    EXPECT_LE(r.peak_live_bytes, s->arena_bytes);
  }
}

TEST_P(Simulate, Deterministic) {
  const mf_schedule *s = variety()[5];
  const mf_hwprofile hw = profile(0.01);
  Sim a(s, hw, 1), b(s, hw, 1);
  const size_t n = (size_t)a.r.n_instr;
  ASSERT_EQ(a.r.n_instr, b.r.n_instr);
  EXPECT_EQ(0, memcmp(a.r.start, b.r.start, n * sizeof(double)));
  EXPECT_EQ(0, memcmp(a.r.end, b.r.end, n * sizeof(double)));
  EXPECT_EQ(0, memcmp(a.r.cost, b.r.cost, n * sizeof(double)));
  EXPECT_EQ(0, memcmp(a.r.stream, b.r.stream, n));
  EXPECT_EQ(0, memcmp(a.r.live_bytes, b.r.live_bytes, n * sizeof(size_t)));
  EXPECT_EQ(a.r.step_seconds, b.r.step_seconds);
  EXPECT_EQ(a.r.exposed_transfer_seconds, b.r.exposed_transfer_seconds);
  EXPECT_EQ(a.r.optimizer_start, b.r.optimizer_start);
}

// The step the naive simulation gives (simulate.h): the host optimizer, over
// the parameters whose optimizer is not on the device, starts at the barrier
// (the end of the last instruction before optim_begin, or of the streams).
double naive_step(const mf_schedule *s, const mf_sim_result &r, const std::vector<double> &start,
                  const mf_hwprofile &hw) {
  const mf_program *p = s->prog;
  double streams = 0, barrier = 0;
  for (int32_t i = 0; i < s->n_instr; i++) {
    streams = std::max(streams, start[i] + r.cost[i]);
    if (i < s->optim_begin) barrier = std::max(barrier, start[i] + r.cost[i]);
  }
  if (s->optim_begin >= s->n_instr) barrier = streams;
  int64_t host = 0;
  for (int64_t i = 0; i < p->params->n; i++)
    if (!s->optim_device || !s->optim_device[i]) host += p->params->params[i].numel;
  const double updates = host > 0 ? mf_hw_adamw_seconds(&hw, (double)host) : 0.0;
  return std::max(streams, barrier + updates);
}

TEST_P(Simulate, StartsMatchANaiveSimulation) {
  for (double link : {1e-3, 1.0, 30.0}) {
    int k = 0;
    for (const mf_schedule *s : variety()) {
      const mf_hwprofile hw = profile(link);
      Sim a(s, hw);
      std::vector<double> naive = naive_starts(s, a.r);
      int bad = 0;
      for (int32_t i = 0; i < a.r.n_instr && bad < 5; i++)
        if (a.r.start[i] != naive[i]) {
          bad++;
          ADD_FAILURE() << "link " << link << " schedule " << k << " instruction " << i << ": start "
                        << a.r.start[i] << ", naive " << naive[i];
        }
      EXPECT_EQ(a.r.step_seconds, naive_step(s, a.r, naive, hw)) << "link " << link << " schedule " << k;
      k++;
    }
  }
}

TEST_P(Simulate, PrefetchIsBoundedByMemoryNotByPosition) {
  // Streamed weights on a slow link: some upload starts before the compute
  // stream reaches its place in the list (that none starts before its memory
  // is free is StartsMatchANaiveSimulation's business).
  const mf_schedule *s = build(streamed());
  Sim a(s, profile(0.01));
  const mf_sim_result &r = a.r;
  int early = 0;
  double compute_at = 0;  // when the compute instruction before i ends
  for (int32_t i = 0; i < r.n_instr; i++) {
    if (r.stream[i] == MF_SIM_COMPUTE) compute_at = r.end[i];
    if (s->instr[i].kind == MF_I_H2D && r.start[i] < compute_at) early++;
  }
  EXPECT_GT(early, 0);
}

// The first H2D of each parameter the host updates, in order, with the time
// its update (the previous step's, in upload order from t = 0) is done.
std::vector<std::pair<int32_t, double>> update_gates(const mf_schedule *s, const mf_hwprofile &hw, double *total) {
  const mf_program *p = s->prog;
  std::vector<char> seen((size_t)p->params->n, 0);
  std::vector<std::pair<int32_t, double>> g;
  double t = 0;
  for (int32_t i = 0; i < s->n_instr; i++) {
    if (s->instr[i].kind != MF_I_H2D) continue;
    const mf_ptensor *x = &p->tensors[s->slots[s->instr[i].slot].tensor];
    if (x->kind != MF_T_PARAM || seen[x->param] || s->optim_device[x->param]) continue;
    seen[x->param] = 1;
    t += mf_hw_adamw_seconds(&hw, (double)p->params->params[x->param].numel);
    g.push_back({i, t});
  }
  for (int64_t k = 0; k < p->params->n; k++)
    if (!seen[k] && !s->optim_device[k]) t += mf_hw_adamw_seconds(&hw, (double)p->params->params[k].numel);
  *total = t;
  return g;
}

void expect_overlapped(const mf_schedule *s, const mf_hwprofile &hw, const Sim &end, const Sim &ovl) {
  expect_accounting(s, ovl.r);
  double total = 0;
  const auto gates = update_gates(s, hw, &total);
  ASSERT_FALSE(gates.empty());
  // The same updates, started at 0: the previous step's, behind this one.
  EXPECT_NEAR(ovl.r.optimizer_seconds, end.r.optimizer_seconds, 1e-9 * end.r.optimizer_seconds);
  EXPECT_NEAR(ovl.r.optimizer_seconds, total, 1e-9 * total);
  EXPECT_EQ(ovl.r.optimizer_start, 0);
  EXPECT_EQ(end.r.optimizer_start, end.r.streams_seconds);
  // Every first upload waits for its parameter's update; nothing else moves earlier.
  for (const auto &g : gates) EXPECT_GE(ovl.r.start[g.first], g.second) << "instruction " << g.first;
  for (int32_t i = 0; i < ovl.r.n_instr; i++) EXPECT_GE(ovl.r.start[i], end.r.start[i]) << "instruction " << i;
  // The step: the streams with the waits, at least the updates; exposed =
  // the step less the streams without the waits (the plain run's).
  EXPECT_EQ(ovl.r.step_seconds, std::max(ovl.r.streams_seconds, total));
  EXPECT_NEAR(ovl.r.exposed_optimizer_seconds, ovl.r.step_seconds - end.r.streams_seconds, 1e-12);
  EXPECT_NEAR(ovl.r.exposed_transfer_seconds, end.r.exposed_transfer_seconds, 1e-12);
  EXPECT_LE(ovl.r.step_seconds, end.r.step_seconds * (1 + 1e-12));
}

TEST_P(Simulate, OverlappedOptimizerHidesBehindTheNextStep) {
  mf_decisions *d = streamed();
  for (int32_t i = 0; i < d->n_params; i++) d->grad[i] = MF_GRAD_STREAM;
  const mf_schedule *s = build(d);
  for (int serial : {0, 1}) {
    SCOPED_TRACE(serial ? "serial profile" : "overlapping profile");
    mf_hwprofile hw = profile(1, serial ? 0 : 1);
    // A rate at which all the updates take a tenth of the plain step's streams.
    Sim probe(s, hw, 0);
    hw.host_adamw_params_per_s = (double)s->prog->params->total_numel / (0.1 * probe.r.streams_seconds);
    Sim end(s, hw, 0), ovl(s, hw, 1);
    expect_overlapped(s, hw, end, ovl);
    // Mostly hidden: the step is well below streams + optimizer.
    EXPECT_LT(ovl.r.step_seconds, end.r.step_seconds);
    EXPECT_LT(ovl.r.exposed_optimizer_seconds, end.r.exposed_optimizer_seconds);
    if (serial) {
      // One timeline: exposed = the sum of the waits.
      double waits = 0, t = 0;
      for (int32_t i = 0; i < ovl.r.n_instr; i++) {
        waits += ovl.r.start[i] - t;
        t = ovl.r.end[i];
      }
      EXPECT_NEAR(ovl.r.exposed_optimizer_seconds, waits, 1e-12);
    }
  }
}

TEST_P(Simulate, OverlappedOptimizerSlowerThanTheStepBoundsIt) {
  const mf_schedule *s = build(streamed());
  mf_hwprofile hw = profile(1);
  Sim probe(s, hw, 0);
  // All the updates take three plain steps' streams.
  hw.host_adamw_params_per_s = (double)s->prog->params->total_numel / (3 * probe.r.streams_seconds);
  Sim end(s, hw, 0), ovl(s, hw, 1);
  expect_overlapped(s, hw, end, ovl);
  EXPECT_GE(ovl.r.step_seconds, ovl.r.optimizer_seconds);
  EXPECT_GT(ovl.r.exposed_optimizer_seconds, 0.5 * ovl.r.optimizer_seconds) << "mostly exposed";
  EXPECT_LT(ovl.r.step_seconds, end.r.step_seconds);
}

// The staged copies' host time (mf_sim_opts host_copy_seconds) shares the
// host's memory with the overlapped updates: their total grows by exactly
// it, each update in proportion (the first uploads wait longer), and the step
// with it; after the step (no overlap) the updates do not meet the copies.
TEST_P(Simulate, StagedHostCopiesSlowTheOverlappedUpdates) {
  const mf_schedule *s = build(streamed());
  mf_hwprofile hw = profile(1);
  Sim probe(s, hw, 0);
  hw.host_adamw_params_per_s = (double)s->prog->params->total_numel / (0.5 * probe.r.streams_seconds);
  for (int overlap : {1, 0}) {
    SCOPED_TRACE(overlap ? "overlapped" : "after the step");
    mf_sim_opts o{};
    o.overlap_optimizer = overlap;
    mf_sim_result a{}, b{};
    ASSERT_EQ(mf_simulate(s, &hw, &o, &a), MF_OK) << mf_last_error();
    o.host_copy_seconds = 2.0 * a.optimizer_seconds;
    ASSERT_EQ(mf_simulate(s, &hw, &o, &b), MF_OK) << mf_last_error();
    expect_accounting(s, b);
    if (overlap) {
      EXPECT_NEAR(b.optimizer_seconds, 3.0 * a.optimizer_seconds, 1e-12 * b.optimizer_seconds);
      EXPECT_GT(b.step_seconds, a.step_seconds);
      EXPECT_GE(b.step_seconds, b.optimizer_seconds);
      EXPECT_GT(b.exposed_optimizer_seconds, a.exposed_optimizer_seconds);
    } else {
      EXPECT_EQ(b.optimizer_seconds, a.optimizer_seconds);
      EXPECT_EQ(b.step_seconds, a.step_seconds);
    }
    mf_sim_result_free(&a);
    mf_sim_result_free(&b);
  }
}

// Kernels timed at the program's own calls (profile compute.kernels) price the
// instructions with their key — RUNs, ZEROs and ACCUMs alike, recomputes and
// the device optimizer's included — and nothing else; copies keep the link model.
TEST_P(Simulate, MeasuredKernelsPriceTheirKeyOnly) {
  mf_decisions *d = fresh();
  for (int32_t t = 0; t < p_->n_tensors; t++)
    if (mf_schedule_can_recompute(p_, t)) d->act[t] = MF_ACT_RECOMPUTE;
  for (int32_t i = 0; i < d->n_params; i += 2) d->optim[i] = MF_OPTIM_DEVICE;
  const mf_schedule *s = build(d);
  ASSERT_NE(s, nullptr);
  mf_hwprofile hw = profile(1, 0);
  snprintf(hw.source, sizeof hw.source, "test");
  // Time every third distinct key, and every ZERO and ACCUM key.
  std::vector<double> want(s->n_instr, -1);
  int distinct = 0;
  bool zero = false, accum = false, timed_kind[2] = {false, false};  // ADAMW, GRAD_SUMSQ
  for (int32_t i = 0; i < s->n_instr; i++) {
    const char *k;
    int64_t sizes[8];
    int ns;
    double bytes;
    if (!mf_sim_instr_key(s, i, &k, sizes, &ns, &bytes)) {
      EXPECT_TRUE(s->instr[i].kind == MF_I_H2D || s->instr[i].kind == MF_I_D2H);
      continue;
    }
    double have = mf_hw_kernel_seconds(&hw, k, sizes, ns, bytes);
    const mf_kernel kind = s->instr[i].kind == MF_I_RUN ? p_->ops[s->instr[i].op].kind : MF_K_COUNT_;
    const int opt = kind == MF_K_ADAMW ? 0 : kind == MF_K_GRAD_SUMSQ ? 1 : -1;
    if (kind == MF_K_GRAD_SUMSQ) {  // its size, not where its sums go: parameters of one size share a key
      EXPECT_EQ(sizes[0], p_->ops[s->instr[i].op].i[0]);
      EXPECT_EQ(sizes[1], 0);
    }
    if (std::isnan(have) &&
        (distinct++ % 3 == 0 || s->instr[i].kind != MF_I_RUN || (opt >= 0 && !timed_kind[opt])) &&
        hw.n_kernels < MF_HW_MAX_KERNELS) {
      if (opt >= 0) timed_kind[opt] = true;
      mf_hw_kernel_point &q = hw.kernels[hw.n_kernels++];
      memset(&q, 0, sizeof q);
      snprintf(q.kernel, sizeof q.kernel, "%s", k);
      memcpy(q.sizes, sizes, sizeof q.sizes);
      q.n_sizes = ns;
      while (q.n_sizes > 0 && q.sizes[q.n_sizes - 1] == 0) q.n_sizes--;
      q.bytes = bytes;
      q.seconds = 1e-3 * (1 + hw.n_kernels);  // distinct, far from the model's microseconds
      have = q.seconds;
    }
    zero |= s->instr[i].kind == MF_I_ZERO;
    accum |= s->instr[i].kind == MF_I_ACCUM;
  }
  for (int32_t i = 0; i < s->n_instr; i++) {  // every instruction with a timed key, earlier ones too
    const char *k;
    int64_t sizes[8];
    int ns;
    double bytes;
    if (!mf_sim_instr_key(s, i, &k, sizes, &ns, &bytes)) continue;
    const double have = mf_hw_kernel_seconds(&hw, k, sizes, ns, bytes);
    if (!std::isnan(have)) want[i] = have;
  }
  ASSERT_EQ(mf_hwprofile_validate(&hw), MF_OK) << mf_last_error();
  EXPECT_TRUE(zero && accum) << "the schedule should zero and accumulate gradients (G = 2)";
  EXPECT_TRUE(timed_kind[0] && timed_kind[1]) << "the device optimizer's calls timed";
  Sim a(s, hw);
  double sum = 0;
  int measured = 0, modelled = 0;
  for (int32_t i = 0; i < s->n_instr; i++) {
    if (want[i] >= 0) {
      EXPECT_EQ(a.r.cost[i], want[i]) << i;
      measured++;
    } else {
      EXPECT_NEAR(a.r.cost[i], ref_cost(s, i, hw), 1e-12 * ref_cost(s, i, hw)) << i;
      modelled++;
    }
    if (s->instr[i].kind == MF_I_RUN && !s->instr[i].recompute && want[i] >= 0) {
      EXPECT_EQ(mf_sim_op_seconds(p_, s->instr[i].op, &hw), want[i]);
    }
    sum += a.r.cost[i];
  }
  EXPECT_GT(measured, 0);
  EXPECT_GT(modelled, 0);
  EXPECT_NEAR(a.r.streams_seconds, sum, 1e-9 * sum) << "a serial profile: the plain sum";
}

// The optimizer on the device. The host AdamW prices only the parameters the
// host updates (the floor scales them as it scales all of them); the device's
// GRAD_SUMSQ and ADAMW cost as simulate.h says, the persistent fills nothing.
TEST_P(Simulate, HostOptimizerPricesOnlyTheHostsParameters) {
  for (int overlap : {0, 1}) {
    SCOPED_TRACE(overlap ? "overlapping profile" : "serial profile");
    const mf_hwprofile hw = profile(1, overlap);
    mf_decisions *d = device_optim(2);
    const mf_schedule *s = build(d);
    ASSERT_NE(s, nullptr);
    int64_t host = 0, dev = 0;
    for (int32_t i = 0; i < d->n_params; i++) (d->optim[i] ? dev : host) += t_->params[i].numel;
    ASSERT_GT(host, 0);
    ASSERT_GT(dev, 0);
    Sim a(s, hw);
    expect_accounting(s, a.r);
    EXPECT_NEAR(a.r.optimizer_seconds, mf_hw_adamw_seconds(&hw, (double)host), 1e-12 * a.r.optimizer_seconds);
    EXPECT_LT(a.r.optimizer_seconds, 0.99 * mf_hw_adamw_seconds(&hw, (double)t_->total_numel));
    // A floor twice the AdamW time of every parameter doubles the host's part.
    mf_sim_opts fo{};
    fo.optimizer_floor_seconds = 2 * mf_hw_adamw_seconds(&hw, (double)t_->total_numel);
    mf_sim_result f{};
    ASSERT_EQ(mf_simulate(s, &hw, &fo, &f), MF_OK) << mf_last_error();
    EXPECT_NEAR(f.optimizer_seconds, 2 * mf_hw_adamw_seconds(&hw, (double)host), 1e-9 * f.optimizer_seconds);
    mf_sim_result_free(&f);
    // Every parameter on the device: nothing left for the host.
    const mf_schedule *all = build(device_optim(1));
    Sim b(all, hw);
    expect_accounting(all, b.r);
    EXPECT_EQ(b.r.optimizer_seconds, 0);
    EXPECT_EQ(b.r.step_seconds, b.r.streams_seconds);
    // Overlapped: the gates and the total cover the host's parameters only.
    Sim ovl(s, hw, 1);
    expect_accounting(s, ovl.r);
    double total = 0;
    const auto gates = update_gates(s, hw, &total);
    ASSERT_FALSE(gates.empty());
    EXPECT_NEAR(total, mf_hw_adamw_seconds(&hw, (double)host), 1e-9 * total);
    EXPECT_NEAR(ovl.r.optimizer_seconds, total, 1e-9 * total);
    EXPECT_EQ(ovl.r.optimizer_start, 0);
    for (const auto &g : gates) EXPECT_GE(ovl.r.start[g.first], g.second) << "instruction " << g.first;
    EXPECT_EQ(ovl.r.step_seconds, std::max(ovl.r.streams_seconds, total));
    // Every parameter on the device: nothing for the overlapped host to gate.
    Sim ball(all, hw, 1);
    EXPECT_EQ(ball.r.optimizer_seconds, 0);
    EXPECT_EQ(ball.r.step_seconds, b.r.step_seconds);
    EXPECT_EQ(0, memcmp(ball.r.start, b.r.start, (size_t)all->n_instr * sizeof(double)));
  }
}

TEST_P(Simulate, PersistentFillsAreFreeAndTheDeviceOptimizerCosts) {
  for (int overlap : {0, 1}) {
    SCOPED_TRACE(overlap ? "overlapping profile" : "serial profile");
    const mf_hwprofile hw = profile(1, overlap);
    const mf_schedule *s = build(device_optim(2));
    ASSERT_NE(s, nullptr);
    Sim a(s, hw);
    expect_accounting(s, a.r);
    int fills = 0, adamw = 0, sumsq = 0;
    double dev = 0;
    uint64_t h2d = 0;
    for (int32_t i = 0; i < s->n_instr; i++) {
      const mf_instr &in = s->instr[i];
      if (in.kind == MF_I_H2D && !in.persist) h2d += p_->tensors[s->slots[in.slot].tensor].bytes;
      if (in.kind == MF_I_H2D && in.persist) {
        EXPECT_EQ(a.r.cost[i], 0.0) << i;
        EXPECT_GT(mf_hw_copy_seconds(&hw, 1, (double)p_->tensors[s->slots[in.slot].tensor].bytes), 0);
        fills++;
      }
      if (in.kind != MF_I_RUN) continue;
      const mf_pop &o = p_->ops[in.op];
      if (o.kind != MF_K_ADAMW && o.kind != MF_K_GRAD_SUMSQ) continue;
      (o.kind == MF_K_ADAMW ? adamw : sumsq)++;
      const mf_ptensor &w = p_->tensors[o.t[0]];
      double want;
      if (o.kind == MF_K_GRAD_SUMSQ)
        want = mf_hw_elementwise_seconds(&hw, (double)w.bytes);
      else if (!overlap)
        want = mf_hw_adamw_seconds(&hw, (double)t_->params[w.param].numel);
      else
        want = mf_hw_elementwise_seconds(&hw, 2.0 * (double)w.bytes + (double)p_->tensors[o.t[1]].bytes +
                                                  2.0 * (double)p_->tensors[o.t[2]].bytes);
      EXPECT_GT(want, 0);
      EXPECT_DOUBLE_EQ(a.r.cost[i], want) << o.label;
      dev += a.r.cost[i];
    }
    EXPECT_GT(fills, 0);
    EXPECT_EQ(adamw, s->n_optim_device);
    EXPECT_EQ(sumsq, s->n_optim_device);
    EXPECT_NEAR(a.r.device_optimizer_seconds, dev, 1e-12 * dev);
    EXPECT_GT(a.r.device_optimizer_seconds, 0);
    EXPECT_EQ(a.r.h2d_bytes, h2d);
    EXPECT_EQ(a.r.h2d_bytes, s->h2d_bytes);
  }
}

// The OPTIM part runs once the host has the global norm: none of its
// instructions starts before every instruction before it has ended, and the
// host's updates start there too, beside it (serial: one timeline, the sum).
TEST_P(Simulate, TheOptimizerPartWaitsForTheStep) {
  for (double link : {1e-3, 1.0}) {
    const mf_hwprofile hw = profile(link);
    const mf_schedule *s = build(device_optim(2));
    ASSERT_NE(s, nullptr);
    ASSERT_LT(s->optim_begin, s->n_instr);
    ASSERT_GT(s->optim_begin, 0);
    Sim a(s, hw);
    expect_accounting(s, a.r);
    double barrier = 0;
    for (int32_t j = 0; j < s->optim_begin; j++) barrier = std::max(barrier, a.r.end[j]);
    EXPECT_EQ(a.r.optimizer_barrier, barrier);
    int held = 0;
    for (int32_t i = s->optim_begin; i < s->n_instr; i++) {
      EXPECT_GE(a.r.start[i], barrier) << "link " << link << " instruction " << i;
      // A free fill at the part's start would have started on its own stream earlier.
      if (a.r.start[i] == barrier && a.r.stream[i] != MF_SIM_COMPUTE) held++;
    }
    EXPECT_GT(held, 0) << "some copy of the optimizer part is held by the barrier alone";
    EXPECT_EQ(a.r.optimizer_start, barrier);
    EXPECT_EQ(a.r.step_seconds, std::max(a.r.streams_seconds, barrier + a.r.optimizer_seconds));
    EXPECT_GT(a.r.streams_seconds, barrier) << "the device's updates come after the barrier";
    // On one timeline the host's updates come after every instruction.
    const mf_hwprofile serial = profile(link, 0);
    Sim b(s, serial);
    expect_accounting(s, b.r);
    EXPECT_EQ(b.r.step_seconds, b.r.streams_seconds + b.r.optimizer_seconds);
    EXPECT_EQ(b.r.optimizer_start, b.r.streams_seconds);
  }
  // No optimizer on the device: the barrier is the streams' end.
  const mf_schedule *h = build(streamed());
  EXPECT_EQ(h->optim_begin, h->n_instr);
  Sim c(h, profile(1));
  EXPECT_EQ(c.r.optimizer_barrier, c.r.streams_seconds);
  EXPECT_EQ(c.r.device_optimizer_seconds, 0);
}

INSTANTIATE_TEST_SUITE_P(Shapes, Simulate, ::testing::Values(0, 1, 2),
                         [](const ::testing::TestParamInfo<int> &i) {
                           return std::string(make_shape(i.param).name);
                         });

TEST(SimulateErrors, BadArguments) {
  mf_hwprofile hw = profile(1);
  mf_sim_result r;
  memset(&r, 0, sizeof r);
  EXPECT_EQ(mf_simulate(nullptr, &hw, nullptr, &r), MF_ERR_INVALID_ARG);
  EXPECT_EQ(mf_simulate(nullptr, &hw, nullptr, nullptr), MF_ERR_INVALID_ARG);
  mf_sim_result_free(&r);
  mf_sim_result_free(nullptr);
}

// A profile without the rates to price the program is an error, not NaN times.
TEST(SimulateErrors, ProfileThatCannotPriceTheProgram) {
  Shape sh = make_shape(0);
  mf_param_table *t = nullptr;
  ASSERT_EQ(mf_param_table_build(&sh.spec, &t), MF_OK);
  mf_program_opts po = {2, 48, 1, 0.01, 16, 0};
  mf_program *p = nullptr;
  ASSERT_EQ(mf_program_build(t, &po, &p), MF_OK) << mf_last_error();
  mf_decisions *d = nullptr;
  ASSERT_EQ(mf_decisions_create(p, &d), MF_OK);
  mf_schedule *s = nullptr;
  ASSERT_EQ(mf_schedule_build(p, d, &s), MF_OK) << mf_last_error();
  mf_sim_result r;
  memset(&r, 0, sizeof r);
  mf_hwprofile hw = profile(1);
  hw.n_gemm = 0;
  EXPECT_EQ(mf_simulate(s, &hw, nullptr, &r), MF_ERR_INVALID_ARG);
  EXPECT_NE(std::string(mf_last_error()).find("cannot price"), std::string::npos) << mf_last_error();
  EXPECT_EQ(r.start, nullptr);
  hw = profile(1);
  hw.h2d_bandwidth = 0;
  EXPECT_EQ(mf_simulate(s, &hw, nullptr, &r), MF_ERR_INVALID_ARG);
  hw = profile(1);
  hw.host_adamw_params_per_s = 0;
  EXPECT_EQ(mf_simulate(s, &hw, nullptr, &r), MF_ERR_INVALID_ARG);
  EXPECT_NE(std::string(mf_last_error()).find("optimizer"), std::string::npos) << mf_last_error();
  hw = profile(1);
  ASSERT_EQ(mf_simulate(s, &hw, nullptr, &r), MF_OK) << mf_last_error();
  EXPECT_GT(r.step_seconds, 0);
  mf_sim_result_free(&r);
  mf_schedule_free(s);
  mf_decisions_free(d);
  mf_program_free(p);
  mf_param_table_free(t);
}

// A 48-layer, 128-expert program with every weight and gradient streamed
// over two micro-batches (about 1.6 10^5 instructions) simulates in well under a second.
TEST(SimulateScale, LargeProgramIsFast) {
  mf_model_spec sp;
  mf_model_spec_defaults(MF_FAMILY_QWEN3_MOE, &sp);
  sp.hidden = 2048, sp.layers = 48, sp.heads = 32, sp.kv_heads = 4, sp.head_dim = 128, sp.experts = 128;
  sp.top_k = 8, sp.expert_ffn = 768, sp.vocab = 151936, sp.max_seq = 4096, sp.rope_theta = 1e6;
  mf_param_table *t = nullptr;
  ASSERT_EQ(mf_param_table_build(&sp, &t), MF_OK) << mf_last_error();
  mf_program_opts po = {1, 4096, 2, 0.01, 8192, 0};
  mf_program *p = nullptr;
  ASSERT_EQ(mf_program_build(t, &po, &p), MF_OK) << mf_last_error();
  mf_decisions *d = nullptr;
  ASSERT_EQ(mf_decisions_create(p, &d), MF_OK);
  for (int32_t i = 0; i < d->n_params; i++) d->param[i] = MF_PARAM_STREAM, d->grad[i] = MF_GRAD_STREAM;
  mf_schedule *s = nullptr;
  ASSERT_EQ(mf_schedule_build(p, d, &s), MF_OK) << mf_last_error();
  EXPECT_GT(s->n_instr, 100000);
  const mf_hwprofile hw = profile(1);
  mf_sim_result r;
  memset(&r, 0, sizeof r);
  const auto a = std::chrono::steady_clock::now();
  ASSERT_EQ(mf_simulate(s, &hw, nullptr, &r), MF_OK) << mf_last_error();
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - a).count();
  printf(
      "simulated %d instructions, %d slots in %.3f s: step %.2f s (compute %.2f, exposed %.2f, optimizer "
      "%.2f)\n",
      s->n_instr, s->n_slots, secs, r.step_seconds, r.compute_seconds, r.exposed_transfer_seconds,
      r.optimizer_seconds);
  EXPECT_LT(secs, 1.0);
  EXPECT_EQ(r.peak_live_bytes, s->peak_live_bytes);
  EXPECT_GT(r.exposed_transfer_seconds, 0);
  mf_sim_result_free(&r);
  mf_schedule_free(s);
  mf_decisions_free(d);
  mf_program_free(p);
  mf_param_table_free(t);
}

TEST(SimulateForwardOnly, HasNoOptimizer) {
  Shape sh = make_shape(0);
  mf_param_table *t = nullptr;
  ASSERT_EQ(mf_param_table_build(&sh.spec, &t), MF_OK);
  mf_program_opts po = {2, 48, 1, 0.01, 16, 1};
  mf_program *p = nullptr;
  ASSERT_EQ(mf_program_build(t, &po, &p), MF_OK) << mf_last_error();
  mf_decisions *d = nullptr;
  ASSERT_EQ(mf_decisions_create(p, &d), MF_OK);
  mf_schedule *s = nullptr;
  ASSERT_EQ(mf_schedule_build(p, d, &s), MF_OK) << mf_last_error();
  Sim a(s, profile(1));
  EXPECT_EQ(a.r.optimizer_seconds, 0);
  EXPECT_EQ(a.r.step_seconds, a.r.streams_seconds);
  EXPECT_EQ(a.r.d2h_bytes, 0u);
  mf_schedule_free(s);
  mf_decisions_free(d);
  mf_program_free(p);
  mf_param_table_free(t);
}

}  // namespace

namespace {

// Measured routing prices an expert's copies by the chance they happen: an
// expert with no share is never copied once its micro-batch's routing is
// known (every gradient; a weight whose dispatch precedes its upload), one
// with a large share always is; without routing every copy costs in full.
TEST(SimulateRouting, ExpertCopiesCostTheirChanceOfHappening) {
  mf_model_spec spec = make_shape(2).spec;  // OLMoE-like: many small experts, top-4
  spec.experts = 16;
  mf_param_table *t = nullptr;
  ASSERT_EQ(mf_param_table_build(&spec, &t), MF_OK) << mf_last_error();
  mf_program_opts po = {1, 8, 2, 0.01, 16, 0, MF_ORDER_MICRO_MAJOR, MF_DTYPE_F32};
  mf_program *p = nullptr;
  ASSERT_EQ(mf_program_build(t, &po, &p), MF_OK) << mf_last_error();
  mf_decisions *d = nullptr;
  ASSERT_EQ(mf_decisions_create(p, &d), MF_OK);
  for (int32_t i = 0; i < d->n_params; i++) d->param[i] = MF_PARAM_STREAM, d->grad[i] = MF_GRAD_STREAM;
  mf_schedule *s = nullptr;
  ASSERT_EQ(mf_schedule_build(p, d, &s), MF_OK) << mf_last_error();
  // Experts 0..3 take every token; 4..15 none.
  std::vector<double> share((size_t)(spec.layers * spec.experts), 0.0);
  for (int64_t l = 0; l < spec.layers; l++)
    for (int e = 0; e < 4; e++) share[(size_t)(l * spec.experts + e)] = 0.25;
  mf_hwprofile hw = small_profile(1);
  mf_sim_opts plain{}, routed{};
  routed.expert_share = share.data();
  mf_sim_result a{}, b{};
  ASSERT_EQ(mf_simulate(s, &hw, &plain, &a), MF_OK) << mf_last_error();
  ASSERT_EQ(mf_simulate(s, &hw, &routed, &b), MF_OK) << mf_last_error();
  int idle_free = 0, hot_full = 0, others_same = 0;
  for (int32_t i = 0; i < s->n_instr; i++) {
    const mf_instr &in = s->instr[i];
    if (in.kind != MF_I_H2D && in.kind != MF_I_D2H) continue;
    const mf_ptensor &x = p->tensors[s->slots[in.slot].tensor];
    const int expert = x.param >= 0 ? t->params[x.param].expert : -1;
    if (expert < 0) {
      EXPECT_EQ(b.cost[i], a.cost[i]) << x.name;  // not an expert: unchanged
      others_same++;
    } else if (expert >= 4) {
      // Idle: a gradient copy is always skipped; a weight upload when its routing is known by then.
      if (x.kind == MF_T_GRAD || b.cost[i] == 0.0) {
        EXPECT_EQ(b.cost[i], 0.0) << x.name;
        idle_free++;
      } else {
        EXPECT_EQ(b.cost[i], a.cost[i]) << x.name << ": routing not known yet";
      }
    } else {
      // 1 - (1 - 4 * 0.25)^8 = 1: always copied.
      EXPECT_DOUBLE_EQ(b.cost[i], a.cost[i]) << x.name;
      hot_full++;
    }
  }
  EXPECT_GT(idle_free, 0);
  EXPECT_GT(hot_full, 0);
  EXPECT_GT(others_same, 0);
  EXPECT_LE(b.step_seconds, a.step_seconds);
  EXPECT_LT(b.busy[MF_SIM_H2D] + b.busy[MF_SIM_D2H], a.busy[MF_SIM_H2D] + a.busy[MF_SIM_D2H]);
  mf_sim_result_free(&a);
  mf_sim_result_free(&b);
  mf_schedule_free(s);
  mf_decisions_free(d);
  mf_program_free(p);
  mf_param_table_free(t);
}

}  // namespace

namespace {

// Expert parallelism's exchanges move each other rank's share of the rows at
// the link between a machine's GPUs; a group over two nodes sends the other
// node's shares over the network meanwhile (the slower of the two), and a
// profile without a network figure prices them all at the link.
TEST(SimulateExchanges, AGroupOverNodesCrossesTheNetwork) {
  Shape sh = make_shape(0);
  mf_param_table *t = nullptr;
  ASSERT_EQ(mf_param_table_build(&sh.spec, &t), MF_OK);
  mf_program_opts po = {2, 16, 1, 0.01, 16, 0};
  po.ranks = 4;
  po.ep = 4;
  mf_hwprofile hw = profile(1);
  hw.nvlink_bandwidth = 100e9;
  for (const int64_t node_ranks : {4, 2}) {
    po.node_ranks = node_ranks;
    mf_program *p = nullptr;
    ASSERT_EQ(mf_program_build(t, &po, &p), MF_OK) << mf_last_error();
    int32_t k = 0;
    while (k < p->n_ops && p->ops[k].kind != MF_K_EP_DISPATCH) k++;
    ASSERT_LT(k, p->n_ops);
    const double share = (double)p->tensors[p->ops[k].t[2]].bytes / 16;  // to each rank: R rows / 4
    for (const double net : {0.0, 1e9}) {
      hw.network_bandwidth = net;
      const double want = node_ranks == 4 || net == 0
                              ? 3 * share / 100e9 + hw.launch_s
                              : std::max(share / 100e9, 2 * share / net) + hw.launch_s;
      EXPECT_DOUBLE_EQ(mf_sim_op_seconds(p, k, &hw), want) << node_ranks << " a node, network " << net;
    }
    mf_program_free(p);
  }
  mf_param_table_free(t);
}

}  // namespace
