/* The byte-plane filter of checkpoint tensor data (ckpt_internal.h): an
 * array of n elements of w bytes becomes w planes of n bytes, plane b holding
 * byte b of every element. fp32 weights and moments of nearby values share
 * their sign/exponent bytes, which zstd finds once they sit together; the
 * mantissa's low bytes stay noise either way. */
#include "src/ckpt/ckpt_internal.h"

void mf_ckpt_planes_split(void *dst, const void *src, size_t bytes, size_t w) {
  const uint8_t *s = src;
  uint8_t *d = dst;
  const size_t n = bytes / w;
  for (size_t b = 0; b < w; b++) {
    uint8_t *plane = d + b * n;
    for (size_t i = 0; i < n; i++) plane[i] = s[i * w + b];
  }
}

void mf_ckpt_planes_join(void *dst, const void *src, size_t bytes, size_t w) {
  const uint8_t *s = src;
  uint8_t *d = dst;
  const size_t n = bytes / w;
  for (size_t b = 0; b < w; b++) {
    const uint8_t *plane = s + b * n;
    for (size_t i = 0; i < n; i++) d[i * w + b] = plane[i];
  }
}
