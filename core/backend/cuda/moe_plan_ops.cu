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

// Whether the slot at each place of the priority order overflowed: selected (its token's choice j < K names an
// expert) and not assigned by capacity.
__global__ void overflowed_kernel(const int32_t* order, const int32_t* preference, int64_t W, const int32_t* assigned,
                                  int32_t* flag, int64_t N, int64_t K) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < N * K; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t slot = order[i];
    flag[i] = assigned[slot] < 0 && preference[(slot / K) * W + slot % K] >= 0;
  }
}

// One block: the experts' loads (E <= 1024, shared), then the overflowed slots in priority order (`count` of them).
// A slot's candidates (positions c of its row) are tried by the block's threads at once; the first that fits wins,
// as the host's walk down the row would find it (the rows hold -1 only after their last expert). Each slot is
// decided before the next is read, so a slot sees every earlier reroute.
__global__ void reroute_walk_kernel(const int32_t* overflowed, const int32_t* count, const int32_t* preference,
                                    int64_t W, int64_t capacity, int32_t* assigned, int64_t* rerouted, int64_t N,
                                    int64_t K, int64_t E) {
  extern __shared__ int64_t load[];
  __shared__ int64_t best;
  __shared__ int64_t moved;
  for (int64_t e = threadIdx.x; e < E; e += blockDim.x) load[e] = 0;
  if (threadIdx.x == 0) moved = 0;
  __syncthreads();
  for (int64_t s = threadIdx.x; s < N * K; s += blockDim.x)
    if (assigned[s] >= 0) atomicAdd(reinterpret_cast<unsigned long long*>(&load[assigned[s]]), 1ull);
  __syncthreads();
  const int64_t slots = *count;
  for (int64_t i = 0; i < slots; ++i) {
    const int64_t slot = overflowed[i], n = slot / K;
    const int32_t* row = preference + n * W;
    if (threadIdx.x == 0) best = W;
    __syncthreads();
    for (int64_t c = threadIdx.x; c < W; c += blockDim.x) {
      const int32_t e = row[c];
      if (e < 0 || load[e] >= capacity) continue;
      bool used = false;
      for (int64_t j = 0; j < K; ++j) used |= assigned[n * K + j] == e || row[j] == e;
      if (!used) atomicMin(reinterpret_cast<unsigned long long*>(&best), static_cast<unsigned long long>(c));
    }
    __syncthreads();
    if (threadIdx.x == 0 && best < W) {
      const int32_t e = row[best];
      assigned[slot] = e, ++load[e], ++moved;
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) *rerouted = moved;
}

// Whether each slot (and so its token) is the fallback's: selected, not assigned.
__global__ void fallback_flags_kernel(const int32_t* selected, const int32_t* assigned, int64_t K, int32_t* token_flag,
                                      int32_t* slot_flag, int64_t N) {
  for (int64_t n = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; n < N; n += int64_t(gridDim.x) * blockDim.x) {
    int32_t any = 0;
    for (int64_t j = 0; j < K; ++j) {
      const int64_t s = n * K + j;
      slot_flag[s] = selected[s] >= 0 && assigned[s] < 0;
      any |= slot_flag[s];
    }
    token_flag[n] = any;
  }
}

// Token n (and its K slots): its place among the fallback's tokens is the exclusive sum of the flags before it; a
// place past the last is -1 (0 for a weight). The weight sums the token's slots in order in double, as the host does.
template <typename T>
__global__ void fallback_place_kernel(const int32_t* selected, const int32_t* assigned, const T* gate, int64_t K,
                                      const int32_t* token_flag, const int32_t* token_at, const int32_t* slot_flag,
                                      const int32_t* slot_at, int32_t* token, T* weight, int32_t* source, int32_t* slot,
                                      int64_t* count, int64_t N) {
  const int64_t M = N * K;
  const int64_t tokens = N > 0 ? int64_t(token_at[N - 1]) + token_flag[N - 1] : 0;
  const int64_t slots = M > 0 ? int64_t(slot_at[M - 1]) + slot_flag[M - 1] : 0;
  if (blockIdx.x == 0 && threadIdx.x == 0) count[0] = tokens, count[1] = slots;
  for (int64_t n = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; n < N; n += int64_t(gridDim.x) * blockDim.x) {
    if (n >= tokens) token[n] = -1, weight[n] = T(0);
    double w = 0;
    for (int64_t j = 0; j < K; ++j) {
      const int64_t s = n * K + j;
      if (s >= slots) source[s] = -1, slot[s] = -1;
      if (!slot_flag[s]) continue;
      w += double(gate[s]);
      source[slot_at[s]] = token_at[n], slot[slot_at[s]] = int32_t(s);
    }
    if (token_flag[n]) token[token_at[n]] = int32_t(n), weight[token_at[n]] = T(w);
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

void overflowed_flags(cudaStream_t stream, const int32_t* order, const int32_t* preference, int64_t W,
                      const int32_t* assigned, int32_t* flag, int64_t N, int64_t K) {
  const LaunchConfig c = elementwise_launch(N * K);
  overflowed_kernel<<<c.blocks, c.threads, 0, stream>>>(order, preference, W, assigned, flag, N, K);
  MOE_CUDA_LAUNCHED();
}

void reroute_walk(cudaStream_t stream, const int32_t* overflowed, const int32_t* count, const int32_t* preference,
                  int64_t W, int64_t capacity, int32_t* assigned, int64_t* rerouted, int64_t N, int64_t K, int64_t E) {
  reroute_walk_kernel<<<1, kThreads, size_t(E) * sizeof(int64_t), stream>>>(overflowed, count, preference, W, capacity,
                                                                            assigned, rerouted, N, K, E);
  MOE_CUDA_LAUNCHED();
}

void fallback_flags(cudaStream_t stream, const int32_t* selected, const int32_t* assigned, int64_t K,
                    int32_t* token_flag, int32_t* slot_flag, int64_t N) {
  const LaunchConfig c = elementwise_launch(N);
  fallback_flags_kernel<<<c.blocks, c.threads, 0, stream>>>(selected, assigned, K, token_flag, slot_flag, N);
  MOE_CUDA_LAUNCHED();
}

template <typename T>
void fallback_place(cudaStream_t stream, const int32_t* selected, const int32_t* assigned, const T* gate, int64_t K,
                    const int32_t* token_flag, const int32_t* token_at, const int32_t* slot_flag,
                    const int32_t* slot_at, int32_t* token, T* weight, int32_t* source, int32_t* slot, int64_t* count,
                    int64_t N) {
  const LaunchConfig c = elementwise_launch(N);
  fallback_place_kernel<T><<<c.blocks, c.threads, 0, stream>>>(
      selected, assigned, gate, K, token_flag, token_at, slot_flag, slot_at, token, weight, source, slot, count, N);
  MOE_CUDA_LAUNCHED();
}

template void fallback_place<float>(cudaStream_t, const int32_t*, const int32_t*, const float*, int64_t, const int32_t*,
                                    const int32_t*, const int32_t*, const int32_t*, int32_t*, float*, int32_t*,
                                    int32_t*, int64_t*, int64_t);
template void fallback_place<double>(cudaStream_t, const int32_t*, const int32_t*, const double*, int64_t,
                                     const int32_t*, const int32_t*, const int32_t*, const int32_t*, int32_t*, double*,
                                     int32_t*, int32_t*, int64_t*, int64_t);

}  // namespace moe::cuda
