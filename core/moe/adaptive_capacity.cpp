// Adaptive capacity: see adaptive_capacity.h.
#include "core/moe/adaptive_capacity.h"

#include <algorithm>

namespace moe {

CapacityControl next_capacity(CapacityControl c, double overflow_ratio, const CapacityAuto& a) {
  if (overflow_ratio > a.raise_above) {
    ++c.above, c.below = 0;
  } else if (overflow_ratio < a.lower_below) {
    ++c.below, c.above = 0;
  } else {
    c.above = c.below = 0;
  }
  if (c.above >= a.window) c.factor = std::min(a.max, c.factor + a.step), c.above = 0;
  if (c.below >= a.window) c.factor = std::max(a.min, c.factor - a.step), c.below = 0;
  return c;
}

}  // namespace moe
