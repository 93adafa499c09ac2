// The ends of the language model as layers made by factories, like attention and the FFN: the token
// embedding (docs/model.md "Embedding") and the output head with its cross-entropy. The defaults here hold
// the whole vocabulary; parallel/tp_layers.h has the vocabulary-parallel ones. Rows: the model's residual
// stream may hold only this rank's rows of the micro-batch's N tokens (sequence parallelism); the layers
// know their layout, the model passes N, the micro-batch's tokens.
#pragma once

#include <cstdint>
#include <string>

#include "core/backend/backend.h"
#include "core/params.h"
#include "core/sizes.h"

namespace moe {

template <typename T>
class Embedding {
 public:
  virtual ~Embedding() = default;
  // Adds "embed.weight" (or this rank's block of it) to the table.
  virtual void register_params(ParamTable& table) = 0;
  virtual void bind(const ParamTable& table, T* params, T* grads) = 0;
  // tokens: (N) ids in the backend's memory; x: this rank's rows of the embedded tokens, written.
  virtual void forward(const int32_t* tokens, T* x, int64_t N) = 0;
  // dx: the gradient of this rank's rows; the table's gradient accumulates.
  virtual void backward(const int32_t* tokens, const T* dx, int64_t N) = 0;
};

// The output head: logits = xo Wout, then per-token cross-entropy against the targets.
template <typename T>
class OutputHead {
 public:
  virtual ~OutputHead() = default;
  // Adds "head.weight" (or this rank's block of it) to the table.
  virtual void register_params(ParamTable& table) = 0;
  // How the head's GEMMs read their operands (train.precision, through ModelOptions::precision; default fp32). Set
  // once, at the model's construction.
  virtual void set_precision(GemmPrecision precision) = 0;
  virtual void bind(const ParamTable& table, T* params, T* grads) = 0;
  // Elements kept from forward to backward, and of backward scratch, for a micro-batch of N tokens.
  virtual int64_t activation_size(int64_t N) const = 0;
  virtual int64_t scratch_size(int64_t N) const = 0;
  virtual double forward_flops(int64_t N) const = 0;
  // Whether the head keeps its input held rounded in acts for its two GEMMs (under bf16 GEMMs, where the rank has
  // all N rows): then the output norm writes it there (held_input, for N tokens) and forward and backward are given
  // xo null; forward given an xo rounds it there itself. Asked after set_precision.
  virtual bool keeps_input() const { return false; }
  virtual Rounded<T>* held_input(T* acts, int64_t N) const {
    (void)acts, (void)N;
    return nullptr;
  }
  // xo: this rank's rows of the normalised output; targets: (N); losses: (N) written with every token's
  // -log p(target) (the whole micro-batch's on every rank); acts: activation_size(N).
  virtual void forward(const T* xo, const int32_t* targets, T* losses, T* acts, int64_t N) = 0;
  // dxo: this rank's rows, written with d(scale * sum of losses)/d(xo); the weight's gradient accumulates.
  virtual void backward(const T* xo, const int32_t* targets, T scale, const T* acts, T* scratch, T* dxo, int64_t N) = 0;
};

// The embedding table (V, D), or the block of rows [first, first + rows) of it a tensor-parallel shard
// holds; a token outside the block embeds to zero (the shards' outputs sum to the embedding).
template <typename T>
class TokenEmbedding final : public Embedding<T> {
 public:
  TokenEmbedding(Backend& backend, int64_t vocab, int64_t d_model, TpShard shard = {});
  void register_params(ParamTable& table) override;
  void bind(const ParamTable& table, T* params, T* grads) override;
  // x: (N, D), every token (zero rows for the tokens outside the block).
  void forward(const int32_t* tokens, T* x, int64_t N) override;
  void backward(const int32_t* tokens, const T* dx, int64_t N) override;

 private:
  Ops<T>& ops_;
  int64_t V_, D_;
  TpShard shard_;
  const T* table_ = nullptr;
  T* grad_ = nullptr;
};

// The whole vocabulary's head on every row.
template <typename T>
class LmHead final : public OutputHead<T> {
 public:
  LmHead(Backend& backend, int64_t vocab, int64_t d_model);
  void register_params(ParamTable& table) override;
  void set_precision(GemmPrecision precision) override { precision_ = precision; }
  void bind(const ParamTable& table, T* params, T* grads) override;
  // The logits (N, V) and, under bf16 GEMMs, the input held rounded (N, D).
  int64_t activation_size(int64_t N) const override { return sizes::elements(footprint(N).activations); }
  bool keeps_input() const override { return held(); }
  Rounded<T>* held_input(T* acts, int64_t N) const override {
    return held() ? reinterpret_cast<Rounded<T>*>(acts + N * V_) : nullptr;
  }
  // Their gradient; under bf16 GEMMs, its only readers, written held rounded (Ops::cross_entropy_backward_rounded).
  int64_t scratch_size(int64_t N) const override { return sizes::elements(footprint(N).scratch); }
  double forward_flops(int64_t N) const override { return 2.0 * double(N) * double(D_) * double(V_); }
  void forward(const T* xo, const int32_t* targets, T* losses, T* acts, int64_t N) override;
  void backward(const T* xo, const int32_t* targets, T scale, const T* acts, T* scratch, T* dxo, int64_t N) override;

 private:
  bool held() const { return precision_ == GemmPrecision::Bf16; }
  sizes::Footprint footprint(int64_t N) const {
    return sizes::lm_head(double(N), double(V_), held_size<T>(held()), double(D_));
  }

  Ops<T>& ops_;
  int64_t V_, D_;
  GemmPrecision precision_ = GemmPrecision::Fp32;
  const T* weight_ = nullptr;
  T* grad_ = nullptr;
};

}  // namespace moe
