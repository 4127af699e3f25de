/* The AdamW loop body written with AVX-512 intrinsics: 16 lanes a vector, two
 * vectors an iteration, the tail under a lane mask (no scalar remainder).
 *
 * Each lane runs exactly the sequence of adamw_elem (adamw_tile.c), operation
 * for operation and operand for operand: vmulps, vsubps, vfmadd (one rounding,
 * where the reference calls fmaf), vsqrtps, vdivps and vaddps are the IEEE
 * operations of their scalar forms, so every lane's bits equal the scalar
 * body's, denormals included (MXCSR is left at its default: no FTZ/DAZ). Built
 * with -mavx512f -mavx512bw -mavx512vl -ffp-contract=off (BUILD); chosen only
 * when cpuid says avx512f/bw/vl (adamw.c). bf16 gradients and moments are
 * widened (vpmovzxwd, vpslld: exact) where loaded and rounded by to_bf16 where
 * stored: mf_bf16_to_fp32 and mf_fp32_to_bf16 lane by lane. */
#include "src/optim/adamw_impl.h"

#if defined(__x86_64__) && defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#include <immintrin.h>

typedef struct vcoefs {
  __m512 decay, w, beta2, one_minus_b2, bc2_sqrt, eps, neg_step;
} vcoefs;

/* mf_fp32_to_bf16 on 16 lanes: NaN -> quieted top half, else round to nearest even. */
static inline __m256i to_bf16(__m512 x) {
  const __m512i u = _mm512_castps_si512(x);
  const __m512i abs = _mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff));
  const __mmask16 nan = _mm512_cmpgt_epu32_mask(abs, _mm512_set1_epi32(0x7f800000));
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  const __m512i rounded =
      _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), lsb)), 16);
  const __m512i quiet = _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x0040));
  return _mm512_cvtepi32_epi16(_mm512_mask_blend_epi32(nan, rounded, quiet));
}

/* One vector of elements; `small` picks the lerp form as adamw_elem does. */
static inline void step16(const vcoefs *k, const int small, __m512 pv, __m512 gv, __m512 mv, __m512 vv,
                          __m512 *po, __m512 *mo, __m512 *vo) {
  const __m512 pi = _mm512_mul_ps(pv, k->decay);
  const __m512 d = _mm512_sub_ps(gv, mv);
  const __m512 mi = _mm512_fmadd_ps(k->w, d, small ? mv : gv);
  const __m512 vi = _mm512_fmadd_ps(_mm512_mul_ps(k->one_minus_b2, gv), gv, _mm512_mul_ps(vv, k->beta2));
  const __m512 denom = _mm512_add_ps(_mm512_div_ps(_mm512_sqrt_ps(vi), k->bc2_sqrt), k->eps);
  const __m512 sum = _mm512_add_ps(pi, _mm512_div_ps(_mm512_mul_ps(k->neg_step, mi), denom));
  *po = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(pi, pi, _CMP_UNORD_Q), sum, pi); /* a NaN pi kept */
  *mo = mi;
  *vo = vi;
}

/* Loads and stores of one vector of an fp32 or bf16 buffer (bf: constant).
 * A bf16 load widens exactly (zero-extend, shift up 16): mf_bf16_to_fp32. */
static inline __m512 load16(const void *base, const int bf, size_t i) {
  if (!bf) return _mm512_loadu_ps((const float *)base + i);
  const __m256i h = _mm256_loadu_si256((const __m256i *)((const uint16_t *)base + i));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
static inline __m512 load16_mask(const void *base, const int bf, __mmask16 k, size_t i) {
  if (!bf) return _mm512_maskz_loadu_ps(k, (const float *)base + i);
  const __m256i h = _mm256_maskz_loadu_epi16(k, (const uint16_t *)base + i);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
static inline void store16(void *base, const int bf, size_t i, __m512 x) {
  if (bf)
    _mm256_storeu_si256((__m256i *)((uint16_t *)base + i), to_bf16(x));
  else
    _mm512_storeu_ps((float *)base + i, x);
}
static inline void store16_mask(void *base, const int bf, __mmask16 k, size_t i, __m512 x) {
  if (bf)
    _mm256_mask_storeu_epi16((uint16_t *)base + i, k, to_bf16(x));
  else
    _mm512_mask_storeu_ps((float *)base + i, k, x);
}

/* gbf, mbf: the gradient / the moments are bf16 (constants of each instantiation). */
static inline __attribute__((always_inline)) void loop(const vcoefs *k, const int small, const int gbf,
                                                       const int mbf, float *p, const void *g, void *m,
                                                       void *v, uint16_t *bf16, size_t n) {
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    __m512 p0, m0, v0, p1, m1, v1;
    step16(k, small, _mm512_loadu_ps(p + i), load16(g, gbf, i), load16(m, mbf, i), load16(v, mbf, i), &p0,
           &m0, &v0);
    step16(k, small, _mm512_loadu_ps(p + i + 16), load16(g, gbf, i + 16), load16(m, mbf, i + 16),
           load16(v, mbf, i + 16), &p1, &m1, &v1);
    _mm512_storeu_ps(p + i, p0);
    store16(m, mbf, i, m0);
    store16(v, mbf, i, v0);
    _mm512_storeu_ps(p + i + 16, p1);
    store16(m, mbf, i + 16, m1);
    store16(v, mbf, i + 16, v1);
    if (bf16) {
      _mm256_storeu_si256((__m256i *)(bf16 + i), to_bf16(p0));
      _mm256_storeu_si256((__m256i *)(bf16 + i + 16), to_bf16(p1));
    }
  }
  for (; i < n; i += 16) { /* masked: inactive lanes are neither read nor written */
    const size_t left = n - i;
    const __mmask16 k16 = left >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1u);
    __m512 po, mo, vo;
    step16(k, small, _mm512_maskz_loadu_ps(k16, p + i), load16_mask(g, gbf, k16, i),
           load16_mask(m, mbf, k16, i), load16_mask(v, mbf, k16, i), &po, &mo, &vo);
    _mm512_mask_storeu_ps(p + i, k16, po);
    store16_mask(m, mbf, k16, i, mo);
    store16_mask(v, mbf, k16, i, vo);
    if (bf16) _mm256_mask_storeu_epi16(bf16 + i, k16, to_bf16(po));
  }
}

/* One instantiation per lerp form and dtype combination. */
static inline __attribute__((always_inline)) void loop_small(const vcoefs *k, const int gbf, const int mbf,
                                                             int small, float *p, const void *g, void *m,
                                                             void *v, uint16_t *bf16, size_t n) {
  if (small)
    loop(k, 1, gbf, mbf, p, g, m, v, bf16, n);
  else
    loop(k, 0, gbf, mbf, p, g, m, v, bf16, n);
}

void mf_adamw_tile_avx512(const mf_adamw_coefs *c, int kind, float *p, const void *g, void *m, void *v,
                          uint16_t *bf16, size_t n) {
  vcoefs k;
  k.decay = _mm512_set1_ps(c->decay);
  k.w = _mm512_set1_ps(c->w1_small ? c->w1 : c->w1_minus_1);
  k.beta2 = _mm512_set1_ps(c->beta2);
  k.one_minus_b2 = _mm512_set1_ps(c->one_minus_b2);
  k.bc2_sqrt = _mm512_set1_ps(c->bc2_sqrt);
  k.eps = _mm512_set1_ps(c->eps);
  k.neg_step = _mm512_set1_ps(c->neg_step);
  switch (kind & (MF_ADAMW_G_BF16 | MF_ADAMW_M_BF16)) {
    case 0:
      loop_small(&k, 0, 0, c->w1_small, p, g, m, v, bf16, n);
      break;
    case MF_ADAMW_G_BF16:
      loop_small(&k, 1, 0, c->w1_small, p, g, m, v, bf16, n);
      break;
    case MF_ADAMW_M_BF16:
      loop_small(&k, 0, 1, c->w1_small, p, g, m, v, bf16, n);
      break;
    default:
      loop_small(&k, 1, 1, c->w1_small, p, g, m, v, bf16, n);
      break;
  }
}
#endif
