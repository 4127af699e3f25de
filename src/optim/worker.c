/* The overlapped host optimizer (see worker.h).
 *
 * One thread runs a FIFO of jobs: a norm pass (the chunk sums of one gradient)
 * or an update (the clip scaling and AdamW of one parameter). The queue is a
 * ring of 2n + 2 entries: at most one update per parameter (queued only when
 * the queue is empty) and one norm pass per parameter per step are ever in it.
 * `head` counts the jobs done, `tail` the jobs queued, both under `lock`;
 * `upd_done` (also read without the lock, acquire/release) counts the updates
 * of the current list that are done: they run in list order, so parameter p's
 * update is done once upd_done > pos[p]. */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "src/optim/worker.h"

struct mf_optim_worker {
  mf_optim_tensor *t; /* [n] */
  int32_t n;
  size_t *chunk_off;    /* [n + 1] where each gradient's chunk sums start in `sums` */
  double *sums;         /* [chunk_off[n]] */
  uint8_t *homed;       /* [n] handed over this step (under lock: grad_home may come from another thread) */
  int32_t *pos;         /* [n] index in upd of the parameter's pending update, or -1 (step loop only) */
  mf_optim_update *upd; /* [n] the current update list */
  int32_t n_upd;
  double coef;
  int32_t *jobs; /* ring [cap]: >= 0 a norm pass of that parameter, -(k+1) update k */
  uint64_t cap, head, tail;
  int32_t upd_done; /* atomic */
  double busy;      /* under lock */
  double waited;    /* step loop only */
  mf_status err;    /* under lock: the first failed job's status */
  char msg[512];
  mf_threadpool *pool;
  pthread_t thread;
  int started, quit;
  pthread_mutex_t lock;
  pthread_cond_t work, done;
};

static mf_status run_job(mf_optim_worker *wk, int32_t job) {
  if (job >= 0) {
    const mf_optim_tensor *t = &wk->t[job];
    return mf_optim_grad_chunk_sumsq(t->g, t->n, wk->pool, wk->sums + wk->chunk_off[job]);
  }
  const mf_optim_update *u = &wk->upd[-job - 1];
  const mf_optim_tensor *t = &wk->t[u->param];
  if (t->n == 0) return MF_OK;
  if (wk->coef < 1.0) {
    const mf_optim_buf b = {t->g, t->n};
    MF_CHECK(mf_optim_grad_scale(&b, 1, wk->coef, wk->pool));
  }
  const mf_adamw_bufs b = {t->w, t->g, t->m, t->v, t->bf16_out, t->n, MF_DTYPE_F32, t->moments};
  return mf_adamw_update_bufs(&u->h, u->step, &b, wk->pool);
}

static void *worker_main(void *arg) {
  mf_optim_worker *wk = (mf_optim_worker *)arg;
  pthread_mutex_lock(&wk->lock);
  for (;;) {
    while (!wk->quit && wk->head == wk->tail) pthread_cond_wait(&wk->work, &wk->lock);
    if (wk->head == wk->tail) break; /* quitting, nothing left */
    const int32_t job = wk->jobs[wk->head % wk->cap];
    const int failed = wk->err != MF_OK;
    pthread_mutex_unlock(&wk->lock);
    const double t0 = mf_time_now();
    mf_status st = failed ? MF_OK : run_job(wk, job); /* after a failure the rest are dropped */
    const double dt = mf_time_now() - t0;
    pthread_mutex_lock(&wk->lock);
    wk->busy += dt;
    if (st != MF_OK && wk->err == MF_OK) {
      wk->err = st;
      snprintf(wk->msg, sizeof wk->msg, "%s", mf_last_error());
    }
    if (job < 0) __atomic_store_n(&wk->upd_done, -job, __ATOMIC_RELEASE);
    wk->head++;
    pthread_cond_broadcast(&wk->done);
  }
  pthread_mutex_unlock(&wk->lock);
  return NULL;
}

mf_status mf_optim_worker_create(const mf_optim_tensor *tensors, int32_t n, int threads,
                                 mf_optim_worker **out) {
  if (!out) return MF_ERR(MF_ERR_INVALID_ARG, "optimizer worker: no result pointer");
  *out = NULL;
  if (n < 0 || (n > 0 && !tensors))
    return MF_ERR(MF_ERR_INVALID_ARG, "optimizer worker: %d tensors but a NULL list", (int)n);
  for (int32_t i = 0; i < n; i++)
    if (tensors[i].n > 0 && (!tensors[i].w || !tensors[i].g || !tensors[i].m || !tensors[i].v))
      return MF_ERR(MF_ERR_INVALID_ARG, "optimizer worker: tensor %d has %zu elements but a NULL buffer",
                    (int)i, tensors[i].n);
  for (int32_t i = 0; i < n; i++)
    if (tensors[i].moments != MF_DTYPE_F32 && tensors[i].moments != MF_DTYPE_BF16)
      return MF_ERR(MF_ERR_INVALID_ARG, "optimizer worker: tensor %d: moment dtype %s: must be F32 or BF16",
                    (int)i, mf_dtype_name(tensors[i].moments));
  mf_optim_worker *wk = (mf_optim_worker *)calloc(1, sizeof *wk);
  if (!wk) return MF_ERR(MF_ERR_OUT_OF_MEMORY, "optimizer worker: out of memory");
  pthread_mutex_init(&wk->lock, NULL);
  pthread_cond_init(&wk->work, NULL);
  pthread_cond_init(&wk->done, NULL);
  wk->n = n;
  wk->cap = 2 * (uint64_t)n + 2;
  const size_t nn = (size_t)n + 1;
  mf_status st = MF_OK;
  MF_CHECK_GOTO(mf_malloc(nn * sizeof *wk->t, "optimizer worker tensors", (void **)&wk->t), st, fail);
  MF_CHECK_GOTO(
      mf_calloc(nn, sizeof *wk->chunk_off, "optimizer worker chunk offsets", (void **)&wk->chunk_off), st,
      fail);
  MF_CHECK_GOTO(mf_calloc(nn, 1, "optimizer worker marks", (void **)&wk->homed), st, fail);
  MF_CHECK_GOTO(mf_malloc(nn * sizeof *wk->pos, "optimizer worker positions", (void **)&wk->pos), st, fail);
  MF_CHECK_GOTO(mf_malloc(nn * sizeof *wk->upd, "optimizer worker updates", (void **)&wk->upd), st, fail);
  MF_CHECK_GOTO(mf_malloc((size_t)wk->cap * sizeof *wk->jobs, "optimizer worker queue", (void **)&wk->jobs),
                st, fail);
  if (n > 0) memcpy(wk->t, tensors, (size_t)n * sizeof *wk->t);
  for (int32_t i = 0; i < n; i++) {
    wk->chunk_off[i + 1] = wk->chunk_off[i] + mf_optim_norm_chunks(wk->t[i].n);
    wk->pos[i] = -1;
  }
  MF_CHECK_GOTO(
      mf_malloc((wk->chunk_off[n] + 1) * sizeof(double), "gradient norm chunk sums", (void **)&wk->sums), st,
      fail);
  MF_CHECK_GOTO(mf_threadpool_create(threads, &wk->pool), st, fail);
  if (pthread_create(&wk->thread, NULL, worker_main, wk) != 0) {
    st = MF_ERR(MF_ERR_INTERNAL, "optimizer worker: cannot start its thread");
    goto fail;
  }
  wk->started = 1;
  *out = wk;
  return MF_OK;
fail:
  mf_optim_worker_free(wk);
  return st;
}

void mf_optim_worker_free(mf_optim_worker *wk) {
  if (!wk) return;
  if (wk->started) {
    pthread_mutex_lock(&wk->lock);
    wk->quit = 1;
    pthread_cond_signal(&wk->work);
    pthread_mutex_unlock(&wk->lock);
    pthread_join(wk->thread, NULL);
  }
  mf_threadpool_free(wk->pool);
  pthread_mutex_destroy(&wk->lock);
  pthread_cond_destroy(&wk->work);
  pthread_cond_destroy(&wk->done);
  free(wk->t);
  free(wk->chunk_off);
  free(wk->sums);
  free(wk->homed);
  free(wk->pos);
  free(wk->upd);
  free(wk->jobs);
  free(wk);
}

/* Appends a job; the caller holds the lock. The ring cannot overflow (see top). */
static void push_locked(mf_optim_worker *wk, int32_t job) {
  wk->jobs[wk->tail % wk->cap] = job;
  wk->tail++;
}

/* May run on a thread other than the step loop's (the executor's copy-out, a
 * host function on cuda): `homed` is read and set under the lock. */
void mf_optim_worker_grad_home(mf_optim_worker *wk, int32_t i) {
  if (i < 0 || i >= wk->n) return;
  pthread_mutex_lock(&wk->lock);
  if (!wk->homed[i]) {
    wk->homed[i] = 1;
    push_locked(wk, i);
    pthread_cond_signal(&wk->work);
  }
  pthread_mutex_unlock(&wk->lock);
}

/* The first failed job's error, recorded again on this thread. */
static mf_status take_error(mf_optim_worker *wk) {
  pthread_mutex_lock(&wk->lock);
  const mf_status e = wk->err;
  pthread_mutex_unlock(&wk->lock);
  if (e == MF_OK) return MF_OK;
  return MF_ERR(e, "optimizer worker: %s", wk->msg);
}

mf_status mf_optim_worker_wait_all(mf_optim_worker *wk) {
  const double t0 = mf_time_now();
  pthread_mutex_lock(&wk->lock);
  const int blocked = wk->head != wk->tail;
  while (wk->head != wk->tail) pthread_cond_wait(&wk->done, &wk->lock);
  pthread_mutex_unlock(&wk->lock);
  if (blocked) wk->waited += mf_time_now() - t0;
  return take_error(wk);
}

mf_status mf_optim_worker_norm(mf_optim_worker *wk, const uint8_t *used, double *norm) {
  return mf_optim_worker_norm_ext(wk, used, NULL, norm);
}

mf_status mf_optim_worker_norm_ext(mf_optim_worker *wk, const uint8_t *used, const double *const *ext,
                                   double *norm) {
  if (!used || !norm)
    return MF_ERR(MF_ERR_INVALID_ARG, "optimizer worker: no used flags or no result pointer");
  pthread_mutex_lock(&wk->lock);
  int pushed = 0;
  for (int32_t i = 0; i < wk->n; i++)
    if (used[i] && !wk->homed[i] && !(ext && ext[i])) {
      push_locked(wk, i);
      pushed = 1;
    }
  if (pushed) pthread_cond_signal(&wk->work);
  pthread_mutex_unlock(&wk->lock);
  MF_CHECK(mf_optim_worker_wait_all(wk));
  /* mf_optim_grad_norm's sum: chunk sums one at a time from 0.0, in order. */
  double sum = 0.0;
  for (int32_t i = 0; i < wk->n; i++) {
    if (!used[i] || !wk->t[i].g || wk->t[i].n == 0) continue;
    const double *from = ext && ext[i] ? ext[i] : wk->sums + wk->chunk_off[i];
    for (size_t k = 0; k < wk->chunk_off[i + 1] - wk->chunk_off[i]; k++) sum += from[k];
  }
  memset(wk->homed, 0, (size_t)wk->n);
  *norm = sqrt(sum);
  return MF_OK;
}

mf_status mf_optim_worker_update(mf_optim_worker *wk, const mf_optim_update *u, int32_t n, double coef) {
  if (n < 0 || n > wk->n || (n > 0 && !u))
    return MF_ERR(MF_ERR_INVALID_ARG, "optimizer worker: %d updates for %d parameters", (int)n, (int)wk->n);
  pthread_mutex_lock(&wk->lock);
  const int busy = wk->head != wk->tail;
  pthread_mutex_unlock(&wk->lock);
  if (busy)
    return MF_ERR(MF_ERR_INTERNAL, "optimizer worker: updates queued before the step's norm was taken");
  for (int32_t i = 0; i < wk->n; i++) wk->pos[i] = -1;
  for (int32_t k = 0; k < n; k++) {
    const int32_t p = u[k].param;
    if (p < 0 || p >= wk->n || wk->pos[p] >= 0) {
      for (int32_t i = 0; i < wk->n; i++) wk->pos[i] = -1;
      return MF_ERR(MF_ERR_INVALID_ARG,
                    "optimizer worker: update %d names parameter %d (out of range or twice)", (int)k, (int)p);
    }
    wk->pos[p] = k;
  }
  pthread_mutex_lock(&wk->lock);
  if (n > 0) memcpy(wk->upd, u, (size_t)n * sizeof *u);
  wk->n_upd = n;
  wk->coef = coef;
  __atomic_store_n(&wk->upd_done, 0, __ATOMIC_RELEASE);
  for (int32_t k = 0; k < n; k++) push_locked(wk, -(k + 1));
  if (n > 0) pthread_cond_signal(&wk->work);
  pthread_mutex_unlock(&wk->lock);
  return MF_OK;
}

mf_status mf_optim_worker_wait_param(mf_optim_worker *wk, int32_t i) {
  if (i < 0 || i >= wk->n || wk->pos[i] < 0) return MF_OK;
  const int32_t need = wk->pos[i] + 1;
  if (__atomic_load_n(&wk->upd_done, __ATOMIC_ACQUIRE) < need) {
    const double t0 = mf_time_now();
    pthread_mutex_lock(&wk->lock);
    while (__atomic_load_n(&wk->upd_done, __ATOMIC_ACQUIRE) < need) pthread_cond_wait(&wk->done, &wk->lock);
    pthread_mutex_unlock(&wk->lock);
    wk->waited += mf_time_now() - t0;
    MF_CHECK(take_error(wk));
  }
  wk->pos[i] = -1;
  return MF_OK;
}

void mf_optim_worker_stats(mf_optim_worker *wk, double *busy, double *waited) {
  pthread_mutex_lock(&wk->lock);
  if (busy) *busy = wk->busy;
  pthread_mutex_unlock(&wk->lock);
  if (waited) *waited = wk->waited;
}
