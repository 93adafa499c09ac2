// The attention of a transformer layer (docs/model.md: Attn_l), a layer made by a factory as the FFN is
// (core/ffn.h): parameters registered by name in the model's table and bound to its flat buffers; what one
// micro-batch leaves for its backward lives in activation memory the caller hands in (the model's arena,
// so activation recompute can share one set across layers); backward scratch is the caller's too. Shapes
// follow FeedForward's: x, y, dy, dx are (N, D) with N = B * seq_len. Under selective recompute
// (core/model.h Recompute::Selective) the attention keeps no probabilities: its backward recomputes them
// into its scratch. Where the backend runs the fused form for the shape (Ops::fused_attention_supported: cuDNN
// under bf16 GEMMs) MhaAttention keeps only each row's log-sum-exp and needs no (T, T) memory at all.
#pragma once

#include <cstdint>
#include <string>

#include "core/backend/backend.h"
#include "core/params.h"
#include "core/sizes.h"

namespace moe {

template <typename T>
class Attention {
 public:
  virtual ~Attention() = default;
  // Adds this layer's parameters to the table under `prefix` (e.g. "layers.3.attn").
  virtual void register_params(ParamTable& table, const std::string& prefix) = 0;
  // Points at the flat buffers once they exist (offsets come from the table).
  virtual void bind(const ParamTable& table, T* params, T* grads) = 0;
  // true (the default): forward saves the attention probabilities for backward. false: it does not, and
  // backward recomputes them from the saved q and k into its scratch (selective recompute). Set once, at
  // the model's construction, before the sizes below are asked for.
  virtual void set_keep_probabilities(bool keep) = 0;
  // How this layer's GEMMs read their operands (train.precision, through ModelOptions::precision; default fp32).
  // Set once, at the model's construction, before the sizes below are asked for.
  virtual void set_precision(GemmPrecision precision) = 0;
  // Whether the layer keeps what its backward reads of x in acts (MhaAttention under bf16 GEMMs: x rounded once):
  // then forward's x need not outlive the call and backward is given none (x null). Asked after set_precision.
  virtual bool keeps_input() const { return false; }
  // Where a layer keeping its input holds it rounded in acts, for N tokens (activation_size's N): its producer, the
  // norm before it, writes it there (Ops::rmsnorm_forward_residual_rounded: the norm and the cast in one pass), and
  // forward is then given x null. Null where the layer keeps no input.
  virtual Rounded<T>* held_input(T* acts, int64_t N) const { return nullptr; }
  // Elements of saved activations (acts) and of backward scratch for N tokens.
  virtual int64_t activation_size(int64_t N) const = 0;
  virtual int64_t scratch_size(int64_t N) const = 0;
  // Matmul FLOPs of one forward over N tokens (for throughput figures).
  virtual double forward_flops(int64_t N) const = 0;
  // x: (N, D) normalised input of B sequences; the attention's output is added to y (N, D), the residual
  // stream, so the residual sum is the output projection's own accumulation; acts: activation_size(N)
  // saved for backward; scratch: scratch_size(N), the caller's, free for the call (what is not kept).
  virtual void forward(const T* x, T* y, T* acts, T* scratch, int64_t B) = 0;
  // After forward on the same x and acts. dy: (N, D) gradient of the output; dx: (N, D) written; parameter
  // gradients accumulate; scratch: scratch_size(N).
  virtual void backward(const T* x, const T* dy, T* dx, const T* acts, T* scratch, int64_t B) = 0;
};

// Multi-head causal self-attention with rotary positions: q, k, v = x Wq, x Wk, x Wv, rotated,
// softmax(q k^T / sqrt(Dh)) v per head, then the output projection Wo (D, D). Wq is (D, H Dh); Wk and Wv are
// (D, Hkv Dh): with Hkv < H (grouped-query attention) query head h reads key and value head h / (H / Hkv),
// whose rotated k and v the layer expands to every head of its group (Ops::expand_heads) before the attention
// op; Hkv = H is plain multi-head attention, computed exactly as before the key existed.
// A tensor-parallel shard (block r of tp) holds heads [r H / tp, (r + 1) H / tp) and key and value heads
// [r Hkv / tp, (r + 1) Hkv / tp) (the ones its query heads read): the columns of Wq, Wk, Wv and the rows of
// Wo of those heads (column- and row-parallel), so its output is its heads' partial sum of the whole output;
// parallel/tp_layers.h sums it over the group.
template <typename T>
class MhaAttention final : public Attention<T> {
 public:
  // kv_heads: Hkv, a divisor of heads (0: heads).
  MhaAttention(Backend& backend, int64_t d_model, int64_t heads, int64_t seq_len, int64_t layers_total,
               TpShard shard = {}, int64_t kv_heads = 0);
  void register_params(ParamTable& table, const std::string& prefix) override;
  void bind(const ParamTable& table, T* params, T* grads) override;
  void set_keep_probabilities(bool keep) override { keep_probs_ = keep; }
  void set_precision(GemmPrecision precision) override { precision_ = precision; }
  // Under bf16 GEMMs the layer rounds each activation its GEMMs read once (Ops::round_values) and they read the
  // rounded copy (HeldRows): x for the three projections and their weight gradients, kept in acts when keep_input
  // (the default; the model's norm writes it there, held_input) or rounded again in backward from the x it is given; dy
  // for Wo's two products; dq, dk, dv for theirs, dq and dk rotated back as they are rounded (Ops::rope_rounded). It
  // keeps q, k, v and the attention's output held rounded too, q and k rotated as they are rounded, the output written
  // so by the attention op, which reads them all in place (cuDNN's fused form included). The same bits as rounding at
  // every GEMM and product. A tensor-parallel wrapper
  // gathering its input again in backward (sequence parallelism) sets keep_input false, so as not to keep all N rows.
  // Set before the sizes are asked for.
  void set_keep_input(bool keep) { keep_input_ = keep; }
  bool keeps_input() const override { return held() && keep_input_; }
  Rounded<T>* held_input(T* acts, int64_t N) const override {
    return keeps_input() ? rounded_input(acts, nullptr, N) : nullptr;
  }
  // q, k, v, the attention's output (N, Dq) each and, when kept, the probabilities (B, Hl, T, T), with Hl
  // the shard's heads and Dq their width; fused: the statistics (B, Hl, T) instead of the probabilities. Under bf16
  // GEMMs the probabilities or statistics first, then the four held rounded from a 256-byte boundary, then the held
  // input (sizes::mha).
  int64_t activation_size(int64_t N) const override { return sizes::elements(sizes::mha(shape(N), N).activations); }
  // dq, dk, dv, d(att) (N, Dq) each and, plain, one (T, T) block and, when not kept, the recomputed probabilities.
  int64_t scratch_size(int64_t N) const override { return sizes::elements(sizes::mha(shape(N), N).scratch); }
  double forward_flops(int64_t N) const override;
  void forward(const T* x, T* y, T* acts, T* scratch, int64_t B) override;
  void backward(const T* x, const T* dy, T* dx, const T* acts, T* scratch, int64_t B) override;

 private:
  int64_t probs_size(int64_t N) const { return N * Hl_ * T_; }  // B * Hl * T * T
  // The shard's shape for N tokens, as core/sizes.h declares its sizes.
  sizes::MhaShape shape(int64_t N) const {
    return {double(D_), double(Hl_),  double(Dq_),          double(T_),   keep_probs_,
            fused(N),   double(Dkv_), held_size<T>(held()), keeps_input()};
  }
  bool grouped() const { return Hkvl_ < Hl_; }
  bool held() const { return precision_ == GemmPrecision::Bf16; }
  // The held scratch (sizes::mha_held_scratch) at the end of the scratch: dy, or x not kept, (N, D), then dq, dk, dv.
  int64_t held_scratch_size(int64_t N) const { return sizes::elements(sizes::mha_held_scratch(shape(N), double(N))); }
  Rounded<T>* held_scratch(T* scratch, int64_t N) const {
    return reinterpret_cast<Rounded<T>*>(scratch + scratch_size(N) - held_scratch_size(N));
  }
  // The input held rounded: in acts after the rest when kept, else at the start of the held scratch.
  Rounded<T>* rounded_input(const T* acts, T* scratch, int64_t N) const;
  // Grouped: the key and value heads' gradients (N, Dkv) each, before the held scratch at the end of the backward's.
  T* kv_gradients(T* scratch, int64_t N) const {
    return scratch + scratch_size(N) - held_scratch_size(N) - 2 * N * Dkv_;
  }
  // q = x Wq, and the projections of k and v: grouped, into the start of the forward scratch (N, Dkv) each, then
  // rotated once per key head and expanded into k and v; else straight into them. X: Rows or HeldRows (core/linear.h).
  template <typename X>
  void project(const X& x, T* q, T* k, T* v, T* scratch, int64_t B);
  // The attention's operands an op reads: q, k, v as stored or held rounded (Ops' attention args).
  using Inputs = AttentionInputs<T>;
  // Under bf16 GEMMs q, k, v and the attention's output held rounded in acts (N, Dq) each, from a boundary of
  // kHeldAlignment bytes after the probabilities or statistics (the room for it in sizes::kMhaHeldPad): cuDNN reads
  // and writes them in place.
  struct Held {
    Rounded<T>*q, *k, *v, *att;
  };
  static constexpr uintptr_t kHeldAlignment = 256;
  Held held_tensors(const T* acts, int64_t N) const;
  void held_forward(const T* x, T* y, T* acts, T* scratch, int64_t B);
  void held_backward(const T* x, const T* dy, T* dx, const T* acts, T* scratch, int64_t B);
  // Held: q, k, v projected from the held input into the scratch, then rotated and rounded into h.
  void held_project(const Rounded<T>* xr, const Held& h, T* scratch, int64_t B);
  // The attention op (fused or plain) and its backward; saved: the probabilities or statistics in acts.
  void attend(const Inputs& in, T* out, Rounded<T>* out_rounded, T* saved, T* scratch, int64_t B);
  void attend_backward(const Inputs& in, const T* out, const Rounded<T>* out_rounded, const T* saved, const T* datt,
                       T* scratch, int64_t B);
  // Wo's products from the attention's output and dy (each as stored or held), datt = dy Wo^T written.
  template <typename A, typename Y>
  void output_backward(const A& att, const Y& dy, T* datt, int64_t N);
  // The projections' weight and input gradients from x and dq, dk, dv (as stored or held); dx written.
  template <typename X, typename Y>
  void projections_backward(const X& x, const Y& dq, const Y& dk, const Y& dv, T* dx, int64_t N);
  // Grouped: sums the expanded heads' gradients dk, dv into kv_gradients and points dk, dv at those sums.
  void reduce_kv_gradients(T*& dk, T*& dv, T* scratch, int64_t N);
  // Whether the backend runs the fused form for N tokens (B = N / T sequences); the backend keeps the answer.
  bool fused(int64_t N) const { return N > 0 && ops_.fused_attention_supported(shape_of(N / T_)); }
  // The attention op's shape for B sequences: the shard's heads at the layer's precision.
  AttentionShape shape_of(int64_t B) const { return {B, T_, Hl_, D_ / H_, precision_}; }
  // Probabilities not kept: in scratch after dq, dk, dv, d(att) and the (T, T) block.
  T* recomputed_probabilities(T* scratch, int64_t N) const { return scratch + 4 * N * Dq_ + T_ * T_; }

  Ops<T>& ops_;
  int64_t D_, H_, T_, L_;
  TpShard shard_;
  int64_t Hl_, Dq_;     // the shard's heads and their width
  int64_t Hkvl_, Dkv_;  // the shard's key and value heads and their width
  bool keep_probs_ = true, keep_input_ = true;
  GemmPrecision precision_ = GemmPrecision::Fp32;
  std::string prefix_;
  const T *wq_ = nullptr, *wk_ = nullptr, *wv_ = nullptr, *wo_ = nullptr;
  T *dwq_ = nullptr, *dwk_ = nullptr, *dwv_ = nullptr, *dwo_ = nullptr;
};

}  // namespace moe
