/*
 * Private to src/io (not part of its API): the safetensors reader's handle and
 * what its two halves share: the header parser and validator
 * (safetensors_parse.c) and the openers of single files, buffers and sharded
 * sets (safetensors_open.c).
 *
 * Layout of a file: u64 LE header length N | N bytes of JSON | data buffer.
 * A header entry's data_offsets are relative to the data buffer (8 + N).
 */
#ifndef MF_IO_SAFETENSORS_IMPL_H
#define MF_IO_SAFETENSORS_IMPL_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "src/io/json_util.h"
#include "src/io/safetensors.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors data is little-endian; moefit assumes a little-endian host"
#endif

/* Names can be long (or hostile): messages show at most 200 bytes of one. */
#define QNAME "\"%.200s\""

/* Names and metadata strings live in chunks that never move, freed at close. */
typedef struct st_chunk {
  struct st_chunk *next;
  size_t used, cap;
  char data[];
} st_chunk;

typedef struct st_shard {
  char *path;
  const uint8_t *base; /* the whole file (or the caller's buffer) */
  size_t size;
  int mapped;      /* munmap at close */
  size_t first, n; /* its tensors in mf_safetensors.tensors */
} st_shard;

struct mf_safetensors {
  char *index_path;
  st_shard *shards;
  size_t n_shards;
  mf_st_tensor *tensors;
  size_t n, cap;
  size_t *by_name; /* tensor indices sorted by name */
  mf_st_meta *meta;
  size_t n_meta, cap_meta;
  mf_st_meta *index_meta;
  size_t n_index_meta;
  uint64_t total_bytes;
  st_chunk *pool;
};

/* safetensors messages name a boolean by its value: "shape[0] is true". */
static inline const char *st_json_kind(const json_t *v) {
  return mf_io_json_kind(v, 1);
}

/* Appends {key, value[0, value_len)} (copied into st's pool) to arr. */
mf_status mf_st_add_meta(mf_safetensors *st, mf_st_meta **arr, size_t *n, size_t *cap, const char *key,
                         const char *value, size_t value_len);

/* Parses JSON text (an object expected) with duplicate keys refused and at most
 * max_depth levels of nesting; `base` is the file offset of p[0], for messages. */
mf_status mf_st_json_load(const char *label, const char *what, const uint8_t *p, size_t n, size_t base,
                          int max_depth, json_t **out);

/* A non-negative JSON integer: 1 and *out set, else 0. */
int mf_st_json_uint(const json_t *v, uint64_t *out);

/* Parses and validates the file image bytes[0, size) as shard `shard` of st,
 * appending its tensors (sorted by offset) and merging its __metadata__. */
mf_status mf_st_parse(mf_safetensors *st, int shard, const char *label, const uint8_t *bytes, size_t size);

#endif /* MF_IO_SAFETENSORS_IMPL_H */
