// Stop signals during `moe train`. Schedulers send SIGTERM some time before they kill, so the first
// signal only asks the run to stop: the step in progress finishes, every rank agrees to stop after the
// same step, a checkpoint of that step is written if it fits in fault.term_grace_s, metrics are flushed,
// and the program exits with 128 + the signal's number (143 for SIGTERM, 130 for SIGINT, 138 for
// SIGUSR1). A second signal ends the process at once with the same code. SIGUSR1 always asks for a clean
// stop (mpirun forwards it to every rank without killing them, as it does after forwarding SIGTERM);
// SIGTERM and SIGINT do too except under `moe launch`, whose ranks get SIGTERM only when the job is being
// ended. docs/fault.md describes it.
#pragma once

#include "parallel/communicator.h"

namespace moe {

class StopSignals {
 public:
  StopSignals();   // installs the handlers
  ~StopSignals();  // restores the previous ones
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

  // The first signal received by this process (0: none).
  static int received();
  // Collective: the signal any rank received (0: none), the same on every rank.
  static int agreed(Communicator& world);
};

}  // namespace moe
