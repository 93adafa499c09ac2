// The loader: which tokens global sequence `index` of optimizer step `step` holds, as a pure function
// of (seed, step, index), the corpus and the mixing schedule. No position is kept, so resuming at step s
// needs no checkpointed state and every parallel layout (docs/model.md "Batches") sees the same sequences.
// Not here: which indices a rank takes (its data-parallel slice), batching into tensors, the corpus.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/philox.h"
#include "data/corpus.h"

namespace moe::data {

// data.schedule: source weights at some steps, linearly interpolated between them (docs/data.md
// "Mixing schedule"). A point's step counts as metrics.jsonl does: loader step s (0-based) is step s + 1.
// Before the first point its weights hold, after the last point the last's.
struct SchedulePoint {
  int64_t step = 0;
  std::vector<double> weights;  // one per source, in corpus order; >= 0, at least one > 0
};
using MixSchedule = std::vector<SchedulePoint>;

// The weights of `schedule` at loader step `step` (0-based). Empty schedule: empty result.
std::vector<double> schedule_weights(const MixSchedule& schedule, int64_t step);

class Loader {
 public:
  // Copies the corpus (a few MB; prepared sources share their opened shards), so a temporary corpus is
  // safe to pass. Throws BadInput when a split is shorter than seq_len + 1 tokens (validate_sources) or
  // the schedule does not give one weight per source.
  Loader(const Corpus& corpus, uint64_t seed, int64_t seq_len, MixSchedule schedule = {});

  // Sequence `index` of step `step`: seq_len + 1 consecutive tokens of one source's train split into
  // out (inputs out[0..T-1], targets out[1..T]). The source is drawn with probability proportional
  // to its weight (the schedule's at this step when there is one); within a prepared source of several
  // quality tiers, the tier's segment with probability proportional to its weight times its starting
  // positions; then the start uniformly over the split's size - seq_len valid starting positions.
  void train_sequence(int64_t step, int64_t index, int32_t* out) const;  // out: (T + 1)
  // The source train_sequence(step, index) takes its tokens from.
  int32_t train_source(int64_t step, int64_t index) const;
  // The source weights in force at `step` (0-based): the schedule's, else the sources' own.
  std::vector<double> weights_at(int64_t step) const;

  // Held-out windows of a source: window j is tokens [j*T, j*T + T] of its held-out split, so the
  // windows' targets never overlap and every held-out token after the first is predicted once. A
  // prepared source's windows are those of its segments, one segment after the other.
  int64_t heldout_count(int32_t source) const;
  void heldout_sequence(int32_t source, int64_t j, int32_t* out) const;  // out: (T + 1)

  int32_t num_sources() const { return static_cast<int32_t>(corpus_.sources.size()); }
  const std::string& source_name(int32_t source) const;
  int64_t seq_len() const { return seq_len_; }

 private:
  void prepared_train_sequence(const Source& source, int64_t step, int64_t index, int32_t* out) const;

  Corpus corpus_;
  int64_t seq_len_;
  MixSchedule schedule_;
  RngStream source_stream_;            // "data.source": uniform(step, index) picks the source
  RngStream segment_stream_;           // "data.segment": uniform(step, index) picks a prepared source's tier
  RngStream offset_stream_;            // "data.offset": below(starts, step, index) picks the start
  std::vector<double> weight_prefix_;  // weight_prefix_[i] = sum of weights 0..i
  // Per source, the running sum of its segments' weight * starting positions (prepared sources only).
  std::vector<std::vector<double>> segment_prefix_;
};

}  // namespace moe::data
