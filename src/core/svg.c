/* The SVG text buffer (svg.h). */
#include "src/core/svg.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

static int reserve(mf_svg *b, size_t more) {
  if (b->oom) return 0;
  if (b->n + more + 1 <= b->cap) return 1;
  size_t cap = b->cap ? b->cap : 1 << 16;
  while (cap < b->n + more + 1) cap *= 2;
  char *q = (char *)realloc(b->p, cap);
  if (!q) {
    b->oom = 1;
    return 0;
  }
  b->p = q, b->cap = cap;
  return 1;
}

void mf_svg_printf(mf_svg *b, const char *fmt, ...) {
  va_list ap, ap2;
  va_start(ap, fmt);
  va_copy(ap2, ap);
  const int need = vsnprintf(NULL, 0, fmt, ap);
  va_end(ap);
  if (need > 0 && reserve(b, (size_t)need)) {
    vsnprintf(b->p + b->n, (size_t)need + 1, fmt, ap2);
    b->n += (size_t)need;
  }
  va_end(ap2);
}

void mf_svg_escape(mf_svg *b, const char *s) {
  for (; s && *s; s++) {
    switch (*s) {
      case '&':
        mf_svg_printf(b, "&amp;");
        break;
      case '<':
        mf_svg_printf(b, "&lt;");
        break;
      case '>':
        mf_svg_printf(b, "&gt;");
        break;
      case '"':
        mf_svg_printf(b, "&quot;");
        break;
      case '\'':
        mf_svg_printf(b, "&apos;");
        break;
      default:
        if ((unsigned char)*s < 0x20 && *s != '\t' && *s != '\n')
          mf_svg_printf(b, "?");
        else if (reserve(b, 1))
          b->p[b->n++] = *s, b->p[b->n] = 0;
    }
  }
}

double mf_svg_nice_step(double range, int n) {
  if (!(range > 0) || !isfinite(range)) return 1;
  const double raw = range / n, p = pow(10, floor(log10(raw))), f = raw / p;
  return (f <= 1 ? 1 : f <= 2 ? 2 : f <= 5 ? 5 : 10) * p;
}

mf_status mf_svg_write(mf_svg *b, const char *path) {
  if (b->oom) {
    mf_svg_free(b);
    return MF_ERR(MF_ERR_OUT_OF_MEMORY, "%s: out of memory building the SVG", path);
  }
  const mf_status st = mf_write_file_atomic(path, b->p, b->n);
  mf_svg_free(b);
  return st;
}

void mf_svg_free(mf_svg *b) {
  free(b->p);
  b->p = NULL;
  b->n = b->cap = 0;
}
