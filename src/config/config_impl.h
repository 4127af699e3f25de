/*
 * Private to src/config: the YAML node tree (yaml_tree.c) and the key table
 * (keys.c) that config.c maps the tree through and print.c prints from.
 */
#ifndef MF_CONFIG_IMPL_H
#define MF_CONFIG_IMPL_H

#include <stddef.h>

#include "src/config/config.h"

/* ------------------------------------------------------------ node tree */

/* Nesting deeper than this is an error (a config needs 4 levels). */
#define MF_YAML_MAX_DEPTH 32
/* Bigger files are not configs. */
#define MF_YAML_MAX_BYTES ((size_t)4 << 20)

/* Where nodes came from: a file, or one command-line override. */
typedef struct mf_ysrc {
  char *name;  /* file name, or the override text "train.lr=1e-4" */
  int cmdline; /* 0: a file; else the override's number on the command line (1-based) */
  struct mf_ysrc *next;
} mf_ysrc;

typedef enum mf_ykind { MF_YSCALAR, MF_YMAP, MF_YSEQ } mf_ykind;

typedef struct mf_ynode {
  mf_ykind kind;
  const mf_ysrc *src;
  int line, col; /* 1-based; 0 for nodes made by an override */
  struct mf_ynode *parent;
  struct mf_ynode *key; /* a map value's key node */
  size_t index;         /* a list item's index */
  char *text;           /* scalar text (NUL-terminated; may hold NULs within len) */
  size_t len;
  int quoted;    /* any style but plain: always a string */
  size_t n, cap; /* map: keys[i] -> vals[i]; list: vals[i] */
  struct mf_ynode **keys, **vals;
} mf_ynode;

typedef struct mf_ydoc {
  mf_ynode *root;
  mf_ysrc *srcs;
} mf_ydoc;

/* Parses one YAML document. *out is NULL for an empty stream. `cmdline` is 0
 * for a file, else the override's number (1-based). The source is owned by
 * doc; the returned tree is the caller's (mf_ynode_free). */
mf_status mf_yaml_parse(mf_ydoc *doc, const char *text, size_t len, const char *name, int cmdline,
                        mf_ynode **out);
void mf_ydoc_free(mf_ydoc *doc); /* frees root and sources */
void mf_ynode_free(mf_ynode *n);
mf_status mf_ynode_new(mf_ykind kind, const mf_ysrc *src, mf_ynode **out);
/* Appends key -> val (map) or val (list, key NULL), setting parent links. */
mf_status mf_ynode_append(mf_ynode *parent, mf_ynode *key, mf_ynode *val);

int mf_ynode_is_null(const mf_ynode *n); /* a plain null, ~, Null, NULL or empty scalar */
/* The value for `key` in a map (NULL when absent or not a map); i gets its index. */
mf_ynode *mf_ynode_get(const mf_ynode *map, const char *key, size_t *i);
/* "file:12:3", or "command line: train.lr=1e-4". */
const char *mf_ynode_loc(const mf_ynode *n, char *buf, size_t cap);
/* Where a value came from, for naming a second place in a message:
 * "set at file:12:3" or "set by override 2 'train.steps=20'". */
const char *mf_ynode_origin(const mf_ynode *n, char *buf, size_t cap);
/* The node that names a value's place: a value given by an override itself
 * (its key may be the file's), else its key in the file. */
const mf_ynode *mf_ynode_place(const mf_ynode *v);
/* The key path: "train.lr", "memory.overrides[1].match"; "" for the root. */
const char *mf_ynode_path(const mf_ynode *n, char *buf, size_t cap);
/* A short description for messages: "'text'", "null", "a map", "a list". */
const char *mf_ynode_describe(const mf_ynode *n, char *buf, size_t cap);

/* ------------------------------------------------------------ key table */

typedef enum mf_ckind {
  MF_CK_SECTION,   /* a map of keys */
  MF_CK_INT,       /* int64_t */
  MF_CK_U64,       /* uint64_t */
  MF_CK_FLOAT,     /* double, finite */
  MF_CK_BOOL,      /* int 0/1 */
  MF_CK_STR,       /* char *, owned */
  MF_CK_SIZE,      /* uint64_t bytes, "24GiB"; `auto` = MF_CONFIG_SIZE_AUTO */
  MF_CK_ENUM,      /* an int-sized enum: index into `choices` */
  MF_CK_FAMILY,    /* mf_family */
  MF_CK_INTLIST,   /* model.init.mlp_only_layers */
  MF_CK_NAMELIST,  /* train.lora.targets: names among `choices`, no repeats */
  MF_CK_OVERRIDES, /* memory.overrides */
} mf_ckind;

enum {
  MF_CK_REQUIRED = 1 << 0,
  MF_CK_NULLABLE = 1 << 1, /* null is a value (strings: NULL; numbers: NAN) */
  MF_CK_LO_OPEN = 1 << 2,  /* value > lo rather than >= lo */
  MF_CK_HI_OPEN = 1 << 3,  /* value < hi rather than <= hi */
  MF_CK_DOCDEF = 1 << 4,   /* `def` describes the default, it is set in code */
};

typedef struct mf_config_key {
  const char *path;
  mf_ckind kind;
  int flags;
  size_t off;          /* into mf_config */
  double lo, hi;       /* range of numbers */
  const char *choices; /* MF_CK_ENUM: "constant|linear|cosine" */
  const char *def;     /* the default as YAML text (NULL: none) */
  const char *help;
} mf_config_key;

extern const mf_config_key mf_config_keys[];
extern const size_t mf_config_n_keys;

/* Index of the key with this path, or -1. */
int mf_config_key_find(const char *path);
/* The keys' parent path: "train" for "train.lr", "" for "train". */
void mf_config_key_parent(const char *path, char *buf, size_t cap);
/* " (did you mean 'train.lr'?)" or " (known keys in 'train': ...)" for an unknown path. */
void mf_config_key_suggest(const char *path, const char *const *known, size_t n_known, char *buf, size_t cap);
/* The key's type and range for --help: "number > 0", "int >= 1", "size or auto". */
const char *mf_config_key_type(const mf_config_key *k, char *buf, size_t cap);
/* The n-th choice of an enum key ("a|b|c"), or NULL. */
const char *mf_config_key_choice(const mf_config_key *k, int n, char *buf, size_t cap);

#endif /* MF_CONFIG_IMPL_H */
