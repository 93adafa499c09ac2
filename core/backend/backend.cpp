// Buffer ownership and the allocation helpers every backend shares. See backend.h.
#include "core/backend/backend.h"

#include <chrono>

namespace moe {

double steady_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

Buffer& Buffer::operator=(Buffer&& other) noexcept {
  if (this != &other) {
    release();
    owner_ = other.owner_, ptr_ = other.ptr_, bytes_ = other.bytes_, dtype_ = other.dtype_, is_host_ = other.is_host_;
    other.owner_ = nullptr, other.ptr_ = nullptr, other.bytes_ = 0;
  }
  return *this;
}

void Buffer::release() noexcept {
  if (owner_ && ptr_) owner_->free_bytes(ptr_, bytes_);
  owner_ = nullptr, ptr_ = nullptr, bytes_ = 0;
}

Buffer Backend::allocate(DType dtype, int64_t numel) {
  MOE_CHECK(numel >= 0, "a buffer of " << numel << " elements");
  Buffer b;
  b.dtype_ = dtype;
  b.is_host_ = memory_is_host();
  if (numel == 0) return b;
  b.bytes_ = size_t(numel) * dtype_size(dtype);
  b.ptr_ = allocate_bytes(b.bytes_);
  b.owner_ = this;
  return b;
}

void Backend::reserve(Buffer& buffer, DType dtype, int64_t numel) {
  if (buffer.dtype() == dtype && buffer.numel() >= numel && (numel == 0 || !buffer.empty())) return;
  buffer = allocate(dtype, numel);
}

}  // namespace moe
