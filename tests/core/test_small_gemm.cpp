// The small-group expert GEMM kernels (core/backend/cpu/small_gemm.h) against a double reference, in each of their
// three forms and each instruction set the CPU has, over the edges of their tiles (rows not a multiple of 6 or 12,
// columns not of 16 or 32, reductions not of 8 or of a slab), leading dimensions wider than the matrices, alpha and
// beta, and beta = 0 over a C of NaN. Then the properties the ops' determinism rests on: the same bits for the same
// inputs wherever they lie in memory and in either instruction set, and the grouped GEMM of the CPU backend the
// same bits at 1, 2 and 3 threads with its groups in these kernels.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "core/backend/backend.h"
#include "core/backend/cpu/small_gemm.h"

namespace moe::cpu {
namespace {

using moe::make_cpu_backend;
using moe::Ops;

struct Case {
  bool ta, tb;
  int64_t M, N, K;
  float alpha, beta;
  int64_t pad;  // extra columns in every leading dimension
};

float value(int64_t i, int64_t salt) { return float(((i * 2654435761u + salt * 40503u) % 2001) - 1000) / 1000.0f; }

// n values, the first `offset` of them padding: element offset + i is value(i), wherever the matrix starts.
std::vector<float> filled(int64_t n, int64_t salt, int64_t offset = 0) {
  std::vector<float> x(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) x[size_t(i)] = value(i - offset, salt);
  return x;
}

// The instruction sets whose kernels run here.
std::vector<SmallGemmIsa> isas() {
  std::vector<SmallGemmIsa> here;
  for (const SmallGemmIsa isa : {SmallGemmIsa::Avx2, SmallGemmIsa::Avx512})
    if (small_gemm_available(isa)) here.push_back(isa);
  return here;
}

// Runs one case through the kernels of `isa` and checks it against double; returns C.
std::vector<float> check(const Case& c, SmallGemmIsa isa, int64_t offset = 0) {
  const int64_t a_rows = c.ta ? c.K : c.M, a_cols = c.ta ? c.M : c.K;
  const int64_t b_rows = c.tb ? c.N : c.K, b_cols = c.tb ? c.K : c.N;
  const int64_t lda = a_cols + c.pad, ldb = b_cols + c.pad, ldc = c.N + c.pad;
  std::vector<float> A = filled(a_rows * lda + offset, 1, offset), B = filled(b_rows * ldb + offset, 2, offset);
  std::vector<float> C = c.beta == 0.f ? std::vector<float>(size_t(c.M * ldc + offset), std::nanf(""))
                                       : filled(c.M * ldc + offset, 3, offset);
  const std::vector<float> C0 = C;
  const float *a = A.data() + offset, *b = B.data() + offset;
  EXPECT_TRUE(small_gemm_on(isa, c.ta, c.tb, c.M, c.N, c.K, c.alpha, a, lda, b, ldb, c.beta, C.data() + offset, ldc));
  for (int64_t i = 0; i < c.M; ++i)
    for (int64_t j = 0; j < c.N; ++j) {
      double sum = 0, size = 0;
      for (int64_t k = 0; k < c.K; ++k) {
        const double x = c.ta ? a[k * lda + i] : a[i * lda + k], y = c.tb ? b[j * ldb + k] : b[k * ldb + j];
        sum += x * y;
        size += std::abs(x * y);
      }
      const double c0 = c.beta == 0.f ? 0.0 : C0[size_t(offset + i * ldc + j)];  // NaN where beta is 0
      const double want = c.alpha * sum + c.beta * c0;
      const double tol = 2e-7 * (double(c.K) + 2) * (std::abs(c.alpha) * size + std::abs(c.beta * c0)) + 1e-30;
      const double got = C[size_t(offset + i * ldc + j)];
      EXPECT_NEAR(got, want, tol) << small_gemm_isa_name(isa) << " ta " << c.ta << " tb " << c.tb << " M " << c.M
                                  << " N " << c.N << " K " << c.K << " at (" << i << ", " << j << ")";
      if (::testing::Test::HasFailure()) return C;
    }
  // Outside the matrix (the leading dimensions' padding) nothing is written.
  for (int64_t i = 0; i < c.M; ++i)
    for (int64_t j = c.N; j < ldc; ++j) {
      const float before = C0[size_t(offset + i * ldc + j)], after = C[size_t(offset + i * ldc + j)];
      EXPECT_TRUE(std::isnan(before) ? std::isnan(after) : after == before) << "padding written at " << i << ", " << j;
    }
  return std::vector<float>(C.begin() + offset, C.end());
}

TEST(SmallGemm, EveryFormMatchesDoubleOverTileEdges) {
  if (!small_gemm_available()) GTEST_SKIP() << "no AVX2 and FMA here: OpenBLAS serves every group";
  for (const bool ta : {false, true})
    for (const bool tb : {false, true}) {
      if (ta && tb) continue;
      for (const int64_t rows : {1, 5, 6, 7, 12, 13, 25, 32, 64})
        for (const int64_t other : {1, 15, 16, 17, 31, 32, 33, 48, 56})
          for (const int64_t reduction : {1, 7, 8, 63, 64, 65, 130})
            for (const SmallGemmIsa isa : isas()) {
              // The group's rows are M for A B and A B^T, the reduction K for A^T B.
              const Case c = ta ? Case{ta, tb, other + reduction, other, rows, 1.f, 0.f, 0}
                                : Case{ta, tb, rows, other, reduction, 1.f, 0.f, 0};
              check(c, isa);
              if (HasFailure()) return;
            }
    }
}

TEST(SmallGemm, AlphaBetaAndLeadingDimensions) {
  if (!small_gemm_available()) GTEST_SKIP() << "no AVX2 and FMA here";
  const float alphas[] = {1.f, -0.5f}, betas[] = {0.f, 1.f, 0.25f};
  for (const bool ta : {false, true})
    for (const bool tb : {false, true}) {
      if (ta && tb) continue;
      for (const float alpha : alphas)
        for (const float beta : betas)
          for (const SmallGemmIsa isa : isas()) {
            check({ta, tb, ta ? 40 : 11, 33, ta ? 9 : 70, alpha, beta, 5}, isa);
            if (HasFailure()) return;
          }
    }
}

TEST(SmallGemm, TheSameBitsWhereverTheOperandsLie) {
  if (!small_gemm_available()) GTEST_SKIP() << "no AVX2 and FMA here";
  for (const bool ta : {false, true})
    for (const bool tb : {false, true}) {
      if (ta && tb) continue;
      const Case c{ta, tb, ta ? 50 : 23, 37, ta ? 19 : 90, 1.f, 1.f, 3};
      const SmallGemmIsa isa = isas().back();
      const std::vector<float> first = check(c, isa);
      for (const int64_t offset : {1, 3, 8}) {
        const std::vector<float> moved = check(c, isa, offset);
        ASSERT_EQ(moved.size(), first.size());
        for (size_t i = 0; i < first.size(); ++i) ASSERT_EQ(moved[i], first[i]) << "offset " << offset << " at " << i;
      }
    }
}

// AVX-512 and AVX2 give the same bits: every output element is the same chain of fused multiply-adds, and each
// panel's chain starts and ends alike (in C, or in a buffer finished with alpha and beta) in both.
TEST(SmallGemm, BothInstructionSetsGiveTheSameBits) {
  if (!small_gemm_available(SmallGemmIsa::Avx512)) GTEST_SKIP() << "no AVX-512 here";
  for (const bool ta : {false, true})
    for (const bool tb : {false, true}) {
      if (ta && tb) continue;
      for (const int64_t rows : {3, 12, 32, 43})
        for (const int64_t other : {16, 40, 64, 70})
          for (const float alpha : {1.f, 0.75f})
            for (const float beta : {0.f, 1.f, -0.5f}) {
              const Case c = ta ? Case{ta, tb, other + 9, other, rows, alpha, beta, 2}
                                : Case{ta, tb, rows, other, 130, alpha, beta, 2};
              const std::vector<float> wide = check(c, SmallGemmIsa::Avx512), narrow = check(c, SmallGemmIsa::Avx2);
              ASSERT_EQ(wide.size(), narrow.size());
              for (size_t i = 0; i < wide.size(); ++i)  // bit for bit: the padding of a beta-0 case is NaN in both
                ASSERT_EQ(std::memcmp(&wide[i], &narrow[i], sizeof(float)), 0)
                    << "ta " << ta << " tb " << tb << " rows " << rows << " other " << other << " alpha " << alpha
                    << " beta " << beta << " at " << i;
            }
    }
}

TEST(SmallGemm, RefusesWhatItDoesNotDo) {
  float x = 0;
  EXPECT_FALSE(small_gemm(true, true, 2, 2, 2, 1.f, &x, 2, &x, 2, 0.f, &x, 2));
  EXPECT_FALSE(small_gemm(false, false, 2, 2, 0, 1.f, &x, 2, &x, 2, 0.f, &x, 2));  // K = 0: OpenBLAS scales C
}

// The backend's grouped GEMM with groups in these kernels and in OpenBLAS (a group of more than kSmallGemmRows
// rows): the same bits at 1, 2 and 3 threads, in the forward (A W), input-gradient (A W^T) and weight-gradient
// (A^T B) forms.
TEST(SmallGemm, GroupedGemmBitsIndependentOfThreads) {
  const std::vector<int64_t> rows_per_group{0, 1, 31, 64, 65, 7, 140, 32};
  std::vector<int64_t> offsets{0};
  for (const int64_t r : rows_per_group) offsets.push_back(offsets.back() + r);
  const int64_t groups = int64_t(rows_per_group.size()), rows = offsets.back(), K = 72, N = 40;
  const std::vector<float> A = filled(rows * K, 4), W = filled(groups * K * N, 5), G = filled(rows * N, 6);
  auto run = [&](int threads, int form) {
    const auto backend = make_cpu_backend(threads);
    Ops<float>* ops = &backend->ops<float>();
    std::vector<float> C(size_t(form == 2 ? groups * K * N : rows * (form == 0 ? N : K)), 0.5f);
    if (form == 0)
      ops->grouped_gemm({.groups = groups,
                         .row_offset = offsets.data(),
                         .N = N,
                         .K = K,
                         .A = A.data(),
                         .B = W.data(),
                         .C = C.data()});
    if (form == 1)
      ops->grouped_gemm({.trans_b = true,
                         .groups = groups,
                         .row_offset = offsets.data(),
                         .N = K,
                         .K = N,
                         .A = G.data(),
                         .B = W.data(),
                         .C = C.data()});
    if (form == 2)
      ops->grouped_gemm({.trans_a = true,
                         .groups = groups,
                         .row_offset = offsets.data(),
                         .N = N,
                         .K = K,
                         .A = A.data(),
                         .B = G.data(),
                         .beta = 1.f,
                         .C = C.data()});
    return C;
  };
  for (int form = 0; form < 3; ++form) {
    const std::vector<float> one = run(1, form);
    for (const int threads : {2, 3}) {
      const std::vector<float> many = run(threads, form);
      for (size_t i = 0; i < one.size(); ++i) ASSERT_EQ(many[i], one[i]) << "form " << form << " threads " << threads;
    }
  }
}

}  // namespace
}  // namespace moe::cpu
