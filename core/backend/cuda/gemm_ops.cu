// The CUDA ops' GEMMs: cuBLAS in fp32/fp64, or on operands rounded to bf16 (the parameters' rounded copy, or
// workspace); the experts' as one grouped call.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <optional>
#include <vector>

#include "core/backend/cuda/cuda_ops.cuh"

namespace moe::cuda {

// GemmPrecision::Bf16: both operands rounded into packed workspace, then cuBLAS with bf16 inputs, fp32
// products summed in fp32 (tensor cores) into the fp32 C. fp64 storage: the rounded values in fp64, a DGEMM.
template <typename T>
void CudaOps<T>::gemm_bf16(const typename Ops<T>::Gemm& g) {
  const bool trans_a = g.trans_a, trans_b = g.trans_b;
  const int64_t M = g.M, N = g.N, K = g.K, ldc = g.ldc;
  int64_t lda = g.lda, ldb = g.ldb;
  const T alpha = g.alpha, beta = g.beta;
  T* C = g.C;
  std::optional<Workspace> a_space, b_space;  // for operands that are not the weight
  const void* a = g.A_rounded
                      ? static_cast<const void*>(g.A_rounded)  // as its producer rounded it
                      : gemm_operand(g.A, g.weight == GemmWeight::A, trans_a ? K : M, trans_a ? M : K, lda, a_space);
  const void* b = g.B_rounded
                      ? static_cast<const void*>(g.B_rounded)
                      : gemm_operand(g.B, g.weight == GemmWeight::B, trans_b ? N : K, trans_b ? K : N, ldb, b_space);
  if constexpr (sizeof(T) == 4) {
    MOE_CUBLAS_CHECK(cublasGemmEx(ctx_.blas, op(trans_b), op(trans_a), int(N), int(M), int(K), &alpha, b, CUDA_R_16BF,
                                  int(ldb), a, CUDA_R_16BF, int(lda), &beta, C, CUDA_R_32F, int(ldc),
                                  CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  } else {
    MOE_CUBLAS_CHECK(blas_gemm<T>(ctx_.blas, op(trans_b), op(trans_a), int(N), int(M), int(K), &alpha,
                                  static_cast<const T*>(b), int(ldb), static_cast<const T*>(a), int(lda), &beta, C,
                                  int(ldc)));
  }
}

// Contiguous (one row, or ld == cols): one grid-stride loop; strided: one block per row.
template <typename T>
template <typename R>
void CudaOps<T>::round_into(const T* x, int64_t rows, int64_t cols, int64_t ld, R* out) {
  if (rows == 1 || ld == cols)
    launch(elementwise_launch(rows * cols), cuda::round_contiguous_kernel<T, R>, x, rows * cols, out);
  else
    launch(row_launch(rows, cols), cuda::round_rows_kernel<T, R>, x, rows, cols, ld, out);
}

template <typename T>
void CudaOps<T>::round_operand(const T* x, int64_t rows, int64_t cols, int64_t ld, void* out) {
  if constexpr (sizeof(T) == 4)
    round_into(x, rows, cols, ld, static_cast<uint16_t*>(out));
  else
    round_into(x, rows, cols, ld, static_cast<T*>(out));
}

template <typename T>
const void* CudaOps<T>::rounded_parameter(const T* x) {
  if (!this->in_parameters(x)) return nullptr;
  const size_t bytes = parameter_copy_bytes();
  if (rounded_bytes_ != bytes) {
    if (rounded_) ctx_.allocator->free(rounded_);
    rounded_ = ctx_.allocator->allocate(bytes), rounded_bytes_ = bytes, rounded_version_ = ~uint64_t(0);
  }
  if (rounded_version_ != this->parameter_version()) {
    round_operand(this->parameter_memory(), 1, this->parameter_count(), this->parameter_count(), rounded_);
    rounded_version_ = this->parameter_version();
  }
  return static_cast<const char*>(rounded_) + (x - this->parameter_memory()) * int64_t(kOperandBytes);
}

template <typename T>
const void* CudaOps<T>::gemm_operand(const T* X, bool weight, int64_t rows, int64_t cols, int64_t& ld,
                                     std::optional<Workspace>& w) {
  if (weight)
    if (const void* r = rounded_parameter(X)) return r;
  w.emplace(*ctx_.allocator, size_t(sizes::rounded_operand_bytes(double(rows * cols), double(sizeof(T)))));
  round_operand(X, rows, cols, ld, w->ptr);
  ld = cols;
  return w->ptr;
}

template <typename T>
cublasStatus_t grouped_call(cublasHandle_t h, const cublasOperation_t* ta, const cublasOperation_t* tb, const int* m,
                            const int* n, const int* k, const T* alpha, const T* const* A, const int* lda,
                            const T* const* B, const int* ldb, const T* beta, T* const* C, const int* ldc, int groups,
                            const int* group_size) {
  if constexpr (sizeof(T) == 4)
    return cublasSgemmGroupedBatched(h, ta, tb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc, groups, group_size);
  else
    return cublasDgemmGroupedBatched(h, ta, tb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc, groups, group_size);
}

// One cuBLAS call for every non-empty expert: the plan's per-group arguments on the host, its operand
// pointers in a device array.
template <typename T>
void CudaOps<T>::run_grouped_gemm(const typename Ops<T>::GroupedGemm& g) {
  const int64_t groups = g.groups, N = g.N, K = g.K;
  const int64_t* row_offset = g.row_offset;
  const T alpha = g.alpha, beta = g.beta, *A = g.A, *B = g.B;
  T* C = g.C;
  const GroupedGemmPlan plan = plan_grouped_gemm(g.trans_a, g.trans_b, groups, row_offset, N, K);
  const size_t P = plan.problems();
  if (P == 0) return;
  if (g.precision == GemmPrecision::Bf16 && K > 0) {
    // Both operands are contiguous, so rounded whole as one row each (the plan's offsets hold for the copies);
    // the experts' weights come from the parameters' rounded copy when the call names them.
    int64_t a_count = row_offset[groups] * K, b_count = g.trans_a ? row_offset[groups] * N : groups * K * N;
    std::optional<Workspace> a_space, b_space;
    const void* a = g.A_rounded ? static_cast<const void*>(g.A_rounded)
                                : gemm_operand(A, g.weight == GemmWeight::A, 1, a_count, a_count, a_space);
    const void* b = g.B_rounded ? static_cast<const void*>(g.B_rounded)
                                : gemm_operand(B, g.weight == GemmWeight::B, 1, b_count, b_count, b_space);
    if (!g.C_rounded) return grouped_call_bf16(plan, alpha, a, b, beta, C, false);
    grouped_call_bf16(plan, alpha, a, b, beta, g.C_rounded, true);
    if constexpr (sizeof(T) == 8) {  // fp64 storage: the DGEMM's results rounded in place
      T* rows = g.C_rounded + row_offset[0] * N;
      const int64_t count = (row_offset[groups] - row_offset[0]) * N;
      round_into(rows, 1, count, count, rows);
    }
    return;
  }
  std::vector<cublasOperation_t> ta(P), tb(P);
  std::vector<T> alphas(P, alpha), betas(P, beta);
  std::vector<int> sizes(P, 1);
  std::vector<const T*> host_pointers(3 * P);  // first operands, second operands, C
  for (size_t i = 0; i < P; ++i) {
    ta[i] = op(plan.trans_first[i]), tb[i] = op(plan.trans_second[i]);
    host_pointers[i] = B + plan.first_offset[i];
    host_pointers[P + i] = A + plan.second_offset[i];
    host_pointers[2 * P + i] = C + plan.c_offset[i];
  }
  Workspace pointers(*ctx_.allocator, size_t(sizes::grouped_gemm_pointer_bytes(double(P))));
  // From pageable memory: returns once the host array is staged, so it may go out of scope.
  MOE_CUDA_CHECK(cudaMemcpyAsync(pointers.ptr, host_pointers.data(), host_pointers.size() * sizeof(T*),
                                 cudaMemcpyHostToDevice, ctx_.stream));
  const T* const* device = static_cast<const T* const*>(pointers.ptr);
  MOE_CUBLAS_CHECK(grouped_call<T>(ctx_.blas, ta.data(), tb.data(), plan.m.data(), plan.n.data(), plan.k.data(),
                                   alphas.data(), device, plan.ld_first.data(), device + P, plan.ld_second.data(),
                                   betas.data(), const_cast<T* const*>(device + 2 * P), plan.ld_c.data(), int(P),
                                   sizes.data()));
}

// The grouped GEMM on rounded operands (packed like the originals). fp32 storage: one
// cublasGemmGroupedBatchedEx with bf16 inputs and fp32 C, or bf16 C (c_rounded: GroupedGemmArgs::C_rounded, the
// fp32 sums rounded as they are stored); where this cuBLAS does not take that combination, one cublasGemmEx per
// expert (said once on stderr). fp64 storage: the rounded values through the DGEMM path (the caller rounds a
// c_rounded result).
template <typename T>
void CudaOps<T>::grouped_call_bf16(const GroupedGemmPlan& plan, T alpha, const void* A, const void* B, T beta, void* C,
                                   bool c_rounded) {
  const size_t P = plan.problems();
  const auto* a = static_cast<const char*>(A);
  const auto* b = static_cast<const char*>(B);
  const size_t c_bytes = c_rounded ? sizeof(Rounded<T>) : sizeof(T);
  const cudaDataType_t c_type = c_rounded && sizeof(T) == 4 ? CUDA_R_16BF : CUDA_R_32F;
  std::vector<cublasOperation_t> ta(P), tb(P);
  std::vector<T> alphas(P, alpha), betas(P, beta);
  std::vector<int> sizes(P, 1);
  std::vector<const void*> host_pointers(3 * P);
  for (size_t i = 0; i < P; ++i) {
    ta[i] = op(plan.trans_first[i]), tb[i] = op(plan.trans_second[i]);
    host_pointers[i] = b + plan.first_offset[i] * int64_t(kOperandBytes);
    host_pointers[P + i] = a + plan.second_offset[i] * int64_t(kOperandBytes);
    host_pointers[2 * P + i] = static_cast<char*>(C) + plan.c_offset[i] * int64_t(c_bytes);
  }
  // The device array of operand pointers the grouped calls read (the per-expert fallback needs none).
  std::optional<Workspace> pointers;
  auto device_pointers = [&] {
    pointers.emplace(*ctx_.allocator, size_t(sizes::grouped_gemm_pointer_bytes(double(P))));
    MOE_CUDA_CHECK(cudaMemcpyAsync(pointers->ptr, host_pointers.data(), host_pointers.size() * sizeof(void*),
                                   cudaMemcpyHostToDevice, ctx_.stream));
    return static_cast<const void* const*>(pointers->ptr);
  };
  if constexpr (sizeof(T) == 8) {
    const void* const* device = device_pointers();
    MOE_CUBLAS_CHECK(grouped_call<T>(ctx_.blas, ta.data(), tb.data(), plan.m.data(), plan.n.data(), plan.k.data(),
                                     alphas.data(), reinterpret_cast<const T* const*>(device), plan.ld_first.data(),
                                     reinterpret_cast<const T* const*>(device + P), plan.ld_second.data(), betas.data(),
                                     reinterpret_cast<T* const*>(const_cast<void**>(device + 2 * P)), plan.ld_c.data(),
                                     int(P), sizes.data()));
    return;
  } else {
    if (!grouped_bf16_refused_[c_rounded]) {
      const void* const* device = device_pointers();
      const cublasStatus_t grouped = cublasGemmGroupedBatchedEx(
          ctx_.blas, ta.data(), tb.data(), plan.m.data(), plan.n.data(), plan.k.data(), alphas.data(), device,
          CUDA_R_16BF, plan.ld_first.data(), device + P, CUDA_R_16BF, plan.ld_second.data(), betas.data(),
          const_cast<void* const*>(device + 2 * P), c_type, plan.ld_c.data(), int(P), sizes.data(), CUBLAS_COMPUTE_32F);
      if (grouped == CUBLAS_STATUS_SUCCESS) return;
      if (grouped != CUBLAS_STATUS_NOT_SUPPORTED && grouped != CUBLAS_STATUS_INVALID_VALUE)
        MOE_RUN_FAILED("cublasGemmGroupedBatchedEx: " << cublasGetStatusString(grouped));
      grouped_bf16_refused_[c_rounded] = true;
      static bool said[2] = {false, false};
      if (!said[c_rounded])
        std::fprintf(stderr, "moe: this cuBLAS has no grouped bf16 GEMM into %s (%s); one GEMM per expert instead\n",
                     c_rounded ? "bf16" : "fp32", cublasGetStatusString(grouped));
      said[c_rounded] = true;
    }
    for (size_t i = 0; i < P; ++i)
      MOE_CUBLAS_CHECK(cublasGemmEx(ctx_.blas, ta[i], tb[i], plan.m[i], plan.n[i], plan.k[i], &alpha, host_pointers[i],
                                    CUDA_R_16BF, plan.ld_first[i], host_pointers[P + i], CUDA_R_16BF, plan.ld_second[i],
                                    &beta, const_cast<void*>(host_pointers[2 * P + i]), c_type, plan.ld_c[i],
                                    CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  }
}

template void CudaOps<float>::gemm_bf16(const Ops<float>::Gemm&);
template void CudaOps<float>::round_operand(const float*, int64_t, int64_t, int64_t, void*);
template const void* CudaOps<float>::rounded_parameter(const float*);
template const void* CudaOps<float>::gemm_operand(const float*, bool, int64_t, int64_t, int64_t&,
                                                  std::optional<Workspace>&);
template void CudaOps<float>::run_grouped_gemm(const Ops<float>::GroupedGemm&);
template void CudaOps<float>::grouped_call_bf16(const GroupedGemmPlan&, float, const void*, const void*, float, void*,
                                                bool);
template void CudaOps<double>::gemm_bf16(const Ops<double>::Gemm&);
template void CudaOps<double>::round_operand(const double*, int64_t, int64_t, int64_t, void*);
template const void* CudaOps<double>::rounded_parameter(const double*);
template const void* CudaOps<double>::gemm_operand(const double*, bool, int64_t, int64_t, int64_t&,
                                                   std::optional<Workspace>&);
template void CudaOps<double>::run_grouped_gemm(const Ops<double>::GroupedGemm&);
template void CudaOps<double>::grouped_call_bf16(const GroupedGemmPlan&, double, const void*, const void*, double,
                                                 void*, bool);

}  // namespace moe::cuda
