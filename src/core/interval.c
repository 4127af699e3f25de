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
 * applied anywhere under it (per lane: node i's lanes at [lanes i, lanes
 * (i + 1))). An update tags the canonical nodes of [l, r) and raises mx
 * along the two boundary paths (every node whose leaves meet [l, r) is a
 * canonical node, under one, or on a boundary path); a query takes mx of the
 * canonical nodes and the tags on the boundary paths (each covers a boundary
 * leaf, which is in the range). */
struct mf_segtree {
  int32_t *mx, *tag; /* [2 size lanes] */
  int32_t size;      /* leaves: the power of two >= n_leaves */
  int lanes;
};

mf_status mf_segtree_create(int32_t n_leaves, int lanes, mf_segtree **out) {
  *out = NULL;
  if (lanes < 1 || lanes > MF_SEGTREE_MAX_LANES)
    return MF_ERR(MF_ERR_INVALID_ARG, "segment tree: %d lanes (1 to %d)", lanes, MF_SEGTREE_MAX_LANES);
  int32_t size = 1;
  while (size < n_leaves) size *= 2;
  const size_t n = 2 * (size_t)size * (size_t)lanes;
  mf_segtree *t = NULL;
  MF_CHECK(mf_malloc(sizeof *t + 2 * n * sizeof(int32_t), "segment tree", (void **)&t));
  t->size = size;
  t->lanes = lanes;
  t->mx = (int32_t *)(t + 1);
  t->tag = t->mx + n;
  memset(t->mx, 0xff, 2 * n * sizeof(int32_t)); /* every value -1 */
  *out = t;
  return MF_OK;
}

void mf_segtree_free(mf_segtree *t) {
  free(t);
}

static inline __attribute__((always_inline)) void raise_to(int32_t *a, const int32_t *v, int lanes) {
#pragma GCC unroll 4
  for (int q = 0; q < lanes; q++)
    if (a[q] < v[q]) a[q] = v[q];
}

/* The walks, inlined for each lane count (L a constant there: the lanes'
 * loops unroll), since the planner runs them for every slot of every
 * schedule it simulates. */
static inline __attribute__((always_inline)) void chmax_lanes(mf_segtree *t, int32_t ql, int32_t qr,
                                                              const int32_t *vp, const int L) {
  int32_t v[MF_SEGTREE_MAX_LANES]; /* a copy the compiler may keep in registers (vp may alias the tree) */
  for (int q = 0; q < L; q++) v[q] = vp[q];
  int32_t l = ql + t->size, r = qr + t->size;
  for (; l < r; l >>= 1, r >>= 1) {
    if (l & 1) {
      raise_to(t->tag + (size_t)l * L, v, L);
      raise_to(t->mx + (size_t)l * L, v, L);
      l++;
    }
    if (r & 1) {
      --r;
      raise_to(t->tag + (size_t)r * L, v, L);
      raise_to(t->mx + (size_t)r * L, v, L);
    }
  }
  for (int32_t a = (ql + t->size) >> 1; a >= 1; a >>= 1) raise_to(t->mx + (size_t)a * L, v, L);
  for (int32_t a = (qr - 1 + t->size) >> 1; a >= 1; a >>= 1) raise_to(t->mx + (size_t)a * L, v, L);
}

static inline __attribute__((always_inline)) void max_lanes(const mf_segtree *t, int32_t ql, int32_t qr,
                                                            int32_t *out, const int L) {
  int32_t m[MF_SEGTREE_MAX_LANES] = {-1, -1, -1, -1};
  int32_t l = ql + t->size, r = qr + t->size;
  for (; l < r; l >>= 1, r >>= 1) {
    if (l & 1) raise_to(m, t->mx + (size_t)l++ * L, L);
    if (r & 1) raise_to(m, t->mx + (size_t)--r * L, L);
  }
  for (int32_t a = (ql + t->size) >> 1; a >= 1; a >>= 1) raise_to(m, t->tag + (size_t)a * L, L);
  for (int32_t a = (qr - 1 + t->size) >> 1; a >= 1; a >>= 1) raise_to(m, t->tag + (size_t)a * L, L);
  for (int q = 0; q < L; q++) out[q] = m[q];
}

void mf_segtree_chmax(mf_segtree *t, int32_t ql, int32_t qr, const int32_t *v) {
  if (ql >= qr) return;
  switch (t->lanes) {
    case 1:
      chmax_lanes(t, ql, qr, v, 1);
      break;
    case 2:
      chmax_lanes(t, ql, qr, v, 2);
      break;
    case 3:
      chmax_lanes(t, ql, qr, v, 3);
      break;
    default:
      chmax_lanes(t, ql, qr, v, MF_SEGTREE_MAX_LANES);
      break;
  }
}

void mf_segtree_max(const mf_segtree *t, int32_t ql, int32_t qr, int32_t *out) {
  if (ql >= qr) {
    for (int q = 0; q < t->lanes; q++) out[q] = -1;
    return;
  }
  switch (t->lanes) {
    case 1:
      max_lanes(t, ql, qr, out, 1);
      break;
    case 2:
      max_lanes(t, ql, qr, out, 2);
      break;
    case 3:
      max_lanes(t, ql, qr, out, 3);
      break;
    default:
      max_lanes(t, ql, qr, out, MF_SEGTREE_MAX_LANES);
      break;
  }
}
