// Routing ops of the cuda backend: the router, the token dispatch/permutation and
// the load-balancing loss. Maths and orders are the cpu twins' (kernels/cpu/
// router.c, moe.c, aux_loss.c).
//
// Storage (ops.cuh): the launchers of the router, gather, combine and their
// backward are templates over T (float or mf_bf16). Logits, x, xe, ye, y, dy,
// dye, dx, dxe, dtopk_w, dlogits and combine's dw are T: read widened to fp32,
// each stored value rounded once (mf_st). probs, topk_w, w and dprobs_extra are
// fp32 whatever T. All maths is fp32; the float instantiation is the fp32
// kernel bit for bit. Dispatch and the aux loss are untyped (indices, counts,
// fp32 probabilities).
//
// Thread mappings:
//   router fwd   one thread per token row: softmax over E (max, expf, sum in e
//                order), top-k by insertion into a descending list (a later
//                expert displaces an earlier one only when strictly larger: ties
//                keep the lower index first), renorm by the sum in j order.
//                Mode 1 (gpt-oss): the top-k of the logits by the same insertion,
//                their softmax (expf of v - v[0], sum in j order), then probs:
//                the softmax over E of the weights scattered into zeros.
//   router group one thread per token row, fwd and bwd: kernels/cpu/router_group.c's
//                loops (DeepSeek-V3's sigmoid router, group-limited top-k).
//   router bwd   one thread per token row, the twin's loop: dp = dprobs_extra (or
//                0) + the renorm backward, then dl = p*(dp - sum_e p*dp). dp[e] is
//                recomputed where it is used (the twin's adds, in j order), so no
//                fp32 row of scratch is needed and dlogits is only stored.
//                Mode 1: pd = sum_e p*dprobs_extra, dw[j] = g[j] + p[i]*(x[i] - pd)
//                at i = idx[j], the row zeroed, then dl[idx[j]] = w[j]*(dw[j] -
//                sum_i w[i]*dw[i]) (the twin's loops).
//   dispatch     stable counting sort, expert-major rows in (token, choice) order,
//                over tiles of `tile` entries of topk_idx (a multiple of 256, at
//                least 2E), NB tiles, no float atomics and no serial scan of the
//                entries:
//                1. count: block b counts its tile's entries per expert in shared
//                   memory (integer atomics: a count does not depend on order) and
//                   writes the table cnt[e*NB + b] (expert-major).
//                2. scan (one block, over E*NB <= max(R, E) table entries): the
//                   table's exclusive prefix sum in place; entry (e, b) becomes
//                   the first row of expert e's entries of tile b; offsets[e] =
//                   entry (e, 0), counts from the offsets.
//                3. place: one warp per tile walks it in order, 32 entries at a
//                   time: an entry's row is its expert's cursor (from the table)
//                   plus its rank among the equal entries of earlier lanes
//                   (__match_any_sync); the first of them advances the cursor
//                   by their number.
//                4. scatter: token_of_row[row_of[i]] = i / K, one thread per entry.
//                The table lives in token_of_row (NB*E <= R when NB > 1, as tile
//                >= 2E) until step 4 overwrites it; with one tile it lives in
//                counts (its E int32s fit in E int64s), read before counts is
//                written. Entries outside [0, E) (the cpu twin refuses them; a
//                kernel cannot) are in no count and get row_of = -1.
//   gather       xe[r,:] = x[token_of_row[r],:]: one thread per chunk of
//                mf_vec<T>::n elements of a row (16 bytes).
//   gather bwd   dx[t,:] (+)= sum_j dxe[row_of[t*K+j],:], j in order: one thread
//                per chunk of a row of dx (rows_sum_kernel, unweighted).
//   combine      y[t,:] += sum_j w[t,j]*ye[row_of[t*K+j],:], j in order: one
//                thread per chunk of a row of y (rows_sum_kernel, weighted).
//   combine bwd  one block per (t, j): dye[row,:] = w[t,j]*dy[t,:] (written) and
//                dw[t,j] = dot(dy[t,:], ye[row,:]): thread i sums h = i, i+B, ...
//                in order, then a fixed tree. The rows are read in chunks into
//                shared memory, from which each thread takes its strided terms.
//   aux accum    one block per expert e: counts[e] += the entries equal to e
//                (integers); psum[e] += sum_t probs[t,e] in double: thread i sums
//                rows i, i+B, ... in order, then a fixed tree.
//   aux value    one thread: the twin's loop over e.
//   aux grad     one thread per element: coef*E*counts[e]/n_rows^2 (double), as float.
//
// A chunk is read or written with one 16-byte access where its address is
// 16-byte aligned and it is whole, element by element otherwise (a row's tail,
// rows of a width that leaves them unaligned).
#include <cuda_runtime.h>
#include <stdint.h>

#include "kernels/cuda/cuda_check.h"
#include "kernels/topk.h"
#include "kernels/cuda/ops.cuh"

#define GRID_STRIDE(i, n)                                                   \
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n); \
       i += (int64_t)gridDim.x * blockDim.x)

#define WARPS (MF_CUDA_BLOCK / 32)

// ------------------------------------------------------------ row chunks

__device__ __forceinline__ bool aligned16(const void *p) {
  return ((uintptr_t)p & 15u) == 0;
}

// Elements [0, n) of the chunk at p (n <= mf_vec<T>::n), widened into v.
template <typename T>
__device__ __forceinline__ void ld_chunk(const T *p, int n, float (&v)[mf_vec<T>::n]) {
  constexpr int VN = mf_vec<T>::n;
  if (n == VN && aligned16(p)) {
    const uint4 u = *reinterpret_cast<const uint4 *>(p);
    const T *e = reinterpret_cast<const T *>(&u);
#pragma unroll
    for (int k = 0; k < VN; k++) v[k] = mf_ld(e + k);
  } else {
#pragma unroll
    for (int k = 0; k < VN; k++) v[k] = k < n ? mf_ld(p + k) : 0.0f;
  }
}

// v[0, n) stored into the chunk at p, each value rounded once (mf_st).
template <typename T>
__device__ __forceinline__ void st_chunk(T *p, int n, const float (&v)[mf_vec<T>::n]) {
  constexpr int VN = mf_vec<T>::n;
  if (n == VN && aligned16(p)) {
    uint4 u;
    T *e = reinterpret_cast<T *>(&u);
#pragma unroll
    for (int k = 0; k < VN; k++) mf_st(e + k, v[k]);
    *reinterpret_cast<uint4 *>(p) = u;
  } else {
#pragma unroll
    for (int k = 0; k < VN; k++)
      if (k < n) mf_st(p + k, v[k]);
  }
}

// Elements [0, n) of the chunk at src copied to dst as they are.
template <typename T>
__device__ __forceinline__ void copy_chunk(const T *src, T *dst, int n) {
  constexpr int VN = mf_vec<T>::n;
  if (n == VN && aligned16(src) && aligned16(dst)) {
    *reinterpret_cast<uint4 *>(dst) = *reinterpret_cast<const uint4 *>(src);
  } else {
#pragma unroll
    for (int k = 0; k < VN; k++)
      if (k < n) dst[k] = src[k];
  }
}

// Chunks of a row of H elements of T.
template <typename T>
__host__ __device__ __forceinline__ int64_t chunks_of(int64_t H) {
  return (H + mf_vec<T>::n - 1) / mf_vec<T>::n;
}

// Elements of the chunk at h of a row of H.
template <typename T>
__device__ __forceinline__ int chunk_len(int64_t H, int64_t h) {
  return H - h < mf_vec<T>::n ? (int)(H - h) : mf_vec<T>::n;
}

// --------------------------------------------------------------- router

// Mode 1's row: kernels/topk.h's body, the logits read from storage T.
#define LD_T(l, e) mf_ld((l) + (e))
MF_ROUTER_TOPK_FIRST_ROW(template <typename T> __device__, router_fwd_row_topk_first, T, LD_T)
#undef LD_T

template <typename T>
__global__ void router_fwd_kernel(const T *__restrict__ logits, int64_t T_, int64_t E, int64_t K,
                                  int norm_topk, int mode, float *__restrict__ probs,
                                  int32_t *__restrict__ topk_idx, float *__restrict__ topk_w) {
  GRID_STRIDE(t, T_) {
    const T *l = logits + t * E;
    float *p = probs + t * E;
    int32_t *idx = topk_idx + t * K;
    float *w = topk_w + t * K;
    if (mode == 1) {
      router_fwd_row_topk_first(l, E, K, p, idx, w);
      continue;
    }
    float m = mf_ld(l);
    for (int64_t e = 1; e < E; e++) {
      const float le = mf_ld(l + e);
      m = le > m ? le : m;
    }
    float s = 0.0f;
    for (int64_t e = 0; e < E; e++) {
      p[e] = expf(mf_ld(l + e) - m);
      s += p[e];
    }
    for (int64_t e = 0; e < E; e++) p[e] = p[e] / s;
    int64_t n = 0;
    for (int64_t e = 0; e < E; e++) mf_topk_insert(p[e], (int32_t)e, w, idx, &n, K);
    if (norm_topk) {
      float S = 0.0f;
      for (int64_t j = 0; j < K; j++) S += w[j];
      for (int64_t j = 0; j < K; j++) w[j] = w[j] / S;
    }
  }
}

// dp[e] of one row as the twin forms it: dprobs_extra (or 0), then the renorm
// backward's term of each choice j with idx[j] == e, in j order.
template <typename T>
__device__ __forceinline__ float router_dp(int64_t e, const float *extra, const int32_t *idx, const T *g,
                                           int64_t K, int norm_topk, float S, float gw) {
  float dp = extra ? extra[e] : 0.0f;
  for (int64_t j = 0; j < K; j++)
    if (idx[j] == e) dp += norm_topk ? (mf_ld(g + j) - gw) / S : mf_ld(g + j);
  return dp;
}

// Mode 1's dw[j] (kernels/cpu/router.c topk_first_dw).
template <typename T>
__device__ __forceinline__ float topk_first_dw(const float *p, const float *x, float pd, const int32_t *idx,
                                               const T *g, int64_t j) {
  return x ? mf_ld(g + j) + p[idx[j]] * (x[idx[j]] - pd) : mf_ld(g + j);
}

template <typename T>
__device__ void router_bwd_row_topk_first(const float *p, const int32_t *idx, const float *w, const T *g,
                                          const float *x, int64_t E, int64_t K, T *dl) {
  float pd = 0.0f, wd = 0.0f;
  if (x)
    for (int64_t e = 0; e < E; e++) pd += p[e] * x[e];
  for (int64_t j = 0; j < K; j++) wd += w[j] * topk_first_dw(p, x, pd, idx, g, j);
  for (int64_t e = 0; e < E; e++) mf_st(dl + e, 0.0f);
  for (int64_t j = 0; j < K; j++) mf_st(dl + idx[j], w[j] * (topk_first_dw(p, x, pd, idx, g, j) - wd));
}

template <typename T>
__global__ void router_bwd_kernel(const float *__restrict__ probs, const int32_t *__restrict__ topk_idx,
                                  const float *__restrict__ topk_w, const T *__restrict__ dtopk_w,
                                  const float *__restrict__ dprobs_extra, int64_t T_, int64_t E, int64_t K,
                                  int norm_topk, int mode, T *__restrict__ dlogits) {
  GRID_STRIDE(t, T_) {
    const float *p = probs + t * E;
    const int32_t *idx = topk_idx + t * K;
    const float *w = topk_w + t * K;
    const T *g = dtopk_w + t * K;
    const float *extra = dprobs_extra ? dprobs_extra + t * E : nullptr;
    if (mode == 1) {
      router_bwd_row_topk_first(p, idx, w, g, extra, E, K, dlogits + t * E);
      continue;
    }
    float S = 0.0f, gw = 0.0f;
    if (norm_topk) {
      for (int64_t j = 0; j < K; j++) S += p[idx[j]];
      for (int64_t j = 0; j < K; j++) gw += mf_ld(g + j) * w[j];
    }
    float pd = 0.0f;
    for (int64_t e = 0; e < E; e++) pd += p[e] * router_dp(e, extra, idx, g, K, norm_topk, S, gw);
    T *dl = dlogits + t * E;
    for (int64_t e = 0; e < E; e++)
      mf_st(dl + e, p[e] * (router_dp(e, extra, idx, g, K, norm_topk, S, gw) - pd));
  }
}

static mf_status check_router(int64_t E, int64_t K) {
  if (E <= 0 || K <= 0 || K > E)
    return MF_ERR(MF_ERR_INVALID_ARG, "router: K=%lld experts of E=%lld", (long long)K, (long long)E);
  return MF_OK;
}

static mf_status check_mode(int mode) {
  if (mode != 0 && mode != 1)
    return MF_ERR(MF_ERR_INVALID_ARG,
                  "router: mode %d (0: softmax then top-k, 1: gpt-oss's top-k then softmax)", mode);
  return MF_OK;
}

template <typename T>
mf_status mf_cuda_router_fwd(const T *logits, int64_t T_, int64_t E, int64_t K, int norm_topk, int mode,
                             float *probs, int32_t *topk_idx, float *topk_w, cudaStream_t s) {
  if (T_ <= 0) return MF_OK;
  MF_CHECK(check_router(E, K));
  MF_CHECK(check_mode(mode));
  router_fwd_kernel<T>
      <<<mf_cuda_grid(T_), MF_CUDA_BLOCK, 0, s>>>(logits, T_, E, K, norm_topk, mode, probs, topk_idx, topk_w);
  MF_CUDA_CHECK_LAUNCH();
  return MF_OK;
}

template <typename T>
mf_status mf_cuda_router_bwd(const float *probs, const int32_t *topk_idx, const float *topk_w,
                             const T *dtopk_w, const float *dprobs_extra, int64_t T_, int64_t E, int64_t K,
                             int norm_topk, int mode, T *dlogits, cudaStream_t s) {
  if (T_ <= 0) return MF_OK;
  MF_CHECK(check_router(E, K));
  MF_CHECK(check_mode(mode));
  router_bwd_kernel<T><<<mf_cuda_grid(T_), MF_CUDA_BLOCK, 0, s>>>(
      probs, topk_idx, topk_w, dtopk_w, dprobs_extra, T_, E, K, norm_topk, mode, dlogits);
  MF_CUDA_CHECK_LAUNCH();
  return MF_OK;
}

// ------------------------------------------------- group-limited router

// DeepSeek-V3's and GLM-4.5's router, one thread per token row, the cpu twin's
// loops (kernels/cpu/router_group.c): sigmoid scores, the kept groups by the
// sum of their two best choice scores, the top-k by insertion (a later expert
// displaces an earlier one only when strictly larger), the weights normalised
// in j order and scaled.
#define GROUP_ROUTER_GROUPS_MAX 64

template <typename T>
__global__ void router_group_fwd_kernel(const T *__restrict__ logits, const T *__restrict__ bias, int64_t T_,
                                        int64_t E, int64_t K, int64_t G, int64_t TG, int norm_topk, float scaling,
                                        float *__restrict__ scores, int32_t *__restrict__ topk_idx,
                                        float *__restrict__ topk_w) {
  GRID_STRIDE(t, T_) {
    const T *l = logits + t * E;
    float *s = scores + t * E;
    int32_t *idx = topk_idx + t * K;
    float *w = topk_w + t * K;
    const int64_t per = E / G;
    for (int64_t e = 0; e < E; e++) s[e] = 1.0f / (1.0f + expf(-mf_ld(l + e)));
    uint8_t kept[GROUP_ROUTER_GROUPS_MAX];
    for (int64_t g = 0; g < G; g++) kept[g] = G == 1 || TG >= G;
    if (G > 1 && TG < G) {
      float gw[GROUP_ROUTER_GROUPS_MAX];
      int32_t gi[GROUP_ROUTER_GROUPS_MAX];
      int64_t ng = 0;
      for (int64_t g = 0; g < G; g++) {
        float top[2];
        int32_t ti[2];
        int64_t n = 0;
        for (int64_t e = g * per; e < (g + 1) * per; e++)
          mf_topk_insert(s[e] + (bias ? mf_ld(bias + e) : 0.0f), (int32_t)e, top, ti, &n, 2);
        mf_topk_insert(top[0] + top[1], (int32_t)g, gw, gi, &ng, TG);
      }
      for (int64_t j = 0; j < ng; j++) kept[gi[j]] = 1;
    }
    int64_t n = 0;
    for (int64_t e = 0; e < E; e++) {
      const float c = kept[e / per] ? s[e] + (bias ? mf_ld(bias + e) : 0.0f) : 0.0f;
      mf_topk_insert(c, (int32_t)e, w, idx, &n, K);
    }
    for (int64_t j = 0; j < K; j++) w[j] = s[idx[j]];
    if (norm_topk) {
      float S = 0.0f;
      for (int64_t j = 0; j < K; j++) S += w[j];
      S += 1e-20f;
      for (int64_t j = 0; j < K; j++) w[j] = w[j] / S;
    }
    for (int64_t j = 0; j < K; j++) w[j] = w[j] * scaling;
  }
}

template <typename T>
__global__ void router_group_bwd_kernel(const float *__restrict__ scores, const int32_t *__restrict__ topk_idx,
                                        const T *__restrict__ dtopk_w, int64_t T_, int64_t E, int64_t K,
                                        int norm_topk, float scaling, T *__restrict__ dlogits) {
  GRID_STRIDE(t, T_) {
    const float *s = scores + t * E;
    const int32_t *idx = topk_idx + t * K;
    const T *g = dtopk_w + t * K;
    T *dl = dlogits + t * E;
    float D = 0.0f, us = 0.0f;
    if (norm_topk) {
      for (int64_t j = 0; j < K; j++) D += s[idx[j]];
      D += 1e-20f;
      for (int64_t j = 0; j < K; j++) us += mf_ld(g + j) * scaling * s[idx[j]];
    }
    for (int64_t e = 0; e < E; e++) {
      float d = 0.0f;
      for (int64_t j = 0; j < K; j++)
        if (idx[j] == e) d = norm_topk ? (mf_ld(g + j) * scaling - us / D) / D : mf_ld(g + j) * scaling;
      mf_st(dl + e, d * s[e] * (1.0f - s[e]));
    }
  }
}

static mf_status check_router_group(int64_t E, int64_t K, int64_t G, int64_t TG) {
  MF_CHECK(check_router(E, K));
  if (G < 1 || G > GROUP_ROUTER_GROUPS_MAX || E % G != 0 || (G > 1 && E / G < 2))
    return MF_ERR(MF_ERR_INVALID_ARG,
                  "group router: n_group %lld must divide E=%lld into groups of 2 or more, at most %d groups",
                  (long long)G, (long long)E, GROUP_ROUTER_GROUPS_MAX);
  if (TG < 1 || TG > G || TG * (E / G) < K)
    return MF_ERR(MF_ERR_INVALID_ARG, "group router: topk_group %lld of %lld groups of %lld cannot hold K=%lld",
                  (long long)TG, (long long)G, (long long)(E / G), (long long)K);
  return MF_OK;
}

template <typename T>
mf_status mf_cuda_router_group_fwd(const T *logits, const T *bias, int64_t T_, int64_t E, int64_t K,
                                   int64_t n_group, int64_t topk_group, int norm_topk, float scaling, float *scores,
                                   int32_t *topk_idx, float *topk_w, cudaStream_t s) {
  MF_CHECK(check_router_group(E, K, n_group, topk_group));
  if (T_ <= 0) return MF_OK;
  router_group_fwd_kernel<T><<<mf_cuda_grid(T_), MF_CUDA_BLOCK, 0, s>>>(
      logits, bias, T_, E, K, n_group, topk_group, norm_topk, scaling, scores, topk_idx, topk_w);
  MF_CUDA_CHECK_LAUNCH();
  return MF_OK;
}

template <typename T>
mf_status mf_cuda_router_group_bwd(const float *scores, const int32_t *topk_idx, const T *dtopk_w, int64_t T_,
                                   int64_t E, int64_t K, int norm_topk, float scaling, T *dlogits,
                                   cudaStream_t s) {
  MF_CHECK(check_router(E, K));
  if (T_ <= 0) return MF_OK;
  router_group_bwd_kernel<T><<<mf_cuda_grid(T_), MF_CUDA_BLOCK, 0, s>>>(scores, topk_idx, dtopk_w, T_, E, K,
                                                                        norm_topk, scaling, dlogits);
  MF_CUDA_CHECK_LAUNCH();
  return MF_OK;
}

// ------------------------------------------------------------- dispatch

// Experts a dispatch can take: per-expert int counters in (the default 48 KiB
// of) shared memory.
#define DISPATCH_MAX_E (48 * 1024 / (int64_t)sizeof(int))
// Entries a placement warp loads ahead (one per lane each).
#define DISPATCH_AHEAD 8

// Entries of topk_idx per tile: whole placement rounds, and at least 2E so that
// NB > 1 tiles' table (NB*E ints) fits in token_of_row (R ints).
static int64_t dispatch_tile(int64_t E) {
  const int64_t step = 32 * DISPATCH_AHEAD;
  const int64_t t = (2 * E + step - 1) / step * step;
  return t > step ? t : step;
}

__global__ void dispatch_count_kernel(const int32_t *__restrict__ topk_idx, int64_t R, int64_t E,
                                      int64_t tile, int64_t NB, int32_t *__restrict__ table) {
  extern __shared__ int hist[];  // [E]
  const int64_t b = blockIdx.x;
  for (int64_t e = threadIdx.x; e < E; e += MF_CUDA_BLOCK) hist[e] = 0;
  __syncthreads();
  const int64_t i1 = (b + 1) * tile < R ? (b + 1) * tile : R;
  for (int64_t i = b * tile + threadIdx.x; i < i1; i += MF_CUDA_BLOCK) {
    const int32_t e = topk_idx[i];
    if (e >= 0 && e < E) atomicAdd(&hist[e], 1);
  }
  __syncthreads();
  for (int64_t e = threadIdx.x; e < E; e += MF_CUDA_BLOCK) table[e * NB + b] = hist[e];
}

// Exclusive prefix sum of one int per thread over the block (every thread
// calls it); *total: the block's sum. warp_sum: WARPS ints of shared memory.
__device__ __forceinline__ int block_exclusive_scan(int v, int *warp_sum, int *total) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int inc = mf_warp_inclusive_scan(v);
  if (lane == 31) warp_sum[warp] = inc;
  __syncthreads();
  int before = 0, all = 0;
  for (int w = 0; w < WARPS; w++) {
    before += w < warp ? warp_sum[w] : 0;
    all += warp_sum[w];
  }
  __syncthreads();  // warp_sum is rewritten by the next call
  *total = all;
  return before + inc - v;
}

// One block: table[0, n) := its exclusive prefix sums (n = E*NB, expert-major),
// then offsets[e] = table[e*NB], offsets[E] = the total, counts[e] =
// offsets[e+1] - offsets[e] (counts written last: the table may live there).
__global__ void dispatch_scan_kernel(int32_t *table, int64_t n, int64_t E, int64_t NB, int64_t *counts,
                                     int64_t *__restrict__ offsets) {
  constexpr int ITEMS = 16;
  __shared__ int warp_sum[WARPS];
  int carry = 0;
  for (int64_t base = 0; base < n; base += (int64_t)MF_CUDA_BLOCK * ITEMS) {
    const int64_t x0 = base + (int64_t)threadIdx.x * ITEMS;
    int v[ITEMS], sum = 0;
#pragma unroll
    for (int k = 0; k < ITEMS; k++) {
      v[k] = x0 + k < n ? table[x0 + k] : 0;
      sum += v[k];
    }
    int total;
    int run = carry + block_exclusive_scan(sum, warp_sum, &total);
#pragma unroll
    for (int k = 0; k < ITEMS; k++) {
      if (x0 + k < n) table[x0 + k] = run;
      run += v[k];
    }
    carry += total;
  }
  __syncthreads();
  for (int64_t e = threadIdx.x; e <= E; e += MF_CUDA_BLOCK) offsets[e] = e < E ? table[e * NB] : carry;
  __syncthreads();
  for (int64_t e = threadIdx.x; e < E; e += MF_CUDA_BLOCK) counts[e] = offsets[e + 1] - offsets[e];
}

// One warp per tile: row_of of its entries in order (see the top).
__global__ void dispatch_place_kernel(const int32_t *__restrict__ topk_idx, int64_t R, int64_t E,
                                      int64_t tile, int64_t NB, const int32_t *__restrict__ table,
                                      const int64_t *__restrict__ offsets, int32_t *__restrict__ row_of) {
  extern __shared__ int cursor[];  // [E]: the row of each expert's next entry
  const int64_t b = blockIdx.x;
  const int lane = threadIdx.x;
  // Tile 0's first rows are the offsets (with one tile the table is gone).
  for (int64_t e = lane; e < E; e += 32) cursor[e] = b == 0 ? (int)offsets[e] : table[e * NB + b];
  __syncwarp();
  const int64_t i1 = (b + 1) * tile < R ? (b + 1) * tile : R;
  for (int64_t c0 = b * tile; c0 < i1; c0 += 32 * DISPATCH_AHEAD) {
    int32_t ev[DISPATCH_AHEAD];
#pragma unroll
    for (int k = 0; k < DISPATCH_AHEAD; k++) {
      const int64_t i = c0 + 32 * k + lane;
      ev[k] = i < i1 ? topk_idx[i] : -1;
    }
#pragma unroll
    for (int k = 0; k < DISPATCH_AHEAD; k++) {
      const int64_t i = c0 + 32 * k + lane;
      const int32_t e = ev[k];
      const bool valid = i < i1 && e >= 0 && e < E;
      const unsigned peers = __match_any_sync(0xffffffffu, valid ? e : -1);
      const int rank = __popc(peers & ((1u << lane) - 1u));
      const int r = valid ? cursor[e] + rank : -1;
      __syncwarp();  // every lane has read its cursor
      if (valid && rank == 0) cursor[e] += __popc(peers);
      __syncwarp();
      if (i < i1) row_of[i] = r;
    }
  }
}

__global__ void dispatch_scatter_kernel(const int32_t *__restrict__ row_of, int64_t R, int64_t K,
                                        int32_t *__restrict__ token_of_row) {
  GRID_STRIDE(i, R) {
    const int32_t r = row_of[i];
    if (r >= 0) token_of_row[r] = (int32_t)(i / K);
  }
}

mf_status mf_cuda_moe_dispatch(const int32_t *topk_idx, int64_t T, int64_t K, int64_t E, int64_t *counts,
                               int64_t *offsets, int32_t *row_of, int32_t *token_of_row, cudaStream_t s) {
  if (E <= 0 || K <= 0 || T < 0)
    return MF_ERR(MF_ERR_INVALID_ARG, "moe dispatch: T=%lld K=%lld E=%lld", (long long)T, (long long)K,
                  (long long)E);
  if (T * K > INT32_MAX)
    return MF_ERR(MF_ERR_INVALID_ARG, "moe dispatch: %lld rows do not fit int32 row indices",
                  (long long)(T * K));
  if (E > DISPATCH_MAX_E)
    return MF_ERR(MF_ERR_UNSUPPORTED, "moe dispatch: %lld experts; the cuda kernel takes at most %lld",
                  (long long)E, (long long)DISPATCH_MAX_E);
  const int64_t R = T * K, tile = dispatch_tile(E);
  const int64_t NB = R > tile ? (R + tile - 1) / tile : 1;
  int32_t *table = NB > 1 ? token_of_row : (int32_t *)counts;
  const size_t smem = (size_t)E * sizeof(int);
  dispatch_count_kernel<<<(unsigned)NB, MF_CUDA_BLOCK, smem, s>>>(topk_idx, R, E, tile, NB, table);
  MF_CUDA_CHECK_LAUNCH();
  dispatch_scan_kernel<<<1, MF_CUDA_BLOCK, 0, s>>>(table, E * NB, E, NB, counts, offsets);
  MF_CUDA_CHECK_LAUNCH();
  if (R == 0) return MF_OK;
  dispatch_place_kernel<<<(unsigned)NB, 32, smem, s>>>(topk_idx, R, E, tile, NB, table, offsets, row_of);
  MF_CUDA_CHECK_LAUNCH();
  dispatch_scatter_kernel<<<mf_cuda_grid(R), MF_CUDA_BLOCK, 0, s>>>(row_of, R, K, token_of_row);
  MF_CUDA_CHECK_LAUNCH();
  return MF_OK;
}

// ------------------------------------------------------ gather, combine

template <typename T>
__global__ void gather_kernel(const T *__restrict__ x, const int32_t *__restrict__ token_of_row, int64_t R,
                              int64_t H, T *__restrict__ xe) {
  const int64_t nc = chunks_of<T>(H);
  GRID_STRIDE(i, R * nc) {
    const int64_t r = i / nc, h = (i - r * nc) * mf_vec<T>::n;
    copy_chunk(x + (int64_t)token_of_row[r] * H + h, xe + r * H + h, chunk_len<T>(H, h));
  }
}

// dst[t,:] = (accumulate ? dst[t,:] : 0) + sum_j c_j * src[row_of[t*K+j],:], j
// in order, c_j = w[t*K+j] when WEIGHTED (combine: acc += w*v), else 1 (gather
// bwd: acc += v, no product).
template <typename T, bool WEIGHTED>
__global__ void rows_sum_kernel(const T *__restrict__ src, const float *__restrict__ w,
                                const int32_t *__restrict__ row_of, int64_t T_, int64_t K, int64_t H,
                                T *__restrict__ dst, int accumulate) {
  constexpr int VN = mf_vec<T>::n;
  const int64_t nc = chunks_of<T>(H);
  GRID_STRIDE(i, T_ * nc) {
    const int64_t t = i / nc, h = (i - t * nc) * VN;
    const int n = chunk_len<T>(H, h);
    float acc[VN], v[VN];
#pragma unroll
    for (int k = 0; k < VN; k++) acc[k] = 0.0f;
    for (int64_t j = 0; j < K; j++) {
      ld_chunk(src + (int64_t)row_of[t * K + j] * H + h, n, v);
      if (WEIGHTED) {
        const float wj = w[t * K + j];
#pragma unroll
        for (int k = 0; k < VN; k++) acc[k] += wj * v[k];
      } else {
#pragma unroll
        for (int k = 0; k < VN; k++) acc[k] += v[k];
      }
    }
    T *d = dst + t * H + h;
    if (accumulate) {
      ld_chunk(d, n, v);
#pragma unroll
      for (int k = 0; k < VN; k++) acc[k] = v[k] + acc[k];
    }
    st_chunk(d, n, acc);
  }
}

// Each round, thread i reads chunk i of the round's MF_CUDA_BLOCK chunks of dy
// and ye (writing that chunk of dye) into shared memory; then thread i adds the
// round's terms h = i, i+B, i+2B, ... in order: the sum of today's fp32 kernel
// (thread i: h = i, i+B, ... over the row), whatever the chunk width.
template <typename T>
__global__ void combine_bwd_kernel(const T *__restrict__ dy, const T *__restrict__ ye,
                                   const float *__restrict__ w, const int32_t *__restrict__ row_of,
                                   int64_t T_, int64_t K, int64_t H, T *__restrict__ dye,
                                   T *__restrict__ dw) {
  constexpr int VN = mf_vec<T>::n, ROUND = MF_CUDA_BLOCK * VN;
  __shared__ float sh[MF_CUDA_BLOCK];
  __shared__ __align__(16) float gs[ROUND], ys[ROUND];
  for (int64_t tj = blockIdx.x; tj < T_ * K; tj += gridDim.x) {
    const int64_t t = tj / K, r = row_of[tj];
    const float wj = w[tj];
    const T *g = dy + t * H, *src = ye + r * H;
    T *dst = dye + r * H;
    float part = 0.0f;
    for (int64_t h0 = 0; h0 < H; h0 += ROUND) {
      const int64_t h = h0 + (int64_t)threadIdx.x * VN;
      if (h < H) {
        const int n = chunk_len<T>(H, h);
        float gv[VN], yv[VN], dv[VN];
        ld_chunk(g + h, n, gv);
        ld_chunk(src + h, n, yv);
#pragma unroll
        for (int k = 0; k < VN; k++) dv[k] = wj * gv[k];
        st_chunk(dst + h, n, dv);
#pragma unroll
        for (int k = 0; k < VN; k += 4) {
          reinterpret_cast<float4 *>(gs + threadIdx.x * VN)[k / 4] =
              make_float4(gv[k], gv[k + 1], gv[k + 2], gv[k + 3]);
          reinterpret_cast<float4 *>(ys + threadIdx.x * VN)[k / 4] =
              make_float4(yv[k], yv[k + 1], yv[k + 2], yv[k + 3]);
        }
      }
      __syncthreads();
#pragma unroll
      for (int m = 0; m < VN; m++) {
        const int x = (int)threadIdx.x + MF_CUDA_BLOCK * m;
        if (h0 + x < H) part += gs[x] * ys[x];
      }
      __syncthreads();  // gs, ys are rewritten by the next round
    }
    const float d = mf_block_sum(part, sh);
    if (threadIdx.x == 0) mf_st(dw + tj, d);
  }
}

template <typename T>
mf_status mf_cuda_moe_gather(const T *x, const int32_t *token_of_row, int64_t R, int64_t H, T *xe,
                             cudaStream_t s) {
  if (R <= 0 || H <= 0) return MF_OK;
  gather_kernel<T><<<mf_cuda_grid(R * chunks_of<T>(H)), MF_CUDA_BLOCK, 0, s>>>(x, token_of_row, R, H, xe);
  MF_CUDA_CHECK_LAUNCH();
  return MF_OK;
}

template <typename T>
mf_status mf_cuda_moe_gather_bwd(const T *dxe, const int32_t *row_of, int64_t T_, int64_t K, int64_t H, T *dx,
                                 int accumulate, cudaStream_t s) {
  if (T_ <= 0 || H <= 0) return MF_OK;
  rows_sum_kernel<T, false><<<mf_cuda_grid(T_ * chunks_of<T>(H)), MF_CUDA_BLOCK, 0, s>>>(
      dxe, nullptr, row_of, T_, K, H, dx, accumulate);
  MF_CUDA_CHECK_LAUNCH();
  return MF_OK;
}

template <typename T>
mf_status mf_cuda_moe_combine(const T *ye, const float *w, const int32_t *row_of, int64_t T_, int64_t K,
                              int64_t H, T *y, cudaStream_t s) {
  if (T_ <= 0 || H <= 0) return MF_OK;
  rows_sum_kernel<T, true>
      <<<mf_cuda_grid(T_ * chunks_of<T>(H)), MF_CUDA_BLOCK, 0, s>>>(ye, w, row_of, T_, K, H, y, 1);
  MF_CUDA_CHECK_LAUNCH();
  return MF_OK;
}

template <typename T>
mf_status mf_cuda_moe_combine_bwd(const T *dy, const T *ye, const float *w, const int32_t *row_of, int64_t T_,
                                  int64_t K, int64_t H, T *dye, T *dw, cudaStream_t s) {
  if (T_ <= 0 || K <= 0) return MF_OK;
  combine_bwd_kernel<T>
      <<<mf_cuda_grid_rows(T_ * K), MF_CUDA_BLOCK, 0, s>>>(dy, ye, w, row_of, T_, K, H, dye, dw);
  MF_CUDA_CHECK_LAUNCH();
  return MF_OK;
}

// Both storages of every typed launcher.
#define ROUTING_INSTANTIATE(T)                                                                               \
  template mf_status mf_cuda_router_fwd<T>(const T *, int64_t, int64_t, int64_t, int, int, float *,         \
                                           int32_t *, float *, cudaStream_t);                                \
  template mf_status mf_cuda_router_bwd<T>(const float *, const int32_t *, const float *, const T *,         \
                                           const float *, int64_t, int64_t, int64_t, int, int, T *,          \
                                           cudaStream_t);                                                    \
  template mf_status mf_cuda_router_group_fwd<T>(const T *, const T *, int64_t, int64_t, int64_t,        \
                                                 int64_t, int64_t, int, float, float *, int32_t *, float *,  \
                                                 cudaStream_t);                                              \
  template mf_status mf_cuda_router_group_bwd<T>(const float *, const int32_t *, const T *, int64_t, int64_t, \
                                                 int64_t, int, float, T *, cudaStream_t);                    \
  template mf_status mf_cuda_moe_gather<T>(const T *, const int32_t *, int64_t, int64_t, T *, cudaStream_t); \
  template mf_status mf_cuda_moe_gather_bwd<T>(const T *, const int32_t *, int64_t, int64_t, int64_t, T *,   \
                                               int, cudaStream_t);                                           \
  template mf_status mf_cuda_moe_combine<T>(const T *, const float *, const int32_t *, int64_t, int64_t,     \
                                            int64_t, T *, cudaStream_t);                                     \
  template mf_status mf_cuda_moe_combine_bwd<T>(const T *, const T *, const float *, const int32_t *,        \
                                                int64_t, int64_t, int64_t, T *, T *, cudaStream_t);
ROUTING_INSTANTIATE(float)
ROUTING_INSTANTIATE(mf_bf16)
#undef ROUTING_INSTANTIATE

// ------------------------------------------------------------- aux loss

__global__ void aux_accumulate_kernel(const float *__restrict__ probs, const int32_t *__restrict__ topk_idx,
                                      int64_t T, int64_t E, int64_t K, int64_t *__restrict__ counts,
                                      double *__restrict__ psum) {
  __shared__ double sh[MF_CUDA_BLOCK];
  const int64_t e = blockIdx.x;
  int64_t n = 0;
  for (int64_t base = 0; base < T * K; base += MF_CUDA_BLOCK) {
    const int64_t i = base + threadIdx.x;
    n += __syncthreads_count(i < T * K && topk_idx[i] == e);
  }
  double part = 0.0;
  for (int64_t t = threadIdx.x; t < T; t += MF_CUDA_BLOCK) part += (double)probs[t * E + e];
  const double total = mf_block_sum(part, sh);
  if (threadIdx.x == 0) {
    counts[e] += n;
    psum[e] += total;
  }
}

__global__ void aux_value_kernel(const int64_t *__restrict__ counts, const double *__restrict__ psum,
                                 int64_t E, int64_t n_rows, double *__restrict__ out) {
  if (n_rows <= 0) {
    out[0] = 0.0;
    return;
  }
  const double N = (double)n_rows;
  double s = 0.0;
  for (int64_t e = 0; e < E; e++) s += ((double)counts[e] / N) * (psum[e] / N);
  out[0] = (double)E * s;
}

__global__ void aux_grad_kernel(const int64_t *__restrict__ counts, int64_t E, int64_t n_rows, double coef,
                                int64_t T, float *__restrict__ dprobs) {
  const double N = (double)n_rows;
  GRID_STRIDE(i, T * E) {
    const int64_t e = i % E;
    dprobs[i] = (float)(coef * (double)E * (double)counts[e] / (N * N));
  }
}

mf_status mf_cuda_aux_accumulate(const float *probs, const int32_t *topk_idx, int64_t T, int64_t E, int64_t K,
                                 int64_t *counts, double *psum, cudaStream_t s) {
  if (E <= 0 || T <= 0) return MF_OK;
  if (E > INT32_MAX) return MF_ERR(MF_ERR_INVALID_ARG, "aux loss: %lld experts", (long long)E);
  aux_accumulate_kernel<<<(unsigned)E, MF_CUDA_BLOCK, 0, s>>>(probs, topk_idx, T, E, K, counts, psum);
  MF_CUDA_CHECK_LAUNCH();
  return MF_OK;
}

mf_status mf_cuda_aux_value(const int64_t *counts, const double *psum, int64_t E, int64_t n_rows, double *aux,
                            cudaStream_t s) {
  aux_value_kernel<<<1, 1, 0, s>>>(counts, psum, E, n_rows, aux);
  MF_CUDA_CHECK_LAUNCH();
  return MF_OK;
}

mf_status mf_cuda_aux_grad(const int64_t *counts, int64_t E, int64_t n_rows, double coef, int64_t T,
                           float *dprobs, cudaStream_t s) {
  if (T <= 0 || E <= 0) return MF_OK;
  if (n_rows <= 0) return MF_ERR(MF_ERR_INVALID_ARG, "aux loss gradient over %lld rows", (long long)n_rows);
  aux_grad_kernel<<<mf_cuda_grid(T * E), MF_CUDA_BLOCK, 0, s>>>(counts, E, n_rows, coef, T, dprobs);
  MF_CUDA_CHECK_LAUNCH();
  return MF_OK;
}
