// Thread counts of the CPU backend: the cores a process may use, the waiting policy it runs with, and the
// governor that follows other processes' load. See thread_policy.h.
#include "core/backend/cpu/thread_policy.h"

#include <sched.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

namespace moe::cpu {

std::string wait_policy_description() {
  const char* spin = std::getenv("GOMP_SPINCOUNT");
  const char* policy = std::getenv("OMP_WAIT_POLICY");
  std::string text;
  if (policy) text = std::string(policy) + " (OMP_WAIT_POLICY)";
  if (spin) text += (text.empty() ? "" : ", ") + std::string("spin ") + spin + " then sleep (GOMP_SPINCOUNT)";
  return text.empty() ? "the OpenMP runtime's default, spin then sleep" : text;
}

int usable_cores() {
  int cores = int(std::thread::hardware_concurrency());
  cpu_set_t mask;
  CPU_ZERO(&mask);
  if (sched_getaffinity(0, sizeof mask, &mask) == 0) cores = CPU_COUNT(&mask);
  // cgroup v2: "max 100000" (no limit) or "<quota> <period>" in microseconds.
  std::ifstream in("/sys/fs/cgroup/cpu.max");
  std::string quota;
  double period = 0;
  if (in >> quota >> period && quota != "max" && period > 0) {
    const double limit = std::ceil(std::strtod(quota.c_str(), nullptr) / period);
    if (limit >= 1 && limit < cores) cores = int(limit);
  }
  return cores < 1 ? 1 : cores;
}

ThreadGovernor::ThreadGovernor(int max_threads) : max_threads_(std::max(1, max_threads)) {}

int ThreadGovernor::decide(int current, const CoreUse& use) {
  // A quarter core of slack: a thread that got three quarters of a core still earns its place.
  const int want = std::clamp(int(std::floor(use.ours + use.idle + 0.25)), 1, max_threads_);
  if (want == current) {
    pending_ = 0;
    return current;
  }
  if (want != pending_) {
    pending_ = want;
    return current;
  }
  pending_ = 0;
  return want;
}

CoreUseMeter::CoreUseMeter() {
  cpu_set_t mask;
  CPU_ZERO(&mask);
  if (sched_getaffinity(0, sizeof mask, &mask) == 0)
    for (int c = 0; c < CPU_SETSIZE; ++c)
      if (CPU_ISSET(c, &mask)) cpus_.push_back(c);
  last_ = read();
}

CoreUseMeter::Reading CoreUseMeter::read() const {
  Reading r;
  r.wall = std::chrono::steady_clock::now();
  timespec cpu{};
  if (clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &cpu) == 0) r.process_s = double(cpu.tv_sec) + 1e-9 * double(cpu.tv_nsec);
  // Lines "cpuN user nice system idle iowait ..." in clock ticks; idle and iowait count as idle.
  static const double tick = 1.0 / double(sysconf(_SC_CLK_TCK));
  std::ifstream in("/proc/stat");
  for (std::string line; std::getline(in, line);) {
    if (line.compare(0, 3, "cpu") != 0 || line.size() < 4 || !std::isdigit(static_cast<unsigned char>(line[3])))
      continue;
    std::istringstream fields(line.substr(3));
    int cpu = -1;
    double user = 0, nice = 0, system = 0, idle = 0, iowait = 0;
    fields >> cpu >> user >> nice >> system >> idle >> iowait;
    if (std::find(cpus_.begin(), cpus_.end(), cpu) != cpus_.end()) r.idle_s += (idle + iowait) * tick;
  }
  return r;
}

CoreUse CoreUseMeter::sample() {
  const Reading now = read();
  const double wall = std::chrono::duration<double>(now.wall - last_.wall).count();
  CoreUse use;
  if (wall > 0) use = {(now.process_s - last_.process_s) / wall, std::max(0.0, now.idle_s - last_.idle_s) / wall};
  last_ = now;
  return use;
}

}  // namespace moe::cpu
