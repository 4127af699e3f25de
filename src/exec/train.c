/* `moefit train` and `moefit eval` on the executor (see train.h). */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kernels/backend.h"
#include "kernels/cuda/backend_cuda.h"
#include "planner/host.h"
#include "planner/plan.h"
#include "planner/routing.h"
#include "src/exec/exec.h"
#include "src/exec/loader.h"
#include "src/exec/metrics.h"
#include "src/exec/train.h"
#include "src/io/hf_config.h"
#include "src/io/tokens.h"
#include "src/core/hostbuf.h"
#include "src/model/program.h"
#include "src/optim/optim.h"
#include "src/optim/worker.h"

static int is_dir_with_config(const char *dir) {
  char path[4096];
  snprintf(path, sizeof path, "%s/config.json", dir);
  return access(path, R_OK) == 0;
}

mf_status mf_run_load_model(const mf_config *cfg, const char *model_dir, mf_param_table **table, float **w,
                            char *desc, size_t desc_cap) {
  *table = NULL;
  *w = NULL;
  mf_model_spec spec;
  const char *dir = model_dir ? model_dir : cfg->model.has_init ? NULL : cfg->model.path;
  if (dir) {
    MF_CHECK(mf_hf_config_load(dir, &spec));
  } else {
    spec = cfg->model.init;
  }
  MF_CHECK(mf_param_table_build(&spec, table));
  float *weights = NULL;
  mf_status st =
      mf_malloc((size_t)(*table)->total_numel * sizeof(float), "the model's weights", (void **)&weights);
  if (st == MF_OK) {
    if (dir) {
      st = mf_params_load(*table, dir, weights);
      snprintf(desc, desc_cap, "%s", dir);
    } else {
      mf_params_init_random(*table, spec.seed, 0.02f, weights);
      snprintf(desc, desc_cap, "random init (seed %llu)", (unsigned long long)spec.seed);
    }
  }
  if (st != MF_OK) {
    free(weights);
    mf_param_table_free(*table);
    *table = NULL;
    return st;
  }
  *w = weights;
  return MF_OK;
}

static double aux_coef_of(const mf_config *cfg, const mf_param_table *t) {
  return isnan(cfg->train.aux_loss_coef) ? t->spec.router_aux_loss_coef : cfg->train.aux_loss_coef;
}

/* backend: cuda runs the step on the GPU (kernels/cuda, fp32 storage; no
 * GPU: MF_ERR_NO_DEVICE from the backend, a build without the toolkit:
 * MF_ERR_UNSUPPORTED). auto stays on the cpu backend until the cuda path has
 * been run on a GPU (issue 6). */
static mf_status check_backend(const mf_config *cfg) {
  (void)cfg;
  return MF_OK;
}

static mf_status backend_create(const mf_config *cfg, mf_threadpool *pool, mf_backend **out) {
  if (cfg->backend == MF_CONFIG_BACKEND_CUDA) {
    const mf_cuda_backend_opts co = {0, 0, 0};
    mf_status st = mf_backend_cuda_create(&co, out);
    if (st != MF_OK) mf_error_prefix("backend: cuda");
    return st;
  }
  mf_cpu_backend_opts bo = {pool, 0, 0, mf_optim_run_kernel, MF_CPU_STREAMS_IMMEDIATE};
  return mf_backend_cpu_create(&bo, out);
}

/* Everything one run of the executor needs. */
typedef struct runner {
  mf_backend *backend;
  mf_program *prog;
  mf_hwprofile hw;      /* the profile the plan was made with */
  mf_routing routing;   /* the routing it was made with (share NULL: uniform) */
  mf_plan *plan;        /* the schedule memory.plan names, or NULL: everything resident */
  char plan_desc[1024]; /* which plan: "ZeRO-Offload-like", a plan file's path */
  mf_exec *exec;
  mf_staging *staging;      /* the pinned staging arena's layout (memory.staging), or NULL */
  int32_t **ids, **targets; /* [G][B*S] */
  int64_t G;
} runner;

static void runner_free(runner *r) {
  mf_exec_free(r->exec);
  mf_staging_free(r->staging);
  mf_plan_free(r->plan);
  mf_routing_free(&r->routing);
  mf_program_free(r->prog);
  mf_backend_free(r->backend);
  for (int64_t m = 0; m < r->G; m++) {
    if (r->ids) free(r->ids[m]);
    if (r->targets) free(r->targets[m]);
  }
  free(r->ids);
  free(r->targets);
  memset(r, 0, sizeof *r);
}

/* Host threads for each of the staging arena's fill and copy-out: one on the
 * cpu backend (its device is host memory and its own cores run the kernels);
 * on cuda a few, so that the host copies keep up with a PCIe 5 link (one
 * thread's memcpy moves about a quarter of it; not measured on a GPU yet). */
static int staging_threads(const mf_config *cfg) {
  if (cfg->backend != MF_CONFIG_BACKEND_CUDA) return 1;
  const long cores = cfg->train.threads > 0 ? (long)cfg->train.threads : sysconf(_SC_NPROCESSORS_ONLN);
  return cores >= 16 ? 4 : cores >= 8 ? 2 : 1;
}

/* memory.staging: the plan's pinned staging arena laid out within
 * memory.pinned_limit (experts/staging.h), the executor copying through it. */
static mf_status runner_stage(runner *r, const mf_config *cfg) {
  int fits = 0;
  MF_CHECK(mf_staging_build_within(r->plan->s, &r->plan->sim, &r->hw, NULL, cfg->memory.pinned_limit,
                                   &r->staging, &fits));
  if (!fits) {
    char a[32], b[32];
    return MF_ERR(MF_ERR_CONFIG,
                  "memory.pinned_limit %s: the pinned staging arena needs at least %s (its largest slab, one "
                  "tensor's copy); raise memory.pinned_limit or set memory.staging: false",
                  mf_format_bytes(cfg->memory.pinned_limit, a, sizeof a),
                  mf_format_bytes(r->staging->largest_slab_bytes, b, sizeof b));
  }
  const mf_exec_staging_opts so = {staging_threads(cfg), 0, 0};
  return mf_exec_use_staging(r->exec, r->staging, &so);
}

/* The program and the plan a run follows (planner/plan.h mf_plan_for), from
 * memory.plan: auto with memory.device_budget set, the planner's choice within
 * it; a baseline or a plan file, that; auto with budget auto, none: every
 * tensor resident on the cpu backend, unscheduled. train.micro_batch_order
 * auto lets the planner choose the order; the simulation models
 * train.overlap_optimizer. Copies staged (memory.staging) need a layout,
 * which needs a timeline: an unplanned run then simulates its all-resident
 * schedule (the one it runs anyway) with the profile. */
static mf_status runner_init(runner *r, const mf_config *cfg, const mf_param_table *t, mf_threadpool *pool,
                             int64_t G, int forward_only) {
  memset(r, 0, sizeof *r);
  MF_CHECK(backend_create(cfg, pool, &r->backend));
  /* Storage fp32: what the cpu backend runs, and the cuda backend's kernels today. */
  const mf_program_order order =
      cfg->train.micro_batch_order == MF_CONFIG_MB_ORDER_LAYER ? MF_ORDER_LAYER_MAJOR : MF_ORDER_MICRO_MAJOR;
  mf_program_opts po = {cfg->train.micro_batch,
                        cfg->data.seq_len,
                        G,
                        aux_coef_of(cfg, t),
                        0,
                        forward_only,
                        order,
                        MF_DTYPE_F32,
                        cfg->train.adam_moments == MF_CONFIG_MOMENTS_BF16 ? MF_DTYPE_BF16 : MF_DTYPE_F32};
  const mf_config_memory *mem = &cfg->memory;
  mf_config_plan which = mem->plan_kind;
  if (which == MF_CONFIG_PLAN_FILE && forward_only) which = MF_CONFIG_PLAN_AUTO;
  mf_status st = MF_OK;
  const int staged = mf_config_stages_copies(cfg);
  if (which == MF_CONFIG_PLAN_AUTO && mem->device_budget == MF_CONFIG_SIZE_AUTO) {
    MF_CHECK_GOTO(mf_program_build(t, &po, &r->prog), st, fail);
    if (staged) {
      MF_CHECK_GOTO(mf_hwprofile_load(mf_plan_profile_path(cfg->hardware.profile), &r->hw), st, fail);
      mf_decisions *d = NULL;
      MF_CHECK_GOTO(mf_decisions_create(r->prog, &d), st, fail);
      st = mf_plan_evaluate(r->prog, &r->hw, d, UINT64_MAX, MF_PLAN_CHOSEN, &r->plan);
      mf_decisions_free(d);
      MF_CHECK_GOTO(st, st, fail);
      snprintf(r->plan->name, sizeof r->plan->name, "everything resident (no device budget set)");
      snprintf(r->plan_desc, sizeof r->plan_desc, "%s", r->plan->name);
    }
  } else {
    MF_CHECK_GOTO(mf_hwprofile_load(mf_plan_profile_path(cfg->hardware.profile), &r->hw), st, fail);
    mf_plan_request rq;
    memset(&rq, 0, sizeof rq);
    rq.params = t;
    rq.opts = po;
    rq.choose_order = cfg->train.micro_batch_order == MF_CONFIG_MB_ORDER_AUTO && !forward_only;
    rq.hw = &r->hw;
    rq.sim.overlap_optimizer = mf_config_overlaps_optimizer(cfg) && !forward_only;
    rq.budget = mem->device_budget == MF_CONFIG_SIZE_AUTO ? UINT64_MAX : mem->device_budget;
    rq.memory = mem;
    /* Measured routing (memory.routing; auto: the last run's routing.json in output.dir). */
    int found = 0;
    char rpath[1024];
    MF_CHECK_GOTO(mf_routing_for_config(cfg, &t->spec, &r->routing, &found, rpath, sizeof rpath), st, fail);
    if (found) {
      rq.expert_share = r->routing.share;
      if (!forward_only)
        MF_LOGI("train", "planning with the routing measured in %s (%llu tokens)", rpath,
                (unsigned long long)r->routing.tokens);
    }
    mf_plan *all[MF_PLAN_KIND_COUNT_];
    MF_CHECK_GOTO(mf_plan_for(&rq, &r->prog, all), st, fail);
    r->plan = all[MF_PLAN_CHOSEN];
    for (int k = 0; k < MF_PLAN_KIND_COUNT_; k++)
      if (k != MF_PLAN_CHOSEN) mf_plan_free(all[k]);
    snprintf(r->plan_desc, sizeof r->plan_desc, "%s", r->plan->name);
  }
  if (r->plan)
    MF_CHECK_GOTO(mf_exec_create_scheduled(r->prog, r->plan->s, r->backend, &r->exec), st, fail);
  else
    MF_CHECK_GOTO(mf_exec_create(r->prog, r->backend, &r->exec), st, fail);
  if (staged) MF_CHECK_GOTO(runner_stage(r, cfg), st, fail);
  r->G = G;
  const size_t n = (size_t)(cfg->train.micro_batch * cfg->data.seq_len);
  MF_CHECK_GOTO(mf_calloc((size_t)G, sizeof(int32_t *), "batch pointers", (void **)&r->ids), st, fail);
  MF_CHECK_GOTO(mf_calloc((size_t)G, sizeof(int32_t *), "batch pointers", (void **)&r->targets), st, fail);
  for (int64_t m = 0; m < G; m++) {
    MF_CHECK_GOTO(mf_calloc(n, sizeof(int32_t), "token ids", (void **)&r->ids[m]), st, fail);
    MF_CHECK_GOTO(mf_calloc(n, sizeof(int32_t), "targets", (void **)&r->targets[m]), st, fail);
  }
  return MF_OK;
fail:
  runner_free(r);
  return st;
}

static mf_status check_vocab(const mf_loader *l, const mf_param_table *t) {
  if ((int64_t)mf_loader_vocab(l) > t->spec.vocab)
    return MF_ERR(MF_ERR_CONFIG, "%s: its vocabulary (%u) is larger than the model's (%lld)",
                  mf_loader_path(l), mf_loader_vocab(l), (long long)t->spec.vocab);
  return MF_OK;
}

/* One full pass over an eval loader: mean cross-entropy per counted token. */
static mf_status eval_pass(runner *r, mf_loader *l, const float *w, mf_eval_result *out, float *capture) {
  memset(out, 0, sizeof *out);
  double sum = 0;
  int first = 1;
  for (;;) {
    mf_loader_batch b;
    MF_CHECK(mf_loader_next(l, r->ids[0], r->targets[0], NULL, &b));
    mf_exec_capture_final_hidden(r->exec, first ? capture : NULL);
    mf_step_result sr;
    MF_CHECK(mf_exec_step(r->exec, w, (const int32_t *const *)r->ids, (const int32_t *const *)r->targets,
                          NULL, &sr));
    first = 0;
    sum += sr.ce_loss * (double)sr.tokens;
    out->tokens += sr.tokens;
    out->sequences += b.n_seq;
    if (b.end_of_pass) break;
  }
  mf_exec_capture_final_hidden(r->exec, NULL);
  out->loss = out->tokens > 0 ? sum / (double)out->tokens : NAN;
  out->perplexity = exp(out->loss);
  return MF_OK;
}

static int cmp_double(const void *a, const void *b) {
  const double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y ? 1 : 0;
}

static mf_status corpus_entropy(const char *path, double *nats) {
  mf_tokens *t = NULL;
  MF_CHECK(mf_tokens_open(path, &t));
  mf_tokens_stats st;
  mf_status rc = mf_tokens_compute_stats(t, &st);
  mf_tokens_close(t);
  *nats = st.entropy_bits * 0.69314718055994531;
  return rc;
}

/* train.adam_moments: the dtype of the moment buffers m and v (each holds
 * total_numel elements of it; mf_adamw_update_bufs). */
static mf_dtype moment_dtype(const mf_config_train *tc) {
  return tc->adam_moments == MF_CONFIG_MOMENTS_BF16 ? MF_DTYPE_BF16 : MF_DTYPE_F32;
}

/* The host state of a run: fp32 master weights, gradient sums and AdamW
 * moments, each in host memory or — the parts the plan's host accounting
 * spills past memory.host_limit (planner/host.h: moments first, then the
 * master weights, then gradient sums that land once a step) — in a file in
 * memory.nvme_dir, mapped (src/core/hostbuf.h): the page cache moves the
 * pages, the bits are the same. A part spills whole when any of it does. */
typedef struct host_state {
  mf_hostbuf master, grads, m, v; /* master: only when it spills (else the loaded w) */
  mf_host_usage u;
  int spill_master, spill_grads, spill_moments;
  int release_master; /* drop the master's pages after each update (not only the cold part spills) */
} host_state;

static void host_state_free(host_state *h) {
  mf_hostbuf_free(&h->master);
  mf_hostbuf_free(&h->grads);
  mf_hostbuf_free(&h->m);
  mf_hostbuf_free(&h->v);
}

/* Places the state for the plan `pl` (NULL: everything in memory); *w moves
 * into a file when the master weights spill (*w_owned then 0: the buffer is
 * h->master's). */
static mf_status host_state_init(host_state *h, const mf_config *cfg, const mf_param_table *t,
                                 const mf_program *prog, const mf_plan *pl, float **w, int *w_owned, int quiet) {
  memset(h, 0, sizeof *h);
  const char *dir = cfg->memory.nvme_dir;
  if (pl && pl->hw) {
    MF_CHECK(mf_host_account(prog, pl->s, 0, &cfg->memory, pl->hw, &h->u));
    h->spill_moments = h->u.spill_moment_bytes > 0;
    h->spill_master = h->u.spill_master_bytes + h->u.spill_cold_master_bytes > 0;
    h->release_master = h->u.spill_master_bytes > 0; /* host-updated master pages spill too */
    h->spill_grads = h->u.spill_grad_bytes > 0;
    char need[32], lim[32];
    mf_format_bytes(h->u.total_bytes, need, sizeof need);
    mf_format_bytes(h->u.host_limit, lim, sizeof lim);
    if (h->u.unplaced_bytes > 0)
      MF_LOGW("train",
              "host memory: the plan needs %s against memory.host_limit %s and %s fits nowhere (%s); the run "
              "may fail to allocate or swap",
              need, lim, mf_format_bytes(h->u.unplaced_bytes, (char[32]){0}, 32),
              h->u.nvme ? "NVMe spill cannot take it" : "no memory.nvme_dir or the profile has no NVMe bandwidth");
  }
  const size_t n = (size_t)t->total_numel, ms = mf_dtype_size(moment_dtype(&cfg->train));
  MF_CHECK(mf_hostbuf_alloc(h->spill_grads ? dir : NULL, "gradients", n * sizeof(float), &h->grads));
  MF_CHECK(mf_hostbuf_alloc(h->spill_moments ? dir : NULL, "adam-m", n * ms, &h->m));
  MF_CHECK(mf_hostbuf_alloc(h->spill_moments ? dir : NULL, "adam-v", n * ms, &h->v));
  if (h->spill_master) {
    MF_CHECK(mf_hostbuf_alloc(dir, "master-weights", n * sizeof(float), &h->master));
    if (n) memcpy(h->master.ptr, *w, n * sizeof(float));
    free(*w);
    *w = (float *)h->master.ptr;
    *w_owned = 0;
  }
  if (!quiet && (h->spill_master || h->spill_grads || h->spill_moments)) {
    char a[32], b[32], c[32];
    MF_LOGI("train", "host state on NVMe (%s, files unlinked): %s%s%s%s%s%s (the plan spills %s past "
            "memory.host_limit %s)",
            dir, h->spill_moments ? "AdamW moments " : "",
            h->spill_moments ? mf_format_bytes(2 * n * ms, a, sizeof a) : "",
            h->spill_master ? (h->spill_moments ? ", master weights " : "master weights ") : "",
            h->spill_master ? mf_format_bytes(n * sizeof(float), b, sizeof b) : "",
            h->spill_grads ? (h->spill_moments || h->spill_master ? ", gradient sums " : "gradient sums ") : "",
            h->spill_grads ? mf_format_bytes(n * sizeof(float), c, sizeof c) : "",
            mf_format_bytes(h->u.spill_moment_bytes + h->u.spill_master_bytes + h->u.spill_cold_master_bytes +
                                h->u.spill_grad_bytes,
                            (char[32]){0}, 32),
            mf_format_bytes(h->u.host_limit, (char[32]){0}, 32));
  }
  return MF_OK;
}

/* Parameter i's host state is done with for this step: the kernel may write
 * its spilled pages back and drop them (nothing for parts in memory). */
static void host_state_release(host_state *h, const mf_param_table *t, int64_t i, size_t ms) {
  const mf_param *p = &t->params[i];
  const size_t o = (size_t)p->offset, n = (size_t)p->numel;
  if (h->spill_moments) {
    (void)mf_hostbuf_advise(&h->m, o * ms, n * ms, 0);
    (void)mf_hostbuf_advise(&h->v, o * ms, n * ms, 0);
  }
  if (h->release_master) (void)mf_hostbuf_advise(&h->master, o * sizeof(float), n * sizeof(float), 0);
  if (h->spill_grads) (void)mf_hostbuf_advise(&h->grads, o * sizeof(float), n * sizeof(float), 0);
}

/* Parameter i got a gradient this step: a routed expert that no token reached
 * has none in Mixtral and Qwen (PyTorch leaves .grad None); OLMoE's experts
 * always get one (a zero gradient), as in transformers. */
static int has_gradient(const mf_param_table *t, const int64_t *expert_tokens, int64_t i) {
  const mf_param *p = &t->params[i];
  return p->expert < 0 || mf_family_idle_expert_has_grad(t->spec.family) ||
         expert_tokens[p->layer * t->spec.experts + p->expert] > 0;
}

/* The updates of the parameters whose optimizer the plan put on the device
 * (mf_exec_optimize): the same selection, step counts and hyper-parameters as
 * optimizer_step's, the gradients scaled by coef there. */
static mf_status device_optimizer_step(const mf_param_table *t, mf_exec *x, const mf_config_train *tc,
                                       double lr, double coef, const uint8_t *on_device, int64_t *steps,
                                       uint8_t *update, const uint8_t *decays) {
  if (!on_device) return MF_OK;
  const int64_t *tokens = mf_exec_expert_tokens(x);
  for (int64_t i = 0; i < t->n; i++) {
    update[i] = on_device[i] && has_gradient(t, tokens, i);
    if (update[i]) steps[i]++;
  }
  const mf_adamw_hparams h = mf_adamw_hparams_from_config(tc, lr);
  const mf_exec_optim a = {h.lr, h.beta1, h.beta2, h.eps, h.weight_decay, coef, steps, update, decays};
  return mf_exec_optimize(x, &a);
}

/* AdamW over every parameter that got a gradient. A routed expert that saw no
 * token in the step has none in Mixtral and Qwen (PyTorch leaves .grad None): it
 * is not updated and its step count does not advance. OLMoE's experts always get
 * a (zero) gradient, so they are updated, as transformers does. Weight decay
 * applies to matrices only. */
static mf_status optimizer_step(const mf_param_table *t, const int64_t *expert_tokens,
                                const mf_config_train *tc, double lr, float *w, float *g, void *m, void *v,
                                int64_t *steps, const uint8_t *on_device, host_state *hs, mf_threadpool *pool) {
  const mf_dtype md = moment_dtype(tc);
  const size_t ms = mf_dtype_size(md);
  mf_adamw_hparams h = mf_adamw_hparams_from_config(tc, lr);
  mf_adamw_hparams h_nodecay = h;
  h_nodecay.weight_decay = 0;
  for (int64_t i = 0; i < t->n; i++) {
    const mf_param *p = &t->params[i];
    if (on_device && on_device[i]) continue; /* updated on the device (device_optimizer_step) */
    if (!has_gradient(t, expert_tokens, i)) continue;
    steps[i]++;
    const mf_adamw_bufs b = {w + p->offset,
                             g + p->offset,
                             (char *)m + (size_t)p->offset * ms,
                             (char *)v + (size_t)p->offset * ms,
                             NULL,
                             (size_t)p->numel,
                             MF_DTYPE_F32,
                             md};
    MF_CHECK(mf_adamw_update_bufs(p->ndim == 2 ? &h : &h_nodecay, steps[i], &b, pool));
    host_state_release(hs, t, i, ms);
  }
  return MF_OK;
}

/* train.overlap_optimizer: the optimizer worker (src/optim/worker.h) behind
 * the executor's hooks. Step k's updates are queued once its gradients are all
 * home and run while step k+1 runs; each upload of a weight in step k+1 (and
 * each copy of its gradient home) waits for that parameter's update only.
 * Before an evaluation and at the end of training the loop waits for all of
 * them. Same bits as optimizer_step after mf_optim_clip_grad_norm: the same
 * norm (worker.h), the same clip factor and skip decision, the same per-element
 * scaling and AdamW, the same parameters and step counts. */
static mf_status hook_wait(void *ctx, int32_t i) {
  return mf_optim_worker_wait_param((mf_optim_worker *)ctx, i);
}
static void hook_grad_home(void *ctx, int32_t i) {
  mf_optim_worker_grad_home((mf_optim_worker *)ctx, i);
}

static mf_status optimizer_worker_create(const mf_param_table *t, float *w, float *g, void *m, void *v,
                                         mf_dtype md, int threads, mf_optim_worker **out) {
  const size_t ms = mf_dtype_size(md);
  mf_optim_tensor *ts = NULL;
  MF_CHECK(mf_calloc((size_t)(t->n ? t->n : 1), sizeof *ts, "optimizer tensors", (void **)&ts));
  for (int64_t i = 0; i < t->n; i++) {
    const mf_param *p = &t->params[i];
    ts[i] = (mf_optim_tensor){w + p->offset,
                              g + p->offset,
                              (char *)m + (size_t)p->offset * ms,
                              (char *)v + (size_t)p->offset * ms,
                              (size_t)p->numel,
                              md};
  }
  mf_status st = mf_optim_worker_create(ts, (int32_t)t->n, threads, out);
  free(ts);
  return st;
}

/* optimizer_step's updates, queued on the worker in the order the step program
 * first uploads the parameters (`order`); `upd` holds t->n entries. */
static mf_status optimizer_queue(const mf_param_table *t, const int64_t *expert_tokens,
                                 const mf_config_train *tc, double lr, double coef, const int32_t *order,
                                 int64_t *steps, const uint8_t *on_device, mf_optim_update *upd,
                                 mf_optim_worker *wk) {
  mf_adamw_hparams h = mf_adamw_hparams_from_config(tc, lr);
  mf_adamw_hparams h_nodecay = h;
  h_nodecay.weight_decay = 0;
  int32_t n = 0;
  for (int64_t k = 0; k < t->n; k++) {
    const int32_t i = order[k];
    const mf_param *p = &t->params[i];
    if ((on_device && on_device[i]) || !has_gradient(t, expert_tokens, i)) continue;
    steps[i]++;
    upd[n++] = (mf_optim_update){i, steps[i], p->ndim == 2 ? h : h_nodecay};
  }
  return mf_optim_worker_update(wk, upd, n, coef);
}

mf_status mf_train(const mf_config *cfg, int quiet, mf_train_summary *out) {
  memset(out, 0, sizeof *out);
  out->valid_loss = NAN;
  out->predicted_step_s = out->executed_step_s = NAN;
  MF_CHECK(check_backend(cfg));
  mf_status st = MF_OK;
  mf_threadpool *pool = NULL;
  mf_param_table *t = NULL;
  float *w = NULL, *g = NULL;
  void *mom = NULL, *var = NULL; /* train.adam_moments: fp32 or bf16 */
  int64_t *steps = NULL;
  mf_loader *train = NULL, *valid = NULL;
  mf_metrics *metrics = NULL;
  mf_optim_buf *bufs = NULL;
  mf_optim_worker *wk = NULL; /* train.overlap_optimizer */
  mf_optim_update *upd = NULL;
  uint8_t *used = NULL;
  /* The optimizer on the device (the plan's optim decisions; NULL: none). */
  const uint8_t *on_device = NULL;
  const double **ext_sums = NULL; /* [n_params] a device parameter's norm chunk sums, else NULL */
  uint8_t *dev_update = NULL, *decays = NULL;
  double *step_wall = NULL; /* [train.steps] each step's wall time, for the executed median */
  int64_t *routed = NULL;   /* [layers * experts] tokens routed to each expert, summed over the steps */
  runner tr = {0}, ev = {0};
  host_state hs;
  memset(&hs, 0, sizeof hs);
  int w_owned = 1; /* w is ours to free (0: it moved into hs.master) */
  char desc[4200];

  MF_CHECK_GOTO(mf_threadpool_create((int)cfg->train.threads, &pool), st, done);
  MF_CHECK_GOTO(mf_run_load_model(cfg, NULL, &t, &w, desc, sizeof desc), st, done);
  MF_CHECK_GOTO(mf_loader_create(cfg->data.train, cfg->data.seq_len, cfg->train.micro_batch, cfg->train.seed,
                                 MF_LOADER_TRAIN, &train),
                st, done);
  MF_CHECK_GOTO(check_vocab(train, t), st, done);
  if (cfg->data.valid) {
    MF_CHECK_GOTO(mf_loader_create(cfg->data.valid, cfg->data.seq_len, cfg->train.micro_batch, 0,
                                   MF_LOADER_EVAL, &valid),
                  st, done);
    MF_CHECK_GOTO(check_vocab(valid, t), st, done);
  }
  MF_CHECK_GOTO(corpus_entropy(cfg->data.train, &out->entropy_nats), st, done);
  MF_CHECK_GOTO(runner_init(&tr, cfg, t, pool, cfg->train.grad_accum, 0), st, done);
  if (valid) MF_CHECK_GOTO(runner_init(&ev, cfg, t, pool, 1, 1), st, done);

  MF_CHECK_GOTO(host_state_init(&hs, cfg, t, tr.prog, tr.plan, &w, &w_owned, quiet), st, done);
  g = (float *)hs.grads.ptr;
  mom = hs.m.ptr;
  var = hs.v.ptr;
  MF_CHECK_GOTO(mf_calloc((size_t)t->n, sizeof(int64_t), "step counts", (void **)&steps), st, done);
  MF_CHECK_GOTO(mf_calloc((size_t)t->n, sizeof(mf_optim_buf), "gradient list", (void **)&bufs), st, done);
  MF_CHECK_GOTO(mf_calloc((size_t)(cfg->train.steps > 0 ? cfg->train.steps : 1), sizeof(double), "step times",
                          (void **)&step_wall),
                st, done);
  if (tr.plan && tr.plan->s->n_optim_device > 0) {
    on_device = tr.plan->s->optim_device;
    mf_exec_set_optim_state(tr.exec, mom, var);
    MF_CHECK_GOTO(mf_calloc((size_t)t->n, sizeof(double *), "norm sums", (void **)&ext_sums), st, done);
    MF_CHECK_GOTO(mf_calloc((size_t)t->n, 1, "device updates", (void **)&dev_update), st, done);
    MF_CHECK_GOTO(mf_calloc((size_t)t->n, 1, "weight decay flags", (void **)&decays), st, done);
    for (int64_t i = 0; i < t->n; i++) decays[i] = t->params[i].ndim == 2; /* as optimizer_step */
  }
  const size_t n_routed = (size_t)(t->spec.layers * (t->spec.experts > 0 ? t->spec.experts : 1));
  MF_CHECK_GOTO(mf_calloc(n_routed, sizeof(int64_t), "routing counts", (void **)&routed), st, done);
  if (mf_config_overlaps_optimizer(cfg)) {
    MF_CHECK_GOTO(mf_calloc((size_t)t->n, sizeof(mf_optim_update), "optimizer updates", (void **)&upd), st,
                  done);
    MF_CHECK_GOTO(mf_calloc((size_t)t->n, 1, "gradient flags", (void **)&used), st, done);
    MF_CHECK_GOTO(
        optimizer_worker_create(t, w, g, mom, var, moment_dtype(&cfg->train), (int)cfg->train.threads, &wk),
        st, done);
    const mf_exec_param_hooks hooks = {wk, hook_wait, hook_grad_home};
    mf_exec_set_param_hooks(tr.exec, &hooks);
  }
  if (cfg->output.checkpoint_every > 0)
    MF_LOGW("train",
            "output.checkpoint_every: %lld: resume checkpoints are not built yet; only the final weights are "
            "written (%s/final)",
            (long long)cfg->output.checkpoint_every, cfg->output.dir);
  MF_CHECK_GOTO(mf_mkdir_p(cfg->output.dir), st, done);
  MF_CHECK_GOTO(mf_metrics_open(cfg->output.dir, 0, &metrics), st, done);

  int64_t total = 0, active = 0;
  mf_model_spec_param_count(&t->spec, &total, &active);
  const int64_t tokens_per_step = cfg->train.micro_batch * cfg->data.seq_len * cfg->train.grad_accum;
  if (!quiet) {
    char arena[32];
    MF_LOGI("train",
            "model: %s, %s: %.3fM parameters (%.3fM active per token), %lld layers, %lld experts top-%lld",
            mf_family_name(t->spec.family), desc, (double)total / 1e6, (double)active / 1e6,
            (long long)t->spec.layers, (long long)t->spec.experts, (long long)t->spec.top_k);
    MF_LOGI("train",
            "data: %s: %llu windows of %lld tokens; unigram entropy %.4f nats/token (a model that ignores "
            "context scores this)",
            cfg->data.train, (unsigned long long)mf_loader_windows(train), (long long)cfg->data.seq_len,
            out->entropy_nats);
    MF_LOGI("train",
            "step: %lld x %lld sequences of %lld tokens = %lld tokens; %d threads; %s backend, device "
            "arena %s, %d ops, %.3g FLOP/step",
            (long long)cfg->train.grad_accum, (long long)cfg->train.micro_batch, (long long)cfg->data.seq_len,
            (long long)tokens_per_step, mf_threadpool_size(pool), tr.backend->name,
            mf_format_bytes(mf_exec_arena_bytes(tr.exec), arena, sizeof arena), tr.prog->n_ops,
            tr.prog->flops);
  }

  if (!quiet && tr.plan) {
    const mf_plan *pl = tr.plan;
    int wr = 0, ws = 0, gd = 0, gs = 0, ak = 0, ao = 0, ar = 0;
    for (int32_t i = 0; i < pl->d->n_params; i++) {
      pl->d->param[i] == MF_PARAM_RESIDENT ? wr++ : ws++;
      pl->d->grad[i] == MF_GRAD_DEVICE ? gd++ : gs++;
    }
    for (int32_t x = 0; x < tr.prog->n_tensors; x++)
      if (mf_schedule_can_offload(tr.prog, x))
        pl->d->act[x] == MF_ACT_KEEP ? ak++ : pl->d->act[x] == MF_ACT_OFFLOAD ? ao++ : ar++;
    char b1[32], b2[32], b3[32], b4[32], b5[32];
    MF_LOGI("train",
            "plan: %s, arena %s (peak %s), predicted %.4g s/step (%.0f tokens/s); device budget %s%s; "
            "weights %d resident / %d streamed; gradients %d on the device / %d streamed; activations %d "
            "kept / %d "
            "offloaded / %d recomputed; optimizer %d on the device / %d on the host; %s up and %s home per "
            "step; %s order",
            tr.plan_desc, mf_format_bytes(pl->s->arena_bytes, b2, sizeof b2),
            mf_format_bytes(pl->s->peak_live_bytes, b3, sizeof b3), pl->sim.step_seconds,
            (double)tokens_per_step / pl->sim.step_seconds, mf_format_bytes(pl->budget, b1, sizeof b1),
            cfg->memory.device_budget == MF_CONFIG_SIZE_AUTO ? " (auto: the plan's arena)" : "", wr, ws, gd,
            gs, ak, ao, ar, pl->s->n_optim_device, pl->d->n_params - pl->s->n_optim_device,
            mf_format_bytes(pl->s->h2d_bytes, b4, sizeof b4),
            mf_format_bytes(pl->s->d2h_bytes, b5, sizeof b5), mf_program_order_name(tr.prog->order));
  }
  if (!quiet && tr.staging) {
    const mf_staging *sg = tr.staging;
    char b1[32], b2[32], b3[32];
    MF_LOGI("train",
            "copies staged: %s of pinned memory in %d exact-size slabs (%s for uploads, %s for copies home), "
            "%d host thread%s each way",
            mf_format_bytes(sg->arena_bytes, b1, sizeof b1), sg->n_slabs,
            mf_format_bytes(sg->h2d_region_bytes, b2, sizeof b2),
            mf_format_bytes(sg->arena_bytes - sg->h2d_region_bytes, b3, sizeof b3), staging_threads(cfg),
            staging_threads(cfg) == 1 ? "" : "s");
  }
  const double t_start = mf_time_now();
  double window_loss = 0;
  int64_t window_n = 0, window_tokens = 0;
  double window_t0 = t_start;
  double window_busy[MF_EXEC_STREAMS] = {0, 0, 0};
  double window_fill = 0, window_drain = 0; /* staged copies: the host's seconds */
  size_t window_peak = 0;
  /* The host optimizer per step: hidden behind the device work / exposed (the
   * loop waiting for it). Overlapped: from the worker's busy seconds and the
   * loop's waits; otherwise all of it is exposed. */
  double window_opt_hidden = 0, window_opt_exposed = 0, opt_busy_seen = 0, opt_waited_seen = 0;
  for (int64_t step = 1; step <= cfg->train.steps; step++) {
    const double step_t0 = mf_time_now();
    for (int64_t m = 0; m < tr.G; m++)
      MF_CHECK_GOTO(mf_loader_next(train, tr.ids[m], tr.targets[m], NULL, NULL), st, done);
    mf_step_result sr;
    MF_CHECK_GOTO(
        mf_exec_step(tr.exec, w, (const int32_t *const *)tr.ids, (const int32_t *const *)tr.targets, g, &sr),
        st, done);
    /* Every input token is routed, masked targets too: B*S*G tokens a step. */
    for (size_t i = 0; i < n_routed; i++) routed[i] += mf_exec_expert_tokens(tr.exec)[i];
    for (int64_t i = 0; i < t->n; i++) {
      const mf_param *p = &t->params[i];
      const int has = has_gradient(t, mf_exec_expert_tokens(tr.exec), i);
      const int dev = on_device && on_device[i]; /* its gradient stayed on the device */
      bufs[i] = (mf_optim_buf){has && !dev ? g + p->offset : NULL, has ? (size_t)p->numel : 0};
      if (ext_sums) ext_sums[i] = dev ? mf_exec_norm_sums(tr.exec) + tr.prog->norm_first[i] : NULL;
    }
    /* The global norm over every gradient, in parameter order, the device's
     * chunk sums in their places: the same bits wherever each was computed. */
    double norm = 0, coef = 1;
    const double opt_t0 = mf_time_now();
    if (wk) {
      for (int64_t i = 0; i < t->n; i++) used[i] = bufs[i].n > 0;
      MF_CHECK_GOTO(mf_optim_worker_norm_ext(wk, used, ext_sums, &norm), st, done);
      coef = mf_optim_clip_coef(norm, cfg->train.grad_clip);
    } else {
      MF_CHECK_GOTO(mf_optim_grad_norm_ext(bufs, (size_t)t->n, ext_sums, pool, &norm), st, done);
      coef = mf_optim_clip_coef(norm, cfg->train.grad_clip);
      if (coef < 1.0) MF_CHECK_GOTO(mf_optim_grad_scale(bufs, (size_t)t->n, coef, pool), st, done);
    }
    const double lr = mf_lr_at(&cfg->train, step);
    const int skip = !isfinite(norm) || !isfinite(sr.loss);
    if (skip) {
      out->skipped++;
      MF_LOGW("train",
              "step %lld: non-finite gradients or loss (loss %g, |g| %g): step skipped, weights and "
              "optimizer state unchanged",
              (long long)step, sr.loss, norm);
    } else {
      if (wk)
        MF_CHECK_GOTO(optimizer_queue(t, mf_exec_expert_tokens(tr.exec), &cfg->train, lr, coef,
                                      mf_exec_param_upload_order(tr.exec), steps, on_device, upd, wk),
                      st, done);
      else
        MF_CHECK_GOTO(optimizer_step(t, mf_exec_expert_tokens(tr.exec), &cfg->train, lr, w, g, mom, var, steps,
                                     on_device, &hs, pool),
                      st, done);
      MF_CHECK_GOTO(
          device_optimizer_step(t, tr.exec, &cfg->train, lr, coef, on_device, steps, dev_update, decays), st,
          done);
    }
    if (!wk) window_opt_exposed += mf_time_now() - opt_t0;
    step_wall[step - 1] = mf_time_now() - step_t0;
    mf_exec_stats xs;
    mf_exec_stats_get(tr.exec, &xs);
    for (int k = 0; k < MF_EXEC_STREAMS; k++) window_busy[k] += xs.busy_s[k];
    window_fill += xs.fill_s; /* NaN unstaged: so is the mean */
    window_drain += xs.drain_s;
    if (xs.peak_live_bytes > window_peak) window_peak = xs.peak_live_bytes;
    if (step == 1) out->first_loss = sr.loss;
    window_loss += sr.loss;
    window_n++;
    window_tokens += sr.tokens;
    out->steps = step;

    const int last = step == cfg->train.steps;
    const int eval_now = valid && (last || (cfg->train.eval_every > 0 && step % cfg->train.eval_every == 0));
    if (wk) {
      /* An evaluation and the final weights need every update done. */
      if (eval_now || last) MF_CHECK_GOTO(mf_optim_worker_wait_all(wk), st, done);
    }
    /* ... and the weights the device updates, home. */
    if (on_device && (eval_now || last)) MF_CHECK_GOTO(mf_exec_sync_home(tr.exec, w, 0), st, done);
    if (wk) {
      double busy, waited;
      mf_optim_worker_stats(wk, &busy, &waited);
      const double d_busy = busy - opt_busy_seen, d_waited = waited - opt_waited_seen;
      opt_busy_seen = busy;
      opt_waited_seen = waited;
      window_opt_exposed += d_waited;
      window_opt_hidden += d_busy > d_waited ? d_busy - d_waited : 0.0;
    }
    double eval_loss = NAN;
    if (eval_now) {
      mf_eval_result er;
      MF_CHECK_GOTO(eval_pass(&ev, valid, w, &er, NULL), st, done);
      eval_loss = er.loss;
      out->valid_loss = er.loss;
    }
    if (last || step == 1 || step % cfg->train.log_every == 0 || eval_now) {
      const double now = mf_time_now();
      mf_step_metrics sm;
      mf_step_metrics_init(&sm);
      sm.step = step;
      sm.loss = window_loss / (double)window_n;
      sm.ce_loss = sr.ce_loss;
      sm.aux_loss = sr.aux_loss;
      sm.lr = lr;
      sm.grad_norm = norm;
      sm.tokens = window_tokens;
      sm.tokens_per_s =
          (double)window_n * (double)tokens_per_step / (now - window_t0 > 0 ? now - window_t0 : 1e-9);
      sm.elapsed_s = now - t_start;
      sm.skipped = skip;
      sm.eval_loss = eval_loss;
      sm.step_s = (now - window_t0) / (double)window_n;
      /* Streams: mean busy over the window (NaN on a backend without timing),
       * bytes of this step (every step moves the same), the window's peak. */
      for (int k = 0; k < MF_EXEC_STREAMS; k++) {
        sm.busy_s[k] = window_busy[k] / (double)window_n;
        sm.idle_s[k] = sm.step_s - sm.busy_s[k];
        window_busy[k] = 0;
      }
      sm.h2d_bytes = (double)xs.h2d_bytes;
      sm.d2h_bytes = (double)xs.d2h_bytes;
      sm.peak_device_bytes = (double)window_peak;
      window_peak = 0;
      sm.optimizer_hidden_s = window_opt_hidden / (double)window_n;
      sm.optimizer_exposed_s = window_opt_exposed / (double)window_n;
      window_opt_hidden = window_opt_exposed = 0;
      sm.staging_fill_s = window_fill / (double)window_n;
      sm.staging_drain_s = window_drain / (double)window_n;
      window_fill = window_drain = 0;
      MF_CHECK_GOTO(mf_metrics_write(metrics, &sm), st, done);
      if (!quiet) {
        char line[512];
        mf_progress_format(line, sizeof line, &sm, cfg->train.steps);
        MF_LOGI("train", "%s", line);
      }
      out->final_loss = sm.loss;
      window_loss = 0;
      window_n = 0;
      window_tokens = 0;
      window_t0 = now;
    }
  }
  out->seconds = mf_time_now() - t_start;
  out->tokens_per_s = (double)(out->steps * tokens_per_step) / (out->seconds > 0 ? out->seconds : 1e-9);
  if (tr.plan) {
    /* The first step pays for cold caches and page faults: the median of the rest. */
    const int64_t n_rest = out->steps > 1 ? out->steps - 1 : out->steps;
    double *rest = step_wall + (out->steps > 1 ? 1 : 0);
    qsort(rest, (size_t)n_rest, sizeof(double), cmp_double);
    out->predicted_step_s = tr.plan->sim.step_seconds;
    out->executed_step_s = n_rest > 0 ? rest[n_rest / 2] : NAN;
    if (!quiet)
      MF_LOGI("train",
              "predicted %.4g s/step, executed %.4g s/step (%.3f; median of steps 2..%lld; profile %s)",
              out->predicted_step_s, out->executed_step_s, out->predicted_step_s / out->executed_step_s,
              (long long)out->steps, mf_plan_profile_path(cfg->hardware.profile));
  }
  {
    char final_dir[4200];
    snprintf(final_dir, sizeof final_dir, "%s/final", cfg->output.dir);
    MF_CHECK_GOTO(mf_params_save_model_dir(t, w, final_dir), st, done);
    char routing_path[4200];
    const uint64_t routed_tokens = (uint64_t)out->steps * (uint64_t)tokens_per_step;
    snprintf(routing_path, sizeof routing_path, "%s/routing.json", cfg->output.dir);
    MF_CHECK_GOTO(mf_routing_write(routing_path, &t->spec, routed, routed_tokens), st, done);
    if (!quiet)
      MF_LOGI("train", "routing: %s (%llu tokens)", routing_path, (unsigned long long)routed_tokens);
    if (!quiet) {
      MF_LOGI("train",
              "done: %lld steps in %.1f s (%.0f tokens/s); loss %.4f -> %.4f nats/token; unigram entropy "
              "%.4f%s",
              (long long)out->steps, out->seconds, out->tokens_per_s, out->first_loss, out->final_loss,
              out->entropy_nats, out->skipped ? " (some steps skipped)" : "");
      if (valid)
        MF_LOGI("train", "validation loss %.4f (perplexity %.2f) on %s", out->valid_loss,
                exp(out->valid_loss), cfg->data.valid);
      MF_LOGI("train", "weights: %s (HF model dir); metrics: %s", final_dir, mf_metrics_path(metrics));
    }
  }
done:
  mf_optim_worker_free(wk); /* first: it may still be writing the buffers freed below */
  free(upd);
  free(used);
  free(ext_sums);
  free(dev_update);
  free(decays);
  mf_metrics_close(metrics);
  runner_free(&tr);
  runner_free(&ev);
  mf_loader_free(train);
  mf_loader_free(valid);
  host_state_free(&hs); /* g, mom, var (and w when it spilled) */
  free(steps);
  free(bufs);
  free(step_wall);
  free(routed);
  if (w_owned) free(w);
  mf_param_table_free(t);
  mf_threadpool_free(pool);
  return st;
}

mf_status mf_eval(const mf_config *cfg, const mf_eval_opts *opts, mf_eval_result *out) {
  memset(out, 0, sizeof *out);
  MF_CHECK(check_backend(cfg));
  mf_status st = MF_OK;
  mf_threadpool *pool = NULL;
  mf_param_table *t = NULL;
  float *w = NULL, *hidden = NULL, *logits = NULL;
  mf_loader *l = NULL;
  runner r = {0};
  char desc[4200], final_dir[4200];
  const char *model_dir = opts->model_dir;
  snprintf(final_dir, sizeof final_dir, "%s/final", cfg->output.dir);
  if (!model_dir && cfg->model.has_init && is_dir_with_config(final_dir)) model_dir = final_dir;
  const char *tokens = opts->tokens ? opts->tokens : cfg->data.valid ? cfg->data.valid : cfg->data.train;

  MF_CHECK_GOTO(mf_threadpool_create((int)cfg->train.threads, &pool), st, done);
  MF_CHECK_GOTO(mf_run_load_model(cfg, model_dir, &t, &w, desc, sizeof desc), st, done);
  MF_CHECK_GOTO(mf_loader_create(tokens, cfg->data.seq_len, cfg->train.micro_batch, 0, MF_LOADER_EVAL, &l),
                st, done);
  MF_CHECK_GOTO(check_vocab(l, t), st, done);
  MF_CHECK_GOTO(runner_init(&r, cfg, t, pool, 1, 1), st, done);
  const int64_t T = cfg->train.micro_batch * cfg->data.seq_len, H = t->spec.hidden, V = t->spec.vocab;
  if (opts->dump_logits)
    MF_CHECK_GOTO(mf_malloc((size_t)(T * H) * sizeof(float), "hidden states", (void **)&hidden), st, done);
  MF_LOGI("eval", "model: %s; tokens: %s", desc, tokens);
  MF_CHECK_GOTO(eval_pass(&r, l, w, out, hidden), st, done);
  if (opts->dump_logits) {
    /* logits of the first sequence = final hidden . lm_head^T, on the host. */
    const int64_t S = cfg->data.seq_len;
    MF_CHECK_GOTO(mf_malloc((size_t)(S * V) * sizeof(float), "logits", (void **)&logits), st, done);
    const float *W = w + t->params[mf_param_lm_head(t)].offset;
    for (int64_t s = 0; s < S; s++)
      for (int64_t v = 0; v < V; v++) {
        const float *hrow = hidden + s * H, *wrow = W + v * H;
        float acc = 0;
        for (int64_t k = 0; k < H; k++) acc += hrow[k] * wrow[k];
        logits[s * V + v] = acc;
      }
    MF_CHECK_GOTO(mf_write_file_atomic(opts->dump_logits, logits, (size_t)(S * V) * sizeof(float)), st, done);
    MF_LOGI("eval", "logits of the first sequence: %s (float32, [%lld, %lld] row-major)", opts->dump_logits,
            (long long)S, (long long)V);
  }
done:
  runner_free(&r);
  mf_loader_free(l);
  free(hidden);
  free(logits);
  free(w);
  mf_param_table_free(t);
  mf_threadpool_free(pool);
  return st;
}
