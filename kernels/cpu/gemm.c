/*
 * The cpu kernels' GEMM (contract and layouts in gemm_impl.h).
 *
 * One register-blocked tile routine does every product: C over an mr x nr
 * tile (mr <= MR, nr <= NR),
 *   acc = load_c ? C[i,j] : 0;  for d in [0, depth): acc += A(i,d) * B(d,j);
 *   C[i,j] = round ? bf16(acc) : acc
 * with A(i,d) = a[i*sai + d*sad] and B(d,j) = b[d*ldb + j]. A full tile keeps
 * MR x NR sums in eight 4-float vectors, an edge tile runs the same sequence
 * per element, so every element is the plain sequential fp32 sum.
 *
 * Each layout blocks the product over columns and depth and hands the tile
 * routine operands it can stream:
 *   NT  B^T is packed, NT_CB columns x KC deep, into a depth-major stack panel
 *       reused by every row of A; A's rows are read in place.
 *   NN  both operands are read in place, in NN_CB x KC blocks of B.
 *   TN  both operands are packed per TN_DC-deep chunk, TN_MB x TN_NB at a
 *       time: their rows are lda and ldb floats apart (often a multiple of
 *       4 KiB, which would put every row in the same L1 set).
 * Between depth blocks the partial sums wait in C (an fp32 store and load is
 * exact) and only the last block rounds, so blocking changes speed, never bits.
 *
 * Stack: at most a 32 KiB panel (NT) or 40 KiB of panels (TN).
 */
#include <string.h>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/gemm_impl.h"

enum {
  MR = 4,      /* rows of a tile */
  NR = 8,      /* columns of a tile: two 4-float vectors */
  KC = 256,    /* depth of a block (NT, NN) */
  NT_CB = 32,  /* columns of B^T per packed panel */
  NN_CB = 256, /* columns of B per block */
  TN_MB = 16,  /* packed columns of A */
  TN_NB = 64,  /* packed columns of B */
  TN_DC = 128, /* depth of a packed TN chunk */
};

static inline int64_t min64(int64_t a, int64_t b) {
  return a < b ? a : b;
}

/* Four-lane vectors through the compiler's generic vector extension (SSE on
 * baseline x86-64, NEON on arm64): lane-wise mul and add, so each lane is the
 * same scalar sequence as the edge kernel. */
typedef float v4f __attribute__((vector_size(16)));
static inline v4f load4(const float *p) {
  v4f v;
  memcpy(&v, p, sizeof v);
  return v;
}
static inline void store4(float *p, v4f v) {
  memcpy(p, &v, sizeof v);
}

static __attribute__((noinline)) void micro_full(const float *a, int64_t sai, int64_t sad, const float *b,
                                                 int64_t ldb, int64_t depth, float *c, int64_t ldc,
                                                 int load_c, int round) {
  v4f acc[MR][2];
  for (int i = 0; i < MR; i++) {
    if (load_c) {
      acc[i][0] = load4(c + i * ldc);
      acc[i][1] = load4(c + i * ldc + 4);
    } else {
      acc[i][0] = (v4f){0.0f, 0.0f, 0.0f, 0.0f};
      acc[i][1] = acc[i][0];
    }
  }
  for (int64_t d = 0; d < depth; d++) {
    const v4f b0 = load4(b + d * ldb), b1 = load4(b + d * ldb + 4);
    const float *ad = a + d * sad;
    for (int i = 0; i < MR; i++) {
      const float s = ad[i * sai];
      const v4f ai = {s, s, s, s};
      acc[i][0] += ai * b0;
      acc[i][1] += ai * b1;
    }
  }
  for (int i = 0; i < MR; i++) {
    if (round) {
      for (int j = 0; j < 4; j++) {
        c[i * ldc + j] = mf_round_to_bf16(acc[i][0][j]);
        c[i * ldc + 4 + j] = mf_round_to_bf16(acc[i][1][j]);
      }
    } else {
      store4(c + i * ldc, acc[i][0]);
      store4(c + i * ldc + 4, acc[i][1]);
    }
  }
}

static __attribute__((noinline)) void micro_edge(const float *a, int64_t sai, int64_t sad, const float *b,
                                                 int64_t ldb, int64_t depth, float *c, int64_t ldc,
                                                 int load_c, int round, int mr, int nr) {
  for (int i = 0; i < mr; i++) {
    for (int j = 0; j < nr; j++) {
      float acc = load_c ? c[i * ldc + j] : 0.0f;
      for (int64_t d = 0; d < depth; d++) acc += a[i * sai + d * sad] * b[d * ldb + j];
      c[i * ldc + j] = round ? mf_round_to_bf16(acc) : acc;
    }
  }
}

/* C[m x n] (ldc) over depth, tile by tile. */
static void tiles(const float *a, int64_t sai, int64_t sad, const float *b, int64_t ldb, int64_t depth,
                  float *c, int64_t ldc, int64_t m, int64_t n, int load_c, int round) {
  for (int64_t i = 0; i < m; i += MR) {
    const int mr = (int)min64(MR, m - i);
    for (int64_t j = 0; j < n; j += NR) {
      const int nr = (int)min64(NR, n - j);
      const float *ai = a + i * sai;
      float *cij = c + i * ldc + j;
      if (mr == MR && nr == NR) {
        micro_full(ai, sai, sad, b + j, ldb, depth, cij, ldc, load_c, round);
      } else {
        micro_edge(ai, sai, sad, b + j, ldb, depth, cij, ldc, load_c, round, mr, nr);
      }
    }
  }
}

/* Depth loops below run at least once, so k = 0 still writes r(load_c ? C : 0). */

static void gemm_nt(const float *a, int64_t lda, const float *b, int64_t ldb, int64_t m, int64_t n, int64_t k,
                    float *c, int64_t ldc, int load_c, int round) {
  float panel[KC * NT_CB];
  for (int64_t j0 = 0; j0 < n; j0 += NT_CB) {
    const int64_t nb = min64(NT_CB, n - j0);
    int64_t p0 = 0;
    do {
      const int64_t kc = min64(KC, k - p0);
      for (int64_t j = 0; j < nb; j++) {
        const float *src = b + (j0 + j) * ldb + p0;
        for (int64_t d = 0; d < kc; d++) panel[d * NT_CB + j] = src[d];
      }
      tiles(a + p0, lda, 1, panel, NT_CB, kc, c + j0, ldc, m, nb, load_c || p0 > 0, round && p0 + kc == k);
      p0 += kc;
    } while (p0 < k);
  }
}

static void gemm_nn(const float *a, int64_t lda, const float *b, int64_t ldb, int64_t m, int64_t n, int64_t k,
                    float *c, int64_t ldc, int load_c, int round) {
  for (int64_t j0 = 0; j0 < n; j0 += NN_CB) {
    const int64_t nb = min64(NN_CB, n - j0);
    int64_t p0 = 0;
    do {
      const int64_t kc = min64(KC, k - p0);
      tiles(a + p0, lda, 1, b + p0 * ldb + j0, ldb, kc, c + j0, ldc, m, nb, load_c || p0 > 0,
            round && p0 + kc == k);
      p0 += kc;
    } while (p0 < k);
  }
}

/* dst[d*ldd + j] = src[d*lds + j] for d < rows, j < w. The byte count is made
 * opaque: seeing that it is small, gcc would expand the memcpy into
 * `rep movsq`, which costs more than these short copies (a fifth of dW time). */
static inline void pack_rows(const float *src, int64_t lds, int64_t rows, int64_t w, float *restrict dst,
                             int64_t ldd) {
  size_t bytes = (size_t)w * sizeof(float);
  __asm__("" : "+r"(bytes));
  for (int64_t d = 0; d < rows; d++) memcpy(dst + d * ldd, src + d * lds, bytes);
}

static void gemm_tn(const float *a, int64_t lda, const float *b, int64_t ldb, int64_t m, int64_t n, int64_t k,
                    float *c, int64_t ldc, int load_c, int round) {
  float ap[TN_DC * TN_MB], bp[TN_DC * TN_NB];
  for (int64_t j0 = 0; j0 < n; j0 += TN_NB) {
    const int64_t nb = min64(TN_NB, n - j0);
    int64_t p0 = 0;
    do {
      const int64_t dc = min64(TN_DC, k - p0);
      pack_rows(b + p0 * ldb + j0, ldb, dc, nb, bp, TN_NB);
      for (int64_t i0 = 0; i0 < m; i0 += TN_MB) {
        const int64_t mb = min64(TN_MB, m - i0);
        pack_rows(a + p0 * lda + i0, lda, dc, mb, ap, TN_MB);
        /* constant panel strides: the compiler specialises the tiles for them */
        tiles(ap, 1, TN_MB, bp, TN_NB, dc, c + i0 * ldc + j0, ldc, mb, nb, load_c || p0 > 0,
              round && p0 + dc == k);
      }
      p0 += dc;
    } while (p0 < k);
  }
}

void mf_cpu_gemm(mf_cpu_gemm_layout layout, const float *a, int64_t lda, const float *b, int64_t ldb,
                 int64_t m, int64_t n, int64_t k, float *c, int64_t ldc, int load_c, int round) {
  if (m <= 0 || n <= 0) return;
  switch (layout) {
    case MF_CPU_GEMM_NT:
      gemm_nt(a, lda, b, ldb, m, n, k, c, ldc, load_c, round);
      break;
    case MF_CPU_GEMM_NN:
      gemm_nn(a, lda, b, ldb, m, n, k, c, ldc, load_c, round);
      break;
    case MF_CPU_GEMM_TN:
      gemm_tn(a, lda, b, ldb, m, n, k, c, ldc, load_c, round);
      break;
  }
}
