// Which checkpoint a run continues from, agreed by every rank, and loading it. `--resume auto` takes the
// newest checkpoint of the run's checkpoint root that verifies (with node-local roots: the newest the
// hosts hold together), `--resume PATH` that checkpoint or a refusal, `--resume none` a fresh start.
// A fresh start is refused when the run directory holds a run and --overwrite is not given.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "checkpoint/checkpointer.h"
#include "launch/train_setup.h"
#include "launch/trainer.h"

namespace moe {

struct ResumePoint {
  std::string dir;                                     // the checkpoint directory; empty: a fresh start
  std::vector<std::string> notes;                      // checkpoints passed over and why (rank 0)
  std::optional<ckpt::DistributedChoice> distributed;  // with node-local roots
  std::vector<ckpt::TensorExpectation> expected;       // what the model needs of a checkpoint (all ranks)
};

// Collective. The same answer on every rank, or the same BadInput on every rank.
ResumePoint choose_resume(const TrainOptions& options, Trainer& trainer);
// Collective. Loads the checkpoint into the trainer's state and returns its step.
int64_t load_resume(const ResumePoint& point, Trainer& trainer);

}  // namespace moe
