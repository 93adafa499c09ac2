// The CUDA ops on the optimizer's side: AdamW, and the sums of squares of the gradient norm (fixed chunks,
// whatever the device) with RMSNorm's gain gradient, the other chunked sum.
#include <cuda_runtime.h>

#include <algorithm>
#include <type_traits>

#include "core/backend/cuda/cuda_ops.cuh"

namespace moe::cuda {

template <typename T>
void CudaOps<T>::adamw_update(T* p, const T* g, T* m, T* v, int64_t n, const typename Ops<T>::AdamWStep& s) {
  // The parameters' rounded copy, where current, written in the same pass: bf16 bits (fp32), rounded T (fp64).
  using R = std::conditional_t<sizeof(T) == 4, uint16_t, T>;
  launch(elementwise_launch(n), cuda::adamw_kernel<T, R>, p, g, m, v, n, s.beta1, s.beta2, s.step_size, s.inv_bc2,
         s.eps, s.decay, static_cast<R*>(current_rounded(p)));
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
void CudaOps<T>::rmsnorm_backward(const T* x, const T* gain, const T* rstd, const T* dy, T* dx, T* dgain, int64_t N,
                                  int64_t D) {
  launch_rows(row_launch(N, D), cuda::rmsnorm_backward_dx_kernel<T>, x, gain, rstd, dy, dx, N, D);
  const int64_t chunks = (N + cuda::kDgainChunk - 1) / cuda::kDgainChunk;
  if (chunks == 0) return;
  Workspace partial(*ctx_.allocator, size_t(chunks * D) * sizeof(double));
  double* p = static_cast<double*>(partial.ptr);
  launch(elementwise_launch(chunks * D), cuda::rmsnorm_dgain_partial_kernel<T>, x, rstd, dy, p, N, D);
  launch(elementwise_launch(D), cuda::rmsnorm_dgain_total_kernel<T>, p, chunks, dgain, D);
}

template void CudaOps<float>::adamw_update(float*, const float*, float*, float*, int64_t,
                                           const typename Ops<float>::AdamWStep&);
template void CudaOps<float>::sum_squares_into(const float*, int64_t, double*);
template double CudaOps<float>::sum_squares_to_host(const float*, int64_t);
template void CudaOps<float>::rmsnorm_backward(const float*, const float*, const float*, const float*, float*, float*,
                                               int64_t, int64_t);
template void CudaOps<double>::adamw_update(double*, const double*, double*, double*, int64_t,
                                            const typename Ops<double>::AdamWStep&);
template void CudaOps<double>::sum_squares_into(const double*, int64_t, double*);
template double CudaOps<double>::sum_squares_to_host(const double*, int64_t);
template void CudaOps<double>::rmsnorm_backward(const double*, const double*, const double*, const double*, double*,
                                                double*, int64_t, int64_t);

}  // namespace moe::cuda
