// The CUDA ops' attention: the plain form per (batch, head) on the GEMMs, the fused form on cuDNN (where it is
// built), and the rotary table.
#include <cuda_runtime.h>

#include <cmath>
#include <vector>

#include "core/backend/cuda/cuda_ops.cuh"
#ifdef MOE_HAVE_CUDNN
#include "core/backend/cuda/cudnn_attention.h"
#endif

namespace moe::cuda {

// Per (batch, head): S = scale Q K^T into the probabilities, the causal softmax over its rows, O = P V.
template <typename T>
void CudaOps<T>::attention_forward(const AttentionForwardArgs<T>& a) {
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
                .A = a.q + off,
                .lda = D,
                .B = a.k + off,
                .ldb = D,
                .C = P,
                .ldc = T_,
                .precision = p});
  }
  launch_rows(row_launch(B * H * T_, T_), cuda::causal_softmax_kernel<T>, a.probs, B * H * T_, T_);
  for (int64_t bh = 0; bh < B * H; ++bh) {
    const int64_t off = s.offset(bh);
    this->gemm({.M = T_,
                .N = Dh,
                .K = T_,
                .A = a.probs + bh * T_ * T_,
                .lda = T_,
                .B = a.v + off,
                .ldb = D,
                .C = a.out + off,
                .ldc = D,
                .precision = p});
  }
}

template <typename T>
void CudaOps<T>::attention_backward(const AttentionBackwardArgs<T>& a) {
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
                .B = a.v + off,
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
                .B = a.k + off,
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
                .B = a.q + off,
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

template <typename T>
void CudaOps<T>::attention_forward_fused(const FusedAttentionForwardArgs<T>& a) {
  const int64_t B = a.shape.B, T_ = a.shape.T, H = a.shape.H, Dh = a.shape.Dh;
  const T *q = a.q, *k = a.k, *v = a.v;
  T *out = a.out, *stats = a.stats;
  MOE_CHECK(fused_attention_supported(a.shape),
            "fused attention on the cuda backend for B " << B << " T " << T_ << " H " << H << " Dh " << Dh);
#ifdef MOE_HAVE_CUDNN
  if constexpr (sizeof(T) == 4) {
    const int64_t n = B * T_ * H * Dh;
    Bf16Sections b(*ctx_.allocator, 4, n);  // q, k, v, o
    round_operand(q, 1, n, n, b[0]), round_operand(k, 1, n, n, b[1]), round_operand(v, 1, n, n, b[2]);
    // The statistics through aligned workspace: the caller's may sit at any float of an activation arena.
    Workspace aligned_stats(*ctx_.allocator, size_t(sizes::attention_stats_bytes(double(B), double(T_), double(H))));
    ctx_.attention->forward({B, T_, H, Dh}, b[0], b[1], b[2], b[3], static_cast<float*>(aligned_stats.ptr));
    copy(static_cast<const T*>(aligned_stats.ptr), stats, B * H * T_);
    launch(elementwise_launch(n), cuda::from_bf16_kernel<T>, b[3], out, n);
  }
#endif
}

template <typename T>
void CudaOps<T>::attention_backward_fused(const FusedAttentionBackwardArgs<T>& a) {
  const int64_t B = a.shape.B, T_ = a.shape.T, H = a.shape.H, Dh = a.shape.Dh;
  const T *q = a.q, *k = a.k, *v = a.v, *out = a.out, *stats = a.stats, *dout = a.dout;
  T *dq = a.dq, *dk = a.dk, *dv = a.dv;
  MOE_CHECK(fused_attention_supported(a.shape),
            "fused attention on the cuda backend for B " << B << " T " << T_ << " H " << H << " Dh " << Dh);
#ifdef MOE_HAVE_CUDNN
  if constexpr (sizeof(T) == 4) {
    const int64_t n = B * T_ * H * Dh;
    Bf16Sections b(*ctx_.allocator, 8, n);  // q, k, v, o, do; dq, dk, dv
    const T* inputs[5] = {q, k, v, out, dout};
    for (int i = 0; i < 5; ++i) round_operand(inputs[i], 1, n, n, b[i]);
    Workspace aligned_stats(*ctx_.allocator, size_t(sizes::attention_stats_bytes(double(B), double(T_), double(H))));
    copy(stats, static_cast<T*>(aligned_stats.ptr), B * H * T_);
    ctx_.attention->backward({B, T_, H, Dh}, b[0], b[1], b[2], b[3], static_cast<const float*>(aligned_stats.ptr), b[4],
                             b[5], b[6], b[7]);
    T* outputs[3] = {dq, dk, dv};
    for (int i = 0; i < 3; ++i) launch(elementwise_launch(n), cuda::from_bf16_kernel<T>, b[5 + i], outputs[i], n);
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
