/*
 * libFuzzer target for the safetensors header parser (mf_safetensors_open_buffer).
 * Beyond "no crash, no leak, no UB" (ASan/UBSan), it checks what the parser
 * promises: a rejected input gives no handle and a message naming the input;
 * an accepted one has tensors that tile the data buffer exactly, in offset
 * order, with nbytes = numel x dtype size, unique names and metadata that
 * looks itself up. A broken promise aborts, which the fuzzer reports.
 *
 * Built two ways (tests/safetensors/BUILD): with fuzz_driver.c (a plain test
 * that replays seeds and deterministic mutations), or with clang's libFuzzer
 * under --config=fuzz.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "src/io/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define CHECK(cond)                                                                                       \
  do {                                                                                                    \
    if (!(cond)) {                                                                                        \
      fprintf(stderr, "fuzz_safetensors: broken promise: %s (last error: %s)\n", #cond, mf_last_error()); \
      abort();                                                                                            \
    }                                                                                                     \
  } while (0)

static const char k_label[] = "fuzz.safetensors";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  mf_safetensors *st = (mf_safetensors *)(uintptr_t)1;
  mf_error_clear();
  mf_status s = mf_safetensors_open_buffer(k_label, data, size, &st);
  if (s != MF_OK) {
    CHECK(st == NULL);
    CHECK(s == MF_ERR_FORMAT || s == MF_ERR_UNSUPPORTED || s == MF_ERR_OUT_OF_MEMORY);
    CHECK(strstr(mf_last_error(), k_label) != NULL);
    return 0;
  }
  CHECK(size >= 8);
  uint64_t hlen = 0;
  for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | data[i];
  uint64_t pos = 8 + hlen, total = 0;
  volatile uint8_t sink = 0;
  for (size_t i = 0; i < mf_safetensors_count(st); i++) {
    const mf_st_tensor *t = mf_safetensors_get(st, i);
    CHECK(t != NULL && t->name != NULL);
    CHECK(t->ndim >= 0 && t->ndim <= MF_ST_MAX_DIMS);
    CHECK(mf_dtype_size(t->dtype) > 0);
    uint64_t numel = 1;
    for (int d = 0; d < t->ndim; d++) {
      CHECK(t->shape[d] >= 0);
      numel *= (uint64_t)t->shape[d]; /* cannot wrap: the parser refused that */
    }
    CHECK(numel == t->numel);
    CHECK(t->nbytes == numel * mf_dtype_size(t->dtype));
    CHECK(t->offset == pos); /* in offset order, contiguous */
    CHECK(t->data == data + t->offset);
    CHECK(t->offset + t->nbytes <= size);
    if (t->nbytes) sink ^= ((const uint8_t *)t->data)[0] ^ ((const uint8_t *)t->data)[t->nbytes - 1];
    CHECK(mf_safetensors_find(st, t->name) == t);
    CHECK(t->shard == 0);
    pos += t->nbytes;
    total += t->nbytes;
  }
  (void)sink;
  CHECK(pos == size); /* the data buffer is covered to its end */
  CHECK(total == mf_safetensors_total_bytes(st));
  CHECK(mf_safetensors_get(st, mf_safetensors_count(st)) == NULL);
  for (size_t i = 0; i < mf_safetensors_metadata_count(st); i++) {
    const mf_st_meta *m = mf_safetensors_metadata_at(st, i);
    CHECK(m && m->key && m->value);
    CHECK(strcmp(mf_safetensors_metadata(st, m->key), m->value) == 0);
  }
  CHECK(mf_safetensors_shard_count(st) == 1);
  CHECK(mf_safetensors_index_path(st) == NULL);
  mf_safetensors_close(st);
  return 0;
}
