// The CUDA backend (core/backend/cuda/): whether this build has it, how many devices this process sees, and
// the backend on one of them. A build without nvcc has the same three functions (core/backend/cuda_absent.cpp):
// none built, no device, and make_cuda_backend refusing with a message that says so.
#pragma once

#include <cstdint>
#include <memory>

#include "core/backend/backend.h"

namespace moe {

bool cuda_backend_built();
// Devices this process can use: 0 without the backend, a driver or a device.
int cuda_device_count();
// Bytes of memory of `device` (0-based): 0 without the backend or the device.
int64_t cuda_device_memory_bytes(int device);
// The backend on `device` (0-based). Throws moe::Error (BadInput) when this build has no CUDA backend or the
// device does not exist.
std::unique_ptr<Backend> make_cuda_backend(int device);
// The cudaStream_t a CUDA backend orders its work on (for communicators that must order theirs with it).
// Throws moe::Error (BadInput) for any other backend.
void* cuda_stream_of(Backend& backend);

}  // namespace moe
