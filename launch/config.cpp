// Loads the experiment config (launch/config.h): reads the JSON file, walks it and the --set overrides
// against the schema (launch/config_schema.h), fills defaults, checks the rules between keys and the
// features this build does not have yet, and renders docs/config.md. It resolves nothing that needs the
// world size (parallel.dp = "auto" stays 0) and opens no data file: the trainer and data module do.
#include "launch/config.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <set>
#include <sstream>

#include "core/error.h"
#include "launch/config_schema.h"

namespace moe {
namespace {

using json = nlohmann::json;
using config_schema::KeySpec;

// One key's value and where it came from: a file path, "--set KEY=VALUE" or "default".
struct Entry {
  json value;
  std::string origin;
};
using Entries = std::map<std::string, Entry>;

std::string join(const std::vector<std::string>& items) {
  std::string out;
  for (const std::string& item : items) out += (out.empty() ? "" : ", ") + item;
  return out;
}

// "train.steps[0][0]...": a path into the document, shortened for messages.
std::string short_path(const std::string& path) {
  constexpr size_t kMaxChars = 60;
  if (path.empty()) return "the top level";
  return "'" + (path.size() > kMaxChars ? path.substr(0, kMaxChars) + "..." : path) + "'";
}

[[noreturn]] void too_deep(const std::string& origin, const std::string& where) {
  MOE_BAD_INPUT(origin << " nests objects and arrays more than " << kMaxConfigDepth << " levels deep (at "
                       << short_path(where) << "), the limit; a config needs at most 4: check the JSON");
}

[[noreturn]] void unknown_key(const std::string& key, const std::string& origin) {
  const std::string suggestion = config_schema::nearest_key(key);
  if (!suggestion.empty())
    MOE_BAD_INPUT("unknown key '" << key << "' in " << origin << "; did you mean '" << suggestion << "'?");
  // Nothing close: list what the innermost valid section does have.
  std::string section = key.substr(0, key.rfind('.') == std::string::npos ? 0 : key.rfind('.'));
  while (!section.empty() && !config_schema::is_section(section))
    section = section.substr(0, section.rfind('.') == std::string::npos ? 0 : section.rfind('.'));
  MOE_BAD_INPUT("unknown key '" << key << "' in " << origin << "; "
                                << (section.empty() ? "the sections are " : "the keys of '" + section + "' are ")
                                << join(config_schema::section_children(section)));
}

// Records every key of `object` (the contents of `section`, "" = the whole document) into `entries`.
void walk(const json& object, const std::string& section, const std::string& origin, Entries& entries) {
  for (const auto& [name, value] : object.items()) {
    const std::string key = section.empty() ? name : section + "." + name;
    if (name.empty() || name.find('.') != std::string::npos)
      MOE_BAD_INPUT("key '" << key << "' in " << origin
                            << ": names may not be empty or contain '.'; write nested objects, e.g. "
                               "{\"train\": {\"steps\": 5}}, or use --set for dotted keys");
    if (const KeySpec* spec = config_schema::find_key(key)) {
      entries[key] = {config_schema::check_value(*spec, value, origin), origin};
    } else if (config_schema::is_section(key)) {
      if (!value.is_object())
        MOE_BAD_INPUT("'" << key << "' = " << config_schema::show_value(value) << " (in " << origin
                          << ") is a section: expected an object with keys among "
                          << join(config_schema::section_children(key)));
      walk(value, key, origin, entries);
    } else {
      unknown_key(key, origin);
    }
  }
}

// VALUE of a --set as JSON (discarded when it does not parse), no deeper than a config file may nest.
json parse_set_value(const std::string& raw, const std::string& origin) {
  int64_t depth = 0;
  auto callback = [&](int, json::parse_event_t event, json&) {
    if (event == json::parse_event_t::object_start || event == json::parse_event_t::array_start) {
      if (++depth > kMaxConfigDepth) too_deep(origin, "");
    } else if (event == json::parse_event_t::object_end || event == json::parse_event_t::array_end) {
      --depth;
    }
    return true;
  };
  return json::parse(raw, callback, /*allow_exceptions=*/false);
}

// "--set KEY=VALUE": VALUE is JSON when it parses, else the plain text. A string key always takes the
// text, so `--set checkpoint.dir=2024` is the folder "2024", not a type error.
void apply_override(const std::string& text, Entries& entries) {
  const size_t equals = text.find('=');
  if (equals == std::string::npos)
    MOE_BAD_INPUT("--set '" << text << "': expected KEY=VALUE, e.g. --set train.steps=5");
  const std::string key = text.substr(0, equals), raw = text.substr(equals + 1);
  constexpr size_t kMaxShownChars = 100;  // a --set may be long; its message need not repeat all of it
  const std::string origin = "--set " + (text.size() > kMaxShownChars ? text.substr(0, kMaxShownChars) + "..." : text);
  const KeySpec* spec = config_schema::find_key(key);
  const bool takes_text =
      spec && (spec->type == config_schema::KeyType::String || spec->type == config_schema::KeyType::Choice);
  if (int64_t(raw.size()) > kMaxConfigBytes)
    MOE_BAD_INPUT("--set " << key << ": the value is " << raw.size() << " bytes, over the limit of " << kMaxConfigBytes
                           << " bytes (16 MiB); put large values in the config file");
  // A text key parses only a quoted VALUE: anything else is its text, however it is bracketed.
  json value = takes_text && raw.rfind('"', 0) != 0 ? json(raw) : parse_set_value(raw, origin);
  if (value.is_discarded() || (takes_text && !value.is_string())) value = raw;
  if (spec) {
    entries[key] = {config_schema::check_value(*spec, value, origin), origin};
  } else if (config_schema::is_section(key)) {
    if (!value.is_object())
      MOE_BAD_INPUT("'" << key << "' (in " << origin << ") is a section: expected a JSON object such as "
                        << "--set '" << key << "={\"" << config_schema::section_children(key)[0]
                        << "\": ...}', or set one key: --set " << key << "." << config_schema::section_children(key)[0]
                        << "=...");
    walk(value, key, origin, entries);
  } else {
    unknown_key(key.empty() ? "(empty)" : key, origin);
  }
}

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
  const json& at(const std::string& key) {
    read_.insert(key);
    return entries_.at(key).value;
  }
  size_t keys_read() const { return read_.size(); }

 private:
  const Entries& entries_;
  std::set<std::string> read_;
};

// One section of the config each, in the schema's order (launch/config_schema.cpp).
void fill_train(FieldReader& r, Config& c) {
  c.train.steps = r.integer("train.steps");
  c.train.seed = uint64_t(r.integer("train.seed"));
  c.train.global_batch = r.integer("train.global_batch");
  c.train.micro_batch = r.integer("train.micro_batch");
  c.train.seq_len = r.integer("train.seq_len");
  c.train.device = r.string("train.device");
  c.train.precision = r.string("train.precision");
  c.train.recompute = r.string("train.recompute");
  c.train.recompute_layers = r.integer("train.recompute_layers");
  c.train.trace = r.boolean("train.trace");
  c.train.trace_from = r.integer("train.trace_from");
  c.train.trace_steps = r.integer("train.trace_steps");
  c.train.log_every = r.integer("train.log_every");
  c.train.eval_every = r.integer("train.eval_every");
  c.train.eval_sequences = r.integer("train.eval_sequences");
  c.train.threads = r.integer("train.threads");
  c.train.adapt_threads = r.boolean("train.adapt_threads");
}

void fill_model(FieldReader& r, Config& c) {
  c.model.vocab = r.integer("model.vocab");
  c.model.d_model = r.integer("model.d_model");
  c.model.layers = r.integer("model.layers");
  c.model.heads = r.integer("model.heads");
  c.model.ffn_hidden = r.integer("model.ffn_hidden");
  c.model.attention = r.string("model.attention");
  c.model.mla_kv_rank = r.integer("model.mla.kv_rank");
  c.model.mla_q_rank = r.integer("model.mla.q_rank");
  c.model.mla_rope_dim = r.integer("model.mla.rope_dim");
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
  c.moe.router.noise = r.string("moe.router.noise");
  c.moe.router.score = r.string("moe.router.score");
  c.moe.router.normalize = r.boolean("moe.router.normalize");
  c.moe.router.bias_balance_rate = r.number("moe.router.bias_balance.rate");
  c.moe.router.bias_balance_rule = r.string("moe.router.bias_balance.rule");
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
  c.moe.drop_policy = r.string("moe.drop_policy");
  const json& overflow = r.at("moe.overflow");
  c.moe.overflow = overflow.is_string() ? std::vector<std::string>{overflow.get<std::string>()}
                                        : overflow.get<std::vector<std::string>>();
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
  for (const json& f : r.at("fault.inject"))
    c.fault.inject.push_back({f["kind"].get<std::string>(), f["rank"].get<int64_t>(), f["step"].get<int64_t>()});
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

// ---- Rules between keys: each states its reason, and docs/config.md lists them. -------------------

struct Checked {
  const Config& config;
  const Entries& entries;
  // "model.heads = 3 (in --set model.heads=3)": the value and where it came from, for messages.
  std::string show(const std::string& key) const {
    const Entry& e = entries.at(key);
    return key + " = " + config_schema::show_value(e.value) + " (" +
           (e.origin == "default" ? "default" : "in " + e.origin) + ")";
  }
};

struct Rule {
  const char* doc;
  void (*check)(const Checked&);
};

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
  const std::vector<std::string>& levels = c.config.moe.overflow;
  if (levels.size() == 1 || (levels.size() == 2 && levels[0] == "reroute")) return;
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
  if (m.attention != "mla") return;
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
  if (k.moe.overflow_has("dense"))
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

const std::vector<Rule>& rules() {
  static const std::vector<Rule> table = {
      {"`model.d_model` is a multiple of `model.heads`.", check_heads_divide_width},
      {"The head dimension `model.d_model / model.heads` is even (rotary embeddings rotate pairs).",
       check_head_dim_even},
      {"`train.global_batch` is a multiple of `train.micro_batch`.", check_micro_batches_fill_step},
      {"`optim.min_lr` <= `optim.lr`.", check_min_lr},
      {"`model.vocab` >= 256: the tokenizer is bytes.", check_vocab_holds_bytes},
      {"`moe.top_k` <= `moe.num_experts` when `moe.num_experts` > 0.", check_top_k},
      {"`moe.every` <= `model.layers`.", check_moe_every},
      {"`train.recompute_layers` <= `model.layers` (-1: every block).", check_recompute_layers},
      {"`checkpoint.replicas` is empty when `checkpoint.node_local` is true.", check_node_local_without_replicas},
      {"`fault.heartbeat_interval_s` < `fault.heartbeat_timeout_s`, or every rank would look dead between beats.",
       check_heartbeat_interval},
      {"With `parallel.ep` > 1 and experts, `train.micro_batch * train.seq_len * moe.top_k * model.d_model` <= "
       "2147483647: the elements of one all-to-all, counted by MPI in an int.",
       check_all_to_all_count},
      {"With `parallel.pp_layers` empty, `model.layers` is a multiple of `parallel.pp` (equal stages); otherwise "
       "`parallel.pp_layers` has `parallel.pp` entries summing to `model.layers`.",
       check_pp_layers},
      {"`parallel.expert_tp` is 1 (experts whole on every tensor-parallel rank) or `parallel.tp` (each expert's "
       "hidden width split over the tensor-parallel group).",
       check_expert_tp},
      {"With `parallel.tp` > 1: `model.heads` is a multiple of `parallel.tp` (whole heads per rank).", check_tp_heads},
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

const char* file_kind(mode_t mode) {
  if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

[[noreturn]] void config_too_large(const std::string& path, int64_t bytes) {
  MOE_BAD_INPUT("config file '" << path << "' is " << bytes << " bytes, over the limit of " << kMaxConfigBytes
                                << " bytes (16 MiB); a config is a few kilobytes: check that --config names the "
                                   "experiment's JSON file");
}

// Reads at most kMaxConfigBytes of a regular file. The file is opened without blocking and judged by
// fstat of what was opened, so a FIFO, /dev/zero or a huge file is refused before any of it is read.
std::string read_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT || errno == ENOTDIR) MOE_BAD_INPUT("config file '" << path << "' does not exist");
    MOE_BAD_INPUT("cannot open config file '" << path << "': " << std::strerror(errno)
                                              << "; check the path and its permissions");
  }
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) MOE_BAD_INPUT("cannot read config file '" << path << "': " << std::strerror(errno));
  if (S_ISDIR(st.st_mode)) MOE_BAD_INPUT("config file '" << path << "' is a directory; expected a JSON file");
  if (!S_ISREG(st.st_mode))
    MOE_BAD_INPUT("config file '" << path << "' is " << file_kind(st.st_mode)
                                  << "; expected a regular JSON file: write the config to a file and pass its path");
  if (st.st_size > kMaxConfigBytes) config_too_large(path, int64_t(st.st_size));
  std::string text;
  char buffer[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd, buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) MOE_BAD_INPUT("cannot read config file '" << path << "': " << std::strerror(errno));
    if (n == 0) break;
    text.append(buffer, size_t(n));
    if (int64_t(text.size()) > kMaxConfigBytes) config_too_large(path, int64_t(text.size()));  // it grew
  }
  return text;
}

// nlohmann reports a byte offset; people read lines and columns, and the line itself.
[[noreturn]] void malformed_json(const std::string& path, const std::string& text, const json::parse_error& e) {
  // e.byte counts from 1 and points at the last character read, the one that broke the parse.
  const size_t offset = std::min<size_t>(e.byte == 0 ? 0 : e.byte - 1, text.size());
  const size_t previous_newline = offset == 0 ? std::string::npos : text.rfind('\n', offset - 1);
  const size_t begin = previous_newline == std::string::npos ? 0 : previous_newline + 1;
  const int64_t line = 1 + std::count(text.begin(), text.begin() + int64_t(begin), '\n');
  const int64_t column = int64_t(offset - begin) + 1;
  std::string detail = e.what();
  // Keep nlohmann's explanation ("syntax error while parsing ...") without its own position prefix.
  if (const size_t at = detail.find(": syntax error"); at != std::string::npos) detail = detail.substr(at + 2);
  std::string source_line = text.substr(begin, text.find('\n', begin) - begin);
  if (source_line.size() > 120) source_line = source_line.substr(0, 120) + "...";
  MOE_BAD_INPUT("malformed JSON in " << path << " at line " << line << ", column " << column << ": " << detail << "\n  "
                                     << source_line);
}

// JSON keeps only the last of two equal keys; in a config that silently drops a setting.
json parse_rejecting_duplicates(const std::string& path, const std::string& text) {
  struct Frame {
    std::string path;
    bool is_array = false;
    int64_t next_index = 0;
    std::string last_key;
    std::set<std::string> keys;
  };
  std::vector<Frame> stack;
  auto child_path = [&stack]() -> std::string {
    if (stack.empty()) return "";
    Frame& top = stack.back();
    if (top.is_array) return top.path + "[" + std::to_string(top.next_index++) + "]";
    return top.path.empty() ? top.last_key : top.path + "." + top.last_key;
  };
  auto callback = [&](int, json::parse_event_t event, json& parsed) {
    switch (event) {
      case json::parse_event_t::object_start:
      case json::parse_event_t::array_start: {
        Frame frame;
        frame.path = child_path();
        if (int64_t(stack.size()) >= kMaxConfigDepth) too_deep("config file '" + path + "'", frame.path);
        frame.is_array = event == json::parse_event_t::array_start;
        stack.push_back(std::move(frame));
        break;
      }
      case json::parse_event_t::object_end:
      case json::parse_event_t::array_end:
        stack.pop_back();
        break;
      case json::parse_event_t::key: {
        Frame& top = stack.back();
        top.last_key = parsed.get<std::string>();
        if (!top.keys.insert(top.last_key).second)
          MOE_BAD_INPUT("duplicate key '" << (top.path.empty() ? "" : top.path + ".") << top.last_key << "' in " << path
                                          << ": JSON keeps only the last value; remove one of them");
        break;
      }
      case json::parse_event_t::value:
        if (!stack.empty() && stack.back().is_array) ++stack.back().next_index;
        break;
    }
    return true;
  };
  try {
    return json::parse(text, callback);
  } catch (const json::parse_error& e) {
    malformed_json(path, text, e);
  }
}

}  // namespace

double RouterConfig::tau_at(int64_t step) const {
  if (tau_schedule.empty()) return tau;
  if (step <= tau_schedule.front().step) return tau_schedule.front().tau;
  for (size_t i = 1; i < tau_schedule.size(); ++i) {
    const TauPoint &a = tau_schedule[i - 1], &b = tau_schedule[i];
    if (step <= b.step) return a.tau + (b.tau - a.tau) * double(step - a.step) / double(b.step - a.step);
  }
  return tau_schedule.back().tau;
}

bool MoeConfig::overflow_has(const std::string& level) const {
  return std::find(overflow.begin(), overflow.end(), level) != overflow.end();
}

Config config_from_json(const json& document, const std::vector<std::string>& overrides, const std::string& origin) {
  if (!document.is_object())
    MOE_BAD_INPUT("config " << origin << " = " << config_schema::show_value(document)
                            << ": expected a JSON object with sections among "
                            << join(config_schema::section_children("")));
  Entries entries;
  walk(document, "", origin, entries);
  for (const std::string& text : overrides) apply_override(text, entries);
  for (const KeySpec& spec : config_schema::schema())
    if (!entries.count(spec.key))
      entries[spec.key] = {config_schema::check_value(spec, spec.default_value, "default"), "default"};
  Config config = fill(entries);
  const Checked checked{config, entries};
  for (const Rule& rule : rules())
    if (rule.check) rule.check(checked);
  for (const Rule& gate : gates()) gate.check(checked);
  return config;
}

Config load_config(const std::string& path, const std::vector<std::string>& overrides) {
  return config_from_json(parse_rejecting_duplicates(path, read_file(path)), overrides, path);
}

std::string config_reference_markdown() {
  std::ostringstream out;
  out << R"(# Config reference

<!-- Generated by moe::config_reference_markdown() from the schema in launch/config_schema.cpp and the
     rules in launch/config.cpp; do not edit by hand. Regenerate with
     MOE_REGENERATE_DOCS=1 build/bin/test_config --gtest_filter='ConfigDocs.*' -->

An experiment is one JSON file of nested objects, one per section below. Every key is optional and takes
its default when absent; the defaults are a small dense model that trains on a CPU. For example:

```json
{
  "train": {"steps": 1000, "global_batch": 32},
  "model": {"d_model": 256, "layers": 6},
  "data": {"sources": [{"name": "code", "path": "data/code.txt", "weight": 2}]}
}
```

The resolved config, every key with its value, is written to the run directory as `config.json`.

## Overriding keys: `--set`

`moe train --config FILE --set KEY=VALUE ...` replaces one key after the file is read; a later `--set`
wins over an earlier one. KEY is a dotted key of the tables below. VALUE is read as JSON when it parses,
so `--set train.steps=5` is the integer 5 and `--set 'data.sources=[{"name": "a", "path": "a.txt"}]'`
is a list; otherwise it is the text itself (`--set moe.router.noise=gumbel`, `--set parallel.dp=auto`).
A string-valued key always takes the text (`--set checkpoint.dir=2024` is the folder "2024"). KEY may
also be a section with a JSON object as VALUE: `--set 'moe.router={"tau": 0.5}'`.

## Validation

The whole config is checked when it is loaded, before any work starts. The first problem stops the
program with exit code 2 and a message naming the key, its value, where the value came from (the file
or the `--set`) and what is expected.

- Types are strict: an `integer` must be a JSON integer (`3.0` and `"3"` are errors); a `number`
  accepts integers too.
- Values must be in range, and strings one of the allowed values.
- Unknown keys are errors at every level, and the nearest valid key is suggested; a section must be an
  object. A key may appear only once in a file.
- Malformed JSON is reported with its line and column.
- What is parsed is bounded: the config must be a regular file (not a FIFO, a device or a directory) of
  at most 16 MiB, with objects and arrays nested at most 64 deep; a `--set` value has the same bounds.
- The limits of the code itself (e.g. at most 1024 experts, step numbers of at most 8 digits) are the
  ranges of the tables below, so a value past one is refused here, by name, not when training starts.

The values must also agree with each other:

)";
  for (const Rule& rule : rules()) out << "- " << rule.doc << "\n";
  if (!gates().empty())
    out << "\nThese features are not available in this build yet, so their keys must keep these values (checked "
           "after the rules above, so a config learns first what could never work):\n\n";
  for (const Rule& gate : gates()) out << "- " << gate.doc << "\n";
  out << "\n" << config_schema::tables_markdown();
  std::string text = out.str();
  while (text.size() >= 2 && text[text.size() - 1] == '\n' && text[text.size() - 2] == '\n') text.pop_back();
  return text;
}

}  // namespace moe
