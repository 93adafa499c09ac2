// The training state of one rank as checkpoint pieces in global coordinates: what this rank writes
// (each replicated tensor by one member of its replica group, the bytes balanced over the group's members,
// checkpoint/writers.h) and what it needs to continue bit for bit. Each stateful component declares its own
// pieces (core/state.h: the model's parameters, AdamW's moments and step, each MoE layer's balancing bias,
// expert usage and capacity control, the per-expert clipping statistics); this collects them.
// The data loader and every random stream are pure functions of the step, so the step is their state.
#pragma once

#include <vector>

#include "checkpoint/checkpointer.h"
#include "core/state.h"
#include "parallel/process_groups.h"

namespace moe {

struct TrainState {
  // Every component with checkpoint state, in the order of their pieces (Trainer's constructor lists them).
  std::vector<Stateful*> components;
  const ProcessGroups* groups = nullptr;
  // The run's checkpointer (null without checkpoints). An asynchronous save's writer thread copies the
  // pieces after save() returns (Checkpointer::save): see wait_for_snapshot.
  ckpt::Checkpointer* checkpointer = nullptr;
};

// Call before changing anything a checkpoint piece points at (parameters, AdamW moments and step,
// balancing biases, adaptive capacity, the dead-expert tracker, the clipping statistics and the components'
// host copies): returns once the snapshot of the save in flight is taken, and the seconds waited (0 when
// none). Collective the first time after a save: the ranks agree there that the snapshot is finite, and it
// throws RunFailed on every rank when it is not (Checkpointer::wait_snapshot, fail_non_finite_state).
// train_step calls it once, before its loss check and update (the first change of the state in a step;
// forward, backward and evaluation only read it), and checkpoint_pieces before restaging for a save.
double wait_for_snapshot(TrainState& state);

// save: pieces this rank writes (src set). load: pieces this rank reads (dst set); after loading call
// finish_load to put them in force (Stateful::state_restored).
std::vector<ckpt::Piece> checkpoint_pieces(TrainState& state, bool for_save);
void finish_load(TrainState& state);

}  // namespace moe
