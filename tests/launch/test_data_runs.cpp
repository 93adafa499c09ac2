// End-to-end runs of `moe train` on prepared data and with a mixing schedule, in process: a run trains on
// shards written by the prep pipeline and records their provenance; the metrics carry the weights in force
// and the realised shares; a run stopped and resumed with a schedule equals the uninterrupted one bit for
// bit; resuming on other data is refused unless --allow-data-change.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "data/corpus.h"
#include "data/prep.h"
#include "launch/train/trainer.h"
#include "run_compare.h"

namespace moe {
namespace {

using test_support::first_difference;
using test_support::read_text;
using test_support::TempDir;
using test_support::without_timing;
using json = nlohmann::json;
namespace fs = std::filesystem;

const std::string kTinyConfig = std::string(MOE_SOURCE_DIR) + "/configs/tiny.json";

TrainOptions options_for(const std::string& run_dir, const std::vector<std::string>& extra) {
  TrainOptions o;
  o.config_path = kTinyConfig;
  o.overrides = {"train.steps=8",      "train.log_every=1",     "train.eval_every=4",  "train.eval_sequences=2",
                 "train.seq_len=16",   "train.global_batch=8",  "train.micro_batch=4", "train.threads=1",
                 "model.d_model=32",   "model.layers=1",        "model.heads=2",       "model.ffn_hidden=32",
                 "checkpoint.every=2", "checkpoint.async=false"};
  o.overrides.insert(o.overrides.end(), extra.begin(), extra.end());
  o.run_dir = run_dir;
  o.quiet = true;
  o.command_line = {"test_data_runs"};
  return o;
}

std::vector<json> metrics(const std::string& run_dir) {
  std::vector<json> lines;
  std::ifstream in(fs::path(run_dir) / "metrics.jsonl");
  for (std::string text; std::getline(in, text);) lines.push_back(without_timing(json::parse(text)));
  return lines;
}

// The embedded corpus written out and prepared (byte tokenizer: vocab 257), as data.sources entries.
std::string prepare_embedded(const TempDir& dir) {
  data::PrepSettings s;
  for (const data::EmbeddedText& t : data::embedded_texts()) {
    const std::string path = dir / (std::string(t.name) + ".txt");
    std::ofstream(path, std::ios::binary) << t.bytes;
    s.inputs.push_back({std::string(t.name), path});
  }
  s.out = dir / "prepared";
  s.tokenizer = "byte";
  s.max_document_bytes = 8192;
  data::run_prep(s);
  std::string sources;
  for (const data::EmbeddedText& t : data::embedded_texts())
    sources += std::string(sources.empty() ? "" : ",") + R"({"name": ")" + std::string(t.name) + R"(", "path": ")" +
               s.out + "\"}";
  return "data.sources=[" + sources + "]";
}

const char* kSchedule =
    R"(data.schedule=[{"step": 1, "weights": {"prose": 1}}, {"step": 8, "weights": {"prose": 1, "code": 1, "arithmetic": 2}}])";

TEST(PreparedData, TrainsRecordsProvenanceAndLogsTheMixture) {
  TempDir dir("data_runs");
  const std::string sources = prepare_embedded(dir);
  const std::string run = dir / "run";
  run_train(options_for(run, {sources, "model.vocab=257", kSchedule}));
  const json manifest = json::parse(read_text(fs::path(run) / "manifest.json"));
  ASSERT_TRUE(manifest.contains("data")) << manifest.dump();
  EXPECT_EQ(manifest["data"]["xxh64"].get<std::string>().size(), 16u);
  EXPECT_EQ(manifest["data"]["sources"][0]["kind"], "prepared");
  EXPECT_EQ(manifest["data"]["sources"][0]["path"], dir / "prepared");
  const json checkpoint = json::parse(read_text(fs::path(run) / "checkpoints/step-00000008/manifest.json"));
  EXPECT_EQ(checkpoint["data"], manifest["data"]);
  const std::vector<json> lines = metrics(run);
  // Step 1: prose alone; step 8: prose 1/4, code 1/4, arithmetic 1/2; between, interpolated.
  EXPECT_EQ(lines.at(0)["data"]["weights"]["prose"], 1.0);
  EXPECT_EQ(lines.at(0)["data"]["share"]["prose"], 1.0);
  EXPECT_EQ(lines.at(0)["data"]["share"]["code"], 0.0);
  const json last = lines.at(lines.size() - 2);  // the last training line (an eval line follows)
  ASSERT_EQ(last["step"], 8);
  EXPECT_EQ(last["data"]["weights"]["arithmetic"], 0.5);
  double share = 0;
  for (const auto& [name, value] : last["data"]["share"].items()) share += value.get<double>();
  EXPECT_DOUBLE_EQ(share, 1.0);
  const json eval = lines.back();
  EXPECT_TRUE(eval["eval_loss_by_source"].contains("code")) << eval.dump();
}

TEST(PreparedData, StoppedAndResumedWithAScheduleEqualsUninterrupted) {
  TempDir dir("data_runs");
  const std::string sources = prepare_embedded(dir);
  run_train(options_for(dir / "whole", {sources, "model.vocab=257", kSchedule}));
  TrainOptions first = options_for(dir / "parts", {sources, "model.vocab=257", kSchedule});
  first.stop_after_step = 5;  // a checkpoint at step 4, steps 5.. again after the resume
  run_train(first);
  run_train(options_for(dir / "parts", {sources, "model.vocab=257", kSchedule}));
  const std::vector<json> a = metrics(dir / "whole"), b = metrics(dir / "parts");
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(first_difference(a[i], b[i]), "") << "line " << i + 1;
}

TEST(PreparedData, ResumingOnOtherDataIsRefusedUnlessAllowed) {
  TempDir dir("data_runs");
  const std::string text = dir / "text.txt";
  std::string bytes;
  for (int i = 0; i < 400; ++i) bytes += "line " + std::to_string(i) + " of the text\n";
  std::ofstream(text) << bytes;
  const std::string source = R"(data.sources=[{"name": "text", "path": ")" + text + "\"}]";
  const std::string run = dir / "run";
  TrainOptions first = options_for(run, {source});
  first.stop_after_step = 4;
  run_train(first);
  bytes[10] = 'X';  // same size, other content
  std::ofstream(text) << bytes;
  try {
    run_train(options_for(run, {source}));
    ADD_FAILURE() << "resumed on other data";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::BadInput);
    for (const char* needle : {"trained on other data", "source 'text'", "--allow-data-change"})
      EXPECT_NE(e.message().find(needle), std::string::npos) << needle << " not in: " << e.message();
  }
  TrainOptions allowed = options_for(run, {source});
  allowed.allow_data_change = true;
  run_train(allowed);
  EXPECT_EQ(metrics(run).back()["step"], 8);
}

}  // namespace
}  // namespace moe
