// One optimizer step of one rank: the micro-batches' forwards and backwards with the gradient buckets
// reducing as backward completes them, the step's losses and routing statistics summed over the
// data-parallel group, per-expert and global clipping, AdamW, and the balancing-bias update.
#pragma once

#include <cstdint>

#include "launch/train/train_setup.h"

namespace moe {

struct StepResult {
  double loss = 0;  // lm_loss + the router losses
  double lm_loss = 0, aux = 0, z = 0, entropy = 0, death = 0, warmup = 0;
  double lr = 0;
  double grad_norm = 0;  // before clipping
  int64_t experts_clipped = 0;
  int64_t dead_experts = 0;  // experts without a token for the last 100 steps
  double ckpt_wait_s = 0;    // held before the update until the last save's snapshot was taken
};

// Collective. Trains step `step` (0-based). Throws RunFailed when the loss is not finite (nothing is
// updated then).
StepResult train_step(Trainer& trainer, int64_t step);

// Before a step's, an evaluation's or a routing probe's forward: the backend's rounded copy of the parameters
// dropped (Ops::parameters_changed) unless only the optimizer's updates wrote the parameters since it was made.
void parameters_before_forward(Trainer& trainer);

// The trainer's Checkpointer calls it (SaveSettings::on_non_finite) on every rank when the snapshot of a save
// holds values that are not finite (parameters, optimizer moments, clipping statistics): the save is abandoned
// (nothing non-finite is ever committed, the committed checkpoints stay the newest) and this throws RunFailed
// saying so. The writer counts them while it copies the state, off the step's critical path; the ranks agree
// before the next update (wait_for_snapshot) or when the save is committed, whichever comes first.
[[noreturn]] void fail_non_finite_state(const ckpt::NonFiniteSnapshot& found);

}  // namespace moe
