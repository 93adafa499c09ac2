// Communicators that check which memory travels over them (core/backend/memory_check.h): a data-plane one
// refuses any buffer outside backend memory (on a GPU it is NCCL, which moves device memory only), a
// control-plane one any buffer inside it (MPI, which moves host memory). Each wraps the communicator that
// carries the traffic and passes every call on after the check. A refusal is a program error naming the
// operation, the group and the plane.
#pragma once

#include <functional>
#include <memory>

#include "parallel/communicator.h"

namespace moe {

enum class Plane { Data, Control };

// in_backend(p, bytes): whether [p, p + bytes) is backend memory; touches_backend(p, bytes): whether any
// byte of it is. `inner` is the communicator that moves the bytes; owned when given as a unique_ptr.
std::unique_ptr<Communicator> make_plane_check(Plane plane, Communicator& inner,
                                               std::function<bool(const void*, size_t)> in_backend,
                                               std::function<bool(const void*, size_t)> touches_backend);
std::unique_ptr<Communicator> make_plane_check(Plane plane, std::unique_ptr<Communicator> inner,
                                               std::function<bool(const void*, size_t)> in_backend,
                                               std::function<bool(const void*, size_t)> touches_backend);

}  // namespace moe
