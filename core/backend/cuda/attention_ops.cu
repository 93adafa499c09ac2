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
void CudaOps<T>::attention_forward(const T* q, const T* k, const T* v, T* out, T* probs, int64_t B, int64_t T_,
                                   int64_t H, int64_t Dh) {
  const int64_t D = H * Dh;
  const T scale = T(1.0 / std::sqrt(double(Dh)));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      const int64_t off = b * T_ * D + h * Dh;
      T* P = probs + (b * H + h) * T_ * T_;
      gemm(false, true, T_, T_, Dh, scale, q + off, D, k + off, D, T(0), P, T_);
    }
  launch_rows(row_launch(B * H * T_, T_), cuda::causal_softmax_kernel<T>, probs, B * H * T_, T_);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      const int64_t off = b * T_ * D + h * Dh;
      gemm(false, false, T_, Dh, T_, T(1), probs + (b * H + h) * T_ * T_, T_, v + off, D, T(0), out + off, D);
    }
}

template <typename T>
void CudaOps<T>::attention_backward(const T* q, const T* k, const T* v, const T* probs, const T* dout, T* dq, T* dk,
                                    T* dv, T* scratch, int64_t B, int64_t T_, int64_t H, int64_t Dh) {
  const int64_t D = H * Dh;
  const double scale = 1.0 / std::sqrt(double(Dh));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      const int64_t off = b * T_ * D + h * Dh;
      const T* P = probs + (b * H + h) * T_ * T_;
      gemm(false, true, T_, T_, Dh, T(1), dout + off, D, v + off, D, T(0), scratch, T_);  // dP = dO V^T
      gemm(true, false, T_, Dh, T_, T(1), P, T_, dout + off, D, T(0), dv + off, D);       // dV = P^T dO
      launch_rows(row_launch(T_, T_), cuda::softmax_backward_kernel<T>, P, scratch, T_, scale);
      gemm(false, false, T_, Dh, T_, T(1), scratch, T_, k + off, D, T(0), dq + off, D);  // dQ = dS K
      gemm(true, false, T_, Dh, T_, T(1), scratch, T_, q + off, D, T(0), dk + off, D);   // dK = dS^T Q
    }
}

// Fused attention runs on cuDNN for fp32 storage under bf16 GEMMs (cudnn_attention.h), where it built the shape's
// plans; the operands are rounded to bf16 as the plain form's products read them.
template <typename T>
bool CudaOps<T>::fused_attention_supported(int64_t B, int64_t T_, int64_t H, int64_t Dh) {
  if constexpr (sizeof(T) != 4) {
    return false;
  } else {
#ifdef MOE_HAVE_CUDNN
    if (!ctx_.attention || !this->fused_attention_allowed() || this->gemm_precision() != GemmPrecision::Bf16 ||
        !cudnn_enabled_ || Dh % 8 != 0)
      return false;
    return ctx_.attention->supported({B, T_, H, Dh});
#else
    (void)B, (void)T_, (void)H, (void)Dh;
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
void CudaOps<T>::attention_forward_fused(const T* q, const T* k, const T* v, T* out, T* stats, int64_t B, int64_t T_,
                                         int64_t H, int64_t Dh) {
  MOE_CHECK(fused_attention_supported(B, T_, H, Dh),
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
void CudaOps<T>::attention_backward_fused(const T* q, const T* k, const T* v, const T* out, const T* stats,
                                          const T* dout, T* dq, T* dk, T* dv, int64_t B, int64_t T_, int64_t H,
                                          int64_t Dh) {
  MOE_CHECK(fused_attention_supported(B, T_, H, Dh),
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

template void CudaOps<float>::attention_forward(const float*, const float*, const float*, float*, float*, int64_t,
                                                int64_t, int64_t, int64_t);
template void CudaOps<float>::attention_backward(const float*, const float*, const float*, const float*, const float*,
                                                 float*, float*, float*, float*, int64_t, int64_t, int64_t, int64_t);
template bool CudaOps<float>::fused_attention_supported(int64_t, int64_t, int64_t, int64_t);
template void CudaOps<float>::attention_forward_fused(const float*, const float*, const float*, float*, float*, int64_t,
                                                      int64_t, int64_t, int64_t);
template void CudaOps<float>::attention_backward_fused(const float*, const float*, const float*, const float*,
                                                       const float*, const float*, float*, float*, float*, int64_t,
                                                       int64_t, int64_t, int64_t);
template const float* CudaOps<float>::rope_table(int64_t, int64_t);
template void CudaOps<double>::attention_forward(const double*, const double*, const double*, double*, double*, int64_t,
                                                 int64_t, int64_t, int64_t);
template void CudaOps<double>::attention_backward(const double*, const double*, const double*, const double*,
                                                  const double*, double*, double*, double*, double*, int64_t, int64_t,
                                                  int64_t, int64_t);
template bool CudaOps<double>::fused_attention_supported(int64_t, int64_t, int64_t, int64_t);
template void CudaOps<double>::attention_forward_fused(const double*, const double*, const double*, double*, double*,
                                                       int64_t, int64_t, int64_t, int64_t);
template void CudaOps<double>::attention_backward_fused(const double*, const double*, const double*, const double*,
                                                        const double*, const double*, double*, double*, double*,
                                                        int64_t, int64_t, int64_t, int64_t);
template const double* CudaOps<double>::rope_table(int64_t, int64_t);

}  // namespace moe::cuda
