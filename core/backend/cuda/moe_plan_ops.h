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

}  // namespace moe::cuda
