/* Private to src/optim: the per-step coefficients of AdamW and its loop bodies.
 *
 * Every body computes, per element, exactly the sequence documented in optim.h
 * with the same roundings (fma where torch fuses, nothing else fused), so all
 * bodies give the same bits and the choice among them is a matter of speed. A
 * vector body (AVX-512, AVX2) processes [0, n) of its arguments with any
 * alignment, its tail included. Gradients and moments may be bf16 (optim.h:
 * widened exactly where loaded, m and v rounded to nearest even, NaN kept,
 * where stored): each body does those conversions with the same bits as
 * mf_bf16_to_fp32 / mf_fp32_to_bf16. */
#ifndef MF_OPTIM_ADAMW_IMPL_H
#define MF_OPTIM_ADAMW_IMPL_H

#include <stddef.h>
#include <stdint.h>

/* The scalars of one step, each already rounded as torch rounds it. */
typedef struct mf_adamw_coefs {
  float decay;        /* (float)(1 - lr*wd) */
  float w1;           /* lerp weight (float)(1 - beta1) */
  float w1_minus_1;   /* w1 - 1.0f, the large-weight form's coefficient */
  int w1_small;       /* fabsf(w1) < 0.5f: lerp from m, else from g */
  float beta2;        /* (float)beta2 */
  float one_minus_b2; /* (float)(1 - beta2) */
  float bc2_sqrt;     /* (float)pow(1 - pow(beta2, t), 0.5) */
  float eps;          /* (float)eps */
  float neg_step;     /* (float)-(lr / (1 - pow(beta1, t))) */
} mf_adamw_coefs;

/* The dtypes of a tile's gradient and moments: bits of a body's `kind`. */
#define MF_ADAMW_G_BF16 1 /* gradient: bf16 (uint16_t), else fp32 */
#define MF_ADAMW_M_BF16 2 /* m and v: bf16 (uint16_t), else fp32 */

/* One tile of n elements: g, m and v point at elements of the dtypes `kind`
 * names (their first element is the tile's first). */
typedef void (*mf_adamw_tile_fn)(const mf_adamw_coefs *c, int kind, float *p, const void *g, void *m, void *v,
                                 uint16_t *bf16, size_t n);

void mf_adamw_tile_scalar(const mf_adamw_coefs *c, int kind, float *p, const void *g, void *m, void *v,
                          uint16_t *bf16, size_t n);
#if defined(__x86_64__)
void mf_adamw_tile_fma(const mf_adamw_coefs *c, int kind, float *p, const void *g, void *m, void *v,
                       uint16_t *bf16, size_t n);
/* Hand-written intrinsics (adamw_avx512.c, adamw_avx2.c), each file built with
 * its own -m flags and called only on a CPU that has them. */
void mf_adamw_tile_avx512(const mf_adamw_coefs *c, int kind, float *p, const void *g, void *m, void *v,
                          uint16_t *bf16, size_t n);
void mf_adamw_tile_avx2(const mf_adamw_coefs *c, int kind, float *p, const void *g, void *m, void *v,
                        uint16_t *bf16, size_t n);
#endif

#endif /* MF_OPTIM_ADAMW_IMPL_H */
