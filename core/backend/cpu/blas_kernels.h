// Which of OpenBLAS's kernel sets the program runs (docs/design.md "BLAS kernels").
//
// Debian's OpenBLAS is built with DYNAMIC_ARCH: when the library loads, it reads the CPU's family and model and
// picks the kernels written for it. A CPU newer than the library (Debian 12's 0.3.21 does not know Intel's
// Sapphire or Emerald Rapids by model) gets its generic x86-64 set, "Prescott", whose SSE3 kernels run the
// GEMMs at a fifth of what the CPU's AVX-512 ones do (docs/bench.md "OpenBLAS on a CPU it does not know"). The
// library's documented remedy is the OPENBLAS_CORETYPE variable, read when it loads; so where OpenBLAS fell back
// and the CPU has AVX2 or AVX-512, the program sets it and executes itself again, before anything else happens
// (before MPI starts, so the process, its PID and its arguments stay the same). A variable the user set is
// never changed.
#pragma once

#include <string>

#include "core/backend/cpu/cpu_vectors.h"

namespace moe::cpu {

// The kernel set to ask OpenBLAS for (OPENBLAS_CORETYPE's value) where it chose `chosen` on a CPU with `cpu`:
// "SkylakeX" or "Haswell" where it fell back to its generic "Prescott" set on a CPU with AVX-512 or AVX2;
// empty where its choice stands (it recognised the CPU, or the CPU has nothing better).
std::string better_blas_core(const std::string& chosen, const CpuVectors& cpu);

// Where a kernel set the user asked for (OPENBLAS_CORETYPE) is narrower than the CPU's vectors, what it leaves
// unused: "this CPU has AVX-512, which these kernels do not use" for a set below SkylakeX on a CPU with AVX-512
// ("... AVX2 ..." below Haswell on one with AVX2); empty otherwise. A machine's environment may set the variable for
// every program (docs/design.md "BLAS kernels"); GEMMs on a narrower set ran at about half the speed there.
std::string unused_vectors_note(const std::string& core, const CpuVectors& cpu);

// The kernel set OpenBLAS runs in this process (openblas_get_corename).
std::string blas_core();

// Called first in main(): where better_blas_core() names a kernel set and OPENBLAS_CORETYPE is not set,
// sets it, records the set OpenBLAS had chosen in MOE_BLAS_FALLBACK, and executes this program again with the
// same arguments. Returns where nothing is to be done, or where the execution fails (the program then runs on
// the kernels it has).
void choose_blas_kernels(char** argv);

// The kernel set, and where choose_blas_kernels() chose it, why: "OpenBLAS SkylakeX kernels
// (OPENBLAS_CORETYPE=SkylakeX: OpenBLAS 0.3.21 does not know this CPU and chose Prescott)", "OpenBLAS Zen kernels";
// where the user set the variable, its value and unused_vectors_note(): "OpenBLAS Haswell kernels
// (OPENBLAS_CORETYPE=Haswell; this CPU has AVX-512, which these kernels do not use)".
std::string blas_kernels_description();

// What runs the CPU backend's float GEMMs, for the startup line and the benchmarks: blas_kernels_description(),
// then the small-group expert kernels' instruction set (small_gemm.h): "...; expert groups of at most 64 rows:
// avx512 kernels of our own".
std::string cpu_gemm_kernels_description();

}  // namespace moe::cpu
