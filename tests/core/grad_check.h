// Shared helpers for finite-difference gradient checks in double precision.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/philox.h"

namespace moe::testing {

inline std::vector<double> random_vector(int64_t n, uint64_t seed, const std::string& purpose, double scale = 1.0) {
  const RngStream rng(seed, purpose);
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[i] = scale * rng.normal(uint64_t(i));
  return v;
}

// Central differences of objective() with respect to x[i] for a spread of indices, against analytic[i].
// The truncation error of central differences is O(eps^2 * f''') ~ 1e-10 and the rounding error
// O(1e-16 * |f| / eps) ~ 1e-11 * |f|; objectives here are O(1), so a bound of 1e-6 relative plus 1e-8
// absolute is far above the method's own error and far below any real mistake.
inline void expect_gradient_matches(const std::string& what, std::vector<double>& x,
                                    const std::vector<double>& analytic, const std::function<double()>& objective,
                                    int64_t max_checks = 40) {
  ASSERT_EQ(x.size(), analytic.size());
  const int64_t n = int64_t(x.size());
  const int64_t stride = std::max<int64_t>(1, n / max_checks);
  constexpr double eps = 1e-5;
  for (int64_t i = 0; i < n; i += stride) {
    const double saved = x[i];
    x[i] = saved + eps;
    const double plus = objective();
    x[i] = saved - eps;
    const double minus = objective();
    x[i] = saved;
    const double numeric = (plus - minus) / (2 * eps);
    const double tol = 1e-6 * std::max(std::abs(numeric), std::abs(analytic[i])) + 1e-8;
    EXPECT_NEAR(analytic[i], numeric, tol) << what << " element " << i;
  }
}

inline double dot(const std::vector<double>& a, const double* b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

}  // namespace moe::testing
