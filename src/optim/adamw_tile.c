/* The AdamW loop bodies. One body, written once as always-inline functions,
 * compiled twice: portable (fmaf is libm's, exact on any CPU) and for x86
 * AVX2+FMA (fmaf is one instruction and the compiler vectorizes the loop;
 * vsqrtps, vdivps and vfmadd round exactly as their scalar forms, so the bits
 * do not change). The hand-written AVX-512 / AVX2 bodies (adamw_avx512.c,
 * adamw_avx2.c) follow adamw_elem operand for operand. The loop-invariant
 * choices (lerp branch, bf16 copy or not, the gradient's and the moments'
 * dtypes) are made outside the loop: each combination is a loop of its own.
 * -ffp-contract=off (BUILD) keeps the compiler from fusing anything the body
 * does not fuse itself. */
#if defined(__GNUC__) && !defined(__clang__)
/* GCC's -O2 cost model ("very-cheap") vectorizes no loop of unknown length;
 * clang's -O2 does without being asked. */
#pragma GCC optimize("vect-cost-model=dynamic")
#endif

#include <math.h>

#include "src/core/core.h"
#include "src/optim/adamw_impl.h"

#define ALWAYS_INLINE static inline __attribute__((always_inline))

/* The buffers of a tile, typed: of g, m and v only the pointer of the dtype
 * the body was instantiated for is read (the other is NULL). */
typedef struct tile {
  float *restrict p;
  const float *restrict gf;
  const uint16_t *restrict gh;
  float *restrict mf, *restrict vf;
  uint16_t *restrict mh, *restrict vh;
  uint16_t *restrict bf16;
} tile;

/* gbf, mbf: gradient / moments in bf16 (constants of each instantiation). */
ALWAYS_INLINE void adamw_elem(const mf_adamw_coefs c, const int small, const int gbf, const int mbf,
                              const tile t, const int out, size_t i) {
  const float gi = gbf ? mf_bf16_to_fp32(t.gh[i]) : t.gf[i];
  const float m0 = mbf ? mf_bf16_to_fp32(t.mh[i]) : t.mf[i];
  const float v0 = mbf ? mf_bf16_to_fp32(t.vh[i]) : t.vf[i];
  const float pi = t.p[i] * c.decay;
  const float d = gi - m0;
  /* torch's lerp: ATen's lerp_vec, fmadd(coeff, end - start, base) */
  const float mi = small ? fmaf(c.w1, d, m0) : fmaf(c.w1_minus_1, d, gi);
  /* mul_(beta2) then addcmul_: self + (value * t1) * t2, fused in ATen's build */
  const float vi = fmaf(c.one_minus_b2 * gi, gi, v0 * c.beta2);
  const float denom = sqrtf(vi) / c.bc2_sqrt + c.eps;
  /* a NaN pi is kept as it is even when the quotient is NaN too: which NaN an
   * add of two NaNs returns depends on the operand order the compiler picks */
  const float sum = pi + (c.neg_step * mi) / denom; /* unconditional: the select below vectorizes */
  const float pn = isnan(pi) ? pi : sum;
  if (mbf) {
    t.mh[i] = mf_fp32_to_bf16(mi);
    t.vh[i] = mf_fp32_to_bf16(vi);
  } else {
    t.mf[i] = mi;
    t.vf[i] = vi;
  }
  t.p[i] = pn;
  if (out) t.bf16[i] = mf_fp32_to_bf16(pn);
}

ALWAYS_INLINE void adamw_loop(const mf_adamw_coefs *c, const int small, const int gbf, const int mbf,
                              const tile *t, const int out, size_t n) {
  const mf_adamw_coefs cc = *c; /* by value: the stores below cannot alias it */
  const tile tt = *t;
  for (size_t i = 0; i < n; i++) adamw_elem(cc, small, gbf, mbf, tt, out, i);
}

/* The loop-invariant choices, each a constant of its own loop. */
ALWAYS_INLINE void adamw_body2(const mf_adamw_coefs *c, const int gbf, const int mbf, const tile *t,
                               size_t n) {
  if (c->w1_small) {
    if (t->bf16)
      adamw_loop(c, 1, gbf, mbf, t, 1, n);
    else
      adamw_loop(c, 1, gbf, mbf, t, 0, n);
  } else {
    if (t->bf16)
      adamw_loop(c, 0, gbf, mbf, t, 1, n);
    else
      adamw_loop(c, 0, gbf, mbf, t, 0, n);
  }
}

ALWAYS_INLINE void adamw_body(const mf_adamw_coefs *c, int kind, float *p, const void *g, void *m, void *v,
                              uint16_t *bf16, size_t n) {
  const int gbf = (kind & MF_ADAMW_G_BF16) != 0, mbf = (kind & MF_ADAMW_M_BF16) != 0;
  const tile t = {p,
                  gbf ? NULL : (const float *)g,
                  gbf ? (const uint16_t *)g : NULL,
                  mbf ? NULL : (float *)m,
                  mbf ? NULL : (float *)v,
                  mbf ? (uint16_t *)m : NULL,
                  mbf ? (uint16_t *)v : NULL,
                  bf16};
  switch (kind & (MF_ADAMW_G_BF16 | MF_ADAMW_M_BF16)) {
    case 0:
      adamw_body2(c, 0, 0, &t, n);
      break;
    case MF_ADAMW_G_BF16:
      adamw_body2(c, 1, 0, &t, n);
      break;
    case MF_ADAMW_M_BF16:
      adamw_body2(c, 0, 1, &t, n);
      break;
    default:
      adamw_body2(c, 1, 1, &t, n);
      break;
  }
}

void mf_adamw_tile_scalar(const mf_adamw_coefs *c, int kind, float *p, const void *g, void *m, void *v,
                          uint16_t *bf16, size_t n) {
  adamw_body(c, kind, p, g, m, v, bf16, n);
}

#if defined(__x86_64__)
__attribute__((target("avx2,fma"))) void mf_adamw_tile_fma(const mf_adamw_coefs *c, int kind, float *p,
                                                           const void *g, void *m, void *v, uint16_t *bf16,
                                                           size_t n) {
  adamw_body(c, kind, p, g, m, v, bf16, n);
}
#endif
