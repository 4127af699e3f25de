// Finite-difference gradient checks for the cpu kernels.
//
// A kernel's backward is checked against central differences of a scalar
// probe loss L = sum_i c[i] * out[i] with fixed random coefficients c (so every
// output element matters). `loss` recomputes L from the current inputs in double
// precision accumulation; the check perturbs sampled input elements by +-h and
// compares (L(x+h) - L(x-h)) / 2h with the analytic gradient.
#ifndef MF_TESTS_KERNELS_FD_H
#define MF_TESTS_KERNELS_FD_H

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>
#include <string>
#include <vector>

namespace mf_fd {

inline std::vector<float> random_vec(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto &x : v) x = d(rng);
  return v;
}

inline double dot(const std::vector<float> &a, const float *b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); i++) s += (double)a[i] * (double)b[i];
  return s;
}

// Checks analytic[i] ~= dL/dx[i] for up to `samples` indices of x (all if fewer).
// Passes when |fd - an| <= atol + rtol * max(|fd|, |an|) for every sampled index
// and the relative norm of the difference over the samples is below rtol.
inline void check_grad(const std::string &what, std::vector<float> &x, const std::vector<float> &analytic,
                       const std::function<double()> &loss, double h = 1e-2, size_t samples = 64,
                       double rtol = 2e-2, double atol = 2e-3, uint32_t seed = 1) {
  ASSERT_EQ(x.size(), analytic.size()) << what;
  std::mt19937 rng(seed);
  std::vector<size_t> idx;
  if (x.size() <= samples) {
    for (size_t i = 0; i < x.size(); i++) idx.push_back(i);
  } else {
    std::uniform_int_distribution<size_t> d(0, x.size() - 1);
    for (size_t s = 0; s < samples; s++) idx.push_back(d(rng));
  }
  double num = 0, den = 0;
  for (size_t i : idx) {
    float saved = x[i];
    x[i] = (float)(saved + h);
    double lp = loss();
    x[i] = (float)(saved - h);
    double lm = loss();
    x[i] = saved;
    double fd = (lp - lm) / (2 * h);
    double an = analytic[i];
    num += (fd - an) * (fd - an);
    den += fd * fd;
    EXPECT_LE(std::fabs(fd - an), atol + rtol * std::max(std::fabs(fd), std::fabs(an)))
        << what << "[" << i << "]: finite difference " << fd << " vs analytic " << an;
  }
  EXPECT_LE(std::sqrt(num), rtol * std::sqrt(den) + atol) << what << ": relative error over samples";
}

}  // namespace mf_fd

#endif  // MF_TESTS_KERNELS_FD_H
