// Tests of the config loader (launch/config.h): defaults, every validation rule with the key and value in
// its message, --set, malformed, oversized, deep and non-regular files, docs/config.md against its
// generator, and the repo's configs/*.json; and the writability checks of the run directory and the
// checkpoint roots (launch/run_dir.h). It does not test what the trainer does with the values.
#include <gtest/gtest.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>

#include "core/error.h"
#include "launch/config.h"
#include "launch/run_dir.h"

namespace moe {
namespace {

using json = nlohmann::json;

// Runs `load`, expects a BadInput whose message contains every one of `parts`.
void expect_bad_input(const std::function<void()>& load, const std::vector<std::string>& parts) {
  try {
    load();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::BadInput) << e.message();
    for (const std::string& part : parts)
      EXPECT_NE(e.message().find(part), std::string::npos) << "message lacks '" << part << "':\n" << e.message();
    return;
  }
  ADD_FAILURE() << "no error; expected one mentioning " << (parts.empty() ? "" : parts[0]);
}

Config from(const json& document, const std::vector<std::string>& overrides = {}) {
  return config_from_json(document, overrides, "test.json");
}

// {"a": {"b": value}} from "a.b".
json document_with(const std::string& key, const json& value) {
  std::string pointer = "/" + key;
  std::replace(pointer.begin(), pointer.end(), '.', '/');
  json document = json::object();
  document[json::json_pointer(pointer)] = value;
  return document;
}

std::string write_temp(const std::string& name, const std::string& text) {
  const auto path = std::filesystem::temp_directory_path() / ("moe_test_config_" + std::to_string(::getpid()) + name);
  std::ofstream(path) << text;
  return path.string();
}

TEST(ConfigDefaults, EmptyDocumentGivesTheSmallCpuModel) {
  const Config c = from(json::object());
  EXPECT_EQ(c.train.steps, 300);
  EXPECT_EQ(c.train.seed, 1234u);
  EXPECT_EQ(c.train.global_batch, 16);
  EXPECT_EQ(c.train.micro_batch, 4);
  EXPECT_EQ(c.train.seq_len, 128);
  EXPECT_EQ(c.train.recompute, "none");
  EXPECT_EQ(c.train.recompute_layers, -1);
  EXPECT_EQ(c.train.eval_every, 100);
  EXPECT_EQ(c.train.threads, 0);
  EXPECT_EQ(c.model.vocab, 256);
  EXPECT_EQ(c.model.d_model, 128);
  EXPECT_EQ(c.model.ffn_hidden, 384);
  EXPECT_EQ(c.moe.num_experts, 0);
  EXPECT_EQ(c.moe.top_k, 2);
  EXPECT_EQ(c.moe.router.noise, "none");
  EXPECT_EQ(c.moe.router.score, "softmax");
  EXPECT_TRUE(c.moe.router.normalize);
  EXPECT_DOUBLE_EQ(c.moe.capacity_factor, 1.25);
  EXPECT_EQ(c.moe.overflow, std::vector<std::string>{"drop"});
  EXPECT_DOUBLE_EQ(c.moe.loss.aux, 0.01);
  EXPECT_DOUBLE_EQ(c.moe.loss.death_floor, 0.01);
  EXPECT_DOUBLE_EQ(c.optim.lr, 3e-3);
  EXPECT_DOUBLE_EQ(c.optim.min_lr, 3e-4);
  EXPECT_DOUBLE_EQ(c.optim.eps, 1e-8);
  EXPECT_FALSE(c.optim.zero);
  EXPECT_EQ(c.parallel.tp, 1);
  EXPECT_EQ(c.parallel.dp, 0);  // "auto"
  EXPECT_TRUE(c.parallel.sequence_parallel);
  EXPECT_EQ(c.parallel.expert_tp, 1);
  EXPECT_EQ(c.checkpoint.dir, "checkpoints");
  EXPECT_EQ(c.checkpoint.keep, 2);
  EXPECT_DOUBLE_EQ(c.fault.heartbeat_timeout_s, 30.0);
  EXPECT_EQ(c.fault.max_restarts, 3);
  EXPECT_TRUE(c.data.sources.empty());
  EXPECT_DOUBLE_EQ(c.data.heldout_fraction, 0.05);
}

TEST(ConfigDefaults, ResolvedHasEveryKeyNested) {
  const json& r = from(json::object()).resolved;
  EXPECT_EQ(r.at("moe").at("router").at("bias_balance").at("rate"), 0.0);
  EXPECT_EQ(r.at("parallel").at("dp"), "auto");
  EXPECT_EQ(r.at("data").at("sources"), json::array());
  EXPECT_TRUE(r.at("moe").at("router").at("tau").is_number_float());
  EXPECT_FALSE(r.contains("moe.router.tau"));
  EXPECT_EQ(r.size(), 9u);  // the sections
}

TEST(ConfigDefaults, ResolvedLoadsBackToItself) {
  const Config first = from(document_with("train.steps", 7), {"data.sources=[{\"name\":\"a\",\"path\":\"a.txt\"}]"});
  EXPECT_EQ(from(first.resolved).resolved, first.resolved);
  EXPECT_EQ(first.resolved["data"]["sources"][0]["weight"], 1.0);
}

TEST(ConfigLoad, FileValuesAndOverrides) {
  const std::string path = write_temp("ok.json", R"({"train": {"steps": 5, "seed": 9}, "optim": {"lr": 1}})");
  const Config c = load_config(path, {"train.steps=6", "moe.router.noise=gumbel", "parallel.dp=auto"});
  EXPECT_EQ(c.train.steps, 6);
  EXPECT_EQ(c.train.seed, 9u);
  EXPECT_DOUBLE_EQ(c.optim.lr, 1.0);  // numbers accept integers
  EXPECT_EQ(c.moe.router.noise, "gumbel");
  EXPECT_EQ(c.parallel.dp, 0);
  std::filesystem::remove(path);
}

TEST(ConfigTypes, IntegersMustBeJsonIntegers) {
  expect_bad_input([] { from(document_with("train.steps", 3.0)); }, {"train.steps", "3.0", "integer", "test.json"});
  expect_bad_input([] { from(document_with("train.steps", "3")); }, {"train.steps", "\"3\"", "integer"});
  expect_bad_input([] { from(document_with("model.layers", true)); }, {"model.layers", "true", "integer"});
}

TEST(ConfigTypes, OtherTypes) {
  expect_bad_input([] { from(document_with("optim.lr", "fast")); }, {"optim.lr", "\"fast\"", "number"});
  expect_bad_input([] { from(document_with("optim.zero", 1)); }, {"optim.zero", "1", "true or false"});
  expect_bad_input([] { from(document_with("checkpoint.dir", 5)); }, {"checkpoint.dir", "5", "string"});
  expect_bad_input([] { from(document_with("checkpoint.dir", "")); }, {"checkpoint.dir", "non-empty"});
  expect_bad_input([] { from(document_with("parallel.dp", "all")); }, {"parallel.dp", "\"all\"", "\"auto\""});
}

TEST(ConfigTypes, ChoicesListTheAllowedValues) {
  expect_bad_input([] { from(document_with("moe.router.noise", "gauss")); },
                   {"moe.router.noise", "\"gauss\"", "\"gumbel\", \"none\""});
  expect_bad_input([] { from(document_with("moe.overflow", "spill")); },
                   {"moe.overflow", "\"drop\", \"reroute\", \"dense\""});
  expect_bad_input([] { from(document_with("train.recompute", "some")); },
                   {"train.recompute", "\"none\", \"selective\", \"full\""});
  expect_bad_input([] { from(document_with("moe.router.score", 1)); }, {"moe.router.score", "\"softmax\""});
  expect_bad_input([] { from(document_with("moe.drop_policy", "random")); }, {"moe.drop_policy", "\"position\""});
}

TEST(ConfigRanges, EachBoundIsEnforced) {
  struct Case {
    std::string key;
    json value;
    std::string expected;
  };
  const std::vector<Case> cases = {
      {"train.steps", 0, ">= 1"},
      {"train.seed", -1, ">= 0"},
      {"train.global_batch", 0, ">= 1"},
      {"train.micro_batch", 0, ">= 1"},
      {"train.seq_len", 1, ">= 2"},
      {"train.log_every", 0, ">= 1"},
      {"train.eval_every", -1, ">= 0"},
      {"train.eval_sequences", 0, ">= 1"},
      {"train.threads", -2, ">= 0"},
      {"train.recompute_layers", -2, ">= -1"},
      {"model.vocab", 1, ">= 2"},
      {"model.d_model", 0, ">= 1"},
      {"model.layers", 0, ">= 1"},
      {"model.heads", 0, ">= 1"},
      {"model.ffn_hidden", 0, ">= 1"},
      {"moe.num_experts", -1, ">= 0"},
      {"moe.top_k", 0, ">= 1"},
      {"moe.every", 0, ">= 1"},
      {"moe.expert_hidden", 0, ">= 1"},
      {"moe.shared_experts", -1, ">= 0"},
      {"moe.fallback_hidden", 0, ">= 1"},
      {"moe.router.tau", 0, "> 0"},
      {"moe.router.bias_balance.rate", -0.1, ">= 0"},
      {"moe.expert_dropout", 1, "in [0, 1)"},
      {"moe.loss.aux", -1, ">= 0"},
      {"moe.loss.z", -1, ">= 0"},
      {"moe.loss.death", -1, ">= 0"},
      {"moe.loss.death_floor", 1.5, "in [0, 1]"},
      {"optim.lr", 0, "> 0"},
      {"optim.min_lr", -1e-3, ">= 0"},
      {"optim.warmup", -1, ">= 0"},
      {"optim.weight_decay", -1, ">= 0"},
      {"optim.beta1", 1.0, "in [0, 1)"},
      {"optim.beta2", -0.5, "in [0, 1)"},
      {"optim.eps", 0, "> 0"},
      {"optim.clip", -1, ">= 0"},
      {"optim.per_expert_clip", -1, ">= 0"},
      {"parallel.tp", 0, ">= 1"},
      {"parallel.pp", 0, ">= 1"},
      {"parallel.ep", 0, ">= 1"},
      {"parallel.dp", 0, ">= 1 or \"auto\""},
      {"checkpoint.every", -1, ">= 0"},
      {"checkpoint.keep", 0, ">= 1"},
      {"fault.heartbeat_timeout_s", 0, "> 0"},
      {"fault.max_restarts", -1, ">= 0"},
      {"data.heldout_fraction", 0, "in (0, 0.5]"},
      {"data.heldout_fraction", 0.6, "in (0, 0.5]"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.key);
    expect_bad_input([&] { from(document_with(c.key, c.value)); }, {c.key, c.value.dump(), c.expected, "test.json"});
  }
}

// Limits of the code itself are ranges of the schema, refused with the key, the value and the range.
TEST(ConfigRanges, LimitsOfTheCodeAreInTheSchema) {
  struct Case {
    std::string key;
    json value;
    std::string expected;
  };
  const std::vector<Case> cases = {
      {"moe.num_experts", 2048, "an integer >= 0 and <= 1024"},
      {"moe.top_k", 1025, "an integer >= 1 and <= 1024"},
      {"train.steps", 100000000, "an integer >= 1 and <= 99999999"},
      {"train.threads", int64_t(1) << 32, "<= 2147483647"},
      {"model.vocab", int64_t(1) << 31, "<= 2147483647"},
      {"fault.heartbeat_interval_s", 0, "a number in [0.001, 60]"},
      {"fault.heartbeat_interval_s", 1e300, "a number in [0.001, 60]"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.key);
    expect_bad_input([&] { from(document_with(c.key, c.value)); }, {c.key, c.value.dump(), c.expected, "test.json"});
  }
  // The bounds themselves are allowed.
  EXPECT_EQ(from(json{{"moe", {{"num_experts", 1024}, {"top_k", 1024}}}}).moe.num_experts, 1024);
  EXPECT_EQ(from(document_with("train.steps", 99999999)).train.steps, 99999999);
}

TEST(ConfigRules, HeartbeatIntervalBelowTimeout) {
  expect_bad_input(
      [] {
        from(json{{"fault", {{"heartbeat_interval_s", 10}, {"heartbeat_timeout_s", 5}}}});
      },
      {"fault.heartbeat_interval_s = 10", "fault.heartbeat_timeout_s = 5", "lower the interval"});
  EXPECT_NO_THROW(from(json{{"fault", {{"heartbeat_interval_s", 4}, {"heartbeat_timeout_s", 5}}}}));
}

TEST(ConfigRules, AllToAllCountFitsAnInt) {
  const json big = {{"train", {{"micro_batch", 64}, {"global_batch", 64}, {"seq_len", 4096}}},
                    {"model", {{"d_model", 1024}}},
                    {"moe", {{"num_experts", 8}, {"top_k", 8}}}};
  EXPECT_NO_THROW(from(big));  // one rank per expert group: no all-to-all
  expect_bad_input([&] { from(big, {"parallel.ep=2"}); },
                   {"64 * 4096 * 8 * 1024 = 2147483648", "parallel.ep = 2", "lower train.micro_batch"});
  EXPECT_NO_THROW(from(big, {"parallel.ep=2", "train.seq_len=2048"}));
}

TEST(ConfigRules, SourceWeightsSumToAFiniteNumber) {
  const json sources = json::parse(R"([{"name": "a", "path": "a.txt", "weight": 1e308},
                                       {"name": "b", "path": "b.txt", "weight": 1e308}])");
  expect_bad_input([&] { from(document_with("data.sources", sources)); },
                   {"data.sources[1].weight = 1e+308", "sum is finite", "scale them all down"});
}

TEST(ConfigRanges, UnboundedNumbersTakeAnySign) {
  const Config c = from(json{{"moe", {{"capacity_factor", -1}, {"loss", {{"entropy", -0.5}}}}}});
  EXPECT_DOUBLE_EQ(c.moe.capacity_factor, -1.0);
  EXPECT_DOUBLE_EQ(c.moe.loss.entropy, -0.5);
}

TEST(ConfigKeys, UnknownKeySuggestsTheNearest) {
  expect_bad_input([] { from(document_with("train.stepz", 5)); },
                   {"unknown key 'train.stepz' in test.json; did you mean 'train.steps'?"});
  expect_bad_input([] { from(document_with("moe.router.nois", "gumbel")); }, {"did you mean 'moe.router.noise'?"});
  expect_bad_input([] { from(document_with("trian.steps", 5)); }, {"unknown key 'trian'", "did you mean 'train'?"});
  // A key in the wrong section is found by its own name.
  expect_bad_input([] { from(json{{"steps", 5}}); }, {"unknown key 'steps'", "did you mean 'train.steps'?"});
  expect_bad_input([] { from(document_with("moe.tau", 1)); }, {"did you mean 'moe.router.tau'?"});
  // Nothing close: the section's keys are listed.
  expect_bad_input([] { from(document_with("optim.learning_rate_schedule", 1)); },
                   {"unknown key 'optim.learning_rate_schedule'", "the keys of 'optim' are lr, min_lr"});
}

TEST(ConfigKeys, SectionsMustBeObjects) {
  expect_bad_input([] { from(json{{"train", 5}}); }, {"'train' = 5", "is a section", "steps"});
  expect_bad_input([] { from(document_with("moe.router", "softmax")); }, {"'moe.router'", "is a section", "tau"});
  expect_bad_input([] { from(json::array()); }, {"test.json", "expected a JSON object"});
  expect_bad_input([] { from(json{{"train.steps", 5}}); }, {"'train.steps'", "nested objects"});
}

TEST(ConfigRules, HeadsDivideWidth) {
  expect_bad_input(
      [] {
        from(json{{"model", {{"d_model", 100}, {"heads", 3}}}});
      },
      {"model.d_model = 100 (in test.json)", "model.heads = 3 (in test.json)", "multiple"});
}

TEST(ConfigRules, HeadDimensionEven) {
  expect_bad_input([] { from(document_with("model.d_model", 12)); },
                   {"head dimension 3", "model.d_model = 12", "model.heads = 4 (default)", "even", "rotary"});
}

TEST(ConfigRules, MicroBatchesFillTheStep) {
  expect_bad_input([] { from(document_with("train.global_batch", 10)); },
                   {"train.global_batch = 10", "train.micro_batch = 4 (default)", "multiple"});
}

TEST(ConfigRules, MinLrAtMostLr) {
  expect_bad_input([] { from(document_with("optim.min_lr", 0.01)); }, {"optim.min_lr = 0.01", "optim.lr = 0.003"});
}

TEST(ConfigRules, VocabCoversBytes) {
  expect_bad_input([] { from(document_with("model.vocab", 100)); }, {"model.vocab = 100", "256", "byte"});
}

TEST(ConfigRules, TopKAtMostExperts) {
  expect_bad_input(
      [] {
        from(json{{"moe", {{"num_experts", 2}, {"top_k", 3}}}});
      },
      {"moe.top_k = 3", "moe.num_experts = 2"});
  // With no experts top_k is unused, so its default is no error.
  EXPECT_NO_THROW(from(document_with("moe.top_k", 8)));
}

TEST(ConfigRules, MoeEveryAtMostLayers) {
  expect_bad_input([] { from(document_with("moe.every", 5)); }, {"moe.every = 5", "model.layers = 4 (default)"});
}

TEST(ConfigRules, RecomputeModesAndLayers) {
  const Config selective = from(json{{"train", {{"recompute", "selective"}, {"recompute_layers", 2}}}});
  EXPECT_EQ(selective.train.recompute, "selective");
  EXPECT_EQ(selective.train.recompute_layers, 2);
  EXPECT_EQ(from(document_with("train.recompute_layers", 4)).train.recompute_layers, 4);  // every one of 4 layers
  expect_bad_input([] { from(document_with("train.recompute_layers", 5)); },
                   {"train.recompute_layers = 5 (in test.json)", "model.layers = 4 (default)"});
  expect_bad_input(
      [] {
        from(json::object(), {"train.recompute_layers=9", "model.layers=8"});
      },
      {"train.recompute_layers = 9 (in --set train.recompute_layers=9)", "model.layers = 8"});
}

TEST(ConfigRules, DataSources) {
  const Config c = from(document_with(
      "data.sources", json::parse(R"([{"name": "a", "path": "a.txt", "weight": 2}, {"name": "b", "path": "b.txt"}])")));
  ASSERT_EQ(c.data.sources.size(), 2u);
  EXPECT_EQ(c.data.sources[0].path, "a.txt");
  EXPECT_DOUBLE_EQ(c.data.sources[0].weight, 2.0);
  EXPECT_DOUBLE_EQ(c.data.sources[1].weight, 1.0);
  auto with_sources = [](const char* text) { return document_with("data.sources", json::parse(text)); };
  expect_bad_input([&] { from(with_sources(R"([{"name": "a", "path": "x"}, {"name": "a", "path": "y"}])")); },
                   {"data.sources[1].name = \"a\"", "unique", "data.sources[0]"});
  expect_bad_input([&] { from(with_sources(R"([{"name": "", "path": "x"}])")); },
                   {"data.sources[0].name = \"\"", "non-empty"});
  expect_bad_input([&] { from(with_sources(R"([{"path": "x"}])")); }, {"data.sources[0]", "no \"name\""});
  expect_bad_input([&] { from(with_sources(R"([{"name": "a", "path": "x", "weight": 0}])")); },
                   {"data.sources[0].weight = 0", "> 0"});
  expect_bad_input([&] { from(with_sources(R"([{"name": "a", "path": "x", "wieght": 2}])")); },
                   {"unknown key 'data.sources[0].wieght'", "did you mean 'data.sources[0].weight'?"});
  expect_bad_input([&] { from(with_sources(R"([5])")); }, {"data.sources[0] = 5", "object"});
  expect_bad_input([&] { from(with_sources(R"({"name": "a"})")); }, {"data.sources", "list of sources"});
}

TEST(ConfigRules, DataSchedule) {
  const Config c = from(json::object(), {R"(data.schedule=[{"step": 1, "weights": {"prose": 1}},)"
                                         R"( {"step": 500, "weights": {"prose": 1, "code": 0.5}}])"});
  ASSERT_EQ(c.data.schedule.size(), 2u);
  EXPECT_EQ(c.data.schedule[1].step, 500);
  ASSERT_EQ(c.data.schedule[1].weights.size(), 2u);
  EXPECT_DOUBLE_EQ(c.data.schedule[1].weights[0].second + c.data.schedule[1].weights[1].second, 1.5);
  auto with = [](const char* text) { return document_with("data.schedule", json::parse(text)); };
  expect_bad_input(
      [&] { from(with(R"([{"step": 5, "weights": {"prose": 1}}, {"step": 5, "weights": {"code": 1}}])")); },
      {"data.schedule[1].step = 5", "increasing order"});
  expect_bad_input([&] { from(with(R"([{"step": 0, "weights": {"prose": 1}}])")); },
                   {"data.schedule[0].step = 0", "integer >= 1"});
  expect_bad_input([&] { from(with(R"([{"step": 1, "weights": {"prose": -1}}])")); },
                   {"data.schedule[0].weights.prose = -1", ">= 0"});
  expect_bad_input([&] { from(with(R"([{"step": 1, "weights": {"prose": 0}}])")); }, {"every weight is 0"});
  expect_bad_input([&] { from(with(R"([{"step": 1}])")); }, {"data.schedule[0]", "\"weights\""});
  expect_bad_input([&] { from(with(R"([{"step": 1, "weights": {"wiki": 1}}])")); },
                   {"data.schedule[0].weights names source \"wiki\"", "\"prose\", \"code\", \"arithmetic\""});
  json document = with(R"([{"step": 1, "weights": {"wiki": 1}}])");
  document["data"]["sources"] = json::parse(R"([{"name": "wiki", "path": "w.txt"}])");
  EXPECT_EQ(from(document).data.schedule[0].weights[0].first, "wiki");
}

TEST(ConfigGates, UnavailableFeaturesAreRejected) {
  EXPECT_EQ(from(document_with("parallel.tp", 2)).parallel.tp, 2);  // tensor parallelism has landed
  // and splitting the experts over it too
  EXPECT_EQ(from(json{{"parallel", {{"tp", 2}, {"expert_tp", 2}}}, {"moe", {{"num_experts", 4}}}}).parallel.expert_tp,
            2);
  EXPECT_EQ(from(document_with("parallel.pp", 4)).parallel.pp, 4);  // and pipeline parallelism
  EXPECT_EQ(from(document_with("parallel.ep", 2)).parallel.ep, 2);  // expert and data parallelism have landed
  EXPECT_EQ(from(document_with("parallel.dp", 2)).parallel.dp, 2);
  EXPECT_EQ(from(document_with("parallel.dp", 1)).parallel.dp, 1);
  EXPECT_EQ(from(json{{"moe", {{"num_experts", 4}}}}).moe.num_experts, 4);  // MoE layers have landed
}

// Pipeline stages: an even split needs pp to divide model.layers; parallel.pp_layers gives each stage's count.
TEST(ConfigRules, PipelineStagesCoverTheLayers) {
  expect_bad_input([] { from(document_with("parallel.pp", 3)); },
                   {"model.layers = 4", "parallel.pp = 3", "parallel.pp_layers"});
  EXPECT_EQ(from(json{{"parallel", {{"pp", 3}, {"pp_layers", {1, 2, 1}}}}}).parallel.pp_layers,
            (std::vector<int64_t>{1, 2, 1}));
  expect_bad_input(
      [] {
        from(json{{"parallel", {{"pp", 2}, {"pp_layers", {1, 2}}}}});
      },
      {"parallel.pp_layers = [1,2]", "parallel.pp = 2", "model.layers = 4", "summing to 4"});
  expect_bad_input(
      [] {
        from(json{{"parallel", {{"pp", 3}, {"pp_layers", {2, 2}}}}});
      },
      {"parallel.pp_layers", "expected 3 entries"});
  expect_bad_input(
      [] {
        from(json{{"parallel", {{"pp", 2}, {"pp_layers", {4, 0}}}}});
      },
      {"parallel.pp_layers", ">= 1"});
  expect_bad_input([] { from(document_with("parallel.pp_layers", "2,2")); },
                   {"parallel.pp_layers", "list of integers"});
}

// A tensor-parallel config that splits something unevenly is refused by name; one that passes every rule
// is accepted (or, with parallel.expert_tp = tp, reaches the gate that still refuses split experts).

TEST(ConfigRules, TensorParallelSplitsWholeHeads) {
  expect_bad_input([] { from(document_with("parallel.tp", 8)); },
                   {"model.heads = 4 (default) is not a multiple of parallel.tp = 8 (in test.json)", "attention heads",
                    "divisible by 8"});
  EXPECT_EQ(from(document_with("parallel.tp", 4)).parallel.tp, 4);
}

TEST(ConfigRules, TensorParallelSplitsTheVocabulary) {
  expect_bad_input(
      [] {
        from(json{{"parallel", {{"tp", 2}}}, {"model", {{"vocab", 257}}}});
      },
      {"model.vocab = 257 (in test.json)", "parallel.tp = 2 (in test.json)", "embedding", "head"});
  EXPECT_EQ(from(json{{"parallel", {{"tp", 2}}}, {"model", {{"vocab", 258}}}}).model.vocab, 258);
}

TEST(ConfigRules, TensorParallelSplitsTheDenseMlp) {
  expect_bad_input(
      [] {
        from(json{{"parallel", {{"tp", 2}}}, {"model", {{"ffn_hidden", 383}}}});
      },
      {"model.ffn_hidden = 383 (in test.json)", "parallel.tp = 2", "dense MLP"});
  // Every FFN an MoE layer: the dense MLP's width is unused, so it need not split.
  const json all_moe = {{"parallel", {{"tp", 2}}}, {"model", {{"ffn_hidden", 383}}}, {"moe", {{"num_experts", 4}}}};
  EXPECT_EQ(from(all_moe).model.ffn_hidden, 383);
  expect_bad_input([&] { from(all_moe, {"moe.every=2"}); }, {"model.ffn_hidden = 383", "parallel.tp = 2"});
}

TEST(ConfigRules, TensorParallelExpertsSplitOnlyWithExpertTp) {
  const json moe = {{"parallel", {{"tp", 2}}}, {"moe", {{"num_experts", 4}, {"expert_hidden", 127}}}};
  EXPECT_EQ(from(moe).moe.expert_hidden, 127);  // parallel.expert_tp = 1: experts stay whole
  expect_bad_input([&] { from(moe, {"parallel.expert_tp=2"}); },
                   {"moe.expert_hidden = 127 (in test.json)", "parallel.tp = 2 (in test.json)",
                    "parallel.expert_tp = 2 (in --set parallel.expert_tp=2)", "routed expert's hidden width"});
  // The shared experts and the dense fallback split their hidden width with the experts.
  expect_bad_input(
      [&] {
        from(moe, {"parallel.expert_tp=2", "moe.expert_hidden=128", "moe.shared_experts=1", "moe.overflow=dense",
                   "moe.fallback_hidden=63"});
      },
      {"moe.fallback_hidden = 63", "parallel.tp = 2", "dense fallback"});
  EXPECT_EQ(from(moe, {"parallel.expert_tp=2", "moe.expert_hidden=128", "moe.shared_experts=1", "moe.overflow=dense",
                       "moe.fallback_hidden=64"})
                .parallel.expert_tp,
            2);
  // Split experts see the whole routing group on every rank: its tokens need not divide by tp.
  EXPECT_EQ(from(moe, {"parallel.expert_tp=2", "moe.expert_hidden=128", "parallel.sequence_parallel=false",
                       "train.seq_len=127", "train.micro_batch=1"})
                .train.seq_len,
            127);
}

TEST(ConfigRules, ExpertTpIsOneOrTp) {
  expect_bad_input(
      [] {
        from(json{{"parallel", {{"tp", 4}, {"expert_tp", 2}}}});
      },
      {"parallel.expert_tp = 2 (in test.json)", "parallel.tp = 4 (in test.json)", "expected 1", "or 4 = parallel.tp"});
  expect_bad_input([] { from(document_with("parallel.expert_tp", 2)); },
                   {"parallel.expert_tp = 2", "parallel.tp = 1 (default)", "expected 1"});
  EXPECT_EQ(from(json{{"parallel", {{"tp", 4}, {"expert_tp", 4}}}}).parallel.expert_tp, 4);
  expect_bad_input([] { from(document_with("parallel.expert_tp", 0)); }, {"parallel.expert_tp = 0", ">= 1"});
  EXPECT_EQ(from(document_with("parallel.expert_tp", 1)).parallel.expert_tp, 1);
}

TEST(ConfigRules, SequenceParallelSplitsTheSequence) {
  const json odd = {{"parallel", {{"tp", 2}}}, {"train", {{"seq_len", 127}}}};
  expect_bad_input([&] { from(odd); }, {"train.seq_len = 127 (in test.json)", "parallel.tp = 2 (in test.json)",
                                        "parallel.sequence_parallel = true (default)", "sequence_parallel = false"});
  EXPECT_FALSE(from(odd, {"parallel.sequence_parallel=false"}).parallel.sequence_parallel);
  // With experts the micro-batch's tokens (the routing group) are split over the tp ranks all the same.
  expect_bad_input(
      [&] {
        from(odd, {"parallel.sequence_parallel=false", "moe.num_experts=4", "train.micro_batch=1"});
      },
      {"train.micro_batch = 1", "train.seq_len = 127", "= 127 tokens", "parallel.tp = 2", "routing group"});
  // Without tensor parallelism nothing is split, whatever sequence_parallel says.
  EXPECT_FALSE(
      from(document_with("train.seq_len", 127), {"parallel.sequence_parallel=false"}).parallel.sequence_parallel);
  EXPECT_EQ(from(document_with("train.seq_len", 127)).train.seq_len, 127);
}

// ---- Routing techniques and latent attention (docs/moe.md, docs/model.md) ----------------------------------

TEST(ConfigRouting, OverflowIsAPolicyOrACascadeThatReroutesFirst) {
  EXPECT_EQ(from(json::object(), {"moe.overflow=reroute"}).moe.overflow, std::vector<std::string>{"reroute"});
  const Config cascade = from(json::object(), {R"(moe.overflow=["reroute", "dense"])"});
  EXPECT_EQ(cascade.moe.overflow, (std::vector<std::string>{"reroute", "dense"}));
  EXPECT_TRUE(cascade.moe.overflow_has("dense") && cascade.moe.overflow_has("reroute"));
  EXPECT_EQ(cascade.resolved["moe"]["overflow"], json({"reroute", "dense"}));
  expect_bad_input(
      [] {
        from(document_with("moe.overflow", json({"reroute", "spill"})));
      },
      {"moe.overflow", "[\"reroute\",\"spill\"]", "\"drop\", \"reroute\", \"dense\"", "list"});
  expect_bad_input([] { from(document_with("moe.overflow", json::array())); }, {"moe.overflow", "non-empty list"});
  expect_bad_input([] { from(document_with("moe.overflow", json({"reroute", "reroute"}))); }, {"appears twice"});
  expect_bad_input(
      [] {
        from(document_with("moe.overflow", json({"dense", "reroute"})));
      },
      {"moe.overflow = [\"dense\",\"reroute\"]", "reroutes first", "nothing can follow"});
}

TEST(ConfigRouting, TemperatureScheduleIsIncreasingPointsInterpolatedLinearly) {
  const Config c = from(document_with("moe.router.tau_schedule", json::parse(R"([{"step": 10, "tau": 2.0},
                                                                                {"step": 30, "tau": 1.0}])")));
  ASSERT_EQ(c.moe.router.tau_schedule.size(), 2u);
  EXPECT_EQ(c.moe.router.tau_at(0), 2.0);
  EXPECT_EQ(c.moe.router.tau_at(10), 2.0);
  EXPECT_EQ(c.moe.router.tau_at(20), 1.5);
  EXPECT_EQ(c.moe.router.tau_at(30), 1.0);
  EXPECT_EQ(c.moe.router.tau_at(1000), 1.0);
  EXPECT_EQ(from(json::object()).moe.router.tau_at(7), 1.0);  // no schedule: moe.router.tau
  expect_bad_input([] { from(document_with("moe.router.tau_schedule", json::parse(R"([{"step": 5, "tau": 0}])"))); },
                   {"moe.router.tau_schedule[0].tau = 0", "> 0"});
  expect_bad_input(
      [] {
        from(
            document_with("moe.router.tau_schedule", json::parse(R"([{"step": 5, "tau": 1}, {"step": 5, "tau": 2}])")));
      },
      {"moe.router.tau_schedule[1].step = 5", "steps increase"});
  expect_bad_input([] { from(document_with("moe.router.tau_schedule", json::parse(R"([{"step": 5}])"))); },
                   {"moe.router.tau_schedule[0]", "\"tau\""});
}

TEST(ConfigRouting, LearnedTemperatureRange) {
  expect_bad_input(
      [] {
        from(json::object(), {"moe.router.tau_learned=true", "moe.router.tau=20"});
      },
      {"moe.router.tau = 20", "moe.router.tau_learned = true", "[0.1, 10]"});
  expect_bad_input(
      [] {
        from(json::object(), {"moe.router.tau_min=2", "moe.router.tau_max=1"});
      },
      {"moe.router.tau_min = 2", "tau_min < tau_max"});
  expect_bad_input(
      [] {
        from(json::object(), {"moe.router.tau_learned=true", R"(moe.router.tau_schedule=[{"step": 0, "tau": 1}])"});
      },
      {"moe.router.tau_schedule", "either scheduled or learned"});
}

TEST(ConfigRouting, AdaptiveCapacityBounds) {
  EXPECT_TRUE(from(json::object(), {"moe.capacity_auto.enabled=true"}).moe.capacity_auto.enabled);
  expect_bad_input(
      [] {
        from(json::object(), {"moe.capacity_auto.enabled=true", "moe.capacity_factor=0"});
      },
      {"moe.capacity_factor = 0", "moe.capacity_auto.enabled = true", "[1, 1.8]"});
  expect_bad_input(
      [] {
        from(json::object(), {"moe.capacity_auto.enabled=true", "moe.capacity_auto.min=2"});
      },
      {"moe.capacity_auto.min = 2", "min <= max"});
  expect_bad_input(
      [] {
        from(json::object(), {"moe.capacity_auto.enabled=true", "moe.capacity_auto.lower_below=0.5"});
      },
      {"moe.capacity_auto.lower_below = 0.5", "lower_below < raise_above"});
  expect_bad_input([] { from(json::object(), {"moe.capacity_auto.window=0"}); },
                   {"moe.capacity_auto.window = 0", ">= 1"});
}

TEST(ConfigRouting, BiasRuleWarmupAndFrequencyAwareClipping) {
  const Config c = from(json::object(), {"moe.router.bias_balance.rule=proportional", "moe.router.warmup.steps=50",
                                         "optim.per_expert_clip_hot=0.5"});
  EXPECT_EQ(c.moe.router.bias_balance_rule, "proportional");
  EXPECT_EQ(c.moe.router.bias_balance_decay, 0.99);
  EXPECT_EQ(c.moe.router.warmup_steps, 50);
  EXPECT_EQ(c.optim.per_expert_clip_hot, 0.5);
  expect_bad_input([] { from(json::object(), {"moe.router.bias_balance.rule=linear"}); },
                   {"moe.router.bias_balance.rule", "\"sign\", \"proportional\""});
  expect_bad_input([] { from(json::object(), {"moe.router.bias_balance.decay=0"}); },
                   {"moe.router.bias_balance.decay = 0", "in (0, 1]"});
  expect_bad_input([] { from(json::object(), {"optim.per_expert_clip_hot=0"}); },
                   {"optim.per_expert_clip_hot = 0", "> 0"});
}

TEST(ConfigRouting, LatentAttention) {
  const Config c = from(json::object(), {"model.attention=mla"});
  EXPECT_EQ(c.model.attention, "mla");
  EXPECT_EQ(c.model.mla_rope_dim, 16);
  expect_bad_input([] { from(json::object(), {"model.attention=gqa"}); }, {"model.attention", "\"mha\", \"mla\""});
  expect_bad_input(
      [] {
        from(json::object(), {"model.attention=mla", "model.mla.rope_dim=7"});
      },
      {"model.mla.rope_dim = 7", "even"});
  expect_bad_input(
      [] {
        from(json::object(), {"model.attention=mla", "parallel.tp=2"});
      },
      {"model.attention = \"mla\"", "parallel.tp = 2", "parallel.tp = 1"});
}

TEST(ConfigSet, OverridesParseAsJsonOrText) {
  const Config c =
      from(json::object(), {"train.steps=5", "moe.router.noise=gumbel", "parallel.dp=auto", "checkpoint.dir=2024",
                            "optim.zero=true", "optim.lr=0.01", "data.sources=[{\"name\": \"a\", \"path\": \"a.txt\"}]",
                            "moe.router={\"tau\": 0.5}", "train.steps=7"});
  EXPECT_EQ(c.train.steps, 7);  // the later --set wins
  EXPECT_EQ(c.moe.router.noise, "gumbel");
  EXPECT_EQ(c.parallel.dp, 0);
  EXPECT_EQ(c.checkpoint.dir, "2024");
  EXPECT_TRUE(c.optim.zero);
  EXPECT_DOUBLE_EQ(c.optim.lr, 0.01);
  ASSERT_EQ(c.data.sources.size(), 1u);
  EXPECT_EQ(c.data.sources[0].name, "a");
  EXPECT_DOUBLE_EQ(c.moe.router.tau, 0.5);
  EXPECT_EQ(c.resolved["checkpoint"]["dir"], "2024");
}

TEST(ConfigSet, OverrideErrors) {
  expect_bad_input([] { from(json::object(), {"train.steps"}); }, {"--set 'train.steps'", "KEY=VALUE"});
  expect_bad_input([] { from(json::object(), {"train.stepz=5"}); },
                   {"unknown key 'train.stepz' in --set train.stepz=5; did you mean 'train.steps'?"});
  expect_bad_input([] { from(json::object(), {"train.steps=five"}); },
                   {"train.steps = \"five\"", "--set train.steps=five", "integer"});
  expect_bad_input([] { from(json::object(), {"train.steps=0"}); }, {"train.steps = 0", "--set", ">= 1"});
  expect_bad_input([] { from(json::object(), {"moe.router.noise=gauss"}); }, {"moe.router.noise", "\"gumbel\""});
  expect_bad_input([] { from(json::object(), {"moe.router=0.5"}); }, {"'moe.router'", "is a section"});
  // Cross-key messages say which value came from where.
  expect_bad_input([] { from(document_with("model.d_model", 96), {"model.heads=5"}); },
                   {"model.d_model = 96 (in test.json)", "model.heads = 5 (in --set model.heads=5)"});
}

TEST(ConfigFile, MalformedJsonNamesLineAndColumn) {
  const std::string path = write_temp("bad.json", "{\n  \"train\": {\n    \"steps\": 5,\n  }\n}\n");
  expect_bad_input([&] { load_config(path, {}); }, {path, "malformed JSON", "line 4, column 3"});
  std::filesystem::remove(path);
  const std::string empty = write_temp("empty.json", "");
  expect_bad_input([&] { load_config(empty, {}); }, {empty, "line 1, column 1"});
  std::filesystem::remove(empty);
}

TEST(ConfigFile, MissingFileAndDuplicateKeys) {
  expect_bad_input([] { load_config("/nonexistent/moe/config.json", {}); },
                   {"'/nonexistent/moe/config.json' does not exist"});
  const std::string path = write_temp("dup.json", R"({"train": {"steps": 5, "steps": 6}})");
  expect_bad_input([&] { load_config(path, {}); }, {"duplicate key 'train.steps'", path});
  std::filesystem::remove(path);
  const std::string sources = write_temp(
      "dup2.json", R"({"data": {"sources": [{"name": "a", "path": "x"}, {"name": "b", "name": "c", "path": "y"}]}})");
  expect_bad_input([&] { load_config(sources, {}); }, {"duplicate key 'data.sources[1].name'"});
  std::filesystem::remove(sources);
}

TEST(ConfigFile, RefusesWhatIsNotARegularFile) {
  expect_bad_input([] { load_config("/dev/zero", {}); }, {"'/dev/zero'", "character device", "regular JSON file"});
  const std::string fifo = write_temp("fifo", "");
  std::filesystem::remove(fifo);
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  // Nobody writes to the FIFO: a loader that opened it for a blocking read would hang here.
  expect_bad_input([&] { load_config(fifo, {}); }, {fifo, "FIFO", "regular JSON file"});
  std::filesystem::remove(fifo);
  const std::string dir = std::filesystem::temp_directory_path().string();
  expect_bad_input([&] { load_config(dir, {}); }, {dir, "is a directory"});
}

TEST(ConfigFile, RefusesAFileOverTheSizeLimit) {
  const std::string path = write_temp("big.json", "{}");
  std::filesystem::resize_file(path, uint64_t(kMaxConfigBytes) + 1);  // sparse: nothing is written to disk
  expect_bad_input([&] { load_config(path, {}); }, {path, std::to_string(kMaxConfigBytes + 1) + " bytes", "16 MiB"});
  std::filesystem::resize_file(path, uint64_t(20) << 20);
  expect_bad_input([&] { load_config(path, {}); }, {path, "20971520 bytes", std::to_string(kMaxConfigBytes)});
  std::filesystem::remove(path);
}

std::string nested_arrays(int64_t depth, const std::string& inside = "") {
  return std::string(size_t(depth), '[') + inside + std::string(size_t(depth), ']');
}

TEST(ConfigFile, RefusesNestingDeeperThanTheLimit) {
  const std::string deep = write_temp("deep.json", nested_arrays(100000));
  expect_bad_input([&] { load_config(deep, {}); }, {deep, "more than 64 levels", "(at '[0][0][0]"});
  std::filesystem::remove(deep);
  // Inside a key, the message says where.
  const std::string in_key = write_temp("deep_key.json", R"({"train": {"steps": )" + nested_arrays(100000) + "}}");
  expect_bad_input([&] { load_config(in_key, {}); }, {in_key, "more than 64 levels", "'train.steps[0][0]"});
  std::filesystem::remove(in_key);
  // 64 levels parse; the value is then judged as usual.
  const std::string limit = write_temp("limit.json", R"({"train": {"steps": )" + nested_arrays(62) + "}}");
  expect_bad_input([&] { load_config(limit, {}); }, {"train.steps = [[[", "expected an integer"});
  std::filesystem::remove(limit);
}

TEST(ConfigSet, ValuesHaveTheFileBounds) {
  expect_bad_input([] { from(json::object(), {"train.steps=" + nested_arrays(100000)}); },
                   {"--set train.steps=[[[", "more than 64 levels"});
  expect_bad_input([] { from(json::object(), {"data.sources=" + std::string(size_t(kMaxConfigBytes) + 1, ' ')}); },
                   {"--set data.sources", std::to_string(kMaxConfigBytes + 1) + " bytes", "16 MiB"});
  // A text key takes the text as it is, however it is bracketed.
  EXPECT_EQ(from(json::object(), {"checkpoint.dir=" + nested_arrays(100)}).checkpoint.dir, nested_arrays(100));
}

// ---- Writability of the run directory and the checkpoint roots (launch/run_dir.h). -------------------

namespace fs = std::filesystem;

// A fresh directory under the temporary folder, removed with everything in it at the end of the test.
class TempDir {
 public:
  TempDir() {
    path_ = fs::temp_directory_path() / ("moe_test_dirs_" + std::to_string(::getpid()) + "_" + std::to_string(next_++));
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::permissions(path_, fs::perms::owner_all, fs::perm_options::add, ec);
    fs::remove_all(path_, ec);
  }
  const fs::path& path() const { return path_; }
  std::string operator/(const std::string& name) const { return (path_ / name).string(); }
  // Every path below the directory, to show that a refusal created nothing.
  std::vector<std::string> tree() const {
    std::vector<std::string> out;
    for (const auto& entry : fs::recursive_directory_iterator(path_)) out.push_back(entry.path().string());
    std::sort(out.begin(), out.end());
    return out;
  }

 private:
  fs::path path_;
  static inline int next_ = 0;
};

TEST(RunDirWritable, NewAndExistingWritableDirectoriesPass) {
  const TempDir tmp;
  EXPECT_NO_THROW(check_dir_writable(tmp / "a/b/c", "--run-dir a/b/c"));
  EXPECT_NO_THROW(check_dir_writable(tmp.path().string(), "--run-dir"));
  EXPECT_NO_THROW(check_run_dir_usable(tmp / "run", false));
  EXPECT_TRUE(tmp.tree().empty());  // the checks create nothing
}

TEST(RunDirWritable, RefusesAPathUnderARegularFile) {
  const TempDir tmp;
  std::ofstream(tmp / "afile") << "x";
  const auto before = tmp.tree();
  expect_bad_input([&] { check_dir_writable(tmp / "afile/run/deeper", "--run-dir X"); },
                   {"--run-dir X", "cannot be created because", "afile is not a directory"});
  expect_bad_input([&] { check_dir_writable(tmp / "afile", "checkpoint.dir (afile)"); },
                   {"checkpoint.dir (afile)", "exists and is not a directory"});
  expect_bad_input([&] { check_run_dir_usable(tmp / "afile/run", true); }, {"--run-dir", "afile/run"});
  EXPECT_EQ(tmp.tree(), before);
}

TEST(RunDirWritable, RefusesANameTheFileSystemCannotHold) {
  const TempDir tmp;
  expect_bad_input([&] { check_dir_writable(tmp / ("run/" + std::string(300, 'n')), "--run-dir long"); },
                   {"--run-dir long", "300 characters", "at most 255"});
  expect_bad_input([&] { check_dir_writable(tmp / std::string(5000, 'x'), "--run-dir longer"); },
                   {"--run-dir longer", "PATH_MAX"});
  EXPECT_TRUE(tmp.tree().empty());
}

TEST(RunDirWritable, RefusesADirectoryWithoutWritePermission) {
  if (::geteuid() == 0) GTEST_SKIP() << "root writes regardless of permissions; the read-only mount test covers root";
  const TempDir tmp;
  fs::create_directories(tmp / "locked");
  fs::permissions(tmp / "locked", fs::perms::owner_read | fs::perms::owner_exec);
  expect_bad_input([&] { check_dir_writable(tmp / "locked/run", "--run-dir R"); },
                   {"--run-dir R", "locked", "not writable", "choose a writable location"});
  expect_bad_input([&] { check_run_dir_usable(tmp / "locked", false); }, {"locked", "not writable"});
  fs::permissions(tmp / "locked", fs::perms::owner_all);
  EXPECT_EQ(tmp.tree(), std::vector<std::string>{tmp / "locked"});
}

// A read-only tmpfs in a mount namespace of this process's own, so it needs no cleanup and is refused
// even as root (statvfs reports ST_RDONLY). Skipped where mounting is not permitted.
TEST(RunDirWritable, RefusesAReadOnlyFileSystemEvenAsRoot) {
  const TempDir tmp;
  fs::create_directories(tmp / "ro");
  if (::unshare(CLONE_NEWNS) != 0 || ::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0 ||
      ::mount("tmpfs", (tmp / "ro").c_str(), "tmpfs", MS_RDONLY, "size=1m") != 0)
    GTEST_SKIP() << "cannot mount a read-only tmpfs here: " << std::strerror(errno);
  expect_bad_input([&] { check_dir_writable(tmp / "ro/run/deeper", "--run-dir D"); },
                   {"--run-dir D", "ro", "read-only file system", "choose a writable location"});
  expect_bad_input([&] { check_run_dir_usable(tmp / "ro", false); }, {"--run-dir", "read-only file system"});
  CheckpointConfig checkpoint;
  checkpoint.every = 1;
  expect_bad_input([&] { check_checkpoint_roots_writable(tmp / "ro/ckpt", checkpoint); },
                   {"checkpoint.dir (" + (tmp / "ro/ckpt") + ")", "read-only file system"});
  checkpoint.replicas = {tmp / "replica", tmp / "ro/replica"};
  expect_bad_input([&] { check_checkpoint_roots_writable(tmp / "ckpt", checkpoint); },
                   {"checkpoint.replicas[1]", "read-only file system"});
  checkpoint.every = 0;  // no checkpoints: nothing to check
  EXPECT_NO_THROW(check_checkpoint_roots_writable(tmp / "ro/ckpt", checkpoint));
  EXPECT_EQ(::umount2((tmp / "ro").c_str(), MNT_DETACH), 0);
  EXPECT_EQ(tmp.tree(), std::vector<std::string>{tmp / "ro"});
}

// docs/config.md is generated; MOE_REGENERATE_DOCS=1 rewrites it instead of comparing.
TEST(ConfigDocs, ReferenceMatchesTheSchema) {
  const std::filesystem::path doc = std::filesystem::path(MOE_SOURCE_DIR) / "docs" / "config.md";
  const std::string expected = config_reference_markdown();
  if (std::getenv("MOE_REGENERATE_DOCS")) {
    std::ofstream(doc, std::ios::binary) << expected;
    GTEST_SKIP() << "rewrote " << doc;
  }
  std::ifstream in(doc, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  EXPECT_EQ(text.str(), expected) << doc << " is out of date; regenerate it with\n  MOE_REGENERATE_DOCS=1 "
                                  << "build/bin/test_config --gtest_filter='ConfigDocs.*'";
  for (const char* key : {"`train.steps`", "`moe.router.bias_balance.rate`", "`parallel.dp`", "`data.sources`"})
    EXPECT_NE(expected.find(key), std::string::npos) << key;
}

TEST(ConfigFiles, EveryRepoConfigLoads) {
  const std::filesystem::path folder = std::filesystem::path(MOE_SOURCE_DIR) / "configs";
  if (!std::filesystem::is_directory(folder)) return;  // no configs yet: nothing to load
  for (const auto& file : std::filesystem::directory_iterator(folder)) {
    if (file.path().extension() != ".json") continue;
    SCOPED_TRACE(file.path().string());
    try {
      load_config(file.path().string(), {});
    } catch (const Error& e) {
      ADD_FAILURE() << e.message();
    }
  }
}

}  // namespace
}  // namespace moe
