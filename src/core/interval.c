/* Elementary intervals and the segment tree over them (see interval.h). */
#include <stdlib.h>
#include <string.h>

#include "src/core/interval.h"

/* An end of a range: its byte, and which (2 i: range i's start, 2 i + 1: its end). */
typedef struct range_end {
  size_t at;
  int32_t id;
} range_end;

/* Sorts a[0..n) by `at`: an LSD radix sort, 11 bits a pass, as many passes as
 * the largest value needs; tmp holds n. Stable, O(n) per pass (the planner
 * sorts the arena's slots for every schedule it simulates). Returns where
 * the sorted ends are. */
static range_end *sort_ends(range_end *a, size_t n, range_end *tmp) {
  enum { BITS = 11, BUCKETS = 1 << BITS };
  size_t max = 0;
  for (size_t i = 0; i < n; i++)
    if (a[i].at > max) max = a[i].at;
  range_end *src = a, *dst = tmp;
  for (unsigned shift = 0; shift < 8 * sizeof(size_t) && (max >> shift) > 0; shift += BITS) {
    size_t count[BUCKETS + 1];
    memset(count, 0, sizeof count);
    for (size_t i = 0; i < n; i++) count[((src[i].at >> shift) & (BUCKETS - 1)) + 1]++;
    for (size_t b = 0; b < BUCKETS; b++) count[b + 1] += count[b];
    for (size_t i = 0; i < n; i++) dst[count[(src[i].at >> shift) & (BUCKETS - 1)]++] = src[i];
    range_end *t = src;
    src = dst;
    dst = t;
  }
  return src;
}

/* The ends sorted with their ids, then one pass numbering the distinct
 * values: each end learns its leaf boundary without a search. */
mf_status mf_interval_leaves(int32_t n, const size_t *off, const size_t *len, int32_t *lo, int32_t *hi,
                             int32_t *n_leaves) {
  range_end *e = NULL;
  *n_leaves = 0;
  const size_t ne = 2 * (size_t)(n > 0 ? n : 0);
  MF_CHECK(mf_malloc(2 * (ne ? ne : 1) * sizeof(range_end), "intervals", (void **)&e));
  for (int32_t i = 0; i < n; i++) {
    e[2 * (size_t)i] = (range_end){off[i], 2 * i};
    e[2 * (size_t)i + 1] = (range_end){off[i] + len[i], 2 * i + 1};
  }
  const range_end *sorted = sort_ends(e, ne, e + ne);
  int32_t rank = -1;
  for (size_t k = 0; k < ne; k++) {
    if (k == 0 || sorted[k].at != sorted[k - 1].at) rank++;
    const int32_t id = sorted[k].id;
    (id & 1 ? hi : lo)[id >> 1] = rank;
  }
  free(e);
  *n_leaves = rank > 0 ? rank : 0;
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
