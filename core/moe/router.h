// The MoE router of docs/model.md steps 1-5 and its losses: logits z = x Wg, noise and temperature,
// scores, expert dropout, selection by scores plus balancing bias, gate weights, the four router
// losses, and the backward of all of it into Wg and x. The strategies (noise, score function, gate
// normalisation) are chosen at construction; forward calls them. The balancing bias lives here: it
// selects, it never weights. Not here: capacity and overflow (dispatch_plan.h).
#pragma once

#include <cstdint>
#include <vector>

#include "core/backend/backend.h"
#include "core/ffn.h"
#include "core/moe/settings.h"
#include "core/philox.h"
#include "core/sizes.h"

namespace moe {

// What the router decided for one routing group of N tokens, kept for the backward.
template <typename T>
struct Routing {
  int64_t tokens = 0;   // N, the routing group's tokens
  int64_t choices = 0;  // width of a preference row
  // The host's copies below are read back by Router::route (the host's form, for tests and tools); the MoE layer
  // routes on the backend (Router::route_on_backend) and reads only f, the others staying empty (selected_on_host
  // reads the selection on demand).
  std::vector<int32_t> preference;     // (N, choices): usable experts by p + b, best first, -1 after the last
  std::vector<int32_t> selected;       // (N, K): the first K of each row
  std::vector<T> selected_score;       // (N, K): p of each selected expert
  std::vector<T> gate;                 // (N, K): gate weight of each selected expert
  std::vector<uint8_t> expert_masked;  // (E): expert dropout of this step
  std::vector<T> f;                    // (E): top-k selection fractions of p alone (no gradient)
  // Where the backward reads them, in the backend's memory: selected, gate and f as above; the renormalisation
  // sums (N, 1 when not renormalising) and whether each was clamped (N).
  Buffer selected_on_backend, gate_on_backend, f_on_backend, denom_on_backend, clamped_on_backend;
  // Router losses, coefficients applied (warmup: the warm-up term, 0 after the warm-up steps); the entropy sum
  // over tokens and the temperature in force, for the metrics.
  double aux = 0, z = 0, entropy = 0, death = 0, warmup = 0, entropy_sum = 0, tau = 1;
  double loss() const { return aux + z + entropy + death + warmup; }
};

// The selection (N, K) on the host: the routing's copy, or read from the backend where the backend planned.
template <typename T>
std::vector<int32_t> selected_on_host(Backend& backend, const Routing<T>& r, int64_t top_k) {
  if (!r.selected.empty() || r.tokens == 0) return r.selected;
  return backend.download(r.selected_on_backend.template data<int32_t>(), r.tokens * top_k);
}

template <typename T>
class Router {
 public:
  Router(Backend& backend, const MoeSettings& settings);
  void bind(const T* weight, T* grad) { weight_ = weight, grad_ = grad; }
  // The learned temperature's parameter log(tau / settings.tau) (one value) and its gradient (tau_learned).
  void bind_log_tau(const T* log_tau, T* grad) { log_tau_ = log_tau, log_tau_grad_ = grad; }
  // The temperature of a scheduled run (docs/moe.md "Temperature"), set by the trainer before each step.
  void set_tau(double tau) { tau_ = tau; }
  // The temperature in force: the learned one clamped to [tau_min, tau_max], or the set one; whether the
  // clamp holds (then log_tau has no gradient).
  double tau(bool* clamped = nullptr) const;

  // x: (N, D); logits: (N, E) written with z = x Wg; scores: (N, E) written with p; routing written.
  // The same as logits() then route().
  void forward(const FfnContext& context, const T* x, T* logits, T* scores, Routing<T>& routing, int64_t N) const;
  // The two halves of forward, for a routing group whose tokens are split over ranks: each computes its
  // tokens' logits, the logits are gathered, and each routes the whole group.
  void logits(const T* x, T* logits, int64_t N) const;
  void route(const FfnContext& context, const T* logits, T* scores, Routing<T>& routing, int64_t N) const;
  // route() without its wait, for a caller that plans on the backend and waits once for its own read-back too:
  // route_on_backend enqueues the ops, read_back the copies to the host (the preference rows, selection, selected
  // scores and gate weights only with host_plan; f and the losses' sums always), and after the caller's wait
  // finish works out the losses' values.
  void route_on_backend(const FfnContext& context, const T* logits, T* scores, Routing<T>& routing, int64_t N) const;
  void read_back(Routing<T>& routing, int64_t N, bool host_plan) const;
  void finish(const FfnContext& context, Routing<T>& routing, int64_t N) const { losses(context, routing, N); }
  // dw: (N, K) gradients of the gate weights; dp, dz: (N, E) zeroed scratch. Accumulates dWg and adds
  // the router's share to dx: (N, D). The same as logits_backward() then input_backward().
  void backward(const FfnContext& context, const Routing<T>& routing, const T* x, const T* logits, const T* scores,
                const T* dw, T* dp, T* dz, T* dx, int64_t N) const;
  // dz (N, E) = the gradient of the logits from the gate weights' (dw) and the router losses'. A learned
  // temperature's gradient accumulates from rows [own_first, own_first + own_count) only (own_count < 0: all
  // N): a rank whose routing group is split computes its own tokens' share, summed over the group's ranks.
  void logits_backward(const FfnContext& context, const Routing<T>& routing, const T* logits, const T* scores,
                       const T* dw, T* dp, T* dz, int64_t N, int64_t own_first = 0, int64_t own_count = -1) const;
  // From the logits' gradient dz (N, E) of the tokens x (N, D): dWg accumulates, dx (N, D) += dz Wg^T
  // (dx nullptr: the weight's gradient only).
  void input_backward(const T* x, const T* dz, T* dx, int64_t N) const;

  std::vector<float>& bias() { return bias_; }
  // The selected experts' scores (N, K) of the last forward, in backend memory (capacity's priority).
  const T* selected_scores() const { return selected_score_.data<T>(); }
  // The preference rows (N, routing.choices) of the last forward, in backend memory (reroute walks down them).
  const int32_t* preference_rows() const { return preference_.data<int32_t>(); }
  // After an optimizer step, from the step's counts: the rule of `balance` (core/moe/settings.h, docs/moe.md).
  void update_bias(const std::vector<int64_t>& counts, const BiasBalance& balance);

  // Strategy: the scores op (softmax or sigmoid rows).
  using ScoreOp = void (Ops<T>::*)(const T* z, const double* noise, double tau, T* p, int64_t N, int64_t E);

 private:
  // Expert dropout, the preference rows, the selection and its gate weights, as backend ops (scores: (N, E)).
  void select(const FfnContext& context, const T* scores, Routing<T>& r, int64_t N) const;
  // The losses' values from the sums (E + 2) of router_loss_sums and f, read back.
  void losses(const FfnContext& context, Routing<T>& r, int64_t N) const;
  bool warming_up(const FfnContext& context) const {
    return context.training && s_.coef_warmup > 0 && context.step < s_.warmup_steps;
  }
  // The sizes of the backend buffers for N tokens, the slot's routing's included.
  sizes::RouterBuffers buffers(int64_t N) const;
  // The Gumbel noise of this step and group in noise_ (training with noise), else nullptr: drawn again by
  // the backward of a learned temperature, which needs z + g.
  const double* draw_noise(const FfnContext& context, int64_t N) const;
  // Scores -> logits for every row, and with a learned temperature d(loss)/d(log tau) into its gradient.
  void scores_backward(const FfnContext& context, const T* logits, const T* scores, const T* dp, T* dz, int64_t N,
                       int64_t own_first, int64_t own_count) const;
  void loss_backward(const FfnContext& context, const Routing<T>& r, const T* logits, const T* scores, T* dp, T* dz,
                     int64_t N) const;

  Backend& backend_;
  Ops<T>& ops_;
  MoeSettings s_;
  bool gumbel_;  // noise in training
  ScoreOp score_;
  bool sigmoid_;      // sigmoid scores (else softmax)
  bool renormalise_;  // gate weights renormalised over the selected experts
  int64_t choices_;   // K, or E when overflow reroutes down the preference row
  double tau_;        // the configured or scheduled temperature (not learned)
  const T* log_tau_ = nullptr;
  T* log_tau_grad_ = nullptr;
  std::vector<float> bias_;  // on the host: updated from the step's counts, saved in checkpoints
  const T* weight_ = nullptr;
  // Backend workspace of one forward: noise (N, E), the balancing bias and the dropout mask (E), the
  // top-k of p alone (N, K), the preference rows (N, W), the selected scores (N, K) and the losses' sums (E + 2);
  // of one backward: the learned temperature's gradient (1 double). Sized by buffers (core/sizes.h).
  mutable Buffer noise_, bias_on_backend_, mask_, plain_top_, preference_, selected_score_, loss_sums_, d_log_tau_;
  mutable std::vector<double> host_sums_;
  T* grad_ = nullptr;
};

}  // namespace moe
