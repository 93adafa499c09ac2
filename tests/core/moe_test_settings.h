// The MoE layer the micro-batch, pipeline-stage and recompute tests stress: capacity that drops (0.75) with
// rerouting, Gumbel noise, a shared expert and all four router losses, so every piece of per-micro-batch
// routing state matters; the model they build around it and the tokens of their micro-batches.
#pragma once

#include <memory>
#include <vector>

#include "core/model.h"
#include "core/moe/settings.h"
#include "core/moe_layer.h"

namespace moe::test {

inline MoeSettings stressed_moe_settings(const ModelShape& shape, int64_t layer) {
  MoeSettings s;
  s.d_model = shape.d_model, s.num_experts = 4, s.top_k = 2, s.expert_hidden = 8, s.shared_experts = 1;
  s.layers_total = shape.layers, s.layer = layer;
  s.noise = RouterNoise::Gumbel, s.capacity_factor = 0.75, s.overflow = Overflow::Reroute;
  s.coef_aux = 0.01, s.coef_z = 0.001, s.coef_entropy = 0.01, s.coef_death = 0.1;
  return s;
}

// A float model of `shape` whose odd layers are the stressed MoE layer (or every layer dense), its
// parameters initialised and scaled up so that routing is far from uniform, its gradients zero.
inline std::unique_ptr<Model<float>> stressed_model(Backend& backend, const ModelShape& shape, int64_t seq_len,
                                                    int64_t batch, bool with_moe, const RecomputeSpec& recompute,
                                                    int slots, const StageSpec& stage = {},
                                                    GemmPrecision precision = GemmPrecision::Fp32) {
  typename Model<float>::FfnFactory factory = nullptr;
  if (with_moe)
    factory = [&backend, shape](int64_t l) -> std::unique_ptr<FeedForward<float>> {
      if (l % 2 == 1) return std::make_unique<MoeLayer<float>>(backend, stressed_moe_settings(shape, l));
      return std::make_unique<DenseMlp<float>>(backend, shape.d_model, shape.ffn_hidden, shape.layers);
    };
  auto model = std::make_unique<Model<float>>(backend, ModelOptions<float>{.shape = shape,
                                                                           .seq_len = seq_len,
                                                                           .max_batch = batch,
                                                                           .recompute = recompute,
                                                                           .ffn_factory = factory,
                                                                           .num_slots = slots,
                                                                           .stage = stage,
                                                                           .precision = precision});
  model->init_params(21);
  for (int64_t i = 0; i < model->num_params(); ++i) model->params()[i] *= 8;  // routing far from uniform
  model->zero_grads();
  return model;
}

// The (batch, seq_len + 1) tokens of micro-batch `mb`, different for every micro-batch.
inline std::vector<int32_t> micro_batch_tokens(int mb, int64_t batch, int64_t seq_len, int64_t vocab) {
  std::vector<int32_t> tokens(size_t(batch * (seq_len + 1)));
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = int32_t((i * 13 + size_t(mb) * 7 + 3) % vocab);
  return tokens;
}

}  // namespace moe::test
