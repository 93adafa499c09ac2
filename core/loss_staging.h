// Per-token losses kept on the backend until the host reads them, once for many forwards (docs/gpu.md "Host
// synchronisations"): each forward's (N) losses are copied into the next section of one staging buffer (up to
// `sections` sections of max_tokens each, core/sizes.h loss_staging); read() downloads the filled part in one
// wait and sums each section in token order, in double, exactly as a forward's own download did. A section that
// would not fit makes the staged ones read first (a wait); with no sections each forward's losses are read at once.
#pragma once

#include <cstdint>
#include <vector>

#include "core/backend/backend.h"

namespace moe {

// The sum of N per-token losses in token order, in double: what a forward returns.
template <typename T>
double token_loss_sum(const T* losses, int64_t N) {
  double total = 0;
  for (int64_t i = 0; i < N; ++i) total += double(losses[i]);
  return total;
}

template <typename T>
class LossStaging {
 public:
  LossStaging(Backend& backend, int64_t sections, int64_t max_tokens);
  // Forgets what is staged and not read (a step that starts again).
  void clear();
  // Stages a forward's N per-token losses (backend memory, read by an op queued now).
  void add(const T* losses, int64_t N);
  // Each staged forward's sum, in the order they were added; then nothing is staged.
  std::vector<double> read();

 private:
  void read_staged();  // the staged sections' sums onto sums_

  Backend& backend_;
  Ops<T>& ops_;
  Buffer buffer_;
  int64_t capacity_ = 0, used_ = 0;  // elements
  std::vector<int64_t> counts_;      // the staged sections' tokens
  std::vector<double> sums_;         // of the forwards read so far
};

}  // namespace moe
