/*
 * Quantized weight formats as checkpoints store them: what a frozen base
 * weight is at home and on the link when it is kept at 4 or 8 bits. These are
 * the formats' definitions on the host (quantize, check, dequantize); the
 * dequantize kernels of the backends (kernels/backend.h) follow them bit for
 * bit.
 *
 * NF4 (bitsandbytes, QLoRA). A weight of n elements, flattened row-major, in
 * blocks of `blocksize` elements (32 .. 4096, a power of two; 64 is QLoRA's):
 *   packed  uint8 [(n + 1) / 2]  two 4-bit codes a byte, the element with the
 *                               lower index in the high nibble; an odd n pads
 *                               the last low nibble with the code of 0.0 (7)
 *   absmax  fp32 [ceil(n / blocksize)]
 *   x[i] = nf4_code[code(i)] * absmax[i / blocksize]   (one fp32 product)
 * With double quantization ("compress_statistics") absmax is itself stored in
 * 8 bits, in blocks of 256, after its mean is subtracted:
 *   absmax_q uint8 [nb], absmax2 fp32 [ceil(nb / 256)], code2 fp32 [256]
 *   (bitsandbytes' dynamic map), offset fp32
 *   absmax[j] = code2[absmax_q[j]] * absmax2[j / 256] + offset   (two roundings)
 * Quantizing follows bitsandbytes.functional.quantize_4bit on the CPU bit for
 * bit: per block absmax = max |x|, s = clamp(x * (1 / max(absmax, 1e-38)), -1, 1)
 * (x / absmax in a short last block, whose absmax is stored clamped), the code
 * of the first NF4 midpoint >= s. The double quantization of the absmax is
 * moefit's own (bitsandbytes' offset is torch's fp32 mean, whose summation
 * order is not defined): the offset is the fp64 mean rounded to fp32, then
 * the same rule over the dynamic map. Its dequantization is bitsandbytes'.
 *
 * FP8 e4m3 in 128 x 128 blocks (DeepSeek-V3, Qwen3-FP8; "weight_scale_inv"):
 *   weight     e4m3fn [rows, cols]  (bias 7, no infinities, 0x7f/0xff NaN, max 448)
 *   scale_inv  fp32 [ceil(rows / 128), ceil(cols / 128)]
 *   x[r][c] = e4m3(weight[r][c]) * scale_inv[r / 128][c / 128]   (one fp32 product)
 * Quantizing follows transformers' FineGrainedFP8HfQuantizer: per block
 * scale = (1 / max |x|) * 448, weight = e4m3(clamp(x * scale, -448, 448))
 * rounded to nearest even, scale_inv = 1 / scale. A block of zeros (where
 * transformers writes NaN) gets zeros and scale_inv 1.
 *
 * MXFP4 (OCP microscaling, gpt-oss "_blocks"/"_scales"): rows of groups of 32
 *   blocks  uint8 [rows, groups, 16]  two e2m1 values a byte, the element with
 *                                     the lower index in the LOW nibble
 *   scales  uint8 [rows, groups]      e8m0: 2^(s - 127); 255 (NaN) is refused
 *   x[r][32 g + k] = e2m1(code) * 2^(scales[r][g] - 127)   (exact in fp32 but at
 *   the ends of the range, where the product rounds once)
 * as transformers' convert_moe_packed_tensors computes it, without its final
 * transpose (the family's layout, not the format's).
 *
 * Every function here takes host memory and never allocates, but
 * mf_quant_blob of a double-quantized NF4 weight (its fp32 absmax before they
 * are quantized again). mf_qweight_check validates stored data from a file and
 * names `what` (the tensor) and the fault. The block count and NF4's block
 * size rule (mf_quant_blocks, mf_nf4_blocksize_ok) are src/core/qformat.h's.
 */
#ifndef MF_IO_QUANT_H
#define MF_IO_QUANT_H

#include <stddef.h>
#include <stdint.h>

#include "src/core/core.h"
#include "src/core/qformat.h"
#include "src/io/safetensors.h"

#ifdef __cplusplus
extern "C" {
#endif

/* "bf16", "nf4", "fp8", "mxfp4" (MF_QUANT_NONE is "bf16", the config's word). */
const char *mf_quant_name(mf_quant_kind k);

#define MF_FP8_E4M3_MAX 448.0f

/* bitsandbytes' NF4 values (MF_NF4_VALUES of src/core/qformat.h). */
extern const float mf_nf4_code[16];

/* bitsandbytes' dynamic 8-bit map (create_dynamic_map(signed=True)), 256
 * values ascending: the map double quantization uses. */
void mf_quant_dynamic_map(float code[256]);

/* fp32 -> e4m3fn, rounded to nearest even; |x| past 448 after rounding, and
 * NaN, give NaN (0x7f with x's sign), as torch's cast does. (The decoding is
 * mf_qf_e4m3 of src/core/qformat.h.) */
uint8_t mf_fp32_to_e4m3(float x);

/* ---------------------------------------------------------------- NF4 */

/* Quantizes x[n] (finite) into packed[(n + 1) / 2] and absmax[nb]; a
 * non-finite element is MF_ERR_INVALID_ARG naming `what` and its index. A
 * bf16 weight is widened to fp32 first, as bitsandbytes does: the same bits. */
mf_status mf_nf4_quantize(const float *x, int64_t n, int64_t blocksize, uint8_t *packed, float *absmax,
                          const char *what);
/* Double quantization of absmax[nb] (>= 0, finite): absmax_q[nb],
 * absmax2[ceil(nb / 256)], *offset, over `code2` (mf_quant_dynamic_map). */
mf_status mf_nf4_double_quantize(const float *absmax, int64_t nb, const float code2[256], uint8_t *absmax_q,
                                 float *absmax2, float *offset);
/* ---------------------------------------------------------------- FP8 */

/* Quantizes x[rows x cols] (finite) into weight[rows x cols] and
 * scale_inv[ceil(rows/128) x ceil(cols/128)]. */
mf_status mf_fp8_quantize(const float *x, int64_t rows, int64_t cols, uint8_t *weight, float *scale_inv,
                          const char *what);
/* ------------------------------------------------------- any stored weight */

/* Validates a stored weight read from a file (what: its name): NF4 with a
 * block size bitsandbytes takes and absmax (or absmax2, code2, offset)
 * finite and >= 0 (the absmax); FP8 scales finite and >= 0 and no NaN code
 * (0x7f, 0xff); MXFP4 with cols a multiple of 32 and no scale of 255 (the
 * e8m0 NaN). MF_ERR_FORMAT naming `what`, the place and the fault. */
mf_status mf_qweight_check(const mf_qweight *w, const char *what);
/* w's pieces copied into blob[mf_qweight_blob_bytes(w)] (the gaps zeroed). */
void mf_qweight_pack(const mf_qweight *w, uint8_t *blob);
/* x [rows, cols] (finite) quantized into blob[mf_qweight_blob_bytes] of a
 * weight of `kind` (NF4 in blocks of `blocksize`, double quantized when
 * `nested`; FP8); MXFP4 is read as shipped, never made (MF_ERR_INVALID_ARG). */
mf_status mf_quant_blob(mf_quant_kind kind, const float *x, int64_t rows, int64_t cols, int64_t blocksize, int nested,
                        uint8_t *blob, const char *what);
/* Rows [r0, r0 + nr) of the weight to fp32 / bf16 ([nr x cols]). */
void mf_qweight_dequantize_f32(const mf_qweight *w, int64_t r0, int64_t nr, float *out);
void mf_qweight_dequantize_bf16(const mf_qweight *w, int64_t r0, int64_t nr, uint16_t *out);

/* ------------------------------------- checkpoints shipped quantized */

/* bitsandbytes 4-bit NF4 as transformers + bitsandbytes save a Linear4bit's
 * weight `W` ("...q_proj.weight"; QuantState.as_dict(packed=True)):
 *   W                                    U8 [(n + 1) / 2, 1]  the packed codes
 *   W.absmax                             F32 [nb], or U8 [nb] double quantized
 *   W.quant_map                          F32 [16]  the NF4 values (must be bitsandbytes')
 *   W.nested_absmax, W.nested_quant_map  F32 [ceil(nb / 256)], F32 [256] (double quantized)
 *   W.quant_state.bitsandbytes__nf4      U8: JSON {"quant_type": "nf4", "blocksize",
 *                                        "dtype", "shape": [rows, cols], and double
 *                                        quantized "nested_blocksize": 256,
 *                                        "nested_offset", "nested_dtype"}
 * Whether st stores `name` that way (its quant state tensor, nf4 or fp4, is there). */
int mf_bnb4_stored(const mf_safetensors *st, const char *name);
/* 1 when tensor `name` is one of a bitsandbytes weight's quant state tensors
 * (W.absmax ... W.quant_state.*); weight[cap] gets W. */
int mf_bnb4_companion(const char *name, char *weight, size_t cap);
/* Weight `name` of file `path`: its format from the quant state's JSON (NF4,
 * the block size, double quantization and its offset), which must describe
 * a [rows, cols] weight. fp4 is MF_ERR_UNSUPPORTED; a damaged or mismatched
 * quant state MF_ERR_FORMAT naming the tensor and the fault. */
mf_status mf_bnb4_describe(const mf_safetensors *st, const char *path, const char *name, int64_t rows, int64_t cols,
                           mf_qweight *w);
/* Its tensors into blob[mf_qweight_blob_bytes(w)] (w from mf_bnb4_describe),
 * each checked for dtype and size against w, the NF4 map against
 * bitsandbytes', then the values (mf_qweight_check). */
mf_status mf_bnb4_read(const mf_safetensors *st, const char *path, const char *name, const mf_qweight *w,
                       uint8_t *blob);

/* FP8 e4m3 in 128 x 128 blocks as DeepSeek-V3, the Qwen3-FP8 releases and
 * transformers' FineGrainedFP8 save a weight `W` (config.json
 * quantization_config quant_method "fp8", weight_block_size [128, 128]):
 *   W            F8_E4M3 [rows, cols]
 *   W_scale_inv  F32 (or BF16, widened exactly) [ceil(rows / 128), ceil(cols / 128)]
 * Whether st stores `name` that way (its W_scale_inv is there). */
int mf_fp8_stored(const mf_safetensors *st, const char *name);
/* W and W_scale_inv of file `path` into blob[mf_qweight_blob_bytes] of an FP8
 * [rows, cols] weight, each checked for dtype and shape, then the values
 * (mf_qweight_check: no NaN code, scales finite and >= 0). */
mf_status mf_fp8_read(const mf_safetensors *st, const char *path, const char *name, int64_t rows, int64_t cols,
                      uint8_t *blob);

/* Either format: how st ships weight `name` (NF4: bitsandbytes, FP8, or
 * NONE: not quantized); 1 when tensor `name` is a quantized weight's
 * companion (its scales or quant state; weight[cap] gets the weight's name);
 * the weight's format (its quant state's, for NF4); its blob. */
mf_quant_kind mf_shipped_kind(const mf_safetensors *st, const char *name);
int mf_shipped_companion(const char *name, char *weight, size_t cap);
mf_status mf_shipped_describe(const mf_safetensors *st, const char *path, const char *name, int64_t rows,
                              int64_t cols, mf_qweight *w);
mf_status mf_shipped_read(const mf_safetensors *st, const char *path, const char *name, const mf_qweight *w,
                          uint8_t *blob);

#ifdef __cplusplus
}
#endif

#endif /* MF_IO_QUANT_H */
