// Cross-entropy over a vocabulary split across the tensor-parallel group.
#include "parallel/vocab_parallel.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace moe::tp {

template <typename T>
void vocab_parallel_cross_entropy_forward(Backend& backend, Communicator& control, const T* logits,
                                          const int32_t* targets, T* losses, T* lse, int64_t N, int64_t Vl) {
  Ops<T>& ops = backend.ops<T>();
  const int64_t P = control.size(), first = int64_t(control.rank()) * Vl;
  Buffer rows = backend.allocate(DType::F64, 3 * N);  // row maxima (N), then sums and target logits (2 N)
  double* row_max = rows.data<double>();
  double* block_sums = row_max + N;
  // The maximum of each row over the whole vocabulary: every rank's row maxima, then the largest.
  ops.logits_row_max(logits, N, Vl, row_max);
  const std::vector<double> local_max = backend.download(row_max, N);
  std::vector<double> all_max(static_cast<size_t>(N * P)), whole_max(static_cast<size_t>(N));
  control.allgather(local_max.data(), all_max.data(), N);
  for (int64_t n = 0; n < N; ++n) {
    double m = all_max[size_t(n)];
    for (int64_t r = 1; r < P; ++r) m = std::max(m, all_max[size_t(r * N + n)]);
    whole_max[size_t(n)] = m;
  }
  backend.copy_to_device(row_max, whole_max.data(), N);
  // Per row: the sum of exp(z - max) over this block, and the target's logit if this block holds it.
  ops.logits_sum_exp(logits, targets, first, row_max, block_sums, N, Vl);
  std::vector<double> sums = backend.download(block_sums, 2 * N);
  control.allreduce_sum(sums.data(), 2 * N);
  std::vector<T> host_lse(static_cast<size_t>(N)), host_losses(static_cast<size_t>(N));
  for (int64_t n = 0; n < N; ++n) {
    const double l = whole_max[size_t(n)] + std::log(sums[size_t(n)]);
    host_lse[size_t(n)] = T(l);
    host_losses[size_t(n)] = T(l - sums[size_t(N + n)]);
  }
  backend.copy_to_device(lse, host_lse.data(), N);
  backend.copy_to_device(losses, host_losses.data(), N);
  backend.synchronize();  // the host vectors go
}

template <typename T>
void vocab_parallel_cross_entropy_backward(Backend& backend, const Communicator& group, const T* logits,
                                           const int32_t* targets, const T* lse, T scale, T* dlogits, int64_t N,
                                           int64_t Vl) {
  backend.ops<T>().logits_softmax_backward(logits, targets, int64_t(group.rank()) * Vl, lse, scale, dlogits, N, Vl);
}

template void vocab_parallel_cross_entropy_forward<float>(Backend&, Communicator&, const float*, const int32_t*, float*,
                                                          float*, int64_t, int64_t);
template void vocab_parallel_cross_entropy_forward<double>(Backend&, Communicator&, const double*, const int32_t*,
                                                           double*, double*, int64_t, int64_t);
template void vocab_parallel_cross_entropy_backward<float>(Backend&, const Communicator&, const float*, const int32_t*,
                                                           const float*, float, float*, int64_t, int64_t);
template void vocab_parallel_cross_entropy_backward<double>(Backend&, const Communicator&, const double*,
                                                            const int32_t*, const double*, double, double*, int64_t,
                                                            int64_t);

}  // namespace moe::tp
