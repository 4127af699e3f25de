// The order of a step over its micro-batches (src/model/program.h): the
// layer-major program is the micro-batch-major one reordered stage by stage,
// its derived op indices (lifetimes, cross-entropy ops) follow the new order,
// and on the cpu backend it gives bit-identical losses and gradients to the
// micro-batch-major order under any schedule decisions (fp32 and bf16
// rounding; G = 1, 2, 3). Also the bf16 device storage: sizes, and the cpu
// executor's refusal.
#include <gtest/gtest.h>

#include <cmath>
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

namespace {

struct Shape {
  const char *name;
  mf_model_spec spec;
};

// 0: plain mixtral; 1: qwen2_moe with a dense layer, a shared expert and qkv
// biases; 2: qwen3_moe with every other layer dense and q/k norm.
Shape make_shape(int which) {
  Shape sh;
  mf_model_spec &s = sh.spec;
  const mf_family fam[3] = {MF_FAMILY_MIXTRAL, MF_FAMILY_QWEN2_MOE, MF_FAMILY_QWEN3_MOE};
  sh.name = which == 0 ? "mixtral" : which == 1 ? "qwen2_dense_shared" : "qwen3_sparse_step";
  mf_model_spec_defaults(fam[which], &s);
  s.hidden = 32, s.layers = 3, s.heads = 4, s.kv_heads = 2, s.head_dim = 8, s.experts = 8, s.top_k = 2;
  s.expert_ffn = 16, s.vocab = 64, s.max_seq = 64, s.rope_theta = 10000.0;
  if (which == 1) s.shared_ffn = 24, s.dense_ffn = 20, s.n_mlp_only = 1, s.mlp_only_layers[0] = 0;
  if (which == 2) s.dense_ffn = 20, s.decoder_sparse_step = 2;
  return sh;
}

mf_program *build(const mf_param_table *t, int64_t G, mf_program_order order, int64_t B = 2, int64_t S = 12,
                  mf_dtype storage = MF_DTYPE_INVALID) {
  mf_program_opts po = {B, S, G, 0.01, 16, 0, order, storage};
  mf_program *p = nullptr;
  EXPECT_EQ(mf_program_build(t, &po, &p), MF_OK) << mf_last_error();
  return p;
}

// The position of an op in the layer-major order, from what the op is (not
// from how the program builds it): the setup, the embedding's forward (with
// the aux statistics' zeroing), each layer's forward, the loss part (final
// norm, aux value, cross-entropy), the final norm's backward, each layer's
// backward from the last, the embedding's backward; then the optimizer's
// NORM and OPTIM ops.
int block_of(const mf_pop &o, int64_t L) {
  if (o.phase == MF_PHASE_SETUP) return 0;
  if (o.phase == MF_PHASE_NORM) return (int)(2 * L + 5);
  if (o.phase == MF_PHASE_OPTIM) return (int)(2 * L + 6);
  if (o.layer >= 0) return o.phase == MF_PHASE_BWD ? (int)(L + 4 + (L - 1 - o.layer)) : (int)(2 + o.layer);
  if (o.phase == MF_PHASE_LOSS || (o.phase == MF_PHASE_FWD && o.kind == MF_K_RMSNORM_FWD)) return (int)L + 2;
  if (o.phase == MF_PHASE_FWD) return 1;
  if (o.kind == MF_K_RMSNORM_BWD) return (int)L + 3;
  EXPECT_EQ(o.kind, MF_K_EMBED_BWD) << o.label;
  return (int)(2 * L + 4);
}

bool same_op(const mf_pop &a, const mf_pop &b) {
  return a.kind == b.kind && a.phase == b.phase && a.micro == b.micro && a.layer == b.layer &&
         memcmp(a.t, b.t, sizeof a.t) == 0 && a.experts_at == b.experts_at && memcmp(a.i, b.i, sizeof a.i) == 0 &&
         strcmp(a.label, b.label) == 0;
}

// Lifetimes recomputed from the op list: the first and last op naming the
// tensor; inputs from their micro-batch's first op; parameters, gradients and
// whole-step tensors the whole step.
void expect_lifetimes(const mf_program *p) {
  std::vector<int32_t> first(p->n_tensors, -1), last(p->n_tensors, -1), micro_first(p->G, -1);
  for (int32_t k = 0; k < p->n_ops; k++) {
    const mf_pop &o = p->ops[k];
    if (o.micro >= 0 && micro_first[o.micro] < 0) micro_first[o.micro] = k;
    std::vector<int32_t> ids(o.t, o.t + MF_KBUF_MAX);
    if (o.experts_at >= 0) ids.insert(ids.end(), p->id_pool + o.experts_at, p->id_pool + o.experts_at + p->spec.experts);
    for (int32_t t : ids) {
      if (t < 0) continue;
      if (first[t] < 0) first[t] = k;
      last[t] = k;
    }
  }
  for (int32_t t = 0; t < p->n_tensors; t++) {
    const mf_ptensor &x = p->tensors[t];
    int32_t f = first[t], l = last[t];
    if (x.kind == MF_T_PARAM || x.kind == MF_T_GRAD || x.micro < 0) {
      f = 0;
      l = p->n_ops - 1;
    } else if (x.kind == MF_T_INPUT && (f < 0 || micro_first[x.micro] < f)) {
      f = micro_first[x.micro];
    }
    ASSERT_EQ(x.first_op, f) << x.name;
    ASSERT_EQ(x.last_op, l) << x.name;
  }
}

class Order : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    sh_ = make_shape(GetParam());
    ASSERT_EQ(mf_param_table_build(&sh_.spec, &t_), MF_OK) << mf_last_error();
  }
  void TearDown() override { mf_param_table_free(t_); }
  Shape sh_;
  mf_param_table *t_ = nullptr;
};

TEST_P(Order, LayerMajorIsTheSameOpsStageByStage) {
  const int64_t L = sh_.spec.layers;
  for (int64_t G : {1, 2, 3}) {
    mf_program *mm = build(t_, G, MF_ORDER_MICRO_MAJOR), *lm = build(t_, G, MF_ORDER_LAYER_MAJOR);
    ASSERT_TRUE(mm && lm);
    EXPECT_EQ(mm->order, MF_ORDER_MICRO_MAJOR);
    EXPECT_EQ(lm->order, MF_ORDER_LAYER_MAJOR);
    ASSERT_EQ(mm->n_ops, lm->n_ops);
    ASSERT_EQ(mm->n_tensors, lm->n_tensors);
    EXPECT_EQ(mm->flops, lm->flops);
    for (int32_t i = 0; i < mm->n_tensors; i++) {
      EXPECT_STREQ(mm->tensors[i].name, lm->tensors[i].name);
      EXPECT_EQ(mm->tensors[i].bytes, lm->tensors[i].bytes);
    }
    // Micro-batch-major: micro-batches one after the other, the stages in
    // build order inside each.
    // The optimizer's NORM and OPTIM ops (of no micro-batch) end both orders.
    int32_t prev_micro = -1;
    bool optimizer_part = false;
    for (int32_t k = 0; k < mm->n_ops; k++) {
      const bool opt = mm->ops[k].phase == MF_PHASE_NORM || mm->ops[k].phase == MF_PHASE_OPTIM;
      ASSERT_TRUE(opt || !optimizer_part) << k << " " << mm->ops[k].label;
      optimizer_part = optimizer_part || opt;
      if (opt) continue;
      ASSERT_GE(mm->ops[k].micro, prev_micro) << k;
      prev_micro = mm->ops[k].micro;
    }
    // Each micro-batch's own ops (and the setup) appear in the same relative
    // order in both: layer-major only interleaves micro-batches.
    for (int32_t m = -1; m < (int32_t)G; m++) {
      std::vector<const mf_pop *> a, b;
      for (int32_t k = 0; k < mm->n_ops; k++)
        if (mm->ops[k].micro == m) a.push_back(&mm->ops[k]);
      for (int32_t k = 0; k < lm->n_ops; k++)
        if (lm->ops[k].micro == m) b.push_back(&lm->ops[k]);
      ASSERT_EQ(a.size(), b.size()) << "micro-batch " << m;
      for (size_t j = 0; j < a.size(); j++) ASSERT_TRUE(same_op(*a[j], *b[j])) << m << " " << a[j]->label;
    }
    // Layer-major: blocks in order, micro-batches ascending inside each block.
    int prev_block = -1;
    prev_micro = -1;
    for (int32_t k = 0; k < lm->n_ops; k++) {
      const mf_pop &o = lm->ops[k];
      int blk = block_of(o, L);
      ASSERT_GE(blk, prev_block) << k << " " << o.label;
      if (blk == prev_block) {
        ASSERT_GE(o.micro, prev_micro) << k << " " << o.label;
      }
      prev_block = blk;
      prev_micro = o.micro;
    }
    EXPECT_EQ(prev_block, (int)(2 * L + 6));
    // With one micro-batch both orders are the same program.
    if (G == 1) {
      for (int32_t k = 0; k < mm->n_ops; k++) ASSERT_TRUE(same_op(mm->ops[k], lm->ops[k])) << k;
    }
    // Derived indices follow the order.
    for (const mf_program *p : {mm, lm}) {
      for (int64_t m = 0; m < G; m++) {
        const mf_pop &ce = p->ops[p->io[m].ce_op];
        EXPECT_EQ(ce.kind, MF_K_CROSS_ENTROPY);
        EXPECT_EQ(ce.micro, m);
        EXPECT_EQ(ce.t[0], p->io[m].final_hidden);
      }
      expect_lifetimes(p);
    }
    mf_program_free(mm);
    mf_program_free(lm);
  }
}

struct Out {
  double loss = 0, ce = 0, aux = 0;
  int64_t tokens = 0;
  std::vector<float> grads;
  size_t peak = 0, sched_peak = 0;
};

Out run(const mf_program *p, const mf_decisions *d, const mf_param_table *t, const std::vector<float> &w,
        const std::vector<std::vector<int32_t>> &ids, const std::vector<std::vector<int32_t>> &tg, int round_bf16) {
  Out o;
  mf_schedule *s = nullptr;
  EXPECT_EQ(mf_schedule_build(p, d, &s), MF_OK) << mf_last_error();
  if (!s) return o;
  mf_cpu_backend_opts bo = {nullptr, round_bf16, 1, nullptr};
  mf_backend *b = nullptr;
  EXPECT_EQ(mf_backend_cpu_create(&bo, &b), MF_OK);
  mf_exec *x = nullptr;
  EXPECT_EQ(mf_exec_create_scheduled(p, s, b, &x), MF_OK) << mf_last_error();
  if (x) {
    std::vector<const int32_t *> ip, tp;
    for (int64_t m = 0; m < p->G; m++) ip.push_back(ids[m].data()), tp.push_back(tg[m].data());
    o.grads.assign((size_t)t->total_numel, 0.0f);
    mf_step_result r;
    EXPECT_EQ(mf_exec_step(x, w.data(), ip.data(), tp.data(), o.grads.data(), &r), MF_OK) << mf_last_error();
    o.loss = r.loss, o.ce = r.ce_loss, o.aux = r.aux_loss, o.tokens = r.tokens;
    o.peak = mf_exec_peak_live_bytes(x);
    o.sched_peak = s->peak_live_bytes;
  }
  mf_exec_free(x);
  mf_backend_free(b);
  mf_schedule_free(s);
  return o;
}

void expect_same(const Out &a, const Out &b, const std::string &what) {
  EXPECT_EQ(a.loss, b.loss) << what;
  EXPECT_EQ(a.ce, b.ce) << what;
  EXPECT_EQ(a.aux, b.aux) << what;
  EXPECT_EQ(a.tokens, b.tokens) << what;
  ASSERT_EQ(a.grads.size(), b.grads.size()) << what;
  size_t diff = 0;
  for (size_t i = 0; i < a.grads.size(); i++) diff += memcmp(&a.grads[i], &b.grads[i], sizeof(float)) != 0;
  EXPECT_EQ(diff, 0u) << what << ": gradients differ in " << diff << " of " << a.grads.size() << " values";
  EXPECT_EQ(b.peak, b.sched_peak) << what << ": executor peak vs schedule peak";
}

// Decision sets, the same for both programs (tensor ids and parameter indices
// do not depend on the order): all resident, weights streamed, gradients
// streamed too, everything offloaded or recomputed, and random mixes.
std::vector<mf_decisions *> decision_sets(const mf_program *p, uint32_t seed) {
  std::vector<mf_decisions *> v;
  auto fresh = [&]() {
    mf_decisions *d = nullptr;
    EXPECT_EQ(mf_decisions_create(p, &d), MF_OK);
    v.push_back(d);
    return d;
  };
  fresh();
  mf_decisions *d = fresh();
  for (int32_t i = 0; i < d->n_params; i++) d->param[i] = MF_PARAM_STREAM;
  d = fresh();
  for (int32_t i = 0; i < d->n_params; i++) d->param[i] = MF_PARAM_STREAM, d->grad[i] = MF_GRAD_STREAM;
  d = fresh();
  for (int32_t t = 0; t < p->n_tensors; t++)
    if (mf_schedule_can_offload(p, t)) d->act[t] = MF_ACT_OFFLOAD;
  d = fresh();
  for (int32_t i = 0; i < d->n_params; i++) d->param[i] = MF_PARAM_STREAM, d->grad[i] = MF_GRAD_STREAM;
  for (int32_t t = 0; t < p->n_tensors; t++)
    if (mf_schedule_can_recompute(p, t)) d->act[t] = MF_ACT_RECOMPUTE;
  std::mt19937 rng(seed);
  for (int trial = 0; trial < 4; trial++) {
    d = fresh();
    for (int32_t i = 0; i < d->n_params; i++) d->param[i] = rng() % 2, d->grad[i] = rng() % 2;
    for (int32_t t = 0; t < p->n_tensors; t++) {
      int r = (int)(rng() % 3);
      if (r == 1 && mf_schedule_can_offload(p, t)) d->act[t] = MF_ACT_OFFLOAD;
      if (r == 2 && mf_schedule_can_recompute(p, t)) d->act[t] = MF_ACT_RECOMPUTE;
    }
  }
  return v;
}

TEST_P(Order, BothOrdersGiveTheSameBits) {
  std::vector<float> w((size_t)t_->total_numel);
  mf_params_init_random(t_, 7, 0.2f, w.data());
  const int64_t B = 2, S = 12;
  for (int64_t G : {1, 2, 3}) {
    std::mt19937 rng((uint32_t)(100 + G));
    std::vector<std::vector<int32_t>> ids(G), tg(G);
    for (int64_t m = 0; m < G; m++) {
      ids[m].resize(B * S);
      tg[m].resize(B * S);
      for (auto &v : ids[m]) v = (int32_t)(rng() % sh_.spec.vocab);
      for (auto &v : tg[m]) v = rng() % 6 == 0 ? -1 : (int32_t)(rng() % sh_.spec.vocab);
    }
    mf_program *mm = build(t_, G, MF_ORDER_MICRO_MAJOR, B, S), *lm = build(t_, G, MF_ORDER_LAYER_MAJOR, B, S);
    ASSERT_TRUE(mm && lm);
    std::vector<mf_decisions *> ds = decision_sets(mm, (uint32_t)(17 + G));
    for (int bf16 = 0; bf16 < 2; bf16++) {
      const Out base = run(mm, ds[0], t_, w, ids, tg, bf16);
      ASSERT_TRUE(std::isfinite(base.loss));
      EXPECT_GT(base.aux, 0.0);
      for (size_t i = 0; i < ds.size(); i++) {
        const std::string what = "G=" + std::to_string(G) + (bf16 ? " bf16" : " fp32") + " decisions " +
                                 std::to_string(i);
        if (i > 0) expect_same(base, run(mm, ds[i], t_, w, ids, tg, bf16), what + " micro-batch-major");
        expect_same(base, run(lm, ds[i], t_, w, ids, tg, bf16), what + " layer-major");
      }
    }
    for (mf_decisions *d : ds) mf_decisions_free(d);
    mf_program_free(mm);
    mf_program_free(lm);
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, Order, ::testing::Values(0, 1, 2),
                         [](const ::testing::TestParamInfo<int> &i) { return std::string(make_shape(i.param).name); });

// Tied embeddings: the shared matrix's gradient of micro-batch m comes in two
// parts, the head's (in the loss part) and the embedding's (at the end), so
// layer-major adds up the same terms in another grouping — the same values up
// to rounding; every other gradient and the losses keep their bits.
TEST(ProgramOrder, TiedEmbeddingsDifferOnlyInTheSharedMatrixsRounding) {
  Shape sh = make_shape(0);
  sh.spec.tie_embeddings = 1;
  mf_param_table *t = nullptr;
  ASSERT_EQ(mf_param_table_build(&sh.spec, &t), MF_OK) << mf_last_error();
  const int32_t embed = mf_param_index(t, MF_P_EMBED, -1, -1);
  ASSERT_GE(embed, 0);
  ASSERT_EQ(mf_param_lm_head(t), embed);
  std::vector<float> w((size_t)t->total_numel);
  mf_params_init_random(t, 7, 0.2f, w.data());
  const int64_t B = 2, S = 12, G = 3;
  std::mt19937 rng(5);
  std::vector<std::vector<int32_t>> ids(G), tg(G);
  for (int64_t m = 0; m < G; m++) {
    ids[m].resize(B * S);
    tg[m].resize(B * S);
    for (auto &v : ids[m]) v = (int32_t)(rng() % sh.spec.vocab);
    for (auto &v : tg[m]) v = (int32_t)(rng() % sh.spec.vocab);
  }
  mf_program *mm = build(t, G, MF_ORDER_MICRO_MAJOR, B, S), *lm = build(t, G, MF_ORDER_LAYER_MAJOR, B, S);
  ASSERT_TRUE(mm && lm);
  std::vector<mf_decisions *> ds = decision_sets(mm, 3);
  const Out base = run(mm, ds[0], t, w, ids, tg, 0);
  const mf_param &e = t->params[embed];
  for (size_t i = 0; i < ds.size(); i++) {
    const Out o = run(lm, ds[i], t, w, ids, tg, 0);
    EXPECT_EQ(o.loss, base.loss) << i;
    EXPECT_EQ(o.aux, base.aux) << i;
    ASSERT_EQ(o.grads.size(), base.grads.size());
    EXPECT_EQ(0, memcmp(o.grads.data(), base.grads.data(), (size_t)e.offset * sizeof(float))) << i;
    const size_t end = (size_t)(e.offset + e.numel);
    EXPECT_EQ(0, memcmp(o.grads.data() + end, base.grads.data() + end, (o.grads.size() - end) * sizeof(float))) << i;
    double num = 0, den = 0;
    for (size_t j = (size_t)e.offset; j < end; j++) {
      num += ((double)o.grads[j] - base.grads[j]) * ((double)o.grads[j] - base.grads[j]);
      den += (double)base.grads[j] * base.grads[j];
    }
    EXPECT_GT(den, 0.0);
    EXPECT_LT(std::sqrt(num), 1e-6 * std::sqrt(den)) << i;
  }
  for (mf_decisions *d : ds) mf_decisions_free(d);
  mf_program_free(mm);
  mf_program_free(lm);
  mf_param_table_free(t);
}

TEST(ProgramOrder, Names) {
  EXPECT_STREQ(mf_program_order_name(MF_ORDER_LAYER_MAJOR), "layer-major");
  EXPECT_STREQ(mf_program_order_name(MF_ORDER_MICRO_MAJOR), "micro-batch-major");
}

TEST(ProgramOrder, BadOptionsAreErrors) {
  Shape sh = make_shape(0);
  mf_param_table *t = nullptr;
  ASSERT_EQ(mf_param_table_build(&sh.spec, &t), MF_OK);
  mf_program *p = nullptr;
  mf_program_opts bad_order = {2, 8, 2, 0.01, 16, 0, (mf_program_order)7, MF_DTYPE_F32};
  EXPECT_EQ(mf_program_build(t, &bad_order, &p), MF_ERR_INVALID_ARG);
  EXPECT_EQ(p, nullptr);
  EXPECT_NE(std::string(mf_last_error()).find("order"), std::string::npos) << mf_last_error();
  mf_program_opts bad_dtype = {2, 8, 2, 0.01, 16, 0, MF_ORDER_MICRO_MAJOR, MF_DTYPE_F16};
  EXPECT_EQ(mf_program_build(t, &bad_dtype, &p), MF_ERR_INVALID_ARG);
  EXPECT_EQ(p, nullptr);
  EXPECT_NE(std::string(mf_last_error()).find("F16"), std::string::npos) << mf_last_error();
  mf_param_table_free(t);
}

// BF16 storage: weights, activations and their gradients at 2 bytes per
// element; gradient sums, statistics, workspaces and inputs as in fp32.
TEST(ProgramStorage, Bf16SizesAndAStepNeedsTheWorkingCopy) {
  Shape sh = make_shape(1);
  mf_param_table *t = nullptr;
  ASSERT_EQ(mf_param_table_build(&sh.spec, &t), MF_OK);
  for (mf_program_order order : {MF_ORDER_MICRO_MAJOR, MF_ORDER_LAYER_MAJOR}) {
    mf_program *f = build(t, 2, order), *h = build(t, 2, order, 2, 12, MF_DTYPE_BF16);
    mf_program *f2 = build(t, 2, order, 2, 12, MF_DTYPE_F32);
    ASSERT_TRUE(f && h && f2);
    EXPECT_EQ(f->storage, MF_DTYPE_F32);
    EXPECT_EQ(f2->storage, MF_DTYPE_F32);
    EXPECT_EQ(h->storage, MF_DTYPE_BF16);
    ASSERT_EQ(f->n_tensors, h->n_tensors);
    int halved = 0;
    for (int32_t i = 0; i < f->n_tensors; i++) {
      const mf_ptensor &a = f->tensors[i], &b = h->tensors[i];
      EXPECT_EQ(a.bytes, f2->tensors[i].bytes);
      EXPECT_EQ(a.numel, b.numel);
      // The gradient of the router's fp32 probabilities stays fp32 (the
      // operand table's dprobs, kernels/backend.c).
      const bool fp32_stat_grad = std::string(a.name).find("router_probs.grad") != std::string::npos;
      if ((a.kind == MF_T_PARAM || a.kind == MF_T_ACT || a.kind == MF_T_ACT_GRAD) && !fp32_stat_grad) {
        EXPECT_EQ(a.bytes, (size_t)a.numel * 4) << a.name;
        EXPECT_EQ(b.bytes, (size_t)a.numel * 2) << b.name;
        EXPECT_EQ(b.dtype, MF_DTYPE_BF16) << b.name;
        halved++;
      } else if (a.kind == MF_T_OPT) {  // m and v, and with bf16 storage the fp32 master
        EXPECT_EQ(a.bytes, (size_t)a.numel * 4) << a.name;
        EXPECT_EQ(b.bytes, (size_t)a.numel * 4 + (size_t)a.numel / 2 * 4) << b.name;
      } else {
        EXPECT_EQ(b.bytes, a.bytes) << b.name;
        EXPECT_EQ(b.dtype, a.dtype) << b.name;
      }
      if (a.kind == MF_T_GRAD) {
        EXPECT_EQ(b.bytes, (size_t)a.numel * 4) << b.name;
      }
    }
    EXPECT_GT(halved, 100);
    // The planner sees the smaller sizes.
    mf_decisions *d = nullptr;
    ASSERT_EQ(mf_decisions_create(h, &d), MF_OK);
    mf_schedule *sf = nullptr, *sh16 = nullptr;
    ASSERT_EQ(mf_schedule_build(f, d, &sf), MF_OK) << mf_last_error();
    ASSERT_EQ(mf_schedule_build(h, d, &sh16), MF_OK) << mf_last_error();
    EXPECT_LT(sh16->peak_live_bytes, sf->peak_live_bytes);
    EXPECT_GT(2 * sh16->peak_live_bytes, sf->peak_live_bytes);  // gradients, stats, workspaces stay
    // The cpu backend runs BF16 storage (each kernel the twin of cuda's); a
    // step without the host's bf16 working copy to upload from is refused,
    // naming what is missing.
    mf_cpu_backend_opts bo = {nullptr, 1, 0, nullptr};
    mf_backend *b = nullptr;
    ASSERT_EQ(mf_backend_cpu_create(&bo, &b), MF_OK);
    mf_exec *x = nullptr;
    ASSERT_EQ(mf_exec_create_scheduled(h, sh16, b, &x), MF_OK) << mf_last_error();
    std::vector<float> w((size_t)t->total_numel, 0.01f);
    std::vector<std::vector<int32_t>> ids((size_t)h->G, std::vector<int32_t>((size_t)(h->B * h->S), 1));
    std::vector<const int32_t *> ip;
    for (auto &v : ids) ip.push_back(v.data());
    mf_step_result r;
    EXPECT_EQ(mf_exec_step(x, w.data(), ip.data(), ip.data(), nullptr, &r), MF_ERR_INTERNAL);
    const std::string err = mf_last_error();
    EXPECT_NE(err.find("mf_exec_set_working_copy"), std::string::npos) << err;
    mf_exec_free(x);
    mf_backend_free(b);
    mf_schedule_free(sf);
    mf_schedule_free(sh16);
    mf_decisions_free(d);
    mf_program_free(f);
    mf_program_free(f2);
    mf_program_free(h);
  }
  mf_param_table_free(t);
}

}  // namespace
