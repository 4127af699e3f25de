/* The run plan from a config (see run_plan.h): the one composition root of
 * `moefit plan`, `train` and `eval`. */
#include "planner/run_plan.h"

#include "src/core/env.h"
#include "src/core/hostbuf.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The bundled profiles, built in (configs/BUILD): configs/hw/cpu-2core.yaml and configs/hw/h100-pcie.yaml. */
extern const char mf_bundled_cpu_profile[];
extern const char mf_bundled_h100_profile[];

/* Once a process, the line saying that auto uses a bundled profile (train
 * plans its evaluation with the same profile). */
static void say_bundled(const mf_run_plan *rp, int cuda) {
  static int said;
  if (__atomic_exchange_n(&said, 1, __ATOMIC_RELAXED)) return;
  if (cuda)
    MF_LOGI("plan",
            "hardware.profile auto: %s, bundled with moefit (%s), not measured on this machine: with the GPU "
            "present, train, eval and plan measure it once into <output.dir>/" MF_PLAN_CUDA_PROFILE_CACHE
            " (`moefit profile --backend cuda`: into runs/hw/cuda.yaml), which auto then uses",
            rp->profile_path, rp->hw.name);
  else
    MF_LOGI("plan",
            "hardware.profile auto: %s, bundled with moefit (%s), not measured on this machine: "
            "`moefit profile` measures this one into runs/hw/cpu.yaml, which auto then uses",
            rp->profile_path, rp->hw.name);
}

/* hardware.profile: a file, or auto (planner/plan.h mf_plan_profile_path:
 * by the backend, a profile measured here, else the backend's bundled one).
 * A bundled profile missing where moefit runs is read from the copy built
 * into moefit, so a run that needs no profile of its own never fails for
 * want of one. Nothing is measured here (src/train/hwmeasure.h measures for
 * auto on cuda before the plan is made). */
static mf_status load_profile(const mf_config *cfg, mf_run_plan *rp) {
  const int cuda = strcmp(rp->dev.name, "cuda") == 0;
  mf_plan_profile_origin origin;
  char path[MF_PLAN_PROFILE_PATH_MAX]; /* + " (built in)" fits rp->profile_path */
  mf_plan_profile_path(cfg->hardware.profile, rp->dev.name, cfg->output.dir, path, sizeof path, &origin);
  if (origin == MF_PROFILE_BUNDLED && access(path, R_OK) != 0) {
    const char *text = cuda ? mf_bundled_h100_profile : mf_bundled_cpu_profile;
    snprintf(rp->profile_path, sizeof rp->profile_path, "%s (built in)", path);
    MF_CHECK(mf_hwprofile_parse(text, strlen(text), rp->profile_path, &rp->hw));
  } else {
    snprintf(rp->profile_path, sizeof rp->profile_path, "%s", path);
    MF_CHECK(mf_hwprofile_load(path, &rp->hw));
  }
  if (origin == MF_PROFILE_BUNDLED) say_bundled(rp, cuda);
  /* The cpu backend's ranks on one machine share its cores (train gives
   * each cores / ranks-on-the-machine threads): one rank's share of them. */
  if (rp->use == MF_RUN_TRAIN && cfg->ranks > 1 && strcmp(rp->dev.name, "cpu") == 0)
    mf_hwprofile_share_cores(
        &rp->hw, sysconf(_SC_NPROCESSORS_ONLN),
        cfg->node_ranks > 0 && cfg->node_ranks < cfg->ranks ? cfg->node_ranks : cfg->ranks,
        cfg->train.threads);
  return MF_OK;
}

/* memory.staging: auto is on where the "device" is a GPU across a link. */
static int stages_copies(const mf_config *cfg, const mf_backend_memory *dev) {
  if (cfg->memory.staging == MF_CONFIG_STAGING_AUTO) return strcmp(dev->name, "cuda") == 0;
  return cfg->memory.staging == MF_CONFIG_STAGING_ON;
}

/* train.overlap_optimizer: auto starts overlapped where the device's work
 * does not run on the host's cores (cuda), and choose_overlap then keeps the
 * setting predicted faster. */
static int overlaps_optimizer(const mf_config *cfg, const char *backend) {
  if (cfg->ranks > 1)
    return 0; /* ranks: the step's updates run between steps (mf_run_plan_make refuses true) */
  if (cfg->train.overlap_optimizer == MF_CONFIG_OVERLAP_AUTO) return strcmp(backend, "cuda") == 0;
  return cfg->train.overlap_optimizer == MF_CONFIG_OVERLAP_ON;
}

/* train.overlap_optimizer auto on the cuda backend: the chosen plan simulated
 * with the host optimizer after each step too; when that is predicted faster
 * (the uploads waiting for their parameters' updates can cost more than the
 * overlap hides), the run takes it and every plan shown is simulated so. (On
 * the cpu backend auto is off: there the device's work runs on the host's
 * cores, and the contention the overlap brings is not in the simulation.) */
static mf_status choose_overlap(const mf_config *cfg, mf_run_plan *rp) {
  if (rp->use != MF_RUN_TRAIN || cfg->train.overlap_optimizer != MF_CONFIG_OVERLAP_AUTO || cfg->ranks > 1 ||
      !rp->overlap_optimizer)
    return MF_OK;
  mf_plan *c = rp->plan;
  mf_sim_opts so = c->so;
  so.overlap_optimizer = 0;
  mf_sim_result after;
  MF_CHECK(mf_simulate(c->s, c->hw, &so, &after));
  if (!(after.step_seconds < c->sim.step_seconds * (1.0 - 1e-3))) {
    mf_sim_result_free(&after);
    return MF_OK;
  }
  rp->overlap_optimizer = 0;
  mf_plan_set_sim_opts(c, &so);
  c->sim = after; /* simulated just now with these options */
  c->simulated = 1;
  for (int k = 0; k < MF_PLAN_KIND_COUNT_; k++) {
    mf_plan *pl = rp->all[k];
    if (!pl || pl == c) continue;
    mf_sim_opts after_each = pl->so;
    after_each.overlap_optimizer = 0;
    mf_plan_set_sim_opts(pl, &after_each);
    MF_CHECK(mf_plan_simulate(pl));
  }
  return MF_OK;
}

/* train.precision: auto stores bf16 where the device has bf16 tensor cores
 * (cuda) and fp32 on cpu, whose fp32 runs match PyTorch's fp32 exactly. */
mf_dtype mf_run_plan_storage(const mf_config *cfg, const char *backend) {
  if (!cfg || cfg->train.precision == MF_CONFIG_PRECISION_AUTO)
    return strcmp(backend, "cuda") == 0 ? MF_DTYPE_BF16 : MF_DTYPE_F32;
  return cfg->train.precision == MF_CONFIG_PRECISION_BF16 ? MF_DTYPE_BF16 : MF_DTYPE_F32;
}

/* One kernel choice: the environment's variable over the key, the key over
 * auto (`dflt`). words: the key's choices ("auto", "mma", "cutlass"); out
 * gets the word, `from` where it came from. */
static void choose_kernel(mf_env_id var, const char *key, int value, const char *const *words, const char *dflt,
                          char *out, size_t cap, char *from, size_t from_cap) {
  const char *env = mf_env_string(var);
  if (env) {
    snprintf(out, cap, "%s", env);
    snprintf(from, from_cap, "%s=%s%s%s", mf_env_var_of(var)->name, env, value ? " over " : "", value ? key : "");
  } else {
    snprintf(out, cap, "%s", value > 0 ? words[value] : dflt);
    snprintf(from, from_cap, "%s", value > 0 ? key : "auto");
  }
}

void mf_run_plan_kernels(const mf_config *cfg, const char *backend, mf_dtype storage, mf_run_kernels *out) {
  memset(out, 0, sizeof *out);
  const int cuda = strcmp(backend, "cuda") == 0;
  if (!cuda || storage != MF_DTYPE_BF16) { /* one kernel of each: kernels.* choose bf16 storage's on cuda */
    const char *word = cuda ? "cuda-core" : "cpu", *why = cuda ? "fp32 storage" : "the cpu backend's";
    snprintf(out->expert_gemm, sizeof out->expert_gemm, "%s", word);
    snprintf(out->attention, sizeof out->attention, "%s", word);
    snprintf(out->expert_gemm_from, sizeof out->expert_gemm_from, "%s", why);
    snprintf(out->attention_from, sizeof out->attention_from, "%s", why);
    return;
  }
  /* auto: the kernels measured on a GPU (an H100): mma; cutlass and cudnn have not run on one yet */
  static const char *const gemm_words[] = {"auto", "mma", "cutlass"}, *const attn_words[] = {"auto", "mma", "cudnn"};
  choose_kernel(MF_ENV_EXPERT_GEMM, "kernels.expert_gemm", cfg ? (int)cfg->kernels.expert_gemm : 0, gemm_words,
                "mma", out->expert_gemm, sizeof out->expert_gemm, out->expert_gemm_from,
                sizeof out->expert_gemm_from);
  choose_kernel(MF_ENV_ATTENTION, "kernels.attention", cfg ? (int)cfg->kernels.attention : 0, attn_words, "mma",
                out->attention, sizeof out->attention, out->attention_from, sizeof out->attention_from);
}

static uint64_t scratch_of(const mf_config *cfg, const mf_model_spec *spec, int cudnn) {
  const char *dev = NULL;
  if (mf_backend_resolve(mf_config_backend_name(cfg->backend), &dev) != MF_OK) return 0;
  const mf_dtype storage = mf_run_plan_storage(cfg, dev);
  if (cudnn < 0) { /* the run's own choice */
    mf_run_kernels k;
    mf_run_plan_kernels(cfg, dev, storage, &k);
    cudnn = strcmp(k.attention, "cudnn") == 0;
  }
  return mf_backend_attention_scratch(dev, storage, cudnn, cfg->train.micro_batch, cfg->data.seq_len,
                                      spec->heads, spec->kv_heads, spec->head_dim);
}

uint64_t mf_run_plan_scratch(const mf_config *cfg, const mf_model_spec *spec, mf_run_use use) {
  return use == MF_RUN_TRAIN ? scratch_of(cfg, spec, -1) : 0;
}

uint64_t mf_run_plan_scratch_cudnn(const mf_config *cfg, const mf_model_spec *spec) {
  return scratch_of(cfg, spec, 1);
}

/* The device budget and the arena's share of it (see run_plan.h). */
static mf_status budget_of(const mf_config *cfg, mf_run_plan *rp) {
  const mf_backend_memory *dev = &rp->dev;
  char a[32], b[32], c[32], d[32], e[32];
  if (cfg->memory.device_budget != MF_CONFIG_SIZE_AUTO) {
    rp->budget = cfg->memory.device_budget;
    snprintf(rp->budget_source, sizeof rp->budget_source, "memory.device_budget");
  } else if (dev->device_known) {
    rp->budget = dev->device_free_bytes;
    snprintf(rp->budget_source, sizeof rp->budget_source, "auto: the free memory of %s with moefit's context made",
             dev->device_name);
  } else {
    rp->budget = rp->hw.device_memory > rp->hw.device_reserve ? rp->hw.device_memory - rp->hw.device_reserve : 0;
    snprintf(rp->budget_source, sizeof rp->budget_source, "auto: the profile's device.memory less device.reserve");
  }
  if (rp->budget <= dev->total_bytes) {
    char where[200] = "";
    if (cfg->memory.device_budget == MF_CONFIG_SIZE_AUTO) snprintf(where, sizeof where, " (%s)", rp->budget_source);
    return MF_ERR(MF_ERR_CONFIG,
                  "memory.device_budget %s%s: the %s backend keeps %s on the device beside the arena (cuBLASLt "
                  "workspace %s, kernel scratch %s, CUDA context %s), which leaves no arena; raise "
                  "memory.device_budget",
                  mf_format_bytes(rp->budget, a, sizeof a), where, dev->name,
                  mf_format_bytes(dev->total_bytes, b, sizeof b), mf_format_bytes(dev->workspace_bytes, c, sizeof c),
                  mf_format_bytes(dev->scratch_bytes, d, sizeof d), mf_format_bytes(dev->context_bytes, e, sizeof e));
  }
  rp->arena_limit = rp->budget - dev->total_bytes;
  return MF_OK;
}

/* What expert parallelism (parallel.expert) needs of a training run's ranks and plan: whole groups,
 * each within a node or spanning every rank, no plan file. */
static mf_status expert_parallel_fits(const mf_config *cfg) {
  const int64_t ep = cfg->parallel.expert, n_ranks = cfg->ranks > 1 ? cfg->ranks : 1;
  if (n_ranks % ep)
    return MF_ERR(MF_ERR_CONFIG,
                  "parallel.expert %lld: the run has %lld rank%s; expert parallelism spreads the experts "
                  "over groups of %lld ranks, data parallel between the groups, so the ranks must be a "
                  "multiple of it: run mpirun -np %lld (or moefit plan --ranks %lld), or set "
                  "parallel.expert: 1",
                  (long long)ep, (long long)n_ranks, n_ranks > 1 ? "s" : "", (long long)ep, (long long)ep,
                  (long long)ep);
  /* Across nodes a group lies within one (its owners chain through the node's home) or is every rank
   * (each node's home then holds its own ranks' experts, the leaders' exchange the others'). */
  if (cfg->node_ranks > 0 && cfg->node_ranks < n_ranks && ep != n_ranks && cfg->node_ranks % ep)
    return MF_ERR(MF_ERR_CONFIG,
                  "parallel.expert %lld over %lld nodes of %lld ranks: a group of expert-parallel ranks must "
                  "lie within one node (parallel.expert dividing the ranks a node) or be every rank "
                  "(parallel.expert %lld); set one of those, or parallel.expert: 1",
                  (long long)ep, (long long)((n_ranks + cfg->node_ranks - 1) / cfg->node_ranks),
                  (long long)cfg->node_ranks, (long long)n_ranks);
  if (cfg->memory.plan_kind == MF_CONFIG_PLAN_FILE)
    return MF_ERR(MF_ERR_CONFIG,
                  "memory.plan %s with parallel.expert %lld: a plan file holds one rank's decisions, for its "
                  "own experts, and each expert-parallel rank holds others; take memory.plan: auto or a "
                  "baseline",
                  cfg->memory.plan, (long long)ep);
  return MF_OK;
}

/* The leaders' exchange of the nodes' gradient sums (mf_run_plan.between_nodes_s). */
static void between_nodes(const mf_config *cfg, const mf_param_table *t, mf_run_plan *rp) {
  const int64_t ranks = cfg->ranks > 1 && rp->use == MF_RUN_TRAIN ? cfg->ranks : 1;
  const int64_t per = cfg->node_ranks > 0 && cfg->node_ranks < ranks ? cfg->node_ranks : ranks;
  rp->nodes = (ranks + per - 1) / per;
  rp->between_nodes_s = 0;
  if (rp->nodes <= 1) return;
  const double bytes = 4.0 * (double)t->trainable_numel * (double)(rp->nodes - 1);
  rp->between_nodes_s = rp->hw.network_bandwidth > 0 ? bytes / rp->hw.network_bandwidth : NAN;
}

/* The program and its plans: every planning option comes from the config here. */
static mf_status plan_of(const mf_config *cfg, const mf_param_table *t, mf_run_plan *rp) {
  const int train = rp->use == MF_RUN_TRAIN;
  const double aux = isnan(cfg->train.aux_loss_coef) ? t->spec.router_aux_loss_coef : cfg->train.aux_loss_coef;
  mf_plan_request rq;
  memset(&rq, 0, sizeof rq);
  rq.params = t;
  rq.opts = (mf_program_opts){
      cfg->train.micro_batch,
      cfg->data.seq_len,
      train ? cfg->train.grad_accum : 1,
      aux,
      0,
      !train,
      cfg->train.micro_batch_order == MF_CONFIG_MB_ORDER_LAYER ? MF_ORDER_LAYER_MAJOR : MF_ORDER_MICRO_MAJOR,
      rp->storage,
      cfg->train.adam_moments == MF_CONFIG_MOMENTS_BF16 ? MF_DTYPE_BF16 : MF_DTYPE_F32,
      train ? cfg->ranks : 1,
      train ? cfg->node_ranks : 0,
      train ? cfg->parallel.expert : 1,
      train ? cfg->ep_rank : 0,
      0,
      train ? cfg->ep_group : 0};
  /* Expert-parallel ranks exchange rows in program order: one order for all, not each rank's choice */
  double self = 0; /* tests: expert parallelism's exchanges on one rank */
  rq.opts.ep_self = train && cfg->parallel.expert <= 1 && mf_env_number(MF_ENV_TEST_EP_SELF, &self);
  rq.choose_order =
      cfg->train.micro_batch_order == MF_CONFIG_MB_ORDER_AUTO && train && !rq.opts.ep_self && cfg->parallel.expert <= 1;
  rq.hw = &rp->hw;
  rq.sim.overlap_optimizer = rp->overlap_optimizer;
  rq.budget = rp->arena_limit;
  rq.memory = &cfg->memory;
  rq.expert_share = rp->routed ? rp->routing.share : NULL;
  MF_CHECK(mf_plan_for(&rq, &rp->prog, rp->all));
  rp->plan = rp->all[MF_PLAN_CHOSEN];
  return MF_OK;
}

const char *mf_home_region_name(mf_home_region k) {
  switch (k) {
    case MF_HOME_WORKING: return "bf16 working copy";
    case MF_HOME_GRADS: return "gradient sums";
    case MF_HOME_QUANT: return "quantized base";
    case MF_HOME_ACTS: return "offloaded activations";
    default: return "?";
  }
}

/* The region instruction i of s copies from or into, or -1: an upload of a
 * streamed weight from the bf16 working copy, a gradient's copy home, an
 * offloaded activation's either way. A weight kept on the device (its first
 * fill only) and the optimizer's state stay where they are. [*a, *e): the
 * bytes it copies in its region's buffer (the whole buffer for activations). */
static int region_of(const mf_schedule *s, int32_t i, uint64_t *a, uint64_t *e) {
  const mf_program *p = s->prog;
  const mf_instr *in = &s->instr[i];
  *a = *e = 0;
  if ((in->kind != MF_I_H2D && in->kind != MF_I_D2H) || i >= s->optim_begin) return -1;
  const int32_t t = s->slots[in->slot].tensor;
  const mf_ptensor *pt = &p->tensors[t];
  if (s->host_offset[t] != SIZE_MAX) {
    *e = s->host_act_bytes;
    return MF_HOME_ACTS;
  }
  int k = -1;
  const mf_param *q = pt->param >= 0 ? &p->params->params[pt->param] : NULL;
  if (in->kind == MF_I_H2D && pt->kind == MF_T_PARAM && !s->slots[in->slot].persist && q->quant) {
    *a = (uint64_t)q->qoff; /* its blob in the quantized home */
    *e = *a + (uint64_t)q->qbytes;
    return MF_HOME_QUANT;
  }
  if (in->kind == MF_I_H2D && pt->kind == MF_T_PARAM && !s->slots[in->slot].persist && p->storage == MF_DTYPE_BF16)
    k = MF_HOME_WORKING;
  else if (in->kind == MF_I_D2H && pt->kind == MF_T_GRAD && t != p->norm_sums)
    k = MF_HOME_GRADS;
  if (k < 0) return -1;
  *a = k == MF_HOME_WORKING ? (uint64_t)q->offset * 2 : (uint64_t)q->toff * 4;
  *e = *a + (uint64_t)q->numel * (k == MF_HOME_WORKING ? 2 : 4);
  return k;
}

/* Whether instruction i copies straight: its region pinned over its bytes. */
static int goes_straight(const mf_pinned_home *h, const mf_schedule *s, int32_t i) {
  uint64_t a, e;
  const int k = region_of(s, i, &a, &e);
  return k >= 0 && h->pinned[k] && a >= h->pin_lo[k] && e <= h->pin_hi[k];
}

/* Each region's span, its bytes a step, and whether it may be pinned at all. */
static void home_regions(const mf_config *cfg, const mf_run_plan *rp, const mf_schedule *s,
                         const mf_host_usage *u, mf_pinned_home *h, int *may) {
  for (int k = 0; k < MF_HOME_REGIONS_; k++) {
    h->lo[k] = UINT64_MAX;
    may[k] = cfg->memory.pinned_home && !rp->inside && cfg->ranks <= 1;
  }
  for (int32_t i = 0; i < s->n_instr; i++) {
    uint64_t a, e;
    const int k = region_of(s, i, &a, &e);
    if (k < 0) continue;
    h->step_bytes[k] += s->prog->tensors[s->slots[s->instr[i].slot].tensor].bytes;
    if (k == MF_HOME_GRADS && s->instr[i].accumulate) may[k] = 0; /* added into the host's sum: by the host */
    if (a < h->lo[k]) h->lo[k] = a;
    if (e > h->hi[k]) h->hi[k] = e;
  }
  for (int k = 0; k < MF_HOME_REGIONS_; k++) {
    if (h->lo[k] == UINT64_MAX) h->lo[k] = h->hi[k] = 0;
    h->pin_lo[k] = h->pin_hi[k] = h->lo[k];
    if (h->step_bytes[k] == 0) may[k] = 0;
  }
  if (u->spill_working_bytes > 0) may[MF_HOME_WORKING] = 0;
  /* Beside a quantized base the bf16 working copy's span runs over the
   * quantized weights' places in it, pages never written: pinning would
   * commit them. What streams from it (embeddings, norms, adapters) is staged. */
  if (s->prog->params->qhome_bytes > 0) may[MF_HOME_WORKING] = 0;
  if (u->spill_grad_bytes > 0) may[MF_HOME_GRADS] = 0;
}

typedef struct copy_range {
  uint64_t a, e, bytes; /* a copy's bytes in its region's buffer, and its bytes a step */
} copy_range;

static int cmp_range(const void *x, const void *y) {
  const copy_range *p = (const copy_range *)x, *q = (const copy_range *)y;
  if (p->a != q->a) return p->a < q->a ? -1 : 1;
  return p->e < q->e ? -1 : p->e > q->e;
}

/* The part of region k within `room` bytes that moves the most bytes a step:
 * the window [*lo, *hi) from a copy's start to a copy's end, the earliest of
 * the best. *lo == *hi when no copy fits (or out of memory: nothing pinned). */
static void best_part(const mf_schedule *s, int k, uint64_t room, uint64_t *lo, uint64_t *hi) {
  *lo = *hi = 0;
  int32_t n = 0;
  for (int32_t i = 0; i < s->n_instr; i++) {
    uint64_t a, e;
    n += region_of(s, i, &a, &e) == k;
  }
  copy_range *r = (copy_range *)malloc((size_t)(n + 1) * sizeof *r);
  if (!r) return;
  n = 0;
  for (int32_t i = 0; i < s->n_instr; i++) {
    uint64_t a, e;
    if (region_of(s, i, &a, &e) != k) continue;
    r[n++] = (copy_range){a, e, s->prog->tensors[s->slots[s->instr[i].slot].tensor].bytes};
  }
  qsort(r, (size_t)n, sizeof *r, cmp_range);
  /* Two pointers over the copies by start: [i, j) those inside the window from r[i].a. */
  uint64_t sum = 0, best = 0, end = 0;
  int32_t j = 0;
  for (int32_t i = 0; i < n; i++) {
    if (j < i) j = i, sum = 0, end = r[i].a;
    while (j < n && r[j].e - r[i].a <= room) {
      sum += r[j].bytes;
      if (r[j].e > end) end = r[j].e;
      j++;
    }
    if (sum > best) best = sum, *lo = r[i].a, *hi = end;
    if (j > i) sum -= r[i].bytes;
  }
  free(r);
}

/* The pinned home of plan pl within `budget` bytes (run_plan.h): the regions
 * by their value (bytes a step across the link per byte pinned, most first),
 * each whole while it fits, else the working copy's or the gradient sums'
 * part that fits and moves the most (at least 1/64 of the region: less is
 * not worth its registration). */
static void choose_home(const mf_config *cfg, const mf_run_plan *rp, const mf_schedule *s, const mf_host_usage *u,
                        uint64_t budget, mf_pinned_home *h) {
  memset(h, 0, sizeof *h);
  int may[MF_HOME_REGIONS_];
  home_regions(cfg, rp, s, u, h, may);
  h->budget = budget;
  int order[MF_HOME_REGIONS_];
  double value[MF_HOME_REGIONS_];
  for (int k = 0; k < MF_HOME_REGIONS_; k++) {
    order[k] = k;
    value[k] = (double)h->step_bytes[k] / (double)(h->hi[k] - h->lo[k] + 1);
  }
  for (int i = 1; i < MF_HOME_REGIONS_; i++) /* by value, most first; ties in region order */
    for (int j = i; j > 0 && value[order[j]] > value[order[j - 1]]; j--) {
      const int t = order[j];
      order[j] = order[j - 1];
      order[j - 1] = t;
    }
  const char *limit = cfg->memory.pinned_limit ? "memory.pinned_limit" : "half of memory.host_limit (pinned_limit auto)";
  for (int j = 0; j < MF_HOME_REGIONS_; j++) {
    const int k = order[j];
    const uint64_t span = h->hi[k] - h->lo[k], left = budget > h->bytes ? budget - h->bytes : 0;
    if (!may[k]) continue;
    if (span <= left) {
      h->pin_lo[k] = h->lo[k], h->pin_hi[k] = h->hi[k];
    } else if (k != MF_HOME_ACTS) {
      best_part(s, k, left, &h->pin_lo[k], &h->pin_hi[k]);
      if (h->pin_hi[k] - h->pin_lo[k] < span / 64) h->pin_hi[k] = h->pin_lo[k]; /* not worth a registration */
    }
    const uint64_t got = h->pin_hi[k] - h->pin_lo[k];
    h->pinned[k] = got > 0;
    h->bytes += got;
    if (got == span || h->left_out[0]) continue;
    char a[32], b[32], c[32];
    if (got > 0)
      snprintf(h->left_out, sizeof h->left_out, "the rest of the %s (%s) staged: over the %s left of %s",
               mf_home_region_name((mf_home_region)k), mf_format_bytes(span - got, a, sizeof a),
               mf_format_bytes(left, c, sizeof c), limit);
    else
      snprintf(h->left_out, sizeof h->left_out, "%s (%s) not pinned: over the %s left of %s",
               mf_home_region_name((mf_home_region)k), mf_format_bytes(span, a, sizeof a),
               mf_format_bytes(left, b, sizeof b), limit);
  }
}

/* Plan pl's pinned home, its staging layout (when copies are staged; else
 * *sg NULL) of the copies still staged, and its host memory. With a
 * pinned_limit, a home that leaves the staging arena too little room is
 * chosen again within the limit less that arena (up to four times, the last
 * with no home). */
static mf_status plan_memory(const mf_config *cfg, const mf_run_plan *rp, const mf_plan *pl, mf_staging **sg,
                             int *pinned_fits, mf_host_usage *u, mf_pinned_home *home, uint8_t **direct) {
  const mf_schedule *s = pl->s;
  *sg = NULL;
  *direct = NULL;
  *pinned_fits = 1;
  /* The host memory without staging first: which parts spill (those are not pinned). */
  MF_CHECK(mf_host_account(rp->prog, s, 0, &cfg->memory, &rp->hw, u));
  const uint64_t limit = cfg->memory.pinned_limit;
  uint64_t budget = limit ? limit : u->host_limit / 2;
  uint8_t *d = NULL;
  MF_CHECK(mf_calloc((size_t)s->n_instr + 1, 1, "the pinned home's copies", (void **)&d));
  mf_status st = MF_OK;
  for (int tries = 0; tries < 4; tries++) {
    choose_home(cfg, rp, s, u, budget, home);
    home->n_direct = 0;
    for (int32_t i = 0; i < s->n_instr; i++) {
      uint64_t a, e;
      d[i] = (uint8_t)goes_straight(home, s, i);
      home->n_direct += d[i];
      if (d[i]) home->pin_step_bytes[region_of(s, i, &a, &e)] += s->prog->tensors[s->slots[s->instr[i].slot].tensor].bytes;
    }
    for (int k = 0; k < MF_HOME_REGIONS_; k++)
      home->host_s[k] = 2.0 * (double)home->pin_step_bytes[k] / rp->hw.host_memory_bandwidth;
    mf_staging_free(*sg);
    *sg = NULL;
    *pinned_fits = 1;
    if (rp->staged) {
      const mf_staging_opts o = {0, 0, 0, d};
      const uint64_t room = limit ? (limit > home->bytes ? limit - home->bytes : 1) : 0;
      MF_CHECK_GOTO(mf_staging_build_within(s, &pl->sim, &rp->hw, &o, room, sg, pinned_fits), st, fail);
    }
    MF_CHECK_GOTO(mf_host_account(rp->prog, s, *sg ? (*sg)->arena_bytes : 0, &cfg->memory, &rp->hw, u), st, fail);
    mf_host_set_pinned_home(u, home->bytes);
    if ((u->pinned_fits && *pinned_fits) || !limit || home->bytes == 0) break;
    /* The staging arena's room given back: the home again within the limit less it. */
    const uint64_t need = (*sg ? (*sg)->arena_bytes : 0) + limit / 64;
    uint64_t next = limit > need ? limit - need : 0;
    if (next >= budget) next = budget - budget / 4;
    budget = tries == 2 ? 0 : next;
  }
  *pinned_fits = *pinned_fits && u->pinned_fits;
  *direct = d;
  return MF_OK;
fail:
  free(d);
  mf_staging_free(*sg);
  *sg = NULL;
  return st;
}

static mf_run_fit fit_from(const mf_config *cfg, const mf_plan *pl, const mf_host_usage *u, int pinned_fits) {
  mf_run_fit f = {pl->fits, u->unplaced_bytes == 0, pinned_fits, 1, 0};
  const uint64_t spill = mf_host_spill_bytes(u);
  if (spill > 0 && cfg->memory.nvme_dir) {
    const int64_t room = mf_hostbuf_dir_free(cfg->memory.nvme_dir);
    f.nvme = access(cfg->memory.nvme_dir, W_OK | X_OK) == 0 && (room < 0 || (uint64_t)room >= spill);
  }
  f.all = f.device && f.host && f.pinned && f.nvme;
  return f;
}

/* The staging layout (when staged), the host memory, what the plan fits, and the plan file's figures. */
static mf_status memory_of(const mf_config *cfg, mf_run_plan *rp) {
  const mf_plan *pl = rp->plan;
  MF_CHECK(plan_memory(cfg, rp, pl, &rp->staging, &rp->staging_fits, &rp->host, &rp->home, &rp->direct));
  rp->fit = fit_from(cfg, pl, &rp->host, rp->staging_fits);
  const mf_staging *sg = rp->staging;
  mf_plan_figures *f = &rp->fig;
  memset(f, 0, sizeof *f);
  f->device_budget_bytes = rp->budget;
  f->peak_device_bytes = pl->s->peak_live_bytes;
  f->arena_bytes = pl->s->arena_bytes;
  f->predicted_step_seconds = pl->sim.step_seconds;
  f->staging_bytes = sg ? sg->arena_bytes : 0;
  f->staging_slab_limit_bytes = sg ? sg->opts.max_slab_bytes : 0;
  f->staging_pool_bytes = sg ? sg->pool_bytes : 0;
  f->pinned_home_bytes = rp->home.bytes;
  f->host_bytes = rp->host.total_bytes;
  f->persist_bytes = pl->s->persist_bytes;
  f->device_backend_bytes = rp->dev.total_bytes;
  snprintf(f->expert_gemm, sizeof f->expert_gemm, "%s", rp->kernels.expert_gemm);
  snprintf(f->attention, sizeof f->attention, "%s", rp->kernels.attention);
  return MF_OK;
}

/* Seconds of host memory time a step's staged copies of schedule s take, as
 * the staging layout counts them (mf_staging_copy_traffic at the profile's
 * host memory bandwidth), the pinned home's copies left out; 0 when copies
 * are not staged. */
static double staged_host_seconds(const mf_run_plan *rp, const mf_schedule *s) {
  if (!rp->staged) return 0;
  double traffic = 0;
  for (int32_t i = 0; i < s->n_instr; i++) {
    const mf_instr_kind kind = s->instr[i].kind;
    if ((kind == MF_I_H2D || kind == MF_I_D2H) && !goes_straight(&rp->home, s, i))
      traffic += mf_staging_copy_traffic(s, i);
  }
  return traffic / rp->hw.host_memory_bandwidth;
}

/* With the host optimizer behind the next step, every plan simulated again
 * with its staged copies' host time beside the updates (mf_sim_opts
 * host_copy_seconds: they share the host's memory), the pinned home as the
 * chosen plan's (its regions are the program's). *chosen: the chosen plan's
 * prediction changed. */
static mf_status price_host_copies(mf_run_plan *rp, int *chosen) {
  *chosen = 0;
  for (int k = 0; k < MF_PLAN_KIND_COUNT_; k++) {
    mf_plan *pl = rp->all[k];
    if (!pl || !pl->so.overlap_optimizer) continue;
    mf_sim_opts so = pl->so;
    so.host_copy_seconds = staged_host_seconds(rp, pl->s);
    if (so.host_copy_seconds == pl->so.host_copy_seconds) continue;
    mf_plan_set_sim_opts(pl, &so);
    MF_CHECK(mf_plan_simulate(pl));
    if (pl == rp->plan) *chosen = 1;
  }
  return MF_OK;
}

/* inside: the run plan whose backend and arena this one's program shares (NULL: its own). */
static mf_status make(const mf_config *cfg, const mf_param_table *t, mf_run_use use, int ask_device,
                      const mf_run_plan *inside, mf_run_plan **out) {
  *out = NULL;
  mf_run_plan *rp = NULL;
  MF_CHECK(mf_calloc(1, sizeof *rp, "the run plan", (void **)&rp));
  rp->use = use;
  mf_status st = MF_OK;
  if (cfg->train.lora.rank > 0 && t->lora.rank != cfg->train.lora.rank) {
    st = MF_ERR(MF_ERR_INTERNAL, "run plan: train.lora.rank is %lld but the parameter table has no adapters",
                (long long)cfg->train.lora.rank);
    goto fail;
  }
  if (cfg->parallel.expert > 1 && use == MF_RUN_TRAIN && (st = expert_parallel_fits(cfg)) != MF_OK) goto fail;
  if (cfg->ranks > 1 && use == MF_RUN_TRAIN && cfg->train.overlap_optimizer == MF_CONFIG_OVERLAP_ON) {
    st = MF_ERR(MF_ERR_CONFIG,
                "train.overlap_optimizer: true runs one process's host AdamW behind its next step; with %lld "
                "ranks the ranks share the update between steps instead: set it to auto or false",
                (long long)cfg->ranks);
    goto fail;
  }
  const mf_backend_params bp = {.device = cfg->device,
                                .scratch_bytes = mf_run_plan_scratch(cfg, &t->spec, use)};
  if (inside) { /* its backend, and its arena for the arena's limit */
    rp->inside = 1;
    rp->dev = inside->dev;
  } else {
    MF_CHECK_GOTO(mf_backend_query_memory(mf_config_backend_name(cfg->backend), &bp, ask_device, &rp->dev), st,
                  fail);
  }
  MF_CHECK_GOTO(load_profile(cfg, rp), st, fail);
  if (inside) {
    char a[32];
    rp->budget = inside->budget;
    rp->arena_limit = inside->plan->s->arena_bytes;
    snprintf(rp->budget_source, sizeof rp->budget_source, "inside the training plan's arena of %s",
             mf_format_bytes(rp->arena_limit, a, sizeof a));
  } else {
    MF_CHECK_GOTO(budget_of(cfg, rp), st, fail);
  }
  rp->overlap_optimizer = use == MF_RUN_TRAIN && overlaps_optimizer(cfg, rp->dev.name);
  rp->storage = mf_run_plan_storage(cfg, rp->dev.name);
  mf_run_plan_kernels(cfg, rp->dev.name, rp->storage, &rp->kernels);
  rp->staged = stages_copies(cfg, &rp->dev);
  MF_CHECK_GOTO(mf_routing_for_config(cfg, &t->spec, &rp->routing, &rp->routed, rp->routing_path,
                                      sizeof rp->routing_path, rp->routing_note, sizeof rp->routing_note),
                st, fail);
  mf_progress_note("the step program and its plans");
  MF_CHECK_GOTO(plan_of(cfg, t, rp), st, fail);
  if (cfg->ranks > 1 && rp->plan->s->n_optim_device > 0) {
    st = MF_ERR(
        MF_ERR_CONFIG,
        "memory.plan (%s) with memory.overrides puts the optimizer of %d parameters on the device; with "
        "%lld ranks their gradients meet in host memory and the optimizer runs there: take optimizer: "
        "device out of memory.overrides (or the plan file)",
        cfg->memory.plan ? cfg->memory.plan : "auto", rp->plan->s->n_optim_device, (long long)cfg->ranks);
    goto fail;
  }
  mf_progress_note("the staging arena and host memory");
  MF_CHECK_GOTO(memory_of(cfg, rp), st, fail);
  /* The staged copies' host time beside the overlapped optimizer, then the
   * overlap kept only where it is predicted faster; the staging laid out
   * again on the timeline that changed. */
  {
    int changed = 0;
    const int overlap = rp->overlap_optimizer;
    MF_CHECK_GOTO(price_host_copies(rp, &changed), st, fail);
    MF_CHECK_GOTO(choose_overlap(cfg, rp), st, fail);
    if (changed || overlap != rp->overlap_optimizer) {
      mf_staging_free(rp->staging);
      rp->staging = NULL;
      free(rp->direct);
      rp->direct = NULL;
      MF_CHECK_GOTO(memory_of(cfg, rp), st, fail);
    }
  }
  between_nodes(cfg, t, rp);
  *out = rp;
  return MF_OK;
fail:
  mf_run_plan_free(rp);
  return st;
}

mf_status mf_run_plan_make(const mf_config *cfg, const mf_param_table *t, mf_run_use use, int ask_device,
                           mf_run_plan **out) {
  mf_progress_start("planning", 2.0); /* a line on a terminal when it takes longer */
  const mf_status st = make(cfg, t, use, ask_device, NULL, out);
  mf_progress_stop();
  return st;
}

mf_status mf_run_plan_make_inside(const mf_config *cfg, const mf_param_table *t, mf_run_use use,
                                  const mf_run_plan *inside, mf_run_plan **out) {
  mf_progress_start("planning", 2.0);
  const mf_status st = make(cfg, t, use, 0, inside, out);
  mf_progress_stop();
  return st;
}

void mf_run_plan_free(mf_run_plan *rp) {
  if (!rp) return;
  mf_staging_free(rp->staging);
  free(rp->direct);
  for (int k = 0; k < MF_PLAN_KIND_COUNT_; k++) mf_plan_free(rp->all[k]); /* before their program */
  mf_program_free(rp->prog);
  mf_routing_free(&rp->routing);
  free(rp);
}

mf_status mf_run_plan_write_json(const mf_run_plan *rp, const char *path) {
  return mf_plan_write_json(rp->prog, rp->plan->d, &rp->fig, path);
}

mf_status mf_run_plan_fit_of(const mf_run_plan *rp, const mf_config *cfg, mf_plan_kind kind,
                             mf_run_fit *out) {
  if (kind == MF_PLAN_CHOSEN) {
    *out = rp->fit;
    return MF_OK;
  }
  if ((int)kind < 0 || kind >= MF_PLAN_KIND_COUNT_ || !rp->all[kind])
    return MF_ERR(MF_ERR_INVALID_ARG, "mf_run_plan_fit_of: no plan of kind %d", (int)kind);
  mf_staging *sg = NULL;
  int pinned_fits = 1;
  mf_host_usage u;
  mf_pinned_home home;
  uint8_t *direct = NULL;
  if (!rp->all[kind]->fits) {
    /* Over the device budget it cannot run whatever its staging: its host
     * memory without a staging arena (laying one out is most of the cost). */
    MF_CHECK(mf_host_account(rp->prog, rp->all[kind]->s, 0, &cfg->memory, &rp->hw, &u));
  } else {
    MF_CHECK(plan_memory(cfg, rp, rp->all[kind], &sg, &pinned_fits, &u, &home, &direct));
    mf_staging_free(sg);
    free(direct);
  }
  *out = fit_from(cfg, rp->all[kind], &u, pinned_fits);
  return MF_OK;
}

/* Appends "; " (after the first) and one reason to buf. */
static void add_reason(char *buf, size_t cap, int *n, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void add_reason(char *buf, size_t cap, int *n, const char *fmt, ...) {
  size_t o = strlen(buf);
  if (*n && o + 2 < cap) o += (size_t)snprintf(buf + o, cap - o, "; ");
  va_list ap;
  va_start(ap, fmt);
  if (o < cap) vsnprintf(buf + o, cap - o, fmt, ap);
  va_end(ap);
  (*n)++;
}

int mf_run_plan_misfit(const mf_run_plan *rp, const mf_config *cfg, char *buf, size_t cap) {
  const mf_host_usage *u = &rp->host;
  const mf_config_memory *mem = &cfg->memory;
  char a[32], b[32], c[32];
  int n = 0;
  if (cap) buf[0] = 0;
  if (!rp->fit.device)
    add_reason(buf, cap, &n,
               "device: the arena of %s is over the %s the device budget (%s, %s) leaves it: raise "
               "memory.device_budget",
               mf_format_bytes(rp->plan->s->arena_bytes, a, sizeof a),
               mf_format_bytes(rp->arena_limit, b, sizeof b), mf_format_bytes(rp->budget, c, sizeof c),
               rp->budget_source);
  if (!rp->fit.host)
    add_reason(
        buf, cap, &n,
        "host memory: the plan needs %s against memory.host_limit %s%s, and %s of it fits neither there nor "
        "on NVMe (%s): %s",
        mf_format_bytes(u->total_bytes, a, sizeof a), mf_format_bytes(u->host_limit, b, sizeof b),
        mem->host_limit == MF_CONFIG_SIZE_AUTO ? " (auto: the hardware profile's host memory)" : "",
        mf_format_bytes(u->unplaced_bytes, c, sizeof c), mf_host_unplaced_why(u, mem),
        !u->nvme ? (mem->nvme_dir ? "raise memory.host_limit, use a hardware.profile with an NVMe bandwidth, "
                                    "or use a smaller model"
                                  : "raise memory.host_limit, set memory.nvme_dir to spill to NVMe, or use a "
                                    "smaller model")
                 : "raise memory.host_limit or use a smaller model");
  if (!rp->fit.nvme) {
    const char *dir = mem->nvme_dir;
    const int64_t room = mf_hostbuf_dir_free(dir);
    if (access(dir, W_OK | X_OK) != 0)
      add_reason(buf, cap, &n,
                 "NVMe: the plan spills %s to memory.nvme_dir %s, which %s: create it on an NVMe drive, or point "
                 "memory.nvme_dir at one",
                 mf_format_bytes(mf_host_spill_bytes(u), a, sizeof a), dir,
                 access(dir, F_OK) != 0 ? "does not exist" : "is not a directory moefit may write in");
    else
      add_reason(buf, cap, &n,
                 "NVMe: the plan spills %s to memory.nvme_dir %s, which has %s free: free space there, point "
                 "memory.nvme_dir at a larger drive, or raise memory.host_limit",
                 mf_format_bytes(mf_host_spill_bytes(u), a, sizeof a), dir, mf_format_bytes((uint64_t)room, b, sizeof b));
  }
  if (!rp->fit.pinned)
    add_reason(
        buf, cap, &n,
        "pinned memory: the pinned home of %s and a staging "
        "layout do not fit memory.pinned_limit %s (the largest slab, one tensor's copy, is %s): raise "
        "memory.pinned_limit or set memory.staging: false",
        mf_format_bytes(rp->home.bytes, c, sizeof c), mf_format_bytes(u->pinned_limit, a, sizeof a),
        mf_format_bytes(rp->staging ? rp->staging->largest_slab_bytes : 0, b, sizeof b));
  return n;
}

/* One alternative's plan described into buf: what it changes, its host
 * memory, its NVMe, its predicted step. */
static void describe_alternative(const mf_run_plan *a, const char *what, int *n, char *buf, size_t cap) {
  char h[32], lim[32], room[32];
  const mf_host_usage *u = &a->host;
  const int host_ok = a->fit.host;
  size_t o = strlen(buf);
  if (o < cap)
    o += (size_t)snprintf(buf + o, cap - o, "%s%s: %s of host memory", (*n)++ ? "; " : "", what,
                          mf_format_bytes(mf_host_resident_bytes(u), h, sizeof h));
  if (o < cap && mf_host_spill_bytes(u) > 0)
    o += (size_t)snprintf(buf + o, cap - o, " + %s on NVMe",
                          mf_format_bytes(mf_host_spill_bytes(u), room, sizeof room));
  if (o < cap && host_ok)
    snprintf(buf + o, cap - o, ", %.4g s/step predicted", a->plan->sim.step_seconds);
  else if (o < cap)
    snprintf(buf + o, cap - o, " (over memory.host_limit %s too)", mf_format_bytes(u->host_limit, lim, sizeof lim));
}

/* One alternative of mf_run_plan_alternatives: cfg changed as `what` says
 * (with its table: LoRA's), planned like the run, described into buf. */
static mf_status alternative(const mf_config *alt, const mf_param_table *t, const char *what, int *n, char *buf,
                             size_t cap) {
  mf_progress_note("planning instead %.40s", what);
  mf_run_plan *a = NULL;
  const mf_status st = mf_run_plan_make(alt, t, MF_RUN_TRAIN, 0, &a);
  if (st != MF_OK) return st;
  describe_alternative(a, what, n, buf, cap);
  mf_run_plan_free(a);
  return MF_OK;
}

static int alternatives(const mf_run_plan *rp, const mf_config *cfg, char *buf, size_t cap) {
  const mf_param_table *t = rp->prog->params;
  int n = 0;
  mf_status st = MF_OK;
  /* The AdamW moments in bf16: half their bytes. */
  if (cfg->train.adam_moments != MF_CONFIG_MOMENTS_BF16 && t->trainable_numel > 0) {
    mf_config alt = *cfg;
    alt.train.adam_moments = alt.memory.adam_moments = MF_CONFIG_MOMENTS_BF16;
    st = alternative(&alt, t, "train.adam_moments=bf16", &n, buf, cap);
  }
  /* LoRA over the frozen base, kept at home in bf16: rank 16 on every projection the family has. */
  if (st == MF_OK && !t->lora_a) {
    const char *names[MF_CONFIG_LORA_MAX_TARGETS];
    const int nn = mf_lora_target_names(t->spec.family, names, MF_CONFIG_LORA_MAX_TARGETS);
    mf_config alt = *cfg;
    alt.train.lora.rank = 16;
    alt.train.lora.alpha = 32;
    alt.train.lora.dropout = 0;
    alt.train.lora.experts = MF_CONFIG_LORA_EXPERTS_ALL;
    alt.train.lora.n_targets = nn;
    char what[400];
    int w = snprintf(what, sizeof what, "train.lora.rank=16 train.lora.alpha=32 'train.lora.targets=[");
    for (int j = 0; j < nn; j++) {
      snprintf(alt.train.lora.targets[j], sizeof alt.train.lora.targets[j], "%s", names[j]);
      w += snprintf(what + w, sizeof what - (size_t)w, "%s%s", j ? ", " : "", names[j]);
    }
    snprintf(what + w, sizeof what - (size_t)w, "]'%s (LoRA over the frozen base, at home in bf16)",
             rp->storage == MF_DTYPE_BF16 ? "" : " train.precision=bf16");
    alt.train.precision = MF_CONFIG_PRECISION_BF16;
    /* Every name the family has: every role it can adapt. */
    const mf_lora l = {16, 2.0, mf_lora_adaptable_roles(t->spec.family), 0, 0.0, NULL};
    mf_param_table *lt = NULL;
    st = mf_param_table_build(&t->spec, &lt);
    if (st == MF_OK) st = mf_param_table_add_lora(lt, &l);
    if (st == MF_OK) st = alternative(&alt, lt, what, &n, buf, cap);
    mf_param_table_free(lt);
  }
  /* The state spilled to NVMe past memory.host_limit (a profile with an NVMe bandwidth). */
  if (st == MF_OK && rp->hw.nvme_bandwidth > 0 && (!cfg->memory.nvme_dir || !rp->fit.nvme)) {
    mf_config alt = *cfg;
    if (!alt.memory.nvme_dir) alt.memory.nvme_dir = "DIR";
    char what[1200];
    snprintf(what, sizeof what, "memory.nvme_dir=%s on an NVMe drive (%.3g GB/s in the profile)",
             alt.memory.nvme_dir, rp->hw.nvme_bandwidth / 1e9);
    /* The planner reads whether memory.nvme_dir is set, never the directory:
     * one that is set (missing or short of room) changes nothing in the plan,
     * which is the run's own. */
    if (cfg->memory.nvme_dir)
      describe_alternative(rp, what, &n, buf, cap);
    else
      st = alternative(&alt, t, what, &n, buf, cap);
  }
  if (st != MF_OK) {
    /* An alternative that cannot be planned is left out: the run's own error is what matters. */
    MF_LOGD("plan", "alternatives: %s", mf_last_error());
    if (cap) buf[0] = 0;
    return 0;
  }
  return n;
}

int mf_run_plan_alternatives(const mf_run_plan *rp, const mf_config *cfg, char *buf, size_t cap) {
  if (cap) buf[0] = 0;
  if (rp->use != MF_RUN_TRAIN) return 0;
  mf_progress_start("planning", 0.0);
  const int n = alternatives(rp, cfg, buf, cap);
  mf_progress_stop();
  return n;
}

/* Appends to why (a misfit's reasons) the alternatives that were planned,
 * when host memory or NVMe is what the plan is over. */
static void add_alternatives(const mf_run_plan *rp, const mf_config *cfg, int host_short, char *why, size_t cap) {
  if (!host_short) return;
  char alts[2400];
  if (mf_run_plan_alternatives(rp, cfg, alts, sizeof alts) == 0) return;
  const size_t o = strlen(why);
  if (o < cap) snprintf(why + o, cap - o, "\n  planned instead: %s", alts);
}

mf_status mf_run_plan_admit(const mf_run_plan *rp, const mf_config *cfg) {
  char why[4400], a[32], b[32], c[32], d[32];
  int n = mf_run_plan_misfit(rp, cfg, why, sizeof why);
  uint64_t have = 0;
  char source[160];
  MF_CHECK(mf_host_machine_memory(&have, source, sizeof source));
  /* The cpu backend's device arena is host memory too (once: not again for
   * a plan inside another's arena). */
  const uint64_t arena = strcmp(rp->dev.name, "cpu") == 0 && !rp->inside ? rp->plan->s->arena_bytes : 0;
  const uint64_t resident = mf_host_resident_bytes(&rp->host);
  int machine_short = 0;
  if (have > 0 && resident + arena > have) {
    char parts[160];
    const int o = snprintf(parts, sizeof parts, "host state %s", mf_format_bytes(resident, a, sizeof a));
    if (arena)
      snprintf(parts + o, sizeof parts - (size_t)o, " + the cpu backend's device arena %s",
               mf_format_bytes(arena, b, sizeof b));
    add_reason(
        why, sizeof why, &n,
        "this machine: the plan keeps %s in its memory (%s; %s spilled to NVMe) but it has %s available "
        "(%s): use a smaller model, or set memory.host_limit below that with memory.nvme_dir to spill "
        "the rest%s",
        mf_format_bytes(resident + arena, c, sizeof c), parts,
        mf_format_bytes(rp->host.total_bytes - resident, d, sizeof d), mf_format_bytes(have, b, sizeof b),
        source, arena ? ", or lower memory.device_budget" : "");
    machine_short = 1;
  }
  add_alternatives(rp, cfg, !rp->fit.host || !rp->fit.nvme || machine_short, why, sizeof why);
  if (n) return MF_ERR(MF_ERR_CONFIG, "the plan cannot run: %s", why);
  if (rp->routing_note[0]) MF_LOGI("plan", "%s", rp->routing_note);
  return MF_OK;
}
