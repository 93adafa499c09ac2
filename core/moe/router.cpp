// The MoE router: strategies, forward (scores, selection, gates, losses) and backward. See router.h.
#include "core/moe/router.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>

#include "core/error.h"

namespace moe {
namespace {
// Below this the renormalising sum of the selected scores is clamped (and treated as a constant), so
// a sigmoid router cannot drive its scores towards zero to game the losses (PITFALLS.md).
constexpr double kMinGateSum = 1e-6;
constexpr double kMinLogArg = 1e-30;
constexpr int64_t kMaxExperts = 1024;

void no_noise(const RngStream&, int64_t, int64_t, double*, int64_t) {}
void gumbel_noise(const RngStream& rng, int64_t step, int64_t first_counter, double* z, int64_t E) {
  for (int64_t e = 0; e < E; ++e) z[e] += rng.gumbel(uint64_t(step), uint64_t(first_counter + e));
}

template <typename T>
void softmax_scores(const double* z, T* p, int64_t E) {
  double m = -INFINITY, sum = 0;
  for (int64_t e = 0; e < E; ++e) m = std::max(m, z[e]);
  for (int64_t e = 0; e < E; ++e) sum += std::exp(z[e] - m);
  for (int64_t e = 0; e < E; ++e) p[e] = T(std::exp(z[e] - m) / sum);
}
template <typename T>
void sigmoid_scores(const double* z, T* p, int64_t E) {
  for (int64_t e = 0; e < E; ++e) p[e] = T(1.0 / (1.0 + std::exp(-z[e])));
}
template <typename T>
void softmax_backward(const T* p, const T* g, double tau, T* dz, int64_t E) {
  double dot = 0;
  for (int64_t e = 0; e < E; ++e) dot += double(p[e]) * g[e];
  for (int64_t e = 0; e < E; ++e) dz[e] += T(double(p[e]) * (double(g[e]) - dot) / tau);
}
template <typename T>
void sigmoid_backward(const T* p, const T* g, double tau, T* dz, int64_t E) {
  for (int64_t e = 0; e < E; ++e) dz[e] += T(double(g[e]) * p[e] * (1.0 - double(p[e])) / tau);
}

// Gate weights w_j = p[e_j], or w_j = p[e_j] / sum of the selected scores (the sum clamped below).
template <typename T>
void raw_gates(const T* p, const int32_t* selected, int64_t K, T* gate, T* denom, uint8_t* clamped) {
  *denom = T(1), *clamped = 0;
  for (int64_t i = 0; i < K; ++i)
    if (selected[i] >= 0) gate[i] = p[selected[i]] / *denom;
}
template <typename T>
void renormalised_gates(const T* p, const int32_t* selected, int64_t K, T* gate, T* denom, uint8_t* clamped) {
  double sum = 0;
  for (int64_t i = 0; i < K; ++i)
    if (selected[i] >= 0) sum += double(p[selected[i]]);
  *clamped = 0;
  if (sum < kMinGateSum) sum = kMinGateSum, *clamped = 1;
  *denom = T(sum);
  for (int64_t i = 0; i < K; ++i)
    if (selected[i] >= 0) gate[i] = p[selected[i]] / *denom;
}
template <typename T>
void raw_gates_backward(const T*, const int32_t* selected, const T* dw, T denom, bool, int64_t K, T* dp) {
  for (int64_t j = 0; j < K; ++j)
    if (selected[j] >= 0) dp[selected[j]] += T(double(dw[j]) / double(denom));
}
template <typename T>
void renormalised_gates_backward(const T* gate, const int32_t* selected, const T* dw, T denom, bool clamped, int64_t K,
                                 T* dp) {
  double g = 0;  // a clamped sum is a constant
  if (!clamped)
    for (int64_t j = 0; j < K; ++j) g += double(dw[j]) * double(gate[j]);
  for (int64_t j = 0; j < K; ++j)
    if (selected[j] >= 0) dp[selected[j]] += T((double(dw[j]) - g) / double(denom));
}
}  // namespace

template <typename T>
Router<T>::Router(Ops<T>& ops, const MoeSettings& settings) : ops_(ops), s_(settings) {
  MOE_CHECK(s_.num_experts <= kMaxExperts, s_.num_experts << " experts; at most " << kMaxExperts << " per layer");
  noise_ = s_.noise == RouterNoise::Gumbel ? gumbel_noise : no_noise;
  const bool softmax = s_.score == RouterScore::Softmax;
  score_ = softmax ? softmax_scores<T> : sigmoid_scores<T>;
  score_backward_ = softmax ? softmax_backward<T> : sigmoid_backward<T>;
  // Renormalising one selected expert would make its weight 1 and cut the router off (docs/moe.md).
  const bool renormalise = s_.normalize && s_.top_k > 1;
  gate_ = renormalise ? renormalised_gates<T> : raw_gates<T>;
  gate_backward_ = renormalise ? renormalised_gates_backward<T> : raw_gates_backward<T>;
  choices_ = s_.overflow == Overflow::Reroute ? s_.num_experts : s_.top_k;
  bias_.assign(size_t(s_.num_experts), 0.0f);
}

template <typename T>
void Router<T>::forward(const FfnContext& context, const T* x, T* logits, T* scores, Routing<T>& r, int64_t N) const {
  const int64_t D = s_.d_model, E = s_.num_experts;
  ops_.gemm(false, false, N, E, D, T(1), x, D, weight_, E, T(0), logits, E);  // z = x Wg
  // Scores p = score((z + g) / tau), g noise in training only.
  const RngStream rng(context.seed, "moe.router.gumbel.layer" + std::to_string(s_.layer));
  const NoiseFn noise = context.training ? noise_ : no_noise;
  for (int64_t n = 0; n < N; ++n) {
    double z[kMaxExperts];
    for (int64_t e = 0; e < E; ++e) z[e] = double(logits[n * E + e]);
    noise(rng, context.step, (context.first_token + n) * E, z, E);
    for (int64_t e = 0; e < E; ++e) z[e] /= s_.tau;
    score_(z, scores + n * E, E);
  }
  select(context, scores, r, N);
  losses(logits, scores, r, N);
}

// Expert dropout, then per token: top-k of p alone (for f), the preference row by p + b among the
// unmasked experts (ties to the lower index), the selected experts and their gate weights.
template <typename T>
void Router<T>::select(const FfnContext& context, const T* scores, Routing<T>& r, int64_t N) const {
  const int64_t E = s_.num_experts, K = s_.top_k, W = choices_;
  const RngStream dropout(context.seed, "moe.expert_dropout.layer" + std::to_string(s_.layer));
  r.expert_masked.assign(size_t(E), 0);
  if (context.training && s_.expert_dropout > 0)
    for (int64_t e = 0; e < E; ++e)
      r.expert_masked[e] = dropout.uniform(uint64_t(context.step), uint64_t(e)) < s_.expert_dropout;
  r.choices = W;
  r.preference.assign(size_t(N * W), -1);
  r.selected.assign(size_t(N * K), -1);
  r.selected_score.assign(size_t(N * K), T(0));
  r.gate.assign(size_t(N * K), T(0));
  r.denom.assign(size_t(N), T(1));
  r.denom_clamped.assign(size_t(N), 0);
  r.f.assign(size_t(E), T(0));
  std::vector<int32_t> order(static_cast<size_t>(E));
  for (int64_t n = 0; n < N; ++n) {
    const T* p = scores + n * E;
    // Only the first K (or W) of each order matter: partial sorts under a strict total order, which
    // select what a full stable sort would.
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + K, order.end(),
                      [&](int32_t a, int32_t b) { return p[a] > p[b] || (p[a] == p[b] && a < b); });
    for (int64_t j = 0; j < K; ++j) r.f[order[j]] += T(1);
    int64_t available = 0;
    for (int32_t e = 0; e < E; ++e)
      if (!r.expert_masked[e]) order[available++] = e;
    const int64_t take = std::min(W, available);
    std::partial_sort(order.begin(), order.begin() + take, order.begin() + available, [&](int32_t a, int32_t b) {
      const double ka = double(p[a]) + bias_[a], kb = double(p[b]) + bias_[b];
      return ka > kb || (ka == kb && a < b);
    });
    std::copy_n(order.begin(), take, r.preference.begin() + n * W);
    int32_t* sel = r.selected.data() + n * K;
    for (int64_t j = 0; j < std::min(K, take); ++j) sel[j] = order[j], r.selected_score[n * K + j] = p[order[j]];
    gate_(p, sel, K, r.gate.data() + n * K, r.denom.data() + n, r.denom_clamped.data() + n);
  }
  for (int64_t e = 0; e < E; ++e) r.f[e] /= T(double(N * K));
}

template <typename T>
void Router<T>::losses(const T* logits, const T* scores, Routing<T>& r, int64_t N) const {
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
    aux += double(r.f[e]) * P[e];
    death += std::max(0.0, s_.death_floor - P[e]);
  }
  r.aux = s_.coef_aux * double(E) * aux;
  r.z = s_.coef_z * zsum / double(N);
  r.entropy = -s_.coef_entropy * hsum / double(N);
  r.death = s_.coef_death * death;
  r.entropy_sum = hsum;
}

template <typename T>
void Router<T>::backward(const FfnContext& context, const Routing<T>& r, const T* x, const T* logits, const T* scores,
                         const T* dw, T* dp, T* dz, T* dx, int64_t N) const {
  const int64_t D = s_.d_model, E = s_.num_experts, K = s_.top_k;
  for (int64_t n = 0; n < N; ++n)  // gate weights -> scores
    gate_backward_(r.gate.data() + n * K, r.selected.data() + n * K, dw + n * K, r.denom[n], r.denom_clamped[n], K,
                   dp + n * E);
  loss_backward(context, r, logits, scores, dp, dz, N);
  for (int64_t n = 0; n < N; ++n)  // scores -> logits (noise is a constant; temperature divides)
    score_backward_(scores + n * E, dp + n * E, s_.tau, dz + n * E, E);
  ops_.gemm(true, false, D, E, N, T(1), x, D, dz, E, T(1), grad_, E);     // dWg += x^T dz
  ops_.gemm(false, true, N, D, E, T(1), dz, E, weight_, E, T(1), dx, D);  // dx += dz Wg^T
}

// The router losses' gradients into dp (through the scores) and dz (z-loss), weighted by this group's
// share of the step's loss.
template <typename T>
void Router<T>::loss_backward(const FfnContext& context, const Routing<T>& r, const T* logits, const T* scores, T* dp,
                              T* dz, int64_t N) const {
  const int64_t E = s_.num_experts;
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
      double g = s_.coef_aux * double(E) * double(r.f[e]) * inv_n;
      g += s_.coef_entropy * inv_n * (std::log(std::max(double(p[e]), kMinLogArg)) + 1.0);
      if (P[e] < s_.death_floor) g -= s_.coef_death * inv_n;
      dp[n * E + e] += T(rs * g);
      dz[n * E + e] += T(rs * s_.coef_z * 2.0 * lse * std::exp(double(z[e]) - lse) * inv_n);
    }
  }
}

template <typename T>
void Router<T>::update_bias(const std::vector<int64_t>& counts, double rate) {
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

template class Router<float>;
template class Router<double>;

}  // namespace moe
