// The MoE layer's dispatch-plan kernels of moe_plan_ops.h.
#include <algorithm>
#include <cub/cub.cuh>

#include "core/backend/cuda/cuda_check.h"
#include "core/backend/cuda/cuda_ops.cuh"
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

// flag[i] = 1 where row i (of M, and 0 at i = M) is the part's: its slot lies in [lo, hi) (-1, no slot, does not).
__global__ void part_flags_kernel(const int32_t* perm_slot, int64_t lo, int64_t hi, int32_t* flag, int64_t M) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i <= M; i += int64_t(gridDim.x) * blockDim.x)
    flag[i] = i < M && perm_slot[i] >= lo && perm_slot[i] < hi;
}

// Each of the part's rows at its place among them (row: the flags' exclusive prefix sum), and its inverse.
__global__ void part_rows_kernel(const int32_t* perm_slot, const int32_t* flag, const int32_t* row, int64_t lo,
                                 int32_t* part_perm_slot, int32_t* part_row_of_slot, int64_t M) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < M; i += int64_t(gridDim.x) * blockDim.x) {
    if (!flag[i]) continue;
    part_perm_slot[row[i]] = int32_t(perm_slot[i] - lo);
    part_row_of_slot[perm_slot[i] - lo] = row[i];
  }
}

// Expert e's first row in the part: the part's rows before the permutation's first row of e.
__global__ void part_offsets_kernel(const int64_t* offset, const int32_t* row, int64_t* part_offset, int64_t E) {
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e <= E; e += int64_t(gridDim.x) * blockDim.x)
    part_offset[e] = row[offset[e]];
}

}  // namespace

void restrict_permutation(cudaStream_t stream, CachingAllocator& allocator, const int64_t* offset,
                          const int32_t* perm_slot, int64_t lo, int64_t hi, int64_t* part_offset,
                          int32_t* part_perm_slot, int32_t* part_row_of_slot, int64_t M, int64_t E) {
  if (hi > lo) {  // -1 everywhere first (all bits set)
    MOE_CUDA_CHECK(cudaMemsetAsync(part_perm_slot, 0xFF, size_t(hi - lo) * sizeof(int32_t), stream));
    MOE_CUDA_CHECK(cudaMemsetAsync(part_row_of_slot, 0xFF, size_t(hi - lo) * sizeof(int32_t), stream));
  }
  Workspace space(allocator, size_t(2 * (M + 1)) * sizeof(int32_t));
  int32_t* flag = static_cast<int32_t*>(space.ptr);
  int32_t* row = flag + (M + 1);
  const LaunchConfig f = elementwise_launch(M + 1);
  part_flags_kernel<<<f.blocks, f.threads, 0, stream>>>(perm_slot, lo, hi, flag, M);
  MOE_CUDA_LAUNCHED();
  size_t bytes = 0;
  MOE_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(nullptr, bytes, flag, row, int(M + 1), stream));
  Workspace temp(allocator, std::max<size_t>(bytes, 1));
  MOE_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(temp.ptr, bytes, flag, row, int(M + 1), stream));
  if (M > 0) {
    const LaunchConfig c = elementwise_launch(M);
    part_rows_kernel<<<c.blocks, c.threads, 0, stream>>>(perm_slot, flag, row, lo, part_perm_slot, part_row_of_slot, M);
    MOE_CUDA_LAUNCHED();
  }
  const LaunchConfig c = elementwise_launch(E + 1);
  part_offsets_kernel<<<c.blocks, c.threads, 0, stream>>>(offset, row, part_offset, E);
  MOE_CUDA_LAUNCHED();
}

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
