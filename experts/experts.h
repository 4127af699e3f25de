/*
 * What is specific to Mixture-of-Experts, behind one small interface the
 * planner and the executor call:
 *
 *   heat        an expert's rank in its layer by its measured share of the
 *               layer's routed assignments (experts/routing.h), hottest 0;
 *   residency   the candidates for keeping part of a layer's experts on the
 *               device: its hottest quarter, then its second-hottest;
 *   use         the chance that a copy of an expert's weights or gradient is
 *               needed — that any of a batch's tokens reaches the expert —
 *               with measured routing or, without it, the expected number of
 *               experts a batch reaches;
 *   idle skip   an expert that no token of the micro-batches a copy serves
 *               reached needs neither its weights uploaded (no rows) nor its
 *               gradient sent home (all zeros);
 *   grouping    which copies share a staging slab: a layer's copies for one
 *               phase of one micro-batch (all its experts together).
 *
 * Routing changes which rows hold which tokens, never a size or the
 * schedule: everything here prices or skips work, the bits never depend on it.
 */
#ifndef MF_EXPERTS_EXPERTS_H
#define MF_EXPERTS_EXPERTS_H

#include <stdint.h>

#include "src/model/program.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Expert e's heat rank among the E experts of a layer whose shares are row[0..E):
 * how many got a larger share, ties broken by the lower index (0: hottest). */
int32_t mf_experts_heat_rank(const double *row, int64_t E, int64_t e);

/* LoRA's hot experts (train.lora.experts: hot): in each layer with routed
 * assignments (share[layer * E ..] not all 0), the ceil(fraction * E) experts
 * of the lowest heat rank (the most-routed, ties to the lower index; at least
 * one, at most E) get hot[layer * E + e] = 1, the others 0; a dense layer's
 * row is all 0. Returns how many are hot in all. */
int64_t mf_experts_lora_hot(const double *share, int64_t layers, int64_t E, double fraction, uint8_t *hot);

/* Residency candidates: the q-th hottest quarter of E experts (q = 1 the
 * hottest, 2 the next) is the experts of heat rank [*lo, *hi). */
#define MF_EXPERTS_HOT_QUARTERS 2
void mf_experts_hot_quarter(int64_t E, int q, int64_t *lo, int64_t *hi);

/* The chance that an expert with `share` of its layer's assignments gets at
 * least one of `tokens` tokens that each pick top_k experts: a token picks it
 * with chance q = min(1, top_k share), so 1 - (1 - q)^tokens. */
double mf_experts_use_chance(double share, int64_t top_k, double tokens);

/* Without measured routing: how many of E experts `tokens` tokens (top_k
 * each, spread evenly) are expected to reach, E (1 - (1 - top_k/E)^tokens),
 * at least 1 and at most tokens x top_k. */
double mf_experts_expected_busy(int64_t E, int64_t top_k, double tokens);

/* The idle-expert skip: counts[(m L + layer) E + e] are the tokens micro-batch
 * m routed to expert e of `layer` (L layers, E experts); 1 when none of
 * micro-batches [mlo, mhi] sent expert e any. */
int mf_experts_idle(const int64_t *counts, int64_t L, int64_t E, int32_t layer, int32_t e, int32_t mlo,
                    int32_t mhi);

/* The staging group of op k of program p (see planner/staging.h): copies
 * with the same key serve one layer, one phase (forward; backward and the
 * recomputes before it) and one micro-batch, and share a slab. `recompute`:
 * the op runs again for the backward. Ops of no layer (embedding, head)
 * group as layer -1, ops of no micro-batch as micro-batch -1. */
int64_t mf_experts_group_key(const mf_program *p, int32_t k, int recompute);

#ifdef __cplusplus
}
#endif

#endif /* MF_EXPERTS_EXPERTS_H */
