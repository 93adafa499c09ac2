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

// f(r, j, m) for the spans of at most kSwigluBlock columns [j, j + m) of rows r < rows of F columns, the spans shared
// among the threads where there are several here.
template <typename Fn>
void for_each_span(int64_t rows, int64_t F, Fn&& f) {
  const int64_t per_row = (F + kSwigluBlock - 1) / kSwigluBlock, spans = rows * per_row;
#pragma omp parallel for schedule(static) if (usable_threads() > 1)
  for (int64_t s = 0; s < spans; ++s) {
    const int64_t r = s / per_row, j = (s % per_row) * kSwigluBlock;
    f(r, j, std::min(kSwigluBlock, F - j));
  }
}

// The gated unit over rows of ab (rows, 2F: [a | b]) into h (rows, F) (Ops::swiglu_forward), in spans (above), as
// stored or (kRounded) held rounded.
template <typename T, bool kRounded, typename X = std::conditional_t<kRounded, Rounded<T>, T>>
void swiglu_forward_as(const X* ab, X* h, int64_t rows, int64_t F) {
  for_each_span(rows, F, [&](int64_t r, int64_t j, int64_t m) {
    const X* a = ab + r * 2 * F + j;
    if constexpr (kRounded)
      swiglu_forward_rounded_span<T>(a, a + F, h + r * F + j, m);
    else
      swiglu_forward_span(a, a + F, h + r * F + j, m);
  });
}
// Its backward: dab (rows, 2F: [da | db]) from ab and dh (rows, F) (Ops::swiglu_backward).
template <typename T, bool kRounded, typename X = std::conditional_t<kRounded, Rounded<T>, T>>
void swiglu_backward_as(const X* ab, const T* dh, X* dab, int64_t rows, int64_t F) {
  for_each_span(rows, F, [&](int64_t r, int64_t j, int64_t m) {
    const X* a = ab + r * 2 * F + j;
    X* da = dab + r * 2 * F + j;
    if constexpr (kRounded)
      swiglu_backward_rounded_span<T>(a, a + F, dh + r * F + j, da, da + F, m);
    else
      swiglu_backward_span(a, a + F, dh + r * F + j, da, da + F, m);
  });
}

// Expert g's forward over its block of rows: [a | b] = x W13, h = silu(a) * b, y = h W2. Outside a parallel region
// each op takes all threads (the GEMMs by their blocks); inside one, the calling thread alone. kRounded: x, ab and h
// held rounded (Ops::expert_mlp_forward_rounded), ab as its GEMM's results are stored.
template <typename T, bool kRounded = false, typename X = std::conditional_t<kRounded, Rounded<T>, T>>
void expert_forward(const GemmInputs<T>& p, const typename Ops<T>::ExpertMlp& e, int64_t g, const X* x, X* ab, X* h,
                    T* y) {
  const int64_t D = e.D, F = e.F, first = e.row_offset[g], rows = e.row_offset[g + 1] - first;
  const int64_t* off = e.row_offset;
  const GemmInputs<T> w = p.with_weight(GemmWeight::B);  // the weight stacks
  if constexpr (kRounded)
    grouped_gemm_group_rounded(w, false, g, off, 2 * F, D, T(1), x, e.w13, ab);  // [a | b] = x W13
  else
    grouped_gemm_group(w, false, false, g, off, 2 * F, D, T(1), x, e.w13, T(0), ab);
  swiglu_forward_as<T, kRounded>(ab + first * 2 * F, h + first * F, rows, F);
  grouped_gemm_group(w, false, false, g, off, D, F, T(1), h, e.w2, T(0), y);  // y = h W2
}

// Expert g's backward (Ops::expert_mlp_backward and, kRounded, expert_mlp_backward_rounded: its dy rows rounded once
// into dy_held, dab written rounded by the SwiGLU's backward, every GEMM reading them as they are), as expert_forward.
template <typename T, bool kRounded = false, typename X = std::conditional_t<kRounded, Rounded<T>, T>>
void expert_backward(const GemmInputs<T>& p, const typename Ops<T>::ExpertMlp& e, int64_t g, const X* x, const X* ab,
                     const X* h, const T* dy, X* dy_held, T* dh, X* dab, T* dx) {
  const int64_t D = e.D, F = e.F, first = e.row_offset[g], rows = e.row_offset[g + 1] - first;
  const int64_t* off = e.row_offset;
  const GemmInputs<T> w = p.with_weight(GemmWeight::B);  // the weight stacks
  const X* dyx = dy_held;
  if constexpr (kRounded)
    for (int64_t i = first * D; i < (first + rows) * D; ++i) dy_held[i] = to_rounded(dy[i]);
  else
    dyx = dy;
  grouped_gemm_group(p, true, false, g, off, D, F, T(1), h, dyx, T(1), e.dw2);  // dW2 += h^T dy
  grouped_gemm_group(w, false, true, g, off, F, D, T(1), dyx, e.w2, T(0), dh);  // dh = dy W2^T
  swiglu_backward_as<T, kRounded>(ab + first * 2 * F, dh + first * F, dab + first * 2 * F, rows, F);
  grouped_gemm_group(p, true, false, g, off, 2 * F, D, T(1), x, dab, T(1), e.dw13);  // dW13 += x^T [da | db]
  grouped_gemm_group(w, false, true, g, off, D, 2 * F, T(1), dab, e.w13, T(0), dx);  // dx = [da | db] W13^T
}

// Ops::expert_mlp_forward (kRounded: _rounded): the experts too large to share (GroupSchedule) one after another on
// all threads, then the rest concurrently, each expert's whole sequence on one thread.
template <typename T, bool kRounded = false, typename X = std::conditional_t<kRounded, Rounded<T>, T>>
void expert_mlp_forward(const GemmInputs<T>& p, const typename Ops<T>::ExpertMlp& e, const X* x, X* ab, X* h, T* y) {
  const GroupSchedule s = schedule_groups(e.groups, e.row_offset);
  for (int64_t g : s.alone) expert_forward<T, kRounded>(p, e, g, x, ab, h, y);
  run_groups(s.shared, [&](int64_t g) { expert_forward<T, kRounded>(p, e, g, x, ab, h, y); });
}

// Ops::expert_mlp_backward (kRounded: _rounded, dy_held written), as expert_mlp_forward.
template <typename T, bool kRounded = false, typename X = std::conditional_t<kRounded, Rounded<T>, T>>
void expert_mlp_backward(const GemmInputs<T>& p, const typename Ops<T>::ExpertMlp& e, const X* x, const X* ab,
                         const X* h, const T* dy, X* dy_held, T* dh, X* dab, T* dx) {
  const GroupSchedule s = schedule_groups(e.groups, e.row_offset);
  for (int64_t g : s.alone) expert_backward<T, kRounded>(p, e, g, x, ab, h, dy, dy_held, dh, dab, dx);
  run_groups(s.shared, [&](int64_t g) { expert_backward<T, kRounded>(p, e, g, x, ab, h, dy, dy_held, dh, dab, dx); });
}

}  // namespace moe::cpu
