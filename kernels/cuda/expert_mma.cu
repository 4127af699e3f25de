// The grouped expert GEMMs of BF16 storage on tensor cores: EXPERT_FWD,
// EXPERT_BWD_DATA and EXPERT_BWD_WEIGHT with bf16 operands, fp32 accumulators,
// one launch per call (ops.cuh: mf_cuda_expert_mma_*; gemm.cu's
// mf_cuda_expert_*<mf_bf16> call them, fp32 storage keeps gemm.cu's CUDA-core
// kernel, which is also the fallback here).
//
// Maths, per expert e with rows r in [offsets[e], offsets[e+1]) of the routed
// activations (R rows in all, E experts, W_e stored [N, Kd], k contiguous):
//   FWD:  ye[r, n]      = sum_k  xe[r, k]  W_e[n*Kd + k]       (Kd deep)
//   DATA: dxe[r, k]     = sum_n  dye[r, n] W_e[n*Kd + k]       (N deep)
//   WGT:  dW_e[n, k]   += sum_r  dye[r, n] xe[r, k]           (the expert's rows deep)
// each as C[m, n] = sum_k A(m, k) B(k, n) on mma.sync.m16n8k16.row.col
// (A m16 x k16 "row", B k16 x n8 "col": the hardware wants both k-contiguous
// in registers). An operand tile in shared memory is either
//   outer-major: [MN][BK] rows of the output index, k contiguous: ldmatrix;
//   k-major:     [BK][MN] rows of the contraction index: ldmatrix.trans,
//                which hands each lane the same fragment as the transposed
//                tile would;
// so the three kinds are (global layout -> tile -> load):
//   FWD:  A(m=r, k)  = xe[r*Kd + k]        outer-major  ldmatrix
//         B(k, n)    = W_e[n*Kd + k]        outer-major  ldmatrix ("col" as stored)
//   DATA: A(m=r, k=n) = dye[r*N + n]        outer-major  ldmatrix
//         B(k=n, c)  = W_e[n*Kd + c]        k-major      ldmatrix.trans
//   WGT:  A(m=n, k=r) = dye[r*N + n]        k-major      ldmatrix.trans (A^T)
//         B(k=r, c)  = xe[r*Kd + c]         k-major      ldmatrix.trans
// Every operand's rows are then read as 16-byte chunks by cp.async.
//
// Tiles: a CTA of 8 warps (256 threads) owns a BM x 128 output tile, the warps
// 2 (m) x 4 (n), each BM/2 x 32: BM/32 x 4 mma tiles of 16 x 8, fp32
// accumulators in registers (64 a thread at BM = 128). The contraction runs in
// steps of BK = 32 through a STAGES = 3 deep cp.async ring in dynamic shared
// memory (a stage holds A's and B's BK slices; 17-20 KiB at BM = 128): while
// warps multiply step kt, steps kt+1 and kt+2 are in flight. Rows of a tile are
// padded by 8 elements (16 bytes): outer-major rows are 80 bytes apart and
// k-major rows (128 + 8) * 2 = 272, so the 8 row addresses of one ldmatrix
// phase fall in 8 different 16-byte bank groups (no conflicts), and every
// chunk stays 16-byte aligned for cp.async. 128 x 128 because it is the
// largest tile whose accumulators fit 2 CTAs an SM (<= 128 registers a thread:
// one CTA's barrier waits hide behind the other's mma), with 64 flops per byte
// brought from L2; BM = 64 (the same kernel, a template argument) when the average
// expert has fewer rows than one 128-row tile (R < 128 E), since a tile is
// padded to BM rows and small experts would waste up to half of a 128-row one.
// WGT always uses 128 x 128 tiles of dW (its M is N, not the rows).
// mma.sync rather than Hopper's wgmma: one kernel for sm_80 and sm_90; a
// wgmma + TMA variant (sm_90a) is what would approach cuBLAS's dense rate.
//
// Grid. FWD / DATA: blockIdx.y is the column tile; blockIdx.x enumerates
// (expert, row tile) over the experts with rows, in expert order: warp 0 scans
// offsets (32 experts at a time, a warp prefix sum of tiles per expert) and
// finds the CTA's expert and first row; the grid is sized from the bound R and
// E (ceil(R / BM) + E row tiles), CTAs past the real tiles exit at once, so the
// row counts stay on the device and idle experts get no CTA. WGT: blockIdx.x =
// (e, n tile, k tile), k tile fastest (an expert's CTAs share its dye and xe
// rows in L2); a CTA of an idle expert exits at once. The expert weight
// pointers (W, or dW) travel as one kernel parameter of MF_CUDA_MAX_EXPERTS
// pointers.
//
// Edges: rows, columns and contraction steps past an operand's end are
// zero-filled by cp.async (src-size 0: nothing read), so any row count and any
// N, Kd that are multiples of 8 take this path (each 16-byte chunk is then
// wholly inside or wholly outside). It needs N % 8 == 0 and Kd % 8 == 0 (every
// row stride a multiple of 16 bytes) and 16-byte aligned xe / dye / ye / dxe
// and expert pointers; otherwise mf_cuda_expert_mma_* launch nothing and say so
// (*ran = 0), and gemm.cu runs its CUDA-core kernel (fp32 FMA, the same
// results up to the order of sums).
//
// Outputs: ye / dxe are rounded to bf16 once from the fp32 sum (round to
// nearest even, bf16x2 stores), rows past offsets[E] and of no tile untouched;
// dW_e[n, k] += the fp32 sum over all the expert's rows, one read-add-write.
// An expert with rows but a NULL weight pointer (a cold expert's LoRA adapter,
// train.lora.experts hot) gets zero rows, as in the CUDA-core kernel and the
// cpu twin; its dW is skipped.
//
// Determinism: every output element belongs to one CTA and one thread, which
// sums the contraction in a fixed order (steps of 32 in order, each step two
// mma k16 products in order; for WGT the expert's rows in order, no split
// over rows, no atomics): two runs give the same bits. Against the CUDA-core
// kernel and the cpu twin only the order of the fp32 sums differs (bf16
// products are exact in fp32).
//
// The PTX primitives come from mma.cuh, the only inline PTX. MF_MMA_EMULATE
// leaves them and the launchers out so that a host program can include this
// file with its own primitives (tests/cuda/mma_emu.h) and run the kernels'
// index arithmetic on the CPU.
#ifndef MF_MMA_EMULATE
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "kernels/cuda/backend_cuda.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/mma.cuh"
#include "kernels/cuda/ops.cuh"
#endif

namespace {

enum { NT = 256, BN = 128, BK = 32, STAGES = 3, PAD = 8, WARPS_N = 4, BM_WGT = 128 };
enum { MMA_FWD = 0, MMA_DATA = 1, MMA_WGT = 2 };
static_assert(NT == 32 * 2 * WARPS_N, "8 warps: 2 along m, WARPS_N along n");
static_assert(BN == WARPS_N * 32, "a warp owns 32 columns");

struct expert_list {
  const void *p[MF_CUDA_MAX_EXPERTS];
};

__device__ __forceinline__ mf_bf16 *stage_memory() {
  return reinterpret_cast<mf_bf16 *>(mma_smem());
}

// ------------------------------------------------------------- tiles

// One stage's tile of an operand with MN output indices: k-major [BK][MN + PAD]
// or outer-major [MN][BK + PAD] (elements; rows 16-byte multiples).
template <bool KMAJ, int MN>
__host__ __device__ constexpr int tile_ld() {
  return KMAJ ? MN + PAD : BK + PAD;
}
template <bool KMAJ, int MN>
__host__ __device__ constexpr int tile_elems() {
  return KMAJ ? BK * tile_ld<KMAJ, MN>() : MN * tile_ld<KMAJ, MN>();
}
template <int KIND>
__host__ __device__ constexpr bool a_kmajor() {
  return KIND == MMA_WGT;
}
template <int KIND>
__host__ __device__ constexpr bool b_kmajor() {
  return KIND != MMA_FWD;
}
template <int KIND, int BM>
__host__ __device__ constexpr size_t stage_bytes() {
  return (size_t)STAGES * (tile_elems<a_kmajor<KIND>(), BM>() + tile_elems<b_kmajor<KIND>(), BN>()) *
         sizeof(mf_bf16);
}

// An operand in global memory: element (mn, k), mn the output index within the
// CTA's tile and k the contraction index, at g[k * ld + mn] (k-major) or
// g[mn * ld + k] (outer-major). Elements with mn >= mn_lim or k >= k_lim read
// as 0. The index that runs along a 16-byte chunk (mn when k-major, else k)
// has a limit that is a multiple of 8, so a chunk is all in or all out.
struct operand {
  const mf_bf16 *g;
  int64_t ld;
  int mn_lim;
  int64_t k_lim;
};

// Issues this thread's cp.async copies of steps [k0, k0 + BK) of `op` into the
// stage tile s: MN * BK / 8 chunks of 16 bytes, (MN * BK / 8) / NT a thread.
template <bool KMAJ, int MN>
__device__ __forceinline__ void load_tile(const operand &op, int64_t k0, mf_bf16 *s) {
  constexpr int PER_ROW = (KMAJ ? MN : BK) / 8, CHUNKS = MN * BK / 8;
  static_assert(CHUNKS % NT == 0, "every thread copies whole chunks");
#pragma unroll
  for (int q = 0; q < CHUNKS / NT; q++) {
    const int c = (int)threadIdx.x + q * NT, row = c / PER_ROW, col = (c % PER_ROW) * 8;
    const int mn = KMAJ ? col : row;
    const int64_t k = k0 + (KMAJ ? row : col);
    const bool in = mn < op.mn_lim && k < op.k_lim;
    const mf_bf16 *src = in ? op.g + (KMAJ ? k * op.ld + mn : (int64_t)mn * op.ld + k) : op.g;
    cp_async16(s + row * tile_ld<KMAJ, MN>() + col, src, in);
  }
}

// The address lane `lane` gives ldmatrix for the 8x8 matrix j = lane / 8 of a
// 16 x 16 block at output index mn0, contraction kk: matrix j covers output
// rows mn0 + mo .. +7 and steps kk + ko .. +7; its row lane % 8 is a row of
// the tile (an output index when outer-major, a step when k-major).
template <bool KMAJ, int MN>
__device__ __forceinline__ const mf_bf16 *ldsm_row(const mf_bf16 *s, int mn0, int kk, int mo, int ko,
                                                   int lane) {
  const int i = lane & 7;
  return KMAJ ? s + (kk + ko + i) * tile_ld<KMAJ, MN>() + mn0 + mo
              : s + (mn0 + mo + i) * tile_ld<KMAJ, MN>() + kk + ko;
}

// A fragments of the warp's MI m16 blocks at rows wm0 + 16 i, steps kk..kk+15:
// registers a0..a3 = (rows 0-7, k 0-7), (rows 8-15, k 0-7), (rows 0-7, k 8-15),
// (rows 8-15, k 8-15), so matrix j sits at mo = 8 (j & 1), ko = 8 (j >> 1).
template <bool KMAJ, int MN, int MI>
__device__ __forceinline__ void load_a(uint32_t (&a)[MI][4], const mf_bf16 *s, int wm0, int kk) {
  const int lane = (int)threadIdx.x & 31, j = lane >> 3;
#pragma unroll
  for (int mi = 0; mi < MI; mi++)
    ldsm_x4<KMAJ>(a[mi], ldsm_row<KMAJ, MN>(s, wm0 + 16 * mi, kk, 8 * (j & 1), 8 * (j >> 1), lane));
}

// B fragments of the warp's NI n8 blocks at columns wn0 + 8 i, two blocks per
// ldmatrix.x4: registers (n 0-7: k 0-7, k 8-15), (n 8-15: k 0-7, k 8-15), so
// matrix j sits at mo = 8 (j >> 1), ko = 8 (j & 1).
template <bool KMAJ, int MN, int NI>
__device__ __forceinline__ void load_b(uint32_t (&b)[NI][2], const mf_bf16 *s, int wn0, int kk) {
  const int lane = (int)threadIdx.x & 31, j = lane >> 3;
#pragma unroll
  for (int p = 0; p < NI / 2; p++) {
    uint32_t r[4];
    ldsm_x4<KMAJ>(r, ldsm_row<KMAJ, MN>(s, wn0 + 16 * p, kk, 8 * (j >> 1), 8 * (j & 1), lane));
    b[2 * p][0] = r[0], b[2 * p][1] = r[1], b[2 * p + 1][0] = r[2], b[2 * p + 1][1] = r[3];
  }
}

// The first row and column of the warp's part of the CTA's tile.
__device__ __forceinline__ int warp_m0(int bm) {
  return ((int)threadIdx.x >> 5) / WARPS_N * (bm / 2);
}
__device__ __forceinline__ int warp_n0() {
  return ((int)threadIdx.x >> 5) % WARPS_N * 32;
}

// The warp's accumulators: MI x 4 tiles of 16 x 8; v[i][j][h] is row
// wm0 + 16 i + lane / 4 (+ 8 for h >= 2), column wn0 + 8 j + 2 (lane % 4) + (h & 1).
template <int BM>
struct accum {
  static constexpr int MI = BM / 32, NI = 4;
  float v[MI][NI][4];

  __device__ __forceinline__ void fill(float x) {
#pragma unroll
    for (int mi = 0; mi < MI; mi++)
#pragma unroll
      for (int ni = 0; ni < NI; ni++)
#pragma unroll
        for (int h = 0; h < 4; h++) v[mi][ni][h] = x;
  }

  // f(m, n, C[m][n], C[m][n + 1]) for each pair of the thread's elements
  // inside the tile's first rows x cols (cols a multiple of 8, so a pair is
  // wholly in or out).
  template <typename F>
  __device__ __forceinline__ void each_pair(int rows, int cols, F f) const {
    const int lane = (int)threadIdx.x & 31, wm0 = warp_m0(BM), wn0 = warp_n0();
#pragma unroll
    for (int mi = 0; mi < MI; mi++)
#pragma unroll
      for (int ni = 0; ni < NI; ni++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
          const int m = wm0 + 16 * mi + (lane >> 2) + 8 * h, n = wn0 + 8 * ni + 2 * (lane & 3);
          if (m < rows && n < cols) f(m, n, v[mi][ni][2 * h], v[mi][ni][2 * h + 1]);
        }
  }
};

// acc += the product of A and B over the contraction [0, Kc), Kc > 0, in steps
// of BK through the STAGES-deep ring. Group g of this thread's cp.async copies
// holds step g (empty past the last step), so before step kt the wait for all
// but the newest STAGES - 2 groups completes step kt; the barrier after it
// makes every thread's copies of step kt visible and ends every warp's reads
// of step kt - 1, whose stage the copies issued next (step kt + STAGES - 1)
// overwrite.
template <bool A_KMAJ, bool B_KMAJ, int BM>
__device__ __forceinline__ void mainloop(const operand &A, const operand &B, int64_t Kc, accum<BM> &acc) {
  constexpr int SA = tile_elems<A_KMAJ, BM>(), SS = SA + tile_elems<B_KMAJ, BN>();
  constexpr int MI = accum<BM>::MI, NI = accum<BM>::NI;
  mf_bf16 *const sm = stage_memory();
  const int wm0 = warp_m0(BM), wn0 = warp_n0();
  const int64_t steps = (Kc + BK - 1) / BK;
#pragma unroll
  for (int st = 0; st < STAGES - 1; st++) {
    if (st < steps) {
      load_tile<A_KMAJ, BM>(A, (int64_t)st * BK, sm + st * SS);
      load_tile<B_KMAJ, BN>(B, (int64_t)st * BK, sm + st * SS + SA);
    }
    cp_async_commit();
  }
  int rd = 0;  // the stage of step kt: kt % STAGES; step kt + STAGES - 1 goes to the one before it
  for (int64_t kt = 0; kt < steps; kt++) {
    cp_async_wait<STAGES - 2>();
    __syncthreads();
    const int64_t next = kt + STAGES - 1;
    if (next < steps) {
      mf_bf16 *const sn = sm + (rd == 0 ? STAGES - 1 : rd - 1) * SS;
      load_tile<A_KMAJ, BM>(A, next * BK, sn);
      load_tile<B_KMAJ, BN>(B, next * BK, sn + SA);
    }
    cp_async_commit();
    const mf_bf16 *const sa = sm + rd * SS, *const sb = sa + SA;
    rd = rd + 1 == STAGES ? 0 : rd + 1;
#pragma unroll
    for (int kk = 0; kk < BK; kk += 16) {
      uint32_t a[MI][4], b[NI][2];
      load_a<A_KMAJ, BM, MI>(a, sa, wm0, kk);
      load_b<B_KMAJ, BN, NI>(b, sb, wn0, kk);
#pragma unroll
      for (int mi = 0; mi < MI; mi++)
#pragma unroll
        for (int ni = 0; ni < NI; ni++) mma_bf16(acc.v[mi][ni], a[mi], b[ni]);
    }
  }
  cp_async_wait<0>();  // only empty groups are left; none outlives the CTA
}

// Warp 0 (all its lanes): the CTA's (expert, row tile) for tile index t of the
// enumeration over experts with rows, in expert order, into s: {expert, first
// row, rows}; expert -1 when t is past the last tile.
template <int BM>
__device__ __forceinline__ void find_row_tile(const int64_t *offsets, int E, int64_t t, int64_t *s) {
  const unsigned all = 0xffffffffu;
  const int lane = (int)threadIdx.x & 31;
  int64_t before = 0;  // the tiles of the experts before this window of 32
  for (int e0 = 0; e0 < E; e0 += 32) {
    const int e = e0 + lane;
    const int64_t cnt = e < E ? offsets[e + 1] - offsets[e] : 0;
    const int nt = cnt > 0 ? (int)((cnt + BM - 1) / BM) : 0;  // fits: the grid's x is an int
    const int incl = mf_warp_inclusive_scan(nt);
    const int total = __shfl_sync(all, incl, 31);
    if (t < before + total) {  // the same for every lane
      const unsigned hit = __ballot_sync(all, before + incl > t);
      if (lane == __ffs(hit) - 1) {  // the first expert whose tiles reach past t
        const int64_t local = t - (before + incl - nt);
        s[0] = e;
        s[1] = offsets[e] + local * BM;
        s[2] = cnt - local * BM < BM ? cnt - local * BM : BM;
      }
      return;
    }
    before += total;
  }
  if (lane == 0) s[0] = -1;
}

// FWD / DATA: out[r, n0 + n] for the CTA's rows of one expert (Kin: the
// contraction and in's row width; Nout: out's row width).
template <int KIND, int BM>
__global__ void __launch_bounds__(NT, 2)
    expert_rows_mma(const mf_bf16 *in, const int64_t *offsets, int E, int64_t Kin, int64_t Nout,
                    const expert_list W, mf_bf16 *out) {
  __shared__ int64_t tile[3];
  if (threadIdx.x < 32) find_row_tile<BM>(offsets, E, blockIdx.x, tile);
  __syncthreads();
  const int64_t e = tile[0];
  if (e < 0) return;  // past the last tile: the whole CTA
  const int64_t r0 = tile[1], n0 = (int64_t)blockIdx.y * BN;
  const int rows = (int)tile[2], cols = Nout - n0 < BN ? (int)(Nout - n0) : BN;
  const mf_bf16 *w = static_cast<const mf_bf16 *>(W.p[e]);
  accum<BM> acc;
  // An expert with rows but no weights (a cold expert's LoRA adapter): zero
  // rows. w is the same for the whole CTA.
  acc.fill(0.0f);
  if (w) {
    const operand A = {in + r0 * Kin, Kin, rows, Kin};
    const operand B =
        KIND == MMA_FWD ? operand{w + n0 * Kin, Kin, cols, Kin} : operand{w + n0, Nout, cols, Kin};
    mainloop<false, b_kmajor<KIND>(), BM>(A, B, Kin, acc);
  }
  mf_bf16 *const o = out + r0 * Nout + n0;
  acc.each_pair(rows, cols, [&](int m, int n, float lo, float hi) { st_bf16x2(o + m * Nout + n, lo, hi); });
}

// WGT: dW_e[n0 + m, k0 + c] += sum over the expert's rows r of dye[r, n0 + m]
// xe[r, k0 + c]; blockIdx.x = (e * n_tiles + n tile) * k_tiles + k tile.
__global__ void __launch_bounds__(NT, 2)
    expert_wgt_mma(const mf_bf16 *dye, const mf_bf16 *xe, const int64_t *offsets, int64_t N, int64_t Kd,
                   int n_tiles, int k_tiles, const expert_list dW) {
  constexpr int BM = BM_WGT;
  const int64_t b = blockIdx.x, rest = b / k_tiles, e = rest / n_tiles;
  const int64_t k0 = (b % k_tiles) * (int64_t)BN, n0 = (rest % n_tiles) * (int64_t)BM;
  const int64_t r0 = offsets[e], cnt = offsets[e + 1] - r0;
  float *const w = static_cast<float *>(const_cast<void *>(dW.p[e]));
  if (cnt <= 0 || !w) return;  // an idle expert: the whole CTA
  const int rows = N - n0 < BM ? (int)(N - n0) : BM, cols = Kd - k0 < BN ? (int)(Kd - k0) : BN;
  accum<BM> acc;
  acc.fill(0.0f);
  const operand A = {dye + r0 * N + n0, N, rows, cnt}, B = {xe + r0 * Kd + k0, Kd, cols, cnt};
  mainloop<true, true, BM>(A, B, cnt, acc);
  float *const o = w + n0 * Kd + k0;
  acc.each_pair(rows, cols, [&](int m, int n, float lo, float hi) {
    float2 *const p = reinterpret_cast<float2 *>(o + m * Kd + n);  // 8-byte aligned: Kd, k0, n even
    float2 v = *p;
    v.x += lo, v.y += hi;
    *p = v;
  });
}

// ------------------------------------------------------------- launch

// The tile height of a FWD / DATA call: 64 when the average expert has fewer
// rows than one 128-row tile.
static int rows_bm(int64_t R, int64_t E) {
  return R < 128 * E ? 64 : 128;
}

static bool aligned16(const void *p) {
  return ((uintptr_t)p & 15) == 0;
}

// Whether the tensor-core path takes a call (the header's conditions); fills
// the expert list when it does.
static bool mma_fits(int64_t E, int64_t N, int64_t Kd, const void *const *experts, const void *a,
                     const void *b, expert_list *list) {
  if (E <= 0 || E > MF_CUDA_MAX_EXPERTS || !experts || N <= 0 || Kd <= 0 || N % 8 || Kd % 8) return false;
  if (!aligned16(a) || !aligned16(b)) return false;
  for (int64_t e = 0; e < E; e++) {
    if (experts[e] && !aligned16(experts[e])) return false;
    list->p[e] = experts[e];
  }
  for (int64_t e = E; e < MF_CUDA_MAX_EXPERTS; e++) list->p[e] = nullptr;
  return true;
}

// FWD / DATA grid: x = an upper bound on the (expert, row tile) count, y = the
// column tiles; false when it exceeds the grid's limits.
static bool rows_grid(int64_t R, int64_t E, int64_t Nout, int bm, unsigned *x, unsigned *y) {
  const int64_t row_tiles = (R + bm - 1) / bm + E, col_tiles = (Nout + BN - 1) / BN;
  if (row_tiles > INT32_MAX || col_tiles > 65535) return false;
  *x = (unsigned)row_tiles, *y = (unsigned)col_tiles;
  return true;
}

#ifndef MF_MMA_EMULATE
template <int KIND, int BM>
mf_status rows_launch(const mf_bf16 *in, const int64_t *offsets, int64_t E, int64_t Kin, int64_t Nout,
                      const expert_list &W, mf_bf16 *out, dim3 grid, cudaStream_t s) {
  constexpr size_t smem = stage_bytes<KIND, BM>();  // above the 48 KiB default: opted in
  MF_CUDA_CHECK(cudaFuncSetAttribute((const void *)expert_rows_mma<KIND, BM>,
                                     cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
  expert_rows_mma<KIND, BM><<<grid, NT, smem, s>>>(in, offsets, (int)E, Kin, Nout, W, out);
  MF_CUDA_CHECK_LAUNCH();
  return MF_OK;
}

// FWD (Kin = Kd, Nout = N) or DATA (Kin = N, Nout = Kd).
template <int KIND>
mf_status expert_rows(const mf_bf16 *in, const mf_bf16 *const *W, const int64_t *offsets, int64_t R,
                      int64_t E, int64_t N, int64_t Kd, mf_bf16 *out, int *ran, cudaStream_t s) {
  *ran = 0;
  expert_list list;
  const int64_t Kin = KIND == MMA_FWD ? Kd : N, Nout = KIND == MMA_FWD ? N : Kd;
  const int bm = rows_bm(R, E);
  unsigned x = 0, y = 0;
  if (R <= 0 || !mma_fits(E, N, Kd, (const void *const *)W, in, out, &list) ||
      !rows_grid(R, E, Nout, bm, &x, &y))
    return MF_OK;
  const dim3 grid(x, y);
  if (bm == 64)
    MF_CHECK((rows_launch<KIND, 64>(in, offsets, E, Kin, Nout, list, out, grid, s)));
  else
    MF_CHECK((rows_launch<KIND, 128>(in, offsets, E, Kin, Nout, list, out, grid, s)));
  *ran = 1;
  return MF_OK;
}
#endif  // MF_MMA_EMULATE

}  // namespace

#ifndef MF_MMA_EMULATE
mf_status mf_cuda_expert_mma_fwd(const mf_bf16 *xe, const mf_bf16 *const *W, const int64_t *offsets,
                                 int64_t R, int64_t E, int64_t N, int64_t Kd, mf_bf16 *ye, int *ran,
                                 cudaStream_t s) {
  return expert_rows<MMA_FWD>(xe, W, offsets, R, E, N, Kd, ye, ran, s);
}

mf_status mf_cuda_expert_mma_bwd_data(const mf_bf16 *dye, const mf_bf16 *const *W, const int64_t *offsets,
                                      int64_t R, int64_t E, int64_t N, int64_t Kd, mf_bf16 *dxe, int *ran,
                                      cudaStream_t s) {
  return expert_rows<MMA_DATA>(dye, W, offsets, R, E, N, Kd, dxe, ran, s);
}

mf_status mf_cuda_expert_mma_bwd_weight(const mf_bf16 *dye, const mf_bf16 *xe, const int64_t *offsets,
                                        int64_t E, int64_t N, int64_t Kd, float *const *dW, int *ran,
                                        cudaStream_t s) {
  *ran = 0;
  expert_list list;
  if (!mma_fits(E, N, Kd, (const void *const *)dW, dye, xe, &list)) return MF_OK;
  const int64_t n_tiles = (N + BM_WGT - 1) / BM_WGT, k_tiles = (Kd + BN - 1) / BN;
  if (E * n_tiles * k_tiles > INT32_MAX) return MF_OK;
  constexpr size_t smem = stage_bytes<MMA_WGT, BM_WGT>();
  MF_CUDA_CHECK(cudaFuncSetAttribute((const void *)expert_wgt_mma,
                                     cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
  expert_wgt_mma<<<(unsigned)(E * n_tiles * k_tiles), NT, smem, s>>>(dye, xe, offsets, N, Kd, (int)n_tiles,
                                                                     (int)k_tiles, list);
  MF_CUDA_CHECK_LAUNCH();
  *ran = 1;
  return MF_OK;
}
#endif  // MF_MMA_EMULATE
