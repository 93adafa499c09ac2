// The all-to-all dispatcher: counts, then rows, over the expert-parallel group. See alltoall_dispatcher.h.
#include "core/moe/alltoall_dispatcher.h"

#include <type_traits>

#include "core/error.h"
#include "core/sizes.h"

namespace moe {

// Rows for each rank's experts are contiguous in the global-expert order of the permutation; the counts
// per (source, local expert) are exchanged first so that every rank knows what it will receive.
template <typename T>
std::unique_ptr<ExchangeHandle> AllToAllDispatcher<T>::start_plan(const std::vector<int64_t>& expert_offset,
                                                                  ExchangePlan& p) {
  const int64_t P = this->ep_size_, El = this->local_experts();
  p.token_rows = expert_offset[size_t(this->experts_)];
  p.send_count.assign(size_t(P * El), 0);
  for (int64_t e = 0; e < this->experts_; ++e) p.send_count[e] = expert_offset[e + 1] - expert_offset[e];
  p.recv_count.assign(size_t(P * El), 0);
  if (P > 1) return this->exchange_->start_counts(p.send_count.data(), p.recv_count.data(), El);
  p.recv_count = p.send_count;
  return nullptr;
}

template <typename T>
void AllToAllDispatcher<T>::finish_plan(std::unique_ptr<ExchangeHandle> counts, ExchangePlan& p) {
  if (counts) counts->wait();
  const int64_t P = this->ep_size_, El = this->local_experts();
  p.send_rows.assign(size_t(P), 0);
  p.recv_rows.assign(size_t(P), 0);
  for (int64_t q = 0; q < P; ++q)
    for (int64_t el = 0; el < El; ++el)
      p.send_rows[q] += p.send_count[q * El + el], p.recv_rows[q] += p.recv_count[q * El + el];
  this->set_local_offsets(p);
}

template <typename T>
std::vector<int64_t> AllToAllDispatcher<T>::source_major_rows(const ExchangePlan& p) const {
  std::vector<int64_t> first(p.recv_count.size());
  int64_t row = 0;
  for (size_t i = 0; i < first.size(); ++i) first[i] = row, row += p.recv_count[i];
  return first;
}

template <typename T>
std::unique_ptr<ExchangeHandle> AllToAllDispatcher<T>::start_rows(const T* send, const std::vector<int64_t>& send_rows,
                                                                  T* recv, const std::vector<int64_t>& recv_rows,
                                                                  int64_t width) {
  if (this->ep_size_ == 1) {
    this->backend_.copy(recv, send, size_t(send_rows[0] * width) * sizeof(T));
    return nullptr;
  }
  if constexpr (std::is_same_v<T, float>) {
    std::vector<int64_t> sc(send_rows.size()), rc(recv_rows.size());
    for (size_t q = 0; q < sc.size(); ++q) sc[q] = send_rows[q] * width, rc[q] = recv_rows[q] * width;
    return this->exchange_->start(send, sc.data(), recv, rc.data());  // the counts are read before start returns
  } else {
    MOE_FAIL("expert parallelism runs in float only");
  }
}

template <typename T>
int64_t AllToAllDispatcher<T>::staging_elements(const ExchangePlan& p, int64_t width) const {
  return sizes::elements(sizes::alltoall_staging(double(p.received), double(width)).staging);
}

template <typename T>
void AllToAllDispatcher<T>::start_dispatch(const ExchangePlan& p, const T* token_rows, int64_t width,
                                           RowsInFlight<T>& rows) {
  this->backend_.reserve(rows.staging, dtype_of<T>(), staging_elements(p, width));
  rows.handle = start_rows(token_rows, p.send_rows, rows.staging.template data<T>(), p.recv_rows, width);
}

template <typename T>
void AllToAllDispatcher<T>::finish_dispatch(const ExchangePlan& p, RowsInFlight<T>& rows, T* expert_rows,
                                            int64_t width) {
  if (rows.handle) rows.handle->wait();
  rows.handle.reset();
  this->move_blocks(p, source_major_rows(p), rows.staging.template data<T>(), expert_rows, width, true);
}

template <typename T>
void AllToAllDispatcher<T>::start_combine(const ExchangePlan& p, const T* expert_rows, T* token_rows, int64_t width,
                                          RowsInFlight<T>& rows) {
  this->backend_.reserve(rows.staging, dtype_of<T>(), staging_elements(p, width));
  this->move_blocks(p, source_major_rows(p), expert_rows, rows.staging.template data<T>(), width, false);
  rows.handle =
      start_rows(rows.staging.template data<T>(), p.recv_rows, token_rows, p.send_rows, width);  // counts swapped
}

template <typename T>
void AllToAllDispatcher<T>::finish_combine(const ExchangePlan&, RowsInFlight<T>& rows, int64_t) {
  if (rows.handle) rows.handle->wait();
  rows.handle.reset();
}

template class AllToAllDispatcher<float>;
template class AllToAllDispatcher<double>;

}  // namespace moe
