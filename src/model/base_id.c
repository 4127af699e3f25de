/* A base's identity (base_id.h): build, write, read, compare. */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "src/io/json_util.h"
#include "src/model/base_id.h"

#define MF_BASE_ID_MAX_BYTES ((size_t)256 << 20) /* ~80 bytes a tensor: far above any model's */

/* ------------------------------------------------------------ the spec's fields */

typedef enum field_kind { K_I64, K_F64, K_BOOL } field_kind;

/* Every scalar field of mf_model_spec that changes the maths (family,
 * qk_norm, mlp_only_layers and sliding_layers apart; seed only for
 * model.init), with the config.json key it comes from ("" where the family
 * fixes it). */
typedef struct field {
  const char *name;
  field_kind kind;
  size_t off;
  const char *hf; /* its config.json key; NULL: per family (hf_key) */
  int since_glm; /* added with glm4_moe, deepseek_v3, gpt_oss: a record without it has the family's default */
} field;

#define F(n, k, hf) \
  { #n, k, offsetof(mf_model_spec, n), hf, 0 }
#define F2(n, k, hf) \
  { #n, k, offsetof(mf_model_spec, n), hf, 1 }
static const field k_fields[] = {
    F(hidden, K_I64, "hidden_size"),
    F(layers, K_I64, "num_hidden_layers"),
    F(heads, K_I64, "num_attention_heads"),
    F(kv_heads, K_I64, "num_key_value_heads"),
    F(head_dim, K_I64, "head_dim"),
    F(experts, K_I64, NULL),
    F(top_k, K_I64, "num_experts_per_tok"),
    F(expert_ffn, K_I64, NULL),
    F(dense_ffn, K_I64, "intermediate_size"),
    F(shared_ffn, K_I64, "shared_expert_intermediate_size"),
    F(vocab, K_I64, "vocab_size"),
    F(max_seq, K_I64, "max_position_embeddings"),
    F(rope_theta, K_F64, "rope_theta"),
    F(norm_eps, K_F64, "rms_norm_eps"),
    F(router_aux_loss_coef, K_F64, "router_aux_loss_coef"),
    F(router_jitter, K_F64, "router_jitter_noise"),
    F(clip_qkv, K_F64, "clip_qkv"),
    F(norm_topk_prob, K_BOOL, "norm_topk_prob"),
    F(tie_embeddings, K_BOOL, "tie_word_embeddings"),
    F(qkv_bias, K_BOOL, NULL),
    F(decoder_sparse_step, K_I64, "decoder_sparse_step"),
    F2(partial_rotary, K_F64, "partial_rotary_factor"),
    F2(n_group, K_I64, "n_group"),
    F2(topk_group, K_I64, "topk_group"),
    F2(routed_scaling, K_F64, "routed_scaling_factor"),
    F2(first_dense, K_I64, "first_k_dense_replace"),
    F2(q_lora_rank, K_I64, "q_lora_rank"),
    F2(kv_lora_rank, K_I64, "kv_lora_rank"),
    F2(qk_nope_dim, K_I64, "qk_nope_head_dim"),
    F2(qk_rope_dim, K_I64, "qk_rope_head_dim"),
    F2(v_head_dim, K_I64, "v_head_dim"),
    F2(rope_interleave, K_BOOL, "rope_interleave"),
    F2(yarn_factor, K_F64, "rope_scaling.factor"),
    F2(yarn_original_max, K_I64, "rope_scaling.original_max_position_embeddings"),
    F2(yarn_beta_fast, K_F64, "rope_scaling.beta_fast"),
    F2(yarn_beta_slow, K_F64, "rope_scaling.beta_slow"),
    F2(yarn_mscale, K_F64, "rope_scaling.mscale"),
    F2(yarn_mscale_all_dim, K_F64, "rope_scaling.mscale_all_dim"),
    F2(yarn_truncate, K_BOOL, "rope_scaling.truncate"),
    F2(o_bias, K_BOOL, "attention_bias"),
    F2(sliding_window, K_I64, "sliding_window"),
};
#undef F
#undef F2
enum { N_FIELDS = (int)(sizeof k_fields / sizeof k_fields[0]) };

static const char *hf_key(const field *f, mf_family fam) {
  if (f->hf) return f->hf;
  const int qwen = fam == MF_FAMILY_QWEN2_MOE || fam == MF_FAMILY_QWEN3_MOE;
  const int group = fam == MF_FAMILY_GLM4_MOE || fam == MF_FAMILY_DEEPSEEK_V3;
  if (strcmp(f->name, "qkv_bias") == 0) return fam == MF_FAMILY_QWEN2_MOE ? "qkv_bias" : "attention_bias";
  if (strcmp(f->name, "experts") == 0)
    return fam == MF_FAMILY_MIXTRAL || fam == MF_FAMILY_GPT_OSS ? "num_local_experts"
           : group                                              ? "n_routed_experts"
                                                                : "num_experts";
  return qwen || group ? "moe_intermediate_size" : "intermediate_size"; /* expert_ffn */
}

static int64_t get_i64(const mf_model_spec *s, const field *f) {
  return f->kind == K_BOOL ? *(const int *)((const char *)s + f->off)
                           : *(const int64_t *)((const char *)s + f->off);
}
static double get_f64(const mf_model_spec *s, const field *f) {
  return *(const double *)((const char *)s + f->off);
}

static const char *const k_qk_norm[] = {"none", "per_head", "full"};

/* x as Python's repr writes it: a whole number below 1e16 as "1000000.0",
 * else the shortest "%.*g" that reads back as x. */
static void fmt_double(double x, char *buf, size_t cap) {
  if (isfinite(x) && fabs(x) < 1e16 && x == trunc(x)) {
    snprintf(buf, cap, "%.1f", x);
    return;
  }
  for (int p = 1; p <= 17; p++) {
    snprintf(buf, cap, "%.*g", p, x);
    if (strtod(buf, NULL) == x) return;
  }
}

/* A field's value as text, for JSON and for messages. */
static void field_text(const mf_model_spec *s, const field *f, char *buf, size_t cap) {
  if (f->kind == K_F64)
    fmt_double(get_f64(s, f), buf, cap);
  else if (f->kind == K_BOOL)
    snprintf(buf, cap, "%s", get_i64(s, f) ? "true" : "false");
  else
    snprintf(buf, cap, "%lld", (long long)get_i64(s, f));
}

static void layers_text(const mf_model_spec *s, char *buf, size_t cap) {
  size_t at = (size_t)snprintf(buf, cap, "[");
  for (int64_t i = 0; i < s->n_mlp_only && at < cap; i++)
    at += (size_t)snprintf(buf + at, cap - at, "%s%d", i ? ", " : "", (int)s->mlp_only_layers[i]);
  if (at < cap) snprintf(buf + at, cap - at, "]");
}

/* The sliding_attention layers (gpt_oss's layer_types), as a list of indices. */
static void sliding_text(const mf_model_spec *s, char *buf, size_t cap) {
  size_t at = (size_t)snprintf(buf, cap, "[");
  for (int64_t l = 0, n = 0; l < s->layers && l < MF_MAX_LAYERS && at < cap; l++)
    if (s->sliding_layers[l])
      at += (size_t)snprintf(buf + at, cap - at, "%s%lld", n++ ? ", " : "", (long long)l);
  if (at < cap) snprintf(buf + at, cap - at, "]");
}

/* ---------------------------------------------------------------- build */

static void set_path(mf_base_id *b, const char *path) {
  b->from_init = path == NULL;
  b->path[0] = 0;
  if (!path) return;
  char *abs = realpath(path, NULL);
  snprintf(b->path, sizeof b->path, "%s", abs ? abs : path);
  free(abs);
}

void mf_base_id_init_spec(mf_base_id *b, const mf_model_spec *spec, const char *path) {
  memset(b, 0, sizeof *b);
  b->spec = *spec;
  set_path(b, path);
  if (!b->from_init) b->spec.seed = 0;
}

mf_status mf_base_id_init(mf_base_id *b, const mf_param_table *t, const char *path, int frozen_only,
                          int bf16) {
  mf_base_id_init_spec(b, &t->spec, path);
  b->bf16 = bf16;
  b->frozen_only = frozen_only;
  b->stored[0] = 0;
  if (t->base_quant == MF_QUANT_NF4)
    snprintf(b->stored, sizeof b->stored, "nf4 b%lld%s", (long long)t->base_blocksize,
             t->base_nested ? " dq" : "");
  else if (t->base_quant == MF_QUANT_FP8)
    snprintf(b->stored, sizeof b->stored, "fp8");
  int64_t n = 0;
  for (int64_t i = 0; i < t->n_base; i++) n += !frozen_only || t->params[i].frozen;
  MF_CHECK(mf_calloc((size_t)(n ? n : 1), sizeof *b->tensors, "the base's checksums", (void **)&b->tensors));
  for (int64_t i = 0, k = 0; i < t->n_base; i++)
    if (!frozen_only || t->params[i].frozen)
      snprintf(b->tensors[k++].name, sizeof b->tensors[0].name, "%s", t->params[i].name);
  b->n = n;
  return MF_OK;
}

void mf_base_id_free(mf_base_id *b) {
  if (!b) return;
  free(b->tensors);
  b->tensors = NULL;
  b->n = 0;
}

void mf_base_id_describe(const mf_base_id *b, char *buf, size_t cap) {
  if (b->from_init)
    snprintf(buf, cap, "model.init (%s, seed %llu)", mf_family_name(b->spec.family),
             (unsigned long long)b->spec.seed);
  else
    snprintf(buf, cap, "model.path %s", b->path);
}

/* --------------------------------------------------------------- write */

mf_status mf_base_id_format(const mf_base_id *b, char **json) {
  *json = NULL;
  char *path = NULL;
  if (!b->from_init) {
    json_t *s = json_string(b->path);
    path = s ? json_dumps(s, JSON_ENCODE_ANY) : NULL;
    json_decref(s);
    if (!path) return MF_ERR(MF_ERR_FORMAT, "the base's record: model.path is not UTF-8 text: %s", b->path);
  }
  const size_t cap = 4096 + 2 * MF_MAX_LAYERS * 8 + (path ? strlen(path) : 0) +
                     (size_t)b->n * (sizeof b->tensors[0].name + 32) +
                     (size_t)b->n_files * (sizeof b->files[0].name + 64);
  char *out = NULL;
  mf_status st = mf_malloc(cap, "the base's record", (void **)&out);
  if (st != MF_OK) {
    free(path);
    return st;
  }
  size_t at = 0;
#define PUT(...) at += (size_t)snprintf(out + at, cap - at, __VA_ARGS__)
  PUT("{\n  \"moefit_base\": %d,\n", MF_BASE_ID_VERSION);
  PUT("  \"about\": \"the base model this run trained on: moefit refuses to apply its weights to "
      "another\",\n");
  if (b->from_init)
    PUT("  \"model\": \"model.init\",\n  \"seed\": %llu,\n", (unsigned long long)b->spec.seed);
  else
    PUT("  \"model\": \"model.path\",\n  \"path\": %s,\n", path);
  free(path);
  PUT("  \"spec\": {\n    \"family\": \"%s\",\n", mf_family_name(b->spec.family));
  for (int i = 0; i < N_FIELDS; i++) {
    char v[64];
    field_text(&b->spec, &k_fields[i], v, sizeof v);
    PUT("    \"%s\": %s,\n", k_fields[i].name, v);
  }
  char layers[MF_MAX_LAYERS * 8], sliding[MF_MAX_LAYERS * 8];
  layers_text(&b->spec, layers, sizeof layers);
  sliding_text(&b->spec, sliding, sizeof sliding);
  PUT("    \"qk_norm\": \"%s\",\n    \"mlp_only_layers\": %s,\n    \"sliding_layers\": %s\n  },\n",
      k_qk_norm[b->spec.qk_norm], layers, sliding);
  PUT("  \"weights\": {\n    \"dtype\": \"%s\",\n    \"of\": \"%s\",\n", b->bf16 ? "bf16" : "fp32",
      b->frozen_only ? "frozen" : "all");
  if (b->stored[0]) PUT("    \"stored\": \"%s\",\n", b->stored);
  PUT("    \"tensors\": [");
  for (int64_t i = 0; i < b->n; i++)
    PUT("%s\n      [\"%s\", \"%016llx\"]", i ? "," : "", b->tensors[i].name,
        (unsigned long long)b->tensors[i].sum);
  PUT("\n    ]\n  }");
  if (b->n_files > 0) {
    PUT(",\n  \"files\": [");
    for (int i = 0; i < b->n_files && i < MF_BASE_ID_MAX_FILES; i++)
      PUT("%s\n    [\"%s\", %llu, \"%016llx\"]", i ? "," : "", b->files[i].name,
          (unsigned long long)b->files[i].bytes, (unsigned long long)b->files[i].sum);
    PUT("\n  ]");
  }
  PUT("\n}\n");
#undef PUT
  if (at >= cap) {
    free(out);
    return MF_ERR(MF_ERR_INTERNAL, "the base's record: %zu bytes over its %zu", at, cap);
  }
  *json = out;
  return MF_OK;
}

mf_status mf_base_id_write(const char *dir, const mf_base_id *b) {
  char *json = NULL;
  MF_CHECK(mf_base_id_format(b, &json));
  char path[4400];
  snprintf(path, sizeof path, "%s/%s", dir, MF_BASE_ID_FILE);
  const mf_status st = mf_write_file_atomic(path, json, strlen(json));
  free(json);
  return st;
}

/* ---------------------------------------------------------------- read */

static mf_status bad(const char *where, const char *key, const char *what) {
  return MF_ERR(MF_ERR_FORMAT, "%s: %s: %s (a moefit base record: base_id.h)", where, key, what);
}

static mf_status parse_spec(const char *where, const json_t *s, mf_model_spec *out) {
  if (!json_is_object(s)) return bad(where, "spec", "expected an object");
  const json_t *fam = json_object_get(s, "family");
  out->family = json_is_string(fam) ? mf_family_from_name(json_string_value(fam)) : MF_FAMILY_INVALID;
  if (out->family == MF_FAMILY_INVALID) return bad(where, "spec.family", "not a family moefit knows");
  mf_model_spec dflt;
  mf_model_spec_defaults(out->family, &dflt);
  out->router = dflt.router; /* the family's */
  for (int i = 0; i < N_FIELDS; i++) {
    const field *f = &k_fields[i];
    const json_t *v = json_object_get(s, f->name);
    char key[64];
    snprintf(key, sizeof key, "spec.%s", f->name);
    char *p = (char *)out + f->off;
    if (!v && f->since_glm) { /* a record written before the field was */
      memcpy(p, (const char *)&dflt + f->off, f->kind == K_BOOL ? sizeof(int) : 8);
      continue;
    }
    if (f->kind == K_BOOL) {
      if (!json_is_boolean(v)) return bad(where, key, "expected true or false");
      *(int *)p = json_is_true(v);
    } else if (f->kind == K_F64) {
      if (!json_is_number(v)) return bad(where, key, "expected a number");
      *(double *)p = json_number_value(v);
    } else {
      if (!json_is_integer(v)) return bad(where, key, "expected an integer");
      *(int64_t *)p = (int64_t)json_integer_value(v);
    }
  }
  const json_t *qk = json_object_get(s, "qk_norm");
  int q = -1;
  for (int i = 0; i < 3; i++)
    if (json_is_string(qk) && strcmp(json_string_value(qk), k_qk_norm[i]) == 0) q = i;
  if (q < 0) return bad(where, "spec.qk_norm", "expected \"none\", \"per_head\" or \"full\"");
  out->qk_norm = (mf_qk_norm)q;
  const json_t *ml = json_object_get(s, "mlp_only_layers");
  if (!json_is_array(ml) || json_array_size(ml) > MF_MAX_LAYERS)
    return bad(where, "spec.mlp_only_layers", "expected a list of layer indices");
  out->n_mlp_only = (int64_t)json_array_size(ml);
  for (size_t i = 0; i < json_array_size(ml); i++) {
    const json_t *v = json_array_get(ml, i);
    if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > INT32_MAX)
      return bad(where, "spec.mlp_only_layers", "expected a list of layer indices");
    out->mlp_only_layers[i] = (int32_t)json_integer_value(v);
  }
  /* absent (a record from before gpt_oss): the family's default, layer_types' even layers for gpt_oss */
  const json_t *sl = json_object_get(s, "sliding_layers");
  if (sl && !json_is_array(sl)) return bad(where, "spec.sliding_layers", "expected a list of layer indices");
  memset(out->sliding_layers, 0, sizeof out->sliding_layers);
  if (!sl)
    for (int64_t l = 0; l < out->layers && l < MF_MAX_LAYERS; l++)
      out->sliding_layers[l] = out->family == MF_FAMILY_GPT_OSS && l % 2 == 0;
  for (size_t i = 0; sl && i < json_array_size(sl); i++) {
    const json_t *v = json_array_get(sl, i);
    if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= MF_MAX_LAYERS)
      return bad(where, "spec.sliding_layers", "expected a list of layer indices");
    out->sliding_layers[json_integer_value(v)] = 1;
  }
  return MF_OK;
}

static mf_status parse_weights(const char *where, const json_t *w, mf_base_id *out) {
  if (!json_is_object(w)) return bad(where, "weights", "expected an object");
  const json_t *dt = json_object_get(w, "dtype"), *of = json_object_get(w, "of"),
               *ts = json_object_get(w, "tensors");
  if (!json_is_string(dt) || (strcmp(json_string_value(dt), "fp32") && strcmp(json_string_value(dt), "bf16")))
    return bad(where, "weights.dtype", "expected \"fp32\" or \"bf16\"");
  if (!json_is_string(of) ||
      (strcmp(json_string_value(of), "all") && strcmp(json_string_value(of), "frozen")))
    return bad(where, "weights.of", "expected \"all\" or \"frozen\"");
  if (!json_is_array(ts)) return bad(where, "weights.tensors", "expected a list of [name, checksum]");
  out->bf16 = strcmp(json_string_value(dt), "bf16") == 0;
  out->frozen_only = strcmp(json_string_value(of), "frozen") == 0;
  const json_t *sd = json_object_get(w, "stored"); /* absent: a base in its float dtype */
  out->stored[0] = 0;
  if (sd && (!json_is_string(sd) || strlen(json_string_value(sd)) >= sizeof out->stored))
    return bad(where, "weights.stored", "expected a short string (\"nf4 b64\", \"fp8\")");
  if (sd) snprintf(out->stored, sizeof out->stored, "%s", json_string_value(sd));
  const size_t n = json_array_size(ts);
  MF_CHECK(mf_calloc(n ? n : 1, sizeof *out->tensors, "the base's checksums", (void **)&out->tensors));
  for (size_t i = 0; i < n; i++) {
    const json_t *e = json_array_get(ts, i);
    const json_t *name = json_array_get(e, 0), *sum = json_array_get(e, 1);
    char key[64], *end = NULL;
    snprintf(key, sizeof key, "weights.tensors[%zu]", i);
    if (!json_is_array(e) || json_array_size(e) != 2 || !json_is_string(name) || !json_is_string(sum) ||
        strlen(json_string_value(name)) >= sizeof out->tensors[0].name ||
        strlen(json_string_value(sum)) != 16)
      return bad(where, key, "expected [name, 16 hex digits]");
    errno = 0;
    out->tensors[i].sum = strtoull(json_string_value(sum), &end, 16);
    if (errno || !end || *end) return bad(where, key, "the checksum is not 16 hex digits");
    snprintf(out->tensors[i].name, sizeof out->tensors[i].name, "%s", json_string_value(name));
  }
  out->n = (int64_t)n;
  return MF_OK;
}

/* "files" (absent: none): [[name, bytes, 16 hex digits], ...] */
static mf_status parse_files(const char *where, const json_t *fs, mf_base_id *out) {
  if (!fs) return MF_OK;
  if (!json_is_array(fs) || json_array_size(fs) > MF_BASE_ID_MAX_FILES)
    return bad(where, "files", "expected a list of at most 4 [name, bytes, checksum]");
  for (size_t i = 0; i < json_array_size(fs); i++) {
    const json_t *e = json_array_get(fs, i);
    const json_t *name = json_array_get(e, 0), *bytes = json_array_get(e, 1), *sum = json_array_get(e, 2);
    char key[64], *end = NULL;
    snprintf(key, sizeof key, "files[%zu]", i);
    if (!json_is_array(e) || json_array_size(e) != 3 || !json_is_string(name) || !json_is_integer(bytes) ||
        json_integer_value(bytes) < 0 || !json_is_string(sum) ||
        strlen(json_string_value(name)) >= sizeof out->files[0].name || !json_string_value(name)[0] ||
        strchr(json_string_value(name), '/') || strlen(json_string_value(sum)) != 16)
      return bad(where, key, "expected [a file name, its size in bytes, 16 hex digits]");
    errno = 0;
    out->files[i].sum = strtoull(json_string_value(sum), &end, 16);
    if (errno || !end || *end) return bad(where, key, "the checksum is not 16 hex digits");
    out->files[i].bytes = (uint64_t)json_integer_value(bytes);
    snprintf(out->files[i].name, sizeof out->files[i].name, "%s", json_string_value(name));
  }
  out->n_files = (int)json_array_size(fs);
  return MF_OK;
}

mf_status mf_base_id_parse(const char *text, size_t len, const char *where, mf_base_id *out) {
  memset(out, 0, sizeof *out);
  json_error_t e;
  json_t *root = json_loadb(text, len, 0, &e);
  if (!root) return MF_ERR(MF_ERR_FORMAT, "%s: line %d, column %d: %s", where, e.line, e.column, e.text);
  mf_status st = MF_OK;
  const json_t *ver = json_object_get(root, "moefit_base"), *model = json_object_get(root, "model");
  if (!json_is_object(root)) {
    st = bad(where, "(top level)", "expected an object");
  } else if (!json_is_integer(ver) || json_integer_value(ver) < 1) {
    st = bad(where, "moefit_base", "expected the record's version, an integer");
  } else if (json_integer_value(ver) > MF_BASE_ID_VERSION) {
    st = MF_ERR(MF_ERR_UNSUPPORTED,
                "%s: moefit_base: version %lld, written by a newer moefit (this one reads %d)", where,
                (long long)json_integer_value(ver), MF_BASE_ID_VERSION);
  } else if (!json_is_string(model) || (strcmp(json_string_value(model), "model.path") &&
                                        strcmp(json_string_value(model), "model.init"))) {
    st = bad(where, "model", "expected \"model.path\" or \"model.init\"");
  }
  if (st == MF_OK) st = parse_spec(where, json_object_get(root, "spec"), &out->spec);
  if (st == MF_OK) {
    out->from_init = strcmp(json_string_value(model), "model.init") == 0;
    const json_t *path = json_object_get(root, "path"), *seed = json_object_get(root, "seed");
    if (out->from_init && !json_is_integer(seed))
      st = bad(where, "seed", "expected model.init's seed, an integer");
    else if (!out->from_init && !json_is_string(path))
      st = bad(where, "path", "expected model.path, a string");
    else if (out->from_init)
      out->spec.seed = (uint64_t)json_integer_value(seed);
    else
      snprintf(out->path, sizeof out->path, "%s", json_string_value(path));
  }
  if (st == MF_OK) st = parse_weights(where, json_object_get(root, "weights"), out);
  if (st == MF_OK) st = parse_files(where, json_object_get(root, "files"), out);
  if (st == MF_OK) out->version = (int)json_integer_value(ver);
  json_decref(root);
  if (st != MF_OK) mf_base_id_free(out);
  return st;
}

mf_status mf_base_id_read_text(const char *path, char **text, size_t *len) {
  *text = NULL;
  *len = 0;
  if (access(path, F_OK) != 0) {
    if (errno == ENOENT) return MF_OK;
    return MF_ERR(MF_ERR_IO, "%s: %s", path, strerror(errno));
  }
  return mf_read_file(path, MF_BASE_ID_MAX_BYTES, "a base record", text, len);
}

mf_status mf_base_id_read(const char *path, mf_base_id *out, int *found) {
  memset(out, 0, sizeof *out);
  *found = 0;
  char *text = NULL;
  size_t len = 0;
  MF_CHECK(mf_base_id_read_text(path, &text, &len));
  if (!text) return MF_OK;
  const mf_status st = mf_base_id_parse(text, len, path, out);
  free(text);
  *found = st == MF_OK;
  return st;
}

/* -------------------------------------------------------------- compare */

/* "WHERE: PLACE: WHO trained on a base (REC) with RV; the base loaded now (HAVE) has HV: WAY_OUT" */
static mf_status differs(const mf_base_id *rec, const char *where, const mf_base_id *have, const char *who,
                         const char *way_out, const char *place, const char *rv, const char *hv) {
  char rd[4200], hd[4200];
  mf_base_id_describe(rec, rd, sizeof rd);
  mf_base_id_describe(have, hd, sizeof hd);
  return MF_ERR(MF_ERR_CONFIG,
                "%s: %s: %s trained on a base (%s%s) with %s; the base loaded now (%s) has %s: %s", where,
                place, who, rd, rec->from_init ? "" : ", as it was then", rv, hd, hv, way_out);
}

static const char *tensor_of(const mf_base_id *b) {
  return b->bf16 ? "bf16" : "fp32";
}

static mf_status compare_weights(const mf_base_id *rec, const char *where, const mf_base_id *have,
                                 const char *who, const char *way_out) {
  if (strcmp(rec->stored, have->stored) != 0)
    return MF_ERR(MF_ERR_CONFIG,
                  "%s: weights: %s trained over the base stored %s and the base loaded now is stored %s: set "
                  "train.lora.base_dtype (and base_blocksize, base_double_quant) as the run did",
                  where, who,
                  rec->stored[0] ? rec->stored : "in its float dtype (train.lora.base_dtype bf16)",
                  have->stored[0] ? have->stored : "in its float dtype (train.lora.base_dtype bf16)");
  if (rec->bf16 != have->bf16)
    return MF_ERR(
        MF_ERR_CONFIG,
        "%s: weights: the record's checksums are of the base's %s values and the base loaded now is "
        "held as %s (LoRA keeps a frozen base in bf16 alone with bf16 storage on one rank): run as the "
        "run did (train.precision and the number of ranks)",
        where, tensor_of(rec), tensor_of(have));
  uint8_t *seen = NULL;
  MF_CHECK(mf_calloc((size_t)(rec->n ? rec->n : 1), 1, "the base's checksums", (void **)&seen));
  mf_status st = MF_OK;
  int64_t j = 0; /* both are in the table's order: the next one is almost always the match */
  for (int64_t i = 0; i < have->n && st == MF_OK; i++) {
    const mf_base_tensor *h = &have->tensors[i];
    if (j >= rec->n || strcmp(rec->tensors[j].name, h->name) != 0)
      for (j = 0; j < rec->n && strcmp(rec->tensors[j].name, h->name) != 0; j++) {
      }
    char place[160], rv[64], hv[64];
    snprintf(place, sizeof place, "weights: %s", h->name);
    snprintf(hv, sizeof hv, "checksum %016llx (%s values)", (unsigned long long)h->sum, tensor_of(have));
    if (j >= rec->n) {
      st = differs(rec, where, have, who, way_out, place, "no such tensor", hv);
      break;
    }
    seen[j] = 1;
    snprintf(rv, sizeof rv, "checksum %016llx", (unsigned long long)rec->tensors[j].sum);
    if (rec->tensors[j].sum != h->sum) st = differs(rec, where, have, who, way_out, place, rv, hv);
    j++;
  }
  for (int64_t k = 0; k < rec->n && st == MF_OK; k++)
    if (!seen[k]) {
      char place[160];
      snprintf(place, sizeof place, "weights: %s", rec->tensors[k].name);
      st = differs(rec, where, have, who, way_out, place, "that tensor", "no such tensor");
    }
  free(seen);
  return st;
}

/* "NAME V" of a spec field into buf. */
static void named(const char *name, const char *v, char *buf, size_t cap) {
  snprintf(buf, cap, "%s %s", name, v);
}

mf_status mf_base_id_compare(const mf_base_id *rec, const char *where, const mf_base_id *have,
                             const char *who, const char *way_out) {
  const mf_model_spec *r = &rec->spec, *h = &have->spec;
  char rv[MF_MAX_LAYERS * 8 + 64], hv[MF_MAX_LAYERS * 8 + 64], a[MF_MAX_LAYERS * 8], b[MF_MAX_LAYERS * 8];
  if (r->family != h->family) {
    named("family", mf_family_name(r->family), rv, sizeof rv);
    named("family", mf_family_name(h->family), hv, sizeof hv);
    return differs(rec, where, have, who, way_out, "family", rv, hv);
  }
  for (int i = 0; i < N_FIELDS; i++) {
    const field *f = &k_fields[i];
    const int same = f->kind == K_F64 ? get_f64(r, f) == get_f64(h, f) : get_i64(r, f) == get_i64(h, f);
    if (same) continue;
    char place[128];
    const char *key = hf_key(f, r->family);
    if (strcmp(key, f->name) == 0)
      snprintf(place, sizeof place, "%s", f->name);
    else
      snprintf(place, sizeof place, "%s (config.json: %s)", f->name, key);
    field_text(r, f, a, sizeof a);
    field_text(h, f, b, sizeof b);
    named(f->name, a, rv, sizeof rv);
    named(f->name, b, hv, sizeof hv);
    return differs(rec, where, have, who, way_out, place, rv, hv);
  }
  if (r->qk_norm != h->qk_norm) {
    named("qk_norm", k_qk_norm[r->qk_norm], rv, sizeof rv);
    named("qk_norm", k_qk_norm[h->qk_norm], hv, sizeof hv);
    return differs(rec, where, have, who, way_out, "qk_norm", rv, hv);
  }
  int same = r->n_mlp_only == h->n_mlp_only;
  for (int64_t i = 0; same && i < r->n_mlp_only; i++) same = r->mlp_only_layers[i] == h->mlp_only_layers[i];
  if (!same) {
    layers_text(r, a, sizeof a);
    layers_text(h, b, sizeof b);
    named("mlp_only_layers", a, rv, sizeof rv);
    named("mlp_only_layers", b, hv, sizeof hv);
    return differs(rec, where, have, who, way_out, "mlp_only_layers", rv, hv);
  }
  for (int64_t l = 0; l < r->layers && l < MF_MAX_LAYERS; l++)
    if (!r->sliding_layers[l] != !h->sliding_layers[l]) {
      sliding_text(r, a, sizeof a);
      sliding_text(h, b, sizeof b);
      named("sliding_layers", a, rv, sizeof rv);
      named("sliding_layers", b, hv, sizeof hv);
      return differs(rec, where, have, who, way_out, "sliding_layers (config.json: layer_types)", rv, hv);
    }
  if (rec->from_init && have->from_init && r->seed != h->seed) {
    snprintf(rv, sizeof rv, "seed %llu", (unsigned long long)r->seed);
    snprintf(hv, sizeof hv, "seed %llu", (unsigned long long)h->seed);
    return differs(rec, where, have, who, way_out, "model.init.seed", rv, hv);
  }
  if (have->n == 0 || rec->n == 0) return MF_OK;
  if (rec->frozen_only != have->frozen_only)
    return differs(
        rec, where, have, who, way_out, "weights",
        rec->frozen_only ? "its frozen weights recorded (LoRA)" : "every weight recorded (a full fine-tune)",
        have->frozen_only ? "a frozen base (LoRA)" : "no frozen base (a full fine-tune)");
  return compare_weights(rec, where, have, who, way_out);
}
