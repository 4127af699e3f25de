/*
 * Rotary position embedding (rotate_half convention) on the cpu backend, in place
 * on x[T, nh, D]: on the first `rot` dims of each head (partial RoPE, GLM-4.5's
 * partial_rotary_factor; rot = D: the whole head), the others left as they are.
 *
 * The angles follow transformers' float32 computation (LlamaRotaryEmbedding and
 * its copies; the rotary dim `rot` is theirs, head_dim * partial_rotary_factor)
 * operation for operation:
 *   inv_freq[i] = 1 / theta^((float)(2i) / (float)rot)     fp32 powf, i < rot/2
 *   f           = (float)pos[t] * inv_freq[i]              fp32 product
 *   c, s        = cosf(f), sinf(f)
 *   fwd: x1' = x1*c - x2*s,  x2' = x2*c + x1*s   (x1 = x[.., i], x2 = x[.., i + rot/2])
 *   bwd: the transpose (the inverse rotation) of the gradient:
 *        d1 = g1*c + g2*s,   d2 = g2*c - g1*s
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
  int64_t T, nh, D, rot;
  const int32_t *pos;
  float theta;
  int backward, round_bf16;
} rope_args;

static void rope_task(void *arg, int ti, int tn) {
  const rope_args *a = (const rope_args *)arg;
  size_t t0, t1;
  mf_partition((size_t)a->T, 1, ti, tn, &t0, &t1);
  if (t0 >= t1) return;
  const int64_t half = a->rot / 2;
  float inv[ROPE_CHUNK], cs[ROPE_CHUNK], sn[ROPE_CHUNK];
  for (int64_t i0 = 0; i0 < half; i0 += ROPE_CHUNK) {
    int64_t w = half - i0 < ROPE_CHUNK ? half - i0 : ROPE_CHUNK;
    for (int64_t i = 0; i < w; i++) inv[i] = 1.0f / powf(a->theta, (float)(2 * (i0 + i)) / (float)a->rot);
    for (size_t t = t0; t < t1; t++) {
      float p = (float)a->pos[t];
      for (int64_t i = 0; i < w; i++) {
        float f = p * inv[i];
        cs[i] = cosf(f);
        sn[i] = sinf(f);
      }
      for (int64_t h = 0; h < a->nh; h++) {
        float *x1 = a->x + ((int64_t)t * a->nh + h) * a->D + i0;
        float *x2 = x1 + half;
        for (int64_t i = 0; i < w; i++) {
          float u = x1[i], v = x2[i], r1, r2;
          if (!a->backward) {
            r1 = u * cs[i] - v * sn[i];
            r2 = v * cs[i] + u * sn[i];
          } else {
            r1 = u * cs[i] + v * sn[i];
            r2 = v * cs[i] - u * sn[i];
          }
          if (a->round_bf16) {
            r1 = mf_round_to_bf16(r1);
            r2 = mf_round_to_bf16(r2);
          }
          x1[i] = r1;
          x2[i] = r2;
        }
      }
    }
  }
}

static mf_status rope_run(const mf_kctx *ctx, float *x, int64_t T, int64_t nh, int64_t D, int64_t rot,
                          const int32_t *pos, float theta, int backward) {
  if (rot == 0) rot = D;
  if (rot < 0 || rot > D || (rot % 2 != 0 && rot != D))
    return MF_ERR(MF_ERR_INVALID_ARG,
                  "rope: %lld rotary dims of a head of %lld: an even number below the head, or the head",
                  (long long)rot, (long long)D);
  if (T <= 0 || nh <= 0 || rot < 2) return MF_OK;
  rope_args a = {x, T, nh, D, rot, pos, theta, backward, ctx->round_bf16};
  if ((double)T * (double)nh * (double)D < ROPE_PARALLEL_MIN)
    rope_task(&a, 0, 1);
  else
    mf_threadpool_run(ctx->pool, rope_task, &a);
  return MF_OK;
}

mf_status mf_cpu_rope_fwd(float *x, int64_t T, int64_t nh, int64_t D, int64_t rot, const int32_t *pos,
                          float theta, const mf_kctx *ctx) {
  return rope_run(ctx, x, T, nh, D, rot, pos, theta, 0);
}

mf_status mf_cpu_rope_bwd(float *dx, int64_t T, int64_t nh, int64_t D, int64_t rot, const int32_t *pos,
                          float theta, const mf_kctx *ctx) {
  return rope_run(ctx, dx, T, nh, D, rot, pos, theta, 1);
}
