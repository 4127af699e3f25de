/*
 * HF config.json -> mf_model_spec. The rules (which keys each family reads,
 * which are required, what is refused) are in hf_config.h; the transformers
 * lines they follow are quoted where it matters. The writer is
 * hf_config_write.c.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <jansson.h>

#include "src/io/json_util.h"
#include "src/model/hf_config.h"
#include "src/model/hf_config_impl.h"

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

/* A boolean is "a boolean" here: messages say "expected X, got a boolean". */
static const char *type_name(const json_t *v) {
  return mf_io_json_kind(v, 0);
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
    mf_hf_format_double(json_real_value(v), num, sizeof num);
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

/* "A, B, C": name(f) for every family, for "supported: ..." in messages. */
static const char *family_list(const char *(*name)(mf_family), char *buf, size_t cap) {
  size_t n = 0;
  buf[0] = 0;
  for (int f = 1; f < MF_FAMILY_COUNT_; f++)
    n += (size_t)snprintf(buf + n, n < cap ? cap - n : 0, "%s%s", f > 1 ? ", " : "", name((mf_family)f));
  return buf;
}

static mf_family family_from_model_type(const char *t) {
  for (int f = 1; f < MF_FAMILY_COUNT_; f++)
    if (strcmp(t, mf_family_model_type((mf_family)f)) == 0) return (mf_family)f;
  /* Kimi-K2's config.json names its own model_type (remote code) over
   * DeepseekV3ForCausalLM's architecture, the model transformers builds */
  if (strcmp(t, "kimi_k2") == 0) return MF_FAMILY_DEEPSEEK_V3;
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
                       family_list(mf_family_architecture, list, sizeof list));
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
      return KEY_ERR(MF_ERR_UNSUPPORTED, r, "model_type",
                     "'%s' is not a supported model type (supported: %s)",
                     printable(json_string_value(mt), clean, sizeof clean),
                     family_list(mf_family_model_type, list, sizeof list));
  }
  r->family = from_arch != MF_FAMILY_INVALID ? from_arch : from_type;
  if (r->family == MF_FAMILY_INVALID)
    return MF_ERR(MF_ERR_FORMAT,
                  "%s: neither architectures nor model_type is set; cannot tell the model family", r->where);
  return MF_OK;
}

/* rope_scaling / rope_parameters carry a rope_type ("type" in old configs);
 * only "default" is plain RoPE. */
/* rope_scaling / rope_parameters (`key`, object obj) must have rope_type `want`
 * (the old "type" wins: the config classes copy it over "rope_type"); `why`
 * ends the message otherwise. */
static mf_status check_rope_type_is(const reader *r, const char *key, const json_t *obj, const char *want,
                                    const char *why) {
  char clean[64];
  const json_t *t = json_object_get(obj, "type");
  if (!t) t = json_object_get(obj, "rope_type");
  if (!t) return KEY_ERR(MF_ERR_FORMAT, r, key, "has no rope_type");
  if (!json_is_string(t))
    return KEY_ERR(MF_ERR_FORMAT, r, key, "rope_type must be a string, got %s", type_name(t));
  if (strcmp(json_string_value(t), want) != 0)
    return KEY_ERR(MF_ERR_UNSUPPORTED, r, key, "rope_type '%s' is not supported%s",
                   printable(json_string_value(t), clean, sizeof clean), why);
  return MF_OK;
}

static mf_status check_rope_type(const reader *r, const char *key, const json_t *obj) {
  return check_rope_type_is(r, key, obj, "default", " (moefit implements plain RoPE only)");
}

static mf_status check_partial_rotary(const reader *r, const char *key, const json_t *v) {
  double f;
  if (!v) return MF_OK;
  MF_CHECK(number_value(r, key, v, &f));
  if (f != 1.0)
    return KEY_ERR(MF_ERR_UNSUPPORTED, r, key, "%g is not supported (RoPE on a part of each head)", f);
  return MF_OK;
}

/* quantization_config quant_method "fp8" (DeepSeek-V3, the Qwen3-FP8
 * releases, transformers' FineGrainedFP8Config.to_dict): e4m3 weights in
 * 128 x 128 blocks; each key absent is FineGrainedFP8Config's default.
 * Activations stay in the run's precision ("dynamic" FP8 activations are an
 * inference kernel's choice; static input scales are refused). */
static mf_status read_fp8(const reader *r, const json_t *c, mf_hf_quant *q) {
  char clean[64];
  const json_t *f = json_object_get(c, "fmt"), *a = json_object_get(c, "activation_scheme"),
               *b = json_object_get(c, "weight_block_size");
  if (f && !(json_is_string(f) && strcmp(json_string_value(f), "e4m3") == 0))
    return KEY_ERR(MF_ERR_UNSUPPORTED, r, "quantization_config.fmt", "%s%s%s is not read; fp8 e4m3 is",
                   json_is_string(f) ? "'" : "",
                   json_is_string(f) ? printable(json_string_value(f), clean, sizeof clean) : type_name(f),
                   json_is_string(f) ? "'" : "");
  if (a && !(json_is_string(a) && strcmp(json_string_value(a), "dynamic") == 0))
    return KEY_ERR(MF_ERR_UNSUPPORTED, r, "quantization_config.activation_scheme",
                   "%s%s%s is not read; \"dynamic\" is (no stored activation scales)",
                   json_is_string(a) ? "'" : "",
                   json_is_string(a) ? printable(json_string_value(a), clean, sizeof clean) : type_name(a),
                   json_is_string(a) ? "'" : "");
  if (b && !(json_is_array(b) && json_array_size(b) == 2 && json_is_integer(json_array_get(b, 0)) &&
             json_is_integer(json_array_get(b, 1))))
    return KEY_ERR(MF_ERR_FORMAT, r, "quantization_config.weight_block_size", "expected [rows, cols], got %s",
                   type_name(b));
  if (b && (json_integer_value(json_array_get(b, 0)) != MF_FP8_BLOCK ||
            json_integer_value(json_array_get(b, 1)) != MF_FP8_BLOCK))
    return KEY_ERR(MF_ERR_UNSUPPORTED, r, "quantization_config.weight_block_size",
                   "[%lld, %lld] is not read; blocks of %d x %d are (DeepSeek-V3's, Qwen3-FP8's)",
                   (long long)json_integer_value(json_array_get(b, 0)),
                   (long long)json_integer_value(json_array_get(b, 1)), MF_FP8_BLOCK, MF_FP8_BLOCK);
  q->kind = MF_QUANT_FP8;
  snprintf(q->method, sizeof q->method, "fp8");
  return MF_OK;
}

/* quantization_config quant_method "mxfp4" (gpt-oss-20b and -120b as
 * published, transformers' Mxfp4Config.to_dict): the experts' gate_up_proj and
 * down_proj stored as e2m1 values in groups of 32 with an e8m0 scale each
 * (*_blocks, *_scales); modules_to_not_convert names what stays in the float
 * dtype (which tensors are stored so is the checkpoint's to say). The layout
 * is GptOssExperts', so it is read for gpt_oss only. */
static mf_status read_mxfp4(const reader *r, const json_t *c, mf_hf_quant *q) {
  if (r->family != MF_FAMILY_GPT_OSS)
    return KEY_ERR(MF_ERR_UNSUPPORTED, r, "quantization_config.quant_method",
                   "'mxfp4' is read for gpt_oss only (its experts' blocks and scales), not for %s",
                   mf_family_name(r->family));
  const json_t *m = json_object_get(c, "modules_to_not_convert");
  int ok = !m || json_is_null(m) || json_is_array(m);
  for (size_t i = 0; ok && json_is_array(m) && i < json_array_size(m); i++)
    ok = json_is_string(json_array_get(m, i));
  if (!ok)
    return KEY_ERR(MF_ERR_FORMAT, r, "quantization_config.modules_to_not_convert",
                   "expected an array of module names or null, got %s", type_name(m));
  q->kind = MF_QUANT_MXFP4;
  snprintf(q->method, sizeof q->method, "mxfp4");
  return MF_OK;
}

/* quantization_config: how the checkpoint stores its weights. bitsandbytes
 * 4-bit NF4 (transformers' BitsAndBytesConfig.to_dict; bnb_4bit_quant_type
 * absent is its default, fp4), fp8 (read_fp8) and gpt_oss's mxfp4
 * (read_mxfp4) are read as shipped; anything else is refused naming what it
 * is. */
static mf_status read_quant(const reader *r, mf_hf_quant *q) {
  static const char key[] = "quantization_config";
  char clean[64], k[96];
  memset(q, 0, sizeof *q);
  const json_t *c = get(r, key);
  if (!c || json_is_null(c)) return MF_OK;
  if (!json_is_object(c))
    return KEY_ERR(MF_ERR_FORMAT, r, key, "expected an object or null, got %s", type_name(c));
  const json_t *m = json_object_get(c, "quant_method");
  if (!m) return KEY_ERR(MF_ERR_FORMAT, r, key, "has no quant_method");
  if (!json_is_string(m))
    return KEY_ERR(MF_ERR_FORMAT, r, "quantization_config.quant_method", "expected a string, got %s",
                   type_name(m));
  const char *method = json_string_value(m);
  if (strcmp(method, "fp8") == 0) return read_fp8(r, c, q);
  if (strcmp(method, "mxfp4") == 0) return read_mxfp4(r, c, q);
  if (strcmp(method, "bitsandbytes") != 0)
    return KEY_ERR(
        MF_ERR_UNSUPPORTED, r, "quantization_config.quant_method",
        "'%s' checkpoints are not read (moefit reads bitsandbytes 4-bit nf4, fp8 e4m3 in 128 x 128 "
        "blocks and gpt_oss's mxfp4 as shipped); load the float checkpoint and set train.lora.base_dtype "
        "nf4 or fp8 to quantize it at load",
        printable(method, clean, sizeof clean));
  /* each flag: absent is BitsAndBytesConfig's default */
  static const char *const flags[] = {"load_in_4bit", "load_in_8bit", "bnb_4bit_use_double_quant"};
  int on[3] = {0, 0, 0};
  for (int i = 0; i < 3; i++) {
    const json_t *v = json_object_get(c, flags[i]);
    snprintf(k, sizeof k, "%s.%s", key, flags[i]);
    if (v && !json_is_boolean(v))
      return KEY_ERR(MF_ERR_FORMAT, r, k, "expected true or false, got %s", type_name(v));
    on[i] = v && json_is_true(v);
  }
  if (on[1])
    return KEY_ERR(
        MF_ERR_UNSUPPORTED, r, key,
        "bitsandbytes 8-bit (LLM.int8) checkpoints are not read; 4-bit nf4 ones are (load_in_4bit)");
  if (!on[0])
    return KEY_ERR(MF_ERR_FORMAT, r, key, "bitsandbytes with neither load_in_4bit nor load_in_8bit");
  const json_t *t = json_object_get(c, "bnb_4bit_quant_type");
  if (t && !json_is_string(t))
    return KEY_ERR(MF_ERR_FORMAT, r, "quantization_config.bnb_4bit_quant_type", "expected a string, got %s",
                   type_name(t));
  const char *type = t ? json_string_value(t) : "fp4";
  if (strcmp(type, "nf4") != 0)
    return KEY_ERR(MF_ERR_UNSUPPORTED, r, "quantization_config.bnb_4bit_quant_type",
                   "'%s'%s is not read; bitsandbytes nf4 is (QLoRA's 4-bit NormalFloat)",
                   printable(type, clean, sizeof clean), t ? "" : " (absent: BitsAndBytesConfig's default)");
  const json_t *s = json_object_get(c, "bnb_4bit_quant_storage");
  if (s && !json_is_null(s) && !(json_is_string(s) && strcmp(json_string_value(s), "uint8") == 0))
    return KEY_ERR(MF_ERR_UNSUPPORTED, r, "quantization_config.bnb_4bit_quant_storage",
                   "%s%s%s: the packed codes are read as uint8 only", json_is_string(s) ? "'" : "",
                   json_is_string(s) ? printable(json_string_value(s), clean, sizeof clean) : type_name(s),
                   json_is_string(s) ? "'" : "");
  q->kind = MF_QUANT_NF4;
  q->nested = on[2];
  snprintf(q->method, sizeof q->method, "bitsandbytes");
  return MF_OK;
}

/* Keys every family reads that would change the maths in ways moefit does not
 * implement; *q: how the weights are stored (read_quant). */
static mf_status check_unsupported(const reader *r, mf_hf_quant *q) {
  char clean[64];
  const json_t *v;
  if ((v = get(r, "rope_scaling")) && !json_is_null(v)) {
    if (!json_is_object(v))
      return KEY_ERR(MF_ERR_FORMAT, r, "rope_scaling", "expected an object or null, got %s", type_name(v));
    if (r->family != MF_FAMILY_DEEPSEEK_V3 && r->family != MF_FAMILY_GPT_OSS) /* they read yarn */
      MF_CHECK(check_rope_type(r, "rope_scaling", v));
  }
  if (r->family != MF_FAMILY_GLM4_MOE) /* glm4_moe reads it (read_family) */
    MF_CHECK(check_partial_rotary(r, "partial_rotary_factor", get(r, "partial_rotary_factor")));
  MF_CHECK(read_quant(r, q));
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
  const int null_means_heads = r->family == MF_FAMILY_MIXTRAL || r->family == MF_FAMILY_OLMOE ||
                               r->family == MF_FAMILY_DEEPSEEK_V3 || r->family == MF_FAMILY_GPT_OSS;
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
 *   olmoe:     hidden_size // num_heads (but RoPE reads config.head_dim when set)
 *   gpt_oss:   GptOssConfig's head_dim (absent: its default 64; null: hidden_size // num_attention_heads) */
static mf_status read_head_dim(const reader *r, mf_model_spec *s) {
  const json_t *v = get(r, "head_dim");
  const int64_t derived = s->hidden / s->heads;
  int64_t hd = r->family == MF_FAMILY_GPT_OSS ? s->head_dim : derived; /* absent: the default (64) */
  int explicit_hd = 0;
  if (r->family == MF_FAMILY_QWEN2_MOE || r->family == MF_FAMILY_OLMOE) {
    if (s->hidden % s->heads != 0)
      return KEY_ERR(MF_ERR_FORMAT, r, "num_attention_heads", "%lld does not divide hidden_size (%lld)",
                     (long long)s->heads, (long long)s->hidden);
  }
  if (v && json_is_null(v)) {
    if (r->family == MF_FAMILY_QWEN2_MOE || r->family == MF_FAMILY_QWEN3_MOE ||
        r->family == MF_FAMILY_GLM4_MOE)
      return KEY_ERR(MF_ERR_FORMAT, r, "head_dim", "null is not allowed for %s (leave it out to mean %lld)",
                     mf_family_name(r->family), (long long)derived);
    hd = derived;
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
    if (r->family != MF_FAMILY_GLM4_MOE) /* glm4_moe reads it (read_glm4_moe) */
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

/* Glm4MoeConfig (configuration_glm4_moe.py, 4.57): the router is sigmoid with
 * e_score_correction_bias and group-limited top-k; the shared experts are one
 * MLP of moe_intermediate_size * n_shared_experts with no gate; layers below
 * first_k_dense_replace are dense; RoPE rotates int(head_dim *
 * partial_rotary_factor) dims of each head. Its loss has no aux term, so
 * router_aux_loss_coef is not read (0). num_nextn_predict_layers (the
 * multi-token-prediction layer the checkpoints carry) is not part of the
 * model transformers builds, and not of moefit's. */
/* The MoE block GLM-4.5 and DeepSeek-V3 share (their config classes' keys):
 * the sigmoid group-limited router, the shared experts as one MLP of
 * moe_intermediate_size * n_shared_experts, dense layers below
 * first_k_dense_replace; no aux loss, so router_aux_loss_coef is not read
 * (0). num_nextn_predict_layers (the multi-token-prediction layer the
 * checkpoints carry) is no part of the model transformers builds, nor of
 * moefit's. */
static mf_status read_group_moe(const reader *r, mf_model_spec *s) {
  static const char *const required[] = {"intermediate_size", "moe_intermediate_size", "n_routed_experts"};
  for (size_t i = 0; i < sizeof required / sizeof required[0]; i++) MF_CHECK(require(r, required[i]));
  MF_CHECK(read_int(r, "intermediate_size", 0, k_max_dim, &s->dense_ffn));
  MF_CHECK(read_int(r, "moe_intermediate_size", 1, k_max_dim, &s->expert_ffn));
  MF_CHECK(read_int(r, "n_routed_experts", 1, 65536, &s->experts));
  int64_t n_shared = 1;
  MF_CHECK(read_int(r, "n_shared_experts", 0, 4096, &n_shared));
  s->shared_ffn = n_shared * s->expert_ffn;
  if (s->shared_ffn > k_max_dim)
    return KEY_ERR(MF_ERR_FORMAT, r, "n_shared_experts",
                   "%lld shared experts of %lld make an implausibly large MLP", (long long)n_shared,
                   (long long)s->expert_ffn);
  MF_CHECK(read_int(r, "n_group", 1, 65536, &s->n_group));
  MF_CHECK(read_int(r, "topk_group", 1, 65536, &s->topk_group));
  MF_CHECK(read_int(r, "first_k_dense_replace", 0, s->layers, &s->first_dense));
  MF_CHECK(read_number(r, "routed_scaling_factor", &s->routed_scaling, NULL));
  if (!(s->routed_scaling > 0 && s->routed_scaling <= 1e6))
    return KEY_ERR(MF_ERR_FORMAT, r, "routed_scaling_factor", "%g must be positive", s->routed_scaling);
  MF_CHECK(read_bool(r, "norm_topk_prob", &s->norm_topk_prob));
  s->router_aux_loss_coef = 0;
  if (s->experts % s->n_group != 0)
    return KEY_ERR(MF_ERR_FORMAT, r, "n_group", "%lld does not divide n_routed_experts (%lld)",
                   (long long)s->n_group, (long long)s->experts);
  if (s->topk_group > s->n_group)
    return KEY_ERR(MF_ERR_FORMAT, r, "topk_group", "%lld exceeds n_group (%lld)", (long long)s->topk_group,
                   (long long)s->n_group);
  return MF_OK;
}

/* Glm4MoeConfig (configuration_glm4_moe.py, 4.57): the group MoE block;
 * attention with q/k/v bias (attention_bias) and per-head q/k norms
 * (use_qk_norm); RoPE rotates int(head_dim * partial_rotary_factor) dims of
 * each head. */
static mf_status read_glm4_moe(const reader *r, mf_model_spec *s) {
  MF_CHECK(read_group_moe(r, s));
  MF_CHECK(read_bool(r, "attention_bias", &s->qkv_bias));
  int qk = 0;
  MF_CHECK(read_bool(r, "use_qk_norm", &qk));
  s->qk_norm = qk ? MF_QK_NORM_PER_HEAD : MF_QK_NORM_NONE;
  /* top level (4.5x), or in rope_parameters (v5); both: they must agree */
  const json_t *rp = get(r, "rope_parameters");
  const json_t *top = get(r, "partial_rotary_factor"),
               *in = json_is_object(rp) ? json_object_get(rp, "partial_rotary_factor") : NULL;
  double f[2] = {s->partial_rotary, s->partial_rotary};
  const char *const keys[2] = {"partial_rotary_factor", "rope_parameters.partial_rotary_factor"};
  const json_t *const vals[2] = {top, in};
  for (int i = 0; i < 2; i++) {
    if (!vals[i]) continue;
    MF_CHECK(number_value(r, keys[i], vals[i], &f[i]));
    if (!(f[i] > 0 && f[i] <= 1)) return KEY_ERR(MF_ERR_FORMAT, r, keys[i], "%g is not in (0, 1]", f[i]);
  }
  if (top && in && f[0] != f[1])
    return KEY_ERR(MF_ERR_FORMAT, r, keys[1], "%g disagrees with partial_rotary_factor (%g)", f[1], f[0]);
  s->partial_rotary = in ? f[1] : f[0];
  return MF_OK;
}

/* rope_scaling "yarn" (DeepSeek-V3, Kimi-K2, gpt-oss): factor required; the others
 * absent take _compute_yarn_parameters' defaults (original_max_position_embeddings:
 * max_position_embeddings; beta_fast 32, beta_slow 1; mscale, mscale_all_dim:
 * none); an explicit attention_factor is refused (not read). */
static mf_status read_yarn(const reader *r, const json_t *rs, mf_model_spec *s) {
  static const char *const names[] = {"factor", "beta_fast",      "beta_slow",
                                      "mscale", "mscale_all_dim", "original_max_position_embeddings"};
  double *const dst[] = {&s->yarn_factor, &s->yarn_beta_fast, &s->yarn_beta_slow, &s->yarn_mscale,
                         &s->yarn_mscale_all_dim};
  char key[96];
  s->yarn_beta_fast = 32, s->yarn_beta_slow = 1, s->yarn_mscale = 0, s->yarn_mscale_all_dim = 0;
  s->yarn_original_max = s->max_seq;
  s->yarn_truncate = 1;
  const json_t *tr = json_object_get(rs, "truncate");
  if (tr && !json_is_boolean(tr))
    return KEY_ERR(MF_ERR_FORMAT, r, "rope_scaling.truncate", "expected true or false, got %s",
                   type_name(tr));
  if (tr) s->yarn_truncate = json_is_true(tr);
  if (!json_object_get(rs, "factor"))
    return KEY_ERR(MF_ERR_FORMAT, r, "rope_scaling.factor", "missing (yarn needs it)");
  if (json_object_get(rs, "attention_factor"))
    return KEY_ERR(MF_ERR_UNSUPPORTED, r, "rope_scaling.attention_factor",
                   "is not read; YaRN's factor comes from mscale and mscale_all_dim");
  for (int i = 0; i < 6; i++) {
    const json_t *v = json_object_get(rs, names[i]);
    if (!v || json_is_null(v)) continue;
    snprintf(key, sizeof key, "rope_scaling.%s", names[i]);
    if (i == 5) {
      MF_CHECK(int_value(r, key, v, 1, (int64_t)1 << 40, &s->yarn_original_max));
      continue;
    }
    MF_CHECK(number_value(r, key, v, dst[i]));
  }
  if (!(s->yarn_factor > 1))
    return KEY_ERR(MF_ERR_FORMAT, r, "rope_scaling.factor", "%g: YaRN scales by a factor above 1",
                   s->yarn_factor);
  if (!(s->yarn_beta_fast > 0 && s->yarn_beta_slow > 0 && s->yarn_mscale >= 0 && s->yarn_mscale_all_dim >= 0))
    return KEY_ERR(MF_ERR_FORMAT, r, "rope_scaling",
                   "beta_fast %g, beta_slow %g must be positive, mscale %g and "
                   "mscale_all_dim %g not negative",
                   s->yarn_beta_fast, s->yarn_beta_slow, s->yarn_mscale, s->yarn_mscale_all_dim);
  return MF_OK;
}

/* DeepseekV3Config (configuration_deepseek_v3.py, 4.57): the group MoE block;
 * multi-head latent attention (q_lora_rank null: q_proj), RoPE on the last
 * qk_rope_head_dim dims of each q/k head (rope_interleave: adjacent pairs;
 * its default true), rope_scaling null or yarn. The config's head_dim is set
 * by the class (qk_rope_head_dim) and not read; moefit's head_dim is the q/k
 * head, qk_nope_head_dim + qk_rope_head_dim. topk_method and scoring_func are
 * not read by transformers' model (its router is noaux_tc's sigmoid) and not
 * here. */
static mf_status read_deepseek_v3(const reader *r, mf_model_spec *s) {
  MF_CHECK(read_group_moe(r, s));
  static const char *const required[] = {"kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim",
                                         "v_head_dim"};
  for (size_t i = 0; i < sizeof required / sizeof required[0]; i++) MF_CHECK(require(r, required[i]));
  const json_t *v = get(r, "q_lora_rank");
  if (v && json_is_null(v))
    s->q_lora_rank = 0; /* q_proj */
  else
    MF_CHECK(read_int(r, "q_lora_rank", 1, k_max_dim, &s->q_lora_rank));
  MF_CHECK(read_int(r, "kv_lora_rank", 1, k_max_dim, &s->kv_lora_rank));
  MF_CHECK(read_int(r, "qk_nope_head_dim", 0, 65536, &s->qk_nope_dim));
  MF_CHECK(read_int(r, "qk_rope_head_dim", 2, 65536, &s->qk_rope_dim));
  MF_CHECK(read_int(r, "v_head_dim", 1, 65536, &s->v_head_dim));
  if (s->qk_rope_dim % 2 != 0)
    return KEY_ERR(MF_ERR_FORMAT, r, "qk_rope_head_dim", "%lld is odd; RoPE rotates pairs",
                   (long long)s->qk_rope_dim);
  s->head_dim = s->qk_nope_dim + s->qk_rope_dim;
  MF_CHECK(read_bool(r, "rope_interleave", &s->rope_interleave));
  int bias = 0;
  MF_CHECK(read_bool(r, "attention_bias", &bias));
  if (bias)
    return KEY_ERR(MF_ERR_UNSUPPORTED, r, "attention_bias",
                   "latent attention projections with bias are not supported (DeepSeek-V3's have none)");
  if (!get(r, "num_key_value_heads")) s->kv_heads = s->heads; /* a key and a value per head */
  /* DeepseekV3Config sets head_dim = qk_rope_head_dim and qk_head_dim = nope + rope; a file's own values
   * override them, and a model built with others fails in transformers */
  int64_t hd = s->qk_rope_dim, qhd = s->head_dim;
  MF_CHECK(read_int(r, "head_dim", 1, 65536, &hd));
  MF_CHECK(read_int(r, "qk_head_dim", 1, 65536, &qhd));
  if (hd != s->qk_rope_dim)
    return KEY_ERR(MF_ERR_FORMAT, r, "head_dim", "%lld: DeepSeek-V3's head_dim is qk_rope_head_dim (%lld)",
                   (long long)hd, (long long)s->qk_rope_dim);
  if (qhd != s->head_dim)
    return KEY_ERR(MF_ERR_FORMAT, r, "qk_head_dim", "%lld is not qk_nope_head_dim + qk_rope_head_dim (%lld)",
                   (long long)qhd, (long long)s->head_dim);
  /* rope_scaling: null or yarn (another type changes the softmax scale in transformers too: not read) */
  const json_t *rs = get(r, "rope_scaling");
  if (rs && !json_is_null(rs)) {
    MF_CHECK(
        check_rope_type_is(r, "rope_scaling", rs, "yarn",
                           ": deepseek_v3 reads null or \"yarn\" (transformers scales its softmax by any "
                           "rope_scaling's mscale_all_dim)"));
    MF_CHECK(read_yarn(r, rs, s));
  }
  return MF_OK;
}

/* layer_types (GptOssConfig): one "sliding_attention" or "full_attention" a
 * layer; absent or null, the class's: sliding_attention on the even layers.
 * GptOssModel has a mask for those two types only. */
static mf_status read_layer_types(const reader *r, mf_model_spec *s) {
  char clean[64], key[48];
  const json_t *v = get(r, "layer_types");
  memset(s->sliding_layers, 0, sizeof s->sliding_layers);
  if (!v || json_is_null(v)) {
    for (int64_t l = 0; l < s->layers; l++) s->sliding_layers[l] = l % 2 == 0;
    return MF_OK;
  }
  if (!json_is_array(v))
    return KEY_ERR(MF_ERR_FORMAT, r, "layer_types",
                   "expected an array of \"sliding_attention\" / \"full_attention\", got %s", type_name(v));
  if ((int64_t)json_array_size(v) != s->layers)
    return KEY_ERR(MF_ERR_FORMAT, r, "layer_types", "%zu entries; num_hidden_layers is %lld (one a layer)",
                   json_array_size(v), (long long)s->layers);
  for (size_t i = 0; i < json_array_size(v); i++) {
    const json_t *t = json_array_get(v, i);
    snprintf(key, sizeof key, "layer_types[%zu]", i);
    if (!json_is_string(t)) return KEY_ERR(MF_ERR_FORMAT, r, key, "expected a string, got %s", type_name(t));
    const char *name = json_string_value(t);
    if (strcmp(name, "sliding_attention") != 0 && strcmp(name, "full_attention") != 0)
      return KEY_ERR(MF_ERR_FORMAT, r, key,
                     "'%s' is not a gpt_oss layer type (\"sliding_attention\" or \"full_attention\")",
                     printable(name, clean, sizeof clean));
    s->sliding_layers[i] = name[0] == 's';
  }
  return MF_OK;
}

/* GptOssConfig (configuration_gpt_oss.py, 4.57): every layer MoE, its experts
 * of intermediate_size (num_local_experts of them) with biases and the clamped
 * SwiGLU; q/k/v and o biases together (attention_bias: the class sets it true,
 * a file's key overrides that); a sink logit per head; sliding_window on the
 * layers layer_types names (read_layer_types); rope_scaling null or yarn
 * (absent: the class's yarn, factor 32 over 4096, truncate false). Not read,
 * as by transformers: the hub files' experts_per_token and
 * initial_context_length, output_router_logits (the loss follows
 * router_aux_loss_coef, as Mixtral's). swiglu_limit is not read either: the
 * limit is GptOssExperts' constant 7, so a file saying otherwise is refused. */
static mf_status read_gpt_oss(const reader *r, mf_model_spec *s) {
  static const char *const required[] = {"intermediate_size", "num_local_experts"};
  for (size_t i = 0; i < sizeof required / sizeof required[0]; i++) MF_CHECK(require(r, required[i]));
  MF_CHECK(read_int(r, "intermediate_size", 1, k_max_dim, &s->expert_ffn));
  MF_CHECK(read_int(r, "num_local_experts", 1, 65536, &s->experts));
  MF_CHECK(read_bool(r, "attention_bias", &s->qkv_bias));
  s->o_bias = s->qkv_bias;
  const json_t *v = get(r, "sliding_window");
  if (v && json_is_null(v))
    return KEY_ERR(MF_ERR_FORMAT, r, "sliding_window",
                   "null is refused: transformers builds the sliding-window mask for every gpt_oss model "
                   "and raises without a window");
  MF_CHECK(read_int(r, "sliding_window", 1, (int64_t)1 << 40, &s->sliding_window));
  MF_CHECK(read_layer_types(r, s));
  if ((v = get(r, "swiglu_limit"))) {
    double limit;
    MF_CHECK(number_value(r, "swiglu_limit", v, &limit));
    if (limit != MF_GPT_OSS_SWIGLU_LIMIT)
      return KEY_ERR(MF_ERR_UNSUPPORTED, r, "swiglu_limit",
                     "%g: transformers ignores this key and clamps the experts' SwiGLU at 7 (GptOssExperts' "
                     "constant); a model trained so would not be the one the file describes",
                     limit);
  }
  const json_t *rs = get(r, "rope_scaling");
  if (rs && json_is_null(rs)) { /* plain RoPE */
    s->yarn_factor = s->yarn_beta_fast = s->yarn_beta_slow = s->yarn_mscale = s->yarn_mscale_all_dim = 0;
    s->yarn_original_max = 0, s->yarn_truncate = 0;
  } else if (rs) {
    MF_CHECK(check_rope_type_is(r, "rope_scaling", rs, "yarn", ": gpt_oss reads null or \"yarn\""));
    MF_CHECK(read_yarn(r, rs, s));
  }
  return MF_OK;
}

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
    case MF_FAMILY_GLM4_MOE:
      MF_CHECK(read_glm4_moe(r, s));
      break;
    case MF_FAMILY_DEEPSEEK_V3:
      MF_CHECK(read_deepseek_v3(r, s));
      break;
    case MF_FAMILY_GPT_OSS:
      MF_CHECK(read_gpt_oss(r, s));
      break;
    default:
      return MF_ERR(MF_ERR_INTERNAL, "%s: no reader for family %d", r->where, (int)r->family);
  }
  return MF_OK;
}

static mf_status parse_root(reader *r, mf_model_spec *s, mf_hf_quant *q) {
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
  if (r->family != MF_FAMILY_GLM4_MOE &&
      r->family != MF_FAMILY_DEEPSEEK_V3) /* no aux term (read_group_moe) */
    MF_CHECK(read_number(r, "router_aux_loss_coef", &s->router_aux_loss_coef, NULL));
  if (!(s->router_aux_loss_coef >= 0))
    return KEY_ERR(MF_ERR_FORMAT, r, "router_aux_loss_coef", "%g must not be negative",
                   s->router_aux_loss_coef);
  MF_CHECK(check_unsupported(r, q));
  MF_CHECK(read_family(r, s));
  if (r->family != MF_FAMILY_DEEPSEEK_V3) /* its head_dim is nope + rope (read_deepseek_v3) */
    MF_CHECK(read_head_dim(r, s));

  if (s->heads % s->kv_heads != 0)
    return KEY_ERR(MF_ERR_FORMAT, r, "num_key_value_heads", "%lld does not divide num_attention_heads (%lld)",
                   (long long)s->kv_heads, (long long)s->heads);
  if (s->top_k > s->experts)
    return KEY_ERR(MF_ERR_FORMAT, r, "num_experts_per_tok", "%lld exceeds %s (%lld)", (long long)s->top_k,
                   r->family == MF_FAMILY_MIXTRAL || r->family == MF_FAMILY_GPT_OSS ? "num_local_experts"
                   : r->family == MF_FAMILY_GLM4_MOE || r->family == MF_FAMILY_DEEPSEEK_V3
                       ? "n_routed_experts"
                       : "num_experts",
                   (long long)s->experts);
  for (int64_t l = 0; l < s->layers; l++)
    if (!mf_model_spec_layer_is_moe(s, l) && s->dense_ffn <= 0)
      return KEY_ERR(MF_ERR_FORMAT, r, "intermediate_size",
                     "must be positive: layer %lld is a dense MLP (%s)", (long long)l,
                     r->family == MF_FAMILY_GLM4_MOE || r->family == MF_FAMILY_DEEPSEEK_V3
                         ? "first_k_dense_replace"
                         : "mlp_only_layers / decoder_sparse_step");
  MF_CHECK(mf_model_spec_validate(s, r->where));
  return MF_OK;
}

static mf_status parse_text(const char *text, size_t len, const char *where, mf_model_spec *out,
                            mf_hf_quant *quant) {
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
  mf_hf_quant q;
  const mf_status st = parse_root(&r, &spec, &q);
  json_decref(r.root);
  if (st == MF_OK) {
    *out = spec;
    if (quant) *quant = q;
  }
  return st;
}

mf_status mf_hf_config_parse(const char *text, size_t len, const char *where, mf_model_spec *out) {
  return parse_text(text, len, where, out, NULL);
}

mf_status mf_hf_config_load_quant(const char *path, mf_model_spec *out, mf_hf_quant *quant) {
  if (!path || !out) return MF_ERR(MF_ERR_INVALID_ARG, "mf_hf_config_load: NULL argument");
  struct stat st;
  if (stat(path, &st) != 0) return MF_ERR(MF_ERR_IO, "%s: %s", path, strerror(errno));
  char *file = NULL;
  if (S_ISDIR(st.st_mode)) MF_CHECK(mf_hf_config_in_dir(path, &file));
  const char *name = file ? file : path;
  char *text = NULL;
  size_t len = 0;
  mf_status s = mf_read_file(name, MF_HF_CONFIG_MAX_BYTES, "a config.json", &text, &len);
  if (s == MF_OK) s = parse_text(text, len, name, out, quant);
  free(text);
  free(file);
  return s;
}

mf_status mf_hf_config_load(const char *path, mf_model_spec *out) {
  return mf_hf_config_load_quant(path, out, NULL);
}
