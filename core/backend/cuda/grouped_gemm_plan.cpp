// The grouped GEMM's arguments (see grouped_gemm_plan.h).
#include "core/backend/cuda/grouped_gemm_plan.h"

#include <climits>

#include "core/error.h"

namespace moe {
namespace {

int as_int(int64_t v, const char* what) {
  MOE_CHECK(v >= 0 && v <= INT_MAX, "grouped gemm: " << what << " = " << v << " does not fit a 32-bit int");
  return int(v);
}

}  // namespace

GroupedGemmPlan plan_grouped_gemm(bool trans_a, bool trans_b, int64_t groups, const int64_t* row_offset, int64_t N,
                                  int64_t K) {
  MOE_CHECK(!(trans_a && trans_b), "grouped gemm: trans_a with trans_b is not an expert shape");
  GroupedGemmPlan p;
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t r0 = row_offset[g], rows = row_offset[g + 1] - r0;
    MOE_CHECK(rows >= 0, "grouped gemm: row offsets decrease at group " << g);
    if (rows == 0) continue;
    p.expert.push_back(g);
    p.m.push_back(as_int(N, "N"));
    p.ld_c.push_back(as_int(N, "N"));
    p.ld_second.push_back(as_int(K, "K"));
    p.second_offset.push_back(r0 * K);  // A_g: rows [r0, r0 + rows) of A (rows, K)
    if (!trans_a) {
      p.trans_first.push_back(trans_b), p.trans_second.push_back(false);
      p.n.push_back(as_int(rows, "rows of a group")), p.k.push_back(as_int(K, "K"));
      p.ld_first.push_back(as_int(trans_b ? K : N, "ld"));
      p.first_offset.push_back(g * K * N);  // B_g of B (groups, K, N) or (groups, N, K)
      p.c_offset.push_back(r0 * N);         // C_g: rows of C (rows, N)
    } else {
      p.trans_first.push_back(false), p.trans_second.push_back(true);
      p.n.push_back(as_int(K, "K")), p.k.push_back(as_int(rows, "rows of a group"));
      p.ld_first.push_back(as_int(N, "N"));
      p.first_offset.push_back(r0 * N);  // B_g: rows of B (rows, N)
      p.c_offset.push_back(g * K * N);   // C_g of C (groups, K, N)
    }
  }
  return p;
}

}  // namespace moe
