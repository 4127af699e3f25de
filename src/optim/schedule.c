/* Learning-rate schedules: linear warmup, then constant, linear or cosine decay
 * to min_lr, reaching it on the last step (definition in optim.h). */
#include <math.h>

#include "src/optim/optim.h"

double mf_lr_at(const mf_config_train *t, int64_t step) {
  const int64_t steps = t->steps > 1 ? t->steps : 1;
  const int64_t warmup = t->warmup < 0 ? 0 : (t->warmup > steps ? steps : t->warmup);
  if (step < 1) step = 1;
  if (step > steps) step = steps;
  if (step <= warmup) return t->lr * (double)step / (double)warmup;
  const int64_t span = steps - warmup > 1 ? steps - warmup : 1;
  const double progress = (double)(step - warmup) / (double)span;
  switch (t->schedule) {
    case MF_CONFIG_SCHEDULE_LINEAR:
      return t->min_lr + (t->lr - t->min_lr) * (1.0 - progress);
    case MF_CONFIG_SCHEDULE_COSINE:
      return t->min_lr + (t->lr - t->min_lr) * 0.5 * (1.0 + cos(M_PI * progress));
    case MF_CONFIG_SCHEDULE_CONSTANT:
    default:
      return t->lr;
  }
}
