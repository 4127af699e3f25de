/* Private to src/ckpt: names and limits shared by writing and reading. */
#ifndef MF_CKPT_INTERNAL_H
#define MF_CKPT_INTERNAL_H

#include "src/ckpt/ckpt.h"

#define MF_CKPT_FORMAT "moefit-checkpoint"
#define MF_CKPT_VERSION 1
#define MF_CKPT_HASH_NAME "fnv1a64-le64-words"
#define MF_CKPT_MAX_FILES 16
#define MF_CKPT_MAX_JSON (16u << 20) /* manifest.json, state.json, config.yaml */

/* One file of a checkpoint as the manifest lists it. */
typedef struct mf_ckpt_file {
  char name[64];
  uint64_t bytes;     /* on disk */
  uint64_t hash;      /* mf_ckpt_hash64 of those bytes */
  uint64_t raw_bytes; /* before compression (== bytes when none) */
  int zstd;           /* 1: one zstd frame */
} mf_ckpt_file;

/* Removes the plain files of dir and dir itself (a checkpoint holds no
 * subdirectories); a missing dir is fine. */
mf_status mf_ckpt_remove_dir(const char *dir);

/* "step-NNNNNN" -> N (>= 0), else -1. */
int64_t mf_ckpt_parse_step_name(const char *name);

#endif /* MF_CKPT_INTERNAL_H */
