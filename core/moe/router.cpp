// The MoE router: strategies, forward (scores, selection, gates, losses) and backward. See router.h.
#include "core/moe/router.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "core/error.h"
#include "core/linear.h"
#include "core/moe/gate_weights.h"

namespace moe {
namespace {
constexpr double kMinLogArg = kRouterMinLogArg;
constexpr int64_t kMaxExperts = 1024;
}  // namespace

template <typename T>
Router<T>::Router(Backend& backend, const MoeSettings& settings)
    : backend_(backend), ops_(backend.ops<T>()), s_(settings) {
  MOE_CHECK(s_.num_experts <= kMaxExperts, s_.num_experts << " experts; at most " << kMaxExperts << " per layer");
  gumbel_ = s_.noise == RouterNoise::Gumbel;
  const bool softmax = s_.score == RouterScore::Softmax;
  score_ = softmax ? &Ops<T>::softmax_rows : &Ops<T>::sigmoid_rows;
  sigmoid_ = !softmax;
  // Renormalising one selected expert would make its weight 1 and cut the router off (docs/moe.md).
  renormalise_ = s_.normalize && s_.top_k > 1;
  choices_ = reroutes(s_.overflow) ? s_.num_experts : s_.top_k;
  tau_ = s_.tau;
  bias_.assign(size_t(s_.num_experts), 0.0f);
}

template <typename T>
sizes::RouterBuffers Router<T>::buffers(int64_t N) const {
  return sizes::router_buffers(double(N), double(s_.num_experts), double(s_.top_k), double(choices_), gumbel_,
                               s_.tau_learned);
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
  backend_.reserve(noise_, DType::F64, sizes::elements(buffers(N).noise));
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
  Linear<T>(ops_, GemmPrecision::Fp32).forward(x, weight_, logits, N, D, E);  // z = x Wg, fp32 whatever train.precision
}

template <typename T>
void Router<T>::route(const FfnContext& context, const T* logits, T* scores, Routing<T>& r, int64_t N) const {
  // What the host plans with (the preference rows, selected scores, gate weights) read back after one wait
  // (docs/gpu.md "Host synchronisations").
  route_on_backend(context, logits, scores, r, N);
  read_back(r, N, true);
  backend_.synchronize();
  finish(context, r, N);
}

template <typename T>
void Router<T>::route_on_backend(const FfnContext& context, const T* logits, T* scores, Routing<T>& r,
                                 int64_t N) const {
  const int64_t E = s_.num_experts;
  // Scores p = score((z + g) / tau), g noise in training only; then the selection, its gate weights and the
  // losses' sums as ops.
  const double* noise = draw_noise(context, N);
  r.tau = tau();
  r.tokens = N;
  (ops_.*score_)(logits, noise, r.tau, scores, N, E);
  select(context, scores, r, N);
  backend_.reserve(loss_sums_, DType::F64, sizes::elements(buffers(N).loss_sums));
  ops_.router_loss_sums(logits, scores, loss_sums_.data<double>(), N, E);
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
  const sizes::RouterBuffers size = buffers(N);
  backend_.reserve(plain_top_, DType::I32, sizes::elements(size.plain_top));
  backend_.reserve(preference_, DType::I32, sizes::elements(size.preference));
  backend_.reserve(selected_score_, dtype_of<T>(), sizes::elements(size.selected_score));
  backend_.reserve(r.selected_on_backend, DType::I32, sizes::elements(size.selected));
  backend_.reserve(r.gate_on_backend, dtype_of<T>(), sizes::elements(size.gate));
  backend_.reserve(r.denom_on_backend, dtype_of<T>(), sizes::elements(size.denom));
  backend_.reserve(r.clamped_on_backend, DType::U8, sizes::elements(size.clamped));
  backend_.reserve(r.f_on_backend, dtype_of<T>(), sizes::elements(size.f));
  backend_.reserve(bias_on_backend_, DType::F32, sizes::elements(size.bias));
  backend_.reserve(mask_, DType::U8, sizes::elements(size.mask));
  backend_.copy_to_device(bias_on_backend_.data<float>(), bias_.data(), E);
  backend_.copy_to_device(mask_.data<uint8_t>(), r.expert_masked.data(), E);
  ops_.topk_rows(scores, nullptr, nullptr, plain_top_.data<int32_t>(), N, E, K);
  ops_.topk_rows(scores, bias_on_backend_.data<float>(), mask_.data<uint8_t>(), preference_.data<int32_t>(), N, E, W);
  ops_.expert_fractions(plain_top_.data<int32_t>(), r.f_on_backend.template data<T>(), N, K, E);
  ops_.gate_weights(scores, preference_.data<int32_t>(), W, renormalise_,
                    r.selected_on_backend.template data<int32_t>(), selected_score_.data<T>(),
                    r.gate_on_backend.template data<T>(), r.denom_on_backend.template data<T>(),
                    r.clamped_on_backend.template data<uint8_t>(), N, E, K);
}

template <typename T>
void Router<T>::read_back(Routing<T>& r, int64_t N, bool host_plan) const {
  const int64_t E = s_.num_experts, K = s_.top_k, W = choices_;
  r.preference.resize(host_plan ? size_t(N * W) : 0);
  r.selected.resize(host_plan ? size_t(N * K) : 0);
  r.selected_score.resize(host_plan ? size_t(N * K) : 0);
  r.gate.resize(host_plan ? size_t(N * K) : 0);
  r.f.resize(size_t(E));
  host_sums_.resize(size_t(E + 2));
  if (host_plan) {
    backend_.copy_to_host(r.preference.data(), preference_.data<int32_t>(), N * W);
    backend_.copy_to_host(r.selected.data(), r.selected_on_backend.template data<int32_t>(), N * K);
    backend_.copy_to_host(r.selected_score.data(), selected_score_.data<T>(), N * K);
    backend_.copy_to_host(r.gate.data(), r.gate_on_backend.template data<T>(), N * K);
  }
  backend_.copy_to_host(r.f.data(), r.f_on_backend.template data<T>(), E);
  backend_.copy_to_host(host_sums_.data(), loss_sums_.data<double>(), E + 2);
}

// The losses' values from the sums of router_loss_sums: P_e the column means, then each term (MODEL.md).
template <typename T>
void Router<T>::losses(const FfnContext& context, Routing<T>& r, int64_t N) const {
  const int64_t E = s_.num_experts;
  const double zsum = host_sums_[size_t(E)], hsum = host_sums_[size_t(E + 1)];
  double aux = 0, death = 0, P_sum = 0, log_P = 0;
  for (int64_t e = 0; e < E; ++e) {
    const double P = host_sums_[size_t(e)] / double(N);
    aux += double(r.f[e]) * P;
    death += std::max(0.0, s_.death_floor - P);
    P_sum += P, log_P += std::log(std::max(P, kMinLogArg));
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
  // The forward's selection and gate weights stay in the backend's memory (the routing's buffers).
  ops_.gate_backward(r.gate_on_backend.template data<T>(), r.selected_on_backend.template data<int32_t>(), dw,
                     r.denom_on_backend.template data<T>(), r.clamped_on_backend.template data<uint8_t>(), renormalise_,
                     dp, N, K, E);  // gate weights -> scores
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
    ops_.score_backward(scores, dp, tau, sigmoid_, nullptr, nullptr, 0, 0, nullptr, dz, N, E);
    return;
  }
  const double* noise = draw_noise(context, N);
  backend_.reserve(d_log_tau_, DType::F64, sizes::elements(buffers(N).d_log_tau));
  ops_.score_backward(scores, dp, tau, sigmoid_, logits, noise, own_first, own_count, d_log_tau_.data<double>(), dz, N,
                      E);
  if (clamped) return;
  const double d_log_tau = backend_.download(d_log_tau_.data<double>(), 1)[0];
  std::vector<T> grad = backend_.download(log_tau_grad_, 1);  // a parameter's gradient accumulates
  grad[0] += T(d_log_tau);
  backend_.copy_to_device(log_tau_grad_, grad.data(), 1);
}

template <typename T>
void Router<T>::input_backward(const T* x, const T* dz, T* dx, int64_t N) const {
  const int64_t D = s_.d_model, E = s_.num_experts;
  const Linear<T> linear(ops_, GemmPrecision::Fp32);              // fp32 whatever train.precision
  linear.weight_backward(x, dz, grad_, N, D, E);                  // dWg += x^T dz
  if (dx) linear.input_backward(dz, weight_, dx, N, D, E, T(1));  // dx += dz Wg^T
}

// The router losses' gradients into dp (through the scores) and dz (z-loss), weighted by this group's
// share of the step's loss.
template <typename T>
void Router<T>::loss_backward(const FfnContext& context, const Routing<T>& r, const T* logits, const T* scores, T* dp,
                              T* dz, int64_t N) const {
  const typename Ops<T>::RouterLossGrad c{
      context.router_loss_scale, s_.coef_aux, s_.coef_z, s_.coef_entropy, s_.coef_death, s_.death_floor, s_.coef_warmup,
      warming_up(context)};
  ops_.router_loss_backward(logits, scores, r.f_on_backend.template data<T>(), c, dp, dz, N, s_.num_experts);
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
