// Routing health of a run (docs/metrics.md "Routing health"): the load fields each MoE layer's entry of a
// metrics line gains (overflow_ratio, load_max_over_mean, activation), routing stability measured on a fixed
// probe of held-out tokens, and the alerts of the monitor.* thresholds. Nothing here changes training: the
// fields are derived from the step's routing statistics, and the probe is an evaluation forward between steps.
// Not here: the contract fields of a metrics line (launch/train/train_metrics.h).
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <tuple>
#include <vector>

#include "core/ffn.h"
#include "launch/config/config.h"

namespace moe {

struct Trainer;

// Adds overflow_ratio, load_max_over_mean and activation to `entry`, one MoE layer's object of a metrics
// line, from the step's statistics of that layer. top_k: assignments per token.
void add_load_health(nlohmann::json& entry, const RouterStepStats& stats, int64_t top_k);

// The top-1 expert of every probe token, per MoE layer of the whole model: `monitor.probe_sequences`
// held-out windows of the first source (at most train.micro_batch) through an evaluation forward. Every rank
// must call it (expert-parallel forwards run in lockstep); empty when the probe is off, the model has no MoE
// layer, or the model is split into pipeline stages (parallel.pp > 1).
std::vector<std::vector<int32_t>> probe_top1(Trainer& t);

// Fraction of positions where a and b agree (they have equal sizes).
double same_fraction(const std::vector<int32_t>& a, const std::vector<int32_t>& b);

// Routing stability between logged steps (rank 0): the probe's top-1 choices of every logged step go to
// RUN_DIR/routing_probe.jsonl, so a resumed run compares with the same step as the uninterrupted one.
class RoutingProbe {
 public:
  // A fresh run starts the file empty; a resumed one keeps the lines up to `start_step`.
  RoutingProbe(std::string path, bool fresh, int64_t start_step);
  // Per layer: the fraction of probe tokens whose top-1 is the same as at the previous logged step (null for
  // the first); records `top1` as the new reference. Empty when `top1` is.
  std::vector<nlohmann::json> observe(int64_t step, const std::vector<std::vector<int32_t>>& top1);

 private:
  std::string path_;
  std::vector<std::vector<int32_t>> previous_;
};

// The alerts of the monitor.* thresholds, judged on training lines of metrics.jsonl in step order.
class HealthMonitor {
 public:
  HealthMonitor(const MonitorConfig& config, int64_t num_experts) : config_(config), num_experts_(num_experts) {}
  // The alerts that fire at this line's step (an empty array when none): each when its condition has held at
  // every logged step for monitor.window steps, once until the condition stops holding.
  nlohmann::json observe(const nlohmann::json& line);
  // Feeds the training lines of a metrics.jsonl (a resumed run's kept lines), discarding the alerts.
  void replay(const std::string& metrics_path);
  // One line of text for the terminal.
  static std::string describe(const nlohmann::json& alert);

 private:
  // (kind, layer, expert or -1): the step the condition began holding, and whether it has fired since.
  struct Streak {
    int64_t since = 0;
    bool fired = false;
  };
  void judge(nlohmann::json& alerts, int64_t step, const std::tuple<std::string, int64_t, int64_t>& key, bool holds,
             double value, double threshold);
  MonitorConfig config_;
  int64_t num_experts_;
  std::map<std::tuple<std::string, int64_t, int64_t>, Streak> streaks_;
};

}  // namespace moe
