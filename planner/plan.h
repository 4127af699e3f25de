/*
 * The planner's choice: decisions for every tensor that fit the device budget
 * and are predicted fastest, beside the baselines it is measured against.
 *
 * Method (DESIGN.md "The planner, in short"): start from the least-memory plan
 * (every weight and gradient streamed, every activation the backward needs
 * recomputed where it can be, else offloaded); a budget that cannot hold even
 * that is an error stating the minimum and what takes it. Then spend the budget
 * greedily: candidate changes (a layer's weights resident, its gradients kept on
 * the device, an activation kept, or offloaded instead of recomputed) are each
 * simulated once against the least-memory plan and applied in order of
 * predicted seconds saved per device byte while the arena fits. Finally the
 * chosen plan is compared with the baselines that fit, and the planner never
 * returns a plan predicted slower than the best of them.
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
  MF_PLAN_RESIDENT,      /* everything on the device */
  MF_PLAN_ZERO_OFFLOAD,  /* weights resident, gradients and optimizer at home (ZeRO-Offload-like) */
  MF_PLAN_MEGATRAIN,     /* stream every layer's weights, recompute everything (MegaTrain-like) */
  MF_PLAN_CHECKPOINT,    /* weights resident, every layer checkpointed: recompute inside layers */
  MF_PLAN_LEAST_MEMORY,  /* the planner's starting point */
  MF_PLAN_KIND_COUNT_
} mf_plan_kind;

const char *mf_plan_kind_name(mf_plan_kind k);

typedef struct mf_plan {
  mf_plan_kind kind;
  const mf_program *prog;
  mf_decisions *d;
  mf_schedule *s;
  mf_sim_result sim;
  uint64_t budget;
  int fits; /* arena_bytes <= budget */
} mf_plan;

/* Schedules and simulates decisions `d` (copied). */
mf_status mf_plan_evaluate(const mf_program *p, const mf_hwprofile *hw, const mf_decisions *d, uint64_t budget,
                           mf_plan_kind kind, mf_plan **out);
/* A baseline's decisions, scheduled and simulated. */
mf_status mf_plan_baseline(const mf_program *p, const mf_hwprofile *hw, mf_plan_kind kind, uint64_t budget,
                           mf_plan **out);
/* The planner's choice within `budget` bytes of arena. `fixed` holds decisions
 * pinned by overrides (pins marks which; both may be NULL). */
mf_status mf_plan_choose(const mf_program *p, const mf_hwprofile *hw, uint64_t budget, const mf_decisions *fixed,
                         const mf_plan_pins *pins, mf_plan **out);
void mf_plan_free(mf_plan *pl); /* NULL is fine */

/* The hardware profile a config's `hardware.profile` names: the file itself, or
 * for "auto" (or NULL) runs/hw/cpu.yaml when `moefit profile` wrote one, else
 * the bundled configs/hw/cpu-2core.yaml. */
const char *mf_plan_profile_path(const char *setting);

#ifdef __cplusplus
}
#endif

#endif /* MF_PLANNER_PLAN_H */
