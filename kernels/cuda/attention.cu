// Causal GQA attention of the cuda backend, flash style: fp32 math over fp32 or
// bf16 storage (T, ops.cuh), the semantics of the cpu twin (kernels/cpu/
// attention.c).
//
// Storage: q, k, v, o, do, dq, dk, dv are T; lse is fp32. A T value is widened
// to fp32 as its tile is loaded into shared memory (the tiles are fp32), and
// each stored output is rounded once (mf_st): a bf16 call is the cpu twin with
// round_bf16 up to the order of fp32 sums. The float instantiation is the fp32
// kernel bit for bit. BF16 calls go to the tensor-core kernels of
// attention_mma.cu where they take the shape (D a multiple of 16, at most 128,
// operands 16-byte aligned); these kernels run the rest and all fp32 calls.
//
// Maths (sequence b, query head h, kv head g = h / (Hq/Hkv), head dim D of q
// and k, Dv of v: equal in most models, 192 and 128 in DeepSeek-V3's latent
// attention; key j visible from query i when j <= i, and with a sliding window
// W > 0 also j > i - W; sink[h] gpt-oss's learned logit, -inf without):
//   s[i,j] = (q[i].k[j]) * scale          (dot first, then the scale, as the cpu)
//   p[i,j] = exp(s[i,j] - lse[i]),  lse[i] = log (sum_{j visible} exp(s[i,j]) + exp(sink[h]))
//   o[i]   = sum_{j visible} p[i,j] v[j]
// Backward, with Di = do[i].o[i]:  dp = do.v,  ds = p * (dp - Di)
//   dq[i] = scale * sum_j ds[i,j] k[j]
//   dk[j] = scale * sum_{h in group} sum_i ds[i,j] q[i]
//   dv[j] =         sum_{h in group} sum_i p[i,j] do[i]
//   dsink[h] += -sum_{b,i} exp(sink[h] - lse[i]) Di
// dq, dk, dv are written (not added), as the cpu twin does; dsinks is added into.
//
// Shapes: q, dq [B*S, Hq, D]; o, do [B*S, Hq, Dv]; k, dk [B*S, Hkv, D]; v, dv
// [B*S, Hkv, Dv] (token-major, heads inside a token's row); lse [B, Hq, S];
// sinks [Hq] (T), dsinks [Hq] (fp32). Dv 0 means D. Calls with Dv != D, a
// window or sinks never take the tensor-core kernels (attention_mma.cu has one
// head dim and neither mask nor sink); they run here. A window at or past S
// hides nothing and is no window.
//
// Sinks and windows. A row's online softmax starts at m = sink, l = 1 (the
// sink's term) instead of -inf and 0; a window masks j <= i - W as the causal
// mask masks j > i, and the loops start and end at the tiles it reaches (the
// forward's and dq's key tiles from that of the block's first visible key, dk/dv's
// query blocks up to that of the last row that sees the key block).
//
// Tiling. Every kernel is a block of NT = 128 threads working on BQ = 32 query
// rows and BK = 32 keys at a time, with the larger of D and Dv padded to DP
// (64, 128 or 256: the template; every tile is DP wide, q and k tiles hold D
// columns, v and do tiles Dv, and the padding columns are loaded as zeros, so
// they add nothing to a dot).
// Tiles live in dynamic shared memory with rows of DP + 1 floats (no bank
// conflicts between rows). Four threads share a tile row (lanes 4r..4r+3 of one
// warp): a thread computes 8 of its 32 scores (columns t%4 + 4m) and owns the
// output columns d = t%4 + 4m of that row in registers. Row max and row sum are
// xor-shuffles over those four lanes, which give every lane the same bits.
// No S x S matrix exists: scores live one BQ x BK tile at a time.
//
//   forward   grid (query blocks, Hq, B), heaviest (last) query block first. Per
//             key tile up to the diagonal: scores, online softmax (running max m
//             and sum l per row, accumulator rescaled by exp(m_old - m_new)),
//             o += p v. Then o = acc / l, lse = m + log l.
//   backward  three launches on the stream, none with atomics:
//             1. Di = do.o per (token, head) over Dv, one warp each (a fixed xor tree),
//                stashed exactly in the row dq[token, head, :] (fp32: element 0;
//                bf16: its 32 bits in elements 0 and 1, so D >= 2 there) — dq is
//                written only by launch 3, whose block reads the stash of
//                exactly the rows it later writes.
//             2. dk, dv: grid (key blocks, Hkv, B). A block holds its K and V tile
//                and loops over the group's query heads in order, and for each
//                over the query blocks from the diagonal to the end in order,
//                recomputing p from q, k and lse; dk and dv accumulate in
//                registers in that fixed order.
//             3. dq: grid (query blocks, Hq, B). A block holds its q and do tile
//                and loops over key tiles up to the diagonal in order.
//             With sinks and dsinks, one more launch first: grid Hq, a thread
//             sums a fixed stride of the (b, i) rows in double, then a fixed
//             tree; no atomics, the same bits every run.
//
// Shared memory (bytes) at DP = 128 / 256: forward 53 760 / 102 912, dk/dv
// 74 752 / 140 288, dq 70 528 / 136 064: above 48 KiB, so each launch opts in
// (cudaFuncAttributeMaxDynamicSharedMemorySize); sm_80 allows 163 KiB per block.
// D or Dv > 256 is refused with MF_ERR_UNSUPPORTED, and so is D = 1 with bf16
// storage (no room for the stash).
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "kernels/cuda/attn_stash.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/ops.cuh"

namespace {

constexpr int NT = 128;        // threads per block
constexpr int BQ = 32;         // query rows per tile
constexpr int BK = 32;         // keys per tile
constexpr int TPR = NT / BQ;   // threads per tile row (4)
constexpr int CPT = BK / TPR;  // scores per thread (8)
constexpr int DMAX = 256;
static_assert(BQ == BK, "the thread mapping uses one row count for both tiles");
static_assert(TPR == 4, "row reductions are two xor shuffles");

// Floats of one [rows][DP + 1] tile.
template <int DP>
__host__ __device__ constexpr int tile_floats(int rows) {
  return rows * (DP + 1);
}
template <int DP>
constexpr size_t fwd_smem() {
  return sizeof(float) * (size_t)(3 * tile_floats<DP>(BQ) + BQ * (BK + 1));
}
template <int DP>
constexpr size_t dkdv_smem() {
  return sizeof(float) * (size_t)(4 * tile_floats<DP>(BQ) + 2 * BK * (BQ + 1) + 2 * BQ);
}
template <int DP>
constexpr size_t dq_smem() {
  return sizeof(float) * (size_t)(4 * tile_floats<DP>(BQ) + BQ * (BK + 1) + 2 * BQ);
}
// sm_80's largest opt-in shared memory per block (163 KiB) bounds the largest tile.
static_assert(fwd_smem<DMAX>() <= 166912 && dkdv_smem<DMAX>() <= 166912 && dq_smem<DMAX>() <= 166912,
              "attention tiles at D = 256 exceed sm_80's shared memory per block");

// Loads rows [r0, r0 + BQ) of one head (row r at src + r*ld) into t[BQ][DP+1],
// widened to fp32; rows at or past `rows` and columns at or past D are zeros.
template <int DP, typename T>
__device__ __forceinline__ void load_tile(const T *__restrict__ src, int64_t ld, int64_t r0, int64_t rows,
                                          int D, float *__restrict__ t) {
  for (int x = threadIdx.x; x < BQ * DP; x += NT) {
    const int r = x / DP, d = x % DP;
    const int64_t gr = r0 + r;
    t[r * (DP + 1) + d] = (gr < rows && d < D) ? mf_ld(src + gr * ld + d) : 0.0f;
  }
}

__device__ __forceinline__ float row_max4(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
__device__ __forceinline__ float row_sum4(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

// Whether query i (< S) sees key j: causal, and within the window W (0: none).
__device__ __forceinline__ bool visible(int64_t i, int64_t j, int64_t S, int64_t W) {
  return i < S && j <= i && (W == 0 || i - j < W);
}

// The first key tile a query block from q0 reaches (0 without a window).
__device__ __forceinline__ int64_t first_key_tile(int64_t q0, int64_t W) {
  return W > 0 && q0 - W + 1 > 0 ? (q0 - W + 1) / BK * BK : 0;
}

// ---------------------------------------------------------------- forward

template <typename T, int DP>
__global__ void __launch_bounds__(NT)
    attn_fwd_kernel(const T *__restrict__ q, const T *__restrict__ k, const T *__restrict__ v, int64_t S,
                    int Hq, int Hkv, int D, int Dv, int64_t W, const T *__restrict__ sinks, float scale,
                    T *__restrict__ o, float *__restrict__ lse) {
  constexpr int NC = DP / TPR;  // output columns per thread
  extern __shared__ float smem[];
  float *Qs = smem, *Ks = Qs + tile_floats<DP>(BQ), *Vs = Ks + tile_floats<DP>(BK);
  float *Ps = Vs + tile_floats<DP>(BK);  // [BQ][BK+1]

  const int64_t nqb = (S + BQ - 1) / BQ;
  const int64_t q0 = (nqb - 1 - (int64_t)blockIdx.x) * BQ;
  const int h = blockIdx.y, g = h / (Hq / Hkv);
  const int64_t b = blockIdx.z;
  const int64_t ldq = (int64_t)Hq * D, ldk = (int64_t)Hkv * D, ldo = (int64_t)Hq * Dv,
                ldv = (int64_t)Hkv * Dv;
  const T *qh = q + b * S * ldq + (int64_t)h * D;
  const T *kh = k + b * S * ldk + (int64_t)g * D;
  const T *vh = v + b * S * ldv + (int64_t)g * Dv;

  const int t = threadIdx.x, r = t / TPR, lane4 = t % TPR;
  const int64_t i = q0 + r;  // this thread's query row
  float acc[NC];
#pragma unroll
  for (int n = 0; n < NC; n++) acc[n] = 0.0f;
  float m = -INFINITY, l = 0.0f;
  if (sinks) m = mf_ld(sinks + h), l = 1.0f;  // the sink's term: exp(sink - sink)

  load_tile<DP>(qh, ldq, q0, S, D, Qs);
  const int64_t kend = q0 + BQ < S ? q0 + BQ : S;  // keys past the block's last row are masked for all
  for (int64_t j0 = first_key_tile(q0, W); j0 < kend; j0 += BK) {
    __syncthreads();  // the previous tile's Ks, Vs, Ps are no longer read
    load_tile<DP>(kh, ldk, j0, S, D, Ks);
    load_tile<DP>(vh, ldv, j0, S, Dv, Vs);
    __syncthreads();
    float s[CPT];
#pragma unroll
    for (int c = 0; c < CPT; c++) s[c] = 0.0f;
    const float *qr = Qs + r * (DP + 1);
#pragma unroll 4
    for (int d = 0; d < DP; d++) {
      const float qd = qr[d];
#pragma unroll
      for (int c = 0; c < CPT; c++) s[c] += qd * Ks[(lane4 + TPR * c) * (DP + 1) + d];
    }
    float tmax = -INFINITY;
#pragma unroll
    for (int c = 0; c < CPT; c++) {
      const int64_t j = j0 + lane4 + TPR * c;
      s[c] = visible(i, j, S, W) ? s[c] * scale : -INFINITY;
      tmax = fmaxf(tmax, s[c]);
    }
    tmax = row_max4(tmax);
    const float mnew = fmaxf(m, tmax);
    // A row with no key yet (mnew = -inf: padding rows, or keys all masked so far) stays empty.
    const float alpha = mnew == -INFINITY ? 1.0f : expf(m - mnew);
    float psum = 0.0f;
#pragma unroll
    for (int c = 0; c < CPT; c++) {
      const float p = mnew == -INFINITY ? 0.0f : expf(s[c] - mnew);
      Ps[r * (BK + 1) + lane4 + TPR * c] = p;
      psum += p;
    }
    l = l * alpha + row_sum4(psum);
    m = mnew;
#pragma unroll
    for (int n = 0; n < NC; n++) acc[n] *= alpha;
    __syncwarp();  // Ps row r is written and read by the four lanes of one warp
    const float *pr = Ps + r * (BK + 1);
#pragma unroll 4
    for (int c = 0; c < BK; c++) {
      const float p = pr[c];
      const float *vr = Vs + c * (DP + 1) + lane4;
#pragma unroll
      for (int n = 0; n < NC; n++) acc[n] += p * vr[TPR * n];
    }
  }
  if (i < S) {
    const float inv = 1.0f / l;
    T *orow = o + (b * S + i) * ldo + (int64_t)h * Dv;
#pragma unroll
    for (int n = 0; n < NC; n++) {
      const int d = lane4 + TPR * n;
      if (d < Dv) mf_st(orow + d, acc[n] * inv);
    }
    if (lane4 == 0) lse[((int64_t)b * Hq + h) * S + i] = m + logf(l);
  }
}

// --------------------------------------------------------------- backward

// Di = do[row].o[row] (rows of Dv) for every (token, query head), stashed in
// dq[token, head, :] (rows of D).
template <typename T>
__global__ void attn_bwd_di_kernel(const T *__restrict__ o, const T *__restrict__ dout, int64_t n_rows, int D,
                                   int Dv, T *__restrict__ dq) {
  const int lane = threadIdx.x % 32;
  const int64_t warps = (int64_t)gridDim.x * (NT / 32);
  for (int64_t w = (int64_t)blockIdx.x * (NT / 32) + threadIdx.x / 32; w < n_rows; w += warps) {
    const T *orow = o + w * Dv, *drow = dout + w * Dv;
    float acc = 0.0f;
    for (int d = lane; d < Dv; d += 32) acc += mf_ld(orow + d) * mf_ld(drow + d);
#pragma unroll
    for (int x = 16; x > 0; x >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, x);
    if (lane == 0) stash_put(dq + w * D, acc);
  }
}

// Loads lse and Di (from the stash in dq) of rows [q0, q0 + BQ) of head h; 0 past S.
template <typename T>
__device__ __forceinline__ void load_row_stats(const float *__restrict__ lse_h, const T *dq_h, int64_t ldq,
                                               int64_t q0, int64_t S, float *__restrict__ Ls,
                                               float *__restrict__ Ds) {
  for (int x = threadIdx.x; x < BQ; x += NT) {
    const int64_t i = q0 + x;
    Ls[x] = i < S ? lse_h[i] : 0.0f;
    Ds[x] = i < S ? stash_get(dq_h + i * ldq) : 0.0f;
  }
}

template <typename T, int DP>
__global__ void __launch_bounds__(NT)
    attn_bwd_dkdv_kernel(const T *__restrict__ q, const T *__restrict__ k, const T *__restrict__ v,
                         const T *__restrict__ dout, const float *__restrict__ lse, const T *dq_stash,
                         int64_t S, int Hq, int Hkv, int D, int Dv, int64_t W, float scale,
                         T *__restrict__ dk, T *__restrict__ dv) {
  constexpr int NC = DP / TPR;
  extern __shared__ float smem[];
  float *Ks = smem, *Vs = Ks + tile_floats<DP>(BK), *Qs = Vs + tile_floats<DP>(BK);
  float *Os = Qs + tile_floats<DP>(BQ);  // do tile
  float *Ps = Os + tile_floats<DP>(BQ);  // [BK][BQ+1]: p transposed (key-major)
  float *Ss = Ps + BK * (BQ + 1);        // [BK][BQ+1]: ds transposed
  float *Ls = Ss + BK * (BQ + 1), *Ds = Ls + BQ;

  const int64_t j0 = (int64_t)blockIdx.x * BK;
  const int g = blockIdx.y, G = Hq / Hkv;
  const int64_t b = blockIdx.z;
  const int64_t ldq = (int64_t)Hq * D, ldk = (int64_t)Hkv * D, ldo = (int64_t)Hq * Dv,
                ldv = (int64_t)Hkv * Dv;
  const int t = threadIdx.x, c = t / TPR, lane4 = t % TPR;  // c: this thread's key row in the tile
  const int64_t j = j0 + c;

  load_tile<DP>(k + b * S * ldk + (int64_t)g * D, ldk, j0, S, D, Ks);
  load_tile<DP>(v + b * S * ldv + (int64_t)g * Dv, ldv, j0, S, Dv, Vs);
  float dka[NC], dva[NC];
#pragma unroll
  for (int n = 0; n < NC; n++) dka[n] = dva[n] = 0.0f;

  const int64_t qstart = j0 / BQ * BQ;  // the first query block with a row >= j0
  // past the last row that sees the tile's last key j0 + BK - 1 (a window's end)
  const int64_t qend = W > 0 && j0 + BK - 1 + W < S ? j0 + BK - 1 + W : S;
  for (int h = g * G; h < (g + 1) * G; h++) {
    const int64_t qoff = b * S * ldq + (int64_t)h * D, ooff = b * S * ldo + (int64_t)h * Dv;
    const float *lse_h = lse + ((int64_t)b * Hq + h) * S;
    for (int64_t q0 = qstart; q0 < qend; q0 += BQ) {
      __syncthreads();  // the previous query tile is no longer read
      load_tile<DP>(q + qoff, ldq, q0, S, D, Qs);
      load_tile<DP>(dout + ooff, ldo, q0, S, Dv, Os);
      load_row_stats(lse_h, dq_stash + qoff, ldq, q0, S, Ls, Ds);
      __syncthreads();
      float s[CPT], dp[CPT];
#pragma unroll
      for (int x = 0; x < CPT; x++) s[x] = dp[x] = 0.0f;
      const float *kr = Ks + c * (DP + 1), *vr = Vs + c * (DP + 1);
#pragma unroll 2
      for (int d = 0; d < DP; d++) {
        const float kd = kr[d], vd = vr[d];
#pragma unroll
        for (int x = 0; x < CPT; x++) {
          const int ii = lane4 + TPR * x;
          s[x] += kd * Qs[ii * (DP + 1) + d];
          dp[x] += vd * Os[ii * (DP + 1) + d];
        }
      }
#pragma unroll
      for (int x = 0; x < CPT; x++) {
        const int ii = lane4 + TPR * x;
        const int64_t i = q0 + ii;
        const float p = visible(i, j, S, W) ? expf(s[x] * scale - Ls[ii]) : 0.0f;
        Ps[c * (BQ + 1) + ii] = p;
        Ss[c * (BQ + 1) + ii] = p * (dp[x] - Ds[ii]);
      }
      __syncwarp();  // Ps, Ss row c belongs to the four lanes of one warp
      const float *pr = Ps + c * (BQ + 1), *sr = Ss + c * (BQ + 1);
#pragma unroll 4
      for (int ii = 0; ii < BQ; ii++) {
        const float p = pr[ii], ds = sr[ii];
        const float *orow = Os + ii * (DP + 1) + lane4, *qrow = Qs + ii * (DP + 1) + lane4;
#pragma unroll
        for (int n = 0; n < NC; n++) {
          dva[n] += p * orow[TPR * n];
          dka[n] += ds * qrow[TPR * n];
        }
      }
    }
  }
  if (j < S) {
    T *dkr = dk + (b * S + j) * ldk + (int64_t)g * D, *dvr = dv + (b * S + j) * ldv + (int64_t)g * Dv;
#pragma unroll
    for (int n = 0; n < NC; n++) {
      const int d = lane4 + TPR * n;
      if (d < D) mf_st(dkr + d, dka[n] * scale);
      if (d < Dv) mf_st(dvr + d, dva[n]);
    }
  }
}

template <typename T, int DP>
__global__ void __launch_bounds__(NT)
    attn_bwd_dq_kernel(const T *__restrict__ q, const T *__restrict__ k, const T *__restrict__ v,
                       const T *__restrict__ dout, const float *__restrict__ lse, int64_t S, int Hq, int Hkv,
                       int D, int Dv, int64_t W, float scale, T *dq) {
  constexpr int NC = DP / TPR;
  extern __shared__ float smem[];
  float *Qs = smem, *Os = Qs + tile_floats<DP>(BQ), *Ks = Os + tile_floats<DP>(BQ);
  float *Vs = Ks + tile_floats<DP>(BK);
  float *Ss = Vs + tile_floats<DP>(BK);  // [BQ][BK+1]: ds
  float *Ls = Ss + BQ * (BK + 1), *Ds = Ls + BQ;

  const int64_t nqb = (S + BQ - 1) / BQ;
  const int64_t q0 = (nqb - 1 - (int64_t)blockIdx.x) * BQ;
  const int h = blockIdx.y, g = h / (Hq / Hkv);
  const int64_t b = blockIdx.z;
  const int64_t ldq = (int64_t)Hq * D, ldk = (int64_t)Hkv * D, ldo = (int64_t)Hq * Dv,
                ldv = (int64_t)Hkv * Dv;
  const int64_t qoff = b * S * ldq + (int64_t)h * D, ooff = b * S * ldo + (int64_t)h * Dv;
  const T *kh = k + b * S * ldk + (int64_t)g * D, *vh = v + b * S * ldv + (int64_t)g * Dv;
  const int t = threadIdx.x, r = t / TPR, lane4 = t % TPR;
  const int64_t i = q0 + r;

  load_tile<DP>(q + qoff, ldq, q0, S, D, Qs);
  load_tile<DP>(dout + ooff, ldo, q0, S, Dv, Os);
  load_row_stats(lse + ((int64_t)b * Hq + h) * S, dq + qoff, ldq, q0, S, Ls, Ds);
  float acc[NC];
#pragma unroll
  for (int n = 0; n < NC; n++) acc[n] = 0.0f;

  const int64_t kend = q0 + BQ < S ? q0 + BQ : S;
  for (int64_t j0 = first_key_tile(q0, W); j0 < kend; j0 += BK) {
    __syncthreads();  // the previous key tile is no longer read (and the stats are loaded)
    load_tile<DP>(kh, ldk, j0, S, D, Ks);
    load_tile<DP>(vh, ldv, j0, S, Dv, Vs);
    __syncthreads();
    float s[CPT], dp[CPT];
#pragma unroll
    for (int x = 0; x < CPT; x++) s[x] = dp[x] = 0.0f;
    const float *qr = Qs + r * (DP + 1), *dor = Os + r * (DP + 1);
#pragma unroll 2
    for (int d = 0; d < DP; d++) {
      const float qd = qr[d], dd = dor[d];
#pragma unroll
      for (int x = 0; x < CPT; x++) {
        const int cc = lane4 + TPR * x;
        s[x] += qd * Ks[cc * (DP + 1) + d];
        dp[x] += dd * Vs[cc * (DP + 1) + d];
      }
    }
    const float lse_i = Ls[r], di = Ds[r];
#pragma unroll
    for (int x = 0; x < CPT; x++) {
      const int cc = lane4 + TPR * x;
      const int64_t j = j0 + cc;
      const float p = visible(i, j, S, W) ? expf(s[x] * scale - lse_i) : 0.0f;
      Ss[r * (BK + 1) + cc] = p * (dp[x] - di);
    }
    __syncwarp();  // Ss row r belongs to the four lanes of one warp
    const float *sr = Ss + r * (BK + 1);
#pragma unroll 4
    for (int cc = 0; cc < BK; cc++) {
      const float ds = sr[cc];
      const float *kr = Ks + cc * (DP + 1) + lane4;
#pragma unroll
      for (int n = 0; n < NC; n++) acc[n] += ds * kr[TPR * n];
    }
  }
  // The stash of these rows was read into Ds before the loop, and no other block
  // reads or writes them: overwriting it here is safe.
  if (i < S) {
    T *dqr = dq + qoff + i * ldq;
#pragma unroll
    for (int n = 0; n < NC; n++) {
      const int d = lane4 + TPR * n;
      if (d < D) mf_st(dqr + d, acc[n] * scale);
    }
  }
}

// dsinks[h] += -sum_{b,i} exp(sinks[h] - lse[b,h,i]) Di, Di = do.o over Dv:
// block h; thread t sums rows t, t + NT, ... of the B*S (b, i) in double, then
// a fixed tree over the threads.
template <typename T>
__global__ void __launch_bounds__(NT)
    attn_bwd_dsinks_kernel(const T *__restrict__ o, const T *__restrict__ dout, const float *__restrict__ lse,
                           const T *__restrict__ sinks, int64_t B, int64_t S, int Hq, int Dv,
                           float *__restrict__ dsinks) {
  __shared__ double part[NT];
  const int h = blockIdx.x;
  const double sink = (double)mf_ld(sinks + h);
  double acc = 0.0;
  for (int64_t r = threadIdx.x; r < B * S; r += NT) {  // r: the token b*S + i
    const T *orow = o + (r * Hq + h) * Dv, *drow = dout + (r * Hq + h) * Dv;
    float di = 0.0f;
    for (int d = 0; d < Dv; d++) di += mf_ld(drow + d) * mf_ld(orow + d);
    acc += exp(sink - (double)lse[(r / S * Hq + h) * S + r % S]) * (double)di;
  }
  part[threadIdx.x] = acc;
  __syncthreads();
  for (int w = NT / 2; w > 0; w >>= 1) {
    if (threadIdx.x < w) part[threadIdx.x] += part[threadIdx.x + w];
    __syncthreads();
  }
  if (threadIdx.x == 0) dsinks[h] += (float)-part[0];
}

// Dv: already resolved (0 -> D) by the caller.
mf_status check_shape(const char *op, int64_t B, int64_t S, int64_t Hq, int64_t Hkv, int64_t D, int64_t Dv,
                      int64_t window) {
  if (B < 0 || S < 0 || Hq <= 0 || Hkv <= 0 || D <= 0 || Dv <= 0 || Hq % Hkv != 0)
    return MF_ERR(MF_ERR_INVALID_ARG, "%s: bad shape B=%lld S=%lld Hq=%lld Hkv=%lld D=%lld Dv=%lld", op,
                  (long long)B, (long long)S, (long long)Hq, (long long)Hkv, (long long)D, (long long)Dv);
  if (window < 0)
    return MF_ERR(MF_ERR_INVALID_ARG, "%s: sliding window %lld (0: none, else the keys a query sees)", op,
                  (long long)window);
  if (D > DMAX)
    return MF_ERR(MF_ERR_UNSUPPORTED,
                  "%s: head_dim D=%lld is larger than the cuda kernel's tile (at most %d)", op, (long long)D,
                  DMAX);
  if (Dv > DMAX)
    return MF_ERR(MF_ERR_UNSUPPORTED,
                  "%s: value head_dim Dv=%lld is larger than the cuda kernel's tile (at most %d)", op,
                  (long long)Dv, DMAX);
  if (B > 65535 || Hq > 65535 || (S + BQ - 1) / BQ > INT32_MAX)
    return MF_ERR(MF_ERR_UNSUPPORTED, "%s: B=%lld, Hq=%lld or S=%lld exceeds the cuda grid", op, (long long)B,
                  (long long)Hq, (long long)S);
  return MF_OK;
}

// Lets kernel f use `bytes` of dynamic shared memory (above the 48 KiB default).
template <typename F>
mf_status allow_smem(F *f, size_t bytes) {
  MF_CUDA_CHECK(
      cudaFuncSetAttribute((const void *)f, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
  return MF_OK;
}

template <typename T, int DP>
mf_status fwd_launch(const T *q, const T *k, const T *v, int64_t B, int64_t S, int64_t Hq, int64_t Hkv,
                     int64_t D, int64_t Dv, int64_t W, const T *sinks, float scale, T *o, float *lse,
                     cudaStream_t s) {
  const size_t smem = fwd_smem<DP>();
  MF_CHECK(allow_smem(attn_fwd_kernel<T, DP>, smem));
  const dim3 grid((unsigned)((S + BQ - 1) / BQ), (unsigned)Hq, (unsigned)B);
  attn_fwd_kernel<T, DP>
      <<<grid, NT, smem, s>>>(q, k, v, S, (int)Hq, (int)Hkv, (int)D, (int)Dv, W, sinks, scale, o, lse);
  MF_CUDA_CHECK_LAUNCH();
  return MF_OK;
}

// Launch 1: the Di stash in dq.
template <typename T>
mf_status di_launch(const T *o, const T *dout, int64_t B, int64_t S, int64_t Hq, int64_t D, int64_t Dv, T *dq,
                    cudaStream_t s) {
  const int64_t rows = B * S * Hq;
  int64_t di_blocks = (rows + NT / 32 - 1) / (NT / 32);
  if (di_blocks > (1 << 20)) di_blocks = 1 << 20;
  attn_bwd_di_kernel<T><<<(unsigned)di_blocks, NT, 0, s>>>(o, dout, rows, (int)D, (int)Dv, dq);
  MF_CUDA_CHECK_LAUNCH();
  return MF_OK;
}

// Launches 2 and 3 (dk, dv; dq) on the CUDA cores.
template <typename T, int DP>
mf_status bwd_launch(const T *q, const T *k, const T *v, const float *lse, const T *dout, int64_t B,
                     int64_t S, int64_t Hq, int64_t Hkv, int64_t D, int64_t Dv, int64_t W, float scale, T *dq,
                     T *dk, T *dv, cudaStream_t s) {
  const size_t smem_kv = dkdv_smem<DP>();
  MF_CHECK(allow_smem(attn_bwd_dkdv_kernel<T, DP>, smem_kv));
  const dim3 grid_kv((unsigned)((S + BK - 1) / BK), (unsigned)Hkv, (unsigned)B);
  attn_bwd_dkdv_kernel<T, DP><<<grid_kv, NT, smem_kv, s>>>(q, k, v, dout, lse, dq, S, (int)Hq, (int)Hkv,
                                                           (int)D, (int)Dv, W, scale, dk, dv);
  MF_CUDA_CHECK_LAUNCH();

  const size_t smem_q = dq_smem<DP>();
  MF_CHECK(allow_smem(attn_bwd_dq_kernel<T, DP>, smem_q));
  const dim3 grid_q((unsigned)((S + BQ - 1) / BQ), (unsigned)Hq, (unsigned)B);
  attn_bwd_dq_kernel<T, DP>
      <<<grid_q, NT, smem_q, s>>>(q, k, v, dout, lse, S, (int)Hq, (int)Hkv, (int)D, (int)Dv, W, scale, dq);
  MF_CUDA_CHECK_LAUNCH();
  return MF_OK;
}

}  // namespace

template <typename T>
mf_status mf_cuda_attn_fwd(const T *q, const T *k, const T *v, int64_t B, int64_t S, int64_t Hq, int64_t Hkv,
                           int64_t D, int64_t Dv, int64_t window, const T *sinks, float scale, T *o,
                           float *lse, cudaStream_t s) {
  if (Dv == 0) Dv = D;
  MF_CHECK(check_shape("attn_fwd", B, S, Hq, Hkv, D, Dv, window));
  if (B == 0 || S == 0) return MF_OK;
  if (window >= S) window = 0;  // hides no key
  // bf16: the tensor-core kernel when it takes the call; it has one head dim,
  // no window and no sink, so other calls stay on the kernels of this file.
  if constexpr (sizeof(T) < sizeof(float)) {
    int ran = 0;
    if (Dv == D && window == 0 && !sinks)
      MF_CHECK(mf_cuda_attn_mma_fwd(q, k, v, B, S, Hq, Hkv, D, scale, o, lse, &ran, s));
    if (ran) {
      mf_cuda_mma_count(MF_CUDA_MMA_ATTENTION);
      return MF_OK;
    }
  }
  const int64_t Dm = D > Dv ? D : Dv;  // the tiles' width
  if (Dm <= 64) return fwd_launch<T, 64>(q, k, v, B, S, Hq, Hkv, D, Dv, window, sinks, scale, o, lse, s);
  if (Dm <= 128) return fwd_launch<T, 128>(q, k, v, B, S, Hq, Hkv, D, Dv, window, sinks, scale, o, lse, s);
  return fwd_launch<T, 256>(q, k, v, B, S, Hq, Hkv, D, Dv, window, sinks, scale, o, lse, s);
}

template <typename T>
mf_status mf_cuda_attn_bwd(const T *q, const T *k, const T *v, const T *o, const T *dout, const float *lse,
                           int64_t B, int64_t S, int64_t Hq, int64_t Hkv, int64_t D, int64_t Dv,
                           int64_t window, const T *sinks, float scale, T *dq, T *dk, T *dv, float *dsinks,
                           cudaStream_t s) {
  if (Dv == 0) Dv = D;
  MF_CHECK(check_shape("attn_bwd", B, S, Hq, Hkv, D, Dv, window));
  if (sizeof(T) < sizeof(float) && D < 2)
    return MF_ERR(
        MF_ERR_UNSUPPORTED,
        "attn_bwd: head_dim D=%lld with bf16 storage: a row of dq must hold the fp32 Di stash (D >= 2)",
        (long long)D);
  if (B == 0 || S == 0) return MF_OK;
  if (window >= S) window = 0;
  if (sinks && dsinks) {
    attn_bwd_dsinks_kernel<T>
        <<<(unsigned)Hq, NT, 0, s>>>(o, dout, lse, sinks, B, S, (int)Hq, (int)Dv, dsinks);
    MF_CUDA_CHECK_LAUNCH();
  }
  MF_CHECK(di_launch(o, dout, B, S, Hq, D, Dv, dq, s));
  // bf16: the tensor-core kernels when they take the call (as the forward: Dv = D, no window, no sink)
  if constexpr (sizeof(T) < sizeof(float)) {
    int ran = 0;
    if (Dv == D && window == 0 && !sinks)
      MF_CHECK(mf_cuda_attn_mma_bwd(q, k, v, dout, lse, B, S, Hq, Hkv, D, scale, dq, dk, dv, &ran, s));
    if (ran) {
      mf_cuda_mma_count(MF_CUDA_MMA_ATTENTION);
      return MF_OK;
    }
  }
  const int64_t Dm = D > Dv ? D : Dv;
  if (Dm <= 64)
    return bwd_launch<T, 64>(q, k, v, lse, dout, B, S, Hq, Hkv, D, Dv, window, scale, dq, dk, dv, s);
  if (Dm <= 128)
    return bwd_launch<T, 128>(q, k, v, lse, dout, B, S, Hq, Hkv, D, Dv, window, scale, dq, dk, dv, s);
  return bwd_launch<T, 256>(q, k, v, lse, dout, B, S, Hq, Hkv, D, Dv, window, scale, dq, dk, dv, s);
}

// Both storages.
#define ATTENTION_INSTANTIATE(T)                                                                             \
  template mf_status mf_cuda_attn_fwd<T>(const T *, const T *, const T *, int64_t, int64_t, int64_t,         \
                                         int64_t, int64_t, int64_t, int64_t, const T *, float, T *, float *, \
                                         cudaStream_t);                                                      \
  template mf_status mf_cuda_attn_bwd<T>(                                                                    \
      const T *, const T *, const T *, const T *, const T *, const float *, int64_t, int64_t, int64_t,       \
      int64_t, int64_t, int64_t, int64_t, const T *, float, T *, T *, T *, float *, cudaStream_t);
ATTENTION_INSTANTIATE(float)
ATTENTION_INSTANTIATE(mf_bf16)
#undef ATTENTION_INSTANTIATE
