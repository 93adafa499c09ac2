// Damaged checkpoints (docs/design.md, invariants 4 and 5; docs/checkpoint.md): a checkpoint is either
// complete and verified or ignored, and `--resume auto` says which one it skipped and why, falls back to
// the newest one that verifies (a replica's copy of a file, else an older checkpoint, else none) and then
// ends bit for bit where an uninterrupted run ends. A damaged checkpoint named by --resume PATH, or one of
// another model shape, is refused by name (BadInput: exit code 2) before anything in the run directory
// changes. Retention keeps whole chains and `latest` names the newest commit.
// One process, in process (run_train), a tiny MoE model; a few tenths of a second per run on one core.
// Not here: resume across layouts and ranks (test_checkpoint_resume.cpp, under mpirun), the shard file
// format (tests/checkpoint).
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
#include "launch/trainer.h"
#include "run_compare.h"

namespace moe {
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

void truncate_half(const std::string& path) {
  const auto size = fs::file_size(path);
  ASSERT_GT(size, 1000u) << path;
  fs::resize_file(path, size / 2);
}
void flip_middle_byte(const std::string& path) {
  std::string bytes = read_text(path);
  ASSERT_GT(bytes.size(), 1000u) << path;
  bytes[bytes.size() / 2] = char(bytes[bytes.size() / 2] ^ 0x5a);
  write_text(path, bytes);
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

// ---- The newest checkpoint damaged: fall back to the previous one ----------------------------------------

class NewestDamaged : public testing::TestWithParam<std::string> {};

TEST_P(NewestDamaged, TruncatedShardFallsBackToThePreviousCheckpoint) {
  TempDir tmp("ckpt_damage");
  const std::string run = tmp / "run";
  copy_base(GetParam(), run);
  truncate_half(shard(run, 15));
  expect_refused(ckpt_dir(run, 15), shard(run, 15));
  expect_refused(ckpt_dir(run, 15), "size");
  expect_falls_back(run, {{15, "size"}}, 10, "truncated shard");
}

TEST_P(NewestDamaged, FlippedByteFallsBackToThePreviousCheckpoint) {
  TempDir tmp("ckpt_damage");
  const std::string run = tmp / "run";
  copy_base(GetParam(), run);
  flip_middle_byte(shard(run, 15));
  expect_refused(ckpt_dir(run, 15), "checksum");
  expect_falls_back(run, {{15, "checksum"}}, 10, "flipped byte");
}

TEST_P(NewestDamaged, MissingManifestFallsBackToThePreviousCheckpoint) {
  TempDir tmp("ckpt_damage");
  const std::string run = tmp / "run";
  copy_base(GetParam(), run);
  fs::remove(fs::path(ckpt_dir(run, 15)) / "manifest.json");
  expect_refused(ckpt_dir(run, 15), "manifest.json");
  expect_falls_back(run, {{15, "manifest.json"}}, 10, "missing manifest");
}

TEST_P(NewestDamaged, MissingShardFallsBackToThePreviousCheckpoint) {
  TempDir tmp("ckpt_damage");
  const std::string run = tmp / "run";
  copy_base(GetParam(), run);
  fs::remove(shard(run, 15));
  expect_refused(ckpt_dir(run, 15), "missing");
  expect_falls_back(run, {{15, "missing"}}, 10, "missing shard");
}

// Both saves written synchronously and by the background thread.
INSTANTIATE_TEST_SUITE_P(CheckpointDamage, NewestDamaged, testing::Values("sync", "async"));

// ---- A crash before the commit -------------------------------------------------------------------------------

TEST(CheckpointDamage, UncommittedDirectoriesAreIgnored) {
  // A crash after the shards were written but before the manifest: the temporary directory holds shard
  // files only. And a step directory without a manifest (a copy or rename gone wrong). Neither is a
  // checkpoint: the newest committed one (step 15) is used.
  TempDir tmp("ckpt_damage");
  const std::string run = tmp / "run";
  copy_base("sync", run);
  const fs::path root = fs::path(run) / "checkpoints";
  for (const char* name : {"tmp-step-00000099", "step-00000099"}) {
    fs::create_directories(root / name);
    fs::copy_file(shard(run, 15), root / name / "rank-00000.h5");
  }
  write_text((root / "tmp-step-00000099" / "manifest.json.tmp").string(), "{\"step\": 9");  // cut by the crash
  const std::vector<std::string> listed = ckpt::list_checkpoints(root.string());
  ASSERT_FALSE(listed.empty());
  EXPECT_EQ(listed.front(), (root / "step-00000099").string());
  for (const std::string& dir : listed)
    EXPECT_EQ(fs::path(dir).filename().string().rfind("step-", 0), 0u) << "tmp-* listed: " << dir;
  expect_refused((root / "step-00000099").string(), "manifest.json");
  expect_refused((root / "tmp-step-00000099").string(), "manifest.json");
  expect_falls_back(run, {{99, "manifest.json"}}, 15, "uncommitted directories", {}, "step-00000099");
  EXPECT_FALSE(fs::exists(root / "tmp-step-00000020")) << "the resumed run's own saves committed";
}

// ---- Replicas ----------------------------------------------------------------------------------------------

TEST(CheckpointDamage, CorruptPrimaryWithAGoodReplicaUsesTheReplica) {
  TempDir tmp("ckpt_damage");
  const std::string run = tmp / "run", replica = tmp / "replica";
  const std::vector<std::string> extra = {"checkpoint.replicas=[\"" + replica + "\"]"};
  train(run, extra, "auto", 15);
  const std::string copy = (fs::path(replica) / "step-00000015" / "rank-00000.h5").string();
  ASSERT_TRUE(fs::exists(copy)) << "no replica copy of step 15";
  EXPECT_EQ(read_text(copy), read_text(shard(run, 15)));
  EXPECT_EQ(ckpt::list_checkpoints(replica).size(), 3u) << "step-5, 10 and 15 copied";

  flip_middle_byte(shard(run, 15));
  expect_refused(ckpt_dir(run, 15), "checksum");  // without the replica
  std::string why;
  const auto resolved = ckpt::verify_checkpoint(ckpt_dir(run, 15), {replica}, &why);
  ASSERT_TRUE(resolved.has_value()) << why;
  ASSERT_EQ(resolved->paths.size(), 1u);
  EXPECT_EQ(resolved->paths[0], std::vector<std::string>{copy});
  ASSERT_EQ(resolved->notes.size(), 1u);
  EXPECT_TRUE(has_line(resolved->notes[0], {shard(run, 15), copy})) << resolved->notes[0];

  // Resumes from step 15 itself (the replica's copy), saying which file failed and which copy it used.
  const RunOutput resumed = train(run, extra);
  EXPECT_TRUE(has_line(resumed.out, {"checkpoint: ", shard(run, 15), "checksum", copy}))
      << "no note naming the damaged file and the replica's copy; the run printed:\n"
      << resumed.out;
  EXPECT_TRUE(has_line(resumed.out, {resumed_line(ckpt_dir(run, 15), 15)})) << resumed.out;
  expect_equals_reference(resumed, "replica");
}

TEST(CheckpointDamage, PrimaryAndReplicaBothDamagedFallBackToThePreviousCheckpoint) {
  TempDir tmp("ckpt_damage");
  const std::string run = tmp / "run", replica = tmp / "replica";
  const std::vector<std::string> extra = {"checkpoint.replicas=[\"" + replica + "\"]"};
  train(run, extra, "auto", 15);
  flip_middle_byte(shard(run, 15));
  truncate_half((fs::path(replica) / "step-00000015" / "rank-00000.h5").string());
  expect_refused(ckpt_dir(run, 15), "failed verification", {replica});
  expect_falls_back(run, {{15, "failed verification"}}, 10, "primary and replica damaged", extra);
}

TEST(CheckpointDamage, DeltaWhoseBaseManifestIsLostUsesTheReplicasManifest) {
  // A replica holds a full copy of every checkpoint: a file of the chain that fails in the primary, the
  // base's manifest.json included, is taken from the replica, as the head's manifest is. Falling back to an
  // older checkpoint instead would lose steps a good copy still holds (invariant 4).
  TempDir tmp("ckpt_damage");
  const std::string run = tmp / "run", replica = tmp / "replica";
  const std::vector<std::string> extra = {"checkpoint.replicas=[\"" + replica + "\"]", "checkpoint.full_every=2"};
  train(run, extra, "auto", 15);                             // step-5 full, 10 delta, 15 full
  fs::remove(fs::path(ckpt_dir(run, 5)) / "manifest.json");  // the base of step-10
  std::string why;
  const auto head = ckpt::verify_checkpoint(ckpt_dir(run, 5), {replica}, &why);
  ASSERT_TRUE(head.has_value()) << "the head's manifest comes from the replica: " << why;
  const auto delta = ckpt::verify_checkpoint(ckpt_dir(run, 10), {replica}, &why);
  EXPECT_TRUE(delta.has_value()) << "step-10's base manifest is in the replica, yet: " << why;
  if (delta) {
    EXPECT_EQ(delta->chain.size(), 2u);
    EXPECT_FALSE(delta->notes.empty()) << "no note that the replica's manifest was used";
  }
}

// ---- Delta chains ------------------------------------------------------------------------------------------

TEST(CheckpointDamage, DeltaWhoseBaseIsDamagedSkipsTheWholeChain) {
  TempDir tmp("ckpt_damage");
  const std::string run = tmp / "run";
  copy_base("delta2", run);
  const ckpt::Manifest m20 = ckpt::read_manifest(ckpt_dir(run, 20));
  ASSERT_EQ(m20.kind, "delta");
  ASSERT_EQ(m20.chain, (std::vector<std::string>{"step-00000015", "step-00000020"}));
  ASSERT_EQ(ckpt::read_manifest(ckpt_dir(run, 10)).kind, "delta");

  flip_middle_byte(shard(run, 15));  // the base of step 20; step 20's own files are intact
  expect_refused(ckpt_dir(run, 20), shard(run, 15));
  // The chain step-5 (full) + step-10 (delta) is the newest that verifies: restored along the chain.
  expect_falls_back(run, {{20, shard(run, 15)}, {15, "checksum"}}, 10, "delta on a damaged base");
}

TEST(CheckpointDamage, DeltaChainWithDamagedBaseAndNoOlderChainRefusesWithoutOverwrite) {
  TempDir tmp("ckpt_damage");
  const std::string run = tmp / "run";
  copy_base("delta4", run);
  ASSERT_EQ(ckpt::read_manifest(ckpt_dir(run, 15)).chain,
            (std::vector<std::string>{"step-00000005", "step-00000010", "step-00000015"}));
  truncate_half(shard(run, 5));
  for (int64_t step : {5, 10, 15}) expect_refused(ckpt_dir(run, step), shard(run, 5));
  std::vector<std::string> notes;
  EXPECT_FALSE(ckpt::find_newest((fs::path(run) / "checkpoints").string(), {}, &notes).has_value());
  EXPECT_EQ(notes.size(), 3u) << "one note per skipped checkpoint";

  // No checkpoint to resume and a run in the directory: refused, asking for --overwrite; nothing written.
  const auto before = snapshot(run);
  expect_bad_input(options_for(run, {"checkpoint.full_every=4"}, "auto", 0), {"--overwrite"});
  expect_unchanged(before, run);
}

// ---- Refusals: nothing in the run directory changes --------------------------------------------------------

TEST(CheckpointDamage, DamagedCheckpointNamedByResumePathIsRefusedAndNothingIsWritten) {
  TempDir tmp("ckpt_damage");
  const std::string run = tmp / "run";
  copy_base("sync", run);
  for (int64_t step : {5, 10, 15}) truncate_half(shard(run, step));  // no checkpoint verifies at all
  const auto before = snapshot(run);
  expect_bad_input(options_for(run, {}, ckpt_dir(run, 15), 0), {"--resume", shard(run, 15), "size"});
  expect_unchanged(before, run);
  // With --resume auto, nothing verifies and the directory holds a run: refused, asking for --overwrite.
  expect_bad_input(options_for(run, {}, "auto", 0), {"--overwrite"});
  expect_unchanged(before, run);
}

TEST(CheckpointDamage, CheckpointOfAnotherModelShapeIsRefusedAndNothingIsWritten) {
  TempDir tmp("ckpt_damage");
  const std::string run = tmp / "run";
  copy_base("sync", run);
  const auto before = snapshot(run);
  expect_bad_input(options_for(run, {"model.d_model=48"}, ckpt_dir(run, 15), 0), {"model.d_model", ckpt_dir(run, 15)});
  expect_unchanged(before, run);
  expect_bad_input(options_for(run, {"model.d_model=48"}, "auto", 0), {"model.d_model", ckpt_dir(run, 15)});
  expect_unchanged(before, run);
}

// ---- A delta must not be restored onto a base it was not computed from ------------------------------------

TEST(CheckpointDamage, DeltaWhoseBaseWasRewrittenIsNotRestored) {
  // step-20 is a delta on step-15. Resuming from step 10 with another learning rate (allowed: it does not
  // change the model's shape) rewrites step-15 with other values; stopped there, step-20 still lies on
  // disk, its own files intact, but its XOR applies to the old step-15 only. Restoring it would load
  // values no run ever had: it must not verify (or must be gone), and `--resume auto` must use step 15.
  TempDir tmp("ckpt_damage");
  const std::string run = tmp / "run";
  copy_base("delta2", run);
  const std::vector<std::string> other_lr = {"checkpoint.full_every=2", "optim.lr=2e-3"};
  const RunOutput branch = train(run, other_lr, ckpt_dir(run, 10), 15);
  ASSERT_TRUE(has_line(branch.out, {resumed_line(ckpt_dir(run, 10), 10)})) << branch.out;
  ASSERT_EQ(ckpt::read_manifest(ckpt_dir(run, 15)).kind, "full");

  std::vector<std::string> notes;
  const auto newest = ckpt::find_newest((fs::path(run) / "checkpoints").string(), {}, &notes);
  ASSERT_TRUE(newest.has_value());
  EXPECT_EQ(newest->dir, ckpt_dir(run, 15))
      << "step-20, a delta on the step-15 that was replaced, would be restored onto the new step-15";
  EXPECT_EQ(read_text(run + "/checkpoints/latest"), "step-00000015\n");
  // And the run itself: `--resume auto` continues the new branch from its step 15.
  const RunOutput resumed = train(run, other_lr);
  EXPECT_TRUE(has_line(resumed.out, {resumed_line(ckpt_dir(run, 15), 15)})) << resumed.out;
  EXPECT_FALSE(has_line(resumed.out, {resumed_line(ckpt_dir(run, 20), 20)}))
      << "restored the stale delta step-20 onto the new step-15:\n"
      << resumed.out;
}

// ---- Forged checkpoints: consistent-looking, yet not what the run needs ----------------------------------
// An attacker (or a careless copy) edits a manifest, rewrites a shard and recomputes its checksum, or
// points a file name elsewhere. Each is refused by the one verification: `--resume auto` falls back to
// step 10 and ends bit for bit where the reference ends, `--resume PATH` is BadInput naming the reason.

json read_json(const std::string& path) { return json::parse(read_text(path)); }

// Applies `edit` to the manifest of `dir`, written back as the writer writes it.
void edit_manifest(const std::string& dir, const std::function<void(json&)>& edit) {
  const std::string path = dir + "/manifest.json";
  json m = read_json(path);
  edit(m);
  write_text(path, m.dump(1) + "\n");
}

// Puts the size and xxh64 of the file now at dir/name into the manifest, as a forger would.
void rehash_in_manifest(const std::string& dir, const std::string& name) {
  int64_t size = 0;
  const std::string hash = ckpt::file_xxh64(dir + "/" + name, &size);
  edit_manifest(dir, [&](json& m) {
    for (json& f : m["files"])
      if (f["name"] == name) f["size"] = size, f["xxh64"] = hash;
  });
}

// What a forger changes in one dataset of a shard: its dtype, where it lies in the tensor, and its bytes.
struct Forgery {
  std::string name;
  ckpt::DType dtype;
  ckpt::Slab slab;
  std::vector<uint8_t> bytes;
};

// Rewrites dir/rank-00000.h5 with the real shard writer, dataset `target` changed by `change` and
// `stowaway` added when given, then recomputes its size and xxh64 in the manifest.
void forge_shard(const std::string& dir, const std::string& target, const std::function<void(Forgery&)>& change,
                 const std::optional<Forgery>& stowaway = std::nullopt) {
  const std::string path = dir + "/rank-00000.h5", forged = path + ".forged";
  {
    const ckpt::ShardReader reader(path);
    ckpt::ShardWriter writer(forged);
    writer.set_attribute("step", reader.attribute("step"));
    writer.set_attribute("kind", reader.attribute("kind"));
    bool found = false;
    for (const ckpt::DatasetInfo& info : reader.datasets()) {
      const size_t esize = info.dtype == ckpt::DType::F64 || info.dtype == ckpt::DType::I64 ? 8 : 4;
      Forgery f{info.name, info.dtype, info.slab, std::vector<uint8_t>(size_t(info.numel()) * esize)};
      reader.read(info.name, info.dtype, 0, info.numel(), f.bytes.data());
      if (info.name == target) change(f), found = true;
      writer.write(f.name, f.dtype, f.bytes.data(), f.slab);
    }
    if (stowaway) writer.write(stowaway->name, stowaway->dtype, stowaway->bytes.data(), stowaway->slab);
    writer.close();
    ASSERT_TRUE(found) << "no dataset " << target << " in " << path;
  }
  fs::rename(forged, path);
  rehash_in_manifest(dir, "rank-00000.h5");
}

// params/embed.weight [vocab, d_model] stored as [d_model, vocab]: the same elements, another shape.
void transpose_embedding(Forgery& f) {
  std::vector<int64_t> shape = f.slab.global_shape;
  ASSERT_EQ(shape.size(), 2u);
  std::swap(shape[0], shape[1]);
  f.slab = ckpt::Slab::whole(shape);
}

// params/embed.weight stored as float64 (the same values).
void widen_embedding(Forgery& f) {
  ASSERT_EQ(f.dtype, ckpt::DType::F32);
  std::vector<uint8_t> wide(f.bytes.size() * 2);
  for (size_t i = 0; i < f.bytes.size() / 4; ++i) {
    float x;
    std::memcpy(&x, f.bytes.data() + 4 * i, 4);
    const double y = x;
    std::memcpy(wide.data() + 8 * i, &y, 8);
  }
  f.dtype = ckpt::DType::F64;
  f.bytes = std::move(wide);
}

// The manifest entry of params/embed.weight in dir's manifest, changed by `edit`.
void edit_embedding_entry(const std::string& dir, const std::function<void(json&)>& edit) {
  edit_manifest(dir, [&](json& m) {
    for (json& f : m["files"])
      for (json& d : f["datasets"])
        if (d["tensor"] == "params/embed.weight") edit(d);
  });
}

// The forged step 15 of `run`: verify_checkpoint refuses it (when `verify_refuses`: some forgeries are
// consistent in themselves and only the model's needs refuse them), `--resume PATH` is BadInput naming
// `mention`, and `--resume auto` falls back to step 10 and ends as the reference ends.
void expect_forgery_refused(const std::string& run, const std::string& mention, const std::string& what,
                            bool verify_refuses = true) {
  if (verify_refuses) expect_refused(ckpt_dir(run, 15), mention);
  expect_bad_input(options_for(run, {}, ckpt_dir(run, 15), 0), {"--resume", mention});
  expect_falls_back(run, {{15, mention}}, 10, what);
}

TEST(CheckpointForgery, ManifestStepEditedIsRefused) {
  TempDir tmp("ckpt_forgery");
  const std::string run = tmp / "run";
  copy_base("sync", run);
  edit_manifest(ckpt_dir(run, 15), [](json& m) { m["step"] = 20; });
  expect_forgery_refused(run, "step 20, but the directory is step-00000015", "manifest step edited");
}

TEST(CheckpointForgery, CheckpointMovedToAnotherStepIsRefused) {
  // Renamed to step-17, its manifest's step and chain edited to match, `latest` too: only the shards say 15.
  TempDir tmp("ckpt_forgery");
  const std::string run = tmp / "run";
  copy_base("sync", run);
  const std::string moved = (fs::path(run) / "checkpoints" / "step-00000017").string();
  fs::rename(ckpt_dir(run, 15), moved);
  edit_manifest(moved, [](json& m) {
    m["step"] = 17;
    m["chain"] = json::array({"step-00000017"});
  });
  write_text(run + "/checkpoints/latest", "step-00000017\n");
  expect_refused(moved, "says step '15'");
  expect_bad_input(options_for(run, {}, moved, 0), {"--resume", "says step '15'"});
  const RunOutput r = train(run);
  EXPECT_TRUE(has_line(r.out, {"checkpoint: skipped " + moved + ": ", "says step '15'"})) << r.out;
  EXPECT_TRUE(has_line(r.out, {resumed_line(ckpt_dir(run, 10), 10)})) << r.out;
  expect_equals_reference(r, "checkpoint moved to another step");
}

TEST(CheckpointForgery, ShardWithAnotherShapeIsRefused) {
  TempDir tmp("ckpt_forgery");
  const std::string run = tmp / "run";
  copy_base("sync", run);
  forge_shard(ckpt_dir(run, 15), "params/embed.weight", transpose_embedding);
  expect_forgery_refused(run, "dataset params/embed.weight: the file holds f32", "shard of another shape");
}

TEST(CheckpointForgery, ShardAndManifestWithAnotherShapeAreRefused) {
  // Consistent in itself (the manifest says what the file holds): only the model's needs refuse it.
  TempDir tmp("ckpt_forgery");
  const std::string run = tmp / "run";
  copy_base("sync", run);
  forge_shard(ckpt_dir(run, 15), "params/embed.weight", transpose_embedding);
  edit_embedding_entry(ckpt_dir(run, 15), [](json& d) { d["global_shape"] = d["shape"] = {32, 256}; });
  expect_forgery_refused(run, "params/embed.weight is f32 [32,256], this run needs f32 [256,32]",
                         "shard and manifest of another shape", false);
}

TEST(CheckpointForgery, ShardOfFloat64IsRefused) {
  TempDir tmp("ckpt_forgery");
  const std::string run = tmp / "run";
  copy_base("sync", run);
  forge_shard(ckpt_dir(run, 15), "params/embed.weight", widen_embedding);
  expect_forgery_refused(run, "the file holds f64", "shard of float64");
}

TEST(CheckpointForgery, ShardAndManifestOfFloat64AreRefused) {
  TempDir tmp("ckpt_forgery");
  const std::string run = tmp / "run";
  copy_base("sync", run);
  forge_shard(ckpt_dir(run, 15), "params/embed.weight", widen_embedding);
  edit_embedding_entry(ckpt_dir(run, 15), [](json& d) { d["dtype"] = "f64"; });
  expect_forgery_refused(run, "params/embed.weight is f64 [256,32], this run needs f32 [256,32]",
                         "shard and manifest of float64", false);
}

TEST(CheckpointForgery, RenamedTensorIsRefused) {
  // optim/step renamed in the file and in the manifest alike: consistent, but the model needs optim/step.
  TempDir tmp("ckpt_forgery");
  const std::string run = tmp / "run";
  copy_base("sync", run);
  forge_shard(ckpt_dir(run, 15), "optim/step", [](Forgery& f) { f.name = "optim/steps_taken"; });
  expect_refused(ckpt_dir(run, 15), "has no dataset optim/step");  // the manifest still lists it
  edit_manifest(ckpt_dir(run, 15), [](json& m) {
    for (json& f : m["files"])
      for (json& d : f["datasets"])
        if (d["tensor"] == "optim/step") d["tensor"] = d["dataset"] = "optim/steps_taken";
  });
  expect_forgery_refused(run, "holds no tensor optim/step, which this run needs", "renamed tensor", false);
}

TEST(CheckpointForgery, ForeignTensorIsRefused) {
  // One tensor more than the model has, in the file and the manifest alike.
  TempDir tmp("ckpt_forgery");
  const std::string run = tmp / "run";
  copy_base("sync", run);
  const Forgery stowaway{"params/stowaway", ckpt::DType::F32, ckpt::Slab::whole({4}), std::vector<uint8_t>(16, 0)};
  forge_shard(
      ckpt_dir(run, 15), "optim/step", [](Forgery&) {}, stowaway);
  edit_manifest(ckpt_dir(run, 15), [](json& m) {
    m["files"][0]["datasets"].push_back({{"dataset", "params/stowaway"},
                                         {"tensor", "params/stowaway"},
                                         {"dtype", "f32"},
                                         {"global_shape", {4}},
                                         {"start", {0}},
                                         {"shape", {4}},
                                         {"range", {0, 4}},
                                         {"xor_delta", false}});
  });
  std::string why;
  EXPECT_TRUE(ckpt::verify_checkpoint(ckpt_dir(run, 15), {}, &why).has_value()) << "consistent in itself: " << why;
  expect_forgery_refused(run, "holds tensor params/stowaway, which this run's model does not have", "foreign tensor",
                         false);
}

TEST(CheckpointForgery, FileNamesOutsideTheCheckpointAreRefused) {
  // The named files hold the very bytes the manifest lists: only the names are wrong.
  for (const bool absolute : {false, true}) {
    SCOPED_TRACE(absolute ? "absolute" : "../../etc/passwd");
    TempDir tmp("ckpt_forgery");
    const std::string run = tmp / "run";
    copy_base("sync", run);
    const std::string outside = absolute ? tmp / "elsewhere.h5" : run + "/etc/passwd";
    fs::create_directories(fs::path(outside).parent_path());
    fs::copy_file(shard(run, 15), outside);
    const std::string name = absolute ? outside : "../../etc/passwd";
    edit_manifest(ckpt_dir(run, 15), [&](json& m) { m["files"][0]["name"] = name; });
    expect_forgery_refused(run, "file name '" + name + "' points outside the checkpoint directory",
                           "file name outside the checkpoint");
  }
}

// Runs `f` on a thread; fails unless it ends within `seconds`. `unblock` is called if it does not.
template <typename F>
void within(double seconds, const std::string& what, F&& f, const std::function<void()>& unblock) {
  std::promise<void> done;
  std::future<void> finished = done.get_future();
  std::thread worker([&] {
    f();
    done.set_value();
  });
  if (finished.wait_for(std::chrono::duration<double>(seconds)) != std::future_status::ready) {
    ADD_FAILURE() << what << " did not end within " << seconds << " s";
    unblock();
  }
  worker.join();
}

TEST(CheckpointForgery, SymlinkToAHugeSparseFileIsRefusedWithoutReadingIt) {
  TempDir tmp("ckpt_forgery");
  const std::string run = tmp / "run", big = tmp / "big";
  copy_base("sync", run);
  write_text(big, "");
  fs::resize_file(big, uint64_t{20} << 30);  // 20 GiB, sparse
  fs::remove(shard(run, 15));
  fs::create_symlink(big, shard(run, 15));
  within(
      3.0, "verify_checkpoint of a symlink to 20 GiB", [&] { expect_refused(ckpt_dir(run, 15), "symbolic link"); },
      [] {});
  expect_forgery_refused(run, "a symbolic link, not a regular file", "symlink to a sparse file");

  // The same file in place of the shard: its size is compared before a byte is hashed.
  TempDir tmp2("ckpt_forgery");
  const std::string run2 = tmp2 / "run";
  copy_base("sync", run2);
  fs::resize_file(shard(run2, 15), uint64_t{20} << 30);
  within(
      3.0, "verify_checkpoint of a 20 GiB sparse shard", [&] { expect_refused(ckpt_dir(run2, 15), "size"); }, [] {});
}

TEST(CheckpointForgery, FifoInPlaceOfAShardOrManifestDoesNotHang) {
  for (const char* victim : {"rank-00000.h5", "manifest.json"}) {
    SCOPED_TRACE(victim);
    TempDir tmp("ckpt_forgery");
    const std::string run = tmp / "run";
    copy_base("sync", run);
    const std::string fifo = ckpt_dir(run, 15) + "/" + victim;
    fs::remove(fifo);
    ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
    // If a reader blocks in open(), a writer that opens and closes the FIFO lets it go on.
    const auto unblock = [&] { ::close(::open(fifo.c_str(), O_WRONLY | O_NONBLOCK)); };
    const std::string mention = std::string(victim) == "manifest.json" ? "not a regular file" : "a FIFO";
    within(
        5.0, "verify_checkpoint of a FIFO", [&] { expect_refused(ckpt_dir(run, 15), mention); }, unblock);
    within(
        30.0, "a resume past a FIFO", [&] { expect_forgery_refused(run, mention, "FIFO"); }, unblock);
  }
}

// ---- --resume none in a directory that holds checkpoints --------------------------------------------------

TEST(CheckpointForgery, ResumeNoneSaysWhatIsThereAndWhatToDo) {
  TempDir tmp("ckpt_forgery");
  const std::string run = tmp / "run";
  copy_base("sync", run);
  const auto before = snapshot(run);
  expect_bad_input(options_for(run, {}, "none", 0),
                   {"3 checkpoint(s)", "step-00000015", "--resume auto", "--overwrite", "delete them"});
  expect_unchanged(before, run);
}

// ---- Retention and `latest` --------------------------------------------------------------------------------

TEST(CheckpointDamage, RetentionKeepsTheNewestTwoCompleteChains) {
  for (const bool async : {false, true}) {
    SCOPED_TRACE(async ? "async" : "sync");
    TempDir tmp("ckpt_damage");
    const std::string run = tmp / "run", replica = tmp / "replica";
    std::vector<std::string> extra = {"checkpoint.every=2", "checkpoint.keep=2", "checkpoint.full_every=2",
                                      std::string("checkpoint.async=") + (async ? "true" : "false")};
    if (async) extra.push_back("checkpoint.replicas=[\"" + replica + "\"]");
    const RunOutput r = train(run, extra);
    expect_equals_reference(r, "retention");
    // Saves at 2, 4, ..., 20 in chains [2, 4], [6, 8], ..., [18, 20]: the newest two chains stay.
    std::vector<std::string> roots = {run + "/checkpoints"};
    if (async) roots.push_back(replica);
    for (const std::string& root : roots) {
      std::vector<std::string> names;
      for (const std::string& dir : ckpt::list_checkpoints(root)) names.push_back(fs::path(dir).filename().string());
      EXPECT_EQ(names, (std::vector<std::string>{"step-00000020", "step-00000018", "step-00000016", "step-00000014"}))
          << root;
      for (const auto& entry : fs::directory_iterator(root))
        EXPECT_NE(entry.path().filename().string().rfind("tmp-", 0), 0u) << "left behind: " << entry.path();
    }
    const std::string root = roots.front();
    for (const std::string& dir : ckpt::list_checkpoints(root)) {
      std::string why;
      const auto resolved = ckpt::verify_checkpoint(dir, {}, &why);
      ASSERT_TRUE(resolved.has_value()) << dir << ": " << why;
      const int64_t step = resolved->chain.back().step;
      EXPECT_EQ(resolved->chain.size(), step % 4 == 0 ? 2u : 1u) << dir;
      EXPECT_EQ(resolved->chain.back().kind, step % 4 == 0 ? "delta" : "full") << dir;
    }
    std::vector<std::string> notes;
    const auto newest = ckpt::find_newest(root, {}, &notes);
    ASSERT_TRUE(newest.has_value());
    EXPECT_EQ(fs::path(newest->dir).filename().string(), "step-00000020");
    EXPECT_EQ(newest->chain_dirs, (std::vector<std::string>{root + "/step-00000018", root + "/step-00000020"}));
    EXPECT_TRUE(notes.empty());
    EXPECT_EQ(read_text(root + "/latest"), "step-00000020\n");
  }
}

TEST(CheckpointDamage, LatestNamesTheNewestCommittedCheckpoint) {
  for (const char* base : {"sync", "async"}) {
    SCOPED_TRACE(base);
    TempDir tmp("ckpt_damage");
    const std::string run = tmp / "run";
    copy_base(base, run);  // stopped after step 15
    const std::string root = run + "/checkpoints";
    EXPECT_EQ(read_text(root + "/latest"), "step-00000015\n");
    EXPECT_EQ(ckpt::list_checkpoints(root).front(), ckpt_dir(run, 15));
    EXPECT_FALSE(fs::exists(root + "/latest.tmp"));
    std::string why;
    EXPECT_TRUE(ckpt::verify_checkpoint(ckpt_dir(run, 15), {}, &why).has_value()) << why;
    // Resumed to the end, `latest` moves to step 20.
    const RunOutput r = train(run, bases().at(base).extra);
    EXPECT_TRUE(has_line(r.out, {resumed_line(ckpt_dir(run, 15), 15)})) << r.out;
    expect_equals_reference(r, base);
    EXPECT_EQ(read_text(root + "/latest"), "step-00000020\n");
  }
}

}  // namespace
}  // namespace moe
