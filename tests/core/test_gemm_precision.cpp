// GemmPrecision::Bf16 (train.precision = bf16) on every backend: a bf16 GEMM is the GEMM of its operands rounded
// to bf16, so against the double reference of the rounded operands it is within fp32's bound (the products are
// exact; only the order of the fp32 sums is the backend's), and on the CPU it is bit for bit the fp32 GEMM of
// the rounded operands. The same for the grouped expert GEMM in both layouts. Attention in bf16 keeps its
// probabilities from the rounded q and k and stays within a bf16 bound of the fp32 result; so does the dense MLP
// holding its tensors rounded. Each call states its own
// precision (an fp32 GEMM between bf16 ones reads as stored), and the operand it names as a weight comes from the
// parameters' rounded copy, which must hold it: a weight outside the parameters' memory is refused.
#include <gtest/gtest.h>

#include <array>
#include <vector>

#include "core/dtype.h"
#include "core/ffn.h"
#include "core/params.h"
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
        const Ops<float>::Gemm g{.trans_a = bool(ta),
                                 .trans_b = bool(tb),
                                 .M = M,
                                 .N = N,
                                 .K = K,
                                 .alpha = 0.5f,
                                 .lda = lda,
                                 .ldb = ldb,
                                 .beta = 0.25f,
                                 .ldc = N};
        Ops<float>::Gemm g16 = g, g32 = g;
        g16.A = a.data<float>(), g16.B = bb.data<float>(), g16.C = c16.data<float>();
        g16.precision = GemmPrecision::Bf16;
        g32.A = ar.data<float>(), g32.B = br.data<float>(), g32.C = c32.data<float>();
        f.gemm(g16);
        f.gemm(g32);
        r.ops<double>().gemm({.trans_a = bool(ta),
                              .trans_b = bool(tb),
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
      const Ops<float>::GroupedGemm g{.trans_a = bool(trans_a),
                                      .trans_b = bool(trans_b),
                                      .groups = groups,
                                      .row_offset = offsets.data(),
                                      .N = N,
                                      .K = K,
                                      .beta = 1.0f};
      Ops<float>::GroupedGemm g16 = g, g32 = g;
      g16.A = a.data<float>(), g16.B = bb.data<float>(), g16.C = c16.data<float>();
      g16.precision = GemmPrecision::Bf16;
      g32.A = ar.data<float>(), g32.B = br.data<float>(), g32.C = c32.data<float>();
      f.grouped_gemm(g16);
      f.grouped_gemm(g32);
      r.ops<double>().grouped_gemm({.trans_a = bool(trans_a),
                                    .trans_b = bool(trans_b),
                                    .groups = groups,
                                    .row_offset = offsets.data(),
                                    .N = N,
                                    .K = K,
                                    .A = ra.data<double>(),
                                    .B = rb.data<double>(),
                                    .beta = 1.0,
                                    .C = rc.data<double>()});
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
    const AttentionShape shape{B, T_, H, Dh, p};
    f.attention_forward({.shape = shape,
                         .q = q.data<float>(),
                         .k = k.data<float>(),
                         .v = v.data<float>(),
                         .out = out.data<float>(),
                         .probs = probs.data<float>()});
    f.attention_backward({.shape = shape,
                          .q = q.data<float>(),
                          .k = k.data<float>(),
                          .v = v.data<float>(),
                          .probs = probs.data<float>(),
                          .dout = dout.data<float>(),
                          .dq = dq.data<float>(),
                          .dk = dk.data<float>(),
                          .dv = dv.data<float>(),
                          .scratch = scratch.data<float>()});
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

// The dense SwiGLU MLP (a dense layer, the shared experts, the fallback) under bf16 GEMMs holds x, a, b, h rounded
// as the routed experts do (one group of Ops::expert_mlp_forward_rounded): half the activations of fp32's a, b, h
// plus x, its scratch the experts', and every output and gradient within bf16's bound of the fp32 layer.
TEST_P(GemmPrecisionTest, Bf16DenseMlpHoldsItsTensorsRoundedWithinBf16OfFp32) {
  Backend& b = backend();
  const int64_t N = 10, D = 12, F = 20;
  const auto X = randn(N * D, "mlp x"), DY = randn(N * D, "mlp dy");
  auto run = [&](GemmPrecision p) {
    DenseMlp<float> mlp(b, D, F, 2);
    mlp.set_precision(p);
    ParamTable table;
    mlp.register_params(table, "mlp");
    std::vector<double> init(size_t(table.numel()));
    table.initialize(init.data(), 7);
    for (double& w : init) w *= 20;  // O(1) weights so that the nonlinearity matters
    Buffer params = put<float>(b, init), grads = put<float>(b, std::vector<double>(init.size(), 0.0));
    mlp.bind(table, params.data<float>(), grads.data<float>());
    if (p == GemmPrecision::Bf16) {
      EXPECT_EQ(mlp.activation_size(N), (N * D + 3 * N * F) / 2);
      EXPECT_EQ(mlp.scratch_size(N), N * F + (2 * N * F + N * D) / 2);
    }
    Buffer x = put<float>(b, X), dy = put<float>(b, DY), y = b.allocate(DType::F32, N * D),
           dx = b.allocate(DType::F32, N * D), acts = b.allocate(DType::F32, mlp.activation_size(N)),
           scratch = b.allocate(DType::F32, mlp.scratch_size(N));
    mlp.forward(x.data<float>(), y.data<float>(), acts.data<float>(), N);
    mlp.backward(x.data<float>(), dy.data<float>(), dx.data<float>(), acts.data<float>(), scratch.data<float>(), N);
    return std::array<std::vector<double>, 3>{get<float>(b, y), get<float>(b, dx), get<float>(b, grads)};
  };
  const auto fp32 = run(GemmPrecision::Fp32), bf16 = run(GemmPrecision::Bf16);
  const char* names[3] = {"y", "dx", "parameter gradients"};
  for (int i = 0; i < 3; ++i) {
    const double apart = max_relative(bf16[size_t(i)], fp32[size_t(i)]);
    EXPECT_LE(apart, 8 * std::ldexp(1.0, -8)) << names[i] << ": within bf16's bound";
    EXPECT_GT(apart, 1e-5) << names[i] << ": the operands were rounded";
  }
}

// The precision is the call's own: an fp32 GEMM between bf16 ones reads as stored, and a bf16 one after it rounds
// again (nothing is left behind on the ops, as the router's fp32 GEMMs between the layers' bf16 ones need).
TEST_P(GemmPrecisionTest, EachCallStatesItsPrecision) {
  Backend& b = backend();
  Ops<float>& f = b.ops<float>();
  const int64_t M = 5, N = 6, K = 7;
  const auto A = randn(M * K, "fA"), B = randn(K * N, "fB");
  Buffer a = put<float>(b, A), bb = put<float>(b, B);
  auto product = [&](GemmPrecision p) {
    Buffer y = b.allocate(DType::F32, M * N);
    f.gemm({.M = M,
            .N = N,
            .K = K,
            .A = a.data<float>(),
            .lda = K,
            .B = bb.data<float>(),
            .ldb = N,
            .C = y.data<float>(),
            .ldc = N,
            .precision = p});
    return get<float>(b, y);
  };
  const std::vector<double> bf16 = product(GemmPrecision::Bf16), fp32 = product(GemmPrecision::Fp32);
  EXPECT_NE(bf16, fp32) << "the bf16 GEMM rounded its operands";
  EXPECT_EQ(product(GemmPrecision::Bf16), bf16);
  EXPECT_EQ(product(GemmPrecision::Fp32), fp32);
  EXPECT_EQ(product(GemmPrecision::Bf16), bf16);
}

// The operand a GEMM names as its weight comes from the parameters' rounded copy: the same bits as rounding it per
// GEMM (as a GEMM that names no weight does, or any GEMM while no parameters' memory is registered), and the copy
// follows the parameters after parameters_changed().
TEST_P(GemmPrecisionTest, ParameterCopyGivesTheSameBitsAndFollowsChanges) {
  Backend& b = backend();
  Ops<float>& f = b.ops<float>();
  const int64_t M = 9, N = 20, K = 33;
  const auto X = randn(M * K, "px"), W1 = randn(K * N, "pw1"), W2 = randn(K * N, "pw2");
  Buffer x = put<float>(b, X), params = b.allocate(DType::F32, 2 * K * N);
  b.copy_to_device(params.data<float>(), std::vector<float>(W1.begin(), W1.end()).data(), K * N);
  b.copy_to_device(params.data<float>() + K * N, std::vector<float>(W2.begin(), W2.end()).data(), K * N);
  // x W_weight, the weight's leading dimension N, named as the weight or not.
  auto product = [&](int64_t weight, GemmWeight named) {
    Buffer y = b.allocate(DType::F32, M * N);
    f.gemm({.M = M,
            .N = N,
            .K = K,
            .A = x.data<float>(),
            .lda = K,
            .B = params.data<float>() + weight * K * N,
            .ldb = N,
            .C = y.data<float>(),
            .ldc = N,
            .precision = GemmPrecision::Bf16,
            .weight = named});
    return get<float>(b, y);
  };
  const std::vector<double> each1 = product(0, GemmWeight::B), each2 = product(1, GemmWeight::B);
  EXPECT_EQ(product(0, GemmWeight::None), each1);
  f.set_parameter_memory(params.data<float>(), 2 * K * N);
  EXPECT_EQ(product(0, GemmWeight::B), each1);
  EXPECT_EQ(product(1, GemmWeight::B), each2);
  EXPECT_EQ(product(1, GemmWeight::None), each2);
  b.copy(params.data<float>(), params.data<float>() + K * N, size_t(K * N) * sizeof(float));  // W1 := W2
  f.parameters_changed();
  EXPECT_EQ(product(0, GemmWeight::B), each2);
  f.set_parameter_memory(nullptr, 0);
}

// While the parameters' memory is registered, a GEMM that names as its weight an operand outside it, or one that
// runs past its end, is refused at the call, at either precision, on every backend and for the grouped GEMM too;
// the same operand not named as a weight, or named while no memory is registered, is read.
TEST_P(GemmPrecisionTest, AWeightOutsideTheParametersIsRefused) {
  Backend& b = backend();
  Ops<float>& f = b.ops<float>();
  const int64_t M = 4, N = 6, K = 5;
  Buffer x = put<float>(b, randn(M * K, "rx")), w = put<float>(b, randn(K * N, "rw"));
  Buffer params = put<float>(b, randn(K * N + 7, "rp")), y = b.allocate(DType::F32, M * N);
  const float* tail = params.data<float>() + 7;  // K N elements ending where the parameters end
  auto gemm = [&](const float* weight, GemmWeight named, GemmPrecision p) {
    const bool a = named == GemmWeight::A;  // the weight as A: y^T (N, M) = w^T (N, K) x^T, both transposed
    if (a)
      f.gemm({.trans_a = true,
              .trans_b = true,
              .M = N,
              .N = M,
              .K = K,
              .A = weight,
              .lda = N,
              .B = x.data<float>(),
              .ldb = K,
              .C = y.data<float>(),
              .ldc = M,
              .precision = p,
              .weight = named});
    else
      f.gemm({.M = M,
              .N = N,
              .K = K,
              .A = x.data<float>(),
              .lda = K,
              .B = weight,
              .ldb = N,
              .C = y.data<float>(),
              .ldc = N,
              .precision = p,
              .weight = named});
  };
  f.set_parameter_memory(params.data<float>(), K * N + 7);
  for (GemmPrecision p : {GemmPrecision::Fp32, GemmPrecision::Bf16}) {
    EXPECT_THROW(gemm(w.data<float>(), GemmWeight::B, p), Error);
    EXPECT_THROW(gemm(w.data<float>(), GemmWeight::A, p), Error);
    EXPECT_THROW(gemm(params.data<float>() + 8, GemmWeight::B, p), Error) << "runs one element past the end";
    EXPECT_NO_THROW(gemm(tail, GemmWeight::B, p));
    EXPECT_NO_THROW(gemm(tail, GemmWeight::A, p));
    EXPECT_NO_THROW(gemm(w.data<float>(), GemmWeight::None, p));
  }
  try {
    gemm(w.data<float>(), GemmWeight::B, GemmPrecision::Bf16);
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("does not lie in the parameters' memory"), std::string::npos) << e.what();
  }
  const std::vector<int64_t> offsets = {0, 1, 4};
  auto grouped = [&](const float* weight) {  // two experts' (K, 3) weights
    f.grouped_gemm({.groups = 2,
                    .row_offset = offsets.data(),
                    .N = 3,
                    .K = K,
                    .A = x.data<float>(),
                    .B = weight,
                    .C = y.data<float>(),
                    .precision = GemmPrecision::Bf16,
                    .weight = GemmWeight::B});
  };
  EXPECT_THROW(grouped(w.data<float>()), Error);
  EXPECT_NO_THROW(grouped(tail));
  f.set_parameter_memory(nullptr, 0);
  EXPECT_NO_THROW(gemm(w.data<float>(), GemmWeight::B, GemmPrecision::Bf16));
  EXPECT_NO_THROW(grouped(w.data<float>()));
  b.synchronize();
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
  f.set_parameter_memory(params.data<float>(), P);
  // x W_weight[:, first column, width columns], W_weight (K, N) with leading dimension N, from `from` (named as the
  // weight where it lies in the parameters).
  auto product = [&](const float* from, int64_t first, int64_t width) {
    Buffer y = b.allocate(DType::F32, M * width);
    const bool inside = from == params.data<float>() || from == params.data<float>() + K * N;
    f.gemm({.M = M,
            .N = width,
            .K = K,
            .A = x.data<float>(),
            .lda = K,
            .B = from + first,
            .ldb = N,
            .C = y.data<float>(),
            .ldc = width,
            .precision = GemmPrecision::Bf16,
            .weight = inside ? GemmWeight::B : GemmWeight::None});
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
}

INSTANTIATE_TEST_SUITE_P(Backends, GemmPrecisionTest, ::testing::ValuesIn(backends()),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace moe::conformance
