/* mf_ckpt_hash64: FNV-1a 64 over little-endian 8-byte words (ckpt.h). A
 * word at a time rather than a byte: one multiply per 8 bytes keeps it near
 * memory speed for a checkpoint's gigabytes, and it needs no table. */
#include <string.h>

#include "src/ckpt/ckpt.h"

#define FNV_OFFSET 0xcbf29ce484222325ull
#define FNV_PRIME 0x100000001b3ull

static uint64_t load_le64(const uint8_t *p) {
  uint64_t x = 0;
  for (int i = 7; i >= 0; i--) x = x << 8 | p[i];
  return x;
}

static uint64_t mix(uint64_t h, uint64_t word) { return (h ^ word) * FNV_PRIME; }

void mf_ckpt_hash_init(mf_ckpt_hash *s) {
  memset(s, 0, sizeof *s);
  s->h = FNV_OFFSET;
}

void mf_ckpt_hash_update(mf_ckpt_hash *s, const void *bytes, size_t n) {
  const uint8_t *p = bytes;
  s->len += n;
  while (n && s->n_tail) { /* finish a word begun by an earlier call */
    s->tail[s->n_tail++] = *p++;
    n--;
    if (s->n_tail == 8) {
      s->h = mix(s->h, load_le64(s->tail));
      s->n_tail = 0;
    }
  }
  if (s->n_tail) return; /* all n bytes went into the unfinished word */
  uint64_t h = s->h;
  for (; n >= 8; p += 8, n -= 8) h = mix(h, load_le64(p));
  s->h = h;
  if (n) memcpy(s->tail, p, n); /* (an empty input may be NULL) */
  s->n_tail = (unsigned)n;
}

uint64_t mf_ckpt_hash_final(const mf_ckpt_hash *s) {
  uint64_t h = s->h;
  if (s->n_tail) {
    uint8_t w[8] = {0};
    memcpy(w, s->tail, s->n_tail);
    h = mix(h, load_le64(w));
  }
  return mix(h, s->len); /* "ab" and "ab\0" differ */
}

uint64_t mf_ckpt_hash64(const void *bytes, size_t n) {
  mf_ckpt_hash s;
  mf_ckpt_hash_init(&s);
  mf_ckpt_hash_update(&s, bytes, n);
  return mf_ckpt_hash_final(&s);
}

uint64_t mf_ckpt_base_sum(const mf_param_table *t, const float *w, const uint16_t *frozen_bf16) {
  mf_ckpt_hash h;
  mf_ckpt_hash_init(&h);
  int any = 0;
  for (int64_t i = 0; i < t->n; i++) {
    const mf_param *p = &t->params[i];
    if (!p->frozen) continue;
    any = 1;
    if (p->quant) /* LoRA's base stored quantized: its blob */
      mf_ckpt_hash_update(&h, t->qhome + p->qoff, (size_t)p->qbytes);
    else if (frozen_bf16)
      mf_ckpt_hash_update(&h, frozen_bf16 + p->offset, (size_t)p->numel * sizeof(uint16_t));
    else
      mf_ckpt_hash_update(&h, w + p->offset, (size_t)p->numel * sizeof(float));
  }
  return any ? mf_ckpt_hash_final(&h) : 0;
}
