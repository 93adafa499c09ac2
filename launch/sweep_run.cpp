// Running a sweep's cells under `moe launch` (launch/sweep.h): the sweep directory checked and written, the
// cells not yet finished started up to --concurrent at a time, each in a process group of its own (a Ctrl-C
// reaches only the sweep, which stops each cell cleanly with one SIGTERM), progress with an ETA, and the
// results rewritten after every cell.
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include "core/error.h"
#include "launch/progress.h"
#include "launch/run_dir.h"
#include "launch/sweep.h"
#include "launch/sweep_results.h"

extern char** environ;

namespace moe {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

volatile sig_atomic_t g_sweep_signal = 0;
void on_sweep_signal(int sig) {
  if (g_sweep_signal == 0) g_sweep_signal = sig;
}

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

json read_json_or_null(const fs::path& path) {
  std::ifstream in(path);
  if (!in) return json();
  try {
    return json::parse(in);
  } catch (const std::exception&) {
    return json();
  }
}

// --out: new, empty, or a sweep of this very plan (which the run continues). Writes nothing.
void check_out_dir(const std::string& out, const SweepPlan& plan) {
  const fs::path dir = out;
  std::error_code ec;
  if (!fs::exists(dir, ec)) {
    check_dir_writable(out, "--out " + out);
    return;
  }
  if (!fs::is_directory(dir, ec)) MOE_BAD_INPUT("--out " << out << ": exists and is not a directory");
  check_dir_writable(out, "--out " + out);
  const json previous = read_json_or_null(dir / "sweep_plan.json");
  if (previous.is_null()) {
    if (!fs::is_empty(dir, ec))
      MOE_BAD_INPUT("--out " << out << ": a directory that holds files but no sweep (no sweep_plan.json); "
                             << "choose a new or empty directory");
    return;
  }
  if (previous != plan.identity()) {
    std::string what;
    for (const char* part : {"base", "grid", "seeds", "np"})
      if (previous.value(part, json()) != plan.identity()[part])
        what += std::string(what.empty() ? "" : ", ") + (std::string(part) == "base" ? "the base config" : part);
    MOE_BAD_INPUT(
        "--out " << out << " holds another sweep (its " << what << " differ from this command's); "
                 << "rerun it with the same --config, --set, --grid, --seeds and --np, or choose another --out");
  }
}

// The sweep's own files: its plan (what a rerun must match) and the base config the cells run.
void write_plan_files(const fs::path& out, const SweepPlan& plan) {
  fs::create_directories(out / "cells");
  fs::create_directories(out / "logs");
  fs::create_directories(out / "status");
  std::ofstream(out / "base_config.json", std::ios::trunc) << plan.base.dump(2) << "\n";
  std::ofstream(out / "sweep_plan.json", std::ios::trunc) << plan.identity().dump(1) << "\n";
}

struct Running {
  pid_t pid = 0;
  size_t cell = 0;
  double started = 0;
};

// `moe launch` for one cell, its output to OUT/logs/NAME.log, in a process group of its own. --resume auto
// with --overwrite: a cell cut short continues from its newest checkpoint, one without any starts again.
pid_t start_cell(const SweepOptions& o, const fs::path& out, const SweepCell& cell, const std::string& self) {
  std::vector<std::string> args = {self, "launch", "--np", std::to_string(o.np)};
  if (o.np > 1)  // ranks may outnumber cores: idle ranks yield and nothing is bound
    for (const char* a : {"--oversubscribe", "--bind-to", "none", "--mca", "mpi_yield_when_idle", "1"})
      args.push_back(std::string("--mpirun-arg=") + a);
  for (const std::string& a : o.mpirun_args) args.push_back("--mpirun-arg=" + a);
  args.insert(args.end(), {"--config", (out / "base_config.json").string()});
  for (const std::string& s : cell.overrides) args.insert(args.end(), {"--set", s});
  args.insert(args.end(), {"--run-dir", (out / "cells" / cell.name).string(), "--resume", "auto", "--overwrite"});
  if (o.quiet) args.push_back("--quiet");
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const std::string log = (out / "logs" / (cell.name + ".log")).string();
  posix_spawn_file_actions_t files;
  posix_spawn_file_actions_init(&files);
  posix_spawn_file_actions_addopen(&files, 1, log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  posix_spawn_file_actions_adddup2(&files, 1, 2);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK);
  posix_spawnattr_setpgroup(&attr, 0);
  sigset_t none;
  sigemptyset(&none);
  posix_spawnattr_setsigmask(&attr, &none);
  pid_t pid = 0;
  const int rc = posix_spawn(&pid, self.c_str(), &files, &attr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&files);
  posix_spawnattr_destroy(&attr);
  if (rc != 0) MOE_FAIL("cannot start moe launch for cell " << cell.name << ": " << std::strerror(rc));
  return pid;
}

// What a finished moe launch means for its cell: done, failed (recorded) or interrupted by our signal (not
// recorded: the next run resumes it).
void record_cell(const fs::path& out, const SweepCell& cell, int wait_status, const rusage& usage, double wall_s) {
  const int code = WIFEXITED(wait_status) ? WEXITSTATUS(wait_status) : 128 + WTERMSIG(wait_status);
  if (g_sweep_signal && code >= 128) return;
  const json status = {{"status", code == 0 ? "done" : "failed"},
                       {"exit_code", code},
                       {"wall_s", wall_s},
                       {"peak_rss_bytes", int64_t(usage.ru_maxrss) * 1024},
                       {"log", "logs/" + cell.name + ".log"}};
  std::ofstream(out / "status" / (cell.name + ".json"), std::ios::trunc) << status.dump() << "\n";
}

bool cell_done(const fs::path& out, const SweepCell& cell) {
  const json status = read_json_or_null(out / "status" / (cell.name + ".json"));
  return status.is_object() && status.value("status", "") == "done";
}

struct Tally {
  size_t total = 0, done = 0, failed = 0, ran = 0;
  double ran_s = 0;
};

void print_progress(const SweepOptions& o, const Tally& tally, const std::string& name, const std::string& outcome,
                    double wall_s) {
  const size_t left = tally.total - tally.done - tally.failed;
  const double eta = tally.ran > 0 ? tally.ran_s / double(tally.ran) * double(left) / double(o.concurrent) : 0.0;
  std::fprintf(stderr, "moe sweep: %zu/%zu cells done%s | cell %s %s in %s | ETA %s\n", tally.done, tally.total,
               tally.failed ? (" (" + std::to_string(tally.failed) + " failed)").c_str() : "", name.c_str(),
               outcome.c_str(), format_duration(wall_s).c_str(), left ? format_duration(eta).c_str() : "0s");
}

// Waits for one running cell to end (polling, so a signal is noticed); false when none ended yet.
bool reap_one(const SweepOptions& o, const fs::path& out, const SweepPlan& plan, std::vector<Running>& running,
              Tally& tally) {
  for (size_t i = 0; i < running.size(); ++i) {
    int status = 0;
    rusage usage{};
    if (::wait4(running[i].pid, &status, WNOHANG, &usage) != running[i].pid) continue;
    const SweepCell& cell = plan.cells[running[i].cell];
    const double wall = now_s() - running[i].started;
    record_cell(out, cell, status, usage, wall);
    running.erase(running.begin() + std::ptrdiff_t(i));
    if (g_sweep_signal) return true;
    const bool ok = cell_done(out, cell);
    (ok ? tally.done : tally.failed) += 1;
    tally.ran += 1, tally.ran_s += wall;
    print_progress(o, tally, cell.name, ok ? "finished" : "FAILED (see logs/" + cell.name + ".log)", wall);
    write_sweep_results(out.string(), plan);
    return true;
  }
  return false;
}

// A signal: one SIGTERM to each running cell's moe launch (a clean stop with a checkpoint), then wait for them.
int stop_cells(const SweepOptions& o, const fs::path& out, const SweepPlan& plan, std::vector<Running>& running,
               Tally& tally) {
  const int sig = int(g_sweep_signal);
  std::fprintf(stderr, "moe sweep: %s received: stopping %zu running cell(s); rerun the same command to continue\n",
               sig == SIGINT ? "SIGINT" : "SIGTERM", running.size());
  for (const Running& r : running) ::kill(r.pid, SIGTERM);
  while (!running.empty())
    if (!reap_one(o, out, plan, running, tally)) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  write_sweep_results(out.string(), plan);
  return 128 + sig;
}

}  // namespace

int run_sweep(const SweepOptions& o) {
  const SweepPlan plan = make_sweep_plan(o);
  check_out_dir(o.out, plan);
  char self[4096] = {};
  if (::readlink("/proc/self/exe", self, sizeof self - 1) <= 0) MOE_FAIL("cannot find this program's path");
  const fs::path out = o.out;
  write_plan_files(out, plan);
  ::signal(SIGINT, on_sweep_signal);
  ::signal(SIGTERM, on_sweep_signal);

  Tally tally;
  tally.total = plan.cells.size();
  std::vector<size_t> todo;
  for (size_t i = 0; i < plan.cells.size(); ++i) {
    if (cell_done(out, plan.cells[i]))
      tally.done += 1;
    else
      todo.push_back(i);
  }
  std::fprintf(stderr,
               "moe sweep: %zu cells (%zu grid points x %zu seeds), %zu already done, %zu to run, %lld at a time; "
               "results in %s/sweep.json\n",
               tally.total, tally.total / plan.seeds.size(), plan.seeds.size(), tally.done, todo.size(),
               static_cast<long long>(o.concurrent), o.out.c_str());
  write_sweep_results(o.out, plan);
  std::vector<Running> running;
  size_t next = 0;
  while (next < todo.size() || !running.empty()) {
    if (g_sweep_signal) return stop_cells(o, out, plan, running, tally);
    while (running.size() < size_t(o.concurrent) && next < todo.size() && !g_sweep_signal) {
      const size_t cell = todo[next++];
      running.push_back({start_cell(o, out, plan.cells[cell], self), cell, now_s()});
    }
    if (!reap_one(o, out, plan, running, tally)) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  write_sweep_results(o.out, plan);
  std::fprintf(stderr, "moe sweep: %zu/%zu cells done, %zu failed; wrote %s/sweep.json and %s/sweep.csv\n", tally.done,
               tally.total, tally.failed, o.out.c_str(), o.out.c_str());
  return tally.failed ? 1 : 0;
}

}  // namespace moe
