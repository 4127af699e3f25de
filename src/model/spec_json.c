/* A moefit file's "model" section against a model spec (hf_config.h). */
#include <stdio.h>
#include <string.h>

#include "src/io/json_util.h"
#include "src/model/hf_config.h"

mf_status mf_model_json_check(const char *path, const json_t *root, const mf_model_spec *s,
                             const char *const *keys, const int64_t *want, int n, const char *made,
                             const char *made_with) {
  char q[128];
  json_t *model, *fam;
  MF_CHECK(mf_io_json_get(path, root, "(top level)", "model", &model));
  if (!json_is_object(model))
    return MF_ERR(MF_ERR_FORMAT, "%s: model: expected an object, got %s", path, mf_io_json_kind(model, 0));
  MF_CHECK(mf_io_json_only_keys(path, model, "model", keys, n));
  MF_CHECK(mf_io_json_get(path, model, "model", "family", &fam));
  if (!json_is_string(fam))
    return MF_ERR(MF_ERR_FORMAT, "%s: model.family: expected a string, got %s", path,
                  mf_io_json_kind(fam, 0));
  if (strcmp(json_string_value(fam), mf_family_name(s->family)) != 0)
    return MF_ERR(MF_ERR_CONFIG, "%s: model.family: %s family %s, the model is %s", path, made,
                  mf_io_json_printable(json_string_value(fam), q, sizeof q), mf_family_name(s->family));
  for (int i = 1; i < n; i++) {
    char place[64];
    snprintf(place, sizeof place, "model.%s", keys[i]);
    json_t *v;
    int64_t got;
    MF_CHECK(mf_io_json_get(path, model, "model", keys[i], &v));
    MF_CHECK(mf_io_json_nonneg(path, v, place, &got));
    if (got != want[i])
      return MF_ERR(MF_ERR_CONFIG, "%s: %s: %s %s %lld, the model has %lld", path, place, made_with, keys[i],
                    (long long)got, (long long)want[i]);
  }
  return MF_OK;
}
