// End-to-end tests of `moe train` in process (launch/train/trainer.h, run_trainer): the same config and seed
// reproduce metrics.jsonl bit for bit (docs/design.md, invariant 3), full recomputation changes no bit, the
// run directory holds what docs/cli.md promises, a tiny model learns, and bad input writes nothing.
// Not here: the command line and exit codes (tests/cli/test_bad_input.sh), the config rules one by one
// (test_config_rules.cpp), the model's math (tests/core).
#include <gtest/gtest.h>
#include <stdlib.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/error.h"
#include "launch/config/config.h"
#include "launch/run/run_dir.h"
#include "launch/train/trainer.h"
#include "run_compare.h"

namespace moe {
namespace {
using namespace test_support;

namespace fs = std::filesystem;
using json = nlohmann::json;

const std::string kTinyConfig = std::string(MOE_SOURCE_DIR) + "/configs/tiny.json";

// A model small enough for a test (d_model 32, one block, sequences of 16): 12 steps, a metrics line every
// step and an evaluation every 6, one compute thread. `extra` comes last, so it wins.
std::vector<std::string> tiny_overrides(const std::vector<std::string>& extra = {}) {
  std::vector<std::string> overrides = {
      "train.steps=12",   "train.log_every=1",    "train.eval_every=6",  "train.eval_sequences=2",
      "train.seq_len=16", "train.global_batch=4", "train.micro_batch=2", "train.threads=1",
      "model.d_model=32", "model.layers=1",       "model.heads=2",       "model.ffn_hidden=32",
  };
  overrides.insert(overrides.end(), extra.begin(), extra.end());
  return overrides;
}

TrainOptions options_for(const std::string& run_dir, const std::vector<std::string>& overrides) {
  TrainOptions options;
  options.config_path = kTinyConfig;
  options.overrides = overrides;
  options.run_dir = run_dir;
  options.quiet = true;
  options.command_line = {"test_trainer"};
  return options;
}

json read_json(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << "cannot open " << path;
  return json::parse(in);
}

std::vector<json> read_metrics(const std::string& run_dir) {
  std::ifstream in(fs::path(run_dir) / "metrics.jsonl");
  EXPECT_TRUE(in.good()) << "no metrics.jsonl in " << run_dir;
  std::vector<json> lines;
  for (std::string text; std::getline(in, text);) lines.push_back(json::parse(text));
  return lines;
}

// Trains a run into `run_dir` and returns its metrics lines.
std::vector<json> train(const std::string& run_dir, const std::vector<std::string>& overrides) {
  run_train(options_for(run_dir, overrides));
  return read_metrics(run_dir);
}

bool is_training_line(const json& line) { return line.contains("loss"); }
bool is_eval_line(const json& line) { return line.contains("eval_loss"); }

std::vector<double> training_losses(const std::vector<json>& lines) {
  std::vector<double> losses;
  for (const json& line : lines)
    if (is_training_line(line)) losses.push_back(line.at("loss").get<double>());
  return losses;
}

// Both runs logged the same lines, equal bit for bit in every field but the timing ones.
void expect_same_metrics(const std::vector<json>& a, const std::vector<json>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i)
    EXPECT_EQ(first_difference(without_timing(a[i]), without_timing(b[i])), "") << "metrics.jsonl line " << i + 1;
}

// ---- Reproducibility ----------------------------------------------------------------------------------------

TEST(TrainerReproducibility, SameConfigAndSeedGiveTheSameMetricsBitForBit) {
  TempDir tmp("trainer");
  const std::vector<json> first = train(tmp / "first", tiny_overrides());
  const std::vector<json> second = train(tmp / "second", tiny_overrides());
  ASSERT_EQ(first.size(), 12u + 2u) << "12 training lines (log_every 1) and 2 evaluations (eval_every 6)";
  expect_same_metrics(first, second);
}

TEST(TrainerReproducibility, ConfigJsonOfARunRepeatsIt) {
  // docs/cli.md: `moe train --config RUN_DIR/config.json` repeats the run.
  TempDir tmp("trainer");
  const std::vector<json> first = train(tmp / "first", tiny_overrides());
  TrainOptions repeat = options_for(tmp / "repeat", {});
  repeat.config_path = tmp / "first/config.json";
  run_train(repeat);
  expect_same_metrics(read_metrics(tmp / "repeat"), first);
}

TEST(TrainerReproducibility, DifferentSeedsGiveDifferentLosses) {
  TempDir tmp("trainer");
  const std::vector<double> a = training_losses(train(tmp / "a", tiny_overrides({"train.seed=1"})));
  const std::vector<double> b = training_losses(train(tmp / "b", tiny_overrides({"train.seed=2"})));
  ASSERT_EQ(a.size(), 12u);
  ASSERT_EQ(b.size(), 12u);
  // The seed sets the initial weights and the data order, so even the first step's loss differs.
  EXPECT_NE(a[0], b[0]);
  int steps_differing = 0;
  for (size_t i = 0; i < a.size(); ++i) steps_differing += a[i] != b[i];
  EXPECT_EQ(steps_differing, 12) << "the seed should change every step's loss";
}

TEST(TrainerReproducibility, RecomputeGivesTheSameMetricsBitForBit) {
  // Recomputation runs the same ops on the same inputs, so it must change memory, never a bit of the result.
  TempDir tmp("trainer");
  const std::vector<json> none = train(tmp / "none", tiny_overrides({"train.recompute=none"}));
  const std::vector<json> full = train(tmp / "full", tiny_overrides({"train.recompute=full"}));
  const std::vector<json> selective = train(tmp / "selective", tiny_overrides({"train.recompute=selective"}));
  ASSERT_EQ(none.size(), 14u);
  expect_same_metrics(none, full);
  expect_same_metrics(none, selective);
}

// ---- The run directory (docs/cli.md) ------------------------------------------------------------------

TEST(TrainerRunDirectory, MetricsLinesHaveTheContractFields) {
  TempDir tmp("trainer");
  const std::vector<json> lines = train(tmp / "run", tiny_overrides());
  std::vector<int64_t> training_steps, eval_steps;
  for (const json& line : lines) {
    ASSERT_TRUE(line.is_object()) << line.dump();
    ASSERT_TRUE(line.contains("step") && line.at("step").is_number_integer()) << line.dump();
    if (is_eval_line(line)) {
      eval_steps.push_back(line.at("step").get<int64_t>());
      const double eval_loss = line.at("eval_loss").get<double>();
      EXPECT_TRUE(std::isfinite(eval_loss) && eval_loss > 0) << line.dump();
      ASSERT_TRUE(line.contains("eval_loss_by_source")) << "several sources, so by source too: " << line.dump();
      const json& by_source = line.at("eval_loss_by_source");
      ASSERT_TRUE(by_source.is_object()) << line.dump();
      EXPECT_EQ(by_source.size(), 3u) << line.dump();
      for (const char* source : {"prose", "code", "arithmetic"}) {
        ASSERT_TRUE(by_source.contains(source) && by_source.at(source).is_number()) << source << ": " << line.dump();
        const double loss = by_source.at(source).get<double>();
        EXPECT_TRUE(std::isfinite(loss) && loss > 0) << source << ": " << line.dump();
      }
      continue;
    }
    training_steps.push_back(line.at("step").get<int64_t>());
    for (const char* field :
         {"loss", "lm_loss", "aux_loss", "z_loss", "entropy_loss", "death_loss", "lr", "grad_norm", "tokens_per_s"}) {
      ASSERT_TRUE(line.contains(field)) << "no '" << field << "' in " << line.dump();
      ASSERT_TRUE(line.at(field).is_number()) << field << " in " << line.dump();
      EXPECT_TRUE(std::isfinite(line.at(field).get<double>())) << field << " in " << line.dump();
    }
    ASSERT_TRUE(line.contains("moe") && line.at("moe").is_array()) << line.dump();
    EXPECT_TRUE(line.at("moe").empty()) << "the tiny model has no MoE layer: " << line.dump();
    // docs/metrics.md: tokens trained on so far = step * global_batch * seq_len.
    ASSERT_TRUE(line.contains("tokens") && line.at("tokens").is_number_integer()) << line.dump();
    EXPECT_EQ(line.at("tokens").get<int64_t>(), line.at("step").get<int64_t>() * 4 * 16) << line.dump();
    EXPECT_EQ(line.at("loss").get<double>(), line.at("lm_loss").get<double>())
        << "without MoE layers the router losses are 0: " << line.dump();
    EXPECT_GT(line.at("loss").get<double>(), 0.0) << line.dump();
    EXPECT_GT(line.at("lr").get<double>(), 0.0) << line.dump();
    EXPECT_GE(line.at("grad_norm").get<double>(), 0.0) << line.dump();
    EXPECT_GE(line.at("tokens_per_s").get<double>(), 0.0) << line.dump();
    // The host's waits for the backend: at least the loss read back after each micro-batch, and its bytes.
    ASSERT_TRUE(line.contains("host_syncs") && line.at("host_syncs").is_number_integer()) << line.dump();
    ASSERT_TRUE(line.contains("d2h_bytes") && line.at("d2h_bytes").is_number_integer()) << line.dump();
    EXPECT_GE(line.at("host_syncs").get<int64_t>(), 1) << line.dump();
    EXPECT_GE(line.at("d2h_bytes").get<int64_t>(), 4 * 16 * 4) << "the step's 4 x 16 token losses: " << line.dump();
  }
  EXPECT_EQ(training_steps, (std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}));
  EXPECT_EQ(eval_steps, (std::vector<int64_t>{6, 12}));
}

TEST(TrainerRunDirectory, ConfigJsonReloadsToTheSameResolvedConfig) {
  TempDir tmp("trainer");
  const std::string run_dir = tmp / "run";
  run_train(options_for(run_dir, tiny_overrides()));
  const Config original = load_config(kTinyConfig, tiny_overrides());
  const Config reloaded = load_config((fs::path(run_dir) / "config.json").string(), {});
  EXPECT_EQ(first_difference(reloaded.resolved, original.resolved), "");
  EXPECT_EQ(config_hash(reloaded), config_hash(original));
}

TEST(TrainerRunDirectory, ManifestNamesCommitConfigVersionsHostsAndLayout) {
  TempDir tmp("trainer");
  const std::string run_dir = tmp / "run";
  run_train(options_for(run_dir, tiny_overrides()));
  const json manifest = read_json((fs::path(run_dir) / "manifest.json").string());

  ASSERT_TRUE(manifest.contains("git_commit") && manifest.at("git_commit").is_string()) << manifest.dump(2);
  EXPECT_FALSE(manifest.at("git_commit").get<std::string>().empty());

  ASSERT_TRUE(manifest.contains("config_hash") && manifest.at("config_hash").is_string()) << manifest.dump(2);
  EXPECT_EQ(manifest.at("config_hash").get<std::string>(), config_hash(load_config(kTinyConfig, tiny_overrides())));

  ASSERT_TRUE(manifest.contains("versions") && manifest.at("versions").is_object()) << manifest.dump(2);
  EXPECT_FALSE(manifest.at("versions").empty());

  ASSERT_TRUE(manifest.contains("hosts") && manifest.at("hosts").is_array()) << manifest.dump(2);
  ASSERT_EQ(manifest.at("hosts").size(), 1u) << "one rank, one host";
  EXPECT_TRUE(manifest.at("hosts")[0].is_string());
  EXPECT_FALSE(manifest.at("hosts")[0].get<std::string>().empty());

  ASSERT_TRUE(manifest.contains("layout") && manifest.at("layout").is_object()) << manifest.dump(2);
  const json& layout = manifest.at("layout");
  for (const char* axis : {"world", "tp", "pp", "dp", "ep"})
    ASSERT_TRUE(layout.contains(axis) && layout.at(axis).is_number_integer()) << axis << " in " << layout.dump();
  EXPECT_EQ(layout.at("world").get<int64_t>(), 1);

  // The memory estimate (launch/config/memory.h): bytes per category, summing to the total.
  ASSERT_TRUE(manifest.contains("memory") && manifest.at("memory").is_object()) << manifest.dump(2);
  const json& memory = manifest.at("memory");
  int64_t sum = 0;
  for (const char* part : {"parameters", "gradients", "optimizer", "activations", "scratch", "routed_rows",
                           "communication", "device_workspace"}) {
    ASSERT_TRUE(memory.contains(part) && memory.at(part).is_number_integer()) << part << " in " << memory.dump();
    sum += memory.at(part).get<int64_t>();
  }
  EXPECT_GT(memory.at("parameters").get<int64_t>(), 0);
  EXPECT_EQ(memory.at("optimizer").get<int64_t>(), 2 * memory.at("parameters").get<int64_t>()) << "two moments";
  EXPECT_EQ(memory.at("total").get<int64_t>(), sum) << memory.dump();
}

TEST(TrainerRunDirectory, ManifestLayoutMultipliesOutToTheWorld) {
  // parallel.dp = "auto" (the default) is world / (tp * pp); the manifest records the layout the run used.
  TempDir tmp("trainer");
  const std::string run_dir = tmp / "run";
  run_train(options_for(run_dir, tiny_overrides({"train.steps=1"})));
  const json layout = read_json((fs::path(run_dir) / "manifest.json").string()).at("layout");
  EXPECT_EQ(layout.at("dp").get<int64_t>(), 1) << "dp = \"auto\" on one rank is 1; layout: " << layout.dump();
  EXPECT_EQ(layout.at("tp").get<int64_t>() * layout.at("pp").get<int64_t>() * layout.at("dp").get<int64_t>(),
            layout.at("world").get<int64_t>())
      << layout.dump();
}

// ---- Learning ------------------------------------------------------------------------------------------------

TEST(TrainerLearning, LossFallsOnATinyModel) {
  TempDir tmp("trainer");
  const std::vector<double> losses = training_losses(train(
      tmp / "run", tiny_overrides({"train.steps=40", "train.seq_len=32", "train.eval_every=0", "optim.lr=3e-3"})));
  ASSERT_EQ(losses.size(), 40u);
  // A fresh model predicts nearly uniformly over the 256 byte tokens.
  EXPECT_NEAR(losses.front(), std::log(256.0), 0.2);
  double last5 = 0;
  for (size_t i = losses.size() - 5; i < losses.size(); ++i) last5 += losses[i] / 5;
  EXPECT_LT(last5, losses.front() - 0.5) << "first loss " << losses.front() << ", mean of the last 5 " << last5;
}

// Multi-head latent attention learns like multi-head attention: the same run with model.attention = mla
// falls from about log 256 by at least 80% of what the mha run falls (measured: 1.66 against 1.75, 95%), and
// both by more than 0.5.
TEST(TrainerLearning, LatentAttentionLossFallsLikeMultiHeadAttention) {
  TempDir tmp("trainer");
  auto last5_drop = [&](const std::string& attention) {
    const std::vector<double> losses = training_losses(
        train(tmp / attention, tiny_overrides({"train.steps=40", "train.seq_len=32", "train.eval_every=0",
                                               "optim.lr=3e-3", "model.attention=" + attention, "model.mla.kv_rank=8",
                                               "model.mla.q_rank=16", "model.mla.rope_dim=8"})));
    EXPECT_EQ(losses.size(), 40u);
    EXPECT_NEAR(losses.front(), std::log(256.0), 0.2) << attention;
    double last5 = 0;
    for (size_t i = losses.size() - 5; i < losses.size(); ++i) last5 += losses[i] / 5;
    return losses.front() - last5;
  };
  const double mha = last5_drop("mha"), mla = last5_drop("mla");
  EXPECT_GT(mha, 0.5);
  EXPECT_GT(mla, 0.5);
  EXPECT_GT(mla, 0.8 * mha) << "mha fell " << mha << ", mla " << mla;
}

// ---- Bad input writes nothing ----------------------------------------------------------------------------

// run_train must throw BadInput mentioning `mention`, and leave `run_dir` nonexistent.
void expect_bad_input_writes_nothing(const TrainOptions& options, const std::string& mention) {
  try {
    run_train(options);
    ADD_FAILURE() << "no error; expected BadInput mentioning '" << mention << "'";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::BadInput) << e.message();
    EXPECT_NE(e.message().find(mention), std::string::npos) << "message lacks '" << mention << "': " << e.message();
  }
  EXPECT_FALSE(fs::exists(options.run_dir)) << options.run_dir << " was created";
}

TEST(TrainerBadInput, UnknownKeyLeavesTheRunDirectoryUnwritten) {
  TempDir tmp("trainer");
  expect_bad_input_writes_nothing(options_for(tmp / "run", tiny_overrides({"model.dmodel=32"})), "model.d_model");
}

TEST(TrainerBadInput, MissingDataFileLeavesTheRunDirectoryUnwritten) {
  // The data is checked after the config and the run directory, but still before anything is written.
  TempDir tmp("trainer");
  const std::string source = R"(data.sources=[{"name": "prose", "path": ")" + (tmp / "missing.txt") + R"("}])";
  expect_bad_input_writes_nothing(options_for(tmp / "run", tiny_overrides({source})), "missing.txt");
}

TEST(TrainerBadInput, MissingCheckpointLeavesTheRunDirectoryUnwritten) {
  TempDir tmp("trainer");
  TrainOptions resume = options_for(tmp / "run", tiny_overrides());
  resume.resume = tmp / "some_checkpoint";
  expect_bad_input_writes_nothing(resume, "some_checkpoint");
}

TEST(TrainerBadInput, RunDirectoryWithARunIsRefusedWithoutOverwrite) {
  TempDir tmp("trainer");
  const std::string run_dir = tmp / "run";
  run_train(options_for(run_dir, tiny_overrides({"train.steps=2"})));
  const std::vector<std::string> files = {"config.json", "manifest.json", "metrics.jsonl"};
  std::vector<std::string> before;
  for (const std::string& file : files) before.push_back(read_text(tmp / ("run/" + file)));
  try {
    run_train(options_for(run_dir, tiny_overrides({"train.steps=3"})));
    ADD_FAILURE() << "no error; expected BadInput for a run directory that holds a run";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::BadInput) << e.message();
    EXPECT_NE(e.message().find("--overwrite"), std::string::npos) << e.message();
  }
  for (size_t i = 0; i < files.size(); ++i)
    EXPECT_EQ(read_text(tmp / ("run/" + files[i])), before[i]) << files[i] << " changed";

  // With overwrite the run starts again and replaces its files.
  TrainOptions again = options_for(run_dir, tiny_overrides({"train.steps=3"}));
  again.overwrite = true;
  run_train(again);
  EXPECT_EQ(training_losses(read_metrics(run_dir)).size(), 3u);
  EXPECT_EQ(read_json(tmp / "run/config.json").at("train").at("steps"), 3);
}

}  // namespace
}  // namespace moe
