// The interval helper: the segment tree against a plain array (random range
// raises and range maxima over many leaf counts, and the case that once broke
// it: an update whose canonical node sits on its own boundary path), and the
// elementary intervals against a byte-by-byte overlap test.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <vector>

#include "src/core/interval.h"

namespace {

struct Tree {
  mf_segtree *t = nullptr;
  Tree(int32_t n, int lanes = 1) { EXPECT_EQ(mf_segtree_create(n, lanes, &t), MF_OK); }
  ~Tree() { mf_segtree_free(t); }
  int32_t max(int32_t l, int32_t r) const {
    int32_t m = 0;
    mf_segtree_max(t, l, r, &m);
    return m;
  }
  void chmax(int32_t l, int32_t r, int32_t v) { mf_segtree_chmax(t, l, r, &v); }
};

// Random raises and maxima on `lanes` lanes at once, against plain arrays;
// a lane raised with -1 stays as it is.
int check_against_arrays(int lanes, uint32_t seed) {
  std::mt19937 rng(seed);
  int queries = 0;
  for (int32_t n = 1; n <= 70; n++) {
    for (int trial = 0; trial < 20; trial++) {
      Tree tr(n, lanes);
      std::vector<std::vector<int32_t>> plain((size_t)lanes, std::vector<int32_t>((size_t)n, -1));
      for (int k = 0; k < 60; k++) {
        const int32_t l = (int32_t)(rng() % (uint32_t)n);
        const int32_t r = l + 1 + (int32_t)(rng() % (uint32_t)(n - l));
        int32_t v[MF_SEGTREE_MAX_LANES];
        if (rng() % 2) {
          for (int q = 0; q < lanes; q++) {
            v[q] = rng() % 4 == 0 ? -1 : (int32_t)(rng() % 1000);
            for (int32_t i = l; i < r; i++) plain[q][(size_t)i] = std::max(plain[q][(size_t)i], v[q]);
          }
          mf_segtree_chmax(tr.t, l, r, v);
        } else {
          mf_segtree_max(tr.t, l, r, v);
          for (int q = 0; q < lanes; q++) {
            const int32_t want = *std::max_element(plain[q].begin() + l, plain[q].begin() + r);
            EXPECT_EQ(v[q], want) << "n " << n << " [" << l << ", " << r << ") lane " << q;
            if (v[q] != want) return queries;
          }
          queries++;
        }
      }
    }
  }
  return queries;
}

TEST(SegTree, MatchesAPlainArray) {
  EXPECT_GT(check_against_arrays(1, 7), 10000);
}

TEST(SegTree, LanesMatchPlainArrays) {
  EXPECT_GT(check_against_arrays(3, 11), 10000);
  EXPECT_GT(check_against_arrays(MF_SEGTREE_MAX_LANES, 13), 10000);
  mf_segtree *t = nullptr;
  EXPECT_EQ(mf_segtree_create(4, 0, &t), MF_ERR_INVALID_ARG);
  EXPECT_EQ(mf_segtree_create(4, MF_SEGTREE_MAX_LANES + 1, &t), MF_ERR_INVALID_ARG);
  EXPECT_EQ(t, nullptr);
}

TEST(SegTree, UpdateRaisesEveryAncestor) {
  Tree tr(8);
  tr.chmax(4, 6, 8);  // canonical node 6, whose parent 3 must learn of it
  EXPECT_EQ(tr.max(2, 8), 8);
  EXPECT_EQ(tr.max(0, 4), -1);
  EXPECT_EQ(tr.max(5, 6), 8);
  EXPECT_EQ(tr.max(3, 3), -1);  // empty
}

TEST(SegTree, NoLeaves) {
  Tree tr(0);
  EXPECT_EQ(tr.max(0, 0), -1);
  tr.chmax(0, 0, 3);
  EXPECT_EQ(tr.max(0, 0), -1);
  mf_segtree_free(nullptr);
}

// Two ranges share bytes exactly when their leaf ranges meet; a range's
// leaves are contiguous and cover it; empty ranges cover none.
TEST(IntervalLeaves, MeetExactlyWhenTheRangesShareBytes) {
  std::mt19937 rng(3);
  for (int trial = 0; trial < 200; trial++) {
    const int32_t n = 1 + (int32_t)(rng() % 40);
    std::vector<size_t> off((size_t)n), len((size_t)n);
    for (int32_t i = 0; i < n; i++) {
      off[(size_t)i] = rng() % 64 * 8;
      len[(size_t)i] = rng() % 5 == 0 ? 0 : rng() % 96 + 1;
    }
    std::vector<int32_t> lo((size_t)n), hi((size_t)n);
    int32_t leaves = -1;
    ASSERT_EQ(mf_interval_leaves(n, off.data(), len.data(), lo.data(), hi.data(), &leaves), MF_OK);
    std::vector<size_t> ends;
    for (int32_t i = 0; i < n; i++)
      ends.push_back(off[(size_t)i]), ends.push_back(off[(size_t)i] + len[(size_t)i]);
    std::sort(ends.begin(), ends.end());
    ends.erase(std::unique(ends.begin(), ends.end()), ends.end());
    EXPECT_EQ(leaves, (int32_t)ends.size() - 1);
    for (int32_t i = 0; i < n; i++) {
      EXPECT_LE(lo[(size_t)i], hi[(size_t)i]);
      EXPECT_LE(hi[(size_t)i], leaves);
      EXPECT_EQ(lo[(size_t)i] == hi[(size_t)i], len[(size_t)i] == 0);
      for (int32_t j = 0; j < n; j++) {
        const bool bytes = len[(size_t)i] && len[(size_t)j] &&
                           off[(size_t)i] < off[(size_t)j] + len[(size_t)j] &&
                           off[(size_t)j] < off[(size_t)i] + len[(size_t)i];
        const bool leaves_meet =
            std::max(lo[(size_t)i], lo[(size_t)j]) < std::min(hi[(size_t)i], hi[(size_t)j]);
        EXPECT_EQ(bytes, leaves_meet) << "ranges " << i << " and " << j;
      }
    }
  }
  int32_t leaves = -1;
  EXPECT_EQ(mf_interval_leaves(0, nullptr, nullptr, nullptr, nullptr, &leaves), MF_OK);
  EXPECT_EQ(leaves, 0);
}

// The ends' numbering (a radix sort) against std::sort: one, duplicates,
// ends past 32 bits (every digit's pass), all equal, already sorted and
// reversed.
TEST(IntervalLeaves, NumberTheEndsAsASortWould) {
  std::mt19937_64 rng(7);
  for (size_t n : {1, 2, 7, 1000, 50000}) {
    for (int kind = 0; kind < 5; kind++) {
      std::vector<size_t> off(n), len(n);
      for (size_t i = 0; i < n; i++) {
        switch (kind) {
          case 0: off[i] = rng() % 97, len[i] = rng() % 5; break;            // many duplicates, one pass
          case 1: off[i] = rng() >> 2, len[i] = rng() >> 2; break;           // every bit, every pass
          case 2: off[i] = (size_t)1 << 40, len[i] = 0; break;               // all equal
          case 3: off[i] = i * 64, len[i] = 64; break;                       // sorted, adjacent
          default: off[i] = (n - i) * ((size_t)1 << 33), len[i] = rng() & 7;  // reversed, high bits
        }
      }
      std::vector<size_t> ends;
      for (size_t i = 0; i < n; i++) ends.push_back(off[i]), ends.push_back(off[i] + len[i]);
      std::sort(ends.begin(), ends.end());
      ends.erase(std::unique(ends.begin(), ends.end()), ends.end());
      std::vector<int32_t> lo(n), hi(n);
      int32_t leaves = -1;
      ASSERT_EQ(mf_interval_leaves((int32_t)n, off.data(), len.data(), lo.data(), hi.data(), &leaves), MF_OK);
      EXPECT_EQ(leaves, (int32_t)ends.size() - 1) << "n " << n << " kind " << kind;
      for (size_t i = 0; i < n; i++) {
        const auto rank = [&](size_t v) {
          return (int32_t)(std::lower_bound(ends.begin(), ends.end(), v) - ends.begin());
        };
        ASSERT_EQ(lo[i], rank(off[i])) << "n " << n << " kind " << kind << " range " << i;
        ASSERT_EQ(hi[i], rank(off[i] + len[i])) << "n " << n << " kind " << kind << " range " << i;
      }
    }
  }
}

}  // namespace
