// The FFN slot of a transformer layer (MODEL.md: FFN_l). A strategy chosen once at construction:
// the dense SwiGLU MLP here; the MoE layer implements the same interface. Activations live in
// memory the model hands in (so activation recompute can share one scratch set across layers);
// parameters and gradients in the model's flat buffers, registered by name in the parameter table.
#pragma once

#include <cstdint>
#include <string>

#include "core/backend/ops.h"
#include "core/params.h"

namespace moe {

template <typename T>
class FeedForward {
 public:
  virtual ~FeedForward() = default;
  // Adds this layer's parameters to the table under `prefix` (e.g. "layers.3.mlp").
  virtual void register_params(ParamTable& table, const std::string& prefix) = 0;
  // Points at the flat buffers once they exist (offsets come from the table).
  virtual void bind(const ParamTable& table, T* params, T* grads) = 0;
  // Elements of saved activations (acts) and of backward scratch for N tokens.
  virtual int64_t activation_size(int64_t N) const = 0;
  virtual int64_t scratch_size(int64_t N) const = 0;
  // x: (N, D) normalised input; y: (N, D) written; acts: activation_size(N) saved for backward.
  virtual void forward(const T* x, T* y, T* acts, int64_t N) = 0;
  // After forward on the same x and acts. dx: (N, D) written; parameter gradients accumulate.
  virtual void backward(const T* x, const T* dy, T* dx, const T* acts, T* scratch, int64_t N) = 0;
};

// SwiGLU(x) = (silu(x W1) * (x W3)) W2 with W1, W3: (D, F), W2: (F, D).
template <typename T>
class DenseMlp final : public FeedForward<T> {
 public:
  DenseMlp(Ops<T>& ops, int64_t d_model, int64_t hidden, int64_t layers_total);
  void register_params(ParamTable& table, const std::string& prefix) override;
  void bind(const ParamTable& table, T* params, T* grads) override;
  int64_t activation_size(int64_t N) const override { return 3 * N * F_; }
  int64_t scratch_size(int64_t N) const override { return 3 * N * F_; }
  void forward(const T* x, T* y, T* acts, int64_t N) override;
  void backward(const T* x, const T* dy, T* dx, const T* acts, T* scratch, int64_t N) override;

 private:
  Ops<T>& ops_;
  int64_t D_, F_, L_;
  std::string prefix_;
  const T *w1_ = nullptr, *w3_ = nullptr, *w2_ = nullptr;
  T *dw1_ = nullptr, *dw3_ = nullptr, *dw2_ = nullptr;
};

}  // namespace moe
