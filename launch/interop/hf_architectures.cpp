// MixtralForCausalLM, Qwen2MoeForCausalLM, Glm4MoeForCausalLM and DeepseekV3ForCausalLM as maps from this project's
// parameters: see hf_architectures.h and docs/interop.md.
#include "launch/interop/hf_architectures.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>

#include "checkpoint/stacked.h"
#include "core/error.h"

namespace moe {
namespace {

// "" when the architecture expresses the config, else why not ("KEY = VALUE: ARCH cannot express it (why)").
std::string refusal(const std::string& key, const std::string& value, const std::string& arch, const std::string& why) {
  return key + " = " + value + ": " + arch + " cannot express it (" + why + ")";
}

// What both compute alike: multi-head rotary attention, softmax scores without a selection bias.
std::string common_refusal(const Config& c, const std::string& arch) {
  const MoeConfig& m = c.moe;
  if (c.model.attention != AttentionKind::Mha)
    return refusal("model.attention", to_string(c.model.attention), arch,
                   "its attention is multi-head attention with rotary q and k");
  if (m.num_experts == 0) return refusal("moe.num_experts", "0", arch, "this export is of MoE models");
  if (m.router.score != RouterScore::Softmax)
    return refusal("moe.router.score", to_string(m.router.score), arch, "its router scores are a softmax");
  if (m.router.bias_balance_rate != 0)
    return refusal("moe.router.bias_balance.rate", std::to_string(m.router.bias_balance_rate), arch,
                   "it has no per-expert bias in the expert selection");
  return "";
}

std::string mixtral_refusal(const Config& c) {
  const std::string arch = "MixtralForCausalLM";
  const MoeConfig& m = c.moe;
  if (std::string why = common_refusal(c, arch); !why.empty()) return why;
  if (m.every != 1)
    return refusal("moe.every", std::to_string(m.every), arch,
                   "every layer of a Mixtral model is an MoE layer, none dense");
  if (m.shared_experts != 0)
    return refusal("moe.shared_experts", std::to_string(m.shared_experts), arch, "it has no shared experts");
  if (!m.router.normalize)
    return refusal("moe.router.normalize", "false", arch,
                   "it always renormalises the selected experts' weights to sum 1");
  return "";
}

std::string param(const std::string& name) { return "params/" + name; }

struct Dim {
  int64_t size;
  const char* key;
};

// Appends the tensors of a model, each with the config keys that make its shape.
class TensorList {
 public:
  explicit TensorList(HfModel& m) : m_(m) {}
  HfTensor& back() { return m_.tensors.back(); }
  void add(std::string name, const std::vector<Dim>& dims, const std::string& source, std::vector<int64_t> source_shape,
           HfTensor::Op op, int64_t expert = -1, int64_t heads = 0, double scale = 1.0) {
    std::vector<int64_t> shape;
    std::string keys;
    for (const Dim& dim : dims) {
      shape.push_back(dim.size);
      keys += (keys.empty() ? "" : ", ") + std::string(dim.key) + " = " + std::to_string(dim.size);
    }
    m_.tensors.push_back({std::move(name), std::move(shape), source.empty() ? "" : param(source),
                          std::move(source_shape), op, expert, heads, scale, "(" + keys + ")"});
    stack_part(m_.tensors.back());
  }

 private:
  // The gated MLPs' W1 and W3 are the parts of one tensor W13 (..., D, 2, F) (core/params.h ParamSpec::parts): a
  // source named as a part (checkpoint/stacked.h stacked_part) of shape (..., D, F) becomes that part of W13.
  static void stack_part(HfTensor& t) {
    const auto part = ckpt::stacked_part(t.source);
    if (!part) return;
    t.source = part->stacked, t.part = part->index;
    t.source_shape.insert(t.source_shape.end() - 1, 2);
  }

  HfModel& m_;
};

using Op = HfTensor::Op;

// The routed experts' tensors: every expert's gate and up projections (both from W13), then every expert's down
// projection, so that each source is read once in writing order.
void add_experts(TensorList& list, const std::string& mlp, const std::string& p, const Dim& d, const Dim& f, int64_t E,
                 int64_t D, int64_t F) {
  auto expert = [&](int64_t e) { return mlp + "experts." + std::to_string(e) + "."; };
  for (int64_t e = 0; e < E; ++e) {
    list.add(expert(e) + "gate_proj.weight", {f, d}, p + ".ffn.experts.w1", {E, D, F}, Op::Expert, e);
    list.add(expert(e) + "up_proj.weight", {f, d}, p + ".ffn.experts.w3", {E, D, F}, Op::Expert, e);
  }
  for (int64_t e = 0; e < E; ++e)
    list.add(expert(e) + "down_proj.weight", {d, f}, p + ".ffn.experts.w2", {E, F, D}, Op::Expert, e);
}

// DeepSeek-V3's latent attention (docs/interop.md "DeepseekV3ForCausalLM"): its projections are ours transposed,
// three of them two of ours stacked by rows. Its rotary rows are interleaved pairs (rope_interleave), as ours.
void add_mla(TensorList& list, const Config& c, const std::string& hf, const std::string& p) {
  const int64_t D = c.model.d_model, H = c.model.heads, Dh = D / H, C = c.model.mla_kv_rank, Cq = c.model.mla_q_rank,
                R = c.model.mla_rope_dim;
  const Dim d{D, "model.d_model"}, cq{Cq, "model.mla.q_rank"}, ckv{C, "model.mla.kv_rank"},
      q_rows{H * (Dh + R), "model.heads * (model.d_model / model.heads + model.mla.rope_dim)"},
      kv_a_rows{C + R, "model.mla.kv_rank + model.mla.rope_dim"}, kv_b_rows{2 * D, "2 * model.d_model"};
  // `name`'s rows from `source` (in, blocks * rows): block b's at b * stride + offset.
  auto rows = [&](const std::string& name, const std::vector<Dim>& dims, const std::string& source, int64_t in,
                  int64_t blocks, int64_t block_rows, int64_t stride, int64_t offset) {
    list.add(name, dims, source, {in, blocks * block_rows}, Op::Rows);
    HfTensor& t = list.back();
    t.blocks = blocks, t.block_rows = block_rows, t.block_stride = stride, t.row_offset = offset;
  };
  if (Cq > 0) {
    list.add(hf + "q_a_proj.weight", {cq, d}, p + "wdq", {D, Cq}, Op::Transpose);
    list.add(hf + "q_a_layernorm.weight", {cq}, p + "q_norm.gain", {Cq}, Op::Copy);
    rows(hf + "q_b_proj.weight", {q_rows, cq}, p + "wuq", Cq, H, Dh, Dh + R, 0);  // each head [content | rotary]
    rows(hf + "q_b_proj.weight", {q_rows, cq}, p + "wqr", Cq, H, R, Dh + R, Dh);
  } else {  // no query latent (q_lora_rank null): q_proj reads the hidden state, its rows as q_b_proj's
    rows(hf + "q_proj.weight", {q_rows, d}, p + "wuq", D, H, Dh, Dh + R, 0);
    rows(hf + "q_proj.weight", {q_rows, d}, p + "wqr", D, H, R, Dh + R, Dh);
  }
  rows(hf + "kv_a_proj_with_mqa.weight", {kv_a_rows, d}, p + "wdkv", D, 1, C, C + R, 0);  // [c_kv | rotary key]
  rows(hf + "kv_a_proj_with_mqa.weight", {kv_a_rows, d}, p + "wkr", D, 1, R, C + R, C);
  list.add(hf + "kv_a_layernorm.weight", {ckv}, p + "kv_norm.gain", {C}, Op::Copy);
  rows(hf + "kv_b_proj.weight", {kv_b_rows, ckv}, p + "wuk", C, H, Dh, 2 * Dh, 0);  // each head [key | value]
  rows(hf + "kv_b_proj.weight", {kv_b_rows, ckv}, p + "wuv", C, H, Dh, 2 * Dh, Dh);
}

using FfnTensors = std::function<void(TensorList& list, int64_t layer, const std::string& hf, const std::string& ours)>;

// What every architecture here has: the embedding; per layer the norms, the attention and (from `ffn`) the FFN; the
// output norm and head. And the parameters dropped on purpose.
void add_decoder(HfModel& m, const Config& c, const FfnTensors& ffn) {
  const int64_t V = c.model.vocab, D = c.model.d_model, H = c.model.heads, Hkv = c.model.kv_heads, K = Hkv * (D / H);
  const Dim v{V, "model.vocab"}, d{D, "model.d_model"}, kv{K, "model.kv_heads * model.d_model / model.heads"};
  TensorList list(m);
  list.add("model.embed_tokens.weight", {v, d}, "embed.weight", {V, D}, Op::Copy);
  for (int64_t l = 0; l < c.model.layers; ++l) {
    const std::string hf = "model.layers." + std::to_string(l), p = "layers." + std::to_string(l);
    list.add(hf + ".input_layernorm.weight", {d}, p + ".attn_norm.gain", {D}, Op::Copy);
    if (c.model.attention == AttentionKind::Mla) {
      add_mla(list, c, hf + ".self_attn.", p + ".attn.");
    } else {
      list.add(hf + ".self_attn.q_proj.weight", {d, d}, p + ".attn.wq", {D, D}, Op::TransposeRope, -1, H);
      // Grouped-query attention: Hkv key and value heads (k_proj, v_proj of Hkv Dh rows), as transformers'
      // repeat_kv reads them (query head h the key/value head h / (H / Hkv)), as core/attention.h does.
      list.add(hf + ".self_attn.k_proj.weight", {kv, d}, p + ".attn.wk", {D, K}, Op::TransposeRope, -1, Hkv);
      list.add(hf + ".self_attn.v_proj.weight", {kv, d}, p + ".attn.wv", {D, K}, Op::Transpose);
    }
    list.add(hf + ".self_attn.o_proj.weight", {d, d}, p + ".attn.wo", {D, D}, Op::Transpose);
    list.add(hf + ".post_attention_layernorm.weight", {d}, p + ".ffn_norm.gain", {D}, Op::Copy);
    ffn(list, l, hf, p);
    if (!(c.moe.num_experts > 0 && l % c.moe.every == c.moe.every - 1)) continue;
    if (c.moe.router.tau_learned)
      m.dropped.push_back({param(p + ".ffn.tau.log_ratio"), "the learned router temperature, folded into the gate"});
    if (c.moe.overflow_has(Overflow::Dense))
      for (const char* w : {"w13", "w2"})
        m.dropped.push_back({param(p + ".ffn.fallback." + w),
                             "the dense fallback of assignments over capacity: the exported model is dropless, "
                             "nothing overflows"});
  }
  list.add("model.norm.weight", {d}, "out_norm.gain", {D}, Op::Copy);
  list.add("lm_head.weight", {v, d}, "head.weight", {D, V}, Op::Transpose);
}

// config.json's keys every architecture here shares.
nlohmann::json decoder_config(const Config& c) {
  const int64_t D = c.model.d_model, H = c.model.heads;
  return {{"vocab_size", c.model.vocab},
          {"hidden_size", D},
          {"num_hidden_layers", c.model.layers},
          {"num_attention_heads", H},
          {"num_key_value_heads", c.model.kv_heads},
          {"head_dim", D / H},
          {"hidden_act", "silu"},
          {"max_position_embeddings", c.train.seq_len},
          {"rms_norm_eps", 1e-5},
          {"rope_theta", 10000.0},
          {"rope_parameters", {{"rope_type", "default"}, {"rope_theta", 10000.0}}},
          {"num_experts_per_tok", c.moe.top_k},
          {"router_aux_loss_coef", c.moe.loss.aux},
          {"output_router_logits", false},
          {"attention_dropout", 0.0},
          {"initializer_range", 0.02},
          {"tie_word_embeddings", false},
          {"use_cache", true},
          {"bos_token_id", nullptr},
          {"eos_token_id", nullptr},
          {"pad_token_id", nullptr}};
}

// Qwen2-MoE: the same attention; layer l is MoE when (l + 1) % decoder_sparse_step == 0 (moe.every), else a dense
// SwiGLU MLP; every MoE layer has one shared expert gated by sigmoid(x . g).
std::string qwen2_moe_refusal(const Config& c) { return common_refusal(c, "Qwen2MoeForCausalLM"); }

// The first MoE layer: the MoE layers of moe.every from there on (first_k_dense_replace), when they are a suffix.
int64_t first_moe_layer(const Config& c) {
  int64_t first = c.model.layers;
  for (int64_t l = c.model.layers - 1; l >= 0 && l % c.moe.every == c.moe.every - 1; --l) first = l;
  return first;
}

// DeepSeek-V3's MoE block (GLM-4.5's too): sigmoid scores, the balancing bias as e_score_correction_bias, shared
// experts, the first first_k_dense_replace layers dense. The group-limited selection is a plain top-k with
// n_group = topk_group = 1.
std::string deepseek_moe_refusal(const Config& c, const std::string& arch) {
  const MoeConfig& m = c.moe;
  if (m.num_experts < 2)
    return refusal("moe.num_experts", std::to_string(m.num_experts), arch,
                   "its group-limited selection needs at least 2 experts");
  if (m.router.score != RouterScore::Sigmoid)
    return refusal("moe.router.score", to_string(m.router.score), arch, "its router scores are sigmoids");
  // Its layers are dense before first_k_dense_replace and MoE from there: the MoE layers must be a suffix.
  const int64_t first = first_moe_layer(c);
  for (int64_t l = 0; l < first; ++l)
    if (l % m.every == m.every - 1)
      return refusal("moe.every", std::to_string(m.every), arch,
                     "its MoE layers are the last ones (first_k_dense_replace), here dense layer " +
                         std::to_string(first - 1) + " follows MoE layer " + std::to_string(l));
  return "";
}

// GLM-4.5's Glm4MoeForCausalLM: the same attention as Mixtral's (with partial_rotary_factor 1, no q/k norms, no
// biases) and DeepSeek-V3's MoE block.
std::string glm4_moe_refusal(const Config& c) {
  const std::string arch = "Glm4MoeForCausalLM";
  if (c.model.attention != AttentionKind::Mha)
    return refusal("model.attention", to_string(c.model.attention), arch,
                   "its attention is multi-head attention with rotary q and k");
  return deepseek_moe_refusal(c, arch);
}

// DeepseekV3ForCausalLM: multi-head latent attention whose latents are RMS-normalised (q_a_layernorm,
// kv_a_layernorm), and DeepSeek-V3's MoE block.
std::string deepseek_v3_refusal(const Config& c) {
  const std::string arch = "DeepseekV3ForCausalLM";
  if (c.model.attention != AttentionKind::Mla)
    return refusal("model.attention", to_string(c.model.attention), arch,
                   "its attention is multi-head latent attention, with one rotary key shared by all heads");
  if (!c.model.mla_norms)
    return refusal("model.mla.norms", "false", arch,
                   "its latent attention RMS-normalises both latents (q_a_layernorm, kv_a_layernorm)");
  return deepseek_moe_refusal(c, arch);
}

}  // namespace

HfModel hf_model(const Config& c, const std::vector<double>& router_tau, const std::string& arch) {
  if (arch == "mixtral") return mixtral_model(c, router_tau);
  if (arch == "qwen2_moe") return qwen2_moe_model(c, router_tau);
  if (arch == "glm4_moe") return glm4_moe_model(c, router_tau);
  if (arch == "deepseek_v3") return deepseek_v3_model(c, router_tau);
  if (arch != "auto")
    MOE_BAD_INPUT("--arch " << arch << ": expected auto, mixtral, qwen2_moe, glm4_moe or deepseek_v3");
  if (mixtral_refusal(c).empty()) return mixtral_model(c, router_tau);
  if (qwen2_moe_refusal(c).empty()) return qwen2_moe_model(c, router_tau);
  if (glm4_moe_refusal(c).empty()) return glm4_moe_model(c, router_tau);
  if (deepseek_v3_refusal(c).empty()) return deepseek_v3_model(c, router_tau);
  MOE_BAD_INPUT(mixtral_refusal(c) << "; nor can Qwen2MoeForCausalLM (" << qwen2_moe_refusal(c)
                                   << "), nor Glm4MoeForCausalLM (" << glm4_moe_refusal(c)
                                   << "), nor DeepseekV3ForCausalLM (" << deepseek_v3_refusal(c)
                                   << "); nothing written");
}

HfModel mixtral_model(const Config& c, const std::vector<double>& router_tau) {
  if (std::string why = mixtral_refusal(c); !why.empty()) MOE_BAD_INPUT(why << "; nothing written");
  const int64_t D = c.model.d_model, E = c.moe.num_experts, F = c.moe.expert_hidden;
  MOE_CHECK(int64_t(router_tau.size()) == c.model.layers, router_tau.size() << " router temperatures");
  HfModel m;
  m.architecture = "MixtralForCausalLM";
  m.config = decoder_config(c);
  m.config.update({{"architectures", {"MixtralForCausalLM"}},
                   {"model_type", "mixtral"},
                   {"intermediate_size", F},
                   {"num_local_experts", E},
                   {"router_jitter_noise", 0.0},
                   {"sliding_window", nullptr}});
  m.generation_config = {{"do_sample", false}, {"bos_token_id", nullptr}, {"eos_token_id", nullptr}};
  const Dim d{D, "model.d_model"}, e_{E, "moe.num_experts"}, f{F, "moe.expert_hidden"};
  add_decoder(m, c, [&](TensorList& list, int64_t l, const std::string& hf, const std::string& p) {
    // The router's logits divided by tau: softmax(x Wg / tau) is softmax of x (Wg / tau).
    list.add(hf + ".block_sparse_moe.gate.weight", {e_, d}, p + ".ffn.router.weight", {D, E}, Op::Transpose, -1, 0,
             1.0 / router_tau[size_t(l)]);
    for (const char* w : {"w1", "w3"})
      for (int64_t e = 0; e < E; ++e)
        list.add(hf + ".block_sparse_moe.experts." + std::to_string(e) + "." + w + ".weight", {f, d},
                 p + ".ffn.experts." + w, {E, D, F}, Op::Expert, e);
    for (int64_t e = 0; e < E; ++e)
      list.add(hf + ".block_sparse_moe.experts." + std::to_string(e) + ".w2.weight", {d, f}, p + ".ffn.experts.w2",
               {E, F, D}, Op::Expert, e);
  });
  return m;
}

HfModel qwen2_moe_model(const Config& c, const std::vector<double>& router_tau) {
  if (std::string why = qwen2_moe_refusal(c); !why.empty()) MOE_BAD_INPUT(why << "; nothing written");
  const int64_t D = c.model.d_model, E = c.moe.num_experts, F = c.moe.expert_hidden, Hd = c.model.ffn_hidden;
  const int64_t S = c.moe.shared_experts * F;  // our shared experts are one SwiGLU MLP of this width
  MOE_CHECK(int64_t(router_tau.size()) == c.model.layers, router_tau.size() << " router temperatures");
  HfModel m;
  m.architecture = "Qwen2MoeForCausalLM";
  m.config = decoder_config(c);
  m.config.update({{"architectures", {"Qwen2MoeForCausalLM"}},
                   {"model_type", "qwen2_moe"},
                   {"intermediate_size", Hd},
                   {"moe_intermediate_size", F},
                   {"shared_expert_intermediate_size", S},
                   {"num_experts", E},
                   {"norm_topk_prob", c.moe.router.normalize},
                   {"decoder_sparse_step", c.moe.every},
                   {"mlp_only_layers", nlohmann::json::array()},
                   {"qkv_bias", false},
                   {"use_sliding_window", false},
                   {"sliding_window", nullptr},
                   {"max_window_layers", c.model.layers}});
  m.generation_config = {{"do_sample", false}, {"bos_token_id", nullptr}, {"eos_token_id", nullptr}};
  const Dim d{D, "model.d_model"}, e_{E, "moe.num_experts"}, f{F, "moe.expert_hidden"}, h{Hd, "model.ffn_hidden"},
      s{S, "moe.shared_experts * moe.expert_hidden"}, one{1, "1"};
  add_decoder(m, c, [&](TensorList& list, int64_t l, const std::string& hf, const std::string& p) {
    const std::string mlp = hf + ".mlp.";
    if (l % c.moe.every != c.moe.every - 1) {  // a dense layer
      list.add(mlp + "gate_proj.weight", {h, d}, p + ".ffn.w1", {D, Hd}, Op::Transpose);
      list.add(mlp + "up_proj.weight", {h, d}, p + ".ffn.w3", {D, Hd}, Op::Transpose);
      list.add(mlp + "down_proj.weight", {d, h}, p + ".ffn.w2", {Hd, D}, Op::Transpose);
      return;
    }
    list.add(mlp + "gate.weight", {e_, d}, p + ".ffn.router.weight", {D, E}, Op::Transpose, -1, 0,
             1.0 / router_tau[size_t(l)]);
    add_experts(list, mlp, p, d, f, E, D, F);
    // The shared expert's output is scaled by sigmoid(x . g): g = 0 makes it 1/2 for every token, so its down
    // projection is doubled (exact in floating point). Without shared experts the shared expert has width 0.
    const bool shared = S > 0;
    list.add(mlp + "shared_expert.gate_proj.weight", {s, d}, shared ? p + ".ffn.shared.w1" : "", {D, S},
             shared ? Op::Transpose : Op::Zeros);
    list.add(mlp + "shared_expert.up_proj.weight", {s, d}, shared ? p + ".ffn.shared.w3" : "", {D, S},
             shared ? Op::Transpose : Op::Zeros);
    list.add(mlp + "shared_expert.down_proj.weight", {d, s}, shared ? p + ".ffn.shared.w2" : "", {S, D},
             shared ? Op::Transpose : Op::Zeros, -1, 0, 2.0);
    list.add(mlp + "shared_expert_gate.weight", {one, d}, "", {}, Op::Zeros);
  });
  return m;
}

namespace {

// config.json's keys of DeepSeek-V3's MoE block and layers (Glm4MoeForCausalLM's alike).
nlohmann::json deepseek_moe_config(const Config& c) {
  // top_k = 1 gates by the score itself here (no renormalisation), as norm_topk_prob false does.
  return {{"intermediate_size", c.model.ffn_hidden},
          {"moe_intermediate_size", c.moe.expert_hidden},
          {"n_routed_experts", c.moe.num_experts},
          {"n_shared_experts", c.moe.shared_experts},
          {"first_k_dense_replace", first_moe_layer(c)},
          {"norm_topk_prob", c.moe.router.normalize && c.moe.top_k > 1},
          {"routed_scaling_factor", 1.0},
          {"n_group", 1},
          {"topk_group", 1},
          {"attention_bias", false},
          {"num_nextn_predict_layers", 0}};
}

// Layer l's FFN in DeepSeek-V3's layout: a dense MLP before the first MoE layer, else the router with its
// balancing bias, the routed experts one by one and the shared experts.
void add_deepseek_ffn(TensorList& list, const Config& c, const std::vector<double>& router_tau, int64_t l,
                      const std::string& hf, const std::string& p) {
  const int64_t D = c.model.d_model, E = c.moe.num_experts, F = c.moe.expert_hidden, Hd = c.model.ffn_hidden;
  const int64_t S = c.moe.shared_experts * F;  // our shared experts are one SwiGLU MLP of this width
  const Dim d{D, "model.d_model"}, e_{E, "moe.num_experts"}, f{F, "moe.expert_hidden"}, h{Hd, "model.ffn_hidden"},
      s{S, "moe.shared_experts * moe.expert_hidden"};
  const std::string mlp = hf + ".mlp.";
  if (l < first_moe_layer(c)) {  // a dense layer
    list.add(mlp + "gate_proj.weight", {h, d}, p + ".ffn.w1", {D, Hd}, Op::Transpose);
    list.add(mlp + "up_proj.weight", {h, d}, p + ".ffn.w3", {D, Hd}, Op::Transpose);
    list.add(mlp + "down_proj.weight", {d, h}, p + ".ffn.w2", {Hd, D}, Op::Transpose);
    return;
  }
  list.add(mlp + "gate.weight", {e_, d}, p + ".ffn.router.weight", {D, E}, Op::Transpose, -1, 0,
           1.0 / router_tau[size_t(l)]);
  // The balancing bias: added to the scores for the selection only, in both.
  list.add(mlp + "gate.e_score_correction_bias", {e_}, "", {E}, Op::Copy);
  list.back().source = "moe/" + p + ".ffn.balancing_bias";
  add_experts(list, mlp, p, d, f, E, D, F);
  // n_shared_experts = 0: transformers still builds a shared MLP, of width 0; its tensors are written, empty.
  const bool shared = S > 0;
  const Op op = shared ? Op::Transpose : Op::Zeros;
  list.add(mlp + "shared_experts.gate_proj.weight", {s, d}, shared ? p + ".ffn.shared.w1" : "", {D, S}, op);
  list.add(mlp + "shared_experts.up_proj.weight", {s, d}, shared ? p + ".ffn.shared.w3" : "", {D, S}, op);
  list.add(mlp + "shared_experts.down_proj.weight", {d, s}, shared ? p + ".ffn.shared.w2" : "", {S, D}, op);
}

}  // namespace

HfModel glm4_moe_model(const Config& c, const std::vector<double>& router_tau) {
  if (std::string why = glm4_moe_refusal(c); !why.empty()) MOE_BAD_INPUT(why << "; nothing written");
  MOE_CHECK(int64_t(router_tau.size()) == c.model.layers, router_tau.size() << " router temperatures");
  HfModel m;
  m.architecture = "Glm4MoeForCausalLM";
  m.config = decoder_config(c);
  m.config.update(deepseek_moe_config(c));
  m.config.update(
      {{"architectures", {"Glm4MoeForCausalLM"}},
       {"model_type", "glm4_moe"},
       {"use_qk_norm", false},
       {"partial_rotary_factor", 1.0},
       {"rope_parameters", {{"rope_type", "default"}, {"rope_theta", 10000.0}, {"partial_rotary_factor", 1.0}}}});
  m.generation_config = {{"do_sample", false}, {"bos_token_id", nullptr}, {"eos_token_id", nullptr}};
  add_decoder(m, c, [&](TensorList& list, int64_t l, const std::string& hf, const std::string& p) {
    add_deepseek_ffn(list, c, router_tau, l, hf, p);
  });
  return m;
}

HfModel deepseek_v3_model(const Config& c, const std::vector<double>& router_tau) {
  if (std::string why = deepseek_v3_refusal(c); !why.empty()) MOE_BAD_INPUT(why << "; nothing written");
  MOE_CHECK(int64_t(router_tau.size()) == c.model.layers, router_tau.size() << " router temperatures");
  const int64_t Dh = c.model.d_model / c.model.heads, R = c.model.mla_rope_dim;
  HfModel m;
  m.architecture = "DeepseekV3ForCausalLM";
  m.config = decoder_config(c);
  m.config.update(deepseek_moe_config(c));
  // Its rotary embedding has head_dim = qk_rope_head_dim; the softmax scale 1 / sqrt(Dh + R) is ours, and
  // rope_interleave keeps the rotary pairs (2i, 2i+1) as ours are.
  m.config.update({{"architectures", {"DeepseekV3ForCausalLM"}},
                   {"model_type", "deepseek_v3"},
                   {"kv_lora_rank", c.model.mla_kv_rank},
                   {"q_lora_rank", c.model.mla_q_rank > 0 ? nlohmann::json(c.model.mla_q_rank) : nlohmann::json()},
                   {"qk_rope_head_dim", R},
                   {"qk_nope_head_dim", Dh},
                   {"v_head_dim", Dh},
                   {"head_dim", R},
                   {"rope_interleave", true}});
  m.generation_config = {{"do_sample", false}, {"bos_token_id", nullptr}, {"eos_token_id", nullptr}};
  add_decoder(m, c, [&](TensorList& list, int64_t l, const std::string& hf, const std::string& p) {
    add_deepseek_ffn(list, c, router_tau, l, hf, p);
  });
  return m;
}

HfModel llama_upcycle_model(const Config& c) {
  if (std::string why = common_refusal(c, "an upcycled LlamaForCausalLM"); !why.empty())
    MOE_BAD_INPUT(why << "; nothing written");
  if (c.moe.shared_experts != 0)
    MOE_BAD_INPUT("moe.shared_experts = " << c.moe.shared_experts
                                          << ": --upcycle makes every routed expert a copy of the dense MLP; a shared "
                                             "expert copied too would count it twice; nothing written");
  const int64_t D = c.model.d_model, E = c.moe.num_experts, F = c.moe.expert_hidden, Hd = c.model.ffn_hidden;
  HfModel m;
  m.architecture = "LlamaForCausalLM";
  const Dim d{D, "model.d_model"}, f{F, "moe.expert_hidden"}, h{Hd, "model.ffn_hidden"};
  add_decoder(m, c, [&](TensorList& list, int64_t l, const std::string& hf, const std::string& p) {
    const std::string mlp = hf + ".mlp.";
    if (l % c.moe.every != c.moe.every - 1) {  // a dense layer stays one
      list.add(mlp + "gate_proj.weight", {h, d}, p + ".ffn.w1", {D, Hd}, Op::Transpose);
      list.add(mlp + "up_proj.weight", {h, d}, p + ".ffn.w3", {D, Hd}, Op::Transpose);
      list.add(mlp + "down_proj.weight", {d, h}, p + ".ffn.w2", {Hd, D}, Op::Transpose);
      return;
    }
    // Sparse upcycling (Komatsuzaki et al.): each expert starts as the dense MLP. The router is not in the
    // directory: it keeps the fresh initialisation of the config's seed.
    for (int64_t e = 0; e < E; ++e) {
      list.add(mlp + "gate_proj.weight", {f, d}, p + ".ffn.experts.w1", {E, D, F}, Op::Expert, e);
      list.add(mlp + "up_proj.weight", {f, d}, p + ".ffn.experts.w3", {E, D, F}, Op::Expert, e);
      list.add(mlp + "down_proj.weight", {d, f}, p + ".ffn.experts.w2", {E, F, D}, Op::Expert, e);
    }
  });
  return m;
}

namespace {
// Op::Rows: exported row `row` of block b is column b * block_rows + j of the source (in, blocks * block_rows).
template <typename F>
void for_each_row(const HfTensor& t, F&& f) {
  for (int64_t b = 0; b < t.blocks; ++b)
    for (int64_t j = 0; j < t.block_rows; ++j) f(b * t.block_stride + t.row_offset + j, b * t.block_rows + j);
}
}  // namespace

void fill_hf_tensor(const HfTensor& t, const float* source, float* out) {
  const auto scale = float(t.scale);
  switch (t.op) {
    case HfTensor::Op::Rows: {  // only this entry's rows: the others come from the entries of the same name
      const int64_t C = t.shape[1], width = t.blocks * t.block_rows;
      for_each_row(t, [&](int64_t row, int64_t column) {
        for (int64_t c = 0; c < C; ++c) out[row * C + c] = source[c * width + column] * scale;
      });
      return;
    }
    case HfTensor::Op::Zeros: {
      int64_t n = 1;
      for (int64_t d : t.shape) n *= d;
      std::fill(out, out + n, 0.0f);
      return;
    }
    case HfTensor::Op::Copy: {
      int64_t n = 1;
      for (int64_t d : t.shape) n *= d;
      for (int64_t i = 0; i < n; ++i) out[i] = source[i] * scale;
      return;
    }
    case HfTensor::Op::Transpose:
    case HfTensor::Op::Expert: {
      // out (R, C) = the source matrix (C, R) transposed: its rows ld apart (a part's rows lie in rows of the parts
      // side by side); an expert's matrix starts at expert * C * ld.
      const int64_t R = t.shape[0], C = t.shape[1], ld = t.part >= 0 ? 2 * R : R;
      const float* s =
          source + (t.op == HfTensor::Op::Expert ? t.expert * C * ld : 0) + std::max<int64_t>(t.part, 0) * R;
      for (int64_t r = 0; r < R; ++r)
        for (int64_t c = 0; c < C; ++c) out[r * C + c] = s[c * ld + r] * scale;
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
    case HfTensor::Op::Rows: {
      const int64_t C = t.shape[1], width = t.blocks * t.block_rows;
      for_each_row(t, [&](int64_t row, int64_t column) {
        for (int64_t c = 0; c < C; ++c) source[c * width + column] = values[row * C + c] / scale;
      });
      return;
    }
    case HfTensor::Op::Zeros:
      return;  // no source; the importer checks the values are zero
    case HfTensor::Op::Copy: {
      int64_t n = 1;
      for (int64_t d : t.shape) n *= d;
      for (int64_t i = 0; i < n; ++i) source[i] = values[i] / scale;
      return;
    }
    case HfTensor::Op::Transpose:
    case HfTensor::Op::Expert: {
      const int64_t R = t.shape[0], C = t.shape[1], ld = t.part >= 0 ? 2 * R : R;
      float* s = source + (t.op == HfTensor::Op::Expert ? t.expert * C * ld : 0) + std::max<int64_t>(t.part, 0) * R;
      for (int64_t r = 0; r < R; ++r)
        for (int64_t c = 0; c < C; ++c) s[c * ld + r] = values[r * C + c] / scale;
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

namespace {

// A Hugging Face config.json read field by field: a wrong type, or a size that disagrees with this project's config,
// is refused naming the file, the field and both values.
struct HfFields {
  const nlohmann::json& hf;
  const std::string& origin;

  std::string text(const char* field, const std::string& fallback) const {
    const nlohmann::json v = hf.value(field, nlohmann::json());
    if (v.is_null()) return fallback;
    if (!v.is_string()) MOE_BAD_INPUT(origin << ": " << field << " = " << v.dump() << "; expected a string");
    return v.get<std::string>();
  }
  double number(const nlohmann::json& object, const char* field, double fallback) const {
    const nlohmann::json v = object.is_object() ? object.value(field, nlohmann::json()) : nlohmann::json();
    if (v.is_null()) return fallback;
    if (!v.is_number() && !v.is_boolean())
      MOE_BAD_INPUT(origin << ": " << field << " = " << v.dump() << "; expected a number");
    return v.is_boolean() ? double(v.get<bool>()) : v.get<double>();
  }
  double number(const char* field, double fallback) const { return number(hf, field, fallback); }
  void same(const char* field, double fallback, const std::string& key, int64_t value) const {
    const double hf_value = number(field, fallback);
    if (hf_value != double(value))
      MOE_BAD_INPUT(origin << ": " << field << " = " << hf_value << " but " << key << " = " << value
                           << " in the config; they must agree");
  }
  [[noreturn]] void refuse(const std::string& what) const {
    MOE_BAD_INPUT(origin << ": " << what << "; this project's model computes only what docs/model.md says");
  }
};

// The attention's sizes: heads, and multi-head latent attention's ranks for DeepSeek-V3.
void check_hf_attention(const HfFields& f, const std::string& type, const Config& c) {
  const int64_t head_dim = c.model.d_model / std::max<int64_t>(c.model.heads, 1);
  // Absent: as many as the heads (transformers' default).
  f.same("num_key_value_heads", f.number("num_attention_heads", -1), "model.kv_heads (0: model.heads)",
         c.model.kv_heads);
  if (type != "deepseek_v3") {
    f.same("head_dim", double(head_dim), "model.d_model / model.heads", head_dim);
    return;
  }
  // Its head_dim is the rotary width; the content and value widths have keys of their own.
  if (f.hf.value("q_lora_rank", nlohmann::json()).is_null()) {  // queries projected directly: model.mla.q_rank 0
    if (c.model.mla_q_rank != 0)
      MOE_BAD_INPUT(f.origin << ": q_lora_rank = null (queries projected directly, no query latent) but the config "
                                "has model.mla.q_rank = "
                             << c.model.mla_q_rank << "; expected model.mla.q_rank = 0");
  } else {
    f.same("q_lora_rank", -1, "model.mla.q_rank", c.model.mla_q_rank);
  }
  f.same("kv_lora_rank", -1, "model.mla.kv_rank", c.model.mla_kv_rank);
  f.same("qk_rope_head_dim", -1, "model.mla.rope_dim", c.model.mla_rope_dim);
  f.same("qk_nope_head_dim", -1, "model.d_model / model.heads", head_dim);
  f.same("v_head_dim", -1, "model.d_model / model.heads", head_dim);
  if (f.number("rope_interleave", 1) != 1)
    MOE_BAD_INPUT(f.origin << ": rope_interleave = false (rotary halves); this project rotates interleaved pairs and "
                              "imports rope_interleave = true");
}

// DeepSeek-V3's MoE block, in Glm4-MoE and DeepSeek-V3 alike.
void check_hf_deepseek_moe(const HfFields& f, const std::string& type, const Config& c) {
  const int64_t first_moe = first_moe_layer(c);
  if (first_moe > 0) f.same("intermediate_size", -1, "model.ffn_hidden", c.model.ffn_hidden);
  f.same("moe_intermediate_size", -1, "moe.expert_hidden", c.moe.expert_hidden);
  f.same("n_routed_experts", -1, "moe.num_experts", c.moe.num_experts);
  f.same("n_shared_experts", 1, "moe.shared_experts", c.moe.shared_experts);
  f.same("first_k_dense_replace", 1, "the first MoE layer of moe.every", first_moe);
  f.same("norm_topk_prob", 1, "moe.router.normalize (with moe.top_k > 1)", c.moe.router.normalize && c.moe.top_k > 1);
  f.same("n_group", 1, "1 (a plain top-k)", 1);
  f.same("topk_group", 1, "1 (a plain top-k)", 1);
  if (f.number("routed_scaling_factor", 1.0) != 1.0)
    MOE_BAD_INPUT(f.origin << ": routed_scaling_factor = " << f.number("routed_scaling_factor", 1.0)
                           << "; this project's gates are not scaled (1 expected)");
  if (type != "glm4_moe") return;
  const nlohmann::json rope = f.hf.value("rope_parameters", nlohmann::json::object());
  const double partial = f.number(rope, "partial_rotary_factor", f.number("partial_rotary_factor", 0.5));
  if (partial != 1.0)
    MOE_BAD_INPUT(f.origin << ": partial_rotary_factor = " << partial
                           << "; this project rotates the whole head (1 expected)");
  if (f.number("use_qk_norm", 0) != 0) MOE_BAD_INPUT(f.origin << ": use_qk_norm true; q and k are not normalised here");
}

// The feed-forward sizes of each architecture.
void check_hf_ffn(const HfFields& f, const std::string& type, const Config& c) {
  if (type == "mixtral") {
    f.same("intermediate_size", -1, "moe.expert_hidden", c.moe.expert_hidden);
    f.same("num_local_experts", -1, "moe.num_experts", c.moe.num_experts);
  } else if (type == "llama") {  // its MLP becomes every expert, and the dense layers' MLP
    f.same("intermediate_size", -1, "moe.expert_hidden", c.moe.expert_hidden);
    if (c.moe.every > 1) f.same("intermediate_size", -1, "model.ffn_hidden", c.model.ffn_hidden);
  } else if (type == "glm4_moe" || type == "deepseek_v3") {
    check_hf_deepseek_moe(f, type, c);
  } else {
    if (c.moe.every > 1) f.same("intermediate_size", -1, "model.ffn_hidden", c.model.ffn_hidden);
    f.same("moe_intermediate_size", -1, "moe.expert_hidden", c.moe.expert_hidden);
    f.same("shared_expert_intermediate_size", -1, "moe.shared_experts * moe.expert_hidden",
           c.moe.shared_experts * c.moe.expert_hidden);
    f.same("num_experts", -1, "moe.num_experts", c.moe.num_experts);
    f.same("decoder_sparse_step", 1, "moe.every", c.moe.every);
    f.same("norm_topk_prob", 0, "moe.router.normalize", c.moe.router.normalize);
  }
}

// What none of the architectures' models computes here: another rope, norm epsilon or activation, biases, tied
// embeddings, sliding windows, dense layers other than moe.every's.
void refuse_hf_options(const HfFields& f) {
  const nlohmann::json rope = f.hf.value("rope_parameters", nlohmann::json::object());
  if (f.number(rope, "rope_theta", f.number("rope_theta", 10000.0)) != 10000.0)
    f.refuse("a rope theta of " + std::to_string(f.number(rope, "rope_theta", f.number("rope_theta", 0))) +
             ", not 10000");
  if (rope.is_object() && rope.value("rope_type", nlohmann::json("default")) != nlohmann::json("default"))
    f.refuse("rope_type " + rope.value("rope_type", nlohmann::json()).dump() + ", not default");
  if (std::abs(f.number("rms_norm_eps", 1e-5) - 1e-5) > 1e-12)
    f.refuse("rms_norm_eps " + std::to_string(f.number("rms_norm_eps", 0)) + ", not 1e-5");
  if (f.text("hidden_act", "silu") != "silu") f.refuse("hidden_act " + f.text("hidden_act", "") + ", not silu");
  if (f.number("tie_word_embeddings", 0) != 0) f.refuse("tie_word_embeddings true: the output head is untied here");
  if (f.number("qkv_bias", 0) != 0) f.refuse("qkv_bias true: q, k and v have no biases here");
  if (f.number("attention_bias", 0) != 0) f.refuse("attention_bias true: the attention has no biases here");
  if (f.number("mlp_bias", 0) != 0) f.refuse("mlp_bias true: the MLPs have no biases here");
  if (f.number("use_sliding_window", 0) != 0)
    f.refuse("use_sliding_window true: attention is over the whole sequence here");
  const nlohmann::json only = f.hf.value("mlp_only_layers", nlohmann::json::array());
  if (!only.is_array() || !only.empty())
    f.refuse("mlp_only_layers " + only.dump() + ": dense layers follow moe.every here");
}

}  // namespace

std::string check_hf_config(const nlohmann::json& hf, const std::string& origin, const Config& c) {
  if (!hf.is_object()) MOE_BAD_INPUT(origin << ": expected a JSON object");
  const HfFields f{hf, origin};
  const std::string type = f.text("model_type", "");
  if (type != "mixtral" && type != "qwen2_moe" && type != "glm4_moe" && type != "deepseek_v3" && type != "llama")
    MOE_BAD_INPUT(origin << ": model_type = \"" << type
                         << "\"; imported are mixtral (MixtralForCausalLM), qwen2_moe (Qwen2MoeForCausalLM), "
                            "glm4_moe (Glm4MoeForCausalLM), deepseek_v3 (DeepseekV3ForCausalLM) and, with --upcycle, "
                            "llama (LlamaForCausalLM)");
  f.same("vocab_size", -1, "model.vocab", c.model.vocab);
  f.same("hidden_size", -1, "model.d_model", c.model.d_model);
  f.same("num_hidden_layers", -1, "model.layers", c.model.layers);
  f.same("num_attention_heads", -1, "model.heads", c.model.heads);
  if (type != "llama") f.same("num_experts_per_tok", -1, "moe.top_k", c.moe.top_k);
  check_hf_attention(f, type, c);
  check_hf_ffn(f, type, c);
  refuse_hf_options(f);
  return type;
}

}  // namespace moe
