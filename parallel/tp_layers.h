// The tensor-parallel layers (docs/parallel.md "Tensor parallelism"): each wraps the shard of a core layer
// (heads, hidden units or a vocabulary block; core/attention.h, core/ffn.h, core/embedding.h) with the
// conjugate mappings of tp_mappings.h around it, as Megatron-Core's ColumnParallelLinear and
// RowParallelLinear do:
//
//   with sequence parallelism (the residual stream holds this rank's R = N / tp rows):
//     forward:  x (R, D) -gather_rows-> (N, D) -shard-> partial (N, D) -reduce_scatter_rows-> (R, D)
//     backward: dy (R, D) -gather-> (N, D) -shard backward-> partial dx (N, D) -reduce_scatter-> (R, D)
//   without (every rank holds all N rows, the same values):
//     forward:  x (N, D) -copy_to_region-> shard -> partial (N, D) -reduce_from_region (all-reduce)-> (N, D)
//     backward: dy (N, D) -shard backward-> partial dx -all-reduce (copy_to_region's backward)-> (N, D)
//
// The MoE layer is not wrapped: under sequence parallelism its routing group is split over the tp ranks
// (MoeSettings::token_shards) and each computes its own tokens' experts; without it, TokenSplitFfn gives
// it a block of the rows. Layers' workspace (not per micro-batch state) is kept across calls. Float or double.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "core/attention.h"
#include "core/embedding.h"
#include "core/ffn.h"
#include "core/model.h"
#include "core/moe_layer.h"
#include "core/sizes.h"
#include "parallel/communicator.h"

namespace moe {

// The tensor-parallel group as the layers see it: `comm`, the group's data-plane communicator, moves backend memory
// (activations, partial gradients, the vocabulary-parallel cross-entropy's row maxima and sums).
struct TpContext {
  Communicator* comm = nullptr;
  bool sequence_parallel = true;
  TpShard shard() const { return {comm->size(), comm->rank()}; }
  // The rows of a micro-batch of N tokens this rank's residual stream holds, and back.
  int64_t rows(int64_t N) const { return sequence_parallel ? N / comm->size() : N; }
  int64_t tokens(int64_t rows) const { return sequence_parallel ? rows * comm->size() : rows; }
};

// Attention with this rank's heads: column-parallel q, k, v, row-parallel output projection.
template <typename T>
class TpAttention final : public Attention<T> {
 public:
  // kv_heads: the key/value heads of the whole layer (0: heads), kv_heads / tp of them on this rank.
  TpAttention(Backend& backend, TpContext tp, int64_t d_model, int64_t heads, int64_t seq_len, int64_t layers_total,
              int64_t kv_heads = 0);
  void register_params(ParamTable& table, const std::string& prefix) override { inner_.register_params(table, prefix); }
  void bind(const ParamTable& table, T* params, T* grads) override { inner_.bind(table, params, grads); }
  void set_keep_probabilities(bool keep) override { inner_.set_keep_probabilities(keep); }
  void set_precision(GemmPrecision precision) override { inner_.set_precision(precision); }
  // Without sequence parallelism the shard keeps its input as MhaAttention does (bf16 GEMMs: rounded once).
  bool keeps_input() const override { return inner_.keeps_input(); }
  Rounded<T>* held_input(T* acts, int64_t R) const override { return inner_.held_input(acts, tp_.tokens(R)); }
  // The shard's activations: under sequence parallelism the input's rows are all-gathered again in backward, not
  // kept (as Megatron-Core does), so sequence parallelism saves their memory.
  int64_t activation_size(int64_t R) const override { return inner_.activation_size(tp_.tokens(R)); }
  // Under sequence parallelism the gathered input, output gradient and partial input gradient (N, D) each,
  // then the shard's scratch.
  int64_t scratch_size(int64_t R) const override;
  double forward_flops(int64_t R) const override { return inner_.forward_flops(tp_.tokens(R)); }
  void forward(const T* x, T* y, T* acts, T* scratch, int64_t B) override;
  void backward(const T* x, const T* dy, T* dx, const T* acts, T* scratch, int64_t B) override;

 private:
  Backend& backend_;
  Ops<T>& ops_;
  TpContext tp_;
  int64_t D_, T_;
  MhaAttention<T> inner_;
  Buffer work_;  // the partial output, the gathered input (N, D) and the summed rows of one forward
};

// The dense SwiGLU MLP with this rank's hidden units: column-parallel W1, W3, row-parallel W2.
template <typename T>
class TpMlp final : public FeedForward<T> {
 public:
  TpMlp(Backend& backend, TpContext tp, int64_t d_model, int64_t hidden, int64_t layers_total);
  void register_params(ParamTable& table, const std::string& prefix) override { inner_.register_params(table, prefix); }
  void set_precision(GemmPrecision precision) override { inner_.set_precision(precision); }
  void bind(const ParamTable& table, T* params, T* grads) override { inner_.bind(table, params, grads); }
  int64_t activation_size(int64_t R) const override { return inner_.activation_size(tp_.tokens(R)); }
  int64_t scratch_size(int64_t R) const override;  // as TpAttention's
  double forward_flops(int64_t R) const override { return inner_.forward_flops(tp_.tokens(R)); }
  using FeedForward<T>::forward;
  using FeedForward<T>::backward;
  void forward(const FfnContext& context, const T* x, T* y, T* acts, FfnSlot* slot, int64_t R) override;
  void backward(const FfnContext& context, const T* x, const T* dy, T* dx, const T* acts, FfnSlot* slot, T* scratch,
                int64_t R) override;

 private:
  Backend& backend_;
  Ops<T>& ops_;
  TpContext tp_;
  int64_t D_;
  DenseMlp<T> inner_;
  Buffer work_;
};

// Without sequence parallelism every tp rank holds all N rows: gives the wrapped FFN (an MoE layer whose
// routing group is split over the tp ranks) this rank's block of N / tp rows, and all-gathers its output.
// The input and output are replicated, so their gradients are whole on every rank: the backward takes
// this rank's block of dy and all-gathers the blocks of dx.
template <typename T>
class TokenSplitFfn final : public FeedForward<T> {
 public:
  TokenSplitFfn(Backend& backend, Communicator& tp, int64_t d_model, std::unique_ptr<FeedForward<T>> inner);
  void register_params(ParamTable& table, const std::string& prefix) override {
    inner_->register_params(table, prefix);
  }
  void set_precision(GemmPrecision precision) override { inner_->set_precision(precision); }
  void bind(const ParamTable& table, T* params, T* grads) override { inner_->bind(table, params, grads); }
  int64_t activation_size(int64_t N) const override { return inner_->activation_size(N / tp_.size()); }
  int64_t scratch_size(int64_t N) const override { return inner_->scratch_size(N / tp_.size()); }
  double forward_flops(int64_t N) const override { return inner_->forward_flops(N / tp_.size()); }
  std::unique_ptr<FfnSlot> make_slot() const override { return inner_->make_slot(); }
  RouterStepStats* router_stats() override { return inner_->router_stats(); }
  double router_loss(const FfnSlot* slot) const override { return inner_->router_loss(slot); }
  using FeedForward<T>::forward;
  using FeedForward<T>::backward;
  void forward(const FfnContext& context, const T* x, T* y, T* acts, FfnSlot* slot, int64_t N) override;
  void backward(const FfnContext& context, const T* x, const T* dy, T* dx, const T* acts, FfnSlot* slot, T* scratch,
                int64_t N) override;
  FeedForward<T>& inner() { return *inner_; }

 private:
  Backend& backend_;
  Communicator& tp_;
  int64_t width_;
  std::unique_ptr<FeedForward<T>> inner_;
  Buffer work_;  // the block's output or input gradient
};

// An MoE layer whose experts' hidden width is split over the tp ranks (MoeSettings::expert_tp,
// parallel.expert_tp = tp) as a tensor-parallel region: every rank takes the whole routing group's rows
// (all-gathered under sequence parallelism), routes them all alike, computes its hidden block of every
// expert for them, and the partial outputs are summed (reduce-scattered to its rows under sequence
// parallelism). The input is gathered again in backward, not kept.
template <typename T>
class ExpertTpFfn final : public FeedForward<T> {
 public:
  ExpertTpFfn(Backend& backend, TpContext tp, int64_t d_model, std::unique_ptr<FeedForward<T>> inner);
  void register_params(ParamTable& table, const std::string& prefix) override {
    inner_->register_params(table, prefix);
  }
  void set_precision(GemmPrecision precision) override { inner_->set_precision(precision); }
  void bind(const ParamTable& table, T* params, T* grads) override { inner_->bind(table, params, grads); }
  int64_t activation_size(int64_t R) const override { return inner_->activation_size(tp_.tokens(R)); }
  // The gathered input and output gradient and the partial input gradient (N, D) each, then the inner's.
  int64_t scratch_size(int64_t R) const override;
  double forward_flops(int64_t R) const override { return inner_->forward_flops(tp_.tokens(R)); }
  std::unique_ptr<FfnSlot> make_slot() const override { return inner_->make_slot(); }
  RouterStepStats* router_stats() override { return inner_->router_stats(); }
  double router_loss(const FfnSlot* slot) const override { return inner_->router_loss(slot); }
  using FeedForward<T>::forward;
  using FeedForward<T>::backward;
  void forward(const FfnContext& context, const T* x, T* y, T* acts, FfnSlot* slot, int64_t R) override;
  void backward(const FfnContext& context, const T* x, const T* dy, T* dx, const T* acts, FfnSlot* slot, T* scratch,
                int64_t R) override;
  FeedForward<T>& inner() { return *inner_; }

 private:
  Backend& backend_;
  Ops<T>& ops_;
  TpContext tp_;
  int64_t D_;
  std::unique_ptr<FeedForward<T>> inner_;
  Buffer work_;  // the gathered input and the partial output of one forward
};

// The embedding with this rank's block of the vocabulary: each rank embeds the tokens of its block (zero
// rows for the others), and the partial sums are reduced (scattered by rows under sequence parallelism).
template <typename T>
class VocabParallelEmbedding final : public Embedding<T> {
 public:
  VocabParallelEmbedding(Backend& backend, TpContext tp, int64_t vocab, int64_t d_model);
  void register_params(ParamTable& table) override { inner_.register_params(table); }
  void bind(const ParamTable& table, T* params, T* grads) override { inner_.bind(table, params, grads); }
  void forward(const int32_t* tokens, T* x, int64_t N) override;
  void backward(const int32_t* tokens, const T* dx, int64_t N) override;

 private:
  Backend& backend_;
  Ops<T>& ops_;
  TpContext tp_;
  int64_t D_;
  TokenEmbedding<T> inner_;
  Buffer work_;
};

// The output head with this rank's block of the vocabulary's columns and the vocabulary-parallel
// cross-entropy (vocab_parallel.h): no rank holds the whole logits.
template <typename T>
class VocabParallelHead final : public OutputHead<T> {
 public:
  VocabParallelHead(Backend& backend, TpContext tp, int64_t vocab, int64_t d_model);
  void register_params(ParamTable& table) override;
  void set_precision(GemmPrecision precision) override { precision_ = precision; }
  void bind(const ParamTable& table, T* params, T* grads) override;
  // The block's logits (N, Vl) and their log-sum-exp (N) and, under bf16 GEMMs without sequence parallelism, the
  // input held rounded (N, D): every rank has all N rows then (under sequence parallelism it gathers them again).
  int64_t activation_size(int64_t N) const override { return sizes::elements(footprint(N).activations); }
  bool keeps_input() const override { return held() && !tp_.sequence_parallel; }
  Rounded<T>* held_input(T* acts, int64_t N) const override {
    return keeps_input() ? reinterpret_cast<Rounded<T>*>(acts + N * Vl_ + N) : nullptr;
  }
  // The block's logit gradients (N, Vl), the input's partial gradient (N, D) and, under sequence
  // parallelism, the input gathered again (N, D).
  int64_t scratch_size(int64_t N) const override { return sizes::elements(footprint(N).scratch); }
  double forward_flops(int64_t N) const override { return 2.0 * double(N) * double(D_) * double(Vl_); }
  void forward(const T* xo, const int32_t* targets, T* losses, T* acts, int64_t N) override;
  void backward(const T* xo, const int32_t* targets, T scale, const T* acts, T* scratch, T* dxo, int64_t N) override;

 private:
  Backend& backend_;
  Ops<T>& ops_;
  // Under bf16 GEMMs the logits' gradient is written held rounded for its only readers, the two GEMMs.
  bool held() const { return precision_ == GemmPrecision::Bf16; }
  sizes::Footprint footprint(int64_t N) const {
    return sizes::vocab_parallel_head(double(N), double(Vl_), double(D_), tp_.sequence_parallel, held_size<T>(held()));
  }
  // The elements of scratch the logits' gradient takes.
  int64_t dlogits_size(int64_t N) const {
    return sizes::elements(sizes::held_or_stored(double(N) * double(Vl_), held_size<T>(held())));
  }

  TpContext tp_;
  int64_t V_, Vl_, D_;
  GemmPrecision precision_ = GemmPrecision::Fp32;
  Buffer work_;  // the gathered input of one forward
  const T* weight_ = nullptr;
  T* grad_ = nullptr;
};

// The model over the tensor-parallel group, as the trainer, the tests and the benchmark build it. With a
// group of one rank each gives the serial model's parts (the default layout, a null attention factory, the
// core layers).
//
// The model's layout: its shard, sequence parallelism, and the vocabulary-parallel embedding and head.
template <typename T>
TensorParallelLayout<T> tensor_parallel_layout(Backend& backend, TpContext tp, const ModelShape& shape);
// Attention with each rank's heads, for every layer.
template <typename T>
typename Model<T>::AttentionFactory tp_attention_factory(Backend& backend, TpContext tp, const ModelShape& shape,
                                                         int64_t seq_len);
// The FFNs: layer l is an MoE layer with moe_settings(l) when it gives settings, else the dense SwiGLU MLP of
// shape.ffn_hidden split by hidden units. The MoE layer's routing group is split over the tp ranks
// (token_shards set here; without sequence parallelism in a TokenSplitFfn), or, when the settings ask for
// expert_tp > 1 (= tp), its experts' hidden width (expert_tp_rank set here; in an ExpertTpFfn).
using MoeSettingsOf = std::function<std::optional<MoeSettings>(int64_t layer)>;
template <typename T>
typename Model<T>::FfnFactory tp_ffn_factory(Backend& backend, TpContext tp, const ModelShape& shape,
                                             MoeSettingsOf moe_settings);
// Sums over tp the gradients of the tensors marked partial_over_tp (before the optimizer).
template <typename T>
void reduce_partial_over_tp(const ParamTable& table, T* grads, Communicator& tp);
// The MoE layer inside an FFN (itself, or wrapped by TokenSplitFfn); nullptr for a dense FFN.
template <typename T>
MoeLayer<T>* moe_layer_of(FeedForward<T>& ffn);

}  // namespace moe
