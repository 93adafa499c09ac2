// Fault recovery of `moe launch` end to end (docs/design.md, invariants 3-5): the real program runs as a
// subprocess, starting mpirun with 2 ranks of a tiny MoE model, while faults are injected (fault.inject):
// a killed rank (also one of 8 ranks in tp x pp x ep x dp, killed from outside), a stopped (silent) rank, a
// hung main thread, an exception, a corrupted newest checkpoint,
// more faults than fault.max_restarts allows, forged and malformed heartbeats, and bad input. Each
// recovered run must end exactly like an uninterrupted run of the same config: the same metrics.jsonl
// (all machine-independent fields, bit for bit) and the same final parameters, read from both runs'
// final checkpoints. Each fault case prints what the lead watches: detection latency, time to resume,
// steps lost (also recorded as gtest properties).
//
// The bad input, signal and lock cases are in test_supervisor_refusals.cpp, the heartbeat cases in
// test_supervisor_heartbeats.cpp; all three files make the one test_supervisor program.
//
// All cases run in one process (the ctest entry runs the whole binary), so the uninterrupted reference
// run is made once.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/types.h>

#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "checkpoint/checkpointer.h"
#include "supervisor_harness.h"
#include "supervisor_recovery.h"

namespace {
using namespace moe::test_support;
namespace fs = std::filesystem;
using json = nlohmann::json;
using namespace std::chrono_literals;

// ---- 1. A killed rank ------------------------------------------------------------------------------

TEST(Supervisor, KilledRankRestartsFromNewestCheckpointAndEqualsUninterrupted) {
  reference();
  TempDir dir("kill");
  const fs::path run = dir.path() / "run";
  const LaunchResult r = run_launch(dir.path(), run, launch_args(run, {inject("kill", 1, 7)}));
  expect_one_recovery(r, kDeadRank, 5);
  expect_names_dead_rank(r, 1);
  const Recovery m = measure(r, "kill rank 1 after step 7");
  EXPECT_GE(m.steps_lost, 2);  // steps 6 and 7 at least
  expect_same_as_reference(run);
}

// The process of MPI rank `rank` of the job whose processes mention `run_dir`, or 0: mpirun tells each rank
// its number in OMPI_COMM_WORLD_RANK.
pid_t rank_process(const fs::path& run_dir, int rank) {
  for (pid_t pid : processes_mentioning(run_dir.string())) {
    std::istringstream env(read_text_if_any(fs::path("/proc") / std::to_string(pid) / "environ"));
    for (std::string var; std::getline(env, var, '\0');)
      if (var == "OMPI_COMM_WORLD_RANK=" + std::to_string(rank)) return pid;
  }
  return 0;
}

// A pipeline run in four dimensions, tp 2 x pp 2 x ep 2 x dp 2 on 8 ranks with ZeRO: once its first checkpoint
// is committed, rank 5 (pipeline stage 1, which holds the MoE layer: tensor-parallel rank 1 of data-parallel
// rank 0, between stage 0's sends and the head) is killed from outside the job with SIGKILL. Its neighbours
// block on point-to-point receives from it; the job restarts from the newest checkpoint and ends equal to an
// uninterrupted launch of the same layout, metrics and parameters bit for bit.
TEST(Supervisor, KilledRankOfAFourDimensionalPipelineRunRecovers) {
  TempDir dir("kill-4d");
  const fs::path whole = dir.path() / "whole", run = dir.path() / "run";
  const std::vector<std::string> four_d = {"model.heads=4",
                                           "parallel.tp=2",
                                           "parallel.pp=2",
                                           "parallel.ep=2",
                                           "optim.zero=true",
                                           "train.steps=30",
                                           "fault.heartbeat_timeout_s=5"};
  const LaunchResult w = run_launch(dir.path(), whole, with_np(launch_args(whole, four_d), 8));
  ASSERT_EQ(w.exit_code, 0) << describe(w);
  bool killed = false;
  const LaunchResult r =
      run_launch(dir.path(), run, with_np(launch_args(run, four_d), 8), [&](const LaunchResult& now) {
        if (killed || !events_named(now, "restart").empty()) return;
        if (!fs::exists(run / "checkpoints" / "step-00000005" / "manifest.json")) return;
        if (const pid_t pid = rank_process(run, 5); pid > 0) killed = ::kill(pid, SIGKILL) == 0;
      });
  ASSERT_TRUE(killed) << describe(r);
  EXPECT_EQ(r.exit_code, 0) << describe(r);
  const auto restarts = events_named(r, "restart");
  ASSERT_EQ(restarts.size(), 1u) << describe(r);
  const int64_t resume_step = restarts[0].value("resume_step", int64_t(-1));
  EXPECT_TRUE(resume_step >= 5 && resume_step % 5 == 0) << describe(r);
  EXPECT_EQ(last_event(r), "finished") << describe(r);
  expect_names_dead_rank(r, 5);
  EXPECT_TRUE(r.left_behind.empty());
  measure(r, "kill rank 5 of tp2 x pp2 x ep2 x dp2 from outside");
  EXPECT_EQ(comparable_metrics(run), comparable_metrics(whole));
  const fs::path last = fs::path("checkpoints") / "step-00000030";
  const auto params = final_params(run / last), expected = final_params(whole / last);
  EXPECT_FALSE(expected.empty());
  EXPECT_TRUE(params == expected) << "the final parameters differ from the uninterrupted run";
}

// A fault before the first checkpoint: nothing to resume from, so the restart starts again from step 0
// (losing every step, which is all invariant 4 allows) and still ends like the uninterrupted run.
TEST(Supervisor, KilledBeforeFirstCheckpointRestartsFromStepZero) {
  reference();
  TempDir dir("kill-early");
  const fs::path run = dir.path() / "run";
  const LaunchResult r = run_launch(dir.path(), run, launch_args(run, {inject("kill", 1, 3)}));
  expect_one_recovery(r, kDeadRank, 0);
  expect_names_dead_rank(r, 1);
  const auto restarts = events_named(r, "restart");
  if (!restarts.empty()) {
    EXPECT_TRUE(restarts[0].value("resume_from", json()).is_null()) << describe(r);
  }
  measure(r, "kill rank 1 after step 3 (no checkpoint yet)");
  expect_same_as_reference(run);
}

// ---- 2. A stopped (silent) rank --------------------------------------------------------------------

TEST(Supervisor, StoppedRankIsDetectedAsSilentHangAndLeavesNoProcess) {
  reference();
  TempDir dir("stop");
  const fs::path run = dir.path() / "run";
  const LaunchResult r = run_launch(dir.path(), run, launch_args(run, {inject("stop", 1, 7)}));
  expect_one_recovery(r, {"hang"}, 5);
  const auto hangs = events_named(r, "hang");
  if (!hangs.empty()) {
    EXPECT_EQ(hangs[0].value("reason", ""), "silent") << describe(r);
    EXPECT_EQ(hangs[0].value("rank", int64_t(-1)), 1) << describe(r);
    const double detect = hangs[0].value("detect_s", -1.0);
    EXPECT_GT(detect, 2.0) << "detected before fault.heartbeat_timeout_s";
    EXPECT_LE(detect, 2.0 + 2.0) << "detection took longer than heartbeat_timeout_s + 2 s";
  }
  measure(r, "stop (SIGSTOP) rank 1 after step 7");
  // No process of the job is left: scan every process's command line for the run directory.
  EXPECT_TRUE(processes_mentioning(run.string()).empty());
  EXPECT_TRUE(r.left_behind.empty());
  expect_same_as_reference(run);
}

// ---- 3. A hung main thread (heartbeats go on) -------------------------------------------------------

TEST(Supervisor, HungStepIsEndedByWatchdogOrNoProgressDetection) {
  reference();
  TempDir dir("hang");
  const fs::path run = dir.path() / "run";
  const LaunchResult r =
      run_launch(dir.path(), run, launch_args(run, {inject("hang", 1, 7), "fault.step_timeout_s=3"}));
  // The watchdog's exit is a crash; the supervisor's own finding a hang ("no progress").
  expect_one_recovery(r, {"crash", "hang"}, 5);
  // Which: the watchdogs end the hung rank and the rank waiting for it in a collective (both make no
  // progress for step_timeout_s) and mpirun ends the job (a crash); when mpirun takes longer than
  // heartbeat_timeout_s to end, the supervisor finds the ended ranks silent first (a hang, "silent"); or
  // the supervisor's own "no progress" limit (step_timeout_s + heartbeat_timeout_s) comes first.
  for (const json& e : r.events) {
    const std::string kind = e.value("event", "");
    if (kind == "crash" || kind == "hang") {
      std::cout << "[ detected ] as " << kind << (kind == "hang" ? " (" + e.value("reason", "") + ")" : "") << ", rank "
                << e.value("rank", int64_t(-1)) << "\n";
      break;
    }
  }
  const Recovery m = measure(r, "hang rank 1 after step 7 (step_timeout_s 3)");
  // The watchdog fires after 3 s without progress; the supervisor's own limit is 3 + 2 s.
  if (m.fault_to_event_s >= 0) {
    EXPECT_GE(m.fault_to_event_s, 2.5) << "ended before fault.step_timeout_s";
    EXPECT_LE(m.fault_to_event_s, 3.0 + 2.0 + 2.0);
  }
  EXPECT_NE(r.stderr_text.find("watchdog"), std::string::npos) << "the watchdog names the stuck rank\n" << describe(r);
  expect_same_as_reference(run);
}

// ---- 4. An exception ---------------------------------------------------------------------------------

TEST(Supervisor, ExceptionInRankCrashesAndRestarts) {
  reference();
  TempDir dir("exception");
  const fs::path run = dir.path() / "run";
  const LaunchResult r = run_launch(dir.path(), run, launch_args(run, {inject("exception", 1, 7)}));
  expect_one_recovery(r, kDeadRank, 5);
  expect_names_dead_rank(r, 1);
  EXPECT_NE(r.stderr_text.find("injected exception"), std::string::npos) << describe(r);
  measure(r, "exception on rank 1 after step 7");
  expect_same_as_reference(run);
}

// ---- 5. The newest checkpoint corrupted, then a crash ----------------------------------------------------

TEST(Supervisor, CorruptNewestCheckpointFallsBackToTheOlderOne) {
  reference();
  TempDir dir("corrupt");
  const fs::path run = dir.path() / "run";
  const LaunchResult r = run_launch(dir.path(), run, launch_args(run, {inject("corrupt_checkpoint", 0, 10)}));
  expect_one_recovery(r, kDeadRank, 5);
  expect_names_dead_rank(r, 0);
  const auto restarts = events_named(r, "restart");
  if (!restarts.empty()) {
    EXPECT_NE(restarts[0].value("resume_from", json()).dump().find("step-00000005"), std::string::npos) << describe(r);
    bool named = false;
    for (const json& note : restarts[0].value("checkpoint_notes", json::array()))
      named = named || (note.is_string() && note.get<std::string>().find("step-00000010") != std::string::npos &&
                        note.get<std::string>().find("rank-00000.h5") != std::string::npos);
    EXPECT_TRUE(named) << "the restart's checkpoint_notes name the damaged file\n" << describe(r);
  }
  const Recovery m = measure(r, "corrupt step-10 checkpoint + kill rank 0 after step 10");
  EXPECT_GE(m.steps_lost, 5);  // back to step 5 from step 10 at least
  expect_same_as_reference(run);
}

// ---- 6. More faults than fault.max_restarts allows ---------------------------------------------------------

TEST(Supervisor, GivesUpAfterMaxRestartsWithExitCode3AndKeepsCheckpoints) {
  TempDir dir("giveup");
  const fs::path run = dir.path() / "run";
  const LaunchResult r = run_launch(
      dir.path(), run,
      launch_args(run, {"checkpoint.every=2", "fault.max_restarts=1",
                        R"(fault.inject=[{"kind":"kill","rank":1,"step":3},{"kind":"kill","rank":0,"step":7}])"}));
  EXPECT_EQ(r.exit_code, 3) << describe(r);
  EXPECT_NE(r.stderr_text.find("max_restarts"), std::string::npos) << describe(r);
  EXPECT_EQ(last_event(r), "gave_up") << describe(r);
  EXPECT_EQ(events_named(r, "restart").size(), 1u) << describe(r);
  EXPECT_EQ(events_named(r, "crash").size() + events_named(r, "hang").size(), 2u) << describe(r);
  EXPECT_TRUE(events_named(r, "finished").empty()) << describe(r);
  measure(r, "kill rank 1 after step 3 (first of two faults, max_restarts 1)");
  // The committed checkpoints are still there and verify.
  std::vector<std::string> notes;
  const auto newest = moe::ckpt::find_newest((run / "checkpoints").string(), {}, &notes);
  ASSERT_TRUE(newest.has_value()) << "no checkpoint verifies after giving up";
  EXPECT_GE(newest->chain.back().step, 4) << newest->dir;  // the restart from step 2 saved at 4 (and 6)
  std::string why;
  for (const std::string& d : moe::ckpt::list_checkpoints((run / "checkpoints").string()))
    EXPECT_TRUE(moe::ckpt::verify_checkpoint(d, {}, &why).has_value()) << d << ": " << why;
  EXPECT_TRUE(r.left_behind.empty());
}

// ---- 7. A slow checkpoint commit is checkpoint work, not a hung step ------------------------------------------------

// An asynchronous save commits at a later step boundary: the manifest, the rename and the copy to every replica root.
// With a replica on a slow file system (each copy held up 4 s) that commit outlasts fault.step_timeout_s (2 s) but not
// fault.checkpoint_timeout_s (60 s): no watchdog, no restart, the replica holds the newest checkpoint, and the run is
// the uninterrupted one. Every rank times the commit as checkpoint work (rank 1, which writes no manifest, waits for
// rank 0's copies inside it).
TEST(Supervisor, SlowCheckpointCommitIsTimedAsCheckpointWork) {
  reference();
  TempDir dir("slow_commit");
  const fs::path run = dir.path() / "run", replica = dir.path() / "replica";
  ::setenv("MOE_TEST_REPLICA_DELAY_MS", "4000", 1);
  const LaunchResult r =
      run_launch(dir.path(), run,
                 launch_args(run, {"checkpoint.async=true", "checkpoint.replicas=[\"" + replica.string() + "\"]",
                                   "fault.step_timeout_s=2", "fault.checkpoint_timeout_s=60"}));
  ::unsetenv("MOE_TEST_REPLICA_DELAY_MS");
  EXPECT_EQ(r.exit_code, 0) << describe(r);
  EXPECT_TRUE(events_named(r, "restart").empty()) << describe(r);
  EXPECT_EQ(r.stderr_text.find("watchdog"), std::string::npos) << describe(r);
  EXPECT_GE(r.wall_s, 3 * 4.0) << "three commits (steps 5, 10 and 12), each copy held up 4 s";
  EXPECT_TRUE(fs::exists(replica / "step-00000012")) << "the replica lacks the final checkpoint";
  expect_same_as_reference(run);
}

// The reference run's directory goes when the process ends (kept when a check failed).
class CleanReference : public ::testing::Environment {
 public:
  void TearDown() override {
    if (g_reference_base.empty()) return;
    if (!::testing::UnitTest::GetInstance()->Passed()) {
      std::cout << "[ kept ] " << g_reference_base << " (the reference run)\n";
      return;
    }
    std::error_code ec;
    fs::remove_all(g_reference_base, ec);
  }
};
[[maybe_unused]] ::testing::Environment* const g_clean_reference =
    ::testing::AddGlobalTestEnvironment(new CleanReference);

}  // namespace
