/* Shared pieces of the subcommands: error reporting, help detection, stop signals. */
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "src/cli/commands.h"
#include "src/model/hf_config.h"
#include "src/train/train.h"

int mf_cli_fail(const char *cmd, mf_status s) {
  fprintf(stderr, "moefit %s: error: %s\n", cmd, mf_last_error());
  if (mf_log_enabled(MF_LOG_DEBUG, "cli")) fprintf(stderr, "trace (%s):\n%s", mf_status_name(s), mf_last_error_trace());
  return MF_EXIT_FAIL;
}

int mf_cli_usage_error(const char *cmd, const char *fmt, ...) {
  va_list ap;
  fprintf(stderr, "moefit %s: ", cmd);
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fprintf(stderr, "\nrun `moefit %s --help` for usage\n", cmd);
  return MF_EXIT_USAGE;
}

/* The stop signal when its sender was this process's parent (SI_USER from
 * getppid(): under mpirun, Open MPI's launcher), else 0. */
static volatile sig_atomic_t g_stop_by_parent;

/* Async-signal-safe: stores, or _exit. A checkpoint being written when the
 * second signal comes stays a .tmp directory that resume passes over. */
static void on_stop_signal(int signo, siginfo_t *si, void *uc) {
  (void)uc;
  if (mf_stop_requested()) _exit(128 + signo);
  if (si && si->si_code == SI_USER && si->si_pid == getppid()) g_stop_by_parent = signo;
  mf_stop_request(signo);
}

void mf_cli_catch_stop(void) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART | SA_SIGINFO; /* a write or read under way goes on: the loop stops at its next check */
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
  sigaction(SIGUSR1, &sa, NULL);
}

int mf_cli_stop_by_parent(void) { return g_stop_by_parent; }

int mf_cli_wants_help(int argc, char **argv) {
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--") == 0) break;
    if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) return 1;
  }
  return 0;
}

/* See commands.h. */
char **mf_cli_split_options(int *argc, char **argv) {
  char **out = malloc(sizeof *out * (size_t)(2 * *argc + 1));
  if (!out) return NULL;
  int n = 0, options = 1;
  for (int i = 0; i < *argc; i++) {
    char *a = argv[i], *eq = strchr(a, '=');
    if (options && strcmp(a, "--") == 0) options = 0;
    if (options && i > 0 && strncmp(a, "--", 2) == 0 && a[2] && eq && eq > a + 2) {
      *eq = '\0'; /* argv's strings are ours to change (C11 5.1.2.2.1) */
      out[n++] = a;
      out[n++] = eq + 1;
    } else {
      out[n++] = a;
    }
  }
  out[n] = NULL;
  *argc = n;
  return out;
}

