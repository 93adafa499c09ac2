// The CUDA backend's ops (Ops<T> on one stream): the class and what its members share. Its members are defined
// by concern, each file instantiating its own for float and double: gemm_ops.cu (cuBLAS GEMMs and the bf16
// operands), attention_ops.cu (plain and cuDNN attention, rotary), routing_ops.cu (the router's backward and the
// sorts: capacity, permutation, scatter-adds), optimizer_ops.cu (AdamW, the gradient norm's sums); the one-kernel
// ops are defined here. cuda_backend.cu holds the backend object. Kernels are in cuda_kernels.cuh.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <optional>

#include "core/backend/backend.h"
#include "core/backend/cuda/caching_allocator.h"
#include "core/backend/cuda/cuda_check.h"
#include "core/backend/cuda/cuda_kernels.cuh"
#include "core/backend/cuda/grouped_gemm_plan.h"
#include "core/backend/cuda/launch_config.h"
#include "core/backend/cuda/moe_plan_ops.h"
#include "core/backend/cuda/watchers.h"
#include "core/backend/cuda_backend.h"
#include "core/error.h"
#include "core/sizes.h"

namespace moe::cuda {

class CudnnAttention;  // cudnn_attention.h, where cuDNN is built
struct Bf16Sections;   // attention_ops.cu

inline cublasOperation_t op(bool transpose) { return transpose ? CUBLAS_OP_T : CUBLAS_OP_N; }

// What the ops share with their backend: the stream, the cuBLAS handle, and device workspace.
struct CudaContext {
  cudaStream_t stream = nullptr;
  cublasHandle_t blas = nullptr;
  CachingAllocator* allocator = nullptr;
  cuda::CudnnAttention* attention = nullptr;  // fused attention on cuDNN; null without it
  Watchers* watchers = nullptr;               // every host wait for the stream goes through it
  FusedAttention fused_attention = FusedAttention::Deterministic;
};

// Device workspace for one call, back to the allocator's cache when it goes (reuse is ordered on the stream).
struct Workspace {
  Workspace(CachingAllocator& a, size_t bytes) : allocator(a), ptr(a.allocate(bytes)) {}
  ~Workspace() { allocator.free(ptr); }
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;
  CachingAllocator& allocator;
  void* ptr;
};

template <typename T>
inline cublasStatus_t blas_gemm(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                                const T* alpha, const T* A, int lda, const T* B, int ldb, const T* beta, T* C,
                                int ldc) {
  if constexpr (sizeof(T) == 4)
    return cublasSgemm(h, ta, tb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc);
  else
    return cublasDgemm(h, ta, tb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc);
}

template <typename T>
class CudaOps final : public Ops<T> {
 public:
  explicit CudaOps(const CudaContext& ctx) : ctx_(ctx) {
#ifdef MOE_HAVE_CUDNN
    cudnn_enabled_ = ctx.fused_attention != FusedAttention::Off;
#endif
  }
  ~CudaOps() override {
    if (rounded_) ctx_.allocator->free(rounded_);
    if (rope_) ctx_.allocator->free(rope_);
  }
  CudaOps(const CudaOps&) = delete;
  CudaOps& operator=(const CudaOps&) = delete;
  const char* name() const override { return "cuda"; }

  // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T.
  void run_gemm(const typename Ops<T>::Gemm& g) override {
    if (g.M == 0 || g.N == 0) return;
    if (g.precision == GemmPrecision::Bf16 && g.K > 0) return gemm_bf16(g);
    MOE_CUBLAS_CHECK(blas_gemm<T>(ctx_.blas, op(g.trans_b), op(g.trans_a), int(g.N), int(g.M), int(g.K), &g.alpha, g.B,
                                  int(g.ldb), g.A, int(g.lda), &g.beta, g.C, int(g.ldc)));
  }

  void embedding_forward(const int32_t* tokens, const T* table, int64_t first, int64_t rows, T* out, int64_t N,
                         int64_t D) override {
    launch(row_launch(N, D), cuda::embedding_forward_kernel<T>, tokens, table, first, rows, out, N, D);
  }
  void embedding_backward(const int32_t* tokens, const T* dout, int64_t first, int64_t rows, T* dtable, int64_t N,
                          int64_t D) override;

  void rmsnorm_forward(const T* x, const T* gain, T* y, T* rstd, int64_t N, int64_t D) override {
    launch_rows(row_launch(N, D), cuda::rmsnorm_forward_kernel<T>, x, gain, y, rstd, N, D);
  }
  void rmsnorm_backward(const T* x, const T* gain, const T* rstd, const T* dy, T* dx, T* dgain, int64_t N,
                        int64_t D) override;
  void rmsnorm_forward_residual(const T* x, const T* r, T* sum, const T* gain, T* y, T* rstd, int64_t N,
                                int64_t D) override {
    launch_rows(row_launch(N, D), cuda::rmsnorm_forward_residual_kernel<T>, x, r, sum, gain, y, rstd, N, D);
  }
  void rmsnorm_forward_residual_rounded(const T* x, const T* r, T* sum, const T* gain, Rounded<T>* y, T* rstd,
                                        int64_t N, int64_t D) override {
    launch_rows(row_launch(N, D), cuda::rmsnorm_forward_residual_kernel<T, true>, x, r, sum, gain, y, rstd, N, D);
  }
  void rmsnorm_backward_add(const T* x, const T* gain, const T* rstd, const T* dy, T* dres, T* dgain, int64_t N,
                            int64_t D) override;

  void rope(T* x, int64_t B, int64_t T_, int64_t H, int64_t Dh, bool inverse) override {
    MOE_CHECK(Dh % 2 == 0, "rotary embedding needs an even head width, got " << Dh);
    launch(row_launch(B * T_ * H, Dh / 2), cuda::rope_kernel<T>, x, x, rope_table(T_, Dh), B, T_, H, Dh, inverse);
  }
  void rope_rounded(const T* x, Rounded<T>* y, int64_t B, int64_t T_, int64_t H, int64_t Dh, bool inverse) override {
    MOE_CHECK(Dh % 2 == 0, "rotary embedding needs an even head width, got " << Dh);
    launch(row_launch(B * T_ * H, Dh / 2), cuda::rope_kernel<T, true>, x, y, rope_table(T_, Dh), B, T_, H, Dh, inverse);
  }

  void expand_heads(const T* x, T* y, int64_t N, int64_t Hkv, int64_t group, int64_t Dh) override {
    launch(row_launch(N * Hkv * group, Dh), cuda::expand_heads_kernel<T>, x, y, N * Hkv, group, Dh);
  }
  void expand_heads_backward(const T* dy, T* dx, int64_t N, int64_t Hkv, int64_t group, int64_t Dh) override {
    launch(row_launch(N * Hkv, Dh), cuda::expand_heads_backward_kernel<T>, dy, dx, N * Hkv, group, Dh);
  }

  void attention_forward(const AttentionForwardArgs<T>& a) override;
  void attention_backward(const AttentionBackwardArgs<T>& a) override;
  bool fused_attention_supported(const AttentionShape& s) override;
  void attention_forward_fused(const FusedAttentionForwardArgs<T>& a) override;
  void attention_backward_fused(const FusedAttentionBackwardArgs<T>& a) override;

  void swiglu_forward(const T* ab, T* h, int64_t rows, int64_t F) override {
    launch(row_launch(rows, F), cuda::swiglu_forward_kernel<T>, ab, h, rows, F);
  }
  void swiglu_forward_rounded(const Rounded<T>* ab, Rounded<T>* h, int64_t rows, int64_t F) override {
    launch(row_launch(rows, F), cuda::swiglu_forward_rounded_kernel<T>, ab, h, rows, F);
  }
  void swiglu_backward_rounded(const Rounded<T>* ab, const T* dh, Rounded<T>* dab, int64_t rows, int64_t F) override {
    launch(row_launch(rows, F), cuda::swiglu_backward_rounded_kernel<T>, ab, dh, dab, rows, F);
  }
  void round_values(const T* x, Rounded<T>* out, int64_t n) override {
    launch(elementwise_launch(n), cuda::round_values_kernel<T>, x, out, n);
  }
  void swiglu_backward(const T* ab, const T* dh, T* dab, int64_t rows, int64_t F) override {
    launch(row_launch(rows, F), cuda::swiglu_backward_kernel<T>, ab, dh, dab, rows, F);
  }

  void cross_entropy_forward(const T* logits, const int32_t* targets, T* losses, int64_t N, int64_t V) override {
    launch_rows(row_launch(N, V), cuda::cross_entropy_forward_kernel<T>, logits, targets, losses, N, V);
  }
  void cross_entropy_backward(const T* logits, const int32_t* targets, T scale, T* dlogits, int64_t N,
                              int64_t V) override {
    launch_rows(row_launch(N, V), cuda::cross_entropy_backward_kernel<T>, logits, targets, scale, dlogits, N, V);
  }
  void cross_entropy_backward_rounded(const T* logits, const int32_t* targets, T scale, Rounded<T>* dlogits, int64_t N,
                                      int64_t V) override {
    launch_rows(row_launch(N, V), cuda::cross_entropy_backward_kernel<T, true>, logits, targets, scale, dlogits, N, V);
  }

  void logits_row_max(const T* logits, int64_t N, int64_t V, double* row_max) override {
    launch_rows(row_launch(N, V), cuda::logits_row_max_kernel<T>, logits, N, V, row_max);
  }
  void logits_sum_exp(const T* logits, const int32_t* targets, int64_t first, const double* row_max, double* sums,
                      int64_t N, int64_t V) override {
    launch_rows(row_launch(N, V), cuda::logits_sum_exp_kernel<T>, logits, targets, first, row_max, sums, N, V);
  }
  void logits_max_over_blocks(const double* block_max, double* row_max, int64_t P, int64_t N) override {
    launch(elementwise_launch(N), cuda::logits_max_over_blocks_kernel<double>, block_max, row_max, P, N);
  }
  void logits_loss_finish(const double* row_max, const double* sums, T* lse, T* losses, int64_t N) override {
    launch(elementwise_launch(N), cuda::logits_loss_finish_kernel<T>, row_max, sums, lse, losses, N);
  }
  void logits_softmax_backward(const T* logits, const int32_t* targets, int64_t first, const T* lse, T scale,
                               T* dlogits, int64_t N, int64_t V) override {
    launch(row_launch(N, V), cuda::logits_softmax_backward_kernel<T>, logits, targets, first, lse, scale, dlogits, N,
           V);
  }
  void logits_softmax_backward_rounded(const T* logits, const int32_t* targets, int64_t first, const T* lse, T scale,
                                       Rounded<T>* dlogits, int64_t N, int64_t V) override {
    launch(row_launch(N, V), cuda::logits_softmax_backward_kernel<T, true>, logits, targets, first, lse, scale, dlogits,
           N, V);
  }

  void add_inplace(T* y, const T* x, int64_t n) override {
    launch(elementwise_launch(n), cuda::add_inplace_kernel<T>, y, x, n);
  }
  void add(const T* a, const T* b, T* y, int64_t n) override {
    launch(elementwise_launch(n), cuda::add_kernel<T>, a, b, y, n);
  }
  void copy(const T* x, T* y, int64_t n) override {
    if (n > 0 && x != y)
      MOE_CUDA_CHECK(cudaMemcpyAsync(y, x, size_t(n) * sizeof(T), cudaMemcpyDeviceToDevice, ctx_.stream));
  }
  // One two-dimensional copy on the stream, device to device.
  void copy_strided(const T* x, int64_t ldx, T* y, int64_t ldy, int64_t rows, int64_t cols) override {
    if (rows == 0 || cols == 0) return;
    MOE_CUDA_CHECK(cudaMemcpy2DAsync(y, size_t(ldy) * sizeof(T), x, size_t(ldx) * sizeof(T), size_t(cols) * sizeof(T),
                                     size_t(rows), cudaMemcpyDeviceToDevice, ctx_.stream));
  }
  void fill(T* y, T value, int64_t n) override { launch(elementwise_launch(n), cuda::fill_kernel<T>, y, value, n); }
  void scale(T* y, T factor, int64_t n) override { launch(elementwise_launch(n), cuda::scale_kernel<T>, y, factor, n); }
  double sum_squares_to_host(const T* x, int64_t n) override;
  void sum_squares_into(const T* x, int64_t n, double* out) override;
  void sum_squares_segments_into(const T* base, const SumSegment* segments, int64_t count, double* out) override;

  void run_grouped_gemm(const typename Ops<T>::GroupedGemm& g) override;

  void gumbel_noise(uint64_t key, uint64_t step, uint64_t first_counter, double* out, int64_t n) override {
    launch(elementwise_launch(n), cuda::gumbel_noise_kernel, key, step, first_counter, out, n);
  }
  void softmax_rows(const T* z, const double* noise, double tau, T* p, int64_t N, int64_t E) override {
    launch(elementwise_launch(N), cuda::softmax_rows_kernel<T>, z, noise, tau, p, N, E);
  }
  void sigmoid_rows(const T* z, const double* noise, double tau, T* p, int64_t N, int64_t E) override {
    launch(elementwise_launch(N * E), cuda::sigmoid_rows_kernel<T>, z, noise, tau, p, N, E);
  }
  void topk_rows(const T* p, const float* bias, const uint8_t* mask, int32_t* index, int64_t N, int64_t E,
                 int64_t K) override {
    launch(elementwise_launch(N), cuda::topk_rows_kernel<T>, p, bias, mask, index, N, E, K);
  }

  void gather_rows(const T* src, const int32_t* index, const T* scale, T* dst, int64_t rows, int64_t D) override {
    launch(row_launch(rows, D), cuda::gather_rows_kernel<T>, src, index, scale, dst, rows, D);
  }
  void gather_rows_rounded(const T* src, const int32_t* index, Rounded<T>* dst, int64_t rows, int64_t D) override {
    launch(row_launch(rows, D), cuda::gather_rows_rounded_kernel<T>, src, index, dst, rows, D);
  }
  void scatter_add_rows(const T* src, const int32_t* index, const T* scale, T* dst, int64_t rows, int64_t D) override;
  void combine_rows(const T* src, const int32_t* index, const T* weight, T* dst, int64_t N, int64_t K, int64_t D,
                    bool accumulate) override {
    launch(row_launch(N, D), cuda::combine_rows_kernel<T>, src, index, weight, dst, N, K, D, accumulate);
  }
  void row_dots(const T* a, const int32_t* index, const T* b, T* out, int64_t rows, int64_t D) override {
    launch_rows(row_launch(rows, D), cuda::row_dots_kernel<T>, a, index, b, out, rows, D);
  }

  void gate_weights(const T* scores, const int32_t* preference, int64_t W, bool renormalised, int32_t* selected,
                    T* selected_score, T* gate, T* denom, uint8_t* clamped, int64_t N, int64_t E, int64_t K) override {
    launch(elementwise_launch(N), cuda::gate_weights_kernel<T>, scores, preference, W, renormalised, selected,
           selected_score, gate, denom, clamped, N, E, K);
  }
  void expert_fractions(const int32_t* top, T* f, int64_t N, int64_t K, int64_t E) override {
    launch(elementwise_launch(E), cuda::expert_fractions_kernel<T>, top, f, N, K, E);
  }
  void router_loss_sums(const T* logits, const T* scores, double* out, int64_t N, int64_t E) override {
    launch(elementwise_launch(E + 2), cuda::router_loss_sums_kernel<T>, logits, scores, out, N, E);
  }
  // Capacity: the slots stably sorted by descending score (by_score), then stably by expert, so that each expert's
  // run lists its slots in priority order (ties in slot order); a slot's place in its run decides.
  void capacity_keep(const int32_t* selected, const T* score, bool by_score, int64_t capacity, int32_t* assigned,
                     int64_t M, int64_t E) override;
  // Reroute: the slots in priority order (by_score: sorted by descending score, stably), the overflowed ones kept in
  // that order (CUB's DeviceSelect), then one block walks them, its threads trying a slot's candidates at once
  // (moe_plan_ops.cu).
  void reroute_overflow(const int32_t* preference, int64_t W, const T* score, bool by_score, int64_t capacity,
                        int32_t* assigned, int64_t* rerouted, int64_t N, int64_t K, int64_t E) override;
  // The fallback's rows: each token's and slot's flag, their exclusive sums (CUB) place them.
  void fallback_rows(const int32_t* selected, const int32_t* assigned, const T* gate, int64_t K, int32_t* token,
                     T* weight, int32_t* source, int32_t* slot, int64_t* count, int64_t N) override;
  // The permutation: the slots stably sorted by assigned expert; each expert's first row by binary search.
  void permute_by_expert(const int32_t* assigned, int64_t* offset, int32_t* perm_slot, int32_t* row_of_slot, int64_t M,
                         int64_t E) override;
  void restrict_permutation(const int64_t* offset, const int32_t* perm_slot, int64_t lo, int64_t hi,
                            int64_t* part_offset, int32_t* part_perm_slot, int32_t* part_row_of_slot, int64_t M,
                            int64_t E) override {
    cuda::restrict_permutation(ctx_.stream, *ctx_.allocator, offset, perm_slot, lo, hi, part_offset, part_perm_slot,
                               part_row_of_slot, M, E);
  }
  void permuted_rows(const int32_t* perm_slot, const T* gate, int64_t K, int32_t* perm_token, T* perm_gate,
                     int64_t M) override {
    cuda::permuted_rows(ctx_.stream, perm_slot, gate, K, perm_token, perm_gate, M);
  }
  void gate_backward(const T* gate, const int32_t* selected, const T* dw, const T* denom, const uint8_t* clamped,
                     bool renormalised, T* dp, int64_t N, int64_t K, int64_t E) override {
    launch(elementwise_launch(N), cuda::gate_backward_kernel<T>, gate, selected, dw, denom, clamped, renormalised, dp,
           N, K, E);
  }
  void router_loss_backward(const T* logits, const T* scores, const T* f, const typename Ops<T>::RouterLossGrad& c,
                            T* dp, T* dz, int64_t N, int64_t E) override;
  void score_backward(const T* scores, const T* dp, double tau, bool sigmoid, const T* logits, const double* noise,
                      int64_t own_first, int64_t own_count, double* d_log_tau, T* dz, int64_t N, int64_t E) override {
    // Neither kernel reads dz, so the temperature's sum and the rows may run in either order.
    if (logits)
      launch(LaunchConfig{1, 1}, cuda::d_log_tau_kernel<T>, scores, dp, tau, sigmoid, logits, noise, own_first,
             own_count, d_log_tau, E);
    launch(elementwise_launch(N), cuda::score_backward_kernel<T>, scores, dp, tau, sigmoid, dz, N, E);
  }
  void adamw_update(T* p, const T* g, T* m, T* v, int64_t n, const typename Ops<T>::AdamWStep& s) override;

 private:
  // dgain += the gain's gradient (rmsnorm_backward and rmsnorm_backward_add).
  void rmsnorm_dgain(const T* x, const T* rstd, const T* dy, T* dgain, int64_t N, int64_t D);
  // The rotary angles' cos and sin for (T, Dh), made on the host with the CPU backend's formula and kept on the
  // device for the last shape asked for (every layer of a step asks for the same one).
  const T* rope_table(int64_t T_, int64_t Dh);
  void* rope_ = nullptr;
  int64_t rope_seq_ = -1, rope_dh_ = -1;

  // Expert keys and slots of the dispatch plan's sorts, before and after: 4 x n int32 (slot_in, slot_out: which
  // half of the slots is the input of the next sort).
  struct SlotOrder {
    SlotOrder(CachingAllocator& a, int64_t n) : n(n), space(a, size_t(std::max<int64_t>(4 * n, 1)) * sizeof(int32_t)) {}
    int32_t* keys() { return static_cast<int32_t*>(space.ptr); }
    int32_t* sorted_keys() { return keys() + n; }
    int32_t* slots() { return keys() + (2 + slot_in) * n; }
    int32_t* sorted_slots() { return keys() + (2 + slot_out) * n; }
    int64_t n;
    Workspace space;
    int slot_in = 0, slot_out = 1;
  };
  // CUB's radix sort of (key, value) pairs, stable: equal keys keep their order.
  template <typename K>
  void radix_sort(const K* keys, K* sorted_keys, const int32_t* values, int32_t* sorted_values, int64_t n, int bits);

  // Destination keys and row numbers of a scatter-add, (keys, rows) before and after the sort: 4 x n int32.
  struct ScatterOrder {
    ScatterOrder(CachingAllocator& a, int64_t n) : n(n), space(a, size_t(4 * n) * sizeof(int32_t)) {}
    int32_t* keys() { return static_cast<int32_t*>(space.ptr); }
    int32_t* rows() { return keys() + n; }
    int32_t* sorted_keys() { return keys() + 2 * n; }
    int32_t* sorted_rows() { return keys() + 3 * n; }
    int64_t n;
    Workspace space;
  };
  // dst[key] += scale[r] src[r] for the rows r of each key in row order: a stable radix sort of (key, row), then
  // one thread per (run of a key, column).
  void sorted_scatter_add(ScatterOrder& order, const T* src, const T* scale, T* dst, int64_t rows, int64_t D);

  void gemm_bf16(const typename Ops<T>::Gemm& g);
  // The fused attention's bf16 operands and results (attention_ops.cu): a held operand where cuDNN can read it in
  // place, else the next section of `b` (x rounded into it, or the held one copied); a result to where the call
  // wants it (widened into out, or copied into out_rounded where it is not there already).
  const void* cudnn_operand(const T* x, const void* held, int64_t n, const Bf16Sections& b, int64_t& next);
  void store_cudnn_result(const uint16_t* result, T* out, void* out_rounded, int64_t n);
  // x (rows, cols, leading dimension ld) as a bf16 GEMM reads it, packed into `out`: bf16 bits for fp32
  // storage, values rounded to bf16 in T for fp64.
  void round_operand(const T* x, int64_t rows, int64_t cols, int64_t ld, void* out);
  template <typename R>
  void round_into(const T* x, int64_t rows, int64_t cols, int64_t ld, R* out);
  // An operand inside the parameters' memory (Ops::set_parameter_memory) read from their rounded copy, at the
  // same offset and leading dimension; the copy is remade at the first use after a change. Null outside it.
  const void* rounded_parameter(const T* x);
  // X rounded for a GEMM: the parameters' copy (ld kept) where the call names X as its weight, or a packed copy in
  // `w` (ld becomes cols).
  const void* gemm_operand(const T* X, bool weight, int64_t rows, int64_t cols, int64_t& ld,
                           std::optional<Workspace>& w);
  // Where p's rounded value sits in the parameters' copy while the copy is current (adamw_update writes it there
  // and so keeps it current); null otherwise (no copy yet, a stale one, or p outside the parameters).
  void* current_rounded(const T* p) {
    if (!this->in_parameters(p) || !rounded_ || rounded_version_ != this->parameter_version() ||
        rounded_bytes_ != parameter_copy_bytes())
      return nullptr;
    return static_cast<char*>(rounded_) + (p - this->parameter_memory()) * int64_t(kOperandBytes);
  }
  // The parameters' rounded copy's size (core/sizes.h).
  size_t parameter_copy_bytes() const {
    return size_t(sizes::rounded_operand_bytes(double(this->parameter_count()), double(sizeof(T))));
  }
  void* rounded_ = nullptr;  // the parameters rounded (from the allocator; freed with the ops)
  size_t rounded_bytes_ = 0;
  uint64_t rounded_version_ = ~uint64_t(0);
  static constexpr size_t kOperandBytes = sizeof(T) == 4 ? 2 : sizeof(T);  // per element of a rounded operand
  // cuBLAS refused the grouped bf16 GEMM into fp32 (its grouped Ex lists no such type combination): from then on
  // one GEMM per expert, without asking again.
  bool grouped_bf16_refused_[2] = {false, false};  // into fp32 C, into bf16 C
  void grouped_call_bf16(const GroupedGemmPlan& plan, T alpha, const void* A, const void* B, T beta, void* C,
                         bool c_rounded);

  template <typename Kernel, typename... Args>
  void launch(LaunchConfig c, Kernel kernel, Args... args) {
    kernel<<<c.blocks, c.threads, 0, ctx_.stream>>>(args...);
    MOE_CUDA_LAUNCHED();
  }
  // Row kernels reduce through shared memory: one double per thread.
  template <typename Kernel, typename... Args>
  void launch_rows(LaunchConfig c, Kernel kernel, Args... args) {
    kernel<<<c.blocks, c.threads, c.threads * sizeof(double), ctx_.stream>>>(args...);
    MOE_CUDA_LAUNCHED();
  }

  CudaContext ctx_;
  bool cudnn_enabled_ = false;  // train.fused_attention is not "off"
};

}  // namespace moe::cuda
