/*
 * Training metrics (one JSON object per line in RUN_DIR/metrics.jsonl) and the
 * one-line progress report printed while training.
 *
 * metrics.jsonl: every line is a complete JSON object with the same keys in the
 * same order, e.g.
 *
 *   {"step":40,"loss":2.34121084,"ce_loss":2.32110977,"aux_loss":2.01041031,
 *    "lr":0.00266666664,"grad_norm":0.512034,"tokens_per_s":12301.5,
 *    "tokens":163840,"elapsed_s":13.31,"skipped":false,"eval_loss":null,
 *    "step_s":0.333,"expert_imbalance":1.41,
 *    "compute_busy_s":0.0261,"h2d_busy_s":0.00021,"d2h_busy_s":0.00024,
 *    "compute_idle_s":0.0069,"h2d_idle_s":0.0328,"d2h_idle_s":0.0328,
 *    "h2d_bytes":1824768,"d2h_bytes":1803264,"peak_device_bytes":14145536,
 *    "optimizer_hidden_s":0,"optimizer_exposed_s":0,
 *    "staging_fill_s":null,"staging_drain_s":null}
 *
 * The stream fields follow the executor's streams (src/exec/exec.h, timing):
 * X_busy_s is the seconds stream X worked per step, X_idle_s = step_s - X_busy_s
 * (the step's wall time, host optimizer included, less that); h2d_bytes and
 * d2h_bytes the bytes copied each way per step, peak_device_bytes the most
 * device bytes live at once in the step. optimizer_hidden_s / _exposed_s: the
 * host optimizer's seconds per step that ran under the device streams / that
 * the step waited for (0 until the optimizer overlaps the streams).
 * staging_fill_s / _drain_s: with the copies staged (memory.staging), the
 * host's seconds per step copying into the pinned slabs and out of them.
 *
 * Numbers are printed with %.9g (enough to read a float back exactly), byte
 * counts with every digit (exact below 2^53); a value
 * that is NaN or infinite is written as null, since JSON has neither. Each line
 * reaches the file with one write(2) before mf_metrics_write returns, so a
 * crashed run loses at most the line being written (and a resumed run drops
 * such a half line). Nothing is fsynced: a power failure may lose the last lines.
 *
 * Readers: `pandas.read_json(path, lines=True)`; after a resume without
 * mf_metrics_rewind, a step may appear twice and the later line is the one that
 * counts.
 */
#ifndef MF_TRAIN_METRICS_H
#define MF_TRAIN_METRICS_H

#include <stddef.h>
#include <stdint.h>

#include "src/core/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One optimizer step. Start from mf_step_metrics_init: it sets the optional
 * fields to NaN (written as null), where a zeroed struct would report 0. */
typedef struct mf_step_metrics {
  int64_t step;        /* steps done, counting this one (1 after the first) */
  double loss;         /* what was minimized: ce_loss + aux coefficient × aux_loss */
  double ce_loss;      /* cross-entropy per counted target */
  double aux_loss;     /* the router load-balancing loss, before its coefficient */
  double lr;           /* the learning rate this step used */
  double grad_norm;    /* global L2 norm of the gradients, before clipping */
  double tokens_per_s; /* this step's throughput: tokens trained / step wall time */
  int64_t tokens;      /* tokens trained on so far in the run, this step's included */
  double elapsed_s;    /* wall seconds since this process started training */
  int skipped;         /* nonzero: non-finite gradients, the update was skipped */
  /* Optional (NaN = not measured this step). */
  double eval_loss;        /* validation loss, on steps that evaluated */
  double step_s;           /* wall seconds per step (this one's or a recent mean); the ETA
                              uses it when set (set it after a resume: elapsed_s counts
                              from the resume, step from the run's start) */
  double expert_imbalance; /* max/mean tokens per expert, worst layer */
  /* The executor's streams (NaN = not measured): seconds per step each stream
   * worked and did not (idle = step_s - busy), bytes per step each way, the peak
   * of live device bytes. Index by mf_exec_stream order: compute, h2d, d2h. */
  double busy_s[3];
  double idle_s[3];
  double h2d_bytes, d2h_bytes;
  double peak_device_bytes;
  /* The host optimizer's seconds per step hidden under the streams and exposed
   * (added to the step); 0 (not NaN) by default: an optimizer that does not
   * overlap reports its time elsewhere (step_s). */
  double optimizer_hidden_s;
  double optimizer_exposed_s;
  /* With the pinned staging arena (src/exec/exec.h): the host's seconds per
   * step filling slabs and copying them out (NaN: copies not staged). */
  double staging_fill_s;
  double staging_drain_s;
} mf_step_metrics;

void mf_step_metrics_init(mf_step_metrics *s); /* zeros, optional fields NaN */

typedef struct mf_metrics mf_metrics;

/* Creates `dir` (and its parents) and opens dir/metrics.jsonl: resume != 0
 * appends to it (dropping a half-written last line), resume == 0 truncates it
 * (a new run). MF_ERR_IO naming the path and strerror. On failure *out is NULL. */
mf_status mf_metrics_open(const char *dir, int resume, mf_metrics **out);
/* Appends one line. Allocates nothing. MF_ERR_IO naming the file on a failed write. */
mf_status mf_metrics_write(mf_metrics *m, const mf_step_metrics *s);
/* Removes the lines whose step is past `step`: a run resumed from the checkpoint
 * of `step` calls it so the steps it repeats are not in the file twice. Lines
 * this module did not write are kept. */
mf_status mf_metrics_rewind(mf_metrics *m, int64_t step);
const char *mf_metrics_path(const mf_metrics *m); /* dir/metrics.jsonl */
void mf_metrics_close(mf_metrics *m);             /* NULL is fine */

/* The JSON object of one step, without the newline, into buf (NUL-terminated).
 * Returns its length, or a value >= cap when it was cut (as snprintf). */
size_t mf_metrics_format_json(char *buf, size_t cap, const mf_step_metrics *s);

/* One line for people, without a newline:
 *   step   40/300  loss 2.3412  aux 2.0104  lr 2.67e-03  |g| 0.512  12.3k tok/s  eta 1m32s
 *     busy c 78% up 1% dn 1%  io 1.74M/1.72M  peak 13.5M
 * (on one line). The second part, when the stream fields are set: each
 * stream's busy seconds as a share of step_s (c: compute, up: h2d, dn: d2h),
 * the bytes up/down per step and the peak device bytes (M = MiB, K = KiB,
 * G = GiB); "  opt hidden X.Xms exposed Y.Yms" when either optimizer field is > 0.
 * The step is padded to the width of total_steps; total_steps <= 0 leaves out
 * "/total" and the ETA. The ETA is (total - step) × step_s, or × elapsed_s /
 * step when step_s is not set. " eval X" and " SKIPPED (non-finite gradients)"
 * are added when they apply. Returns the length, as snprintf. */
size_t mf_progress_format(char *buf, size_t cap, const mf_step_metrics *s, int64_t total_steps);

#ifdef __cplusplus
}
#endif

#endif /* MF_TRAIN_METRICS_H */
