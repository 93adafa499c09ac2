// Activation recomputation (train.recompute, docs/model.md): what each layer keeps from its forward for its
// backward. Apart from core/model.h so the config (launch/config/config.h) holds the policy without the model.
#pragma once

#include <cstdint>

namespace moe {

enum class Recompute {
  None,  // every layer keeps its activations from forward to backward
  // Every layer keeps all but its attention probabilities (B, H, T, T): its attention backward recomputes
  // them from the saved (rotated) q and k, into the backward scratch (Megatron-Core's selective recompute).
  Selective,
  Full,  // each layer keeps only its input and recomputes its forward just before its backward
};

// The recompute policy: `mode` for the layers of global index < `layers` (-1: every layer), None for the
// others, so a pipeline stage applies it to its own share. A Recompute converts to it (every layer).
struct RecomputeSpec {
  Recompute mode = Recompute::None;
  int64_t layers = -1;
  // Not explicit: `Model(..., Recompute::Full, ...)` reads as it did before per-layer recompute.
  RecomputeSpec(Recompute mode = Recompute::None, int64_t layers = -1) : mode(mode), layers(layers) {}
  Recompute of_layer(int64_t layer) const { return layers < 0 || layer < layers ? mode : Recompute::None; }
};

}  // namespace moe
