/*
 * Predicting a schedule's step time: an event simulation of the executor's
 * streams over the instructions of a schedule (planner/schedule.h), with the
 * cost of each instruction from a hardware profile (planner/hwprofile.h).
 *
 * Streams. RUN, ZERO and ACCUM go on the compute stream, H2D copies on the H2D
 * stream, D2H copies on the D2H stream, each in instruction order; the host
 * AdamW over every parameter runs after the streams are done (or, with
 * `overlap_optimizer`, behind the next step: see mf_sim_opts). On a profile with
 * copies_overlap_compute == 0 (the cpu backend) every instruction runs on one
 * timeline in instruction order, so the step is the plain sum of the costs.
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
 *   host     an H2D of an offloaded activation waits for its D2H.
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
 *   anything else, ZERO, ACCUM  elementwise: the bytes of its operand tensors
 *                             (each tensor once; an embedding's table counts
 *                             only the T rows it touches);
 *   H2D, D2H                  mf_hw_copy_seconds of the slot's tensor bytes.
 * Before any of these, a RUN, ZERO or ACCUM whose key (mf_sim_instr_key: the
 * kernel, its sizes and its operand bytes) has a measured point in the
 * profile's compute.kernels costs that point's seconds: `moefit profile
 * --config` times a program's own calls, which the rate model above prices
 * only roughly (a small GEMM's efficiency depends on its shape, elementwise
 * kernels with exp() are not bandwidth-bound, a memset pays no launch).
 * A profile that cannot price an instruction (no GEMM or attention points, a
 * zero bandwidth or AdamW rate: a NaN or infinite cost) is MF_ERR_INVALID_ARG.
 *
 * The simulation is deterministic and runs in O(n_instr + n_pool + n_slots
 * log n_slots): the memory dependency uses a segment tree over the slots'
 * arena offsets (a slot is painted with the time it is done when its last
 * instruction has been simulated; the arena packing guarantees that the slots
 * sharing bytes with a new one are all painted by then).
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
  /* train.overlap_optimizer's steady state instead of AdamW after the streams:
   * the previous step's updates run on the host from t = 0 (one worker using
   * all threads), one parameter after another in the order the step first
   * uploads them (those never uploaded last), each at the profile's AdamW
   * rate; the first H2D of each parameter waits until its update is done. The
   * step lasts until the streams end, and at least the updates' total (a
   * step's updates finish before the next step's start). Exposed optimizer =
   * that step - the streams' end without the waits. */
  int overlap_optimizer;
  /* When > 0, the host optimizer's updates take at least this long in all
   * (e.g. its state read from and written back to NVMe, planner/host.h):
   * every update's cost is scaled by floor / (the profile's AdamW total). */
  double optimizer_floor_seconds;
  /* Measured routing (planner/routing.h mf_routing.share: [layers * experts],
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
  double optimizer_seconds;         /* host AdamW over every parameter (0 for a forward-only program) */
  double optimizer_start;           /* when it starts: streams_seconds, or 0 with overlap_optimizer */
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
 * compute instruction i of `s` (RUN: the op's kernel and sizes; ZERO: "zero";
 * ACCUM: "add" with {numel, 1}): the kernel's name (mf_kernel_name), its sizes
 * (the call's i[], 8 written; trailing zeros count as absent) and the operand
 * bytes the cost model counts. Returns 0 for H2D/D2H (copies have no key), else 1. */
int mf_sim_instr_key(const mf_schedule *s, int32_t i, const char **kernel, int64_t sizes[8], int *n_sizes,
                     double *bytes);

#ifdef __cplusplus
}
#endif

#endif /* MF_PLANNER_SIMULATE_H */
