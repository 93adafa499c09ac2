// The MoE layer's dispatch-plan kernels that live outside cuda_backend.cu (core/backend/cuda/moe_plan_ops.cu), each
// enqueued on the backend's compute stream; CudaOps forwards the ops of core/backend/ops.h to them.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace moe::cuda {

// Ops::permuted_rows: one thread per permuted row.
template <typename T>
void permuted_rows(cudaStream_t stream, const int32_t* perm_slot, const T* gate, int64_t K, int32_t* perm_token,
                   T* perm_gate, int64_t M);

}  // namespace moe::cuda
