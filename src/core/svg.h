/*
 * A growing SVG text buffer: what draws a picture (`moefit plan --svg`,
 * planner/render.c; `moefit plot`, src/cli) appends to it and writes it
 * whole, atomically.
 */
#ifndef MF_CORE_SVG_H
#define MF_CORE_SVG_H

#include <stddef.h>

#include "src/core/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The first failed allocation sticks (later appends do nothing) and is
 * reported once, by mf_svg_write. Zero-initialise it. */
typedef struct mf_svg {
  char *p;
  size_t n, cap;
  int oom;
} mf_svg;

void mf_svg_printf(mf_svg *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* s with the five XML special characters escaped (text and attributes);
 * control characters, which XML 1.0 does not allow, as '?'. */
void mf_svg_escape(mf_svg *b, const char *s);
/* 1, 2 or 5 times a power of ten, giving at most about n steps over range
 * (axis ticks). */
double mf_svg_nice_step(double range, int n);
/* Writes the buffer to path atomically (core.h mf_write_file_atomic) and
 * frees it; MF_ERR_OUT_OF_MEMORY when an append failed. */
mf_status mf_svg_write(mf_svg *b, const char *path);
void mf_svg_free(mf_svg *b);

#ifdef __cplusplus
}
#endif

#endif /* MF_CORE_SVG_H */
