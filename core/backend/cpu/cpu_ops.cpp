// The CPU backend: the reference implementation of every op of core/backend/ops.h, on OpenBLAS (gemm)
// and OpenMP (everything else). Every reduction runs in a fixed order that does not depend on the thread
// count, GEMMs included (each is the same single-threaded OpenBLAS calls at any thread count,
// parallel_kernels.h), so a run gives the same bits at any thread count.
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <new>
#include <type_traits>
#include <vector>

#include "core/backend/backend.h"
#include "core/backend/cpu/expert_mlp.h"
#include "core/backend/cpu/fused_attention.h"
#include "core/backend/cpu/moe_kernels.h"
#include "core/backend/cpu/parallel_kernels.h"
#include "core/backend/cpu/router_kernels.h"
#include "core/backend/cpu/thread_policy.h"
#include "core/backend/cpu/vector_math.h"
#include "core/backend/ops.h"
#include "core/error.h"
#include "core/moe/dispatch_order.h"

namespace moe {
namespace {

constexpr double kRmsEps = 1e-5;
constexpr double kRopeBase = 10000.0;
// Reductions are cut into chunks of this size whatever the thread count, then summed in order.
constexpr int64_t kReduceChunk = 4096;
// Copies and fills of at least kParallelMove elements are split among threads in chunks of kMoveChunk.
constexpr int64_t kParallelMove = int64_t(1) << 16;
constexpr int64_t kMoveChunk = int64_t(1) << 14;

template <typename T>
class CpuOps final : public Ops<T> {
 public:
  CpuOps() { this->set_fused_attention(false); }
  const char* name() const override { return "cpu"; }

  void run_gemm(const typename Ops<T>::Gemm& g) override {
    if (g.M == 0 || g.N == 0) return;
    if (g.K == 0) {  // BLAS leaves C untouched for K == 0 only when beta == 1
      for (int64_t i = 0; i < g.M; ++i)
        for (int64_t j = 0; j < g.N; ++j) g.C[i * g.ldc + j] = g.beta == T(0) ? T(0) : g.beta * g.C[i * g.ldc + j];
      return;
    }
    const cpu::GemmInputs<T> in = gemm_inputs(g.precision, g.weight);
    auto with_a = [&](const auto* A) {
      if (g.B_rounded)
        return cpu::gemm_at(in, g.trans_a, g.trans_b, g.M, g.N, g.K, g.alpha, A, g.lda, g.B_rounded, g.ldb, g.beta, g.C,
                            g.ldc);
      cpu::gemm_at(in, g.trans_a, g.trans_b, g.M, g.N, g.K, g.alpha, A, g.lda, g.B, g.ldb, g.beta, g.C, g.ldc);
    };
    if (g.A_rounded)
      with_a(g.A_rounded);
    else
      with_a(g.A);
  }

  void embedding_forward(const int32_t* tokens, const T* table, int64_t first, int64_t rows, T* out, int64_t N,
                         int64_t D) override {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < N; ++i) {
      const int64_t row = int64_t(tokens[i]) - first;
      if (row >= 0 && row < rows)
        std::copy_n(table + row * D, D, out + i * D);
      else
        std::fill_n(out + i * D, D, T(0));
    }
  }

  void embedding_backward(const int32_t* tokens, const T* dout, int64_t first, int64_t rows, T* dtable, int64_t N,
                          int64_t D) override {
    // Columns are split among threads; each column sums its rows in token order (deterministic).
    constexpr int64_t kCols = 16;
    const int64_t blocks = (D + kCols - 1) / kCols;
#pragma omp parallel for schedule(static)
    for (int64_t blk = 0; blk < blocks; ++blk) {
      const int64_t c0 = blk * kCols, c1 = std::min(D, c0 + kCols);
      for (int64_t i = 0; i < N; ++i) {
        const int64_t id = int64_t(tokens[i]) - first;
        if (id < 0 || id >= rows) continue;
        T* row = dtable + id * D;
        const T* g = dout + i * D;
        for (int64_t c = c0; c < c1; ++c) row[c] += g[c];
      }
    }
  }

  void rmsnorm_forward(const T* x, const T* gain, T* y, T* rstd, int64_t N, int64_t D) override {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < N; ++i) rmsnorm_row(x + i * D, gain, y + i * D, rstd + i, D);
  }
  void rmsnorm_forward_residual(const T* x, const T* r, T* sum, const T* gain, T* y, T* rstd, int64_t N,
                                int64_t D) override {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < N; ++i)
      residual_norm_row(x + i * D, r ? r + i * D : nullptr, sum + i * D, gain, y + i * D, rstd + i, D);
  }
  void rmsnorm_forward_residual_rounded(const T* x, const T* r, T* sum, const T* gain, Rounded<T>* y, T* rstd,
                                        int64_t N, int64_t D) override {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < N; ++i) {
      thread_local std::vector<T> row;
      row.resize(size_t(D));
      residual_norm_row(x + i * D, r ? r + i * D : nullptr, sum + i * D, gain, row.data(), rstd + i, D);
      for (int64_t j = 0; j < D; ++j) y[i * D + j] = to_rounded(row[size_t(j)]);
    }
  }

  void rmsnorm_backward(const T* x, const T* gain, const T* rstd, const T* dy, T* dx, T* dgain, int64_t N,
                        int64_t D) override {
    rmsnorm_backward_rows(x, gain, rstd, dy, dx, dgain, N, D, false);
  }
  void rmsnorm_backward_add(const T* x, const T* gain, const T* rstd, const T* dy, T* dres, T* dgain, int64_t N,
                            int64_t D) override {
    rmsnorm_backward_rows(x, gain, rstd, dy, dres, dgain, N, D, true);
  }
  // si = xi + ri (ri null: a copy of xi), then its norm, the row still in cache.
  static void residual_norm_row(const T* xi, const T* ri, T* si, const T* gain, T* yi, T* rstd, int64_t D) {
    if (ri)
      for (int64_t j = 0; j < D; ++j) si[j] = xi[j] + ri[j];
    else
      std::copy(xi, xi + D, si);
    rmsnorm_row(si, gain, yi, rstd, D);
  }
  // One row of rmsnorm_forward: y = x rstd gain, rstd from the sum of squares in double.
  static void rmsnorm_row(const T* xi, const T* gain, T* yi, T* rstd, int64_t D) {
    double ss = 0;
    for (int64_t j = 0; j < D; ++j) ss += double(xi[j]) * xi[j];
    const T r = T(1.0 / std::sqrt(ss / double(D) + kRmsEps));
    *rstd = r;
    for (int64_t j = 0; j < D; ++j) yi[j] = xi[j] * r * gain[j];
  }
  // rmsnorm_backward's dx written, or (accumulate) added to dx after its rounding to T: the bits of writing it and
  // then add_inplace.
  static void rmsnorm_backward_rows(const T* x, const T* gain, const T* rstd, const T* dy, T* dx, T* dgain, int64_t N,
                                    int64_t D, bool accumulate) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < N; ++i) {
      const T* xi = x + i * D;
      const T* gi = dy + i * D;
      const double r = rstd[i];
      double dot = 0;  // sum_j gain_j dy_j x_j
      for (int64_t j = 0; j < D; ++j) dot += double(gain[j]) * gi[j] * xi[j];
      const double c = r * r * r * dot / double(D);
      T* dxi = dx + i * D;
      if (accumulate)
        for (int64_t j = 0; j < D; ++j) dxi[j] += T(r * gain[j] * gi[j] - c * xi[j]);
      else
        for (int64_t j = 0; j < D; ++j) dxi[j] = T(r * gain[j] * gi[j] - c * xi[j]);
    }
    constexpr int64_t kCols = 16;
    const int64_t blocks = (D + kCols - 1) / kCols;
#pragma omp parallel for schedule(static)
    for (int64_t blk = 0; blk < blocks; ++blk) {
      const int64_t c0 = blk * kCols, c1 = std::min(D, c0 + kCols);
      double acc[kCols] = {};
      for (int64_t i = 0; i < N; ++i)
        for (int64_t c = c0; c < c1; ++c) acc[c - c0] += double(dy[i * D + c]) * x[i * D + c] * rstd[i];
      for (int64_t c = c0; c < c1; ++c) dgain[c] += T(acc[c - c0]);
    }
  }

  void rope(T* x, int64_t B, int64_t T_, int64_t H, int64_t Dh, bool inverse) override {
    rotate<false>(x, x, B, T_, H, Dh, inverse);
  }
  void rope_rounded(const T* x, Rounded<T>* y, int64_t B, int64_t T_, int64_t H, int64_t Dh, bool inverse) override {
    rotate<true>(x, y, B, T_, H, Dh, inverse);
  }

  void expand_heads(const T* x, T* y, int64_t N, int64_t Hkv, int64_t group, int64_t Dh) override {
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; ++n)
      for (int64_t h = 0; h < Hkv; ++h)
        for (int64_t g = 0; g < group; ++g)
          std::copy_n(x + (n * Hkv + h) * Dh, Dh, y + ((n * Hkv + h) * group + g) * Dh);
  }
  void expand_heads_backward(const T* dy, T* dx, int64_t N, int64_t Hkv, int64_t group, int64_t Dh) override {
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; ++n)
      for (int64_t h = 0; h < Hkv; ++h) {
        T* out = dx + (n * Hkv + h) * Dh;
        const T* in = dy + (n * Hkv + h) * group * Dh;
        std::copy_n(in, Dh, out);
        for (int64_t g = 1; g < group; ++g)
          for (int64_t d = 0; d < Dh; ++d) out[d] += in[g * Dh + d];
      }
  }

  void attention_forward(const AttentionForwardArgs<T>& a) override {
    check_attention_operands(a, "attention_forward");
    with_operands(a, [&](auto q, auto k, auto v, auto rounded, auto out) {
      cpu::attention_forward<decltype(rounded)::value>(a.shape, q, k, v, out, a.probs);
    });
  }
  void attention_backward(const AttentionBackwardArgs<T>& a) override {
    check_attention_operands(a, "attention_backward");
    with_inputs(a, [&](auto q, auto k, auto v) {
      cpu::attention_backward(a.shape, q, k, v, a.probs, a.dout, a.dq, a.dk, a.dv, a.scratch);
    });
  }

  // The fused form is the reference for other backends; layers use it here only when asked to.
  bool fused_attention_supported(const AttentionShape&) override { return this->fused_attention_allowed(); }
  void attention_forward_fused(const FusedAttentionForwardArgs<T>& a) override {
    check_attention_operands(a, "attention_forward_fused");
    with_operands(a, [&](auto q, auto k, auto v, auto rounded, auto out) {
      cpu::fused_attention_forward<decltype(rounded)::value>(a.shape, q, k, v, out, a.stats);
    });
  }
  void attention_backward_fused(const FusedAttentionBackwardArgs<T>& a) override {
    check_attention_operands(a, "attention_backward_fused");
    with_operands(a, [&](auto q, auto k, auto v, auto, auto out) {
      cpu::fused_attention_backward(a.shape, q, k, v, out, a.stats, a.dout, a.dq, a.dk, a.dv);
    });
  }

  // In spans on all threads (cpu/expert_mlp.h: float through cpu/vector_math.h, double as written).
  void swiglu_forward(const T* ab, T* h, int64_t rows, int64_t F) override {
    cpu::swiglu_forward_as<T, false>(ab, h, rows, F);
  }
  void swiglu_forward_rounded(const Rounded<T>* ab, Rounded<T>* h, int64_t rows, int64_t F) override {
    cpu::swiglu_forward_as<T, true>(ab, h, rows, F);
  }
  void swiglu_backward(const T* ab, const T* dh, T* dab, int64_t rows, int64_t F) override {
    cpu::swiglu_backward_as<T, false>(ab, dh, dab, rows, F);
  }
  void swiglu_backward_rounded(const Rounded<T>* ab, const T* dh, Rounded<T>* dab, int64_t rows, int64_t F) override {
    cpu::swiglu_backward_as<T, true>(ab, dh, dab, rows, F);
  }
  void round_values(const T* x, Rounded<T>* out, int64_t n) override {
#pragma omp parallel for schedule(static) if (n >= (int64_t(1) << 16))
    for (int64_t i = 0; i < n; ++i) out[i] = to_rounded(x[i]);
  }

  void cross_entropy_forward(const T* logits, const int32_t* targets, T* losses, int64_t N, int64_t V) override {
    // Checked before the parallel loop: an exception must not leave an OpenMP region.
    for (int64_t i = 0; i < N; ++i)
      MOE_CHECK(targets[i] >= 0 && targets[i] < V, "target token " << targets[i] << " outside [0, " << V << ")");
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < N; ++i) {
      const T* z = logits + i * V;
      const double lse = cpu::log_sum_exp(z, V);
      losses[i] = T(lse - double(z[targets[i]]));
    }
  }

  void cross_entropy_backward(const T* logits, const int32_t* targets, T scale, T* dlogits, int64_t N,
                              int64_t V) override {
    softmax_rows_backward<false>(logits, targets, 0, nullptr, scale, dlogits, N, V);
  }
  void cross_entropy_backward_rounded(const T* logits, const int32_t* targets, T scale, Rounded<T>* dlogits, int64_t N,
                                      int64_t V) override {
    softmax_rows_backward<true>(logits, targets, 0, nullptr, scale, dlogits, N, V);
  }

  // Each row in column order, in double: the bits whatever the thread count.
  void logits_row_max(const T* logits, int64_t N, int64_t V, double* row_max) override {
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
      double m = -std::numeric_limits<double>::infinity();
      for (int64_t v = 0; v < V; ++v) m = std::max(m, double(logits[n * V + v]));
      row_max[n] = m;
    }
  }
  void logits_sum_exp(const T* logits, const int32_t* targets, int64_t first, const double* row_max, double* sums,
                      int64_t N, int64_t V) override {
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
      const double* e = cpu::exp_shifted(logits + n * V, row_max[n], V);
      double s = 0;
      for (int64_t v = 0; v < V; ++v) s += e[v];
      sums[n] = s;
      const int64_t t = int64_t(targets[n]) - first;
      sums[N + n] = t >= 0 && t < V ? double(logits[n * V + t]) : 0.0;
    }
  }
  // Blocks in rank order (the maximum is exact in any order).
  void logits_max_over_blocks(const double* block_max, double* row_max, int64_t P, int64_t N) override {
    for (int64_t n = 0; n < N; ++n) {
      double m = block_max[n];
      for (int64_t r = 1; r < P; ++r) m = std::max(m, block_max[r * N + n]);
      row_max[n] = m;
    }
  }
  void logits_loss_finish(const double* row_max, const double* sums, T* lse, T* losses, int64_t N) override {
    for (int64_t n = 0; n < N; ++n) {
      const double l = row_max[n] + std::log(sums[n]);
      lse[n] = T(l), losses[n] = T(l - sums[N + n]);
    }
  }
  void logits_softmax_backward(const T* logits, const int32_t* targets, int64_t first, const T* lse, T scale,
                               T* dlogits, int64_t N, int64_t V) override {
    softmax_rows_backward<false>(logits, targets, first, lse, scale, dlogits, N, V);
  }
  void logits_softmax_backward_rounded(const T* logits, const int32_t* targets, int64_t first, const T* lse, T scale,
                                       Rounded<T>* dlogits, int64_t N, int64_t V) override {
    softmax_rows_backward<true>(logits, targets, first, lse, scale, dlogits, N, V);
  }
  // (softmax(logits) - onehot(target - first)) * scale per row, from each row's log-sum-exp (lse null: its own),
  // written as stored or, kRounded, held rounded: the same T values rounded.
  template <bool kRounded, typename D = std::conditional_t<kRounded, Rounded<T>, T>>
  static void softmax_rows_backward(const T* logits, const int32_t* targets, int64_t first, const T* lse, T scale,
                                    D* dlogits, int64_t N, int64_t V) {
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
      const T* z = logits + n * V;
      const double* e = cpu::exp_shifted(z, lse ? double(lse[n]) : cpu::log_sum_exp(z, V), V);
      const int64_t t = int64_t(targets[n]) - first;
      for (int64_t v = 0; v < V; ++v) {
        const T d = T(e[v] * double(scale));
        const T value = v == t ? T(d - scale) : d;
        if constexpr (kRounded)
          dlogits[n * V + v] = to_rounded(value);
        else
          dlogits[n * V + v] = value;
      }
    }
  }

  void add_inplace(T* y, const T* x, int64_t n) override {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) y[i] += x[i];
  }
  void add(const T* a, const T* b, T* y, int64_t n) override {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) y[i] = a[i] + b[i];
  }
  // Large copies and fills in one block per thread (memory bound: one thread does not saturate it).
  void copy(const T* x, T* y, int64_t n) override {
#pragma omp parallel for schedule(static) if (n >= kParallelMove)
    for (int64_t c = 0; c < n; c += kMoveChunk) std::copy_n(x + c, std::min(kMoveChunk, n - c), y + c);
  }
  void copy_strided(const T* x, int64_t ldx, T* y, int64_t ldy, int64_t rows, int64_t cols) override {
    for (int64_t r = 0; r < rows; ++r) std::copy_n(x + r * ldx, cols, y + r * ldy);
  }
  void fill(T* y, T value, int64_t n) override {
#pragma omp parallel for schedule(static) if (n >= kParallelMove)
    for (int64_t c = 0; c < n; c += kMoveChunk) std::fill_n(y + c, std::min(kMoveChunk, n - c), value);
  }
  void scale(T* y, T factor, int64_t n) override {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) y[i] *= factor;
  }

  void sum_squares_into(const T* x, int64_t n, double* out) override { *out = sum_squares_to_host(x, n); }
  void sum_squares_segments_into(const T* base, const SumSegment* segments, int64_t count, double* out) override {
    for (int64_t i = 0; i < count; ++i) out[i] = sum_squares_to_host(base + segments[i].offset, segments[i].length);
  }
  double sum_squares_to_host(const T* x, int64_t n) override {
    const int64_t chunks = (n + kReduceChunk - 1) / kReduceChunk;
    std::vector<double> partial(size_t(std::max<int64_t>(chunks, 1)), 0.0);
#pragma omp parallel for schedule(static)
    for (int64_t c = 0; c < chunks; ++c) {
      double s = 0;
      const int64_t end = std::min(n, (c + 1) * kReduceChunk);
      for (int64_t i = c * kReduceChunk; i < end; ++i) s += double(x[i]) * x[i];
      partial[c] = s;
    }
    double total = 0;
    for (double p : partial) total += p;
    return total;
  }

  void run_grouped_gemm(const typename Ops<T>::GroupedGemm& g) override {
    MOE_CHECK(!(g.trans_a && g.trans_b), "grouped gemm: trans_a with trans_b is not an expert shape");
    const cpu::GemmInputs<T> in = gemm_inputs(g.precision, g.weight);
    auto with_a = [&](const auto* A) {
      if (g.C_rounded)
        return cpu::grouped_gemm_rounded(in, g.trans_b, g.groups, g.row_offset, g.N, g.K, g.alpha, A, g.B, g.C_rounded);
      if (g.B_rounded)
        return cpu::grouped_gemm(in, g.trans_a, g.trans_b, g.groups, g.row_offset, g.N, g.K, g.alpha, A, g.B_rounded,
                                 g.beta, g.C);
      cpu::grouped_gemm(in, g.trans_a, g.trans_b, g.groups, g.row_offset, g.N, g.K, g.alpha, A, g.B, g.beta, g.C);
    };
    if (g.A_rounded)
      with_a(g.A_rounded);
    else
      with_a(g.A);
  }

  void expert_mlp_forward(const typename Ops<T>::ExpertMlp& e, const T* x, T* ab, T* h, T* y) override {
    cpu::expert_mlp_forward(gemm_inputs(e.precision, GemmWeight::None), e, x, ab, h, y);
  }
  void expert_mlp_backward(const typename Ops<T>::ExpertMlp& e, const T* x, const T* ab, const T* h, const T* dy, T* dh,
                           T* dab, T* dx) override {
    cpu::expert_mlp_backward<T>(gemm_inputs(e.precision, GemmWeight::None), e, x, ab, h, dy, static_cast<T*>(nullptr),
                                dh, dab, dx);
  }
  void expert_mlp_forward_rounded(const typename Ops<T>::ExpertMlp& e, const Rounded<T>* x, Rounded<T>* ab,
                                  Rounded<T>* h, T* y) override {
    MOE_CHECK(e.precision == GemmPrecision::Bf16, "expert_mlp_forward_rounded: rounded rows are read by bf16 GEMMs");
    cpu::expert_mlp_forward<T, true>(gemm_inputs(e.precision, GemmWeight::None), e, x, ab, h, y);
  }
  void expert_mlp_backward_rounded(const typename Ops<T>::ExpertMlp& e, const Rounded<T>* x, const Rounded<T>* ab,
                                   const Rounded<T>* h, const T* dy, Rounded<T>* dy_held, T* dh, Rounded<T>* dab,
                                   T* dx) override {
    MOE_CHECK(e.precision == GemmPrecision::Bf16, "expert_mlp_backward_rounded: rounded rows are read by bf16 GEMMs");
    cpu::expert_mlp_backward<T, true>(gemm_inputs(e.precision, GemmWeight::None), e, x, ab, h, dy, dy_held, dh, dab,
                                      dx);
  }
  void gumbel_noise(uint64_t key, uint64_t step, uint64_t first_counter, double* out, int64_t n) override {
    cpu::gumbel_noise(key, step, first_counter, out, n);
  }
  void softmax_rows(const T* z, const double* noise, double tau, T* p, int64_t N, int64_t E) override {
    cpu::softmax_rows(z, noise, tau, p, N, E);
  }
  void sigmoid_rows(const T* z, const double* noise, double tau, T* p, int64_t N, int64_t E) override {
    cpu::sigmoid_rows(z, noise, tau, p, N, E);
  }
  void topk_rows(const T* p, const float* bias, const uint8_t* mask, int32_t* index, int64_t N, int64_t E,
                 int64_t K) override {
    cpu::topk_rows(p, bias, mask, index, N, E, K);
  }
  void gather_rows(const T* src, const int32_t* index, const T* scale, T* dst, int64_t rows, int64_t D) override {
    cpu::gather_rows(src, index, scale, dst, rows, D);
  }
  void gather_rows_rounded(const T* src, const int32_t* index, Rounded<T>* dst, int64_t rows, int64_t D) override {
    cpu::gather_rows_rounded(src, index, dst, rows, D);
  }
  void scatter_add_rows(const T* src, const int32_t* index, const T* scale, T* dst, int64_t rows, int64_t D) override {
    cpu::scatter_add_rows(src, index, scale, dst, rows, D);
  }
  void combine_rows(const T* src, const int32_t* index, const T* weight, T* dst, int64_t N, int64_t K, int64_t D,
                    bool accumulate) override {
    cpu::combine_rows(src, index, weight, dst, N, K, D, accumulate);
  }
  void row_dots(const T* a, const int32_t* index, const T* b, T* out, int64_t rows, int64_t D) override {
    cpu::row_dots(a, index, b, out, rows, D);
  }
  void gate_weights(const T* scores, const int32_t* preference, int64_t W, bool renormalised, int32_t* selected,
                    T* selected_score, T* gate, T* denom, uint8_t* clamped, int64_t N, int64_t E, int64_t K) override {
    cpu::gate_weights(scores, preference, W, renormalised, selected, selected_score, gate, denom, clamped, N, E, K);
  }
  void expert_fractions(const int32_t* top, T* f, int64_t N, int64_t K, int64_t E) override {
    cpu::expert_fractions(top, f, N, K, E);
  }
  void router_loss_sums(const T* logits, const T* scores, double* out, int64_t N, int64_t E) override {
    cpu::router_loss_sums(logits, scores, out, N, E);
  }
  void capacity_keep(const int32_t* selected, const T* score, bool by_score, int64_t capacity, int32_t* assigned,
                     int64_t M, int64_t E) override {
    thread_local std::vector<std::vector<int32_t>> by_expert;
    dispatch_order::capacity_keep(selected, score, by_score, capacity, assigned, M, E, by_expert);
  }
  void reroute_overflow(const int32_t* preference, int64_t W, const T* score, bool by_score, int64_t capacity,
                        int32_t* assigned, int64_t* rerouted, int64_t N, int64_t K, int64_t E) override {
    *rerouted = dispatch_order::reroute_overflow(preference, W, score, by_score, capacity, assigned, N, K, E);
  }
  void fallback_rows(const int32_t* selected, const int32_t* assigned, const T* gate, int64_t K, int32_t* token,
                     T* weight, int32_t* source, int32_t* slot, int64_t* count, int64_t N) override {
    dispatch_order::fallback_rows(selected, assigned, gate, K, token, weight, source, slot, count, N);
  }
  void permute_by_expert(const int32_t* assigned, int64_t* offset, int32_t* perm_slot, int32_t* row_of_slot, int64_t M,
                         int64_t E) override {
    dispatch_order::permute_by_expert(assigned, offset, perm_slot, row_of_slot, M, E);
  }
  void restrict_permutation(const int64_t* offset, const int32_t* perm_slot, int64_t lo, int64_t hi,
                            int64_t* part_offset, int32_t* part_perm_slot, int32_t* part_row_of_slot, int64_t /*M*/,
                            int64_t E) override {
    dispatch_order::restrict_permutation(offset, perm_slot, lo, hi, part_offset, part_perm_slot, part_row_of_slot, E);
  }
  void permuted_rows(const int32_t* perm_slot, const T* gate, int64_t K, int32_t* perm_token, T* perm_gate,
                     int64_t M) override {
    dispatch_order::permuted_rows(perm_slot, gate, K, perm_token, perm_gate, M);
  }
  void gate_backward(const T* gate, const int32_t* selected, const T* dw, const T* denom, const uint8_t* clamped,
                     bool renormalised, T* dp, int64_t N, int64_t K, int64_t E) override {
    cpu::gate_backward(gate, selected, dw, denom, clamped, renormalised, dp, N, K, E);
  }
  void router_loss_backward(const T* logits, const T* scores, const T* f, const typename Ops<T>::RouterLossGrad& c,
                            T* dp, T* dz, int64_t N, int64_t E) override {
    cpu::router_loss_backward(logits, scores, f, c, dp, dz, N, E);
  }
  void score_backward(const T* scores, const T* dp, double tau, bool sigmoid, const T* logits, const double* noise,
                      int64_t own_first, int64_t own_count, double* d_log_tau, T* dz, int64_t N, int64_t E) override {
    cpu::score_backward(scores, dp, tau, sigmoid, logits, noise, own_first, own_count, d_log_tau, dz, N, E);
  }
  void adamw_update(T* p, const T* g, T* m, T* v, int64_t n, const typename Ops<T>::AdamWStep& step) override {
    cpu::adamw_update(p, g, m, v, n, step, current_rounded(p));
  }

 private:
  // How a call's GEMMs read their operands (its precision, the operand it names as a weight); with bf16 GEMMs,
  // the parameters' rounded copy brought up to date first (Ops::set_parameter_memory), on the calling thread
  // before any parallel region.
  cpu::GemmInputs<T> gemm_inputs(GemmPrecision precision, GemmWeight weight) {
    cpu::GemmInputs<T> in{precision, weight};
    if (in.precision == GemmPrecision::Fp32 || !this->parameter_memory()) return in;
    if (rounded_version_ != this->parameter_version() ||
        rounded_parameters_.size() != size_t(this->parameter_count())) {
      cpu::rounded_to_bf16(this->parameter_memory(), 1, this->parameter_count(), this->parameter_count(),
                           rounded_parameters_);
      rounded_version_ = this->parameter_version();
    }
    in.parameters = this->parameter_memory(), in.count = this->parameter_count();
    in.rounded = rounded_parameters_.data();
    return in;
  }
  // Where p's rounded value sits in the parameters' copy while the copy is current (adamw_update keeps it so);
  // null otherwise (no copy yet, a stale one, or p outside the parameters).
  T* current_rounded(const T* p) {
    if (!this->in_parameters(p) || rounded_version_ != this->parameter_version() ||
        rounded_parameters_.size() != size_t(this->parameter_count()))
      return nullptr;
    return rounded_parameters_.data() + (p - this->parameter_memory());
  }
  std::vector<T> rounded_parameters_;
  uint64_t rounded_version_ = ~uint64_t(0);

  // f(q, k, v) on an attention call's inputs as it gives them: as stored or held rounded (Ops' attention args).
  template <typename A, typename F>
  static void with_inputs(const A& a, F&& f) {
    if (a.q_rounded)
      f(a.q_rounded, a.k_rounded, a.v_rounded);
    else
      f(a.q, a.k, a.v);
  }
  // f(q, k, v, rounded, out) likewise, out as given too: rounded std::true_type where it is held rounded.
  template <typename A, typename F>
  static void with_operands(const A& a, F&& f) {
    with_inputs(a, [&](auto q, auto k, auto v) {
      if (a.out_rounded)
        f(q, k, v, std::true_type{}, a.out_rounded);
      else
        f(q, k, v, std::false_type{}, a.out);
    });
  }

  // y = x rotated (rope's pairs): in place (y = x), or held rounded (kRounded; fp64 holds the rounded values).
  template <bool kRounded, typename Y>
  void rotate(const T* x, Y* y, int64_t B, int64_t T_, int64_t H, int64_t Dh, bool inverse) {
    MOE_CHECK(Dh % 2 == 0, "rotary embedding needs an even head width, got " << Dh);
    const int64_t pairs = Dh / 2;
    const RopeTable& table = rope_table(T_, Dh);
    const std::vector<T>& cos_table = table.cos;
    const std::vector<T>& sin_table = inverse ? table.minus_sin : table.sin;
#pragma omp parallel for schedule(static)
    for (int64_t bt = 0; bt < B * T_; ++bt) {
      const int64_t t = bt % T_;
      const T* c = cos_table.data() + t * pairs;
      const T* s = sin_table.data() + t * pairs;
      for (int64_t h = 0; h < H; ++h) {
        const T* in = x + (bt * H + h) * Dh;
        Y* out = y + (bt * H + h) * Dh;
        for (int64_t i = 0; i < pairs; ++i) {
          const T x0 = in[2 * i], x1 = in[2 * i + 1];
          out[2 * i] = moe::stored<kRounded>(T(x0 * c[i] - x1 * s[i]));
          out[2 * i + 1] = moe::stored<kRounded>(T(x0 * s[i] + x1 * c[i]));
        }
      }
    }
  }

  // cos and sin of angle t * base^(-2i/Dh) for t < T, i < Dh / 2, kept for the last shape asked for: every
  // layer of a step asks for the same one.
  struct RopeTable {
    int64_t seq = -1, Dh = -1;
    std::vector<T> cos, sin, minus_sin;
  };
  const RopeTable& rope_table(int64_t T_, int64_t Dh) {
    if (rope_.seq == T_ && rope_.Dh == Dh) return rope_;
    const int64_t pairs = Dh / 2;
    rope_.seq = T_, rope_.Dh = Dh;
    for (auto* v : {&rope_.cos, &rope_.sin, &rope_.minus_sin}) v->assign(size_t(T_ * pairs), T(0));
    for (int64_t i = 0; i < pairs; ++i) {
      const double frequency = std::pow(kRopeBase, -2.0 * double(i) / double(Dh));
      for (int64_t t = 0; t < T_; ++t) {
        const double angle = double(t) * frequency;
        rope_.cos[size_t(t * pairs + i)] = T(std::cos(angle));
        rope_.sin[size_t(t * pairs + i)] = T(std::sin(angle));
        rope_.minus_sin[size_t(t * pairs + i)] = T(-std::sin(angle));
      }
    }
    return rope_;
  }
  RopeTable rope_;
};

// Host memory, work done when a call returns: the CPU stream has nothing to wait for.
class CpuStream final : public Stream {
 public:
  void synchronize() override {}
  void record_time(double* seconds) override { *seconds = steady_seconds(); }
};

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(int threads) { set_threads(threads); }
  const char* name() const override { return "cpu"; }
  bool memory_is_host() const override { return true; }
  int threads() const override { return threads_; }
  // OpenMP and OpenBLAS keep their thread counts per process: the last backend made sets them.
  void set_threads(int threads) override {
    if (threads <= 0) threads = cpu::usable_cores();
    threads_ = threads;
    omp_set_num_threads(threads);
    openblas_set_num_threads(threads);
  }
  void copy_to_device(void* dst, const void* src, size_t bytes) override { copy_bytes(dst, src, bytes); }
  void copy_bytes_to_host(void* dst, const void* src, size_t bytes) override { copy_bytes(dst, src, bytes); }
  void copy(void* dst, const void* src, size_t bytes) override { copy_bytes(dst, src, bytes); }
  Stream& stream() override { return stream_; }
  int64_t allocated_bytes() const override { return allocated_.load(std::memory_order_relaxed); }
  int64_t peak_bytes() const override { return peak_.load(std::memory_order_relaxed); }

 protected:
  // Counts the bytes asked for, not the alignment padding: what the memory estimate predicts.
  void* allocate_bytes(size_t bytes) override {
    constexpr size_t kAlign = 64;  // a cache line
    void* p = std::aligned_alloc(kAlign, (bytes + kAlign - 1) / kAlign * kAlign);
    if (!p) throw std::bad_alloc();
    std::memset(p, 0, bytes);
    const int64_t now = allocated_.fetch_add(int64_t(bytes), std::memory_order_relaxed) + int64_t(bytes);
    for (int64_t peak = peak_.load(std::memory_order_relaxed);
         now > peak && !peak_.compare_exchange_weak(peak, now, std::memory_order_relaxed);) {
    }
    return p;
  }
  void free_bytes(void* p, size_t bytes) noexcept override {
    std::free(p);
    allocated_.fetch_sub(int64_t(bytes), std::memory_order_relaxed);
  }
  Ops<float>& ops_f32() override { return f32_; }
  Ops<double>& ops_f64() override { return f64_; }

 private:
  static void copy_bytes(void* dst, const void* src, size_t bytes) {
    if (bytes > 0 && dst != src) std::memmove(dst, src, bytes);
  }
  int threads_ = 1;
  std::atomic<int64_t> allocated_{0}, peak_{0};
  CpuStream stream_;
  CpuOps<float> f32_;
  CpuOps<double> f64_;
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(int threads) { return std::make_unique<CpuBackend>(threads); }

}  // namespace moe
