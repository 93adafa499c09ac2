// The dispatch plan against a brute-force reference on thousands of random routings: small token,
// expert and top-k counts, every drop policy and overflow policy, with and without a capacity, scores
// drawn from a few values so that ties happen, tokens with fewer usable experts than top_k; the overflow cascade
// (reroute, then the dense fallback) among the policies. Then the plan's backend ops, as the MoE layer runs them
// (capacity_keep, reroute_overflow, fallback_rows, permute_by_expert), against the host plan on the same routings, on
// the strict device (and on CUDA where there is one).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "core/backend/cuda_backend.h"
#include "core/backend/memory_check.h"
#include "core/moe/dispatch_plan.h"

namespace moe {
namespace {

struct Case {
  int64_t tokens, experts, top_k, choices, capacity;
  DropPolicy drop_policy;
  Overflow overflow;
  std::vector<int32_t> preference;  // (tokens, choices)
  std::vector<float> score;         // (tokens, top_k)
};

DispatchRequest<float> request_of(const Case& c) {
  DispatchRequest<float> r;
  r.tokens = c.tokens, r.experts = c.experts, r.top_k = c.top_k, r.choices = c.choices;
  r.preference = c.preference.data(), r.score = c.score.data(), r.capacity = c.capacity;
  r.drop_policy = c.drop_policy, r.overflow = c.overflow;
  return r;
}

// The rules of docs/model.md and docs/moe.md, written the slow way: an assignment is kept when fewer than
// `capacity` assignments to its expert come before it; the overflowed ones are taken one at a time,
// always the first in priority among those left; the permutation is read off expert by expert.
DispatchPlan reference(const Case& c) {
  const int64_t K = c.top_k, M = c.tokens * K, E = c.experts, W = c.choices;
  auto selected = [&](int64_t s) { return c.preference[(s / K) * W + s % K]; };
  auto before = [&](int64_t a, int64_t b) {
    if (c.drop_policy == DropPolicy::Probs && c.score[a] != c.score[b]) return c.score[a] > c.score[b];
    return a < b;
  };
  DispatchPlan p;
  p.fate.assign(size_t(M), SlotFate::None);
  p.assigned_expert.assign(size_t(M), -1);
  std::vector<int64_t> load(size_t(E), 0);
  std::vector<bool> pending(size_t(M), false);
  for (int64_t s = 0; s < M; ++s) {
    if (selected(s) < 0) continue;
    int64_t ahead = 0;
    for (int64_t t = 0; t < M; ++t) ahead += t != s && selected(t) == selected(s) && before(t, s);
    if (ahead < c.capacity)
      p.fate[s] = SlotFate::Kept, p.assigned_expert[s] = selected(s), ++load[selected(s)];
    else
      pending[s] = true;
  }
  while (true) {
    int64_t s = -1;
    for (int64_t t = 0; t < M; ++t)
      if (pending[t] && (s < 0 || before(t, s))) s = t;
    if (s < 0) break;
    pending[s] = false;
    if (c.overflow == Overflow::Drop) {
      p.fate[s] = SlotFate::Dropped;
    } else if (c.overflow == Overflow::Dense) {
      p.fate[s] = SlotFate::Fallback;
    } else {  // reroute; what finds no room is dropped, or computed by the fallback in the cascade
      p.fate[s] = c.overflow == Overflow::RerouteDense ? SlotFate::Fallback : SlotFate::Dropped;
      const int64_t n = s / K;
      for (int64_t i = 0; i < W; ++i) {
        const int32_t e = c.preference[n * W + i];
        if (e < 0) break;
        bool taken = load[e] >= c.capacity;
        for (int64_t j = 0; j < K; ++j) taken = taken || selected(n * K + j) == e || p.assigned_expert[n * K + j] == e;
        if (taken) continue;
        p.fate[s] = SlotFate::Rerouted, p.assigned_expert[s] = e, ++load[e];
        break;
      }
    }
  }
  p.expert_offset.assign(1, 0);
  p.row_of_slot.assign(size_t(M), -1);
  for (int64_t e = 0; e < E; ++e) {
    for (int64_t s = 0; s < M; ++s)
      if (p.assigned_expert[s] == e) p.row_of_slot[s] = int64_t(p.perm_slot.size()), p.perm_slot.push_back(int32_t(s));
    p.expert_offset.push_back(int64_t(p.perm_slot.size()));
  }
  return p;
}

Case random_case(std::mt19937_64& rng, DropPolicy drop_policy, Overflow overflow, bool limited) {
  auto uniform = [&](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); };
  Case c;
  c.tokens = uniform(1, 12), c.experts = uniform(1, 6), c.top_k = uniform(1, c.experts);
  // Reroute walks down rows of every usable expert; the other policies read only the selected ones.
  c.choices = reroutes(overflow) ? c.experts : uniform(c.top_k, c.experts);
  c.capacity = limited ? uniform(0, c.tokens * c.top_k / c.experts + 2) : std::numeric_limits<int64_t>::max();
  c.drop_policy = drop_policy, c.overflow = overflow;
  c.preference.assign(size_t(c.tokens * c.choices), -1);
  c.score.assign(size_t(c.tokens * c.top_k), 0.0f);
  std::vector<int32_t> experts(size_t(c.experts));
  for (int64_t n = 0; n < c.tokens; ++n) {
    std::iota(experts.begin(), experts.end(), 0);
    std::shuffle(experts.begin(), experts.end(), rng);
    // Expert dropout can leave a token fewer usable experts than top_k.
    const int64_t usable = uniform(0, 5) == 0 ? uniform(0, c.experts) : c.experts;
    for (int64_t i = 0; i < std::min(usable, c.choices); ++i) c.preference[n * c.choices + i] = experts[i];
    for (int64_t j = 0; j < c.top_k; ++j)
      if (c.preference[n * c.choices + j] >= 0) c.score[n * c.top_k + j] = 0.125f * float(uniform(1, 4));
  }
  return c;
}

TEST(DispatchPlan, MatchesBruteForceOnRandomRoutings) {
  std::mt19937_64 rng(2024);
  int64_t cases = 0, overflowed = 0;
  for (DropPolicy drop_policy : {DropPolicy::Probs, DropPolicy::Position})
    for (Overflow overflow : {Overflow::Drop, Overflow::Reroute, Overflow::Dense, Overflow::RerouteDense})
      for (bool limited : {true, false})
        for (int i = 0; i < 600; ++i, ++cases) {
          const Case c = random_case(rng, drop_policy, overflow, limited);
          DispatchPlan plan;
          plan_dispatch(request_of(c), plan);
          const DispatchPlan want = reference(c);
          ASSERT_EQ(plan.fate, want.fate) << "case " << cases;
          ASSERT_EQ(plan.assigned_expert, want.assigned_expert) << "case " << cases;
          ASSERT_EQ(plan.expert_offset, want.expert_offset) << "case " << cases;
          ASSERT_EQ(plan.perm_slot, want.perm_slot) << "case " << cases;
          ASSERT_EQ(plan.row_of_slot, want.row_of_slot) << "case " << cases;
          // Properties the reference shares: no expert above capacity, no token twice at one expert.
          for (int64_t e = 0; e < c.experts; ++e)
            ASSERT_LE(plan.expert_offset[e + 1] - plan.expert_offset[e], c.capacity) << "case " << cases;
          for (int64_t n = 0; n < c.tokens; ++n)
            for (int64_t j = 0; j < c.top_k; ++j)
              for (int64_t i = 0; i < j; ++i) {
                const int32_t a = plan.assigned_expert[n * c.top_k + i], b = plan.assigned_expert[n * c.top_k + j];
                ASSERT_TRUE(a < 0 || a != b) << "case " << cases;
              }
          overflowed += std::count_if(plan.fate.begin(), plan.fate.end(), [](SlotFate f) {
            return f == SlotFate::Dropped || f == SlotFate::Rerouted || f == SlotFate::Fallback;
          });
        }
  EXPECT_GT(overflowed, cases) << "the random cases must exercise overflow";
}

// The layer's plan on the backend for one case: what the host plan decides, from the ops' results.
void expect_ops_match_host_plan(Backend& b, const Case& c, const std::string& what) {
  const int64_t N = c.tokens, K = c.top_k, E = c.experts, M = N * K, W = c.choices;
  DispatchPlan plan;
  plan_dispatch(request_of(c), plan);
  std::vector<int32_t> selected(static_cast<size_t>(M));
  for (int64_t s = 0; s < M; ++s) selected[size_t(s)] = c.preference[size_t((s / K) * W + s % K)];
  Buffer pref = b.upload(c.preference), sel = b.upload(selected), score = b.upload(c.score);
  Buffer assigned = b.allocate(DType::I32, M), counts = b.allocate(DType::I64, 3);
  Buffer offset = b.allocate(DType::I64, E + 1), perm = b.allocate(DType::I32, M), row = b.allocate(DType::I32, M);
  Buffer token = b.allocate(DType::I32, N), weight = b.allocate(DType::F32, N), source = b.allocate(DType::I32, M),
         slot = b.allocate(DType::I32, M);
  Ops<float>& ops = b.ops<float>();
  const bool by_score = c.drop_policy == DropPolicy::Probs;
  ops.capacity_keep(sel.data<int32_t>(), score.data<float>(), by_score, c.capacity, assigned.data<int32_t>(), M, E);
  if (reroutes(c.overflow))
    ops.reroute_overflow(pref.data<int32_t>(), W, score.data<float>(), by_score, c.capacity, assigned.data<int32_t>(),
                         counts.data<int64_t>(), N, K, E);
  // The scores stand for the gate weights.
  ops.fallback_rows(sel.data<int32_t>(), assigned.data<int32_t>(), score.data<float>(), K, token.data<int32_t>(),
                    weight.data<float>(), source.data<int32_t>(), slot.data<int32_t>(), counts.data<int64_t>() + 1, N);
  ops.permute_by_expert(assigned.data<int32_t>(), offset.data<int64_t>(), perm.data<int32_t>(), row.data<int32_t>(), M,
                        E);
  ASSERT_EQ(b.download<int32_t>(assigned), plan.assigned_expert) << what;
  ASSERT_EQ(b.download<int64_t>(offset), plan.expert_offset) << what;
  std::vector<int32_t> perm_slot = b.download<int32_t>(perm);
  perm_slot.resize(plan.perm_slot.size());
  ASSERT_EQ(perm_slot, plan.perm_slot) << what;
  const std::vector<int64_t> count = b.download<int64_t>(counts);
  const auto fates = [&](SlotFate f) { return int64_t(std::count(plan.fate.begin(), plan.fate.end(), f)); };
  if (reroutes(c.overflow)) {
    EXPECT_EQ(count[0], fates(SlotFate::Rerouted)) << what;
  }
  // Where there is a fallback, its slots are the unassigned selected ones (dense: every overflowed one).
  std::vector<int32_t> fallback_slots(static_cast<size_t>(count[2]));
  const std::vector<int32_t> got_slot = b.download<int32_t>(slot);
  std::copy(got_slot.begin(), got_slot.begin() + count[2], fallback_slots.begin());
  std::vector<int32_t> want;
  for (int64_t s = 0; s < M; ++s)
    if (plan.fate[size_t(s)] == (uses_fallback(c.overflow) ? SlotFate::Fallback : SlotFate::Dropped))
      want.push_back(int32_t(s));
  EXPECT_EQ(fallback_slots, want) << what;
}

TEST(DispatchPlan, BackendOpsMatchTheHostPlanOnRandomRoutings) {
  std::vector<std::unique_ptr<Backend>> backends;
  backends.push_back(make_memory_check_backend(0));
  if (cuda_device_count() > 0) backends.push_back(make_cuda_backend(0));
  for (const std::unique_ptr<Backend>& b : backends) {
    std::mt19937_64 rng(77);
    int64_t cases = 0;
    for (DropPolicy drop_policy : {DropPolicy::Probs, DropPolicy::Position})
      for (Overflow overflow : {Overflow::Drop, Overflow::Reroute, Overflow::Dense, Overflow::RerouteDense})
        for (bool limited : {true, false})
          for (int i = 0; i < 100; ++i, ++cases)
            expect_ops_match_host_plan(*b, random_case(rng, drop_policy, overflow, limited),
                                       std::string(b->name()) + " case " + std::to_string(cases));
  }
}

TEST(DispatchPlan, RefusesRowsNarrowerThanTopK) {
  Case c{2, 3, 2, 1, 1, DropPolicy::Probs, Overflow::Drop, {0, 1}, {0.5f, 0.5f, 0.5f, 0.5f}};
  DispatchPlan plan;
  EXPECT_ANY_THROW(plan_dispatch(request_of(c), plan));
}

}  // namespace
}  // namespace moe
