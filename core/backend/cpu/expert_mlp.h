// The CPU backend's expert MLPs (Ops::expert_mlp_forward / expert_mlp_backward). Where every expert's block of
// rows is small enough for the small-group kernels (at most kSmallGemmRows rows, whose GEMMs run on one thread
// anyway), each expert's whole sequence, its GEMMs and its SwiGLU, runs on one thread, the experts shared among
// the threads largest first, instead of one op over all the experts after another. The same calls on the same
// operands, so the same bits (test_core_moe_ops compares the two); what changes is that a block's activations
// are still in its thread's cache when the next op reads them, and that one parallel region replaces four in the
// forward and seven in the backward. Larger blocks go op after op (Ops' default), their GEMMs on all threads.
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "core/backend/cpu/parallel_kernels.h"
#include "core/backend/cpu/small_gemm.h"
#include "core/backend/cpu/vector_math.h"
#include "core/backend/ops.h"

namespace moe::cpu {

// h = silu(a) * b over n on the calling thread: float through cpu/vector_math.h, double as written.
template <typename T>
void swiglu_forward_span(const T* a, const T* b, T* h, int64_t n) {
  if constexpr (std::is_same_v<T, float>) {
    swiglu_forward_floats(a, b, h, n);
  } else {
    for (int64_t i = 0; i < n; ++i) {
      const T sig = T(1) / (T(1) + std::exp(-a[i]));
      h[i] = a[i] * sig * b[i];
    }
  }
}

// db = dh silu(a), da = dh b sig (1 + a (1 - sig)) over n on the calling thread.
template <typename T>
void swiglu_backward_span(const T* a, const T* b, const T* dh, T* da, T* db, int64_t n) {
  if constexpr (std::is_same_v<T, float>) {
    swiglu_backward_floats(a, b, dh, da, db, n);
  } else {
    for (int64_t i = 0; i < n; ++i) {
      const T sig = T(1) / (T(1) + std::exp(-a[i])), silu = a[i] * sig;
      db[i] = dh[i] * silu;
      da[i] = dh[i] * b[i] * sig * (T(1) + a[i] * (T(1) - sig));
    }
  }
}

// Whether the experts run one at a time (see above): no block has more than kSmallGemmRows rows.
inline bool experts_one_at_a_time(int64_t groups, const int64_t* row_offset) {
  for (int64_t g = 0; g < groups; ++g)
    if (row_offset[g + 1] - row_offset[g] > kSmallGemmRows) return false;
  return true;
}

// The experts' non-empty groups, largest first.
inline std::vector<int64_t> expert_order(int64_t groups, const int64_t* row_offset) {
  std::vector<int64_t> all(size_t(groups), 0);
  for (int64_t g = 0; g < groups; ++g) all[size_t(g)] = g;
  return largest_first(std::move(all), row_offset);
}

// Ops::expert_mlp_forward, one expert at a time (experts_one_at_a_time).
template <typename T>
void expert_mlp_forward(const GemmInputs<T>& p, const typename Ops<T>::ExpertMlp& e, const T* x, T* a, T* b, T* h,
                        T* y) {
  const int64_t D = e.D, F = e.F;
  const int64_t* off = e.row_offset;
  run_groups(expert_order(e.groups, off), [&](int64_t g) {
    const int64_t first = off[g] * F, n = (off[g + 1] - off[g]) * F;
    grouped_gemm_group(p, false, false, g, off, F, D, T(1), x, e.w1, T(0), a);  // a = x W1
    grouped_gemm_group(p, false, false, g, off, F, D, T(1), x, e.w3, T(0), b);  // b = x W3
    swiglu_forward_span(a + first, b + first, h + first, n);
    grouped_gemm_group(p, false, false, g, off, D, F, T(1), h, e.w2, T(0), y);  // y = h W2
  });
}

// Ops::expert_mlp_backward, one expert at a time (experts_one_at_a_time).
template <typename T>
void expert_mlp_backward(const GemmInputs<T>& p, const typename Ops<T>::ExpertMlp& e, const T* x, const T* a,
                         const T* b, const T* h, const T* dy, T* dh, T* da, T* db, T* dx) {
  const int64_t D = e.D, F = e.F;
  const int64_t* off = e.row_offset;
  run_groups(expert_order(e.groups, off), [&](int64_t g) {
    const int64_t first = off[g] * F, n = (off[g + 1] - off[g]) * F;
    grouped_gemm_group(p, true, false, g, off, D, F, T(1), h, dy, T(1), e.dw2);  // dW2 += h^T dy
    grouped_gemm_group(p, false, true, g, off, F, D, T(1), dy, e.w2, T(0), dh);  // dh = dy W2^T
    swiglu_backward_span(a + first, b + first, dh + first, da + first, db + first, n);
    grouped_gemm_group(p, true, false, g, off, F, D, T(1), x, da, T(1), e.dw1);  // dW1 += x^T da
    grouped_gemm_group(p, true, false, g, off, F, D, T(1), x, db, T(1), e.dw3);  // dW3 += x^T db
    grouped_gemm_group(p, false, true, g, off, D, F, T(1), da, e.w1, T(0), dx);  // dx = da W1^T
    grouped_gemm_group(p, false, true, g, off, D, F, T(1), db, e.w3, T(1), dx);  //    + db W3^T
  });
}

}  // namespace moe::cpu
