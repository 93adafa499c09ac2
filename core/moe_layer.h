// The MoE layer of docs/model.md ("MoE layer") in the FFN slot. It only wires its parts (core/moe/):
// router (scores, selection, gate weights, router losses) -> dispatch plan (capacity, overflow,
// permutation) -> dispatcher (rows to the experts' ranks) -> grouped experts -> dispatcher back ->
// combine (gate-weighted sum), plus the shared experts and the dense fallback, and the mirrored
// backward. Routing statistics are counted once per real training forward, never on a recompute.
// Not here: distributing experts over ranks (parallel/), clipping (optim/).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/expert_exchange.h"
#include "core/ffn.h"
#include "core/moe/adaptive_capacity.h"
#include "core/moe/dispatch_plan.h"
#include "core/moe/dispatcher.h"
#include "core/moe/experts.h"
#include "core/moe/router.h"
#include "core/moe/settings.h"
#include "core/state.h"

namespace moe {

// One micro-batch's state in one MoE layer: what its backward needs besides the activations in the
// model's arena.
template <typename T>
struct MoeSlot final : FfnSlot {
  Routing<T> routing;
  // The expert offsets of this rank's rows (E + 1); the slots' experts and fates only in host_state()'s copy.
  DispatchPlan plan;
  ExchangePlan exchange;
  ExpertActs<T> experts;
  // A routing group split over ranks: `routing` is the whole group's, `plan` this rank's block's, whose
  // first token in the group is first_token (0 when not split).
  int64_t first_token = 0;
  // The plan's indices and weights in the backend's memory, for the row-moving ops: token of each
  // permuted row and its gate weight (M); permuted row of each slot, -1 if none, and its gate (N K);
  // the fallback's tokens and weights (Mf); the slot of each permuted row (M); for each overflowed assignment the
  // dense fallback computed, its row among the fallback's tokens and its slot (both Sf).
  Buffer perm_token, perm_gate, slot_row, gate, fallback_token_rows, fallback_weights, perm_slot_rows,
      fallback_slot_source, fallback_slot;
  // The dense fallback's tokens (Mf) and the overflowed assignments it computes (Sf) of this rank's tokens.
  int64_t fallback_count = 0, fallback_pair_count = 0;
  // The plan on the backend (MoeLayer::plan): the expert that computes each slot of the whole routing group (G K, -1
  // if none), this rank's expert offsets (E + 1) and, where overflow is rerouted or computed densely, the plan's
  // counts (int64: the group's slots rerouted, this rank's fallback tokens and slots); the fallback's buffers are
  // sized for every token and slot.
  Buffer assigned, expert_offset, plan_counts;
};

template <typename T>
class MoeLayer final : public FeedForward<T>, public Stateful {
 public:
  MoeLayer(Backend& backend, const MoeSettings& settings);

  void register_params(ParamTable& table, const std::string& prefix) override;
  // The routed, shared and fallback experts' GEMMs; the router's stay fp32 (docs/moe.md).
  void set_precision(GemmPrecision precision) override;
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

  // The exchange over the expert-parallel group (required when ep_size > 1; float only).
  void set_exchange(ExpertExchange* exchange) { dispatcher_->set_exchange(exchange); }
  // The ranks sharing a routing group (required when token_shards > 1 or expert_tp > 1). With token_shards,
  // forward and backward take this rank's N rows of a group of N * token_shards tokens.
  void set_token_group(TokenGroup* group) { group_ = group; }
  int64_t local_experts() const { return s_.num_experts / s_.ep_size; }
  RouterStepStats* router_stats() override { return &stats_; }
  double router_loss(const FfnSlot* slot) const override;

  // Starts a new step's statistics.
  void reset_stats();
  // After an optimizer step: the balancing-bias rule of `balance` from the step's counts (docs/moe.md).
  // counts: tokens_per_expert summed over the step (and, with data parallelism, over all replicas).
  void update_balancing_bias(const std::vector<int64_t>& counts, const BiasBalance& balance) {
    router_.update_bias(counts, balance);
  }
  // The sign rule at `rate`: b_e += rate * sign(mean_c - c_e) (docs/model.md).
  void update_balancing_bias(const std::vector<int64_t>& counts, double rate) {
    update_balancing_bias(counts, BiasBalance{rate});
  }
  std::vector<float>& balancing_bias() { return router_.bias(); }
  // The temperature in force (learned, scheduled or configured), and a scheduled one set before a step.
  double tau() const { return router_.tau(); }
  void set_tau(double tau) { router_.set_tau(tau); }
  // Adaptive capacity (moe.capacity_auto): the factor in force and the runs of steps above and below the
  // thresholds, updated by the trainer after each step from the step's overflow ratio (and restored from a
  // checkpoint, then applied).
  CapacityControl& capacity_control() { return capacity_; }
  void update_capacity(double overflow_ratio, const CapacityAuto& a) {
    capacity_ = next_capacity(capacity_, overflow_ratio, a);
    apply_capacity_control();
  }
  void apply_capacity_control() { s_.capacity_factor = capacity_.factor; }
  // The last step at which each expert received a token (-1: never), kept by the trainer for the dead-expert count.
  std::vector<int64_t>& last_used_step() { return last_used_; }
  // Checkpoint state (core/moe/moe_state.cpp): "moe/<prefix>.balancing_bias", ".last_used_step", and with
  // settings().capacity_auto the capacity control (".capacity_factor", ".capacity_steps_above", "..._below").
  std::vector<StatePiece> state_pieces(StateUse use) override;
  void state_restored() override;

  // The routing of the last one-at-a-time forward (the default slot), for tests: expert of slot (n, j)
  // before capacity, its gate weight, its fate, and the expert that finally computed it (-1 if none).
  // Read from the backend on demand where it planned.
  const std::vector<int32_t>& selected_expert() const { return host_state().routing.selected; }
  const std::vector<int32_t>& assigned_expert() const { return host_state().plan.assigned_expert; }
  const std::vector<SlotFate>& slot_fate() const { return host_state().plan.fate; }
  const std::vector<T>& gate_weight() const { return host_state().routing.gate; }
  int64_t capacity(int64_t N) const;
  const MoeSettings& settings() const { return s_; }
  std::string param_prefix() const { return prefix_; }

 private:
  struct ActsView;  // carving of the activation buffer
  ActsView carve(T* acts, int64_t N) const;
  const MoeSlot<T>& default_state() const;
  // The default slot with the host copies of its routing and plan, read back once where the backend planned.
  const MoeSlot<T>& host_state() const;
  // The fallback's rows of this rank's tokens in the backend's plan (fallback_rows), sized for every token and slot.
  void fallback_on_backend(MoeSlot<T>& st, const sizes::MoePlanBuffers& size, int64_t N);
  void reserve_plan(MoeSlot<T>& st, const sizes::MoePlanBuffers& size);
  void permute_split_group(MoeSlot<T>& st, int64_t N);
  // Logits, scores and routing of the whole group (gathered when it is split), into the slot and acts.
  void route(const FfnContext& context, const T* x, const ActsView& v, MoeSlot<T>& st, int64_t N);
  // The dispatch plan on the backend (capacity over the whole routing group, the overflow's reroute, drop or dense
  // fallback, the permutation, and this rank's part of it where the group is split over ranks, as ops), then one
  // wait for the expert offsets, the plan's counts, f and the losses' sums, and the statistics.
  void plan(const FfnContext& context, MoeSlot<T>& st, int64_t N);
  // y[n] = sum_j w_j * yp[row(n, j)], choices in order for each token (deterministic).
  void combine(const MoeSlot<T>& st, const T* yp, T* y, int64_t N) const;
  // The dense fallback's output yf of its tokens (the caller adds it to y).
  void fallback_forward(const FfnContext& context, const MoeSlot<T>& st, const T* x, const ActsView& v);
  // dyp: (M, D) un-weighted output gradients in permuted order; dw: (N K) gate-weight gradients of this rank's
  // slots (backend memory, zeroed), each routed slot's written.
  void uncombine(const MoeSlot<T>& st, const T* dy, const T* yp, T* dyp, T* dw);
  // The fallback's share of dw and its input gradient dxf (Mf, D), at the start of `scratch`; the caller
  // scatters dxf into dx.
  void fallback_backward(const FfnContext& context, const MoeSlot<T>& st, const ActsView& v, const T* dy, T* dw,
                         T* scratch);
  // The dispatcher's plan (the counts' exchange), dispatch and combine with `beside` (work independent of
  // what travels) run while the counts or rows travel (s_.overlap_exchange), else after the blocking
  // exchange. The same operations either way.
  void plan_beside(MoeSlot<T>& st, const std::function<void()>& beside);
  // With one expert-parallel rank the token side's permuted rows and the expert side's are the same rows in the
  // same order: one buffer serves both, and the dispatcher's dispatch and combine, given the same memory, move nothing.
  bool aliased_sides() const { return s_.ep_size == 1; }
  void dispatch_beside(const ExchangePlan& p, const T* token_rows, T* expert_rows, const std::function<void()>& beside);
  void combine_beside(const ExchangePlan& p, const T* expert_rows, T* token_rows, const std::function<void()>& beside);
  // The statistics of the backend's plan from its offsets, the fallback's slots and the `rerouted` slots.
  void count_backend_stats(const MoeSlot<T>& st, const std::vector<int64_t>& offset, int64_t rerouted, int64_t G);
  // The router's share of the statistics (losses, temperature, capacity factor, groups and tokens).
  void count_router_stats(const MoeSlot<T>& st, int64_t N);
  // Router backward of this rank's tokens: its gate-weight gradients (in dw: (G K), this rank's slots) into the
  // whole group's logits gradient (dp, dz: (G, E) zeroed workspace), then dWg and dx from this rank's rows.
  void router_backward(const FfnContext& context, const MoeSlot<T>& st, const T* x, const ActsView& v, T* dw, T* dp,
                       T* dz, T* dx, int64_t N);
  int64_t group_tokens(int64_t N) const { return N * s_.token_shards; }
  // The layer's shape for this rank's N tokens, as core/sizes.h declares its sizes.
  sizes::MoeShape shape(int64_t N) const;

  Backend& backend_;
  Ops<T>& ops_;
  MoeSettings s_;
  std::string prefix_;
  RouterStepStats stats_;
  CapacityControl capacity_;
  std::vector<int64_t> last_used_ = std::vector<int64_t>(size_t(s_.num_experts), -1);
  Router<T> router_;
  std::unique_ptr<Dispatcher<T>> dispatcher_;  // chosen by s_.dispatcher
  RowsInFlight<T> in_flight_;                  // of the overlapped exchanges; its staging is kept between calls
  GroupedExperts<T> experts_;
  std::unique_ptr<DenseMlp<T>> shared_, fallback_;
  TokenGroup* group_ = nullptr;

  // Workspace of one forward or backward call (no micro-batch state), kept to avoid reallocating.
  Buffer scratch_, token_rows_, expert_out_, dots_, fallback_dots_, local_logits_;
  // A split routing group planned on the backend: the whole group's permutation before this rank's part is taken.
  Buffer group_offset_, group_perm_slot_, group_row_of_slot_;
};

}  // namespace moe
