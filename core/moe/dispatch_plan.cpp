// The dispatch plan: capacity, overflow, permutation. See dispatch_plan.h.
#include "core/moe/dispatch_plan.h"

#include <algorithm>

#include "core/error.h"
#include "core/moe/dispatch_order.h"

namespace moe {
namespace {

// Capacity first (the kept slots: Ops::capacity_keep's CPU body), then the overflow in priority order
// (Ops::reroute_overflow's), each slot's fate from what they assigned.
template <typename T>
void apply_capacity(const DispatchRequest<T>& r, DispatchPlan& plan) {
  const int64_t E = r.experts, K = r.top_k, M = r.tokens * K, C = r.capacity;
  const bool by_score = r.drop_policy == DropPolicy::Probs;
  std::vector<int32_t> selected(static_cast<size_t>(M));
  for (int64_t slot = 0; slot < M; ++slot) selected[size_t(slot)] = r.preference[(slot / K) * r.choices + slot % K];
  std::vector<std::vector<int32_t>> by_expert;
  dispatch_order::capacity_keep(selected.data(), r.score, by_score, C, plan.assigned_expert.data(), M, E, by_expert);
  for (int64_t slot = 0; slot < M; ++slot)
    if (plan.assigned_expert[size_t(slot)] >= 0) plan.fate[size_t(slot)] = SlotFate::Kept;
  if (reroutes(r.overflow))
    dispatch_order::reroute_overflow(r.preference, r.choices, r.score, by_score, C, plan.assigned_expert.data(),
                                     r.tokens, K, E);
  // What found no room is dropped, or computed by the dense fallback (dense, and the cascade's last level).
  const SlotFate unplaced = uses_fallback(r.overflow) ? SlotFate::Fallback : SlotFate::Dropped;
  for (int64_t slot = 0; slot < M; ++slot) {
    if (selected[size_t(slot)] < 0 || plan.fate[size_t(slot)] == SlotFate::Kept) continue;
    plan.fate[size_t(slot)] = plan.assigned_expert[size_t(slot)] >= 0 ? SlotFate::Rerouted : unplaced;
  }
}

// Rows of each expert's contiguous block, in slot (token) order within an expert (Ops::permute_by_expert's CPU
// body).
void build_permutation(int64_t E, int64_t M, DispatchPlan& plan) {
  plan.expert_offset.resize(size_t(E + 1));
  plan.perm_slot.resize(size_t(M));
  plan.row_of_slot.resize(size_t(M));
  dispatch_order::permute_by_expert(plan.assigned_expert.data(), plan.expert_offset.data(), plan.perm_slot.data(),
                                    plan.row_of_slot.data(), M, E);
  plan.perm_slot.resize(size_t(plan.expert_offset[size_t(E)]));
}

}  // namespace

template <typename T>
void plan_dispatch(const DispatchRequest<T>& request, DispatchPlan& plan) {
  const int64_t E = request.experts, K = request.top_k, M = request.tokens * K;
  MOE_CHECK(E >= 1 && K >= 1 && K <= E && request.choices >= K && request.choices <= E && request.capacity >= 0,
            "dispatch plan of " << E << " experts, top_k " << K << ", rows of " << request.choices
                                << " choices, capacity " << request.capacity);
  plan.fate.assign(size_t(M), SlotFate::None);
  plan.assigned_expert.assign(size_t(M), -1);
  apply_capacity(request, plan);
  build_permutation(E, M, plan);
}

template void plan_dispatch<float>(const DispatchRequest<float>&, DispatchPlan&);
template void plan_dispatch<double>(const DispatchRequest<double>&, DispatchPlan&);

DispatchPlan restrict_plan(const DispatchPlan& plan, int64_t top_k, int64_t first, int64_t count) {
  const int64_t lo = first * top_k, hi = (first + count) * top_k, experts = int64_t(plan.expert_offset.size()) - 1;
  DispatchPlan part;
  part.fate.assign(plan.fate.begin() + lo, plan.fate.begin() + hi);
  part.assigned_expert.assign(plan.assigned_expert.begin() + lo, plan.assigned_expert.begin() + hi);
  part.row_of_slot.resize(size_t(hi - lo));
  part.perm_slot.resize(size_t(hi - lo));
  part.expert_offset.resize(size_t(experts + 1));
  dispatch_order::restrict_permutation(plan.expert_offset.data(), plan.perm_slot.data(), lo, hi,
                                       part.expert_offset.data(), part.perm_slot.data(), part.row_of_slot.data(),
                                       experts);
  part.perm_slot.resize(size_t(part.expert_offset[size_t(experts)]));
  return part;
}

}  // namespace moe
