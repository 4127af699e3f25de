// issue 29 item 2: copies straight from a pinned home (planner/run_plan.h
// mf_pinned_home). The run plan pins the host regions that cross the link
// every step — the bf16 working copy of streamed weights, gradient sums that
// land once a step, offloaded activations — within memory.pinned_limit, and
// their copies leave the staging arena:
//   - which copies go straight is exactly the pinned regions' copies (an
//     upload of a streamed weight, a gradient's copy home, an activation's
//     either way), and the staging layout holds every other copy;
//   - memory.pinned_home=false pins nothing and stages every copy;
//   - gradients that micro-batches add into the host's sum are not pinned;
//   - a pinned_limit with room for part of the home pins the most used
//     regions, says what it left out, and still fits (staging beside them);
//   - plan.json records the pinned bytes;
//   - the run registers each pinned span once with its backend (the cpu
//     twin counts the bytes), again for another buffer, and nothing when the
//     plan pins nothing.
// The same bits with and without the pinned home: plan_invariance_test.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "planner/run_plan.h"
#include "src/config/config.h"
#include "src/core/core.h"
#include "src/train/run.h"
#include "src/train/train_internal.h"
#include "src/train/train.h"
#include "tests/exec/phrases.h"

namespace {

const char kModel[] =
    "model:\n  init: {family: mixtral, hidden: 32, layers: 2, heads: 4, kv_heads: 2, experts: 4, top_k: 2,\n"
    "         expert_ffn: 32, vocab: 64, max_seq: 32, seed: 5}\n"
    "train: {micro_batch: 2, grad_accum: 2, steps: 2, warmup: 1, lr: 1e-2, log_every: 1, threads: 2,\n"
    "        precision: bf16}\n"
    "backend: cpu\n";

mf_config *load(const std::string &tag, const std::vector<std::string> &extra) {
  static const std::string train = phrase_tokens("pinned_home.tokens", 200, 3);
  std::vector<std::string> ov = {"data.train=" + train, "data.seq_len=16",
                                 "output.dir=" + tmp() + "/pinned_home_" + tag,
                                 "hardware.profile=configs/hw/cpu-2core.yaml", "memory.plan=least_memory",
                                 "memory.device_budget=64MiB"};
  return load_config(kModel, "pinned_home.yaml", ov, extra);
}

// A run opened up to `upto` for the config of `extra`.
struct Opened {
  mf_config *cfg = nullptr;
  mf_run r{};
  mf_status st = MF_OK;
  Opened(const std::string &tag, const std::vector<std::string> &extra, mf_run_stage upto = MF_RUN_PLANNED) {
    cfg = load(tag, extra);
    if (!cfg) {
      st = MF_ERR_CONFIG;
      return;
    }
    mf_run_opts o{};
    o.use = MF_RUN_TRAIN;
    o.upto = upto;
    st = mf_run_open(cfg, &o, &r);
    EXPECT_EQ(st, MF_OK) << mf_last_error();
  }
  ~Opened() {
    mf_run_close(&r);
    mf_config_free(cfg);
  }
  const mf_run_plan *rp() const { return r.rp; }
};

// The region a copy instruction belongs to, as the planner's rule says
// (run_plan.h), or -1; [*a, *e) its bytes in the region's buffer.
int region(const mf_schedule *s, int32_t i, uint64_t *a, uint64_t *e) {
  const mf_program *p = s->prog;
  const mf_instr *in = &s->instr[i];
  *a = *e = 0;
  if ((in->kind != MF_I_H2D && in->kind != MF_I_D2H) || i >= s->optim_begin) return -1;
  const int32_t t = s->slots[in->slot].tensor;
  if (s->host_offset[t] != SIZE_MAX) {
    *e = s->host_act_bytes;
    return MF_HOME_ACTS;
  }
  const mf_ptensor *pt = &p->tensors[t];
  int k = -1;
  if (in->kind == MF_I_H2D && pt->kind == MF_T_PARAM && !s->slots[in->slot].persist) k = MF_HOME_WORKING;
  if (in->kind == MF_I_D2H && pt->kind == MF_T_GRAD) k = MF_HOME_GRADS;
  if (k < 0) return -1;
  const mf_param &q = p->params->params[pt->param];
  *a = k == MF_HOME_WORKING ? (uint64_t)q.offset * 2 : (uint64_t)q.toff * 4;
  *e = *a + (uint64_t)q.numel * (k == MF_HOME_WORKING ? 2 : 4);
  return k;
}

// The direct flags are the pinned regions' copies, and the staging layout
// (when staged) holds exactly the others.
void ExpectDirectIsThePinnedRegions(const mf_run_plan *rp) {
  const mf_schedule *s = rp->plan->s;
  ASSERT_NE(rp->direct, nullptr);
  int32_t n_direct = 0, n_copies = 0;
  const mf_pinned_home &h = rp->home;
  for (int32_t i = 0; i < s->n_instr; i++) {
    uint64_t a = 0, e = 0;
    const int k = region(s, i, &a, &e);
    const bool copies = s->instr[i].kind == MF_I_H2D || s->instr[i].kind == MF_I_D2H;
    const bool want = k >= 0 && h.pinned[k] && a >= h.pin_lo[k] && e <= h.pin_hi[k];
    if (k >= 0) {
      EXPECT_GE(a, h.lo[k]) << i;
      EXPECT_LE(e, h.hi[k]) << i;
    }
    EXPECT_EQ(rp->direct[i] != 0, want) << "instruction " << i;
    n_direct += rp->direct[i] != 0;
    n_copies += copies;
    if (rp->staging) {
      EXPECT_EQ(rp->staging->copy_of_instr[i] >= 0, copies && !want) << "instruction " << i;
    }
  }
  EXPECT_EQ(n_direct, rp->home.n_direct);
  if (rp->staging) {
    EXPECT_EQ(rp->staging->n_copies, n_copies - n_direct);
  }
}

uint64_t span(const mf_pinned_home &h, int k) { return h.hi[k] - h.lo[k]; }
uint64_t pinned(const mf_pinned_home &h, int k) { return h.pin_hi[k] - h.pin_lo[k]; }

TEST(PinnedHome, TheStreamedRegionsGoStraightAndTheRestIsStaged) {
  Opened o("layer", {"memory.staging=true", "train.micro_batch_order=layer"});
  ASSERT_EQ(o.st, MF_OK);
  const mf_run_plan *rp = o.rp();
  const mf_pinned_home &h = rp->home;
  ASSERT_NE(rp->staging, nullptr);
  EXPECT_TRUE(rp->fit.all);
  // least_memory streams every weight and gradient: both regions pinned
  EXPECT_TRUE(h.pinned[MF_HOME_WORKING]);
  EXPECT_TRUE(h.pinned[MF_HOME_GRADS]) << "layer-major: each gradient lands home once";
  EXPECT_GT(h.n_direct, 0);
  uint64_t sum = 0;
  for (int k = 0; k < MF_HOME_REGIONS_; k++) {
    if (!h.pinned[k]) continue;
    EXPECT_EQ(pinned(h, k), span(h, k)) << "pinned whole: " << k;
    EXPECT_GT(span(h, k), 0u) << k;
    EXPECT_GT(h.step_bytes[k], 0u) << k;
    EXPECT_GT(h.host_s[k], 0.0) << k;
    sum += span(h, k);
  }
  EXPECT_EQ(h.bytes, sum);
  EXPECT_LE(h.hi[MF_HOME_WORKING], (uint64_t)rp->prog->params->total_numel * 2);
  EXPECT_LE(h.hi[MF_HOME_GRADS], (uint64_t)rp->prog->params->trainable_numel * 4);
  EXPECT_STREQ(h.left_out, "");
  EXPECT_EQ(rp->host.pinned_home_bytes, h.bytes);
  EXPECT_EQ(rp->fig.pinned_home_bytes, h.bytes);
  ExpectDirectIsThePinnedRegions(rp);
  // plan.json records it
  const std::string path = tmp() + "/pinned_home_layer.json";
  ASSERT_EQ(mf_run_plan_write_json(rp, path.c_str()), MF_OK) << mf_last_error();
  EXPECT_NE(slurp(path).find("\"pinned_home_bytes\": " + std::to_string(h.bytes)), std::string::npos);

  // Without the pinned home every copy is staged: a larger arena.
  Opened off("off", {"memory.staging=true", "train.micro_batch_order=layer", "memory.pinned_home=false"});
  ASSERT_EQ(off.st, MF_OK);
  EXPECT_EQ(off.rp()->home.bytes, 0u);
  EXPECT_EQ(off.rp()->home.n_direct, 0);
  ExpectDirectIsThePinnedRegions(off.rp());
  EXPECT_GT(off.rp()->staging->n_copies, rp->staging->n_copies);
  EXPECT_GT(off.rp()->staging->host_copy_seconds, rp->staging->host_copy_seconds);
  // The plan's decisions are the same: the pinned home only changes the copies' way.
  EXPECT_EQ(off.rp()->plan->s->n_instr, rp->plan->s->n_instr);

  // Straight copies (no staging arena): the same pinned home.
  Opened straight("straight", {"memory.staging=false", "train.micro_batch_order=layer"});
  ASSERT_EQ(straight.st, MF_OK);
  EXPECT_EQ(straight.rp()->staging, nullptr);
  EXPECT_EQ(straight.rp()->home.bytes, h.bytes);
  ExpectDirectIsThePinnedRegions(straight.rp());
}

TEST(PinnedHome, GradientsAddedIntoAtHomeAreNotPinned) {
  Opened o("micro", {"memory.staging=true", "train.micro_batch_order=micro"});
  ASSERT_EQ(o.st, MF_OK);
  const mf_schedule *s = o.rp()->plan->s;
  bool adds = false;
  for (int32_t i = 0; i < s->n_instr; i++)
    adds |= s->instr[i].kind == MF_I_D2H && s->instr[i].accumulate != 0;
  ASSERT_TRUE(adds) << "micro-batch-major order with 2 micro-batches adds gradients at home";
  EXPECT_FALSE(o.rp()->home.pinned[MF_HOME_GRADS]);
  EXPECT_TRUE(o.rp()->home.pinned[MF_HOME_WORKING]);
  ExpectDirectIsThePinnedRegions(o.rp());
}

// A limit under the home pins the regions by their value, the last one that
// fits in part: its part moves the most bytes a step of any window of its size.
TEST(PinnedHome, APinnedLimitWithRoomForPartPinsTheMostUsed) {
  Opened all("all", {"memory.staging=true", "train.micro_batch_order=layer"});
  ASSERT_EQ(all.st, MF_OK);
  const mf_pinned_home &h = all.rp()->home;
  ASSERT_TRUE(h.pinned[MF_HOME_WORKING] && h.pinned[MF_HOME_GRADS]);
  // Room for the larger region and any staging arena, not for both regions.
  Opened off("all_staged", {"memory.staging=true", "train.micro_batch_order=layer", "memory.pinned_home=false"});
  ASSERT_EQ(off.st, MF_OK);
  const uint64_t big = std::max(span(h, MF_HOME_WORKING), span(h, MF_HOME_GRADS));
  const uint64_t small = std::min(span(h, MF_HOME_WORKING), span(h, MF_HOME_GRADS));
  const uint64_t limit = big + off.rp()->staging->arena_bytes;
  ASSERT_LT(limit, h.bytes + (small > 0 ? 0 : 1)) << "the test needs a limit under both regions";
  Opened part("part", {"memory.staging=true", "train.micro_batch_order=layer",
                       "memory.pinned_limit=" + std::to_string(limit)});
  ASSERT_EQ(part.st, MF_OK);
  const mf_pinned_home &p = part.rp()->home;
  EXPECT_TRUE(part.rp()->fit.all) << "the staging arena fits beside what was pinned";
  const int whole = (pinned(p, MF_HOME_WORKING) == span(p, MF_HOME_WORKING) && p.pinned[MF_HOME_WORKING]) +
                    (pinned(p, MF_HOME_GRADS) == span(p, MF_HOME_GRADS) && p.pinned[MF_HOME_GRADS]);
  EXPECT_LE(whole, 1) << "not both whole";
  EXPECT_GT(pinned(p, MF_HOME_WORKING) + pinned(p, MF_HOME_GRADS), 0u) << "something pinned";
  uint64_t sum = 0;
  for (int k = 0; k < MF_HOME_REGIONS_; k++) sum += p.pinned[k] ? pinned(p, k) : 0;
  EXPECT_EQ(p.bytes, sum);
  EXPECT_LE(p.bytes + part.rp()->staging->arena_bytes, limit);
  EXPECT_NE(std::string(p.left_out).find("memory.pinned_limit"), std::string::npos) << p.left_out;
  EXPECT_TRUE(std::string(p.left_out).find("not pinned") != std::string::npos ||
              std::string(p.left_out).find(") staged: over the ") != std::string::npos)
      << p.left_out;
  // A region pinned in part: its part moves at least as many bytes a step as
  // any other window of its size that starts where a copy starts.
  const mf_schedule *s = part.rp()->plan->s;
  for (int k : {MF_HOME_WORKING, MF_HOME_GRADS}) {
    if (!p.pinned[k] || pinned(p, k) == span(p, k)) continue;
    EXPECT_GE(pinned(p, k), span(p, k) / 64) << "worth its registration";
    std::vector<std::pair<uint64_t, uint64_t>> r;  // each copy's bytes in the buffer
    for (int32_t i = 0; i < s->n_instr; i++) {
      uint64_t a = 0, e = 0;
      if (region(s, i, &a, &e) == k) r.emplace_back(a, e);
    }
    auto moved = [&](uint64_t lo, uint64_t hi) {
      uint64_t n = 0;
      for (const auto &c : r) n += c.first >= lo && c.second <= hi ? c.second - c.first : 0;
      return n;
    };
    EXPECT_EQ(moved(p.pin_lo[k], p.pin_hi[k]), p.pin_step_bytes[k]);
    for (const auto &c : r) EXPECT_LE(moved(c.first, c.first + pinned(p, k)), p.pin_step_bytes[k]) << c.first;
  }
  ExpectDirectIsThePinnedRegions(part.rp());
}

// With the host optimizer behind the next step, the staged copies' host time
// is simulated beside it (mf_sim_opts host_copy_seconds): the chosen plan's
// is what its staging layout counts, every plan shown is priced so, and the
// pinned home, which stages fewer copies, leaves the updates less to share.
TEST(PinnedHome, TheStagedCopiesHostTimeIsPricedBesideTheOverlappedOptimizer) {
  const std::vector<std::string> base = {"memory.staging=true", "train.micro_batch_order=layer",
                                         "train.overlap_optimizer=true"};
  std::vector<std::string> off_ov = base;
  off_ov.push_back("memory.pinned_home=false");
  Opened off("priced_off", off_ov), home("priced_home", base);
  ASSERT_EQ(off.st, MF_OK);
  ASSERT_EQ(home.st, MF_OK);
  for (const Opened *o : {&off, &home}) {
    const mf_run_plan *rp = o->rp();
    ASSERT_TRUE(rp->overlap_optimizer);
    ASSERT_NE(rp->staging, nullptr);
    EXPECT_NEAR(rp->plan->so.host_copy_seconds, rp->staging->host_copy_seconds,
                1e-12 * rp->staging->host_copy_seconds + 1e-18);
    for (int k = 0; k < MF_PLAN_KIND_COUNT_; k++) {
      if (rp->all[k]) {
        EXPECT_TRUE(rp->all[k]->so.overlap_optimizer) << k;
        EXPECT_GE(rp->all[k]->so.host_copy_seconds, 0.0) << k;
      }
    }
    EXPECT_EQ(rp->fig.predicted_step_seconds, rp->plan->sim.step_seconds);
  }
  EXPECT_GT(off.rp()->plan->so.host_copy_seconds, home.rp()->plan->so.host_copy_seconds);
  EXPECT_GE(off.rp()->plan->sim.optimizer_seconds, home.rp()->plan->sim.optimizer_seconds);
}

TEST(PinnedHome, TheRunRegistersEachSpanOnce) {
  Opened o("pins", {"memory.staging=true", "train.micro_batch_order=layer"}, MF_RUN_EXECUTOR);
  ASSERT_EQ(o.st, MF_OK);
  mf_run *r = &o.r;
  const mf_pinned_home &h = r->rp->home;
  ASSERT_TRUE(h.pinned[MF_HOME_WORKING] && h.pinned[MF_HOME_GRADS]);
  mf_backend_stats bs{};
  r->backend->get_stats(r->backend, &bs);
  EXPECT_EQ(bs.host_registered_bytes, 0u);
  const mf_param_table *t = r->t;
  std::vector<float> w((size_t)t->total_numel, 0.5f);
  ASSERT_EQ(mf_run_round_working(r, w.data(), w.size(), nullptr, nullptr), MF_OK) << mf_last_error();
  r->backend->get_stats(r->backend, &bs);
  const uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
  const uint64_t work = bs.host_registered_bytes;
  EXPECT_GE(work, span(h, MF_HOME_WORKING));
  EXPECT_LE(work, span(h, MF_HOME_WORKING) + 2 * page) << "widened to whole pages only";
  EXPECT_LE(work, (uint64_t)t->total_numel * 2) << "within the buffer";
  // again for the same buffer: nothing more
  ASSERT_EQ(mf_run_round_working(r, w.data(), w.size(), nullptr, nullptr), MF_OK);
  r->backend->get_stats(r->backend, &bs);
  EXPECT_EQ(bs.host_registered_bytes, work);
  // the gradient sums in a buffer of the caller's
  const size_t gbytes = (size_t)t->trainable_numel * sizeof(float);
  void *g1 = nullptr, *g2 = nullptr;
  ASSERT_EQ(posix_memalign(&g1, (size_t)page, gbytes), 0);
  ASSERT_EQ(posix_memalign(&g2, (size_t)page, gbytes), 0);
  ASSERT_EQ(mf_run_pin_home(r, MF_HOME_GRADS, g1, gbytes), MF_OK) << mf_last_error();
  r->backend->get_stats(r->backend, &bs);
  const uint64_t grads = bs.host_registered_bytes - work;
  EXPECT_GE(grads, span(h, MF_HOME_GRADS));
  EXPECT_LE(grads, gbytes);
  // another buffer: the first one's registration undone
  ASSERT_EQ(mf_run_pin_home(r, MF_HOME_GRADS, g2, gbytes), MF_OK);
  r->backend->get_stats(r->backend, &bs);
  EXPECT_EQ(bs.host_registered_bytes, work + grads);
  // a buffer smaller than the plan's span is a bug, said
  EXPECT_EQ(mf_run_pin_home(r, MF_HOME_GRADS, g1, (size_t)h.lo[MF_HOME_GRADS]), MF_ERR_INTERNAL);
  mf_run_close(r);  // unregisters before the buffers go
  free(g1);
  free(g2);

  Opened off("pins_off", {"memory.staging=true", "memory.pinned_home=false"}, MF_RUN_EXECUTOR);
  ASSERT_EQ(off.st, MF_OK);
  ASSERT_EQ(mf_run_round_working(&off.r, w.data(), w.size(), nullptr, nullptr), MF_OK);
  off.r.backend->get_stats(off.r.backend, &bs);
  EXPECT_EQ(bs.host_registered_bytes, 0u);
}

}  // namespace
