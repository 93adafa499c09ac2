// Fault injection for tests and demonstrations (fault.inject): at the end of a given step a given rank
// is killed, stopped, hangs, throws, or corrupts the newest checkpoint and dies. Each fault fires once in
// a run's life: a marker file in RUN_DIR/faults/ records it before it fires, so a restarted job does not
// fire it again.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "launch/config.h"

namespace moe {

class FaultInjector {
 public:
  FaultInjector(std::vector<FaultInjection> faults, int64_t rank, std::string run_dir, std::string checkpoint_root);
  // Called by the rank after step `done` (after its checkpoint and evaluation). May not return.
  void after_step(int64_t done);
  bool any_for_this_rank() const;

 private:
  std::vector<FaultInjection> faults_;
  int64_t rank_;
  std::string run_dir_, checkpoint_root_;
};

}  // namespace moe
