// The MoE layer the micro-batch and pipeline-stage tests stress: capacity that drops (0.75) with
// rerouting, Gumbel noise, a shared expert and all four router losses, so every piece of per-micro-batch
// routing state matters.
#pragma once

#include "core/model.h"
#include "core/moe/settings.h"

namespace moe::test {

inline MoeSettings stressed_moe_settings(const ModelShape& shape, int64_t layer) {
  MoeSettings s;
  s.d_model = shape.d_model, s.num_experts = 4, s.top_k = 2, s.expert_hidden = 8, s.shared_experts = 1;
  s.layers_total = shape.layers, s.layer = layer;
  s.noise = RouterNoise::Gumbel, s.capacity_factor = 0.75, s.overflow = Overflow::Reroute;
  s.coef_aux = 0.01, s.coef_z = 0.001, s.coef_entropy = 0.01, s.coef_death = 0.1;
  return s;
}

}  // namespace moe::test
