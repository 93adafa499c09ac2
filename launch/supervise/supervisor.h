// `moe launch`: the supervisor. It starts mpirun (OpenMPI) in a process group of its own, with an
// argument vector (never through a shell), hears every rank's heartbeat on a UDP socket bound to
// loopback (or fault.listen), and detects a crash (mpirun ending abnormally) and a hang (a rank silent
// past fault.heartbeat_timeout_s, or making no progress past its phase's timeout). It then ends the
// whole job, leaving no process behind, and starts it again with --resume auto, up to
// fault.max_restarts times with a doubling backoff; past that it exits with code 3. Every event goes to
// RUN_DIR/events.log (JSON lines): what failed (rank, host, phase, step), how long detection took, the
// checkpoint resumed from, the steps lost, and heartbeats it ignored (wrong secret, malformed, oversized). A hang or
// crash is named from the ranks' flight records, which their heartbeats carry (launch/supervise/hang_report.h): the
// collective, the ranks waiting in it and those that never entered it, or a mismatch.
// Before anything starts it checks the layout; it holds the run directory's lock (launch/run/run_lock.h) for
// the whole launch; it counts a run as finished only when a rank reported the last step; on SIGTERM or
// SIGINT it forwards SIGTERM to the ranks, kills what is left after --term-grace-s (or a second signal)
// and exits 128 + the signal without restarting (docs/fault.md).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace moe {

struct LaunchOptions {
  int64_t np = 1;
  std::string hostfile;  // empty: this machine only
  std::string mpirun = "mpirun";
  std::vector<std::string> mpirun_args;  // extra arguments for mpirun, e.g. --oversubscribe
  // What the ranks run (moe train options).
  std::string config_path;
  std::vector<std::string> overrides;
  std::string run_dir;
  std::string resume = "auto";                   // for the first start; restarts always resume auto
  bool overwrite = false;                        // for the first start
  std::vector<std::string> allow_config_change;  // passed to the ranks (moe train --allow-config-change)
  bool allow_data_change = false;                // passed to the ranks (moe train --allow-data-change)
  bool quiet = false;
  // SIGTERM/SIGINT to the supervisor: how long the ranks have, after SIGTERM, to stop by themselves.
  double term_grace_s = 30;
  std::vector<std::string> command_line;  // of `moe launch`, for the run lock's file
};

// mpirun's arguments for ranks that may outnumber the cores they run on: oversubscribe, bind nothing, and let idle
// ranks yield (moe launch on this machine alone with more ranks than cores; moe sweep's concurrent cells).
const std::vector<std::string>& oversubscription_mpirun_args();

// Exit code of the whole launch: 0 done (a rank reported the last step and mpirun exited 0), 2 bad input
// (nothing started or written), 3 gave up after the allowed restarts, 128 + N stopped by signal N
// (SIGINT, SIGTERM), 1 other. The run directory is locked (launch/run/run_lock.h) for the whole launch.
int run_launch(const LaunchOptions& options);

struct Config;
// The layout checks of the trainer, for `np` ranks: the rank grid (parallel.*, moe.num_experts) and
// train.global_batch over dp * train.micro_batch. moe::Error(BadInput) naming the keys when it does not fit.
void check_launch_layout(const Config& config, int64_t np);
struct HostSlots {
  std::string name;
  int64_t slots = 1;
};
// One hostfile line per host: "name slots=N" (comments after #). BadInput naming the file if unusable.
std::vector<HostSlots> read_hostfile(const std::string& path);
// Shrinking (fault.shrink): when `failed_host` has failed at least twice, the hosts without it and the
// smaller rank count, if the config fits that world; else nullopt with `why`.
struct ShrinkPlan {
  std::vector<HostSlots> hosts;
  int64_t np = 0;
};
std::optional<ShrinkPlan> plan_shrink(const std::vector<HostSlots>& hosts, const std::string& failed_host,
                                      int64_t failures_of_host, int64_t np, const Config& config, std::string* why);

}  // namespace moe
