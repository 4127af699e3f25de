/*
 * Rotary position embedding on the cpu backend, in place on x[T, nh, D]: on
 * dims [off, off + rot) of each head (rot = D, off = 0: the whole head; rot <
 * D: partial RoPE, GLM-4.5's partial_rotary_factor; off > 0: DeepSeek-V3's
 * rotated tail of each q head, and its k_rot at the end of the kv_a row), the
 * others left as they are. Pairs are rotate_half's (x[i], x[i + rot/2]) or,
 * interleaved, adjacent (x[2i], x[2i + 1]): DeepSeek-V3's rope_interleave
 * done in place (kernels/rope.h says why that gives transformers' scores).
 *
 * The angles follow transformers' float32 computation (LlamaRotaryEmbedding,
 * DeepseekV3RotaryEmbedding and their copies; the rotary dim `rot` is theirs,
 * head_dim * partial_rotary_factor, or qk_rope_head_dim) operation for
 * operation:
 *   inv_freq[i] = mf_rope_inv_freq(i)    kernels/rope.h: default
 *                 1 / theta^((float)(2i) / (float)rot) (fp32 powf), or YaRN's blend
 *   f           = (float)pos[t] * inv_freq[i]              fp32 product
 *   c, s        = cosf(f), sinf(f), each times (float)attention_factor when
 *                 it is not 1 (transformers' emb.cos() * attention_scaling)
 *   fwd: x1' = x1*c - x2*s,  x2' = x2*c + x1*s
 *   bwd: the transpose of the gradient: d1 = g1*c + g2*s,  d2 = g2*c - g1*s
 * (transformers forms q*cos + rotate_half(q)*sin, i.e. x1*c + (-x2)*s, which is
 * x1*c - x2*s bit for bit.)
 *
 * Threads split tokens; a token's angles are computed once and used by all its
 * heads. inv_freq and the angles live in stack buffers of ROPE_CHUNK pairs; a
 * head_dim above 2*ROPE_CHUNK is handled chunk by chunk.
 */
#include <math.h>

#include "kernels/cpu/cpu_ops.h"

#define ROPE_CHUNK 256
#define ROPE_PARALLEL_MIN (1 << 14)

typedef struct rope_args {
  float *x;
  int64_t T, nh, D;
  const int32_t *pos;
  mf_rope_plan p;
  int backward, round_bf16;
} rope_args;

/* The w pairs (x1[i*step], x2[i*step]) of one head; called with step 1 or 2
 * spelled out, so each has its own (vectorisable) loop. */
static inline __attribute__((always_inline)) void rotate(float *x1, float *x2, int64_t step, int64_t w,
                                                         const float *cs, const float *sn, int backward,
                                                         int round_bf16) {
  for (int64_t i = 0; i < w; i++) {
    float u = x1[i * step], v = x2[i * step], r1, r2;
    if (!backward) {
      r1 = u * cs[i] - v * sn[i];
      r2 = v * cs[i] + u * sn[i];
    } else {
      r1 = u * cs[i] + v * sn[i];
      r2 = v * cs[i] - u * sn[i];
    }
    if (round_bf16) {
      r1 = mf_round_to_bf16(r1);
      r2 = mf_round_to_bf16(r2);
    }
    x1[i * step] = r1;
    x2[i * step] = r2;
  }
}

static void rope_task(void *arg, int ti, int tn) {
  const rope_args *a = (const rope_args *)arg;
  size_t t0, t1;
  mf_partition((size_t)a->T, 1, ti, tn, &t0, &t1);
  if (t0 >= t1) return;
  const mf_rope_plan *q = &a->p;
  const int64_t half = q->half, step = q->step;
  float inv[ROPE_CHUNK], cs[ROPE_CHUNK], sn[ROPE_CHUNK];
  for (int64_t i0 = 0; i0 < half; i0 += ROPE_CHUNK) {
    int64_t w = half - i0 < ROPE_CHUNK ? half - i0 : ROPE_CHUNK;
    for (int64_t i = 0; i < w; i++) inv[i] = mf_rope_inv_freq(q, i0 + i);
    for (size_t t = t0; t < t1; t++) {
      float p = (float)a->pos[t];
      for (int64_t i = 0; i < w; i++) {
        float f = p * inv[i];
        cs[i] = cosf(f);
        sn[i] = sinf(f);
        if (q->scaled) {
          cs[i] *= q->attn;
          sn[i] *= q->attn;
        }
      }
      for (int64_t h = 0; h < a->nh; h++) {
        float *x1 = a->x + ((int64_t)t * a->nh + h) * a->D + q->off + i0 * step;
        float *x2 = x1 + q->pair;
        if (step == 1)
          rotate(x1, x2, 1, w, cs, sn, a->backward, a->round_bf16);
        else
          rotate(x1, x2, 2, w, cs, sn, a->backward, a->round_bf16);
      }
    }
  }
}

static mf_status rope_run(const mf_kctx *ctx, float *x, int64_t T, int64_t nh, int64_t D, const int32_t *pos,
                          const mf_rope_args *args, int backward) {
  rope_args a = {x, T, nh, D, pos, {0}, backward, ctx->round_bf16};
  MF_CHECK(mf_rope_plan_make(args, D, &a.p));
  if (T <= 0 || nh <= 0 || a.p.half == 0) return MF_OK;
  if ((double)T * (double)nh * (double)D < ROPE_PARALLEL_MIN)
    rope_task(&a, 0, 1);
  else
    mf_threadpool_run(ctx->pool, rope_task, &a);
  return MF_OK;
}

mf_status mf_cpu_rope_fwd(float *x, int64_t T, int64_t nh, int64_t D, const int32_t *pos, mf_rope_args a,
                          const mf_kctx *ctx) {
  return rope_run(ctx, x, T, nh, D, pos, &a, 0);
}

mf_status mf_cpu_rope_bwd(float *dx, int64_t T, int64_t nh, int64_t D, const int32_t *pos, mf_rope_args a,
                          const mf_kctx *ctx) {
  return rope_run(ctx, dx, T, nh, D, pos, &a, 1);
}
