/* Stop requests (core.h): one flag a signal handler may set. Only the store
 * of a volatile sig_atomic_t happens in the handler's context; the loops that
 * read it decide what stopping means (train: a checkpoint, then return). */
#include <signal.h>
#include <stdio.h>

#include "src/core/core.h"

static volatile sig_atomic_t g_stop_signal = 0;

void mf_stop_request(int signo) {
  if (!g_stop_signal) g_stop_signal = signo;
}

int mf_stop_requested(void) {
  return (int)g_stop_signal;
}

void mf_stop_clear(void) {
  g_stop_signal = 0;
}

const char *mf_stop_signal_name(int signo, char *buf, size_t cap) {
  if (signo == SIGINT) return "SIGINT";
  if (signo == SIGTERM) return "SIGTERM";
  if (signo == SIGUSR1) return "SIGUSR1";
  snprintf(buf, cap, "signal %d", signo);
  return buf;
}
