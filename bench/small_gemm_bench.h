// Small-group expert GEMMs, as bench_moe --small-gemm measures them: the CPU backend's own kernels for a group of
// few rows (core/backend/cpu/small_gemm.h) against single-threaded OpenBLAS calls on the same operands, in the
// three forms of an expert's GEMMs (forward x W, input gradient dY W^T, weight gradient X^T dY), for groups of 16
// to 192 rows, at 1 and 2 threads. Each repetition sweeps many experts whose weights together exceed the
// last-level cache, one expert per call and the experts shared among threads as the grouped GEMM shares them, so
// the weights come from memory as they do at 64 experts top-1. Both ways at both thread counts in turn
// (bench/two_ways.h).
#pragma once

#include <omp.h>

#include <cstdint>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench/timing.h"
#include "bench/two_ways.h"
#include "core/backend/backend.h"
#include "core/backend/cpu/parallel_kernels.h"
#include "core/backend/cpu/small_gemm.h"

namespace moe::bench {

// One expert's GEMM: C (M x N) = op(A) op(B), the group's `rows` being M (forward, input gradient) or K (weight
// gradient).
struct SmallGemmShape {
  const char* name;
  int64_t rows, M, N, K;
  bool trans_a, trans_b;
};

// bench_moe's experts (d_model 256, expert_hidden 512) at group sizes around 64 experts top-1's 32 rows.
inline std::vector<SmallGemmShape> small_gemm_shapes(bool quick) {
  std::vector<SmallGemmShape> shapes;
  const int64_t D = quick ? 32 : 256, F = quick ? 64 : 512;
  const std::vector<int64_t> rows = quick ? std::vector<int64_t>{8} : std::vector<int64_t>{16, 32, 64, 128, 192};
  for (const int64_t m : rows) {
    shapes.push_back({"x W1", m, m, F, D, false, false});
    shapes.push_back({"dY W2^T", m, m, F, D, false, true});
    shapes.push_back({"X^T dY", m, D, F, m, true, false});
  }
  return shapes;
}

struct SmallGemmResult {
  SmallGemmShape shape;
  int64_t experts = 0;
  TwoWays seconds;  // per sweep of all experts: the kernels first, OpenBLAS second
};

inline double small_gemm_flops(const SmallGemmResult& r) {
  const SmallGemmShape& s = r.shape;
  return 2.0 * double(r.experts) * double(s.M) * double(s.N) * double(s.K);
}

// The operands of `experts` experts, the weights (or weight gradients) 64 MB in all unless quick.
struct SmallGemmOperands {
  int64_t experts, a_size, b_size, c_size;
  std::vector<float> A, B, C;
  SmallGemmOperands(const SmallGemmShape& s, bool quick)
      : experts(0), a_size(s.M * s.K), b_size(s.K * s.N), c_size(s.M * s.N) {
    const int64_t weights = s.trans_a ? c_size : b_size;
    experts = std::max<int64_t>(2, (quick ? (int64_t(1) << 16) : (int64_t(1) << 24)) / weights);
    A.assign(size_t(experts * a_size), 0.5f), B.assign(size_t(experts * b_size), 0.25f);
    C.assign(size_t(experts * c_size), 0.0f);
  }
};

// Times both ways at 1 and 2 threads, interleaved, reps times; the backend is left at its thread count.
inline SmallGemmResult measure_small_gemm(Backend& backend, const SmallGemmShape& s, int reps, bool quick) {
  SmallGemmOperands op(s, quick);
  const int64_t lda = s.trans_a ? s.M : s.K, ldb = s.trans_b ? s.K : s.N;
  const float beta = s.trans_a ? 1.0f : 0.0f;  // the weight gradients accumulate
  const auto sweep = [&](bool small) {
    const Stopwatch watch;
#pragma omp parallel for schedule(dynamic, 1)
    for (int64_t e = 0; e < op.experts; ++e) {
      const float *a = op.A.data() + e * op.a_size, *b = op.B.data() + e * op.b_size;
      float* c = op.C.data() + e * op.c_size;
      if (!small || !cpu::small_gemm(s.trans_a, s.trans_b, s.M, s.N, s.K, 1.0f, a, lda, b, ldb, beta, c, s.N))
        cpu::blas_call(s.trans_a, s.trans_b, s.M, s.N, s.K, 1.0f, a, lda, b, ldb, beta, c, s.N);
    }
    return watch.seconds();
  };
  return {s, op.experts, time_two_ways(backend, reps, sweep)};
}

inline void print_small_gemm(const SmallGemmResult& r) {
  const SmallGemmShape& s = r.shape;
  std::printf("  %-8s %3lld rows  %4lld x %4lld x %4lld", s.name, (long long)s.rows, (long long)s.M, (long long)s.N,
              (long long)s.K);
  print_two_ways(r.seconds, small_gemm_flops(r));
}

inline nlohmann::json small_gemm_json(const SmallGemmResult& r) {
  const SmallGemmShape& s = r.shape;
  nlohmann::json j = {{"name", s.name}, {"rows", s.rows}, {"M", s.M}, {"N", s.N}, {"K", s.K}, {"experts", r.experts}};
  two_ways_json(r.seconds, small_gemm_flops(r), "small_gflops", "openblas_gflops", "small_over_openblas", j);
  return j;
}

}  // namespace moe::bench
