// MixtralForCausalLM as a map from this project's parameters: see hf_mixtral.h and docs/interop.md.
#include "launch/hf_mixtral.h"

#include <cmath>
#include <map>

#include "core/error.h"

namespace moe {
namespace {

// What Mixtral computes differently from the config; refused before anything is read or written.
void check_expressible(const Config& c) {
  const MoeConfig& m = c.moe;
  auto refuse = [](const std::string& key, const std::string& value, const std::string& why) {
    MOE_BAD_INPUT(key << " = " << value << ": MixtralForCausalLM cannot express it (" << why << "); nothing written");
  };
  if (c.model.attention != "mha")
    refuse("model.attention", c.model.attention, "its attention is multi-head attention with rotary q and k");
  if (m.num_experts == 0) refuse("moe.num_experts", "0", "every layer of a Mixtral model is an MoE layer");
  if (m.every != 1)
    refuse("moe.every", std::to_string(m.every), "every layer of a Mixtral model is an MoE layer, none dense");
  if (m.shared_experts != 0) refuse("moe.shared_experts", std::to_string(m.shared_experts), "it has no shared experts");
  if (m.router.score != "softmax") refuse("moe.router.score", m.router.score, "its router scores are a softmax");
  if (m.router.bias_balance_rate != 0)
    refuse("moe.router.bias_balance.rate", std::to_string(m.router.bias_balance_rate),
           "it has no per-expert bias in the expert selection");
  if (!m.router.normalize)
    refuse("moe.router.normalize", "false", "it always renormalises the selected experts' weights to sum 1");
}

std::string layer_name(int64_t l) { return "model.layers." + std::to_string(l); }
std::string param(const std::string& name) { return "params/" + name; }

}  // namespace

HfModel mixtral_model(const Config& c, const std::vector<double>& router_tau) {
  check_expressible(c);
  const int64_t V = c.model.vocab, D = c.model.d_model, L = c.model.layers, H = c.model.heads;
  const int64_t E = c.moe.num_experts, F = c.moe.expert_hidden;
  MOE_CHECK(int64_t(router_tau.size()) == L, router_tau.size() << " router temperatures for " << L << " layers");
  HfModel m;
  m.config = {{"architectures", {"MixtralForCausalLM"}},
              {"model_type", "mixtral"},
              {"vocab_size", V},
              {"hidden_size", D},
              {"intermediate_size", F},
              {"num_hidden_layers", L},
              {"num_attention_heads", H},
              {"num_key_value_heads", H},
              {"head_dim", D / H},
              {"hidden_act", "silu"},
              {"max_position_embeddings", c.train.seq_len},
              {"rms_norm_eps", 1e-5},
              {"rope_theta", 10000.0},
              {"rope_parameters", {{"rope_type", "default"}, {"rope_theta", 10000.0}}},
              {"num_local_experts", E},
              {"num_experts_per_tok", c.moe.top_k},
              {"router_jitter_noise", 0.0},
              {"router_aux_loss_coef", c.moe.loss.aux},
              {"output_router_logits", false},
              {"sliding_window", nullptr},
              {"attention_dropout", 0.0},
              {"initializer_range", 0.02},
              {"tie_word_embeddings", false},
              {"use_cache", true},
              {"bos_token_id", nullptr},
              {"eos_token_id", nullptr},
              {"pad_token_id", nullptr}};
  m.generation_config = {{"do_sample", false}, {"bos_token_id", nullptr}, {"eos_token_id", nullptr}};

  using Op = HfTensor::Op;
  struct Dim {
    int64_t size;
    const char* key;
  };
  const Dim v{V, "model.vocab"}, d{D, "model.d_model"}, e_{E, "moe.num_experts"}, f{F, "moe.expert_hidden"};
  auto add = [&m](std::string name, const std::vector<Dim>& dims, std::string source, std::vector<int64_t> source_shape,
                  Op op, int64_t expert = -1, int64_t heads = 0, double scale = 1.0) {
    std::vector<int64_t> shape;
    std::string keys;
    for (const Dim& dim : dims)
      shape.push_back(dim.size),
          keys += (keys.empty() ? "" : ", ") + std::string(dim.key) + " = " + std::to_string(dim.size);
    m.tensors.push_back({std::move(name), std::move(shape), param(source), std::move(source_shape), op, expert, heads,
                         scale, "(" + keys + ")"});
  };
  add("model.embed_tokens.weight", {v, d}, "embed.weight", {V, D}, Op::Copy);
  for (int64_t l = 0; l < L; ++l) {
    const std::string hf = layer_name(l), p = "layers." + std::to_string(l);
    add(hf + ".input_layernorm.weight", {d}, p + ".attn_norm.gain", {D}, Op::Copy);
    add(hf + ".self_attn.q_proj.weight", {d, d}, p + ".attn.wq", {D, D}, Op::TransposeRope, -1, H);
    add(hf + ".self_attn.k_proj.weight", {d, d}, p + ".attn.wk", {D, D}, Op::TransposeRope, -1, H);
    add(hf + ".self_attn.v_proj.weight", {d, d}, p + ".attn.wv", {D, D}, Op::Transpose);
    add(hf + ".self_attn.o_proj.weight", {d, d}, p + ".attn.wo", {D, D}, Op::Transpose);
    add(hf + ".post_attention_layernorm.weight", {d}, p + ".ffn_norm.gain", {D}, Op::Copy);
    // The router's logits divided by tau: softmax(x Wg / tau) is softmax of x (Wg / tau).
    add(hf + ".block_sparse_moe.gate.weight", {e_, d}, p + ".ffn.router.weight", {D, E}, Op::Transpose, -1, 0,
        1.0 / router_tau[size_t(l)]);
    for (const char* w : {"w1", "w3"})
      for (int64_t e = 0; e < E; ++e)
        add(hf + ".block_sparse_moe.experts." + std::to_string(e) + "." + w + ".weight", {f, d},
            p + ".ffn.experts." + w, {E, D, F}, Op::Expert, e);
    for (int64_t e = 0; e < E; ++e)
      add(hf + ".block_sparse_moe.experts." + std::to_string(e) + ".w2.weight", {d, f}, p + ".ffn.experts.w2",
          {E, F, D}, Op::Expert, e);
    if (c.moe.router.tau_learned)
      m.dropped.push_back({param(p + ".ffn.tau.log_ratio"), "the learned router temperature, folded into gate.weight"});
    if (c.moe.overflow_has("dense"))
      for (const char* w : {"w1", "w2", "w3"})
        m.dropped.push_back({param(p + ".ffn.fallback." + w),
                             "the dense fallback of assignments over capacity: the exported model is dropless, "
                             "nothing overflows"});
  }
  add("model.norm.weight", {d}, "out_norm.gain", {D}, Op::Copy);
  add("lm_head.weight", {v, d}, "head.weight", {D, V}, Op::Transpose);
  return m;
}

void fill_hf_tensor(const HfTensor& t, const float* source, float* out) {
  const auto scale = float(t.scale);
  switch (t.op) {
    case HfTensor::Op::Copy: {
      int64_t n = 1;
      for (int64_t d : t.shape) n *= d;
      for (int64_t i = 0; i < n; ++i) out[i] = source[i] * scale;
      return;
    }
    case HfTensor::Op::Transpose:
    case HfTensor::Op::Expert: {
      // out (R, C) = the source matrix (C, R) transposed; an expert's matrix starts at expert * R * C.
      const int64_t R = t.shape[0], C = t.shape[1];
      const float* s = source + (t.op == HfTensor::Op::Expert ? t.expert * R * C : 0);
      for (int64_t r = 0; r < R; ++r)
        for (int64_t c = 0; c < C; ++c) out[r * C + c] = s[c * R + r] * scale;
      return;
    }
    case HfTensor::Op::TransposeRope: {
      // Row h*Dh + i of the exported (out, in) matrix is output column h*Dh + 2i of ours, row h*Dh + Dh/2 + i is
      // column h*Dh + 2i + 1: transformers rotates the halves of a head (rotate_half), this project its
      // interleaved pairs, with the same frequency for pair i (docs/interop.md "Rotary embedding").
      const int64_t R = t.shape[0], C = t.shape[1], Dh = R / t.heads, half = Dh / 2;
      for (int64_t r = 0; r < R; ++r) {
        const int64_t h = r / Dh, j = r % Dh;
        const int64_t column = h * Dh + (j < half ? 2 * j : 2 * (j - half) + 1);
        for (int64_t c = 0; c < C; ++c) out[r * C + c] = source[c * R + column] * scale;
      }
      return;
    }
  }
}

void unfill_hf_tensor(const HfTensor& t, const float* values, float* source) {
  const auto scale = float(t.scale);
  switch (t.op) {
    case HfTensor::Op::Copy: {
      int64_t n = 1;
      for (int64_t d : t.shape) n *= d;
      for (int64_t i = 0; i < n; ++i) source[i] = values[i] / scale;
      return;
    }
    case HfTensor::Op::Transpose:
    case HfTensor::Op::Expert: {
      const int64_t R = t.shape[0], C = t.shape[1];
      float* s = source + (t.op == HfTensor::Op::Expert ? t.expert * R * C : 0);
      for (int64_t r = 0; r < R; ++r)
        for (int64_t c = 0; c < C; ++c) s[c * R + r] = values[r * C + c] / scale;
      return;
    }
    case HfTensor::Op::TransposeRope: {
      const int64_t R = t.shape[0], C = t.shape[1], Dh = R / t.heads, half = Dh / 2;
      for (int64_t r = 0; r < R; ++r) {
        const int64_t h = r / Dh, j = r % Dh;
        const int64_t column = h * Dh + (j < half ? 2 * j : 2 * (j - half) + 1);
        for (int64_t c = 0; c < C; ++c) source[c * R + column] = values[r * C + c] / scale;
      }
      return;
    }
  }
}

void check_mixtral_config(const nlohmann::json& hf, const std::string& origin, const Config& c) {
  if (!hf.is_object()) MOE_BAD_INPUT(origin << ": expected a JSON object");
  const std::string type = hf.value("model_type", std::string());
  if (type != "mixtral")
    MOE_BAD_INPUT(origin << ": model_type = \"" << type << "\"; only mixtral (MixtralForCausalLM) is imported");
  auto number = [&](const char* field, double fallback) {
    const nlohmann::json v = hf.value(field, nlohmann::json());
    if (v.is_null()) return fallback;
    if (!v.is_number()) MOE_BAD_INPUT(origin << ": " << field << " = " << v.dump() << "; expected a number");
    return v.get<double>();
  };
  auto same = [&](const char* field, double fallback, const char* key, int64_t value) {
    const double hf_value = number(field, fallback);
    if (hf_value != double(value))
      MOE_BAD_INPUT(origin << ": " << field << " = " << hf_value << " but " << key << " = " << value
                           << " in the config; they must agree");
  };
  same("vocab_size", -1, "model.vocab", c.model.vocab);
  same("hidden_size", -1, "model.d_model", c.model.d_model);
  same("num_hidden_layers", -1, "model.layers", c.model.layers);
  same("num_attention_heads", -1, "model.heads", c.model.heads);
  same("intermediate_size", -1, "moe.expert_hidden", c.moe.expert_hidden);
  same("num_local_experts", -1, "moe.num_experts", c.moe.num_experts);
  same("num_experts_per_tok", -1, "moe.top_k", c.moe.top_k);
  same("num_key_value_heads", number("num_attention_heads", -1), "model.heads (grouped-query attention is not built)",
       c.model.heads);
  same("head_dim", double(c.model.d_model / std::max<int64_t>(c.model.heads, 1)), "model.d_model / model.heads",
       c.model.d_model / std::max<int64_t>(c.model.heads, 1));
  auto refuse = [&](const std::string& what) {
    MOE_BAD_INPUT(origin << ": " << what << "; this project's model computes only what docs/model.md says");
  };
  const nlohmann::json rope = hf.value("rope_parameters", nlohmann::json::object());
  const double theta = rope.is_object() && rope.contains("rope_theta") ? rope["rope_theta"].get<double>()
                                                                       : number("rope_theta", 10000.0);
  if (theta != 10000.0) refuse("rope theta " + std::to_string(theta) + ", not 10000");
  if (rope.is_object() && rope.value("rope_type", std::string("default")) != "default")
    refuse("rope_type " + rope.value("rope_type", std::string()) + ", not default");
  if (std::abs(number("rms_norm_eps", 1e-5) - 1e-5) > 1e-12)
    refuse("rms_norm_eps " + std::to_string(number("rms_norm_eps", 0)) + ", not 1e-5");
  if (hf.value("hidden_act", std::string("silu")) != "silu")
    refuse("hidden_act " + hf.value("hidden_act", std::string()) + ", not silu");
  if (hf.value("tie_word_embeddings", false)) refuse("tie_word_embeddings true: the output head is untied here");
}

}  // namespace moe
