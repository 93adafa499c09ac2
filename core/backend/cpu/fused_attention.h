// The CPU backend's fused causal attention (Ops::attention_forward_fused / attention_backward_fused): the
// reference the CUDA backend's cuDNN flash attention is tested against. It keeps no probabilities between
// forward and backward, only each row's log-sum-exp; inside a call it works on one head's (T, T) block at a time
// in buffers of the calling thread, with the plain form's GEMMs (so under bf16 GEMMs its four products read
// bf16-rounded operands the same way) and the same split among threads (parallel_kernels.h), so its result does
// not depend on the thread count. Its forward is the plain forward's arithmetic, the same bits.
#pragma once

#include <omp.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "core/backend/cpu/parallel_kernels.h"
#include "core/backend/cpu/vector_math.h"
#include "core/dtype.h"

namespace moe::cpu {

// One head's forward: S = scale Q K^T in `block` (T, T), its causal softmax rows (stats: their log-sum-exp),
// O = P V. rows_parallel: the rows split among threads (when heads are not).
template <bool kRounded, typename T, typename X>
void fused_head_forward(const AttentionShape& s, int64_t bh, const X* q, const X* k, const X* v,
                        Stored<T, kRounded>* out, T* stats, T* block, bool rows_parallel) {
  const int64_t off = s.offset(bh), D = s.D(), T_ = s.T;
  const GemmInputs<T> p{s.precision};
  T* lse = stats + bh * T_;
  gemm_at(p, false, true, T_, T_, s.Dh, T(s.scale()), q + off, D, k + off, D, T(0), block, T_);
#pragma omp parallel for schedule(static) if (rows_parallel)
  for (int64_t i = 0; i < T_; ++i) lse[i] = T(causal_softmax_row(block + i * T_, i, T_));
  gemm_into<kRounded>(p, false, false, T_, s.Dh, T_, T(1), block, T_, v + off, D, out + off, D);
}

// Row i of P = exp(S - lse_i) over j <= i, zero after, in place on the scores; the exponentials all at once
// (cpu/vector_math.h).
template <typename T>
void probabilities_row(T* row, int64_t i, int64_t T_, double lse) {
  const double* e = exp_shifted(row, lse, i + 1);
  for (int64_t j = 0; j <= i; ++j) row[j] = T(e[j]);
  for (int64_t j = i + 1; j < T_; ++j) row[j] = T(0);
}

// An operand of D_i as the products read it: rounded to bf16 under bf16 GEMMs (already, where it is held rounded).
template <typename X>
double product_operand(X x, bool bf16) {
  if constexpr (std::is_same_v<X, moe::bf16>)
    return double(bf16_to_float(x));
  else
    return bf16 ? double(round_to_bf16(x)) : double(x);
}

// Row i of dS = P * (dP - D_i) * scale in place on dP, with D_i = dO_i . O_i (both read as the products read
// them: rounded to bf16 under bf16 GEMMs), in double. O: out as stored or held rounded.
template <typename T, typename O>
void fused_softmax_backward_row(const AttentionShape& s, const T* p, T* d, const T* dout_i, const O* out_i, int64_t i) {
  const bool bf16 = s.precision == GemmPrecision::Bf16;
  double D_i = 0;
  for (int64_t c = 0; c < s.Dh; ++c) D_i += product_operand(dout_i[c], bf16) * product_operand(out_i[c], bf16);
  const double scale = s.scale();
  for (int64_t j = 0; j <= i; ++j) d[j] = T(double(p[j]) * (double(d[j]) - D_i) * scale);
  for (int64_t j = i + 1; j < s.T; ++j) d[j] = T(0);
}

// One head's backward with two (T, T) buffers of the calling thread: P recomputed into `probs`, dP then dS in
// `grad`.
template <typename T, typename X, typename O>
void fused_head_backward(const AttentionShape& s, int64_t bh, const X* q, const X* k, const X* v, const O* out,
                         const T* stats, const T* dout, T* dq, T* dk, T* dv, T* probs, T* grad, bool rows_parallel) {
  const int64_t off = s.offset(bh), D = s.D(), T_ = s.T, Dh = s.Dh;
  const GemmInputs<T> p{s.precision};
  const T* lse = stats + bh * T_;
  gemm_at(p, false, true, T_, T_, Dh, T(s.scale()), q + off, D, k + off, D, T(0), probs, T_);  // S
#pragma omp parallel for schedule(static) if (rows_parallel)
  for (int64_t i = 0; i < T_; ++i) probabilities_row(probs + i * T_, i, T_, double(lse[i]));
  gemm_at(p, false, true, T_, T_, Dh, T(1), dout + off, D, v + off, D, T(0), grad, T_);    // dP = dO V^T
  gemm_at(p, true, false, T_, Dh, T_, T(1), probs, T_, dout + off, D, T(0), dv + off, D);  // dV = P^T dO
#pragma omp parallel for schedule(static) if (rows_parallel)
  for (int64_t i = 0; i < T_; ++i)
    fused_softmax_backward_row(s, probs + i * T_, grad + i * T_, dout + off + i * D, out + off + i * D, i);
  gemm_at(p, false, false, T_, Dh, T_, T(1), grad, T_, k + off, D, T(0), dq + off, D);  // dQ = dS K
  gemm_at(p, true, false, T_, Dh, T_, T(1), grad, T_, q + off, D, T(0), dk + off, D);   // dK = dS^T Q
}

// Heads concurrently, each thread with its own buffers, or one at a time on all threads, as the plain form.
template <bool kRounded, typename T, typename X>
void fused_attention_forward(const AttentionShape& s, const X* q, const X* k, const X* v, Stored<T, kRounded>* out,
                             T* stats) {
  const int threads = usable_threads();
  const int64_t heads = s.B * s.H;
  if (!heads_in_parallel(s, threads)) {
    std::vector<T> block(size_t(s.T * s.T));
    for (int64_t bh = 0; bh < heads; ++bh)
      fused_head_forward<kRounded>(s, bh, q, k, v, out, stats, block.data(), threads > 1);
    return;
  }
#pragma omp parallel
  {
    std::vector<T> block(size_t(s.T * s.T));
#pragma omp for schedule(dynamic, 1)
    for (int64_t bh = 0; bh < heads; ++bh)
      fused_head_forward<kRounded>(s, bh, q, k, v, out, stats, block.data(), false);
  }
}

template <typename T, typename X, typename O>
void fused_attention_backward(const AttentionShape& s, const X* q, const X* k, const X* v, const O* out, const T* stats,
                              const T* dout, T* dq, T* dk, T* dv) {
  const int threads = usable_threads();
  const int64_t heads = s.B * s.H;
  const size_t block = size_t(s.T * s.T);
  if (!heads_in_parallel(s, threads)) {
    std::vector<T> probs(block), grad(block);
    for (int64_t bh = 0; bh < heads; ++bh)
      fused_head_backward(s, bh, q, k, v, out, stats, dout, dq, dk, dv, probs.data(), grad.data(), threads > 1);
    return;
  }
#pragma omp parallel
  {
    std::vector<T> probs(block), grad(block);
#pragma omp for schedule(dynamic, 1)
    for (int64_t bh = 0; bh < heads; ++bh)
      fused_head_backward(s, bh, q, k, v, out, stats, dout, dq, dk, dv, probs.data(), grad.data(), false);
  }
}

}  // namespace moe::cpu
