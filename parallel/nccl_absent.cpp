// A build without NCCL (no CUDA toolkit): see nccl_communicator.h.
#include "core/error.h"
#include "parallel/nccl_communicator.h"

namespace moe {

bool nccl_built() { return false; }
std::unique_ptr<Communicator> make_nccl_communicator(Communicator&, Backend&) {
  MOE_BAD_INPUT("NCCL communicators need the CUDA backend, and this build has none (no nvcc found)");
}

}  // namespace moe
