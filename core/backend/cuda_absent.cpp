// A build without the CUDA backend (no nvcc, or MOE_CUDA=OFF): see cuda_backend.h.
#include "core/backend/cuda_backend.h"
#include "core/error.h"

namespace moe {

bool cuda_backend_built() { return false; }
int cuda_device_count() { return 0; }
int64_t cuda_device_memory_bytes(int) { return 0; }
std::unique_ptr<Backend> make_cuda_backend(int) {
  MOE_BAD_INPUT(
      "train.device = \"cuda\", but this build has no CUDA backend: build it where nvcc is found "
      "(cmake -DMOE_CUDA=ON), or set train.device = \"cpu\"");
}

void* cuda_stream_of(Backend& backend) {
  MOE_BAD_INPUT("the " << backend.name() << " backend has no CUDA stream: this build has no CUDA backend");
}

}  // namespace moe
