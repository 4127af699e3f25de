/* Reading a resume checkpoint (ckpt.h): the manifest and every checksum
 * first, then the tensors into the run's buffers, checked against its table;
 * the newest complete checkpoint; the config it was written under. */
#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zstd.h>

#include "src/ckpt/ckpt_internal.h"
#include "src/io/json_util.h"
#include "src/io/safetensors.h"

/* --------------------------------------------------------- the manifest */

static mf_status json_u64(const char *path, const json_t *o, const char *place, const char *key, uint64_t *out) {
  json_t *v = NULL;
  MF_CHECK(mf_io_json_get(path, o, place, key, &v));
  int64_t x = 0;
  char where[160];
  snprintf(where, sizeof where, "%s.%s", place, key);
  MF_CHECK(mf_io_json_nonneg(path, v, where, &x));
  *out = (uint64_t)x;
  return MF_OK;
}

static mf_status json_str(const char *path, const json_t *o, const char *place, const char *key, const char **out) {
  json_t *v = NULL;
  MF_CHECK(mf_io_json_get(path, o, place, key, &v));
  if (!json_is_string(v))
    return MF_ERR(MF_ERR_FORMAT, "%s: %s.%s: expected a string, got %s", path, place, key, mf_io_json_kind(v, 0));
  *out = json_string_value(v);
  return MF_OK;
}

static mf_status load_json(const char *path, const char *what, json_t **out) {
  char *text = NULL;
  size_t len = 0;
  MF_CHECK(mf_read_file(path, MF_CKPT_MAX_JSON, what, &text, &len));
  json_error_t e;
  *out = json_loadb(text, len, JSON_REJECT_DUPLICATES, &e);
  free(text);
  if (!*out || !json_is_object(*out)) {
    json_decref(*out);
    *out = NULL;
    return MF_ERR(MF_ERR_FORMAT, "%s: line %d column %d: %s", path, e.line, e.column,
                  e.text[0] ? e.text : "expected a JSON object");
  }
  return MF_OK;
}

static mf_status parse_entry(const char *path, const json_t *e, int i, mf_ckpt_file *f) {
  char place[32];
  snprintf(place, sizeof place, "files[%d]", i);
  if (!json_is_object(e)) return MF_ERR(MF_ERR_FORMAT, "%s: %s: expected an object", path, place);
  const char *name = NULL, *hash = NULL, *comp = NULL;
  MF_CHECK(json_str(path, e, place, "name", &name));
  MF_CHECK(json_str(path, e, place, "hash", &hash));
  MF_CHECK(json_str(path, e, place, "compression", &comp));
  MF_CHECK(json_u64(path, e, place, "bytes", &f->bytes));
  MF_CHECK(json_u64(path, e, place, "raw_bytes", &f->raw_bytes));
  if (!name[0] || strlen(name) >= sizeof f->name || strchr(name, '/') || name[0] == '.')
    return MF_ERR(MF_ERR_FORMAT, "%s: %s.name: '%s' is not a plain file name", path, place, name);
  snprintf(f->name, sizeof f->name, "%s", name);
  char *end = NULL;
  f->hash = strtoull(hash, &end, 16);
  if (strlen(hash) != 16 || !end || *end)
    return MF_ERR(MF_ERR_FORMAT, "%s: %s.hash: expected 16 hex digits, got '%s'", path, place, hash);
  f->zstd = strcmp(comp, "zstd") == 0;
  if (!f->zstd && strcmp(comp, "none") != 0)
    return MF_ERR(MF_ERR_FORMAT, "%s: %s.compression: expected zstd or none, got '%s'", path, place, comp);
  /* "filter" is absent from the manifests written before the byte-plane
   * filter: their files are plain safetensors inside the zstd frame. */
  const json_t *filter = json_object_get(e, "filter");
  f->byteplane = json_is_string(filter) && strcmp(json_string_value(filter), "byteplane") == 0;
  if (filter && !f->byteplane && !(json_is_string(filter) && strcmp(json_string_value(filter), "none") == 0))
    return MF_ERR(MF_ERR_FORMAT, "%s: %s.filter: expected \"byteplane\" or \"none\", got %s", path, place,
                  json_is_string(filter) ? json_string_value(filter) : mf_io_json_kind(filter, 0));
  if (f->byteplane && !f->zstd)
    return MF_ERR(MF_ERR_FORMAT, "%s: %s: the byteplane filter without zstd compression", path, place);
  if (!f->zstd && f->raw_bytes != f->bytes)
    return MF_ERR(MF_ERR_FORMAT, "%s: %s: raw_bytes %llu differs from bytes %llu without compression", path, place,
                  (unsigned long long)f->raw_bytes, (unsigned long long)f->bytes);
  return MF_OK;
}

/* dir/manifest.json -> files[], *n. */
static mf_status read_manifest(const char *dir, mf_ckpt_file *files, int *n) {
  char path[4400];
  snprintf(path, sizeof path, "%s/manifest.json", dir);
  json_t *root = NULL;
  MF_CHECK(load_json(path, "a checkpoint manifest", &root));
  mf_status st = MF_OK;
  const char *format = NULL, *hash = NULL;
  json_t *arr = NULL;
  MF_CHECK_GOTO(json_str(path, root, "manifest", "format", &format), st, done);
  MF_CHECK_GOTO(json_str(path, root, "manifest", "hash", &hash), st, done);
  if (strcmp(format, MF_CKPT_FORMAT "-manifest") != 0 || strcmp(hash, MF_CKPT_HASH_NAME) != 0) {
    st = MF_ERR(MF_ERR_FORMAT, "%s: format '%s' with hash '%s' is not a moefit checkpoint manifest (%s, %s)", path,
                format, hash, MF_CKPT_FORMAT "-manifest", MF_CKPT_HASH_NAME);
    goto done;
  }
  MF_CHECK_GOTO(mf_io_json_get(path, root, "manifest", "files", &arr), st, done);
  if (!json_is_array(arr) || json_array_size(arr) > MF_CKPT_MAX_FILES) {
    st = MF_ERR(MF_ERR_FORMAT, "%s: files: expected an array of at most %d entries", path, MF_CKPT_MAX_FILES);
    goto done;
  }
  *n = (int)json_array_size(arr);
  for (int i = 0; i < *n; i++) MF_CHECK_GOTO(parse_entry(path, json_array_get(arr, (size_t)i), i, &files[i]), st, done);
done:
  json_decref(root);
  return st;
}

mf_status mf_ckpt_read_manifest(const char *dir, mf_ckpt_file *files, int cap, int *n) {
  mf_ckpt_file all[MF_CKPT_MAX_FILES];
  int m = 0;
  *n = 0;
  MF_CHECK(read_manifest(dir, all, &m));
  for (int i = 0; i < m && i < cap; i++) files[i] = all[i];
  *n = m;
  return MF_OK;
}

/* Maps dir/f->name and checks its size and checksum. */
static mf_status map_checked(const char *dir, const mf_ckpt_file *f, const uint8_t **base, size_t *size) {
  char path[4400];
  snprintf(path, sizeof path, "%s/%s", dir, f->name);
  int err = 0;
  mf_status st = mf_map_file(path, base, size, &err);
  if (st != MF_OK)
    return err == ENOENT ? MF_ERR(MF_ERR_FORMAT, "%s: missing (manifest.json lists it)", path) : st;
  if (*size != f->bytes) {
    mf_unmap_file(*base, *size);
    return MF_ERR(MF_ERR_FORMAT, "%s: %zu bytes on disk, manifest.json says %llu (%s)", path, *size,
                  (unsigned long long)f->bytes, *size < f->bytes ? "truncated" : "grown");
  }
  const uint64_t h = mf_ckpt_hash64(*base, *size);
  if (h != f->hash) {
    mf_unmap_file(*base, *size);
    return MF_ERR(MF_ERR_FORMAT, "%s: checksum %016llx, manifest.json says %016llx (the file is damaged)", path,
                  (unsigned long long)h, (unsigned long long)f->hash);
  }
  return MF_OK;
}

mf_status mf_ckpt_verify(const char *dir) {
  char marker[4400];
  snprintf(marker, sizeof marker, "%s/COMPLETE", dir);
  struct stat sb;
  if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode))
    return MF_ERR(MF_ERR_FORMAT, "%s: not a checkpoint directory", dir);
  if (stat(marker, &sb) != 0)
    return MF_ERR(MF_ERR_FORMAT, "%s: missing: the checkpoint was not finished (its run stopped while writing it)",
                  marker);
  mf_ckpt_file files[MF_CKPT_MAX_FILES];
  int n = 0;
  MF_CHECK(read_manifest(dir, files, &n));
  for (int i = 0; i < n; i++) {
    const uint8_t *base = NULL;
    size_t size = 0;
    MF_CHECK(map_checked(dir, &files[i], &base, &size));
    mf_unmap_file(base, size);
  }
  return MF_OK;
}

/* -------------------------------------------------------- finding one */

static int cmp_desc(const void *a, const void *b) {
  const int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return x > y ? -1 : x < y;
}

mf_status mf_ckpt_find_latest(const char *output_dir, char *dir, size_t cap) {
  char root[4200];
  snprintf(root, sizeof root, "%s/checkpoints", output_dir);
  int64_t steps[4096];
  size_t n = 0;
  const int err = mf_ckpt_list_steps(root, 0, steps, sizeof steps / sizeof steps[0], &n);
  if (err) return MF_ERR(MF_ERR_CONFIG, "--resume: no checkpoints in %s (%s)", root, strerror(err));
  qsort(steps, n, sizeof steps[0], cmp_desc);
  for (size_t i = 0; i < n; i++) {
    snprintf(dir, cap, "%s/step-%06lld", root, (long long)steps[i]);
    if (mf_ckpt_verify(dir) == MF_OK) return MF_OK;
    MF_LOGW("ckpt", "passing over %s: %s", dir, mf_last_error());
  }
  return MF_ERR(MF_ERR_CONFIG, "--resume: no complete checkpoint in %s (%zu incomplete or damaged)", root, n);
}

/* ---------------------------------------------------------- the config */

/* Keys that do not change a step's bits: they may differ on resume. */
static int free_to_change(const char *key) {
  static const char *const ok[] = {"train.steps", "train.threads", "train.log_every", "train.eval_every",
                                   "train.overlap_optimizer", "train.max_skipped_steps", "data.valid"};
  for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++)
    if (strcmp(key, ok[i]) == 0) return 1;
  return !(strncmp(key, "model", 5) == 0 || strncmp(key, "data.", 5) == 0 || strncmp(key, "train.", 6) == 0);
}

/* state.json's ranks (1 when absent or unreadable: read_state says why later). */
static int64_t state_ranks(const char *dir) {
  char path[4400];
  snprintf(path, sizeof path, "%s/state.json", dir);
  json_t *root = NULL;
  if (load_json(path, "a checkpoint state", &root) != MF_OK) return 1;
  const json_t *v = json_object_get(root, "ranks");
  const int64_t r = json_is_integer(v) && json_integer_value(v) > 1 ? (int64_t)json_integer_value(v) : 1;
  json_decref(root);
  return r;
}

mf_status mf_ckpt_check_config(const char *dir, const mf_config *cfg) {
  char path[4400];
  snprintf(path, sizeof path, "%s/config.yaml", dir);
  mf_config *saved = NULL;
  mf_status st = mf_config_load(path, NULL, 0, &saved);
  if (st != MF_OK) return MF_ERR(MF_ERR_FORMAT, "%s: the checkpoint's config does not load: %s", path, mf_last_error());
  const char *keys[256];
  const size_t n = mf_config_diff(saved, cfg, keys, sizeof keys / sizeof keys[0]);
  char list[2048] = "";
  size_t len = 0, bad = 0;
  const int64_t saved_ranks = state_ranks(dir), ranks = cfg->ranks > 1 ? cfg->ranks : 1;
  const int64_t saved_ga = saved->train.grad_accum, saved_mb = saved_ga * saved_ranks,
                mb = cfg->train.grad_accum * ranks;
  if (saved_mb != mb) {
    mf_config_free(saved);
    return MF_ERR(
        MF_ERR_CONFIG,
        "%s: the checkpoint's steps were %lld micro-batches (%lld rank%s x train.grad_accum %lld), this "
        "run's are %lld (%lld rank%s x %lld): set train.grad_accum so that ranks x grad_accum is %lld",
        path, (long long)saved_mb, (long long)saved_ranks, saved_ranks == 1 ? "" : "s", (long long)saved_ga,
        (long long)mb, (long long)ranks, ranks == 1 ? "" : "s", (long long)cfg->train.grad_accum,
        (long long)saved_mb);
  }
  for (size_t i = 0; i < n && i < sizeof keys / sizeof keys[0]; i++) {
    if (free_to_change(keys[i]) || strcmp(keys[i], "train.grad_accum") == 0) continue;
    bad++;
    len += (size_t)snprintf(list + len, len < sizeof list ? sizeof list - len : 0, "%s%s", bad > 1 ? ", " : "",
                            keys[i]);
  }
  mf_config_free(saved);
  if (!bad) return MF_OK;
  return MF_ERR(MF_ERR_CONFIG,
                "%s: the checkpoint was written with other settings that change the training: %s differ%s from "
                "this run's (only train.steps, threads, log_every, eval_every, overlap_optimizer, max_skipped_steps, "
                "data.valid, "
                "memory.*, hardware.*, output.* and backend may change on resume)",
                path, list, bad == 1 ? "s" : "");
}

/* ------------------------------------------------------------ reading */

/* One safetensors file of the checkpoint, decompressed when it is zstd. */
typedef struct in_file {
  const uint8_t *map;
  size_t map_size;
  uint8_t *raw; /* the decompressed image (zstd), else NULL */
  mf_safetensors *st;
  char path[4400];
} in_file;

static void in_close(in_file *f) {
  mf_safetensors_close(f->st);
  free(f->raw);
  mf_unmap_file(f->map, f->map_size);
  memset(f, 0, sizeof *f);
}

/* Undoes the byte-plane filter in place: the data after the safetensors
 * header of img[size], elements of w bytes, block by block (ckpt_internal.h). */
static mf_status join_planes(const char *path, uint8_t *img, size_t size, size_t w) {
  uint64_t head = 0;
  for (int i = 7; size >= 8 && i >= 0; i--) head = head << 8 | img[i];
  if (size < 8 || head > size - 8)
    return MF_ERR(MF_ERR_FORMAT, "%s: a safetensors header of %llu bytes in a %zu-byte file", path,
                  (unsigned long long)head, size);
  uint8_t *data = img + 8 + head;
  const size_t len = size - 8 - (size_t)head;
  if (len % w)
    return MF_ERR(MF_ERR_FORMAT, "%s: %zu bytes of tensor data are not whole elements of %zu bytes", path,
                  len, w);
  if (!len) return MF_OK;
  uint8_t *scratch = NULL;
  MF_CHECK(mf_malloc(len < MF_CKPT_PLANE_BLOCK ? len : MF_CKPT_PLANE_BLOCK, "checkpoint byte-plane buffer",
                     (void **)&scratch));
  for (size_t off = 0; off < len; off += MF_CKPT_PLANE_BLOCK) {
    const size_t n = len - off < MF_CKPT_PLANE_BLOCK ? len - off : MF_CKPT_PLANE_BLOCK;
    memcpy(scratch, data + off, n);
    mf_ckpt_planes_join(data + off, scratch, n, w);
  }
  free(scratch);
  return MF_OK;
}

/* Opens dir's <stem>.safetensors[.zst]; `planes` is the element size of its
 * tensors (all of one dtype), which the byte-plane filter split by. */
static mf_status in_open(const char *dir, const mf_ckpt_file *files, int n, const char *stem, size_t planes,
                         in_file *f) {
  const mf_ckpt_file *e = NULL;
  char plain[64], zst[64];
  snprintf(plain, sizeof plain, "%s.safetensors", stem);
  snprintf(zst, sizeof zst, "%s.safetensors.zst", stem);
  for (int i = 0; i < n; i++)
    if (strcmp(files[i].name, plain) == 0 || strcmp(files[i].name, zst) == 0) e = &files[i];
  snprintf(f->path, sizeof f->path, "%s/%s.safetensors", dir, stem);
  if (!e) return MF_ERR(MF_ERR_FORMAT, "%s/manifest.json: lists no %s.safetensors[.zst]", dir, stem);
  snprintf(f->path, sizeof f->path, "%s/%s", dir, e->name);
  MF_CHECK(map_checked(dir, e, &f->map, &f->map_size));
  const void *img = f->map;
  size_t size = f->map_size;
  if (e->zstd) {
    if (e->raw_bytes > SIZE_MAX) return MF_ERR(MF_ERR_FORMAT, "%s: raw_bytes too large", f->path);
    MF_CHECK(mf_malloc(e->raw_bytes ? (size_t)e->raw_bytes : 1, "a checkpoint file", (void **)&f->raw));
    const size_t got = ZSTD_decompress(f->raw, (size_t)e->raw_bytes, f->map, f->map_size);
    if (ZSTD_isError(got) || got != e->raw_bytes)
      return MF_ERR(MF_ERR_FORMAT, "%s: zstd: %s", f->path,
                    ZSTD_isError(got) ? ZSTD_getErrorName(got) : "fewer bytes than manifest.json's raw_bytes");
    img = f->raw;
    size = (size_t)e->raw_bytes;
    if (e->byteplane) MF_CHECK(join_planes(f->path, f->raw, size, planes));
  }
  return mf_safetensors_open_buffer(f->path, img, size, &f->st);
}

/* Copies tensor `name` (dtype dt, the shape of p, or [n] when p is NULL) into dst. */
static mf_status take(const in_file *f, const char *name, mf_dtype dt, const mf_param *p, int64_t n, void *dst) {
  const mf_st_tensor *x = mf_safetensors_find(f->st, name);
  if (!x) return MF_ERR(MF_ERR_FORMAT, "%s: no tensor '%s' (a checkpoint of another model?)", f->path, name);
  int ok = x->dtype == dt && x->ndim == (p ? p->ndim : 1);
  for (int d = 0; ok && d < x->ndim; d++) ok = x->shape[d] == (p ? p->shape[d] : n);
  if (!ok) {
    char want[64];
    if (p && p->ndim == 2)
      snprintf(want, sizeof want, "[%lld, %lld]", (long long)p->shape[0], (long long)p->shape[1]);
    else
      snprintf(want, sizeof want, "[%lld]", (long long)(p ? p->shape[0] : n));
    return MF_ERR(MF_ERR_FORMAT, "%s: tensor '%s' is %s of %d dims (first %lld); this run's model needs %s %s",
                  f->path, name, mf_dtype_name(x->dtype), x->ndim, (long long)(x->ndim ? x->shape[0] : 0),
                  mf_dtype_name(dt), want);
  }
  if (x->nbytes) memcpy(dst, x->data, x->nbytes);
  return MF_OK;
}

static mf_status read_tensors(const char *dir, const mf_ckpt_file *files, int nf, const mf_ckpt_data *d) {
  const mf_param_table *t = d->t;
  in_file f;
  memset(&f, 0, sizeof f);
  mf_status st = MF_OK;
  char name[128];
  MF_CHECK_GOTO(in_open(dir, files, nf, "master", 4, &f), st, done);
  for (int64_t i = 0; i < t->n; i++) { /* the trained parameters (write.c) */
    const mf_param *p = &t->params[i];
    if (p->frozen) continue;
    MF_CHECK_GOTO(take(&f, p->name, MF_DTYPE_F32, p, 0, d->master + p->offset), st, done);
  }
  in_close(&f);
  const size_t ms = mf_dtype_size(d->moments);
  MF_CHECK_GOTO(in_open(dir, files, nf, "optimizer", ms, &f), st, done);
  for (int64_t i = 0; i < t->n; i++) {
    const mf_param *p = &t->params[i];
    if (p->frozen) continue;
    snprintf(name, sizeof name, "exp_avg.%s", p->name);
    MF_CHECK_GOTO(take(&f, name, d->moments, p, 0, (char *)d->m + (size_t)p->toff * ms), st, done);
    snprintf(name, sizeof name, "exp_avg_sq.%s", p->name);
    MF_CHECK_GOTO(take(&f, name, d->moments, p, 0, (char *)d->v + (size_t)p->toff * ms), st, done);
  }
  in_close(&f);
  MF_CHECK_GOTO(in_open(dir, files, nf, "state", 8, &f), st, done);
  MF_CHECK_GOTO(take(&f, "adam_step", MF_DTYPE_I64, NULL, t->n, d->adam_steps), st, done);
  MF_CHECK_GOTO(take(&f, "routed_tokens", MF_DTYPE_I64, NULL, (int64_t)d->n_routed, d->routed), st, done);
done:
  in_close(&f);
  return st;
}

/* state.json's base_sum (LoRA: the frozen base's checksum) against `have`. */
static mf_status base_sum_matches(const char *path, const json_t *root, uint64_t have) {
  const char *sum = NULL;
  MF_CHECK(json_str(path, root, "state", "base_sum", &sum));
  char h[24];
  snprintf(h, sizeof h, "%016llx", (unsigned long long)have);
  if (strcmp(sum, h) == 0) return MF_OK;
  return MF_ERR(
      MF_ERR_CONFIG,
      "%s: base_sum: the checkpoint's adapters were trained on a base whose weights have checksum %s; "
      "this base (model.path or model.init) has %s: the base model changed",
      path, sum, h);
}

static mf_status read_state(const char *dir, const mf_ckpt_data *d, mf_ckpt_state *s) {
  char path[4400];
  snprintf(path, sizeof path, "%s/state.json", dir);
  json_t *root = NULL;
  MF_CHECK(load_json(path, "a checkpoint state", &root));
  mf_status st = MF_OK;
  const char *format = NULL, *moments = NULL;
  json_t *data = NULL, *model = NULL;
  uint64_t step = 0, total = 0, skipped = 0, params = 0, numel = 0;
  MF_CHECK_GOTO(json_str(path, root, "state", "format", &format), st, done);
  if (strcmp(format, MF_CKPT_FORMAT) != 0) {
    st = MF_ERR(MF_ERR_FORMAT, "%s: format '%s' is not %s", path, format, MF_CKPT_FORMAT);
    goto done;
  }
  MF_CHECK_GOTO(json_u64(path, root, "state", "step", &step), st, done);
  MF_CHECK_GOTO(json_u64(path, root, "state", "train_steps", &total), st, done);
  MF_CHECK_GOTO(json_u64(path, root, "state", "skipped", &skipped), st, done);
  MF_CHECK_GOTO(json_str(path, root, "state", "moments", &moments), st, done);
  MF_CHECK_GOTO(mf_io_json_get(path, root, "state", "data", &data), st, done);
  MF_CHECK_GOTO(json_u64(path, data, "data", "epoch", &s->data_epoch), st, done);
  MF_CHECK_GOTO(json_u64(path, data, "data", "index", &s->data_index), st, done);
  MF_CHECK_GOTO(json_u64(path, data, "data", "seed", &s->data_seed), st, done);
  MF_CHECK_GOTO(json_u64(path, data, "data", "windows", &s->data_windows), st, done);
  MF_CHECK_GOTO(mf_io_json_get(path, root, "state", "model", &model), st, done);
  MF_CHECK_GOTO(json_u64(path, model, "model", "params", &params), st, done);
  MF_CHECK_GOTO(json_u64(path, model, "model", "numel", &numel), st, done);
  if (params != (uint64_t)d->t->n || numel != (uint64_t)d->t->total_numel) {
    st = MF_ERR(MF_ERR_FORMAT, "%s: the checkpoint's model has %llu tensors of %llu values, this run's %lld of %lld",
                path, (unsigned long long)params, (unsigned long long)numel, (long long)d->t->n,
                (long long)d->t->total_numel);
    goto done;
  }
  if (strcmp(moments, mf_dtype_name(d->moments)) != 0) {
    st = MF_ERR(MF_ERR_FORMAT, "%s: moments: the checkpoint's AdamW moments are %s, this run stores %s", path, moments,
                mf_dtype_name(d->moments));
    goto done;
  }
  json_t *fl = json_object_get(root, "first_loss"), *lr = json_object_get(root, "lr");
  s->first_loss = json_is_number(fl) ? json_number_value(fl) : NAN;
  s->lr = json_is_number(lr) ? json_number_value(lr) : NAN;
  uint64_t ranks = 1;
  if (json_object_get(root, "ranks")) MF_CHECK_GOTO(json_u64(path, root, "state", "ranks", &ranks), st, done);
  if (ranks < 1) {
    st = MF_ERR(MF_ERR_FORMAT, "%s: state.ranks: 0 ranks", path);
    goto done;
  }
  s->ranks = (int64_t)ranks;
  if (d->t->lora_a) MF_CHECK_GOTO(base_sum_matches(path, root, d->base_sum), st, done); /* LoRA's base */
  s->step = (int64_t)step;
  s->train_steps = (int64_t)total;
  s->skipped = (int64_t)skipped;
done:
  json_decref(root);
  return st;
}

mf_status mf_ckpt_read(const char *dir, const mf_ckpt_data *d, mf_ckpt_state *s) {
  memset(s, 0, sizeof *s);
  MF_CHECK(mf_ckpt_verify(dir));
  mf_ckpt_file files[MF_CKPT_MAX_FILES];
  int n = 0;
  MF_CHECK(read_manifest(dir, files, &n));
  MF_CHECK(read_state(dir, d, s));
  return read_tensors(dir, files, n, d);
}

mf_status mf_ckpt_read_master(const char *dir, const mf_param_table *t, float *master) {
  MF_CHECK(mf_ckpt_verify(dir));
  mf_ckpt_file files[MF_CKPT_MAX_FILES];
  int n = 0;
  MF_CHECK(read_manifest(dir, files, &n));
  in_file f;
  memset(&f, 0, sizeof f);
  mf_status st = MF_OK;
  MF_CHECK_GOTO(in_open(dir, files, n, "master", 4, &f), st, done);
  for (int64_t i = 0; i < t->n; i++) {
    const mf_param *p = &t->params[i];
    if (p->frozen) continue;
    MF_CHECK_GOTO(take(&f, p->name, MF_DTYPE_F32, p, 0, master + p->offset), st, done);
  }
done:
  in_close(&f);
  return st;
}

mf_status mf_ckpt_base_is_bf16(const char *dir, int *bf16) {
  char path[4400];
  snprintf(path, sizeof path, "%s/state.json", dir);
  json_t *root = NULL;
  MF_CHECK(load_json(path, "a checkpoint state", &root));
  const char *of = NULL;
  mf_status st = json_str(path, root, "state", "base_sum_of", &of);
  if (st == MF_OK && strcmp(of, "bf16") != 0 && strcmp(of, "fp32") != 0)
    st = MF_ERR(MF_ERR_FORMAT, "%s: base_sum_of: '%s' is neither bf16 nor fp32", path, of);
  if (st == MF_OK) *bf16 = strcmp(of, "bf16") == 0;
  json_decref(root);
  return st;
}

mf_status mf_ckpt_read_lora_hot(const char *dir, int64_t layers, int64_t experts, uint8_t **hot) {
  *hot = NULL;
  char path[4400];
  snprintf(path, sizeof path, "%s/state.json", dir);
  json_t *root = NULL;
  MF_CHECK(load_json(path, "a checkpoint state", &root));
  const json_t *rows = json_object_get(root, "lora_hot");
  uint8_t *h = NULL;
  mf_status st = MF_OK;
  if (!json_is_array(rows) || (int64_t)json_array_size(rows) != layers)
    st = MF_ERR(MF_ERR_FORMAT,
                "%s: lora_hot: expected one list of hot experts for each of the %lld layers (a checkpoint of "
                "a run with train.lora.experts: hot)",
                path, (long long)layers);
  if (st == MF_OK)
    st = mf_calloc((size_t)(layers * experts > 0 ? layers * experts : 1), 1, "the hot experts", (void **)&h);
  for (int64_t l = 0; st == MF_OK && l < layers; l++) {
    const json_t *row = json_array_get(rows, (size_t)l);
    for (size_t i = 0; st == MF_OK && i < (json_is_array(row) ? json_array_size(row) : 1); i++) {
      const json_t *v = json_is_array(row) ? json_array_get(row, i) : NULL;
      const json_int_t e = json_is_integer(v) ? json_integer_value(v) : -1;
      if (e < 0 || e >= experts || h[l * experts + e])
        st = MF_ERR(MF_ERR_FORMAT, "%s: lora_hot[%lld][%zu]: not an expert index in [0, %lld) given once",
                    path, (long long)l, i, (long long)experts);
      else
        h[l * experts + e] = 1;
    }
  }
  json_decref(root);
  if (st != MF_OK) {
    free(h);
    return st;
  }
  *hot = h;
  return MF_OK;
}

mf_status mf_ckpt_check_base(const char *dir, const mf_param_table *t, const float *w,
                             const uint16_t *frozen_bf16) {
  char path[4400];
  snprintf(path, sizeof path, "%s/state.json", dir);
  json_t *root = NULL;
  MF_CHECK(load_json(path, "a checkpoint state", &root));
  const mf_status st = base_sum_matches(path, root, mf_ckpt_base_sum(t, w, frozen_bf16));
  json_decref(root);
  return st;
}
