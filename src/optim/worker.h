/*
 * The overlapped host optimizer: a worker thread (with its own thread pool)
 * that runs the gradient-norm passes and the AdamW updates of a training step
 * while the step loop goes on, with the same bits as the plain sequence
 * (mf_optim_clip_grad_norm over every gradient, then mf_adamw_update of each
 * parameter) for any timing and any thread counts.
 *
 * One training step with it:
 *
 *   during the backward  the executor hands over each parameter's gradient as
 *                        soon as it is complete at home (mf_optim_worker_grad_home):
 *                        the worker computes its norm chunk sums
 *                        (mf_optim_grad_chunk_sumsq) while the device goes on;
 *   end of the step      mf_optim_worker_norm waits for those passes and adds
 *                        the chunk sums of the gradients that count, in buffer
 *                        order — mf_optim_grad_norm's sum, so the same norm,
 *                        clip factor and skip decision;
 *   unless skipped       mf_optim_worker_update queues the updates in the order
 *                        the next step first uploads the parameters (each one
 *                        scales its gradient by the clip factor first: the same
 *                        per-element product mf_optim_grad_scale makes) and
 *                        returns at once: the next step starts;
 *   next step            before the executor first reads a parameter's host
 *                        copies (its upload, or a gradient copy home into its
 *                        buffer) it calls mf_optim_worker_wait_param: that waits
 *                        only for that parameter's update. No stale weights.
 *
 * Why nothing is updated during the backward, even with clipping off: an
 * update of a layer whose gradients are home would have to be undone when a
 * gradient that arrives later (an earlier layer's, or the loss itself) is not
 * finite and the step is skipped; exactness would need a copy of the weights
 * and moments of every layer updated early (their full size on the host) or
 * an undo that is not bit-exact (AdamW does not invert exactly in floating
 * point). So the updates start when the whole step's gradients are home, and
 * hide behind the next step's forward instead.
 *
 * Threads: create, norm, update, wait_param, wait_all, stats and free are
 * called from one thread (the step loop's; the executor's wait hook runs on
 * it). grad_home may also come from another thread during the step — the
 * executor's copy-out of a staging slab, a host function on cuda — but never
 * after the step is synced. The worker's pool is its own: a pool's run does not nest, and the
 * step loop's pool runs the compute meanwhile. Nothing is allocated after
 * create.
 */
#ifndef MF_OPTIM_WORKER_H
#define MF_OPTIM_WORKER_H

#include <stddef.h>
#include <stdint.h>

#include "src/core/core.h"
#include "src/optim/optim.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One parameter's host buffers, n elements each (the weights, the gradient,
 * the two moments, of dtype `moments`: MF_DTYPE_F32 or MF_DTYPE_BF16, see
 * mf_adamw_update_bufs). n == 0: nothing to do for it. */
typedef struct mf_optim_tensor {
  float *w, *g;
  void *m, *v;
  size_t n;
  mf_dtype moments;
  uint16_t *bf16_out; /* NULL, or w's bf16 working copy, rewritten by each update */
} mf_optim_tensor;

/* One queued update: AdamW step `step` (>= 1) of parameter `param` with `h`. */
typedef struct mf_optim_update {
  int32_t param;
  int64_t step;
  mf_adamw_hparams h;
} mf_optim_update;

typedef struct mf_optim_worker mf_optim_worker;

/* A worker over n tensors (the array is copied) with a pool of `threads`
 * threads (<= 0: the number of online CPUs). The buffers must outlive it. */
mf_status mf_optim_worker_create(const mf_optim_tensor *tensors, int32_t n, int threads,
                                 mf_optim_worker **out);
/* Waits for what is queued, stops the thread, frees. NULL is fine. */
void mf_optim_worker_free(mf_optim_worker *wk);

/* Parameter i's gradient for this step is complete and will not be written
 * again in this step: queue its norm pass. A second call for i in the same
 * step, or i out of range, does nothing. Never blocks on the worker's work. */
void mf_optim_worker_grad_home(mf_optim_worker *wk, int32_t i);

/* The step's gradients are all home: queues the norm pass of each gradient not
 * handed over yet, waits for every queued job, and sets *norm = the L2 norm
 * over the gradients with used[i] != 0 — the bits mf_optim_grad_norm gives
 * over the buffers {g, used ? n : 0} in index order (+Inf or NaN when one is
 * not finite). Starts the next step's hand-overs afresh. A failure of an
 * earlier queued job is returned here (or at the next wait). */
mf_status mf_optim_worker_norm(mf_optim_worker *wk, const uint8_t *used, double *norm);
/* The same, where parameter i with ext[i] != NULL had its chunk sums computed
 * elsewhere (the optimizer on the device): ext[i][k] is its chunk k's sum, no
 * norm pass runs for it here and its host gradient is not read. ext may be
 * NULL. Same bits as mf_optim_grad_norm_ext. */
mf_status mf_optim_worker_norm_ext(mf_optim_worker *wk, const uint8_t *used, const double *const *ext,
                                   double *norm);

/* Queues n updates, run in the order given; each first multiplies its
 * gradient by (float)coef when coef < 1. Returns at once. Only after
 * mf_optim_worker_norm (the queue is empty then; else MF_ERR_INTERNAL). A
 * parameter may appear once; one not listed is not waited for. */
mf_status mf_optim_worker_update(mf_optim_worker *wk, const mf_optim_update *u, int32_t n, double coef);

/* Returns once parameter i's queued update (if any) is done: its weights,
 * moments and gradient buffer are the step loop's again. Fast when it is. */
mf_status mf_optim_worker_wait_param(mf_optim_worker *wk, int32_t i);

/* Returns once everything queued is done (before a checkpoint, an evaluation
 * or the end of training). */
mf_status mf_optim_worker_wait_all(mf_optim_worker *wk);

/* Since create: *busy = seconds the worker spent on jobs (norm passes and
 * updates), *waited = seconds the step loop spent blocked in norm, wait_param
 * and wait_all. Either pointer may be NULL. */
void mf_optim_worker_stats(mf_optim_worker *wk, double *busy, double *waited);

#ifdef __cplusplus
}
#endif

#endif /* MF_OPTIM_WORKER_H */
