// The device memory allocator of the CUDA backend, in the manner of PyTorch's caching allocator: asking the
// driver for memory (cudaMalloc) synchronises the device and is slow, and a training step frees and asks
// again for the same sizes every step, so a freed block is kept in a cache by its size class and handed out
// again. Memory goes back to the source only when an allocation fails (then the request is retried once) or
// when the allocator is destroyed. Sizes are rounded up to a class: a multiple of 512 bytes below 1 MiB, of
// 2 MiB above, which bounds the waste while letting nearby sizes share blocks.
// Streams: allocations are ordered on one stream (the backend's), so a block freed there may be handed out again
// at once. Work on another stream (a communicator's) is declared as side work: a block freed while any is
// outstanding is parked until all of it has ended (see begin_side_work).
// Host-side bookkeeping only: the source of raw memory is given, so this is tested without a GPU.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <unordered_map>
#include <vector>

namespace moe {

class CachingAllocator {
 public:
  // Raw memory: `allocate` returns nullptr when it has none (it must not throw); `release` takes back what
  // allocate returned, with the size it was asked for.
  struct Source {
    std::function<void*(size_t bytes)> allocate;
    std::function<void(void* p, size_t bytes)> release;
  };
  struct Stats {
    int64_t in_use = 0;       // bytes asked for by the live allocations (what the memory estimate predicts)
    int64_t peak_in_use = 0;  // the most in_use at once
    int64_t reserved = 0;     // bytes held from the source: in use (rounded) and cached
    int64_t cached = 0;       // bytes of free blocks kept for reuse
    int64_t parked = 0;       // bytes of free blocks side work may still use (reserved, not yet reusable)
    int64_t source_allocations = 0, source_releases = 0, cache_hits = 0;
  };

  explicit CachingAllocator(Source source);
  ~CachingAllocator();  // every cached block back to the source; live ones are the owner's leak
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  // A block of at least `bytes` (nullptr for 0). Throws moe::Error (RunFailed) naming the size and what is
  // held when the source has no memory even after the cache is emptied.
  void* allocate(size_t bytes);
  // Returns a block from allocate() to the cache, or parks it while side work is outstanding.
  void free(void* p);
  // Gives every cached block back to the source.
  void release_cached();

  // Work another stream does on this memory, from its issue (a communicator's send, receive or collective) until
  // the allocation stream is ordered after it (the request's wait). A block freed in between is parked until
  // every piece of side work outstanding at its free has ended: handed out earlier, the allocation stream's next
  // kernels would overwrite what the other stream still reads or writes (PyTorch's recordStream, coarsened to
  // all side work, so no pointer is tracked). And while any is outstanding, a failed allocation does not empty
  // the cache: giving memory back (cudaFree) waits for the whole device, side work included, which may itself
  // wait for a peer that waits for this rank. The ticket ends with end_side_work, once.
  uint64_t begin_side_work();
  void end_side_work(uint64_t ticket);
  Stats stats() const;

  // The size class of a request.
  static size_t round_size(size_t bytes);

 private:
  struct Live {
    size_t requested, rounded;
  };
  void release_cached_locked();
  void unpark_locked();  // parked blocks whose side work has all ended, into the cache
  struct Parked {
    void* p;
    size_t rounded;
    uint64_t last_ticket;  // the newest side work when it was freed
  };

  Source source_;
  mutable std::mutex mutex_;
  std::unordered_map<void*, Live> live_;
  std::map<size_t, std::vector<void*>> cache_;  // size class -> free blocks
  std::deque<Parked> parked_;                   // in the order freed (so by last_ticket)
  std::set<uint64_t> side_work_;                // outstanding tickets
  uint64_t next_ticket_ = 1;
  Stats stats_;
};

}  // namespace moe
