// What memory bandwidth alone allows a MoE layer's experts: the machine's read bandwidth, measured in the same
// process (a sum over a buffer several times the last-level cache, on the threads in use), and the least time
// a forward + backward of the experts spends moving their weights and weight gradients when those do not fit
// in that cache. bench_moe divides it by the dense layer's time: a MoE / dense ratio no kernel can beat on
// this machine in fp32. Nothing here decides what is measured.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include "bench/timing.h"

namespace moe::bench {

// The last-level cache in bytes: the highest level sysfs lists for cpu 0 (what lscpu reads), else glibc's
// sysconf (which, in a virtual machine, may report the host's), else 0.
inline int64_t last_level_cache_bytes() {
  int64_t bytes = 0;
  int best_level = 0;
  for (int index = 0; index < 8; ++index) {
    const std::string dir = "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(index) + "/";
    std::ifstream level_file(dir + "level"), size_file(dir + "size");
    int level = 0;
    int64_t size = 0;
    std::string unit;
    if (!(level_file >> level) || !(size_file >> size)) continue;
    size_file >> unit;
    const int64_t scale = unit == "K" ? 1024 : unit == "M" ? 1024 * 1024 : 1;
    if (level > best_level) best_level = level, bytes = size * scale;
  }
  if (bytes > 0) return bytes;
#if defined(_SC_LEVEL3_CACHE_SIZE)
  long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
  if (l3 <= 0) l3 = sysconf(_SC_LEVEL2_CACHE_SIZE);
  if (l3 > 0) return int64_t(l3);
#endif
  return 0;
}

struct Bandwidth {
  int64_t buffer_bytes = 0;
  Summary bytes_per_s;  // read bandwidth
};

// Read bandwidth: eight independent sums (so that add latency does not bound it) over a buffer of at least
// 256 MB and 8 times the last-level cache, split among `threads`, median of `reps` passes after one untimed.
inline Bandwidth measure_read_bandwidth(int threads, int reps) {
  const int64_t bytes = std::max<int64_t>(int64_t(256) << 20, 8 * last_level_cache_bytes());
  const int64_t n = bytes / int64_t(sizeof(float)) / 8 * 8;
  std::vector<float> buffer(size_t(n), 1.0f);
  const float* x = buffer.data();
  std::vector<double> rates;
  volatile float sink = 0;
  for (int r = 0; r <= reps; ++r) {
    const Stopwatch clock;
    float total = 0;
#pragma omp parallel num_threads(threads) reduction(+ : total)
    {
      float sums[8] = {0, 0, 0, 0, 0, 0, 0, 0};  // eight chains, one per lane: vectorised without reordering
#pragma omp for schedule(static)
      for (int64_t block = 0; block < n / 8; ++block)
        for (int j = 0; j < 8; ++j) sums[j] += x[block * 8 + j];
      for (const float s : sums) total += s;
    }
    const double seconds = clock.seconds();
    sink = sink + total;
    if (r > 0) rates.push_back(double(n) * sizeof(float) / seconds);
  }
  return {n * int64_t(sizeof(float)), summarize(rates)};
}

// Bytes a forward + backward of E SwiGLU experts (D -> F -> D, fp32) must move when their weights and
// gradients stream from memory: the three weight stacks read forward and again backward, the three gradient
// stacks read and written once each (they accumulate). Activations are not counted (they are what the dense
// layer moves too).
inline double expert_stream_bytes(int64_t experts, int64_t d_model, int64_t hidden) {
  const double stack = double(experts) * double(d_model) * double(hidden) * sizeof(float);
  return 3.0 * stack * (2.0 + 2.0);
}

// Whether the experts' weights and gradients exceed the last-level cache (then they stream from memory).
inline bool experts_stream(int64_t experts, int64_t d_model, int64_t hidden) {
  const double state = 6.0 * double(experts) * double(d_model) * double(hidden) * sizeof(float);
  const int64_t cache = last_level_cache_bytes();
  return cache > 0 && state > double(cache);
}

}  // namespace moe::bench
