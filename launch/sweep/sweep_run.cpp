// Running a sweep's cells under `moe launch` (launch/sweep/sweep.h): the sweep directory checked, locked for the
// sweep's whole life (launch/run/run_lock.h) and written without following links (launch/run/run_files.h), the
// cells not yet finished (or whose results do not bear out their "done") started up to --concurrent at a
// time, each in a process group of its own that dies with the sweep (a Ctrl-C reaches only the sweep, which
// stops each cell cleanly with one SIGTERM; a sweep killed outright takes its cells with it), progress with
// an ETA, and the results rewritten after every cell.
#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <thread>

#include "core/error.h"
#include "launch/run/progress.h"
#include "launch/run/run_dir.h"
#include "launch/run/run_files.h"
#include "launch/run/run_lock.h"
#include "launch/supervise/job_processes.h"
#include "launch/supervise/supervisor.h"
#include "launch/sweep/sweep.h"
#include "launch/sweep/sweep_results.h"
#include "launch/train/config_change.h"

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

// SIGINT and SIGTERM without SA_RESTART: a system call they interrupt returns, and the loop sees the flag.
void catch_stop_signals() {
  struct sigaction action {};
  action.sa_handler = on_sweep_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = 0;
  ::sigaction(SIGINT, &action, nullptr);
  ::sigaction(SIGTERM, &action, nullptr);
}

// What changed in the data since the sweep's plan was written: one line per source, "" when nothing did.
std::string data_changes(const json& then, const json& now) {
  std::string text;
  if (then.size() != now.size()) return "\n  the number of distinct data sections changed";
  for (size_t i = 0; i < now.size(); ++i)
    for (const std::string& line : check_data_change(then[i], now[i], true, "")) text += "\n  " + line;
  return text;
}

// The plan's identity against the one in the directory: another sweep is refused; changed data is refused
// unless --allow-data-change (a plan written before data identities has none, and is not compared).
void check_same_sweep(const std::string& out, const json& previous, const SweepPlan& plan, bool allow_data_change,
                      bool say) {
  const json now = plan.identity();
  std::string what;
  for (const char* part : {"base", "grid", "seeds", "np"})
    if (previous.value(part, json()) != now[part])
      what += std::string(what.empty() ? "" : ", ") + (std::string(part) == "base" ? "the base config" : part);
  if (!what.empty())
    MOE_BAD_INPUT(
        "--out " << out << " holds another sweep (its " << what << " differ from this command's); "
                 << "rerun it with the same --config, --set, --grid, --seeds and --np, or choose another --out");
  if (!previous.contains("data") || previous["data"] == now["data"]) return;
  const std::string changes = data_changes(previous["data"], now["data"]);
  if (!allow_data_change)
    MOE_BAD_INPUT("--out " << out
                           << ": the sweep's data changed since its cells were trained (content xxh64):" << changes
                           << "\nrerun with --allow-data-change if this is meant (cells done keep their results "
                              "on the old data), or choose another --out");
  if (say)
    std::fprintf(stderr, "moe sweep: the data changed since the sweep began (--allow-data-change):%s\n",
                 changes.c_str());
}

// --out: new, empty, or a sweep of this very plan (which the run continues). Writes nothing.
void check_out_dir(const std::string& out, const SweepPlan& plan, bool allow_data_change, bool say) {
  const fs::path dir = out;
  std::error_code ec;
  if (!fs::exists(dir, ec)) {
    check_dir_writable(out, "--out " + out);
    return;
  }
  if (!fs::is_directory(dir, ec)) MOE_BAD_INPUT("--out " << out << ": exists and is not a directory");
  check_dir_writable(out, "--out " + out);
  check_regular_or_missing(dir / "sweep_plan.json", "the sweep's plan");
  const json previous = read_json_regular(dir / "sweep_plan.json");
  if (previous.is_null()) {
    for (const auto& entry : fs::directory_iterator(dir, ec))
      if (entry.path().filename() != ".lock")  // left by a sweep refused before it wrote its plan
        MOE_BAD_INPUT("--out " << out << ": a directory that holds files but no sweep (no sweep_plan.json); "
                               << "choose a new or empty directory");
    return;
  }
  check_same_sweep(out, previous, plan, allow_data_change, say);
}

// Nothing planted in the sweep directory may redirect a write or block a read: each cell's directory is a
// real directory or missing, and every file the sweep reads or appends to is a regular file or missing.
void check_cell_paths(const fs::path& out, const SweepPlan& plan) {
  for (const char* sub : {"cells", "logs", "status"}) {
    const Entry e = entry_kind(out / sub);
    if (e != Entry::Missing && e != Entry::Directory) make_real_dir(out / sub, "the sweep's " + std::string(sub));
  }
  for (const char* file : {"base_config.json", "sweep.json", "sweep.csv"})
    check_regular_or_missing(out / file, "a file of the sweep");
  for (const SweepCell& cell : plan.cells) {
    const fs::path dir = out / "cells" / cell.name;
    const Entry e = entry_kind(dir);
    if (e != Entry::Missing && e != Entry::Directory)
      MOE_BAD_INPUT(dir.string() << " (cell " << cell.name << "'s run directory) is "
                                 << (e == Entry::Link ? "a symbolic link" : "not a directory")
                                 << "; a sweep never trains through a link (remove it)");
    check_regular_or_missing(out / "status" / (cell.name + ".json"), "cell " + cell.name + "'s status");
    check_regular_or_missing(out / "logs" / (cell.name + ".log"), "cell " + cell.name + "'s log");
    for (const char* file : {"metrics.jsonl", "config.json", "manifest.json", ".lock"})
      check_regular_or_missing(dir / file, "a file of cell " + cell.name);
  }
}

// The sweep's own files: its plan (what a rerun must match) and the base config the cells run.
void write_plan_files(const fs::path& out, const SweepPlan& plan) {
  make_real_dir(out / "cells", "the sweep's cells");
  make_real_dir(out / "logs", "the sweep's logs");
  make_real_dir(out / "status", "the sweep's status files");
  replace_run_file(out / "base_config.json", plan.base.dump(2) + "\n");
  replace_run_file(out / "sweep_plan.json", plan.identity().dump(1) + "\n");
}

struct Running {
  pid_t pid = 0;
  size_t cell = 0;
  double started = 0;
};

// `moe launch` for one cell, its output to OUT/logs/NAME.log, in a process group of its own, sent SIGTERM
// if the sweep dies (a clean stop: the cell resumes on the next run). --resume auto with --overwrite: a
// cell cut short continues from its newest checkpoint, one without any starts again; `fresh` (a cell whose
// results did not bear out its "done") starts again from step 0.
pid_t start_cell(const SweepOptions& o, const fs::path& out, const SweepCell& cell, const std::string& self,
                 bool fresh) {
  std::vector<std::string> args = {self, "launch", "--np", std::to_string(o.np)};
  if (o.np > 1)  // ranks may outnumber cores: idle ranks yield and nothing is bound
    for (const std::string& a : oversubscription_mpirun_args()) args.push_back("--mpirun-arg=" + a);
  for (const std::string& a : o.mpirun_args) args.push_back("--mpirun-arg=" + a);
  args.insert(args.end(), {"--config", (out / "base_config.json").string()});
  for (const std::string& s : cell.overrides) args.insert(args.end(), {"--set", s});
  args.insert(args.end(),
              {"--run-dir", (out / "cells" / cell.name).string(), "--resume", fresh ? "none" : "auto", "--overwrite"});
  if (o.allow_data_change) args.push_back("--allow-data-change");
  if (o.quiet) args.push_back("--quiet");
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e) env.emplace_back(*e);
  const int log = open_append_fd(out / "logs" / (cell.name + ".log"));
  try {
    const pid_t pid = spawn_tied(args, env, {.death_signal = SIGTERM, .keep_fd = -1, .output_fd = log});
    ::close(log);
    return pid;
  } catch (...) {
    ::close(log);
    throw;
  }
}

// What a finished moe launch means for its cell: done (when its results bear it out), failed (recorded) or
// interrupted by our signal (not recorded: the next run resumes it).
void record_cell(const fs::path& out, const SweepPlan& plan, const SweepCell& cell, int wait_status,
                 const rusage& usage, double wall_s) {
  const int code = WIFEXITED(wait_status) ? WEXITSTATUS(wait_status) : 128 + WTERMSIG(wait_status);
  if (g_sweep_signal && code >= 128) return;
  const std::string problem = code == 0 ? cell_results_problem(out.string(), plan, cell) : "";
  json status = {{"status", code == 0 && problem.empty() ? "done" : "failed"},
                 {"exit_code", code},
                 {"wall_s", wall_s},
                 {"peak_rss_bytes", int64_t(usage.ru_maxrss) * 1024},
                 {"log", "logs/" + cell.name + ".log"}};
  if (!problem.empty()) status["problem"] = "moe launch ended with 0 but " + problem;
  replace_run_file(out / "status" / (cell.name + ".json"), status.dump() + "\n");
}

bool cell_done(const fs::path& out, const SweepCell& cell) {
  const json status = read_json_regular(out / "status" / (cell.name + ".json"));
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
    record_cell(out, plan, cell, status, usage, wall);
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

// The cells to run: those not done, and those whose status says done but whose results do not bear it out
// (said, and run again from step 0: `fresh`).
std::vector<size_t> cells_to_run(const fs::path& out, const SweepPlan& plan, Tally& tally, std::set<size_t>& fresh) {
  std::vector<size_t> to_run;
  for (size_t i = 0; i < plan.cells.size(); ++i) {
    const SweepCell& cell = plan.cells[i];
    if (!cell_done(out, cell)) {
      to_run.push_back(i);
      continue;
    }
    const std::string problem = cell_results_problem(out.string(), plan, cell);
    if (problem.empty()) {
      tally.done += 1;
      continue;
    }
    std::fprintf(stderr, "moe sweep: cell %s: its status says done, but %s; running it again from step 0\n",
                 cell.name.c_str(), problem.c_str());
    to_run.push_back(i);
    fresh.insert(i);
  }
  return to_run;
}

int run_sweep(const SweepOptions& o) {
  const SweepPlan plan = make_sweep_plan(o);
  char self[4096] = {};
  if (::readlink("/proc/self/exe", self, sizeof self - 1) <= 0) MOE_FAIL("cannot find this program's path");
  const fs::path out = o.out;
  std::error_code ec;
  if (!fs::is_directory(out, ec)) check_out_dir(o.out, plan, o.allow_data_change, false);  // before creating it
  // One sweep at a time in a directory, for the sweep's whole life (a second one is refused naming this
  // one); the directory is checked under the lock, and a refusal removes what the lock created.
  RunLock lock = RunLock::acquire(o.out, "", "--out");
  try {
    check_out_dir(o.out, plan, o.allow_data_change, true);
    check_cell_paths(out, plan);
  } catch (const Error&) {
    lock.release(true);
    throw;
  }
  write_plan_files(out, plan);
  catch_stop_signals();

  Tally tally;
  tally.total = plan.cells.size();
  std::set<size_t> fresh;
  const std::vector<size_t> to_run = cells_to_run(out, plan, tally, fresh);
  std::fprintf(stderr,
               "moe sweep: %zu cells (%zu grid points x %zu seeds), %zu already done, %zu to run, %lld at a time; "
               "results in %s/sweep.json\n",
               tally.total, tally.total / plan.seeds.size(), plan.seeds.size(), tally.done, to_run.size(),
               static_cast<long long>(o.concurrent), o.out.c_str());
  write_sweep_results(o.out, plan);
  std::vector<Running> running;
  size_t next = 0;
  while (next < to_run.size() || !running.empty()) {
    if (g_sweep_signal) return stop_cells(o, out, plan, running, tally);
    while (running.size() < size_t(o.concurrent) && next < to_run.size() && !g_sweep_signal) {
      const size_t cell = to_run[next++];
      running.push_back({start_cell(o, out, plan.cells[cell], self, fresh.count(cell) > 0), cell, now_s()});
    }
    if (!reap_one(o, out, plan, running, tally)) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  write_sweep_results(o.out, plan);
  std::fprintf(stderr, "moe sweep: %zu/%zu cells done, %zu failed; wrote %s/sweep.json and %s/sweep.csv\n", tally.done,
               tally.total, tally.failed, o.out.c_str(), o.out.c_str());
  return tally.failed ? 1 : 0;
}

}  // namespace moe
