// The table of every config key (launch/config/config_schema.h) and the look-ups in it: a key, a section, a section's
// children, the key nearest to a misspelt one. The check of one value against its key and the key tables of
// docs/config.md live in launch/config/config_schema_values.cpp; the rules between keys, files and --set in
// launch/config/config.cpp and launch/config/config_rules.cpp.
#include "launch/config/config_schema.h"

#include <algorithm>
#include <iterator>
#include <limits>
#include <string>
#include <vector>

#include "launch/config/config_choices.h"
#include "launch/config/config_schema_internal.h"

namespace moe::config_schema {
namespace {

using json = nlohmann::json;
constexpr double kInf = std::numeric_limits<double>::infinity();
using detail::kMaxExperts;
using detail::kMaxInt32;
using detail::kMaxSteps;

Range at_least(double v) { return {v, kInf, false, false}; }
Range above(double v) { return {v, kInf, true, false}; }
Range between(double lo, double hi, bool lo_open, bool hi_open) { return {lo, hi, lo_open, hi_open}; }
Range from_to(double lo, double hi) { return {lo, hi, false, false}; }
Range unbounded() { return {}; }

KeySpec integer(std::string key, int64_t def, Range range, std::string doc) {
  return {std::move(key), KeyType::Integer, def, range, {}, std::move(doc)};
}
KeySpec number(std::string key, double def, Range range, std::string doc) {
  return {std::move(key), KeyType::Number, def, range, {}, std::move(doc)};
}
KeySpec boolean(std::string key, bool def, std::string doc) {
  return {std::move(key), KeyType::Boolean, def, {}, {}, std::move(doc)};
}
// A key whose values are the names of enum E (launch/config/config_choices.h), `def` the default.
template <ConfigChoice E>
KeySpec choice(std::string key, E def, std::string doc) {
  return {std::move(key), KeyType::Choice, to_string(def), {}, choice_names<E>(), std::move(doc)};
}
KeySpec string(std::string key, std::string def, std::string doc) {
  return {std::move(key), KeyType::String, std::move(def), {}, {}, std::move(doc)};
}
KeySpec integer_or_auto(std::string key, std::string def, Range range, std::string doc) {
  return {std::move(key), KeyType::IntegerOrAuto, std::move(def), range, {}, std::move(doc)};
}
KeySpec string_list(std::string key, std::string doc) {
  return {std::move(key), KeyType::StringList, json::array(), {}, {}, std::move(doc)};
}
KeySpec integer_list(std::string key, Range range, std::string doc) {
  return {std::move(key), KeyType::IntegerList, json::array(), range, {}, std::move(doc)};
}
KeySpec faults(std::string key, std::string doc) {
  return {std::move(key), KeyType::Faults, json::array(), {}, choice_names<FaultKind>(), std::move(doc)};
}
template <ConfigChoice E>
KeySpec choice_list(std::string key, E def, std::string doc) {
  return {std::move(key), KeyType::ChoiceList, to_string(def), {}, choice_names<E>(), std::move(doc)};
}
KeySpec tau_schedule(std::string key, Range range, std::string doc) {
  return {std::move(key), KeyType::TauSchedule, json::array(), range, {}, std::move(doc)};
}
KeySpec sources(std::string key, std::string doc) {
  return {std::move(key), KeyType::Sources, json::array(), {}, {}, std::move(doc)};
}
KeySpec schedule(std::string key, std::string doc) {
  return {std::move(key), KeyType::Schedule, json::array(), {}, {}, std::move(doc)};
}

std::vector<KeySpec> train_keys() {
  return {
      integer("train.steps", 300, from_to(1, kMaxSteps),
              "optimizer steps to run; at most 99999999 (checkpoint folders are named step-NNNNNNNN and the newest is "
              "found by name)"),
      integer("train.seed", 1234, at_least(0), "seed of every random stream (init, data order, router noise, dropout)"),
      integer("train.global_batch", 16, at_least(1), "sequences per optimizer step"),
      integer("train.micro_batch", 4, at_least(1),
              "sequences per micro-batch (one routing group); a step accumulates global_batch / micro_batch of them"),
      integer("train.seq_len", 128, at_least(2), "tokens per training sequence"),
      choice("train.device", Device::Cpu,
             "where the model computes: `cpu` (OpenBLAS + OpenMP) or `cuda` (the CUDA backend, docs/gpu.md; one GPU "
             "per rank, each rank on its node's device local_rank mod the devices it sees; every parallel dimension's "
             "backend memory over NCCL)"),
      choice("train.precision", GemmPrecision::Fp32,
             "what GEMMs (projections, experts, head, attention's products) read their operands as: `fp32`, or "
             "`bf16` (each operand rounded to bf16, products summed in fp32: tensor cores on a GPU, emulated on the "
             "CPU); parameters, gradients, AdamW state, activations, the router, norms, softmax and losses stay "
             "fp32 (docs/design.md \"Precision\")"),
      choice("train.recompute", Recompute::None,
             "activation recomputation: `none` keeps activations for backward, `selective` keeps all but the "
             "attention probabilities (recomputed from q and k in backward), `full` keeps each block's input and "
             "recomputes the block"),
      integer("train.recompute_layers", -1, at_least(-1),
              "train.recompute applies to the blocks of index below this, the others keep everything; -1 = every "
              "block; at most model.layers"),
      choice("train.fused_attention", FusedAttention::Deterministic,
             "the fused attention where it runs (train.device = `cuda` with train.precision = `bf16`: cuDNN's "
             "graphs, docs/gpu.md): `deterministic` (dQ written directly, dS held in workspace: a run repeats bit "
             "for bit), `nondeterministic` (dQ accumulated with atomic adds: less workspace, bits vary from run to "
             "run), or `off` (the plain attention everywhere); no effect elsewhere"),
      boolean("train.trace", false,
              "write RUN_DIR/trace.json, a timeline of every rank's forward, backward, communication waits and "
              "optimizer for a few steps, in the Chrome Trace Event format (Perfetto, chrome://tracing)"),
      integer("train.trace_from", 2, from_to(1, kMaxSteps), "the first step the trace records (1-based)"),
      integer("train.trace_steps", 3, from_to(1, 1000), "how many steps the trace records"),
      integer("train.log_every", 10, at_least(1), "write a metrics.jsonl line every this many steps"),
      boolean("train.tensorboard", true,
              "write the metrics lines as TensorBoard event files in RUN_DIR/tensorboard/ (rank 0; docs/metrics.md "
              "\"TensorBoard\")"),
      integer("train.eval_every", 100, at_least(0),
              "evaluate on held-out data every this many steps; 0 = only at the end"),
      integer("train.eval_sequences", 8, at_least(1), "held-out sequences per data source per evaluation"),
      integer("train.threads", 0, from_to(0, kMaxInt32),
              "CPU threads per rank; 0 = the cores the process may use (affinity mask, cgroup quota) divided by the "
              "node's ranks (OpenMP takes a 32-bit count)"),
      boolean("train.adapt_threads", true,
              "CPU backend: after each step, use fewer threads (down to 1) while other processes take this rank's "
              "cores and up to train.threads again when they leave; keeps a busy machine's throughput, and the "
              "run's numbers do not depend on the thread count"),
  };
}

std::vector<KeySpec> model_keys() {
  return {
      integer("model.vocab", 256, from_to(2, kMaxInt32),
              "vocabulary size; at least 256 while tokens are bytes, and tokens are 32-bit integers"),
      integer("model.d_model", 128, at_least(1), "width of the residual stream"),
      integer("model.layers", 4, at_least(1), "transformer blocks"),
      integer("model.heads", 4, at_least(1), "attention heads; d_model / heads must be an even integer"),
      integer("model.kv_heads", 0, at_least(0),
              "key/value heads (grouped-query attention, Ainslie et al. 2023): each group of heads / kv_heads query "
              "heads reads one key and value head, so Wk and Wv have kv_heads * d_model / heads columns; a divisor "
              "of model.heads and, with parallel.tp > 1, a multiple of parallel.tp; 0 (the default): model.heads "
              "(multi-head attention); model.attention = mla takes only 0 or model.heads"),
      integer("model.ffn_hidden", 384, at_least(1), "hidden width of the dense SwiGLU MLP"),
      choice("model.attention", AttentionKind::Mha,
             "attention of every block: `mha` multi-head attention, `mla` multi-head latent attention (DeepSeek-V2: "
             "keys and values from a shared low-rank latent, queries from another, and a decoupled rotary part; "
             "docs/model.md); `mla` needs parallel.tp = 1"),
      integer("model.mla.kv_rank", 32, at_least(1), "with model.attention = mla: width of the key/value latent c_kv"),
      integer("model.mla.q_rank", 64, at_least(0),
              "with model.attention = mla: width of the query latent c_q; 0: no query latent, the queries projected "
              "from the block's input directly (DeepSeek-V2-Lite's q_lora_rank null)"),
      integer("model.mla.rope_dim", 16, at_least(2),
              "with model.attention = mla: width of each head's rotary part of queries and keys (the key's is shared "
              "by the heads); even"),
      boolean("model.mla.norms", false,
              "with model.attention = mla: RMSNorms with gains (epsilon 1e-6) on the latents c_q and c_kv, as "
              "DeepSeek-V3's q_a_layernorm and kv_a_layernorm (docs/model.md; c_kv's alone when model.mla.q_rank "
              "= 0); false: the latents as projected"),
  };
}

std::vector<KeySpec> moe_keys() {
  return {
      integer("moe.num_experts", 0, from_to(0, kMaxExperts),
              "routed experts per MoE layer; 0 = every FFN is dense; at most 1024 (the router's per-token score "
              "buffer)"),
      integer("moe.top_k", 2, from_to(1, kMaxExperts), "experts each token is routed to; at most moe.num_experts"),
      integer("moe.every", 1, at_least(1),
              "every this-many-th block has an MoE FFN instead of the dense MLP (1 = all)"),
      integer("moe.expert_hidden", 128, at_least(1), "hidden width of each expert's SwiGLU MLP"),
      integer("moe.shared_experts", 0, at_least(0), "experts every token passes through besides its routed ones"),
      integer("moe.fallback_hidden", 64, at_least(1), "hidden width of the dense MLP that `moe.overflow = dense` uses"),
      number("moe.router.tau", 1.0, above(0),
             "router temperature: logits are divided by it before scoring (the starting value when learned)"),
      tau_schedule(
          "moe.router.tau_schedule", above(0),
          "temperature schedule: a list of {\"step\": integer >= 0, \"tau\": number > 0} with increasing "
          "steps, "
          "linear between them and constant outside (step: optimizer steps done); `[]` = moe.router.tau throughout"),
      boolean("moe.router.tau_learned", false,
              "learn each MoE layer's temperature with the router: tau = moe.router.tau * exp(r), r a parameter "
              "(layers.<l>.ffn.tau.log_ratio) clamped so that tau stays in [tau_min, tau_max]"),
      number("moe.router.tau_min", 0.1, above(0), "lowest learned temperature"),
      number("moe.router.tau_max", 10.0, above(0), "highest learned temperature"),
      integer("moe.router.warmup.steps", 0, at_least(0),
              "router warm-up: for the first this-many steps the loss gains coef * KL(uniform || P), P the routing "
              "group's mean router probabilities (normalised), so experts start balanced; 0 = off"),
      number("moe.router.warmup.coef", 0.1, at_least(0), "weight of the router warm-up term"),
      boolean("moe.router.warmup.freeze_backbone", false,
              "during the router warm-up only the routers learn: every other parameter keeps its value"),
      choice("moe.router.noise", RouterNoise::None, "noise added to the router logits in training"),
      choice("moe.router.score", RouterScore::Softmax, "how router logits become scores"),
      boolean("moe.router.normalize", true, "rescale each token's top-k scores to sum to 1"),
      number("moe.router.bias_balance.rate", 0.0, at_least(0),
             "step size of the loss-free balancing bias on router scores; 0 = off"),
      choice("moe.router.bias_balance.rule", BiasRule::Sign,
             "bias update after each step from the loads c_e (mean m): `sign` b += rate * sign(m - c_e); "
             "`proportional` b = decay * b + rate * (m / c_e - 1), 0 inside the dead band (docs/moe.md)"),
      number("moe.router.bias_balance.decay", 0.99, between(0, 1, true, false),
             "with rule = proportional: the bias decays by this factor each step"),
      number("moe.router.bias_balance.dead_band", 0.1, at_least(0),
             "with rule = proportional: no push while |m / c_e - 1| is at most this"),
      number("moe.capacity_factor", 1.25, unbounded(),
             "expert capacity = factor * tokens * top_k / experts per routing group; <= 0 = no limit"),
      choice("moe.drop_policy", DropPolicy::Probs,
             "which assignments a full expert keeps: highest score (`probs`) or earliest token (`position`)"),
      choice("moe.dispatcher", DispatcherKind::AllToAll,
             "how rows reach the experts' ranks with parallel.ep > 1: `alltoall` sends each rank only the rows for its "
             "experts; `allgather` gathers every rank's rows and keeps those for its experts, combining back by a "
             "reduce-scatter (ep times the traffic, collectives only). The results are the same bit for bit "
             "(docs/parallel.md \"Dispatchers\")"),
      choice_list("moe.overflow", Overflow::Drop,
                  "an assignment over capacity is dropped, rerouted to the next expert with room, or sent to the "
                  "dense fallback MLP; a list is a cascade: `[\"reroute\", \"dense\"]` reroutes, and what finds no "
                  "room goes to the fallback"),
      boolean("moe.capacity_auto.enabled", false,
              "adaptive capacity: after each step, each MoE layer's capacity factor (starting at "
              "moe.capacity_factor, which must be > 0) rises by `step` when its overflow ratio stayed above "
              "`raise_above` for `window` steps, and falls by `step` when it stayed below `lower_below` as long, "
              "within [min, max]"),
      number("moe.capacity_auto.min", 1.0, above(0), "lowest adaptive capacity factor"),
      number("moe.capacity_auto.max", 1.8, above(0), "highest adaptive capacity factor"),
      number("moe.capacity_auto.raise_above", 0.01, from_to(0, 1),
             "overflow ratio (overflowed / routed assignments of a step) above which the factor is raised"),
      number("moe.capacity_auto.lower_below", 0.001, from_to(0, 1),
             "overflow ratio below which the factor is lowered; below raise_above"),
      integer("moe.capacity_auto.window", 10, from_to(1, kMaxSteps), "consecutive steps before a change"),
      number("moe.capacity_auto.step", 0.1, above(0), "change of the factor at each adjustment"),
      number("moe.expert_dropout", 0.0, between(0, 1, false, true),
             "probability that a routed expert is masked for a whole training step (whole-expert dropout, drawn per "
             "step and expert); its tokens go to their best unmasked experts"),
      number("moe.loss.aux", 0.01, at_least(0), "weight of the load-balancing loss"),
      number("moe.loss.z", 0.001, at_least(0), "weight of the router z-loss"),
      number("moe.loss.entropy", 0.0, unbounded(),
             "weight c of the term -c * H, H the mean per-token routing entropy: > 0 spreads routing (raises H), "
             "< 0 sharpens it"),
      number("moe.loss.death", 0.0, at_least(0),
             "weight of the penalty sum_e max(0, death_floor - P_e) on experts whose mean router probability P_e "
             "falls below moe.loss.death_floor"),
      number("moe.loss.death_floor", 0.01, between(0, 1, false, false),
             "mean router probability (over a routing group's tokens) under which an expert is dying"),
  };
}

std::vector<KeySpec> optim_keys() {
  return {
      number("optim.lr", 3e-3, above(0), "peak learning rate, reached at the end of warmup"),
      number("optim.min_lr", 3e-4, at_least(0), "learning rate at the last step; at most optim.lr"),
      integer("optim.warmup", 20, at_least(0), "steps of linear learning-rate warmup"),
      number("optim.weight_decay", 0.1, at_least(0), "AdamW decoupled weight decay on the decayed tensors"),
      number("optim.beta1", 0.9, between(0, 1, false, true), "AdamW first-moment decay"),
      number("optim.beta2", 0.95, between(0, 1, false, true), "AdamW second-moment decay"),
      number("optim.eps", 1e-8, above(0), "AdamW denominator epsilon"),
      number("optim.clip", 1.0, at_least(0), "clip the global gradient norm to this; 0 = off"),
      number("optim.per_expert_clip", 0.0, at_least(0),
             "clip each expert's gradient norm to this times the moving average of its past norms; 0 = off"),
      number("optim.per_expert_clip_hot", 1.0, above(0),
             "frequency-aware clipping: a hot expert's per-expert threshold is multiplied by this (e.g. 0.5)"),
      number("optim.per_expert_clip_cold", 1.0, above(0),
             "frequency-aware clipping: every other expert's threshold is multiplied by this"),
      number("optim.per_expert_clip_hot_load", 1.5, above(0),
             "an expert is hot in a step when it processed more than this times its layer's mean load"),
      boolean("optim.zero", false, "shard the optimizer state over data-parallel ranks (ZeRO-1)"),
  };
}

std::vector<KeySpec> parallel_keys() {
  return {
      integer("parallel.tp", 1, at_least(1),
              "tensor-parallel ranks: attention heads, the dense MLP's hidden width and the vocabulary are split over "
              "them"),
      integer("parallel.pp", 1, at_least(1), "pipeline stages: each rank holds a contiguous run of layers"),
      integer_list("parallel.pp_layers", at_least(1),
                   "layers of each pipeline stage, first to last: parallel.pp entries summing to model.layers; "
                   "empty = model.layers split evenly over the stages"),
      integer("parallel.vpp", 1, at_least(1),
              "model chunks per pipeline stage (virtual pipeline stages, Megatron's interleaved layout): with "
              "parallel.pp = P and vpp = V the layers fall into P * V equal blocks and rank p holds blocks c * P + p "
              "for c = 0..V-1; V > 1 needs parallel.pp >= 2 and parallel.pp_schedule = interleaved_1f1b"),
      choice("parallel.pp_schedule", PpSchedule::OneFOneB,
             "the pipeline schedule: 1f1b (one forward, one backward; one chunk per stage) or interleaved_1f1b "
             "(parallel.vpp > 1 chunks per stage; the micro-batches per data-parallel rank a multiple of "
             "parallel.pp)"),
      integer("parallel.ep", 1, at_least(1), "expert-parallel ranks: the experts are split over them"),
      integer_or_auto("parallel.dp", "auto", at_least(1),
                      "data-parallel replicas; `\"auto\"` = world size / (tp * pp)"),
      boolean("parallel.sequence_parallel", true,
              "with parallel.tp > 1: the residual stream and the norms hold train.seq_len / tp positions of each "
              "sequence on every tensor-parallel rank (Megatron's sequence parallelism; train.seq_len must be a "
              "multiple of tp); no effect when tp = 1"),
      integer("parallel.expert_tp", 1, at_least(1),
              "tensor-parallel ranks inside each routed expert: 1 = every expert whole on each tensor-parallel rank "
              "(decoupled expert tensor parallelism), parallel.tp = each expert's hidden width split over the "
              "tensor-parallel group; no other value"),
      boolean(
          "parallel.ep_overlap", true,
          "with parallel.ep > 1: each MoE layer's all-to-all travels while work that does not need it computes "
          "(the shared experts beside the counts and the backward's dispatch, the dense fallback beside the combine; "
          "docs/parallel.md \"Expert all-to-all overlap\"); false: each exchange blocks first. The results are the "
          "same bit for bit"),
  };
}

std::vector<KeySpec> checkpoint_keys() {
  return {
      string("checkpoint.dir", "checkpoints", "checkpoint folder, relative to the run directory"),
      integer("checkpoint.every", 0, at_least(0), "write a checkpoint every this many steps; 0 = off"),
      integer("checkpoint.keep", 2, at_least(1),
              "newest complete chains (a full checkpoint and its deltas) kept; older ones are deleted"),
      integer("checkpoint.full_every", 4, at_least(1),
              "a full checkpoint every this many saves; the saves between hold only what changed (XOR deltas)"),
      boolean("checkpoint.async", true, "write checkpoints from a background thread while training goes on"),
      string_list("checkpoint.replicas",
                  "further checkpoint roots that receive a full copy of every checkpoint (e.g. another disk)"),
      boolean("checkpoint.peer_copy", false,
              "each rank's shard is also kept by a rank on another host (on one host: the next rank)"),
      boolean("checkpoint.node_local", false,
              "checkpoint.dir is on each host's own disk (`{node}` in it is replaced by the host's number): every "
              "host commits the manifest, and restoring fetches ranges from the hosts that hold them"),
  };
}

std::vector<KeySpec> fault_keys() {
  return {
      number("fault.heartbeat_interval_s", 0.5, from_to(0.001, 60),
             "seconds between two heartbeats of a rank; below fault.heartbeat_timeout_s, and at most 60 because a rank "
             "waits up to one interval for its heartbeat thread when it ends"),
      number("fault.heartbeat_timeout_s", 30.0, above(0),
             "seconds without a heartbeat from a rank (a dead or stopped process) before the supervisor restarts"),
      number("fault.setup_timeout_s", 300.0, above(0),
             "longest start-up (including checkpoint load) before it counts as hung"),
      number("fault.step_timeout_s", 300.0, above(0),
             "longest training step (forward, backward, communication, update) before it counts as hung"),
      number("fault.eval_timeout_s", 300.0, above(0), "longest evaluation before it counts as hung"),
      number("fault.checkpoint_timeout_s", 600.0, above(0), "longest checkpoint save before it counts as hung"),
      integer("fault.max_restarts", 3, at_least(0), "restarts before the supervisor gives up (exit 3)"),
      number("fault.restart_backoff_s", 1.0, at_least(0),
             "seconds before the first restart; doubled at each further restart (at most 60)"),
      boolean("fault.shrink", false,
              "with --hostfile: after a host fails twice, restart without it at a smaller data-parallel size"),
      number("fault.term_grace_s", 30.0, at_least(0),
             "after SIGTERM or SIGINT the step in progress finishes and a checkpoint of it is written when the "
             "last save took less than this many seconds (0: never); then the run exits 143 (SIGTERM), 130 (SIGINT) or "
             "138 (SIGUSR1)"),
      string("fault.listen", "auto",
             "address the supervisor's heartbeat listener binds to; \"auto\": loopback without remote hosts, else the "
             "address of this machine that the route to the --hostfile hosts leaves from"),
      number("fault.probe_timeout_s", 15.0, above(0),
             "with --hostfile: before every start and restart each host is probed (reachable, starts a process, has "
             "the program and disk space) within this many seconds; a host that fails is left out"),
      boolean("fault.probe_peers", true,
              "the probe also has each host open a TCP connection to every other (port 22, ssh's; refused counts as "
              "reached), so that a partition between hosts is found; off where that port is silently dropped"),
      faults("fault.inject",
             "faults to inject for tests and demonstrations: a list of {\"kind\": kill|hang|stop|exception|"
             "corrupt_checkpoint|freeze_alltoall|mismatch_alltoall, \"rank\": int, \"step\": int}; each fires once "
             "in a run's life (the last two at the rank's first ep all-to-all after the step)"),
  };
}

std::vector<KeySpec> monitor_keys() {
  return {
      integer("monitor.window", 100, from_to(1, kMaxSteps),
              "steps a routing-health condition must hold, at every logged step, before its alert fires"),
      number("monitor.min_share", 0.03, from_to(0, 1),
             "alert when an expert's share of its layer's assignments stays below this (capped at half the uniform "
             "share, 0.5 / moe.num_experts, so that a balanced layer of many experts does not alert; 0: off)"),
      number("monitor.max_share", 0.5, from_to(0, 1),
             "alert when an expert's share of its layer's assignments stays above this (raised to 2 / "
             "moe.num_experts when that is larger; 1: off)"),
      number("monitor.max_cv", 2.0, at_least(0),
             "alert when a layer's cv (std / mean of tokens_per_expert) stays above this (0: off)"),
      number("monitor.max_overflow", 0.01, from_to(0, 1),
             "alert when a layer's overflow_ratio (assignments over capacity / all) stays above this (1: off)"),
      integer("monitor.probe_sequences", 4, from_to(0, 4096),
              "held-out sequences of the first source routed at every logged step to measure routing stability "
              "(at most train.micro_batch are used; 0: off)"),
  };
}

std::vector<KeySpec> data_keys() {
  return {
      sources("data.sources", "training text sources (see above); `[]` = the embedded default corpus"),
      number("data.heldout_fraction", 0.05, between(0, 0.5, true, false),
             "fraction of each source held out for evaluation"),
      schedule("data.schedule",
               "mixing schedule: a list of {\"step\": integer >= 1, \"weights\": {source name: number >= 0}} with "
               "increasing steps; the source weights at a step are interpolated linearly between the points around "
               "it (the first point's before it, the last's after it) and replace data.sources[].weight; a source a "
               "point does not name has weight 0 there; `[]` = the sources' own weights throughout (docs/data.md "
               "\"Mixing schedule\")"),
  };
}

std::vector<KeySpec> build_schema() {
  // Defaults describe a small CPU model that trains in minutes on the embedded corpus.
  std::vector<KeySpec> all;
  for (std::vector<KeySpec> part : {train_keys(), model_keys(), moe_keys(), optim_keys(), parallel_keys(),
                                    checkpoint_keys(), fault_keys(), monitor_keys(), data_keys()})
    all.insert(all.end(), std::make_move_iterator(part.begin()), std::make_move_iterator(part.end()));
  return all;
}

std::string last_component(const std::string& key) { return key.substr(key.rfind('.') + 1); }

}  // namespace

const std::vector<KeySpec>& schema() {
  static const std::vector<KeySpec> table = build_schema();
  return table;
}

const std::vector<SectionSpec>& sections() {
  static const std::vector<SectionSpec> table = {
      {"train", "The run: its length, batch shape, logging and evaluation."},
      {"model", "The transformer's shape (pre-norm blocks, rotary attention, SwiGLU MLPs)."},
      {"moe", "Mixture-of-experts layers: the experts, the router, capacity and the routing losses."},
      {"optim", "AdamW with linear warmup and decay to `min_lr`; gradient clipping."},
      {"parallel", "How the ranks are split; world size = dp * tp * pp."},
      {"checkpoint", "Checkpoints of the run directory, which `--resume auto` continues from."},
      {"fault", "The supervisor (`moe launch`): failure detection and restarts."},
      {"monitor",
       "Routing-health alerts (docs/metrics.md \"Routing health\"): each fires once when its condition has held for "
       "`monitor.window` steps, is printed and logged in metrics.jsonl `alerts`, and may fire again after the "
       "condition has stopped holding. Thresholds from the seed articles: activation share above 3%, skewness "
       "(here cv) above 2.0, overflow above 1%."},
      {"data",
       "Training text. Each source is an object `{\"name\": ..., \"path\": ..., \"weight\": ...}`: `name` a non-empty "
       "string unique among the sources (it labels `eval_loss_by_source`), `path` a text file tokenized by bytes or a "
       "directory written by `moe prep` (its source of that name, read from its shards as needed), `weight` its "
       "sampling weight, a number > 0 (default 1)."},
  };
  return table;
}

const KeySpec* find_key(const std::string& key) {
  for (const KeySpec& spec : schema())
    if (spec.key == key) return &spec;
  return nullptr;
}

bool is_section(const std::string& path) {
  if (path.empty()) return false;
  for (const KeySpec& spec : schema())
    if (spec.key.size() > path.size() && spec.key.compare(0, path.size(), path) == 0 && spec.key[path.size()] == '.')
      return true;
  return false;
}

std::vector<std::string> section_children(const std::string& section) {
  const std::string prefix = section.empty() ? "" : section + ".";
  std::vector<std::string> children;
  for (const KeySpec& spec : schema()) {
    if (spec.key.compare(0, prefix.size(), prefix) != 0) continue;
    const std::string rest = spec.key.substr(prefix.size());
    const std::string child = rest.substr(0, rest.find('.'));
    if (std::find(children.begin(), children.end(), child) == children.end()) children.push_back(child);
  }
  return children;
}

size_t edit_distance(const std::string& a, const std::string& b) {
  // Levenshtein with adjacent transpositions ("trian" -> "train" is one edit): the typo people make.
  std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (size_t i = 1; i <= a.size(); ++i)
    for (size_t j = 1; j <= b.size(); ++j) {
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  return d[a.size()][b.size()];
}

std::string nearest_key(const std::string& unknown) {
  std::vector<std::string> candidates;
  for (const KeySpec& spec : schema()) candidates.push_back(spec.key);
  for (const KeySpec& spec : schema())
    for (size_t dot = spec.key.find('.'); dot != std::string::npos; dot = spec.key.find('.', dot + 1))
      candidates.push_back(spec.key.substr(0, dot));
  // A key written in the wrong section ("steps" at the top, "moe.tau") keeps its own name: that beats
  // any spelling distance.
  for (const std::string& c : candidates)
    if (c != unknown && last_component(c) == last_component(unknown)) return c;
  std::string best;
  size_t best_distance = std::numeric_limits<size_t>::max();
  for (const std::string& c : candidates) {
    const size_t d = edit_distance(unknown, c);
    if (d < best_distance) best = c, best_distance = d;
  }
  // Farther than this, a suggestion is noise; the caller lists the section's keys instead.
  return best_distance <= std::max<size_t>(1, unknown.size() / 3) ? best : "";
}

}  // namespace moe::config_schema
