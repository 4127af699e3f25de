/*
 * Private to planner/: what plan.c (evaluation, baselines), choose.c (the
 * greedy choice) and plan_for.c (programs, orders, named plans) share.
 */
#ifndef MF_PLANNER_PLAN_INTERNAL_H
#define MF_PLANNER_PLAN_INTERNAL_H

#include <stdint.h>

#include "planner/plan.h"

/* Work spread over the planner's threads: worker i takes items i, i + n, ...
 * Each item's result depends on the item only, so any thread count gives the
 * same plan. A failing worker's status and message come back to the caller. */
#define MF_PLAN_MAX_WORKERS 64

typedef struct mf_plan_par {
  mf_status st[MF_PLAN_MAX_WORKERS];
  char msg[MF_PLAN_MAX_WORKERS][512];
} mf_plan_par;

void mf_plan_par_fail(mf_plan_par *q, int i, mf_status st);
mf_status mf_plan_par_status(const mf_plan_par *q, int n);
int mf_plan_pool_size(mf_threadpool *pool);

/* Schedules and simulates d with simulation options so (NULL: defaults). */
mf_status mf_plan_eval(const mf_program *p, const mf_hwprofile *hw, const mf_sim_opts *so,
                       const mf_decisions *d, uint64_t budget, mf_plan_kind kind, mf_plan **out);
/* A baseline's decisions, and the baseline scheduled and simulated with so
 * (`lazy`: simulated only when it fits the budget; mf_plan_simulate later). */
mf_status mf_plan_baseline_decisions(const mf_program *p, mf_plan_kind kind, mf_decisions *d);
mf_status mf_plan_baseline_so(const mf_program *p, const mf_hwprofile *hw, const mf_sim_opts *so,
                              mf_plan_kind kind, uint64_t budget, int lazy, mf_plan **out);
/* Every activation the backward reads: layer outputs offloaded, the rest
 * recomputed where they can be, else offloaded. opt: mf_schedule_act_options. */
void mf_plan_least_activations(const mf_program *p, const uint8_t *opt, mf_decisions *d);
/* Evaluates the baselines into all[RESIDENT..CHECKPOINT] and, unless
 * `pinned`, replaces *best with the fastest that fits when it beats it
 * (`lazy`: those over the budget are left unsimulated). */
mf_status mf_plan_adopt_baselines(const mf_program *p, const mf_hwprofile *hw, const mf_sim_opts *so,
                                  uint64_t budget, int pinned, int lazy, mf_threadpool *pool, mf_plan **best,
                                  mf_plan **all);
/* The baselines of p beside all[MF_PLAN_CHOSEN] (least memory included). */
mf_status mf_plan_all_baselines(const mf_program *p, const mf_hwprofile *hw, const mf_sim_opts *so,
                                uint64_t budget, int lazy, mf_plan **all);
/* The choice (all[CHOSEN]), its starting point (all[LEAST_MEMORY]) and the
 * baselines (adopted when faster); offloaded activations' host copies within
 * host_acts bytes. `lazy`: baselines over the budget are left unsimulated
 * (mf_plan_for simulates the ones of the order it keeps). */
mf_status mf_plan_choose_so(const mf_program *p, const mf_hwprofile *hw, const mf_sim_opts *so,
                            uint64_t budget, uint64_t host_acts, const mf_decisions *fixed,
                            const mf_plan_pins *pins, int lazy, mf_plan **all);

#endif /* MF_PLANNER_PLAN_INTERNAL_H */
