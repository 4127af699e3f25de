/* Reading a resume checkpoint (ckpt.h): the manifest and every checksum
 * first (manifest.c), then state.json (state.c) and the tensors into the
 * run's buffers, checked against its table; the newest complete checkpoint;
 * the config it was written under, compared only once its bytes are
 * verified. */
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

mf_status mf_ckpt_load_config(const char *dir, mf_config_use use, mf_config **cfg) {
  *cfg = NULL;
  mf_ckpt_manifest m;
  MF_CHECK(mf_ckpt_manifest_load(dir, &m));
  char *text = NULL, path[4400];
  size_t len = 0;
  MF_CHECK(mf_ckpt_read_checked(&m, "config.yaml", &text, &len));
  snprintf(path, sizeof path, "%s/config.yaml", dir);
  /* the bytes just verified, not the file read again */
  const mf_status st = mf_config_load_string_for(text, len, path, NULL, 0, use, cfg);
  free(text);
  if (st != MF_OK)
    return MF_ERR(MF_ERR_FORMAT, "%s: the checkpoint's config does not load: %s", path, mf_last_error());
  return MF_OK;
}

/* state.json's ranks, verified. */
static mf_status state_ranks(const char *dir, int64_t *ranks) {
  mf_ckpt_manifest m;
  MF_CHECK(mf_ckpt_manifest_load(dir, &m));
  mf_ckpt_state_file f;
  MF_CHECK(mf_ckpt_state_open(&m, &f));
  *ranks = f.s.ranks;
  mf_ckpt_state_close(&f);
  return MF_OK;
}

mf_status mf_ckpt_check_config(const char *dir, const mf_config *cfg) {
  char path[4400];
  snprintf(path, sizeof path, "%s/config.yaml", dir);
  int64_t saved_ranks = 1;
  mf_config *saved = NULL;
  MF_CHECK(state_ranks(dir, &saved_ranks));
  MF_CHECK(mf_ckpt_load_config(dir, MF_CONFIG_FOR_TRAIN, &saved));
  const char *keys[256];
  const size_t n = mf_config_diff(saved, cfg, keys, sizeof keys / sizeof keys[0]);
  char list[2048] = "";
  size_t len = 0, bad = 0;
  const int64_t ranks = cfg->ranks > 1 ? cfg->ranks : 1;
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

/* Opens <stem>.safetensors[.zst] of the manifest m; `planes` is the element
 * size of its tensors (all of one dtype), which the byte-plane filter split
 * by. What is opened is checked whole: the bytes on disk (hash), and, once
 * decompressed and joined, the file as written (raw_hash). */
static mf_status in_open(const mf_ckpt_manifest *m, const char *stem, size_t planes, in_file *f) {
  const mf_ckpt_file *e = mf_ckpt_manifest_tensors(m, stem);
  snprintf(f->path, sizeof f->path, "%s/%s.safetensors", m->dir, stem);
  if (!e) return MF_ERR(MF_ERR_FORMAT, "%s/manifest.json: lists no %s.safetensors[.zst]", m->dir, stem);
  snprintf(f->path, sizeof f->path, "%s/%s", m->dir, e->name);
  MF_CHECK(mf_ckpt_map_checked(m->dir, e, &f->map, &f->map_size));
  const void *img = f->map;
  size_t size = f->map_size;
  if (e->zstd) {
    /* The writer streams (no size in the frame header); a size given must agree. */
    const unsigned long long frame = ZSTD_getFrameContentSize(f->map, f->map_size);
    if (frame == ZSTD_CONTENTSIZE_ERROR)
      return MF_ERR(MF_ERR_FORMAT, "%s: not a zstd frame", f->path);
    if ((frame != ZSTD_CONTENTSIZE_UNKNOWN && frame != e->raw_bytes) || e->raw_bytes > SIZE_MAX)
      return MF_ERR(MF_ERR_FORMAT, "%s: its zstd frame holds %llu bytes, manifest.json's raw_bytes says %llu",
                    f->path, frame, (unsigned long long)e->raw_bytes);
    if (mf_malloc(e->raw_bytes ? (size_t)e->raw_bytes : 1, "a checkpoint file", (void **)&f->raw) != MF_OK)
      return MF_ERR(MF_ERR_OUT_OF_MEMORY, "%s: no memory for its %llu bytes decompressed", f->path,
                    (unsigned long long)e->raw_bytes);
    const size_t got = ZSTD_decompress(f->raw, (size_t)e->raw_bytes, f->map, f->map_size);
    if (ZSTD_isError(got) || got != e->raw_bytes)
      return MF_ERR(MF_ERR_FORMAT, "%s: zstd: %s", f->path,
                    ZSTD_isError(got) ? ZSTD_getErrorName(got) : "fewer bytes than manifest.json's raw_bytes");
    img = f->raw;
    size = (size_t)e->raw_bytes;
    if (e->byteplane) MF_CHECK(join_planes(f->path, f->raw, size, planes));
    const uint64_t h = mf_ckpt_hash64(img, size);
    if (h != e->raw_hash)
      return MF_ERR(MF_ERR_FORMAT,
                    "%s: decompressed%s, its checksum is %016llx, manifest.json's raw_hash says %016llx (the file "
                    "or how the manifest says to read it is wrong)",
                    f->path, e->byteplane ? " and its byte planes joined" : "", (unsigned long long)h,
                    (unsigned long long)e->raw_hash);
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

static mf_status read_tensors(const mf_ckpt_manifest *m, const mf_ckpt_data *d) {
  const mf_param_table *t = d->t;
  in_file f;
  memset(&f, 0, sizeof f);
  mf_status st = MF_OK;
  char name[128];
  MF_CHECK_GOTO(in_open(m, "master", 4, &f), st, done);
  for (int64_t i = 0; i < t->n; i++) { /* the trained parameters (write.c) */
    const mf_param *p = &t->params[i];
    if (p->frozen) continue;
    MF_CHECK_GOTO(take(&f, p->name, MF_DTYPE_F32, p, 0, d->master + p->offset), st, done);
  }
  in_close(&f);
  const size_t ms = mf_dtype_size(d->moments);
  MF_CHECK_GOTO(in_open(m, "optimizer", ms, &f), st, done);
  for (int64_t i = 0; i < t->n; i++) {
    const mf_param *p = &t->params[i];
    if (p->frozen) continue;
    snprintf(name, sizeof name, "exp_avg.%s", p->name);
    MF_CHECK_GOTO(take(&f, name, d->moments, p, 0, (char *)d->m + (size_t)p->toff * ms), st, done);
    snprintf(name, sizeof name, "exp_avg_sq.%s", p->name);
    MF_CHECK_GOTO(take(&f, name, d->moments, p, 0, (char *)d->v + (size_t)p->toff * ms), st, done);
  }
  in_close(&f);
  MF_CHECK_GOTO(in_open(m, "state", 8, &f), st, done);
  MF_CHECK_GOTO(take(&f, "adam_step", MF_DTYPE_I64, NULL, t->n, d->adam_steps), st, done);
  MF_CHECK_GOTO(take(&f, "routed_tokens", MF_DTYPE_I64, NULL, (int64_t)d->n_routed, d->routed), st, done);
done:
  in_close(&f);
  return st;
}

/* state.json's base_sum (LoRA: the frozen base's checksum) against `have`. */
static mf_status base_sum_matches(const mf_ckpt_state_file *f, uint64_t have) {
  if (!f->has_base)
    return MF_ERR(MF_ERR_CONFIG, "%s: no base_sum: not the checkpoint of a LoRA run (its base is not recorded)",
                  f->path);
  if (f->base_sum == have) return MF_OK;
  return MF_ERR(
      MF_ERR_CONFIG,
      "%s: base_sum: the checkpoint's adapters were trained on a base whose weights have checksum %016llx; "
      "this base (model.path or model.init) has %016llx: the base model changed",
      f->path, (unsigned long long)f->base_sum, (unsigned long long)have);
}

/* state.json against the run's table and buffers. */
static mf_status state_fits(const mf_ckpt_state_file *f, const mf_ckpt_data *d) {
  const mf_param_table *t = d->t;
  if (f->params != (uint64_t)t->n || f->numel != (uint64_t)t->total_numel || f->experts_routed != d->n_routed)
    return MF_ERR(MF_ERR_FORMAT,
                  "%s: the checkpoint's model has %llu tensors of %llu values and %llu routing counts, this run's "
                  "%lld of %lld and %zu",
                  f->path, (unsigned long long)f->params, (unsigned long long)f->numel,
                  (unsigned long long)f->experts_routed, (long long)t->n, (long long)t->total_numel, d->n_routed);
  if (f->moments != d->moments)
    return MF_ERR(MF_ERR_FORMAT, "%s: moments: the checkpoint's AdamW moments are %s, this run stores %s", f->path,
                  mf_dtype_name(f->moments), mf_dtype_name(d->moments));
  if (t->lora_a) return base_sum_matches(f, d->base_sum); /* LoRA's base */
  if (f->has_base)
    return MF_ERR(MF_ERR_CONFIG, "%s: base_sum: a LoRA run's checkpoint (its adapters), read as a full model's",
                  f->path);
  return MF_OK;
}

/* What state.safetensors holds against state.json: a parameter's AdamW steps
 * are the steps it was updated in, never more than the steps not skipped;
 * routing counts are counts. */
static mf_status counts_fit(const char *dir, const mf_ckpt_data *d, const mf_ckpt_state *s) {
  const int64_t taken = s->step - s->skipped;
  for (int64_t i = 0; i < d->t->n; i++)
    if (d->adam_steps[i] < 0 || d->adam_steps[i] > taken)
      return MF_ERR(MF_ERR_FORMAT,
                    "%s/state.safetensors: adam_step of %s is %lld, but state.json's step %lld with %lld skipped "
                    "took %lld updates",
                    dir, d->t->params[i].name, (long long)d->adam_steps[i], (long long)s->step,
                    (long long)s->skipped, (long long)taken);
  for (size_t i = 0; i < d->n_routed; i++)
    if (d->routed[i] < 0)
      return MF_ERR(MF_ERR_FORMAT, "%s/state.safetensors: routed_tokens[%zu] is %lld", dir, i, (long long)d->routed[i]);
  return MF_OK;
}

mf_status mf_ckpt_read(const char *dir, const mf_ckpt_data *d, mf_ckpt_state *s) {
  memset(s, 0, sizeof *s);
  MF_CHECK(mf_ckpt_verify(dir));
  mf_ckpt_manifest m;
  MF_CHECK(mf_ckpt_manifest_load(dir, &m));
  mf_ckpt_state_file f;
  MF_CHECK(mf_ckpt_state_open(&m, &f));
  mf_status st = state_fits(&f, d);
  const mf_ckpt_state got = f.s;
  mf_ckpt_state_close(&f);
  MF_CHECK(st);
  MF_CHECK(read_tensors(&m, d));
  MF_CHECK(counts_fit(dir, d, &got));
  *s = got;
  return MF_OK;
}

mf_status mf_ckpt_read_master(const char *dir, const mf_param_table *t, float *master) {
  MF_CHECK(mf_ckpt_verify(dir));
  mf_ckpt_manifest m;
  MF_CHECK(mf_ckpt_manifest_load(dir, &m));
  in_file f;
  memset(&f, 0, sizeof f);
  mf_status st = MF_OK;
  MF_CHECK_GOTO(in_open(&m, "master", 4, &f), st, done);
  for (int64_t i = 0; i < t->n; i++) {
    const mf_param *p = &t->params[i];
    if (p->frozen) continue;
    MF_CHECK_GOTO(take(&f, p->name, MF_DTYPE_F32, p, 0, master + p->offset), st, done);
  }
done:
  in_close(&f);
  return st;
}

/* dir's state.json, verified (the manifest first). */
static mf_status open_state(const char *dir, mf_ckpt_state_file *f) {
  mf_ckpt_manifest m;
  MF_CHECK(mf_ckpt_manifest_load(dir, &m));
  return mf_ckpt_state_open(&m, f);
}

mf_status mf_ckpt_base_is_bf16(const char *dir, int *bf16) {
  mf_ckpt_state_file f;
  MF_CHECK(open_state(dir, &f));
  const mf_status st = f.has_base ? MF_OK
                                  : MF_ERR(MF_ERR_FORMAT, "%s: no base_sum_of: not the checkpoint of a LoRA run",
                                           f.path);
  if (st == MF_OK) *bf16 = f.base_bf16;
  mf_ckpt_state_close(&f);
  return st;
}

mf_status mf_ckpt_read_lora_hot(const char *dir, int64_t layers, int64_t experts, uint8_t **hot) {
  *hot = NULL;
  mf_ckpt_state_file f;
  MF_CHECK(open_state(dir, &f));
  const char *path = f.path;
  const json_t *rows = json_object_get(f.root, "lora_hot");
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
  mf_ckpt_state_close(&f);
  if (st != MF_OK) {
    free(h);
    return st;
  }
  *hot = h;
  return MF_OK;
}

mf_status mf_ckpt_check_base(const char *dir, const mf_param_table *t, const float *w,
                             const uint16_t *frozen_bf16) {
  mf_ckpt_state_file f;
  MF_CHECK(open_state(dir, &f));
  const mf_status st = base_sum_matches(&f, mf_ckpt_base_sum(t, w, frozen_bf16));
  mf_ckpt_state_close(&f);
  return st;
}

mf_status mf_ckpt_read_base_json(const char *dir, char **json) {
  *json = NULL;
  mf_ckpt_manifest m;
  MF_CHECK(mf_ckpt_manifest_load(dir, &m));
  if (!mf_ckpt_manifest_find(&m, "base.json")) return MF_OK; /* the manifest lists what is there (check_disk) */
  char *text = NULL;
  size_t len = 0;
  MF_CHECK(mf_ckpt_read_checked(&m, "base.json", &text, &len));
  json_error_t e;
  json_t *root = strlen(text) == len ? json_loadb(text, len, JSON_DECODE_ANY, &e) : NULL;
  if (!root) {
    free(text);
    return MF_ERR(MF_ERR_FORMAT, "%s/base.json: not a JSON document (it matches the manifest: the writer's fault)",
                  dir);
  }
  json_decref(root);
  *json = text;
  return MF_OK;
}
