// The model of a checkpoint, built serially on the CPU backend and loaded from the checkpoint by global names:
// the forward `moe logits` runs. Evaluation mode (no router noise, no expert dropout), dropless (capacity
// unlimited, so no token's routing depends on another's), the router temperature of the checkpoint
// (router_tau), the balancing bias it saved. Not here: parsing input, writing output (logits_command.h).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/backend/backend.h"
#include "core/model.h"
#include "launch/interop/checkpoint_model.h"

namespace moe {

class CheckpointForward {
 public:
  // A model for sequences of up to `max_tokens` tokens. BadInput when the checkpoint lacks a tensor of the
  // model of its config or holds one of another shape, or a parameter the model does not have.
  CheckpointForward(const CheckpointModel& checkpoint, int64_t max_tokens, int threads);
  ~CheckpointForward();

  // The logits (tokens.size(), V), row-major, of a sequence of 1..max_tokens ids in [0, V).
  std::vector<float> logits(const std::vector<int32_t>& tokens);
  int64_t vocab() const { return vocab_; }

 private:
  void load(const CheckpointModel& checkpoint);

  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Model<float>> model_;
  int64_t max_tokens_, vocab_;
  uint64_t seed_;  // train.seed: draws nothing in evaluation, passed as training passes it
};

}  // namespace moe
