/* An adapter dir's record (ckpt.h mf_ckpt_adapter_record_write/_read): the
 * base's record (src/model/base_id.h) with the size and checksum of each
 * file PEFT reads, sealed by the checksum of its own bytes. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "src/ckpt/ckpt.h"
#include "src/ckpt/ckpt_internal.h"
#include "src/core/core.h"
#include "src/model/base_id.h"

#define SEAL_KEY "record_hash"

/* The files of an adapter dir that change what its adapters compute. */
static const char *const k_files[] = {"adapter_model.safetensors", "adapter_config.json"};
#define N_FILES ((int)(sizeof k_files / sizeof k_files[0]))

/* dir/name's size and checksum (mapped: an adapter file can be GBs). */
static mf_status file_sum(const char *dir, const char *name, uint64_t *bytes, uint64_t *sum) {
  char path[4400];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  const uint8_t *base = NULL;
  size_t size = 0;
  MF_CHECK(mf_map_file(path, &base, &size, NULL));
  *bytes = size;
  *sum = mf_ckpt_hash64(base, size);
  mf_unmap_file(base, size);
  return MF_OK;
}

mf_status mf_ckpt_adapter_record_write(const char *dir, const char *base_json, int files) {
  mf_base_id b;
  MF_CHECK(mf_base_id_parse(base_json, strlen(base_json), "the base's record", &b));
  mf_status st = MF_OK;
  for (int i = 0; files && i < N_FILES && st == MF_OK; i++) {
    snprintf(b.files[i].name, sizeof b.files[i].name, "%s", k_files[i]);
    st = file_sum(dir, k_files[i], &b.files[i].bytes, &b.files[i].sum);
  }
  b.n_files = files ? N_FILES : 0;
  char *json = NULL;
  if (st == MF_OK) st = mf_base_id_format(&b, &json);
  mf_base_id_free(&b);
  if (st != MF_OK) return st;
  /* "...\n}\n" becomes "...,\n" and the seal line, then "}\n" again */
  const size_t len = strlen(json), cap = len + 128;
  char *text = NULL;
  st = len >= 3 && strcmp(json + len - 3, "\n}\n") == 0
           ? mf_malloc(cap, "the adapters' record", (void **)&text)
           : MF_ERR(MF_ERR_INTERNAL, "the base's record does not end with its closing brace");
  if (st == MF_OK) {
    memcpy(text, json, len - 3);
    memcpy(text + len - 3, ",\n", 2);
    const size_t n = mf_ckpt_json_seal(text, len - 1, cap, SEAL_KEY);
    char path[4400];
    snprintf(path, sizeof path, "%s/%s", dir, MF_BASE_ID_FILE);
    st = n ? mf_write_file_atomic(path, text, n) : MF_ERR(MF_ERR_INTERNAL, "%s: no room for its seal", path);
  }
  free(text);
  free(json);
  return st;
}

/* The record's seal against its bytes (*sealed 0: it has none). */
static mf_status check_seal(const char *path, const char *text, size_t len, int *sealed) {
  uint64_t want = 0;
  size_t body = 0;
  *sealed = mf_ckpt_json_sealed(text, len, SEAL_KEY, &want, &body);
  if (!*sealed) return MF_OK;
  const uint64_t h = mf_ckpt_hash64(text, body);
  if (h != want)
    return MF_ERR(MF_ERR_FORMAT, "%s: checksum %016llx, its record_hash says %016llx (the record is damaged)",
                  path, (unsigned long long)h, (unsigned long long)want);
  return MF_OK;
}

/* The adapter dir's files against the record's sizes and checksums. */
static mf_status check_files(const char *dir, const char *path, const mf_base_id *rec) {
  for (int k = 0; k < N_FILES; k++) {
    const mf_base_file *f = NULL;
    for (int i = 0; i < rec->n_files; i++)
      if (strcmp(rec->files[i].name, k_files[k]) == 0) f = &rec->files[i];
    if (!f)
      return MF_ERR(MF_ERR_FORMAT,
                    "%s: lists no %s: the run or export that wrote %s stopped before it finished (resume the run, "
                    "or export the adapters again)",
                    path, k_files[k], dir);
    uint64_t bytes = 0, sum = 0;
    MF_CHECK(file_sum(dir, f->name, &bytes, &sum));
    if (bytes != f->bytes || sum != f->sum)
      return MF_ERR(MF_ERR_FORMAT,
                    "%s/%s: %llu bytes, checksum %016llx; %s recorded %llu bytes, checksum %016llx when they were "
                    "written: the file was changed or damaged since. Export the adapters again from the run's "
                    "checkpoint; an adapter changed on purpose (PEFT saved it again) is evaluated once %s is "
                    "removed, its base then unchecked",
                    dir, f->name, (unsigned long long)bytes, (unsigned long long)sum, MF_BASE_ID_FILE,
                    (unsigned long long)f->bytes, (unsigned long long)f->sum, MF_BASE_ID_FILE);
  }
  return MF_OK;
}

mf_status mf_ckpt_adapter_record_read(const char *dir, mf_base_id *rec, int *found) {
  memset(rec, 0, sizeof *rec);
  *found = 0;
  char path[4400];
  snprintf(path, sizeof path, "%s/%s", dir, MF_BASE_ID_FILE);
  char *text = NULL;
  size_t len = 0;
  MF_CHECK(mf_base_id_read_text(path, &text, &len));
  if (!text) return MF_OK;
  /* The seal first: a damaged record is reported as damaged, whatever it says */
  int sealed = 0;
  mf_status st = check_seal(path, text, len, &sealed);
  if (st == MF_OK) st = mf_base_id_parse(text, len, path, rec);
  free(text);
  /* Version 1 (before the files were recorded) has no seal and no files */
  if (st == MF_OK && rec->version >= 2 && !sealed)
    st = MF_ERR(MF_ERR_FORMAT,
                "%s: its last line is not the record_hash line (\"record_hash\": \"<16 hex digits>\" then \"}\"): "
                "the record is damaged or cut short",
                path);
  if (st == MF_OK && rec->version >= 2) st = check_files(dir, path, rec);
  if (st == MF_OK && rec->version < 2)
    MF_LOGW("eval",
            "%s: a record of version %d, from a moefit before adapter files were checksummed: whether %s's "
            "adapter_model.safetensors and adapter_config.json are as they were written cannot be checked",
            path, rec->version, dir);
  if (st != MF_OK) {
    mf_base_id_free(rec);
    return st;
  }
  *found = 1;
  return MF_OK;
}
