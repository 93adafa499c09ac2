// Per-expert gradient clipping (docs/model.md "Per-expert gradient clipping"): each routed expert's gradient,
// all its matrices together, is clipped to factor * m_e, where m_e is the bias-corrected exponential moving
// average (decay 0.99) of that expert's past unclipped norms; no clipping until m_e has 10 samples.
// Experts are found in the parameter table: every tensor of role Expert has the expert on axis 0, and
// tensors sharing a name prefix ("layers.3.ffn.experts") belong to the same experts.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/backend/backend.h"
#include "core/params.h"
#include "core/state.h"
#include "parallel/grad_buckets.h"

namespace moe {

class PerExpertClip : public Stateful {
 public:
  static constexpr double kDecay = 0.99;
  static constexpr int64_t kMinSamples = 10;

  // backend: where the gradients live; null or a host backend: the host loops below, else the backend's
  // sum_squares and scale ops on each slice.
  PerExpertClip(const ParamTable& table, double factor, Backend* backend = nullptr);
  // Clips in place; updates the averages with the unclipped norms. Returns how many experts were clipped.
  int64_t apply(float* grads) { return clip(grads, sum_squares(grads, nullptr), nullptr); }
  // The same in two halves, for when an expert's gradient is spread over ranks (ZeRO slices): each rank
  // sums the squares of the parts it owns (owned == nullptr: everything), the sums are reduced over the
  // ranks sharing the experts, then every rank clips its parts with the same totals.
  // threshold_scale (one per entry of experts(), or nullptr: all 1): frequency-aware clipping multiplies
  // each expert's threshold factor * m_e by its entry (docs/moe.md "Per-expert clipping").
  std::vector<double> sum_squares(const float* grads, const std::vector<Segment>* owned) const;
  int64_t clip(float* grads, const std::vector<double>& total_sum_squares, const std::vector<Segment>* owned,
               const std::vector<double>* threshold_scale = nullptr);

  struct Expert {
    std::string group;          // e.g. "layers.3.ffn.experts"
    int64_t index = 0;          // expert number within this rank's shard of its layer
    int64_t global_index = 0;   // expert number within its layer (index + the shard's first expert)
    int64_t layer_experts = 0;  // experts of the layer in all (E)
    std::vector<std::pair<int64_t, int64_t>> slices;  // (offset, length) in the flat buffers
    double ema = 0;                                   // uncorrected moving average of past norms
    int64_t samples = 0;
    double last_norm = 0;
  };
  const std::vector<Expert>& experts() const { return experts_; }
  std::vector<Expert>& experts() { return experts_; }

  // Checkpoint state: each layer's moving averages and sample counts of this rank's experts, by global expert
  // index ("clip/<group>.norm_ema", "clip/<group>.samples"; optim/per_expert_clip_state.cpp).
  std::vector<StatePiece> state_pieces(StateUse use) override;
  void state_restored() override;

 private:
  double factor_;
  Backend* device_ = nullptr;  // set only for a backend whose memory the host cannot address
  std::vector<Expert> experts_;
  // A checkpoint's copies of the experts' ema and samples, contiguous per layer.
  std::vector<double> saved_ema_;
  std::vector<int64_t> saved_samples_;
};

}  // namespace moe
