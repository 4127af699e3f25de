/*
 * Predicting a schedule's step time: an event simulation of the executor's
 * streams over the instructions of a schedule (planner/schedule.h), with the
 * cost of each instruction from a hardware profile (planner/hwprofile.h).
 *
 * Streams. RUN, ZERO and ACCUM go on the compute stream, H2D copies on the H2D
 * stream, D2H copies on the D2H stream, each in instruction order. On a
 * profile with copies_overlap_compute == 0 (the cpu backend) every
 * instruction runs on one timeline in instruction order, so the streams take
 * the plain sum of the costs.
 *
 * The optimizer. Parameters whose optimizer is on the device
 * (s->optim_device) are updated by the schedule's own GRAD_SUMSQ and ADAMW
 * instructions; the instructions from s->optim_begin on (the OPTIM part) run
 * once the host has the global gradient norm, so none of them starts before
 * every instruction before optim_begin has ended (the *barrier*). The host
 * AdamW updates the other parameters (those with s->optim_device[i] == 0):
 *   - by default it starts at the barrier and runs beside the OPTIM part:
 *     step = max(streams' end, barrier + host updates) (with no optimizer on
 *     the device the barrier is the streams' end: step = streams + updates);
 *     on a serial profile everything is one timeline: step = streams + updates;
 *   - with `overlap_optimizer`, behind the next step (see mf_sim_opts).
 *
 * An instruction starts when its stream is free and its dependencies are done:
 *   RAW/WAW  it waits for every earlier instruction that wrote a slot it
 *            touches (an H2D before its readers, the last writer before a D2H);
 *   WAR      one that writes a slot waits for every earlier one touching it
 *            (a D2H still reading it);
 *   memory   the first instruction of a slot waits until every earlier slot
 *            sharing arena bytes with it is done — every instruction touching
 *            that slot, its D2H included. This is what bounds prefetch: an
 *            upload starts as soon as its memory is free, which may be long
 *            before its place in the list;
 *   host     an H2D of an offloaded activation waits for its D2H;
 *   barrier  an instruction at or after s->optim_begin waits until every
 *            instruction before it has ended.
 * All but the barrier are the schedule's order between streams
 * (mf_schedule_waits): each instruction waits for at most one instruction of
 * each other stream, the latest it depends on, and that covers the rest
 * because every stream runs in order — the executor enforces the same waits
 * with events.
 *
 * Costs (seconds, from the profile's cost functions, which include a kernel's
 * launch cost):
 *   LINEAR_*, CROSS_ENTROPY   mf_hw_gemm_seconds at the op's GEMM shape (the
 *                             cross-entropy: every vocabulary chunk of each of
 *                             its o->flops / (2 T V H) GEMM passes);
 *   EXPERT_*                  a grouped GEMM over the T*K rows: routing is not
 *                             known, so the rows spread evenly over the experts
 *                             expected to get any (E (1 - (1 - K/E)^T)); one
 *                             launch for the group;
 *   ATTN_*                    mf_hw_attention_seconds(o->flops, S, D);
 *   GRAD_SUMSQ                elementwise: the gradient's bytes;
 *   ADAMW                     on a serial profile (the cpu backend, whose
 *                             device optimizer is the host's code)
 *                             mf_hw_adamw_seconds of its parameter's numel;
 *                             else elementwise: the weight's bytes read and
 *                             written, the gradient's read, the state's read
 *                             and written (2 w + g + 2 state);
 *   anything else, ZERO, ACCUM  elementwise: the bytes of its operand tensors
 *                             (each tensor once; an embedding's table counts
 *                             only the T rows it touches);
 *   H2D, D2H                  mf_hw_copy_seconds of the slot's tensor bytes;
 *                             an H2D marked `persist` (a persistent slot's
 *                             fill: weights and state the device optimizer
 *                             keeps) costs 0 — in the steady state the device
 *                             copy is current — and its bytes are not counted
 *                             in h2d_bytes (it stays in the timeline).
 * Before any of these, a RUN, ZERO or ACCUM whose key (mf_sim_instr_key: the
 * kernel, its sizes and its operand bytes) has a measured point in the
 * profile's compute.kernels costs that point's seconds: `moefit profile
 * --config` times a program's own calls, which the rate model above prices
 * only roughly (a small GEMM's efficiency depends on its shape, elementwise
 * kernels with exp() are not bandwidth-bound, a memset pays no launch).
 * A profile that cannot price an instruction (no GEMM or attention points, a
 * zero bandwidth or AdamW rate: a NaN or infinite cost) is MF_ERR_INVALID_ARG.
 *
 * The simulation is deterministic and runs in O(n_instr + n_ops + n_slots),
 * plus, the first time a schedule is simulated on an overlapping profile,
 * the order between its streams (mf_schedule_waits: O(n_instr + n_pool +
 * n_slots log n_slots), kept in the schedule for later simulations).
 */
#ifndef MF_PLANNER_SIMULATE_H
#define MF_PLANNER_SIMULATE_H

#include <stddef.h>
#include <stdint.h>

#include "planner/hwprofile.h"
#include "planner/schedule.h"
#include "src/core/core.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum mf_sim_stream { MF_SIM_COMPUTE = 0, MF_SIM_H2D, MF_SIM_D2H, MF_SIM_STREAMS } mf_sim_stream;

const char *mf_sim_stream_name(mf_sim_stream s); /* "compute", "h2d", "d2h" */

typedef struct mf_sim_opts {
  /* train.overlap_optimizer's steady state instead of the host AdamW after
   * the barrier: the previous step's host updates (parameters whose optimizer
   * is not on the device) run on the host from t = 0 (one worker using all
   * threads), one parameter after another in the order the step first
   * uploads them (those never uploaded last), each at the profile's AdamW
   * rate; the first H2D of each parameter waits until its update is done. The
   * step lasts until the streams end, and at least the updates' total (a
   * step's updates finish before the next step's start). Exposed optimizer =
   * that step - the streams' end without the waits. */
  int overlap_optimizer;
  /* When > 0, the optimizer's updates over every parameter would take at
   * least this long in all (e.g. its state read from and written back to
   * NVMe, planner/host.h): every host update's cost is scaled by floor / (the
   * profile's AdamW time over every parameter), so the host's share of the
   * floor shrinks with the parameters the device updates. */
  double optimizer_floor_seconds;
  /* Seconds of host memory time a step's staged copies take (the fills of
   * the staging slabs and their copy-outs: planner/run_plan.h prices them
   * from the copies the pinned home leaves staged). With overlap_optimizer
   * they run beside the host updates and share the host's memory bandwidth
   * with them (AdamW is bound by it): every host update's cost is scaled by
   * (updates + host_copy_seconds) / updates. Without overlap the updates run
   * after the step's copies and this is not used. */
  double host_copy_seconds;
  /* Measured routing (experts/routing.h mf_routing.share: [layers * experts],
   * each expert's fraction of its layer's assignments), or NULL. With it, a
   * copy of an expert's weight or gradient costs its time times the chance
   * it happens: the executor skips the copies of an expert no token of the
   * slot's micro-batches reached once their routing is known (for a weight:
   * when their dispatch runs before the upload). With K experts per token and
   * T tokens per micro-batch, over n micro-batches: 1 - (1 - K share)^(T n). */
  const double *expert_share;
} mf_sim_opts;

typedef struct mf_sim_result {
  double step_seconds;    /* the predicted step: streams, then what the host optimizer adds */
  double streams_seconds; /* when the last instruction ends (overlap_optimizer: uploads waiting included) */
  /* step = compute + exposed transfer + exposed optimizer. */
  double compute_seconds; /* = busy[MF_SIM_COMPUTE]: RUN, ZERO, ACCUM */
  double
      exposed_transfer_seconds;     /* streams_seconds without the optimizer's waits - compute: the compute
                                       stream waiting on copies (and the copies after its last instruction);
                                       every copy on a serial profile */
  double exposed_optimizer_seconds; /* step_seconds - streams_seconds without the optimizer's waits */
  double optimizer_seconds;         /* host AdamW over the parameters the host updates (those whose
                                       optimizer is not on the device; 0 for a forward-only program) */
  double optimizer_start;           /* when it starts: the barrier (streams_seconds on a serial profile),
                                       or 0 with overlap_optimizer */
  double optimizer_barrier;         /* when the last instruction before s->optim_begin ends (streams_seconds
                                       when no optimizer is on the device) */
  double device_optimizer_seconds;  /* the device optimizer's kernels (GRAD_SUMSQ and ADAMW RUNs): part of
                                       compute_seconds */
  double busy[MF_SIM_STREAMS];      /* seconds each stream works */
  double idle[MF_SIM_STREAMS];      /* step_seconds - busy */
  uint64_t h2d_bytes, d2h_bytes;
  /* Per instruction [n_instr]: its stream, cost, start and end, and the device
   * memory alive while it runs (bytes of the slots whose range holds it). */
  int32_t n_instr;
  uint8_t *stream;
  double *cost, *start, *end;
  size_t *live_bytes;
  size_t peak_live_bytes; /* max of live_bytes: the schedule's peak_live_bytes */
  int32_t peak_instr;
} mf_sim_result;

/* Simulates `s` on `hw`. `o` may be NULL (defaults: all zero). `out` is
 * overwritten (it owns new arrays: release them with mf_sim_result_free). */
mf_status mf_simulate(const mf_schedule *s, const mf_hwprofile *hw, const mf_sim_opts *o, mf_sim_result *out);
void mf_sim_result_free(mf_sim_result *r); /* frees the arrays and zeroes *r; NULL is fine */

/* The cost in seconds of program op k on `hw` (a RUN of it), as above. */
double mf_sim_op_seconds(const mf_program *p, int32_t k, const mf_hwprofile *hw);

/* The key under which the profile's compute.kernels holds a measured time for
 * compute instruction i of `s` (RUN: the op's kernel and sizes, GRAD_SUMSQ
 * and ADAMW included; ZERO: "zero"; ACCUM: "add" with {numel, 1}): the
 * kernel's name (mf_kernel_name), its sizes (the call's i[], 8 written;
 * trailing zeros count as absent; GRAD_SUMSQ's without i[1], where its sums
 * go, so parameters of one size share a key) and the operand bytes the cost
 * model counts (GRAD_SUMSQ: the gradient's; ADAMW: 2 w + g + 2 state, as
 * above). Returns 0 for H2D/D2H (copies have no key), else 1. */
int mf_sim_instr_key(const mf_schedule *s, int32_t i, const char **kernel, int64_t sizes[8], int *n_sizes,
                     double *bytes);

#ifdef __cplusplus
}
#endif

#endif /* MF_PLANNER_SIMULATE_H */
