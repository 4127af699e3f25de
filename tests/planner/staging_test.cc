// experts/staging: the pinned staging arena of real small programs' schedules,
// checked against independent recounts: slabs never share bytes while both
// are busy, each is the exact sum of its aligned tensors, the arena lies
// between the bytes in flight and the sum of the slabs, every copy is served
// exactly once, and the ZeRO-Infinity-style pool equals a brute-force recount.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "planner/plan.h"
#include "planner/schedule.h"
#include "planner/simulate.h"
#include "planner/staging.h"
#include "src/core/core.h"
#include "src/model/params.h"
#include "src/model/program.h"
#include "tests/planner/planner_test_util.h"

namespace {

struct Prog {
  mf_param_table *t = nullptr;
  mf_program *p = nullptr;
  void Build(int shape, int64_t B, int64_t S, int64_t G, mf_dtype storage = MF_DTYPE_F32) {
    mf_pt::Shape sh = mf_pt::make_shape(shape);
    ASSERT_EQ(mf_param_table_build(&sh.spec, &t), MF_OK) << mf_last_error();
    mf_program_opts po{};
    po.micro_batch = B, po.seq_len = S, po.grad_accum = G, po.aux_coef = 0.01, po.storage = storage;
    ASSERT_EQ(mf_program_build(t, &po, &p), MF_OK) << mf_last_error();
  }
  ~Prog() {
    mf_program_free(p);
    mf_param_table_free(t);
  }
};

size_t AlignUp(size_t x, size_t a) {
  return (x + a - 1) / a * a;
}

// Decisions: 0 everything resident/kept; 1 everything streamed, activations
// offloaded; 2 random (seeded); 3 random, every third parameter's optimizer on
// the device (its slabs in the schedule's optimizer part).
mf_decisions *MakeDecisions(const mf_program *p, int kind, unsigned seed) {
  mf_decisions *d = nullptr;
  EXPECT_EQ(mf_decisions_create(p, &d), MF_OK);
  std::mt19937 rng(seed);
  std::vector<uint8_t> opt((size_t)p->n_tensors + 1);
  EXPECT_EQ(mf_schedule_act_options(p, opt.data()), MF_OK);
  for (int32_t i = 0; i < d->n_params; i++) {
    d->param[i] = (uint8_t)(kind == 1   ? (int)MF_PARAM_STREAM
                            : kind == 2 ? (int)(rng() % 2)
                                        : (int)MF_PARAM_RESIDENT);
    d->grad[i] = (uint8_t)(kind == 1   ? (int)MF_GRAD_STREAM
                           : kind == 2 ? (int)(rng() % 2)
                                       : (int)MF_GRAD_DEVICE);
    if (kind == 3) {
      d->param[i] = (uint8_t)(rng() % 2), d->grad[i] = (uint8_t)(rng() % 2);
      if (i % 3 == 0)
        d->param[i] = MF_PARAM_RESIDENT, d->grad[i] = MF_GRAD_DEVICE, d->optim[i] = MF_OPTIM_DEVICE;
    }
  }
  for (int32_t t = 0; t < p->n_tensors; t++) {
    if (!opt[t]) continue;
    if (kind == 1) d->act[t] = MF_ACT_OFFLOAD;
    if (kind >= 2) d->act[t] = (uint8_t)(rng() % (opt[t] == 3 ? 3 : 2));
  }
  return d;
}

struct Case {
  int shape, decisions, overlap;
  int64_t G;
  size_t max_slab;
  double throttle;  // 0, or bound the bytes in flight to this fraction of the free-running peak
};

class Staging : public ::testing::TestWithParam<Case> {};

// The per-tensor intervals of the pool, recounted plainly: H2D copies in
// instruction order, each filled by one host thread as late as it can be;
// D2H copies drained in order as soon as they can be; then the most
// intervals covering one instant, tried at every start.
// shift[i]: how far the layout moved copy instruction i's DMA (0 unthrottled).
int32_t RecountPool(const mf_schedule *s, const mf_sim_result *r, const std::vector<double> &shift, double bw,
                    size_t *largest) {
  const mf_program *p = s->prog;
  std::vector<std::pair<double, double>> iv;
  std::vector<int32_t> h2d, d2h;
  *largest = 0;
  for (int32_t i = 0; i < s->n_instr; i++) {
    const mf_instr &in = s->instr[i];
    if (in.kind != MF_I_H2D && in.kind != MF_I_D2H) continue;
    if (in.kind == MF_I_H2D && in.persist) continue;  // straight from its home, not staged
    (in.kind == MF_I_H2D ? h2d : d2h).push_back(i);
    *largest = std::max(*largest, p->tensors[s->slots[in.slot].tensor].bytes);
  }
  double next = INFINITY;
  for (size_t k = h2d.size(); k-- > 0;) {
    const int32_t i = h2d[k];
    const double bytes = (double)p->tensors[s->slots[s->instr[i].slot].tensor].bytes;
    const double end = std::min(r->start[i] + shift[i], next);
    next = end - 2 * bytes / bw;
    iv.push_back({next, r->end[i] + shift[i]});
  }
  double drained = -INFINITY;
  for (int32_t i : d2h) {
    const mf_ptensor &x = p->tensors[s->slots[s->instr[i].slot].tensor];
    const double per = (x.kind == MF_T_GRAD && s->instr[i].accumulate) ? 3.0 : 2.0;
    drained = std::max(drained, r->end[i] + shift[i]) + per * (double)x.bytes / bw;
    iv.push_back({r->start[i] + shift[i], drained});
  }
  int32_t best = 0;
  for (const auto &a : iv) {
    int32_t n = 0;
    for (const auto &b : iv) n += b.first <= a.first && a.first < b.second;
    best = std::max(best, n);
  }
  return best;
}

TEST_P(Staging, LayoutHoldsItsInvariants) {
  const Case c = GetParam();
  Prog g;
  g.Build(c.shape, 1, 16, c.G);
  ASSERT_NE(g.p, nullptr);
  mf_hwprofile hw = mf_pt::small_profile(c.overlap);
  // Throttled cases: a host that copies slower than the links, so slabs pile up.
  if (c.throttle > 0) hw.host_memory_bandwidth = 1e9;
  mf_decisions *d = MakeDecisions(g.p, c.decisions, 7u + (unsigned)c.shape);
  mf_plan *pl = nullptr;
  ASSERT_EQ(mf_plan_evaluate(g.p, &hw, d, UINT64_MAX / 2, MF_PLAN_CHOSEN, &pl), MF_OK) << mf_last_error();
  mf_decisions_free(d);
  const mf_schedule *s = pl->s;
  mf_staging_opts o{0, c.max_slab, 0};
  mf_staging *st = nullptr;
  ASSERT_EQ(mf_staging_build(s, &pl->sim, &hw, &o, &st), MF_OK) << mf_last_error();
  EXPECT_EQ(st->throttled, 0);
  uint64_t bound = 0;
  if (c.throttle > 0) {  // the same copies held within a bound below their free-running peak
    bound = std::max<uint64_t>((uint64_t)(c.throttle * (double)st->peak_inflight_bytes),
                               2 * st->largest_slab_bytes);
    ASSERT_LT(bound, st->peak_inflight_bytes) << "the case does not make the throttle act";
    mf_staging_free(st);
    st = nullptr;
    o.inflight_limit = bound;
    ASSERT_EQ(mf_staging_build(s, &pl->sim, &hw, &o, &st), MF_OK) << mf_last_error();
    EXPECT_EQ(st->throttled, 1);
    EXPECT_LE(st->peak_inflight_bytes, bound);
    EXPECT_GT(std::max(st->h2d_slip_seconds, st->d2h_slip_seconds), 0.0);
  }
  const size_t A = st->opts.align;
  EXPECT_EQ(A, (size_t)MF_STAGING_ALIGN_DEFAULT);
  if (c.max_slab) {
    EXPECT_EQ(st->opts.max_slab_bytes, c.max_slab);
  } else {  // the default: 64 MiB, or the largest copied tensor when that is less
    size_t big = 0;
    for (int32_t i = 0; i < s->n_instr; i++)
      if (s->instr[i].kind == MF_I_H2D || s->instr[i].kind == MF_I_D2H)
        big = std::max(big, g.p->tensors[s->slots[s->instr[i].slot].tensor].bytes);
    EXPECT_EQ(st->opts.max_slab_bytes,
              std::min(MF_STAGING_MAX_SLAB_DEFAULT, AlignUp(std::max<size_t>(big, 1), A)));
  }

  // Every copy instruction is served exactly once, by a copy of its own tensor.
  int32_t n_copy_instr = 0;
  for (int32_t i = 0; i < s->n_instr; i++) {
    const mf_instr &in = s->instr[i];
    const bool is_copy = in.kind == MF_I_H2D || in.kind == MF_I_D2H;
    // a persistent slot's upload (the first step's, of a weight that stays) goes straight from its home
    const bool staged = is_copy && !(in.kind == MF_I_H2D && in.persist);
    n_copy_instr += staged;
    if (!staged) {
      EXPECT_EQ(st->copy_of_instr[i], -1);
      continue;
    }
    const int32_t k = st->copy_of_instr[i];
    ASSERT_GE(k, 0);
    ASSERT_LT(k, st->n_copies);
    EXPECT_EQ(st->copies[k].instr, i);
    EXPECT_EQ(st->copies[k].tensor, s->slots[in.slot].tensor);
    EXPECT_EQ(st->copies[k].bytes, g.p->tensors[in.slot >= 0 ? s->slots[in.slot].tensor : 0].bytes);
    EXPECT_EQ(st->slabs[st->copies[k].slab].dir, (uint8_t)in.kind);
  }
  EXPECT_EQ(st->n_copies, n_copy_instr);
  if (c.decisions != 0) {
    EXPECT_GT(n_copy_instr, 0);
  }

  // Each slab: exact size, copies at consecutive aligned places, one direction
  // and group, consecutive on its stream, within the cap unless a single copy.
  uint64_t sum = 0;
  size_t largest = 0;
  int32_t covered = 0;
  for (int32_t k = 0; k < st->n_slabs; k++) {
    const mf_staging_slab &x = st->slabs[k];
    EXPECT_EQ(x.dir, k < st->n_h2d_slabs ? MF_I_H2D : MF_I_D2H);
    EXPECT_EQ(x.first_copy, covered);
    ASSERT_GT(x.n_copies, 0);
    covered += x.n_copies;
    EXPECT_EQ(x.offset % A, 0u);
    size_t at = 0;
    for (int32_t j = x.first_copy; j < x.first_copy + x.n_copies; j++) {
      const mf_staging_copy &cp = st->copies[j];
      EXPECT_EQ(cp.slab, k);
      EXPECT_EQ(cp.offset, x.offset + at) << "copy " << j << " of slab " << k;
      EXPECT_EQ(mf_staging_group_of(s, cp.instr), x.group);
      // The group names the layer: a weight comes up for, and an offloaded
      // activation goes home from, an op of its own layer.
      const mf_ptensor &tx = g.p->tensors[cp.tensor];
      const bool own_layer =
          (x.dir == MF_I_H2D && tx.kind == MF_T_PARAM) || (x.dir == MF_I_D2H && tx.kind == MF_T_ACT);
      if (own_layer && tx.layer >= 0) {
        EXPECT_EQ(x.group % (g.p->spec.layers + 2) - 1, tx.layer) << tx.name;
      }
      at += AlignUp(cp.bytes, A);
      if (j > x.first_copy) {
        for (int32_t i = st->copies[j - 1].instr + 1; i < cp.instr; i++)
          EXPECT_NE(s->instr[i].kind, (mf_instr_kind)x.dir)
              << "slab " << k << " is not one run on its stream";
      }
    }
    EXPECT_EQ(x.bytes, at) << "slab " << k << " is not the exact sum of its aligned tensors";
    if (x.n_copies > 1) {
      EXPECT_LE(x.bytes, st->opts.max_slab_bytes);
    }
    const double sim_start = pl->sim.start[st->copies[x.first_copy].instr];
    const double sim_end = pl->sim.end[st->copies[x.first_copy + x.n_copies - 1].instr];
    if (!bound) {
      EXPECT_EQ(x.dma_start, sim_start);
      EXPECT_EQ(x.dma_end, sim_end);
    } else {  // held back, never earlier; as long; one at a time on its stream
      const double slip = x.dma_start - sim_start;
      EXPECT_GE(slip, 0.0);
      EXPECT_LE(slip, (x.dir == MF_I_H2D ? st->h2d_slip_seconds : st->d2h_slip_seconds) + 1e-15);
      EXPECT_NEAR(x.dma_end - x.dma_start, sim_end - sim_start, 1e-12);
      if (k > 0 && st->slabs[k - 1].dir == x.dir) {
        EXPECT_GE(x.dma_start, st->slabs[k - 1].dma_end - 1e-15);
      }
    }
    // The host's part: a fill before the first copy, a copy-out after the last.
    double traffic = 0;
    for (int32_t j = x.first_copy; j < x.first_copy + x.n_copies; j++) {
      const mf_instr &in = s->instr[st->copies[j].instr];
      const bool acc =
          in.kind == MF_I_D2H && g.p->tensors[st->copies[j].tensor].kind == MF_T_GRAD && in.accumulate;
      traffic += (acc ? 3.0 : 2.0) * (double)st->copies[j].bytes;
    }
    const double host_s = traffic / hw.host_memory_bandwidth;
    if (x.dir == MF_I_H2D) {
      EXPECT_LE(x.busy_start, x.dma_start - host_s * (1 - 1e-12));
      EXPECT_EQ(x.busy_end, x.dma_end);
    } else {
      EXPECT_EQ(x.busy_start, x.dma_start);
      EXPECT_GE(x.busy_end, x.dma_end + host_s * (1 - 1e-12));
    }
    // Runs are cut only at a group change, at the cap, where the optimizer part begins or at a
    // persistent slot's upload (which goes straight).
    const int32_t last_instr = st->copies[x.first_copy + x.n_copies - 1].instr;
    bool straight_between = false;
    if (k + 1 < st->n_slabs)
      for (int32_t i = last_instr + 1; i < st->copies[st->slabs[k + 1].first_copy].instr; i++)
        straight_between = straight_between || (s->instr[i].kind == MF_I_H2D && s->instr[i].persist);
    for (int32_t j = x.first_copy; j < x.first_copy + x.n_copies; j++)
      EXPECT_EQ(st->copies[j].instr < s->optim_begin, st->copies[x.first_copy].instr < s->optim_begin)
          << "slab " << k << " spans the start of the optimizer part";
    if (k + 1 < st->n_slabs && !straight_between && st->slabs[k + 1].dir == x.dir &&
        st->slabs[k + 1].group == x.group &&
        (st->copies[st->slabs[k + 1].first_copy].instr < s->optim_begin) == (last_instr < s->optim_begin)) {
      const size_t next = AlignUp(st->copies[st->slabs[k + 1].first_copy].bytes, A);
      EXPECT_GT(x.bytes + next, st->opts.max_slab_bytes) << "slab " << k << " was cut early";
    }
    sum += x.bytes;
    largest = std::max(largest, x.bytes);
  }
  EXPECT_EQ(covered, st->n_copies);
  EXPECT_EQ(sum, st->sum_slab_bytes);
  EXPECT_EQ(largest, st->largest_slab_bytes);

  // No two slabs share bytes while both are busy: every pair.
  for (int32_t a = 0; a < st->n_slabs; a++)
    for (int32_t b = a + 1; b < st->n_slabs; b++) {
      const mf_staging_slab &x = st->slabs[a], &y = st->slabs[b];
      const bool time = x.busy_start < y.busy_end && y.busy_start < x.busy_end;
      const bool bytes = x.offset < y.offset + y.bytes && y.offset < x.offset + x.bytes;
      ASSERT_FALSE(time && bytes) << "slabs " << a << " and " << b << " overlap in time and bytes";
    }
  // The arena: no bigger than the slabs side by side, no smaller than the bytes in flight.
  size_t peak = 0;
  int32_t most = 0;
  for (int32_t a = 0; a < st->n_slabs; a++) {
    size_t live = 0;
    int32_t n = 0;
    const double t = st->slabs[a].busy_start;
    for (int32_t b = 0; b < st->n_slabs; b++)
      if (st->slabs[b].busy_start <= t && t < st->slabs[b].busy_end) live += st->slabs[b].bytes, n++;
    peak = std::max(peak, live);
    most = std::max(most, n);
  }
  EXPECT_EQ(peak, st->peak_inflight_bytes);
  EXPECT_EQ(most, st->max_slabs_inflight);
  EXPECT_GE(st->arena_bytes, peak);
  EXPECT_LE(st->arena_bytes, sum);
  for (int32_t a = 0; a < st->n_slabs; a++)
    EXPECT_LE(st->slabs[a].offset + st->slabs[a].bytes, st->arena_bytes);
  // The directions never share bytes: H2D slabs in the first region, D2H after it.
  EXPECT_LE(st->h2d_region_bytes, st->arena_bytes);
  for (int32_t a = 0; a < st->n_slabs; a++) {
    const mf_staging_slab &x = st->slabs[a];
    if (x.dir == MF_I_H2D)
      EXPECT_LE(x.offset + x.bytes, st->h2d_region_bytes) << "H2D slab " << a;
    else
      EXPECT_GE(x.offset, st->h2d_region_bytes) << "D2H slab " << a;
  }

  // The order between slabs, quadratically: each slab's previous occupant is
  // the latest earlier slab of its direction sharing any byte; an H2D slab
  // waits for the last copy-out, before it, of every offloaded activation it
  // uploads — and that copy-out comes before its first copy.
  for (int32_t k = 0; k < st->n_slabs; k++) {
    const mf_staging_slab &x = st->slabs[k];
    int32_t prev = -1;
    for (int32_t j = 0; j < k; j++) {
      const mf_staging_slab &y = st->slabs[j];
      if (y.dir == x.dir && y.offset < x.offset + x.bytes && x.offset < y.offset + y.bytes) prev = j;
    }
    EXPECT_EQ(st->wait_slab[k], prev) << "slab " << k;
    int32_t host = -1;
    for (int32_t c = x.first_copy; x.dir == MF_I_H2D && c < x.first_copy + x.n_copies; c++) {
      if (s->host_offset[st->copies[c].tensor] == SIZE_MAX) continue;
      int32_t out = -1;
      for (int32_t i = 0; i < st->copies[c].instr; i++)
        if (s->instr[i].kind == MF_I_D2H && s->slots[s->instr[i].slot].tensor == st->copies[c].tensor)
          out = st->copies[st->copy_of_instr[i]].slab;
      ASSERT_GE(out, 0) << "slab " << k << " uploads " << g.p->tensors[st->copies[c].tensor].name
                        << ", which never went home";
      host = std::max(host, out);
    }
    EXPECT_EQ(st->wait_host[k], host) << "slab " << k;
    if (host >= 0) {
      const mf_staging_slab &w = st->slabs[host];
      EXPECT_LT(st->copies[w.first_copy + w.n_copies - 1].instr, st->copies[x.first_copy].instr)
          << "slab " << k << " is filled before slab " << host << " is copied out";
    }
  }

  // The pool equals an independent recount on the same timeline.
  size_t big = 0;
  std::vector<double> shift((size_t)s->n_instr, 0.0);
  for (int32_t k = 0; k < st->n_slabs; k++) {
    const mf_staging_slab &x = st->slabs[k];
    for (int32_t j = x.first_copy; j < x.first_copy + x.n_copies; j++)
      shift[st->copies[j].instr] = x.dma_start - pl->sim.start[st->copies[x.first_copy].instr];
  }
  const int32_t buffers = RecountPool(s, &pl->sim, shift, hw.host_memory_bandwidth, &big);
  EXPECT_EQ(st->pool_buffers, buffers);
  EXPECT_EQ(st->pool_buffer_bytes, big);
  EXPECT_EQ(st->pool_bytes, (uint64_t)buffers * big);
  mf_staging_free(st);
  mf_plan_free(pl);
}

INSTANTIATE_TEST_SUITE_P(Schedules, Staging,
                         ::testing::Values(Case{0, 1, 1, 2, 0}, Case{0, 1, 0, 2, 0}, Case{1, 1, 1, 2, 0},
                                           Case{2, 1, 1, 3, 0}, Case{2, 2, 1, 2, 0}, Case{1, 2, 0, 2, 0},
                                           Case{0, 2, 1, 1, 0}, Case{0, 0, 1, 2, 0}, Case{2, 1, 1, 2, 512},
                                           Case{1, 1, 1, 2, SIZE_MAX}, Case{0, 2, 1, 2, 1},
                                           Case{2, 1, 1, 3, 512, 0.5}, Case{1, 1, 1, 2, 256, 0.5},
                                           Case{2, 2, 1, 2, 256, 0.4}, Case{0, 1, 1, 3, 256, 0.6},
                                           Case{0, 3, 1, 2, 0}, Case{2, 3, 1, 2, 512}));

struct Planned {
  Prog g;
  mf_hwprofile hw;
  mf_plan *pl = nullptr;
  void Make(int shape, int overlap, int decisions, int64_t G = 2) {
    g.Build(shape, 1, 16, G);
    hw = mf_pt::small_profile(overlap);
    mf_decisions *d = MakeDecisions(g.p, decisions, 3);
    ASSERT_EQ(mf_plan_evaluate(g.p, &hw, d, UINT64_MAX / 2, MF_PLAN_CHOSEN, &pl), MF_OK) << mf_last_error();
    mf_decisions_free(d);
  }
  ~Planned() { mf_plan_free(pl); }
};

// Streaming every layer: slabs of later layers reuse the bytes of earlier
// ones, and one slab per group gives fewer, bigger slabs than one per copy.
TEST(StagingShape, ReusesAcrossLayersAndGroupsCopies) {
  Planned P;
  P.Make(2, 1, 1, 3);
  mf_staging *st = nullptr, *per_copy = nullptr, *per_group = nullptr;
  ASSERT_EQ(mf_staging_build(P.pl->s, &P.pl->sim, &P.hw, nullptr, &st), MF_OK) << mf_last_error();
  EXPECT_LT(st->arena_bytes, st->sum_slab_bytes) << "no reuse across layers";
  EXPECT_LT(st->n_slabs, st->n_copies) << "no copies grouped";
  mf_staging_opts one{0, 1};  // every copy past the cap: one slab each
  ASSERT_EQ(mf_staging_build(P.pl->s, &P.pl->sim, &P.hw, &one, &per_copy), MF_OK);
  EXPECT_EQ(per_copy->n_slabs, per_copy->n_copies);
  mf_staging_opts whole{0, SIZE_MAX};
  ASSERT_EQ(mf_staging_build(P.pl->s, &P.pl->sim, &P.hw, &whole, &per_group), MF_OK);
  EXPECT_LE(per_group->n_slabs, st->n_slabs);
  // A layer's expert weights of one phase travel together: the slab holding
  // the first expert's H2D holds every other expert's of that layer too.
  const mf_program *p = P.g.p;
  int found = 0;
  for (int32_t c = 0; c < per_group->n_copies && !found; c++) {
    const mf_staging_copy &cp = per_group->copies[c];
    if (std::strstr(p->tensors[cp.tensor].name, "layers.1.mlp.experts.0.") == nullptr) continue;
    if (per_group->slabs[cp.slab].dir != MF_I_H2D) continue;
    const mf_staging_slab &x = per_group->slabs[cp.slab];
    int experts = 0;
    for (int32_t j = x.first_copy; j < x.first_copy + x.n_copies; j++)
      experts +=
          std::strstr(p->tensors[per_group->copies[j].tensor].name, "layers.1.mlp.experts.") != nullptr;
    EXPECT_GE(experts, (int)(3 * p->spec.experts));
    found = 1;
  }
  EXPECT_TRUE(found);
  // The pool does not depend on how copies are grouped into slabs.
  EXPECT_EQ(per_copy->pool_bytes, st->pool_bytes);
  EXPECT_EQ(per_group->pool_bytes, st->pool_bytes);
  mf_staging_free(st);
  mf_staging_free(per_copy);
  mf_staging_free(per_group);
}

TEST(StagingShape, BoundedByALimitWhenItCanBe) {
  Planned P;
  P.Make(0, 1, 1);
  mf_staging *st = nullptr, *b = nullptr;
  int fits = -1;
  mf_staging_opts whole{0, SIZE_MAX};
  ASSERT_EQ(mf_staging_build(P.pl->s, &P.pl->sim, &P.hw, &whole, &st), MF_OK);
  ASSERT_EQ(mf_staging_build_within(P.pl->s, &P.pl->sim, &P.hw, &whole, 0, &b, &fits), MF_OK);
  EXPECT_EQ(fits, 1);
  EXPECT_EQ(b->arena_bytes, st->arena_bytes);
  mf_staging_free(b);
  // Generous: fits as it is. Impossible (1 byte): the smallest layout found, not fitting.
  ASSERT_EQ(mf_staging_build_within(P.pl->s, &P.pl->sim, &P.hw, &whole, st->arena_bytes, &b, &fits), MF_OK);
  EXPECT_EQ(fits, 1);
  EXPECT_EQ(b->arena_bytes, st->arena_bytes);
  mf_staging_free(b);
  ASSERT_EQ(mf_staging_build_within(P.pl->s, &P.pl->sim, &P.hw, &whole, 1, &b, &fits), MF_OK);
  EXPECT_EQ(fits, 0);
  EXPECT_LE(b->arena_bytes, st->arena_bytes);
  EXPECT_GE(b->arena_bytes, b->peak_inflight_bytes);
  mf_staging_free(b);
  mf_staging_free(st);
}

// A host slower than the links piles slabs up; within a bound the copies are
// held back instead, and the layout says by how much.
TEST(StagingShape, HoldsCopiesBackToFitALimit) {
  Planned P;
  P.Make(2, 1, 1, 3);
  P.hw.host_memory_bandwidth = 4e8;  // the links move 2e9 B/s
  mf_staging_opts small{0, 512, 0};
  mf_staging *free_running = nullptr, *b = nullptr;
  ASSERT_EQ(mf_staging_build(P.pl->s, &P.pl->sim, &P.hw, &small, &free_running), MF_OK);
  const uint64_t limit =
      std::max<uint64_t>(free_running->arena_bytes / 2, 3 * free_running->largest_slab_bytes);
  ASSERT_LT(limit, free_running->arena_bytes) << "the case does not need holding back";
  int fits = -1;
  ASSERT_EQ(mf_staging_build_within(P.pl->s, &P.pl->sim, &P.hw, &small, limit, &b, &fits), MF_OK);
  EXPECT_EQ(fits, 1);
  EXPECT_EQ(b->throttled, 1);
  EXPECT_LE(b->arena_bytes, limit);
  EXPECT_GT(b->d2h_slip_seconds, 0.0);
  EXPECT_EQ(b->n_slabs, free_running->n_slabs);
  mf_staging_free(b);
  mf_staging_free(free_running);
}

TEST(StagingShape, RefusesBadArguments) {
  Planned P, Q;
  P.Make(0, 1, 1);
  Q.Make(1, 1, 1);
  mf_staging *st = nullptr;
  EXPECT_EQ(mf_staging_build(P.pl->s, &Q.pl->sim, &P.hw, nullptr, &st), MF_ERR_INVALID_ARG);
  EXPECT_EQ(st, nullptr);
  mf_staging_opts bad{300, 0};
  EXPECT_EQ(mf_staging_build(P.pl->s, &P.pl->sim, &P.hw, &bad, &st), MF_ERR_INVALID_ARG);
  EXPECT_NE(std::string(mf_last_error()).find("align 300"), std::string::npos) << mf_last_error();
  mf_hwprofile hw = P.hw;
  hw.host_memory_bandwidth = 0;
  EXPECT_EQ(mf_staging_build(P.pl->s, &P.pl->sim, &hw, nullptr, &st), MF_ERR_INVALID_ARG);
  EXPECT_NE(std::string(mf_last_error()).find("host memory bandwidth"), std::string::npos) << mf_last_error();
  EXPECT_EQ(st, nullptr);
  mf_staging_free(nullptr);
}

}  // namespace
