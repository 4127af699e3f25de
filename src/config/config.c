/*
 * Config loading: file -> node tree (yaml_tree.c) -> command-line overrides
 * spliced into the tree -> mapped through the key table (keys.c) onto an
 * mf_config -> cross-field checks.
 *
 * Overrides go into the tree rather than the struct so that a value from the
 * command line meets exactly the checks a value in the file meets, and its
 * errors name the override instead of a line.
 */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "src/config/config_impl.h"

#define MAX_KEYS 128

_Static_assert(sizeof(mf_config_schedule) == sizeof(int), "enum fields are written as int");
_Static_assert(sizeof(mf_config_backend) == sizeof(int), "enum fields are written as int");
_Static_assert(sizeof(mf_family) == sizeof(int), "enum fields are written as int");

typedef struct walk {
  mf_config *cfg;
  mf_config_use use; /* which keys are required */
  const mf_ynode *root;
  const mf_ynode *seen[MAX_KEYS]; /* the value node of every key given */
} walk;

static mf_status node_err(const char *file, int line, const mf_ynode *n, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static mf_status node_err(const char *file, int line, const mf_ynode *n, const char *fmt, ...) {
  char loc[512], msg[1400];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  return mf_error_set(MF_ERR_CONFIG, file, line, "%s: %s", mf_ynode_loc(n, loc, sizeof loc), msg);
}
#define NODE_ERR(n, ...) node_err(__FILE__, __LINE__, (n), __VA_ARGS__)

static void *field(mf_config *c, const mf_config_key *k) {
  return (char *)c + k->off;
}
static const void *cfield(const mf_config *c, const mf_config_key *k) {
  return (const char *)c + k->off;
}

static int seen_given(const walk *w, int idx) {
  return idx >= 0 && w->seen[idx] && !mf_ynode_is_null(w->seen[idx]);
}

/* The node to blame for key `path`: its place (the override that set it, or
 * its key in the file), else the nearest given section's, else the root. */
static const mf_ynode *blame(const walk *w, const char *path) {
  char p[256];
  snprintf(p, sizeof p, "%s", path);
  while (p[0]) {
    int idx = mf_config_key_find(p);
    if (idx >= 0 && w->seen[idx]) return mf_ynode_place(w->seen[idx]);
    char up[256];
    mf_config_key_parent(p, up, sizeof up);
    memcpy(p, up, sizeof up);
  }
  return w->root;
}

/* The value of key `path` as given (in the file or by an override), or NULL. */
static const mf_ynode *given(const walk *w, const char *path) {
  const int idx = mf_config_key_find(path);
  return idx >= 0 ? w->seen[idx] : NULL;
}

/* The override number that set n (0: the file, or not given). */
static int override_no(const mf_ynode *n) {
  return n && n->src ? n->src->cmdline : 0;
}

/* Where key `path`'s value came from: "set at FILE:L:C", "set by override N
 * '...'" or "not set: its default". */
static const char *origin_of(const walk *w, const char *path, char *buf, size_t cap) {
  const mf_ynode *v = given(w, path);
  if (!v) {
    snprintf(buf, cap, "not set: its default");
    return buf;
  }
  return mf_ynode_origin(v, buf, cap);
}

/* A relation between keys a and b failed ("a (30) must be <= b (20)"). It is
 * blamed on the value that made the pair inconsistent: the later override of
 * the two, else a when it is given, else b; the message ends with where the
 * other one came from, so that it names both places. */
static mf_status cross_err(const char *file, int line, const walk *w, const char *a, const char *b,
                           const char *fmt, ...) __attribute__((format(printf, 6, 7)));
static mf_status cross_err(const char *file, int line, const walk *w, const char *a, const char *b,
                           const char *fmt, ...) {
  const mf_ynode *na = given(w, a), *nb = given(w, b);
  int blame_b = !na && nb;
  if (override_no(na) || override_no(nb)) blame_b = override_no(nb) > override_no(na);
  char msg[1400], other[700];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  const char *o = blame_b ? a : b;
  return node_err(file, line, blame(w, blame_b ? b : a), "%s; %s is %s", msg, o,
                  origin_of(w, o, other, sizeof other));
}
#define CROSS_ERR(w, a, b, ...) cross_err(__FILE__, __LINE__, (w), (a), (b), __VA_ARGS__)

/* The last override that set a key under `prefix` ("model.init."), or NULL. */
static const mf_ynode *last_override_under(const walk *w, const char *prefix) {
  const mf_ynode *last = NULL;
  for (size_t i = 0; i < mf_config_n_keys; i++)
    if (strncmp(mf_config_keys[i].path, prefix, strlen(prefix)) == 0 &&
        override_no(w->seen[i]) > override_no(last))
      last = w->seen[i];
  return last;
}

/* ---------------------------------------------------------- scalars */

/* 0: ok; -1: not a number; -2: a fraction; -3: out of range. */
static int parse_int(const char *s, int64_t *out) {
  const char *p = s + (*s == '+' || *s == '-');
  if (*p && strspn(p, "0123456789") == strlen(p)) {
    errno = 0;
    char *end;
    long long v = strtoll(s, &end, 10);
    if (errno == ERANGE) return -3;
    *out = v;
    return 0;
  }
  /* 1e6 is an integer too */
  if (!*s || strspn(s, "0123456789+-.eE") != strlen(s)) return -1;
  char *end;
  double d = strtod(s, &end);
  if (*end || end == s) return -1;
  if (!isfinite(d) || fabs(d) >= 9.2e18) return -3;
  if (d != floor(d)) return -2;
  *out = (int64_t)d;
  return 0;
}

/* 0: ok; -1: not a number; -3: not finite. */
static int parse_float(const char *s, double *out) {
  if (!*s || strspn(s, "0123456789+-.eE") != strlen(s)) return -1;
  char *end;
  double d = strtod(s, &end);
  if (*end || end == s) return -1;
  if (!isfinite(d)) return -3;
  *out = d;
  return 0;
}

static const char *range_text(const mf_config_key *k, char *buf, size_t cap) {
  const int has_lo = isfinite(k->lo), has_hi = isfinite(k->hi);
  if (has_lo && has_hi)
    snprintf(buf, cap, "in %c%.17g, %.17g%c", k->flags & MF_CK_LO_OPEN ? '(' : '[', k->lo, k->hi,
             k->flags & MF_CK_HI_OPEN ? ')' : ']');
  else if (has_lo)
    snprintf(buf, cap, "%s %.17g", k->flags & MF_CK_LO_OPEN ? ">" : ">=", k->lo);
  else
    snprintf(buf, cap, "%s %.17g", k->flags & MF_CK_HI_OPEN ? "<" : "<=", k->hi);
  return buf;
}

static int in_range(const mf_config_key *k, double x) {
  if (k->flags & MF_CK_LO_OPEN ? !(x > k->lo) : !(x >= k->lo)) return 0;
  if (k->flags & MF_CK_HI_OPEN ? !(x < k->hi) : !(x <= k->hi)) return 0;
  return 1;
}

/* An integer from a scalar node, with the key's range; `path` names it in messages. */
static mf_status scalar_int(const mf_config_key *k, const mf_ynode *v, const char *path, int64_t *out) {
  char got[128], range[96];
  mf_ynode_describe(v, got, sizeof got);
  if (v->kind != MF_YSCALAR || mf_ynode_is_null(v))
    return NODE_ERR(v, "%s must be an integer (got %s)", path, got);
  if (v->quoted) return NODE_ERR(v, "%s must be an integer, not the quoted string %s", path, got);
  int64_t x = 0;
  int r = parse_int(v->text, &x);
  if (r == -1) return NODE_ERR(v, "%s must be an integer (got %s)", path, got);
  if (r == -2) return NODE_ERR(v, "%s must be a whole number (got %s)", path, got);
  if (r == -3 || !in_range(k, (double)x))
    return NODE_ERR(v, "%s must be %s (got %s)", path, range_text(k, range, sizeof range), got);
  *out = x;
  return MF_OK;
}

/* A size that mf_parse_size refuses only because it is not a whole number of
 * bytes ("1.3MiB"): 1, and buf gets "1363148.8 bytes): write e.g. 1331KiB or
 * 1363148". A size is whole bytes: rounding would hide a typo's "0.5". */
static int size_fraction(const char *text, char *buf, size_t cap) {
  if (!((text[0] >= '0' && text[0] <= '9') || text[0] == '.')) return 0;
  char *end, one[64];
  const double v = strtod(text, &end);
  uint64_t unit = 0;
  snprintf(one, sizeof one, "1%s", end);
  if (!(v > 0) || !isfinite(v) || mf_parse_size(one, &unit) != 0) return 0;
  const double bytes = v * (double)unit, whole = floor(bytes);
  if (bytes == whole || bytes >= 1e19) return 0;
  char b[64];
  const int digits = bytes >= 1 ? (int)floor(log10(bytes)) + 1 : 0; /* keep 15 significant digits */
  snprintf(b, sizeof b, "%.*f", digits < 14 ? 15 - digits : 1, bytes);
  for (size_t l = strlen(b); b[l - 1] == '0'; l--) b[l - 1] = 0; /* 1363148.8, not 1363148.800 */
  int n = snprintf(buf, cap, "%s bytes): write e.g. ", b);
  if (whole >= 1024 && n > 0 && (size_t)n < cap)
    n += snprintf(buf + n, cap - (size_t)n, "%.0fKiB or ", floor(whole / 1024));
  if (n > 0 && (size_t)n < cap) snprintf(buf + n, cap - (size_t)n, "%.0f", whole < 1 ? 1.0 : whole);
  return 1;
}

static const char *family_choices = "mixtral|qwen2_moe|qwen3_moe|olmoe|glm4_moe|deepseek_v3|gpt_oss";

/* Sets one non-section key from a node (a value in the file, an override, or a default). */
static mf_status set_value(walk *w, const mf_config_key *k, const mf_ynode *v);

static mf_status set_scalar(walk *w, const mf_config_key *k, const mf_ynode *v) {
  void *dst = field(w->cfg, k);
  const char *path = k->path;
  char got[128], range[96];
  mf_ynode_describe(v, got, sizeof got);
  const int is_null = mf_ynode_is_null(v);
  if (is_null && (k->flags & MF_CK_NULLABLE)) {
    if (k->kind == MF_CK_STR) {
      free(*(char **)dst);
      *(char **)dst = NULL;
    } else if (k->kind == MF_CK_FLOAT) {
      *(double *)dst = NAN;
    }
    return MF_OK;
  }
  static const char *const expect[MF_CK_OVERRIDES + 1] = {
      [MF_CK_SECTION] = "a map",         [MF_CK_ENUM] = "one of its choices",
      [MF_CK_FAMILY] = "a model family", [MF_CK_INTLIST] = "a list",
      [MF_CK_NAMELIST] = "a list",       [MF_CK_OVERRIDES] = "a list",
      [MF_CK_INT] = "an integer",        [MF_CK_U64] = "a non-negative integer",
      [MF_CK_FLOAT] = "a number",        [MF_CK_BOOL] = "true or false",
      [MF_CK_STR] = "a string",          [MF_CK_SIZE] = "a size such as 24GiB or 512MiB, or auto",
  };
  if (k->kind == MF_CK_ENUM || k->kind == MF_CK_FAMILY) {
    if (v->kind != MF_YSCALAR || is_null) goto not_choice;
    char c[64];
    for (int i = 0; mf_config_key_choice(k, i, c, sizeof c); i++) {
      if (strcmp(v->text, c) == 0) {
        int val = k->kind == MF_CK_FAMILY ? (int)mf_family_from_name(c) : i;
        memcpy(dst, &val, sizeof val);
        return MF_OK;
      }
    }
  not_choice:
    return NODE_ERR(v, "%s must be one of %s (got %s)", path, k->choices, got);
  }
  if (v->kind != MF_YSCALAR || is_null)
    return NODE_ERR(v, "%s must be %s (got %s)", path, expect[k->kind], got);
  const int number = k->kind == MF_CK_INT || k->kind == MF_CK_U64 || k->kind == MF_CK_FLOAT;
  if (number && v->quoted)
    return NODE_ERR(v, "%s must be %s, not the quoted string %s (remove the quotes)", path, expect[k->kind],
                    got);
  switch (k->kind) {
    case MF_CK_INT:
      return scalar_int(k, v, path, (int64_t *)dst);
    case MF_CK_U64: {
      if (!v->text[0] || strspn(v->text, "0123456789") != v->len)
        return NODE_ERR(v, "%s must be %s (got %s)", path, expect[k->kind], got);
      errno = 0;
      unsigned long long x = strtoull(v->text, NULL, 10);
      if (errno == ERANGE) return NODE_ERR(v, "%s is too large (got %s)", path, got);
      *(uint64_t *)dst = x;
      return MF_OK;
    }
    case MF_CK_FLOAT: {
      double x = 0;
      int r = parse_float(v->text, &x);
      if (r == -1) return NODE_ERR(v, "%s must be a number (got %s)", path, got);
      if (r == -3) return NODE_ERR(v, "%s must be a finite number (got %s)", path, got);
      if (!in_range(k, x))
        return NODE_ERR(v, "%s must be %s (got %s)", path, range_text(k, range, sizeof range), got);
      *(double *)dst = x;
      return MF_OK;
    }
    case MF_CK_BOOL: {
      static const char *const t[] = {"true", "True", "TRUE"}, *const f[] = {"false", "False", "FALSE"};
      if (!v->quoted) {
        for (int i = 0; i < 3; i++) {
          if (strcmp(v->text, t[i]) == 0) return *(int *)dst = 1, MF_OK;
          if (strcmp(v->text, f[i]) == 0) return *(int *)dst = 0, MF_OK;
        }
      }
      return NODE_ERR(v, "%s must be true or false (got %s)", path, got);
    }
    case MF_CK_STR: {
      if (strlen(v->text) != v->len) return NODE_ERR(v, "%s must not contain a NUL character", path);
      if (v->len == 0) return NODE_ERR(v, "%s must not be empty", path);
      char *s = mf_strdup(v->text);
      if (!s) return MF_ERR(MF_ERR_OUT_OF_MEMORY, "out of memory copying %s", path);
      free(*(char **)dst);
      *(char **)dst = s;
      return MF_OK;
    }
    case MF_CK_SIZE: {
      uint64_t x = 0;
      if (strcmp(v->text, "auto") == 0) {
        *(uint64_t *)dst = MF_CONFIG_SIZE_AUTO;
        return MF_OK;
      }
      if (strlen(v->text) != v->len || mf_parse_size(v->text, &x) != 0) {
        char whole[160];
        if (size_fraction(v->text, whole, sizeof whole))
          return NODE_ERR(v, "%s must be a whole number of bytes (got %s = %s", path, got, whole);
        return NODE_ERR(v, "%s must be %s (got %s)", path, expect[k->kind], got);
      }
      if (x == 0)
        return NODE_ERR(v, "%s must be more than 0 bytes (got %s); write auto to let moefit decide", path,
                        got);
      *(uint64_t *)dst = x;
      return MF_OK;
    }
    default:
      return MF_ERR(MF_ERR_INTERNAL, "config key %s: no scalar setter", path);
  }
}

/* model.init.mlp_only_layers: a list of layer indices. */
static mf_status set_intlist(walk *w, const mf_config_key *k, const mf_ynode *v) {
  mf_model_spec *s = &w->cfg->model.init;
  char got[128], path[300];
  s->n_mlp_only = 0;
  if (mf_ynode_is_null(v)) return MF_OK;
  if (v->kind != MF_YSEQ)
    return NODE_ERR(v, "%s must be a list of layer indices like [0, 2] (got %s)", k->path,
                    mf_ynode_describe(v, got, sizeof got));
  if (v->n > MF_MAX_LAYERS) return NODE_ERR(v, "%s has more than %d entries", k->path, MF_MAX_LAYERS);
  for (size_t i = 0; i < v->n; i++) {
    int64_t x = 0;
    snprintf(path, sizeof path, "%s[%zu]", k->path, i);
    MF_CHECK(scalar_int(k, v->vals[i], path, &x));
    s->mlp_only_layers[i] = (int32_t)x;
  }
  s->n_mlp_only = (int64_t)v->n;
  return MF_OK;
}

static void free_mem_overrides(mf_config_memory *m) {
  for (size_t i = 0; i < m->n_overrides; i++) {
    mf_config_mem_override *o = &m->overrides[i];
    free(o->match), free(o->params), free(o->activations), free(o->grads), free(o->optimizer), free(o->where);
  }
  free(m->overrides);
  m->overrides = NULL;
  m->n_overrides = 0;
}

/* memory.overrides: kept as written for the planner, which knows the decisions. */
static mf_status set_mem_overrides(walk *w, const mf_config_key *k, const mf_ynode *v) {
  static const char *const names[] = {"match", "params", "activations", "grads", "optimizer"};
  const size_t n_names = sizeof names / sizeof names[0];
  mf_config_memory *m = &w->cfg->memory;
  char got[128], path[300], hint[512], loc[512];
  free_mem_overrides(m);
  if (mf_ynode_is_null(v)) return MF_OK;
  if (v->kind != MF_YSEQ)
    return NODE_ERR(
        v, "%s must be a list of {match: PATTERN, params|activations|grads|optimizer: DECISION} (got %s)",
        k->path, mf_ynode_describe(v, got, sizeof got));
  if (v->n == 0) return MF_OK;
  MF_CHECK(mf_calloc(v->n, sizeof *m->overrides, "memory.overrides", (void **)&m->overrides));
  for (size_t i = 0; i < v->n; i++) {
    const mf_ynode *item = v->vals[i];
    mf_config_mem_override *o = &m->overrides[m->n_overrides++];
    if (item->kind != MF_YMAP)
      return NODE_ERR(item, "%s[%zu] must be a map {match: PATTERN, ...} (got %s)", k->path, i,
                      mf_ynode_describe(item, got, sizeof got));
    o->where = mf_strdup(mf_ynode_loc(item, loc, sizeof loc));
    if (!o->where) return MF_ERR(MF_ERR_OUT_OF_MEMORY, "out of memory");
    int decisions = 0;
    for (size_t j = 0; j < item->n; j++) {
      const mf_ynode *key = item->keys[j], *val = item->vals[j];
      snprintf(path, sizeof path, "%s[%zu].%s", k->path, i, key->text);
      size_t which = n_names;
      for (size_t q = 0; q < n_names; q++)
        if (strcmp(key->text, names[q]) == 0) which = q;
      if (which == n_names) {
        mf_config_key_suggest(path, names, n_names, hint, sizeof hint);
        return NODE_ERR(key, "unknown key '%s'%s", path, hint);
      }
      if (mf_ynode_is_null(val)) continue;
      if (val->kind != MF_YSCALAR || val->len == 0 || strlen(val->text) != val->len)
        return NODE_ERR(val, "%s must be a non-empty string (got %s)", path,
                        mf_ynode_describe(val, got, sizeof got));
      char **dst[] = {&o->match, &o->params, &o->activations, &o->grads, &o->optimizer};
      *dst[which] = mf_strdup(val->text);
      if (!*dst[which]) return MF_ERR(MF_ERR_OUT_OF_MEMORY, "out of memory");
      decisions += which > 0;
    }
    if (!o->match)
      return NODE_ERR(item, "missing required key '%s[%zu].match' (the tensor-name pattern)", k->path, i);
    if (!decisions)
      return NODE_ERR(item, "%s[%zu] decides nothing: give params, activations, grads or optimizer", k->path,
                      i);
  }
  return MF_OK;
}

static const char *const plan_words[] = {"auto",      "resident",   "zero_offload",
                                         "megatrain", "checkpoint", "least_memory"};
#define N_PLAN_WORDS (sizeof plan_words / sizeof plan_words[0])
_Static_assert(N_PLAN_WORDS == MF_CONFIG_PLAN_FILE, "a word for every mf_config_plan but FILE");

const char *mf_config_plan_word(mf_config_plan p) {
  return (unsigned)p < N_PLAN_WORDS ? plan_words[p] : NULL;
}

/* memory.plan: a word, or a plan file (a path ending in .json, taken as
 * written like every path; train reads and checks it). */
static mf_status set_mem_plan(walk *w, const mf_config_key *k, const mf_ynode *v) {
  MF_CHECK(set_scalar(w, k, v));
  mf_config_memory *m = &w->cfg->memory;
  for (size_t i = 0; i < N_PLAN_WORDS; i++) {
    if (strcmp(m->plan, plan_words[i]) == 0) {
      m->plan_kind = (mf_config_plan)i;
      return MF_OK;
    }
  }
  const size_t len = strlen(m->plan);
  if (len > 5 && strcmp(m->plan + len - 5, ".json") == 0) {
    m->plan_kind = MF_CONFIG_PLAN_FILE;
    return MF_OK;
  }
  char got[128], hint[512];
  mf_config_key_suggest(m->plan, plan_words, N_PLAN_WORDS, hint, sizeof hint);
  if (strncmp(hint, " (did you mean", 14) != 0) hint[0] = 0; /* not close to any word */
  return NODE_ERR(
      v,
      "%s must be auto, resident, zero_offload, megatrain, checkpoint, least_memory or a plan file "
      "ending in .json (got %s)%s",
      k->path, mf_ynode_describe(v, got, sizeof got), hint);
}

/* memory.routing: auto, none, or a routing file (a path ending in .json, taken
 * as written; the planner reads and checks it). */
static mf_status set_mem_routing(walk *w, const mf_config_key *k, const mf_ynode *v) {
  static const char *const words[] = {"auto", "none"};
  MF_CHECK(set_scalar(w, k, v));
  mf_config_memory *m = &w->cfg->memory;
  for (size_t i = 0; i < 2; i++) {
    if (strcmp(m->routing, words[i]) == 0) {
      m->routing_kind = (mf_config_routing)i;
      return MF_OK;
    }
  }
  const size_t len = strlen(m->routing);
  if (len > 5 && strcmp(m->routing + len - 5, ".json") == 0) {
    m->routing_kind = MF_CONFIG_ROUTING_FILE;
    return MF_OK;
  }
  char got[128], hint[512];
  mf_config_key_suggest(m->routing, words, 2, hint, sizeof hint);
  if (strncmp(hint, " (did you mean", 14) != 0) hint[0] = 0; /* not close to either word */
  return NODE_ERR(v, "%s must be auto, none or a routing file ending in .json (got %s)%s", k->path,
                  mf_ynode_describe(v, got, sizeof got), hint);
}

/* output.checkpoint_compression: none or zstd-N, N in 1..19. */
static mf_status set_ckpt_compression(walk *w, const mf_config_key *k, const mf_ynode *v) {
  MF_CHECK(set_scalar(w, k, v));
  mf_config_output *o = &w->cfg->output;
  if (strcmp(o->checkpoint_compression, "none") == 0) {
    o->checkpoint_zstd = 0;
    return MF_OK;
  }
  const char *c = o->checkpoint_compression;
  char *end = NULL;
  const long lvl = strncmp(c, "zstd-", 5) == 0 && c[5] >= '0' && c[5] <= '9' ? strtol(c + 5, &end, 10) : -1;
  if (lvl >= 1 && lvl <= 19 && end && !*end) {
    o->checkpoint_zstd = (int)lvl;
    return MF_OK;
  }
  char got[128];
  return NODE_ERR(v, "%s must be none or zstd-N with N from 1 to 19 (got %s)", k->path,
                  mf_ynode_describe(v, got, sizeof got));
}

/* train.lora.targets: names among the key's choices, each once. */
static mf_status set_namelist(walk *w, const mf_config_key *k, const mf_ynode *v) {
  mf_config_lora *l = &w->cfg->train.lora;
  char got[128], c[64];
  l->n_targets = 0;
  if (v->kind != MF_YSEQ)
    return NODE_ERR(v, "%s must be a list of module names like [q_proj, v_proj] (got %s)", k->path,
                    mf_ynode_describe(v, got, sizeof got));
  if (v->n > MF_CONFIG_LORA_MAX_TARGETS)
    return NODE_ERR(v, "%s has %zu names, more than %d", k->path, v->n, MF_CONFIG_LORA_MAX_TARGETS);
  for (size_t i = 0; i < v->n; i++) {
    const mf_ynode *e = v->vals[i];
    int ok = 0;
    for (int j = 0; e->kind == MF_YSCALAR && !mf_ynode_is_null(e) && mf_config_key_choice(k, j, c, sizeof c);
         j++)
      ok |= strcmp(e->text, c) == 0;
    if (!ok)
      return NODE_ERR(e, "%s[%zu] must be one of %s (got %s)", k->path, i, k->choices,
                      mf_ynode_describe(e, got, sizeof got));
    for (int64_t j = 0; j < l->n_targets; j++)
      if (strcmp(l->targets[j], e->text) == 0)
        return NODE_ERR(e, "%s[%zu]: %s is named twice", k->path, i, e->text);
    snprintf(l->targets[l->n_targets++], MF_CONFIG_LORA_NAME_MAX, "%s", e->text);
  }
  return MF_OK;
}

static mf_status set_value(walk *w, const mf_config_key *k, const mf_ynode *v) {
  if (k->kind == MF_CK_INTLIST) return set_intlist(w, k, v);
  if (k->kind == MF_CK_NAMELIST) return set_namelist(w, k, v);
  if (k->kind == MF_CK_OVERRIDES) return set_mem_overrides(w, k, v);
  if (k->off == offsetof(mf_config, memory.plan) && k->kind == MF_CK_STR) return set_mem_plan(w, k, v);
  if (k->off == offsetof(mf_config, memory.routing) && k->kind == MF_CK_STR) return set_mem_routing(w, k, v);
  if (k->off == offsetof(mf_config, output.checkpoint_compression)) return set_ckpt_compression(w, k, v);
  return set_scalar(w, k, v);
}

/* ------------------------------------------------------------ walking */

static mf_status walk_init(walk *w, const mf_ynode *map);

static mf_status walk_map(walk *w, const mf_ynode *map, const char *prefix) {
  char path[300], hint[1024], got[128];
  for (size_t i = 0; i < map->n; i++) {
    const mf_ynode *key = map->keys[i], *val = map->vals[i];
    snprintf(path, sizeof path, "%s%s%s", prefix, prefix[0] ? "." : "", key->text);
    if (strchr(key->text, '.'))
      return NODE_ERR(key, "key '%s' contains '.': nest it as a map instead (train: {lr: ...})", path);
    int idx = strlen(key->text) == key->len ? mf_config_key_find(path) : -1;
    if (idx < 0) {
      mf_config_key_suggest(path, NULL, 0, hint, sizeof hint);
      return NODE_ERR(key, "unknown key '%s'%s", path, hint);
    }
    const mf_config_key *k = &mf_config_keys[idx];
    w->seen[idx] = val;
    if (k->kind == MF_CK_SECTION) {
      if (mf_ynode_is_null(val)) continue;
      if (val->kind != MF_YMAP)
        return NODE_ERR(val, "%s must be a map of keys (got %s)", path,
                        mf_ynode_describe(val, got, sizeof got));
      if (strcmp(path, "model.init") == 0)
        MF_CHECK(walk_init(w, val));
      else
        MF_CHECK(walk_map(w, val, path));
    } else if (k->kind != MF_CK_FAMILY) { /* walk_init sets the family first */
      MF_CHECK(set_value(w, k, val));
    }
  }
  return MF_OK;
}

static mf_status walk_init(walk *w, const mf_ynode *map) {
  const mf_ynode *fam = mf_ynode_get(map, "family", NULL);
  if (!fam)
    return NODE_ERR(mf_ynode_place(map), "missing required key 'model.init.family' (one of %s)",
                    family_choices);
  const mf_config_key *k = &mf_config_keys[mf_config_key_find("model.init.family")];
  mf_family f = MF_FAMILY_INVALID;
  mf_config probe;
  memset(&probe, 0, sizeof probe);
  walk pw = {.cfg = &probe, .root = w->root};
  MF_CHECK(set_scalar(&pw, k, fam));
  f = probe.model.init.family;
  mf_model_spec_defaults(f, &w->cfg->model.init);
  MF_CHECK(walk_map(w, map, "model.init"));
  w->cfg->model.has_init = 1;
  return MF_OK;
}

static mf_status apply_defaults(walk *w) {
  for (size_t i = 0; i < mf_config_n_keys; i++) {
    const mf_config_key *k = &mf_config_keys[i];
    if (k->kind == MF_CK_SECTION || !k->def || (k->flags & MF_CK_DOCDEF)) continue;
    mf_ynode d;
    memset(&d, 0, sizeof d);
    d.kind = MF_YSCALAR;
    d.text = (char *)k->def;
    d.len = strlen(k->def);
    if (set_value(w, k, &d) != MF_OK)
      return MF_ERR(MF_ERR_INTERNAL, "the default of %s ('%s') does not parse: %s", k->path, k->def,
                    mf_last_error());
  }
  /* train.lora.targets (a list: its default is set here): the attention projections. */
  static const char *const attention[] = {"q_proj", "k_proj", "v_proj", "o_proj"};
  mf_config_lora *l = &w->cfg->train.lora;
  for (size_t i = 0; i < sizeof attention / sizeof attention[0]; i++)
    snprintf(l->targets[i], MF_CONFIG_LORA_NAME_MAX, "%s", attention[i]);
  l->n_targets = (int64_t)(sizeof attention / sizeof attention[0]);
  return MF_OK;
}

/* "runs/<file name without directory and extension>" */
static char *default_output_dir(const char *name) {
  const char *base = strrchr(name, '/');
  base = base ? base + 1 : name;
  size_t len = strlen(base);
  const char *dot = strrchr(base, '.');
  if (dot && dot != base) len = (size_t)(dot - base);
  char buf[512];
  if (len == 0)
    snprintf(buf, sizeof buf, "runs/moefit");
  else
    snprintf(buf, sizeof buf, "runs/%.*s", (int)len, base);
  return mf_strdup(buf);
}

/* The model is required by every command; what trains only by train. */
static int required_for(const char *path, mf_config_use use) {
  if (use == MF_CONFIG_FOR_TRAIN) return 1;
  return strcmp(path, "data.train") != 0 && strcmp(path, "train.steps") != 0;
}

/* train.lora against the model: Mixtral's experts are w1 (gate), w3 (up) and
 * w2 (down); the other families name theirs gate_proj, up_proj, down_proj.
 * (A model.path's family is known only once its config.json is read; the
 * training that would check it there is not built yet.) */
static mf_status check_lora(walk *w) {
  const mf_config *c = w->cfg;
  const mf_config_lora *l = &c->train.lora;
  /* With rank 0 the other keys are read and not used (a printed config has
   * them all). */
  if (l->rank == 0 || !c->model.has_init) return MF_OK;
  const int mixtral = c->model.init.family == MF_FAMILY_MIXTRAL;
  for (int64_t i = 0; i < l->n_targets; i++) {
    const char *t = l->targets[i];
    const int w_name = t[0] == 'w' && t[2] == 0;
    const int hf_mlp =
        strcmp(t, "gate_proj") == 0 || strcmp(t, "up_proj") == 0 || strcmp(t, "down_proj") == 0;
    if (mixtral && hf_mlp)
      return CROSS_ERR(
          w, "train.lora.targets", "model.init.family",
          "train.lora.targets[%lld]: mixtral names its experts' projections w1 (gate), w3 (up) and "
          "w2 (down), not %s",
          (long long)i, t);
    if (!mixtral && w_name)
      return CROSS_ERR(
          w, "train.lora.targets", "model.init.family",
          "train.lora.targets[%lld]: %s names its MLP projections gate_proj, up_proj and down_proj; "
          "%s is Mixtral's",
          (long long)i, mf_family_name(c->model.init.family), t);
  }
  return MF_OK;
}

/* model.init's relations to itself and to the data; a value given by an
 * override is blamed before the file (cross_err). */
static mf_status finish_init(walk *w, const mf_ynode *in) {
  mf_config *c = w->cfg;
  mf_model_spec *s = &c->model.init;
  char loc[512], oloc[512];
  if (s->family == MF_FAMILY_DEEPSEEK_V3 && !seen_given(w, mf_config_key_find("model.init.head_dim"))) {
    s->head_dim = s->qk_nope_dim + s->qk_rope_dim; /* the q/k head */
  } else if (!seen_given(w, mf_config_key_find("model.init.head_dim"))) {
    if (s->hidden % s->heads != 0)
      return CROSS_ERR(w, "model.init.hidden", "model.init.heads",
                       "model.init: hidden (%lld) is not a multiple of heads (%lld): give head_dim",
                       (long long)s->hidden, (long long)s->heads);
    s->head_dim = s->hidden / s->heads;
  }
  /* the relations a user most often gets wrong; mf_model_spec_validate checks the rest */
  if (s->top_k > s->experts)
    return CROSS_ERR(w, "model.init.top_k", "model.init.experts",
                     "model.init.top_k (%lld) exceeds model.init.experts (%lld)", (long long)s->top_k,
                     (long long)s->experts);
  if (s->heads % s->kv_heads != 0)
    return CROSS_ERR(w, "model.init.kv_heads", "model.init.heads",
                     "model.init.heads (%lld) must be a multiple of model.init.kv_heads (%lld)",
                     (long long)s->heads, (long long)s->kv_heads);
  for (int64_t i = 0; i < s->n_mlp_only; i++)
    if (s->mlp_only_layers[i] >= s->layers)
      return CROSS_ERR(w, "model.init.mlp_only_layers", "model.init.layers",
                       "model.init.mlp_only_layers[%lld] = %d is not a layer (the model has %lld)",
                       (long long)i, s->mlp_only_layers[i], (long long)s->layers);
  /* keys only Qwen's decoder reads: given for another family they would be
   * ignored in silence (every layer of Mixtral and OLMoE is MoE) */
  const int qwen = s->family == MF_FAMILY_QWEN2_MOE || s->family == MF_FAMILY_QWEN3_MOE;
  if (!qwen && s->n_mlp_only > 0)
    return CROSS_ERR(w, "model.init.mlp_only_layers", "model.init.family",
                     "model.init.mlp_only_layers is a qwen2_moe / qwen3_moe key: every layer of %s is MoE",
                     mf_family_name(s->family));
  if (!qwen && s->decoder_sparse_step != 1)
    return CROSS_ERR(
        w, "model.init.decoder_sparse_step", "model.init.family",
        "model.init.decoder_sparse_step is a qwen2_moe / qwen3_moe key: every layer of %s is MoE",
        mf_family_name(s->family));
  /* keys only GLM-4.5's and DeepSeek-V3's decoders read, at their neutral values elsewhere */
  const int glm = s->family == MF_FAMILY_GLM4_MOE, ds = s->family == MF_FAMILY_DEEPSEEK_V3,
            oss = s->family == MF_FAMILY_GPT_OSS;
  const struct {
    const char *key, *readers;
    int read, neutral;
  } only[] = {
      {"model.init.partial_rotary", "glm4_moe", glm, s->partial_rotary == 1.0},
      {"model.init.q_lora_rank", "deepseek_v3", ds, s->q_lora_rank == 0},
      {"model.init.kv_lora_rank", "deepseek_v3", ds, s->kv_lora_rank == 0},
      {"model.init.qk_nope_dim", "deepseek_v3", ds, s->qk_nope_dim == 0},
      {"model.init.qk_rope_dim", "deepseek_v3", ds, s->qk_rope_dim == 0},
      {"model.init.v_head_dim", "deepseek_v3", ds, s->v_head_dim == 0},
      {"model.init.rope_interleave", "deepseek_v3", ds, !s->rope_interleave},
      {"model.init.first_dense", "glm4_moe / deepseek_v3", glm || ds, s->first_dense == 0},
      {"model.init.n_group", "glm4_moe / deepseek_v3", glm || ds, s->n_group == 1},
      {"model.init.topk_group", "glm4_moe / deepseek_v3", glm || ds, s->topk_group == 1},
      {"model.init.routed_scaling", "glm4_moe / deepseek_v3", glm || ds, s->routed_scaling == 1.0},
      {"model.init.sliding_window", "gpt_oss", oss, s->sliding_window == 0},
  };
  for (size_t i = 0; i < sizeof only / sizeof only[0]; i++)
    if (!only[i].read && !only[i].neutral)
      return CROSS_ERR(w, only[i].key, "model.init.family", "%s is a %s key: %s does not read it",
                       only[i].key, only[i].readers, mf_family_name(s->family));
  if (oss) { /* GptOssConfig's layer_types: the even layers slide; attention_bias sets the o bias too */
    for (int64_t l = 0; l < s->layers && l < MF_MAX_LAYERS; l++) s->sliding_layers[l] = l % 2 == 0;
    s->o_bias = s->qkv_bias;
  }
  /* the rest, blamed on the last override under model.init when there is one */
  const mf_ynode *at = mf_ynode_place(in), *ov = last_override_under(w, "model.init.");
  char where[1100];
  if (override_no(ov) > override_no(at))
    snprintf(where, sizeof where, "%s: model.init (%s)", mf_ynode_loc(ov, oloc, sizeof oloc),
             mf_ynode_origin(in, loc, sizeof loc));
  else
    snprintf(where, sizeof where, "%s: model.init", mf_ynode_loc(at, loc, sizeof loc));
  MF_CHECK(mf_model_spec_validate(s, where));
  /* eval may run another model (--model DIR, OUTPUT/final): it checks the one it loads */
  if (w->use != MF_CONFIG_FOR_EVAL && c->data.seq_len > s->max_seq)
    return CROSS_ERR(w, "data.seq_len", "model.init.max_seq",
                     "data.seq_len (%lld) exceeds model.init.max_seq (%lld)", (long long)c->data.seq_len,
                     (long long)s->max_seq);
  if (isnan(c->train.aux_loss_coef)) c->train.aux_loss_coef = s->router_aux_loss_coef;
  return MF_OK;
}

static mf_status finish(walk *w, const char *name) {
  mf_config *c = w->cfg;
  char loc[512];
  /* model: exactly one of path and init */
  const int ip = mf_config_key_find("model.path"), ii = mf_config_key_find("model.init");
  const mf_ynode *pn = seen_given(w, ip) ? w->seen[ip] : NULL, *in = seen_given(w, ii) ? w->seen[ii] : NULL;
  if (pn && in) {
    /* blamed on the later override, else the later line */
    const mf_ynode *bad = in, *other = pn;
    if (override_no(pn) || override_no(in) ? override_no(pn) > override_no(in) : pn->line > in->line)
      bad = pn, other = in;
    return NODE_ERR(mf_ynode_place(bad),
                    "give exactly one of 'model.path' and 'model.init' (the other is at %s); "
                    "override the other with null to switch",
                    mf_ynode_loc(mf_ynode_place(other), loc, sizeof loc));
  }
  if (!pn && !in)
    return NODE_ERR(blame(w, "model"),
                    "missing required key 'model.path' or 'model.init': the model is a checkpoint directory "
                    "(model.path) or a shape to initialise (model.init)");
  if (!in) {
    c->model.has_init = 0;
    memset(&c->model.init, 0, sizeof c->model.init);
  }
  /* required keys (model.init.family is checked by walk_init) */
  for (size_t i = 0; i < mf_config_n_keys; i++) {
    const mf_config_key *k = &mf_config_keys[i];
    if (!(k->flags & MF_CK_REQUIRED) || k->kind == MF_CK_SECTION || k->kind == MF_CK_FAMILY) continue;
    if (!required_for(k->path, w->use)) continue;
    if (!w->seen[i]) return NODE_ERR(blame(w, k->path), "missing required key '%s' (%s)", k->path, k->help);
  }
  if (c->model.has_init) MF_CHECK(finish_init(w, in));
  /* Without train.steps (plan, eval) there is no schedule to check warmup against. */
  if (seen_given(w, mf_config_key_find("train.steps")) && c->train.warmup > c->train.steps)
    return CROSS_ERR(w, "train.warmup", "train.steps", "train.warmup (%lld) must be <= train.steps (%lld)",
                     (long long)c->train.warmup, (long long)c->train.steps);
  if (c->train.min_lr > c->train.lr)
    return CROSS_ERR(w, "train.min_lr", "train.lr", "train.min_lr (%g) must be <= train.lr (%g)",
                     c->train.min_lr, c->train.lr);
  MF_CHECK(check_lora(w));
  c->memory.adam_moments = c->train.adam_moments;
  const mf_config_memory *m = &c->memory;
  if (m->pinned_limit != MF_CONFIG_SIZE_AUTO && m->host_limit != MF_CONFIG_SIZE_AUTO &&
      m->pinned_limit > m->host_limit) {
    char a[32], b[32];
    return CROSS_ERR(w, "memory.pinned_limit", "memory.host_limit",
                     "memory.pinned_limit (%s) must be <= memory.host_limit (%s)",
                     mf_format_bytes(m->pinned_limit, a, sizeof a),
                     mf_format_bytes(m->host_limit, b, sizeof b));
  }
  if (!c->output.dir && !(c->output.dir = default_output_dir(name)))
    return MF_ERR(MF_ERR_OUT_OF_MEMORY, "out of memory");
  return MF_OK;
}

/* Keeps where each given value came from (mf_config_where). */
static mf_status keep_places(walk *w) {
  char loc[512];
  MF_CHECK(mf_calloc(mf_config_n_keys, sizeof *w->cfg->where, "config places", (void **)&w->cfg->where));
  for (size_t i = 0; i < mf_config_n_keys; i++) {
    if (!w->seen[i]) continue;
    if (!(w->cfg->where[i] = mf_strdup(mf_ynode_loc(mf_ynode_place(w->seen[i]), loc, sizeof loc))))
      return MF_ERR(MF_ERR_OUT_OF_MEMORY, "out of memory");
  }
  return MF_OK;
}

const char *mf_config_where(const mf_config *cfg, const char *path) {
  const int idx = cfg && cfg->where && path ? mf_config_key_find(path) : -1;
  return idx >= 0 ? cfg->where[idx] : NULL;
}

/* ----------------------------------------------------------- overrides */

/* Puts `val` at `path` in the tree, making the maps on the way; takes val. */
static mf_status splice(mf_ynode *root, const mf_ysrc *src, const char *path, mf_ynode *val) {
  char part[256];
  mf_ynode *cur = root;
  const char *p = path;
  for (;;) {
    const char *dot = strchr(p, '.');
    size_t len = dot ? (size_t)(dot - p) : strlen(p);
    memcpy(part, p, len);
    part[len] = 0;
    size_t i = 0;
    mf_ynode *child = mf_ynode_get(cur, part, &i);
    mf_ynode *put = dot ? NULL : val;
    if (!put && (!child || mf_ynode_is_null(child))) {
      mf_status st = mf_ynode_new(MF_YMAP, src, &put);
      if (st != MF_OK) {
        mf_ynode_free(val);
        return st;
      }
    }
    if (put && child) { /* replace the value in place, keeping the file's key */
      mf_ynode_free(child);
      cur->vals[i] = put;
      put->parent = cur, put->key = cur->keys[i], put->index = i;
      child = put;
    } else if (put) {
      mf_ynode *key = NULL;
      mf_status st = mf_ynode_new(MF_YSCALAR, src, &key);
      if (st == MF_OK) {
        key->text = mf_strdup(part);
        key->len = len;
        if (!key->text) st = MF_ERR(MF_ERR_OUT_OF_MEMORY, "out of memory");
      }
      if (st == MF_OK) st = mf_ynode_append(cur, key, put);
      if (st != MF_OK) {
        mf_ynode_free(key);
        if (put != val) mf_ynode_free(put);
        mf_ynode_free(val);
        return st;
      }
      child = put;
    }
    if (!dot) return MF_OK;
    if (child->kind != MF_YMAP) {
      char loc[512], got[128];
      mf_status st =
          MF_ERR(MF_ERR_CONFIG, "command line: %s: cannot set '%s': '%s' at %s is %s, not a map", src->name,
                 path, part, mf_ynode_loc(child, loc, sizeof loc), mf_ynode_describe(child, got, sizeof got));
      mf_ynode_free(val);
      return st;
    }
    cur = child;
    p = dot + 1;
  }
}

/* Applies override number `no` (1-based, for messages). */
static mf_status apply_override(mf_ydoc *doc, const char *ov, int no) {
  const char *eq = strchr(ov, '=');
  if (!eq || eq == ov)
    return MF_ERR(MF_ERR_CONFIG, "command line: '%s': an override is key.path=value (e.g. train.lr=1e-4)",
                  ov);
  char key[256], hint[1024];
  size_t klen = (size_t)(eq - ov);
  if (klen >= sizeof key) return MF_ERR(MF_ERR_CONFIG, "command line: %s: key too long", ov);
  memcpy(key, ov, klen);
  key[klen] = 0;
  if (mf_config_key_find(key) < 0) {
    mf_config_key_suggest(key, NULL, 0, hint, sizeof hint);
    return MF_ERR(MF_ERR_CONFIG, "command line: %s: unknown key '%s'%s", ov, key, hint);
  }
  mf_ynode *val = NULL;
  MF_CHECK(mf_yaml_parse(doc, eq + 1, strlen(eq + 1), ov, no, &val));
  const mf_ysrc *src = doc->srcs; /* the one just added */
  if (!val) {                     /* `key=` is null, as in a file */
    MF_CHECK(mf_ynode_new(MF_YSCALAR, src, &val));
    val->text = mf_strdup("");
    if (!val->text) {
      mf_ynode_free(val);
      return MF_ERR(MF_ERR_OUT_OF_MEMORY, "out of memory");
    }
  }
  return splice(doc->root, src, key, val);
}

/* --------------------------------------------------------------- API */

static mf_status load_string(const char *text, size_t len, const char *name, const char *const *overrides,
                             size_t n_overrides, mf_config_use use, mf_config **out) {
  if (!out) return MF_ERR(MF_ERR_INVALID_ARG, "mf_config_load_string: out is NULL");
  *out = NULL;
  if (!text && len) return MF_ERR(MF_ERR_INVALID_ARG, "mf_config_load_string: text is NULL");
  if (n_overrides && !overrides)
    return MF_ERR(MF_ERR_INVALID_ARG, "mf_config_load_string: overrides is NULL");
  if (mf_config_n_keys > MAX_KEYS)
    return MF_ERR(MF_ERR_INTERNAL, "config key table larger than %d", MAX_KEYS);
  if (!name) name = "config";
  mf_ydoc doc;
  memset(&doc, 0, sizeof doc);
  mf_config *cfg = NULL;
  walk *w = NULL;
  char got[128];
  mf_status st;
  MF_CHECK_GOTO(mf_yaml_parse(&doc, text ? text : "", len, name, 0, &doc.root), st, done);
  if (mf_ynode_is_null(doc.root)) {
    st = MF_ERR(MF_ERR_CONFIG,
                "%s:1:1: the config is empty: it needs at least model, data.train and train.steps", name);
    goto done;
  }
  if (doc.root->kind != MF_YMAP) {
    st = NODE_ERR(
        doc.root,
        "a config is a map of sections (model, data, train, memory, hardware, output, backend), not %s",
        mf_ynode_describe(doc.root, got, sizeof got));
    goto done;
  }
  for (size_t i = 0; i < n_overrides; i++) {
    if (!overrides[i]) {
      st = MF_ERR(MF_ERR_INVALID_ARG, "mf_config_load: override %zu is NULL", i);
      goto done;
    }
    MF_CHECK_GOTO(apply_override(&doc, overrides[i], (int)i + 1), st, done);
  }
  MF_CHECK_GOTO(mf_calloc(1, sizeof *cfg, "config", (void **)&cfg), st, done);
  MF_CHECK_GOTO(mf_calloc(1, sizeof *w, "config walk", (void **)&w), st, done);
  w->cfg = cfg;
  w->use = use;
  w->root = doc.root;
  MF_CHECK_GOTO(apply_defaults(w), st, done);
  MF_CHECK_GOTO(walk_map(w, doc.root, ""), st, done);
  MF_CHECK_GOTO(finish(w, name), st, done);
  MF_CHECK_GOTO(keep_places(w), st, done);
  if (!(cfg->source = mf_strdup(name))) {
    st = MF_ERR(MF_ERR_OUT_OF_MEMORY, "out of memory");
    goto done;
  }
  *out = cfg;
  cfg = NULL;
done:
  mf_config_free(cfg);
  free(w);
  mf_ydoc_free(&doc);
  return st;
}

mf_status mf_config_load_string(const char *text, size_t len, const char *name, const char *const *overrides,
                                size_t n_overrides, mf_config **out) {
  return load_string(text, len, name, overrides, n_overrides, MF_CONFIG_FOR_TRAIN, out);
}

mf_status mf_config_load_string_for(const char *text, size_t len, const char *name,
                                    const char *const *overrides, size_t n_overrides, mf_config_use use,
                                    mf_config **out) {
  return load_string(text, len, name, overrides, n_overrides, use, out);
}

mf_status mf_config_load(const char *path, const char *const *overrides, size_t n_overrides,
                         mf_config **out) {
  return mf_config_load_for(path, overrides, n_overrides, MF_CONFIG_FOR_TRAIN, out);
}

mf_status mf_config_load_for(const char *path, const char *const *overrides, size_t n_overrides,
                             mf_config_use use, mf_config **out) {
  if (!out) return MF_ERR(MF_ERR_INVALID_ARG, "mf_config_load: out is NULL");
  *out = NULL;
  if (!path) return MF_ERR(MF_ERR_INVALID_ARG, "mf_config_load: path is NULL");
  int fd, e;
  mf_status opened = mf_open_regular(path, "a config", &fd, NULL, &e);
  if (opened != MF_OK)
    return e ? MF_ERR(MF_ERR_IO, "%s: cannot open the config: %s", path, strerror(e)) : opened;
  FILE *f = fdopen(fd, "rb");
  if (!f) {
    e = errno;
    close(fd);
    return MF_ERR(MF_ERR_IO, "%s: cannot open the config: fdopen: %s", path, strerror(e));
  }
  char *buf = NULL;
  size_t len = 0, cap = 0;
  mf_status st = MF_OK;
  for (;;) {
    if (len == cap) {
      if (cap > MF_YAML_MAX_BYTES) {
        st = MF_ERR(MF_ERR_CONFIG, "%s: more than %zu bytes: too large for a config (is it the right file?)",
                    path, MF_YAML_MAX_BYTES);
        break;
      }
      cap = cap ? 2 * cap : 4096;
      char *nb = realloc(buf, cap);
      if (!nb) {
        st = MF_ERR(MF_ERR_OUT_OF_MEMORY, "%s: out of memory reading the config", path);
        break;
      }
      buf = nb;
    }
    size_t got = fread(buf + len, 1, cap - len, f);
    len += got;
    if (got == 0) {
      if (ferror(f)) st = MF_ERR(MF_ERR_IO, "%s: cannot read the config: %s", path, strerror(errno));
      break;
    }
  }
  fclose(f);
  if (st == MF_OK) st = load_string(buf, len, path, overrides, n_overrides, use, out);
  free(buf);
  return st;
}

void mf_config_free(mf_config *cfg) {
  if (!cfg) return;
  for (size_t i = 0; i < mf_config_n_keys; i++)
    if (mf_config_keys[i].kind == MF_CK_STR) free(*(char **)field(cfg, &mf_config_keys[i]));
  free_mem_overrides(&cfg->memory);
  for (size_t i = 0; cfg->where && i < mf_config_n_keys; i++) free(cfg->where[i]);
  free(cfg->where);
  free(cfg->source);
  free(cfg);
}

static int str_eq(const char *a, const char *b) {
  return (!a && !b) || (a && b && strcmp(a, b) == 0);
}

/* Key k has the same value in a and b. */
static int key_equal(const mf_config *a, const mf_config *b, const mf_config_key *k) {
  const void *x = cfield(a, k), *y = cfield(b, k);
  switch (k->kind) {
    case MF_CK_SECTION:
      return 1;
    case MF_CK_INT:
      return *(const int64_t *)x == *(const int64_t *)y;
    case MF_CK_U64:
    case MF_CK_SIZE:
      return *(const uint64_t *)x == *(const uint64_t *)y;
    case MF_CK_FLOAT: {
      double p = *(const double *)x, q = *(const double *)y;
      return p == q || (isnan(p) && isnan(q));
    }
    case MF_CK_BOOL:
    case MF_CK_ENUM:
    case MF_CK_FAMILY:
      return memcmp(x, y, sizeof(int)) == 0;
    case MF_CK_STR:
      return str_eq(*(char *const *)x, *(char *const *)y);
    case MF_CK_NAMELIST: {
      const mf_config_lora *s = &a->train.lora, *t = &b->train.lora;
      if (s->n_targets != t->n_targets) return 0;
      for (int64_t j = 0; j < s->n_targets; j++)
        if (strcmp(s->targets[j], t->targets[j]) != 0) return 0;
      return 1;
    }
    case MF_CK_INTLIST: {
      const mf_model_spec *s = &a->model.init, *t = &b->model.init;
      if (s->n_mlp_only != t->n_mlp_only) return 0;
      for (int64_t j = 0; j < s->n_mlp_only; j++)
        if (s->mlp_only_layers[j] != t->mlp_only_layers[j]) return 0;
      return 1;
    }
    case MF_CK_OVERRIDES: {
      const mf_config_memory *m = &a->memory, *n = &b->memory;
      if (m->n_overrides != n->n_overrides) return 0;
      for (size_t j = 0; j < m->n_overrides; j++) {
        const mf_config_mem_override *o = &m->overrides[j], *p = &n->overrides[j];
        if (!str_eq(o->match, p->match) || !str_eq(o->params, p->params) ||
            !str_eq(o->activations, p->activations) || !str_eq(o->grads, p->grads) ||
            !str_eq(o->optimizer, p->optimizer))
          return 0;
      }
      return 1;
    }
  }
  return 1;
}

int mf_config_equal(const mf_config *a, const mf_config *b) {
  if (!a || !b) return a == b;
  if (a->model.has_init != b->model.has_init) return 0;
  for (size_t i = 0; i < mf_config_n_keys; i++) {
    const mf_config_key *k = &mf_config_keys[i];
    if (!a->model.has_init && strncmp(k->path, "model.init.", 11) == 0) continue;
    if (!key_equal(a, b, k)) return 0;
  }
  return !a->model.has_init || a->model.init.qk_norm == b->model.init.qk_norm;
}

size_t mf_config_diff(const mf_config *a, const mf_config *b, const char **paths, size_t cap) {
  size_t n = 0;
  const int init = a->model.has_init && b->model.has_init;
  if (a->model.has_init != b->model.has_init) {
    if (n < cap) paths[n] = "model.init";
    n++;
  }
  for (size_t i = 0; i < mf_config_n_keys; i++) {
    const mf_config_key *k = &mf_config_keys[i];
    if (!init && strncmp(k->path, "model.init.", 11) == 0) continue;
    if (key_equal(a, b, k)) continue;
    if (n < cap) paths[n] = k->path;
    n++;
  }
  return n;
}

const char *mf_config_schedule_name(mf_config_schedule s) {
  static const char *const n[] = {"constant", "linear", "cosine"};
  return (unsigned)s < 3 ? n[s] : "invalid";
}

const char *mf_config_backend_name(mf_config_backend b) {
  static const char *const n[] = {"auto", "cpu", "cuda"};
  return (unsigned)b < 3 ? n[b] : "invalid";
}

const char *mf_config_mb_order_name(mf_config_mb_order o) {
  static const char *const n[] = {"auto", "layer", "micro"};
  return (unsigned)o < 3 ? n[o] : "invalid";
}

const char *mf_config_moments_name(mf_config_moments m) {
  static const char *const n[] = {"fp32", "bf16"};
  return (unsigned)m < 2 ? n[m] : "invalid";
}
