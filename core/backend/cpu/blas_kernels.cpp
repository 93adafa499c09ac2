// OpenBLAS's kernel set for this CPU (blas_kernels.h).
#include "core/backend/cpu/blas_kernels.h"

#include <cblas.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

#include "core/backend/cpu/small_gemm.h"

namespace moe::cpu {

namespace {
constexpr const char* kCoreVariable = "OPENBLAS_CORETYPE";
constexpr const char* kFallbackVariable = "MOE_BLAS_FALLBACK";

// "OpenBLAS 0.3.21" from openblas_get_config()'s "OpenBLAS 0.3.21 NO_LAPACKE DYNAMIC_ARCH ...".
std::string openblas_version() {
  const std::string config = openblas_get_config();
  const size_t end = config.find(' ', config.find(' ') + 1);
  return config.substr(0, end);
}
}  // namespace

std::string better_blas_core(const std::string& chosen, const CpuVectors& cpu) {
  // Only OpenBLAS's fallback for a CPU it does not know: a CPU it recognised keeps the kernels chosen for it,
  // even where a wider set would run (OpenBLAS may have reasons, and the user can still set the variable).
  if (chosen != "Prescott") return "";
  if (cpu.avx512) return "SkylakeX";
  if (cpu.avx2_fma) return "Haswell";
  return "";
}

std::string unused_vectors_note(const std::string& core, const CpuVectors& cpu) {
  // OpenBLAS's x86-64 sets by the widest vectors their kernels use (0.3.21's DYNAMIC_ARCH list).
  const bool avx512 = core == "SkylakeX" || core == "Cooperlake" || core == "SapphireRapids";
  const bool avx2 = avx512 || core == "Haswell" || core == "Zen" || core == "Excavator";
  if (cpu.avx512 && !avx512) return "this CPU has AVX-512, which these kernels do not use";
  if (cpu.avx2_fma && !avx2) return "this CPU has AVX2, which these kernels do not use";
  return "";
}

std::string blas_core() { return openblas_get_corename(); }

void choose_blas_kernels(char** argv) {
  if (std::getenv(kCoreVariable)) return;
  const std::string chosen = blas_core();
  const std::string better = better_blas_core(chosen, cpu_vectors());
  if (better.empty()) return;
  setenv(kCoreVariable, better.c_str(), 1);
  setenv(kFallbackVariable, chosen.c_str(), 1);
  execv("/proc/self/exe", argv);
  // Not executed again (no /proc, say): run on the kernels loaded, and let the startup line say which.
  unsetenv(kCoreVariable);
  unsetenv(kFallbackVariable);
}

std::string blas_kernels_description() {
  std::string text = "OpenBLAS " + blas_core() + " kernels";
  const char* fallback = std::getenv(kFallbackVariable);
  const char* core = std::getenv(kCoreVariable);
  if (fallback && core)
    text += std::string(" (") + kCoreVariable + "=" + core + ": " + openblas_version() +
            " does not know this CPU and chose " + fallback + ")";
  else if (core) {
    const std::string note = unused_vectors_note(blas_core(), cpu_vectors());
    text += std::string(" (") + kCoreVariable + "=" + core + (note.empty() ? "" : "; " + note) + ")";
  }
  return text;
}

std::string cpu_gemm_kernels_description() {
  const char* small = small_gemm_isa_in_use();
  return blas_kernels_description() + "; expert groups of at most " + std::to_string(kSmallGemmRows) +
         " rows: " + (small ? std::string(small) + " kernels of our own" : std::string("OpenBLAS"));
}

}  // namespace moe::cpu
