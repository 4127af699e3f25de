/*
 * The compact pinned staging arena: every host<->device copy of a schedule
 * goes through pinned host memory, laid out here from the schedule
 * (planner/schedule.h) and its simulated timeline (planner/simulate.h).
 *
 * Slabs. A slab is one flat, exact-size pinned buffer holding the tensors of a
 * run of copies that follow each other on one copy stream (the H2D or the D2H
 * stream, in instruction order) and serve one group: the ops of one layer, one
 * phase (forward; backward and the recomputes for it) and one micro-batch —
 * e.g. a layer's streamed weights (all its experts packed together) for its
 * backward, or its gradients going home. A run is cut when the next copy
 * would take the slab past opts.max_slab_bytes (a tensor bigger than that gets
 * a slab of its own, exactly its size), and where the optimizer part of the
 * schedule begins (mf_schedule.optim_begin: it runs apart from the step). Inside a slab, copy j sits at
 * offset_j = sum of align_up(bytes_i, opts.align) for i < j, and the slab is
 * sum align_up(bytes_i, align) bytes: no power-of-two rounding, no pinning
 * per tensor.
 *
 * When a slab is busy (seconds on the simulation's clock; may start before 0,
 * i.e. during the previous step's tail):
 *   H2D  the host fills the whole slab (copying each tensor's host copy in,
 *        2 bytes of host-memory traffic per byte at hw->host_memory_bandwidth)
 *        before its first copy starts, then the copies run: busy from the
 *        fill's start to the end of its last copy. One host thread fills the
 *        slabs in stream order, each as late as it can (it must finish before
 *        the slab's first copy and before the next slab's fill starts).
 *   D2H  from its first copy's start until one host thread (in stream order,
 *        as soon as the slab's last copy has landed and the previous slab is
 *        drained) has copied it out: 2 bytes of traffic per byte, 3 for a
 *        gradient added into the host's sum (read slab, read sum, write sum).
 * Slabs are packed into one arena by these intervals (half-open [start, end);
 * best fit in time order, as the device arena is packed), so slabs whose
 * intervals do not meet share bytes: the arena is reused across layers. The
 * H2D slabs are packed in the arena's first h2d_region_bytes, the D2H slabs
 * after them: within one direction two slabs that share bytes follow each
 * other on their stream, so the executor can order them by an event of the
 * earlier (its last DMA, or its copy-out), which it could not always do for
 * an H2D and a D2H slab (the one later in time may be submitted first).
 *
 * The ZeRO-Infinity-style pool it is compared with: a fixed number of pinned
 * buffers, each sized for the largest tensor any copy of the step moves, as
 * many as the copies in flight at once. Counted on the same timeline with the
 * same host model, but per tensor (more favourable to the pool): a copy is in
 * flight from its own host fill's start to its DMA's end (H2D; one serial
 * filler, each tensor as late as it can be) or from its DMA's start to the end
 * of its own copy-out (D2H; one serial drainer). pool_buffers = the maximum
 * number of copies of both directions in flight at one instant; pool_bytes =
 * pool_buffers x pool_buffer_bytes (the largest tensor's bytes, unaligned).
 * With opts.inflight_limit the copies are counted where the throttle put them
 * (each shifted with its slab), so both figures describe the same timeline.
 *
 * The order between slabs, decided here with the layout (the executor only
 * enforces it, src/exec/exec.h): a slab waits for its previous occupant —
 * wait_slab, the latest earlier slab of its direction that shares any of its
 * bytes (its last DMA for an H2D slab, its copy-out for a D2H slab) — and an
 * H2D slab's fill also for wait_host, the latest D2H slab whose copy-out
 * wrote the host copy of an offloaded activation it uploads.
 *
 * The executor copies through the arena with what is exposed here: each
 * slab's offset, bytes and copies; each copy's instruction, tensor and arena
 * offset; copy_of_instr maps a schedule instruction to its copy. A slab is
 * one pinned region and one host fill or copy-out, but its copies' device
 * ends are scattered over the plan's slots, so the executor issues one async
 * copy per tensor, back to back on the stream, out of or into the slab.
 */
#ifndef MF_PLANNER_STAGING_H
#define MF_PLANNER_STAGING_H

#include <stddef.h>
#include <stdint.h>

#include "planner/hwprofile.h"
#include "planner/schedule.h"
#include "planner/simulate.h"
#include "src/core/core.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MF_STAGING_ALIGN_DEFAULT 256
#define MF_STAGING_MAX_SLAB_DEFAULT ((size_t)64 << 20) /* 64 MiB */

typedef struct mf_staging_opts {
  size_t align;            /* tensor offsets inside a slab; a power of two, 1..4096 (0: the default) */
  size_t max_slab_bytes;   /* cut a run of copies before it grows past this (0: the default, 64 MiB or the
                              largest copied tensor aligned, whichever is less, so that no slab outgrows
                              the pool's buffers; SIZE_MAX: a group per slab, one flat buffer per layer and
                              phase) */
  uint64_t inflight_limit; /* 0: the copies run where the simulation put them. Else at most this many bytes
                              of slabs are busy at once: a slab that would pass it waits until older slabs
                              are free, and its DMA and the later ones on its stream slip (the H2D slabs
                              get up to half the bound, more when the D2H slabs need less; D2H the rest).
                              The slips are reported; they are not fed back into the simulation. */
  const uint8_t *direct;   /* NULL, or [the schedule's n_instr]: instruction i with direct[i] set copies
                              straight between the device and a pinned home (run_plan.h, the pinned home)
                              and gets no copy here (copy_of_instr[i] = -1). Both copies of an offloaded
                              activation must agree: an H2D staged from a direct D2H has no copy-out to
                              wait for. Borrowed for the call; opts.direct of the result is NULL. */
} mf_staging_opts;

typedef struct mf_staging_copy {
  int32_t instr;  /* the schedule's H2D or D2H instruction */
  int32_t tensor; /* the program tensor it moves */
  int32_t slab;   /* the slab holding it */
  size_t offset;  /* in the arena (the slab's offset + its place in the slab) */
  size_t bytes;   /* the tensor's bytes (its place in the slab is align_up(bytes)) */
} mf_staging_copy;

typedef struct mf_staging_slab {
  uint8_t dir;        /* MF_I_H2D or MF_I_D2H */
  int64_t group;      /* the group key: ((micro + 1) * 2 + bwd) * (layers + 2) + layer + 1; -1 none */
  int32_t first_copy; /* copies[first_copy .. first_copy + n_copies) */
  int32_t n_copies;
  size_t offset;               /* in the arena, a multiple of align */
  size_t bytes;                /* exact: the sum of its copies' aligned bytes */
  double busy_start, busy_end; /* seconds: the host fill's start (H2D) or first DMA's start (D2H), to the last
                                  DMA's end (H2D) or the host copy-out's end (D2H) */
  double dma_start, dma_end;   /* the first copy's start and the last copy's end */
} mf_staging_slab;

typedef struct mf_staging {
  mf_staging_opts opts;   /* as used (defaults filled in) */
  mf_staging_slab *slabs; /* H2D slabs in stream order, then D2H slabs in stream order */
  int32_t n_slabs, n_h2d_slabs;
  mf_staging_copy *copies; /* slab by slab */
  int32_t n_copies;
  int32_t *copy_of_instr; /* [n_instr]: index into copies, -1 for instructions that copy nothing or copy
                             direct (opts.direct) */
  int32_t n_instr;
  /* The order between slabs (above): [n_slabs] each, a slab index or -1.
   * wait_slab[k]: the previous occupant of any of k's bytes, a slab of k's
   * direction before it in stream order. wait_host[k]: for an H2D slab, the
   * D2H slab whose copy-out it reads (the last one that copies home any
   * offloaded activation k uploads, before k's copy of it); -1 for a D2H slab. */
  int32_t *wait_slab;
  int32_t *wait_host;
  size_t arena_bytes;         /* the packed arena */
  size_t h2d_region_bytes;    /* its first part, the H2D slabs' (the D2H slabs' follows) */
  uint64_t sum_slab_bytes;    /* every slab side by side (no reuse) */
  size_t peak_inflight_bytes; /* max over time of the bytes of the slabs busy at that instant */
  int32_t max_slabs_inflight; /* max over time of the number of slabs busy at once */
  size_t largest_slab_bytes;
  /* The host side: seconds of host-memory time the fills and copy-outs take
   * per step, and the longest a D2H slab waits, after its last copy landed,
   * for the drainer to reach it. A lag that grows over the step means the host
   * drains slower than the D2H link delivers: slabs pile up, and a bounded
   * arena would hold the D2H stream back by about that much. */
  double host_copy_seconds;
  double max_drain_lag_seconds;
  /* With opts.inflight_limit, when it had to act (throttled = 1): the most any
   * H2D / D2H copy starts later than the simulation says. An H2D slip delays
   * the compute waiting for that copy; the step's prediction is optimistic by
   * up to about the larger of the two. Slab dma_start/dma_end are then the
   * held-back times. */
  int throttled;
  double h2d_slip_seconds, d2h_slip_seconds;
  /* The ZeRO-Infinity-style pool (see above). */
  int32_t pool_buffers;
  size_t pool_buffer_bytes;
  uint64_t pool_bytes;
} mf_staging;

/* Lays out the staging arena of schedule `s` on the timeline `r` (mf_simulate
 * of `s` on `hw`; r->n_instr must be s->n_instr). `o` may be NULL (defaults).
 * MF_ERR_INVALID_ARG for a timeline of another schedule, bad options or a
 * profile without host memory bandwidth. *out is written only on success;
 * release it with mf_staging_free. */
mf_status mf_staging_build(const mf_schedule *s, const mf_sim_result *r, const mf_hwprofile *hw,
                           const mf_staging_opts *o, mf_staging **out);
void mf_staging_free(mf_staging *st); /* NULL is fine */

/* The same, bounded by `limit` bytes (0: no bound). First, keeping the
 * simulated timeline: starting from `o`'s max_slab_bytes, halves it (down to
 * 1 MiB) while the arena does not fit and each halving saves at least 10% —
 * smaller slabs are filled later and drained sooner. Then, if that is not enough, holds the copy streams back
 * (opts.inflight_limit, tightened by the packing's overshoot and 1/64 of the
 * limit, up to 8 tries):
 * the result reports its slips. *fits says whether the result is within the
 * limit; when nothing fits (a single slab, i.e. tensor, bigger than the
 * limit), the result is the smallest layout found. o->inflight_limit is
 * ignored. */
mf_status mf_staging_build_within(const mf_schedule *s, const mf_sim_result *r, const mf_hwprofile *hw,
                                  const mf_staging_opts *o, uint64_t limit, mf_staging **out, int *fits);

/* Bytes of host-memory traffic a staged copy instruction i of s costs (the
 * host model above): 2 a byte, 3 for a gradient added into the host's sum. */
double mf_staging_copy_traffic(const mf_schedule *s, int32_t i);

/* The group key of copy instruction i of s (see mf_staging_slab.group): for an
 * H2D the op the next RUN instruction runs, for a D2H the op of the previous
 * one (a recompute counts as backward); -1 where there is none. */
int64_t mf_staging_group_of(const mf_schedule *s, int32_t i);

#ifdef __cplusplus
}
#endif

#endif /* MF_PLANNER_STAGING_H */
