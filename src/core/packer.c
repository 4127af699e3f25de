/* Best-fit offset packing (see core.h). */
#include <stdlib.h>
#include <string.h>

#include "src/core/core.h"

static void drop(mf_packer *p, int32_t i) {
  memmove(p->off + i, p->off + i + 1, (size_t)(p->n - i - 1) * sizeof(size_t));
  memmove(p->len + i, p->len + i + 1, (size_t)(p->n - i - 1) * sizeof(size_t));
  p->n--;
}

size_t mf_packer_take(mf_packer *p, size_t bytes) {
  int32_t best = -1;
  for (int32_t k = 0; k < p->n; k++)
    if (p->len[k] >= bytes && (best < 0 || p->len[k] < p->len[best])) best = k;
  size_t at;
  if (best >= 0) {
    at = p->off[best];
    p->off[best] += bytes;
    p->len[best] -= bytes;
    if (p->len[best] == 0) drop(p, best);
  } else if (p->n > 0 && p->off[p->n - 1] + p->len[p->n - 1] == p->top) {
    /* Extend the free range at the top instead of leaving it behind. */
    at = p->off[p->n - 1];
    p->top = at + bytes;
    p->n--;
  } else {
    at = p->top;
    p->top += bytes;
  }
  return at;
}

mf_status mf_packer_give(mf_packer *p, size_t off, size_t bytes, const char *what) {
  if (bytes == 0) return MF_OK;
  int32_t i = 0;
  while (i < p->n && p->off[i] < off) i++;
  const int left = i > 0 && p->off[i - 1] + p->len[i - 1] == off;
  const int right = i < p->n && off + bytes == p->off[i];
  if (left && right) {
    p->len[i - 1] += bytes + p->len[i];
    drop(p, i);
    return MF_OK;
  }
  if (left) {
    p->len[i - 1] += bytes;
    return MF_OK;
  }
  if (right) {
    p->off[i] = off;
    p->len[i] += bytes;
    return MF_OK;
  }
  if (p->n == p->cap) {
    const int32_t cap = p->cap ? 2 * p->cap : 256;
    size_t *o = (size_t *)realloc(p->off, (size_t)cap * sizeof(size_t));
    if (!o) return MF_ERR(MF_ERR_OUT_OF_MEMORY, "%s: out of memory", what);
    p->off = o;
    size_t *l = (size_t *)realloc(p->len, (size_t)cap * sizeof(size_t));
    if (!l) return MF_ERR(MF_ERR_OUT_OF_MEMORY, "%s: out of memory", what);
    p->len = l;
    p->cap = cap;
  }
  memmove(p->off + i + 1, p->off + i, (size_t)(p->n - i) * sizeof(size_t));
  memmove(p->len + i + 1, p->len + i, (size_t)(p->n - i) * sizeof(size_t));
  p->off[i] = off;
  p->len[i] = bytes;
  p->n++;
  return MF_OK;
}

void mf_packer_free(mf_packer *p) {
  free(p->off);
  free(p->len);
  memset(p, 0, sizeof *p);
}
