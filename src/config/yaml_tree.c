/*
 * YAML text -> a tree of maps, lists and scalars that keeps each node's line
 * and column, built from libyaml's event stream with an explicit stack (so a
 * deeply nested file is an error, not a deep recursion).
 *
 * Checked before libyaml sees the text: size, NUL bytes (binary files, UTF-16)
 * and UTF-8 validity, so those errors get a line and column too.
 * Rejected: aliases (*x: configs are small, and aliases allow exponential
 * documents), tags (!!str), non-scalar map keys, duplicate keys and more than
 * one document.
 */
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <yaml.h>

#include "src/config/config_impl.h"

/* ------------------------------------------------------------ nodes */

mf_status mf_ynode_new(mf_ykind kind, const mf_ysrc *src, mf_ynode **out) {
  mf_ynode *n = NULL;
  MF_CHECK(mf_calloc(1, sizeof *n, "config node", (void **)&n));
  n->kind = kind;
  n->src = src;
  *out = n;
  return MF_OK;
}

void mf_ynode_free(mf_ynode *n) {
  if (!n) return;
  for (size_t i = 0; i < n->n; i++) {
    if (n->keys) mf_ynode_free(n->keys[i]);
    mf_ynode_free(n->vals[i]);
  }
  free(n->keys);
  free(n->vals);
  free(n->text);
  free(n);
}

mf_status mf_ynode_append(mf_ynode *parent, mf_ynode *key, mf_ynode *val) {
  if (parent->n == parent->cap) {
    size_t cap = parent->cap ? 2 * parent->cap : 8;
    mf_ynode **vals = realloc(parent->vals, cap * sizeof *vals);
    if (!vals) return MF_ERR(MF_ERR_OUT_OF_MEMORY, "out of memory building the config tree");
    parent->vals = vals;
    if (parent->kind == MF_YMAP) {
      mf_ynode **keys = realloc(parent->keys, cap * sizeof *keys);
      if (!keys) return MF_ERR(MF_ERR_OUT_OF_MEMORY, "out of memory building the config tree");
      parent->keys = keys;
    }
    parent->cap = cap;
  }
  if (parent->kind == MF_YMAP) {
    parent->keys[parent->n] = key;
    key->parent = parent;
    val->key = key;
  }
  val->parent = parent;
  val->index = parent->n;
  parent->vals[parent->n++] = val;
  return MF_OK;
}

int mf_ynode_is_null(const mf_ynode *n) {
  if (!n) return 1;
  if (n->kind != MF_YSCALAR || n->quoted) return 0;
  static const char *const nulls[] = {"", "~", "null", "Null", "NULL"};
  for (size_t i = 0; i < sizeof nulls / sizeof nulls[0]; i++)
    if (strcmp(n->text, nulls[i]) == 0) return 1;
  return 0;
}

mf_ynode *mf_ynode_get(const mf_ynode *map, const char *key, size_t *i) {
  if (!map || map->kind != MF_YMAP) return NULL;
  for (size_t k = 0; k < map->n; k++) {
    if (strcmp(map->keys[k]->text, key) == 0) {
      if (i) *i = k;
      return map->vals[k];
    }
  }
  return NULL;
}

const char *mf_ynode_loc(const mf_ynode *n, char *buf, size_t cap) {
  if (!n || !n->src) {
    snprintf(buf, cap, "config");
  } else if (n->src->cmdline) {
    snprintf(buf, cap, "command line: %s", n->src->name);
  } else {
    snprintf(buf, cap, "%s:%d:%d", n->src->name, n->line, n->col);
  }
  return buf;
}

const char *mf_ynode_origin(const mf_ynode *n, char *buf, size_t cap) {
  char loc[512];
  if (n && n->src && n->src->cmdline)
    snprintf(buf, cap, "set by override %d '%s'", n->src->cmdline, n->src->name);
  else
    snprintf(buf, cap, "set at %s", mf_ynode_loc(mf_ynode_place(n), loc, sizeof loc));
  return buf;
}

const mf_ynode *mf_ynode_place(const mf_ynode *v) {
  if (!v || (v->src && v->src->cmdline) || !v->key) return v;
  return v->key;
}

static void path_into(const mf_ynode *n, char *buf, size_t cap, size_t *len) {
  if (!n || !n->parent) return;
  path_into(n->parent, buf, cap, len);
  if (*len >= cap) return;
  int w;
  if (n->parent->kind == MF_YMAP)
    w = snprintf(buf + *len, cap - *len, "%s%s", *len ? "." : "", n->key ? n->key->text : "?");
  else
    w = snprintf(buf + *len, cap - *len, "[%zu]", n->index);
  if (w > 0) *len += (size_t)w;
  if (*len >= cap) *len = cap - 1;
}

const char *mf_ynode_path(const mf_ynode *n, char *buf, size_t cap) {
  size_t len = 0;
  buf[0] = 0;
  /* a key node names the same path as its value */
  if (n && n->parent && n->parent->kind == MF_YMAP && !n->key) {
    for (size_t i = 0; i < n->parent->n; i++) {
      if (n->parent->keys[i] == n) {
        n = n->parent->vals[i];
        break;
      }
    }
  }
  path_into(n, buf, cap, &len);
  return buf;
}

/* Quotes text for a message: printable ASCII kept, the rest escaped, long text cut. */
static void quote_text(const char *s, size_t len, char *buf, size_t cap) {
  size_t o = 0;
  const size_t max_in = 60;
  if (cap < 8) {
    if (cap) buf[0] = 0;
    return;
  }
  buf[o++] = '\'';
  for (size_t i = 0; i < len && i < max_in && o + 6 < cap; i++) {
    unsigned char c = (unsigned char)s[i];
    if (c >= 0x20 && c < 0x7f && c != '\\') {
      buf[o++] = (char)c;
    } else if (c >= 0x80) {
      buf[o++] = (char)c; /* UTF-8 was checked: keep it readable */
    } else {
      o += (size_t)snprintf(buf + o, cap - o, "\\x%02x", c);
    }
  }
  if (len > max_in && o + 5 < cap) {
    memcpy(buf + o, "...", 3);
    o += 3;
  }
  buf[o++] = '\'';
  buf[o] = 0;
}

const char *mf_ynode_describe(const mf_ynode *n, char *buf, size_t cap) {
  if (!n || mf_ynode_is_null(n))
    snprintf(buf, cap, "null");
  else if (n->kind == MF_YMAP)
    snprintf(buf, cap, "a map");
  else if (n->kind == MF_YSEQ)
    snprintf(buf, cap, "a list");
  else
    quote_text(n->text, n->len, buf, cap);
  return buf;
}

/* ------------------------------------------------------- text checks */

static void offset_to_linecol(const char *text, size_t off, int *line, int *col) {
  int l = 1, c = 1;
  for (size_t i = 0; i < off; i++) {
    if (text[i] == '\n') {
      l++, c = 1;
    } else if (((unsigned char)text[i] & 0xc0) != 0x80) {
      c++;
    }
  }
  *line = l, *col = c;
}

/* The byte offset of libyaml's 0-based line and column (which count
 * characters; a UTF-8 BOM is not one); *line_start gets the line's offset. */
static size_t linecol_to_offset(const char *text, size_t len, size_t line, size_t col, size_t *line_start) {
  size_t i = len >= 3 && memcmp(text, "\xef\xbb\xbf", 3) == 0 ? 3 : 0;
  for (size_t l = 0; l < line && i < len; i++)
    if (text[i] == '\n') l++;
  *line_start = i;
  for (size_t c = 0; c < col && i < len; c++) {
    i++;
    while (i < len && ((unsigned char)text[i] & 0xc0) == 0x80) i++; /* the rest of a UTF-8 character */
  }
  return i;
}

const char *mf_yaml_tab_problem(const char *text, size_t len, size_t line, size_t col) {
  size_t start, at = linecol_to_offset(text, len, line, col, &start);
  if (at >= len || text[at] != '\t') return NULL; /* libyaml: "found character that cannot start any token" */
  return strspn(text + start, " \t") >= at - start ? "tabs are not allowed for indentation in YAML: indent with spaces"
                                                    : "a tab cannot start a YAML token here: use spaces";
}

/* -------------------------------------------------------- the parser */

typedef struct builder {
  const mf_ysrc *src;
  const char *text;
  size_t len;
  mf_ynode *root;
  mf_ynode *stack[MF_YAML_MAX_DEPTH + 1];
  mf_ynode *pending_key[MF_YAML_MAX_DEPTH + 1]; /* a map's key waiting for its value */
  int depth;
} builder;

/* "<where>: <message>" as MF_ERR_CONFIG. */
static mf_status place_err(const mf_ysrc *src, int line, int col, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static mf_status place_err(const mf_ysrc *src, int line, int col, const char *fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (src->cmdline) return MF_ERR(MF_ERR_CONFIG, "command line: %s: %s", src->name, msg);
  return MF_ERR(MF_ERR_CONFIG, "%s:%d:%d: %s", src->name, line, col, msg);
}

/* " (in 'train')" for errors in the middle of a document. */
static const char *inside(const builder *b, char *buf, size_t cap) {
  buf[0] = 0;
  if (b->depth <= 0) return buf;
  const mf_ynode *top = b->stack[b->depth - 1];
  char path[256];
  mf_ynode_path(top, path, sizeof path);
  if (top->kind == MF_YMAP && b->pending_key[b->depth - 1]) {
    size_t l = strlen(path);
    snprintf(path + l, sizeof path - l, "%s%s", l ? "." : "", b->pending_key[b->depth - 1]->text);
  }
  if (path[0]) snprintf(buf, cap, " (in '%s')", path);
  return buf;
}

/* Hooks a finished node into its parent (or makes it the root); takes it. */
static mf_status attach(builder *b, mf_ynode *n) {
  if (b->depth == 0) {
    b->root = n;
    return MF_OK;
  }
  mf_ynode *top = b->stack[b->depth - 1];
  mf_status st;
  if (top->kind == MF_YSEQ) {
    st = mf_ynode_append(top, NULL, n);
    if (st != MF_OK) mf_ynode_free(n);
    return st;
  }
  mf_ynode **pk = &b->pending_key[b->depth - 1];
  if (!*pk) {
    if (n->kind != MF_YSCALAR) {
      char path[256];
      mf_ynode_path(top, path, sizeof path);
      st = place_err(b->src, n->line, n->col, "a map key must be a plain name, not %s%s%s%s",
                     n->kind == MF_YMAP ? "a map" : "a list", path[0] ? " (in '" : "", path,
                     path[0] ? "')" : "");
      mf_ynode_free(n);
      return st;
    }
    for (size_t i = 0; i < top->n; i++) {
      const mf_ynode *k = top->keys[i];
      if (k->len == n->len && memcmp(k->text, n->text, n->len) == 0) {
        char path[256];
        mf_ynode_path(top, path, sizeof path);
        st = place_err(b->src, n->line, n->col, "duplicate key '%s%s%s' (first at line %d, column %d)", path,
                       path[0] ? "." : "", n->text, k->line, k->col);
        mf_ynode_free(n);
        return st;
      }
    }
    *pk = n;
    return MF_OK;
  }
  st = mf_ynode_append(top, *pk, n);
  if (st != MF_OK) {
    mf_ynode_free(n);
    return st; /* the key stays pending and is freed with the builder */
  }
  *pk = NULL;
  return MF_OK;
}

static mf_status syntax_err(builder *b, const yaml_parser_t *p) {
  char in[300];
  inside(b, in, sizeof in);
  if (p->error == YAML_MEMORY_ERROR)
    return MF_ERR(MF_ERR_OUT_OF_MEMORY, "%s: out of memory parsing YAML", b->src->name);
  if (p->error == YAML_READER_ERROR) {
    int line, col;
    offset_to_linecol(b->text, p->problem_offset, &line, &col);
    return place_err(b->src, line, col, "%s: %s (byte 0x%02x)%s",
                     b->src->cmdline ? "not a valid YAML value" : "not a YAML file",
                     p->problem ? p->problem : "unreadable text", (unsigned)p->problem_value & 0xffu, in);
  }
  const char *what = b->src->cmdline ? "not a valid YAML value" : "YAML syntax error";
  const char *tab = mf_yaml_tab_problem(b->text, b->len, p->problem_mark.line, p->problem_mark.column);
  if (tab)
    return place_err(b->src, (int)p->problem_mark.line + 1, (int)p->problem_mark.column + 1, "%s: %s%s", what, tab,
                     in);
  if (p->context)
    return place_err(b->src, (int)p->problem_mark.line + 1, (int)p->problem_mark.column + 1,
                     "%s: %s (%s at line %d, column %d)%s", what, p->problem ? p->problem : "?", p->context,
                     (int)p->context_mark.line + 1, (int)p->context_mark.column + 1, in);
  return place_err(b->src, (int)p->problem_mark.line + 1, (int)p->problem_mark.column + 1, "%s: %s%s", what,
                   p->problem ? p->problem : "?", in);
}

static mf_status check_text(const mf_ysrc *src, const char *text, size_t len) {
  if (len > MF_YAML_MAX_BYTES)
    return MF_ERR(MF_ERR_CONFIG, "%s%s: %zu bytes is too large for a config (at most %zu)",
                  src->cmdline ? "command line: " : "", src->name, len, MF_YAML_MAX_BYTES);
  /* whichever comes first: a NUL byte (binary, UTF-16) or a byte that is not UTF-8 */
  const char *nul = memchr(text, 0, len);
  size_t bad = mf_utf8_invalid_at(text, nul ? (size_t)(nul - text) : len);
  if (nul && bad == (size_t)(nul - text)) {
    int line, col;
    offset_to_linecol(text, bad, &line, &col);
    return place_err(src, line, col, "NUL byte: a binary file (or UTF-16 text), not a YAML config");
  }
  if (bad < len) {
    int line, col;
    offset_to_linecol(text, bad, &line, &col);
    return place_err(src, line, col,
                     "not UTF-8 text (byte 0x%02x): a config must be UTF-8 (is it a binary file?)",
                     (unsigned char)text[bad]);
  }
  return MF_OK;
}

static mf_status node_from_event(builder *b, const yaml_event_t *ev, mf_ykind kind, mf_ynode **out) {
  const yaml_char_t *tag = NULL;
  if (kind == MF_YSCALAR) tag = ev->data.scalar.tag;
  if (kind == MF_YMAP) tag = ev->data.mapping_start.tag;
  if (kind == MF_YSEQ) tag = ev->data.sequence_start.tag;
  int line = (int)ev->start_mark.line + 1, col = (int)ev->start_mark.column + 1;
  if (tag) {
    char in[300];
    return place_err(b->src, line, col, "YAML tags (%s) are not supported in a config%s", (const char *)tag,
                     inside(b, in, sizeof in));
  }
  mf_ynode *n = NULL;
  MF_CHECK(mf_ynode_new(kind, b->src, &n));
  n->line = line, n->col = col;
  if (kind == MF_YSCALAR) {
    n->len = ev->data.scalar.length;
    mf_status st = mf_malloc(n->len + 1, "config scalar", (void **)&n->text);
    if (st != MF_OK) {
      mf_ynode_free(n);
      return st;
    }
    memcpy(n->text, ev->data.scalar.value, n->len);
    n->text[n->len] = 0;
    n->quoted = ev->data.scalar.style != YAML_PLAIN_SCALAR_STYLE;
  }
  *out = n;
  return MF_OK;
}

static mf_status build(builder *b, yaml_parser_t *p) {
  int docs = 0;
  for (;;) {
    yaml_event_t ev;
    if (!yaml_parser_parse(p, &ev)) return syntax_err(b, p);
    mf_status st = MF_OK;
    mf_ynode *n = NULL;
    char in[300];
    int line = (int)ev.start_mark.line + 1, col = (int)ev.start_mark.column + 1;
    switch (ev.type) {
      case YAML_STREAM_END_EVENT:
        yaml_event_delete(&ev);
        return MF_OK;
      case YAML_DOCUMENT_START_EVENT:
        if (++docs > 1)
          st =
              place_err(b->src, line, col, "a second YAML document: a config is one document (remove '---')");
        break;
      case YAML_ALIAS_EVENT:
        st =
            place_err(b->src, line, col, "aliases (*%s) are not supported in a config: write the value out%s",
                      (const char *)ev.data.alias.anchor, inside(b, in, sizeof in));
        break;
      case YAML_SCALAR_EVENT:
        st = node_from_event(b, &ev, MF_YSCALAR, &n);
        if (st == MF_OK) st = attach(b, n);
        break;
      case YAML_SEQUENCE_START_EVENT:
      case YAML_MAPPING_START_EVENT:
        if (b->depth >= MF_YAML_MAX_DEPTH) {
          st = place_err(b->src, line, col, "nested deeper than %d levels: not a moefit config%s",
                         MF_YAML_MAX_DEPTH, inside(b, in, sizeof in));
          break;
        }
        st = node_from_event(b, &ev, ev.type == YAML_MAPPING_START_EVENT ? MF_YMAP : MF_YSEQ, &n);
        if (st != MF_OK) break;
        /* attach first (checks it is not a key), then descend into it */
        st = attach(b, n);
        if (st == MF_OK) {
          b->pending_key[b->depth] = NULL;
          b->stack[b->depth++] = n;
        }
        break;
      case YAML_SEQUENCE_END_EVENT:
      case YAML_MAPPING_END_EVENT:
        if (b->depth > 0) {
          b->depth--;
          mf_ynode_free(b->pending_key[b->depth]); /* libyaml always pairs keys; be safe */
          b->pending_key[b->depth] = NULL;
        }
        break;
      default:
        break;
    }
    yaml_event_delete(&ev);
    if (st != MF_OK) return st;
  }
}

mf_status mf_yaml_parse(mf_ydoc *doc, const char *text, size_t len, const char *name, int cmdline,
                        mf_ynode **out) {
  *out = NULL;
  mf_ysrc *src = NULL;
  MF_CHECK(mf_calloc(1, sizeof *src, "config source", (void **)&src));
  src->name = mf_strdup(name ? name : "config");
  if (!src->name) {
    free(src);
    return MF_ERR(MF_ERR_OUT_OF_MEMORY, "out of memory");
  }
  src->cmdline = cmdline;
  src->next = doc->srcs;
  doc->srcs = src;

  MF_CHECK(check_text(src, text, len));
  yaml_parser_t p;
  if (!yaml_parser_initialize(&p))
    return MF_ERR(MF_ERR_OUT_OF_MEMORY, "%s: cannot start the YAML parser", src->name);
  yaml_parser_set_input_string(&p, (const unsigned char *)text, len);
  builder b;
  memset(&b, 0, sizeof b);
  b.src = src;
  b.text = text;
  b.len = len;
  mf_status st = build(&b, &p);
  yaml_parser_delete(&p);
  /* on an error the open nodes hang under the root; pending keys are loose */
  for (int d = 0; d <= MF_YAML_MAX_DEPTH; d++)
    if (b.pending_key[d]) mf_ynode_free(b.pending_key[d]);
  if (st != MF_OK) {
    mf_ynode_free(b.root);
    return st;
  }
  *out = b.root;
  return MF_OK;
}

void mf_ydoc_free(mf_ydoc *doc) {
  if (!doc) return;
  mf_ynode_free(doc->root);
  doc->root = NULL;
  while (doc->srcs) {
    mf_ysrc *next = doc->srcs->next;
    free(doc->srcs->name);
    free(doc->srcs);
    doc->srcs = next;
  }
}
