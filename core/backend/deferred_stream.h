// The memory-checking backend's stream (core/backend/memory_check.h): an in-order queue of its ops and copies
// that runs only when the host synchronises (or hands backend memory to a communicator, which, as NCCL on a
// GPU's stream, comes after the work queued before it). Nothing queued has run when the call that queued it
// returns, so host code that reads a copy's destination without synchronising first reads what was there
// before, every time: the wrong answer a test sees, where a GPU's stream would give it only sometimes.
#pragma once

#include <functional>
#include <utility>
#include <vector>

#include "core/backend/backend.h"

namespace moe {

class DeferredStream final : public Stream {
 public:
  void enqueue(std::function<void()> work) { queue_.push_back(std::move(work)); }
  // Runs the queue in order (work queued while it runs joins the end). A failure in one item leaves the rest
  // unrun and is thrown here, as a GPU's asynchronous error surfaces at the next synchronisation.
  void synchronize() override {
    while (!queue_.empty()) {
      std::vector<std::function<void()>> work;
      work.swap(queue_);
      for (auto& w : work) w();
    }
  }
  // The time is taken when the queue reaches it, between the work queued before and after.
  void record_time(double* seconds) override {
    enqueue([seconds] { *seconds = steady_seconds(); });
  }
  size_t pending() const { return queue_.size(); }

 private:
  std::vector<std::function<void()>> queue_;
};

}  // namespace moe
