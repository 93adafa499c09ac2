// The MoE dispatcher: moves rows between the token side (this rank's tokens, in the global expert
// order of the dispatch plan) and the expert side (rows for this rank's experts, expert-major) over
// the expert-parallel group, through ExpertExchange. plan() exchanges the counts; dispatch() and
// combine() (its adjoint) move rows and do nothing else, so they can later overlap with compute.
#pragma once

#include <cstdint>
#include <vector>

#include "core/backend/backend.h"
#include "core/expert_exchange.h"

namespace moe {

// Who sends how many rows to whom for one routing group, kept for the backward.
struct ExchangePlan {
  std::vector<int64_t> send_rows, recv_rows;  // per rank: token-side rows sent to it, expert-side rows from it
  std::vector<int64_t> recv_count;            // (ep_size, local experts): rows from a source for an expert
  std::vector<int64_t> local_offset;          // local experts + 1: expert-major block offsets
  int64_t received = 0;                       // R: rows this rank's experts compute
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
  // token_rows: (plan's token-side rows, width) -> expert_rows: (R, width), expert-major.
  void dispatch(const ExchangePlan& plan, const T* token_rows, T* expert_rows, int64_t width);
  // The adjoint: expert_rows (R, width) back to token_rows.
  void combine(const ExchangePlan& plan, const T* expert_rows, T* token_rows, int64_t width);

 private:
  // Received rows between source-major (source rank, local expert) and expert-major order.
  void reorder(const ExchangePlan& plan, const T* from, T* to, int64_t width, bool to_expert_major) const;
  void exchange_rows(const T* send, const std::vector<int64_t>& send_rows, T* recv,
                     const std::vector<int64_t>& recv_rows, int64_t width);

  Backend& backend_;
  int64_t experts_, ep_size_;
  ExpertExchange* exchange_ = nullptr;
  Buffer buffer_;  // workspace of one call
};

}  // namespace moe
