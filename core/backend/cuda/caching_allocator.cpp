// The caching device allocator's bookkeeping (see caching_allocator.h).
#include "core/backend/cuda/caching_allocator.h"

#include <algorithm>

#include "core/error.h"

namespace moe {
namespace {

const char* out_of_memory_with_side_work() {
  return ", with communication in flight (the cache is not given back then: that waits for the whole device, "
         "and the communication may wait for a peer that waits for this rank)";
}

}  // namespace

CachingAllocator::CachingAllocator(Source source) : source_(std::move(source)) {
  MOE_CHECK(source_.allocate && source_.release, "a caching allocator needs a source of memory");
}

CachingAllocator::~CachingAllocator() {
  std::lock_guard<std::mutex> lock(mutex_);
  side_work_.clear();  // the owner has synchronised every stream before destroying the allocator
  unpark_locked();
  release_cached_locked();
}

size_t CachingAllocator::round_size(size_t bytes) {
  constexpr size_t kSmall = 512, kLarge = size_t(2) << 20, kSmallLimit = size_t(1) << 20;
  const size_t unit = bytes < kSmallLimit ? kSmall : kLarge;
  return std::max(unit, (bytes + unit - 1) / unit * unit);
}

void* CachingAllocator::allocate(size_t bytes) {
  if (bytes == 0) return nullptr;
  const size_t rounded = round_size(bytes);
  std::lock_guard<std::mutex> lock(mutex_);
  void* p = nullptr;
  if (auto it = cache_.find(rounded); it != cache_.end() && !it->second.empty()) {
    p = it->second.back();
    it->second.pop_back();
    stats_.cached -= int64_t(rounded);
    ++stats_.cache_hits;
  } else {
    p = source_.allocate(rounded);
    if (!p && stats_.cached > 0 && side_work_.empty()) {  // memory held in the cache may be what is missing
      release_cached_locked();
      p = source_.allocate(rounded);
    }
    if (!p)
      MOE_RUN_FAILED("out of device memory: " << bytes << " bytes asked for, " << stats_.in_use << " in use, "
                                              << stats_.reserved << " reserved by this process"
                                              << (side_work_.empty() ? "" : out_of_memory_with_side_work()));
    ++stats_.source_allocations;
    stats_.reserved += int64_t(rounded);
  }
  live_.emplace(p, Live{bytes, rounded});
  stats_.in_use += int64_t(bytes);
  stats_.peak_in_use = std::max(stats_.peak_in_use, stats_.in_use);
  return p;
}

void CachingAllocator::free(void* p) {
  if (!p) return;
  std::lock_guard<std::mutex> lock(mutex_);
  const auto it = live_.find(p);
  MOE_CHECK(it != live_.end(), "freeing device memory this allocator did not hand out");
  const Live block = it->second;
  live_.erase(it);
  stats_.in_use -= int64_t(block.requested);
  if (!side_work_.empty()) {
    parked_.push_back({p, block.rounded, next_ticket_ - 1});
    stats_.parked += int64_t(block.rounded);
    return;
  }
  stats_.cached += int64_t(block.rounded);
  cache_[block.rounded].push_back(p);
}

uint64_t CachingAllocator::begin_side_work() {
  std::lock_guard<std::mutex> lock(mutex_);
  side_work_.insert(next_ticket_);
  return next_ticket_++;
}

void CachingAllocator::end_side_work(uint64_t ticket) {
  std::lock_guard<std::mutex> lock(mutex_);
  MOE_CHECK(side_work_.erase(ticket) == 1, "side work " << ticket << " ended twice or never began");
  unpark_locked();
}

void CachingAllocator::unpark_locked() {
  while (!parked_.empty() && (side_work_.empty() || *side_work_.begin() > parked_.front().last_ticket)) {
    const Parked block = parked_.front();
    parked_.pop_front();
    stats_.parked -= int64_t(block.rounded);
    stats_.cached += int64_t(block.rounded);
    cache_[block.rounded].push_back(block.p);
  }
}

void CachingAllocator::release_cached() {
  std::lock_guard<std::mutex> lock(mutex_);
  release_cached_locked();
}

void CachingAllocator::release_cached_locked() {
  for (auto& [size, blocks] : cache_) {
    for (void* p : blocks) {
      source_.release(p, size);
      ++stats_.source_releases;
      stats_.reserved -= int64_t(size);
      stats_.cached -= int64_t(size);
    }
    blocks.clear();
  }
  cache_.clear();
}

CachingAllocator::Stats CachingAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

}  // namespace moe
