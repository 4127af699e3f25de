/* `moefit train`: setup, the step loop, finish (see train.h and train_internal.h). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "experts/routing.h"
#include "kernels/registry.h"
#include "src/core/env.h"
#include "src/io/tokens.h"
#include "src/train/base.h"
#include "src/train/train_internal.h"

/* Everything one training run owns. */
typedef struct run {
  const mf_config *cfg;
  mf_config cfg_ranks;   /* with several ranks: the caller's config with its ranks (cfg points here) */
  mf_ranks rk;           /* several ranks (multi): this one's part (ranks.c) */
  mf_comm *comm;         /* the world (NULL: none given, one rank) */
  mf_ep ep;              /* expert parallelism's exchanges (one rank with itself: MF_TEST_EP_SELF) */
  int multi;             /* the run has more than one rank */
  int rank0;             /* this process writes the run's files and lines (the only one, or rank 0) */
  const int64_t *tokens; /* this step's tokens per expert (over every rank) */
  mf_config ev_cfg; /* the evaluation's config: cfg, planned with the training plan's routing (setup) */
  int quiet;
  int verbose; /* the progress lines with the stream figures (MF_TRAIN_VERBOSE) */
  mf_threadpool *pool;
  mf_param_table *t;
  float *w;    /* fp32 master weights (in hs.master when they spill) */
  int w_owned; /* w is ours to free (0: it moved into hs.master) */
  char desc[4200];
  mf_loader *train, *valid;
  mf_run tr, ev; /* the training step; the evaluation (with data.valid), inside tr */
  mf_host_state hs;
  mf_updates up;
  mf_optim_buf *bufs;      /* [n] the gradients the host holds this step */
  const double **ext_sums; /* [n] a device-optimized parameter's norm chunk sums, else NULL */
  uint8_t *used;           /* [n] got a gradient (the overlapped worker's norm) */
  mf_optim_worker *wk;     /* train.overlap_optimizer */
  mf_metrics *metrics;
  double *step_wall; /* [train.steps] each step's wall time, for the executed median */
  int64_t *routed;   /* [layers * experts] tokens routed to each expert, summed over the steps */
  size_t n_routed;
  uint64_t base_sum; /* LoRA: the frozen base's checksum (mf_ckpt_base_sum), the checkpoints' record of it */
  char *base_json;   /* the base as loaded (base.h): checkpoints' base.json, final/'s moefit_base.json */
  uint64_t *drop_seeds; /* [G] LoRA's adapter dropout: this step's seed of each micro-batch (NULL: none) */
  int64_t tokens_per_step;
  mf_window win;
  double t_start;
  mf_ckpt_writer *ckw;
  int resume;             /* continue from a checkpoint */
  const char *resume_dir; /* that one (NULL: the newest complete one); then resume_path */
  char resume_path[4200];
  char resume_found[4200]; /* --resume without DIR on hot experts: the checkpoint setup found */
  int64_t first_step;     /* the steps done before this process's first (the checkpoint's) */
  int stop;               /* after_step: the run stops after this step: the signal, or -1 (too many skipped steps) */
  char pending[4400];     /* the checkpoint written but not yet marked COMPLETE */
  mf_ckpt_async *cka;     /* output.checkpoint_async: the writer beside training (NULL: none) */
  double cka_paused;      /* the seconds training paused for the snapshot of the write in flight */
} run;

static void run_free(run *r, int ok) {
  mf_optim_worker_free(r->wk); /* first: it may still be writing the buffers freed below */
  mf_ckpt_async_free(r->cka);  /* a write in flight ends (uncommitted) before its writer goes */
  mf_ckpt_writer_free(r->ckw);
  mf_updates_free(&r->up);
  free(r->used);
  free(r->drop_seeds);
  free(r->ext_sums);
  free(r->bufs);
  mf_metrics_close(r->metrics);
  mf_ep_free(&r->ep); /* its host buffers are the backend's */
  mf_run_close(&r->ev); /* inside the training's backend: first */
  mf_run_close(&r->tr); /* the table with it */
  mf_loader_free(r->train);
  mf_loader_free(r->valid);
  mf_host_state_free(&r->hs); /* gradients and moments (and w when it spilled) */
  free(r->step_wall);
  free(r->routed);
  free(r->base_json);
  if (r->w_owned) free(r->w);
  mf_threadpool_free(r->pool);
  /* The node's shared memory last: rank 0 wrote the final weights from it.
   * After a failure the others may never come to free it with us. */
  if (r->multi && ok) (void)mf_comm_barrier_solo(r->rk.comm, 0, "writing the final weights");
  if (!ok) mf_ranks_fail(&r->rk);
  mf_ranks_free(&r->rk, ok);
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

/* train.overlap_optimizer: the optimizer worker (src/optim/worker.h) behind
 * the executor's hooks. Step k's updates are queued once its gradients are all
 * home and run while step k+1 runs; each upload of a weight in step k+1 (and
 * each copy of its gradient home) waits for that parameter's update only.
 * Before an evaluation and at the end of training the loop waits for all of
 * them. Same bits as the host updates after the step: the same norm
 * (worker.h), clip factor, skip decision and updates (updates.c). */
static mf_status hook_wait(void *ctx, int32_t i) { return mf_optim_worker_wait_param((mf_optim_worker *)ctx, i); }
static void hook_grad_home(void *ctx, int32_t i) { mf_optim_worker_grad_home((mf_optim_worker *)ctx, i); }

static mf_status worker_create(run *r) {
  const mf_param_table *t = r->t;
  const size_t ms = mf_dtype_size(r->hs.moments);
  mf_optim_tensor *ts = NULL;
  MF_CHECK(mf_calloc((size_t)(t->n ? t->n : 1), sizeof *ts, "optimizer tensors", (void **)&ts));
  for (int64_t i = 0; i < t->n; i++) {
    const mf_param *p = &t->params[i];
    if (p->frozen) { /* no gradient, no update: an empty entry */
      ts[i] = (mf_optim_tensor){NULL, NULL, NULL, NULL, 0, r->hs.moments, NULL};
      continue;
    }
    ts[i] = (mf_optim_tensor){r->w + p->offset,
                              (float *)r->hs.grads.ptr + p->toff,
                              (char *)r->hs.m.ptr + (size_t)p->toff * ms,
                              (char *)r->hs.v.ptr + (size_t)p->toff * ms,
                              (size_t)p->numel,
                              r->hs.moments,
                              r->tr.working ? r->tr.working + p->offset : NULL};
  }
  mf_status st = mf_optim_worker_create(ts, (int32_t)t->n, (int)r->cfg->train.threads, &r->wk);
  free(ts);
  MF_CHECK(st);
  MF_CHECK(mf_calloc((size_t)(t->n ? t->n : 1), 1, "gradient flags", (void **)&r->used));
  const mf_exec_param_hooks hooks = {r->wk, hook_wait, hook_grad_home, NULL};
  mf_exec_set_param_hooks(r->tr.exec, &hooks);
  return MF_OK;
}

/* A token file of the config (`key`: data.train or data.valid): opened,
 * checked, its vocabulary within the model's; an error names the key and
 * its place in the config (loader.h mf_loader_open). */
static mf_status open_data(const mf_config *cfg, const char *key, const char *path, mf_loader_mode mode,
                           uint64_t seed, const mf_param_table *t, mf_loader **out) {
  const mf_loader_origin o = {key, mf_config_where(cfg, key), cfg->model.has_init ? NULL : cfg->model.path};
  MF_CHECK(mf_loader_open(&o, path, cfg->data.seq_len, cfg->train.micro_batch, seed, mode, out));
  const mf_status st = mf_train_check_vocab(*out, t);
  if (st != MF_OK) mf_error_prefix("%s", key);
  return st;
}

/* The bf16 working copy from the master weights: all of them, or with
 * LoRA's base at home in bf16 (loaded there) the trained parameters'. */
static mf_status round_home(run *r) {
  uint16_t *buf = (uint16_t *)r->hs.working.ptr;
  if (r->hs.base_bf16) return mf_run_round_trained(&r->tr, r->t, r->w, buf);
  return mf_run_round_working(&r->tr, r->w, (size_t)r->t->total_numel, buf, r->pool);
}

/* What a checkpoint of the run holds (src/ckpt), its base's record with it. */
static mf_ckpt_data ckpt_data(const run *r) {
  mf_ckpt_data d = mf_train_ckpt_data(r->t, r->w, &r->hs, r->up.steps, r->routed, r->n_routed, r->base_sum);
  d.base_json = r->base_json;
  return d;
}

/* The base as loaded, before any step changed it: its identity (base.h), the
 * record every checkpoint and final/ carry, and what --resume checks a
 * checkpoint's against. */
static mf_status base_record(run *r) {
  const uint16_t *home = r->hs.base_bf16 ? (const uint16_t *)r->hs.working.ptr : NULL;
  mf_base_id b;
  MF_CHECK(mf_run_base_id(r->cfg, r->t, r->w, home, home != NULL, r->pool, &b));
  const mf_status st = mf_base_id_format(&b, &r->base_json);
  mf_base_id_free(&b);
  return st;
}

/* --resume: the checkpoint's state into the run's buffers and loader; the
 * bf16 working copy rounded again from the master weights; the executor's
 * device copies of device-optimized state marked stale. */
static mf_status resume(run *r, mf_train_summary *out) {
  char *dir = r->resume_path;
  const mf_ckpt_data d = ckpt_data(r);
  MF_CHECK(mf_train_ckpt_load(r->cfg, r->resume_dir, &d, r->train, out, dir, sizeof r->resume_path, &r->first_step));
  r->resume_dir = dir;
  snprintf(out->checkpoint_dir, sizeof out->checkpoint_dir, "%s", dir);
  MF_CHECK(round_home(r));
  mf_exec_invalidate(r->tr.exec);
  if (!r->quiet) MF_LOGI("train", "resumed from %s (step %lld)", dir, (long long)r->first_step);
  return MF_OK;
}

/* --resume with several ranks: the node's first rank reads the checkpoint
 * into the node's shared state (resume above); what each rank keeps of its
 * own — the AdamW step counts, the routing counts, the loader's position and
 * the run's counts so far — it sends the node's other ranks. Every node's
 * first rank reads it (a directory all nodes see). */
static mf_status resume_node(run *r, mf_train_summary *out) {
  typedef struct carried {
    int64_t first_step, steps, skipped;
    double first_loss;
    mf_loader_state ls;
    char dir[sizeof r->resume_path];
  } carried;
  carried c;
  memset(&c, 0, sizeof c);
  if (r->rk.lrank == 0) {
    MF_CHECK(resume(r, out));
    c.first_step = r->first_step;
    c.steps = out->steps;
    c.skipped = out->skipped;
    c.first_loss = out->first_loss;
    mf_loader_get_state(r->train, &c.ls);
    snprintf(c.dir, sizeof c.dir, "%s", r->resume_path);
  }
  mf_comm *comm = r->rk.comm;
  MF_CHECK(mf_comm_node_broadcast(comm, &c, sizeof c));
  MF_CHECK(mf_comm_node_broadcast(comm, r->up.steps, (size_t)r->t->n * sizeof(int64_t)));
  MF_CHECK(mf_comm_node_broadcast(comm, r->routed, r->n_routed * sizeof(int64_t)));
  if (r->rk.lrank == 0) return MF_OK;
  r->first_step = c.first_step;
  out->steps = c.steps;
  out->skipped = c.skipped;
  out->first_loss = c.first_loss;
  MF_CHECK(mf_loader_set_state(r->train, &c.ls));
  snprintf(r->resume_path, sizeof r->resume_path, "%s", c.dir);
  r->resume_dir = r->resume_path;
  snprintf(out->checkpoint_dir, sizeof out->checkpoint_dir, "%s", c.dir);
  mf_exec_invalidate(r->tr.exec);
  return MF_OK;
}

/* output.checkpoint_async: the writer thread and its snapshot, when the run
 * has checkpoints before its last step. */
static mf_status ckpt_async_setup(run *r) {
  const mf_config *cfg = r->cfg;
  const mf_config_ckpt_async mode = cfg->output.checkpoint_async;
  const int64_t every = cfg->output.checkpoint_every;
  if (mode == MF_CONFIG_CKPT_ASYNC_OFF || every <= 0 || every >= cfg->train.steps) return MF_OK;
  const size_t bytes = mf_ckpt_async_bytes(r->t, r->hs.moments, r->n_routed);
  if (mode == MF_CONFIG_CKPT_ASYNC_AUTO) {
    char src[256] = "", b1[32], b2[32];
    const uint64_t avail = mf_hostbuf_machine_memory(1, src, sizeof src);
    if (avail == 0 || (uint64_t)bytes > avail / 2) {
      if (!r->quiet)
        MF_LOGI(
            "train",
            "checkpoints: written with training paused: a snapshot to write them beside training takes %s, "
            "more than half of the %s available (%s); output.checkpoint_async=true takes it anyway",
            mf_format_bytes((uint64_t)bytes, b1, sizeof b1), mf_format_bytes(avail, b2, sizeof b2),
            src[0] ? src : "unknown");
      return MF_OK;
    }
  }
  return mf_ckpt_async_create(r->ckw, r->t, r->hs.moments, r->n_routed, &r->cka);
}

static int64_t ranks_of(const run *r) {
  return r->multi ? r->rk.size : 1;
}

/* train.threads, or all online CPUs shared among the node's ranks. */
static int threads_of(const run *r) {
  if (r->cfg->train.threads > 0 || !r->multi) return (int)r->cfg->train.threads;
  const long cores = sysconf(_SC_NPROCESSORS_ONLN);
  const long per = cores > 0 ? cores / r->rk.lsize : 1;
  return (int)(per > 0 ? per : 1);
}

/* Several ranks: the node's one copy of the host state in shared memory, the
 * weights read or initialised into it by the node's first rank (a quantized
 * base into the node's one quantized home), its bf16 working copy rounded by
 * it too; every rank then uploads from there. */
static mf_status node_state(run *r) {
  const mf_config *cfg = r->cfg;
  const mf_param_table *t = r->t;
  const mf_run_plan *rp = r->tr.rp;
  size_t bytes = 0;
  MF_CHECK(mf_host_state_node_bytes(cfg, t, rp, &bytes)); /* before anything large is allocated */
  MF_CHECK(mf_ranks_share(&r->rk, t, bytes, rp->prog->norm_first, rp->prog->norm_chunks));
  if (r->rk.qhome) mf_param_table_borrow_qhome(r->tr.t, (uint8_t *)mf_comm_shared_ptr(r->rk.qhome));
  mf_host_state_init_node(&r->hs, cfg, t, rp, mf_comm_shared_ptr(r->rk.home), &r->w);
  r->w_owned = 0;
  const size_t n = (size_t)t->total_numel;
  if (r->rk.lrank == 0) {
    float *w = NULL;
    MF_CHECK(mf_run_load_weights(cfg, NULL, t, r->pool, &w, r->desc, sizeof r->desc));
    if (n) memcpy(r->w, w, n * sizeof(float));
    free(w);
  }
  MF_CHECK(mf_run_round_working(&r->tr, r->w, r->rk.lrank == 0 ? n : 0, (uint16_t *)r->hs.working.ptr,
                                   r->pool));
  return mf_comm_node_barrier(r->rk.comm);
}

/* The data, the plan (written to OUTPUT/plan.json before the backend is
 * created), the executors, the weights, the host state and the optimizer.
 * Everything that can refuse the run comes before anything large is
 * allocated: the config (already checked whole), the model's shape, the
 * token files, the plan's limits and this machine's memory (the run
 * admits the plan before it creates the device arena), and only then the
 * arenas, the weights and the host state. */
static mf_status setup(run *r, mf_train_summary *out) {
  const mf_config *cfg = r->cfg;
  MF_CHECK(mf_threadpool_create(threads_of(r), &r->pool));
  /* LoRA on hot experts resumes on the checkpoint's hot set, not on routing
   * measured since: the checkpoint is found here, once, and resumed from */
  const char *hot_ckpt = NULL;
  if (r->resume && cfg->train.lora.rank > 0 && cfg->train.lora.experts == MF_CONFIG_LORA_EXPERTS_HOT) {
    if (!r->resume_dir) {
      MF_CHECK(mf_ckpt_find_latest(cfg->output.dir, r->resume_found, sizeof r->resume_found));
      r->resume_dir = r->resume_found;
    }
    hot_ckpt = r->resume_dir;
  }
  mf_run_opts ro = {.use = MF_RUN_TRAIN, .upto = MF_RUN_TABLE, .ckpt = hot_ckpt, .pool = r->pool, .node_home = r->multi};
  MF_CHECK(mf_run_open(cfg, &ro, &r->tr));
  r->t = r->tr.t;
  const mf_param_table *t = r->t;
  if (r->multi) MF_CHECK(mf_ranks_init(&r->rk, t, cfg->train.micro_batch, cfg->data.seq_len));
  MF_CHECK(open_data(cfg, "data.train", cfg->data.train, MF_LOADER_TRAIN, cfg->train.seed, t, &r->train));
  if (cfg->data.valid && r->rank0) /* rank 0 evaluates for all */
    MF_CHECK(open_data(cfg, "data.valid", cfg->data.valid, MF_LOADER_EVAL, 0, t, &r->valid));
  if (r->rank0) MF_CHECK(mf_mkdir_p(cfg->output.dir));
  char plan_json[4200];
  snprintf(plan_json, sizeof plan_json, "%s/plan.json", cfg->output.dir);
  /* Rank 0 first: a hardware profile it measures (cuda, hardware.profile
   * auto) is there when the others plan. */
  if (r->multi && !r->rank0) MF_CHECK(mf_comm_barrier_solo(r->rk.comm, 0, "planning"));
  ro.upto = MF_RUN_EXECUTOR;
  ro.plan_json = r->rank0 ? plan_json : NULL;
  MF_CHECK(mf_run_open(cfg, &ro, &r->tr));
  if (r->multi && r->rank0) MF_CHECK(mf_comm_barrier_solo(r->rk.comm, 0, "planning"));
  /* The evaluation plans with the routing the training plan used: a routing
   * file passed over (measured on another model) is passed over again without
   * a second note. */
  r->ev_cfg = *cfg;
  if (r->tr.rp->routing_note[0]) r->ev_cfg.memory.routing_kind = MF_CONFIG_ROUTING_NONE;
  /* inside the training's backend and arena: the device holds one arena */
  const mf_run_opts eo = {
      .use = MF_RUN_EVAL, .upto = MF_RUN_EXECUTOR, .table = r->tr.t, .inside = &r->tr, .node_home = r->multi};
  if (r->valid) MF_CHECK(mf_run_open(&r->ev_cfg, &eo, &r->ev));
  /* A pass over the corpus: after the checks that can refuse the run. */
  if (r->rank0) MF_CHECK(corpus_entropy(cfg->data.train, &out->entropy_nats));
  /* The weights last: a run that cannot start (no GPU, a plan over a limit)
   * says so before a large model is read or initialised. */
  const mf_run_plan *rp = r->tr.rp;
  if (r->multi) {
    MF_CHECK(node_state(r));
  } else if (mf_lora_base_bf16(t, rp->storage, rp->prog->ranks)) { /* as host.c decides */
    /* LoRA's frozen base loaded straight into the bf16 working copy, its fp32
     * never whole in memory; the trained parameters into the master weights */
    MF_CHECK(mf_host_state_init(&r->hs, cfg, t, rp, &r->w, &r->w_owned, r->quiet));
    uint16_t *working = (uint16_t *)r->hs.working.ptr;
    MF_CHECK(mf_run_load_weights_home(cfg, NULL, t, r->w, working, r->pool, r->desc, sizeof r->desc));
    MF_CHECK(round_home(r));
  } else {
    MF_CHECK(mf_run_load_weights(cfg, NULL, t, r->pool, &r->w, r->desc, sizeof r->desc));
    MF_CHECK(mf_host_state_init(&r->hs, cfg, t, rp, &r->w, &r->w_owned, r->quiet));
    MF_CHECK(round_home(r));
  }
  if (!r->multi) MF_CHECK(mf_run_pin_home(&r->tr, MF_HOME_GRADS, r->hs.grads.ptr, r->hs.grads.bytes));
  if (r->valid) mf_run_share_working(&r->ev, &r->tr);
  if (t->lora_a)
    r->base_sum = mf_ckpt_base_sum(t, r->w, r->hs.base_bf16 ? (const uint16_t *)r->hs.working.ptr : NULL);
  if (r->rank0 || (r->resume && r->rk.lrank == 0)) MF_CHECK(base_record(r)); /* the writer, and who resumes */
  if (t->lora_a && t->lora.dropout > 0) {
    MF_CHECK(mf_calloc((size_t)r->tr.G, sizeof(uint64_t), "dropout seeds", (void **)&r->drop_seeds));
    mf_exec_set_dropout_seeds(r->tr.exec, r->drop_seeds);
  }
  const uint8_t *on_device = rp->plan->s->n_optim_device > 0 ? rp->plan->s->optim_device : NULL;
  MF_CHECK(mf_updates_init(&r->up, t, on_device, mf_exec_param_upload_order(r->tr.exec)));
  MF_CHECK(mf_calloc((size_t)(t->n ? t->n : 1), sizeof(mf_optim_buf), "gradient list", (void **)&r->bufs));
  if (on_device) {
    mf_exec_set_optim_state(r->tr.exec, r->hs.m.ptr, r->hs.v.ptr);
    MF_CHECK(mf_calloc((size_t)(t->n ? t->n : 1), sizeof(double *), "norm sums", (void **)&r->ext_sums));
  }
  MF_CHECK(mf_calloc((size_t)(cfg->train.steps > 0 ? cfg->train.steps : 1), sizeof(double), "step times",
                     (void **)&r->step_wall));
  r->n_routed = (size_t)(t->spec.layers * (t->spec.experts > 0 ? t->spec.experts : 1));
  MF_CHECK(mf_calloc(r->n_routed, sizeof(int64_t), "routing counts", (void **)&r->routed));
  if (rp->overlap_optimizer) MF_CHECK(worker_create(r));
  r->tokens_per_step = cfg->train.micro_batch * cfg->data.seq_len * cfg->train.grad_accum * ranks_of(r);
  if (r->multi) MF_CHECK(mf_ranks_hooks(&r->rk, r->tr.exec, rp->prog));
  if (rp->prog->exchanges) {
    if (!r->comm) return MF_ERR(MF_ERR_INVALID_ARG, "train: expert parallelism's exchanges need a comm");
    MF_CHECK(mf_ep_attach(&r->ep, r->comm, rp->prog, r->tr.exec, r->tr.backend, cfg->device));
  }
  if (r->rank0) { /* rank 0 writes the checkpoints and the metrics */
    MF_CHECK(mf_ckpt_writer_create(cfg, &r->ckw));
    MF_CHECK(ckpt_async_setup(r));
  }
  if (r->resume) MF_CHECK(r->multi ? resume_node(r, out) : resume(r, out));
  if (!r->rank0) return MF_OK;
  MF_CHECK(mf_metrics_open(cfg->output.dir, r->resume, &r->metrics));
  if (r->resume) {
    MF_CHECK(mf_metrics_rewind(r->metrics, r->first_step));
    MF_CHECK(mf_metrics_write_resume(r->metrics, r->resume_path, r->first_step));
  }
  return MF_OK;
}

/* The start-up lines: model, data, step, plan, staged copies. */
static void log_start(const run *r, const mf_train_summary *out) {
  const mf_config *cfg = r->cfg;
  const mf_param_table *t = r->t;
  const mf_run_plan *rp = r->tr.rp;
  const mf_plan *pl = rp->plan;
  int64_t total = 0, active = 0;
  mf_model_spec_param_count(&t->spec, &total, &active);
  char b1[32], b2[32], b3[32], b4[32], b5[32], n1[32], n2[32];
  MF_LOGI("train", "model: %s, %s: %s parameters (%s active per token), %lld layers, %lld experts top-%lld",
          mf_family_name(t->spec.family), r->desc, mf_format_count((double)total, n1, sizeof n1),
          mf_format_count((double)active, n2, sizeof n2), (long long)t->spec.layers, (long long)t->spec.experts,
          (long long)t->spec.top_k);
  if (t->lora_a) {
    char lora[512];
    mf_lora_describe(t, lora, sizeof lora);
    MF_LOGI("train", "%s", lora);
  }
  MF_LOGI("train",
          "data: %s: %llu windows of %lld tokens; unigram entropy %.4f nats/token (a model that ignores context "
          "scores this)",
          cfg->data.train, (unsigned long long)mf_loader_windows(r->train), (long long)cfg->data.seq_len,
          out->entropy_nats);
  char ranks[200] = "";
  if (r->multi) {
    const int64_t ep = rp->prog->ep, E = rp->prog->spec.experts;
    char experts[120] = "", by[48] = "";
    if (r->ep.nccl) snprintf(by, sizeof by, ", rows by %s", mf_nccl_version(r->ep.nccl));
    if (ep > 1 && r->rk.size > ep)
      snprintf(experts, sizeof experts, ", experts over groups of %lld (%lld of %lld a rank%s), %lld groups",
               (long long)ep, (long long)(E / ep), (long long)E, by, (long long)(r->rk.size / ep));
    else if (ep > 1)
      snprintf(experts, sizeof experts, ", experts over %lld (%lld of %lld a rank%s)", (long long)ep,
               (long long)(E / ep), (long long)E, by);
    snprintf(ranks, sizeof ranks, "%d ranks (%d node%s)%s x ", r->rk.size, mf_comm_nodes(r->rk.comm),
             mf_comm_nodes(r->rk.comm) == 1 ? "" : "s", experts);
  } else if (rp->prog->exchanges) {
    snprintf(ranks, sizeof ranks, "1 rank exchanging its experts' rows with itself%s%s (MF_TEST_EP_SELF) x ",
             r->ep.nccl ? " by " : "", r->ep.nccl ? mf_nccl_version(r->ep.nccl) : "");
  }
  MF_LOGI("train",
          "step: %s%lld x %lld sequences of %lld tokens = %lld tokens; %d threads%s; %s backend, %s storage "
          "(train.precision), device arena %s, %d ops, %s FLOP/step",
          ranks, (long long)cfg->train.grad_accum, (long long)cfg->train.micro_batch,
          (long long)cfg->data.seq_len, (long long)r->tokens_per_step, mf_threadpool_size(r->pool),
          r->multi ? " a rank" : "", r->tr.backend->name, mf_dtype_name(rp->storage),
          mf_format_bytes(mf_exec_arena_bytes(r->tr.exec), b1, sizeof b1), rp->prog->n_ops,
          mf_format_count(rp->prog->flops, n1, sizeof n1));
  if (rp->routed)
    MF_LOGI("train", "planning with the routing measured in %s (%llu tokens)", rp->routing_path,
            (unsigned long long)rp->routing.tokens);
  int wr = 0, ws = 0, gd = 0, gs = 0, ak = 0, ao = 0, ar = 0, trained = 0;
  for (int32_t i = 0; i < pl->d->n_params; i++) {
    if (!mf_program_holds_param(rp->prog, i)) continue; /* another expert-parallel rank's expert */
    pl->d->param[i] == MF_PARAM_RESIDENT ? wr++ : ws++;
    if (r->t->params[i].frozen) continue; /* LoRA's base: no gradient, no optimizer */
    pl->d->grad[i] == MF_GRAD_DEVICE ? gd++ : gs++;
    trained++;
  }
  for (int32_t x = 0; x < rp->prog->n_tensors; x++)
    if (mf_schedule_can_offload(rp->prog, x))
      pl->d->act[x] == MF_ACT_KEEP ? ak++ : pl->d->act[x] == MF_ACT_OFFLOAD ? ao++ : ar++;
  MF_LOGI(
      "train",
      "plan: %s, arena %s (peak %s), predicted %.4g s/step (%s tokens/s); device budget %s (%s); weights %d "
      "resident / %d streamed; gradients %d on the device / %d streamed; activations %d kept / %d "
      "offloaded / %d recomputed; optimizer %d on the device / %d on the host; %s up and %s home per step; "
      "%s order; plan.json in %s",
      pl->name, mf_format_bytes(pl->s->arena_bytes, b2, sizeof b2),
      mf_format_bytes(pl->s->peak_live_bytes, b3, sizeof b3), pl->sim.step_seconds,
      mf_format_count((double)r->tokens_per_step / pl->sim.step_seconds, n2, sizeof n2),
      mf_format_bytes(rp->budget, b1, sizeof b1), rp->budget_source, wr, ws, gd, gs, ak, ao, ar,
      pl->s->n_optim_device, trained - pl->s->n_optim_device,
      mf_format_bytes(pl->s->h2d_bytes, b4, sizeof b4), mf_format_bytes(pl->s->d2h_bytes, b5, sizeof b5),
      mf_program_order_name(rp->prog->order), cfg->output.dir);
  if (rp->home.n_direct > 0) {
    const mf_pinned_home *h = &rp->home;
    char list[160] = "";
    for (int k = 0; k < MF_HOME_REGIONS_; k++)
      if (h->pinned[k])
        snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s %s%s", list[0] ? ", " : "",
                 mf_home_region_name((mf_home_region)k), mf_format_bytes(h->pin_hi[k] - h->pin_lo[k], b1, sizeof b1),
                 h->pin_hi[k] - h->pin_lo[k] < h->hi[k] - h->lo[k] ? " (part)" : "");
    MF_LOGI("train", "pinned home: %s (%s); %d copies a step straight from or into it",
            mf_format_bytes(h->bytes, b2, sizeof b2), list, h->n_direct);
  }
  if (rp->staging) {
    const mf_staging *sg = rp->staging;
    MF_LOGI("train",
            "copies staged: %s of pinned memory in %d exact-size slabs (%s for uploads, %s for copies home), %d "
            "host thread%s each way",
            mf_format_bytes(sg->arena_bytes, b1, sizeof b1), sg->n_slabs,
            mf_format_bytes(sg->h2d_region_bytes, b2, sizeof b2),
            mf_format_bytes(sg->arena_bytes - sg->h2d_region_bytes, b3, sizeof b3), r->tr.staging_threads,
            r->tr.staging_threads == 1 ? "" : "s");
  }
}

/* The global norm over every gradient, in parameter order, the device's chunk
 * sums in their places (the same bits wherever each was computed), then the
 * clip factor; without the worker, the host's gradients are clipped here. */
static mf_status clip(run *r, double *norm, double *coef) {
  const mf_param_table *t = r->t;
  const int64_t *tokens = r->tokens;
  float *g = (float *)r->hs.grads.ptr;
  if (r->multi) {
    MF_CHECK(mf_ranks_norm(&r->rk, t, g, tokens, r->pool, norm));
    *coef = mf_optim_clip_coef(*norm, r->cfg->train.grad_clip);
    if (*coef < 1.0) MF_CHECK(mf_ranks_scale(&r->rk, t, g, tokens, *coef, r->pool));
    return MF_OK;
  }
  for (int64_t i = 0; i < t->n; i++) {
    const mf_param *p = &t->params[i];
    const int has = mf_updates_has_gradient(t, tokens, i);
    const int dev = r->up.on_device && r->up.on_device[i]; /* its gradient stayed on the device */
    r->bufs[i] = (mf_optim_buf){has && !dev ? g + p->toff : NULL, has ? (size_t)p->numel : 0};
    if (r->ext_sums) r->ext_sums[i] = dev ? mf_exec_norm_sums(r->tr.exec) + r->tr.rp->prog->norm_first[i] : NULL;
  }
  if (r->wk) {
    for (int64_t i = 0; i < t->n; i++) r->used[i] = r->bufs[i].n > 0;
    MF_CHECK(mf_optim_worker_norm_ext(r->wk, r->used, r->ext_sums, norm));
    *coef = mf_optim_clip_coef(*norm, r->cfg->train.grad_clip);
    return MF_OK;
  }
  MF_CHECK(mf_optim_grad_norm_ext(r->bufs, (size_t)t->n, r->ext_sums, r->pool, norm));
  *coef = mf_optim_clip_coef(*norm, r->cfg->train.grad_clip);
  if (*coef < 1.0) MF_CHECK(mf_optim_grad_scale(r->bufs, (size_t)t->n, *coef, r->pool));
  return MF_OK;
}

/* Three words into one well-mixed seed (splitmix64 over each in turn). */
static uint64_t mix3(uint64_t a, uint64_t b, uint64_t c) {
  uint64_t x = a;
  x = mf_splitmix64(&x) ^ b;
  x = mf_splitmix64(&x) ^ c;
  return mf_splitmix64(&x);
}

/* MF_INJECT_FAIL=RANK:STEP: rank RANK fails at the start of step STEP (the
 * test of a failing rank ending the job; tests/train/ranks_test). */
static mf_status injected_failure(const run *r, int64_t step) {
  int64_t at[2]; /* RANK, STEP: a test build's (src/core/env.h) */
  if (!mf_env_pair(MF_ENV_INJECT_FAIL, at)) return MF_OK;
  if (at[0] != (r->multi ? r->rk.rank : 0) || at[1] != step) return MF_OK;
  return MF_ERR(MF_ERR_INTERNAL, "step %lld: the failure MF_INJECT_FAIL=%s asked for", (long long)step,
                mf_env_string(MF_ENV_INJECT_FAIL));
}

/* One optimizer step: the batches, the executor's forward and backward, the
 * norm and clipping, the updates (or the skip of a non-finite step). */
static mf_status step_once(run *r, int64_t step, mf_train_summary *out, mf_step_metrics *sm) {
  const mf_config *cfg = r->cfg;
  const double t0 = mf_time_now();
  mf_run *tr = &r->tr;
  MF_CHECK(injected_failure(r, step));
  if (r->multi) {
    MF_CHECK(mf_ranks_next_batches(&r->rk, r->train, tr->G, tr->ids, tr->targets));
    mf_ranks_begin(&r->rk, step, (float *)r->hs.grads.ptr);
  } else {
    for (int64_t m = 0; m < tr->G; m++)
      MF_CHECK(mf_loader_next(r->train, tr->ids[m], tr->targets[m], NULL, NULL));
  }
  /* LoRA's adapter dropout: the masks of micro-batch m are a function of
   * (train.seed, step, its index among the step's micro-batches of all ranks),
   * so any number of ranks, a resumed run and a recomputed op draw the same */
  for (int64_t m = 0; r->drop_seeds && m < tr->G; m++) {
    const uint64_t g = r->multi ? (uint64_t)(r->rk.rank + m * r->rk.size) : (uint64_t)m;
    r->drop_seeds[m] = mix3(cfg->train.seed, (uint64_t)step, g);
  }
  mf_step_result sr;
  MF_CHECK(mf_exec_step(tr->exec, r->w, (const int32_t *const *)tr->ids, (const int32_t *const *)tr->targets,
                        (float *)r->hs.grads.ptr, &sr));
  r->tokens = mf_exec_expert_tokens(tr->exec);
  if (r->multi) {
    MF_CHECK(mf_ranks_reduce(&r->rk, (float *)r->hs.grads.ptr, (size_t)r->t->trainable_numel, &sr, r->tokens,
                             r->n_routed, tr->rp->prog->aux_coef));
    r->tokens = r->rk.tokens;
  }
  /* Every input token is routed, masked targets too: B*S*G tokens a step. */
  const int64_t *tokens = r->tokens;
  for (size_t i = 0; i < r->n_routed; i++) r->routed[i] += tokens[i];
  double norm = 0, coef = 1;
  const double opt_t0 = mf_time_now();
  MF_CHECK(clip(r, &norm, &coef));
  const double lr = mf_lr_at(&cfg->train, step);
  const int skip = !isfinite(norm) || !isfinite(sr.loss);
  if (skip) {
    out->skipped++;
    MF_LOGW("train",
            "step %lld: non-finite gradients or loss (loss %g, |g| %g): step skipped, weights and optimizer state "
            "unchanged",
            (long long)step, sr.loss, norm);
  } else {
    mf_updates_plan(&r->up, tokens, &cfg->train, lr);
    if (r->wk)
      MF_CHECK(mf_optim_worker_update(r->wk, r->up.host, r->up.n_host, coef));
    else if (r->multi)
      MF_CHECK(mf_updates_run_host_shard(&r->up, r->w, r->tr.working, (float *)r->hs.grads.ptr, &r->hs,
                                         r->pool, r->rk.own_lo, r->rk.own_hi));
    else
      MF_CHECK(mf_updates_run_host(&r->up, r->w, r->tr.working, (float *)r->hs.grads.ptr, &r->hs, r->pool));
    MF_CHECK(mf_updates_run_device(&r->up, tr->exec, coef));
  }
  if (r->multi) MF_CHECK(mf_ranks_updated(&r->rk)); /* the weights whole before the next uploads */
  if (!r->wk) r->win.opt_exposed += mf_time_now() - opt_t0;
  r->step_wall[step - 1] = mf_time_now() - t0;
  mf_exec_stats xs;
  mf_exec_stats_get(tr->exec, &xs);
  mf_window_add(&r->win, &sr, &xs);
  if (step == 1) out->first_loss = sr.loss;
  out->steps = step;
  mf_step_metrics_init(sm);
  sm->step = step;
  sm->loss = sr.loss;
  sm->ce_loss = sr.ce_loss;
  sm->aux_loss = sr.aux_loss;
  sm->lr = lr;
  sm->grad_norm = norm;
  sm->skipped = skip;
  return MF_OK;
}

/* Training paused since t (not training: out of tokens/s, step_s and the
 * ETA), the seconds added to *total; returns them. */
static double paused_since(run *r, double t, double *total) {
  const double dt = mf_time_now() - t;
  mf_window_exclude(&r->win, dt);
  *total += dt;
  return dt;
}

/* Every update done and, for a checkpoint, the device-optimized parameters'
 * moments home too; the device's weights home (an evaluation reads them). */
static mf_status settle(run *r, int for_ckpt, int for_eval, mf_train_summary *out) {
  if (r->wk) MF_CHECK(mf_optim_worker_wait_all(r->wk));
  if (r->up.on_device) {
    /* Not training (the optimizer's wait above is the step's own work, so it
     * stays in). The evaluation runs in the training arena: the AdamW state
     * kept there goes home too, as for a checkpoint. */
    const double t = mf_time_now();
    MF_CHECK(mf_exec_sync_home(r->tr.exec, r->w, for_ckpt || for_eval));
    paused_since(r, t, for_ckpt ? &out->checkpoint_seconds : &out->eval_seconds);
  }
  return MF_OK;
}

/* Whether the run stops after `step` short of train.steps: a stop request
 * (SIGINT, SIGTERM), or more skipped steps than train.max_skipped_steps. */
static int stop_due(const run *r, int64_t step, const mf_train_summary *out, const mf_step_metrics *sm) {
  const int64_t max = r->cfg->train.max_skipped_steps;
  if (max > 0 && sm->skipped && out->skipped > max) return -1;
  return step < r->cfg->train.steps ? mf_stop_requested() : 0;
}

/* A checkpoint that cannot be written stops the run: its error (naming the
 * file) with the last complete checkpoint, which is kept. */
static mf_status save_failed(mf_status st, int64_t step, const mf_train_summary *out) {
  if (out->checkpoint_dir[0])
    mf_error_prefix("step %lld: checkpoint not written, training stopped (%s, the last complete checkpoint, is "
                    "kept: resume from it with --resume)", (long long)step, out->checkpoint_dir);
  else
    mf_error_prefix("step %lld: checkpoint not written, training stopped (no complete checkpoint yet)",
                    (long long)step);
  return st;
}

static mf_status async_land(run *r, int block, mf_train_summary *out, mf_step_metrics *sm, int *landed);

/* The checkpoint of `step` but its COMPLETE marker (commit, after the step's
 * metrics line). */
static mf_status save(run *r, int64_t step, mf_train_summary *out, mf_step_metrics *sm) {
  const double t = mf_time_now();
  /* One written beside training lands first (its figures only on stderr:
   * this step's line has this checkpoint's). */
  MF_CHECK(async_land(r, 1, out, NULL, NULL));
  const mf_ckpt_data d = ckpt_data(r);
  const mf_status st = mf_train_ckpt_save(r->ckw, &d, r->train, r->cfg, step, out, r->quiet, sm, r->pending,
                                          sizeof r->pending);
  if (st != MF_OK) return save_failed(st, step, out);
  /* The training paused for it (written synchronously): the whole call, not
   * only the files' writing that checkpoint_s reports. */
  paused_since(r, t, &out->checkpoint_seconds);
  return MF_OK;
}

/* COMPLETE on the checkpoint save wrote: from now on resume may take it. */
static mf_status commit(run *r, int64_t step, mf_train_summary *out) {
  const mf_status st = mf_ckpt_commit(r->ckw, step);
  if (st != MF_OK) return save_failed(st, step, out);
  snprintf(out->checkpoint_dir, sizeof out->checkpoint_dir, "%s", r->pending);
  return MF_OK;
}

/* The checkpoint written beside training, once its files are written (block:
 * waiting for them): COMPLETE (its step's metrics line is out: it was
 * written at that step), its line on stderr, and its bytes and write time
 * into sm (NULL: not reported) — or its error, which stops the run. *landed: 1
 * when one was committed. */
static mf_status async_land(run *r, int block, mf_train_summary *out, mf_step_metrics *sm, int *landed) {
  if (landed) *landed = 0;
  mf_ckpt_async_result a;
  if (!r->cka || !mf_ckpt_async_wait(r->cka, block, &a)) return MF_OK;
  if (a.st != MF_OK) return save_failed(MF_ERR(a.st, "%s", a.err), a.step, out);
  snprintf(r->pending, sizeof r->pending, "%s", a.stats.dir);
  MF_CHECK(commit(r, a.step, out));
  if (!r->quiet) mf_train_ckpt_log(&a.stats, r->cka_paused);
  if (sm) {
    sm->checkpoint_bytes = (double)a.stats.bytes;
    sm->checkpoint_write_s = a.stats.seconds;
  }
  if (landed) *landed = 1;
  return MF_OK;
}

/* The checkpoint of `step` written beside training: the write before it
 * landed first (waited for), then the snapshot taken and handed to the
 * writer; training pauses for those two only. */
static mf_status save_async(run *r, int64_t step, mf_train_summary *out, mf_step_metrics *sm) {
  const double t = mf_time_now();
  MF_CHECK(async_land(r, 1, out, sm, NULL)); /* its figures on this step's line */
  const mf_ckpt_data d = ckpt_data(r);
  const mf_ckpt_state s = mf_train_ckpt_state(r->train, r->cfg, step, out);
  MF_CHECK(mf_ckpt_async_start(r->cka, &d, &s, r->pool));
  sm->checkpoint_s = r->cka_paused = paused_since(r, t, &out->checkpoint_seconds);
  return MF_OK;
}

/* After step `step`: the evaluation when due (every update and the device's
 * weights home first), the checkpoint when due or when the run stops here
 * (r->stop), the progress line when due (always with a checkpoint), then the
 * checkpoint's COMPLETE. */
static mf_status after_step(run *r, int64_t step, mf_train_summary *out, mf_step_metrics *sm) {
  const mf_config *cfg = r->cfg;
  const int last = step == cfg->train.steps;
  const int eval_due =
      cfg->data.valid && (last || (cfg->train.eval_every > 0 && step % cfg->train.eval_every == 0));
  const int eval_now = r->valid && eval_due; /* with several ranks, rank 0's */
  const int64_t every = cfg->output.checkpoint_every;
  r->stop = stop_due(r, step, out, sm);
  if (r->multi) { /* a signal reaches the ranks at different moments: all stop after the same step */
    int64_t stop = r->stop;
    MF_CHECK(mf_comm_allreduce_max_i64(r->rk.comm, &stop, 1));
    r->stop = (int)stop;
  }
  int ckpt_now = last || (every > 0 && step % every == 0) || r->stop, landed = 0;
  MF_CHECK(async_land(r, 0, out, sm, &landed)); /* a checkpoint written beside training that is done */
  if (eval_now || ckpt_now) MF_CHECK(settle(r, ckpt_now, eval_now, out));
  if (r->wk) {
    double busy, waited;
    mf_optim_worker_stats(r->wk, &busy, &waited);
    mf_window_add_worker(&r->win, busy, waited);
  }
  if (eval_now) {
    /* The two take turns in the one arena (mf_run_open inside): each
     * fills its persistent slots again from home when it runs next. */
    mf_exec_invalidate(r->ev.exec);
    mf_exec_invalidate(r->tr.exec);
    mf_eval_result er;
    MF_CHECK(mf_run_eval_pass(&r->ev, r->valid, r->w, !r->quiet, &er, NULL));
    sm->eval_loss = er.stopped ? NAN : er.loss; /* a pass cut short is no validation loss */
    sm->eval_s = er.seconds;
    if (!er.stopped) out->valid_loss = er.loss;
    out->eval_seconds += er.seconds;
    mf_window_exclude(&r->win, er.seconds); /* not training: out of tokens/s, step_s and the ETA */
    if (!r->multi && !r->stop && (r->stop = stop_due(r, step, out, sm)) != 0 && !ckpt_now) {
      ckpt_now = 1; /* a signal during the evaluation */
      MF_CHECK(settle(r, 1, 0, out));
    }
  }
  /* Before the last step, and unless the run stops here, beside training. */
  const int async_now = ckpt_now && r->cka && !last && !r->stop;
  if (ckpt_now && r->rank0) MF_CHECK(async_now ? save_async(r, step, out, sm) : save(r, step, out, sm));
  if (r->rank0 && (last || step == 1 || step % cfg->train.log_every == 0 || eval_now || ckpt_now || landed)) {
    mf_exec_stats xs;
    mf_exec_stats_get(r->tr.exec, &xs);
    sm->elapsed_s = mf_time_now() - r->t_start;
    mf_step_metrics line;
    const int progress = r->quiet ? 0 : r->verbose ? 2 : 1;
    MF_CHECK(
        mf_window_flush(&r->win, r->metrics, sm, &xs, r->tokens_per_step, cfg->train.steps, progress, &line));
    out->final_loss = line.window_loss;
    out->final_loss_steps = line.window_steps;
  }
  /* After the step's line (see ckpt.h mf_ckpt_write_files); one written
   * beside training is committed when it lands (async_land). */
  if (ckpt_now && !async_now && r->rank0) MF_CHECK(commit(r, step, out));
  /* Rank 0 evaluated or wrote alone: the others wait here, not inside the
   * next step, for as long as rank 0 is at work (mf_comm_barrier_solo). */
  if (r->multi && (eval_due || ckpt_now))
    MF_CHECK(mf_comm_barrier_solo(r->rk.comm, 0, eval_due ? "evaluating" : "writing a checkpoint"));
  return MF_OK;
}

/* The run stopped after `step` (r->stop): by a signal, MF_OK with
 * out->stop_signal; by too many skipped steps, an error naming the key. */
static mf_status stopped(run *r, int64_t step, mf_train_summary *out) {
  out->seconds = mf_time_now() - r->t_start;
  if (r->stop < 0)
    return MF_ERR(MF_ERR_CONFIG,
                  "train.max_skipped_steps: %lld steps skipped for non-finite gradients or loss, more than the %lld "
                  "allowed (the last at step %lld): the run is diverging and stops; checkpoint %s. Lower train.lr (or "
                  "raise train.warmup, or lower train.grad_clip) and start again, or raise train.max_skipped_steps "
                  "(0: no limit) and resume with --resume",
                  (long long)out->skipped, (long long)r->cfg->train.max_skipped_steps, (long long)step,
                  out->checkpoint_dir);
  out->stop_signal = r->stop;
  char name[32];
  if (!r->quiet)
    MF_LOGI("train", "stopped by %s after step %lld of %lld: checkpoint %s",
            mf_stop_signal_name(r->stop, name, sizeof name), (long long)step, (long long)r->cfg->train.steps,
            out->checkpoint_dir);
  return MF_OK;
}

static int cmp_double(const void *a, const void *b) {
  const double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y ? 1 : 0;
}

/* The host memory this node's ranks hold (proportional set size: a page
 * shared by k processes counts 1/k in each), summed over the node's ranks,
 * into out and on stderr. */
static mf_status host_memory(run *r, mf_train_summary *out) {
  if (r->multi) MF_CHECK(mf_comm_node_barrier(r->rk.comm)); /* every rank alive and its state touched */
  int64_t pss = (int64_t)mf_ranks_process_pss();
  if (r->multi) MF_CHECK(mf_comm_allreduce_sum_i64(r->rk.comm, &pss, 1));
  out->host_pss_bytes = (uint64_t)pss / (uint64_t)(r->multi ? mf_comm_nodes(r->rk.comm) : 1);
  if (r->quiet || !out->host_pss_bytes) return MF_OK;
  char a[32], b[32];
  mf_format_bytes(out->host_pss_bytes, a, sizeof a);
  if (!r->multi) {
    MF_LOGI("train", "host memory: %s (Pss)", a);
    return MF_OK;
  }
  const mf_host_state *h = &r->hs;
  const size_t state = h->master.bytes + h->grads.bytes + h->m.bytes + h->v.bytes + h->working.bytes;
  MF_LOGI("train", "host memory: %s (Pss) a node, its %d rank%s together; the host state's %s in one copy %s",
          a, r->rk.lsize, r->rk.lsize == 1 ? "" : "s", mf_format_bytes(state, b, sizeof b),
          r->rk.lsize == 1 ? "a node" : "they share");
  return MF_OK;
}

/* Predicted vs executed, the final weights, the routing statistics. */
static mf_status finish(run *r, mf_train_summary *out) {
  const mf_config *cfg = r->cfg;
  out->seconds = mf_time_now() - r->t_start;
  const double train_s = out->seconds - out->eval_seconds - out->checkpoint_seconds;
  const int64_t ran = out->steps - r->first_step; /* by this process (after a resume, fewer) */
  out->tokens_per_s = (double)(ran * r->tokens_per_step) / (train_s > 0 ? train_s : 1e-9);
  /* The first step pays for cold caches and page faults: the median of the rest. */
  const int64_t n_rest = ran > 1 ? ran - 1 : ran;
  double *rest = r->step_wall + r->first_step + (ran > 1 ? 1 : 0);
  qsort(rest, (size_t)n_rest, sizeof(double), cmp_double);
  out->predicted_step_s = r->tr.rp->plan->sim.step_seconds;
  out->executed_step_s = n_rest > 0 ? rest[n_rest / 2] : NAN;
  if (!r->quiet && !r->multi)
    MF_LOGI("train", "predicted %.4g s/step, executed %.4g s/step (%.3f; median of steps %lld..%lld; profile %s)",
            out->predicted_step_s, out->executed_step_s, out->predicted_step_s / out->executed_step_s,
            (long long)(r->first_step + 2), (long long)out->steps, r->tr.rp->profile_path);
  MF_CHECK(host_memory(r, out));
  if (!r->rank0) return MF_OK;
  char final_dir[4200], routing_path[4200];
  snprintf(final_dir, sizeof final_dir, "%s/final", cfg->output.dir);
  /* The base's record first: an adapter dir is never there without it */
  MF_CHECK(mf_mkdir_p(final_dir));
  if (r->t->lora_a) {
    /* LoRA: the adapters, as PEFT saves them (moefit export merges them into
     * the base), then the record again with their files' checksums: one
     * without says the files may not be whole */
    MF_CHECK(mf_ckpt_adapter_record_write(final_dir, r->base_json, 0));
    MF_CHECK(mf_params_save_adapter_dir(r->t, r->w, cfg->model.has_init ? NULL : cfg->model.path, final_dir));
    MF_CHECK(mf_ckpt_adapter_record_write(final_dir, r->base_json, 1));
  } else {
    char base_path[4400];
    snprintf(base_path, sizeof base_path, "%s/%s", final_dir, MF_BASE_ID_FILE);
    MF_CHECK(mf_write_file_atomic(base_path, r->base_json, strlen(r->base_json)));
    MF_CHECK(mf_params_save_model_dir(r->t, r->w, final_dir));
  }
  const uint64_t routed_tokens = (uint64_t)out->steps * (uint64_t)r->tokens_per_step;
  snprintf(routing_path, sizeof routing_path, "%s/routing.json", cfg->output.dir);
  MF_CHECK(mf_routing_write(routing_path, &r->t->spec, r->routed, routed_tokens));
  if (r->quiet) return MF_OK;
  MF_LOGI("train", "routing: %s (%llu tokens)", routing_path, (unsigned long long)routed_tokens);
  /* Training time and evaluation time apart; the losses say which they are:
   * step 1's, then the mean of the last progress line's window. */
  char rate[32], evals[128] = "", last[64], steps[96];
  int ne = 0;
  /* This process's steps: after a resume, those since the checkpoint (the
   * seconds and tokens/s are theirs) */
  if (r->first_step > 0 && ran > 0)
    snprintf(steps, sizeof steps, "%lld steps (%lld-%lld)", (long long)ran, (long long)r->first_step + 1,
             (long long)out->steps);
  else if (r->first_step > 0)
    snprintf(steps, sizeof steps, "0 steps (resumed at step %lld of %lld)", (long long)r->first_step,
             (long long)cfg->train.steps);
  else
    snprintf(steps, sizeof steps, "%lld steps", (long long)ran);
  if (out->eval_seconds > 0) ne = snprintf(evals, sizeof evals, " + %.1f s of evaluation", out->eval_seconds);
  if (out->checkpoint_seconds > 0)
    snprintf(evals + ne, sizeof evals - (size_t)ne, " + %.1f s of checkpoints", out->checkpoint_seconds);
  if (out->final_loss_steps > 1)
    snprintf(last, sizeof last, "mean of steps %lld-%lld", (long long)(out->steps - out->final_loss_steps + 1),
             (long long)out->steps);
  else
    snprintf(last, sizeof last, "step %lld", (long long)out->steps);
  MF_LOGI(
      "train",
      "done: %s in %.1f s of training (%s tokens/s)%s; train loss %.4f -> %.4f nats/token (step 1 "
      "-> %s); unigram entropy %.4f%s",
      steps, train_s, mf_format_count(out->tokens_per_s, rate, sizeof rate), evals,
      out->first_loss, out->final_loss, last, out->entropy_nats, out->skipped ? " (some steps skipped)" : "");
  if (r->valid)
    MF_LOGI("train", "validation loss %.4f (perplexity %.2f) on %s", out->valid_loss, exp(out->valid_loss),
            cfg->data.valid);
  if (r->t->lora_a)
    MF_LOGI(
        "train",
        "adapters: %s (a PEFT adapter dir over %s; `moefit export %s --out DIR` merges them into an HF model "
        "dir); metrics: %s",
        final_dir, cfg->model.has_init ? "model.init's random base" : cfg->model.path, cfg->output.dir,
        mf_metrics_path(r->metrics));
  else
    MF_LOGI("train", "weights: %s (HF model dir); metrics: %s", final_dir, mf_metrics_path(r->metrics));
  return MF_OK;
}

static mf_status train_run(const mf_config *cfg, mf_comm *comm, int resume, const char *dir, int quiet,
                           mf_train_summary *out) {
  memset(out, 0, sizeof *out);
  out->valid_loss = NAN;
  out->predicted_step_s = out->executed_step_s = NAN;
  run r;
  memset(&r, 0, sizeof r);
  r.cfg = cfg;
  r.comm = comm;
  r.rank0 = 1;
  r.verbose = (quiet & MF_TRAIN_VERBOSE) != 0;
  quiet &= MF_TRAIN_QUIET;
  if (comm && mf_comm_size(comm) > 1) {
    r.multi = 1;
    r.cfg_ranks = *cfg;
    r.cfg_ranks.ranks = mf_comm_size(comm);
    r.cfg_ranks.node_ranks = mf_comm_local_size(comm);
    r.cfg_ranks.ep_rank = cfg->parallel.expert > 1 ? mf_comm_rank(comm) % cfg->parallel.expert : 0;
    /* groups lie within a node (the owners chain through its home), or one group is every rank */
    r.cfg_ranks.ep_group = cfg->parallel.expert > 1 && cfg->parallel.expert < mf_comm_size(comm)
                               ? mf_comm_local_rank(comm) / cfg->parallel.expert
                               : 0;
    /* Local rank r uses GPU r; more ranks than GPUs share them round robin
     * (their gradients meet in host memory either way). */
    const int gpus = mf_backend_device_count();
    r.cfg_ranks.device = gpus > 0 ? mf_comm_local_rank(comm) % gpus : 0;
    r.cfg = &r.cfg_ranks;
    r.rank0 = mf_comm_rank(comm) == 0;
    quiet = quiet || !r.rank0;
    mf_ranks_world(&r.rk, comm);
  }
  r.quiet = quiet;
  r.w_owned = 1;
  r.resume = resume;
  r.resume_dir = dir;
  mf_status st = setup(&r, out);
  if (st == MF_OK && !quiet) log_start(&r, out);
  r.t_start = mf_time_now();
  mf_window_start(&r.win, r.t_start);
  int64_t step = r.first_step + 1;
  for (; st == MF_OK && step <= cfg->train.steps; step++) {
    mf_step_metrics sm;
    st = step_once(&r, step, out, &sm);
    if (st == MF_OK) st = after_step(&r, step, out, &sm);
    if (st == MF_OK && r.stop) st = stopped(&r, step, out);
    if (r.stop) break;
  }
  if (st == MF_OK && !r.stop) st = finish(&r, out);
  run_free(&r, st == MF_OK);
  return st;
}

mf_status mf_train(const mf_config *cfg, int quiet, mf_train_summary *out) {
  return train_run(cfg, NULL, 0, NULL, quiet, out);
}

mf_status mf_train_resume(const mf_config *cfg, const char *dir, int quiet, mf_train_summary *out) {
  return train_run(cfg, NULL, 1, dir, quiet, out);
}

mf_status mf_train_ranks(const mf_config *cfg, mf_comm *comm, int resume, const char *dir, int quiet,
                         mf_train_summary *out) {
  return train_run(cfg, comm, resume, dir, quiet, out);
}
