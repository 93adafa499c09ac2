// exp (and log) of many values at once through glibc's vector math library (libmvec), for the CPU's hot loops:
// the SwiGLU's float kernels, the double exponentials of attention's softmax and of the cross-entropy, and the
// router's losses on the host (core/moe/router.cpp). On x86-64 with AVX2: libmvec's 8-wide expf / 4-wide exp and
// log (_ZGVdN8v_expf, _ZGVdN4v_exp, _ZGVdN4v_log) and AVX2 arithmetic; on other x86-64 the SSE forms
// (_ZGVbN4v_expf, _ZGVbN2v_exp, _ZGVbN2v_log) and scalar arithmetic; elsewhere std::exp and std::log. libmvec's
// exp and log are within 4 ulp. Every value goes through the same vector call, the tail padded, so a value's result
// does not depend on where it sits in the array or on how threads split it: the same bits at any thread count (the bits
// may differ between CPUs, as OpenBLAS's kernels do). The AVX2 arithmetic is written without FMA, in the scalar form's
// order, so that only exp differs between the two x86-64 forms. Scalar expf was most of the SwiGLU's time
// (docs/bench.md "After the vectorised exponentials and the beta-0 GEMMs").
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
extern "C" __m128 _ZGVbN4v_expf(__m128 x);  // NOLINT: glibc's libmvec, the x86-64 vector function ABI names
extern "C" __attribute__((target("avx2"))) __m256 _ZGVdN8v_expf(__m256 x);   // NOLINT
extern "C" __m128d _ZGVbN2v_exp(__m128d x);                                  // NOLINT
extern "C" __attribute__((target("avx2"))) __m256d _ZGVdN4v_exp(__m256d x);  // NOLINT
extern "C" __m128d _ZGVbN2v_log(__m128d x);                                  // NOLINT
extern "C" __attribute__((target("avx2"))) __m256d _ZGVdN4v_log(__m256d x);  // NOLINT
#endif

namespace moe::cpu {

// The double functions taken many at a time (map_doubles).
enum class DoubleFn { Exp, Log };

#if defined(__x86_64__)
inline bool cpu_has_avx2() {
  static const bool has = __builtin_cpu_supports("avx2");
  return has;
}

// 8 floats from x[0, n) (n <= 8), zeros after; and back.
__attribute__((target("avx2"))) inline __m256 load_floats(const float* x, int64_t n) {
  if (n == 8) return _mm256_loadu_ps(x);
  alignas(32) float padded[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (int64_t j = 0; j < n; ++j) padded[j] = x[j];
  return _mm256_load_ps(padded);
}
__attribute__((target("avx2"))) inline void store_floats(__m256 v, float* y, int64_t n) {
  if (n == 8) return _mm256_storeu_ps(y, v);
  alignas(32) float out[8];
  _mm256_store_ps(out, v);
  for (int64_t j = 0; j < n; ++j) y[j] = out[j];
}

// sig = 1 / (1 + exp(-a)), 8 at a time.
__attribute__((target("avx2"))) inline __m256 sigmoid8(__m256 a) {
  const __m256 one = _mm256_set1_ps(1.0f);
  const __m256 e = _ZGVdN8v_expf(_mm256_sub_ps(_mm256_setzero_ps(), a));
  return _mm256_div_ps(one, _mm256_add_ps(one, e));
}

// h = a sig(a) b over n.
__attribute__((target("avx2"))) inline void swiglu_forward_avx2(const float* a, const float* b, float* h, int64_t n) {
  for (int64_t i = 0; i < n; i += 8) {
    const int64_t m = n - i < 8 ? n - i : 8;
    const __m256 x = load_floats(a + i, m), sig = sigmoid8(x);
    store_floats(_mm256_mul_ps(_mm256_mul_ps(x, sig), load_floats(b + i, m)), h + i, m);
  }
}

// db = dh silu(a), da = dh b sig (1 + a (1 - sig)) over n.
__attribute__((target("avx2"))) inline void swiglu_backward_avx2(const float* a, const float* b, const float* dh,
                                                                 float* da, float* db, int64_t n) {
  const __m256 one = _mm256_set1_ps(1.0f);
  for (int64_t i = 0; i < n; i += 8) {
    const int64_t m = n - i < 8 ? n - i : 8;
    const __m256 x = load_floats(a + i, m), y = load_floats(b + i, m), d = load_floats(dh + i, m);
    const __m256 sig = sigmoid8(x), silu = _mm256_mul_ps(x, sig);
    store_floats(_mm256_mul_ps(d, silu), db + i, m);
    const __m256 slope = _mm256_add_ps(one, _mm256_mul_ps(x, _mm256_sub_ps(one, sig)));
    store_floats(_mm256_mul_ps(_mm256_mul_ps(_mm256_mul_ps(d, y), sig), slope), da + i, m);
  }
}

__attribute__((target("avx2"))) inline __m256d four_doubles(DoubleFn f, __m256d x) {
  return f == DoubleFn::Exp ? _ZGVdN4v_exp(x) : _ZGVdN4v_log(x);
}
inline __m128d two_doubles(DoubleFn f, __m128d x) { return f == DoubleFn::Exp ? _ZGVbN2v_exp(x) : _ZGVbN2v_log(x); }

// out[i] = f(x[i]) for i < n, 4 at a time, the tail padded with ones.
__attribute__((target("avx2"))) inline void map_doubles_avx2(DoubleFn f, const double* x, double* out, int64_t n) {
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) _mm256_storeu_pd(out + i, four_doubles(f, _mm256_loadu_pd(x + i)));
  if (i == n) return;
  alignas(32) double in[4] = {1, 1, 1, 1}, result[4];
  for (int64_t j = i; j < n; ++j) in[j - i] = x[j];
  _mm256_store_pd(result, four_doubles(f, _mm256_load_pd(in)));
  for (int64_t j = i; j < n; ++j) out[j] = result[j - i];
}
#endif

// out[i] = f(x[i]) for i < n (out may be x): 4 at a time with AVX2, 2 with SSE, std::exp or std::log elsewhere.
inline void map_doubles(DoubleFn f, const double* x, double* out, int64_t n) {
#if defined(__x86_64__)
  if (cpu_has_avx2()) return map_doubles_avx2(f, x, out, n);
  int64_t i = 0;
  for (; i + 2 <= n; i += 2) _mm_storeu_pd(out + i, two_doubles(f, _mm_loadu_pd(x + i)));
  if (i < n) out[i] = _mm_cvtsd_f64(two_doubles(f, _mm_set_pd(1.0, x[i])));
#else
  for (int64_t i = 0; i < n; ++i) out[i] = f == DoubleFn::Exp ? std::exp(x[i]) : std::log(x[i]);
#endif
}

// out[i] = exp(x[i]) for i < n (out may be x).
inline void exp_doubles(const double* x, double* out, int64_t n) { map_doubles(DoubleFn::Exp, x, out, n); }
// out[i] = log(x[i]) for i < n (out may be x).
inline void log_doubles(const double* x, double* out, int64_t n) { map_doubles(DoubleFn::Log, x, out, n); }

// exp(x[j] - shift) in double for j < n, all at once, in a buffer of the calling thread that its next call
// overwrites: a softmax row's exponentials.
template <typename T>
const double* exp_shifted(const T* x, double shift, int64_t n) {
  thread_local std::vector<double> e;
  e.resize(size_t(n));
  for (int64_t j = 0; j < n; ++j) e[size_t(j)] = double(x[j]) - shift;
  exp_doubles(e.data(), e.data(), n);
  return e.data();
}

// log sum_j exp(x[j]) over j < n in double: the row's maximum, then its shifted exponentials (exp_shifted) summed in
// order. The cross-entropy's and the router's z-loss's statistic.
template <typename T>
double log_sum_exp(const T* x, int64_t n) {
  double m = -INFINITY, s = 0;
  for (int64_t j = 0; j < n; ++j) m = std::max(m, double(x[j]));
  const double* e = exp_shifted(x, m, n);
  for (int64_t j = 0; j < n; ++j) s += e[j];
  return m + std::log(s);
}

// out[i] = exp(-x[i]) for i < n: 4 at a time on x86-64.
inline void exp_of_negated_floats(const float* x, float* out, int64_t n) {
#if defined(__x86_64__)
  const __m128 minus = _mm_set1_ps(-1.0f);
  for (int64_t i = 0; i < n; i += 4) {
    float in[4] = {0, 0, 0, 0}, result[4];
    const int64_t m = n - i < 4 ? n - i : 4;
    for (int64_t j = 0; j < m; ++j) in[j] = x[i + j];
    _mm_storeu_ps(result, _ZGVbN4v_expf(_mm_mul_ps(minus, _mm_loadu_ps(in))));
    for (int64_t j = 0; j < m; ++j) out[i + j] = result[j];
  }
#else
  for (int64_t i = 0; i < n; ++i) out[i] = std::exp(-x[i]);
#endif
}

// f(i, sig) for i < n with sig = 1 / (1 + exp(-a[i])), the exponentials 4 at a time in blocks of 256.
template <typename F>
void for_each_sigmoid(const float* a, int64_t n, F&& f) {
  float e[256];
  for (int64_t first = 0; first < n; first += 256) {
    const int64_t m = n - first < 256 ? n - first : 256;
    exp_of_negated_floats(a + first, e, m);
    for (int64_t j = 0; j < m; ++j) f(first + j, 1.0f / (1.0f + e[j]));
  }
}

// The float SwiGLU without AVX2: the CpuOps<double> formulas, exp through exp_of_negated_floats.
inline void swiglu_forward_scalar(const float* a, const float* b, float* h, int64_t n) {
  for_each_sigmoid(a, n, [&](int64_t i, float sig) { h[i] = a[i] * sig * b[i]; });
}
inline void swiglu_backward_scalar(const float* a, const float* b, const float* dh, float* da, float* db, int64_t n) {
  for_each_sigmoid(a, n, [&](int64_t i, float sig) {
    const float silu = a[i] * sig;
    db[i] = dh[i] * silu;
    da[i] = dh[i] * b[i] * sig * (1.0f + a[i] * (1.0f - sig));
  });
}

// The float SwiGLU over n (n small: a block of one thread), in the CPU's best form.
inline void swiglu_forward_floats(const float* a, const float* b, float* h, int64_t n) {
#if defined(__x86_64__)
  if (cpu_has_avx2()) return swiglu_forward_avx2(a, b, h, n);
#endif
  swiglu_forward_scalar(a, b, h, n);
}
inline void swiglu_backward_floats(const float* a, const float* b, const float* dh, float* da, float* db, int64_t n) {
#if defined(__x86_64__)
  if (cpu_has_avx2()) return swiglu_backward_avx2(a, b, dh, da, db, n);
#endif
  swiglu_backward_scalar(a, b, dh, da, db, n);
}

}  // namespace moe::cpu
