// The arguments of one grouped GEMM call (cuBLAS's cublas<t>gemmGroupedBatched) for the experts' GEMMs of
// core/backend/ops.h's grouped_gemm: one problem per non-empty expert, each its own group (the experts'
// row counts differ), all launched by one call instead of a loop of small GEMMs.
//
// cuBLAS is column-major and the project row-major. A row-major (M, N) matrix is the column-major (N, M)
// matrix of its transpose, so a row-major C = op(A) op(B) is computed as the column-major
// C^T = op(B)^T op(A)^T: the operands swap places and keep their transpose flags.
//   trans_a = false: C_g (m_g, N) = A_g (m_g, K) op(B_g)  ->  cuBLAS (op_b, N, m = N, n = m_g, k = K,
//                    first = B_g, ld = trans_b ? K : N, second = A_g, ld = K, C_g, ld = N)
//   trans_a = true:  C_g (K, N) = A_g^T (K, m_g) B_g (m_g, N)  ->  cuBLAS (N, T, m = N, n = K, k = m_g,
//                    first = B_g, ld = N, second = A_g, ld = K, C_g, ld = N)
// Host-side only (no CUDA types), so it is tested without a GPU; the backend turns it into the call.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace moe {

struct GroupedGemmPlan {
  // Per group (one problem each), in cuBLAS's column-major terms: transposes of the first and second operand.
  std::vector<bool> trans_first, trans_second;
  std::vector<int> m, n, k, ld_first, ld_second, ld_c;
  // Per problem: element offsets of the first operand, the second operand and C from their base pointers.
  std::vector<int64_t> first_offset, second_offset, c_offset;
  // The expert each problem is (non-empty groups only, in order).
  std::vector<int64_t> expert;
  size_t problems() const { return expert.size(); }
};

// The plan of grouped_gemm(trans_a, trans_b, groups, row_offset, N, K, ...) (core/backend/ops.h). The first
// operand is B (weights, or the output gradient for trans_a) and the second A. Throws moe::Error for
// trans_a with trans_b, decreasing row offsets, or a size past a 32-bit int.
GroupedGemmPlan plan_grouped_gemm(bool trans_a, bool trans_b, int64_t groups, const int64_t* row_offset, int64_t N,
                                  int64_t K);

}  // namespace moe
