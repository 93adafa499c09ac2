// Fault injection for tests and demonstrations (fault.inject): at the end of a given step a given rank
// is killed, stopped, hangs, throws, or corrupts the newest checkpoint and dies; or, through the rank's flight
// recorder (parallel/flight_recorder.h), freezes at the entry of its next all-to-all of the ep group
// (freeze_alltoall) or calls a barrier there while its peers call the all-to-all (mismatch_alltoall). Each fault fires
// once in a run's life: a marker file in RUN_DIR/faults/ records it before it fires, so a restarted job does not fire
// it again.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "launch/config/config.h"
#include "parallel/flight_recorder.h"

namespace moe {

class FaultInjector {
 public:
  FaultInjector(std::vector<FaultInjection> faults, int64_t rank, std::string run_dir, std::string checkpoint_root);
  // The rank's flight recorder, through which the all-to-all faults act (without one they do nothing).
  void set_flight_recorder(std::shared_ptr<FlightRecorder> recorder) { recorder_ = std::move(recorder); }
  // Called by the rank after step `done` (after its checkpoint and evaluation). May not return.
  void after_step(int64_t done);
  bool any_for_this_rank() const;

 private:
  std::vector<FaultInjection> faults_;
  int64_t rank_;
  std::string run_dir_, checkpoint_root_;
  std::shared_ptr<FlightRecorder> recorder_;
};

}  // namespace moe
