/*
 * The simulation's arena segment tree (planner/simulate.c), also the
 * executor's for its cross-stream memory dependencies (src/exec/exec.c).
 * Over `n` elementary intervals (leaves), values only grow: mf_seg_update
 * raises every leaf of [l, r) to at least v (range chmax), mf_seg_query gives
 * the largest value over [l, r) (range max; 0 for an empty range or before
 * any update). The caller owns mx and tag, each 2 * size doubles, zeroed,
 * with size the power of two >= n.
 */
#ifndef MF_PLANNER_SEGTREE_H
#define MF_PLANNER_SEGTREE_H

#include <stdint.h>

/* Over the elementary intervals between the slots' offsets and ends: a range
 * chmax (a slot is done at time t) and a range max (when is this memory free).
 * Bottom-up over a power-of-two number of leaves (no recursion): `tag[i]` is a
 * value that applies to every leaf under node i, `mx[i]` the largest value
 * applied anywhere under it. An update tags the canonical nodes of [l, r) and
 * raises mx along the two boundary paths (every node whose leaves meet [l, r)
 * is a canonical node, under one, or on a boundary path); a query takes mx of
 * the canonical nodes and the tags on the boundary paths (each covers a
 * boundary leaf, which is in the range). */
typedef struct mf_segtree {
  double *mx, *tag; /* [2 size] */
  int32_t n;        /* leaves in use */
  int32_t size;     /* leaves: the power of two >= n */
} mf_segtree;

static inline void mf_seg_update(mf_segtree *t, int32_t ql, int32_t qr, double v) {
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

static inline double mf_seg_query(const mf_segtree *t, int32_t ql, int32_t qr) {
  if (ql >= qr) return 0;
  double m = 0;
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

#endif /* MF_PLANNER_SEGTREE_H */
