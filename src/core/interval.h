/*
 * Which earlier byte ranges share bytes with a new one: the elementary
 * intervals of a set of ranges [offset, offset + len), and a segment tree over
 * them. The schedule's order between streams (planner/schedule.h: the device
 * arena's slots) and the staging layout's order between slabs
 * (planner/staging.h) are both found with it, in O(n log n).
 *
 * Elementary intervals. The sorted distinct ends of n ranges cut the line into
 * leaves; range i covers leaves [lo[i], hi[i]) (none when it is empty), so two
 * ranges share bytes exactly when their leaf ranges meet.
 *
 * The segment tree holds `lanes` int32 values per leaf, -1 at first, that
 * only grow: mf_segtree_chmax raises lane q of every leaf of [l, r) to at
 * least v[q], mf_segtree_max gives each lane's largest over [l, r) (-1 for
 * an empty range, or where nothing was raised). Typically a leaf holds the
 * last instruction (or slab) that used its bytes, a lane per stream: a
 * range's max is what a new occupant waits for. The lanes share one walk of
 * the tree: one tree of three lanes costs little more than one of one.
 */
#ifndef MF_CORE_INTERVAL_H
#define MF_CORE_INTERVAL_H

#include <stddef.h>
#include <stdint.h>

#include "src/core/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* lo[i], hi[i] for the n ranges [off[i], off[i] + len[i]); *n_leaves, how many
 * leaves there are (the distinct ends less one; 0 without ranges). Sorts the
 * ends (a radix sort: O(n) a pass, no search) in scratch of its own
 * (MF_ERR_OUT_OF_MEMORY). */
mf_status mf_interval_leaves(int32_t n, const size_t *off, const size_t *len, int32_t *lo, int32_t *hi,
                             int32_t *n_leaves);

typedef struct mf_segtree mf_segtree;

#define MF_SEGTREE_MAX_LANES 4

/* A tree over n_leaves >= 0 leaves of 1..MF_SEGTREE_MAX_LANES lanes, every
 * value -1 (MF_ERR_INVALID_ARG for other lane counts, MF_ERR_OUT_OF_MEMORY). */
mf_status mf_segtree_create(int32_t n_leaves, int lanes, mf_segtree **out);
void mf_segtree_free(mf_segtree *t); /* NULL is fine */
/* Lane q of every leaf of [l, r) to at least v[q] (v[lanes]; -1 leaves a lane
 * as it is); nothing for an empty range. */
void mf_segtree_chmax(mf_segtree *t, int32_t l, int32_t r, const int32_t *v);
/* out[q]: the largest value of lane q over [l, r) (out[lanes]); -1 for an
 * empty range. */
void mf_segtree_max(const mf_segtree *t, int32_t l, int32_t r, int32_t *out);

#ifdef __cplusplus
}
#endif

#endif /* MF_CORE_INTERVAL_H */
