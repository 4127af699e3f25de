/*
 * Measuring this machine's hardware profile (planner/hwprofile.h): what
 * `moefit profile` runs, and what `hardware.profile: auto` runs for a run
 * that has no profile measured yet (mf_hwmeasure_auto).
 *
 * It lives here, above the executor, because timing the step program's own
 * calls needs the executor (src/exec), which the planner (a lower level) may
 * not call: the planner only reads profiles (planner/plan.h
 * mf_plan_profile_path says which), and the commands that plan a run
 * (train, eval, plan) call mf_hwmeasure_auto first, so the profile they plan
 * with exists before mf_run_plan_make reads it.
 *
 * Every device figure is measured through a backend created by name
 * (kernels/registry.h) and driven by its interface (kernels/backend.h) as the
 * executor drives it: copies and kernels submitted to its streams, operands
 * in its arena, host buffers from its host_alloc (pinned on cuda), timed by
 * its timed events (on the cpu backend's immediate streams an event is
 * stamped with the host clock when recorded, so this is the host's time of
 * the calls). Each figure is the best of several runs (a shared machine is
 * noisy one way: slower), each run long enough for the clock. Kernels run in
 * the storage dtype a run would use (planner/run_plan.h mf_run_plan_storage:
 * train.precision; auto is BF16 on cuda, F32 on cpu).
 */
#ifndef MF_TRAIN_HWMEASURE_H
#define MF_TRAIN_HWMEASURE_H

#include "planner/hwprofile.h"
#include "src/config/config.h"
#include "src/core/core.h"
#include "src/model/params.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mf_hwmeasure_opts {
  const char *backend;  /* "cpu" or "cuda" */
  int quick;            /* fewer shapes and repeats */
  const mf_config *cfg; /* NULL, or the config whose training step is timed into compute.kernels (its
                           shapes, its train.precision; its train.threads size the host pool) */
  const char *cfg_path; /* its file, for the profile's notes */
  /* The model's parameter table (NULL: built from cfg's model.init; a
   * model.path config then cannot be timed, since a profile reads no
   * checkpoint). */
  const mf_param_table *table;
  /* 1: a step that cannot be timed here (no model.init and no table; over
   * the GPU's free memory with every tensor resident) is left out with the
   * reason in mf_hwmeasure_info.kernels_skipped; 0: that is the error. */
  int kernels_optional;
  mf_threadpool *pool; /* host work (AdamW, host bandwidth, the cpu kernels); NULL: one of the config's
                          train.threads (default all cores) is made and freed */
  const char *cmdline; /* what is measuring, for the notes ("moefit profile --backend cuda ...") */
} mf_hwmeasure_opts;

/* What the profile has no field for, for the summary people read. */
typedef struct mf_hwmeasure_info {
  int threads; /* host threads */
  int reps;    /* runs per figure (the best kept) */
  const char *adamw_impl;
  mf_dtype storage;         /* the kernels' storage dtype */
  double duplex_bandwidth;  /* cuda: each direction's bytes/s with H2D and D2H at once on two streams */
  double d2d_bandwidth;     /* cuda: bytes read + written per second by a device-to-device copy */
  double host_launch_s;     /* cuda: the host pool's dispatch (host.memory_bandwidth's launch) */
  char device_name[128];    /* cuda: the GPU */
  uint64_t device_free;     /* cuda: its free memory when measuring began */
  int kernel_calls;         /* compute calls of the config's step timed; 0: none */
  char kernels_skipped[1200]; /* kernels_optional: why the step was not timed; else "" */
} mf_hwmeasure_info;

/* Measures every field of a profile on backend o->backend (see the top of
 * this file; `moefit profile --help` lists how each is measured) into *p,
 * with its notes in p->source. cuda without a GPU (or a build without
 * CUDA): MF_ERR_NO_DEVICE or MF_ERR_UNSUPPORTED, the message saying there is
 * no GPU to measure. */
mf_status mf_hwmeasure(const mf_hwmeasure_opts *o, mf_hwprofile *p, mf_hwmeasure_info *info);

/* hardware.profile auto for the run of cfg (model table t, may be NULL;
 * pool may be NULL). On the cpu backend, when runs/hw/cpu.yaml (what auto
 * reads: planner/plan.h mf_plan_profile_path) is missing: measures this
 * machine as `moefit profile --quick` does (no config: the profile of the
 * machine, which every config's auto reads; some seconds) into it, saying
 * so in one info line before and one after; not with several ranks (they
 * share the cores measured: the bundled profile then, as the plan says), nor
 * with MF_CPU_PROFILE=bundled in the environment (the test suite's setting:
 * the bundled profile's predictions on every machine, no measuring in each
 * fresh directory). A measurement that fails is a warning: the bundled
 * profile stays. On the cuda backend, when a GPU is present and no
 * profile was measured for it (neither <output.dir>/hw-cuda.yaml nor
 * runs/hw/cuda.yaml: planner/plan.h mf_plan_profile_path), measures one as
 * `moefit profile --backend cuda --quick --config` does (the step's calls
 * timed when it fits the GPU all resident) and writes it to
 * <output.dir>/hw-cuda.yaml, saying so in one info line before and one
 * after; mf_run_plan_make then reads it. Otherwise nothing (without a GPU the
 * plan uses the bundled spec-sheet profile and says so). */
mf_status mf_hwmeasure_auto(const mf_config *cfg, const mf_param_table *t, mf_threadpool *pool);

#ifdef __cplusplus
}
#endif

#endif /* MF_TRAIN_HWMEASURE_H */
