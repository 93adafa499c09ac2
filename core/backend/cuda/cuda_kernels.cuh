// The CUDA backend's kernels: one per op of core/backend/ops.h that cuBLAS does not do, in fp32 or fp64 storage,
// accumulating in double where the CPU reference does (norms, softmax, cross-entropy, dot products). Reductions
// run in a fixed order (fixed block sizes and tree shapes; columns summed over rows by one thread in row order)
// so a run is reproducible on one GPU; they differ from the CPU's order, within the conformance bounds.
// Elementwise kernels use grid-stride loops (launch_config.h). No element pays a 64-bit division: a kernel over
// the elements of (rows, width) runs one block per row (MOE_ROW_STRIDE, rows looped past the grid; row_launch)
// with its threads over the row's columns, so a row's index is the loop's and per-row values are read once;
// flat grid-stride loops are kept for work whose index needs no split. What divisions remain are per row, or
// per (chunk, column) of a loop over many rows (RMSNorm's gain gradient).
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "core/backend/cuda/sum_segments_plan.h"
#include "core/dtype.h"
#include "core/moe/gate_weights.h"
#include "core/philox.h"

namespace moe::cuda {

constexpr double kRmsEps = 1e-5;       // as the CPU backend
constexpr double kRopeBase = 10000.0;  // as the CPU backend

#define MOE_GRID_STRIDE(i, n) \
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < (n); i += int64_t(gridDim.x) * blockDim.x)
#define MOE_ROW_STRIDE(row, rows) for (int64_t row = blockIdx.x; row < (rows); row += gridDim.x)

// The sum of every thread's `value` in the block, in a fixed tree order, returned to every thread.
// blockDim.x a power of two <= 256; `shared` holds blockDim.x doubles.
__device__ inline double block_sum(double value, double* shared) {
  shared[threadIdx.x] = value;
  __syncthreads();
  for (unsigned width = blockDim.x / 2; width > 0; width /= 2) {
    if (threadIdx.x < width) shared[threadIdx.x] += shared[threadIdx.x + width];
    __syncthreads();
  }
  const double total = shared[0];
  __syncthreads();
  return total;
}
__device__ inline double block_max(double value, double* shared) {
  shared[threadIdx.x] = value;
  __syncthreads();
  for (unsigned width = blockDim.x / 2; width > 0; width /= 2) {
    if (threadIdx.x < width) shared[threadIdx.x] = fmax(shared[threadIdx.x], shared[threadIdx.x + width]);
    __syncthreads();
  }
  const double top = shared[0];
  __syncthreads();
  return top;
}

// ---- embedding ---------------------------------------------------------------------------------------

template <typename T>
__global__ void embedding_forward_kernel(const int32_t* tokens, const T* table, int64_t first, int64_t rows, T* out,
                                         int64_t N, int64_t D) {
  MOE_ROW_STRIDE(i, N) {
    const int64_t row = int64_t(tokens[i]) - first;
    const bool inside = row >= 0 && row < rows;
    for (int64_t d = threadIdx.x; d < D; d += blockDim.x) out[i * D + d] = inside ? table[row * D + d] : T(0);
  }
}

// ---- RMSNorm -----------------------------------------------------------------------------------------

template <typename T>
__global__ void rmsnorm_forward_kernel(const T* x, const T* gain, T* y, T* rstd, int64_t N, int64_t D) {
  extern __shared__ double shared[];
  MOE_ROW_STRIDE(i, N) {
    const T* xi = x + i * D;
    double ss = 0;
    for (int64_t j = threadIdx.x; j < D; j += blockDim.x) ss += double(xi[j]) * double(xi[j]);
    ss = block_sum(ss, shared);
    const T r = T(1.0 / sqrt(ss / double(D) + kRmsEps));
    if (threadIdx.x == 0) rstd[i] = r;
    for (int64_t j = threadIdx.x; j < D; j += blockDim.x) y[i * D + j] = xi[j] * r * gain[j];
  }
}

// sum = x + r (r null: x) and y = RMSNorm(sum), as rmsnorm_forward_kernel on sum: each thread reads back the
// elements of sum it wrote itself.
template <typename T, bool kRounded = false>
__global__ void rmsnorm_forward_residual_kernel(const T* x, const T* r, T* sum, const T* gain, Stored<T, kRounded>* y,
                                                T* rstd, int64_t N, int64_t D) {
  extern __shared__ double shared[];
  MOE_ROW_STRIDE(i, N) {
    T* si = sum + i * D;
    double ss = 0;
    for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
      const T v = r ? T(x[i * D + j] + r[i * D + j]) : x[i * D + j];
      si[j] = v;
      ss += double(v) * double(v);
    }
    ss = block_sum(ss, shared);
    const T rs = T(1.0 / sqrt(ss / double(D) + kRmsEps));
    if (threadIdx.x == 0) rstd[i] = rs;
    for (int64_t j = threadIdx.x; j < D; j += blockDim.x) y[i * D + j] = stored<kRounded>(T(si[j] * rs * gain[j]));
  }
}

// dx written, or with kAdd added to dx after its rounding to T (rmsnorm_backward_add).
template <typename T, bool kAdd = false>
__global__ void rmsnorm_backward_dx_kernel(const T* x, const T* gain, const T* rstd, const T* dy, T* dx, int64_t N,
                                           int64_t D) {
  extern __shared__ double shared[];
  MOE_ROW_STRIDE(i, N) {
    const T* xi = x + i * D;
    const T* gi = dy + i * D;
    const double r = rstd[i];
    double dot = 0;
    for (int64_t j = threadIdx.x; j < D; j += blockDim.x) dot += double(gain[j]) * double(gi[j]) * double(xi[j]);
    dot = block_sum(dot, shared);
    const double c = r * r * r * dot / double(D);
    for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
      const T g = T(r * gain[j] * gi[j] - c * xi[j]);
      dx[i * D + j] = kAdd ? T(dx[i * D + j] + g) : g;
    }
  }
}

// The gain gradient in two passes of a fixed shape: partial[k][c] sums rows [k kChunk, (k + 1) kChunk) of
// column c in row order, then each column sums its chunks in order (the same sums whatever the device; one
// thread per column over all N rows left most of the GPU idle).
constexpr int64_t kDgainChunk = 256;
template <typename T>
__global__ void rmsnorm_dgain_partial_kernel(const T* x, const T* rstd, const T* dy, double* partial, int64_t N,
                                             int64_t D) {
  const int64_t chunks = (N + kDgainChunk - 1) / kDgainChunk;
  MOE_GRID_STRIDE(e, chunks * D) {
    const int64_t k = e / D, c = e % D, end = (k + 1) * kDgainChunk < N ? (k + 1) * kDgainChunk : N;
    double acc = 0;
    for (int64_t i = k * kDgainChunk; i < end; ++i)
      acc += double(dy[i * D + c]) * double(x[i * D + c]) * double(rstd[i]);
    partial[e] = acc;
  }
}
template <typename T>
__global__ void rmsnorm_dgain_total_kernel(const double* partial, int64_t chunks, T* dgain, int64_t D) {
  MOE_GRID_STRIDE(c, D) {
    double acc = 0;
    for (int64_t k = 0; k < chunks; ++k) acc += partial[k * D + c];
    dgain[c] += T(acc);
  }
}

// ---- rotary embedding, SwiGLU, elementwise -----------------------------------------------------------

// cos_sin: (T, Dh / 2, 2) of cos and sin of angle t * base^(-2i/Dh), made on the host as the CPU makes its
// table (so the same values), kept per shape by the backend. y = x rotated: in place (y = x), or held rounded.
template <typename T, bool kRounded = false>
__global__ void rope_kernel(const T* x, Stored<T, kRounded>* y, const T* cos_sin, int64_t B, int64_t T_, int64_t H,
                            int64_t Dh, bool inverse) {
  const int64_t pairs = Dh / 2;
  MOE_ROW_STRIDE(bth, B * T_ * H) {  // one head's vector of one position
    const int64_t t = (bth / H) % T_;
    const T* in = x + bth * Dh;
    Stored<T, kRounded>* out = y + bth * Dh;
    for (int64_t i = threadIdx.x; i < pairs; i += blockDim.x) {
      const T c = cos_sin[2 * (t * pairs + i)], sine = cos_sin[2 * (t * pairs + i) + 1];
      const T s = inverse ? -sine : sine;
      const T x0 = in[2 * i], x1 = in[2 * i + 1];
      out[2 * i] = stored<kRounded>(T(x0 * c - x1 * s));
      out[2 * i + 1] = stored<kRounded>(T(x0 * s + x1 * c));
    }
  }
}

// Grouped-query attention: head h*group + g of each row of y a copy of head h of x (kv_rows = N * Hkv rows of
// x's heads); one block per row of y's heads.
template <typename T>
__global__ void expand_heads_kernel(const T* x, T* y, int64_t kv_rows, int64_t group, int64_t Dh) {
  MOE_ROW_STRIDE(row, kv_rows * group) {  // row = (n Hkv + h) group + g
    const T* in = x + (row / group) * Dh;
    for (int64_t d = threadIdx.x; d < Dh; d += blockDim.x) y[row * Dh + d] = in[d];
  }
}

// Its backward: each head of dx the sum of its group's heads of dy, in the group's order (as the CPU sums).
template <typename T>
__global__ void expand_heads_backward_kernel(const T* dy, T* dx, int64_t kv_rows, int64_t group, int64_t Dh) {
  MOE_ROW_STRIDE(row, kv_rows) {
    const T* in = dy + row * group * Dh;
    for (int64_t d = threadIdx.x; d < Dh; d += blockDim.x) {
      T sum = in[d];
      for (int64_t g = 1; g < group; ++g) sum += in[g * Dh + d];
      dx[row * Dh + d] = sum;
    }
  }
}

// The gated unit, one block per row (MOE_ROW_STRIDE): row r of ab (rows, 2F) is [a | b], h (rows, F) = silu(a) * b.
template <typename T>
__global__ void swiglu_forward_kernel(const T* ab, T* h, int64_t rows, int64_t F) {
  MOE_ROW_STRIDE(r, rows) {
    const T *a = ab + r * 2 * F, *b = a + F;
    for (int64_t j = threadIdx.x; j < F; j += blockDim.x) {
      const T sig = T(1) / (T(1) + exp(-a[j]));
      h[r * F + j] = a[j] * sig * b[j];
    }
  }
}

// swiglu_forward_kernel on ab held rounded, h held rounded (the experts' kept tensors under bf16 GEMMs).
template <typename T>
__global__ void swiglu_forward_rounded_kernel(const Rounded<T>* ab, Rounded<T>* h, int64_t rows, int64_t F) {
  MOE_ROW_STRIDE(r, rows) {
    const Rounded<T>*a = ab + r * 2 * F, *b = a + F;
    for (int64_t j = threadIdx.x; j < F; j += blockDim.x) {
      const T av = from_rounded<T>(a[j]), bv = from_rounded<T>(b[j]);
      const T sig = T(1) / (T(1) + exp(-av));
      h[r * F + j] = to_rounded(T(av * sig * bv));
    }
  }
}

// swiglu_backward_kernel on ab held rounded, dab held rounded.
template <typename T>
__global__ void swiglu_backward_rounded_kernel(const Rounded<T>* ab, const T* dh, Rounded<T>* dab, int64_t rows,
                                               int64_t F) {
  MOE_ROW_STRIDE(r, rows) {
    const Rounded<T>*a = ab + r * 2 * F, *b = a + F;
    Rounded<T>*da = dab + r * 2 * F, *db = da + F;
    for (int64_t j = threadIdx.x; j < F; j += blockDim.x) {
      const T av = from_rounded<T>(a[j]), bv = from_rounded<T>(b[j]), g = dh[r * F + j];
      const T sig = T(1) / (T(1) + exp(-av));
      db[j] = to_rounded(T(g * av * sig));
      da[j] = to_rounded(T(g * bv * sig * (T(1) + av * (T(1) - sig))));
    }
  }
}

// out = x held rounded (Ops::round_values).
template <typename T>
__global__ void round_values_kernel(const T* x, Rounded<T>* out, int64_t n) {
  MOE_GRID_STRIDE(i, n) out[i] = to_rounded(x[i]);
}

// The gated unit's backward, one block per row: row r of dab (rows, 2F) is [da | db] of the row's a, b and dh.
template <typename T>
__global__ void swiglu_backward_kernel(const T* ab, const T* dh, T* dab, int64_t rows, int64_t F) {
  MOE_ROW_STRIDE(r, rows) {
    const T *a = ab + r * 2 * F, *b = a + F;
    T *da = dab + r * 2 * F, *db = da + F;
    for (int64_t j = threadIdx.x; j < F; j += blockDim.x) {
      const T sig = T(1) / (T(1) + exp(-a[j])), g = dh[r * F + j];
      db[j] = g * a[j] * sig;
      da[j] = g * b[j] * sig * (T(1) + a[j] * (T(1) - sig));
    }
  }
}

template <typename T>
__global__ void add_inplace_kernel(T* y, const T* x, int64_t n) {
  MOE_GRID_STRIDE(i, n) y[i] += x[i];
}
template <typename T>
__global__ void add_kernel(const T* a, const T* b, T* y, int64_t n) {
  MOE_GRID_STRIDE(i, n) y[i] = a[i] + b[i];
}
template <typename T>
__global__ void fill_kernel(T* y, T value, int64_t n) {
  MOE_GRID_STRIDE(i, n) y[i] = value;
}
template <typename T>
__global__ void scale_kernel(T* y, T factor, int64_t n) {
  MOE_GRID_STRIDE(i, n) y[i] *= factor;
}

// A bf16 GEMM's operand (GemmPrecision::Bf16): x rounded as core/dtype.h does on the CPU, stored as bf16 bits
// (fp32 storage) or as the value rounded to bf16 in T (fp64 storage: cuBLAS has no bf16 x bf16 -> fp64 GEMM, so
// the CPU's emulation).
template <typename T>
__device__ inline void store_rounded(T x, uint16_t* out) {
  *out = float_to_bf16(float(x)).bits;
}
template <typename T>
__device__ inline void store_rounded(T x, T* out) {
  *out = round_to_bf16(x);
}
// x (rows, cols, leading dimension ld) rounded, packed (leading dimension cols). Contiguous (ld == cols, the
// parameters' copy and most activations): one grid-stride loop. Otherwise one block per row, the threads over its
// columns: no 64-bit division per element.
template <typename T, typename R>
__global__ void round_contiguous_kernel(const T* x, int64_t n, R* out) {
  MOE_GRID_STRIDE(i, n) store_rounded(x[i], out + i);
}
template <typename T, typename R>
__global__ void round_rows_kernel(const T* x, int64_t rows, int64_t cols, int64_t ld, R* out) {
  MOE_ROW_STRIDE(r, rows) {
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) store_rounded(x[r * ld + c], out + r * cols + c);
  }
}
// bf16 bits back to the storage type (fused attention's outputs).
template <typename T>
__global__ void from_bf16_kernel(const uint16_t* x, T* out, int64_t n) {
  MOE_GRID_STRIDE(i, n) out[i] = T(bf16_to_float(bf16{x[i]}));
}

// Sums of squares of segments (sum_segments_plan.h), level 1: chunk c of all segments' chunks into partial[c],
// one block each, each thread its strided elements in order, then block_sum's fixed tree.
template <typename T>
__global__ void sum_squares_chunks_kernel(const T* base, const SumChunks* plan, int64_t count, double* partial,
                                          int64_t chunks) {
  extern __shared__ double shared[];
  MOE_ROW_STRIDE(c, chunks) {
    const SumChunks s = plan[segment_of_chunk(plan, count, c)];
    const T* x = base + s.offset;
    const int64_t begin = (c - s.first) * s.chunk, end = min(s.length, begin + s.chunk);
    double sum = 0;
    for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) sum += double(x[i]) * double(x[i]);
    sum = block_sum(sum, shared);
    if (threadIdx.x == 0) partial[c] = sum;
  }
}
// Level 2: segment s's partials (at most kMostPartials) summed by one block of a fixed width, each thread its
// strided values in order, then block_sum's fixed tree; an empty segment's sum is 0.
__global__ inline void sum_segment_partials_kernel(const double* partial, const SumChunks* plan, int64_t count,
                                                   double* out) {
  extern __shared__ double shared[];
  MOE_ROW_STRIDE(s, count) {
    const int64_t end = plan[s + 1].first;
    double sum = 0;
    for (int64_t i = plan[s].first + threadIdx.x; i < end; i += blockDim.x) sum += partial[i];
    sum = block_sum(sum, shared);
    if (threadIdx.x == 0) out[s] = sum;
  }
}

// ---- attention (the plain reference; cuDNN's fused attention is to be tested against it) ---------------

// Row r of the (rows, T) score blocks: query position i = r % T; columns past i are masked to zero.
template <typename T>
__global__ void causal_softmax_kernel(T* P, int64_t rows, int64_t T_) {
  extern __shared__ double shared[];
  MOE_ROW_STRIDE(r, rows) {
    T* row = P + r * T_;
    const int64_t i = r % T_;
    double m = -INFINITY;
    for (int64_t j = threadIdx.x; j <= i; j += blockDim.x) m = fmax(m, double(row[j]));
    m = block_max(m, shared);
    double s = 0;
    for (int64_t j = threadIdx.x; j <= i; j += blockDim.x) s += exp(double(row[j]) - m);
    s = block_sum(s, shared);
    for (int64_t j = threadIdx.x; j < T_; j += blockDim.x) row[j] = j <= i ? T(exp(double(row[j]) - m) / s) : T(0);
  }
}

// dS = P * (dP - rowsum(P * dP)) * scale, in place on dP (one (T, T) block).
template <typename T>
__global__ void softmax_backward_kernel(const T* P, T* dS, int64_t T_, double scale) {
  extern __shared__ double shared[];
  MOE_ROW_STRIDE(i, T_) {
    const T* p = P + i * T_;
    T* d = dS + i * T_;
    double dot = 0;
    for (int64_t j = threadIdx.x; j <= i; j += blockDim.x) dot += double(p[j]) * double(d[j]);
    dot = block_sum(dot, shared);
    for (int64_t j = threadIdx.x; j < T_; j += blockDim.x)
      d[j] = j <= i ? T(double(p[j]) * (double(d[j]) - dot) * scale) : T(0);
  }
}

// ---- cross-entropy -----------------------------------------------------------------------------------

template <typename T>
__device__ inline double row_log_sum_exp(const T* z, int64_t V, double* shared) {
  double m = -INFINITY;
  for (int64_t j = threadIdx.x; j < V; j += blockDim.x) m = fmax(m, double(z[j]));
  m = block_max(m, shared);
  double s = 0;
  for (int64_t j = threadIdx.x; j < V; j += blockDim.x) s += exp(double(z[j]) - m);
  return m + log(block_sum(s, shared));
}

// A target outside [0, V) gives a NaN loss (the host checks tokens against the vocabulary when it loads them).
template <typename T>
__global__ void cross_entropy_forward_kernel(const T* logits, const int32_t* targets, T* losses, int64_t N, int64_t V) {
  extern __shared__ double shared[];
  MOE_ROW_STRIDE(i, N) {
    const double lse = row_log_sum_exp(logits + i * V, V, shared);
    const int32_t t = targets[i];
    if (threadIdx.x == 0) losses[i] = t >= 0 && t < V ? T(lse - double(logits[i * V + t])) : T(NAN);
  }
}

template <typename T, bool kRounded = false>
__global__ void cross_entropy_backward_kernel(const T* logits, const int32_t* targets, T scale,
                                              Stored<T, kRounded>* dlogits, int64_t N, int64_t V) {
  extern __shared__ double shared[];
  MOE_ROW_STRIDE(i, N) {
    const T* z = logits + i * V;
    const double lse = row_log_sum_exp(z, V, shared);
    for (int64_t j = threadIdx.x; j < V; j += blockDim.x) {
      const T d = T(exp(double(z[j]) - lse) * double(scale));
      dlogits[i * V + j] = stored<kRounded>(j == targets[i] ? T(d - scale) : d);
    }
  }
}

// Vocabulary-parallel cross-entropy's parts over this rank's block (ops.h logits_row_max ...): one block per row.
template <typename T>
__global__ void logits_row_max_kernel(const T* logits, int64_t N, int64_t V, double* row_max) {
  extern __shared__ double shared[];
  MOE_ROW_STRIDE(i, N) {
    double m = -INFINITY;
    for (int64_t j = threadIdx.x; j < V; j += blockDim.x) m = fmax(m, double(logits[i * V + j]));
    m = block_max(m, shared);
    if (threadIdx.x == 0) row_max[i] = m;
  }
}

template <typename T>
__global__ void logits_sum_exp_kernel(const T* logits, const int32_t* targets, int64_t first, const double* row_max,
                                      double* sums, int64_t N, int64_t V) {
  extern __shared__ double shared[];
  MOE_ROW_STRIDE(i, N) {
    double s = 0;
    for (int64_t j = threadIdx.x; j < V; j += blockDim.x) s += exp(double(logits[i * V + j]) - row_max[i]);
    s = block_sum(s, shared);
    if (threadIdx.x == 0) {
      const int64_t t = int64_t(targets[i]) - first;
      sums[i] = s;
      sums[N + i] = t >= 0 && t < V ? double(logits[i * V + t]) : 0.0;
    }
  }
}

// The blocks' maxima in rank order, one thread per row (exact in any order). A template (of double) as the header's
// other kernels, so that every file that includes it may instantiate it.
template <typename D>
__global__ void logits_max_over_blocks_kernel(const D* block_max, D* row_max, int64_t P, int64_t N) {
  MOE_GRID_STRIDE(n, N) {
    D m = block_max[n];
    for (int64_t r = 1; r < P; ++r) m = fmax(m, block_max[r * N + n]);
    row_max[n] = m;
  }
}

template <typename T>
__global__ void logits_loss_finish_kernel(const double* row_max, const double* sums, T* lse, T* losses, int64_t N) {
  MOE_GRID_STRIDE(n, N) {
    const double l = row_max[n] + log(sums[n]);
    lse[n] = T(l), losses[n] = T(l - sums[N + n]);
  }
}

template <typename T, bool kRounded = false>
__global__ void logits_softmax_backward_kernel(const T* logits, const int32_t* targets, int64_t first, const T* lse,
                                               T scale, Stored<T, kRounded>* dlogits, int64_t N, int64_t V) {
  MOE_ROW_STRIDE(i, N) {
    const double row_lse = double(lse[i]);
    const int64_t target = int64_t(targets[i]) - first;
    for (int64_t j = threadIdx.x; j < V; j += blockDim.x) {
      const int64_t k = i * V + j;
      const T d = T(exp(double(logits[k]) - row_lse) * double(scale));
      dlogits[k] = stored<kRounded>(j == target ? T(d - scale) : d);
    }
  }
}

// ---- the router --------------------------------------------------------------------------------------

// The CPU's RngStream::gumbel at (step, first_counter + i): the same Philox bits, -log(-log(u)) in double.
__global__ inline void gumbel_noise_kernel(uint64_t key, uint64_t step, uint64_t first_counter, double* out,
                                           int64_t n) {
  MOE_GRID_STRIDE(i, n) {
    uint32_t r[4];
    philox_block(key, step, first_counter + uint64_t(i), r);
    out[i] = -log(-log(philox_uniform53(r)));
  }
}

// One thread per row (E is the number of experts: small): (z + noise) / tau in double, then the scores.
template <typename T>
__global__ void softmax_rows_kernel(const T* z, const double* noise, double tau, T* p, int64_t N, int64_t E) {
  MOE_GRID_STRIDE(n, N) {
    auto scaled = [&](int64_t e) { return (double(z[n * E + e]) + (noise ? noise[n * E + e] : 0.0)) / tau; };
    double m = -INFINITY, sum = 0;
    for (int64_t e = 0; e < E; ++e) m = fmax(m, scaled(e));
    for (int64_t e = 0; e < E; ++e) sum += exp(scaled(e) - m);
    for (int64_t e = 0; e < E; ++e) p[n * E + e] = T(exp(scaled(e) - m) / sum);
  }
}

template <typename T>
__global__ void sigmoid_rows_kernel(const T* z, const double* noise, double tau, T* p, int64_t N, int64_t E) {
  MOE_GRID_STRIDE(i, N * E) {
    const double v = (double(z[i]) + (noise ? noise[i] : 0.0)) / tau;
    p[i] = T(1.0 / (1.0 + exp(-v)));
  }
}

// The K best columns of a row under the CPU's strict order (key descending, then column ascending), by K
// passes of selection: exactly what its partial sort selects.
template <typename T>
__global__ void topk_rows_kernel(const T* p, const float* bias, const uint8_t* mask, int32_t* index, int64_t N,
                                 int64_t E, int64_t K) {
  MOE_GRID_STRIDE(n, N) {
    const T* row = p + n * E;
    int32_t* out = index + n * K;
    double last_key = INFINITY;
    int32_t last = -1;
    for (int64_t j = 0; j < K; ++j) {
      int32_t best = -1;
      double best_key = -INFINITY;
      for (int32_t e = 0; e < int32_t(E); ++e) {
        if (mask && mask[e]) continue;
        const double key = double(row[e]) + (bias ? double(bias[e]) : 0.0);
        // Strictly after the last chosen in the order, and before the best so far.
        const bool after_last = key < last_key || (key == last_key && e > last);
        if (after_last && (best < 0 || key > best_key)) best = e, best_key = key;
      }
      out[j] = best;
      if (best >= 0) last = best, last_key = best_key;
    }
  }
}

// ---- row moves ---------------------------------------------------------------------------------------

template <typename T>
__global__ void gather_rows_kernel(const T* src, const int32_t* index, const T* scale, T* dst, int64_t rows,
                                   int64_t D) {
  MOE_ROW_STRIDE(r, rows) {
    const int32_t from = index[r];
    for (int64_t d = threadIdx.x; d < D; d += blockDim.x)
      dst[r * D + d] = from < 0 ? T(0) : (scale ? scale[r] * src[int64_t(from) * D + d] : src[int64_t(from) * D + d]);
  }
}

template <typename T>
__global__ void gather_rows_rounded_kernel(const T* src, const int32_t* index, Rounded<T>* dst, int64_t rows,
                                           int64_t D) {
  MOE_ROW_STRIDE(r, rows) {
    const int32_t from = index[r];
    for (int64_t d = threadIdx.x; d < D; d += blockDim.x)
      dst[r * D + d] = to_rounded(from < 0 ? T(0) : src[int64_t(from) * D + d]);
  }
}

// One thread per column, rows in order (the CPU's order of additions into a shared destination).
// ---- Scatter-adds in row order (scatter_add_rows, embedding_backward) ------------------------------------
// The rows are sorted stably by destination (cub::DeviceRadixSort of (destination, row)), so each destination's
// rows are a run of the sorted order, in row order; one thread per (run, column) adds them in that order, as the
// CPU does. A row with no destination has the key kNoDestination and sorts last.
constexpr int32_t kNoDestination = 0x7fffffff;

// keys[r] = index[r], or kNoDestination when negative; rows_out[r] = r.
__global__ inline void scatter_keys_kernel(const int32_t* index, int32_t* keys, int32_t* rows_out, int64_t rows) {
  MOE_GRID_STRIDE(r, rows) {
    keys[r] = index[r] < 0 ? kNoDestination : index[r];
    rows_out[r] = int32_t(r);
  }
}
// keys[i] = tokens[i] - first for a token inside the table's block [first, first + block), else kNoDestination.
__global__ inline void embedding_keys_kernel(const int32_t* tokens, int64_t first, int64_t block, int32_t* keys,
                                             int32_t* rows_out, int64_t N) {
  MOE_GRID_STRIDE(i, N) {
    const int64_t row = int64_t(tokens[i]) - first;
    keys[i] = row >= 0 && row < block ? int32_t(row) : kNoDestination;
    rows_out[i] = int32_t(i);
  }
}
// For each start of a run of equal keys in the sorted order and each column: dst[key] += scale[r] src[r] over
// the run's rows r, in order.
template <typename T>
__global__ void sorted_scatter_add_kernel(const T* src, const int32_t* keys, const int32_t* sorted_rows, const T* scale,
                                          T* dst, int64_t rows, int64_t D) {
  MOE_ROW_STRIDE(i, rows) {
    const int32_t key = keys[i];
    if (key == kNoDestination || (i > 0 && keys[i - 1] == key)) continue;
    for (int64_t c = threadIdx.x; c < D; c += blockDim.x) {
      T out = dst[int64_t(key) * D + c];
      for (int64_t j = i; j < rows && keys[j] == key; ++j) {
        const int64_t r = sorted_rows[j];
        out += scale ? scale[r] * src[r * D + c] : src[r * D + c];
      }
      dst[int64_t(key) * D + c] = out;
    }
  }
}

template <typename T>
__global__ void combine_rows_kernel(const T* src, const int32_t* index, const T* weight, T* dst, int64_t N, int64_t K,
                                    int64_t D, bool accumulate) {
  MOE_ROW_STRIDE(n, N) {
    for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
      T acc = accumulate ? dst[n * D + d] : T(0);
      for (int64_t j = 0; j < K; ++j) {
        const int32_t from = index[n * K + j];
        if (from < 0) continue;
        acc += weight ? weight[n * K + j] * src[int64_t(from) * D + d] : src[int64_t(from) * D + d];
      }
      dst[n * D + d] = acc;
    }
  }
}

template <typename T>
__global__ void row_dots_kernel(const T* a, const int32_t* index, const T* b, T* out, int64_t rows, int64_t D) {
  extern __shared__ double shared[];
  MOE_ROW_STRIDE(r, rows) {
    const T* x = a + int64_t(index[r]) * D;
    const T* y = b + r * D;
    double dot = 0;
    for (int64_t d = threadIdx.x; d < D; d += blockDim.x) dot += double(x[d]) * double(y[d]);
    dot = block_sum(dot, shared);
    if (threadIdx.x == 0) out[r] = T(dot);
  }
}

// ---- the router's backward ---------------------------------------------------------------------------
// One thread per token row, each row in the CPU reference's order (core/backend/cpu/router_kernels.h); only the
// device's exp and log differ from the host's.

template <typename T>
__global__ void gate_backward_kernel(const T* gate, const int32_t* selected, const T* dw, const T* denom,
                                     const uint8_t* clamped, bool renormalised, T* dp, int64_t N, int64_t K,
                                     int64_t E) {
  MOE_GRID_STRIDE(n, N) {
    double g = 0;
    if (renormalised && !clamped[n])
      for (int64_t j = 0; j < K; ++j) g += double(dw[n * K + j]) * double(gate[n * K + j]);
    for (int64_t j = 0; j < K; ++j) {
      const int32_t e = selected[n * K + j];
      if (e < 0) continue;
      const double d = double(dw[n * K + j]);
      dp[n * E + e] += T((renormalised ? d - g : d) / double(denom[n]));
    }
  }
}

// P_e = sum over rows of p[n, e] / N, rows in order: one thread per column.
template <typename T>
__global__ void column_means_kernel(const T* p, double* P, int64_t N, int64_t E) {
  const double inv_n = 1.0 / double(N);
  MOE_GRID_STRIDE(e, E) {
    double s = 0;
    for (int64_t n = 0; n < N; ++n) s += double(p[n * E + e]) * inv_n;
    P[e] = s;
  }
}

// kRouterMinLogArg: the router's floor (core/moe/gate_weights.h), the CPU reference's too.

template <typename T>
__global__ void router_loss_backward_kernel(const T* logits, const T* scores, const T* f, const double* P, double scale,
                                            double coef_aux, double coef_z, double coef_entropy, double coef_death,
                                            double death_floor, double coef_warmup, bool warming, T* dp, T* dz,
                                            int64_t N, int64_t E) {
  const double inv_n = 1.0 / double(N);
  double S = 0;
  if (warming)
    for (int64_t e = 0; e < E; ++e) S += P[e];
  MOE_GRID_STRIDE(n, N) {
    const T* z = logits + n * E;
    const T* p = scores + n * E;
    double m = -INFINITY, sum = 0;
    for (int64_t e = 0; e < E; ++e) m = fmax(m, double(z[e]));
    for (int64_t e = 0; e < E; ++e) sum += exp(double(z[e]) - m);
    const double lse = m + log(sum);
    for (int64_t e = 0; e < E; ++e) {
      double g = coef_aux * double(E) * double(f[e]) * inv_n;
      g += coef_entropy * inv_n * (log(fmax(double(p[e]), kRouterMinLogArg)) + 1.0);
      if (P[e] < death_floor) g -= coef_death * inv_n;
      if (warming) g += coef_warmup * inv_n * (1.0 / S - 1.0 / (double(E) * fmax(P[e], kRouterMinLogArg)));
      dp[n * E + e] += T(scale * g);
      dz[n * E + e] += T(scale * coef_z * 2.0 * lse * exp(double(z[e]) - lse) * inv_n);
    }
  }
}

// ---- the router's forward after the scores (the CPU reference: core/backend/cpu/router_kernels.h) -----------

// One thread per token: the selected experts, their scores and gate weights (core/moe/gate_weights.h).
template <typename T>
__global__ void gate_weights_kernel(const T* scores, const int32_t* preference, int64_t W, bool renormalised,
                                    int32_t* selected, T* selected_score, T* gate, T* denom, uint8_t* clamped,
                                    int64_t N, int64_t E, int64_t K) {
  MOE_GRID_STRIDE(n, N) {
    token_gate_weights(scores + n * E, preference + n * W, renormalised, selected + n * K, selected_score + n * K,
                       gate + n * K, denom + n, clamped + n, K);
  }
}

// One thread per expert: its entries of top counted (exact), then the share.
template <typename T>
__global__ void expert_fractions_kernel(const int32_t* top, T* f, int64_t N, int64_t K, int64_t E) {
  MOE_GRID_STRIDE(e, E) {
    T count = 0;
    for (int64_t i = 0; i < N * K; ++i)
      if (top[i] == e) count += T(1);
    f[e] = count / T(double(N * K));
  }
}

// ---- The dispatch plan (Ops::capacity_keep, Ops::permute_by_expert): keys for CUB's stable radix sorts ----------

__global__ inline void iota_kernel(int32_t* out, int64_t n) { MOE_GRID_STRIDE(i, n) out[i] = int32_t(i); }

// The unsigned key whose ascending order is the scores' descending order (+0 and -0 one key, as they compare
// equal on the host), so that a stable sort of slots in slot order puts ties in slot order.
template <typename T>
using ScoreKey = std::conditional_t<sizeof(T) == 4, uint32_t, uint64_t>;
template <typename T>
__global__ void descending_score_keys_kernel(const T* score, ScoreKey<T>* key, int64_t n) {
  using U = ScoreKey<T>;
  constexpr U sign = U(1) << (8 * sizeof(U) - 1);
  MOE_GRID_STRIDE(i, n) {
    T x = score[i];
    if (x == T(0)) x = T(0);
    U u;
    memcpy(&u, &x, sizeof(U));
    u = (u & sign) ? ~u : (u | sign);  // ascending order of the values
    key[i] = ~u;
  }
}

// key[i] = the expert of slot[i] (slot null: of slot i), E where it has none (after every expert).
__global__ inline void expert_keys_kernel(const int32_t* expert, const int32_t* slot, int32_t* key, int64_t n,
                                          int64_t E) {
  MOE_GRID_STRIDE(i, n) {
    const int32_t e = expert[slot ? slot[i] : i];
    key[i] = e < 0 ? int32_t(E) : e;
  }
}

// start[e] for e <= E: the first position of key e in the sorted keys (n of them), by binary search.
__global__ inline void key_starts_kernel(const int32_t* sorted_key, int64_t n, int64_t* start, int64_t E) {
  MOE_GRID_STRIDE(e, E + 1) {
    int64_t lo = 0, hi = n;
    while (lo < hi) {
      const int64_t mid = lo + (hi - lo) / 2;
      if (sorted_key[mid] < e)
        lo = mid + 1;
      else
        hi = mid;
    }
    start[e] = lo;
  }
}

// The slots sorted by (expert, priority): a slot keeps its expert when its place in the expert's run is below
// the capacity.
__global__ inline void capacity_keep_kernel(const int32_t* sorted_key, const int32_t* sorted_slot, const int64_t* start,
                                            int64_t capacity, int32_t* assigned, int64_t n, int64_t E) {
  MOE_GRID_STRIDE(i, n) {
    const int32_t e = sorted_key[i];
    assigned[sorted_slot[i]] = e < E && i - start[e] < capacity ? e : -1;
  }
}

// The slots sorted by assigned expert (E: none, last): the rows and their inverse.
__global__ inline void permutation_kernel(const int32_t* sorted_key, const int32_t* sorted_slot, int32_t* perm_slot,
                                          int32_t* row_of_slot, int64_t n, int64_t E) {
  MOE_GRID_STRIDE(i, n) {
    const bool row = sorted_key[i] < E;
    perm_slot[i] = row ? sorted_slot[i] : -1;
    row_of_slot[sorted_slot[i]] = row ? int32_t(i) : -1;
  }
}

// The router losses' sums, each in row order on one thread: threads e < E a column's sum of scores, thread E the
// squared log-sum-exps, thread E + 1 the entropies (a few thousand rows of E values; the CPU's order).
template <typename T>
__global__ void router_loss_sums_kernel(const T* logits, const T* scores, double* out, int64_t N, int64_t E) {
  MOE_GRID_STRIDE(i, E + 2) {
    double sum = 0;
    for (int64_t n = 0; n < N; ++n) {
      const T *z = logits + n * E, *p = scores + n * E;
      if (i < E) {
        sum += double(p[i]);
      } else if (i == E) {
        double m = -INFINITY, s = 0;
        for (int64_t e = 0; e < E; ++e) m = fmax(m, double(z[e]));
        for (int64_t e = 0; e < E; ++e) s += exp(double(z[e]) - m);
        const double lse = m + log(s);
        sum += lse * lse;
      } else {
        double h = 0;
        for (int64_t e = 0; e < E; ++e) h -= double(p[e]) * log(fmax(double(p[e]), kRouterMinLogArg));
        sum += h;
      }
    }
    out[i] = sum;
  }
}

// Row n's term of the scores' backward at column e (the CPU's score_row_backward); dot: the row's sum p . dp.
template <typename T>
__device__ inline T score_term(const T* p, const T* g, double tau, bool sigmoid, double dot, int64_t e) {
  if (sigmoid) return T(double(g[e]) * p[e] * (1.0 - double(p[e])) / tau);
  return T(double(p[e]) * (double(g[e]) - dot) / tau);
}
template <typename T>
__device__ inline double score_dot(const T* p, const T* g, bool sigmoid, int64_t E) {
  double dot = 0;
  if (!sigmoid)
    for (int64_t e = 0; e < E; ++e) dot += double(p[e]) * g[e];
  return dot;
}

template <typename T>
__global__ void score_backward_kernel(const T* scores, const T* dp, double tau, bool sigmoid, T* dz, int64_t N,
                                      int64_t E) {
  MOE_GRID_STRIDE(n, N) {
    const T *p = scores + n * E, *g = dp + n * E;
    const double dot = score_dot(p, g, sigmoid, E);
    for (int64_t e = 0; e < E; ++e) dz[n * E + e] += score_term(p, g, tau, sigmoid, dot, e);
  }
}

// The learned temperature's gradient over the own rows, in row order on one thread (the CPU's sum; a few
// thousand rows of E values).
template <typename T>
__global__ void d_log_tau_kernel(const T* scores, const T* dp, double tau, bool sigmoid, const T* logits,
                                 const double* noise, int64_t own_first, int64_t own_count, double* out, int64_t E) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  double sum = 0;
  for (int64_t n = own_first; n < own_first + own_count; ++n) {
    const T *p = scores + n * E, *g = dp + n * E;
    const double dot = score_dot(p, g, sigmoid, E);
    for (int64_t e = 0; e < E; ++e)
      sum -= double(score_term(p, g, tau, sigmoid, dot, e)) *
             (double(logits[n * E + e]) + (noise ? noise[n * E + e] : 0.0));
  }
  *out = sum;
}

// ---- the optimizer -----------------------------------------------------------------------------------

// rounded: null, or the parameters' rounded copy at p (Ops::adamw_update), written in the same pass.
template <typename T, typename R>
__global__ void adamw_kernel(T* p, const T* g, T* m, T* v, int64_t n, T b1, T b2, T step_size, T inv_bc2, T eps,
                             T decay, R* rounded) {
  MOE_GRID_STRIDE(i, n) {
    m[i] = b1 * m[i] + (T(1) - b1) * g[i];
    v[i] = b2 * v[i] + (T(1) - b2) * g[i] * g[i];
    p[i] -= decay * p[i];
    p[i] -= step_size * m[i] / (sqrt(v[i] * inv_bc2) + eps);
    if (rounded) store_rounded(p[i], rounded + i);
  }
}

}  // namespace moe::cuda
