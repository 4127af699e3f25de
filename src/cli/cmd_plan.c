/* `moefit plan CONFIG`: what the planner decides for a config, beside the baselines. */
#include <fnmatch.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "planner/render.h"
#include "planner/run_plan.h"
#include "planner/simulate.h"
#include "src/cli/commands.h"
#include "src/config/config.h"
#include "src/model/hf_config.h"
#include "src/model/params.h"
#include "src/model/program.h"
#include "src/train/run.h"

static const char k_usage[] =
    "usage: moefit plan CONFIG [key=value ...] [--tensor PATTERN] [--json FILE] [--svg FILE]\n"
    "                  [--ranks N [--node-ranks K]]\n"
    "       moefit plan CONFIG [key=value ...] --sweep KEY=V1,V2,... [--sweep KEY2=...]\n\n"
    "Shows what `moefit train CONFIG` will run: one training step of CONFIG's model and batch\n"
    "planned within memory.device_budget — for every weight resident or streamed, every\n"
    "gradient kept on the device or streamed home, every parameter's AdamW update on the host\n"
    "or on the device, every activation kept, offloaded or recomputed; the device arena; and\n"
    "the predicted step time from the hardware profile (hardware.profile), beside the\n"
    "baselines: everything resident, ZeRO-Offload-like, MegaTrain-like, checkpoint every layer,\n"
    "and the least-memory plan. The device budget covers everything on the device: what the\n"
    "backend keeps beside the arena (cuda: cuBLASLt workspace, kernel scratch, the CUDA\n"
    "context; with kernels.attention cudnn the scratch holds cuDNN attention's backward workspace,\n"
    "on its own line) comes off it first; auto is the GPU's free memory, or without one to ask the\n"
    "profile's device memory. train makes its plan with the same function and writes it to\n"
    "OUTPUT_DIR/plan.json: the same bytes as --json gives for the same config and overrides.\n"
    "A config for plan needs only the model (no data.train, no train.steps): with model.path, only\n"
    "the checkpoint's config.json, so a model can be planned before its weights are downloaded.\n\n"
    "The plans table's seconds a step: step s = compute + exp.xfer + exp.opt, where compute is the\n"
    "compute stream's work, exp.xfer the time it waits on copies between host and device (exposed\n"
    "transfer), exp.opt the time the step waits on the host optimizer (exposed optimizer). The\n"
    "report ends with the bound: the largest of the three parts, named compute, uploads (H2D),\n"
    "copies home (D2H), host optimizer or NVMe (the optimizer's state streaming from NVMe sets its\n"
    "pace), with each part's seconds. train.overlap_optimizer auto (cuda) takes whichever of\n"
    "behind-the-next-step or after-each-step the planner predicts faster for the chosen plan.\n\n"
    "Exit status: 0 when the chosen plan fits every limit — its arena the device budget, its\n"
    "host memory memory.host_limit (the excess spilled to NVMe under memory.nvme_dir, which\n"
    "must exist with the room), its pinned memory memory.pinned_limit; 1 when it does not\n"
    "(train and eval refuse it): the plan is still shown (and --json/--svg written), then a\n"
    "closing line on stderr names each limit it is over and the keys to change. A row's last\n"
    "column says \"fits\" only when that plan fits them all, else which limits it is over.\n"
    "2: a usage error.\n\n"
    "  --tensor PATTERN   each matching tensor's decision and the predicted cost of the alternatives\n"
    "                     (a shell glob over names, e.g. 'model.layers.0.*'): a weight's name shows\n"
    "                     the weight, its gradient and where its optimizer runs (host or device);\n"
    "                     'grad.NAME' the gradient alone; activations without their mbN. prefix\n"
    "  --json FILE        write the chosen plan (versioned JSON, readable by the executor)\n"
    "  --svg FILE         draw the chosen plan's step: the compute, H2D and D2H streams and the\n"
    "                     host (staging fills and copy-outs, the host AdamW) over time, and the\n"
    "                     device memory curve against the budget (hover for names)\n"
    "  --ranks N          plan one rank of `mpirun -np N moefit train` (under mpirun: its -np):\n"
    "                     a step of N x train.grad_accum micro-batches, the optimizer on the host,\n"
    "                     each rank's device memory, the node's host memory (one copy of the state\n"
    "                     for the node's ranks) and the gradients' reduction\n"
    "  --node-ranks K     of the N ranks, K on each machine (default: all N on one)\n"
    "  --sweep KEY=V1,V2  plan once per value (a value may be a YAML list: 'KEY=[a, b],[c]'); several\n"
    "                     --sweep plan every combination (at most 64 plans). One row each: the\n"
    "                     values, fits (or the limits it is over), the arena, host memory, the\n"
    "                     predicted step and tokens/s, and the bound. Exit status 0 when at least\n"
    "                     one fits, 1 when none does. E.g. --sweep memory.device_budget=24GiB,40GiB,76GiB\n\n"
    "When a plan is over memory.host_limit (or spills to a memory.nvme_dir it has not got), the line\n"
    "before the closing error lists what was planned instead, each with its host memory and\n"
    "predicted step: the AdamW moments in bf16, LoRA over the frozen bf16 base, spilling to NVMe.\n"
    "Planning a real-size model shows its progress on a terminal after 2 s.\n\n"
    "hardware.profile: a profile file (configs/hw/*.yaml, or `moefit profile` output); auto uses\n"
    "on cpu runs/hw/cpu.yaml, which plan (like train and eval) first measures when it is missing\n"
    "(as `moefit profile --quick`, some seconds, once); on cuda OUTPUT/hw-cuda.yaml, else\n"
    "runs/hw/cuda.yaml, else configs/hw/h100-pcie.yaml (spec-sheet estimates; a bundled file is\n"
    "built in when it is not there). With the GPU present and no cuda profile measured, plan\n"
    "(like train) first measures one into OUTPUT/hw-cuda.yaml (`moefit profile --help`).\n";

/* A row's last column: "fits" only when the plan fits every limit, else the limits it is over. */
static const char *fit_label(const mf_run_fit *f, char *buf, size_t cap) {
  if (f->all) return "fits";
  const char *over[4] = {f->device ? NULL : "device_budget", f->host ? NULL : "host_limit",
                         f->nvme ? NULL : "nvme_dir", f->pinned ? NULL : "pinned_limit"};
  size_t o = (size_t)snprintf(buf, cap, "over");
  for (int i = 0, k = 0; i < 4; i++)
    if (over[i] && o < cap) o += (size_t)snprintf(buf + o, cap - o, "%s %s", k++ ? "," : "", over[i]);
  return buf;
}

/* The plans table: its header row, then one row per plan (row()). */
static const char k_plans_align[] = "lrrrrrrrrl";

static void plans_header(mf_table *tb) {
  static const char *const head[] = {"plan",   "arena",   "peak",     "H2D/step", "D2H/step",
                                     "step s", "compute", "exp.xfer", "exp.opt",  ""};
  for (size_t i = 0; i < sizeof head / sizeof head[0]; i++) mf_table_cell(tb, "%s", head[i]);
}

static void row(mf_table *tb, const char *name, const mf_plan *pl, const char *status) {
  char arena[32], peak[32], h2d[32], d2h[32];
  const mf_sim_result *r = &pl->sim;
  mf_table_cell(tb, "%s", name);
  mf_table_cell(tb, "%s", mf_format_bytes(pl->s->arena_bytes, arena, sizeof arena));
  mf_table_cell(tb, "%s", mf_format_bytes(pl->s->peak_live_bytes, peak, sizeof peak));
  mf_table_cell(tb, "%s", mf_format_bytes(r->h2d_bytes, h2d, sizeof h2d));
  mf_table_cell(tb, "%s", mf_format_bytes(r->d2h_bytes, d2h, sizeof d2h));
  const double secs[4] = {r->step_seconds, r->compute_seconds, r->exposed_transfer_seconds,
                          r->exposed_optimizer_seconds};
  for (int k = 0; k < 4; k++) mf_table_cell(tb, "%.4f", secs[k]);
  mf_table_cell(tb, "%s", status);
}

/* The pinned home (planner/run_plan.h mf_pinned_home): the regions pinned
 * so that their copies go straight, what each moves a step and the host
 * copies through staging slabs that saves, and what was left out. */
static void home_summary(const mf_run_plan *rp, const mf_config_memory *mem) {
  const mf_pinned_home *h = &rp->home;
  char a[32], b[32];
  printf("\npinned home: %s", mf_format_bytes(h->bytes, a, sizeof a));
  if (!mem->pinned_home)
    printf(" (memory.pinned_home: false; the executor's offloaded activations only)");
  else if (mem->pinned_limit && !rp->inside)
    printf(" (within memory.pinned_limit %s, beside the staging arena)", mf_format_bytes(mem->pinned_limit, b, sizeof b));
  else if (h->budget && !rp->inside)
    printf(" of %s (auto: half of memory.host_limit)", mf_format_bytes(h->budget, b, sizeof b));
  printf(", %d copies a step straight from or into it\n", h->n_direct);
  for (int k = 0; k < MF_HOME_REGIONS_; k++) {
    if (!h->pinned[k]) continue;
    char c[32];
    const uint64_t part = h->pin_hi[k] - h->pin_lo[k], span = h->hi[k] - h->lo[k];
    printf("  %s %s%s%s: %s a step across the link, %.3g s/step of host copies saved\n",
           mf_home_region_name((mf_home_region)k), mf_format_bytes(part, a, sizeof a), part < span ? " of " : "",
           part < span ? mf_format_bytes(span, c, sizeof c) : "", mf_format_bytes(h->pin_step_bytes[k], b, sizeof b),
           h->host_s[k]);
  }
  if (h->left_out[0]) printf("  %s\n", h->left_out);
}

/* The run's pinned staging arena (when copies are staged) beside a
 * ZeRO-Infinity-style pool, and its host memory against memory.host_limit,
 * with the NVMe spill past it. */
static void staging_summary(const mf_run_plan *rp, const mf_config_memory *mem) {
  const mf_staging *sg = rp->staging;
  char a[32], b[32], c[32], d[32];
  if (!sg) {
    printf("\ncopies: straight between host memory and the device arena (memory.staging %s on the %s backend)\n",
           mem->staging == MF_CONFIG_STAGING_OFF ? "false" : "auto: off", rp->dev.name);
    return;
  }
  printf(
      "\npinned staging: %s in %d exact-size slabs (<= %s each, largest %s; %d busy at once, %s in flight at "
      "most)\n",
      mf_format_bytes(sg->arena_bytes, a, sizeof a), sg->n_slabs, mf_format_bytes(sg->opts.max_slab_bytes, b, sizeof b),
      mf_format_bytes(sg->largest_slab_bytes, c, sizeof c), sg->max_slabs_inflight,
      mf_format_bytes(sg->peak_inflight_bytes, d, sizeof d));
  printf(
      "  host copies into/out of it: %.3f s/step of host memory time; copy-out lags the D2H stream by up to "
      "%.3f s\n",
      sg->host_copy_seconds, sg->max_drain_lag_seconds);
  printf("  vs ZeRO-Infinity-style pool: %d buffers x %s (largest tensor) = %s; staging/pool = %.3f\n",
         sg->pool_buffers, mf_format_bytes(sg->pool_buffer_bytes, a, sizeof a),
         mf_format_bytes(sg->pool_bytes, b, sizeof b),
         sg->pool_bytes ? (double)sg->arena_bytes / (double)sg->pool_bytes : 0.0);
  if (!mem->pinned_limit) return;
  mf_format_bytes(mem->pinned_limit, a, sizeof a);
  if (rp->staging_fits && !sg->throttled)
    printf("  within memory.pinned_limit %s\n", a);
  else if (rp->staging_fits)
    printf(
        "  within memory.pinned_limit %s only by holding copies back: H2D starts up to %.3f s and D2H up to %.3f "
        "s later than simulated (not in the predicted step)\n",
        a, sg->h2d_slip_seconds, sg->d2h_slip_seconds);
  else
    printf("  OVER memory.pinned_limit %s: no layout found within it (the largest slab alone is %s); raise the "
           "limit\n",
           a, mf_format_bytes(sg->largest_slab_bytes, b, sizeof b));
}

static void host_summary(const mf_run_plan *rp, const mf_config_memory *mem) {
  const mf_host_usage *u = &rp->host;
  const mf_hwprofile *hw = &rp->hw;
  char a[32], b[32], c[32], d[32], g[32];
  const int bf16_moments = mem->adam_moments == MF_CONFIG_MOMENTS_BF16; /* train.adam_moments */
  const char *parts[6] = {
      "fp32 master weights",   "working copy",
      "fp32 gradient sums",    bf16_moments ? "Adam moments (bf16)" : "Adam moments (fp32)",
      "offloaded activations", "pinned staging"};
  const uint64_t bytes[6] = {u->master_bytes, u->working_bytes, u->grad_bytes,
                             u->moment_bytes, u->act_bytes,     u->pinned_bytes};
  printf("host memory:");
  for (int i = 0; i < 6; i++) printf("%s %s %s", i ? " +" : "", parts[i], mf_format_bytes(bytes[i], a, sizeof a));
  printf(" = %s of host_limit %s", mf_format_bytes(u->total_bytes, a, sizeof a),
         mf_format_bytes(u->host_limit, b, sizeof b));
  if (u->host_fits) {
    printf(": fits\n");
    return;
  }
  printf(": over by %s\n", mf_format_bytes(u->total_bytes - u->host_limit, a, sizeof a));
  if (u->spill_cold_master_bytes > 0)
    printf("  NVMe spill: master weights of parameters updated on the device %s (no per-step traffic)\n",
           mf_format_bytes(u->spill_cold_master_bytes, a, sizeof a));
  char wk[32];
  if (u->spill_moment_bytes + u->spill_master_bytes + u->spill_working_bytes + u->spill_grad_bytes > 0)
    printf("  NVMe spill: moments %s, master weights %s, working copy %s, gradient sums %s: %s read+written per "
           "step = %.3f s/step at %s/s\n",
           mf_format_bytes(u->spill_moment_bytes, a, sizeof a), mf_format_bytes(u->spill_master_bytes, b, sizeof b),
           mf_format_bytes(u->spill_working_bytes, wk, sizeof wk), mf_format_bytes(u->spill_grad_bytes, g, sizeof g),
           mf_format_bytes(mf_host_spill_traffic_bytes(u), c, sizeof c),
           (double)mf_host_spill_traffic_bytes(u) / hw->nvme_bandwidth,
           mf_format_bytes((uint64_t)hw->nvme_bandwidth, d, sizeof d));
  if (u->unplaced_bytes > 0)
    printf("  DOES NOT FIT: %s fit neither host memory nor NVMe (%s)\n",
           mf_format_bytes(u->unplaced_bytes, a, sizeof a), mf_host_unplaced_why(u, mem));
}

static const char *strip_micro(const char *name) {
  if (name[0] == 'm' && name[1] == 'b') {
    const char *dot = strchr(name, '.');
    if (dot) return dot + 1;
  }
  return name;
}

/* One alternative of --tensor: d scheduled and simulated as the chosen plan was. */
static mf_status price(const mf_plan *chosen, const mf_decisions *d, const char *what) {
  mf_plan *alt = NULL;
  MF_CHECK(mf_plan_evaluate_like(chosen, d, &alt));
  char arena[32];
  printf("  %s %.4fs %s%s", what, alt->sim.step_seconds,
         mf_format_bytes(alt->s->arena_bytes, arena, sizeof arena), alt->fits ? "" : " (over budget)");
  mf_plan_free(alt);
  return MF_OK;
}

/* --tensor: each matching tensor's decision and what the alternatives would
 * cost; for a weight, also its optimizer's placement and the other one. */
static mf_status explain(const mf_program *p, const mf_plan *chosen, const char *pattern) {
  mf_decisions *d = NULL;
  MF_CHECK(mf_decisions_create(p, &d));
  int shown = 0;
  mf_status st = MF_OK;
  printf("\ntensors matching %s (alternatives: predicted step seconds, arena):\n", pattern);
  for (int32_t t = 0; t < p->n_tensors && shown < 50 && st == MF_OK; t++) {
    const mf_ptensor *x = &p->tensors[t];
    int is_param = x->kind == MF_T_PARAM, is_grad = x->kind == MF_T_GRAD;
    int is_act = mf_schedule_can_offload(p, t);
    if (!is_param && !is_grad && !is_act) continue;
    if (is_act && x->micro != 0) continue; /* one micro-batch speaks for all */
    /* A gradient answers to its weight's name too: a weight's pattern shows
     * both (and the gradient alone as grad.NAME). */
    const char *name = strip_micro(x->name);
    if (fnmatch(pattern, name, 0) != 0 && !(is_grad && strncmp(name, "grad.", 5) == 0 && fnmatch(pattern, name + 5, 0) == 0))
      continue;
    shown++;
    int n_alt = is_act ? 3 : 2;
    int cur = is_param ? chosen->d->param[x->param] : is_grad ? chosen->d->grad[x->param] : chosen->d->act[t];
    const char *cur_name = is_param  ? mf_param_dec_name((mf_param_dec)cur)
                           : is_grad ? mf_grad_dec_name((mf_grad_dec)cur)
                                     : mf_act_dec_name((mf_act_dec)cur);
    printf("  %-64s %-9s", strip_micro(x->name), cur_name);
    for (int a = 0; a < n_alt; a++) {
      MF_CHECK_GOTO(mf_decisions_copy(chosen->d, d), st, done);
      if (is_param) d->param[x->param] = (uint8_t)a;
      if (is_grad) d->grad[x->param] = (uint8_t)a;
      if (is_act) {
        if (a == MF_ACT_RECOMPUTE && !mf_schedule_can_recompute(p, t)) continue;
        for (int32_t u = 0; u < p->n_tensors; u++) /* every micro-batch's copy */
          if (p->tensors[u].micro >= 0 && strcmp(strip_micro(p->tensors[u].name), strip_micro(x->name)) == 0)
            d->act[u] = (uint8_t)a;
      }
      /* Streamed weights or gradient: the host updates them (the optimizer
       * on the device needs both on the device). */
      int home = 0;
      if ((is_param || is_grad) && d->optim[x->param] == MF_OPTIM_DEVICE &&
          (d->param[x->param] != MF_PARAM_RESIDENT || d->grad[x->param] != MF_GRAD_DEVICE)) {
        d->optim[x->param] = MF_OPTIM_HOST;
        home = 1;
      }
      char what[64];
      snprintf(what, sizeof what, "%s%s",
               is_param  ? mf_param_dec_name((mf_param_dec)a)
               : is_grad ? mf_grad_dec_name((mf_grad_dec)a)
                         : mf_act_dec_name((mf_act_dec)a),
               home ? " (optimizer host)" : "");
      MF_CHECK_GOTO(price(chosen, d, what), st, done);
    }
    printf("\n");
    if (is_param && !p->forward_only) {
      const int32_t i = x->param;
      printf("  %-64s %-9s", "  its optimizer", mf_optim_dec_name((mf_optim_dec)chosen->d->optim[i]));
      for (int a = MF_OPTIM_HOST; a <= MF_OPTIM_DEVICE; a++) {
        if (a == MF_OPTIM_DEVICE &&
            (chosen->d->param[i] != MF_PARAM_RESIDENT || chosen->d->grad[i] != MF_GRAD_DEVICE)) {
          printf("  device: not with its %s streamed",
                 chosen->d->param[i] != MF_PARAM_RESIDENT ? "weights" : "gradient");
          continue;
        }
        MF_CHECK_GOTO(mf_decisions_copy(chosen->d, d), st, done);
        d->optim[i] = (uint8_t)a;
        MF_CHECK_GOTO(price(chosen, d, mf_optim_dec_name((mf_optim_dec)a)), st, done);
      }
      printf("\n");
    }
  }
  if (shown == 0) {
    const char *weight = "?", *act = NULL;
    for (int32_t t = p->n_tensors - 1; t >= 0; t--) {
      if (p->tensors[t].kind == MF_T_PARAM) weight = p->tensors[t].name;
      if (mf_schedule_can_offload(p, t)) act = strip_micro(p->tensors[t].name);
    }
    printf("  (no weight, gradient or activation matches; names look like '%s' (a weight, shown with its "
           "gradient and optimizer)%s%s%s)\n",
           weight, act ? " and '" : "", act ? act : "", act ? "' (an activation)" : "");
  }
done:
  if (st != MF_OK) printf("\n");
  mf_decisions_free(d);
  return st;
}

static int parse_count(const char *s, int64_t *out) {
  char *end = NULL;
  const long long v = strtoll(s, &end, 10);
  if (end == s || *end) return -1;
  *out = v;
  return 0;
}

/* --ranks: what one rank and one node hold, and the gradients' way to one sum. */
static void ranks_summary(const mf_run_plan *rp, int64_t ranks) {
  const mf_program *p = rp->prog;
  const mf_host_usage *u = &rp->host;
  const int64_t nr = p->node_ranks, nodes = rp->nodes;
  char a[32], b[32], c[32], d[32];
  printf(
      "ranks: %lld (%lld a node, %lld node%s); each rank's device arena %s; a node's host memory %s: the "
      "state (master, working copy, gradient sums, moments) %s once for its ranks, their offloaded "
      "activations and pinned staging %s\n",
      (long long)ranks, (long long)nr, (long long)nodes, nodes == 1 ? "" : "s",
      mf_format_bytes(rp->plan->s->arena_bytes, a, sizeof a), mf_format_bytes(u->total_bytes, b, sizeof b),
      mf_format_bytes(u->master_bytes + u->working_bytes + u->grad_bytes + u->moment_bytes, c, sizeof c),
      mf_format_bytes(u->act_bytes + u->pinned_bytes, d, sizeof d));
  if (p->ep > 1) {
    double ex = 0; /* the step's exchanges, as the simulation prices them */
    int64_t n_ex = 0;
    for (int32_t k = 0; k < p->n_ops; k++)
      if (mf_kernel_is_exchange(p->ops[k].kind)) ex += mf_sim_op_seconds(p, k, &rp->hw), n_ex++;
    const int64_t groups = ranks / p->ep;
    char dp[200] = "";
    if (groups > 1 && nodes > 1)
      snprintf(dp, sizeof dp, " in each of %lld groups, %lld a node, data parallel between them (an expert's "
               "owners add into its sum group after group in a node, the nodes' sums in node order)",
               (long long)groups, (long long)(nr / p->ep));
    else if (groups > 1)
      snprintf(dp, sizeof dp, " in each of %lld groups, data parallel between them (an expert's owners add "
               "into its sum group after group)", (long long)groups);
    else if (nodes > 1)
      snprintf(dp, sizeof dp,
               " on %lld nodes (a node's home holds its ranks' experts' gradients, the leaders' exchange "
               "adds the others'; the rows between nodes at network.bandwidth)",
               (long long)nodes);
    printf(
        "  experts: over %lld ranks%s (%lld of %lld a rank, every MoE layer): the plan is rank 0's; each "
        "rank's experts run over the rows of its group's micro-batches; %lld exchanges a step (dispatch "
        "and combine, forward and backward), %.4f s at %s/s a rank (%s)\n",
        (long long)p->ep, dp, (long long)(p->spec.experts / p->ep), (long long)p->spec.experts,
        (long long)n_ex, ex,
        mf_format_bytes((uint64_t)mf_hw_link_bandwidth(&rp->hw), c, sizeof c),
        rp->hw.nvlink_bandwidth > 0           ? "nvlink.bandwidth"
        : rp->hw.copies_overlap_compute ? "no nvlink in the profile: through host memory, at its link"
                                              : "shared memory: host.memory_bandwidth");
  }
  printf(
      "  gradients: each rank's copies home add into the node's one sum in rank order (%s a rank a step, the "
      "D2H above)%s; ",
      mf_format_bytes(rp->plan->s->d2h_bytes, a, sizeof a),
      p->ep > 1 ? "; an expert's, its rank's alone" : "");
  if (nodes > 1 && isnan(rp->between_nodes_s))
    printf(
        "between nodes the leaders exchange the %s sum (each receives %lld x that) and add it in node order "
        "(not priced: the profile has no network: {bandwidth: ...})\n",
        mf_format_bytes(u->grad_bytes, b, sizeof b), (long long)(nodes - 1));
  else if (nodes > 1)
    printf(
        "between nodes the leaders exchange the %s sum (each receives %lld x that) and add it in node order: "
        "%.4f s a step at network.bandwidth %s/s, after the step's device work: %.4f s/step with it\n",
        mf_format_bytes(u->grad_bytes, b, sizeof b), (long long)(nodes - 1), rp->between_nodes_s,
        mf_format_bytes((uint64_t)rp->hw.network_bandwidth, c, sizeof c),
        rp->plan->sim.step_seconds + rp->between_nodes_s);
  else
    printf("one node: nothing crosses a network\n");
  printf(
      "  optimizer: host AdamW, each rank of a node updating 1/%lld of the parameters with its share of the "
      "cores (the predicted step time is one rank's)\n",
      (long long)nr);
}

/* ----------------------------------------------------------- --sweep */

enum { MAX_SWEEP_KEYS = 4, MAX_SWEEP_VALUES = 32, MAX_SWEEP_PLANS = 64 };

typedef struct sweep_key {
  char key[128];
  char *values[MAX_SWEEP_VALUES]; /* into text */
  int n;
  char text[1024];
} sweep_key;

/* "KEY=V1,V2,..." into k: values split at commas outside brackets (a value
 * may be a YAML list, "[q_proj, v_proj]"). 0, or -1 with why. */
static int parse_sweep(const char *arg, sweep_key *k, char *why, size_t cap) {
  const char *eq = strchr(arg, '=');
  if (!eq || eq == arg || (size_t)(eq - arg) >= sizeof k->key) {
    snprintf(why, cap, "--sweep '%s': expected KEY=V1,V2,...", arg);
    return -1;
  }
  snprintf(k->key, sizeof k->key, "%.*s", (int)(eq - arg), arg);
  if (snprintf(k->text, sizeof k->text, "%s", eq + 1) >= (int)sizeof k->text) {
    snprintf(why, cap, "--sweep %s: the values are too long", k->key);
    return -1;
  }
  k->n = 0;
  int depth = 0;
  char *v = k->text;
  for (char *c = k->text;; c++) {
    if (*c == '[' || *c == '{') depth++;
    if ((*c == ']' || *c == '}') && depth > 0) depth--;
    if (*c == 0 || (*c == ',' && depth == 0)) {
      const int end = *c == 0;
      *c = 0;
      while (*v == ' ') v++;
      if (!*v || k->n == MAX_SWEEP_VALUES) {
        snprintf(why, cap, "--sweep %s: %s", k->key,
                 *v ? "more than 32 values" : "an empty value (write KEY=V1,V2,...)");
        return -1;
      }
      k->values[k->n++] = v;
      v = c + 1;
      if (end) break;
    }
  }
  return 0;
}

/* What `moefit plan` plans, as train does (src/train/run.h: the plan is what
 * train runs): the config with its overrides, the run of `ranks` ranks
 * opened up to its plan (the model's table, the hardware profile — auto
 * measures one where it has to — the run plan). On failure the caller frees
 * what was made (cfg NULL where nothing was). */
static mf_status open_plan(const char *path, const char *const *over, size_t n, int64_t ranks, int64_t node_ranks,
                           mf_config **cfg, mf_run *run) {
  MF_CHECK(mf_config_load_for(path, over, n, MF_CONFIG_FOR_PLAN, cfg));
  (*cfg)->ranks = ranks;
  (*cfg)->node_ranks = node_ranks;
  const mf_run_opts o = {.use = MF_RUN_TRAIN, .upto = MF_RUN_PLANNED};
  return mf_run_open(*cfg, &o, run);
}

/* One plan of the sweep into the table's row: the values, then fits or not,
 * the arena, host memory, step, tokens/s and the bound (or the error). */
static int sweep_row(mf_table *tb, const char *path, const char *const *base, size_t n_base,
                     const char *const *extra, int n_extra, int64_t ranks, int64_t node_ranks) {
  const char *over[256 + MAX_SWEEP_KEYS];
  size_t n = 0;
  for (size_t i = 0; i < n_base; i++) over[n++] = base[i];
  for (int i = 0; i < n_extra; i++) over[n++] = extra[i];
  for (int i = 0; i < n_extra; i++) mf_table_cell(tb, "%s", strchr(extra[i], '=') + 1);
  mf_config *cfg = NULL;
  mf_run run;
  memset(&run, 0, sizeof run);
  int fits = 0;
  const mf_status st = open_plan(path, over, n, ranks, node_ranks, &cfg, &run);
  const mf_run_plan *rp = run.rp;
  if (st != MF_OK) {
    mf_table_cell(tb, "error");
    for (int c = 0; c < 4; c++) mf_table_cell(tb, "-");
    const char *e = mf_last_error();
    const char *nl = strchr(e, '\n');
    mf_table_cell(tb, "%.*s", (int)(nl ? nl - e : (long)strlen(e)), e); /* its first line */
  } else {
    const mf_plan *c = rp->plan;
    char status[64], a[32], h[32], tk[32];
    const int64_t tokens = cfg->train.micro_batch * cfg->data.seq_len * cfg->train.grad_accum * ranks;
    fits = rp->fit.all;
    mf_table_cell(tb, "%s", fit_label(&rp->fit, status, sizeof status));
    mf_table_cell(tb, "%s", mf_format_bytes(c->s->arena_bytes, a, sizeof a));
    mf_table_cell(tb, "%s", mf_format_bytes(rp->host.total_bytes, h, sizeof h));
    mf_table_cell(tb, "%.4f", c->sim.step_seconds);
    mf_table_cell(tb, "%s", mf_format_count((double)tokens / c->sim.step_seconds, tk, sizeof tk));
    mf_table_cell(tb, "%s", mf_plan_bound_name(mf_plan_bound(c)));
  }
  mf_run_close(&run);
  mf_config_free(cfg);
  return fits;
}

/* --sweep: one row per value (per combination of the keys' values). Exit
 * status 0 when at least one fits, 1 when none does. */
static int sweep(const char *path, const char *const *over, size_t n_over, const sweep_key *keys, int n_keys,
                 int64_t ranks, int64_t node_ranks) {
  int total = 1;
  for (int k = 0; k < n_keys; k++) total *= keys[k].n;
  if (total > MAX_SWEEP_PLANS)
    return mf_cli_usage_error("plan", "--sweep: %d plans; at most %d (fewer values)", total, MAX_SWEEP_PLANS);
  printf("sweep of %s: %d plan%s, each planned as `moefit plan` plans it\n\n", path, total, total == 1 ? "" : "s");
  mf_table *tb = NULL;
  char align[MAX_SWEEP_KEYS + 8];
  int a = 0;
  for (int k = 0; k < n_keys; k++) align[a++] = 'l';
  memcpy(align + a, "lrrrrl", 7);
  if (mf_table_create(align, &tb) != MF_OK) return mf_cli_fail("plan", MF_ERR_OUT_OF_MEMORY);
  for (int k = 0; k < n_keys; k++) mf_table_cell(tb, "%s", keys[k].key);
  static const char *const head[] = {"fits", "arena", "host memory", "step s", "tokens/s", "bound"};
  for (int c = 0; c < 6; c++) mf_table_cell(tb, "%s", head[c]);
  char extra_buf[MAX_SWEEP_KEYS][1200];
  const char *extra[MAX_SWEEP_KEYS];
  int fitting = 0;
  mf_progress_start("moefit plan --sweep", 0.0);
  for (int i = 0; i < total; i++) {
    int rest = i;
    for (int k = n_keys - 1; k >= 0; k--) { /* the last key varies fastest */
      snprintf(extra_buf[k], sizeof extra_buf[k], "%s=%s", keys[k].key, keys[k].values[rest % keys[k].n]);
      extra[k] = extra_buf[k];
      rest /= keys[k].n;
    }
    mf_progress_note("plan %d of %d", i + 1, total);
    fitting += sweep_row(tb, path, over, n_over, extra, n_keys, ranks, node_ranks);
  }
  mf_progress_stop();
  const mf_status st = mf_table_print(tb, stdout, "  ");
  mf_table_free(tb);
  if (st != MF_OK) return mf_cli_fail("plan", st);
  printf("\n%d of %d fit%s; step s and tokens/s are predicted, the bound is what the step waits on most "
         "(`moefit plan CONFIG KEY=VALUE` shows one whole)\n",
         fitting, total, fitting == 1 ? "s" : "");
  if (fitting == 0) {
    fflush(stdout);
    fprintf(stderr, "moefit plan: error: no plan of the sweep fits\n");
    return MF_EXIT_FAIL;
  }
  return MF_EXIT_OK;
}

int mf_cli_plan(int argc, char **argv) {
  if (mf_cli_wants_help(argc, argv)) {
    printf("%s", k_usage);
    return MF_EXIT_OK;
  }
  const char *path = NULL, *pattern = NULL, *json = NULL, *svg = NULL, *ranks_arg = NULL, *node_arg = NULL;
  const char *overrides[256];
  size_t n_over = 0;
  static sweep_key keys[MAX_SWEEP_KEYS];
  int n_keys = 0;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (strcmp(a, "--tensor") == 0 || strcmp(a, "--json") == 0 || strcmp(a, "--svg") == 0 ||
        strcmp(a, "--ranks") == 0 || strcmp(a, "--node-ranks") == 0 || strcmp(a, "--sweep") == 0) {
      if (i + 1 >= argc) return mf_cli_usage_error("plan", "%s needs a value", a);
      if (strcmp(a, "--sweep") == 0) {
        char why[256];
        if (n_keys == MAX_SWEEP_KEYS) return mf_cli_usage_error("plan", "--sweep: at most %d keys", MAX_SWEEP_KEYS);
        if (parse_sweep(argv[++i], &keys[n_keys], why, sizeof why) != 0)
          return mf_cli_usage_error("plan", "%s", why);
        n_keys++;
      } else if (strcmp(a, "--ranks") == 0)
        ranks_arg = argv[++i];
      else if (strcmp(a, "--node-ranks") == 0)
        node_arg = argv[++i];
      else if (strcmp(a, "--tensor") == 0)
        pattern = argv[++i];
      else if (strcmp(a, "--json") == 0)
        json = argv[++i];
      else
        svg = argv[++i];
    } else if (strncmp(a, "--", 2) == 0) {
      return mf_cli_usage_error("plan", "unknown option '%s'", a);
    } else if (!path) {
      path = a;
    } else if (strchr(a, '=') && n_over < 256) {
      overrides[n_over++] = a;
    } else {
      return mf_cli_usage_error("plan", "'%s' is not a key=value override", a);
    }
  }
  if (!path) return mf_cli_usage_error("plan", "expected a CONFIG file");
  int64_t ranks = 1, node_ranks = 0;
  if (!ranks_arg) ranks_arg = getenv("OMPI_COMM_WORLD_SIZE"); /* under mpirun: its ranks */
  if (!node_arg && getenv("OMPI_COMM_WORLD_SIZE")) node_arg = getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
  if (ranks_arg && (parse_count(ranks_arg, &ranks) != 0 || ranks < 1 || ranks > 65536))
    return mf_cli_usage_error("plan", "--ranks: '%s' is not a number of ranks (1 to 65536)", ranks_arg);
  if (node_arg && (parse_count(node_arg, &node_ranks) != 0 || node_ranks < 1 || node_ranks > ranks))
    return mf_cli_usage_error("plan", "--node-ranks: '%s' is not a number of ranks from 1 to --ranks (%lld)",
                              node_arg, (long long)ranks);
  if (n_keys > 0 && (pattern || json || svg))
    return mf_cli_usage_error("plan", "--sweep prints one row per plan: without --tensor, --json or --svg");
  if (n_keys > 0) return sweep(path, overrides, n_over, keys, n_keys, ranks, node_ranks);

  const double t0 = mf_time_now();
  mf_config *cfg = NULL;
  mf_run run;
  memset(&run, 0, sizeof run);
  mf_status st = MF_OK;
  MF_CHECK_GOTO(open_plan(path, overrides, n_over, ranks, node_ranks, &cfg, &run), st, done);
  const mf_param_table *t = run.t;
  const mf_run_plan *rp = run.rp;
  const mf_model_spec spec = t->spec;
  const mf_program *p = rp->prog;
  const mf_plan *chosen = rp->plan;

  int64_t total = 0, active = 0;
  mf_model_spec_param_count(&spec, &total, &active);
  char b1[32], b2[32], b3[32], b4[32], b5[32], b6[32];
  const int64_t tokens = cfg->train.micro_batch * cfg->data.seq_len * cfg->train.grad_accum * ranks;
  char n1[32], n2[32];
  printf(
      "plan for %s: %s, %s parameters (%s active), %lld layers, %lld experts top-%lld; %s order, %s "
      "device storage\n",
      path, mf_family_name(spec.family), mf_format_count((double)total, n1, sizeof n1),
      mf_format_count((double)active, n2, sizeof n2), (long long)spec.layers, (long long)spec.experts,
      (long long)spec.top_k, mf_program_order_name(p->order), mf_dtype_name(p->storage));
  if (t->lora_a) {
    char lora[512];
    mf_lora_describe(t, lora, sizeof lora);
    printf("%s\n", lora);
  }
  char rk[64] = "";
  if (ranks > 1) snprintf(rk, sizeof rk, "%lld ranks x ", (long long)ranks);
  printf("batch: %s%lld micro-batches x %lld sequences x %lld tokens = %lld tokens per step\n", rk,
         (long long)cfg->train.grad_accum, (long long)cfg->train.micro_batch, (long long)cfg->data.seq_len,
         (long long)tokens);
  if (rp->dev.total_bytes > 0)
    printf("device budget %s (%s) = %s the %s backend keeps (cuBLASLt workspace %s, kernel scratch %s, CUDA "
           "context %s) + %s for the arena\n",
           mf_format_bytes(rp->budget, b1, sizeof b1), rp->budget_source,
           mf_format_bytes(rp->dev.total_bytes, b2, sizeof b2), rp->dev.name,
           mf_format_bytes(rp->dev.workspace_bytes, b3, sizeof b3),
           mf_format_bytes(rp->dev.scratch_bytes, b4, sizeof b4), mf_format_bytes(rp->dev.context_bytes, b5, sizeof b5),
           mf_format_bytes(rp->arena_limit, b6, sizeof b6));
  printf("kernels: expert GEMMs on %s (%s), attention on %s (%s)\n", rp->kernels.expert_gemm,
         rp->kernels.expert_gemm_from, rp->kernels.attention, rp->kernels.attention_from);
  int64_t sliding = 0;
  for (int64_t l = 0; l < spec.layers; l++) sliding += mf_model_spec_window(&spec, l) > 0;
  /* calls the tensor-core and cuDNN kernels refuse (kernels/cuda/backend_cuda.cu) */
  const int sinks = mf_model_spec_has_sinks(&spec), dv = mf_model_spec_v_dim(&spec) != spec.head_dim;
  if (rp->dev.total_bytes > 0 && (sinks || sliding > 0 || dv) &&
      strcmp(rp->kernels.attention, "cuda-core") != 0)
    printf("  but this model's attention (%s) runs on the CUDA-core kernel, which the plan prices as %s\n",
           sinks || sliding > 0 ? "sink logits, sliding windows" : "value heads unlike q/k heads",
           rp->kernels.attention);
  if (rp->dev.attn_scratch_bytes > 0)
    printf("attention on cuDNN: %s of the kernel scratch is its backward's workspace\n",
           mf_format_bytes(rp->dev.attn_scratch_bytes, b1, sizeof b1));
  if (rp->dev.total_bytes == 0)
    printf("device budget %s (%s), all of it for the arena (the %s backend keeps nothing beside it)\n",
           mf_format_bytes(rp->budget, b1, sizeof b1), rp->budget_source, rp->dev.name);
  printf("hardware profile %s (%s)\n", rp->profile_path, rp->hw.name);
  if (rp->routed)
    printf("routing: measured, %s (%llu tokens): expert copies priced by the chance they happen\n",
           rp->routing_path, (unsigned long long)rp->routing.tokens);
  else if (rp->routing_note[0])
    printf("%s\n", rp->routing_note);
  else
    printf("routing: uniform (memory.routing: %s)\n", cfg->memory.routing ? cfg->memory.routing : "auto");
  mf_table *tb = NULL;
  MF_CHECK_GOTO(mf_table_create(k_plans_align, &tb), st, done);
  plans_header(tb);
  char status[64];
  row(tb, cfg->memory.plan_kind == MF_CONFIG_PLAN_AUTO ? "chosen" : "memory.plan", chosen,
      fit_label(&rp->fit, status, sizeof status));
  for (int k = MF_PLAN_RESIDENT; k < MF_PLAN_KIND_COUNT_ && st == MF_OK; k++) {
    mf_run_fit f;
    st = mf_run_plan_fit_of(rp, cfg, (mf_plan_kind)k, &f);
    if (st == MF_OK) row(tb, mf_plan_kind_name((mf_plan_kind)k), rp->all[k], fit_label(&f, status, sizeof status));
  }
  if (st != MF_OK) {
    mf_table_free(tb);
    goto done;
  }
  printf("\n");
  st = mf_table_print(tb, stdout, "  ");
  mf_table_free(tb);
  if (st != MF_OK) goto done;
  printf("\nseconds a step: step s = compute + exp.xfer + exp.opt; exp.xfer: the compute waiting on copies "
         "between host and device, exp.opt: waiting on the host optimizer\n");
  printf("%s: %.4f s/step predicted = %s tokens/s; host optimizer %s\n", chosen->name,
         chosen->sim.step_seconds, mf_format_count((double)tokens / chosen->sim.step_seconds, n1, sizeof n1),
         rp->overlap_optimizer ? "behind the next step's device work (train.overlap_optimizer)"
                               : "after each step (train.overlap_optimizer)");
  MF_CHECK_GOTO(mf_render_optimizer_summary(p, chosen->d, stdout), st, done);
  home_summary(rp, &cfg->memory);
  staging_summary(rp, &cfg->memory);
  host_summary(rp, &cfg->memory);
  if (ranks > 1) ranks_summary(rp, ranks);
  MF_CHECK_GOTO(mf_render_layer_table(p, chosen->d, stdout), st, done);
  if (pattern) MF_CHECK_GOTO(explain(p, chosen, pattern), st, done);
  if (json) {
    MF_CHECK_GOTO(mf_run_plan_write_json(rp, json), st, done);
    printf("\nplan written to %s\n", json);
  }
  if (svg) {
    MF_CHECK_GOTO(mf_render_svg(chosen, rp->staging, path, svg), st, done);
    printf("\ntimeline written to %s\n", svg);
  }
  char bound[512];
  mf_plan_bound_line(chosen, rp->overlap_optimizer, bound, sizeof bound);
  printf("\nplanned in %.2f s\n%s\n", mf_time_now() - t0, bound);
  char why[4400];
  if (mf_run_plan_misfit(rp, cfg, why, sizeof why) > 0) {
    /* Over host memory or short of NVMe: what would run, planned the same way, before the closing line. */
    char alts[2400];
    if ((!rp->fit.host || !rp->fit.nvme) && mf_run_plan_alternatives(rp, cfg, alts, sizeof alts) > 0)
      printf("\nplanned instead: %s\n", alts);
    fflush(stdout); /* the closing line after the report, also when both go to one file */
    st = MF_ERR(MF_ERR_CONFIG, "the plan cannot run: %s", why);
  }
done:
  mf_run_close(&run);
  mf_config_free(cfg);
  return st == MF_OK ? MF_EXIT_OK : mf_cli_fail("plan", st);
}
