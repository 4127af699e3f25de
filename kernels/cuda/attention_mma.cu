// Causal GQA attention of BF16 storage on tensor cores (mma.sync m16n8k16,
// bf16 operands, fp32 accumulators), FlashAttention-2 style: the maths,
// layouts and outputs of attention.cu (read its header), whose bf16 entry
// points call mf_cuda_attn_mma_* (ops.cuh) and keep their CUDA-core kernels
// for the calls this path does not take (*ran = 0): D not a multiple of 16 or
// above 128, an operand not 16-byte aligned; fp32 storage never comes here.
//
// Maths (sequence b, query head h, kv head g = h / (Hq/Hkv), key j <= i):
//   s[i,j] = (q[i].k[j]) * scale,  m[i] = max_j s[i,j],  l[i] = sum_j exp(s[i,j] - m[i])
//   o[i] = sum_j exp(s[i,j] - m[i]) v[j] / l[i],  lse[i] = m[i] + log l[i]
// Backward, Di = do[i].o[i] (attention.cu's Di launch, stashed in dq's row,
// attn_stash.cuh):  p = exp(s - lse),  dp = do.v,  ds = p (dp - Di)
//   dq[i] = scale sum_j ds[i,j] k[j];  dk[j] = scale sum_{h in g} sum_i ds[i,j] q[i]
//   dv[j] = sum_{h in g} sum_i p[i,j] do[i]          (all three written, not added)
// Every product is an mma: C[m, n] = sum_k A(m, k) B(k, n) with A 16 x 16
// "row" and B 16 x 8 "col" (both k-contiguous in registers). In shared memory
// a tile is 64 rows of one head ([64][DP + 8] bf16, d contiguous), so
//   S = Q K^T, dP = dO V^T (dq), S^T = K Q^T, dP^T = V dO^T (dk/dv):
//       A and B both rows of tiles, k = d: ldmatrix (mma_abt);
//   O += P V, dQ += dS K, dV += P^T dO, dK += dS^T Q:
//       A = P, dS or their transposes from the fp32 accumulators of the first
//       product, rounded to bf16 in registers (to_a_frags: the accumulator's
//       m16n8 layout is the A fragment's, two n8 tiles a k16 step); B rows of
//       a tile are the contraction: ldmatrix.trans (mma_pv).
// Rounding: P (and dS, P^T, dS^T in the backward) is rounded to bf16 as an mma
// operand, as every flash kernel does; the softmax sums l use the fp32 p, and
// every accumulation is fp32. So against attention.cu's fp32 p the relative
// error of one p v term is at most 2^-9, random in sign, and o, dq, dk, dv
// differ from it by about 2^-9 / sqrt(keys) of their scale — below their own
// bf16 rounding (2^-9). Everything else differs only in the order of fp32 sums.
//
// Tiling: a CTA of 4 warps (NT = 128 threads), tiles of 64 rows, a warp owns
// 16 rows of the CTA's tile (the m16 of the mma) and all 64 columns of a step.
//   forward  grid (query blocks, Hq, B), heaviest (last) query block first:
//            the CTA's Q tile, then key tiles 0 .. diagonal (K and V) through a
//            cp.async double buffer; per tile S (16 x 64 a warp, 32 fp32
//            registers), the online softmax on the fragments (row max and sum
//            over the quad of lanes sharing a row: two xor shuffles), causal
//            mask on the diagonal tile only, O += P V (O: 16 x DP a warp, DP/2
//            registers), then o = O / l and lse.
//   dk/dv    grid (key blocks, Hkv, B), key block 0 (the most query blocks)
//            first: the CTA's K and V tiles, then for each
//            query head of the group in order and each query block from the
//            diagonal to the end in order, the Q and dO tiles through the
//            double buffer; S^T and dP^T (keys x queries), P^T recomputed from
//            lse, dV += P^T dO, dK += dS^T Q in registers (fixed order).
//   dq       grid (query blocks, Hq, B), heaviest first: the CTA's Q and dO
//            tiles (and Di, lse of its rows), key tiles 0 .. diagonal through
//            the double buffer; S, dP, dS, dQ += dS K.
// No atomics: each output element has one thread, which sums in a fixed
// order: two runs give the same bits.
// Why these sizes: 64-row tiles with 16 rows a warp keep a warp's registers
// at DP = 128 to S 32 + O 64 (forward), S 32 + dP 32 + dQ 64 (dq) and
// S 32 + dP 32 + dK 64 + dV 64 (dk/dv, the tightest) fp32 values, under the
// 255-register limit; D up to 128 because at D = 256 the dk/dv accumulators
// alone are 256 registers a thread (that kernel would need 8 warps over 128
// keys and D split across warps, or dK/dV in shared memory) and the forward's
// O 128 + S 32 leaves no room for fragments: D = 256 keeps the CUDA-core
// kernels. DP, the padded tile width, is 64 (D <= 64) or 128; columns past D
// are never copied nor read (the k16 steps and n16 pairs stop at D).
// Rows of a tile are DP + 8 elements (144 or 272 bytes, 9 or 17 16-byte
// chunks): the 8 rows of an ldmatrix phase fall in 8 different bank groups,
// and every chunk stays 16-byte aligned for cp.async. Rows and keys past S
// are zero-filled by cp.async (src-size 0) and masked, so any S works.
// Shared memory (bytes) at DP = 64 / 128: forward Q + 2 x (K, V) = 5 tiles,
// 46 080 / 87 040; dk/dv (K, V, 2 x (Q, dO)) and dq (Q, dO, 2 x (K, V)) 6
// tiles, 55 296 / 104 448: above 48 KiB, so each launch opts in; sm_80 allows
// 163 KiB a block, sm_90 227 KiB (two CTAs an SM at DP = 128).
//
// The PTX primitives come from mma.cuh. MF_MMA_EMULATE leaves them and the
// launchers out so that a host program can include this file with its own
// (tests/cuda/mma_emu.h) and run the kernels on the CPU.
#ifndef MF_MMA_EMULATE
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/mma.cuh"
#include "kernels/cuda/ops.cuh"
#endif
#include "kernels/cuda/attn_stash.cuh"

namespace {

enum { ANT = 128, AROWS = 64, APAD = 8, ADMAX = 128 };

// Elements of a row, and of a whole [AROWS][DP + APAD] tile.
template <int DP>
__host__ __device__ constexpr int row_ld() {
  return DP + APAD;
}
template <int DP>
__host__ __device__ constexpr int tile_elems() {
  return AROWS * row_ld<DP>();
}
template <int DP>
__host__ __device__ constexpr size_t fwd_smem() {
  return (size_t)5 * tile_elems<DP>() * sizeof(mf_bf16);
}
template <int DP>
__host__ __device__ constexpr size_t bwd_smem() {
  return (size_t)6 * tile_elems<DP>() * sizeof(mf_bf16);
}

// Issues this thread's cp.async copies of rows [r0, r0 + AROWS) of one head
// (row r at g + r * ldg) into the tile s: rows at or past `rows` are
// zero-filled, columns at or past D (a multiple of 16) are not copied.
template <int DP>
__device__ __forceinline__ void load_tile(const mf_bf16 *g, int64_t ldg, int64_t r0, int64_t rows, int D,
                                          mf_bf16 *s) {
  constexpr int PER_ROW = DP / 8, CHUNKS = AROWS * PER_ROW;
  static_assert(CHUNKS % ANT == 0, "every thread copies whole chunks");
#pragma unroll
  for (int x = 0; x < CHUNKS / ANT; x++) {
    const int c = (int)threadIdx.x + x * ANT, row = c / PER_ROW, col = (c % PER_ROW) * 8;
    if (col >= D) continue;
    const bool in = r0 + row < rows;
    cp_async16(s + row * row_ld<DP>() + col, in ? g + (r0 + row) * ldg + col : g, in);
  }
}

// Runs compute(t, stage) for tiles t = 0 .. n-1 (n >= 1) through a cp.async
// double buffer: issue(t, stage) issues this thread's copies of tile t into
// stage t % 2. Copies the caller issued before (its fixed tiles) join tile
// 0's group. The barrier before tile t makes every thread's copies of tile t
// visible and ends every warp's reads of tile t - 1, whose stage tile t + 1
// then overwrites while the warps compute on tile t.
template <typename I, typename C>
__device__ __forceinline__ void stream_tiles(int n, I issue, C compute) {
  issue(0, 0);
  cp_async_commit();
  for (int t = 0; t < n; t++) {
    cp_async_wait<0>();
    __syncthreads();
    if (t + 1 < n) issue(t + 1, (t + 1) & 1);
    cp_async_commit();
    compute(t, t & 1);
  }
  cp_async_wait<0>();  // only the empty last group
}

// acc = A . B^T over d in [0, D): A the warp's 16 rows at sa, B the 8 NI rows
// at sb, both tile rows (d contiguous). acc[n][c]: row lane / 4 + 8 (c >> 1),
// column 8 n + 2 (lane % 4) + (c & 1).
template <int DP, int NI>
__device__ __forceinline__ void mma_abt(float (&acc)[NI][4], const mf_bf16 *sa, const mf_bf16 *sb, int D) {
  const int lane = (int)threadIdx.x & 31, j = lane >> 3, i = lane & 7;
#pragma unroll
  for (int n = 0; n < NI; n++) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
#pragma unroll
  for (int kk = 0; kk < DP; kk += 16) {
    if (kk >= D) break;
    uint32_t a[4];  // matrices (rows 0-7, 8-15) x (d 0-7, 8-15), row block fastest
    ldsm_x4<false>(a, sa + (8 * (j & 1) + i) * row_ld<DP>() + kk + 8 * (j >> 1));
#pragma unroll
    for (int p = 0; p < NI / 2; p++) {
      uint32_t r[4];  // (B rows 0-7: d 0-7, 8-15), (rows 8-15: d 0-7, 8-15)
      ldsm_x4<false>(r, sb + (16 * p + 8 * (j >> 1) + i) * row_ld<DP>() + kk + 8 * (j & 1));
      const uint32_t b0[2] = {r[0], r[1]}, b1[2] = {r[2], r[3]};
      mma_bf16(acc[2 * p], a, b0);
      mma_bf16(acc[2 * p + 1], a, b1);
    }
  }
}

// A fragments (bf16) of the 16 x 8 NI matrix held as mma_abt's accumulators:
// k16 step x = n8 tiles 2x and 2x + 1; registers (rows 0-7, k 0-7), (8-15,
// 0-7), (0-7, 8-15), (8-15, 8-15).
template <int NI>
__device__ __forceinline__ void to_a_frags(uint32_t (&pa)[NI / 2][4], const float (&s)[NI][4]) {
#pragma unroll
  for (int x = 0; x < NI / 2; x++) {
    pa[x][0] = pack_bf16x2(s[2 * x][0], s[2 * x][1]);
    pa[x][1] = pack_bf16x2(s[2 * x][2], s[2 * x][3]);
    pa[x][2] = pack_bf16x2(s[2 * x + 1][0], s[2 * x + 1][1]);
    pa[x][3] = pack_bf16x2(s[2 * x + 1][2], s[2 * x + 1][3]);
  }
}

// acc[16 x DP] += P . V over 16 NK contraction rows: P as A fragments, V the
// tile at sv whose rows are the contraction (ldmatrix.trans); columns d < D.
template <int DP, int NK>
__device__ __forceinline__ void mma_pv(float (&acc)[DP / 8][4], const uint32_t (&pa)[NK][4],
                                       const mf_bf16 *sv, int D) {
  const int lane = (int)threadIdx.x & 31, j = lane >> 3, i = lane & 7;
#pragma unroll
  for (int x = 0; x < NK; x++)
#pragma unroll
    for (int p = 0; p < DP / 16; p++) {
      if (16 * p >= D) break;
      uint32_t r[4];  // (d 0-7: rows 0-7, 8-15), (d 8-15: rows 0-7, 8-15)
      ldsm_x4<true>(r, sv + (16 * x + 8 * (j & 1) + i) * row_ld<DP>() + 16 * p + 8 * (j >> 1));
      const uint32_t b0[2] = {r[0], r[1]}, b1[2] = {r[2], r[3]};
      mma_bf16(acc[2 * p], pa[x], b0);
      mma_bf16(acc[2 * p + 1], pa[x], b1);
    }
}

template <int N>
__device__ __forceinline__ void zero(float (&a)[N][4]) {
#pragma unroll
  for (int n = 0; n < N; n++) a[n][0] = a[n][1] = a[n][2] = a[n][3] = 0.0f;
}

// The sum (or max) over the quad of lanes that hold one accumulator row.
__device__ __forceinline__ float quad_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v + __shfl_xor_sync(0xffffffffu, v, 2);
}
__device__ __forceinline__ float quad_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}

// One key tile of the forward's online softmax on a warp's 16 x 64 dot
// products s (replaced by p = exp(s scale - m_new)): keys past key `diag` of
// the warp's row 0 (and diag + 8 of row 8, ...) are masked when diag >= 0
// (the diagonal tile). m, l: the running max and this thread's partial sum of
// rows lane / 4 and + 8; acc rescaled by exp(m_old - m_new).
template <int NI, int NO>
__device__ __forceinline__ void online_softmax(float (&s)[NI][4], float (&m)[2], float (&l)[2],
                                               float (&acc)[NO][4], float scale, int diag) {
  const int lane = (int)threadIdx.x & 31, r = lane >> 2, c2 = 2 * (lane & 3);
  float mx[2] = {m[0], m[1]};
#pragma unroll
  for (int n = 0; n < NI; n++)
#pragma unroll
    for (int c = 0; c < 4; c++) {
      float x = s[n][c] * scale;
      if (diag >= 0 && 8 * n + c2 + (c & 1) > diag + r + 8 * (c >> 1)) x = -INFINITY;
      s[n][c] = x;
      mx[c >> 1] = fmaxf(mx[c >> 1], x);
    }
  float alpha[2];
#pragma unroll
  for (int h = 0; h < 2; h++) {
    // Key 0 of the first tile is never masked: m is finite after it.
    mx[h] = quad_max(mx[h]);
    alpha[h] = expf(m[h] - mx[h]);
    m[h] = mx[h];
    l[h] *= alpha[h];
  }
#pragma unroll
  for (int n = 0; n < NI; n++)
#pragma unroll
    for (int c = 0; c < 4; c++) {
      const float p = expf(s[n][c] - m[c >> 1]);
      s[n][c] = p;
      l[c >> 1] += p;
    }
#pragma unroll
  for (int n = 0; n < NO; n++)
#pragma unroll
    for (int c = 0; c < 4; c++) acc[n][c] *= alpha[c >> 1];
}

// The head's rows at tokens [0, S) of sequence b: x + (b S + i) ld + head D.
struct head_rows {
  const mf_bf16 *p;
  int64_t ld;
};
__device__ __forceinline__ head_rows head_of(const mf_bf16 *x, int64_t b, int64_t S, int H, int head, int D) {
  const int64_t ld = (int64_t)H * D;
  return {x + b * S * ld + (int64_t)head * D, ld};
}

// ---------------------------------------------------------------- forward

template <int DP>
__global__ void __launch_bounds__(ANT)
    attn_fwd_mma(const mf_bf16 *q, const mf_bf16 *k, const mf_bf16 *v, int64_t S, int Hq, int Hkv, int D,
                 float scale, mf_bf16 *o, float *lse) {
  constexpr int TE = tile_elems<DP>(), NI = AROWS / 8, NO = DP / 8;
  mf_bf16 *const Qs = reinterpret_cast<mf_bf16 *>(mma_smem()), *const KV = Qs + TE;
  const int64_t q0 = ((S + AROWS - 1) / AROWS - 1 - (int64_t)blockIdx.x) * AROWS;
  const int h = (int)blockIdx.y, g = h / (Hq / Hkv);
  const int64_t b = blockIdx.z;
  const head_rows qh = head_of(q, b, S, Hq, h, D), kh = head_of(k, b, S, Hkv, g, D),
                  vh = head_of(v, b, S, Hkv, g, D);
  const int lane = (int)threadIdx.x & 31, w0 = 16 * ((int)threadIdx.x >> 5);

  load_tile<DP>(qh.p, qh.ld, q0, S, D, Qs);
  float acc[NO][4], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  zero(acc);
  const int nt = (int)(q0 / AROWS) + 1;  // key tiles 0 .. the diagonal
  stream_tiles(
      nt,
      [&](int t, int st) {
        load_tile<DP>(kh.p, kh.ld, (int64_t)t * AROWS, S, D, KV + 2 * st * TE);
        load_tile<DP>(vh.p, vh.ld, (int64_t)t * AROWS, S, D, KV + (2 * st + 1) * TE);
      },
      [&](int t, int st) {
        float s[NI][4];
        mma_abt<DP, NI>(s, Qs + w0 * row_ld<DP>(), KV + 2 * st * TE, D);
        online_softmax(s, m, l, acc, scale, t == nt - 1 ? w0 : -1);
        uint32_t pa[NI / 2][4];
        to_a_frags<NI>(pa, s);
        mma_pv<DP, NI / 2>(acc, pa, KV + (2 * st + 1) * TE, D);
      });

  const int c2 = 2 * (lane & 3);
#pragma unroll
  for (int hh = 0; hh < 2; hh++) {
    const float lsum = quad_sum(l[hh]), inv = 1.0f / lsum;
    const int64_t i = q0 + w0 + (lane >> 2) + 8 * hh;
    if (i >= S) continue;
    mf_bf16 *const orow = o + (b * S + i) * qh.ld + (int64_t)h * D;
#pragma unroll
    for (int n = 0; n < NO; n++)
      if (8 * n + c2 < D) st_bf16x2(orow + 8 * n + c2, acc[n][2 * hh] * inv, acc[n][2 * hh + 1] * inv);
    if ((lane & 3) == 0) lse[(b * Hq + h) * S + i] = m[hh] + logf(lsum);
  }
}

// --------------------------------------------------------------- backward

// p = exp(s scale - lse[i]) (0 where masked: key j > query i, or i past S) and
// ds = p (dp - Di[i]) on a warp's 16 x 64 fragments (accumulator layout):
// (row, column) = (key, query) when KEY_ROWS (dk/dv), else (query, key). i0 /
// j0: the query / key of the fragment's row or column 0; lse_row / di_row
// (not KEY_ROWS): lse and Di of the thread's rows lane / 4 and + 8; lse_h /
// stash_h (KEY_ROWS): the head's lse and Di stash, read per column.
template <bool KEY_ROWS, int NI>
__device__ __forceinline__ void softmax_grad(float (&s)[NI][4], float (&dp)[NI][4], int64_t i0, int64_t j0,
                                             int64_t S, float scale, const float (&lse_row)[2],
                                             const float (&di_row)[2], const float *lse_h,
                                             const mf_bf16 *stash_h, int64_t ldq) {
  const int lane = (int)threadIdx.x & 31, r = lane >> 2, c2 = 2 * (lane & 3);
#pragma unroll
  for (int n = 0; n < NI; n++)
#pragma unroll
    for (int c = 0; c < 4; c++) {
      const int row = r + 8 * (c >> 1), col = 8 * n + c2 + (c & 1);
      const int64_t i = KEY_ROWS ? i0 + col : i0 + row, j = KEY_ROWS ? j0 + row : j0 + col;
      float p = 0.0f, di = 0.0f;
      if (i < S && j <= i) {
        const float l = KEY_ROWS ? lse_h[i] : lse_row[c >> 1];
        di = KEY_ROWS ? stash_get(stash_h + i * ldq) : di_row[c >> 1];
        p = expf(s[n][c] * scale - l);
      }
      s[n][c] = p;
      dp[n][c] = p * (dp[n][c] - di);
    }
}

template <int DP>
__global__ void __launch_bounds__(ANT)
    attn_dkdv_mma(const mf_bf16 *q, const mf_bf16 *k, const mf_bf16 *v, const mf_bf16 *dout, const float *lse,
                  const mf_bf16 *dq_stash, int64_t S, int Hq, int Hkv, int D, float scale, mf_bf16 *dk,
                  mf_bf16 *dv) {
  constexpr int TE = tile_elems<DP>(), NI = AROWS / 8, NO = DP / 8;
  mf_bf16 *const Ks = reinterpret_cast<mf_bf16 *>(mma_smem()), *const Vs = Ks + TE, *const QO = Vs + TE;
  const int64_t j0 = (int64_t)blockIdx.x * AROWS;
  const int g = (int)blockIdx.y, G = Hq / Hkv;
  const int64_t b = blockIdx.z;
  const head_rows kh = head_of(k, b, S, Hkv, g, D), vh = head_of(v, b, S, Hkv, g, D);
  const int lane = (int)threadIdx.x & 31, w0 = 16 * ((int)threadIdx.x >> 5);

  load_tile<DP>(kh.p, kh.ld, j0, S, D, Ks);
  load_tile<DP>(vh.p, vh.ld, j0, S, D, Vs);
  float dka[NO][4], dva[NO][4];
  zero(dka);
  zero(dva);
  // Tile t: query head g G + t / nq, query block j0 + (t % nq) rows (the
  // diagonal block first: 64-row query and key blocks are aligned).
  const int nq = (int)((S - j0 + AROWS - 1) / AROWS);
  const float none[2] = {0.0f, 0.0f};
  stream_tiles(
      G * nq,
      [&](int t, int st) {
        const int h = g * G + t / nq;
        const int64_t q0 = j0 + (int64_t)(t % nq) * AROWS;
        const head_rows qh = head_of(q, b, S, Hq, h, D), oh = head_of(dout, b, S, Hq, h, D);
        load_tile<DP>(qh.p, qh.ld, q0, S, D, QO + 2 * st * TE);
        load_tile<DP>(oh.p, oh.ld, q0, S, D, QO + (2 * st + 1) * TE);
      },
      [&](int t, int st) {
        const int h = g * G + t / nq;
        const int64_t q0 = j0 + (int64_t)(t % nq) * AROWS;
        const mf_bf16 *const Qs = QO + 2 * st * TE, *const Os = Qs + TE;
        float s[NI][4], dp[NI][4];
        mma_abt<DP, NI>(s, Ks + w0 * row_ld<DP>(), Qs, D);   // S^T: keys x queries
        mma_abt<DP, NI>(dp, Vs + w0 * row_ld<DP>(), Os, D);  // dP^T
        const head_rows sh = head_of(dq_stash, b, S, Hq, h, D);
        softmax_grad<true, NI>(s, dp, q0, j0 + w0, S, scale, none, none, lse + ((int64_t)b * Hq + h) * S,
                               sh.p, sh.ld);
        uint32_t pa[NI / 2][4];
        to_a_frags<NI>(pa, s);
        mma_pv<DP, NI / 2>(dva, pa, Os, D);  // dV += P^T dO
        to_a_frags<NI>(pa, dp);
        mma_pv<DP, NI / 2>(dka, pa, Qs, D);  // dK += dS^T Q
      });

  const int c2 = 2 * (lane & 3);
#pragma unroll
  for (int hh = 0; hh < 2; hh++) {
    const int64_t j = j0 + w0 + (lane >> 2) + 8 * hh;
    if (j >= S) continue;
    mf_bf16 *const dkr = dk + (b * S + j) * kh.ld + (int64_t)g * D, *const dvr = dv + (dkr - dk);
#pragma unroll
    for (int n = 0; n < NO; n++)
      if (8 * n + c2 < D) {
        st_bf16x2(dkr + 8 * n + c2, dka[n][2 * hh] * scale, dka[n][2 * hh + 1] * scale);
        st_bf16x2(dvr + 8 * n + c2, dva[n][2 * hh], dva[n][2 * hh + 1]);
      }
  }
}

// dq reads the Di stash of its rows (attn_stash.cuh) before the loop and
// overwrites those rows at the end; no other CTA reads or writes them.
template <int DP>
__global__ void __launch_bounds__(ANT)
    attn_dq_mma(const mf_bf16 *q, const mf_bf16 *k, const mf_bf16 *v, const mf_bf16 *dout, const float *lse,
                int64_t S, int Hq, int Hkv, int D, float scale, mf_bf16 *dq) {
  constexpr int TE = tile_elems<DP>(), NI = AROWS / 8, NO = DP / 8;
  mf_bf16 *const Qs = reinterpret_cast<mf_bf16 *>(mma_smem()), *const Os = Qs + TE, *const KV = Os + TE;
  const int64_t q0 = ((S + AROWS - 1) / AROWS - 1 - (int64_t)blockIdx.x) * AROWS;
  const int h = (int)blockIdx.y, g = h / (Hq / Hkv);
  const int64_t b = blockIdx.z;
  const head_rows qh = head_of(q, b, S, Hq, h, D), oh = head_of(dout, b, S, Hq, h, D),
                  kh = head_of(k, b, S, Hkv, g, D), vh = head_of(v, b, S, Hkv, g, D);
  mf_bf16 *const dqh = dq + (qh.p - q);
  const int lane = (int)threadIdx.x & 31, w0 = 16 * ((int)threadIdx.x >> 5);

  load_tile<DP>(qh.p, qh.ld, q0, S, D, Qs);
  load_tile<DP>(oh.p, oh.ld, q0, S, D, Os);
  float lse_row[2], di_row[2];
#pragma unroll
  for (int hh = 0; hh < 2; hh++) {
    const int64_t i = q0 + w0 + (lane >> 2) + 8 * hh;
    lse_row[hh] = i < S ? lse[((int64_t)b * Hq + h) * S + i] : 0.0f;
    di_row[hh] = i < S ? stash_get(dqh + i * qh.ld) : 0.0f;
  }
  float dqa[NO][4];
  zero(dqa);
  stream_tiles((int)(q0 / AROWS) + 1,  // key tiles 0 .. the diagonal
               [&](int t, int st) {
                 load_tile<DP>(kh.p, kh.ld, (int64_t)t * AROWS, S, D, KV + 2 * st * TE);
                 load_tile<DP>(vh.p, vh.ld, (int64_t)t * AROWS, S, D, KV + (2 * st + 1) * TE);
               },
               [&](int t, int st) {
                 const mf_bf16 *const Ks = KV + 2 * st * TE, *const Vs = Ks + TE;
                 float s[NI][4], dp[NI][4];
                 mma_abt<DP, NI>(s, Qs + w0 * row_ld<DP>(), Ks, D);
                 mma_abt<DP, NI>(dp, Os + w0 * row_ld<DP>(), Vs, D);
                 softmax_grad<false, NI>(s, dp, q0 + w0, (int64_t)t * AROWS, S, scale, lse_row, di_row,
                                         nullptr, nullptr, 0);
                 uint32_t pa[NI / 2][4];
                 to_a_frags<NI>(pa, dp);
                 mma_pv<DP, NI / 2>(dqa, pa, Ks, D);  // dQ += dS K
               });

  // Every lane of the warp has read its rows' stash (before the mma.sync of
  // the loop, which all lanes execute together).
  const int c2 = 2 * (lane & 3);
#pragma unroll
  for (int hh = 0; hh < 2; hh++) {
    const int64_t i = q0 + w0 + (lane >> 2) + 8 * hh;
    if (i >= S) continue;
    mf_bf16 *const row = dqh + i * qh.ld;
#pragma unroll
    for (int n = 0; n < NO; n++)
      if (8 * n + c2 < D) st_bf16x2(row + 8 * n + c2, dqa[n][2 * hh] * scale, dqa[n][2 * hh + 1] * scale);
  }
}

// ------------------------------------------------------------- launch

bool aligned16(const void *p) {
  return ((uintptr_t)p & 15) == 0;
}

// Whether the tensor-core path takes head dim D with these operands.
bool mma_fits(int64_t D, const void *const *ptrs, int n) {
  if (D <= 0 || D % 16 || D > ADMAX) return false;
  for (int x = 0; x < n; x++)
    if (!aligned16(ptrs[x])) return false;
  return true;
}

#ifndef MF_MMA_EMULATE
template <typename F>
mf_status allow_smem(F *f, size_t bytes) {
  MF_CUDA_CHECK(
      cudaFuncSetAttribute((const void *)f, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
  return MF_OK;
}

template <int DP>
mf_status fwd_launch(const mf_bf16 *q, const mf_bf16 *k, const mf_bf16 *v, int64_t B, int64_t S, int64_t Hq,
                     int64_t Hkv, int64_t D, float scale, mf_bf16 *o, float *lse, cudaStream_t s) {
  constexpr size_t smem = fwd_smem<DP>();
  MF_CHECK(allow_smem(attn_fwd_mma<DP>, smem));
  const dim3 grid((unsigned)((S + AROWS - 1) / AROWS), (unsigned)Hq, (unsigned)B);
  attn_fwd_mma<DP><<<grid, ANT, smem, s>>>(q, k, v, S, (int)Hq, (int)Hkv, (int)D, scale, o, lse);
  MF_CUDA_CHECK_LAUNCH();
  return MF_OK;
}

template <int DP>
mf_status bwd_launch(const mf_bf16 *q, const mf_bf16 *k, const mf_bf16 *v, const mf_bf16 *dout,
                     const float *lse, int64_t B, int64_t S, int64_t Hq, int64_t Hkv, int64_t D, float scale,
                     mf_bf16 *dq, mf_bf16 *dk, mf_bf16 *dv, cudaStream_t s) {
  constexpr size_t smem = bwd_smem<DP>();
  const unsigned blocks = (unsigned)((S + AROWS - 1) / AROWS);
  MF_CHECK(allow_smem(attn_dkdv_mma<DP>, smem));
  attn_dkdv_mma<DP><<<dim3(blocks, (unsigned)Hkv, (unsigned)B), ANT, smem, s>>>(
      q, k, v, dout, lse, dq, S, (int)Hq, (int)Hkv, (int)D, scale, dk, dv);
  MF_CUDA_CHECK_LAUNCH();
  MF_CHECK(allow_smem(attn_dq_mma<DP>, smem));
  attn_dq_mma<DP><<<dim3(blocks, (unsigned)Hq, (unsigned)B), ANT, smem, s>>>(q, k, v, dout, lse, S, (int)Hq,
                                                                             (int)Hkv, (int)D, scale, dq);
  MF_CUDA_CHECK_LAUNCH();
  return MF_OK;
}
#endif  // MF_MMA_EMULATE

}  // namespace

#ifndef MF_MMA_EMULATE
mf_status mf_cuda_attn_mma_fwd(const mf_bf16 *q, const mf_bf16 *k, const mf_bf16 *v, int64_t B, int64_t S,
                               int64_t Hq, int64_t Hkv, int64_t D, float scale, mf_bf16 *o, float *lse,
                               int *ran, cudaStream_t s) {
  *ran = 0;
  const void *ptrs[] = {q, k, v, o};
  if (!mma_fits(D, ptrs, 4)) return MF_OK;
  if (B > 0 && S > 0) {
    if (D <= 64)
      MF_CHECK(fwd_launch<64>(q, k, v, B, S, Hq, Hkv, D, scale, o, lse, s));
    else
      MF_CHECK(fwd_launch<128>(q, k, v, B, S, Hq, Hkv, D, scale, o, lse, s));
  }
  *ran = 1;
  return MF_OK;
}
#endif  // MF_MMA_EMULATE

#ifndef MF_MMA_EMULATE
mf_status mf_cuda_attn_mma_bwd(const mf_bf16 *q, const mf_bf16 *k, const mf_bf16 *v, const mf_bf16 *dout,
                               const float *lse, int64_t B, int64_t S, int64_t Hq, int64_t Hkv, int64_t D,
                               float scale, mf_bf16 *dq, mf_bf16 *dk, mf_bf16 *dv, int *ran, cudaStream_t s) {
  *ran = 0;
  const void *ptrs[] = {q, k, v, dout, dq, dk, dv};
  if (!mma_fits(D, ptrs, 7)) return MF_OK;
  if (B > 0 && S > 0) {
    if (D <= 64)
      MF_CHECK(bwd_launch<64>(q, k, v, dout, lse, B, S, Hq, Hkv, D, scale, dq, dk, dv, s));
    else
      MF_CHECK(bwd_launch<128>(q, k, v, dout, lse, B, S, Hq, Hkv, D, scale, dq, dk, dv, s));
  }
  *ran = 1;
  return MF_OK;
}
#endif  // MF_MMA_EMULATE
