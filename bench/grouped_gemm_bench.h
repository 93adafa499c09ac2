// The grouped expert GEMM, as bench_moe measures it: one MoE layer's experts alone (GroupedExperts, core/moe/
// experts.h: six grouped GEMM calls, two forward and four backward, and the SwiGLU between them) on E experts'
// row blocks, against the sgemm peak and against the same experts run as one block of all the rows (one large
// GEMM per call, the dense equivalent: same FLOPs, one weight); and the six calls of the backend's grouped GEMM
// op alone, without the SwiGLU. The rows per expert are those of N K assignments spread at random over the
// experts, as a router spreads them early in training.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <vector>

#include "bench/sgemm_peak.h"
#include "bench/timing.h"
#include "core/backend/backend.h"
#include "core/moe/experts.h"

namespace moe::bench {

struct GroupedShape {
  int64_t d_model = 0, expert_hidden = 0, tokens = 0, experts = 0, top_k = 0;
};

struct GroupedResult {
  GroupedShape shape;
  int64_t max_rows = 0;
  double flops = 0;                // of the nine calls
  Summary grouped_s, one_group_s;  // seconds for the nine calls and the SwiGLU
  int64_t sgemm_n = 0;             // the square sgemm timed in each repetition beside them
  Summary grouped_over_sgemm;      // per repetition: the grouped rate / that sgemm's rate
  Summary gemms_s;                 // seconds for the nine grouped GEMM calls alone
  Summary gemms_over_sgemm;        // per repetition: the rate of the calls alone / that sgemm's rate
  int64_t chunk = 0;               // experts per call in the weights-in-cache run
  Summary in_cache_s;              // seconds for the same blocks, each chunk on the first chunk's weights
};

// Row offsets of E blocks holding N K assignments drawn uniformly at random (deterministic).
inline std::vector<int64_t> random_row_offsets(int64_t experts, int64_t assignments, uint64_t seed) {
  std::vector<int64_t> rows(size_t(experts), 0);
  for (int64_t i = 0; i < assignments; ++i) ++rows[size_t(next_random(seed) % uint64_t(experts))];
  std::vector<int64_t> offset(size_t(experts) + 1, 0);
  for (int64_t e = 0; e < experts; ++e) offset[size_t(e) + 1] = offset[size_t(e)] + rows[size_t(e)];
  return offset;
}

// The experts of one layer (core/moe/experts.h) on their own: forward, then backward, on `off`'s blocks. The
// operands are reused across repetitions: only the shapes matter, and the inputs stay bounded.
struct ExpertOperands {
  std::vector<float> xe, y, dy, dx, scratch, w13, w2, dw13, dw2;
  ExpertActs<float> acts;

  void run(GroupedExperts<float>& experts, const std::vector<int64_t>& off) {
    std::copy(xe.begin(), xe.end(), acts.xe.data<float>());
    experts.forward(off, acts, y.data());
    experts.backward(off, acts, dy.data(), scratch.data(), dx.data());
  }

  // The same blocks `chunk` at a time, every chunk on the first `chunk` experts' weights (as many as there are
  // threads): the same small-group work with the weights in cache, so that what the E experts' weights and
  // gradients cost coming from memory stands apart from what the small groups cost.
  void run_in_cache(GroupedExperts<float>& experts, const std::vector<int64_t>& off, int64_t chunk) {
    std::copy(xe.begin(), xe.end(), acts.xe.data<float>());
    const int64_t E = int64_t(off.size()) - 1;
    std::vector<int64_t> part;
    auto each_chunk = [&](auto&& f) {
      for (int64_t first = 0; first < E; first += chunk) {
        part.assign(off.begin() + first, off.begin() + std::min(first + chunk, E) + 1);
        f(part);
      }
    };
    each_chunk([&](const std::vector<int64_t>& p) { experts.forward(p, acts, y.data()); });
    each_chunk([&](const std::vector<int64_t>& p) { experts.backward(p, acts, dy.data(), scratch.data(), dx.data()); });
  }

  // GroupedExperts's six calls of Ops::grouped_gemm (core/backend/ops.h expert_mlp_forward_as and its backward) on
  // the same operands, without the SwiGLU between them: the backend op on its own.
  void run_gemms(Ops<float>& ops, const std::vector<int64_t>& off, int64_t D, int64_t F) {
    const int64_t E = int64_t(off.size()) - 1, R = off.back();
    float *ab = acts.ab.data<float>(), *h = acts.h.data<float>(), *x = acts.xe.data<float>();
    float *dh = scratch.data(), *dab = dh + R * F;
    const Ops<float>::GroupedGemm g{.groups = E, .row_offset = off.data()};
    auto call = [&](bool trans_a, bool trans_b, int64_t N, int64_t K, const float* A, const float* B, float beta,
                    float* C) {
      Ops<float>::GroupedGemm s = g;
      s.trans_a = trans_a, s.trans_b = trans_b, s.N = N, s.K = K, s.A = A, s.B = B, s.beta = beta, s.C = C;
      ops.grouped_gemm(s);
    };
    call(false, false, 2 * F, D, x, w13.data(), 0.f, ab);          // [a | b] = x W13
    call(false, false, D, F, h, w2.data(), 0.f, y.data());         // y = h W2
    call(true, false, D, F, h, dy.data(), 1.f, dw2.data());        // dW2 += h^T dy
    call(false, true, F, D, dy.data(), w2.data(), 0.f, dh);        // dh = dy W2^T
    call(true, false, 2 * F, D, x, dab, 1.f, dw13.data());         // dW13 += x^T [da | db]
    call(false, true, D, 2 * F, dab, w13.data(), 0.f, dx.data());  // dx = [da | db] W13^T
  }
};

// Each repetition also times one square sgemm of size sgemm_n (the peak's size): on a machine whose speed
// changes from minute to minute, the ratio of rates taken seconds apart is steadier than one to a peak measured
// before.
inline GroupedResult measure_grouped_gemm(Backend& backend, const GroupedShape& s, int64_t sgemm_n, int warmup,
                                          int reps) {
  const int64_t chunk = std::max(1, backend.threads());
  const int64_t D = s.d_model, F = s.expert_hidden, E = s.experts, R = s.tokens * s.top_k;
  const std::vector<int64_t> off = random_row_offsets(E, R, 99), whole = {0, R};
  ExpertOperands x;
  for (auto* v : {&x.xe, &x.y, &x.dy, &x.dx}) v->resize(size_t(R * D));
  x.scratch.resize(size_t(sizes::elements(sizes::experts_scratch(double(R), double(F)))));  // fp32 GEMMs
  for (auto* v : {&x.w13, &x.dw13}) v->resize(size_t(E * D * 2 * F));
  for (auto* v : {&x.w2, &x.dw2}) v->resize(size_t(E * D * F));
  uint64_t seed = 5;
  for (auto* v : {&x.xe, &x.dy, &x.w13, &x.w2}) fill_uniform(*v, ++seed);
  GroupedExperts<float> experts(backend, D, F);
  experts.bind(x.w13.data(), x.w2.data(), x.dw13.data(), x.dw2.data());
  experts.resize(x.acts, R);
  std::vector<float> a(size_t(sgemm_n * sgemm_n)), b(a.size()), c(a.size());
  fill_uniform(a, 1);
  fill_uniform(b, 2);
  const double flops = 9.0 * 2.0 * double(R) * double(D) * double(F), sgemm_flops = 2.0 * std::pow(double(sgemm_n), 3);
  std::vector<double> grouped, one, gemms, ratio, gemms_ratio, in_cache;
  for (int i = 0; i < warmup + reps; ++i) {  // alternating, so that a change of load hits all five alike
    const Stopwatch g;
    x.run(experts, off);
    const double grouped_s = g.seconds();
    const Stopwatch alone;
    x.run_gemms(backend.ops<float>(), off, D, F);
    const double gemms_s = alone.seconds();
    const Stopwatch o;
    x.run(experts, whole);  // one block: expert 0's weights for every row
    const double one_s = o.seconds();
    const Stopwatch ic;
    x.run_in_cache(experts, off, chunk);
    const double in_cache_s = ic.seconds();
    const Stopwatch m;
    backend.ops<float>().gemm({.M = sgemm_n,
                               .N = sgemm_n,
                               .K = sgemm_n,
                               .A = a.data(),
                               .lda = sgemm_n,
                               .B = b.data(),
                               .ldb = sgemm_n,
                               .C = c.data(),
                               .ldc = sgemm_n});
    const double sgemm_s = m.seconds();
    if (i < warmup) continue;
    grouped.push_back(grouped_s), one.push_back(one_s), gemms.push_back(gemms_s), in_cache.push_back(in_cache_s);
    ratio.push_back((flops / grouped_s) / (sgemm_flops / sgemm_s));
    gemms_ratio.push_back((flops / gemms_s) / (sgemm_flops / sgemm_s));
  }
  GroupedResult r{s, 0, flops, summarize(grouped), summarize(one), sgemm_n, summarize(ratio)};
  r.gemms_s = summarize(gemms), r.gemms_over_sgemm = summarize(gemms_ratio);
  r.chunk = chunk, r.in_cache_s = summarize(in_cache);
  for (int64_t e = 0; e < E; ++e) r.max_rows = std::max(r.max_rows, off[size_t(e) + 1] - off[size_t(e)]);
  return r;
}

inline void print_grouped(const GroupedResult& r, const SgemmPeak& peak) {
  const double grouped = r.flops / r.grouped_s.median * 1e-9, one = r.flops / r.one_group_s.median * 1e-9;
  std::printf(
      "  E=%lld K=%lld (%lld rows, at most %lld per expert): grouped %6.1f GFLOP/s = %.2f x peak;  one group "
      "%6.1f GFLOP/s = %.2f x peak;  grouped / one group time %.2f;  grouped / the n=%lld sgemm beside it %.2f "
      "(min %.2f, max %.2f)\n",
      (long long)r.shape.experts, (long long)r.shape.top_k, (long long)(r.shape.tokens * r.shape.top_k),
      (long long)r.max_rows, grouped, grouped / peak.gflops, one, one / peak.gflops,
      r.grouped_s.median / r.one_group_s.median, (long long)r.sgemm_n, r.grouped_over_sgemm.median,
      r.grouped_over_sgemm.min, r.grouped_over_sgemm.max);
  const double gemms = r.flops / r.gemms_s.median * 1e-9;
  std::printf(
      "    the nine grouped GEMM calls alone (no SwiGLU): %6.1f GFLOP/s = %.2f x peak;  / the sgemm beside them %.2f "
      "(min %.2f, max %.2f)\n",
      gemms, gemms / peak.gflops, r.gemms_over_sgemm.median, r.gemms_over_sgemm.min, r.gemms_over_sgemm.max);
  std::printf(
      "    in cache (the same blocks %lld experts a call, each call on the first %lld experts' weights): / one group "
      "time %.2f;  grouped / in cache %.2f\n",
      (long long)r.chunk, (long long)r.chunk, r.in_cache_s.median / r.one_group_s.median,
      r.grouped_s.median / r.in_cache_s.median);
  std::fflush(stdout);
}

inline nlohmann::json grouped_json(const GroupedResult& r, const SgemmPeak& peak) {
  return {{"experts", r.shape.experts},
          {"top_k", r.shape.top_k},
          {"rows", r.shape.tokens * r.shape.top_k},
          {"max_rows_per_expert", r.max_rows},
          {"flops", r.flops},
          {"grouped_ms", summary_json(r.grouped_s, 1e3)},
          {"one_group_ms", summary_json(r.one_group_s, 1e3)},
          {"grouped_ratio_to_sgemm_peak", r.flops / r.grouped_s.median * 1e-9 / peak.gflops},
          {"one_group_ratio_to_sgemm_peak", r.flops / r.one_group_s.median * 1e-9 / peak.gflops},
          {"grouped_over_one_group", r.grouped_s.median / r.one_group_s.median},
          {"interleaved_sgemm_n", r.sgemm_n},
          {"grouped_over_interleaved_sgemm", summary_json(r.grouped_over_sgemm, 1.0)},
          {"gemms_only_ms", summary_json(r.gemms_s, 1e3)},
          {"gemms_only_ratio_to_sgemm_peak", r.flops / r.gemms_s.median * 1e-9 / peak.gflops},
          {"gemms_only_over_interleaved_sgemm", summary_json(r.gemms_over_sgemm, 1.0)},
          {"in_cache_chunk", r.chunk},
          {"in_cache_ms", summary_json(r.in_cache_s, 1e3)},
          {"in_cache_over_one_group", r.in_cache_s.median / r.one_group_s.median},
          {"grouped_over_in_cache", r.grouped_s.median / r.in_cache_s.median}};
}

}  // namespace moe::bench
