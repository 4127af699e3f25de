// The order between streams decided once (mf_schedule_waits): on small
// programs in both micro-batch orders and under decision sets that exercise
// every instruction kind, the waits equal a brute-force derivation of the
// rules in schedule.h (every earlier instruction considered, no bookkeeping,
// no interval structure); they are computed once and shared by every caller,
// from any thread; and the simulation that times them gives the step times
// the simulator gave before it used them (golden numbers it printed).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "kernels/backend.h"
#include "planner/hwprofile.h"
#include "planner/schedule.h"
#include "planner/simulate.h"
#include "src/core/core.h"
#include "src/model/params.h"
#include "src/model/program.h"
#include "tests/planner/planner_test_util.h"

namespace {

using namespace mf_pt;

// A small program of one of the test shapes, in one micro-batch order, and
// decision sets over it (owned here).
struct Prog {
  std::unique_ptr<mf_param_table, void (*)(mf_param_table *)> t{nullptr, mf_param_table_free};
  std::unique_ptr<mf_program, void (*)(mf_program *)> prog{nullptr, mf_program_free};
  std::vector<std::unique_ptr<mf_decisions, void (*)(mf_decisions *)>> decs;
  mf_program *p = nullptr;
  Prog(int shape, mf_program_order order) {
    Shape sh = make_shape(shape);
    mf_param_table *pt = nullptr;
    EXPECT_EQ(mf_param_table_build(&sh.spec, &pt), MF_OK) << mf_last_error();
    t.reset(pt);
    mf_program_opts po = {2, 48, 2, 0.01, 16, 0, order};
    EXPECT_EQ(mf_program_build(pt, &po, &p), MF_OK) << mf_last_error();
    prog.reset(p);
  }
  mf_decisions *fresh() {
    mf_decisions *d = nullptr;
    EXPECT_EQ(mf_decisions_create(p, &d), MF_OK);
    decs.emplace_back(d, mf_decisions_free);
    return d;
  }
  // Decision sets that exercise every instruction kind and dependency: all
  // resident; weights and gradients streamed; every activation offloaded;
  // random mixes; the optimizer on the device for some parameters.
  std::vector<const mf_decisions *> variety() {
    std::vector<const mf_decisions *> v;
    v.push_back(fresh());
    mf_decisions *d = fresh();
    for (int32_t i = 0; i < d->n_params; i++) d->param[i] = MF_PARAM_STREAM, d->grad[i] = MF_GRAD_STREAM;
    v.push_back(d);
    mf_decisions *o = fresh();
    for (int32_t t = 0; t < p->n_tensors; t++)
      if (mf_schedule_can_offload(p, t)) o->act[t] = MF_ACT_OFFLOAD;
    for (int32_t i = 0; i < o->n_params; i++) o->param[i] = MF_PARAM_STREAM;
    v.push_back(o);
    std::mt19937 rng(23);
    for (int trial = 0; trial < 3; trial++) {
      mf_decisions *mx = fresh();
      for (int32_t i = 0; i < mx->n_params; i++) mx->param[i] = rng() % 2, mx->grad[i] = rng() % 2;
      for (int32_t t = 0; t < p->n_tensors; t++) {
        const int r = (int)(rng() % 3);
        if (r == 1 && mf_schedule_can_offload(p, t)) mx->act[t] = MF_ACT_OFFLOAD;
        if (r == 2 && mf_schedule_can_recompute(p, t)) mx->act[t] = MF_ACT_RECOMPUTE;
      }
      v.push_back(mx);
    }
    for (int every : {2, 3}) {
      mf_decisions *dm = fresh();
      for (int32_t i = 0; i < dm->n_params; i++) {
        const bool dev = i % every == 1;
        dm->param[i] = dev ? MF_PARAM_RESIDENT : MF_PARAM_STREAM;
        dm->grad[i] = dev ? MF_GRAD_DEVICE : MF_GRAD_STREAM;
        dm->optim[i] = dev ? MF_OPTIM_DEVICE : MF_OPTIM_HOST;
      }
      if (every == 3)
        for (int32_t t = 0; t < p->n_tensors; t++)
          if (mf_schedule_can_recompute(p, t)) dm->act[t] = MF_ACT_RECOMPUTE;
      v.push_back(dm);
    }
    return v;
  }
};

// A slow link, so that copies, and the waits for them, show in the step.
mf_hwprofile slow_profile() {
  mf_hwprofile hw = small_profile(1);
  hw.h2d_bandwidth = hw.d2h_bandwidth = 2e8;
  return hw;
}

struct Golden {
  double step, step_overlap, starts;
};

// The step times (host optimizer after the barrier, and overlapped) and a
// checksum of every start time.
Golden measure(const mf_schedule *s, const mf_hwprofile &hw) {
  Golden g{};
  for (int ov = 0; ov < 2; ov++) {
    mf_sim_opts o{};
    o.overlap_optimizer = ov;
    mf_sim_result r;
    EXPECT_EQ(mf_simulate(s, &hw, &o, &r), MF_OK) << mf_last_error();
    (ov ? g.step_overlap : g.step) = r.step_seconds;
    if (!ov)
      for (int32_t i = 0; i < r.n_instr; i++) g.starts += r.start[i] * (double)(i % 97 + 1);
    mf_sim_result_free(&r);
  }
  return g;
}

int stream_of(const mf_instr &in) {
  return in.kind == MF_I_H2D ? 1 : in.kind == MF_I_D2H ? 2 : 0;  // compute, h2d, d2h
}

// The slots instruction i touches: (slot, reads, writes), one entry per
// slot, from the backend's role table (not the program's stored roles).
struct Access {
  int32_t slot;
  bool rd, wr;
};

std::vector<Access> accesses(const mf_schedule *s, int32_t i) {
  const mf_program *p = s->prog;
  const mf_instr &in = s->instr[i];
  std::vector<Access> v;
  auto add = [&](int32_t slot, bool rd, bool wr) {
    for (Access &a : v)
      if (a.slot == slot) {
        a.rd |= rd, a.wr |= wr;
        return;
      }
    v.push_back({slot, rd, wr});
  };
  switch (in.kind) {
    case MF_I_H2D:
    case MF_I_ZERO:
      add(in.slot, false, true);
      break;
    case MF_I_D2H:
      add(in.slot, true, false);
      break;
    case MF_I_ACCUM:
      add(in.slot, true, false);
      add(in.slot2, true, true);
      break;
    default: {
      const mf_pop &o = p->ops[in.op];
      mf_kernel_call c;
      memset(&c, 0, sizeof c);
      c.kind = o.kind;
      memcpy(c.i, o.i, sizeof c.i);
      const uint32_t rd = mf_kernel_reads(&c), wr = mf_kernel_writes(&c);
      for (int k = 0; k < MF_KBUF_MAX; k++)
        if (s->slot_pool[in.operands + k] >= 0) add(s->slot_pool[in.operands + k], rd >> k & 1, wr >> k & 1);
      if (o.experts_at >= 0)
        for (int64_t e = 0; e < p->spec.experts; e++)
          add(s->slot_pool[in.operands + MF_KBUF_MAX + e], true, mf_kernel_writes_experts(o.kind) != 0);
    }
  }
  return v;
}

// schedule.h's rules, quadratically: for each instruction every earlier one
// it depends on, then the latest of each other stream.
std::vector<int32_t> brute_waits(const mf_schedule *s) {
  const mf_program *p = s->prog;
  const int32_t n = s->n_instr;
  struct Use {
    int32_t instr;
    bool rd, wr;
  };
  std::vector<std::vector<Access>> acc(n);
  std::vector<std::vector<Use>> uses(s->n_slots);  // each slot's accesses, in instruction order
  for (int32_t i = 0; i < n; i++) {
    acc[i] = accesses(s, i);
    for (const Access &a : acc[i]) uses[a.slot].push_back({i, a.rd, a.wr});
  }
  auto bytes = [&](int32_t x) { return p->tensors[s->slots[x].tensor].bytes; };
  std::vector<int32_t> out(3 * (size_t)n, -1);
  for (int32_t i = 0; i < n; i++) {
    std::vector<int32_t> deps;
    for (const Access &a : acc[i]) {
      int32_t lw = -1;  // RAW/WAW: the last earlier write
      for (const Use &u : uses[a.slot])
        if (u.instr < i && u.wr) lw = u.instr;
      if (lw >= 0) deps.push_back(lw);
      if (a.wr)  // WAR: the reads since
        for (const Use &u : uses[a.slot])
          if (u.instr > lw && u.instr < i && u.rd) deps.push_back(u.instr);
    }
    for (int32_t x = 0; x < s->n_slots; x++) {  // memory: what held the bytes of a slot filled here
      if (s->slots[x].first != i || !bytes(x)) continue;
      const size_t a0 = s->slots[x].offset, a1 = a0 + bytes(x);
      for (int32_t y = 0; y < s->n_slots; y++) {
        const mf_slot &sy = s->slots[y];
        if (y == x || sy.persist || sy.last >= i || !bytes(y)) continue;
        if (!(sy.offset < a1 && a0 < sy.offset + bytes(y))) continue;
        for (const Use &u : uses[y]) deps.push_back(u.instr);
      }
    }
    const mf_instr &in = s->instr[i];
    if (in.kind == MF_I_H2D && s->host_offset[s->slots[in.slot].tensor] != SIZE_MAX)  // host
      for (int32_t j = 0; j < i; j++)
        if (s->instr[j].kind == MF_I_D2H && s->slots[s->instr[j].slot].tensor == s->slots[in.slot].tensor)
          deps.push_back(j);
    for (int32_t j : deps) {
      const int q = stream_of(s->instr[j]);
      if (q != stream_of(in)) out[3 * (size_t)i + q] = std::max(out[3 * (size_t)i + q], j);
    }
  }
  return out;
}

TEST(Waits, EqualABruteForceDerivation) {
  int waited = 0, memory = 0;
  for (int shape = 0; shape < 3; shape++)
    for (mf_program_order order : {MF_ORDER_MICRO_MAJOR, MF_ORDER_LAYER_MAJOR}) {
      Prog g(shape, order);
      int k = 0;
      for (const mf_decisions *d : g.variety()) {
        SCOPED_TRACE(testing::Message() << "shape " << shape << " order " << order << " decisions " << k++);
        mf_schedule *s = nullptr;
        ASSERT_EQ(mf_schedule_build(g.p, d, &s), MF_OK) << mf_last_error();
        EXPECT_EQ(s->waits, nullptr) << "computed before it is asked for";
        const int32_t *w = nullptr;
        ASSERT_EQ(mf_schedule_waits(s, &w), MF_OK) << mf_last_error();
        const std::vector<int32_t> want = brute_waits(s);
        int bad = 0;
        for (int32_t i = 0; i < s->n_instr && bad < 5; i++)
          for (int q = 0; q < 3; q++)
            if (w[3 * i + q] != want[3 * (size_t)i + q] && bad++ < 5)
              ADD_FAILURE() << "instruction " << i << " stream " << q << ": " << w[3 * i + q]
                            << ", brute force " << want[3 * (size_t)i + q];
        for (int32_t i = 0; i < s->n_instr; i++) {
          waited += w[3 * i] >= 0 || w[3 * i + 1] >= 0 || w[3 * i + 2] >= 0;
          memory += s->instr[i].kind == MF_I_H2D && w[3 * i + 2] >= 0;
        }
        mf_schedule_free(s);
      }
    }
  EXPECT_GT(waited, 1000);
  EXPECT_GT(memory, 0);  // uploads waiting for the d2h stream: a copy home, or memory it still reads
}

// Computed once, kept by the schedule; threads asking at once get one array.
TEST(Waits, DecidedOnceForEveryCaller) {
  Prog g(1, MF_ORDER_MICRO_MAJOR);
  mf_schedule *s = nullptr;
  ASSERT_EQ(mf_schedule_build(g.p, g.variety()[2], &s), MF_OK) << mf_last_error();
  std::vector<const int32_t *> got(4, nullptr);
  std::vector<std::thread> th;
  for (size_t t = 0; t < got.size(); t++)
    th.emplace_back([&, t] { EXPECT_EQ(mf_schedule_waits(s, &got[t]), MF_OK); });
  for (auto &t : th) t.join();
  for (const int32_t *w : got) EXPECT_EQ(w, got[0]);
  EXPECT_EQ(s->waits, got[0]);
  const int32_t *again = nullptr;
  ASSERT_EQ(mf_schedule_waits(s, &again), MF_OK);
  EXPECT_EQ(again, got[0]);
  // The simulation times the same array.
  const mf_hwprofile hw = slow_profile();
  mf_sim_result r;
  ASSERT_EQ(mf_simulate(s, &hw, nullptr, &r), MF_OK) << mf_last_error();
  EXPECT_EQ(s->waits, got[0]);
  mf_sim_result_free(&r);
  mf_schedule_free(s);
}

// Printed with MF_PRINT_GOLDEN=1: {shape, order, decisions, {step, step with
// the host optimizer overlapped, checksum of the start times}}. First printed
// by the simulator before it timed the waits (its own RAW/WAW/WAR, memory and
// host rules per slot, at commit 40d76af), which the waits reproduced exactly;
// printed again by this simulator when the schedule changed under it (the
// step's first contribution to a device-summed gradient added straight into
// the step's sum, 2026-11-27: one ZERO and one ACCUM less per parameter).
struct GoldenRow {
  int shape, order, decisions;
  Golden g;
};
const GoldenRow kGolden[] = {
    {0, 0, 0, {0x1.e8798e7cd4145p-8, 0x1.e09a24a801c82p-8, 0x1.7d7341d190ea6p+6}},
    {0, 0, 1, {0x1.a3766c61e0becp-7, 0x1.9f86b7777798ap-7, 0x1.c57bd37daa9e8p+7}},
    {0, 0, 2, {0x1.30dd934f9acb1p-6, 0x1.2ee5b8da6638p-6, 0x1.a27ba79eee55fp+8}},
    {0, 0, 3, {0x1.db99789f69886p-7, 0x1.d7a9c3b500624p-7, 0x1.0616cd7533f57p+8}},
    {0, 0, 4, {0x1.a76c54b7c94ap-7, 0x1.a37c9fcd6023ep-7, 0x1.cfe1ad846c90ap+7}},
    {0, 0, 5, {0x1.bec647fa1efa6p-7, 0x1.bad6930fb5d44p-7, 0x1.e95661906709ap+7}},
    {0, 0, 6, {0x1.3cee9a6850be1p-7, 0x1.3cee9a6850be1p-7, 0x1.68711e813caep+7}},
    {0, 0, 7, {0x1.becfeb0199995p-7, 0x1.becfeb0199995p-7, 0x1.3f1709343d3a2p+8}},
    {0, 1, 0, {0x1.dda2f0cbd3abap-8, 0x1.d5c386f7015f7p-8, 0x1.5e4bbc447e04bp+6}},
    {0, 1, 1, {0x1.17a751ee284a8p-7, 0x1.13b79d03bf246p-7, 0x1.0e231c3c8b469p+7}},
    {0, 1, 2, {0x1.ed2b7f1941977p-7, 0x1.e93bca2ed8715p-7, 0x1.1f652a6cc1f3p+8}},
    {0, 1, 3, {0x1.72ead3ffe4296p-7, 0x1.6efb1f157b034p-7, 0x1.90e993b8a4ba2p+7}},
    {0, 1, 4, {0x1.546b93d71fd23p-7, 0x1.507bdeecb6ac1p-7, 0x1.5ab0ae9446816p+7}},
    {0, 1, 5, {0x1.5c1e2b3cae566p-7, 0x1.582e765245304p-7, 0x1.701c9f04739fp+7}},
    {0, 1, 6, {0x1.d4bd251cc198bp-8, 0x1.d4bd251cc198bp-8, 0x1.d84c3014b487fp+6}},
    {0, 1, 7, {0x1.6968ec8106c95p-7, 0x1.6968ec8106c95p-7, 0x1.e1cb7fa6ab02fp+7}},
    {1, 0, 0, {0x1.25ded93634111p-7, 0x1.22e507563596dp-7, 0x1.5da50c3cfbe87p+7}},
    {1, 0, 1, {0x1.c5cbf5b90988dp-7, 0x1.c2d223d90b0e9p-7, 0x1.6ba501fa168b6p+8}},
    {1, 0, 2, {0x1.5412f41ae6d86p-6, 0x1.52960b2ae79b4p-6, 0x1.5764b7a83030ep+9}},
    {1, 0, 3, {0x1.d463fda7f75abp-7, 0x1.d16a2bc7f8e07p-7, 0x1.8754d7d0a5b7fp+8}},
    {1, 0, 4, {0x1.d2705bcfe2eb3p-7, 0x1.cf7689efe470fp-7, 0x1.74a653a654c41p+8}},
    {1, 0, 5, {0x1.c6778b365b59ap-7, 0x1.c37db9565cdf6p-7, 0x1.712aa2985de93p+8}},
    {1, 0, 6, {0x1.7ad19c2e383bbp-7, 0x1.7ad19c2e383bbp-7, 0x1.3631b3f168f5fp+8}},
    {1, 0, 7, {0x1.f89cabbf2d743p-7, 0x1.f89cabbf2d743p-7, 0x1.fa0527ca2a77dp+8}},
    {1, 1, 0, {0x1.264fa1b32b81bp-7, 0x1.2355cfd32d077p-7, 0x1.46e4211b19109p+7}},
    {1, 1, 1, {0x1.37bbafce4c43fp-7, 0x1.34c1ddee4dc9bp-7, 0x1.ba784e89d7ad9p+7}},
    {1, 1, 2, {0x1.255dec1b26089p-6, 0x1.23e1032b26cb7p-6, 0x1.eea1323c77b13p+8}},
    {1, 1, 3, {0x1.9c0067891a288p-7, 0x1.990695a91bae4p-7, 0x1.33595f5636497p+8}},
    {1, 1, 4, {0x1.805102add88bbp-7, 0x1.7d5730cdda117p-7, 0x1.1910ccc10403fp+8}},
    {1, 1, 5, {0x1.92fe483a99689p-7, 0x1.9004765a9aee5p-7, 0x1.296288c1ba5c4p+8}},
    {1, 1, 6, {0x1.1d43a33c06765p-7, 0x1.1d43a33c06765p-7, 0x1.afec125c54e92p+7}},
    {1, 1, 7, {0x1.9b959d35b0664p-7, 0x1.9b959d35b0664p-7, 0x1.91715dc154b26p+8}},
    {2, 0, 0, {0x1.32bb4da54da35p-7, 0x1.2e8d51cfbaf07p-7, 0x1.36add9c2479afp+8}},
    {2, 0, 1, {0x1.0bafcb2f1ef3p-6, 0x1.0998cd4455999p-6, 0x1.90a7ca1395fdfp+9}},
    {2, 0, 2, {0x1.7f0b15355af8dp-6, 0x1.7cf4174a919f6p-6, 0x1.4f645017f74p+10}},
    {2, 0, 3, {0x1.fb5a068f43e56p-7, 0x1.f72c0ab9b1328p-7, 0x1.4fd2d811330bep+9}},
    {2, 0, 4, {0x1.fdbc987208544p-7, 0x1.f98e9c9c75a16p-7, 0x1.458f4731093bep+9}},
    {2, 0, 5, {0x1.1357a93cd85bp-6, 0x1.1140ab520f019p-6, 0x1.6973f5bc2d908p+9}},
    {2, 0, 6, {0x1.854872c33d9dp-7, 0x1.854872c33d9dp-7, 0x1.2a866d967dd4p+9}},
    {2, 0, 7, {0x1.2e7c77f24052p-6, 0x1.2e7c77f24052p-6, 0x1.1469d24a7fca7p+10}},
    {2, 1, 0, {0x1.344764ab6bcebp-7, 0x1.301968d5d91bdp-7, 0x1.2cc902a87a27fp+8}},
    {2, 1, 1, {0x1.648aed4f1070fp-7, 0x1.605cf1797dbe1p-7, 0x1.cdaececa513c4p+8}},
    {2, 1, 2, {0x1.3bc04ed3e762cp-6, 0x1.39a950e91e095p-6, 0x1.9ad77b92f1ac9p+9}},
    {2, 1, 3, {0x1.9042d8c2a457ep-7, 0x1.8c14dced11a5p-7, 0x1.e2c7e0686a5f8p+8}},
    {2, 1, 4, {0x1.a912fef852982p-7, 0x1.a4e50322bfe54p-7, 0x1.f0c8f2ef42bc6p+8}},
    {2, 1, 5, {0x1.cd911eca104e3p-7, 0x1.c96322f47d9b5p-7, 0x1.0e0847c6e22b2p+9}},
    {2, 1, 6, {0x1.2752d1ca67b41p-7, 0x1.2752d1ca67b41p-7, 0x1.9bc2912362deap+8}},
    {2, 1, 7, {0x1.e0188095c1c7ep-7, 0x1.e0188095c1c7ep-7, 0x1.9d35442be1b23p+9}},
};

TEST(Waits, SimulationGivesTheStepTimesItGaveBefore) {
  const mf_hwprofile hw = slow_profile();
  size_t row = 0;
  for (int shape = 0; shape < 3; shape++)
    for (mf_program_order order : {MF_ORDER_MICRO_MAJOR, MF_ORDER_LAYER_MAJOR}) {
      Prog g(shape, order);
      int k = 0;
      for (const mf_decisions *d : g.variety()) {
        ASSERT_LT(row, sizeof kGolden / sizeof kGolden[0]);
        const GoldenRow &want = kGolden[row++];
        ASSERT_EQ(want.shape * 100 + want.order * 10 + want.decisions, shape * 100 + (int)order * 10 + k++);
        mf_schedule *s = nullptr;
        ASSERT_EQ(mf_schedule_build(g.p, d, &s), MF_OK) << mf_last_error();
        const Golden m = measure(s, hw);
        EXPECT_EQ(m.step, want.g.step) << "shape " << shape << " order " << order << " decisions " << k - 1;
        EXPECT_EQ(m.step_overlap, want.g.step_overlap) << "shape " << shape << " order " << order;
        EXPECT_EQ(m.starts, want.g.starts) << "shape " << shape << " order " << order;
        mf_schedule_free(s);
      }
    }
  EXPECT_EQ(row, sizeof kGolden / sizeof kGolden[0]);
}

TEST(Waits, PrintGolden) {
  if (!getenv("MF_PRINT_GOLDEN")) GTEST_SKIP();
  const mf_hwprofile hw = slow_profile();
  for (int shape = 0; shape < 3; shape++)
    for (mf_program_order order : {MF_ORDER_MICRO_MAJOR, MF_ORDER_LAYER_MAJOR}) {
      Prog g(shape, order);
      int k = 0;
      for (const mf_decisions *d : g.variety()) {
        mf_schedule *s = nullptr;
        ASSERT_EQ(mf_schedule_build(g.p, d, &s), MF_OK) << mf_last_error();
        const Golden m = measure(s, hw);
        printf("    {%d, %d, %d, {%a, %a, %a}},\n", shape, (int)order, k++, m.step, m.step_overlap, m.starts);
        mf_schedule_free(s);
      }
    }
}

}  // namespace
