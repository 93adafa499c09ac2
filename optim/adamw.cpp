// AdamW, the learning-rate schedule and global-norm clipping.
#include "optim/adamw.h"

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

AdamW::AdamW(const ParamTable& table, AdamWSettings settings)
    : table_(table), s_(settings), m_(size_t(table.numel()), 0.0f), v_(size_t(table.numel()), 0.0f) {}

void AdamW::step(float* params, const float* grads, double lr) {
  ++t_;
  const double bc1 = 1.0 - std::pow(s_.beta1, double(t_));
  const double bc2 = 1.0 - std::pow(s_.beta2, double(t_));
  const float b1 = float(s_.beta1), b2 = float(s_.beta2);
  for (const ParamSpec& spec : table_.specs()) {
    const float decay = spec.weight_decay ? float(lr * s_.weight_decay) : 0.0f;
    const float step_size = float(lr / bc1);
    const float inv_bc2 = float(1.0 / bc2);
    const float eps = float(s_.eps);
    float* p = params + spec.offset;
    const float* g = grads + spec.offset;
    float* m = m_.data() + spec.offset;
    float* v = v_.data() + spec.offset;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < spec.numel; ++i) {
      m[i] = b1 * m[i] + (1.0f - b1) * g[i];
      v[i] = b2 * v[i] + (1.0f - b2) * g[i] * g[i];
      p[i] -= decay * p[i];  // decoupled weight decay
      p[i] -= step_size * m[i] / (std::sqrt(v[i] * inv_bc2) + eps);
    }
  }
}

double clip_grad_norm(float* grads, int64_t n, double clip) {
  Ops<float>& ops = cpu_ops<float>();
  const double norm = std::sqrt(ops.sum_squares(grads, n));
  if (clip > 0 && norm > clip) ops.scale(grads, float(clip / norm), n);
  return norm;
}

}  // namespace moe
