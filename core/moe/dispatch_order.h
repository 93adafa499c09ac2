// The dispatch plan's slot order and permutation (MODEL.md "Capacity"), host arithmetic shared by the host plan
// (core/moe/dispatch_plan.cpp) and the CPU bodies of the plan's ops of core/backend/ops.h (Ops::capacity_keep,
// Ops::reroute_overflow, Ops::fallback_rows, Ops::permute_by_expert, Ops::restrict_permutation, Ops::permuted_rows),
// so that the plan the host makes and the ops' results are the same bits. It lives with the MoE code, not in a
// backend, as core/moe/gate_weights.h does: no layer includes a backend's own headers.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

namespace moe::dispatch_order {

// Slot a before slot b in an expert's priority order (MODEL.md "Capacity"): by_score, the higher score first,
// ties to the lower slot; else the lower slot (token order).
template <typename T>
bool priority_before(const T* score, bool by_score, int32_t a, int32_t b) {
  if (by_score && score[a] != score[b]) return score[a] > score[b];
  return a < b;
}

// Ops::capacity_keep: each expert keeps its `capacity` first assignments in priority order; by_expert is the
// caller's (reused) buffer of each expert's slots, left sorted in priority order.
template <typename T>
void capacity_keep(const int32_t* selected, const T* score, bool by_score, int64_t capacity, int32_t* assigned,
                   int64_t M, int64_t E, std::vector<std::vector<int32_t>>& by_expert) {
  by_expert.assign(size_t(E), {});
  for (int64_t slot = 0; slot < M; ++slot) {
    assigned[slot] = -1;
    if (selected[slot] >= 0) by_expert[size_t(selected[slot])].push_back(int32_t(slot));
  }
  const auto before = [=](int32_t a, int32_t b) { return priority_before(score, by_score, a, b); };
  for (auto& slots : by_expert) {
    std::stable_sort(slots.begin(), slots.end(), before);
    for (size_t i = 0; i < slots.size() && int64_t(i) < capacity; ++i) assigned[slots[i]] = selected[slots[i]];
  }
}

// Ops::reroute_overflow: after capacity_keep, the overflowed slots (selected, not assigned) in priority order, each
// to the first expert further down its token's preference row (N, W) that has room and that the token neither
// selected nor was assigned; what finds none stays unassigned. Returns the slots rerouted.
template <typename T>
int64_t reroute_overflow(const int32_t* preference, int64_t W, const T* score, bool by_score, int64_t capacity,
                         int32_t* assigned, int64_t N, int64_t K, int64_t E) {
  const int64_t M = N * K;
  std::vector<int64_t> load(size_t(E), 0);
  std::vector<int32_t> overflowed;
  for (int64_t slot = 0; slot < M; ++slot) {
    if (assigned[slot] >= 0) ++load[size_t(assigned[slot])];
    if (assigned[slot] < 0 && preference[(slot / K) * W + slot % K] >= 0) overflowed.push_back(int32_t(slot));
  }
  // The priority order is total (ties go to the lower slot), so the order the slots were collected in is not seen.
  std::stable_sort(overflowed.begin(), overflowed.end(),
                   [=](int32_t a, int32_t b) { return priority_before(score, by_score, a, b); });
  int64_t rerouted = 0;
  for (const int32_t slot : overflowed) {
    const int64_t n = slot / K;
    const int32_t* row = preference + n * W;
    for (int64_t c = 0; c < W && row[c] >= 0; ++c) {
      const int32_t e = row[c];
      if (load[size_t(e)] >= capacity) continue;
      bool used = false;
      for (int64_t i = 0; i < K; ++i) used |= assigned[n * K + i] == e || row[i] == e;
      if (used) continue;
      assigned[slot] = e, ++load[size_t(e)], ++rerouted;
      break;
    }
  }
  return rerouted;
}

// Ops::fallback_rows: the dense fallback's tokens (those with a selected, unassigned slot, in order) and each one's
// summed gate weights (in double, slots in order), then for each such slot its token's row among them and the slot;
// -1 (and 0) after the last. count: the tokens and the slots.
template <typename T>
void fallback_rows(const int32_t* selected, const int32_t* assigned, const T* gate, int64_t K, int32_t* token,
                   T* weight, int32_t* source, int32_t* slot, int64_t* count, int64_t N) {
  int64_t tokens = 0, slots = 0;
  for (int64_t n = 0; n < N; ++n) {
    double w = 0;
    bool any = false;
    for (int64_t j = 0; j < K; ++j) {
      const int64_t s = n * K + j;
      if (selected[s] < 0 || assigned[s] >= 0) continue;
      w += double(gate[s]), any = true;
      source[slots] = int32_t(tokens), slot[slots] = int32_t(s), ++slots;
    }
    if (any) token[tokens] = int32_t(n), weight[tokens] = T(w), ++tokens;
  }
  std::fill(token + tokens, token + N, int32_t(-1));
  std::fill(weight + tokens, weight + N, T(0));
  std::fill(source + slots, source + N * K, int32_t(-1));
  std::fill(slot + slots, slot + N * K, int32_t(-1));
  count[0] = tokens, count[1] = slots;
}

// Ops::permute_by_expert: the rows of each expert's contiguous block, slots in order within an expert.
template <typename Row>
void permute_by_expert(const int32_t* assigned, int64_t* offset, int32_t* perm_slot, Row* row_of_slot, int64_t M,
                       int64_t E) {
  std::fill(offset, offset + E + 1, int64_t(0));
  for (int64_t slot = 0; slot < M; ++slot)
    if (assigned[slot] >= 0) ++offset[assigned[slot] + 1];
  for (int64_t e = 0; e < E; ++e) offset[e + 1] += offset[e];
  std::fill(perm_slot, perm_slot + M, int32_t(-1));
  std::vector<int64_t> fill(offset, offset + E);
  for (int64_t slot = 0; slot < M; ++slot)
    if (assigned[slot] >= 0) perm_slot[fill[size_t(assigned[slot])]++] = int32_t(slot);
  std::fill(row_of_slot, row_of_slot + M, Row(-1));
  for (int64_t r = 0; r < offset[E]; ++r) row_of_slot[perm_slot[r]] = Row(r);
}

// Ops::restrict_permutation: the rows of the permutation (offset, perm_slot over its slots) whose slots lie in
// [lo, hi), in the permutation's order (by expert, slots in order), renumbered from 0, their slots from lo. perm_slot
// lists offset[E] rows; part_perm_slot and part_row_of_slot hold hi - lo, -1 where unused.
template <typename Row>
void restrict_permutation(const int64_t* offset, const int32_t* perm_slot, int64_t lo, int64_t hi, int64_t* part_offset,
                          int32_t* part_perm_slot, Row* part_row_of_slot, int64_t E) {
  std::fill(part_perm_slot, part_perm_slot + (hi - lo), int32_t(-1));
  std::fill(part_row_of_slot, part_row_of_slot + (hi - lo), Row(-1));
  int64_t rows = 0;
  for (int64_t e = 0; e < E; ++e) {
    part_offset[e] = rows;
    for (int64_t r = offset[e]; r < offset[e + 1]; ++r) {
      const int64_t slot = perm_slot[r];
      if (slot < lo || slot >= hi) continue;
      part_row_of_slot[slot - lo] = Row(rows);
      part_perm_slot[rows++] = int32_t(slot - lo);
    }
  }
  part_offset[E] = rows;
}

// Ops::permuted_rows: each permuted row's token and gate weight.
template <typename T>
void permuted_rows(const int32_t* perm_slot, const T* gate, int64_t K, int32_t* perm_token, T* perm_gate, int64_t M) {
  for (int64_t r = 0; r < M; ++r) {
    const int32_t slot = perm_slot[r];
    perm_token[r] = slot < 0 ? -1 : int32_t(slot / K);
    perm_gate[r] = slot < 0 ? T(0) : gate[slot];
  }
}

}  // namespace moe::dispatch_order
