// The CPU bodies of the router's backward ops of core/backend/ops.h (gate weights -> scores, the router losses'
// gradients, scores -> logits), as plain functions the CPU backend calls. The arithmetic is the one the router did
// on the host before these were ops, moved unchanged, so the CPU's results keep their bits: each token's row is
// computed by one thread in a fixed order (the same bits at any thread count), the exponentials and logarithms of
// a row taken at once (cpu::log_sum_exp, cpu::exp_shifted, cpu::log_doubles; with 64 experts the scalar calls were
// as long as a third of the layer's expert GEMMs, docs/bench.md "The router's losses").
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "core/backend/cpu/vector_math.h"
#include "core/moe/gate_weights.h"

namespace moe::cpu {

// log max(p, kRouterMinLogArg) of a row p (E values), in a buffer of the calling thread that its next call
// overwrites.
template <typename T>
const double* router_row_log(const T* p, int64_t E) {
  thread_local std::vector<double> lp;
  lp.resize(size_t(E));
  for (int64_t i = 0; i < E; ++i) lp[size_t(i)] = std::max(double(p[i]), kRouterMinLogArg);
  log_doubles(lp.data(), lp.data(), E);
  return lp.data();
}

// The selected experts of each token, their scores and gate weights (Ops::gate_weights).
template <typename T>
void gate_weights(const T* scores, const int32_t* preference, int64_t W, bool renormalised, int32_t* selected,
                  T* selected_score, T* gate, T* denom, uint8_t* clamped, int64_t N, int64_t E, int64_t K) {
  for (int64_t n = 0; n < N; ++n)
    token_gate_weights(scores + n * E, preference + n * W, renormalised, selected + n * K, selected_score + n * K,
                       gate + n * K, denom + n, clamped + n, K);
}

// The top-k fractions of each expert (Ops::expert_fractions): counted in T (exact), then divided.
template <typename T>
void expert_fractions(const int32_t* top, T* f, int64_t N, int64_t K, int64_t E) {
  for (int64_t e = 0; e < E; ++e) f[e] = T(0);
  for (int64_t i = 0; i < N * K; ++i) f[top[i]] += T(1);
  for (int64_t e = 0; e < E; ++e) f[e] /= T(double(N * K));
}

// The router losses' sums (Ops::router_loss_sums): each row's log-sum-exp and entropy among the threads, then
// the sums in row order.
template <typename T>
void router_loss_sums(const T* logits, const T* scores, double* out, int64_t N, int64_t E) {
  std::vector<double> lse(static_cast<size_t>(N)), entropy(static_cast<size_t>(N));
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    lse[size_t(n)] = log_sum_exp(logits + n * E, E);
    const T* p = scores + n * E;
    const double* lp = router_row_log(p, E);
    double h = 0;
    for (int64_t i = 0; i < E; ++i) h -= double(p[i]) * lp[i];
    entropy[size_t(n)] = h;
  }
  double* P = out;
  for (int64_t e = 0; e < E; ++e) P[e] = 0;
  double zsum = 0, hsum = 0;
  for (int64_t n = 0; n < N; ++n) {
    const T* p = scores + n * E;
    zsum += lse[size_t(n)] * lse[size_t(n)];
    for (int64_t e = 0; e < E; ++e) P[e] += double(p[e]);
    hsum += entropy[size_t(n)];
  }
  out[E] = zsum, out[E + 1] = hsum;
}

// Gate weights -> scores. Raw gates w_j = p[e_j] / denom; renormalised ones w_j = p[e_j] / sum (a clamped sum a
// constant).
template <typename T>
void gate_backward(const T* gate, const int32_t* selected, const T* dw, const T* denom, const uint8_t* clamped,
                   bool renormalised, T* dp, int64_t N, int64_t K, int64_t E) {
  for (int64_t n = 0; n < N; ++n) {
    const T* w = gate + n * K;
    const int32_t* sel = selected + n * K;
    const T* d = dw + n * K;
    T* row = dp + n * E;
    double g = 0;
    if (renormalised && !clamped[n])
      for (int64_t j = 0; j < K; ++j) g += double(d[j]) * double(w[j]);
    for (int64_t j = 0; j < K; ++j) {
      if (sel[j] < 0) continue;
      if (renormalised)
        row[sel[j]] += T((double(d[j]) - g) / double(denom[n]));
      else
        row[sel[j]] += T(double(d[j]) / double(denom[n]));
    }
  }
}

// The router losses' gradients (ops.h RouterLossGrad) into dp (through the scores) and dz (z-loss).
template <typename T, typename Coefficients>
void router_loss_backward(const T* logits, const T* scores, const T* f, const Coefficients& c, T* dp, T* dz, int64_t N,
                          int64_t E) {
  const double rs = c.scale, inv_n = 1.0 / double(N);
  std::vector<double> P(static_cast<size_t>(E), 0.0);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t e = 0; e < E; ++e) P[e] += double(scores[n * E + e]) * inv_n;
  // The warm-up term's d/dP_e = coef (1 / S - 1 / (E P_e)), each token's p_e entering P_e with 1/N.
  std::vector<double> warmup(static_cast<size_t>(E), 0.0);
  if (c.warming) {
    double S = 0;
    for (int64_t e = 0; e < E; ++e) S += P[e];
    for (int64_t e = 0; e < E; ++e)
      warmup[e] = c.coef_warmup * inv_n * (1.0 / S - 1.0 / (double(E) * std::max(P[e], kRouterMinLogArg)));
  }
  // Each token's row of dp and dz is its own: the rows among the threads.
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const T* z = logits + n * E;
    const T* p = scores + n * E;
    const double lse = log_sum_exp(z, E);
    const double* ez = exp_shifted(z, lse, E);  // exp(z - lse)
    const double* lp = router_row_log(p, E);
    for (int64_t e = 0; e < E; ++e) {
      double g = c.coef_aux * double(E) * double(f[e]) * inv_n;
      g += c.coef_entropy * inv_n * (lp[e] + 1.0);
      if (P[e] < c.death_floor) g -= c.coef_death * inv_n;
      if (c.warming) g += warmup[e];
      dp[n * E + e] += T(rs * g);
      dz[n * E + e] += T(rs * c.coef_z * 2.0 * lse * ez[e] * inv_n);
    }
  }
}

// d(score)/d(z') of one row times dp, divided by tau: the softmax's Jacobian or the sigmoid's, into out (+=).
template <typename T>
void score_row_backward(const T* p, const T* g, double tau, bool sigmoid, T* out, int64_t E) {
  if (sigmoid) {
    for (int64_t e = 0; e < E; ++e) out[e] += T(double(g[e]) * p[e] * (1.0 - double(p[e])) / tau);
    return;
  }
  double dot = 0;
  for (int64_t e = 0; e < E; ++e) dot += double(p[e]) * g[e];
  for (int64_t e = 0; e < E; ++e) out[e] += T(double(p[e]) * (double(g[e]) - dot) / tau);
}

// Scores -> logits (ops.h score_backward): dz += the rows; with logits, *d_log_tau = -sum over the own rows of
// the row's gradient times (z + noise), in row order.
template <typename T>
void score_backward(const T* scores, const T* dp, double tau, bool sigmoid, const T* logits, const double* noise,
                    int64_t own_first, int64_t own_count, double* d_log_tau, T* dz, int64_t N, int64_t E) {
  if (!logits) {
    for (int64_t n = 0; n < N; ++n) score_row_backward(scores + n * E, dp + n * E, tau, sigmoid, dz + n * E, E);
    return;
  }
  std::vector<T> row(static_cast<size_t>(E));
  double sum = 0;
  for (int64_t n = 0; n < N; ++n) {
    std::fill(row.begin(), row.end(), T(0));
    score_row_backward(scores + n * E, dp + n * E, tau, sigmoid, row.data(), E);
    for (int64_t e = 0; e < E; ++e) {
      dz[n * E + e] += row[size_t(e)];
      if (n >= own_first && n < own_first + own_count)
        sum -= double(row[size_t(e)]) * (double(logits[n * E + e]) + (noise ? noise[n * E + e] : 0.0));
    }
  }
  *d_log_tau = sum;
}

}  // namespace moe::cpu
