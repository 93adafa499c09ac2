// One optimizer step of one rank: the micro-batches' forwards and backwards with the gradient buckets
// reducing as backward completes them, the step's losses and routing statistics summed over the
// data-parallel group, per-expert and global clipping, AdamW, and the balancing-bias update.
#pragma once

#include <cstdint>

#include "launch/train_setup.h"

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

// Collective. Throws RunFailed on every rank when any value of the state a checkpoint of step `done`
// would hold (parameters, optimizer moments, clipping statistics) is not finite, so that nothing
// non-finite is ever committed and the checkpoints already committed stay the newest.
void check_state_finite(Trainer& trainer, int64_t done);

}  // namespace moe
