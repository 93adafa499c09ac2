// Damaged checkpoints (docs/design.md, invariants 4 and 5; docs/checkpoint.md): a checkpoint is either
// complete and verified or ignored, and `--resume auto` says which one it skipped and why, falls back to
// the newest one that verifies (a replica's copy of a file, else an older checkpoint, else none) and then
// ends bit for bit where an uninterrupted run ends. A damaged checkpoint named by --resume PATH, or one of
// another model shape, is refused by name (BadInput: exit code 2) before anything in the run directory
// changes. Retention keeps whole chains and `latest` names the newest commit.
// One process, in process (run_train), a tiny MoE model; a few tenths of a second per run on one core.
// Not here: resume across layouts and ranks (test_checkpoint_resume.cpp, under mpirun), the shard file
// format (tests/checkpoint).
#include "checkpoint_damage_harness.h"

namespace moe {
namespace {

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

}  // namespace
}  // namespace moe
