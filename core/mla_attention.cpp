// Multi-head latent attention: forward and explicit backward. See mla_attention.h.
#include "core/mla_attention.h"

#include <cmath>
#include <vector>

#include "core/error.h"
#include "core/linear.h"

namespace moe {
namespace {
// The latents' norms have DeepSeek-V3's epsilon 1e-6, the backend's RMSNorm 1e-5: scaling the latent by sqrt(10)
// first makes one the other (mla_attention.h).
constexpr double kLatentScale = 3.16227766016837933;  // sqrt(1e-5 / 1e-6)
}  // namespace

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
      W_(heads * (Dh_ + shape.rope_dim)),
      Q_(shape.q_rank > 0 ? shape.q_rank : d_model),
      norms_(shape.norms) {
  MOE_CHECK(heads > 0 && D_ % H_ == 0, "d_model " << D_ << " and heads " << H_);
  MOE_CHECK(C_ >= 1 && Cq_ >= 0 && R_ >= 2 && R_ % 2 == 0,
            "latent attention ranks " << C_ << " (kv), " << Cq_ << " (q) and an even rotary width, not " << R_);
  std::vector<T> identity(size_t(sizes::elements(sizes::mla_identity(this->shape()))), T(0));
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
  if (Cq_ > 0) add(".wdq", D_, Cq_, 0.02);
  add(".wuq", Q_, HD, 0.02);
  add(".wqr", Q_, H_ * R_, 0.02);
  add(".wdkv", D_, C_, 0.02);
  add(".wuk", C_, HD, 0.02);
  add(".wuv", C_, HD, 0.02);
  add(".wkr", D_, R_, 0.02);
  add(".wo", HD, D_, out_std);
  if (!norms_) return;
  if (Cq_ > 0) table.add({prefix + ".q_norm.gain", {Cq_}, ParamRole::Norm, false, ParamInit::Ones});
  table.add({prefix + ".kv_norm.gain", {C_}, ParamRole::Norm, false, ParamInit::Ones});
}

template <typename T>
void MlaAttention<T>::bind(const ParamTable& table, T* params, T* grads) {
  auto at = [&](const char* name) { return table.find(prefix_ + name).offset; };
  const int64_t uq = at(".wuq"), qr = at(".wqr"), dkv = at(".wdkv"), uk = at(".wuk"), uv = at(".wuv"), kr = at(".wkr"),
                o = at(".wo");
  wuq_ = params + uq, wqr_ = params + qr, wdkv_ = params + dkv;
  wuk_ = params + uk, wuv_ = params + uv, wkr_ = params + kr, wo_ = params + o;
  dwuq_ = grads + uq, dwqr_ = grads + qr, dwdkv_ = grads + dkv;
  dwuk_ = grads + uk, dwuv_ = grads + uv, dwkr_ = grads + kr, dwo_ = grads + o;
  if (Cq_ > 0) wdq_ = params + at(".wdq"), dwdq_ = grads + at(".wdq");
  if (!norms_) return;
  const int64_t gkv = at(".kv_norm.gain");
  gkv_ = params + gkv, dgkv_ = grads + gkv;
  if (Cq_ > 0) gq_ = params + at(".q_norm.gain"), dgq_ = grads + at(".q_norm.gain");
}

template <typename T>
double MlaAttention<T>::forward_flops(int64_t N) const {
  const double n = double(N), D = double(D_), HD = double(H_ * Dh_), R = double(R_);
  const double projections =
      D * double(Cq_ + C_) + double(Q_) * (HD + double(H_) * R) + D * R + 2 * double(C_) * HD + HD * D;
  return 2 * n * projections + 2 * 2 * n * double(T_) * double(W_);
}

template <typename T>
void MlaAttention<T>::place(const T* src, int64_t lds, T* dst, int64_t ldd, int64_t rows, T beta) const {
  // The identity is no parameter: both operands are rounded at the call under bf16 GEMMs (exact for it).
  ops_.gemm({.M = rows,
             .N = R_,
             .K = R_,
             .A = src,
             .lda = lds,
             .B = identity_.data<T>(),
             .ldb = R_,
             .beta = beta,
             .C = dst,
             .ldc = ldd,
             .precision = precision_});
}

template <typename T>
void MlaAttention<T>::latent_forward(const T* x, const T* wd, const T* gain, int64_t width, T* c, T* raw, T* rstd,
                                     int64_t N) const {
  if (!norms_) {
    Linear<T>(ops_, precision_).forward(x, wd, c, N, D_, width);
    return;
  }
  ops_.gemm({.M = N,
             .N = width,
             .K = D_,
             .alpha = T(kLatentScale),
             .A = x,
             .lda = D_,
             .B = wd,
             .ldb = width,
             .C = raw,
             .ldc = width,
             .precision = precision_,
             .weight = GemmWeight::B});
  ops_.rmsnorm_forward(raw, gain, c, rstd, N, width);
}

template <typename T>
void MlaAttention<T>::latent_backward(const T* x, const T* wd, const T* gain, int64_t width, const T* raw,
                                      const T* rstd, const T* dc, T* draw, T* dwd, T* dgain, T* dx, T beta,
                                      int64_t N) const {
  T scale = T(1);
  if (norms_) {
    ops_.rmsnorm_backward(raw, gain, rstd, dc, draw, dgain, N, width);
    dc = draw, scale = T(kLatentScale);
  }
  ops_.gemm({.trans_b = true,
             .M = N,
             .N = D_,
             .K = width,
             .alpha = scale,
             .A = dc,
             .lda = width,
             .B = wd,
             .ldb = width,
             .beta = beta,
             .C = dx,
             .ldc = D_,
             .precision = precision_,
             .weight = GemmWeight::B});  // dx (+)= dc Wd^T
  ops_.gemm({.trans_a = true,
             .M = D_,
             .N = width,
             .K = N,
             .alpha = scale,
             .A = x,
             .lda = D_,
             .B = dc,
             .ldb = width,
             .beta = T(1),
             .C = dwd,
             .ldc = width,
             .precision = precision_});  // dWd += x^T dc
}

template <typename T>
void MlaAttention<T>::rotary_forward(const T* x, const T* cq, T* q, T* k, T* qr, T* kr, int64_t B) const {
  const int64_t N = B * T_, Hr = H_ * R_, Wh = Dh_ + R_;
  const Linear<T> linear(ops_, precision_);
  linear.forward(cq, wqr_, qr, N, Q_, Hr);  // qr = c_q Wqr
  linear.forward(x, wkr_, kr, N, D_, R_);   // kr = x Wkr
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
  T *cq_kept = acts, *ckv = cq_kept + N * Cq_;
  T* q = held() ? scratch : kept(acts, N);  // held: built in fp32 in the scratch, then rounded into acts
  T *k = q + N * W_, *v = k + N * W_;
  const T* cq = Cq_ > 0 ? cq_kept : x;  // without a query latent the queries read x
  T* probs = keep_probs_ ? kept_probabilities(acts, N) : recomputed_probabilities(scratch, N);
  T* qr = scratch + 4 * N * W_ + T_ * T_ + N * (Q_ + C_);  // the backward's dqr and dkr, free until then
  T* kr = qr + N * H_ * R_;
  T *cq_raw = norm_acts(acts, N), *ckv_raw = cq_raw + N * Cq_, *rstd_q = ckv_raw + N * C_, *rstd_kv = rstd_q + N;
  if (Cq_ > 0) latent_forward(x, wdq_, gq_, Cq_, cq_kept, cq_raw, rstd_q, N);  // c_q = x Wdq (normalised)
  latent_forward(x, wdkv_, gkv_, C_, ckv, ckv_raw, rstd_kv, N);                // c_kv = x Wdkv (normalised)
  ops_.fill(v, T(0), N * W_);                                                  // values padded with zeros
  const Linear<T> linear(ops_, precision_);
  for (int64_t h = 0; h < H_; ++h) {  // each head's content parts (W's columns of the head), into its block of the rows
    linear.forward(cq, {wuq_ + h * Dh_, HD}, {q + h * Wh, W_}, N, Q_, Dh_);
    linear.forward(ckv, {wuk_ + h * Dh_, HD}, {k + h * Wh, W_}, N, C_, Dh_);
    linear.forward(ckv, {wuv_ + h * Dh_, HD}, {v + h * Wh, W_}, N, C_, Dh_);
  }
  rotary_forward(x, cq, q, k, qr, kr, B);
  if (!held()) {
    T* att = v + N * W_;
    ops_.attention_forward({.shape = shape_of(B), .q = q, .k = k, .v = v, .out = att, .probs = probs});
    return output_forward(att, nullptr, y, N);
  }
  Rounded<T>* held = kept_rounded(acts, N);  // q, k, v, att
  ops_.round_values(q, held, 3 * N * W_);    // q, k, v: contiguous in the scratch and in acts
  ops_.attention_forward(inputs(acts, N).into(
      AttentionForwardArgs<T>{.shape = shape_of(B), .probs = probs, .out_rounded = held + 3 * N * W_}));
  output_forward(nullptr, held + 3 * N * W_, y, N);
}

template <typename T>
AttentionInputs<T> MlaAttention<T>::inputs(const T* acts, int64_t N) const {
  if (!held()) {
    const T* q = kept(const_cast<T*>(acts), N);
    return {.q = q, .k = q + N * W_, .v = q + 2 * N * W_};
  }
  const Rounded<T>* q = kept_rounded(acts, N);
  return {.q_rounded = q, .k_rounded = q + N * W_, .v_rounded = q + 2 * N * W_};
}

template <typename T>
void MlaAttention<T>::output_forward(const T* att, const Rounded<T>* att_rounded, T* y, int64_t N) const {
  const Linear<T> linear(ops_, precision_);
  const int64_t Wh = Dh_ + R_;
  for (int64_t h = 0; h < H_; ++h) {  // y += att_h Wo_h over the heads' value columns (the padding is zero)
    if (att_rounded)
      linear.forward(HeldRows<T>{att_rounded + h * Wh, W_}, wo_ + h * Dh_ * D_, y, N, Dh_, D_, T(1));
    else
      linear.forward({att + h * Wh, W_}, wo_ + h * Dh_ * D_, y, N, Dh_, D_, T(1));
  }
}

template <typename T>
void MlaAttention<T>::output_backward(const T* att, const Rounded<T>* att_rounded, const T* dy, T* datt,
                                      int64_t N) const {
  const Linear<T> linear(ops_, precision_);
  const int64_t Wh = Dh_ + R_;
  ops_.fill(datt, T(0), N * W_);
  for (int64_t h = 0; h < H_; ++h) {
    if (att_rounded)
      linear.weight_backward(HeldRows<T>{att_rounded + h * Wh, W_}, Rows<const T>(dy), dwo_ + h * Dh_ * D_, N, Dh_, D_);
    else
      linear.weight_backward({att + h * Wh, W_}, dy, dwo_ + h * Dh_ * D_, N, Dh_, D_);
    linear.input_backward(dy, wo_ + h * Dh_ * D_, {datt + h * Wh, W_}, N, Dh_, D_);
  }
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
  const Linear<T> linear(ops_, precision_);
  linear.weight_backward(cq, dqr, dwqr_, N, Q_, Hr);       // dWqr += c_q^T dqr
  linear.input_backward(dqr, wqr_, dcq, N, Q_, Hr, T(1));  // dc_q += dqr Wqr^T
  linear.weight_backward(x, dkr, dwkr_, N, D_, R_);        // dWkr += x^T dkr
  linear.input_backward(dkr, wkr_, dx, N, D_, R_, T(1));   // dx += dkr Wkr^T
}

template <typename T>
void MlaAttention<T>::backward(const T* x, const T* dy, T* dx, const T* acts, T* scratch, int64_t B) {
  const int64_t N = B * T_, HD = H_ * Dh_, Wh = Dh_ + R_;
  const T* ckv = acts + N * Cq_;
  const T* cq = Cq_ > 0 ? acts : x;
  T *dq = scratch, *dk = dq + N * W_, *dv = dk + N * W_, *datt = dv + N * W_, *block = datt + N * W_;
  T *dcq = block + T_ * T_, *dckv = dcq + N * Q_, *dqr = dckv + N * C_, *dkr = dqr + N * H_ * R_;
  const AttentionInputs<T> in = inputs(acts, N);
  const T* probs = kept_probabilities(const_cast<T*>(acts), N);
  if (!keep_probs_) {  // selective recompute: the same op on the same q and k, bit for bit (as MhaAttention)
    T* recomputed = recomputed_probabilities(scratch, N);
    ops_.attention_forward(in.into(AttentionForwardArgs<T>{.shape = shape_of(B), .out = dq, .probs = recomputed}));
    probs = recomputed;
  }
  if (held())
    output_backward(nullptr, kept_rounded(acts, N) + 3 * N * W_, dy, datt, N);
  else
    output_backward(kept(const_cast<T*>(acts), N) + 3 * N * W_, nullptr, dy, datt, N);
  ops_.attention_backward(in.into(AttentionBackwardArgs<T>{
      .shape = shape_of(B), .probs = probs, .dout = datt, .dq = dq, .dk = dk, .dv = dv, .scratch = block}));
  const Linear<T> linear(ops_, precision_);
  for (int64_t h = 0; h < H_; ++h) {  // the content parts: into Wuq, Wuk, Wuv and the latents
    const T beta = T(h == 0 ? 0 : 1);
    const Rows<const T> dq_h{dq + h * Wh, W_}, dk_h{dk + h * Wh, W_}, dv_h{dv + h * Wh, W_};
    linear.weight_backward(cq, dq_h, {dwuq_ + h * Dh_, HD}, N, Q_, Dh_);
    linear.input_backward(dq_h, {wuq_ + h * Dh_, HD}, dcq, N, Q_, Dh_, beta);
    linear.weight_backward(ckv, dk_h, {dwuk_ + h * Dh_, HD}, N, C_, Dh_);
    linear.input_backward(dk_h, {wuk_ + h * Dh_, HD}, dckv, N, C_, Dh_, beta);
    linear.weight_backward(ckv, dv_h, {dwuv_ + h * Dh_, HD}, N, C_, Dh_);
    linear.input_backward(dv_h, {wuv_ + h * Dh_, HD}, dckv, N, C_, Dh_, T(1));
  }
  const T *cq_raw = norm_acts(acts, N), *ckv_raw = cq_raw + N * Cq_, *rstd_q = ckv_raw + N * C_, *rstd_kv = rstd_q + N;
  T *dcq_raw = norm_scratch(scratch, N), *dckv_raw = dcq_raw + N * Cq_;
  // dx = dc_kv Wdkv^T + the rotary parts + dc_q Wdq^T (through the norms when there are)
  latent_backward(x, wdkv_, gkv_, C_, ckv_raw, rstd_kv, dckv, dckv_raw, dwdkv_, dgkv_, dx, T(0), N);
  rotary_backward(x, cq, dq, dk, dqr, dkr, dcq, dx, B);
  if (Cq_ > 0)
    latent_backward(x, wdq_, gq_, Cq_, cq_raw, rstd_q, dcq, dcq_raw, dwdq_, dgq_, dx, T(1), N);
  else
    ops_.add_inplace(dx, dcq, N * D_);  // the queries read x: their gradient is x's directly
}

template class MlaAttention<float>;
template class MlaAttention<double>;

}  // namespace moe
