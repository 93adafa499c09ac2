// The model of a checkpoint, built serially and loaded by global names: see checkpoint_forward.h.
#include "launch/interop/checkpoint_forward.h"

#include <set>
#include <string>

#include "core/error.h"
#include "core/ffn.h"
#include "core/mla_attention.h"
#include "core/moe_layer.h"
#include "launch/train/train_setup.h"

namespace moe {
namespace {

bool is_moe_layer(const Config& c, int64_t layer) {
  return c.moe.num_experts > 0 && layer % c.moe.every == c.moe.every - 1;
}

// Layer l's FFN as the config makes it, for inference: every MoE layer dropless, without noise or dropout,
// at the checkpoint's router temperature (a learned one is read from its parameter by the router itself).
Model<float>::FfnFactory inference_ffns(Backend& backend, const CheckpointModel& checkpoint) {
  const Config& c = checkpoint.config;
  std::vector<double> taus(size_t(c.model.layers), 1.0);
  for (int64_t l = 0; l < c.model.layers; ++l)
    if (is_moe_layer(c, l) && !c.moe.router.tau_learned) taus[size_t(l)] = router_tau(checkpoint, l);
  return [&backend, c, taus](int64_t layer) -> std::unique_ptr<FeedForward<float>> {
    if (!is_moe_layer(c, layer))
      return std::make_unique<DenseMlp<float>>(backend, c.model.d_model, c.model.ffn_hidden, c.model.layers);
    MoeSettings s = moe_settings(c, layer);
    s.capacity_factor = 0;  // dropless: the exported model's routing, and no token's routing depends on another's
    s.noise = RouterNoise::None, s.expert_dropout = 0;
    if (!s.tau_learned) s.tau = taus[size_t(layer)];
    return std::make_unique<MoeLayer<float>>(backend, s);
  };
}

Model<float>::AttentionFactory inference_attention(Backend& backend, const Config& c, int64_t seq_len) {
  if (c.model.attention != AttentionKind::Mla) return nullptr;  // the model's default: multi-head rotary attention
  const MlaShape mla{c.model.mla_kv_rank, c.model.mla_q_rank, c.model.mla_rope_dim, c.model.mla_norms};
  return [&backend, c, seq_len, mla](int64_t) -> std::unique_ptr<Attention<float>> {
    return std::make_unique<MlaAttention<float>>(backend, c.model.d_model, c.model.heads, seq_len, c.model.layers, mla);
  };
}

}  // namespace

CheckpointForward::CheckpointForward(const CheckpointModel& checkpoint, int64_t max_tokens, int threads)
    : backend_(make_cpu_backend(threads)),
      max_tokens_(max_tokens),
      vocab_(checkpoint.config.model.vocab),
      seed_(checkpoint.config.train.seed) {
  const ModelConfig& m = checkpoint.config.model;
  const ModelShape shape{m.vocab, m.d_model, m.layers, m.heads, m.ffn_hidden, m.kv_heads};
  model_ = std::make_unique<Model<float>>(
      *backend_,
      ModelOptions<float>{.shape = shape,
                          .seq_len = max_tokens,
                          .max_batch = 1,
                          .ffn_factory = inference_ffns(*backend_, checkpoint),
                          .attention_factory = inference_attention(*backend_, checkpoint.config, max_tokens)});
  load(checkpoint);
}

CheckpointForward::~CheckpointForward() = default;

// Every parameter of the model from the tensor of its name, and each MoE layer's balancing bias; the checkpoint
// may hold no parameter the model lacks (it would be a model of another config).
void CheckpointForward::load(const CheckpointModel& checkpoint) {
  std::set<std::string> wanted;
  for (const ParamSpec& spec : model_->table().specs()) {
    const std::string tensor = "params/" + spec.name;
    wanted.insert(tensor);
    if (checkpoint.shape(tensor) != spec.global_shape())
      MOE_BAD_INPUT("checkpoint " << checkpoint.dir << ": tensor " << tensor << " has shape "
                                  << nlohmann::json(checkpoint.shape(tensor)).dump() << " but its config's model needs "
                                  << nlohmann::json(spec.global_shape()).dump());
    const std::vector<float> values = read_tensor(checkpoint, tensor);
    backend_->copy_to_device(model_->params() + spec.offset, values.data(), spec.numel);
  }
  for (const auto& [tensor, info] : checkpoint.tensors)
    if (tensor.rfind("params/", 0) == 0 && !wanted.count(tensor))
      MOE_BAD_INPUT("checkpoint " << checkpoint.dir << " holds " << tensor
                                  << ", a parameter the model of its config does not have");
  for (int64_t l = 0; l < model_->num_layers(); ++l) {
    MoeLayer<float>* layer = dynamic_cast<MoeLayer<float>*>(&model_->ffn(l));
    if (!layer) continue;
    const std::string tensor = "moe/" + layer->param_prefix() + ".balancing_bias";
    if (!checkpoint.has(tensor)) continue;  // a checkpoint from before the bias was saved: all zero
    const std::vector<float> bias = read_tensor(checkpoint, tensor);
    if (bias.size() != layer->balancing_bias().size())
      MOE_BAD_INPUT("checkpoint " << checkpoint.dir << ": tensor " << tensor << " holds " << bias.size()
                                  << " values; the layer has " << layer->balancing_bias().size() << " experts");
    layer->balancing_bias() = bias;
  }
  model_->backend().ops<float>().parameters_changed();
}

std::vector<float> CheckpointForward::logits(const std::vector<int32_t>& tokens) {
  const int64_t n = int64_t(tokens.size());
  MOE_CHECK(n >= 1 && n <= max_tokens_, n << " tokens for a model of up to " << max_tokens_);
  // One sequence of max_tokens inputs, padded with id 0 after the given ones: attention is causal and routing
  // dropless, so the padding changes no logit of a given position. Targets are the next inputs.
  std::vector<int32_t> row(size_t(max_tokens_ + 1), 0);
  std::copy(tokens.begin(), tokens.end(), row.begin());
  model_->set_context(false, 0, 0, 0.0, seed_);
  model_->forward(0, row.data(), 1);
  std::vector<float> all = backend_->download(model_->logits(0), max_tokens_ * vocab_);
  all.resize(size_t(n * vocab_));
  return all;
}

}  // namespace moe
