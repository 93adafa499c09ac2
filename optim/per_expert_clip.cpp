// Per-expert gradient clipping.
#include "optim/per_expert_clip.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "core/error.h"
#include "optim/adamw.h"

namespace moe {

PerExpertClip::PerExpertClip(const ParamTable& table, double factor, Backend* backend)
    : factor_(factor), device_(backend && !backend->memory_is_host() ? backend : nullptr) {
  std::map<std::string, size_t> first_of_group;
  for (const ParamSpec& spec : table.specs()) {
    if (spec.role != ParamRole::Expert) continue;
    MOE_CHECK(!spec.shape.empty() && spec.shape[0] > 0, "expert tensor " << spec.name << " without an expert axis");
    const std::string group = spec.name.substr(0, spec.name.rfind('.'));
    const int64_t E = spec.shape[0], per_expert = spec.numel / E;
    auto [it, inserted] = first_of_group.emplace(group, experts_.size());
    const int64_t global_E = spec.global_rows > 0 ? spec.global_rows : E;
    if (inserted)
      for (int64_t e = 0; e < E; ++e) experts_.push_back({group, e, spec.shard_offset + e, global_E, {}, 0.0, 0, 0.0});
    for (int64_t e = 0; e < E; ++e)
      experts_[it->second + e].slices.emplace_back(spec.offset + e * per_expert, per_expert);
  }
}

namespace {
// Calls f(offset, length) for the parts of `slices` inside `owned` (all of them when owned is null).
template <typename F>
void for_owned(const std::vector<std::pair<int64_t, int64_t>>& slices, const std::vector<Segment>* owned, F f) {
  for (auto [offset, length] : slices) {
    if (!owned) {
      f(offset, length);
      continue;
    }
    for (const Segment& s : *owned) {
      const int64_t lo = std::max(offset, s.offset), hi = std::min(offset + length, s.offset + s.length);
      if (hi > lo) f(lo, hi - lo);
    }
  }
}
}  // namespace

std::vector<double> PerExpertClip::sum_squares(const float* grads, const std::vector<Segment>* owned) const {
  if (device_) {  // each expert's slices as one list of segments: every sum in one download (optim/adamw.h)
    std::vector<std::vector<Segment>> slices(experts_.size());
    for (size_t k = 0; k < experts_.size(); ++k)
      for_owned(experts_[k].slices, owned, [&](int64_t offset, int64_t length) {
        slices[k].push_back({offset, length});
      });
    std::vector<const std::vector<Segment>*> lists;
    for (const std::vector<Segment>& s : slices) lists.push_back(&s);
    return moe::sum_squares(*device_, grads, lists);
  }
  std::vector<double> ss(experts_.size(), 0.0);
  for (size_t k = 0; k < experts_.size(); ++k)
    for_owned(experts_[k].slices, owned, [&](int64_t offset, int64_t length) {
      for (int64_t i = 0; i < length; ++i) ss[k] += double(grads[offset + i]) * grads[offset + i];
    });
  return ss;
}

int64_t PerExpertClip::clip(float* grads, const std::vector<double>& total_sum_squares,
                            const std::vector<Segment>* owned, const std::vector<double>* threshold_scale) {
  MOE_CHECK(total_sum_squares.size() == experts_.size(),
            "sums of squares for " << total_sum_squares.size() << " experts, expected " << experts_.size());
  MOE_CHECK(!threshold_scale || threshold_scale->size() == experts_.size(),
            "threshold scales for " << threshold_scale->size() << " experts, expected " << experts_.size());
  int64_t clipped = 0;
  for (size_t k = 0; k < experts_.size(); ++k) {
    Expert& x = experts_[k];
    const double norm = std::sqrt(total_sum_squares[k]);
    x.last_norm = norm;
    if (factor_ > 0 && x.samples >= kMinSamples) {
      const double average = x.ema / (1.0 - std::pow(kDecay, double(x.samples)));
      const double limit = factor_ * average * (threshold_scale ? (*threshold_scale)[k] : 1.0);
      if (norm > limit && norm > 0) {
        const float scale = float(limit / norm);
        for_owned(x.slices, owned, [&](int64_t offset, int64_t length) {
          if (device_) return device_->ops<float>().scale(grads + offset, scale, length);
          for (int64_t i = 0; i < length; ++i) grads[offset + i] *= scale;
        });
        ++clipped;
      }
    }
    x.ema = kDecay * x.ema + (1.0 - kDecay) * norm;  // the unclipped norm
    ++x.samples;
  }
  return clipped;
}

}  // namespace moe
