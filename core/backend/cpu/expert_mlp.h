// The CPU backend's expert MLPs (Ops::expert_mlp_forward / expert_mlp_backward): each expert's whole sequence, its
// GEMMs and its SwiGLU, one expert after another, instead of one op over all the experts after another. The experts
// are scheduled as the grouped GEMM's groups are (parallel_kernels.h GroupSchedule): those too large to share run
// one at a time with every op on all threads; the rest run concurrently, each expert's sequence on one thread,
// largest first. The same calls on the same operands as op after op, so the same bits (test_core_cpu_threads
// compares the two); what changes is that a block's activations are still in its thread's cache when the next op
// reads them, and that one parallel region replaces four in the forward and seven in the backward.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "core/backend/cpu/parallel_kernels.h"
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

// The SwiGLU over n in blocks of kSwigluBlock, the blocks shared among the threads where there are several here.
constexpr int64_t kSwigluBlock = 256;

// h = silu(a) * b over n (at most kSwigluBlock) as swiglu_forward_span computes it, held rounded.
template <typename T>
void swiglu_forward_rounded_span(const T* a, const T* b, Rounded<T>* h, int64_t n) {
  T value[kSwigluBlock];
  swiglu_forward_span(a, b, value, n);
  for (int64_t i = 0; i < n; ++i) h[i] = to_rounded(value[i]);
}

template <typename T>
void swiglu_forward_blocks(const T* a, const T* b, T* h, int64_t n) {
#pragma omp parallel for schedule(static) if (usable_threads() > 1)
  for (int64_t first = 0; first < n; first += kSwigluBlock)
    swiglu_forward_span(a + first, b + first, h + first, std::min(kSwigluBlock, n - first));
}

template <typename T>
void swiglu_backward_blocks(const T* a, const T* b, const T* dh, T* da, T* db, int64_t n) {
#pragma omp parallel for schedule(static) if (usable_threads() > 1)
  for (int64_t first = 0; first < n; first += kSwigluBlock)
    swiglu_backward_span(a + first, b + first, dh + first, da + first, db + first, std::min(kSwigluBlock, n - first));
}

// The SwiGLU's forward in blocks (above), h as stored or (kRounded) held rounded.
template <typename T, bool kRounded>
void swiglu_forward_as(const T* a, const T* b, std::conditional_t<kRounded, Rounded<T>, T>* h, int64_t n) {
  if constexpr (kRounded) {
#pragma omp parallel for schedule(static) if (usable_threads() > 1)
    for (int64_t first = 0; first < n; first += kSwigluBlock)
      swiglu_forward_rounded_span(a + first, b + first, h + first, std::min(kSwigluBlock, n - first));
  } else {
    swiglu_forward_blocks(a, b, h, n);
  }
}

// Expert g's forward over its block of rows: a = x W1, b = x W3, h = silu(a) * b, y = h W2. Outside a parallel
// region each op takes all threads (the GEMMs by their blocks); inside one, the calling thread alone.
// With kRounded, x and h are held rounded (Ops::expert_mlp_forward_rounded).
template <typename T, bool kRounded = false, typename X = std::conditional_t<kRounded, Rounded<T>, T>>
void expert_forward(const GemmInputs<T>& p, const typename Ops<T>::ExpertMlp& e, int64_t g, const X* x, T* a, T* b,
                    X* h, T* y) {
  const int64_t D = e.D, F = e.F, first = e.row_offset[g] * F, n = (e.row_offset[g + 1] - e.row_offset[g]) * F;
  const int64_t* off = e.row_offset;
  const GemmInputs<T> w = p.with_weight(GemmWeight::B);                       // the weight stacks
  grouped_gemm_group(w, false, false, g, off, F, D, T(1), x, e.w1, T(0), a);  // a = x W1
  grouped_gemm_group(w, false, false, g, off, F, D, T(1), x, e.w3, T(0), b);  // b = x W3
  swiglu_forward_as<T, kRounded>(a + first, b + first, h + first, n);
  grouped_gemm_group(w, false, false, g, off, D, F, T(1), h, e.w2, T(0), y);  // y = h W2
}

// Expert g's backward (Ops::expert_mlp_backward), as expert_forward (X: how x and h are held).
template <typename T, typename X = T>
void expert_backward(const GemmInputs<T>& p, const typename Ops<T>::ExpertMlp& e, int64_t g, const X* x, const T* a,
                     const T* b, const X* h, const T* dy, T* dh, T* da, T* db, T* dx) {
  const int64_t D = e.D, F = e.F, first = e.row_offset[g] * F, n = (e.row_offset[g + 1] - e.row_offset[g]) * F;
  const int64_t* off = e.row_offset;
  const GemmInputs<T> w = p.with_weight(GemmWeight::B);                        // the weight stacks
  grouped_gemm_group(p, true, false, g, off, D, F, T(1), h, dy, T(1), e.dw2);  // dW2 += h^T dy
  grouped_gemm_group(w, false, true, g, off, F, D, T(1), dy, e.w2, T(0), dh);  // dh = dy W2^T
  swiglu_backward_blocks(a + first, b + first, dh + first, da + first, db + first, n);
  grouped_gemm_group(p, true, false, g, off, F, D, T(1), x, da, T(1), e.dw1);  // dW1 += x^T da
  grouped_gemm_group(p, true, false, g, off, F, D, T(1), x, db, T(1), e.dw3);  // dW3 += x^T db
  grouped_gemm_group(w, false, true, g, off, D, F, T(1), da, e.w1, T(0), dx);  // dx = da W1^T
  grouped_gemm_group(w, false, true, g, off, D, F, T(1), db, e.w3, T(1), dx);  //    + db W3^T
}

// Ops::expert_mlp_forward: the experts too large to share (GroupSchedule) one after another on all threads, then
// the rest concurrently, each expert's whole sequence on one thread.
// kRounded: x and h held rounded (Ops::expert_mlp_forward_rounded).
template <typename T, bool kRounded = false, typename X = std::conditional_t<kRounded, Rounded<T>, T>>
void expert_mlp_forward(const GemmInputs<T>& p, const typename Ops<T>::ExpertMlp& e, const X* x, T* a, T* b, X* h,
                        T* y) {
  const GroupSchedule s = schedule_groups(e.groups, e.row_offset);
  for (int64_t g : s.alone) expert_forward<T, kRounded>(p, e, g, x, a, b, h, y);
  run_groups(s.shared, [&](int64_t g) { expert_forward<T, kRounded>(p, e, g, x, a, b, h, y); });
}

// Ops::expert_mlp_backward, as expert_mlp_forward.
template <typename T, typename X = T>
void expert_mlp_backward(const GemmInputs<T>& p, const typename Ops<T>::ExpertMlp& e, const X* x, const T* a,
                         const T* b, const X* h, const T* dy, T* dh, T* da, T* db, T* dx) {
  const GroupSchedule s = schedule_groups(e.groups, e.row_offset);
  for (int64_t g : s.alone) expert_backward<T, X>(p, e, g, x, a, b, h, dy, dh, da, db, dx);
  run_groups(s.shared, [&](int64_t g) { expert_backward<T, X>(p, e, g, x, a, b, h, dy, dh, da, db, dx); });
}

}  // namespace moe::cpu
