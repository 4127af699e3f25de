/*
 * safetensors writing: single files and sharded sets, laid out like the
 * reference writer (header padded with spaces to a multiple of 8, tensors by
 * dtype size descending, then name) and written atomically (mf_atomic_file:
 * PATH.tmp, fsync, rename, fsync of the directory). Everything the caller
 * passes is checked before the first byte is written.
 */
#include "src/io/safetensors.h"

#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct st_item {
  const mf_st_tensor *t;
  uint64_t nbytes;
} st_item;

/* ------------------------------------------------------------- validation */

static int st_utf8_ok(const char *s) {
  json_t *j = json_string(s); /* jansson refuses invalid UTF-8 */
  if (!j) return 0;
  json_decref(j);
  return 1;
}

static int st_cmp_item_name(const void *a, const void *b) {
  return strcmp(((const st_item *)a)->t->name, ((const st_item *)b)->t->name);
}

/* Checks tensors and metadata; fills items[i] = {tensors + i, its bytes}. */
static mf_status st_validate(const char *path, const mf_st_tensor *ts, size_t n, const mf_st_meta *meta,
                             size_t n_meta, st_item *items) {
  if (n && !ts) return MF_ERR(MF_ERR_INVALID_ARG, "%s: tensors is NULL", path);
  if (n_meta && !meta) return MF_ERR(MF_ERR_INVALID_ARG, "%s: metadata is NULL", path);
  for (size_t i = 0; i < n; i++) {
    const mf_st_tensor *t = &ts[i];
    if (!t->name || !t->name[0])
      return MF_ERR(MF_ERR_INVALID_ARG, "%s: tensor %zu has an empty name", path, i);
    if (strcmp(t->name, "__metadata__") == 0)
      return MF_ERR(MF_ERR_INVALID_ARG, "%s: tensor %zu is named \"__metadata__\", which is reserved", path,
                    i);
    if (!st_utf8_ok(t->name))
      return MF_ERR(MF_ERR_INVALID_ARG, "%s: tensor %zu: name is not valid UTF-8", path, i);
    if (mf_dtype_size(t->dtype) == 0)
      return MF_ERR(MF_ERR_INVALID_ARG, "%s: tensor \"%.200s\": invalid dtype %d", path, t->name,
                    (int)t->dtype);
    if (t->ndim < 0 || t->ndim > MF_ST_MAX_DIMS)
      return MF_ERR(MF_ERR_INVALID_ARG, "%s: tensor \"%.200s\": ndim %d is outside 0..%d", path, t->name,
                    t->ndim, MF_ST_MAX_DIMS);
    uint64_t numel = 1, nbytes;
    for (int d = 0; d < t->ndim; d++) {
      if (t->shape[d] < 0)
        return MF_ERR(MF_ERR_INVALID_ARG, "%s: tensor \"%.200s\": shape[%d] = %lld is negative", path,
                      t->name, d, (long long)t->shape[d]);
      if (__builtin_mul_overflow(numel, (uint64_t)t->shape[d], &numel))
        return MF_ERR(MF_ERR_INVALID_ARG, "%s: tensor \"%.200s\": shape overflows", path, t->name);
    }
    if (__builtin_mul_overflow(numel, (uint64_t)mf_dtype_size(t->dtype), &nbytes) ||
        nbytes > (uint64_t)INT64_MAX)
      return MF_ERR(MF_ERR_INVALID_ARG, "%s: tensor \"%.200s\": byte size overflows", path, t->name);
    if (nbytes && !t->data && !t->fill)
      return MF_ERR(MF_ERR_INVALID_ARG, "%s: tensor \"%.200s\": data is NULL for %llu bytes", path, t->name,
                    (unsigned long long)nbytes);
    items[i].t = t;
    items[i].nbytes = nbytes;
  }
  /* Duplicates: sort a copy, keep the caller's order in items. */
  st_item *sorted;
  MF_CHECK(mf_calloc(n ? n : 1, sizeof *sorted, "tensor list", (void **)&sorted));
  memcpy(sorted, items, n * sizeof *items);
  qsort(sorted, n, sizeof *sorted, st_cmp_item_name);
  for (size_t i = 1; i < n; i++) {
    if (strcmp(sorted[i - 1].t->name, sorted[i].t->name) == 0) {
      mf_status s =
          MF_ERR(MF_ERR_INVALID_ARG, "%s: tensor name \"%.200s\" appears twice", path, sorted[i].t->name);
      free(sorted);
      return s;
    }
  }
  free(sorted);
  for (size_t i = 0; i < n_meta; i++) {
    if (!meta[i].key || !meta[i].value)
      return MF_ERR(MF_ERR_INVALID_ARG, "%s: metadata entry %zu has a NULL key or value", path, i);
    if (!st_utf8_ok(meta[i].key) || !st_utf8_ok(meta[i].value))
      return MF_ERR(MF_ERR_INVALID_ARG, "%s: metadata entry \"%.200s\" is not valid UTF-8", path,
                    meta[i].key);
    if (strcmp(meta[i].key, "format") == 0 && strcmp(meta[i].value, "pt") != 0)
      return MF_ERR(MF_ERR_INVALID_ARG,
                    "%s: metadata \"format\" must be \"pt\" (transformers rejects others), not "
                    "\"%.200s\"",
                    path, meta[i].value);
    for (size_t j = 0; j < i; j++)
      if (strcmp(meta[i].key, meta[j].key) == 0)
        return MF_ERR(MF_ERR_INVALID_ARG, "%s: metadata key \"%.200s\" appears twice", path, meta[i].key);
  }
  return MF_OK;
}

/* ------------------------------------------------------------------- file */

/* The reference writer's order (safetensors `prepare`): dtype descending in
 * its Dtype enum, then name. That enum is ordered by element size, so this is
 * "alignment descending, then name", and it keeps our files byte-identical
 * to the reference's for the same tensors and metadata. */
static int st_dtype_rank(mf_dtype t) {
  switch (t) {
    case MF_DTYPE_BOOL:
      return 0;
    case MF_DTYPE_U8:
      return 4;
    case MF_DTYPE_I8:
      return 5;
    case MF_DTYPE_F8_E5M2:
      return 6;
    case MF_DTYPE_F8_E4M3:
      return 7;
    case MF_DTYPE_I16:
      return 9;
    case MF_DTYPE_U16:
      return 10;
    case MF_DTYPE_F16:
      return 11;
    case MF_DTYPE_BF16:
      return 12;
    case MF_DTYPE_I32:
      return 13;
    case MF_DTYPE_U32:
      return 14;
    case MF_DTYPE_F32:
      return 15;
    case MF_DTYPE_F64:
      return 17;
    case MF_DTYPE_I64:
      return 18;
    case MF_DTYPE_U64:
      return 19;
    default:
      return -1;
  }
}

static int st_cmp_item_layout(const void *a, const void *b) {
  const mf_st_tensor *x = ((const st_item *)a)->t, *y = ((const st_item *)b)->t;
  int rx = st_dtype_rank(x->dtype), ry = st_dtype_rank(y->dtype);
  if (rx != ry) return rx > ry ? -1 : 1;
  return strcmp(x->name, y->name);
}

/* The 8-byte length and the header, padded with spaces to a multiple of 8.
 * Sorts items into file order. */
static mf_status st_build_header(const char *path, st_item *items, size_t n, const mf_st_meta *meta,
                                 size_t n_meta, uint8_t **out, size_t *out_len) {
  qsort(items, n, sizeof *items, st_cmp_item_layout);
  json_t *root = json_object(), *md = json_object();
  mf_status s = MF_OK;
  char *text = NULL;
  int bad = !root || !md || json_object_set_new(md, "format", json_string("pt"));
  for (size_t i = 0; i < n_meta && !bad; i++)
    if (strcmp(meta[i].key, "format") != 0)
      bad = json_object_set_new(md, meta[i].key, json_string(meta[i].value));
  if (!bad) bad = json_object_set(root, "__metadata__", md);
  uint64_t off = 0;
  for (size_t i = 0; i < n && !bad; i++) {
    const mf_st_tensor *t = items[i].t;
    json_t *shape = json_array();
    for (int d = 0; d < t->ndim && shape; d++)
      if (json_array_append_new(shape, json_integer((json_int_t)t->shape[d]))) bad = 1;
    json_t *e = json_pack("{s:s, s:o, s:[I, I]}", "dtype", mf_dtype_name(t->dtype), "shape", shape,
                          "data_offsets", (json_int_t)off, (json_int_t)(off + items[i].nbytes));
    if (!e || json_object_set_new(root, t->name, e)) bad = 1;
    off += items[i].nbytes;
  }
  if (!bad) text = json_dumps(root, JSON_COMPACT);
  if (bad || !text) {
    s = MF_ERR(MF_ERR_OUT_OF_MEMORY, "%s: out of host memory building the header", path);
    goto done;
  }
  size_t len = strlen(text), padded = (len + 7) & ~(size_t)7;
  MF_CHECK_GOTO(mf_malloc(8 + padded, "a safetensors header", (void **)out), s, done);
  for (int i = 0; i < 8; i++) (*out)[i] = (uint8_t)((uint64_t)padded >> (8 * i));
  memcpy(*out + 8, text, len);
  memset(*out + 8 + len, ' ', padded - len);
  *out_len = 8 + padded;
done:
  free(text);
  json_decref(md);
  json_decref(root);
  return s;
}

/* Item i's bytes: its data, or what its fill makes in *buf (grown to fit). */
static mf_status st_bytes(const st_item *it, uint8_t **buf, size_t *cap, const void **out) {
  if (!it->t->fill) {
    *out = it->t->data;
    return MF_OK;
  }
  if (*cap < it->nbytes) {
    free(*buf);
    *cap = 0;
    MF_CHECK(mf_malloc(it->nbytes, "a tensor's bytes", (void **)buf));
    *cap = it->nbytes;
  }
  MF_CHECK(it->t->fill(it->t->fill_ctx, it->t, *buf));
  *out = *buf;
  return MF_OK;
}

/* Writes one file (validated items, in any order) under path's temporary
 * name; the caller commits or syncs it. Nothing is left behind on failure. */
static mf_status st_write_file(const char *path, st_item *items, size_t n, const mf_st_meta *meta,
                               size_t n_meta, mf_atomic_file **out) {
  uint8_t *head = NULL, *buf = NULL;
  size_t head_len = 0, cap = 0;
  mf_atomic_file *f = NULL;
  mf_status s;
  *out = NULL;
  MF_CHECK(st_build_header(path, items, n, meta, n_meta, &head, &head_len));
  MF_CHECK_GOTO(mf_atomic_file_open(path, &f), s, done);
  MF_CHECK_GOTO(mf_atomic_file_write(f, head, head_len), s, done);
  for (size_t i = 0; i < n; i++) {
    const void *bytes = NULL;
    MF_CHECK_GOTO(st_bytes(&items[i], &buf, &cap, &bytes), s, done);
    MF_CHECK_GOTO(mf_atomic_file_write(f, bytes, items[i].nbytes), s, done);
  }
  *out = f;
  f = NULL;
done:
  mf_atomic_file_abort(f);
  free(head);
  free(buf);
  return s;
}

mf_status mf_safetensors_write(const char *path, const mf_st_tensor *tensors, size_t n,
                               const mf_st_meta *metadata, size_t n_metadata) {
  if (!path || !path[0]) return MF_ERR(MF_ERR_INVALID_ARG, "mf_safetensors_write: no path");
  st_item *items = NULL;
  mf_atomic_file *f = NULL;
  mf_status s;
  MF_CHECK_GOTO(mf_calloc(n ? n : 1, sizeof *items, "tensor list", (void **)&items), s, done);
  MF_CHECK_GOTO(st_validate(path, tensors, n, metadata, n_metadata, items), s, done);
  MF_CHECK_GOTO(st_write_file(path, items, n, metadata, n_metadata, &f), s, done);
  MF_CHECK_GOTO(mf_atomic_file_commit(f), s, done);
done:
  free(items);
  return s;
}

/* The same bytes as mf_safetensors_write, handed to `sink` in order (the
 * header, then each tensor's data) instead of a file. */
mf_status mf_safetensors_write_stream(const char *label, const mf_st_tensor *tensors, size_t n,
                                      const mf_st_meta *metadata, size_t n_metadata, mf_st_sink sink, void *ctx) {
  if (!label || !label[0] || !sink) return MF_ERR(MF_ERR_INVALID_ARG, "mf_safetensors_write_stream: no label or sink");
  st_item *items = NULL;
  uint8_t *head = NULL, *buf = NULL;
  size_t head_len = 0, cap = 0;
  mf_status s;
  MF_CHECK_GOTO(mf_calloc(n ? n : 1, sizeof *items, "tensor list", (void **)&items), s, done);
  MF_CHECK_GOTO(st_validate(label, tensors, n, metadata, n_metadata, items), s, done);
  MF_CHECK_GOTO(st_build_header(label, items, n, metadata, n_metadata, &head, &head_len), s, done);
  MF_CHECK_GOTO(sink(ctx, head, head_len), s, done);
  for (size_t i = 0; i < n; i++) {
    if (!items[i].nbytes) continue;
    const void *bytes = NULL;
    MF_CHECK_GOTO(st_bytes(&items[i], &buf, &cap, &bytes), s, done);
    MF_CHECK_GOTO(sink(ctx, bytes, items[i].nbytes), s, done);
  }
done:
  free(buf);
  free(head);
  free(items);
  return s;
}

/* ----------------------------------------------------------------- shards */

static int st_is_shard_name(const char *s) {
  static const char pat[] = "model-00000-of-00000.safetensors";
  if (strlen(s) != sizeof pat - 1) return 0;
  for (size_t i = 0; pat[i]; i++)
    if (pat[i] == '0' ? (s[i] < '0' || s[i] > '9') : s[i] != pat[i]) return 0;
  return 1;
}

/* Removes files of an earlier save that the new one does not use. */
static void st_remove_stale(const char *dir, size_t n_shards) {
  DIR *d = opendir(dir);
  if (!d) return;
  struct dirent *e;
  char keep[64];
  while ((e = readdir(d)) != NULL) {
    const char *nm = e->d_name;
    int stale = 0;
    if (n_shards == 1) {
      stale = st_is_shard_name(nm) || strcmp(nm, "model.safetensors.index.json") == 0;
    } else if (strcmp(nm, "model.safetensors") == 0) {
      stale = 1;
    } else if (st_is_shard_name(nm)) {
      unsigned long idx = strtoul(nm + 6, NULL, 10);
      snprintf(keep, sizeof keep, "model-%05lu-of-%05zu.safetensors", idx, n_shards);
      stale = idx < 1 || idx > n_shards || strcmp(keep, nm) != 0;
    }
    if (!stale) continue;
    char p[4096];
    snprintf(p, sizeof p, "%s/%s", dir, nm);
    if (unlink(p) == 0)
      MF_LOGI("io", "%s: removed %s, left from an earlier save", dir, nm);
    else
      MF_LOGW("io", "%s: could not remove stale %s: %s", dir, nm, strerror(errno));
  }
  closedir(d);
}

static mf_status st_index_text(const char *dir, const st_item *items, size_t n, const size_t *shard_of,
                               size_t n_shards, uint64_t total, char **out) {
  json_t *wm = json_object();
  json_t *root = json_pack("{s:{s:I}, s:o}", "metadata", "total_size", (json_int_t)total, "weight_map", wm);
  int bad = !wm || !root;
  char name[64];
  for (size_t i = 0; i < n && !bad; i++) {
    snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", shard_of[i] + 1, n_shards);
    bad = json_object_set_new(wm, items[i].t->name, json_string(name));
  }
  char *text = bad ? NULL : json_dumps(root, JSON_INDENT(2) | JSON_SORT_KEYS);
  json_decref(root);
  if (!text) return MF_ERR(MF_ERR_OUT_OF_MEMORY, "%s: out of host memory building the index", dir);
  size_t len = strlen(text);
  *out = (char *)malloc(len + 2);
  if (!*out) {
    free(text);
    return MF_ERR(MF_ERR_OUT_OF_MEMORY, "%s: out of host memory building the index", dir);
  }
  memcpy(*out, text, len);
  memcpy(*out + len, "\n", 2); /* like transformers: json.dumps(...) + "\n" */
  free(text);
  return MF_OK;
}

mf_status mf_safetensors_write_sharded(const char *dir, const mf_st_tensor *tensors, size_t n,
                                       const mf_st_meta *metadata, size_t n_metadata,
                                       uint64_t max_shard_bytes, size_t *n_shards_out) {
  if (!dir || !dir[0]) return MF_ERR(MF_ERR_INVALID_ARG, "mf_safetensors_write_sharded: no directory");
  if (max_shard_bytes == 0) return MF_ERR(MF_ERR_INVALID_ARG, "%s: max shard size is 0", dir);
  if (strlen(dir) > 3500) return MF_ERR(MF_ERR_INVALID_ARG, "%.200s...: path too long", dir);
  st_item *items = NULL;
  size_t *shard_of = NULL, *starts = NULL, n_shards = 0, n_files = 0;
  mf_atomic_file **files = NULL;
  char *index_text = NULL;
  mf_status s;
  MF_CHECK_GOTO(mf_calloc(n ? n : 1, sizeof *items, "tensor list", (void **)&items), s, done);
  MF_CHECK_GOTO(st_validate(dir, tensors, n, metadata, n_metadata, items), s, done);
  MF_CHECK_GOTO(mf_calloc(n ? n : 1, sizeof *shard_of, "shard plan", (void **)&shard_of), s, done);
  MF_CHECK_GOTO(mf_calloc(n + 2, sizeof *starts, "shard plan", (void **)&starts), s, done);

  /* Greedy in the caller's order: a shard closes when the next tensor would
   * push it past the limit; a tensor over the limit is a shard of its own. */
  uint64_t in_shard = 0, total = 0;
  starts[0] = 0;
  n_shards = 1;
  for (size_t i = 0; i < n; i++) {
    if (i > starts[n_shards - 1] && in_shard + items[i].nbytes > max_shard_bytes) {
      starts[n_shards++] = i;
      in_shard = 0;
    }
    in_shard += items[i].nbytes;
    total += items[i].nbytes;
    shard_of[i] = n_shards - 1;
  }
  starts[n_shards] = n;
  if (n_shards > 99999) {
    s = MF_ERR(MF_ERR_INVALID_ARG, "%s: %zu shards, more than 99999; raise the max shard size", dir,
               n_shards);
    goto done;
  }
  if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
    s = MF_ERR(MF_ERR_IO, "%s: cannot create the directory: %s", dir, strerror(errno));
    goto done;
  }
  if (n_shards > 1)
    MF_CHECK_GOTO(st_index_text(dir, items, n, shard_of, n_shards, total, &index_text), s, done);

  /* files[k]: the shards, then the index (if any). Every one is complete and
   * fsynced under its tmp name first, one descriptor open at a time. */
  n_files = n_shards == 1 ? 1 : n_shards + 1;
  MF_CHECK_GOTO(mf_calloc(n_files, sizeof *files, "shard files", (void **)&files), s, done);
  for (size_t k = 0; k < n_files; k++) {
    char path[4096];
    if (n_shards == 1)
      snprintf(path, sizeof path, "%s/model.safetensors", dir);
    else if (k < n_shards)
      snprintf(path, sizeof path, "%s/model-%05zu-of-%05zu.safetensors", dir, k + 1, n_shards);
    else
      snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    if (k < n_shards) {
      MF_CHECK_GOTO(
          st_write_file(path, items + starts[k], starts[k + 1] - starts[k], metadata, n_metadata, &files[k]),
          s, done);
    } else {
      MF_CHECK_GOTO(mf_atomic_file_open(path, &files[k]), s, done);
      MF_CHECK_GOTO(mf_atomic_file_write(files[k], index_text, strlen(index_text)), s, done);
    }
    MF_CHECK_GOTO(mf_atomic_file_sync(files[k]), s, done);
  }
  /* Then the renames: shards first, the index last. */
  for (size_t k = 0; k < n_files; k++) {
    mf_atomic_file *f = files[k];
    files[k] = NULL; /* commit frees it, failing or not */
    MF_CHECK_GOTO(mf_atomic_file_commit(f), s, done);
  }
  st_remove_stale(dir, n_shards);
  if (n_shards_out) *n_shards_out = n_shards;

done:
  for (size_t k = 0; files && k < n_files; k++) mf_atomic_file_abort(files[k]);
  free(files);
  free(index_text);
  free(starts);
  free(shard_of);
  free(items);
  return s;
}
