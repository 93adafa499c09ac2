// Routing health in metrics.jsonl (launch/train/routing_health.h, docs/metrics.md "Routing health"): the load fields
// against an independent computation from tokens_per_expert and the step's token count, routing stability
// against a case whose routing cannot change (lr 1e-30) and against the probe file, the alerts on constructed
// lines (a dead expert, a hot expert, a forced overflow, cv) and on real runs (a forced overflow fires, a
// healthy run stays silent), and a resumed run reproducing the fields and alerts bit for bit.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "launch/config/config.h"
#include "launch/train/routing_health.h"
#include "launch/train/trainer.h"
#include "run_compare.h"

namespace moe {
namespace {
using namespace test_support;
using json = nlohmann::json;

const std::string kConfig = std::string(MOE_SOURCE_DIR) + "/configs/tiny_moe.json";
constexpr int64_t kTopK = 2, kExperts = 4, kTokensPerStep = 8 * 16;  // global_batch * seq_len

// A small MoE model: 2 MoE layers of 4 experts, top-2, 10 steps, a line every step.
std::vector<std::string> small(std::vector<std::string> extra = {}) {
  std::vector<std::string> sets = {
      "train.steps=10",    "train.log_every=1",    "train.eval_every=5",  "train.eval_sequences=2",
      "train.seq_len=16",  "train.global_batch=8", "train.micro_batch=2", "train.threads=1",
      "model.d_model=32",  "model.layers=2",       "model.heads=2",       "model.ffn_hidden=32",
      "moe.num_experts=4", "moe.expert_hidden=32", "checkpoint.every=3",  "monitor.window=3"};
  sets.insert(sets.end(), extra.begin(), extra.end());
  return sets;
}

std::vector<json> train_lines(const std::string& run_dir, const std::vector<std::string>& sets,
                              int64_t stop_after = 0) {
  TrainOptions o;
  o.config_path = kConfig;
  o.overrides = sets;
  o.run_dir = run_dir;
  o.quiet = true;
  o.stop_after_step = stop_after;
  o.command_line = {"test_routing_health"};
  run_train(o);
  std::vector<json> lines;
  std::ifstream in(fs::path(run_dir) / "metrics.jsonl");
  for (std::string text; std::getline(in, text);) {
    const json j = json::parse(text);
    if (j.contains("lm_loss")) lines.push_back(j);
  }
  return lines;
}

// overflow_ratio, load_max_over_mean and activation, recomputed from tokens_per_expert: with overflow "drop"
// every assignment not processed was over capacity, and a step makes tokens * top_k assignments.
TEST(RoutingHealth, LoadFieldsEqualAnIndependentComputation) {
  TempDir dir("health_load");
  const auto lines = train_lines(dir / "run", small({"moe.capacity_factor=0.75", "moe.overflow=\"drop\""}));
  ASSERT_EQ(lines.size(), 10u);
  bool some_overflow = false;
  for (const json& line : lines)
    for (const json& layer : line["moe"]) {
      const auto tpe = layer["tokens_per_expert"].get<std::vector<int64_t>>();
      ASSERT_EQ(int64_t(tpe.size()), kExperts);
      int64_t sum = 0, most = 0;
      for (const int64_t c : tpe) sum += c, most = std::max(most, c);
      const double overflow = double(kTokensPerStep * kTopK - sum) / double(kTokensPerStep * kTopK);
      EXPECT_DOUBLE_EQ(layer["overflow_ratio"].get<double>(), overflow) << line.dump();
      EXPECT_DOUBLE_EQ(layer["load_max_over_mean"].get<double>(), double(most) / (double(sum) / kExperts));
      for (size_t e = 0; e < tpe.size(); ++e)
        EXPECT_DOUBLE_EQ(layer["activation"][e].get<double>(), double(tpe[e]) / double(sum));
      some_overflow |= overflow > 0;
    }
  EXPECT_TRUE(some_overflow) << "capacity factor 0.75 must overflow";
}

// With rerouting, rerouted assignments are processed (in tokens_per_expert) but were over capacity all the same.
TEST(RoutingHealth, OverflowCountsReroutedAssignments) {
  TempDir dir("health_reroute");
  const auto lines = train_lines(dir / "run", small({"moe.capacity_factor=0.75", "moe.overflow=\"reroute\""}));
  int64_t rerouted = 0;
  for (const json& line : lines)
    for (const json& layer : line["moe"]) {
      int64_t sum = 0;
      for (const json& c : layer["tokens_per_expert"]) sum += c.get<int64_t>();
      const int64_t over = kTokensPerStep * kTopK - sum + layer["rerouted"].get<int64_t>();
      EXPECT_DOUBLE_EQ(layer["overflow_ratio"].get<double>(), double(over) / double(kTokensPerStep * kTopK));
      rerouted += layer["rerouted"].get<int64_t>();
    }
  EXPECT_GT(rerouted, 0);
}

// With lr 1e-30 (and no balancing bias) no parameter changes by a bit: the probe routes the same way at every step.
// With training, stability is a fraction the probe file confirms.
TEST(RoutingHealth, StabilityIsOneWhenNothingLearnsAndMatchesTheProbeFile) {
  TempDir dir("health_stability");
  for (const json& line :
       train_lines(dir / "frozen", small({"optim.lr=1e-30", "optim.min_lr=1e-30", "moe.router.bias_balance.rate=0"})))
    for (const json& layer : line["moe"]) {
      if (line["step"] == 1)
        EXPECT_TRUE(layer["stability"].is_null());
      else
        EXPECT_EQ(layer["stability"].get<double>(), 1.0) << "step " << line["step"];
    }
  const auto lines = train_lines(dir / "learning", small({"optim.lr=0.05"}));
  std::vector<json> probe;
  std::ifstream in(fs::path(dir / "learning") / "routing_probe.jsonl");
  for (std::string text; std::getline(in, text);) probe.push_back(json::parse(text));
  ASSERT_EQ(probe.size(), lines.size());
  bool changed = false;
  for (size_t i = 1; i < lines.size(); ++i)
    for (size_t l = 0; l < 2; ++l) {
      const auto a = probe[i - 1]["top1"][l].get<std::vector<int32_t>>(),
                 b = probe[i]["top1"][l].get<std::vector<int32_t>>();
      ASSERT_EQ(a.size(), 2u * 16u) << "probe: train.micro_batch (2) held-out windows of 16 tokens";
      EXPECT_EQ(lines[i]["moe"][l]["stability"].get<double>(), same_fraction(a, b));
      changed |= same_fraction(a, b) < 1;
    }
  EXPECT_TRUE(changed) << "a learning router changes some top-1 choice";
}

json line_with(int64_t step, const std::vector<double>& share, double cv, double overflow) {
  return {
      {"step", step}, {"lm_loss", 1.0}, {"moe", {{{"activation", share}, {"cv", cv}, {"overflow_ratio", overflow}}}}};
}

// A dying expert (share 0.5% < 3%) for monitor.window steps fires once, at the step the window is full; it
// fires again only after recovering. A hot expert, a high cv and an overflow fire their own kinds.
TEST(RoutingHealthAlerts, FireOnConstructedLinesOnceAfterTheWindow) {
  MonitorConfig config;
  config.window = 3;
  HealthMonitor monitor(config, 4);
  const std::vector<double> healthy = {0.25, 0.25, 0.25, 0.25}, dying = {0.005, 0.33, 0.33, 0.335};
  EXPECT_TRUE(monitor.observe(line_with(1, healthy, 0.1, 0)).empty());
  EXPECT_TRUE(monitor.observe(line_with(2, dying, 0.1, 0)).empty());
  EXPECT_TRUE(monitor.observe(line_with(3, dying, 0.1, 0)).empty());
  const json fired = monitor.observe(line_with(4, dying, 0.1, 0));
  ASSERT_EQ(fired.size(), 1u) << fired.dump();
  EXPECT_EQ(fired[0]["kind"], "low_share");
  EXPECT_EQ(fired[0]["expert"], 0);
  EXPECT_EQ(fired[0]["since_step"], 2);
  EXPECT_DOUBLE_EQ(fired[0]["threshold"].get<double>(), 0.03);
  EXPECT_TRUE(monitor.observe(line_with(5, dying, 0.1, 0)).empty()) << "fires once";
  EXPECT_TRUE(monitor.observe(line_with(6, healthy, 0.1, 0)).empty());
  for (int64_t s = 7; s <= 8; ++s) EXPECT_TRUE(monitor.observe(line_with(s, dying, 0.1, 0)).empty());
  EXPECT_EQ(monitor.observe(line_with(9, dying, 0.1, 0)).size(), 1u) << "again after recovering";

  HealthMonitor other(config, 4);
  const std::vector<double> hot = {0.7, 0.1, 0.1, 0.1};
  json kinds = json::array();
  for (int64_t s = 1; s <= 3; ++s)
    for (const json& a : other.observe(line_with(s, hot, 2.5, 0.02))) kinds.push_back(a["kind"]);
  EXPECT_EQ(kinds, json({"high_share", "cv", "overflow"}));
}

// Many experts: the uniform share 1/64 is under 3%, so the floor is capped at half of it.
TEST(RoutingHealthAlerts, TheShareFloorScalesWithManyExperts) {
  MonitorConfig config;
  config.window = 1;
  HealthMonitor monitor(config, 64);
  std::vector<double> share(64, 1.0 / 64);
  EXPECT_TRUE(monitor.observe(line_with(1, share, 0.1, 0)).empty());
  share[3] = 0.001;
  const json fired = monitor.observe(line_with(2, share, 0.1, 0));
  ASSERT_EQ(fired.size(), 1u);
  EXPECT_DOUBLE_EQ(fired[0]["threshold"].get<double>(), 0.5 / 64);
}

// A run forced to overflow (capacity factor 0.5) alerts; a healthy one (no capacity limit, 4 balanced experts)
// does not, at the default thresholds.
TEST(RoutingHealthAlerts, AForcedOverflowFiresAndAHealthyRunIsSilent) {
  TempDir dir("health_alerts");
  json alerts = json::array();
  for (const json& line : train_lines(dir / "overflow", small({"moe.capacity_factor=0.5"})))
    for (const json& a : line.value("alerts", json::array())) alerts.push_back(a);
  ASSERT_FALSE(alerts.empty());
  EXPECT_EQ(alerts[0]["kind"], "overflow");
  EXPECT_EQ(alerts[0]["since_step"], 1);
  for (const json& line : train_lines(dir / "healthy", small({"moe.capacity_factor=0"})))
    EXPECT_FALSE(line.contains("alerts")) << line["alerts"].dump();
}

// Stopped after step 5 (checkpoint at 3 and 5) and resumed: every line equal to the uninterrupted run, the new
// fields and the alerts included.
TEST(RoutingHealth, AResumedRunReproducesTheFieldsAndAlerts) {
  TempDir dir("health_resume");
  const auto sets = small({"moe.capacity_factor=0.5", "monitor.window=6"});
  const auto whole = train_lines(dir / "whole", sets);
  train_lines(dir / "resumed", sets, 5);
  const auto resumed = train_lines(dir / "resumed", sets);
  ASSERT_EQ(whole.size(), resumed.size());
  bool alert_after_resume = false;
  for (size_t i = 0; i < whole.size(); ++i) {
    EXPECT_EQ(first_difference(without_timing(whole[i]), without_timing(resumed[i])), "") << "line " << i + 1;
    alert_after_resume |= whole[i]["step"] > 5 && whole[i].contains("alerts");
  }
  EXPECT_TRUE(alert_after_resume) << "the window spans the resume, so its alert depends on the replayed state";
}

}  // namespace
}  // namespace moe
