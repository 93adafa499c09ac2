// The op conformance suite: every op of every backend against the double-precision CPU reference on
// odd and model-like shapes, with a normalised error bound derived from the dtype and the reduction
// length, and a NaN/Inf check. A new backend adds a row to backends().
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "core/backend/ops.h"
#include "core/philox.h"
#include "tests/core/test_backend.h"

namespace moe {
namespace {

struct BackendRow {
  std::string name;
  Ops<float>* ops;
};
std::vector<BackendRow> backends() { return {{"cpu", &test_backend().ops<float>()}}; }

std::vector<double> randn(int64_t n, const std::string& purpose, double scale = 1.0) {
  const RngStream rng(99, purpose);
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[i] = scale * rng.normal(uint64_t(i));
  return v;
}
std::vector<float> to_float(const std::vector<double>& v) { return {v.begin(), v.end()}; }

// max |got - ref| / (max |ref| + tiny) <= bound, with bound = c * eps_fp32 * sqrt(reduction length).
void expect_close(const std::string& what, const std::vector<float>& got, const std::vector<double>& ref,
                  int64_t reduction_length) {
  ASSERT_EQ(got.size(), ref.size());
  double max_ref = 0, max_err = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    ASSERT_TRUE(std::isfinite(got[i])) << what << ": non-finite at " << i;
    max_ref = std::max(max_ref, std::abs(ref[i]));
    max_err = std::max(max_err, std::abs(double(got[i]) - ref[i]));
  }
  const double bound = 8 * 1.2e-7 * std::sqrt(double(std::max<int64_t>(reduction_length, 1)));
  EXPECT_LE(max_err / (max_ref + 1e-30), bound) << what;
}

class Conformance : public ::testing::TestWithParam<BackendRow> {};

TEST_P(Conformance, Gemm) {
  Ops<float>& f = *GetParam().ops;
  Ops<double>& d = test_backend().ops<double>();
  for (auto [M, N, K] : {std::array<int64_t, 3>{1, 1, 1}, {7, 13, 5}, {64, 96, 128}, {33, 1, 257}})
    for (int ta = 0; ta < 2; ++ta)
      for (int tb = 0; tb < 2; ++tb) {
        const auto A = randn(M * K, "A"), B = randn(K * N, "B"), C = randn(M * N, "C");
        std::vector<double> Cd = C;
        std::vector<float> Cf = to_float(C), Af = to_float(A), Bf = to_float(B);
        const int64_t lda = ta ? M : K, ldb = tb ? K : N;
        d.gemm(ta, tb, M, N, K, 0.5, A.data(), lda, B.data(), ldb, 0.25, Cd.data(), N);
        f.gemm(ta, tb, M, N, K, 0.5f, Af.data(), lda, Bf.data(), ldb, 0.25f, Cf.data(), N);
        expect_close("gemm", Cf, Cd, K);
      }
}

TEST_P(Conformance, NormsAndElementwise) {
  Ops<float>& f = *GetParam().ops;
  Ops<double>& d = test_backend().ops<double>();
  const int64_t N = 37, D = 96;
  const auto x = randn(N * D, "x", 3.0), g = randn(D, "g"), dy = randn(N * D, "dy");
  std::vector<double> yd(N * D), rd(N), dxd(N * D), dgd(D, 0.0);
  std::vector<float> yf(N * D), rf(N), dxf(N * D), dgf(D, 0.0f);
  const auto xf = to_float(x), gf = to_float(g), dyf = to_float(dy);
  d.rmsnorm_forward(x.data(), g.data(), yd.data(), rd.data(), N, D);
  f.rmsnorm_forward(xf.data(), gf.data(), yf.data(), rf.data(), N, D);
  expect_close("rmsnorm forward", yf, yd, D);
  d.rmsnorm_backward(x.data(), g.data(), rd.data(), dy.data(), dxd.data(), dgd.data(), N, D);
  f.rmsnorm_backward(xf.data(), gf.data(), rf.data(), dyf.data(), dxf.data(), dgf.data(), N, D);
  expect_close("rmsnorm backward dx", dxf, dxd, D);
  expect_close("rmsnorm backward dgain", dgf, dgd, N);

  std::vector<double> hd(N * D), dad(N * D), dbd(N * D);
  std::vector<float> hf(N * D), daf(N * D), dbf(N * D);
  d.swiglu_forward(x.data(), dy.data(), hd.data(), N * D);
  f.swiglu_forward(xf.data(), dyf.data(), hf.data(), N * D);
  expect_close("swiglu forward", hf, hd, 1);
  d.swiglu_backward(x.data(), dy.data(), g.data(), dad.data(), dbd.data(), D);
  f.swiglu_backward(xf.data(), dyf.data(), gf.data(), daf.data(), dbf.data(), D);
  expect_close("swiglu backward", std::vector<float>(daf.begin(), daf.begin() + D),
               std::vector<double>(dad.begin(), dad.begin() + D), 1);

  // rope: B=2, T=9, H=3, Dh=32 = N*D elements? use the first part of x.
  const int64_t B = 2, T = 9, H = 3, Dh = 32, n = B * T * H * Dh;
  std::vector<double> rd2(x.begin(), x.begin() + n);
  std::vector<float> rf2(xf.begin(), xf.begin() + n);
  d.rope(rd2.data(), B, T, H, Dh, false);
  f.rope(rf2.data(), B, T, H, Dh, false);
  expect_close("rope", rf2, rd2, 2);
  EXPECT_NEAR(d.sum_squares(x.data(), N * D), f.sum_squares(xf.data(), N * D), 1e-6 * d.sum_squares(x.data(), N * D));
}

TEST_P(Conformance, AttentionAndLoss) {
  Ops<float>& f = *GetParam().ops;
  Ops<double>& d = test_backend().ops<double>();
  const int64_t B = 2, T = 17, H = 3, Dh = 8, n = B * T * H * Dh;
  const auto q = randn(n, "q"), k = randn(n, "k"), v = randn(n, "v"), dout = randn(n, "do");
  const auto qf = to_float(q), kf = to_float(k), vf = to_float(v), doutf = to_float(dout);
  std::vector<double> od(n), pd(B * H * T * T), dqd(n), dkd(n), dvd(n), sd(T * T);
  std::vector<float> of(n), pf(B * H * T * T), dqf(n), dkf(n), dvf(n), sf(T * T);
  d.attention_forward(q.data(), k.data(), v.data(), od.data(), pd.data(), B, T, H, Dh);
  f.attention_forward(qf.data(), kf.data(), vf.data(), of.data(), pf.data(), B, T, H, Dh);
  expect_close("attention forward", of, od, T * Dh);
  d.attention_backward(q.data(), k.data(), v.data(), pd.data(), dout.data(), dqd.data(), dkd.data(), dvd.data(),
                       sd.data(), B, T, H, Dh);
  f.attention_backward(qf.data(), kf.data(), vf.data(), pf.data(), doutf.data(), dqf.data(), dkf.data(), dvf.data(),
                       sf.data(), B, T, H, Dh);
  expect_close("attention backward dq", dqf, dqd, T * Dh);
  expect_close("attention backward dk", dkf, dkd, T * Dh);
  expect_close("attention backward dv", dvf, dvd, T * Dh);

  const int64_t N = 19, V = 256;
  const auto z = randn(N * V, "z", 4.0);
  const auto zf = to_float(z);
  std::vector<int32_t> targets(N);
  for (int64_t i = 0; i < N; ++i) targets[i] = int32_t((i * 37) % V);
  std::vector<double> ld(N), gd(N * V);
  std::vector<float> lf(N), gf(N * V);
  d.cross_entropy_forward(z.data(), targets.data(), ld.data(), N, V);
  f.cross_entropy_forward(zf.data(), targets.data(), lf.data(), N, V);
  expect_close("cross-entropy forward", lf, ld, V);
  d.cross_entropy_backward(z.data(), targets.data(), 0.1, gd.data(), N, V);
  f.cross_entropy_backward(zf.data(), targets.data(), 0.1f, gf.data(), N, V);
  expect_close("cross-entropy backward", gf, gd, V);

  std::vector<int32_t> tokens = {3, 0, 255, 3, 3, 7};
  const auto table = randn(V * 5, "E");
  const auto tablef = to_float(table);
  const auto g6 = randn(6 * 5, "g6");
  const auto g6f = to_float(g6);
  std::vector<double> ed(6 * 5), edt(V * 5, 0.0);
  std::vector<float> ef(6 * 5), eft(V * 5, 0.0f);
  d.embedding_forward(tokens.data(), table.data(), ed.data(), 6, 5);
  f.embedding_forward(tokens.data(), tablef.data(), ef.data(), 6, 5);
  expect_close("embedding forward", ef, ed, 1);
  d.embedding_backward(tokens.data(), g6.data(), edt.data(), 6, 5);
  f.embedding_backward(tokens.data(), g6f.data(), eft.data(), 6, 5);
  expect_close("embedding backward", eft, edt, 3);
}

INSTANTIATE_TEST_SUITE_P(Backends, Conformance, ::testing::ValuesIn(backends()),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace moe
