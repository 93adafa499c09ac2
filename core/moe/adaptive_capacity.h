// Adaptive capacity (docs/moe.md "Adaptive capacity"): the decision that moves one MoE layer's capacity
// factor after a step, from that step's overflow ratio. A pure function of the state and the ratio, so every
// rank (which sees the same ratio, summed over the data-parallel group) makes the same decision, and the
// state is what a checkpoint keeps.
#pragma once

#include <cstdint>

namespace moe {

struct CapacityAuto {
  double min = 1.0, max = 1.8;  // the factor's range
  double raise_above = 0.01;    // a step's overflow ratio above this counts towards raising
  double lower_below = 0.001;   // below this towards lowering
  int64_t window = 10;          // consecutive such steps before a change
  double step = 0.1;            // the change
};

// The factor in force and the current runs of consecutive steps above and below the thresholds.
struct CapacityControl {
  double factor = 0;
  int64_t above = 0, below = 0;
};

// After a step with `overflow_ratio` (overflowed / routed assignments): a run reaching `window` moves the
// factor by `step` within [min, max] and starts the runs again; a step between the thresholds ends both.
CapacityControl next_capacity(CapacityControl c, double overflow_ratio, const CapacityAuto& a);

}  // namespace moe
