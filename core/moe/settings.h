// Configuration of one MoE layer (docs/model.md "MoE layer"; keys in docs/config.md) and the fate of one
// (token, choice) assignment. Plain data shared by the MoE parts in core/moe/.
#pragma once

#include <cstdint>

namespace moe {

enum class RouterScore { Softmax, Sigmoid };
enum class RouterNoise { None, Gumbel };
enum class DropPolicy { Probs, Position };
// What happens to an assignment over capacity. RerouteDense is the cascade ["reroute", "dense"]: rerouted to
// the next-best expert with room, and what still does not fit goes to the dense fallback.
enum class Overflow { Drop, Reroute, Dense, RerouteDense };
inline bool reroutes(Overflow o) { return o == Overflow::Reroute || o == Overflow::RerouteDense; }
inline bool uses_fallback(Overflow o) { return o == Overflow::Dense || o == Overflow::RerouteDense; }
// How rows travel to the experts' ranks and back (core/moe/dispatcher.h; docs/parallel.md "Dispatchers").
enum class DispatcherKind { AllToAll, AllGather };
// How the balancing bias follows the step's loads (docs/moe.md "Balancing bias").
enum class BiasRule { Sign, Proportional };

// The balancing-bias update after an optimizer step. Sign: b_e += rate * sign(mean_c - c_e). Proportional:
// b_e = decay * b_e + rate * u_e with u_e = min(mean_c / max(c_e, 1), kMaxLoadRatio) - 1, u_e = 0 inside the dead
// band |u_e| <= dead_band.
struct BiasBalance {
  double rate = 0;  // 0: off
  BiasRule rule = BiasRule::Sign;
  double decay = 0.99, dead_band = 0.1;
  static constexpr double kMaxLoadRatio = 10;
};

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
  // Learned temperature: tau = clamp(exp(log_tau), tau_min, tau_max) with log_tau a parameter of the layer
  // (initialised to log(tau)); the gradient is zero where the clamp holds.
  bool tau_learned = false;
  double tau_min = 0.1, tau_max = 10.0;
  RouterNoise noise = RouterNoise::None;
  RouterScore score = RouterScore::Softmax;
  bool normalize = true;         // renormalise the gate weights of the selected experts (when top_k > 1)
  double capacity_factor = 0.0;  // <= 0: no limit
  // moe.capacity_auto: the trainer moves the factor after each step (MoeLayer::update_capacity), so the
  // capacity control is checkpoint state.
  bool capacity_auto = false;
  DropPolicy drop_policy = DropPolicy::Probs;
  Overflow overflow = Overflow::Drop;
  double expert_dropout = 0.0;
  double coef_aux = 0, coef_z = 0, coef_entropy = 0, coef_death = 0, death_floor = 0.01;
  // Router warm-up: coef_warmup * KL(uniform || P / sum P) (P the group's mean scores) in training steps
  // below warmup_steps.
  double coef_warmup = 0;
  int64_t warmup_steps = 0;
  // Expert parallelism: this rank holds experts [ep_rank * E / ep_size, (ep_rank + 1) * E / ep_size).
  int64_t ep_size = 1, ep_rank = 0;
  // A routing group split over ranks (the tensor-parallel group): each holds a block of token_shards equal
  // consecutive blocks of the group's tokens, this rank block token_shard. Routing is the whole group's.
  int64_t token_shards = 1, token_shard = 0;
  // Expert tensor parallelism: the routed experts', the shared experts' and the fallback's hidden width split
  // over expert_tp ranks (the tensor-parallel group), this rank holding block expert_tp_rank. The layer then
  // takes every token of the routing group, and its output and input gradient are this rank's partial sums
  // (parallel/tp_layers.h sums them over the group).
  int64_t expert_tp = 1, expert_tp_rank = 0;
  // With ep_size > 1: the all-to-all travels while work that does not need it computes (the shared experts
  // beside the counts and the backward's dispatch, the dense fallback beside the combine); false: each
  // exchange blocks first. The same operations on the same data either way, so the same results bit for bit.
  bool overlap_exchange = true;
  DispatcherKind dispatcher = DispatcherKind::AllToAll;
};

// Fate of one (token, slot) assignment after capacity.
enum class SlotFate : int8_t { None, Kept, Rerouted, Fallback, Dropped };

}  // namespace moe
