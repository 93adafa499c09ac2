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
void MoeLayer<T>::route(const T* logits, T* scores, int64_t N) {
  const int64_t E = s_.num_experts, K = s_.top_k;
  const bool training = context_.training;
  const RngStream gumbel(context_.seed, "moe.router.gumbel.layer" + std::to_string(s_.layer));
  const RngStream dropout(context_.seed, "moe.expert_dropout.layer" + std::to_string(s_.layer));

  // Scores p = softmax((z + g) / tau) or sigmoid(...), g Gumbel noise in training.
  for (int64_t n = 0; n < N; ++n) {
    double zt[1024];
    MOE_CHECK(E <= 1024, "at most 1024 experts per layer");
    for (int64_t e = 0; e < E; ++e) {
      double z = double(logits[n * E + e]);
      if (training && s_.noise == RouterNoise::Gumbel)
        z += gumbel.gumbel(uint64_t(context_.step), uint64_t((context_.first_token + n) * E + e));
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
  expert_masked_.assign(size_t(E), 0);
  if (training && s_.expert_dropout > 0)
    for (int64_t e = 0; e < E; ++e)
      expert_masked_[e] = dropout.uniform(uint64_t(context_.step), uint64_t(e)) < s_.expert_dropout;

  // Top-k of p + b among unmasked experts (ties to the lower index); f_e from top-k of p alone.
  sel_expert_.assign(size_t(N * K), -1);
  gate_.assign(size_t(N * K), T(0));
  denom_.assign(size_t(N), T(1));
  denom_clamped_.assign(size_t(N), 0);
  f_.assign(size_t(E), T(0));
  std::vector<int32_t> order(static_cast<size_t>(E));
  const bool renormalise = s_.normalize && K > 1;
  for (int64_t n = 0; n < N; ++n) {
    const T* p = scores + n * E;
    // Only the first K of each order matter: partial sorts, ties to the lower expert index (the same
    // selection a stable full sort gives).
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + K, order.end(),
                      [&](int32_t a, int32_t b) { return p[a] > p[b] || (p[a] == p[b] && a < b); });
    for (int64_t j = 0; j < K; ++j) f_[order[j]] += T(1);
    int64_t available = 0;
    for (int32_t e = 0; e < E; ++e)
      if (!expert_masked_[e]) order[available++] = e;
    const int64_t take = std::min(K, available);
    std::partial_sort(order.begin(), order.begin() + take, order.begin() + available, [&](int32_t a, int32_t b) {
      const double ka = double(p[a]) + bias_[a], kb = double(p[b]) + bias_[b];
      return ka > kb || (ka == kb && a < b);
    });
    for (int64_t j = 0; j < take; ++j) sel_expert_[n * K + j] = order[j];
    double sum = 0;
    for (int64_t i = 0; i < K; ++i)
      if (sel_expert_[n * K + i] >= 0) sum += double(p[sel_expert_[n * K + i]]);
    if (renormalise) {
      if (sum < kMinGateSum) sum = kMinGateSum, denom_clamped_[n] = 1;
      denom_[n] = T(sum);
    }
    for (int64_t i = 0; i < K; ++i)
      if (sel_expert_[n * K + i] >= 0) gate_[n * K + i] = p[sel_expert_[n * K + i]] / denom_[n];
  }
  for (int64_t e = 0; e < E; ++e) f_[e] /= T(double(N * K));

  // Capacity: each expert keeps its C highest-priority assignments; the rest overflow.
  const int64_t C = capacity(N);
  fate_.assign(size_t(N * K), SlotFate::None);
  assigned_expert_.assign(size_t(N * K), -1);
  auto priority_before = [&](int32_t a, int32_t b) {  // slots a, b
    if (s_.drop_policy == DropPolicy::Probs) {
      const T pa = scores[(a / K) * E + sel_expert_[a]], pb = scores[(b / K) * E + sel_expert_[b]];
      if (pa != pb) return pa > pb;
    }
    return a < b;  // position: token order
  };
  std::vector<std::vector<int32_t>> by_expert(static_cast<size_t>(E));
  for (int64_t slot = 0; slot < N * K; ++slot)
    if (sel_expert_[slot] >= 0) by_expert[sel_expert_[slot]].push_back(int32_t(slot));
  std::vector<int64_t> load(static_cast<size_t>(E), 0);
  std::vector<int32_t> overflowed;
  for (int64_t e = 0; e < E; ++e) {
    auto& slots = by_expert[e];
    std::stable_sort(slots.begin(), slots.end(), priority_before);
    for (int32_t slot : slots) {
      if (load[e] < C) {
        fate_[slot] = SlotFate::Kept, assigned_expert_[slot] = int32_t(e), ++load[e];
      } else {
        overflowed.push_back(slot);
      }
    }
  }
  std::stable_sort(overflowed.begin(), overflowed.end(), priority_before);
  for (int32_t slot : overflowed) {
    if (s_.overflow == Overflow::Drop) {
      fate_[slot] = SlotFate::Dropped;
    } else if (s_.overflow == Overflow::Dense) {
      fate_[slot] = SlotFate::Fallback;
    } else {  // reroute: next-best expert by p + b with room, never one the token already uses
      const int64_t n = slot / K;
      const T* p = scores + n * E;
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(),
                       [&](int32_t a, int32_t b) { return double(p[a]) + bias_[a] > double(p[b]) + bias_[b]; });
      fate_[slot] = SlotFate::Dropped;
      for (int32_t e : order) {
        if (expert_masked_[e] || load[e] >= C) continue;
        bool used = false;
        for (int64_t i = 0; i < K; ++i) used |= assigned_expert_[n * K + i] == e || sel_expert_[n * K + i] == e;
        if (used) continue;
        fate_[slot] = SlotFate::Rerouted, assigned_expert_[slot] = e, ++load[e];
        break;
      }
    }
  }
}

// Rows of each expert's contiguous block, in token order within an expert.
template <typename T>
void MoeLayer<T>::build_permutation(int64_t N) {
  const int64_t E = s_.num_experts, K = s_.top_k;
  expert_offset_.assign(size_t(E + 1), 0);
  for (int64_t slot = 0; slot < N * K; ++slot)
    if (assigned_expert_[slot] >= 0) ++expert_offset_[assigned_expert_[slot] + 1];
  for (int64_t e = 0; e < E; ++e) expert_offset_[e + 1] += expert_offset_[e];
  perm_slot_.assign(size_t(expert_offset_[E]), -1);
  std::vector<int64_t> fill(expert_offset_.begin(), expert_offset_.end() - 1);
  for (int64_t slot = 0; slot < N * K; ++slot)
    if (assigned_expert_[slot] >= 0) perm_slot_[fill[assigned_expert_[slot]]++] = int32_t(slot);
  row_of_slot_.assign(size_t(N * K), -1);
  for (int64_t r = 0; r < expert_offset_[E]; ++r) row_of_slot_[perm_slot_[r]] = r;
  fallback_token_.clear();
  fallback_weight_.clear();
  for (int64_t n = 0; n < N; ++n) {
    double w = 0;
    bool any = false;
    for (int64_t j = 0; j < K; ++j)
      if (fate_[n * K + j] == SlotFate::Fallback) w += double(gate_[n * K + j]), any = true;
    if (any) fallback_token_.push_back(int32_t(n)), fallback_weight_.push_back(T(w));
  }
}

template <typename T>
void MoeLayer<T>::router_losses(const T* logits, const T* scores, int64_t N) {
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
    aux += double(f_[e]) * P[e];
    death += std::max(0.0, s_.death_floor - P[e]);
  }
  last_aux_ = s_.coef_aux * double(E) * aux;
  last_z_ = s_.coef_z * zsum / double(N);
  last_entropy_ = -s_.coef_entropy * hsum / double(N);
  last_death_ = s_.coef_death * death;
  if (context_.training && !context_.recomputing) {
    stats_.aux += last_aux_, stats_.z += last_z_, stats_.entropy_loss += last_entropy_, stats_.death += last_death_;
    stats_.entropy_sum += hsum;
  }
}

template <typename T>
void MoeLayer<T>::router_backward(const T* x, const T* logits, const T* scores, const T* dw, T* dp, T* dz, T* dx,
                                  int64_t N) {
  const int64_t D = s_.d_model, E = s_.num_experts, K = s_.top_k;
  // Gate weights -> scores: w_j = p_{e_j} / s with s the sum of the selected scores (when renormalising).
  const bool renormalise = s_.normalize && K > 1;
  for (int64_t n = 0; n < N; ++n) {
    double g = 0;
    if (renormalise && !denom_clamped_[n])
      for (int64_t j = 0; j < K; ++j) g += double(dw[n * K + j]) * double(gate_[n * K + j]);
    for (int64_t j = 0; j < K; ++j) {
      const int32_t e = sel_expert_[n * K + j];
      if (e < 0) continue;
      dp[n * E + e] += T((double(dw[n * K + j]) - g) / double(denom_[n]));
    }
  }

  // Router losses, weighted by this group's share of the step's loss.
  const double rs = context_.router_loss_scale, inv_n = 1.0 / double(N);
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
      double g = s_.coef_aux * double(E) * double(f_[e]) * inv_n;
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

template void MoeLayer<float>::route(const float*, float*, int64_t);
template void MoeLayer<double>::route(const double*, double*, int64_t);
template void MoeLayer<float>::build_permutation(int64_t);
template void MoeLayer<double>::build_permutation(int64_t);
template void MoeLayer<float>::router_losses(const float*, const float*, int64_t);
template void MoeLayer<double>::router_losses(const double*, const double*, int64_t);
template void MoeLayer<float>::router_backward(const float*, const float*, const float*, const float*, float*, float*,
                                               float*, int64_t);
template void MoeLayer<double>::router_backward(const double*, const double*, const double*, const double*, double*,
                                                double*, double*, int64_t);

}  // namespace moe
