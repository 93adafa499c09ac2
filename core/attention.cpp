// Multi-head rotary causal attention: forward and explicit backward.
#include "core/attention.h"

#include <cmath>
#include <cstdint>

#include "core/error.h"
#include "core/linear.h"

namespace moe {

template <typename T>
MhaAttention<T>::MhaAttention(Backend& backend, int64_t d_model, int64_t heads, int64_t seq_len, int64_t layers_total,
                              TpShard shard, int64_t kv_heads)
    : ops_(backend.ops<T>()),
      D_(d_model),
      H_(heads),
      T_(seq_len),
      L_(layers_total),
      shard_(shard),
      Hl_(heads / shard.size),
      Dq_(d_model / heads * (heads / shard.size)),
      Hkvl_((kv_heads > 0 ? kv_heads : heads) / shard.size),
      Dkv_(d_model / heads * Hkvl_) {
  MOE_CHECK(heads > 0 && D_ % H_ == 0 && (D_ / H_) % 2 == 0, "d_model " << D_ << " and heads " << H_);
  MOE_CHECK(shard.size >= 1 && H_ % shard.size == 0 && shard.rank >= 0 && shard.rank < shard.size,
            heads << " heads over " << shard.size << " tensor-parallel ranks");
  const int64_t Hkv = kv_heads > 0 ? kv_heads : heads;
  MOE_CHECK(H_ % Hkv == 0 && Hkv % shard.size == 0,
            Hkv << " key/value heads for " << heads << " heads over " << shard.size << " tensor-parallel ranks");
}

template <typename T>
void MhaAttention<T>::register_params(ParamTable& table, const std::string& prefix) {
  prefix_ = prefix;
  const double out_std = 0.02 / std::sqrt(2.0 * double(L_));  // Wo scaled by 1/sqrt(2L) (docs/model.md)
  // Column-parallel q, k, v (this shard's heads' columns), row-parallel output projection (their rows).
  const int64_t kv_columns = Dkv_ * shard_.size;  // Hkv Dh
  for (auto [w, columns] : {std::pair{".wq", D_}, {".wk", kv_columns}, {".wv", kv_columns}})
    table.add(shard_.block_of({prefix + w, {D_, columns}, ParamRole::Dense, true, ParamInit::Normal, 0.02}, 1));
  table.add(shard_.block_of({prefix + ".wo", {D_, D_}, ParamRole::Dense, true, ParamInit::Normal, out_std}, 0));
}

template <typename T>
void MhaAttention<T>::bind(const ParamTable& table, T* params, T* grads) {
  const int64_t q = table.find(prefix_ + ".wq").offset, k = table.find(prefix_ + ".wk").offset,
                v = table.find(prefix_ + ".wv").offset, o = table.find(prefix_ + ".wo").offset;
  wq_ = params + q, wk_ = params + k, wv_ = params + v, wo_ = params + o;
  dwq_ = grads + q, dwk_ = grads + k, dwv_ = grads + v, dwo_ = grads + o;
}

template <typename T>
double MhaAttention<T>::forward_flops(int64_t N) const {
  const double n = double(N), D = double(D_), Dq = double(Dq_), Tq = double(T_);
  return 2 * n * D * (2 * Dq + 2 * double(Dkv_)) + 2 * 2 * n * Tq * Dq;
}

template <typename T>
void MhaAttention<T>::forward(const T* x, T* y, T* acts, T* scratch, int64_t B) {
  if (held()) return held_forward(x, y, acts, scratch, B);
  const int64_t N = B * T_, D = D_, Q = Dq_, Dh = D_ / H_;
  T *q = acts, *k = q + N * Q, *v = k + N * Q, *att = v + N * Q;
  project(Rows<const T>(x), q, k, v, scratch, B);
  ops_.rope(q, B, T_, Hl_, Dh, false);
  attend({.q = q, .k = k, .v = v}, att, nullptr, att + N * Q, scratch, B);
  Linear<T>(ops_, precision_).forward(att, wo_, y, N, Q, D, T(1));  // y += att Wo
}

// Under bf16 GEMMs: x rounded once (or by its norm), q, k, v projected into the scratch, rotated and rounded into
// acts in one pass each, the attention's output written held rounded there too, Wo reading it.
template <typename T>
void MhaAttention<T>::held_forward(const T* x, T* y, T* acts, T* scratch, int64_t B) {
  const int64_t N = B * T_, D = D_;
  const Held h = held_tensors(acts, N);
  Rounded<T>* xr = rounded_input(acts, scratch, N);
  MOE_CHECK(x || keep_input_, "attention forward: no input, and none kept (held_input)");
  if (x) ops_.round_values(x, xr, N * D);  // once for the projections (kept: their weight gradients); null: its norm's
  held_project(xr, h, scratch, B);
  attend({.q_rounded = h.q, .k_rounded = h.k, .v_rounded = h.v}, nullptr, h.att, acts, scratch, B);
  Linear<T>(ops_, precision_).forward(HeldRows<T>{h.att}, wo_, y, N, Dq_, D, T(1));  // y += att Wo
}

template <typename T>
Rounded<T>* MhaAttention<T>::rounded_input(const T* acts, T* scratch, int64_t N) const {
  if (!keep_input_) return held_scratch(scratch, N);
  const int64_t input = sizes::elements(sizes::mha_held_input(shape(N), double(N)));
  return reinterpret_cast<Rounded<T>*>(const_cast<T*>(acts) + activation_size(N) - input);
}

template <typename T>
template <typename X>
void MhaAttention<T>::project(const X& x, T* q, T* k, T* v, T* scratch, int64_t B) {
  const int64_t N = B * T_, D = D_, K = Dkv_, Dh = D_ / H_;
  T* kp = grouped() ? scratch : k;  // the forward does not use the scratch before the attention op's probabilities
  T* vp = grouped() ? scratch + N * K : v;
  const Linear<T> linear(ops_, precision_);
  linear.forward(x, wq_, q, N, D, Dq_);
  linear.forward(x, wk_, kp, N, D, K);
  linear.forward(x, wv_, vp, N, D, K);
  ops_.rope(kp, B, T_, Hkvl_, Dh, false);  // rotated once per key head, then copied to its group
  if (!grouped()) return;
  ops_.expand_heads(kp, k, N, Hkvl_, Hl_ / Hkvl_, Dh);
  ops_.expand_heads(vp, v, N, Hkvl_, Hl_ / Hkvl_, Dh);
}

// q = x Wq, k = x Wk, v = x Wv in fp32 at the start of the scratch (grouped: k and v projected after them, then
// expanded), then q and k rotated as they are rounded into acts (every expanded head alike: the same bits as
// rotating each key head once) and v rounded.
template <typename T>
void MhaAttention<T>::held_project(const Rounded<T>* xr, const Held& h, T* scratch, int64_t B) {
  const int64_t N = B * T_, D = D_, Q = Dq_, K = Dkv_, Dh = D_ / H_;
  T *q = scratch, *k = q + N * Q, *v = k + N * Q;
  T* kp = grouped() ? v + N * Q : k;
  T* vp = grouped() ? kp + N * K : v;
  const Linear<T> linear(ops_, precision_);
  const HeldRows<T> x{xr};
  linear.forward(x, wq_, q, N, D, Q);
  linear.forward(x, wk_, kp, N, D, K);
  linear.forward(x, wv_, vp, N, D, K);
  if (grouped()) {
    ops_.expand_heads(kp, k, N, Hkvl_, Hl_ / Hkvl_, Dh);
    ops_.expand_heads(vp, v, N, Hkvl_, Hl_ / Hkvl_, Dh);
  }
  ops_.rope_rounded(q, h.q, B, T_, Hl_, Dh, false);
  ops_.rope_rounded(k, h.k, B, T_, Hl_, Dh, false);
  ops_.round_values(v, h.v, N * Q);
}

// The attention op on q, k, v as given, its output as stored (out) or held rounded (out_rounded); saved: where the
// probabilities (when kept) or, fused, the statistics go.
template <typename T>
void MhaAttention<T>::attend(const Inputs& in, T* out, Rounded<T>* out_rounded, T* saved, T* scratch, int64_t B) {
  const int64_t N = B * T_;
  if (fused(N)) {
    ops_.attention_forward_fused(in.into(
        FusedAttentionForwardArgs<T>{.shape = shape_of(B), .out = out, .stats = saved, .out_rounded = out_rounded}));
    return;
  }
  // Probabilities (B, Hl, T, T) not kept go where backward will recompute them: scratch, free until then.
  T* probs = keep_probs_ ? saved : recomputed_probabilities(scratch, N);
  ops_.attention_forward(
      in.into(AttentionForwardArgs<T>{.shape = shape_of(B), .out = out, .probs = probs, .out_rounded = out_rounded}));
}

template <typename T>
typename MhaAttention<T>::Held MhaAttention<T>::held_tensors(const T* acts, int64_t N) const {
  const int64_t saved = fused(N) ? N * Hl_ : keep_probs_ ? probs_size(N) : 0;
  const auto address = reinterpret_cast<uintptr_t>(acts + saved);
  auto* base = reinterpret_cast<Rounded<T>*>((address + kHeldAlignment - 1) / kHeldAlignment * kHeldAlignment);
  const int64_t n = N * Dq_;
  return {base, base + n, base + 2 * n, base + 3 * n};
}

template <typename T>
void MhaAttention<T>::backward(const T* x, const T* dy, T* dx, const T* acts, T* scratch, int64_t B) {
  if (held()) return held_backward(x, dy, dx, acts, scratch, B);
  const int64_t N = B * T_, Q = Dq_, Dh = D_ / H_;
  const T *q = acts, *k = q + N * Q, *v = k + N * Q, *att = v + N * Q;
  T *dq = scratch, *dk = dq + N * Q, *dv = dk + N * Q, *datt = dv + N * Q;
  output_backward(Rows<const T>(att), Rows<const T>(dy), datt, N);
  attend_backward({.q = q, .k = k, .v = v}, att, nullptr, att + N * Q, datt, scratch, B);
  reduce_kv_gradients(dk, dv, scratch, N);
  ops_.rope(dq, B, T_, Hl_, Dh, true);
  ops_.rope(dk, B, T_, Hkvl_, Dh, true);
  projections_backward(Rows<const T>(x), Rows<const T>(dq), Rows<const T>(dk), Rows<const T>(dv), dx, N);
}

// Under bf16 GEMMs: dy rounded once for Wo's two products, the attention's backward on the held q, k, v and output,
// then dq and dk rotated back as they are rounded for their GEMMs, dv rounded.
template <typename T>
void MhaAttention<T>::held_backward(const T* x, const T* dy, T* dx, const T* acts, T* scratch, int64_t B) {
  const int64_t N = B * T_, D = D_, Q = Dq_, K = Dkv_, Dh = D_ / H_;
  const Held h = held_tensors(acts, N);
  T *dq = scratch, *dk = dq + N * Q, *dv = dk + N * Q, *datt = dv + N * Q;
  Rounded<T>* dyr = held_scratch(scratch, N);
  ops_.round_values(dy, dyr, N * D);  // once for Wo's two products
  output_backward(HeldRows<T>{h.att}, HeldRows<T>{dyr}, datt, N);
  attend_backward({.q_rounded = h.q, .k_rounded = h.k, .v_rounded = h.v}, nullptr, h.att, acts, datt, scratch, B);
  reduce_kv_gradients(dk, dv, scratch, N);
  Rounded<T>* xr = rounded_input(acts, scratch, N);  // not kept: where dy was, free since Wo's products
  if (!keep_input_) ops_.round_values(x, xr, N * D);
  Rounded<T>* dqr = held_scratch(scratch, N) + N * D;
  Rounded<T>* dkr = dqr + N * Q;
  Rounded<T>* dvr = dkr + N * K;
  ops_.rope_rounded(dq, dqr, B, T_, Hl_, Dh, true);
  ops_.rope_rounded(dk, dkr, B, T_, Hkvl_, Dh, true);
  ops_.round_values(dv, dvr, N * K);
  projections_backward(HeldRows<T>{xr}, HeldRows<T>{dqr}, HeldRows<T>{dkr}, HeldRows<T>{dvr}, dx, N);
}

// dq, dk, dv into the start of scratch from q, k, v and the output (as stored or held rounded), the statistics or
// probabilities saved (plain and not kept: recomputed), and datt.
template <typename T>
void MhaAttention<T>::attend_backward(const Inputs& in, const T* out, const Rounded<T>* out_rounded, const T* saved,
                                      const T* datt, T* scratch, int64_t B) {
  const int64_t N = B * T_, Q = Dq_;
  T *dq = scratch, *dk = dq + N * Q, *dv = dk + N * Q;
  if (fused(N)) {
    ops_.attention_backward_fused(in.into(FusedAttentionBackwardArgs<T>{.shape = shape_of(B),
                                                                        .out = out,
                                                                        .stats = saved,
                                                                        .dout = datt,
                                                                        .dq = dq,
                                                                        .dk = dk,
                                                                        .dv = dv,
                                                                        .out_rounded = out_rounded}));
    return;
  }
  const T* probs = saved;
  if (!keep_probs_) {
    // Selective recompute: the same op on the same q and k gives the forward's probabilities bit for bit;
    // its output goes to dq, which attention_backward writes afterwards.
    T* recomputed = recomputed_probabilities(scratch, N);
    ops_.attention_forward(in.into(AttentionForwardArgs<T>{.shape = shape_of(B), .out = dq, .probs = recomputed}));
    probs = recomputed;
  }
  T* block = dv + 2 * N * Q;
  ops_.attention_backward(in.into(AttentionBackwardArgs<T>{
      .shape = shape_of(B), .probs = probs, .dout = datt, .dq = dq, .dk = dk, .dv = dv, .scratch = block}));
}

template <typename T>
template <typename A, typename Y>
void MhaAttention<T>::output_backward(const A& att, const Y& dy, T* datt, int64_t N) {
  const Linear<T> linear(ops_, precision_);
  linear.weight_backward(att, dy, dwo_, N, Dq_, D_);  // dWo += att^T dy
  linear.input_backward(dy, wo_, datt, N, Dq_, D_);   // datt = dy Wo^T
}

template <typename T>
template <typename X, typename Y>
void MhaAttention<T>::projections_backward(const X& x, const Y& dq, const Y& dk, const Y& dv, T* dx, int64_t N) {
  const int64_t D = D_, Q = Dq_, K = Dkv_;
  const Linear<T> linear(ops_, precision_);
  linear.weight_backward(x, dq, dwq_, N, D, Q);
  linear.weight_backward(x, dk, dwk_, N, D, K);
  linear.weight_backward(x, dv, dwv_, N, D, K);
  linear.input_backward(dq, wq_, dx, N, D, Q);        // dx = dq Wq^T
  linear.input_backward(dk, wk_, dx, N, D, K, T(1));  //    + dk Wk^T
  linear.input_backward(dv, wv_, dx, N, D, K, T(1));  //    + dv Wv^T
}

template <typename T>
void MhaAttention<T>::reduce_kv_gradients(T*& dk, T*& dv, T* scratch, int64_t N) {
  if (!grouped()) return;
  T* sums = kv_gradients(scratch, N);
  const int64_t Dh = D_ / H_;
  ops_.expand_heads_backward(dk, sums, N, Hkvl_, Hl_ / Hkvl_, Dh);
  ops_.expand_heads_backward(dv, sums + N * Dkv_, N, Hkvl_, Hl_ / Hkvl_, Dh);
  dk = sums, dv = sums + N * Dkv_;
}

template class MhaAttention<float>;
template class MhaAttention<double>;

}  // namespace moe
