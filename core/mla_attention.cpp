// Multi-head latent attention: forward and explicit backward. See mla_attention.h.
#include "core/mla_attention.h"

#include <cmath>
#include <vector>

#include "core/error.h"

namespace moe {

template <typename T>
MlaAttention<T>::MlaAttention(Backend& backend, int64_t d_model, int64_t heads, int64_t seq_len, int64_t layers_total,
                              MlaShape shape)
    : ops_(backend.ops<T>()),
      D_(d_model),
      H_(heads),
      T_(seq_len),
      L_(layers_total),
      Dh_(heads > 0 ? d_model / heads : 0),
      C_(shape.kv_rank),
      Cq_(shape.q_rank),
      R_(shape.rope_dim),
      W_(heads * (Dh_ + shape.rope_dim)) {
  MOE_CHECK(heads > 0 && D_ % H_ == 0, "d_model " << D_ << " and heads " << H_);
  MOE_CHECK(C_ >= 1 && Cq_ >= 1 && R_ >= 2 && R_ % 2 == 0,
            "latent attention ranks " << C_ << " (kv), " << Cq_ << " (q) and an even rotary width, not " << R_);
  std::vector<T> identity(size_t(R_ * R_), T(0));
  for (int64_t i = 0; i < R_; ++i) identity[size_t(i * R_ + i)] = T(1);
  identity_ = backend.upload(identity);
}

template <typename T>
void MlaAttention<T>::register_params(ParamTable& table, const std::string& prefix) {
  prefix_ = prefix;
  const double out_std = 0.02 / std::sqrt(2.0 * double(L_));  // the output projection scaled like Wo
  const int64_t HD = H_ * Dh_;
  auto add = [&](const char* name, int64_t rows, int64_t cols, double std) {
    table.add({prefix + name, {rows, cols}, ParamRole::Dense, true, ParamInit::Normal, std});
  };
  add(".wdq", D_, Cq_, 0.02);
  add(".wuq", Cq_, HD, 0.02);
  add(".wqr", Cq_, H_ * R_, 0.02);
  add(".wdkv", D_, C_, 0.02);
  add(".wuk", C_, HD, 0.02);
  add(".wuv", C_, HD, 0.02);
  add(".wkr", D_, R_, 0.02);
  add(".wo", HD, D_, out_std);
}

template <typename T>
void MlaAttention<T>::bind(const ParamTable& table, T* params, T* grads) {
  auto at = [&](const char* name) { return table.find(prefix_ + name).offset; };
  const int64_t dq = at(".wdq"), uq = at(".wuq"), qr = at(".wqr"), dkv = at(".wdkv"), uk = at(".wuk"), uv = at(".wuv"),
                kr = at(".wkr"), o = at(".wo");
  wdq_ = params + dq, wuq_ = params + uq, wqr_ = params + qr, wdkv_ = params + dkv;
  wuk_ = params + uk, wuv_ = params + uv, wkr_ = params + kr, wo_ = params + o;
  dwdq_ = grads + dq, dwuq_ = grads + uq, dwqr_ = grads + qr, dwdkv_ = grads + dkv;
  dwuk_ = grads + uk, dwuv_ = grads + uv, dwkr_ = grads + kr, dwo_ = grads + o;
}

template <typename T>
double MlaAttention<T>::forward_flops(int64_t N) const {
  const double n = double(N), D = double(D_), HD = double(H_ * Dh_), R = double(R_);
  const double projections =
      D * double(Cq_ + C_) + double(Cq_) * (HD + double(H_) * R) + D * R + 2 * double(C_) * HD + HD * D;
  return 2 * n * projections + 2 * 2 * n * double(T_) * double(W_);
}

template <typename T>
void MlaAttention<T>::place(const T* src, int64_t lds, T* dst, int64_t ldd, int64_t rows, T beta) const {
  ops_.gemm(false, false, rows, R_, R_, T(1), src, lds, identity_.data<T>(), R_, beta, dst, ldd);
}

template <typename T>
void MlaAttention<T>::rotary_forward(const T* x, const T* cq, T* q, T* k, T* qr, T* kr, int64_t B) const {
  const int64_t N = B * T_, Hr = H_ * R_, Wh = Dh_ + R_;
  ops_.gemm(false, false, N, Hr, Cq_, T(1), cq, Cq_, wqr_, Hr, T(0), qr, Hr);  // qr = c_q Wqr
  ops_.gemm(false, false, N, R_, D_, T(1), x, D_, wkr_, R_, T(0), kr, R_);     // kr = x Wkr
  ops_.rope(qr, B, T_, H_, R_, false);
  ops_.rope(kr, B, T_, 1, R_, false);
  for (int64_t h = 0; h < H_; ++h) {
    place(qr + h * R_, Hr, q + h * Wh + Dh_, W_, N, T(0));
    place(kr, R_, k + h * Wh + Dh_, W_, N, T(0));  // one rotary key shared by every head
  }
}

template <typename T>
void MlaAttention<T>::forward(const T* x, T* y, T* acts, T* scratch, int64_t B) {
  const int64_t N = B * T_, HD = H_ * Dh_, Wh = Dh_ + R_;
  T *cq = acts, *ckv = cq + N * Cq_, *q = ckv + N * C_, *k = q + N * W_, *v = k + N * W_, *att = v + N * W_;
  T* probs = keep_probs_ ? att + N * W_ : recomputed_probabilities(scratch, N);
  T* qr = scratch + 4 * N * W_ + T_ * T_ + N * (Cq_ + C_);  // the backward's dqr and dkr, free until then
  T* kr = qr + N * H_ * R_;
  ops_.gemm(false, false, N, Cq_, D_, T(1), x, D_, wdq_, Cq_, T(0), cq, Cq_);  // c_q = x Wdq
  ops_.gemm(false, false, N, C_, D_, T(1), x, D_, wdkv_, C_, T(0), ckv, C_);   // c_kv = x Wdkv
  ops_.fill(v, T(0), N * W_);                                                  // values padded with zeros
  for (int64_t h = 0; h < H_; ++h) {  // each head's content parts, written into its block of the rows
    ops_.gemm(false, false, N, Dh_, Cq_, T(1), cq, Cq_, wuq_ + h * Dh_, HD, T(0), q + h * Wh, W_);
    ops_.gemm(false, false, N, Dh_, C_, T(1), ckv, C_, wuk_ + h * Dh_, HD, T(0), k + h * Wh, W_);
    ops_.gemm(false, false, N, Dh_, C_, T(1), ckv, C_, wuv_ + h * Dh_, HD, T(0), v + h * Wh, W_);
  }
  rotary_forward(x, cq, q, k, qr, kr, B);
  ops_.attention_forward(q, k, v, att, probs, B, T_, H_, Wh);
  for (int64_t h = 0; h < H_; ++h)  // y += att_h Wo_h over the heads' value columns (the padding is zero)
    ops_.gemm(false, false, N, D_, Dh_, T(1), att + h * Wh, W_, wo_ + h * Dh_ * D_, D_, T(1), y, D_);
}

template <typename T>
void MlaAttention<T>::rotary_backward(const T* x, const T* cq, const T* dq, const T* dk, T* dqr, T* dkr, T* dcq, T* dx,
                                      int64_t B) const {
  const int64_t N = B * T_, Hr = H_ * R_, Wh = Dh_ + R_;
  for (int64_t h = 0; h < H_; ++h) {
    place(dq + h * Wh + Dh_, W_, dqr + h * R_, Hr, N, T(0));
    place(dk + h * Wh + Dh_, W_, dkr, R_, N, T(h == 0 ? 0 : 1));  // the shared key sums every head's
  }
  ops_.rope(dqr, B, T_, H_, R_, true);
  ops_.rope(dkr, B, T_, 1, R_, true);
  ops_.gemm(true, false, Cq_, Hr, N, T(1), cq, Cq_, dqr, Hr, T(1), dwqr_, Hr);  // dWqr += c_q^T dqr
  ops_.gemm(false, true, N, Cq_, Hr, T(1), dqr, Hr, wqr_, Hr, T(1), dcq, Cq_);  // dc_q += dqr Wqr^T
  ops_.gemm(true, false, D_, R_, N, T(1), x, D_, dkr, R_, T(1), dwkr_, R_);     // dWkr += x^T dkr
  ops_.gemm(false, true, N, D_, R_, T(1), dkr, R_, wkr_, R_, T(1), dx, D_);     // dx += dkr Wkr^T
}

template <typename T>
void MlaAttention<T>::backward(const T* x, const T* dy, T* dx, const T* acts, T* scratch, int64_t B) {
  const int64_t N = B * T_, HD = H_ * Dh_, Wh = Dh_ + R_;
  const T *cq = acts, *ckv = cq + N * Cq_, *q = ckv + N * C_, *k = q + N * W_, *v = k + N * W_, *att = v + N * W_;
  T *dq = scratch, *dk = dq + N * W_, *dv = dk + N * W_, *datt = dv + N * W_, *block = datt + N * W_;
  T *dcq = block + T_ * T_, *dckv = dcq + N * Cq_, *dqr = dckv + N * C_, *dkr = dqr + N * H_ * R_;
  const T* probs = att + N * W_;
  if (!keep_probs_) {  // selective recompute: the same op on the same q and k, bit for bit (as MhaAttention)
    T* recomputed = recomputed_probabilities(scratch, N);
    ops_.attention_forward(q, k, v, dq, recomputed, B, T_, H_, Wh);
    probs = recomputed;
  }
  ops_.fill(datt, T(0), N * W_);
  for (int64_t h = 0; h < H_; ++h) {
    ops_.gemm(true, false, Dh_, D_, N, T(1), att + h * Wh, W_, dy, D_, T(1), dwo_ + h * Dh_ * D_, D_);
    ops_.gemm(false, true, N, Dh_, D_, T(1), dy, D_, wo_ + h * Dh_ * D_, D_, T(0), datt + h * Wh, W_);
  }
  ops_.attention_backward(q, k, v, probs, datt, dq, dk, dv, block, B, T_, H_, Wh);
  for (int64_t h = 0; h < H_; ++h) {  // the content parts: into Wuq, Wuk, Wuv and the latents
    const T beta = T(h == 0 ? 0 : 1);
    const T *dq_h = dq + h * Wh, *dk_h = dk + h * Wh, *dv_h = dv + h * Wh;
    ops_.gemm(true, false, Cq_, Dh_, N, T(1), cq, Cq_, dq_h, W_, T(1), dwuq_ + h * Dh_, HD);
    ops_.gemm(false, true, N, Cq_, Dh_, T(1), dq_h, W_, wuq_ + h * Dh_, HD, beta, dcq, Cq_);
    ops_.gemm(true, false, C_, Dh_, N, T(1), ckv, C_, dk_h, W_, T(1), dwuk_ + h * Dh_, HD);
    ops_.gemm(false, true, N, C_, Dh_, T(1), dk_h, W_, wuk_ + h * Dh_, HD, beta, dckv, C_);
    ops_.gemm(true, false, C_, Dh_, N, T(1), ckv, C_, dv_h, W_, T(1), dwuv_ + h * Dh_, HD);
    ops_.gemm(false, true, N, C_, Dh_, T(1), dv_h, W_, wuv_ + h * Dh_, HD, T(1), dckv, C_);
  }
  ops_.gemm(false, true, N, D_, C_, T(1), dckv, C_, wdkv_, C_, T(0), dx, D_);   // dx = dc_kv Wdkv^T
  rotary_backward(x, cq, dq, dk, dqr, dkr, dcq, dx, B);                         //    + the rotary parts
  ops_.gemm(false, true, N, D_, Cq_, T(1), dcq, Cq_, wdq_, Cq_, T(1), dx, D_);  //    + dc_q Wdq^T
  ops_.gemm(true, false, D_, Cq_, N, T(1), x, D_, dcq, Cq_, T(1), dwdq_, Cq_);  // dWdq += x^T dc_q
  ops_.gemm(true, false, D_, C_, N, T(1), x, D_, dckv, C_, T(1), dwdkv_, C_);   // dWdkv += x^T dc_kv
}

template class MlaAttention<float>;
template class MlaAttention<double>;

}  // namespace moe
