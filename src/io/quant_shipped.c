/* Weights as checkpoints ship them quantized (quant.h, "Checkpoints shipped
 * quantized"): bitsandbytes 4-bit as transformers writes it (the packed codes
 * and the quant state's tensors) and FP8 e4m3 with 128 x 128 block scales
 * (weight_scale_inv), each copied into one blob in moefit's layout
 * (src/core/qformat.h), every piece checked against the weight it belongs to. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "src/io/json_util.h"
#include "src/io/quant.h"

#define QS_SUFFIX ".quant_state.bitsandbytes__"

static const char *const k_parts[] = {".absmax",           ".quant_map",    ".nested_absmax",
                                      ".nested_quant_map", QS_SUFFIX "nf4", QS_SUFFIX "fp4"};

#define FP8_SUFFIX "_scale_inv"

static const mf_st_tensor *part(const mf_safetensors *st, const char *name, const char *suffix) {
  char full[1024];
  if ((size_t)snprintf(full, sizeof full, "%s%s", name, suffix) >= sizeof full) return NULL;
  return mf_safetensors_find(st, full);
}

int mf_bnb4_stored(const mf_safetensors *st, const char *name) {
  return part(st, name, QS_SUFFIX "nf4") != NULL || part(st, name, QS_SUFFIX "fp4") != NULL;
}

/* 1 when name ends in suffix (after at least one character): weight[cap] gets the rest. */
static int strip_suffix(const char *name, const char *suffix, char *weight, size_t cap) {
  const size_t n = strlen(name), s = strlen(suffix);
  if (n <= s || strcmp(name + n - s, suffix) != 0 || n - s >= cap) return 0;
  memcpy(weight, name, n - s);
  weight[n - s] = 0;
  return 1;
}

int mf_bnb4_companion(const char *name, char *weight, size_t cap) {
  for (size_t k = 0; k < sizeof k_parts / sizeof k_parts[0]; k++)
    if (strip_suffix(name, k_parts[k], weight, cap)) return 1;
  return 0;
}

static void shape_text(const mf_st_tensor *x, char *buf, size_t cap) {
  size_t n = (size_t)snprintf(buf, cap, "%s [", mf_dtype_name(x->dtype));
  for (int d = 0; d < x->ndim && n < cap; d++)
    n += (size_t)snprintf(buf + n, cap - n, "%s%lld", d ? ", " : "", (long long)x->shape[d]);
  if (n < cap) snprintf(buf + n, cap - n, "]");
}

/* Tensor name+suffix: there, of dtype dt and numel elements. */
static mf_status need(const mf_safetensors *st, const char *path, const char *name, const char *suffix,
                      mf_dtype dt, int64_t numel, const char *why, const mf_st_tensor **out) {
  const mf_st_tensor *x = part(st, name, suffix);
  if (!x)
    return MF_ERR(MF_ERR_FORMAT, "%s: tensor %s%s is missing (%s, stored %s)", path, name, suffix, why,
                  strcmp(suffix, FP8_SUFFIX) == 0 ? "fp8" : "by bitsandbytes 4-bit");
  if (x->dtype != dt || (int64_t)x->numel != numel) {
    char got[96];
    shape_text(x, got, sizeof got);
    return MF_ERR(MF_ERR_FORMAT, "%s: tensor %s%s is %s; %s is %s of %lld elements", path, name, suffix, got,
                  why, mf_dtype_name(dt), (long long)numel);
  }
  *out = x;
  return MF_OK;
}

/* The quant state's JSON (bitsandbytes' QuantState.as_dict(packed=True): the
 * non-tensor items, json.dumps'ed into a uint8 tensor). */
static mf_status quant_state(const mf_safetensors *st, const char *path, const char *name, int64_t rows,
                             int64_t cols, mf_qweight *w) {
  char where[1100], clean[64];
  if (part(st, name, QS_SUFFIX "fp4"))
    return MF_ERR(MF_ERR_UNSUPPORTED, "%s: %s is stored bitsandbytes fp4; nf4 is read", path, name);
  const mf_st_tensor *x = part(st, name, QS_SUFFIX "nf4");
  snprintf(where, sizeof where, "%s: tensor %s" QS_SUFFIX "nf4", path, name);
  if (!x) return MF_ERR(MF_ERR_FORMAT, "%s is missing", where);
  if (x->dtype != MF_DTYPE_U8 || x->ndim != 1)
    return MF_ERR(MF_ERR_FORMAT, "%s is %s; bitsandbytes packs its JSON in a 1-D U8 tensor", where,
                  mf_dtype_name(x->dtype));
  if (x->numel > 65536)
    return MF_ERR(MF_ERR_FORMAT, "%s: %llu bytes of JSON", where, (unsigned long long)x->numel);
  json_error_t je;
  json_t *j = json_loadb((const char *)x->data, x->nbytes, JSON_REJECT_DUPLICATES, &je);
  if (!j)
    return MF_ERR(MF_ERR_FORMAT, "%s: invalid JSON: %s", where,
                  mf_io_json_printable(je.text, clean, sizeof clean));
  mf_status s = MF_OK;
  const json_t *qt = json_object_get(j, "quant_type"), *bs = json_object_get(j, "blocksize"),
               *sh = json_object_get(j, "shape"), *nb = json_object_get(j, "nested_blocksize"),
               *off = json_object_get(j, "nested_offset");
  if (!json_is_object(j)) {
    s = MF_ERR(MF_ERR_FORMAT, "%s: expected a JSON object", where);
  } else if (!json_is_string(qt) || strcmp(json_string_value(qt), "nf4") != 0) {
    s = MF_ERR(MF_ERR_FORMAT, "%s: quant_type is %s%s%s, not \"nf4\"", where, json_is_string(qt) ? "\"" : "",
               json_is_string(qt) ? mf_io_json_printable(json_string_value(qt), clean, sizeof clean)
                                  : mf_io_json_kind(qt, 1),
               json_is_string(qt) ? "\"" : "");
  } else if (!json_is_integer(bs)) {
    s = MF_ERR(MF_ERR_FORMAT, "%s: blocksize must be an integer, got %s", where, mf_io_json_kind(bs, 1));
  } else if (!mf_nf4_blocksize_ok(json_integer_value(bs))) {
    s = MF_ERR(MF_ERR_FORMAT, "%s: blocksize %lld is not a power of two in 32..4096", where,
               (long long)json_integer_value(bs));
  } else if (!json_is_array(sh) || json_array_size(sh) != 2 || !json_is_integer(json_array_get(sh, 0)) ||
             !json_is_integer(json_array_get(sh, 1))) {
    s = MF_ERR(MF_ERR_FORMAT, "%s: shape must be [rows, cols]", where);
  } else if (json_integer_value(json_array_get(sh, 0)) != rows ||
             json_integer_value(json_array_get(sh, 1)) != cols) {
    s = MF_ERR(MF_ERR_FORMAT, "%s: shape [%lld, %lld] but the config says [%lld, %lld]", where,
               (long long)json_integer_value(json_array_get(sh, 0)),
               (long long)json_integer_value(json_array_get(sh, 1)), (long long)rows, (long long)cols);
  } else if (nb && (!json_is_integer(nb) || json_integer_value(nb) != MF_NF4_DQ_BLOCK)) {
    s = MF_ERR(MF_ERR_FORMAT, "%s: nested_blocksize must be %d (bitsandbytes' double quantization)", where,
               MF_NF4_DQ_BLOCK);
  } else if (nb && !(json_is_number(off) && isfinite(json_number_value(off)))) {
    s = MF_ERR(MF_ERR_FORMAT, "%s: nested_offset must be a finite number", where);
  } else if (!nb && off) {
    s = MF_ERR(MF_ERR_FORMAT, "%s: nested_offset without nested_blocksize", where);
  } else {
    w->kind = MF_QUANT_NF4;
    w->rows = rows, w->cols = cols;
    w->blocksize = json_integer_value(bs);
    w->nested = nb != NULL;
    w->offset = nb ? (float)json_number_value(off) : 0.0f; /* an fp32's value, printed by Python: exact */
    if (nb && (double)w->offset != json_number_value(off))
      s = MF_ERR(MF_ERR_FORMAT, "%s: nested_offset %.17g is not an fp32 value", where,
                 json_number_value(off));
  }
  json_decref(j);
  return s;
}

mf_status mf_bnb4_describe(const mf_safetensors *st, const char *path, const char *name, int64_t rows,
                           int64_t cols, mf_qweight *w) {
  memset(w, 0, sizeof *w);
  return quant_state(st, path, name, rows, cols, w);
}

mf_status mf_bnb4_read(const mf_safetensors *st, const char *path, const char *name, const mf_qweight *w,
                       uint8_t *blob) {
  const int64_t n = w->rows * w->cols, nb = mf_quant_blocks(n, w->blocksize);
  char why[160];
  const mf_st_tensor *q = mf_safetensors_find(st, name), *absmax = NULL, *map = NULL;
  if (!q) return MF_ERR(MF_ERR_FORMAT, "%s: tensor %s is missing", path, name);
  if (q->dtype != MF_DTYPE_U8 || (int64_t)q->numel != (n + 1) / 2) {
    char got[96];
    shape_text(q, got, sizeof got);
    return MF_ERR(
        MF_ERR_FORMAT,
        "%s: tensor %s is %s; its quant state says %lld x %lld nf4 weights, packed in U8 of %lld bytes", path,
        name, got, (long long)w->rows, (long long)w->cols, (long long)((n + 1) / 2));
  }
  snprintf(why, sizeof why, "the %lld blocks of %lld", (long long)nb, (long long)w->blocksize);
  MF_CHECK(need(st, path, name, ".absmax", w->nested ? MF_DTYPE_U8 : MF_DTYPE_F32, nb,
                w->nested ? "the double-quantized absmax of the blocks" : why, &absmax));
  MF_CHECK(need(st, path, name, ".quant_map", MF_DTYPE_F32, 16, "the NF4 values", &map));
  float code[16];
  memcpy(code, map->data, sizeof code);
  for (int k = 0; k < 16; k++)
    if (memcmp(&code[k], &mf_nf4_code[k], 4) != 0)
      return MF_ERR(MF_ERR_FORMAT, "%s: tensor %s.quant_map[%d] is %.9g; bitsandbytes' NF4 value is %.9g",
                    path, name, k, (double)code[k], (double)mf_nf4_code[k]);
  memset(blob, 0, (size_t)mf_qweight_blob_bytes(w));
  memcpy(blob, q->data, (size_t)mf_qweight_q_bytes(w));
  memcpy(blob + mf_qweight_blob_scales_at(w), absmax->data, (size_t)mf_qweight_scale_bytes(w));
  if (w->nested) {
    const mf_st_tensor *a2 = NULL, *c2 = NULL;
    MF_CHECK(need(st, path, name, ".nested_absmax", MF_DTYPE_F32, mf_qweight_absmax2_count(w),
                  "the absmax of the absmax's blocks of 256", &a2));
    MF_CHECK(need(st, path, name, ".nested_quant_map", MF_DTYPE_F32, 256, "the absmax's 8-bit map", &c2));
    memcpy(blob + mf_qweight_blob_absmax2_at(w), a2->data, a2->nbytes);
    memcpy(blob + mf_qweight_blob_code2_at(w), c2->data, 1024);
    memcpy(blob + mf_qweight_blob_offset_at(w), &w->offset, 4);
  }
  mf_qweight v = *w;
  mf_qweight_blob_view(&v, blob);
  char what[1100];
  snprintf(what, sizeof what, "%s: %s", path, name);
  return mf_qweight_check(&v, what);
}

/* ------------------------------------------------------------------ FP8 */

int mf_fp8_stored(const mf_safetensors *st, const char *name) {
  return part(st, name, FP8_SUFFIX) != NULL;
}

mf_status mf_fp8_read(const mf_safetensors *st, const char *path, const char *name, int64_t rows,
                      int64_t cols, uint8_t *blob) {
  mf_qweight w = {.kind = MF_QUANT_FP8, .rows = rows, .cols = cols};
  const int64_t br = mf_quant_blocks(rows, MF_FP8_BLOCK), bc = mf_quant_blocks(cols, MF_FP8_BLOCK);
  const mf_st_tensor *q = mf_safetensors_find(st, name), *s = part(st, name, FP8_SUFFIX);
  char got[96];
  if (!q)
    return MF_ERR(MF_ERR_FORMAT, "%s: tensor %s is missing (its %s" FP8_SUFFIX " is there)", path, name,
                  name);
  if (q->dtype != MF_DTYPE_F8_E4M3 || q->ndim != 2 || (int64_t)q->shape[0] != rows ||
      (int64_t)q->shape[1] != cols) {
    shape_text(q, got, sizeof got);
    return MF_ERR(MF_ERR_FORMAT,
                  "%s: tensor %s is %s; a weight with a %s" FP8_SUFFIX " is F8_E4M3 [%lld, %lld]", path, name,
                  got, name, (long long)rows, (long long)cols);
  }
  if (!s) return MF_ERR(MF_ERR_FORMAT, "%s: tensor %s" FP8_SUFFIX " is missing", path, name);
  if ((s->dtype != MF_DTYPE_F32 && s->dtype != MF_DTYPE_BF16) || s->ndim != 2 || (int64_t)s->shape[0] != br ||
      (int64_t)s->shape[1] != bc) {
    shape_text(s, got, sizeof got);
    return MF_ERR(MF_ERR_FORMAT,
                  "%s: tensor %s" FP8_SUFFIX
                  " is %s; the scales of a [%lld, %lld] weight in blocks of %d x %d are "
                  "F32 (or BF16) [%lld, %lld]",
                  path, name, got, (long long)rows, (long long)cols, MF_FP8_BLOCK, MF_FP8_BLOCK,
                  (long long)br, (long long)bc);
  }
  memset(blob, 0, (size_t)mf_qweight_blob_bytes(&w));
  memcpy(blob, q->data, (size_t)mf_qweight_q_bytes(&w));
  float *scales = (float *)(blob + mf_qweight_blob_scales_at(&w));
  if (s->dtype == MF_DTYPE_F32) {
    memcpy(scales, s->data, (size_t)(br * bc * 4));
  } else {
    const uint8_t *h = (const uint8_t *)s->data; /* a file's bytes: no alignment assumed */
    for (int64_t k = 0; k < br * bc; k++) {
      uint16_t b;
      memcpy(&b, h + 2 * k, 2);
      const uint32_t u = (uint32_t)b << 16; /* bf16 widened: exact */
      memcpy(&scales[k], &u, 4);
    }
  }
  mf_qweight_blob_view(&w, blob);
  char what[1100];
  snprintf(what, sizeof what, "%s: %s", path, name);
  return mf_qweight_check(&w, what);
}

/* ------------------------------------------------------- either format */

mf_quant_kind mf_shipped_kind(const mf_safetensors *st, const char *name) {
  if (mf_bnb4_stored(st, name)) return MF_QUANT_NF4;
  if (mf_fp8_stored(st, name)) return MF_QUANT_FP8;
  return MF_QUANT_NONE;
}

int mf_shipped_companion(const char *name, char *weight, size_t cap) {
  return mf_bnb4_companion(name, weight, cap) || strip_suffix(name, FP8_SUFFIX, weight, cap);
}

mf_status mf_shipped_describe(const mf_safetensors *st, const char *path, const char *name, int64_t rows,
                              int64_t cols, mf_qweight *w) {
  if (mf_bnb4_stored(st, name)) return mf_bnb4_describe(st, path, name, rows, cols, w);
  memset(w, 0, sizeof *w);
  if (!mf_fp8_stored(st, name))
    return MF_ERR(MF_ERR_INTERNAL, "%s: %s is not stored quantized (mf_shipped_describe)", path, name);
  w->kind = MF_QUANT_FP8;
  w->rows = rows, w->cols = cols;
  return MF_OK;
}

mf_status mf_shipped_read(const mf_safetensors *st, const char *path, const char *name, const mf_qweight *w,
                          uint8_t *blob) {
  if (w->kind == MF_QUANT_FP8) return mf_fp8_read(st, path, name, w->rows, w->cols, blob);
  return mf_bnb4_read(st, path, name, w, blob);
}
