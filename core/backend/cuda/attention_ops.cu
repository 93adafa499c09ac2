// The CUDA ops' attention: the plain form per (batch, head) on the GEMMs, the fused form on cuDNN (where it is
// built), and the rotary table.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <optional>
#include <vector>

#include "core/backend/cuda/cuda_ops.cuh"
#ifdef MOE_HAVE_CUDNN
#include "core/backend/cuda/cudnn_attention.h"
#endif

namespace moe::cuda {

// x + off, or null where the operand is given in its other form (held rounded or as stored).
template <typename X>
const X* at(const X* x, int64_t off) {
  return x ? x + off : nullptr;
}

// Per (batch, head): S = scale Q K^T into the probabilities, the causal softmax over its rows, O = P V; q, k, v read
// as stored or held rounded (A_rounded, B_rounded), O held rounded through an fp32 workspace rounded once.
template <typename T>
void CudaOps<T>::attention_forward(const AttentionForwardArgs<T>& a) {
  check_attention_operands(a, "attention_forward");
  const AttentionShape& s = a.shape;
  const int64_t B = s.B, T_ = s.T, H = s.H, Dh = s.Dh, D = s.D();
  const GemmPrecision p = s.precision;
  for (int64_t bh = 0; bh < B * H; ++bh) {
    const int64_t off = s.offset(bh);
    T* P = a.probs + bh * T_ * T_;
    this->gemm({.trans_b = true,
                .M = T_,
                .N = T_,
                .K = Dh,
                .alpha = T(s.scale()),
                .A = at(a.q, off),
                .A_rounded = at(a.q_rounded, off),
                .lda = D,
                .B = at(a.k, off),
                .B_rounded = at(a.k_rounded, off),
                .ldb = D,
                .C = P,
                .ldc = T_,
                .precision = p});
  }
  launch_rows(row_launch(B * H * T_, T_), cuda::causal_softmax_kernel<T>, a.probs, B * H * T_, T_);
  const int64_t n = B * T_ * D;
  std::optional<Workspace> result;
  if (a.out_rounded) result.emplace(*ctx_.allocator, size_t(n) * sizeof(T));
  T* out = a.out_rounded ? static_cast<T*>(result->ptr) : a.out;
  for (int64_t bh = 0; bh < B * H; ++bh) {
    const int64_t off = s.offset(bh);
    this->gemm({.M = T_,
                .N = Dh,
                .K = T_,
                .A = a.probs + bh * T_ * T_,
                .lda = T_,
                .B = at(a.v, off),
                .B_rounded = at(a.v_rounded, off),
                .ldb = D,
                .C = out + off,
                .ldc = D,
                .precision = p});
  }
  if (a.out_rounded) round_values(out, a.out_rounded, n);
}

template <typename T>
void CudaOps<T>::attention_backward(const AttentionBackwardArgs<T>& a) {
  check_attention_operands(a, "attention_backward");
  const AttentionShape& s = a.shape;
  const int64_t B = s.B, T_ = s.T, H = s.H, Dh = s.Dh, D = s.D();
  const GemmPrecision p = s.precision;
  T* dS = a.scratch;
  for (int64_t bh = 0; bh < B * H; ++bh) {
    const int64_t off = s.offset(bh);
    const T* P = a.probs + bh * T_ * T_;
    this->gemm({.trans_b = true,
                .M = T_,
                .N = T_,
                .K = Dh,
                .A = a.dout + off,
                .lda = D,
                .B = at(a.v, off),
                .B_rounded = at(a.v_rounded, off),
                .ldb = D,
                .C = dS,
                .ldc = T_,
                .precision = p});  // dP = dO V^T
    this->gemm({.trans_a = true,
                .M = T_,
                .N = Dh,
                .K = T_,
                .A = P,
                .lda = T_,
                .B = a.dout + off,
                .ldb = D,
                .C = a.dv + off,
                .ldc = D,
                .precision = p});  // dV = P^T dO
    launch_rows(row_launch(T_, T_), cuda::softmax_backward_kernel<T>, P, dS, T_, s.scale());
    this->gemm({.M = T_,
                .N = Dh,
                .K = T_,
                .A = dS,
                .lda = T_,
                .B = at(a.k, off),
                .B_rounded = at(a.k_rounded, off),
                .ldb = D,
                .C = a.dq + off,
                .ldc = D,
                .precision = p});  // dQ = dS K
    this->gemm({.trans_a = true,
                .M = T_,
                .N = Dh,
                .K = T_,
                .A = dS,
                .lda = T_,
                .B = at(a.q, off),
                .B_rounded = at(a.q_rounded, off),
                .ldb = D,
                .C = a.dk + off,
                .ldc = D,
                .precision = p});  // dK = dS^T Q
  }
}

// Fused attention runs on cuDNN for fp32 storage under bf16 GEMMs (cudnn_attention.h), where it built the shape's
// plans; the operands are rounded to bf16 as the plain form's products read them.
template <typename T>
bool CudaOps<T>::fused_attention_supported(const AttentionShape& s) {
  if constexpr (sizeof(T) != 4) {
    return false;
  } else {
#ifdef MOE_HAVE_CUDNN
    if (!ctx_.attention || !this->fused_attention_allowed() || s.precision != GemmPrecision::Bf16 || !cudnn_enabled_ ||
        s.Dh % 8 != 0)
      return false;
    return ctx_.attention->supported({s.B, s.T, s.H, s.Dh});
#else
    (void)s;
    return false;
#endif
  }
}

// Sections of bf16 copies in one workspace, each at a 256-byte boundary.
struct Bf16Sections {
  Bf16Sections(CachingAllocator& a, int64_t count, int64_t n)
      : stride((n + 127) / 128 * 128), space(a, size_t(sizes::bf16_sections_bytes(double(count), double(n)))) {}
  uint16_t* operator[](int64_t i) const { return static_cast<uint16_t*>(space.ptr) + i * stride; }
  int64_t stride;
  Workspace space;
};

// Whether cuDNN reads a held operand where it is: 16-byte aligned (MhaAttention places its held tensors so).
inline bool in_place(const void* held) { return held && reinterpret_cast<uintptr_t>(held) % 16 == 0; }
// The sections a call needs for its held-or-stored operands (`count` of them), besides `others`.
inline int64_t sections_for(const void* const* held, int count, int64_t others) {
  for (int i = 0; i < count; ++i) others += in_place(held[i]) ? 0 : 1;
  return others;
}

// cuDNN's bf16 operand for x as stored or held: the held one where it is in place, else the next section, x rounded
// into it or the held one copied.
template <typename T>
const void* CudaOps<T>::cudnn_operand(const T* x, const void* held, int64_t n, const Bf16Sections& b, int64_t& next) {
  if (in_place(held)) return held;
  uint16_t* section = b[next++];
  if (held)
    MOE_CUDA_CHECK(cudaMemcpyAsync(section, held, size_t(n) * 2, cudaMemcpyDeviceToDevice, ctx_.stream));
  else
    round_operand(x, 1, n, n, section);
  return section;
}

// cuDNN's bf16 result in `result` to where the call wants it: widened into out, or copied into out_rounded (nothing
// where cuDNN wrote it there).
template <typename T>
void CudaOps<T>::store_cudnn_result(const uint16_t* result, T* out, void* out_rounded, int64_t n) {
  if (out_rounded == result) return;
  if (out_rounded)
    MOE_CUDA_CHECK(cudaMemcpyAsync(out_rounded, result, size_t(n) * 2, cudaMemcpyDeviceToDevice, ctx_.stream));
  else
    launch(elementwise_launch(n), cuda::from_bf16_kernel<T>, result, out, n);
}

// q, k, v and O as cuDNN reads and writes them: held ones in place (MhaAttention's), others through sections.
template <typename T>
void CudaOps<T>::attention_forward_fused(const FusedAttentionForwardArgs<T>& a) {
  check_attention_operands(a, "attention_forward_fused");
  const int64_t B = a.shape.B, T_ = a.shape.T, H = a.shape.H, Dh = a.shape.Dh;
  MOE_CHECK(fused_attention_supported(a.shape),
            "fused attention on the cuda backend for B " << B << " T " << T_ << " H " << H << " Dh " << Dh);
#ifdef MOE_HAVE_CUDNN
  if constexpr (sizeof(T) == 4) {
    const int64_t n = B * T_ * H * Dh;
    const void* held[4] = {a.q_rounded, a.k_rounded, a.v_rounded, a.out_rounded};
    const T* stored[3] = {a.q, a.k, a.v};
    Bf16Sections b(*ctx_.allocator, sections_for(held, 4, 0), n);
    int64_t next = 0;
    const void* in[3];
    for (int i = 0; i < 3; ++i) in[i] = cudnn_operand(stored[i], held[i], n, b, next);
    void* o = in_place(a.out_rounded) ? static_cast<void*>(a.out_rounded) : b[next++];
    // The statistics through aligned workspace: the caller's may sit at any float of an activation arena.
    Workspace aligned_stats(*ctx_.allocator, size_t(sizes::attention_stats_bytes(double(B), double(T_), double(H))));
    ctx_.attention->forward({B, T_, H, Dh}, in[0], in[1], in[2], o, static_cast<float*>(aligned_stats.ptr));
    copy(static_cast<const T*>(aligned_stats.ptr), a.stats, B * H * T_);
    store_cudnn_result(static_cast<const uint16_t*>(o), a.out, a.out_rounded, n);
  }
#endif
}

template <typename T>
void CudaOps<T>::attention_backward_fused(const FusedAttentionBackwardArgs<T>& a) {
  check_attention_operands(a, "attention_backward_fused");
  const int64_t B = a.shape.B, T_ = a.shape.T, H = a.shape.H, Dh = a.shape.Dh;
  MOE_CHECK(fused_attention_supported(a.shape),
            "fused attention on the cuda backend for B " << B << " T " << T_ << " H " << H << " Dh " << Dh);
#ifdef MOE_HAVE_CUDNN
  if constexpr (sizeof(T) == 4) {
    const int64_t n = B * T_ * H * Dh;
    const void* held[4] = {a.q_rounded, a.k_rounded, a.v_rounded, a.out_rounded};
    const T* stored[5] = {a.q, a.k, a.v, a.out, a.dout};
    Bf16Sections b(*ctx_.allocator, sections_for(held, 4, 4), n);  // and dO, dq, dk, dv
    int64_t next = 0;
    const void* in[5];
    for (int i = 0; i < 5; ++i) in[i] = cudnn_operand(stored[i], i < 4 ? held[i] : nullptr, n, b, next);
    Workspace aligned_stats(*ctx_.allocator, size_t(sizes::attention_stats_bytes(double(B), double(T_), double(H))));
    copy(a.stats, static_cast<T*>(aligned_stats.ptr), B * H * T_);
    ctx_.attention->backward({B, T_, H, Dh}, in[0], in[1], in[2], in[3], static_cast<const float*>(aligned_stats.ptr),
                             in[4], b[next], b[next + 1], b[next + 2]);
    T* outputs[3] = {a.dq, a.dk, a.dv};
    for (int i = 0; i < 3; ++i) launch(elementwise_launch(n), cuda::from_bf16_kernel<T>, b[next + i], outputs[i], n);
  }
#endif
}

template <typename T>
const T* CudaOps<T>::rope_table(int64_t T_, int64_t Dh) {
  if (rope_seq_ == T_ && rope_dh_ == Dh) return static_cast<const T*>(rope_);
  const int64_t pairs = Dh / 2;
  std::vector<T> host(size_t(2 * T_ * pairs));
  for (int64_t i = 0; i < pairs; ++i) {
    const double frequency = std::pow(cuda::kRopeBase, -2.0 * double(i) / double(Dh));
    for (int64_t t = 0; t < T_; ++t) {
      host[size_t(2 * (t * pairs + i))] = T(std::cos(double(t) * frequency));
      host[size_t(2 * (t * pairs + i) + 1)] = T(std::sin(double(t) * frequency));
    }
  }
  if (rope_) ctx_.allocator->free(rope_);
  rope_ = ctx_.allocator->allocate(size_t(sizes::rope_table_bytes(double(T_), double(Dh), double(sizeof(T)))));
  MOE_CUDA_CHECK(cudaMemcpyAsync(rope_, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice, ctx_.stream));
  ctx_.watchers->wait(ctx_.stream);  // the host vector goes when this returns
  rope_seq_ = T_, rope_dh_ = Dh;
  return static_cast<const T*>(rope_);
}

template void CudaOps<float>::attention_forward(const AttentionForwardArgs<float>&);
template void CudaOps<float>::attention_backward(const AttentionBackwardArgs<float>&);
template bool CudaOps<float>::fused_attention_supported(const AttentionShape&);
template void CudaOps<float>::attention_forward_fused(const FusedAttentionForwardArgs<float>&);
template void CudaOps<float>::attention_backward_fused(const FusedAttentionBackwardArgs<float>&);
template const float* CudaOps<float>::rope_table(int64_t, int64_t);
template void CudaOps<double>::attention_forward(const AttentionForwardArgs<double>&);
template void CudaOps<double>::attention_backward(const AttentionBackwardArgs<double>&);
template bool CudaOps<double>::fused_attention_supported(const AttentionShape&);
template void CudaOps<double>::attention_forward_fused(const FusedAttentionForwardArgs<double>&);
template void CudaOps<double>::attention_backward_fused(const FusedAttentionBackwardArgs<double>&);
template const double* CudaOps<double>::rope_table(int64_t, int64_t);

}  // namespace moe::cuda
