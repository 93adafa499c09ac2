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

// The values of n (at most kSwigluBlock) held-rounded elements, in `out`.
template <typename T>
void held_values(const Rounded<T>* x, T* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = from_rounded<T>(x[i]);
}

// h = silu(a) * b over n (at most kSwigluBlock) held-rounded a and b, as swiglu_forward_span computes it on their
// values, held rounded.
template <typename T>
void swiglu_forward_rounded_span(const Rounded<T>* a, const Rounded<T>* b, Rounded<T>* h, int64_t n) {
  T av[kSwigluBlock], bv[kSwigluBlock], value[kSwigluBlock];
  held_values(a, av, n), held_values(b, bv, n);
  swiglu_forward_span(av, bv, value, n);
  for (int64_t i = 0; i < n; ++i) h[i] = to_rounded(value[i]);
}

// swiglu_backward_span on held-rounded a and b (n at most kSwigluBlock), da and db held rounded.
template <typename T>
void swiglu_backward_rounded_span(const Rounded<T>* a, const Rounded<T>* b, const T* dh, Rounded<T>* da, Rounded<T>* db,
                                  int64_t n) {
  T av[kSwigluBlock], bv[kSwigluBlock], dav[kSwigluBlock], dbv[kSwigluBlock];
  held_values(a, av, n), held_values(b, bv, n);
  swiglu_backward_span(av, bv, dh, dav, dbv, n);
  for (int64_t i = 0; i < n; ++i) da[i] = to_rounded(dav[i]), db[i] = to_rounded(dbv[i]);
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

// The SwiGLU in blocks (above), a, b and h as stored or (kRounded) held rounded.
template <typename T, bool kRounded, typename X = std::conditional_t<kRounded, Rounded<T>, T>>
void swiglu_forward_as(const X* a, const X* b, X* h, int64_t n) {
  if constexpr (kRounded) {
#pragma omp parallel for schedule(static) if (usable_threads() > 1)
    for (int64_t first = 0; first < n; first += kSwigluBlock)
      swiglu_forward_rounded_span<T>(a + first, b + first, h + first, std::min(kSwigluBlock, n - first));
  } else {
    swiglu_forward_blocks(a, b, h, n);
  }
}
template <typename T, bool kRounded, typename X = std::conditional_t<kRounded, Rounded<T>, T>>
void swiglu_backward_as(const X* a, const X* b, const T* dh, X* da, X* db, int64_t n) {
  if constexpr (kRounded) {
#pragma omp parallel for schedule(static) if (usable_threads() > 1)
    for (int64_t first = 0; first < n; first += kSwigluBlock)
      swiglu_backward_rounded_span<T>(a + first, b + first, dh + first, da + first, db + first,
                                      std::min(kSwigluBlock, n - first));
  } else {
    swiglu_backward_blocks(a, b, dh, da, db, n);
  }
}

// Expert g's forward over its block of rows: a = x W1, b = x W3, h = silu(a) * b, y = h W2. Outside a parallel
// region each op takes all threads (the GEMMs by their blocks); inside one, the calling thread alone. kRounded: x,
// a, b and h held rounded (Ops::expert_mlp_forward_rounded), a and b as their GEMMs' results are stored.
template <typename T, bool kRounded = false, typename X = std::conditional_t<kRounded, Rounded<T>, T>>
void expert_forward(const GemmInputs<T>& p, const typename Ops<T>::ExpertMlp& e, int64_t g, const X* x, X* a, X* b,
                    X* h, T* y) {
  const int64_t D = e.D, F = e.F, first = e.row_offset[g] * F, n = (e.row_offset[g + 1] - e.row_offset[g]) * F;
  const int64_t* off = e.row_offset;
  const GemmInputs<T> w = p.with_weight(GemmWeight::B);  // the weight stacks
  if constexpr (kRounded) {
    grouped_gemm_group_rounded(w, false, g, off, F, D, T(1), x, e.w1, a);  // a = x W1
    grouped_gemm_group_rounded(w, false, g, off, F, D, T(1), x, e.w3, b);  // b = x W3
  } else {
    grouped_gemm_group(w, false, false, g, off, F, D, T(1), x, e.w1, T(0), a);
    grouped_gemm_group(w, false, false, g, off, F, D, T(1), x, e.w3, T(0), b);
  }
  swiglu_forward_as<T, kRounded>(a + first, b + first, h + first, n);
  grouped_gemm_group(w, false, false, g, off, D, F, T(1), h, e.w2, T(0), y);  // y = h W2
}

// Expert g's backward (Ops::expert_mlp_backward), as expert_forward.
template <typename T>
void expert_backward(const GemmInputs<T>& p, const typename Ops<T>::ExpertMlp& e, int64_t g, const T* x, const T* a,
                     const T* b, const T* h, const T* dy, T* dh, T* da, T* db, T* dx) {
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

// Expert g's backward on held-rounded tensors (Ops::expert_mlp_backward_rounded): its dy rows rounded once into
// dy_held, da and db written rounded by the SwiGLU's backward, every GEMM reading them as they are.
template <typename T, typename R = Rounded<T>>
void expert_backward_rounded(const GemmInputs<T>& p, const typename Ops<T>::ExpertMlp& e, int64_t g, const R* x,
                             const R* a, const R* b, const R* h, const T* dy, R* dy_held, T* dh, R* da, R* db, T* dx) {
  const int64_t D = e.D, F = e.F, rows = e.row_offset[g + 1] - e.row_offset[g], first = e.row_offset[g] * F,
                n = rows * F;
  const int64_t* off = e.row_offset;
  const GemmInputs<T> w = p.with_weight(GemmWeight::B);  // the weight stacks
  for (int64_t i = e.row_offset[g] * D; i < e.row_offset[g + 1] * D; ++i) dy_held[i] = to_rounded(dy[i]);
  grouped_gemm_group(p, true, false, g, off, D, F, T(1), h, dy_held, T(1), e.dw2);  // dW2 += h^T dy
  grouped_gemm_group(w, false, true, g, off, F, D, T(1), dy_held, e.w2, T(0), dh);  // dh = dy W2^T
  swiglu_backward_as<T, true>(a + first, b + first, dh + first, da + first, db + first, n);
  grouped_gemm_group(p, true, false, g, off, F, D, T(1), x, da, T(1), e.dw1);  // dW1 += x^T da
  grouped_gemm_group(p, true, false, g, off, F, D, T(1), x, db, T(1), e.dw3);  // dW3 += x^T db
  grouped_gemm_group(w, false, true, g, off, D, F, T(1), da, e.w1, T(0), dx);  // dx = da W1^T
  grouped_gemm_group(w, false, true, g, off, D, F, T(1), db, e.w3, T(1), dx);  //    + db W3^T
}

// Ops::expert_mlp_forward (kRounded: _rounded): the experts too large to share (GroupSchedule) one after another on
// all threads, then the rest concurrently, each expert's whole sequence on one thread.
template <typename T, bool kRounded = false, typename X = std::conditional_t<kRounded, Rounded<T>, T>>
void expert_mlp_forward(const GemmInputs<T>& p, const typename Ops<T>::ExpertMlp& e, const X* x, X* a, X* b, X* h,
                        T* y) {
  const GroupSchedule s = schedule_groups(e.groups, e.row_offset);
  for (int64_t g : s.alone) expert_forward<T, kRounded>(p, e, g, x, a, b, h, y);
  run_groups(s.shared, [&](int64_t g) { expert_forward<T, kRounded>(p, e, g, x, a, b, h, y); });
}

// Ops::expert_mlp_backward, as expert_mlp_forward.
template <typename T>
void expert_mlp_backward(const GemmInputs<T>& p, const typename Ops<T>::ExpertMlp& e, const T* x, const T* a,
                         const T* b, const T* h, const T* dy, T* dh, T* da, T* db, T* dx) {
  const GroupSchedule s = schedule_groups(e.groups, e.row_offset);
  for (int64_t g : s.alone) expert_backward(p, e, g, x, a, b, h, dy, dh, da, db, dx);
  run_groups(s.shared, [&](int64_t g) { expert_backward(p, e, g, x, a, b, h, dy, dh, da, db, dx); });
}

// Ops::expert_mlp_backward_rounded, as expert_mlp_forward.
template <typename T, typename R = Rounded<T>>
void expert_mlp_backward_rounded(const GemmInputs<T>& p, const typename Ops<T>::ExpertMlp& e, const R* x, const R* a,
                                 const R* b, const R* h, const T* dy, R* dy_held, T* dh, R* da, R* db, T* dx) {
  const GroupSchedule s = schedule_groups(e.groups, e.row_offset);
  for (int64_t g : s.alone) expert_backward_rounded(p, e, g, x, a, b, h, dy, dy_held, dh, da, db, dx);
  run_groups(s.shared, [&](int64_t g) { expert_backward_rounded(p, e, g, x, a, b, h, dy, dy_held, dh, da, db, dx); });
}

}  // namespace moe::cpu
