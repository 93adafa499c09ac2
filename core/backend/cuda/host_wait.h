// A host wait for a stream that can be interrupted: it polls instead of blocking, and between polls runs a check
// that throws to end the wait (a communicator's look at NCCL's asynchronous errors: a peer that died in a
// collective would otherwise leave cudaStreamSynchronize blocked for ever). Plain C++ over two callables, so that
// it is tested without a GPU.
#pragma once

#include <chrono>
#include <thread>

namespace moe::cuda {

// `done()` says whether the stream's work has completed (it throws on a CUDA error); `check()` throws to give up.
// The first polls follow each other closely (most waits are short: a download of a few values), then at 50 us.
template <typename Done, typename Check>
void wait_polling(Done done, Check check) {
  using Clock = std::chrono::steady_clock;
  const Clock::time_point start = Clock::now();
  while (!done()) {
    check();
    if (Clock::now() - start < std::chrono::milliseconds(1))
      std::this_thread::yield();
    else
      std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

}  // namespace moe::cuda
