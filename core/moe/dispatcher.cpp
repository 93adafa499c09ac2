// The MoE dispatcher: counts, then rows, over the expert-parallel group. See dispatcher.h.
#include "core/moe/dispatcher.h"

#include <algorithm>
#include <type_traits>

#include "core/error.h"

namespace moe {

// Rows for each rank's experts are contiguous in the global-expert order of the permutation; the counts
// per (source, local expert) are exchanged first so that every rank knows what it will receive.
template <typename T>
std::unique_ptr<ExchangeHandle> ExpertDispatcher<T>::start_plan(const std::vector<int64_t>& expert_offset,
                                                                ExchangePlan& p) {
  const int64_t P = ep_size_, El = local_experts();
  p.send_count.assign(size_t(P * El), 0);
  for (int64_t e = 0; e < experts_; ++e) p.send_count[e] = expert_offset[e + 1] - expert_offset[e];
  p.recv_count.assign(size_t(P * El), 0);
  if (P > 1) return exchange_->start_counts(p.send_count.data(), p.recv_count.data(), El);
  p.recv_count = p.send_count;
  return nullptr;
}

template <typename T>
void ExpertDispatcher<T>::finish_plan(std::unique_ptr<ExchangeHandle> counts, ExchangePlan& p) {
  if (counts) counts->wait();
  const int64_t P = ep_size_, El = local_experts();
  p.send_rows.assign(size_t(P), 0);
  p.recv_rows.assign(size_t(P), 0);
  for (int64_t q = 0; q < P; ++q)
    for (int64_t el = 0; el < El; ++el)
      p.send_rows[q] += p.send_count[q * El + el], p.recv_rows[q] += p.recv_count[q * El + el];
  p.local_offset.assign(size_t(El + 1), 0);
  for (int64_t el = 0; el < El; ++el) {
    int64_t rows = 0;
    for (int64_t q = 0; q < P; ++q) rows += p.recv_count[q * El + el];
    p.local_offset[el + 1] = p.local_offset[el] + rows;
  }
  p.received = p.local_offset[El];
}

template <typename T>
void ExpertDispatcher<T>::plan(const std::vector<int64_t>& expert_offset, ExchangePlan& p) {
  finish_plan(start_plan(expert_offset, p), p);
}

template <typename T>
std::unique_ptr<ExchangeHandle> ExpertDispatcher<T>::start_rows(const T* send, const std::vector<int64_t>& send_rows,
                                                                T* recv, const std::vector<int64_t>& recv_rows,
                                                                int64_t width) {
  if (ep_size_ == 1) {
    backend_.copy(recv, send, size_t(send_rows[0] * width) * sizeof(T));
    return nullptr;
  }
  if constexpr (std::is_same_v<T, float>) {
    std::vector<int64_t> sc(send_rows.size()), rc(recv_rows.size());
    for (size_t q = 0; q < sc.size(); ++q) sc[q] = send_rows[q] * width, rc[q] = recv_rows[q] * width;
    return exchange_->start(send, sc.data(), recv, rc.data());  // the counts are read before start returns
  } else {
    MOE_FAIL("expert parallelism runs in float only");
  }
}

// Received rows arrive source-major (source rank, local expert); the experts compute expert-major (local
// expert, source rank). Moves the blocks between the two orders, in either direction.
template <typename T>
void ExpertDispatcher<T>::reorder(const ExchangePlan& p, const T* from, T* to, int64_t width,
                                  bool to_expert_major) const {
  const int64_t P = ep_size_, El = local_experts();
  int64_t src = 0;
  for (int64_t q = 0; q < P; ++q)
    for (int64_t el = 0; el < El; ++el) {
      int64_t dst = p.local_offset[el];
      for (int64_t q2 = 0; q2 < q; ++q2) dst += p.recv_count[q2 * El + el];
      const int64_t n = p.recv_count[q * El + el] * width;
      const int64_t from_row = to_expert_major ? src : dst, to_row = to_expert_major ? dst : src;
      backend_.copy(to + to_row * width, from + from_row * width, size_t(n) * sizeof(T));
      src += p.recv_count[q * El + el];
    }
}

template <typename T>
void ExpertDispatcher<T>::start_dispatch(const ExchangePlan& p, const T* token_rows, int64_t width,
                                         RowsInFlight<T>& rows) {
  backend_.reserve(rows.staging, dtype_of<T>(), p.received * width);
  rows.handle = start_rows(token_rows, p.send_rows, rows.staging.template data<T>(), p.recv_rows, width);
}

template <typename T>
void ExpertDispatcher<T>::finish_dispatch(const ExchangePlan& p, RowsInFlight<T>& rows, T* expert_rows, int64_t width) {
  if (rows.handle) rows.handle->wait();
  rows.handle.reset();
  reorder(p, rows.staging.template data<T>(), expert_rows, width, true);
}

template <typename T>
void ExpertDispatcher<T>::start_combine(const ExchangePlan& p, const T* expert_rows, T* token_rows, int64_t width,
                                        RowsInFlight<T>& rows) {
  backend_.reserve(rows.staging, dtype_of<T>(), p.received * width);
  reorder(p, expert_rows, rows.staging.template data<T>(), width, false);
  rows.handle =
      start_rows(rows.staging.template data<T>(), p.recv_rows, token_rows, p.send_rows, width);  // counts swapped
}

template <typename T>
void ExpertDispatcher<T>::finish_combine(RowsInFlight<T>& rows) {
  if (rows.handle) rows.handle->wait();
  rows.handle.reset();
}

// The blocking forms reuse one staging buffer across calls. With one rank the rows arrive from one source, so the
// expert-major order is the tokens' own: one copy, without the staging buffer and the reordering copy.
template <typename T>
void ExpertDispatcher<T>::dispatch(const ExchangePlan& p, const T* token_rows, T* expert_rows, int64_t width) {
  if (ep_size_ == 1) return backend_.copy(expert_rows, token_rows, size_t(p.received * width) * sizeof(T));
  RowsInFlight<T> rows;
  rows.staging = std::move(buffer_);
  start_dispatch(p, token_rows, width, rows);
  finish_dispatch(p, rows, expert_rows, width);
  buffer_ = std::move(rows.staging);
}

template <typename T>
void ExpertDispatcher<T>::combine(const ExchangePlan& p, const T* expert_rows, T* token_rows, int64_t width) {
  if (ep_size_ == 1) return backend_.copy(token_rows, expert_rows, size_t(p.received * width) * sizeof(T));
  RowsInFlight<T> rows;
  rows.staging = std::move(buffer_);
  start_combine(p, expert_rows, token_rows, width, rows);
  finish_combine(rows);
  buffer_ = std::move(rows.staging);
}

template class ExpertDispatcher<float>;
template class ExpertDispatcher<double>;

}  // namespace moe
