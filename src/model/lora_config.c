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

mf_status mf_lora_read_adapter_config(const char *dir, mf_family family, mf_lora *out) {
  memset(out, 0, sizeof *out);
  char path[4200];
  snprintf(path, sizeof path, "%s/adapter_config.json", dir);
  char *text = NULL;
  size_t len = 0;
  MF_CHECK(mf_read_file(path, MF_ADAPTER_CONFIG_MAX_BYTES, "a PEFT adapter config", &text, &len));
  json_error_t e;
  json_t *root = json_loadb(text, len, 0, &e);
  free(text);
  if (!root) return MF_ERR(MF_ERR_FORMAT, "%s:%d:%d: %s", path, e.line, e.column, e.text);
  mf_status st = MF_OK;
  const json_t *type = json_object_get(root, "peft_type");
  const json_t *r = json_object_get(root, "r"), *alpha = json_object_get(root, "lora_alpha");
  const json_t *targets = json_object_get(root, "target_modules"),
               *save = json_object_get(root, "modules_to_save");
  static const char *const unsupported[] = {"use_rslora",          "use_dora",
                                            "fan_in_fan_out",      "bias",
                                            "layers_to_transform", "rank_pattern",
                                            "alpha_pattern",       "target_parameters",
                                            "exclude_modules",     "trainable_token_indices"};
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
    if (!neutral(unsupported[i], json_object_get(root, unsupported[i])))
      st = MF_ERR(MF_ERR_UNSUPPORTED, "%s: %s: moefit computes plain LoRA (this adapter sets it)", path,
                  unsupported[i]);
  const json_t *drop = json_object_get(root, "lora_dropout");
  if (st == MF_OK && drop && !json_is_null(drop) &&
      !(json_is_number(drop) && json_number_value(drop) >= 0 && json_number_value(drop) < 1))
    st = MF_ERR(MF_ERR_FORMAT, "%s: lora_dropout must be a number in [0, 1)", path);
  if (st == MF_OK) {
    out->rank = (int64_t)json_integer_value(r);
    out->scale = json_number_value(alpha) / (double)out->rank;
    out->dropout = drop && json_is_number(drop) ? json_number_value(drop) : 0.0;
  }
  for (size_t i = 0; st == MF_OK && i < json_array_size(targets); i++) {
    const json_t *n = json_array_get(targets, i);
    const uint32_t roles = json_is_string(n) ? mf_lora_target_roles(family, json_string_value(n)) : 0;
    if (!roles)
      st = MF_ERR(MF_ERR_FORMAT, "%s: target_modules[%zu]: the %s model has no module named %s", path, i,
                  mf_family_name(family), json_is_string(n) ? json_string_value(n) : "(not a string)");
    out->roles |= roles;
  }
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
  return st;
}
