/* metrics.jsonl and the progress line (see metrics.h). */
#include "src/train/metrics.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

typedef long long ll;

#define METRICS_FILE "metrics.jsonl"
#define LINE_CAP 1024 /* one line is about 600 bytes */

struct mf_metrics {
  int fd; /* O_APPEND */
  char *path;
  char line[LINE_CAP];
};

void mf_step_metrics_init(mf_step_metrics *s) {
  memset(s, 0, sizeof *s);
  s->window_loss = s->window_aux_loss = NAN;
  s->eval_loss = s->eval_s = NAN;
  s->step_s = NAN;
  s->expert_imbalance = NAN;
  for (int k = 0; k < 3; k++) s->busy_s[k] = s->idle_s[k] = NAN;
  s->host_submit_s = NAN;
  s->h2d_bytes = s->d2h_bytes = s->peak_device_bytes = NAN;
  s->staging_fill_s = s->staging_drain_s = NAN;
  s->checkpoint_s = s->checkpoint_bytes = s->checkpoint_write_s = NAN;
}

/* ---------------------------------------------------------- formatting */

/* snprintf at buf[*n], counting what would have been written past cap. */
static void appendf(char *buf, size_t cap, size_t *n, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void appendf(char *buf, size_t cap, size_t *n, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int r = vsnprintf(*n < cap ? buf + *n : NULL, *n < cap ? cap - *n : 0, fmt, ap);
  va_end(ap);
  if (r > 0) *n += (size_t)r;
}

static void json_num(char *buf, size_t cap, size_t *n, const char *key, double v) {
  if (isfinite(v))
    appendf(buf, cap, n, ",\"%s\":%.9g", key, v);
  else
    appendf(buf, cap, n, ",\"%s\":null", key);
}

/* A count (bytes) kept in a double: every digit, so it reads back exactly. */
static void json_count(char *buf, size_t cap, size_t *n, const char *key, double v) {
  if (isfinite(v))
    appendf(buf, cap, n, ",\"%s\":%.17g", key, v);
  else
    appendf(buf, cap, n, ",\"%s\":null", key);
}

size_t mf_metrics_format_json(char *buf, size_t cap, const mf_step_metrics *s) {
  size_t n = 0;
  if (cap) buf[0] = 0;
  appendf(buf, cap, &n, "{\"step\":%lld", (ll)s->step);
  json_num(buf, cap, &n, "loss", s->loss);
  json_num(buf, cap, &n, "ce_loss", s->ce_loss);
  json_num(buf, cap, &n, "aux_loss", s->aux_loss);
  appendf(buf, cap, &n, ",\"window_steps\":%lld", (ll)s->window_steps);
  json_num(buf, cap, &n, "window_loss", s->window_loss);
  json_num(buf, cap, &n, "window_aux_loss", s->window_aux_loss);
  json_num(buf, cap, &n, "lr", s->lr);
  json_num(buf, cap, &n, "grad_norm", s->grad_norm);
  json_num(buf, cap, &n, "tokens_per_s", s->tokens_per_s);
  appendf(buf, cap, &n, ",\"tokens\":%lld", (ll)s->tokens);
  json_num(buf, cap, &n, "elapsed_s", s->elapsed_s);
  appendf(buf, cap, &n, ",\"skipped\":%s", s->skipped ? "true" : "false");
  json_num(buf, cap, &n, "eval_loss", s->eval_loss);
  json_num(buf, cap, &n, "eval_s", s->eval_s);
  json_num(buf, cap, &n, "step_s", s->step_s);
  json_num(buf, cap, &n, "expert_imbalance", s->expert_imbalance);
  static const char *const busy_keys[3] = {"compute_busy_s", "h2d_busy_s", "d2h_busy_s"};
  static const char *const idle_keys[3] = {"compute_idle_s", "h2d_idle_s", "d2h_idle_s"};
  for (int k = 0; k < 3; k++) json_num(buf, cap, &n, busy_keys[k], s->busy_s[k]);
  for (int k = 0; k < 3; k++) json_num(buf, cap, &n, idle_keys[k], s->idle_s[k]);
  json_num(buf, cap, &n, "host_submit_s", s->host_submit_s);
  json_count(buf, cap, &n, "h2d_bytes", s->h2d_bytes);
  json_count(buf, cap, &n, "d2h_bytes", s->d2h_bytes);
  json_count(buf, cap, &n, "peak_device_bytes", s->peak_device_bytes);
  json_num(buf, cap, &n, "optimizer_hidden_s", s->optimizer_hidden_s);
  json_num(buf, cap, &n, "optimizer_exposed_s", s->optimizer_exposed_s);
  json_num(buf, cap, &n, "staging_fill_s", s->staging_fill_s);
  json_num(buf, cap, &n, "staging_drain_s", s->staging_drain_s);
  json_num(buf, cap, &n, "checkpoint_s", s->checkpoint_s);
  json_count(buf, cap, &n, "checkpoint_bytes", s->checkpoint_bytes);
  json_num(buf, cap, &n, "checkpoint_write_s", s->checkpoint_write_s);
  appendf(buf, cap, &n, "}");
  return n;
}

/* mf_format_bytes of a byte count kept in a double; "-" when unknown. */
static const char *format_bytes(char *buf, size_t cap, double v) {
  if (!isfinite(v) || v < 0)
    snprintf(buf, cap, "-");
  else
    mf_format_bytes(v < 18446744073709549568.0 ? (uint64_t)v : UINT64_MAX, buf, cap);
  return buf;
}

/* "45s", "1m32s", "2h05m"; "?" when unknown. */
static void format_duration(char *buf, size_t cap, double seconds) {
  if (!isfinite(seconds) || seconds < 0) {
    snprintf(buf, cap, "?");
    return;
  }
  ll t = (ll)(fmin(seconds, 1e9) + 0.5);
  if (t < 60)
    snprintf(buf, cap, "%llds", t);
  else if (t < 3600)
    snprintf(buf, cap, "%lldm%02llds", t / 60, t % 60);
  else
    snprintf(buf, cap, "%lldh%02lldm", t / 3600, (t % 3600) / 60);
}

/* The ETA of `left` more units at `per_unit` seconds each, or "?". */
static void format_eta(char *buf, size_t cap, double left, double per_unit) {
  format_duration(buf, cap, left <= 0 ? 0.0 : left * per_unit);
}

/* The stream figures of a verbose line (metrics.h). */
static void progress_streams(char *buf, size_t cap, size_t *n, const mf_step_metrics *s) {
  if (isfinite(s->busy_s[0]) && isfinite(s->step_s) && s->step_s > 0) {
    static const char *const names[3] = {"c", "up", "dn"};
    appendf(buf, cap, n, "  busy");
    for (int k = 0; k < 3; k++)
      appendf(buf, cap, n, " %s %.0f%%", names[k],
              isfinite(s->busy_s[k]) ? 100.0 * s->busy_s[k] / s->step_s : 0.0);
    /* The host's share submitting the work: near 100%, it sets the pace. */
    if (isfinite(s->host_submit_s))
      appendf(buf, cap, n, " host %.0f%%", 100.0 * s->host_submit_s / s->step_s);
  }
  if (isfinite(s->h2d_bytes) || isfinite(s->d2h_bytes)) {
    char up[32], dn[32];
    appendf(buf, cap, n, "  io %s/%s", format_bytes(up, sizeof up, s->h2d_bytes),
            format_bytes(dn, sizeof dn, s->d2h_bytes));
  }
  if (isfinite(s->peak_device_bytes)) {
    char pk[32];
    appendf(buf, cap, n, "  peak %s", format_bytes(pk, sizeof pk, s->peak_device_bytes));
  }
  if (s->optimizer_hidden_s > 0 || s->optimizer_exposed_s > 0)
    appendf(buf, cap, n, "  opt hidden %.1fms exposed %.1fms", s->optimizer_hidden_s * 1e3,
            s->optimizer_exposed_s * 1e3);
  if (isfinite(s->staging_fill_s) && isfinite(s->staging_drain_s) && isfinite(s->step_s) && s->step_s > 0)
    appendf(buf, cap, n, "  staging in %.0f%% out %.0f%%", 100.0 * s->staging_fill_s / s->step_s,
            100.0 * s->staging_drain_s / s->step_s);
}

size_t mf_progress_format(char *buf, size_t cap, const mf_step_metrics *s, int64_t total_steps, int verbose) {
  size_t n = 0;
  if (cap) buf[0] = 0;
  if (total_steps > 0) {
    int width = snprintf(NULL, 0, "%lld", (ll)total_steps);
    appendf(buf, cap, &n, "step  %*lld/%lld", width, (ll)s->step, (ll)total_steps);
  } else {
    appendf(buf, cap, &n, "step %lld", (ll)s->step);
  }
  const int window = s->window_steps > 0;
  appendf(buf, cap, &n, "  loss %.4f", window ? s->window_loss : s->loss);
  if (verbose) appendf(buf, cap, &n, "  aux %.4f", window ? s->window_aux_loss : s->aux_loss);
  if (s->window_steps > 1) appendf(buf, cap, &n, " (mean of %lld steps)", (ll)s->window_steps);
  if (isfinite(s->eval_loss)) appendf(buf, cap, &n, "  eval %.4f", s->eval_loss);
  char rate[32];
  mf_format_count(isfinite(s->tokens_per_s) && s->tokens_per_s >= 0 ? s->tokens_per_s : NAN, rate, sizeof rate);
  appendf(buf, cap, &n, "  lr %.2e", s->lr);
  if (verbose) appendf(buf, cap, &n, "  |g| %.3g", s->grad_norm);
  appendf(buf, cap, &n, "  %s tok/s", rate);
  if (total_steps > 0) {
    double per_step = NAN;
    if (isfinite(s->step_s) && s->step_s > 0)
      per_step = s->step_s;
    else if (s->step > 0)
      per_step = s->elapsed_s / (double)s->step;
    char eta[32];
    format_eta(eta, sizeof eta, (double)(total_steps - s->step), per_step);
    appendf(buf, cap, &n, "  eta %s", eta);
  }
  if (verbose) progress_streams(buf, cap, &n, s);
  if (s->skipped) appendf(buf, cap, &n, "  SKIPPED (non-finite gradients)");
  return n;
}

size_t mf_eval_progress_format(char *buf, size_t cap, const char *what, uint64_t done, uint64_t total,
                               double elapsed_s) {
  size_t n = 0;
  if (cap) buf[0] = 0;
  char t[32], eta[32];
  format_duration(t, sizeof t, elapsed_s);
  appendf(buf, cap, &n, "eval %s: %llu/%llu windows (%.0f%%), %s", what, (unsigned long long)done,
          (unsigned long long)total, total ? 100.0 * (double)done / (double)total : 100.0, t);
  if (done > 0 && done < total) {
    format_eta(eta, sizeof eta, (double)(total - done), elapsed_s / (double)done);
    appendf(buf, cap, &n, ", eta %s", eta);
  }
  return n;
}

/* ------------------------------------------------------------------ file */

/* mkdir -p. */
static mf_status make_dirs(const char *dir) {
  char *p = mf_strdup(dir);
  if (!p) return MF_ERR(MF_ERR_OUT_OF_MEMORY, "out of memory copying %s", dir);
  mf_status st = MF_OK;
  size_t len = strlen(p);
  for (size_t i = 1; i <= len && st == MF_OK; i++) {
    if (p[i] != '/' && p[i] != 0) continue;
    char c = p[i];
    p[i] = 0;
    if (mkdir(p, 0777) != 0 && errno != EEXIST)
      st = MF_ERR(MF_ERR_IO, "%s: cannot create the directory %s: %s", dir, p, strerror(errno));
    p[i] = c;
  }
  free(p);
  struct stat sb;
  if (st == MF_OK && (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode)))
    st = MF_ERR(MF_ERR_IO, "%s: not a directory", dir);
  return st;
}

static mf_status write_all(int fd, const char *path, const char *p, size_t n) {
  while (n) {
    ssize_t w = write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0)
      return MF_ERR(MF_ERR_IO, "%s: write failed: %s", path, w < 0 ? strerror(errno) : "no progress");
    p += w;
    n -= (size_t)w;
  }
  return MF_OK;
}

/* A crash mid-write leaves a last line without its newline; cut it so the next
 * line starts on a line of its own and every line parses. */
static mf_status drop_partial_line(mf_metrics *m) {
  struct stat sb;
  if (fstat(m->fd, &sb) != 0) return MF_ERR(MF_ERR_IO, "%s: fstat failed: %s", m->path, strerror(errno));
  off_t end = sb.st_size;
  char buf[4096];
  for (off_t pos = end; pos > 0;) {
    size_t want = pos < (off_t)sizeof buf ? (size_t)pos : sizeof buf;
    ssize_t r = pread(m->fd, buf, want, pos - (off_t)want);
    if (r != (ssize_t)want) return MF_ERR(MF_ERR_IO, "%s: read failed: %s", m->path, strerror(errno));
    size_t i = want;
    while (i > 0 && buf[i - 1] != '\n') i--;
    if (i > 0 || pos == (off_t)want) {
      off_t keep = pos - (off_t)want + (off_t)i;
      if (keep == end) return MF_OK;
      MF_LOGW("exec", "%s: dropping a half-written last line (%lld bytes)", m->path, (ll)(end - keep));
      if (ftruncate(m->fd, keep) != 0)
        return MF_ERR(MF_ERR_IO, "%s: ftruncate failed: %s", m->path, strerror(errno));
      return MF_OK;
    }
    pos -= (off_t)want;
  }
  return MF_OK;
}

static mf_status open_file(mf_metrics *m, int truncate) {
  m->fd = open(m->path, O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC | (truncate ? O_TRUNC : 0), 0666);
  if (m->fd < 0) return MF_ERR(MF_ERR_IO, "%s: cannot open: %s", m->path, strerror(errno));
  return MF_OK;
}

mf_status mf_metrics_open(const char *dir, int resume, mf_metrics **out) {
  if (!out) return MF_ERR(MF_ERR_INVALID_ARG, "mf_metrics_open: out is NULL");
  *out = NULL;
  if (!dir || !*dir) return MF_ERR(MF_ERR_INVALID_ARG, "mf_metrics_open: no directory given");
  MF_CHECK(make_dirs(dir));
  void *mem = NULL;
  MF_CHECK(mf_calloc(1, sizeof(mf_metrics), "metrics", &mem));
  mf_metrics *m = mem;
  m->fd = -1;
  mf_status st = MF_OK;
  size_t len = strlen(dir) + 1 + sizeof METRICS_FILE;
  MF_CHECK_GOTO(mf_malloc(len, "metrics path", &mem), st, fail);
  m->path = mem;
  snprintf(m->path, len, "%s/%s", dir, METRICS_FILE);
  MF_CHECK_GOTO(open_file(m, !resume), st, fail);
  if (resume) MF_CHECK_GOTO(drop_partial_line(m), st, fail);
  *out = m;
  return MF_OK;
fail:
  mf_metrics_close(m);
  return st;
}

mf_status mf_metrics_write(mf_metrics *m, const mf_step_metrics *s) {
  size_t n = mf_metrics_format_json(m->line, sizeof m->line - 1, s);
  if (n >= sizeof m->line - 1)
    return MF_ERR(MF_ERR_INTERNAL, "%s: a metrics line of %zu bytes does not fit %d", m->path, n, LINE_CAP);
  m->line[n++] = '\n';
  return write_all(m->fd, m->path, m->line, n); /* one write(2): no stdio buffer to lose */
}

mf_status mf_metrics_write_resume(mf_metrics *m, const char *dir, int64_t step) {
  size_t n = 0;
  const size_t cap = sizeof m->line - 1;
  appendf(m->line, cap, &n, "{\"resumed_from\":\"");
  for (const unsigned char *p = (const unsigned char *)dir; *p && n + 8 < cap; p++) {
    if (*p == '"' || *p == '\\')
      appendf(m->line, cap, &n, "\\%c", *p);
    else if (*p < 0x20)
      appendf(m->line, cap, &n, "\\u%04x", *p);
    else
      m->line[n++] = (char)*p;
  }
  appendf(m->line, cap, &n, "\",\"resume_step\":%lld}", (ll)step);
  if (n >= cap) return MF_ERR(MF_ERR_INTERNAL, "%s: the resume line does not fit %d bytes", m->path, LINE_CAP);
  m->line[n++] = '\n';
  return write_all(m->fd, m->path, m->line, n);
}

/* The step of a line this module wrote, or -1 for any other line. */
static int64_t line_step(const char *line) {
  static const char prefix[] = "{\"step\":";
  if (strncmp(line, prefix, sizeof prefix - 1) != 0) return -1;
  char *end;
  errno = 0;
  long long v = strtoll(line + sizeof prefix - 1, &end, 10);
  if (errno || end == line + sizeof prefix - 1 || *end != ',' || v < 0) return -1;
  return v;
}

/* Keeps the lines of step <= `step` (and foreign ones) and replaces the file
 * atomically: written beside it, fsynced, renamed over it, then reopened. */
mf_status mf_metrics_rewind(mf_metrics *m, int64_t step) {
  mf_status st = MF_OK;
  char *text = NULL, *tmp = NULL;
  int tfd = -1;
  struct stat sb;
  if (fstat(m->fd, &sb) != 0) return MF_ERR(MF_ERR_IO, "%s: fstat failed: %s", m->path, strerror(errno));
  size_t size = (size_t)sb.st_size;
  void *mem = NULL;
  MF_CHECK(mf_malloc(size + 1, "metrics file", &mem));
  text = mem;
  for (size_t got = 0; got < size;) {
    ssize_t r = pread(m->fd, text + got, size - got, (off_t)got);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      st = MF_ERR(MF_ERR_IO, "%s: read failed: %s", m->path, r < 0 ? strerror(errno) : "file shrank");
      goto done;
    }
    got += (size_t)r;
  }
  text[size] = 0;

  /* Compact in place: the kept lines move towards the start. */
  size_t kept = 0;
  for (size_t i = 0; i < size;) {
    char *nl = memchr(text + i, '\n', size - i);
    size_t end = nl ? (size_t)(nl - text) + 1 : size;
    int64_t s = line_step(text + i);
    if (s < 0 || s <= step) {
      memmove(text + kept, text + i, end - i);
      kept += end - i;
    }
    i = end;
  }
  if (kept == size) goto done;

  size_t tlen = strlen(m->path) + 5;
  MF_CHECK_GOTO(mf_malloc(tlen, "metrics path", &mem), st, done);
  tmp = mem;
  snprintf(tmp, tlen, "%s.tmp", m->path);
  tfd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
  if (tfd < 0) {
    st = MF_ERR(MF_ERR_IO, "%s: cannot create: %s", tmp, strerror(errno));
    goto done;
  }
  MF_CHECK_GOTO(write_all(tfd, tmp, text, kept), st, done);
  if (fsync(tfd) != 0 || close(tfd) != 0) {
    tfd = -1;
    st = MF_ERR(MF_ERR_IO, "%s: fsync/close failed: %s", tmp, strerror(errno));
    goto done;
  }
  tfd = -1;
  if (rename(tmp, m->path) != 0) {
    st = MF_ERR(MF_ERR_IO, "%s: rename to %s failed: %s", tmp, m->path, strerror(errno));
    goto done;
  }
  MF_LOGI("exec", "%s: dropped %zu bytes of steps after %lld (resumed run)", m->path, size - kept, (ll)step);
  close(m->fd);
  MF_CHECK_GOTO(open_file(m, 0), st, done);

done:
  if (tfd >= 0) close(tfd);
  if (tmp && st != MF_OK) unlink(tmp);
  free(tmp);
  free(text);
  return st;
}

const char *mf_metrics_path(const mf_metrics *m) {
  return m->path;
}

void mf_metrics_close(mf_metrics *m) {
  if (!m) return;
  if (m->fd >= 0) close(m->fd);
  free(m->path);
  free(m);
}

/* ---------------------------------------------------------------- reading */

/* The keys of a step line that hold a double, and where it goes. */
static const struct {
  const char *key;
  size_t off;
} k_doubles[] = {
    {"loss", offsetof(mf_step_metrics, loss)},
    {"ce_loss", offsetof(mf_step_metrics, ce_loss)},
    {"aux_loss", offsetof(mf_step_metrics, aux_loss)},
    {"window_loss", offsetof(mf_step_metrics, window_loss)},
    {"window_aux_loss", offsetof(mf_step_metrics, window_aux_loss)},
    {"lr", offsetof(mf_step_metrics, lr)},
    {"grad_norm", offsetof(mf_step_metrics, grad_norm)},
    {"tokens_per_s", offsetof(mf_step_metrics, tokens_per_s)},
    {"elapsed_s", offsetof(mf_step_metrics, elapsed_s)},
    {"eval_loss", offsetof(mf_step_metrics, eval_loss)},
    {"eval_s", offsetof(mf_step_metrics, eval_s)},
    {"step_s", offsetof(mf_step_metrics, step_s)},
    {"expert_imbalance", offsetof(mf_step_metrics, expert_imbalance)},
    {"compute_busy_s", offsetof(mf_step_metrics, busy_s[0])},
    {"h2d_busy_s", offsetof(mf_step_metrics, busy_s[1])},
    {"d2h_busy_s", offsetof(mf_step_metrics, busy_s[2])},
    {"compute_idle_s", offsetof(mf_step_metrics, idle_s[0])},
    {"h2d_idle_s", offsetof(mf_step_metrics, idle_s[1])},
    {"d2h_idle_s", offsetof(mf_step_metrics, idle_s[2])},
    {"host_submit_s", offsetof(mf_step_metrics, host_submit_s)},
    {"h2d_bytes", offsetof(mf_step_metrics, h2d_bytes)},
    {"d2h_bytes", offsetof(mf_step_metrics, d2h_bytes)},
    {"peak_device_bytes", offsetof(mf_step_metrics, peak_device_bytes)},
    {"optimizer_hidden_s", offsetof(mf_step_metrics, optimizer_hidden_s)},
    {"optimizer_exposed_s", offsetof(mf_step_metrics, optimizer_exposed_s)},
    {"staging_fill_s", offsetof(mf_step_metrics, staging_fill_s)},
    {"staging_drain_s", offsetof(mf_step_metrics, staging_drain_s)},
    {"checkpoint_s", offsetof(mf_step_metrics, checkpoint_s)},
    {"checkpoint_bytes", offsetof(mf_step_metrics, checkpoint_bytes)},
    {"checkpoint_write_s", offsetof(mf_step_metrics, checkpoint_write_s)},
};

static int64_t json_int(const json_t *v, int64_t dflt) {
  return json_is_integer(v)  ? (int64_t)json_integer_value(v)
         : json_is_number(v) ? (int64_t)json_number_value(v)
                             : dflt;
}

/* A step line into *s; 0 when o is not one (no integer "step" >= 0). */
static int parse_step(const json_t *o, mf_step_metrics *s) {
  const json_t *step = json_object_get(o, "step");
  if (!json_is_integer(step) || json_integer_value(step) < 0) return 0;
  mf_step_metrics_init(s);
  s->step = (int64_t)json_integer_value(step);
  s->window_steps = json_int(json_object_get(o, "window_steps"), 0);
  s->tokens = json_int(json_object_get(o, "tokens"), 0);
  s->skipped = json_is_true(json_object_get(o, "skipped"));
  for (size_t k = 0; k < sizeof k_doubles / sizeof k_doubles[0]; k++) {
    const json_t *v = json_object_get(o, k_doubles[k].key);
    if (json_is_number(v)) *(double *)((char *)s + k_doubles[k].off) = json_number_value(v);
  }
  return 1;
}

/* Room for one more element of `size` bytes in *arr (n used, *cap held). */
static mf_status grow(void **arr, size_t n, size_t *cap, size_t size) {
  if (n < *cap) return MF_OK;
  const size_t want = *cap ? *cap * 2 : 64;
  void *p = realloc(*arr, want * size);
  if (!p) return MF_ERR(MF_ERR_OUT_OF_MEMORY, "out of memory reading metrics (%zu lines)", n);
  *arr = p;
  *cap = want;
  return MF_OK;
}

/* One line of the file into the log (a line that is not this format is counted). */
static mf_status read_line(mf_metrics_log *log, const char *line, size_t len, size_t lineno,
                           size_t *cap_lines, size_t *cap_resumes) {
  json_t *o = json_loadb(line, len, 0, NULL);
  mf_status st = MF_OK;
  mf_step_metrics s;
  const json_t *from = json_object_get(o, "resumed_from"), *at = json_object_get(o, "resume_step");
  if (json_is_object(o) && json_is_string(from) && json_is_integer(at)) {
    const int64_t step = (int64_t)json_integer_value(at);
    while (log->n > 0 && log->lines[log->n - 1].step > step) log->n--; /* the steps the run repeated */
    MF_CHECK_GOTO(grow((void **)&log->resumes, log->n_resumes, cap_resumes, sizeof *log->resumes), st, done);
    char *dir = mf_strdup(json_string_value(from));
    if (!dir) {
      st = MF_ERR(MF_ERR_OUT_OF_MEMORY, "out of memory reading metrics");
      goto done;
    }
    log->resumes[log->n_resumes++] = (mf_metrics_resume){step, dir};
  } else if (json_is_object(o) && parse_step(o, &s)) {
    while (log->n > 0 && log->lines[log->n - 1].step >= s.step)
      log->n--; /* written again: the later counts */
    MF_CHECK_GOTO(grow((void **)&log->lines, log->n, cap_lines, sizeof *log->lines), st, done);
    log->lines[log->n++] = s;
  } else {
    if (!log->unread) log->first_unread = lineno;
    log->unread++;
  }
done:
  json_decref(o);
  return st;
}

mf_status mf_metrics_read(const char *path, mf_metrics_log *out) {
  memset(out, 0, sizeof *out);
  char *text = NULL;
  size_t len = 0;
  MF_CHECK(mf_read_file(path, (size_t)1 << 34, "a metrics file", &text, &len));
  size_t cap_lines = 0, cap_resumes = 0, lineno = 0;
  mf_status st = MF_OK;
  for (size_t i = 0; i < len && st == MF_OK;) {
    const char *nl = memchr(text + i, '\n', len - i);
    const size_t end = nl ? (size_t)(nl - text) : len;
    lineno++;
    size_t a = i, b = end;
    while (a < b && (text[a] == ' ' || text[a] == '\t' || text[a] == '\r')) a++;
    while (b > a && (text[b - 1] == ' ' || text[b - 1] == '\t' || text[b - 1] == '\r')) b--;
    if (b > a) st = read_line(out, text + a, b - a, lineno, &cap_lines, &cap_resumes);
    i = end + 1;
  }
  free(text);
  return st;
}

void mf_metrics_log_free(mf_metrics_log *log) {
  if (!log) return;
  for (size_t i = 0; i < log->n_resumes; i++) free(log->resumes[i].from);
  free(log->resumes);
  free(log->lines);
  memset(log, 0, sizeof *log);
}
