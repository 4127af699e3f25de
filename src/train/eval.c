/* `moefit eval`, and the model a config names (see train.h). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "experts/experts.h"
#include "experts/routing.h"
#include "src/io/quant.h"
#include "src/model/hf_config.h"
#include "src/train/base.h"
#include "src/train/train_internal.h"

/* A PEFT adapter dir: adapter_config.json and adapter_model.safetensors.
 * One of them is enough to be taken for one: the other's absence is then
 * refused naming it (not as a model dir without its config.json). */
static int is_adapter_dir(const char *dir) {
  char a[4200], b[4200];
  snprintf(a, sizeof a, "%s/adapter_config.json", dir);
  snprintf(b, sizeof b, "%s/adapter_model.safetensors", dir);
  return access(a, F_OK) == 0 || access(b, F_OK) == 0;
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
  mf_status st = mf_run_lora(cfg, *table, dir, ckpt);
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

/* Whether dir holds weights (model.safetensors or its index), not only a config.json. */
static int has_weights(const char *dir) {
  char p[4200];
  snprintf(p, sizeof p, "%s/model.safetensors", dir);
  if (access(p, F_OK) == 0) return 1;
  snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
  return access(p, F_OK) == 0;
}

mf_status mf_run_quantize_base(const mf_config *cfg, const char *dir, mf_param_table *t) {
  const mf_config_lora *c = &cfg->train.lora;
  char at[600];
  mf_hf_quant q;
  memset(&q, 0, sizeof q);
  if (dir) {
    mf_model_spec spec;
    MF_CHECK(mf_hf_config_load_quant(dir, &spec, &q));
  }
  const int kind = c->base_dtype == MF_CONFIG_BASE_AUTO ? (t->lora_a ? (int)q.kind : MF_QUANT_NONE) : c->base_dtype;
  if (kind == MF_QUANT_NONE) return MF_OK; /* float; a 4-bit checkpoint dequantized at load (mf_params_load_home) */
  if (q.kind == MF_QUANT_NONE) { /* quantized at load */
    const mf_status st = mf_param_table_quantize_base(t, (mf_quant_kind)kind, c->base_blocksize, c->base_double_quant);
    if (st == MF_ERR_CONFIG)
      return MF_ERR(MF_ERR_CONFIG, "%s%s", mf_last_error(), where(cfg, "train.lora", at, sizeof at));
    return st;
  }
  if (kind != (int)q.kind)
    return MF_ERR(MF_ERR_CONFIG,
                  "train.lora.base_dtype %s%s: %s ships its weights %s%s%s%s; a quantized base is not quantized "
                  "again: set auto (as shipped) or bf16 (dequantized at load)",
                  mf_quant_name((mf_quant_kind)kind), where(cfg, "train.lora.base_dtype", at, sizeof at), dir,
                  mf_quant_name(q.kind), q.kind == MF_QUANT_NF4 ? " (" : "", q.kind == MF_QUANT_NF4 ? q.method : "",
                  q.kind == MF_QUANT_NF4 ? ")" : "");
  /* as shipped: the weights the file stores quantized (NF4: in its blocks) */
  int64_t bs = 64; /* transformers' Linear4bit blocks, where only the config.json is there (moefit plan) */
  int found = 0;
  uint8_t *which = NULL;
  if (has_weights(dir)) {
    MF_CHECK(mf_calloc((size_t)(t->n_base > 0 ? t->n_base : 1), 1, "the quantized weights' list", (void **)&which));
    const mf_status st = mf_params_shipped_layout(t, dir, q.kind, which, &bs, &found);
    if (st != MF_OK || !found) {
      free(which);
      return st != MF_OK ? st
                         : MF_ERR(MF_ERR_FORMAT,
                                  "%s: config.json says quantization_config %s %s, but no weight of the model is "
                                  "stored so",
                                  dir, q.method, mf_quant_name(q.kind));
    }
  }
  mf_status st = MF_OK;
  if (q.kind == MF_QUANT_NF4 && mf_config_where(cfg, "train.lora.base_blocksize") && c->base_blocksize != bs)
    st = MF_ERR(MF_ERR_CONFIG, "train.lora.base_blocksize %lld%s: %s ships nf4 in blocks of %lld (leave it unset)",
                (long long)c->base_blocksize, where(cfg, "train.lora.base_blocksize", at, sizeof at), dir,
                (long long)bs);
  else if (mf_config_where(cfg, "train.lora.base_double_quant") && c->base_double_quant != q.nested)
    st = MF_ERR(MF_ERR_CONFIG, "train.lora.base_double_quant %s%s: %s ships %s %s (leave it unset)",
                c->base_double_quant ? "true" : "false", where(cfg, "train.lora.base_double_quant", at, sizeof at),
                dir, mf_quant_name(q.kind), q.nested ? "double quantized" : "without double quantization");
  if (st == MF_OK) st = mf_param_table_quantize_set(t, q.kind, bs, q.nested, which);
  free(which);
  if (st == MF_OK) t->base_shipped = 1;
  return st;
}

mf_status mf_run_lora(const mf_config *cfg, mf_param_table *t, const char *dir, const char *ckpt) {
  const mf_config_lora *c = &cfg->train.lora;
  char at[600];
  if (c->rank == 0 && c->base_dtype != MF_QUANT_NONE && c->base_dtype != MF_CONFIG_BASE_AUTO)
    return MF_ERR(MF_ERR_CONFIG,
                  "train.lora.base_dtype %s%s: a quantized base is LoRA's frozen base; with train.lora.rank 0 "
                  "every weight is trained (set train.lora.rank, or base_dtype bf16)",
                  mf_quant_name((mf_quant_kind)c->base_dtype), where(cfg, "train.lora.base_dtype", at, sizeof at));
  if (c->rank == 0) return MF_OK;
  mf_lora l = {c->rank,    (isnan(c->alpha) ? (double)c->rank : c->alpha) / (double)c->rank,
               0,          c->train_router,
               c->dropout, NULL};
  for (int64_t i = 0; i < c->n_targets; i++) {
    const uint64_t roles = mf_lora_target_roles(t->spec.family, c->targets[i]);
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
  return st == MF_OK ? mf_run_quantize_base(cfg, dir, t) : st;
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
    MF_CHECK(mf_params_quantize_from(t, w));
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
  mf_status st = mf_param_table_alloc_qhome(*table);
  if (st == MF_OK) st = mf_run_load_weights(cfg, model_dir, *table, NULL, w, desc, desc_cap);
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

/* The same dir, by what it resolves to. */
static int same_dir(const char *a, const char *b) {
  char *ra = realpath(a, NULL), *rb = realpath(b, NULL);
  const int same = ra && rb && strcmp(ra, rb) == 0;
  free(ra);
  free(rb);
  return same;
}

/* An adapter dir with no record of its base (PEFT's, or a moefit's from before
 * it wrote one): what adapter_config.json's base_model_name_or_path says is
 * all there is. Refused when it names another dir than the config's base, or
 * a model where the config's base is model.init's random weights; else a
 * warning that the base cannot be checked. */
static mf_status adapter_without_record(const mf_config *cfg, const char *dir) {
  char named[4096];
  MF_CHECK(mf_lora_read_adapter_base(dir, named, sizeof named));
  const char *base = cfg->model.has_init ? NULL : cfg->model.path;
  char at[600];
  const int other_dir = named[0] && is_dir_with_config(named) && (!base || !same_dir(named, base));
  if (other_dir || (named[0] && !base))
    return MF_ERR(MF_ERR_CONFIG,
                  "%s: its adapter_config.json's base_model_name_or_path names %s, and the config's base is %s%s: "
                  "the adapters would be evaluated on weights they were not trained on (%s has no %s to say "
                  "more); " MF_BASE_WAY_OUT_ADAPTER,
                  dir, named, base ? "model.path " : "model.init's random weights", base ? base : "",
                  dir, MF_BASE_ID_FILE);
  MF_LOGW("eval",
          "%s has no %s (adapters written by PEFT, or by a moefit from before it recorded their base): whether "
          "%s%s%s is the base they were trained on cannot be checked (adapter_config.json's "
          "base_model_name_or_path: \"%s\")",
          dir, MF_BASE_ID_FILE, base ? "model.path " : "model.init's random base", base ? base : "",
          where(cfg, base ? "model.path" : "model.init", at, sizeof at), named);
  return MF_OK;
}

/* The first non-finite logit of a pass whose loss is not finite, found by
 * running its batches again, their final hidden states kept, up to the first
 * whose loss is not: a token whose hidden state is not finite, else a row of
 * the LM head that is not, else (an overflow) the logits themselves,
 * hidden . lm_head^T on the host where that is quick. The error names the
 * place in the token file and what is not finite there. */
static mf_status nonfinite_loss(mf_run *r, mf_loader *l, const mf_loader_state *start, const mf_config *cfg,
                                const mf_param_table *t, const float *w, const char *tokens, const char *desc,
                                double loss) {
  const int64_t B = cfg->train.micro_batch, S = cfg->data.seq_len, H = t->spec.hidden, V = t->spec.vocab;
  float *hidden = NULL;
  MF_CHECK(mf_malloc((size_t)(B * S * H) * sizeof(float), "hidden states", (void **)&hidden));
  mf_status st = mf_loader_set_state(l, start);
  const float *W = w + t->params[mf_param_lm_head(t)].offset;
  int64_t seq0 = 0, at_seq = -1, at_tok = -1, at_vocab = -1, bad = -1; /* bad: that batch's first sequence */
  const char *why = "";
  for (int done = 0; st == MF_OK && !done;) {
    mf_loader_batch b;
    st = mf_loader_next(l, r->ids[0], r->targets[0], NULL, &b);
    if (st != MF_OK) break;
    mf_exec_capture_final_hidden(r->exec, hidden);
    mf_step_result sr;
    st = mf_exec_step(r->exec, w, (const int32_t *const *)r->ids, (const int32_t *const *)r->targets, NULL, &sr);
    if (st != MF_OK) break;
    done = b.end_of_pass;
    if (sr.tokens == 0 || isfinite(sr.ce_loss)) {
      seq0 += b.n_seq;
      continue;
    }
    done = 1;
    bad = seq0;
    for (int64_t x = 0; x < b.n_seq * S && at_seq < 0; x++)
      for (int64_t k = 0; k < H; k++)
        if (!isfinite(hidden[x * H + k])) {
          at_seq = seq0 + x / S, at_tok = x % S, why = "its final hidden state is not finite";
          break;
        }
    for (int64_t v = 0; v < V && at_seq < 0; v++)
      for (int64_t k = 0; k < H; k++)
        if (!isfinite(W[v * H + k])) {
          at_seq = seq0, at_tok = 0, at_vocab = v, why = "the LM head's row of that token id is not finite";
          break;
        }
    /* the logits on the host only where that takes seconds, not hours */
    const int host_logits = (double)(b.n_seq * S) * (double)V * (double)H <= 1e10;
    for (int64_t x = 0; host_logits && x < b.n_seq * S && at_seq < 0; x++)
      for (int64_t v = 0; v < V; v++) {
        float acc = 0;
        for (int64_t k = 0; k < H; k++) acc += hidden[x * H + k] * W[v * H + k];
        if (!isfinite(acc)) {
          at_seq = seq0 + x / S, at_tok = x % S, at_vocab = v, why = "it overflows float32";
          break;
        }
      }
  }
  mf_exec_capture_final_hidden(r->exec, NULL);
  free(hidden);
  MF_CHECK(st);
  char id[64] = "";
  if (at_vocab >= 0) snprintf(id, sizeof id, " (the logit of token id %lld)", (long long)at_vocab);
  if (bad < 0)
    return MF_ERR(MF_ERR_FORMAT,
                  "%s: the loss is %g, not a finite number, though no batch's is when run again: the weights "
                  "evaluated (%s) give NaN or Inf",
                  tokens, loss, desc);
  if (at_seq < 0)
    return MF_ERR(MF_ERR_FORMAT,
                  "%s: the loss is %g, not a finite number, though the final hidden states and the LM head of "
                  "the batch starting at sequence %lld are (its logits or their cross-entropy overflow): the "
                  "weights evaluated (%s) give NaN or Inf",
                  tokens, loss, (long long)bad, desc);
  return MF_ERR(MF_ERR_FORMAT,
                "%s: the loss is %g, not a finite number: the first logit that is not finite is at sequence %lld "
                "(the file's window %lld), token %lld%s: %s; the weights evaluated (%s) give NaN or Inf",
                tokens, loss, (long long)at_seq, (long long)at_seq, (long long)at_tok, id, why, desc);
}

mf_status mf_eval(const mf_config *cfg, const mf_eval_opts *opts, mf_eval_result *out) {
  memset(out, 0, sizeof *out);
  mf_status st = MF_OK;
  mf_threadpool *pool = NULL;
  mf_param_table *t = NULL;
  float *w = NULL, *hidden = NULL;
  mf_loader *l = NULL;
  mf_run r;
  memset(&r, 0, sizeof r);
  char desc[4200], final_dir[4200], rec_path[4400], who[4300];
  mf_base_id rec; /* an adapter dir's record of its base (has_rec) */
  memset(&rec, 0, sizeof rec);
  int has_rec = 0;
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
  /* An adapter dir: the adapters it says (rank, alpha, targets, the routers
   * trained), not train.lora's; on the base it records, nowhere else */
  mf_config own = *cfg;
  if (adapters) own.train.lora.rank = 0, own.train.lora.base_dtype = MF_QUANT_NONE; /* quantized below */
  mf_run_opts ro = {.use = MF_RUN_EVAL, .upto = MF_RUN_TABLE, .model_dir = model_dir, .pool = pool};
  MF_CHECK_GOTO(mf_run_open(&own, &ro, &r), st, done);
  t = r.t;
  if (adapters) {
    snprintf(rec_path, sizeof rec_path, "%s/%s", adapters, MF_BASE_ID_FILE);
    snprintf(who, sizeof who, "the adapters of %s were", adapters);
    MF_CHECK_GOTO(mf_ckpt_adapter_record_read(adapters, &rec, &has_rec), st, done);
    if (has_rec)
      MF_CHECK_GOTO(mf_run_base_check_spec(&rec, rec_path, cfg, &t->spec, who, MF_BASE_WAY_OUT_ADAPTER), st, done);
    else
      MF_CHECK_GOTO(adapter_without_record(cfg, adapters), st, done);
    mf_lora lora;
    MF_CHECK_GOTO(mf_lora_read_adapter_config(adapters, t, &lora), st, done);
    st = mf_param_table_add_lora(t, &lora);
    free(lora.hot);
    /* the base as the config stores it (train.lora.base_dtype: as the adapters were trained over it) */
    if (st == MF_OK)
      st = mf_run_quantize_base(cfg, model_dir_of(cfg, NULL), t);
    if (st != MF_OK) goto done;
    mf_config_lora *ol = &own.train.lora;
    ol->rank = t->lora.rank;
    ol->alpha = t->lora.scale * (double)t->lora.rank;
    ol->dropout = t->lora.dropout;
    ol->train_router = t->lora.train_router;
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
  ro.upto = MF_RUN_EXECUTOR;
  MF_CHECK_GOTO(mf_run_open(&own, &ro, &r), st, done);
  MF_CHECK_GOTO(mf_run_load_weights(cfg, model_dir, t, pool, &w, desc, sizeof desc), st, done);
  if (has_rec) /* the base's weights as the adapters' record has them */
    MF_CHECK_GOTO(mf_run_base_check_weights(&rec, rec_path, cfg, t, w, NULL, pool, who, MF_BASE_WAY_OUT_ADAPTER),
                  st, done);
  if (adapters) {
    MF_CHECK_GOTO(mf_params_load_adapters(t, adapters, w), st, done);
    const size_t n = strlen(desc);
    snprintf(desc + n, sizeof desc - n, " with the LoRA adapters of %s", adapters);
  }
  MF_CHECK_GOTO(mf_run_round_working(&r, w, (size_t)t->total_numel, NULL, pool), st, done);
  if (opts->dump_logits)
    MF_CHECK_GOTO(mf_malloc((size_t)(cfg->train.micro_batch * cfg->data.seq_len * t->spec.hidden) * sizeof(float),
                            "hidden states", (void **)&hidden),
                  st, done);
  MF_LOGI("eval", "model: %s; tokens: %s", desc, tokens);
  mf_loader_state start;
  mf_loader_get_state(l, &start);
  MF_CHECK_GOTO(mf_run_eval_pass(&r, l, w, 1, out, hidden), st, done);
  if (out->tokens > 0 && !isfinite(out->loss)) {
    st = nonfinite_loss(&r, l, &start, cfg, t, w, tokens, desc, out->loss);
    goto done;
  }
  if (opts->dump_logits && !out->stopped) MF_CHECK_GOTO(dump_logits(cfg, t, w, hidden, opts->dump_logits), st, done);
done:
  mf_base_id_free(&rec);
  mf_run_close(&r); /* the table with it */
  mf_loader_free(l);
  free(hidden);
  free(w);
  mf_threadpool_free(pool);
  return st;
}
