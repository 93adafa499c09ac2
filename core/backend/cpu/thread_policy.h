// How many threads the CPU backend runs and how they wait for work between parallel regions (docs/bench.md
// "Threads on a busy machine"). The OpenMP runtime (libgomp) reads OMP_WAIT_POLICY and GOMP_SPINCOUNT once, when it is
// loaded, before main; and no call changes them afterwards. So a program that wants the project's default re-executes
// itself with it in the environment, first thing in main, when the user set neither variable.
//
// The default: a waiting thread spins kDefaultSpinCount times (tens of microseconds), then sleeps. libgomp's
// own default spins 300,000 times (milliseconds) when threads do not outnumber cores: on a quiet machine that
// catches the next region a little sooner, but when another process shares the cores each spinning thread
// holds a core the thread it waits for needs, and a step takes tens of times longer.
#pragma once

#include <chrono>
#include <string>
#include <vector>

namespace moe::cpu {

constexpr const char* kDefaultSpinCount = "1000";

// Unless OMP_WAIT_POLICY or GOMP_SPINCOUNT is set: sets GOMP_SPINCOUNT = kDefaultSpinCount and re-executes this
// program (/proc/self/exe) with the same arguments; returns only if that is not needed or not possible (then
// the runtime's own default stays). Call first thing in main, before any thread or OpenMP region exists.
void apply_default_wait_policy(char** argv);

// The waiting policy this process runs with, for the startup line and the manifest: "spin 1000 then sleep
// (default)", "passive (OMP_WAIT_POLICY)", ...
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
// not move it). Results do not depend on the thread count (the CPU backend's invariant), so adapting never
// changes a run's numbers.
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
