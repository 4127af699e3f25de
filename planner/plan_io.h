/*
 * Plans as data: decisions written to and read from versioned JSON, and the
 * config's memory.overrides applied to decisions.
 *
 * The JSON (format "moefit-plan", version 6):
 *   {
 *     "format": "moefit-plan", "version": 6,
 *     "model": {"family": "mixtral", "layers": 32, "hidden": 4096, "experts": 8, ...},
 *     "batch": {"micro_batch": 1, "seq_len": 4096, "grad_accum": 8, "order": "layer-major",
 *               "storage": "bf16"},
 *     "device_budget_bytes": N, "peak_device_bytes": N, "arena_bytes": N,
 *     "predicted_step_seconds": x,
 *     "staging_bytes": N, "staging_slab_limit_bytes": N, "staging_pool_bytes": N,
 *     "host_bytes": N, "persist_bytes": N, "device_backend_bytes": N, "pinned_home_bytes": N,
 *     "kernels": {"expert_gemm": "mma", "attention": "mma"},
 *     "tensors": [{"name": "...", "kind": "param", "bytes": N, "decision": "resident",
 *                  "optimizer": "device"},
 *                 {"name": "grad....", "kind": "grad", "bytes": N, "decision": "device"}, ...]
 *   }
 * The layout is fixed (keys in this order, two-space indent, integers in
 * decimal, the seconds as "%.17g" with ".0" where that reads as an integer),
 * so the same decisions and figures give a byte-identical file.
 * Every parameter appears twice — its weight ("param": resident | stream, and
 * "optimizer": host | device, where its AdamW update runs: mf_decisions.optim)
 * and its gradient ("grad": device | stream) — and every activation that may
 * be offloaded or recomputed once ("act": keep | offload | recompute); only
 * "param" entries have "optimizer". "device" needs the weights resident and
 * the gradient on the device (planner/schedule.h); reading refuses it
 * otherwise, and in a forward-only program (MF_ERR_CONFIG, naming the file,
 * the entry and the tensor). persist_bytes is the schedule's persistent
 * device bytes (weights and AdamW state of the parameters updated on the
 * device, filled once and kept across steps). batch.storage is the program's
 * device storage dtype ("fp32" or "bf16": p->storage), which sets every
 * tensor's bytes; device_backend_bytes is the backend's own device memory
 * beside the arena (library workspaces, kernel scratch, a reserve for the
 * CUDA context); kernels are what the expert GEMMs and attention run on
 * (planner/run_plan.h mf_run_kernels; version 5); pinned_home_bytes the host
 * regions pinned so that their copies go straight (planner/run_plan.h
 * mf_pinned_home; version 6). Names are
 * the program's: the parameter's name, "grad." + it, and the activation's with
 * its micro-batch ("mb1.model.layers.0.mlp.experts.act"); a forward-only
 * program has no "grad" entries. Reading validates the format, the version,
 * the model and batch against the program, every key (unknown ones are
 * refused), name, byte size and decision, and that nothing is missing; an
 * error names the file, the place and the fault: MF_ERR_FORMAT for a
 * malformed file, MF_ERR_CONFIG for one that does not fit the program,
 * MF_ERR_UNSUPPORTED for a newer version. On any error d and f are untouched.
 * Version 1 files (written before the staging and host figures and the
 * micro-batch order) are still read: they must not have the version-2 keys;
 * the figures read back as 0 and the order is micro-batch-major. Version 2
 * requires them; batch.order ("micro-batch-major" or "layer-major") must be
 * the program's (MF_ERR_CONFIG otherwise). Version 1 and 2 files (written
 * before the optimizer's placement) must not have "optimizer" or
 * "persist_bytes": every optimizer reads back as host and persist_bytes as 0.
 * Version 3 requires both. Version 1 to 3 files (written before the storage
 * and the backend's bytes) must not have batch.storage or
 * "device_backend_bytes": device_backend_bytes reads back as 0 and the
 * storage is not checked. Version 4 requires both; batch.storage must be the
 * program's (MF_ERR_CONFIG otherwise). Version 1 to 4 files must not have
 * "kernels" (read back as ""); version 5 requires it, each word one the key
 * takes. The writer writes version 5.
 */
#ifndef MF_PLANNER_PLAN_IO_H
#define MF_PLANNER_PLAN_IO_H

#include <stdint.h>

#include "planner/schedule.h"
#include "src/config/config.h"
#include "src/core/core.h"
#include "src/model/program.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Figures written alongside the decisions. */
typedef struct mf_plan_figures {
  uint64_t device_budget_bytes;
  uint64_t peak_device_bytes;
  uint64_t arena_bytes;
  double predicted_step_seconds;
  /* Version 2 (0 when read from a version-1 file). */
  uint64_t staging_bytes;            /* the pinned staging arena (planner/staging.h) */
  uint64_t staging_slab_limit_bytes; /* its max_slab_bytes, to lay it out again the same way */
  uint64_t staging_pool_bytes;       /* the ZeRO-Infinity-style pool on the same timeline */
  uint64_t host_bytes;               /* host memory in all (planner/host.h), the staging arena included */
  /* Version 3 (0 when read from an older file). */
  uint64_t persist_bytes; /* the schedule's persist_bytes: device bytes kept across steps (weights and
                             AdamW state of the parameters whose optimizer is on the device) */
  /* Version 4 (0 when read from an older file). */
  uint64_t device_backend_bytes; /* the backend's device memory beside the arena: library workspaces,
                                    kernel scratch, a reserve for the CUDA context */
  /* Version 5 ("" when read from an older file): "kernels": the kernels the
   * expert GEMMs and attention run on (planner/run_plan.h mf_run_kernels). */
  char expert_gemm[16]; /* cpu | cuda-core | mma | cutlass */
  char attention[16];   /* cpu | cuda-core | mma | cudnn */
  /* Version 6 (0 when read from an older file). */
  uint64_t pinned_home_bytes; /* the pinned home (planner/run_plan.h mf_pinned_home) */
} mf_plan_figures;

/* Writes d (which must be decisions the program allows: an activation decision
 * only on an offloadable activation, recompute only on a recomputable one, the
 * optimizer on the device only with the weights resident and the gradient on
 * the device, never in a forward-only program — MF_ERR_INVALID_ARG otherwise,
 * nothing written) and f to path, atomically. */
mf_status mf_plan_write_json(const mf_program *p, const mf_decisions *d, const mf_plan_figures *f, const char *path);
/* Reads decisions for program p (which must have the plan's model and batch);
 * f may be NULL. */
mf_status mf_plan_read_json(const mf_program *p, const char *path, mf_decisions *d, mf_plan_figures *f);

/* Pins: which decisions the overrides fixed (1) — the planner leaves those alone. */
typedef struct mf_plan_pins {
  uint8_t *param; /* [n_params] */
  uint8_t *grad;  /* [n_params] */
  uint8_t *act;   /* [n_tensors] */
  uint8_t *optim; /* [n_params] the optimizer's placement (mf_decisions.optim) */
} mf_plan_pins;

mf_status mf_plan_pins_create(const mf_program *p, mf_plan_pins *pins);
void mf_plan_pins_free(mf_plan_pins *pins);

/* Applies memory.overrides: for each entry, every parameter whose name matches
 * `match` (shell glob: * ? [..]) gets `params` (resident|stream), `grads`
 * (device|stream) and `optimizer` (host|device: where its AdamW update runs);
 * every offloadable activation whose name without the "mbN." prefix (or with
 * it, to pick one micro-batch) matches gets `activations`
 * (keep|offload|recompute). Each decision given is pinned.
 *
 * `optimizer: device` needs the weights resident and the gradient on the
 * device, so it pins those too: an entry with `optimizer: device` and nothing
 * else pins params resident, grads device and optimizer device for the
 * parameters it matches. With `params: stream` or `grads: stream` in the same
 * entry, or for a parameter an earlier entry (or pins made before) pinned to
 * stream weights or gradient, it is an error naming the override's place (and
 * the earlier entry's, with the parameter). A later entry that streams the
 * weights or gradient of a parameter wins over an earlier `optimizer: device`:
 * that parameter's optimizer goes back to the host (as it does for any
 * parameter whose weights or gradient end up streamed, whatever d said). A
 * forward-only program has no optimizer: `optimizer` changes nothing there
 * (its word and pattern are still checked).
 *
 * A pattern that matches no parameter (for params, grads, optimizer) or no
 * offloadable activation (for activations), an unknown decision word, or an
 * impossible one (recompute for an activation that cannot be recomputed) is
 * an error naming the override's place in the config ("x.yaml:14:7:
 * memory.overrides[0]: ..."). Later entries win; on error d and pins are
 * untouched. pins may be NULL. */
mf_status mf_plan_apply_overrides(const mf_program *p, const mf_config_memory *mem, mf_decisions *d,
                                  mf_plan_pins *pins);

#ifdef __cplusplus
}
#endif

#endif /* MF_PLANNER_PLAN_IO_H */
