/*
 * The executor: runs a step program on a backend. It owns the device arena
 * (one allocation of the program's planned size), uploads the parameters,
 * feeds each micro-batch's tokens, runs the ops in order and brings the
 * gradients and losses home. In checking mode it tells the backend each
 * tensor's lifetime, so a kernel touching a dead tensor fails.
 *
 * It follows a schedule (planner/schedule.h): streamed weights are uploaded
 * per group of uses, offloaded activations go home and come back, recomputed
 * ones are produced again, streamed gradients are added up at home. Without a
 * schedule, every tensor stays resident for the step.
 */
#ifndef MF_EXEC_EXEC_H
#define MF_EXEC_EXEC_H

#include <stdint.h>

#include "kernels/backend.h"
#include "planner/schedule.h"
#include "src/core/core.h"
#include "src/model/program.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mf_exec mf_exec;

/* Runs `p` with every tensor resident (the schedule of the default decisions). */
mf_status mf_exec_create(mf_program *p, mf_backend *b, mf_exec **out);
/* Runs `p` under schedule `s` (kept by the caller, alive as long as the executor). */
mf_status mf_exec_create_scheduled(const mf_program *p, const mf_schedule *s, mf_backend *b, mf_exec **out);
void mf_exec_free(mf_exec *x); /* NULL is fine */

typedef struct mf_step_result {
  double loss;      /* mean over micro-batches of ce + aux_coef * aux */
  double ce_loss;   /* mean over micro-batches of the mean token cross-entropy */
  double aux_loss;  /* mean over micro-batches of the (unscaled) load-balancing loss */
  int64_t tokens;   /* counted target tokens in the step */
  double seconds;   /* wall time of the step's device work */
} mf_step_result;

/* One optimizer step's forward and backward: params (host, fp32, the table's
 * layout) are uploaded; ids[m] and targets[m] hold micro-batch m's
 * [B*S] tokens (target -1: not counted); the gradients (mean over the
 * micro-batches) are written to grads (host, the table's layout) unless NULL.
 * A forward-only program gives the losses only. */
mf_status mf_exec_step(mf_exec *x, const float *params, const int32_t *const *ids, const int32_t *const *targets,
                       float *grads, mf_step_result *r);

/* During the next steps, copy micro-batch 0's final hidden states ([B*S, H],
 * the final norm's output) to host `out` as soon as they exist (for logits
 * dumps); NULL stops it. */
void mf_exec_capture_final_hidden(mf_exec *x, float *out);

/* Tokens routed to each expert in the last step, summed over its micro-batches:
 * [layer * E + e] (0 for dense layers). An expert with 0 tokens got no
 * gradient: the optimizer leaves it alone, as PyTorch does. */
const int64_t *mf_exec_expert_tokens(const mf_exec *x);

size_t mf_exec_arena_bytes(const mf_exec *x);
/* The most device bytes held by live slots at any instruction of the last step,
 * as measured while running it (equals the schedule's peak_live_bytes). */
size_t mf_exec_peak_live_bytes(const mf_exec *x);
/* Bytes the last step copied host->device and device->host. */
void mf_exec_traffic(const mf_exec *x, uint64_t *h2d, uint64_t *d2h);

#ifdef __cplusplus
}
#endif

#endif /* MF_EXEC_EXEC_H */
