// AdamW, the learning-rate schedule and global-norm clipping.
#include "optim/adamw.h"

#include <algorithm>
#include <cmath>

#include "core/backend/ops.h"

namespace moe {

double LrSchedule::at(int64_t step) const {
  if (warmup > 0 && step < warmup) return lr * double(step + 1) / double(warmup);
  const int64_t decay_steps = steps - warmup;
  if (decay_steps <= 1) return lr;
  const double progress = double(step - warmup) / double(decay_steps - 1);
  return min_lr + 0.5 * (lr - min_lr) * (1.0 + std::cos(M_PI * std::min(1.0, progress)));
}

AdamW::AdamW(const ParamTable& table, AdamWSettings settings, const std::vector<Segment>& owned) : s_(settings) {
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
  m_.assign(size_t(state), 0.0f);
  v_.assign(size_t(state), 0.0f);
}

void AdamW::step(float* params, const float* grads, double lr) {
  ++t_;
  const double bc1 = 1.0 - std::pow(s_.beta1, double(t_));
  const double bc2 = 1.0 - std::pow(s_.beta2, double(t_));
  const float b1 = float(s_.beta1), b2 = float(s_.beta2);
  const float step_size = float(lr / bc1);
  const float inv_bc2 = float(1.0 / bc2);
  const float eps = float(s_.eps);
  for (const Piece& piece : pieces_) {
    const float decay = piece.decay ? float(lr * s_.weight_decay) : 0.0f;
    float* p = params + piece.offset;
    const float* g = grads + piece.offset;
    float* m = m_.data() + piece.state;
    float* v = v_.data() + piece.state;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < piece.length; ++i) {
      m[i] = b1 * m[i] + (1.0f - b1) * g[i];
      v[i] = b2 * v[i] + (1.0f - b2) * g[i] * g[i];
      p[i] -= decay * p[i];  // decoupled weight decay
      p[i] -= step_size * m[i] / (std::sqrt(v[i] * inv_bc2) + eps);
    }
  }
}

double sum_squares(const float* data, const std::vector<Segment>& segments) {
  Ops<float>& ops = cpu_ops<float>();
  double total = 0;
  for (const Segment& s : segments) total += ops.sum_squares(data + s.offset, s.length);
  return total;
}

void scale_segments(float* data, const std::vector<Segment>& segments, float factor) {
  Ops<float>& ops = cpu_ops<float>();
  for (const Segment& s : segments) ops.scale(data + s.offset, factor, s.length);
}

double clip_grad_norm(float* grads, int64_t n, double clip) {
  Ops<float>& ops = cpu_ops<float>();
  const double norm = std::sqrt(ops.sum_squares(grads, n));
  if (clip > 0 && norm > clip) ops.scale(grads, float(clip / norm), n);
  return norm;
}

}  // namespace moe
