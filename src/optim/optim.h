/*
 * moefit optim: the reference host AdamW, learning-rate schedules and global-norm
 * gradient clipping, on fp32 buffers in host memory.
 *
 * AdamW is torch.optim.AdamW's single-tensor update (torch 2.x, CPU tensors,
 * foreach=False, amsgrad=False, maximize=False), element by element, for step
 * t >= 1 (t counts the updates this parameter has had, this one included):
 *
 *   p  = p * (float)(1 - lr*wd)                       param.mul_(1 - lr*wd)
 *   m  = lerp(m, g, (float)(1 - beta1))               exp_avg.lerp_(grad, 1 - beta1)
 *   v  = fma((float)(1-beta2) * g, g, v * (float)beta2) exp_avg_sq.mul_(b2).addcmul_(g, g, 1 - b2)
 *   bc1 = 1 - pow(beta1, t), bc2 = 1 - pow(beta2, t)  (double, as Python floats)
 *   step_size = lr / bc1, bc2_sqrt = pow(bc2, 0.5)    (double: bc2 ** 0.5)
 *   denom = sqrtf(v) / (float)bc2_sqrt + (float)eps
 *   p  = p + ((float)(-step_size) * m) / denom        param.addcdiv_(m, denom, value=-step_size)
 *
 * NaN: a NaN p (after the decay) stays that NaN (the add would otherwise
 * return whichever of two NaN operands the compiler put first). Elsewhere
 * two different NaNs meet only in the fmas, when the gradient and a moment are
 * both NaN; there every body returns the same one today (the special-value
 * tests in tests/optim check it), not by a rule the C code pins down.
 *
 * Tensor ops are fp32 with each scalar rounded to fp32, as ATen does. lerp is
 * torch's two-sided form: w = (float)(1 - beta1); |w| < 0.5: m = fma(w, g - m, m),
 * else m = fma(w - 1, g - m, g). Torch's AVX2/AVX-512 CPU kernels (what a pip
 * build runs on any current x86) fuse lerp and addcmul into one rounding (fma);
 * moefit does the same on every CPU. Checked against torch 2.15 on x86
 * (tests/optim/adamw_torch.bin): m and v are bit-identical; p is bit-identical
 * once torch's Tensor.sqrt is swapped for a correctly rounded one. Stock torch
 * computes that sqrt with MKL VML (high-accuracy mode: within 1 ulp, off in
 * about 1 case of 5), so against it p differs in ~0.15% of elements per step,
 * by at most an ulp of the update.
 *
 * Other dtypes (mf_adamw_update_bufs). The gradient may be bf16 and the two
 * moments may be stored as bf16 (2 bytes each instead of 4). A bf16 value is
 * widened exactly to fp32 (its 16 bits above 16 zero bits) where the body
 * loads it; from there every element runs the fp32 sequence above,
 * unchanged: m_new and v_new come from the widened stored m and v and the
 * widened gradient, and the new p is computed from the fp32 m_new and v_new
 * (not from their rounded copies). Then m and v are stored as
 * mf_fp32_to_bf16(m_new) and mf_fp32_to_bf16(v_new): round to nearest even
 * (a value past the largest bf16 rounds to Inf), NaN kept as a quiet NaN with
 * its sign. Nothing else is rounded to bf16 (p stays fp32; the bf16 working
 * copy is the rounded new p, as with fp32 buffers). So with fp32 buffers the
 * result is mf_adamw_update's, bit for bit, and every body and thread count
 * gives the same bits for every dtype combination.
 *
 * Parallel updates split [0, n) into fixed tiles (mf_partition with a
 * cache-sized grain); every element's arithmetic is independent of the split,
 * so results are bit-identical for any thread count. The loop body exists in
 * variants (portable scalar; the same body built for AVX2+FMA and vectorized by
 * the compiler; hand-written AVX-512 and AVX2 intrinsics), all bit-identical to each
 * other, one chosen once from the CPU's flags. `pool` must not be the pool
 * whose worker is calling (its run does not nest).
 *
 * Gradient norms are sums of squares in double, per fixed chunk of
 * MF_OPTIM_NORM_CHUNK elements of each buffer (MF_OPTIM_NORM_LANES interleaved
 * lanes, each summed in order, folded pairwise in a fixed tree: clip.c), then
 * chunk sums added in order, buffer by buffer — the same bits
 * for any thread count. A square of an fp32 value cannot overflow a double, so
 * the norm is finite exactly when every gradient element is.
 */
#ifndef MF_OPTIM_H
#define MF_OPTIM_H

#include <stddef.h>
#include <stdint.h>

#include "src/config/config.h"
#include "src/core/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ----------------------------------------------------------------- AdamW */

typedef struct mf_adamw_hparams {
  double lr;           /* this step's learning rate (mf_lr_at), >= 0 */
  double beta1, beta2; /* in [0, 1) */
  double eps;          /* >= 0 */
  double weight_decay; /* decoupled, >= 0; 0 leaves p * 1.0f = p */
} mf_adamw_hparams;

/* The hyper-parameters of a config's train section at a given lr. */
mf_adamw_hparams mf_adamw_hparams_from_config(const mf_config_train *t, double lr);

/* One AdamW step t (>= 1) over n elements: param, m and v are updated in place,
 * grad is read. bf16_out, when not NULL, receives the new param rounded to bf16
 * (round to nearest even, NaN kept) in the same pass: the working copy the next
 * forward streams up. pool may be NULL (the calling thread does it all). The
 * caller checks the gradients first (mf_optim_grad_check / mf_optim_grad_norm)
 * and skips the step when one is not finite. Buffers must not overlap.
 * MF_ERR_INVALID_ARG for t < 1, hyper-parameters out of range or NULL buffers
 * with n > 0; nothing is written then. Fp32 buffers; bf16 gradients or
 * moments: mf_adamw_update_bufs. */
mf_status mf_adamw_update(const mf_adamw_hparams *h, int64_t step, float *param, const float *grad, float *m,
                          float *v, size_t n, uint16_t *bf16_out, mf_threadpool *pool);

/* The buffers of one update, with their dtypes (mf_adamw_update_bufs). */
typedef struct mf_adamw_bufs {
  float *param;          /* fp32 master weights, updated in place */
  const void *grad;      /* read; grad_dtype */
  void *m, *v;           /* first and second moments, updated in place; moment_dtype */
  uint16_t *bf16_out;    /* NULL, or the new param rounded to bf16 */
  size_t n;              /* elements of each buffer */
  mf_dtype grad_dtype;   /* MF_DTYPE_F32 or MF_DTYPE_BF16 */
  mf_dtype moment_dtype; /* MF_DTYPE_F32 or MF_DTYPE_BF16 (both moments) */
} mf_adamw_bufs;

/* mf_adamw_update over buffers of the dtypes `b` names (the rounding is
 * defined at the top). mf_adamw_update(h, t, p, g, m, v, n, out, pool) is
 * this call with grad_dtype = moment_dtype = MF_DTYPE_F32. Same contract:
 * MF_ERR_INVALID_ARG for a NULL b, a dtype other than those two, bad
 * hyper-parameters, t < 1 or NULL buffers with n > 0; nothing is written then. */
mf_status mf_adamw_update_bufs(const mf_adamw_hparams *h, int64_t step, const mf_adamw_bufs *b,
                               mf_threadpool *pool);

/* Elements per tile of the parallel split (a multiple of every vector width). */
#define MF_ADAMW_GRAIN ((size_t)16384)

/* The loop body in use: "avx512" (intrinsics, AVX-512F/BW/VL), "avx2"
 * (intrinsics, AVX2+FMA), "fma" (the portable body compiled for AVX2+FMA and
 * vectorized by the compiler) or "scalar" (portable, fmaf from libm). Chosen
 * at the first update from the CPU's flags, in that order of preference. */
const char *mf_adamw_impl_name(void);
/* Forces a body ("auto", "avx512", "avx2", "fma", "scalar"): for tests and benchmarks; not to be
 * called while updates run. MF_ERR_UNSUPPORTED when this CPU lacks it,
 * MF_ERR_INVALID_ARG for an unknown name. */
mf_status mf_adamw_select_impl(const char *name);

/* ------------------------------------------- gradient checks and clipping */

/* One gradient buffer. A NULL data or n == 0 (an expert that got no tokens, so
 * no gradient) is skipped by every function below. */
typedef struct mf_optim_buf {
  float *data;
  size_t n;
} mf_optim_buf;

/* Elements per chunk of the norm's partial sums: part of its definition. */
#define MF_OPTIM_NORM_CHUNK ((size_t)65536)
/* Lanes of a chunk's sum (a power of two): one thread each on the device
 * (kernels/cuda/adamw.cu NORM_LANES, which must equal it). */
#define MF_OPTIM_NORM_LANES ((size_t)1024)

/* The number of norm chunks of an n-element buffer. */
static inline size_t mf_optim_norm_chunks(size_t n) {
  return (n + MF_OPTIM_NORM_CHUNK - 1) / MF_OPTIM_NORM_CHUNK;
}

/* sums[k] = the sum of squares of chunk k of g (mf_optim_norm_chunks(n) of
 * them), as the norm computes it. mf_optim_grad_norm over a list of buffers is
 * sqrt of these sums added one at a time, from 0.0, in chunk order, buffer by
 * buffer (skipped buffers contribute nothing): a caller that keeps the chunk
 * sums of each buffer as it arrives and adds them up that way at the end gets
 * the same bits. Reads only. */
mf_status mf_optim_grad_chunk_sumsq(const float *g, size_t n, mf_threadpool *pool, double *sums);

/* *all_finite = 1 when no element is NaN or +-Inf, else 0. Reads only. */
mf_status mf_optim_grad_check(const mf_optim_buf *bufs, size_t n_bufs, mf_threadpool *pool, int *all_finite);

/* *norm = the L2 norm over all buffers (sqrt of the double sum of squares, as
 * described at the top); +Inf or NaN when some element is not finite. */
mf_status mf_optim_grad_norm(const mf_optim_buf *bufs, size_t n_bufs, mf_threadpool *pool, double *norm);

/* mf_optim_grad_norm where some buffers' chunk sums were computed elsewhere
 * (the optimizer on the device: kernels/backend.h MF_K_GRAD_SUMSQ): for
 * buffer b with ext[b] != NULL and n > 0, its mf_optim_norm_chunks(n) sums are
 * ext[b][0..] and its data is not read (may be NULL). The sums are added in
 * the same order, so the same bits as computing them here. ext may be NULL. */
mf_status mf_optim_grad_norm_ext(const mf_optim_buf *bufs, size_t n_bufs, const double *const *ext,
                                 mf_threadpool *pool, double *norm);

/* torch.nn.utils.clip_grad_norm_'s factor: max_norm / (total_norm + 1e-6),
 * capped at 1. 1 when max_norm <= 0 (clipping off) or total_norm is not finite. */
double mf_optim_clip_coef(double total_norm, double max_norm);

/* g *= (float)coef for every element of every buffer. */
mf_status mf_optim_grad_scale(const mf_optim_buf *bufs, size_t n_bufs, double coef, mf_threadpool *pool);

/* The norm, then, when it is finite and the factor is below 1, the scaling.
 * *norm (not finite: the caller skips the step; nothing was changed) and *coef
 * (the factor applied; 1 when none) come back; either pointer may be NULL.
 * max_norm <= 0 computes the norm only. */
mf_status mf_optim_clip_grad_norm(const mf_optim_buf *bufs, size_t n_bufs, double max_norm,
                                  mf_threadpool *pool, double *norm, double *coef);

/* ------------------------------------------------- the backend's kernels */

struct mf_kernel_call;

/* Runs MF_K_GRAD_SUMSQ and MF_K_ADAMW (kernels/backend.h) on host memory with
 * the functions above: the cpu backend's optimizer kernels
 * (mf_cpu_backend_opts.optim), so the optimizer on its "device" gives the
 * host optimizer's bits. MF_ERR_INVALID_ARG for another kind or bad sizes. */
mf_status mf_optim_run_kernel(const struct mf_kernel_call *call, mf_threadpool *pool);

/* ---------------------------------------------------- learning-rate schedule */

/* The lr of optimizer step `step` (1-based: the lr the step-th update uses),
 * for the train section's lr, min_lr, warmup W and steps S:
 *
 *   step <= W:  lr * step / W                       (linear warmup; W = 0: none)
 *   step >  W:  progress = (step - W) / max(1, S - W), in (0, 1]
 *     constant: lr
 *     linear:   min_lr + (lr - min_lr) * (1 - progress)
 *     cosine:   min_lr + (lr - min_lr) * 0.5 * (1 + cos(pi * progress))
 *
 * So step 1 gets lr / W (never 0), step W exactly lr, and the last step S
 * exactly min_lr under linear and cosine. step is clamped to [1, max(S, 1)] and
 * W to [0, S]. */
double mf_lr_at(const mf_config_train *t, int64_t step);

#ifdef __cplusplus
}
#endif

#endif /* MF_OPTIM_H */
