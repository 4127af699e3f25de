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
 *
 * Streams. Kernels run on a compute stream, uploads on an h2d stream, copies
 * home on a d2h stream (on a GPU they overlap: uploads run ahead into memory
 * the plan has freed). The order between them is the schedule's
 * (planner/schedule.h mf_schedule_waits: decided once, and what
 * planner/simulate.h times); the executor only enforces it, with an event of
 * the other stream: each instruction waits for the last write of every slot
 * it touches, a write for the reads since, the first use of a slot for the
 * last use of every earlier slot that held its bytes, the upload of an
 * offloaded activation for its copy home.
 * Inside a step the host waits for nothing but the host optimizer's hand-off
 * (below) and, without a staging arena, a gradient it adds at home: loss
 * scalars and routing counts are copied into host_alloc'd memory without a
 * wait, the scalars read after the step's final sync, the counts as soon as
 * an event query says they landed (until then an expert counts as busy).
 * `//tests/exec:streams_test` runs every kind of plan on the cpu backend's
 * deferred streams (work as late as the waits allow, or copies as early) and
 * requires the same bits.
 */
#ifndef MF_EXEC_EXEC_H
#define MF_EXEC_EXEC_H

#include <stdint.h>

#include "planner/staging.h"
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
/* The same with the offloaded activations' host copies pinned (host_alloc,
 * as mf_exec_create_scheduled does) or, acts_pinned 0, in pageable memory:
 * a run whose pinned home leaves them out (planner/run_plan.h). */
mf_status mf_exec_create_home(const mf_program *p, const mf_schedule *s, mf_backend *b, int acts_pinned,
                              mf_exec **out);
/* The same inside another executor's device arena (`host`, on the same
 * backend; s->arena_bytes at most its own): a backend has one arena, and a
 * second program (train's evaluation) runs in it between the first one's
 * steps. The two take turns: whatever one left in the arena, the other
 * overwrites, so before the other runs, each is told that its persistent
 * slots are stale (mf_exec_invalidate) and refills them from home — after
 * mf_exec_sync_home(x, w, 1) when its optimizer runs on the device. */
mf_status mf_exec_create_inside(const mf_program *p, const mf_schedule *s, const mf_exec *host, mf_exec **out);
void mf_exec_free(mf_exec *x); /* NULL is fine */

typedef struct mf_step_result {
  double loss;      /* mean over micro-batches of ce + aux_coef * aux */
  double ce_loss;   /* mean over micro-batches of the mean token cross-entropy */
  double aux_loss;  /* mean over micro-batches of the (unscaled) load-balancing loss */
  int64_t tokens;   /* counted target tokens in the step */
  double seconds;   /* wall time of the step's device work */
} mf_step_result;

/* One optimizer step's forward and backward: params (host, fp32, the table's
 * layout) are uploaded (with BF16 storage their bf16 working copy is:
 * mf_exec_set_working_copy); ids[m] and targets[m] hold micro-batch m's
 * [B*S] tokens (target -1: not counted); the gradients (mean over the
 * micro-batches) are written to grads (host, the table's layout) unless NULL.
 * A forward-only program gives the losses only. With the optimizer of some
 * parameters on the device (see below) it runs the schedule up to
 * optim_begin: those parameters' weights are uploaded only when the device
 * copy is not current, their gradients stay on the device and only their
 * norm chunk sums come home (mf_exec_norm_sums). */
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

/* ------------------------------------------------------------------ timing
 *
 * The executor's streams, as the simulator (planner/simulate.h) models them:
 * RUN, ZERO and ACCUM on the compute stream, H2D copies on the h2d stream,
 * D2H copies on the d2h stream. After each step mf_exec_stats gives how long
 * each stream worked (busy) and did not (idle = the step's wall time - busy),
 * the bytes moved each way and the peak of live device bytes.
 *
 * Busy time comes from the backend's timed events (kernels/backend.h
 * event_create_timed, event_elapsed): two per instruction, made at create,
 * recorded on the instruction's stream after its waits and after its work;
 * after the step's final sync the elapsed time between each pair is that
 * instruction's seconds, summed per stream. On the cpu backend an event's
 * time is the clock when its stream reached it (at once on immediate
 * streams: the clock around the work); on cuda, cudaEventElapsedTime. A
 * backend without timed events gets NAN busy/idle seconds
 * (mf_exec_stats.timed == 0), never host submission times. With a staging
 * arena the fills and copy-outs are timed the same way, per slab. */

typedef enum mf_exec_stream { MF_EXEC_COMPUTE = 0, MF_EXEC_H2D, MF_EXEC_D2H, MF_EXEC_STREAMS } mf_exec_stream;

typedef struct mf_exec_stats {
  int timed;                       /* 1: busy/idle measured (see above); 0: NAN */
  double wall_s;                   /* the last step's wall time (mf_step_result.seconds) */
  double busy_s[MF_EXEC_STREAMS];  /* seconds each stream worked in the last step */
  double idle_s[MF_EXEC_STREAMS];  /* wall_s - busy_s */
  /* Host seconds the last step spent submitting its work (before waiting for
   * the streams): near wall_s, the host is what the step waits for. */
  double submit_s;
  int64_t instr[MF_EXEC_STREAMS];  /* instructions each stream ran */
  uint64_t h2d_bytes, d2h_bytes;   /* as mf_exec_traffic */
  /* Copies the schedule has but the step did not need: the weights and the
   * (all-zero) gradients of experts that no token of the micro-batches they
   * serve was routed to, once that routing is known (a weight upload before
   * its micro-batches are routed still happens). h2d_bytes + h2d_skipped_bytes
   * is the schedule's h2d_bytes, and so for d2h. */
  uint64_t h2d_skipped_bytes, d2h_skipped_bytes;
  size_t peak_live_bytes;          /* as mf_exec_peak_live_bytes */
  double optimizer_s;              /* the last mf_exec_optimize's wall time (not in wall_s) */
  /* Seconds each stream worked in the last mf_exec_optimize (the device
   * optimizer's part of the step, not in busy_s: its wall time is not in
   * wall_s): 0 before one ran this step, NAN untimed. A training step's GPU
   * time is busy_s + optim_busy_s. */
  double optim_busy_s[MF_EXEC_STREAMS];
  int staged;                      /* 1: the copies went through a staging arena (mf_exec_use_staging) */
  double fill_s, drain_s;          /* seconds the host spent filling slabs and copying them out (NAN
                                      unstaged or untimed) */
} mf_exec_stats;

/* The last step's stream statistics (all zero before the first step). */
void mf_exec_stats_get(const mf_exec *x, mf_exec_stats *out);

/* Per-instruction timing, off by default (the comparison with the simulator
 * turns it on): while on, each step writes the seconds of every instruction
 * of the schedule into an array of the schedule's n_instr, which
 * mf_exec_instr_seconds returns (NULL while off, or on a backend without
 * measured timing). Turning it on allocates that array once (MF_ERR_OUT_OF_MEMORY). */
mf_status mf_exec_set_instr_timing(mf_exec *x, int on);
const double *mf_exec_instr_seconds(const mf_exec *x);

/* ------------------------------------------------ host optimizer hand-off
 *
 * For an optimizer that updates the weights on the host while the executor
 * runs (src/optim/worker.h). With hooks set, mf_exec_step calls
 *   wait(ctx, i)       before an instruction reads or writes parameter i's host
 *                      copies: each upload of its weights and each copy of its
 *                      gradient home. It returns once they are current (the
 *                      update of the previous step is done); a non-OK status
 *                      ends the step with it. Outside the busy time of the
 *                      streams (see timing).
 *   grad_home(ctx, i)  after the last copy of parameter i's gradient home in
 *                      the step has landed: `grads` holds its final value and
 *                      the step does not touch it again.
 * wait runs on the thread calling mf_exec_step. grad_home runs in the
 * copy-out that wrote the gradient home (staged), or in a host function
 * behind its copy on the D2H stream (straight): the backend may run either
 * on another thread (cuda: a host function), so it must be safe to call
 * from there, and it must not call the backend. (A backend without host
 * functions: on the calling thread, the stream synchronized first.) */
typedef struct mf_exec_param_hooks {
  void *ctx;
  mf_status (*wait)(void *ctx, int32_t param);
  void (*grad_home)(void *ctx, int32_t param);
  /* Optional (NULL: none): called before each copy of parameter i's gradient
   * home, after wait, on the thread calling mf_exec_step — for the ranks of
   * a node that add their gradients into one host sum in turn. */
  mf_status (*grad_wait)(void *ctx, int32_t param);
} mf_exec_param_hooks;

/* Sets the hooks (copied); NULL removes them. */
void mf_exec_set_param_hooks(mf_exec *x, const mf_exec_param_hooks *h);

/* With `add` set, every gradient copied home is added into what the host's
 * `grads` already holds — the step's first copy too, which otherwise
 * overwrites it — and an expert's gradient that is all zeros (no token
 * routed to it) is not copied at all: a data-parallel rank after the first
 * adds its share into the node's sum (src/train). Default 0. */
void mf_exec_set_grads_add(mf_exec *x, int add);

/* Expert parallelism (src/model/program.h mf_program_opts.ep): own[i] set
 * for the parameters whose gradient this rank alone produces (its experts):
 * their copies home are written as on a rank of its own, whatever
 * mf_exec_set_grads_add says (an expert with no token: its zeros are
 * written). Kept, not copied; NULL: none. */
void mf_exec_set_grads_own(mf_exec *x, const uint8_t *own);

/* Expert parallelism's exchanges between ranks (kernels/backend.h
 * MF_K_EP_DISPATCH, MF_K_EP_COMBINE) are not kernels: the executor runs each
 * where the schedule puts it, by calling run(ctx, call, b, s) on the thread
 * calling mf_exec_step, with the call's operands in the device arena of
 * backend b, once the compute stream s has done all that comes before it (it
 * is synchronized: the exchange is a point every rank reaches in the same
 * order). The exchange does its work on s, or before it returns; what
 * follows on s runs after that. A program with exchanges fails without it
 * (MF_ERR_INTERNAL). The routed counts the executor reads
 * (mf_exec_expert_tokens, the idle-expert skip) are then the forward
 * EP_DISPATCH's: the rows this rank's experts received. */
typedef struct mf_exec_exchange {
  void *ctx;
  mf_status (*run)(void *ctx, const mf_kernel_call *call, mf_backend *b, mf_stream *s);
  /* Optional (NULL: none): the exchanges enqueued on a stream so far are
   * done, or a fault within a deadline — called before the executor waits
   * on the compute stream for an exchange or at the step's end, so that a
   * rank that stopped ends this one's step with an error instead of a hang
   * (NCCL's; MPI's own waits have their deadline). */
  mf_status (*wait)(void *ctx);
} mf_exec_exchange;
void mf_exec_set_exchange(mf_exec *x, const mf_exec_exchange *e); /* copied; NULL removes it */

/* The parameters in the order a step first uploads them ([n_params]; those
 * never uploaded last, in index order): the order to update them in. */
const int32_t *mf_exec_param_upload_order(const mf_exec *x);

/* ------------------------------------------- the optimizer on the device
 *
 * For the parameters whose optimizer the schedule puts on the device
 * (mf_schedule.optim_device; planner/schedule.h), the device copy of the
 * weights and their AdamW state is the truth between steps. A training loop:
 *   1. mf_exec_set_optim_state once: the host moments (the first fill's
 *      source and mf_exec_sync_home's destination);
 *   2. each step mf_exec_step, then combines the global gradient norm from
 *      the host gradients and mf_exec_norm_sums (in parameter order: the
 *      same bits as mf_optim_grad_norm over every gradient), then — unless
 *      it skips the step — mf_exec_optimize with the clip factor;
 *   3. before anything reads the host copies (an evaluation, the final
 *      weights; a checkpoint would need the state too): mf_exec_sync_home.
 * After the host copies change (a checkpoint loaded) mf_exec_invalidate makes
 * the next step upload them again. With no optimizer on the device these
 * are no-ops (mf_exec_optimize returns MF_OK at once). */

/* How many parameters have their optimizer on the device (0: none). */
int32_t mf_exec_optim_on_device(const mf_exec *x);

/* After mf_exec_step: the norm chunk sums of the gradients of the parameters
 * whose optimizer is on the device, at the program's norm_first[i] (the
 * layout of every parameter's chunks in order; others' entries are not
 * written). NULL with none on the device. */
const double *mf_exec_norm_sums(const mf_exec *x);

/* The host AdamW moments m and v (the parameter table's layout: parameter i
 * at offset * the moment size; the program's moment dtype). Kept, not copied. */
void mf_exec_set_optim_state(mf_exec *x, void *m, void *v);

/* BF16 storage (the program's): the host's bf16 working copy of the weights,
 * the table's layout, which every weight upload reads (2 bytes a weight);
 * mf_exec_sync_home writes the device-optimized parameters' copy back into
 * it. Kept, not copied; whoever updates the master weights on the host keeps
 * it equal to them rounded to bf16 (mf_adamw_bufs.bf16_out). A step with BF16
 * storage and no working copy fails with MF_ERR_INTERNAL. */
void mf_exec_set_working_copy(mf_exec *x, uint16_t *working);
/* LoRA's adapter dropout (MF_K_DROPOUT): seeds[m] is micro-batch m's seed for
 * the next steps' masks (the caller's array of G, read at each dropout op; a
 * program with dropout fails without it). */
void mf_exec_set_dropout_seeds(mf_exec *x, const uint64_t *seeds);

/* One update on the device (kernels/backend.h MF_K_ADAMW) of each parameter
 * whose optimizer is there and update[i] is set, with step[i] (t >= 1), the
 * learning rate, betas and eps, weight_decay for those with decays[i] (NULL:
 * all) and the gradient first scaled by (float)coef when coef < 1. Only
 * after a successful mf_exec_step (MF_ERR_INTERNAL otherwise); the state is
 * filled from the host first when the device copy is not current. */
typedef struct mf_exec_optim {
  double lr, beta1, beta2, eps, weight_decay, coef;
  const int64_t *step;   /* [n_params] */
  const uint8_t *update; /* [n_params] */
  const uint8_t *decays; /* [n_params] or NULL */
} mf_exec_optim;

mf_status mf_exec_optimize(mf_exec *x, const mf_exec_optim *a);

/* Copies the device's current weights (into params, the table's layout; with
 * BF16 storage the fp32 master from the device's state, and the bf16 copy
 * into the working copy) and, with `state`, their AdamW state (into the
 * moments set above) home, for the parameters whose optimizer is on the
 * device; waits for the copies. Nothing
 * for what the device never filled. An evaluation or the final weights need
 * the weights only; the moments stay on the device (the host's copies of
 * them are only the first fill's source). */
mf_status mf_exec_sync_home(mf_exec *x, float *params, int state);

/* The host copies of those weights and state changed: the next step uploads
 * them again. */
void mf_exec_invalidate(mf_exec *x);

/* ----------------------------------------- the pinned staging arena
 *
 * With a staging layout of this executor's schedule (planner/staging.h,
 * mf_staging_build over the same schedule; kept by the caller while the
 * executor lives), every H2D and D2H instruction copies through one block of
 * the backend's host_alloc memory (pinned on cuda) of the layout's
 * arena_bytes, allocated here once, instead of straight between host memory
 * and the arena (on cuda a copy from or to pageable memory cannot overlap).
 * Two more streams carry the host's side as host functions (kernels/backend.h
 * host_fn):
 *   H2D  at a slab's first copy, the fill stream copies each of its tensors'
 *        host bytes into the slab (all the slab's decisions made then: an
 *        idle expert or a current persistent copy is left out), after the
 *        slab's previous occupant — the last earlier H2D slab that shares any
 *        of its bytes — has finished its DMAs, and after the copy-out that
 *        wrote any offloaded activation it reads; the slab's DMAs wait for
 *        the fill. The hooks' wait runs for the slab's parameters before it.
 *   D2H  a slab's first DMA waits for the copy-out of its previous occupant;
 *        after its last DMA the drain stream copies each tensor home (adds a
 *        gradient into the host's sum, writes an idle expert's zeros) and then
 *        hands each finished gradient to the hooks' grad_home.
 * The order between slabs is the layout's (mf_staging.wait_slab, wait_host:
 * decided when it is built; the layout never lets an H2D and a D2H slab
 * share bytes); the executor checks that each wait names a slab submitted
 * before it and enforces it, and the host never waits for it. Same bits as unstaged:
 * `//tests/exec:staging_exec_test`. */
typedef struct mf_exec_staging_opts {
  int threads;    /* host threads for the fills and for the copy-outs, each (0 or 1: the host function's
                     own thread) */
  int poison;     /* write NaN over a slab's bytes once its DMAs or its copy-out are done, and over the
                     whole arena at the start (tests: a missing wait shows as a NaN) */
  int drop_waits; /* tests only: leave out the waits between slabs that share bytes, to show they matter */
} mf_exec_staging_opts;

/* Before the first step; `o` may be NULL (defaults). MF_ERR_INVALID_ARG for a
 * layout of another schedule (or one whose order cannot be followed),
 * MF_ERR_UNSUPPORTED for a backend without host functions, MF_ERR_OUT_OF_MEMORY
 * when the host_alloc fails; on an error nothing changes. Once. */
mf_status mf_exec_use_staging(mf_exec *x, const mf_staging *sg, const mf_exec_staging_opts *o);

/* ------------------------------------- bytes streamed through the slabs
 *
 * What the staged copies achieve, measured with the executor's own slab code
 * (`moefit bench kernels`): one block of pageable host memory moved to or
 * from device memory in slabs of slab_bytes (the last one shorter), `slabs`
 * of them in flight: a ring of `slabs` H2D slabs and `slabs` D2H slabs
 * (2 x slabs x slab_bytes of host_alloc memory, pinned on cuda), slab j
 * taking the bytes of slab j - slabs once that one's DMA (H2D) or copy-out
 * (D2H) is done. Each slab is filled and copied out as a staged step does it:
 * the same host functions (with o->threads host threads each way), streams,
 * events and waits; one DMA per slab. A call returns once the bytes have
 * arrived (the streams synchronized). Nothing is allocated after create. */
typedef struct mf_exec_stager mf_exec_stager;

/* For moves of up to max_bytes; slab_bytes >= 1, slabs >= 1 (at most 65536
 * slabs per move: MF_ERR_INVALID_ARG beyond). o may be NULL (defaults;
 * drop_waits is ignored). MF_ERR_UNSUPPORTED for a backend without host
 * functions, MF_ERR_OUT_OF_MEMORY when an allocation fails. */
mf_status mf_exec_stager_create(mf_backend *b, size_t max_bytes, size_t slab_bytes, int slabs,
                                const mf_exec_staging_opts *o, mf_exec_stager **out);
void mf_exec_stager_free(mf_exec_stager *sg); /* NULL is fine */
/* dev[0, bytes) = host[0, bytes) through the H2D slabs (bytes <= max_bytes). */
mf_status mf_exec_stager_h2d(mf_exec_stager *sg, void *dev, const void *host, size_t bytes);
/* host[0, bytes) = dev[0, bytes) through the D2H slabs. */
mf_status mf_exec_stager_d2h(mf_exec_stager *sg, void *host, const void *dev, size_t bytes);
/* The pinned bytes it holds (both rings). */
size_t mf_exec_stager_pinned_bytes(const mf_exec_stager *sg);
/* The host's seconds in the last move up (the fills) or down (the copy-outs):
 * each slab's host function, from the timed events around it, summed over the
 * move's slabs; NAN on a backend without timed events. Near the move's wall
 * time, the host's copies are what a staged copy waits for. */
mf_status mf_exec_stager_host_seconds(const mf_exec_stager *sg, int up, double *seconds);

#ifdef __cplusplus
}
#endif

#endif /* MF_EXEC_EXEC_H */
