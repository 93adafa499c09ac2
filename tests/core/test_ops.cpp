// The op conformance suite, dense ops: every op of every backend, in fp32 and fp64, against the CPU
// backend in double on odd and model-like shapes, with a normalised error bound derived from the dtype
// and the reduction length, and a NaN/Inf check. Data moves through the backends' buffers. A new
// backend adds a row to conformance::backends(). The MoE ops are in test_moe_ops.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <vector>

#include "tests/core/conformance.h"

namespace moe::conformance {
namespace {

template <typename T>
void gemm_cases(Backend& b) {
  Backend& r = reference();
  for (auto [M, N, K] : {std::array<int64_t, 3>{1, 1, 1}, {7, 13, 5}, {64, 96, 128}, {33, 1, 257}})
    for (bool ta : {false, true})
      for (bool tb : {false, true}) {
        const auto A = randn(M * K, "A"), B = randn(K * N, "B"), C = randn(M * N, "C");
        const int64_t lda = ta ? M : K, ldb = tb ? K : N;
        Buffer a = put<T>(b, A), bb = put<T>(b, B), c = put<T>(b, C);
        Buffer ra = put<double>(r, A), rb = put<double>(r, B), rc = put<double>(r, C);
        b.ops<T>().gemm({.trans_a = ta,
                         .trans_b = tb,
                         .M = M,
                         .N = N,
                         .K = K,
                         .alpha = T(0.5),
                         .A = a.data<T>(),
                         .lda = lda,
                         .B = bb.data<T>(),
                         .ldb = ldb,
                         .beta = T(0.25),
                         .C = c.data<T>(),
                         .ldc = N});
        r.ops<double>().gemm({.trans_a = ta,
                              .trans_b = tb,
                              .M = M,
                              .N = N,
                              .K = K,
                              .alpha = 0.5,
                              .A = ra.data<double>(),
                              .lda = lda,
                              .B = rb.data<double>(),
                              .ldb = ldb,
                              .beta = 0.25,
                              .C = rc.data<double>(),
                              .ldc = N});
        expect_close<T>("gemm", get<T>(b, c), get<double>(r, rc), K);
      }
}

TEST_P(Conformance, Gemm) {
  gemm_cases<float>(backend());
  gemm_cases<double>(backend());
}

template <typename T>
void norm_cases(Backend& b) {
  Backend& r = reference();
  Ops<T>& f = b.ops<T>();
  Ops<double>& d = r.ops<double>();
  const int64_t N = 37, D = 96;
  const auto X = randn(N * D, "x", 3.0), G = randn(D, "g"), DY = randn(N * D, "dy");
  Buffer x = put<T>(b, X), g = put<T>(b, G), dy = put<T>(b, DY), y = b.allocate(dtype_of<T>(), N * D),
         rstd = b.allocate(dtype_of<T>(), N), dx = b.allocate(dtype_of<T>(), N * D), dg = b.allocate(dtype_of<T>(), D);
  Buffer rx = put<double>(r, X), rg = put<double>(r, G), rdy = put<double>(r, DY), ry = r.allocate(DType::F64, N * D),
         rrstd = r.allocate(DType::F64, N), rdx = r.allocate(DType::F64, N * D), rdg = r.allocate(DType::F64, D);
  f.rmsnorm_forward(x.data<T>(), g.data<T>(), y.data<T>(), rstd.data<T>(), N, D);
  d.rmsnorm_forward(rx.data<double>(), rg.data<double>(), ry.data<double>(), rrstd.data<double>(), N, D);
  expect_close<T>("rmsnorm forward", get<T>(b, y), get<double>(r, ry), D);
  f.rmsnorm_backward(x.data<T>(), g.data<T>(), rstd.data<T>(), dy.data<T>(), dx.data<T>(), dg.data<T>(), N, D);
  d.rmsnorm_backward(rx.data<double>(), rg.data<double>(), rrstd.data<double>(), rdy.data<double>(), rdx.data<double>(),
                     rdg.data<double>(), N, D);
  expect_close<T>("rmsnorm backward dx", get<T>(b, dx), get<double>(r, rdx), D);
  expect_close<T>("rmsnorm backward dgain", get<T>(b, dg), get<double>(r, rdg), N);

  // SwiGLU over the N rows of x as [a | b] (F = D / 2 each), h into y; its backward over the first two rows, dh from
  // the gain.
  const int64_t F = D / 2;
  f.swiglu_forward(x.data<T>(), y.data<T>(), N, F);
  d.swiglu_forward(rx.data<double>(), ry.data<double>(), N, F);
  auto head = [](std::vector<double> v, int64_t n) { return v.resize(size_t(n)), v; };
  expect_close<T>("swiglu forward", head(get<T>(b, y), N * F), head(get<double>(r, ry), N * F), 1);
  Buffer dab = b.allocate(dtype_of<T>(), 2 * D), rdab = r.allocate(DType::F64, 2 * D);
  f.swiglu_backward(x.data<T>(), g.data<T>(), dab.data<T>(), 2, F);
  d.swiglu_backward(rx.data<double>(), rg.data<double>(), rdab.data<double>(), 2, F);
  expect_close<T>("swiglu backward [da | db]", get<T>(b, dab), get<double>(r, rdab), 1);

  // Rotary embedding over the first B*T*H*Dh values of x.
  const int64_t B = 2, T_ = 9, H = 3, Dh = 32, n = B * T_ * H * Dh;
  const std::vector<double> X0(X.begin(), X.begin() + n);
  Buffer q = put<T>(b, X0), rq = put<double>(r, X0);
  f.rope(q.data<T>(), B, T_, H, Dh, false);
  d.rope(rq.data<double>(), B, T_, H, Dh, false);
  expect_close<T>("rope", get<T>(b, q), get<double>(r, rq), 2);
  const double ss = d.sum_squares(rx.data<double>(), N * D);
  EXPECT_NEAR(f.sum_squares(x.data<T>(), N * D), ss, 8 * eps<T>() * ss);
  // Into backend memory: the same sum, bit for bit, where one download reads several of them.
  Buffer sums = b.allocate(DType::F64, 2);
  f.sum_squares_into(x.data<T>(), N * D, sums.data<double>());
  f.sum_squares_into(x.data<T>() + 1, D, sums.data<double>() + 1);
  const std::vector<double> into = b.download<double>(sums);
  EXPECT_EQ(into[0], f.sum_squares(x.data<T>(), N * D)) << "sum_squares_into";
  EXPECT_EQ(into[1], f.sum_squares(x.data<T>() + 1, D)) << "sum_squares_into at an offset";
}

// add_inplace, add, copy, fill and scale: one rounding each at most, so exact against the same arithmetic in T
// on the host.
template <typename T>
void elementwise_cases(Backend& b) {
  const int64_t n = 1001;
  const auto X = randn(n, "ex"), Y = randn(n, "ey");
  std::vector<double> sum(X.size()), scaled(X.size());
  for (size_t i = 0; i < X.size(); ++i) {
    sum[i] = double(T(X[i]) + T(Y[i]));
    scaled[i] = double(T(T(X[i]) + T(Y[i])) * T(-0.75));
  }
  Ops<T>& o = b.ops<T>();
  Buffer x = put<T>(b, X), y = put<T>(b, Y), z = b.allocate(dtype_of<T>(), n);
  o.add(x.data<T>(), y.data<T>(), z.data<T>(), n);
  EXPECT_EQ(get<T>(b, z), sum) << "add";
  o.add_inplace(y.data<T>(), x.data<T>(), n);
  EXPECT_EQ(get<T>(b, y), sum) << "add_inplace";
  o.scale(y.data<T>(), T(-0.75), n);
  EXPECT_EQ(get<T>(b, y), scaled) << "scale";
  o.copy(x.data<T>(), z.data<T>(), n);
  EXPECT_EQ(get<T>(b, z), get<T>(b, x)) << "copy";
  o.fill(z.data<T>() + 1, T(2.5), n - 2);
  const std::vector<double> filled = get<T>(b, z);
  EXPECT_EQ(filled.front(), double(T(X.front())));
  EXPECT_EQ(filled.back(), double(T(X.back())));
  for (int64_t i = 1; i < n - 1; ++i) ASSERT_EQ(filled[size_t(i)], 2.5) << "fill at " << i;
}

// The residual stream's fused norms: the same bits as the ops they replace on the same backend (an add or a copy and
// a norm; a norm's backward and an add_inplace), and within the bound of the double reference.
template <typename T>
void fused_norm_cases(Backend& b, int64_t N, int64_t D) {
  Backend& r = reference();
  Ops<T>& f = b.ops<T>();
  const auto X = randn(N * D, "fx", 3.0), R = randn(N * D, "fr"), G = randn(D, "fg"), DY = randn(N * D, "fdy"),
             DRES = randn(N * D, "fdres");
  const DType t = dtype_of<T>();
  Buffer x = put<T>(b, X), res = put<T>(b, R), g = put<T>(b, G), dy = put<T>(b, DY), sum = b.allocate(t, N * D),
         y = b.allocate(t, N * D), rstd = b.allocate(t, N), sum2 = b.allocate(t, N * D), y2 = b.allocate(t, N * D),
         rstd2 = b.allocate(t, N);
  for (const bool with_branch : {true, false}) {
    const T* branch = with_branch ? res.data<T>() : nullptr;
    f.rmsnorm_forward_residual(x.data<T>(), branch, sum.data<T>(), g.data<T>(), y.data<T>(), rstd.data<T>(), N, D);
    if (with_branch)
      f.add(x.data<T>(), res.data<T>(), sum2.data<T>(), N * D);
    else
      f.copy(x.data<T>(), sum2.data<T>(), N * D);
    f.rmsnorm_forward(sum2.data<T>(), g.data<T>(), y2.data<T>(), rstd2.data<T>(), N, D);
    const char* form = with_branch ? " (x + r)" : " (x alone)";
    EXPECT_EQ(get<T>(b, sum), get<T>(b, sum2)) << "rmsnorm_forward_residual sum" << form;
    EXPECT_EQ(get<T>(b, y), get<T>(b, y2)) << "rmsnorm_forward_residual y" << form;
    EXPECT_EQ(get<T>(b, rstd), get<T>(b, rstd2)) << "rmsnorm_forward_residual rstd" << form;
  }
  // With the branch, against double.
  f.rmsnorm_forward_residual(x.data<T>(), res.data<T>(), sum.data<T>(), g.data<T>(), y.data<T>(), rstd.data<T>(), N, D);
  Ops<double>& d = r.ops<double>();
  Buffer rx = put<double>(r, X), rr = put<double>(r, R), rg = put<double>(r, G), rsum = r.allocate(DType::F64, N * D),
         ry = r.allocate(DType::F64, N * D), rrstd = r.allocate(DType::F64, N);
  d.rmsnorm_forward_residual(rx.data<double>(), rr.data<double>(), rsum.data<double>(), rg.data<double>(),
                             ry.data<double>(), rrstd.data<double>(), N, D);
  expect_close<T>("rmsnorm_forward_residual y", get<T>(b, y), get<double>(r, ry), D);

  // Backward into the stream: dres += dx, dgain += as rmsnorm_backward.
  Buffer dres = put<T>(b, DRES), dres2 = put<T>(b, DRES), dx = b.allocate(t, N * D), dg = put<T>(b, G),
         dg2 = put<T>(b, G);
  f.rmsnorm_backward_add(sum.data<T>(), g.data<T>(), rstd.data<T>(), dy.data<T>(), dres.data<T>(), dg.data<T>(), N, D);
  f.rmsnorm_backward(sum.data<T>(), g.data<T>(), rstd.data<T>(), dy.data<T>(), dx.data<T>(), dg2.data<T>(), N, D);
  f.add_inplace(dres2.data<T>(), dx.data<T>(), N * D);
  EXPECT_EQ(get<T>(b, dres), get<T>(b, dres2)) << "rmsnorm_backward_add dres";
  EXPECT_EQ(get<T>(b, dg), get<T>(b, dg2)) << "rmsnorm_backward_add dgain";
  Buffer rdy = put<double>(r, DY), rdres = put<double>(r, DRES), rdg = put<double>(r, G);
  d.rmsnorm_backward_add(rsum.data<double>(), rg.data<double>(), rrstd.data<double>(), rdy.data<double>(),
                         rdres.data<double>(), rdg.data<double>(), N, D);
  expect_close<T>("rmsnorm_backward_add dres", get<T>(b, dres), get<double>(r, rdres), D);
  expect_close<T>("rmsnorm_backward_add dgain", get<T>(b, dg), get<double>(r, rdg), N);
}

TEST_P(Conformance, FusedResidualNorms) {
  for (auto [N, D] : {std::array<int64_t, 2>{37, 96}, {5, 1001}, {1, 1}}) {
    fused_norm_cases<float>(backend(), N, D);
    fused_norm_cases<double>(backend(), N, D);
  }
}

TEST_P(Conformance, NormsAndElementwise) {
  norm_cases<float>(backend());
  norm_cases<double>(backend());
  elementwise_cases<float>(backend());
  elementwise_cases<double>(backend());
}

// The gradient norm's sum of squares over more chunks of 4096 than the CUDA backend's block over the partials has
// threads (two or three partials each): within the suite's bound, 8 eps(T) sqrt(n), of the sum of the values as
// stored (in long double), and sum_squares_into gives the same bits.
template <typename T>
void long_sum_cases(Backend& b) {
  const int64_t n = 4096 * (2 * 256 + 3) + 17;
  const auto X = randn(n, "long sum");
  long double exact = 0;
  for (double x : X) exact += (long double)(T(x)) * (long double)(T(x));
  const double ss = double(exact);
  Buffer x = put<T>(b, X), into = b.allocate(DType::F64, 1);
  Ops<T>& f = b.ops<T>();
  const double sum = f.sum_squares(x.data<T>(), n);
  EXPECT_NEAR(sum, ss, 8 * eps<T>() * std::sqrt(double(n)) * ss);
  f.sum_squares_into(x.data<T>(), n, into.data<double>());
  EXPECT_EQ(b.download<double>(into)[0], sum);
}

TEST_P(Conformance, SumSquaresOverManyChunks) {
  long_sum_cases<float>(backend());
  long_sum_cases<double>(backend());
}

// Segments for sum_squares_segments_into: empty ones, ones of one element to several chunks of 4096 (the last
// short), offsets not aligned, one overlapping others, the last ending at the buffer's end.
std::vector<SumSegment> sum_segments() {
  std::vector<SumSegment> segments;
  int64_t at = 3;
  for (int64_t length : {int64_t(0), int64_t(1), int64_t(4095), int64_t(4096), int64_t(4097), int64_t(0),
                         int64_t(3 * 4096 + 7), int64_t(999), int64_t(0), int64_t(2 * 4096 + 1)}) {
    segments.push_back({at, length});
    at += length + int64_t(segments.size() % 3);
  }
  for (int64_t i = 0; i < 30; ++i) {
    segments.push_back({at, i * 2713 % 10007});
    at += segments.back().length + i % 2;
  }
  segments.push_back({5, 5000});
  return segments;
}

// Every segment's sum in one op: each what sum_squares_into writes for it on the same backend, bit for bit, and
// within 8 eps(T) sqrt(length) of its sum in long double.
template <typename T>
void segment_sum_cases(Backend& b) {
  const std::vector<SumSegment> segments = sum_segments();
  const int64_t count = int64_t(segments.size());
  int64_t n = 0;
  for (const SumSegment& s : segments) n = std::max(n, s.offset + s.length);
  const auto X = randn(n, "segment sums");
  Buffer x = put<T>(b, X), one_op = b.allocate(DType::F64, count), each = b.allocate(DType::F64, count);
  Ops<T>& f = b.ops<T>();
  f.sum_squares_segments_into(x.data<T>(), segments.data(), count, one_op.data<double>());
  for (int64_t i = 0; i < count; ++i)
    f.sum_squares_into(x.data<T>() + segments[size_t(i)].offset, segments[size_t(i)].length, each.data<double>() + i);
  const std::vector<double> got = b.download<double>(one_op), want = b.download<double>(each);
  for (size_t i = 0; i < segments.size(); ++i) {
    EXPECT_EQ(got[i], want[i]) << "segment " << i;
    long double exact = 0;
    for (int64_t k = segments[i].offset; k < segments[i].offset + segments[i].length; ++k)
      exact += (long double)(T(X[size_t(k)])) * (long double)(T(X[size_t(k)]));
    const double bound = 8 * eps<T>() * std::sqrt(double(std::max<int64_t>(segments[i].length, 1)));
    EXPECT_NEAR(got[i], double(exact), bound * double(exact)) << "segment " << i;
  }
}

TEST_P(Conformance, SumSquaresOfSegmentsInOneOp) {
  segment_sum_cases<float>(backend());
  segment_sum_cases<double>(backend());
}

// A segment longer than CUDA's 16 384 chunks of 4096 (its chunks lengthen) beside short ones, in fp32, of a value
// whose squares add up exactly in double in any order: each sum is the exact one, so every element is counted
// once, and the same bits as sum_squares_into.
TEST_P(Conformance, SumSquaresOfALongSegmentCountEveryElementOnce) {
  Backend& b = backend();
  const int64_t n = 16384 * int64_t(4096) + 3 * 4096 + 5;
  const std::vector<SumSegment> segments = {{1, n - 1}, {0, 0}, {7, 4097}, {0, n}};
  Buffer x = b.allocate(DType::F32, n), one_op = b.allocate(DType::F64, 4), each = b.allocate(DType::F64, 4);
  Ops<float>& f = b.ops<float>();
  f.fill(x.data<float>(), 0.75f, n);
  f.sum_squares_segments_into(x.data<float>(), segments.data(), 4, one_op.data<double>());
  for (size_t i = 0; i < segments.size(); ++i)
    f.sum_squares_into(x.data<float>() + segments[i].offset, segments[i].length, each.data<double>() + i);
  const std::vector<double> got = b.download<double>(one_op);
  EXPECT_EQ(got, b.download<double>(each));
  for (size_t i = 0; i < segments.size(); ++i) EXPECT_EQ(got[i], 0.5625 * double(segments[i].length)) << i;
}

// A strided block of rows copied within the backend: a column block out of a wider matrix, into one, and rows
// shorter than both strides; the copy is exact.
template <typename T>
void copy_strided_cases(Backend& b) {
  const int64_t rows = 7, wide = 12;
  const auto X = randn(rows * wide, "strided");
  struct Shape {
    int64_t ldx, first, ldy, cols;
  };
  for (const Shape& s : {Shape{wide, 4, 4, 4}, Shape{4, 0, wide, 4}, Shape{wide, 3, 9, 5}}) {
    const auto Y = randn(rows * s.ldy, "strided dst");
    std::vector<double> ref = Y;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < s.cols; ++c) ref[size_t(r * s.ldy + c)] = double(T(X[size_t(s.first + r * s.ldx + c)]));
    Buffer x = put<T>(b, X), y = put<T>(b, Y);
    b.ops<T>().copy_strided(x.data<T>() + s.first, s.ldx, y.data<T>(), s.ldy, rows, s.cols);
    const std::vector<double> got = get<T>(b, y);
    for (size_t i = 0; i < ref.size(); ++i) ASSERT_EQ(got[i], double(T(ref[i]))) << "ldx " << s.ldx << " at " << i;
  }
  b.ops<T>().copy_strided(nullptr, 1, nullptr, 1, 0, 0);  // nothing to copy
}

TEST_P(Conformance, CopyStrided) {
  copy_strided_cases<float>(backend());
  copy_strided_cases<double>(backend());
}

// Grouped-query attention's expansion of key and value heads: each head copied to its group (exact), and the
// backward's sum over each group against the reference's, with one head per group (a plain copy) among them.
template <typename T>
void expand_heads_cases(Backend& b) {
  Backend& r = reference();
  for (auto [N, Hkv, group, Dh] : {std::array<int64_t, 4>{5, 2, 3, 8}, {17, 1, 4, 6}, {3, 4, 1, 10}}) {
    const int64_t wide = N * Hkv * group * Dh, narrow = N * Hkv * Dh;
    const auto X = randn(narrow, "kv heads"), DY = randn(wide, "expanded heads' gradient");
    Buffer x = put<T>(b, X), dy = put<T>(b, DY), y = b.allocate(dtype_of<T>(), wide),
           dx = b.allocate(dtype_of<T>(), narrow);
    b.ops<T>().expand_heads(x.data<T>(), y.data<T>(), N, Hkv, group, Dh);
    const std::vector<double> got = get<T>(b, y);
    for (int64_t n = 0; n < N; ++n)
      for (int64_t h = 0; h < Hkv * group; ++h)
        for (int64_t d = 0; d < Dh; ++d)
          ASSERT_EQ(got[size_t((n * Hkv * group + h) * Dh + d)], double(T(X[size_t((n * Hkv + h / group) * Dh + d)])))
              << "row " << n << " head " << h;
    Buffer rdy = put<double>(r, DY), rdx = r.allocate(DType::F64, narrow);
    b.ops<T>().expand_heads_backward(dy.data<T>(), dx.data<T>(), N, Hkv, group, Dh);
    r.ops<double>().expand_heads_backward(rdy.data<double>(), rdx.data<double>(), N, Hkv, group, Dh);
    const std::vector<double> want = get<double>(r, rdx);
    for (int64_t n = 0; n < N; ++n)  // the reference's sum, checked against the definition once
      for (int64_t d = 0; d < Dh; ++d) {
        double sum = 0;
        for (int64_t g = 0; g < group; ++g) sum += DY[size_t((n * Hkv * group + g) * Dh + d)];
        ASSERT_NEAR(want[size_t(n * Hkv * Dh + d)], sum, 1e-12);
      }
    expect_close<T>("expand_heads backward", get<T>(b, dx), want, group);
  }
}

TEST_P(Conformance, ExpandHeads) {
  expand_heads_cases<float>(backend());
  expand_heads_cases<double>(backend());
}

template <typename T>
void attention_cases(Backend& b) {
  Backend& r = reference();
  const int64_t B = 2, T_ = 17, H = 3, Dh = 8, n = B * T_ * H * Dh, P = B * H * T_ * T_;
  const auto Q = randn(n, "q"), K = randn(n, "k"), V = randn(n, "v"), DO = randn(n, "do");
  auto run = [&](Backend& be, auto zero) {
    using U = decltype(zero);
    constexpr DType t = dtype_of<U>();
    Buffer q = put<U>(be, Q), k = put<U>(be, K), v = put<U>(be, V), dout = put<U>(be, DO);
    Buffer out = be.allocate(t, n), probs = be.allocate(t, P), dq = be.allocate(t, n), dk = be.allocate(t, n),
           dv = be.allocate(t, n), scratch = be.allocate(t, T_ * T_);
    Ops<U>& o = be.ops<U>();
    o.attention_forward({.shape = {B, T_, H, Dh},
                         .q = q.data<U>(),
                         .k = k.data<U>(),
                         .v = v.data<U>(),
                         .out = out.data<U>(),
                         .probs = probs.data<U>()});
    o.attention_backward({.shape = {B, T_, H, Dh},
                          .q = q.data<U>(),
                          .k = k.data<U>(),
                          .v = v.data<U>(),
                          .probs = probs.data<U>(),
                          .dout = dout.data<U>(),
                          .dq = dq.data<U>(),
                          .dk = dk.data<U>(),
                          .dv = dv.data<U>(),
                          .scratch = scratch.data<U>()});
    return std::array<std::vector<double>, 4>{get<U>(be, out), get<U>(be, dq), get<U>(be, dk), get<U>(be, dv)};
  };
  const auto got = run(b, T(0)), ref = run(r, 0.0);
  const char* names[4] = {"attention forward", "attention backward dq", "attention backward dk",
                          "attention backward dv"};
  for (int i = 0; i < 4; ++i) expect_close<T>(names[i], got[size_t(i)], ref[size_t(i)], T_ * Dh);
}

// The fused form (FlashAttention-2's) where the backend offers it for the shape: its output, log-sum-exp and
// gradients against the reference's fused form in double (which test_fused_attention.cpp holds to the plain form
// and to finite differences). The CPU backend offers it once
// allowed; the CUDA backend for fp32 storage under bf16 GEMMs only (tests/core/test_fused_attention.cpp).
template <typename T>
void fused_attention_cases(Backend& b) {
  Backend& r = reference();
  const int64_t B = 2, T_ = 17, H = 3, Dh = 8, n = B * T_ * H * Dh;
  Ops<T>& o = b.ops<T>();
  const bool allowed = o.fused_attention_allowed(), ref_allowed = r.ops<double>().fused_attention_allowed();
  o.set_fused_attention(true);
  r.ops<double>().set_fused_attention(true);
  if (o.fused_attention_supported({B, T_, H, Dh})) {
    const auto Q = randn(n, "q"), K = randn(n, "k"), V = randn(n, "v"), DO = randn(n, "do");
    auto run = [&](Backend& be, auto zero) {
      using U = decltype(zero);
      constexpr DType t = dtype_of<U>();
      Buffer q = put<U>(be, Q), k = put<U>(be, K), v = put<U>(be, V), dout = put<U>(be, DO);
      Buffer out = be.allocate(t, n), stats = be.allocate(t, B * H * T_), dq = be.allocate(t, n),
             dk = be.allocate(t, n), dv = be.allocate(t, n);
      Ops<U>& u = be.ops<U>();
      u.attention_forward_fused({.shape = {B, T_, H, Dh},
                                 .q = q.data<U>(),
                                 .k = k.data<U>(),
                                 .v = v.data<U>(),
                                 .out = out.data<U>(),
                                 .stats = stats.data<U>()});
      u.attention_backward_fused({.shape = {B, T_, H, Dh},
                                  .q = q.data<U>(),
                                  .k = k.data<U>(),
                                  .v = v.data<U>(),
                                  .out = out.data<U>(),
                                  .stats = stats.data<U>(),
                                  .dout = dout.data<U>(),
                                  .dq = dq.data<U>(),
                                  .dk = dk.data<U>(),
                                  .dv = dv.data<U>()});
      return std::array<std::vector<double>, 5>{get<U>(be, out), get<U>(be, stats), get<U>(be, dq), get<U>(be, dk),
                                                get<U>(be, dv)};
    };
    const auto got = run(b, T(0)), ref = run(r, 0.0);
    const char* names[5] = {"fused attention forward", "fused attention log-sum-exp", "fused attention dq",
                            "fused attention dk", "fused attention dv"};
    for (int i = 0; i < 5; ++i) expect_close<T>(names[i], got[size_t(i)], ref[size_t(i)], T_ * Dh);
  }
  o.set_fused_attention(allowed);
  r.ops<double>().set_fused_attention(ref_allowed);
}

template <typename T>
void loss_cases(Backend& b) {
  Backend& r = reference();
  const int64_t N = 19, V = 256;
  const auto Z = randn(N * V, "z", 4.0);
  std::vector<int32_t> targets(static_cast<size_t>(N));
  for (int64_t i = 0; i < N; ++i) targets[size_t(i)] = int32_t((i * 37) % V);
  const std::vector<int32_t> tokens = {3, 0, 255, 3, 3, 7};
  const auto table = randn(V * 5, "E"), g6 = randn(6 * 5, "g6");
  auto run = [&](Backend& be, auto zero) {
    using U = decltype(zero);
    constexpr DType t = dtype_of<U>();
    Ops<U>& o = be.ops<U>();
    Buffer z = put<U>(be, Z), tg = put_index(be, targets), losses = be.allocate(t, N), dz = be.allocate(t, N * V);
    o.cross_entropy_forward(z.data<U>(), tg.data<int32_t>(), losses.data<U>(), N, V);
    o.cross_entropy_backward(z.data<U>(), tg.data<int32_t>(), U(0.1), dz.data<U>(), N, V);
    Buffer tok = put_index(be, tokens), tab = put<U>(be, table), g = put<U>(be, g6), e = be.allocate(t, 6 * 5),
           dtab = be.allocate(t, V * 5);
    o.embedding_forward(tok.data<int32_t>(), tab.data<U>(), 0, V, e.data<U>(), 6, 5);
    o.embedding_backward(tok.data<int32_t>(), g.data<U>(), 0, V, dtab.data<U>(), 6, 5);
    return std::array<std::vector<double>, 4>{get<U>(be, losses), get<U>(be, dz), get<U>(be, e), get<U>(be, dtab)};
  };
  const auto got = run(b, T(0)), ref = run(r, 0.0);
  expect_close<T>("cross-entropy forward", got[0], ref[0], V);
  expect_close<T>("cross-entropy backward", got[1], ref[1], V);
  expect_close<T>("embedding forward", got[2], ref[2], 1);
  expect_close<T>("embedding backward", got[3], ref[3], 3);
}

// The vocabulary-parallel cross-entropy's parts on a block of V columns holding ids [first, first + V): some
// rows' targets inside the block, some outside.
template <typename T>
void vocab_block_cases(Backend& b) {
  Backend& r = reference();
  const int64_t N = 13, V = 96, first = 64;
  const auto Z = randn(N * V, "zb", 4.0), lse = randn(N, "lse", 1.0);
  std::vector<int32_t> targets(static_cast<size_t>(N));
  for (int64_t i = 0; i < N; ++i) targets[size_t(i)] = int32_t((i * 29) % 256);
  auto run = [&](Backend& be, auto zero) {
    using U = decltype(zero);
    Ops<U>& o = be.ops<U>();
    Buffer z = put<U>(be, Z), tg = put_index(be, targets), l = put<U>(be, lse);
    Buffer row_max = be.allocate(DType::F64, N), sums = be.allocate(DType::F64, 2 * N),
           dz = be.allocate(dtype_of<U>(), N * V);
    o.logits_row_max(z.data<U>(), N, V, row_max.data<double>());
    o.logits_sum_exp(z.data<U>(), tg.data<int32_t>(), first, row_max.data<double>(), sums.data<double>(), N, V);
    o.logits_softmax_backward(z.data<U>(), tg.data<int32_t>(), first, l.data<U>(), U(0.1), dz.data<U>(), N, V);
    return std::array<std::vector<double>, 3>{be.download<double>(row_max), be.download<double>(sums), get<U>(be, dz)};
  };
  const auto got = run(b, T(0)), ref = run(r, 0.0);
  expect_close<T>("logits row maxima", got[0], ref[0], 1);
  expect_close<T>("logits sum of exponentials", got[1], ref[1], V);
  expect_close<T>("logits softmax backward", got[2], ref[2], 1);
}

// The blocks' maxima merged (exact: the largest of each row's P values, wherever it is), and the log-sum-exp and
// loss from the whole rows' maxima and sums.
template <typename T>
void vocab_finish_cases(Backend& b) {
  const int64_t N = 11, P = 3;
  const std::vector<double> block_max = randn(P * N, "block maxima", 4.0), row_max = randn(N, "row maxima", 4.0);
  std::vector<double> sums = randn(2 * N, "sums", 1.0);
  for (int64_t n = 0; n < N; ++n) sums[size_t(n)] = 1.0 + std::abs(sums[size_t(n)]) * 30;  // >= 1: one term is 1
  Buffer bm = put<double>(b, block_max), merged = b.allocate(DType::F64, N);
  b.ops<T>().logits_max_over_blocks(bm.data<double>(), merged.data<double>(), P, N);
  std::vector<double> want_max(static_cast<size_t>(N)), want_lse(static_cast<size_t>(N)),
      want_loss(static_cast<size_t>(N));
  for (int64_t n = 0; n < N; ++n) {
    want_max[size_t(n)] = std::max({block_max[size_t(n)], block_max[size_t(N + n)], block_max[size_t(2 * N + n)]});
    const double l = row_max[size_t(n)] + std::log(sums[size_t(n)]);
    want_lse[size_t(n)] = double(T(l)), want_loss[size_t(n)] = double(T(l - sums[size_t(N + n)]));
  }
  EXPECT_EQ(b.download<double>(merged), want_max) << "logits_max_over_blocks";
  Buffer rm = put<double>(b, row_max), s = put<double>(b, sums);
  Buffer lse = b.allocate(dtype_of<T>(), N), loss = b.allocate(dtype_of<T>(), N);
  b.ops<T>().logits_loss_finish(rm.data<double>(), s.data<double>(), lse.data<T>(), loss.data<T>(), N);
  expect_close<T>("logits_loss_finish lse", get<T>(b, lse), want_lse, 1);
  expect_close<T>("logits_loss_finish losses", get<T>(b, loss), want_loss, 1);
}

TEST_P(Conformance, AttentionAndLoss) {
  attention_cases<float>(backend());
  attention_cases<double>(backend());
  fused_attention_cases<float>(backend());
  fused_attention_cases<double>(backend());
  loss_cases<float>(backend());
  loss_cases<double>(backend());
  vocab_block_cases<float>(backend());
  vocab_block_cases<double>(backend());
  vocab_finish_cases<float>(backend());
  vocab_finish_cases<double>(backend());
}

INSTANTIATE_TEST_SUITE_P(Backends, Conformance, ::testing::ValuesIn(backends()),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace moe::conformance
