// The checks a host wait for the CUDA backend's stream runs while it polls (cuda_watch), and the waits themselves.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <vector>

#include "core/backend/cuda/cuda_check.h"
#include "core/backend/cuda/host_wait.h"

namespace moe::cuda {

// The checks a host wait runs while it polls the stream (cuda_watch: a communicator's look at NCCL's asynchronous
// errors, which throws to end the wait). Without any, as on one GPU, a wait simply blocks.
class Watchers {
 public:
  uint64_t add(std::function<void()> check) {
    std::lock_guard<std::mutex> lock(mutex_);
    checks_.emplace(next_, std::move(check));
    return next_++;
  }
  void remove(uint64_t id) {
    std::lock_guard<std::mutex> lock(mutex_);
    checks_.erase(id);
  }
  // The stream's queued work done, first, where a copy that blocks by itself follows: only with checks to run, so
  // that one GPU's downloads wait once, as before.
  void wait_if_watched(cudaStream_t stream) {
    if (!empty()) wait(stream);
  }
  // The stream's queued work done.
  void wait(cudaStream_t stream) {
    if (empty()) {
      MOE_CUDA_CHECK(cudaStreamSynchronize(stream));
      return;
    }
    auto done = [&] {
      const cudaError_t status = cudaStreamQuery(stream);
      if (status == cudaErrorNotReady) return false;
      MOE_CUDA_CHECK(status);
      return true;
    };
    cuda::wait_polling(done, [&] { run(); });
  }

 private:
  bool empty() {
    std::lock_guard<std::mutex> lock(mutex_);
    return checks_.empty();
  }
  void run() {
    std::vector<std::function<void()>> checks;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      for (const auto& [id, check] : checks_) checks.push_back(check);
    }
    for (const auto& check : checks) check();
  }
  std::mutex mutex_;
  std::map<uint64_t, std::function<void()>> checks_;
  uint64_t next_ = 1;
};

}  // namespace moe::cuda
