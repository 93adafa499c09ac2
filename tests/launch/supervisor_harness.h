// The harness of the supervisor tests: running the real `moe launch` as a subprocess (with a timeout and
// a per-tick callback), finding processes a job left behind, and reading its events.log.
#pragma once

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

#include "run_compare.h"

extern char** environ;

namespace moe::test_support {

using namespace std::chrono_literals;

inline const std::string kConfig = std::string(MOE_SOURCE_DIR) + "/configs/tiny_moe.json";
inline constexpr double kLaunchTimeoutS = 60;  // one `moe launch`, restarts included

inline double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// The tiny model and the supervisor's timings every case shares (the brief's overrides).
inline std::vector<std::string> base_sets() {
  return {"train.threads=1", "model.d_model=32", "model.layers=2", "model.heads=2", "model.ffn_hidden=48",
          "moe.num_experts=4", "moe.expert_hidden=32", "train.seq_len=32", "train.global_batch=8",
          "train.micro_batch=2", "train.eval_sequences=2", "train.steps=12", "checkpoint.every=5", "train.log_every=1",
          "fault.heartbeat_interval_s=0.2", "fault.heartbeat_timeout_s=2", "fault.restart_backoff_s=0.2",
          // A save commits before the step returns: with asynchronous saves a commit waits for the next
          // step boundary at which every writer is done, so which checkpoint a fault finds committed
          // would depend on timing (steps here take ~20 ms).
          "checkpoint.async=false"};
}

inline std::vector<std::string> mpirun_args() {
  return {"--mpirun-arg=--oversubscribe", "--mpirun-arg=--bind-to",           "--mpirun-arg=none",
          "--mpirun-arg=--mca",           "--mpirun-arg=mpi_yield_when_idle", "--mpirun-arg=1"};
}

inline std::vector<json> read_json_lines(const fs::path& path) {
  std::vector<json> out;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    if (line.empty()) continue;
    try {
      out.push_back(json::parse(line));
    } catch (const std::exception&) {
      out.push_back(json{{"unparsable", line}});
    }
  }
  return out;
}

// What the test saw of a launch while it ran: when each fault marker and each events.log line appeared.
struct Observed {
  std::map<std::string, double> markers;  // RUN_DIR/faults/<name> -> first seen (steady seconds)
  std::vector<double> event_seen;         // per events.log line, first seen
  // After the first restart event appeared: when metrics.jsonl was first written again (the resumed run
  // rewrites it just before its first step, then appends a line per step).
  double metrics_resumed = -1;
  std::optional<fs::file_time_type> metrics_at_restart;
};

struct LaunchResult {
  pid_t pid = 0;  // of `moe launch`
  int exit_code = -1;
  bool timed_out = false;
  double started = 0, wall_s = 0;
  std::string stderr_text;
  fs::path run_dir;
  std::vector<json> events;
  Observed observed;
  std::vector<pid_t> left_behind;  // processes of the job still there when the launch ended
};

// Runs `moe launch` (args after "launch") with stdout and stderr in `base`, calling `tick` about every 20 ms
// while it runs. Kills the launch (and any process of its job) after kLaunchTimeoutS.
inline LaunchResult run_launch(const fs::path& base, const fs::path& run_dir,
                               const std::vector<std::string>& launch_args,
                               const std::function<void(const LaunchResult&)>& tick = {}) {
  LaunchResult r;
  r.run_dir = run_dir;
  std::vector<std::string> args = {MOE_BINARY, "launch"};
  args.insert(args.end(), launch_args.begin(), launch_args.end());
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const std::string out_path = (base / "launch.stdout").string(), err_path = (base / "launch.stderr").string();
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_addopen(&actions, 2, err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  // OMP_NUM_THREADS=1 for every rank (2 ranks on a small machine).
  std::vector<std::string> env_text;
  for (char** e = environ; *e; ++e)
    if (std::strncmp(*e, "OMP_NUM_THREADS=", 16) != 0) env_text.emplace_back(*e);
  env_text.push_back("OMP_NUM_THREADS=1");
  std::vector<char*> envp;
  for (std::string& e : env_text) envp.push_back(e.data());
  envp.push_back(nullptr);
  pid_t pid = 0;
  r.started = now_s();
  const int rc = posix_spawn(&pid, args[0].c_str(), &actions, nullptr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) {
    ADD_FAILURE() << "cannot start " << args[0] << ": " << std::strerror(rc);
    return r;
  }
  r.pid = pid;
  const fs::path events_path = run_dir / "events.log", faults_dir = run_dir / "faults";
  int status = 0;
  for (;;) {
    const pid_t done = ::waitpid(pid, &status, WNOHANG);
    const double t = now_s();
    std::error_code ec;
    if (fs::is_directory(faults_dir, ec))
      for (const auto& entry : fs::directory_iterator(faults_dir, ec))
        r.observed.markers.emplace(entry.path().filename().string(), t);
    if (fs::exists(events_path, ec)) {
      std::vector<json> events = read_json_lines(events_path);
      // A line still being written parses badly: count only the complete ones.
      while (!events.empty() && events.back().contains("unparsable")) events.pop_back();
      while (r.observed.event_seen.size() < events.size()) r.observed.event_seen.push_back(t);
      r.events = std::move(events);
    }
    Observed& o = r.observed;
    if (o.metrics_resumed < 0) {
      const auto mtime = fs::last_write_time(run_dir / "metrics.jsonl", ec);
      const bool restarted = std::any_of(r.events.begin(), r.events.end(),
                                         [](const json& e) { return e.value("event", "") == "restart"; });
      if (!ec && restarted && !o.metrics_at_restart)
        o.metrics_at_restart = mtime;
      else if (!ec && o.metrics_at_restart && mtime != *o.metrics_at_restart)
        o.metrics_resumed = t;
    }
    if (done == pid) break;
    if (tick) tick(r);
    if (t - r.started > kLaunchTimeoutS) {
      r.timed_out = true;
      ::kill(pid, SIGTERM);  // the supervisor ends its job on SIGTERM
      for (int i = 0; i < 50 && ::waitpid(pid, &status, WNOHANG) == 0; ++i) std::this_thread::sleep_for(100ms);
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      break;
    }
    std::this_thread::sleep_for(20ms);
  }
  r.wall_s = now_s() - r.started;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.stderr_text = read_text_if_any(err_path);
  r.events = read_json_lines(events_path);
  r.left_behind = processes_mentioning(run_dir.string());
  // Whatever the verdict, no process of this test outlives it.
  for (pid_t p : r.left_behind) ::kill(p, SIGKILL);
  return r;
}

inline std::vector<std::string> launch_args(const fs::path& run_dir, const std::vector<std::string>& extra_sets) {
  std::vector<std::string> args = {"--np", "2"};
  const std::vector<std::string> mpi = mpirun_args();
  args.insert(args.end(), mpi.begin(), mpi.end());
  args.insert(args.end(), {"--config", kConfig});
  std::vector<std::string> sets = base_sets();
  sets.insert(sets.end(), extra_sets.begin(), extra_sets.end());
  for (const std::string& s : sets) args.insert(args.end(), {"--set", s});
  args.insert(args.end(), {"--run-dir", run_dir.string(), "--quiet"});
  return args;
}

// An executable shell script standing in for mpirun (or a rank), for cases that need no MPI.
inline fs::path write_stand_in(const fs::path& path, const std::string& body) {
  {
    std::ofstream out(path);
    out << "#!/bin/sh\n" << body;
  }
  fs::permissions(path, fs::perms::owner_all);
  return path;
}

// launch_args with another --np.
inline std::vector<std::string> with_np(std::vector<std::string> args, int np) {
  args[1] = std::to_string(np);  // launch_args starts with --np N
  return args;
}

inline std::string describe(const LaunchResult& r) {
  std::ostringstream out;
  out << "exit " << r.exit_code << (r.timed_out ? " (timed out)" : "") << " after " << r.wall_s << " s\nevents.log:\n";
  for (const json& e : r.events) out << "  " << e.dump() << "\n";
  std::string err = r.stderr_text;
  if (err.size() > 4000) err = "..." + err.substr(err.size() - 4000);
  out << "stderr:\n" << err;
  return out.str();
}

// The last event but the ignored-heartbeat totals that may follow it.
inline std::string last_event(const LaunchResult& r) {
  for (auto it = r.events.rbegin(); it != r.events.rend(); ++it)
    if (it->value("event", "") != "ignored_heartbeats_total") return it->value("event", "");
  return "";
}

inline std::vector<json> events_named(const LaunchResult& r, const std::string& name) {
  std::vector<json> out;
  for (const json& e : r.events)
    if (e.value("event", "") == name) out.push_back(e);
  return out;
}

}  // namespace moe::test_support
