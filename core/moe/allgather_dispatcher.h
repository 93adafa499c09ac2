// The all-gather dispatcher (moe.dispatcher = "allgather", Megatron-Core's MoEAllGatherTokenDispatcher): every
// rank gathers the token-side rows of every rank of the expert-parallel group, each rank's in a block of the
// group's largest row count, and keeps the rows for its own experts; the counts per global expert are
// all-gathered first. combine is the adjoint: each rank writes its experts' outputs at their places in a buffer
// of all the blocks, -0.0 elsewhere, and a reduce-scatter returns each rank its block. Every row has one expert
// rank, and -0.0 is the additive identity of IEEE arithmetic (x + -0.0 = x for every x, -0.0 and NaN included),
// so the sum gives back every expert output bit for bit, in any order of reduction. It moves ep_size times the
// rows of the all-to-all; it needs no counts for the rows themselves, and suits collectives (NVLink all-gather,
// reduce-scatter) over point-to-point ones.
#pragma once

#include "core/moe/dispatcher.h"

namespace moe {

template <typename T>
class AllGatherDispatcher final : public Dispatcher<T> {
 public:
  using Dispatcher<T>::Dispatcher;
  const char* name() const override { return "allgather"; }
  std::unique_ptr<ExchangeHandle> start_plan(const std::vector<int64_t>& expert_offset, ExchangePlan& plan) override;
  void finish_plan(std::unique_ptr<ExchangeHandle> counts, ExchangePlan& plan) override;
  // The communicators have no nonblocking all-gather: start_dispatch gathers at once (finish only reorders).
  void start_dispatch(const ExchangePlan& plan, const T* token_rows, int64_t width, RowsInFlight<T>& rows) override;
  void finish_dispatch(const ExchangePlan& plan, RowsInFlight<T>& rows, T* expert_rows, int64_t width) override;
  void start_combine(const ExchangePlan& plan, const T* expert_rows, T* token_rows, int64_t width,
                     RowsInFlight<T>& rows) override;
  void finish_combine(const ExchangePlan& plan, RowsInFlight<T>& rows, int64_t width) override;

 private:
  // This rank's block and every rank's (core/sizes.h allgather_staging).
  void reserve_staging(const ExchangePlan& plan, int64_t width, RowsInFlight<T>& rows);
  // Where each (source, local expert) block starts among the gathered rows.
  std::vector<int64_t> gathered_rows(const ExchangePlan& plan) const;
  int64_t ep_rank() const { return this->exchange_ ? this->exchange_->rank() : 0; }
  // The collectives over `count` elements per rank (one rank: a copy, nothing in flight).
  std::unique_ptr<ExchangeHandle> start_allgather(const T* send, T* recv, int64_t count);
  std::unique_ptr<ExchangeHandle> start_reduce_scatter(const T* send, T* recv, int64_t count);
};

}  // namespace moe
