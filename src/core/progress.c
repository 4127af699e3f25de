/* Progress of long work on a terminal (see core.h mf_progress_start). */
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "src/core/core.h"
#include "src/core/env.h"

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_cv = PTHREAD_COND_INITIALIZER;

static struct {
  pthread_t thread;
  int running;  /* a reporter thread is started */
  int depth;    /* starts not yet stopped (nested ones share the outermost's line) */
  int stopping; /* it is asked to end */
  int shown;    /* its line is on the terminal (to be cleared before other output) */
  double t0, after;
  char label[64];
  char what[192];
} g;

void mf_progress_note(const char *fmt, ...) {
  if (!__atomic_load_n(&g.running, __ATOMIC_ACQUIRE)) return;
  char buf[sizeof g.what];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  pthread_mutex_lock(&g_mu);
  memcpy(g.what, buf, sizeof buf);
  pthread_mutex_unlock(&g_mu);
}

/* Under g_mu: wipes the line the reporter printed. */
static void clear_locked(void) {
  if (!g.shown) return;
  fputs("\r\033[K", stderr);
  fflush(stderr);
  g.shown = 0;
}

void mf_progress_clear(void) {
  if (!__atomic_load_n(&g.running, __ATOMIC_ACQUIRE)) return;
  pthread_mutex_lock(&g_mu);
  clear_locked();
  pthread_mutex_unlock(&g_mu);
}

static void *reporter(void *arg) {
  (void)arg;
  pthread_mutex_lock(&g_mu);
  while (!g.stopping) {
    const double el = mf_time_now() - g.t0;
    if (el >= g.after) {
      /* One line, rewritten in place; kept short of a terminal's 80 columns. */
      fprintf(stderr, "\r\033[K%s: %.60s (%.0f s)", g.label, g.what, el);
      fflush(stderr);
      g.shown = 1;
    }
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 1;
    pthread_cond_timedwait(&g_cv, &g_mu, &until);
  }
  clear_locked();
  pthread_mutex_unlock(&g_mu);
  return NULL;
}

void mf_progress_start(const char *label, double after_seconds) {
  pthread_mutex_lock(&g_mu);
  const int outer = g.depth++ == 0;
  pthread_mutex_unlock(&g_mu);
  if (!outer || !isatty(2)) return;
  (void)mf_env_number(MF_ENV_PROGRESS_AFTER, &after_seconds);
  pthread_mutex_lock(&g_mu);
  snprintf(g.label, sizeof g.label, "%s", label);
  snprintf(g.what, sizeof g.what, "starting");
  g.t0 = mf_time_now();
  g.after = after_seconds;
  g.stopping = 0;
  g.shown = 0;
  const int ok = pthread_create(&g.thread, NULL, reporter, NULL) == 0;
  pthread_mutex_unlock(&g_mu);
  if (ok) __atomic_store_n(&g.running, 1, __ATOMIC_RELEASE);
}

void mf_progress_stop(void) {
  pthread_mutex_lock(&g_mu);
  const int outer = g.depth > 0 && --g.depth == 0;
  pthread_mutex_unlock(&g_mu);
  if (!outer || !__atomic_load_n(&g.running, __ATOMIC_ACQUIRE)) return;
  pthread_mutex_lock(&g_mu);
  g.stopping = 1;
  pthread_cond_signal(&g_cv);
  pthread_mutex_unlock(&g_mu);
  pthread_join(g.thread, NULL);
  __atomic_store_n(&g.running, 0, __ATOMIC_RELEASE);
}
