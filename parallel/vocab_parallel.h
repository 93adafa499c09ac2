// Cross-entropy over a vocabulary split across the tensor-parallel group (Megatron-Core's
// vocab_parallel_cross_entropy): rank r holds the logits of the vocabulary block [r * Vl, (r + 1) * Vl),
// no rank ever holds the full (N, V) logits. Per token: the maximum, the sum of exponentials and the target's
// logit are each reduced over the group (N numbers each, not N * V), so every rank gets the same losses.
// The per-row parts are the backend's ops (Ops::logits_row_max, logits_max_over_blocks, logits_sum_exp,
// logits_loss_finish, logits_softmax_backward) on its memory, and the N numbers are reduced in it too, over the
// group's data-plane communicator: no host wait (docs/gpu.md "Host synchronisations").
#pragma once

#include <cstdint>

#include "core/backend/backend.h"
#include "parallel/communicator.h"

namespace moe::tp {

// float or double, in `backend`'s memory. logits: (N, Vl) this rank's block; targets: (N) ids in [0, tp * Vl).
// losses: (N) -log p(target), the same on every rank; lse: (N) log-sum-exp over the whole vocabulary, saved
// for backward. Collective over `group`, which moves `backend`'s memory (the data plane).
template <typename T>
void vocab_parallel_cross_entropy_forward(Backend& backend, Communicator& group, const T* logits,
                                          const int32_t* targets, T* losses, T* lse, int64_t N, int64_t Vl);
// dlogits: (N, Vl) = (softmax(logits) - onehot(target)) * scale on this rank's block (written). Local: `group`
// gives this rank's block.
template <typename T>
void vocab_parallel_cross_entropy_backward(Backend& backend, const Communicator& group, const T* logits,
                                           const int32_t* targets, const T* lse, T scale, T* dlogits, int64_t N,
                                           int64_t Vl);
// The same dlogits written held rounded (Ops::logits_softmax_backward_rounded), for bf16 GEMMs.
template <typename T>
void vocab_parallel_cross_entropy_backward_rounded(Backend& backend, const Communicator& group, const T* logits,
                                                   const int32_t* targets, const T* lse, T scale, Rounded<T>* dlogits,
                                                   int64_t N, int64_t Vl);

}  // namespace moe::tp
