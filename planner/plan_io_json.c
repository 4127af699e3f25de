/* The plan file's JSON text: a one-pass parser into a node array, and an
 * appending writer (plan_io_json.h). */
#include "planner/plan_io_json.h"

#include <locale.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "src/io/json_util.h"

/* Numbers are read and printed in the C locale's form ('.' as the decimal
 * point) whatever locale the caller set, as jansson does: this thread's
 * locale is the C one in between. */
typedef struct c_numbers {
  locale_t c, old;
} c_numbers;

static void c_numbers_begin(c_numbers *n) {
  n->c = newlocale(LC_NUMERIC_MASK, "C", (locale_t)0);
  n->old = n->c ? uselocale(n->c) : (locale_t)0;
}

static void c_numbers_end(c_numbers *n) {
  if (!n->c) return;
  uselocale(n->old);
  freelocale(n->c);
}

/* ------------------------------------------------------------- parsing */

typedef struct parser {
  const char *path;
  const unsigned char *s; /* the text; s[len] is NUL */
  size_t len, i;          /* i: the next byte to read */
  int max_depth;
  mf_pj_doc *doc;
  size_t w;     /* bytes used in doc->strings */
  mf_status st; /* the first error */
} parser;

/* "<path>: line L, column C: <what>": the position as mf_io_json_too_deep
 * gives it (1-based line, the byte's 1-based column). Returns -1. */
static int fail_as(parser *p, size_t at, const char *what) {
  if (p->st != MF_OK) return -1;
  int line = 1;
  size_t start = 0;
  for (size_t k = 0; k < at && k < p->len; k++)
    if (p->s[k] == '\n') line++, start = k + 1;
  p->st = MF_ERR(MF_ERR_FORMAT, "%s: line %d, column %zu: %s", p->path, line, at - start + 1, what);
  return -1;
}

/* A syntax error: "... invalid JSON: <fault>". */
static int fail(parser *p, size_t at, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(parser *p, size_t at, const char *fmt, ...) {
  char msg[256] = "invalid JSON: ";
  const size_t n = strlen(msg);
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg + n, sizeof msg - n, fmt, ap);
  va_end(ap);
  return fail_as(p, at, msg);
}

/* "end of file" or the byte at i, printable. */
static const char *what_is(const parser *p, size_t i, char *buf, size_t cap) {
  if (i >= p->len) return "the end of the file";
  const unsigned char c = p->s[i];
  if (c >= 0x20 && c < 0x7f)
    snprintf(buf, cap, "'%c'", c);
  else
    snprintf(buf, cap, "byte 0x%02x", c);
  return buf;
}

static int unexpected(parser *p, const char *expected) {
  char b[16];
  return fail(p, p->i, "expected %s, got %s", expected, what_is(p, p->i, b, sizeof b));
}

static void skip_ws(parser *p) {
  while (p->i < p->len) {
    const unsigned char c = p->s[p->i];
    if (c != ' ' && c != '\t' && c != '\n' && c != '\r') return;
    p->i++;
  }
}

static int32_t new_node(parser *p, json_type type, size_t at) {
  mf_pj_doc *d = p->doc;
  if (d->n == d->cap) {
    if (d->cap > INT32_MAX / 2) return fail(p, at, "too many values");
    const int32_t cap = d->cap ? 2 * d->cap : 64;
    mf_pj *q = (mf_pj *)realloc(d->node, (size_t)cap * sizeof *q);
    if (!q) {
      p->st = MF_ERR(MF_ERR_OUT_OF_MEMORY, "%s: out of memory parsing a plan", p->path);
      return -1;
    }
    d->node = q;
    d->cap = cap;
  }
  mf_pj *x = &d->node[d->n];
  memset(x, 0, sizeof *x);
  x->type = (uint8_t)type;
  x->next = -1;
  x->at = (uint32_t)at;
  return d->n++;
}

size_t mf_pj_utf8_len(const unsigned char *s, size_t n) {
  const unsigned char c = s[0];
  size_t len;
  unsigned char lo = 0x80, hi = 0xbf; /* the second byte's range */
  if (c < 0x80) return n ? 1 : 0;
  if (c >= 0xc2 && c <= 0xdf)
    len = 2;
  else if (c >= 0xe0 && c <= 0xef)
    len = 3, lo = c == 0xe0 ? 0xa0 : 0x80, hi = c == 0xed ? 0x9f : 0xbf;
  else if (c >= 0xf0 && c <= 0xf4)
    len = 4, lo = c == 0xf0 ? 0x90 : 0x80, hi = c == 0xf4 ? 0x8f : 0xbf;
  else
    return 0;
  if (n < len || s[1] < lo || s[1] > hi) return 0;
  for (size_t k = 2; k < len; k++)
    if ((s[k] & 0xc0) != 0x80) return 0;
  return len;
}

int mf_pj_utf8_valid(const char *s) {
  const unsigned char *u = (const unsigned char *)s;
  for (size_t i = 0, k; u[i]; i += k) {
    if (u[i] < 0x80) { /* the common case: no length to find */
      k = 1;
      continue;
    }
    if (!(k = mf_pj_utf8_len(u + i, strlen(s + i)))) return 0;
  }
  return 1;
}

static int hex4(const unsigned char *s, uint32_t *out) {
  uint32_t v = 0;
  for (int k = 0; k < 4; k++) {
    const unsigned char c = s[k];
    v <<= 4;
    if (c >= '0' && c <= '9')
      v |= (uint32_t)(c - '0');
    else if ((c | 0x20) >= 'a' && (c | 0x20) <= 'f')
      v |= (uint32_t)((c | 0x20) - 'a' + 10);
    else
      return 0;
  }
  *out = v;
  return 1;
}

static void put_utf8(char *o, size_t *w, uint32_t cp) {
  if (cp < 0x80) {
    o[(*w)++] = (char)cp;
  } else if (cp < 0x800) {
    o[(*w)++] = (char)(0xc0 | cp >> 6);
    o[(*w)++] = (char)(0x80 | (cp & 0x3f));
  } else if (cp < 0x10000) {
    o[(*w)++] = (char)(0xe0 | cp >> 12);
    o[(*w)++] = (char)(0x80 | (cp >> 6 & 0x3f));
    o[(*w)++] = (char)(0x80 | (cp & 0x3f));
  } else {
    o[(*w)++] = (char)(0xf0 | cp >> 18);
    o[(*w)++] = (char)(0x80 | (cp >> 12 & 0x3f));
    o[(*w)++] = (char)(0x80 | (cp >> 6 & 0x3f));
    o[(*w)++] = (char)(0x80 | (cp & 0x3f));
  }
}

/* The \u escape at s[i] ('\\' 'u' XXXX, a surrogate pair as two): its code point, or -1. */
static int64_t unicode_escape(parser *p, size_t i, size_t *end) {
  uint32_t cp, lo;
  if (i + 6 > p->len || !hex4(p->s + i + 2, &cp)) return fail(p, i, "invalid \\u escape (four hex digits)");
  *end = i + 6;
  if (cp >= 0xdc00 && cp <= 0xdfff)
    return fail(p, i, "invalid Unicode escape '\\u%04X' (a lone low surrogate)", cp);
  if (cp >= 0xd800 && cp <= 0xdbff) {
    if (i + 12 > p->len || p->s[i + 6] != '\\' || p->s[i + 7] != 'u' || !hex4(p->s + i + 8, &lo) ||
        lo < 0xdc00 || lo > 0xdfff)
      return fail(p, i, "invalid Unicode escape '\\u%04X' (a high surrogate without its low one)", cp);
    cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
    *end = i + 12;
  }
  if (cp == 0) return fail(p, i, "\\u0000 is not allowed in a string");
  return cp;
}

/* The string whose opening quote is at p->i, decoded into doc->strings; NULL on error. */
static const char *string(parser *p) {
  char *o = p->doc->strings;
  const size_t start = p->w;
  size_t i = p->i + 1, w = p->w;
  for (;;) {
    const unsigned char c = p->s[i]; /* s[len] is NUL: it stops the run below */
    if (c >= 0x20 && c < 0x80 && c != '"' && c != '\\') {
      o[w++] = (char)c;
      i++;
      continue;
    }
    if (c == '"') break;
    if (i >= p->len) {
      fail(p, i, "the file ends inside a string");
      return NULL;
    }
    if (c < 0x20) {
      fail(p, i, "control character 0x%02x in a string (write it as an escape)", c);
      return NULL;
    }
    if (c == '\\') {
      static const char from[] = "\"\\/bfnrt", to[] = "\"\\/\b\f\n\r\t";
      const char *e = i + 1 < p->len ? strchr(from, p->s[i + 1]) : NULL;
      if (e && *e) {
        o[w++] = to[e - from];
        i += 2;
        continue;
      }
      if (i + 1 >= p->len || p->s[i + 1] != 'u') {
        char b[16];
        fail(p, i, "invalid escape: '\\' then %s", what_is(p, i + 1, b, sizeof b));
        return NULL;
      }
      const int64_t cp = unicode_escape(p, i, &i);
      if (cp < 0) return NULL;
      put_utf8(o, &w, (uint32_t)cp);
      continue;
    }
    const size_t n = mf_pj_utf8_len(p->s + i, p->len - i);
    if (!n) {
      fail(p, i, "byte 0x%02x is not valid UTF-8 here", c);
      return NULL;
    }
    memcpy(o + w, p->s + i, n);
    w += n, i += n;
  }
  /* Decoded, a string is never longer than its text, so strings has room. */
  o[w++] = 0;
  p->w = w;
  p->i = i + 1;
  return o + start;
}

static int digit(const parser *p, size_t i) {
  return i < p->len && p->s[i] >= '0' && p->s[i] <= '9';
}

static int32_t number(parser *p) {
  const size_t b = p->i;
  size_t i = b;
  const int neg = p->s[i] == '-';
  if (neg) i++;
  if (!digit(p, i)) return fail(p, i, "a number needs digits after '-'");
  if (p->s[i] == '0')
    i++;
  else
    while (digit(p, i)) i++;
  int real = 0;
  if (i < p->len && p->s[i] == '.') {
    if (!digit(p, ++i)) return fail(p, i, "a number needs digits after '.'");
    while (digit(p, i)) i++;
    real = 1;
  }
  if (i < p->len && (p->s[i] == 'e' || p->s[i] == 'E')) {
    i++;
    if (i < p->len && (p->s[i] == '+' || p->s[i] == '-')) i++;
    if (!digit(p, i)) return fail(p, i, "a number needs digits in its exponent");
    while (digit(p, i)) i++;
    real = 1;
  }
  const int32_t x = new_node(p, real ? JSON_REAL : JSON_INTEGER, b);
  if (x < 0) return -1;
  if (real) {
    char *end;
    const double v = strtod((const char *)p->s + b, &end); /* the text is NUL-terminated */
    if ((const unsigned char *)end != p->s + i) return fail(p, b, "a number that does not parse");
    if (isinf(v)) return fail(p, b, "real number overflow");
    p->doc->node[x].v.r = v;
  } else {
    const uint64_t limit = neg ? (uint64_t)INT64_MAX + 1 : (uint64_t)INT64_MAX;
    uint64_t v = 0;
    for (size_t k = b + (size_t)neg; k < i; k++) {
      const uint64_t dgt = (uint64_t)(p->s[k] - '0');
      if (v > (limit - dgt) / 10)
        return fail(p, b, "too big %sinteger (past 64 bits)", neg ? "negative " : "");
      v = v * 10 + dgt;
    }
    p->doc->node[x].v.i = neg ? (int64_t)(0 - v) : (int64_t)v;
  }
  p->i = i;
  return x;
}

static int32_t literal(parser *p) {
  static const char *const words[] = {"true", "false", "null"};
  static const json_type types[] = {JSON_TRUE, JSON_FALSE, JSON_NULL};
  for (int k = 0; k < 3; k++) {
    const size_t n = strlen(words[k]);
    if (p->i + n <= p->len && memcmp(p->s + p->i, words[k], n) == 0) {
      const int32_t x = new_node(p, types[k], p->i);
      p->i += n;
      return x;
    }
  }
  return unexpected(p, "a value");
}

typedef struct keyref {
  const char *key;
  int32_t node;
} keyref;

static int by_key(const void *a, const void *b) {
  const keyref *x = (const keyref *)a, *y = (const keyref *)b;
  const int c = strcmp(x->key, y->key);
  return c ? c : (x->node > y->node) - (x->node < y->node);
}

/* No key twice in object o (a plan's objects have a handful: those are
 * compared pairwise; a large one is sorted). The error is at the first
 * repeat in the text. */
static int check_keys(parser *p, int32_t o) {
  const mf_pj *nd = p->doc->node;
  const int32_t n = nd[o].n;
  int32_t dup = -1;
  if (n <= 16) {
    for (int32_t a = nd[o].v.first; a >= 0 && dup < 0; a = nd[a].next)
      for (int32_t b = nd[o].v.first; b != a && dup < 0; b = nd[b].next)
        if (strcmp(nd[a].key, nd[b].key) == 0) dup = a;
  } else {
    keyref *k = (keyref *)malloc((size_t)n * sizeof *k);
    if (!k) {
      p->st = MF_ERR(MF_ERR_OUT_OF_MEMORY, "%s: out of memory parsing a plan", p->path);
      return -1;
    }
    int32_t m = 0;
    for (int32_t a = nd[o].v.first; a >= 0; a = nd[a].next) k[m++] = (keyref){nd[a].key, a};
    qsort(k, (size_t)n, sizeof *k, by_key);
    for (int32_t j = 1; j < n; j++)
      if (strcmp(k[j].key, k[j - 1].key) == 0 && (dup < 0 || k[j].node < dup)) dup = k[j].node;
    free(k);
  }
  if (dup < 0) return 0;
  char q[128];
  return fail(p, nd[dup].at, "duplicate object key '%s'", mf_io_json_printable(nd[dup].key, q, sizeof q));
}

static int32_t value(parser *p, int depth);

/* The array or object whose bracket is at p->i. */
static int32_t container(parser *p, int depth) {
  const int obj = p->s[p->i] == '{';
  const char close = obj ? '}' : ']';
  if (depth >= p->max_depth) { /* before anything recurses further */
    char msg[96];
    snprintf(msg, sizeof msg, "nests deeper than %d levels; a plan needs 3", p->max_depth);
    return fail_as(p, p->i, msg);
  }
  const int32_t c = new_node(p, obj ? JSON_OBJECT : JSON_ARRAY, p->i);
  if (c < 0) return -1;
  p->doc->node[c].v.first = -1;
  p->i++;
  skip_ws(p);
  if (p->i < p->len && p->s[p->i] == close) {
    p->i++;
    return c;
  }
  int32_t last = -1, n = 0;
  for (;;) {
    const char *key = NULL;
    const size_t key_at = p->i;
    if (obj) {
      if (p->i >= p->len || p->s[p->i] != '"') return unexpected(p, "a string (an object's key)");
      if (!(key = string(p))) return -1;
      skip_ws(p);
      if (p->i >= p->len || p->s[p->i] != ':') return unexpected(p, "':' after an object's key");
      p->i++;
      skip_ws(p);
    }
    const int32_t v = value(p, depth + 1);
    if (v < 0) return -1;
    mf_pj *nd = p->doc->node;
    if (obj) nd[v].key = key, nd[v].at = (uint32_t)key_at;
    if (last < 0)
      nd[c].v.first = v;
    else
      nd[last].next = v;
    last = v;
    n++;
    skip_ws(p);
    if (p->i < p->len && p->s[p->i] == ',') {
      p->i++;
      skip_ws(p);
      continue;
    }
    if (p->i < p->len && p->s[p->i] == close) break;
    return unexpected(p, obj ? "',' or '}'" : "',' or ']'");
  }
  p->i++;
  p->doc->node[c].n = n;
  if (obj && check_keys(p, c) < 0) return -1;
  return c;
}

static int32_t value(parser *p, int depth) {
  if (p->i >= p->len) return unexpected(p, "a value");
  const unsigned char c = p->s[p->i];
  if (c == '{' || c == '[') return container(p, depth);
  if (c == '-' || (c >= '0' && c <= '9')) return number(p);
  if (c == '"') {
    const int32_t x = new_node(p, JSON_STRING, p->i);
    if (x < 0) return -1;
    const char *s = string(p);
    if (!s) return -1;
    p->doc->node[x].v.s = s;
    return x;
  }
  return literal(p);
}

mf_status mf_pj_parse(const char *path, const char *text, size_t len, int max_depth, mf_pj_doc *doc) {
  memset(doc, 0, sizeof *doc);
  if (len > UINT32_MAX) return MF_ERR(MF_ERR_FORMAT, "%s: %zu bytes is too large to parse", path, len);
  parser p = {path, (const unsigned char *)text, len, 0, max_depth, doc, 0, MF_OK};
  MF_CHECK(mf_malloc(len + 1, "plan strings", (void **)&doc->strings));
  /* About one value per 16 bytes of a plan: room for them at once. */
  doc->cap = len / 16 < 64 ? 64 : (int32_t)(len / 16);
  MF_CHECK_GOTO(mf_malloc((size_t)doc->cap * sizeof *doc->node, "plan values", (void **)&doc->node), p.st,
                done);
  skip_ws(&p);
  c_numbers cn;
  c_numbers_begin(&cn);
  if (p.i < len && text[p.i] != '{' && text[p.i] != '[')
    unexpected(&p, "'{' or '[' (an object or an array)");
  else if (value(&p, 0) >= 0) {
    skip_ws(&p);
    if (p.i < len) fail(&p, p.i, "text after the end of the top-level value");
  }
  c_numbers_end(&cn);
done:
  if (p.st != MF_OK) mf_pj_free(doc);
  return p.st;
}

void mf_pj_free(mf_pj_doc *doc) {
  if (!doc) return;
  free(doc->node);
  free(doc->strings);
  memset(doc, 0, sizeof *doc);
}

const mf_pj *mf_pj_get(const mf_pj_doc *doc, const mf_pj *obj, const char *key) {
  if (obj->type != JSON_OBJECT) return NULL;
  for (int32_t m = obj->v.first; m >= 0; m = doc->node[m].next)
    if (strcmp(doc->node[m].key, key) == 0) return &doc->node[m];
  return NULL;
}

const char *mf_pj_kind(const mf_pj *v) {
  return mf_io_json_type_kind((json_type)v->type, 0);
}

json_t *mf_pj_to_jansson(const mf_pj_doc *doc, const mf_pj *v, const char *skip_key) {
  switch ((json_type)v->type) {
    case JSON_OBJECT:
    case JSON_ARRAY: {
      json_t *c = v->type == JSON_OBJECT ? json_object() : json_array();
      for (int32_t m = v->v.first; c && m >= 0; m = doc->node[m].next) {
        const mf_pj *x = &doc->node[m];
        if (skip_key && x->key && strcmp(x->key, skip_key) == 0) continue;
        json_t *j = mf_pj_to_jansson(doc, x, NULL);
        const int bad =
            v->type == JSON_OBJECT ? json_object_set_new(c, x->key, j) : json_array_append_new(c, j);
        if (bad) {
          json_decref(c);
          c = NULL;
        }
      }
      return c;
    }
    case JSON_STRING:
      return json_string(v->v.s);
    case JSON_INTEGER:
      return json_integer((json_int_t)v->v.i);
    case JSON_REAL:
      return json_real(v->v.r);
    case JSON_TRUE:
      return json_true();
    case JSON_FALSE:
      return json_false();
    case JSON_NULL:
      return json_null();
  }
  return NULL;
}

/* ------------------------------------------------------------- writing */

void mf_pj_put(mf_pj_out *o, const char *s, size_t n) {
  if (o->oom) return;
  if (o->cap - o->n < n) {
    size_t cap = o->cap ? o->cap : 4096;
    while (cap - o->n < n) cap *= 2;
    char *b = (char *)realloc(o->buf, cap);
    if (!b) {
      o->oom = 1;
      return;
    }
    o->buf = b;
    o->cap = cap;
  }
  memcpy(o->buf + o->n, s, n);
  o->n += n;
}

void mf_pj_put_string(mf_pj_out *o, const char *s) {
  mf_pj_put(o, "\"", 1);
  const char *run = s;
  for (;; s++) {
    const unsigned char c = (unsigned char)*s;
    if (c >= 0x20 && c != '"' && c != '\\') continue;
    mf_pj_put(o, run, (size_t)(s - run));
    if (!c) break;
    char esc[8];
    const char *named = c == '"'    ? "\\\""
                        : c == '\\' ? "\\\\"
                        : c == '\b' ? "\\b"
                        : c == '\f' ? "\\f"
                        : c == '\n' ? "\\n"
                        : c == '\r' ? "\\r"
                        : c == '\t' ? "\\t"
                                    : NULL;
    if (!named) snprintf(esc, sizeof esc, "\\u%04X", c);
    mf_pj_put(o, named ? named : esc, strlen(named ? named : esc));
    run = s + 1;
  }
  mf_pj_put(o, "\"", 1);
}

void mf_pj_put_i64(mf_pj_out *o, int64_t v) {
  char b[24];
  size_t k = sizeof b;
  uint64_t u = v < 0 ? 0 - (uint64_t)v : (uint64_t)v;
  do {
    b[--k] = (char)('0' + u % 10);
    u /= 10;
  } while (u);
  if (v < 0) b[--k] = '-';
  mf_pj_put(o, b + k, sizeof b - k);
}

void mf_pj_put_real(mf_pj_out *o, double v) {
  char b[40];
  c_numbers cn;
  c_numbers_begin(&cn);
  int n = snprintf(b, sizeof b, "%.17g", v);
  c_numbers_end(&cn);
  if (!strchr(b, '.') && !strchr(b, 'e')) n += snprintf(b + n, sizeof b - (size_t)n, ".0");
  char *e = strchr(b, 'e');
  if (e) { /* "1e+20" -> "1e20", "1e-05" -> "1e-5" */
    char *from = e + 1, *to = e + 1;
    if (*from == '+')
      from++;
    else if (*from == '-')
      from++, to++;
    while (*from == '0' && from[1]) from++;
    memmove(to, from, strlen(from) + 1);
    n = (int)strlen(b);
  }
  mf_pj_put(o, b, (size_t)n);
}

static void newline(mf_pj_writer *w) {
  static const char spaces[] = "                ";
  mf_pj_put(&w->out, "\n", 1);
  mf_pj_put(&w->out, spaces, (size_t)(2 * w->depth));
}

void mf_pj_open(mf_pj_writer *w, char bracket) {
  MF_ASSERT(w->depth < MF_PJ_MAX_DEPTH);
  mf_pj_put(&w->out, &bracket, 1);
  w->count[w->depth++] = 0;
}

void mf_pj_close(mf_pj_writer *w, char bracket) {
  w->depth--;
  if (w->count[w->depth]) newline(w);
  mf_pj_put(&w->out, &bracket, 1);
}

void mf_pj_elem(mf_pj_writer *w) {
  if (w->count[w->depth - 1]++) mf_pj_put(&w->out, ",", 1);
  newline(w);
}

void mf_pj_key(mf_pj_writer *w, const char *key) {
  mf_pj_elem(w);
  mf_pj_put(&w->out, "\"", 1);
  mf_pj_put(&w->out, key, strlen(key));
  mf_pj_put(&w->out, "\": ", 3);
}
