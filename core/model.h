// The decoder-only language model of docs/model.md: embedding, L layers of (RMSNorm, attention, residual,
// RMSNorm, FFN, residual), output RMSNorm and untied head, cross-entropy. Forward and backward are
// explicit and read like the math; attention and FFN are layers made by factories at construction
// (default: multi-head rotary causal attention, dense SwiGLU MLP).
// A pipeline stage is the same class with parts absent: layers [first, last) of the model, with the
// embedding and the head optional (StageSpec); its parameter table holds only its own parameters, under
// the whole model's names. The model owns its flat parameter and gradient buffers (carved by the
// parameter table) and `num_slots` micro-batch slots: each an activation arena for up to `max_batch`
// sequences plus every layer's per-micro-batch state, so several micro-batches can be forwarded before
// their backwards (1F1B). Activation recompute (RecomputeSpec) is chosen per layer at construction.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "core/attention.h"
#include "core/backend/backend.h"
#include "core/embedding.h"
#include "core/ffn.h"
#include "core/loss_staging.h"
#include "core/params.h"
#include "core/recompute.h"
#include "core/state.h"

namespace moe {

struct ModelShape {
  int64_t vocab = 256;
  int64_t d_model = 128;
  int64_t layers = 4;
  int64_t heads = 4;
  int64_t ffn_hidden = 384;
  int64_t kv_heads = 0;  // key/value heads of grouped-query attention (0: heads; core/attention.h)
  int64_t head_dim() const { return d_model / heads; }
};

// Which part of the model this object holds: layers [first_layer, last_layer) (last_layer -1: through the
// last layer), the embedding (the first stage) and the output norm, head and loss (the last stage). The
// default is the whole model.
struct StageSpec {
  int64_t first_layer = 0, last_layer = -1;
  bool embedding = true, head = true;
};

// The model over a tensor-parallel group (docs/parallel.md): which shard this rank is, whether the residual
// stream is split by rows (sequence parallelism: each rank holds N / tp of a micro-batch's N token rows, and
// norms and residuals work on those), and the factories of the embedding and head (nullptr: the whole
// vocabulary's). The attention and FFN factories make the tensor-parallel layers. The default: no split.
template <typename T>
struct TensorParallelLayout {
  TpShard shard;
  bool sequence_parallel = false;
  std::function<std::unique_ptr<Embedding<T>>()> embedding;
  std::function<std::unique_ptr<OutputHead<T>>()> head;
};

// What a model is built with, by name (`{.shape = s, .seq_len = T, .max_batch = B, .recompute = Recompute::Full}`;
// designated initializers keep this order). Layer indices (the factories', recompute.layers) are the whole model's.
template <typename T>
struct ModelOptions {
  // Builds the FFN of layer l; the default is the dense SwiGLU MLP.
  using FfnFactory = std::function<std::unique_ptr<FeedForward<T>>(int64_t layer)>;
  // Builds the attention of layer l; the default is MhaAttention.
  using AttentionFactory = std::function<std::unique_ptr<Attention<T>>(int64_t layer)>;

  ModelShape shape;
  int64_t seq_len = 0;    // T: tokens per sequence
  int64_t max_batch = 0;  // B: the most sequences of one micro-batch
  RecomputeSpec recompute;
  FfnFactory ffn_factory = nullptr;
  int num_slots = 1;  // micro-batches in flight (forwarded, backward pending)
  StageSpec stage;
  AttentionFactory attention_factory = nullptr;
  TensorParallelLayout<T> tp;
  // How the layers' GEMMs read their operands (train.precision): each layer is told once, at construction, and
  // states it on every GEMM it asks the backend for (the routers' stay fp32).
  GemmPrecision precision = GemmPrecision::Fp32;
  // Forwards whose per-token losses one read covers while staging (stage_losses; the trainer's micro-batches per
  // step), each of up to max_batch sequences; 0: a staged forward's losses are read at once.
  int64_t loss_sections = 0;
};

template <typename T>
class Model : public Stateful {
 public:
  using FfnFactory = typename ModelOptions<T>::FfnFactory;
  using AttentionFactory = typename ModelOptions<T>::AttentionFactory;

  // Every buffer (parameters, gradients, activations, scratch) is allocated through `backend`. Layer
  // indices (ffn(), ffn_slot()) are the whole model's.
  Model(Backend& backend, ModelOptions<T> options);
  Model(const Model&) = delete;  // its layers point into its own table and buffers
  Model& operator=(const Model&) = delete;

  const ModelShape& shape() const { return shape_; }
  // The parameter table and flat buffers the model's layers are bound to (its own, or shared ones).
  const ParamTable& table() const { return *bound_.table; }
  // The flat buffers, in the backend's memory.
  T* params() { return bound_.params; }
  T* grads() { return bound_.grads; }
  const T* params() const { return bound_.params; }
  const T* grads() const { return bound_.grads; }
  Backend& backend() const { return backend_; }
  int64_t num_params() const { return table().numel(); }
  // The model chunks of one interleaved pipeline rank keep their parameters in one table and one pair of
  // flat buffers, so the optimizer, the gradient buckets and the checkpoint see the rank's parameters as one
  // model's. Binds every layer into `params` and `grads`, carved by `table`, which holds this model's specs
  // (under the same names, in the same order) from spec `first_spec` on, and frees the model's own buffers.
  // Afterwards table(), params(), grads(), num_params(), init_params() and zero_grads() are the shared
  // memory's, and the grad-ready hook counts specs of `table`. `table` and the buffers must outlive the model.
  void share_parameters(const ParamTable& table, int64_t first_spec, T* params, T* grads);
  // Frees the model's own parameter and gradient buffers ahead of share_parameters, so that a rank's chunks do
  // not hold them and the shared pair at once. Until share_parameters binds the model again, it must not run.
  void release_parameters();
  // The residual-stream rows this rank holds of a micro-batch of N tokens: N / tp under sequence
  // parallelism, else N.
  int64_t rows(int64_t N) const { return tp_.sequence_parallel ? N / tp_.shard.size : N; }
  const TensorParallelLayout<T>& tensor_parallel() const { return tp_; }

  // Initialised on the host (a pure function of the seed), then copied to the backend once.
  void init_params(uint64_t seed);
  // Checkpoint state: each parameter's block, "params/<name>" (core/model_state.cpp).
  std::vector<StatePiece> state_pieces(StateUse use) override;
  void state_restored() override;
  void zero_grads();

  int num_slots() const { return int(slots_.size()); }
  // The recompute mode of layer `layer` (a global index within the stage).
  Recompute recompute(int64_t layer) const { return recompute_[size_t(local(layer))]; }
  // Bytes of activation memory: every slot's arena (each layer's input and output, the saved activations
  // of the layers that are not fully recomputed, the head's) and the one set Full layers share: the memory
  // recompute reduces. Neither the scratch nor the FFNs' routing state.
  int64_t activation_bytes() const;
  // Bytes of the scratch of one forward or backward call, shared by all layers and slots (it holds the
  // probabilities selective recompute rebuilds).
  int64_t scratch_bytes() const { return int64_t(scratch_.bytes()); }
  // tokens: (B, T+1) rows, B <= max_batch; inputs are columns [0, T), targets columns [1, T].
  // Returns the sum over the B*T tokens of -log p(target) (0 for a stage without the head). Keeps what
  // backward needs in `slot`, with the context of the last set_context(). Needs the embedding.
  double forward(int slot, const int32_t* tokens, int64_t B);
  // A stage without the embedding: `input_activation` is its first layer's input (rows(B*T), D), in the
  // backend's memory, copied into the slot (nullptr when the stage has the embedding). tokens as above:
  // the head needs the targets.
  double forward(int slot, const int32_t* tokens, int64_t B, const T* input_activation);
  // After forward into `slot`: accumulates d(loss_scale * sum of its token losses)/d(params) into grads().
  // Slots are independent: backwards may run in any order after their forwards. Needs the head.
  void backward(int slot, double loss_scale);
  // A stage without the head: `output_grad` is the gradient (rows(B*T), D) of its output activation, in the
  // backend's memory (nullptr when the stage has the head; loss_scale then scales its loss).
  void backward(int slot, double loss_scale, const T* output_grad);
  // The last layer's output (rows(B*T), D) of the forward in `slot`: what the next stage takes as input.
  const T* output_activation(int slot) const { return slots_[size_t(slot)].x.back(); }
  // A stage without the embedding, after backward of `slot`: the gradient (rows(B*T), D) of its input activation,
  // what the previous stage's backward takes (nullptr when the stage has the embedding).
  const T* input_grad(int slot) const { return slots_[size_t(slot)].input_grad.template data<T>(); }
  // Per-token losses read once for many forwards (docs/gpu.md "Host synchronisations"; a stage with the head): after
  // stage_losses(), each forward leaves its losses on the backend (core/loss_staging.h) and returns NaN, its sum not
  // known yet; staged_losses() reads them and returns each forward's sum in order, the bits forward returns
  // unstaged, and ends the staging.
  void stage_losses();
  std::vector<double> staged_losses();
  // Per-token losses of the forward in `slot`: (B*T), in the backend's memory (a stage with the head).
  const T* token_losses(int slot) const { return slots_[size_t(slot)].losses.template data<T>(); }
  // The logits (B*T, V) of the forward in `slot`, in the backend's memory: a stage with the whole vocabulary's
  // head (LmHead, whose activations they are; a vocabulary-parallel head holds only its block).
  const T* logits(int slot) const;
  // Router losses of the forward in `slot`, summed over MoE layers (coefficients applied, unweighted).
  double router_loss(int slot) const;
  // The state layer `layer`'s FFN keeps for the micro-batch in `slot` (nullptr for a dense FFN).
  const FfnSlot* ffn_slot(int slot, int64_t layer) const {
    return slots_[size_t(slot)].ffn[size_t(local(layer))].get();
  }

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
  FeedForward<T>& ffn(int64_t layer) { return *ffn_[size_t(local(layer))]; }
  Attention<T>& attention(int64_t layer) { return *attn_[size_t(local(layer))]; }
  // Called during backward with a range [first, end) of parameter-table specs whose gradients are final
  // for this backward (output head, then each layer from the last, then the embedding), so gradient
  // communication can start while backward goes on. Empty: no calls.
  using GradReadyHook = std::function<void(int64_t first_spec, int64_t end_spec)>;
  void set_grad_ready_hook(GradReadyHook hook) { grad_ready_ = std::move(hook); }
  // Layers of the whole model; this object holds [first_layer(), end_layer()).
  int64_t num_layers() const { return shape_.layers; }
  int64_t first_layer() const { return first_; }
  int64_t end_layer() const { return end_; }
  const StageSpec& stage() const { return stage_; }

 private:
  struct BlockWeights {  // pointers into params_ / grads_ for one layer's norms
    const T *attn_norm, *ffn_norm;
    T *d_attn_norm, *d_ffn_norm;
  };
  struct BlockActs {  // one layer's saved activations for one micro-batch; xa null where the attention keeps its input
    T *xa = nullptr, *rstd_a = nullptr, *attn = nullptr, *h = nullptr, *xf = nullptr, *rstd_f = nullptr, *ffn = nullptr;
  };

  // One micro-batch in flight: its inputs, activations, FFN states and the context of its forward.
  struct Slot {
    Buffer arena;
    std::vector<T*> x;            // layers + 1 pointers, (N, D) each: each layer's input, then its output
    std::vector<BlockActs> acts;  // one per layer (the model's shared set for Full layers)
    T *xo = nullptr, *rstd_o = nullptr, *head_acts = nullptr;  // with the head
    Buffer losses;                                             // (N), with the head
    Buffer inputs, targets;                                    // (N) token ids
    Buffer input_grad;                                         // (N, D), without the embedding
    std::vector<int32_t> host_tokens;                          // (2 N) inputs then targets, staged on the host
    std::vector<std::unique_ptr<FfnSlot>> ffn;                 // one per layer
    FfnContext context;
    int64_t batch = 0;  // 0: no forward yet
  };

  void build_layers(const FfnFactory& ffn_factory, const AttentionFactory& attention_factory, GemmPrecision precision);
  void bind_parameters(const ParamTable& table, T* params, T* grads);
  void make_scratch();
  void make_slot(Slot& slot);
  Slot& checked_slot(int slot);
  int64_t local(int64_t layer) const;
  int64_t stage_layers() const { return end_ - first_; }
  void stage_inputs(Slot& s, const int32_t* tokens, int64_t B);
  double head_forward(Slot& s, int64_t N);
  // The output norm of B sequences' stream x (+ r), writing the head's input (model.cpp).
  void output_norm(const T* x, const T* r, T* sum, Slot& s, int64_t B);
  void head_backward(Slot& s, double loss_scale, int64_t N);
  void block_forward(int64_t i, const FfnContext& context, Slot& s, int64_t B);
  void block_backward(int64_t i, const FfnContext& context, Slot& s, T* dres, int64_t B);
  BlockActs carve_acts(int64_t i, T*& cursor) const;
  int64_t acts_size(int64_t i) const;

  Backend& backend_;
  Ops<T>& ops_;
  ModelShape shape_;
  int64_t T_, max_batch_;
  StageSpec stage_;
  int64_t first_, end_;               // the stage's layers
  std::vector<Recompute> recompute_;  // one per layer of the stage
  ParamTable table_;
  std::vector<std::unique_ptr<Attention<T>>> attn_;  // one per layer of the stage
  std::vector<std::unique_ptr<FeedForward<T>>> ffn_;
  TensorParallelLayout<T> tp_;
  std::unique_ptr<Embedding<T>> embedding_;  // with the embedding
  std::unique_ptr<OutputHead<T>> head_;      // with the head
  Buffer params_, grads_;                    // the model's own (empty once it shares another's: share_parameters)
  struct Bound {
    const ParamTable* table = nullptr;
    T *params = nullptr, *grads = nullptr;
  } bound_;
  int64_t spec_base_ = 0;  // the index of this model's first spec in bound_.table
  std::vector<T>
      host_params_;  // a checkpoint's copy of the parameters where the host cannot address the backend's memory
  std::vector<BlockWeights> blocks_;
  const T* out_norm_ = nullptr;
  T* d_out_norm_ = nullptr;

  std::vector<Slot> slots_;
  // Recompute::Full: one set of layer activations shared by every Full layer of every slot, since each
  // such layer's forward is run again just before its backward.
  Buffer shared_acts_;
  // Scratch of one forward or backward call, shared by all layers and slots.
  Buffer scratch_;
  T *ffn_out_ = nullptr, *dres_ = nullptr, *dtmp_ = nullptr;
  T* layer_scratch_ = nullptr;  // the attention's, the FFN's or the head's backward scratch
  FfnContext context_;          // of the next forwards
  GradReadyHook grad_ready_;
  std::unique_ptr<LossStaging<T>> loss_staging_;  // with the head
  bool staging_losses_ = false;
  // Spec index ranges of the table: the embedding, each layer of the stage, the output norm and head.
  std::pair<int64_t, int64_t> embed_specs_, head_specs_;
  std::vector<std::pair<int64_t, int64_t>> layer_specs_;
};

}  // namespace moe
