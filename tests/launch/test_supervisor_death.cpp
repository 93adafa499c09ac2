// Nothing of a job outlives its supervisor (launch/supervise/job_processes.h, docs/fault.md): `moe launch` killed with
// SIGKILL (an OOM kill, `scancel -9`) mid-run takes mpirun and every rank with it within seconds, at one
// rank and at two, and a second launch into the same run directory then runs (the lock went with the job).
#include "sweep_harness.h"

namespace moe::sweep_test {
namespace {

std::vector<std::string> launch_args(const fs::path& run, int64_t np, int64_t steps, bool fresh) {
  std::vector<std::string> args = {"launch", "--np", std::to_string(np)};
  for (const char* a : {"--oversubscribe", "--bind-to", "none", "--mca", "mpi_yield_when_idle", "1"})
    args.push_back(std::string("--mpirun-arg=") + a);
  args.insert(args.end(), {"--config", kConfig});
  const std::vector<std::string> sets = tiny_sets(steps);
  args.insert(args.end(), sets.begin(), sets.end());
  args.insert(args.end(), {"--run-dir", run.string(), "--quiet"});
  if (fresh) args.insert(args.end(), {"--resume", "none", "--overwrite"});
  return args;
}

int64_t last_step(const fs::path& metrics) {
  int64_t step = 0;
  std::ifstream in(metrics);
  for (std::string line; std::getline(in, line);) try {
      step = std::max(step, json::parse(line).value("step", int64_t(0)));
    } catch (const std::exception&) {
    }
  return step;
}

void kill_mid_run_then_launch_again(int64_t np) {
  TempDir dir("launch_sigkill");
  const fs::path run = dir.path() / "run";
  bool killed = false;
  size_t processes = 0;
  const Ran first = run_moe(launch_args(run, np, 100000, false), dir.path() / "first.log", [&](pid_t pid) {
    if (killed || last_step(run / "metrics.jsonl") < 4) return;
    processes = processes_mentioning(run.string()).size();  // mpirun and the ranks
    ::kill(pid, SIGKILL);
    killed = true;
  });
  ASSERT_TRUE(killed) << first.err;
  EXPECT_EQ(first.code, 128 + SIGKILL);
  EXPECT_GE(processes, size_t(1 + np)) << "mpirun and " << np << " rank(s) were running";
  EXPECT_TRUE(all_gone_within(run.string(), 15))
      << processes_mentioning(run.string()).size() << " process(es) of the job outlived moe launch";
  const Ran second = run_moe(launch_args(run, np, 4, true), dir.path() / "second.log");
  EXPECT_EQ(second.code, 0) << second.err;
  EXPECT_EQ(last_step(run / "metrics.jsonl"), 4);
}

TEST(SupervisorDeath, SigkillOfLaunchTakesMpirunAndTheRankWithIt) { kill_mid_run_then_launch_again(1); }

TEST(SupervisorDeath, SigkillOfLaunchTakesMpirunAndBothRanksWithIt) { kill_mid_run_then_launch_again(2); }

}  // namespace
}  // namespace moe::sweep_test
