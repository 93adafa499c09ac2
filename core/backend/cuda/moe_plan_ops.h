// The MoE layer's dispatch-plan kernels that live outside cuda_backend.cu (core/backend/cuda/moe_plan_ops.cu), each
// enqueued on the backend's compute stream; CudaOps forwards the ops of core/backend/ops.h to them.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/backend/cuda/caching_allocator.h"

namespace moe::cuda {

// Ops::restrict_permutation: a flag per row of the permutation whose slot lies in the part, their exclusive prefix
// sums (CUB) the rows in the part; one thread per row writes it, one per expert its offset. Workspace from
// `allocator`, ordered on the stream.
void restrict_permutation(cudaStream_t stream, CachingAllocator& allocator, const int64_t* offset,
                          const int32_t* perm_slot, int64_t lo, int64_t hi, int64_t* part_offset,
                          int32_t* part_perm_slot, int32_t* part_row_of_slot, int64_t M, int64_t E);

// Ops::permuted_rows: one thread per permuted row.
template <typename T>
void permuted_rows(cudaStream_t stream, const int32_t* perm_slot, const T* gate, int64_t K, int32_t* perm_token,
                   T* perm_gate, int64_t M);

// Ops::reroute_overflow in two kernels around the caller's compaction: flag[i] = whether the slot order[i] (N K of
// them) overflowed; then one block walks the `count` overflowed slots (device memory) in their order and reroutes
// them one after another, its threads trying a slot's candidates at once, the experts' loads in shared memory.
void overflowed_flags(cudaStream_t stream, const int32_t* order, const int32_t* preference, int64_t W,
                      const int32_t* assigned, int32_t* flag, int64_t N, int64_t K);
void reroute_walk(cudaStream_t stream, const int32_t* overflowed, const int32_t* count, const int32_t* preference,
                  int64_t W, int64_t capacity, int32_t* assigned, int64_t* rerouted, int64_t N, int64_t K, int64_t E);

// Ops::fallback_rows in two kernels around the caller's exclusive sums: the flags of each token (N) and slot (N K)
// that the fallback computes, then, from their sums, each one's place, the rows, the weights and the counts.
void fallback_flags(cudaStream_t stream, const int32_t* selected, const int32_t* assigned, int64_t K,
                    int32_t* token_flag, int32_t* slot_flag, int64_t N);
template <typename T>
void fallback_place(cudaStream_t stream, const int32_t* selected, const int32_t* assigned, const T* gate, int64_t K,
                    const int32_t* token_flag, const int32_t* token_at, const int32_t* slot_flag,
                    const int32_t* slot_at, int32_t* token, T* weight, int32_t* source, int32_t* slot, int64_t* count,
                    int64_t N);

}  // namespace moe::cuda
