// The CUDA backend: device memory from a caching allocator, every copy and op ordered on one stream, GEMMs on
// cuBLAS (the experts' as one grouped call), the other ops as the kernels of cuda_kernels.cuh. Row-major
// operands go to column-major cuBLAS as their transposes (grouped_gemm_plan.h says how).
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cub/cub.cuh>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "core/backend/backend.h"
#include "core/backend/cuda/caching_allocator.h"
#ifdef MOE_HAVE_CUDNN
#include "core/backend/cuda/cudnn_attention.h"
#endif
#include "core/backend/cuda/cuda_check.h"
#include "core/backend/cuda/cuda_kernels.cuh"
#include "core/backend/cuda/grouped_gemm_plan.h"
#include "core/backend/cuda/host_wait.h"
#include "core/backend/cuda/launch_config.h"
#include "core/backend/cuda/moe_plan_ops.h"
#include "core/backend/cuda_backend.h"
#include "core/error.h"

namespace moe {
namespace cuda {
class CudnnAttention;  // cudnn_attention.h, where cuDNN is built
}
namespace {

using cuda::elementwise_launch;
using cuda::LaunchConfig;
using cuda::row_launch;

cublasOperation_t op(bool transpose) { return transpose ? CUBLAS_OP_T : CUBLAS_OP_N; }

// The checks a host wait runs while it polls the stream (cuda_watch: a communicator's look at NCCL's asynchronous
// errors, which throws to end the wait). Without any, as on one GPU, a wait simply blocks.
class Watchers {
 public:
  uint64_t add(std::function<void()> check) {
    std::lock_guard<std::mutex> lock(mutex_);
    checks_.emplace(next_, std::move(check));
    return next_++;
  }
  void remove(uint64_t id) {
    std::lock_guard<std::mutex> lock(mutex_);
    checks_.erase(id);
  }
  // The stream's queued work done, first, where a copy that blocks by itself follows: only with checks to run, so
  // that one GPU's downloads wait once, as before.
  void wait_if_watched(cudaStream_t stream) {
    if (!empty()) wait(stream);
  }
  // The stream's queued work done.
  void wait(cudaStream_t stream) {
    if (empty()) {
      MOE_CUDA_CHECK(cudaStreamSynchronize(stream));
      return;
    }
    auto done = [&] {
      const cudaError_t status = cudaStreamQuery(stream);
      if (status == cudaErrorNotReady) return false;
      MOE_CUDA_CHECK(status);
      return true;
    };
    cuda::wait_polling(done, [&] { run(); });
  }

 private:
  bool empty() {
    std::lock_guard<std::mutex> lock(mutex_);
    return checks_.empty();
  }
  void run() {
    std::vector<std::function<void()>> checks;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      for (const auto& [id, check] : checks_) checks.push_back(check);
    }
    for (const auto& check : checks) check();
  }
  std::mutex mutex_;
  std::map<uint64_t, std::function<void()>> checks_;
  uint64_t next_ = 1;
};

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
cublasStatus_t blas_gemm(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                         const T* alpha, const T* A, int lda, const T* B, int ldb, const T* beta, T* C, int ldc) {
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
  void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, T alpha, const T* A, int64_t lda, const T* B,
            int64_t ldb, T beta, T* C, int64_t ldc) override {
    if (M == 0 || N == 0) return;
    if (this->gemm_precision() == GemmPrecision::Bf16 && K > 0)
      return gemm_bf16(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    MOE_CUBLAS_CHECK(blas_gemm<T>(ctx_.blas, op(trans_b), op(trans_a), int(N), int(M), int(K), &alpha, B, int(ldb), A,
                                  int(lda), &beta, C, int(ldc)));
  }

  void embedding_forward(const int32_t* tokens, const T* table, int64_t first, int64_t rows, T* out, int64_t N,
                         int64_t D) override {
    launch(elementwise_launch(N * D), cuda::embedding_forward_kernel<T>, tokens, table, first, rows, out, N, D);
  }
  void embedding_backward(const int32_t* tokens, const T* dout, int64_t first, int64_t rows, T* dtable, int64_t N,
                          int64_t D) override {
    if (N == 0) return;
    ScatterOrder order(*ctx_.allocator, N);
    launch(elementwise_launch(N), cuda::embedding_keys_kernel, tokens, first, rows, order.keys(), order.rows(), N);
    sorted_scatter_add(order, dout, nullptr, dtable, N, D);
  }

  void rmsnorm_forward(const T* x, const T* gain, T* y, T* rstd, int64_t N, int64_t D) override {
    launch_rows(row_launch(N, D), cuda::rmsnorm_forward_kernel<T>, x, gain, y, rstd, N, D);
  }
  void rmsnorm_backward(const T* x, const T* gain, const T* rstd, const T* dy, T* dx, T* dgain, int64_t N,
                        int64_t D) override {
    launch_rows(row_launch(N, D), cuda::rmsnorm_backward_dx_kernel<T>, x, gain, rstd, dy, dx, N, D);
    const int64_t chunks = (N + cuda::kDgainChunk - 1) / cuda::kDgainChunk;
    if (chunks == 0) return;
    Workspace partial(*ctx_.allocator, size_t(chunks * D) * sizeof(double));
    double* p = static_cast<double*>(partial.ptr);
    launch(elementwise_launch(chunks * D), cuda::rmsnorm_dgain_partial_kernel<T>, x, rstd, dy, p, N, D);
    launch(elementwise_launch(D), cuda::rmsnorm_dgain_total_kernel<T>, p, chunks, dgain, D);
  }

  void rope(T* x, int64_t B, int64_t T_, int64_t H, int64_t Dh, bool inverse) override {
    MOE_CHECK(Dh % 2 == 0, "rotary embedding needs an even head width, got " << Dh);
    launch(elementwise_launch(B * T_ * H * Dh / 2), cuda::rope_kernel<T>, x, rope_table(T_, Dh), B, T_, H, Dh, inverse);
  }

  void attention_forward(const T* q, const T* k, const T* v, T* out, T* probs, int64_t B, int64_t T_, int64_t H,
                         int64_t Dh) override;
  void attention_backward(const T* q, const T* k, const T* v, const T* probs, const T* dout, T* dq, T* dk, T* dv,
                          T* scratch, int64_t B, int64_t T_, int64_t H, int64_t Dh) override;
  bool fused_attention_supported(int64_t B, int64_t T_, int64_t H, int64_t Dh) override;
  void attention_forward_fused(const T* q, const T* k, const T* v, T* out, T* stats, int64_t B, int64_t T_, int64_t H,
                               int64_t Dh) override;
  void attention_backward_fused(const T* q, const T* k, const T* v, const T* out, const T* stats, const T* dout, T* dq,
                                T* dk, T* dv, int64_t B, int64_t T_, int64_t H, int64_t Dh) override;

  void swiglu_forward(const T* a, const T* b, T* h, int64_t n) override {
    launch(elementwise_launch(n), cuda::swiglu_forward_kernel<T>, a, b, h, n);
  }
  void swiglu_backward(const T* a, const T* b, const T* dh, T* da, T* db, int64_t n) override {
    launch(elementwise_launch(n), cuda::swiglu_backward_kernel<T>, a, b, dh, da, db, n);
  }

  void cross_entropy_forward(const T* logits, const int32_t* targets, T* losses, int64_t N, int64_t V) override {
    launch_rows(row_launch(N, V), cuda::cross_entropy_forward_kernel<T>, logits, targets, losses, N, V);
  }
  void cross_entropy_backward(const T* logits, const int32_t* targets, T scale, T* dlogits, int64_t N,
                              int64_t V) override {
    launch_rows(row_launch(N, V), cuda::cross_entropy_backward_kernel<T>, logits, targets, scale, dlogits, N, V);
  }

  void logits_row_max(const T* logits, int64_t N, int64_t V, double* row_max) override {
    launch_rows(row_launch(N, V), cuda::logits_row_max_kernel<T>, logits, N, V, row_max);
  }
  void logits_sum_exp(const T* logits, const int32_t* targets, int64_t first, const double* row_max, double* sums,
                      int64_t N, int64_t V) override {
    launch_rows(row_launch(N, V), cuda::logits_sum_exp_kernel<T>, logits, targets, first, row_max, sums, N, V);
  }
  void logits_softmax_backward(const T* logits, const int32_t* targets, int64_t first, const T* lse, T scale,
                               T* dlogits, int64_t N, int64_t V) override {
    launch(elementwise_launch(N * V), cuda::logits_softmax_backward_kernel<T>, logits, targets, first, lse, scale,
           dlogits, N, V);
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

  void grouped_gemm(bool trans_a, bool trans_b, int64_t groups, const int64_t* row_offset, int64_t N, int64_t K,
                    T alpha, const T* A, const T* B, T beta, T* C) override;

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
    launch(elementwise_launch(rows * D), cuda::gather_rows_kernel<T>, src, index, scale, dst, rows, D);
  }
  void scatter_add_rows(const T* src, const int32_t* index, const T* scale, T* dst, int64_t rows, int64_t D) override {
    if (rows == 0) return;
    ScatterOrder order(*ctx_.allocator, rows);
    launch(elementwise_launch(rows), cuda::scatter_keys_kernel, index, order.keys(), order.rows(), rows);
    sorted_scatter_add(order, src, scale, dst, rows, D);
  }
  void combine_rows(const T* src, const int32_t* index, const T* weight, T* dst, int64_t N, int64_t K, int64_t D,
                    bool accumulate) override {
    launch(elementwise_launch(N * D), cuda::combine_rows_kernel<T>, src, index, weight, dst, N, K, D, accumulate);
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
                     int64_t M, int64_t E) override {
    if (M == 0) return;
    SlotOrder order(*ctx_.allocator, M);
    launch(elementwise_launch(M), cuda::iota_kernel, order.slots(), M);
    if (by_score) {
      using U = cuda::ScoreKey<T>;
      Workspace keys(*ctx_.allocator, size_t(2 * M) * sizeof(U));
      U* key = static_cast<U*>(keys.ptr);
      launch(elementwise_launch(M), cuda::descending_score_keys_kernel<T>, score, key, M);
      radix_sort(key, key + M, order.slots(), order.sorted_slots(), M, int(8 * sizeof(U)));
      launch(elementwise_launch(M), cuda::expert_keys_kernel, selected, order.sorted_slots(), order.keys(), M, E);
      std::swap(order.slot_in, order.slot_out);
    } else {
      launch(elementwise_launch(M), cuda::expert_keys_kernel, selected, nullptr, order.keys(), M, E);
    }
    radix_sort(order.keys(), order.sorted_keys(), order.slots(), order.sorted_slots(), M, 32);
    Workspace start(*ctx_.allocator, size_t(E + 1) * sizeof(int64_t));
    launch(elementwise_launch(E + 1), cuda::key_starts_kernel, order.sorted_keys(), M, static_cast<int64_t*>(start.ptr),
           E);
    launch(elementwise_launch(M), cuda::capacity_keep_kernel, order.sorted_keys(), order.sorted_slots(),
           static_cast<const int64_t*>(start.ptr), capacity, assigned, M, E);
  }
  // The permutation: the slots stably sorted by assigned expert; each expert's first row by binary search.
  void permute_by_expert(const int32_t* assigned, int64_t* offset, int32_t* perm_slot, int32_t* row_of_slot, int64_t M,
                         int64_t E) override {
    SlotOrder order(*ctx_.allocator, M);
    if (M > 0) {
      launch(elementwise_launch(M), cuda::iota_kernel, order.slots(), M);
      launch(elementwise_launch(M), cuda::expert_keys_kernel, assigned, nullptr, order.keys(), M, E);
      radix_sort(order.keys(), order.sorted_keys(), order.slots(), order.sorted_slots(), M, 32);
      launch(elementwise_launch(M), cuda::permutation_kernel, order.sorted_keys(), order.sorted_slots(), perm_slot,
             row_of_slot, M, E);
    }
    launch(elementwise_launch(E + 1), cuda::key_starts_kernel, order.sorted_keys(), M, offset, E);
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
  void adamw_update(T* p, const T* g, T* m, T* v, int64_t n, const typename Ops<T>::AdamWStep& s) override {
    launch(elementwise_launch(n), cuda::adamw_kernel<T>, p, g, m, v, n, s.beta1, s.beta2, s.step_size, s.inv_bc2, s.eps,
           s.decay);
  }

 private:
  // The rotary angles' cos and sin for (T, Dh), made on the host with the CPU backend's formula and kept on the
  // device for the last shape asked for (every layer of a step asks for the same one).
  const T* rope_table(int64_t T_, int64_t Dh) {
    if (rope_seq_ == T_ && rope_dh_ == Dh) return static_cast<const T*>(rope_);
    const int64_t pairs = Dh / 2;
    std::vector<T> host(size_t(2 * T_ * pairs));
    for (int64_t i = 0; i < pairs; ++i) {
      const double frequency = std::pow(cuda::kRopeBase, -2.0 * double(i) / double(Dh));
      for (int64_t t = 0; t < T_; ++t) {
        host[size_t(2 * (t * pairs + i))] = T(std::cos(double(t) * frequency));
        host[size_t(2 * (t * pairs + i) + 1)] = T(std::sin(double(t) * frequency));
      }
    }
    if (rope_) ctx_.allocator->free(rope_);
    rope_ = ctx_.allocator->allocate(host.size() * sizeof(T));
    MOE_CUDA_CHECK(cudaMemcpyAsync(rope_, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice, ctx_.stream));
    ctx_.watchers->wait(ctx_.stream);  // the host vector goes when this returns
    rope_seq_ = T_, rope_dh_ = Dh;
    return static_cast<const T*>(rope_);
  }
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
  void radix_sort(const K* keys, K* sorted_keys, const int32_t* values, int32_t* sorted_values, int64_t n, int bits) {
    size_t bytes = 0;
    MOE_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, bytes, keys, sorted_keys, values, sorted_values, int(n), 0,
                                                   bits, ctx_.stream));
    Workspace temp(*ctx_.allocator, std::max<size_t>(bytes, 1));
    MOE_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp.ptr, bytes, keys, sorted_keys, values, sorted_values, int(n), 0,
                                                   bits, ctx_.stream));
  }

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
  void sorted_scatter_add(ScatterOrder& order, const T* src, const T* scale, T* dst, int64_t rows, int64_t D) {
    size_t bytes = 0;
    MOE_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, bytes, order.keys(), order.sorted_keys(), order.rows(),
                                                   order.sorted_rows(), int(rows), 0, 32, ctx_.stream));
    Workspace temp(*ctx_.allocator, std::max<size_t>(bytes, 1));
    MOE_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp.ptr, bytes, order.keys(), order.sorted_keys(), order.rows(),
                                                   order.sorted_rows(), int(rows), 0, 32, ctx_.stream));
    launch(elementwise_launch(rows * D), cuda::sorted_scatter_add_kernel<T>, src, order.sorted_keys(),
           order.sorted_rows(), scale, dst, rows, D);
  }

  void gemm_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, T alpha, const T* A, int64_t lda,
                 const T* B, int64_t ldb, T beta, T* C, int64_t ldc);
  // x (rows, cols, leading dimension ld) as a bf16 GEMM reads it, packed into `out`: bf16 bits for fp32
  // storage, values rounded to bf16 in T for fp64.
  void round_operand(const T* x, int64_t rows, int64_t cols, int64_t ld, void* out) {
    if constexpr (sizeof(T) == 4)
      launch(elementwise_launch(rows * cols), cuda::to_bf16_kernel<T>, x, rows, cols, ld, static_cast<uint16_t*>(out));
    else
      launch(elementwise_launch(rows * cols), cuda::round_to_bf16_kernel<T>, x, rows, cols, ld, static_cast<T*>(out));
  }
  // An operand inside the parameters' memory (Ops::set_parameter_memory) read from their rounded copy, at the
  // same offset and leading dimension; the copy is remade at the first use after a change. Null outside it.
  const void* rounded_parameter(const T* x) {
    if (!this->in_parameters(x)) return nullptr;
    const size_t bytes = size_t(this->parameter_count()) * kOperandBytes;
    if (rounded_bytes_ != bytes) {
      if (rounded_) ctx_.allocator->free(rounded_);
      rounded_ = ctx_.allocator->allocate(bytes), rounded_bytes_ = bytes, rounded_version_ = ~uint64_t(0);
    }
    if (rounded_version_ != this->parameter_version()) {
      round_operand(this->parameter_memory(), 1, this->parameter_count(), this->parameter_count(), rounded_);
      rounded_version_ = this->parameter_version();
    }
    return static_cast<const char*>(rounded_) + (x - this->parameter_memory()) * int64_t(kOperandBytes);
  }
  // X rounded for a GEMM: the parameters' copy (ld kept), or a packed copy in `w` (ld becomes cols).
  const void* gemm_operand(const T* X, int64_t rows, int64_t cols, int64_t& ld, std::optional<Workspace>& w) {
    if (const void* r = rounded_parameter(X)) return r;
    w.emplace(*ctx_.allocator, size_t(rows * cols) * kOperandBytes);
    round_operand(X, rows, cols, ld, w->ptr);
    ld = cols;
    return w->ptr;
  }
  void* rounded_ = nullptr;  // the parameters rounded (from the allocator; freed with the ops)
  size_t rounded_bytes_ = 0;
  uint64_t rounded_version_ = ~uint64_t(0);
  static constexpr size_t kOperandBytes = sizeof(T) == 4 ? 2 : sizeof(T);  // per element of a rounded operand
  // cuBLAS refused the grouped bf16 GEMM into fp32 (its grouped Ex lists no such type combination): from then on
  // one GEMM per expert, without asking again.
  bool grouped_bf16_refused_ = false;
  void grouped_call_bf16(const GroupedGemmPlan& plan, T alpha, const void* A, const void* B, T beta, T* C);

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

// GemmPrecision::Bf16: both operands rounded into packed workspace, then cuBLAS with bf16 inputs, fp32
// products summed in fp32 (tensor cores) into the fp32 C. fp64 storage: the rounded values in fp64, a DGEMM.
template <typename T>
void CudaOps<T>::gemm_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, T alpha, const T* A,
                           int64_t lda, const T* B, int64_t ldb, T beta, T* C, int64_t ldc) {
  std::optional<Workspace> a_space, b_space;  // for operands outside the parameters
  const void* a = gemm_operand(A, trans_a ? K : M, trans_a ? M : K, lda, a_space);
  const void* b = gemm_operand(B, trans_b ? N : K, trans_b ? K : N, ldb, b_space);
  if constexpr (sizeof(T) == 4) {
    MOE_CUBLAS_CHECK(cublasGemmEx(ctx_.blas, op(trans_b), op(trans_a), int(N), int(M), int(K), &alpha, b, CUDA_R_16BF,
                                  int(ldb), a, CUDA_R_16BF, int(lda), &beta, C, CUDA_R_32F, int(ldc),
                                  CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  } else {
    MOE_CUBLAS_CHECK(blas_gemm<T>(ctx_.blas, op(trans_b), op(trans_a), int(N), int(M), int(K), &alpha,
                                  static_cast<const T*>(b), int(ldb), static_cast<const T*>(a), int(lda), &beta, C,
                                  int(ldc)));
  }
}

// Per (batch, head): S = scale Q K^T into the probabilities, the causal softmax over its rows, O = P V.
template <typename T>
void CudaOps<T>::attention_forward(const T* q, const T* k, const T* v, T* out, T* probs, int64_t B, int64_t T_,
                                   int64_t H, int64_t Dh) {
  const int64_t D = H * Dh;
  const T scale = T(1.0 / std::sqrt(double(Dh)));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      const int64_t off = b * T_ * D + h * Dh;
      T* P = probs + (b * H + h) * T_ * T_;
      gemm(false, true, T_, T_, Dh, scale, q + off, D, k + off, D, T(0), P, T_);
    }
  launch_rows(row_launch(B * H * T_, T_), cuda::causal_softmax_kernel<T>, probs, B * H * T_, T_);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      const int64_t off = b * T_ * D + h * Dh;
      gemm(false, false, T_, Dh, T_, T(1), probs + (b * H + h) * T_ * T_, T_, v + off, D, T(0), out + off, D);
    }
}

template <typename T>
void CudaOps<T>::attention_backward(const T* q, const T* k, const T* v, const T* probs, const T* dout, T* dq, T* dk,
                                    T* dv, T* scratch, int64_t B, int64_t T_, int64_t H, int64_t Dh) {
  const int64_t D = H * Dh;
  const double scale = 1.0 / std::sqrt(double(Dh));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      const int64_t off = b * T_ * D + h * Dh;
      const T* P = probs + (b * H + h) * T_ * T_;
      gemm(false, true, T_, T_, Dh, T(1), dout + off, D, v + off, D, T(0), scratch, T_);  // dP = dO V^T
      gemm(true, false, T_, Dh, T_, T(1), P, T_, dout + off, D, T(0), dv + off, D);       // dV = P^T dO
      launch_rows(row_launch(T_, T_), cuda::softmax_backward_kernel<T>, P, scratch, T_, scale);
      gemm(false, false, T_, Dh, T_, T(1), scratch, T_, k + off, D, T(0), dq + off, D);  // dQ = dS K
      gemm(true, false, T_, Dh, T_, T(1), scratch, T_, q + off, D, T(0), dk + off, D);   // dK = dS^T Q
    }
}

// Fused attention runs on cuDNN for fp32 storage under bf16 GEMMs (cudnn_attention.h), where it built the shape's
// plans; the operands are rounded to bf16 as the plain form's products read them.
template <typename T>
bool CudaOps<T>::fused_attention_supported(int64_t B, int64_t T_, int64_t H, int64_t Dh) {
  if constexpr (sizeof(T) != 4) {
    return false;
  } else {
#ifdef MOE_HAVE_CUDNN
    if (!ctx_.attention || !this->fused_attention_allowed() || this->gemm_precision() != GemmPrecision::Bf16 ||
        !cudnn_enabled_ || Dh % 8 != 0)
      return false;
    return ctx_.attention->supported({B, T_, H, Dh});
#else
    (void)B, (void)T_, (void)H, (void)Dh;
    return false;
#endif
  }
}

// Sections of bf16 copies in one workspace, each at a 256-byte boundary.
struct Bf16Sections {
  Bf16Sections(CachingAllocator& a, int64_t count, int64_t n)
      : stride((n + 127) / 128 * 128), space(a, size_t(count * stride) * 2) {}
  uint16_t* operator[](int64_t i) const { return static_cast<uint16_t*>(space.ptr) + i * stride; }
  int64_t stride;
  Workspace space;
};

template <typename T>
void CudaOps<T>::attention_forward_fused(const T* q, const T* k, const T* v, T* out, T* stats, int64_t B, int64_t T_,
                                         int64_t H, int64_t Dh) {
  MOE_CHECK(fused_attention_supported(B, T_, H, Dh),
            "fused attention on the cuda backend for B " << B << " T " << T_ << " H " << H << " Dh " << Dh);
#ifdef MOE_HAVE_CUDNN
  if constexpr (sizeof(T) == 4) {
    const int64_t n = B * T_ * H * Dh;
    Bf16Sections b(*ctx_.allocator, 4, n);  // q, k, v, o
    round_operand(q, 1, n, n, b[0]), round_operand(k, 1, n, n, b[1]), round_operand(v, 1, n, n, b[2]);
    // The statistics through aligned workspace: the caller's may sit at any float of an activation arena.
    Workspace aligned_stats(*ctx_.allocator, size_t(B * H * T_) * sizeof(float));
    ctx_.attention->forward({B, T_, H, Dh}, b[0], b[1], b[2], b[3], static_cast<float*>(aligned_stats.ptr));
    copy(static_cast<const T*>(aligned_stats.ptr), stats, B * H * T_);
    launch(elementwise_launch(n), cuda::from_bf16_kernel<T>, b[3], out, n);
  }
#endif
}

template <typename T>
void CudaOps<T>::attention_backward_fused(const T* q, const T* k, const T* v, const T* out, const T* stats,
                                          const T* dout, T* dq, T* dk, T* dv, int64_t B, int64_t T_, int64_t H,
                                          int64_t Dh) {
  MOE_CHECK(fused_attention_supported(B, T_, H, Dh),
            "fused attention on the cuda backend for B " << B << " T " << T_ << " H " << H << " Dh " << Dh);
#ifdef MOE_HAVE_CUDNN
  if constexpr (sizeof(T) == 4) {
    const int64_t n = B * T_ * H * Dh;
    Bf16Sections b(*ctx_.allocator, 8, n);  // q, k, v, o, do; dq, dk, dv
    const T* inputs[5] = {q, k, v, out, dout};
    for (int i = 0; i < 5; ++i) round_operand(inputs[i], 1, n, n, b[i]);
    Workspace aligned_stats(*ctx_.allocator, size_t(B * H * T_) * sizeof(float));
    copy(stats, static_cast<T*>(aligned_stats.ptr), B * H * T_);
    ctx_.attention->backward({B, T_, H, Dh}, b[0], b[1], b[2], b[3], static_cast<const float*>(aligned_stats.ptr), b[4],
                             b[5], b[6], b[7]);
    T* outputs[3] = {dq, dk, dv};
    for (int i = 0; i < 3; ++i) launch(elementwise_launch(n), cuda::from_bf16_kernel<T>, b[5 + i], outputs[i], n);
  }
#endif
}

// The scores' column means first (E doubles of workspace, one thread per column), then one thread per row.
template <typename T>
void CudaOps<T>::router_loss_backward(const T* logits, const T* scores, const T* f,
                                      const typename Ops<T>::RouterLossGrad& c, T* dp, T* dz, int64_t N, int64_t E) {
  if (N == 0 || E == 0) return;
  Workspace means(*ctx_.allocator, size_t(E) * sizeof(double));
  double* P = static_cast<double*>(means.ptr);
  launch(elementwise_launch(E), cuda::column_means_kernel<T>, scores, P, N, E);
  launch(elementwise_launch(N), cuda::router_loss_backward_kernel<T>, logits, scores, f, P, c.scale, c.coef_aux,
         c.coef_z, c.coef_entropy, c.coef_death, c.death_floor, c.coef_warmup, c.warming, dp, dz, N, E);
}

// Chunks of a fixed size whatever the device, each summed by one block, then the chunks in order.
template <typename T>
void CudaOps<T>::sum_squares_into(const T* x, int64_t n, double* out) {
  constexpr int64_t kChunk = 4096;
  const int64_t chunks = std::max<int64_t>(1, (n + kChunk - 1) / kChunk);
  Workspace partial(*ctx_.allocator, size_t(chunks) * sizeof(double));
  double* d = static_cast<double*>(partial.ptr);
  launch_rows(row_launch(chunks, kChunk), cuda::sum_squares_chunks_kernel<T>, x, n, kChunk, d, chunks);
  launch(LaunchConfig{1, 1}, cuda::sum_in_order_kernel, d, chunks, out);
}

template <typename T>
double CudaOps<T>::sum_squares_to_host(const T* x, int64_t n) {
  Workspace result(*ctx_.allocator, sizeof(double));
  double* d = static_cast<double*>(result.ptr);
  sum_squares_into(x, n, d);
  double total = 0;
  ctx_.watchers->wait_if_watched(ctx_.stream);  // the sum, interruptibly; then the copy waits for nothing
  MOE_CUDA_CHECK(cudaMemcpyAsync(&total, d, sizeof(double), cudaMemcpyDeviceToHost, ctx_.stream));
  MOE_CUDA_CHECK(cudaStreamSynchronize(ctx_.stream));
  return total;
}

template <typename T>
cublasStatus_t grouped_call(cublasHandle_t h, const cublasOperation_t* ta, const cublasOperation_t* tb, const int* m,
                            const int* n, const int* k, const T* alpha, const T* const* A, const int* lda,
                            const T* const* B, const int* ldb, const T* beta, T* const* C, const int* ldc, int groups,
                            const int* group_size) {
  if constexpr (sizeof(T) == 4)
    return cublasSgemmGroupedBatched(h, ta, tb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc, groups, group_size);
  else
    return cublasDgemmGroupedBatched(h, ta, tb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc, groups, group_size);
}

// One cuBLAS call for every non-empty expert: the plan's per-group arguments on the host, its operand
// pointers in a device array.
template <typename T>
void CudaOps<T>::grouped_gemm(bool trans_a, bool trans_b, int64_t groups, const int64_t* row_offset, int64_t N,
                              int64_t K, T alpha, const T* A, const T* B, T beta, T* C) {
  const GroupedGemmPlan plan = plan_grouped_gemm(trans_a, trans_b, groups, row_offset, N, K);
  const size_t P = plan.problems();
  if (P == 0) return;
  if (this->gemm_precision() == GemmPrecision::Bf16 && K > 0) {
    // Both operands are contiguous, so rounded whole as one row each (the plan's offsets hold for the copies);
    // the experts' weights come from the parameters' rounded copy when they are parameters.
    int64_t a_count = row_offset[groups] * K, b_count = trans_a ? row_offset[groups] * N : groups * K * N;
    std::optional<Workspace> a_space, b_space;
    const void* a = gemm_operand(A, 1, a_count, a_count, a_space);
    const void* b = gemm_operand(B, 1, b_count, b_count, b_space);
    return grouped_call_bf16(plan, alpha, a, b, beta, C);
  }
  std::vector<cublasOperation_t> ta(P), tb(P);
  std::vector<T> alphas(P, alpha), betas(P, beta);
  std::vector<int> sizes(P, 1);
  std::vector<const T*> host_pointers(3 * P);  // first operands, second operands, C
  for (size_t i = 0; i < P; ++i) {
    ta[i] = op(plan.trans_first[i]), tb[i] = op(plan.trans_second[i]);
    host_pointers[i] = B + plan.first_offset[i];
    host_pointers[P + i] = A + plan.second_offset[i];
    host_pointers[2 * P + i] = C + plan.c_offset[i];
  }
  Workspace pointers(*ctx_.allocator, host_pointers.size() * sizeof(T*));
  // From pageable memory: returns once the host array is staged, so it may go out of scope.
  MOE_CUDA_CHECK(cudaMemcpyAsync(pointers.ptr, host_pointers.data(), host_pointers.size() * sizeof(T*),
                                 cudaMemcpyHostToDevice, ctx_.stream));
  const T* const* device = static_cast<const T* const*>(pointers.ptr);
  MOE_CUBLAS_CHECK(grouped_call<T>(ctx_.blas, ta.data(), tb.data(), plan.m.data(), plan.n.data(), plan.k.data(),
                                   alphas.data(), device, plan.ld_first.data(), device + P, plan.ld_second.data(),
                                   betas.data(), const_cast<T* const*>(device + 2 * P), plan.ld_c.data(), int(P),
                                   sizes.data()));
}

// The grouped GEMM on rounded operands (packed like the originals). fp32 storage: one
// cublasGemmGroupedBatchedEx with bf16 inputs and fp32 C; where this cuBLAS does not take that combination,
// one cublasGemmEx per expert (said once on stderr). fp64 storage: the rounded values through the DGEMM path.
template <typename T>
void CudaOps<T>::grouped_call_bf16(const GroupedGemmPlan& plan, T alpha, const void* A, const void* B, T beta, T* C) {
  const size_t P = plan.problems();
  const auto* a = static_cast<const char*>(A);
  const auto* b = static_cast<const char*>(B);
  std::vector<cublasOperation_t> ta(P), tb(P);
  std::vector<T> alphas(P, alpha), betas(P, beta);
  std::vector<int> sizes(P, 1);
  std::vector<const void*> host_pointers(3 * P);
  for (size_t i = 0; i < P; ++i) {
    ta[i] = op(plan.trans_first[i]), tb[i] = op(plan.trans_second[i]);
    host_pointers[i] = b + plan.first_offset[i] * int64_t(kOperandBytes);
    host_pointers[P + i] = a + plan.second_offset[i] * int64_t(kOperandBytes);
    host_pointers[2 * P + i] = C + plan.c_offset[i];
  }
  // The device array of operand pointers the grouped calls read (the per-expert fallback needs none).
  std::optional<Workspace> pointers;
  auto device_pointers = [&] {
    pointers.emplace(*ctx_.allocator, host_pointers.size() * sizeof(void*));
    MOE_CUDA_CHECK(cudaMemcpyAsync(pointers->ptr, host_pointers.data(), host_pointers.size() * sizeof(void*),
                                   cudaMemcpyHostToDevice, ctx_.stream));
    return static_cast<const void* const*>(pointers->ptr);
  };
  if constexpr (sizeof(T) == 8) {
    const void* const* device = device_pointers();
    MOE_CUBLAS_CHECK(grouped_call<T>(ctx_.blas, ta.data(), tb.data(), plan.m.data(), plan.n.data(), plan.k.data(),
                                     alphas.data(), reinterpret_cast<const T* const*>(device), plan.ld_first.data(),
                                     reinterpret_cast<const T* const*>(device + P), plan.ld_second.data(), betas.data(),
                                     reinterpret_cast<T* const*>(const_cast<void**>(device + 2 * P)), plan.ld_c.data(),
                                     int(P), sizes.data()));
    return;
  } else {
    if (!grouped_bf16_refused_) {
      const void* const* device = device_pointers();
      const cublasStatus_t grouped =
          cublasGemmGroupedBatchedEx(ctx_.blas, ta.data(), tb.data(), plan.m.data(), plan.n.data(), plan.k.data(),
                                     alphas.data(), device, CUDA_R_16BF, plan.ld_first.data(), device + P, CUDA_R_16BF,
                                     plan.ld_second.data(), betas.data(), const_cast<void* const*>(device + 2 * P),
                                     CUDA_R_32F, plan.ld_c.data(), int(P), sizes.data(), CUBLAS_COMPUTE_32F);
      if (grouped == CUBLAS_STATUS_SUCCESS) return;
      if (grouped != CUBLAS_STATUS_NOT_SUPPORTED && grouped != CUBLAS_STATUS_INVALID_VALUE)
        MOE_RUN_FAILED("cublasGemmGroupedBatchedEx: " << cublasGetStatusString(grouped));
      grouped_bf16_refused_ = true;
      static bool said = false;
      if (!said)
        std::fprintf(stderr, "moe: this cuBLAS has no grouped bf16 GEMM into fp32 (%s); one GEMM per expert instead\n",
                     cublasGetStatusString(grouped));
      said = true;
    }
    for (size_t i = 0; i < P; ++i)
      MOE_CUBLAS_CHECK(cublasGemmEx(ctx_.blas, ta[i], tb[i], plan.m[i], plan.n[i], plan.k[i], &alpha, host_pointers[i],
                                    CUDA_R_16BF, plan.ld_first[i], host_pointers[P + i], CUDA_R_16BF, plan.ld_second[i],
                                    &beta, const_cast<void*>(host_pointers[2 * P + i]), CUDA_R_32F, plan.ld_c[i],
                                    CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  }
}

class CudaStream final : public Stream {
 public:
  CudaStream(cudaStream_t s, Watchers& watchers) : stream_(s), watchers_(watchers) {}
  void synchronize() override { watchers_.wait(stream_); }

 private:
  cudaStream_t stream_;
  Watchers& watchers_;
};

class CudaBackend final : public Backend {
 public:
  CudaBackend(int device, const CudaOptions& options);
  ~CudaBackend() override;
  const char* name() const override { return "cuda"; }
  bool memory_is_host() const override { return false; }
  int threads() const override { return threads_; }
  void set_threads(int threads) override { threads_ = threads > 0 ? threads : 1; }
  void copy_to_device(void* dst, const void* src, size_t bytes) override {
    copy_on_stream(dst, src, bytes, cudaMemcpyHostToDevice);
  }
  void copy_bytes_to_host(void* dst, const void* src, size_t bytes) override {
    watchers_.wait_if_watched(ctx_.stream);  // the queued work first, interruptibly: the pageable copy blocks
    copy_on_stream(dst, src, bytes, cudaMemcpyDeviceToHost);
  }
  void copy(void* dst, const void* src, size_t bytes) override {
    copy_on_stream(dst, src, bytes, cudaMemcpyDeviceToDevice);
  }
  Stream& stream() override { return *stream_object_; }
  cudaStream_t native_stream() const { return ctx_.stream; }
  CachingAllocator& allocator() { return *allocator_; }
  Watchers& watchers() { return watchers_; }
  int64_t allocated_bytes() const override { return allocator_->stats().in_use; }
  int64_t peak_bytes() const override { return allocator_->stats().peak_in_use; }

 protected:
  void* allocate_bytes(size_t bytes) override {
    void* p = allocator_->allocate(bytes);
    MOE_CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, ctx_.stream));
    return p;
  }
  void free_bytes(void* p, size_t) noexcept override { allocator_->free(p); }
  Ops<float>& ops_f32() override { return *f32_; }
  Ops<double>& ops_f64() override { return *f64_; }

 private:
  void copy_on_stream(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
    if (bytes > 0 && dst != src) MOE_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, kind, ctx_.stream));
  }
  int device_ = 0, threads_ = 1;
  Watchers watchers_;
  CudaContext ctx_;
  std::unique_ptr<CachingAllocator> allocator_;
#ifdef MOE_HAVE_CUDNN
  std::unique_ptr<cuda::CudnnAttention> attention_;
#endif
  std::unique_ptr<CudaStream> stream_object_;
  std::unique_ptr<CudaOps<float>> f32_;
  std::unique_ptr<CudaOps<double>> f64_;
};

CudaBackend::CudaBackend(int device, const CudaOptions& options) : device_(device) {
  MOE_CUDA_CHECK(cudaSetDevice(device));
  ctx_.fused_attention = options.fused_attention;
  MOE_CUDA_CHECK(cudaStreamCreateWithFlags(&ctx_.stream, cudaStreamNonBlocking));
  MOE_CUBLAS_CHECK(cublasCreate(&ctx_.blas));
  MOE_CUBLAS_CHECK(cublasSetStream(ctx_.blas, ctx_.stream));
  // fp32 GEMMs in fp32 (no TF32): the conformance bounds are fp32's.
  MOE_CUBLAS_CHECK(cublasSetMathMode(ctx_.blas, CUBLAS_DEFAULT_MATH));
  allocator_ = std::make_unique<CachingAllocator>(CachingAllocator::Source{[](size_t bytes) -> void* {
                                                                             void* p = nullptr;
                                                                             return cudaMalloc(&p, bytes) == cudaSuccess
                                                                                        ? p
                                                                                        : (cudaGetLastError(), nullptr);
                                                                           },
                                                                           [](void* p, size_t) { cudaFree(p); }});
  ctx_.allocator = allocator_.get();
  ctx_.watchers = &watchers_;
#ifdef MOE_HAVE_CUDNN
  attention_ = std::make_unique<cuda::CudnnAttention>(ctx_.stream, *allocator_,
                                                      options.fused_attention != FusedAttention::Nondeterministic);
  ctx_.attention = attention_.get();
#endif
  stream_object_ = std::make_unique<CudaStream>(ctx_.stream, watchers_);
  f32_ = std::make_unique<CudaOps<float>>(ctx_);
  f64_ = std::make_unique<CudaOps<double>>(ctx_);
}

CudaBackend::~CudaBackend() {
  cudaStreamSynchronize(ctx_.stream);
  f32_.reset(), f64_.reset();  // their rounded parameters go back to the allocator
#ifdef MOE_HAVE_CUDNN
  attention_.reset();  // its plans and cuDNN handle, before the stream
#endif
  allocator_.reset();  // cached blocks back to the driver
  cublasDestroy(ctx_.blas);
  cudaStreamDestroy(ctx_.stream);
}

}  // namespace

bool cuda_backend_built() { return true; }

int cuda_device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // no driver or no device: not an error to keep
    return 0;
  }
  return count;
}

int64_t cuda_device_memory_bytes(int device) {
  if (device < 0 || device >= cuda_device_count()) return 0;
  cudaDeviceProp prop;
  if (cudaGetDeviceProperties(&prop, device) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return int64_t(prop.totalGlobalMem);
}

std::unique_ptr<Backend> make_cuda_backend(int device, const CudaOptions& options) {
  const int count = cuda_device_count();
  if (count == 0) MOE_BAD_INPUT("train.device = \"cuda\", but this machine has no CUDA device (or no driver for one)");
  if (device < 0 || device >= count)
    MOE_BAD_INPUT("CUDA device " << device << " does not exist: this process sees " << count);
  return std::make_unique<CudaBackend>(device, options);
}

namespace {

CudaBackend& cuda_backend_of(Backend& backend, const char* what) {
  auto* cuda = dynamic_cast<CudaBackend*>(&backend);
  if (!cuda) MOE_BAD_INPUT("the " << backend.name() << " backend has no CUDA " << what);
  return *cuda;
}

}  // namespace

void* cuda_stream_of(Backend& backend) {
  return static_cast<void*>(cuda_backend_of(backend, "stream").native_stream());
}

uint64_t cuda_begin_side_work(Backend& backend) {
  return cuda_backend_of(backend, "memory").allocator().begin_side_work();
}

void cuda_end_side_work(Backend& backend, uint64_t ticket) {
  cuda_backend_of(backend, "memory").allocator().end_side_work(ticket);
}

uint64_t cuda_watch(Backend& backend, std::function<void()> check) {
  return cuda_backend_of(backend, "stream").watchers().add(std::move(check));
}

void cuda_unwatch(Backend& backend, uint64_t id) { cuda_backend_of(backend, "stream").watchers().remove(id); }

}  // namespace moe
