/* Text tables for people (core.h): columns as wide as their widest cell. */
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "src/core/core.h"

#define TABLE_GAP 2 /* spaces between columns */

typedef struct group {
  int first, n;
  char *label;
} group;

struct mf_table {
  char *align; /* one 'l' or 'r' per column */
  int n_cols;
  char **cells; /* row-major, n_cells of them */
  size_t n_cells, cap;
  group *groups;
  int n_groups;
  int oom; /* an allocation failed: reported by mf_table_print */
};

mf_status mf_table_create(const char *align, mf_table **out) {
  *out = NULL;
  const size_t n = align ? strlen(align) : 0;
  if (n == 0 || strspn(align, "lr") != n)
    return MF_ERR(MF_ERR_INVALID_ARG, "mf_table_create: align \"%s\" must be one 'l' or 'r' per column",
                  align ? align : "(null)");
  mf_table *t = NULL;
  MF_CHECK(mf_calloc(1, sizeof *t, "a text table", (void **)&t));
  t->n_cols = (int)n;
  t->align = mf_strdup(align);
  t->groups = (group *)calloc(n, sizeof *t->groups);
  if (!t->align || !t->groups) {
    mf_table_free(t);
    return MF_ERR(MF_ERR_OUT_OF_MEMORY, "out of host memory for a text table");
  }
  *out = t;
  return MF_OK;
}

void mf_table_free(mf_table *t) {
  if (!t) return;
  for (size_t i = 0; i < t->n_cells; i++) free(t->cells[i]);
  for (int g = 0; g < t->n_groups; g++) free(t->groups[g].label);
  free(t->cells);
  free(t->groups);
  free(t->align);
  free(t);
}

void mf_table_group(mf_table *t, int first_col, int n_cols, const char *label) {
  if (first_col < 0 || n_cols < 1 || first_col + n_cols > t->n_cols || t->n_groups == t->n_cols || !label) return;
  char *copy = mf_strdup(label);
  if (!copy) {
    t->oom = 1;
    return;
  }
  t->groups[t->n_groups++] = (group){first_col, n_cols, copy};
}

void mf_table_cell(mf_table *t, const char *fmt, ...) {
  if (t->oom) return;
  if (t->n_cells == t->cap) {
    const size_t cap = t->cap ? 2 * t->cap : 64;
    char **cells = (char **)realloc(t->cells, cap * sizeof *cells);
    if (!cells) {
      t->oom = 1;
      return;
    }
    t->cells = cells;
    t->cap = cap;
  }
  va_list ap, ap2;
  va_start(ap, fmt);
  va_copy(ap2, ap);
  const int need = vsnprintf(NULL, 0, fmt, ap);
  va_end(ap);
  char *s = need >= 0 ? (char *)malloc((size_t)need + 1) : NULL;
  if (s) vsnprintf(s, (size_t)need + 1, fmt, ap2);
  va_end(ap2);
  if (!s) {
    t->oom = 1;
    return;
  }
  t->cells[t->n_cells++] = s;
}

static const char *cell_at(const mf_table *t, size_t row, int col) {
  const size_t i = row * (size_t)t->n_cols + (size_t)col;
  return i < t->n_cells ? t->cells[i] : "";
}

/* Each column's width: its widest cell, then widened so each group label fits
 * over its columns (the group's last column takes the difference). */
static void column_widths(const mf_table *t, size_t rows, size_t *w) {
  for (int c = 0; c < t->n_cols; c++) {
    w[c] = 0;
    for (size_t r = 0; r < rows; r++) {
      const size_t len = strlen(cell_at(t, r, c));
      if (len > w[c]) w[c] = len;
    }
  }
  for (int g = 0; g < t->n_groups; g++) {
    const group *gr = &t->groups[g];
    size_t span = (size_t)(gr->n - 1) * TABLE_GAP;
    for (int c = gr->first; c < gr->first + gr->n; c++) span += w[c];
    const size_t len = strlen(gr->label);
    if (len > span) w[gr->first + gr->n - 1] += len - span;
  }
}

/* Writes line[0, n) without its trailing spaces, after the indent. */
static void put_line(FILE *out, const char *indent, char *line, size_t n) {
  while (n > 0 && line[n - 1] == ' ') n--;
  fputs(indent, out);
  fwrite(line, 1, n, out);
  fputc('\n', out);
}

mf_status mf_table_print(mf_table *t, FILE *out, const char *indent) {
  if (t->oom) return MF_ERR(MF_ERR_OUT_OF_MEMORY, "out of host memory building a text table");
  const size_t rows = (t->n_cells + (size_t)t->n_cols - 1) / (size_t)t->n_cols;
  size_t *w = NULL, *x = NULL;
  char *line = NULL;
  mf_status st = MF_OK;
  MF_CHECK_GOTO(mf_calloc((size_t)t->n_cols, sizeof *w, "table widths", (void **)&w), st, done);
  MF_CHECK_GOTO(mf_calloc((size_t)t->n_cols, sizeof *x, "table columns", (void **)&x), st, done);
  column_widths(t, rows, w);
  size_t total = 0;
  for (int c = 0; c < t->n_cols; c++) {
    x[c] = total;
    total += w[c] + (c + 1 < t->n_cols ? TABLE_GAP : 0);
  }
  MF_CHECK_GOTO(mf_malloc(total + 1, "a table line", (void **)&line), st, done);
  if (t->n_groups > 0) {
    memset(line, ' ', total);
    for (int g = 0; g < t->n_groups; g++) {
      const group *gr = &t->groups[g];
      const int last = gr->first + gr->n - 1;
      const size_t span = x[last] + w[last] - x[gr->first], len = strlen(gr->label);
      memcpy(line + x[gr->first] + (span - len) / 2, gr->label, len);
    }
    put_line(out, indent, line, total);
  }
  for (size_t r = 0; r < rows; r++) {
    memset(line, ' ', total);
    for (int c = 0; c < t->n_cols; c++) {
      const char *s = cell_at(t, r, c);
      const size_t len = strlen(s);
      memcpy(line + x[c] + (t->align[c] == 'r' ? w[c] - len : 0), s, len);
    }
    put_line(out, indent, line, total);
  }
  if (ferror(out)) st = MF_ERR(MF_ERR_IO, "writing a text table failed");
done:
  free(line);
  free(x);
  free(w);
  return st;
}
