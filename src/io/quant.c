/* Quantized weight formats as stored (quant.h). Built as C11 (ISO mode: no
 * floating-point contraction), so every product and sum below rounds where it
 * is written; the one fused step is fmaf, where torch's linspace fuses. */
#include "src/io/quant.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static const char *const k_names[MF_QUANT_COUNT_] = {"bf16", "nf4", "fp8", "mxfp4"};

const char *mf_quant_name(mf_quant_kind k) {
  return (k >= 0 && k < MF_QUANT_COUNT_) ? k_names[k] : "?";
}

const float mf_nf4_code[16] = MF_NF4_VALUES;

/* torch.linspace(a, b, k) in fp32 as ATen's CPU kernel computes it: the first
 * half up from a, the second half down from b, each one fused step. */
static float linspace_at(float a, float b, int k, int i) {
  const float step = (b - a) / (float)(k - 1);
  return i < k / 2 ? fmaf(step, (float)i, a) : fmaf(-step, (float)(k - 1 - i), b);
}

static int cmp_float(const void *x, const void *y) {
  const float a = *(const float *)x, b = *(const float *)y;
  return (a > b) - (a < b);
}

/* create_dynamic_map(signed=True, max_exponent_bits=7, total_bits=8): for each
 * decade 10^(i-6), i = 0..6, the midpoints of linspace(0.1, 1, 2^i + 1)
 * scaled by it, both signs; then 0 and 1; sorted. */
void mf_quant_dynamic_map(float code[256]) {
  static const double k_decade[7] = {1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1e0};
  int n = 0;
  for (int i = 0; i < 7; i++) {
    const int k = (1 << i) + 1;
    const float s = (float)k_decade[i];
    for (int j = 0; j + 1 < k; j++) {
      const float mean = (linspace_at(0.1f, 1.0f, k, j) + linspace_at(0.1f, 1.0f, k, j + 1)) / 2.0f;
      code[n++] = s * mean;
      code[n++] = -s * mean;
    }
  }
  code[n++] = 0.0f;
  code[n++] = 1.0f;
  qsort(code, (size_t)n, sizeof(float), cmp_float);
}

/* ------------------------------------------------------------------- e4m3 */

uint8_t mf_fp32_to_e4m3(float x) {
  const uint8_t sign = signbit(x) ? 0x80 : 0;
  if (isnan(x)) return sign | 0x7f;
  const float a = fabsf(x);
  if (a < 0x1p-6f) { /* subnormal range: multiples of 2^-9 (8 of them make the least normal) */
    const float q = nearbyintf(a * 512.0f);
    return sign | (uint8_t)q;
  }
  if (a >= 480.0f) return sign | 0x7f; /* rounds past 448: torch gives NaN */
  int e;
  const float fr = frexpf(a, &e); /* a = fr * 2^e, fr in [0.5, 1) */
  float m = nearbyintf((fr * 2.0f - 1.0f) * 8.0f);
  int be = e - 1 + 7;
  if (m == 8.0f) m = 0.0f, be++;
  if (be > 15 || (be == 15 && m == 7.0f)) return sign | 0x7f;
  return sign | (uint8_t)(be << 3) | (uint8_t)m;
}

/* ------------------------------------------------------------------- NF4 */

/* bitsandbytes' rule: the first midpoint of the sorted code >= s (torch.bucketize
 * with right=False over the fp32 midpoints). */
static uint8_t bucket(const float *code, int n, float s) {
  int lo = 0, hi = n - 1; /* answer in [0, n-1]: the count of midpoints < s */
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    const float b = (code[mid] + code[mid + 1]) / 2.0f;
    if (b < s)
      lo = mid + 1;
    else
      hi = mid;
  }
  return (uint8_t)lo;
}

static float clamp1(float v) {
  return v < -1.0f ? -1.0f : (v > 1.0f ? 1.0f : v);
}

/* Codes of a block x[0..len) into codes[], its absmax stored in *absmax. The
 * full blocks scale by the reciprocal, a short last one divides (as
 * bitsandbytes does), and stores the clamped absmax. */
static void quantize_block(const float *x, int64_t len, int full, const float *code, int ncode, uint8_t *codes,
                           float *absmax) {
  float am = 0.0f;
  for (int64_t i = 0; i < len; i++) am = fmaxf(am, fabsf(x[i]));
  const float clamped = fmaxf(am, 1e-38f);
  const float r = 1.0f / clamped;
  for (int64_t i = 0; i < len; i++) {
    const float s = clamp1(full ? x[i] * r : x[i] / clamped);
    codes[i] = bucket(code, ncode, s);
  }
  *absmax = full ? am : clamped;
}

mf_status mf_nf4_quantize(const float *x, int64_t n, int64_t bs, uint8_t *packed, float *absmax, const char *what) {
  if (!mf_nf4_blocksize_ok(bs))
    return MF_ERR(MF_ERR_INVALID_ARG, "%s: NF4 block size %lld is not a power of two in 32..4096", what,
                  (long long)bs);
  float buf[4096];
  uint8_t codes[4096];
  const int64_t nb = mf_quant_blocks(n, bs);
  for (int64_t b = 0; b < nb; b++) {
    const int64_t i0 = b * bs, len = (n - i0 < bs) ? n - i0 : bs;
    for (int64_t i = 0; i < len; i++) {
      buf[i] = x[i0 + i];
      if (!isfinite(buf[i]))
        return MF_ERR(MF_ERR_INVALID_ARG, "%s: element %lld is not finite (%g): it cannot be quantized", what,
                      (long long)(i0 + i), (double)buf[i]);
    }
    /* Blocks are even in size (bs >= 32), so a block starts on a byte. */
    quantize_block(buf, len, len == bs, mf_nf4_code, 16, codes, &absmax[b]);
    for (int64_t i = 0; i < len; i += 2) {
      const uint8_t lo = (i + 1 < len) ? codes[i + 1] : 7; /* an odd tail pads with 0.0's code */
      packed[(i0 + i) / 2] = (uint8_t)(codes[i] << 4 | lo);
    }
  }
  return MF_OK;
}

mf_status mf_nf4_double_quantize(const float *absmax, int64_t nb, const float code2[256], uint8_t *absmax_q,
                                 float *absmax2, float *offset) {
  double sum = 0;
  for (int64_t j = 0; j < nb; j++) {
    if (!isfinite(absmax[j]) || absmax[j] < 0)
      return MF_ERR(MF_ERR_INVALID_ARG, "NF4 double quantization: absmax[%lld] = %g", (long long)j,
                    (double)absmax[j]);
    sum += absmax[j];
  }
  const float off = nb > 0 ? (float)(sum / (double)nb) : 0.0f;
  float buf[MF_NF4_DQ_BLOCK];
  for (int64_t b = 0; b < mf_quant_blocks(nb, MF_NF4_DQ_BLOCK); b++) {
    const int64_t j0 = b * MF_NF4_DQ_BLOCK, len = (nb - j0 < MF_NF4_DQ_BLOCK) ? nb - j0 : MF_NF4_DQ_BLOCK;
    for (int64_t j = 0; j < len; j++) buf[j] = absmax[j0 + j] - off;
    quantize_block(buf, len, len == MF_NF4_DQ_BLOCK, code2, 256, absmax_q + j0, &absmax2[b]);
  }
  *offset = off;
  return MF_OK;
}

/* ------------------------------------------------------------------- FP8 */

mf_status mf_fp8_quantize(const float *x, int64_t rows, int64_t cols, uint8_t *weight, float *scale_inv,
                          const char *what) {
  const int64_t bc = mf_quant_blocks(cols, MF_FP8_BLOCK);
  for (int64_t br = 0; br < mf_quant_blocks(rows, MF_FP8_BLOCK); br++)
    for (int64_t bj = 0; bj < bc; bj++) {
      const int64_t r0 = br * MF_FP8_BLOCK, c0 = bj * MF_FP8_BLOCK;
      const int64_t r1 = r0 + MF_FP8_BLOCK < rows ? r0 + MF_FP8_BLOCK : rows;
      const int64_t c1 = c0 + MF_FP8_BLOCK < cols ? c0 + MF_FP8_BLOCK : cols;
      float am = 0;
      for (int64_t r = r0; r < r1; r++)
        for (int64_t c = c0; c < c1; c++) {
          const float v = x[r * cols + c];
          if (!isfinite(v))
            return MF_ERR(MF_ERR_INVALID_ARG, "%s: element [%lld, %lld] is not finite (%g): it cannot be quantized",
                          what, (long long)r, (long long)c, (double)v);
          am = fmaxf(am, fabsf(v));
        }
      const float scale = am > 0 ? (1.0f / am) * MF_FP8_E4M3_MAX : 1.0f;
      for (int64_t r = r0; r < r1; r++)
        for (int64_t c = c0; c < c1; c++) {
          float v = x[r * cols + c] * scale;
          v = v < -MF_FP8_E4M3_MAX ? -MF_FP8_E4M3_MAX : (v > MF_FP8_E4M3_MAX ? MF_FP8_E4M3_MAX : v);
          weight[r * cols + c] = mf_fp32_to_e4m3(v);
        }
      scale_inv[br * bc + bj] = 1.0f / scale;
    }
  return MF_OK;
}

/* ------------------------------------------------------- any stored weight */

static mf_status check_finite(const float *v, int64_t n, int nonneg, const char *what, const char *piece) {
  for (int64_t j = 0; j < n; j++)
    if (!isfinite(v[j]) || (nonneg && v[j] < 0))
      return MF_ERR(MF_ERR_FORMAT, "%s: %s[%lld] is %g: it must be finite%s", what, piece, (long long)j,
                    (double)v[j], nonneg ? " and >= 0" : "");
  return MF_OK;
}

static mf_status check_nf4(const mf_qweight *w, const char *what) {
  if (!mf_nf4_blocksize_ok(w->blocksize))
    return MF_ERR(MF_ERR_FORMAT, "%s: NF4 block size %lld is not a power of two in 32..4096", what,
                  (long long)w->blocksize);
  const int64_t nb = mf_quant_blocks(w->rows * w->cols, w->blocksize);
  if (!w->nested) return check_finite((const float *)w->scales, nb, 1, what, "absmax");
  if (!isfinite(w->offset))
    return MF_ERR(MF_ERR_FORMAT, "%s: the absmax offset is %g: it must be finite", what, (double)w->offset);
  MF_CHECK(check_finite(w->code2, 256, 0, what, "nested_quant_map"));
  MF_CHECK(check_finite(w->absmax2, mf_quant_blocks(nb, MF_NF4_DQ_BLOCK), 0, what, "nested_absmax"));
  for (int64_t j = 0; j < nb; j++) {
    const float a = mf_qweight_nf4_absmax(w, j);
    if (!isfinite(a) || a < 0)
      return MF_ERR(MF_ERR_FORMAT, "%s: absmax[%lld] restores to %g: it must be finite and >= 0", what,
                    (long long)j, (double)a);
  }
  return MF_OK;
}

static mf_status check_fp8(const mf_qweight *w, const char *what) {
  const int64_t bc = mf_quant_blocks(w->cols, MF_FP8_BLOCK), nb = mf_quant_blocks(w->rows, MF_FP8_BLOCK) * bc;
  const float *s = (const float *)w->scales;
  for (int64_t b = 0; b < nb; b++)
    if (!isfinite(s[b]) || s[b] < 0)
      return MF_ERR(MF_ERR_FORMAT, "%s: weight_scale_inv[%lld, %lld] is %g: a block scale is finite and >= 0",
                    what, (long long)(b / bc), (long long)(b % bc), (double)s[b]);
  for (int64_t i = 0; i < w->rows * w->cols; i++)
    if ((w->q[i] & 0x7f) == 0x7f)
      return MF_ERR(MF_ERR_FORMAT, "%s: element [%lld, %lld] is the e4m3 NaN (0x%02x)", what,
                    (long long)(i / w->cols), (long long)(i % w->cols), w->q[i]);
  return MF_OK;
}

static mf_status check_mxfp4(const mf_qweight *w, const char *what) {
  if (w->cols % MF_MXFP4_GROUP)
    return MF_ERR(MF_ERR_FORMAT, "%s: %lld columns is not a whole number of MXFP4 groups of 32", what,
                  (long long)w->cols);
  const int64_t groups = w->cols / MF_MXFP4_GROUP;
  const uint8_t *s = (const uint8_t *)w->scales;
  for (int64_t i = 0; i < w->rows * groups; i++)
    if (s[i] == 255)
      return MF_ERR(MF_ERR_FORMAT, "%s: scale [%lld, %lld] is 255, the e8m0 NaN", what, (long long)(i / groups),
                    (long long)(i % groups));
  return MF_OK;
}

mf_status mf_qweight_check(const mf_qweight *w, const char *what) {
  if (w->rows < 0 || w->cols < 0)
    return MF_ERR(MF_ERR_FORMAT, "%s: shape [%lld, %lld]", what, (long long)w->rows, (long long)w->cols);
  if (w->kind == MF_QUANT_NF4) return check_nf4(w, what);
  if (w->kind == MF_QUANT_FP8) return check_fp8(w, what);
  if (w->kind == MF_QUANT_MXFP4) return check_mxfp4(w, what);
  return MF_ERR(MF_ERR_INVALID_ARG, "%s: not a quantized format (kind %d)", what, (int)w->kind);
}

void mf_qweight_dequantize_f32(const mf_qweight *w, int64_t r0, int64_t nr, float *out) {
  for (int64_t r = r0; r < r0 + nr; r++)
    for (int64_t c = 0; c < w->cols; c++) out[(r - r0) * w->cols + c] = mf_qweight_at(w, r, c);
}

void mf_qweight_dequantize_bf16(const mf_qweight *w, int64_t r0, int64_t nr, uint16_t *out) {
  for (int64_t r = r0; r < r0 + nr; r++)
    for (int64_t c = 0; c < w->cols; c++) out[(r - r0) * w->cols + c] = mf_fp32_to_bf16(mf_qweight_at(w, r, c));
}

void mf_qweight_pack(const mf_qweight *w, uint8_t *blob) {
  memset(blob, 0, (size_t)mf_qweight_blob_bytes(w));
  memcpy(blob, w->q, (size_t)mf_qweight_q_bytes(w));
  memcpy(blob + mf_qweight_blob_scales_at(w), w->scales, (size_t)mf_qweight_scale_bytes(w));
  if (w->kind == MF_QUANT_NF4 && w->nested) {
    memcpy(blob + mf_qweight_blob_absmax2_at(w), w->absmax2, (size_t)(4 * mf_qweight_absmax2_count(w)));
    memcpy(blob + mf_qweight_blob_code2_at(w), w->code2, 1024);
    memcpy(blob + mf_qweight_blob_offset_at(w), &w->offset, 4);
  }
}

mf_status mf_quant_blob(mf_quant_kind kind, const float *x, int64_t rows, int64_t cols, int64_t blocksize, int nested,
                        uint8_t *blob, const char *what) {
  mf_qweight w = {.kind = (int32_t)kind, .nested = kind == MF_QUANT_NF4 && nested, .rows = rows, .cols = cols,
                  .blocksize = blocksize};
  if (kind == MF_QUANT_FP8) {
    memset(blob, 0, (size_t)mf_qweight_blob_bytes(&w));
    return mf_fp8_quantize(x, rows, cols, blob, (float *)(blob + mf_qweight_blob_scales_at(&w)), what);
  }
  if (kind != MF_QUANT_NF4)
    return MF_ERR(MF_ERR_INVALID_ARG, "%s: %s weights are read as a checkpoint ships them, not made at load", what,
                  mf_quant_name(kind));
  const int64_t n = rows * cols, nb = mf_quant_blocks(n, blocksize);
  memset(blob, 0, (size_t)mf_qweight_blob_bytes(&w));
  if (!w.nested)
    return mf_nf4_quantize(x, n, blocksize, blob, (float *)(blob + mf_qweight_blob_scales_at(&w)), what);
  float *absmax = (float *)malloc((size_t)(nb > 0 ? nb : 1) * sizeof(float));
  if (!absmax) return MF_ERR(MF_ERR_OUT_OF_MEMORY, "%s: out of memory quantizing", what);
  float code2[256];
  mf_quant_dynamic_map(code2);
  float offset = 0;
  mf_status st = mf_nf4_quantize(x, n, blocksize, blob, absmax, what);
  if (st == MF_OK)
    st = mf_nf4_double_quantize(absmax, nb, code2, blob + mf_qweight_blob_scales_at(&w),
                                (float *)(blob + mf_qweight_blob_absmax2_at(&w)), &offset);
  free(absmax);
  if (st != MF_OK) return st;
  memcpy(blob + mf_qweight_blob_code2_at(&w), code2, sizeof code2);
  memcpy(blob + mf_qweight_blob_offset_at(&w), &offset, 4);
  return MF_OK;
}
