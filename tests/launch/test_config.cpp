// Tests of the config loader (launch/config/config.h): defaults, the type and range of each key, unknown keys, --set,
// malformed, oversized, deep and non-regular files, docs/config.md against its generator, and the repo's
// configs/*.json. The rules between keys are tested in test_config_rules.cpp, the writability checks of the
// run directory and the checkpoint roots in test_config_run_dir.cpp. It does not test what the trainer does
// with the values.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "config_test_util.h"
#include "core/error.h"
#include "launch/config/config.h"

namespace moe {
namespace {

using json = nlohmann::json;

using config_test::document_with;
using config_test::expect_bad_input;
using config_test::from;

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
  EXPECT_EQ(c.train.recompute, Recompute::None);
  EXPECT_EQ(c.train.recompute_layers, -1);
  EXPECT_EQ(c.train.eval_every, 100);
  EXPECT_EQ(c.train.threads, 0);
  EXPECT_EQ(c.model.vocab, 256);
  EXPECT_EQ(c.model.d_model, 128);
  EXPECT_EQ(c.model.ffn_hidden, 384);
  EXPECT_EQ(c.moe.num_experts, 0);
  EXPECT_EQ(c.moe.top_k, 2);
  EXPECT_EQ(c.moe.router.noise, RouterNoise::None);
  EXPECT_EQ(c.moe.router.score, RouterScore::Softmax);
  EXPECT_TRUE(c.moe.router.normalize);
  EXPECT_DOUBLE_EQ(c.moe.capacity_factor, 1.25);
  EXPECT_EQ(c.moe.overflow, std::vector<Overflow>{Overflow::Drop});
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
  EXPECT_EQ(c.moe.router.noise, RouterNoise::Gumbel);
  EXPECT_EQ(c.parallel.dp, 0);
  std::filesystem::remove(path);
}

TEST(ConfigLoad, ChoicesTheBackendTakesArriveParsed) {
  EXPECT_EQ(from(json::object()).train.fused_attention, FusedAttention::Deterministic);
  EXPECT_EQ(from(document_with("train.fused_attention", "nondeterministic")).train.fused_attention,
            FusedAttention::Nondeterministic);
  EXPECT_EQ(from(document_with("train.fused_attention", "off")).train.fused_attention, FusedAttention::Off);
  expect_bad_input([] { from(document_with("train.fused_attention", "fast")); },
                   {"train.fused_attention", "\"fast\"", "\"deterministic\", \"nondeterministic\", \"off\""});
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
  expect_bad_input([] { from(document_with("moe.dispatcher", "ring")); },
                   {"moe.dispatcher", "\"ring\"", "\"alltoall\", \"allgather\""});
  expect_bad_input([] { from(document_with("moe.dispatcher", 2)); }, {"moe.dispatcher", "2", "\"allgather\""});
  EXPECT_EQ(from(document_with("moe.dispatcher", "allgather")).moe.dispatcher, DispatcherKind::AllGather);
  EXPECT_EQ(from(json::object()).moe.dispatcher, DispatcherKind::AllToAll) << "the default";
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

TEST(ConfigRanges, UnboundedNumbersTakeAnySign) {
  const Config c = from(json{{"moe", {{"capacity_factor", -1}, {"loss", {{"entropy", -0.5}}}}}});
  EXPECT_DOUBLE_EQ(c.moe.capacity_factor, -1.0);
  EXPECT_DOUBLE_EQ(c.moe.loss.entropy, -0.5);
}

// Numbers reach the model in float32: a value it cannot hold is refused, not turned into infinity or zero,
// in a file, in a --set, and inside the temperature schedule; JSON beyond double range as well.
TEST(ConfigRanges, NumbersBeyondFloatAreRefused) {
  for (const double v : {1e308, 3.5e38, 1e-40, -1e39}) {
    SCOPED_TRACE(v);
    const std::string key = v < 0 ? "moe.loss.entropy" : "moe.router.tau";
    expect_bad_input([&] { from(document_with(key, v)); }, {key, "float32"});
    expect_bad_input([&] { from(json::object(), {key + "=" + json(v).dump()}); }, {key, "--set", "float32"});
  }
  expect_bad_input(
      [] {
        from(document_with("moe.router.tau_schedule", json::array({{{"step", 0}, {"tau", 1e300}}})));
      },
      {"moe.router.tau_schedule[0].tau", "float32"});
  expect_bad_input([] { from(json::object(), {"optim.lr=1e400"}); }, {"optim.lr", "--set optim.lr=1e400"});
  expect_bad_input([] { from(json::object(), {"train.steps=1e400"}); }, {"train.steps", "integer"});
  expect_bad_input([] { from(json::object(), {"train.steps=123456789012345678901234567890"}); }, {"train.steps"});
  // The edges float32 holds are taken.
  EXPECT_DOUBLE_EQ(from(document_with("moe.router.tau", 3e38)).moe.router.tau, 3e38);
  EXPECT_DOUBLE_EQ(from(document_with("moe.loss.entropy", 0.0)).moe.loss.entropy, 0.0);
}

// What a run records as JSON must be UTF-8: a --set value that is not is refused naming it.
TEST(ConfigSet, TextThatIsNotUtf8IsRefused) {
  expect_bad_input([] { from(json::object(), {"checkpoint.dir=ckpt\xff\xfe"}); },
                   {"--set \"checkpoint.dir\"", "not valid UTF-8"});
  expect_bad_input([] { from(json::object(), {"data.sources=[{\"name\": \"a\xc3\", \"path\": \"a.txt\"}]"}); },
                   {"not valid UTF-8"});
  EXPECT_FALSE(is_valid_utf8("\xed\xa0\x80"));  // a surrogate half
  EXPECT_TRUE(is_valid_utf8("caf\xc3\xa9 \xe2\x82\xac"));
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

TEST(ConfigSet, OverridesParseAsJsonOrText) {
  const Config c =
      from(json::object(), {"train.steps=5", "moe.router.noise=gumbel", "parallel.dp=auto", "checkpoint.dir=2024",
                            "optim.zero=true", "optim.lr=0.01", "data.sources=[{\"name\": \"a\", \"path\": \"a.txt\"}]",
                            "moe.router={\"tau\": 0.5}", "train.steps=7"});
  EXPECT_EQ(c.train.steps, 7);  // the later --set wins
  EXPECT_EQ(c.moe.router.noise, RouterNoise::Gumbel);
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
