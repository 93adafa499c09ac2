// The MoE dispatcher: moves rows between the token side (this rank's tokens, in the global expert order of the
// dispatch plan) and the expert side (rows for this rank's experts, expert-major: for each local expert the rows
// of source rank 0, then 1, ...) over the expert-parallel group, through ExpertExchange. An interface chosen at
// construction (make_dispatcher, MoeSettings::dispatcher): plan() exchanges what each rank needs to know and
// returns the plan (the handle dispatch and combine take); dispatch() and combine() (its adjoint) move rows and
// compute nothing. Each has start and finish forms: between them the counts or rows travel (RowsInFlight owns
// the rows) and the caller may compute, e.g. the shared experts; the blocking forms are start then finish.
// Every dispatcher gives the experts the same rows in the same order and every token its expert outputs back
// unchanged, so the choice changes no computed value (docs/parallel.md "Dispatchers").
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/backend/backend.h"
#include "core/expert_exchange.h"
#include "core/moe/settings.h"

namespace moe {

// The plan of one routing group's exchange, kept for the backward.
struct ExchangePlan {
  // Every dispatcher's: what this rank's experts compute.
  std::vector<int64_t> recv_count;    // (ep_size, local experts): rows from a source for an expert
  std::vector<int64_t> local_offset;  // local experts + 1: expert-major block offsets
  int64_t received = 0;               // R: rows this rank's experts compute
  int64_t token_rows = 0;             // M: this rank's token-side rows
  // The all-to-all's: rows to each (rank, its local expert); per rank, token-side rows sent to it and
  // expert-side rows from it.
  std::vector<int64_t> send_count, send_rows, recv_rows;
  // The all-gather's: every rank's token-side rows per global expert (ep_size, experts), gathered from this
  // rank's own (sent to every rank: the all-gather of counts as an all-to-all of equal blocks); each rank's rows
  // travel in a block of block_rows (the largest token_rows of the group), and (q, local expert)'s rows start
  // at row source_row of q's block.
  std::vector<int64_t> own_count, gathered_count, source_row;
  int64_t block_rows = 0;
};

// A dispatch or combine between its start and its finish.
template <typename T>
struct RowsInFlight {
  std::unique_ptr<ExchangeHandle> handle;  // null when nothing travels
  // Backend memory kept between calls. staging: the expert side's rows in the order they travel (the
  // all-to-all's, source-major; the all-gather's, every rank's block); own: the all-gather's block of this rank.
  Buffer staging, own;
  T* destination = nullptr;  // the all-gather's combine: where finish copies this rank's token-side rows
};

template <typename T>
class Dispatcher {
 public:
  // experts: E in all; this rank holds E / ep_size of them, the ranks in order.
  Dispatcher(Backend& backend, int64_t experts, int64_t ep_size)
      : backend_(backend), experts_(experts), ep_size_(ep_size) {}
  virtual ~Dispatcher() = default;
  virtual const char* name() const = 0;  // its moe.dispatcher value
  // Required when ep_size > 1 (float only); without one a single rank exchanges with itself.
  void set_exchange(ExpertExchange* exchange) { exchange_ = exchange; }
  bool ready() const { return ep_size_ == 1 || exchange_ != nullptr; }
  int64_t local_experts() const { return experts_ / ep_size_; }

  // expert_offset: E + 1 token-side block offsets by global expert.
  void plan(const std::vector<int64_t>& expert_offset, ExchangePlan& plan) {
    finish_plan(start_plan(expert_offset, plan), plan);
  }
  // plan in two halves: start_plan starts the counts' exchange (plan must stay untouched until finish_plan),
  // finish_plan waits for it and fills in the rest of the plan.
  virtual std::unique_ptr<ExchangeHandle> start_plan(const std::vector<int64_t>& expert_offset, ExchangePlan& plan) = 0;
  virtual void finish_plan(std::unique_ptr<ExchangeHandle> counts, ExchangePlan& plan) = 0;

  // token_rows: (M, width) -> expert_rows: (R, width), expert-major. The blocking forms keep their staging
  // between calls; with one rank they are one copy, or none where both sides are the same memory.
  void dispatch(const ExchangePlan& plan, const T* token_rows, T* expert_rows, int64_t width);
  // The adjoint: expert_rows (R, width) back to token_rows.
  void combine(const ExchangePlan& plan, const T* expert_rows, T* token_rows, int64_t width);

  // dispatch in two halves: token_rows must stay untouched until finish_dispatch, which writes expert_rows.
  virtual void start_dispatch(const ExchangePlan& plan, const T* token_rows, int64_t width, RowsInFlight<T>& rows) = 0;
  virtual void finish_dispatch(const ExchangePlan& plan, RowsInFlight<T>& rows, T* expert_rows, int64_t width) = 0;
  // combine in two halves: expert_rows may be reused after start_combine; token_rows is written by the
  // time finish_combine returns.
  virtual void start_combine(const ExchangePlan& plan, const T* expert_rows, T* token_rows, int64_t width,
                             RowsInFlight<T>& rows) = 0;
  virtual void finish_combine(const ExchangePlan& plan, RowsInFlight<T>& rows, int64_t width) = 0;

 protected:
  // local_offset and received from recv_count.
  void set_local_offsets(ExchangePlan& plan) const;
  // Copies the expert side's blocks of (source rank, local expert) rows between the expert-major order and their
  // places in another buffer (first_row[q * local experts + el]: where block (q, el) starts there), in either
  // direction.
  void move_blocks(const ExchangePlan& plan, const std::vector<int64_t>& first_row, const T* from, T* to, int64_t width,
                   bool to_expert_major) const;

  Backend& backend_;
  int64_t experts_, ep_size_;
  ExpertExchange* exchange_ = nullptr;

 private:
  RowsInFlight<T> blocking_;  // staging of the blocking forms
};

// The dispatcher `kind` names (docs/config.md moe.dispatcher).
template <typename T>
std::unique_ptr<Dispatcher<T>> make_dispatcher(DispatcherKind kind, Backend& backend, int64_t experts, int64_t ep_size);

}  // namespace moe
