/*
 * The plan file's JSON text, read and written without a tree of allocations
 * (internal to planner/plan_io*.c).
 *
 * A real-size plan is large (61 layers x 256 experts: 16.7 MB, some 100000
 * entries), and jansson allocates a hash table per object and a string per
 * value: json_loadb took 0.58 s on that file and json_dumps 0.30 s, besides
 * building the tree (2 loaded cores). Here a parse is one pass into one array
 * of nodes, the strings decoded into one buffer; the writer appends to one
 * buffer. Both are linear in the text. A NUL byte is refused anywhere
 * (jansson drops one that follows a number).
 *
 * The parser takes what jansson's json_loadb(JSON_REJECT_DUPLICATES) takes:
 * an object or array at the top, RFC 8259 otherwise, strings valid UTF-8
 * without \u0000, integers within int64 (an integer is a number with no
 * fraction or exponent), no real that overflows, no key twice in an object,
 * nothing after the value but whitespace. Its errors are MF_ERR_FORMAT,
 * "<path>: line L, column C: invalid JSON: <what>".
 */
#ifndef MF_PLANNER_PLAN_IO_JSON_H
#define MF_PLANNER_PLAN_IO_JSON_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "src/core/core.h"

/* One JSON value. Its type is jansson's (json_type), so messages name it
 * the way the jansson-based readers do (mf_io_json_type_kind). */
typedef struct mf_pj {
  const char *key; /* an object member's key (decoded, NUL-terminated); NULL otherwise */
  union {
    int64_t i;     /* JSON_INTEGER */
    double r;      /* JSON_REAL */
    const char *s; /* JSON_STRING: decoded, NUL-terminated */
    int32_t first; /* JSON_ARRAY, JSON_OBJECT: index of the first element or member, -1 if none */
  } v;
  int32_t next; /* the next element or member of the enclosing array or object, -1 after the last */
  int32_t n;    /* JSON_ARRAY, JSON_OBJECT: how many elements or members */
  uint32_t at;  /* byte offset in the text: of the value, or of a member's key */
  uint8_t type; /* json_type */
} mf_pj;

typedef struct mf_pj_doc {
  mf_pj *node; /* node[0]: the top-level value */
  int32_t n, cap;
  char *strings; /* every decoded string, NUL-terminated, one after another */
} mf_pj_doc;

/* Parses text[0..len) (text[len] must be NUL) into doc. Deeper than
 * max_depth nested arrays and objects is refused where it starts ("<path>:
 * line L, column C: nests deeper than N levels; a plan needs 3"), before
 * recursing. On error doc holds nothing. */
mf_status mf_pj_parse(const char *path, const char *text, size_t len, int max_depth, mf_pj_doc *doc);
void mf_pj_free(mf_pj_doc *doc); /* a zeroed doc is fine */

/* Object obj's member `key`, or NULL. */
const mf_pj *mf_pj_get(const mf_pj_doc *doc, const mf_pj *obj, const char *key);
/* "an object", "a string", ...: as mf_io_json_kind. */
const char *mf_pj_kind(const mf_pj *v);
/* A jansson copy of v (an object without its member skip_key, when not NULL),
 * for the small parts a jansson-based helper checks; NULL when out of memory. */
json_t *mf_pj_to_jansson(const mf_pj_doc *doc, const mf_pj *v, const char *skip_key);

/* The length of the valid UTF-8 sequence at s (n bytes there; at most 4
 * read), or 0 when it is not one: an overlong form, a surrogate, past
 * U+10FFFF, cut short, or a stray continuation byte. */
size_t mf_pj_utf8_len(const unsigned char *s, size_t n);
/* 1 when the NUL-terminated s is UTF-8 throughout. */
int mf_pj_utf8_valid(const char *s);

/* ------------------------------------------------------------ writing */

/* Text appended to a growing buffer; after an allocation fails (oom) appends do nothing. */
typedef struct mf_pj_out {
  char *buf;
  size_t n, cap;
  int oom;
} mf_pj_out;

void mf_pj_put(mf_pj_out *o, const char *s, size_t n);
/* s as a JSON string (quoted; '"', '\\' and control bytes escaped as jansson does). */
void mf_pj_put_string(mf_pj_out *o, const char *s);
void mf_pj_put_i64(mf_pj_out *o, int64_t v);
/* A finite double as jansson prints one: "%.17g", ".0" added when that reads
 * as an integer, the exponent without '+' or leading zeros. */
void mf_pj_put_real(mf_pj_out *o, double v);

/* Indented output (jansson's JSON_INDENT(2) layout): open a container, then
 * before each member mf_pj_key (or each element mf_pj_elem), then close. */
#define MF_PJ_MAX_DEPTH 8
typedef struct mf_pj_writer {
  mf_pj_out out;
  int depth;
  int count[MF_PJ_MAX_DEPTH]; /* members written so far at each open level */
} mf_pj_writer;

void mf_pj_open(mf_pj_writer *w, char bracket); /* '{' or '[' */
void mf_pj_close(mf_pj_writer *w, char bracket);
void mf_pj_key(mf_pj_writer *w, const char *key); /* key: plain ASCII, written as it is */
void mf_pj_elem(mf_pj_writer *w);

#endif /* MF_PLANNER_PLAN_IO_JSON_H */
