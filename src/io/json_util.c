/* JSON value names for the io readers' messages (json_util.h). */
#include "src/io/json_util.h"

#include <stdio.h>
#include <string.h>

const char *mf_io_json_kind(const json_t *v, int bool_as_value) {
  return mf_io_json_type_kind(json_typeof(v), bool_as_value);
}

const char *mf_io_json_type_kind(json_type t, int bool_as_value) {
  switch (t) {
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
      return bool_as_value ? "true" : "a boolean";
    case JSON_FALSE:
      return bool_as_value ? "false" : "a boolean";
    case JSON_NULL:
      return "null";
  }
  return "an unknown JSON value";
}

int mf_io_json_too_deep(const void *text, size_t n, int max_depth, size_t *where, int *line, int *col) {
  const unsigned char *s = (const unsigned char *)text;
  int depth = 0, in_str = 0, esc = 0, ln = 1, cl = 0;
  for (size_t i = 0; i < n; i++) {
    unsigned char c = s[i];
    if (c == '\n')
      ln++, cl = 0;
    else
      cl++;
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
        if (where) *where = i;
        if (line) *line = ln;
        if (col) *col = cl;
        return 1;
      }
    } else if (c == '}' || c == ']') {
      depth--;
    }
  }
  return 0;
}

const char *mf_io_json_printable(const char *s, char *buf, size_t cap) {
  size_t o = 0;
  for (const unsigned char *c = (const unsigned char *)s; c && *c; c++) {
    if (o + 8 >= cap) {
      memcpy(buf + o, "...", 3);
      o += 3;
      break;
    }
    if (*c >= 0x20 && *c < 0x7f)
      buf[o++] = (char)*c;
    else
      o += (size_t)snprintf(buf + o, cap - o, "\\x%02x", *c);
  }
  buf[o] = 0;
  return buf;
}

mf_status mf_io_json_only_keys(const char *path, const json_t *o, const char *place, const char *const *names,
                               int n) {
  const char *key;
  json_t *v;
  char q[128];
  json_object_foreach((json_t *)o, key, v) {
    int known = 0;
    for (int i = 0; i < n && !known; i++) known = strcmp(key, names[i]) == 0;
    if (!known)
      return MF_ERR(MF_ERR_FORMAT, "%s: %s: unknown key '%s'", path, place,
                    mf_io_json_printable(key, q, sizeof q));
  }
  return MF_OK;
}

mf_status mf_io_json_get(const char *path, const json_t *o, const char *place, const char *key,
                         json_t **out) {
  *out = json_object_get(o, key);
  if (!*out) return MF_ERR(MF_ERR_FORMAT, "%s: %s: missing '%s'", path, place, key);
  return MF_OK;
}

mf_status mf_io_json_nonneg(const char *path, const json_t *v, const char *place, int64_t *out) {
  if (!json_is_integer(v) || json_integer_value(v) < 0)
    return MF_ERR(MF_ERR_FORMAT, "%s: %s: expected a non-negative integer, got %s", path, place,
                  json_is_integer(v) ? "a negative one" : mf_io_json_kind(v, 0));
  *out = (int64_t)json_integer_value(v);
  return MF_OK;
}
