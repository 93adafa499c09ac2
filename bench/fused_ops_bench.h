// The residual stream's fused norms (Ops::rmsnorm_forward_residual, rmsnorm_backward_add) against the ops they
// replace (a copy and a norm; a norm's backward and an add_inplace), on the same rows in the same run, at 1 and 2
// threads: what the fusion saves where the ops are bound by memory. docs/gpu.md counts the bytes each saves at
// bench_mixtral's shape.
#pragma once

#include <cstdio>
#include <nlohmann/json.hpp>
#include <vector>

#include "bench/timing.h"
#include "bench/two_ways.h"
#include "core/backend/backend.h"

namespace moe::bench {

struct FusedNormResult {
  int64_t N = 0, D = 0;
  TwoWays forward, backward;  // first: fused, second: unfused
};

inline FusedNormResult measure_fused_norms(Backend& backend, int64_t N, int64_t D, int reps) {
  Ops<float>& ops = backend.ops<float>();
  const int64_t n = N * D;
  std::vector<Buffer> b;
  for (int i = 0; i < 6; ++i) b.push_back(backend.allocate(DType::F32, n));
  Buffer gain = backend.allocate(DType::F32, D), dgain = backend.allocate(DType::F32, D),
         rstd = backend.allocate(DType::F32, N);
  float *x = b[0].data<float>(), *h = b[1].data<float>(), *y = b[2].data<float>(), *dy = b[3].data<float>(),
        *dres = b[4].data<float>(), *dx = b[5].data<float>();
  ops.fill(x, 0.5f, n), ops.fill(dy, 0.25f, n), ops.fill(dres, 0.0f, n), ops.fill(gain.data<float>(), 1.0f, D);
  ops.fill(dgain.data<float>(), 0.0f, D);
  FusedNormResult r{N, D, {}, {}};
  r.forward = time_two_ways(backend, reps, [&](bool fused) {
    const Stopwatch clock;
    if (fused) {
      ops.rmsnorm_forward_residual(x, nullptr, h, gain.data<float>(), y, rstd.data<float>(), N, D);
    } else {
      ops.rmsnorm_forward(x, gain.data<float>(), y, rstd.data<float>(), N, D);
      ops.copy(x, h, n);
    }
    backend.synchronize();
    return clock.seconds();
  });
  r.backward = time_two_ways(backend, reps, [&](bool fused) {
    const Stopwatch clock;
    if (fused) {
      ops.rmsnorm_backward_add(x, gain.data<float>(), rstd.data<float>(), dy, dres, dgain.data<float>(), N, D);
    } else {
      ops.rmsnorm_backward(x, gain.data<float>(), rstd.data<float>(), dy, dx, dgain.data<float>(), N, D);
      ops.add_inplace(dres, dx, n);
    }
    backend.synchronize();
    return clock.seconds();
  });
  return r;
}

// "  forward  1t: fused / unfused ms = ratio  2t: ..." and the same for backward.
inline void print_fused_norms(const FusedNormResult& r) {
  std::printf("  N=%lld D=%lld\n", (long long)r.N, (long long)r.D);
  for (const auto& [name, w] :
       {std::pair<const char*, const TwoWays&>{"forward ", r.forward}, {"backward", r.backward}}) {
    std::printf("    %s", name);
    for (int t = 0; t < 2; ++t)
      std::printf("  %dt: %.3f / %.3f ms = %.2f", t + 1, w.first_s[t].median * 1e3, w.second_s[t].median * 1e3,
                  w.second_s[t].median / w.first_s[t].median);
    std::printf("\n");
  }
}

inline nlohmann::json fused_norms_json(const FusedNormResult& r) {
  nlohmann::json j = {{"N", r.N}, {"D", r.D}};
  for (const auto& [name, w] : {std::pair<const char*, const TwoWays&>{"forward", r.forward}, {"backward", r.backward}})
    for (int t = 0; t < 2; ++t)
      j[name][std::to_string(t + 1) + "_threads"] = {
          {"fused_s", w.first_s[t].median},
          {"unfused_s", w.second_s[t].median},
          {"unfused_over_fused", w.second_s[t].median / w.first_s[t].median}};
  return j;
}

}  // namespace moe::bench
