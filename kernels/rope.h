/*
 * RoPE's parameters and inverse frequencies, one definition for the cpu
 * kernel (kernels/cpu/rope.c) and its cuda twin (kernels/cuda/elementwise.cu).
 *
 * A MF_K_ROPE_FWD / _BWD call (operand table, kernels/backend.c) carries
 * sizes {T, nh, D, rot, off, interleaved, truncate} and scalars {theta,
 * factor, original_max, beta_fast, beta_slow, attention_factor}; every new
 * slot 0 is the behaviour from before them (rotate_half on the first `rot`
 * dims, transformers' default rope):
 *   rot          rotated dims of each head; 0: D - off
 *   off          the first rotated dim: [off, off + rot) of each head
 *                (DeepSeek-V3: q heads off = qk_nope_head_dim; its k_rot, one
 *                head at the end of the kv_a row, off = kv_lora_rank)
 *   interleaved  1: DeepSeek-V3's rope_interleave (see mf_rope_plan below)
 *   truncate     YaRN's `truncate`: 0 as transformers when the key is absent
 *                (true), 1 true, -1 false
 *   theta        rope_theta
 *   factor       rope_scaling["factor"] of rope_type "yarn"; <= 1: no YaRN
 *   original_max original_max_position_embeddings (the caller resolves
 *                transformers' fallback to max_position_embeddings)
 *   beta_fast, beta_slow   0: 32 and 1, as transformers' `or 32` / `or 1`
 *   attention_factor       cos and sin are multiplied by it (YaRN's mscale
 *                ratio, mf_rope_yarn_attention_factor in kernels/backend.h);
 *                0: 1
 *
 * The frequencies follow transformers 4.57's float32 computation
 * (modeling_rope_utils.py) operation for operation: theta is rounded to fp32
 * for the tensor ops, the correction range is Python float (double) math.
 *   default:  inv[i] = 1 / pf[i],  pf[i] = powf((float)theta, (float)(2i) / (float)rot)
 *   YaRN (_compute_yarn_parameters, dim = rot):
 *     low  = rot ln(original_max / (beta_fast 2 pi)) / (2 ln theta)   (double)
 *     high = the same with beta_slow; truncate: floor(low), ceil(high);
 *     low = max(low, 0), high = min(high, rot - 1); high += 0.001 if equal
 *     ramp[i] = clamp(((float)i - (float)low) / (float)(high - low), 0, 1)   fp32
 *     ef = 1 - ramp;  inv[i] = interp * (1 - ef) + extrap * ef   (fp32, each op rounded)
 *     with extrap = 1 / pf[i], interp = 1 / ((float)factor * pf[i])
 * (transformers' 1.0 / t is t.reciprocal() * 1.0: the same fp32 quotient.)
 */
#ifndef MF_KERNELS_ROPE_H
#define MF_KERNELS_ROPE_H

#include <math.h>
#include <stdint.h>

#include "kernels/backend.h"
#include "src/core/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A call's RoPE parameters as the operand table holds them (above). */
typedef struct mf_rope_args {
  int64_t rot, off, interleaved, truncate;
  double theta, factor, original_max, beta_fast, beta_slow, attention_factor;
} mf_rope_args;

/* Reads a MF_K_ROPE_* call's i[3..6] and f[0..5]. */
static inline mf_rope_args mf_rope_args_of(const int64_t *i, const double *f) {
  mf_rope_args a;
  a.rot = i[3], a.off = i[4], a.interleaved = i[5], a.truncate = i[6];
  a.theta = f[0], a.factor = f[1], a.original_max = f[2], a.beta_fast = f[3], a.beta_slow = f[4];
  a.attention_factor = f[5];
  return a;
}

/* The arguments resolved for a head of D: what both kernels run on.
 * Pair i (i < half) of a head is x1 = head + off + i*step and x2 = x1 + pair:
 *   rotate_half (interleaved 0): step 1, pair half — x[off + i], x[off + i + half];
 *   interleaved:                 step 2, pair 1    — x[off + 2i], x[off + 2i + 1].
 * transformers' apply_rotary_pos_emb_interleave permutes the slice to
 * [x0, x2, x4, ..., x1, x3, ...] and applies rotate_half rope, leaving its
 * output permuted. moefit rotates the adjacent pairs in place instead and
 * leaves the output in the original order: element for element the same
 * values (out[2i] = theirs[i], out[2i+1] = theirs[i + half]), in the inverse
 * permutation. q and k get the same permutation and the rotated slice only
 * feeds the score q.k, which a common permutation leaves unchanged — so the
 * attention is transformers'; the weights producing x keep their order. */
typedef struct mf_rope_plan {
  int64_t off, rot, half, step, pair;
  float theta;  /* (float)theta, as the tensor ops see it */
  int yarn;     /* factor > 1 */
  float factor; /* (float)factor */
  float low;    /* (float)low of the ramp */
  float span;   /* (float)(high - low) */
  int scaled;   /* attention factor != 1 */
  float attn;   /* (float)attention_factor */
} mf_rope_plan;

/* Validates the arguments for a head of D and resolves them. MF_ERR_INVALID_ARG
 * for an offset outside the head, rotary dims that are odd (unless the rest of
 * the head), negative or past the head, interleaved or truncate out of range,
 * a YaRN call without original_max or with theta <= 0 or 1, or non-finite
 * scalars. (Host code.) */
mf_status mf_rope_plan_make(const mf_rope_args *a, int64_t D, mf_rope_plan *p);

/* Product and sum rounded on their own, on the device too (nvcc would
 * contract them into an fma; transformers rounds each tensor op). */
#ifdef __CUDA_ARCH__
#define MF_ROPE_MUL(a, b) __fmul_rn((a), (b))
#define MF_ROPE_ADD(a, b) __fadd_rn((a), (b))
#else
#define MF_ROPE_MUL(a, b) ((a) * (b))
#define MF_ROPE_ADD(a, b) ((a) + (b))
#endif

/* inv_freq[i], i < p->half (header comment). The default path is the
 * expression the kernels had before YaRN, so its bits are unchanged. */
static inline MF_HOST_DEVICE float mf_rope_inv_freq(const mf_rope_plan *p, int64_t i) {
  const float pf = powf(p->theta, (float)(2 * i) / (float)p->rot);
  if (!p->yarn) return 1.0f / pf;
  const float extrap = 1.0f / pf;
  const float interp = 1.0f / (p->factor * pf);
  float ramp = ((float)i - p->low) / p->span;
  ramp = ramp < 0.0f ? 0.0f : ramp > 1.0f ? 1.0f : ramp;
  const float ef = 1.0f - ramp;
  return MF_ROPE_ADD(MF_ROPE_MUL(interp, 1.0f - ef), MF_ROPE_MUL(extrap, ef));
}

#ifdef __cplusplus
}
#endif

#endif /* MF_KERNELS_ROPE_H */
