/*
 * The elements of quantized weight formats (what src/io/quant.h defines:
 * NF4, FP8 e4m3 in 128 x 128 blocks, MXFP4): one stored weight described by
 * pointers (mf_qweight) and its element (r, c) in fp32. The host code
 * (src/io), the cpu backend's DEQUANT kernel and the cuda one all read a
 * weight through mf_qweight_at, so they give the same bits: every product
 * and sum rounds where it is written (on the device __fmul_rn / __fadd_rn,
 * which nvcc does not fuse).
 */
#ifndef MF_CORE_QFORMAT_H
#define MF_CORE_QFORMAT_H

#include <math.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#ifdef __CUDACC__
#define MF_QF_FN static inline __host__ __device__
#else
#define MF_QF_FN static inline
#endif

/* A frozen weight's storage at home. */
typedef enum mf_quant_kind {
  MF_QUANT_NONE = 0, /* the checkpoint's float dtype (bf16 in training) */
  MF_QUANT_NF4,
  MF_QUANT_FP8,
  MF_QUANT_MXFP4,
  MF_QUANT_COUNT_
} mf_quant_kind;

#define MF_NF4_DQ_BLOCK 256 /* the absmax's own blocks under double quantization */
#define MF_FP8_BLOCK 128    /* FP8 scales cover 128 x 128 */
#define MF_MXFP4_GROUP 32   /* MXFP4 elements per scale */

/* Blocks of `blocksize` covering n elements; 0 for n <= 0. */
MF_QF_FN int64_t mf_quant_blocks(int64_t n, int64_t blocksize) {
  return (n <= 0 || blocksize <= 0) ? 0 : (n + blocksize - 1) / blocksize;
}
/* Whether blocksize is one bitsandbytes takes for NF4 (32 .. 4096, a power of two). */
MF_QF_FN int mf_nf4_blocksize_ok(int64_t bs) {
  return bs >= 32 && bs <= 4096 && (bs & (bs - 1)) == 0;
}

/* One stored weight [rows, cols] (row-major). The pieces by kind:
 *   NF4    q: packed codes [(rows * cols + 1) / 2], the element with the lower
 *          flat index in the high nibble; blocks of `blocksize` over the flat
 *          index; scales: float absmax [nb], or with `nested` uint8 absmax_q [nb]
 *          and absmax2 [ceil(nb / 256)], code2 [256], offset
 *   FP8    q: e4m3fn [rows * cols]; scales: float scale_inv [ceil(rows / 128) x
 *          ceil(cols / 128)]
 *   MXFP4  q: [rows, cols / 32, 16], the element with the lower index in the
 *          low nibble; scales: uint8 e8m0 [rows, cols / 32] */
typedef struct mf_qweight {
  int32_t kind; /* mf_quant_kind, not NONE */
  int32_t nested;
  int64_t rows, cols;
  int64_t blocksize; /* NF4 */
  const uint8_t *q;
  const void *scales;
  const float *absmax2;
  const float *code2;
  float offset;
} mf_qweight;

MF_QF_FN float mf_qf_mul(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}

MF_QF_FN float mf_qf_add(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}

/* bitsandbytes' NF4 values (get_4bit_type("nf4")), ascending; code 7 is 0.0. */
#define MF_NF4_VALUES                                                                                      \
  {-1.0f, -0.6961928009986877f, -0.5250730514526367f, -0.39491748809814453f, -0.28444138169288635f,       \
   -0.18477343022823334f, -0.09105003625154495f, 0.0f, 0.07958029955625534f, 0.16093020141124725f,       \
   0.24611230194568634f, 0.33791524171829224f, 0.44070982933044434f, 0.5626170039176941f,                 \
   0.7229568362236023f, 1.0f}

MF_QF_FN float mf_qf_nf4(unsigned code) {
  const float v[16] = MF_NF4_VALUES;
  return v[code & 15u];
}

/* e4m3fn: bias 7, subnormals, 0x7f / 0xff NaN, no infinities. */
MF_QF_FN float mf_qf_e4m3(uint8_t b) {
  const int e = (b >> 3) & 15, m = b & 7;
  float v;
  if (e == 15 && m == 7)
    v = NAN;
  else if (e == 0)
    v = ldexpf((float)m, -9);
  else
    v = ldexpf((float)(8 + m), e - 10);
  return (b & 0x80) ? -v : v;
}

/* OCP e2m1 (sign in bit 3): 0, 0.5, 1, 1.5, 2, 3, 4, 6. */
MF_QF_FN float mf_qf_e2m1(unsigned code) {
  const int e = (code >> 1) & 3, m = code & 1;
  const float v = e == 0 ? 0.5f * (float)m : ldexpf(1.0f + 0.5f * (float)m, e - 1);
  return (code & 8u) ? -v : v;
}

/* The fp32 absmax of NF4 block j. */
MF_QF_FN float mf_qweight_nf4_absmax(const mf_qweight *w, int64_t j) {
  if (!w->nested) return ((const float *)w->scales)[j];
  const uint8_t q = ((const uint8_t *)w->scales)[j];
  return mf_qf_add(mf_qf_mul(w->code2[q], w->absmax2[j / MF_NF4_DQ_BLOCK]), w->offset);
}

/* Bytes of its q and of its scales (NF4 nested: absmax_q; absmax2 and code2 apart). */
MF_QF_FN int64_t mf_qweight_q_bytes(const mf_qweight *w) {
  const int64_t n = w->rows * w->cols;
  return w->kind == MF_QUANT_FP8 ? n : (n + 1) / 2;
}
MF_QF_FN int64_t mf_qweight_scale_bytes(const mf_qweight *w) {
  if (w->kind == MF_QUANT_NF4) return mf_quant_blocks(w->rows * w->cols, w->blocksize) * (w->nested ? 1 : 4);
  if (w->kind == MF_QUANT_FP8)
    return mf_quant_blocks(w->rows, MF_FP8_BLOCK) * mf_quant_blocks(w->cols, MF_FP8_BLOCK) * 4;
  return w->rows * (w->cols / MF_MXFP4_GROUP);
}
/* NF4 nested: absmax2's elements. */
MF_QF_FN int64_t mf_qweight_absmax2_count(const mf_qweight *w) {
  return mf_quant_blocks(mf_quant_blocks(w->rows * w->cols, w->blocksize), MF_NF4_DQ_BLOCK);
}

/* A stored weight as one byte blob: what lives at home, crosses the link and
 * sits in the device arena, so one copy moves it. q at 0; the scales at the
 * next multiple of 16 bytes; with NF4 nested absmax then absmax2, code2 (256
 * floats) and the offset (one float), each at the next multiple of 16. */
MF_QF_FN int64_t mf_qf_align16(int64_t x) { return (x + 15) & ~(int64_t)15; }
MF_QF_FN int64_t mf_qweight_blob_scales_at(const mf_qweight *w) { return mf_qf_align16(mf_qweight_q_bytes(w)); }
MF_QF_FN int64_t mf_qweight_blob_absmax2_at(const mf_qweight *w) {
  return mf_qf_align16(mf_qweight_blob_scales_at(w) + mf_qweight_scale_bytes(w));
}
MF_QF_FN int64_t mf_qweight_blob_code2_at(const mf_qweight *w) {
  return mf_qf_align16(mf_qweight_blob_absmax2_at(w) + 4 * mf_qweight_absmax2_count(w));
}
MF_QF_FN int64_t mf_qweight_blob_offset_at(const mf_qweight *w) { return mf_qweight_blob_code2_at(w) + 1024; }
MF_QF_FN int64_t mf_qweight_blob_bytes(const mf_qweight *w) {
  if (w->kind == MF_QUANT_NF4 && w->nested) return mf_qweight_blob_offset_at(w) + 4;
  return mf_qweight_blob_scales_at(w) + mf_qweight_scale_bytes(w);
}
/* Points w's pieces into `blob` (16-byte aligned) and reads its offset. */
MF_QF_FN void mf_qweight_blob_view(mf_qweight *w, const uint8_t *blob) {
  w->q = blob;
  w->scales = blob + mf_qweight_blob_scales_at(w);
  w->absmax2 = 0;
  w->code2 = 0;
  w->offset = 0.0f;
  if (w->kind == MF_QUANT_NF4 && w->nested) {
    w->absmax2 = (const float *)(blob + mf_qweight_blob_absmax2_at(w));
    w->code2 = (const float *)(blob + mf_qweight_blob_code2_at(w));
    w->offset = *(const float *)(blob + mf_qweight_blob_offset_at(w));
  }
}

/* Element (r, c) in fp32. */
MF_QF_FN float mf_qweight_at(const mf_qweight *w, int64_t r, int64_t c) {
  if (w->kind == MF_QUANT_NF4) {
    const int64_t i = r * w->cols + c;
    const uint8_t byte = w->q[i >> 1];
    return mf_qf_mul(mf_qf_nf4((i & 1) ? (byte & 15u) : (unsigned)(byte >> 4)),
                     mf_qweight_nf4_absmax(w, i / w->blocksize));
  }
  if (w->kind == MF_QUANT_FP8) {
    const int64_t bc = mf_quant_blocks(w->cols, MF_FP8_BLOCK);
    const float s = ((const float *)w->scales)[(r / MF_FP8_BLOCK) * bc + c / MF_FP8_BLOCK];
    return mf_qf_mul(mf_qf_e4m3(w->q[r * w->cols + c]), s);
  }
  /* MXFP4 */
  const int64_t groups = w->cols / MF_MXFP4_GROUP, g = c / MF_MXFP4_GROUP, k = c % MF_MXFP4_GROUP;
  const uint8_t byte = w->q[(r * groups + g) * (MF_MXFP4_GROUP / 2) + k / 2];
  const uint8_t s = ((const uint8_t *)w->scales)[r * groups + g];
  return ldexpf(mf_qf_e2m1((k & 1) ? (unsigned)(byte >> 4) : (byte & 15u)), (int)s - 127);
}

#ifdef __cplusplus
}
#endif

#endif /* MF_CORE_QFORMAT_H */
