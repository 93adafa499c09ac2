// Cross-entropy over a vocabulary split across the tensor-parallel group.
#include "parallel/vocab_parallel.h"

namespace moe::tp {

template <typename T>
void vocab_parallel_cross_entropy_forward(Backend& backend, Communicator& group, const T* logits,
                                          const int32_t* targets, T* losses, T* lse, int64_t N, int64_t Vl) {
  Ops<T>& ops = backend.ops<T>();
  const int64_t P = group.size(), first = int64_t(group.rank()) * Vl;
  // This rank's row maxima (N), every rank's (P N), then the whole rows' maxima (N), sums and target logits (2 N).
  Buffer rows = backend.allocate(DType::F64, (P + 4) * N);
  double* local_max = rows.data<double>();
  double* block_max = local_max + N;
  double* row_max = block_max + P * N;
  double* sums = row_max + N;
  // The maximum of each row over the whole vocabulary: every rank's row maxima, then the largest.
  ops.logits_row_max(logits, N, Vl, local_max);
  group.allgather(local_max, block_max, N);
  ops.logits_max_over_blocks(block_max, row_max, P, N);
  // Per row: the sum of exp(z - max) over this block, and the target's logit if this block holds it; summed over
  // the blocks, then the log-sum-exp and the loss, all in the backend's memory (no host wait).
  ops.logits_sum_exp(logits, targets, first, row_max, sums, N, Vl);
  group.allreduce_sum(sums, 2 * N);
  ops.logits_loss_finish(row_max, sums, lse, losses, N);
}

template <typename T>
void vocab_parallel_cross_entropy_backward(Backend& backend, const Communicator& group, const T* logits,
                                           const int32_t* targets, const T* lse, T scale, T* dlogits, int64_t N,
                                           int64_t Vl) {
  backend.ops<T>().logits_softmax_backward(logits, targets, int64_t(group.rank()) * Vl, lse, scale, dlogits, N, Vl);
}

template <typename T>
void vocab_parallel_cross_entropy_backward_rounded(Backend& backend, const Communicator& group, const T* logits,
                                                   const int32_t* targets, const T* lse, T scale, Rounded<T>* dlogits,
                                                   int64_t N, int64_t Vl) {
  backend.ops<T>().logits_softmax_backward_rounded(logits, targets, int64_t(group.rank()) * Vl, lse, scale, dlogits, N,
                                                   Vl);
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
template void vocab_parallel_cross_entropy_backward_rounded<float>(Backend&, const Communicator&, const float*,
                                                                   const int32_t*, const float*, float, bf16*, int64_t,
                                                                   int64_t);
template void vocab_parallel_cross_entropy_backward_rounded<double>(Backend&, const Communicator&, const double*,
                                                                    const int32_t*, const double*, double, double*,
                                                                    int64_t, int64_t);

}  // namespace moe::tp
