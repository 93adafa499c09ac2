// The CPU backend's many-at-a-time exponentials and logarithms (core/backend/cpu/vector_math.h): every form (AVX2
// where the CPU has it, the SSE form, the portable one) within a few ulp of double, and a value's result independent
// of where it sits in the array, which is what makes the ops' bits independent of how threads split them.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "core/backend/cpu/vector_math.h"

namespace moe::cpu {
namespace {

// Inputs over the range the ops see: SwiGLU pre-activations and softmax exponents (<= 0), odd length.
std::vector<double> inputs(int64_t n, double low, double high) {
  std::vector<double> x(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) x[size_t(i)] = low + (high - low) * double((i * 7919) % n) / double(n - 1);
  return x;
}

// f(x) of many doubles at once within 4 ulp of the scalar reference, and a value's result independent of its
// position: the same inputs shifted by 1..5 give the same bits.
void expect_like_scalar(DoubleFn f, double (*reference)(double), const std::vector<double>& x) {
  std::vector<double> y(x.size());
  map_doubles(f, x.data(), y.data(), int64_t(x.size()));
  for (size_t i = 0; i < x.size(); ++i) {
    const double want = reference(x[i]);
    EXPECT_LE(std::abs(y[i] - want), 4 * std::abs(want) * 2.2205e-16 + 1e-300) << "x = " << x[i];
  }
  for (int64_t shift = 1; shift <= 5; ++shift) {
    std::vector<double> tail(x.size() - size_t(shift));
    map_doubles(f, x.data() + shift, tail.data(), int64_t(tail.size()));
    for (size_t i = 0; i < tail.size(); ++i) ASSERT_EQ(tail[i], y[i + size_t(shift)]) << "shift " << shift;
  }
}

TEST(VectorMath, ExpDoublesWithinFourUlpOfStdExpAtEveryPosition) {
  expect_like_scalar(
      DoubleFn::Exp, [](double x) { return std::exp(x); }, inputs(1001, -700.0, 0.0));
  const std::vector<double> x = inputs(37, -5.0, 0.0);  // exp_doubles is map_doubles' Exp
  std::vector<double> a(x.size()), b(x.size());
  exp_doubles(x.data(), a.data(), int64_t(x.size()));
  map_doubles(DoubleFn::Exp, x.data(), b.data(), int64_t(x.size()));
  EXPECT_EQ(a, b);
}

TEST(VectorMath, LogDoublesWithinFourUlpOfStdLogAtEveryPosition) {
  expect_like_scalar(
      DoubleFn::Log, [](double x) { return std::log(x); }, inputs(1001, 1e-30, 4.0));
  const std::vector<double> x = inputs(37, 1e-3, 4.0);  // log_doubles is map_doubles' Log
  std::vector<double> a(x.size()), b(x.size());
  log_doubles(x.data(), a.data(), int64_t(x.size()));
  map_doubles(DoubleFn::Log, x.data(), b.data(), int64_t(x.size()));
  EXPECT_EQ(a, b);
}

// h = a sig(a) b and its gradients, in double.
void swiglu_reference(double a, double b, double dh, double& h, double& da, double& db) {
  const double sig = 1.0 / (1.0 + std::exp(-a));
  h = a * sig * b;
  db = dh * a * sig;
  da = dh * b * sig * (1.0 + a * (1.0 - sig));
}

using SwigluForward = void (*)(const float*, const float*, float*, int64_t);
using SwigluBackward = void (*)(const float*, const float*, const float*, float*, float*, int64_t);

// One form against double within its few roundings (4 ulp of exp, then 6 float operations), and position
// independence of its bits.
void expect_swiglu_form(SwigluForward forward, SwigluBackward backward, const char* name) {
  const int64_t n = 1003;
  const std::vector<double> ad = inputs(n, -30.0, 30.0), bd = inputs(n, -2.0, 2.0), dd = inputs(n, -1.0, 1.0);
  std::vector<float> a(ad.begin(), ad.end()), b(bd.begin(), bd.end()), dh(dd.begin(), dd.end());
  std::vector<float> h(static_cast<size_t>(n)), da(h.size()), db(h.size());
  forward(a.data(), b.data(), h.data(), n);
  backward(a.data(), b.data(), dh.data(), da.data(), db.data(), n);
  const double bound = 16 * 5.97e-8;  // relative, against the largest term of each product
  for (int64_t i = 0; i < n; ++i) {
    double rh, rda, rdb;
    swiglu_reference(a[size_t(i)], b[size_t(i)], dh[size_t(i)], rh, rda, rdb);
    const double scale = std::abs(double(a[size_t(i)])) + 1.0;
    EXPECT_NEAR(h[size_t(i)], rh, bound * scale * std::abs(b[size_t(i)]) + 1e-30) << name << " h, i " << i;
    EXPECT_NEAR(db[size_t(i)], rdb, bound * scale * std::abs(dh[size_t(i)]) + 1e-30) << name << " db, i " << i;
    EXPECT_NEAR(da[size_t(i)], rda, bound * scale * std::abs(dh[size_t(i)] * b[size_t(i)]) + 1e-30)
        << name << " da, i " << i;
  }
  for (const int64_t shift : {1, 3, 7}) {
    const int64_t m = n - shift;
    std::vector<float> h2(static_cast<size_t>(m)), da2(h2.size()), db2(h2.size());
    forward(a.data() + shift, b.data() + shift, h2.data(), m);
    backward(a.data() + shift, b.data() + shift, dh.data() + shift, da2.data(), db2.data(), m);
    for (int64_t i = 0; i < m; ++i) {
      ASSERT_EQ(h2[size_t(i)], h[size_t(i + shift)]) << name << " shift " << shift;
      ASSERT_EQ(da2[size_t(i)], da[size_t(i + shift)]) << name << " shift " << shift;
      ASSERT_EQ(db2[size_t(i)], db[size_t(i + shift)]) << name << " shift " << shift;
    }
  }
}

// log sum exp of a row, shifted by its maximum: exact enough where the plain sum would overflow or underflow.
TEST(VectorMath, LogSumExpOfARowAtAnyScale) {
  for (const double offset : {0.0, 800.0, -800.0}) {
    const std::vector<double> x = inputs(64, offset - 3.0, offset + 3.0);
    double s = 0;
    for (const double v : x) s += std::exp(v - offset);
    const double want = offset + std::log(s);
    EXPECT_NEAR(log_sum_exp(x.data(), int64_t(x.size())), want, 1e-12 * std::max(1.0, std::abs(want)))
        << "offset " << offset;
  }
  const std::vector<float> f = {1.5f, -2.0f, 0.25f};  // a float row, in double
  EXPECT_NEAR(log_sum_exp(f.data(), 3), std::log(std::exp(1.5) + std::exp(-2.0) + std::exp(0.25)), 1e-14);
}

TEST(VectorMath, SwigluFormsWithinRoundingOfDoubleAndIndependentOfPosition) {
  expect_swiglu_form(swiglu_forward_scalar, swiglu_backward_scalar, "scalar");
  expect_swiglu_form(swiglu_forward_floats, swiglu_backward_floats, "dispatched");
#if defined(__x86_64__)
  if (!cpu_has_avx2()) GTEST_SKIP() << "no AVX2 on this CPU: its form is not run";
  expect_swiglu_form(swiglu_forward_avx2, swiglu_backward_avx2, "avx2");
#endif
}

}  // namespace
}  // namespace moe::cpu
