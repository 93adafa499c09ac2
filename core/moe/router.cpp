// The MoE router: strategies, forward (scores, selection, gates, losses) and backward. See router.h.
#include "core/moe/router.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "core/backend/cpu/vector_math.h"
#include "core/error.h"

namespace moe {
namespace {
// Below this the renormalising sum of the selected scores is clamped (and treated as a constant), so
// a sigmoid router cannot drive its scores towards zero to game the losses (docs/moe.md).
constexpr double kMinGateSum = 1e-6;
constexpr double kMinLogArg = 1e-30;
constexpr int64_t kMaxExperts = 1024;

// The per-token parts of the router's losses run on the host, one token's row of E values at a time, the rows
// shared among the threads (each row's results are its own, so the same bits at any thread count) and the
// exponentials and logarithms of a row taken at once (cpu::log_sum_exp, cpu::exp_shifted, cpu::log_doubles). With 64
// experts they were scalar calls, 2048 x 320 a layer's forward and backward: as long as a third of the layer's expert
// GEMMs (docs/bench.md "The router's losses").

// log max(p, kMinLogArg) of a row p (E values), in a buffer of the calling thread that its next call overwrites.
template <typename T>
const double* row_log(const T* p, int64_t E) {
  thread_local std::vector<double> lp;
  lp.resize(size_t(E));
  for (int64_t i = 0; i < E; ++i) lp[size_t(i)] = std::max(double(p[i]), kMinLogArg);
  cpu::log_doubles(lp.data(), lp.data(), E);
  return lp.data();
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
Router<T>::Router(Backend& backend, const MoeSettings& settings)
    : backend_(backend), ops_(backend.ops<T>()), s_(settings) {
  MOE_CHECK(s_.num_experts <= kMaxExperts, s_.num_experts << " experts; at most " << kMaxExperts << " per layer");
  gumbel_ = s_.noise == RouterNoise::Gumbel;
  const bool softmax = s_.score == RouterScore::Softmax;
  score_ = softmax ? &Ops<T>::softmax_rows : &Ops<T>::sigmoid_rows;
  score_backward_ = softmax ? softmax_backward<T> : sigmoid_backward<T>;
  // Renormalising one selected expert would make its weight 1 and cut the router off (docs/moe.md).
  const bool renormalise = s_.normalize && s_.top_k > 1;
  gate_ = renormalise ? renormalised_gates<T> : raw_gates<T>;
  gate_backward_ = renormalise ? renormalised_gates_backward<T> : raw_gates_backward<T>;
  choices_ = reroutes(s_.overflow) ? s_.num_experts : s_.top_k;
  tau_ = s_.tau;
  bias_.assign(size_t(s_.num_experts), 0.0f);
}

template <typename T>
double Router<T>::tau(bool* clamped) const {
  if (clamped) *clamped = false;
  if (!s_.tau_learned) return tau_;
  MOE_CHECK(log_tau_, "a learned router temperature read before its parameter is bound");
  // The parameter is log(tau / tau_0), initialised to 0: the configured tau is where learning starts.
  const double tau = s_.tau * std::exp(double(backend_.download(log_tau_, 1)[0]));
  const double in_range = std::clamp(tau, s_.tau_min, s_.tau_max);
  if (clamped) *clamped = in_range != tau;
  return in_range;
}

template <typename T>
const double* Router<T>::draw_noise(const FfnContext& context, int64_t N) const {
  if (!context.training || !gumbel_) return nullptr;
  // Token n, expert e draws counter (first_token + n) E + e of the step: contiguous over the group.
  const int64_t E = s_.num_experts;
  backend_.reserve(noise_, DType::F64, N * E);
  const RngStream rng(context.seed, "moe.router.gumbel.layer" + std::to_string(s_.layer));
  ops_.gumbel_noise(rng.key, uint64_t(context.step), uint64_t(context.first_token * E), noise_.data<double>(), N * E);
  return noise_.data<double>();
}

template <typename T>
void Router<T>::forward(const FfnContext& context, const T* x, T* logits, T* scores, Routing<T>& r, int64_t N) const {
  this->logits(x, logits, N);
  route(context, logits, scores, r, N);
}

template <typename T>
void Router<T>::logits(const T* x, T* logits, int64_t N) const {
  const int64_t D = s_.d_model, E = s_.num_experts;
  const Fp32Gemms<T> fp32(ops_);  // the router in fp32 whatever train.precision
  ops_.gemm(false, false, N, E, D, T(1), x, D, weight_, E, T(0), logits, E);  // z = x Wg
}

template <typename T>
void Router<T>::route(const FfnContext& context, const T* logits, T* scores, Routing<T>& r, int64_t N) const {
  const int64_t E = s_.num_experts;
  // Scores p = score((z + g) / tau), g noise in training only.
  const double* noise = draw_noise(context, N);
  r.tau = tau();
  (ops_.*score_)(logits, noise, r.tau, scores, N, E);
  // The gate weights, the dispatch plan and the losses are worked out on the host from one copy of
  // the logits and scores (docs/design.md "The backend seam": what still runs on the host).
  const std::vector<T> host_logits = backend_.download(logits, N * E);
  const std::vector<T> host_scores = backend_.download(scores, N * E);
  select(context, scores, host_scores.data(), r, N);
  losses(context, host_logits.data(), host_scores.data(), r, N);
}

// Expert dropout, then per token: top-k of p alone (for f), the preference row by p + b among the
// unmasked experts (ties to the lower index), the selected experts and their gate weights.
template <typename T>
void Router<T>::select(const FfnContext& context, const T* scores, const T* host_scores, Routing<T>& r,
                       int64_t N) const {
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
  // Top-k of p alone (for f), and the preference rows by p + b among the unmasked experts.
  backend_.reserve(plain_top_, DType::I32, N * K);
  backend_.reserve(preference_, DType::I32, N * W);
  bias_on_backend_ = backend_.upload(bias_);
  mask_ = backend_.upload(r.expert_masked);
  ops_.topk_rows(scores, nullptr, nullptr, plain_top_.data<int32_t>(), N, E, K);
  ops_.topk_rows(scores, bias_on_backend_.data<float>(), mask_.data<uint8_t>(), preference_.data<int32_t>(), N, E, W);
  const std::vector<int32_t> plain = backend_.download(plain_top_.data<int32_t>(), N * K);
  backend_.copy_to_host(r.preference.data(), preference_.data<int32_t>(), N * W);
  backend_.synchronize();
  for (int64_t i = 0; i < N * K; ++i) r.f[plain[size_t(i)]] += T(1);
  for (int64_t n = 0; n < N; ++n) {
    const T* p = host_scores + n * E;
    int32_t* sel = r.selected.data() + n * K;
    for (int64_t j = 0; j < K; ++j) {
      sel[j] = r.preference[size_t(n * W + j)];
      if (sel[j] >= 0) r.selected_score[n * K + j] = p[sel[j]];
    }
    gate_(p, sel, K, r.gate.data() + n * K, r.denom.data() + n, r.denom_clamped.data() + n);
  }
  for (int64_t e = 0; e < E; ++e) r.f[e] /= T(double(N * K));
}

template <typename T>
void Router<T>::losses(const FfnContext& context, const T* logits, const T* scores, Routing<T>& r, int64_t N) const {
  const int64_t E = s_.num_experts;
  // Each token's log-sum-exp (z-loss) and score entropy, the rows among the threads; then the sums in token order.
  std::vector<double> lse(static_cast<size_t>(N)), entropy(static_cast<size_t>(N));
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    lse[size_t(n)] = cpu::log_sum_exp(logits + n * E, E);
    const T* p = scores + n * E;
    const double* lp = row_log(p, E);
    double h = 0;
    for (int64_t i = 0; i < E; ++i) h -= double(p[i]) * lp[i];
    entropy[size_t(n)] = h;
  }
  std::vector<double> P(static_cast<size_t>(E), 0.0);
  double zsum = 0, hsum = 0;
  for (int64_t n = 0; n < N; ++n) {
    const T* p = scores + n * E;
    zsum += lse[size_t(n)] * lse[size_t(n)];
    for (int64_t e = 0; e < E; ++e) P[e] += double(p[e]);
    hsum += entropy[size_t(n)];
  }
  double aux = 0, death = 0, P_sum = 0, log_P = 0;
  for (int64_t e = 0; e < E; ++e) {
    P[e] /= double(N);
    aux += double(r.f[e]) * P[e];
    death += std::max(0.0, s_.death_floor - P[e]);
    P_sum += P[e], log_P += std::log(std::max(P[e], kMinLogArg));
  }
  // KL(u || P / sum P) = sum_e (1/E) log((1/E) / (P_e / S)) = log S - log E - mean_e log P_e.
  r.warmup = 0;
  if (warming_up(context)) r.warmup = s_.coef_warmup * (std::log(P_sum) - std::log(double(E)) - log_P / double(E));
  r.aux = s_.coef_aux * double(E) * aux;
  r.z = s_.coef_z * zsum / double(N);
  r.entropy = -s_.coef_entropy * hsum / double(N);
  r.death = s_.coef_death * death;
  r.entropy_sum = hsum;
}

template <typename T>
void Router<T>::backward(const FfnContext& context, const Routing<T>& r, const T* x, const T* logits, const T* scores,
                         const T* dw, T* dp, T* dz, T* dx, int64_t N) const {
  logits_backward(context, r, logits, scores, dw, dp, dz, N);
  input_backward(x, dz, dx, N);
}

template <typename T>
void Router<T>::logits_backward(const FfnContext& context, const Routing<T>& r, const T* logits, const T* scores,
                                const T* dw, T* dp, T* dz, int64_t N, int64_t own_first, int64_t own_count) const {
  const int64_t E = s_.num_experts, K = s_.top_k;
  for (int64_t n = 0; n < N; ++n)  // gate weights -> scores
    gate_backward_(r.gate.data() + n * K, r.selected.data() + n * K, dw + n * K, r.denom[n], r.denom_clamped[n], K,
                   dp + n * E);
  loss_backward(context, r, logits, scores, dp, dz, N);
  scores_backward(context, logits, scores, dp, dz, N, own_first, own_count < 0 ? N : own_count);
}

// Scores -> logits (the noise is a constant; the temperature divides). With a learned temperature,
// z' = (z + g) / tau gives d(loss)/d(log tau) = -sum over (n, e) of d(loss)/dz * (z + g).
template <typename T>
void Router<T>::scores_backward(const FfnContext& context, const T* logits, const T* scores, const T* dp, T* dz,
                                int64_t N, int64_t own_first, int64_t own_count) const {
  const int64_t E = s_.num_experts;
  bool clamped = false;
  const double tau = this->tau(&clamped);
  if (!s_.tau_learned) {
    for (int64_t n = 0; n < N; ++n) score_backward_(scores + n * E, dp + n * E, tau, dz + n * E, E);
    return;
  }
  const double* noise = draw_noise(context, N);
  std::vector<T> row(static_cast<size_t>(E));
  double d_log_tau = 0;
  for (int64_t n = 0; n < N; ++n) {
    std::fill(row.begin(), row.end(), T(0));
    score_backward_(scores + n * E, dp + n * E, tau, row.data(), E);
    for (int64_t e = 0; e < E; ++e) {
      dz[n * E + e] += row[size_t(e)];
      if (n >= own_first && n < own_first + own_count)
        d_log_tau -= double(row[size_t(e)]) * (double(logits[n * E + e]) + (noise ? noise[n * E + e] : 0.0));
    }
  }
  if (clamped) return;
  std::vector<T> grad = backend_.download(log_tau_grad_, 1);  // a parameter's gradient accumulates
  grad[0] += T(d_log_tau);
  backend_.copy_to_device(log_tau_grad_, grad.data(), 1);
}

template <typename T>
void Router<T>::input_backward(const T* x, const T* dz, T* dx, int64_t N) const {
  const int64_t D = s_.d_model, E = s_.num_experts;
  const Fp32Gemms<T> fp32(ops_);
  ops_.gemm(true, false, D, E, N, T(1), x, D, dz, E, T(1), grad_, E);             // dWg += x^T dz
  if (dx) ops_.gemm(false, true, N, D, E, T(1), dz, E, weight_, E, T(1), dx, D);  // dx += dz Wg^T
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
  // The warm-up term's d/dP_e = coef (1 / S - 1 / (E P_e)), each token's p_e entering P_e with 1/N.
  std::vector<double> warmup(static_cast<size_t>(E), 0.0);
  const bool warming = warming_up(context);
  if (warming) {
    double S = 0;
    for (int64_t e = 0; e < E; ++e) S += P[e];
    for (int64_t e = 0; e < E; ++e)
      warmup[e] = s_.coef_warmup * inv_n * (1.0 / S - 1.0 / (double(E) * std::max(P[e], kMinLogArg)));
  }
  // Each token's row of dp and dz is its own: the rows among the threads.
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const T* z = logits + n * E;
    const T* p = scores + n * E;
    const double lse = cpu::log_sum_exp(z, E);
    const double* ez = cpu::exp_shifted(z, lse, E);  // exp(z - lse)
    const double* lp = row_log(p, E);
    for (int64_t e = 0; e < E; ++e) {
      double g = s_.coef_aux * double(E) * double(r.f[e]) * inv_n;
      g += s_.coef_entropy * inv_n * (lp[e] + 1.0);
      if (P[e] < s_.death_floor) g -= s_.coef_death * inv_n;
      if (warming) g += warmup[e];
      dp[n * E + e] += T(rs * g);
      dz[n * E + e] += T(rs * s_.coef_z * 2.0 * lse * ez[e] * inv_n);
    }
  }
}

template <typename T>
void Router<T>::update_bias(const std::vector<int64_t>& counts, const BiasBalance& balance) {
  const double rate = balance.rate;
  if (rate <= 0) return;
  MOE_CHECK(int64_t(counts.size()) == s_.num_experts, "counts of " << counts.size() << " experts");
  double mean = 0;
  for (int64_t c : counts) mean += double(c);
  mean /= double(counts.size());
  for (size_t e = 0; e < counts.size(); ++e) {
    if (balance.rule == BiasRule::Sign) {
      const double diff = mean - double(counts[e]);
      bias_[e] += float(rate * double((diff > 0) - (diff < 0)));
      continue;
    }
    // Proportional: an expert without tokens counts one, and the ratio is capped, so the step stays bounded.
    double u = std::min(mean / std::max(double(counts[e]), 1.0), BiasBalance::kMaxLoadRatio) - 1.0;
    if (std::abs(u) <= balance.dead_band) u = 0;
    bias_[e] = float(balance.decay * double(bias_[e]) + rate * u);
  }
}

template class Router<float>;
template class Router<double>;

}  // namespace moe
