// The stateless loader (see loader.h).
#include "data/loader.h"

#include <algorithm>

#include "core/error.h"
#include "data/shards.h"

namespace moe::data {
namespace {

// The index whose [prefix[i-1], prefix[i]) holds `target`; the clamp guards target rounding up to the total.
int64_t pick(const std::vector<double>& prefix, double target) {
  const auto it = std::upper_bound(prefix.begin(), prefix.end(), target);
  return std::min<ptrdiff_t>(it - prefix.begin(), ptrdiff_t(prefix.size()) - 1);
}

}  // namespace

std::vector<double> schedule_weights(const MixSchedule& schedule, int64_t step) {
  if (schedule.empty()) return {};
  const int64_t at = step + 1;  // the step as metrics.jsonl counts it
  if (at <= schedule.front().step) return schedule.front().weights;
  if (at >= schedule.back().step) return schedule.back().weights;
  const auto next = std::upper_bound(schedule.begin(), schedule.end(), at,
                                     [](int64_t s, const SchedulePoint& p) { return s < p.step; });
  const SchedulePoint& b = *next;
  const SchedulePoint& a = *(next - 1);
  const double t = double(at - a.step) / double(b.step - a.step);
  std::vector<double> weights(a.weights.size());
  for (size_t k = 0; k < weights.size(); ++k) weights[k] = a.weights[k] + t * (b.weights[k] - a.weights[k]);
  return weights;
}

Loader::Loader(const Corpus& corpus, uint64_t seed, int64_t seq_len, MixSchedule schedule)
    : corpus_(corpus),
      seq_len_(seq_len),
      schedule_(std::move(schedule)),
      source_stream_(seed, "data.source"),
      segment_stream_(seed, "data.segment"),
      offset_stream_(seed, "data.offset") {
  validate_sources(corpus_, seq_len_);
  double total = 0.0;
  for (const Source& source : corpus_.sources) weight_prefix_.push_back(total += source.weight);
  for (const SchedulePoint& point : schedule_)
    MOE_CHECK(point.weights.size() == corpus_.sources.size(),
              "schedule point of step " << point.step << " has " << point.weights.size() << " weights for "
                                        << corpus_.sources.size() << " sources");
  for (const Source& source : corpus_.sources) {
    std::vector<double> prefix;
    double sum = 0.0;
    for (const Segment& seg : source.segments)
      prefix.push_back(sum += seg.train > seq_len_ ? seg.weight * double(seg.train - seq_len_) : 0.0);
    segment_prefix_.push_back(std::move(prefix));
  }
}

std::vector<double> Loader::weights_at(int64_t step) const {
  if (!schedule_.empty()) return schedule_weights(schedule_, step);
  std::vector<double> weights;
  for (const Source& source : corpus_.sources) weights.push_back(source.weight);
  return weights;
}

int32_t Loader::train_source(int64_t step, int64_t index) const {
  MOE_CHECK(step >= 0 && index >= 0, "step " << step << ", index " << index);
  const double u = source_stream_.uniform(uint64_t(step), uint64_t(index));
  if (schedule_.empty()) return int32_t(pick(weight_prefix_, u * weight_prefix_.back()));
  std::vector<double> prefix = schedule_weights(schedule_, step);
  for (size_t k = 1; k < prefix.size(); ++k) prefix[k] += prefix[k - 1];
  return int32_t(pick(prefix, u * prefix.back()));
}

void Loader::train_sequence(int64_t step, int64_t index, int32_t* out) const {
  const Source& source = corpus_.sources[size_t(train_source(step, index))];
  if (source.prepared()) return prepared_train_sequence(source, step, index, out);
  const std::vector<int32_t>& train = source.train;
  const uint64_t starts = uint64_t(int64_t(train.size()) - seq_len_);  // >= 1 (validate_sources)
  const uint64_t offset = offset_stream_.below(starts, uint64_t(step), uint64_t(index));
  std::copy_n(train.begin() + ptrdiff_t(offset), seq_len_ + 1, out);
}

void Loader::prepared_train_sequence(const Source& source, int64_t step, int64_t index, int32_t* out) const {
  const std::vector<double>& prefix = segment_prefix_[size_t(&source - corpus_.sources.data())];
  // One segment (one tier): no draw, so adding tiers elsewhere changes nothing here.
  int64_t k = 0;
  if (prefix.size() > 1) k = pick(prefix, segment_stream_.uniform(uint64_t(step), uint64_t(index)) * prefix.back());
  const Segment& seg = source.segments[size_t(k)];
  const uint64_t starts = uint64_t(seg.train - seq_len_);  // >= 1: segments too short have no weight
  const uint64_t offset = offset_stream_.below(starts, uint64_t(step), uint64_t(index));
  seg.tokens->read(int64_t(offset), seq_len_ + 1, out);
}

int64_t Loader::heldout_count(int32_t source) const {
  MOE_CHECK(source >= 0 && source < num_sources(), "source " << source << " of " << num_sources());
  const Source& s = corpus_.sources[size_t(source)];
  if (!s.prepared()) return (int64_t(s.heldout.size()) - 1) / seq_len_;
  int64_t windows = 0;
  for (const Segment& seg : s.segments) windows += seg.heldout > seq_len_ ? (seg.heldout - 1) / seq_len_ : 0;
  return windows;
}

void Loader::heldout_sequence(int32_t source, int64_t j, int32_t* out) const {
  MOE_CHECK(j >= 0 && j < heldout_count(source), "held-out window " << j << " of " << heldout_count(source));
  const Source& s = corpus_.sources[size_t(source)];
  if (!s.prepared()) {
    std::copy_n(s.heldout.begin() + ptrdiff_t(j * seq_len_), seq_len_ + 1, out);
    return;
  }
  for (const Segment& seg : s.segments) {
    const int64_t windows = seg.heldout > seq_len_ ? (seg.heldout - 1) / seq_len_ : 0;
    if (j < windows) return seg.tokens->read(seg.train + j * seq_len_, seq_len_ + 1, out);
    j -= windows;
  }
}

const std::string& Loader::source_name(int32_t source) const {
  MOE_CHECK(source >= 0 && source < num_sources(), "source " << source << " of " << num_sources());
  return corpus_.sources[size_t(source)].name;
}

}  // namespace moe::data
