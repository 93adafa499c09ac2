// One token's selected experts, their scores and gate weights (Ops::gate_weights), shared by the CPU backend's op
// and the CUDA kernel (MOE_HOST_DEVICE), so that both compute it the same way; and the router's floors.
#pragma once

#include <cstdint>

#include "core/host_device.h"

namespace moe {

// Below this the renormalising sum of the selected scores is clamped (and treated as a constant), so a sigmoid
// router cannot drive its scores towards zero to game the losses (docs/moe.md).
constexpr double kMinGateSum = 1e-6;

// The floor under a score before its logarithm (entropy, the warm-up term; docs/moe.md): the router's losses on the
// host and the CPU bodies of their ops (core/backend/cpu/router_kernels.h) read it from here.
constexpr double kRouterMinLogArg = 1e-30;

// p: the token's scores (E); pref: its preference row (at least K wide); sel, selected_score, gate: (K).
template <typename T>
MOE_HOST_DEVICE void token_gate_weights(const T* p, const int32_t* pref, bool renormalised, int32_t* sel,
                                        T* selected_score, T* gate, T* denom, uint8_t* clamped, int64_t K) {
  double sum = 0;
  for (int64_t j = 0; j < K; ++j) {
    sel[j] = pref[j];
    selected_score[j] = sel[j] >= 0 ? p[sel[j]] : T(0);
    if (sel[j] >= 0) sum += double(p[sel[j]]);
  }
  *clamped = 0;
  *denom = T(1);
  if (renormalised) {
    if (sum < kMinGateSum) sum = kMinGateSum, *clamped = 1;
    *denom = T(sum);
  }
  for (int64_t j = 0; j < K; ++j) gate[j] = sel[j] >= 0 ? p[sel[j]] / *denom : T(0);
}

}  // namespace moe
