// Multi-head rotary causal attention: forward and explicit backward.
#include "core/attention.h"

#include <cmath>

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
  const int64_t N = B * T_, D = D_, Q = Dq_, H = Hl_, Dh = D_ / H_;
  T *q = acts, *k = q + N * Q, *v = k + N * Q, *att = v + N * Q;
  if (held()) {
    Rounded<T>* xr = rounded_input(acts, scratch, N);
    MOE_CHECK(x || keep_input_, "attention forward: no input, and none kept (held_input)");
    if (x)
      ops_.round_values(x, xr, N * D);  // once for the projections (kept: their weight gradients); null: its norm's
    project(HeldRows<T>{xr}, q, k, v, scratch, B);
  } else {
    project(Rows<const T>(x), q, k, v, scratch, B);
  }
  ops_.rope(q, B, T_, H, Dh, false);
  if (fused(N))  // the statistics (B, Hl, T) after att
    ops_.attention_forward_fused({.shape = shape_of(B), .q = q, .k = k, .v = v, .out = att, .stats = att + N * Q});
  else
    plain_forward(q, k, v, att, scratch, B);
  Linear<T>(ops_, precision_).forward(att, wo_, y, N, Q, D, T(1));  // y += att Wo
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

template <typename T>
void MhaAttention<T>::plain_forward(const T* q, const T* k, const T* v, T* att, T* scratch, int64_t B) {
  const int64_t N = B * T_, Q = Dq_;
  // Probabilities (B, Hl, T, T) not kept go where backward will recompute them: scratch, free until then.
  T* probs = keep_probs_ ? att + N * Q : recomputed_probabilities(scratch, N);
  ops_.attention_forward({.shape = shape_of(B), .q = q, .k = k, .v = v, .out = att, .probs = probs});
}

template <typename T>
void MhaAttention<T>::backward(const T* x, const T* dy, T* dx, const T* acts, T* scratch, int64_t B) {
  const int64_t N = B * T_, D = D_, Q = Dq_, H = Hl_, Dh = D_ / H_;
  const T *q = acts, *k = q + N * Q, *v = k + N * Q, *att = v + N * Q;
  T *dq = scratch, *dk = dq + N * Q, *dv = dk + N * Q, *datt = dv + N * Q;
  if (held()) {
    Rounded<T>* dyr = held_scratch(scratch, N);
    ops_.round_values(dy, dyr, N * D);  // once for Wo's two products
    output_backward(HeldRows<T>{dyr}, att, datt, N);
  } else {
    output_backward(Rows<const T>(dy), att, datt, N);
  }
  if (fused(N))
    ops_.attention_backward_fused({.shape = shape_of(B),
                                   .q = q,
                                   .k = k,
                                   .v = v,
                                   .out = att,
                                   .stats = att + N * Q,
                                   .dout = datt,
                                   .dq = dq,
                                   .dk = dk,
                                   .dv = dv});
  else
    plain_backward(q, k, v, att, datt, scratch, B);
  reduce_kv_gradients(dk, dv, scratch, N);
  ops_.rope(dq, B, T_, H, Dh, true);
  ops_.rope(dk, B, T_, Hkvl_, Dh, true);
  if (held())
    held_projections_backward(x, dq, dk, dv, dx, acts, scratch, N);
  else
    projections_backward(Rows<const T>(x), Rows<const T>(dq), Rows<const T>(dk), Rows<const T>(dv), dx, N);
}

template <typename T>
template <typename Y>
void MhaAttention<T>::output_backward(const Y& dy, const T* att, T* datt, int64_t N) {
  const Linear<T> linear(ops_, precision_);
  linear.weight_backward(Rows<const T>(att), dy, dwo_, N, Dq_, D_);  // dWo += att^T dy
  linear.input_backward(dy, wo_, datt, N, Dq_, D_);                  // datt = dy Wo^T
}

template <typename T>
void MhaAttention<T>::held_projections_backward(const T* x, const T* dq, const T* dk, const T* dv, T* dx, const T* acts,
                                                T* scratch, int64_t N) {
  const int64_t D = D_, Q = Dq_, K = Dkv_;
  Rounded<T>* xr = rounded_input(acts, scratch, N);  // not kept: where dy was, free since Wo's products
  if (!keep_input_) ops_.round_values(x, xr, N * D);
  Rounded<T>* dqr = held_scratch(scratch, N) + N * D;
  Rounded<T>* dkr = dqr + N * Q;
  Rounded<T>* dvr = dkr + N * K;
  ops_.round_values(dq, dqr, N * Q);
  ops_.round_values(dk, dkr, N * K);
  ops_.round_values(dv, dvr, N * K);
  projections_backward(HeldRows<T>{xr}, HeldRows<T>{dqr}, HeldRows<T>{dkr}, HeldRows<T>{dvr}, dx, N);
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

// dq, dk, dv into the start of scratch from the kept (or recomputed) probabilities.
template <typename T>
void MhaAttention<T>::plain_backward(const T* q, const T* k, const T* v, const T* att, const T* datt, T* scratch,
                                     int64_t B) {
  const int64_t N = B * T_, Q = Dq_;
  T *dq = scratch, *dk = dq + N * Q, *dv = dk + N * Q, *block = dv + 2 * N * Q;
  const T* probs = att + N * Q;
  if (!keep_probs_) {
    // Selective recompute: the same op on the same q and k gives the forward's probabilities bit for bit;
    // its output goes to dq, which attention_backward writes afterwards.
    T* recomputed = recomputed_probabilities(scratch, N);
    ops_.attention_forward({.shape = shape_of(B), .q = q, .k = k, .v = v, .out = dq, .probs = recomputed});
    probs = recomputed;
  }
  ops_.attention_backward({.shape = shape_of(B),
                           .q = q,
                           .k = k,
                           .v = v,
                           .probs = probs,
                           .dout = datt,
                           .dq = dq,
                           .dk = dk,
                           .dv = dv,
                           .scratch = block});
}

template class MhaAttention<float>;
template class MhaAttention<double>;

}  // namespace moe
