/*
 * A picture of one planned training step: a self-contained SVG (no scripts,
 * no external fonts) of the simulated timeline (planner/simulate.h) and the
 * device-memory curve, for `moefit plan --svg FILE`.
 *
 * Layout (about 1400x700 px): the title and the plan's figures; three lanes
 * (compute, H2D, D2H) with one rectangle per instruction from its simulated
 * start to its end, coloured by kind (forward, backward, recompute, loss,
 * upload, download, zero/accumulate), each with a <title> child naming it and
 * its time (a browser shows it on hover); a fourth lane, the host's: the
 * staging arena's fills and copy-outs (each slab's, when copies are staged)
 * and the host AdamW (drawn as NVMe-bound when the optimizer state's NVMe
 * traffic sets its pace), so a step the host holds back looks like one; a
 * legend; below, the device memory
 * alive over time (a step function of each instruction's live_bytes from its
 * start), the budget as a dashed line and the peak labelled; time and memory
 * axes.
 *
 * Size. Consecutive rectangles of a lane narrower than 0.5 px are merged into
 * one ("N instructions ..."), and the memory curve keeps the maximum per pixel
 * column, so the file is bounded by the width of the picture, not by the
 * length of the schedule (a few hundred KB for any schedule).
 *
 * Instructions are coloured by what they do; the RUNs of the NORM and OPTIM
 * phases (the optimizer on the device: gradient norm chunk sums and AdamW,
 * src/model/program.h) are their own category, "device optimizer", and the
 * start of the schedule's OPTIM part (planner/schedule.h optim_begin) is
 * marked with a dashed line (id "optim-begin") when there is one.
 *
 * Also the text `moefit plan` prints about the decisions: the per-layer table
 * and the optimizer summary.
 */
#ifndef MF_PLANNER_RENDER_H
#define MF_PLANNER_RENDER_H

#include <stdio.h>

#include "planner/plan.h"
#include "planner/schedule.h"
#include "planner/staging.h"
#include "src/core/core.h"
#include "src/model/program.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Writes the SVG of `plan` (its schedule and simulation) to `path`
 * atomically; `sg` (may be NULL: copies not staged) is its staging layout,
 * whose slabs the host lane shows. `title` (may be NULL) heads the picture,
 * e.g. the config path; every name is XML-escaped. A path that cannot be
 * written is MF_ERR_IO naming it; a plan without a schedule or simulation is
 * MF_ERR_INVALID_ARG. */
mf_status mf_render_svg(const mf_plan *plan, const mf_staging *sg, const char *title, const char *path);

/* The per-layer table of decisions d for program p, to `out`: a title line,
 * the column groups and the header, then one row for the parameters outside
 * the layers ("embed/head") and one per layer ("layer N") with how many
 * tensors got each decision: weights resident/streamed, gradients on the
 * device/streamed, the optimizer ("host", "device", "mixed D/N" when D of the
 * layer's N parameters are updated on the device, "-" for a forward-only
 * program) and, for layers, the offloadable activations kept/offloaded/
 * recomputed. Each column is right-aligned to its widest value (the words
 * left-aligned), as mf_table prints. MF_ERR_INVALID_ARG for NULL arguments
 * or decisions of another program; MF_ERR_IO when `out` reports a write
 * error. */
mf_status mf_render_layer_table(const mf_program *p, const mf_decisions *d, FILE *out);

/* One line about the optimizer under d: "optimizer: all N parameters updated
 * on the host ...", or "optimizer: D of N parameters (... elements) updated on
 * the device: X of weights and Y of AdamW state (fp32|bf16 moments) stay
 * there across steps; H on the host", or for a forward-only program "optimizer:
 * none ...". Errors as mf_render_layer_table. */
mf_status mf_render_optimizer_summary(const mf_program *p, const mf_decisions *d, FILE *out);

#ifdef __cplusplus
}
#endif

#endif /* MF_PLANNER_RENDER_H */
