// The all-gather dispatcher: counts, then every rank's rows, over the expert-parallel group; combine by a
// reduce-scatter. See allgather_dispatcher.h.
#include "core/moe/allgather_dispatcher.h"

#include <algorithm>
#include <type_traits>

#include "core/error.h"
#include "core/sizes.h"

namespace moe {

// The all-gather of this rank's rows per global expert, as the all-to-all of equal blocks that sends every rank
// the same E counts.
template <typename T>
std::unique_ptr<ExchangeHandle> AllGatherDispatcher<T>::start_plan(const std::vector<int64_t>& expert_offset,
                                                                   ExchangePlan& p) {
  const int64_t P = this->ep_size_, E = this->experts_;
  p.token_rows = expert_offset[size_t(E)];
  p.own_count.assign(size_t(P * E), 0);
  for (int64_t q = 0; q < P; ++q)
    for (int64_t e = 0; e < E; ++e) p.own_count[q * E + e] = expert_offset[e + 1] - expert_offset[e];
  p.gathered_count.assign(size_t(P * E), 0);
  if (P > 1) return this->exchange_->start_counts(p.own_count.data(), p.gathered_count.data(), E);
  p.gathered_count = p.own_count;
  return nullptr;
}

// Rows for rank r's experts are contiguous in each source's global-expert order: source q's rows for local
// expert el start after its rows for the global experts before r * El + el.
template <typename T>
void AllGatherDispatcher<T>::finish_plan(std::unique_ptr<ExchangeHandle> counts, ExchangePlan& p) {
  if (counts) counts->wait();
  const int64_t P = this->ep_size_, E = this->experts_, El = this->local_experts(), first = ep_rank() * El;
  p.recv_count.assign(size_t(P * El), 0);
  p.source_row.assign(size_t(P * El), 0);
  p.block_rows = 0;
  for (int64_t q = 0; q < P; ++q) {
    const int64_t* of_q = p.gathered_count.data() + q * E;
    int64_t row = 0;
    for (int64_t e = 0; e < E; ++e) {
      if (e >= first && e < first + El)
        p.recv_count[q * El + e - first] = of_q[e], p.source_row[q * El + e - first] = row;
      row += of_q[e];
    }
    p.block_rows = std::max(p.block_rows, row);
  }
  this->set_local_offsets(p);
}

template <typename T>
std::vector<int64_t> AllGatherDispatcher<T>::gathered_rows(const ExchangePlan& p) const {
  const int64_t El = this->local_experts();
  std::vector<int64_t> first(p.source_row.size());
  for (size_t i = 0; i < first.size(); ++i) first[i] = int64_t(i) / El * p.block_rows + p.source_row[i];
  return first;
}

template <typename T>
std::unique_ptr<ExchangeHandle> AllGatherDispatcher<T>::start_allgather(const T* send, T* recv, int64_t count) {
  if (this->ep_size_ == 1) {
    this->backend_.copy(recv, send, size_t(count) * sizeof(T));
    return nullptr;
  }
  if constexpr (std::is_same_v<T, float>) {
    return this->exchange_->start_allgather(send, recv, count);
  } else {
    MOE_FAIL("expert parallelism runs in float only");
  }
}

template <typename T>
std::unique_ptr<ExchangeHandle> AllGatherDispatcher<T>::start_reduce_scatter(const T* send, T* recv, int64_t count) {
  if (this->ep_size_ == 1) {
    this->backend_.copy(recv, send, size_t(count) * sizeof(T));
    return nullptr;
  }
  if constexpr (std::is_same_v<T, float>) {
    return this->exchange_->start_reduce_scatter(send, recv, count);
  } else {
    MOE_FAIL("expert parallelism runs in float only");
  }
}

template <typename T>
void AllGatherDispatcher<T>::reserve_staging(const ExchangePlan& p, int64_t width, RowsInFlight<T>& rows) {
  const sizes::DispatcherStaging size =
      sizes::allgather_staging(double(this->ep_size_), double(p.block_rows), double(width));
  this->backend_.reserve(rows.own, dtype_of<T>(), sizes::elements(size.own));
  this->backend_.reserve(rows.staging, dtype_of<T>(), sizes::elements(size.staging));
}

// This rank's rows go out in a block of the group's largest row count; the rows past its own are never read.
template <typename T>
void AllGatherDispatcher<T>::start_dispatch(const ExchangePlan& p, const T* token_rows, int64_t width,
                                            RowsInFlight<T>& rows) {
  const int64_t block = p.block_rows * width;
  reserve_staging(p, width, rows);
  T* own = rows.own.template data<T>();
  if (p.token_rows > 0) this->backend_.copy(own, token_rows, size_t(p.token_rows * width) * sizeof(T));
  if (block > 0) rows.handle = start_allgather(own, rows.staging.template data<T>(), block);
}

template <typename T>
void AllGatherDispatcher<T>::finish_dispatch(const ExchangePlan& p, RowsInFlight<T>& rows, T* expert_rows,
                                             int64_t width) {
  if (rows.handle) rows.handle->wait();
  rows.handle.reset();
  this->move_blocks(p, gathered_rows(p), rows.staging.template data<T>(), expert_rows, width, true);
}

template <typename T>
void AllGatherDispatcher<T>::start_combine(const ExchangePlan& p, const T* expert_rows, T* token_rows, int64_t width,
                                           RowsInFlight<T>& rows) {
  const int64_t block = p.block_rows * width;
  reserve_staging(p, width, rows);
  T* all = rows.staging.template data<T>();
  if (block > 0) this->backend_.template ops<T>().fill(all, T(-0.0), this->ep_size_ * block);
  this->move_blocks(p, gathered_rows(p), expert_rows, all, width, false);
  if (block > 0) rows.handle = start_reduce_scatter(all, rows.own.template data<T>(), block);
  rows.destination = token_rows;
}

template <typename T>
void AllGatherDispatcher<T>::finish_combine(const ExchangePlan& p, RowsInFlight<T>& rows, int64_t width) {
  if (rows.handle) rows.handle->wait();
  rows.handle.reset();
  if (p.token_rows > 0)
    this->backend_.copy(rows.destination, rows.own.template data<T>(), size_t(p.token_rows * width) * sizeof(T));
  rows.destination = nullptr;
}

template class AllGatherDispatcher<float>;
template class AllGatherDispatcher<double>;

}  // namespace moe
