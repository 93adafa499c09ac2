// The CPU backend's GEMM kernels for an expert group of few rows (a grouped GEMM's group of at most
// kSmallGemmRows rows of tokens), where OpenBLAS spends much of its time packing the weights and waiting for
// them: with 64 experts top-1 each expert sees about 32 of 2048 tokens and its weights come from memory, not
// cache. The kernels (small_gemm.cpp, x86-64) read the large operand (the weights, or the weight gradient for
// A^T B) once, in the order it lies in memory, and ask for the next block of it while computing on the current
// one; the small operands (the group's rows) are packed once per call. They come in two instruction sets, AVX2
// with FMA and AVX-512, the widest the CPU has chosen at run time. docs/bench.md "Small-group expert GEMMs" has
// the measurements that chose them.
//
// Determinism: each output element is one chain of fused multiply-adds over the reduction in index order,
// then alpha * sum + beta * C, computed by one thread: the same bits for the same shape and data at any thread
// count, and in either instruction set (a lane of a fused multiply-add rounds alike at any vector width), but not
// the bits of OpenBLAS, which serves CPUs without AVX2.
#pragma once

#include <cstdint>

namespace moe::cpu {

// Groups of at most this many rows use these kernels; above it OpenBLAS's packing pays for itself (measured:
// docs/bench.md "Small-group expert GEMMs").
constexpr int64_t kSmallGemmRows = 64;

// The kernels' instruction sets: AVX2 with FMA (tiles of 6 rows by 16 columns), AVX-512 (12 rows by 32; run
// where the CPU has F, CD, BW, DQ and VL, cpu_vectors.h, though the tiles use F alone).
enum class SmallGemmIsa { Avx2, Avx512 };
const char* small_gemm_isa_name(SmallGemmIsa isa);

// True where the kernels of `isa` run: x86-64 whose CPU (and operating system) has those instructions.
bool small_gemm_available(SmallGemmIsa isa);
// True where any of them runs (AVX2 and FMA at least).
bool small_gemm_available();
// The instruction set small_gemm() runs (the widest here; MOE_SMALL_GEMM=avx2 asks for AVX2, a knob for
// measurements), or null where the kernels do not run here.
const char* small_gemm_isa_in_use();

// C = alpha op(A) op(B) + beta C, row-major, BLAS's arguments; beta = 0 does not read C. The three forms of a
// grouped GEMM: (ta, tb) = (false, false), (false, true) with M the group's rows, and (true, false) with K the
// group's rows (the weight gradient C (M x N) = A^T B). Runs on the widest instruction set available. Returns
// false, having done nothing, where the kernels do not run here (small_gemm_available() false), for (true,
// true), and for K = 0 (C = beta C, left to BLAS).
bool small_gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
                const float* B, int64_t ldb, float beta, float* C, int64_t ldc);

// As small_gemm(), on the kernels of `isa` (false where they do not run here): for the tests and the benchmark.
bool small_gemm_on(SmallGemmIsa isa, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
                   int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc);

}  // namespace moe::cpu
