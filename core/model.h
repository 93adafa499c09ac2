// The decoder-only language model of MODEL.md: embedding, L layers of (RMSNorm, rotary causal attention,
// residual, RMSNorm, FFN slot, residual), output RMSNorm and untied head, cross-entropy. Forward and
// backward are explicit and read like the math; the FFN strategy is chosen once at construction.
// The model owns its flat parameter and gradient buffers (carved by the parameter table) and
// `num_slots` micro-batch slots: each an activation arena for up to `max_batch` sequences plus every
// FFN's per-micro-batch state, so several micro-batches can be forwarded before their backwards (1F1B).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "core/backend/backend.h"
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

  // Every buffer (parameters, gradients, activations, scratch) is allocated through `backend`.
  Model(Backend& backend, const ModelShape& shape, int64_t seq_len, int64_t max_batch, Recompute recompute,
        FfnFactory ffn_factory = nullptr, int num_slots = 1);

  const ModelShape& shape() const { return shape_; }
  const ParamTable& table() const { return table_; }
  // The flat buffers, in the backend's memory.
  T* params() { return params_.template data<T>(); }
  T* grads() { return grads_.template data<T>(); }
  const T* params() const { return params_.template data<T>(); }
  const T* grads() const { return grads_.template data<T>(); }
  Backend& backend() const { return backend_; }
  int64_t num_params() const { return table_.numel(); }

  // Initialised on the host (a pure function of the seed), then copied to the backend once.
  void init_params(uint64_t seed);
  void zero_grads();

  int num_slots() const { return int(slots_.size()); }
  // tokens: (B, T+1) rows, B <= max_batch; inputs are columns [0, T), targets columns [1, T].
  // Returns the sum over the B*T tokens of -log p(target). Keeps what backward needs in `slot`, with
  // the context of the last set_context().
  double forward(int slot, const int32_t* tokens, int64_t B);
  // After forward into `slot`: accumulates d(loss_scale * sum of its token losses)/d(params) into grads().
  // Slots are independent: backwards may run in any order after their forwards.
  void backward(int slot, double loss_scale);
  // Per-token losses of the forward in `slot`: (B*T), in the backend's memory.
  const T* token_losses(int slot) const { return slots_[size_t(slot)].losses.template data<T>(); }
  // Router losses of the forward in `slot`, summed over MoE layers (coefficients applied, unweighted).
  double router_loss(int slot) const;
  // The state layer `layer`'s FFN keeps for the micro-batch in `slot` (nullptr for a dense FFN).
  const FfnSlot* ffn_slot(int slot, int64_t layer) const { return slots_[size_t(slot)].ffn[size_t(layer)].get(); }

  // One micro-batch at a time: slot 0.
  double forward(const int32_t* tokens, int64_t B) { return forward(0, tokens, B); }
  void backward(double loss_scale) { backward(0, loss_scale); }
  const T* token_losses() const { return token_losses(0); }
  double last_router_loss() const { return router_loss(0); }

  // Matmul FLOPs of one forward over B sequences (attention included), for throughput figures.
  double forward_flops(int64_t B) const;

  // What the next forwards are: training or evaluation, the optimizer step, the global index of the
  // micro-batch's first sequence within the step, and the weight of one routing group's router losses
  // in the step's loss (1 / routing groups per step). Passed to every FFN.
  void set_context(bool training, int64_t step, int64_t first_sequence, double router_loss_scale, uint64_t seed);
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

  // One micro-batch in flight: its inputs, activations, FFN states and the context of its forward.
  struct Slot {
    Buffer arena;
    std::vector<T*> x;            // L + 1 pointers, (N, D) each: each layer's input, then the final x
    std::vector<BlockActs> acts;  // L entries (all the model's shared set when recomputing)
    T *xo = nullptr, *rstd_o = nullptr, *logits = nullptr;
    Buffer losses;                              // (N)
    Buffer inputs, targets;                     // (N) token ids
    std::vector<int32_t> host_tokens;           // (2 N) inputs then targets, staged on the host
    std::vector<std::unique_ptr<FfnSlot>> ffn;  // L entries
    FfnContext context;
    int64_t batch = 0;  // 0: no forward yet
  };

  void make_slot(Slot& slot);
  Slot& checked_slot(int slot);
  void block_forward(int64_t l, const FfnContext& context, Slot& s, int64_t B);
  void block_backward(int64_t l, const FfnContext& context, Slot& s, T* dres, int64_t B);
  BlockActs carve_acts(T*& cursor) const;
  int64_t acts_size() const;

  Backend& backend_;
  Ops<T>& ops_;
  ModelShape shape_;
  int64_t T_, max_batch_;
  Recompute recompute_;
  ParamTable table_;
  std::vector<std::unique_ptr<FeedForward<T>>> ffn_;
  Buffer params_, grads_;
  std::vector<BlockWeights> blocks_;
  const T *embed_ = nullptr, *out_norm_ = nullptr, *head_ = nullptr;
  T *d_embed_ = nullptr, *d_out_norm_ = nullptr, *d_head_ = nullptr;

  std::vector<Slot> slots_;
  // Recompute::Full: one set of layer activations shared by every layer of every slot, since each
  // layer's forward is run again just before its backward.
  Buffer shared_acts_;
  // Scratch of one forward or backward call, shared by all layers and slots.
  Buffer scratch_;
  T *ffn_out_, *dres_, *dtmp_, *dq_, *dk_, *dv_, *datt_, *dlogits_, *attn_scratch_, *ffn_scratch_;
  FfnContext context_;  // of the next forwards
  GradReadyHook grad_ready_;
  // Spec index ranges of the table: the embedding, each layer, the output norm and head.
  std::pair<int64_t, int64_t> embed_specs_, head_specs_;
  std::vector<std::pair<int64_t, int64_t>> layer_specs_;
};

}  // namespace moe
