/*
 * A run's base identity (src/model/base_id.h) from the weights as loaded, and
 * the checks that keep a checkpoint's or an adapter's weights on the base
 * they were trained on: `train --resume` (a checkpoint's base.json), `export`
 * (the same) and `eval --model ADAPTER_DIR` (its moefit_base.json). Each
 * refuses another base (MF_ERR_CONFIG naming the field or tensor, both
 * values and the way out).
 *
 * The weights' checksums are mf_ckpt_hash64 of each tensor's bytes as loaded:
 * a LoRA run's frozen tensors (the base its adapters are applied to), a full
 * fine-tune's every tensor (the base it started from), in fp32 or, where a
 * LoRA run keeps its base in bf16 alone (params.h mf_lora_base_bf16), bf16.
 */
#ifndef MF_TRAIN_BASE_H
#define MF_TRAIN_BASE_H

#include "src/config/config.h"
#include "src/core/core.h"
#include "src/model/base_id.h"
#include "src/model/params.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What a mismatch tells the user to do, by who meets it. */
#define MF_BASE_WAY_OUT_RUN "point model.path at the base the run trained on, or start a new run"
#define MF_BASE_WAY_OUT_ADAPTER "point model.path at the base the adapters were trained on"

/* The identity of the base cfg names (model.path, or model.init) as table t
 * holds it now: t's spec and the checksums of its weights, w (fp32, the
 * table's layout) or for a frozen parameter its bf16 home when home is not
 * NULL; of bf16 values with bf16 (w rounded where there is no home), else of
 * fp32 ones (MF_ERR_CONFIG when a frozen parameter is in home alone). The
 * checksums spread over the pool's threads (NULL: this one). */
mf_status mf_run_base_id(const mf_config *cfg, const mf_param_table *t, const float *w, const uint16_t *home,
                         int bf16, mf_threadpool *pool, mf_base_id *out);

/* Record rec (read from `where`) against the base cfg names with spec `spec`
 * (before any weights are loaded), then against table t's weights as loaded
 * (w and home as mf_run_base_id takes them, in the record's dtype):
 * mf_base_id_compare's MF_ERR_CONFIG on a difference. */
mf_status mf_run_base_check_spec(const mf_base_id *rec, const char *where, const mf_config *cfg,
                                 const mf_model_spec *spec, const char *who, const char *way_out);
mf_status mf_run_base_check_weights(const mf_base_id *rec, const char *where, const mf_config *cfg,
                                    const mf_param_table *t, const float *w, const uint16_t *home,
                                    mf_threadpool *pool, const char *who, const char *way_out);

/* Checkpoint dir's base.json (verified against its manifest) into *rec,
 * where[] its path for messages; *found 0 for a checkpoint written before
 * moefit recorded a run's base: then a warning says what cannot be checked
 * (`lora`: state.json's base_sum still checks the base's weights) and `then`,
 * what happens next. */
mf_status mf_run_base_read_ckpt(const char *dir, int lora, const char *then, mf_base_id *rec, int *found,
                                char *where, size_t where_cap);

/* --resume: checkpoint dir's record against have_json, the base the run
 * loaded (mf_base_id_format of mf_run_base_id); NULL: nothing to compare
 * (a rank that did not compute it). With lora the spec alone: the frozen
 * weights are state.json's base_sum, which mf_ckpt_read checks. */
mf_status mf_run_base_check_ckpt(const char *dir, const char *have_json, int lora);

#ifdef __cplusplus
}
#endif

#endif /* MF_TRAIN_BASE_H */
