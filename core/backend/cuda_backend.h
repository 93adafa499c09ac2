// The CUDA backend (core/backend/cuda/): whether this build has it, how many devices this process sees, and
// the backend on one of them. A build without nvcc has the same three functions (core/backend/cuda_absent.cpp):
// none built, no device, and make_cuda_backend refusing with a message that says so.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>

#include "core/backend/backend.h"
#include "core/backend/fused_attention.h"

namespace moe {

bool cuda_backend_built();
// Devices this process can use: 0 without the backend, a driver or a device.
int cuda_device_count();
// Bytes of memory of `device` (0-based): 0 without the backend or the device.
int64_t cuda_device_memory_bytes(int device);
// What the config chooses for the CUDA backend.
struct CudaOptions {
  FusedAttention fused_attention = FusedAttention::Deterministic;  // train.fused_attention
};
// The backend on `device` (0-based). Throws moe::Error (BadInput) when this build has no CUDA backend or the
// device does not exist.
std::unique_ptr<Backend> make_cuda_backend(int device, const CudaOptions& options = {});
// The cudaStream_t a CUDA backend orders its work on (for communicators that must order theirs with it).
// Throws moe::Error (BadInput) for any other backend.
void* cuda_stream_of(Backend& backend);
// Work a communicator does on a CUDA backend's memory from its own stream, from its issue until the backend's
// stream is ordered after it: blocks freed in between are not handed out again before it ends
// (core/backend/cuda/caching_allocator.h, begin_side_work). Throw moe::Error (BadInput) for any other backend.
uint64_t cuda_begin_side_work(Backend& backend);
void cuda_end_side_work(Backend& backend, uint64_t ticket);
// A check the backend's host waits for its stream run while they poll it (a communicator's look at NCCL's
// asynchronous errors): it throws to end the wait instead of leaving it blocked. cuda_unwatch removes it by the
// id cuda_watch returned. Throw moe::Error (BadInput) for any other backend.
uint64_t cuda_watch(Backend& backend, std::function<void()> check);
void cuda_unwatch(Backend& backend, uint64_t id);

}  // namespace moe
