/*
 * Routing statistics as JSON (routing.h).
 *
 * The writer prints the text itself rather than through jansson so that each
 * layer's counts stay on one line (a 61-layer, 256-expert model is 61 lines,
 * not 15,000). The reader parses with jansson and checks everything before it
 * fills the caller's struct; the counts' arithmetic checks are the same
 * function for a file and for counts handed in (check_counts).
 */
#include "experts/routing.h"
#include "src/io/json_util.h"
#include "src/model/hf_config.h"

#include <ctype.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define ROUTING_FORMAT "moefit-routing"
#define ROUTING_VERSION 1
#define ROUTING_MAX_BYTES ((size_t)256 << 20)
/* A routing file nests three deep (top, counts, a row). */
#define ROUTING_MAX_DEPTH 8

static mf_status check_spec(const mf_model_spec *s, const char *who) {
  if (s->layers < 1 || s->layers > MF_MAX_LAYERS || s->experts < 1 || s->top_k < 1 || s->top_k > s->experts)
    return MF_ERR(MF_ERR_INVALID_ARG,
                  "%s: the model spec has layers %lld, experts %lld, top_k %lld; routing needs "
                  "1 <= layers <= %d and 1 <= top_k <= experts",
                  who, (long long)s->layers, (long long)s->experts, (long long)s->top_k, MF_MAX_LAYERS);
  return MF_OK;
}

/* The counts' arithmetic: each non-negative, an MoE layer's summing to
 * tokens * top_k, a dense layer's all 0. `who` starts the message (a file
 * name, or the function's); from a file the faults are MF_ERR_FORMAT (a bad
 * sum) and MF_ERR_CONFIG (another model's layout of dense layers: a dense
 * layer of this model with routed tokens, or an MoE layer of this model with
 * none), from a caller MF_ERR_INVALID_ARG. */
static mf_status check_counts(const mf_model_spec *s, const int64_t *counts, uint64_t tokens, const char *who,
                              int from_file) {
  const int64_t E = s->experts;
  if (tokens > (uint64_t)INT64_MAX / (uint64_t)s->top_k)
    return MF_ERR(from_file ? MF_ERR_FORMAT : MF_ERR_INVALID_ARG,
                  "%s: tokens: %llu tokens x top_k %lld overflows", who, (unsigned long long)tokens,
                  (long long)s->top_k);
  const uint64_t want = tokens * (uint64_t)s->top_k;
  for (int64_t l = 0; l < s->layers; l++) {
    const int64_t *row = counts + l * E;
    const int moe = mf_model_spec_layer_is_moe(s, l);
    uint64_t sum = 0;
    for (int64_t e = 0; e < E; e++) {
      if (row[e] < 0)
        return MF_ERR(from_file ? MF_ERR_FORMAT : MF_ERR_INVALID_ARG,
                      "%s: counts[%lld][%lld]: %lld is negative", who, (long long)l, (long long)e,
                      (long long)row[e]);
      if (!moe && row[e] != 0)
        return MF_ERR(
            from_file ? MF_ERR_CONFIG : MF_ERR_INVALID_ARG,
            "%s: counts[%lld][%lld]: %lld tokens routed in layer %lld, a dense MLP layer of this model "
            "(its counts must all be 0)",
            who, (long long)l, (long long)e, (long long)row[e], (long long)l);
      /* sum <= want before each add, so it cannot wrap */
      sum += (uint64_t)row[e];
      if (sum > want) break;
    }
    if (moe && sum == 0 && want > 0 && from_file)
      return MF_ERR(
          MF_ERR_CONFIG,
          "%s: counts[%lld]: no tokens routed in layer %lld: the routing was measured on a model whose "
          "layer %lld is a dense MLP layer; this model's is an MoE layer",
          who, (long long)l, (long long)l, (long long)l);
    if (moe && sum != want)
      return MF_ERR(
          from_file ? MF_ERR_FORMAT : MF_ERR_INVALID_ARG,
          "%s: counts[%lld]: the layer's counts sum to %s%llu, expected tokens x top_k = %llu x %lld = %llu "
          "(each token is counted once per expert it picks)",
          who, (long long)l, sum > want ? "more than " : "", (unsigned long long)(sum > want ? want : sum),
          (unsigned long long)tokens, (long long)s->top_k, (unsigned long long)want);
  }
  return MF_OK;
}

/* Shares from counts already checked. */
static mf_status shares(const mf_model_spec *s, const int64_t *counts, uint64_t tokens, mf_routing *out) {
  const int64_t L = s->layers, E = s->experts;
  double *share = NULL;
  MF_CHECK(mf_calloc((size_t)(L * E), sizeof(double), "routing shares", (void **)&share));
  const double want = (double)tokens * (double)s->top_k;
  for (int64_t l = 0; l < L; l++) {
    if (!mf_model_spec_layer_is_moe(s, l)) continue;
    for (int64_t e = 0; e < E; e++)
      share[l * E + e] = tokens ? (double)counts[l * E + e] / want : 1.0 / (double)E;
  }
  out->layers = L;
  out->experts = E;
  out->top_k = s->top_k;
  out->share = share;
  out->tokens = tokens;
  return MF_OK;
}

mf_status mf_routing_from_counts(const mf_model_spec *spec, const int64_t *counts, uint64_t tokens,
                                 mf_routing *out) {
  if (!out) return MF_ERR(MF_ERR_INVALID_ARG, "mf_routing_from_counts: NULL argument");
  memset(out, 0, sizeof *out);
  if (!spec || !counts) return MF_ERR(MF_ERR_INVALID_ARG, "mf_routing_from_counts: NULL argument");
  MF_CHECK(check_spec(spec, "mf_routing_from_counts"));
  MF_CHECK(check_counts(spec, counts, tokens, "mf_routing_from_counts", 0));
  return shares(spec, counts, tokens, out);
}

void mf_routing_free(mf_routing *r) {
  if (!r) return;
  free(r->share);
  memset(r, 0, sizeof *r);
}

/* --------------------------------------------------------------- writing */

mf_status mf_routing_write(const char *path, const mf_model_spec *spec, const int64_t *counts,
                           uint64_t tokens) {
  if (!path || !spec || !counts) return MF_ERR(MF_ERR_INVALID_ARG, "mf_routing_write: NULL argument");
  char who[4200];
  snprintf(who, sizeof who, "mf_routing_write: %s", path);
  MF_CHECK(check_spec(spec, who));
  MF_CHECK(check_counts(spec, counts, tokens, who, 0));
  const int64_t L = spec->layers, E = spec->experts;
  /* At most 20 digits and ", " per count, and a little per row and for the header. */
  const size_t cap = (size_t)(L * E) * 22 + (size_t)L * 16 + 512;
  char *text = NULL;
  MF_CHECK(mf_malloc(cap, "the routing file's text", (void **)&text));
  size_t o = 0;
  o += (size_t)snprintf(
      text + o, cap - o,
      "{\n  \"format\": \"" ROUTING_FORMAT
      "\",\n  \"version\": %d,\n"
      "  \"model\": {\"family\": \"%s\", \"layers\": %lld, \"experts\": %lld, \"top_k\": %lld},\n"
      "  \"tokens\": %llu,\n  \"counts\": [",
      ROUTING_VERSION, mf_family_name(spec->family), (long long)L, (long long)E, (long long)spec->top_k,
      (unsigned long long)tokens);
  for (int64_t l = 0; l < L; l++) {
    o += (size_t)snprintf(text + o, cap - o, "%s\n    [", l ? "," : "");
    for (int64_t e = 0; e < E; e++)
      o += (size_t)snprintf(text + o, cap - o, "%s%lld", e ? ", " : "", (long long)counts[l * E + e]);
    o += (size_t)snprintf(text + o, cap - o, "]");
  }
  o += (size_t)snprintf(text + o, cap - o, "\n  ]\n}\n");
  mf_status st = o < cap ? mf_write_file_atomic(path, text, o)
                         : MF_ERR(MF_ERR_INTERNAL, "mf_routing_write: %s: text buffer too small", path);
  free(text);
  if (st != MF_OK) mf_error_trace(__FILE__, __LINE__, "mf_write_file_atomic(path, text, o)");
  return st;
}

/* --------------------------------------------------------------- reading */

/* "<file>: <place>: <fault>" */
static mf_status rerr(const char *path, mf_status s, const char *place, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static mf_status rerr(const char *path, mf_status s, const char *place, const char *fmt, ...) {
  char msg[1536];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  return MF_ERR(s, "%s: %s: %s", path, place, msg);
}

static mf_status only_keys(const char *path, const json_t *o, const char *place, const char *const *names,
                           int n) {
  return mf_io_json_only_keys(path, o, place, names, n);
}

static mf_status get(const char *path, const json_t *o, const char *place, const char *key, json_t **out) {
  return mf_io_json_get(path, o, place, key, out);
}

static mf_status nonneg(const char *path, const json_t *v, const char *place, int64_t *out) {
  return mf_io_json_nonneg(path, v, place, out);
}

static mf_status check_model(const char *path, const json_t *root, const mf_model_spec *s) {
  static const char *const keys[] = {"family", "layers", "experts", "top_k"};
  const int64_t want[] = {0, s->layers, s->experts, s->top_k};
  return mf_model_json_check(path, root, s, keys, want, 4, "the routing was measured on",
                                "the routing was measured on a model with");
}

/* counts: an array of `layers` arrays of `experts` non-negative integers, into c. */
static mf_status read_counts(const char *path, const json_t *root, const mf_model_spec *s, int64_t *c) {
  const int64_t L = s->layers, E = s->experts;
  json_t *rows;
  MF_CHECK(get(path, root, "(top level)", "counts", &rows));
  if (!json_is_array(rows))
    return rerr(path, MF_ERR_FORMAT, "counts", "expected an array of %lld rows (one per layer), got %s",
                (long long)L, mf_io_json_kind(rows, 0));
  if ((int64_t)json_array_size(rows) != L)
    return rerr(path, MF_ERR_FORMAT, "counts", "%zu rows, expected one per layer (model.layers = %lld)",
                json_array_size(rows), (long long)L);
  for (int64_t l = 0; l < L; l++) {
    const json_t *row = json_array_get(rows, (size_t)l);
    char place[64];
    snprintf(place, sizeof place, "counts[%lld]", (long long)l);
    if (!json_is_array(row))
      return rerr(path, MF_ERR_FORMAT, place, "expected an array of %lld counts (one per expert), got %s",
                  (long long)E, mf_io_json_kind(row, 0));
    if ((int64_t)json_array_size(row) != E)
      return rerr(path, MF_ERR_FORMAT, place, "%zu counts, expected one per expert (model.experts = %lld)",
                  json_array_size(row), (long long)E);
    for (int64_t e = 0; e < E; e++) {
      snprintf(place, sizeof place, "counts[%lld][%lld]", (long long)l, (long long)e);
      MF_CHECK(nonneg(path, json_array_get(row, (size_t)e), place, &c[l * E + e]));
    }
  }
  return MF_OK;
}

static mf_status read_root(const char *path, const json_t *root, const mf_model_spec *s, int64_t *counts,
                           uint64_t *tokens) {
  static const char *const keys[] = {"format", "version", "model", "tokens", "counts"};
  char q[128];
  if (!json_is_object(root))
    return MF_ERR(MF_ERR_FORMAT, "%s: the top level is %s, expected an object (moefit routing statistics)",
                  path, mf_io_json_kind(root, 0));
  json_t *fmt = json_object_get(root, "format");
  if (!fmt)
    return rerr(path, MF_ERR_FORMAT, "(top level)", "missing 'format' (is this a moefit routing file?)");
  if (!json_is_string(fmt))
    return rerr(path, MF_ERR_FORMAT, "format", "expected the string \"" ROUTING_FORMAT "\", got %s",
                mf_io_json_kind(fmt, 0));
  if (strcmp(json_string_value(fmt), ROUTING_FORMAT) != 0)
    return rerr(path, MF_ERR_FORMAT, "format",
                "expected \"" ROUTING_FORMAT "\", got '%s' (not a moefit routing file)",
                mf_io_json_printable(json_string_value(fmt), q, sizeof q));
  json_t *ver;
  MF_CHECK(get(path, root, "(top level)", "version", &ver));
  if (!json_is_integer(ver))
    return rerr(path, MF_ERR_FORMAT, "version", "expected a positive integer, got %s",
                mf_io_json_kind(ver, 0));
  if (json_integer_value(ver) < 1)
    return rerr(path, MF_ERR_FORMAT, "version", "expected a positive integer, got %lld",
                (long long)json_integer_value(ver));
  if (json_integer_value(ver) > ROUTING_VERSION)
    return rerr(
        path, MF_ERR_UNSUPPORTED, "version",
        "routing format version %lld is newer than this moefit reads (version %d); use a newer moefit",
        (long long)json_integer_value(ver), ROUTING_VERSION);
  MF_CHECK(only_keys(path, root, "(top level)", keys, 5));
  MF_CHECK(check_model(path, root, s));
  json_t *tok;
  int64_t t;
  MF_CHECK(get(path, root, "(top level)", "tokens", &tok));
  MF_CHECK(nonneg(path, tok, "tokens", &t));
  MF_CHECK(read_counts(path, root, s, counts));
  *tokens = (uint64_t)t;
  return check_counts(s, counts, *tokens, path, 1);
}

mf_status mf_routing_read(const char *path, const mf_model_spec *spec, mf_routing *out) {
  if (!out) return MF_ERR(MF_ERR_INVALID_ARG, "mf_routing_read: NULL argument");
  memset(out, 0, sizeof *out);
  if (!path || !spec) return MF_ERR(MF_ERR_INVALID_ARG, "mf_routing_read: NULL argument");
  char who[4200];
  snprintf(who, sizeof who, "mf_routing_read: %s", path);
  MF_CHECK(check_spec(spec, who));
  char *text = NULL;
  size_t len = 0;
  MF_CHECK(mf_read_file(path, ROUTING_MAX_BYTES, "routing statistics", &text, &len));
  json_t *root = NULL;
  int64_t *counts = NULL;
  uint64_t tokens = 0;
  mf_status st = MF_OK;
  int line, col;
  size_t lead = 0;
  while (lead < len && isspace((unsigned char)text[lead])) lead++;
  if (lead == len) {
    st = MF_ERR(MF_ERR_FORMAT, "%s: the file is empty, expected moefit routing statistics (JSON)", path);
    goto done;
  }
  if (mf_io_json_too_deep(text, len, ROUTING_MAX_DEPTH, NULL, &line, &col)) {
    st = MF_ERR(MF_ERR_FORMAT, "%s: line %d, column %d: nests deeper than %d levels; a routing file needs 3",
                path, line, col, ROUTING_MAX_DEPTH);
    goto done;
  }
  json_error_t jerr;
  root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
  if (!root) {
    char clean[JSON_ERROR_TEXT_LENGTH + 64];
    st = MF_ERR(MF_ERR_FORMAT, "%s: line %d, column %d: invalid JSON: %s", path, jerr.line, jerr.column,
                mf_io_json_printable(jerr.text, clean, sizeof clean));
    goto done;
  }
  MF_CHECK_GOTO(
      mf_malloc((size_t)(spec->layers * spec->experts) * sizeof(int64_t), "routing counts", (void **)&counts),
      st, done);
  MF_CHECK_GOTO(read_root(path, root, spec, counts, &tokens), st, done);
  MF_CHECK_GOTO(shares(spec, counts, tokens, out), st, done);
done:
  json_decref(root);
  free(counts);
  free(text);
  return st;
}

mf_status mf_routing_for_config(const mf_config *cfg, const mf_model_spec *spec, mf_routing *out, int *found,
                                char *path, size_t path_cap, char *note, size_t note_cap) {
  memset(out, 0, sizeof *out);
  *found = 0;
  if (path && path_cap) path[0] = 0;
  if (note && note_cap) note[0] = 0;
  const mf_config_memory *mem = &cfg->memory;
  char buf[4096];
  if (mem->routing_kind == MF_CONFIG_ROUTING_NONE) return MF_OK;
  const int named = mem->routing_kind == MF_CONFIG_ROUTING_FILE;
  if (named) {
    snprintf(buf, sizeof buf, "%s", mem->routing);
  } else {
    if (!cfg->output.dir) return MF_OK;
    const int n = snprintf(buf, sizeof buf, "%s/routing.json", cfg->output.dir);
    if (n < 0 || (size_t)n >= sizeof buf || access(buf, F_OK) != 0) return MF_OK;
  }
  const mf_status st = mf_routing_read(buf, spec, out);
  if (st == MF_ERR_CONFIG) {
    /* Measured on another model (its model section or its dense layers). */
    char why[1536];
    snprintf(why, sizeof why, "%s", mf_last_error());
    if (named)
      return MF_ERR(
          MF_ERR_CONFIG,
          "memory.routing: %s; it is not this model's routing: set memory.routing=none to plan with "
          "uniform routing",
          why);
    if (note && note_cap)
      snprintf(note, note_cap, "routing: %s; planning with uniform routing (memory.routing: auto)", why);
    mf_error_clear();
    return MF_OK;
  }
  MF_CHECK(st);
  *found = 1;
  if (path && path_cap) snprintf(path, path_cap, "%s", buf);
  return MF_OK;
}
