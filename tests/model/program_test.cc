// The step program and the executor on the cpu backend: the memory plan never
// overlaps live tensors, the checking mode catches a tensor released too early,
// results do not depend on the thread count, and gradient accumulation over
// micro-batches equals the mean of separate micro-batches.
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

mf_model_spec tiny_spec(mf_family f) {
  mf_model_spec s;
  mf_model_spec_defaults(f, &s);
  s.hidden = 32;
  s.layers = 2;
  s.heads = 4;
  s.kv_heads = 2;
  s.head_dim = 8;
  s.experts = 8;
  s.top_k = 2;
  s.expert_ffn = 16;
  s.vocab = 64;
  s.max_seq = 64;
  s.rope_theta = 10000.0;
  if (f == MF_FAMILY_QWEN2_MOE) {
    s.shared_ffn = 24;
    s.dense_ffn = 20;
    s.n_mlp_only = 1;
    s.mlp_only_layers[0] = 0;
  }
  if (f == MF_FAMILY_QWEN3_MOE) {
    s.dense_ffn = 20;
    s.decoder_sparse_step = 2;
  }
  return s;
}

struct StepOut {
  double loss = 0, ce = 0, aux = 0;
  std::vector<float> grads;
};

struct Model {
  mf_param_table *t = nullptr;
  std::vector<float> w;
  explicit Model(const mf_model_spec &s, uint64_t seed = 3) {
    EXPECT_EQ(mf_param_table_build(&s, &t), MF_OK) << mf_last_error();
    w.resize((size_t)t->total_numel);
    mf_params_init_random(t, seed, 0.2f, w.data());
    for (int64_t i = 0; i < t->n; i++) {  // norms not exactly 1, so their gradients matter
      const mf_param &p = t->params[i];
      if (p.ndim == 1)
        for (int64_t j = 0; j < p.numel; j++) w[p.offset + j] += 0.01f * (float)((j * 7 + i) % 11);
    }
  }
  ~Model() { mf_param_table_free(t); }
};

void make_batch(int64_t B, int64_t S, int64_t V, uint32_t seed, std::vector<int32_t> &ids, std::vector<int32_t> &tg) {
  std::mt19937 rng(seed);
  ids.resize(B * S);
  tg.resize(B * S);
  for (auto &x : ids) x = (int32_t)(rng() % V);
  for (int64_t i = 0; i < B * S; i++) tg[i] = (rng() % 5 == 0) ? -1 : (int32_t)(rng() % V);
}

StepOut run(const Model &m, int64_t B, int64_t S, int64_t G, const std::vector<std::vector<int32_t>> &ids,
        const std::vector<std::vector<int32_t>> &tg, int threads, int checking, int64_t chunk = 16) {
  StepOut r;
  mf_threadpool *pool = nullptr;
  EXPECT_EQ(mf_threadpool_create(threads, &pool), MF_OK);
  mf_cpu_backend_opts bo = {pool, 0, checking, nullptr};
  mf_backend *b = nullptr;
  EXPECT_EQ(mf_backend_cpu_create(&bo, &b), MF_OK);
  mf_program_opts po = {B, S, G, 0.01, chunk, 0};
  mf_program *p = nullptr;
  EXPECT_EQ(mf_program_build(m.t, &po, &p), MF_OK) << mf_last_error();
  mf_exec *x = nullptr;
  EXPECT_EQ(mf_exec_create(p, b, &x), MF_OK) << mf_last_error();
  std::vector<const int32_t *> ip, tp;
  for (int64_t g = 0; g < G; g++) {
    ip.push_back(ids[g].data());
    tp.push_back(tg[g].data());
  }
  r.grads.assign((size_t)m.t->total_numel, 0.0f);
  mf_step_result sr;
  EXPECT_EQ(mf_exec_step(x, m.w.data(), ip.data(), tp.data(), r.grads.data(), &sr), MF_OK) << mf_last_error();
  r.loss = sr.loss;
  r.ce = sr.ce_loss;
  r.aux = sr.aux_loss;
  mf_exec_free(x);
  mf_program_free(p);
  mf_backend_free(b);
  mf_threadpool_free(pool);
  return r;
}

class Families : public ::testing::TestWithParam<mf_family> {};

TEST_P(Families, MemoryPlanNeverOverlapsLiveSlots) {
  mf_model_spec s = tiny_spec(GetParam());
  Model m(s);
  mf_program_opts po = {2, 7, 2, 0.01, 16, 0};
  mf_program *p = nullptr;
  ASSERT_EQ(mf_program_build(m.t, &po, &p), MF_OK) << mf_last_error();
  mf_decisions *d = nullptr;
  ASSERT_EQ(mf_decisions_create(p, &d), MF_OK);
  mf_schedule *sc = nullptr;
  ASSERT_EQ(mf_schedule_build(p, d, &sc), MF_OK) << mf_last_error();
  for (int32_t a = 0; a < sc->n_slots; a++) {
    const mf_slot &x = sc->slots[a];
    const size_t xb = p->tensors[x.tensor].bytes;
    EXPECT_LE(x.offset + xb, sc->arena_bytes) << p->tensors[x.tensor].name;
    EXPECT_EQ(x.offset % 64, 0u) << p->tensors[x.tensor].name;
    for (int32_t c = a + 1; c < sc->n_slots; c++) {
      const mf_slot &y = sc->slots[c];
      const size_t yb = p->tensors[y.tensor].bytes;
      if (xb == 0 || yb == 0) continue;
      bool time = x.first <= y.last && y.first <= x.last;
      bool space = x.offset < y.offset + yb && y.offset < x.offset + xb;
      ASSERT_FALSE(time && space) << p->tensors[x.tensor].name << " and " << p->tensors[y.tensor].name
                                  << " share memory while both live";
    }
  }
  // Reuse makes the arena smaller than the sum of everything.
  size_t sum = 0;
  for (int32_t a = 0; a < p->n_tensors; a++) sum += p->tensors[a].bytes;
  EXPECT_LT(sc->arena_bytes, sum);
  EXPECT_LE(sc->peak_live_bytes, sc->arena_bytes);
  mf_schedule_free(sc);
  mf_decisions_free(d);
  mf_program_free(p);
}

// Every op carries its operand roles, as the backend's table gives them for
// its kind and sizes (accumulate flags included), in either micro-batch order
// (layer-major moves the ops, and their roles with them).
TEST_P(Families, OpsCarryTheirOperandRoles) {
  mf_model_spec s = tiny_spec(GetParam());
  Model m(s);
  for (mf_program_order order : {MF_ORDER_MICRO_MAJOR, MF_ORDER_LAYER_MAJOR}) {
    mf_program_opts po = {2, 7, 2, 0.01, 16, 0, order};
    mf_program *p = nullptr;
    ASSERT_EQ(mf_program_build(m.t, &po, &p), MF_OK) << mf_last_error();
    int accumulating = 0, expert_writers = 0;
    for (int32_t k = 0; k < p->n_ops; k++) {
      const mf_pop &o = p->ops[k];
      mf_kernel_call c;
      memset(&c, 0, sizeof c);
      c.kind = o.kind;
      memcpy(c.i, o.i, sizeof c.i);
      EXPECT_EQ(o.reads, mf_kernel_reads(&c)) << o.label;
      EXPECT_EQ(o.writes, mf_kernel_writes(&c)) << o.label;
      EXPECT_EQ(o.writes_experts != 0, mf_kernel_writes_experts(o.kind) != 0) << o.label;
      accumulating += (o.reads & o.writes) != 0;
      expert_writers += o.writes_experts;
      for (int i = 0; i < MF_KBUF_MAX; i++) {  // every operand present is read or written
        if (o.t[i] >= 0) {
          EXPECT_NE((o.reads | o.writes) >> i & 1, 0u) << o.label << " operand " << i;
        }
      }
    }
    EXPECT_GT(accumulating, 0);
    EXPECT_GT(expert_writers, 0);
    mf_program_free(p);
  }
}

TEST_P(Families, ThreadsCheckingAndAccumulation) {
  mf_model_spec s = tiny_spec(GetParam());
  Model m(s);
  const int64_t B = 2, S = 7;
  std::vector<std::vector<int32_t>> ids(2), tg(2);
  make_batch(B, S, s.vocab, 1, ids[0], tg[0]);
  make_batch(B, S, s.vocab, 2, ids[1], tg[1]);
  StepOut one = run(m, B, S, 2, ids, tg, 1, 1);
  StepOut two = run(m, B, S, 2, ids, tg, 2, 0);
  StepOut three = run(m, B, S, 2, ids, tg, 3, 1, 64);  // one vocabulary chunk
  EXPECT_TRUE(std::isfinite(one.loss));
  EXPECT_GT(one.aux, 0.0);
  EXPECT_EQ(one.loss, two.loss);
  EXPECT_EQ(0, memcmp(one.grads.data(), two.grads.data(), one.grads.size() * sizeof(float)));
  EXPECT_NEAR(one.loss, three.loss, 1e-6 * std::fabs(one.loss));

  // Accumulating two micro-batches = the mean of each alone.
  std::vector<std::vector<int32_t>> i0 = {ids[0]}, t0 = {tg[0]}, i1 = {ids[1]}, t1 = {tg[1]};
  StepOut a = run(m, B, S, 1, i0, t0, 2, 1);
  StepOut b = run(m, B, S, 1, i1, t1, 2, 1);
  EXPECT_NEAR(one.loss, 0.5 * (a.loss + b.loss), 1e-6);
  double num = 0, den = 0;
  for (size_t i = 0; i < one.grads.size(); i++) {
    double want = 0.5 * ((double)a.grads[i] + (double)b.grads[i]);
    num += (one.grads[i] - want) * (one.grads[i] - want);
    den += want * want;
  }
  EXPECT_LT(std::sqrt(num), 1e-5 * std::sqrt(den));
}

INSTANTIATE_TEST_SUITE_P(All, Families,
                         ::testing::Values(MF_FAMILY_MIXTRAL, MF_FAMILY_QWEN2_MOE, MF_FAMILY_QWEN3_MOE, MF_FAMILY_OLMOE),
                         [](const ::testing::TestParamInfo<mf_family> &i) { return std::string(mf_family_name(i.param)); });

// In the bf16-rounding mode activations are rounded as they are stored, but a
// gradient sum (ADD with the fp32 flag, what the executor's ACCUM uses) is not.
TEST(Backend, GradientSumsStayFp32InBf16Mode) {
  mf_cpu_backend_opts bo = {nullptr, 1, 0, nullptr};
  mf_backend *b = nullptr;
  ASSERT_EQ(mf_backend_cpu_create(&bo, &b), MF_OK);
  float x[4] = {1.0f, 1e-3f, 3.14159f, -2.71828f}, y[4] = {1.0f, 1.0f, 1.0f, 1.0f}, z[4];
  memcpy(z, y, sizeof y);
  mf_kernel_call c;
  memset(&c, 0, sizeof c);
  c.kind = MF_K_ADD;
  c.b[0] = {x, sizeof x, 0};
  c.b[1] = {y, sizeof y, 1};
  c.i[0] = 4;
  c.i[1] = 1;
  ASSERT_EQ(b->run(b, &c, nullptr), MF_OK);
  for (int i = 0; i < 4; i++) EXPECT_EQ(y[i], 1.0f + x[i]) << i;
  c.b[1].ptr = z;
  c.i[1] = 0;  // an activation: rounded
  ASSERT_EQ(b->run(b, &c, nullptr), MF_OK);
  for (int i = 0; i < 4; i++) EXPECT_EQ(z[i], mf_bf16_to_fp32(mf_fp32_to_bf16(1.0f + x[i]))) << i;
  EXPECT_NE(z[1], y[1]);
  mf_backend_free(b);
}

// Expert parallelism (mf_program_opts.ep): rank 1 of 2 holds experts 4..7 of
// 8: the expert ops name only those, the others have no gradient and no
// optimizer; each MoE layer of each micro-batch has a dispatch and a combine
// each way, and what an exchange wrote is never recomputed (it runs once, on
// every rank); the received rows are sized for all ranks' rows.
TEST(ExpertParallel, RankHoldsItsExpertsAndExchangesRows) {
  Model m(tiny_spec(MF_FAMILY_MIXTRAL));
  const int64_t B = 2, S = 8, G = 2;
  mf_program_opts po = {B, S, G, 0.01, 16, 0};
  po.ranks = 2;
  po.ep = 2;
  po.ep_rank = 1;
  mf_program *p = nullptr;
  ASSERT_EQ(mf_program_build(m.t, &po, &p), MF_OK) << mf_last_error();
  for (int64_t e = 0; e < 8; e++) EXPECT_EQ(mf_program_owns_expert(p, e), e >= 4) << e;
  for (int64_t i = 0; i < m.t->n; i++) {
    const mf_param &q = m.t->params[i];
    const bool mine = q.expert < 0 || q.expert >= 4;
    EXPECT_EQ(mf_program_holds_param(p, i), mine) << q.name;
    EXPECT_EQ(p->grad_tensor[i] >= 0, mine) << q.name;
    EXPECT_EQ(p->adamw_op[i] >= 0, mine) << q.name;
  }
  int dispatch = 0, combine = 0, parts = 0;
  for (int32_t k = 0; k < p->n_ops; k++) {
    const mf_pop &o = p->ops[k];
    dispatch += o.kind == MF_K_EP_DISPATCH;
    combine += o.kind == MF_K_EP_COMBINE;
    if (o.kind == MF_K_EP_DISPATCH) {
      EXPECT_EQ(p->tensors[o.t[2]].numel, 2 * B * S * 2 * 32) << o.label;  // ep x T x top_k rows of H
      EXPECT_EQ(o.i[1], 2);
      EXPECT_EQ(o.i[3], 1);
      for (int j = 0; j < MF_KBUF_MAX; j++)
        if (o.t[j] >= 0 && (o.writes >> j & 1))
          EXPECT_FALSE(mf_schedule_can_recompute(p, o.t[j])) << p->tensors[o.t[j]].name;
    }
    if (o.kind == MF_K_EXPERT_BWD_WEIGHT) {
      EXPECT_GE(o.t[3], 0) << o.label << ": the parts by source rank";
      EXPECT_EQ(o.i[3], 2) << o.label;
      parts++;
    }
    if (o.experts_at >= 0)
      for (int64_t e = 0; e < 8; e++)
        EXPECT_EQ(p->id_pool[o.experts_at + e] >= 0, e >= 4) << o.label << " " << e;
  }
  EXPECT_EQ(dispatch, 2 * 2 * G);  // 2 MoE layers, forward and backward
  EXPECT_EQ(combine, 2 * 2 * G);
  EXPECT_EQ(parts, 3 * 2 * G);
  // Without an exchange the executor refuses to run it.
  mf_cpu_backend_opts bo = {nullptr, 0, 0, nullptr};
  mf_backend *b = nullptr;
  ASSERT_EQ(mf_backend_cpu_create(&bo, &b), MF_OK);
  mf_exec *x = nullptr;
  ASSERT_EQ(mf_exec_create(p, b, &x), MF_OK) << mf_last_error();
  std::vector<std::vector<int32_t>> ids(G), tg(G);
  std::vector<const int32_t *> ip, tp;
  for (int64_t g = 0; g < G; g++) {
    make_batch(B, S, 64, 40 + (uint32_t)g, ids[g], tg[g]);
    ip.push_back(ids[g].data());
    tp.push_back(tg[g].data());
  }
  std::vector<float> grads((size_t)m.t->total_numel, 0.0f);
  mf_step_result sr;
  EXPECT_EQ(mf_exec_step(x, m.w.data(), ip.data(), tp.data(), grads.data(), &sr), MF_ERR_INTERNAL);
  EXPECT_NE(std::string(mf_last_error()).find("needs an exchange between ranks"), std::string::npos)
      << mf_last_error();
  mf_exec_free(x);
  mf_backend_free(b);
  mf_program_free(p);
  // What it cannot do: experts it cannot share out equally, a group past the ranks, a dense model.
  po.ranks = 4;
  po.ep_group = 2;
  EXPECT_EQ(mf_program_build(m.t, &po, &p), MF_ERR_INVALID_ARG);
  EXPECT_NE(std::string(mf_last_error()).find("expert-parallel group 2 of 4 ranks in groups of 2"),
            std::string::npos)
      << mf_last_error();
  po.ep_group = 0;
  po.ep = 3;
  po.ep_rank = 0;
  EXPECT_EQ(mf_program_build(m.t, &po, &p), MF_ERR_CONFIG);
  EXPECT_NE(std::string(mf_last_error()).find("does not divide the model's 8 routed experts"),
            std::string::npos)
      << mf_last_error();
}

// Expert parallelism in groups (4 ranks, groups of 2): in the second group the
// gradients summed by source rank's parts — the rank's own experts', nothing
// else — start from the host's sum: the schedule fills their first slot from
// home (an H2D of the gradient) where the first group zeroes it, resident
// gradients or streamed; in the first group nothing is seeded.
TEST(ExpertParallel, SecondGroupStartsItsExpertsGradientsFromHome) {
  Model m(tiny_spec(MF_FAMILY_MIXTRAL));
  for (const int64_t group : {0, 1})
    for (const mf_grad_dec gd : {MF_GRAD_DEVICE, MF_GRAD_STREAM}) {
      SCOPED_TRACE(std::to_string(group) + (gd == MF_GRAD_DEVICE ? " device" : " stream"));
      mf_program_opts po = {2, 8, 1, 0.01, 16, 0};
      po.ranks = 4;
      po.ep = 2;
      po.ep_rank = 1;
      po.ep_group = group;
      mf_program *p = nullptr;
      ASSERT_EQ(mf_program_build(m.t, &po, &p), MF_OK) << mf_last_error();
      EXPECT_EQ(p->grad_seed != nullptr, group == 1);
      int seeded = 0;
      for (int64_t i = 0; i < m.t->n && p->grad_seed; i++) {
        EXPECT_EQ(p->grad_seed[i] != 0, m.t->params[i].expert >= 4) << m.t->params[i].name;
        seeded += p->grad_seed[i] != 0;
      }
      EXPECT_EQ(seeded, group == 1 ? 2 * 4 * 3 : 0);  // 2 MoE layers x 4 experts x 3 projections
      mf_decisions *d = nullptr;
      ASSERT_EQ(mf_decisions_create(p, &d), MF_OK);
      for (int32_t i = 0; i < d->n_params; i++) d->grad[i] = (uint8_t)gd;
      mf_schedule *sc = nullptr;
      ASSERT_EQ(mf_schedule_build(p, d, &sc), MF_OK) << mf_last_error();
      std::vector<int> filled(m.t->n, 0), zeroed(m.t->n, 0);
      for (int32_t k = 0; k < sc->n_instr; k++) {
        const mf_instr &in = sc->instr[k];
        if (in.kind != MF_I_H2D && in.kind != MF_I_ZERO) continue;
        const mf_ptensor &t = p->tensors[sc->slots[in.slot].tensor];
        if (t.kind != MF_T_GRAD) continue;
        (in.kind == MF_I_H2D ? filled : zeroed)[t.param]++;
      }
      for (int64_t i = 0; i < m.t->n; i++) {
        if (p->grad_tensor[i] < 0) continue;
        const bool seed = group == 1 && m.t->params[i].expert >= 4;
        EXPECT_EQ(filled[i], seed ? 1 : 0) << m.t->params[i].name;
        if (seed) EXPECT_EQ(zeroed[i], 0) << m.t->params[i].name;
      }
      mf_schedule_free(sc);
      mf_decisions_free(d);
      mf_program_free(p);
    }
}

}  // namespace
