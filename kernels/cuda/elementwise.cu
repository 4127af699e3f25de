// Elementwise and per-row ops of the cuda backend, fp32 storage and math; the
// maths is that of the cpu twins (kernels/cpu/{embedding,rmsnorm,rope,
// elementwise}.c), restated here with each kernel's thread mapping.
//
//   embed fwd   out[t,:] = table[ids[t],:]                 ids[T] table[V,H] out[T,H]
//               (V is not read: ids are trusted to lie in [0, V), as on the cpu)
//               one thread per output element (grid-stride).
//   embed bwd   dtable[ids[t],:] += dout[t,:]   (added)
//               one thread per column c, walking t = 0..T-1 in order: a row hit
//               by several tokens gets their gradients in token order, the cpu
//               twin's order, with no atomics (repeated ids never race).
//   rmsnorm fwd rstd[r] = 1/sqrt(mean_c x^2 + eps); y = w * (x*rstd)   x,y[R,C] w[C]
//               one block per row; the sum of squares is a block sum (fixed
//               tree). y may equal x: a row is read whole before it is written.
//   rmsnorm bwd xhat = x*rstd; m = mean_c(w*dy*xhat); dx = rstd*(w*dy - xhat*m)
//               (written, or added when accumulate): one block per row.
//               dw[c] += sum_r dy*xhat: the rows are cut into P blocks
//               (mf_cuda_rmsnorm_dw_parts, from R alone); thread (c, p) sums its
//               rows in order into scratch[p,c]; then thread c adds
//               scratch[0..P-1, c] in order to dw[c].
//   rope        in place on x[T,nh,D] (dx for bwd), i < D/2:
//               inv = 1/theta^((float)2i/(float)D), f = (float)pos[t]*inv, c = cos f, s = sin f;
//               fwd: x1' = x1*c - x2*s, x2' = x2*c + x1*s;  bwd: d1 = g1*c + g2*s,
//               d2 = g2*c - g1*s.  One thread per (t, head, i) pair.
//   swiglu      act = silu(g)*u; dg = dact*u*silu'(g), du = dact*silu(g), with
//               silu(g) = g/(1+e^-g), s = sigmoid(g), silu' = s*(1 + g*(1-s)).
//               One thread per element.
//   sigmoid_gate
//               fwd: y[r,:] += sigmoid(gl[r]) * x[r,:]   (added) one thread per element.
//               bwd: dx = s*dy (written); dgl[r] = s*(1-s)*dot(dy[r,:], x[r,:])
//               (written): one block per row, the dot a block sum.
//   add         y += x: one thread per element.
#include <cuda_runtime.h>
#include <stdint.h>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/ops.cuh"

#define GRID_STRIDE(i, n)                                                   \
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n); \
       i += (int64_t)gridDim.x * blockDim.x)

#define DW_MAX_PARTS 32
#define DW_ROWS_PER_PART 64

int64_t mf_cuda_rmsnorm_dw_parts(int64_t R) {
  int64_t p = (R + DW_ROWS_PER_PART - 1) / DW_ROWS_PER_PART;
  if (p > DW_MAX_PARTS) p = DW_MAX_PARTS;
  return p < 1 ? 1 : p;
}

// ------------------------------------------------------------ embedding

__global__ void embed_fwd_kernel(const int32_t *__restrict__ ids, const float *__restrict__ table, int64_t T,
                                 int64_t H, float *__restrict__ out) {
  GRID_STRIDE(i, T * H) {
    int64_t t = i / H, c = i - t * H;
    out[i] = table[(int64_t)ids[t] * H + c];
  }
}

__global__ void embed_bwd_kernel(const int32_t *__restrict__ ids, const float *__restrict__ dout, int64_t T,
                                 int64_t H, float *dtable) {
  GRID_STRIDE(c, H) {
    for (int64_t t = 0; t < T; t++) {
      float *d = dtable + (int64_t)ids[t] * H + c;
      *d = *d + dout[t * H + c];
    }
  }
}

mf_status mf_cuda_embed_fwd(const int32_t *ids, int64_t T, const float *table, int64_t V, int64_t H,
                            float *out, cudaStream_t s) {
  if (T <= 0 || H <= 0) return MF_OK;
  embed_fwd_kernel<<<mf_cuda_grid(T * H), MF_CUDA_BLOCK, 0, s>>>(ids, table, T, H, out);
  MF_CUDA_CHECK_LAUNCH();
  return MF_OK;
}

mf_status mf_cuda_embed_bwd(const int32_t *ids, int64_t T, const float *dout, int64_t V, int64_t H,
                            float *dtable, cudaStream_t s) {
  if (T <= 0 || H <= 0) return MF_OK;
  embed_bwd_kernel<<<mf_cuda_grid(H), MF_CUDA_BLOCK, 0, s>>>(ids, dout, T, H, dtable);
  MF_CUDA_CHECK_LAUNCH();
  return MF_OK;
}

// -------------------------------------------------------------- RMSNorm

__global__ void rmsnorm_fwd_kernel(const float *x, const float *__restrict__ w, int64_t R, int64_t C,
                                   float eps, float *y, float *__restrict__ rstd) {
  __shared__ float sh[MF_CUDA_BLOCK];
  for (int64_t r = blockIdx.x; r < R; r += gridDim.x) {
    const float *xr = x + r * C;
    float *yr = y + r * C;
    float part = 0.0f;
    for (int64_t c = threadIdx.x; c < C; c += MF_CUDA_BLOCK) part += xr[c] * xr[c];
    float ss = mf_block_sum(part, sh);  // also the barrier before y (which may be x) is written
    float ms = C > 0 ? ss / (float)C : 0.0f;
    float rs = 1.0f / sqrtf(ms + eps);
    if (threadIdx.x == 0) rstd[r] = rs;
    for (int64_t c = threadIdx.x; c < C; c += MF_CUDA_BLOCK) yr[c] = w[c] * (xr[c] * rs);
  }
}

__global__ void rmsnorm_bwd_dx_kernel(const float *__restrict__ dy, const float *__restrict__ x,
                                      const float *__restrict__ w, const float *__restrict__ rstd, int64_t R,
                                      int64_t C, float *__restrict__ dx, int accumulate) {
  __shared__ float sh[MF_CUDA_BLOCK];
  for (int64_t r = blockIdx.x; r < R; r += gridDim.x) {
    const float *xr = x + r * C, *dyr = dy + r * C;
    float *dxr = dx + r * C;
    const float rs = rstd[r];
    float part = 0.0f;
    for (int64_t c = threadIdx.x; c < C; c += MF_CUDA_BLOCK) part += (w[c] * dyr[c]) * (xr[c] * rs);
    float m = mf_block_sum(part, sh) / (float)C;
    for (int64_t c = threadIdx.x; c < C; c += MF_CUDA_BLOCK) {
      float v = rs * (w[c] * dyr[c] - (xr[c] * rs) * m);
      dxr[c] = accumulate ? dxr[c] + v : v;
    }
  }
}

// blockIdx.y = part p of P: rows [p*rb, min(R, (p+1)*rb)).
__global__ void rmsnorm_bwd_dw_part_kernel(const float *__restrict__ dy, const float *__restrict__ x,
                                           const float *__restrict__ rstd, int64_t R, int64_t C, int64_t rb,
                                           float *__restrict__ part) {
  const int64_t p = blockIdx.y;
  const int64_t r0 = p * rb, r1 = r0 + rb < R ? r0 + rb : R;
  GRID_STRIDE(c, C) {
    float acc = 0.0f;
    for (int64_t r = r0; r < r1; r++) acc += dy[r * C + c] * (x[r * C + c] * rstd[r]);
    part[p * C + c] = acc;
  }
}

__global__ void rmsnorm_bwd_dw_sum_kernel(const float *__restrict__ part, int64_t P, int64_t C,
                                          float *__restrict__ dw) {
  GRID_STRIDE(c, C) {
    float acc = 0.0f;
    for (int64_t p = 0; p < P; p++) acc += part[p * C + c];
    dw[c] += acc;
  }
}

mf_status mf_cuda_rmsnorm_fwd(const float *x, const float *w, int64_t R, int64_t C, float eps, float *y,
                              float *rstd, cudaStream_t s) {
  if (R <= 0) return MF_OK;
  rmsnorm_fwd_kernel<<<mf_cuda_grid_rows(R), MF_CUDA_BLOCK, 0, s>>>(x, w, R, C, eps, y, rstd);
  MF_CUDA_CHECK_LAUNCH();
  return MF_OK;
}

mf_status mf_cuda_rmsnorm_bwd(const float *dy, const float *x, const float *w, const float *rstd, int64_t R,
                              int64_t C, float *dx, float *dw, int accumulate, float *scratch,
                              cudaStream_t s) {
  if (R <= 0 || C <= 0) return MF_OK;
  rmsnorm_bwd_dx_kernel<<<mf_cuda_grid_rows(R), MF_CUDA_BLOCK, 0, s>>>(dy, x, w, rstd, R, C, dx, accumulate);
  MF_CUDA_CHECK_LAUNCH();
  const int64_t P = mf_cuda_rmsnorm_dw_parts(R);
  const int64_t rb = (R + P - 1) / P;
  dim3 grid(mf_cuda_grid(C), (unsigned)P);
  rmsnorm_bwd_dw_part_kernel<<<grid, MF_CUDA_BLOCK, 0, s>>>(dy, x, rstd, R, C, rb, scratch);
  MF_CUDA_CHECK_LAUNCH();
  rmsnorm_bwd_dw_sum_kernel<<<mf_cuda_grid(C), MF_CUDA_BLOCK, 0, s>>>(scratch, P, C, dw);
  MF_CUDA_CHECK_LAUNCH();
  return MF_OK;
}

// ----------------------------------------------------------------- RoPE

__global__ void rope_kernel(float *x, int64_t T, int64_t nh, int64_t D, const int32_t *__restrict__ pos,
                            float theta, int backward) {
  const int64_t half = D / 2;
  GRID_STRIDE(n, T * nh * half) {
    const int64_t i = n % half, th = n / half, t = th / nh;
    const float inv = 1.0f / powf(theta, (float)(2 * i) / (float)D);
    const float f = (float)pos[t] * inv;
    const float cs = cosf(f), sn = sinf(f);
    float *x1 = x + th * D + i;
    float *x2 = x1 + half;
    const float u = *x1, v = *x2;
    if (!backward) {
      *x1 = u * cs - v * sn;
      *x2 = v * cs + u * sn;
    } else {
      *x1 = u * cs + v * sn;
      *x2 = v * cs - u * sn;
    }
  }
}

static mf_status rope(float *x, int64_t T, int64_t nh, int64_t D, const int32_t *pos, float theta,
                      int backward, cudaStream_t s) {
  if (T <= 0 || nh <= 0 || D < 2) return MF_OK;
  rope_kernel<<<mf_cuda_grid(T * nh * (D / 2)), MF_CUDA_BLOCK, 0, s>>>(x, T, nh, D, pos, theta, backward);
  MF_CUDA_CHECK_LAUNCH();
  return MF_OK;
}

mf_status mf_cuda_rope_fwd(float *x, int64_t T, int64_t nh, int64_t D, const int32_t *pos, float theta,
                           cudaStream_t s) {
  return rope(x, T, nh, D, pos, theta, 0, s);
}

mf_status mf_cuda_rope_bwd(float *dx, int64_t T, int64_t nh, int64_t D, const int32_t *pos, float theta,
                           cudaStream_t s) {
  return rope(dx, T, nh, D, pos, theta, 1, s);
}

// --------------------------------------------------------------- SwiGLU

__global__ void swiglu_fwd_kernel(const float *__restrict__ g, const float *__restrict__ u, int64_t n,
                                  float *__restrict__ act) {
  GRID_STRIDE(k, n) {
    float gk = g[k];
    float silu = gk / (1.0f + expf(-gk));
    act[k] = silu * u[k];
  }
}

__global__ void swiglu_bwd_kernel(const float *__restrict__ g, const float *__restrict__ u,
                                  const float *__restrict__ dact, int64_t n, float *__restrict__ dg,
                                  float *__restrict__ du) {
  GRID_STRIDE(k, n) {
    float gk = g[k], d = dact[k];
    float e = expf(-gk);
    float sg = 1.0f / (1.0f + e);
    float silu = gk / (1.0f + e);
    float dsilu = sg * (1.0f + gk * (1.0f - sg));
    dg[k] = d * u[k] * dsilu;
    du[k] = d * silu;
  }
}

mf_status mf_cuda_swiglu_fwd(const float *g, const float *u, int64_t n, float *act, cudaStream_t s) {
  if (n <= 0) return MF_OK;
  swiglu_fwd_kernel<<<mf_cuda_grid(n), MF_CUDA_BLOCK, 0, s>>>(g, u, n, act);
  MF_CUDA_CHECK_LAUNCH();
  return MF_OK;
}

mf_status mf_cuda_swiglu_bwd(const float *g, const float *u, const float *dact, int64_t n, float *dg,
                             float *du, cudaStream_t s) {
  if (n <= 0) return MF_OK;
  swiglu_bwd_kernel<<<mf_cuda_grid(n), MF_CUDA_BLOCK, 0, s>>>(g, u, dact, n, dg, du);
  MF_CUDA_CHECK_LAUNCH();
  return MF_OK;
}

// --------------------------------------------------------- sigmoid gate

__device__ __forceinline__ float sigmoid_(float v) {
  return 1.0f / (1.0f + expf(-v));
}

__global__ void siggate_fwd_kernel(const float *__restrict__ gl, const float *__restrict__ x, int64_t R,
                                   int64_t C, float *__restrict__ y) {
  GRID_STRIDE(i, R * C) {
    float sg = sigmoid_(gl[i / C]);
    y[i] = y[i] + sg * x[i];
  }
}

__global__ void siggate_bwd_kernel(const float *__restrict__ gl, const float *__restrict__ x,
                                   const float *__restrict__ dy, int64_t R, int64_t C, float *__restrict__ dx,
                                   float *__restrict__ dgl) {
  __shared__ float sh[MF_CUDA_BLOCK];
  for (int64_t r = blockIdx.x; r < R; r += gridDim.x) {
    const float sg = sigmoid_(gl[r]);
    const float *xr = x + r * C, *dyr = dy + r * C;
    float *dxr = dx + r * C;
    float part = 0.0f;
    for (int64_t c = threadIdx.x; c < C; c += MF_CUDA_BLOCK) {
      part += dyr[c] * xr[c];
      dxr[c] = sg * dyr[c];
    }
    float dot = mf_block_sum(part, sh);
    if (threadIdx.x == 0) dgl[r] = sg * (1.0f - sg) * dot;
  }
}

mf_status mf_cuda_sigmoid_gate_fwd(const float *gl, const float *x, int64_t R, int64_t C, float *y,
                                   cudaStream_t s) {
  if (R <= 0 || C <= 0) return MF_OK;
  siggate_fwd_kernel<<<mf_cuda_grid(R * C), MF_CUDA_BLOCK, 0, s>>>(gl, x, R, C, y);
  MF_CUDA_CHECK_LAUNCH();
  return MF_OK;
}

mf_status mf_cuda_sigmoid_gate_bwd(const float *gl, const float *x, const float *dy, int64_t R, int64_t C,
                                   float *dx, float *dgl, cudaStream_t s) {
  if (R <= 0) return MF_OK;
  siggate_bwd_kernel<<<mf_cuda_grid_rows(R), MF_CUDA_BLOCK, 0, s>>>(gl, x, dy, R, C, dx, dgl);
  MF_CUDA_CHECK_LAUNCH();
  return MF_OK;
}

// ------------------------------------------------------------------ add

__global__ void add_kernel(const float *__restrict__ x, int64_t n, float *__restrict__ y) {
  GRID_STRIDE(k, n) y[k] = y[k] + x[k];
}

mf_status mf_cuda_add(const float *x, int64_t n, float *y, cudaStream_t s) {
  if (n <= 0) return MF_OK;
  add_kernel<<<mf_cuda_grid(n), MF_CUDA_BLOCK, 0, s>>>(x, n, y);
  MF_CUDA_CHECK_LAUNCH();
  return MF_OK;
}
