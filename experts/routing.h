/*
 * Routing statistics: how many of a layer's routed assignments each expert
 * received, as measured in training (`moefit train` writes them, the planner
 * reads them instead of assuming uniform routing).
 *
 * Counts are assignments: a token that picks k experts counts once for each,
 * so an MoE layer's counts sum to tokens * top_k (src/exec/exec.h
 * mf_exec_expert_tokens sums them that way); a dense layer's are all 0.
 *
 * The JSON (format "moefit-routing", version 1):
 *   {
 *     "format": "moefit-routing", "version": 1,
 *     "model": {"family": "mixtral", "layers": 32, "experts": 8, "top_k": 2},
 *     "tokens": N,
 *     "counts": [[c0, c1, ... c(E-1)], ...one row per layer]
 *   }
 * Reading is strict: every key is checked (unknown ones are refused), the
 * model must be the spec's, every count a non-negative integer, each MoE
 * layer's row must sum to tokens * top_k and each dense layer's be all 0. An
 * error names the file, the place and the fault: MF_ERR_FORMAT for a
 * malformed file, MF_ERR_CONFIG for one made for another model,
 * MF_ERR_UNSUPPORTED for a newer version.
 */
#ifndef MF_EXPERTS_ROUTING_H
#define MF_EXPERTS_ROUTING_H

#include <stdint.h>

#include "src/config/config.h"
#include "src/core/core.h"
#include "src/model/spec.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mf_routing {
  int64_t layers, experts, top_k;
  double *share;   /* [layers * experts]: each expert's fraction of its layer's routed assignments
                      (each MoE layer's row sums to 1; dense layers' rows are 0) */
  uint64_t tokens; /* tokens the counts cover (per layer: tokens * top_k assignments) */
} mf_routing;

/* From raw counts [layers * experts] (as mf_exec_expert_tokens sums them) over
 * `tokens` tokens. The counts are checked as a file's are (non-negative, an
 * MoE layer's summing to tokens * top_k, a dense layer's 0): MF_ERR_INVALID_ARG
 * naming the layer otherwise. With tokens 0 (nothing measured) every MoE
 * layer's shares are uniform, 1/experts. *out is set whole on success and
 * zeroed on failure; free it with mf_routing_free. */
mf_status mf_routing_from_counts(const mf_model_spec *spec, const int64_t *counts, uint64_t tokens,
                                 mf_routing *out);

/* Writes the counts (checked as mf_routing_from_counts checks them, so what is
 * written reads back) to `path` atomically: the file appears whole or not at
 * all. */
mf_status mf_routing_write(const char *path, const mf_model_spec *spec, const int64_t *counts,
                           uint64_t tokens);

/* Reads and validates `path` against spec (see the top of this file) and gives
 * the shares. *out is set whole on success and zeroed on failure. */
mf_status mf_routing_read(const char *path, const mf_model_spec *spec, mf_routing *out);

/* Frees the shares and zeroes *r; NULL is fine. */
void mf_routing_free(mf_routing *r);

/* The routing a config's memory.routing names, for model `spec`:
 *   auto  <output.dir>/routing.json when that file exists (as the last run
 *         wrote it) and was measured on this model, else uniform. A file
 *         measured on another model (mf_routing_read's MF_ERR_CONFIG: another
 *         family, layer count, expert count, top_k, or another layout of
 *         dense layers: routed tokens in a layer this model has dense, or none
 *         in one it has MoE) is not this model's routing: uniform,
 *         and `note` (may be NULL) receives one line for people saying why
 *         ("routing: FILE: <fault>; planning with uniform routing ...");
 *   none  uniform;
 *   path  that file: it must exist and be this model's — a file measured on
 *         another model is MF_ERR_CONFIG naming it and suggesting
 *         memory.routing=none.
 * A malformed file, or one of a newer version, is an error naming it
 * whichever way it was found. *found says whether statistics were read (else
 * *out is zeroed: share NULL) and `path` (may be NULL) receives the file
 * read; `note` is empty unless a file was passed over. */
mf_status mf_routing_for_config(const mf_config *cfg, const mf_model_spec *spec, mf_routing *out, int *found,
                                char *path, size_t path_cap, char *note, size_t note_cap);

#ifdef __cplusplus
}
#endif

#endif /* MF_EXPERTS_ROUTING_H */
