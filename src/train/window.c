/* The logging window (train_internal.h): what the steps since the last
 * progress line add up to, as one metrics.jsonl line and one progress line. */
#include <string.h>

#include "src/train/train_internal.h"

void mf_window_start(mf_window *w, double now) {
  const double busy = w->opt_busy_seen, waited = w->opt_waited_seen; /* the worker's totals carry over */
  memset(w, 0, sizeof *w);
  w->t0 = now;
  w->opt_busy_seen = busy;
  w->opt_waited_seen = waited;
}

void mf_window_add(mf_window *w, const mf_step_result *sr, const mf_exec_stats *xs) {
  /* the step's and the device optimizer's (NaN untimed: so is the mean) */
  for (int k = 0; k < MF_EXEC_STREAMS; k++) w->busy[k] += xs->busy_s[k] + xs->optim_busy_s[k];
  w->submit += xs->submit_s;
  w->fill += xs->fill_s; /* NaN unstaged: so is the mean */
  w->drain += xs->drain_s;
  if (xs->peak_live_bytes > w->peak) w->peak = xs->peak_live_bytes;
  w->loss += sr->loss;
  w->aux += sr->aux_loss;
  w->n++;
}

void mf_window_exclude(mf_window *w, double seconds) {
  if (seconds > 0) w->excluded += seconds;
}

/* The overlapped optimizer per step: the loop's waits are exposed, the rest of
 * the worker's busy time hidden behind the device work. */
void mf_window_add_worker(mf_window *w, double busy, double waited) {
  const double d_busy = busy - w->opt_busy_seen, d_waited = waited - w->opt_waited_seen;
  w->opt_busy_seen = busy;
  w->opt_waited_seen = waited;
  w->opt_exposed += d_waited;
  w->opt_hidden += d_busy > d_waited ? d_busy - d_waited : 0.0;
}

mf_status mf_window_flush(mf_window *w, mf_metrics *m, const mf_step_metrics *base, const mf_exec_stats *xs,
                          int64_t tokens_per_step, int64_t total_steps, int progress, mf_step_metrics *line) {
  const double now = mf_time_now(), n = (double)w->n;
  const double train_s = now - w->t0 - w->excluded, span = train_s > 0 ? train_s : 1e-9;
  mf_step_metrics sm = *base;
  sm.window_steps = w->n;
  sm.window_loss = w->loss / n;
  sm.window_aux_loss = w->aux / n;
  sm.tokens = sm.step * tokens_per_step;
  sm.tokens_per_s = n * (double)tokens_per_step / span;
  sm.step_s = span / n;
  /* Streams: mean busy over the window (NaN on a backend without timing),
   * bytes of this step (every step moves the same), the window's peak. */
  for (int k = 0; k < MF_EXEC_STREAMS; k++) {
    sm.busy_s[k] = w->busy[k] / n;
    sm.idle_s[k] = sm.step_s - sm.busy_s[k];
  }
  sm.host_submit_s = w->submit / n;
  sm.h2d_bytes = (double)xs->h2d_bytes;
  sm.d2h_bytes = (double)xs->d2h_bytes;
  sm.peak_device_bytes = (double)w->peak;
  sm.optimizer_hidden_s = w->opt_hidden / n;
  sm.optimizer_exposed_s = w->opt_exposed / n;
  sm.staging_fill_s = w->fill / n;
  sm.staging_drain_s = w->drain / n;
  MF_CHECK(mf_metrics_write(m, &sm));
  if (progress) {
    char text[512];
    mf_progress_format(text, sizeof text, &sm, total_steps, progress > 1);
    MF_LOGI("train", "%s", text);
  }
  *line = sm;
  mf_window_start(w, now);
  return MF_OK;
}
