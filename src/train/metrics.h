/*
 * Training metrics (one JSON object per line in RUN_DIR/metrics.jsonl) and the
 * one-line progress reports printed while training and evaluating.
 *
 * metrics.jsonl: one line per logged step (the first, every train.log_every-th,
 * each step that evaluated, the last); every line is a complete JSON object
 * with the same keys in the same order, e.g.
 *
 *   {"step":40,"loss":2.33121084,"ce_loss":2.31110977,"aux_loss":2.01041031,
 *    "window_steps":10,"window_loss":2.34121084,"window_aux_loss":2.01341031,
 *    "lr":0.00266666664,"grad_norm":0.512034,"tokens_per_s":12301.5,
 *    "tokens":40960,"elapsed_s":13.31,"skipped":false,"eval_loss":null,
 *    "eval_s":null,"step_s":0.333,"expert_imbalance":null,
 *    "compute_busy_s":0.0261,"h2d_busy_s":0.00021,"d2h_busy_s":0.00024,
 *    "compute_idle_s":0.0069,"h2d_idle_s":0.0328,"d2h_idle_s":0.0328,
 *    "h2d_bytes":1824768,"d2h_bytes":1803264,"peak_device_bytes":14145536,
 *    "optimizer_hidden_s":0,"optimizer_exposed_s":0,
 *    "staging_fill_s":null,"staging_drain_s":null}
 *
 * The window of a line is the steps since the previous line, this one
 * included (window_steps of them: 1 on the first line, then train.log_every
 * or fewer). The fields:
 *
 *   step              steps done, this one included (1 after the first)
 *   loss              this step's loss, the one minimized: ce_loss +
 *                     train.aux_loss_coef × aux_loss (mean over its micro-batches)
 *   ce_loss           this step's cross-entropy, nats per counted target token
 *   aux_loss          this step's router load-balancing loss, before its coefficient
 *   window_steps      the steps the window_* and per-step fields below average
 *   window_loss       mean of `loss` over the window: what the progress line
 *                     prints as "loss" (less noisy than one step's)
 *   window_aux_loss   mean of `aux_loss` over the window: the progress line's "aux"
 *   lr                the learning rate this step used
 *   grad_norm         this step's global L2 norm of the gradients, before clipping
 *   tokens_per_s      training throughput over the window: window_steps × tokens
 *                     per step / the window's training seconds (evaluation excluded)
 *   tokens            input tokens trained on so far: step × tokens per step
 *                     (micro_batch × seq_len × grad_accum; masked targets included)
 *   elapsed_s         wall seconds since training began, evaluations included
 *   skipped           true: this step's gradients or loss were not finite and its
 *                     update was skipped
 *   eval_loss         validation loss (mean cross-entropy per counted token over every
 *                     window of data.valid) on steps that evaluated, else null
 *   eval_s            the seconds that evaluation took, else null
 *   step_s            training seconds per step, the window's mean (evaluation
 *                     excluded; host optimizer included); the ETA uses it
 *   expert_imbalance  max/mean tokens per expert in the worst layer: not measured
 *                     yet, always null
 *   X_busy_s          seconds per step stream X worked (X: compute, h2d, d2h; the
 *                     executor's streams, src/exec/exec.h), the window's mean
 *   X_idle_s          step_s - X_busy_s
 *   host_submit_s     host seconds per step submitting the step's work to the
 *                     streams (near step_s: the host, not the device, sets the pace)
 *   h2d_bytes, d2h_bytes   bytes copied to / from the device in the step
 *   peak_device_bytes the most device bytes live at once in the window's steps
 *   optimizer_hidden_s, optimizer_exposed_s   the host optimizer's seconds per
 *                     step that ran under the device streams / that the step
 *                     waited for (0 until the optimizer overlaps the streams)
 *   staging_fill_s, staging_drain_s   with the copies staged (memory.staging), the
 *                     host's seconds per step copying into the pinned slabs and
 *                     out of them; null when not staged
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
  double loss;         /* this step's: what was minimized, ce_loss + aux coefficient × aux_loss */
  double ce_loss;      /* this step's cross-entropy per counted target */
  double aux_loss;     /* this step's router load-balancing loss, before its coefficient */
  int64_t window_steps;   /* the steps since the previous line, this one included (0: no window) */
  double window_loss;     /* mean loss over those steps (NaN: no window) */
  double window_aux_loss; /* mean aux_loss over those steps (NaN: no window) */
  double lr;           /* the learning rate this step used */
  double grad_norm;    /* global L2 norm of the gradients, before clipping */
  double tokens_per_s; /* training throughput: tokens trained / training seconds (no evaluation) */
  int64_t tokens;      /* tokens trained on so far in the run, this step's included */
  double elapsed_s;    /* wall seconds since this process started training, evaluations included */
  int skipped;         /* nonzero: non-finite gradients, the update was skipped */
  /* Optional (NaN = not measured this step). */
  double eval_loss;        /* validation loss, on steps that evaluated */
  double eval_s;           /* the seconds that evaluation took */
  double step_s;           /* training seconds per step (this one's or a recent mean; no
                              evaluation); the ETA uses it when set (set it after a resume:
                              elapsed_s counts from the resume, step from the run's start) */
  double expert_imbalance; /* max/mean tokens per expert, worst layer (not measured yet) */
  /* The executor's streams (NaN = not measured): seconds per step each stream
   * worked and did not (idle = step_s - busy), bytes per step each way, the peak
   * of live device bytes. Index by mf_exec_stream order: compute, h2d, d2h. */
  double busy_s[3];
  double idle_s[3];
  double host_submit_s; /* host seconds per step submitting the step's work */
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
  /* A resume checkpoint taken after this step (src/ckpt/ckpt.h): the seconds
   * training paused for it (written with training paused: its write; beside
   * training: the snapshot and the wait for the write before); its bytes on
   * disk (NaN: none); and for one written beside training, on the line of
   * the step where it landed, its bytes and its write's seconds. */
  double checkpoint_s;
  double checkpoint_bytes;
  double checkpoint_write_s;
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
/* Appends the line {"resumed_from": DIR, "resume_step": STEP} that marks
 * where a resumed run's lines begin (a line of no step: rewind keeps it). */
mf_status mf_metrics_write_resume(mf_metrics *m, const char *dir, int64_t step);
const char *mf_metrics_path(const mf_metrics *m); /* dir/metrics.jsonl */
void mf_metrics_close(mf_metrics *m);             /* NULL is fine */

/* A run's metrics.jsonl read back (mf_metrics_read): what `moefit inspect`
 * and `moefit plot` show. */
typedef struct mf_metrics_resume {
  int64_t step; /* resume_step: the run continued from the checkpoint of this step */
  char *from;   /* resumed_from: that checkpoint's directory */
} mf_metrics_resume;

typedef struct mf_metrics_log {
  mf_step_metrics *lines; /* the step lines in step order, each step once: after a
                             resume the lines past its step are dropped (the run
                             repeated those steps), and of a step written twice
                             the later line counts */
  size_t n;
  mf_metrics_resume *resumes; /* the resume marks, in file order */
  size_t n_resumes;
  size_t unread;       /* lines that are not JSON objects of this format (a half-written
                          last line of a crashed run, a line someone added) */
  size_t first_unread; /* the 1-based line number of the first of them (0: none) */
} mf_metrics_log;

/* Reads `path` (a metrics.jsonl) into *out (zeroed first; free it with
 * mf_metrics_log_free, also after a failure). A key missing from a line or
 * null reads as mf_step_metrics_init's value (NaN for the optional fields).
 * MF_ERR_IO naming the path when it cannot be read. */
mf_status mf_metrics_read(const char *path, mf_metrics_log *out);
void mf_metrics_log_free(mf_metrics_log *log);

/* The JSON object of one step, without the newline, into buf (NUL-terminated).
 * Returns its length, or a value >= cap when it was cut (as snprintf). */
size_t mf_metrics_format_json(char *buf, size_t cap, const mf_step_metrics *s);

/* One line for people, without a newline, that fits about 100 columns:
 *   step   40/300  loss 2.3412 (mean of 10 steps)  eval 2.1003  lr 2.67e-03  12.3K tok/s  eta 1m32s
 * "loss" is window_loss, the mean over the window ("(mean of N steps)" says
 * so when N > 1); without a window (window_steps 0) the step's loss. " eval X"
 * when the step evaluated. tok/s is mf_format_count of tokens_per_s. The step
 * is padded to the width of total_steps; total_steps <= 0 leaves out "/total"
 * and the ETA. The ETA is the training steps left x step_s (or x elapsed_s /
 * step when step_s is not set): evaluations still to come are not in it (they
 * report their own progress, mf_eval_progress_format). "  SKIPPED (non-finite
 * gradients)" is added when it applies.
 *
 * verbose (`moefit train --verbose`) adds the router's loss and the gradient
 * norm, and the stream figures metrics.jsonl always has:
 *   step   40/300  loss 2.3412  aux 2.0104 (mean of 10 steps)  lr 2.67e-03  |g| 0.512  12.3K tok/s  eta 1m32s
 *     busy c 78% up 1% dn 1%  io 1.74 MiB/1.72 MiB  peak 13.49 MiB
 * (on one line): "aux" is window_aux_loss (or the step's aux_loss); when the
 * stream fields are set, each stream's busy seconds as a share of step_s (c:
 * compute, up: h2d, dn: d2h) and the host's submitting them, the bytes
 * up/down per step and the peak device bytes (mf_format_bytes); "  opt hidden
 * X.Xms exposed Y.Yms" when either optimizer field is > 0; "  staging in X%
 * out Y%" with staged copies. Returns the length, as snprintf. */
size_t mf_progress_format(char *buf, size_t cap, const mf_step_metrics *s, int64_t total_steps, int verbose);

/* One line about an evaluation under way, without a newline:
 *   eval runs/demo/data/valid.tokens: 1200/3326 windows (36%), 4s, eta 7s
 * `what` names the data, done of total windows evaluated after elapsed_s
 * seconds; the ETA assumes the rest goes as fast, and is left out when done
 * is 0 or total (the closing line: "3326/3326 windows (100%), 12s"). Returns
 * the length, as snprintf. */
size_t mf_eval_progress_format(char *buf, size_t cap, const char *what, uint64_t done, uint64_t total,
                               double elapsed_s);

#ifdef __cplusplus
}
#endif

#endif /* MF_TRAIN_METRICS_H */
