/* Levelled logging filtered by subsystem, configured from the environment once. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "src/core/core.h"
#include "src/core/env.h"

#define MF_LOG_SUBSYS_CAP 512

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static mf_log_level g_level = MF_LOG_INFO;
static char g_subsys[MF_LOG_SUBSYS_CAP]; /* ",io,config," or empty for all */
static FILE *g_stream;

static const char *const k_level_names[] = {"error", "warn", "info", "debug", "trace"};

/* From the environment table (src/core/env.h), which warns about a bad value:
 * read unreported, as the table's report logs. */
static void configure_from_env(void) {
  const char *lv = mf_env_string_unreported(MF_ENV_LOG);
  g_level = MF_LOG_INFO;
  for (int i = 0; lv && i <= MF_LOG_TRACE; i++)
    if (strcasecmp(lv, k_level_names[i]) == 0) g_level = (mf_log_level)i;
  const char *ss = mf_env_string_unreported(MF_ENV_LOG_SUBSYS);
  g_subsys[0] = 0;
  if (ss) snprintf(g_subsys, sizeof g_subsys, ",%s,", ss);
}

void mf_log_configure(void) {
  pthread_once(&g_once, configure_from_env);
  pthread_mutex_lock(&g_lock);
  configure_from_env();
  pthread_mutex_unlock(&g_lock);
  (void)mf_env_string(MF_ENV_LOG); /* the table's report, now that logging is configured */
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
