// The MoE layer's dispatch-plan kernels of moe_plan_ops.h.
#include "core/backend/cuda/cuda_check.h"
#include "core/backend/cuda/launch_config.h"
#include "core/backend/cuda/moe_plan_ops.h"

namespace moe::cuda {
namespace {

template <typename T>
__global__ void permuted_rows_kernel(const int32_t* perm_slot, const T* gate, int64_t K, int32_t* perm_token,
                                     T* perm_gate, int64_t M) {
  for (int64_t r = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; r < M; r += int64_t(gridDim.x) * blockDim.x) {
    const int32_t slot = perm_slot[r];
    perm_token[r] = slot < 0 ? -1 : int32_t(slot / K);
    perm_gate[r] = slot < 0 ? T(0) : gate[slot];
  }
}

}  // namespace

template <typename T>
void permuted_rows(cudaStream_t stream, const int32_t* perm_slot, const T* gate, int64_t K, int32_t* perm_token,
                   T* perm_gate, int64_t M) {
  if (M == 0) return;
  const LaunchConfig c = elementwise_launch(M);
  permuted_rows_kernel<T><<<c.blocks, c.threads, 0, stream>>>(perm_slot, gate, K, perm_token, perm_gate, M);
  MOE_CUDA_LAUNCHED();
}

template void permuted_rows<float>(cudaStream_t, const int32_t*, const float*, int64_t, int32_t*, float*, int64_t);
template void permuted_rows<double>(cudaStream_t, const int32_t*, const double*, int64_t, int32_t*, double*, int64_t);

}  // namespace moe::cuda
