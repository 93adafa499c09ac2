// Decisions every rank must share: a check run on rank 0 whose outcome (pass, or the same error) every
// rank receives, and rank 0's strings broadcast, so no rank goes on alone into a collective.
#pragma once

#include <functional>
#include <string>

#include "parallel/communicator.h"
#include "parallel/strings.h"

namespace moe {

// Runs check on rank 0 only (for example a look at the file system that rank 0 then changes) and makes
// every rank throw the same error (kind and message) if it threw.
void on_rank0_agree(Communicator& world, const std::function<void()>& check);

// Every rank's OpenBLAS kernel set (cpu::blas_core()), gathered: empty where all run the same set, else a warning
// naming each set and the first rank (and host) on it. Sets round their GEMMs differently, so such a run does not
// repeat one on other hosts or in another layout bit for bit (hosts whose environments set OPENBLAS_CORETYPE
// differently, or CPUs OpenBLAS tells apart). Collective.
std::string blas_kernels_disagreement(Communicator& world);

}  // namespace moe
