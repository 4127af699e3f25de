/*
 * mf_model_spec -> HF config.json, in transformers' layout (json.dumps with
 * indent 2 and sorted keys), checked to read back to the same spec and written
 * atomically. The reader is hf_config_read.c.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "src/model/hf_config.h"
#include "src/model/hf_config_impl.h"

/* What Python's json.dumps writes for a float (its repr): the shortest digits
 * that read back exactly; fixed notation for exponents -4..15, else 1e-05. */
void mf_hf_format_double(double x, char *buf, size_t cap) {
  char tmp[48];
  int p = 1;
  for (; p < 17; p++) {
    snprintf(tmp, sizeof tmp, "%.*e", p - 1, x);
    if (strtod(tmp, NULL) == x) break;
  }
  snprintf(tmp, sizeof tmp, "%.*e", p - 1, x);
  const char *e_at = strchr(tmp, 'e');
  int e = e_at ? atoi(e_at + 1) : 0;
  if (e >= -4 && e < 16) {
    int dec = p - 1 - e;
    snprintf(buf, cap, "%.*f", dec > 0 ? dec : 0, x);
    if (!strchr(buf, '.') && strlen(buf) + 3 <= cap) strcat(buf, ".0");
  } else {
    snprintf(buf, cap, "%s", tmp);
  }
}

typedef struct entry {
  const char *key;
  char small[64];
  char *big; /* when the value does not fit `small` (mlp_only_layers) */
} entry;

typedef struct entries {
  entry e[48];
  int n;
} entries;

static entry *add(entries *es, const char *key) {
  MF_ASSERT(es->n < (int)(sizeof es->e / sizeof es->e[0]));
  entry *e = &es->e[es->n++];
  e->key = key;
  e->small[0] = 0;
  e->big = NULL;
  return e;
}

/* A value too long for `small` (DeepSeek-V3's rope_scaling) goes to `big`; NULL from strdup keeps it short,
 * and the read-back check of mf_hf_config_format refuses the text. */
static void add_raw(entries *es, const char *key, const char *json) {
  entry *e = add(es, key);
  if (strlen(json) < sizeof e->small)
    snprintf(e->small, sizeof e->small, "%s", json);
  else
    e->big = mf_strdup(json);
}
static void add_int(entries *es, const char *key, int64_t v) {
  snprintf(add(es, key)->small, sizeof es->e[0].small, "%lld", (long long)v);
}
static void add_real(entries *es, const char *key, double v) {
  mf_hf_format_double(v, add(es, key)->small, sizeof es->e[0].small);
}
static void add_bool(entries *es, const char *key, int v) {
  add_raw(es, key, v ? "true" : "false");
}
static void add_str(entries *es, const char *key, const char *v) {
  snprintf(add(es, key)->small, sizeof es->e[0].small, "\"%s\"",
           v); /* fixed identifiers: nothing to escape */
}

/* transformers' layout: json.dumps(indent=2, sort_keys=True); lists one item a line. */
static mf_status add_layers(entries *es, const char *key, const int32_t *v, int64_t n) {
  entry *e = add(es, key);
  if (n == 0) {
    strcpy(e->small, "[]");
    return MF_OK;
  }
  size_t cap = (size_t)n * 24 + 16, len = 0;
  MF_CHECK(mf_malloc(cap, key, (void **)&e->big));
  len += (size_t)snprintf(e->big + len, cap - len, "[");
  for (int64_t i = 0; i < n; i++)
    len += (size_t)snprintf(e->big + len, cap - len, "%s\n    %d", i ? "," : "", (int)v[i]);
  snprintf(e->big + len, cap - len, "\n  ]");
  return MF_OK;
}

/* gpt_oss's layer_types: one string a layer, one a line. */
static mf_status add_layer_types(entries *es, const mf_model_spec *s) {
  entry *e = add(es, "layer_types");
  size_t cap = (size_t)s->layers * 32 + 16, len = 0;
  MF_CHECK(mf_malloc(cap, "layer_types", (void **)&e->big));
  len += (size_t)snprintf(e->big + len, cap - len, "[");
  for (int64_t l = 0; l < s->layers; l++)
    len += (size_t)snprintf(e->big + len, cap - len, "%s\n    \"%s\"", l ? "," : "",
                            s->sliding_layers[l] ? "sliding_attention" : "full_attention");
  snprintf(e->big + len, cap - len, "\n  ]");
  return MF_OK;
}

static int entry_cmp(const void *a, const void *b) {
  return strcmp(((const entry *)a)->key, ((const entry *)b)->key);
}

static const char *dtype_torch_name(mf_dtype t) {
  switch (t) {
    case MF_DTYPE_F32:
      return "float32";
    case MF_DTYPE_BF16:
      return "bfloat16";
    case MF_DTYPE_F16:
      return "float16";
    default:
      return NULL;
  }
}

#define UNSUP(s, field, fmt, ...)                                                                      \
  MF_ERR(MF_ERR_UNSUPPORTED, "writing a %s config.json: %s: " fmt, mf_family_name((s)->family), field, \
         ##__VA_ARGS__)

/* Fields that a family's config cannot express must hold their neutral value,
 * so that what is written reads back to the same spec. */
static mf_status check_expressible(const mf_model_spec *s) {
  const mf_family f = s->family;
  const int ds = f == MF_FAMILY_DEEPSEEK_V3, oss = f == MF_FAMILY_GPT_OSS;
  const int glm = f == MF_FAMILY_GLM4_MOE, group = glm || ds; /* the group MoE block's keys */
  const int all_moe = f == MF_FAMILY_MIXTRAL || f == MF_FAMILY_OLMOE || oss;
  const mf_qk_norm qk = f == MF_FAMILY_QWEN3_MOE ? MF_QK_NORM_PER_HEAD
                        : f == MF_FAMILY_OLMOE   ? MF_QK_NORM_FULL
                                                 : MF_QK_NORM_NONE;
  if (s->qk_norm != qk && !(glm && s->qk_norm == MF_QK_NORM_PER_HEAD)) /* glm4_moe: use_qk_norm */
    return UNSUP(s, "qk_norm", "%d is not this family's qk-norm (%d)", (int)s->qk_norm, (int)qk);
  if (s->qkv_bias && f != MF_FAMILY_QWEN2_MOE && !glm && !oss)
    return UNSUP(s, "qkv_bias", "only qwen2_moe, glm4_moe and gpt_oss have q/k/v biases");
  if (!group && mf_model_spec_rope_dim(s) != s->head_dim)
    return UNSUP(s, "partial_rotary", "only glm4_moe rotates a part of each head");
  if (ds && s->partial_rotary != 0 && s->partial_rotary != 1)
    return UNSUP(s, "partial_rotary", "deepseek_v3 rotates qk_rope_head_dim dims of each head");
  if (!ds && ((s->yarn_factor != 0 && !oss) || s->q_lora_rank || s->kv_lora_rank || s->rope_interleave ||
              s->qk_nope_dim || s->qk_rope_dim || s->v_head_dim))
    return UNSUP(s, "yarn / latent attention", "only deepseek_v3 has them (and gpt_oss yarn)");
  if (!group && s->first_dense != 0)
    return UNSUP(s, "first_dense", "only glm4_moe and deepseek_v3 have first_k_dense_replace");
  if (group && (s->decoder_sparse_step != 1 || s->n_mlp_only != 0))
    return UNSUP(s, "decoder_sparse_step / mlp_only_layers",
                 "this family's dense layers are the first_dense first");
  if (group && s->shared_ffn % s->expert_ffn != 0)
    return UNSUP(s, "shared_ffn", "%lld is not a whole number of experts of %lld (n_shared_experts)",
                 (long long)s->shared_ffn, (long long)s->expert_ffn);
  if (s->router_jitter != 0 && f != MF_FAMILY_MIXTRAL)
    return UNSUP(s, "router_jitter", "only mixtral has router jitter");
  if (s->clip_qkv != 0 && f != MF_FAMILY_OLMOE) return UNSUP(s, "clip_qkv", "only olmoe clips q, k and v");
  if ((f == MF_FAMILY_MIXTRAL || oss) && !s->norm_topk_prob)
    return UNSUP(s, "norm_topk_prob", "%s always renormalises the top-k weights", mf_family_name(f));
  /* transformers builds gpt_oss's sliding-window mask whether a layer uses it or not */
  if (oss && s->sliding_window < 1)
    return UNSUP(s, "sliding_window", "%lld: gpt_oss's must be at least 1, with or without sliding layers",
                 (long long)s->sliding_window);
  if (all_moe && (s->decoder_sparse_step != 1 || s->n_mlp_only != 0))
    return UNSUP(s, "decoder_sparse_step / mlp_only_layers", "every layer of this family is MoE");
  if (all_moe && s->dense_ffn != 0) return UNSUP(s, "dense_ffn", "this family has no dense MLP layers");
  if (f == MF_FAMILY_QWEN2_MOE && s->shared_ffn <= 0)
    return UNSUP(s, "shared_ffn", "qwen2_moe always has a shared expert");
  if ((f == MF_FAMILY_QWEN2_MOE || f == MF_FAMILY_OLMOE) &&
      (s->hidden % s->heads != 0 || s->head_dim != s->hidden / s->heads))
    return UNSUP(s, "head_dim", "%lld: this family requires hidden / heads (%lld / %lld)",
                 (long long)s->head_dim, (long long)s->hidden, (long long)s->heads);
  return MF_OK;
}

static int spec_equal(const mf_model_spec *a, const mf_model_spec *b) {
  if (a->n_mlp_only != b->n_mlp_only) return 0;
  for (int64_t i = 0; i < a->n_mlp_only; i++)
    if (a->mlp_only_layers[i] != b->mlp_only_layers[i]) return 0;
  for (int64_t l = 0; l < a->layers && l < MF_MAX_LAYERS; l++)
    if (!a->sliding_layers[l] != !b->sliding_layers[l]) return 0;
  if (!a->o_bias != !b->o_bias || a->sliding_window != b->sliding_window) return 0;
  return a->family == b->family && a->hidden == b->hidden && a->layers == b->layers && a->heads == b->heads &&
         a->kv_heads == b->kv_heads && a->head_dim == b->head_dim && a->experts == b->experts &&
         a->top_k == b->top_k && a->expert_ffn == b->expert_ffn && a->dense_ffn == b->dense_ffn &&
         a->shared_ffn == b->shared_ffn && a->vocab == b->vocab && a->max_seq == b->max_seq &&
         a->rope_theta == b->rope_theta && a->norm_eps == b->norm_eps &&
         a->router_aux_loss_coef == b->router_aux_loss_coef && a->router_jitter == b->router_jitter &&
         a->clip_qkv == b->clip_qkv && !a->norm_topk_prob == !b->norm_topk_prob &&
         !a->tie_embeddings == !b->tie_embeddings && !a->qkv_bias == !b->qkv_bias &&
         a->qk_norm == b->qk_norm && a->decoder_sparse_step == b->decoder_sparse_step &&
         mf_model_spec_rope_dim(a) == mf_model_spec_rope_dim(b) && a->router == b->router &&
         a->first_dense == b->first_dense &&
         (a->router != MF_ROUTER_SIGMOID_GROUP ||
          (a->n_group == b->n_group && a->topk_group == b->topk_group &&
           a->routed_scaling == b->routed_scaling)) &&
         a->q_lora_rank == b->q_lora_rank && a->kv_lora_rank == b->kv_lora_rank &&
         a->qk_nope_dim == b->qk_nope_dim && a->qk_rope_dim == b->qk_rope_dim &&
         a->v_head_dim == b->v_head_dim && !a->rope_interleave == !b->rope_interleave &&
         a->yarn_factor == b->yarn_factor &&
         (a->yarn_factor == 0 ||
          (a->yarn_original_max == b->yarn_original_max && a->yarn_beta_fast == b->yarn_beta_fast &&
           a->yarn_beta_slow == b->yarn_beta_slow && a->yarn_mscale == b->yarn_mscale &&
           a->yarn_mscale_all_dim == b->yarn_mscale_all_dim && !a->yarn_truncate == !b->yarn_truncate));
}

static mf_status render(const mf_model_spec *s, const char *torch_dtype, char **out_text) {
  entries es;
  es.n = 0;
  mf_status st = MF_OK;
  const mf_family f = s->family;
  char arch[96];
  snprintf(arch, sizeof arch, "[\n    \"%s\"\n  ]", mf_family_architecture(f));
  add_raw(&es, "architectures", arch);
  add_str(&es, "model_type", mf_family_model_type(f));
  add_int(&es, "hidden_size", s->hidden);
  add_int(&es, "num_hidden_layers", s->layers);
  add_int(&es, "num_attention_heads", s->heads);
  add_int(&es, "num_key_value_heads", s->kv_heads);
  add_int(&es, "vocab_size", s->vocab);
  add_int(&es, "max_position_embeddings", s->max_seq);
  add_int(&es, "num_experts_per_tok", s->top_k);
  add_real(&es, "rope_theta", s->rope_theta);
  if (s->yarn_factor > 0) {
    /* DeepSeek-V3's every term and both type keys; gpt-oss's as GptOssConfig writes it (no mscale terms
     * when 0, which transformers reads as absent; rope_type alone) */
    const int ds = f == MF_FAMILY_DEEPSEEK_V3;
    char y[512], fa[48], bf[48], bs[48], ms[48], ma[48];
    mf_hf_format_double(s->yarn_factor, fa, sizeof fa);
    mf_hf_format_double(s->yarn_beta_fast, bf, sizeof bf);
    mf_hf_format_double(s->yarn_beta_slow, bs, sizeof bs);
    mf_hf_format_double(s->yarn_mscale, ms, sizeof ms);
    mf_hf_format_double(s->yarn_mscale_all_dim, ma, sizeof ma);
    size_t n = (size_t)snprintf(
        y, sizeof y, "{\n    \"beta_fast\": %s,\n    \"beta_slow\": %s,\n    \"factor\": %s,\n", bf, bs, fa);
    if (ds || s->yarn_mscale != 0) n += (size_t)snprintf(y + n, sizeof y - n, "    \"mscale\": %s,\n", ms);
    if (ds || s->yarn_mscale_all_dim != 0)
      n += (size_t)snprintf(y + n, sizeof y - n, "    \"mscale_all_dim\": %s,\n", ma);
    /* sorted keys, as transformers writes; truncate only when false (absent: true) */
    snprintf(y + n, sizeof y - n,
             "    \"original_max_position_embeddings\": %lld,\n    \"rope_type\": \"yarn\"%s%s\n  }",
             (long long)s->yarn_original_max, s->yarn_truncate ? "" : ",\n    \"truncate\": false",
             ds ? ",\n    \"type\": \"yarn\"" : "");
    add_raw(&es, "rope_scaling", y);
  } else {
    add_raw(&es, "rope_scaling", "null");
  }
  add_real(&es, "rms_norm_eps", s->norm_eps);
  if (s->router != MF_ROUTER_SIGMOID_GROUP) add_real(&es, "router_aux_loss_coef", s->router_aux_loss_coef);
  add_bool(&es, "tie_word_embeddings", s->tie_embeddings);
  add_str(&es, "hidden_act", "silu");
  add_real(&es, "attention_dropout", 0.0);
  add_str(&es, "torch_dtype", torch_dtype);
  add_str(&es, "transformers_version", MF_HF_TRANSFORMERS_VERSION);
  switch (f) {
    case MF_FAMILY_MIXTRAL:
      add_int(&es, "intermediate_size", s->expert_ffn);
      add_int(&es, "num_local_experts", s->experts);
      add_int(&es, "head_dim", s->head_dim);
      add_real(&es, "router_jitter_noise", s->router_jitter);
      add_raw(&es, "sliding_window", "null");
      break;
    case MF_FAMILY_QWEN2_MOE:
    case MF_FAMILY_QWEN3_MOE:
      add_int(&es, "intermediate_size", s->dense_ffn);
      add_int(&es, "moe_intermediate_size", s->expert_ffn);
      add_int(&es, "num_experts", s->experts);
      add_int(&es, "decoder_sparse_step", s->decoder_sparse_step);
      add_bool(&es, "norm_topk_prob", s->norm_topk_prob);
      add_bool(&es, "use_sliding_window", 0);
      MF_CHECK_GOTO(add_layers(&es, "mlp_only_layers", s->mlp_only_layers, s->n_mlp_only), st, done);
      if (f == MF_FAMILY_QWEN2_MOE) {
        add_int(&es, "shared_expert_intermediate_size", s->shared_ffn);
        add_bool(&es, "qkv_bias", s->qkv_bias);
      } else {
        add_int(&es, "head_dim", s->head_dim);
        add_bool(&es, "attention_bias", 0);
      }
      break;
    case MF_FAMILY_OLMOE:
      add_int(&es, "intermediate_size", s->expert_ffn);
      add_int(&es, "num_experts", s->experts);
      add_bool(&es, "norm_topk_prob", s->norm_topk_prob);
      add_bool(&es, "attention_bias", 0);
      if (s->clip_qkv > 0)
        add_real(&es, "clip_qkv", s->clip_qkv);
      else
        add_raw(&es, "clip_qkv", "null");
      break;
    case MF_FAMILY_GLM4_MOE:
    case MF_FAMILY_DEEPSEEK_V3:
      add_int(&es, "intermediate_size", s->dense_ffn);
      add_int(&es, "moe_intermediate_size", s->expert_ffn);
      add_int(&es, "n_routed_experts", s->experts);
      add_int(&es, "n_shared_experts", s->shared_ffn / s->expert_ffn);
      add_int(&es, "n_group", s->n_group);
      add_int(&es, "topk_group", s->topk_group);
      add_real(&es, "routed_scaling_factor", s->routed_scaling);
      add_int(&es, "first_k_dense_replace", s->first_dense);
      add_bool(&es, "norm_topk_prob", s->norm_topk_prob);
      add_bool(&es, "attention_bias", s->qkv_bias);
      if (f == MF_FAMILY_DEEPSEEK_V3) {
        if (s->q_lora_rank > 0)
          add_int(&es, "q_lora_rank", s->q_lora_rank);
        else
          add_raw(&es, "q_lora_rank", "null");
        add_int(&es, "kv_lora_rank", s->kv_lora_rank);
        add_int(&es, "qk_nope_head_dim", s->qk_nope_dim);
        add_int(&es, "qk_rope_head_dim", s->qk_rope_dim);
        add_int(&es, "v_head_dim", s->v_head_dim);
        add_bool(&es, "rope_interleave", s->rope_interleave);
        break;
      }
      add_bool(&es, "use_qk_norm", s->qk_norm == MF_QK_NORM_PER_HEAD);
      add_int(&es, "head_dim", s->head_dim);
      add_real(&es, "partial_rotary_factor", s->partial_rotary > 0 ? s->partial_rotary : 1.0);
      break;
    case MF_FAMILY_GPT_OSS:
      add_int(&es, "intermediate_size", s->expert_ffn);
      add_int(&es, "num_local_experts", s->experts);
      add_int(&es, "head_dim", s->head_dim);
      add_bool(&es, "attention_bias", s->qkv_bias); /* q/k/v and o alike */
      add_int(&es, "sliding_window", s->sliding_window);
      MF_CHECK_GOTO(add_layer_types(&es, s), st, done);
      break;
    default:
      st = MF_ERR(MF_ERR_INTERNAL, "no writer for family %d", (int)f);
      goto done;
  }
  qsort(es.e, (size_t)es.n, sizeof es.e[0], entry_cmp);
  size_t cap = 8;
  for (int i = 0; i < es.n; i++)
    cap += strlen(es.e[i].key) + strlen(es.e[i].big ? es.e[i].big : es.e[i].small) + 12;
  char *text = NULL;
  MF_CHECK_GOTO(mf_malloc(cap, "config.json text", (void **)&text), st, done);
  size_t len = (size_t)snprintf(text, cap, "{\n");
  for (int i = 0; i < es.n; i++)
    len += (size_t)snprintf(text + len, cap - len, "  \"%s\": %s%s\n", es.e[i].key,
                            es.e[i].big ? es.e[i].big : es.e[i].small, i + 1 < es.n ? "," : "");
  snprintf(text + len, cap - len, "}\n");
  *out_text = text;
done:
  for (int i = 0; i < es.n; i++) free(es.e[i].big);
  return st;
}

mf_status mf_hf_config_format(const mf_model_spec *s, mf_dtype dtype, char **out_text) {
  if (!s || !out_text) return MF_ERR(MF_ERR_INVALID_ARG, "mf_hf_config_format: NULL argument");
  const char *torch_dtype = dtype_torch_name(dtype);
  if (!torch_dtype)
    return MF_ERR(MF_ERR_INVALID_ARG, "writing config.json: torch_dtype %s is not one of F32, BF16, F16",
                  mf_dtype_name(dtype));
  MF_CHECK(mf_model_spec_validate(s, "writing config.json"));
  MF_CHECK(check_expressible(s));
  char *text = NULL;
  MF_CHECK(render(s, torch_dtype, &text));
  /* What is written must read back to the same spec: checked here, every time. */
  mf_model_spec back;
  mf_status st = mf_hf_config_parse(text, strlen(text), "config.json being written", &back);
  if (st != MF_OK) {
    mf_error_prefix("writing a %s config.json: it would not read back", mf_family_name(s->family));
    free(text);
    return st;
  }
  if (!spec_equal(s, &back)) {
    free(text);
    return MF_ERR(MF_ERR_INTERNAL, "writing a %s config.json: it reads back to a different spec",
                  mf_family_name(s->family));
  }
  *out_text = text;
  return MF_OK;
}

mf_status mf_hf_config_in_dir(const char *dir, char **out) {
  size_t n = strlen(dir) + sizeof "/config.json";
  MF_CHECK(mf_malloc(n, "a config.json path", (void **)out));
  snprintf(*out, n, "%s/config.json", dir);
  return MF_OK;
}

mf_status mf_hf_config_write_dtype(const mf_model_spec *s, mf_dtype dtype, const char *path) {
  if (!s || !path) return MF_ERR(MF_ERR_INVALID_ARG, "mf_hf_config_write: NULL argument");
  char *text = NULL, *file = NULL;
  struct stat st;
  if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) MF_CHECK(mf_hf_config_in_dir(path, &file));
  const char *name = file ? file : path;
  mf_status s_ = mf_hf_config_format(s, dtype, &text);
  if (s_ != MF_OK)
    mf_error_prefix("%s", name); /* I/O errors below name the file themselves */
  else
    s_ = mf_write_file_atomic(name, text, strlen(text));
  free(text);
  free(file);
  return s_;
}

mf_status mf_hf_config_write(const mf_model_spec *s, const char *path) {
  return mf_hf_config_write_dtype(s, MF_DTYPE_F32, path);
}

/* What transformers' save_pretrained writes beside config.json for these
 * families: GenerationConfig.from_model_config's diff, i.e. the token ids the
 * family's config class defaults to (our config.json does not set them, so
 * transformers takes those defaults), indent 2, sorted keys, a final newline.
 * Checked against transformers MF_HF_TRANSFORMERS_VERSION: Mixtral bos 1 eos 2;
 * OLMoE eos 50279 pad 1; DeepSeek-V3 bos 0 eos 1; Qwen2-MoE, Qwen3-MoE, GLM-4.5
 * and gpt-oss none. */
mf_status mf_hf_generation_config_format(const mf_model_spec *s, char **out_text) {
  const char *ids = NULL;
  switch (s->family) {
    case MF_FAMILY_MIXTRAL:
      ids = "  \"bos_token_id\": 1,\n  \"eos_token_id\": 2,\n";
      break;
    case MF_FAMILY_OLMOE:
      ids = "  \"eos_token_id\": 50279,\n  \"pad_token_id\": 1,\n";
      break;
    case MF_FAMILY_QWEN2_MOE:
    case MF_FAMILY_QWEN3_MOE:
    case MF_FAMILY_GLM4_MOE:
    case MF_FAMILY_GPT_OSS:
      ids = "";
      break;
    case MF_FAMILY_DEEPSEEK_V3:
      ids = "  \"bos_token_id\": 0,\n  \"eos_token_id\": 1,\n";
      break;
    default:
      return MF_ERR(MF_ERR_UNSUPPORTED, "generation_config.json: family %d has no HF generation config",
                    (int)s->family);
  }
  char buf[256];
  const int n = snprintf(buf, sizeof buf,
                         "{\n  \"_from_model_config\": true,\n%s  \"transformers_version\": \"%s\"\n}\n", ids,
                         MF_HF_TRANSFORMERS_VERSION);
  MF_CHECK(mf_malloc((size_t)n + 1, "generation_config.json", (void **)out_text));
  memcpy(*out_text, buf, (size_t)n + 1);
  return MF_OK;
}
