// The typed config (launch/config/config.h) from the complete entries (launch/config/config_internal.h): one function
// per section, in the schema's order, reading every key once so a schema key never wired to a field is caught at the
// first load, and `resolved`, the whole config as nested JSON. The values were checked one by one before
// (launch/config/config_schema.h); the rules between keys come after (launch/config/config_rules.cpp).
#include <algorithm>
#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "core/error.h"
#include "launch/config/config_internal.h"

namespace moe::config_detail {
namespace {

// "moe.router.tau" -> /moe/router/tau, so `resolved` nests objects instead of keeping dotted names.
json::json_pointer json_pointer_of(const std::string& key) {
  std::string pointer = "/" + key;
  std::replace(pointer.begin(), pointer.end(), '.', '/');
  return json::json_pointer(pointer);
}

// Reads the complete (defaults filled) entries into the typed structs, counting the keys read so a schema
// key that is never wired to a field is caught at the first load.
class FieldReader {
 public:
  explicit FieldReader(const Entries& entries) : entries_(entries) {}
  int64_t integer(const std::string& key) { return at(key).get<int64_t>(); }
  double number(const std::string& key) { return at(key).get<double>(); }
  bool boolean(const std::string& key) { return at(key).get<bool>(); }
  std::string string(const std::string& key) { return at(key).get<std::string>(); }
  // A Choice key's value as its enum (launch/config/config_choices.h).
  template <ConfigChoice E>
  E choice(const std::string& key) {
    return choice_from_string<E>(string(key));
  }
  const json& at(const std::string& key) {
    read_.insert(key);
    return entries_.at(key).value;
  }
  size_t keys_read() const { return read_.size(); }

 private:
  const Entries& entries_;
  std::set<std::string> read_;
};

// One section of the config each, in the schema's order (launch/config/config_schema.cpp).
void fill_train(FieldReader& r, Config& c) {
  c.train.steps = r.integer("train.steps");
  c.train.seed = uint64_t(r.integer("train.seed"));
  c.train.global_batch = r.integer("train.global_batch");
  c.train.micro_batch = r.integer("train.micro_batch");
  c.train.seq_len = r.integer("train.seq_len");
  c.train.device = r.choice<Device>("train.device");
  c.train.precision = r.choice<GemmPrecision>("train.precision");
  c.train.recompute = r.choice<Recompute>("train.recompute");
  c.train.recompute_layers = r.integer("train.recompute_layers");
  c.train.fused_attention = r.choice<FusedAttention>("train.fused_attention");
  c.train.trace = r.boolean("train.trace");
  c.train.trace_from = r.integer("train.trace_from");
  c.train.trace_steps = r.integer("train.trace_steps");
  c.train.log_every = r.integer("train.log_every");
  c.train.eval_every = r.integer("train.eval_every");
  c.train.eval_sequences = r.integer("train.eval_sequences");
  c.train.threads = r.integer("train.threads");
  c.train.adapt_threads = r.boolean("train.adapt_threads");
  c.train.tensorboard = r.boolean("train.tensorboard");
}

void fill_model(FieldReader& r, Config& c) {
  c.model.vocab = r.integer("model.vocab");
  c.model.d_model = r.integer("model.d_model");
  c.model.layers = r.integer("model.layers");
  c.model.heads = r.integer("model.heads");
  c.model.kv_heads = r.integer("model.kv_heads");
  if (c.model.kv_heads == 0) c.model.kv_heads = c.model.heads;
  c.model.ffn_hidden = r.integer("model.ffn_hidden");
  c.model.attention = r.choice<AttentionKind>("model.attention");
  c.model.mla_kv_rank = r.integer("model.mla.kv_rank");
  c.model.mla_q_rank = r.integer("model.mla.q_rank");
  c.model.mla_rope_dim = r.integer("model.mla.rope_dim");
  c.model.mla_norms = r.boolean("model.mla.norms");
}

void fill_router(FieldReader& r, Config& c) {
  c.moe.router.tau = r.number("moe.router.tau");
  for (const json& point : r.at("moe.router.tau_schedule"))
    c.moe.router.tau_schedule.push_back({point.at("step").get<int64_t>(), point.at("tau").get<double>()});
  c.moe.router.tau_learned = r.boolean("moe.router.tau_learned");
  c.moe.router.tau_min = r.number("moe.router.tau_min");
  c.moe.router.tau_max = r.number("moe.router.tau_max");
  c.moe.router.warmup_steps = r.integer("moe.router.warmup.steps");
  c.moe.router.warmup_coef = r.number("moe.router.warmup.coef");
  c.moe.router.warmup_freeze_backbone = r.boolean("moe.router.warmup.freeze_backbone");
  c.moe.router.noise = r.choice<RouterNoise>("moe.router.noise");
  c.moe.router.score = r.choice<RouterScore>("moe.router.score");
  c.moe.router.normalize = r.boolean("moe.router.normalize");
  c.moe.router.bias_balance_rate = r.number("moe.router.bias_balance.rate");
  c.moe.router.bias_balance_rule = r.choice<BiasRule>("moe.router.bias_balance.rule");
  c.moe.router.bias_balance_decay = r.number("moe.router.bias_balance.decay");
  c.moe.router.bias_balance_dead_band = r.number("moe.router.bias_balance.dead_band");
}

void fill_moe(FieldReader& r, Config& c) {
  c.moe.num_experts = r.integer("moe.num_experts");
  c.moe.top_k = r.integer("moe.top_k");
  c.moe.every = r.integer("moe.every");
  c.moe.expert_hidden = r.integer("moe.expert_hidden");
  c.moe.shared_experts = r.integer("moe.shared_experts");
  c.moe.fallback_hidden = r.integer("moe.fallback_hidden");
  c.moe.capacity_factor = r.number("moe.capacity_factor");
  c.moe.drop_policy = r.choice<DropPolicy>("moe.drop_policy");
  c.moe.dispatcher = r.choice<DispatcherKind>("moe.dispatcher");
  const json& overflow = r.at("moe.overflow");
  c.moe.overflow.clear();
  for (const json& level : overflow.is_string() ? json::array({overflow}) : overflow)
    c.moe.overflow.push_back(choice_from_string<Overflow>(level.get<std::string>()));
  c.moe.capacity_auto.enabled = r.boolean("moe.capacity_auto.enabled");
  c.moe.capacity_auto.min = r.number("moe.capacity_auto.min");
  c.moe.capacity_auto.max = r.number("moe.capacity_auto.max");
  c.moe.capacity_auto.raise_above = r.number("moe.capacity_auto.raise_above");
  c.moe.capacity_auto.lower_below = r.number("moe.capacity_auto.lower_below");
  c.moe.capacity_auto.window = r.integer("moe.capacity_auto.window");
  c.moe.capacity_auto.step = r.number("moe.capacity_auto.step");
  c.moe.expert_dropout = r.number("moe.expert_dropout");
  c.moe.loss.aux = r.number("moe.loss.aux");
  c.moe.loss.z = r.number("moe.loss.z");
  c.moe.loss.entropy = r.number("moe.loss.entropy");
  c.moe.loss.death = r.number("moe.loss.death");
  c.moe.loss.death_floor = r.number("moe.loss.death_floor");
}

void fill_optim(FieldReader& r, Config& c) {
  c.optim.lr = r.number("optim.lr");
  c.optim.min_lr = r.number("optim.min_lr");
  c.optim.warmup = r.integer("optim.warmup");
  c.optim.weight_decay = r.number("optim.weight_decay");
  c.optim.beta1 = r.number("optim.beta1");
  c.optim.beta2 = r.number("optim.beta2");
  c.optim.eps = r.number("optim.eps");
  c.optim.clip = r.number("optim.clip");
  c.optim.per_expert_clip = r.number("optim.per_expert_clip");
  c.optim.per_expert_clip_hot = r.number("optim.per_expert_clip_hot");
  c.optim.per_expert_clip_cold = r.number("optim.per_expert_clip_cold");
  c.optim.per_expert_clip_hot_load = r.number("optim.per_expert_clip_hot_load");
  c.optim.zero = r.boolean("optim.zero");
}

void fill_parallel(FieldReader& r, Config& c) {
  c.parallel.tp = r.integer("parallel.tp");
  c.parallel.pp = r.integer("parallel.pp");
  c.parallel.ep = r.integer("parallel.ep");
  const json& dp = r.at("parallel.dp");
  c.parallel.dp = dp.is_string() ? 0 : dp.get<int64_t>();  // "auto" waits for the world size
  c.parallel.sequence_parallel = r.boolean("parallel.sequence_parallel");
  c.parallel.expert_tp = r.integer("parallel.expert_tp");
  c.parallel.pp_layers = r.at("parallel.pp_layers").get<std::vector<int64_t>>();
  c.parallel.vpp = r.integer("parallel.vpp");
  c.parallel.pp_schedule = r.choice<PpSchedule>("parallel.pp_schedule");
  c.parallel.ep_overlap = r.boolean("parallel.ep_overlap");
}

void fill_checkpoint(FieldReader& r, Config& c) {
  c.checkpoint.dir = r.string("checkpoint.dir");
  c.checkpoint.every = r.integer("checkpoint.every");
  c.checkpoint.keep = r.integer("checkpoint.keep");
  c.checkpoint.full_every = r.integer("checkpoint.full_every");
  c.checkpoint.async = r.boolean("checkpoint.async");
  c.checkpoint.replicas = r.at("checkpoint.replicas").get<std::vector<std::string>>();
  c.checkpoint.peer_copy = r.boolean("checkpoint.peer_copy");
  c.checkpoint.node_local = r.boolean("checkpoint.node_local");
}

void fill_fault(FieldReader& r, Config& c) {
  c.fault.heartbeat_interval_s = r.number("fault.heartbeat_interval_s");
  c.fault.heartbeat_timeout_s = r.number("fault.heartbeat_timeout_s");
  c.fault.setup_timeout_s = r.number("fault.setup_timeout_s");
  c.fault.step_timeout_s = r.number("fault.step_timeout_s");
  c.fault.eval_timeout_s = r.number("fault.eval_timeout_s");
  c.fault.checkpoint_timeout_s = r.number("fault.checkpoint_timeout_s");
  c.fault.max_restarts = r.integer("fault.max_restarts");
  c.fault.restart_backoff_s = r.number("fault.restart_backoff_s");
  c.fault.shrink = r.boolean("fault.shrink");
  c.fault.term_grace_s = r.number("fault.term_grace_s");
  c.fault.listen = r.string("fault.listen");
  c.fault.probe_timeout_s = r.number("fault.probe_timeout_s");
  c.fault.probe_peers = r.boolean("fault.probe_peers");
  for (const json& f : r.at("fault.inject"))
    c.fault.inject.push_back({choice_from_string<FaultKind>(f["kind"].get<std::string>()), f["rank"].get<int64_t>(),
                              f["step"].get<int64_t>()});
}

void fill_monitor(FieldReader& r, Config& c) {
  c.monitor.window = r.integer("monitor.window");
  c.monitor.min_share = r.number("monitor.min_share");
  c.monitor.max_share = r.number("monitor.max_share");
  c.monitor.max_cv = r.number("monitor.max_cv");
  c.monitor.max_overflow = r.number("monitor.max_overflow");
  c.monitor.probe_sequences = r.integer("monitor.probe_sequences");
}

void fill_data(FieldReader& r, Config& c) {
  for (const json& source : r.at("data.sources"))
    c.data.sources.push_back({source.at("name").get<std::string>(), source.at("path").get<std::string>(),
                              source.at("weight").get<double>()});
  c.data.heldout_fraction = r.number("data.heldout_fraction");
  for (const json& point : r.at("data.schedule")) {
    SchedulePointConfig p{point.at("step").get<int64_t>(), {}};
    for (const auto& [name, weight] : point.at("weights").items()) p.weights.emplace_back(name, weight.get<double>());
    c.data.schedule.push_back(std::move(p));
  }
}

}  // namespace

Config fill(const Entries& entries) {
  FieldReader r(entries);
  Config c;
  for (auto section : {fill_train, fill_model, fill_router, fill_moe, fill_optim, fill_parallel, fill_checkpoint,
                       fill_fault, fill_monitor, fill_data})
    section(r, c);
  MOE_CHECK(r.keys_read() == config_schema::schema().size(),
            "config fill() reads " << r.keys_read() << " keys, the schema has " << config_schema::schema().size());
  for (const auto& [key, entry] : entries) c.resolved[json_pointer_of(key)] = entry.value;
  return c;
}

}  // namespace moe::config_detail
