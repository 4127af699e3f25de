/*
 * safetensors reading: the header parser and validator (on any byte buffer),
 * mmap of single files, and sharded sets through model.safetensors.index.json.
 * The rules checked are listed in safetensors.h; the format is MODELS.md §13.
 *
 * Layout of a file: u64 LE header length N | N bytes of JSON | data buffer.
 * A header entry's data_offsets are relative to the data buffer (8 + N).
 */
#include "src/io/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors data is little-endian; moefit assumes a little-endian host"
#endif

/* Names can be long (or hostile): messages show at most 200 bytes of one. */
#define QNAME "\"%.200s\""

/* ------------------------------------------------------------ string pool */

/* Names and metadata strings live in chunks that never move, freed at close. */
typedef struct st_chunk {
  struct st_chunk *next;
  size_t used, cap;
  char data[];
} st_chunk;

typedef struct st_shard {
  char *path;
  const uint8_t *base; /* the whole file (or the caller's buffer) */
  size_t size;
  int mapped;      /* munmap at close */
  size_t first, n; /* its tensors in mf_safetensors.tensors */
} st_shard;

struct mf_safetensors {
  char *index_path;
  st_shard *shards;
  size_t n_shards;
  mf_st_tensor *tensors;
  size_t n, cap;
  size_t *by_name; /* tensor indices sorted by name */
  mf_st_meta *meta;
  size_t n_meta, cap_meta;
  mf_st_meta *index_meta;
  size_t n_index_meta;
  uint64_t total_bytes;
  st_chunk *pool;
};

static mf_status st_strdup(mf_safetensors *st, const char *s, size_t len, const char **out) {
  st_chunk *c = st->pool;
  if (!c || c->cap - c->used < len + 1) {
    size_t cap = len + 1 > 65536 ? len + 1 : 65536;
    void *mem;
    MF_CHECK(mf_malloc(sizeof(st_chunk) + cap, "safetensors names", &mem));
    c = (st_chunk *)mem;
    c->next = st->pool;
    c->used = 0;
    c->cap = cap;
    st->pool = c;
  }
  char *d = c->data + c->used;
  memcpy(d, s, len);
  d[len] = 0;
  c->used += len + 1;
  *out = d;
  return MF_OK;
}

static mf_status st_grow(void **arr, size_t *cap, size_t need, size_t elem, const char *what) {
  if (need <= *cap) return MF_OK;
  size_t ncap = *cap ? *cap : 16, bytes;
  while (ncap < need) ncap *= 2;
  if (!mf_mul_size(ncap, elem, &bytes)) return MF_ERR(MF_ERR_OUT_OF_MEMORY, "too many %s", what);
  void *p = realloc(*arr, bytes);
  if (!p) return MF_ERR(MF_ERR_OUT_OF_MEMORY, "out of host memory growing %s", what);
  *arr = p;
  *cap = ncap;
  return MF_OK;
}

static mf_status st_add_meta(mf_safetensors *st, mf_st_meta **arr, size_t *n, size_t *cap, const char *key,
                             const char *value, size_t value_len) {
  MF_CHECK(st_grow((void **)arr, cap, *n + 1, sizeof(mf_st_meta), "metadata entries"));
  mf_st_meta *m = &(*arr)[*n];
  MF_CHECK(st_strdup(st, key, strlen(key), &m->key));
  MF_CHECK(st_strdup(st, value, value_len, &m->value));
  (*n)++;
  return MF_OK;
}

/* ------------------------------------------------------------ JSON helpers */

static const char *st_json_kind(const json_t *v) {
  switch (json_typeof(v)) {
    case JSON_OBJECT:
      return "an object";
    case JSON_ARRAY:
      return "an array";
    case JSON_STRING:
      return "a string";
    case JSON_INTEGER:
      return "an integer";
    case JSON_REAL:
      return "a real number";
    case JSON_TRUE:
      return "true";
    case JSON_FALSE:
      return "false";
    case JSON_NULL:
      return "null";
  }
  return "an unknown JSON value";
}

/* jansson bounds its own recursion (2048 levels), but nothing valid here needs
 * more than a few, so deeper input is refused before it is parsed. */
static int st_json_too_deep(const uint8_t *p, size_t n, int max_depth, size_t *where) {
  int depth = 0, in_str = 0, esc = 0;
  for (size_t i = 0; i < n; i++) {
    uint8_t c = p[i];
    if (in_str) {
      if (esc)
        esc = 0;
      else if (c == '\\')
        esc = 1;
      else if (c == '"')
        in_str = 0;
    } else if (c == '"') {
      in_str = 1;
    } else if (c == '{' || c == '[') {
      if (++depth > max_depth) {
        *where = i;
        return 1;
      }
    } else if (c == '}' || c == ']') {
      depth--;
    }
  }
  return 0;
}

/* Parses JSON text (an object expected) with duplicate keys refused; `base` is
 * the file offset of p[0], for messages. */
static mf_status st_json_load(const char *label, const char *what, const uint8_t *p, size_t n, size_t base,
                              int max_depth, json_t **out) {
  size_t where;
  *out = NULL;
  if (st_json_too_deep(p, n, max_depth, &where))
    return MF_ERR(MF_ERR_FORMAT, "%s: %s nests deeper than %d levels at byte offset %zu", label, what,
                  max_depth, base + where);
  json_error_t err;
  json_t *root = json_loadb((const char *)p, n, JSON_REJECT_DUPLICATES, &err);
  if (!root)
    return MF_ERR(MF_ERR_FORMAT, "%s: %s is not valid JSON: %s (near byte offset %zu)", label, what, err.text,
                  base + (size_t)(err.position > 0 ? err.position : 0));
  if (!json_is_object(root)) {
    mf_status s =
        MF_ERR(MF_ERR_FORMAT, "%s: %s is %s, expected a JSON object", label, what, st_json_kind(root));
    json_decref(root);
    return s;
  }
  *out = root;
  return MF_OK;
}

static int st_json_uint(const json_t *v, uint64_t *out) {
  if (!json_is_integer(v) || json_integer_value(v) < 0) return 0;
  *out = (uint64_t)json_integer_value(v);
  return 1;
}

/* ---------------------------------------------------------- header parser */

/* dtypes that newer safetensors releases define and moefit does not handle. */
static int st_known_unsupported_dtype(const char *name) {
  static const char *const k[] = {"F8_E8M0", "F4", "F6_E2M3", "F6_E3M2", "C64"};
  for (size_t i = 0; i < sizeof k / sizeof k[0]; i++)
    if (strcmp(name, k[i]) == 0) return 1;
  return 0;
}

static void st_format_shape(const int64_t *shape, int ndim, char *buf, size_t cap) {
  size_t len = (size_t)snprintf(buf, cap, "[");
  for (int d = 0; d < ndim && len < cap; d++)
    len += (size_t)snprintf(buf + len, cap - len, "%s%lld", d ? ", " : "", (long long)shape[d]);
  if (len < cap) snprintf(buf + len, cap - len, "]");
}

/* One header entry: exactly {dtype, shape, data_offsets}, typed and consistent,
 * its extent inside a data buffer of buf_len bytes. Sets t (but not t->name,
 * data or offset) and the entry's [begin, end). */
static mf_status st_parse_entry(const char *label, const char *name, json_t *v, uint64_t buf_len,
                                mf_st_tensor *t, uint64_t *begin, uint64_t *end) {
  if (!json_is_object(v))
    return MF_ERR(MF_ERR_FORMAT, "%s: tensor " QNAME ": entry is %s, expected an object", label, name,
                  st_json_kind(v));
  const char *key;
  json_t *field;
  json_object_foreach(v, key, field) {
    if (strcmp(key, "dtype") != 0 && strcmp(key, "shape") != 0 && strcmp(key, "data_offsets") != 0)
      return MF_ERR(MF_ERR_FORMAT,
                    "%s: tensor " QNAME ": unknown key " QNAME
                    " (an entry has only dtype, shape, data_offsets)",
                    label, name, key);
  }
  json_t *dtype = json_object_get(v, "dtype");
  json_t *shape = json_object_get(v, "shape");
  json_t *offs = json_object_get(v, "data_offsets");
  const char *missing = !dtype ? "dtype" : !shape ? "shape" : !offs ? "data_offsets" : NULL;
  if (missing) return MF_ERR(MF_ERR_FORMAT, "%s: tensor " QNAME ": missing key \"%s\"", label, name, missing);

  if (!json_is_string(dtype))
    return MF_ERR(MF_ERR_FORMAT, "%s: tensor " QNAME ": dtype is %s, expected a string", label, name,
                  st_json_kind(dtype));
  const char *dn = json_string_value(dtype);
  t->dtype = mf_dtype_from_name(dn, json_string_length(dtype));
  if (t->dtype == MF_DTYPE_INVALID) {
    if (st_known_unsupported_dtype(dn))
      return MF_ERR(MF_ERR_UNSUPPORTED, "%s: tensor " QNAME ": dtype %s is not supported by moefit", label,
                    name, dn);
    return MF_ERR(MF_ERR_FORMAT, "%s: tensor " QNAME ": unknown dtype " QNAME, label, name, dn);
  }

  if (!json_is_array(shape))
    return MF_ERR(MF_ERR_FORMAT, "%s: tensor " QNAME ": shape is %s, expected an array", label, name,
                  st_json_kind(shape));
  size_t rank = json_array_size(shape);
  if (rank > MF_ST_MAX_DIMS)
    return MF_ERR(MF_ERR_FORMAT, "%s: tensor " QNAME ": shape has %zu dimensions, more than %d", label, name,
                  rank, MF_ST_MAX_DIMS);
  t->ndim = (int)rank;
  uint64_t numel = 1;
  int overflow = 0;
  for (size_t d = 0; d < rank; d++) {
    json_t *dim = json_array_get(shape, d);
    uint64_t u;
    if (!st_json_uint(dim, &u))
      return MF_ERR(MF_ERR_FORMAT, "%s: tensor " QNAME ": shape[%zu] is %s, expected a non-negative integer",
                    label, name, d, json_is_integer(dim) ? "negative" : st_json_kind(dim));
    t->shape[d] = (int64_t)u;
    if (__builtin_mul_overflow(numel, u, &numel)) overflow = 1;
  }
  for (int d = t->ndim; d < MF_ST_MAX_DIMS; d++) t->shape[d] = 0;
  /* Like the reference, a running product that overflows is refused even when
   * a later dimension is 0: code multiplying the dims in order must not wrap. */
  uint64_t nbytes;
  if (overflow || __builtin_mul_overflow(numel, (uint64_t)mf_dtype_size(t->dtype), &nbytes)) {
    char sh[256];
    st_format_shape(t->shape, t->ndim, sh, sizeof sh);
    return MF_ERR(MF_ERR_FORMAT, "%s: tensor " QNAME ": shape %s of %s overflows 64-bit byte counts", label,
                  name, sh, dn);
  }
  t->numel = numel;
  t->nbytes = (size_t)nbytes;

  if (!json_is_array(offs) || json_array_size(offs) != 2)
    return MF_ERR(MF_ERR_FORMAT, "%s: tensor " QNAME ": data_offsets is %s, expected an array [begin, end]",
                  label, name, json_is_array(offs) ? "an array of the wrong length" : st_json_kind(offs));
  for (size_t k = 0; k < 2; k++) {
    json_t *o = json_array_get(offs, k);
    if (!st_json_uint(o, k ? end : begin))
      return MF_ERR(MF_ERR_FORMAT,
                    "%s: tensor " QNAME ": data_offsets[%zu] is %s, expected a non-negative integer", label,
                    name, k, json_is_integer(o) ? "negative" : st_json_kind(o));
  }
  if (*begin > *end)
    return MF_ERR(MF_ERR_FORMAT, "%s: tensor " QNAME ": data_offsets [%llu, %llu] are reversed (begin > end)",
                  label, name, (unsigned long long)*begin, (unsigned long long)*end);
  if (*end > buf_len)
    return MF_ERR(
        MF_ERR_FORMAT,
        "%s: tensor " QNAME ": data_offsets [%llu, %llu] run past the end of the %llu-byte data buffer",
        label, name, (unsigned long long)*begin, (unsigned long long)*end, (unsigned long long)buf_len);
  if (*end - *begin != nbytes) {
    char sh[256];
    st_format_shape(t->shape, t->ndim, sh, sizeof sh);
    return MF_ERR(MF_ERR_FORMAT,
                  "%s: tensor " QNAME
                  ": shape %s of %s needs %llu bytes but data_offsets [%llu, %llu] hold %llu",
                  label, name, sh, dn, (unsigned long long)nbytes, (unsigned long long)*begin,
                  (unsigned long long)*end, (unsigned long long)(*end - *begin));
  }
  return MF_OK;
}

static int st_cmp_offset(const void *a, const void *b) {
  const mf_st_tensor *x = (const mf_st_tensor *)a, *y = (const mf_st_tensor *)b;
  if (x->offset != y->offset) return x->offset < y->offset ? -1 : 1;
  if (x->nbytes != y->nbytes) return x->nbytes < y->nbytes ? -1 : 1;
  return strcmp(x->name, y->name);
}

/* Parses and validates the file image bytes[0, size) as shard `shard` of st,
 * appending its tensors (sorted by offset) and merging its __metadata__. */
static mf_status st_parse(mf_safetensors *st, int shard, const char *label, const uint8_t *bytes,
                          size_t size) {
  if (size < 8)
    return MF_ERR(MF_ERR_FORMAT, "%s: file is %zu bytes, too short for the 8-byte header length", label,
                  size);
  uint64_t hlen = 0;
  for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | bytes[i];
  if (hlen > MF_ST_MAX_HEADER_BYTES)
    return MF_ERR(MF_ERR_FORMAT, "%s: header length %llu (byte offset 0) exceeds the %llu-byte limit", label,
                  (unsigned long long)hlen, (unsigned long long)MF_ST_MAX_HEADER_BYTES);
  if (hlen > size - 8)
    return MF_ERR(
        MF_ERR_FORMAT,
        "%s: header length %llu (byte offset 0) runs past the end of the file (%zu bytes after the length)",
        label, (unsigned long long)hlen, size - 8);
  const uint8_t *h = bytes + 8;
  if (hlen == 0 || h[0] != '{')
    return MF_ERR(MF_ERR_FORMAT, "%s: header does not start with '{' (byte offset 8)", label);

  json_t *root;
  MF_CHECK(st_json_load(label, "header", h, (size_t)hlen, 8, MF_ST_MAX_JSON_DEPTH, &root));
  mf_status s = MF_OK;
  uint64_t data_start = 8 + hlen, buf_len = size - data_start;
  size_t first = st->n;
  const char *key;
  json_t *v;
  json_object_foreach(root, key, v) {
    if (strcmp(key, "__metadata__") == 0) {
      if (!json_is_object(v)) {
        s = MF_ERR(MF_ERR_FORMAT, "%s: __metadata__ is %s, expected an object of strings", label,
                   st_json_kind(v));
        goto done;
      }
      const char *mk;
      json_t *mv;
      json_object_foreach(v, mk, mv) {
        if (!json_is_string(mv)) {
          s = MF_ERR(MF_ERR_FORMAT, "%s: __metadata__[" QNAME "] is %s, expected a string", label, mk,
                     st_json_kind(mv));
          goto done;
        }
        if (shard > 0) { /* a set: the first shard with a key gives its value */
          const char *have = mf_safetensors_metadata(st, mk);
          if (have) {
            if (strcmp(have, json_string_value(mv)) != 0)
              MF_LOGD("io",
                      "%s: __metadata__[\"%.200s\"] differs from an earlier shard's; keeping the earlier",
                      label, mk);
            continue;
          }
        }
        MF_CHECK_GOTO(st_add_meta(st, &st->meta, &st->n_meta, &st->cap_meta, mk, json_string_value(mv),
                                  json_string_length(mv)),
                      s, done);
      }
      continue;
    }
    MF_CHECK_GOTO(st_grow((void **)&st->tensors, &st->cap, st->n + 1, sizeof(mf_st_tensor), "tensors"), s,
                  done);
    mf_st_tensor *t = &st->tensors[st->n];
    memset(t, 0, sizeof *t);
    uint64_t b, e;
    MF_CHECK_GOTO(st_parse_entry(label, key, v, buf_len, t, &b, &e), s, done);
    MF_CHECK_GOTO(st_strdup(st, key, strlen(key), &t->name), s, done);
    t->offset = data_start + b;
    t->data = bytes + data_start + b;
    t->shard = shard;
    st->n++;
  }

  /* Sorted by offset, the tensors must tile the data buffer exactly. */
  size_t count = st->n - first;
  if (count > 1) qsort(st->tensors + first, count, sizeof(mf_st_tensor), st_cmp_offset);
  uint64_t pos = 0;
  const char *prev = NULL;
  for (size_t i = first; i < st->n; i++) {
    const mf_st_tensor *t = &st->tensors[i];
    uint64_t b = t->offset - data_start;
    if (b > pos) {
      s = MF_ERR(MF_ERR_FORMAT,
                 "%s: data buffer bytes [%llu, %llu) (file offset %llu) belong to no tensor: a hole before "
                 "tensor " QNAME,
                 label, (unsigned long long)pos, (unsigned long long)b,
                 (unsigned long long)(data_start + pos), t->name);
      goto done;
    }
    if (b < pos) {
      s = MF_ERR(MF_ERR_FORMAT,
                 "%s: tensor " QNAME " (data_offsets [%llu, %llu]) overlaps tensor " QNAME
                 ", which ends at %llu",
                 label, t->name, (unsigned long long)b, (unsigned long long)(b + t->nbytes), prev ? prev : "",
                 (unsigned long long)pos);
      goto done;
    }
    pos = b + t->nbytes;
    prev = t->name;
  }
  if (pos != buf_len) {
    s = MF_ERR(
        MF_ERR_FORMAT,
        "%s: the data buffer is %llu bytes but the tensors cover only %llu: %llu trailing bytes from file "
        "offset %llu belong to no tensor",
        label, (unsigned long long)buf_len, (unsigned long long)pos, (unsigned long long)(buf_len - pos),
        (unsigned long long)(data_start + pos));
    goto done;
  }
  for (size_t i = first; i < st->n; i++) st->total_bytes += st->tensors[i].nbytes;
  st->shards[shard].first = first;
  st->shards[shard].n = count;

done:
  json_decref(root);
  return s;
}

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
    if (st->shards[i].mapped) munmap((void *)st->shards[i].base, st->shards[i].size);
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

/* Maps `path` read-only. *errno_out gets errno when open/stat fails. */
static mf_status st_map(const char *path, st_shard *sh, int *errno_out) {
  *errno_out = 0;
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    *errno_out = errno;
    return MF_ERR(MF_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
  }
  struct stat sb;
  if (fstat(fd, &sb) != 0) {
    *errno_out = errno;
    mf_status s = MF_ERR(MF_ERR_IO, "%s: cannot stat: %s", path, strerror(errno));
    close(fd);
    return s;
  }
  if (!S_ISREG(sb.st_mode)) {
    close(fd);
    return MF_ERR(MF_ERR_IO, "%s: not a regular file", path);
  }
  size_t size = (size_t)sb.st_size;
  if (size < 8) { /* too short to parse; also keeps mmap away from empty files */
    close(fd);
    return MF_ERR(MF_ERR_FORMAT, "%s: file is %zu bytes, too short for the 8-byte header length", path, size);
  }
  void *p = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
  int e = errno;
  close(fd);
  if (p == MAP_FAILED) return MF_ERR(MF_ERR_IO, "%s: cannot mmap %zu bytes: %s", path, size, strerror(e));
  sh->base = (const uint8_t *)p;
  sh->size = size;
  sh->mapped = 1;
  return MF_OK;
}

mf_status mf_safetensors_open_buffer(const char *label, const void *bytes, size_t size,
                                     mf_safetensors **out) {
  mf_safetensors *st;
  if (!out || (!bytes && size))
    return MF_ERR(MF_ERR_INVALID_ARG, "mf_safetensors_open_buffer: NULL argument");
  if (!label) label = "<buffer>";
  *out = NULL;
  MF_CHECK(st_new(1, &st));
  mf_status s;
  st->shards[0].path = mf_strdup(label);
  if (!st->shards[0].path) {
    s = MF_ERR(MF_ERR_OUT_OF_MEMORY, "out of host memory");
    goto fail;
  }
  st->shards[0].base = (const uint8_t *)bytes;
  st->shards[0].size = size;
  MF_CHECK_GOTO(st_parse(st, 0, label, (const uint8_t *)bytes, size), s, fail);
  MF_CHECK_GOTO(st_index_names(st), s, fail);
  *out = st;
  return MF_OK;
fail:
  mf_safetensors_close(st);
  return s;
}

mf_status mf_safetensors_open_file(const char *path, mf_safetensors **out) {
  mf_safetensors *st;
  int e;
  if (!path || !out) return MF_ERR(MF_ERR_INVALID_ARG, "mf_safetensors_open_file: NULL argument");
  *out = NULL;
  MF_CHECK(st_new(1, &st));
  mf_status s;
  st->shards[0].path = mf_strdup(path);
  if (!st->shards[0].path) {
    s = MF_ERR(MF_ERR_OUT_OF_MEMORY, "out of host memory");
    goto fail;
  }
  MF_CHECK_GOTO(st_map(path, &st->shards[0], &e), s, fail);
  MF_CHECK_GOTO(st_parse(st, 0, path, st->shards[0].base, st->shards[0].size), s, fail);
  MF_CHECK_GOTO(st_index_names(st), s, fail);
  *out = st;
  return MF_OK;
fail:
  mf_safetensors_close(st);
  return s;
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

static mf_status st_read_small_file(const char *path, uint64_t cap, uint8_t **out, size_t *size) {
  *out = NULL;
  FILE *f = fopen(path, "rb");
  if (!f) return MF_ERR(MF_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
  struct stat sb;
  mf_status s = MF_OK;
  if (fstat(fileno(f), &sb) != 0 || !S_ISREG(sb.st_mode)) {
    s = MF_ERR(MF_ERR_IO, "%s: not a readable regular file", path);
    goto done;
  }
  if ((uint64_t)sb.st_size > cap) {
    s = MF_ERR(MF_ERR_FORMAT, "%s: %llu bytes, more than the %llu-byte limit for an index", path,
               (unsigned long long)sb.st_size, (unsigned long long)cap);
    goto done;
  }
  *size = (size_t)sb.st_size;
  MF_CHECK_GOTO(mf_malloc(*size ? *size : 1, "an index file", (void **)out), s, done);
  if (fread(*out, 1, *size, f) != *size) {
    s = MF_ERR(MF_ERR_IO, "%s: read failed: %s", path, strerror(errno));
    free(*out);
    *out = NULL;
  }
done:
  fclose(f);
  return s;
}

/* Fills index_meta from the index's "metadata" (non-strings as compact JSON). */
static mf_status st_index_metadata(mf_safetensors *st, const char *path, json_t *meta) {
  size_t cap = 0;
  const char *k;
  json_t *v;
  json_t *ts = json_object_get(meta, "total_size");
  uint64_t dummy;
  if (ts && !st_json_uint(ts, &dummy))
    return MF_ERR(MF_ERR_FORMAT, "%s: metadata.total_size is %s, expected a non-negative integer", path,
                  json_is_integer(ts) ? "negative" : st_json_kind(ts));
  json_object_foreach(meta, k, v) {
    if (json_is_string(v)) {
      MF_CHECK(st_add_meta(st, &st->index_meta, &st->n_index_meta, &cap, k, json_string_value(v),
                           json_string_length(v)));
    } else {
      char *text = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
      if (!text) return MF_ERR(MF_ERR_OUT_OF_MEMORY, "out of host memory");
      mf_status s = st_add_meta(st, &st->index_meta, &st->n_index_meta, &cap, k, text, strlen(text));
      free(text);
      MF_CHECK(s);
    }
  }
  return MF_OK;
}

/* Opens the set of an index. `want_shard` (a basename, may be NULL) must be one
 * of its shards: opening a shard file opens its set. */
static mf_status st_open_index(const char *path, const char *want_shard, mf_safetensors **out) {
  uint8_t *text = NULL;
  size_t size = 0;
  json_t *root = NULL;
  const char **names = NULL;
  mf_safetensors *st = NULL;
  char *dir = NULL;
  mf_status s = MF_OK;
  *out = NULL;
  MF_CHECK(st_read_small_file(path, MF_ST_MAX_INDEX_BYTES, &text, &size));
  MF_CHECK_GOTO(st_json_load(path, "index", text, size, 0, 16, &root), s, done);

  json_t *wm = json_object_get(root, "weight_map");
  json_t *meta = json_object_get(root, "metadata");
  if (!wm) {
    s = MF_ERR(MF_ERR_FORMAT, "%s: no \"weight_map\" key", path);
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
    MF_CHECK_GOTO(st_parse(st, (int)i, sh->path, sh->base, sh->size), s, done);
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

static int st_is_file(const char *path) {
  struct stat sb;
  return stat(path, &sb) == 0 && S_ISREG(sb.st_mode);
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
    if (st_is_file(buf)) {
      if (st_is_file(idx))
        MF_LOGW("io",
                "%s: has both model.safetensors and model.safetensors.index.json; reading model.safetensors",
                path);
      return mf_safetensors_open_file(buf, out);
    }
    if (st_is_file(idx)) return st_open_index(idx, NULL, out);
    return MF_ERR(MF_ERR_IO, "%s: directory has neither model.safetensors nor model.safetensors.index.json",
                  path);
  }
  if (st_ends_with(path, ".json")) return st_open_index(path, NULL, out);
  const char *slash = strrchr(path, '/');
  const char *base = slash ? slash + 1 : path;
  size_t prefix = st_shard_prefix(base);
  if (prefix) {
    snprintf(buf, sizeof buf, "%.*s.safetensors.index.json", (int)(base - path + (ptrdiff_t)prefix), path);
    if (st_is_file(buf)) return st_open_index(buf, base, out);
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
