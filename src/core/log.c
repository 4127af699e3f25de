/* Levelled logging filtered by subsystem, configured from the environment once. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "src/core/core.h"

#define MF_LOG_SUBSYS_CAP 512

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static mf_log_level g_level = MF_LOG_INFO;
static char g_subsys[MF_LOG_SUBSYS_CAP]; /* ",io,config," or empty for all */
static FILE *g_stream;

static const char *const k_level_names[] = {"error", "warn", "info", "debug", "trace"};

/* A bad MF_LOG or MF_LOG_SUBSYS, written straight to the stream (mf_log would
 * configure again), once for each value. */
static void warn_env(const char *name, const char *value, const char *why) {
  static char warned[2][128];
  char *last = warned[strcmp(name, "MF_LOG") != 0];
  if (strncmp(last, value, sizeof warned[0] - 1) == 0) return;
  snprintf(last, sizeof warned[0], "%s", value);
  FILE *out = g_stream ? g_stream : stderr;
  fprintf(out, "[warn log] %s='%.80s%s' %s\n", name, value, strlen(value) > 80 ? "..." : "", why);
  fflush(out);
}

static void configure_from_env(void) {
  const char *lv = getenv("MF_LOG");
  g_level = MF_LOG_INFO;
  if (lv && *lv) {
    int found = 0;
    for (int i = 0; i <= MF_LOG_TRACE; i++)
      if (strcasecmp(lv, k_level_names[i]) == 0) g_level = (mf_log_level)i, found = 1;
    if (!found)
      warn_env("MF_LOG", lv, "is not a log level (error, warn, info, debug or trace): logging at info");
  }
  const char *ss = getenv("MF_LOG_SUBSYS");
  g_subsys[0] = 0;
  if (ss && *ss && strlen(ss) + 3 < sizeof g_subsys) snprintf(g_subsys, sizeof g_subsys, ",%s,", ss);
  if (ss && strlen(ss) + 3 >= sizeof g_subsys)
    warn_env("MF_LOG_SUBSYS", ss,
             "is too long (a comma-separated list of subsystems): logging every subsystem");
}

void mf_log_configure(void) {
  pthread_once(&g_once, configure_from_env);
  pthread_mutex_lock(&g_lock);
  configure_from_env();
  pthread_mutex_unlock(&g_lock);
}

void mf_log_set_level(mf_log_level level) {
  pthread_once(&g_once, configure_from_env);
  g_level = level;
}

void mf_log_set_stream(FILE *f) { g_stream = f; }

static int subsys_selected(const char *subsys) {
  if (!g_subsys[0] || !subsys) return 1;
  size_t n = strlen(subsys);
  for (const char *p = strstr(g_subsys, subsys); p; p = strstr(p + 1, subsys))
    if (p[-1] == ',' && p[n] == ',') return 1;
  return 0;
}

int mf_log_enabled(mf_log_level level, const char *subsys) {
  pthread_once(&g_once, configure_from_env);
  if (level > g_level) return 0;
  if (level >= MF_LOG_DEBUG) return subsys_selected(subsys);
  return 1;
}

void mf_log(mf_log_level level, const char *subsys, const char *fmt, ...) {
  if (!mf_log_enabled(level, subsys)) return;
  char line[2048];
  int n = 0;
  if (level == MF_LOG_INFO)
    n = 0;
  else
    n = snprintf(line, sizeof line, "[%s%s%s] ", k_level_names[level], subsys ? " " : "",
                 subsys ? subsys : "");
  if (n < 0) n = 0;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line + n, sizeof line - (size_t)n, fmt, ap);
  va_end(ap);
  mf_progress_clear(); /* a progress line on the terminal goes first */
  pthread_mutex_lock(&g_lock);
  FILE *out = g_stream ? g_stream : stderr;
  fputs(line, out);
  fputc('\n', out);
  fflush(out);
  pthread_mutex_unlock(&g_lock);
}
