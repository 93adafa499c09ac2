// Cross-entropy over a vocabulary split across the tensor-parallel group.
#include "parallel/vocab_parallel.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace moe::tp {

template <typename T>
void vocab_parallel_cross_entropy_forward(Communicator& tp, const T* logits, const int32_t* targets, T* losses, T* lse,
                                          int64_t N, int64_t Vl) {
  const int64_t P = tp.size(), first = int64_t(tp.rank()) * Vl;
  // The maximum of each row over the whole vocabulary: every rank's row maxima, then the largest.
  std::vector<double> local_max(size_t(N), -std::numeric_limits<double>::infinity());
  for (int64_t n = 0; n < N; ++n)
    for (int64_t v = 0; v < Vl; ++v) local_max[size_t(n)] = std::max(local_max[size_t(n)], double(logits[n * Vl + v]));
  std::vector<double> all_max(static_cast<size_t>(N * P));
  tp.allgather(local_max.data(), all_max.data(), N);
  // Per row: the sum of exp(z - max) over this block, and the target's logit if this block holds it.
  std::vector<double> sums(size_t(2 * N), 0.0);
  std::vector<double> row_max(static_cast<size_t>(N));
  for (int64_t n = 0; n < N; ++n) {
    double m = all_max[size_t(n)];
    for (int64_t r = 1; r < P; ++r) m = std::max(m, all_max[size_t(r * N + n)]);
    row_max[size_t(n)] = m;
    double s = 0;
    for (int64_t v = 0; v < Vl; ++v) s += std::exp(double(logits[n * Vl + v]) - m);
    sums[size_t(n)] = s;
    const int64_t t = int64_t(targets[n]) - first;
    if (t >= 0 && t < Vl) sums[size_t(N + n)] = double(logits[n * Vl + t]);
  }
  tp.allreduce_sum(sums.data(), 2 * N);
  for (int64_t n = 0; n < N; ++n) {
    const double l = row_max[size_t(n)] + std::log(sums[size_t(n)]);
    lse[n] = T(l);
    losses[n] = T(l - sums[size_t(N + n)]);
  }
}

template <typename T>
void vocab_parallel_cross_entropy_backward(Communicator& tp, const T* logits, const int32_t* targets, const T* lse,
                                           T scale, T* dlogits, int64_t N, int64_t Vl) {
  const int64_t first = int64_t(tp.rank()) * Vl;
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t v = 0; v < Vl; ++v)
      dlogits[n * Vl + v] = T(std::exp(double(logits[n * Vl + v]) - double(lse[n])) * double(scale));
    const int64_t t = int64_t(targets[n]) - first;
    if (t >= 0 && t < Vl) dlogits[n * Vl + t] -= scale;
  }
}

template void vocab_parallel_cross_entropy_forward<float>(Communicator&, const float*, const int32_t*, float*, float*,
                                                          int64_t, int64_t);
template void vocab_parallel_cross_entropy_forward<double>(Communicator&, const double*, const int32_t*, double*,
                                                           double*, int64_t, int64_t);
template void vocab_parallel_cross_entropy_backward<float>(Communicator&, const float*, const int32_t*, const float*,
                                                           float, float*, int64_t, int64_t);
template void vocab_parallel_cross_entropy_backward<double>(Communicator&, const double*, const int32_t*, const double*,
                                                            double, double*, int64_t, int64_t);

}  // namespace moe::tp
