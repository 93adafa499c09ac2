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
// All cases run in one process (the ctest entry runs the whole binary), so the uninterrupted reference
// run is made once.
#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "checkpoint/checkpointer.h"
#include "core/host.h"
#include "supervisor_harness.h"

namespace {
using namespace moe::test_support;
namespace fs = std::filesystem;
using json = nlohmann::json;
using namespace std::chrono_literals;

// metrics.jsonl without the machine-dependent fields, one dump per line (dumps round-trip doubles, so
// equal text means equal bits).
std::vector<std::string> comparable_metrics(const fs::path& run_dir) {
  std::vector<std::string> out;
  for (const json& line : read_json_lines(run_dir / "metrics.jsonl")) out.push_back(without_timing(line).dump());
  return out;
}

// Every "params/..." tensor of the checkpoint, whole, as bytes.
std::map<std::string, std::vector<uint8_t>> final_params(const fs::path& checkpoint_dir) {
  std::map<std::string, std::vector<uint8_t>> out;
  std::string why;
  const auto resolved = moe::ckpt::verify_checkpoint(checkpoint_dir.string(), {}, &why);
  if (!resolved) {
    ADD_FAILURE() << checkpoint_dir << " does not verify: " << why;
    return out;
  }
  std::map<std::string, moe::ckpt::Piece> pieces;
  for (const moe::ckpt::FileEntry& f : resolved->chain.back().files)
    for (const moe::ckpt::DatasetEntry& d : f.datasets) {
      if (d.tensor.rfind("params/", 0) != 0 || pieces.count(d.tensor)) continue;
      moe::ckpt::Piece p;
      p.tensor = d.tensor, p.dtype = d.dtype, p.slab = moe::ckpt::Slab::whole(d.global_shape());
      pieces.emplace(d.tensor, p);
    }
  std::vector<moe::ckpt::Piece> list;
  for (auto& [name, p] : pieces) {
    std::vector<uint8_t>& buf = out[name];
    buf.assign(size_t(p.bytes()), 0);
    p.dst = buf.data();
    list.push_back(p);
  }
  try {
    moe::ckpt::load_pieces(*resolved, list);
  } catch (const std::exception& e) {
    ADD_FAILURE() << "loading " << checkpoint_dir << ": " << e.what();
  }
  return out;
}

fs::path final_checkpoint(const fs::path& run_dir) { return run_dir / "checkpoints" / "step-00000012"; }

// The uninterrupted run every recovered run must equal; made once per process.
struct Reference {
  fs::path base, run_dir;
  std::vector<std::string> metrics;
  std::map<std::string, std::vector<uint8_t>> params;
  double wall_s = 0;
  bool ok = false;
};

fs::path g_reference_base;  // for the clean-up at the end

const Reference& reference() {
  static Reference ref = [] {
    Reference r;
    std::string pattern = (fs::temp_directory_path() / "moe-sup-reference-XXXXXX").string();
    if (!::mkdtemp(pattern.data())) throw std::runtime_error("mkdtemp failed");
    r.base = pattern;
    g_reference_base = r.base;
    r.run_dir = r.base / "run";
    const LaunchResult run = run_launch(r.base, r.run_dir, launch_args(r.run_dir, {}));
    r.wall_s = run.wall_s;
    EXPECT_EQ(run.exit_code, 0) << "the uninterrupted reference run failed\n" << describe(run);
    EXPECT_TRUE(events_named(run, "restart").empty()) << describe(run);
    r.metrics = comparable_metrics(r.run_dir);
    r.params = final_params(final_checkpoint(r.run_dir));
    r.ok = run.exit_code == 0 && r.metrics.size() >= 12 && !r.params.empty();
    std::cout << "[ reference ] uninterrupted launch: " << run.wall_s << " s, " << r.metrics.size()
              << " metrics lines, " << r.params.size() << " parameter tensors\n";
    return r;
  }();
  return ref;
}

// The recovered run equals the uninterrupted one: metrics (bit for bit) and final parameters (bytes).
void expect_same_as_reference(const fs::path& run_dir) {
  const Reference& ref = reference();
  ASSERT_TRUE(ref.ok) << "no reference run to compare with";
  const std::vector<std::string> metrics = comparable_metrics(run_dir);
  EXPECT_EQ(metrics.size(), ref.metrics.size()) << "metrics.jsonl lines";
  for (size_t i = 0; i < std::min(metrics.size(), ref.metrics.size()); ++i)
    if (metrics[i] != ref.metrics[i]) {
      ADD_FAILURE() << "metrics.jsonl line " << i + 1 << " differs from the uninterrupted run:\n  got      "
                    << metrics[i] << "\n  expected " << ref.metrics[i];
      break;
    }
  const auto params = final_params(final_checkpoint(run_dir));
  EXPECT_EQ(params.size(), ref.params.size()) << "parameter tensors in the final checkpoint";
  for (const auto& [name, bytes] : ref.params) {
    const auto it = params.find(name);
    if (it == params.end()) {
      ADD_FAILURE() << name << " missing from " << final_checkpoint(run_dir);
      continue;
    }
    EXPECT_TRUE(it->second == bytes) << name << " differs from the uninterrupted run's final value";
  }
}

// The figures of one recovery, printed and recorded. The supervisor's own: detect_s of the failure,
// time_to_train_s of the restarted attempt (only when a heartbeat of it arrived in phase "step": these
// steps take ~20 ms against a heartbeat every 0.2 s), backoff_s, steps_lost. The test's view (polled
// every 20 ms): the fault's marker file appearing, the failure line appearing in events.log, the
// resumed run writing metrics.jsonl again.
struct Recovery {
  double detect_s = -1;
  double fault_to_event_s = -1;  // marker -> crash/hang line
  double time_to_train_s = -1;   // the restart attempt's "training" event, -1 when there was none
  double backoff_s = -1;
  double event_to_resumed_s = -1;  // crash/hang line -> the resumed run writing metrics again
  double fault_to_resumed_s = -1;  // marker -> the resumed run writing metrics again
  int64_t steps_lost = -1, resume_step = -1;
};

Recovery measure(const LaunchResult& r, const std::string& case_name) {
  Recovery m;
  double fault_t = -1;
  for (const auto& [name, t] : r.observed.markers)
    if (fault_t < 0 || t < fault_t) fault_t = t;
  size_t failure_index = r.events.size(), restart_index = r.events.size();
  for (size_t i = 0; i < r.events.size(); ++i) {
    const std::string e = r.events[i].value("event", "");
    if ((e == "crash" || e == "hang") && failure_index == r.events.size()) failure_index = i;
    if (e == "restart" && restart_index == r.events.size()) restart_index = i;
  }
  const double resumed_t = r.observed.metrics_resumed;
  if (failure_index < r.events.size()) {
    m.detect_s = r.events[failure_index].value("detect_s", -1.0);
    if (failure_index < r.observed.event_seen.size()) {
      const double seen = r.observed.event_seen[failure_index];
      if (fault_t >= 0) m.fault_to_event_s = seen - fault_t;
      if (resumed_t >= 0) m.event_to_resumed_s = resumed_t - seen;
    }
  }
  if (fault_t >= 0 && resumed_t >= 0) m.fault_to_resumed_s = resumed_t - fault_t;
  if (restart_index < r.events.size()) {
    const json& restart = r.events[restart_index];
    m.backoff_s = restart.value("backoff_s", -1.0);
    m.steps_lost = restart.value("steps_lost", int64_t(-1));
    m.resume_step = restart.value("resume_step", int64_t(-1));
    const int64_t attempt = restart.value("restart", int64_t(1));  // attempts count from 0
    for (size_t i = restart_index; i < r.events.size(); ++i)
      if (r.events[i].value("event", "") == "training" && r.events[i].value("attempt", int64_t(-1)) == attempt) {
        m.time_to_train_s = r.events[i].value("time_to_train_s", -1.0);
        break;
      }
  }
  std::cout << "[ figures ] " << case_name << ": detect_s " << m.detect_s << " (fault -> event " << m.fault_to_event_s
            << " s); time to resume: time_to_train_s " << m.time_to_train_s << " + backoff_s " << m.backoff_s
            << " (event -> training again " << m.event_to_resumed_s << " s, fault -> training again "
            << m.fault_to_resumed_s << " s); steps lost " << m.steps_lost << " (resumed at step " << m.resume_step
            << "); whole launch " << r.wall_s << " s\n";
  for (const auto& [key, value] :
       std::vector<std::pair<const char*, double>>{{"detect_s", m.detect_s},
                                                   {"fault_to_event_s", m.fault_to_event_s},
                                                   {"time_to_train_s", m.time_to_train_s},
                                                   {"backoff_s", m.backoff_s},
                                                   {"event_to_resumed_s", m.event_to_resumed_s},
                                                   {"fault_to_resumed_s", m.fault_to_resumed_s},
                                                   {"steps_lost", double(m.steps_lost)},
                                                   {"resume_step", double(m.resume_step)},
                                                   {"launch_wall_s", r.wall_s}})
    ::testing::Test::RecordProperty(key, std::to_string(value));
  return m;
}

std::string inject(const std::string& kind, int rank, int step) {
  return "fault.inject=[{\"kind\":\"" + kind + "\",\"rank\":" + std::to_string(rank) +
         ",\"step\":" + std::to_string(step) + "}]";
}

// One restart after one failure (an event named in `kinds`: "crash", "hang"), resumed from `resume_step`.
void expect_one_recovery(const LaunchResult& r, const std::vector<std::string>& kinds, int64_t resume_step) {
  EXPECT_EQ(r.exit_code, 0) << describe(r);
  const auto failures = [&] {
    std::vector<json> out = events_named(r, "crash");
    for (const json& h : events_named(r, "hang")) out.push_back(h);
    return out;
  }();
  ASSERT_EQ(failures.size(), 1u) << "one failure expected\n" << describe(r);
  const std::string kind = failures[0].value("event", "");
  EXPECT_NE(std::find(kinds.begin(), kinds.end(), kind), kinds.end()) << "unexpected " << kind << "\n" << describe(r);
  EXPECT_EQ(failures[0].value("processes_left", int64_t(-1)), 0) << describe(r);
  const auto restarts = events_named(r, "restart");
  ASSERT_EQ(restarts.size(), 1u) << describe(r);
  EXPECT_EQ(restarts[0].value("resume_step", int64_t(-1)), resume_step) << describe(r);
  EXPECT_GE(restarts[0].value("steps_lost", int64_t(-1)), 1) << describe(r);
  ASSERT_FALSE(events_named(r, "finished").empty()) << describe(r);
  EXPECT_EQ(last_event(r), "finished") << describe(r);
  // The failure comes before the restart.
  size_t fi = 0, ri = 0;
  for (size_t i = 0; i < r.events.size(); ++i) {
    if (r.events[i] == failures[0]) fi = i;
    if (r.events[i] == restarts[0]) ri = i;
  }
  EXPECT_LT(fi, ri) << describe(r);
  EXPECT_TRUE(r.left_behind.empty()) << r.left_behind.size() << " processes of the job outlived the launch";
  EXPECT_FALSE(r.timed_out);
}

// A rank that died is found either way: mpirun ending (a crash), or, when mpirun takes longer than
// fault.heartbeat_timeout_s to end the job (it took 1.1 s mostly, over 2 s in about one run of four
// here), the dead rank's silence (a hang, reason "silent").
const std::vector<std::string> kDeadRank = {"crash", "hang"};

void expect_names_dead_rank(const LaunchResult& r, int64_t rank) {
  for (const json& e : r.events) {
    const std::string kind = e.value("event", "");
    if (kind != "crash" && kind != "hang") continue;
    EXPECT_EQ(e.value("rank", int64_t(-1)), rank) << "the failed rank is named\n" << describe(r);
    if (kind == "hang") {
      EXPECT_EQ(e.value("reason", ""), "silent") << describe(r);
    }
    std::cout << "[ detected ] as " << kind << (kind == "hang" ? " (silent)" : "") << "\n";
    return;
  }
}

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

// ---- 7. Forged, malformed and oversized heartbeats -------------------------------------------------------

// mpirun's environment variable `name` (the test runs as the same user, so it may read it): the
// heartbeat address and the job's secret, which lets the test send a well-signed heartbeat from a rank
// that does not exist. mpirun is the child of `moe launch` whose command line starts with "mpirun".
std::string mpirun_env(pid_t launch_pid, const std::string& name) {
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator("/proc", ec)) {
    const std::string stat = read_text_if_any(entry.path() / "stat");
    const size_t paren = stat.rfind(')');
    if (paren == std::string::npos) continue;
    std::istringstream rest(stat.substr(paren + 2));
    char state = 0;
    long ppid = 0;
    if (!(rest >> state >> ppid) || ppid != long(launch_pid)) continue;
    const std::string env = read_text_if_any(entry.path() / "environ");
    std::istringstream in(env);
    for (std::string var; std::getline(in, var, '\0');)
      if (var.rfind(name + "=", 0) == 0) return var.substr(name.size() + 1);
  }
  return "";
}

TEST(Supervisor, ForgedMalformedAndOversizedHeartbeatsAreIgnoredAndCounted) {
  reference();
  TempDir dir("heartbeats");
  const fs::path run = dir.path() / "run";
  const int sock = ::socket(AF_INET, SOCK_DGRAM, 0);
  ASSERT_GE(sock, 0);
  bool sent = false, sent_bad_rank = false;
  std::string listen, source;
  // Heartbeats every 5 ms instead of 200 (no effect on the training): the supervisor only writes
  // events.log once it hears a heartbeat in phase "step" (see the next test), and the 12 steps here
  // take about 30 ms in all.
  const LaunchResult r =
      run_launch(dir.path(), run, launch_args(run, {"fault.heartbeat_interval_s=0.005"}), [&](const LaunchResult& now) {
        if (sent) return;
        // The address: from events.log's start event; events.log is only written once the supervisor hears
        // a training heartbeat, which in this short run may come late, so mpirun's environment (the same
        // address, handed to the ranks) serves too, whichever comes first.
        for (const json& e : now.events)
          if (e.value("event", "") == "start" && e.contains("listen"))
            listen = e["listen"].get<std::string>(), source = "events.log";
        if (listen.empty()) {
          listen = mpirun_env(now.pid, "MOE_HEARTBEAT_ADDR");
          source = "mpirun's environment";
        }
        if (listen.empty()) return;
        const size_t colon = listen.rfind(':');
        sockaddr_in to{};
        to.sin_family = AF_INET;
        to.sin_port = htons(uint16_t(std::atoi(listen.c_str() + colon + 1)));
        if (colon == std::string::npos || ::inet_pton(AF_INET, listen.substr(0, colon).c_str(), &to.sin_addr) != 1) {
          listen.clear();
          return;
        }
        auto send = [&](const std::string& datagram) {
          ::sendto(sock, datagram.data(), datagram.size(), 0, reinterpret_cast<sockaddr*>(&to), sizeof to);
        };
        std::mt19937_64 rng(std::random_device{}());
        char secret[33];
        std::snprintf(secret, sizeof secret, "%016llx%016llx", static_cast<unsigned long long>(rng()),
                      static_cast<unsigned long long>(rng()));
        const std::string pid = std::to_string(::getpid());
        // A heartbeat in the right format with a made-up secret, for a real rank.
        send(std::string("MOEHB1 ") + secret + " 0 1 " + pid + " 3 step forger");
        // Garbage bytes.
        std::string garbage(64, '\0');
        for (char& c : garbage) c = char(rng());
        garbage[0] = '\x01';
        send(garbage);
        // A 4 KB datagram (the format is right but it is far past 512 bytes).
        send(std::string("MOEHB1 ") + secret + " 0 0 " + pid + " 3 step " + std::string(4096, 'h'));
        // A bad rank: negative (malformed whatever the secret) ...
        send(std::string("MOEHB1 ") + secret + " 0 -1 " + pid + " 3 step forger");
        // ... and out of range, signed with the job's real secret.
        const std::string real = mpirun_env(now.pid, "MOE_HEARTBEAT_SECRET");
        if (!real.empty()) {
          send("MOEHB1 " + real + " 0 7 " + pid + " 3 step forger");
          sent_bad_rank = true;
        }
        sent = true;
      });
  ::close(sock);
  ASSERT_TRUE(sent) << "found no heartbeat address while the launch ran\n" << describe(r);
  EXPECT_EQ(r.exit_code, 0) << describe(r);
  EXPECT_TRUE(events_named(r, "restart").empty()) << "forged heartbeats caused a restart\n" << describe(r);
  std::map<std::string, int64_t> logged, totals;
  for (const json& e : events_named(r, "ignored_heartbeat")) ++logged[e.value("reason", "")];
  for (const json& e : events_named(r, "ignored_heartbeats_total"))
    totals[e.value("reason", "")] += e.value("count", int64_t(0));
  std::cout << "[ figures ] heartbeats sent to " << listen << " (from " << source << "): ignored_heartbeat events";
  for (const auto& [k, v] : logged) std::cout << " '" << k << "' x" << v;
  std::cout << "; totals";
  for (const auto& [k, v] : totals) std::cout << " '" << k << "' " << v;
  std::cout << "\n";
  EXPECT_EQ(logged["wrong secret"], 1) << describe(r);
  EXPECT_EQ(logged["malformed"], 2) << describe(r);
  EXPECT_EQ(logged["oversized"], 1) << describe(r);
  EXPECT_EQ(totals["wrong secret"], 1) << describe(r);
  EXPECT_EQ(totals["malformed"], 2) << describe(r);
  EXPECT_EQ(totals["oversized"], 1) << describe(r);
  if (sent_bad_rank) {
    EXPECT_EQ(logged["rank out of range"], 1) << describe(r);
    EXPECT_EQ(totals["rank out of range"], 1) << describe(r);
  }
  // The oversized datagram is logged as larger than a heartbeat may be (the supervisor reads at most 2 KB
  // of a datagram, so a 4 KB one shows as 2048 bytes).
  for (const json& e : events_named(r, "ignored_heartbeat")) {
    if (e.value("reason", "") == "oversized") {
      EXPECT_GT(e.value("bytes", int64_t(0)), 512) << e.dump();
    }
  }
  expect_same_as_reference(run);
  EXPECT_TRUE(r.left_behind.empty());
}

// events.log of a launch that ran: written whether or not the supervisor heard a heartbeat in phase
// "step" (with heartbeats every 2.5 s, this 12-step run is over before the second one).
TEST(Supervisor, SuccessfulLaunchWritesEventsLogWithoutATrainingHeartbeat) {
  TempDir dir("events");
  const fs::path run = dir.path() / "run";
  const LaunchResult r =
      run_launch(dir.path(), run, launch_args(run, {"fault.heartbeat_interval_s=2.5", "fault.heartbeat_timeout_s=20"}));
  EXPECT_EQ(r.exit_code, 0) << describe(r);
  EXPECT_TRUE(fs::exists(run / "metrics.jsonl"));
  EXPECT_TRUE(fs::exists(run / "events.log")) << "a launch that trained to the end left no events.log\n" << describe(r);
  EXPECT_EQ(events_named(r, "start").size(), 1u) << describe(r);
  EXPECT_EQ(last_event(r), "finished") << describe(r);
  EXPECT_TRUE(r.left_behind.empty());
}

// ---- 8. Bad input ----------------------------------------------------------------------------------------

TEST(Supervisor, UnknownConfigKeyExits2WithoutRunDir) {
  TempDir dir("badkey");
  const fs::path run = dir.path() / "run";
  std::vector<std::string> args = launch_args(run, {"train.no_such_key=1"});
  const LaunchResult r = run_launch(dir.path(), run, args);
  EXPECT_EQ(r.exit_code, 2) << describe(r);
  EXPECT_NE(r.stderr_text.find("no_such_key"), std::string::npos) << "the message names the key\n" << describe(r);
  EXPECT_FALSE(fs::exists(run)) << "a run directory was created for bad input";
}

TEST(Supervisor, LayoutThatDoesNotFitExits2BeforeStartingMpirun) {
  TempDir dir("badnp");
  const fs::path run = dir.path() / "run";
  // A stand-in for mpirun that leaves a mark if it is ever started.
  const fs::path marker = dir.path() / "mpirun-was-started";
  const fs::path fake = dir.path() / "fake-mpirun";
  {
    std::ofstream out(fake);
    out << "#!/bin/sh\ntouch '" << marker.string() << "'\nexit 1\n";
  }
  fs::permissions(fake, fs::perms::owner_all);
  std::vector<std::string> args = launch_args(run, {"parallel.dp=2"});
  args[1] = "3";  // --np 3
  args.insert(args.begin(), "--mpirun=" + fake.string());
  const LaunchResult r = run_launch(dir.path(), run, args);
  EXPECT_EQ(r.exit_code, 2) << describe(r);
  EXPECT_NE(r.stderr_text.find("moe: error"), std::string::npos) << describe(r);
  EXPECT_FALSE(fs::exists(marker)) << "mpirun was started for a layout that cannot fit";
  EXPECT_FALSE(fs::exists(run)) << "a run directory was created for bad input";
}

// Every layout check of the trainer is made before mpirun starts: the rank grid (parallel.ep over a world
// of 3) and the global batch over dp * micro_batch (8 over 3 * 2).
TEST(Supervisor, EveryLayoutCheckComesBeforeMpirun) {
  for (const auto& [set, key] : std::vector<std::pair<std::string, std::string>>{
           {"parallel.ep=2", "parallel.ep"}, {"train.global_batch=8", "train.global_batch"}}) {
    TempDir dir("badlayout");
    const fs::path run = dir.path() / "run";
    const fs::path marker = dir.path() / "mpirun-was-started";
    const fs::path fake = write_stand_in(dir.path() / "fake-mpirun", "touch '" + marker.string() + "'\nexit 0\n");
    std::vector<std::string> args = with_np(launch_args(run, {set}), 3);
    args.insert(args.begin(), "--mpirun=" + fake.string());
    const LaunchResult r = run_launch(dir.path(), run, args);
    EXPECT_EQ(r.exit_code, 2) << set << "\n" << describe(r);
    EXPECT_NE(r.stderr_text.find(key), std::string::npos) << "the message names " << key << "\n" << describe(r);
    EXPECT_FALSE(fs::exists(marker)) << "mpirun was started for a layout that cannot fit (" << set << ")";
    EXPECT_FALSE(fs::exists(run)) << "a run directory was created for bad input (" << set << ")";
  }
}

TEST(Supervisor, NpZeroIsRefusedWithAClearMessage) {
  TempDir dir("np0");
  const fs::path run = dir.path() / "run";
  const LaunchResult r = run_launch(dir.path(), run, with_np(launch_args(run, {}), 0));
  EXPECT_EQ(r.exit_code, 2) << describe(r);
  EXPECT_NE(r.stderr_text.find("--np: expected a whole number of ranks >= 1, got 0"), std::string::npos) << describe(r);
  EXPECT_EQ(r.stderr_text.find("1.79769"), std::string::npos) << "no largest double in the message\n" << describe(r);
  EXPECT_FALSE(fs::exists(run));
}

// mpirun ending with 0 proves nothing: only a rank's heartbeat saying it finished the last step does.
TEST(Supervisor, MpirunExitingAtOnceIsACrashNotSuccess) {
  TempDir dir("exit0");
  const fs::path run = dir.path() / "run";
  const fs::path fake = write_stand_in(dir.path() / "fake-mpirun", "exit 0\n");
  std::vector<std::string> args = launch_args(run, {"fault.max_restarts=1"});
  args.insert(args.begin(), "--mpirun=" + fake.string());
  const LaunchResult r = run_launch(dir.path(), run, args);
  EXPECT_EQ(r.exit_code, 3) << describe(r);
  EXPECT_TRUE(events_named(r, "finished").empty()) << describe(r);
  const auto crashes = events_named(r, "crash");
  ASSERT_EQ(crashes.size(), 2u) << "the first start and its one restart\n" << describe(r);
  for (const json& c : crashes) {
    EXPECT_EQ(c.value("exit_code", -1), 0) << describe(r);
    EXPECT_NE(c.value("reason", "").find("no rank reported finishing the last step"), std::string::npos) << c.dump();
  }
  EXPECT_EQ(events_named(r, "restart").size(), 1u) << describe(r);
  EXPECT_EQ(last_event(r), "gave_up") << describe(r);
}

// SIGTERM to `moe launch`: forwarded to the ranks, no restart, exit 128 + 15, every process of the job
// gone (no process's command line names the run directory), and events.log says so.
void expect_stopped_by_sigterm(const LaunchResult& r, const std::string& during) {
  EXPECT_EQ(r.exit_code, 143) << describe(r);
  EXPECT_TRUE(r.left_behind.empty()) << r.left_behind.size() << " processes of the job outlived the launch\n"
                                     << describe(r);
  EXPECT_TRUE(events_named(r, "restart").empty()) << describe(r);
  EXPECT_TRUE(events_named(r, "finished").empty()) << describe(r);
  ASSERT_EQ(last_event(r), "interrupted") << describe(r);
  const json e = events_named(r, "interrupted").back();
  EXPECT_EQ(e.value("signal", ""), "SIGTERM") << e.dump();
  EXPECT_EQ(e.value("while", ""), during) << e.dump();
  EXPECT_EQ(e.value("processes_left", int64_t(-1)), 0) << e.dump();
  EXPECT_EQ(e.value("exit_code", -1), 143) << e.dump();
  EXPECT_FALSE(r.timed_out);
}

// Ranks of the job whose command line names `run` and holds " train ".
size_t ranks_running(const fs::path& run) {
  size_t n = 0;
  for (pid_t p : processes_mentioning(run.string())) {
    std::string cmdline = read_text_if_any("/proc/" + std::to_string(p) + "/cmdline");
    std::replace(cmdline.begin(), cmdline.end(), '\0', ' ');
    n += cmdline.find(" train ") != std::string::npos;
  }
  return n;
}

TEST(Supervisor, SigtermDuringRankStartUpLeavesNoProcess) {
  TempDir dir("term-startup");
  const fs::path run = dir.path() / "run";
  bool sent = false;
  // 4 ranks on a small machine: mpirun is still starting some when the first one appears.
  const LaunchResult r =
      run_launch(dir.path(), run, with_np(launch_args(run, {"train.steps=100000"}), 4), [&](const LaunchResult& now) {
        if (!sent && ranks_running(run) > 0) sent = ::kill(now.pid, SIGTERM) == 0;
      });
  ASSERT_TRUE(sent) << describe(r);
  expect_stopped_by_sigterm(r, "start-up");
}

TEST(Supervisor, SigtermDuringTrainingLeavesNoProcess) {
  TempDir dir("term-training");
  const fs::path run = dir.path() / "run";
  bool sent = false;
  const LaunchResult r =
      run_launch(dir.path(), run, launch_args(run, {"train.steps=100000", "fault.heartbeat_interval_s=0.05"}),
                 [&](const LaunchResult& now) {
                   if (!sent && !events_named(now, "training").empty()) sent = ::kill(now.pid, SIGTERM) == 0;
                 });
  ASSERT_TRUE(sent) << describe(r);
  expect_stopped_by_sigterm(r, "training");
  const json e = events_named(r, "interrupted").back();
  EXPECT_GE(e.value("ranks_sent_stop", int64_t(0)), 2) << e.dump();
}

// The stand-in ranks below, once their shell runs its loop.
size_t fake_ranks_running(const fs::path& run) {
  size_t n = 0;
  for (pid_t p : processes_mentioning(run.string())) {
    const std::string cmdline = read_text_if_any("/proc/" + std::to_string(p) + "/cmdline");
    n += cmdline.rfind("sh", 0) == 0 && cmdline.find("while :") != std::string::npos;
  }
  return n;
}

// "Ranks" that ignore the stop request (SIGUSR1) and SIGTERM and left mpirun's process group and session (setsid; one
// of them orphaned by a double fork): killed after --term-grace-s, or at once on a second signal.
TEST(Supervisor, RanksThatIgnoreSigtermAndLeftTheGroupAreKilledAfterTheGraceOrASecondSignal) {
  for (const bool second_signal : {false, true}) {
    TempDir dir(second_signal ? "term-twice" : "term-grace");
    const fs::path run = dir.path() / "run";
    const std::string rank = "setsid sh -c 'trap \"\" TERM USR1; while :; do sleep 1; done; : " + run.string() + "'";
    const fs::path fake =
        write_stand_in(dir.path() / "fake-mpirun",
                       "OMPI_COMM_WORLD_RANK=0 " + rank + " &\n( OMPI_COMM_WORLD_RANK=1 " + rank + " & )\nsleep 300\n");
    std::vector<std::string> args = launch_args(run, {});
    args.insert(args.begin(), {"--mpirun=" + fake.string(), "--term-grace-s", second_signal ? "60" : "1"});
    double first_at = 0;
    bool second_sent = false;
    const LaunchResult r = run_launch(dir.path(), run, args, [&](const LaunchResult& now) {
      if (first_at == 0 && fake_ranks_running(run) >= 2 && ::kill(now.pid, SIGTERM) == 0) first_at = now_s();
      if (second_signal && first_at > 0 && !second_sent && now_s() - first_at > 0.5)
        second_sent = ::kill(now.pid, SIGINT) == 0;
    });
    ASSERT_GT(first_at, 0) << describe(r);
    expect_stopped_by_sigterm(r, "start-up");
    const json e = events_named(r, "interrupted").back();
    EXPECT_EQ(e.value("second_signal", !second_signal), second_signal) << e.dump();
    EXPECT_FALSE(e.value("stopped_within_grace", true)) << e.dump();
    EXPECT_GE(e.value("killed", int64_t(0)), 2) << e.dump();
    EXPECT_LT(r.wall_s, 20.0) << "the grace of 1 s, or the second signal, was not honoured\n" << describe(r);
  }
}

// One run directory, one launch: a second is refused (exit 2) naming the first one's host and pid, and
// changes nothing.
TEST(Supervisor, SecondLaunchOnTheSameRunDirectoryIsRefusedNamingTheHolder) {
  TempDir dir("lock"), second_dir("lock-second");
  const fs::path run = dir.path() / "run";
  std::optional<LaunchResult> second;
  pid_t first_pid = 0;
  const LaunchResult r =
      run_launch(dir.path(), run, launch_args(run, {"train.steps=100000"}), [&](const LaunchResult& now) {
        if (second || !fs::exists(run / ".lock")) return;
        first_pid = now.pid;
        // The same directory by another spelling, so that the second launch's clean-up (processes naming its
        // run directory) cannot touch the first one's ranks.
        const fs::path same = run / ".";
        second = run_launch(second_dir.path(), same, launch_args(same, {"train.steps=100000"}));
        ::kill(now.pid, SIGTERM);
      });
  ASSERT_TRUE(second.has_value()) << describe(r);
  EXPECT_EQ(second->exit_code, 2) << describe(*second);
  EXPECT_NE(second->stderr_text.find("process " + std::to_string(first_pid)), std::string::npos) << describe(*second);
  EXPECT_NE(second->stderr_text.find(moe::host_name()), std::string::npos) << describe(*second);
  EXPECT_NE(second->stderr_text.find("in use"), std::string::npos) << describe(*second);
  EXPECT_EQ(events_named(r, "start").size(), 1u) << "the second launch started nothing\n" << describe(r);
  EXPECT_EQ(r.exit_code, 143) << describe(r);
  EXPECT_TRUE(r.left_behind.empty());
  EXPECT_FALSE(fs::exists(run / ".lock")) << "the first launch released its lock";
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
