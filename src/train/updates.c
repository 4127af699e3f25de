/* The step's one list of parameter updates and the three ways it runs
 * (train_internal.h). Whichever runs an update — the host after the step,
 * the overlapped worker behind the next step, or the device — the selection,
 * the step count, the hyper-parameters and the decay rule are decided here
 * once, so the three give the same bits (tests/exec:overlap_test,
 * device_optim_test). */
#include <stdlib.h>
#include <string.h>

#include "src/train/train_internal.h"

int mf_updates_has_gradient(const mf_param_table *t, const int64_t *expert_tokens, int64_t i) {
  const mf_param *p = &t->params[i];
  if (p->frozen) return 0; /* LoRA's base */
  return p->expert < 0 || mf_family_idle_expert_has_grad(t->spec.family) ||
         expert_tokens[p->layer * t->spec.experts + p->expert] > 0;
}

mf_status mf_updates_init(mf_updates *u, const mf_param_table *t, const uint8_t *on_device, const int32_t *order) {
  memset(u, 0, sizeof *u);
  u->t = t;
  u->on_device = on_device;
  u->order = order;
  const size_t n = (size_t)(t->n ? t->n : 1);
  MF_CHECK(mf_calloc(n, sizeof(int64_t), "step counts", (void **)&u->steps));
  MF_CHECK(mf_calloc(n, 1, "weight decay flags", (void **)&u->decays));
  MF_CHECK(mf_calloc(n, sizeof(mf_optim_update), "optimizer updates", (void **)&u->host));
  MF_CHECK(mf_calloc(n, 1, "device updates", (void **)&u->device));
  for (int64_t i = 0; i < t->n; i++) u->decays[i] = t->params[i].ndim == 2;
  return MF_OK;
}

void mf_updates_free(mf_updates *u) {
  free(u->steps);
  free(u->decays);
  free(u->host);
  free(u->device);
  memset(u, 0, sizeof *u);
}

void mf_updates_plan(mf_updates *u, const int64_t *expert_tokens, const mf_config_train *tc, double lr) {
  const mf_param_table *t = u->t;
  u->h = mf_adamw_hparams_from_config(tc, lr);
  mf_adamw_hparams nodecay = u->h;
  nodecay.weight_decay = 0;
  u->n_host = 0;
  for (int64_t k = 0; k < t->n; k++) {
    const int32_t i = u->order ? u->order[k] : (int32_t)k;
    const int dev = u->on_device && u->on_device[i];
    const int upd = mf_updates_has_gradient(t, expert_tokens, i);
    u->device[i] = (uint8_t)(dev && upd);
    if (!upd) continue;
    u->steps[i]++;
    if (!dev) u->host[u->n_host++] = (mf_optim_update){i, u->steps[i], u->decays[i] ? u->h : nodecay};
  }
}

mf_status mf_updates_run_host(const mf_updates *u, float *w, uint16_t *working, float *g, mf_host_state *hs,
                              mf_threadpool *pool) {
  return mf_updates_run_host_shard(u, w, working, g, hs, pool, NULL, NULL);
}

mf_status mf_updates_run_host_shard(const mf_updates *u, float *w, uint16_t *working, float *g,
                                    mf_host_state *hs, mf_threadpool *pool, const int64_t *lo,
                                    const int64_t *hi) {
  const size_t ms = mf_dtype_size(hs->moments);
  for (int32_t k = 0; k < u->n_host; k++) {
    const mf_optim_update *q = &u->host[k];
    const mf_param *p = &u->t->params[q->param];
    const int64_t a = lo ? lo[q->param] : 0, e = hi ? hi[q->param] : p->numel;
    if (e <= a) continue;
    const size_t o = (size_t)(p->offset + a), og = (size_t)(p->toff + a); /* weights; gradient, moments */
    const mf_adamw_bufs b = {w + o,
                             g + og,
                             (char *)hs->m.ptr + og * ms,
                             (char *)hs->v.ptr + og * ms,
                             working ? working + o : NULL,
                             (size_t)(e - a),
                             MF_DTYPE_F32,
                             hs->moments};
    MF_CHECK(mf_adamw_update_bufs(&q->h, q->step, &b, pool));
    mf_host_state_release(hs, u->t, q->param);
  }
  return MF_OK;
}

mf_status mf_updates_run_device(const mf_updates *u, mf_exec *x, double coef) {
  if (!u->on_device) return MF_OK;
  const mf_adamw_hparams *h = &u->h;
  const mf_exec_optim a = {h->lr, h->beta1, h->beta2, h->eps, h->weight_decay, coef, u->steps, u->device, u->decays};
  return mf_exec_optimize(x, &a);
}
