// The dispatch plan of one routing group: a pure function from each token's preferred experts (and
// the scores that rank them) to the fate of every (token, choice) assignment under capacity, the
// expert that finally computes it, the rows per expert and the permutation that puts each expert's
// rows in one contiguous block. Local to a rank; no communication, no tensors, no layer state.
#pragma once

#include <cstdint>
#include <vector>

#include "core/moe/settings.h"

namespace moe {

// Assignment ("slot") s = n * top_k + j is token n's j-th choice.
template <typename T>
struct DispatchRequest {
  int64_t tokens = 0, experts = 0, top_k = 1;
  // Width of each preference row (>= top_k). Row n lists the experts token n may use, best first, -1
  // after the last; its first top_k are the selected experts (an assignment with -1 is empty). Reroute
  // walks on down the row, so it needs rows of every usable expert; the other policies need top_k.
  int64_t choices = 0;
  const int32_t* preference = nullptr;  // (tokens, choices)
  const T* score = nullptr;             // (tokens, top_k): score of each selected expert (Probs priority)
  int64_t capacity = 0;                 // assignments per expert; INT64_MAX: no limit
  DropPolicy drop_policy = DropPolicy::Probs;
  Overflow overflow = Overflow::Drop;
};

struct DispatchPlan {
  std::vector<SlotFate> fate;            // (tokens * top_k)
  std::vector<int32_t> assigned_expert;  // (tokens * top_k): expert that computes it, -1 if none
  std::vector<int64_t> expert_offset;    // experts + 1: expert e's rows are [offset[e], offset[e + 1])
  std::vector<int32_t> perm_slot;        // permuted row -> slot (tokens in order within an expert)
  std::vector<int64_t> row_of_slot;      // slot -> permuted row, -1 if no expert computes it
  int64_t rows() const { return expert_offset.empty() ? 0 : expert_offset.back(); }
};

// Capacity first: each expert keeps its `capacity` highest-priority assignments (Probs: higher score
// first, ties to the lower slot; Position: lower slot first). The others overflow and are handled in
// the same priority order: Drop removes them, Dense marks them Fallback, Reroute moves each to the
// first expert further down its token's row that has room and that the token neither selected nor was
// assigned (else Dropped; RerouteDense: else Fallback). `plan` is overwritten (its buffers reused).
template <typename T>
void plan_dispatch(const DispatchRequest<T>& request, DispatchPlan& plan);

// The part of a whole routing group's plan that concerns tokens [first, first + count) (one rank's block
// when the group's tokens are split over ranks): their slots, renumbered from 0, and their rows, in the
// whole plan's order (by expert, tokens in order), renumbered from 0 (Ops::restrict_permutation's CPU body). Every
// decision stays the whole group's.
DispatchPlan restrict_plan(const DispatchPlan& plan, int64_t top_k, int64_t first, int64_t count);

}  // namespace moe
