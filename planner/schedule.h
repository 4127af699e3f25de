/*
 * From decisions to a schedule: what the executor does, in order.
 *
 * Decisions say, per tensor of a step program, where it lives:
 *   parameters   RESIDENT (uploaded once per step) or STREAM (uploaded for each
 *                group of uses and dropped after it). A group is a run of
 *                consecutive program ops of one layer in one direction (the
 *                backward, or not): one layer's forward or backward of one
 *                micro-batch in micro-batch-major order, of every micro-batch
 *                in layer-major order (src/model/program.h);
 *   gradients    DEVICE (accumulated on the device over the micro-batches,
 *                brought home at the end) or STREAM (the micro-batches of one
 *                group add up on the device and the group's sum goes home at
 *                its end, where it is added to the host's sum: once per step
 *                in layer-major order, once per micro-batch in
 *                micro-batch-major). Either way a micro-batch after the first
 *                computes its gradient from zero and adds it to the sum once
 *                (acc + g_m, in micro-batch order, in fp32), so both give the
 *                same bits;
 *   optimizer    HOST (the gradient goes home, the host updates the master
 *                weights and their moments) or DEVICE (the program's NORM and
 *                OPTIM ops run for it: the gradient's norm chunk sums and the
 *                AdamW update on the device). DEVICE needs the weights
 *                RESIDENT and the gradient DEVICE; then the weights and the
 *                AdamW state stay on the device across steps — their slots
 *                are *persistent*: they span the whole step, so nothing else
 *                ever shares their bytes, and the H2D that fills each is
 *                marked `persist` (run only when the device copy is not
 *                current: the first step, or after the host changed it).
 *                A frozen weight (LoRA's base, which has no optimizer)
 *                kept RESIDENT is persistent too: nothing changes it;
 *   activations  KEEP (on the device from the forward to the backward),
 *                OFFLOAD (copied home after the forward writes them, brought
 *                back before the backward reads them) or RECOMPUTE (dropped
 *                after the forward; the ops that wrote them run again before
 *                the backward reads them).
 *
 * The schedule is a list of instructions (run an op, copy host->device,
 * copy device->host, zero a slot) over *slots*: a slot is one stay of one
 * tensor on the device, from the instruction that first fills it to the one
 * that last reads it. A streamed weight has a slot per group of uses; an
 * offloaded activation one in the forward and one in the backward. The memory
 * plan packs slots (not tensors) into the arena by their instruction ranges.
 *
 * Recompute and offload are exact: a copy is a copy and every kernel is
 * deterministic, so any valid schedule gives the same bits (plan invariance).
 */
#ifndef MF_PLANNER_SCHEDULE_H
#define MF_PLANNER_SCHEDULE_H

#include <stddef.h>
#include <stdint.h>

#include "src/core/core.h"
#include "src/model/program.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum mf_param_dec { MF_PARAM_RESIDENT = 0, MF_PARAM_STREAM } mf_param_dec;
typedef enum mf_grad_dec { MF_GRAD_DEVICE = 0, MF_GRAD_STREAM } mf_grad_dec;
typedef enum mf_act_dec { MF_ACT_KEEP = 0, MF_ACT_OFFLOAD, MF_ACT_RECOMPUTE } mf_act_dec;
typedef enum mf_optim_dec { MF_OPTIM_HOST = 0, MF_OPTIM_DEVICE } mf_optim_dec;

const char *mf_param_dec_name(mf_param_dec d); /* "resident", "stream" */
const char *mf_grad_dec_name(mf_grad_dec d);   /* "device", "stream" */
const char *mf_act_dec_name(mf_act_dec d);     /* "keep", "offload", "recompute" */
const char *mf_optim_dec_name(mf_optim_dec d); /* "host", "device" */

/* One decision per parameter (param, grad, optim: indexed by parameter) and per
 * program tensor (act: indexed by tensor id; only activations the program
 * allows — mf_schedule_can_offload / _can_recompute — may be other than KEEP). */
typedef struct mf_decisions {
  uint8_t *param;
  uint8_t *grad;
  uint8_t *act;
  uint8_t *optim; /* mf_optim_dec; forward-only programs: all HOST */
  int32_t n_params, n_tensors;
} mf_decisions;

mf_status mf_decisions_create(const mf_program *p, mf_decisions **out); /* all resident / device / keep / host */
void mf_decisions_free(mf_decisions *d);
mf_status mf_decisions_copy(const mf_decisions *from, mf_decisions *to);

/* An activation used by the backward that a copy could keep off the device. */
int mf_schedule_can_offload(const mf_program *p, int32_t tensor);
/* An activation whose forward writer ops can run again without side effects. */
int mf_schedule_can_recompute(const mf_program *p, int32_t tensor);
/* Both answers for every tensor at once (memoised: linear in the program):
 * out[t] = 1 (offload only) | 3 (offload or recompute) | 0. */
mf_status mf_schedule_act_options(const mf_program *p, uint8_t *out);

typedef enum mf_instr_kind {
  MF_I_RUN = 0, /* run program op `op` (again, when `recompute`) */
  MF_I_H2D,     /* fill `slot` from the host: the parameter's master copy, or the activation's host copy */
  MF_I_D2H,     /* copy `slot` home: an offloaded activation, or a gradient (added to the host's when `accumulate`) */
  MF_I_ZERO,    /* set `slot` to 0 (a gradient's fresh slot) */
  MF_I_ACCUM,   /* add `slot` into `slot2` (a micro-batch's gradient into the step's, on the device) */
  MF_I_KIND_COUNT_
} mf_instr_kind;

typedef struct mf_instr {
  mf_instr_kind kind;
  int32_t op;       /* RUN: program op */
  int32_t slot;     /* H2D, D2H, ZERO, ACCUM: the slot */
  int32_t slot2;    /* ACCUM: the destination slot */
  int32_t operands; /* RUN: index into slot_pool of MF_KBUF_MAX slots (-1 absent) then E expert slots */
  uint8_t recompute;  /* RUN: a re-run of a forward op */
  uint8_t accumulate; /* D2H of a gradient: add to the host's instead of overwriting */
  uint8_t persist;    /* H2D of a persistent slot: only when the device copy is not current */
} mf_instr;

/* The streams instructions run on, each in instruction order (the
 * executor's, src/exec/exec.h; the simulator's, planner/simulate.h: same
 * numbers as mf_exec_stream and mf_sim_stream): RUN, ZERO and ACCUM on the
 * compute stream, H2D on the h2d stream, D2H on the d2h stream. */
enum { MF_SCHED_COMPUTE = 0, MF_SCHED_H2D, MF_SCHED_D2H, MF_SCHED_STREAMS };
static inline int mf_schedule_stream(mf_instr_kind k) {
  return k == MF_I_H2D ? MF_SCHED_H2D : k == MF_I_D2H ? MF_SCHED_D2H : MF_SCHED_COMPUTE;
}

typedef struct mf_slot {
  int32_t tensor;
  int32_t first, last; /* instructions that first fill and last touch the slot */
  size_t offset;       /* in the device arena */
  uint8_t persist;     /* kept across steps (first = 0, last = n_instr - 1): optimizer on the device, or a
                          frozen weight resident */
} mf_slot;

typedef struct mf_schedule {
  const mf_program *prog;
  mf_instr *instr;
  int32_t n_instr;
  mf_slot *slots;
  int32_t n_slots;
  int32_t *slot_pool;
  int64_t n_pool;
  size_t arena_bytes;      /* the packed arena: every slot at its offset */
  size_t peak_live_bytes;  /* max over instructions of the bytes of the slots alive there */
  int32_t peak_instr;      /* where that peak is */
  size_t host_act_bytes;   /* host memory for offloaded activations */
  size_t *host_offset;     /* [n_tensors] offset of an offloaded activation's host copy, or SIZE_MAX */
  int64_t recomputed_ops;  /* RUN instructions that re-run a forward op */
  uint64_t h2d_bytes, d2h_bytes; /* bytes the step moves each way (persistent fills not counted) */
  uint64_t persist_bytes;  /* bytes of the persistent slots (filled once, not per step) */
  /* The optimizer on the device. Instructions [0, optim_begin) are the step
   * (forward, backward, gradients home, the NORM ops and the D2H of the
   * norm chunk sums); [optim_begin, n_instr) are the OPTIM part, which runs
   * once the host has the global norm (src/exec/exec.h mf_exec_optimize).
   * optim_begin == n_instr when no optimizer is on the device. */
  int32_t optim_begin;
  uint8_t *optim_device;   /* [n_params] 1: that parameter's optimizer is on the device */
  int32_t n_optim_device;  /* how many */
  int32_t *waits;          /* [3 n_instr] the order between streams: NULL until mf_schedule_waits */
} mf_schedule;

/* Builds the schedule of `p` under `d` and packs its slots into the arena. */
mf_status mf_schedule_build(const mf_program *p, const mf_decisions *d, mf_schedule **out);
void mf_schedule_free(mf_schedule *s);

/* The order between the streams, decided once: the simulator times it
 * (planner/simulate.h), the executor enforces it with events
 * (src/exec/exec.h). Instruction i, on stream mf_schedule_stream(kind), waits
 * for instruction (*out)[3 i + q] of stream q: the latest one of that stream
 * it depends on, or -1 (always -1 for its own stream, which runs in order).
 * It depends on
 *   RAW/WAW  the last earlier instruction writing a slot it touches;
 *   WAR      if it writes a slot, the reads of that slot since that write;
 *   memory   if it first fills a slot, every instruction touching an earlier
 *            slot that shared any of those arena bytes and whose last
 *            instruction came before it (persistent slots are never
 *            reused: their bytes are theirs for the whole step);
 *   host     if it uploads an offloaded activation, the last earlier D2H of
 *            it (which wrote its host copy).
 * With the streams in order that is all the simulator's dependencies:
 * an earlier writer of a slot, or a read before the last write, is ordered
 * before that last write already. The barrier before optim_begin is not in
 * it: the executor meets it with a host sync, the simulator by its own rule.
 *
 * Computed on the first call (O(n_instr + n_pool + n_slots log n_slots):
 * the memory rule uses a segment tree over the arena's elementary intervals,
 * with a lane per stream) and kept in s->waits until mf_schedule_free; later
 * calls, from any thread, return it. On demand, not in mf_schedule_build:
 * the planner builds many schedules only to see whether they fit, which are
 * never simulated, and a simulation on a serial profile (one timeline) needs
 * none. A copy of the struct shares the array: change no instruction of a
 * copy that has it.
 * MF_ERR_OUT_OF_MEMORY, MF_ERR_INTERNAL for a schedule that did not come from
 * mf_schedule_build (a slot never used). */
mf_status mf_schedule_waits(const mf_schedule *s, const int32_t **out);

/* For every slot of an expert's weight or gradient, the micro-batches whose
 * expert ops it serves, [lo[x], hi[x]]: a weight's uses, a gradient's writers
 * and, through ACCUM, every micro-batch summed into it; -1 for other slots.
 * lo and hi hold n_slots entries. What the idle-expert skip (the executor)
 * and the expert copies' use chances (the simulation) are about. */
void mf_schedule_expert_micros(const mf_schedule *s, int32_t *lo, int32_t *hi);

#ifdef __cplusplus
}
#endif

#endif /* MF_PLANNER_SCHEDULE_H */
