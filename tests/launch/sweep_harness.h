// The harness of the `moe sweep` tests that run the real program: the tiny model's settings, running moe
// with a timeout (a hang fails the test instead of blocking it), and reading what a sweep wrote.
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "run_compare.h"

extern char** environ;

namespace moe::sweep_test {
using namespace test_support;
using json = nlohmann::json;

inline const std::string kConfig = std::string(MOE_SOURCE_DIR) + "/configs/tiny_moe.json";
constexpr double kTimeoutS = 120;

// The tiny model: a few steps in well under a second, a checkpoint every 4 steps.
inline std::vector<std::string> tiny_sets(int64_t steps) {
  std::vector<std::string> out;
  for (const std::string s :
       {"train.threads=1", "model.d_model=32", "model.layers=2", "model.heads=2", "model.ffn_hidden=48",
        "moe.num_experts=4", "moe.expert_hidden=32", "train.seq_len=32", "train.global_batch=8", "train.micro_batch=2",
        "train.eval_sequences=2", "train.eval_every=4", "train.log_every=2", "checkpoint.every=4",
        "checkpoint.async=false", "fault.heartbeat_interval_s=0.2", "fault.restart_backoff_s=0.2"})
    out.insert(out.end(), {"--set", s});
  out.insert(out.end(), {"--set", "train.steps=" + std::to_string(steps)});
  return out;
}

inline std::vector<std::string> sweep_args(const fs::path& out, const std::vector<std::string>& grid,
                                           int64_t steps = 8) {
  std::vector<std::string> args = {"sweep", "--config", kConfig};
  const std::vector<std::string> sets = tiny_sets(steps);
  args.insert(args.end(), sets.begin(), sets.end());
  args.insert(args.end(), grid.begin(), grid.end());
  args.insert(args.end(), {"--out", out.string(), "--quiet"});
  return args;
}

struct Ran {
  int code = -1;
  std::string err;  // stderr
};

// Runs moe with `args`; `tick` is called every 20 ms with its pid until it exits.
inline Ran run_moe(const std::vector<std::string>& args, const fs::path& log,
                   const std::function<void(pid_t)>& tick = nullptr) {
  std::vector<std::string> all = {MOE_BINARY};
  all.insert(all.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& a : all) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::error_code ec;
  fs::remove(log, ec);
  posix_spawn_file_actions_t files;
  posix_spawn_file_actions_init(&files);
  posix_spawn_file_actions_addopen(&files, 2, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  pid_t pid = 0;
  EXPECT_EQ(posix_spawn(&pid, MOE_BINARY, &files, nullptr, argv.data(), environ), 0);
  posix_spawn_file_actions_destroy(&files);
  const auto start = std::chrono::steady_clock::now();
  Ran ran;
  for (;;) {
    int status = 0;
    if (::waitpid(pid, &status, WNOHANG) == pid) {
      ran.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      break;
    }
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() > kTimeoutS) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      ADD_FAILURE() << "moe " << args[0] << " ran past " << kTimeoutS << " s (a hang)";
      break;
    }
    if (tick) tick(pid);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ran.err = read_text_if_any(log);
  return ran;
}

inline bool has(const std::string& text, const std::string& needle) { return text.find(needle) != std::string::npos; }

// True once no process mentions `needle`, polling up to `seconds`.
inline bool all_gone_within(const std::string& needle, double seconds) {
  for (int i = 0; i < int(seconds * 20); ++i) {
    if (processes_mentioning(needle).empty()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return processes_mentioning(needle).empty();
}

inline json read_json(const fs::path& path) {
  std::ifstream in(path);
  return json::parse(in);
}

}  // namespace moe::sweep_test
