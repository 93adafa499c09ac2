// The routed experts of one rank: El SwiGLU MLPs, each applied to its contiguous block of rows
// (expert-major), through the backend's expert_mlp_forward / expert_mlp_backward (core/backend/ops.h: grouped
// GEMMs and the SwiGLU). Parameters are the layer's (E_local, D, 2, F) w13 (each row [W1 row | W3 row]) and
// (E_local, F, D) w2 stacks; no routing here.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/backend/backend.h"
#include "core/sizes.h"

namespace moe {

// Expert-side activations of one routing group, kept for the backward: xe (R, D), ab = xe W13 (R, 2F: each row
// [a | b], a = xe W1, b = xe W3), h = silu(a) * b (R, F). Under bf16 GEMMs all three are held rounded (Rounded: bf16
// for fp32 storage; Ops::expert_mlp_forward_rounded), half the memory.
template <typename T>
struct ExpertActs {
  Buffer xe, ab, h;  // in the backend's memory
};

template <typename T>
class GroupedExperts {
 public:
  GroupedExperts(Backend& backend, int64_t d_model, int64_t hidden)
      : backend_(backend), ops_(backend.ops<T>()), D_(d_model), F_(hidden) {}
  // How the experts' GEMMs read their operands (FeedForward::set_precision).
  void set_precision(GemmPrecision precision) { precision_ = precision; }
  // Whether the activations are held rounded: with bf16 GEMMs. The dispatch then gathers xe rounded.
  bool rounded() const { return precision_ == GemmPrecision::Bf16; }
  void bind(const T* w13, const T* w2, T* dw13, T* dw2) { w13_ = w13, w2_ = w2, dw13_ = dw13, dw2_ = dw2; }
  // Sizes acts for R rows (its xe is then filled by the dispatcher).
  void resize(ExpertActs<T>& acts, int64_t R) const;
  // offset: El + 1 block offsets; acts.xe filled; writes acts.ab, h and y: (R, D).
  void forward(const std::vector<int64_t>& offset, ExpertActs<T>& acts, T* y) const;
  // dy: (R, D); scratch: scratch_size(R); dx: (R, D) written; parameter gradients accumulate.
  void backward(const std::vector<int64_t>& offset, const ExpertActs<T>& acts, const T* dy, T* scratch, T* dx) const;
  // The backward's scratch for R rows (sizes::experts_scratch).
  int64_t scratch_size(int64_t R) const {
    return sizes::elements(sizes::experts_scratch(double(R), double(F_), double(D_), held_size<T>(rounded())));
  }

 private:
  typename Ops<T>::ExpertMlp mlp(const std::vector<int64_t>& offset) const {
    return {int64_t(offset.size()) - 1, offset.data(), D_, F_, w13_, w2_, dw13_, dw2_, precision_};
  }

  Backend& backend_;
  Ops<T>& ops_;
  int64_t D_, F_;
  GemmPrecision precision_ = GemmPrecision::Fp32;
  const T *w13_ = nullptr, *w2_ = nullptr;
  T *dw13_ = nullptr, *dw2_ = nullptr;
};

}  // namespace moe
