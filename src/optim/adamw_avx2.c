/* The AdamW loop body written with AVX2+FMA intrinsics: 8 lanes a vector, two
 * vectors an iteration; the last n % 16 elements go to the portable body.
 *
 * Each lane runs exactly the sequence of adamw_elem (adamw_tile.c), operation
 * for operation and operand for operand (see adamw_avx512.c for why the bits
 * match). Built with -mavx2 -mfma -ffp-contract=off (BUILD); chosen only when
 * cpuid says avx2 and fma (adamw.c). bf16 gradients and moments are widened
 * (vpmovzxwd, vpslld: exact) where loaded and rounded by to_bf16_32 where
 * stored: mf_bf16_to_fp32 and mf_fp32_to_bf16 lane by lane. */
#include "src/optim/adamw_impl.h"

#if defined(__x86_64__) && defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>

typedef struct vcoefs {
  __m256 decay, w, beta2, one_minus_b2, bc2_sqrt, eps, neg_step;
} vcoefs;

/* mf_fp32_to_bf16 on 8 lanes, left in the low half of each 32-bit lane. */
static inline __m256i to_bf16_32(__m256 x) {
  const __m256i u = _mm256_castps_si256(x);
  const __m256i abs = _mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff));
  const __m256i nan = _mm256_cmpgt_epi32(abs, _mm256_set1_epi32(0x7f800000)); /* abs >= 0: signed is fine */
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  const __m256i rounded =
      _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), lsb)), 16);
  const __m256i quiet = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x0040));
  return _mm256_blendv_epi8(rounded, quiet, nan);
}

/* 16 bf16 values in element order (packus interleaves 128-bit halves). */
static inline void store_bf16(uint16_t *dst, __m256 a, __m256 b) {
  const __m256i packed = _mm256_packus_epi32(to_bf16_32(a), to_bf16_32(b)); /* values <= 0xffff */
  _mm256_storeu_si256((__m256i *)dst, _mm256_permute4x64_epi64(packed, 0xd8));
}

static inline void step8(const vcoefs *k, const int small, __m256 pv, __m256 gv, __m256 mv, __m256 vv,
                         __m256 *po, __m256 *mo, __m256 *vo) {
  const __m256 pi = _mm256_mul_ps(pv, k->decay);
  const __m256 d = _mm256_sub_ps(gv, mv);
  const __m256 mi = _mm256_fmadd_ps(k->w, d, small ? mv : gv);
  const __m256 vi = _mm256_fmadd_ps(_mm256_mul_ps(k->one_minus_b2, gv), gv, _mm256_mul_ps(vv, k->beta2));
  const __m256 denom = _mm256_add_ps(_mm256_div_ps(_mm256_sqrt_ps(vi), k->bc2_sqrt), k->eps);
  const __m256 sum = _mm256_add_ps(pi, _mm256_div_ps(_mm256_mul_ps(k->neg_step, mi), denom));
  *po = _mm256_blendv_ps(sum, pi, _mm256_cmp_ps(pi, pi, _CMP_UNORD_Q)); /* a NaN pi kept */
  *mo = mi;
  *vo = vi;
}

/* 8 elements of an fp32 or bf16 buffer (bf: constant); a bf16 load widens
 * exactly (zero-extend, shift up 16): mf_bf16_to_fp32. */
static inline __m256 load8(const void *base, const int bf, size_t i) {
  if (!bf) return _mm256_loadu_ps((const float *)base + i);
  const __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)base + i));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
/* 16 elements: a then b. */
static inline void store16(void *base, const int bf, size_t i, __m256 a, __m256 b) {
  if (bf) {
    store_bf16((uint16_t *)base + i, a, b);
  } else {
    _mm256_storeu_ps((float *)base + i, a);
    _mm256_storeu_ps((float *)base + i + 8, b);
  }
}

/* gbf, mbf: the gradient / the moments are bf16 (constants of each instantiation). */
static inline __attribute__((always_inline)) size_t loop(const vcoefs *k, const int small, const int gbf,
                                                         const int mbf, float *p, const void *g, void *m,
                                                         void *v, uint16_t *bf16, size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m256 p0, m0, v0, p1, m1, v1;
    step8(k, small, _mm256_loadu_ps(p + i), load8(g, gbf, i), load8(m, mbf, i), load8(v, mbf, i), &p0, &m0,
          &v0);
    step8(k, small, _mm256_loadu_ps(p + i + 8), load8(g, gbf, i + 8), load8(m, mbf, i + 8),
          load8(v, mbf, i + 8), &p1, &m1, &v1);
    _mm256_storeu_ps(p + i, p0);
    _mm256_storeu_ps(p + i + 8, p1);
    store16(m, mbf, i, m0, m1);
    store16(v, mbf, i, v0, v1);
    if (bf16) store_bf16(bf16 + i, p0, p1);
  }
  return i;
}

static inline __attribute__((always_inline)) size_t loop_small(const vcoefs *k, const int gbf, const int mbf,
                                                               int small, float *p, const void *g, void *m,
                                                               void *v, uint16_t *bf16, size_t n) {
  return small ? loop(k, 1, gbf, mbf, p, g, m, v, bf16, n) : loop(k, 0, gbf, mbf, p, g, m, v, bf16, n);
}

void mf_adamw_tile_avx2(const mf_adamw_coefs *c, int kind, float *p, const void *g, void *m, void *v,
                        uint16_t *bf16, size_t n) {
  vcoefs k;
  k.decay = _mm256_set1_ps(c->decay);
  k.w = _mm256_set1_ps(c->w1_small ? c->w1 : c->w1_minus_1);
  k.beta2 = _mm256_set1_ps(c->beta2);
  k.one_minus_b2 = _mm256_set1_ps(c->one_minus_b2);
  k.bc2_sqrt = _mm256_set1_ps(c->bc2_sqrt);
  k.eps = _mm256_set1_ps(c->eps);
  k.neg_step = _mm256_set1_ps(c->neg_step);
  const int gbf = (kind & MF_ADAMW_G_BF16) != 0, mbf = (kind & MF_ADAMW_M_BF16) != 0;
  size_t done;
  if (!gbf && !mbf)
    done = loop_small(&k, 0, 0, c->w1_small, p, g, m, v, bf16, n);
  else if (gbf && !mbf)
    done = loop_small(&k, 1, 0, c->w1_small, p, g, m, v, bf16, n);
  else if (!gbf)
    done = loop_small(&k, 0, 1, c->w1_small, p, g, m, v, bf16, n);
  else
    done = loop_small(&k, 1, 1, c->w1_small, p, g, m, v, bf16, n);
  if (done < n) {
    const size_t gs = gbf ? 2 : 4, ms = mbf ? 2 : 4; /* bytes per element */
    mf_adamw_tile_scalar(c, kind, p + done, (const char *)g + done * gs, (char *)m + done * ms,
                         (char *)v + done * ms, bf16 ? bf16 + done : NULL, n - done);
  }
}
#endif
