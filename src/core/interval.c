/* Elementary intervals and the segment tree over them (see interval.h). */
#include <stdlib.h>
#include <string.h>

#include "src/core/interval.h"

/* The first index in [l, h) of sorted c whose value is >= v (h: none). */
static size_t first_at_least(const size_t *c, size_t l, size_t h, size_t v) {
  while (l < h) {
    const size_t m = l + (h - l) / 2;
    if (c[m] < v)
      l = m + 1;
    else
      h = m;
  }
  return l;
}

mf_status mf_interval_leaves(int32_t n, const size_t *off, const size_t *len, int32_t *lo, int32_t *hi,
                             int32_t *n_leaves) {
  size_t *c = NULL;
  *n_leaves = 0;
  /* The ends, then as much again for the radix sort's scratch. */
  MF_CHECK(mf_malloc(4 * (size_t)(n > 0 ? n : 1) * sizeof(size_t), "intervals", (void **)&c));
  size_t nc = 0;
  for (int32_t i = 0; i < n; i++) {
    c[nc++] = off[i];
    c[nc++] = off[i] + len[i];
  }
  mf_sort_size(c, nc, c + nc);
  size_t nu = 0;
  for (size_t i = 0; i < nc; i++)
    if (nu == 0 || c[nu - 1] != c[i]) c[nu++] = c[i];
  for (int32_t i = 0; i < n; i++) {
    lo[i] = (int32_t)first_at_least(c, 0, nu, off[i]);
    hi[i] = (int32_t)first_at_least(c, (size_t)lo[i], nu, off[i] + len[i]);
  }
  free(c);
  *n_leaves = nu > 0 ? (int32_t)nu - 1 : 0;
  return MF_OK;
}

/* Bottom-up over a power-of-two number of leaves (no recursion): tag[i] is a
 * value that applies to every leaf under node i, mx[i] the largest value
 * applied anywhere under it. An update tags the canonical nodes of [l, r)
 * and raises mx along the two boundary paths (every node whose leaves meet
 * [l, r) is a canonical node, under one, or on a boundary path); a query
 * takes mx of the canonical nodes and the tags on the boundary paths (each
 * covers a boundary leaf, which is in the range). */
struct mf_segtree {
  int32_t *mx, *tag; /* [2 size] */
  int32_t size;      /* leaves: the power of two >= n_leaves */
};

mf_status mf_segtree_create(int32_t n_leaves, mf_segtree **out) {
  *out = NULL;
  int32_t size = 1;
  while (size < n_leaves) size *= 2;
  mf_segtree *t = NULL;
  MF_CHECK(mf_malloc(sizeof *t + 4 * (size_t)size * sizeof(int32_t), "segment tree", (void **)&t));
  t->size = size;
  t->mx = (int32_t *)(t + 1);
  t->tag = t->mx + 2 * (size_t)size;
  memset(t->mx, 0xff, 4 * (size_t)size * sizeof(int32_t)); /* every value -1 */
  *out = t;
  return MF_OK;
}

void mf_segtree_free(mf_segtree *t) { free(t); }

void mf_segtree_chmax(mf_segtree *t, int32_t ql, int32_t qr, int32_t v) {
  if (ql >= qr) return;
  int32_t l = ql + t->size, r = qr + t->size;
  for (; l < r; l >>= 1, r >>= 1) {
    if (l & 1) {
      if (t->tag[l] < v) t->tag[l] = v;
      if (t->mx[l] < v) t->mx[l] = v;
      l++;
    }
    if (r & 1) {
      --r;
      if (t->tag[r] < v) t->tag[r] = v;
      if (t->mx[r] < v) t->mx[r] = v;
    }
  }
  for (int32_t a = (ql + t->size) >> 1; a >= 1; a >>= 1)
    if (t->mx[a] < v) t->mx[a] = v;
  for (int32_t a = (qr - 1 + t->size) >> 1; a >= 1; a >>= 1)
    if (t->mx[a] < v) t->mx[a] = v;
}

int32_t mf_segtree_max(const mf_segtree *t, int32_t ql, int32_t qr) {
  int32_t m = -1;
  if (ql >= qr) return m;
  int32_t l = ql + t->size, r = qr + t->size;
  for (; l < r; l >>= 1, r >>= 1) {
    if (l & 1) {
      if (t->mx[l] > m) m = t->mx[l];
      l++;
    }
    if (r & 1) {
      --r;
      if (t->mx[r] > m) m = t->mx[r];
    }
  }
  for (int32_t a = (ql + t->size) >> 1; a >= 1; a >>= 1)
    if (t->tag[a] > m) m = t->tag[a];
  for (int32_t a = (qr - 1 + t->size) >> 1; a >= 1; a >>= 1)
    if (t->tag[a] > m) m = t->tag[a];
  return m;
}
