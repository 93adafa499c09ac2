// Where the fused attention runs (the CUDA backend's cuDNN graphs at train.precision = bf16, docs/gpu.md), which
// form of its backward: train.fused_attention.
#pragma once

#include <cstdint>

namespace moe {

enum class FusedAttention : uint8_t {
  Deterministic,     // dQ = dS K written directly, dS held in workspace: a run repeats bit for bit (the default)
  Nondeterministic,  // dQ accumulated in fp32 workspace with atomic adds: less workspace, bits vary run to run
  Off,               // the plain attention everywhere, cuDNN never asked
};

}  // namespace moe
