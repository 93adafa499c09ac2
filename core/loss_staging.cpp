// Per-token losses staged on the backend. See loss_staging.h.
#include "core/loss_staging.h"

#include "core/error.h"
#include "core/sizes.h"

namespace moe {

template <typename T>
LossStaging<T>::LossStaging(Backend& backend, int64_t sections, int64_t max_tokens)
    : backend_(backend), ops_(backend.ops<T>()) {
  MOE_CHECK(sections >= 0 && max_tokens >= 1, "loss staging of " << sections << " sections of " << max_tokens);
  capacity_ = sizes::elements(sizes::loss_staging(double(sections), double(max_tokens)));
  if (capacity_ > 0) buffer_ = backend_.allocate(dtype_of<T>(), capacity_);
}

template <typename T>
void LossStaging<T>::clear() {
  used_ = 0;
  counts_.clear();
  sums_.clear();
}

template <typename T>
void LossStaging<T>::add(const T* losses, int64_t N) {
  if (used_ + N > capacity_) read_staged();
  if (N > capacity_) {  // no room at all: read this forward's own
    const std::vector<T> host = backend_.download(losses, N);
    sums_.push_back(token_loss_sum(host.data(), N));
    return;
  }
  ops_.copy(losses, buffer_.template data<T>() + used_, N);
  used_ += N;
  counts_.push_back(N);
}

template <typename T>
void LossStaging<T>::read_staged() {
  if (counts_.empty()) return;
  const std::vector<T> host = backend_.download(buffer_.template data<T>(), used_);
  int64_t at = 0;
  for (const int64_t N : counts_) sums_.push_back(token_loss_sum(host.data() + at, N)), at += N;
  used_ = 0;
  counts_.clear();
}

template <typename T>
std::vector<double> LossStaging<T>::read() {
  read_staged();
  std::vector<double> sums;
  sums.swap(sums_);
  return sums;
}

template class LossStaging<float>;
template class LossStaging<double>;

}  // namespace moe
