// `moe train`: one rank of training. Loads and validates everything first (config, run directory,
// data), then writes the run directory and trains: micro-batches with gradient accumulation, global
// clipping, AdamW, metrics.jsonl, a progress line, periodic evaluation on the held-out split.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/backend/backend.h"
#include "launch/train/train_options.h"
#include "parallel/communicator.h"

namespace moe {

struct TrainResult {
  // Every parameter tensor under its global name and global shape (expert shards gathered), on every
  // rank; filled only with TrainOptions::collect_parameters.
  std::map<std::string, std::vector<float>> parameters;
  // The signal (SIGTERM, SIGINT) that stopped the run before its last step, 0 if none; the program
  // then exits with 128 + it.
  int stop_signal = 0;
};

// Returns normally on success; throws moe::Error (BadInput for anything the user can fix). world: every
// rank of the job (an MPI communicator under mpirun); null for a single process.
// backend: given by a test or benchmark; without one, the backend train.device names (a CPU backend of this
// process, or the CUDA backend on this rank's device).
TrainResult run_train(const TrainOptions& options, Backend& backend, std::unique_ptr<Communicator> world = nullptr);
TrainResult run_train(const TrainOptions& options, std::unique_ptr<Communicator> world = nullptr);

// Ranks in this job and ranks on this node, and this rank's place on its node, from the launcher's
// environment (1, 1 and 0 when not under mpirun).
int launcher_world_size();
int launcher_local_size();
int launcher_local_rank();

}  // namespace moe
