// Multi-head latent attention (DeepSeek-V2; model.attention = "mla", docs/model.md "Multi-head latent
// attention"), an Attention made by the model's attention factory like MhaAttention. Keys and values come
// from one shared low-rank latent c_kv = x Wdkv, queries from another, c_q = x Wdq; each head's query and key
// are its "content" part (c_q Wuq, c_kv Wuk) beside a decoupled rotary part (RoPE(c_q Wqr) per head, and one
// RoPE(x Wkr) shared by every head), so a cache would hold c_kv and the shared rotary key only. Written with
// the backend's ops alone: a head's query and key are [content (Dh) | rotary (R)] in one row of width
// H (Dh + R), the values padded with zeros to that width, so the standard attention op computes
// softmax(q k^T / sqrt(Dh + R)) v; per-head blocks are written by strided GEMMs and the rotary parts placed
// by a GEMM with an identity (exact: each output is 1 * x plus exact zeros). Not split over tensor-parallel
// ranks (the config refuses parallel.tp > 1 with mla).
// With MlaShape::q_rank = 0 (DeepSeek-V2-Lite's q_lora_rank null) there is no query latent: the queries are
// projected from x itself (Wuq and Wqr read x, c_q is x), and there is no query norm.
// With MlaShape::norms (model.mla.norms, DeepSeek-V3's q_a_layernorm and kv_a_layernorm), each latent is an
// RMSNorm of its down-projection, with a gain and epsilon 1e-6: the backend's RMSNorm (epsilon 1e-5) of the
// down-projection times sqrt(10), the same function (RMSNorm(s v) with epsilon e is RMSNorm(v) with e / s^2).
#pragma once

#include <cstdint>
#include <string>

#include "core/attention.h"

namespace moe {

// The latent widths: C the key/value latent, Cq the query latent (0: none, the queries from x), R each head's
// rotary part (even).
struct MlaShape {
  int64_t kv_rank = 32, q_rank = 64, rope_dim = 16;
  bool norms = false;  // RMSNorms (with gains) on c_q and c_kv
};

template <typename T>
class MlaAttention final : public Attention<T> {
 public:
  MlaAttention(Backend& backend, int64_t d_model, int64_t heads, int64_t seq_len, int64_t layers_total, MlaShape shape);
  void register_params(ParamTable& table, const std::string& prefix) override;
  void bind(const ParamTable& table, T* params, T* grads) override;
  void set_keep_probabilities(bool keep) override { keep_probs_ = keep; }
  void set_precision(GemmPrecision precision) override { precision_ = precision; }
  // c_q (N, Cq; none when Cq is 0), c_kv (N, C), q, k, v, the attention's output (N, W) each, W = H (Dh + R), when kept
  // the probabilities (B, H, T, T), and with norms the latents before them and their inverse RMS (N) each. Under
  // bf16 GEMMs q, k, v and the output are held rounded (built in fp32 in the scratch, rounded once; the attention op
  // reads them and writes its output so, and Wo's products read it): the same bits, half their memory.
  int64_t activation_size(int64_t N) const override { return sizes::elements(sizes::mla(shape(), N).activations); }
  // dq, dk, dv, d(att) (N, W) each, one (T, T) block, dc_q, dc_kv, the rotary parts (N, H R) and (N, R), and
  // when not kept the recomputed probabilities, and with norms the gradients of the latents before them.
  int64_t scratch_size(int64_t N) const override { return sizes::elements(sizes::mla(shape(), N).scratch); }
  double forward_flops(int64_t N) const override;
  void forward(const T* x, T* y, T* acts, T* scratch, int64_t B) override;
  void backward(const T* x, const T* dy, T* dx, const T* acts, T* scratch, int64_t B) override;
  // Elements a key/value cache would keep per token and layer: c_kv and the shared rotary key (C + R),
  // against 2 D for multi-head attention.
  int64_t kv_cache_elements_per_token() const { return sizes::elements(sizes::mla_kv_cache(shape())); }

 private:
  int64_t probs_size(int64_t N) const { return N * H_ * T_; }
  // The attention op's shape for B sequences: heads of width Dh + R at the layer's precision.
  AttentionShape shape_of(int64_t B) const { return {B, T_, H_, Dh_ + R_, precision_}; }
  // The layer's shape, as core/sizes.h declares its sizes.
  sizes::MlaShape shape() const {
    return {double(D_), double(H_), double(T_),  double(C_),          double(Cq_),
            double(R_), norms_,     keep_probs_, held_size<T>(held())};
  }
  bool held() const { return precision_ == GemmPrecision::Bf16; }
  // q, k, v and the attention's output in acts, after the latents: as stored, or held rounded (kept_rounded).
  T* kept(T* acts, int64_t N) const { return acts + N * (Cq_ + C_); }
  Rounded<T>* kept_rounded(const T* acts, int64_t N) const {
    return reinterpret_cast<Rounded<T>*>(const_cast<T*>(acts) + N * (Cq_ + C_));
  }
  int64_t kept_size(int64_t N) const { return sizes::elements(sizes::mla_kept(shape(), double(N))); }
  // The probabilities when kept, after q, k, v and the output.
  T* kept_probabilities(T* acts, int64_t N) const { return kept(acts, N) + kept_size(N); }
  // With norms: the latents before them (N, Cq) and (N, C), then their inverse RMS (N) each.
  T* norm_acts(T* acts, int64_t N) const { return kept_probabilities(acts, N) + (keep_probs_ ? probs_size(N) : 0); }
  const T* norm_acts(const T* acts, int64_t N) const { return norm_acts(const_cast<T*>(acts), N); }
  T* norm_scratch(T* scratch, int64_t N) const {
    return scratch + 4 * N * W_ + T_ * T_ + N * (Q_ + C_ + H_ * R_ + R_) + (keep_probs_ ? 0 : probs_size(N));
  }
  // c = x Wd, or with norms c = RMSNorm(sqrt(10) x Wd) (raw: the latent before it, rstd its inverse RMS).
  void latent_forward(const T* x, const T* wd, const T* gain, int64_t width, T* c, T* raw, T* rstd, int64_t N) const;
  // From dc (the latent's gradient): dWd += x^T dc_raw and dx (+= when beta is 1) dc_raw Wd^T.
  void latent_backward(const T* x, const T* wd, const T* gain, int64_t width, const T* raw, const T* rstd, const T* dc,
                       T* draw, T* dwd, T* dgain, T* dx, T beta, int64_t N) const;
  T* recomputed_probabilities(T* scratch, int64_t N) const {
    return scratch + 4 * N * W_ + T_ * T_ + N * (Q_ + C_ + H_ * R_ + R_);
  }
  // dst (rows, R) at stride ldd = src (rows, R) at stride lds, times the identity (+ beta dst).
  void place(const T* src, int64_t lds, T* dst, int64_t ldd, int64_t rows, T beta) const;
  // The attention's inputs as acts keep them (held: rounded into acts from q, k, v in the scratch, once).
  AttentionInputs<T> inputs(const T* acts, int64_t N) const;
  // y += att Wo over the heads' value columns, att as stored or held rounded (att_rounded, att null).
  void output_forward(const T* att, const Rounded<T>* att_rounded, T* y, int64_t N) const;
  // dWo += att^T dy, datt = dy Wo^T per head (datt's padding columns zero).
  void output_backward(const T* att, const Rounded<T>* att_rounded, const T* dy, T* datt, int64_t N) const;
  // The rotary parts of queries (N, H R) and the shared key (N, R), rotated, into q and k.
  void rotary_forward(const T* x, const T* cq, T* q, T* k, T* qr, T* kr, int64_t B) const;
  // From dq, dk (N, W): the rotary parts' gradients into Wqr, Wkr, dcq (+=) and dx (+=).
  void rotary_backward(const T* x, const T* cq, const T* dq, const T* dk, T* dqr, T* dkr, T* dcq, T* dx,
                       int64_t B) const;

  Ops<T>& ops_;
  int64_t D_, H_, T_, L_, Dh_, C_, Cq_, R_, W_;
  int64_t Q_;  // the queries' input width: Cq, or D when they are projected from x
  bool norms_;
  bool keep_probs_ = true;
  GemmPrecision precision_ = GemmPrecision::Fp32;
  std::string prefix_;
  Buffer identity_;  // (R, R)
  const T *wdq_ = nullptr, *wuq_ = nullptr, *wqr_ = nullptr, *wdkv_ = nullptr, *wuk_ = nullptr, *wuv_ = nullptr,
          *wkr_ = nullptr, *wo_ = nullptr, *gq_ = nullptr, *gkv_ = nullptr;
  T *dgq_ = nullptr, *dgkv_ = nullptr;
  T *dwdq_ = nullptr, *dwuq_ = nullptr, *dwqr_ = nullptr, *dwdkv_ = nullptr, *dwuk_ = nullptr, *dwuv_ = nullptr,
    *dwkr_ = nullptr, *dwo_ = nullptr;
};

}  // namespace moe
