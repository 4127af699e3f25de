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
