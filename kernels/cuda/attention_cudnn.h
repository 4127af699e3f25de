/*
 * Causal GQA attention of BF16 storage on cuDNN's fused flash-attention
 * kernels (the SDPA nodes of cuDNN's graph API, through its C++ frontend):
 * the maths, layouts and outputs of attention.cu (read its header), for the
 * cuda backend when its attention is "cudnn" (MF_ATTENTION=cudnn,
 * mf_backend_cuda_set_attention).
 *
 *   forward   Q, K, V -> O and the softmax statistics (cuDNN's Stats: the
 *             log-sum-exp of the scaled scores, our lse), causal (top-left
 *             diagonal), scale applied to q.k;
 *   backward  Q, K, V, O, dO, Stats -> dQ, dK, dV, written (not added), with
 *             cuDNN's deterministic algorithm (two runs give the same bits;
 *             on Hopper it keeps dP in its workspace instead of adding dQ with
 *             atomics).
 * Every tensor is bf16 in our token-major layout ([B*S, H, D]: the strides
 * of B, H, S, D are S*H*D, D, H*D, 1) and lse fp32 [B, Hq, S].
 *
 * cuDNN itself is not linked: the first mf_cuda_cudnn_create loads
 * libcudnn.so.9 (or libcudnn_graph.so.9) with dlopen, so a machine without
 * cuDNN runs moefit as before, with attention_mma.cu. A graph is built the
 * first time a shape is asked for and kept (at most MF_CUDNN_GRAPHS shapes);
 * a shape cuDNN does not support, or whose workspace is more than the caller
 * gives, is answered with *ran = 0 and a warning once, and the caller runs its
 * own kernels. The workspace is the caller's (the backend's kernel scratch,
 * sized at create by backend_cuda.h's mf_cuda_attn_cudnn_workspace_bound:
 * the deterministic backward's dP (bf16, B x Hq x S x S, S rounded up to 128),
 * fp32 accumulators of dQ and (GQA) of dK and dV per query head, and the
 * softmax sums, plus 1 MiB).
 *
 * Built without the frontend's headers (tools/setup installs them), every
 * entry point says so: create gives MF_ERR_UNSUPPORTED.
 */
#ifndef MF_KERNELS_CUDA_ATTENTION_CUDNN_H
#define MF_KERNELS_CUDA_ATTENTION_CUDNN_H

#include <stddef.h>
#include <stdint.h>

#include "src/core/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The most attention shapes (forward and backward each count) one context keeps graphs for. */
#define MF_CUDNN_GRAPHS 16

typedef struct mf_cuda_cudnn mf_cuda_cudnn;

/* 1 when this build has cuDNN's frontend (kernels/cuda/attention_cudnn.cc). */
int mf_cuda_cudnn_built(void);

/* Loads cuDNN and makes a handle on the current device. No cuDNN to load, one
 * older than 9.0, or a build without the frontend: MF_ERR_UNSUPPORTED saying
 * which. *out is NULL on failure. */
mf_status mf_cuda_cudnn_create(mf_cuda_cudnn **out);
void mf_cuda_cudnn_free(mf_cuda_cudnn *c);

/* cuDNN's version as cudnnGetVersion gives it (e.g. 91900), 0 without one. */
int64_t mf_cuda_cudnn_version(const mf_cuda_cudnn *c);

/* attention.cu's mf_cuda_attn_fwd / _bwd for mf_bf16 (passed as void *), on
 * cuDNN, with workspace [ws, ws + ws_bytes) and *ran = 1; *ran = 0 with
 * nothing launched when this shape is not taken (see the top). Errors of
 * cuDNN once a graph runs: MF_ERR_CUDA with cuDNN's message. */
mf_status mf_cuda_attn_cudnn_fwd(mf_cuda_cudnn *c, const void *q, const void *k, const void *v, int64_t B,
                                 int64_t S, int64_t Hq, int64_t Hkv, int64_t D, float scale, void *o,
                                 float *lse, void *ws, size_t ws_bytes, int *ran, void *stream);
mf_status mf_cuda_attn_cudnn_bwd(mf_cuda_cudnn *c, const void *q, const void *k, const void *v, const void *o,
                                 const void *dout, const float *lse, int64_t B, int64_t S, int64_t Hq,
                                 int64_t Hkv, int64_t D, float scale, void *dq, void *dk, void *dv, void *ws,
                                 size_t ws_bytes, int *ran, void *stream);

#ifdef __cplusplus
}
#endif

#endif /* MF_KERNELS_CUDA_ATTENTION_CUDNN_H */
