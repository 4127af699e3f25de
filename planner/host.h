/*
 * Host memory a plan needs, against memory.host_limit and memory.pinned_limit,
 * and what would spill to NVMe past them.
 *
 * Parts (bytes, for the whole step; a program's parameters are counted once):
 *   master    fp32 master weights: 4 x numel
 *   working   the working copy the device reads (the program's parameter
 *             dtype: bf16 with BF16 storage, 2 x numel); 0 when that dtype is
 *             fp32: the master itself is uploaded
 *   grads     fp32 gradient sums: 4 x numel (0 for a forward-only program)
 *   moments   AdamW m and v: 8 x numel in fp32, 4 x numel in bf16
 *             (train.adam_moments, which the config copies into
 *             mem->adam_moments; mem NULL: fp32); 0 forward-only
 *   acts      offloaded activations' host copies (mf_schedule.host_act_bytes)
 *   pinned    the staging arena (planner/staging.h), pinned
 * total = the sum. The pinned part is checked against pinned_limit too.
 * Parameters whose optimizer the schedule puts on the device count their
 * master weights (they come home for evaluations and the final save) and
 * their working copy (their first upload, and where they come home): no
 * gradient sum or moments on the host. (train's host buffers span every
 * parameter, but those ranges are never touched, so anonymous memory never
 * backs them.)
 *
 * NVMe spill. Past host_limit, the master weights of parameters updated on
 * the device spill first (read only for an evaluation or the final save: no
 * per-step traffic), then moments, then the other master weights (each
 * read and written once per step by the host AdamW, so they cost the least
 * traffic per byte spilled), then the working copy (written by the AdamW,
 * read by the uploads), then the gradient sums when every gradient lands
 * home once a step (no gradient copy adds into the host's sum: layer-major
 * order or gradients kept on the device), written once and read once;
 * offloaded activations, the staging arena and gradient sums that
 * micro-batches add into never spill. Spill needs memory.nvme_dir and a profile with an NVMe bandwidth;
 * without either, the excess is unplaced (the plan does not fit the host).
 */
#ifndef MF_PLANNER_HOST_H
#define MF_PLANNER_HOST_H

#include <stdint.h>

#include "planner/hwprofile.h"
#include "planner/schedule.h"
#include "src/config/config.h"
#include "src/core/core.h"
#include "src/model/program.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mf_host_usage {
  uint64_t master_bytes, working_bytes, grad_bytes, moment_bytes, act_bytes, pinned_bytes;
  uint64_t total_bytes;
  uint64_t host_limit;   /* memory.host_limit; for auto, the profile's host memory */
  uint64_t pinned_limit; /* memory.pinned_limit; 0 (auto): bounded by host_limit only */
  uint64_t pinned_home_bytes; /* a process's pinned host regions (run_plan.h mf_pinned_home: the offloaded
                                 activations and what else it pins), counted in their parts above too */
  uint64_t pinned_per_node; /* the processes pinned_bytes counts (its staging arena each) */
  int pinned_fits;       /* pinned_bytes + pinned_home_bytes <= pinned_limit (1 for auto) */
  int host_fits;         /* total_bytes <= host_limit */
  int nvme;              /* spill possible: memory.nvme_dir set and the profile has an NVMe bandwidth */
  uint64_t spill_moment_bytes, spill_master_bytes, spill_grad_bytes; /* what goes to NVMe (0: fits, or no NVMe) */
  uint64_t spill_working_bytes;     /* the part of the working copy on NVMe */
  uint64_t cold_master_bytes;       /* master weights of parameters updated on the device (in master_bytes) */
  uint64_t spill_cold_master_bytes; /* the part of those on NVMe: no per-step traffic (not in spill_master_bytes) */
  uint64_t unplaced_bytes;                         /* what fits neither host memory nor NVMe */
} mf_host_usage;

/* The host memory of schedule `s` of program `p` with a staging arena of
 * `pinned_bytes` (mf_staging.arena_bytes), for one node: with several ranks
 * on it (p->node_ranks) the state once, their activations and staging each. `mem` may be NULL (every limit
 * auto, no NVMe). `s` may be NULL for an estimate before planning: no
 * offloaded activations, and gradient sums counted as landing once a step
 * when the program is layer-major or has one micro-batch.
 * MF_ERR_INVALID_ARG for a schedule of another program. */
mf_status mf_host_account(const mf_program *p, const mf_schedule *s, uint64_t pinned_bytes,
                          const mf_config_memory *mem, const mf_hwprofile *hw, mf_host_usage *out);

/* Sets u's pinned home (a process's pinned host regions, counted in their
 * parts already) and what fits memory.pinned_limit again. */
void mf_host_set_pinned_home(mf_host_usage *u, uint64_t bytes);

/* NVMe traffic per step of the spilled state: every spilled byte read and
 * written once by the host optimizer. */
uint64_t mf_host_spill_traffic_bytes(const mf_host_usage *u);

/* Seconds per step that the spill costs at the profile's NVMe bandwidth
 * (traffic / nvme_bandwidth), to add to the optimizer's predicted time: 0
 * with nothing spilled, INFINITY when something is unplaced. */
double mf_host_spill_seconds(const mf_host_usage *u, const mf_hwprofile *hw);

/* Why host bytes are unplaced (u->unplaced_bytes > 0), for people: no
 * memory.nvme_dir, a profile without an NVMe bandwidth, or the rest is not a
 * part that spills. `mem` as given to mf_host_account (may be NULL). */
const char *mf_host_unplaced_why(const mf_host_usage *u, const mf_config_memory *mem);

/* What the plan keeps in files in memory.nvme_dir: every spilled part, the
 * cold master weights (no per-step traffic) included. */
uint64_t mf_host_spill_bytes(const mf_host_usage *u);

/* The host memory the plan keeps in this machine's memory: total_bytes less
 * what spills to NVMe (the unplaced bytes count: they have nowhere else). */
uint64_t mf_host_resident_bytes(const mf_host_usage *u);

/* The memory this machine can give a run now, for refusing a run whose host
 * memory it cannot hold before anything large is allocated:
 *   MF_HOST_MEMORY   when set, a size (mf_parse_size: 64GiB, 512MB) standing
 *                    in for the machine (tests; a machine that misreports);
 *   else MemAvailable of /proc/meminfo: what the kernel can hand out without
 *                    swapping (free memory and the page cache it can drop).
 *                    Not MemTotal: memory other processes hold is not the
 *                    run's, and a run past MemAvailable swaps or meets the
 *                    OOM killer. Bounded by the cgroup's memory limit when
 *                    that is lower (cgroup v2 memory.max, v1
 *                    memory.limit_in_bytes);
 *   else             sysconf's available pages.
 * *bytes 0: unknown (nothing to compare with). `source` receives where the
 * figure came from, for messages. A malformed MF_HOST_MEMORY: MF_ERR_CONFIG
 * naming it. */
mf_status mf_host_machine_memory(uint64_t *bytes, char *source, size_t source_cap);

#ifdef __cplusplus
}
#endif

#endif /* MF_PLANNER_HOST_H */
