// Device AdamW and the gradient norm's chunk sums (kernels/cuda/backend_cuda.h).
//
// AdamW: one thread per element runs src/optim's element sequence
// (src/optim/adamw_tile.c, adamw_elem) operand for operand, with the
// step's coefficients computed on the host exactly as src/optim/adamw.c's
// make_coefs does (double pow, then fp32 roundings). Every operation is a
// round-to-nearest intrinsic (__fmul_rn, __fadd_rn, __fsub_rn, __fdiv_rn,
// __fsqrt_rn, __fmaf_rn), which nvcc never contracts or approximates, so the
// bits equal the host scalar body's, denormals included (no flush: the file is
// built without -ftz / --use_fast_math). bf16: widened exactly on load; stores
// round to nearest even with NaN kept quiet with its sign (mf_fp32_to_bf16).
//
// Clipping (mf_cuda_adamw_update_scaled, the backend's MF_K_ADAMW): the same
// thread first multiplies its gradient element by (float)coef with mul_ and
// stores it back (src/optim/clip.c chunk_scale: x *= (float)coef, one fp32
// multiply, x86's NaN bits), then updates from that value: one pass, the
// bits of mf_optim_grad_scale followed by the update.
//
// NaN bits. A GPU returns its one canonical NaN (0x7fffffff) from any operation
// that meets or makes a NaN; x86 returns the NaN operand, quieted, and makes the
// "indefinite" NaN 0xffc00000 from an invalid operation (0 * Inf, Inf - Inf,
// sqrt of a negative). Each operation here goes through x86_nan*, which gives
// the x86 answer: the first NaN operand in the source order, quieted, else the
// indefinite NaN. Where two different NaNs meet (the gradient and a moment both
// NaN, in the fmas) the host body's choice follows the instruction's operand
// order, which the C source does not pin down (optim.h); there only "NaN" is
// promised.
//
// Norm: per chunk of MF_CUDA_NORM_CHUNK elements, NORM_LANES lanes (element i
// of the chunk into lane i % NORM_LANES, each lane summed in order in double),
// lanes folded pairwise (lane t += lane t + h, h = NORM_LANES / 2 ... 1):
// src/optim/clip.c's chunk_sumsq, bit for bit. One block per chunk, a thread
// per lane. (With 8 lanes per chunk, as first built, a 2.9M-element gradient
// ran in 44 x 8 threads of 8192 serial adds: 0.29 ms, 40 GB/s on an H100, half
// of a 644M model's bf16 step.)
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "kernels/cuda/backend_cuda.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/ops.cuh"

#define NORM_LANES 1024 /* src/optim/optim.h MF_OPTIM_NORM_LANES */

typedef struct adamw_coefs {
  float decay, w1, w1_minus_1;
  int w1_small;
  float beta2, one_minus_b2, bc2_sqrt, eps, neg_step;
} adamw_coefs;

__device__ __forceinline__ uint16_t to_bf16(float f) {
  const uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x0040u);
  const uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)((u + rounding) >> 16);
}
__device__ __forceinline__ float from_bf16(uint16_t h) {
  return __uint_as_float((uint32_t)h << 16);
}

__device__ __forceinline__ float quiet(float a) {
  return __uint_as_float(__float_as_uint(a) | 0x00400000u);
}
// r = op(a, b) as computed here, with x86's NaN result.
__device__ __forceinline__ float x86_nan2(float r, float a, float b) {
  if (!isnan(r)) return r;
  if (isnan(a)) return quiet(a);
  if (isnan(b)) return quiet(b);
  return __uint_as_float(0xffc00000u);
}
__device__ __forceinline__ float x86_nan3(float r, float a, float b, float c) {
  if (!isnan(r)) return r;
  if (isnan(a)) return quiet(a);
  if (isnan(b)) return quiet(b);
  if (isnan(c)) return quiet(c);
  return __uint_as_float(0xffc00000u);
}
__device__ __forceinline__ float mul_(float a, float b) {
  return x86_nan2(__fmul_rn(a, b), a, b);
}
__device__ __forceinline__ float add_(float a, float b) {
  return x86_nan2(__fadd_rn(a, b), a, b);
}
__device__ __forceinline__ float sub_(float a, float b) {
  return x86_nan2(__fsub_rn(a, b), a, b);
}
__device__ __forceinline__ float div_(float a, float b) {
  return x86_nan2(__fdiv_rn(a, b), a, b);
}
__device__ __forceinline__ float sqrt_(float a) {
  return x86_nan2(__fsqrt_rn(a), a, 0.0f);
}
__device__ __forceinline__ float fma_(float a, float b, float c) {
  return x86_nan3(__fmaf_rn(a, b, c), a, b, c);
}

// SCALE: the gradient (fp32) is first multiplied by `scale` and stored back
// (mf_optim_grad_scale's x *= (float)coef, x86's NaN bits), and the update
// reads the scaled value: gw is g, writable. Otherwise gw is unused.
template <bool GBF, bool MBF, bool SCALE>
__global__ void adamw_kernel(const adamw_coefs c, float *p, const void *g, float *gw, float scale, void *m,
                             void *v, uint16_t *out, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x) {
    float gi;
    if (SCALE) {
      gi = mul_(gw[i], scale);
      gw[i] = gi;
    } else {
      gi = GBF ? from_bf16(((const uint16_t *)g)[i]) : ((const float *)g)[i];
    }
    const float m0 = MBF ? from_bf16(((const uint16_t *)m)[i]) : ((const float *)m)[i];
    const float v0 = MBF ? from_bf16(((const uint16_t *)v)[i]) : ((const float *)v)[i];
    const float pi = mul_(p[i], c.decay);
    const float d = sub_(gi, m0);
    const float mi = c.w1_small ? fma_(c.w1, d, m0) : fma_(c.w1_minus_1, d, gi);
    const float vi = fma_(mul_(c.one_minus_b2, gi), gi, mul_(v0, c.beta2));
    const float denom = add_(div_(sqrt_(vi), c.bc2_sqrt), c.eps);
    const float sum = add_(pi, div_(mul_(c.neg_step, mi), denom));
    const float pn = isnan(pi) ? pi : sum;
    if (MBF) {
      ((uint16_t *)m)[i] = to_bf16(mi);
      ((uint16_t *)v)[i] = to_bf16(vi);
    } else {
      ((float *)m)[i] = mi;
      ((float *)v)[i] = vi;
    }
    p[i] = pn;
    if (out) out[i] = to_bf16(pn);
  }
}

// The host update's argument checks (nothing launched on a failure), then the
// step's coefficients: src/optim/adamw.c make_coefs, step for step.
static mf_status adamw_coefs_of(const mf_cuda_adamw_step *h, adamw_coefs *c) {
  if (!h) return MF_ERR(MF_ERR_INVALID_ARG, "cuda adamw: no hyper-parameters given");
  if (h->step < 1)
    return MF_ERR(MF_ERR_INVALID_ARG, "cuda adamw: step %lld: steps count from 1", (long long)h->step);
  if (!(h->lr >= 0) || !isfinite(h->lr))
    return MF_ERR(MF_ERR_INVALID_ARG, "cuda adamw: lr %g: must be >= 0", h->lr);
  if (!(h->beta1 >= 0 && h->beta1 < 1))
    return MF_ERR(MF_ERR_INVALID_ARG, "cuda adamw: beta1 %g: must be in [0, 1)", h->beta1);
  if (!(h->beta2 >= 0 && h->beta2 < 1))
    return MF_ERR(MF_ERR_INVALID_ARG, "cuda adamw: beta2 %g: must be in [0, 1)", h->beta2);
  if (!(h->eps >= 0) || !isfinite(h->eps))
    return MF_ERR(MF_ERR_INVALID_ARG, "cuda adamw: eps %g: must be >= 0", h->eps);
  if (!(h->weight_decay >= 0) || !isfinite(h->weight_decay))
    return MF_ERR(MF_ERR_INVALID_ARG, "cuda adamw: weight_decay %g: must be >= 0", h->weight_decay);
  const double t = (double)h->step;
  const double bc1 = 1.0 - pow(h->beta1, t);
  const double bc2 = 1.0 - pow(h->beta2, t);
  const double step_size = h->lr / bc1;
  c->decay = (float)(1.0 - h->lr * h->weight_decay);
  c->w1 = (float)(1.0 - h->beta1);
  c->w1_minus_1 = c->w1 - 1.0f;
  c->w1_small = fabsf(c->w1) < 0.5f;
  c->beta2 = (float)h->beta2;
  c->one_minus_b2 = (float)(1.0 - h->beta2);
  c->bc2_sqrt = (float)pow(bc2, 0.5);
  c->eps = (float)h->eps;
  c->neg_step = (float)-step_size;
  return MF_OK;
}

static mf_status adamw_null_check(const float *param, const void *grad, const void *m, const void *v,
                                  size_t n) {
  if (!param || !grad || !m || !v)
    return MF_ERR(MF_ERR_INVALID_ARG,
                  "cuda adamw: %zu elements but a NULL buffer (param %p grad %p m %p v %p)", n,
                  (const void *)param, grad, m, v);
  return MF_OK;
}

extern "C" mf_status mf_cuda_adamw_update(const mf_cuda_adamw_step *h, float *param, const void *grad,
                                          int grad_bf16, void *m, void *v, int moment_bf16,
                                          uint16_t *bf16_out, size_t n, void *stream) {
  adamw_coefs c;
  MF_CHECK(adamw_coefs_of(h, &c));
  if (n == 0) return MF_OK;
  MF_CHECK(adamw_null_check(param, grad, m, v, n));
  cudaStream_t s = (cudaStream_t)stream;
  const unsigned grid = mf_cuda_grid((int64_t)n);
  const int64_t nn = (int64_t)n;
  if (grad_bf16 && moment_bf16)
    adamw_kernel<true, true, false>
        <<<grid, MF_CUDA_BLOCK, 0, s>>>(c, param, grad, NULL, 1.0f, m, v, bf16_out, nn);
  else if (grad_bf16)
    adamw_kernel<true, false, false>
        <<<grid, MF_CUDA_BLOCK, 0, s>>>(c, param, grad, NULL, 1.0f, m, v, bf16_out, nn);
  else if (moment_bf16)
    adamw_kernel<false, true, false>
        <<<grid, MF_CUDA_BLOCK, 0, s>>>(c, param, grad, NULL, 1.0f, m, v, bf16_out, nn);
  else
    adamw_kernel<false, false, false>
        <<<grid, MF_CUDA_BLOCK, 0, s>>>(c, param, grad, NULL, 1.0f, m, v, bf16_out, nn);
  MF_CUDA_CHECK_LAUNCH();
  return MF_OK;
}

extern "C" mf_status mf_cuda_adamw_update_scaled(const mf_cuda_adamw_step *h, float *param, float *grad,
                                                 double coef, void *m, void *v, int moment_bf16,
                                                 uint16_t *bf16_out, size_t n, void *stream) {
  if (!(coef < 1.0)) return mf_cuda_adamw_update(h, param, grad, 0, m, v, moment_bf16, bf16_out, n, stream);
  adamw_coefs c;
  MF_CHECK(adamw_coefs_of(h, &c));
  if (n == 0) return MF_OK;
  MF_CHECK(adamw_null_check(param, grad, m, v, n));
  const float scale = (float)coef; /* mf_optim_grad_scale's rounding of the factor */
  cudaStream_t s = (cudaStream_t)stream;
  const unsigned grid = mf_cuda_grid((int64_t)n);
  const int64_t nn = (int64_t)n;
  if (moment_bf16)
    adamw_kernel<false, true, true>
        <<<grid, MF_CUDA_BLOCK, 0, s>>>(c, param, grad, grad, scale, m, v, bf16_out, nn);
  else
    adamw_kernel<false, false, true>
        <<<grid, MF_CUDA_BLOCK, 0, s>>>(c, param, grad, grad, scale, m, v, bf16_out, nn);
  MF_CUDA_CHECK_LAUNCH();
  return MF_OK;
}

// 32 chunks per block, 8 lanes per chunk.
// One block per chunk, one thread per lane (NORM_LANES): lane t sums elements
// t, t + NORM_LANES, ... of the chunk in order, then the lanes fold pairwise in
// shared memory, h = NORM_LANES / 2 down to 1 (clip.c's chunk_sumsq).
__global__ void __launch_bounds__(NORM_LANES) sumsq_kernel(const float *g, int64_t n, double *sums) {
  __shared__ double sh[NORM_LANES];
  const int t = threadIdx.x;
  const int64_t b = (int64_t)blockIdx.x * (int64_t)MF_CUDA_NORM_CHUNK;
  const int64_t len = n - b < (int64_t)MF_CUDA_NORM_CHUNK ? n - b : (int64_t)MF_CUDA_NORM_CHUNK;
  const float *x = g + b;
  double a = 0.0;
#pragma unroll 8
  for (int64_t i = t; i < len; i += NORM_LANES) {
    const double xi = (double)x[i];
    a = __dadd_rn(a, __dmul_rn(xi, xi));
  }
  sh[t] = a;
  __syncthreads();
  for (int h = NORM_LANES / 2; h >= 1; h >>= 1) {
    if (t < h) sh[t] = __dadd_rn(sh[t], sh[t + h]);
    __syncthreads();
  }
  if (t == 0) sums[blockIdx.x] = sh[0];
}

extern "C" mf_status mf_cuda_grad_chunk_sumsq(const float *g, size_t n, double *sums, void *stream) {
  if (n == 0) return MF_OK;
  if (!g || !sums)
    return MF_ERR(MF_ERR_INVALID_ARG, "cuda gradient chunk sums: %zu elements but a NULL buffer", n);
  const int64_t n_chunks = (int64_t)((n + MF_CUDA_NORM_CHUNK - 1) / MF_CUDA_NORM_CHUNK);
  if (n_chunks > INT32_MAX)
    return MF_ERR(MF_ERR_INVALID_ARG, "cuda gradient chunk sums: %zu elements is too many", n);
  sumsq_kernel<<<(unsigned)n_chunks, NORM_LANES, 0, (cudaStream_t)stream>>>(g, (int64_t)n, sums);
  MF_CUDA_CHECK_LAUNCH();
  return MF_OK;
}
