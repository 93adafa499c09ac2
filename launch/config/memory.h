// The memory one rank of training needs, worked out from the config and the parallel sizes alone, before
// anything is allocated: parameters, gradients, AdamW's moments, what the micro-batch slots keep from
// forward to backward, the workspace of one forward or backward, the MoE layers' buffers of routed rows,
// the staging of communication and the CUDA backend's own device memory. Each component's sizes come from
// the functions it allocates with (core/sizes.h), so for every layout (tp, pp and vpp, ep, expert_tp, sequence
// parallelism, ZeRO, recompute) the first five are the exact bytes the model, the pipeline executor and the
// optimizer allocate through the backend (tests/launch/test_memory.cpp, test_memory_tp.cpp); routed rows depend
// on how tokens are routed and are estimated from balanced routing through the same functions (exact when
// dropless over one rank); the CUDA backend allocates its own by the same functions too. The layout is
// docs/parallel.md "Memory per rank". Not here: deciding whether it fits (launch/train/train_setup.cpp,
// check_memory).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "launch/config/config.h"

namespace moe {

// Bytes per rank. Each count saturates at INT64_MAX, so an absurd config is still refused by name.
struct MemoryEstimate {
  int64_t parameters = 0;
  int64_t gradients = 0;
  int64_t optimizer = 0;    // AdamW's two fp32 moments of what this rank updates (a 1/dp share with ZeRO)
  int64_t activations = 0;  // kept by the micro-batch slots from forward to backward (train.recompute), and the
                            // step's staged per-token losses on the rank with the head
  int64_t scratch = 0;      // workspace of one forward or backward, shared by the layers and slots
  // MoE layers: the router's buffers, the dispatch plan's, expert-side activations and the layers' workspaces,
  // sized by the routing at the first forward: estimated with capacity (N K rows when dropless), balanced over ranks.
  int64_t routed_rows = 0;
  // Staging: ZeRO's reduce-scatter and, with ep > 1, the MoE dispatchers' exchanged rows.
  int64_t communication = 0;
  // The CUDA backend's own (0 elsewhere): what it keeps (cuBLAS's workspace, the rotary table, with bf16 GEMMs the
  // parameters' bf16 copy) and its largest transient workspace of one call: bf16 copies of a GEMM's activation
  // operands with the grouped GEMM's pointers, or the fused attention backward's copies, statistics, row sums
  // and dS (deterministic; cuDNN's own, estimated) or fp32 dQ. The small per-call workspaces are not counted.
  int64_t device_workspace = 0;
  // Not allocated in training: the bytes a key/value cache of the whole model would keep per token (fp32),
  // 2 D per layer for multi-head attention, C + R for latent attention (docs/model.md).
  int64_t kv_cache_per_token = 0;
  int64_t total() const;
};

// The part of the model one rank holds along the pipeline: its stage's layers [first, last) (last < 0: to
// the end), whether it holds the embedding and the head, and the micro-batches it keeps in flight. The
// default is the whole model with one micro-batch (parallel.pp = 1).
struct StagePart {
  int64_t first = 0, last = -1;
  bool embedding = true, head = true;
  int64_t slots = 1;
  bool pipelined = false;  // parallel.pp > 1: the executor's send and receive buffers per slot
};
// Stage `stage` of parallel.pp (parallel.pp_layers) under the 1F1B schedule with `micro_batches` per step
// and data-parallel rank: stage s keeps min(pp - s, micro_batches) in flight.
StagePart pipeline_stage_part(const Config& config, int64_t stage, int64_t micro_batches);
// The chunks rank `stage` holds: that stage's part, or with parallel.vpp = V > 1 the V chunks of the
// interleaved schedule (chunk c: virtual stage c * pp + stage of pp * V equal blocks); the rank's estimate
// (largest_stage_estimate) is the sum of theirs.
std::vector<StagePart> pipeline_chunk_parts(const Config& config, int64_t stage, int64_t micro_batches);

// One rank of `config` with the resolved sizes of the rank grid (dp not "auto") holding `stage`;
// parallel.expert_tp, parallel.sequence_parallel and optim.zero come from the config.
MemoryEstimate estimate_memory(const Config& config, int64_t tp, int64_t dp, int64_t ep, const StagePart& stage = {});

// The estimate of the pipeline stage that needs the most (the one model when parallel.pp = 1), and which
// stage that is, with train.global_batch / (dp * train.micro_batch) micro-batches per step: what every rank
// must be able to hold, quoted at startup, in the manifest and by check_memory.
struct StageEstimate {
  int64_t stage = 0;
  MemoryEstimate memory;
};
StageEstimate largest_stage_estimate(const Config& config, int64_t tp, int64_t dp, int64_t ep);

// What check_memory holds against a rank's memory besides estimate.total(): with bf16 GEMMs on the CPU, the
// parameters rounded to bf16 and kept in fp32 beside them (estimate.parameters); 0 otherwise (on a GPU their bf16
// copy is in the estimate's device_workspace already).
double host_rounded_parameter_bytes(const Config& config, const MemoryEstimate& estimate);

// {"parameters": bytes, ..., "total": bytes}: manifest.json's "memory".
nlohmann::json memory_json(const MemoryEstimate& estimate);
// "1.2 MiB parameters, 1.2 MiB gradients, ...; 9.8 MiB in all": categories of zero bytes left out.
std::string memory_text(const MemoryEstimate& estimate);
// "512 B", "1.5 KiB", "3.2 GiB".
std::string format_bytes(double bytes);

}  // namespace moe
