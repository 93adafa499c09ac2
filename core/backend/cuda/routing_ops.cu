// The CUDA ops that sort or scan (CUB): the dispatch plan's capacity, reroute, fallback rows and permutation, the
// deterministic scatter-adds (embedding backward, scatter_add_rows), and the router losses' backward.
#include <cuda_runtime.h>

#include <algorithm>
#include <cub/cub.cuh>
#include <utility>

#include "core/backend/cuda/cuda_ops.cuh"

namespace moe::cuda {

template <typename T>
template <typename K>
void CudaOps<T>::radix_sort(const K* keys, K* sorted_keys, const int32_t* values, int32_t* sorted_values, int64_t n,
                            int bits) {
  size_t bytes = 0;
  MOE_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, bytes, keys, sorted_keys, values, sorted_values, int(n), 0,
                                                 bits, ctx_.stream));
  Workspace temp(*ctx_.allocator, std::max<size_t>(bytes, 1));
  MOE_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp.ptr, bytes, keys, sorted_keys, values, sorted_values, int(n), 0,
                                                 bits, ctx_.stream));
}

template <typename T>
void CudaOps<T>::sorted_scatter_add(ScatterOrder& order, const T* src, const T* scale, T* dst, int64_t rows,
                                    int64_t D) {
  size_t bytes = 0;
  MOE_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, bytes, order.keys(), order.sorted_keys(), order.rows(),
                                                 order.sorted_rows(), int(rows), 0, 32, ctx_.stream));
  Workspace temp(*ctx_.allocator, std::max<size_t>(bytes, 1));
  MOE_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp.ptr, bytes, order.keys(), order.sorted_keys(), order.rows(),
                                                 order.sorted_rows(), int(rows), 0, 32, ctx_.stream));
  launch(row_launch(rows, D), cuda::sorted_scatter_add_kernel<T>, src, order.sorted_keys(), order.sorted_rows(), scale,
         dst, rows, D);
}

template <typename T>
void CudaOps<T>::embedding_backward(const int32_t* tokens, const T* dout, int64_t first, int64_t rows, T* dtable,
                                    int64_t N, int64_t D) {
  if (N == 0) return;
  ScatterOrder order(*ctx_.allocator, N);
  launch(elementwise_launch(N), cuda::embedding_keys_kernel, tokens, first, rows, order.keys(), order.rows(), N);
  sorted_scatter_add(order, dout, nullptr, dtable, N, D);
}

template <typename T>
void CudaOps<T>::scatter_add_rows(const T* src, const int32_t* index, const T* scale, T* dst, int64_t rows, int64_t D) {
  if (rows == 0) return;
  ScatterOrder order(*ctx_.allocator, rows);
  launch(elementwise_launch(rows), cuda::scatter_keys_kernel, index, order.keys(), order.rows(), rows);
  sorted_scatter_add(order, src, scale, dst, rows, D);
}

template <typename T>
void CudaOps<T>::capacity_keep(const int32_t* selected, const T* score, bool by_score, int64_t capacity,
                               int32_t* assigned, int64_t M, int64_t E) {
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

// The priority order is capacity_keep's first sort alone (by descending score, stably from slot order; by position,
// slot order); the overflowed slots kept in that order (CUB's DeviceSelect, stable); then the one-block walk over
// them alone, their count read on the device.
template <typename T>
void CudaOps<T>::reroute_overflow(const int32_t* preference, int64_t W, const T* score, bool by_score, int64_t capacity,
                                  int32_t* assigned, int64_t* rerouted, int64_t N, int64_t K, int64_t E) {
  const int64_t M = N * K;
  SlotOrder order(*ctx_.allocator, M);
  launch(elementwise_launch(M), cuda::iota_kernel, order.slots(), M);
  const int32_t* priority = order.slots();
  if (by_score && M > 0) {
    using U = cuda::ScoreKey<T>;
    Workspace keys(*ctx_.allocator, size_t(2 * M) * sizeof(U));
    U* key = static_cast<U*>(keys.ptr);
    launch(elementwise_launch(M), cuda::descending_score_keys_kernel<T>, score, key, M);
    radix_sort(key, key + M, order.slots(), order.sorted_slots(), M, int(8 * sizeof(U)));
    priority = order.sorted_slots();
  }
  // The flags and the overflowed slots in the keys' halves of the order's space; their count after them.
  int32_t *flag = order.keys(), *overflowed = order.sorted_keys();
  Workspace count(*ctx_.allocator, sizeof(int32_t));
  int32_t* selected_count = static_cast<int32_t*>(count.ptr);
  MOE_CUDA_CHECK(cudaMemsetAsync(selected_count, 0, sizeof(int32_t), ctx_.stream));
  if (M > 0) {
    cuda::overflowed_flags(ctx_.stream, priority, preference, W, assigned, flag, N, K);
    size_t bytes = 0;
    MOE_CUDA_CHECK(
        cub::DeviceSelect::Flagged(nullptr, bytes, priority, flag, overflowed, selected_count, int(M), ctx_.stream));
    Workspace temp(*ctx_.allocator, std::max<size_t>(bytes, 1));
    MOE_CUDA_CHECK(
        cub::DeviceSelect::Flagged(temp.ptr, bytes, priority, flag, overflowed, selected_count, int(M), ctx_.stream));
  }
  cuda::reroute_walk(ctx_.stream, overflowed, selected_count, preference, W, capacity, assigned, rerouted, N, K, E);
}

// Flags per token and slot, their exclusive sums (CUB) as places, then the rows at their places.
template <typename T>
void CudaOps<T>::fallback_rows(const int32_t* selected, const int32_t* assigned, const T* gate, int64_t K,
                               int32_t* token, T* weight, int32_t* source, int32_t* slot, int64_t* count, int64_t N) {
  const int64_t M = N * K;
  Workspace flags(*ctx_.allocator, size_t(std::max<int64_t>(2 * (N + M), 1)) * sizeof(int32_t));
  int32_t* token_flag = static_cast<int32_t*>(flags.ptr);
  int32_t *token_at = token_flag + N, *slot_flag = token_at + N, *slot_at = slot_flag + M;
  if (N > 0) {
    cuda::fallback_flags(ctx_.stream, selected, assigned, K, token_flag, slot_flag, N);
    size_t token_bytes = 0, slot_bytes = 0;
    MOE_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(nullptr, token_bytes, token_flag, token_at, int(N), ctx_.stream));
    MOE_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(nullptr, slot_bytes, slot_flag, slot_at, int(M), ctx_.stream));
    size_t bytes = std::max<size_t>(std::max(token_bytes, slot_bytes), 1);
    Workspace temp(*ctx_.allocator, bytes);
    MOE_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(temp.ptr, bytes, token_flag, token_at, int(N), ctx_.stream));
    bytes = std::max<size_t>(std::max(token_bytes, slot_bytes), 1);
    MOE_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(temp.ptr, bytes, slot_flag, slot_at, int(M), ctx_.stream));
  }
  cuda::fallback_place(ctx_.stream, selected, assigned, gate, K, token_flag, token_at, slot_flag, slot_at, token,
                       weight, source, slot, count, N);
}

template <typename T>
void CudaOps<T>::permute_by_expert(const int32_t* assigned, int64_t* offset, int32_t* perm_slot, int32_t* row_of_slot,
                                   int64_t M, int64_t E) {
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

template void CudaOps<float>::embedding_backward(const int32_t*, const float*, int64_t, int64_t, float*, int64_t,
                                                 int64_t);
template void CudaOps<float>::scatter_add_rows(const float*, const int32_t*, const float*, float*, int64_t, int64_t);
template void CudaOps<float>::capacity_keep(const int32_t*, const float*, bool, int64_t, int32_t*, int64_t, int64_t);
template void CudaOps<float>::reroute_overflow(const int32_t*, int64_t, const float*, bool, int64_t, int32_t*, int64_t*,
                                               int64_t, int64_t, int64_t);
template void CudaOps<float>::fallback_rows(const int32_t*, const int32_t*, const float*, int64_t, int32_t*, float*,
                                            int32_t*, int32_t*, int64_t*, int64_t);
template void CudaOps<float>::permute_by_expert(const int32_t*, int64_t*, int32_t*, int32_t*, int64_t, int64_t);
template void CudaOps<float>::router_loss_backward(const float*, const float*, const float*,
                                                   const typename Ops<float>::RouterLossGrad&, float*, float*, int64_t,
                                                   int64_t);
template void CudaOps<double>::embedding_backward(const int32_t*, const double*, int64_t, int64_t, double*, int64_t,
                                                  int64_t);
template void CudaOps<double>::scatter_add_rows(const double*, const int32_t*, const double*, double*, int64_t,
                                                int64_t);
template void CudaOps<double>::capacity_keep(const int32_t*, const double*, bool, int64_t, int32_t*, int64_t, int64_t);
template void CudaOps<double>::reroute_overflow(const int32_t*, int64_t, const double*, bool, int64_t, int32_t*,
                                                int64_t*, int64_t, int64_t, int64_t);
template void CudaOps<double>::fallback_rows(const int32_t*, const int32_t*, const double*, int64_t, int32_t*, double*,
                                             int32_t*, int32_t*, int64_t*, int64_t);
template void CudaOps<double>::permute_by_expert(const int32_t*, int64_t*, int32_t*, int32_t*, int64_t, int64_t);
template void CudaOps<double>::router_loss_backward(const double*, const double*, const double*,
                                                    const typename Ops<double>::RouterLossGrad&, double*, double*,
                                                    int64_t, int64_t);

}  // namespace moe::cuda
