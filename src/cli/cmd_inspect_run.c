/* `moefit inspect RUN_DIR`: a training run at a glance — the steps done and
 * planned, the losses, throughput, the checkpoints, final/ and the plan's
 * prediction against what ran. */
#include <jansson.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "src/ckpt/ckpt.h"
#include "src/cli/commands.h"
#include "src/train/metrics.h"

#define MAX_CKPTS 4096
#define MAX_JSON_BYTES ((size_t)64 << 20) /* plan.json lists every tensor */

static int exists(const char *dir, const char *name) {
  char p[4400];
  snprintf(p, sizeof p, "%s/%s", dir, name);
  return access(p, F_OK) == 0;
}

int mf_cli_is_run_dir(const char *dir) {
  struct stat sb;
  if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode)) return 0;
  return exists(dir, "metrics.jsonl") || exists(dir, "checkpoints") ||
         (exists(dir, "final") && exists(dir, "plan.json"));
}

/* A number at key in the JSON object of file dir/name (NaN when absent). */
static double json_file_num(const char *dir, const char *name, const char *key) {
  char path[4400];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  char *text = NULL;
  size_t len = 0;
  if (mf_read_file(path, MAX_JSON_BYTES, name, &text, &len) != MF_OK) return NAN;
  json_t *o = json_loadb(text, len, 0, NULL);
  free(text);
  const json_t *v = json_object_get(o, key);
  const double x = json_is_number(v) ? json_number_value(v) : NAN;
  json_decref(o);
  return x;
}

static int cmp_i64(const void *a, const void *b) {
  const int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return x < y ? -1 : x > y;
}

static int cmp_double(const void *a, const void *b) {
  const double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* The median of the finite values of field `off` over the lines (NaN: none). */
static double median_of(const mf_metrics_log *log, size_t off) {
  double *v = malloc((log->n ? log->n : 1) * sizeof *v);
  if (!v) return NAN;
  size_t k = 0;
  for (size_t i = 0; i < log->n; i++) {
    const double x = *(const double *)((const char *)&log->lines[i] + off);
    if (isfinite(x)) v[k++] = x;
  }
  qsort(v, k, sizeof *v, cmp_double);
  const double m = k ? v[k / 2] : NAN;
  free(v);
  return m;
}

/* The checkpoints: each step and whether it is complete; returns the newest
 * step (-1: none). */
static int64_t print_checkpoints(const char *dir) {
  char root[4400];
  snprintf(root, sizeof root, "%s/checkpoints", dir);
  static int64_t all[MAX_CKPTS], done[MAX_CKPTS];
  size_t n = 0, n_done = 0;
  if (mf_ckpt_list_steps(root, 0, all, MAX_CKPTS, &n) != 0 || n == 0) {
    printf("  checkpoints   none\n");
    return -1;
  }
  mf_ckpt_list_steps(root, 1, done, MAX_CKPTS, &n_done);
  if (n > MAX_CKPTS) n = MAX_CKPTS;
  if (n_done > MAX_CKPTS) n_done = MAX_CKPTS;
  qsort(all, n, sizeof *all, cmp_i64);
  printf("  checkpoints   %zu in %s (%zu complete):", n, root, n_done);
  for (size_t i = 0; i < n; i++) {
    if (n > 8 && i == 3) {
      printf(" ...");
      i = n - 4;
      continue;
    }
    int complete = 0;
    for (size_t j = 0; j < n_done && !complete; j++) complete = done[j] == all[i];
    printf("%s step %lld%s", i ? "," : "", (long long)all[i], complete ? "" : " (INCOMPLETE)");
  }
  printf("\n");
  return all[n - 1];
}

/* final/: an HF model dir, a PEFT adapter dir, or not there. */
static void print_final(const char *dir) {
  char final[4400];
  snprintf(final, sizeof final, "%s/final", dir);
  struct stat sb;
  if (stat(final, &sb) != 0 || !S_ISDIR(sb.st_mode)) {
    printf(
        "  final/        not there: the run has not finished (still running, stopped or failed; `moefit "
        "train "
        "CONFIG --resume` with its overrides continues it)\n");
    return;
  }
  if (mf_cli_is_adapter_dir(final))
    printf("  final/        a LoRA adapter dir (`moefit inspect %s`)\n", final);
  else if (exists(final, "config.json"))
    printf("  final/        a Hugging Face model dir (`moefit inspect %s`)\n", final);
  else
    printf("  final/        present, but neither a model dir nor an adapter dir\n");
}

/* The losses and figures of metrics.jsonl. */
static void print_metrics(const char *dir, const mf_metrics_log *log, int64_t planned) {
  const mf_step_metrics *first = log->n ? &log->lines[0] : NULL,
                        *last = log->n ? &log->lines[log->n - 1] : NULL;
  printf("  steps         ");
  if (last)
    printf("%lld done", (long long)last->step);
  else
    printf("none logged yet");
  if (planned > 0) printf(" of %lld planned (train.steps)", (long long)planned);
  printf("\n");
  for (size_t i = 0; i < log->n_resumes; i++)
    printf("  resumed       at step %lld from %s\n", (long long)log->resumes[i].step, log->resumes[i].from);
  if (!last) return;
  printf("  train loss    %.4f (step %lld)", first->loss, (long long)first->step);
  const int64_t w = last->window_steps;
  if (w > 1)
    printf(" -> %.4f (mean of steps %lld-%lld)\n", last->window_loss, (long long)(last->step - w + 1),
           (long long)last->step);
  else
    printf(" -> %.4f (step %lld)\n", last->loss, (long long)last->step);
  size_t n_eval = 0;
  for (size_t i = 0; i < log->n; i++) n_eval += isfinite(log->lines[i].eval_loss);
  if (n_eval) {
    printf("  eval loss    ");
    size_t k = 0;
    for (size_t i = 0; i < log->n; i++) {
      const mf_step_metrics *s = &log->lines[i];
      if (!isfinite(s->eval_loss)) continue;
      k++;
      if (n_eval > 8 && k > 3 && k <= n_eval - 3) {
        if (k == 4) printf(" ...,");
        continue;
      }
      printf(" %.4f (step %lld)%s", s->eval_loss, (long long)s->step, k < n_eval ? "," : "");
    }
    printf("\n");
  } else {
    printf("  eval loss     none (no data.valid, or no evaluation due yet)\n");
  }
  char rate[32];
  const double tps = median_of(log, offsetof(mf_step_metrics, tokens_per_s));
  const double step_s = median_of(log, offsetof(mf_step_metrics, step_s));
  printf("  throughput    %s tokens/s, %.4g s/step (medians over the logged windows; %lld tokens trained)\n",
         mf_format_count(tps, rate, sizeof rate), step_s, (long long)last->tokens);
  const double predicted = json_file_num(dir, "plan.json", "predicted_step_seconds");
  if (isfinite(predicted) && isfinite(step_s) && step_s > 0)
    printf(
        "  plan          predicted %.4g s/step (plan.json), executed %.4g s/step: %.3f of the prediction\n",
        predicted, step_s, predicted / step_s);
  else if (isfinite(predicted))
    printf("  plan          predicted %.4g s/step (plan.json)\n", predicted);
  size_t skipped = 0;
  for (size_t i = 0; i < log->n; i++) skipped += log->lines[i].skipped != 0;
  if (skipped) printf("  skipped       %zu logged steps skipped for non-finite values\n", skipped);
  if (log->unread)
    printf(
        "  note          %zu line%s of metrics.jsonl not read (the first: line %zu; a half-written last line "
        "of "
        "a run that was killed is one)\n",
        log->unread, log->unread == 1 ? "" : "s", log->first_unread);
}

int mf_cli_inspect_run(const char *dir) {
  char path[4400];
  snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
  mf_metrics_log log;
  memset(&log, 0, sizeof log);
  const int has_metrics = access(path, F_OK) == 0;
  if (has_metrics) {
    mf_status st = mf_metrics_read(path, &log);
    if (st != MF_OK) {
      mf_metrics_log_free(&log);
      return mf_cli_fail("inspect", st);
    }
  }
  printf("%s: a training run\n", dir);
  /* train.steps as the newest checkpoint recorded it */
  char ckpt[4400];
  int64_t newest = -1, planned = -1;
  {
    char root[4400];
    snprintf(root, sizeof root, "%s/checkpoints", dir);
    static int64_t steps[MAX_CKPTS];
    size_t n = 0;
    if (mf_ckpt_list_steps(root, 0, steps, MAX_CKPTS, &n) == 0)
      for (size_t i = 0; i < n && i < MAX_CKPTS; i++)
        if (steps[i] > newest) newest = steps[i];
    if (newest >= 0) {
      snprintf(ckpt, sizeof ckpt, "%s/step-%06lld", root, (long long)newest);
      const double p = json_file_num(ckpt, "state.json", "train_steps");
      if (isfinite(p)) planned = (int64_t)p;
    }
  }
  if (has_metrics)
    print_metrics(dir, &log, planned);
  else
    printf("  metrics       no metrics.jsonl\n");
  print_checkpoints(dir);
  print_final(dir);
  if (exists(dir, "routing.json"))
    printf("  routing       %s/routing.json (tokens routed to each expert)\n", dir);
  printf("\nnext: `moefit plot %s` draws the loss and tokens/s curves", dir);
  if (newest >= 0) printf("; `moefit inspect %s` verifies the newest checkpoint", ckpt);
  printf("\n");
  mf_metrics_log_free(&log);
  return MF_EXIT_OK;
}
