// The rules between config keys (launch/config/config_internal.h): each check names the keys, their values and where
// they came from, and states its reason; rules() is their table in docs/config.md's order, and gates() the
// features this build does not have yet. Not here: one key's type and range (launch/config/config_schema.cpp).
#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "core/error.h"
#include "launch/config/config_internal.h"

namespace moe::config_detail {
namespace {

void check_heads_divide_width(const Checked& c) {
  if (c.config.model.d_model % c.config.model.heads != 0)
    MOE_BAD_INPUT(c.show("model.d_model") << " is not a multiple of " << c.show("model.heads")
                                          << ": each attention head gets d_model / heads dimensions");
}
void check_head_dim_even(const Checked& c) {
  const int64_t head_dim = c.config.model.d_model / c.config.model.heads;
  if (head_dim % 2 != 0)
    MOE_BAD_INPUT("head dimension " << head_dim << " = " << c.show("model.d_model") << " / " << c.show("model.heads")
                                    << " is odd; expected an even head dimension: rotary embeddings rotate pairs");
}
void check_kv_heads_divide_heads(const Checked& c) {
  const ModelConfig& m = c.config.model;
  if (m.attention == AttentionKind::Mla && m.kv_heads != m.heads)
    MOE_BAD_INPUT(c.show("model.kv_heads") << " with " << c.show("model.attention")
                                           << ": expected 0 or model.heads; latent attention's keys and values come "
                                              "from one shared latent, not from key/value heads");
  if (m.heads % m.kv_heads != 0)
    MOE_BAD_INPUT(c.show("model.kv_heads") << " does not divide " << c.show("model.heads")
                                           << ": each group of heads / kv_heads query heads reads one key/value head; "
                                              "choose a divisor of "
                                           << m.heads << ", or 0 for " << m.heads);
}
void check_micro_batches_fill_step(const Checked& c) {
  if (c.config.train.global_batch % c.config.train.micro_batch != 0)
    MOE_BAD_INPUT(c.show("train.global_batch") << " is not a multiple of " << c.show("train.micro_batch")
                                               << ": a step accumulates whole micro-batches");
}
void check_min_lr(const Checked& c) {
  if (c.config.optim.min_lr > c.config.optim.lr)
    MOE_BAD_INPUT(c.show("optim.min_lr") << " is above " << c.show("optim.lr")
                                         << ": expected min_lr <= lr (the schedule decays from lr to min_lr)");
}
void check_vocab_holds_bytes(const Checked& c) {
  if (c.config.model.vocab < 256)
    MOE_BAD_INPUT(c.show("model.vocab") << ": expected at least 256: the tokenizer is bytes, so every byte value "
                                           "0..255 needs a token");
}
void check_top_k(const Checked& c) {
  if (c.config.moe.num_experts > 0 && c.config.moe.top_k > c.config.moe.num_experts)
    MOE_BAD_INPUT(c.show("moe.top_k") << " exceeds " << c.show("moe.num_experts")
                                      << ": a token cannot be routed to more experts than a layer has");
}
void check_moe_every(const Checked& c) {
  if (c.config.moe.every > c.config.model.layers)
    MOE_BAD_INPUT(c.show("moe.every") << " exceeds " << c.show("model.layers")
                                      << ": expected moe.every <= model.layers, or no block would be MoE");
}
void check_recompute_layers(const Checked& c) {
  if (c.config.train.recompute_layers > c.config.model.layers)
    MOE_BAD_INPUT(c.show("train.recompute_layers")
                  << " exceeds " << c.show("model.layers")
                  << ": expected -1 (every block) or at most model.layers, the blocks recompute applies to");
}

void check_node_local_without_replicas(const Checked& c) {
  if (c.config.checkpoint.node_local && !c.config.checkpoint.replicas.empty())
    MOE_BAD_INPUT(c.show("checkpoint.replicas") << " with " << c.show("checkpoint.node_local")
                                                << ": replicas copy one directory, which node-local roots do not have; "
                                                   "use checkpoint.peer_copy to keep each shard on a second host");
}

void check_heartbeat_interval(const Checked& c) {
  if (c.config.fault.heartbeat_interval_s >= c.config.fault.heartbeat_timeout_s)
    MOE_BAD_INPUT(c.show("fault.heartbeat_interval_s")
                  << " is not below " << c.show("fault.heartbeat_timeout_s")
                  << ": the supervisor would take every rank for dead between two heartbeats; lower the interval or "
                     "raise the timeout");
}
void check_alltoall_faults(const Checked& c) {
  for (const FaultInjection& f : c.config.fault.inject)
    if ((f.kind == FaultKind::FreezeAlltoall || f.kind == FaultKind::MismatchAlltoall) && c.config.parallel.ep < 2)
      MOE_BAD_INPUT("fault.inject: \"" << to_string(f.kind) << "\" with " << c.show("parallel.ep")
                                       << ": the fault fires at an all-to-all of the ep group, which a single rank "
                                          "does not have; set parallel.ep to 2 or more");
}
void check_all_to_all_count(const Checked& c) {
  const Config& k = c.config;
  if (k.moe.num_experts == 0 || k.parallel.ep == 1) return;
  // Every row a micro-batch routes can go to one peer, and MPI counts elements in an int.
  const double elements =
      double(k.train.micro_batch) * double(k.train.seq_len) * double(k.moe.top_k) * double(k.model.d_model);
  if (elements > double(std::numeric_limits<int32_t>::max()))
    MOE_BAD_INPUT("train.micro_batch * train.seq_len * moe.top_k * model.d_model = "
                  << k.train.micro_batch << " * " << k.train.seq_len << " * " << k.moe.top_k << " * " << k.model.d_model
                  << " = " << int64_t(elements) << " elements, with " << c.show("parallel.ep")
                  << ": one expert-parallel all-to-all carries at most 2147483647 (MPI counts are int); lower "
                     "train.micro_batch or train.seq_len");
}

// ---- Routing techniques and attention (docs/moe.md, docs/model.md) ---------------------------------

void check_overflow_cascade(const Checked& c) {
  const std::vector<Overflow>& levels = c.config.moe.overflow;
  if (levels.size() == 1 || (levels.size() == 2 && levels[0] == Overflow::Reroute)) return;
  MOE_BAD_INPUT(c.show("moe.overflow") << ": expected one policy, or a cascade that reroutes first: "
                                          "[\"reroute\", \"dense\"] or [\"reroute\", \"drop\"]; \"drop\" and "
                                          "\"dense\" take every assignment that reaches them, so nothing can follow");
}
void check_capacity_auto(const Checked& c) {
  const MoeConfig& m = c.config.moe;
  const CapacityAutoConfig& a = m.capacity_auto;
  if (!a.enabled) return;
  if (a.min > a.max)
    MOE_BAD_INPUT(c.show("moe.capacity_auto.min")
                  << " is above " << c.show("moe.capacity_auto.max") << ": expected min <= max, the factor's range");
  if (m.capacity_factor < a.min || m.capacity_factor > a.max)
    MOE_BAD_INPUT(c.show("moe.capacity_factor") << " with " << c.show("moe.capacity_auto.enabled")
                                                << ": expected a starting factor in [moe.capacity_auto.min, "
                                                   "moe.capacity_auto.max] = ["
                                                << a.min << ", " << a.max << "] (adaptive capacity needs a limit)");
  if (a.lower_below >= a.raise_above)
    MOE_BAD_INPUT(c.show("moe.capacity_auto.lower_below")
                  << " is not below " << c.show("moe.capacity_auto.raise_above")
                  << ": expected lower_below < raise_above, or one step's ratio would both raise and lower the factor");
}
void check_router_tau(const Checked& c) {
  const RouterConfig& r = c.config.moe.router;
  if (r.tau_min >= r.tau_max)
    MOE_BAD_INPUT(c.show("moe.router.tau_min") << " is not below " << c.show("moe.router.tau_max")
                                               << ": expected tau_min < tau_max, the learned temperature's range");
  if (!r.tau_learned) return;
  if (!r.tau_schedule.empty())
    MOE_BAD_INPUT(c.show("moe.router.tau_schedule") << " with " << c.show("moe.router.tau_learned")
                                                    << ": a temperature is either scheduled or learned; expected "
                                                       "an empty schedule or tau_learned = false");
  if (r.tau < r.tau_min || r.tau > r.tau_max)
    MOE_BAD_INPUT(c.show("moe.router.tau") << " with " << c.show("moe.router.tau_learned")
                                           << ": expected the starting temperature in [tau_min, tau_max] = ["
                                           << r.tau_min << ", " << r.tau_max << "]");
}
void check_mla(const Checked& c) {
  const ModelConfig& m = c.config.model;
  if (m.attention != AttentionKind::Mla) return;
  if (m.mla_rope_dim % 2 != 0)
    MOE_BAD_INPUT(c.show("model.mla.rope_dim") << " is odd; expected an even width: rotary embeddings rotate pairs");
  if (c.config.parallel.tp > 1)
    MOE_BAD_INPUT(c.show("model.attention") << " with " << c.show("parallel.tp")
                                            << ": multi-head latent attention is not split over tensor-parallel ranks "
                                               "in this build; expected parallel.tp = 1 (use dp, ep or pp) or "
                                               "model.attention = mha");
}

// ---- Pipeline parallelism (docs/parallel.md "Pipeline stages"): each stage holds a run of layers. ----

void check_pp_layers(const Checked& c) {
  const ParallelConfig& p = c.config.parallel;
  const int64_t layers = c.config.model.layers;
  if (p.pp_layers.empty()) {
    if (layers % p.pp != 0)
      MOE_BAD_INPUT(c.show("model.layers") << " is not a multiple of " << c.show("parallel.pp")
                                           << ": the stages take equal runs of layers unless parallel.pp_layers "
                                              "gives each stage's count; choose another parallel.pp or set "
                                              "parallel.pp_layers");
    return;
  }
  int64_t sum = 0;
  for (int64_t n : p.pp_layers) sum += n;
  if (int64_t(p.pp_layers.size()) != p.pp || sum != layers)
    MOE_BAD_INPUT(c.show("parallel.pp_layers") << " with " << c.show("parallel.pp") << " and " << c.show("model.layers")
                                               << ": expected " << p.pp << " entries (one per stage) summing to "
                                               << layers << ", got " << p.pp_layers.size() << " summing to " << sum);
}

// Interleaved stages (docs/parallel.md "Interleaved stages"): vpp chunks per rank, equal blocks of layers.
void check_vpp(const Checked& c) {
  const ParallelConfig& p = c.config.parallel;
  const bool interleaved = p.pp_schedule == PpSchedule::Interleaved1F1B;
  if (p.vpp > 1 && p.pp < 2)
    MOE_BAD_INPUT(c.show("parallel.vpp") << " with " << c.show("parallel.pp")
                                         << ": model chunks interleave over pipeline stages; expected parallel.pp >= 2 "
                                            "or parallel.vpp = 1");
  if (p.vpp > 1 && !interleaved)
    MOE_BAD_INPUT(c.show("parallel.vpp") << " with " << c.show("parallel.pp_schedule")
                                         << ": several chunks per stage run the interleaved schedule; expected "
                                            "parallel.pp_schedule = interleaved_1f1b or parallel.vpp = 1");
  if (interleaved && p.vpp < 2)
    MOE_BAD_INPUT(c.show("parallel.pp_schedule") << " with " << c.show("parallel.vpp")
                                                 << ": the interleaved schedule needs at least two chunks per stage; "
                                                    "expected parallel.vpp >= 2 or parallel.pp_schedule = 1f1b");
  if (p.vpp == 1) return;
  if (!p.pp_layers.empty())
    MOE_BAD_INPUT(c.show("parallel.pp_layers") << " with " << c.show("parallel.vpp")
                                               << ": interleaved chunks take equal blocks of layers; expected "
                                                  "parallel.pp_layers = [] (empty)");
  if (c.config.model.layers % (p.pp * p.vpp) != 0)
    MOE_BAD_INPUT(c.show("model.layers") << " with " << c.show("parallel.pp") << " and " << c.show("parallel.vpp")
                                         << ": expected a multiple of parallel.pp * parallel.vpp = " << p.pp * p.vpp
                                         << " (every chunk holds the same number of layers)");
}

// ---- Tensor parallelism (docs/parallel.md "Tensor parallelism"): what is split over the tp ranks. ----

// `key` (the width `value`) is split evenly over the parallel.tp ranks, for the reason `what`.
void require_tp_split(const Checked& c, const std::string& key, int64_t value, const std::string& what) {
  const int64_t tp = c.config.parallel.tp;
  if (value % tp != 0)
    MOE_BAD_INPUT(c.show(key) << " is not a multiple of " << c.show("parallel.tp") << ": " << what << "; choose a "
                              << key << " divisible by " << tp << ", or another parallel.tp");
}
void check_expert_tp(const Checked& c) {
  const ParallelConfig& p = c.config.parallel;
  if (p.expert_tp == 1 || p.expert_tp == p.tp) return;
  if (p.tp == 1)
    MOE_BAD_INPUT(c.show("parallel.expert_tp") << " with " << c.show("parallel.tp")
                                               << ": expected 1, since there is no tensor-parallel group to split "
                                                  "the experts over");
  MOE_BAD_INPUT(c.show("parallel.expert_tp")
                << " with " << c.show("parallel.tp")
                << ": expected 1 (every expert whole on each tensor-parallel rank) or " << p.tp
                << " = parallel.tp (each expert's hidden width split over the tensor-parallel group)");
}
void check_tp_heads(const Checked& c) {
  if (c.config.parallel.tp > 1)
    require_tp_split(c, "model.heads", c.config.model.heads,
                     "each tensor-parallel rank computes heads / tp whole attention heads (Wq, Wk, Wv split by "
                     "columns, Wo by rows)");
  if (c.config.parallel.tp > 1 && c.config.model.attention != AttentionKind::Mla)
    require_tp_split(c, "model.kv_heads", c.config.model.kv_heads,
                     "each tensor-parallel rank computes kv_heads / tp whole key/value heads, the ones its query "
                     "heads read (Wk, Wv split by columns)");
}
void check_tp_vocab(const Checked& c) {
  if (c.config.parallel.tp > 1)
    require_tp_split(c, "model.vocab", c.config.model.vocab,
                     "the embedding's rows and the output head's columns are split over the tensor-parallel ranks");
}
void check_tp_ffn_hidden(const Checked& c) {
  const Config& k = c.config;
  const bool dense_layers = k.moe.num_experts == 0 || k.moe.every > 1;  // else every FFN is an MoE layer
  if (k.parallel.tp > 1 && dense_layers)
    require_tp_split(c, "model.ffn_hidden", k.model.ffn_hidden,
                     "the dense MLP's hidden width is split over the tensor-parallel ranks (W1, W3 by columns, W2 "
                     "by rows)");
}
void check_tp_expert_hidden(const Checked& c) {
  const Config& k = c.config;
  if (k.parallel.tp == 1 || k.parallel.expert_tp != k.parallel.tp || k.moe.num_experts == 0) return;
  require_tp_split(c, "moe.expert_hidden", k.moe.expert_hidden,
                   "with " + c.show("parallel.expert_tp") +
                       " each routed expert's hidden width (and the shared experts') is split over the tensor-parallel "
                       "ranks");
  if (k.moe.overflow_has(Overflow::Dense))
    require_tp_split(c, "moe.fallback_hidden", k.moe.fallback_hidden,
                     "with " + c.show("parallel.expert_tp") +
                         " the dense fallback's hidden width is split over the tensor-parallel ranks too");
}
void check_schedule_names(const Checked& c) {
  std::vector<std::string> names;
  for (const DataSourceConfig& s : c.config.data.sources) names.push_back(s.name);
  if (names.empty()) names = {"prose", "code", "arithmetic"};  // data/corpus/, docs/data.md
  for (size_t i = 0; i < c.config.data.schedule.size(); ++i)
    for (const auto& [name, weight] : c.config.data.schedule[i].weights)
      if (std::find(names.begin(), names.end(), name) == names.end()) {
        std::string have;
        for (const std::string& n : names) have += (have.empty() ? "\"" : "\", \"") + n;
        MOE_BAD_INPUT("data.schedule[" << i << "].weights names source \"" << name
                                       << "\", which is not a data source; the sources are " << have << "\"");
      }
}

void check_tp_seq_len(const Checked& c) {
  const ParallelConfig& p = c.config.parallel;
  if (p.tp > 1 && p.sequence_parallel)
    require_tp_split(c, "train.seq_len", c.config.train.seq_len,
                     "with " + c.show("parallel.sequence_parallel") +
                         " each tensor-parallel rank holds seq_len / tp positions of every sequence (or set "
                         "parallel.sequence_parallel = false)");
}

void check_tp_routing_group(const Checked& c) {
  const Config& k = c.config;
  const int64_t tp = k.parallel.tp, rows = k.train.micro_batch * k.train.seq_len;
  if (tp > 1 && k.moe.num_experts > 0 && k.parallel.expert_tp == 1 && rows % tp != 0)
    MOE_BAD_INPUT(c.show("train.micro_batch") << " times " << c.show("train.seq_len") << " = " << rows
                                              << " tokens is not a multiple of " << c.show("parallel.tp")
                                              << ": a micro-batch's tokens (its MoE routing group) are split evenly "
                                                 "over the tensor-parallel ranks; choose sizes whose product "
                                                 "divides by "
                                              << tp);
}

}  // namespace

const std::vector<Rule>& rules() {
  static const std::vector<Rule> table = {
      {"`model.d_model` is a multiple of `model.heads`.", check_heads_divide_width},
      {"The head dimension `model.d_model / model.heads` is even (rotary embeddings rotate pairs).",
       check_head_dim_even},
      {"`model.kv_heads` (0: `model.heads`) divides `model.heads`; with `model.attention` = mla it is 0 or "
       "`model.heads`.",
       check_kv_heads_divide_heads},
      {"`train.global_batch` is a multiple of `train.micro_batch`.", check_micro_batches_fill_step},
      {"`optim.min_lr` <= `optim.lr`.", check_min_lr},
      {"`model.vocab` >= 256: the tokenizer is bytes.", check_vocab_holds_bytes},
      {"`moe.top_k` <= `moe.num_experts` when `moe.num_experts` > 0.", check_top_k},
      {"`moe.every` <= `model.layers`.", check_moe_every},
      {"`train.recompute_layers` <= `model.layers` (-1: every block).", check_recompute_layers},
      {"`checkpoint.replicas` is empty when `checkpoint.node_local` is true.", check_node_local_without_replicas},
      {"`fault.heartbeat_interval_s` < `fault.heartbeat_timeout_s`, or every rank would look dead between beats.",
       check_heartbeat_interval},
      {"`fault.inject`'s `freeze_alltoall` and `mismatch_alltoall` need `parallel.ep` >= 2: they fire at an "
       "all-to-all of the ep group.",
       check_alltoall_faults},
      {"With `parallel.ep` > 1 and experts, `train.micro_batch * train.seq_len * moe.top_k * model.d_model` <= "
       "2147483647: the elements of one all-to-all, counted by MPI in an int.",
       check_all_to_all_count},
      {"With `parallel.pp_layers` empty, `model.layers` is a multiple of `parallel.pp` (equal stages); otherwise "
       "`parallel.pp_layers` has `parallel.pp` entries summing to `model.layers`.",
       check_pp_layers},
      {"With `parallel.vpp` > 1: `parallel.pp` >= 2, `parallel.pp_schedule` = interleaved_1f1b, "
       "`parallel.pp_layers` empty and `model.layers` a multiple of `parallel.pp * parallel.vpp`; "
       "`parallel.pp_schedule` = interleaved_1f1b needs `parallel.vpp` >= 2.",
       check_vpp},
      {"`parallel.expert_tp` is 1 (experts whole on every tensor-parallel rank) or `parallel.tp` (each expert's "
       "hidden width split over the tensor-parallel group).",
       check_expert_tp},
      {"With `parallel.tp` > 1: `model.heads` and (multi-head attention) `model.kv_heads` are multiples of "
       "`parallel.tp` (whole heads per rank).",
       check_tp_heads},
      {"With `parallel.tp` > 1: `model.vocab` is a multiple of `parallel.tp` (embedding rows and head columns are "
       "split).",
       check_tp_vocab},
      {"With `parallel.tp` > 1 and dense FFN layers (`moe.num_experts` = 0 or `moe.every` > 1): `model.ffn_hidden` is "
       "a multiple of `parallel.tp`.",
       check_tp_ffn_hidden},
      {"With `parallel.tp` > 1, experts and `parallel.expert_tp` = `parallel.tp`: `moe.expert_hidden` (and "
       "`moe.fallback_hidden` with `moe.overflow` = dense) is a multiple of `parallel.tp`: the routed and shared "
       "experts and the fallback split their hidden width. With `parallel.expert_tp` = 1 none of them is split.",
       check_tp_expert_hidden},
      {"With `parallel.tp` > 1 and `parallel.sequence_parallel`: `train.seq_len` is a multiple of `parallel.tp`.",
       check_tp_seq_len},
      {"With `parallel.tp` > 1, experts and `parallel.expert_tp` = 1: `train.micro_batch * train.seq_len` is a "
       "multiple "
       "of `parallel.tp` (the routing group's tokens are split over the tensor-parallel ranks).",
       check_tp_routing_group},
      {"`moe.overflow` is one policy or a cascade that reroutes first: `[\"reroute\", \"dense\"]` or "
       "`[\"reroute\", \"drop\"]`.",
       check_overflow_cascade},
      {"With `moe.capacity_auto.enabled`: `min` <= `moe.capacity_factor` <= `max`, and `lower_below` < "
       "`raise_above`.",
       check_capacity_auto},
      {"`moe.router.tau_min` < `moe.router.tau_max`; with `moe.router.tau_learned`, `moe.router.tau` lies between "
       "them and `moe.router.tau_schedule` is empty.",
       check_router_tau},
      {"With `model.attention` = mla: `model.mla.rope_dim` is even and `parallel.tp` = 1.", check_mla},
      {"The weights of `data.sources` sum to a finite number.", nullptr},  // checked with the list itself
      {"Data source names are non-empty and unique.", nullptr},            // checked with the list itself
      {"Every source named in `data.schedule` is a source of `data.sources` (or of the embedded corpus: `prose`, "
       "`code`, `arithmetic`, when `data.sources` is empty).",
       check_schedule_names},
  };
  return table;
}

// ---- Features this build does not have yet. Delete a gate when its feature lands. ---------------
// Gates run after every rule, so a config that could never work is told why before it is told to wait.

const std::vector<Rule>& gates() {
  static const std::vector<Rule> table = {};
  return table;
}

}  // namespace moe::config_detail
