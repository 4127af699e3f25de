/*
 * safetensors: read a single file or a sharded set through a read-only mmap,
 * and write single files or sharded sets atomically. The format: an 8-byte
 * little-endian header length N, N bytes of UTF-8 JSON (each tensor's name ->
 * dtype, shape and data_offsets [begin, end) into the data buffer; an optional
 * "__metadata__" map of strings; spaces may pad it), then the data buffer
 * (little-endian, row-major, covered by the tensors without holes).
 *
 * Reading validates everything before it hands out a pointer: the header
 * length (against the file and a 100 MB cap), the header JSON (an object,
 * UTF-8, no duplicate keys, at most MF_ST_MAX_JSON_DEPTH levels), every entry
 * ({dtype, shape, data_offsets} with the right JSON types and nothing else),
 * the dtype, the rank (<= MF_ST_MAX_DIMS), numel x dtype size (no overflow,
 * equal to the entry's extent), and the data buffer (sorted by offset the
 * tensors cover it from 0 to its end: no holes, no overlaps, nothing after).
 * A malformed file is MF_ERR_FORMAT; a file that cannot be opened or mapped is
 * MF_ERR_IO; a dtype that newer safetensors releases define but moefit does
 * not handle (F8_E8M0, F4, ...) is MF_ERR_UNSUPPORTED. Every message starts
 * with the file and names the place (tensor name, JSON key or byte offset).
 *
 * A sharded set is read through model.safetensors.index.json
 * ({"metadata": {"total_size": N, ...}, "weight_map": {name: shard}}). Its
 * rules, beyond each shard's own:
 *   - weight_map is required, an object of strings; metadata, if present, an
 *     object; metadata.total_size, if present, a non-negative integer. Other
 *     top-level keys are ignored.
 *   - a shard name is a plain file name in the index's directory (no '/',
 *     no '\\', not "." or ".."); every shard named must exist (else
 *     MF_ERR_FORMAT) and be a valid safetensors file.
 *   - every tensor in weight_map is in the shard it is mapped to; a tensor in
 *     a shard that weight_map maps to another shard, or a tensor found in two
 *     shards, is an error.
 *   - a shard tensor that weight_map does not list is kept (transformers loads
 *     whole shards, so it would too) with a warning.
 *   - total_size differing from the sum of the tensors' bytes is a warning:
 *     transformers never checks it and some exporters write other totals; the
 *     per-shard checks already catch truncated or damaged shards.
 *
 * The tensors of a set are in shard order, then data order within a shard.
 * A mapping stays valid until mf_safetensors_close; if another process
 * truncates a mapped file, reading it raises SIGBUS (that is mmap's contract).
 */
#ifndef MF_IO_SAFETENSORS_H
#define MF_IO_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "src/core/core.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MF_ST_MAX_DIMS 8
#define MF_ST_MAX_HEADER_BYTES 100000000ull /* the reference implementation's cap */
#define MF_ST_MAX_INDEX_BYTES 100000000ull
/* A header is an object of objects holding one array: 3 levels; 4 lets type
 * errors one level down get a precise message instead of a nesting one. */
#define MF_ST_MAX_JSON_DEPTH 4

/* One tensor. Reading fills every field; writing reads name, dtype, ndim,
 * shape and data (or fill), and ignores the others. */
typedef struct mf_st_tensor {
  const char *name;
  mf_dtype dtype;
  int ndim; /* 0 (a scalar) .. MF_ST_MAX_DIMS */
  int64_t shape[MF_ST_MAX_DIMS];
  uint64_t numel;   /* product of shape (1 for a scalar) */
  size_t nbytes;    /* numel x dtype size */
  const void *data; /* into the mapping (read); the bytes to write (write) */
  uint64_t offset;  /* byte offset of the data in its shard file */
  int shard;        /* index of its shard file (0 for a single file) */
  /* Writing, with data NULL: fill(fill_ctx, t, dst) puts the tensor's bytes
   * into dst, the writer's buffer of one tensor, when the file reaches it:
   * tensors made on the fly (a merged LoRA weight), never all in memory at
   * once. A failing status ends the write. */
  mf_status (*fill)(void *fill_ctx, const struct mf_st_tensor *t, void *dst);
  void *fill_ctx;
} mf_st_tensor;

/* A __metadata__ (or index metadata) entry. */
typedef struct mf_st_meta {
  const char *key;
  const char *value;
} mf_st_meta;

typedef struct mf_safetensors mf_safetensors;

/* ------------------------------------------------------------------ read */

/* Opens PATH: a .safetensors file; a model.safetensors.index.json (any
 * *.json is read as an index); a shard named PREFIX-NNNNN-of-NNNNN.safetensors
 * with PREFIX.safetensors.index.json beside it (the whole set is opened, and
 * the shard must be one of it); or a directory holding model.safetensors or
 * model.safetensors.index.json (the single file wins, as in transformers,
 * with a warning when both are there). */
mf_status mf_safetensors_open(const char *path, mf_safetensors **out);
/* Opens exactly one file, even when it is a shard of a set. */
mf_status mf_safetensors_open_file(const char *path, mf_safetensors **out);
/* Parses a whole safetensors image in memory (the fuzz target and tests use
 * it). `label` names it in messages; data pointers point into `bytes`, which
 * must outlive the handle. */
mf_status mf_safetensors_open_buffer(const char *label, const void *bytes, size_t size, mf_safetensors **out);
void mf_safetensors_close(mf_safetensors *st); /* NULL is fine */

size_t mf_safetensors_count(const mf_safetensors *st);
/* The i-th tensor, or NULL when i is out of range. */
const mf_st_tensor *mf_safetensors_get(const mf_safetensors *st, size_t i);
/* By exact name (binary search); NULL when absent. */
const mf_st_tensor *mf_safetensors_find(const mf_safetensors *st, const char *name);
/* Sum of every tensor's nbytes. */
uint64_t mf_safetensors_total_bytes(const mf_safetensors *st);

/* __metadata__, in file order; for a set, the union over the shards (the
 * first shard that has a key gives its value). */
size_t mf_safetensors_metadata_count(const mf_safetensors *st);
const mf_st_meta *mf_safetensors_metadata_at(const mf_safetensors *st, size_t i);
const char *mf_safetensors_metadata(const mf_safetensors *st, const char *key); /* NULL if absent */

/* Shards: 1 for a single file. Paths are as opened (index dir + shard name). */
size_t mf_safetensors_shard_count(const mf_safetensors *st);
const char *mf_safetensors_shard_path(const mf_safetensors *st, size_t i);
/* The index file of a set; NULL for a single file. */
const char *mf_safetensors_index_path(const mf_safetensors *st);
/* The index's "metadata" object; values that are not strings are given as
 * compact JSON ("total_size" -> "123"). Empty for a single file. */
size_t mf_safetensors_index_metadata_count(const mf_safetensors *st);
const mf_st_meta *mf_safetensors_index_metadata_at(const mf_safetensors *st, size_t i);

/* ----------------------------------------------------------------- write */

/* Writes one safetensors file the way the reference writer does, byte for
 * byte (tests/safetensors/safetensors_reference_test): tensors ordered by
 * dtype descending in the reference's dtype order (which is by size, so by
 * alignment: U64 I64 F64 F32 U32 I32 BF16 F16 U16 I16 F8_E4M3 F8_E5M2 I8 U8
 * BOOL), then by name, so each tensor is naturally aligned; the header padded
 * with spaces to a multiple of 8 so the data starts 8-byte aligned;
 * __metadata__ first, always holding "format": "pt" (a caller's "format"
 * other than "pt" is refused), then the caller's entries in their order.
 *
 * Names must be non-empty, valid UTF-8, unique and not "__metadata__"; dtype
 * known; ndim 0..MF_ST_MAX_DIMS; dims >= 0; data non-NULL unless nbytes is 0.
 * All of it is checked before anything is written (MF_ERR_INVALID_ARG).
 *
 * Atomic: the file is written as PATH.tmp, fsynced and renamed over PATH, and
 * the directory fsynced. On any failure PATH.tmp is removed and an existing
 * PATH is left as it was. */
mf_status mf_safetensors_write(const char *path, const mf_st_tensor *tensors, size_t n,
                               const mf_st_meta *metadata, size_t n_metadata);

/* Writes a sharded set into DIR (created if missing, one level), as
 * transformers' save_pretrained does: tensors in the caller's order are packed
 * greedily into shards of at most max_shard_bytes tensor bytes (a larger
 * tensor gets a shard of its own), written as model-00001-of-0000N.safetensors
 * (each like mf_safetensors_write), plus model.safetensors.index.json (indent
 * 2, sorted keys, metadata.total_size = the sum of tensor bytes). When
 * everything fits in one shard, DIR/model.safetensors is written and no index,
 * like transformers. Every file goes to a .tmp name first; only when all are
 * complete and fsynced are they renamed, shards first and the index last, so
 * an index never names a shard that is not there yet. Files of an earlier
 * save that the new set does not use (model.safetensors, the index, other
 * model-*-of-*.safetensors) are then removed, since loaders would otherwise
 * pick up the stale single file first. *n_shards (may be NULL) gets the count. */
mf_status mf_safetensors_write_sharded(const char *dir, const mf_st_tensor *tensors, size_t n,
                                       const mf_st_meta *metadata, size_t n_metadata,
                                       uint64_t max_shard_bytes, size_t *n_shards);

/* Where mf_safetensors_write_stream puts the bytes: all n of them or a
 * failing status (which ends the stream). */
typedef mf_status (*mf_st_sink)(void *ctx, const void *bytes, size_t n);

/* The bytes mf_safetensors_write would put in a file (the same checks, the
 * same layout), handed to `sink` in order instead: the 8-byte length and
 * header, then each tensor's data in file order. For writers that transform
 * the stream (a compressor, a checksum); `label` names it in messages. */
mf_status mf_safetensors_write_stream(const char *label, const mf_st_tensor *tensors, size_t n,
                                      const mf_st_meta *metadata, size_t n_metadata, mf_st_sink sink, void *ctx);

#ifdef __cplusplus
}
#endif

#endif /* MF_IO_SAFETENSORS_H */
