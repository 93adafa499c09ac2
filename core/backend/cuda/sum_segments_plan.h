// The CUDA backend's plan for the sums of squares of many segments in two launches
// (Ops::sum_squares_segments_into), as plain arithmetic so that it is tested without a GPU: each segment cut into
// chunks, one block's work in the first launch; the chunks of all segments numbered in one sequence; and the
// segment a chunk belongs to, found from the prefix of chunk counts. Not the kernels (cuda_kernels.cuh).
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "core/backend/ops.h"
#include "core/error.h"
#include "core/host_device.h"

namespace moe::cuda {

// Chunks of kSumChunk elements (the CPU's size), longer in a segment that would have more than kMostPartials of
// them, so that the second launch's block reads at most kMostPartials / 256 partials per thread.
inline constexpr int64_t kSumChunk = 4096, kMostPartials = 16384;

struct SumChunks {
  int64_t offset = 0, length = 0;  // the segment, from the base
  int64_t chunk = kSumChunk;       // elements per chunk, the last one shorter
  int64_t first = 0;               // the number of its first chunk: how many the segments before it have
};

// The chunks of a segment of n elements: the chunk length, then the count (0 for an empty segment). Both depend
// on n alone.
inline int64_t sum_chunk_length(int64_t n) {
  const int64_t at_least = (n + kSumChunk - 1) / kSumChunk;
  return kSumChunk * std::max<int64_t>(1, (at_least + kMostPartials - 1) / kMostPartials);
}
inline int64_t sum_chunk_count(int64_t n) { return (n + sum_chunk_length(n) - 1) / sum_chunk_length(n); }

// count + 1 entries: the segments', then one whose `first` is the number of chunks of them all.
inline std::vector<SumChunks> sum_chunks_plan(const SumSegment* segments, int64_t count) {
  std::vector<SumChunks> plan(size_t(count) + 1);
  int64_t first = 0;
  for (int64_t i = 0; i < count; ++i) {
    const SumSegment& s = segments[i];
    MOE_CHECK(s.offset >= 0 && s.length >= 0, "sum_squares_segments_into: segment " << i << " at offset " << s.offset
                                                                                    << " of length " << s.length
                                                                                    << "; both must be >= 0");
    plan[size_t(i)] = {s.offset, s.length, sum_chunk_length(s.length), first};
    first += sum_chunk_count(s.length);
  }
  plan[size_t(count)].first = first;
  return plan;
}

// The segment that chunk c (below the total) belongs to: the last with first <= c (an empty segment shares its
// first with the next). A binary search, once per block.
MOE_HOST_DEVICE inline int64_t segment_of_chunk(const SumChunks* plan, int64_t count, int64_t c) {
  int64_t lo = 0, hi = count - 1;
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo + 1) / 2;
    if (plan[mid].first <= c)
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}

}  // namespace moe::cuda
