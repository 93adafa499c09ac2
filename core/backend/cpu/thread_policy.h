// How many threads the CPU backend runs and how they wait for work between parallel regions (docs/bench.md
// "Threads on a busy machine").
//
// Waiting is the OpenMP runtime's: libgomp spins a while (GOMP_SPINCOUNT, 300,000 by default) before it sleeps,
// which is the fastest on a quiet machine (measured against 30,000, 10,000, 1,000 and passive waiting). When
// another process shares the cores, a spinning thread holds a core the thread it waits for needs, and a step
// takes several times longer; the ThreadGovernor below (train.adapt_threads) then lowers the thread count until
// the threads have their cores, which is what keeps a busy machine's throughput, rather than another waiting
// policy.
#pragma once

#include <chrono>
#include <string>
#include <vector>

namespace moe::cpu {

// The waiting policy this process runs with, for the startup line: "passive (OMP_WAIT_POLICY)", "spin 1000
// then sleep (GOMP_SPINCOUNT)", or the runtime's default.
std::string wait_policy_description();

// The cores this process may run on: its CPU affinity mask, capped by a cgroup v2 CPU quota (cpu.max) when
// there is one; at least 1. What `train.threads = 0` divides among the node's ranks.
int usable_cores();

// What the machine's cores did over an interval, in cores (core-seconds per second of wall time): `ours` the
// CPU time of this process, `idle` the idle time of the cores it may run on (/proc/stat).
struct CoreUse {
  double ours = 0, idle = 0;
};

// Adapts the thread count to what other processes leave free, at step boundaries (docs/bench.md "Threads on
// a busy machine"). Threads that wait on a barrier for a thread the kernel has descheduled turn a slowdown
// into a collapse; fewer threads than cores avoid it. The cores this process could have had over the last
// interval are those it used plus those nobody used (ours + idle); the decision is the whole number of
// them, within [1, max_threads], and a change needs the same decision twice in a row (one busy moment does
// not move it). On by default (train.adapt_threads): the CPU backend gives the same bits at any thread count
// (core/backend/cpu/parallel_kernels.h), so the load changes a run's speed, not its numbers.
class ThreadGovernor {
 public:
  explicit ThreadGovernor(int max_threads);
  // The threads to use from now on, given the use of the interval just ended, run at `current` threads.
  int decide(int current, const CoreUse& use);
  int max_threads() const { return max_threads_; }

 private:
  int max_threads_;
  int pending_ = 0;  // a decision seen once, waiting to be confirmed
};

// Measures CoreUse over the intervals between calls to sample(): this process's CPU time and the idle time of
// the cores in its affinity mask. Where /proc/stat is missing, idle stays 0 (the governor then only lowers).
class CoreUseMeter {
 public:
  CoreUseMeter();
  CoreUse sample();  // since the previous call (or construction)

 private:
  struct Reading {
    std::chrono::steady_clock::time_point wall;
    double process_s = 0, idle_s = 0;
  };
  Reading read() const;
  std::vector<int> cpus_;  // the cores of the affinity mask
  Reading last_;
};

}  // namespace moe::cpu
