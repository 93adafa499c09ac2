// Addresses for backend memory that host code cannot touch: what the memory-checking backend
// (core/backend/memory_check.h) hands out instead of the real storage's, so that a CPU run faults where a GPU
// run would. The space is one reservation of address space with no access; each buffer takes a fresh range of
// it (never reused, so a freed buffer's addresses fault too), standing for the real storage elsewhere. Only
// the backend's own ops, copies and data-plane communicators translate an address to the storage (real()).
// A host read or write of a shadow address faults at once; the fault handler names the buffer (its number,
// size and where it was allocated), the offset and whether the access read or wrote, then lets the signal
// take its course.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>

namespace moe {

class ShadowMemory {
 public:
  ShadowMemory();
  ~ShadowMemory();
  ShadowMemory(const ShadowMemory&) = delete;
  ShadowMemory& operator=(const ShadowMemory&) = delete;

  // A fresh range of `bytes` standing for `storage` (bytes > 0), with the caller's stack as its allocation site.
  void* map(void* storage, size_t bytes);
  // Ends the range that starts at `shadow` and returns its storage (null if no such range lives).
  void* unmap(const void* shadow) noexcept;
  // The storage behind [p, p + bytes): p must lie in one live range with `bytes` to spare (bytes 0: p may be
  // its end). Null gives null. Anything else is a program error naming `what` (the op or copy) and p.
  void* real(const void* p, size_t bytes, const char* what) const;
  // Whether [p, p + bytes) lies inside one live range (bytes 0: whether p does, or is its end), and whether
  // any byte of it does.
  bool owns(const void* p, size_t bytes) const;
  bool touches(const void* p, size_t bytes) const;

  // For the fault handler: whether p lies in this space, and the report of an access at p (async-signal-safe as
  // far as it can be: no allocation while the lock is held elsewhere; it tries the lock and says so if taken).
  bool in_space(const void* p) const;
  void report_fault(const void* p, bool write) const;

 private:
  static constexpr int kFrames = 12;
  struct Range {
    char* storage;
    size_t bytes;
    int64_t id;
    int frames;
    void* site[kFrames];
  };
  const Range* find(const char* p, size_t bytes) const;  // with mutex_ held

  char* base_ = nullptr;
  size_t span_ = 0;
  size_t next_ = 0;  // the next range's offset from base_
  int64_t count_ = 0;
  mutable std::mutex mutex_;
  std::map<const char*, Range> live_;  // by first shadow byte
};

}  // namespace moe
