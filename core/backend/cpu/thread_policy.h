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

#include <string>

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

}  // namespace moe::cpu
