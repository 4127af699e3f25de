/* The training loop's resume checkpoints (train_internal.h): what the loop
 * carries between steps, handed to src/ckpt and taken back. The loop's own
 * part of it: the step, the skipped count, step 1's loss, the loader's
 * position (its order is a function of (seed, epoch): that and the index are
 * its whole generator state); src/ckpt's tensors: the master weights, the
 * AdamW moments and step counts, the routing counts. Everything else a step
 * reads is recomputed from these (the learning rate from the step, the bf16
 * working copy from the master weights) or lives only inside one step. */
#include <stdio.h>
#include <string.h>

#include "src/train/base.h"
#include "experts/routing.h"
#include "src/train/train_internal.h"

mf_ckpt_data mf_train_ckpt_data(const mf_param_table *t, float *w, const mf_host_state *hs,
                                int64_t *adam_steps, int64_t *routed, size_t n_routed, uint64_t base_sum) {
  const mf_ckpt_data d = {t,        w,        hs->m.ptr,     hs->v.ptr, hs->moments, adam_steps, routed,
                          n_routed, base_sum, hs->base_bf16, 0,          NULL};
  return d;
}

mf_ckpt_state mf_train_ckpt_state(const mf_loader *l, const mf_config *cfg, int64_t step,
                                  const mf_train_summary *sum) {
  mf_loader_state ls;
  mf_loader_get_state(l, &ls);
  const mf_ckpt_state s = {
      step,     sum->skipped, sum->first_loss, mf_lr_at(&cfg->train, step),    cfg->train.steps, ls.epoch,
      ls.index, ls.seed,      ls.windows,      cfg->ranks > 1 ? cfg->ranks : 1};
  return s;
}

void mf_train_ckpt_log(const mf_ckpt_stats *cs, double paused) {
  const double seconds = cs->seconds, mib = (double)cs->bytes / (1024.0 * 1024.0),
               rate = seconds > 0 ? mib / seconds : 0.0;
  char how[160] = "";
  if (paused >= 0)
    snprintf(how, sizeof how, ", written beside training, which paused %.3f s for its snapshot", paused);
  if (cs->bytes == cs->raw_bytes) /* output.checkpoint_compression none */
    MF_LOGI("train", "checkpoint: %s (%.2f MiB in %.3f s, %.1f MiB/s, uncompressed%s)", cs->dir, mib, seconds,
            rate, how);
  else
    MF_LOGI("train", "checkpoint: %s (%.2f MiB in %.3f s, %.1f MiB/s; %.2fx smaller than its %.2f MiB%s)",
            cs->dir, mib, seconds, rate, cs->bytes ? (double)cs->raw_bytes / (double)cs->bytes : 1.0,
            (double)cs->raw_bytes / (1024.0 * 1024.0), how);
}

mf_status mf_train_ckpt_save(mf_ckpt_writer *ckw, const mf_ckpt_data *d, const mf_loader *l,
                             const mf_config *cfg, int64_t step, const mf_train_summary *sum, int quiet,
                             mf_step_metrics *sm, char *dir, size_t cap) {
  const mf_ckpt_state s = mf_train_ckpt_state(l, cfg, step, sum);
  mf_ckpt_stats cs;
  MF_CHECK(mf_ckpt_write_files(ckw, d, &s, &cs)); /* COMPLETE later: mf_ckpt_commit after the step's line */
  sm->checkpoint_s = cs.seconds;
  sm->checkpoint_bytes = (double)cs.bytes;
  snprintf(dir, cap, "%s", cs.dir);
  if (!quiet) mf_train_ckpt_log(&cs, -1.0);
  return MF_OK;
}

/* What the checkpoint's state says against what this run's steps do, before
 * any step: the windows its loader read are those of `step` steps of this
 * run's micro-batches, and its routing counts those of `step` steps of this
 * run's tokens (routing.json at the end of the run would refuse them only
 * after the training). src/ckpt checked the rest (skipped <= step <=
 * train_steps, the model's sizes, the AdamW step counts). */
static mf_status state_fits_run(const char *dir, const mf_config *cfg, const mf_ckpt_data *d,
                                const mf_ckpt_state *s) {
  const int64_t ranks = cfg->ranks > 1 ? cfg->ranks : 1;
  const uint64_t rows = (uint64_t)(cfg->train.micro_batch * cfg->train.grad_accum * ranks);
  uint64_t read = 0, want = 0;
  if (__builtin_mul_overflow(s->data_epoch, s->data_windows, &read) ||
      __builtin_add_overflow(read, s->data_index, &read) ||
      __builtin_mul_overflow((uint64_t)s->step, rows, &want) || read != want)
    return MF_ERR(MF_ERR_FORMAT,
                  "%s/state.json: data: epoch %llu at index %llu of %llu windows is not where %lld steps of %llu "
                  "windows (train.micro_batch x grad_accum x ranks) leave the loader: the state is inconsistent",
                  dir, (unsigned long long)s->data_epoch, (unsigned long long)s->data_index,
                  (unsigned long long)s->data_windows, (long long)s->step, (unsigned long long)rows);
  if (d->t->spec.experts < 1) return MF_OK;
  const uint64_t tokens = (uint64_t)s->step * rows * (uint64_t)cfg->data.seq_len;
  mf_routing r;
  if (mf_routing_from_counts(&d->t->spec, d->routed, tokens, &r) != MF_OK)
    return MF_ERR(MF_ERR_FORMAT,
                  "%s/state.safetensors: routed_tokens are not the counts of state.json's %lld steps of %llu "
                  "tokens: %s",
                  dir, (long long)s->step, (unsigned long long)(rows * (uint64_t)cfg->data.seq_len),
                  mf_last_error());
  mf_routing_free(&r);
  return MF_OK;
}

mf_status mf_train_ckpt_load(const mf_config *cfg, const char *want, const mf_ckpt_data *d, mf_loader *l,
                             mf_train_summary *sum, char *dir, size_t cap, int64_t *step) {
  if (want)
    snprintf(dir, cap, "%s", want);
  else
    MF_CHECK(mf_ckpt_find_latest(cfg->output.dir, dir, cap));
  MF_CHECK(mf_ckpt_check_config(dir, cfg));
  MF_CHECK(mf_run_base_check_ckpt(dir, d->base_json, d->t->lora_a != NULL)); /* the base it trained on */
  mf_ckpt_state s;
  MF_CHECK(mf_ckpt_read(dir, d, &s));
  MF_CHECK(state_fits_run(dir, cfg, d, &s));
  if (s.step >= cfg->train.steps)
    return MF_ERR(MF_ERR_CONFIG, "%s: the checkpoint is of step %lld and train.steps is %lld: nothing left to train "
                  "(raise train.steps)", dir, (long long)s.step, (long long)cfg->train.steps);
  const mf_loader_state ls = {s.data_epoch, s.data_index, s.data_seed, s.data_windows};
  mf_status st = mf_loader_set_state(l, &ls);
  if (st != MF_OK) {
    mf_error_prefix("%s/state.json: data", dir);
    return st;
  }
  sum->steps = s.step;
  sum->skipped = s.skipped;
  sum->first_loss = s.first_loss;
  *step = s.step;
  return MF_OK;
}
