/*
 * The planner's choice: decisions for every tensor that fit the device budget
 * and are predicted fastest, beside the baselines it is measured against.
 *
 * Method (docs/planner.md): start from the least-memory plan
 * (every weight and gradient streamed, every activation the backward needs
 * recomputed where it can be, else offloaded, the optimizer on the host); a
 * budget that cannot hold even that is an error stating the minimum and what
 * takes it. Then spend the budget greedily: candidate changes (a layer's
 * weights resident, its gradients kept on the device, an activation class
 * kept, or offloaded instead of recomputed, and — a training step — a layer's
 * optimizer on the device: all its parameters resident, their gradients on
 * the device and their AdamW state there, for the layers and for the
 * parameters of no layer: embeddings, final norm, head) are each simulated
 * once against the least-memory plan (the optimizer's against the layer's
 * weights resident and gradients on the device, so its gain is what the
 * device optimizer saves — host AdamW time and the gradients' copies home —
 * and its bytes the state's and the longer lifetimes) and applied in order
 * of predicted seconds saved per device byte while the arena fits (each
 * checked by building the schedule). Pinned decisions (mf_plan_pins) never
 * change: a candidate that would change one is not offered. Finally the
 * chosen plan is compared with the baselines that fit, and the planner never
 * returns a plan predicted slower than the best of them.
 *
 * Large steps (instructions x candidates past a few million) are scored on a
 * proxy (planner/proxy.h): a short model with one representative of each kind
 * of layer, whose scores stand for every layer of that kind; then the longest
 * prefix of the sorted candidates that fits is found by bisection and up to 4
 * more predicted to fit are tried one by one. The chosen decisions are always
 * scheduled and simulated on the full step. The environment variable
 * MF_PLAN_SCORING=exact (or proxy) forces one way for any size, to compare
 * them. Set MF_LOG=debug to see the planner's phases and times.
 */
#ifndef MF_PLANNER_PLAN_H
#define MF_PLANNER_PLAN_H

#include <stdint.h>

#include "planner/hwprofile.h"
#include "planner/plan_io.h"
#include "planner/schedule.h"
#include "planner/simulate.h"
#include "src/core/core.h"
#include "src/model/program.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum mf_plan_kind {
  MF_PLAN_CHOSEN = 0,    /* the planner's */
  MF_PLAN_RESIDENT,      /* everything on the device, the optimizer (AdamW state) included: plain
                            PyTorch-like */
  MF_PLAN_ZERO_OFFLOAD,  /* weights resident, gradients and optimizer at home (ZeRO-Offload-like) */
  MF_PLAN_MEGATRAIN,     /* stream every layer's weights, recompute everything, optimizer at home
                            (MegaTrain-like) */
  MF_PLAN_CHECKPOINT,    /* all resident (the optimizer on the device too), every layer checkpointed:
                            recompute inside layers */
  MF_PLAN_LEAST_MEMORY,  /* the planner's starting point: optimizer at home */
  MF_PLAN_KIND_COUNT_
} mf_plan_kind;

const char *mf_plan_kind_name(mf_plan_kind k);

typedef struct mf_plan {
  mf_plan_kind kind;
  char name[1024]; /* what it is, for people: "the planner's choice", "MegaTrain-like", a plan file's path */
  const mf_program *prog;
  const mf_hwprofile *hw; /* the profile it was simulated on (kept by the caller) */
  mf_sim_opts so;         /* and the simulation's options */
  mf_decisions *d;
  mf_schedule *s;
  mf_sim_result sim;
  uint64_t budget;
  int fits;      /* arena_bytes <= budget */
  int simulated; /* sim holds the simulation (the planner leaves a baseline over the budget unsimulated
                    until it is shown: mf_plan_for simulates every plan it returns) */
} mf_plan;

/* Simulates pl when it is not yet (mf_plan.simulated). */
mf_status mf_plan_simulate(mf_plan *pl);
/* Gives pl other simulation options: its simulation is dropped, to be made
 * again with them by mf_plan_simulate. */
void mf_plan_set_sim_opts(mf_plan *pl, const mf_sim_opts *so);
/* Schedules and simulates decisions `d` (copied). */
mf_status mf_plan_evaluate(const mf_program *p, const mf_hwprofile *hw, const mf_decisions *d, uint64_t budget,
                           mf_plan_kind kind, mf_plan **out);
/* Decisions d scheduled and simulated as `like` was: its program, profile,
 * simulation options, budget and kind (the alternatives `moefit plan --tensor`
 * prices). */
mf_status mf_plan_evaluate_like(const mf_plan *like, const mf_decisions *d, mf_plan **out);
/* A baseline's decisions, scheduled and simulated. */
mf_status mf_plan_baseline(const mf_program *p, const mf_hwprofile *hw, mf_plan_kind kind, uint64_t budget,
                           mf_plan **out);
/* The planner's choice within `budget` bytes of arena. `fixed` holds decisions
 * pinned by overrides (pins marks which; both may be NULL). */
mf_status mf_plan_choose(const mf_program *p, const mf_hwprofile *hw, uint64_t budget, const mf_decisions *fixed,
                         const mf_plan_pins *pins, mf_plan **out);
/* The same, and the plans it compared on the way: all[MF_PLAN_CHOSEN] is the
 * choice, all[k] for every other kind that baseline (least memory: the
 * starting point, with the pinned decisions). The caller frees each. */
mf_status mf_plan_choose_all(const mf_program *p, const mf_hwprofile *hw, uint64_t budget, const mf_decisions *fixed,
                             const mf_plan_pins *pins, mf_plan **all);
void mf_plan_free(mf_plan *pl); /* NULL is fine */

/* What bounds a simulated step. Its parts add up to the step (simulate.h):
 * step = compute + exposed transfer + exposed optimizer; the bound is the
 * largest part — compute; the copies the compute waits for, named by the
 * busier copy stream (uploads: H2D, copies home: D2H); the host optimizer's
 * updates, or NVMe when the optimizer's state streaming from NVMe sets their
 * pace (mf_sim_opts.optimizer_floor_seconds over the profile's AdamW time). */
typedef enum mf_plan_bound_kind {
  MF_BOUND_COMPUTE = 0,
  MF_BOUND_UPLOADS,
  MF_BOUND_COPIES_HOME,
  MF_BOUND_HOST_OPTIMIZER,
  MF_BOUND_NVME
} mf_plan_bound_kind;

mf_plan_bound_kind mf_plan_bound(const mf_plan *pl);
const char *mf_plan_bound_name(mf_plan_bound_kind k); /* "compute", "uploads", "copies home", ... */
/* One line for people: "bound: uploads: the 9.08 s step is compute 5.99 s +
 * 3.09 s waiting on copies (H2D busy 3.23 s, D2H 0.11 s) + 0.00 s waiting on
 * the host optimizer (its updates 0.15 s, behind the next step's device
 * work)". `overlap`: the host optimizer runs behind the next step's device
 * work (train.overlap_optimizer) rather than after the step. */
void mf_plan_bound_line(const mf_plan *pl, int overlap, char *buf, size_t cap);

/* What a training run or `moefit plan` asks for: build the step program and
 * plan it. */
typedef struct mf_plan_request {
  const mf_param_table *params;
  mf_program_opts opts; /* the batch; opts.order unless choose_order */
  int choose_order;     /* train.micro_batch_order auto: plan both orders, keep the faster */
  const mf_hwprofile *hw;
  mf_sim_opts sim;      /* e.g. overlap_optimizer (train.overlap_optimizer) */
  uint64_t budget;      /* device arena bytes; UINT64_MAX: none (a named plan's own arena) */
  const mf_config_memory *memory; /* memory.plan and memory.overrides (NULL: auto, none) */
  /* Measured routing, or NULL (uniform): each expert's share of its layer's
   * assignments, [layers * experts] (experts/routing.h; kept by the caller
   * while the plans live). It prices expert copies by the chance they happen
   * (mf_sim_opts.expert_share) and adds candidates that keep a layer's
   * hottest experts resident (its top quarter, its top half). */
  const double *expert_share;
} mf_plan_request;

/* Builds the program and plans it, as memory.plan says:
 *   auto        the planner's choice within the budget (mf_plan_choose_all),
 *               memory.overrides pinning its decisions;
 *   a baseline  that baseline's decisions, memory.overrides on top (a pinned
 *               decision replaces the baseline's for the tensors it matches);
 *   a file      the decisions mf_plan_read_json reads, overrides on top; a
 *               forward-only program (eval) cannot follow one (it describes
 *               the training step) and gets auto instead.
 * The planner's choice also keeps the offloaded activations' host copies
 * within what host memory leaves them: memory.host_limit (auto: the
 * profile's) less the working copy, memory.pinned_limit and, without NVMe
 * to spill them to (planner/host.h), the master weights, gradient sums and
 * moments.
 * A named plan must fit the budget (an error says what it needs); all[] holds
 * it as all[MF_PLAN_CHOSEN] beside the baselines. With choose_order the
 * program is built in each order — micro-batch-major and, with G > 1, untied
 * embeddings and a training step, layer-major — and the order whose plan is
 * predicted faster is kept (micro-batch-major on a tie; a file's own order is
 * the only one it reads in) — but one whose host memory fits (estimated with
 * planner/host.h before planning) over one whose does not. Optimizer state
 * that spills to NVMe slows the host optimizer: the estimated NVMe traffic's
 * time is its floor (mf_sim_opts.optimizer_floor_seconds), so predicted steps
 * include it. Gradient overrides are ignored for a
 * forward-only program. *prog and all[] belong to the caller: free the plans
 * before the program. When no order can be planned, the first order's error. */
mf_status mf_plan_for(const mf_plan_request *rq, mf_program **prog, mf_plan **all);

/* Where a run's hardware profile comes from (mf_plan_profile_path). */
typedef enum mf_plan_profile_origin {
  MF_PROFILE_NAMED = 0, /* hardware.profile names the file */
  MF_PROFILE_MEASURED,  /* auto: a profile measured on this machine */
  MF_PROFILE_BUNDLED,   /* auto: the backend's bundled profile (a copy is built into moefit) */
} mf_plan_profile_origin;

/* The file hardware.profile auto on cuda measures into, in output.dir
 * (src/train/hwmeasure.h mf_hwmeasure_auto). */
#define MF_PLAN_CUDA_PROFILE_CACHE "hw-cuda.yaml"
/* The longest profile path (NUL included) the run plan reads: a cache in an
 * output dir whose path is longer is neither looked for nor written. */
#define MF_PLAN_PROFILE_PATH_MAX 1000
#define MF_PLAN_CPU_PROFILE_BUNDLED "configs/hw/cpu-2core.yaml"
#define MF_PLAN_CUDA_PROFILE_BUNDLED "configs/hw/h100-pcie.yaml"

/* The hardware profile a config's `hardware.profile` names for a run on
 * `backend` ("cpu" or "cuda", resolved) that writes to out_dir (may be NULL):
 * the file itself; for "auto" (or NULL)
 *   cpu:  runs/hw/cpu.yaml when `moefit profile` wrote one, else the bundled
 *         configs/hw/cpu-2core.yaml (measured on the development machine);
 *   cuda: <out_dir>/hw-cuda.yaml when auto measured one there (train, eval
 *         or plan with the GPU present), else runs/hw/cuda.yaml when
 *         `moefit profile --backend cuda` wrote one, else the bundled
 *         configs/hw/h100-pcie.yaml (spec-sheet estimates).
 * The path is written to buf (cap bytes) and returned; *origin (may be
 * NULL) says which it is. Only reads whether files exist: the planner never
 * measures. */
const char *mf_plan_profile_path(const char *setting, const char *backend, const char *out_dir, char *buf,
                                 size_t cap, mf_plan_profile_origin *origin);

#ifdef __cplusplus
}
#endif

#endif /* MF_PLANNER_PLAN_H */
