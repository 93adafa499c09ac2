// A backend for checking, on the CPU, that code treats backend memory as a GPU's: the CPU backend whose
// memory says it is not the host's (memory_is_host() false, so every path that stages through host copies
// for the CUDA backend runs), which knows its live allocations, and whose copies refuse a pointer on the
// wrong side. With the plane-checking communicators (parallel/plane_check.h) a CPU run proves that backend
// memory travels only over the data plane (NCCL on a GPU) and host memory only over the control plane (MPI):
// what multi-GPU training needs, tested where there is no GPU. The computed values are the CPU backend's,
// bit for bit. `moe train` makes it when MOE_CHECK_DEVICE_MEMORY=1 (docs/gpu.md).
#pragma once

#include <map>
#include <memory>
#include <mutex>

#include "core/backend/backend.h"

namespace moe {

class MemoryCheckBackend final : public Backend {
 public:
  explicit MemoryCheckBackend(std::unique_ptr<Backend> inner) : inner_(std::move(inner)) {}
  const char* name() const override { return "cpu (device memory checked)"; }
  bool memory_is_host() const override { return false; }
  int threads() const override { return inner_->threads(); }
  void set_threads(int threads) override { inner_->set_threads(threads); }
  int64_t allocated_bytes() const override { return inner_->allocated_bytes(); }
  int64_t peak_bytes() const override { return inner_->peak_bytes(); }
  // Each refuses (moe::Error) a backend side outside this backend's live buffers or a host side inside them.
  using Backend::copy_to_device;  // the typed forms, in elements
  using Backend::copy_to_host;
  void copy_to_device(void* device_dst, const void* host_src, size_t bytes) override;
  void copy_to_host(void* host_dst, const void* device_src, size_t bytes) override;
  void copy(void* device_dst, const void* device_src, size_t bytes) override;
  Stream& stream() override { return inner_->stream(); }

  // Whether [p, p + bytes) lies inside one live buffer of this backend (bytes 0: whether p does, or is its end).
  bool owns(const void* p, size_t bytes) const;
  // Whether any byte of [p, p + bytes) lies inside one.
  bool touches(const void* p, size_t bytes) const;

 protected:
  void* allocate_bytes(size_t bytes) override;
  void free_bytes(void* p, size_t bytes) noexcept override;
  Ops<float>& ops_f32() override { return inner_->ops<float>(); }
  Ops<double>& ops_f64() override { return inner_->ops<double>(); }

 private:
  std::unique_ptr<Backend> inner_;
  mutable std::mutex mutex_;
  std::map<const char*, Buffer> live_;  // by first byte: the inner backend's buffers
};

// The CPU backend (threads: 0 picks this node's cores) under the check.
std::unique_ptr<MemoryCheckBackend> make_memory_check_backend(int threads);

}  // namespace moe
