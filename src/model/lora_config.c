/* A PEFT adapter dir's adapter_config.json as an mf_lora (params.h). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "src/model/params.h"

#define MF_ADAPTER_CONFIG_MAX_BYTES (1 << 20)

/* A key that must be absent, null, false, "none" (bias), or an empty list or
 * object: what changes PEFT's maths in ways moefit does not compute. */
static int neutral(const char *key, const json_t *v) {
  if (!v || json_is_null(v) || json_is_false(v)) return 1;
  if (json_is_array(v)) return json_array_size(v) == 0;
  if (json_is_object(v)) return json_object_size(v) == 0;
  if (strcmp(key, "bias") == 0) return json_is_string(v) && strcmp(json_string_value(v), "none") == 0;
  return 0;
}

/* modules_to_save naming the routers: "gate" or "mlp.gate" (Mixtral's
 * "block_sparse_moe.gate"), as PEFT matches a module's name by its suffix. */
static int is_router_name(const char *s) {
  return strcmp(s, "gate") == 0 || strcmp(s, "mlp.gate") == 0 || strcmp(s, "block_sparse_moe.gate") == 0;
}

/* PEFT's match of a target_modules entry against a module's name (the
 * weight's name less ".weight"): equal, or ending with "." and the entry. */
static int matches(const char *module, size_t n, const char *entry) {
  const size_t e = strlen(entry);
  if (e > n) return 0;
  if (e == n) return memcmp(module, entry, n) == 0;
  return module[n - e - 1] == '.' && memcmp(module + n - e, entry, e) == 0;
}

/* The modules target_modules adapts, by PEFT's rule (matches): short names
 * (q_proj), full names (model.layers.3.mlp.experts.5.gate_proj) and the
 * shortest unique endings PEFT writes for long lists (1.gate_proj) alike.
 * moefit adapts a role in every layer that has it, except the routed
 * experts', whose adapted experts are the hot set (out->hot, NULL when it is
 * every expert) — the same experts for each of their adapted roles. */
static mf_status read_targets(const char *path, const json_t *targets, const mf_param_table *t,
                              mf_lora *out) {
  const int64_t E = t->spec.experts, LE = t->spec.layers * E;
  const uint64_t can = mf_lora_adaptable_roles(t->spec.family);
  uint8_t *adapted = NULL, *used = NULL; /* [n_base], [entries] */
  const size_t ne = json_array_size(targets);
  MF_CHECK(mf_calloc((size_t)(t->n_base > 0 ? t->n_base : 1), 1, "target_modules", (void **)&adapted));
  mf_status st = mf_calloc(ne, 1, "target_modules", (void **)&used);
  for (size_t i = 0; st == MF_OK && i < ne; i++)
    if (!json_is_string(json_array_get(targets, i)))
      st = MF_ERR(MF_ERR_FORMAT, "%s: target_modules[%zu]: not a string", path, i);
  uint64_t roles = 0;
  for (int64_t i = 0; st == MF_OK && i < t->n_base; i++) {
    const mf_param *p = &t->params[i];
    if (p->ndim != 2 || !(can & (MF_ROLE_BIT(p->role)))) continue;
    const size_t n = strlen(p->name) - strlen(".weight");
    for (size_t j = 0; j < ne; j++)
      if (matches(p->name, n, json_string_value(json_array_get(targets, j)))) adapted[i] = used[j] = 1;
    if (adapted[i]) roles |= MF_ROLE_BIT(p->role);
  }
  for (size_t j = 0; st == MF_OK && j < ne; j++) /* a short name's roles, as train.lora.targets gives them */
    roles |= mf_lora_target_roles(t->spec.family, json_string_value(json_array_get(targets, j)));
  for (size_t j = 0; st == MF_OK && j < ne; j++)
    if (!used[j])
      st = MF_ERR(MF_ERR_FORMAT, "%s: target_modules[%zu]: the %s model has no module named %s", path, j,
                  mf_family_name(t->spec.family), json_string_value(json_array_get(targets, j)));
  /* every layer's module of an adapted role, the routed experts' aside */
  for (int64_t i = 0; st == MF_OK && i < t->n_base; i++) {
    const mf_param *p = &t->params[i];
    if (p->expert >= 0 || !(roles & (MF_ROLE_BIT(p->role))) || adapted[i]) continue;
    st = MF_ERR(MF_ERR_UNSUPPORTED,
                "%s: target_modules adapts modules like %.*s in some layers but not that one: moefit adapts "
                "a module in every layer (routed experts excepted: the adapted ones are the hot set)",
                path, (int)(strlen(p->name) - strlen(".weight")), p->name);
  }
  /* the hot set: the experts with an adapted projection; every adapted expert role adapts exactly those */
  int all = 1;
  if (st == MF_OK && (roles & MF_LORA_EXPERT_ROLES) && LE > 0) {
    st = mf_calloc((size_t)LE, 1, "the hot experts", (void **)&out->hot);
    for (int64_t i = 0; st == MF_OK && i < t->n_base; i++) {
      const mf_param *p = &t->params[i];
      if (p->expert >= 0 && adapted[i]) out->hot[p->layer * E + p->expert] = 1;
    }
    for (int64_t i = 0; st == MF_OK && i < t->n_base; i++) {
      const mf_param *p = &t->params[i];
      if (p->expert < 0 || !(roles & (MF_ROLE_BIT(p->role)))) continue;
      all &= out->hot[p->layer * E + p->expert];
      if (adapted[i] != out->hot[p->layer * E + p->expert])
        st = MF_ERR(MF_ERR_UNSUPPORTED,
                    "%s: target_modules: %.*s is %s: moefit takes one set of adapted experts for all their "
                    "projections",
                    path, (int)(strlen(p->name) - strlen(".weight")), p->name,
                    adapted[i] ? "adapted while another projection of its expert is not"
                               : "not adapted while another projection of its expert is");
    }
  }
  if (st != MF_OK || all) { /* every routed expert: no hot set */
    free(out->hot);
    out->hot = NULL;
  }
  free(adapted);
  free(used);
  if (st == MF_OK) out->roles = roles;
  return st;
}

/* DIR/adapter_config.json parsed (path[]: its name). */
static mf_status load(const char *dir, char *path, size_t cap, json_t **root) {
  snprintf(path, cap, "%s/adapter_config.json", dir);
  char *text = NULL;
  size_t len = 0;
  MF_CHECK(mf_read_file(path, MF_ADAPTER_CONFIG_MAX_BYTES, "a PEFT adapter config", &text, &len));
  json_error_t e;
  *root = json_loadb(text, len, 0, &e);
  free(text);
  if (!*root) return MF_ERR(MF_ERR_FORMAT, "%s:%d:%d: %s", path, e.line, e.column, e.text);
  return MF_OK;
}

mf_status mf_lora_read_adapter_config(const char *dir, const mf_param_table *t, mf_lora *out) {
  memset(out, 0, sizeof *out);
  char path[4200];
  json_t *root = NULL;
  MF_CHECK(load(dir, path, sizeof path, &root));
  mf_status st = MF_OK;
  const json_t *type = json_object_get(root, "peft_type");
  const json_t *r = json_object_get(root, "r"), *alpha = json_object_get(root, "lora_alpha");
  const json_t *targets = json_object_get(root, "target_modules"),
               *save = json_object_get(root, "modules_to_save");
  /* each with what it would change */
  static const struct {
    const char *key, *why;
  } unsupported[] = {
      {"use_rslora", "rank-stabilised scaling, alpha / sqrt(r)"},
      {"use_dora", "DoRA's weight decomposition (a magnitude vector)"},
      {"fan_in_fan_out", "weights stored transposed (Conv1D)"},
      {"bias", "trained biases of the base"},
      {"lora_bias", "a trained bias on lora_B"},
      {"layers_to_transform", "adapters on some layers only"},
      {"layer_replication", "a model whose layers are repeated from the base's"},
      {"rank_pattern", "a rank per module"},
      {"alpha_pattern", "an alpha per module"},
      {"target_parameters", "adapters on parameters rather than modules"},
      {"exclude_modules", "modules left out of target_modules"},
      {"trainable_token_indices", "trained embedding rows"},
      {"use_qalora", "QALoRA's pooled input to lora_A"},
      {"alora_invocation_tokens", "activated LoRA: the adapters act only after the invocation tokens"},
  };
  if (!json_is_object(root)) {
    st = MF_ERR(MF_ERR_FORMAT, "%s: not a JSON object", path);
  } else if (!json_is_string(type) || strcmp(json_string_value(type), "LORA") != 0) {
    st = MF_ERR(MF_ERR_FORMAT, "%s: peft_type: moefit reads LORA adapters", path);
  } else if (!json_is_integer(r) || json_integer_value(r) < 1 || json_integer_value(r) > 4096) {
    st = MF_ERR(MF_ERR_FORMAT, "%s: r must be an integer in [1, 4096]", path);
  } else if (!json_is_number(alpha) || !(json_number_value(alpha) > 0) ||
             !isfinite(json_number_value(alpha))) {
    st = MF_ERR(MF_ERR_FORMAT, "%s: lora_alpha must be a number above 0", path);
  } else if (!json_is_array(targets) || json_array_size(targets) == 0) {
    st = MF_ERR(MF_ERR_FORMAT, "%s: target_modules must be a non-empty list of module names", path);
  }
  for (size_t i = 0; st == MF_OK && i < sizeof unsupported / sizeof unsupported[0]; i++)
    if (!neutral(unsupported[i].key, json_object_get(root, unsupported[i].key)))
      st = MF_ERR(MF_ERR_UNSUPPORTED, "%s: %s: moefit computes plain LoRA, and this adapter sets it (%s)", path,
                  unsupported[i].key, unsupported[i].why);
  const json_t *drop = json_object_get(root, "lora_dropout");
  if (st == MF_OK && drop && !json_is_null(drop) &&
      !(json_is_number(drop) && json_number_value(drop) >= 0 && json_number_value(drop) < 1))
    st = MF_ERR(MF_ERR_FORMAT, "%s: lora_dropout must be a number in [0, 1)", path);
  if (st == MF_OK) {
    out->rank = (int64_t)json_integer_value(r);
    out->scale = json_number_value(alpha) / (double)out->rank;
    out->dropout = drop && json_is_number(drop) ? json_number_value(drop) : 0.0;
  }
  if (st == MF_OK) st = read_targets(path, targets, t, out);
  if (st == MF_OK && save && !json_is_null(save)) {
    const int ok = json_is_array(save) && json_array_size(save) == 1 &&
                   json_is_string(json_array_get(save, 0)) &&
                   is_router_name(json_string_value(json_array_get(save, 0)));
    if (!ok)
      st = MF_ERR(MF_ERR_UNSUPPORTED,
                  "%s: modules_to_save: moefit trains the routers whole (\"mlp.gate\", Mixtral's "
                  "\"block_sparse_moe.gate\") and nothing else",
                  path);
    out->train_router = ok;
  }
  json_decref(root);
  if (st != MF_OK) {
    free(out->hot);
    out->hot = NULL;
  }
  return st;
}

mf_status mf_lora_read_adapter_base(const char *dir, char *buf, size_t cap) {
  if (cap) buf[0] = 0;
  char path[4200];
  json_t *root = NULL;
  MF_CHECK(load(dir, path, sizeof path, &root));
  const json_t *b = json_object_get(root, "base_model_name_or_path");
  if (json_is_string(b)) snprintf(buf, cap, "%s", json_string_value(b));
  json_decref(root);
  return MF_OK;
}
