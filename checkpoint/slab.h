// Where a checkpoint piece lies in its global tensor, in N dimensions: a hyperslab (a box: a start and a
// shape per axis) and, of the hyperslab's elements in row-major order, a contiguous range. A whole tensor,
// an expert shard (a block of axis 0), a tensor-parallel block of any axis and a ZeRO slice of any of these
// (Megatron-Core's ShardedTensor with flattened_range) are all slabs. Restoring intersects the slab a rank
// needs with the slab each stored piece holds, so any layout loads any other's checkpoint.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace moe::ckpt {

struct Slab {
  std::vector<int64_t> global_shape;  // the whole tensor's shape ({} for a scalar)
  std::vector<int64_t> start;         // the hyperslab's first index on each axis
  std::vector<int64_t> shape;         // its extent on each axis
  int64_t begin = 0, count = 0;       // the elements [begin, begin + count) of the hyperslab's row-major order

  // The whole tensor; a range of its flattening (a "moe-checkpoint-1" piece); a whole hyperslab.
  static Slab whole(const std::vector<int64_t>& global_shape);
  static Slab flat(const std::vector<int64_t>& global_shape, int64_t flat_offset, int64_t count);
  static Slab box(const std::vector<int64_t>& global_shape, const std::vector<int64_t>& start,
                  const std::vector<int64_t>& shape);
  // The shape its elements are stored in: the hyperslab's when the range is all of it, else {count}.
  std::vector<int64_t> stored_shape() const;
  bool whole_box() const;  // the range is the whole hyperslab
  // The row-major index in the global tensor of its first element (its elements' smallest); 0 when empty.
  int64_t first_global_index() const;
  // The same elements as 32-bit words: each element of `words` (1 or 2) words, a trailing axis of that size.
  Slab in_words(int64_t words) const;
  // "" when it is a valid part of its tensor (axes agree, box and range inside), else what is wrong.
  std::string problem() const;
  std::string text() const;  // e.g. "[0:6, 4:8] of [6,10], elements [2, +9)"
  bool operator==(const Slab& o) const;
  bool operator!=(const Slab& o) const { return !(*this == o); }
};

// Elements two slabs of one tensor share: `length` consecutive elements at `to` of the first's stored
// elements (counted from its range's begin) and at `from` of the second's.
struct Run {
  int64_t to = 0, from = 0, length = 0;
};
// Both slabs of the same global shape (checked by the caller). Runs in increasing `to`, merged where
// consecutive in both.
std::vector<Run> intersect(const Slab& to, const Slab& from);
// The number of elements they share.
int64_t overlap(const Slab& a, const Slab& b);

}  // namespace moe::ckpt
