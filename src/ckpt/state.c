/* A checkpoint's state.json (ckpt_internal.h mf_ckpt_state_file): read only
 * once its bytes match the manifest, every key known, and what it says
 * consistent in itself and with the manifest before anyone trusts it. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "src/ckpt/ckpt_internal.h"
#include "src/io/json_util.h"

/* root's key: an object of the keys names[n] (others refused). */
static mf_status get_object(const char *path, const json_t *root, const char *key, const char *const *names, int n,
                            json_t **out) {
  MF_CHECK(mf_io_json_get(path, root, "state", key, out));
  if (!json_is_object(*out))
    return MF_ERR(MF_ERR_FORMAT, "%s: state.%s: expected an object, got %s", path, key, mf_io_json_kind(*out, 0));
  return mf_io_json_only_keys(path, *out, key, names, n);
}

/* A number, or null for a value that was not finite (write.c json_num). */
static mf_status get_real(const char *path, const json_t *o, const char *key, double *out) {
  json_t *v = NULL;
  MF_CHECK(mf_io_json_get(path, o, "state", key, &v));
  if (!json_is_number(v) && !json_is_null(v))
    return MF_ERR(MF_ERR_FORMAT, "%s: state.%s: expected a number or null, got %s", path, key,
                  mf_io_json_kind(v, 0));
  *out = json_is_number(v) ? json_number_value(v) : NAN;
  return MF_OK;
}

static mf_status read_data(const char *path, const json_t *root, mf_ckpt_state *s) {
  static const char *const keys[] = {"epoch", "index", "seed", "windows"};
  json_t *data = NULL;
  MF_CHECK(get_object(path, root, "data", keys, 4, &data));
  MF_CHECK(mf_ckpt_json_u64(path, data, "data", "epoch", &s->data_epoch));
  MF_CHECK(mf_ckpt_json_u64(path, data, "data", "index", &s->data_index));
  MF_CHECK(mf_ckpt_json_u64(path, data, "data", "seed", &s->data_seed));
  MF_CHECK(mf_ckpt_json_u64(path, data, "data", "windows", &s->data_windows));
  if (s->data_index >= s->data_windows)
    return MF_ERR(MF_ERR_FORMAT, "%s: data: index %llu is not inside the %llu windows", path,
                  (unsigned long long)s->data_index, (unsigned long long)s->data_windows);
  return MF_OK;
}

static mf_status read_model(const char *path, const json_t *root, mf_ckpt_state_file *f) {
  static const char *const keys[] = {"params", "numel", "experts_routed"};
  json_t *model = NULL;
  MF_CHECK(get_object(path, root, "model", keys, 3, &model));
  MF_CHECK(mf_ckpt_json_u64(path, model, "model", "params", &f->params));
  MF_CHECK(mf_ckpt_json_u64(path, model, "model", "numel", &f->numel));
  return mf_ckpt_json_u64(path, model, "model", "experts_routed", &f->experts_routed);
}

/* compression and filter: those of the tensor files the manifest lists. */
static mf_status against_manifest(const char *path, const json_t *root, const mf_ckpt_manifest *m) {
  const char *comp = NULL, *filter = NULL;
  MF_CHECK(mf_ckpt_json_str(path, root, "state", "compression", &comp));
  MF_CHECK(mf_ckpt_json_str(path, root, "state", "filter", &filter));
  char *end = NULL;
  const long level = strncmp(comp, "zstd-", 5) == 0 && comp[5] >= '1' && comp[5] <= '9' ? strtol(comp + 5, &end, 10) : 0;
  if (strcmp(comp, "none") != 0 && (level < 1 || level > 22 || *end))
    return MF_ERR(MF_ERR_FORMAT, "%s: compression: expected none or zstd-N, got '%.40s'", path, comp);
  if (strcmp(filter, "none") != 0 && strcmp(filter, "byteplane") != 0)
    return MF_ERR(MF_ERR_FORMAT, "%s: filter: expected \"byteplane\" or \"none\", got '%.40s'", path, filter);
  const mf_ckpt_file *t = mf_ckpt_manifest_tensors(m, "master");
  const int zstd = level > 0, planes = strcmp(filter, "byteplane") == 0;
  if (!t || t->zstd != zstd || t->byteplane != planes)
    return MF_ERR(MF_ERR_FORMAT,
                  "%s: compression %s, filter %s, but manifest.json lists %s with compression %s, filter %s "
                  "(state.json and the manifest disagree)",
                  path, comp, filter, t ? t->name : "no master file", t && t->zstd ? "zstd" : "none",
                  t && t->byteplane ? "byteplane" : "none");
  return MF_OK;
}

static mf_status read_base(const char *path, const json_t *root, mf_ckpt_state_file *f) {
  const int sum = json_object_get(root, "base_sum") != NULL, of = json_object_get(root, "base_sum_of") != NULL;
  if (sum != of)
    return MF_ERR(MF_ERR_FORMAT, "%s: base_sum and base_sum_of come together (a LoRA run's base), one is missing",
                  path);
  if (!sum) return MF_OK;
  const char *w = NULL;
  MF_CHECK(mf_ckpt_json_hex(path, root, "state", "base_sum", &f->base_sum));
  MF_CHECK(mf_ckpt_json_str(path, root, "state", "base_sum_of", &w));
  if (strcmp(w, "bf16") != 0 && strcmp(w, "fp32") != 0)
    return MF_ERR(MF_ERR_FORMAT, "%s: base_sum_of: '%.40s' is neither bf16 nor fp32", path, w);
  f->has_base = 1;
  f->base_bf16 = strcmp(w, "bf16") == 0;
  return MF_OK;
}

static mf_status parse(const mf_ckpt_manifest *m, mf_ckpt_state_file *f) {
  static const char *const keys[] = {"format", "version", "step",  "train_steps", "skipped",  "first_loss",
                                     "lr",     "data",    "model", "moments",     "compression", "filter",
                                     "ranks",  "base_sum", "base_sum_of", "lora_hot"};
  const char *path = f->path;
  const json_t *root = f->root;
  mf_ckpt_state *s = &f->s;
  MF_CHECK(mf_io_json_only_keys(path, root, "state", keys, (int)(sizeof keys / sizeof keys[0])));
  const char *format = NULL, *moments = NULL;
  uint64_t version = 0, step = 0, total = 0, skipped = 0, ranks = 0;
  MF_CHECK(mf_ckpt_json_str(path, root, "state", "format", &format));
  MF_CHECK(mf_ckpt_json_u64(path, root, "state", "version", &version));
  if (strcmp(format, MF_CKPT_FORMAT) != 0 || version != MF_CKPT_VERSION)
    return MF_ERR(MF_ERR_FORMAT, "%s: format '%.60s' version %llu is not %s version %d", path, format,
                  (unsigned long long)version, MF_CKPT_FORMAT, MF_CKPT_VERSION);
  MF_CHECK(mf_ckpt_json_u64(path, root, "state", "step", &step));
  MF_CHECK(mf_ckpt_json_u64(path, root, "state", "train_steps", &total));
  MF_CHECK(mf_ckpt_json_u64(path, root, "state", "skipped", &skipped));
  MF_CHECK(mf_ckpt_json_u64(path, root, "state", "ranks", &ranks));
  if (step > total || skipped > step || ranks < 1 || total > INT64_MAX)
    return MF_ERR(MF_ERR_FORMAT,
                  "%s: step %llu of train_steps %llu with %llu skipped on %llu ranks: not a state a run writes "
                  "(skipped <= step <= train_steps, ranks >= 1)",
                  path, (unsigned long long)step, (unsigned long long)total, (unsigned long long)skipped,
                  (unsigned long long)ranks);
  MF_CHECK(get_real(path, root, "first_loss", &s->first_loss));
  MF_CHECK(get_real(path, root, "lr", &s->lr));
  MF_CHECK(read_data(path, root, s));
  MF_CHECK(read_model(path, root, f));
  MF_CHECK(mf_ckpt_json_str(path, root, "state", "moments", &moments));
  f->moments = mf_dtype_from_name(moments, strlen(moments));
  if (f->moments != MF_DTYPE_F32 && f->moments != MF_DTYPE_BF16)
    return MF_ERR(MF_ERR_FORMAT, "%s: moments: expected F32 or BF16, got '%.40s'", path, moments);
  MF_CHECK(against_manifest(path, root, m));
  MF_CHECK(read_base(path, root, f));
  const json_t *hot = json_object_get(root, "lora_hot");
  if (hot && !json_is_array(hot))
    return MF_ERR(MF_ERR_FORMAT, "%s: lora_hot: expected an array, got %s", path, mf_io_json_kind(hot, 0));
  s->step = (int64_t)step;
  s->train_steps = (int64_t)total;
  s->skipped = (int64_t)skipped;
  s->ranks = (int64_t)ranks;
  return MF_OK;
}

mf_status mf_ckpt_state_open(const mf_ckpt_manifest *m, mf_ckpt_state_file *f) {
  memset(f, 0, sizeof *f);
  snprintf(f->path, sizeof f->path, "%s/state.json", m->dir);
  char *text = NULL;
  size_t len = 0;
  MF_CHECK(mf_ckpt_read_checked(m, "state.json", &text, &len));
  json_error_t e;
  f->root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &e);
  free(text);
  mf_status st = MF_OK;
  if (!json_is_object(f->root))
    st = MF_ERR(MF_ERR_FORMAT, "%s: line %d column %d: %s", f->path, e.line, e.column,
                f->root ? "expected a JSON object" : e.text);
  if (st == MF_OK) st = parse(m, f);
  if (st != MF_OK) mf_ckpt_state_close(f);
  return st;
}

void mf_ckpt_state_close(mf_ckpt_state_file *f) {
  json_decref(f->root);
  f->root = NULL;
}
