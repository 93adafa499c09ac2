// Timing helpers shared by the benchmarks: a wall-clock stopwatch and the summary (median, min, max) of
// repeated measurements (and its JSON form). Nothing here decides what is measured or prints anything.
#pragma once

#include <algorithm>
#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/error.h"

namespace moe::bench {

// Wall-clock, not CPU time: with several threads CPU time would count each core's work separately.
class Stopwatch {
 public:
  Stopwatch() : start_(Clock::now()) {}
  double seconds() const { return std::chrono::duration<double>(Clock::now() - start_).count(); }

 private:
  using Clock = std::chrono::steady_clock;
  Clock::time_point start_;
};

// The machine is shared, so a single run or a mean is dominated by whoever else is busy; the median of
// repetitions is the figure reported, min and max show how noisy the run was.
struct Summary {
  double median = 0, min = 0, max = 0;
};

inline Summary summarize(std::vector<double> samples) {
  MOE_CHECK(!samples.empty(), "no samples to summarize");
  std::sort(samples.begin(), samples.end());
  const size_t n = samples.size();
  const double median = n % 2 ? samples[n / 2] : 0.5 * (samples[n / 2 - 1] + samples[n / 2]);
  return {median, samples.front(), samples.back()};
}

// {median, min, max}, each multiplied by unit (1e3: seconds to milliseconds), for a benchmark's JSON line.
inline nlohmann::json summary_json(const Summary& s, double unit) {
  return {{"median", s.median * unit}, {"min", s.min * unit}, {"max", s.max * unit}};
}

// The 1-minute load average (Linux), printed so a reader can tell a quiet run from a busy one;
// empty where /proc is not available.
inline std::string load_average() {
  std::ifstream in("/proc/loadavg");
  std::string one_minute;
  in >> one_minute;
  return one_minute;
}

}  // namespace moe::bench
