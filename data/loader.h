// The loader: which tokens global sequence `index` of optimizer step `step` holds, as a pure function
// of (seed, step, index) and the corpus. No position is kept, so resuming at step s needs no
// checkpointed state and every parallel layout (docs/model.md "Batches") sees the same sequences.
// Not here: which indices a rank takes (its data-parallel slice), batching into tensors, the corpus.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/philox.h"
#include "data/corpus.h"

namespace moe::data {

class Loader {
 public:
  // Copies the corpus (a few MB), so a temporary corpus is safe to pass. Throws BadInput when a split
  // is shorter than seq_len + 1 tokens (validate_sources).
  Loader(const Corpus& corpus, uint64_t seed, int64_t seq_len);

  // Sequence `index` of step `step`: seq_len + 1 consecutive tokens of one source's train split into
  // out (inputs out[0..T-1], targets out[1..T]). The source is drawn with probability proportional
  // to its weight, the start uniformly over the split's size - seq_len valid starting positions.
  void train_sequence(int64_t step, int64_t index, int32_t* out) const;  // out: (T + 1)
  // The source train_sequence(step, index) takes its tokens from.
  int32_t train_source(int64_t step, int64_t index) const;

  // Held-out windows of a source: window j is tokens [j*T, j*T + T] of its held-out split, so the
  // windows' targets never overlap and every held-out token after the first is predicted once.
  int64_t heldout_count(int32_t source) const;
  void heldout_sequence(int32_t source, int64_t j, int32_t* out) const;  // out: (T + 1)

  int32_t num_sources() const { return static_cast<int32_t>(corpus_.sources.size()); }
  const std::string& source_name(int32_t source) const;
  int64_t seq_len() const { return seq_len_; }

 private:
  Corpus corpus_;
  int64_t seq_len_;
  RngStream source_stream_;            // "data.source": uniform(step, index) picks the source
  RngStream offset_stream_;            // "data.offset": below(starts, step, index) picks the start
  std::vector<double> weight_prefix_;  // weight_prefix_[i] = sum of weights 0..i
};

}  // namespace moe::data
