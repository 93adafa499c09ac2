// What the checkpoint damage and forgery tests share (test_checkpoint_damage.cpp,
// test_checkpoint_forgery.cpp): runs of the trainer in process with their output captured, the
// uninterrupted reference run, base run directories with checkpoints to damage, and the checks.
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <bit>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <iterator>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "checkpoint/checkpointer.h"
#include "checkpoint/manifest.h"
#include "checkpoint/shard_file.h"
#include "core/error.h"
#include "launch/train/trainer.h"
#include "run_compare.h"

namespace moe {
// Internal linkage on purpose: each test program that includes this gets its own runs and caches.
namespace {
using namespace test_support;

namespace fs = std::filesystem;
using json = nlohmann::json;

const std::string kTinyMoeConfig = std::string(MOE_SOURCE_DIR) + "/configs/tiny_moe.json";

// A small MoE model (2 layers, the second MoE with 4 experts, Gumbel routing noise so the random state
// matters too): 20 steps, a checkpoint every 5, every checkpoint full and written synchronously, all
// kept. `extra` comes last, so it wins. Neither checkpoint.async nor checkpoint.full_every changes a bit
// of training, so every variant ends where the reference ends.
std::vector<std::string> overrides(const std::vector<std::string>& extra = {}) {
  std::vector<std::string> o = {
      "train.steps=20",
      "train.log_every=1",
      "train.eval_every=5",
      "train.eval_sequences=2",
      "train.seq_len=16",
      "train.global_batch=4",
      "train.micro_batch=2",
      "train.threads=1",
      "model.d_model=32",
      "model.layers=2",
      "model.heads=2",
      "model.ffn_hidden=32",
      "moe.num_experts=4",
      "moe.top_k=2",
      "moe.every=2",
      "moe.expert_hidden=32",
      "moe.router.noise=gumbel",
      "optim.lr=1e-3",
      "optim.warmup=2",
      "checkpoint.every=5",
      "checkpoint.keep=100",
      "checkpoint.full_every=1",
      "checkpoint.async=false",
  };
  o.insert(o.end(), extra.begin(), extra.end());
  return o;
}

struct RunOutput {
  std::vector<json> lines;  // metrics.jsonl without the timing fields
  std::map<std::string, std::vector<float>> parameters;
  std::string out;  // what the run printed on stdout and stderr (progress lines and notes)
};

void write_text(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
  ASSERT_TRUE(out.good()) << "cannot write " << path;
}

TrainOptions options_for(const std::string& run_dir, const std::vector<std::string>& extra, const std::string& resume,
                         int64_t stop_after) {
  TrainOptions o;
  o.config_path = kTinyMoeConfig;
  o.overrides = overrides(extra);
  o.run_dir = run_dir;
  o.resume = resume;
  o.quiet = false;  // the notes ("checkpoint: ...", "resuming from ...") are part of what is tested
  o.collect_parameters = true;
  o.stop_after_step = stop_after;
  o.command_line = {"test_checkpoint_damage"};
  return o;
}

// What run_train prints, on stdout and stderr, while `f` runs; what `f` throws goes on.
template <typename F>
std::string captured(F&& f) {
  testing::internal::CaptureStdout();
  testing::internal::CaptureStderr();
  try {
    f();
  } catch (...) {
    testing::internal::GetCapturedStdout();
    testing::internal::GetCapturedStderr();
    throw;
  }
  const std::string out = testing::internal::GetCapturedStdout();
  return out + testing::internal::GetCapturedStderr();
}

// Trains (or resumes) a run in process; metrics lines, final parameters and what it printed.
RunOutput train(const std::string& run_dir, const std::vector<std::string>& extra = {},
                const std::string& resume = "auto", int64_t stop_after = 0) {
  RunOutput run;
  run.out = captured([&] { run.parameters = run_train(options_for(run_dir, extra, resume, stop_after)).parameters; });
  std::ifstream in(fs::path(run_dir) / "metrics.jsonl");
  for (std::string text; std::getline(in, text);) {
    json line = json::parse(text);
    for (const std::string& f : kTimingFields) line.erase(f);
    run.lines.push_back(line);
  }
  return run;
}

// The uninterrupted 20-step run every resumed run must equal, computed once.
const RunOutput& reference() {
  static TempDir dir("ckpt_damage_base");
  static const RunOutput run = train(dir / "whole");
  return run;
}

void expect_equals_reference(const RunOutput& run, const std::string& what) {
  const RunOutput& ref = reference();
  ASSERT_EQ(ref.lines.size(), 20u + 4u) << "20 training lines and 4 evaluations";
  ASSERT_EQ(run.lines.size(), ref.lines.size()) << what;
  for (size_t i = 0; i < ref.lines.size(); ++i)
    EXPECT_EQ(first_difference(run.lines[i], ref.lines[i]), "") << what << ": metrics.jsonl line " << i + 1;
  ASSERT_EQ(run.parameters.size(), ref.parameters.size()) << what;
  for (const auto& [name, p] : ref.parameters) {
    ASSERT_TRUE(run.parameters.count(name)) << what << ": no parameter " << name;
    const std::vector<float>& q = run.parameters.at(name);
    ASSERT_EQ(q.size(), p.size()) << what << ": " << name;
    EXPECT_EQ(std::memcmp(q.data(), p.data(), p.size() * sizeof(float)), 0) << what << ": " << name << " differs";
  }
}

// Run directories trained once and copied for each case (a copy keeps every file's bytes).
struct Base {
  std::vector<std::string> extra;
  int64_t stop_after;
};
const std::map<std::string, Base>& bases() {
  static const std::map<std::string, Base> b = {
      // step-5, 10, 15, all full, written synchronously; stopped after step 15 as if interrupted.
      {"sync", {{}, 15}},
      // the same, written by the background thread.
      {"async", {{"checkpoint.async=true"}, 15}},
      // 20 steps, full every second save: step-5 full, 10 delta on 5, 15 full, 20 delta on 15.
      {"delta2", {{"checkpoint.full_every=2", "checkpoint.async=true"}, 0}},
      // full every fourth save: step-5 full, 10 and 15 deltas on 5; stopped after step 15.
      {"delta4", {{"checkpoint.full_every=4"}, 15}},
  };
  return b;
}

// A copy of the trained base run directory `name` at `run_dir`.
void copy_base(const std::string& name, const std::string& run_dir) {
  static TempDir dir("ckpt_damage_base");
  static std::set<std::string> trained;
  const Base& b = bases().at(name);
  const std::string source = dir / name;
  if (!trained.count(name)) {
    train(source, b.extra, "auto", b.stop_after);
    trained.insert(name);
  }
  fs::copy(source, run_dir, fs::copy_options::recursive);
}

std::string ckpt_dir(const std::string& run_dir, int64_t step) {
  char name[32];
  std::snprintf(name, sizeof name, "step-%08lld", static_cast<long long>(step));
  return (fs::path(run_dir) / "checkpoints" / name).string();
}
std::string shard(const std::string& run_dir, int64_t step) {
  return (fs::path(ckpt_dir(run_dir, step)) / "rank-00000.h5").string();
}

// Every file under `dir` (relative path -> bytes) and every directory (-> "<dir>").
std::map<std::string, std::string> snapshot(const std::string& dir) {
  std::map<std::string, std::string> files;
  for (const auto& entry : fs::recursive_directory_iterator(dir)) {
    const std::string rel = fs::relative(entry.path(), dir).string();
    files[rel] = entry.is_directory() ? "<dir>" : read_text(entry.path().string());
  }
  return files;
}

void expect_unchanged(const std::map<std::string, std::string>& before, const std::string& dir) {
  const std::map<std::string, std::string> after = snapshot(dir);
  for (const auto& [path, bytes] : before) {
    auto it = after.find(path);
    if (it == after.end())
      ADD_FAILURE() << path << " was removed";
    else
      EXPECT_TRUE(it->second == bytes) << path << " changed";
  }
  for (const auto& [path, bytes] : after)
    if (!before.count(path)) ADD_FAILURE() << path << " was created";
}

bool has_line(const std::string& out, const std::vector<std::string>& parts) {
  size_t begin = 0;
  while (begin < out.size()) {
    size_t end = out.find('\n', begin);
    if (end == std::string::npos) end = out.size();
    const std::string line = out.substr(begin, end - begin);
    bool all = true;
    for (const std::string& p : parts) all = all && line.find(p) != std::string::npos;
    if (all) return true;
    begin = end + 1;
  }
  return false;
}

std::string resumed_line(const std::string& dir, int64_t step) {
  return "resuming from " + dir + " at step " + std::to_string(step);
}

// After damage to the newest checkpoint(s): `--resume auto` skips `skipped` (each with a "checkpoint:"
// note naming it and `why`), resumes from step `from` and ends bit for bit where the reference ends, with
// every checkpoint it rewrote verifying again. `leftover`: a directory the run leaves alone (still skipped).
void expect_falls_back(const std::string& run_dir, const std::vector<std::pair<int64_t, std::string>>& skipped,
                       int64_t from, const std::string& what, const std::vector<std::string>& extra = {},
                       const std::string& leftover = "") {
  const RunOutput run = train(run_dir, extra);
  for (const auto& [step, why] : skipped) {
    EXPECT_TRUE(has_line(run.out, {"checkpoint: skipped " + ckpt_dir(run_dir, step) + ": ", why}))
        << what << ": no note that step " << step << " was skipped (" << why << "); the run printed:\n"
        << run.out;
    EXPECT_EQ(run.out.find("resuming from " + ckpt_dir(run_dir, step)), std::string::npos)
        << what << ": resumed from the damaged checkpoint:\n"
        << run.out;
  }
  EXPECT_TRUE(has_line(run.out, {resumed_line(ckpt_dir(run_dir, from), from)}))
      << what << ": expected to resume from step " << from << "; the run printed:\n"
      << run.out;
  expect_equals_reference(run, what);
  // The run rewrote the damaged checkpoints on its way: the newest is whole again, and `latest` says so.
  std::vector<std::string> notes;
  const auto newest = ckpt::find_newest((fs::path(run_dir) / "checkpoints").string(), {}, &notes);
  ASSERT_TRUE(newest.has_value()) << what;
  EXPECT_EQ(newest->dir, ckpt_dir(run_dir, 20)) << what;
  for (const std::string& note : notes)
    EXPECT_TRUE(!leftover.empty() && note.find(leftover) != std::string::npos) << what << ": " << note;
  EXPECT_EQ(read_text(run_dir + "/checkpoints/latest"), "step-00000020\n") << what;
}

// verify_checkpoint refuses `dir`, naming `mention` in its reason.
void expect_refused(const std::string& dir, const std::string& mention, const std::vector<std::string>& replicas = {}) {
  std::string why;
  EXPECT_FALSE(ckpt::verify_checkpoint(dir, replicas, &why).has_value()) << dir << " verified";
  EXPECT_NE(why.find(mention), std::string::npos) << dir << ": reason lacks '" << mention << "': " << why;
}

// run_train must throw BadInput (exit code 2 in `moe train`) mentioning every one of `mentions`.
void expect_bad_input(const TrainOptions& options, const std::vector<std::string>& mentions) {
  try {
    captured([&] { run_train(options); });
    ADD_FAILURE() << "no error; expected BadInput mentioning '" << mentions.front() << "'";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::BadInput) << e.message();
    for (const std::string& m : mentions)
      EXPECT_NE(e.message().find(m), std::string::npos) << "message lacks '" << m << "': " << e.message();
  }
}

}  // namespace
}  // namespace moe
