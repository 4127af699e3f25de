/* Bump arenas: one block, carved in order, reset as a whole. */
#include <stdlib.h>
#include <string.h>

#include "src/core/core.h"

static size_t align_up(size_t x, size_t a) { return (x + a - 1) & ~(a - 1); }

mf_status mf_arena_create(mf_arena *a, size_t size, size_t align) {
  memset(a, 0, sizeof *a);
  if (align < sizeof(void *)) align = sizeof(void *);
  if (align & (align - 1)) return MF_ERR(MF_ERR_INVALID_ARG, "arena: alignment %zu is not a power of two", align);
  size_t rounded = align_up(size ? size : align, align);
  if (rounded < size) return MF_ERR(MF_ERR_OUT_OF_MEMORY, "arena: %zu bytes is too large", size);
  void *p = NULL;
  if (posix_memalign(&p, align, rounded) != 0) {
    char buf[32];
    return MF_ERR(MF_ERR_OUT_OF_MEMORY, "arena: could not allocate %s", mf_format_bytes(size, buf, sizeof buf));
  }
  a->base = (uint8_t *)p;
  a->size = size;
  a->owns = 1;
  return MF_OK;
}

void mf_arena_init(mf_arena *a, void *block, size_t size) {
  memset(a, 0, sizeof *a);
  a->base = (uint8_t *)block;
  a->size = size;
}

void mf_arena_destroy(mf_arena *a) {
  if (!a) return;
  if (a->owns) free(a->base);
  memset(a, 0, sizeof *a);
}

mf_status mf_arena_alloc(mf_arena *a, size_t size, size_t align, const char *what, void **out) {
  *out = NULL;
  if (align == 0) align = 1;
  if (align & (align - 1)) return MF_ERR(MF_ERR_INVALID_ARG, "arena: alignment %zu is not a power of two", align);
  uintptr_t base = (uintptr_t)a->base;
  size_t off = (size_t)(align_up(base + a->used, align) - base);
  size_t end;
  if (!mf_add_size(off, size, &end) || end > a->size) {
    char b1[32], b2[32];
    return MF_ERR(MF_ERR_OUT_OF_MEMORY, "arena: no room for %s (%s requested, %s free of %s)",
                  what ? what : "an allocation", mf_format_bytes(size, b1, sizeof b1),
                  mf_format_bytes(a->size - a->used, b2, sizeof b2), mf_format_bytes(a->size, (char[32]){0}, 32));
  }
  a->used = end;
  if (end > a->peak) a->peak = end;
  *out = a->base + off;
  return MF_OK;
}

void mf_arena_reset(mf_arena *a) { a->used = 0; }

size_t mf_arena_estimate(const size_t *sizes, size_t n, size_t align) {
  if (align == 0) align = 1;
  size_t total = 0;
  for (size_t i = 0; i < n; i++) total = align_up(total, align) + sizes[i];
  return total;
}
