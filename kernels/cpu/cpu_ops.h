/*
 * The cpu backend's op kernels: the reference for every CUDA kernel, and what CI
 * trains with. Plain C over fp32 storage, multithreaded through the context's
 * thread pool with a fixed partition, so the bits never depend on the thread
 * count or timing: every output element (and every reduction) is computed by
 * one thread in a fixed order.
 *
 * Shapes (row-major):  T tokens (= B sequences x S positions), H hidden,
 * E experts, K top-k, I intermediate, V vocabulary, R rows, Hq/Hkv heads,
 * D head_dim.
 *
 * Conventions:
 *  - Activations and weights are float. With ctx->round_bf16 set, every
 *    activation output is rounded to a bf16-representable value as it is
 *    stored (emulating bf16 storage, for parity with the cuda backend);
 *    accumulation is fp32 either way. Weight gradients and per-row statistics
 *    (rstd, lse, probs, routing weights) stay fp32 and are never rounded.
 *  - "written" outputs are overwritten; "added" outputs are accumulated into
 *    (gradients across micro-batches, residual streams). An `accumulate` flag
 *    chooses for outputs that can be either.
 *  - Weight gradients (dW, db, dw) are always added.
 *  - Pointers of one call do not alias unless stated (in-place ops say so).
 *  - Kernels trust their arguments (sizes checked by the program builder); they
 *    return MF_OK, or an error only for things like a pool failure.
 *
 * Twins. The kernel of kind MF_K_<X> (kernels/backend.h) is mf_cpu_<name> here
 * and mf_cuda_<name> in kernels/cuda/ops.cuh, <name> being mf_kernel_name(kind)
 * ("linear_fwd", "attn_bwd", "sigmoid_gate_fwd", ...). The two take the same
 * arguments in the same order; the backend's own context comes last (here the
 * mf_kctx, where a kernel uses one; on cuda the stream, after the cuBLASLt
 * state or scratch a launcher needs).
 */
#ifndef MF_KERNELS_CPU_OPS_H
#define MF_KERNELS_CPU_OPS_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/rope.h"
#include "src/core/core.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mf_kctx {
  mf_threadpool *pool; /* NULL: run on the calling thread */
  int round_bf16;      /* 1: activation outputs rounded to bf16 precision */
} mf_kctx;

/* Rounds v to the nearest bf16 value (ties to even), kept as a float. */
static inline float mf_round_to_bf16(float v) { return mf_bf16_to_fp32(mf_fp32_to_bf16(v)); }

/* ------------------------------------------------------------ embedding */

/* out[t,:] = table[ids[t],:]   (written). ids[t] in [0, V). */
mf_status mf_cpu_embed_fwd(const int32_t *ids, int64_t T, const float *table, int64_t V, int64_t H,
                           float *out, const mf_kctx *ctx);
/* dtable[ids[t],:] += dout[t,:]  (added; threads own column ranges, tokens summed in order). */
mf_status mf_cpu_embed_bwd(const int32_t *ids, int64_t T, const float *dout, int64_t V, int64_t H,
                           float *dtable, const mf_kctx *ctx);

/* -------------------------------------------------------------- RMSNorm */

/* y[r,:] = w * (x[r,:] * rstd[r]),  rstd[r] = 1/sqrt(mean(x[r,:]^2) + eps).
 * y written, rstd written (fp32). Used for the layer norms (R=T, C=H), Qwen3's
 * per-head q/k norm (R=T*heads, C=D) and OLMoE's whole-projection norm. y may
 * equal x (in place). */
mf_status mf_cpu_rmsnorm_fwd(const float *x, const float *w, int64_t R, int64_t C, float eps, float *y,
                             float *rstd, const mf_kctx *ctx);
/* dx = rstd * (w*dy - xhat * mean(w*dy*xhat)),  xhat = x*rstd  (written, or added
 * when accumulate);  dw[c] += sum_r dy[r,c]*xhat[r,c]  (added; dw NULL: not computed, a frozen weight). */
mf_status mf_cpu_rmsnorm_bwd(const float *dy, const float *x, const float *w, const float *rstd, int64_t R,
                             int64_t C, float *dx, float *dw, int accumulate, const mf_kctx *ctx);

/* --------------------------------------------------------------- linear */

/* y[M,N] = x[M,K] . W[N,K]^T (+ bias[N] when bias != NULL). Written, or added when
 * accumulate (the bias is added once either way). */
mf_status mf_cpu_linear_fwd(const float *x, const float *W, const float *bias, int64_t M, int64_t N,
                            int64_t K, float *y, int accumulate, const mf_kctx *ctx);
/* dx[M,K] = dy[M,N] . W[N,K]  (written, or added when accumulate). */
mf_status mf_cpu_linear_bwd_data(const float *dy, const float *W, int64_t M, int64_t N, int64_t K, float *dx,
                                 int accumulate, const mf_kctx *ctx);
/* dW[N,K] += dy^T . x;  db[N] += sum_m dy[m,:] when db != NULL  (added, fp32). */
mf_status mf_cpu_linear_bwd_weight(const float *dy, const float *x, int64_t M, int64_t N, int64_t K,
                                   float *dW, float *db, const mf_kctx *ctx);

/* ----------------------------------------------------------------- RoPE */

/* In place on dims [off, off + rot) of each head of x[T, nh, D] (a's fields:
 * kernels/rope.h; rot 0: the rest of the head; the other dims left as they
 * are). Pair i < rot/2 of a head, (x1, x2) = (x[off + i], x[off + i + rot/2])
 * (rotate_half, as transformers' Llama-style models) or (x[off + 2i],
 * x[off + 2i + 1]) (interleaved: DeepSeek-V3's rope_interleave, in place),
 * with inv_freq[i] = mf_rope_inv_freq (default or YaRN, fp32),
 * f = pos[t] * inv_freq[i], c = A cos f, s = A sin f (A: attention_factor):
 *   x1' = x1*c - x2*s,  x2' = x2*c + x1*s.
 * bwd applies the transpose (c, -s) to the gradient in place (the inverse
 * rotation when A = 1). Arguments mf_rope_plan_make refuses are
 * MF_ERR_INVALID_ARG (an odd D rotates its first D - 1 dims, as before). */
mf_status mf_cpu_rope_fwd(float *x, int64_t T, int64_t nh, int64_t D, const int32_t *pos, mf_rope_args a,
                          const mf_kctx *ctx);
mf_status mf_cpu_rope_bwd(float *dx, int64_t T, int64_t nh, int64_t D, const int32_t *pos, mf_rope_args a,
                          const mf_kctx *ctx);

/* ------------------------------------------------------------ attention */

/* Causal self-attention with GQA over B sequences of S tokens.
 * q[B*S, Hq, D], k[B*S, Hkv, D], v[B*S, Hkv, Dv] (token-major), Hq % Hkv == 0,
 * query head h reads kv head h / (Hq/Hkv); Dv, the value head dim, may differ
 * from D (DeepSeek-V3's latent attention: D 192, Dv 128; Dv 0 means D).
 * p = softmax(scale * q.k^T) over keys 0..i; o[B*S, Hq, Dv] = p.v (written);
 * lse[B, Hq, S] = logsumexp of the scaled scores (written, fp32) for the
 * backward. Never forms an S x S matrix.
 * window > 0: a sliding window, keys i - window < j <= i only (0: all of 0..i).
 * sinks[Hq] (NULL: none): gpt-oss's learned logit of query head h, not scaled,
 * one more term exp(sinks[h]) in every row's softmax denominator (rows of p
 * then sum to less than 1); lse includes it. */
mf_status mf_cpu_attn_fwd(const float *q, const float *k, const float *v, int64_t B, int64_t S, int64_t Hq,
                          int64_t Hkv, int64_t D, int64_t Dv, int64_t window, const float *sinks, float scale,
                          float *o, float *lse, const mf_kctx *ctx);
/* dq [B*S, Hq, D], dk [B*S, Hkv, D], dv [B*S, Hkv, Dv] written (dk/dv sum over
 * the query heads of their group); o and dout [B*S, Hq, Dv]. window and sinks
 * as the forward's (lse is the forward's, the sink in it). dsinks[Hq] (fp32,
 * NULL: not wanted) is added into: dsinks[h] += -sum_{b,i} exp(sinks[h] -
 * lse[b,h,i]) * (dout[b,i,h] . o[b,i,h]), summed over b then i in a pass of its own. */
mf_status mf_cpu_attn_bwd(const float *q, const float *k, const float *v, const float *o, const float *dout,
                          const float *lse, int64_t B, int64_t S, int64_t Hq, int64_t Hkv, int64_t D,
                          int64_t Dv, int64_t window, const float *sinks, float scale, float *dq, float *dk,
                          float *dv, float *dsinks, const mf_kctx *ctx);

/* --------------------------------------------------------- elementwise */

/* act = silu(g) * u  (written). */
mf_status mf_cpu_swiglu_fwd(const float *g, const float *u, int64_t n, float *act, const mf_kctx *ctx);
/* dg = dact * u * silu'(g),  du = dact * silu(g)  (written). */
mf_status mf_cpu_swiglu_bwd(const float *g, const float *u, const float *dact, int64_t n, float *dg,
                            float *du, const mf_kctx *ctx);
/* gpt-oss's clamped SwiGLU (swiglu_clamp.c; transformers' GptOssExperts._apply_gate), fp32:
 *   g' = min(g, limit) (no lower clamp), u' = clamp(u, -limit, limit), s = sigmoid(alpha * g'),
 *   act = (u' + 1) * (g' * s)  (written);
 *   dg = dact * (u' + 1) * (s + alpha * g' * s * (1 - s)) where g <= limit, else 0;
 *   du = dact * (g' * s) where -limit <= u <= limit, else 0  (written; torch.clamp's gradient
 *   passes at the bounds). gpt-oss: limit 7, alpha 1.702. */
mf_status mf_cpu_swiglu_clamp_fwd(const float *g, const float *u, int64_t n, float limit, float alpha,
                                  float *act, const mf_kctx *ctx);
mf_status mf_cpu_swiglu_clamp_bwd(const float *g, const float *u, const float *dact, int64_t n, float limit,
                                  float alpha, float *dg, float *du, const mf_kctx *ctx);
/* y[r,:] (+)= sigmoid(gl[r]) * x[r,:] — Qwen2-MoE's shared-expert gate (gl is the
 * [R] output of a Linear(H,1)); added. */
mf_status mf_cpu_sigmoid_gate_fwd(const float *gl, const float *x, int64_t R, int64_t C, float *y,
                                  const mf_kctx *ctx);
/* dx[r,:] = sigmoid(gl[r]) * dy[r,:] (written);
 * dgl[r] = sigmoid'(gl[r]) * dot(dy[r,:], x[r,:]) (written). */
mf_status mf_cpu_sigmoid_gate_bwd(const float *gl, const float *x, const float *dy, int64_t R, int64_t C,
                                  float *dx, float *dgl, const mf_kctx *ctx);
/* y += x (n elements). */
mf_status mf_cpu_add(const float *x, int64_t n, float *y, const mf_kctx *ctx);

/* Strided column blocks (slice.c): y[r*ys + yo + j] = (acc: +=) x[(r / rep)*xs + xo + j] for r < R, j < C;
 * and the transpose, dx[q*xs + xo + j] = (acc: +=) the sum over h < rep (in order) of
 * dy[(q*rep + h)*ys + yo + j] for q < Q. A block past its row's stride is refused. */
mf_status mf_cpu_slice(const float *x, int64_t R, int64_t C, int64_t xs, int64_t xo, int64_t ys, int64_t yo,
                       int64_t rep, int acc, float *y, const mf_kctx *ctx);
mf_status mf_cpu_slice_bwd(const float *dy, int64_t Q, int64_t C, int64_t xs, int64_t xo, int64_t ys, int64_t yo,
                           int64_t rep, int acc, float *dx, const mf_kctx *ctx);
/* x *= s in place (n elements; fp32 multiply, rounded once in round_bf16 mode). */
mf_status mf_cpu_scale(float *x, int64_t n, float s, const mf_kctx *ctx);
/* y [rows, cols] = the stored weight whose blob is qw (src/core/qformat.h
 * mf_qweight_blob_view; kind NF4, FP8 or MXFP4, NF4's block size and nested
 * absmax) element by element, mf_qweight_at (written; rounded to bf16
 * precision in round_bf16 mode). */
mf_status mf_cpu_dequant(const uint8_t *qw, int64_t kind, int64_t rows, int64_t cols, int64_t blocksize,
                         int64_t nested, float *y, const mf_kctx *ctx);
/* y[j] = x[j] * (float)(1 / (1 - p)) where mf_dropout_bits(seed, stream, j) >=
 * mf_dropout_threshold(p), else 0 (written; p in [0, 1)). */
mf_status mf_cpu_dropout(const float *x, int64_t n, uint64_t stream, uint64_t seed, double p, float *y,
                         const mf_kctx *ctx);
/* The same over rows of `row` elements gathered from several sources
 * (expert parallelism's received rows): part k (k < parts) is rows
 * segments[k] .. segments[k + 1] - 1, whose i-th is row starts[k] + i of
 * source k % sources, masked as that source masks it: element c of it by
 * mf_dropout_bits(seeds[k % sources], stream, (starts[k] + i) row + c). Rows
 * outside every part are zeros. segments rise from >= 0 to at most
 * n / row; MF_ERR_INVALID_ARG otherwise, for n not whole rows, starts < 0 or
 * fewer than one source. */
mf_status mf_cpu_dropout_parts(const float *x, int64_t n, uint64_t stream, double p, int64_t row,
                               const int64_t *segments, const int64_t *starts, const int64_t *seeds,
                               int64_t sources, int64_t parts, float *y, const mf_kctx *ctx);

/* --------------------------------------------------------------- router */

/* From router logits[T,E], mode 0: probs = softmax (fp32, written); (topk_w,
 * topk_idx) = the k largest probs per row in descending order (ties: lower
 * expert index first); when norm_topk, topk_w /= sum(topk_w).
 * mode 1 (gpt-oss's GptOssTopKRouter): topk_idx = the k largest logits (the
 * same order and ties), topk_w = the softmax of those k logits; probs = the
 * softmax over E of the row holding topk_w at topk_idx and 0 elsewhere (what
 * gpt-oss's aux loss reads); norm_topk is ignored. Other modes: MF_ERR_INVALID_ARG. */
mf_status mf_cpu_router_fwd(const float *logits, int64_t T, int64_t E, int64_t K, int norm_topk, int mode,
                            float *probs, int32_t *topk_idx, float *topk_w, const mf_kctx *ctx);
/* dlogits[T,E] (written) from d topk_w[T,K] through the renormalisation, the
 * top-k selection and the softmax, plus dprobs_extra[T,E] (the aux loss's
 * gradient w.r.t. probs; NULL when none). mode 1: through the forward of mode
 * 1 — the softmax over E of probs, the scatter, the softmax of the k logits;
 * only the chosen experts' logits get a gradient, the others 0. */
mf_status mf_cpu_router_bwd(const float *probs, const int32_t *topk_idx, const float *topk_w,
                            const float *dtopk_w, const float *dprobs_extra, int64_t T, int64_t E, int64_t K,
                            int norm_topk, int mode, float *dlogits, const mf_kctx *ctx);

/* DeepSeek-V3's and GLM-4.5's sigmoid router (kernels/cpu/router_group.c):
 * scores = sigmoid(logits) [T,E] (written); the choice by scores + bias[E]
 * (NULL: none) among the topk_group of n_group groups with the largest
 * sums of their two largest, (topk_idx, topk_w) [T,K] descending by it (ties:
 * the lower expert first), topk_w the chosen scores, divided by their sum +
 * 1e-20 when norm_topk, times scaling. n_group must divide E into groups of
 * two or more (1: no group limit). */
mf_status mf_cpu_router_group_fwd(const float *logits, const float *bias, int64_t T, int64_t E, int64_t K,
                                  int64_t n_group, int64_t topk_group, int norm_topk, float scaling,
                                  float *scores, int32_t *topk_idx, float *topk_w, const mf_kctx *ctx);
/* dlogits[T,E] (written) from d topk_w[T,K] through the scaling, the
 * normalisation and the sigmoid; the bias and the choice get none. */
mf_status mf_cpu_router_group_bwd(const float *scores, const int32_t *topk_idx, const float *dtopk_w, int64_t T,
                                  int64_t E, int64_t K, int norm_topk, float scaling, float *dlogits,
                                  const mf_kctx *ctx);

/* ---------------------------------------------------------- permutation */

/* The dispatch of T tokens x K choices to E experts, expert-major: rows of
 * expert e are [offsets[e], offsets[e+1]), in (token, choice) order inside an
 * expert. row_of[t*K + j] = the row of token t's j-th choice;
 * token_of_row[r] = its token. counts[e] = offsets[e+1] - offsets[e]; an expert
 * with 0 rows is a normal case. Deterministic (a counting sort). */
mf_status mf_cpu_moe_dispatch(const int32_t *topk_idx, int64_t T, int64_t K, int64_t E, int64_t *counts,
                              int64_t *offsets, int32_t *row_of, int32_t *token_of_row);
/* xe[r,:] = x[token_of_row[r],:]  (written), r < T*K. */
mf_status mf_cpu_moe_gather(const float *x, const int32_t *token_of_row, int64_t R, int64_t H, float *xe,
                            const mf_kctx *ctx);
/* dx[t,:] (+)= sum_j dxe[row_of[t*K+j],:]  (written, or added when accumulate);
 * summed in j order. */
mf_status mf_cpu_moe_gather_bwd(const float *dxe, const int32_t *row_of, int64_t T, int64_t K, int64_t H,
                                float *dx, int accumulate, const mf_kctx *ctx);
/* y[t,:] += sum_j w[t,j] * ye[row_of[t*K+j],:]  (added), summed in j order. */
mf_status mf_cpu_moe_combine(const float *ye, const float *w, const int32_t *row_of, int64_t T, int64_t K,
                             int64_t H, float *y, const mf_kctx *ctx);
/* dye[row_of[t*K+j],:] = w[t,j] * dy[t,:]  (written);
 * dw[t,j] = dot(dy[t,:], ye[row_of[t*K+j],:])  (written). */
mf_status mf_cpu_moe_combine_bwd(const float *dy, const float *ye, const float *w, const int32_t *row_of,
                                 int64_t T, int64_t K, int64_t H, float *dye, float *dw, const mf_kctx *ctx);

/* --------------------------------------------------- grouped expert GEMM */

/* For each expert e with rows [offsets[e], offsets[e+1]):
 *   ye[rows, N] = xe[rows, Kd] . W[e][N, Kd]^T   (written).
 * W is an array of E pointers (each expert's weight is its own tensor, so it can
 * be streamed alone). Experts with no rows are skipped (W[e] may be NULL then);
 * an expert with rows and W[e] NULL (a cold expert's LoRA adapter,
 * train.lora.experts hot) has its rows written as zeros, here and in
 * bwd_data; bwd_weight skips it.
 * R is the rows of xe and ye, at least offsets[E]: the cuda twin needs the bound
 * (its offsets are on the device); this one reads offsets. */
mf_status mf_cpu_expert_fwd(const float *xe, const float *const *W, const int64_t *offsets, int64_t R,
                            int64_t E, int64_t N, int64_t Kd, float *ye, const mf_kctx *ctx);
/* dxe[rows, Kd] = dye[rows, N] . W[e]  (written). */
mf_status mf_cpu_expert_bwd_data(const float *dye, const float *const *W, const int64_t *offsets, int64_t R,
                                 int64_t E, int64_t N, int64_t Kd, float *dxe, const mf_kctx *ctx);
/* dW[e] += dye[rows]^T . xe[rows]  (added) for experts with rows; the others'
 * gradients are not touched (dW[e] may be NULL then). */
mf_status mf_cpu_expert_bwd_weight(const float *dye, const float *xe, const int64_t *offsets, int64_t E,
                                   int64_t N, int64_t Kd, float *const *dW, const mf_kctx *ctx);
/* The same with each expert's rows in `sources` parts (segments [E sources + 1],
 * expert e's part s: rows [segments[e sources + s], segments[e sources + s + 1]),
 * covering its rows in order): dW[e] += part_0; dW[e] += part_1; ..., each
 * part summed from 0 in row order — the bits of one rank adding the parts as
 * the gradients of micro-batches 0, 1, ... (expert parallelism's received
 * rows, kernels/backend.h MF_K_EP_DISPATCH). NULL segments: one part. */
/* MF_ERR_INVALID_ARG (naming `what`) unless segments [E sources + 1] cut each
 * expert's rows [offsets[e], offsets[e + 1]) into `sources` parts in order. */
mf_status mf_cpu_expert_parts_check(const char *what, const int64_t *offsets, const int64_t *segments, int64_t E,
                                    int64_t sources);
mf_status mf_cpu_expert_bwd_weight_parts(const float *dye, const float *xe, const int64_t *offsets,
                                         const int64_t *segments, int64_t E, int64_t N, int64_t Kd,
                                         int64_t sources, float *const *dW, const mf_kctx *ctx);

/* A per-expert bias over the expert-sorted rows (expert_bias.c; gpt-oss's
 * gate_up_proj_bias and down_proj_bias): rows of expert e are [offsets[e],
 * offsets[e+1]) as for the expert GEMMs.
 *   fwd: y[r,:] += bias[e,:] for every row r of e  (added; y [R, N], bias [E, N];
 *        R, at least offsets[E], is the cuda twin's bound, as mf_cpu_expert_fwd's).
 *   bwd: db[e,:] += the sum over the rows of e, in row order, of dy[r,:]  (added,
 *        fp32; the sum formed first, then added; experts without rows untouched). */
mf_status mf_cpu_expert_bias_fwd(const float *bias, const int64_t *offsets, int64_t R, int64_t E, int64_t N,
                                 float *y, const mf_kctx *ctx);
mf_status mf_cpu_expert_bias_bwd(const float *dy, const int64_t *offsets, int64_t E, int64_t N, float *db,
                                 const mf_kctx *ctx);
/* The same with each expert's rows in `sources` parts (segments as
 * mf_cpu_expert_bwd_weight_parts's): db[e,:] += each part's sum, in part order. */
mf_status mf_cpu_expert_bias_bwd_parts(const float *dy, const int64_t *offsets, const int64_t *segments, int64_t E,
                                       int64_t N, int64_t sources, float *db, const mf_kctx *ctx);

/* -------------------------------------------------------- cross-entropy */

/* Causal-LM cross-entropy of h[T,H] through the LM head W[V,H] (logits = h.W^T),
 * chunked over the vocabulary: logits of at most `chunk` vocabulary rows exist
 * at a time (ws holds T*chunk floats), so [T,V] is never formed.
 *   target[t] in [0,V), or -1 to ignore the token.
 *   scalars[0] = loss_sum: sum over non-ignored t of (lse[t] - logit[t,target[t]])  (written)
 *   scalars[1] = n_valid: the number of non-ignored tokens (written, an exact double)
 * When dh != NULL, also the backward of loss_scale * loss_sum:
 *   dh[T,H] (written) and dW[V,H] (added). Ignored tokens get dh = 0.
 * lse[T] (written) is workspace the caller provides. */
mf_status mf_cpu_cross_entropy(const float *h, const float *W, const int32_t *target, int64_t T, int64_t V,
                               int64_t H, int64_t chunk, float loss_scale, float *ws, float *lse,
                               double *scalars, float *dh, float *dW, const mf_kctx *ctx);

/* ------------------------------------------------- load-balancing loss */

/* transformers' load_balancing_loss_func (tests/fixtures/NOTES.md), pooled over
 * all MoE layers of a forward pass: with N rows in
 * all, count[e] = number of (row, choice) pairs that picked e, P[e] = mean_n
 * probs[n,e]:  aux = E * sum_e (count[e]/N) * P[e].
 * Accumulate one layer: counts[e] += picks, psum[e] += sum_t probs[t,e] (double). */
mf_status mf_cpu_aux_accumulate(const float *probs, const int32_t *topk_idx, int64_t T, int64_t E, int64_t K,
                                int64_t *counts, double *psum);
/* *aux (written) from the totals over n_rows rows. */
mf_status mf_cpu_aux_value(const int64_t *counts, const double *psum, int64_t E, int64_t n_rows, double *aux);
/* d(coef*aux)/d probs[t,e] = coef * E * counts[e] / n_rows^2, the same for every
 * row: written to dprobs[T,E] for one layer's T rows. */
mf_status mf_cpu_aux_grad(const int64_t *counts, int64_t E, int64_t n_rows, double coef, int64_t T,
                          float *dprobs);

#ifdef __cplusplus
}
#endif

#endif /* MF_KERNELS_CPU_OPS_H */
