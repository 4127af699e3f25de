/*
 * Helpers for readers of JSON files (src/io, and the planner's plan files): how
 * messages name JSON values, and a nesting check that runs before jansson
 * parses (and recurses).
 */
#ifndef MF_IO_JSON_UTIL_H
#define MF_IO_JSON_UTIL_H

#include <jansson.h>

/* "an object", "an array", "a string", "an integer", "a real number", "null";
 * a boolean as "a boolean" (its type, for "expected X, got a boolean"), or,
 * with bool_as_value, as the literal "true" / "false" (for "X is true"). */
const char *mf_io_json_kind(const json_t *v, int bool_as_value);

/* 1 when the JSON text nests objects/arrays deeper than max_depth (strings are
 * skipped); *where gets the byte offset of the bracket that went too deep and
 * *line / *col (1-based line) its position. Any out-pointer may be NULL. */
int mf_io_json_too_deep(const void *text, size_t n, int max_depth, size_t *where, int *line, int *col);

#endif /* MF_IO_JSON_UTIL_H */
