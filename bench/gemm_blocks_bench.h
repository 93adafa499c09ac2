// GEMM blocks, as bench_moe --gemm-blocks measures them: what the CPU backend's GEMM (core/backend/cpu/
// parallel_kernels.h blas_gemm: fixed blocks of rows or columns of C, one single-threaded OpenBLAS call each, so
// the bits do not depend on the thread count) costs against one OpenBLAS call that OpenBLAS threads itself, on
// the model's GEMM shapes (forward x W, input gradient dY W^T, weight gradient X^T dY), at 1 and 2 threads
// (bench/two_ways.h).
#pragma once

#include <cstdint>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench/timing.h"
#include "bench/two_ways.h"
#include "core/backend/backend.h"
#include "core/backend/cpu/parallel_kernels.h"

namespace moe::bench {

struct GemmBlocksShape {
  const char* name;
  int64_t M, N, K;
  bool trans_a, trans_b;
};

// configs/tiny_moe.json (512 token rows per micro-batch, d_model 128, ffn 384, experts of 192 on about 128 rows)
// and a wider model (1024 token rows, d_model 256, ffn 1024).
inline std::vector<GemmBlocksShape> gemm_blocks_shapes(bool quick) {
  if (quick) return {{"tiny x W", 64, 48, 32, false, false}, {"tiny X^T dY", 32, 48, 64, true, false}};
  return {{"tiny_moe x W", 512, 384, 128, false, false},          {"tiny_moe dY W^T", 512, 128, 384, false, true},
          {"tiny_moe X^T dY", 128, 384, 512, true, false},        {"tiny_moe expert x W", 128, 192, 128, false, false},
          {"tiny_moe expert X^T dY", 128, 192, 128, true, false}, {"wide x W", 1024, 1024, 256, false, false},
          {"wide dY W^T", 1024, 256, 1024, false, true},          {"wide X^T dY", 256, 1024, 1024, true, false}};
}

struct GemmBlocksResult {
  GemmBlocksShape shape;
  TwoWays seconds;  // per GEMM: the blocks first, one call second
};

inline double gemm_flops(const GemmBlocksShape& s) { return 2.0 * double(s.M) * double(s.N) * double(s.K); }

// Times both ways at 1 and 2 threads, interleaved, reps times; the backend is left at `threads` afterwards.
inline GemmBlocksResult measure_gemm_blocks(Backend& backend, const GemmBlocksShape& s, int reps) {
  std::vector<float> A(size_t(s.M * s.K), 0.5f), B(size_t(s.K * s.N), 0.25f), C(size_t(s.M * s.N), 0.0f);
  const int64_t lda = s.trans_a ? s.M : s.K, ldb = s.trans_b ? s.K : s.N;
  // Calls per sample: about 10^8 multiply-adds, so a sample lasts milliseconds.
  const int64_t calls = std::max<int64_t>(1, int64_t(1e8) / (s.M * s.N * s.K));
  const auto time = [&](bool blocked) {
    const Stopwatch watch;
    for (int64_t i = 0; i < calls; ++i) {
      if (blocked)
        cpu::blas_gemm(s.trans_a, s.trans_b, s.M, s.N, s.K, 1.0f, A.data(), lda, B.data(), ldb, 0.0f, C.data(), s.N);
      else
        cpu::blas_call(s.trans_a, s.trans_b, s.M, s.N, s.K, 1.0f, A.data(), lda, B.data(), ldb, 0.0f, C.data(), s.N);
    }
    return watch.seconds() / double(calls);
  };
  return {s, time_two_ways(backend, reps, time)};
}

inline void print_gemm_blocks(const GemmBlocksResult& r) {
  const GemmBlocksShape& s = r.shape;
  std::printf("  %-24s %5lld x %5lld x %5lld", s.name, (long long)s.M, (long long)s.N, (long long)s.K);
  print_two_ways(r.seconds, gemm_flops(s));
}

inline nlohmann::json gemm_blocks_json(const GemmBlocksResult& r) {
  const GemmBlocksShape& s = r.shape;
  nlohmann::json j = {{"name", s.name}, {"M", s.M}, {"N", s.N}, {"K", s.K}};
  two_ways_json(r.seconds, gemm_flops(s), "blocked_gflops", "one_call_gflops", "blocked_over_one_call", j);
  return j;
}

}  // namespace moe::bench
