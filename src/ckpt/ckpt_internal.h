/* Private to src/ckpt: names and limits shared by writing and reading. */
#ifndef MF_CKPT_INTERNAL_H
#define MF_CKPT_INTERNAL_H

#include "src/ckpt/ckpt.h"

#define MF_CKPT_FORMAT "moefit-checkpoint"
#define MF_CKPT_VERSION 1
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

/* Removes the plain files of dir and dir itself (a checkpoint holds no
 * subdirectories); a missing dir is fine. */
mf_status mf_ckpt_remove_dir(const char *dir);

/* "step-NNNNNN" -> N (>= 0), else -1. */
int64_t mf_ckpt_parse_step_name(const char *name);

#endif /* MF_CKPT_INTERNAL_H */
