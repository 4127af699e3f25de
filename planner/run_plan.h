/*
 * The run plan: the one place that turns a validated config (with its
 * overrides) and a backend into what a run will do — the step program, the
 * plan (decisions, schedule, arena, predicted timeline) beside the
 * baselines, the pinned staging layout, and the host-memory accounting.
 * `moefit plan`, `moefit train` and `moefit eval` all call
 * mf_run_plan_make; nothing else maps config keys to planning options, so
 * what `moefit plan` shows is what `moefit train` runs, and the plan.json that train writes equals `moefit plan --json`.
 *
 * What it decides from the config:
 *   backend      `backend` resolved by name (kernels/registry.h: auto is cuda
 *                when a GPU is visible) and the device memory it keeps beside
 *                the arena (cuBLASLt workspace, kernel scratch, the CUDA
 *                context);
 *   storage      train.precision: the device storage of weights, activations
 *                and their gradients (auto: BF16 on cuda, F32 on cpu);
 *   profile      hardware.profile (auto, planner/plan.h
 *                mf_plan_profile_path: on cpu runs/hw/cpu.yaml when `moefit
 *                profile` wrote one, else configs/hw/cpu-2core.yaml; on cuda
 *                <output.dir>/hw-cuda.yaml when auto measured the GPU there
 *                (src/train/hwmeasure.h, before the plan is made), else
 *                runs/hw/cuda.yaml, else configs/hw/h100-pcie.yaml, spec-sheet
 *                estimates; a bundled file missing where moefit runs is read
 *                from its copy built into moefit);
 *   budget       memory.device_budget covers everything on the device; auto:
 *                the device's free memory when the backend can ask the GPU
 *                (cuda, with a GPU present; asking makes the CUDA context,
 *                so its memory is then outside both the free memory and the
 *                backend's own), else the hardware profile's
 *                device.memory less its device.reserve. The planner plans the
 *                arena within the budget less the backend's own bytes;
 *   program      train.micro_batch x data.seq_len tokens per micro-batch,
 *                train.grad_accum micro-batches (1 for eval), the aux-loss
 *                weight (train.aux_loss_coef, else the model's), the
 *                micro-batch order (train.micro_batch_order; auto: both
 *                planned, the faster kept), train.adam_moments;
 *   plan         memory.plan (auto: the planner's choice; a baseline; a plan
 *                file — a training step's, so eval plans auto instead),
 *                memory.overrides, memory.routing (measured routing prices
 *                expert copies), train.overlap_optimizer in the simulation,
 *                memory.host_limit / nvme_dir / pinned_limit for the host;
 *   pinned home  memory.pinned_home (mf_pinned_home below): the host regions
 *                pinned so that their copies go straight;
 *   staging      memory.staging (auto: on for cuda, off for cpu): the pinned
 *                staging arena of the other copies, laid out within what
 *                memory.pinned_limit leaves, its bytes counted in host memory.
 *
 * A plan fits (mf_run_fit) when it fits every limit: its device arena the
 * budget less the backend's own bytes, its host memory memory.host_limit
 * with the excess spilled to NVMe (nothing unplaced), its pinned home, pinned
 * activations and staging arena memory.pinned_limit. mf_run_plan_make makes a plan that does not fit all
 * the same (`moefit plan` shows it, then exits 1 with the reasons); a run
 * refuses it (mf_run_plan_admit), and refuses one whose host memory this
 * machine cannot give (planner/host.h mf_host_machine_memory), before it
 * allocates anything large.
 */
#ifndef MF_PLANNER_RUN_PLAN_H
#define MF_PLANNER_RUN_PLAN_H

#include <stdint.h>

#include "planner/staging.h"
#include "kernels/registry.h"
#include "planner/host.h"
#include "planner/hwprofile.h"
#include "planner/plan.h"
#include "planner/plan_io.h"
#include "experts/routing.h"
#include "src/config/config.h"
#include "src/core/core.h"
#include "src/model/params.h"
#include "src/model/program.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum mf_run_use {
  MF_RUN_TRAIN = 0, /* the training step: grad_accum micro-batches, gradients, the optimizer */
  MF_RUN_EVAL,      /* a forward pass of one micro-batch (moefit eval, train's evaluations) */
} mf_run_use;

/* The kernels a run's expert GEMMs and attention run on (kernels.expert_gemm,
 * kernels.attention), in words: "cpu" on the cpu backend; on cuda with fp32
 * storage "cuda-core" (those keys choose among bf16 storage's kernels);
 * with bf16 storage "mma" or "cutlass", "mma" or "cudnn". What plan prints
 * and plan.json records, and what train creates the backend with: a kernel
 * that cannot run there stops the run saying why. */
typedef struct mf_run_kernels {
  char expert_gemm[16];
  char attention[16];
  /* where each came from, for people: "auto", "kernels.attention", "MF_ATTENTION=cudnn over
   * kernels.attention", "the cpu backend's", "fp32 storage" */
  char expert_gemm_from[80];
  char attention_from[80];
} mf_run_kernels;

/* The pinned home: host regions that cross the link every step, pinned once
 * at start-up (the backend's host_register; on cpu the same calls, counted)
 * so that their copies go straight — one DMA each, no host copy into or out
 * of a staging slab. The regions:
 *   MF_HOME_WORKING  the bf16 working copy (BF16 storage), the span of the
 *                    weights the step streams (not those kept on the device);
 *   MF_HOME_GRADS    the fp32 gradient sums, the span of the gradients that
 *                    come home, when each lands once a step (no copy adds into
 *                    the host's sum: layer-major order, one micro-batch);
 *   MF_HOME_QUANT    LoRA's base stored quantized (the table's quantized home,
 *                    src/model/params.h), the span of the blobs the step streams;
 *   MF_HOME_ACTS     the offloaded activations' host copies (the executor
 *                    allocates them pinned, else in pageable memory:
 *                    src/exec/exec.h mf_exec_create_home).
 * None with memory.pinned_home false, for a plan inside another run's arena,
 * with several ranks (their home is the node's shared memory), or for a part
 * spilled to NVMe. The regions are pinned by their value — bytes crossing
 * the link a step for each byte pinned, most first — while they fit the
 * budget: memory.pinned_limit (auto: half of memory.host_limit), each whole
 * where it fits, else (the working copy, the gradient sums) the part of it
 * that fits and moves the most bytes a step (from a copy's start to a copy's
 * end: one range to pin); with a pinned_limit set, the staging
 * arena of the copies still staged must fit beside them, else the home is
 * chosen again within the limit less that arena. A copy whose bytes are
 * pinned goes straight whether or not the rest is staged (memory.staging);
 * the bits are the same either way. */
typedef enum mf_home_region {
  MF_HOME_WORKING = 0,
  MF_HOME_GRADS,
  MF_HOME_QUANT,
  MF_HOME_ACTS,
  MF_HOME_REGIONS_
} mf_home_region;

typedef struct mf_pinned_home {
  uint8_t pinned[MF_HOME_REGIONS_];     /* some of the region is pinned: [pin_lo, pin_hi) */
  uint64_t lo[MF_HOME_REGIONS_];        /* its span in its buffer, bytes [lo, hi) (the working copy's */
  uint64_t hi[MF_HOME_REGIONS_];        /*   from the table's offsets, the gradients' from toff) */
  uint64_t pin_lo[MF_HOME_REGIONS_];    /* its pinned part [pin_lo, pin_hi): [lo, hi) when pinned whole, */
  uint64_t pin_hi[MF_HOME_REGIONS_];    /*   empty when not at all; a copy goes straight when its bytes are
                                           inside it */
  uint64_t step_bytes[MF_HOME_REGIONS_]; /* bytes its copies move a step (both ways) */
  uint64_t pin_step_bytes[MF_HOME_REGIONS_]; /* of those, the copies that go straight */
  double host_s[MF_HOME_REGIONS_];      /* seconds of host copies a step the straight ones would take through
                                           staging slabs (2 bytes of host traffic a byte, host_memory_bandwidth) */
  uint64_t bytes;                       /* pinned: the pinned parts' bytes */
  uint64_t budget;                      /* what the working copy and gradients were chosen within */
  int32_t n_direct;                     /* copy instructions that go straight */
  char left_out[200];                   /* a region worth pinning that was not, and why; else "" */
} mf_pinned_home;

const char *mf_home_region_name(mf_home_region k);

/* Which limits a plan fits (1: it does). */
typedef struct mf_run_fit {
  int device; /* its arena within the budget less the backend's own bytes (memory.device_budget) */
  int host;   /* its host memory within memory.host_limit, the excess spilled to NVMe (nothing unplaced) */
  int pinned; /* its pinned memory (the pinned home, the staging arena) within memory.pinned_limit */
  int nvme;   /* what it spills fits memory.nvme_dir: the directory exists and has the room (1 when
                 nothing spills; room unknown, e.g. on a network filesystem, counts as room) */
  int all;    /* all four: the plan can run */
} mf_run_fit;

typedef struct mf_run_plan {
  mf_run_use use;
  int inside; /* planned inside another run plan's arena (mf_run_plan_make_inside) */
  /* Several nodes (cfg->ranks over cfg->node_ranks a node): the seconds a
   * step's leaders take to exchange the nodes' gradient sums (each receives
   * nodes - 1 of them) at the profile's network.bandwidth, after the step's
   * device work and before the optimizer: the same for every plan, so not in
   * the planner's comparisons nor in sim.step_seconds. 0: one node; NaN: the
   * profile has no network bandwidth. */
  double between_nodes_s;
  int64_t nodes;
  mf_backend_memory dev;   /* the backend (dev.name) and what it keeps on the device */
  mf_dtype storage;        /* device storage of weights and activations (train.precision): F32 or BF16 */
  mf_run_kernels kernels;  /* the expert GEMM and attention kernels (mf_run_plan_kernels) */
  uint64_t budget;         /* the device budget: everything on the device */
  uint64_t arena_limit;    /* budget less dev.total_bytes: what the arena is planned within */
  char budget_source[160]; /* where the budget came from, for people */
  char profile_path[MF_PLAN_PROFILE_PATH_MAX + 24];
  mf_hwprofile hw;         /* the hardware profile the plan is simulated on */
  mf_routing routing;      /* measured routing (share NULL: uniform) */
  int routed;              /* 1: planned with routing read from routing_path */
  char routing_path[1024];
  char routing_note[1536]; /* memory.routing auto passed over a routing file measured on another model:
                              one line saying so (experts/routing.h); else empty */
  mf_program *prog;
  mf_plan *all[MF_PLAN_KIND_COUNT_]; /* all[MF_PLAN_CHOSEN] is the run's plan; the others the baselines */
  mf_plan *plan;                     /* = all[MF_PLAN_CHOSEN] */
  int overlap_optimizer;             /* the host optimizer runs behind the next step (train.overlap_optimizer;
                                        auto: where the profile's device runs apart from the host (cuda),
                                        unless the chosen plan is predicted faster without) — simulated so,
                                        and train runs it so */
  int staged;                        /* copies go through the pinned staging arena (memory.staging;
                                        auto: on for cuda) */
  mf_staging *staging;               /* its layout when staged, else NULL */
  int staging_fits;                  /* the layout fits memory.pinned_limit (1 when not staged) */
  mf_host_usage host;                /* host memory, the staging arena included */
  mf_pinned_home home;               /* the pinned home (above) */
  uint8_t *direct;                   /* [the schedule's n_instr]: copies straight from or into the pinned home */
  mf_run_fit fit;                    /* what the chosen plan fits */
  mf_plan_figures fig;               /* what plan.json records beside the decisions */
} mf_run_plan;

/* Plans the run of `cfg` on model `t` for `use` (see the top of this file).
 * `ask_device`: a backend with a device is asked for its free memory (train
 * and eval; `moefit plan` too — on a machine without the GPU the profile
 * stands in). Errors name the key at fault: a budget smaller than the
 * backend's own device memory, a named plan over the budget. A plan over a
 * host or pinned limit is made (rp->fit says so): a run refuses it with
 * mf_run_plan_admit. *out is NULL on failure. */
mf_status mf_run_plan_make(const mf_config *cfg, const mf_param_table *t, mf_run_use use, int ask_device,
                           mf_run_plan **out);
/* The same for a program that runs in the backend and device arena of
 * `inside` (train's evaluation, between the training steps): `inside`'s
 * backend (its dev), budget, and its arena's bytes as the arena's limit
 * (budget_source says so). */
mf_status mf_run_plan_make_inside(const mf_config *cfg, const mf_param_table *t, mf_run_use use,
                                  const mf_run_plan *inside, mf_run_plan **out);
void mf_run_plan_free(mf_run_plan *rp); /* NULL is fine */

/* What rp->all[kind] fits: rp->fit for the chosen plan; for another, its
 * arena against the budget and its host memory accounted as the chosen
 * plan's is (its own staging arena laid out within memory.pinned_limit when
 * copies are staged; not for a plan over the device budget, which cannot run
 * whatever its staging: its host memory then counts no staging arena).
 * `cfg` is the config rp was made from. */
mf_status mf_run_plan_fit_of(const mf_run_plan *rp, const mf_config *cfg, mf_plan_kind kind, mf_run_fit *out);

/* Why the chosen plan cannot run, for people: each limit it exceeds with its
 * figures and the keys to change, joined by "; " into buf (empty when it
 * fits). Returns the number of reasons. */
int mf_run_plan_misfit(const mf_run_plan *rp, const mf_config *cfg, char *buf, size_t cap);

/* What would run where the chosen plan is over memory.host_limit or needs a
 * memory.nvme_dir it has not got (a training plan): the config changed one
 * way at a time and planned as this run was — the AdamW moments in bf16
 * (train.adam_moments=bf16); LoRA rank 16 over the frozen base kept at home
 * in bf16, on every projection the family has (when the run is not LoRA
 * already); the state spilled to NVMe (a profile with an NVMe bandwidth,
 * memory.nvme_dir unset or not usable) — each as "KEY=VALUE ...: X of host
 * memory[ + Y on NVMe], Z s/step predicted" or "(over memory.host_limit too)",
 * joined by "; " into buf. Returns how many (0 and an empty buf when one
 * could not be planned). Costs a plan per alternative. */
int mf_run_plan_alternatives(const mf_run_plan *rp, const mf_config *cfg, char *buf, size_t cap);

/* Before a run starts on rp (train and eval, before they allocate the device
 * arena or the host state): MF_ERR_CONFIG "the plan cannot run: <reasons>"
 * when the chosen plan does not fit (mf_run_plan_misfit), or when the host
 * memory it keeps (rp->host less what spills to NVMe, and on the cpu backend
 * the device arena, which is host memory) is more than this machine can give
 * (mf_host_machine_memory), naming both figures and the keys to change. Each
 * run plan is checked alone (train's evaluation plan, made inside the
 * training plan's arena, does not count that arena again). When host memory
 * or NVMe is what it is
 * over, the message's second line lists mf_run_plan_alternatives. On success,
 * logs rp->routing_note. */
mf_status mf_run_plan_admit(const mf_run_plan *rp, const mf_config *cfg);

/* The run's plan as plan JSON (planner/plan_io.h), atomically: the decisions
 * and rp->fig. The same config and overrides give the same bytes. */
mf_status mf_run_plan_write_json(const mf_run_plan *rp, const char *path);

/* The device storage a run of cfg on `backend` ("cpu" or "cuda", resolved)
 * uses: train.precision, auto being BF16 on cuda and F32 on cpu (cfg NULL:
 * auto). What rp->storage holds; `moefit profile` times kernels in it. */
mf_dtype mf_run_plan_storage(const mf_config *cfg, const char *backend);

/* The kernels a run of cfg on `backend` ("cpu" or "cuda", resolved) in
 * `storage` runs (mf_run_kernels): the environment's MF_EXPERT_GEMM and
 * MF_ATTENTION (src/core/env.h) over the keys, the keys over auto; auto is
 * mma for both until cutlass and cudnn are measured passing and faster on a
 * GPU (then auto takes them on that GPU's architecture). */
void mf_run_plan_kernels(const mf_config *cfg, const char *backend, mf_dtype storage, mf_run_kernels *out);

/* The kernel scratch a run of cfg creates its backend with, for a model of
 * `spec` (0: the backend's default): a training run's attention on cuDNN
 * (mf_run_plan_kernels; kernels/registry.h mf_backend_attention_scratch)
 * needs its backward's workspace there. The run plan reserves it beside the arena (rp->dev), and
 * train, bench kernels and profile --config create the backend with it. */
uint64_t mf_run_plan_scratch(const mf_config *cfg, const mf_model_spec *spec, mf_run_use use);
/* The same with attention on cuDNN whatever kernels.attention says (bench
 * kernels times both attention kernels). */
uint64_t mf_run_plan_scratch_cudnn(const mf_config *cfg, const mf_model_spec *spec);

#ifdef __cplusplus
}
#endif

#endif /* MF_PLANNER_RUN_PLAN_H */
