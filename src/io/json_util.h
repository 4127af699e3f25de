/*
 * Helpers for readers of JSON files (src/io, and the planner's plan files): how
 * messages name JSON values, and a nesting check that runs before jansson
 * parses (and recurses).
 */
#ifndef MF_IO_JSON_UTIL_H
#define MF_IO_JSON_UTIL_H

#include <jansson.h>

#include "src/core/core.h"

/* "an object", "an array", "a string", "an integer", "a real number", "null";
 * a boolean as "a boolean" (its type, for "expected X, got a boolean"), or,
 * with bool_as_value, as the literal "true" / "false" (for "X is true"). */
const char *mf_io_json_kind(const json_t *v, int bool_as_value);
/* The same for a value of type t (for a parser that keeps its own values). */
const char *mf_io_json_type_kind(json_type t, int bool_as_value);

/* 1 when the JSON text nests objects/arrays deeper than max_depth (strings are
 * skipped); *where gets the byte offset of the bracket that went too deep and
 * *line / *col (1-based line) its position. Any out-pointer may be NULL. */
int mf_io_json_too_deep(const void *text, size_t n, int max_depth, size_t *where, int *line, int *col);

/* Text from a file, made safe to print into a message: control and non-ASCII
 * bytes escaped as \xNN, text past the buffer cut with "...". Returns buf. */
const char *mf_io_json_printable(const char *s, char *buf, size_t cap);

/* For readers whose messages are "<path>: <place>: <fault>" (MF_ERR_FORMAT):
 * every key of object o one of names[] ("unknown key 'k'"); key present in o
 * ("missing 'key'"). */
mf_status mf_io_json_only_keys(const char *path, const json_t *o, const char *place, const char *const *names,
                               int n);
mf_status mf_io_json_get(const char *path, const json_t *o, const char *place, const char *key, json_t **out);

/* A non-negative integer at `place` ("expected a non-negative integer, got ..."). */
mf_status mf_io_json_nonneg(const char *path, const json_t *v, const char *place, int64_t *out);

#endif /* MF_IO_JSON_UTIL_H */
