// Two ways of doing the same work, each timed at 1 and 2 threads: the comparison bench_moe's --gemm-blocks and
// --small-gemm sections make. Each repetition times the four in turn, so a busy moment of the machine falls on
// all of them; one round warms up; the medians are reported with their ratio.
#pragma once

#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench/timing.h"
#include "core/backend/backend.h"

namespace moe::bench {

struct TwoWays {
  Summary first_s[2], second_s[2];  // seconds at 1 and 2 threads
};

// seconds(first) times one way once (first: the first way, else the second); the backend is left at its thread
// count.
template <typename Seconds>
TwoWays time_two_ways(Backend& backend, int reps, const Seconds& seconds) {
  const int threads = backend.threads();
  std::vector<double> first[2], second[2];
  for (int rep = 0; rep < reps + 1; ++rep)
    for (int t = 0; t < 2; ++t) {
      backend.set_threads(t + 1);
      const double a = seconds(true), b = seconds(false);
      if (rep > 0) first[t].push_back(a), second[t].push_back(b);
    }
  backend.set_threads(threads);
  TwoWays r;
  for (int t = 0; t < 2; ++t) r.first_s[t] = summarize(first[t]), r.second_s[t] = summarize(second[t]);
  return r;
}

// "  1t: first / second GFLOP/s = second time / first time  2t: ..." for work of `flops`.
inline void print_two_ways(const TwoWays& r, double flops) {
  for (int t = 0; t < 2; ++t)
    std::printf("  %dt: %6.1f / %6.1f GFLOP/s = %.2f", t + 1, flops / r.first_s[t].median * 1e-9,
                flops / r.second_s[t].median * 1e-9, r.second_s[t].median / r.first_s[t].median);
  std::printf("\n");
}

// Into j, per thread count ("1_threads", "2_threads"): {first_key: GFLOP/s, second_key: GFLOP/s, ratio_key:
// second time / first time}.
inline void two_ways_json(const TwoWays& r, double flops, const char* first_key, const char* second_key,
                          const char* ratio_key, nlohmann::json& j) {
  for (int t = 0; t < 2; ++t)
    j[std::to_string(t + 1) + "_threads"] = {{first_key, flops / r.first_s[t].median * 1e-9},
                                             {second_key, flops / r.second_s[t].median * 1e-9},
                                             {ratio_key, r.second_s[t].median / r.first_s[t].median}};
}

}  // namespace moe::bench
