/* The AdamW loop bodies. One body, written once as always-inline functions,
 * compiled twice: portable (fmaf is libm's, exact on any CPU) and for x86
 * AVX2+FMA (fmaf is one instruction and the compiler vectorizes the loop;
 * vsqrtps, vdivps and vfmadd round exactly as their scalar forms, so the bits
 * do not change). The hand-written AVX-512 / AVX2 bodies (adamw_avx512.c,
 * adamw_avx2.c) follow adamw_elem operand for operand. The loop-invariant choices (lerp branch, bf16 copy or not) are made
 * outside the loop. -ffp-contract=off (BUILD) keeps the compiler from fusing
 * anything the body does not fuse itself. */
#if defined(__GNUC__) && !defined(__clang__)
/* GCC's -O2 cost model ("very-cheap") vectorizes no loop of unknown length;
 * clang's -O2 does without being asked. */
#pragma GCC optimize("vect-cost-model=dynamic")
#endif

#include <math.h>

#include "src/core/core.h"
#include "src/optim/adamw_impl.h"

#define ALWAYS_INLINE static inline __attribute__((always_inline))

ALWAYS_INLINE void adamw_elem(const mf_adamw_coefs c, const int small, float *restrict p,
                              const float *restrict g, float *restrict m, float *restrict v,
                              uint16_t *restrict bf16, size_t i) {
  const float gi = g[i];
  const float pi = p[i] * c.decay;
  const float d = gi - m[i];
  /* torch's lerp: ATen's lerp_vec, fmadd(coeff, end - start, base) */
  const float mi = small ? fmaf(c.w1, d, m[i]) : fmaf(c.w1_minus_1, d, gi);
  /* mul_(beta2) then addcmul_: self + (value * t1) * t2, fused in ATen's build */
  const float vi = fmaf(c.one_minus_b2 * gi, gi, v[i] * c.beta2);
  const float denom = sqrtf(vi) / c.bc2_sqrt + c.eps;
  const float pn = pi + (c.neg_step * mi) / denom;
  m[i] = mi;
  v[i] = vi;
  p[i] = pn;
  if (bf16) bf16[i] = mf_fp32_to_bf16(pn);
}

ALWAYS_INLINE void adamw_loop(const mf_adamw_coefs *c, const int small, float *restrict p,
                              const float *restrict g, float *restrict m, float *restrict v,
                              uint16_t *restrict bf16, size_t n) {
  const mf_adamw_coefs cc = *c; /* by value: the stores below cannot alias it */
  for (size_t i = 0; i < n; i++) adamw_elem(cc, small, p, g, m, v, bf16, i);
}

ALWAYS_INLINE void adamw_body(const mf_adamw_coefs *c, float *p, const float *g, float *m, float *v,
                              uint16_t *bf16, size_t n) {
  if (c->w1_small) {
    if (bf16)
      adamw_loop(c, 1, p, g, m, v, bf16, n);
    else
      adamw_loop(c, 1, p, g, m, v, NULL, n);
  } else {
    if (bf16)
      adamw_loop(c, 0, p, g, m, v, bf16, n);
    else
      adamw_loop(c, 0, p, g, m, v, NULL, n);
  }
}

void mf_adamw_tile_scalar(const mf_adamw_coefs *c, float *p, const float *g, float *m, float *v,
                          uint16_t *bf16, size_t n) {
  adamw_body(c, p, g, m, v, bf16, n);
}

#if defined(__x86_64__)
__attribute__((target("avx2,fma"))) void mf_adamw_tile_fma(const mf_adamw_coefs *c, float *p, const float *g,
                                                           float *m, float *v, uint16_t *bf16, size_t n) {
  adamw_body(c, p, g, m, v, bf16, n);
}
#endif
