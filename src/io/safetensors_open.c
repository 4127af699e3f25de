/*
 * safetensors reading, part 2: opening a single file (read-only mmap), a
 * buffer, or a sharded set through model.safetensors.index.json; the handle
 * and its accessors. The parser is safetensors_parse.c; the rules are listed
 * in safetensors.h.
 */
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "src/io/safetensors_impl.h"

/* ---------------------------------------------------------------- objects */

static mf_status st_new(size_t n_shards, mf_safetensors **out) {
  mf_safetensors *st;
  *out = NULL;
  MF_CHECK(mf_calloc(1, sizeof *st, "a safetensors handle", (void **)&st));
  mf_status s =
      mf_calloc(n_shards ? n_shards : 1, sizeof(st_shard), "safetensors shards", (void **)&st->shards);
  if (s != MF_OK) {
    free(st);
    return s;
  }
  st->n_shards = n_shards;
  *out = st;
  return MF_OK;
}

void mf_safetensors_close(mf_safetensors *st) {
  if (!st) return;
  for (size_t i = 0; i < st->n_shards; i++) {
    if (st->shards[i].mapped) mf_unmap_file(st->shards[i].base, st->shards[i].size);
    free(st->shards[i].path);
  }
  free(st->shards);
  free(st->tensors);
  free(st->by_name);
  free(st->meta);
  free(st->index_meta);
  free(st->index_path);
  while (st->pool) {
    st_chunk *next = st->pool->next;
    free(st->pool);
    st->pool = next;
  }
  free(st);
}

static int st_cmp_name_idx(const void *a, const void *b, void *ctx) {
  const mf_st_tensor *t = (const mf_st_tensor *)ctx;
  return strcmp(t[*(const size_t *)a].name, t[*(const size_t *)b].name);
}

static mf_status st_index_names(mf_safetensors *st) {
  MF_CHECK(mf_calloc(st->n ? st->n : 1, sizeof(size_t), "the tensor name index", (void **)&st->by_name));
  for (size_t i = 0; i < st->n; i++) st->by_name[i] = i;
  qsort_r(st->by_name, st->n, sizeof(size_t), st_cmp_name_idx, st->tensors);
  return MF_OK;
}

/* Maps `path` read-only. *errno_out gets errno when open/stat fails. A file
 * too short to parse is refused by mf_st_parse. */
static mf_status st_map(const char *path, st_shard *sh, int *errno_out) {
  MF_CHECK(mf_map_file(path, &sh->base, &sh->size, errno_out));
  sh->mapped = 1;
  return MF_OK;
}

/* A handle of one shard named `name`: the caller's bytes, or with `map` the
 * file `name` mapped. */
static mf_status st_open_single(const char *name, int map, const void *bytes, size_t size,
                                mf_safetensors **out) {
  mf_safetensors *st;
  int e;
  mf_status s;
  MF_CHECK(st_new(1, &st));
  st_shard *sh = &st->shards[0];
  if (!(sh->path = mf_strdup(name))) {
    s = MF_ERR(MF_ERR_OUT_OF_MEMORY, "out of host memory");
    goto fail;
  }
  if (map) {
    MF_CHECK_GOTO(st_map(name, sh, &e), s, fail);
  } else {
    sh->base = (const uint8_t *)bytes;
    sh->size = size;
  }
  MF_CHECK_GOTO(mf_st_parse(st, 0, name, sh->base, sh->size), s, fail);
  MF_CHECK_GOTO(st_index_names(st), s, fail);
  *out = st;
  return MF_OK;
fail:
  mf_safetensors_close(st);
  return s;
}

mf_status mf_safetensors_open_buffer(const char *label, const void *bytes, size_t size,
                                     mf_safetensors **out) {
  if (!out || (!bytes && size))
    return MF_ERR(MF_ERR_INVALID_ARG, "mf_safetensors_open_buffer: NULL argument");
  *out = NULL;
  return st_open_single(label ? label : "<buffer>", 0, bytes, size, out);
}

mf_status mf_safetensors_open_file(const char *path, mf_safetensors **out) {
  if (!path || !out) return MF_ERR(MF_ERR_INVALID_ARG, "mf_safetensors_open_file: NULL argument");
  *out = NULL;
  return st_open_single(path, 1, NULL, 0, out);
}

/* ------------------------------------------------------------ sharded sets */

static int st_safe_file_name(const char *s) {
  if (!s[0] || strcmp(s, ".") == 0 || strcmp(s, "..") == 0) return 0;
  for (const char *p = s; *p; p++)
    if (*p == '/' || *p == '\\' || (unsigned char)*p < 0x20) return 0;
  return 1;
}

static int st_cmp_str(const void *a, const void *b) {
  return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Fills index_meta from the index's "metadata" (non-strings as compact JSON). */
static mf_status st_index_metadata(mf_safetensors *st, const char *path, json_t *meta) {
  size_t cap = 0;
  const char *k;
  json_t *v;
  json_t *ts = json_object_get(meta, "total_size");
  uint64_t dummy;
  if (ts && !mf_st_json_uint(ts, &dummy))
    return MF_ERR(MF_ERR_FORMAT, "%s: metadata.total_size is %s, expected a non-negative integer", path,
                  json_is_integer(ts) ? "negative" : st_json_kind(ts));
  json_object_foreach(meta, k, v) {
    if (json_is_string(v)) {
      MF_CHECK(mf_st_add_meta(st, &st->index_meta, &st->n_index_meta, &cap, k, json_string_value(v),
                              json_string_length(v)));
    } else {
      char *text = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
      if (!text) return MF_ERR(MF_ERR_OUT_OF_MEMORY, "out of host memory");
      mf_status s = mf_st_add_meta(st, &st->index_meta, &st->n_index_meta, &cap, k, text, strlen(text));
      free(text);
      MF_CHECK(s);
    }
  }
  return MF_OK;
}

/* A JSON file without "weight_map": a Hugging Face config.json (it has
 * model_type or architectures) is named as one, with the directory to open
 * instead; anything else is not an index. */
static mf_status st_no_weight_map(const char *path, json_t *root) {
  json_t *type = json_object_get(root, "model_type");
  if (type || json_object_get(root, "architectures")) {
    const char *slash = strrchr(path, '/');
    const int dir_len = slash ? (slash == path ? 1 : (int)(slash - path)) : 1; /* "/config.json": "/" */
    return MF_ERR(
        MF_ERR_FORMAT,
        "%s: a Hugging Face model config.json (model_type %.60s), not safetensors weights or their index "
        "(no \"weight_map\" key): open the model directory, %.*s, instead",
        path, json_is_string(type) ? json_string_value(type) : "not given", dir_len, slash ? path : ".");
  }
  return MF_ERR(
      MF_ERR_FORMAT,
      "%s: no \"weight_map\" key: not a safetensors index (model.safetensors.index.json maps each tensor to "
      "its shard)",
      path);
}

/* Opens the set of an index. `want_shard` (a basename, may be NULL) must be one
 * of its shards: opening a shard file opens its set. */
static mf_status st_open_index(const char *path, const char *want_shard, mf_safetensors **out) {
  char *text = NULL;
  size_t size = 0;
  json_t *root = NULL;
  const char **names = NULL;
  mf_safetensors *st = NULL;
  char *dir = NULL;
  mf_status s = MF_OK;
  *out = NULL;
  MF_CHECK(mf_read_file(path, MF_ST_MAX_INDEX_BYTES, "an index", &text, &size));
  MF_CHECK_GOTO(mf_st_json_load(path, "index", (const uint8_t *)text, size, 0, 16, &root), s, done);

  json_t *wm = json_object_get(root, "weight_map");
  json_t *meta = json_object_get(root, "metadata");
  if (!wm) {
    s = st_no_weight_map(path, root);
    goto done;
  }
  if (!json_is_object(wm)) {
    s = MF_ERR(MF_ERR_FORMAT, "%s: weight_map is %s, expected an object", path, st_json_kind(wm));
    goto done;
  }
  if (meta && !json_is_object(meta)) {
    s = MF_ERR(MF_ERR_FORMAT, "%s: metadata is %s, expected an object", path, st_json_kind(meta));
    goto done;
  }

  /* The distinct shard names, sorted (model-00001-of-... come out in order). */
  size_t n_wm = json_object_size(wm), n_names = 0;
  MF_CHECK_GOTO(mf_calloc(n_wm ? n_wm : 1, sizeof(char *), "shard names", (void **)&names), s, done);
  const char *tname;
  json_t *v;
  json_object_foreach(wm, tname, v) {
    if (!json_is_string(v)) {
      s = MF_ERR(MF_ERR_FORMAT, "%s: weight_map[" QNAME "] is %s, expected a shard file name", path, tname,
                 st_json_kind(v));
      goto done;
    }
    if (!st_safe_file_name(json_string_value(v))) {
      s = MF_ERR(MF_ERR_FORMAT,
                 "%s: weight_map[" QNAME "] names shard " QNAME
                 ", which is not a plain file name in the index's directory",
                 path, tname, json_string_value(v));
      goto done;
    }
    names[n_names++] = json_string_value(v);
  }
  qsort(names, n_names, sizeof(char *), st_cmp_str);
  size_t n_shards = 0;
  for (size_t i = 0; i < n_names; i++)
    if (i == 0 || strcmp(names[i], names[i - 1]) != 0) names[n_shards++] = names[i];
  if (want_shard && !bsearch(&want_shard, names, n_shards, sizeof(char *), st_cmp_str)) {
    s = MF_ERR(MF_ERR_FORMAT, "%s: the index does not list shard " QNAME, path, want_shard);
    goto done;
  }

  const char *slash = strrchr(path, '/');
  size_t dlen = slash ? (size_t)(slash - path) + 1 : 0;
  MF_CHECK_GOTO(mf_malloc(dlen + 1, "a path", (void **)&dir), s, done);
  memcpy(dir, path, dlen);
  dir[dlen] = 0;

  MF_CHECK_GOTO(st_new(n_shards, &st), s, done);
  if (!(st->index_path = mf_strdup(path))) {
    s = MF_ERR(MF_ERR_OUT_OF_MEMORY, "out of host memory");
    goto done;
  }
  for (size_t i = 0; i < n_shards; i++) {
    st_shard *sh = &st->shards[i];
    size_t plen = dlen + strlen(names[i]) + 1;
    MF_CHECK_GOTO(mf_malloc(plen, "a path", (void **)&sh->path), s, done);
    snprintf(sh->path, plen, "%s%s", dir, names[i]);
    int e;
    s = st_map(sh->path, sh, &e);
    if (s != MF_OK) {
      if (e == ENOENT)
        s = MF_ERR(MF_ERR_FORMAT, "%s: weight_map names shard " QNAME ", which does not exist (%s)", path,
                   names[i], sh->path);
      goto done;
    }
    MF_CHECK_GOTO(mf_st_parse(st, (int)i, sh->path, sh->base, sh->size), s, done);
  }
  MF_CHECK_GOTO(st_index_names(st), s, done);

  /* A tensor in two shards (unlisted in both, or listed for one of them). */
  for (size_t i = 1; i < st->n; i++) {
    const mf_st_tensor *a = &st->tensors[st->by_name[i - 1]], *b = &st->tensors[st->by_name[i]];
    if (strcmp(a->name, b->name) == 0) {
      s = MF_ERR(MF_ERR_FORMAT, "%s: tensor " QNAME " is in two shards: %s and %s", path, a->name,
                 names[a->shard], names[b->shard]);
      goto done;
    }
  }
  /* Every shard tensor where weight_map says; unlisted ones kept, with a warning. */
  size_t unlisted = 0;
  for (size_t i = 0; i < st->n; i++) {
    const mf_st_tensor *t = &st->tensors[i];
    json_t *m = json_object_get(wm, t->name);
    if (!m) {
      if (unlisted++ < 5)
        MF_LOGW("io", "%s: tensor \"%.200s\" in shard %s is not in weight_map; keeping it", path, t->name,
                names[t->shard]);
    } else if (strcmp(json_string_value(m), names[t->shard]) != 0) {
      s = MF_ERR(MF_ERR_FORMAT, "%s: tensor " QNAME " is in shard %s, but weight_map maps it to %s", path,
                 t->name, names[t->shard], json_string_value(m));
      goto done;
    }
  }
  if (unlisted > 5) MF_LOGW("io", "%s: %zu shard tensors in all are not in weight_map", path, unlisted);
  json_object_foreach(wm, tname, v) {
    if (!mf_safetensors_find(st, tname)) {
      s = MF_ERR(MF_ERR_FORMAT, "%s: weight_map maps tensor " QNAME " to shard %s, which has no such tensor",
                 path, tname, json_string_value(v));
      goto done;
    }
  }
  if (meta) {
    MF_CHECK_GOTO(st_index_metadata(st, path, meta), s, done);
    json_t *ts = json_object_get(meta, "total_size");
    if (ts && (uint64_t)json_integer_value(ts) != st->total_bytes)
      MF_LOGW("io", "%s: metadata.total_size is %lld but the tensors hold %llu bytes", path,
              (long long)json_integer_value(ts), (unsigned long long)st->total_bytes);
  }
  *out = st;
  st = NULL;
  s = MF_OK;
done:
  mf_safetensors_close(st);
  free(dir);
  free(names);
  json_decref(root);
  free(text);
  return s;
}

/* Anything at path: a FIFO or a directory named model.safetensors is not
 * taken for absent, the reader refuses it by name (mf_open_regular). */
static int st_exists(const char *path) {
  struct stat sb;
  return stat(path, &sb) == 0;
}

static int st_ends_with(const char *s, const char *suffix) {
  size_t n = strlen(s), m = strlen(suffix);
  return n >= m && strcmp(s + n - m, suffix) == 0;
}

/* "PREFIX-00001-of-00003.safetensors" -> strlen(PREFIX), or 0 if not a shard name. */
static size_t st_shard_prefix(const char *base) {
  static const char tail[] = "-00000-of-00000.safetensors";
  size_t n = strlen(base), m = sizeof tail - 1;
  if (n <= m) return 0;
  const char *p = base + n - m;
  for (size_t i = 0; i < m; i++) {
    if (tail[i] == '0' ? (p[i] < '0' || p[i] > '9') : p[i] != tail[i]) return 0;
  }
  return n - m;
}

mf_status mf_safetensors_open(const char *path, mf_safetensors **out) {
  if (!path || !out) return MF_ERR(MF_ERR_INVALID_ARG, "mf_safetensors_open: NULL argument");
  *out = NULL;
  struct stat sb;
  if (stat(path, &sb) != 0) return MF_ERR(MF_ERR_IO, "%s: %s", path, strerror(errno));
  char buf[4096];
  if (strlen(path) > sizeof buf - 64) return MF_ERR(MF_ERR_INVALID_ARG, "%.200s...: path too long", path);
  if (S_ISDIR(sb.st_mode)) {
    const char *sep = st_ends_with(path, "/") ? "" : "/";
    char idx[4096];
    snprintf(buf, sizeof buf, "%s%smodel.safetensors", path, sep);
    snprintf(idx, sizeof idx, "%s%smodel.safetensors.index.json", path, sep);
    if (st_exists(buf)) {
      if (st_exists(idx))
        MF_LOGW("io",
                "%s: has both model.safetensors and model.safetensors.index.json; reading model.safetensors",
                path);
      return mf_safetensors_open_file(buf, out);
    }
    if (st_exists(idx)) return st_open_index(idx, NULL, out);
    return MF_ERR(MF_ERR_IO, "%s: directory has neither model.safetensors nor model.safetensors.index.json",
                  path);
  }
  if (st_ends_with(path, ".json")) return st_open_index(path, NULL, out);
  const char *slash = strrchr(path, '/');
  const char *base = slash ? slash + 1 : path;
  size_t prefix = st_shard_prefix(base);
  if (prefix) {
    snprintf(buf, sizeof buf, "%.*s.safetensors.index.json", (int)(base - path + (ptrdiff_t)prefix), path);
    if (st_exists(buf)) return st_open_index(buf, base, out);
  }
  return mf_safetensors_open_file(path, out);
}

/* -------------------------------------------------------------- accessors */

size_t mf_safetensors_count(const mf_safetensors *st) {
  return st ? st->n : 0;
}

const mf_st_tensor *mf_safetensors_get(const mf_safetensors *st, size_t i) {
  return st && i < st->n ? &st->tensors[i] : NULL;
}

const mf_st_tensor *mf_safetensors_find(const mf_safetensors *st, const char *name) {
  if (!st || !name || !st->by_name) return NULL;
  size_t lo = 0, hi = st->n;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    int c = strcmp(st->tensors[st->by_name[mid]].name, name);
    if (c == 0) return &st->tensors[st->by_name[mid]];
    if (c < 0)
      lo = mid + 1;
    else
      hi = mid;
  }
  return NULL;
}

uint64_t mf_safetensors_total_bytes(const mf_safetensors *st) {
  return st ? st->total_bytes : 0;
}

size_t mf_safetensors_metadata_count(const mf_safetensors *st) {
  return st ? st->n_meta : 0;
}

const mf_st_meta *mf_safetensors_metadata_at(const mf_safetensors *st, size_t i) {
  return st && i < st->n_meta ? &st->meta[i] : NULL;
}

const char *mf_safetensors_metadata(const mf_safetensors *st, const char *key) {
  if (!st || !key) return NULL;
  for (size_t i = 0; i < st->n_meta; i++)
    if (strcmp(st->meta[i].key, key) == 0) return st->meta[i].value;
  return NULL;
}

size_t mf_safetensors_shard_count(const mf_safetensors *st) {
  return st ? st->n_shards : 0;
}

const char *mf_safetensors_shard_path(const mf_safetensors *st, size_t i) {
  return st && i < st->n_shards ? st->shards[i].path : NULL;
}

const char *mf_safetensors_index_path(const mf_safetensors *st) {
  return st ? st->index_path : NULL;
}

size_t mf_safetensors_index_metadata_count(const mf_safetensors *st) {
  return st ? st->n_index_meta : 0;
}

const mf_st_meta *mf_safetensors_index_metadata_at(const mf_safetensors *st, size_t i) {
  return st && i < st->n_index_meta ? &st->index_meta[i] : NULL;
}
