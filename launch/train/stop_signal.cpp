// SIGTERM and SIGINT during `moe train`.
#include "launch/train/stop_signal.h"

#include <signal.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <vector>

namespace moe {
namespace {

volatile sig_atomic_t g_first_signal = 0;
struct sigaction g_previous_term, g_previous_int, g_previous_usr1;
bool g_term_installed = false;

// Under `moe launch` the ranks' SIGTERM comes from mpirun ending the job (a rank died: the step cannot
// finish) or from the supervisor's kill; the supervisor asks for a clean stop with SIGUSR1 instead.
bool supervised() {
  const char* addr = std::getenv("MOE_HEARTBEAT_ADDR");
  return addr && *addr;
}

void on_signal(int sig) {
  if (g_first_signal != 0) {  // the second one: no more waiting
    const char text[] = "moe: second signal: exiting now\n";
    ssize_t ignored = write(STDERR_FILENO, text, sizeof(text) - 1);
    (void)ignored;
    _exit(128 + g_first_signal);
  }
  g_first_signal = sig;
}

}  // namespace

StopSignals::StopSignals() {
  g_first_signal = 0;
  struct sigaction action = {};
  action.sa_handler = on_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;  // the step's system calls (file writes, MPI) carry on
  sigaction(SIGUSR1, &action, &g_previous_usr1);
  g_term_installed = !supervised();
  if (g_term_installed) {
    sigaction(SIGTERM, &action, &g_previous_term);
    sigaction(SIGINT, &action, &g_previous_int);
  }
}

StopSignals::~StopSignals() {
  sigaction(SIGUSR1, &g_previous_usr1, nullptr);
  if (g_term_installed) {
    sigaction(SIGTERM, &g_previous_term, nullptr);
    sigaction(SIGINT, &g_previous_int, nullptr);
  }
}

int StopSignals::received() { return int(g_first_signal); }

int StopSignals::agreed(Communicator& world) {
  const int64_t mine = received();
  if (world.size() == 1) return int(mine);
  std::vector<int64_t> all(size_t(world.size()));
  world.allgather(&mine, all.data(), 1);
  for (int64_t sig : all)  // the lowest rank's, so every rank reports the same
    if (sig != 0) return int(sig);
  return 0;
}

}  // namespace moe
