/* Private to src/ckpt: names and limits shared by writing and reading. */
#ifndef MF_CKPT_INTERNAL_H
#define MF_CKPT_INTERNAL_H

#include <jansson.h>

#include "src/ckpt/ckpt.h"

#define MF_CKPT_FORMAT "moefit-checkpoint"
/* 2: the manifest sealed (manifest_hash), every file listed with its raw
 * checksum and explicit filter; state.json's filter and ranks always given.
 * 1 (no manifest_hash) is refused: what it says about its files is unchecked. */
#define MF_CKPT_VERSION 2
#define MF_CKPT_HASH_NAME "fnv1a64-le64-words"
#define MF_CKPT_MAX_FILES 16
#define MF_CKPT_MAX_JSON (16u << 20) /* manifest.json, state.json, config.yaml */

/* The byte-plane filter (ckpt.h; planes.c): a file's tensor data (after the
 * safetensors header, all of one dtype of w bytes) cut into blocks of
 * MF_CKPT_PLANE_BLOCK bytes (the last one shorter), each block's `bytes` (a
 * multiple of w) of w-byte elements <-> w planes of bytes / w bytes, plane b
 * holding every element's byte b. dst and src do not overlap. Blocks of 4 MiB
 * keep each plane at least as long as a zstd block (128 KiB) for the
 * 2-byte and 4-byte dtypes: shorter blocks mix planes in one zstd block and
 * lose much of the gain (the demo's master weights at zstd-1: 1.10x with
 * 128 KiB blocks, 1.18x with 1 MiB, 1.18x with 4 MiB). */
#define MF_CKPT_PLANE_BLOCK ((size_t)4 << 20)
void mf_ckpt_planes_split(void *dst, const void *src, size_t bytes, size_t w);
void mf_ckpt_planes_join(void *dst, const void *src, size_t bytes, size_t w);

/* ------------------------------------------------ manifest.c, state.c */

/* manifest.json read, its seal checked, parsed strictly (ckpt.h): a file
 * listed here is a known checkpoint file, listed once, and the required
 * ones are all here; no known file on disk is left out. */
typedef struct mf_ckpt_manifest {
  char dir[4200];
  mf_ckpt_file files[MF_CKPT_MAX_FILES];
  int n;
} mf_ckpt_manifest;

mf_status mf_ckpt_manifest_load(const char *dir, mf_ckpt_manifest *m);
/* The entry of `name` (NULL: not listed); of <stem>.safetensors[.zst]. */
const mf_ckpt_file *mf_ckpt_manifest_find(const mf_ckpt_manifest *m, const char *name);
const mf_ckpt_file *mf_ckpt_manifest_tensors(const mf_ckpt_manifest *m, const char *stem);
/* Appends the seal line (and the closing brace) to the manifest's text[n]
 * (its body, ending with the files array): the new length, 0 past cap. */
size_t mf_ckpt_manifest_seal(char *text, size_t n, size_t cap);
/* A JSON object sealed by its last member: text[n], its body (ending with
 * ",\n"), gets '  "KEY": "<mf_ckpt_hash64 of the body>"\n}\n': the new length, 0 past cap. */
size_t mf_ckpt_json_seal(char *text, size_t n, size_t cap, const char *key);
/* 1 when text[len] ends with KEY's seal line: *want its checksum, *body the
 * bytes before it; else 0. */
int mf_ckpt_json_sealed(const char *text, size_t len, const char *key, uint64_t *want, size_t *body);

/* dir/f->name mapped, its size and checksum checked (MF_ERR_FORMAT naming it). */
mf_status mf_ckpt_map_checked(const char *dir, const mf_ckpt_file *f, const uint8_t **base, size_t *size);
/* A small file of the checkpoint (at most MF_CKPT_MAX_JSON) read whole and
 * checked against its entry: *text malloc'd and NUL-terminated. */
mf_status mf_ckpt_read_checked(const mf_ckpt_manifest *m, const char *name, char **text, size_t *len);

/* "<path>: <place>.<key>: expected ..." readers of JSON values. */
mf_status mf_ckpt_json_u64(const char *path, const json_t *o, const char *place, const char *key, uint64_t *out);
mf_status mf_ckpt_json_str(const char *path, const json_t *o, const char *place, const char *key, const char **out);
mf_status mf_ckpt_json_hex(const char *path, const json_t *o, const char *place, const char *key, uint64_t *out);

/* state.json, verified against the manifest, parsed and checked in itself
 * (skipped <= step <= train_steps, the data position inside its windows,
 * ranks >= 1) and against the manifest (its compression and filter are the
 * tensor files'). What needs the run's table is the reader's (read.c). */
typedef struct mf_ckpt_state_file {
  char path[4400];
  json_t *root;
  mf_ckpt_state s;
  uint64_t params, numel, experts_routed;
  mf_dtype moments;
  int has_base;     /* base_sum and base_sum_of given (a LoRA run's) */
  uint64_t base_sum;
  int base_bf16;
} mf_ckpt_state_file;

mf_status mf_ckpt_state_open(const mf_ckpt_manifest *m, mf_ckpt_state_file *f);
void mf_ckpt_state_close(mf_ckpt_state_file *f);

/* Removes the plain files of dir and dir itself (a checkpoint holds no
 * subdirectories); a missing dir is fine. */
mf_status mf_ckpt_remove_dir(const char *dir);

/* "step-NNNNNN" -> N (>= 0), else -1. */
int64_t mf_ckpt_parse_step_name(const char *name);

#endif /* MF_CKPT_INTERNAL_H */
