// AdamW with decoupled weight decay (Loshchilov & Hutter), applied per parameter tensor of the table so
// that norm gains and embeddings skip decay; the learning-rate schedule (linear warmup, cosine decay to
// a floor); global gradient-norm clipping. Optimizer state (moments, step) lives in flat buffers carved
// by the same parameter table as the parameters.
#pragma once

#include <cstdint>
#include <vector>

#include "core/backend/backend.h"
#include "core/params.h"
#include "core/state.h"
#include "parallel/grad_buckets.h"

namespace moe {

struct AdamWSettings {
  double lr = 1e-3;
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8;
  double weight_decay = 0.0;
};

struct LrSchedule {
  double lr = 1e-3, min_lr = 0.0;
  int64_t warmup = 0, steps = 1;
  // Learning rate of optimizer step `step` (0-based): linear from lr/warmup up to lr over `warmup`
  // steps, then cosine from lr down to min_lr at the last step.
  double at(int64_t step) const;
};

// Updates the slices of the flat buffers it owns: the whole table by default, one slice of every
// gradient bucket under ZeRO. Its moments exist only for what it owns, in buffers of `backend`; params
// and grads are the model's, in the same backend's memory.
class AdamW : public Stateful {
 public:
  // zero: `owned` are this rank's ZeRO slices among its data-parallel group (who holds each moment alike).
  AdamW(Backend& backend, const ParamTable& table, AdamWSettings settings, const std::vector<Segment>& owned = {},
        bool zero = false);
  // One update of the owned params from grads at learning rate lr. Increments the step count first
  // (bias correction uses t = 1 for the first update).
  void step(float* params, const float* grads, double lr);
  int64_t steps_taken() const { return t_; }
  void set_steps_taken(int64_t t) { t_ = t; }  // restoring a checkpoint
  // The moments, in the backend's memory: (sum of the owned pieces' lengths) each.
  float* first_moment() { return m_.data<float>(); }
  float* second_moment() { return v_.data<float>(); }
  int64_t moment_size() const { return m_.numel(); }
  // Owned pieces, each within one parameter tensor: (offset in the flat buffers, length, decayed).
  struct Piece {
    int64_t offset, length;
    bool decay;
    int64_t state;  // offset into the moments
  };
  const std::vector<Piece>& pieces() const { return pieces_; }

  // Checkpoint state: the moments of the owned pieces ("optim/exp_avg/<name>", "optim/exp_avg_sq/<name>", each
  // in its parameter's coordinates) and the step ("optim/step") (optim/adamw_state.cpp).
  std::vector<StatePiece> state_pieces(StateUse use) override;
  void state_restored() override;

 private:
  Backend& backend_;
  const ParamTable& table_;
  bool zero_ = false;
  // A checkpoint's copies: the step, and the moments where the host cannot address the backend's memory.
  int64_t saved_steps_ = 0;
  std::vector<float> host_m_, host_v_;
  AdamWSettings s_;
  std::vector<Piece> pieces_;
  Buffer m_, v_;
  int64_t t_ = 0;
};

// L2 norm of all gradients (fixed reduction order). When clip > 0 and the norm exceeds it, scales the
// gradients by clip / norm. Returns the norm before clipping.
// grads: in the backend's memory.
double clip_grad_norm(Backend& backend, float* grads, int64_t n, double clip);
// Sum of squares over segments (fixed order).
double sum_squares(Backend& backend, const float* data, const std::vector<Segment>& segments);
// The sums of several lists of segments, each as sum_squares gives it (the same bits): every segment's sum in one
// op (Ops::sum_squares_segments_into), read back with one host wait.
std::vector<double> sum_squares(Backend& backend, const float* data,
                                const std::vector<const std::vector<Segment>*>& lists);
void scale_segments(Backend& backend, float* data, const std::vector<Segment>& segments, float factor);

}  // namespace moe
