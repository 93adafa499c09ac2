// The vector instructions this CPU has and the operating system enables, asked once: what chooses OpenBLAS's
// kernels where it does not know the CPU (blas_kernels.h) and the small-group expert kernels' instruction set
// (small_gemm.h).
#pragma once

namespace moe::cpu {

struct CpuVectors {
  bool avx2_fma = false;  // AVX2 and FMA
  bool avx512 = false;    // AVX-512 F, CD, BW, DQ and VL: what OpenBLAS's SkylakeX kernels use
};

inline CpuVectors cpu_vectors() {
  static const CpuVectors v = [] {
    CpuVectors c;
#if defined(__x86_64__)
    // libgcc's answers include the operating system's: AVX-512 only where it saves the zmm registers (XCR0).
    c.avx2_fma = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    c.avx512 = c.avx2_fma && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512cd") &&
               __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
               __builtin_cpu_supports("avx512vl");
#endif
    return c;
  }();
  return v;
}

}  // namespace moe::cpu
