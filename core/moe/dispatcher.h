// The MoE dispatcher: moves rows between the token side (this rank's tokens, in the global expert
// order of the dispatch plan) and the expert side (rows for this rank's experts, expert-major) over
// the expert-parallel group, through ExpertExchange. plan() exchanges the counts; dispatch() and
// combine() (its adjoint) move rows and do nothing else. Each has start and finish forms: between them
// the counts or rows travel (RowsInFlight owns the rows) and the caller may compute, e.g. the shared
// experts; the blocking forms are start then finish.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/backend/backend.h"
#include "core/expert_exchange.h"

namespace moe {

// Who sends how many rows to whom for one routing group, kept for the backward.
struct ExchangePlan {
  std::vector<int64_t> send_count;            // (ep_size, local experts): rows to a rank's expert
  std::vector<int64_t> send_rows, recv_rows;  // per rank: token-side rows sent to it, expert-side rows from it
  std::vector<int64_t> recv_count;            // (ep_size, local experts): rows from a source for an expert
  std::vector<int64_t> local_offset;          // local experts + 1: expert-major block offsets
  int64_t received = 0;                       // R: rows this rank's experts compute
};

// A dispatch or combine between its start and its finish.
template <typename T>
struct RowsInFlight {
  std::unique_ptr<ExchangeHandle> handle;  // null when nothing travels (one expert-parallel rank)
  Buffer staging;  // backend memory: rows in source-major order, received (dispatch) or sent (combine)
};

template <typename T>
class ExpertDispatcher {
 public:
  // experts: E in all; this rank holds E / ep_size of them, the ranks in order.
  ExpertDispatcher(Backend& backend, int64_t experts, int64_t ep_size)
      : backend_(backend), experts_(experts), ep_size_(ep_size) {}
  // Required when ep_size > 1 (float only); without one a single rank exchanges with itself.
  void set_exchange(ExpertExchange* exchange) { exchange_ = exchange; }
  bool ready() const { return ep_size_ == 1 || exchange_ != nullptr; }
  int64_t local_experts() const { return experts_ / ep_size_; }

  // expert_offset: E + 1 token-side block offsets by global expert. Exchanges the counts.
  void plan(const std::vector<int64_t>& expert_offset, ExchangePlan& plan);
  // plan in two halves: start_plan starts the counts' exchange (plan must stay untouched until finish_plan),
  // finish_plan waits for it and fills in the rest of the plan.
  std::unique_ptr<ExchangeHandle> start_plan(const std::vector<int64_t>& expert_offset, ExchangePlan& plan);
  void finish_plan(std::unique_ptr<ExchangeHandle> counts, ExchangePlan& plan);
  // token_rows: (plan's token-side rows, width) -> expert_rows: (R, width), expert-major.
  void dispatch(const ExchangePlan& plan, const T* token_rows, T* expert_rows, int64_t width);
  // The adjoint: expert_rows (R, width) back to token_rows.
  void combine(const ExchangePlan& plan, const T* expert_rows, T* token_rows, int64_t width);

  // dispatch in two halves: token_rows must stay untouched until finish_dispatch, which writes expert_rows.
  void start_dispatch(const ExchangePlan& plan, const T* token_rows, int64_t width, RowsInFlight<T>& rows);
  void finish_dispatch(const ExchangePlan& plan, RowsInFlight<T>& rows, T* expert_rows, int64_t width);
  // combine in two halves: expert_rows may be reused after start_combine; token_rows is written by the
  // time finish_combine returns.
  void start_combine(const ExchangePlan& plan, const T* expert_rows, T* token_rows, int64_t width,
                     RowsInFlight<T>& rows);
  void finish_combine(RowsInFlight<T>& rows);

 private:
  // Received rows between source-major (source rank, local expert) and expert-major order.
  void reorder(const ExchangePlan& plan, const T* from, T* to, int64_t width, bool to_expert_major) const;
  // Starts moving rows (one rank: copies them and returns null).
  std::unique_ptr<ExchangeHandle> start_rows(const T* send, const std::vector<int64_t>& send_rows, T* recv,
                                             const std::vector<int64_t>& recv_rows, int64_t width);

  Backend& backend_;
  int64_t experts_, ep_size_;
  ExpertExchange* exchange_ = nullptr;
  Buffer buffer_;  // staging of the blocking forms, kept between calls
};

}  // namespace moe
