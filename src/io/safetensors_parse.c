/*
 * safetensors reading, part 1: the header parser and validator, on any byte
 * buffer. The format and the rules checked are in safetensors.h; the openers
 * are safetensors_open.c.
 */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "src/io/safetensors_impl.h"

/* ------------------------------------------------------------ string pool */

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

mf_status mf_st_add_meta(mf_safetensors *st, mf_st_meta **arr, size_t *n, size_t *cap, const char *key,
                         const char *value, size_t value_len) {
  MF_CHECK(st_grow((void **)arr, cap, *n + 1, sizeof(mf_st_meta), "metadata entries"));
  mf_st_meta *m = &(*arr)[*n];
  MF_CHECK(st_strdup(st, key, strlen(key), &m->key));
  MF_CHECK(st_strdup(st, value, value_len, &m->value));
  (*n)++;
  return MF_OK;
}

/* ------------------------------------------------------------ JSON helpers */

/* jansson bounds its own recursion (2048 levels), but nothing valid here needs
 * more than a few, so deeper input is refused before it is parsed. */
mf_status mf_st_json_load(const char *label, const char *what, const uint8_t *p, size_t n, size_t base,
                          int max_depth, json_t **out) {
  size_t where;
  *out = NULL;
  if (mf_io_json_too_deep(p, n, max_depth, &where, NULL, NULL))
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

int mf_st_json_uint(const json_t *v, uint64_t *out) {
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
    if (!mf_st_json_uint(dim, &u))
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
    if (!mf_st_json_uint(o, k ? end : begin))
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

/* What a file that is not safetensors looks like by its first bytes: "YAML
 * text", "JSON text", "text", or NULL (binary: the header checks report it).
 * A safetensors file's 8-byte little-endian header length has zero high
 * bytes, so it never passes for text. */
static const char *st_other_kind(const uint8_t *b, size_t size) {
  const size_t n = size < 256 ? size : 256;
  if (n < 8) return NULL; /* "too short" says it better */
  for (size_t i = 0; i < n; i++)
    if ((b[i] < 0x20 && b[i] != '\t' && b[i] != '\n' && b[i] != '\r') || b[i] == 0x7f) return NULL;
  const size_t bad = mf_utf8_invalid_at(b, n); /* text is UTF-8; a character cut at byte n is fine */
  if (bad < n && (n == size || n - bad >= 4)) return NULL;
  size_t i = n >= 3 && memcmp(b, "\xef\xbb\xbf", 3) == 0 ? 3 : 0; /* a UTF-8 BOM */
  while (i < n && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r')) i++;
  if (i < n && (b[i] == '{' || b[i] == '[')) return "JSON text";
  if (i < n && (b[i] == '#' || (n - i >= 3 && memcmp(b + i, "---", 3) == 0) || b[i] == '%'))
    return "YAML text";
  size_t k = i; /* a first line "key: ..." */
  while (k < n && (b[k] == '_' || b[k] == '-' || b[k] == '.' || (b[k] >= '0' && b[k] <= '9') ||
                   ((b[k] | 0x20) >= 'a' && (b[k] | 0x20) <= 'z')))
    k++;
  if (k > i && k < n && b[k] == ':' &&
      (k + 1 == n || b[k + 1] == ' ' || b[k + 1] == '\n' || b[k + 1] == '\r'))
    return "YAML text";
  return "text";
}

/* "not a safetensors file" when the first bytes say what it is instead, else MF_OK. */
static mf_status st_not_safetensors(const char *label, const uint8_t *bytes, size_t size) {
  const char *kind = st_other_kind(bytes, size);
  if (!kind) return MF_OK;
  char first[48];
  size_t o = 0;
  for (size_t i = 0; i < size && i < 32 && bytes[i] != '\n' && bytes[i] != '\r'; i++)
    first[o++] = bytes[i] == '\t' ? ' ' : (char)bytes[i];
  first[o] = 0;
  return MF_ERR(
      MF_ERR_FORMAT,
      "%s: not a safetensors file: it is %s (it begins \"%s%s\"), and a safetensors file begins with "
      "an 8-byte header length",
      label, kind, first, o == 32 ? "..." : "");
}

mf_status mf_st_parse(mf_safetensors *st, int shard, const char *label, const uint8_t *bytes, size_t size) {
  uint64_t hlen = 0;
  for (int i = 7; size >= 8 && i >= 0; i--) hlen = (hlen << 8) | bytes[i];
  if (size < 8 || hlen > size - 8 || hlen == 0 || bytes[8] != '{')
    MF_CHECK(st_not_safetensors(label, bytes, size));
  if (size < 8)
    return MF_ERR(MF_ERR_FORMAT, "%s: file is %zu bytes, too short for the 8-byte header length", label,
                  size);
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
  MF_CHECK(mf_st_json_load(label, "header", h, (size_t)hlen, 8, MF_ST_MAX_JSON_DEPTH, &root));
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
        MF_CHECK_GOTO(mf_st_add_meta(st, &st->meta, &st->n_meta, &st->cap_meta, mk, json_string_value(mv),
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
