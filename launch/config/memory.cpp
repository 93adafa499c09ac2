// The memory estimate (launch/config/memory.h): the config's shapes, split as docs/parallel.md "Memory per rank"
// says one rank holds them, handed to the sizing functions every layer and the optimizer allocate with
// (core/sizes.h); what is left here is which components a rank holds, how many of each, and the balanced routing
// the routed rows assume.
#include "launch/config/memory.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <string>

#include "core/sizes.h"
#include "parallel/pipeline.h"

namespace moe {
namespace {

// Counts are doubles: exact below 2^53, and a config past that saturates instead of overflowing.
constexpr double kFloat = 4, kInt32 = 4, kInt64 = 8, kDouble = 8, kByte = 1;

int64_t saturate(double bytes) {
  constexpr double kLargest = 9.2e18;  // just below INT64_MAX
  return bytes >= kLargest ? std::numeric_limits<int64_t>::max() : int64_t(bytes);
}

// The config's sizes (the letters of core/dims.h) and how one rank holds them.
struct Sizes {
  double V, D, L, H, F, T, N;  // N = B * T tokens of one micro-batch
  double Hkv;                  // key/value heads (model.kv_heads, its 0 read as H)
  double tp, etp, ep;
  bool sequence_parallel;           // in effect: parallel.sequence_parallel with tp > 1
  double rows;                      // rows of the residual stream and the norms here: N / tp with sequence parallelism
  double moe_layers, dense_layers;  // of this rank's pipeline stage
  int64_t first, last;              // the stage's layers [first, last) of the whole model's L
  bool embedding, head, pipelined;  // what the stage holds; pipelined: parallel.pp > 1
  double E, K, Fe, S, Ff;           // Ff: the dense fallback's width, 0 unless moe.overflow = "dense"
  double capacity_factor;
  bool gumbel, reroute, tau_learned;
  bool mla;                  // model.attention = mla (tp = 1)
  bool mla_norms;            // model.mla.norms: RMSNorms on its latents
  bool fused;                // MhaAttention on cuDNN's fused attention: train.device = cuda with bf16 GEMMs, not off
  bool fused_deterministic;  // its backward holds dS (B, H, T, T) bf16 in cuDNN's workspace
  bool cuda;                 // train.device = cuda: the backend's own device memory (device_kept_bytes, ...)
  bool cuda_bf16;            // train.device = cuda with bf16 GEMMs: activation operands rounded into workspace
  double held;               // a value held rounded (the experts' activations under bf16 GEMMs) in floats: 0.5 or 1
  double C, Cq, R;           // its latent widths and rotary width
};

Sizes sizes_of(const Config& c, int64_t tp, int64_t ep, const StagePart& stage) {
  const ModelConfig& m = c.model;
  const MoeConfig& moe = c.moe;
  Sizes s{};
  s.V = double(m.vocab), s.D = double(m.d_model), s.L = double(m.layers), s.H = double(m.heads);
  s.Hkv = double(m.kv_heads > 0 ? m.kv_heads : m.heads);
  s.F = double(m.ffn_hidden), s.T = double(c.train.seq_len), s.N = double(c.train.micro_batch) * s.T;
  s.tp = double(tp), s.etp = double(c.parallel.expert_tp), s.ep = double(ep);
  s.sequence_parallel = c.parallel.sequence_parallel && tp > 1;
  s.rows = s.sequence_parallel ? s.N / s.tp : s.N;
  s.first = stage.first, s.last = stage.last < 0 ? m.layers : stage.last;
  s.embedding = stage.embedding, s.head = stage.head, s.pipelined = stage.pipelined;
  // Layer l is an MoE layer when l % every == every - 1.
  s.moe_layers = 0;
  for (int64_t l = s.first; l < s.last; ++l) s.moe_layers += moe.num_experts > 0 && l % moe.every == moe.every - 1;
  s.dense_layers = double(s.last - s.first) - s.moe_layers;
  s.E = double(moe.num_experts), s.K = double(moe.top_k), s.Fe = double(moe.expert_hidden);
  s.S = double(moe.shared_experts), s.Ff = moe.overflow_has(Overflow::Dense) ? double(moe.fallback_hidden) : 0.0;
  s.capacity_factor = moe.capacity_factor;
  s.gumbel = moe.router.noise == RouterNoise::Gumbel, s.reroute = moe.overflow_has(Overflow::Reroute);
  s.tau_learned = moe.router.tau_learned;
  s.mla = m.attention == AttentionKind::Mla;
  s.mla_norms = s.mla && m.mla_norms;
  s.fused = !s.mla && c.train.device == Device::Cuda && c.train.precision == GemmPrecision::Bf16 &&
            c.train.fused_attention != FusedAttention::Off;
  s.fused_deterministic = c.train.fused_attention == FusedAttention::Deterministic;
  s.cuda = c.train.device == Device::Cuda;
  s.cuda_bf16 = s.cuda && c.train.precision == GemmPrecision::Bf16;
  s.held = c.train.precision == GemmPrecision::Bf16 ? 0.5 : 1.0;
  s.C = double(m.mla_kv_rank), s.Cq = double(m.mla_q_rank), s.R = double(m.mla_rope_dim);
  return s;
}

// Parameter elements of one rank, in the two regions of the parameter table (ZeRO shards them apart).
struct ParamCounts {
  double dense = 0, expert = 0;
};

// The rows an MoE layer computes on this rank: its block of N / tp of the routing group's N, or all N when
// its experts' hidden width is split over the tp ranks instead (expert_tp = tp).
double moe_rows(const Sizes& s) { return s.etp > 1 ? s.N : s.N / s.tp; }

// The size of a value held rounded under bf16 GEMMs (sizes' `held`), 0 under fp32 ones.
double bf16_held(const Sizes& s) { return s.held < 1 ? s.held : 0.0; }
// Multi-head attention's shard on this rank: H / tp heads of the D / tp columns of Wq and rows of Wo, and
// Hkv / tp key/value heads of the Hkv D / H / tp columns of Wk and Wv.
// Under bf16 GEMMs its input rounded once, kept but where sequence parallelism gathers it again in backward.
sizes::MhaShape mha_shape(const Sizes& s, bool keep_probs) {
  return {s.D,
          s.H / s.tp,
          s.D / s.tp,
          s.T,
          keep_probs,
          s.fused,
          s.Hkv * (s.D / s.H) / s.tp,
          bf16_held(s),
          bf16_held(s) > 0 && !s.sequence_parallel};
}
// Under bf16 GEMMs the head keeps its input held rounded in place of xo (OutputHead::keeps_input), but where sequence
// parallelism gathers it again.
bool head_keeps_input(const Sizes& s) { return bf16_held(s) > 0 && (s.tp == 1 || !s.sequence_parallel); }
// Latent attention (tp = 1).
sizes::MlaShape mla_shape(const Sizes& s, bool keep_probs) {
  return {s.D, s.H, s.T, s.C, s.Cq, s.R, s.mla_norms, keep_probs, bf16_held(s)};
}
// An MoE layer on this rank: its rows (moe_rows) of the routing group's N; the shared experts and the fallback
// split by hidden width with the experts (expert_tp).
sizes::MoeShape moe_shape(const Sizes& s) {
  return {s.D, s.E, s.K, s.N, moe_rows(s), s.S * s.Fe / s.etp, s.Ff / s.etp, s.reroute, bf16_held(s)};
}

ParamCounts param_counts(const Sizes& s) {
  const double attention =
      s.mla ? sizes::mla_parameters(mla_shape(s, true)) : sizes::mha_parameters(mha_shape(s, true));
  const double mlp = sizes::mlp_parameters(s.D, s.F / s.tp);  // W1, W3 by columns, W2 by rows
  // The router whole on every tensor-parallel rank; the shared experts and the fallback too, or split by hidden
  // width with the experts when expert_tp = tp.
  const sizes::MoeShape moe = moe_shape(s);
  const double moe_whole = sizes::router_parameters(s.D, s.E, s.tau_learned) +
                           (moe.shared_hidden > 0 ? sizes::mlp_parameters(s.D, moe.shared_hidden) : 0.0) +
                           (moe.fallback_hidden > 0 ? sizes::mlp_parameters(s.D, moe.fallback_hidden) : 0.0);
  ParamCounts p;
  // Embedding (V, D) split by rows and head (D, V) by columns; the output norm and two norms per layer whole.
  const double layers = double(s.last - s.first), norm = sizes::norm_parameters(s.D);
  p.dense = (s.embedding ? sizes::embedding_parameters(s.V / s.tp, s.D) : 0.0) +
            (s.head ? sizes::head_parameters(s.V / s.tp, s.D) + norm : 0.0) + layers * (2 * norm + attention) +
            s.dense_layers * mlp + s.moe_layers * moe_whole;
  // E / ep experts here, the hidden width split with expert_tp = tp.
  p.expert = s.moe_layers * sizes::expert_parameters(s.E / s.ep, s.D, s.Fe / s.etp);
  return p;
}

// AdamW keeps two fp32 moments of what this rank updates: everything, or with ZeRO one slice of every
// gradient bucket, dense buckets over the dp group and expert buckets over the edp group.
double optimizer_bytes(const ParamCounts& p, bool zero, double dp, double edp) {
  if (!zero) return kFloat * sizes::adamw_state(p.dense + p.expert);
  return kFloat * sizes::adamw_state(std::ceil(p.dense / dp) + std::ceil(p.expert / edp));
}

struct ModelBytes {
  double activations = 0, scratch = 0;
};

// One layer's saved activations and backward scratch (core/attention.h, core/ffn.h, parallel/tp_layers.h);
// the MoE layer keeps its scratch inside (routed_bytes_per_layer).
struct LayerElements {
  double acts = 0, scratch = 0;
};
// A tensor-parallel layer sees all N tokens of the micro-batch (the attention, the MLP, and the MoE layer split by
// hidden width), wrapped in the tp region's scratch; the norms and residuals see this rank's rows.
LayerElements layer_elements(const Sizes& s, bool moe, bool keep_probs) {
  const double N = s.N;
  const double wrapped = sizes::tp_wrapper_scratch(s.sequence_parallel, N, s.D);
  const sizes::Footprint attention =
      s.mla ? sizes::mla(mla_shape(s, keep_probs), N) : sizes::mha(mha_shape(s, keep_probs), N);
  const sizes::Footprint mlp = sizes::dense_mlp(N, s.F / s.tp, s.D, bf16_held(s));
  LayerElements e;
  const bool keeps_input = !s.mla && mha_shape(s, keep_probs).keep_input;
  e.acts = sizes::block_activations(s.rows, s.D, keeps_input) + attention.activations +
           (moe ? sizes::moe_activations(moe_shape(s)) : mlp.activations);
  // The MoE layer keeps its own scratch; split by hidden width it is a tp region like the MLP.
  e.scratch = std::max(attention.scratch + wrapped, moe ? (s.etp > 1 ? wrapped : 0.0) : mlp.scratch + wrapped);
  return e;
}

// What the model allocates with its slots and scratch (core/model.cpp): layer l recomputes with `mode`
// when l < recompute_layers (-1: every layer); layer l is an MoE layer when l % every == every - 1.
ModelBytes model_bytes(const Sizes& s, Recompute mode, int64_t recompute_layers, int64_t every, double slots) {
  const double N = s.N, D = s.D, rows = s.rows;
  double own = 0, shared = 0, layer_scratch = 0;
  for (int64_t l = s.first; l < s.last; ++l) {
    const bool recomputed = recompute_layers < 0 || l < recompute_layers;
    const bool moe = s.moe_layers > 0 && l % every == every - 1;
    const LayerElements e = layer_elements(s, moe, !(recomputed && mode == Recompute::Selective));
    if (recomputed && mode == Recompute::Full)
      shared = std::max(shared, e.acts);
    else
      own += e.acts;
    layer_scratch = std::max(layer_scratch, e.scratch);
  }
  // The head keeps xo (or its input held rounded), rstd_o (rows) and its activations: the logits (N, V), or split:
  // the block's logits (N, V/tp) and their log-sum-exp; its backward the logits' gradient, split: also the partial dx
  // and, under sequence parallelism, the input gathered again (N, D).
  const sizes::Footprint head = s.tp > 1
                                    ? sizes::vocab_parallel_head(N, s.V / s.tp, D, s.sequence_parallel, bf16_held(s))
                                    : sizes::lm_head(N, s.V, bf16_held(s), D);
  const double head_scratch = s.head ? head.scratch : 0.0;
  const double arena = sizes::residual_stream(double(s.last - s.first), rows, D) + own +
                       (s.head ? sizes::output_norm_activations(rows, D, head_keeps_input(s)) + head.activations : 0.0);
  // Per slot also its losses, target and input ids or input gradient, and under pipelining the executor's
  // messages.
  const sizes::SlotIo io = sizes::slot_io(N, rows, D, s.embedding, s.head);
  const double floats = arena + io.losses + io.input_grad + (s.pipelined ? sizes::pipeline_slot(rows, D).total() : 0.0);
  const double ints = io.targets + io.inputs;
  ModelBytes m;
  // Full recompute keeps one set of layer activations for the recomputed layers of every slot.
  m.activations = slots * (kFloat * floats + kInt32 * ints) + kFloat * shared;
  // ffn_out, dres, dtmp (rows, D) and the largest of the head's and the layers' backward scratch; latent
  // attention's (R, R) identity per layer.
  const double identities = s.mla ? double(s.last - s.first) * sizes::mla_identity(mla_shape(s, true)) : 0.0;
  m.scratch = kFloat * (sizes::model_scratch(rows, D) + std::max(head_scratch, layer_scratch) + identities);
  return m;
}

// Rows of one MoE layer's routing group on this rank. They depend on the routing; the estimate takes it
// balanced: every expert receives its share up to capacity (all N K assignments when dropless), and the
// rows an expert-parallel rank receives equal those it sends.
struct RoutedRows {
  double token_side;   // M: assignments kept, at the token's rank
  double expert_side;  // R: rows the local experts compute (balanced: as many as the rank sends)
  double fallback;     // Mf: tokens with an overflowed assignment (moe.overflow = "dense")
  double overflowed;   // Sf: the overflowed assignments the fallback computes
};

RoutedRows routed_rows(const Sizes& s) {
  // This rank's rows of the routing group, and their share of the group's capacity.
  const double n = moe_rows(s), assignments = n * s.K;
  const double capacity = s.capacity_factor > 0 ? std::ceil(s.K * s.N / s.E * s.capacity_factor) * n / s.N
                                                : std::numeric_limits<double>::infinity();
  RoutedRows r;
  r.token_side = std::min(assignments, s.E * capacity);
  r.expert_side = r.token_side;
  r.fallback = s.Ff > 0 ? std::min(n, assignments - r.token_side) : 0.0;
  r.overflowed = s.Ff > 0 ? assignments - r.token_side : 0.0;
  return r;
}

// What the CUDA backend keeps of its own (0 elsewhere), in bytes: cuBLAS's workspace, the rotary table of the
// attention's head width (latent attention's rotary width) and, with bf16 GEMMs, the rounded copy of the rank's
// `parameters` elements (every chunk's: they share one table).
double device_kept_bytes(const Sizes& s, double parameters) {
  if (!s.cuda) return 0;
  const double rotary = s.mla ? s.R : s.D / s.H;
  return sizes::cublas_workspace_bytes() + sizes::rope_table_bytes(s.T, rotary, kFloat) +
         (s.cuda_bf16 ? sizes::rounded_operand_bytes(parameters, kFloat) : 0.0);
}

// The CUDA backend's largest transient workspace of one call (0 elsewhere), in bytes: taken from its caching
// allocator for the call and given back (core/backend/cuda), so the largest call counts. With bf16 GEMMs each GEMM
// rounds its activation operands (the parameters come from their kept copy): the largest are the head's input x
// (N, D) where it is gathered under sequence parallelism (else it is held rounded, as its logits' gradient), and an
// expert layer's largest operand that is not held rounded already (its da (R, Fe / etp) or dy (R, D)) with the grouped
// call's pointer array; the fused attention's backward (sizes::fused_attention_backward_bytes), or the plain
// attention's output before it is rounded (N, Dq) in fp32 (sizes::attention_held_output_bytes). Not counted: the small
// per-call workspaces (the gradient norm's partial sums, the sorts' storage, which CUB states at run time).
double device_transient_bytes(const Sizes& s) {
  if (!s.cuda) return 0;
  double largest = 0;
  if (s.moe_layers > 0) largest = sizes::grouped_gemm_pointer_bytes(s.E / s.ep);
  if (s.cuda_bf16) {
    if (s.head && !head_keeps_input(s)) largest = std::max(largest, sizes::rounded_operand_bytes(s.N * s.D, kFloat));
    if (s.moe_layers > 0)
      largest = std::max(
          largest, sizes::rounded_operand_bytes(routed_rows(s).expert_side * std::max(s.D, s.Fe / s.etp), kFloat) +
                       sizes::grouped_gemm_pointer_bytes(s.E / s.ep));
  }
  const bool attention = s.dense_layers + s.moe_layers > 0;
  if (s.fused && attention)
    largest = std::max(largest, sizes::fused_attention_backward_bytes(
                                    sizes::fused_attention_shape(mha_shape(s, true), s.N, s.fused_deterministic)));
  if (s.cuda_bf16 && !s.fused && !s.mla && attention)
    largest = std::max(largest, sizes::attention_held_output_bytes(s.N, s.D / s.tp, kFloat));
  return largest;
}

// One MoE layer's buffers sized by routing (core/moe_layer.cpp, core/moe/experts.cpp, core/moe/router.cpp).
double routed_bytes_per_layer(const Sizes& s, double slots) {
  const RoutedRows r = routed_rows(s);
  const double D = s.D, K = s.K, E = s.E, F = s.Fe / s.etp;
  const double M = r.token_side, R = r.expert_side, Mf = r.fallback;
  // Per slot: expert-side xe (R, D) and a, b, h (R, F), and the dispatch plan's buffers.
  const sizes::MoePlanBuffers plan = sizes::moe_plan_buffers(moe_shape(s));
  // The router's buffers (core/moe/router.cpp) over the routing group: the layer's, and each slot's routing.
  const sizes::RouterBuffers router = sizes::router_buffers(s.N, E, K, s.reroute ? E : K, s.gumbel, s.tau_learned);
  const double per_slot = kFloat * (sizes::expert_activations(R, D, F, s.held) + plan.values() + router.slot_values()) +
                          kInt32 * (plan.int32s() + router.selected) + kInt64 * plan.int64s() + kByte * router.clamped;
  // The layer's workspace: gathered token rows (M, D) and expert outputs (R, D) over several expert-parallel ranks,
  // row dots (M, or Mf and the fallback's Sf), and the backward scratch (dyp, dxp (M, D), dye, dxe (R, D), the
  // experts' 3 R F, dp, dz (N, E), dw (N K), and the shared experts' or the fallback's scratch), and a split routing
  // group's permutation.
  const double backward = sizes::moe_backward_scratch(moe_shape(s), {M, R, Mf}, F);
  const sizes::GroupPermutation group = sizes::moe_group_permutation(moe_shape(s));
  const double workspace =
      kFloat * (sizes::moe_exchange_rows(M, R, D, s.ep == 1, s.held) + std::max(M, Mf) + r.overflowed + backward) +
      kInt32 * group.int32s() + kInt64 * group.int64s();
  const double router_layer = kDouble * router.layer_doubles() + kInt32 * router.layer_int32s() +
                              kFloat * (router.selected_score + router.bias) + kByte * router.mask;
  return slots * per_slot + workspace + router_layer;
}

// Communication staging in backend memory: ZeRO's reduce-scatter staging (the padded bucket and the
// received slice, kept per bucket) and, with ep > 1, each MoE layer's dispatcher staging: the all-to-all's received
// rows, or the all-gather's every rank's block of rows and this rank's own (sizes::alltoall_staging,
// allgather_staging).
double communication_bytes(const Sizes& s, const ParamCounts& p, bool zero, double dp, double edp, bool allgather) {
  double bytes = 0;
  if (zero && dp > 1) bytes += kFloat * (p.dense + p.dense / dp);
  if (zero && edp > 1) bytes += kFloat * (p.expert + p.expert / edp);
  // Over one expert-parallel rank the MoE layer copies its rows without staging.
  if (s.moe_layers == 0 || s.ep == 1) return bytes;
  const RoutedRows r = routed_rows(s);
  const sizes::DispatcherStaging staging =
      allgather ? sizes::allgather_staging(s.ep, r.token_side, s.D) : sizes::alltoall_staging(r.expert_side, s.D);
  return bytes + s.moe_layers * kFloat * staging.total();
}

}  // namespace

double host_rounded_parameter_bytes(const Config& config, const MemoryEstimate& estimate) {
  const bool host_bf16 = config.train.device != Device::Cuda && config.train.precision == GemmPrecision::Bf16;
  return host_bf16 ? double(estimate.parameters) : 0.0;
}

int64_t MemoryEstimate::total() const {
  double sum = 0;
  for (int64_t bytes :
       {parameters, gradients, optimizer, activations, scratch, routed_rows, communication, device_workspace})
    sum += double(bytes);
  return saturate(sum);
}

MemoryEstimate estimate_memory(const Config& config, int64_t tp, int64_t dp, int64_t ep, const StagePart& stage) {
  const Sizes s = sizes_of(config, tp, ep, stage);
  const int64_t slots = stage.slots;
  const ParamCounts p = param_counts(s);
  // The expert layers fold one pipeline stage's tp * dp ranks as expert_tp * ep * edp.
  const double edp = std::max(1.0, s.tp * double(dp) / (s.etp * s.ep));
  const ModelBytes model = model_bytes(s, config.train.recompute, config.train.recompute_layers,
                                       config.moe.num_experts > 0 ? config.moe.every : 1, double(slots));
  MemoryEstimate m;
  m.parameters = saturate(kFloat * (p.dense + p.expert));
  m.gradients = m.parameters;
  m.optimizer = saturate(optimizer_bytes(p, config.optim.zero, double(dp), edp));
  // The rank with the head stages its micro-batches' per-token losses for one read per step (core/loss_staging.h).
  const double micro_batches = double(config.train.global_batch / (dp * config.train.micro_batch));
  m.activations = saturate(model.activations + (s.head ? kFloat * sizes::loss_staging(micro_batches, s.N) : 0.0));
  m.scratch = saturate(model.scratch);
  m.routed_rows = saturate(s.moe_layers * routed_bytes_per_layer(s, double(slots)));
  m.communication = saturate(communication_bytes(s, p, config.optim.zero, double(dp), edp,
                                                 config.moe.dispatcher == DispatcherKind::AllGather));
  m.device_workspace = saturate(device_kept_bytes(s, p.dense + p.expert) + device_transient_bytes(s));
  // A key/value cache would keep k and v (2 Hkv Dh) per token and layer, or latent attention's c_kv and shared
  // rotary key (C + R); fp32.
  m.kv_cache_per_token = saturate(
      kFloat * s.L * (s.mla ? sizes::mla_kv_cache(mla_shape(s, true)) : sizes::mha_kv_cache(s.Hkv * (s.D / s.H))));
  return m;
}

StagePart pipeline_stage_part(const Config& config, int64_t stage, int64_t micro_batches) {
  const int64_t pp = config.parallel.pp;
  if (pp == 1) return {};
  const auto [first, last] = stage_layers(config.model.layers, pp, config.parallel.pp_layers)[size_t(stage)];
  return {first, last, stage == 0, stage == pp - 1, pipeline_slots(PipeSchedule::OneFOneB, pp, stage, micro_batches),
          true};
}

std::vector<StagePart> pipeline_chunk_parts(const Config& config, int64_t stage, int64_t micro_batches) {
  const int64_t pp = config.parallel.pp, V = config.parallel.vpp;
  if (V == 1) return {pipeline_stage_part(config, stage, micro_batches)};
  const std::vector<std::pair<int64_t, int64_t>> blocks = stage_layers(config.model.layers, pp * V);
  std::vector<StagePart> parts;
  for (int64_t c = 0; c < V; ++c) {
    const int64_t v = virtual_stage(pp, stage, c);
    parts.push_back({blocks[size_t(v)].first, blocks[size_t(v)].second, v == 0, v == pp * V - 1,
                     pipeline_slots(PipeSchedule::OneFOneB, pp, stage, micro_batches, V, c), true});
  }
  return parts;
}

namespace {

// A rank's chunks are models of their own: their bytes add up, but for the backend's own device memory (what it
// keeps once, and the one largest transient workspace) and the whole model's key/value cache.
MemoryEstimate chunks_estimate(const Config& config, int64_t tp, int64_t dp, int64_t ep,
                               const std::vector<StagePart>& parts) {
  MemoryEstimate sum;
  double parameters = 0, transient = 0;
  for (const StagePart& part : parts) {
    const MemoryEstimate e = estimate_memory(config, tp, dp, ep, part);
    sum.parameters += e.parameters, sum.gradients += e.gradients, sum.optimizer += e.optimizer;
    sum.activations += e.activations, sum.scratch += e.scratch, sum.routed_rows += e.routed_rows;
    sum.communication += e.communication;
    sum.kv_cache_per_token = e.kv_cache_per_token;
    const Sizes s = sizes_of(config, tp, ep, part);
    const ParamCounts p = param_counts(s);
    parameters += p.dense + p.expert;
    transient = std::max(transient, device_transient_bytes(s));
  }
  // The backend keeps one set of its own for the rank (one rounded copy of the shared table).
  sum.device_workspace = saturate(device_kept_bytes(sizes_of(config, tp, ep, parts.at(0)), parameters) + transient);
  return sum;
}

}  // namespace

StageEstimate largest_stage_estimate(const Config& config, int64_t tp, int64_t dp, int64_t ep) {
  const int64_t micro_batches = std::max<int64_t>(1, config.train.global_batch / (dp * config.train.micro_batch));
  StageEstimate largest;
  for (int64_t stage = 0; stage < config.parallel.pp; ++stage) {
    const MemoryEstimate e = chunks_estimate(config, tp, dp, ep, pipeline_chunk_parts(config, stage, micro_batches));
    if (stage == 0 || e.total() > largest.memory.total()) largest = {stage, e};
  }
  return largest;
}

nlohmann::json memory_json(const MemoryEstimate& m) {
  return {{"parameters", m.parameters},
          {"gradients", m.gradients},
          {"optimizer", m.optimizer},
          {"activations", m.activations},
          {"scratch", m.scratch},
          {"routed_rows", m.routed_rows},
          {"communication", m.communication},
          {"device_workspace", m.device_workspace},
          {"total", m.total()},
          {"kv_cache_per_token", m.kv_cache_per_token}};
}

std::string format_bytes(double bytes) {
  static const char* const kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  int unit = 0;
  while (bytes >= 1024 && unit < 6) bytes /= 1024, ++unit;
  char text[32];
  if (unit == 0)
    std::snprintf(text, sizeof text, "%.0f B", bytes);
  else
    std::snprintf(text, sizeof text, "%.1f %s", bytes, kUnits[unit]);
  return text;
}

std::string memory_text(const MemoryEstimate& m) {
  const std::pair<int64_t, const char*> parts[] = {{m.parameters, "parameters"},
                                                   {m.gradients, "gradients"},
                                                   {m.optimizer, "optimizer state"},
                                                   {m.activations, "activations"},
                                                   {m.scratch, "scratch"},
                                                   {m.routed_rows, "routed rows (estimated)"},
                                                   {m.communication, "communication staging"},
                                                   {m.device_workspace, "device workspace"}};
  std::string text;
  for (const auto& [bytes, name] : parts)
    if (bytes > 0) text += (text.empty() ? "" : ", ") + format_bytes(double(bytes)) + " " + name;
  text += "; " + format_bytes(double(m.total())) + " in all";
  if (m.kv_cache_per_token > 0)
    text += " (a key/value cache would hold " + format_bytes(double(m.kv_cache_per_token)) + " per token)";
  return text;
}

}  // namespace moe
