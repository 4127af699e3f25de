/* Shared pieces of the subcommands: error reporting and help detection. */
#include <stdarg.h>
#include <string.h>

#include "src/cli/commands.h"

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

int mf_cli_wants_help(int argc, char **argv) {
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--") == 0) break;
    if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) return 1;
  }
  return 0;
}
