// What the op conformance suites share: the backends under test (a new backend adds a row), the compute
// types every op runs in (fp32 and fp64), moving test data through a backend's buffers (allocate,
// copy_to_device, op, copy_to_host, compare: host pointers never reach an op), random inputs, and the
// normalised error bound, derived from the dtype and the reduction length.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "core/backend/backend.h"
#include "core/backend/cuda_backend.h"
#include "core/backend/memory_check.h"
#include "core/dtype.h"
#include "core/philox.h"

namespace moe::conformance {

struct BackendRow {
  std::string name;
  std::function<std::unique_ptr<Backend>()> make;
};
// The CUDA backend joins when this machine has a device (tests/core/test_cuda_host.cpp says when it does not).
inline std::vector<BackendRow> backends() {
  // "strict": the CPU backend behind the memory check (core/backend/memory_check.h), a device whose memory the
  // host cannot touch: every op's pointers and extents as a GPU would take them.
  std::vector<BackendRow> rows = {{"cpu", [] { return make_cpu_backend(0); }},
                                  {"strict", [] { return make_memory_check_backend(0); }}};
  if (cuda_device_count() > 0) rows.push_back({"cuda", [] { return make_cuda_backend(0); }});
  return rows;
}

// The reference: the CPU backend in double.
inline Backend& reference() {
  static const std::unique_ptr<Backend> backend = make_cpu_backend(0);
  return *backend;
}

inline std::vector<double> randn(int64_t n, const std::string& purpose, double scale = 1.0) {
  const RngStream rng(99, purpose);
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = scale * rng.normal(uint64_t(i));
  return v;
}

// Host values (held in double) in and out of a backend's buffers as T.
template <typename T>
Buffer put(Backend& b, const std::vector<double>& host) {
  return b.upload(std::vector<T>(host.begin(), host.end()));
}
// Expert blocks of an MoE shape with empty experts and a single-row one (row offsets of 6 groups).
inline const std::vector<int64_t> kExpertOffsets = {0, 5, 5, 6, 19, 19, 40};

inline Buffer put_index(Backend& b, const std::vector<int32_t>& host) { return b.upload(host); }
template <typename T>
std::vector<double> get(Backend& b, const Buffer& buffer) {
  const std::vector<T> v = b.download<T>(buffer);
  return {v.begin(), v.end()};
}

// Host values rounded as a producer holds them, and the values they stand for.
template <typename T>
std::vector<Rounded<T>> held(const std::vector<double>& host) {
  std::vector<Rounded<T>> out(host.size());
  for (size_t i = 0; i < host.size(); ++i) out[i] = to_rounded(T(host[i]));
  return out;
}
template <typename T>
std::vector<double> values(const std::vector<Rounded<T>>& v) {
  std::vector<double> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    if constexpr (std::is_same_v<T, float>)
      out[i] = bf16_to_float(v[i]);
    else
      out[i] = v[i];
  }
  return out;
}
template <typename T>
std::vector<double> rounded_values(std::vector<double> v) {
  for (double& x : v) x = double(round_to_bf16(T(x)));
  return v;
}

// Unit round-off of T.
template <typename T>
constexpr double eps() {
  return double(std::numeric_limits<T>::epsilon());
}

// max |got - ref| / (max |ref| + tiny) <= 8 eps(T) sqrt(reduction length), and every value finite.
template <typename T>
void expect_close(const std::string& what, const std::vector<double>& got, const std::vector<double>& ref,
                  int64_t reduction_length) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  double max_ref = 0, max_err = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    ASSERT_TRUE(std::isfinite(got[i])) << what << ": non-finite at " << i;
    max_ref = std::max(max_ref, std::abs(ref[i]));
    max_err = std::max(max_err, std::abs(got[i] - ref[i]));
  }
  const double bound = 8 * eps<T>() * std::sqrt(double(std::max<int64_t>(reduction_length, 1)));
  EXPECT_LE(max_err / (max_ref + 1e-300), bound) << what << " (" << (sizeof(T) == 4 ? "f32" : "f64") << ")";
}

// How far two backends' Gumbel noise -log(-log(u)) may lie apart. CUDA's double log is within 1 ulp of the exact
// value (CUDA C++ Programming Guide, mathematical functions), glibc's within about half an ulp, so each of the two
// logs may differ by 2 ulp. The inner one's relative difference, at most 2^-51, becomes an absolute difference of
// at most 2^-51 after the outer log, which adds its own 2 ulp of g: |g1 - g2| <= 2^-51 + 2^-51 |g| <=
// 4 * 2^-52 * max(1, |g|). The CPU backend, the reference, must match the host's RngStream bit for bit.
inline double gumbel_agreement_bound(double g) { return 4 * std::ldexp(1.0, -52) * std::max(1.0, std::abs(g)); }

class Conformance : public ::testing::TestWithParam<BackendRow> {
 protected:
  void SetUp() override { backend_ = GetParam().make(); }
  Backend& backend() { return *backend_; }

 private:
  std::unique_ptr<Backend> backend_;
};

}  // namespace moe::conformance
