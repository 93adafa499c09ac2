// Which checkpoint a run continues from, agreed by every rank, and loading it. `--resume auto` takes the
// newest checkpoint of the run's checkpoint root that verifies (with node-local roots: the newest the
// hosts hold together), `--resume PATH` that checkpoint or a refusal, `--resume none` a fresh start.
// A fresh start is refused when the run directory holds a run and --overwrite is not given. Every checkpoint
// root the run would write to must be the run's own (checkpoint/root.h), whatever the choice.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "checkpoint/checkpointer.h"
#include "launch/train/train_options.h"
#include "launch/train/train_setup.h"

namespace moe {

struct ResumePoint {
  std::string dir;  // the checkpoint directory; empty: a fresh start
  // This run's identity (checkpoint/root.h), every rank: the run directory's recorded id when it continues
  // from a checkpoint, a new one for a fresh start (or a run directory written before run ids).
  std::string run_id;
  std::string previous_run_id;     // the id recorded in the run directory before this start ("" when none)
  std::vector<std::string> notes;  // checkpoints passed over and why (rank 0)
  std::optional<ckpt::DistributedChoice> distributed;  // with node-local roots
  std::vector<ckpt::TensorExpectation> expected;       // what the model needs of a checkpoint (all ranks)
};

// Collective. The same answer on every rank, or the same BadInput on every rank.
ResumePoint choose_resume(const TrainOptions& options, Trainer& trainer);
// Collective. Loads the checkpoint into the trainer's state and returns its step.
int64_t load_resume(const ResumePoint& point, Trainer& trainer);

}  // namespace moe
