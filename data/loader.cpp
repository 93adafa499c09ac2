// The stateless loader (see loader.h).
#include "data/loader.h"

#include <algorithm>

#include "core/error.h"

namespace moe::data {

Loader::Loader(const Corpus& corpus, uint64_t seed, int64_t seq_len)
    : corpus_(corpus), seq_len_(seq_len), source_stream_(seed, "data.source"), offset_stream_(seed, "data.offset") {
  validate_sources(corpus_, seq_len_);
  double total = 0.0;
  for (const Source& source : corpus_.sources) weight_prefix_.push_back(total += source.weight);
}

int32_t Loader::train_source(int64_t step, int64_t index) const {
  MOE_CHECK(step >= 0 && index >= 0, "step " << step << ", index " << index);
  const double target = source_stream_.uniform(uint64_t(step), uint64_t(index)) * weight_prefix_.back();
  // upper_bound: source i owns [prefix[i-1], prefix[i]); the clamp guards target rounding up to the total.
  const auto it = std::upper_bound(weight_prefix_.begin(), weight_prefix_.end(), target);
  return static_cast<int32_t>(std::min<ptrdiff_t>(it - weight_prefix_.begin(), ptrdiff_t(weight_prefix_.size()) - 1));
}

void Loader::train_sequence(int64_t step, int64_t index, int32_t* out) const {
  const std::vector<int32_t>& train = corpus_.sources[size_t(train_source(step, index))].train;
  const uint64_t starts = uint64_t(int64_t(train.size()) - seq_len_);  // >= 1 (validate_sources)
  const uint64_t offset = offset_stream_.below(starts, uint64_t(step), uint64_t(index));
  std::copy_n(train.begin() + ptrdiff_t(offset), seq_len_ + 1, out);
}

int64_t Loader::heldout_count(int32_t source) const {
  MOE_CHECK(source >= 0 && source < num_sources(), "source " << source << " of " << num_sources());
  return (int64_t(corpus_.sources[size_t(source)].heldout.size()) - 1) / seq_len_;
}

void Loader::heldout_sequence(int32_t source, int64_t j, int32_t* out) const {
  MOE_CHECK(j >= 0 && j < heldout_count(source), "held-out window " << j << " of " << heldout_count(source));
  const std::vector<int32_t>& heldout = corpus_.sources[size_t(source)].heldout;
  std::copy_n(heldout.begin() + ptrdiff_t(j * seq_len_), seq_len_ + 1, out);
}

const std::string& Loader::source_name(int32_t source) const {
  MOE_CHECK(source >= 0 && source < num_sources(), "source " << source << " of " << num_sources());
  return corpus_.sources[size_t(source)].name;
}

}  // namespace moe::data
