/* `moefit train` and `moefit eval` on the executor (see train.h). */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kernels/backend.h"
#include "src/exec/exec.h"
#include "src/exec/loader.h"
#include "src/exec/metrics.h"
#include "src/exec/train.h"
#include "src/io/hf_config.h"
#include "src/io/tokens.h"
#include "src/model/program.h"
#include "src/optim/optim.h"
#include "planner/plan.h"

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
  mf_status st = mf_malloc((size_t)(*table)->total_numel * sizeof(float), "the model's weights", (void **)&weights);
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

static mf_status check_backend(const mf_config *cfg) {
  if (cfg->backend == MF_CONFIG_BACKEND_CUDA)
    return MF_ERR(MF_ERR_NOT_IMPLEMENTED,
                  "backend: cuda: the cuda backend's ops are not built yet; use backend: cpu (or auto)");
  return MF_OK;
}

/* Everything one run of the executor needs. */
typedef struct runner {
  mf_backend *backend;
  mf_program *prog;
  mf_plan *plan; /* the planner's schedule, or NULL: everything resident */
  mf_exec *exec;
  int32_t **ids, **targets; /* [G][B*S] */
  int64_t G;
} runner;

static void runner_free(runner *r) {
  mf_exec_free(r->exec);
  mf_plan_free(r->plan);
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

/* With an explicit memory.device_budget the planner decides (weights streamed,
 * activations offloaded or recomputed as the budget requires); with `auto`
 * every tensor stays resident on the cpu backend. */
static mf_status plan_for(runner *r, const mf_config *cfg) {
  if (cfg->memory.device_budget == MF_CONFIG_SIZE_AUTO) return MF_OK;
  mf_hwprofile hw;
  MF_CHECK(mf_hwprofile_load(mf_plan_profile_path(cfg->hardware.profile), &hw));
  mf_decisions *fixed = NULL;
  mf_plan_pins pins = {NULL, NULL, NULL};
  mf_status st = MF_OK;
  MF_CHECK_GOTO(mf_decisions_create(r->prog, &fixed), st, done);
  MF_CHECK_GOTO(mf_plan_pins_create(r->prog, &pins), st, done);
  MF_CHECK_GOTO(mf_plan_apply_overrides(r->prog, &cfg->memory, fixed, &pins), st, done);
  MF_CHECK_GOTO(mf_plan_choose(r->prog, &hw, cfg->memory.device_budget, fixed,
                               cfg->memory.n_overrides ? &pins : NULL, &r->plan),
                st, done);
done:
  mf_plan_pins_free(&pins);
  mf_decisions_free(fixed);
  return st;
}

static mf_status runner_init(runner *r, const mf_config *cfg, const mf_param_table *t, mf_threadpool *pool,
                             int64_t G, int forward_only) {
  memset(r, 0, sizeof *r);
  mf_cpu_backend_opts bo = {pool, 0, 0};
  MF_CHECK(mf_backend_cpu_create(&bo, &r->backend));
  mf_program_opts po = {cfg->train.micro_batch, cfg->data.seq_len, G, aux_coef_of(cfg, t), 0, forward_only};
  mf_status st = MF_OK;
  MF_CHECK_GOTO(mf_program_build(t, &po, &r->prog), st, fail);
  MF_CHECK_GOTO(plan_for(r, cfg), st, fail);
  if (r->plan)
    MF_CHECK_GOTO(mf_exec_create_scheduled(r->prog, r->plan->s, r->backend, &r->exec), st, fail);
  else
    MF_CHECK_GOTO(mf_exec_create(r->prog, r->backend, &r->exec), st, fail);
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
    return MF_ERR(MF_ERR_CONFIG, "%s: its vocabulary (%u) is larger than the model's (%lld)", mf_loader_path(l),
                  mf_loader_vocab(l), (long long)t->spec.vocab);
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
    MF_CHECK(mf_exec_step(r->exec, w, (const int32_t *const *)r->ids, (const int32_t *const *)r->targets, NULL, &sr));
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

static mf_status corpus_entropy(const char *path, double *nats) {
  mf_tokens *t = NULL;
  MF_CHECK(mf_tokens_open(path, &t));
  mf_tokens_stats st;
  mf_status rc = mf_tokens_compute_stats(t, &st);
  mf_tokens_close(t);
  *nats = st.entropy_bits * 0.69314718055994531;
  return rc;
}


/* AdamW over every parameter that got a gradient. A routed expert that saw no
 * token in the step has none in Mixtral and Qwen (PyTorch leaves .grad None): it
 * is not updated and its step count does not advance. OLMoE's experts always get
 * a (zero) gradient, so they are updated, as transformers does. Weight decay
 * applies to matrices only. */
static mf_status optimizer_step(const mf_param_table *t, const int64_t *expert_tokens, const mf_config_train *tc,
                                double lr, float *w, float *g, float *m, float *v, int64_t *steps,
                                mf_threadpool *pool) {
  mf_adamw_hparams h = mf_adamw_hparams_from_config(tc, lr);
  mf_adamw_hparams h_nodecay = h;
  h_nodecay.weight_decay = 0;
  for (int64_t i = 0; i < t->n; i++) {
    const mf_param *p = &t->params[i];
    if (p->expert >= 0 && expert_tokens[p->layer * t->spec.experts + p->expert] == 0 &&
        !mf_family_idle_expert_has_grad(t->spec.family))
      continue;
    steps[i]++;
    MF_CHECK(mf_adamw_update(p->ndim == 2 ? &h : &h_nodecay, steps[i], w + p->offset, g + p->offset, m + p->offset,
                             v + p->offset, (size_t)p->numel, NULL, pool));
  }
  return MF_OK;
}

mf_status mf_train(const mf_config *cfg, int quiet, mf_train_summary *out) {
  memset(out, 0, sizeof *out);
  out->valid_loss = NAN;
  MF_CHECK(check_backend(cfg));
  mf_status st = MF_OK;
  mf_threadpool *pool = NULL;
  mf_param_table *t = NULL;
  float *w = NULL, *g = NULL, *mom = NULL, *var = NULL;
  int64_t *steps = NULL;
  mf_loader *train = NULL, *valid = NULL;
  mf_metrics *metrics = NULL;
  mf_optim_buf *bufs = NULL;
  runner tr = {0}, ev = {0};
  char desc[4200];

  MF_CHECK_GOTO(mf_threadpool_create((int)cfg->train.threads, &pool), st, done);
  MF_CHECK_GOTO(mf_run_load_model(cfg, NULL, &t, &w, desc, sizeof desc), st, done);
  MF_CHECK_GOTO(mf_loader_create(cfg->data.train, cfg->data.seq_len, cfg->train.micro_batch, cfg->train.seed,
                                 MF_LOADER_TRAIN, &train), st, done);
  MF_CHECK_GOTO(check_vocab(train, t), st, done);
  if (cfg->data.valid) {
    MF_CHECK_GOTO(mf_loader_create(cfg->data.valid, cfg->data.seq_len, cfg->train.micro_batch, 0, MF_LOADER_EVAL,
                                   &valid), st, done);
    MF_CHECK_GOTO(check_vocab(valid, t), st, done);
  }
  MF_CHECK_GOTO(corpus_entropy(cfg->data.train, &out->entropy_nats), st, done);
  MF_CHECK_GOTO(runner_init(&tr, cfg, t, pool, cfg->train.grad_accum, 0), st, done);
  if (valid) MF_CHECK_GOTO(runner_init(&ev, cfg, t, pool, 1, 1), st, done);

  const size_t n = (size_t)t->total_numel;
  MF_CHECK_GOTO(mf_calloc(n, sizeof(float), "gradients", (void **)&g), st, done);
  MF_CHECK_GOTO(mf_calloc(n, sizeof(float), "Adam first moments", (void **)&mom), st, done);
  MF_CHECK_GOTO(mf_calloc(n, sizeof(float), "Adam second moments", (void **)&var), st, done);
  MF_CHECK_GOTO(mf_calloc((size_t)t->n, sizeof(int64_t), "step counts", (void **)&steps), st, done);
  MF_CHECK_GOTO(mf_calloc((size_t)t->n, sizeof(mf_optim_buf), "gradient list", (void **)&bufs), st, done);
  MF_CHECK_GOTO(mf_mkdir_p(cfg->output.dir), st, done);
  MF_CHECK_GOTO(mf_metrics_open(cfg->output.dir, 0, &metrics), st, done);

  int64_t total = 0, active = 0;
  mf_model_spec_param_count(&t->spec, &total, &active);
  const int64_t tokens_per_step = cfg->train.micro_batch * cfg->data.seq_len * cfg->train.grad_accum;
  if (!quiet) {
    char arena[32];
    MF_LOGI("train", "model: %s, %s: %.3fM parameters (%.3fM active per token), %lld layers, %lld experts top-%lld",
            mf_family_name(t->spec.family), desc, (double)total / 1e6, (double)active / 1e6,
            (long long)t->spec.layers, (long long)t->spec.experts, (long long)t->spec.top_k);
    MF_LOGI("train", "data: %s: %llu windows of %lld tokens; unigram entropy %.4f nats/token (a model that ignores "
            "context scores this)", cfg->data.train, (unsigned long long)mf_loader_windows(train),
            (long long)cfg->data.seq_len, out->entropy_nats);
    MF_LOGI("train", "step: %lld x %lld sequences of %lld tokens = %lld tokens; %d threads; cpu backend, device "
            "arena %s, %d ops, %.3g FLOP/step",
            (long long)cfg->train.grad_accum, (long long)cfg->train.micro_batch, (long long)cfg->data.seq_len,
            (long long)tokens_per_step, mf_threadpool_size(pool),
            mf_format_bytes(mf_exec_arena_bytes(tr.exec), arena, sizeof arena), tr.prog->n_ops, tr.prog->flops);
  }

  if (!quiet && tr.plan) {
    const mf_plan *pl = tr.plan;
    int wr = 0, ws = 0, ak = 0, ao = 0, ar = 0;
    for (int32_t i = 0; i < pl->d->n_params; i++) pl->d->param[i] == MF_PARAM_RESIDENT ? wr++ : ws++;
    for (int32_t x = 0; x < tr.prog->n_tensors; x++)
      if (mf_schedule_can_offload(tr.prog, x))
        pl->d->act[x] == MF_ACT_KEEP ? ak++ : pl->d->act[x] == MF_ACT_OFFLOAD ? ao++ : ar++;
    char b1[32], b2[32], b3[32], b4[32], b5[32];
    MF_LOGI("train", "plan: device budget %s, arena %s (peak %s); weights %d resident / %d streamed; activations "
            "%d kept / %d offloaded / %d recomputed; %s up and %s home per step; predicted %.0f tokens/s",
            mf_format_bytes(pl->budget, b1, sizeof b1), mf_format_bytes(pl->s->arena_bytes, b2, sizeof b2),
            mf_format_bytes(pl->s->peak_live_bytes, b3, sizeof b3), wr, ws, ak, ao, ar,
            mf_format_bytes(pl->s->h2d_bytes, b4, sizeof b4), mf_format_bytes(pl->s->d2h_bytes, b5, sizeof b5),
            (double)tokens_per_step / pl->sim.step_seconds);
  }
  const double t_start = mf_time_now();
  double window_loss = 0;
  int64_t window_n = 0, window_tokens = 0;
  double window_t0 = t_start;
  for (int64_t step = 1; step <= cfg->train.steps; step++) {
    for (int64_t m = 0; m < tr.G; m++) MF_CHECK_GOTO(mf_loader_next(train, tr.ids[m], tr.targets[m], NULL, NULL), st, done);
    mf_step_result sr;
    MF_CHECK_GOTO(mf_exec_step(tr.exec, w, (const int32_t *const *)tr.ids, (const int32_t *const *)tr.targets, g, &sr),
                  st, done);
    for (int64_t i = 0; i < t->n; i++) {
      const mf_param *p = &t->params[i];
      int used = p->expert < 0 || mf_family_idle_expert_has_grad(t->spec.family) ||
                 mf_exec_expert_tokens(tr.exec)[p->layer * t->spec.experts + p->expert] > 0;
      bufs[i] = (mf_optim_buf){used ? g + p->offset : NULL, used ? (size_t)p->numel : 0};
    }
    double norm = 0, coef = 1;
    MF_CHECK_GOTO(mf_optim_clip_grad_norm(bufs, (size_t)t->n, cfg->train.grad_clip, pool, &norm, &coef), st, done);
    const double lr = mf_lr_at(&cfg->train, step);
    const int skip = !isfinite(norm) || !isfinite(sr.loss);
    if (skip) {
      out->skipped++;
      MF_LOGW("train", "step %lld: non-finite gradients or loss (loss %g, |g| %g): step skipped, weights and "
              "optimizer state unchanged", (long long)step, sr.loss, norm);
    } else {
      MF_CHECK_GOTO(optimizer_step(t, mf_exec_expert_tokens(tr.exec), &cfg->train, lr, w, g, mom, var, steps, pool),
                    st, done);
    }
    if (step == 1) out->first_loss = sr.loss;
    window_loss += sr.loss;
    window_n++;
    window_tokens += sr.tokens;
    out->steps = step;

    const int last = step == cfg->train.steps;
    const int eval_now = valid && (last || (cfg->train.eval_every > 0 && step % cfg->train.eval_every == 0));
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
      sm.tokens_per_s = (double)window_n * (double)tokens_per_step / (now - window_t0 > 0 ? now - window_t0 : 1e-9);
      sm.elapsed_s = now - t_start;
      sm.skipped = skip;
      sm.eval_loss = eval_loss;
      sm.step_s = (now - window_t0) / (double)window_n;
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
  {
    char final_dir[4200];
    snprintf(final_dir, sizeof final_dir, "%s/final", cfg->output.dir);
    MF_CHECK_GOTO(mf_params_save_model_dir(t, w, final_dir), st, done);
    if (!quiet) {
      MF_LOGI("train", "done: %lld steps in %.1f s (%.0f tokens/s); loss %.4f -> %.4f nats/token; unigram entropy "
              "%.4f%s", (long long)out->steps, out->seconds, out->tokens_per_s, out->first_loss, out->final_loss,
              out->entropy_nats, out->skipped ? " (some steps skipped)" : "");
      if (valid) MF_LOGI("train", "validation loss %.4f (perplexity %.2f) on %s", out->valid_loss, exp(out->valid_loss),
                         cfg->data.valid);
      MF_LOGI("train", "weights: %s (HF model dir); metrics: %s", final_dir, mf_metrics_path(metrics));
    }
  }
done:
  mf_metrics_close(metrics);
  runner_free(&tr);
  runner_free(&ev);
  mf_loader_free(train);
  mf_loader_free(valid);
  free(g);
  free(mom);
  free(var);
  free(steps);
  free(bufs);
  free(w);
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
  MF_CHECK_GOTO(mf_loader_create(tokens, cfg->data.seq_len, cfg->train.micro_batch, 0, MF_LOADER_EVAL, &l), st, done);
  MF_CHECK_GOTO(check_vocab(l, t), st, done);
  MF_CHECK_GOTO(runner_init(&r, cfg, t, pool, 1, 1), st, done);
  const int64_t T = cfg->train.micro_batch * cfg->data.seq_len, H = t->spec.hidden, V = t->spec.vocab;
  if (opts->dump_logits) MF_CHECK_GOTO(mf_malloc((size_t)(T * H) * sizeof(float), "hidden states", (void **)&hidden), st, done);
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
