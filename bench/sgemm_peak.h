// The baseline every benchmark divides by: the sgemm rate of the backend's Ops<float>::gemm on square matrices,
// measured in the same process with the thread count in use, plus the deterministic inputs it (and the
// benchmarks) fill matrices with. Prints one line per size, as the benchmarks' output shows it; decides
// nothing about which sizes are measured.
#pragma once

#include <cstdint>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <vector>

#include "bench/timing.h"
#include "core/backend/backend.h"

namespace moe::bench {

// A 64-bit LCG: benchmark inputs only need to be deterministic, finite and non-trivial.
inline uint64_t next_random(uint64_t& state) {
  state = state * 6364136223846793005ull + 1442695040888963407ull;
  return state >> 33;
}

// Values in [-1, 1).
inline void fill_uniform(std::vector<float>& x, uint64_t seed) {
  for (float& v : x) v = float(double(next_random(seed)) / double(1ull << 31) * 2.0 - 1.0);
}

struct SgemmSize {
  int64_t n = 0;
  Summary gflops;
};

struct SgemmPeak {
  std::vector<SgemmSize> sizes;
  double gflops = 0;  // best median over the sizes
  int64_t n = 0;      // the size that reached it
};

inline SgemmPeak measure_sgemm_peak(Backend& backend, const std::vector<int64_t>& sizes, int reps) {
  Ops<float>& ops = backend.ops<float>();
  SgemmPeak peak;
  for (const int64_t n : sizes) {
    std::vector<float> a(size_t(n * n)), b(size_t(n * n)), c(size_t(n * n));
    fill_uniform(a, 1);
    fill_uniform(b, 2);
    const double flops = 2.0 * double(n) * double(n) * double(n);
    // One untimed call: the first one starts the thread pool and touches C's pages.
    ops.gemm({.M = n, .N = n, .K = n, .A = a.data(), .lda = n, .B = b.data(), .ldb = n, .C = c.data(), .ldc = n});
    std::vector<double> rates;
    for (int r = 0; r < reps; ++r) {
      const Stopwatch clock;
      ops.gemm({.M = n, .N = n, .K = n, .A = a.data(), .lda = n, .B = b.data(), .ldb = n, .C = c.data(), .ldc = n});
      rates.push_back(flops / clock.seconds() * 1e-9);
    }
    const SgemmSize size{n, summarize(rates)};
    std::printf("  n=%-5lld %8.1f GFLOP/s  (min %.1f, max %.1f)\n", (long long)n, size.gflops.median, size.gflops.min,
                size.gflops.max);
    std::fflush(stdout);
    if (size.gflops.median > peak.gflops) {
      peak.gflops = size.gflops.median;
      peak.n = n;
    }
    peak.sizes.push_back(size);
  }
  return peak;
}

// The "sgemm" object of a benchmark's JSON line.
inline nlohmann::json sgemm_json(const SgemmPeak& peak, int reps) {
  nlohmann::json sizes = nlohmann::json::array();
  for (const SgemmSize& s : peak.sizes) sizes.push_back({{"n", s.n}, {"gflops", summary_json(s.gflops, 1.0)}});
  return {{"reps", reps}, {"sizes", sizes}, {"peak_gflops", peak.gflops}, {"peak_n", peak.n}};
}

}  // namespace moe::bench
