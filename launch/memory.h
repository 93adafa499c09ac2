// The memory one rank of training needs, worked out from the config and the parallel sizes alone, before
// anything is allocated: parameters, gradients, AdamW's moments, what the micro-batch slots keep from
// forward to backward, the workspace of one forward or backward, the MoE layers' buffers of routed rows
// and the host staging of communication. For tp = 1 the first five are the exact bytes the model and the
// optimizer allocate through the backend (tests/launch/test_memory.cpp checks it); routed rows depend on
// how tokens are routed and are estimated. The tensor-parallel layout it assumes is docs/parallel.md
// "Memory per rank". Not here: deciding whether it fits (launch/train_setup.cpp, check_memory).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "launch/config.h"

namespace moe {

// Bytes per rank. Each count saturates at INT64_MAX, so an absurd config is still refused by name.
struct MemoryEstimate {
  int64_t parameters = 0;
  int64_t gradients = 0;
  int64_t optimizer = 0;    // AdamW's two fp32 moments of what this rank updates (a 1/dp share with ZeRO)
  int64_t activations = 0;  // kept by the micro-batch slots from forward to backward (train.recompute)
  int64_t scratch = 0;      // workspace of one forward or backward, shared by the layers and slots
  // MoE layers: expert-side activations, the dispatch plan and the layers' workspaces, sized by the
  // routing at the first forward: estimated with capacity (N K rows when dropless), balanced over ranks.
  int64_t routed_rows = 0;
  // Host memory beside the backend's: ZeRO's reduce-scatter staging and the expert all-to-all's.
  int64_t communication = 0;
  int64_t total() const;
};

// One rank of `config` with the resolved sizes of the rank grid (dp not "auto"); parallel.expert_tp,
// parallel.sequence_parallel and optim.zero come from the config. `slots`: micro-batches in flight (the
// trainer keeps one).
MemoryEstimate estimate_memory(const Config& config, int64_t tp, int64_t dp, int64_t ep, int64_t slots = 1);

// {"parameters": bytes, ..., "total": bytes}: manifest.json's "memory".
nlohmann::json memory_json(const MemoryEstimate& estimate);
// "1.2 MiB parameters, 1.2 MiB gradients, ...; 9.8 MiB in all": categories of zero bytes left out.
std::string memory_text(const MemoryEstimate& estimate);
// "512 B", "1.5 KiB", "3.2 GiB".
std::string format_bytes(double bytes);

}  // namespace moe
