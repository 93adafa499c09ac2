// Which OpenBLAS kernels the program asks for (core/backend/cpu/blas_kernels.h): only where OpenBLAS fell back to
// its generic set on a CPU with wider vectors, and then the widest set the CPU runs; the CPU's vectors as
// /proc/cpuinfo lists them. tests/cli/test_blas_kernels.sh checks the program end to end.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>

#include "core/backend/cpu/blas_kernels.h"
#include "core/backend/cpu/small_gemm.h"

namespace moe::cpu {
namespace {

TEST(BlasKernels, OnlyTheFallbackIsReplacedAndByTheWidestSetTheCpuRuns) {
  const CpuVectors none{false, false}, avx2{true, false}, avx512{true, true};
  EXPECT_EQ(better_blas_core("Prescott", avx512), "SkylakeX");
  EXPECT_EQ(better_blas_core("Prescott", avx2), "Haswell");
  EXPECT_EQ(better_blas_core("Prescott", none), "");
  // A CPU OpenBLAS recognised keeps its kernels, whatever else the CPU has.
  for (const char* known : {"Haswell", "Zen", "SkylakeX", "Cooperlake", "Sandybridge", "Nehalem", "ARMV8"}) {
    EXPECT_EQ(better_blas_core(known, avx512), "") << known;
    EXPECT_EQ(better_blas_core(known, avx2), "") << known;
  }
}

// A set the user asked for that leaves the CPU's widest vectors unused is said to.
TEST(BlasKernels, ANarrowerSetThanTheCpuRunsIsNamed) {
  const CpuVectors none{false, false}, avx2{true, false}, avx512{true, true};
  for (const char* wide : {"SkylakeX", "Cooperlake", "SapphireRapids"}) {
    EXPECT_EQ(unused_vectors_note(wide, avx512), "") << wide;
    EXPECT_EQ(unused_vectors_note(wide, avx2), "") << wide;
  }
  for (const char* avx2_set : {"Haswell", "Zen"}) {
    EXPECT_EQ(unused_vectors_note(avx2_set, avx512), "this CPU has AVX-512, which these kernels do not use");
    EXPECT_EQ(unused_vectors_note(avx2_set, avx2), "") << avx2_set;
  }
  EXPECT_EQ(unused_vectors_note("Sandybridge", avx2), "this CPU has AVX2, which these kernels do not use");
  EXPECT_EQ(unused_vectors_note("Prescott", avx512), "this CPU has AVX-512, which these kernels do not use");
  EXPECT_EQ(unused_vectors_note("Prescott", none), "");
}

#if defined(__x86_64__)
// The flags line of /proc/cpuinfo, with a space on each side of every flag.
std::string cpu_flags() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("flags", 0) == 0) {
      std::string flags(1, ' ');
      flags.append(line, line.find(':') + 1).push_back(' ');
      return flags;
    }
  return "";
}

TEST(BlasKernels, CpuVectorsAgreeWithProcCpuinfo) {
  const std::string flags = cpu_flags();
  if (flags.empty()) GTEST_SKIP() << "no /proc/cpuinfo";
  auto has = [&](const char* flag) { return flags.find(std::string(" ") + flag + " ") != std::string::npos; };
  const CpuVectors v = cpu_vectors();
  EXPECT_EQ(v.avx2_fma, has("avx2") && has("fma"));
  EXPECT_EQ(v.avx512,
            v.avx2_fma && has("avx512f") && has("avx512cd") && has("avx512bw") && has("avx512dq") && has("avx512vl"));
}
#endif

TEST(BlasKernels, DescriptionNamesTheKernelsRunning) {
  const std::string text = blas_kernels_description();
  EXPECT_EQ(text.rfind("OpenBLAS " + blas_core() + " kernels", 0), 0u) << text;
  // The startup line's whole description: OpenBLAS's part, then who runs the small expert groups.
  const std::string gemms = cpu_gemm_kernels_description();
  EXPECT_EQ(gemms.rfind(text + "; expert groups of at most ", 0), 0u) << gemms;
  const char* small = small_gemm_isa_in_use();
  EXPECT_NE(gemms.find(small ? std::string(small) + " kernels of our own" : std::string("OpenBLAS")), std::string::npos)
      << gemms;
}

}  // namespace
}  // namespace moe::cpu
