// A build without the CUDA backend (no nvcc, or MOE_CUDA=OFF): see cuda_backend.h.
#include "core/backend/cuda_backend.h"
#include "core/error.h"

namespace moe {

bool cuda_backend_built() { return false; }
int cuda_device_count() { return 0; }
int64_t cuda_device_memory_bytes(int) { return 0; }
std::unique_ptr<Backend> make_cuda_backend(int, const CudaOptions&) {
  MOE_BAD_INPUT(
      "train.device = \"cuda\", but this build has no CUDA backend: build it where nvcc is found "
      "(cmake -DMOE_CUDA=ON), or set train.device = \"cpu\"");
}

void* cuda_stream_of(Backend& backend) {
  MOE_BAD_INPUT("the " << backend.name() << " backend has no CUDA stream: this build has no CUDA backend");
}

uint64_t cuda_begin_side_work(Backend& backend) {
  MOE_BAD_INPUT("the " << backend.name() << " backend has no CUDA memory: this build has no CUDA backend");
}

void cuda_end_side_work(Backend& backend, uint64_t) {
  MOE_BAD_INPUT("the " << backend.name() << " backend has no CUDA memory: this build has no CUDA backend");
}

uint64_t cuda_watch(Backend& backend, std::function<void()>) {
  MOE_BAD_INPUT("the " << backend.name() << " backend has no CUDA stream: this build has no CUDA backend");
}

void cuda_unwatch(Backend& backend, uint64_t) {
  MOE_BAD_INPUT("the " << backend.name() << " backend has no CUDA stream: this build has no CUDA backend");
}

}  // namespace moe
