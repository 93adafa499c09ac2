// Fused causal attention (core/backend/ops.h attention_forward_fused / attention_backward_fused): the CPU
// reference against the plain attention (the same forward bits, the backward within fp32 rounding, both again
// under bf16 GEMMs), its statistics against the log-sum-exp, its backward against finite differences in double,
// MhaAttention on it against MhaAttention on the plain form; and, where this machine has a CUDA device, cuDNN's
// fused attention against the CPU reference at bf16 bounds, failing if cuDNN refused a shape (so the device
// check proves the fused path ran). The thread-count invariance is in test_cpu_threads.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <string>
#include <vector>

#include "core/attention.h"
#include "core/backend/ops.h"
#include "core/dtype.h"
#include "tests/core/conformance.h"
#include "tests/core/grad_check.h"

namespace moe {
namespace {

using conformance::eps;
using conformance::expect_close;
using conformance::get;
using conformance::put;
using conformance::randn;

struct Shape {
  int64_t B, T, H, Dh;
  int64_t n() const { return B * T * H * Dh; }
  std::string name() const {
    return "B " + std::to_string(B) + " T " + std::to_string(T) + " H " + std::to_string(H) + " Dh " +
           std::to_string(Dh);
  }
};

struct Inputs {
  std::vector<double> q, k, v, dout;
};
Inputs random_inputs(const Shape& s) {
  return {randn(s.n(), "q"), randn(s.n(), "k"), randn(s.n(), "v"), randn(s.n(), "dout")};
}

// out, the saved statistic (stats, or the probabilities of the plain form), dq, dk, dv.
struct Outputs {
  std::vector<double> out, saved, dq, dk, dv;
};

template <typename T>
Outputs run_fused(Backend& b, const Shape& s, const Inputs& in, GemmPrecision precision) {
  constexpr DType t = dtype_of<T>();
  Ops<T>& o = b.ops<T>();
  Buffer q = put<T>(b, in.q), k = put<T>(b, in.k), v = put<T>(b, in.v), dout = put<T>(b, in.dout);
  Buffer out = b.allocate(t, s.n()), stats = b.allocate(t, s.B * s.H * s.T), dq = b.allocate(t, s.n()),
         dk = b.allocate(t, s.n()), dv = b.allocate(t, s.n());
  o.attention_forward_fused({.shape = {s.B, s.T, s.H, s.Dh, precision},
                             .q = q.data<T>(),
                             .k = k.data<T>(),
                             .v = v.data<T>(),
                             .out = out.data<T>(),
                             .stats = stats.data<T>()});
  o.attention_backward_fused({.shape = {s.B, s.T, s.H, s.Dh, precision},
                              .q = q.data<T>(),
                              .k = k.data<T>(),
                              .v = v.data<T>(),
                              .out = out.data<T>(),
                              .stats = stats.data<T>(),
                              .dout = dout.data<T>(),
                              .dq = dq.data<T>(),
                              .dk = dk.data<T>(),
                              .dv = dv.data<T>()});
  return {get<T>(b, out), get<T>(b, stats), get<T>(b, dq), get<T>(b, dk), get<T>(b, dv)};
}

template <typename T>
Outputs run_plain(Backend& b, const Shape& s, const Inputs& in, GemmPrecision precision) {
  constexpr DType t = dtype_of<T>();
  Ops<T>& o = b.ops<T>();
  Buffer q = put<T>(b, in.q), k = put<T>(b, in.k), v = put<T>(b, in.v), dout = put<T>(b, in.dout);
  Buffer out = b.allocate(t, s.n()), probs = b.allocate(t, s.B * s.H * s.T * s.T), dq = b.allocate(t, s.n()),
         dk = b.allocate(t, s.n()), dv = b.allocate(t, s.n()), scratch = b.allocate(t, s.T * s.T);
  o.attention_forward({.shape = {s.B, s.T, s.H, s.Dh, precision},
                       .q = q.data<T>(),
                       .k = k.data<T>(),
                       .v = v.data<T>(),
                       .out = out.data<T>(),
                       .probs = probs.data<T>()});
  o.attention_backward({.shape = {s.B, s.T, s.H, s.Dh, precision},
                        .q = q.data<T>(),
                        .k = k.data<T>(),
                        .v = v.data<T>(),
                        .probs = probs.data<T>(),
                        .dout = dout.data<T>(),
                        .dq = dq.data<T>(),
                        .dk = dk.data<T>(),
                        .dv = dv.data<T>(),
                        .scratch = scratch.data<T>()});
  return {get<T>(b, out), get<T>(b, probs), get<T>(b, dq), get<T>(b, dk), get<T>(b, dv)};
}

// Each row's log-sum-exp of its scaled causal scores, in double from the inputs as the products read them.
std::vector<double> log_sum_exp(const Shape& s, const Inputs& given, GemmPrecision precision) {
  Inputs in = given;
  if (precision == GemmPrecision::Bf16)
    for (auto* x : {&in.q, &in.k})
      for (double& e : *x) e = double(round_to_bf16(float(e)));
  const int64_t D = s.H * s.Dh;
  const double scale = 1.0 / std::sqrt(double(s.Dh));
  std::vector<double> lse(size_t(s.B * s.H * s.T));
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t h = 0; h < s.H; ++h)
      for (int64_t i = 0; i < s.T; ++i) {
        std::vector<double> scores(size_t(i + 1));
        double m = -INFINITY;
        for (int64_t j = 0; j <= i; ++j) {
          double dot = 0;
          for (int64_t c = 0; c < s.Dh; ++c)
            dot += in.q[size_t((b * s.T + i) * D + h * s.Dh + c)] * in.k[size_t((b * s.T + j) * D + h * s.Dh + c)];
          scores[size_t(j)] = dot * scale, m = std::max(m, dot * scale);
        }
        double sum = 0;
        for (double x : scores) sum += std::exp(x - m);
        lse[size_t((b * s.H + h) * s.T + i)] = m + std::log(sum);
      }
  return lse;
}

const Shape kShapes[] = {{2, 17, 3, 8}, {1, 64, 2, 16}, {3, 5, 4, 6}};

// The backward's bound: fp32 rounding over the reduction, or bf16's unit round-off a few times under bf16 GEMMs.
template <typename T>
void expect_fused_matches_plain(GemmPrecision precision) {
  Backend& b = conformance::reference();
  for (const Shape& s : kShapes) {
    const Inputs in = random_inputs(s);
    const Outputs fused = run_fused<T>(b, s, in, precision), plain = run_plain<T>(b, s, in, precision);
    // The forward is the plain forward's arithmetic: the same bits.
    EXPECT_EQ(fused.out, plain.out) << s.name();
    expect_close<T>("fused stats, " + s.name(), fused.saved, log_sum_exp(s, in, precision), s.Dh);
    const char* names[3] = {"dq", "dk", "dv"};
    const std::vector<double>* got[3] = {&fused.dq, &fused.dk, &fused.dv};
    const std::vector<double>* want[3] = {&plain.dq, &plain.dk, &plain.dv};
    for (int i = 0; i < 3; ++i) {
      double max_ref = 0, max_err = 0;
      for (size_t e = 0; e < want[i]->size(); ++e) {
        max_ref = std::max(max_ref, std::abs((*want[i])[e]));
        max_err = std::max(max_err, std::abs((*got[i])[e] - (*want[i])[e]));
      }
      const double bound =
          precision == GemmPrecision::Bf16 ? 4 * std::ldexp(1.0, -8) : 8 * eps<T>() * std::sqrt(double(s.T * s.Dh));
      EXPECT_LE(max_err / max_ref, bound) << "fused backward " << names[i] << ", " << s.name();
    }
  }
}

// P recomputed as exp(S - lse) and D_i = dO_i . O_i instead of rowsum(P dP): the same math, fp32 rounding apart.
TEST(FusedAttention, MatchesPlainAttention) {
  expect_fused_matches_plain<float>(GemmPrecision::Fp32);
  expect_fused_matches_plain<double>(GemmPrecision::Fp32);
}

// Under bf16 GEMMs both forms read their products' operands rounded; a probability within fp32 rounding of a
// bf16 boundary can round either way in the backward's P^T dO, so the bound is bf16's.
TEST(FusedAttention, MatchesPlainAttentionUnderBf16Gemms) { expect_fused_matches_plain<float>(GemmPrecision::Bf16); }

TEST(FusedAttention, BackwardMatchesFiniteDifferences) {
  const int64_t B = 2, T = 6, H = 2, Dh = 4, n = B * T * H * Dh;
  Backend& b = conformance::reference();  // host memory: the ops take these vectors' pointers
  Ops<double>& o = b.ops<double>();
  auto q = testing::random_vector(n, 3, "q"), k = testing::random_vector(n, 3, "k"),
       v = testing::random_vector(n, 3, "v");
  const auto r = testing::random_vector(n, 3, "r");
  std::vector<double> out(n), stats(B * H * T), dq(n), dk(n), dv(n);
  auto objective = [&] {
    o.attention_forward_fused({.shape = {B, T, H, Dh},
                               .q = q.data(),
                               .k = k.data(),
                               .v = v.data(),
                               .out = out.data(),
                               .stats = stats.data()});
    return testing::dot(r, out.data());
  };
  objective();
  o.attention_backward_fused({.shape = {B, T, H, Dh},
                              .q = q.data(),
                              .k = k.data(),
                              .v = v.data(),
                              .out = out.data(),
                              .stats = stats.data(),
                              .dout = r.data(),
                              .dq = dq.data(),
                              .dk = dk.data(),
                              .dv = dv.data()});
  testing::expect_gradient_matches("fused attention dq", q, dq, objective);
  testing::expect_gradient_matches("fused attention dk", k, dk, objective);
  testing::expect_gradient_matches("fused attention dv", v, dv, objective);
  // The first position attends only to itself: its statistic is its own scaled score.
  double self = 0;
  for (int64_t c = 0; c < Dh; ++c) self += q[size_t(c)] * k[size_t(c)];
  EXPECT_NEAR(stats[0], self / std::sqrt(double(Dh)), 1e-15);
}

// The layer on the fused form: no (T, T) memory, the statistics kept instead; the same output bits (the forward
// is the plain one's arithmetic) and the same gradients within fp32 rounding of double. With grouped-query
// attention (Hkv < H) the key/value heads' gradients (N, Hkv Dh) each take scratch in both forms.
void check_fused_layer(int64_t H, int64_t Hkv) {
  SCOPED_TRACE(std::to_string(H) + " heads, " + std::to_string(Hkv) + " key/value heads");
  const int64_t B = 2, T = 7, D = 12, N = B * T, kv_grads = Hkv < H ? 2 * N * Hkv * (D / H) : 0;
  auto plain_backend = make_cpu_backend(1), fused_backend = make_cpu_backend(1);
  fused_backend->ops<double>().set_fused_attention(true);
  MhaAttention<double> plain(*plain_backend, D, H, T, 2, TpShard{}, Hkv),
      fused(*fused_backend, D, H, T, 2, TpShard{}, Hkv);
  EXPECT_EQ(fused.activation_size(N), 4 * N * D + N * H);
  EXPECT_EQ(fused.scratch_size(N), 4 * N * D + kv_grads);
  EXPECT_EQ(plain.activation_size(N), 4 * N * D + B * H * T * T);
  EXPECT_EQ(plain.scratch_size(N), 4 * N * D + T * T + kv_grads);
  ParamTable table;
  plain.register_params(table, "attn");
  ParamTable fused_table;
  fused.register_params(fused_table, "attn");
  std::vector<double> params(table.numel()), plain_grads(table.numel(), 0.0), fused_grads(table.numel(), 0.0);
  table.initialize(params.data(), 5);
  for (double& p : params) p *= 25;  // O(1) projections so that the softmax is far from uniform
  plain.bind(table, params.data(), plain_grads.data());
  fused.bind(fused_table, params.data(), fused_grads.data());
  const auto x = testing::random_vector(N * D, 5, "x"), dy = testing::random_vector(N * D, 5, "dy");
  std::vector<double> y_plain(N * D, 0.0), y_fused(N * D, 0.0), dx_plain(N * D), dx_fused(N * D);
  std::vector<double> acts_plain(plain.activation_size(N)), acts_fused(fused.activation_size(N));
  std::vector<double> scratch_plain(plain.scratch_size(N)), scratch_fused(fused.scratch_size(N));
  plain.forward(x.data(), y_plain.data(), acts_plain.data(), scratch_plain.data(), B);
  fused.forward(x.data(), y_fused.data(), acts_fused.data(), scratch_fused.data(), B);
  EXPECT_EQ(y_plain, y_fused);
  plain.backward(x.data(), dy.data(), dx_plain.data(), acts_plain.data(), scratch_plain.data(), B);
  fused.backward(x.data(), dy.data(), dx_fused.data(), acts_fused.data(), scratch_fused.data(), B);
  expect_close<double>("layer dx", dx_fused, dx_plain, N * D);
  expect_close<double>("layer parameter gradients", fused_grads, plain_grads, N * D);
}

TEST(FusedAttention, LayerUsesItWhereTheBackendSaysSoAndMatchesThePlainLayer) {
  check_fused_layer(3, 3);
  check_fused_layer(3, 1);
  check_fused_layer(6, 2);
}

// Under bf16 GEMMs the layer rounds x, dy and dq, dk, dv once each and its GEMMs read the rounded copies
// (MhaAttention::set_keep_input): keeping x rounded in its activations (half of x's memory; the caller need not
// keep x, Attention::keeps_input; its producer may write it there, held_input) or rounding it again in backward
// gives the same bits, and in fp32 nothing is held. Its q, k, v and output are kept held rounded either way (half
// of their 4 N D, after a pad of sizes::kMhaHeldPad elements in which they start at a 256-byte boundary).
void check_held_layer(int64_t H, int64_t Hkv) {
  SCOPED_TRACE(std::to_string(H) + " heads, " + std::to_string(Hkv) + " key/value heads");
  const int64_t B = 2, T = 7, D = 12, N = B * T, Dkv = Hkv * (D / H);
  auto backend = make_cpu_backend(1);
  MhaAttention<float> kept(*backend, D, H, T, 2, TpShard{}, Hkv), again(*backend, D, H, T, 2, TpShard{}, Hkv),
      fp32(*backend, D, H, T, 2, TpShard{}, Hkv);
  kept.set_precision(GemmPrecision::Bf16), again.set_precision(GemmPrecision::Bf16), again.set_keep_input(false);
  EXPECT_TRUE(kept.keeps_input());
  EXPECT_FALSE(again.keeps_input());
  EXPECT_FALSE(fp32.keeps_input());
  const int64_t held_tensors = 4 * N * D / 2 + int64_t(sizes::kMhaHeldPad);
  EXPECT_EQ(kept.activation_size(N), fp32.activation_size(N) - 4 * N * D + held_tensors + N * D / 2);
  EXPECT_EQ(again.activation_size(N), fp32.activation_size(N) - 4 * N * D + held_tensors);
  EXPECT_EQ(kept.scratch_size(N), fp32.scratch_size(N) + N * (D + D + 2 * Dkv) / 2);
  ParamTable table;
  kept.register_params(table, "attn");
  ParamTable again_table;
  again.register_params(again_table, "attn");
  std::vector<float> params(table.numel()), kept_grads(table.numel(), 0.0f), again_grads(table.numel(), 0.0f);
  table.initialize(params.data(), 5);
  kept.bind(table, params.data(), kept_grads.data());
  again.bind(again_table, params.data(), again_grads.data());
  std::vector<float> x(N * D), dy(N * D);
  const auto xd = testing::random_vector(N * D, 5, "x"), dyd = testing::random_vector(N * D, 5, "dy");
  for (int64_t i = 0; i < N * D; ++i) x[size_t(i)] = float(xd[size_t(i)]), dy[size_t(i)] = float(dyd[size_t(i)]);
  std::vector<float> y_kept(N * D, 0.0f), y_again(N * D, 0.0f), dx_kept(N * D), dx_again(N * D);
  std::vector<float> acts_kept(kept.activation_size(N)), acts_again(again.activation_size(N));
  std::vector<float> scratch_kept(kept.scratch_size(N)), scratch_again(again.scratch_size(N));
  kept.forward(x.data(), y_kept.data(), acts_kept.data(), scratch_kept.data(), B);
  again.forward(x.data(), y_again.data(), acts_again.data(), scratch_again.data(), B);
  EXPECT_EQ(y_kept, y_again);
  EXPECT_EQ(again.held_input(acts_again.data(), N), nullptr) << "keeps no input";
  // Its producer writing the input held (as the model's norm does) and forward given none: the same bits.
  std::vector<float> y_given(N * D, 0.0f), acts_given(kept.activation_size(N));
  Rounded<float>* held = kept.held_input(acts_given.data(), N);
  ASSERT_NE(held, nullptr);
  backend->ops<float>().round_values(x.data(), held, N * D);
  kept.forward(nullptr, y_given.data(), acts_given.data(), scratch_kept.data(), B);
  EXPECT_EQ(y_given, y_kept);
  const Rounded<float>* held_kept = kept.held_input(acts_kept.data(), N);
  EXPECT_TRUE(std::equal(held, held + N * D, held_kept, [](bf16 a, bf16 b) { return a.bits == b.bits; }));
  kept.backward(nullptr, dy.data(), dx_kept.data(), acts_kept.data(), scratch_kept.data(), B);  // x not needed
  again.backward(x.data(), dy.data(), dx_again.data(), acts_again.data(), scratch_again.data(), B);
  EXPECT_EQ(dx_kept, dx_again);
  EXPECT_EQ(kept_grads, again_grads);
}

TEST(FusedAttention, LayerHoldsItsGemmOperandsRoundedUnderBf16Gemms) {
  check_held_layer(3, 3);
  check_held_layer(6, 2);
}

// ---- cuDNN on the CUDA backend -------------------------------------------------------------------------

// |got - ref| against bf16's unit round-off u = 2^-8: the outputs are written in bf16 (u/2 each) and the
// probabilities rounded to bf16 for the second products (u/2 each, averaged over a row), so the relative L2 error
// stays near u; any single element within 8 u of the largest.
void expect_bf16_close(const std::string& what, const std::vector<double>& got, const std::vector<double>& ref) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  const double u = std::ldexp(1.0, -8);
  double max_ref = 0, max_err = 0, err2 = 0, ref2 = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    ASSERT_TRUE(std::isfinite(got[i])) << what << ": non-finite at " << i;
    const double e = got[i] - ref[i];
    max_ref = std::max(max_ref, std::abs(ref[i])), max_err = std::max(max_err, std::abs(e));
    err2 += e * e, ref2 += ref[i] * ref[i];
  }
  EXPECT_LE(std::sqrt(err2 / ref2), 2 * u) << what << " (relative L2 error)";
  EXPECT_LE(max_err / max_ref, 8 * u) << what << " (largest error over the largest value)";
}

void expect_cudnn_matches_cpu(const Shape& s) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "this machine has no CUDA device; bench/device_check.sh runs this";
  auto cuda = make_cuda_backend(0);
  Ops<float>& o = cuda->ops<float>();
  // No fallback here: the check is that cuDNN's fused attention ran.
  ASSERT_TRUE(o.fused_attention_supported({s.B, s.T, s.H, s.Dh, GemmPrecision::Bf16}))
      << "cuDNN refused fused attention for " << s.name() << " (see its message on stderr)";
  const Inputs in = random_inputs(s);
  const Outputs got = run_fused<float>(*cuda, s, in, GemmPrecision::Bf16);
  auto cpu = make_cpu_backend(0);
  const Outputs ref = run_fused<float>(*cpu, s, in, GemmPrecision::Bf16);
  expect_bf16_close("cudnn out, " + s.name(), got.out, ref.out);
  expect_close<float>("cudnn stats, " + s.name(), got.saved, ref.saved, s.T);
  expect_bf16_close("cudnn dq, " + s.name(), got.dq, ref.dq);
  expect_bf16_close("cudnn dk, " + s.name(), got.dk, ref.dk);
  expect_bf16_close("cudnn dv, " + s.name(), got.dv, ref.dv);
}

TEST(FusedAttention, CudnnMatchesCpuReferenceOnSmallShapes) {
  expect_cudnn_matches_cpu({2, 128, 4, 64});
  expect_cudnn_matches_cpu({1, 1024, 2, 128});
}

// Mixtral's attention: sequence 4096, 32 heads of 128.
TEST(FusedAttention, CudnnMatchesCpuReferenceOnMixtralShape) { expect_cudnn_matches_cpu({1, 4096, 32, 128}); }

}  // namespace
}  // namespace moe
