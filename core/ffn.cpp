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
  for (const char* w : {".w1", ".w3"})
    table.add(shard_.block_of({prefix + w, {D_, F}, ParamRole::Dense, true, ParamInit::Normal, 0.02}, 1));
  table.add(shard_.block_of({prefix + ".w2", {F, D_}, ParamRole::Dense, true, ParamInit::Normal, out_std}, 0));
}

template <typename T>
void DenseMlp<T>::bind(const ParamTable& table, T* params, T* grads) {
  const int64_t o1 = table.find(prefix_ + ".w1").offset, o3 = table.find(prefix_ + ".w3").offset,
                o2 = table.find(prefix_ + ".w2").offset;
  w1_ = params + o1, w3_ = params + o3, w2_ = params + o2;
  dw1_ = grads + o1, dw3_ = grads + o3, dw2_ = grads + o2;
}

template <typename T>
typename Ops<T>::ExpertMlp DenseMlp<T>::as_expert(const int64_t* rows) const {
  return {1, rows, D_, F_, w1_, w3_, w2_, dw1_, dw3_, dw2_, precision_};
}

// Held: x rounded once, a and b the GEMMs' results rounded, h their SwiGLU rounded (acts: x, a, b, h).
template <typename T>
void DenseMlp<T>::held_forward(const T* x, T* y, T* acts, int64_t N) {
  Rounded<T>* xr = reinterpret_cast<Rounded<T>*>(acts);
  Rounded<T>* a = xr + N * D_;
  Rounded<T>* b = a + N * F_;
  Rounded<T>* h = b + N * F_;
  const int64_t rows[2] = {0, N};
  ops_.round_values(x, xr, N * D_);
  ops_.expert_mlp_forward_rounded(as_expert(rows), xr, a, b, h, y);
}

// Scratch: dh (N, F), then dy, da, db held rounded (as GroupedExperts' backward).
template <typename T>
void DenseMlp<T>::held_backward(const T* dy, T* dx, const T* acts, T* scratch, int64_t N) {
  const Rounded<T>* xr = reinterpret_cast<const Rounded<T>*>(acts);
  const Rounded<T>* a = xr + N * D_;
  const Rounded<T>* b = a + N * F_;
  const Rounded<T>* h = b + N * F_;
  T* dh = scratch;
  Rounded<T>* dy_held = reinterpret_cast<Rounded<T>*>(scratch + N * F_);
  Rounded<T>* da = dy_held + N * D_;
  Rounded<T>* db = da + N * F_;
  const int64_t rows[2] = {0, N};
  ops_.expert_mlp_backward_rounded(as_expert(rows), xr, a, b, h, dy, dy_held, dh, da, db, dx);
}

template <typename T>
void DenseMlp<T>::forward(const FfnContext&, const T* x, T* y, T* acts, FfnSlot*, int64_t N) {
  if (held()) return held_forward(x, y, acts, N);
  T* a = acts;               // (N, F) x W1
  T* b = acts + N * F_;      // (N, F) x W3
  T* s = acts + 2 * N * F_;  // (N, F) silu(a) * b
  const Linear<T> linear(ops_, precision_);
  linear.forward(x, w1_, a, N, D_, F_);
  linear.forward(x, w3_, b, N, D_, F_);
  ops_.swiglu_forward(a, b, s, N * F_);
  linear.forward(s, w2_, y, N, F_, D_);
}

template <typename T>
void DenseMlp<T>::backward(const FfnContext&, const T* x, const T* dy, T* dx, const T* acts, FfnSlot*, T* scratch,
                           int64_t N) {
  if (held()) return held_backward(dy, dx, acts, scratch, N);
  const T* a = acts;
  const T* b = acts + N * F_;
  const T* s = acts + 2 * N * F_;
  T* ds = scratch;               // (N, F)
  T* da = scratch + N * F_;      // (N, F)
  T* db = scratch + 2 * N * F_;  // (N, F)
  const Linear<T> linear(ops_, precision_);
  linear.weight_backward(s, dy, dw2_, N, F_, D_);  // dW2 += s^T dy
  linear.input_backward(dy, w2_, ds, N, F_, D_);   // ds = dy W2^T
  ops_.swiglu_backward(a, b, ds, da, db, N * F_);
  linear.weight_backward(x, da, dw1_, N, D_, F_);       // dW1 += x^T da
  linear.weight_backward(x, db, dw3_, N, D_, F_);       // dW3 += x^T db
  linear.input_backward(da, w1_, dx, N, D_, F_);        // dx = da W1^T
  linear.input_backward(db, w3_, dx, N, D_, F_, T(1));  //    + db W3^T
}

template class DenseMlp<float>;
template class DenseMlp<double>;

}  // namespace moe
