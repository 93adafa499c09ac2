// `moe sweep` end to end (launch/sweep/sweep.h, docs/sweep.md): the real program, each cell a tiny run under
// `moe launch`. A 2 x 2 grid with 2 seeds gives 8 cells whose configs carry their point and seed, and a
// sweep.json / sweep.csv whose means and standard deviations are those of the cells; a sweep stopped by
// SIGTERM in the middle of a cell and run again ends equal to the uninterrupted one (the cut cell resumed from
// its checkpoint); a failed cell is recorded and the sweep goes on. Bad input: tests/cli/test_bad_input.sh.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "run_compare.h"

extern char** environ;

namespace moe {
namespace {
using namespace test_support;
using json = nlohmann::json;

const std::string kConfig = std::string(MOE_SOURCE_DIR) + "/configs/tiny_moe.json";
constexpr double kTimeoutS = 120;

const std::vector<std::string> kGrid = {
    "--grid", "moe.router.tau=0.5,1.0", "--grid", "moe.capacity_factor=1.0,2.0", "--seeds", "2"};

// The tiny model of every cell: 24 steps in well under a second, a checkpoint every 4 steps.
std::vector<std::string> sweep_args(const fs::path& out, int64_t steps = 24,
                                    const std::vector<std::string>& grid = kGrid) {
  std::vector<std::string> args = {"sweep", "--config", kConfig};
  for (const std::string s :
       {"train.threads=1", "model.d_model=32", "model.layers=2", "model.heads=2", "model.ffn_hidden=48",
        "moe.num_experts=4", "moe.expert_hidden=32", "train.seq_len=32", "train.global_batch=8", "train.micro_batch=2",
        "train.eval_sequences=2", "train.eval_every=12", "train.log_every=2", "checkpoint.every=4",
        "checkpoint.async=false", "moe.router.noise=\"gumbel\"", "fault.heartbeat_interval_s=0.2",
        "fault.restart_backoff_s=0.2"})
    args.insert(args.end(), {"--set", s});
  args.insert(args.end(), {"--set", "train.steps=" + std::to_string(steps)});
  args.insert(args.end(), grid.begin(), grid.end());
  args.insert(args.end(), {"--out", out.string(), "--quiet"});
  return args;
}

// Runs moe with `args`, its output to `log`; `tick` is called every 20 ms with the pid until it exits.
int run_moe(const std::vector<std::string>& args, const fs::path& log,
            const std::function<void(pid_t)>& tick = nullptr) {
  std::vector<std::string> all = {MOE_BINARY};
  all.insert(all.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& a : all) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t files;
  posix_spawn_file_actions_init(&files);
  posix_spawn_file_actions_addopen(&files, 2, log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  pid_t pid = 0;
  EXPECT_EQ(posix_spawn(&pid, MOE_BINARY, &files, nullptr, argv.data(), environ), 0);
  posix_spawn_file_actions_destroy(&files);
  const auto start = std::chrono::steady_clock::now();
  for (;;) {
    int status = 0;
    if (::waitpid(pid, &status, WNOHANG) == pid)
      return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() > kTimeoutS) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      ADD_FAILURE() << "moe " << args[0] << " ran past " << kTimeoutS << " s";
      return -1;
    }
    if (tick) tick(pid);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

json read_json(const fs::path& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << "cannot open " << path;
  return json::parse(in);
}

std::vector<json> lines_of(const fs::path& path) {
  std::vector<json> lines;
  std::ifstream in(path);
  for (std::string text; std::getline(in, text);) lines.push_back(without_timing(json::parse(text)));
  return lines;
}

// sweep.json without what measures the machine (throughput, wall time, memory use).
json without_machine(json doc) {
  for (json& c : doc["cells"]) {
    c.erase("wall_s"), c.erase("peak_rss_bytes");
    if (c.contains("figures")) c["figures"].erase("tokens_per_s"), c["figures"].erase("peak_rss_bytes");
  }
  for (json& g : doc["summary"])
    for (const char* part : {"mean", "std"}) g[part].erase("tokens_per_s"), g[part].erase("peak_rss_bytes");
  return doc;
}

std::string tail(const fs::path& log) {
  const std::string text = read_text_if_any(log);
  return text.size() > 3000 ? text.substr(text.size() - 3000) : text;
}

// The 2 x 2 grid with 2 seeds, uninterrupted (the reference), then again stopped by SIGTERM while cell 002 is
// half way and rerun: the same cells, the same metrics bit for bit, the same sweep.json.
TEST(Sweep, AGridWithSeedsAndAnInterruptedRerunEqualToTheUninterruptedOne) {
  TempDir dir("sweep");
  const fs::path whole = dir.path() / "whole", cut = dir.path() / "cut";
  ASSERT_EQ(run_moe(sweep_args(whole), dir.path() / "whole.log"), 0) << tail(dir.path() / "whole.log");
  const json doc = read_json(whole / "sweep.json");
  ASSERT_EQ(doc["cells"].size(), 8u);
  ASSERT_EQ(doc["summary"].size(), 4u);
  for (const json& c : doc["cells"]) {
    EXPECT_EQ(c["status"], "done") << c.dump();
    const json config = read_json(whole / c["run_dir"].get<std::string>() / "config.json");
    EXPECT_EQ(config["moe"]["router"]["tau"], c["params"]["moe.router.tau"]);
    EXPECT_EQ(config["moe"]["capacity_factor"], c["params"]["moe.capacity_factor"]);
    EXPECT_EQ(config["train"]["seed"], c["seed"]);
    EXPECT_TRUE(c["figures"].contains("eval_loss") && c["figures"].contains("overflow_ratio")) << c.dump();
  }
  // Each grid point's mean and sample std over its two seeds.
  for (const json& g : doc["summary"]) {
    std::vector<double> losses;
    for (const json& c : doc["cells"])
      if (c["params"] == g["params"]) losses.push_back(c["figures"]["eval_loss"].get<double>());
    ASSERT_EQ(losses.size(), 2u);
    EXPECT_EQ(g["n"], 2);
    EXPECT_DOUBLE_EQ(g["mean"]["eval_loss"].get<double>(), (losses[0] + losses[1]) / 2);
    EXPECT_NEAR(g["std"]["eval_loss"].get<double>(), std::fabs(losses[0] - losses[1]) / std::sqrt(2.0), 1e-12);
  }
  const std::string csv = read_text(whole / "sweep.csv");
  EXPECT_EQ(csv.rfind("row,cell,moe.router.tau,moe.capacity_factor,seed,status,n,", 0), 0u) << csv.substr(0, 200);
  EXPECT_EQ(std::count(csv.begin(), csv.end(), '\n'), 1 + 8 + 4);

  // Stopped in the middle of cell 002, then run again to the end.
  const std::string cell = doc["cells"][2]["name"];
  bool stopped = false;
  const int rc = run_moe(sweep_args(cut), dir.path() / "cut.log", [&](pid_t pid) {
    if (stopped) return;
    for (const json& line : std::vector<json>(lines_of(cut / "cells" / cell / "metrics.jsonl")))
      if (line.value("step", 0) >= 10) stopped = true;
    if (stopped) ::kill(pid, SIGTERM);
  });
  ASSERT_TRUE(stopped) << tail(dir.path() / "cut.log");
  EXPECT_EQ(rc, 128 + SIGTERM) << tail(dir.path() / "cut.log");
  EXPECT_FALSE(fs::exists(cut / "cells" / doc["cells"][3]["name"].get<std::string>())) << "no cell after the cut one";
  ASSERT_EQ(run_moe(sweep_args(cut), dir.path() / "cut.log"), 0) << tail(dir.path() / "cut.log");
  const std::vector<json> starts = lines_of(cut / "cells" / cell / "config_history.jsonl");
  ASSERT_EQ(starts.size(), 2u) << "the cut cell started twice";
  EXPECT_FALSE(starts[1]["resumed_from"].is_null()) << "and resumed from a checkpoint: " << starts[1].dump();
  for (const json& c : doc["cells"]) {
    const std::string run = c["run_dir"];
    const auto a = lines_of(whole / run / "metrics.jsonl"), b = lines_of(cut / run / "metrics.jsonl");
    ASSERT_EQ(a.size(), b.size()) << run;
    for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(first_difference(a[i], b[i]), "") << run << " line " << i + 1;
  }
  EXPECT_EQ(first_difference(without_machine(doc), without_machine(read_json(cut / "sweep.json"))), "");
}

// A cell whose job fails for good (a rank killed at step 3 with no restart allowed) is recorded with its exit
// code; the other cell (one restart allowed) recovers under moe launch and finishes; the sweep exits 1.
TEST(Sweep, AFailedCellIsRecordedAndTheSweepGoesOn) {
  TempDir dir("sweep_fail");
  std::vector<std::string> args = sweep_args(dir.path() / "out", 8, {"--grid", "fault.max_restarts=0,1"});
  args.insert(args.end(), {"--set", "fault.inject=[{\"kind\": \"kill\", \"rank\": 0, \"step\": 3}]"});
  EXPECT_EQ(run_moe(args, dir.path() / "log"), 1) << tail(dir.path() / "log");
  const json doc = read_json(dir.path() / "out" / "sweep.json");
  ASSERT_EQ(doc["cells"].size(), 2u);
  EXPECT_EQ(doc["cells"][0]["status"], "failed");
  EXPECT_EQ(doc["cells"][0]["exit_code"], 3) << "moe launch gave up";
  EXPECT_EQ(doc["cells"][1]["status"], "done");
  EXPECT_EQ(doc["summary"][1]["n"], 1);
  EXPECT_EQ(doc["summary"][0]["n"], 0) << "a failed cell does not enter the means";
}

}  // namespace
}  // namespace moe
