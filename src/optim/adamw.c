/* AdamW: the step's coefficients (double where torch computes Python floats,
 * rounded to fp32 where ATen hands a scalar to an fp32 kernel), argument checks,
 * the choice of loop body and the split over the thread pool. */
#include <math.h>
#include <pthread.h>
#include <string.h>

#include "src/optim/adamw_impl.h"
#include "src/optim/optim.h"

/* ------------------------------------------------------------ loop bodies */

typedef struct impl {
  const char *name;
  mf_adamw_tile_fn fn;
  int (*supported)(void);
} impl;

static int always(void) {
  return 1;
}
#if defined(__x86_64__)
static int have_fma(void) {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}
static int have_avx512(void) {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl");
}
#endif

/* Fastest first: "auto" takes the first one this CPU runs. */
static const impl impls[] = {
#if defined(__x86_64__)
    {"avx512", mf_adamw_tile_avx512, have_avx512},
    {"avx2", mf_adamw_tile_avx2, have_fma},
    {"fma", mf_adamw_tile_fma, have_fma},
#endif
    {"scalar", mf_adamw_tile_scalar, always},
};
#define N_IMPLS (sizeof impls / sizeof impls[0])

static const impl *chosen; /* read and written through __atomic */
static pthread_once_t chosen_once = PTHREAD_ONCE_INIT;

static const impl *pick_auto(void) {
  for (size_t i = 0; i < N_IMPLS; i++)
    if (impls[i].supported()) return &impls[i];
  return &impls[N_IMPLS - 1];
}

static void choose_default(void) {
  const impl *none = NULL;
  __atomic_compare_exchange_n(&chosen, &none, pick_auto(), 0, __ATOMIC_RELEASE, __ATOMIC_RELAXED);
}

static const impl *current(void) {
  pthread_once(&chosen_once, choose_default);
  return __atomic_load_n(&chosen, __ATOMIC_ACQUIRE);
}

const char *mf_adamw_impl_name(void) {
  return current()->name;
}

mf_status mf_adamw_select_impl(const char *name) {
  if (!name) return MF_ERR(MF_ERR_INVALID_ARG, "adamw: no body name given");
  pthread_once(&chosen_once, choose_default);
  if (strcmp(name, "auto") == 0) {
    __atomic_store_n(&chosen, pick_auto(), __ATOMIC_RELEASE);
    return MF_OK;
  }
  for (size_t i = 0; i < N_IMPLS; i++) {
    if (strcmp(name, impls[i].name) != 0) continue;
    if (!impls[i].supported())
      return MF_ERR(MF_ERR_UNSUPPORTED, "adamw: body \"%s\" needs CPU features this machine lacks", name);
    __atomic_store_n(&chosen, &impls[i], __ATOMIC_RELEASE);
    return MF_OK;
  }
  return MF_ERR(MF_ERR_INVALID_ARG, "adamw: unknown body \"%s\" (auto, avx512, avx2, fma, scalar)", name);
}

/* ------------------------------------------------------------ coefficients */

mf_adamw_hparams mf_adamw_hparams_from_config(const mf_config_train *t, double lr) {
  mf_adamw_hparams h = {lr, t->beta1, t->beta2, t->eps, t->weight_decay};
  return h;
}

static mf_status check_hparams(const mf_adamw_hparams *h, int64_t step) {
  if (!h) return MF_ERR(MF_ERR_INVALID_ARG, "adamw: no hyper-parameters given");
  if (step < 1) return MF_ERR(MF_ERR_INVALID_ARG, "adamw: step %lld: steps count from 1", (long long)step);
  /* the negated comparisons also reject NaN */
  if (!(h->lr >= 0) || !isfinite(h->lr))
    return MF_ERR(MF_ERR_INVALID_ARG, "adamw: lr %g: must be >= 0", h->lr);
  if (!(h->beta1 >= 0 && h->beta1 < 1))
    return MF_ERR(MF_ERR_INVALID_ARG, "adamw: beta1 %g: must be in [0, 1)", h->beta1);
  if (!(h->beta2 >= 0 && h->beta2 < 1))
    return MF_ERR(MF_ERR_INVALID_ARG, "adamw: beta2 %g: must be in [0, 1)", h->beta2);
  if (!(h->eps >= 0) || !isfinite(h->eps))
    return MF_ERR(MF_ERR_INVALID_ARG, "adamw: eps %g: must be >= 0", h->eps);
  if (!(h->weight_decay >= 0) || !isfinite(h->weight_decay))
    return MF_ERR(MF_ERR_INVALID_ARG, "adamw: weight_decay %g: must be >= 0", h->weight_decay);
  return MF_OK;
}

/* torch: step = state_step.item() (a float32 counter, exact below 2^24), then
 * Python floats: 1 - beta1 ** step, lr / bc1, bc2 ** 0.5. `**` is C pow. */
static mf_adamw_coefs make_coefs(const mf_adamw_hparams *h, int64_t step) {
  const double t = (double)step;
  const double bc1 = 1.0 - pow(h->beta1, t);
  const double bc2 = 1.0 - pow(h->beta2, t);
  const double step_size = h->lr / bc1;
  mf_adamw_coefs c;
  c.decay = (float)(1.0 - h->lr * h->weight_decay);
  c.w1 = (float)(1.0 - h->beta1);
  c.w1_minus_1 = c.w1 - 1.0f;
  c.w1_small = fabsf(c.w1) < 0.5f;
  c.beta2 = (float)h->beta2;
  c.one_minus_b2 = (float)(1.0 - h->beta2);
  c.bc2_sqrt = (float)pow(bc2, 0.5);
  c.eps = (float)h->eps;
  c.neg_step = (float)-step_size;
  return c;
}

/* ---------------------------------------------------------------- driver */

typedef struct adamw_job {
  mf_adamw_tile_fn fn;
  const mf_adamw_coefs *c;
  int kind;        /* MF_ADAMW_G_BF16 | MF_ADAMW_M_BF16 */
  size_t gsz, msz; /* bytes per gradient / moment element */
  float *p;
  const char *g;
  char *m, *v;
  uint16_t *bf16;
  size_t n;
} adamw_job;

static void adamw_task(void *ctx, int i, int n_threads) {
  const adamw_job *j = (const adamw_job *)ctx;
  size_t b, e;
  mf_partition(j->n, MF_ADAMW_GRAIN, i, n_threads, &b, &e);
  /* one tile at a time: the four input streams of a tile stay within L2 */
  for (size_t t = b; t < e; t += MF_ADAMW_GRAIN) {
    size_t len = e - t < MF_ADAMW_GRAIN ? e - t : MF_ADAMW_GRAIN;
    j->fn(j->c, j->kind, j->p + t, j->g + t * j->gsz, j->m + t * j->msz, j->v + t * j->msz,
          j->bf16 ? j->bf16 + t : NULL, len);
  }
}

static mf_status check_dtype(mf_dtype d, const char *what) {
  if (d == MF_DTYPE_F32 || d == MF_DTYPE_BF16) return MF_OK;
  return MF_ERR(MF_ERR_INVALID_ARG, "adamw: %s dtype %s (%d): must be F32 or BF16", what, mf_dtype_name(d),
                (int)d);
}

mf_status mf_adamw_update_bufs(const mf_adamw_hparams *h, int64_t step, const mf_adamw_bufs *b,
                               mf_threadpool *pool) {
  MF_CHECK(check_hparams(h, step));
  if (!b) return MF_ERR(MF_ERR_INVALID_ARG, "adamw: no buffers given");
  MF_CHECK(check_dtype(b->grad_dtype, "gradient"));
  MF_CHECK(check_dtype(b->moment_dtype, "moment"));
  if (b->n == 0) return MF_OK;
  if (!b->param || !b->grad || !b->m || !b->v)
    return MF_ERR(MF_ERR_INVALID_ARG, "adamw: %zu elements but a NULL buffer (param %p grad %p m %p v %p)",
                  b->n, (void *)b->param, b->grad, b->m, b->v);
  const mf_adamw_coefs c = make_coefs(h, step);
  const int gbf = b->grad_dtype == MF_DTYPE_BF16, mbf = b->moment_dtype == MF_DTYPE_BF16;
  adamw_job job = {
      current()->fn,         &c,           (gbf ? MF_ADAMW_G_BF16 : 0) | (mbf ? MF_ADAMW_M_BF16 : 0),
      gbf ? 2 : 4,           mbf ? 2 : 4,  b->param,
      (const char *)b->grad, (char *)b->m, (char *)b->v,
      b->bf16_out,           b->n};
  if (!pool || b->n <= MF_ADAMW_GRAIN)
    adamw_task(&job, 0, 1);
  else
    mf_threadpool_run(pool, adamw_task, &job);
  return MF_OK;
}

mf_status mf_adamw_update(const mf_adamw_hparams *h, int64_t step, float *param, const float *grad, float *m,
                          float *v, size_t n, uint16_t *bf16_out, mf_threadpool *pool) {
  const mf_adamw_bufs b = {param, grad, m, v, bf16_out, n, MF_DTYPE_F32, MF_DTYPE_F32};
  return mf_adamw_update_bufs(h, step, &b, pool);
}
