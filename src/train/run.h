/*
 * A run, opened the one way every command opens it: `plan`, `train`,
 * `eval`, `bench kernels` and `profile --config` each call mf_run_open up to
 * the stage they need, so what `plan` shows is what `train` runs and what
 * `bench kernels` times:
 *
 *   MF_RUN_TABLE     the model's parameter table, LoRA added as train.lora
 *                    says (train.h mf_run_model_table: from the spec alone,
 *                    no weights read);
 *   MF_RUN_PLANNED   the hardware profile (hardware.profile auto measures one
 *                    where it has none yet: src/train/hwmeasure.h), then the
 *                    run plan (planner/run_plan.h), written to plan_json when
 *                    given — before the backend exists, so a run that cannot
 *                    start still shows what it would have run;
 *   MF_RUN_BACKEND   the backend the plan names, created with the plan's
 *                    kernel scratch;
 *   MF_RUN_EXECUTOR  the plan admitted (over a limit, or more host memory
 *                    than this machine gives: refused before anything large
 *                    is allocated), the executor and its device arena, the
 *                    pinned staging arena the plan lays out, the batch
 *                    buffers.
 *
 * One backend and one device arena a process: a run opened `inside` another
 * (train's evaluation between the training steps) is planned within that
 * run's arena (no profile step, no plan file) and runs on its backend and
 * arena; the two take turns (src/exec/exec.h mf_exec_invalidate).
 */
#ifndef MF_TRAIN_RUN_H
#define MF_TRAIN_RUN_H

#include <stdint.h>

#include "kernels/backend.h"
#include "planner/run_plan.h"
#include "src/config/config.h"
#include "src/core/core.h"
#include "src/exec/exec.h"
#include "src/model/params.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum mf_run_stage {
  MF_RUN_NONE = 0,
  MF_RUN_TABLE,    /* the parameter table */
  MF_RUN_PLANNED,  /* + the hardware profile and the run plan */
  MF_RUN_BACKEND,  /* + the backend */
  MF_RUN_EXECUTOR, /* + the plan admitted, the executor, its arena and staging, the batch buffers */
} mf_run_stage;

typedef struct mf_run_opts {
  mf_run_use use;      /* MF_RUN_TRAIN or MF_RUN_EVAL */
  mf_run_stage upto;   /* how far to open */
  const char *model_dir; /* the table from this model dir's config.json instead of model.path/model.init */
  const char *ckpt;      /* LoRA on hot experts: the hot set of this checkpoint (resume) */
  /* A table of the caller's instead of one the run opens (borrowed, not
   * freed): eval's with an adapter dir's LoRA added, train's evaluation
   * sharing the training run's. */
  mf_param_table *table;
  mf_threadpool *pool;   /* host threads for the profile step and the backend (NULL: none) */
  const char *plan_json; /* write the plan here (train) */
  /* The kernel scratch cuDNN's attention needs whichever attention runs
   * (bench kernels times both), not only what the plan's attention needs. */
  int cudnn_scratch;
  /* Run inside this run's backend and device arena (opened to MF_RUN_EXECUTOR
   * and outliving this one); NULL: a backend and arena of its own. */
  const struct mf_run *inside;
  /* Several ranks: the quantized base's home is the node's shared memory
   * (train's node state has the table borrow it); none is allocated here. */
  int node_home;
} mf_run_opts;

typedef struct mf_run {
  mf_run_stage stage;      /* how far it is open */
  mf_param_table *t;       /* the model's table */
  int t_owned;
  mf_run_plan *rp;         /* the plan it runs (planner/run_plan.h) */
  mf_backend *backend;     /* its own, or its host's (inside) */
  mf_exec *exec;
  int staging_threads;      /* host threads each way through the staging arena (0: not staged) */
  int32_t **ids, **targets; /* the batch buffers [G][B*S] */
  int64_t G;
  uint16_t *working; /* BF16 storage: the weights' bf16 working copy the executor uploads (else NULL) */
  int working_owned;
  struct {
    void *ptr;
    size_t bytes;
  } pins[MF_HOME_REGIONS_]; /* the pinned home's regions registered with the backend (ptr NULL: none) */
  const struct mf_run *inside; /* the run whose backend and arena this one uses (else NULL) */
} mf_run;

/* Opens r (zeroed before its first call) from the stage it is at up to
 * o->upto; a later call with a higher stage goes on from there (train opens
 * the table, checks its token files against it, then opens the rest). The
 * same options each call, but for upto. On failure what was opened stays
 * open: mf_run_close frees it. */
mf_status mf_run_open(const mf_config *cfg, const mf_run_opts *o, mf_run *r);
/* Pins region k of the plan's pinned home (planner/run_plan.h
 * mf_pinned_home) in `base`, a buffer of `total` bytes: its span, widened to
 * whole pages within the buffer, registered with the backend once (again
 * for another buffer; mf_run_close undoes it). Nothing when the plan does
 * not pin k. A backend that cannot pin, or a registration that fails, is a
 * warning: the region's copies go straight all the same, from pageable
 * memory (slower, the same bits). The working copy is pinned by the
 * mf_run_round_* calls that set it; train pins the gradient sums; the
 * executor allocates the activations pinned when the plan says so. */
mf_status mf_run_pin_home(mf_run *r, mf_home_region k, void *base, size_t total);

/* Frees what r opened (a run inside another is closed before it); r zeroed. */
void mf_run_close(mf_run *r);

#ifdef __cplusplus
}
#endif

#endif /* MF_TRAIN_RUN_H */
