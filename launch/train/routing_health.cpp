// Routing health: load fields, the stability probe and the monitor's alerts (launch/train/routing_health.h).
#include "launch/train/routing_health.h"

#include <algorithm>
#include <fstream>
#include <utility>

#include "core/error.h"
#include "launch/run/run_files.h"
#include "launch/train/train_setup.h"
#include "launch/train/train_step.h"

namespace moe {
using json = nlohmann::json;

void add_load_health(json& entry, const RouterStepStats& stats, int64_t top_k) {
  const std::vector<int64_t>& load = stats.tokens_per_expert;
  int64_t processed = 0, most = 0;
  for (const int64_t c : load) processed += c, most = std::max(most, c);
  // Every token makes top_k assignments; those over their expert's capacity were dropped, rerouted or sent to
  // the dense fallback, each counted once by the plan.
  const int64_t assignments = stats.tokens * top_k;
  const int64_t overflowed = stats.dropped + stats.rerouted + stats.fallback;
  const double mean = load.empty() ? 0.0 : double(processed) / double(load.size());
  json activation = json::array();
  for (const int64_t c : load) activation.push_back(processed > 0 ? double(c) / double(processed) : 0.0);
  entry["overflow_ratio"] = assignments > 0 ? double(overflowed) / double(assignments) : 0.0;
  entry["load_max_over_mean"] = mean > 0 ? double(most) / mean : 0.0;
  entry["activation"] = std::move(activation);
}

std::vector<std::vector<int32_t>> probe_top1(Trainer& t) {
  const TrainConfig& tc = t.config.train;
  const data::Loader& loader = *t.loader;
  const int64_t B = std::min({t.config.monitor.probe_sequences, tc.micro_batch, loader.heldout_count(0)});
  if (B <= 0 || t.model_moe_layers == 0 || t.pipeline) return {};
  const int64_t T = tc.seq_len, K = t.config.moe.top_k;
  std::vector<int32_t> tokens(size_t(B * (T + 1)));
  for (int64_t b = 0; b < B; ++b) loader.heldout_sequence(0, b, tokens.data() + b * (T + 1));
  parameters_before_forward(t);
  t.model->set_context(false, 0, 0, 0.0, 0);
  t.model->forward(tokens.data(), B);
  std::vector<std::vector<int32_t>> top1;
  for (int64_t l = t.model->first_layer(); l < t.model->end_layer(); ++l) {
    // The routing group's choices, best first: (tokens, K). A group split over tp ranks holds the whole group's.
    const auto* slot = dynamic_cast<const MoeSlot<float>*>(t.model->ffn_slot(0, l));
    if (!slot) continue;
    const std::vector<int32_t> selected = selected_on_host(t.backend, slot->routing, K);
    std::vector<int32_t>& first = top1.emplace_back();
    for (size_t j = 0; j < selected.size(); j += size_t(K)) first.push_back(selected[j]);
  }
  MOE_CHECK(int64_t(top1.size()) == t.model_moe_layers, "the probe found " << top1.size() << " MoE layers");
  return top1;
}

double same_fraction(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  if (a.empty() || a.size() != b.size()) return 0.0;
  int64_t same = 0;
  for (size_t i = 0; i < a.size(); ++i) same += a[i] == b[i];
  return double(same) / double(a.size());
}

RoutingProbe::RoutingProbe(std::string path, bool fresh, int64_t start_step) : path_(std::move(path)) {
  std::string kept;
  if (!fresh) {
    for_each_line(path_, [&](const std::string& line) {
      try {
        const json j = json::parse(line);
        if (j.at("step").get<int64_t>() > start_step) return;
        previous_ = j.at("top1").get<std::vector<std::vector<int32_t>>>();
        kept += line + "\n";
      } catch (const std::exception&) {
        // A line cut by a crash: dropped.
      }
    });
  }
  replace_run_file(path_, kept);
}

std::vector<json> RoutingProbe::observe(int64_t step, const std::vector<std::vector<int32_t>>& top1) {
  std::vector<json> stability;
  if (top1.empty()) return stability;
  for (size_t l = 0; l < top1.size(); ++l)
    stability.push_back(previous_.size() == top1.size() ? json(same_fraction(previous_[l], top1[l])) : json(nullptr));
  std::FILE* out = open_run_file(path_, FileMode::Append);
  try {
    write_all(out, json{{"step", step}, {"top1", top1}}.dump() + "\n", path_);
  } catch (...) {
    std::fclose(out);
    throw;
  }
  std::fclose(out);
  previous_ = top1;
  return stability;
}

void HealthMonitor::judge(json& alerts, int64_t step, const std::tuple<std::string, int64_t, int64_t>& key, bool holds,
                          double value, double threshold) {
  if (!holds) {
    streaks_.erase(key);
    return;
  }
  Streak& s = streaks_.try_emplace(key, Streak{step, false}).first->second;
  if (s.fired || step - s.since + 1 < config_.window) return;
  s.fired = true;
  const auto& [kind, layer, expert] = key;
  json alert = {{"kind", kind}, {"layer", layer}, {"value", value}, {"threshold", threshold}, {"since_step", s.since}};
  if (expert >= 0) alert["expert"] = expert;
  alerts.push_back(std::move(alert));
}

json HealthMonitor::observe(const json& line) {
  json alerts = json::array();
  if (!line.contains("moe") || !line.contains("lm_loss")) return alerts;
  const int64_t step = line.at("step").get<int64_t>();
  const double E = double(num_experts_);
  const double floor = std::min(config_.min_share, 0.5 / E), ceiling = std::max(config_.max_share, 2.0 / E);
  int64_t layer = 0;
  for (const json& entry : line.at("moe")) {
    if (entry.contains("activation")) {
      const std::vector<double> share = entry.at("activation").get<std::vector<double>>();
      for (size_t e = 0; e < share.size(); ++e) {
        judge(alerts, step, {"low_share", layer, int64_t(e)}, floor > 0 && share[e] < floor, share[e], floor);
        judge(alerts, step, {"high_share", layer, int64_t(e)}, ceiling < 1 && share[e] > ceiling, share[e], ceiling);
      }
    }
    const double cv = entry.value("cv", 0.0), overflow = entry.value("overflow_ratio", 0.0);
    judge(alerts, step, {"cv", layer, -1}, config_.max_cv > 0 && cv > config_.max_cv, cv, config_.max_cv);
    judge(alerts, step, {"overflow", layer, -1}, config_.max_overflow < 1 && overflow > config_.max_overflow, overflow,
          config_.max_overflow);
    ++layer;
  }
  return alerts;
}

void HealthMonitor::replay(const std::string& metrics_path) {
  for_each_line(metrics_path, [&](const std::string& line) {
    try {
      observe(json::parse(line));
    } catch (const std::exception&) {
      // A line cut by a crash was dropped when the file was reopened; nothing else is unreadable.
    }
  });
}

std::string HealthMonitor::describe(const json& a) {
  const std::string kind = a.at("kind");
  const std::string where = "layer " + std::to_string(a.at("layer").get<int64_t>()) +
                            (a.contains("expert") ? " expert " + std::to_string(a.at("expert").get<int64_t>()) : "");
  const std::string what = kind == "low_share"    ? "share of assignments below"
                           : kind == "high_share" ? "share of assignments above"
                           : kind == "cv"         ? "load cv above"
                                                  : "overflow ratio above";
  char numbers[96];
  std::snprintf(numbers, sizeof numbers, " %.4g (value %.4g) since step %lld", a.at("threshold").get<double>(),
                a.at("value").get<double>(), static_cast<long long>(a.at("since_step").get<int64_t>()));
  return "alert: " + where + ": " + what + numbers;
}

}  // namespace moe
