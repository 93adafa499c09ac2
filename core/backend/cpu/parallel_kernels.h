// The CPU backend's coarse-grained parallel kernels: work that is many small GEMMs (the experts of a grouped
// GEMM, the heads of attention) is split among threads by whole GEMMs, each one a single-threaded BLAS call,
// instead of handing each small GEMM to all threads in turn. One parallel region per op instead of one per
// GEMM: fewer thread wake-ups (which cost most when another process shares the cores) and no small GEMM
// split between threads (which OpenBLAS does poorly).
//
// Determinism: every GEMM is the same list of single-threaded OpenBLAS calls at any thread count (blas_gemm
// below cuts a large one into blocks by its shape alone), and the threads only decide who makes which call; so
// nothing here, and no GEMM, depends on the thread count (test_core_cpu_threads, test_thread_counts).
#pragma once

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "core/backend/cpu/small_gemm.h"
#include "core/backend/cpu/vector_math.h"
#include "core/backend/ops.h"
#include "core/dtype.h"

namespace moe::cpu {

// ---- GEMM ------------------------------------------------------------------------------------------

// One OpenBLAS call. Callers make sure OpenBLAS runs it on one thread (see blas_gemm).
inline void blas_call(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
                      const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, int(M), int(N), int(K),
              alpha, A, int(lda), B, int(ldb), beta, C, int(ldc));
}
inline void blas_call(bool ta, bool tb, int64_t M, int64_t N, int64_t K, double alpha, const double* A, int64_t lda,
                      const double* B, int64_t ldb, double beta, double* C, int64_t ldc) {
  cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, int(M), int(N), int(K),
              alpha, A, int(lda), B, int(ldb), beta, C, int(ldc));
}

// Threads the op may use: 1 inside a parallel region (no nesting), else the backend's count. An op must not run
// inside an inactive region (an `if` clause that is false): omp_in_parallel() is false there, so its own regions
// would be nested teams (see run_groups).
inline int usable_threads() { return omp_in_parallel() ? 1 : omp_get_max_threads(); }

// Why OpenBLAS never threads a GEMM of ours. Its threaded level-3 driver (0.3.21, Debian 12's) gives other
// bits than its serial one in two ways:
// - a reduction longer than its K block GEMM_Q: level3_thread.c halves a K in (Q, 2Q) exactly, level3.c
//   rounds the half up to GEMM_UNROLL_M. Cutting K into blocks of at most the smallest Q would avoid this
//   one (Q is a param.h constant per target, set by kernel/setparam-ref.c; driver/others/parameter.c sizes
//   only P and R from the cache. Smallest sgemm/dgemm Q among the x86_64 targets of Debian's DYNAMIC_ARCH
//   build: 128, PRESCOTT and NANO's dgemm; arm64: 120, THUNDERX's dgemm);
// - the split of the output among threads: ceil(m / threads) rounded to GEMM_PREFERED_SIZE (1 on most
//   targets), so an element that a full micro-kernel tile computes at 1 thread can fall in an edge tile at 3,
//   and edge kernels need not round alike: SKYLAKEX's dgemm (16-wide kernel, partitions rounded to 8)
//   differs at 3 threads on 1024 x 1024 x 256, K blocked to 64 or not. Nothing on our side avoids this.
// So a GEMM is cut here into blocks of whole rows or columns of C, by its shape alone, and each block is one
// call OpenBLAS runs on one thread: inside our parallel region (OpenBLAS built on OpenMP runs one thread
// where omp_in_parallel()), at 1 thread, or below OpenBLAS's own threading threshold (M N K <= 65536 x
// GEMM_MULTITHREAD_THRESHOLD, 4 by default), where it does not thread either. The other ways through
// interface/gemm.c (0.3.21) are single-threaded and chosen before the thread count is read, from the shape,
// transposes, alpha and beta: the small-matrix kernels (SMALL_MATRIX_OPT, on in Debian's build) and
// SKYLAKEX's sgemm_direct. (OpenBLAS 0.3.28 forwards M or N == 1 to gemv, which threads by its own rule:
// a gemv-shaped call below the threshold would then need to be made inside a region too.)
constexpr int64_t kSerialGemmWork = int64_t(65536) * 4;  // M N K at or below which OpenBLAS does not thread
constexpr int64_t kGemmBlockWork = int64_t(1) << 23;     // M N K of a block at least, against the cost of a call
constexpr int64_t kGemmBlocksMax = 4;                    // blocks of one GEMM at most

// The blocks of one GEMM: `count` blocks of `width` rows of C (rows) or columns (!rows), the last one shorter.
struct GemmBlocks {
  bool rows = true;
  int64_t width = 0, count = 0;
};

// One block at or below the serial threshold; above it, 2 or 4 blocks (shared evenly by 2 or 4 threads) of at
// least kGemmBlockWork where the GEMM allows, cut along the longer side of C in multiples of 16 (whole tiles of
// the usual micro-kernels). Each block is a call of its own that repacks the whole other operand: that is what
// blocks cost at 1 thread (bench_moe --gemm-blocks), hence few of them. A function of the shape only.
inline GemmBlocks gemm_blocks(int64_t M, int64_t N, int64_t K) {
  GemmBlocks b;
  b.rows = M >= N;
  const int64_t side = b.rows ? M : N, work = M * N * K;
  int64_t count = 1;
  if (work > kSerialGemmWork) {
    count = 2;
    while (count < kGemmBlocksMax && work / (2 * count) >= kGemmBlockWork) count *= 2;
  }
  b.width = std::min(side, ((side + count - 1) / count + 15) / 16 * 16);
  b.count = b.width == 0 ? 0 : (side + b.width - 1) / b.width;
  return b;
}

// C (rows, cols, leading dimension ldc) = 0.
template <typename T>
void zero_block(T* C, int64_t rows, int64_t cols, int64_t ldc) {
  for (int64_t r = 0; r < rows; ++r) std::fill(C + r * ldc, C + r * ldc + cols, T(0));
}

// C = alpha op(A) op(B) + beta C, row-major, the same bits at any thread count (see above). With beta = 0 each
// block zeroes its part of C and OpenBLAS adds into it (beta = 1): OpenBLAS 0.3.21 would zero C first too, in
// its beta kernel, which on Zen took 6-25% of a GEMM at the model's shapes against 2-5% for the fill (0 + x is
// x, so the bits are the same but for the sign of a zero).
template <typename T>
void blas_gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, T alpha, const T* A, int64_t lda, const T* B,
               int64_t ldb, T beta, T* C, int64_t ldc) {
  const GemmBlocks b = gemm_blocks(M, N, K);
  const bool zero_first = beta == T(0);
  const auto block = [&](int64_t i) {
    const int64_t first = i * b.width, width = std::min(b.width, (b.rows ? M : N) - first);
    T* c = b.rows ? C + first * ldc : C + first;
    if (zero_first) zero_block(c, b.rows ? width : M, b.rows ? N : width, ldc);
    const T beta_call = zero_first ? T(1) : beta;
    if (b.rows)
      blas_call(ta, tb, width, N, K, alpha, ta ? A + first : A + first * lda, lda, B, ldb, beta_call, c, ldc);
    else
      blas_call(ta, tb, M, width, K, alpha, A, lda, tb ? B + first * ldb : B + first, ldb, beta_call, c, ldc);
  };
  if (M * N * K <= kSerialGemmWork || usable_threads() == 1) {
    for (int64_t i = 0; i < b.count; ++i) block(i);
    return;
  }
  // A region even for one block (a 1 x 1 C with a long K): inside it OpenBLAS takes one thread.
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t i = 0; i < b.count; ++i) block(i);
}

// ---- bf16 GEMM inputs (GemmPrecision::Bf16) ------------------------------------------------------------

// X (rows, cols, leading dimension ld) rounded to bf16, packed (leading dimension cols) into `buffer`.
// Split among threads when called outside a parallel region and large enough to pay for it.
template <typename T>
const T* rounded_to_bf16(const T* X, int64_t rows, int64_t cols, int64_t ld, std::vector<T>& buffer) {
  buffer.resize(size_t(rows * cols));
  T* out = buffer.data();
#pragma omp parallel for collapse(2) schedule(static) if (!omp_in_parallel() && rows * cols >= (int64_t(1) << 16))
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) out[r * cols + c] = round_to_bf16(X[r * ld + c]);
  return out;
}

// How a GEMM reads its operands: as stored (Fp32), or rounded to bf16 (Bf16), the operand the call names as a weight
// from `rounded`, the rounded copy of the parameters' memory [parameters, parameters + count)
// (Ops::set_parameter_memory), where there is one.
template <typename T>
struct GemmInputs {
  GemmPrecision precision = GemmPrecision::Fp32;
  GemmWeight weight = GemmWeight::None;
  const T* parameters = nullptr;
  int64_t count = 0;
  const T* rounded = nullptr;
  // The same inputs for a GEMM that names `w` as its weight.
  GemmInputs with_weight(GemmWeight w) const {
    GemmInputs in = *this;
    in.weight = w;
    return in;
  }
  // The rounded form of operand X (rows, cols, ld), `which` of the GEMM's: the parameters' copy at the same offset
  // and ld for the weight, or a packed copy in `buffer` (ld = cols).
  const T* operand(GemmWeight which, const T* X, int64_t rows, int64_t cols, int64_t& ld,
                   std::vector<T>& buffer) const {
    if (which == weight && rounded && X >= parameters && X < parameters + count) return rounded + (X - parameters);
    const T* packed = rounded_to_bf16(X, rows, cols, ld, buffer);
    ld = cols;
    return packed;
  }
};

// A GEMM on its operands as given: the small-group kernels (cpu/small_gemm.h, one thread) for a float expert group
// of at most kSmallGemmRows rows (group_rows; 0 for a GEMM that is not an expert group) where they run, otherwise
// blas_gemm. A function of the shape.
template <typename T>
void gemm_kernel(int64_t group_rows, bool ta, bool tb, int64_t M, int64_t N, int64_t K, T alpha, const T* A,
                 int64_t lda, const T* B, int64_t ldb, T beta, T* C, int64_t ldc) {
  if constexpr (std::is_same_v<T, float>)
    if (group_rows > 0 && group_rows <= kSmallGemmRows &&
        small_gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc))
      return;
  blas_gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

// A GEMM as `in` says: Fp32 reads its operands as stored; Bf16 runs it on operands rounded to bf16 (the products
// of two bf16 values are exact in fp32, so only the order of the fp32 sums is the kernel's). Rounded activations
// live in buffers of the calling thread, kept for its next call. group_rows: see gemm_kernel.
template <typename T>
void gemm_at(const GemmInputs<T>& in, bool ta, bool tb, int64_t M, int64_t N, int64_t K, T alpha, const T* A,
             int64_t lda, const T* B, int64_t ldb, T beta, T* C, int64_t ldc, int64_t group_rows = 0) {
  if (in.precision == GemmPrecision::Fp32)
    return gemm_kernel(group_rows, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  thread_local std::vector<T> a_buffer, b_buffer;
  const T* a = in.operand(GemmWeight::A, A, ta ? K : M, ta ? M : K, lda, a_buffer);
  const T* b = in.operand(GemmWeight::B, B, tb ? N : K, tb ? K : N, ldb, b_buffer);
  gemm_kernel(group_rows, ta, tb, M, N, K, alpha, a, lda, b, ldb, beta, C, ldc);
}

// An operand held rounded by its producer (bf16 bits; a bf16 GEMM): its values widened exactly to fp32 into `buffer`,
// packed (ld = cols). The GEMM on them is the GEMM of the operand they were rounded from.
inline const float* held_operand(const bf16* X, int64_t rows, int64_t cols, int64_t& ld, std::vector<float>& buffer) {
  buffer.resize(size_t(rows * cols));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) buffer[size_t(r * cols + c)] = bf16_to_float(X[r * ld + c]);
  ld = cols;
  return buffer.data();
}

// gemm_at with either operand held rounded (X = bf16; read as bf16 whatever in.precision says: the ops that take a
// rounded operand check that their GEMMs are bf16, outside any parallel region); fp32 storage only (fp64 holds the
// rounded values in its own type, which the plain form reads).
template <typename XA, typename XB>
requires(std::is_same_v<XA, bf16> ||
         std::is_same_v<XB, bf16>) void gemm_at(const GemmInputs<float>& in, bool ta, bool tb, int64_t M, int64_t N,
                                                int64_t K, float alpha, const XA* A, int64_t lda, const XB* B,
                                                int64_t ldb, float beta, float* C, int64_t ldc,
                                                int64_t group_rows = 0) {
  thread_local std::vector<float> a_buffer, b_buffer;
  const float* a = nullptr;
  const float* b = nullptr;
  if constexpr (std::is_same_v<XA, bf16>)
    a = held_operand(A, ta ? K : M, ta ? M : K, lda, a_buffer);
  else
    a = in.operand(GemmWeight::A, A, ta ? K : M, ta ? M : K, lda, a_buffer);
  if constexpr (std::is_same_v<XB, bf16>)
    b = held_operand(B, tb ? N : K, tb ? K : N, ldb, b_buffer);
  else
    b = in.operand(GemmWeight::B, B, tb ? N : K, tb ? K : N, ldb, b_buffer);
  gemm_kernel(group_rows, ta, tb, M, N, K, alpha, a, lda, b, ldb, beta, C, ldc);
}

// ---- Grouped GEMM (Ops::grouped_gemm) ----------------------------------------------------------------

// Group g of a grouped GEMM as one GEMM (see Ops::grouped_gemm for the operand layout).
template <typename T, typename X = T, typename Y = T>
void grouped_gemm_group(const GemmInputs<T>& p, bool trans_a, bool trans_b, int64_t g, const int64_t* row_offset,
                        int64_t N, int64_t K, T alpha, const X* A, const Y* B, T beta, T* C) {
  const int64_t r0 = row_offset[g], m = row_offset[g + 1] - r0;
  if (!trans_a)
    gemm_at(p, false, trans_b, m, N, K, alpha, A + r0 * K, K, B + g * K * N, trans_b ? K : N, beta, C + r0 * N, N, m);
  else
    gemm_at(p, true, false, K, N, m, alpha, A + r0 * K, K, B + r0 * N, N, beta, C + g * K * N, N, m);
}

// Group g's GEMM (trans_a false, beta 0) written held rounded (GroupedGemmArgs::C_rounded): the result in a buffer
// of the calling thread, rounded as it is stored.
template <typename T, typename X = T>
void grouped_gemm_group_rounded(const GemmInputs<T>& p, bool trans_b, int64_t g, const int64_t* row_offset, int64_t N,
                                int64_t K, T alpha, const X* A, const T* B, Rounded<T>* C) {
  const int64_t r0 = row_offset[g], m = row_offset[g + 1] - r0;
  thread_local std::vector<T> result;
  result.resize(size_t(m * N));
  gemm_at(p, false, trans_b, m, N, K, alpha, A + r0 * K, K, B + g * K * N, trans_b ? K : N, T(0), result.data(), N, m);
  for (int64_t i = 0; i < m * N; ++i) C[r0 * N + i] = to_rounded(result[size_t(i)]);
}

// f(g) for each group of `order`, one group per thread at a time, in that order. A lone group runs on the calling
// thread outside any region, so that its ops take every thread: a region whose `if` clause is false is inactive
// (omp_in_parallel() is false inside it), and each region an op opened there would be a nested team, made anew
// every time: a 40-row and a 24-row expert took 17 times as long as two of 32 rows.
template <typename F>
void run_groups(const std::vector<int64_t>& order, F&& f) {
  const int64_t count = int64_t(order.size());
  if (count == 1) return f(order[0]);
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t i = 0; i < count; ++i) f(order[size_t(i)]);
}

// How the groups of a grouped op run. `alone`: those too large to share, with more rows than an even share of the
// threads' work, one at a time on all threads, in index order. `shared`: the other non-empty ones, concurrently,
// one group per thread at a time, largest first (run_groups). A group of at most kSmallGemmRows rows always
// shares: its GEMMs run on one thread wherever it runs (the small-group kernels), so alone it would leave the
// other threads idle (a 40-row and a 24-row expert one after the other instead of side by side).
struct GroupSchedule {
  std::vector<int64_t> alone, shared;
};

inline GroupSchedule schedule_groups(int64_t groups, const int64_t* row_offset) {
  const int threads = usable_threads();
  const int64_t rows = row_offset[groups] - row_offset[0];
  GroupSchedule s;
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t m = row_offset[g + 1] - row_offset[g];
    const bool alone = threads == 1 || (m * threads > rows && m > kSmallGemmRows);
    if (m > 0) (alone ? s.alone : s.shared).push_back(g);
  }
  const auto size = [&](int64_t g) { return row_offset[g + 1] - row_offset[g]; };
  std::stable_sort(s.shared.begin(), s.shared.end(), [&](int64_t a, int64_t b) { return size(a) > size(b); });
  return s;
}

template <typename T, typename X = T, typename Y = T>
void grouped_gemm(const GemmInputs<T>& p, bool trans_a, bool trans_b, int64_t groups, const int64_t* row_offset,
                  int64_t N, int64_t K, T alpha, const X* A, const Y* B, T beta, T* C) {
  const GroupSchedule s = schedule_groups(groups, row_offset);
  for (int64_t g : s.alone) grouped_gemm_group(p, trans_a, trans_b, g, row_offset, N, K, alpha, A, B, beta, C);
  run_groups(s.shared,
             [&](int64_t g) { grouped_gemm_group(p, trans_a, trans_b, g, row_offset, N, K, alpha, A, B, beta, C); });
}

// grouped_gemm into C held rounded (trans_a false, beta 0).
template <typename T, typename X = T>
void grouped_gemm_rounded(const GemmInputs<T>& p, bool trans_b, int64_t groups, const int64_t* row_offset, int64_t N,
                          int64_t K, T alpha, const X* A, const T* B, Rounded<T>* C) {
  const GroupSchedule s = schedule_groups(groups, row_offset);
  for (int64_t g : s.alone) grouped_gemm_group_rounded(p, trans_b, g, row_offset, N, K, alpha, A, B, C);
  run_groups(s.shared, [&](int64_t g) { grouped_gemm_group_rounded(p, trans_b, g, row_offset, N, K, alpha, A, B, C); });
}

// ---- Causal attention (Ops::attention_forward / attention_backward) ---------------------------------

// Row i of P (T x T) to the causal softmax of its first i + 1 entries, zero after. Each exponential is taken
// once, all of a row's at once (cpu/vector_math.h), and kept in double in a buffer of the calling thread until
// the row is scaled. Returns the row's log-sum-exp (the fused form's statistic).
template <typename T>
double causal_softmax_row(T* row, int64_t i, int64_t T_) {
  double m = -INFINITY;
  for (int64_t j = 0; j <= i; ++j) m = std::max(m, double(row[j]));
  const double* e = exp_shifted(row, m, i + 1);
  double s = 0;
  for (int64_t j = 0; j <= i; ++j) s += e[j];
  const double inv = 1.0 / s;
  for (int64_t j = 0; j <= i; ++j) row[j] = T(e[j] * inv);
  for (int64_t j = i + 1; j < T_; ++j) row[j] = T(0);
  return m + std::log(s);
}

// Row i of dS = P * (dP - rowsum(P * dP)) * scale, in place on dP.
template <typename T>
void softmax_backward_row(const T* p, T* d, int64_t i, int64_t T_, T scale) {
  double dot = 0;
  for (int64_t j = 0; j <= i; ++j) dot += double(p[j]) * d[j];
  for (int64_t j = 0; j <= i; ++j) d[j] = T(double(p[j]) * (double(d[j]) - dot) * double(scale));
  for (int64_t j = i + 1; j < T_; ++j) d[j] = T(0);
}

// The shape of one attention call (Ops' own).
using AttentionShape = moe::AttentionShape;

// C = alpha op(A) op(B) (beta 0) as computed, or held rounded (kRounded: the result in a buffer of the calling
// thread, rounded as it is stored: attention's output held for its bf16 readers).
template <bool kRounded, typename T, typename XA, typename XB>
void gemm_into(const GemmInputs<T>& p, bool ta, bool tb, int64_t M, int64_t N, int64_t K, T alpha, const XA* A,
               int64_t lda, const XB* B, int64_t ldb, Stored<T, kRounded>* C, int64_t ldc) {
  if constexpr (!kRounded) {
    gemm_at(p, ta, tb, M, N, K, alpha, A, lda, B, ldb, T(0), C, ldc);
  } else {
    thread_local std::vector<T> result;
    result.resize(size_t(M * N));
    gemm_at(p, ta, tb, M, N, K, alpha, A, lda, B, ldb, T(0), result.data(), N);
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) C[i * ldc + j] = to_rounded(result[size_t(i * N + j)]);
  }
}

// One head's forward. rows_parallel: the softmax rows split among threads (when heads are not). X: q, k, v as stored
// or held rounded (Ops' attention args); out likewise (kRounded).
template <bool kRounded, typename T, typename X>
void attention_head_forward(const AttentionShape& s, int64_t bh, const X* q, const X* k, const X* v,
                            Stored<T, kRounded>* out, T* probs, bool rows_parallel) {
  const int64_t off = s.offset(bh), D = s.D(), T_ = s.T;
  T* P = probs + bh * T_ * T_;
  const GemmInputs<T> p{s.precision};
  gemm_at(p, false, true, T_, T_, s.Dh, T(s.scale()), q + off, D, k + off, D, T(0), P, T_);
#pragma omp parallel for schedule(static) if (rows_parallel)
  for (int64_t i = 0; i < T_; ++i) causal_softmax_row(P + i * T_, i, T_);
  gemm_into<kRounded>(p, false, false, T_, s.Dh, T_, T(1), P, T_, v + off, D, out + off, D);
}

// One head's backward; dS: (T, T) scratch of the calling thread.
template <typename T, typename X>
void attention_head_backward(const AttentionShape& s, int64_t bh, const X* q, const X* k, const X* v, const T* probs,
                             const T* dout, T* dq, T* dk, T* dv, T* dS, bool rows_parallel) {
  const int64_t off = s.offset(bh), D = s.D(), T_ = s.T, Dh = s.Dh;
  const T* P = probs + bh * T_ * T_;
  const GemmInputs<T> p{s.precision};
  gemm_at(p, false, true, T_, T_, Dh, T(1), dout + off, D, v + off, D, T(0), dS, T_);  // dP = dO V^T
  gemm_at(p, true, false, T_, Dh, T_, T(1), P, T_, dout + off, D, T(0), dv + off, D);  // dV = P^T dO
#pragma omp parallel for schedule(static) if (rows_parallel)
  for (int64_t i = 0; i < T_; ++i) softmax_backward_row(P + i * T_, dS + i * T_, i, T_, T(s.scale()));
  gemm_at(p, false, false, T_, Dh, T_, T(1), dS, T_, k + off, D, T(0), dq + off, D);  // dQ = dS K
  gemm_at(p, true, false, T_, Dh, T_, T(1), dS, T_, q + off, D, T(0), dk + off, D);   // dK = dS^T Q
}

// Heads run concurrently when there are enough of them to keep every thread busy; otherwise one head at
// a time with its GEMMs and softmax rows on all threads.
inline bool heads_in_parallel(const AttentionShape& s, int threads) { return threads > 1 && s.B * s.H >= 2 * threads; }

template <bool kRounded, typename T, typename X>
void attention_forward(const AttentionShape& s, const X* q, const X* k, const X* v, Stored<T, kRounded>* out,
                       T* probs) {
  const int threads = usable_threads();
  const int64_t heads = s.B * s.H;
  if (!heads_in_parallel(s, threads)) {
    for (int64_t bh = 0; bh < heads; ++bh) attention_head_forward<kRounded>(s, bh, q, k, v, out, probs, threads > 1);
    return;
  }
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t bh = 0; bh < heads; ++bh) attention_head_forward<kRounded>(s, bh, q, k, v, out, probs, false);
}

// scratch: (T, T) for the serial form; the concurrent form gives each thread its own.
template <typename T, typename X>
void attention_backward(const AttentionShape& s, const X* q, const X* k, const X* v, const T* probs, const T* dout,
                        T* dq, T* dk, T* dv, T* scratch) {
  const int threads = usable_threads();
  const int64_t heads = s.B * s.H;
  if (!heads_in_parallel(s, threads)) {
    for (int64_t bh = 0; bh < heads; ++bh)
      attention_head_backward(s, bh, q, k, v, probs, dout, dq, dk, dv, scratch, threads > 1);
    return;
  }
#pragma omp parallel
  {
    std::vector<T> dS(size_t(s.T * s.T));
#pragma omp for schedule(dynamic, 1)
    for (int64_t bh = 0; bh < heads; ++bh)
      attention_head_backward(s, bh, q, k, v, probs, dout, dq, dk, dv, dS.data(), false);
  }
}

}  // namespace moe::cpu
