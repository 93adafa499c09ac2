// The FFN of a transformer layer (docs/model.md: FFN_l). A strategy chosen once at construction: the
// dense SwiGLU MLP here; the MoE layer implements the same interface. A layer holds parameters,
// configuration and step statistics only. What one micro-batch leaves for its backward lives in
// memory the caller hands in: activations in the model's arena (so activation recompute can share
// one set across layers), everything else (routing, plans, expert-side rows) in an FfnSlot the layer
// makes and the model keeps per (micro-batch slot, layer). Parameters and gradients live in the
// model's flat buffers, registered by name in the parameter table.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/backend/backend.h"
#include "core/params.h"
#include "core/sizes.h"

namespace moe {

// What a forward needs to know beyond its input: training or evaluation, which step and which tokens
// (so counter-based noise is addressed by global token index, the same in every parallel layout), and
// whether this forward is a recompute (which must not count routing statistics twice).
struct FfnContext {
  bool training = true;
  bool recomputing = false;
  uint64_t seed = 0;
  int64_t step = 0;                // optimizer step, 0-based
  int64_t first_token = 0;         // global index of the first token of this micro-batch within the step
  double router_loss_scale = 1.0;  // weight of this routing group's router losses in the step's loss
};

// Routing statistics of one MoE layer, summed over the routing groups of one step (training forwards only).
struct RouterStepStats {
  std::vector<int64_t> tokens_per_expert;  // assignments processed per expert, after capacity
  int64_t dropped = 0;                     // assignments removed by capacity and not computed by anyone
  int64_t rerouted = 0;                    // assignments moved to the token's next-best expert with room
  int64_t fallback = 0;                    // assignments computed by the dense fallback instead
  int64_t tokens = 0;
  int64_t groups = 0;
  double entropy_sum = 0;  // sum over tokens of the routing entropy -sum_e p_e log p_e
  // Router losses (coefficients applied), summed over groups; the step's value is the sum / groups.
  double aux = 0, z = 0, entropy_loss = 0, death = 0, warmup = 0;
  // The router temperature and capacity factor in force, summed over groups (the step's: sum / groups).
  double tau_sum = 0, capacity_factor_sum = 0;
};

// One micro-batch's state inside one FFN layer beyond its activations (MoeLayer: routing, dispatch
// and exchange plans, expert-side activations, router losses). Written by forward, read by backward.
class FfnSlot {
 public:
  virtual ~FfnSlot() = default;
};

template <typename T>
class FeedForward {
 public:
  virtual ~FeedForward() = default;
  // A fresh per-micro-batch state for this layer; nullptr when the activations say everything.
  virtual std::unique_ptr<FfnSlot> make_slot() const { return nullptr; }
  // Routing statistics of the current step (summed over its training forwards); nullptr for a dense FFN.
  virtual RouterStepStats* router_stats() { return nullptr; }
  // Router losses of the forward held by `slot`, coefficients applied, unscaled by the group weight
  // (0 when dense).
  virtual double router_loss(const FfnSlot* slot) const { return 0.0; }
  // Matmul FLOPs of one forward over N tokens (for throughput figures).
  virtual double forward_flops(int64_t N) const = 0;
  // Adds this layer's parameters to the table under `prefix` (e.g. "layers.3.mlp").
  virtual void register_params(ParamTable& table, const std::string& prefix) = 0;
  // How this layer's GEMMs read their operands (train.precision, through ModelOptions::precision; default fp32; an
  // MoE layer's router stays fp32 whatever it is). Set once, at the model's construction.
  virtual void set_precision(GemmPrecision precision) = 0;
  // Points at the flat buffers once they exist (offsets come from the table).
  virtual void bind(const ParamTable& table, T* params, T* grads) = 0;
  // Elements of saved activations (acts) and of backward scratch for N tokens.
  virtual int64_t activation_size(int64_t N) const = 0;
  virtual int64_t scratch_size(int64_t N) const = 0;
  // x: (N, D) normalised input; y: (N, D) written; acts: activation_size(N) saved for backward;
  // slot: from make_slot(), written with what backward needs. context.recomputing: a forward run again
  // for backward, which must not count statistics.
  virtual void forward(const FfnContext& context, const T* x, T* y, T* acts, FfnSlot* slot, int64_t N) = 0;
  // After forward on the same x, acts and slot. dx: (N, D) written; parameter gradients accumulate;
  // scratch: scratch_size(N).
  virtual void backward(const FfnContext& context, const T* x, const T* dy, T* dx, const T* acts, FfnSlot* slot,
                        T* scratch, int64_t N) = 0;

  // One micro-batch at a time (layer tests, benchmarks): a default context and slot held here.
  void set_context(const FfnContext& context) { default_context_ = context; }
  void forward(const T* x, T* y, T* acts, int64_t N) { forward(default_context_, x, y, acts, default_slot(), N); }
  void backward(const T* x, const T* dy, T* dx, const T* acts, T* scratch, int64_t N) {
    backward(default_context_, x, dy, dx, acts, default_slot(), scratch, N);
  }
  double last_router_loss() const { return router_loss(default_slot_.get()); }

 protected:
  FfnSlot* default_slot() {
    if (!default_slot_) default_slot_ = make_slot();
    return default_slot_.get();
  }
  const FfnSlot* default_slot_state() const { return default_slot_.get(); }

 private:
  FfnContext default_context_;
  std::unique_ptr<FfnSlot> default_slot_;
};

// SwiGLU(x) = (silu(x W1) * (x W3)) W2 with W1, W3: (D, F), W2: (F, D); W1 and W3 are one tensor W13 (D, 2, F),
// each row [W1 row | W3 row], so that [x W1 | x W3] is one GEMM, and [da | db] W13^T the input's gradient. A
// tensor-parallel shard (block r of tp) holds hidden units [r F / tp, (r + 1) F / tp): those columns of W1, W3
// (W13's last axis) and rows of W2 (column- and row-parallel), so its output is a partial sum of the whole output
// (parallel/tp_layers.h sums it).
template <typename T>
class DenseMlp final : public FeedForward<T> {
 public:
  DenseMlp(Backend& backend, int64_t d_model, int64_t hidden, int64_t layers_total, TpShard shard = {});
  void register_params(ParamTable& table, const std::string& prefix) override;
  void set_precision(GemmPrecision precision) override { precision_ = precision; }
  void bind(const ParamTable& table, T* params, T* grads) override;
  // ab (N, 2F), h (N, F); under bf16 GEMMs x, ab, h held rounded, computed as the routed experts' (one group:
  // Ops::expert_mlp_forward_rounded), so that a dense layer, the shared experts and the fallback keep half.
  int64_t activation_size(int64_t N) const override { return sizes::elements(footprint(N).activations); }
  int64_t scratch_size(int64_t N) const override { return sizes::elements(footprint(N).scratch); }
  using FeedForward<T>::forward;
  using FeedForward<T>::backward;
  void forward(const FfnContext& context, const T* x, T* y, T* acts, FfnSlot* slot, int64_t N) override;
  void backward(const FfnContext& context, const T* x, const T* dy, T* dx, const T* acts, FfnSlot* slot, T* scratch,
                int64_t N) override;
  double forward_flops(int64_t N) const override { return 6.0 * double(N) * double(D_) * double(F_); }

 private:
  bool held() const { return precision_ == GemmPrecision::Bf16; }
  sizes::Footprint footprint(int64_t N) const {
    return sizes::dense_mlp(double(N), double(F_), double(D_), held_size<T>(held()));
  }
  // The experts' MLP of one group of N rows on this layer's weights.
  typename Ops<T>::ExpertMlp as_expert(const int64_t* rows) const;
  void held_forward(const T* x, T* y, T* acts, int64_t N);
  void held_backward(const T* dy, T* dx, const T* acts, T* scratch, int64_t N);

  Ops<T>& ops_;
  int64_t D_, F_, L_;  // F_: the shard's hidden units
  TpShard shard_;
  GemmPrecision precision_ = GemmPrecision::Fp32;
  std::string prefix_;
  const T *w13_ = nullptr, *w2_ = nullptr;  // W13 (D, 2, F): each row [W1 row | W3 row]
  T *dw13_ = nullptr, *dw2_ = nullptr;
};

}  // namespace moe
