// The default waiting policy of the CPU backend's threads. See thread_policy.h.
#include "core/backend/cpu/thread_policy.h"

#include <sched.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>

namespace moe::cpu {
namespace {

// Set beside GOMP_SPINCOUNT when the default was applied, so that the re-executed program can say so.
constexpr const char* kMarker = "MOE_DEFAULT_WAIT_POLICY";

}  // namespace

void apply_default_wait_policy(char** argv) {
  if (std::getenv("OMP_WAIT_POLICY") || std::getenv("GOMP_SPINCOUNT")) return;
  if (setenv("GOMP_SPINCOUNT", kDefaultSpinCount, 1) != 0 || setenv(kMarker, "1", 1) != 0) return;
  execv("/proc/self/exe", argv);
  // Not re-executed (no /proc): undo, so that the description stays true.
  unsetenv("GOMP_SPINCOUNT");
  unsetenv(kMarker);
}

std::string wait_policy_description() {
  const char* spin = std::getenv("GOMP_SPINCOUNT");
  const char* policy = std::getenv("OMP_WAIT_POLICY");
  if (spin && std::getenv(kMarker)) return std::string("spin ") + spin + " then sleep (default)";
  std::string text;
  if (policy) text = std::string(policy) + " (OMP_WAIT_POLICY)";
  if (spin) text += (text.empty() ? "" : ", ") + std::string("spin ") + spin + " then sleep (GOMP_SPINCOUNT)";
  return text.empty() ? "the OpenMP runtime's default" : text;
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

}  // namespace moe::cpu
