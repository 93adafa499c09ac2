// Tests of the rules between config keys (launch/config/config_rules.cpp), each refusal with the keys, their values
// and where they came from in its message: shapes that must divide, recomputation, data sources and the mixing
// schedule, heartbeats, the all-to-all faults' expert group, the all-to-all's element count, pipeline stages, what
// tensor parallelism splits, the routing techniques and latent attention, and the gates of features this build does not
// have yet.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "config_test_util.h"
#include "launch/config/config.h"

namespace moe {
namespace {

using json = nlohmann::json;

using config_test::document_with;
using config_test::expect_bad_input;
using config_test::from;

TEST(ConfigRules, HeartbeatIntervalBelowTimeout) {
  expect_bad_input(
      [] {
        from(json{{"fault", {{"heartbeat_interval_s", 10}, {"heartbeat_timeout_s", 5}}}});
      },
      {"fault.heartbeat_interval_s = 10", "fault.heartbeat_timeout_s = 5", "lower the interval"});
  EXPECT_NO_THROW(from(json{{"fault", {{"heartbeat_interval_s", 4}, {"heartbeat_timeout_s", 5}}}}));
}

TEST(ConfigRules, AllToAllFaultsNeedAnExpertGroup) {
  for (const char* kind : {"freeze_alltoall", "mismatch_alltoall"}) {
    const json inject = json::array({{{"kind", kind}, {"rank", 1}, {"step", 3}}});
    expect_bad_input(
        [&] {
          from(json{{"fault", {{"inject", inject}}}});
        },
        {"fault.inject", kind, "parallel.ep = 1", "set parallel.ep to 2 or more"});
    EXPECT_NO_THROW(from(json{{"fault", {{"inject", inject}}}, {"parallel", {{"ep", 2}}}}));
  }
  EXPECT_NO_THROW(from(json{{"fault", {{"inject", json::array({{{"kind", "hang"}, {"rank", 1}, {"step", 3}}})}}}}));
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

// model.kv_heads: 0 is model.heads; any other value divides the heads, and latent attention takes no other.
TEST(ConfigRules, KeyValueHeadsDivideTheHeads) {
  EXPECT_EQ(from(document_with("model.kv_heads", 0)).model.kv_heads, 4);
  EXPECT_EQ(from(document_with("model.kv_heads", 2)).model.kv_heads, 2);
  EXPECT_EQ(from(document_with("model.kv_heads", 1)).model.kv_heads, 1);
  expect_bad_input([] { from(document_with("model.kv_heads", 3)); },
                   {"model.kv_heads = 3 (in test.json)", "does not divide", "model.heads = 4 (default)"});
  expect_bad_input([] { from(document_with("model.kv_heads", 8)); }, {"model.kv_heads = 8", "does not divide"});
  expect_bad_input([] { from(document_with("model.kv_heads", -1)); }, {"model.kv_heads"});
  expect_bad_input(
      [] {
        from(json{{"model", {{"attention", "mla"}, {"kv_heads", 2}}}});
      },
      {"model.kv_heads = 2 (in test.json)", "model.attention = ", "latent"});
  EXPECT_EQ(from(json{{"model", {{"attention", "mla"}, {"kv_heads", 4}}}}).model.kv_heads, 4);
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
  EXPECT_EQ(selective.train.recompute, Recompute::Selective);
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

// Interleaved stages: vpp chunks per rank need pp >= 2, the interleaved schedule (and it them), equal blocks of
// layers (no pp_layers, model.layers a multiple of pp * vpp).
TEST(ConfigRules, InterleavedStagesNeedPipelineScheduleAndEqualBlocks) {
  const json interleaved = {{"parallel", {{"pp", 2}, {"vpp", 2}, {"pp_schedule", "interleaved_1f1b"}}}};
  const Config c = from(interleaved);
  EXPECT_EQ(c.parallel.vpp, 2);
  EXPECT_EQ(c.parallel.pp_schedule, PpSchedule::Interleaved1F1B);
  EXPECT_EQ(from(json::object()).parallel.vpp, 1);
  EXPECT_EQ(from(json::object()).parallel.pp_schedule, PpSchedule::OneFOneB);
  expect_bad_input(
      [] {
        from(json{{"parallel", {{"vpp", 2}, {"pp_schedule", "interleaved_1f1b"}}}});
      },
      {"parallel.vpp = 2", "parallel.pp = 1 (default)", "parallel.pp >= 2"});
  expect_bad_input(
      [] {
        from(json{{"parallel", {{"pp", 2}, {"vpp", 2}}}});
      },
      {"parallel.vpp = 2", "parallel.pp_schedule = \"1f1b\" (default)", "interleaved_1f1b"});
  expect_bad_input(
      [] {
        from(json{{"parallel", {{"pp", 2}, {"pp_schedule", "interleaved_1f1b"}}}});
      },
      {"parallel.pp_schedule", "parallel.vpp = 1 (default)", "parallel.vpp >= 2"});
  expect_bad_input(
      [] {
        from(json{{"parallel", {{"pp", 2}, {"vpp", 3}, {"pp_schedule", "interleaved_1f1b"}}},
                  {"model", {{"layers", 8}}}});
      },
      {"model.layers = 8", "parallel.vpp = 3", "multiple of parallel.pp * parallel.vpp = 6"});
  expect_bad_input(
      [] {
        from(json{{"parallel", {{"pp", 2}, {"vpp", 2}, {"pp_schedule", "interleaved_1f1b"}, {"pp_layers", {1, 3}}}}});
      },
      {"parallel.pp_layers = [1,3]", "parallel.vpp = 2", "equal blocks"});
  expect_bad_input([] { from(document_with("parallel.vpp", 0)); }, {"parallel.vpp", ">= 1"});
  expect_bad_input([] { from(document_with("parallel.pp_schedule", "gpipe")); },
                   {"parallel.pp_schedule", "gpipe", "interleaved_1f1b"});
}

// A tensor-parallel config that splits something unevenly is refused by name; one that passes every rule
// is accepted (or, with parallel.expert_tp = tp, reaches the gate that still refuses split experts).

TEST(ConfigRules, TensorParallelSplitsWholeHeads) {
  expect_bad_input([] { from(document_with("parallel.tp", 8)); },
                   {"model.heads = 4 (default) is not a multiple of parallel.tp = 8 (in test.json)", "attention heads",
                    "divisible by 8"});
  EXPECT_EQ(from(document_with("parallel.tp", 4)).parallel.tp, 4);
  // Whole key/value heads per rank too.
  expect_bad_input(
      [] {
        from(json{{"model", {{"kv_heads", 2}}}, {"parallel", {{"tp", 4}}}});
      },
      {"model.kv_heads = 2 (in test.json) is not a multiple of parallel.tp = 4", "key/value heads"});
  EXPECT_EQ(from(json{{"model", {{"kv_heads", 2}}}, {"parallel", {{"tp", 2}}}}).model.kv_heads, 2);
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
  EXPECT_EQ(from(json::object(), {"moe.overflow=reroute"}).moe.overflow, std::vector<Overflow>{Overflow::Reroute});
  const Config cascade = from(json::object(), {R"(moe.overflow=["reroute", "dense"])"});
  EXPECT_EQ(cascade.moe.overflow, (std::vector<Overflow>{Overflow::Reroute, Overflow::Dense}));
  EXPECT_EQ(cascade.moe.overflow_policy(), Overflow::RerouteDense);
  EXPECT_TRUE(cascade.moe.overflow_has(Overflow::Dense) && cascade.moe.overflow_has(Overflow::Reroute));
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
  EXPECT_EQ(c.moe.router.bias_balance_rule, BiasRule::Proportional);
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
  EXPECT_EQ(c.model.attention, AttentionKind::Mla);
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

}  // namespace
}  // namespace moe
