/*
 * Causal GQA attention, flash style, on the cpu backend.
 *
 * Maths (per sequence b, query head h, kv head g = h / (Hq/Hkv), D the head dim
 * of q and k, Dv that of v — equal in most models, 192 and 128 in DeepSeek-V3's
 * latent attention; key j visible from query i when j <= i, and with a sliding
 * window W > 0 also j > i - W; sink[h] gpt-oss's learned logit, -inf without):
 *   s[i,j] = (q[i].k[j]) * scale        fp32 dot first, then the scale, as
 *                                        transformers' eager path does
 *   p[i,j] = exp(s[i,j] - lse[i]),  lse[i] = log (sum_{j visible} exp(s[i,j]) + exp(sink[h]))
 *   o[i]   = sum_{j visible} p[i,j] v[j]
 * Backward, with Di = do[i].o[i]:
 *   dp = do.v,  ds = p * (dp - Di)
 *   dq[i] = scale * sum_j ds[i,j] k[j]
 *   dk[j] = scale * sum_{h in group} sum_i ds[i,j] q[i]
 *   dv[j] =         sum_{h in group} sum_i p[i,j] do[i]
 *   dsink[h] += -sum_{b,i} exp(sink[h] - lse[i]) Di   (the sink column's p times (0 - Di))
 *
 * Shapes: q, dq [B*S, Hq, D]; o, dout [B*S, Hq, Dv]; k, dk [B*S, Hkv, D];
 * v, dv [B*S, Hkv, Dv] (token-major); lse [B, Hq, S]. Dv 0 means D.
 *
 * Tiling: queries in blocks of bq (<= BQ_MAX) rows, keys in tiles of BK. The
 * query block is transposed once into a stack buffer qt[D][bq] (the backward's
 * dout block likewise into dot[Dv][bq]), so scores come
 * out key-major (st[c][i] = k[c].q[i]) from one register-blocked kernel (mm)
 * of axpys, Y[m,:] += A[m,k] * X[k,:], that does every product here. Each output
 * element is summed over k in order with one rounding per multiply and per add,
 * so a score is bit for bit the plain sequential fp32 dot, at any vector width.
 * The softmax bookkeeping then runs across query rows (contiguous), so it
 * vectorises too. Probabilities never exist beyond one BK x bq tile. The forward
 * keeps an online softmax (running max and sum per row) and rescales its
 * accumulator, which is the output row itself (owned by the item: no heap). The
 * backward recomputes p from q, k and lse.
 *
 * Sinks and windows. A row's online softmax starts at max = sink, sum = 1
 * (exp(sink - sink)) instead of -inf and 0, so the sink takes part in the max
 * like any score. A window masks keys j <= i - W like the causal mask (p = 0)
 * and skips what it hides: key tiles before the block's first visible key
 * (tiles stay aligned at multiples of BK), score columns past a key's last row,
 * keys before a row block's first one in the products. Without either (window
 * 0, sinks NULL) every sum runs as before they existed: the same bits.
 *
 * Threads: forward items are (b, query head, query block), spread with
 * mf_partition; query blocks are interleaved (0, last, 1, last-1, ...) so a
 * contiguous share of items carries a fair part of the causal triangle. The
 * backward's items are (b, kv head): one thread owns dk/dv of a group and dq of
 * its query heads, summing heads, query blocks and rows in a fixed order. The
 * sinks' gradient is a pass of its own after it, one item per query head
 * summing over b then i (in double). No result depends on the thread count.
 *
 * Stack, per thread: qt and dot (QT_FLOATS each) and two BK x BQ_MAX tiles,
 * 48 KiB. bq shrinks as the larger of D and Dv grows (32 rows up to 128, 8 at
 * 512); D or Dv > 512 is refused with MF_ERR_UNSUPPORTED. With Dv = D every
 * sum runs in the same order as before Dv existed: the same bits.
 *
 * SIMD: the kernel body (below ATT_BODY) is compiled twice from this one file,
 * which includes itself: for the baseline ISA with 4-float vectors, and on
 * x86-64 with AVX2 and 8-float vectors, chosen per call from the CPU's flags
 * (MF_CPU_SIMD=base forces the baseline). Neither contracts into FMAs and every
 * reduction has a fixed order, so both give the same bits.
 */
#ifndef ATT_BODY

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/cpu_ops.h"
#include "src/core/env.h"

enum {
  BQ_MAX = 32,      /* query rows per block */
  BK = 64,          /* keys per tile */
  QT_FLOATS = 4096, /* floats in one transposed query block */
  D_MAX = QT_FLOATS / 8,
  MR = 4, /* rows of a register block */
  NR = 8, /* query blocks are padded to NR columns; NR lanes in sums */
};

static int query_block(int64_t D) {
  int64_t bq = QT_FLOATS / D;
  if (bq > BQ_MAX) bq = BQ_MAX;
  return (int)(bq & ~(int64_t)(NR - 1));
}

/* n rounded up to whole NR blocks */
static inline int round_nr(int n) {
  return (n + NR - 1) / NR * NR;
}

/* Dv: already resolved (0 -> D) by the caller. */
static mf_status check_args(const char *op, int64_t B, int64_t S, int64_t Hq, int64_t Hkv, int64_t D,
                            int64_t Dv, int64_t window) {
  if (B < 0 || S < 0 || Hq <= 0 || Hkv <= 0 || D <= 0 || Dv <= 0 || Hq % Hkv != 0)
    return MF_ERR(MF_ERR_INVALID_ARG, "%s: bad shape B=%lld S=%lld Hq=%lld Hkv=%lld D=%lld Dv=%lld", op,
                  (long long)B, (long long)S, (long long)Hq, (long long)Hkv, (long long)D, (long long)Dv);
  if (window < 0)
    return MF_ERR(MF_ERR_INVALID_ARG, "%s: sliding window %lld (0: none, else the keys a query sees)", op,
                  (long long)window);
  if (D > D_MAX)
    return MF_ERR(MF_ERR_UNSUPPORTED, "%s: head_dim D=%lld is larger than the cpu kernel's tile (at most %d)",
                  op, (long long)D, (int)D_MAX);
  if (Dv > D_MAX)
    return MF_ERR(MF_ERR_UNSUPPORTED,
                  "%s: value head_dim Dv=%lld is larger than the cpu kernel's tile (at most %d)", op,
                  (long long)Dv, (int)D_MAX);
  return MF_OK;
}

/* The float helpers use integer compares and bit selects: under the default
 * -ftrapping-math GCC does not if-convert a float compare, and the loops around
 * them would stay scalar. */
static inline int32_t f2i(float x) {
  int32_t i;
  memcpy(&i, &x, sizeof i);
  return i;
}
static inline float i2f(int32_t i) {
  float x;
  memcpy(&x, &i, sizeof x);
  return x;
}
/* Float order as int order (-0 just below +0; NaNs past the infinities). An involution. */
static inline int32_t ordered(int32_t bits) {
  return bits ^ ((bits >> 31) & 0x7fffffff);
}
/* a where the mask m is all ones, b where it is 0 */
static inline float sel(int32_t m, float a, float b) {
  return i2f((f2i(a) & m) | (f2i(b) & ~m));
}

/* exp(x) as Cephes' expf (x = n ln2 + r with ln2 in two parts, a degree-5
 * polynomial in r; within 1.4 ulp of exp on [-87.3, 0]), branch-free so the
 * loops around it vectorise. Below -87.3 (results under FLT_MIN, and -inf) it
 * gives 0, above 88 +inf; NaN stays NaN. */
static inline float exp_f(float x) {
  const float lo = -87.3f, hi = 88.0f;
  const int32_t xi = f2i(x), xo = ordered(xi);
  const int32_t under = -(int32_t)(xo < ordered(f2i(lo))), over = -(int32_t)(xo > ordered(f2i(hi)));
  const int32_t nan = -(int32_t)((xi & 0x7fffffff) > 0x7f800000);
  const float xc = sel(under, lo, sel(over, hi, x));
  const float z = xc * 1.44269504088896341f;
  const float fn = (z + 12582912.0f) - 12582912.0f; /* rint(z): 1.5 * 2^23 */
  const int32_t n = (int32_t)fn;
  float r = xc - fn * 0.693359375f;
  r = r - fn * -2.12194440e-4f;
  float y = 1.9875691500e-4f;
  y = y * r + 1.3981999507e-3f;
  y = y * r + 8.3334519073e-3f;
  y = y * r + 4.1665795894e-2f;
  y = y * r + 1.6666665459e-1f;
  y = y * r + 5.0000001201e-1f;
  y = y * (r * r) + r + 1.0f;
  y *= i2f((n + 127) << 23); /* 2^n, n in [-126, 127] */
  return sel(nan, x, sel(under, 0.0f, sel(over, INFINITY, y)));
}

/* t[d*bq + i] = x[i*ld + d] for i < nq, and 0 up to the next multiple of NR
 * (score products run over whole NR-column blocks; the padding is masked). */
static inline void transpose_block(const float *restrict x, int64_t ld, int nq, int64_t D, int bq,
                                   float *restrict t) {
  for (int i = 0; i < nq; i++) {
    const float *row = x + (int64_t)i * ld;
    for (int64_t d = 0; d < D; d++) t[d * bq + i] = row[d];
  }
  for (int64_t d = 0; d < D; d++)
    for (int i = nq; i % NR; i++) t[d * bq + i] = 0.0f;
}

/* The first query column of a block (starting at query i0) that key j may
 * touch, down to a whole NR block: the causal mask starts at column j - i0. */
static inline int64_t first_col(int64_t j, int64_t i0) {
  return j > i0 ? (j - i0) & ~(int64_t)(NR - 1) : 0;
}

/* The rows [*z, *e) of a block of nq rows from query i0 that key j reaches:
 * from the causal mask (i >= j) to the window's end (i < j + W; W 0: none). */
static inline void key_rows(int64_t j, int64_t i0, int nq, int64_t W, int64_t *z, int64_t *e) {
  int64_t lo = j > i0 ? j - i0 : 0, hi = nq;
  if (lo > nq) lo = nq;
  if (W > 0 && j + W - i0 < hi) hi = j + W - i0;
  *z = lo;
  *e = hi > lo ? hi : lo;
}

/* The score columns [n0, *n1) the keys j..jl (a register block) need: up to
 * the last one's window end, rounded up to whole NR blocks; nqp without a window. */
static inline int64_t last_col(int64_t jl, int64_t i0, int nqp, int64_t W) {
  if (W <= 0 || jl + W - i0 >= nqp) return nqp;
  return jl + W - i0 > 0 ? round_nr((int)(jl + W - i0)) : 0;
}

/* The first key (from key tile j0) that a row block from query r sees: 0 without a window. */
static inline int64_t first_key(int64_t r, int64_t j0, int64_t W) {
  return W > 0 && r - W + 1 > j0 ? r - W + 1 - j0 : 0;
}

/* Where a query block from i0 starts its key tiles: the tile of its first visible key. */
static inline int64_t first_tile(int64_t i0, int64_t W) {
  return W > 0 && i0 - W + 1 > 0 ? (i0 - W + 1) / BK * BK : 0;
}

/* y[0..D) *= a */
static inline void scale_row(float a, int64_t D, float *restrict y) {
  for (int64_t d = 0; d < D; d++) y[d] *= a;
}

static inline void round_row(int64_t D, float *restrict y) {
  for (int64_t d = 0; d < D; d++) y[d] = mf_round_to_bf16(y[d]);
}

/* bq: query_block of the larger head dim (qt holds D rows, dot Dv). */
typedef struct {
  const float *q, *k, *v;
  float *o, *lse;
  int64_t B, S, Hq, Hkv, D, Dv, nqb;
  int bq;
  float scale;
  int round_bf16;
  int64_t window;     /* 0: none */
  const float *sinks; /* [Hq] or NULL */
} fwd_args;

typedef struct {
  const float *q, *k, *v, *o, *dout, *lse;
  float *dq, *dk, *dv;
  int64_t B, S, Hq, Hkv, D, Dv;
  int bq;
  float scale;
  int round_bf16;
  int64_t window;
} bwd_args;

/* The sinks' gradient pass: dsinks[h] += -sum_{b,i} exp(sinks[h] - lse) Di. */
typedef struct {
  const float *o, *dout, *lse, *sinks;
  float *dsinks;
  int64_t B, S, Hq, Dv;
} dsink_args;

/* Query heads spread over the threads; each sums its head over b, then i, in
 * double (Di as the backward's: an fp32 dot in order). */
static void dsink_task(void *ctx, int ti, int tn) {
  const dsink_args *a = (const dsink_args *)ctx;
  const int64_t S = a->S, Hq = a->Hq, Dv = a->Dv;
  size_t begin, end;
  mf_partition((size_t)Hq, 1, ti, tn, &begin, &end);
  for (int64_t h = (int64_t)begin; h < (int64_t)end; h++) {
    const double sink = a->sinks[h];
    double acc = 0.0;
    for (int64_t b = 0; b < a->B; b++)
      for (int64_t i = 0; i < S; i++) {
        const float *orow = a->o + ((b * S + i) * Hq + h) * Dv, *drow = a->dout + ((b * S + i) * Hq + h) * Dv;
        float di = 0.0f;
        for (int64_t d = 0; d < Dv; d++) di += drow[d] * orow[d];
        acc += exp(sink - (double)a->lse[(b * Hq + h) * S + i]) * (double)di;
      }
    a->dsinks[h] += (float)-acc;
  }
}

/* The kernel body, once per ISA: ATT_FN(x) names its functions x_<isa>, VW is
 * its vector width in floats. */
#define ATT_CAT_(a, b) a##b
#define ATT_CAT(a, b) ATT_CAT_(a, b)
#define ATT_FN(name) ATT_CAT(name, ATT_SFX)
#define ATT_BODY

#define ATT_SFX _base
#define VW 4
#include "kernels/cpu/attention.c"
#undef ATT_SFX
#undef VW

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#ifdef __clang__
#pragma clang attribute push(__attribute__((target("avx2"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2")
#endif
#define ATT_SFX _avx2
#define VW 8
#include "kernels/cpu/attention.c"
#undef ATT_SFX
#undef VW
#ifdef __clang__
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
#define HAVE_AVX2_BODY 1
#endif

/* Per call: the environment table and the cpuid cache are cheap next to an attention. */
static int use_avx2(void) {
#ifdef HAVE_AVX2_BODY
  if (mf_env_string(MF_ENV_CPU_SIMD)) return 0;
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2");
#else
  return 0;
#endif
}

mf_status mf_cpu_attn_fwd(const float *q, const float *k, const float *v, int64_t B, int64_t S, int64_t Hq,
                          int64_t Hkv, int64_t D, int64_t Dv, int64_t window, const float *sinks, float scale,
                          float *o, float *lse, const mf_kctx *ctx) {
  if (Dv == 0) Dv = D;
  MF_CHECK(check_args("attn_fwd", B, S, Hq, Hkv, D, Dv, window));
  if (B == 0 || S == 0) return MF_OK;
  if (window >= S) window = 0; /* hides no key: the same sums as none */
  const int bq = query_block(D > Dv ? D : Dv);
  const int rb = ctx && ctx->round_bf16;
  fwd_args a = {q, k, v, o, lse, B, S, Hq, Hkv, D, Dv, (S + bq - 1) / bq, bq, scale, rb, window, sinks};
  mf_task_fn fn = fwd_task_base;
#ifdef HAVE_AVX2_BODY
  if (use_avx2()) fn = fwd_task_avx2;
#endif
  mf_threadpool_run(ctx ? ctx->pool : NULL, fn, &a);
  return MF_OK;
}

mf_status mf_cpu_attn_bwd(const float *q, const float *k, const float *v, const float *o, const float *dout,
                          const float *lse, int64_t B, int64_t S, int64_t Hq, int64_t Hkv, int64_t D,
                          int64_t Dv, int64_t window, const float *sinks, float scale, float *dq, float *dk,
                          float *dv, float *dsinks, const mf_kctx *ctx) {
  if (Dv == 0) Dv = D;
  MF_CHECK(check_args("attn_bwd", B, S, Hq, Hkv, D, Dv, window));
  if (B == 0 || S == 0) return MF_OK;
  if (window >= S) window = 0;
  const int bq = query_block(D > Dv ? D : Dv);
  const int rb = ctx && ctx->round_bf16;
  bwd_args a = {q, k, v, o, dout, lse, dq, dk, dv, B, S, Hq, Hkv, D, Dv, bq, scale, rb, window};
  mf_task_fn fn = bwd_task_base;
#ifdef HAVE_AVX2_BODY
  if (use_avx2()) fn = bwd_task_avx2;
#endif
  mf_threadpool_run(ctx ? ctx->pool : NULL, fn, &a);
  if (sinks && dsinks) {
    dsink_args d = {o, dout, lse, sinks, dsinks, B, S, Hq, Dv};
    mf_threadpool_run(ctx ? ctx->pool : NULL, dsink_task, &d);
  }
  return MF_OK;
}

#else /* ATT_BODY: everything below is compiled once per ISA */

/* VW floats in GCC's generic vectors (an SSE or NEON register at VW = 4, a ymm
 * register at VW = 8). Element-wise arithmetic, so the bits do not depend on VW. */
typedef float ATT_FN(vf) __attribute__((vector_size(VW * sizeof(float))));
#define vf ATT_FN(vf)
#define VLOAD(v, p) memcpy(&(v), (p), sizeof(vf))
#define VSTORE(p, v) memcpy((p), &(v), sizeof(vf))

/* Y[i, 0..N) = (load ? Y[i, 0..N) : 0) + sum_{k<K} A[i*am + k*ak] * X[k*ldx + 0..N)
 * for i < M: every product of the forward and the backward. Each element is
 * summed over k in order, one rounding per multiply and per add, so the bits
 * match a plain sequential loop whatever the blocking. Rows go MR = 4 at a time,
 * columns 2*VW then VW then one by one; named accumulators, as GCC spills an
 * array of vectors to the stack. */
static void ATT_FN(mm)(int64_t M, int64_t N, int64_t K, const float *restrict A, int64_t am, int64_t ak,
                       const float *restrict X, int64_t ldx, float *restrict Y, int64_t ldy, int load) {
  int64_t i = 0;
  for (; i + MR <= M; i += MR) {
    const float *restrict a0 = A + i * am, *restrict a1 = a0 + am, *restrict a2 = a1 + am,
                          *restrict a3 = a2 + am;
    float *restrict y0 = Y + i * ldy, *restrict y1 = y0 + ldy, *restrict y2 = y1 + ldy,
                    *restrict y3 = y2 + ldy;
    int64_t n = 0;
    for (; n + 2 * VW <= N; n += 2 * VW) {
      vf c0 = {0}, d0 = {0}, c1 = {0}, d1 = {0}, c2 = {0}, d2 = {0}, c3 = {0}, d3 = {0};
      if (load) {
        VLOAD(c0, y0 + n), VLOAD(d0, y0 + n + VW);
        VLOAD(c1, y1 + n), VLOAD(d1, y1 + n + VW);
        VLOAD(c2, y2 + n), VLOAD(d2, y2 + n + VW);
        VLOAD(c3, y3 + n), VLOAD(d3, y3 + n + VW);
      }
      for (int64_t k = 0; k < K; k++) {
        vf x, z;
        VLOAD(x, X + k * ldx + n);
        VLOAD(z, X + k * ldx + n + VW);
        const float e0 = a0[k * ak], e1 = a1[k * ak], e2 = a2[k * ak], e3 = a3[k * ak];
        c0 += e0 * x, d0 += e0 * z;
        c1 += e1 * x, d1 += e1 * z;
        c2 += e2 * x, d2 += e2 * z;
        c3 += e3 * x, d3 += e3 * z;
      }
      VSTORE(y0 + n, c0), VSTORE(y0 + n + VW, d0);
      VSTORE(y1 + n, c1), VSTORE(y1 + n + VW, d1);
      VSTORE(y2 + n, c2), VSTORE(y2 + n + VW, d2);
      VSTORE(y3 + n, c3), VSTORE(y3 + n + VW, d3);
    }
    for (; n + VW <= N; n += VW) {
      vf c0 = {0}, c1 = {0}, c2 = {0}, c3 = {0};
      if (load) VLOAD(c0, y0 + n), VLOAD(c1, y1 + n), VLOAD(c2, y2 + n), VLOAD(c3, y3 + n);
      for (int64_t k = 0; k < K; k++) {
        vf x;
        VLOAD(x, X + k * ldx + n);
        c0 += a0[k * ak] * x, c1 += a1[k * ak] * x, c2 += a2[k * ak] * x, c3 += a3[k * ak] * x;
      }
      VSTORE(y0 + n, c0), VSTORE(y1 + n, c1), VSTORE(y2 + n, c2), VSTORE(y3 + n, c3);
    }
    for (; n < N; n++) {
      float c0 = 0.0f, c1 = 0.0f, c2 = 0.0f, c3 = 0.0f;
      if (load) c0 = y0[n], c1 = y1[n], c2 = y2[n], c3 = y3[n];
      for (int64_t k = 0; k < K; k++) {
        const float x = X[k * ldx + n];
        c0 += a0[k * ak] * x, c1 += a1[k * ak] * x, c2 += a2[k * ak] * x, c3 += a3[k * ak] * x;
      }
      y0[n] = c0, y1[n] = c1, y2[n] = c2, y3[n] = c3;
    }
  }
  for (; i < M; i++) {
    const float *restrict a0 = A + i * am;
    float *restrict y0 = Y + i * ldy;
    int64_t n = 0;
    for (; n + VW <= N; n += VW) {
      vf c0 = {0};
      if (load) VLOAD(c0, y0 + n);
      for (int64_t k = 0; k < K; k++) {
        vf x;
        VLOAD(x, X + k * ldx + n);
        c0 += a0[k * ak] * x;
      }
      VSTORE(y0 + n, c0);
    }
    for (; n < N; n++) {
      float c0 = load ? y0[n] : 0.0f;
      for (int64_t k = 0; k < K; k++) c0 += a0[k * ak] * X[k * ldx + n];
      y0[n] = c0;
    }
  }
}

/* One query block [i0, i0 + bq) of query head h: o rows and lse written. */
static void ATT_FN(fwd_item)(const fwd_args *a, int64_t b, int64_t h, int64_t qb, float *restrict qt,
                             float *restrict st) {
  const int64_t S = a->S, Hq = a->Hq, Hkv = a->Hkv, D = a->D, Dv = a->Dv;
  const int64_t g = h / (Hq / Hkv);
  const int bq = a->bq;
  const int64_t ldq = Hq * D, ldk = Hkv * D, ldo = Hq * Dv, ldv = Hkv * Dv;
  const int64_t i0 = qb * bq, i1 = i0 + bq < S ? i0 + bq : S;
  const int nq = (int)(i1 - i0), nqp = round_nr(nq);
  const float *qb0 = a->q + (b * S + i0) * ldq + h * D;
  float *ob0 = a->o + (b * S + i0) * ldo + h * Dv;
  const float *kb0 = a->k + b * S * ldk + g * D;
  const float *vb0 = a->v + b * S * ldv + g * Dv;
  const float scale = a->scale;
  const int64_t W = a->window;
  float m[BQ_MAX], l[BQ_MAX], mx[BQ_MAX], alpha[BQ_MAX], sum[BQ_MAX];
  int32_t mo[BQ_MAX];

  transpose_block(qb0, ldq, nq, D, bq, qt);
  for (int i = 0; i < nq; i++) {
    /* the sink as the first term: max = sink, sum = exp(sink - sink) */
    m[i] = a->sinks ? a->sinks[h] : -INFINITY;
    l[i] = a->sinks ? 1.0f : 0.0f;
    memset(ob0 + i * ldo, 0, (size_t)Dv * sizeof(float));
  }
  for (int64_t j0 = first_tile(i0, W); j0 < i1; j0 += BK) {
    const int nk = (int)(j0 + BK < i1 ? BK : i1 - j0); /* without a window every key here reaches some row */
    /* st[c][i] = k[j0+c] . q[i0+i], from the first column the key reaches to the last */
    for (int c0 = 0; c0 < nk; c0 += MR) {
      const int rows = nk - c0 < MR ? nk - c0 : MR;
      const int64_t n0 = first_col(j0 + c0, i0), n1 = last_col(j0 + c0 + rows - 1, i0, nqp, W);
      if (n1 <= n0) continue;
      ATT_FN(mm)(rows, n1 - n0, D, kb0 + (j0 + c0) * ldk, ldk, 1, qt + n0, bq, st + c0 * bq + n0, bq, 0);
    }
    /* online softmax across the block's rows; key c reaches rows z <= i < e */
    for (int i = 0; i < nq; i++) mo[i] = ordered(f2i(m[i]));
    for (int c = 0; c < nk; c++) {
      float *restrict s = st + c * bq;
      int64_t z, e;
      key_rows(j0 + c, i0, nq, W, &z, &e);
      for (int64_t i = z; i < e; i++) {
        s[i] *= scale;
        const int32_t o = ordered(f2i(s[i]));
        mo[i] = o > mo[i] ? o : mo[i];
      }
    }
    for (int i = 0; i < nq; i++) {
      mx[i] = i2f(ordered(mo[i]));
      /* 0 on the first tile (m = -inf); 1 if no key (nor a sink) reached i yet */
      alpha[i] = sel(-(int32_t)(f2i(mx[i]) == f2i(-INFINITY)), 1.0f, exp_f(m[i] - mx[i]));
      sum[i] = 0.0f;
    }
    for (int c = 0; c < nk; c++) {
      float *restrict s = st + c * bq;
      int64_t z, e;
      key_rows(j0 + c, i0, nq, W, &z, &e);
      for (int64_t i = 0; i < z; i++) s[i] = 0.0f;
      for (int64_t i = z; i < e; i++) {
        s[i] = exp_f(s[i] - mx[i]);
        sum[i] += s[i];
      }
      for (int64_t i = e; i < nq; i++) s[i] = 0.0f;
    }
    for (int i = 0; i < nq; i++) {
      l[i] = l[i] * alpha[i] + sum[i];
      m[i] = mx[i];
      if (alpha[i] != 1.0f) scale_row(alpha[i], Dv, ob0 + i * ldo);
    }
    /* o[i] += sum_c p[c][i] v[j0+c], over the keys a row block reaches */
    for (int r0 = 0; r0 < nq; r0 += MR) {
      const int rows = nq - r0 < MR ? nq - r0 : MR;
      const int64_t reach = i0 + r0 + rows - j0, hi = reach < nk ? reach : nk, lo = first_key(i0 + r0, j0, W);
      if (hi <= lo) continue;
      ATT_FN(mm)
      (rows, Dv, hi - lo, st + lo * bq + r0, 1, bq, vb0 + (j0 + lo) * ldv, ldv, ob0 + r0 * ldo, ldo, 1);
    }
  }
  float *lse = a->lse + (b * Hq + h) * S + i0;
  for (int i = 0; i < nq; i++) {
    float *orow = ob0 + i * ldo;
    scale_row(1.0f / l[i], Dv, orow);
    if (a->round_bf16) round_row(Dv, orow);
    lse[i] = m[i] + logf(l[i]);
  }
}

static void ATT_FN(fwd_task)(void *ctx, int ti, int tn) {
  const fwd_args *a = (const fwd_args *)ctx;
  float qt[QT_FLOATS];
  float st[BK * BQ_MAX];
  const int64_t nqb = a->nqb;
  size_t begin, end;
  mf_partition((size_t)(a->B * a->Hq * nqb), 1, ti, tn, &begin, &end);
  for (size_t it = begin; it < end; it++) {
    const int64_t bh = (int64_t)it / nqb, t = (int64_t)it % nqb;
    const int64_t qb = (t & 1) ? nqb - 1 - t / 2 : t / 2;
    ATT_FN(fwd_item)(a, bh / a->Hq, bh % a->Hq, qb, qt, st);
  }
}

/* One query block [i0, i0 + bq) of query head h against every key tile it sees:
 * its dq rows written (scaled, rounded); dk/dv rows of the group accumulated. */
static void ATT_FN(bwd_block)(const bwd_args *a, int64_t b, int64_t h, int64_t g, int64_t i0,
                              float *restrict qt, float *restrict dot, float *restrict pt,
                              float *restrict dst) {
  const int64_t S = a->S, Hq = a->Hq, Hkv = a->Hkv, D = a->D, Dv = a->Dv;
  const int bq = a->bq;
  const int64_t ldq = Hq * D, ldk = Hkv * D, ldo = Hq * Dv, ldv = Hkv * Dv;
  const int64_t i1 = i0 + bq < S ? i0 + bq : S;
  const int nq = (int)(i1 - i0), nqp = round_nr(nq);
  const int64_t qoff = (b * S + i0) * ldq + h * D, ooff = (b * S + i0) * ldo + h * Dv;
  const float *qb0 = a->q + qoff, *ob0 = a->o + ooff, *dob0 = a->dout + ooff;
  float *dqb0 = a->dq + qoff;
  const int64_t koff = b * S * ldk + g * D, voff = b * S * ldv + g * Dv;
  const float *kb0 = a->k + koff, *vb0 = a->v + voff;
  float *dkb0 = a->dk + koff, *dvb0 = a->dv + voff;
  const float *lse = a->lse + (b * Hq + h) * S + i0;
  const float scale = a->scale;
  const int64_t W = a->window;
  float di[BQ_MAX];

  transpose_block(qb0, ldq, nq, D, bq, qt);
  transpose_block(dob0, ldo, nq, Dv, bq, dot);
  for (int i = 0; i < nq; i++) {
    const float *dor = dob0 + i * ldo, *orow = ob0 + i * ldo;
    float acc = 0.0f;
    for (int64_t d = 0; d < Dv; d++) acc += dor[d] * orow[d];
    di[i] = acc;
    memset(dqb0 + i * ldq, 0, (size_t)D * sizeof(float));
  }
  for (int64_t j0 = first_tile(i0, W); j0 < i1; j0 += BK) {
    const int nk = (int)(j0 + BK < i1 ? BK : i1 - j0);
    /* pt[c][i] = k.q and dst[c][i] = v.do, over the columns key c reaches */
    for (int c0 = 0; c0 < nk; c0 += MR) {
      const int rows = nk - c0 < MR ? nk - c0 : MR;
      const int64_t n0 = first_col(j0 + c0, i0), n1 = last_col(j0 + c0 + rows - 1, i0, nqp, W);
      if (n1 <= n0) continue;
      ATT_FN(mm)(rows, n1 - n0, D, kb0 + (j0 + c0) * ldk, ldk, 1, qt + n0, bq, pt + c0 * bq + n0, bq, 0);
      ATT_FN(mm)(rows, n1 - n0, Dv, vb0 + (j0 + c0) * ldv, ldv, 1, dot + n0, bq, dst + c0 * bq + n0, bq, 0);
    }
    /* p = exp(scale*s - lse), ds = p * (dp - Di); 0 where masked */
    for (int c = 0; c < nk; c++) {
      float *restrict p = pt + c * bq, *restrict ds = dst + c * bq;
      int64_t z, e;
      key_rows(j0 + c, i0, nq, W, &z, &e);
      for (int64_t i = 0; i < z; i++) p[i] = ds[i] = 0.0f;
      for (int64_t i = z; i < e; i++) {
        p[i] = exp_f(p[i] * scale - lse[i]);
        ds[i] = p[i] * (ds[i] - di[i]);
      }
      for (int64_t i = e; i < nq; i++) p[i] = ds[i] = 0.0f;
    }
    /* dq[i] += sum_c ds[c][i] k[j0+c], over the keys a row block reaches */
    for (int r0 = 0; r0 < nq; r0 += MR) {
      const int rows = nq - r0 < MR ? nq - r0 : MR;
      const int64_t reach = i0 + r0 + rows - j0, hi = reach < nk ? reach : nk, lo = first_key(i0 + r0, j0, W);
      if (hi <= lo) continue;
      ATT_FN(mm)
      (rows, D, hi - lo, dst + lo * bq + r0, 1, bq, kb0 + (j0 + lo) * ldk, ldk, dqb0 + r0 * ldq, ldq, 1);
    }
    /* dk[c] += sum_i ds[c][i] q[i] and dv[c] += sum_i p[c][i] do[i], over the rows keys c0.. reach */
    for (int c0 = 0; c0 < nk; c0 += MR) {
      const int rows = nk - c0 < MR ? nk - c0 : MR;
      int64_t r0, r1, z, e;
      key_rows(j0 + c0, i0, nq, W, &r0, &e);
      key_rows(j0 + c0 + rows - 1, i0, nq, W, &z, &r1);
      if (r1 <= r0) continue;
      const int64_t jo = (j0 + c0) * ldk, jv = (j0 + c0) * ldv;
      ATT_FN(mm)(rows, D, r1 - r0, dst + c0 * bq + r0, bq, 1, qb0 + r0 * ldq, ldq, dkb0 + jo, ldk, 1);
      ATT_FN(mm)(rows, Dv, r1 - r0, pt + c0 * bq + r0, bq, 1, dob0 + r0 * ldo, ldo, dvb0 + jv, ldv, 1);
    }
  }
  for (int i = 0; i < nq; i++) {
    float *dqr = dqb0 + i * ldq;
    scale_row(scale, D, dqr);
    if (a->round_bf16) round_row(D, dqr);
  }
}

/* kv head g of sequence b: dk/dv of the group (query heads, then query blocks,
 * in order) and dq of its query heads. */
static void ATT_FN(bwd_item)(const bwd_args *a, int64_t b, int64_t g, float *qt, float *dot, float *pt,
                             float *dst) {
  const int64_t S = a->S, D = a->D, Dv = a->Dv, ldk = a->Hkv * D, ldv = a->Hkv * Dv, G = a->Hq / a->Hkv;
  const int bq = a->bq;
  float *dkb0 = a->dk + b * S * ldk + g * D, *dvb0 = a->dv + b * S * ldv + g * Dv;
  for (int64_t j = 0; j < S; j++) {
    memset(dkb0 + j * ldk, 0, (size_t)D * sizeof(float));
    memset(dvb0 + j * ldv, 0, (size_t)Dv * sizeof(float));
  }
  for (int64_t h = g * G; h < (g + 1) * G; h++)
    for (int64_t i0 = 0; i0 < S; i0 += bq) ATT_FN(bwd_block)(a, b, h, g, i0, qt, dot, pt, dst);
  for (int64_t j = 0; j < S; j++) {
    scale_row(a->scale, D, dkb0 + j * ldk);
    if (a->round_bf16) {
      round_row(D, dkb0 + j * ldk);
      round_row(Dv, dvb0 + j * ldv);
    }
  }
}

static void ATT_FN(bwd_task)(void *ctx, int ti, int tn) {
  const bwd_args *a = (const bwd_args *)ctx;
  float qt[QT_FLOATS], dot[QT_FLOATS];
  float pt[BK * BQ_MAX], dst[BK * BQ_MAX];
  size_t begin, end;
  mf_partition((size_t)(a->B * a->Hkv), 1, ti, tn, &begin, &end);
  for (size_t it = begin; it < end; it++)
    ATT_FN(bwd_item)(a, (int64_t)it / a->Hkv, (int64_t)it % a->Hkv, qt, dot, pt, dst);
}

#undef vf
#undef VLOAD
#undef VSTORE

#endif /* ATT_BODY */
