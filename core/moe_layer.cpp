// The MoE layer: routing (plan), expert compute over permuted contiguous blocks, combine, router losses,
// and the mirrored backward. See moe_layer.h for what is and is not here.
#include "core/moe_layer.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "core/error.h"
#include "core/philox.h"

namespace moe {
namespace {
// Below this the renormalising sum of the selected scores is clamped (and treated as a constant), so
// a sigmoid router cannot drive its scores towards zero to game the losses (PITFALLS.md).
constexpr double kMinGateSum = 1e-6;
constexpr double kMinLogArg = 1e-30;

template <typename T>
inline void copy_row(const T* src, T* dst, int64_t D) {
  std::copy_n(src, D, dst);
}
}  // namespace

template <typename T>
struct MoeLayer<T>::ActsView {
  T *logits, *scores;        // (N, E) raw router logits z, scores p
  T *xp, *a, *b, *h, *yp;    // permuted tokens (M, D), expert hidden (M, Fe) x3, expert outputs (M, D)
  T *shared_acts, *shared_out;
  T *xf, *fallback_acts, *yf;
};

template <typename T>
MoeLayer<T>::MoeLayer(Ops<T>& ops, const MoeSettings& settings) : ops_(ops), s_(settings) {
  MOE_CHECK(s_.num_experts >= 1 && s_.top_k >= 1 && s_.top_k <= s_.num_experts,
            "experts " << s_.num_experts << ", top_k " << s_.top_k);
  bias_.assign(size_t(s_.num_experts), 0.0f);
  if (s_.shared_experts > 0)
    shared_ = std::make_unique<DenseMlp<T>>(ops, s_.d_model, s_.shared_experts * s_.expert_hidden, s_.layers_total);
  if (s_.overflow == Overflow::Dense)
    fallback_ = std::make_unique<DenseMlp<T>>(ops, s_.d_model, s_.fallback_hidden, s_.layers_total);
  reset_stats();
}

template <typename T>
void MoeLayer<T>::register_params(ParamTable& table, const std::string& prefix) {
  prefix_ = prefix;
  const int64_t D = s_.d_model, E = s_.num_experts, F = s_.expert_hidden;
  const double out_std = 0.02 / std::sqrt(2.0 * double(s_.layers_total));
  table.add({prefix + ".router.weight", {D, E}, ParamRole::Router, true, ParamInit::Normal, 0.02});
  table.add({prefix + ".experts.w1", {E, D, F}, ParamRole::Expert, true, ParamInit::Normal, 0.02});
  table.add({prefix + ".experts.w3", {E, D, F}, ParamRole::Expert, true, ParamInit::Normal, 0.02});
  table.add({prefix + ".experts.w2", {E, F, D}, ParamRole::Expert, true, ParamInit::Normal, out_std});
  if (shared_) shared_->register_params(table, prefix + ".shared");
  if (fallback_) fallback_->register_params(table, prefix + ".fallback");
}

template <typename T>
void MoeLayer<T>::bind(const ParamTable& table, T* params, T* grads) {
  auto at = [&](const char* name) { return table.find(prefix_ + name).offset; };
  router_ = params + at(".router.weight"), d_router_ = grads + at(".router.weight");
  w1_ = params + at(".experts.w1"), dw1_ = grads + at(".experts.w1");
  w3_ = params + at(".experts.w3"), dw3_ = grads + at(".experts.w3");
  w2_ = params + at(".experts.w2"), dw2_ = grads + at(".experts.w2");
  if (shared_) shared_->bind(table, params, grads);
  if (fallback_) fallback_->bind(table, params, grads);
}

template <typename T>
int64_t MoeLayer<T>::activation_size(int64_t N) const {
  const int64_t D = s_.d_model, E = s_.num_experts, K = s_.top_k, F = s_.expert_hidden;
  int64_t n = 2 * N * E + N * K * (2 * D + 3 * F);
  if (shared_) n += shared_->activation_size(N) + N * D;
  if (fallback_) n += 2 * N * D + fallback_->activation_size(N);
  return n;
}

template <typename T>
typename MoeLayer<T>::ActsView MoeLayer<T>::carve(T* acts, int64_t N) const {
  const int64_t D = s_.d_model, E = s_.num_experts, K = s_.top_k, F = s_.expert_hidden, M = N * K;
  ActsView v{};
  T* c = acts;
  v.logits = c, c += N * E;
  v.scores = c, c += N * E;
  v.xp = c, c += M * D;
  v.a = c, c += M * F;
  v.b = c, c += M * F;
  v.h = c, c += M * F;
  v.yp = c, c += M * D;
  if (shared_) v.shared_acts = c, c += shared_->activation_size(N), v.shared_out = c, c += N * D;
  if (fallback_) v.xf = c, c += N * D, v.fallback_acts = c, c += fallback_->activation_size(N), v.yf = c, c += N * D;
  return v;
}

template <typename T>
int64_t MoeLayer<T>::capacity(int64_t N) const {
  if (s_.capacity_factor <= 0) return std::numeric_limits<int64_t>::max();
  return int64_t(std::ceil(double(s_.top_k) * double(N) / double(s_.num_experts) * s_.capacity_factor));
}

template <typename T>
double MoeLayer<T>::forward_flops(int64_t N) const {
  const double n = double(N), D = double(s_.d_model), F = double(s_.expert_hidden);
  double flops = 2 * n * D * double(s_.num_experts) + 6 * n * double(s_.top_k) * D * F;
  if (shared_) flops += shared_->forward_flops(N);
  return flops;
}

template <typename T>
void MoeLayer<T>::reset_stats() {
  stats_ = RouterStepStats{};
  stats_.tokens_per_expert.assign(size_t(s_.num_experts), 0);
}

template <typename T>
void MoeLayer<T>::update_balancing_bias(const std::vector<int64_t>& counts, double rate) {
  if (rate <= 0) return;
  MOE_CHECK(int64_t(counts.size()) == s_.num_experts, "counts of " << counts.size() << " experts");
  double mean = 0;
  for (int64_t c : counts) mean += double(c);
  mean /= double(counts.size());
  for (size_t e = 0; e < counts.size(); ++e) {
    const double diff = mean - double(counts[e]);
    bias_[e] += float(rate * double((diff > 0) - (diff < 0)));
  }
}

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
    for (int64_t e = 0; e < E; ++e) expert_masked_[e] = dropout.uniform(uint64_t(context_.step), uint64_t(e)) < s_.expert_dropout;

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
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return p[a] > p[b]; });
    for (int64_t j = 0; j < K; ++j) f_[order[j]] += T(1);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](int32_t a, int32_t b) { return double(p[a]) + bias_[a] > double(p[b]) + bias_[b]; });
    int64_t j = 0;
    for (int64_t r = 0; r < E && j < K; ++r)
      if (!expert_masked_[order[r]]) sel_expert_[n * K + j++] = order[r];
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
void MoeLayer<T>::forward(const T* x, T* y, T* acts, int64_t N) {
  const int64_t D = s_.d_model, E = s_.num_experts, K = s_.top_k, F = s_.expert_hidden;
  const ActsView v = carve(acts, N);
  ops_.gemm(false, false, N, E, D, T(1), x, D, router_, E, T(0), v.logits, E);  // z = x Wg
  route(v.logits, v.scores, N);
  build_permutation(N);

  // Dispatch (local here): gather each expert's tokens into its contiguous block.
  const int64_t M = expert_offset_[E];
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < M; ++r) copy_row(x + (perm_slot_[r] / K) * D, v.xp + r * D, D);
  // Experts: one GEMM per expert over its block.
  for (int64_t e = 0; e < E; ++e) {
    const int64_t r0 = expert_offset_[e], m = expert_offset_[e + 1] - r0;
    if (m == 0) continue;
    ops_.gemm(false, false, m, F, D, T(1), v.xp + r0 * D, D, w1_ + e * D * F, F, T(0), v.a + r0 * F, F);
    ops_.gemm(false, false, m, F, D, T(1), v.xp + r0 * D, D, w3_ + e * D * F, F, T(0), v.b + r0 * F, F);
  }
  ops_.swiglu_forward(v.a, v.b, v.h, M * F);
  for (int64_t e = 0; e < E; ++e) {
    const int64_t r0 = expert_offset_[e], m = expert_offset_[e + 1] - r0;
    if (m == 0) continue;
    ops_.gemm(false, false, m, D, F, T(1), v.h + r0 * F, F, w2_ + e * F * D, D, T(0), v.yp + r0 * D, D);
  }
  // Combine: y = sum_j w_j Expert_j(x), slots in order for every token (deterministic).
  const std::vector<int64_t>& row_of_slot = row_of_slot_;
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    T* yn = y + n * D;
    std::fill_n(yn, D, T(0));
    for (int64_t j = 0; j < K; ++j) {
      const int64_t slot = n * K + j;
      if (assigned_expert_[slot] < 0) continue;
      const T w = gate_[slot];
      const T* src = v.yp + row_of_slot[slot] * D;
      for (int64_t d = 0; d < D; ++d) yn[d] += w * src[d];
    }
  }
  if (shared_) {
    shared_->forward(x, v.shared_out, v.shared_acts, N);
    ops_.add_inplace(y, v.shared_out, N * D);
  }
  if (fallback_ && !fallback_token_.empty()) {
    const int64_t Mf = int64_t(fallback_token_.size());
    for (int64_t i = 0; i < Mf; ++i) copy_row(x + int64_t(fallback_token_[i]) * D, v.xf + i * D, D);
    fallback_->forward(v.xf, v.yf, v.fallback_acts, Mf);
    for (int64_t i = 0; i < Mf; ++i) {
      T* yn = y + int64_t(fallback_token_[i]) * D;
      for (int64_t d = 0; d < D; ++d) yn[d] += fallback_weight_[i] * v.yf[i * D + d];
    }
  }

  router_losses(v.logits, v.scores, N);
  if (context_.training && !context_.recomputing) {
    stats_.groups += 1;
    stats_.tokens += N;
    for (int64_t slot = 0; slot < N * K; ++slot) {
      if (assigned_expert_[slot] >= 0) ++stats_.tokens_per_expert[assigned_expert_[slot]];
      stats_.dropped += fate_[slot] == SlotFate::Dropped;
      stats_.rerouted += fate_[slot] == SlotFate::Rerouted;
      stats_.fallback += fate_[slot] == SlotFate::Fallback;
    }
  }
}

template <typename T>
void MoeLayer<T>::backward(const T* x, const T* dy, T* dx, const T* acts, T* /*scratch*/, int64_t N) {
  const int64_t D = s_.d_model, E = s_.num_experts, K = s_.top_k, F = s_.expert_hidden;
  const ActsView v = carve(const_cast<T*>(acts), N);
  const int64_t M = expert_offset_[E];
  const int64_t Mf = int64_t(fallback_token_.size());
  // Scratch: dyp, dxp (M, D); dh, da, db (M, F); dp, dz (N, E); dw (N K); shared and fallback.
  const int64_t shared_scratch = shared_ ? shared_->scratch_size(N) : 0;
  const int64_t fb_scratch = fallback_ ? fallback_->scratch_size(std::max<int64_t>(Mf, 1)) : 0;
  const size_t need = size_t(2 * M * D + 3 * M * F + 2 * N * E + N * K + shared_scratch + N * D + fb_scratch +
                             3 * std::max<int64_t>(Mf, 1) * D);
  if (scratch_.size() < need) scratch_.resize(need);
  T* c = scratch_.data();
  T *dyp = c, *dxp = (c += M * D), *dh = (c += M * D), *da = (c += M * F), *db = (c += M * F);
  T *dp = (c += M * F), *dz = (c += N * E), *dw = (c += N * E), *sh = (c += N * K), *dsx = (c += shared_scratch);
  T *fbs = (c += N * D), *dyf = (c += fb_scratch), *dxf = (c += std::max<int64_t>(Mf, 1) * D);
  std::fill_n(dp, N * E, T(0));
  std::fill_n(dz, N * E, T(0));
  std::fill_n(dw, N * K, T(0));

  // Shared experts write dx; otherwise it starts at zero.
  if (shared_)
    shared_->backward(x, dy, dx, v.shared_acts, sh, N);
  else
    ops_.fill(dx, T(0), N * D);

  // Routed experts, mirrored: un-weight, expert backward per block, scatter back to tokens.
  const std::vector<int64_t>& row_of_slot = row_of_slot_;
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < M; ++r) {
    const int64_t slot = perm_slot_[r];
    const T* g = dy + (slot / K) * D;
    const T* out = v.yp + r * D;
    const T w = gate_[slot];
    double dot = 0;
    for (int64_t d = 0; d < D; ++d) dyp[r * D + d] = w * g[d], dot += double(g[d]) * out[d];
    dw[slot] = T(dot);
  }
  for (int64_t e = 0; e < E; ++e) {
    const int64_t r0 = expert_offset_[e], m = expert_offset_[e + 1] - r0;
    if (m == 0) continue;
    ops_.gemm(true, false, F, D, m, T(1), v.h + r0 * F, F, dyp + r0 * D, D, T(1), dw2_ + e * F * D, D);
    ops_.gemm(false, true, m, F, D, T(1), dyp + r0 * D, D, w2_ + e * F * D, D, T(0), dh + r0 * F, F);
  }
  ops_.swiglu_backward(v.a, v.b, dh, da, db, M * F);
  for (int64_t e = 0; e < E; ++e) {
    const int64_t r0 = expert_offset_[e], m = expert_offset_[e + 1] - r0;
    if (m == 0) continue;
    ops_.gemm(true, false, D, F, m, T(1), v.xp + r0 * D, D, da + r0 * F, F, T(1), dw1_ + e * D * F, F);
    ops_.gemm(true, false, D, F, m, T(1), v.xp + r0 * D, D, db + r0 * F, F, T(1), dw3_ + e * D * F, F);
    ops_.gemm(false, true, m, D, F, T(1), da + r0 * F, F, w1_ + e * D * F, F, T(0), dxp + r0 * D, D);
    ops_.gemm(false, true, m, D, F, T(1), db + r0 * F, F, w3_ + e * D * F, F, T(1), dxp + r0 * D, D);
  }
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n)
    for (int64_t j = 0; j < K; ++j) {
      const int64_t slot = n * K + j;
      if (assigned_expert_[slot] < 0) continue;
      const T* src = dxp + row_of_slot[slot] * D;
      for (int64_t d = 0; d < D; ++d) dx[n * D + d] += src[d];
    }

  // Dense fallback of overflowed assignments.
  if (fallback_ && Mf > 0) {
    for (int64_t i = 0; i < Mf; ++i) {
      const int64_t n = fallback_token_[i];
      double dot = 0;
      for (int64_t d = 0; d < D; ++d) dyf[i * D + d] = fallback_weight_[i] * dy[n * D + d], dot += double(dy[n * D + d]) * v.yf[i * D + d];
      for (int64_t j = 0; j < K; ++j)
        if (fate_[n * K + j] == SlotFate::Fallback) dw[n * K + j] += T(dot);
    }
    fallback_->backward(v.xf, dyf, dxf, v.fallback_acts, fbs, Mf);
    for (int64_t i = 0; i < Mf; ++i)
      for (int64_t d = 0; d < D; ++d) dx[int64_t(fallback_token_[i]) * D + d] += dxf[i * D + d];
  }

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
    for (int64_t e = 0; e < E; ++e) P[e] += double(v.scores[n * E + e]) * inv_n;
  for (int64_t n = 0; n < N; ++n) {
    const T* z = v.logits + n * E;
    const T* p = v.scores + n * E;
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
    const T* p = v.scores + n * E;
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
  (void)dsx;
}

template class MoeLayer<float>;
template class MoeLayer<double>;

}  // namespace moe
