// The all-to-all dispatcher (moe.dispatcher = "alltoall"): each rank sends every other rank exactly the rows for
// its experts (an all-to-all-v), after an all-to-all of the counts per (rank, local expert). The rows arrive
// source-major and are reordered expert-major; combine sends them back the same way.
#pragma once

#include "core/moe/dispatcher.h"

namespace moe {

template <typename T>
class AllToAllDispatcher final : public Dispatcher<T> {
 public:
  using Dispatcher<T>::Dispatcher;
  const char* name() const override { return "alltoall"; }
  std::unique_ptr<ExchangeHandle> start_plan(const std::vector<int64_t>& expert_offset, ExchangePlan& plan) override;
  void finish_plan(std::unique_ptr<ExchangeHandle> counts, ExchangePlan& plan) override;
  void start_dispatch(const ExchangePlan& plan, const T* token_rows, int64_t width, RowsInFlight<T>& rows) override;
  void finish_dispatch(const ExchangePlan& plan, RowsInFlight<T>& rows, T* expert_rows, int64_t width) override;
  void start_combine(const ExchangePlan& plan, const T* expert_rows, T* token_rows, int64_t width,
                     RowsInFlight<T>& rows) override;
  void finish_combine(const ExchangePlan& plan, RowsInFlight<T>& rows, int64_t width) override;

 private:
  // The staging of received rows (core/sizes.h alltoall_staging).
  int64_t staging_elements(const ExchangePlan& plan, int64_t width) const;
  // Where each (source, local expert) block starts among the received rows (source-major).
  std::vector<int64_t> source_major_rows(const ExchangePlan& plan) const;
  // Starts moving rows (one rank: copies them and returns null).
  std::unique_ptr<ExchangeHandle> start_rows(const T* send, const std::vector<int64_t>& send_rows, T* recv,
                                             const std::vector<int64_t>& recv_rows, int64_t width);
};

}  // namespace moe
