/*
 * Private to src/io (not part of its API): how the io readers name JSON values
 * in their messages.
 */
#ifndef MF_IO_JSON_UTIL_H
#define MF_IO_JSON_UTIL_H

#include <jansson.h>

/* "an object", "an array", "a string", "an integer", "a real number", "null";
 * a boolean as "a boolean" (its type, for "expected X, got a boolean"), or,
 * with bool_as_value, as the literal "true" / "false" (for "X is true"). */
const char *mf_io_json_kind(const json_t *v, int bool_as_value);

#endif /* MF_IO_JSON_UTIL_H */
