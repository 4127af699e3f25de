/* A run opened up to the stage a command needs (run.h); its eval pass (train_internal.h). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kernels/registry.h"
#include "src/core/env.h"
#include "src/train/hwmeasure.h"
#include "src/train/train_internal.h"

/* Host threads for each of the staging arena's fill and copy-out: one on the
 * cpu backend (its device is host memory and its own cores run the kernels);
 * on cuda a few, so that the host copies keep up with a PCIe 5 link (one
 * thread's memcpy moves about a quarter of it; not measured on a GPU yet). */
int mf_train_staging_threads(const mf_config *cfg, const char *backend) {
  if (strcmp(backend, "cuda") != 0) return 1;
  const long cores = cfg->train.threads > 0 ? (long)cfg->train.threads : sysconf(_SC_NPROCESSORS_ONLN);
  return cores >= 16 ? 4 : cores >= 8 ? 2 : 1;
}

/* The pinned staging arena laid out by the run plan, the executor copying through it. */
static mf_status use_staging(mf_run *r, const mf_config *cfg) {
  const mf_run_plan *rp = r->rp;
  if (!rp->staging_fits) /* mf_run_plan_admit refused such a plan, naming memory.pinned_limit */
    return MF_ERR(MF_ERR_INTERNAL, "run: a staging layout over memory.pinned_limit was admitted");
  r->staging_threads = mf_train_staging_threads(cfg, rp->dev.name);
  const mf_exec_staging_opts so = {r->staging_threads, 0, 0};
  return mf_exec_use_staging(r->exec, rp->staging, &so);
}

static void unpin(mf_run *r, int k) {
  if (r->pins[k].ptr && r->backend && r->backend->host_unregister)
    r->backend->host_unregister(r->backend, r->pins[k].ptr, r->pins[k].bytes);
  r->pins[k].ptr = NULL;
  r->pins[k].bytes = 0;
}

mf_status mf_run_pin_home(mf_run *r, mf_home_region k, void *base, size_t total) {
  if ((int)k < 0 || k >= MF_HOME_ACTS || !r->rp || !r->rp->home.pinned[k] || !base || !r->backend) return MF_OK;
  const mf_pinned_home *h = &r->rp->home;
  if (h->pin_hi[k] > total || h->pin_lo[k] >= h->pin_hi[k])
    return MF_ERR(MF_ERR_INTERNAL, "run: the pinned %s spans bytes [%llu, %llu) of a buffer of %zu",
                  mf_home_region_name(k), (unsigned long long)h->pin_lo[k], (unsigned long long)h->pin_hi[k], total);
  const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE), b0 = (uintptr_t)base, b1 = b0 + total;
  uintptr_t a = (b0 + (uintptr_t)h->pin_lo[k]) & ~(page - 1), e = (b0 + (uintptr_t)h->pin_hi[k] + page - 1) & ~(page - 1);
  if (a < b0) a = b0;
  if (e > b1) e = b1;
  if (r->pins[k].ptr == (void *)a && r->pins[k].bytes == (size_t)(e - a)) return MF_OK;
  unpin(r, k);
  char n[32];
  if (!r->backend->host_register) {
    MF_LOGW("run", "the %s backend cannot pin host memory: the %s (%s) is copied straight from pageable memory",
            r->backend->name, mf_home_region_name(k), mf_format_bytes(e - a, n, sizeof n));
    return MF_OK;
  }
  const double t0 = mf_time_now();
  if (r->backend->host_register(r->backend, (void *)a, (size_t)(e - a)) != MF_OK) {
    MF_LOGW("run", "pinning the %s (%s) failed (%s): its copies go straight from pageable memory, slower; "
            "memory.pinned_home: false stages them instead",
            mf_home_region_name(k), mf_format_bytes(e - a, n, sizeof n), mf_last_error());
    return MF_OK;
  }
  r->pins[k].ptr = (void *)a;
  r->pins[k].bytes = (size_t)(e - a);
  MF_LOGI("run", "pinned the %s: %s in %.2f s", mf_home_region_name(k), mf_format_bytes(e - a, n, sizeof n),
          mf_time_now() - t0);
  return MF_OK;
}

void mf_run_close(mf_run *r) {
  for (int k = 0; k < MF_HOME_REGIONS_; k++) unpin(r, k);
  if (r->working_owned) free(r->working);
  mf_exec_free(r->exec);
  if (!r->inside) mf_backend_free(r->backend); /* else the host run's */
  mf_run_plan_free(r->rp);
  if (r->t_owned) mf_param_table_free(r->t);
  for (int64_t m = 0; m < r->G; m++) {
    if (r->ids) free(r->ids[m]);
    if (r->targets) free(r->targets[m]);
  }
  free(r->ids);
  free(r->targets);
  memset(r, 0, sizeof *r);
}

/* The batch buffers of the plan's G micro-batches. */
static mf_status batches(mf_run *r, const mf_config *cfg) {
  r->G = r->rp->prog->G;
  const size_t n = (size_t)(cfg->train.micro_batch * cfg->data.seq_len);
  MF_CHECK(mf_calloc((size_t)r->G, sizeof(int32_t *), "batch pointers", (void **)&r->ids));
  MF_CHECK(mf_calloc((size_t)r->G, sizeof(int32_t *), "batch pointers", (void **)&r->targets));
  for (int64_t m = 0; m < r->G; m++) {
    MF_CHECK(mf_calloc(n, sizeof(int32_t), "token ids", (void **)&r->ids[m]));
    MF_CHECK(mf_calloc(n, sizeof(int32_t), "targets", (void **)&r->targets[m]));
  }
  return MF_OK;
}

static mf_status open_table(mf_run *r, const mf_config *cfg, const mf_run_opts *o) {
  if (o->table) {
    r->t = o->table;
    return MF_OK;
  }
  MF_CHECK(mf_run_model_table(cfg, o->model_dir, o->ckpt, &r->t));
  r->t_owned = 1;
  return MF_OK;
}

/* Inside another run: its plan made within that run's arena, on its backend
 * (no profile measured again: the host run's is read). Else the profile
 * (hardware.profile auto measures one where it must: before the plan reads
 * it) and the plan, written to plan_json before the backend exists. */
static mf_status open_plan(mf_run *r, const mf_config *cfg, const mf_run_opts *o) {
  if (o->inside) {
    if (o->inside->stage < MF_RUN_EXECUTOR)
      return MF_ERR(MF_ERR_INTERNAL, "run: opened inside a run without its executor");
    return mf_run_plan_make_inside(cfg, r->t, o->use, o->inside->rp, &r->rp);
  }
  MF_CHECK(mf_hwmeasure_auto(cfg, r->t, o->pool));
  MF_CHECK(mf_run_plan_make(cfg, r->t, o->use, 1, &r->rp));
  if (o->plan_json) MF_CHECK(mf_run_plan_write_json(r->rp, o->plan_json));
  return MF_OK;
}

/* The plan's kernels (rp->kernels) on a cuda backend with bf16 storage: one
 * that cannot run here stops the run, saying why and where it was chosen. */
static mf_status use_kernels(mf_run *r) {
  const mf_run_kernels *k = &r->rp->kernels;
  if (strcmp(r->backend->name, "cuda") != 0 || r->rp->storage != MF_DTYPE_BF16) return MF_OK;
  const mf_status st = mf_backend_set_kernels(r->backend, k->expert_gemm, k->attention);
  if (st != MF_OK) {
    char why[1024];
    snprintf(why, sizeof why, "%s", mf_last_error());
    return MF_ERR(st, "kernels: %s (expert GEMMs %s from %s, attention %s from %s); set it to mma or auto", why,
                  k->expert_gemm, k->expert_gemm_from, k->attention, k->attention_from);
  }
  MF_LOGI("run", "kernels: expert GEMMs on %s (%s), attention on %s (%s)", mf_backend_expert_gemm(r->backend),
          k->expert_gemm_from, mf_backend_attention(r->backend), k->attention_from);
  return MF_OK;
}

static mf_status open_backend(mf_run *r, const mf_config *cfg, const mf_run_opts *o) {
  if (o->inside) {
    r->inside = o->inside;
    r->backend = o->inside->backend;
    return MF_OK;
  }
  const uint64_t scratch = o->cudnn_scratch ? mf_run_plan_scratch_cudnn(cfg, &r->t->spec) : r->rp->dev.scratch_bytes;
  const mf_backend_params bp = {
      o->pool, 0, 0, mf_optim_run_kernel, MF_CPU_STREAMS_IMMEDIATE, cfg->device, scratch};
  MF_CHECK(mf_backend_create(r->rp->dev.name, &bp, &r->backend));
  if (strcmp(r->backend->name, r->rp->dev.name) != 0)
    return MF_ERR(MF_ERR_INTERNAL, "run: planned for the %s backend, created the %s one", r->rp->dev.name,
                  r->backend->name);
  return use_kernels(r);
}

/* The plan admitted (before the arena and the host state), then the
 * executor (in the host run's arena, else in one of its own), the staging
 * and the batch buffers. */
static mf_status open_executor(mf_run *r, const mf_config *cfg, const mf_run_opts *o) {
  const mf_schedule *s = r->rp->plan->s;
  MF_CHECK(mf_run_plan_admit(r->rp, cfg));
  if (!o->node_home) MF_CHECK(mf_param_table_alloc_qhome(r->t)); /* the quantized base's home, once the plan fits the host */
  if (r->inside)
    MF_CHECK(mf_exec_create_inside(r->rp->prog, s, r->inside->exec, &r->exec));
  else
    MF_CHECK(mf_exec_create_home(r->rp->prog, s, r->backend, r->rp->home.pinned[MF_HOME_ACTS], &r->exec));
  if (r->rp->staged) MF_CHECK(use_staging(r, cfg));
  return batches(r, cfg);
}

mf_status mf_run_open(const mf_config *cfg, const mf_run_opts *o, mf_run *r) {
  if (o->upto < MF_RUN_TABLE || o->upto > MF_RUN_EXECUTOR)
    return MF_ERR(MF_ERR_INVALID_ARG, "mf_run_open: stage %d is not one of a run's", (int)o->upto);
  while (r->stage < o->upto) {
    switch (r->stage) {
      case MF_RUN_NONE: MF_CHECK(open_table(r, cfg, o)); break;
      case MF_RUN_TABLE: MF_CHECK(open_plan(r, cfg, o)); break;
      case MF_RUN_PLANNED: MF_CHECK(open_backend(r, cfg, o)); break;
      case MF_RUN_BACKEND: MF_CHECK(open_executor(r, cfg, o)); break;
      case MF_RUN_EXECUTOR: break;
    }
    r->stage++;
  }
  return MF_OK;
}

typedef struct round_job {
  const float *w;
  uint16_t *out;
  size_t n;
} round_job;

static void round_part(void *ctx, int i, int n) {
  const round_job *j = (const round_job *)ctx;
  size_t lo = 0, hi = 0;
  mf_partition(j->n, 4096, i, n, &lo, &hi);
  if (hi > lo) mf_fp32_to_bf16_n(j->w + lo, j->out + lo, hi - lo);
}

/* buf (the caller's) becomes the working copy. */
static void adopt_working(mf_run *r, uint16_t *buf) {
  if (r->working_owned) free(r->working);
  r->working = buf;
  r->working_owned = 0;
}

/* The table's quantized home (LoRA's base stored quantized), when the plan pins it. */
static mf_status pin_quant(mf_run *r) {
  return mf_run_pin_home(r, MF_HOME_QUANT, r->t->qhome, (size_t)r->t->qhome_bytes);
}

mf_status mf_run_round_working(mf_run *r, const float *w, size_t n, uint16_t *buf, mf_threadpool *pool) {
  MF_CHECK(pin_quant(r));
  if (r->rp->storage != MF_DTYPE_BF16) return MF_OK;
  if (buf) {
    adopt_working(r, buf);
  } else if (!r->working) {
    MF_CHECK(mf_malloc((n ? n : 1) * sizeof(uint16_t), "the bf16 working copy of the weights", (void **)&r->working));
    r->working_owned = 1;
  }
  round_job j = {w, r->working, n};
  if (pool)
    mf_threadpool_run(pool, round_part, &j);
  else
    round_part(&j, 0, 1);
  mf_exec_set_working_copy(r->exec, r->working);
  return mf_run_pin_home(r, MF_HOME_WORKING, r->working, (size_t)r->t->total_numel * sizeof(uint16_t));
}

mf_status mf_run_round_trained(mf_run *r, const mf_param_table *t, const float *w, uint16_t *buf) {
  if (r->rp->storage != MF_DTYPE_BF16 || !buf)
    return MF_ERR(MF_ERR_INTERNAL, "run: a bf16 base at home without bf16 storage and its working copy");
  MF_CHECK(pin_quant(r));
  adopt_working(r, buf);
  for (int64_t i = 0; i < t->n; i++) {
    const mf_param *p = &t->params[i];
    if (!p->frozen) mf_fp32_to_bf16_n(w + p->offset, buf + p->offset, (size_t)p->numel);
  }
  mf_exec_set_working_copy(r->exec, r->working);
  return mf_run_pin_home(r, MF_HOME_WORKING, r->working, (size_t)t->total_numel * sizeof(uint16_t));
}

void mf_run_share_working(mf_run *r, const mf_run *from) {
  if (r->rp->storage != MF_DTYPE_BF16) return;
  r->working = from->working;
  r->working_owned = 0;
  mf_exec_set_working_copy(r->exec, r->working);
}

mf_status mf_train_check_vocab(const mf_loader *l, const mf_param_table *t) {
  if ((int64_t)mf_loader_vocab(l) > t->spec.vocab)
    return MF_ERR(MF_ERR_CONFIG, "%s: its vocabulary (%u) is larger than the model's (%lld)", mf_loader_path(l),
                  mf_loader_vocab(l), (long long)t->spec.vocab);
  return MF_OK;
}

/* A long evaluation reports its progress every this many seconds, the first
 * time after as many: an evaluation shorter than that prints nothing.
 * MF_PROGRESS_EVERY=SECONDS sets it (0: after every batch). */
#define EVAL_PROGRESS_S 2.0

static double progress_every(void) {
  double v = EVAL_PROGRESS_S; /* src/core/env.c's warning says "using 2" */
  (void)mf_env_number(MF_ENV_PROGRESS_EVERY, &v);
  return v;
}

static void eval_progress(const mf_loader *l, uint64_t done, double t0) {
  char line[4200];
  mf_eval_progress_format(line, sizeof line, mf_loader_path(l), done, mf_loader_windows(l), mf_time_now() - t0);
  MF_LOGI("eval", "%s", line);
}

mf_status mf_run_eval_pass(mf_run *r, mf_loader *l, const float *w, int progress, mf_eval_result *out,
                           float *capture) {
  memset(out, 0, sizeof *out);
  const double t0 = mf_time_now(), every = progress ? progress_every() : 0;
  double sum = 0, shown = 0; /* shown: when progress was last reported (0: never) */
  uint64_t done = 0;
  int first = 1;
  for (;;) {
    mf_loader_batch b;
    MF_CHECK(mf_loader_next(l, r->ids[0], r->targets[0], NULL, &b));
    mf_exec_capture_final_hidden(r->exec, first ? capture : NULL);
    mf_step_result sr;
    MF_CHECK(mf_exec_step(r->exec, w, (const int32_t *const *)r->ids, (const int32_t *const *)r->targets, NULL,
                          &sr));
    first = 0;
    sum += sr.ce_loss * (double)sr.tokens;
    out->tokens += sr.tokens;
    out->sequences += b.n_seq;
    done += (uint64_t)b.n_seq;
    if (b.end_of_pass) break;
    if (mf_stop_requested()) { /* SIGINT/SIGTERM: the loss so far, marked as cut short */
      out->stopped = 1;
      break;
    }
    const double now = mf_time_now();
    if (progress && now - (shown > 0 ? shown : t0) >= every) {
      eval_progress(l, done, t0);
      shown = now;
    }
  }
  mf_exec_capture_final_hidden(r->exec, NULL);
  out->loss = out->tokens > 0 ? sum / (double)out->tokens : NAN;
  out->perplexity = exp(out->loss);
  out->seconds = mf_time_now() - t0;
  if (shown > 0) eval_progress(l, done, t0); /* it said how far it was: say that it finished */
  return MF_OK;
}
