/* Status names and the per-thread last error with its trace. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "src/core/core.h"

#define MF_ERR_MSG_CAP 2048
#define MF_ERR_TRACE_CAP 4096

static _Thread_local char g_msg[MF_ERR_MSG_CAP];
static _Thread_local char g_trace[MF_ERR_TRACE_CAP];

static const char *const k_status_names[MF_STATUS_COUNT_] = {
    [MF_OK] = "ok",
    [MF_ERR_INVALID_ARG] = "invalid argument",
    [MF_ERR_IO] = "i/o error",
    [MF_ERR_FORMAT] = "malformed input",
    [MF_ERR_CONFIG] = "config error",
    [MF_ERR_OUT_OF_MEMORY] = "out of memory",
    [MF_ERR_UNSUPPORTED] = "unsupported",
    [MF_ERR_NOT_IMPLEMENTED] = "not implemented yet",
    [MF_ERR_NO_DEVICE] = "no GPU",
    [MF_ERR_CUDA] = "CUDA error",
    [MF_ERR_CUBLAS] = "cuBLAS error",
    [MF_ERR_NCCL] = "NCCL error",
    [MF_ERR_MPI] = "MPI error",
    [MF_ERR_INTERNAL] = "internal error",
};

const char *mf_status_name(mf_status s) {
  if ((int)s < 0 || s >= MF_STATUS_COUNT_) return "unknown status";
  return k_status_names[s];
}

mf_status mf_error_set(mf_status s, const char *file, int line, const char *fmt, ...) {
  /* Formatted apart first: an argument may be mf_last_error() itself (a
   * message that wraps the one before it), which vsnprintf must not write
   * over while it reads it. */
  char msg[MF_ERR_MSG_CAP];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  memcpy(g_msg, msg, sizeof g_msg);
  snprintf(g_trace, sizeof g_trace, "%s:%d: %s\n", file, line, mf_status_name(s));
  mf_log(MF_LOG_DEBUG, "error", "%s:%d: %s", file, line, g_msg);
  return s;
}

void mf_error_prefix(const char *fmt, ...) {
  char head[MF_ERR_MSG_CAP];
  char old[MF_ERR_MSG_CAP];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(head, sizeof head, fmt, ap);
  va_end(ap);
  memcpy(old, g_msg, sizeof old);
  snprintf(g_msg, sizeof g_msg, "%s: %s", head, old);
}

void mf_error_trace(const char *file, int line, const char *expr) {
  size_t len = strlen(g_trace);
  if (len + 1 >= sizeof g_trace) return;
  snprintf(g_trace + len, sizeof g_trace - len, "%s:%d: %s\n", file, line, expr);
}

const char *mf_last_error(void) { return g_msg[0] ? g_msg : "no error recorded"; }

const char *mf_last_error_trace(void) { return g_trace; }

void mf_error_clear(void) {
  g_msg[0] = 0;
  g_trace[0] = 0;
}

void mf_assert_fail(const char *file, int line, const char *expr) {
  fprintf(stderr, "moefit: internal error at %s:%d: assertion `%s` failed\n", file, line, expr);
  fflush(stderr);
  abort();
}
