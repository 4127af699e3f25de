// The optimizer on the device (planner/schedule.h MF_OPTIM_DEVICE, src/exec
// mf_exec_optimize): a training loop whose plan updates some parameters on
// the device gives the same bits as the one updating every parameter on the
// host — weights, both moments, every step's loss — with gradient clipping
// active, a skipped step before the first update, experts no token reached,
// fp32 and bf16 moments. The cpu backend runs in checking mode, so a
// persistent slot another tensor overwrote, or one released between steps,
// fails the run. Also: what the schedule moves per step.
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

struct Shape {
  const char *name;
  mf_family family;
  int64_t experts, top_k, B, S, G;
};

// Which parameters a run updates on the device.
enum class Where { kHost, kEveryOther, kAll };

struct Outcome {
  std::vector<float> w;
  std::vector<uint8_t> m, v;  // the moments, in the moment dtype
  std::vector<double> losses, norms;
  int clipped = 0, idle_updates_skipped = 0;
  uint64_t h2d_step2 = 0, d2h_step2 = 0;  // bytes the second step moved
  uint64_t sched_h2d = 0, sched_d2h = 0;
};

class DeviceOptim : public ::testing::TestWithParam<std::tuple<Shape, mf_dtype>> {
 protected:
  void SetUp() override {
    const Shape &sh = std::get<0>(GetParam());
    moments_ = std::get<1>(GetParam());
    mf_model_spec s;
    mf_model_spec_defaults(sh.family, &s);
    s.hidden = 32, s.layers = 2, s.heads = 4, s.kv_heads = 2, s.head_dim = 8, s.experts = sh.experts;
    s.top_k = sh.top_k, s.expert_ffn = 16, s.vocab = 64, s.max_seq = 64, s.rope_theta = 10000.0;
    s.clip_qkv = 0;
    if (sh.family == MF_FAMILY_GLM4_MOE || sh.family == MF_FAMILY_DEEPSEEK_V3)  // dense layer 0, shared, bias
      s.dense_ffn = 32, s.shared_ffn = 16, s.n_group = 2, s.topk_group = 1, s.routed_scaling = 2.5;
    if (sh.family == MF_FAMILY_DEEPSEEK_V3)  // latent attention
      s.kv_heads = 4, s.q_lora_rank = 12, s.kv_lora_rank = 10, s.qk_nope_dim = 4, s.qk_rope_dim = 4,
      s.v_head_dim = 6, s.head_dim = 8, s.first_dense = 1;
    if (sh.family == MF_FAMILY_GPT_OSS) s.sliding_window = 3;  // layer 0 slides
    ASSERT_EQ(mf_param_table_build(&s, &t_), MF_OK) << mf_last_error();
    mf_program_opts po = {};
    po.micro_batch = sh.B, po.seq_len = sh.S, po.grad_accum = sh.G;
    po.aux_coef = s.router != MF_ROUTER_SIGMOID_GROUP ? 0.01 : 0.0;  // GLM-4.5's loss has none
    po.moments = moments_;
    ASSERT_EQ(mf_program_build(t_, &po, &p_), MF_OK) << mf_last_error();
    std::mt19937 rng(11);
    const int64_t n = sh.B * sh.S;
    for (int64_t m = 0; m < sh.G * kSteps; m++) {
      ids_.emplace_back(n);
      tg_.emplace_back(n);
      for (auto &x : ids_.back()) x = (int32_t)(rng() % 64);
      for (auto &x : tg_.back()) x = (int32_t)(rng() % 64);
    }
  }
  void TearDown() override {
    mf_program_free(p_);
    mf_param_table_free(t_);
  }

  // kSteps steps; step 1 is skipped (as a non-finite gradient would make it)
  // so the device state's first fill comes after a step without an update.
  Outcome train(Where where) {
    Outcome out;
    const Shape &sh = std::get<0>(GetParam());
    const size_t ms = mf_dtype_size(moments_);
    const size_t n = (size_t)t_->total_numel;
    out.w.resize(n);
    mf_params_init_random(t_, 5, 0.3f, out.w.data());
    out.m.assign(n * ms, 0);
    out.v.assign(n * ms, 0);
    std::vector<float> g(n);
    std::vector<int64_t> steps((size_t)t_->n, 0);
    std::vector<uint8_t> update((size_t)t_->n), decays((size_t)t_->n);
    std::vector<const double *> ext((size_t)t_->n, nullptr);
    std::vector<mf_optim_buf> bufs((size_t)t_->n);

    mf_decisions *d = nullptr;
    EXPECT_EQ(mf_decisions_create(p_, &d), MF_OK);
    for (int32_t i = 0; i < d->n_params; i++) {
      decays[i] = t_->params[i].ndim == 2;
      d->optim[i] =
          !t_->params[i].frozen && (where == Where::kAll || (where == Where::kEveryOther && i % 2 == 1))
              ? MF_OPTIM_DEVICE
              : MF_OPTIM_HOST;  // a frozen one (glm4_moe's router bias) has no optimizer
    }
    mf_schedule *s = nullptr;
    EXPECT_EQ(mf_schedule_build(p_, d, &s), MF_OK) << mf_last_error();
    mf_backend *b = nullptr;
    mf_cpu_backend_opts bo = {nullptr, 0, 1, mf_optim_run_kernel};
    EXPECT_EQ(mf_backend_cpu_create(&bo, &b), MF_OK);
    mf_exec *x = nullptr;
    EXPECT_EQ(mf_exec_create_scheduled(p_, s, b, &x), MF_OK) << mf_last_error();
    if (!x) return out;
    out.sched_h2d = s->h2d_bytes;
    out.sched_d2h = s->d2h_bytes;
    mf_exec_set_optim_state(x, out.m.data(), out.v.data());
    mf_config_train tc{};
    tc.lr = 3e-3, tc.beta1 = 0.9, tc.beta2 = 0.95, tc.eps = 1e-8, tc.weight_decay = 0.1;
    for (int step = 1; step <= kSteps; step++) {
      std::vector<const int32_t *> ip, tp;
      for (int64_t m = 0; m < sh.G; m++) {
        ip.push_back(ids_[(size_t)((step - 1) * sh.G + m)].data());
        tp.push_back(tg_[(size_t)((step - 1) * sh.G + m)].data());
      }
      mf_step_result r;
      EXPECT_EQ(mf_exec_step(x, out.w.data(), ip.data(), tp.data(), g.data(), &r), MF_OK) << mf_last_error();
      out.losses.push_back(r.loss);
      if (step == 2) {
        mf_exec_stats z;
        mf_exec_stats_get(x, &z);
        out.h2d_step2 = z.h2d_bytes + z.h2d_skipped_bytes;
        out.d2h_step2 = z.d2h_bytes + z.d2h_skipped_bytes;
      }
      const int64_t *tok = mf_exec_expert_tokens(x);
      for (int64_t i = 0; i < t_->n; i++) {
        const mf_param *q = &t_->params[i];
        if (q->frozen) {  // glm4_moe's router bias: no gradient, no update (toff -1)
          bufs[i] = {nullptr, 0}, ext[i] = nullptr, update[i] = 0;
          continue;
        }
        const bool has = q->expert < 0 || mf_family_idle_expert_has_grad(t_->spec.family) ||
                         tok[q->layer * t_->spec.experts + q->expert] > 0;
        const bool dev = s->optim_device[i];
        // gradients and moments are the trained parameters' (toff); the weights all (offset)
        bufs[i] = {has && !dev ? g.data() + q->toff : nullptr, has ? (size_t)q->numel : 0};
        ext[i] = dev ? mf_exec_norm_sums(x) + p_->norm_first[i] : nullptr;
        update[i] = dev && has;
        if (!has) out.idle_updates_skipped++;
      }
      double norm = 0;
      EXPECT_EQ(mf_optim_grad_norm_ext(bufs.data(), bufs.size(), ext.data(), nullptr, &norm), MF_OK);
      out.norms.push_back(norm);
      if (step == 1) continue;  // skipped: nothing updated, nothing counted
      const double coef = mf_optim_clip_coef(norm, kClip);
      out.clipped += coef < 1.0;
      if (coef < 1.0) {
        EXPECT_EQ(mf_optim_grad_scale(bufs.data(), bufs.size(), coef, nullptr), MF_OK);
      }
      mf_adamw_hparams h = mf_adamw_hparams_from_config(&tc, tc.lr);
      for (int64_t i = 0; i < t_->n; i++) {
        if (!bufs[i].n) continue;
        steps[i]++;
        if (s->optim_device[i]) continue;
        const mf_param *q = &t_->params[i];
        mf_adamw_hparams hi = h;
        if (!decays[i]) hi.weight_decay = 0;
        const mf_adamw_bufs ab = {out.w.data() + q->offset,
                                  g.data() + q->toff,
                                  out.m.data() + q->toff * ms,
                                  out.v.data() + q->toff * ms,
                                  nullptr,
                                  (size_t)q->numel,
                                  MF_DTYPE_F32,
                                  moments_};
        EXPECT_EQ(mf_adamw_update_bufs(&hi, steps[i], &ab, nullptr), MF_OK) << mf_last_error();
      }
      const mf_exec_optim a = {h.lr, h.beta1,      h.beta2,       h.eps,        h.weight_decay,
                               coef, steps.data(), update.data(), decays.data()};
      EXPECT_EQ(mf_exec_optimize(x, &a), MF_OK) << mf_last_error();
      // The device optimizer's part is timed apart from the step's (exec.h optim_busy_s).
      mf_exec_stats z;
      mf_exec_stats_get(x, &z);
      if (where == Where::kHost)
        EXPECT_EQ(z.optim_busy_s[MF_EXEC_COMPUTE], 0.0);
      else
        EXPECT_GT(z.optim_busy_s[MF_EXEC_COMPUTE], 0.0);
    }
    EXPECT_EQ(mf_exec_sync_home(x, out.w.data(), 1), MF_OK) << mf_last_error();
    mf_exec_free(x);
    mf_backend_free(b);
    mf_schedule_free(s);
    mf_decisions_free(d);
    return out;
  }

  static constexpr int kSteps = 5;
  static constexpr double kClip = 0.05;  // below the gradients' norm: clipping scales every step
  mf_dtype moments_ = MF_DTYPE_F32;
  mf_param_table *t_ = nullptr;
  mf_program *p_ = nullptr;
  std::vector<std::vector<int32_t>> ids_, tg_;
};

TEST_P(DeviceOptim, SameBitsAsTheHostOptimizer) {
  const Outcome host = train(Where::kHost);
  ASSERT_FALSE(HasFailure());
  EXPECT_GT(host.clipped, 0) << "the test must exercise clipping";
  if (std::get<0>(GetParam()).family == MF_FAMILY_QWEN3_MOE) {
    EXPECT_GT(host.idle_updates_skipped, 0) << "the shape must leave experts without tokens";
  }
  for (Where where : {Where::kEveryOther, Where::kAll}) {
    SCOPED_TRACE(where == Where::kAll ? "all on the device" : "every other on the device");
    const Outcome dev = train(where);
    ASSERT_FALSE(HasFailure());
    EXPECT_EQ(dev.losses, host.losses);
    EXPECT_EQ(dev.norms, host.norms);
    EXPECT_TRUE(dev.w == host.w) << "final weights differ";
    EXPECT_TRUE(dev.m == host.m) << "first moments differ";
    EXPECT_TRUE(dev.v == host.v) << "second moments differ";
    // The weights the device updates are not uploaded per step, their
    // gradients not copied home: the schedule and the executed step agree.
    EXPECT_LT(dev.sched_h2d, host.sched_h2d);
    EXPECT_LT(dev.sched_d2h, host.sched_d2h);
    EXPECT_EQ(dev.h2d_step2, dev.sched_h2d);
  }
  // The weights moved: the comparison is not between two untouched copies.
  std::vector<float> w0((size_t)t_->total_numel);
  mf_params_init_random(t_, 5, 0.3f, w0.data());
  EXPECT_FALSE(w0 == host.w);
}

TEST_P(DeviceOptim, PersistentSlotsSpanTheStepAndShareNoBytes) {
  mf_decisions *d = nullptr;
  ASSERT_EQ(mf_decisions_create(p_, &d), MF_OK);
  for (int32_t i = 0; i < d->n_params; i++)
    d->optim[i] = i % 3 == 0 && !t_->params[i].frozen ? MF_OPTIM_DEVICE : MF_OPTIM_HOST;
  mf_schedule *s = nullptr;
  ASSERT_EQ(mf_schedule_build(p_, d, &s), MF_OK) << mf_last_error();
  int persistent = 0;
  uint64_t state_bytes = 0;
  for (int32_t i = 0; i < s->n_slots; i++) {
    const mf_slot &a = s->slots[i];
    const mf_ptensor &t = p_->tensors[a.tensor];
    // and a frozen weight kept resident (glm4_moe's router bias): nothing changes it, one upload holds
    const bool want =
        t.kind == MF_T_OPT ||
        (t.kind == MF_T_PARAM && (d->optim[t.param] == MF_OPTIM_DEVICE ||
                                  (t_->params[t.param].frozen && d->param[t.param] == MF_PARAM_RESIDENT)));
    ASSERT_EQ((bool)a.persist, want) << t.name;
    if (!a.persist) continue;
    persistent++;
    if (t.kind == MF_T_OPT) state_bytes += t.bytes;
    EXPECT_EQ(a.first, 0) << t.name;
    EXPECT_EQ(a.last, s->n_instr - 1) << t.name;
    for (int32_t j = 0; j < s->n_slots; j++) {  // no other slot ever overlaps its bytes
      if (j == i) continue;
      const mf_slot &o = s->slots[j];
      const size_t ob = p_->tensors[o.tensor].bytes;
      EXPECT_TRUE(o.offset + ob <= a.offset || a.offset + t.bytes <= o.offset)
          << t.name << " shares bytes with " << p_->tensors[o.tensor].name;
    }
  }
  EXPECT_GT(persistent, 0);
  // Each device parameter's state: m and v in the moment dtype.
  uint64_t want_state = 0;
  for (int32_t i = 0; i < d->n_params; i++)
    if (d->optim[i] == MF_OPTIM_DEVICE)
      want_state += 2 * (uint64_t)t_->params[i].numel * mf_dtype_size(moments_);
  EXPECT_EQ(state_bytes, want_state);
  // The optimizer part follows every copy home; only its own instructions are in it.
  ASSERT_LT(s->optim_begin, s->n_instr);
  for (int32_t i = s->optim_begin; i < s->n_instr; i++) {
    const mf_instr &in = s->instr[i];
    if (in.kind == MF_I_RUN) {
      EXPECT_EQ(p_->ops[in.op].kind, MF_K_ADAMW) << p_->ops[in.op].label;
    } else {
      EXPECT_EQ(in.kind, MF_I_H2D);
      EXPECT_TRUE(in.persist);
    }
  }
  // Device optimizer needs resident weights and device gradients.
  d->param[0] = MF_PARAM_STREAM;
  mf_schedule *bad = nullptr;
  EXPECT_EQ(mf_schedule_build(p_, d, &bad), MF_ERR_CONFIG);
  EXPECT_NE(std::string(mf_last_error()).find("resident"), std::string::npos) << mf_last_error();
  mf_schedule_free(s);
  mf_decisions_free(d);
}

const Shape kShapes[] = {
    {"mixtral", MF_FAMILY_MIXTRAL, 4, 2, 2, 16, 2},
    {"qwen3_many_small", MF_FAMILY_QWEN3_MOE, 32, 2, 1, 4, 2},    // 16 assignments a step: idle experts
    {"olmoe_idle_with_grad", MF_FAMILY_OLMOE, 16, 2, 1, 4, 1},    // idle experts still get a (zero) gradient
    {"glm4_moe_frozen_bias", MF_FAMILY_GLM4_MOE, 8, 2, 2, 8, 2},  // a parameter frozen in a full fine-tune
    {"deepseek_v3_mla", MF_FAMILY_DEEPSEEK_V3, 8, 2, 2, 8, 2},    // latent attention's own weights
    {"gpt_oss_sinks_biases", MF_FAMILY_GPT_OSS, 8, 2, 2, 8, 2},   // sinks, biases, idle experts decayed
};

INSTANTIATE_TEST_SUITE_P(Shapes, DeviceOptim,
                         ::testing::Combine(::testing::ValuesIn(kShapes),
                                            ::testing::Values(MF_DTYPE_F32, MF_DTYPE_BF16)),
                         [](const ::testing::TestParamInfo<DeviceOptim::ParamType> &i) {
                           return std::string(std::get<0>(i.param).name) +
                                  (std::get<1>(i.param) == MF_DTYPE_BF16 ? "_bf16" : "_fp32");
                         });

}  // namespace
