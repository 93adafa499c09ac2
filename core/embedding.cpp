// The token embedding and the output head with its cross-entropy.
#include "core/embedding.h"

#include "core/error.h"
#include "core/linear.h"

namespace moe {

template <typename T>
TokenEmbedding<T>::TokenEmbedding(Backend& backend, int64_t vocab, int64_t d_model, TpShard shard)
    : ops_(backend.ops<T>()), V_(vocab), D_(d_model), shard_(shard) {
  MOE_CHECK(shard.size >= 1 && vocab % shard.size == 0 && shard.rank >= 0 && shard.rank < shard.size,
            "vocabulary " << vocab << " over " << shard.size << " tensor-parallel ranks");
}

template <typename T>
void TokenEmbedding<T>::register_params(ParamTable& table) {
  table.add(shard_.block_of({"embed.weight", {V_, D_}, ParamRole::Embedding, false, ParamInit::Normal, 0.02}, 0));
}

template <typename T>
void TokenEmbedding<T>::bind(const ParamTable& table, T* params, T* grads) {
  const int64_t at = table.find("embed.weight").offset;
  table_ = params + at, grad_ = grads + at;
}

template <typename T>
void TokenEmbedding<T>::forward(const int32_t* tokens, T* x, int64_t N) {
  ops_.embedding_forward(tokens, table_, shard_.offset(V_), shard_.block(V_), x, N, D_);
}

template <typename T>
void TokenEmbedding<T>::backward(const int32_t* tokens, const T* dx, int64_t N) {
  ops_.embedding_backward(tokens, dx, shard_.offset(V_), shard_.block(V_), grad_, N, D_);
}

template <typename T>
LmHead<T>::LmHead(Backend& backend, int64_t vocab, int64_t d_model) : ops_(backend.ops<T>()), V_(vocab), D_(d_model) {}

template <typename T>
void LmHead<T>::register_params(ParamTable& table) {
  table.add({"head.weight", {D_, V_}, ParamRole::Output, true, ParamInit::Normal, 0.02});
}

template <typename T>
void LmHead<T>::bind(const ParamTable& table, T* params, T* grads) {
  const int64_t at = table.find("head.weight").offset;
  weight_ = params + at, grad_ = grads + at;
}

template <typename T>
void LmHead<T>::forward(const T* xo, const int32_t* targets, T* losses, T* acts, int64_t N) {
  T* logits = acts;
  const Linear<T> linear(ops_, precision_);
  if (Rounded<T>* xr = held_input(acts, N)) {
    if (xo) ops_.round_values(xo, xr, N * D_);  // null: the output norm wrote it
    linear.forward(HeldRows<T>{xr}, weight_, logits, N, D_, V_);
  } else {
    linear.forward(xo, weight_, logits, N, D_, V_);
  }
  ops_.cross_entropy_forward(logits, targets, losses, N, V_);
}

template <typename T>
void LmHead<T>::backward(const T* xo, const int32_t* targets, T scale, const T* acts, T* scratch, T* dxo, int64_t N) {
  const T* logits = acts;
  const Linear<T> linear(ops_, precision_);
  auto products = [&](const auto& x, const auto& dlogits) {
    linear.weight_backward(x, dlogits, grad_, N, D_, V_);     // dW += xo^T dlogits
    linear.input_backward(dlogits, weight_, dxo, N, D_, V_);  // dxo = dlogits W^T
  };
  if (held()) {  // xo held in acts
    Rounded<T>* dlogits = reinterpret_cast<Rounded<T>*>(scratch);
    ops_.cross_entropy_backward_rounded(logits, targets, scale, dlogits, N, V_);
    return products(HeldRows<T>{held_input(const_cast<T*>(acts), N)}, HeldRows<T>{dlogits});
  }
  ops_.cross_entropy_backward(logits, targets, scale, scratch, N, V_);
  products(Rows<const T>(xo), Rows<const T>(scratch));
}

template class TokenEmbedding<float>;
template class TokenEmbedding<double>;
template class LmHead<float>;
template class LmHead<double>;

}  // namespace moe
