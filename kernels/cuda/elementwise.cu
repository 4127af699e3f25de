// Elementwise and per-row ops of the cuda backend over fp32 or bf16 storage T
// (ops.cuh), fp32 math; the maths is that of the cpu twins (kernels/cpu/
// {embedding,rmsnorm,rope,elementwise}.c), restated here with each kernel's
// thread mapping. A T value is read widened to fp32 and every stored T output
// is rounded once (mf_st: the cpu's round_bf16); F32 operands (rstd, dtable,
// dw) stay fp32. Each element's operations are those of the fp32 kernels before
// bf16 (same order, same contractions), so F32 storage keeps their bits.
//
// Vector access: a thread handles chunks of N = mf_vec<T>::n elements (4 fp32,
// 8 bf16: 16 bytes) with one 16-byte load or store per operand where the row
// starts 16-byte aligned and the chunk lies inside it; otherwise (a misaligned
// row, e.g. C not a multiple of N, or the row's tail) element by element.
// Row sums are staged (row_sum): the block reads a tile of B*N elements (B =
// MF_CUDA_BLOCK threads) with 16-byte accesses into shared memory, and thread i
// sums elements i, i + B, i + 2B, ... in order, then a fixed tree — the order
// of a scalar strided loop, whatever N.
//
//   embed fwd   out[t,:] = table[ids[t],:]                 ids[T] table[V,H] out[T,H]
//               (ids are trusted to lie in [0, V), as on the cpu)
//               one thread per chunk of a row, a raw copy (no rounding).
//   embed bwd   dtable[ids[t],:] += dout[t,:]   (added, fp32)
//               a counting sort of the tokens by id, then one block per touched
//               vocabulary row adding its tokens' gradients in token order (the
//               cpu twin's order) onto the row, a thread per chunk of columns:
//               1. start[v] = #tokens of id v   (integer atomics: a count)
//               2. start[v] = start[0] + ... + start[v]   (one block, in place)
//               3. each token t: slot[--start[ids[t]]] = t (integer atomics); now
//                  start[v] is row v's first slot, start[v+1] its end, and row
//                  v's slots hold its tokens in some order
//               4. each slot: its token's rank among its row's tokens (a count of
//                  smaller ones) places it: sorted[start[v] + rank] = t
//               5. the block of the first slot of a row walks sorted[start[v],
//                  start[v+1]) in order: acc = dtable[v,c]; acc += dout[t,c].
//               Work is linear in T except step 4 (the square of each row's
//               token count); no floating-point atomics; ids outside [0, V)
//               are skipped. Scratch: mf_cuda_embed_bwd_scratch_bytes(T, V) =
//               4 (V + 1 + 2T) bytes: start[V+1], slot[T], sorted[T] (int32).
//   rmsnorm fwd rstd[r] = 1/sqrt(mean_c x^2 + eps); y = w * (x*rstd)   x,y[R,C] w[C]
//               one block per row; the sum of squares a staged row sum. y may
//               equal x: the row sum's last barrier comes before y is written.
//   rmsnorm bwd xhat = x*rstd; m = mean_c(w*dy*xhat); dx = rstd*(w*dy - xhat*m)
//               (written, or added when accumulate): one block per row, m a
//               staged row sum.
//               dw[c] += sum_r dy*xhat: the rows are cut into P blocks
//               (mf_cuda_rmsnorm_dw_parts, from R alone); thread (chunk, p) sums
//               its rows in order into scratch[p,chunk]; then a thread per chunk
//               adds scratch[0..P-1, chunk] in order to dw.
//   rope        in place on dims [off, off + rot) of each head of x[T,nh,D] (dx for bwd;
//               rot 0: D - off), pair i < rot/2: x1 = x[off + i], x2 = x1 + rot/2, or
//               interleaved x1 = x[off + 2i], x2 = x1 + 1 (kernels/rope.h):
//               inv = mf_rope_inv_freq(i) (1/theta^((float)2i/(float)rot), or YaRN's blend),
//               f = (float)pos[t]*inv, c = A cos f, s = A sin f (A: attention factor, when not 1);
//               fwd: x1' = x1*c - x2*s, x2' = x2*c + x1*s;  bwd: d1 = g1*c + g2*s,
//               d2 = g2*c - g1*s.  One thread per (t, head, i) pair, scalar
//               accesses (the angle, not memory, is its cost).
//   swiglu      act = silu(g)*u; dg = dact*u*silu'(g), du = dact*silu(g), with
//               silu(g) = g/(1+e^-g), s = sigmoid(g), silu' = s*(1 + g*(1-s)).
//               One thread per chunk.
//   sigmoid_gate
//               fwd: y[r,:] += sigmoid(gl[r]) * x[r,:]   (added) one thread per chunk of a row.
//               bwd: dx = s*dy (written); dgl[r] = s*(1-s)*dot(dy[r,:], x[r,:])
//               (written): one block per row, the dot a staged row sum.
//   add         y += x: one thread per chunk.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "kernels/backend.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/ops.cuh"

#define GRID_STRIDE(i, n)                                                   \
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n); \
       i += (int64_t)gridDim.x * blockDim.x)

#define DW_MAX_PARTS 32
#define DW_ROWS_PER_PART 64

// The embedding backward's prefix sum: one block of SCAN_THREADS, each summing
// SCAN_PER_THREAD consecutive counts per tile.
#define SCAN_THREADS 1024
#define SCAN_PER_THREAD 8

int64_t mf_cuda_rmsnorm_dw_parts(int64_t R) {
  int64_t p = (R + DW_ROWS_PER_PART - 1) / DW_ROWS_PER_PART;
  if (p > DW_MAX_PARTS) p = DW_MAX_PARTS;
  return p < 1 ? 1 : p;
}

size_t mf_cuda_embed_bwd_scratch_bytes(int64_t T_, int64_t V) {
  if (T_ <= 0 || V <= 0) return 0;
  return ((size_t)V + 1 + 2 * (size_t)T_) * sizeof(int32_t);
}

// ------------------------------------------------------- 16-byte access

namespace {

__host__ __device__ __forceinline__ bool aligned16(const void *p) {
  return ((uintptr_t)p & 15u) == 0;
}

// mf_vec<T>::n elements at p (16-byte aligned) widened to fp32, or stored
// rounded as mf_st rounds.
__device__ __forceinline__ void ld16(const float *p, float *v) {
  const float4 q = *reinterpret_cast<const float4 *>(p);
  v[0] = q.x, v[1] = q.y, v[2] = q.z, v[3] = q.w;
}
__device__ __forceinline__ void ld16(const mf_bf16 *p, float *v) {
  const uint4 q = *reinterpret_cast<const uint4 *>(p);
  const __nv_bfloat162 *h = reinterpret_cast<const __nv_bfloat162 *>(&q);
#pragma unroll
  for (int j = 0; j < 4; j++) {
    const float2 f = __bfloat1622float2(h[j]);
    v[2 * j] = f.x, v[2 * j + 1] = f.y;
  }
}
__device__ __forceinline__ void st16(float *p, const float *v) {
  *reinterpret_cast<float4 *>(p) = make_float4(v[0], v[1], v[2], v[3]);
}
__device__ __forceinline__ void st16(mf_bf16 *p, const float *v) {
  uint4 q;
  __nv_bfloat162 *h = reinterpret_cast<__nv_bfloat162 *>(&q);
#pragma unroll
  for (int j = 0; j < 4; j++) h[j] = __floats2bfloat162_rn(v[2 * j], v[2 * j + 1]);
  *reinterpret_cast<uint4 *>(p) = q;
}

// Elements [c, c + M) of a row of n elements (M a multiple of mf_vec<T>::n, c
// of M): 16-byte accesses when vec (the row starts 16-byte aligned) and the
// chunk lies inside the row, else one element at a time — reading 0 and
// storing nothing at or past n.
template <int M, typename T>
__device__ __forceinline__ void ld_chunk(const T *row, int64_t c, int64_t n, bool vec, float *v) {
  constexpr int N = mf_vec<T>::n;
  static_assert(M % N == 0, "a chunk is whole 16-byte vectors");
  if (vec && c + M <= n) {
#pragma unroll
    for (int j = 0; j < M; j += N) ld16(row + c + j, v + j);
  } else {
#pragma unroll
    for (int j = 0; j < M; j++) v[j] = c + j < n ? mf_ld(row + c + j) : 0.0f;
  }
}
template <int M, typename T>
__device__ __forceinline__ void st_chunk(T *row, int64_t c, int64_t n, bool vec, const float *v) {
  constexpr int N = mf_vec<T>::n;
  static_assert(M % N == 0, "a chunk is whole 16-byte vectors");
  if (vec && c + M <= n) {
#pragma unroll
    for (int j = 0; j < M; j += N) st16(row + c + j, v + j);
  } else {
#pragma unroll
    for (int j = 0; j < M; j++)
      if (c + j < n) mf_st(row + c + j, v[j]);
  }
}

// The shared tile of a staged row sum over K rows: B*N elements of each.
template <typename T, int K>
struct row_tile {
  static constexpr int n = MF_CUDA_BLOCK * mf_vec<T>::n;
  float4 v[K][n / 4];  // float4: 16-byte shared stores, and the tile's alignment
  __device__ float *row(int q) { return reinterpret_cast<float *>(v[q]); }
};

// sum over c < C of term(e, tile) (e: c's index in the tile, tile.row(q)[e]
// row q's element c), summed by the block in the order of the scalar loop
// `for (c = i; c < C; c += B) part += term` of thread i, then mf_block_sum's
// tree. Thread i loads elements [iN, iN + N) of each tile with 16-byte
// accesses (ld_chunk; vec as there) and sums elements i, i + B, ...,
// i + (N-1)B of it: over the tiles, i, i + B, i + 2B, ... in order. Every
// thread gets the sum; all threads of the block must call it. The last barrier
// comes after every read of the rows.
template <typename T, int K, typename Term>
__device__ float row_sum(const T *const (&rows)[K], int64_t C, bool vec, row_tile<T, K> &tile, float *sh,
                         Term term) {
  constexpr int N = mf_vec<T>::n;
  const int i = threadIdx.x;
  float part = 0.0f;
  for (int64_t b = 0; b < C; b += tile.n) {
    const int64_t left = C - b;
#pragma unroll
    for (int q = 0; q < K; q++) {
      float v[N];
      ld_chunk<N>(rows[q] + b, (int64_t)i * N, left, vec, v);
#pragma unroll
      for (int j = 0; j < N; j += 4)
        tile.v[q][(i * N + j) / 4] = make_float4(v[j], v[j + 1], v[j + 2], v[j + 3]);
    }
    __syncthreads();
#pragma unroll
    for (int j = 0; j < N; j++) {
      const int e = i + j * MF_CUDA_BLOCK;
      if (e < left) part += term(e, tile);
    }
    __syncthreads();
  }
  return mf_block_sum(part, sh);
}

}  // namespace

// ------------------------------------------------------------ embedding

template <typename T>
static __global__ void embed_fwd_kernel(const int32_t *__restrict__ ids, const T *__restrict__ table,
                                        int64_t T_, int64_t H, bool vec, T *__restrict__ out) {
  constexpr int N = mf_vec<T>::n;
  const int64_t cpr = (H + N - 1) / N;  // chunks per row
  GRID_STRIDE(k, T_ * cpr) {
    const int64_t t = k / cpr, c = (k - t * cpr) * N;
    const T *src = table + (int64_t)ids[t] * H + c;
    T *dst = out + t * H + c;
    if (vec && c + N <= H) {
      *reinterpret_cast<uint4 *>(dst) = *reinterpret_cast<const uint4 *>(src);
    } else {
      for (int j = 0; j < N && c + j < H; j++) dst[j] = src[j];
    }
  }
}

// Step 1: start[v] = the number of tokens of id v (start zeroed first).
static __global__ void embed_count_kernel(const int32_t *__restrict__ ids, int64_t T_, int64_t V,
                                          int32_t *__restrict__ start) {
  GRID_STRIDE(t, T_) {
    const int32_t id = ids[t];
    if (id >= 0 && id < V) atomicAdd(start + id, 1);
  }
}

// Step 2, one block of SCAN_THREADS: start[v] = start[0] + ... + start[v] for
// v < V, start[V] = the total. Tile by tile: each thread's SCAN_PER_THREAD
// consecutive counts, then a warp scan and a scan of the warps' sums.
static __global__ void embed_scan_kernel(int32_t *start, int64_t V) {
  constexpr int W = SCAN_THREADS / 32;
  __shared__ int32_t warp_incl[W];
  const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
  int32_t carry = 0;
  for (int64_t b = 0; b < V; b += (int64_t)SCAN_THREADS * SCAN_PER_THREAD) {
    const int64_t c0 = b + (int64_t)threadIdx.x * SCAN_PER_THREAD;
    int32_t v[SCAN_PER_THREAD], run = 0;
#pragma unroll
    for (int j = 0; j < SCAN_PER_THREAD; j++) {
      run += c0 + j < V ? start[c0 + j] : 0;
      v[j] = run;
    }
    const int32_t inc = mf_warp_inclusive_scan(run);
    if (lane == 31) warp_incl[wid] = inc;
    __syncthreads();
    if (wid == 0) {
      const int32_t ws = mf_warp_inclusive_scan(lane < W ? warp_incl[lane] : 0);
      if (lane < W) warp_incl[lane] = ws;
    }
    __syncthreads();
    const int32_t before = carry + (wid > 0 ? warp_incl[wid - 1] : 0) + inc - run;
#pragma unroll
    for (int j = 0; j < SCAN_PER_THREAD; j++)
      if (c0 + j < V) start[c0 + j] = before + v[j];
    carry += warp_incl[W - 1];
    __syncthreads();  // warp_incl is rewritten by the next tile
  }
  if (threadIdx.x == 0) start[V] = carry;
}

// Step 3: each token takes a slot of its row, counting the row's end down to
// its start.
static __global__ void embed_place_kernel(const int32_t *__restrict__ ids, int64_t T_, int64_t V,
                                          int32_t *__restrict__ start, int32_t *__restrict__ slot) {
  GRID_STRIDE(t, T_) {
    const int32_t id = ids[t];
    if (id >= 0 && id < V) slot[atomicSub(start + id, 1) - 1] = (int32_t)t;
  }
}

// Step 4: the slots of each row in token order (the tokens are distinct, so a
// token's rank is its place).
static __global__ void embed_order_kernel(const int32_t *__restrict__ ids, const int32_t *__restrict__ start,
                                          const int32_t *__restrict__ slot, int64_t V,
                                          int32_t *__restrict__ sorted) {
  const int64_t total = start[V];
  GRID_STRIDE(k, total) {
    const int32_t t = slot[k], id = ids[t], b0 = start[id], b1 = start[id + 1];
    int32_t rank = 0;
    for (int32_t j = b0; j < b1; j++) rank += slot[j] < t;
    sorted[b0 + rank] = t;
  }
}

// Step 5: the block of a row's first slot adds the row's tokens in order; a
// thread per chunk of columns. vec: dtable, dout and H allow 16-byte rows.
template <typename T>
static __global__ void embed_bwd_rows_kernel(const int32_t *__restrict__ ids, const T *__restrict__ dout,
                                             int64_t H, const int32_t *__restrict__ start,
                                             const int32_t *__restrict__ sorted, int64_t V, bool vec,
                                             float *__restrict__ dtable) {
  constexpr int N = mf_vec<T>::n;
  const int64_t total = start[V];
  for (int64_t k = blockIdx.x; k < total; k += gridDim.x) {
    const int32_t id = ids[sorted[k]];
    if (start[id] != k) continue;  // not its row's first token
    const int32_t end = start[id + 1];
    float *drow = dtable + (int64_t)id * H;
    for (int64_t c = (int64_t)threadIdx.x * N; c < H; c += (int64_t)blockDim.x * N) {
      float acc[N];
      ld_chunk<N>(drow, c, H, vec, acc);
#pragma unroll 4
      for (int32_t j = (int32_t)k; j < end; j++) {
        float g[N];
        ld_chunk<N>(dout + (int64_t)sorted[j] * H, c, H, vec, g);
#pragma unroll
        for (int q = 0; q < N; q++) acc[q] = acc[q] + g[q];
      }
      st_chunk<N>(drow, c, H, vec, acc);
    }
  }
}

template <typename T>
mf_status mf_cuda_embed_fwd(const int32_t *ids, int64_t T_, const T *table, int64_t V, int64_t H, T *out,
                            cudaStream_t s) {
  constexpr int N = mf_vec<T>::n;
  (void)V;  // the ids are trusted to lie in [0, V)
  if (T_ <= 0 || H <= 0) return MF_OK;
  const bool vec = H % N == 0 && aligned16(table) && aligned16(out);
  embed_fwd_kernel<T>
      <<<mf_cuda_grid(T_ * ((H + N - 1) / N)), MF_CUDA_BLOCK, 0, s>>>(ids, table, T_, H, vec, out);
  MF_CUDA_CHECK_LAUNCH();
  return MF_OK;
}

template <typename T>
mf_status mf_cuda_embed_bwd(const int32_t *ids, int64_t T_, const T *dout, int64_t V, int64_t H,
                            float *dtable, int32_t *scratch, cudaStream_t s) {
  constexpr int N = mf_vec<T>::n;
  if (T_ <= 0 || H <= 0 || V <= 0) return MF_OK;
  if (T_ >= INT32_MAX || V >= INT32_MAX)
    return MF_ERR(MF_ERR_UNSUPPORTED, "embed_bwd: %lld tokens over %lld rows: int32 slots hold under 2^31",
                  (long long)T_, (long long)V);
  int32_t *start = scratch, *slot = start + V + 1, *sorted = slot + T_;
  MF_CUDA_CHECK(cudaMemsetAsync(start, 0, (size_t)(V + 1) * sizeof(int32_t), s));
  embed_count_kernel<<<mf_cuda_grid(T_), MF_CUDA_BLOCK, 0, s>>>(ids, T_, V, start);
  MF_CUDA_CHECK_LAUNCH();
  embed_scan_kernel<<<1, SCAN_THREADS, 0, s>>>(start, V);
  MF_CUDA_CHECK_LAUNCH();
  embed_place_kernel<<<mf_cuda_grid(T_), MF_CUDA_BLOCK, 0, s>>>(ids, T_, V, start, slot);
  MF_CUDA_CHECK_LAUNCH();
  embed_order_kernel<<<mf_cuda_grid(T_), MF_CUDA_BLOCK, 0, s>>>(ids, start, slot, V, sorted);
  MF_CUDA_CHECK_LAUNCH();
  const bool vec = H % N == 0 && aligned16(dout) && aligned16(dtable);
  embed_bwd_rows_kernel<T>
      <<<mf_cuda_grid_rows(T_), MF_CUDA_BLOCK, 0, s>>>(ids, dout, H, start, sorted, V, vec, dtable);
  MF_CUDA_CHECK_LAUNCH();
  return MF_OK;
}

// -------------------------------------------------------------- RMSNorm

template <typename T>
static __global__ void rmsnorm_fwd_kernel(const T *x, const T *__restrict__ w, int64_t R, int64_t C,
                                          float eps, T *y, float *__restrict__ rstd) {
  constexpr int N = mf_vec<T>::n;
  __shared__ float sh[MF_CUDA_BLOCK];
  __shared__ row_tile<T, 1> tile;
  for (int64_t r = blockIdx.x; r < R; r += gridDim.x) {
    const T *xr = x + r * C;
    T *yr = y + r * C;
    const bool vec = aligned16(xr) && aligned16(yr) && aligned16(w);
    const T *const in[1] = {xr};
    // also the barrier before y (which may be x) is written
    const float ss = row_sum(in, C, vec, tile, sh, [](int e, row_tile<T, 1> &t) {
      const float v = t.row(0)[e];
      return v * v;
    });
    const float ms = C > 0 ? ss / (float)C : 0.0f;
    const float rs = 1.0f / sqrtf(ms + eps);
    if (threadIdx.x == 0) rstd[r] = rs;
    for (int64_t c = (int64_t)threadIdx.x * N; c < C; c += (int64_t)MF_CUDA_BLOCK * N) {
      float xv[N], wv[N], yv[N];
      ld_chunk<N>(xr, c, C, vec, xv);
      ld_chunk<N>(w, c, C, vec, wv);
#pragma unroll
      for (int j = 0; j < N; j++) yv[j] = wv[j] * (xv[j] * rs);
      st_chunk<N>(yr, c, C, vec, yv);
    }
  }
}

template <typename T>
static __global__ void rmsnorm_bwd_dx_kernel(const T *__restrict__ dy, const T *__restrict__ x,
                                             const T *__restrict__ w, const float *__restrict__ rstd,
                                             int64_t R, int64_t C, T *__restrict__ dx, int accumulate) {
  constexpr int N = mf_vec<T>::n;
  __shared__ float sh[MF_CUDA_BLOCK];
  __shared__ row_tile<T, 3> tile;
  for (int64_t r = blockIdx.x; r < R; r += gridDim.x) {
    const T *xr = x + r * C, *dyr = dy + r * C;
    T *dxr = dx + r * C;
    const float rs = rstd[r];
    const bool vec = aligned16(xr) && aligned16(dyr) && aligned16(dxr) && aligned16(w);
    const T *const in[3] = {w, dyr, xr};
    const float m =
        row_sum(in, C, vec, tile, sh,
                [rs](int e, row_tile<T, 3> &t) { return (t.row(0)[e] * t.row(1)[e]) * (t.row(2)[e] * rs); }) /
        (float)C;
    for (int64_t c = (int64_t)threadIdx.x * N; c < C; c += (int64_t)MF_CUDA_BLOCK * N) {
      float xv[N], wv[N], dyv[N], dxv[N];
      ld_chunk<N>(xr, c, C, vec, xv);
      ld_chunk<N>(w, c, C, vec, wv);
      ld_chunk<N>(dyr, c, C, vec, dyv);
      if (accumulate) ld_chunk<N>(dxr, c, C, vec, dxv);
#pragma unroll
      for (int j = 0; j < N; j++) {
        const float v = rs * (wv[j] * dyv[j] - (xv[j] * rs) * m);
        dxv[j] = accumulate ? dxv[j] + v : v;
      }
      st_chunk<N>(dxr, c, C, vec, dxv);
    }
  }
}

// blockIdx.y = part p of P: rows [p*rb, min(R, (p+1)*rb)). vec: dy, x and C
// allow 16-byte rows (part, from the scratch, then does too).
template <typename T>
static __global__ void rmsnorm_bwd_dw_part_kernel(const T *__restrict__ dy, const T *__restrict__ x,
                                                  const float *__restrict__ rstd, int64_t R, int64_t C,
                                                  int64_t rb, bool vec, float *__restrict__ part) {
  constexpr int N = mf_vec<T>::n;
  const int64_t p = blockIdx.y;
  const int64_t r0 = p * rb, r1 = r0 + rb < R ? r0 + rb : R;
  GRID_STRIDE(k, (C + N - 1) / N) {
    const int64_t c = k * N;
    float acc[N];
#pragma unroll
    for (int j = 0; j < N; j++) acc[j] = 0.0f;
    for (int64_t r = r0; r < r1; r++) {
      float dyv[N], xv[N];
      ld_chunk<N>(dy + r * C, c, C, vec, dyv);
      ld_chunk<N>(x + r * C, c, C, vec, xv);
      const float rs = rstd[r];
#pragma unroll
      for (int j = 0; j < N; j++) acc[j] += dyv[j] * (xv[j] * rs);
    }
    st_chunk<N>(part + p * C, c, C, vec, acc);
  }
}

static __global__ void rmsnorm_bwd_dw_sum_kernel(const float *__restrict__ part, int64_t P, int64_t C,
                                                 bool vec, float *__restrict__ dw) {
  GRID_STRIDE(k, (C + 3) / 4) {
    const int64_t c = k * 4;
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f}, v[4];
    for (int64_t p = 0; p < P; p++) {
      ld_chunk<4>(part + p * C, c, C, vec, v);
#pragma unroll
      for (int j = 0; j < 4; j++) acc[j] += v[j];
    }
    ld_chunk<4>(dw, c, C, vec, v);
#pragma unroll
    for (int j = 0; j < 4; j++) v[j] += acc[j];
    st_chunk<4>(dw, c, C, vec, v);
  }
}

template <typename T>
mf_status mf_cuda_rmsnorm_fwd(const T *x, const T *w, int64_t R, int64_t C, float eps, T *y, float *rstd,
                              cudaStream_t s) {
  if (R <= 0) return MF_OK;
  rmsnorm_fwd_kernel<T><<<mf_cuda_grid_rows(R), MF_CUDA_BLOCK, 0, s>>>(x, w, R, C, eps, y, rstd);
  MF_CUDA_CHECK_LAUNCH();
  return MF_OK;
}

template <typename T>
mf_status mf_cuda_rmsnorm_bwd(const T *dy, const T *x, const T *w, const float *rstd, int64_t R, int64_t C,
                              T *dx, float *dw, int accumulate, float *scratch, cudaStream_t s) {
  constexpr int N = mf_vec<T>::n;
  if (R <= 0 || C <= 0) return MF_OK;
  rmsnorm_bwd_dx_kernel<T>
      <<<mf_cuda_grid_rows(R), MF_CUDA_BLOCK, 0, s>>>(dy, x, w, rstd, R, C, dx, accumulate);
  MF_CUDA_CHECK_LAUNCH();
  if (!dw) return MF_OK; /* a frozen weight: no gradient */
  const int64_t P = mf_cuda_rmsnorm_dw_parts(R);
  const int64_t rb = (R + P - 1) / P;
  const bool vec = C % N == 0 && aligned16(dy) && aligned16(x) && aligned16(scratch);
  dim3 grid(mf_cuda_grid((C + N - 1) / N), (unsigned)P);
  rmsnorm_bwd_dw_part_kernel<T><<<grid, MF_CUDA_BLOCK, 0, s>>>(dy, x, rstd, R, C, rb, vec, scratch);
  MF_CUDA_CHECK_LAUNCH();
  const bool vec_dw = C % 4 == 0 && aligned16(dw) && aligned16(scratch);
  rmsnorm_bwd_dw_sum_kernel<<<mf_cuda_grid((C + 3) / 4), MF_CUDA_BLOCK, 0, s>>>(scratch, P, C, vec_dw, dw);
  MF_CUDA_CHECK_LAUNCH();
  return MF_OK;
}

// ----------------------------------------------------------------- RoPE

// The plan (kernels/rope.h) travels by value as a kernel parameter: it is
// resolved on the host per call by mf_rope_plan_make, the cpu twin's
// function (validation and YaRN's correction range in double), and each
// thread computes its pair's inv_freq with mf_rope_inv_freq, the cpu twin's
// definition (products and sums kept apart from fma there). Per thread, as
// before YaRN: the default path keeps its device bits (a host table would
// give glibc's powf, an ulp from the device's at times, and change them);
// the angle, not the powf, is the cost.
template <typename T>
static __global__ void rope_kernel(T *x, int64_t T_, int64_t nh, int64_t D, const int32_t *__restrict__ pos,
                                   const mf_rope_plan p, int backward) {
  const int64_t half = p.half;
  GRID_STRIDE(n, T_ * nh * half) {
    const int64_t i = n % half, th = n / half, t = th / nh;
    const float inv = mf_rope_inv_freq(&p, i);
    const float f = (float)pos[t] * inv;
    float cs = cosf(f), sn = sinf(f);
    if (p.scaled) {
      cs = __fmul_rn(cs, p.attn);
      sn = __fmul_rn(sn, p.attn);
    }
    T *x1 = x + th * D + p.off + i * p.step;
    T *x2 = x1 + p.pair;
    const float u = mf_ld(x1), v = mf_ld(x2);
    if (!backward) {
      mf_st(x1, u * cs - v * sn);
      mf_st(x2, v * cs + u * sn);
    } else {
      mf_st(x1, u * cs + v * sn);
      mf_st(x2, v * cs - u * sn);
    }
  }
}

template <typename T>
static mf_status rope(T *x, int64_t T_, int64_t nh, int64_t D, const int32_t *pos, const mf_rope_args &a,
                      int backward, cudaStream_t s) {
  mf_rope_plan p;
  MF_CHECK(mf_rope_plan_make(&a, D, &p));
  if (T_ <= 0 || nh <= 0 || p.half == 0) return MF_OK;
  rope_kernel<T><<<mf_cuda_grid(T_ * nh * p.half), MF_CUDA_BLOCK, 0, s>>>(x, T_, nh, D, pos, p, backward);
  MF_CUDA_CHECK_LAUNCH();
  return MF_OK;
}

template <typename T>
mf_status mf_cuda_rope_fwd(T *x, int64_t T_, int64_t nh, int64_t D, const int32_t *pos, mf_rope_args a,
                           cudaStream_t s) {
  return rope(x, T_, nh, D, pos, a, 0, s);
}

template <typename T>
mf_status mf_cuda_rope_bwd(T *dx, int64_t T_, int64_t nh, int64_t D, const int32_t *pos, mf_rope_args a,
                           cudaStream_t s) {
  return rope(dx, T_, nh, D, pos, a, 1, s);
}

// --------------------------------------------------------------- SwiGLU

template <typename T>
static __global__ void swiglu_fwd_kernel(const T *__restrict__ g, const T *__restrict__ u, int64_t n,
                                         bool vec, T *__restrict__ act) {
  constexpr int N = mf_vec<T>::n;
  GRID_STRIDE(k, (n + N - 1) / N) {
    const int64_t c = k * N;
    float gv[N], uv[N], av[N];
    ld_chunk<N>(g, c, n, vec, gv);
    ld_chunk<N>(u, c, n, vec, uv);
#pragma unroll
    for (int j = 0; j < N; j++) {
      const float gk = gv[j];
      const float silu = gk / (1.0f + expf(-gk));
      av[j] = silu * uv[j];
    }
    st_chunk<N>(act, c, n, vec, av);
  }
}

template <typename T>
static __global__ void swiglu_bwd_kernel(const T *__restrict__ g, const T *__restrict__ u,
                                         const T *__restrict__ dact, int64_t n, bool vec, T *__restrict__ dg,
                                         T *__restrict__ du) {
  constexpr int N = mf_vec<T>::n;
  GRID_STRIDE(k, (n + N - 1) / N) {
    const int64_t c = k * N;
    float gv[N], uv[N], dv[N], dgv[N], duv[N];
    ld_chunk<N>(g, c, n, vec, gv);
    ld_chunk<N>(u, c, n, vec, uv);
    ld_chunk<N>(dact, c, n, vec, dv);
#pragma unroll
    for (int j = 0; j < N; j++) {
      const float gk = gv[j], d = dv[j];
      const float e = expf(-gk);
      const float sg = 1.0f / (1.0f + e);
      const float silu = gk / (1.0f + e);
      const float dsilu = sg * (1.0f + gk * (1.0f - sg));
      dgv[j] = d * uv[j] * dsilu;
      duv[j] = d * silu;
    }
    st_chunk<N>(dg, c, n, vec, dgv);
    st_chunk<N>(du, c, n, vec, duv);
  }
}

template <typename T>
mf_status mf_cuda_swiglu_fwd(const T *g, const T *u, int64_t n, T *act, cudaStream_t s) {
  if (n <= 0) return MF_OK;
  const bool vec = aligned16(g) && aligned16(u) && aligned16(act);
  swiglu_fwd_kernel<T>
      <<<mf_cuda_grid((n + mf_vec<T>::n - 1) / mf_vec<T>::n), MF_CUDA_BLOCK, 0, s>>>(g, u, n, vec, act);
  MF_CUDA_CHECK_LAUNCH();
  return MF_OK;
}

template <typename T>
mf_status mf_cuda_swiglu_bwd(const T *g, const T *u, const T *dact, int64_t n, T *dg, T *du, cudaStream_t s) {
  if (n <= 0) return MF_OK;
  const bool vec = aligned16(g) && aligned16(u) && aligned16(dact) && aligned16(dg) && aligned16(du);
  swiglu_bwd_kernel<T><<<mf_cuda_grid((n + mf_vec<T>::n - 1) / mf_vec<T>::n), MF_CUDA_BLOCK, 0, s>>>(
      g, u, dact, n, vec, dg, du);
  MF_CUDA_CHECK_LAUNCH();
  return MF_OK;
}

// --------------------------------------------------------- sigmoid gate

static __device__ __forceinline__ float sigmoid_(float v) {
  return 1.0f / (1.0f + expf(-v));
}

template <typename T>
static __global__ void siggate_fwd_kernel(const T *__restrict__ gl, const T *__restrict__ x, int64_t R,
                                          int64_t C, bool vec, T *__restrict__ y) {
  constexpr int N = mf_vec<T>::n;
  const int64_t cpr = (C + N - 1) / N;  // chunks per row
  GRID_STRIDE(k, R * cpr) {
    const int64_t r = k / cpr, c = (k - r * cpr) * N;
    const float sg = sigmoid_(mf_ld(gl + r));
    float xv[N], yv[N];
    ld_chunk<N>(x + r * C, c, C, vec, xv);
    ld_chunk<N>(y + r * C, c, C, vec, yv);
#pragma unroll
    for (int j = 0; j < N; j++) yv[j] = yv[j] + sg * xv[j];
    st_chunk<N>(y + r * C, c, C, vec, yv);
  }
}

template <typename T>
static __global__ void siggate_bwd_kernel(const T *__restrict__ gl, const T *__restrict__ x,
                                          const T *__restrict__ dy, int64_t R, int64_t C, T *__restrict__ dx,
                                          T *__restrict__ dgl) {
  constexpr int N = mf_vec<T>::n;
  __shared__ float sh[MF_CUDA_BLOCK];
  __shared__ row_tile<T, 2> tile;
  for (int64_t r = blockIdx.x; r < R; r += gridDim.x) {
    const float sg = sigmoid_(mf_ld(gl + r));
    const T *xr = x + r * C, *dyr = dy + r * C;
    T *dxr = dx + r * C;
    const bool vec = aligned16(xr) && aligned16(dyr) && aligned16(dxr);
    const T *const in[2] = {dyr, xr};
    const float dot =
        row_sum(in, C, vec, tile, sh, [](int e, row_tile<T, 2> &t) { return t.row(0)[e] * t.row(1)[e]; });
    if (threadIdx.x == 0) mf_st(dgl + r, sg * (1.0f - sg) * dot);
    for (int64_t c = (int64_t)threadIdx.x * N; c < C; c += (int64_t)MF_CUDA_BLOCK * N) {
      float dyv[N], dxv[N];
      ld_chunk<N>(dyr, c, C, vec, dyv);
#pragma unroll
      for (int j = 0; j < N; j++) dxv[j] = sg * dyv[j];
      st_chunk<N>(dxr, c, C, vec, dxv);
    }
  }
}

template <typename T>
mf_status mf_cuda_sigmoid_gate_fwd(const T *gl, const T *x, int64_t R, int64_t C, T *y, cudaStream_t s) {
  constexpr int N = mf_vec<T>::n;
  if (R <= 0 || C <= 0) return MF_OK;
  const bool vec = C % N == 0 && aligned16(x) && aligned16(y);
  siggate_fwd_kernel<T><<<mf_cuda_grid(R * ((C + N - 1) / N)), MF_CUDA_BLOCK, 0, s>>>(gl, x, R, C, vec, y);
  MF_CUDA_CHECK_LAUNCH();
  return MF_OK;
}

template <typename T>
mf_status mf_cuda_sigmoid_gate_bwd(const T *gl, const T *x, const T *dy, int64_t R, int64_t C, T *dx, T *dgl,
                                   cudaStream_t s) {
  if (R <= 0) return MF_OK;
  siggate_bwd_kernel<T><<<mf_cuda_grid_rows(R), MF_CUDA_BLOCK, 0, s>>>(gl, x, dy, R, C, dx, dgl);
  MF_CUDA_CHECK_LAUNCH();
  return MF_OK;
}

// ------------------------------------------------------------------ add

template <typename T>
static __global__ void add_kernel(const T *__restrict__ x, int64_t n, bool vec, T *__restrict__ y) {
  constexpr int N = mf_vec<T>::n;
  GRID_STRIDE(k, (n + N - 1) / N) {
    const int64_t c = k * N;
    float xv[N], yv[N];
    ld_chunk<N>(x, c, n, vec, xv);
    ld_chunk<N>(y, c, n, vec, yv);
#pragma unroll
    for (int j = 0; j < N; j++) yv[j] = yv[j] + xv[j];
    st_chunk<N>(y, c, n, vec, yv);
  }
}

template <typename T>
mf_status mf_cuda_add(const T *x, int64_t n, T *y, cudaStream_t s) {
  if (n <= 0) return MF_OK;
  const bool vec = aligned16(x) && aligned16(y);
  add_kernel<T><<<mf_cuda_grid((n + mf_vec<T>::n - 1) / mf_vec<T>::n), MF_CUDA_BLOCK, 0, s>>>(x, n, vec, y);
  MF_CUDA_CHECK_LAUNCH();
  return MF_OK;
}

template <typename T>
static __global__ void scale_kernel(T *__restrict__ x, int64_t n, bool vec, float sc) {
  constexpr int N = mf_vec<T>::n;
  GRID_STRIDE(k, (n + N - 1) / N) {
    const int64_t c = k * N;
    float v[N];
    ld_chunk<N>(x, c, n, vec, v);
#pragma unroll
    for (int j = 0; j < N; j++) v[j] = v[j] * sc;
    st_chunk<N>(x, c, n, vec, v);
  }
}

template <typename T>
mf_status mf_cuda_scale(T *x, int64_t n, float sc, cudaStream_t s) {
  if (n <= 0) return MF_OK;
  scale_kernel<T>
      <<<mf_cuda_grid((n + mf_vec<T>::n - 1) / mf_vec<T>::n), MF_CUDA_BLOCK, 0, s>>>(x, n, aligned16(x), sc);
  MF_CUDA_CHECK_LAUNCH();
  return MF_OK;
}

template <typename T>
static __global__ void dropout_kernel(const T *__restrict__ x, int64_t n, uint64_t stream, uint64_t seed,
                                      uint32_t threshold, float sc, T *__restrict__ y) {
  GRID_STRIDE(k, n) {
    float v = 0.0f;
    if (mf_dropout_bits(seed, stream, (uint64_t)k) >= threshold) v = mf_ld(x + k) * sc;
    mf_st(y + k, v);
  }
}

template <typename T>
mf_status mf_cuda_dropout(const T *x, int64_t n, uint64_t stream, uint64_t seed, double p, T *y,
                          cudaStream_t s) {
  if (n <= 0) return MF_OK;
  if (!(p >= 0 && p < 1)) return MF_ERR(MF_ERR_INVALID_ARG, "dropout: p %g is outside [0, 1)", p);
  dropout_kernel<T><<<mf_cuda_grid(n), MF_CUDA_BLOCK, 0, s>>>(x, n, stream, seed, mf_dropout_threshold(p),
                                                              (float)(1.0 / (1.0 - p)), y);
  MF_CUDA_CHECK_LAUNCH();
  return MF_OK;
}

// Over received rows (mf_cpu_dropout_parts): each element finds its row's part by bisection of the
// segments; rows outside every part are zeros.
template <typename T>
static __global__ void dropout_parts_kernel(const T *__restrict__ x, int64_t n, uint64_t stream,
                                            uint32_t threshold, float sc, int64_t row,
                                            const int64_t *__restrict__ segments,
                                            const int64_t *__restrict__ starts,
                                            const int64_t *__restrict__ seeds, int64_t sources, int64_t parts,
                                            T *__restrict__ y) {
  GRID_STRIDE(k, n) {
    const int64_t r = k / row, c = k % row;
    float v = 0.0f;
    if (parts > 0 && r >= segments[0] && r < segments[parts]) {
      int64_t lo = 0, hi = parts;
      while (hi - lo > 1) {
        const int64_t mid = lo + (hi - lo) / 2;
        if (segments[mid] <= r)
          lo = mid;
        else
          hi = mid;
      }
      const uint64_t j = (uint64_t)((starts[lo] + r - segments[lo]) * row + c);
      if (mf_dropout_bits((uint64_t)seeds[lo % sources], stream, j) >= threshold) v = mf_ld(x + k) * sc;
    }
    mf_st(y + k, v);
  }
}

template <typename T>
mf_status mf_cuda_dropout_parts(const T *x, int64_t n, uint64_t stream, double p, int64_t row,
                                const int64_t *segments, const int64_t *starts, const int64_t *seeds,
                                int64_t sources, int64_t parts, T *y, cudaStream_t s) {
  if (n <= 0) return MF_OK;
  if (!(p >= 0 && p < 1)) return MF_ERR(MF_ERR_INVALID_ARG, "dropout: p %g is outside [0, 1)", p);
  MF_CHECK(mf_dropout_parts_sizes(n, row, sources, parts, segments && starts && seeds));
  dropout_parts_kernel<T><<<mf_cuda_grid(n), MF_CUDA_BLOCK, 0, s>>>(x, n, stream, mf_dropout_threshold(p),
                                                                    (float)(1.0 / (1.0 - p)), row, segments,
                                                                    starts, seeds, sources, parts, y);
  MF_CUDA_CHECK_LAUNCH();
  return MF_OK;
}

// ------------------------------------------------------ instantiations

#define MF_ELEMENTWISE_LAUNCHERS(T)                                                                          \
  template mf_status mf_cuda_embed_fwd<T>(const int32_t *, int64_t, const T *, int64_t, int64_t, T *,        \
                                          cudaStream_t);                                                     \
  template mf_status mf_cuda_embed_bwd<T>(const int32_t *, int64_t, const T *, int64_t, int64_t, float *,    \
                                          int32_t *, cudaStream_t);                                          \
  template mf_status mf_cuda_rmsnorm_fwd<T>(const T *, const T *, int64_t, int64_t, float, T *, float *,     \
                                            cudaStream_t);                                                   \
  template mf_status mf_cuda_rmsnorm_bwd<T>(const T *, const T *, const T *, const float *, int64_t,         \
                                            int64_t, T *, float *, int, float *, cudaStream_t);              \
  template mf_status mf_cuda_rope_fwd<T>(T *, int64_t, int64_t, int64_t, const int32_t *, mf_rope_args,      \
                                         cudaStream_t);                                                      \
  template mf_status mf_cuda_rope_bwd<T>(T *, int64_t, int64_t, int64_t, const int32_t *, mf_rope_args,      \
                                         cudaStream_t);                                                      \
  template mf_status mf_cuda_swiglu_fwd<T>(const T *, const T *, int64_t, T *, cudaStream_t);                \
  template mf_status mf_cuda_swiglu_bwd<T>(const T *, const T *, const T *, int64_t, T *, T *,               \
                                           cudaStream_t);                                                    \
  template mf_status mf_cuda_sigmoid_gate_fwd<T>(const T *, const T *, int64_t, int64_t, T *, cudaStream_t); \
  template mf_status mf_cuda_sigmoid_gate_bwd<T>(const T *, const T *, const T *, int64_t, int64_t, T *,     \
                                                 T *, cudaStream_t);                                         \
  template mf_status mf_cuda_add<T>(const T *, int64_t, T *, cudaStream_t);                                  \
  template mf_status mf_cuda_scale<T>(T *, int64_t, float, cudaStream_t);                                    \
  template mf_status mf_cuda_dropout<T>(const T *, int64_t, uint64_t, uint64_t, double, T *, cudaStream_t);  \
  template mf_status mf_cuda_dropout_parts<T>(const T *, int64_t, uint64_t, double, int64_t,                 \
                                              const int64_t *, const int64_t *, const int64_t *, int64_t,    \
                                              int64_t, T *, cudaStream_t);

MF_ELEMENTWISE_LAUNCHERS(float)
MF_ELEMENTWISE_LAUNCHERS(mf_bf16)
