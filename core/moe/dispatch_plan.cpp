// The dispatch plan: capacity, overflow, permutation. See dispatch_plan.h.
#include "core/moe/dispatch_plan.h"

#include <algorithm>

#include "core/error.h"
#include "core/moe/dispatch_order.h"

namespace moe {
namespace {

// Capacity first (the kept slots: Ops::capacity_keep's CPU body), then the overflow in priority order. The
// priority order is total (ties go to the lower slot), so the overflowed slots' order does not depend on how they
// were collected.
template <typename T>
void apply_capacity(const DispatchRequest<T>& r, DispatchPlan& plan, std::vector<int64_t>& load) {
  const int64_t E = r.experts, K = r.top_k, M = r.tokens * K, C = r.capacity;
  const bool by_score = r.drop_policy == DropPolicy::Probs;
  std::vector<int32_t> selected(static_cast<size_t>(M));
  for (int64_t slot = 0; slot < M; ++slot) selected[size_t(slot)] = r.preference[(slot / K) * r.choices + slot % K];
  std::vector<std::vector<int32_t>> by_expert;
  dispatch_order::capacity_keep(selected.data(), r.score, by_score, C, plan.assigned_expert.data(), M, E, by_expert);
  std::vector<int32_t> overflowed;
  for (int64_t e = 0; e < E; ++e) {
    const auto& slots = by_expert[size_t(e)];
    load[size_t(e)] = std::min(int64_t(slots.size()), C);
    for (size_t i = 0; i < slots.size(); ++i) {
      if (int64_t(i) < C)
        plan.fate[slots[i]] = SlotFate::Kept;
      else
        overflowed.push_back(slots[i]);
    }
  }
  std::stable_sort(overflowed.begin(), overflowed.end(),
                   [&](int32_t a, int32_t b) { return dispatch_order::priority_before(r.score, by_score, a, b); });
  for (int32_t slot : overflowed) {
    if (r.overflow == Overflow::Drop) {
      plan.fate[slot] = SlotFate::Dropped;
    } else if (r.overflow == Overflow::Dense) {
      plan.fate[slot] = SlotFate::Fallback;
    } else {  // reroute: next expert down the row with room, never one the token already uses
      const int64_t n = slot / K;
      const int32_t* row = r.preference + n * r.choices;
      // What finds no room is dropped, or in the cascade computed by the dense fallback.
      plan.fate[slot] = r.overflow == Overflow::RerouteDense ? SlotFate::Fallback : SlotFate::Dropped;
      for (int64_t c = 0; c < r.choices && row[c] >= 0; ++c) {
        const int32_t e = row[c];
        if (load[e] >= C) continue;
        bool used = false;
        for (int64_t i = 0; i < K; ++i) used |= plan.assigned_expert[n * K + i] == e || row[i] == e;
        if (used) continue;
        plan.fate[slot] = SlotFate::Rerouted, plan.assigned_expert[slot] = e, ++load[e];
        break;
      }
    }
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
  std::vector<int64_t> load(static_cast<size_t>(E), 0);
  apply_capacity(request, plan, load);
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
