/*
 * A base's identity: what a checkpoint or an adapter dir remembers of the model
 * its run trained on, so that its weights are never applied to another. Two
 * parts: the base's spec (every field of its config.json, or of model.init,
 * that changes the maths: spec.h) and a checksum of each of its weights as
 * loaded (a LoRA run's frozen ones, whose values its adapters were trained
 * over; a full fine-tune's every one, as it started from them).
 *
 * The record is JSON, written as a checkpoint's base.json and as
 * moefit_base.json beside PEFT's files in an adapter dir or a run's final/
 * (PEFT and transformers ignore files they do not know):
 *
 *   {"moefit_base": 2, "about": "...",
 *    "model": "model.path", "path": "/abs/base"      (or "model": "model.init", "seed": 7),
 *    "spec": {"family": "qwen2_moe", "hidden": 64, ..., "rope_theta": 1000000.0, ...},
 *    "weights": {"dtype": "fp32", "of": "frozen",
 *                "tensors": [["model.embed_tokens.weight", "0123456789abcdef"], ...]},
 *    "files": [["adapter_model.safetensors", 81920, "0123456789abcdef"], ...],  (an adapter dir's)
 *    "record_hash": "0123456789abcdef"}                                       (an adapter dir's)
 *
 * The checksums are computed above this module (src/train: mf_ckpt_hash64 of
 * each tensor's bytes, fp32 or bf16); this module builds, writes, reads and
 * compares records.
 */
#ifndef MF_MODEL_BASE_ID_H
#define MF_MODEL_BASE_ID_H

#include <stddef.h>
#include <stdint.h>

#include "src/core/core.h"
#include "src/model/params.h"
#include "src/model/spec.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The record's file in an adapter dir or a run's final/. */
#define MF_BASE_ID_FILE "moefit_base.json"

typedef struct mf_base_tensor {
  char name[96]; /* mf_param.name */
  uint64_t sum;  /* the checksum of its values (dtype below) */
} mf_base_tensor;

/* A file of an adapter dir as it was written (adapter_model.safetensors,
 * adapter_config.json): PEFT's files carry no checksum of their own, so the
 * record carries theirs and `eval` refuses one that changed (src/ckpt:
 * mf_ckpt_adapter_record_write, mf_ckpt_adapter_record_read). */
#define MF_BASE_ID_MAX_FILES 4
typedef struct mf_base_file {
  char name[64];
  uint64_t bytes;
  uint64_t sum; /* mf_ckpt_hash64 of its bytes */
} mf_base_file;

typedef struct mf_base_id {
  int version;        /* the record's, as read (MF_BASE_ID_VERSION as made) */
  mf_model_spec spec; /* spec.seed counts only with from_init */
  int from_init;      /* model.init: random weights from spec.seed */
  char path[4096];    /* model.path (absolute when it resolves); "" with from_init */
  int bf16;           /* the checksums are of the weights' bf16 values, else of their fp32 ones */
  int frozen_only;    /* the tensors are the frozen ones (LoRA's base), else every weight of the model */
  /* LoRA's base stored quantized (train.lora.base_dtype): "nf4 b64", "nf4 b64 dq" or "fp8", its
   * quantized weights' checksums those of their blobs; "" for a base in its float dtype */
  char stored[24];
  int64_t n;          /* tensors; 0: the weights are not known (the spec alone is compared) */
  mf_base_tensor *tensors;
  int n_files; /* an adapter dir's files (above); 0: none recorded */
  mf_base_file files[MF_BASE_ID_MAX_FILES];
} mf_base_id;

/* The record's version: 2 adds "files" and the closing "record_hash" (the
 * checksum of every byte above it, src/ckpt) to an adapter dir's record; a
 * version 1 record has neither. */
#define MF_BASE_ID_VERSION 2

/* b for the base of table t (its spec; model.path `path`, or NULL for
 * model.init): the names of the tensors the checksums cover (t's frozen
 * parameters with frozen_only, else every parameter of the model's own),
 * their sums 0 for the caller to fill. */
mf_status mf_base_id_init(mf_base_id *b, const mf_param_table *t, const char *path, int frozen_only,
                          int bf16);
/* b for a spec alone (n 0): what is compared before any weights are loaded. */
void mf_base_id_init_spec(mf_base_id *b, const mf_model_spec *spec, const char *path);
void mf_base_id_free(mf_base_id *b); /* its tensors; b itself is the caller's */

/* The record as JSON text (malloc'd, NUL-terminated; the caller frees). */
mf_status mf_base_id_format(const mf_base_id *b, char **json);
/* The record from JSON text; `where` names its source in messages
 * (MF_ERR_FORMAT "WHERE: KEY: fault"). */
mf_status mf_base_id_parse(const char *text, size_t len, const char *where, mf_base_id *out);
/* The record in file `path`; *found 0 (and out zeroed) when there is no such file. */
mf_status mf_base_id_read(const char *path, mf_base_id *out, int *found);
/* The record file `path` as text (malloc'd, NUL-terminated; *text NULL when
 * there is no such file), for a reader that checks its bytes before parsing. */
mf_status mf_base_id_read_text(const char *path, char **text, size_t *len);
/* DIR/moefit_base.json, written atomically. */
mf_status mf_base_id_write(const char *dir, const mf_base_id *b);

/* "model.path /abs/base" or "model.init (qwen2_moe, seed 7)". */
void mf_base_id_describe(const mf_base_id *b, char *buf, size_t cap);

/* The base `have` (as loaded now) against the record `rec` (read from
 * `where`): MF_OK when they are the same base; else MF_ERR_CONFIG naming
 * `where`, the first spec field that differs (with its config.json key) or
 * the first tensor whose checksum differs (or that one of them lacks), both
 * values, what the run trained on and the way out: "WHERE: rope_theta: WHO
 * trained on a base (model.path /b, as it was then) with rope_theta
 * 1000000.0; the base loaded now (model.path /b) has rope_theta 10000.0:
 * WAY_OUT" (WHO "the run", "the adapters of DIR were"). With
 * have->n 0 the spec alone is compared. Checksums of another dtype than the
 * record's cannot be compared: the caller computes them in the record's
 * (MF_ERR_INTERNAL otherwise). */
mf_status mf_base_id_compare(const mf_base_id *rec, const char *where, const mf_base_id *have,
                             const char *who, const char *way_out);

#ifdef __cplusplus
}
#endif

#endif /* MF_MODEL_BASE_ID_H */
