/* dtype names and sizes; fp16 <-> fp32 and bulk bf16 conversions. */
#include <string.h>

#include "src/core/core.h"

static const struct {
  const char *name;
  size_t size;
} k_dtypes[MF_DTYPE_COUNT_] = {
    [MF_DTYPE_INVALID] = {"INVALID", 0}, [MF_DTYPE_BOOL] = {"BOOL", 1},
    [MF_DTYPE_U8] = {"U8", 1},           [MF_DTYPE_I8] = {"I8", 1},
    [MF_DTYPE_I16] = {"I16", 2},         [MF_DTYPE_U16] = {"U16", 2},
    [MF_DTYPE_F16] = {"F16", 2},         [MF_DTYPE_BF16] = {"BF16", 2},
    [MF_DTYPE_I32] = {"I32", 4},         [MF_DTYPE_U32] = {"U32", 4},
    [MF_DTYPE_F32] = {"F32", 4},         [MF_DTYPE_F64] = {"F64", 8},
    [MF_DTYPE_I64] = {"I64", 8},         [MF_DTYPE_U64] = {"U64", 8},
    [MF_DTYPE_F8_E4M3] = {"F8_E4M3", 1}, [MF_DTYPE_F8_E5M2] = {"F8_E5M2", 1},
};

size_t mf_dtype_size(mf_dtype t) {
  if ((int)t <= 0 || t >= MF_DTYPE_COUNT_) return 0;
  return k_dtypes[t].size;
}

const char *mf_dtype_name(mf_dtype t) {
  if ((int)t <= 0 || t >= MF_DTYPE_COUNT_) return "INVALID";
  return k_dtypes[t].name;
}

mf_dtype mf_dtype_from_name(const char *name, size_t len) {
  for (int t = 1; t < MF_DTYPE_COUNT_; t++)
    if (strlen(k_dtypes[t].name) == len && memcmp(k_dtypes[t].name, name, len) == 0)
      return (mf_dtype)t;
  return MF_DTYPE_INVALID;
}

uint16_t mf_fp32_to_fp16(float f) {
  union { float f; uint32_t u; } v = {f};
  uint32_t sign = (v.u >> 16) & 0x8000u;
  uint32_t absu = v.u & 0x7fffffffu;
  if (absu > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | ((absu >> 13) & 0x3ffu)); /* NaN */
  if (absu >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* rounds past 65504: Inf */
  if (absu < 0x38800000u) { /* below the smallest normal half: subnormal or zero */
    if (absu < 0x33000000u) return (uint16_t)sign; /* below half the smallest subnormal */
    uint32_t e = absu >> 23;
    uint32_t m = (absu & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126u - e; /* 14 + (113 - e) - ... : aligns to 2^-24 units */
    uint32_t half = m >> shift;
    uint32_t rem = m & ((1u << shift) - 1u);
    uint32_t mid = 1u << (shift - 1u);
    if (rem > mid || (rem == mid && (half & 1u))) half++;
    return (uint16_t)(sign | half);
  }
  uint32_t h = ((absu - 0x38000000u) >> 13); /* rebias exponent 127 -> 15 */
  uint32_t rem = absu & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) h++;
  return (uint16_t)(sign | h);
}

float mf_fp16_to_fp32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t e = (h >> 10) & 0x1fu;
  uint32_t m = h & 0x3ffu;
  uint32_t u;
  if (e == 0x1f) {
    u = sign | 0x7f800000u | (m << 13);
  } else if (e == 0) {
    if (m == 0) {
      u = sign;
    } else { /* subnormal: normalise */
      int sh = 0;
      while (!(m & 0x400u)) { m <<= 1; sh++; }
      m &= 0x3ffu;
      u = sign | ((uint32_t)(113 - sh) << 23) | (m << 13);
    }
  } else {
    u = sign | ((e + 112u) << 23) | (m << 13);
  }
  union { uint32_t u; float f; } v = {u};
  return v.f;
}

void mf_fp32_to_bf16_n(const float *src, uint16_t *dst, size_t n) {
  for (size_t i = 0; i < n; i++) dst[i] = mf_fp32_to_bf16(src[i]);
}

void mf_bf16_to_fp32_n(const uint16_t *src, float *dst, size_t n) {
  for (size_t i = 0; i < n; i++) dst[i] = mf_bf16_to_fp32(src[i]);
}

void mf_fp16_to_fp32_n(const uint16_t *src, float *dst, size_t n) {
  for (size_t i = 0; i < n; i++) dst[i] = mf_fp16_to_fp32(src[i]);
}
