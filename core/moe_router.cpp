// The MoE layer's router: scores (noise, temperature), selection, gate weights, capacity and overflow,
// the permutation into per-expert blocks (the plan, local to a rank), the router losses, and the
// backward from gate-weight gradients and router losses into the router weights and the input.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "core/error.h"
#include "core/moe_layer.h"
#include "core/philox.h"

namespace moe {
namespace {
// Below this the renormalising sum of the selected scores is clamped (and treated as a constant), so
// a sigmoid router cannot drive its scores towards zero to game the losses (PITFALLS.md).
constexpr double kMinGateSum = 1e-6;
constexpr double kMinLogArg = 1e-30;
}  // namespace

// Plan: scores, selection, gate weights, capacity and overflow. Local, no communication.
template <typename T>
void MoeLayer<T>::route(const FfnContext& context, const T* logits, T* scores, MoeSlot<T>& st, int64_t N) const {
  const int64_t E = s_.num_experts, K = s_.top_k;
  const bool training = context.training;
  const RngStream gumbel(context.seed, "moe.router.gumbel.layer" + std::to_string(s_.layer));
  const RngStream dropout(context.seed, "moe.expert_dropout.layer" + std::to_string(s_.layer));

  // Scores p = softmax((z + g) / tau) or sigmoid(...), g Gumbel noise in training.
  for (int64_t n = 0; n < N; ++n) {
    double zt[1024];
    MOE_CHECK(E <= 1024, "at most 1024 experts per layer");
    for (int64_t e = 0; e < E; ++e) {
      double z = double(logits[n * E + e]);
      if (training && s_.noise == RouterNoise::Gumbel)
        z += gumbel.gumbel(uint64_t(context.step), uint64_t((context.first_token + n) * E + e));
      zt[e] = z / s_.tau;
    }
    T* p = scores + n * E;
    if (s_.score == RouterScore::Softmax) {
      double m = -INFINITY, sum = 0;
      for (int64_t e = 0; e < E; ++e) m = std::max(m, zt[e]);
      for (int64_t e = 0; e < E; ++e) sum += std::exp(zt[e] - m);
      for (int64_t e = 0; e < E; ++e) p[e] = T(std::exp(zt[e] - m) / sum);
    } else {
      for (int64_t e = 0; e < E; ++e) p[e] = T(1.0 / (1.0 + std::exp(-zt[e])));
    }
  }

  // Expert dropout: the same mask for every token of the step and on every rank.
  st.expert_masked.assign(size_t(E), 0);
  if (training && s_.expert_dropout > 0)
    for (int64_t e = 0; e < E; ++e)
      st.expert_masked[e] = dropout.uniform(uint64_t(context.step), uint64_t(e)) < s_.expert_dropout;

  // Top-k of p + b among unmasked experts (ties to the lower index); f_e from top-k of p alone.
  st.selected_expert.assign(size_t(N * K), -1);
  st.gate.assign(size_t(N * K), T(0));
  st.denom.assign(size_t(N), T(1));
  st.denom_clamped.assign(size_t(N), 0);
  st.f.assign(size_t(E), T(0));
  std::vector<int32_t> order(static_cast<size_t>(E));
  const bool renormalise = s_.normalize && K > 1;
  for (int64_t n = 0; n < N; ++n) {
    const T* p = scores + n * E;
    // Only the first K of each order matter: partial sorts, ties to the lower expert index (the same
    // selection a stable full sort gives).
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + K, order.end(),
                      [&](int32_t a, int32_t b) { return p[a] > p[b] || (p[a] == p[b] && a < b); });
    for (int64_t j = 0; j < K; ++j) st.f[order[j]] += T(1);
    int64_t available = 0;
    for (int32_t e = 0; e < E; ++e)
      if (!st.expert_masked[e]) order[available++] = e;
    const int64_t take = std::min(K, available);
    std::partial_sort(order.begin(), order.begin() + take, order.begin() + available, [&](int32_t a, int32_t b) {
      const double ka = double(p[a]) + bias_[a], kb = double(p[b]) + bias_[b];
      return ka > kb || (ka == kb && a < b);
    });
    for (int64_t j = 0; j < take; ++j) st.selected_expert[n * K + j] = order[j];
    double sum = 0;
    for (int64_t i = 0; i < K; ++i)
      if (st.selected_expert[n * K + i] >= 0) sum += double(p[st.selected_expert[n * K + i]]);
    if (renormalise) {
      if (sum < kMinGateSum) sum = kMinGateSum, st.denom_clamped[n] = 1;
      st.denom[n] = T(sum);
    }
    for (int64_t i = 0; i < K; ++i)
      if (st.selected_expert[n * K + i] >= 0) st.gate[n * K + i] = p[st.selected_expert[n * K + i]] / st.denom[n];
  }
  for (int64_t e = 0; e < E; ++e) st.f[e] /= T(double(N * K));

  // Capacity: each expert keeps its C highest-priority assignments; the rest overflow.
  const int64_t C = capacity(N);
  st.fate.assign(size_t(N * K), SlotFate::None);
  st.assigned_expert.assign(size_t(N * K), -1);
  auto priority_before = [&](int32_t a, int32_t b) {  // slots a, b
    if (s_.drop_policy == DropPolicy::Probs) {
      const T pa = scores[(a / K) * E + st.selected_expert[a]], pb = scores[(b / K) * E + st.selected_expert[b]];
      if (pa != pb) return pa > pb;
    }
    return a < b;  // position: token order
  };
  std::vector<std::vector<int32_t>> by_expert(static_cast<size_t>(E));
  for (int64_t slot = 0; slot < N * K; ++slot)
    if (st.selected_expert[slot] >= 0) by_expert[st.selected_expert[slot]].push_back(int32_t(slot));
  std::vector<int64_t> load(static_cast<size_t>(E), 0);
  std::vector<int32_t> overflowed;
  for (int64_t e = 0; e < E; ++e) {
    auto& slots = by_expert[e];
    std::stable_sort(slots.begin(), slots.end(), priority_before);
    for (int32_t slot : slots) {
      if (load[e] < C) {
        st.fate[slot] = SlotFate::Kept, st.assigned_expert[slot] = int32_t(e), ++load[e];
      } else {
        overflowed.push_back(slot);
      }
    }
  }
  std::stable_sort(overflowed.begin(), overflowed.end(), priority_before);
  for (int32_t slot : overflowed) {
    if (s_.overflow == Overflow::Drop) {
      st.fate[slot] = SlotFate::Dropped;
    } else if (s_.overflow == Overflow::Dense) {
      st.fate[slot] = SlotFate::Fallback;
    } else {  // reroute: next-best expert by p + b with room, never one the token already uses
      const int64_t n = slot / K;
      const T* p = scores + n * E;
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(),
                       [&](int32_t a, int32_t b) { return double(p[a]) + bias_[a] > double(p[b]) + bias_[b]; });
      st.fate[slot] = SlotFate::Dropped;
      for (int32_t e : order) {
        if (st.expert_masked[e] || load[e] >= C) continue;
        bool used = false;
        for (int64_t i = 0; i < K; ++i)
          used |= st.assigned_expert[n * K + i] == e || st.selected_expert[n * K + i] == e;
        if (used) continue;
        st.fate[slot] = SlotFate::Rerouted, st.assigned_expert[slot] = e, ++load[e];
        break;
      }
    }
  }
}

// Rows of each expert's contiguous block, in token order within an expert.
template <typename T>
void MoeLayer<T>::build_permutation(MoeSlot<T>& st, int64_t N) const {
  const int64_t E = s_.num_experts, K = s_.top_k;
  st.expert_offset.assign(size_t(E + 1), 0);
  for (int64_t slot = 0; slot < N * K; ++slot)
    if (st.assigned_expert[slot] >= 0) ++st.expert_offset[st.assigned_expert[slot] + 1];
  for (int64_t e = 0; e < E; ++e) st.expert_offset[e + 1] += st.expert_offset[e];
  st.perm_slot.assign(size_t(st.expert_offset[E]), -1);
  std::vector<int64_t> fill(st.expert_offset.begin(), st.expert_offset.end() - 1);
  for (int64_t slot = 0; slot < N * K; ++slot)
    if (st.assigned_expert[slot] >= 0) st.perm_slot[fill[st.assigned_expert[slot]]++] = int32_t(slot);
  st.row_of_slot.assign(size_t(N * K), -1);
  for (int64_t r = 0; r < st.expert_offset[E]; ++r) st.row_of_slot[st.perm_slot[r]] = r;
  st.fallback_token.clear();
  st.fallback_weight.clear();
  for (int64_t n = 0; n < N; ++n) {
    double w = 0;
    bool any = false;
    for (int64_t j = 0; j < K; ++j)
      if (st.fate[n * K + j] == SlotFate::Fallback) w += double(st.gate[n * K + j]), any = true;
    if (any) st.fallback_token.push_back(int32_t(n)), st.fallback_weight.push_back(T(w));
  }
}

template <typename T>
void MoeLayer<T>::router_losses(const T* logits, const T* scores, MoeSlot<T>& st, int64_t N) const {
  const int64_t E = s_.num_experts;
  std::vector<double> P(static_cast<size_t>(E), 0.0);
  double zsum = 0, hsum = 0;
  for (int64_t n = 0; n < N; ++n) {
    const T* z = logits + n * E;
    const T* p = scores + n * E;
    double m = -INFINITY, s = 0, h = 0;
    for (int64_t e = 0; e < E; ++e) m = std::max(m, double(z[e]));
    for (int64_t e = 0; e < E; ++e) s += std::exp(double(z[e]) - m);
    const double lse = m + std::log(s);
    zsum += lse * lse;
    for (int64_t e = 0; e < E; ++e) {
      P[e] += double(p[e]);
      h -= double(p[e]) * std::log(std::max(double(p[e]), kMinLogArg));
    }
    hsum += h;
  }
  double aux = 0, death = 0;
  for (int64_t e = 0; e < E; ++e) {
    P[e] /= double(N);
    aux += double(st.f[e]) * P[e];
    death += std::max(0.0, s_.death_floor - P[e]);
  }
  st.aux = s_.coef_aux * double(E) * aux;
  st.z = s_.coef_z * zsum / double(N);
  st.entropy = -s_.coef_entropy * hsum / double(N);
  st.death = s_.coef_death * death;
  st.entropy_sum = hsum;
}

template <typename T>
void MoeLayer<T>::router_backward(const FfnContext& context, const MoeSlot<T>& st, const T* x, const T* logits,
                                  const T* scores, const T* dw, T* dp, T* dz, T* dx, int64_t N) {
  const int64_t D = s_.d_model, E = s_.num_experts, K = s_.top_k;
  // Gate weights -> scores: w_j = p_{e_j} / s with s the sum of the selected scores (when renormalising).
  const bool renormalise = s_.normalize && K > 1;
  for (int64_t n = 0; n < N; ++n) {
    double g = 0;
    if (renormalise && !st.denom_clamped[n])
      for (int64_t j = 0; j < K; ++j) g += double(dw[n * K + j]) * double(st.gate[n * K + j]);
    for (int64_t j = 0; j < K; ++j) {
      const int32_t e = st.selected_expert[n * K + j];
      if (e < 0) continue;
      dp[n * E + e] += T((double(dw[n * K + j]) - g) / double(st.denom[n]));
    }
  }

  // Router losses, weighted by this group's share of the step's loss.
  const double rs = context.router_loss_scale, inv_n = 1.0 / double(N);
  std::vector<double> P(static_cast<size_t>(E), 0.0);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t e = 0; e < E; ++e) P[e] += double(scores[n * E + e]) * inv_n;
  for (int64_t n = 0; n < N; ++n) {
    const T* z = logits + n * E;
    const T* p = scores + n * E;
    double m = -INFINITY, s = 0;
    for (int64_t e = 0; e < E; ++e) m = std::max(m, double(z[e]));
    for (int64_t e = 0; e < E; ++e) s += std::exp(double(z[e]) - m);
    const double lse = m + std::log(s);
    for (int64_t e = 0; e < E; ++e) {
      double g = s_.coef_aux * double(E) * double(st.f[e]) * inv_n;
      g += s_.coef_entropy * inv_n * (std::log(std::max(double(p[e]), kMinLogArg)) + 1.0);
      if (P[e] < s_.death_floor) g -= s_.coef_death * inv_n;
      dp[n * E + e] += T(rs * g);
      dz[n * E + e] += T(rs * s_.coef_z * 2.0 * lse * std::exp(double(z[e]) - lse) * inv_n);
    }
  }

  // Scores -> logits (noise is a constant; temperature divides).
  for (int64_t n = 0; n < N; ++n) {
    const T* p = scores + n * E;
    const T* g = dp + n * E;
    if (s_.score == RouterScore::Softmax) {
      double dot = 0;
      for (int64_t e = 0; e < E; ++e) dot += double(p[e]) * g[e];
      for (int64_t e = 0; e < E; ++e) dz[n * E + e] += T(double(p[e]) * (double(g[e]) - dot) / s_.tau);
    } else {
      for (int64_t e = 0; e < E; ++e) dz[n * E + e] += T(double(g[e]) * p[e] * (1.0 - double(p[e])) / s_.tau);
    }
  }
  ops_.gemm(true, false, D, E, N, T(1), x, D, dz, E, T(1), d_router_, E);  // dWg += x^T dz
  ops_.gemm(false, true, N, D, E, T(1), dz, E, router_, E, T(1), dx, D);   // dx += dz Wg^T
}

#define MOE_ROUTER_INSTANTIATE(T)                                                                                \
  template void MoeLayer<T>::route(const FfnContext&, const T*, T*, MoeSlot<T>&, int64_t) const;                 \
  template void MoeLayer<T>::build_permutation(MoeSlot<T>&, int64_t) const;                                      \
  template void MoeLayer<T>::router_losses(const T*, const T*, MoeSlot<T>&, int64_t) const;                      \
  template void MoeLayer<T>::router_backward(const FfnContext&, const MoeSlot<T>&, const T*, const T*, const T*, \
                                             const T*, T*, T*, T*, int64_t);
MOE_ROUTER_INSTANTIATE(float)
MOE_ROUTER_INSTANTIATE(double)

}  // namespace moe
