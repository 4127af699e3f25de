// The load-balancing loss (transformers' load_balancing_loss_func): k under uniform routing, equal to a
// direct implementation of the formula (one_hot mask [N,k,E], f[j,e], P[e])
// pooled over layers, its gradient w.r.t. probs, and the gradient through the
// router's softmax against finite differences of the logits.
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "kernels/cpu/cpu_ops.h"
#include "tests/kernels/fd.h"

namespace {

// The §11 formula as transformers writes it, on the concatenated rows of all layers.
double direct_aux(const std::vector<float> &probs, const std::vector<int32_t> &sel, int64_t N, int64_t E,
                  int64_t K) {
  std::vector<double> mask((size_t)(N * K * E), 0.0);  // one_hot(sel): [N, k, E]
  for (int64_t n = 0; n < N; n++)
    for (int64_t j = 0; j < K; j++) mask[(size_t)((n * K + j) * E + sel[(size_t)(n * K + j)])] = 1.0;
  std::vector<double> f((size_t)(K * E), 0.0), P((size_t)E, 0.0);
  for (int64_t n = 0; n < N; n++) {
    for (int64_t j = 0; j < K; j++)
      for (int64_t e = 0; e < E; e++)
        f[(size_t)(j * E + e)] += mask[(size_t)((n * K + j) * E + e)] / (double)N;
    for (int64_t e = 0; e < E; e++) P[(size_t)e] += probs[(size_t)(n * E + e)] / (double)N;
  }
  double s = 0;
  for (int64_t j = 0; j < K; j++)
    for (int64_t e = 0; e < E; e++) s += f[(size_t)(j * E + e)] * P[(size_t)e];
  return (double)E * s;
}

TEST(AuxLoss, EqualsKUnderUniformRouting) {
  for (int64_t K : {1, 2, 4}) {
    const int64_t E = 8, T = 16;  // T*K a multiple of E: every expert picked equally often
    std::vector<float> probs((size_t)(T * E), 1.0f / (float)E);
    std::vector<int32_t> idx((size_t)(T * K));
    for (int64_t i = 0; i < T * K; i++) idx[(size_t)i] = (int32_t)(i % E);
    std::vector<int64_t> counts((size_t)E, 0);
    std::vector<double> psum((size_t)E, 0.0);
    for (int layer = 0; layer < 3; layer++)
      ASSERT_EQ(mf_cpu_aux_accumulate(probs.data(), idx.data(), T, E, K, counts.data(), psum.data()), MF_OK);
    double aux = NAN;
    ASSERT_EQ(mf_cpu_aux_value(counts.data(), psum.data(), E, 3 * T, &aux), MF_OK);
    EXPECT_NEAR(aux, (double)K, 1e-6) << "K=" << K;
  }
}

struct Layers {
  int64_t L, T, E, K;
  std::vector<std::vector<float>> logits, probs, w;
  std::vector<std::vector<int32_t>> idx;
};

Layers route_layers(int64_t L, int64_t T, int64_t E, int64_t K, uint32_t seed) {
  Layers ls{L, T, E, K, {}, {}, {}, {}};
  mf_kctx ctx = {nullptr, 0};
  for (int64_t l = 0; l < L; l++) {
    ls.logits.push_back(mf_fd::random_vec((size_t)(T * E), seed + (uint32_t)l, 1.5f));
    ls.probs.emplace_back((size_t)(T * E));
    ls.w.emplace_back((size_t)(T * K));
    ls.idx.emplace_back((size_t)(T * K));
    EXPECT_EQ(mf_cpu_router_fwd(ls.logits.back().data(), T, E, K, 1, 0, ls.probs.back().data(),
                                ls.idx.back().data(), ls.w.back().data(), &ctx),
              MF_OK);
  }
  return ls;
}

double pooled_aux(const Layers &ls, std::vector<int64_t> *counts_out = nullptr) {
  std::vector<int64_t> counts((size_t)ls.E, 0);
  std::vector<double> psum((size_t)ls.E, 0.0);
  for (int64_t l = 0; l < ls.L; l++)
    EXPECT_EQ(mf_cpu_aux_accumulate(ls.probs[(size_t)l].data(), ls.idx[(size_t)l].data(), ls.T, ls.E, ls.K,
                                    counts.data(), psum.data()),
              MF_OK);
  if (counts_out) *counts_out = counts;
  double aux = NAN;
  EXPECT_EQ(mf_cpu_aux_value(counts.data(), psum.data(), ls.E, ls.L * ls.T, &aux), MF_OK);
  return aux;
}

TEST(AuxLoss, MatchesTheDirectFormulaPooledOverLayers) {
  for (int64_t K : {1, 2, 3}) {
    Layers ls = route_layers(4, 29, 10, K, 100 + (uint32_t)K);
    std::vector<float> all_probs;
    std::vector<int32_t> all_sel;
    for (int64_t l = 0; l < ls.L; l++) {
      all_probs.insert(all_probs.end(), ls.probs[(size_t)l].begin(), ls.probs[(size_t)l].end());
      all_sel.insert(all_sel.end(), ls.idx[(size_t)l].begin(), ls.idx[(size_t)l].end());
    }
    std::vector<int64_t> counts;
    double got = pooled_aux(ls, &counts);
    double want = direct_aux(all_probs, all_sel, ls.L * ls.T, ls.E, K);
    EXPECT_NEAR(got, want, 1e-12 * want) << "K=" << K;
    EXPECT_EQ(std::accumulate(counts.begin(), counts.end(), (int64_t)0), ls.L * ls.T * K);
  }
}

TEST(AuxLoss, NoRowsIsZero) {
  std::vector<int64_t> counts(4, 0);
  std::vector<double> psum(4, 0.0);
  double aux = NAN;
  EXPECT_EQ(mf_cpu_aux_value(counts.data(), psum.data(), 4, 0, &aux), MF_OK);
  EXPECT_EQ(aux, 0.0);
  EXPECT_EQ(mf_cpu_aux_accumulate(nullptr, nullptr, 0, 4, 2, counts.data(), psum.data()), MF_OK);
  std::vector<int32_t> bad = {0, 4};
  std::vector<float> p(4, 0.25f);
  EXPECT_EQ(mf_cpu_aux_accumulate(p.data(), bad.data(), 1, 4, 2, counts.data(), psum.data()),
            MF_ERR_INVALID_ARG);
}

TEST(AuxLoss, GradientWrtProbsMatchesFiniteDifferences) {
  Layers ls = route_layers(3, 11, 6, 2, 200);
  const double coef = 0.02;
  std::vector<int64_t> counts;
  pooled_aux(ls, &counts);
  for (int64_t l = 0; l < ls.L; l++) {
    std::vector<float> dp((size_t)(ls.T * ls.E));
    ASSERT_EQ(mf_cpu_aux_grad(counts.data(), ls.E, ls.L * ls.T, coef, ls.T, dp.data()), MF_OK);
    for (int64_t t = 0; t < ls.T; t++)
      for (int64_t e = 0; e < ls.E; e++)
        EXPECT_FLOAT_EQ(dp[(size_t)(t * ls.E + e)],
                        (float)(coef * ls.E * counts[(size_t)e] / ((double)ls.L * ls.T * ls.L * ls.T)));
    // Selection held fixed: aux is linear in probs.
    auto loss = [&]() { return coef * pooled_aux(ls); };
    mf_fd::check_grad("d aux / d probs, layer " + std::to_string(l), ls.probs[(size_t)l], dp, loss, 1e-2, 66,
                      1e-4, 1e-7);
  }
}

TEST(AuxLoss, GradientThroughTheRouterMatchesFiniteDifferences) {
  // d(coef * aux)/d logits = router_bwd(dtopk_w = 0, dprobs_extra = aux_grad).
  // Logits well separated, so a step never changes the selection (counts fixed).
  const int64_t L = 2, T = 9, E = 7, K = 2;
  const double coef = 0.5;
  Layers ls = route_layers(L, T, E, K, 300);
  for (int64_t l = 0; l < L; l++) {
    std::mt19937 rng(400 + (uint32_t)l);
    for (int64_t t = 0; t < T; t++) {
      std::vector<int> perm((size_t)E);
      std::iota(perm.begin(), perm.end(), 0);
      std::shuffle(perm.begin(), perm.end(), rng);
      for (int64_t e = 0; e < E; e++)
        ls.logits[(size_t)l][(size_t)(t * E + e)] = 0.4f * (float)perm[(size_t)e] - 1.2f;
    }
  }
  mf_kctx ctx = {nullptr, 0};
  auto forward = [&]() {
    for (int64_t l = 0; l < L; l++)
      mf_cpu_router_fwd(ls.logits[(size_t)l].data(), T, E, K, 1, 0, ls.probs[(size_t)l].data(),
                        ls.idx[(size_t)l].data(), ls.w[(size_t)l].data(), &ctx);
  };
  forward();
  std::vector<int64_t> counts;
  pooled_aux(ls, &counts);
  const auto idx0 = ls.idx;
  std::vector<float> zeros((size_t)(T * K), 0.0f), dp((size_t)(T * E));
  ASSERT_EQ(mf_cpu_aux_grad(counts.data(), E, L * T, coef, T, dp.data()), MF_OK);
  for (int64_t l = 0; l < L; l++) {
    std::vector<float> dl((size_t)(T * E));
    ASSERT_EQ(mf_cpu_router_bwd(ls.probs[(size_t)l].data(), ls.idx[(size_t)l].data(), ls.w[(size_t)l].data(),
                                zeros.data(), dp.data(), T, E, K, 1, 0, dl.data(), &ctx),
              MF_OK);
    auto loss = [&]() {
      forward();
      EXPECT_EQ(ls.idx, idx0) << "a finite-difference step changed the selection";
      return coef * pooled_aux(ls);
    };
    mf_fd::check_grad("d aux / d logits, layer " + std::to_string(l), ls.logits[(size_t)l], dl, loss, 1e-2,
                      63, 2e-2, 1e-6);
    forward();
  }
}

}  // namespace
