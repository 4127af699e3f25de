/* A fixed pool of workers driven in lock step: each run hands every worker its
 * index; the caller is worker 0. A generation counter under one mutex keeps it
 * simple and correct; a run costs two condition-variable round trips. */
#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>

#include "src/core/core.h"
#include "src/core/env.h"

struct mf_threadpool {
  int n;
  pthread_t *threads;
  pthread_mutex_t lock;
  pthread_cond_t start;
  pthread_cond_t done;
  unsigned long generation;
  int pending;
  int quit;
  mf_task_fn fn;
  void *ctx;
};

typedef struct {
  mf_threadpool *pool;
  int index;
} worker_arg;

static void *worker_main(void *arg) {
  worker_arg *w = (worker_arg *)arg;
  mf_threadpool *p = w->pool;
  int index = w->index;
  free(w);
  unsigned long seen = 0;
  for (;;) {
    pthread_mutex_lock(&p->lock);
    while (!p->quit && p->generation == seen) pthread_cond_wait(&p->start, &p->lock);
    if (p->quit) {
      pthread_mutex_unlock(&p->lock);
      return NULL;
    }
    seen = p->generation;
    mf_task_fn fn = p->fn;
    void *ctx = p->ctx;
    pthread_mutex_unlock(&p->lock);
    fn(ctx, index, p->n);
    pthread_mutex_lock(&p->lock);
    if (--p->pending == 0) pthread_cond_signal(&p->done);
    pthread_mutex_unlock(&p->lock);
  }
}

static int default_threads(void) {
  double v;
  if (mf_env_number(MF_ENV_THREADS, &v)) return (int)v;
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? (int)n : 1;
}

mf_status mf_threadpool_create(int n_threads, mf_threadpool **out) {
  *out = NULL;
  if (n_threads <= 0) n_threads = default_threads();
  if (n_threads > 1024) return MF_ERR(MF_ERR_INVALID_ARG, "thread pool: %d threads is too many (at most 1024)", n_threads);
  mf_threadpool *p = (mf_threadpool *)calloc(1, sizeof *p);
  if (!p) return MF_ERR(MF_ERR_OUT_OF_MEMORY, "thread pool: out of memory");
  p->n = n_threads;
  pthread_mutex_init(&p->lock, NULL);
  pthread_cond_init(&p->start, NULL);
  pthread_cond_init(&p->done, NULL);
  if (n_threads > 1) {
    p->threads = (pthread_t *)calloc((size_t)n_threads - 1, sizeof(pthread_t));
    if (!p->threads) {
      mf_threadpool_free(p);
      return MF_ERR(MF_ERR_OUT_OF_MEMORY, "thread pool: out of memory");
    }
    for (int i = 1; i < n_threads; i++) {
      worker_arg *w = (worker_arg *)malloc(sizeof *w);
      if (!w || pthread_create(&p->threads[i - 1], NULL, worker_main, w ? (w->pool = p, w->index = i, w) : NULL) != 0) {
        free(w);
        p->n = i; /* workers 1..i-1 exist */
        mf_threadpool_free(p);
        return MF_ERR(MF_ERR_OUT_OF_MEMORY, "thread pool: could not start thread %d of %d", i, n_threads);
      }
    }
  }
  *out = p;
  return MF_OK;
}

void mf_threadpool_free(mf_threadpool *p) {
  if (!p) return;
  if (p->threads) {
    pthread_mutex_lock(&p->lock);
    p->quit = 1;
    pthread_cond_broadcast(&p->start);
    pthread_mutex_unlock(&p->lock);
    for (int i = 1; i < p->n; i++) pthread_join(p->threads[i - 1], NULL);
    free(p->threads);
  }
  pthread_mutex_destroy(&p->lock);
  pthread_cond_destroy(&p->start);
  pthread_cond_destroy(&p->done);
  free(p);
}

int mf_threadpool_size(const mf_threadpool *p) { return p ? p->n : 1; }

void mf_threadpool_run(mf_threadpool *p, mf_task_fn fn, void *ctx) {
  if (!p || p->n == 1) {
    fn(ctx, 0, 1);
    return;
  }
  pthread_mutex_lock(&p->lock);
  p->fn = fn;
  p->ctx = ctx;
  p->pending = p->n - 1;
  p->generation++;
  pthread_cond_broadcast(&p->start);
  pthread_mutex_unlock(&p->lock);
  fn(ctx, 0, p->n);
  pthread_mutex_lock(&p->lock);
  while (p->pending > 0) pthread_cond_wait(&p->done, &p->lock);
  pthread_mutex_unlock(&p->lock);
}

void mf_partition(size_t count, size_t grain, int i, int n, size_t *begin, size_t *end) {
  if (grain == 0) grain = 1;
  if (n <= 0) n = 1;
  size_t chunks = (count + grain - 1) / grain;
  size_t per = chunks / (size_t)n, extra = chunks % (size_t)n;
  size_t ci = (size_t)i;
  size_t c0 = ci * per + (ci < extra ? ci : extra);
  size_t c1 = c0 + per + (ci < extra ? 1 : 0);
  size_t b = c0 * grain, e = c1 * grain;
  *begin = b < count ? b : count;
  *end = e < count ? e : count;
}
