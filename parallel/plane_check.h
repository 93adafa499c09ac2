// Communicators that check which memory travels over them (core/backend/memory_check.h): a data-plane one
// refuses any buffer outside backend memory (on a GPU it is NCCL, which moves device memory only), a
// control-plane one any buffer inside it (MPI, which moves host memory). Each wraps the communicator that
// carries the traffic and passes every call on after the check. A refusal is a program error naming the
// operation, the group and the plane.
#pragma once

#include <functional>
#include <memory>

#include "core/backend/memory_check.h"
#include "parallel/communicator.h"

namespace moe {

enum class Plane { Data, Control };

// What a plane check knows of backend memory. in_backend(p, bytes): whether [p, p + bytes) is backend memory;
// touches_backend(p, bytes): whether any byte of it is; storage(p, bytes, what): the storage behind backend
// memory, which the data plane passes on to the communicator that moves the bytes (null: the pointer itself,
// where backend memory is the host's).
struct BackendMemoryView {
  std::function<bool(const void*, size_t)> in_backend, touches_backend;
  std::function<void*(const void*, size_t, const char*)> storage;
};

// The memory-checking backend's (core/backend/memory_check.h): its shadow addresses, and their storage.
BackendMemoryView memory_view(MemoryCheckBackend& backend);

// `inner` is the communicator that moves the bytes; owned when given as a unique_ptr.
std::unique_ptr<Communicator> make_plane_check(Plane plane, Communicator& inner, BackendMemoryView memory);
std::unique_ptr<Communicator> make_plane_check(Plane plane, std::unique_ptr<Communicator> inner,
                                               BackendMemoryView memory);

}  // namespace moe
