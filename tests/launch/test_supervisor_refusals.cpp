// What `moe launch` refuses, and how it stops (the real program as a subprocess, as in test_supervisor.cpp):
// bad input exits 2 before mpirun starts and makes no run directory; an mpirun that exits 0 without a rank
// finishing the last step is a crash; SIGTERM during start-up or training, and ranks that ignore it, leave no
// process behind; a second launch on a run directory in use is refused naming the holder. Part of the
// test_supervisor program.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/types.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "core/backend/cpu/thread_policy.h"
#include "core/host.h"
#include "supervisor_harness.h"

namespace {
using namespace moe::test_support;
namespace fs = std::filesystem;
using json = nlohmann::json;
using namespace std::chrono_literals;

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

// More ranks than this machine's usable cores, without a hostfile: mpirun gets --oversubscribe --bind-to none --mca
// mpi_yield_when_idle 1 from moe launch (it would refuse to start, its slots being the cores), and the start event says
// so; not where the user's mpirun arguments say how to place the ranks, nor where the cores suffice. A stand-in
// mpirun records what it was given.
TEST(Supervisor, RanksOutnumberingTheCoresOversubscribeThisMachine) {
  TempDir dir("oversubscribe");
  const fs::path given = dir.path() / "mpirun-args.txt";
  int launches = 0;
  const fs::path fake = write_stand_in(dir.path() / "fake-mpirun", "echo \"$*\" >> " + given.string() + "\nexit 0\n");
  const auto launch = [&](int64_t np, const std::vector<std::string>& mpirun_args) {
    fs::remove(given);
    const fs::path run = dir.path() / ("run" + std::to_string(++launches));
    std::vector<std::string> args = {"--mpirun=" + fake.string(), "--np", std::to_string(np)};
    for (const std::string& a : mpirun_args) args.push_back("--mpirun-arg=" + a);
    args.insert(args.end(), {"--config", kConfig, "--run-dir", run.string(), "--quiet"});
    std::vector<std::string> sets = base_sets();
    sets.insert(sets.end(), {"fault.max_restarts=0", "train.global_batch=" + std::to_string(2 * np)});
    for (const std::string& s : sets) args.insert(args.end(), {"--set", s});
    const LaunchResult r = run_launch(dir.path(), run, args);
    const auto starts = events_named(r, "start");
    EXPECT_EQ(starts.size(), 1u) << describe(r);
    return std::make_pair(read_text_if_any(given), starts.empty() ? json() : starts[0]);
  };
  const int64_t cores = moe::cpu::usable_cores();
  const std::string flags =
      "--oversubscribe --bind-to none --mca mpi_yield_when_idle 1 -np " + std::to_string(cores + 1);
  auto [given_args, start] = launch(cores + 1, {});
  EXPECT_NE(given_args.find(flags), std::string::npos) << given_args;
  EXPECT_EQ(start.value("oversubscribed", false), true) << start.dump();
  std::tie(given_args, start) = launch(cores + 1, {"--bind-to", "core"});
  EXPECT_EQ(given_args.find("--oversubscribe"), std::string::npos) << "the user's placement stands: " << given_args;
  EXPECT_EQ(start.value("oversubscribed", true), false) << start.dump();
  std::tie(given_args, start) = launch(1, {});
  EXPECT_EQ(given_args.find("--oversubscribe"), std::string::npos) << "one rank fits: " << given_args;
  EXPECT_NE(given_args.find("-np 1"), std::string::npos) << given_args;
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

}  // namespace
