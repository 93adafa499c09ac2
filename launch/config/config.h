// The experiment config: one JSON file per experiment, the keys of docs/cli.md plus the project's own.
// Loading validates every key before any work starts: wrong type, out-of-range value, unknown key (with
// the nearest valid key suggested), inconsistent values. Each failure throws moe::Error(BadInput) whose
// message names the dotted key, the value and what is expected. docs/config.md is the full reference and
// is generated from the same schema (config_reference_markdown), so the two cannot drift.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "launch/config/config_choices.h"

namespace moe {

struct TrainConfig {
  int64_t steps = 0;
  uint64_t seed = 0;
  int64_t global_batch = 0;  // sequences per optimizer step
  int64_t micro_batch = 0;   // sequences per micro-batch (= one routing group)
  int64_t seq_len = 0;
  Device device = Device::Cpu;
  GemmPrecision precision = GemmPrecision::Fp32;  // what GEMMs read their operands as
  Recompute recompute = Recompute::None;
  FusedAttention fused_attention = FusedAttention::Deterministic;
  int64_t recompute_layers = -1;  // recompute applies to layers [0, recompute_layers); -1: every layer
  int64_t log_every = 0;
  int64_t eval_every = 0;      // 0: no periodic evaluation (a final one still runs)
  int64_t eval_sequences = 0;  // held-out sequences per data source per evaluation
  int64_t threads = 0;         // 0: cores / ranks on this node
  bool adapt_threads = true;   // fewer threads while other processes take the cores
  bool trace = false;          // RUN_DIR/trace.json for steps [trace_from, trace_from + trace_steps)
  bool tensorboard = true;     // RUN_DIR/tensorboard/: TensorBoard event files of the metrics lines
  int64_t trace_from = 2, trace_steps = 3;
};

struct ModelConfig {
  int64_t vocab = 0;
  int64_t d_model = 0;
  int64_t layers = 0;
  int64_t heads = 0;
  int64_t kv_heads = 0;    // key/value heads (grouped-query attention); model.kv_heads, its 0 read as heads
  int64_t ffn_hidden = 0;  // width of the dense SwiGLU MLP
  AttentionKind attention = AttentionKind::Mha;
  int64_t mla_kv_rank = 0, mla_q_rank = 0, mla_rope_dim = 0;  // model.mla.*
  bool mla_norms = false;                                     // model.mla.norms
};

struct TauPoint {
  int64_t step = 0;
  double tau = 1.0;
};

struct RouterConfig {
  double tau = 1.0;
  std::vector<TauPoint> tau_schedule;  // empty: tau throughout
  bool tau_learned = false;
  double tau_min = 0.1, tau_max = 10.0;
  RouterNoise noise = RouterNoise::None;
  RouterScore score = RouterScore::Softmax;
  bool normalize = true;
  double bias_balance_rate = 0.0;  // moe.router.bias_balance.rate; 0 = off
  BiasRule bias_balance_rule = BiasRule::Sign;
  double bias_balance_decay = 0.99, bias_balance_dead_band = 0.1;
  int64_t warmup_steps = 0;  // moe.router.warmup.*
  double warmup_coef = 0.0;
  bool warmup_freeze_backbone = false;
  // The temperature at `step` optimizer steps done: the schedule's, linear between its points, or tau.
  double tau_at(int64_t step) const;
};

// moe.capacity_auto: the capacity factor follows the overflow ratio (docs/moe.md "Adaptive capacity").
struct CapacityAutoConfig {
  bool enabled = false;
  double min = 1.0, max = 1.8, raise_above = 0.01, lower_below = 0.001, step = 0.1;
  int64_t window = 10;
};

struct MoeLossConfig {
  double aux = 0.0, z = 0.0, entropy = 0.0, death = 0.0, death_floor = 0.01;
};

struct MoeConfig {
  int64_t num_experts = 0;  // 0: every FFN is dense
  int64_t top_k = 1;
  int64_t every = 1;
  int64_t expert_hidden = 0;
  int64_t shared_experts = 0;
  int64_t fallback_hidden = 0;
  RouterConfig router;
  double capacity_factor = 0.0;  // <= 0: no limit
  DropPolicy drop_policy = DropPolicy::Probs;
  DispatcherKind dispatcher = DispatcherKind::AllToAll;
  // Overflow levels in cascade order: one of Drop, Reroute, Dense, or Reroute then Dense or Drop (the rules check).
  std::vector<Overflow> overflow{Overflow::Drop};
  CapacityAutoConfig capacity_auto;
  double expert_dropout = 0.0;
  MoeLossConfig loss;
  bool overflow_has(Overflow level) const;
  // The levels as the MoE layer's one policy: Reroute then Dense is RerouteDense, Reroute then Drop is Reroute.
  Overflow overflow_policy() const;
};

struct OptimConfig {
  double lr = 0, min_lr = 0;
  int64_t warmup = 0;
  double weight_decay = 0, beta1 = 0.9, beta2 = 0.95, eps = 1e-8;
  double clip = 0;             // global grad-norm clip; 0 = off
  double per_expert_clip = 0;  // 0 = off
  // Frequency-aware clipping: the threshold of a hot expert (load above hot_load times its layer's mean) is
  // multiplied by clip_hot, every other's by clip_cold.
  double per_expert_clip_hot = 1.0, per_expert_clip_cold = 1.0, per_expert_clip_hot_load = 1.5;
  bool zero = false;
};

struct ParallelConfig {
  int64_t tp = 1, pp = 1, ep = 1;
  int64_t dp = 0;                  // 0 when "auto": world / (tp * pp), resolved once the world size is known
  bool sequence_parallel = true;   // with tp > 1: norms and the residual stream hold seq_len / tp positions
  int64_t expert_tp = 1;           // 1: experts whole on every tp rank; tp: each expert's hidden width split
  std::vector<int64_t> pp_layers;  // layers per pipeline stage; empty: model.layers split evenly over pp
  int64_t vpp = 1;                 // model chunks per pipeline stage (interleaved: rank p holds c * pp + p)
  PpSchedule pp_schedule = PpSchedule::OneFOneB;
  bool ep_overlap = true;  // with ep > 1: the MoE all-to-all overlaps the shared experts and fallback
};

struct CheckpointConfig {
  std::string dir;         // relative to the run directory unless absolute
  int64_t every = 0;       // 0 = no checkpoints
  int64_t keep = 1;        // complete chains kept
  int64_t full_every = 1;  // a full checkpoint every this many saves, XOR deltas between
  bool async = true;
  std::vector<std::string> replicas;
  bool peer_copy = false;
  bool node_local = false;
};

struct FaultInjection {
  FaultKind kind = FaultKind::Kill;
  int64_t rank = 0;
  int64_t step = 0;  // fires when this step is done
};

struct FaultConfig {
  double heartbeat_interval_s = 0.5;
  double heartbeat_timeout_s = 0;
  double setup_timeout_s = 0, step_timeout_s = 0, eval_timeout_s = 0, checkpoint_timeout_s = 0;
  int64_t max_restarts = 0;
  double restart_backoff_s = 1.0;
  bool shrink = false;
  double term_grace_s = 30;  // after SIGTERM/SIGINT: time a final checkpoint may take
  std::string listen;
  double probe_timeout_s = 15;  // with --hostfile: every host probed within this before each start
  bool probe_peers = true;      // the probe also checks that the hosts reach each other
  std::vector<FaultInjection> inject;
};

// Routing-health alerts and the routing-stability probe (launch/train/routing_health.h).
struct MonitorConfig {
  int64_t window = 100;
  double min_share = 0.03, max_share = 0.5, max_cv = 2.0, max_overflow = 0.01;
  int64_t probe_sequences = 4;
};

struct DataSourceConfig {
  std::string name;
  std::string path;  // a UTF-8/byte text file, tokenized by bytes, or a directory written by moe prep
  double weight = 1.0;
};

// A point of data.schedule: the source weights at `step` (counted as metrics.jsonl counts steps).
struct SchedulePointConfig {
  int64_t step = 1;
  std::vector<std::pair<std::string, double>> weights;  // by source name; unnamed sources weigh 0
};

struct DataConfig {
  std::vector<DataSourceConfig> sources;  // empty: the embedded default corpus
  double heldout_fraction = 0.0;
  std::vector<SchedulePointConfig> schedule;  // empty: the sources' weights throughout
};

struct Config {
  TrainConfig train;
  ModelConfig model;
  MoeConfig moe;
  OptimConfig optim;
  ParallelConfig parallel;
  CheckpointConfig checkpoint;
  FaultConfig fault;
  MonitorConfig monitor;
  DataConfig data;
  nlohmann::json resolved;  // every key with its value (defaults filled in), as written to config.json
};

// Bounds of what is parsed, so a wrong path or a hostile file cannot exhaust memory or the stack: a
// config file (or one --set value) of at most 16 MiB, objects and arrays nested at most 64 deep.
inline constexpr int64_t kMaxConfigBytes = int64_t(16) << 20;
inline constexpr int64_t kMaxConfigDepth = 64;

// Loads `path` (JSON), applies `overrides` ("dotted.key=value", value parsed as JSON when it parses,
// else taken as a string), fills defaults and validates. Throws moe::Error(BadInput) naming the file;
// a path that is not a regular file (a FIFO, a device, a directory) is refused without reading it.
Config load_config(const std::string& path, const std::vector<std::string>& overrides);
// Whether `text` is valid UTF-8: what a run records as JSON (config values, paths, the command line) must be.
bool is_valid_utf8(const std::string& text);
// Refuses (BadInput naming `label`) text that is not valid UTF-8.
void check_utf8(const std::string& text, const std::string& label);
// The same from an already-parsed document (`origin` names it in messages).
Config config_from_json(const nlohmann::json& document, const std::vector<std::string>& overrides,
                        const std::string& origin);
// docs/config.md, generated from the schema.
std::string config_reference_markdown();

}  // namespace moe
