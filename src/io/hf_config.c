/*
 * HF config.json -> mf_model_spec. The rules (which keys each family reads,
 * which are required, what is refused) are in hf_config.h; the transformers
 * lines they follow are quoted where it matters. The writer is at the end.
 */
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "src/io/hf_config.h"

static void format_double(double x, char *buf, size_t cap);

typedef struct reader {
  const char *where; /* the file, for messages */
  json_t *root;
  mf_family family;
} reader;

/* "FILE: KEY: fault" */
#define KEY_ERR(st, r, key, fmt, ...) MF_ERR((st), "%s: %s: " fmt, (r)->where, (key), ##__VA_ARGS__)

/* A copy of untrusted text that is safe to print: printable ASCII, the rest '?'. */
static const char *printable(const char *s, char *buf, size_t cap) {
  size_t n = 0;
  for (; s && *s && n + 1 < cap; s++) {
    unsigned char c = (unsigned char)*s;
    buf[n++] = (c >= 0x20 && c < 0x7f) ? (char)c : '?';
  }
  buf[n] = 0;
  return buf;
}

static const char *type_name(const json_t *v) {
  switch (json_typeof(v)) {
    case JSON_OBJECT:
      return "an object";
    case JSON_ARRAY:
      return "an array";
    case JSON_STRING:
      return "a string";
    case JSON_INTEGER:
      return "an integer";
    case JSON_REAL:
      return "a real number";
    case JSON_TRUE:
    case JSON_FALSE:
      return "a boolean";
    case JSON_NULL:
      return "null";
  }
  return "an unknown JSON value";
}

static json_t *get(const reader *r, const char *key) {
  return json_object_get(r->root, key);
}

static mf_status require(const reader *r, const char *key) {
  if (!get(r, key))
    return KEY_ERR(MF_ERR_FORMAT, r, key,
                   "missing; it sets the size of the %s model's tensors, so it must be given",
                   mf_family_name(r->family));
  return MF_OK;
}

/* Integer in [lo, hi]; absent leaves *out as it is (the family default). */
static mf_status int_value(const reader *r, const char *key, const json_t *v, int64_t lo, int64_t hi,
                           int64_t *out) {
  if (json_is_real(v)) {
    char num[48];
    format_double(json_real_value(v), num, sizeof num);
    return KEY_ERR(MF_ERR_FORMAT, r, key, "expected an integer, got a real number (%s)", num);
  }
  if (!json_is_integer(v)) return KEY_ERR(MF_ERR_FORMAT, r, key, "expected an integer, got %s", type_name(v));
  json_int_t x = json_integer_value(v);
  if (x < lo || x > hi)
    return KEY_ERR(MF_ERR_FORMAT, r, key, "%lld is out of range (must be %lld to %lld)", (long long)x,
                   (long long)lo, (long long)hi);
  *out = (int64_t)x;
  return MF_OK;
}

static mf_status read_int(const reader *r, const char *key, int64_t lo, int64_t hi, int64_t *out) {
  const json_t *v = get(r, key);
  return v ? int_value(r, key, v, lo, hi, out) : MF_OK;
}

/* A number (JSON integer or real); range checks are the caller's. */
static mf_status number_value(const reader *r, const char *key, const json_t *v, double *out) {
  if (!json_is_number(v)) return KEY_ERR(MF_ERR_FORMAT, r, key, "expected a number, got %s", type_name(v));
  *out = json_number_value(v);
  return MF_OK;
}

static mf_status read_number(const reader *r, const char *key, double *out, int *present) {
  const json_t *v = get(r, key);
  if (present) *present = v != NULL;
  return v ? number_value(r, key, v, out) : MF_OK;
}

static mf_status read_bool(const reader *r, const char *key, int *out) {
  const json_t *v = get(r, key);
  if (!v) return MF_OK;
  if (!json_is_boolean(v))
    return KEY_ERR(MF_ERR_FORMAT, r, key, "expected true or false, got %s", type_name(v));
  *out = json_is_true(v);
  return MF_OK;
}

static const char *supported_architectures(char *buf, size_t cap) {
  size_t n = 0;
  buf[0] = 0;
  for (int f = 1; f < MF_FAMILY_COUNT_; f++)
    n += (size_t)snprintf(buf + n, n < cap ? cap - n : 0, "%s%s", f > 1 ? ", " : "",
                          mf_family_architecture((mf_family)f));
  return buf;
}

static const char *supported_model_types(char *buf, size_t cap) {
  size_t n = 0;
  buf[0] = 0;
  for (int f = 1; f < MF_FAMILY_COUNT_; f++)
    n += (size_t)snprintf(buf + n, n < cap ? cap - n : 0, "%s%s", f > 1 ? ", " : "",
                          mf_family_model_type((mf_family)f));
  return buf;
}

static mf_family family_from_model_type(const char *t) {
  for (int f = 1; f < MF_FAMILY_COUNT_; f++)
    if (strcmp(t, mf_family_model_type((mf_family)f)) == 0) return (mf_family)f;
  return MF_FAMILY_INVALID;
}

/* architectures[0] decides (it names the class transformers instantiates);
 * model_type picks the config class, so when both are given they must agree. */
static mf_status detect_family(reader *r) {
  char clean[96], list[160];
  const json_t *archs = get(r, "architectures");
  const json_t *mt = get(r, "model_type");
  mf_family from_arch = MF_FAMILY_INVALID, from_type = MF_FAMILY_INVALID;
  if (archs && !json_is_null(archs)) {
    if (!json_is_array(archs))
      return KEY_ERR(MF_ERR_FORMAT, r, "architectures", "expected an array of strings, got %s",
                     type_name(archs));
    if (json_array_size(archs) > 0) {
      const json_t *a0 = json_array_get(archs, 0);
      if (!json_is_string(a0))
        return KEY_ERR(MF_ERR_FORMAT, r, "architectures[0]", "expected a string, got %s", type_name(a0));
      from_arch = mf_family_from_architecture(json_string_value(a0));
      if (from_arch == MF_FAMILY_INVALID)
        return KEY_ERR(MF_ERR_UNSUPPORTED, r, "architectures[0]",
                       "'%s' is not a supported architecture (supported: %s)",
                       printable(json_string_value(a0), clean, sizeof clean),
                       supported_architectures(list, sizeof list));
    }
  }
  if (mt && !json_is_null(mt)) {
    if (!json_is_string(mt))
      return KEY_ERR(MF_ERR_FORMAT, r, "model_type", "expected a string, got %s", type_name(mt));
    from_type = family_from_model_type(json_string_value(mt));
    if (from_arch != MF_FAMILY_INVALID && from_type != from_arch)
      return KEY_ERR(MF_ERR_FORMAT, r, "model_type",
                     "'%s' does not match architectures[0] %s (model_type '%s')",
                     printable(json_string_value(mt), clean, sizeof clean), mf_family_architecture(from_arch),
                     mf_family_model_type(from_arch));
    if (from_arch == MF_FAMILY_INVALID && from_type == MF_FAMILY_INVALID)
      return KEY_ERR(
          MF_ERR_UNSUPPORTED, r, "model_type", "'%s' is not a supported model type (supported: %s)",
          printable(json_string_value(mt), clean, sizeof clean), supported_model_types(list, sizeof list));
  }
  r->family = from_arch != MF_FAMILY_INVALID ? from_arch : from_type;
  if (r->family == MF_FAMILY_INVALID)
    return MF_ERR(MF_ERR_FORMAT,
                  "%s: neither architectures nor model_type is set; cannot tell the model family", r->where);
  return MF_OK;
}

/* rope_scaling / rope_parameters carry a rope_type ("type" in old configs);
 * only "default" is plain RoPE. */
static mf_status check_rope_type(const reader *r, const char *key, const json_t *obj) {
  char clean[64];
  const json_t *t = json_object_get(obj, "rope_type");
  if (!t) t = json_object_get(obj, "type");
  if (!t) return KEY_ERR(MF_ERR_FORMAT, r, key, "has no rope_type");
  if (!json_is_string(t))
    return KEY_ERR(MF_ERR_FORMAT, r, key, "rope_type must be a string, got %s", type_name(t));
  if (strcmp(json_string_value(t), "default") != 0)
    return KEY_ERR(MF_ERR_UNSUPPORTED, r, key,
                   "rope_type '%s' is not supported (moefit implements plain RoPE only)",
                   printable(json_string_value(t), clean, sizeof clean));
  return MF_OK;
}

static mf_status check_partial_rotary(const reader *r, const char *key, const json_t *v) {
  double f;
  if (!v) return MF_OK;
  MF_CHECK(number_value(r, key, v, &f));
  if (f != 1.0)
    return KEY_ERR(MF_ERR_UNSUPPORTED, r, key, "%g is not supported (RoPE on a part of each head)", f);
  return MF_OK;
}

/* Keys every family reads that would change the maths in ways moefit does not implement. */
static mf_status check_unsupported(const reader *r) {
  char clean[64];
  const json_t *v;
  if ((v = get(r, "rope_scaling")) && !json_is_null(v)) {
    if (!json_is_object(v))
      return KEY_ERR(MF_ERR_FORMAT, r, "rope_scaling", "expected an object or null, got %s", type_name(v));
    MF_CHECK(check_rope_type(r, "rope_scaling", v));
  }
  MF_CHECK(check_partial_rotary(r, "partial_rotary_factor", get(r, "partial_rotary_factor")));
  if ((v = get(r, "quantization_config")) && !json_is_null(v))
    return KEY_ERR(MF_ERR_UNSUPPORTED, r, "quantization_config", "quantized checkpoints are not supported");
  if ((v = get(r, "hidden_act"))) {
    if (!json_is_string(v))
      return KEY_ERR(MF_ERR_FORMAT, r, "hidden_act", "expected a string, got %s", type_name(v));
    const char *act = json_string_value(v);
    if (strcmp(act, "silu") != 0 && strcmp(act, "swish") != 0)
      return KEY_ERR(MF_ERR_UNSUPPORTED, r, "hidden_act",
                     "'%s' is not supported (moefit's MLPs are SwiGLU: silu)",
                     printable(act, clean, sizeof clean));
  }
  if ((v = get(r, "attention_dropout"))) {
    double p;
    MF_CHECK(number_value(r, "attention_dropout", v, &p));
    if (p < 0 || p >= 1) return KEY_ERR(MF_ERR_FORMAT, r, "attention_dropout", "%g is not in [0, 1)", p);
    if (p > 0)
      return KEY_ERR(MF_ERR_UNSUPPORTED, r, "attention_dropout", "%g: attention dropout is not supported", p);
  }
  return MF_OK;
}

/* transformers 4.5x: Mixtral/OLMoE replace a None num_key_value_heads by
 * num_attention_heads in the config; Qwen keeps None and fails to build. */
static mf_status read_kv_heads(const reader *r, mf_model_spec *s) {
  const json_t *v = get(r, "num_key_value_heads");
  const int null_means_heads = r->family == MF_FAMILY_MIXTRAL || r->family == MF_FAMILY_OLMOE;
  if (!v) {
    if (r->family == MF_FAMILY_OLMOE) s->kv_heads = s->heads; /* OlmoeConfig default is None */
    return MF_OK;
  }
  if (json_is_null(v)) {
    if (!null_means_heads)
      return KEY_ERR(MF_ERR_FORMAT, r, "num_key_value_heads",
                     "null is not allowed for %s (transformers keeps None and cannot build the model)",
                     mf_family_name(r->family));
    s->kv_heads = s->heads;
    return MF_OK;
  }
  return int_value(r, "num_key_value_heads", v, 1, 4096, &s->kv_heads);
}

/* head_dim as each family's attention computes it (modeling_*.py, 4.57):
 *   mixtral:   getattr(config, "head_dim", None) or hidden_size // num_attention_heads
 *   qwen3_moe: getattr(config, "head_dim", hidden_size // num_attention_heads)
 *   qwen2_moe: the same, and it raises unless head_dim * heads == hidden_size
 *   olmoe:     hidden_size // num_heads (but RoPE reads config.head_dim when set) */
static mf_status read_head_dim(const reader *r, mf_model_spec *s) {
  const json_t *v = get(r, "head_dim");
  const int64_t derived = s->hidden / s->heads;
  int64_t hd = derived;
  int explicit_hd = 0;
  if (r->family == MF_FAMILY_QWEN2_MOE || r->family == MF_FAMILY_OLMOE) {
    if (s->hidden % s->heads != 0)
      return KEY_ERR(MF_ERR_FORMAT, r, "num_attention_heads", "%lld does not divide hidden_size (%lld)",
                     (long long)s->heads, (long long)s->hidden);
  }
  if (v && json_is_null(v)) {
    if (r->family == MF_FAMILY_QWEN2_MOE || r->family == MF_FAMILY_QWEN3_MOE)
      return KEY_ERR(MF_ERR_FORMAT, r, "head_dim", "null is not allowed for %s (leave it out to mean %lld)",
                     mf_family_name(r->family), (long long)derived);
  } else if (v) {
    MF_CHECK(int_value(r, "head_dim", v, r->family == MF_FAMILY_MIXTRAL ? 0 : 1, 65536, &hd));
    if (hd == 0)
      hd = derived; /* Mixtral's `or` */
    else
      explicit_hd = 1;
    if ((r->family == MF_FAMILY_QWEN2_MOE || r->family == MF_FAMILY_OLMOE) && hd != derived)
      return KEY_ERR(MF_ERR_UNSUPPORTED, r, "head_dim",
                     "%lld differs from hidden_size / num_attention_heads (%lld), which %s requires",
                     (long long)hd, (long long)derived, mf_family_name(r->family));
  }
  if (hd <= 0)
    return KEY_ERR(MF_ERR_FORMAT, r, "num_attention_heads", "%lld heads leave no room in hidden_size %lld",
                   (long long)s->heads, (long long)s->hidden);
  if (hd % 2 != 0)
    return explicit_hd
               ? KEY_ERR(MF_ERR_FORMAT, r, "head_dim", "%lld is odd; RoPE needs an even head_dim",
                         (long long)hd)
               : KEY_ERR(MF_ERR_FORMAT, r, "num_attention_heads",
                         "hidden_size / num_attention_heads = %lld is odd; RoPE needs an even head_dim",
                         (long long)hd);
  s->head_dim = hd;
  return MF_OK;
}

static mf_status read_rope_theta(const reader *r, mf_model_spec *s) {
  int has_theta = 0;
  double theta = s->rope_theta;
  MF_CHECK(read_number(r, "rope_theta", &theta, &has_theta));
  /* transformers v5 writes rope_parameters {rope_type, rope_theta, ...}. */
  const json_t *rp = get(r, "rope_parameters");
  if (rp && !json_is_null(rp)) {
    if (!json_is_object(rp))
      return KEY_ERR(MF_ERR_FORMAT, r, "rope_parameters", "expected an object or null, got %s",
                     type_name(rp));
    MF_CHECK(check_rope_type(r, "rope_parameters", rp));
    MF_CHECK(check_partial_rotary(r, "rope_parameters.partial_rotary_factor",
                                  json_object_get(rp, "partial_rotary_factor")));
    const json_t *t = json_object_get(rp, "rope_theta");
    if (t) {
      double t2;
      MF_CHECK(number_value(r, "rope_parameters.rope_theta", t, &t2));
      if (has_theta && t2 != theta)
        return KEY_ERR(MF_ERR_FORMAT, r, "rope_parameters.rope_theta", "%g disagrees with rope_theta (%g)",
                       t2, theta);
      theta = t2;
    }
  }
  if (!(theta > 0)) return KEY_ERR(MF_ERR_FORMAT, r, "rope_theta", "%g must be positive", theta);
  s->rope_theta = theta;
  return MF_OK;
}

static mf_status read_mlp_only_layers(const reader *r, mf_model_spec *s) {
  const json_t *v = get(r, "mlp_only_layers");
  s->n_mlp_only = 0;
  if (!v || json_is_null(v)) return MF_OK; /* transformers: None -> [] */
  if (!json_is_array(v))
    return KEY_ERR(MF_ERR_FORMAT, r, "mlp_only_layers", "expected an array of layer indices, got %s",
                   type_name(v));
  size_t n = json_array_size(v);
  if (n > MF_MAX_LAYERS)
    return KEY_ERR(MF_ERR_FORMAT, r, "mlp_only_layers", "%zu entries; at most %d are supported", n,
                   MF_MAX_LAYERS);
  for (size_t i = 0; i < n; i++) {
    char key[48];
    int64_t layer = 0;
    snprintf(key, sizeof key, "mlp_only_layers[%zu]", i);
    MF_CHECK(int_value(r, key, json_array_get(v, i), 0, s->layers - 1, &layer));
    s->mlp_only_layers[i] = (int32_t)layer;
  }
  s->n_mlp_only = (int64_t)n;
  return MF_OK;
}

static mf_status read_use_sliding_window(const reader *r) {
  int sw = 0;
  MF_CHECK(read_bool(r, "use_sliding_window", &sw));
  if (sw)
    return KEY_ERR(MF_ERR_UNSUPPORTED, r, "use_sliding_window", "sliding-window attention is not supported");
  return MF_OK;
}

static mf_status read_attention_bias(const reader *r) {
  int bias = 0;
  MF_CHECK(read_bool(r, "attention_bias", &bias));
  if (bias)
    return KEY_ERR(MF_ERR_UNSUPPORTED, r, "attention_bias",
                   "attention projections with bias are not supported for %s", mf_family_name(r->family));
  return MF_OK;
}

static const int64_t k_max_dim = (int64_t)1 << 24;

static mf_status read_family(const reader *r, mf_model_spec *s) {
  const json_t *v;
  switch (r->family) {
    case MF_FAMILY_MIXTRAL:
      MF_CHECK(require(r, "intermediate_size"));
      MF_CHECK(require(r, "num_local_experts"));
      MF_CHECK(read_int(r, "intermediate_size", 1, k_max_dim, &s->expert_ffn));
      MF_CHECK(read_int(r, "num_local_experts", 1, 65536, &s->experts));
      if ((v = get(r, "router_jitter_noise"))) {
        MF_CHECK(number_value(r, "router_jitter_noise", v, &s->router_jitter));
        if (!(s->router_jitter >= 0 && s->router_jitter < 1))
          return KEY_ERR(MF_ERR_FORMAT, r, "router_jitter_noise", "%g is not in [0, 1)", s->router_jitter);
      }
      if ((v = get(r, "sliding_window")) && !json_is_null(v)) {
        if (!json_is_integer(v))
          return KEY_ERR(MF_ERR_FORMAT, r, "sliding_window", "expected an integer or null, got %s",
                         type_name(v));
        return KEY_ERR(MF_ERR_UNSUPPORTED, r, "sliding_window",
                       "%lld: sliding-window attention is not supported (set it to null)",
                       (long long)json_integer_value(v));
      }
      s->norm_topk_prob = 1; /* Mixtral always renormalises; a norm_topk_prob key is not read */
      break;
    case MF_FAMILY_QWEN2_MOE:
    case MF_FAMILY_QWEN3_MOE:
      MF_CHECK(require(r, "intermediate_size"));
      MF_CHECK(require(r, "moe_intermediate_size"));
      MF_CHECK(require(r, "num_experts"));
      MF_CHECK(read_int(r, "intermediate_size", 0, k_max_dim, &s->dense_ffn));
      MF_CHECK(read_int(r, "moe_intermediate_size", 1, k_max_dim, &s->expert_ffn));
      MF_CHECK(read_int(r, "num_experts", 1, 65536, &s->experts));
      MF_CHECK(read_int(r, "decoder_sparse_step", 1, MF_MAX_LAYERS, &s->decoder_sparse_step));
      MF_CHECK(read_bool(r, "norm_topk_prob", &s->norm_topk_prob));
      MF_CHECK(read_mlp_only_layers(r, s));
      MF_CHECK(read_use_sliding_window(r));
      if (r->family == MF_FAMILY_QWEN2_MOE) {
        MF_CHECK(require(r, "shared_expert_intermediate_size"));
        MF_CHECK(read_int(r, "shared_expert_intermediate_size", 1, k_max_dim, &s->shared_ffn));
        MF_CHECK(read_bool(r, "qkv_bias", &s->qkv_bias));
      } else {
        MF_CHECK(read_attention_bias(r));
      }
      break;
    case MF_FAMILY_OLMOE:
      MF_CHECK(require(r, "intermediate_size"));
      MF_CHECK(require(r, "num_experts"));
      MF_CHECK(read_int(r, "intermediate_size", 1, k_max_dim, &s->expert_ffn));
      MF_CHECK(read_int(r, "num_experts", 1, 65536, &s->experts));
      MF_CHECK(read_bool(r, "norm_topk_prob", &s->norm_topk_prob));
      MF_CHECK(read_attention_bias(r));
      if ((v = get(r, "clip_qkv")) && !json_is_null(v)) {
        /* transformers clamps to [-clip_qkv, clip_qkv] whenever it is not None: 0 would zero q, k, v */
        MF_CHECK(number_value(r, "clip_qkv", v, &s->clip_qkv));
        if (!(s->clip_qkv > 0))
          return KEY_ERR(MF_ERR_FORMAT, r, "clip_qkv", "%g must be positive (or null for no clipping)",
                         s->clip_qkv);
      }
      break;
    default:
      return MF_ERR(MF_ERR_INTERNAL, "%s: no reader for family %d", r->where, (int)r->family);
  }
  return MF_OK;
}

static mf_status parse_root(reader *r, mf_model_spec *s) {
  if (!json_is_object(r->root))
    return MF_ERR(MF_ERR_FORMAT, "%s: the top level must be a JSON object, got %s", r->where,
                  type_name(r->root));
  MF_CHECK(detect_family(r));
  mf_model_spec_defaults(r->family, s);

  static const char *const required[] = {"hidden_size", "num_hidden_layers", "num_attention_heads",
                                         "vocab_size"};
  for (size_t i = 0; i < sizeof required / sizeof required[0]; i++) MF_CHECK(require(r, required[i]));
  MF_CHECK(read_int(r, "hidden_size", 1, k_max_dim, &s->hidden));
  MF_CHECK(read_int(r, "num_hidden_layers", 1, MF_MAX_LAYERS, &s->layers));
  MF_CHECK(read_int(r, "num_attention_heads", 1, 4096, &s->heads));
  MF_CHECK(read_kv_heads(r, s));
  MF_CHECK(read_int(r, "vocab_size", 1, (int64_t)1 << 31, &s->vocab));
  MF_CHECK(read_int(r, "max_position_embeddings", 1, (int64_t)1 << 40, &s->max_seq));
  MF_CHECK(read_int(r, "num_experts_per_tok", 1, 65536, &s->top_k));
  MF_CHECK(read_bool(r, "tie_word_embeddings", &s->tie_embeddings));
  MF_CHECK(read_rope_theta(r, s));
  MF_CHECK(read_number(r, "rms_norm_eps", &s->norm_eps, NULL));
  if (!(s->norm_eps > 0 && s->norm_eps < 1))
    return KEY_ERR(MF_ERR_FORMAT, r, "rms_norm_eps", "%g is not in (0, 1)", s->norm_eps);
  MF_CHECK(read_number(r, "router_aux_loss_coef", &s->router_aux_loss_coef, NULL));
  if (!(s->router_aux_loss_coef >= 0))
    return KEY_ERR(MF_ERR_FORMAT, r, "router_aux_loss_coef", "%g must not be negative",
                   s->router_aux_loss_coef);
  MF_CHECK(check_unsupported(r));
  MF_CHECK(read_family(r, s));
  MF_CHECK(read_head_dim(r, s));

  if (s->heads % s->kv_heads != 0)
    return KEY_ERR(MF_ERR_FORMAT, r, "num_key_value_heads", "%lld does not divide num_attention_heads (%lld)",
                   (long long)s->kv_heads, (long long)s->heads);
  if (s->top_k > s->experts)
    return KEY_ERR(MF_ERR_FORMAT, r, "num_experts_per_tok", "%lld exceeds %s (%lld)", (long long)s->top_k,
                   r->family == MF_FAMILY_MIXTRAL ? "num_local_experts" : "num_experts",
                   (long long)s->experts);
  for (int64_t l = 0; l < s->layers; l++)
    if (!mf_model_spec_layer_is_moe(s, l) && s->dense_ffn <= 0)
      return KEY_ERR(MF_ERR_FORMAT, r, "intermediate_size",
                     "must be positive: layer %lld is a dense MLP (mlp_only_layers / decoder_sparse_step)",
                     (long long)l);
  MF_CHECK(mf_model_spec_validate(s, r->where));
  return MF_OK;
}

mf_status mf_hf_config_parse(const char *text, size_t len, const char *where, mf_model_spec *out) {
  if (!text || !out) return MF_ERR(MF_ERR_INVALID_ARG, "mf_hf_config_parse: NULL argument");
  reader r = {.where = where ? where : "config.json", .root = NULL, .family = MF_FAMILY_INVALID};
  json_error_t jerr;
  r.root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
  if (!r.root) {
    char clean[JSON_ERROR_TEXT_LENGTH];
    return MF_ERR(MF_ERR_FORMAT, "%s: line %d, column %d: invalid JSON: %s", r.where, jerr.line, jerr.column,
                  printable(jerr.text, clean, sizeof clean));
  }
  mf_model_spec spec;
  mf_status st = parse_root(&r, &spec);
  json_decref(r.root);
  if (st == MF_OK) *out = spec;
  return st;
}

/* Reads a whole regular file of at most MF_HF_CONFIG_MAX_BYTES. */
static mf_status read_file(const char *path, char **out, size_t *out_len) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return MF_ERR(MF_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
  struct stat st;
  mf_status s = MF_OK;
  char *buf = NULL;
  if (fstat(fd, &st) != 0) {
    s = MF_ERR(MF_ERR_IO, "%s: cannot stat: %s", path, strerror(errno));
    goto done;
  }
  if (!S_ISREG(st.st_mode)) {
    s = MF_ERR(MF_ERR_IO, "%s: not a regular file", path);
    goto done;
  }
  if ((size_t)st.st_size > MF_HF_CONFIG_MAX_BYTES) {
    s = MF_ERR(MF_ERR_FORMAT, "%s: %lld bytes is too large for a config.json (at most %zu)", path,
               (long long)st.st_size, MF_HF_CONFIG_MAX_BYTES);
    goto done;
  }
  size_t cap = (size_t)st.st_size, len = 0;
  MF_CHECK_GOTO(mf_malloc(cap + 1, path, (void **)&buf), s, done);
  while (len < cap) {
    ssize_t n = read(fd, buf + len, cap - len);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      s = MF_ERR(MF_ERR_IO, "%s: read failed: %s", path, strerror(errno));
      goto done;
    }
    if (n == 0) break; /* shrank under us: parse what is there */
    len += (size_t)n;
  }
  buf[len] = 0;
  *out = buf;
  *out_len = len;
  buf = NULL;
done:
  free(buf);
  close(fd);
  return s;
}

mf_status mf_hf_config_load(const char *path, mf_model_spec *out) {
  if (!path || !out) return MF_ERR(MF_ERR_INVALID_ARG, "mf_hf_config_load: NULL argument");
  struct stat st;
  if (stat(path, &st) != 0) return MF_ERR(MF_ERR_IO, "%s: %s", path, strerror(errno));
  char *file = NULL;
  if (S_ISDIR(st.st_mode)) {
    size_t n = strlen(path) + sizeof "/config.json";
    MF_CHECK(mf_malloc(n, "a config.json path", (void **)&file));
    snprintf(file, n, "%s/config.json", path);
  }
  const char *name = file ? file : path;
  char *text = NULL;
  size_t len = 0;
  mf_status s = read_file(name, &text, &len);
  if (s == MF_OK) s = mf_hf_config_parse(text, len, name, out);
  free(text);
  free(file);
  return s;
}

/* -------------------------------------------------------------- writing */

/* What Python's json.dumps writes for a float (its repr): the shortest digits
 * that read back exactly; fixed notation for exponents -4..15, else 1e-05. */
static void format_double(double x, char *buf, size_t cap) {
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

static void add_raw(entries *es, const char *key, const char *json) {
  snprintf(add(es, key)->small, sizeof es->e[0].small, "%s", json);
}
static void add_int(entries *es, const char *key, int64_t v) {
  snprintf(add(es, key)->small, sizeof es->e[0].small, "%lld", (long long)v);
}
static void add_real(entries *es, const char *key, double v) {
  format_double(v, add(es, key)->small, sizeof es->e[0].small);
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
  const int all_moe = f == MF_FAMILY_MIXTRAL || f == MF_FAMILY_OLMOE;
  const mf_qk_norm qk = f == MF_FAMILY_QWEN3_MOE ? MF_QK_NORM_PER_HEAD
                        : f == MF_FAMILY_OLMOE   ? MF_QK_NORM_FULL
                                                 : MF_QK_NORM_NONE;
  if (s->qk_norm != qk)
    return UNSUP(s, "qk_norm", "%d is not this family's qk-norm (%d)", (int)s->qk_norm, (int)qk);
  if (s->qkv_bias && f != MF_FAMILY_QWEN2_MOE) return UNSUP(s, "qkv_bias", "only qwen2_moe has q/k/v biases");
  if (s->router_jitter != 0 && f != MF_FAMILY_MIXTRAL)
    return UNSUP(s, "router_jitter", "only mixtral has router jitter");
  if (s->clip_qkv != 0 && f != MF_FAMILY_OLMOE) return UNSUP(s, "clip_qkv", "only olmoe clips q, k and v");
  if (f == MF_FAMILY_MIXTRAL && !s->norm_topk_prob)
    return UNSUP(s, "norm_topk_prob", "mixtral always renormalises the top-k weights");
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
  return a->family == b->family && a->hidden == b->hidden && a->layers == b->layers && a->heads == b->heads &&
         a->kv_heads == b->kv_heads && a->head_dim == b->head_dim && a->experts == b->experts &&
         a->top_k == b->top_k && a->expert_ffn == b->expert_ffn && a->dense_ffn == b->dense_ffn &&
         a->shared_ffn == b->shared_ffn && a->vocab == b->vocab && a->max_seq == b->max_seq &&
         a->rope_theta == b->rope_theta && a->norm_eps == b->norm_eps &&
         a->router_aux_loss_coef == b->router_aux_loss_coef && a->router_jitter == b->router_jitter &&
         a->clip_qkv == b->clip_qkv && !a->norm_topk_prob == !b->norm_topk_prob &&
         !a->tie_embeddings == !b->tie_embeddings && !a->qkv_bias == !b->qkv_bias &&
         a->qk_norm == b->qk_norm && a->decoder_sparse_step == b->decoder_sparse_step;
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
  add_raw(&es, "rope_scaling", "null");
  add_real(&es, "rms_norm_eps", s->norm_eps);
  add_real(&es, "router_aux_loss_coef", s->router_aux_loss_coef);
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

/* tmp file in the same directory, fsync, rename over `path`, fsync the directory. */
static mf_status write_atomic(const char *path, const char *text, size_t len) {
  mf_status st = MF_OK;
  size_t n = strlen(path) + sizeof ".tmp.XXXXXX";
  char *tmp = NULL, *dir = NULL;
  int fd = -1;
  MF_CHECK(mf_malloc(n, "a temporary file name", (void **)&tmp));
  snprintf(tmp, n, "%s.tmp.XXXXXX", path);
  fd = mkstemp(tmp);
  if (fd < 0) {
    st = MF_ERR(MF_ERR_IO, "%s: cannot create a temporary file: %s", tmp, strerror(errno));
    free(tmp);
    return st;
  }
  if (fchmod(fd, 0644) != 0) {
    st = MF_ERR(MF_ERR_IO, "%s: chmod failed: %s", tmp, strerror(errno));
    goto fail;
  }
  for (size_t off = 0; off < len;) {
    ssize_t w = write(fd, text + off, len - off);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) {
      st = MF_ERR(MF_ERR_IO, "%s: write failed: %s", tmp, strerror(errno));
      goto fail;
    }
    off += (size_t)w;
  }
  if (fsync(fd) != 0) {
    st = MF_ERR(MF_ERR_IO, "%s: fsync failed: %s", tmp, strerror(errno));
    goto fail;
  }
  if (close(fd) != 0) {
    fd = -1;
    st = MF_ERR(MF_ERR_IO, "%s: close failed: %s", tmp, strerror(errno));
    goto fail;
  }
  fd = -1;
  if (rename(tmp, path) != 0) {
    st = MF_ERR(MF_ERR_IO, "%s: cannot rename %s into place: %s", path, tmp, strerror(errno));
    goto fail;
  }
  dir = mf_strdup(path);
  if (dir) {
    int dfd = open(dirname(dir), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
      (void)fsync(dfd); /* the rename is done; a failed directory sync is not worth failing for */
      close(dfd);
    }
  }
  free(dir);
  free(tmp);
  return MF_OK;
fail:
  if (fd >= 0) close(fd);
  unlink(tmp);
  free(tmp);
  return st;
}

mf_status mf_hf_config_write_dtype(const mf_model_spec *s, mf_dtype dtype, const char *path) {
  if (!s || !path) return MF_ERR(MF_ERR_INVALID_ARG, "mf_hf_config_write: NULL argument");
  char *text = NULL, *file = NULL;
  struct stat st;
  if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) {
    size_t n = strlen(path) + sizeof "/config.json";
    MF_CHECK(mf_malloc(n, "a config.json path", (void **)&file));
    snprintf(file, n, "%s/config.json", path);
  }
  const char *name = file ? file : path;
  mf_status s_ = mf_hf_config_format(s, dtype, &text);
  if (s_ != MF_OK)
    mf_error_prefix("%s", name); /* I/O errors below name the file themselves */
  else
    s_ = write_atomic(name, text, strlen(text));
  free(text);
  free(file);
  return s_;
}

mf_status mf_hf_config_write(const mf_model_spec *s, const char *path) {
  return mf_hf_config_write_dtype(s, MF_DTYPE_F32, path);
}
