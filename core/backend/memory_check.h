// A backend for checking, on the CPU, that code treats backend memory as a GPU's. Its memory is a device's:
// the pointers it hands out lie in a shadow space the host cannot touch (core/backend/shadow_memory.h), so any
// host read or write of backend memory faults at once, naming the buffer and where it was allocated; only its
// ops (core/backend/strict_ops.h), its copies and the data-plane communicators (parallel/plane_check.h) reach
// the storage behind them. memory_is_host() is false, so every path that stages through host copies for the
// CUDA backend runs; the copies refuse a pointer on the wrong side, and every op refuses a pointer outside one
// live buffer or an extent past its end. With the plane-checking communicators a CPU run proves that backend
// memory travels only over the data plane (NCCL on a GPU) and host memory only over the control plane (MPI).
// Its ops and copies queue on a stream that runs when the host synchronises (core/backend/deferred_stream.h):
// a host read of a copy's destination before synchronising sees the old bytes. Host sources are read at the
// call (as CUDA stages pageable memory); a freed buffer's storage is released in stream order, after the work
// queued before the free (as the CUDA backend's caching allocator reuses it).
// The computed values are the CPU backend's, bit for bit. `moe train` makes it when MOE_CHECK_DEVICE_MEMORY=1
// (docs/gpu.md).
#pragma once

#include <map>
#include <memory>
#include <mutex>

#include "core/backend/backend.h"
#include "core/backend/deferred_stream.h"
#include "core/backend/shadow_memory.h"
#include "core/backend/strict_ops.h"

namespace moe {

class MemoryCheckBackend final : public Backend {
 public:
  explicit MemoryCheckBackend(std::unique_ptr<Backend> inner);
  ~MemoryCheckBackend() override;  // runs what is still queued
  const char* name() const override { return "cpu (device memory checked)"; }
  bool memory_is_host() const override { return false; }
  int threads() const override { return inner_->threads(); }
  void set_threads(int threads) override { inner_->set_threads(threads); }
  int64_t allocated_bytes() const override { return inner_->allocated_bytes(); }
  int64_t peak_bytes() const override { return inner_->peak_bytes(); }
  // Each refuses (moe::Error) a backend side outside this backend's live buffers or a host side inside them.
  using Backend::copy_to_device;  // the typed forms, in elements
  void copy_to_device(void* device_dst, const void* host_src, size_t bytes) override;
  void copy(void* device_dst, const void* device_src, size_t bytes) override;
  Stream& stream() override { return stream_; }

  // Whether [p, p + bytes) lies inside one live buffer of this backend (bytes 0: whether p does, or is its end).
  bool owns(const void* p, size_t bytes) const { return shadow_.owns(p, bytes); }
  // Whether any byte of [p, p + bytes) lies inside one.
  bool touches(const void* p, size_t bytes) const { return shadow_.touches(p, bytes); }
  // The storage behind [p, p + bytes) of one live buffer, for what moves backend memory as a device's own
  // engines would (the data-plane communicators), after the work queued before it has run; `what` names the
  // operation in the refusal.
  void* storage(const void* p, size_t bytes, const char* what);

 protected:
  void* allocate_bytes(size_t bytes) override;
  void copy_bytes_to_host(void* host_dst, const void* device_src, size_t bytes) override;
  void free_bytes(void* p, size_t bytes) noexcept override;
  Ops<float>& ops_f32() override { return ops_f32_; }
  Ops<double>& ops_f64() override { return ops_f64_; }

 private:
  std::unique_ptr<Backend> inner_;
  ShadowMemory shadow_;
  DeferredStream stream_;
  StrictOps<float> ops_f32_;
  StrictOps<double> ops_f64_;
  std::mutex mutex_;
  std::map<const void*, Buffer> storage_;  // the inner backend's buffers, by their first byte
};

// The CPU backend (threads: 0 picks this node's cores) under the check.
std::unique_ptr<MemoryCheckBackend> make_memory_check_backend(int threads);

}  // namespace moe
