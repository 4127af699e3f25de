/* Allocation wrappers, byte sizes and counts for people, the clock. */
#include <ctype.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "src/core/core.h"

mf_status mf_malloc(size_t size, const char *what, void **out) {
  *out = malloc(size ? size : 1);
  if (!*out) {
    char buf[32];
    return MF_ERR(MF_ERR_OUT_OF_MEMORY, "out of host memory allocating %s for %s",
                  mf_format_bytes(size, buf, sizeof buf), what ? what : "a buffer");
  }
  return MF_OK;
}

mf_status mf_calloc(size_t count, size_t size, const char *what, void **out) {
  size_t total;
  *out = NULL;
  if (!mf_mul_size(count, size, &total))
    return MF_ERR(MF_ERR_OUT_OF_MEMORY, "size overflow allocating %zu x %zu bytes for %s", count, size,
                  what ? what : "a buffer");
  *out = calloc(count ? count : 1, size ? size : 1);
  if (!*out) {
    char buf[32];
    return MF_ERR(MF_ERR_OUT_OF_MEMORY, "out of host memory allocating %s for %s",
                  mf_format_bytes(total, buf, sizeof buf), what ? what : "a buffer");
  }
  return MF_OK;
}

char *mf_strdup(const char *s) {
  if (!s) return NULL;
  size_t n = strlen(s) + 1;
  char *d = (char *)malloc(n);
  if (d) memcpy(d, s, n);
  return d;
}

int mf_parse_size(const char *s, uint64_t *out) {
  if (!s) return -1;
  while (isspace((unsigned char)*s)) s++;
  if (!isdigit((unsigned char)*s) && *s != '.') return -1;
  char *end = NULL;
  double v = strtod(s, &end);
  if (end == s || !(v >= 0) || isinf(v)) return -1;
  while (isspace((unsigned char)*end)) end++;
  static const struct {
    const char *unit;
    double mult;
  } units[] = {
      {"", 1.0},          {"B", 1.0},           {"K", 1024.0},       {"KiB", 1024.0},
      {"M", 1048576.0},   {"MiB", 1048576.0},   {"G", 1073741824.0}, {"GiB", 1073741824.0},
      {"T", 1099511627776.0}, {"TiB", 1099511627776.0}, {"KB", 1e3}, {"MB", 1e6},
      {"GB", 1e9},        {"TB", 1e12},         {"k", 1024.0},       {"kB", 1e3},
  };
  size_t ulen = strlen(end);
  while (ulen > 0 && isspace((unsigned char)end[ulen - 1])) ulen--;
  for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
    if (strlen(units[i].unit) == ulen && strncmp(end, units[i].unit, ulen) == 0) {
      double bytes = v * units[i].mult;
      if (bytes >= 18446744073709551615.0) return -1;
      /* "4.1GB" is 4100000000 bytes even though 4.1 * 1e9 is not exact in binary:
       * accept what rounds to a whole byte within the product's rounding error,
       * reject real fractions of a byte ("0.5"). */
      double whole = nearbyint(bytes);
      if (fabs(bytes - whole) > 1e-9 * (whole > 1.0 ? whole : 1.0)) return -1;
      *out = (uint64_t)whole;
      return 0;
    }
  }
  return -1;
}

/* v scaled by `base` until it prints as at most "999.5" (so rounding never
 * shows "1024.00 KiB" or "1e+03K"); *unit gets how many times, up to max_unit. */
static double scale_to_unit(double v, double base, double below, int max_unit, int *unit) {
  int u = 0;
  while (fabs(v) >= below && u < max_unit) {
    v /= base;
    u++;
  }
  *unit = u;
  return v;
}

const char *mf_format_bytes(uint64_t bytes, char *buf, size_t cap) {
  static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  int u = 0;
  const double v = scale_to_unit((double)bytes, 1024.0, 1023.995, 6, &u); /* %.2f of 1023.995 is 1024.00 */
  if (u == 0)
    snprintf(buf, cap, "%llu B", (unsigned long long)bytes);
  else
    snprintf(buf, cap, "%.2f %s", v, units[u]);
  return buf;
}

const char *mf_format_count(double n, char *buf, size_t cap) {
  static const char *const units[] = {"", "K", "M", "B", "T"};
  if (!isfinite(n)) {
    snprintf(buf, cap, "-");
    return buf;
  }
  int u = 0;
  const double v = scale_to_unit(n, 1000.0, 999.5, 4, &u);
  const double a = fabs(v);
  /* Three significant digits, the thresholds where %.Nf would round up a digit. */
  if (u == 0 || a >= 99.95)
    snprintf(buf, cap, "%.0f%s", v, units[u]);
  else if (a >= 9.995)
    snprintf(buf, cap, "%.1f%s", v, units[u]);
  else
    snprintf(buf, cap, "%.2f%s", v, units[u]);
  return buf;
}

double mf_time_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Strict UTF-8: no overlong forms, no surrogates, nothing past U+10FFFF. */
size_t mf_utf8_invalid_at(const void *text, size_t len) {
  const unsigned char *s = (const unsigned char *)text;
  size_t i = 0;
  while (i < len) {
    unsigned c = s[i];
    size_t n;
    unsigned cp;
    if (c < 0x80) {
      i++;
      continue;
    } else if ((c & 0xe0) == 0xc0) {
      n = 1, cp = c & 0x1f;
    } else if ((c & 0xf0) == 0xe0) {
      n = 2, cp = c & 0x0f;
    } else if ((c & 0xf8) == 0xf0) {
      n = 3, cp = c & 0x07;
    } else {
      return i;
    }
    for (size_t k = 1; k <= n; k++) {
      if (i + k >= len || (s[i + k] & 0xc0) != 0x80) return i;
      cp = (cp << 6) | (s[i + k] & 0x3f);
    }
    static const unsigned min_cp[4] = {0, 0x80, 0x800, 0x10000};
    if (cp < min_cp[n] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return i;
    i += n + 1;
  }
  return len;
}
