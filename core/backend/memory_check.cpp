// The memory-checking backend (see memory_check.h).
#include "core/backend/memory_check.h"

namespace moe {
namespace {
const char* bytes_of(const void* p) { return static_cast<const char*>(p); }
}  // namespace

void* MemoryCheckBackend::allocate_bytes(size_t bytes) {
  Buffer b = inner_->allocate(DType::U8, int64_t(bytes));
  void* p = b.raw();
  const std::lock_guard<std::mutex> lock(mutex_);
  live_.emplace(bytes_of(p), std::move(b));
  return p;
}

void MemoryCheckBackend::free_bytes(void* p, size_t) noexcept {
  Buffer released;  // freed outside the lock
  const std::lock_guard<std::mutex> lock(mutex_);
  const auto it = live_.find(bytes_of(p));
  if (it == live_.end()) return;
  released = std::move(it->second);
  live_.erase(it);
}

bool MemoryCheckBackend::owns(const void* p, size_t bytes) const {
  const std::lock_guard<std::mutex> lock(mutex_);
  auto it = live_.upper_bound(bytes_of(p));
  if (it == live_.begin()) return false;
  --it;
  const char* end = it->first + it->second.bytes();
  return bytes_of(p) <= end && bytes_of(p) + bytes <= end;
}

bool MemoryCheckBackend::touches(const void* p, size_t bytes) const {
  if (bytes == 0) return false;
  const std::lock_guard<std::mutex> lock(mutex_);
  auto it = live_.upper_bound(bytes_of(p) + bytes - 1);  // the last buffer starting at or before the last byte
  if (it == live_.begin()) return false;
  --it;
  return it->first + it->second.bytes() > bytes_of(p);
}

void MemoryCheckBackend::copy_to_device(void* device_dst, const void* host_src, size_t bytes) {
  MOE_CHECK(bytes == 0 || (owns(device_dst, bytes) && !touches(host_src, bytes)),
            "copy_to_device of " << bytes << " bytes from " << host_src << " to " << device_dst
                                 << ": the destination must be backend memory and the source host memory");
  inner_->copy_to_device(device_dst, host_src, bytes);
}

void MemoryCheckBackend::copy_to_host(void* host_dst, const void* device_src, size_t bytes) {
  MOE_CHECK(bytes == 0 || (owns(device_src, bytes) && !touches(host_dst, bytes)),
            "copy_to_host of " << bytes << " bytes from " << device_src << " to " << host_dst
                               << ": the source must be backend memory and the destination host memory");
  inner_->copy_to_host(host_dst, device_src, bytes);
}

void MemoryCheckBackend::copy(void* device_dst, const void* device_src, size_t bytes) {
  MOE_CHECK(
      bytes == 0 || (owns(device_dst, bytes) && owns(device_src, bytes)),
      "copy of " << bytes << " bytes from " << device_src << " to " << device_dst << ": both must be backend memory");
  inner_->copy(device_dst, device_src, bytes);
}

std::unique_ptr<MemoryCheckBackend> make_memory_check_backend(int threads) {
  return std::make_unique<MemoryCheckBackend>(make_cpu_backend(threads));
}

}  // namespace moe
