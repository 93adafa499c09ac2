// The MoE layer of MODEL.md ("MoE layer"), in the FFN slot: router (fp32 logits, Gumbel noise and
// temperature in training, softmax or sigmoid scores, top-k on scores plus balancing bias, gate weights
// optionally renormalised), capacity per routing group with the drop policies and the three overflow
// policies, routed SwiGLU experts computed as one GEMM per expert over its contiguous block of
// permuted tokens, shared experts, the four router losses and their gradients, expert dropout, and the
// balancing-bias update. Routing statistics are counted once per real training forward, never on a
// recompute. Not here: distributing experts over ranks (parallel/), clipping (optim/).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/expert_exchange.h"
#include "core/ffn.h"

namespace moe {

enum class RouterScore { Softmax, Sigmoid };
enum class RouterNoise { None, Gumbel };
enum class DropPolicy { Probs, Position };
enum class Overflow { Drop, Reroute, Dense };

struct MoeSettings {
  int64_t d_model = 0;
  int64_t num_experts = 0;    // E
  int64_t top_k = 1;          // K
  int64_t expert_hidden = 0;  // width of each routed and shared expert
  int64_t shared_experts = 0;
  int64_t fallback_hidden = 0;  // width of the dense fallback (Overflow::Dense)
  int64_t layers_total = 1;     // L, for the 1/sqrt(2L) scaling of output projections
  int64_t layer = 0;            // this layer's index (addresses its random streams)
  double tau = 1.0;
  RouterNoise noise = RouterNoise::None;
  RouterScore score = RouterScore::Softmax;
  bool normalize = true;         // renormalise the gate weights of the selected experts (when top_k > 1)
  double capacity_factor = 0.0;  // <= 0: no limit
  DropPolicy drop_policy = DropPolicy::Probs;
  Overflow overflow = Overflow::Drop;
  double expert_dropout = 0.0;
  double coef_aux = 0, coef_z = 0, coef_entropy = 0, coef_death = 0, death_floor = 0.01;
  // Expert parallelism: this rank holds experts [ep_rank * E / ep_size, (ep_rank + 1) * E / ep_size).
  int64_t ep_size = 1, ep_rank = 0;
};

// Fate of one (token, slot) assignment after capacity.
enum class SlotFate : int8_t { None, Kept, Rerouted, Fallback, Dropped };

template <typename T>
class MoeLayer final : public FeedForward<T> {
 public:
  MoeLayer(Ops<T>& ops, const MoeSettings& settings);

  void register_params(ParamTable& table, const std::string& prefix) override;
  void bind(const ParamTable& table, T* params, T* grads) override;
  int64_t activation_size(int64_t N) const override;
  int64_t scratch_size(int64_t N) const override { return 0; }  // kept inside the layer
  void forward(const T* x, T* y, T* acts, int64_t N) override;
  void backward(const T* x, const T* dy, T* dx, const T* acts, T* scratch, int64_t N) override;
  double forward_flops(int64_t N) const override;

  void set_context(const FfnContext& context) override { context_ = context; }
  // The all-to-all over the expert-parallel group (required when ep_size > 1; float only).
  void set_exchange(ExpertExchange* exchange) { exchange_ = exchange; }
  int64_t local_experts() const { return s_.num_experts / s_.ep_size; }
  RouterStepStats* router_stats() override { return &stats_; }
  double last_router_loss() const override { return last_aux_ + last_z_ + last_entropy_ + last_death_; }

  // Starts a new step's statistics.
  void reset_stats();
  // After an optimizer step: b_e += rate * sign(mean_c - c_e) from the step's counts (MODEL.md).
  // counts: tokens_per_expert summed over the step (and, with data parallelism, over all replicas).
  void update_balancing_bias(const std::vector<int64_t>& counts, double rate);
  std::vector<float>& balancing_bias() { return bias_; }

  // The routing of the last forward, for tests: expert of slot (n, j) before capacity, its gate
  // weight, its fate, and the expert that finally computed it (-1 if none).
  const std::vector<int32_t>& selected_expert() const { return sel_expert_; }
  const std::vector<int32_t>& assigned_expert() const { return assigned_expert_; }
  const std::vector<SlotFate>& slot_fate() const { return fate_; }
  const std::vector<T>& gate_weight() const { return gate_; }
  int64_t capacity(int64_t N) const;
  const MoeSettings& settings() const { return s_; }
  std::string param_prefix() const { return prefix_; }

 private:
  struct ActsView;  // carving of the activation buffer
  ActsView carve(T* acts, int64_t N) const;
  void route(const T* logits, T* scores, int64_t N);
  void build_permutation(int64_t N);
  void plan_exchange();
  // Dispatch: token-side rows (global expert order) -> expert-side rows (local expert major).
  void dispatch_rows(const T* token_rows, T* expert_rows, int64_t width);
  // Combine: the reverse (the adjoint of dispatch).
  void combine_rows(const T* expert_rows, T* token_rows, int64_t width);
  // Received rows between source-major (source rank, local expert) and expert-major order.
  void reorder_received(const T* from, T* to, int64_t width, bool to_expert_major);
  void exchange_rows(const T* send, const std::vector<int64_t>& send_rows, T* recv,
                     const std::vector<int64_t>& recv_rows, int64_t width);
  void router_losses(const T* logits, const T* scores, int64_t N);
  // dw: (N K) gate-weight gradients; dp, dz: (N, E) zeroed scratch; adds the router's share to dx.
  void router_backward(const T* x, const T* logits, const T* scores, const T* dw, T* dp, T* dz, T* dx, int64_t N);

  Ops<T>& ops_;
  MoeSettings s_;
  std::string prefix_;
  FfnContext context_;
  RouterStepStats stats_;
  std::vector<float> bias_;  // balancing bias, E; selects, never weights
  std::unique_ptr<DenseMlp<T>> shared_, fallback_;
  const T *router_ = nullptr, *w1_ = nullptr, *w3_ = nullptr, *w2_ = nullptr;
  T *d_router_ = nullptr, *dw1_ = nullptr, *dw3_ = nullptr, *dw2_ = nullptr;

  // Routing of the last forward (per slot n*K + j unless noted).
  std::vector<int32_t> sel_expert_, assigned_expert_;
  std::vector<SlotFate> fate_;
  std::vector<T> gate_;   // gate weight of each slot
  std::vector<T> denom_;  // per token: the renormalisation sum (1 when not renormalising)
  std::vector<uint8_t> denom_clamped_;
  std::vector<uint8_t> expert_masked_;   // E, expert dropout of this step
  std::vector<int64_t> expert_offset_;   // E + 1, rows of each expert in the permuted block
  std::vector<int32_t> perm_slot_;       // permuted row -> slot
  std::vector<int64_t> row_of_slot_;     // slot -> permuted row (-1: not computed by an expert)
  std::vector<int32_t> fallback_token_;  // tokens computed by the dense fallback
  std::vector<T> fallback_weight_;       // their summed overflowed gate weights
  std::vector<T> f_;                     // E, top-k selection fractions of the last forward (no grad)
  double last_aux_ = 0, last_z_ = 0, last_entropy_ = 0, last_death_ = 0;
  std::vector<T> scratch_;

  // Exchange plan of the last forward. Token side: rows per destination rank. Expert side: rows per
  // (source rank, local expert), and the two orders of the received rows.
  ExpertExchange* exchange_ = nullptr;
  std::vector<int64_t> send_rows_, recv_rows_;  // per rank
  std::vector<int64_t> recv_count_;             // (ep_size, local experts): rows from source for expert
  std::vector<int64_t> local_offset_;           // local experts + 1: expert-major block offsets
  int64_t received_ = 0;                        // R: rows this rank's experts compute
  // Expert-side activations of the last forward: xe (R, D), a, b, h (R, F).
  std::vector<T> xe_, ea_, eb_, eh_;
  std::vector<T> exchange_buffer_;
  std::vector<T> token_rows_, expert_out_;  // dispatch and combine staging, reused across forwards
};

}  // namespace moe
