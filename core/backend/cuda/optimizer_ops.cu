// The CUDA ops on the optimizer's side: AdamW, and the sums of squares of the gradient norm (a fixed tree,
// whatever the device) with RMSNorm's gain gradient, the other chunked sum.
#include <cuda_runtime.h>

#include <algorithm>
#include <type_traits>
#include <vector>

#include "core/backend/cuda/cuda_ops.cuh"

namespace moe::cuda {

template <typename T>
void CudaOps<T>::adamw_update(T* p, const T* g, T* m, T* v, int64_t n, const typename Ops<T>::AdamWStep& s) {
  // The parameters' rounded copy, where current, written in the same pass: bf16 bits (fp32), rounded T (fp64).
  using R = std::conditional_t<sizeof(T) == 4, uint16_t, T>;
  launch(elementwise_launch(n), cuda::adamw_kernel<T, R>, p, g, m, v, n, s.beta1, s.beta2, s.step_size, s.inv_bc2,
         s.eps, s.decay, static_cast<R*>(current_rounded(p)));
}

// The one-segment case of the segments' sums, so that both give the same bits.
template <typename T>
void CudaOps<T>::sum_squares_into(const T* x, int64_t n, double* out) {
  const SumSegment whole{0, n};
  sum_squares_segments_into(x, &whole, 1, out);
}

// Two launches whatever the count (sum_segments_plan.h): every chunk of every segment, one block each, then a block
// per segment over its chunks' partials. Each sum's order depends on its segment's length alone (the chunks of a
// segment and its partials' tree), so a run repeats bit for bit on any device; it is not the CPU's order (its
// partials in order), within the conformance bound.
template <typename T>
void CudaOps<T>::sum_squares_segments_into(const T* base, const SumSegment* segments, int64_t count, double* out) {
  if (count <= 0) return;
  const std::vector<cuda::SumChunks> plan = cuda::sum_chunks_plan(segments, count);
  const int64_t chunks = plan.back().first;
  Workspace table(*ctx_.allocator, plan.size() * sizeof(cuda::SumChunks));
  Workspace partial(*ctx_.allocator, size_t(std::max<int64_t>(chunks, 1)) * sizeof(double));
  // From pageable memory: returns once the host table is staged, so it may go out of scope.
  MOE_CUDA_CHECK(cudaMemcpyAsync(table.ptr, plan.data(), plan.size() * sizeof(cuda::SumChunks), cudaMemcpyHostToDevice,
                                 ctx_.stream));
  const auto* device_plan = static_cast<const cuda::SumChunks*>(table.ptr);
  double* partials = static_cast<double*>(partial.ptr);
  if (chunks > 0)
    launch_rows(row_launch(chunks, cuda::kThreads), cuda::sum_squares_chunks_kernel<T>, base, device_plan, count,
                partials, chunks);
  launch_rows(row_launch(count, cuda::kThreads), cuda::sum_segment_partials_kernel, partials, device_plan, count, out);
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
  launch_rows(row_launch(N, D), cuda::rmsnorm_backward_dx_kernel<T, false>, x, gain, rstd, dy, dx, N, D);
  rmsnorm_dgain(x, rstd, dy, dgain, N, D);
}

template <typename T>
void CudaOps<T>::rmsnorm_backward_add(const T* x, const T* gain, const T* rstd, const T* dy, T* dres, T* dgain,
                                      int64_t N, int64_t D) {
  launch_rows(row_launch(N, D), cuda::rmsnorm_backward_dx_kernel<T, true>, x, gain, rstd, dy, dres, N, D);
  rmsnorm_dgain(x, rstd, dy, dgain, N, D);
}

template <typename T>
void CudaOps<T>::rmsnorm_dgain(const T* x, const T* rstd, const T* dy, T* dgain, int64_t N, int64_t D) {
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
template void CudaOps<float>::sum_squares_segments_into(const float*, const SumSegment*, int64_t, double*);
template double CudaOps<float>::sum_squares_to_host(const float*, int64_t);
template void CudaOps<float>::rmsnorm_backward_add(const float*, const float*, const float*, const float*, float*,
                                                   float*, int64_t, int64_t);
template void CudaOps<float>::rmsnorm_backward(const float*, const float*, const float*, const float*, float*, float*,
                                               int64_t, int64_t);
template void CudaOps<double>::adamw_update(double*, const double*, double*, double*, int64_t,
                                            const typename Ops<double>::AdamWStep&);
template void CudaOps<double>::sum_squares_into(const double*, int64_t, double*);
template void CudaOps<double>::sum_squares_segments_into(const double*, const SumSegment*, int64_t, double*);
template double CudaOps<double>::sum_squares_to_host(const double*, int64_t);
template void CudaOps<double>::rmsnorm_backward_add(const double*, const double*, const double*, const double*, double*,
                                                    double*, int64_t, int64_t);
template void CudaOps<double>::rmsnorm_backward(const double*, const double*, const double*, const double*, double*,
                                                double*, int64_t, int64_t);

}  // namespace moe::cuda
