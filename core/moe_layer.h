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
#include "core/moe/settings.h"

namespace moe {

// One micro-batch's state in one MoE layer: what its backward needs besides the activations in the
// model's arena. Per (token, choice) "slot" n*K + j unless noted.
template <typename T>
struct MoeSlot final : FfnSlot {
  // Routing.
  std::vector<int32_t> selected_expert, assigned_expert;
  std::vector<SlotFate> fate;
  std::vector<T> gate;   // gate weight of each slot
  std::vector<T> denom;  // per token: the renormalisation sum (1 when not renormalising)
  std::vector<uint8_t> denom_clamped;
  std::vector<uint8_t> expert_masked;             // E, expert dropout of this step
  std::vector<T> f;                               // E, top-k selection fractions (no gradient)
  double aux = 0, z = 0, entropy = 0, death = 0;  // router losses, coefficients applied
  double entropy_sum = 0;                         // sum over tokens of the routing entropy
  // Dispatch plan.
  std::vector<int64_t> expert_offset;   // E + 1, rows of each expert in the permuted block
  std::vector<int32_t> perm_slot;       // permuted row -> slot
  std::vector<int64_t> row_of_slot;     // slot -> permuted row (-1: not computed by an expert)
  std::vector<int32_t> fallback_token;  // tokens computed by the dense fallback
  std::vector<T> fallback_weight;       // their summed overflowed gate weights
  // Exchange plan. Token side: rows per destination rank. Expert side: rows per (source rank, local
  // expert), and the expert-major block offsets.
  std::vector<int64_t> send_rows, recv_rows;  // per rank
  std::vector<int64_t> recv_count;            // (ep_size, local experts)
  std::vector<int64_t> local_offset;          // local experts + 1
  int64_t received = 0;                       // R: rows this rank's experts compute
  // Expert-side activations: xe (R, D), a, b, h (R, F).
  std::vector<T> xe, ea, eb, eh;
};

template <typename T>
class MoeLayer final : public FeedForward<T> {
 public:
  MoeLayer(Ops<T>& ops, const MoeSettings& settings);

  void register_params(ParamTable& table, const std::string& prefix) override;
  void bind(const ParamTable& table, T* params, T* grads) override;
  int64_t activation_size(int64_t N) const override;
  int64_t scratch_size(int64_t N) const override { return 0; }  // kept inside the layer
  std::unique_ptr<FfnSlot> make_slot() const override { return std::make_unique<MoeSlot<T>>(); }
  using FeedForward<T>::forward;
  using FeedForward<T>::backward;
  void forward(const FfnContext& context, const T* x, T* y, T* acts, FfnSlot* slot, int64_t N) override;
  void backward(const FfnContext& context, const T* x, const T* dy, T* dx, const T* acts, FfnSlot* slot, T* scratch,
                int64_t N) override;
  double forward_flops(int64_t N) const override;

  // The all-to-all over the expert-parallel group (required when ep_size > 1; float only).
  void set_exchange(ExpertExchange* exchange) { exchange_ = exchange; }
  int64_t local_experts() const { return s_.num_experts / s_.ep_size; }
  RouterStepStats* router_stats() override { return &stats_; }
  double router_loss(const FfnSlot* slot) const override;

  // Starts a new step's statistics.
  void reset_stats();
  // After an optimizer step: b_e += rate * sign(mean_c - c_e) from the step's counts (MODEL.md).
  // counts: tokens_per_expert summed over the step (and, with data parallelism, over all replicas).
  void update_balancing_bias(const std::vector<int64_t>& counts, double rate);
  std::vector<float>& balancing_bias() { return bias_; }

  // The routing of the last one-at-a-time forward (the default slot), for tests: expert of slot (n, j)
  // before capacity, its gate weight, its fate, and the expert that finally computed it (-1 if none).
  const std::vector<int32_t>& selected_expert() const { return default_state().selected_expert; }
  const std::vector<int32_t>& assigned_expert() const { return default_state().assigned_expert; }
  const std::vector<SlotFate>& slot_fate() const { return default_state().fate; }
  const std::vector<T>& gate_weight() const { return default_state().gate; }
  int64_t capacity(int64_t N) const;
  const MoeSettings& settings() const { return s_; }
  std::string param_prefix() const { return prefix_; }

 private:
  struct ActsView;  // carving of the activation buffer
  ActsView carve(T* acts, int64_t N) const;
  const MoeSlot<T>& default_state() const;
  void route(const FfnContext& context, const T* logits, T* scores, MoeSlot<T>& st, int64_t N) const;
  void build_permutation(MoeSlot<T>& st, int64_t N) const;
  void plan_exchange(MoeSlot<T>& st);
  // Dispatch: token-side rows (global expert order) -> expert-side rows (local expert major).
  void dispatch_rows(const MoeSlot<T>& st, const T* token_rows, T* expert_rows, int64_t width);
  // Combine: the reverse (the adjoint of dispatch).
  void combine_rows(const MoeSlot<T>& st, const T* expert_rows, T* token_rows, int64_t width);
  // Received rows between source-major (source rank, local expert) and expert-major order.
  void reorder_received(const MoeSlot<T>& st, const T* from, T* to, int64_t width, bool to_expert_major) const;
  void exchange_rows(const T* send, const std::vector<int64_t>& send_rows, T* recv,
                     const std::vector<int64_t>& recv_rows, int64_t width);
  void router_losses(const T* logits, const T* scores, MoeSlot<T>& st, int64_t N) const;
  void count_stats(const FfnContext& context, const MoeSlot<T>& st, int64_t N);
  // dw: (N K) gate-weight gradients; dp, dz: (N, E) zeroed scratch; adds the router's share to dx.
  void router_backward(const FfnContext& context, const MoeSlot<T>& st, const T* x, const T* logits, const T* scores,
                       const T* dw, T* dp, T* dz, T* dx, int64_t N);

  Ops<T>& ops_;
  MoeSettings s_;
  std::string prefix_;
  RouterStepStats stats_;
  std::vector<float> bias_;  // balancing bias, E; selects, never weights
  std::unique_ptr<DenseMlp<T>> shared_, fallback_;
  const T *router_ = nullptr, *w1_ = nullptr, *w3_ = nullptr, *w2_ = nullptr;
  T *d_router_ = nullptr, *dw1_ = nullptr, *dw3_ = nullptr, *dw2_ = nullptr;
  ExpertExchange* exchange_ = nullptr;

  // Workspace of one forward or backward call (no micro-batch state), kept to avoid reallocating.
  std::vector<T> scratch_, exchange_buffer_, token_rows_, expert_out_;
};

}  // namespace moe
