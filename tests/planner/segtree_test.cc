// The simulation's arena segment tree against a plain array: random range
// raises and range maxima over many leaf counts, and the case that once broke
// it (an update whose canonical node sits on its own boundary path).
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <vector>

#include "planner/segtree.h"

namespace {

struct Tree {
  std::vector<double> mx, tag;
  mf_segtree t{};
  explicit Tree(int32_t n) {
    t.n = n;
    t.size = 1;
    while (t.size < n) t.size *= 2;
    mx.assign(2 * (size_t)t.size, 0.0);
    tag.assign(2 * (size_t)t.size, 0.0);
    t.mx = mx.data();
    t.tag = tag.data();
  }
};

TEST(SegTree, MatchesAPlainArray) {
  std::mt19937 rng(7);
  int queries = 0;
  for (int32_t n = 1; n <= 70; n++) {
    for (int trial = 0; trial < 20; trial++) {
      Tree tr(n);
      std::vector<double> plain((size_t)n, 0.0);
      for (int k = 0; k < 60; k++) {
        const int32_t l = (int32_t)(rng() % (uint32_t)n);
        const int32_t r = l + 1 + (int32_t)(rng() % (uint32_t)(n - l));
        if (rng() % 2) {
          const double v = (double)(rng() % 1000);
          mf_seg_update(&tr.t, l, r, v);
          for (int32_t i = l; i < r; i++) plain[(size_t)i] = std::max(plain[(size_t)i], v);
        } else {
          const double want = *std::max_element(plain.begin() + l, plain.begin() + r);
          ASSERT_EQ(mf_seg_query(&tr.t, l, r), want) << "n " << n << " [" << l << ", " << r << ")";
          queries++;
        }
      }
    }
  }
  EXPECT_GT(queries, 10000);
}

TEST(SegTree, UpdateRaisesEveryAncestor) {
  Tree tr(8);
  mf_seg_update(&tr.t, 4, 6, 8.0);  // canonical node 6, whose parent 3 must learn of it
  EXPECT_EQ(mf_seg_query(&tr.t, 2, 8), 8.0);
  EXPECT_EQ(mf_seg_query(&tr.t, 0, 4), 0.0);
  EXPECT_EQ(mf_seg_query(&tr.t, 5, 6), 8.0);
  EXPECT_EQ(mf_seg_query(&tr.t, 3, 3), 0.0);  // empty
}

}  // namespace
