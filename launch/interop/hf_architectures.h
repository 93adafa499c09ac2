// Architectures of Hugging Face transformers as maps from this project's parameters: MixtralForCausalLM,
// Qwen2MoeForCausalLM, Glm4MoeForCausalLM and DeepseekV3ForCausalLM. For each: which config keys it can express (the
// rest is refused, naming key and value), its config.json, and each tensor of its checkpoint with the project tensor it
// comes from and how (transposed to (out, in), the rotary rows of q and k reordered from interleaved pairs to halves,
// one expert of the (E, ...) tensor, the router scaled by 1/tau, a constant). docs/interop.md has the mappings as
// tables. Not here: reading and writing files.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "launch/config/config.h"

namespace moe {

// One tensor of the exported model and how its values come from a checkpoint tensor.
struct HfTensor {
  enum class Op {
    Copy,           // the same values, the same shape
    Transpose,      // a (in, out) matrix as (out, in)
    TransposeRope,  // Transpose, then each head's rows from interleaved rotary pairs (2i, 2i+1) to (i, i + Dh/2)
    Expert,         // expert `expert` of an (E, in, out) tensor, as (out, in)
    Zeros,          // no source: all zero (a gate that must stay shut)
    Rows,           // some rows of a tensor made of several sources: see `blocks`
  };
  std::string name;                   // e.g. "model.layers.0.self_attn.q_proj.weight"
  std::vector<int64_t> shape;         // its shape in the exported model
  std::string source;                 // the checkpoint tensor, e.g. "params/layers.0.attn.wq"
  std::vector<int64_t> source_shape;  // the global shape the source must have
  Op op = Op::Copy;
  int64_t expert = -1;  // Op::Expert
  int64_t heads = 0;    // Op::TransposeRope
  double scale = 1.0;   // every value multiplied by it (the router: 1 / tau)
  std::string keys;     // the config keys that make `shape`, e.g. "(moe.num_experts = 8, model.d_model = 512)"
  // Op::Rows: the source (in, blocks * block_rows) transposed into rows b * block_stride + row_offset + j
  // (j < block_rows) of block b; the other rows come from the entries of the same name next to this one (MLA's
  // q_b_proj: per head, the content rows from Wuq then the rotary rows from Wqr).
  int64_t blocks = 1, block_rows = 0, block_stride = 0, row_offset = 0;
  // Op::Transpose, Op::Expert: part `part` of a source of parts side by side, (..., in, 2, out) (the gated MLPs'
  // W13: part 0 W1, part 1 W3); -1: a source of one part, (..., in, out).
  int64_t part = -1;
};

struct HfModel {
  std::string architecture;          // "MixtralForCausalLM" | "Qwen2MoeForCausalLM" | ... (the class name)
  nlohmann::json config;             // config.json, less "dtype" (the writer's choice)
  nlohmann::json generation_config;  // generation_config.json
  std::vector<HfTensor> tensors;     // in writing order: the tensors of one source consecutive
  // Checkpoint parameters the exported model has no use for, with why (params/ tensors not in `tensors`).
  std::vector<std::pair<std::string, std::string>> dropped;
};

// The architecture for `config`: `arch` "mixtral", "qwen2_moe", "glm4_moe" or "deepseek_v3", or "auto": the first of
// those four that expresses the config. `router_tau(layer)` is the temperature folded into the layer's router. BadInput
// naming the key and its value for what the architecture cannot express.
HfModel hf_model(const Config& config, const std::vector<double>& router_tau, const std::string& arch);
HfModel mixtral_model(const Config& config, const std::vector<double>& router_tau);
HfModel qwen2_moe_model(const Config& config, const std::vector<double>& router_tau);
// Glm4MoeForCausalLM: DeepSeek-V3's MoE block (sigmoid scores, e_score_correction_bias, shared experts, dense first
// layers) behind multi-head attention.
HfModel glm4_moe_model(const Config& config, const std::vector<double>& router_tau);
// DeepseekV3ForCausalLM: the same MoE block behind multi-head latent attention with its latents' norms
// (model.attention = mla, model.mla.norms = true); the tensors of several of ours (q_b_proj, kv_a_proj_with_mqa,
// kv_b_proj) are Op::Rows entries of one name.
HfModel deepseek_v3_model(const Config& config, const std::vector<double>& router_tau);
// For import with --upcycle: a dense LlamaForCausalLM's tensors into the config's MoE model, each MoE layer's every
// expert a copy of the layer's MLP (a tensor of the directory then has several entries, one per expert), the router
// not among them. BadInput for shared experts (they would add the MLP once more) and as for Qwen2-MoE.
HfModel llama_upcycle_model(const Config& config);

// The exported tensor `t` (t.shape, row-major) from its source's values (t.source_shape, row-major).
void fill_hf_tensor(const HfTensor& t, const float* source, float* out);
// The inverse: the source's elements that `t` comes from, set from `t`'s values (divided by t.scale).
void unfill_hf_tensor(const HfTensor& t, const float* values, float* source);

// config.json of a MixtralForCausalLM, Qwen2MoeForCausalLM, Glm4MoeForCausalLM, DeepseekV3ForCausalLM or (for
// --upcycle) LlamaForCausalLM checked against `config`; returns its model_type ("mixtral" | "qwen2_moe" | "glm4_moe"
// | "deepseek_v3" | "llama"). BadInput naming
// the config.json field, the key and both values where they disagree, or what this project's model cannot compute
// (grouped-query attention, another rotary base or norm epsilon, tied embeddings, another activation, q/k/v biases,
// sliding windows, partial rotary, q/k norms, scaled or group-limited gates).
std::string check_hf_config(const nlohmann::json& hf_config, const std::string& origin, const Config& config);

}  // namespace moe
