/*
 * Causal GQA attention, flash style, on the cpu backend.
 *
 * Maths (per sequence b, query head h, kv head g = h / (Hq/Hkv), D head_dim):
 *   s[i,j] = (q[i].k[j]) * scale        fp32 dot first, then the scale, as
 *                                        transformers' eager path does
 *   p[i,j] = exp(s[i,j] - lse[i]),  lse[i] = log sum_{j<=i} exp(s[i,j])
 *   o[i]   = sum_{j<=i} p[i,j] v[j]
 * Backward, with Di = do[i].o[i]:
 *   dp = do.v,  ds = p * (dp - Di)
 *   dq[i] = scale * sum_j ds[i,j] k[j]
 *   dk[j] = scale * sum_{h in group} sum_i ds[i,j] q[i]
 *   dv[j] =         sum_{h in group} sum_i p[i,j] do[i]
 *
 * Shapes: q, o, dout, dq [B*S, Hq, D]; k, v, dk, dv [B*S, Hkv, D] (token-major);
 * lse [B, Hq, S].
 *
 * Tiling: queries in blocks of BQ rows, keys in tiles of bk (<= BK_MAX) rows.
 * A key tile is transposed into a stack buffer kt[D][bk], so a row of scores is
 * an axpy over keys (s[c] += q[d] * kt[d][c]): it vectorises without
 * reassociating, and every score is summed over d in order 0..D-1 — the same
 * bits as a plain sequential dot, whatever the vector width. Probabilities
 * never exist beyond one BQ x bk tile; the forward keeps an online softmax
 * (running max and sum per row) and rescales its accumulator, which is the
 * output row itself (owned by the item, so no heap is needed).
 *
 * Threads: forward items are (b, query head, query block), spread with
 * mf_partition; query blocks are interleaved (0, last, 1, last-1, ...) so a
 * contiguous share of items carries a fair part of the causal triangle. The
 * backward's items are (b, kv head): one thread owns dk/dv of a group and dq of
 * its query heads, summing heads, query blocks and rows in a fixed order. No
 * result depends on the thread count.
 *
 * Stack: per thread, kt and vt (KT_FLOATS each) and two BQ x BK_MAX score
 * tiles, about 48 KiB. bk shrinks as D grows (64 keys up to D = 64, 8 keys at
 * D = 512); D > 512 is refused with MF_ERR_UNSUPPORTED.
 */
#include <math.h>
#include <string.h>

#include "kernels/cpu/cpu_ops.h"

enum {
  BQ = 32,          /* query rows per block */
  BK_MAX = 64,      /* keys per tile */
  KT_FLOATS = 4096, /* floats in one transposed key (or value) tile */
  D_MAX = KT_FLOATS / 8,
  MR = 4, /* rows of a register block */
  NR = 8, /* columns of a register block */
};

static int key_tile(int64_t D) {
  int64_t bk = KT_FLOATS / D;
  if (bk > BK_MAX) bk = BK_MAX;
  return (int)(bk & ~(int64_t)7);
}

static mf_status check_args(const char *op, int64_t B, int64_t S, int64_t Hq, int64_t Hkv, int64_t D) {
  if (B < 0 || S < 0 || Hq <= 0 || Hkv <= 0 || D <= 0 || Hq % Hkv != 0)
    return MF_ERR(MF_ERR_INVALID_ARG, "%s: bad shape B=%lld S=%lld Hq=%lld Hkv=%lld D=%lld", op, (long long)B,
                  (long long)S, (long long)Hq, (long long)Hkv, (long long)D);
  if (D > D_MAX)
    return MF_ERR(MF_ERR_UNSUPPORTED, "%s: head_dim D=%lld is larger than the cpu kernel's tile (at most %d)", op,
                  (long long)D, (int)D_MAX);
  return MF_OK;
}

/* kt[d*bk + c] = x[c*ld + d] for c < nk. */
static void transpose_tile(const float *restrict x, int64_t ld, int nk, int64_t D, int bk, float *restrict kt) {
  for (int c = 0; c < nk; c++) {
    const float *row = x + (int64_t)c * ld;
    for (int64_t d = 0; d < D; d++) kt[d * bk + c] = row[d];
  }
}

/* Y[i, 0..N) = (load ? Y[i, 0..N) : 0) + sum_{k<K} A[i*am + k*ak] * X[k*ldx + 0..N)
 * for i < rows (<= MR). Every element is summed over k in order, one rounding
 * per multiply and per add (the build contracts nothing into FMAs), so the bits
 * match a plain sequential loop whatever the register blocking. One body for
 * all five products of the forward and the backward. */
static inline __attribute__((always_inline)) void mm_rows(int rows, int64_t N, int64_t K, const float *restrict A,
                                                          int64_t am, int64_t ak, const float *restrict X,
                                                          int64_t ldx, float *restrict Y, int64_t ldy, int load) {
  int64_t n = 0;
  for (; n + NR <= N; n += NR) {
    float acc[MR][NR];
    for (int i = 0; i < rows; i++)
      for (int j = 0; j < NR; j++) acc[i][j] = load ? Y[i * ldy + n + j] : 0.0f;
    for (int64_t k = 0; k < K; k++) {
      const float *restrict x = X + k * ldx + n;
      for (int i = 0; i < rows; i++) {
        const float a = A[i * am + k * ak];
        for (int j = 0; j < NR; j++) acc[i][j] += a * x[j];
      }
    }
    for (int i = 0; i < rows; i++)
      for (int j = 0; j < NR; j++) Y[i * ldy + n + j] = acc[i][j];
  }
  for (; n < N; n++)
    for (int i = 0; i < rows; i++) {
      float acc = load ? Y[i * ldy + n] : 0.0f;
      for (int64_t k = 0; k < K; k++) acc += A[i * am + k * ak] * X[k * ldx + n];
      Y[i * ldy + n] = acc;
    }
}

/* mm_rows over M rows: full MR blocks (rows a constant, kept in registers), then the rest. */
static void mm(int64_t M, int64_t N, int64_t K, const float *restrict A, int64_t am, int64_t ak,
               const float *restrict X, int64_t ldx, float *restrict Y, int64_t ldy, int load) {
  int64_t i = 0;
  for (; i + MR <= M; i += MR) mm_rows(MR, N, K, A + i * am, am, ak, X, ldx, Y + i * ldy, ldy, load);
  for (; i < M; i++) mm_rows(1, N, K, A + i * am, am, ak, X, ldx, Y + i * ldy, ldy, load);
}

/* exp(x) as Cephes' expf (x = n ln2 + r, ln2 in two parts, a degree-5
 * polynomial in r; within about 2 ulp of exp), branch-free so the loops around it
 * vectorise, with the same bits at any vector width. Softmax arguments are
 * <= 0 (up to rounding); below -87.3 (results under FLT_MIN, and -inf) it
 * gives 0; NaN stays NaN. */
static inline float exp_f(float x) {
  const float lo = -87.3f, hi = 88.0f;
  float xc = x > lo ? x : lo;
  xc = xc < hi ? xc : hi;
  const float t = xc * 1.44269504088896341f + 0.5f;
  int32_t n = (int32_t)t;
  n -= (float)n > t; /* floor */
  const float fn = (float)n;
  float r = xc - fn * 0.693359375f;
  r = r - fn * -2.12194440e-4f;
  float y = 1.9875691500e-4f;
  y = y * r + 1.3981999507e-3f;
  y = y * r + 8.3334519073e-3f;
  y = y * r + 4.1665795894e-2f;
  y = y * r + 1.6666665459e-1f;
  y = y * r + 5.0000001201e-1f;
  y = y * (r * r) + r + 1.0f;
  union {
    uint32_t u;
    float f;
  } p2 = {(uint32_t)(n + 127) << 23};
  y *= p2.f;
  return x >= lo ? y : (x < lo ? 0.0f : x);
}

/* y[0..D) *= a */
static inline void scale_row(float a, int64_t D, float *restrict y) {
  for (int64_t d = 0; d < D; d++) y[d] *= a;
}

static inline void round_row(int64_t D, float *restrict y) {
  for (int64_t d = 0; d < D; d++) y[d] = mf_round_to_bf16(y[d]);
}

/* ------------------------------------------------------------- forward */

typedef struct {
  const float *q, *k, *v;
  float *o, *lse;
  int64_t B, S, Hq, Hkv, D, nqb;
  float scale;
  int round_bf16;
} fwd_args;

static void fwd_item(const fwd_args *a, int64_t b, int64_t h, int64_t qb, float *restrict kt,
                     float *restrict st) {
  const int64_t S = a->S, Hq = a->Hq, Hkv = a->Hkv, D = a->D;
  const int64_t g = h / (Hq / Hkv);
  const int bk = key_tile(D);
  const int64_t ldq = Hq * D, ldk = Hkv * D;
  const int64_t i0 = qb * BQ, i1 = i0 + BQ < S ? i0 + BQ : S;
  const int nq = (int)(i1 - i0);
  const float *qb0 = a->q + (b * S + i0) * ldq + h * D;
  float *ob0 = a->o + (b * S + i0) * ldq + h * D;
  const float *kb0 = a->k + b * S * ldk + g * D;
  const float *vb0 = a->v + b * S * ldk + g * D;
  const float scale = a->scale;
  float m[BQ], l[BQ];

  for (int r = 0; r < nq; r++) {
    m[r] = -INFINITY;
    l[r] = 0.0f;
    memset(ob0 + r * ldq, 0, (size_t)D * sizeof(float));
  }
  for (int64_t j0 = 0; j0 < i1; j0 += bk) {
    const int nk = (int)(j0 + bk < i1 ? bk : i1 - j0);
    transpose_tile(kb0 + j0 * ldk, ldk, nk, D, bk, kt);
    for (int r0 = 0; r0 < nq; r0 += MR) {
      const int rows = nq - r0 < MR ? nq - r0 : MR;
      const int64_t ilast = i0 + r0 + rows - 1;
      if (ilast < j0) continue;
      /* keys this row block sees in the tile; row i sees n = i + 1 - j0 of them */
      const int N = (int)(ilast + 1 - j0 < nk ? ilast + 1 - j0 : nk);
      mm(rows, N, D, qb0 + r0 * ldq, ldq, 1, kt, bk, st, BK_MAX, 0);
      for (int rr = 0; rr < rows; rr++) {
        const int r = r0 + rr;
        const int64_t seen = i0 + r + 1 - j0;
        const int n = (int)(seen < N ? (seen > 0 ? seen : 0) : N);
        float *restrict s = st + rr * BK_MAX;
        float mx = m[r];
        for (int c = 0; c < n; c++) {
          s[c] *= scale;
          mx = s[c] > mx ? s[c] : mx;
        }
        const float alpha = exp_f(m[r] - mx); /* 0 on the first tile (m = -inf); 1 if n = 0 */
        for (int c = 0; c < n; c++) s[c] = exp_f(s[c] - mx);
        for (int c = n; c < N; c++) s[c] = 0.0f;
        float sum = 0.0f;
        for (int c = 0; c < n; c++) sum += s[c];
        l[r] = l[r] * alpha + sum;
        m[r] = mx;
        if (alpha != 1.0f) scale_row(alpha, D, ob0 + r * ldq);
      }
      mm(rows, D, N, st, BK_MAX, 1, vb0 + j0 * ldk, ldk, ob0 + r0 * ldq, ldq, 1);
    }
  }
  float *lse = a->lse + (b * Hq + h) * S + i0;
  for (int r = 0; r < nq; r++) {
    float *orow = ob0 + r * ldq;
    scale_row(1.0f / l[r], D, orow);
    if (a->round_bf16) round_row(D, orow);
    lse[r] = m[r] + logf(l[r]);
  }
}

static void fwd_task(void *ctx, int ti, int tn) {
  const fwd_args *a = (const fwd_args *)ctx;
  float kt[KT_FLOATS];
  float st[MR * BK_MAX];
  const int64_t nqb = a->nqb;
  size_t begin, end;
  mf_partition((size_t)(a->B * a->Hq * nqb), 1, ti, tn, &begin, &end);
  for (size_t it = begin; it < end; it++) {
    const int64_t bh = (int64_t)it / nqb, t = (int64_t)it % nqb;
    const int64_t qb = (t & 1) ? nqb - 1 - t / 2 : t / 2;
    fwd_item(a, bh / a->Hq, bh % a->Hq, qb, kt, st);
  }
}

mf_status mf_cpu_attention_fwd(const mf_kctx *ctx, const float *q, const float *k, const float *v, int64_t B,
                               int64_t S, int64_t Hq, int64_t Hkv, int64_t D, float scale, float *o, float *lse) {
  MF_CHECK(check_args("attention_fwd", B, S, Hq, Hkv, D));
  if (B == 0 || S == 0) return MF_OK;
  fwd_args a = {q, k, v, o, lse, B, S, Hq, Hkv, D, (S + BQ - 1) / BQ, scale, ctx && ctx->round_bf16};
  mf_threadpool_run(ctx ? ctx->pool : NULL, fwd_task, &a);
  return MF_OK;
}

/* ------------------------------------------------------------ backward */

typedef struct {
  const float *q, *k, *v, *o, *dout, *lse;
  float *dq, *dk, *dv;
  int64_t B, S, Hq, Hkv, D;
  float scale;
  int round_bf16;
} bwd_args;

/* One query block of query head h against every key tile it sees: dq rows
 * written (scaled, rounded) here; dk/dv rows of the group accumulated. */
static void bwd_block(const bwd_args *a, int64_t b, int64_t h, int64_t g, int64_t i0, float *restrict kt,
                      float *restrict vt, float *restrict pt, float *restrict dst) {
  const int64_t S = a->S, Hq = a->Hq, Hkv = a->Hkv, D = a->D;
  const int bk = key_tile(D);
  const int64_t ldq = Hq * D, ldk = Hkv * D;
  const int64_t i1 = i0 + BQ < S ? i0 + BQ : S;
  const int nq = (int)(i1 - i0);
  const int64_t qoff = (b * S + i0) * ldq + h * D;
  const float *qb0 = a->q + qoff, *ob0 = a->o + qoff, *dob0 = a->dout + qoff;
  float *dqb0 = a->dq + qoff;
  const int64_t koff = b * S * ldk + g * D;
  const float *kb0 = a->k + koff, *vb0 = a->v + koff;
  float *dkb0 = a->dk + koff, *dvb0 = a->dv + koff;
  const float *lse = a->lse + (b * Hq + h) * S + i0;
  const float scale = a->scale;
  float di[BQ];

  for (int r = 0; r < nq; r++) {
    const float *dor = dob0 + r * ldq, *orow = ob0 + r * ldq;
    float acc = 0.0f;
    for (int64_t d = 0; d < D; d++) acc += dor[d] * orow[d];
    di[r] = acc;
    memset(dqb0 + r * ldq, 0, (size_t)D * sizeof(float));
  }
  for (int64_t j0 = 0; j0 < i1; j0 += bk) {
    const int nk = (int)(j0 + bk < i1 ? bk : i1 - j0);
    transpose_tile(kb0 + j0 * ldk, ldk, nk, D, bk, kt);
    transpose_tile(vb0 + j0 * ldk, ldk, nk, D, bk, vt);
    /* p and ds for every row that sees the tile, masked entries 0 */
    for (int r0 = 0; r0 < nq; r0 += MR) {
      const int rows = nq - r0 < MR ? nq - r0 : MR;
      const int64_t ilast = i0 + r0 + rows - 1;
      if (ilast < j0) continue;
      const int N = (int)(ilast + 1 - j0 < nk ? ilast + 1 - j0 : nk);
      mm(rows, N, D, qb0 + r0 * ldq, ldq, 1, kt, bk, pt + r0 * BK_MAX, BK_MAX, 0);
      mm(rows, N, D, dob0 + r0 * ldq, ldq, 1, vt, bk, dst + r0 * BK_MAX, BK_MAX, 0);
      for (int rr = 0; rr < rows; rr++) {
        const int r = r0 + rr;
        const int64_t seen = i0 + r + 1 - j0;
        const int n = (int)(seen < N ? (seen > 0 ? seen : 0) : N);
        float *restrict p = pt + r * BK_MAX, *restrict ds = dst + r * BK_MAX;
        const float lr = lse[r], dr = di[r];
        for (int c = 0; c < n; c++) p[c] = exp_f(p[c] * scale - lr);
        for (int c = 0; c < n; c++) ds[c] = p[c] * (ds[c] - dr);
        for (int c = n; c < nk; c++) p[c] = ds[c] = 0.0f;
      }
      /* dq[r] += sum_c ds[r,c] k[c] */
      mm(rows, D, N, dst + r0 * BK_MAX, BK_MAX, 1, kb0 + j0 * ldk, ldk, dqb0 + r0 * ldq, ldq, 1);
    }
    /* dk[c] += sum_r ds[r,c] q[r], dv[c] += sum_r p[r,c] do[r], over rows r that see key c */
    for (int c0 = 0; c0 < nk; c0 += MR) {
      const int rows = nk - c0 < MR ? nk - c0 : MR;
      const int64_t r0 = j0 + c0 - i0 > 0 ? j0 + c0 - i0 : 0;
      if (r0 >= nq) break;
      const int64_t jo = (j0 + c0) * ldk;
      mm(rows, D, nq - r0, dst + r0 * BK_MAX + c0, 1, BK_MAX, qb0 + r0 * ldq, ldq, dkb0 + jo, ldk, 1);
      mm(rows, D, nq - r0, pt + r0 * BK_MAX + c0, 1, BK_MAX, dob0 + r0 * ldq, ldq, dvb0 + jo, ldk, 1);
    }
  }
  for (int r = 0; r < nq; r++) {
    float *dqr = dqb0 + r * ldq;
    scale_row(scale, D, dqr);
    if (a->round_bf16) round_row(D, dqr);
  }
}

static void bwd_item(const bwd_args *a, int64_t b, int64_t g, float *kt, float *vt, float *pt, float *dst) {
  const int64_t S = a->S, D = a->D, ldk = a->Hkv * D, G = a->Hq / a->Hkv;
  float *dkb0 = a->dk + b * S * ldk + g * D, *dvb0 = a->dv + b * S * ldk + g * D;
  for (int64_t j = 0; j < S; j++) {
    memset(dkb0 + j * ldk, 0, (size_t)D * sizeof(float));
    memset(dvb0 + j * ldk, 0, (size_t)D * sizeof(float));
  }
  for (int64_t h = g * G; h < (g + 1) * G; h++)
    for (int64_t i0 = 0; i0 < S; i0 += BQ) bwd_block(a, b, h, g, i0, kt, vt, pt, dst);
  for (int64_t j = 0; j < S; j++) {
    scale_row(a->scale, D, dkb0 + j * ldk);
    if (a->round_bf16) {
      round_row(D, dkb0 + j * ldk);
      round_row(D, dvb0 + j * ldk);
    }
  }
}

static void bwd_task(void *ctx, int ti, int tn) {
  const bwd_args *a = (const bwd_args *)ctx;
  float kt[KT_FLOATS], vt[KT_FLOATS];
  float pt[BQ * BK_MAX], dst[BQ * BK_MAX];
  size_t begin, end;
  mf_partition((size_t)(a->B * a->Hkv), 1, ti, tn, &begin, &end);
  for (size_t it = begin; it < end; it++) bwd_item(a, (int64_t)it / a->Hkv, (int64_t)it % a->Hkv, kt, vt, pt, dst);
}

mf_status mf_cpu_attention_bwd(const mf_kctx *ctx, const float *q, const float *k, const float *v,
                               const float *o, const float *dout, const float *lse, int64_t B, int64_t S,
                               int64_t Hq, int64_t Hkv, int64_t D, float scale, float *dq, float *dk, float *dv) {
  MF_CHECK(check_args("attention_bwd", B, S, Hq, Hkv, D));
  if (B == 0 || S == 0) return MF_OK;
  bwd_args a = {q, k, v, o, dout, lse, dq, dk, dv, B, S, Hq, Hkv, D, scale, ctx && ctx->round_bf16};
  mf_threadpool_run(ctx ? ctx->pool : NULL, bwd_task, &a);
  return MF_OK;
}
