// MF_K_CROSS_ENTROPY on the GPU (kernels/cuda/ops.cuh): the cpu twin's
// definition (kernels/cpu/cross_entropy.c), chunked over the vocabulary so the
// [T, V] logits never exist, over fp32 or bf16 storage T: h [T, H], W [V, H]
// and dh [T, H] are T; ws [T, chunk], lse [T] and dW [V, H] are fp32.
//
//  1. per chunk: ws[T, vc] = h . W_chunk^T in fp32 (cuBLASLt,
//     mf_cuda_gemm<T, float>), then one block per token folds the chunk into the
//     token's running log-sum-exp in lse[t]: the chunk's max cm and sum
//     cs = sum exp(x - cm) (fixed trees), lse = cm + log(cs) on the first chunk,
//     else with mx = max(lse, cm): lse = mx + log(exp(lse - mx) + cs * exp(cm - mx)).
//  2. (dh present) per chunk: the same GEMM again (the same cached algorithm, so
//     the same logits), then one block per token turns its row of logits into
//     g = loss_scale * (exp(x - lse) - [v == target]) (0 for ignored tokens),
//     stored as T in the row's own bytes (below); dh (+)= g . W_chunk
//     (mf_cuda_gemm<T, T>, written by the first chunk, added after), and when dW
//     is present dW_chunk += g^T . h (mf_cuda_gemm<T, float>, beta 1).
//  3. one block per token: the target logit as a dot product in a fixed tree
//     into ws[t]; then one block sums lse[t] - ws[t] over the valid tokens in
//     double (a thread's strided partial sums, then a fixed tree) into
//     scalars[0], and the count into scalars[1].
//
// g in ws: cuBLASLt takes A and B of one type, so g enters the backward GEMMs
// as T. Token t's g[j] is stored at ((T *)(ws + t * chunk))[j]: in place for
// fp32 (ld = chunk), and for bf16 in the first half of the row's own bytes
// (ld = 2 * chunk bf16 values), where g[j] overwrites bytes of logit j / 2 —
// read already: the block reads a tile of 256 logits before it stores their g
// (a barrier between), and tiles go in order, so a store lands on a logit of
// this tile or of an earlier one.
//
// Rounding (bf16 storage): the logits, lse, the loss and dW stay fp32, as in
// the cpu twin; g is rounded to bf16 once, where it is stored (the twin keeps
// it fp32; PyTorch's bf16 training also holds the logits' gradient in bf16),
// and dh, added chunk by chunk into its bf16 self, is rounded once per
// vocabulary chunk (ceil(V / chunk) times; the twin rounds it once, when
// complete). The fp32 path computes exactly what it did before bf16 existed.
//
// Every reduction has a fixed order, so two runs give the same bits. The logits
// come from cuBLASLt (fp32 sums, TF32 off), so they differ from the cpu's in the
// last bits: outputs agree with the twin to a tolerance, not bit for bit.
//
// Targets are trusted like every other operand (the twin validates them; here a
// target outside [-1, V) is treated as ignored rather than read out of bounds).
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/ops.cuh"

__device__ __forceinline__ float block_max(float v, float *sh) {
  sh[threadIdx.x] = v;
  __syncthreads();
  for (int w = MF_CUDA_BLOCK / 2; w > 0; w >>= 1) {
    if ((int)threadIdx.x < w) sh[threadIdx.x] = fmaxf(sh[threadIdx.x], sh[threadIdx.x + w]);
    __syncthreads();
  }
  float r = sh[0];
  __syncthreads();
  return r;
}

// Pass 1: rows t of ws (row stride ld) hold the chunk's vc logits.
__global__ void ce_lse_chunk_kernel(const float *ws, int64_t T, int64_t ld, int64_t vc, int first,
                                    float *lse) {
  __shared__ float sh[MF_CUDA_BLOCK];
  for (int64_t t = blockIdx.x; t < T; t += gridDim.x) {
    const float *row = ws + t * ld;
    float m = -INFINITY;
    for (int64_t j = threadIdx.x; j < vc; j += MF_CUDA_BLOCK) m = fmaxf(m, row[j]);
    const float cm = block_max(m, sh);
    float s = 0.0f;
    for (int64_t j = threadIdx.x; j < vc; j += MF_CUDA_BLOCK) s += expf(row[j] - cm);
    const float cs = mf_block_sum(s, sh);
    if (threadIdx.x == 0) {
      if (first) {
        lse[t] = cm + logf(cs);
      } else {
        const float L = lse[t], mx = fmaxf(L, cm);
        lse[t] = mx + logf(expf(L - mx) + cs * expf(cm - mx));
      }
    }
  }
}

// Pass 2: row t of ws (stride ld floats) holds the chunk's vc logits; they
// become g, stored as G at ((G *)row)[j] (the header: tile by tile, each
// tile's logits read before a barrier, its g stored after).
template <typename G>
__global__ void ce_grad_kernel(float *ws, int64_t T, int64_t ld, int64_t v0, int64_t vc,
                               const int32_t *target, const float *lse, float scale, int64_t V) {
  for (int64_t t = blockIdx.x; t < T; t += gridDim.x) {
    const float *row = ws + t * ld;
    G *g = (G *)(ws + t * ld);
    const int32_t tg = target[t];
    const bool ignored = tg < 0 || tg >= V;
    const float L = ignored ? 0.0f : lse[t];
    for (int64_t j0 = 0; j0 < vc; j0 += MF_CUDA_BLOCK) {
      const int64_t j = j0 + threadIdx.x;
      float v = 0.0f;
      if (j < vc && !ignored) v = scale * (expf(row[j] - L) - (v0 + j == tg ? 1.0f : 0.0f));
      __syncthreads();
      if (j < vc) mf_st(g + j, v);
    }
  }
}

// Pass 3a: out[t] = h[t] . W[target[t]] (0 when ignored), in fp32.
template <typename T>
__global__ void ce_target_kernel(const T *h, const T *W, const int32_t *target, int64_t T_, int64_t H,
                                 int64_t V, float *out) {
  __shared__ float sh[MF_CUDA_BLOCK];
  for (int64_t t = blockIdx.x; t < T_; t += gridDim.x) {
    const int32_t tg = target[t];
    float s = 0.0f;
    if (tg >= 0 && tg < V) {
      const T *x = h + t * H, *w = W + (int64_t)tg * H;
      for (int64_t k = threadIdx.x; k < H; k += MF_CUDA_BLOCK) s = fmaf(mf_ld(x + k), mf_ld(w + k), s);
    }
    s = mf_block_sum(s, sh);
    if (threadIdx.x == 0) out[t] = s;
  }
}

// Pass 3b (one block): scalars = {sum over valid t of lse[t] - tl[t], count}.
__global__ void ce_loss_kernel(const float *lse, const float *tl, const int32_t *target, int64_t T, int64_t V,
                               double *scalars) {
  __shared__ double sh[MF_CUDA_BLOCK];
  double s = 0.0, c = 0.0;
  for (int64_t t = threadIdx.x; t < T; t += MF_CUDA_BLOCK) {
    const int32_t tg = target[t];
    if (tg < 0 || tg >= V) continue;
    s += (double)lse[t] - (double)tl[t];
    c += 1.0;
  }
  s = mf_block_sum(s, sh);
  c = mf_block_sum(c, sh);
  if (threadIdx.x == 0) {
    scalars[0] = s;
    scalars[1] = c;
  }
}

template <typename T>
mf_status mf_cuda_cross_entropy(const T *h, const T *W, const int32_t *target, int64_t T_, int64_t V,
                                int64_t H, int64_t chunk, float loss_scale, float *ws, float *lse,
                                double *scalars, T *dh, float *dW, mf_cuda_blas *b, cudaStream_t s) {
  if (T_ <= 0) {
    MF_CUDA_CHECK(cudaMemsetAsync(scalars, 0, 2 * sizeof(double), s));
    return MF_OK;
  }
  if (V <= 0 || H <= 0 || chunk <= 0)
    return MF_ERR(MF_ERR_INVALID_ARG, "cross-entropy: V=%lld H=%lld chunk=%lld", (long long)V, (long long)H,
                  (long long)chunk);
  const unsigned rows = mf_cuda_grid_rows(T_);
  for (int64_t v0 = 0; v0 < V; v0 += chunk) {
    const int64_t vc = V - v0 < chunk ? V - v0 : chunk;
    MF_CHECK((mf_cuda_gemm<T, float>(b, 0, 1, T_, vc, H, h, H, W + v0 * H, H, ws, chunk, 0, NULL, s)));
    ce_lse_chunk_kernel<<<rows, MF_CUDA_BLOCK, 0, s>>>(ws, T_, chunk, vc, v0 == 0, lse);
    MF_CUDA_CHECK_LAUNCH();
  }
  if (dh) {
    // g as T in ws (the header): row t at ws + t * chunk floats.
    const T *g = (const T *)ws;
    const int64_t ldg = chunk * (int64_t)(sizeof(float) / sizeof(T));
    for (int64_t v0 = 0; v0 < V; v0 += chunk) {
      const int64_t vc = V - v0 < chunk ? V - v0 : chunk;
      MF_CHECK((mf_cuda_gemm<T, float>(b, 0, 1, T_, vc, H, h, H, W + v0 * H, H, ws, chunk, 0, NULL, s)));
      ce_grad_kernel<T><<<rows, MF_CUDA_BLOCK, 0, s>>>(ws, T_, chunk, v0, vc, target, lse, loss_scale, V);
      MF_CUDA_CHECK_LAUNCH();
      // dh[T, H] (+)= g[T, vc] . W[v0.., H]
      MF_CHECK((mf_cuda_gemm<T, T>(b, 0, 0, T_, H, vc, g, ldg, W + v0 * H, H, dh, H, v0 > 0, NULL, s)));
      // dW[v0.., H] += g^T . h
      if (dW)
        MF_CHECK((mf_cuda_gemm<T, float>(b, 1, 0, vc, H, T_, g, ldg, h, H, dW + v0 * H, H, 1, NULL, s)));
    }
  }
  ce_target_kernel<T><<<rows, MF_CUDA_BLOCK, 0, s>>>(h, W, target, T_, H, V, ws);
  MF_CUDA_CHECK_LAUNCH();
  ce_loss_kernel<<<1, MF_CUDA_BLOCK, 0, s>>>(lse, ws, target, T_, V, scalars);
  MF_CUDA_CHECK_LAUNCH();
  return MF_OK;
}

template mf_status mf_cuda_cross_entropy<float>(const float *, const float *, const int32_t *, int64_t,
                                                int64_t, int64_t, int64_t, float, float *, float *, double *,
                                                float *, float *, mf_cuda_blas *, cudaStream_t);
template mf_status mf_cuda_cross_entropy<mf_bf16>(const mf_bf16 *, const mf_bf16 *, const int32_t *, int64_t,
                                                  int64_t, int64_t, int64_t, float, float *, float *,
                                                  double *, mf_bf16 *, float *, mf_cuda_blas *, cudaStream_t);
