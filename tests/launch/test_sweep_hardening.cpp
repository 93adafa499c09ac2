// `moe sweep` against a careless or hostile user (launch/sweep/sweep.h, docs/sweep.md), through the real program:
// every count checked against its limit before anything is allocated; equal grid values however spelt are
// one value (listed twice: refused); a done cell is trusted only with its results; a resumed sweep on
// changed data is refused unless --allow-data-change; nothing planted in the sweep directory (a link, a
// FIFO, a directory) is written through or blocks the sweep; a second sweep into one --out is refused
// naming the first; a sweep killed with SIGKILL takes its running cell with it.
#include <sys/stat.h>

#include "sweep_harness.h"

namespace moe::sweep_test {
namespace {

const std::vector<std::string> kTwoCells = {"--grid", "moe.router.tau=0.5,1.0"};

// Refused with exit 2 before anything is written, the message holding every needle.
void expect_refused(const std::vector<std::string>& grid, const std::vector<std::string>& needles,
                    const std::string& what) {
  TempDir dir("sweep_refused");
  const Ran ran = run_moe(sweep_args(dir.path() / "out", grid), dir.path() / "log");
  EXPECT_EQ(ran.code, 2) << what << ": " << ran.err;
  for (const std::string& n : needles) EXPECT_TRUE(has(ran.err, n)) << what << ": lacks '" << n << "': " << ran.err;
  EXPECT_FALSE(fs::exists(dir.path() / "out")) << what << ": nothing written";
}

TEST(SweepHardening, EveryCountIsCheckedAgainstItsLimitBeforeAnythingIsAllocated) {
  expect_refused({"--grid", "moe.router.tau=0.5", "--seeds", "99999999999"}, {"--seeds 99999999999", "10000"},
                 "seeds far past the limit");
  expect_refused({"--grid", "moe.router.tau=0.5,1.0", "--seeds", "5001"}, {"--seeds", "10000"},
                 "seeds times a grid point count");
  std::string many = "moe.router.tau=";
  for (int i = 1; i <= 10001; ++i) many += (i > 1 ? "," : "") + std::to_string(i);
  expect_refused({"--grid", many}, {"--grid moe.router.tau", "10000"}, "one axis of too many values");
  std::string thirty;
  for (int i = 1; i <= 30; ++i) thirty += (i > 1 ? "," : "") + std::to_string(i);
  expect_refused(
      {"--grid", "moe.router.tau=" + thirty, "--grid", "moe.capacity_factor=" + thirty, "--grid", "optim.lr=" + thirty},
      {"more than 10000", "optim.lr"}, "a product of axes past the limit");
  expect_refused({"--grid", "moe.router.tau=0.5", "--seeds", "2", "--set", "train.seed=9223372036854775807"},
                 {"--seeds 2"}, "seeds past the largest seed");
}

TEST(SweepHardening, EqualValuesSpeltDifferentlyAreOneValueAndRefusedTwice) {
  expect_refused({"--grid", "moe.router.tau=0.5,0.50,5e-1"}, {"moe.router.tau", "0.5 and 0.50"}, "decimal spellings");
  expect_refused({"--grid", "moe.capacity_factor=1,1.0"}, {"moe.capacity_factor", "1 and 1.0"}, "integer and float");
  expect_refused({"--grid", "moe.router.noise=gumbel,\"gumbel\""}, {"moe.router.noise", "gumbel"},
                 "a string with and without quotes");
  expect_refused({"--grid", "train.steps=4,4"}, {"train.steps", "4 and 4"}, "an integer twice");
  // Distinct values spelt unusually are kept, each once, canonical in the plan.
  TempDir dir("sweep_canonical");
  const Ran ran =
      run_moe(sweep_args(dir.path() / "out", {"--grid", "moe.router.tau=5e-1,1.00"}, 2), dir.path() / "log");
  ASSERT_EQ(ran.code, 0) << ran.err;
  const json doc = read_json(dir.path() / "out" / "sweep.json");
  ASSERT_EQ(doc["cells"].size(), 2u);
  EXPECT_EQ(doc["grid"][0]["values"], json::parse("[0.5, 1.0]"));
}

// A finished two-cell sweep, its cell names, and a rerun of the same command.
struct Finished {
  TempDir dir{"sweep_finished"};
  fs::path out = dir.path() / "out";
  std::vector<std::string> names;
  std::vector<std::string> extra;  // more arguments for every run
  Finished() {
    const Ran ran = run_moe(args(), dir.path() / "log");
    EXPECT_EQ(ran.code, 0) << ran.err;
    const json doc = read_json(out / "sweep.json");
    for (const json& c : doc["cells"]) names.push_back(c["name"]);
  }
  std::vector<std::string> args() const {
    std::vector<std::string> a = sweep_args(out, kTwoCells, 4);
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  }
  Ran rerun() const { return run_moe(args(), dir.path() / "rerun.log"); }
  fs::path cell(size_t i) const { return out / "cells" / names.at(i); }
};

int64_t steps_done(const fs::path& out, size_t cell) {
  return read_json(out / "sweep.json")["cells"][cell]["figures"].value("steps_done", int64_t(-1));
}

TEST(SweepHardening, ADoneCellIsTrustedOnlyWithItsResults) {
  Finished f;
  ASSERT_EQ(f.names.size(), 2u);
  // Nothing amiss: nothing runs again.
  Ran ran = f.rerun();
  EXPECT_EQ(ran.code, 0) << ran.err;
  EXPECT_FALSE(has(ran.err, "running it again")) << ran.err;
  // metrics.jsonl cut short (its last training lines gone).
  std::vector<std::string> lines;
  {
    std::ifstream in(f.cell(0) / "metrics.jsonl");
    for (std::string l; std::getline(in, l);) lines.push_back(l);
  }
  {
    std::ofstream cut(f.cell(0) / "metrics.jsonl", std::ios::trunc);
    for (size_t i = 0; i + 3 < lines.size(); ++i) cut << lines[i] << "\n";
  }
  ran = f.rerun();
  EXPECT_EQ(ran.code, 0) << ran.err;
  EXPECT_TRUE(has(ran.err, "cell " + f.names[0] + ": its status says done, but its metrics.jsonl ends at step"))
      << ran.err;
  EXPECT_EQ(steps_done(f.out, 0), 4);
  // metrics.jsonl gone.
  fs::remove(f.cell(1) / "metrics.jsonl");
  ran = f.rerun();
  EXPECT_EQ(ran.code, 0) << ran.err;
  EXPECT_TRUE(has(ran.err, "cell " + f.names[1] + ": its status says done, but its metrics.jsonl is missing"))
      << ran.err;
  EXPECT_EQ(steps_done(f.out, 1), 4);
  // The two cells' run directories swapped: each holds the other's point.
  fs::rename(f.cell(0), f.dir.path() / "swap");
  fs::rename(f.cell(1), f.cell(0));
  fs::rename(f.dir.path() / "swap", f.cell(1));
  ran = f.rerun();
  EXPECT_EQ(ran.code, 0) << ran.err;
  EXPECT_TRUE(has(ran.err, "its config.json has moe.router.tau = 1.0, not 0.5")) << ran.err;
  const json doc = read_json(f.out / "sweep.json");
  for (const json& c : doc["cells"]) {
    EXPECT_EQ(c["status"], "done");
    EXPECT_EQ(read_json(f.out / c["run_dir"].get<std::string>() / "config.json")["moe"]["router"]["tau"],
              c["params"]["moe.router.tau"]);
  }
  // A whole run directory gone.
  fs::remove_all(f.cell(1));
  ran = f.rerun();
  EXPECT_EQ(ran.code, 0) << ran.err;
  EXPECT_TRUE(has(ran.err, "its config.json is missing")) << ran.err;
  EXPECT_EQ(steps_done(f.out, 1), 4);
}

TEST(SweepHardening, AResumedSweepOnChangedDataIsRefusedNamingTheSource) {
  TempDir data("sweep_data");
  const fs::path text = data.path() / "text.txt";
  auto write_text = [&](char c) {
    std::ofstream out(text, std::ios::trunc);
    for (int i = 0; i < 4000; ++i) out << "the quick brown fox " << char(c + i % 7) << "\n";
  };
  write_text('a');
  Finished f;  // on the embedded corpus: its plan names no file
  f.extra = {"--set", "data.sources=[{\"name\": \"mine\", \"path\": \"" + text.string() + "\", \"weight\": 1}]"};
  fs::remove_all(f.out);
  ASSERT_EQ(run_moe(f.args(), f.dir.path() / "log").code, 0) << read_text_if_any(f.dir.path() / "log");
  const std::string plan_before = read_text(f.out / "sweep_plan.json");
  // The same bytes written again: the same data.
  write_text('a');
  Ran ran = f.rerun();
  EXPECT_EQ(ran.code, 0) << ran.err;
  // Other bytes at the same path: refused, naming the source, nothing rewritten.
  write_text('b');
  ran = f.rerun();
  EXPECT_EQ(ran.code, 2) << ran.err;
  EXPECT_TRUE(has(ran.err, "source 'mine' was text " + text.string())) << ran.err;
  EXPECT_TRUE(has(ran.err, "--allow-data-change")) << ran.err;
  EXPECT_EQ(read_text(f.out / "sweep_plan.json"), plan_before);
  // A source added: refused too.
  const std::vector<std::string> extra = f.extra;
  f.extra = {"--set", "data.sources=[{\"name\": \"mine\", \"path\": \"" + text.string() +
                          "\", \"weight\": 1}, {\"name\": \"more\", \"path\": \"" + text.string() +
                          "\", \"weight\": 1}]"};
  ran = f.rerun();
  EXPECT_EQ(ran.code, 2) << ran.err;
  // Said so: accepted, and the plan now holds the new data's identity.
  f.extra = extra;
  f.extra.push_back("--allow-data-change");
  ran = f.rerun();
  EXPECT_EQ(ran.code, 0) << ran.err;
  EXPECT_TRUE(has(ran.err, "the data changed since the sweep began")) << ran.err;
  f.extra = extra;
  EXPECT_EQ(f.rerun().code, 0);
}

// Planted in a finished sweep's directory, each thing is refused (exit 2, named, promptly) or removed as a
// link without writing through it; a victim file outside is never touched.
TEST(SweepHardening, NothingPlantedIsWrittenThroughOrBlocksTheSweep) {
  Finished f;
  ASSERT_EQ(f.names.size(), 2u);
  const fs::path victim = f.dir.path() / "victim.txt", victim_dir = f.dir.path() / "victim_dir";
  { std::ofstream(victim) << "precious\n"; }
  fs::create_directories(victim_dir);
  struct Plant {
    std::string what;
    fs::path path;
    std::string kind;  // symlink, dirlink, fifo, directory
  };
  const std::vector<Plant> plants = {
      {"a cell's run directory as a link", f.cell(1), "dirlink"},
      {"a cell's metrics.jsonl as a FIFO", f.cell(0) / "metrics.jsonl", "fifo"},
      {"a cell's config.json as a link", f.cell(0) / "config.json", "symlink"},
      {"a cell's status as a FIFO", f.out / "status" / (f.names[1] + ".json"), "fifo"},
      {"a cell's status as a link", f.out / "status" / (f.names[1] + ".json"), "symlink"},
      {"a cell's log as a link", f.out / "logs" / (f.names[0] + ".log"), "symlink"},
      {"the plan as a FIFO", f.out / "sweep_plan.json", "fifo"},
      {"sweep.json as a directory", f.out / "sweep.json", "directory"},
      {"the status directory as a link", f.out / "status", "dirlink"},
      {"the sweep's .lock as a FIFO", f.out / ".lock", "fifo"},
      {"the sweep's .lock as a link", f.out / ".lock", "symlink"},
      {"the sweep's .lock as a directory", f.out / ".lock", "directory"},
  };
  for (const Plant& p : plants) {
    const fs::path saved = f.dir.path() / "saved";
    const bool existed = fs::exists(fs::symlink_status(p.path));
    if (existed) fs::rename(p.path, saved);
    if (p.kind == "symlink") fs::create_symlink(victim, p.path);
    if (p.kind == "dirlink") fs::create_directory_symlink(victim_dir, p.path);
    if (p.kind == "fifo") {
      ASSERT_EQ(::mkfifo(p.path.c_str(), 0644), 0);
    }
    if (p.kind == "directory") fs::create_directories(p.path);
    const Ran ran = f.rerun();
    EXPECT_EQ(ran.code, 2) << p.what << ": " << ran.err;
    EXPECT_TRUE(has(ran.err, p.path.string())) << p.what << ": not named: " << ran.err;
    fs::remove(p.path);
    if (existed) fs::rename(saved, p.path);
  }
  EXPECT_EQ(read_text(victim), "precious\n");
  EXPECT_TRUE(fs::is_empty(victim_dir));
  // Temporary names planted as links are removed as links; the results are written beside them.
  for (const char* tmp : {"sweep.json.tmp", "sweep.csv.tmp", "sweep_plan.json.tmp", "base_config.json.tmp"})
    fs::create_symlink(victim, f.out / tmp);
  const Ran ran = f.rerun();
  EXPECT_EQ(ran.code, 0) << ran.err;
  EXPECT_EQ(read_text(victim), "precious\n");
  EXPECT_TRUE(fs::is_regular_file(fs::symlink_status(f.out / "sweep.json")));
  EXPECT_EQ(read_json(f.out / "sweep.json")["cells"].size(), 2u);
}

// A sweep running: a second one into the same --out is refused naming it; killed with SIGKILL, the first
// takes its running cell (moe launch, mpirun and the rank) with it, and the directory can be swept again.
TEST(SweepHardening, OneSweepPerDirectoryAndNoneOutlivesItsCells) {
  TempDir dir("sweep_kill");
  const fs::path out = dir.path() / "out";
  const std::vector<std::string> args = sweep_args(out, {"--grid", "moe.router.tau=0.5"}, 4000);
  bool checked = false;
  const Ran first = run_moe(args, dir.path() / "first.log", [&](pid_t pid) {
    if (checked) return;
    std::error_code ec;
    for (const auto& cell : fs::directory_iterator(out / "cells", ec))
      if (fs::exists(cell.path() / "metrics.jsonl")) checked = true;
    if (!checked) return;
    const Ran second = run_moe(args, dir.path() / "second.log");
    EXPECT_EQ(second.code, 2) << second.err;
    EXPECT_TRUE(has(second.err, "--out directory " + out.string() + " is in use by process " + std::to_string(pid)))
        << second.err;
    ASSERT_FALSE(processes_mentioning((out / "cells").string()).empty()) << "the cell runs";
    ::kill(pid, SIGKILL);
  });
  ASSERT_TRUE(checked) << first.err;
  EXPECT_EQ(first.code, 128 + SIGKILL);
  EXPECT_TRUE(all_gone_within((out / "cells").string(), 20))
      << "the killed sweep's cell is still running: " << processes_mentioning((out / "cells").string()).size();
  // The lock went with the sweep: the directory is swept again (stopped cleanly at once).
  bool stopped = false;
  const Ran again = run_moe(args, dir.path() / "again.log", [&](pid_t pid) {
    if (!stopped && !processes_mentioning((out / "cells").string()).empty()) ::kill(pid, SIGTERM), stopped = true;
  });
  EXPECT_TRUE(stopped) << again.err;
  EXPECT_EQ(again.code, 128 + SIGTERM) << again.err;
  EXPECT_TRUE(all_gone_within((out / "cells").string(), 20));
}

}  // namespace
}  // namespace moe::sweep_test
