// The training state of one rank as checkpoint pieces in global coordinates: what this rank writes
// (each replicated tensor by one member of its replica group, the bytes balanced over the group's members,
// checkpoint/writers.h) and what it needs to continue bit for bit. Parameters,
// AdamW moments and step, balancing biases, adaptive capacity, per-expert clipping statistics, and the
// dead-expert tracker.
// The data loader and every random stream are pure functions of the step, so the step is their state.
#pragma once

#include <cstdint>
#include <vector>

#include "checkpoint/checkpointer.h"
#include "core/model.h"
#include "core/moe_layer.h"
#include "optim/adamw.h"
#include "optim/per_expert_clip.h"
#include "parallel/process_groups.h"

namespace moe {

struct TrainState {
  Model<float>* model = nullptr;
  AdamW* optimizer = nullptr;
  PerExpertClip* clip = nullptr;
  std::vector<MoeLayer<float>*> moe_layers;
  std::vector<std::vector<int64_t>>* last_used = nullptr;  // per MoE layer, per expert
  const ProcessGroups* groups = nullptr;
  bool zero = false;
  bool capacity_auto = false;  // moe.capacity_auto.enabled: the MoE layers' capacity controls are state too
  // Scalars kept here so pieces can point at them.
  int64_t optimizer_steps = 0;
  // A backend whose memory the host cannot address (the CUDA one): the parameters and AdamW moments as host
  // copies, downloaded before a save and uploaded by finish_load.
  std::vector<float> host_params, host_m, host_v;
  std::vector<double> clip_ema;
  std::vector<int64_t> clip_samples;
  // The run's checkpointer (null without checkpoints). An asynchronous save's writer thread copies the
  // pieces after save() returns (Checkpointer::save): see wait_for_snapshot.
  ckpt::Checkpointer* checkpointer = nullptr;
};

// Call before changing anything a checkpoint piece points at (parameters, AdamW moments and step,
// balancing biases, adaptive capacity, the dead-expert tracker, the clipping statistics and the host
// copies above): returns once the snapshot of the save in flight is taken, and the seconds waited (0 when
// none). Collective the first time after a save: the ranks agree there that the snapshot is finite, and it
// throws RunFailed on every rank when it is not (Checkpointer::wait_snapshot, fail_non_finite_state).
// train_step calls it once, before its loss check and update (the first change of the state in a step;
// forward, backward and evaluation only read it), and checkpoint_pieces before restaging for a save.
double wait_for_snapshot(TrainState& state);

// save: pieces this rank writes (src set). load: pieces this rank reads (dst set); after loading call
// finish_load to move the scalars into place.
std::vector<ckpt::Piece> checkpoint_pieces(TrainState& state, bool for_save);
void finish_load(TrainState& state);

}  // namespace moe
