/* `moefit eval`, and the model a config names (see train.h). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "experts/experts.h"
#include "experts/routing.h"
#include "src/model/hf_config.h"
#include "src/train/train_internal.h"

/* A PEFT adapter dir: adapter_config.json and adapter_model.safetensors. */
static int is_adapter_dir(const char *dir) {
  char a[4200], b[4200];
  snprintf(a, sizeof a, "%s/adapter_config.json", dir);
  snprintf(b, sizeof b, "%s/adapter_model.safetensors", dir);
  return access(a, R_OK) == 0 && access(b, R_OK) == 0;
}

static int is_dir_with_config(const char *dir) {
  char path[4096];
  snprintf(path, sizeof path, "%s/config.json", dir);
  return access(path, R_OK) == 0;
}

/* The checkpoint directory the weights come from, or NULL for model.init. */
static const char *model_dir_of(const mf_config *cfg, const char *model_dir) {
  return model_dir ? model_dir : cfg->model.has_init ? NULL : cfg->model.path;
}

mf_status mf_run_model_table(const mf_config *cfg, const char *model_dir, const char *ckpt,
                             mf_param_table **table) {
  *table = NULL;
  mf_model_spec spec;
  const char *dir = model_dir_of(cfg, model_dir);
  if (dir)
    MF_CHECK(mf_hf_config_load(dir, &spec));
  else
    spec = cfg->model.init;
  MF_CHECK(mf_param_table_build(&spec, table));
  mf_status st = mf_run_lora(cfg, *table, ckpt);
  if (st != MF_OK) {
    mf_param_table_free(*table);
    *table = NULL;
  }
  return st;
}

/* " (FILE:LINE)" of a config key, or "". */
static const char *where(const mf_config *cfg, const char *key, char *buf, size_t cap) {
  const char *at = mf_config_where(cfg, key);
  snprintf(buf, cap, "%s%s%s", at ? " (" : "", at ? at : "", at ? ")" : "");
  return buf;
}

/* train.lora.experts hot: the hot set from the routing memory.routing names
 * (mf_experts_lora_hot), refused without measured routing. */
static mf_status hot_from_routing(const mf_config *cfg, const mf_param_table *t, uint8_t **hot) {
  const mf_config_lora *c = &cfg->train.lora;
  const int64_t L = t->spec.layers, E = t->spec.experts;
  mf_routing r;
  int found = 0;
  char path[4200] = "", note[4400] = "", at[600];
  MF_CHECK(mf_routing_for_config(cfg, &t->spec, &r, &found, path, sizeof path, note, sizeof note));
  if (!found)
    return MF_ERR(
        MF_ERR_CONFIG,
        "train.lora.experts: hot%s takes each layer's most-routed experts by measured routing, and "
        "there is none%s%s: point memory.routing at the routing.json a run on this model wrote (moefit "
        "train writes OUTPUT/routing.json at its end; a short run with train.lora.experts: all will "
        "do), or put it in this output.dir",
        where(cfg, "train.lora.experts", at, sizeof at), note[0] ? " (" : "", note[0] ? note : "");
  mf_status st = mf_malloc((size_t)(L * E > 0 ? L * E : 1), "the hot experts", (void **)hot);
  if (st == MF_OK) {
    const int64_t n = mf_experts_lora_hot(r.share, L, E, c->hot_fraction, *hot);
    MF_LOGI("train",
            "train.lora.experts hot: %lld routed experts get adapters, each layer's %g most-routed by %s",
            (long long)n, c->hot_fraction, path);
  }
  mf_routing_free(&r);
  return st;
}

mf_status mf_run_lora(const mf_config *cfg, mf_param_table *t, const char *ckpt) {
  const mf_config_lora *c = &cfg->train.lora;
  if (c->rank == 0) return MF_OK;
  char at[600];
  mf_lora l = {c->rank,    (isnan(c->alpha) ? (double)c->rank : c->alpha) / (double)c->rank,
               0,          c->train_router,
               c->dropout, NULL};
  for (int64_t i = 0; i < c->n_targets; i++) {
    const uint32_t roles = mf_lora_target_roles(t->spec.family, c->targets[i]);
    if (!roles)
      return MF_ERR(MF_ERR_CONFIG, "train.lora.targets[%lld]%s: the %s model has no module named %s",
                    (long long)i, where(cfg, "train.lora.targets", at, sizeof at),
                    mf_family_name(t->spec.family), c->targets[i]);
    l.roles |= roles;
  }
  if (c->experts == MF_CONFIG_LORA_EXPERTS_HOT && (!(l.roles & MF_LORA_EXPERT_ROLES) || t->spec.experts == 0))
    MF_LOGW(
        "train",
        "train.lora.experts: hot%s changes nothing: train.lora.targets name no routed expert's projection",
        where(cfg, "train.lora.experts", at, sizeof at));
  if (c->experts == MF_CONFIG_LORA_EXPERTS_HOT && (l.roles & MF_LORA_EXPERT_ROLES) && t->spec.experts > 0) {
    if (ckpt) /* the hot set the run trained, whatever routing was measured since */
      MF_CHECK(mf_ckpt_read_lora_hot(ckpt, t->spec.layers, t->spec.experts, &l.hot));
    else
      MF_CHECK(hot_from_routing(cfg, t, &l.hot));
  }
  mf_status st = mf_param_table_add_lora(t, &l);
  free(l.hot);
  if (st == MF_ERR_CONFIG)
    return MF_ERR(MF_ERR_CONFIG, "%s%s", mf_last_error(), where(cfg, "train.lora", at, sizeof at));
  return st;
}

mf_status mf_run_load_weights(const mf_config *cfg, const char *model_dir, const mf_param_table *t,
                              mf_threadpool *pool, float **w, char *desc, size_t desc_cap) {
  *w = NULL;
  float *weights = NULL;
  MF_CHECK(mf_malloc((size_t)t->total_numel * sizeof(float), "the model's weights", (void **)&weights));
  const mf_status st = mf_run_load_weights_home(cfg, model_dir, t, weights, NULL, pool, desc, desc_cap);
  if (st != MF_OK) {
    free(weights);
    return st;
  }
  *w = weights;
  return MF_OK;
}

mf_status mf_run_load_weights_home(const mf_config *cfg, const char *model_dir, const mf_param_table *t,
                                   float *w, uint16_t *frozen_bf16, mf_threadpool *pool, char *desc,
                                   size_t desc_cap) {
  const char *dir = model_dir_of(cfg, model_dir);
  if (dir) {
    MF_CHECK(mf_params_load_home(t, dir, w, frozen_bf16));
    snprintf(desc, desc_cap, "%s", dir);
  } else {
    mf_params_init_random_home(t, t->spec.seed, 0.02f, w, frozen_bf16, pool);
    snprintf(desc, desc_cap, "random init (seed %llu)", (unsigned long long)t->spec.seed);
  }
  if (frozen_bf16) {
    const size_t n = strlen(desc);
    snprintf(desc + n, desc_cap - n, "; the frozen base at home in bf16");
  }
  mf_params_init_adapters(t, cfg->train.seed, w); /* LoRA's, from train.seed */
  return MF_OK;
}

mf_status mf_run_load_model(const mf_config *cfg, const char *model_dir, mf_param_table **table, float **w,
                            char *desc, size_t desc_cap) {
  *w = NULL;
  MF_CHECK(mf_run_model_table(cfg, model_dir, NULL, table));
  mf_status st = mf_run_load_weights(cfg, model_dir, *table, NULL, w, desc, desc_cap);
  if (st != MF_OK) {
    mf_param_table_free(*table);
    *table = NULL;
  }
  return st;
}

/* data.seq_len against the model eval runs (--model DIR, OUTPUT/final or
 * model.init), not the config's model.init alone; the message names both places. */
static mf_status check_seq_len(const mf_config *cfg, const char *dir, const mf_param_table *t) {
  if (cfg->data.seq_len <= t->spec.max_seq) return MF_OK;
  const char *set_at = mf_config_where(cfg, "data.seq_len"),
             *init_at = mf_config_where(cfg, "model.init.max_seq");
  char model[4400];
  if (dir)
    snprintf(model, sizeof model, "max_position_embeddings (%lld) in %s/config.json, the model evaluated",
             (long long)t->spec.max_seq, dir);
  else
    snprintf(model, sizeof model, "model.init.max_seq (%lld; %s%s)", (long long)t->spec.max_seq,
             init_at ? "set at " : "the family's default", init_at ? init_at : "");
  const char *at = set_at ? set_at : cfg->source ? cfg->source : "config";
  return MF_ERR(MF_ERR_CONFIG, "%s: data.seq_len (%lld%s) exceeds %s", at, (long long)cfg->data.seq_len,
                set_at ? "" : ", its default", model);
}

/* logits of the first sequence = final hidden . lm_head^T, on the host. */
static mf_status dump_logits(const mf_config *cfg, const mf_param_table *t, const float *w, const float *hidden,
                             const char *path) {
  const int64_t S = cfg->data.seq_len, H = t->spec.hidden, V = t->spec.vocab;
  float *logits = NULL;
  MF_CHECK(mf_malloc((size_t)(S * V) * sizeof(float), "logits", (void **)&logits));
  const float *W = w + t->params[mf_param_lm_head(t)].offset;
  for (int64_t s = 0; s < S; s++)
    for (int64_t v = 0; v < V; v++) {
      const float *hrow = hidden + s * H, *wrow = W + v * H;
      float acc = 0;
      for (int64_t k = 0; k < H; k++) acc += hrow[k] * wrow[k];
      logits[s * V + v] = acc;
    }
  mf_status st = mf_write_file_atomic(path, logits, (size_t)(S * V) * sizeof(float));
  free(logits);
  MF_CHECK(st);
  MF_LOGI("eval", "logits of the first sequence: %s (float32, [%lld, %lld] row-major)", path, (long long)S,
          (long long)V);
  return MF_OK;
}

/* eval picked OUTPUT/final over the config's model.init: say so when the
 * model a run left there has another shape than the config describes. */
static void note_other_final(const mf_config *cfg, const char *final_dir, const mf_model_spec *s) {
  const mf_model_spec *c = &cfg->model.init;
  const struct {
    const char *key;
    int64_t config, final;
  } k[] = {{"layers", c->layers, s->layers},       {"hidden", c->hidden, s->hidden},
           {"experts", c->experts, s->experts},    {"top_k", c->top_k, s->top_k},
           {"expert_ffn", c->expert_ffn, s->expert_ffn}, {"vocab", c->vocab, s->vocab},
           {"heads", c->heads, s->heads},          {"kv_heads", c->kv_heads, s->kv_heads}};
  if (c->family != s->family) {
    MF_LOGW("eval", "%s is a %s model, not the config's model.init (%s): the model a run left in output.dir; "
            "--model DIR or output.dir=DIR picks another",
            final_dir, mf_family_name(s->family), mf_family_name(c->family));
    return;
  }
  for (size_t i = 0; i < sizeof k / sizeof k[0]; i++)
    if (k[i].config != k[i].final) {
      MF_LOGW("eval", "%s has %s %lld, the config's model.init %lld: it is the model a run left in output.dir; "
              "--model DIR or output.dir=DIR picks another",
              final_dir, k[i].key, (long long)k[i].final, (long long)k[i].config);
      return;
    }
}

mf_status mf_eval(const mf_config *cfg, const mf_eval_opts *opts, mf_eval_result *out) {
  memset(out, 0, sizeof *out);
  mf_status st = MF_OK;
  mf_threadpool *pool = NULL;
  mf_param_table *t = NULL;
  float *w = NULL, *hidden = NULL;
  mf_loader *l = NULL;
  mf_runner r;
  memset(&r, 0, sizeof r);
  char desc[4200], final_dir[4200];
  const char *model_dir = opts->model_dir;
  snprintf(final_dir, sizeof final_dir, "%s/final", cfg->output.dir);
  if (!model_dir && cfg->model.has_init && is_dir_with_config(final_dir)) model_dir = final_dir;
  /* A PEFT adapter dir (--model DIR, or a LoRA run's final/) on the config's base */
  const char *adapters = NULL;
  const char *ad = opts->model_dir ? opts->model_dir : final_dir;
  if (is_adapter_dir(ad) && !is_dir_with_config(ad)) adapters = ad, model_dir = NULL;
  const char *tokens = opts->tokens ? opts->tokens : cfg->data.valid ? cfg->data.valid : cfg->data.train;
  if (!tokens)
    return MF_ERR(MF_ERR_CONFIG, "%s: nothing to evaluate on: give --tokens FILE, data.valid or data.train",
                  cfg->source ? cfg->source : "config");

  MF_CHECK_GOTO(mf_threadpool_create((int)cfg->train.threads, &pool), st, done);
  mf_config own = *cfg; /* an adapter dir: the adapters it says, not train.lora's */
  if (adapters) own.train.lora.rank = 0;
  MF_CHECK_GOTO(mf_run_model_table(&own, model_dir, NULL, &t), st, done);
  if (adapters) {
    mf_lora lora;
    MF_CHECK_GOTO(mf_lora_read_adapter_config(adapters, t, &lora), st, done);
    st = mf_param_table_add_lora(t, &lora);
    free(lora.hot);
    if (st != MF_OK) goto done;
  }
  if (model_dir == final_dir) note_other_final(cfg, final_dir, &t->spec);
  MF_CHECK_GOTO(check_seq_len(cfg, model_dir_of(cfg, model_dir), t), st, done);
  const char *key = opts->tokens ? "--tokens" : cfg->data.valid ? "data.valid" : "data.train";
  const mf_loader_origin origin = {key, opts->tokens ? NULL : mf_config_where(cfg, key),
                                   cfg->model.has_init ? NULL : cfg->model.path};
  MF_CHECK_GOTO(
      mf_loader_open(&origin, tokens, cfg->data.seq_len, cfg->train.micro_batch, 0, MF_LOADER_EVAL, &l), st,
      done);
  MF_CHECK_GOTO(mf_train_check_vocab(l, t), st, done);
  MF_CHECK_GOTO(mf_runner_init(&r, cfg, t, pool, MF_RUN_EVAL, NULL), st, done);
  MF_CHECK_GOTO(mf_run_load_weights(cfg, model_dir, t, pool, &w, desc, sizeof desc), st, done);
  if (adapters) {
    MF_CHECK_GOTO(mf_params_load_adapters(t, adapters, w), st, done);
    const size_t n = strlen(desc);
    snprintf(desc + n, sizeof desc - n, " with the LoRA adapters of %s", adapters);
  }
  MF_CHECK_GOTO(mf_runner_round_working(&r, w, (size_t)t->total_numel, NULL, pool), st, done);
  if (opts->dump_logits)
    MF_CHECK_GOTO(mf_malloc((size_t)(cfg->train.micro_batch * cfg->data.seq_len * t->spec.hidden) * sizeof(float),
                            "hidden states", (void **)&hidden),
                  st, done);
  MF_LOGI("eval", "model: %s; tokens: %s", desc, tokens);
  MF_CHECK_GOTO(mf_runner_eval_pass(&r, l, w, 1, out, hidden), st, done);
  if (opts->dump_logits && !out->stopped) MF_CHECK_GOTO(dump_logits(cfg, t, w, hidden, opts->dump_logits), st, done);
done:
  mf_runner_free(&r);
  mf_loader_free(l);
  free(hidden);
  free(w);
  mf_param_table_free(t);
  mf_threadpool_free(pool);
  return st;
}
