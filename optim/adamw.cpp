// AdamW, the learning-rate schedule and global-norm clipping.
#include "optim/adamw.h"

#include <algorithm>
#include <cmath>

#include "core/backend/ops.h"
#include "core/sizes.h"

namespace moe {

double LrSchedule::at(int64_t step) const {
  if (warmup > 0 && step < warmup) return lr * double(step + 1) / double(warmup);
  const int64_t decay_steps = steps - warmup;
  if (decay_steps <= 1) return lr;
  const double progress = double(step - warmup) / double(decay_steps - 1);
  return min_lr + 0.5 * (lr - min_lr) * (1.0 + std::cos(M_PI * std::min(1.0, progress)));
}

AdamW::AdamW(Backend& backend, const ParamTable& table, AdamWSettings settings, const std::vector<Segment>& owned,
             bool zero)
    : backend_(backend), table_(table), zero_(zero), s_(settings) {
  std::vector<Segment> ranges = owned;
  if (ranges.empty()) ranges.push_back({0, table.numel()});
  int64_t state = 0;
  for (const Segment& r : ranges)
    for (const ParamSpec& spec : table.specs()) {
      const int64_t lo = std::max(r.offset, spec.offset), hi = std::min(r.offset + r.length, spec.offset + spec.numel);
      if (hi <= lo) continue;
      pieces_.push_back({lo, hi - lo, spec.weight_decay, state});
      state += hi - lo;
    }
  m_ = backend.allocate(DType::F32, sizes::elements(sizes::adamw_moment(double(state))));
  v_ = backend.allocate(DType::F32, sizes::elements(sizes::adamw_moment(double(state))));
}

void AdamW::step(float* params, const float* grads, double lr) {
  ++t_;
  const double bc1 = 1.0 - std::pow(s_.beta1, double(t_));
  const double bc2 = 1.0 - std::pow(s_.beta2, double(t_));
  Ops<float>::AdamWStep step{float(s_.beta1), float(s_.beta2), float(lr / bc1), float(1.0 / bc2), float(s_.eps), 0.0f};
  Ops<float>& ops = backend_.ops<float>();
  for (const Piece& piece : pieces_) {
    step.decay = piece.decay ? float(lr * s_.weight_decay) : 0.0f;
    ops.adamw_update(params + piece.offset, grads + piece.offset, first_moment() + piece.state,
                     second_moment() + piece.state, piece.length, step);
  }
}

double sum_squares(Backend& backend, const float* data, const std::vector<Segment>& segments) {
  return sum_squares(backend, data, std::vector<const std::vector<Segment>*>{&segments})[0];
}

std::vector<double> sum_squares(Backend& backend, const float* data,
                                const std::vector<const std::vector<Segment>*>& lists) {
  int64_t count = 0;
  for (const std::vector<Segment>* list : lists) count += int64_t(list->size());
  std::vector<double> totals(lists.size(), 0.0);
  if (count == 0) return totals;
  // Every segment's sum into backend memory in one op, then all of them in one download, added up in the segments'
  // order.
  std::vector<SumSegment> segments;
  segments.reserve(size_t(count));
  for (const std::vector<Segment>* list : lists)
    for (const Segment& s : *list) segments.push_back({s.offset, s.length});
  Buffer sums = backend.allocate(DType::F64, count);
  backend.ops<float>().sum_squares_segments_into(data, segments.data(), count, sums.data<double>());
  const std::vector<double> each = backend.download<double>(sums);
  int64_t at = 0;
  for (size_t l = 0; l < lists.size(); ++l)
    for (size_t i = 0; i < lists[l]->size(); ++i) totals[l] += each[size_t(at++)];
  return totals;
}

void scale_segments(Backend& backend, float* data, const std::vector<Segment>& segments, float factor) {
  Ops<float>& ops = backend.ops<float>();
  for (const Segment& s : segments) ops.scale(data + s.offset, factor, s.length);
}

double clip_grad_norm(Backend& backend, float* grads, int64_t n, double clip) {
  Ops<float>& ops = backend.ops<float>();
  const double norm = std::sqrt(ops.sum_squares(grads, n));
  if (clip > 0 && norm > clip) ops.scale(grads, float(clip / norm), n);
  return norm;
}

}  // namespace moe
