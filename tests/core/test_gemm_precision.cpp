// GemmPrecision::Bf16 (train.precision = bf16) on every backend: a bf16 GEMM is the GEMM of its operands rounded
// to bf16, so against the double reference of the rounded operands it is within fp32's bound (the products are
// exact; only the order of the fp32 sums is the backend's), and on the CPU it is bit for bit the fp32 GEMM of
// the rounded operands. The same for the grouped expert GEMM in both layouts. Attention in bf16 keeps its
// probabilities from the rounded q and k and stays within a bf16 bound of the fp32 result. Fp32Gemms (the
// router's guard) reads as stored and restores the precision it found.
#include <gtest/gtest.h>

#include <array>
#include <vector>

#include "core/dtype.h"
#include "tests/core/conformance.h"

namespace moe::conformance {
namespace {

std::vector<double> rounded(std::vector<double> v) {
  for (double& x : v) x = round_to_bf16(float(x));
  return v;
}

// The largest |a - b| / max |b|: how far two results are apart.
double max_relative(const std::vector<double>& a, const std::vector<double>& b) {
  double err = 0, ref = 0;
  for (size_t i = 0; i < a.size(); ++i) err = std::max(err, std::abs(a[i] - b[i])), ref = std::max(ref, std::abs(b[i]));
  return err / (ref + 1e-300);
}

TEST(GemmPrecisionRounding, RoundsToNearestEvenAndKeepsSpecialValues) {
  EXPECT_EQ(round_to_bf16(1.0f), 1.0f);
  // bf16 keeps 7 fraction bits: its unit in the last place at 1 is 1/128.
  EXPECT_EQ(round_to_bf16(1.0f + 1.0f / 512), 1.0f);                             // a quarter: down
  EXPECT_EQ(round_to_bf16(1.0f + 1.0f / 256), 1.0f);                             // a tie: to the even 1
  EXPECT_EQ(round_to_bf16(1.0f + 3.0f / 256), 1.0f + 1.0f / 64);                 // a tie: to the even 1 + 2/128
  EXPECT_EQ(round_to_bf16(1.0f + 1.0f / 256 + 1.0f / 4096), 1.0f + 1.0f / 128);  // above half: up
  EXPECT_EQ(round_to_bf16(-2.5f), -2.5f);
  EXPECT_TRUE(std::isinf(round_to_bf16(INFINITY)));
  EXPECT_TRUE(std::isnan(round_to_bf16(NAN)));
  EXPECT_EQ(round_to_bf16(0.1), double(round_to_bf16(0.1f)));  // a double goes through fp32
}

class GemmPrecisionTest : public Conformance {};

TEST_P(GemmPrecisionTest, Bf16GemmIsTheGemmOfRoundedOperands) {
  Backend& b = backend();
  Backend& r = reference();
  Ops<float>& f = b.ops<float>();
  for (auto [M, N, K] : {std::array<int64_t, 3>{1, 1, 1}, {7, 13, 5}, {64, 96, 128}, {33, 1, 257}})
    for (int ta = 0; ta < 2; ++ta)
      for (int tb = 0; tb < 2; ++tb) {
        // Leading dimensions past the columns: the rounding reads only the matrix.
        const int64_t lda = (ta ? M : K) + 3, ldb = (tb ? K : N) + 2;
        const auto A = randn((ta ? K : M) * lda, "A"), B = randn((tb ? N : K) * ldb, "B"), C = randn(M * N, "C");
        Buffer a = put<float>(b, A), bb = put<float>(b, B), c16 = put<float>(b, C), c32 = put<float>(b, C);
        Buffer ar = put<float>(b, rounded(A)), br = put<float>(b, rounded(B));
        Buffer ra = put<double>(r, rounded(A)), rb = put<double>(r, rounded(B)), rc = put<double>(r, C);
        f.set_gemm_precision(GemmPrecision::Bf16);
        f.gemm(ta, tb, M, N, K, 0.5f, a.data<float>(), lda, bb.data<float>(), ldb, 0.25f, c16.data<float>(), N);
        f.set_gemm_precision(GemmPrecision::Fp32);
        f.gemm(ta, tb, M, N, K, 0.5f, ar.data<float>(), lda, br.data<float>(), ldb, 0.25f, c32.data<float>(), N);
        r.ops<double>().gemm(ta, tb, M, N, K, 0.5, ra.data<double>(), lda, rb.data<double>(), ldb, 0.25,
                             rc.data<double>(), N);
        const std::vector<double> got = get<float>(b, c16);
        expect_close<float>("bf16 gemm", got, get<double>(r, rc), K);
        if (GetParam().name == "cpu") {
          EXPECT_EQ(got, get<float>(b, c32)) << "cpu: the sgemm of the rounded operands";
        }
      }
}

// The experts' GEMMs in both layouts (ops.h grouped_gemm), one expert empty.
TEST_P(GemmPrecisionTest, Bf16GroupedGemmIsTheGroupedGemmOfRoundedOperands) {
  Backend& b = backend();
  Backend& r = reference();
  Ops<float>& f = b.ops<float>();
  const int64_t groups = 4, N = 24, K = 40;
  const std::vector<int64_t> offsets = {0, 9, 9, 30, 37};
  const int64_t rows = offsets.back();
  for (int trans_a = 0; trans_a < 2; ++trans_a)
    for (int trans_b = 0; trans_b < (trans_a ? 1 : 2); ++trans_b) {
      const auto A = randn(rows * K, "gA"), B = randn(trans_a ? rows * N : groups * K * N, "gB");
      const auto C = randn(trans_a ? groups * K * N : rows * N, "gC");
      Buffer a = put<float>(b, A), bb = put<float>(b, B), c16 = put<float>(b, C), c32 = put<float>(b, C);
      Buffer ar = put<float>(b, rounded(A)), br = put<float>(b, rounded(B));
      Buffer ra = put<double>(r, rounded(A)), rb = put<double>(r, rounded(B)), rc = put<double>(r, C);
      f.set_gemm_precision(GemmPrecision::Bf16);
      f.grouped_gemm(trans_a, trans_b, groups, offsets.data(), N, K, 1.0f, a.data<float>(), bb.data<float>(), 1.0f,
                     c16.data<float>());
      f.set_gemm_precision(GemmPrecision::Fp32);
      f.grouped_gemm(trans_a, trans_b, groups, offsets.data(), N, K, 1.0f, ar.data<float>(), br.data<float>(), 1.0f,
                     c32.data<float>());
      r.ops<double>().grouped_gemm(trans_a, trans_b, groups, offsets.data(), N, K, 1.0, ra.data<double>(),
                                   rb.data<double>(), 1.0, rc.data<double>());
      const std::vector<double> got = get<float>(b, c16);
      expect_close<float>("bf16 grouped gemm", got, get<double>(r, rc), trans_a ? rows : K);
      if (GetParam().name == "cpu") {
        EXPECT_EQ(got, get<float>(b, c32)) << "cpu: the grouped sgemm of rounded operands";
      }
    }
}

// Attention at both precisions from the same inputs: the bf16 probabilities are the fp32 ones of the rounded q
// and k (within fp32's bound), and every output within bf16's bound of the fp32 result, yet not equal to it.
TEST_P(GemmPrecisionTest, Bf16AttentionStaysWithinBf16OfFp32) {
  Backend& b = backend();
  Ops<float>& f = b.ops<float>();
  const int64_t B = 2, T_ = 12, H = 3, Dh = 16, n = B * T_ * H * Dh;
  const auto Q = randn(n, "q"), K = randn(n, "k"), V = randn(n, "v"), DO = randn(n, "do");
  struct Result {
    std::vector<std::vector<double>> outputs;  // out, dq, dk, dv
    std::vector<double> probs;
  };
  auto run = [&](GemmPrecision p, const std::vector<double>& q_in, const std::vector<double>& k_in) {
    Buffer q = put<float>(b, q_in), k = put<float>(b, k_in), v = put<float>(b, V), dout = put<float>(b, DO);
    Buffer out = b.allocate(DType::F32, n), probs = b.allocate(DType::F32, B * H * T_ * T_);
    Buffer dq = b.allocate(DType::F32, n), dk = b.allocate(DType::F32, n), dv = b.allocate(DType::F32, n);
    Buffer scratch = b.allocate(DType::F32, T_ * T_);
    f.set_gemm_precision(p);
    f.attention_forward(q.data<float>(), k.data<float>(), v.data<float>(), out.data<float>(), probs.data<float>(), B,
                        T_, H, Dh);
    f.attention_backward(q.data<float>(), k.data<float>(), v.data<float>(), probs.data<float>(), dout.data<float>(),
                         dq.data<float>(), dk.data<float>(), dv.data<float>(), scratch.data<float>(), B, T_, H, Dh);
    f.set_gemm_precision(GemmPrecision::Fp32);
    return Result{{get<float>(b, out), get<float>(b, dq), get<float>(b, dk), get<float>(b, dv)}, get<float>(b, probs)};
  };
  const Result fp32 = run(GemmPrecision::Fp32, Q, K), bf16 = run(GemmPrecision::Bf16, Q, K);
  const Result fp32_rounded = run(GemmPrecision::Fp32, rounded(Q), rounded(K));
  expect_close<float>("bf16 attention probabilities", bf16.probs, fp32_rounded.probs, Dh);
  const char* names[4] = {"out", "dq", "dk", "dv"};
  for (int i = 0; i < 4; ++i) {
    const double apart = max_relative(bf16.outputs[size_t(i)], fp32.outputs[size_t(i)]);
    EXPECT_LE(apart, 8 * std::ldexp(1.0, -8) * std::sqrt(double(T_))) << names[i] << ": within bf16's bound";
    EXPECT_GT(apart, 1e-5) << names[i] << ": the operands were rounded";
  }
}

TEST_P(GemmPrecisionTest, Fp32GemmsReadsAsStoredAndRestores) {
  Backend& b = backend();
  Ops<float>& f = b.ops<float>();
  const int64_t M = 5, N = 6, K = 7;
  const auto A = randn(M * K, "fA"), B = randn(K * N, "fB");
  Buffer a = put<float>(b, A), bb = put<float>(b, B), guarded = b.allocate(DType::F32, M * N),
         plain = b.allocate(DType::F32, M * N);
  f.gemm(false, false, M, N, K, 1.0f, a.data<float>(), K, bb.data<float>(), N, 0.0f, plain.data<float>(), N);
  f.set_gemm_precision(GemmPrecision::Bf16);
  {
    const Fp32Gemms<float> fp32(f);
    EXPECT_EQ(f.gemm_precision(), GemmPrecision::Fp32);
    f.gemm(false, false, M, N, K, 1.0f, a.data<float>(), K, bb.data<float>(), N, 0.0f, guarded.data<float>(), N);
  }
  EXPECT_EQ(f.gemm_precision(), GemmPrecision::Bf16);
  f.set_gemm_precision(GemmPrecision::Fp32);
  EXPECT_EQ(get<float>(b, guarded), get<float>(b, plain));
}

// Operands inside the parameters' memory come from its rounded copy: the same bits as rounding them per GEMM,
// and the copy follows the parameters after parameters_changed().
TEST_P(GemmPrecisionTest, ParameterCopyGivesTheSameBitsAndFollowsChanges) {
  Backend& b = backend();
  Ops<float>& f = b.ops<float>();
  const int64_t M = 9, N = 20, K = 33;
  const auto X = randn(M * K, "px"), W1 = randn(K * N, "pw1"), W2 = randn(K * N, "pw2");
  Buffer x = put<float>(b, X), params = b.allocate(DType::F32, 2 * K * N);
  b.copy_to_device(params.data<float>(), std::vector<float>(W1.begin(), W1.end()).data(), K * N);
  b.copy_to_device(params.data<float>() + K * N, std::vector<float>(W2.begin(), W2.end()).data(), K * N);
  f.set_gemm_precision(GemmPrecision::Bf16);
  auto product = [&](int64_t weight) {  // x W_weight, the weight's leading dimension N
    Buffer y = b.allocate(DType::F32, M * N);
    f.gemm(false, false, M, N, K, 1.0f, x.data<float>(), K, params.data<float>() + weight * K * N, N, 0.0f,
           y.data<float>(), N);
    return get<float>(b, y);
  };
  const std::vector<double> each1 = product(0), each2 = product(1);
  f.set_parameter_memory(params.data<float>(), 2 * K * N);
  EXPECT_EQ(product(0), each1);
  EXPECT_EQ(product(1), each2);
  b.copy(params.data<float>(), params.data<float>() + K * N, size_t(K * N) * sizeof(float));  // W1 := W2
  f.parameters_changed();
  EXPECT_EQ(product(0), each2);
  f.set_parameter_memory(nullptr, 0);
  f.set_gemm_precision(GemmPrecision::Fp32);
}

// AdamW keeps the parameters' rounded copy (Ops::adamw_update): after updates of part of the parameters and then
// all of them, without parameters_changed(), a GEMM reading a weight from the copy gives the bits of the same
// GEMM on a copy of the weight outside the parameters (rounded at the GEMM). The copy read stale would not: the
// updates move every weight by far more than bf16's rounding. Strided operands (a weight's column block) too.
TEST_P(GemmPrecisionTest, AdamWUpdatesKeepTheParameterCopyCurrent) {
  Backend& b = backend();
  Ops<float>& f = b.ops<float>();
  const int64_t M = 7, N = 24, K = 19, P = 2 * K * N + 3;  // two weights and a 3-element tail
  const auto X = randn(M * K, "ax"), W = randn(P, "aw"), G = randn(P, "ag", 0.5);
  Buffer x = put<float>(b, X), params = put<float>(b, W), grads = put<float>(b, G);
  Buffer m = put<float>(b, std::vector<double>(size_t(P), 0.0)), v = put<float>(b, std::vector<double>(size_t(P), 0.0));
  Buffer outside = b.allocate(DType::F32, K * N);
  f.set_gemm_precision(GemmPrecision::Bf16);
  f.set_parameter_memory(params.data<float>(), P);
  // x W_weight[:, first column, width columns], W_weight (K, N) with leading dimension N, from `from`.
  auto product = [&](const float* from, int64_t first, int64_t width) {
    Buffer y = b.allocate(DType::F32, M * width);
    f.gemm(false, false, M, width, K, 1.0f, x.data<float>(), K, from + first, N, 0.0f, y.data<float>(), width);
    return get<float>(b, y);
  };
  auto expect_copy_current = [&](const std::string& after) {
    for (int64_t weight = 0; weight < 2; ++weight) {
      const float* in_params = params.data<float>() + weight * K * N;
      b.copy(outside.data<float>(), in_params, size_t(K * N) * sizeof(float));
      EXPECT_EQ(product(in_params, 0, N), product(outside.data<float>(), 0, N)) << after << ", weight " << weight;
      EXPECT_EQ(product(in_params, 5, 11), product(outside.data<float>(), 5, 11)) << after << ", weight " << weight;
    }
  };
  expect_copy_current("the first rounding");
  const Ops<float>::AdamWStep step{0.9f, 0.95f, 0.5f, 1.0f / 0.05f, 1e-8f, 0.001f};
  f.adamw_update(params.data<float>() + K * N, grads.data<float>() + K * N, m.data<float>() + K * N,
                 v.data<float>() + K * N, K * N + 3, step);  // the second weight and the tail
  expect_copy_current("an update of part of the parameters");
  f.adamw_update(params.data<float>(), grads.data<float>(), m.data<float>(), v.data<float>(), P, step);
  expect_copy_current("an update of all of them");
  f.set_parameter_memory(nullptr, 0);
  f.set_gemm_precision(GemmPrecision::Fp32);
}

INSTANTIATE_TEST_SUITE_P(Backends, GemmPrecisionTest, ::testing::ValuesIn(backends()),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace moe::conformance
