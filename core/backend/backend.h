// The backend object (docs/design.md "The backend seam"; ggml's backend buffer type): made once
// in `main` (or by a test or benchmark through make_cpu_backend) and passed down to everything that
// allocates or computes. It owns memory (Buffer: RAII, with its dtype and whether the host can address
// it), the copies between host and backend memory, the stream its work is ordered on, the thread count,
// and the ops (core/backend/ops.h). Code above it allocates through it and copies what it needs to the
// host explicitly; the CPU backend is one implementation, not an assumption.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "core/backend/ops.h"
#include "core/backend/timeline.h"
#include "core/dtype.h"
#include "core/error.h"

namespace moe {

class Backend;

// Memory of one backend: `numel` elements of `dtype`. Move-only; freed by its backend on destruction.
class Buffer {
 public:
  Buffer() = default;
  Buffer(Buffer&& other) noexcept { *this = std::move(other); }
  Buffer& operator=(Buffer&& other) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer() { release(); }

  size_t bytes() const { return bytes_; }
  DType dtype() const { return dtype_; }
  bool is_host() const { return is_host_; }
  int64_t numel() const { return dtype_size(dtype_) == 0 ? 0 : int64_t(bytes_ / dtype_size(dtype_)); }
  bool empty() const { return bytes_ == 0; }
  // The backend's pointer (a host pointer only when is_host()).
  void* raw() { return ptr_; }
  const void* raw() const { return ptr_; }
  template <typename T>
  T* data() {
    MOE_CHECK(empty() || dtype_of<T>() == dtype_,
              "a " << dtype_name(dtype_) << " buffer read as " << dtype_name(dtype_of<T>()));
    return static_cast<T*>(ptr_);
  }
  template <typename T>
  const T* data() const {
    return const_cast<Buffer*>(this)->data<T>();
  }

 private:
  friend class Backend;
  void release() noexcept;
  Backend* owner_ = nullptr;
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
  DType dtype_ = DType::F32;
  bool is_host_ = true;
};

// An in-order queue of backend work. On the CPU every op has finished when it returns.
class Stream {
 public:
  virtual ~Stream() = default;
  // Returns when all work queued on this stream has finished.
  virtual void synchronize() = 0;
  // Writes to *seconds the time (std::chrono::steady_clock, in seconds since its epoch) at which the stream
  // reaches this point of its order: at once on the CPU, and before the next synchronize() returns where work
  // is queued (CUDA: an event, read back then). *seconds must live until then.
  virtual void record_time(double* seconds) = 0;
};

// The steady clock's time in seconds since its epoch (Stream::record_time's unit).
double steady_seconds();

class Backend {
 public:
  virtual ~Backend() = default;
  virtual const char* name() const = 0;
  // Whether the host can address this backend's memory directly.
  virtual bool memory_is_host() const = 0;
  // Threads of this process for the backend's host-side work; 0 picks this node's cores.
  virtual int threads() const = 0;
  virtual void set_threads(int threads) = 0;

  // `numel` elements of `dtype`, zero-filled.
  Buffer allocate(DType dtype, int64_t numel);
  // Bytes held by this backend's live buffers now, and the most held at once since the backend was made:
  // what the memory estimate (launch/config/memory.h) is checked against. Safe to call from any thread.
  virtual int64_t allocated_bytes() const = 0;
  virtual int64_t peak_bytes() const = 0;
  // Grows `buffer` to at least `numel` elements of `dtype` (contents are not kept when it grows).
  void reserve(Buffer& buffer, DType dtype, int64_t numel);

  // Byte copies, ordered on stream(): host -> backend, backend -> host, within the backend. Pointers on
  // the backend side come from its buffers (with an offset).
  virtual void copy_to_device(void* device_dst, const void* host_src, size_t bytes) = 0;
  void copy_to_host(void* host_dst, const void* device_src, size_t bytes) {
    d2h_bytes_ += int64_t(bytes);
    copy_bytes_to_host(host_dst, device_src, bytes);
  }
  virtual void copy(void* device_dst, const void* device_src, size_t bytes) = 0;
  // Returns when every copy and op queued so far has finished.
  virtual Stream& stream() = 0;
  void synchronize() {
    ++syncs_;
    stream().synchronize();
  }

  // Spans of this backend's work (core/backend/timeline.h) go to `timeline` (null: nowhere). Layers open them
  // with span(); a trace listens.
  void set_timeline(Timeline* timeline) { timeline_ = timeline; }
  Timeline* timeline() const { return timeline_; }
  TimelineSpan span(const char* name, const char* category) { return TimelineSpan(timeline_, name, category); }

  // The host's waits for this backend and the bytes it read back, since the backend was made (docs/gpu.md "Host
  // synchronisations"): each synchronize() (a download is one) and each op that returns a value to the host is a
  // wait; d2h_bytes counts copy_to_host's bytes. Counted alike on every backend, so that a CPU run shows where a
  // GPU run would wait. Safe to read from any thread.
  struct HostTraffic {
    int64_t syncs = 0, d2h_bytes = 0;
  };
  HostTraffic host_traffic() {
    return {syncs_.load() + ops_f32().host_reads() + ops_f64().host_reads(), d2h_bytes_.load()};
  }

  // Typed forms of the copies, in elements.
  template <typename T>
  void copy_to_device(T* device_dst, const T* host_src, int64_t n) {
    copy_to_device(static_cast<void*>(device_dst), static_cast<const void*>(host_src), size_t(n) * sizeof(T));
  }
  template <typename T>
  void copy_to_host(T* host_dst, const T* device_src, int64_t n) {
    copy_to_host(static_cast<void*>(host_dst), static_cast<const void*>(device_src), size_t(n) * sizeof(T));
  }
  // A whole host vector into a new buffer, and a buffer (or n elements at a backend pointer) back to the host.
  template <typename T>
  Buffer upload(const std::vector<T>& host) {
    Buffer b = allocate(dtype_of<T>(), int64_t(host.size()));
    if (!host.empty()) copy_to_device(b.data<T>(), host.data(), int64_t(host.size()));
    return b;
  }
  template <typename T>
  std::vector<T> download(const T* device_src, int64_t n) {
    std::vector<T> host(static_cast<size_t>(n));
    if (n > 0) copy_to_host(host.data(), device_src, n);
    synchronize();
    return host;
  }
  template <typename T>
  std::vector<T> download(const Buffer& b) {
    return download(b.data<T>(), b.numel());
  }

  // The ops on this backend's memory, per compute type.
  template <typename T>
  Ops<T>& ops();

 protected:
  virtual void* allocate_bytes(size_t bytes) = 0;  // zero-filled
  virtual void copy_bytes_to_host(void* host_dst, const void* device_src, size_t bytes) = 0;
  // `bytes`: what allocate_bytes was asked for when it returned `p`.
  virtual void free_bytes(void* p, size_t bytes) noexcept = 0;
  virtual Ops<float>& ops_f32() = 0;
  virtual Ops<double>& ops_f64() = 0;

 private:
  friend class Buffer;
  std::atomic<int64_t> syncs_{0}, d2h_bytes_{0};
  Timeline* timeline_ = nullptr;
};

template <>
inline Ops<float>& Backend::ops<float>() {
  return ops_f32();
}
template <>
inline Ops<double>& Backend::ops<double>() {
  return ops_f64();
}

// The CPU backend (OpenBLAS + OpenMP; host memory). threads: 0 picks this node's cores.
std::unique_ptr<Backend> make_cpu_backend(int threads);

}  // namespace moe
