/*
 * A picture of one planned training step: a self-contained SVG (no scripts,
 * no external fonts) of the simulated timeline (planner/simulate.h) and the
 * device-memory curve, for `moefit plan --svg FILE`.
 *
 * Layout (about 1400x700 px): the title and the plan's figures; three lanes
 * (compute, H2D, D2H) with one rectangle per instruction from its simulated
 * start to its end, coloured by kind (forward, backward, recompute, loss,
 * upload, download, zero/accumulate), each with a <title> child naming it and
 * its time (a browser shows it on hover); a legend; below, the device memory
 * alive over time (a step function of each instruction's live_bytes from its
 * start), the budget as a dashed line and the peak labelled; time and memory
 * axes.
 *
 * Size. Consecutive rectangles of a lane narrower than 0.5 px are merged into
 * one ("N instructions ..."), and the memory curve keeps the maximum per pixel
 * column, so the file is bounded by the width of the picture, not by the
 * length of the schedule (a few hundred KB for any schedule).
 */
#ifndef MF_PLANNER_RENDER_H
#define MF_PLANNER_RENDER_H

#include "planner/plan.h"
#include "src/core/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Writes the SVG of `plan` (its schedule and simulation) to `path`
 * atomically. `title` (may be NULL) heads the picture, e.g. the config path;
 * every name is XML-escaped. A path that cannot be written is MF_ERR_IO naming
 * it; a plan without a schedule or simulation is MF_ERR_INVALID_ARG. */
mf_status mf_render_svg(const mf_plan *plan, const char *title, const char *path);

#ifdef __cplusplus
}
#endif

#endif /* MF_PLANNER_RENDER_H */
