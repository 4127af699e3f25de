/*
 * Hardware profiles: YAML <-> mf_hwprofile, checked key by key, and the cost
 * model's pieces (this file: reading and validation; hwprofile_write.c:
 * writing; hwprofile_cost.c: the cost model).
 *
 * Reading uses libyaml's document API and walks the tree by the schema in
 * hwprofile.h, so only expected nodes are visited (a profile is a handful of
 * maps and two short lists: no recursion, no alias blow-up). Every fault names
 * FILE:LINE:COLUMN of the node at fault (the enclosing map's for a missing key)
 * and the key path. Writing picks, for each number, the shortest text that the
 * loader reads back as the same double, so save -> load is exact.
 */
#include "planner/hwprofile.h"
#include "planner/hwprofile_internal.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <yaml.h>

#include "src/config/config.h"

/* A profile is a page of text; anything much bigger is not one. */
#define HW_MAX_BYTES ((size_t)1 << 20)
/* Relative slack in the GEMM-time order check: a table built as
 * flops = work / time reproduces `time` only to rounding. */
#define HW_TIME_SLACK 1e-9

/* ------------------------------------------------------------ messages */

typedef struct ld {
  yaml_document_t *doc;
  const char *name;
} ld;

static void quote(const char *s, size_t len, char *buf, size_t cap) {
  size_t o = 0;
  if (cap < 16) {
    if (cap) buf[0] = 0;
    return;
  }
  buf[o++] = '\'';
  for (size_t i = 0; i < len && i < 60 && o + 6 < cap; i++) {
    unsigned char ch = (unsigned char)s[i];
    if ((ch >= 0x20 && ch < 0x7f && ch != '\\') || ch >= 0x80)
      buf[o++] = (char)ch;
    else
      o += (size_t)snprintf(buf + o, cap - o, "\\x%02x", ch);
  }
  if (len > 60 && o + 5 < cap) {
    memcpy(buf + o, "...", 3);
    o += 3;
  }
  buf[o++] = '\'';
  buf[o] = 0;
}

static const char *describe(const yaml_node_t *n, char *buf, size_t cap) {
  if (n->type == YAML_MAPPING_NODE)
    snprintf(buf, cap, "a map");
  else if (n->type == YAML_SEQUENCE_NODE)
    snprintf(buf, cap, "a list");
  else
    quote((const char *)n->data.scalar.value, n->data.scalar.length, buf, cap);
  return buf;
}

static mf_status fail_at(const ld *c, const yaml_node_t *n, const char *path, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static mf_status fail_at(const ld *c, const yaml_node_t *n, const char *path, const char *fmt, ...) {
  char msg[768];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  int line = n ? (int)n->start_mark.line + 1 : 1, col = n ? (int)n->start_mark.column + 1 : 1;
  return MF_ERR(MF_ERR_CONFIG, "%s:%d:%d: %s%s%s", c->name, line, col, path, *path ? ": " : "", msg);
}

static void offset_to_linecol(const char *text, size_t off, int *line, int *col) {
  int l = 1, k = 1;
  for (size_t i = 0; i < off; i++) {
    if (text[i] == '\n')
      l++, k = 1;
    else if (((unsigned char)text[i] & 0xc0) != 0x80)
      k++;
  }
  *line = l, *col = k;
}

static mf_status syntax_error(const yaml_parser_t *p, const char *name, const char *text, size_t len) {
  if (p->error == YAML_MEMORY_ERROR)
    return MF_ERR(MF_ERR_OUT_OF_MEMORY, "%s: out of memory parsing YAML", name);
  int line, col;
  char what[160] = "";
  if (p->error == YAML_READER_ERROR) {
    offset_to_linecol(text, p->problem_offset < len ? p->problem_offset : len, &line, &col);
    if (p->problem_value != -1) snprintf(what, sizeof what, " (byte or character 0x%x)", p->problem_value);
  } else {
    line = (int)p->problem_mark.line + 1;
    col = (int)p->problem_mark.column + 1;
    const char *tab = mf_yaml_tab_problem(text, len, p->problem_mark.line, p->problem_mark.column);
    if (tab) return MF_ERR(MF_ERR_CONFIG, "%s:%d:%d: YAML syntax error: %s", name, line, col, tab);
    if (p->context)
      snprintf(what, sizeof what, " (%s at line %d, column %d)", p->context, (int)p->context_mark.line + 1,
               (int)p->context_mark.column + 1);
  }
  return MF_ERR(MF_ERR_CONFIG, "%s:%d:%d: YAML syntax error: %s%s", name, line, col,
                p->problem ? p->problem : "malformed", what);
}

/* ------------------------------------------------------- node access */

static yaml_node_t *node_at(const ld *c, int id) {
  return yaml_document_get_node(c->doc, id);
}

static void join(char *out, size_t cap, const char *path, const char *key) {
  snprintf(out, cap, "%s%s%s", path, *path ? "." : "", key);
}

/* n must be a map whose keys are plain text among `keys`, each at most once. */
static mf_status check_map(const ld *c, const yaml_node_t *n, const char *path, const char *const *keys,
                           size_t n_keys, const char *what) {
  char d[96], known[256] = "";
  for (size_t i = 0; i < n_keys; i++) {
    size_t o = strlen(known);
    snprintf(known + o, sizeof known - o, "%s%s", i ? ", " : "", keys[i]);
  }
  if (n->type != YAML_MAPPING_NODE)
    return fail_at(c, n, path, "expected a map (%s) with keys %s, got %s", what, known,
                   describe(n, d, sizeof d));
  for (yaml_node_pair_t *pr = n->data.mapping.pairs.start; pr < n->data.mapping.pairs.top; pr++) {
    const yaml_node_t *k = node_at(c, pr->key);
    if (k->type != YAML_SCALAR_NODE)
      return fail_at(c, k, path, "a key must be plain text, got %s", describe(k, d, sizeof d));
    const char *kt = (const char *)k->data.scalar.value;
    char sub[256];
    join(sub, sizeof sub, path, kt);
    int ok = 0;
    for (size_t i = 0; i < n_keys && !ok; i++)
      ok = strcmp(kt, keys[i]) == 0 && strlen(kt) == k->data.scalar.length;
    if (!ok) {
      quote(kt, k->data.scalar.length, d, sizeof d);
      return fail_at(c, k, sub, "unknown key %s (keys in %s: %s)", d, *path ? path : "a profile", known);
    }
    for (yaml_node_pair_t *q = n->data.mapping.pairs.start; q < pr; q++)
      if (strcmp((const char *)node_at(c, q->key)->data.scalar.value, kt) == 0)
        return fail_at(c, k, sub, "duplicate key");
  }
  return MF_OK;
}

static yaml_node_t *get(const ld *c, const yaml_node_t *map, const char *key) {
  for (yaml_node_pair_t *pr = map->data.mapping.pairs.start; pr < map->data.mapping.pairs.top; pr++)
    if (strcmp((const char *)node_at(c, pr->key)->data.scalar.value, key) == 0) return node_at(c, pr->value);
  return NULL;
}

/* The key whose value is `n` (a section's name, where a missing key is
 * reported), or n itself for the root and list items. */
static const yaml_node_t *key_of(const ld *c, const yaml_node_t *n) {
  for (yaml_node_t *m = c->doc->nodes.start; m < c->doc->nodes.top; m++) {
    if (m->type != YAML_MAPPING_NODE) continue;
    for (yaml_node_pair_t *pr = m->data.mapping.pairs.start; pr < m->data.mapping.pairs.top; pr++)
      if (node_at(c, pr->value) == n) return node_at(c, pr->key);
  }
  return n;
}

static mf_status need(const ld *c, const yaml_node_t *map, const char *path, const char *key,
                      const char *what, yaml_node_t **out) {
  *out = get(c, map, key);
  if (*out) return MF_OK;
  char sub[256];
  join(sub, sizeof sub, path, key);
  return fail_at(c, key_of(c, map), sub, "missing (required: %s)", what);
}

static int plain_scalar(const yaml_node_t *n) {
  return n->type == YAML_SCALAR_NODE && n->data.scalar.style == YAML_PLAIN_SCALAR_STYLE;
}

/* Length of the decimal number at the start of s ([sign] digits [. digits]
 * [e [sign] digits], at least one mantissa digit), or 0. *mant gets the
 * mantissa's length. No hex, inf, nan or digit separators. */
static size_t decimal_len(const char *s, size_t *mant) {
  size_t i = 0, digits = 0;
  if (s[i] == '+' || s[i] == '-') i++;
  for (; s[i] >= '0' && s[i] <= '9'; i++) digits++;
  if (s[i] == '.')
    for (i++; s[i] >= '0' && s[i] <= '9'; i++) digits++;
  if (!digits) return 0;
  *mant = i;
  if (s[i] == 'e' || s[i] == 'E') {
    size_t j = i + 1, ed = 0;
    if (s[j] == '+' || s[j] == '-') j++;
    for (; s[j] >= '0' && s[j] <= '9'; j++) ed++;
    if (ed) i = j;
  }
  return i;
}

/* The number in s[0, len) times 10^shift, rounded once (the shift is done on the
 * decimal exponent, so "12.5" with shift -6 reads exactly as "12.5e-6").
 * -1 unless all of it is one decimal number with a finite result. */
static int parse_scaled(const char *s, size_t len, int shift, double *out) {
  size_t mant = 0;
  if (len == 0 || len > 300 || decimal_len(s, &mant) != len) return -1;
  long exp = 0;
  if (mant < len) {
    char e[320];
    memcpy(e, s + mant + 1, len - mant - 1);
    e[len - mant - 1] = 0;
    errno = 0;
    exp = strtol(e, NULL, 10);
    if (errno == ERANGE || exp > 100000 || exp < -100000) exp = exp > 0 ? 100000 : -100000;
  }
  char buf[340];
  snprintf(buf, sizeof buf, "%.*se%ld", (int)mant, s, exp + shift);
  double v = strtod(buf, NULL);
  if (!isfinite(v)) return -1;
  *out = v;
  return 0;
}

/* A number of bytes (per second): a decimal number with an optional unit, as
 * mf_parse_size spells them, but exact for decimal units ("2.3GB" is 2.3e9
 * rounded once) and fractions allowed. */
static int parse_bytes(const char *s, double *out) {
  static const struct {
    const char *unit;
    int dec; /* power of ten, or -1 */
    int bin; /* power of two */
  } units[] = {{"KiB", -1, 10}, {"MiB", -1, 20}, {"GiB", -1, 30}, {"TiB", -1, 40},
               {"KB", 3, 0},    {"MB", 6, 0},    {"GB", 9, 0},    {"TB", 12, 0},
               {"kB", 3, 0},    {"K", -1, 10},   {"k", -1, 10},   {"M", -1, 20},
               {"G", -1, 30},   {"T", -1, 40},   {"B", 0, 0},     {"", 0, 0}};
  size_t len = strlen(s);
  for (size_t u = 0; u < sizeof units / sizeof *units; u++) {
    size_t ul = strlen(units[u].unit);
    if (ul > len || strcmp(s + len - ul, units[u].unit) != 0) continue;
    size_t nl = len - ul;
    while (nl > 0 && s[nl - 1] == ' ') nl--;
    double v;
    if (parse_scaled(s, nl, units[u].dec > 0 ? units[u].dec : 0, &v) != 0) return -1;
    if (units[u].dec < 0) v = ldexp(v, units[u].bin);
    if (!isfinite(v)) return -1;
    *out = v;
    return 0;
  }
  return -1;
}

/* A plain number, times 10^shift (latency_us -> seconds: -6). */
static mf_status read_number(const ld *c, const yaml_node_t *n, const char *path, int positive, int shift,
                             const char *what, double *out) {
  char d[96];
  double v;
  if (!plain_scalar(n) ||
      parse_scaled((const char *)n->data.scalar.value, n->data.scalar.length, shift, &v) != 0)
    return fail_at(c, n, path, "expected a number (%s), got %s", what, describe(n, d, sizeof d));
  if (positive ? !(v > 0) : !(v >= 0))
    return fail_at(c, n, path, "must be %s (%s), got %s", positive ? "> 0" : ">= 0", what,
                   describe(n, d, sizeof d));
  *out = v;
  return MF_OK;
}

/* mf_parse_size, but all-digit text exactly (beyond 2^53 too). */
static int parse_size(const char *s, uint64_t *out) {
  if (*s && strspn(s, "0123456789") == strlen(s)) {
    errno = 0;
    unsigned long long v = strtoull(s, NULL, 10);
    if (errno == ERANGE) return -1;
    *out = v;
    return 0;
  }
  return mf_parse_size(s, out);
}

static mf_status read_size(const ld *c, const yaml_node_t *n, const char *path, int positive,
                           const char *what, uint64_t *out) {
  char d[96];
  uint64_t v;
  const char *s = n->type == YAML_SCALAR_NODE ? (const char *)n->data.scalar.value : "";
  if (plain_scalar(n) && s[0] == '-')
    return fail_at(c, n, path, "must be %s (%s), got %s", positive ? "> 0" : ">= 0", what,
                   describe(n, d, sizeof d));
  if (!plain_scalar(n) || parse_size(s, &v) != 0)
    return fail_at(
        c, n, path,
        "expected a size (%s) such as 80GiB or 512MiB (units B, KiB, MiB, GiB, TiB, KB, MB, GB, TB), got %s",
        what, describe(n, d, sizeof d));
  if (positive && v == 0)
    return fail_at(c, n, path, "must be > 0 (%s), got %s", what, describe(n, d, sizeof d));
  *out = v;
  return MF_OK;
}

static mf_status read_bandwidth(const ld *c, const yaml_node_t *n, const char *path, const char *what,
                                double *out) {
  char d[96];
  double v;
  const char *s = n->type == YAML_SCALAR_NODE ? (const char *)n->data.scalar.value : "";
  if (!plain_scalar(n) || parse_bytes(s, &v) != 0)
    return fail_at(
        c, n, path,
        "expected a bandwidth in bytes per second (%s) such as 25GB or 2.0TB (units B, KB, MB, GB, TB, "
        "KiB, MiB, GiB, TiB), got %s",
        what, describe(n, d, sizeof d));
  if (!(v > 0)) return fail_at(c, n, path, "must be > 0 (%s), got %s", what, describe(n, d, sizeof d));
  *out = v;
  return MF_OK;
}

static mf_status read_bool(const ld *c, const yaml_node_t *n, const char *path, const char *what, int *out) {
  static const char *const t[] = {"true", "True", "TRUE"}, *const f[] = {"false", "False", "FALSE"};
  if (plain_scalar(n)) {
    for (int i = 0; i < 3; i++) {
      if (strcmp((const char *)n->data.scalar.value, t[i]) == 0) return *out = 1, MF_OK;
      if (strcmp((const char *)n->data.scalar.value, f[i]) == 0) return *out = 0, MF_OK;
    }
  }
  char d[96];
  return fail_at(c, n, path, "expected true or false (%s), got %s", what, describe(n, d, sizeof d));
}

static mf_status read_string(const ld *c, const yaml_node_t *n, const char *path, char *buf, size_t cap) {
  char d[96];
  if (n->type != YAML_SCALAR_NODE)
    return fail_at(c, n, path, "expected text, got %s", describe(n, d, sizeof d));
  const char *s = (const char *)n->data.scalar.value;
  size_t len = n->data.scalar.length;
  if (plain_scalar(n) &&
      (strcmp(s, "null") == 0 || strcmp(s, "~") == 0 || strcmp(s, "Null") == 0 || strcmp(s, "NULL") == 0))
    return fail_at(c, n, path, "expected text, got null");
  if (len == 0) return fail_at(c, n, path, "must not be empty");
  if (strlen(s) != len) return fail_at(c, n, path, "must not contain a NUL character");
  if (len >= cap) return fail_at(c, n, path, "is %zu bytes long; at most %zu", len, cap - 1);
  memcpy(buf, s, len + 1);
  return MF_OK;
}

/* ------------------------------------------------------------ sections */

static mf_status read_link(const ld *c, const yaml_node_t *links, const char *key, double *bw, double *lat) {
  static const char *const keys[] = {"bandwidth", "latency_us"};
  char path[64], sub[96];
  yaml_node_t *n, *v;
  join(path, sizeof path, "links", key);
  MF_CHECK(need(c, links, "links", key, "{bandwidth: 25GB, latency_us: 10}", &n));
  MF_CHECK(check_map(c, n, path, keys, 2, "a copy link"));
  join(sub, sizeof sub, path, "bandwidth");
  MF_CHECK(need(c, n, path, "bandwidth", "bytes per second, e.g. 25GB", &v));
  MF_CHECK(read_bandwidth(c, v, sub, "bytes per second", bw));
  *lat = 0;
  if ((v = get(c, n, "latency_us"))) {
    join(sub, sizeof sub, path, "latency_us");
    MF_CHECK(read_number(c, v, sub, 0, -6, "microseconds per copy", lat));
  }
  return MF_OK;
}

/* A list of 1..MF_HW_MAX_POINTS maps with the numeric keys `keys`, all > 0. */
static mf_status read_table(const ld *c, const yaml_node_t *n, const char *path, const char *const *keys,
                            size_t n_keys, double (*vals)[4], int *count) {
  char d[96], sub[64], item_path[96];
  if (n->type != YAML_SEQUENCE_NODE)
    return fail_at(c, n, path, "expected a list of points, got %s", describe(n, d, sizeof d));
  ptrdiff_t np = n->data.sequence.items.top - n->data.sequence.items.start;
  if (np < 1) return fail_at(c, n, path, "needs at least one point");
  if (np > MF_HW_MAX_POINTS) return fail_at(c, n, path, "has %td points; at most %d", np, MF_HW_MAX_POINTS);
  for (ptrdiff_t i = 0; i < np; i++) {
    const yaml_node_t *it = node_at(c, n->data.sequence.items.start[i]);
    snprintf(sub, sizeof sub, "%s[%td]", path, i);
    MF_CHECK(check_map(c, it, sub, keys, n_keys, "a point"));
    for (size_t k = 0; k < n_keys; k++) {
      yaml_node_t *v;
      MF_CHECK(
          need(c, it, sub, keys[k], strcmp(keys[k], "flops") == 0 ? "achieved FLOP/s" : "a shape size", &v));
      join(item_path, sizeof item_path, sub, keys[k]);
      MF_CHECK(read_number(c, v, item_path, 1, 0, strcmp(keys[k], "flops") == 0 ? "FLOP/s" : "a shape size",
                           &vals[i][k]));
    }
  }
  *count = (int)np;
  return MF_OK;
}

/* Sizes trimmed of trailing zeros. */

/* Index j of a kernel point whose key repeats an earlier point i, or -1. */
static int kernel_dup(const mf_hwprofile *p, int *i_out) {
  for (int j = 0; j < p->n_kernels; j++)
    for (int i = 0; i < j; i++) {
      const mf_hw_kernel_point *b = &p->kernels[j];
      if (same_key(&p->kernels[i], b->kernel, b->sizes, b->n_sizes, b->bytes)) {
        *i_out = i;
        return j;
      }
    }
  return -1;
}

static int kernel_name_ok(const char *s) {
  if (!*s) return 0;
  for (; *s; s++)
    if (!((*s >= 'a' && *s <= 'z') || (*s >= '0' && *s <= '9') || *s == '_')) return 0;
  return 1;
}

/* compute.kernels: a list of {kernel, sizes, bytes, seconds}. */
static mf_status read_kernels(const ld *c, const yaml_node_t *n, mf_hwprofile *p) {
  static const char *const keys[] = {"kernel", "sizes", "bytes", "seconds"};
  char d[96], sub[64], item[96];
  if (n->type != YAML_SEQUENCE_NODE)
    return fail_at(c, n, "compute.kernels", "expected a list of timed kernels, got %s",
                   describe(n, d, sizeof d));
  ptrdiff_t np = n->data.sequence.items.top - n->data.sequence.items.start;
  if (np > MF_HW_MAX_KERNELS)
    return fail_at(c, n, "compute.kernels", "has %td points; at most %d", np, MF_HW_MAX_KERNELS);
  for (ptrdiff_t i = 0; i < np; i++) {
    const yaml_node_t *it = node_at(c, n->data.sequence.items.start[i]);
    mf_hw_kernel_point *k = &p->kernels[i];
    memset(k, 0, sizeof *k);
    snprintf(sub, sizeof sub, "compute.kernels[%td]", i);
    MF_CHECK(check_map(c, it, sub, keys, 4, "a timed kernel"));
    yaml_node_t *v;
    MF_CHECK(need(c, it, sub, "kernel", "a kernel name such as swiglu_fwd", &v));
    join(item, sizeof item, sub, "kernel");
    MF_CHECK(read_string(c, v, item, k->kernel, sizeof k->kernel));
    if (!kernel_name_ok(k->kernel))
      return fail_at(c, v, item, "expected a kernel name (a-z, 0-9, _), got %s", describe(v, d, sizeof d));
    MF_CHECK(need(c, it, sub, "sizes", "the call's sizes, e.g. [1024, 64, 64]", &v));
    join(item, sizeof item, sub, "sizes");
    if (v->type != YAML_SEQUENCE_NODE)
      return fail_at(c, v, item, "expected a list of sizes, got %s", describe(v, d, sizeof d));
    ptrdiff_t ns = v->data.sequence.items.top - v->data.sequence.items.start;
    if (ns > MF_HW_KERNEL_SIZES)
      return fail_at(c, v, item, "has %td sizes; at most %d", ns, MF_HW_KERNEL_SIZES);
    for (ptrdiff_t j = 0; j < ns; j++) {
      const yaml_node_t *e = node_at(c, v->data.sequence.items.start[j]);
      char ep[112];
      snprintf(ep, sizeof ep, "%s[%td]", item, j);
      double x;
      MF_CHECK(read_number(c, e, ep, 0, 0, "a size", &x));
      if (x != floor(x) || x > 9.0e15)
        return fail_at(c, e, ep, "expected a whole number, got %s", describe(e, d, sizeof d));
      k->sizes[j] = (int64_t)x;
    }
    k->n_sizes = trim_sizes(k->sizes, (int)ns);
    MF_CHECK(need(c, it, sub, "bytes", "operand bytes", &v));
    join(item, sizeof item, sub, "bytes");
    MF_CHECK(read_number(c, v, item, 0, 0, "operand bytes", &k->bytes));
    MF_CHECK(need(c, it, sub, "seconds", "the measured time", &v));
    join(item, sizeof item, sub, "seconds");
    MF_CHECK(read_number(c, v, item, 1, 0, "seconds", &k->seconds));
  }
  p->n_kernels = (int)np;
  int i, j = kernel_dup(p, &i);
  if (j >= 0) {
    snprintf(sub, sizeof sub, "compute.kernels[%d]", j);
    return fail_at(c, node_at(c, n->data.sequence.items.start[j]), sub,
                   "repeats the kernel, sizes and bytes of compute.kernels[%d]", i);
  }
  return MF_OK;
}

/* Index j of a GEMM point that takes less time than a point i with less work, or -1. */
static int gemm_order_fault(const mf_hwprofile *p, int *i_out) {
  for (int j = 0; j < p->n_gemm; j++) {
    double wj = gemm_work(&p->gemm[j]), tj = wj / p->gemm[j].flops;
    for (int i = 0; i < p->n_gemm; i++) {
      double wi = gemm_work(&p->gemm[i]), ti = wi / p->gemm[i].flops;
      if (wi < wj && tj < ti * (1 - HW_TIME_SLACK)) {
        *i_out = i;
        return j;
      }
    }
  }
  return -1;
}

static mf_status parse_doc(const ld *c, mf_hwprofile *p) {
  static const char *const top[] = {"name", "source", "device",  "links", "compute",
                                    "host", "nvme",   "network", "nvlink"};
  static const char *const dev_keys[] = {"memory", "reserve", "copies_overlap_compute"};
  static const char *const link_keys[] = {"h2d", "d2h"};
  static const char *const comp_keys[] = {"gemm", "attention", "elementwise_bandwidth", "launch_us",
                                          "kernels"};
  static const char *const host_keys[] = {"memory", "adamw_params_per_s", "memory_bandwidth"};
  static const char *const nvme_keys[] = {"bandwidth"};
  static const char *const net_keys[] = {"bandwidth"};
  static const char *const gemm_keys[] = {"m", "n", "k", "flops"};
  static const char *const attn_keys[] = {"s", "d", "flops"};
  yaml_node_t *root = yaml_document_get_root_node(c->doc), *sec, *v;
  if (!root) return fail_at(c, NULL, "", "empty file: expected a hardware profile (planner/hwprofile.h)");
  MF_CHECK(check_map(c, root, "", top, sizeof top / sizeof *top, "a hardware profile"));

  MF_CHECK(need(c, root, "", "name", "what the machine is", &v));
  MF_CHECK(read_string(c, v, "name", p->name, sizeof p->name));
  MF_CHECK(need(c, root, "", "source", "where the figures come from", &v));
  MF_CHECK(read_string(c, v, "source", p->source, sizeof p->source));

  MF_CHECK(need(c, root, "", "device", "memory, reserve, copies_overlap_compute", &sec));
  MF_CHECK(check_map(c, sec, "device", dev_keys, 3, "the device"));
  MF_CHECK(need(c, sec, "device", "memory", "usable device memory, e.g. 80GiB", &v));
  MF_CHECK(read_size(c, v, "device.memory", 1, "usable device memory", &p->device_memory));
  p->device_reserve = 0;
  if ((v = get(c, sec, "reserve"))) {
    MF_CHECK(read_size(c, v, "device.reserve", 0, "memory kept back", &p->device_reserve));
    if (p->device_reserve >= p->device_memory)
      return fail_at(c, v, "device.reserve", "must be less than device.memory (%llu bytes)",
                     (unsigned long long)p->device_memory);
  }
  MF_CHECK(need(c, sec, "device", "copies_overlap_compute", "true or false", &v));
  MF_CHECK(read_bool(c, v, "device.copies_overlap_compute", "whether copies run beside kernels",
                     &p->copies_overlap_compute));

  MF_CHECK(need(c, root, "", "links", "h2d and d2h", &sec));
  MF_CHECK(check_map(c, sec, "links", link_keys, 2, "the host<->device links"));
  MF_CHECK(read_link(c, sec, "h2d", &p->h2d_bandwidth, &p->h2d_latency_s));
  MF_CHECK(read_link(c, sec, "d2h", &p->d2h_bandwidth, &p->d2h_latency_s));

  MF_CHECK(need(c, root, "", "compute", "gemm, attention, elementwise_bandwidth", &sec));
  MF_CHECK(check_map(c, sec, "compute", comp_keys, 5, "compute rates"));
  MF_CHECK(need(c, sec, "compute", "gemm", "a list of {m, n, k, flops}", &v));
  double pts[MF_HW_MAX_POINTS][4];
  MF_CHECK(read_table(c, v, "compute.gemm", gemm_keys, 4, pts, &p->n_gemm));
  for (int k = 0; k < p->n_gemm; k++)
    p->gemm[k] = (mf_hw_gemm_point){.m = pts[k][0], .n = pts[k][1], .k = pts[k][2], .flops = pts[k][3]};
  int i, j = gemm_order_fault(p, &i);
  if (j >= 0) {
    const yaml_node_t *it = node_at(c, v->data.sequence.items.start[j]);
    char sub[64];
    snprintf(sub, sizeof sub, "compute.gemm[%d]", j);
    return fail_at(
        c, it, sub,
        "takes %.3g s (2mnk/flops) for %.3g FLOPs, less than compute.gemm[%d]'s %.3g s for %.3g FLOPs: "
        "a bigger GEMM cannot be faster",
        gemm_work(&p->gemm[j]) / p->gemm[j].flops, gemm_work(&p->gemm[j]), i,
        gemm_work(&p->gemm[i]) / p->gemm[i].flops, gemm_work(&p->gemm[i]));
  }
  MF_CHECK(need(c, sec, "compute", "attention", "a list of {s, d, flops}", &v));
  MF_CHECK(read_table(c, v, "compute.attention", attn_keys, 3, pts, &p->n_attn));
  for (int k = 0; k < p->n_attn; k++)
    p->attn[k] = (mf_hw_attn_point){.s = pts[k][0], .d = pts[k][1], .flops = pts[k][2]};
  MF_CHECK(need(c, sec, "compute", "elementwise_bandwidth", "bytes per second, e.g. 2.0TB", &v));
  MF_CHECK(
      read_bandwidth(c, v, "compute.elementwise_bandwidth", "bytes per second", &p->elementwise_bandwidth));
  p->launch_s = 0;
  if ((v = get(c, sec, "launch_us")))
    MF_CHECK(read_number(c, v, "compute.launch_us", 0, -6, "microseconds per kernel", &p->launch_s));
  p->n_kernels = 0;
  if ((v = get(c, sec, "kernels"))) MF_CHECK(read_kernels(c, v, p));

  MF_CHECK(need(c, root, "", "host", "memory, adamw_params_per_s, memory_bandwidth", &sec));
  MF_CHECK(check_map(c, sec, "host", host_keys, 3, "the host"));
  MF_CHECK(need(c, sec, "host", "memory", "host memory, e.g. 128GiB", &v));
  MF_CHECK(read_size(c, v, "host.memory", 1, "host memory", &p->host_memory));
  MF_CHECK(need(c, sec, "host", "adamw_params_per_s", "host AdamW updates per second", &v));
  MF_CHECK(read_number(c, v, "host.adamw_params_per_s", 1, 0, "parameters per second",
                       &p->host_adamw_params_per_s));
  MF_CHECK(need(c, sec, "host", "memory_bandwidth", "bytes per second, e.g. 40GB", &v));
  MF_CHECK(read_bandwidth(c, v, "host.memory_bandwidth", "bytes per second", &p->host_memory_bandwidth));

  p->nvme_bandwidth = 0;
  if ((sec = get(c, root, "nvme"))) {
    MF_CHECK(check_map(c, sec, "nvme", nvme_keys, 1, "the NVMe spill device"));
    MF_CHECK(need(c, sec, "nvme", "bandwidth", "bytes per second, e.g. 3GB", &v));
    MF_CHECK(read_bandwidth(c, v, "nvme.bandwidth", "bytes per second", &p->nvme_bandwidth));
  }
  p->network_bandwidth = 0;
  if ((sec = get(c, root, "network"))) {
    MF_CHECK(check_map(c, sec, "network", net_keys, 1, "the network between machines"));
    MF_CHECK(need(c, sec, "network", "bandwidth", "bytes per second each way, e.g. 25GB", &v));
    MF_CHECK(read_bandwidth(c, v, "network.bandwidth", "bytes per second", &p->network_bandwidth));
  }
  p->nvlink_bandwidth = 0;
  if ((sec = get(c, root, "nvlink"))) {
    MF_CHECK(check_map(c, sec, "nvlink", net_keys, 1, "the links between the GPUs of one machine"));
    MF_CHECK(need(c, sec, "nvlink", "bandwidth", "bytes per second each way a GPU, e.g. 450GB", &v));
    MF_CHECK(read_bandwidth(c, v, "nvlink.bandwidth", "bytes per second", &p->nvlink_bandwidth));
  }
  return MF_OK;
}

mf_status mf_hwprofile_parse(const char *text, size_t len, const char *name, mf_hwprofile *out) {
  if ((!text && len) || !out) return MF_ERR(MF_ERR_INVALID_ARG, "mf_hwprofile_parse: NULL argument");
  if (!name) name = "profile";
  if (len > HW_MAX_BYTES)
    return MF_ERR(MF_ERR_CONFIG, "%s:1:1: %zu bytes is too large for a hardware profile (at most %zu)", name,
                  len, HW_MAX_BYTES);
  yaml_parser_t parser;
  yaml_document_t doc;
  if (!yaml_parser_initialize(&parser)) return MF_ERR(MF_ERR_OUT_OF_MEMORY, "%s: cannot start libyaml", name);
  yaml_parser_set_input_string(&parser, (const unsigned char *)(text ? text : ""), len);
  if (!yaml_parser_load(&parser, &doc)) {
    mf_status st = syntax_error(&parser, name, text, len);
    yaml_parser_delete(&parser);
    return st;
  }
  mf_hwprofile *p = NULL;
  mf_status st = mf_calloc(1, sizeof *p, "hardware profile", (void **)&p);
  ld c = {&doc, name};
  if (st == MF_OK) st = parse_doc(&c, p);
  if (st == MF_OK) {
    yaml_document_t next;
    if (!yaml_parser_load(&parser, &next)) {
      st = syntax_error(&parser, name, text, len);
    } else {
      const yaml_node_t *r = yaml_document_get_root_node(&next);
      if (r) {
        ld c2 = {&next, name};
        st = fail_at(&c2, r, "", "a second YAML document: a profile is one document");
      }
      yaml_document_delete(&next);
    }
  }
  yaml_document_delete(&doc);
  yaml_parser_delete(&parser);
  if (st == MF_OK) *out = *p;
  free(p);
  return st;
}

mf_status mf_hwprofile_load(const char *path, mf_hwprofile *out) {
  if (!path || !out) return MF_ERR(MF_ERR_INVALID_ARG, "mf_hwprofile_load: NULL argument");
  char *text = NULL;
  size_t len = 0;
  mf_status st = mf_read_file(path, HW_MAX_BYTES, "a hardware profile", &text, &len);
  if (st == MF_ERR_FORMAT) return MF_ERR(MF_ERR_CONFIG, "%s", mf_last_error()); /* too large */
  if (st != MF_OK) {
    mf_error_trace(__FILE__, __LINE__, "mf_read_file");
    return st;
  }
  st = mf_hwprofile_parse(text, len, path, out);
  free(text);
  return st;
}

/* ---------------------------------------------------------- validation */

static mf_status bad(const char *field, const char *fault) {
  return MF_ERR(MF_ERR_INVALID_ARG, "hardware profile: %s %s", field, fault);
}

static mf_status check_text(const char *s, size_t cap, const char *field) {
  if (!memchr(s, 0, cap)) return bad(field, "is not NUL-terminated");
  if (!*s) return bad(field, "is empty");
  if (mf_utf8_invalid_at(s, strlen(s)) != strlen(s)) return bad(field, "is not valid UTF-8");
  return MF_OK;
}

static int pos(double v) {
  return v > 0 && isfinite(v);
}
static int nonneg(double v) {
  return v >= 0 && isfinite(v);
}

mf_status mf_hwprofile_validate(const mf_hwprofile *p) {
  if (!p) return MF_ERR(MF_ERR_INVALID_ARG, "hardware profile: NULL");
  MF_CHECK(check_text(p->name, sizeof p->name, "name"));
  MF_CHECK(check_text(p->source, sizeof p->source, "source"));
  if (p->device_memory == 0) return bad("device.memory", "must be > 0");
  if (p->device_reserve >= p->device_memory) return bad("device.reserve", "must be less than device.memory");
  if (p->copies_overlap_compute != 0 && p->copies_overlap_compute != 1)
    return bad("device.copies_overlap_compute", "must be 0 or 1");
  if (!pos(p->h2d_bandwidth)) return bad("links.h2d.bandwidth", "must be > 0 and finite");
  if (!nonneg(p->h2d_latency_s)) return bad("links.h2d.latency_us", "must be >= 0 and finite");
  if (!pos(p->d2h_bandwidth)) return bad("links.d2h.bandwidth", "must be > 0 and finite");
  if (!nonneg(p->d2h_latency_s)) return bad("links.d2h.latency_us", "must be >= 0 and finite");
  if (p->n_gemm < 1 || p->n_gemm > MF_HW_MAX_POINTS) return bad("compute.gemm", "must have 1 to 64 points");
  for (int i = 0; i < p->n_gemm; i++)
    if (!pos(p->gemm[i].m) || !pos(p->gemm[i].n) || !pos(p->gemm[i].k) || !pos(p->gemm[i].flops))
      return MF_ERR(MF_ERR_INVALID_ARG, "hardware profile: compute.gemm[%d]: m, n, k, flops must be > 0", i);
  int i, j = gemm_order_fault(p, &i);
  if (j >= 0)
    return MF_ERR(MF_ERR_INVALID_ARG,
                  "hardware profile: compute.gemm[%d] takes less time than compute.gemm[%d] for more FLOPs",
                  j, i);
  if (p->n_attn < 1 || p->n_attn > MF_HW_MAX_POINTS)
    return bad("compute.attention", "must have 1 to 64 points");
  for (int k = 0; k < p->n_attn; k++)
    if (!pos(p->attn[k].s) || !pos(p->attn[k].d) || !pos(p->attn[k].flops))
      return MF_ERR(MF_ERR_INVALID_ARG, "hardware profile: compute.attention[%d]: s, d, flops must be > 0",
                    k);
  if (!pos(p->elementwise_bandwidth)) return bad("compute.elementwise_bandwidth", "must be > 0 and finite");
  if (!nonneg(p->launch_s)) return bad("compute.launch_us", "must be >= 0 and finite");
  if (p->n_kernels < 0 || p->n_kernels > MF_HW_MAX_KERNELS)
    return bad("compute.kernels", "must have 0 to 256 points");
  for (int k = 0; k < p->n_kernels; k++) {
    const mf_hw_kernel_point *q = &p->kernels[k];
    int sizes_ok = q->n_sizes >= 0 && q->n_sizes <= MF_HW_KERNEL_SIZES &&
                   (q->n_sizes == 0 || q->sizes[q->n_sizes - 1] != 0);
    for (int j = 0; sizes_ok && j < q->n_sizes; j++)
      sizes_ok = q->sizes[j] >= 0 && q->sizes[j] <= (int64_t)9e15;
    if (!memchr(q->kernel, 0, sizeof q->kernel) || !kernel_name_ok(q->kernel) || !sizes_ok ||
        !nonneg(q->bytes) || !pos(q->seconds))
      return MF_ERR(
          MF_ERR_INVALID_ARG,
          "hardware profile: compute.kernels[%d]: needs a kernel name (a-z, 0-9, _), 0 to 8 sizes >= 0 "
          "(no trailing 0), bytes >= 0 and seconds > 0",
          k);
  }
  {
    int i, j = kernel_dup(p, &i);
    if (j >= 0)
      return MF_ERR(MF_ERR_INVALID_ARG,
                    "hardware profile: compute.kernels[%d] repeats the key of compute.kernels[%d]", j, i);
  }
  if (p->host_memory == 0) return bad("host.memory", "must be > 0");
  if (!pos(p->host_adamw_params_per_s)) return bad("host.adamw_params_per_s", "must be > 0 and finite");
  if (!pos(p->host_memory_bandwidth)) return bad("host.memory_bandwidth", "must be > 0 and finite");
  if (!nonneg(p->nvme_bandwidth)) return bad("nvme.bandwidth", "must be >= 0 (0: none) and finite");
  if (!nonneg(p->network_bandwidth)) return bad("network.bandwidth", "must be >= 0 (0: unknown) and finite");
  if (!nonneg(p->nvlink_bandwidth)) return bad("nvlink.bandwidth", "must be >= 0 (0: unknown) and finite");
  return MF_OK;
}

int mf_hwprofile_equal(const mf_hwprofile *a, const mf_hwprofile *b) {
  if (strcmp(a->name, b->name) || strcmp(a->source, b->source)) return 0;
  if (a->device_memory != b->device_memory || a->device_reserve != b->device_reserve ||
      a->copies_overlap_compute != b->copies_overlap_compute)
    return 0;
  if (a->h2d_bandwidth != b->h2d_bandwidth || a->h2d_latency_s != b->h2d_latency_s ||
      a->d2h_bandwidth != b->d2h_bandwidth || a->d2h_latency_s != b->d2h_latency_s)
    return 0;
  if (a->n_gemm != b->n_gemm || a->n_attn != b->n_attn) return 0;
  for (int i = 0; i < a->n_gemm; i++)
    if (a->gemm[i].m != b->gemm[i].m || a->gemm[i].n != b->gemm[i].n || a->gemm[i].k != b->gemm[i].k ||
        a->gemm[i].flops != b->gemm[i].flops)
      return 0;
  for (int i = 0; i < a->n_attn; i++)
    if (a->attn[i].s != b->attn[i].s || a->attn[i].d != b->attn[i].d || a->attn[i].flops != b->attn[i].flops)
      return 0;
  if (a->n_kernels != b->n_kernels) return 0;
  for (int i = 0; i < a->n_kernels; i++) {
    const mf_hw_kernel_point *x = &a->kernels[i], *y = &b->kernels[i];
    if (!same_key(x, y->kernel, y->sizes, y->n_sizes, y->bytes) || x->seconds != y->seconds) return 0;
  }
  return a->elementwise_bandwidth == b->elementwise_bandwidth && a->launch_s == b->launch_s &&
         a->host_memory == b->host_memory && a->host_adamw_params_per_s == b->host_adamw_params_per_s &&
         a->host_memory_bandwidth == b->host_memory_bandwidth && a->nvme_bandwidth == b->nvme_bandwidth &&
         a->network_bandwidth == b->network_bandwidth && a->nvlink_bandwidth == b->nvlink_bandwidth;
}

double mf_hwprofile_share_cores(mf_hwprofile *p, long cores, int64_t node_ranks, int64_t threads) {
  if (node_ranks <= 1 || cores < 1) return 1.0;
  const double share = (double)cores / (double)node_ranks; /* a rank's cores when they split evenly */
  double t = threads > 0 ? (double)threads : floor(share);
  if (t < 1) t = 1;
  const double f = (double)cores / (t < share ? t : share);
  for (int i = 0; i < p->n_gemm; i++) p->gemm[i].flops /= f;
  for (int i = 0; i < p->n_attn; i++) p->attn[i].flops /= f;
  for (int i = 0; i < p->n_kernels; i++) p->kernels[i].seconds *= f;
  p->elementwise_bandwidth /= f;
  p->launch_s *= f; /* a kernel's start (waking the rank's threads) is work on the shared cores too */
  p->host_adamw_params_per_s *= (double)node_ranks / f;
  const double crowd = (double)node_ranks / (double)cores; /* ranks a core, when above 1 */
  if (crowd > 1) {
    p->h2d_bandwidth /= crowd;
    p->d2h_bandwidth /= crowd;
  }
  char note[64];
  const int n = snprintf(note, sizeof note, " (a rank's 1/%.3g of the cores)", f);
  const size_t len = strlen(p->name);
  if (n > 0 && len + (size_t)n < sizeof p->name) memcpy(p->name + len, note, (size_t)n + 1);
  return f;
}
