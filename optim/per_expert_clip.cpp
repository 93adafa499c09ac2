// Per-expert gradient clipping.
#include "optim/per_expert_clip.h"

#include <cmath>
#include <map>

#include "core/error.h"

namespace moe {

PerExpertClip::PerExpertClip(const ParamTable& table, double factor) : factor_(factor) {
  std::map<std::string, size_t> first_of_group;
  for (const ParamSpec& spec : table.specs()) {
    if (spec.role != ParamRole::Expert) continue;
    MOE_CHECK(!spec.shape.empty() && spec.shape[0] > 0, "expert tensor " << spec.name << " without an expert axis");
    const std::string group = spec.name.substr(0, spec.name.rfind('.'));
    const int64_t E = spec.shape[0], per_expert = spec.numel / E;
    auto [it, inserted] = first_of_group.emplace(group, experts_.size());
    if (inserted)
      for (int64_t e = 0; e < E; ++e) experts_.push_back({group, e, {}, 0.0, 0, 0.0});
    for (int64_t e = 0; e < E; ++e) experts_[it->second + e].slices.emplace_back(spec.offset + e * per_expert, per_expert);
  }
}

int64_t PerExpertClip::apply(float* grads) {
  int64_t clipped = 0;
  for (Expert& x : experts_) {
    double ss = 0;
    for (auto [offset, length] : x.slices)
      for (int64_t i = 0; i < length; ++i) ss += double(grads[offset + i]) * grads[offset + i];
    const double norm = std::sqrt(ss);
    x.last_norm = norm;
    if (factor_ > 0 && x.samples >= kMinSamples) {
      const double average = x.ema / (1.0 - std::pow(kDecay, double(x.samples)));
      const double limit = factor_ * average;
      if (norm > limit && norm > 0) {
        const float scale = float(limit / norm);
        for (auto [offset, length] : x.slices)
          for (int64_t i = 0; i < length; ++i) grads[offset + i] *= scale;
        ++clipped;
      }
    }
    x.ema = kDecay * x.ema + (1.0 - kDecay) * norm;  // the unclipped norm
    ++x.samples;
  }
  return clipped;
}

}  // namespace moe
