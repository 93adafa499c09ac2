// The CPU bodies of the MoE and optimizer ops of core/backend/ops.h (router scores, top-k, row moves,
// AdamW), as plain functions the CPU backend calls. Each row (or element) is computed by one thread in a
// fixed order, so results do not depend on the thread count. The arithmetic is the one the router, the MoE
// layer and AdamW did on the host before these were ops, but for the softmax's exponentials, taken a row at a
// time through libmvec (cpu/vector_math.h) since 64 experts made the scalar calls a large part of the router.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <vector>

#include "core/backend/cpu/vector_math.h"
#include "core/dtype.h"
#include "core/philox.h"

namespace moe::cpu {

inline void gumbel_noise(uint64_t key, uint64_t step, uint64_t first_counter, double* out, int64_t n) {
  RngStream rng;
  rng.key = key;
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) out[i] = rng.gumbel(step, first_counter + uint64_t(i));
}

// z' = (z + noise) / tau in double, one row.
template <typename T>
inline void scaled_row(const T* z, const double* noise, double tau, double* out, int64_t E) {
  for (int64_t e = 0; e < E; ++e) out[e] = double(z[e]);
  if (noise)
    for (int64_t e = 0; e < E; ++e) out[e] += noise[e];
  for (int64_t e = 0; e < E; ++e) out[e] /= tau;
}

template <typename T>
void softmax_rows(const T* z, const double* noise, double tau, T* p, int64_t N, int64_t E) {
#pragma omp parallel
  {
    std::vector<double> row(static_cast<size_t>(E));
#pragma omp for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
      scaled_row(z + n * E, noise ? noise + n * E : nullptr, tau, row.data(), E);
      double m = -INFINITY, sum = 0;
      for (int64_t e = 0; e < E; ++e) m = std::max(m, row[e]);
      const double* ex = exp_shifted(row.data(), m, E);
      for (int64_t e = 0; e < E; ++e) sum += ex[e];
      for (int64_t e = 0; e < E; ++e) p[n * E + e] = T(ex[e] / sum);
    }
  }
}

template <typename T>
void sigmoid_rows(const T* z, const double* noise, double tau, T* p, int64_t N, int64_t E) {
#pragma omp parallel
  {
    std::vector<double> row(static_cast<size_t>(E));
#pragma omp for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
      scaled_row(z + n * E, noise ? noise + n * E : nullptr, tau, row.data(), E);
      for (int64_t e = 0; e < E; ++e) p[n * E + e] = T(1.0 / (1.0 + std::exp(-row[e])));
    }
  }
}

// The K best of a row under a strict total order (key descending, then index ascending), which selects exactly
// what a full stable sort would: few of them (K <= kTopkInsertion) by insertion into a sorted list while the row is
// read in index order (an equal key never displaces an earlier index), more by a partial sort.
constexpr int64_t kTopkInsertion = 8;

template <typename T>
void topk_rows(const T* p, const float* bias, const uint8_t* mask, int32_t* index, int64_t N, int64_t E, int64_t K) {
#pragma omp parallel
  {
    std::vector<int32_t> order(static_cast<size_t>(E));
    std::vector<double> best(static_cast<size_t>(std::min(K, E)));
#pragma omp for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
      const T* row = p + n * E;
      auto key = [&](int32_t e) { return double(row[e]) + (bias ? double(bias[e]) : 0.0); };
      int64_t take = 0;
      if (K > 0 && K <= kTopkInsertion) {
        for (int32_t e = 0; e < E; ++e) {
          if (mask && mask[e]) continue;
          const double k = key(e);
          if (take == K && !(k > best[size_t(K - 1)])) continue;
          int64_t j = take < K ? take++ : K - 1;
          for (; j > 0 && k > best[size_t(j - 1)]; --j)
            best[size_t(j)] = best[size_t(j - 1)], order[size_t(j)] = order[size_t(j - 1)];
          best[size_t(j)] = k, order[size_t(j)] = e;
        }
      } else {
        int64_t available = 0;
        for (int32_t e = 0; e < E; ++e)
          if (!mask || !mask[e]) order[size_t(available++)] = e;
        take = std::min(K, available);
        std::partial_sort(order.begin(), order.begin() + take, order.begin() + available, [&](int32_t a, int32_t b) {
          const double ka = key(a), kb = key(b);
          return ka > kb || (ka == kb && a < b);
        });
      }
      int32_t* out = index + n * K;
      for (int64_t j = 0; j < K; ++j) out[j] = j < take ? order[size_t(j)] : -1;
    }
  }
}

template <typename T>
void gather_rows(const T* src, const int32_t* index, const T* scale, T* dst, int64_t rows, int64_t D) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    T* out = dst + r * D;
    if (index[r] < 0) {
      std::fill_n(out, D, T(0));
      continue;
    }
    const T* in = src + int64_t(index[r]) * D;
    if (scale) {
      const T w = scale[r];
      for (int64_t d = 0; d < D; ++d) out[d] = w * in[d];
    } else {
      std::copy_n(in, D, out);
    }
  }
}

// Ops::gather_rows_rounded: the rows held rounded (dtype.h to_rounded).
template <typename T>
void gather_rows_rounded(const T* src, const int32_t* index, Rounded<T>* dst, int64_t rows, int64_t D) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    Rounded<T>* out = dst + r * D;
    if (index[r] < 0)
      std::fill_n(out, D, Rounded<T>{});
    else
      for (int64_t d = 0; d < D; ++d) out[d] = to_rounded(src[int64_t(index[r]) * D + d]);
  }
}

// Columns are split among threads; each column adds its rows in row order (deterministic).
template <typename T>
void scatter_add_rows(const T* src, const int32_t* index, const T* scale, T* dst, int64_t rows, int64_t D) {
  constexpr int64_t kCols = 64;
  const int64_t blocks = (D + kCols - 1) / kCols;
#pragma omp parallel for schedule(static)
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const int64_t c0 = blk * kCols, c1 = std::min(D, c0 + kCols);
    for (int64_t r = 0; r < rows; ++r) {
      if (index[r] < 0) continue;
      T* out = dst + int64_t(index[r]) * D;
      const T* in = src + r * D;
      if (scale) {
        const T w = scale[r];
        for (int64_t c = c0; c < c1; ++c) out[c] += w * in[c];
      } else {
        for (int64_t c = c0; c < c1; ++c) out[c] += in[c];
      }
    }
  }
}

template <typename T>
void combine_rows(const T* src, const int32_t* index, const T* weight, T* dst, int64_t N, int64_t K, int64_t D,
                  bool accumulate) {
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    T* out = dst + n * D;
    if (!accumulate) std::fill_n(out, D, T(0));
    for (int64_t j = 0; j < K; ++j) {
      const int64_t slot = n * K + j;
      if (index[slot] < 0) continue;
      const T* in = src + int64_t(index[slot]) * D;
      if (weight) {
        const T w = weight[slot];
        for (int64_t d = 0; d < D; ++d) out[d] += w * in[d];
      } else {
        for (int64_t d = 0; d < D; ++d) out[d] += in[d];
      }
    }
  }
}

template <typename T>
void row_dots(const T* a, const int32_t* index, const T* b, T* out, int64_t rows, int64_t D) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const T* x = a + int64_t(index[r]) * D;
    const T* y = b + r * D;
    double dot = 0;
    for (int64_t d = 0; d < D; ++d) dot += double(x[d]) * y[d];
    out[r] = T(dot);
  }
}

// rounded: null, or where the new p go rounded to bf16 (the parameters' rounded copy, Ops::adamw_update).
template <typename T, typename Step>
void adamw_update(T* p, const T* g, T* m, T* v, int64_t n, const Step& s, T* rounded) {
  const T b1 = s.beta1, b2 = s.beta2, step_size = s.step_size, inv_bc2 = s.inv_bc2, eps = s.eps, decay = s.decay;
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    m[i] = b1 * m[i] + (T(1) - b1) * g[i];
    v[i] = b2 * v[i] + (T(1) - b2) * g[i] * g[i];
    p[i] -= decay * p[i];  // decoupled weight decay
    p[i] -= step_size * m[i] / (std::sqrt(v[i] * inv_bc2) + eps);
    if (rounded) rounded[i] = round_to_bf16(p[i]);
  }
}

}  // namespace moe::cpu
