// The executor's copies through the pinned staging arena (src/exec/exec.h,
// "the pinned staging arena"): every kind of plan gives the same losses,
// gradients, weights, moments and routing counts with the copies staged as
// straight, or with half the copies left out of the layout to go straight (a
// pinned home's), on immediate streams and on the cpu backend's deferred streams
// (kernels/backend.h: lazy runs kernels and copies late and host functions
// early, copies-first the other way round), with every slab poisoned once
// used; the gradients reach the host optimizer's hand-off final; a missing
// wait between slabs that share bytes is caught; bad layouts are refused.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "planner/plan.h"
#include "planner/schedule.h"
#include "planner/staging.h"
#include "src/core/core.h"
#include "src/exec/exec.h"
#include "src/model/params.h"
#include "src/model/program.h"
#include "src/optim/optim.h"
#include "tests/planner/planner_test_util.h"

namespace {

enum class Plan { kResident, kStreamOffload, kMixed, kStreamKeep };

struct Result {
  std::vector<double> losses;
  std::vector<float> grads, w;
  std::vector<int64_t> tokens;
  uint64_t h2d_all = 0, d2h_all = 0;  // bytes moved + bytes skipped, summed over the steps
  uint64_t skipped = 0;               // bytes skipped (idle experts), both ways
  mf_status status = MF_OK;           // the first failed step's (RunOpts.tolerate_errors)
  int hooks_ok = 1;
};

struct RunOpts {
  mf_cpu_streams mode = MF_CPU_STREAMS_IMMEDIATE;
  bool staged = false;
  bool mixed = false; /* the layout with some copies left out to go straight (Staged::mixed) */
  mf_exec_staging_opts so = {1, 1, 0};
  bool hooks = false;
  bool tolerate_errors = false;  // a failed step ends the run and is reported, not a test failure
};

// The parameters' upload waits and gradient hand-offs: each hand-off must see
// the gradient's final value, once per step.
struct Hooks {
  const mf_param_table *t = nullptr;
  const float *grads = nullptr;
  std::vector<std::vector<float>> seen;
  std::vector<int> calls;
  int waits = 0;
  static mf_status Wait(void *ctx, int32_t) {
    ((Hooks *)ctx)->waits++;
    return MF_OK;
  }
  static void Home(void *ctx, int32_t i) {
    Hooks *h = (Hooks *)ctx;
    const mf_param &q = h->t->params[i];
    h->seen[(size_t)i].assign(h->grads + q.offset, h->grads + q.offset + q.numel);
    h->calls[(size_t)i]++;
  }
};

struct Staged {
  mf_param_table *t = nullptr;
  mf_program *p = nullptr;
  mf_hwprofile hw;
  mf_plan *pl = nullptr;
  mf_staging *sg = nullptr;
  // The same schedule's layout without about half its copies, which go
  // straight (the pinned home's way, planner/run_plan.h): chosen by tensor so
  // that an offloaded activation's two copies agree.
  mf_staging *mixed = nullptr;
  int32_t n_direct = 0;
  std::vector<std::vector<int32_t>> ids, tg;
  static constexpr int kSteps = 3;

  // shape: planner_test_util's; small batch on the many-expert shape so that
  // some experts get no token.
  void Build(int shape, mf_program_order order, Plan plan, size_t max_slab) {
    mf_pt::Shape sh = mf_pt::make_shape(shape);
    ASSERT_EQ(mf_param_table_build(&sh.spec, &t), MF_OK) << mf_last_error();
    mf_program_opts po = {};
    po.micro_batch = shape == 2 ? 1 : 2, po.seq_len = shape == 2 ? 8 : 16, po.grad_accum = 2,
    po.aux_coef = 0.01;
    po.order = order;
    ASSERT_EQ(mf_program_build(t, &po, &p), MF_OK) << mf_last_error();
    mf_decisions *d = nullptr;
    ASSERT_EQ(mf_decisions_create(p, &d), MF_OK);
    std::mt19937 rng(11);
    std::vector<uint8_t> opt((size_t)p->n_tensors + 1);
    ASSERT_EQ(mf_schedule_act_options(p, opt.data()), MF_OK);
    for (int32_t i = 0; i < d->n_params; i++) {
      if (plan == Plan::kStreamOffload || plan == Plan::kStreamKeep)
        d->param[i] = MF_PARAM_STREAM, d->grad[i] = MF_GRAD_STREAM;
      if (plan == Plan::kMixed) {
        d->param[i] = (uint8_t)(rng() % 2), d->grad[i] = (uint8_t)(rng() % 2);
        if (i % 3 == 0)
          d->param[i] = MF_PARAM_RESIDENT, d->grad[i] = MF_GRAD_DEVICE, d->optim[i] = MF_OPTIM_DEVICE;
      }
    }
    for (int32_t x = 0; x < p->n_tensors; x++) {
      if (plan == Plan::kStreamOffload && (opt[x] & 1)) d->act[x] = MF_ACT_OFFLOAD;
      if (plan == Plan::kMixed && opt[x]) d->act[x] = (uint8_t)(rng() % (opt[x] == 3 ? 3 : 2));
    }
    hw = mf_pt::small_profile(1);
    ASSERT_EQ(mf_plan_evaluate(p, &hw, d, UINT64_MAX / 2, MF_PLAN_CHOSEN, &pl), MF_OK) << mf_last_error();
    mf_decisions_free(d);
    mf_staging_opts o = {0, max_slab, 0, nullptr};
    ASSERT_EQ(mf_staging_build(pl->s, &pl->sim, &hw, &o, &sg), MF_OK) << mf_last_error();
    std::vector<uint8_t> direct((size_t)pl->s->n_instr, 0);
    for (int32_t i = 0; i < pl->s->n_instr; i++) {
      const mf_instr *in = &pl->s->instr[i];
      if (in->kind != MF_I_H2D && in->kind != MF_I_D2H) continue;
      if (in->kind == MF_I_H2D && in->persist) continue; /* straight always (planner/staging.c) */
      direct[(size_t)i] = (uint8_t)(pl->s->slots[in->slot].tensor * 2654435761u >> 7 & 1);
      n_direct += direct[(size_t)i];
    }
    o.direct = direct.data();
    ASSERT_EQ(mf_staging_build(pl->s, &pl->sim, &hw, &o, &mixed), MF_OK) << mf_last_error();
    EXPECT_EQ(mixed->n_copies + n_direct, sg->n_copies);
    for (int32_t i = 0; i < pl->s->n_instr; i++) {
      if (direct[(size_t)i]) {
        EXPECT_EQ(mixed->copy_of_instr[i], -1) << i;
      }
    }
    const int64_t n = po.micro_batch * po.seq_len;
    for (int m = 0; m < 2 * kSteps; m++) {
      ids.emplace_back((size_t)n);
      tg.emplace_back((size_t)n);
      for (auto &v : ids.back()) v = (int32_t)(rng() % 64);
      for (auto &v : tg.back()) v = (int32_t)(rng() % 64);
    }
  }
  ~Staged() {
    mf_staging_free(sg);
    mf_staging_free(mixed);
    mf_plan_free(pl);
    mf_program_free(p);
    mf_param_table_free(t);
  }

  // kSteps steps with the host's weights fixed (the steps differ through
  // their batches and the device's updates); an unclipped AdamW on the device
  // for the parameters whose optimizer is there.
  Result Run(const RunOpts &ro) {
    const mf_schedule *s = pl->s;
    Result out;
    const size_t n = (size_t)t->total_numel;
    out.w.resize(n);
    mf_params_init_random(t, 9, 0.3f, out.w.data());
    std::vector<float> g(n), m(n), v(n);
    std::vector<int64_t> step((size_t)t->n, 0);
    std::vector<uint8_t> update((size_t)t->n, 0);
    // The checking mode on (immediate streams only): every copy and kernel operand in live arena memory.
    mf_cpu_backend_opts o = {nullptr, 0, 1, mf_optim_run_kernel, ro.mode};
    mf_backend *b = nullptr;
    EXPECT_EQ(mf_backend_cpu_create(&o, &b), MF_OK);
    mf_exec *x = nullptr;
    EXPECT_EQ(mf_exec_create_scheduled(p, s, b, &x), MF_OK) << mf_last_error();
    if (!x) {
      mf_backend_free(b);
      return out;
    }
    if (ro.staged) {
      EXPECT_EQ(mf_exec_use_staging(x, ro.mixed ? mixed : sg, &ro.so), MF_OK) << mf_last_error();
    }
    Hooks hk;
    hk.t = t;
    hk.grads = g.data();
    hk.seen.resize((size_t)t->n);
    if (ro.hooks) {
      const mf_exec_param_hooks h = {&hk, Hooks::Wait, Hooks::Home};
      mf_exec_set_param_hooks(x, &h);
    }
    mf_exec_set_optim_state(x, m.data(), v.data());
    for (int st = 0; st < kSteps; st++) {
      const int32_t *ip[2] = {ids[2 * st].data(), ids[2 * st + 1].data()};
      const int32_t *tp[2] = {tg[2 * st].data(), tg[2 * st + 1].data()};
      std::fill(g.begin(), g.end(), 0.0f);
      hk.calls.assign((size_t)t->n, 0);
      mf_step_result r;
      const mf_status sst = mf_exec_step(x, out.w.data(), ip, tp, g.data(), &r);
      if (sst != MF_OK && ro.tolerate_errors) {
        out.status = sst;
        break;
      }
      EXPECT_EQ(sst, MF_OK) << mf_last_error();
      out.losses.push_back(r.loss);
      out.losses.push_back((double)r.tokens);
      out.grads.insert(out.grads.end(), g.begin(), g.end());
      const int64_t *tok = mf_exec_expert_tokens(x);
      out.tokens.insert(out.tokens.end(), tok, tok + p->spec.layers * p->spec.experts);
      mf_exec_stats z;
      mf_exec_stats_get(x, &z);
      out.h2d_all += z.h2d_bytes + z.h2d_skipped_bytes;
      out.d2h_all += z.d2h_bytes + z.d2h_skipped_bytes;
      out.skipped += z.h2d_skipped_bytes + z.d2h_skipped_bytes;
      EXPECT_EQ(z.staged, ro.staged ? 1 : 0);
      if (ro.staged) {
        EXPECT_GE(z.fill_s, 0.0);
        EXPECT_GE(z.drain_s, 0.0);
      } else {
        EXPECT_TRUE(std::isnan(z.fill_s));
      }
      if (ro.hooks)  // every gradient that went home was handed over once, final
        for (int32_t i = 0; i < t->n; i++) {
          if (hk.calls[(size_t)i] == 0) continue;
          const mf_param &q = t->params[i];
          if (hk.calls[(size_t)i] != 1 ||
              !std::equal(hk.seen[(size_t)i].begin(), hk.seen[(size_t)i].end(), g.begin() + q.offset))
            out.hooks_ok = 0;
        }
      if (s->n_optim_device) {
        for (int32_t i = 0; i < t->n; i++) {
          update[i] = s->optim_device[i];
          step[i] += update[i];
        }
        const mf_exec_optim a = {1e-2, 0.9, 0.95, 1e-8, 0.1, 1.0, step.data(), update.data(), nullptr};
        EXPECT_EQ(mf_exec_optimize(x, &a), MF_OK) << mf_last_error();
      }
    }
    if (out.status == MF_OK) {
      EXPECT_EQ(mf_exec_sync_home(x, out.w.data(), 1), MF_OK);
    }
    out.w.insert(out.w.end(), m.begin(), m.end());
    out.w.insert(out.w.end(), v.begin(), v.end());
    if (ro.hooks) {
      EXPECT_GT(hk.waits, 0);
    }
    mf_exec_free(x);
    mf_backend_free(b);
    return out;
  }
};

bool Same(const Result &a, const Result &b) {
  return a.status == b.status && a.losses == b.losses && a.grads == b.grads && a.w == b.w &&
         a.tokens == b.tokens;
}

class ExecStaging : public ::testing::TestWithParam<std::tuple<int, Plan, mf_program_order>> {};

TEST_P(ExecStaging, StagedCopiesGiveTheSameBits) {
  Staged S;
  S.Build(std::get<0>(GetParam()), std::get<2>(GetParam()), std::get<1>(GetParam()), 4096);
  ASSERT_FALSE(HasFailure());
  ASSERT_GT(S.sg->n_slabs, 2);
  RunOpts ref_opts;
  ref_opts.hooks = true;
  const Result ref = S.Run(ref_opts);
  ASSERT_FALSE(HasFailure());
  EXPECT_TRUE(ref.hooks_ok);
  struct Variant {
    const char *name;
    mf_cpu_streams mode;
    int threads;
  };
  ASSERT_GT(S.n_direct, 0);
  for (const Variant &v :
       {Variant{"immediate", MF_CPU_STREAMS_IMMEDIATE, 1}, Variant{"lazy", MF_CPU_STREAMS_LAZY, 1},
        Variant{"copies first", MF_CPU_STREAMS_COPIES_FIRST, 1},
        Variant{"lazy, 3 host threads", MF_CPU_STREAMS_LAZY, 3},
        Variant{"half straight, immediate", MF_CPU_STREAMS_IMMEDIATE, 1},
        Variant{"half straight, lazy", MF_CPU_STREAMS_LAZY, 1},
        Variant{"half straight, copies first", MF_CPU_STREAMS_COPIES_FIRST, 2}}) {
    SCOPED_TRACE(v.name);
    RunOpts ro;
    ro.mode = v.mode;
    ro.staged = true;
    ro.mixed = strncmp(v.name, "half straight", 13) == 0;
    ro.so = {v.threads, 1, 0};
    ro.hooks = true;
    const Result r = S.Run(ro);
    ASSERT_FALSE(HasFailure());
    EXPECT_EQ(r.losses, ref.losses);
    EXPECT_TRUE(r.grads == ref.grads) << "gradients differ";
    EXPECT_TRUE(r.w == ref.w) << "weights or moments differ";
    EXPECT_EQ(r.tokens, ref.tokens);
    EXPECT_EQ(r.h2d_all, ref.h2d_all);
    EXPECT_EQ(r.d2h_all, ref.d2h_all);
    EXPECT_TRUE(r.hooks_ok) << "a gradient was handed over before its final value, or twice";
  }
}

std::string Name(const ::testing::TestParamInfo<ExecStaging::ParamType> &i) {
  static const char *const plans[] = {"resident", "stream_offload", "mixed"};
  return std::string(std::get<0>(i.param) == 1 ? "dense_shared_" : "many_experts_") +
         plans[(int)std::get<1>(i.param)] +
         (std::get<2>(i.param) == MF_ORDER_LAYER_MAJOR ? "_layer_major" : "_micro_major");
}

INSTANTIATE_TEST_SUITE_P(Plans, ExecStaging,
                         ::testing::Combine(::testing::Values(1, 2),
                                            ::testing::Values(Plan::kResident, Plan::kStreamOffload,
                                                              Plan::kMixed),
                                            ::testing::Values(MF_ORDER_MICRO_MAJOR, MF_ORDER_LAYER_MAJOR)),
                         Name);

// The many-expert shape routes no token to some experts: their uploads and
// gradients are skipped through the arena too (where the routing is known in
// time: always on immediate streams).
TEST(ExecStagingIdle, IdleExpertsSkipTheirCopies) {
  Staged S;
  S.Build(2, MF_ORDER_MICRO_MAJOR, Plan::kStreamOffload, 0);
  ASSERT_FALSE(HasFailure());
  const Result ref = S.Run(RunOpts());
  RunOpts ro;
  ro.staged = true;
  const Result r = S.Run(ro);
  ASSERT_FALSE(HasFailure());
  int idle = 0;
  for (int64_t c : r.tokens) idle += c == 0;
  EXPECT_GT(idle, 0) << "no idle expert: the case does not test the skip";
  // A slab's copies are decided when it is filled, before some of them are
  // reached: an expert weight filled before its layer's routing is known goes
  // up even where the straight copy, decided at its own instruction, skips.
  EXPECT_GT(r.skipped, 0u);
  EXPECT_LE(r.skipped, ref.skipped);
  EXPECT_TRUE(Same(r, ref));
}

// Without the waits between slabs that share bytes, the deferred streams run
// a fill over an upload still queued (lazy) or an upload over a copy-out still
// queued (copies first): the results change, or a kernel refuses what it
// reads (token ids overwritten by other bytes). Streamed weights and
// gradients, activations kept: the bytes that can go wrong are floats and
// token ids, which the kernels check (corrupted routing state offloaded
// through the arena would make a kernel read out of bounds instead).
TEST(ExecStagingWaits, DroppedWaitsAreCaught) {
  Staged S;
  S.Build(1, MF_ORDER_MICRO_MAJOR, Plan::kStreamKeep, 4096);
  ASSERT_FALSE(HasFailure());
  ASSERT_LT(S.sg->arena_bytes, S.sg->sum_slab_bytes) << "no slab shares bytes: nothing to wait for";
  const Result ref = S.Run(RunOpts());
  ASSERT_FALSE(HasFailure());
  for (mf_cpu_streams mode : {MF_CPU_STREAMS_LAZY, MF_CPU_STREAMS_COPIES_FIRST}) {
    SCOPED_TRACE(mode == MF_CPU_STREAMS_LAZY ? "lazy" : "copies first");
    RunOpts ro;
    ro.mode = mode;
    ro.staged = true;
    ro.so = {1, 1, 0};
    EXPECT_TRUE(Same(S.Run(ro), ref)) << "with the waits";
    ro.so.drop_waits = 1;
    ro.tolerate_errors = true;
    EXPECT_FALSE(Same(S.Run(ro), ref)) << "without the waits";
  }
}

TEST(ExecStagingLayout, BadLayoutsAreRefused) {
  Staged A, B;
  A.Build(1, MF_ORDER_MICRO_MAJOR, Plan::kStreamOffload, 4096);
  B.Build(2, MF_ORDER_MICRO_MAJOR, Plan::kStreamOffload, 4096);
  ASSERT_FALSE(HasFailure());
  mf_cpu_backend_opts o = {nullptr, 0, 0, mf_optim_run_kernel, MF_CPU_STREAMS_IMMEDIATE};
  mf_backend *b = nullptr;
  ASSERT_EQ(mf_backend_cpu_create(&o, &b), MF_OK);
  mf_exec *x = nullptr;
  ASSERT_EQ(mf_exec_create_scheduled(A.p, A.pl->s, b, &x), MF_OK) << mf_last_error();
  EXPECT_EQ(mf_exec_use_staging(x, B.sg, nullptr), MF_ERR_INVALID_ARG) << "another schedule's layout";
  EXPECT_NE(std::string(mf_last_error()).find("staging layout"), std::string::npos) << mf_last_error();
  // A slab moved into the other direction's region.
  mf_staging bad = *A.sg;
  std::vector<mf_staging_slab> slabs(A.sg->slabs, A.sg->slabs + A.sg->n_slabs);
  slabs[0].offset = A.sg->h2d_region_bytes;
  bad.slabs = slabs.data();
  EXPECT_EQ(mf_exec_use_staging(x, &bad, nullptr), MF_ERR_INVALID_ARG);
  // Waits that name a slab not submitted before the one waiting, or none.
  bad = *A.sg;
  std::vector<int32_t> wait_slab(A.sg->wait_slab, A.sg->wait_slab + A.sg->n_slabs);
  std::vector<int32_t> wait_host(A.sg->wait_host, A.sg->wait_host + A.sg->n_slabs);
  bad.wait_slab = wait_slab.data();
  bad.wait_host = wait_host.data();
  ASSERT_GE(A.sg->n_h2d_slabs, 2);
  wait_slab[0] = 1;  // a later slab
  EXPECT_EQ(mf_exec_use_staging(x, &bad, nullptr), MF_ERR_INVALID_ARG);
  EXPECT_NE(std::string(mf_last_error()).find("not an earlier one"), std::string::npos) << mf_last_error();
  wait_slab[0] = -1;
  int32_t reads_home = -1;  // an H2D slab that uploads an offloaded activation
  for (int32_t k = 0; k < A.sg->n_h2d_slabs && reads_home < 0; k++)
    if (A.sg->wait_host[k] >= 0) reads_home = k;
  ASSERT_GE(reads_home, 0) << "no slab reads an offloaded activation home";
  wait_host[reads_home] = -1;
  EXPECT_EQ(mf_exec_use_staging(x, &bad, nullptr), MF_ERR_INVALID_ARG);
  EXPECT_NE(std::string(mf_last_error()).find("waits for no copy-out"), std::string::npos) << mf_last_error();
  wait_host[reads_home] = A.sg->n_slabs - 1;  // the last D2H slab: copied out after this fill
  EXPECT_EQ(mf_exec_use_staging(x, &bad, nullptr), MF_ERR_INVALID_ARG);
  bad.wait_host = nullptr;
  EXPECT_EQ(mf_exec_use_staging(x, &bad, nullptr), MF_ERR_INVALID_ARG);
  EXPECT_EQ(mf_exec_use_staging(x, A.sg, nullptr), MF_OK) << mf_last_error();
  EXPECT_EQ(mf_exec_use_staging(x, A.sg, nullptr), MF_ERR_INVALID_ARG) << "twice";
  mf_exec_free(x);
  mf_backend_free(b);
  // A backend that cannot run host functions.
  ASSERT_EQ(mf_backend_cpu_create(&o, &b), MF_OK);
  b->host_fn = nullptr;
  ASSERT_EQ(mf_exec_create_scheduled(A.p, A.pl->s, b, &x), MF_OK) << mf_last_error();
  EXPECT_EQ(mf_exec_use_staging(x, A.sg, nullptr), MF_ERR_UNSUPPORTED);
  mf_exec_free(x);
  mf_backend_free(b);
}

}  // namespace
