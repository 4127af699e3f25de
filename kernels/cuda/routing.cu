// Routing ops of the cuda backend: the router, the token dispatch/permutation and
// the load-balancing loss. Maths and orders are the cpu twins' (kernels/cpu/
// router.c, moe.c, aux_loss.c); thread mappings:
//
//   router fwd   one thread per token row: softmax over E (max, expf, sum in e
//                order), top-k by insertion into a descending list (a later
//                expert displaces an earlier one only when strictly larger: ties
//                keep the lower index first), renorm by the sum in j order.
//   router bwd   one thread per token row, the twin's loop: dp = dprobs_extra (or
//                0) + the renorm backward, then dl = p*(dp - sum_e p*dp).
//   dispatch     stable counting sort, expert-major rows in (token, choice)
//                order. Kernel 1: block e counts the entries equal to e (integer
//                block counts). Kernel 2 (one thread): offsets = prefix sums.
//                Kernel 3: block e walks the entries in tiles of MF_CUDA_BLOCK;
//                an entry's row is offsets[e] + the entries equal to e before it
//                (earlier tiles, earlier warps, earlier lanes: ballot + popc).
//   gather       xe[r,h] = x[token_of_row[r],h]: one thread per element.
//   gather bwd   dx[t,h] (+)= sum_j dxe[row_of[t*K+j],h], j in order: one thread
//                per element of dx.
//   combine      y[t,h] += sum_j w[t,j]*ye[row_of[t*K+j],h], j in order: one
//                thread per element of y.
//   combine bwd  one block per (t, j): dye[row,:] = w[t,j]*dy[t,:] (written) and
//                dw[t,j] = dot(dy[t,:], ye[row,:]) as a block sum.
//   aux accum    one block per expert e: counts[e] += the entries equal to e
//                (integers); psum[e] += sum_t probs[t,e] in double: thread i sums
//                rows i, i+B, ... in order, then a fixed tree.
//   aux value    one thread: the twin's loop over e.
//   aux grad     one thread per element: coef*E*counts[e]/n_rows^2 (double), as float.
#include <cuda_runtime.h>
#include <stdint.h>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/ops.cuh"

#define GRID_STRIDE(i, n)                                                   \
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n); \
       i += (int64_t)gridDim.x * blockDim.x)

#define WARPS (MF_CUDA_BLOCK / 32)

// --------------------------------------------------------------- router

__global__ void router_fwd_kernel(const float *__restrict__ logits, int64_t T, int64_t E, int64_t K,
                                  int norm_topk, float *__restrict__ probs, int32_t *__restrict__ topk_idx,
                                  float *__restrict__ topk_w) {
  GRID_STRIDE(t, T) {
    const float *l = logits + t * E;
    float *p = probs + t * E;
    int32_t *idx = topk_idx + t * K;
    float *w = topk_w + t * K;
    float m = l[0];
    for (int64_t e = 1; e < E; e++) m = l[e] > m ? l[e] : m;
    float s = 0.0f;
    for (int64_t e = 0; e < E; e++) {
      p[e] = expf(l[e] - m);
      s += p[e];
    }
    for (int64_t e = 0; e < E; e++) p[e] = p[e] / s;
    int64_t n = 0;
    for (int64_t e = 0; e < E; e++) {
      float v = p[e];
      if (n == K && !(v > w[K - 1])) continue;
      int64_t j = n < K ? n++ : K - 1;
      while (j > 0 && v > w[j - 1]) {
        w[j] = w[j - 1];
        idx[j] = idx[j - 1];
        j--;
      }
      w[j] = v;
      idx[j] = (int32_t)e;
    }
    if (norm_topk) {
      float S = 0.0f;
      for (int64_t j = 0; j < K; j++) S += w[j];
      for (int64_t j = 0; j < K; j++) w[j] = w[j] / S;
    }
  }
}

__global__ void router_bwd_kernel(const float *__restrict__ probs, const int32_t *__restrict__ topk_idx,
                                  const float *__restrict__ topk_w, const float *__restrict__ dtopk_w,
                                  const float *__restrict__ dprobs_extra, int64_t T, int64_t E, int64_t K,
                                  int norm_topk, float *__restrict__ dlogits) {
  GRID_STRIDE(t, T) {
    const float *p = probs + t * E;
    const int32_t *idx = topk_idx + t * K;
    const float *w = topk_w + t * K;
    const float *g = dtopk_w + t * K;
    float *dp = dlogits + t * E;
    for (int64_t e = 0; e < E; e++) dp[e] = dprobs_extra ? dprobs_extra[t * E + e] : 0.0f;
    if (norm_topk) {
      float S = 0.0f, gw = 0.0f;
      for (int64_t j = 0; j < K; j++) S += p[idx[j]];
      for (int64_t j = 0; j < K; j++) gw += g[j] * w[j];
      for (int64_t j = 0; j < K; j++) dp[idx[j]] += (g[j] - gw) / S;
    } else {
      for (int64_t j = 0; j < K; j++) dp[idx[j]] += g[j];
    }
    float pd = 0.0f;
    for (int64_t e = 0; e < E; e++) pd += p[e] * dp[e];
    for (int64_t e = 0; e < E; e++) dp[e] = p[e] * (dp[e] - pd);
  }
}

mf_status mf_cuda_router_fwd(const float *logits, int64_t T, int64_t E, int64_t K, int norm_topk,
                             float *probs, int32_t *topk_idx, float *topk_w, cudaStream_t s) {
  if (T <= 0) return MF_OK;
  if (E <= 0 || K <= 0 || K > E)
    return MF_ERR(MF_ERR_INVALID_ARG, "router: K=%lld experts of E=%lld", (long long)K, (long long)E);
  router_fwd_kernel<<<mf_cuda_grid(T), MF_CUDA_BLOCK, 0, s>>>(logits, T, E, K, norm_topk, probs, topk_idx,
                                                              topk_w);
  MF_CUDA_CHECK_LAUNCH();
  return MF_OK;
}

mf_status mf_cuda_router_bwd(const float *probs, const int32_t *topk_idx, const float *topk_w,
                             const float *dtopk_w, const float *dprobs_extra, int64_t T, int64_t E, int64_t K,
                             int norm_topk, float *dlogits, cudaStream_t s) {
  if (T <= 0) return MF_OK;
  if (E <= 0 || K <= 0 || K > E)
    return MF_ERR(MF_ERR_INVALID_ARG, "router: K=%lld experts of E=%lld", (long long)K, (long long)E);
  router_bwd_kernel<<<mf_cuda_grid(T), MF_CUDA_BLOCK, 0, s>>>(probs, topk_idx, topk_w, dtopk_w, dprobs_extra,
                                                              T, E, K, norm_topk, dlogits);
  MF_CUDA_CHECK_LAUNCH();
  return MF_OK;
}

// ------------------------------------------------------------- dispatch

__global__ void dispatch_count_kernel(const int32_t *__restrict__ topk_idx, int64_t R,
                                      int64_t *__restrict__ counts) {
  const int32_t e = (int32_t)blockIdx.x;
  int64_t n = 0;
  for (int64_t base = 0; base < R; base += MF_CUDA_BLOCK) {
    const int64_t i = base + threadIdx.x;
    n += __syncthreads_count(i < R && topk_idx[i] == e);
  }
  if (threadIdx.x == 0) counts[e] = n;
}

__global__ void dispatch_offsets_kernel(const int64_t *__restrict__ counts, int64_t E,
                                        int64_t *__restrict__ offsets) {
  int64_t o = 0;
  offsets[0] = 0;
  for (int64_t e = 0; e < E; e++) {
    o += counts[e];
    offsets[e + 1] = o;
  }
}

__global__ void dispatch_fill_kernel(const int32_t *__restrict__ topk_idx, int64_t R, int64_t K,
                                     const int64_t *__restrict__ offsets, int32_t *__restrict__ row_of,
                                     int32_t *__restrict__ token_of_row) {
  __shared__ int warp_n[WARPS];
  const int32_t e = (int32_t)blockIdx.x;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int64_t next = offsets[e];  // the row of the next entry equal to e
  for (int64_t base = 0; base < R; base += MF_CUDA_BLOCK) {
    const int64_t i = base + threadIdx.x;
    const int hit = i < R && topk_idx[i] == e;
    const unsigned mask = __ballot_sync(0xffffffffu, hit);
    if (lane == 0) warp_n[warp] = __popc(mask);
    __syncthreads();
    int before = 0, total = 0;
    for (int w = 0; w < WARPS; w++) {
      before += w < warp ? warp_n[w] : 0;
      total += warp_n[w];
    }
    if (hit) {
      const int64_t r = next + before + __popc(mask & ((1u << lane) - 1u));
      row_of[i] = (int32_t)r;
      token_of_row[r] = (int32_t)(i / K);
    }
    next += total;
    __syncthreads();  // warp_n is rewritten by the next tile
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
  if (E > INT32_MAX) return MF_ERR(MF_ERR_INVALID_ARG, "moe dispatch: %lld experts", (long long)E);
  const int64_t R = T * K;
  dispatch_count_kernel<<<(unsigned)E, MF_CUDA_BLOCK, 0, s>>>(topk_idx, R, counts);
  MF_CUDA_CHECK_LAUNCH();
  dispatch_offsets_kernel<<<1, 1, 0, s>>>(counts, E, offsets);
  MF_CUDA_CHECK_LAUNCH();
  if (R == 0) return MF_OK;
  dispatch_fill_kernel<<<(unsigned)E, MF_CUDA_BLOCK, 0, s>>>(topk_idx, R, K, offsets, row_of, token_of_row);
  MF_CUDA_CHECK_LAUNCH();
  return MF_OK;
}

// ------------------------------------------------------ gather, combine

__global__ void gather_kernel(const float *__restrict__ x, const int32_t *__restrict__ token_of_row,
                              int64_t R, int64_t H, float *__restrict__ xe) {
  GRID_STRIDE(i, R * H) {
    const int64_t r = i / H, h = i - r * H;
    xe[i] = x[(int64_t)token_of_row[r] * H + h];
  }
}

__global__ void gather_bwd_kernel(const float *__restrict__ dxe, const int32_t *__restrict__ row_of,
                                  int64_t T, int64_t K, int64_t H, float *__restrict__ dx, int accumulate) {
  GRID_STRIDE(i, T * H) {
    const int64_t t = i / H, h = i - t * H;
    float acc = 0.0f;
    for (int64_t j = 0; j < K; j++) acc += dxe[(int64_t)row_of[t * K + j] * H + h];
    dx[i] = accumulate ? dx[i] + acc : acc;
  }
}

__global__ void combine_kernel(const float *__restrict__ ye, const float *__restrict__ w,
                               const int32_t *__restrict__ row_of, int64_t T, int64_t K, int64_t H,
                               float *__restrict__ y) {
  GRID_STRIDE(i, T * H) {
    const int64_t t = i / H, h = i - t * H;
    float acc = 0.0f;
    for (int64_t j = 0; j < K; j++) acc += w[t * K + j] * ye[(int64_t)row_of[t * K + j] * H + h];
    y[i] = y[i] + acc;
  }
}

__global__ void combine_bwd_kernel(const float *__restrict__ dy, const float *__restrict__ ye,
                                   const float *__restrict__ w, const int32_t *__restrict__ row_of, int64_t T,
                                   int64_t K, int64_t H, float *__restrict__ dye, float *__restrict__ dw) {
  __shared__ float sh[MF_CUDA_BLOCK];
  for (int64_t tj = blockIdx.x; tj < T * K; tj += gridDim.x) {
    const int64_t t = tj / K, r = row_of[tj];
    const float wj = w[tj];
    const float *g = dy + t * H, *src = ye + r * H;
    float *dst = dye + r * H;
    float part = 0.0f;
    for (int64_t h = threadIdx.x; h < H; h += MF_CUDA_BLOCK) {
      part += g[h] * src[h];
      dst[h] = wj * g[h];
    }
    const float d = mf_block_sum(part, sh);
    if (threadIdx.x == 0) dw[tj] = d;
  }
}

mf_status mf_cuda_moe_gather(const float *x, const int32_t *token_of_row, int64_t R, int64_t H, float *xe,
                             cudaStream_t s) {
  if (R <= 0 || H <= 0) return MF_OK;
  gather_kernel<<<mf_cuda_grid(R * H), MF_CUDA_BLOCK, 0, s>>>(x, token_of_row, R, H, xe);
  MF_CUDA_CHECK_LAUNCH();
  return MF_OK;
}

mf_status mf_cuda_moe_gather_bwd(const float *dxe, const int32_t *row_of, int64_t T, int64_t K, int64_t H,
                                 float *dx, int accumulate, cudaStream_t s) {
  if (T <= 0 || H <= 0) return MF_OK;
  gather_bwd_kernel<<<mf_cuda_grid(T * H), MF_CUDA_BLOCK, 0, s>>>(dxe, row_of, T, K, H, dx, accumulate);
  MF_CUDA_CHECK_LAUNCH();
  return MF_OK;
}

mf_status mf_cuda_moe_combine(const float *ye, const float *w, const int32_t *row_of, int64_t T, int64_t K,
                              int64_t H, float *y, cudaStream_t s) {
  if (T <= 0 || H <= 0) return MF_OK;
  combine_kernel<<<mf_cuda_grid(T * H), MF_CUDA_BLOCK, 0, s>>>(ye, w, row_of, T, K, H, y);
  MF_CUDA_CHECK_LAUNCH();
  return MF_OK;
}

mf_status mf_cuda_moe_combine_bwd(const float *dy, const float *ye, const float *w, const int32_t *row_of,
                                  int64_t T, int64_t K, int64_t H, float *dye, float *dw, cudaStream_t s) {
  if (T <= 0 || K <= 0) return MF_OK;
  combine_bwd_kernel<<<mf_cuda_grid_rows(T * K), MF_CUDA_BLOCK, 0, s>>>(dy, ye, w, row_of, T, K, H, dye, dw);
  MF_CUDA_CHECK_LAUNCH();
  return MF_OK;
}

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
