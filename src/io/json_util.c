/* JSON value names for the io readers' messages (json_util.h). */
#include "src/io/json_util.h"

const char *mf_io_json_kind(const json_t *v, int bool_as_value) {
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
