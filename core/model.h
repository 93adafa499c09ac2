// The decoder-only language model of MODEL.md: embedding, L layers of (RMSNorm, rotary causal attention,
// residual, RMSNorm, FFN slot, residual), output RMSNorm and untied head, cross-entropy. Forward and
// backward are explicit and read like the math; the FFN strategy is chosen once at construction.
// The model owns its flat parameter and gradient buffers (carved by the parameter table) and an
// activation arena sized for one micro-batch of up to `max_batch` sequences.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "core/backend/ops.h"
#include "core/ffn.h"
#include "core/params.h"

namespace moe {

struct ModelShape {
  int64_t vocab = 256;
  int64_t d_model = 128;
  int64_t layers = 4;
  int64_t heads = 4;
  int64_t ffn_hidden = 384;
  int64_t head_dim() const { return d_model / heads; }
};

enum class Recompute {
  None,  // every layer keeps its activations from forward to backward
  Full,  // each layer keeps only its input and recomputes its forward just before its backward
};

template <typename T>
class Model {
 public:
  // Builds the FFN of layer l; the default is the dense SwiGLU MLP.
  using FfnFactory = std::function<std::unique_ptr<FeedForward<T>>(int64_t layer)>;

  Model(Ops<T>& ops, const ModelShape& shape, int64_t seq_len, int64_t max_batch, Recompute recompute,
        FfnFactory ffn_factory = nullptr);

  const ModelShape& shape() const { return shape_; }
  const ParamTable& table() const { return table_; }
  T* params() { return params_.data(); }
  T* grads() { return grads_.data(); }
  const T* params() const { return params_.data(); }
  const T* grads() const { return grads_.data(); }
  int64_t num_params() const { return table_.numel(); }

  void init_params(uint64_t seed) { table_.initialize(params_.data(), seed); }
  void zero_grads();

  // tokens: (B, T+1) rows, B <= max_batch; inputs are columns [0, T), targets columns [1, T].
  // Returns the sum over the B*T tokens of -log p(target). Keeps what backward needs.
  double forward(const int32_t* tokens, int64_t B);
  // Per-token losses of the last forward: (B*T).
  const T* token_losses() const { return losses_.data(); }
  // After forward: accumulates d(loss_scale * sum of token losses)/d(params) into grads().
  void backward(double loss_scale);

  // Matmul FLOPs of one forward over B sequences (attention included), for throughput figures.
  double forward_flops(int64_t B) const;

  // What the next forwards are: training or evaluation, the optimizer step, the global index of the
  // micro-batch's first sequence within the step, and the weight of one routing group's router losses
  // in the step's loss (1 / routing groups per step). Passed to every FFN.
  void set_context(bool training, int64_t step, int64_t first_sequence, double router_loss_scale, uint64_t seed);
  // Router losses of the last forward, summed over MoE layers (coefficients applied, unweighted).
  double last_router_loss() const;
  FeedForward<T>& ffn(int64_t layer) { return *ffn_[layer]; }
  // Called during backward with a range [first, end) of parameter-table specs whose gradients are final
  // for this backward (output head, then each layer from the last, then the embedding), so gradient
  // communication can start while backward goes on. Empty: no calls.
  using GradReadyHook = std::function<void(int64_t first_spec, int64_t end_spec)>;
  void set_grad_ready_hook(GradReadyHook hook) { grad_ready_ = std::move(hook); }
  int64_t num_layers() const { return shape_.layers; }

 private:
  struct BlockWeights {  // pointers into params_ / grads_ for one layer
    const T *attn_norm, *wq, *wk, *wv, *wo, *ffn_norm;
    T *d_attn_norm, *dwq, *dwk, *dwv, *dwo, *d_ffn_norm;
  };
  struct BlockActs {  // one layer's saved activations for one micro-batch
    T *xa, *rstd_a, *q, *k, *v, *probs, *att, *h, *xf, *rstd_f, *ffn;
  };

  void block_forward(int64_t l, const T* x_in, T* x_out, const BlockActs& a, int64_t B);
  void block_backward(int64_t l, const T* x_in, T* dres, const BlockActs& a, int64_t B);
  BlockActs carve_acts(T*& cursor) const;
  int64_t acts_size() const;

  Ops<T>& ops_;
  ModelShape shape_;
  int64_t T_, max_batch_;
  Recompute recompute_;
  ParamTable table_;
  std::vector<std::unique_ptr<FeedForward<T>>> ffn_;
  std::vector<T> params_, grads_;
  std::vector<BlockWeights> blocks_;
  const T *embed_ = nullptr, *out_norm_ = nullptr, *head_ = nullptr;
  T *d_embed_ = nullptr, *d_out_norm_ = nullptr, *d_head_ = nullptr;

  // Activations: x_in of every layer plus the final x; per-layer acts (or one shared set when recomputing).
  std::vector<T> arena_;
  std::vector<T*> x_;            // L + 1 pointers, (N, D) each
  std::vector<BlockActs> acts_;  // L entries (all equal when recomputing)
  T *xo_, *rstd_o_, *logits_, *ffn_out_;
  std::vector<T> losses_;
  // Backward scratch shared by all layers.
  std::vector<T> scratch_;
  T *dres_, *dtmp_, *dq_, *dk_, *dv_, *datt_, *dlogits_, *attn_scratch_, *ffn_scratch_;
  std::vector<int32_t> inputs_, targets_;
  int64_t last_batch_ = 0;
  FfnContext context_;
  GradReadyHook grad_ready_;
  // Spec index ranges of the table: the embedding, each layer, the output norm and head.
  std::pair<int64_t, int64_t> embed_specs_, head_specs_;
  std::vector<std::pair<int64_t, int64_t>> layer_specs_;
};

}  // namespace moe
