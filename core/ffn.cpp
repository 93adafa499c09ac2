// The dense SwiGLU MLP: forward and explicit backward.
#include "core/ffn.h"

#include <cmath>

#include "core/error.h"
#include "core/linear.h"

namespace moe {

template <typename T>
DenseMlp<T>::DenseMlp(Backend& backend, int64_t d_model, int64_t hidden, int64_t layers_total, TpShard shard)
    : ops_(backend.ops<T>()), D_(d_model), F_(hidden / shard.size), L_(layers_total), shard_(shard) {
  MOE_CHECK(shard.size >= 1 && hidden % shard.size == 0 && shard.rank >= 0 && shard.rank < shard.size,
            "hidden width " << hidden << " over " << shard.size << " tensor-parallel ranks");
}

template <typename T>
void DenseMlp<T>::register_params(ParamTable& table, const std::string& prefix) {
  prefix_ = prefix;
  const double out_std = 0.02 / std::sqrt(2.0 * double(L_));  // W2 scaled by 1/sqrt(2L) (docs/model.md)
  const int64_t F = F_ * shard_.size;                         // the whole hidden width
  // W1 and W3 side by side (each row [W1 row | W3 row]: one GEMM), split on their hidden axis.
  ParamSpec w13{prefix + ".w13", {D_, 2, F}, ParamRole::Dense, true, ParamInit::Normal, 0.02};
  w13.parts = {prefix + ".w1", prefix + ".w3"};
  table.add(shard_.block_of(w13, 2));
  table.add(shard_.block_of({prefix + ".w2", {F, D_}, ParamRole::Dense, true, ParamInit::Normal, out_std}, 0));
}

template <typename T>
void DenseMlp<T>::bind(const ParamTable& table, T* params, T* grads) {
  const int64_t o13 = table.find(prefix_ + ".w13").offset, o2 = table.find(prefix_ + ".w2").offset;
  w13_ = params + o13, w2_ = params + o2;
  dw13_ = grads + o13, dw2_ = grads + o2;
}

template <typename T>
typename Ops<T>::ExpertMlp DenseMlp<T>::as_expert(const int64_t* rows) const {
  return {1, rows, D_, F_, w13_, w2_, dw13_, dw2_, precision_};
}

// Held: x rounded once, ab the GEMM's results rounded, h their SwiGLU rounded (acts: x, ab, h).
template <typename T>
void DenseMlp<T>::held_forward(const T* x, T* y, T* acts, int64_t N) {
  Rounded<T>* xr = reinterpret_cast<Rounded<T>*>(acts);
  Rounded<T>* ab = xr + N * D_;
  Rounded<T>* h = ab + N * 2 * F_;
  const int64_t rows[2] = {0, N};
  ops_.round_values(x, xr, N * D_);
  ops_.expert_mlp_forward_rounded(as_expert(rows), xr, ab, h, y);
}

// Scratch: dh (N, F), then dy and dab held rounded (as GroupedExperts' backward).
template <typename T>
void DenseMlp<T>::held_backward(const T* dy, T* dx, const T* acts, T* scratch, int64_t N) {
  const Rounded<T>* xr = reinterpret_cast<const Rounded<T>*>(acts);
  const Rounded<T>* ab = xr + N * D_;
  const Rounded<T>* h = ab + N * 2 * F_;
  T* dh = scratch;
  Rounded<T>* dy_held = reinterpret_cast<Rounded<T>*>(scratch + N * F_);
  Rounded<T>* dab = dy_held + N * D_;
  const int64_t rows[2] = {0, N};
  ops_.expert_mlp_backward_rounded(as_expert(rows), xr, ab, h, dy, dy_held, dh, dab, dx);
}

template <typename T>
void DenseMlp<T>::forward(const FfnContext&, const T* x, T* y, T* acts, FfnSlot*, int64_t N) {
  if (held()) return held_forward(x, y, acts, N);
  T* ab = acts;              // (N, 2F) x W13: [x W1 | x W3]
  T* s = acts + 2 * N * F_;  // (N, F) silu(a) * b
  const Linear<T> linear(ops_, precision_);
  linear.forward(x, w13_, ab, N, D_, 2 * F_);
  ops_.swiglu_forward(ab, s, N, F_);
  linear.forward(s, w2_, y, N, F_, D_);
}

template <typename T>
void DenseMlp<T>::backward(const FfnContext&, const T* x, const T* dy, T* dx, const T* acts, FfnSlot*, T* scratch,
                           int64_t N) {
  if (held()) return held_backward(dy, dx, acts, scratch, N);
  const T* ab = acts;
  const T* s = acts + 2 * N * F_;
  T* ds = scratch;            // (N, F)
  T* dab = scratch + N * F_;  // (N, 2F): [da | db]
  const Linear<T> linear(ops_, precision_);
  linear.weight_backward(s, dy, dw2_, N, F_, D_);        // dW2 += s^T dy
  linear.input_backward(dy, w2_, ds, N, F_, D_);         // ds = dy W2^T
  ops_.swiglu_backward(ab, ds, dab, N, F_);              //
  linear.weight_backward(x, dab, dw13_, N, D_, 2 * F_);  // dW13 += x^T [da | db]
  linear.input_backward(dab, w13_, dx, N, D_, 2 * F_);   // dx = [da | db] W13^T
}

template class DenseMlp<float>;
template class DenseMlp<double>;

}  // namespace moe
