// The dispatch plan: capacity, overflow, permutation. See dispatch_plan.h.
#include "core/moe/dispatch_plan.h"

#include <algorithm>

#include "core/error.h"

namespace moe {
namespace {

template <typename T>
void apply_capacity(const DispatchRequest<T>& r, DispatchPlan& plan, std::vector<int64_t>& load) {
  const int64_t E = r.experts, K = r.top_k, M = r.tokens * K, C = r.capacity;
  auto selected = [&](int64_t slot) { return r.preference[(slot / K) * r.choices + slot % K]; };
  auto priority_before = [&](int32_t a, int32_t b) {  // slots a, b
    if (r.drop_policy == DropPolicy::Probs && r.score[a] != r.score[b]) return r.score[a] > r.score[b];
    return a < b;  // position: token order
  };
  std::vector<std::vector<int32_t>> by_expert(static_cast<size_t>(E));
  for (int64_t slot = 0; slot < M; ++slot)
    if (selected(slot) >= 0) by_expert[selected(slot)].push_back(int32_t(slot));
  std::vector<int32_t> overflowed;
  for (int64_t e = 0; e < E; ++e) {
    auto& slots = by_expert[e];
    std::stable_sort(slots.begin(), slots.end(), priority_before);
    for (int32_t slot : slots) {
      if (load[e] < C) {
        plan.fate[slot] = SlotFate::Kept, plan.assigned_expert[slot] = int32_t(e), ++load[e];
      } else {
        overflowed.push_back(slot);
      }
    }
  }
  std::stable_sort(overflowed.begin(), overflowed.end(), priority_before);
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

// Rows of each expert's contiguous block, in slot (token) order within an expert.
void build_permutation(int64_t E, int64_t M, DispatchPlan& plan) {
  plan.expert_offset.assign(size_t(E + 1), 0);
  for (int64_t slot = 0; slot < M; ++slot)
    if (plan.assigned_expert[slot] >= 0) ++plan.expert_offset[plan.assigned_expert[slot] + 1];
  for (int64_t e = 0; e < E; ++e) plan.expert_offset[e + 1] += plan.expert_offset[e];
  plan.perm_slot.assign(size_t(plan.expert_offset[E]), -1);
  std::vector<int64_t> fill(plan.expert_offset.begin(), plan.expert_offset.end() - 1);
  for (int64_t slot = 0; slot < M; ++slot)
    if (plan.assigned_expert[slot] >= 0) plan.perm_slot[fill[plan.assigned_expert[slot]]++] = int32_t(slot);
  plan.row_of_slot.assign(size_t(M), -1);
  for (int64_t r = 0; r < plan.expert_offset[E]; ++r) plan.row_of_slot[plan.perm_slot[r]] = r;
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
  part.row_of_slot.assign(size_t(hi - lo), -1);
  part.expert_offset.assign(size_t(experts + 1), 0);
  for (int64_t e = 0; e < experts; ++e) {
    for (int64_t r = plan.expert_offset[size_t(e)]; r < plan.expert_offset[size_t(e) + 1]; ++r) {
      const int64_t slot = plan.perm_slot[size_t(r)];
      if (slot < lo || slot >= hi) continue;
      part.row_of_slot[size_t(slot - lo)] = int64_t(part.perm_slot.size());
      part.perm_slot.push_back(int32_t(slot - lo));
    }
    part.expert_offset[size_t(e) + 1] = int64_t(part.perm_slot.size());
  }
  return part;
}

}  // namespace moe
