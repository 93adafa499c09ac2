// The memory-checking backend (see memory_check.h).
#include "core/backend/memory_check.h"

#include <cstring>

namespace moe {

MemoryCheckBackend::MemoryCheckBackend(std::unique_ptr<Backend> inner)
    : inner_(std::move(inner)),
      ops_f32_(inner_->ops<float>(), shadow_, stream_),
      ops_f64_(inner_->ops<double>(), shadow_, stream_) {}

MemoryCheckBackend::~MemoryCheckBackend() {
  try {
    stream_.synchronize();
  } catch (...) {  // a failed op's error was the caller's to see at its synchronisation
  }
}

void* MemoryCheckBackend::allocate_bytes(size_t bytes) {
  Buffer b = inner_->allocate(DType::U8, int64_t(bytes));
  void* shadow = shadow_.map(b.raw(), bytes);
  const std::lock_guard<std::mutex> lock(mutex_);
  storage_.emplace(b.raw(), std::move(b));
  return shadow;
}

// The shadow range ends now (host and ops alike fault or are refused from here on); the storage goes back after
// the work queued before the free has run.
void MemoryCheckBackend::free_bytes(void* p, size_t) noexcept {
  void* real = shadow_.unmap(p);
  if (!real) return;
  auto release = [this, real] {
    Buffer released;  // freed outside the lock
    const std::lock_guard<std::mutex> lock(mutex_);
    const auto it = storage_.find(real);
    if (it == storage_.end()) return;
    released = std::move(it->second);
    storage_.erase(it);
  };
  try {
    stream_.enqueue(release);
  } catch (...) {
    release();
  }
}

void* MemoryCheckBackend::storage(const void* p, size_t bytes, const char* what) {
  stream_.synchronize();
  return shadow_.real(p, bytes, what);
}

void MemoryCheckBackend::copy_to_device(void* device_dst, const void* host_src, size_t bytes) {
  if (bytes == 0) return;
  MOE_CHECK(owns(device_dst, bytes) && !touches(host_src, bytes),
            "copy_to_device of " << bytes << " bytes from " << host_src << " to " << device_dst
                                 << ": the destination must be backend memory and the source host memory");
  void* dst = shadow_.real(device_dst, bytes, "copy_to_device");
  const auto* src = static_cast<const unsigned char*>(host_src);
  stream_.enqueue(
      [dst, staged = std::vector<unsigned char>(src, src + bytes)] { std::memcpy(dst, staged.data(), staged.size()); });
}

void MemoryCheckBackend::copy_bytes_to_host(void* host_dst, const void* device_src, size_t bytes) {
  if (bytes == 0) return;
  MOE_CHECK(owns(device_src, bytes) && !touches(host_dst, bytes),
            "copy_to_host of " << bytes << " bytes from " << device_src << " to " << host_dst
                               << ": the source must be backend memory and the destination host memory");
  const void* src = shadow_.real(device_src, bytes, "copy_to_host");
  stream_.enqueue([host_dst, src, bytes] { std::memcpy(host_dst, src, bytes); });
}

void MemoryCheckBackend::copy(void* device_dst, const void* device_src, size_t bytes) {
  if (bytes == 0) return;
  MOE_CHECK(owns(device_dst, bytes) && owns(device_src, bytes), "copy of " << bytes << " bytes from " << device_src
                                                                           << " to " << device_dst
                                                                           << ": both must be backend memory");
  void* dst = shadow_.real(device_dst, bytes, "copy");
  const void* src = shadow_.real(device_src, bytes, "copy");
  stream_.enqueue([dst, src, bytes] { std::memmove(dst, src, bytes); });
}

std::unique_ptr<MemoryCheckBackend> make_memory_check_backend(int threads) {
  return std::make_unique<MemoryCheckBackend>(make_cpu_backend(threads));
}

}  // namespace moe
