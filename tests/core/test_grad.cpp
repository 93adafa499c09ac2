// Finite-difference gradient checks (double precision) for every op's backward, the dense MLP, and
// the whole model; and the gradient-accumulation contract of docs/design.md "Conventions".
#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "core/backend/ops.h"
#include "core/ffn.h"
#include "core/mla_attention.h"
#include "core/model.h"
#include "grad_check.h"
#include "tests/core/test_backend.h"

namespace moe {
namespace {

using testing::dot;
using testing::expect_gradient_matches;
using testing::random_vector;

Ops<double>& ops() { return test_backend().ops<double>(); }

TEST(GradCheck, RmsNorm) {
  const int64_t N = 5, D = 12;
  auto x = random_vector(N * D, 1, "x");
  auto g = random_vector(D, 1, "g");
  for (double& v : g) v += 1.0;
  const auto r = random_vector(N * D, 1, "r");
  std::vector<double> y(N * D), rstd(N), dx(N * D), dg(D, 0.0);
  auto objective = [&] {
    ops().rmsnorm_forward(x.data(), g.data(), y.data(), rstd.data(), N, D);
    return dot(r, y.data());
  };
  objective();
  ops().rmsnorm_backward(x.data(), g.data(), rstd.data(), r.data(), dx.data(), dg.data(), N, D);
  expect_gradient_matches("rmsnorm dx", x, dx, objective);
  expect_gradient_matches("rmsnorm dgain", g, dg, objective);
}

// The fused forms of the residual stream: sum = x + r normalised, its backward added into the stream's gradient.
TEST(GradCheck, RmsNormResidual) {
  const int64_t N = 4, D = 10;
  auto x = random_vector(N * D, 3, "x"), res = random_vector(N * D, 3, "res"), g = random_vector(D, 3, "g");
  for (double& v : g) v += 1.0;
  const auto w = random_vector(N * D, 3, "w"), u = random_vector(N * D, 3, "u");
  std::vector<double> sum(N * D), y(N * D), rstd(N), dg(D, 0.0);
  auto objective = [&] {  // w . y + u . sum: both outputs reach the loss, as in a block
    ops().rmsnorm_forward_residual(x.data(), res.data(), sum.data(), g.data(), y.data(), rstd.data(), N, D);
    return dot(w, y.data()) + dot(u, sum.data());
  };
  objective();
  std::vector<double> dsum(u);  // the stream's gradient from after the norm, then the norm's added in
  ops().rmsnorm_backward_add(sum.data(), g.data(), rstd.data(), w.data(), dsum.data(), dg.data(), N, D);
  expect_gradient_matches("rmsnorm residual dx", x, dsum, objective);
  expect_gradient_matches("rmsnorm residual dr", res, dsum, objective);
  expect_gradient_matches("rmsnorm residual dgain", g, dg, objective);
}

TEST(GradCheck, Rope) {
  const int64_t B = 2, T = 5, H = 3, Dh = 8, n = B * T * H * Dh;
  auto x = random_vector(n, 2, "x");
  const auto r = random_vector(n, 2, "r");
  std::vector<double> y(n), dx(r);
  auto objective = [&] {
    y = x;
    ops().rope(y.data(), B, T, H, Dh, false);
    return dot(r, y.data());
  };
  ops().rope(dx.data(), B, T, H, Dh, true);
  expect_gradient_matches("rope dx", x, dx, objective);
  // The inverse undoes the forward.
  y = x;
  ops().rope(y.data(), B, T, H, Dh, false);
  ops().rope(y.data(), B, T, H, Dh, true);
  for (int64_t i = 0; i < n; ++i) EXPECT_NEAR(y[i], x[i], 1e-14);
}

TEST(GradCheck, Attention) {
  const int64_t B = 2, T = 6, H = 2, Dh = 4, n = B * T * H * Dh;
  auto q = random_vector(n, 3, "q"), k = random_vector(n, 3, "k"), v = random_vector(n, 3, "v");
  const auto r = random_vector(n, 3, "r");
  std::vector<double> out(n), probs(B * H * T * T), dq(n), dk(n), dv(n), scratch(T * T);
  auto objective = [&] {
    ops().attention_forward({.shape = {B, T, H, Dh},
                             .q = q.data(),
                             .k = k.data(),
                             .v = v.data(),
                             .out = out.data(),
                             .probs = probs.data()});
    return dot(r, out.data());
  };
  objective();
  ops().attention_backward({.shape = {B, T, H, Dh},
                            .q = q.data(),
                            .k = k.data(),
                            .v = v.data(),
                            .probs = probs.data(),
                            .dout = r.data(),
                            .dq = dq.data(),
                            .dk = dk.data(),
                            .dv = dv.data(),
                            .scratch = scratch.data()});
  expect_gradient_matches("attention dq", q, dq, objective);
  expect_gradient_matches("attention dk", k, dk, objective);
  expect_gradient_matches("attention dv", v, dv, objective);
  // Causality: the first position attends only to itself.
  for (int64_t j = 1; j < T; ++j) EXPECT_EQ(probs[j], 0.0);
  EXPECT_DOUBLE_EQ(probs[0], 1.0);
}

TEST(GradCheck, SwiGlu) {
  // Rows of [a | b] (the halves of x W13), h = silu(a) * b.
  const int64_t rows = 5, F = 10;
  auto ab = random_vector(rows * 2 * F, 4, "ab", 2.0);
  const auto r = random_vector(rows * F, 4, "r");
  std::vector<double> h(size_t(rows * F)), dab(size_t(rows * 2 * F));
  auto objective = [&] {
    ops().swiglu_forward(ab.data(), h.data(), rows, F);
    return dot(r, h.data());
  };
  ops().swiglu_backward(ab.data(), r.data(), dab.data(), rows, F);
  expect_gradient_matches("swiglu [da | db]", ab, dab, objective);
}

TEST(GradCheck, CrossEntropy) {
  const int64_t N = 4, V = 9;
  auto z = random_vector(N * V, 5, "z", 3.0);
  const std::vector<int32_t> targets = {0, 8, 3, 3};
  std::vector<double> losses(N), dz(N * V);
  const double scale = 0.25;
  auto objective = [&] {
    ops().cross_entropy_forward(z.data(), targets.data(), losses.data(), N, V);
    double s = 0;
    for (double l : losses) s += l;
    return scale * s;
  };
  ops().cross_entropy_backward(z.data(), targets.data(), scale, dz.data(), N, V);
  expect_gradient_matches("cross-entropy dlogits", z, dz, objective);
}

TEST(GradCheck, Embedding) {
  const int64_t N = 7, D = 5, V = 4;
  auto table = random_vector(V * D, 6, "E");
  const std::vector<int32_t> tokens = {0, 3, 3, 1, 0, 2, 3};
  const auto r = random_vector(N * D, 6, "r");
  std::vector<double> out(N * D), dtable(V * D, 0.0);
  auto objective = [&] {
    ops().embedding_forward(tokens.data(), table.data(), 0, V, out.data(), N, D);
    return dot(r, out.data());
  };
  ops().embedding_backward(tokens.data(), r.data(), 0, V, dtable.data(), N, D);
  expect_gradient_matches("embedding dtable", table, dtable, objective);
}

// A block of the vocabulary (ids [1, 3)): tokens outside it embed to zero and leave no gradient.
TEST(GradCheck, EmbeddingBlock) {
  const int64_t N = 7, D = 5, first = 1, rows = 2;
  auto table = random_vector(rows * D, 6, "E");
  const std::vector<int32_t> tokens = {0, 3, 2, 1, 0, 2, 3};
  const auto r = random_vector(N * D, 6, "r");
  std::vector<double> out(N * D), dtable(rows * D, 0.0);
  auto objective = [&] {
    ops().embedding_forward(tokens.data(), table.data(), first, rows, out.data(), N, D);
    return dot(r, out.data());
  };
  objective();
  for (int64_t i = 0; i < N; ++i)
    for (int64_t c = 0; c < D; ++c) {
      const int64_t id = tokens[size_t(i)] - first;
      const double want = id >= 0 && id < rows ? table[size_t(id * D + c)] : 0.0;
      EXPECT_EQ(out[size_t(i * D + c)], want) << "token " << i << " column " << c;
    }
  ops().embedding_backward(tokens.data(), r.data(), first, rows, dtable.data(), N, D);
  expect_gradient_matches("embedding block dtable", table, dtable, objective);
}

TEST(GradCheck, DenseMlp) {
  const int64_t N = 6, D = 8, F = 10;
  DenseMlp<double> mlp(test_backend(), D, F, 2);
  ParamTable table;
  mlp.register_params(table, "mlp");
  std::vector<double> params(table.numel()), grads(table.numel(), 0.0);
  table.initialize(params.data(), 7);
  for (double& p : params) p *= 20;  // O(1) weights so the nonlinearity matters
  mlp.bind(table, params.data(), grads.data());
  auto x = random_vector(N * D, 7, "x");
  const auto r = random_vector(N * D, 7, "r");
  std::vector<double> y(N * D), dx(N * D), acts(mlp.activation_size(N)), scratch(mlp.scratch_size(N));
  auto objective = [&] {
    mlp.forward(x.data(), y.data(), acts.data(), N);
    return dot(r, y.data());
  };
  objective();
  mlp.backward(x.data(), r.data(), dx.data(), acts.data(), scratch.data(), N);
  expect_gradient_matches("mlp dx", x, dx, objective);
  expect_gradient_matches("mlp dparams", params, grads, objective, 80);
}

// An attention layer's dx and every parameter's gradient on B sequences of T, the projections scaled up to
// O(1) so that the softmax is far from uniform; `init` may set parameters after that (e.g. norm gains).
void check_attention_layer(const std::string& what, Attention<double>& layer, int64_t B, int64_t T, int64_t D,
                           const std::function<void(ParamTable&, std::vector<double>&)>& init = nullptr) {
  const int64_t N = B * T;
  ParamTable table;
  layer.register_params(table, "attn");
  std::vector<double> params(table.numel()), grads(table.numel(), 0.0);
  table.initialize(params.data(), 5);
  for (double& p : params) p *= 25;
  if (init) init(table, params);
  layer.bind(table, params.data(), grads.data());
  auto x = random_vector(N * D, 5, "x");
  const auto r = random_vector(N * D, 5, "r");
  std::vector<double> y(N * D), dx(N * D), acts(layer.activation_size(N)), scratch(layer.scratch_size(N));
  auto objective = [&] {
    std::fill(y.begin(), y.end(), 0.0);  // the attention adds to the residual stream
    layer.forward(x.data(), y.data(), acts.data(), scratch.data(), B);
    return dot(r, y.data());
  };
  objective();
  layer.backward(x.data(), r.data(), dx.data(), acts.data(), scratch.data(), B);
  expect_gradient_matches(what + " dx", x, dx, objective);
  for (const ParamSpec& spec : table.specs()) {
    std::vector<double> p(params.begin() + spec.offset, params.begin() + spec.offset + spec.numel);
    std::vector<double> g(grads.begin() + spec.offset, grads.begin() + spec.offset + spec.numel);
    auto obj = [&] {
      std::copy(p.begin(), p.end(), params.begin() + spec.offset);
      return objective();
    };
    expect_gradient_matches(what + " " + spec.name, p, g, obj, 20);
    std::copy(p.begin(), p.end(), params.begin() + spec.offset);
  }
}

// Multi-head latent attention (core/mla_attention.h): dx and every parameter, keeping its probabilities and
// recomputing them (selective recompute); rotary parts of 2 and 4 columns, latents narrower than the width; with
// and without the latents' RMSNorms (their gains perturbed from 1 so that a gain's gradient is checked in general);
// and without a query latent (q_rank 0: the queries projected from x).
void check_mla(bool keep_probabilities, MlaShape mla_shape) {
  const int64_t B = 2, T = 5, D = 8, H = 2;
  MlaAttention<double> mla(test_backend(), D, H, T, 2, mla_shape);
  mla.set_keep_probabilities(keep_probabilities);
  check_attention_layer("mla", mla, B, T, D, [&](ParamTable& table, std::vector<double>& params) {
    if (!mla_shape.norms) return;
    for (const char* gain : {"attn.q_norm.gain", "attn.kv_norm.gain"}) {
      if (mla_shape.q_rank == 0 && std::string(gain) == "attn.q_norm.gain") continue;  // no query latent
      const ParamSpec& spec = table.find(gain);
      const auto noise = random_vector(spec.numel, 7, gain);
      for (int64_t i = 0; i < spec.numel; ++i) params[size_t(spec.offset + i)] = 1.0 + 0.5 * noise[size_t(i)];
    }
  });
}

// Grouped-query attention (core/attention.h): H query heads reading Hkv < H key/value heads, one of them (multi-
// query) and two groups of two, probabilities kept and recomputed; Wk and Wv are (D, Hkv Dh).
TEST(GradCheck, GroupedQueryAttention) {
  struct Case {
    int64_t D, H, Hkv;
    bool keep;
  };
  for (const Case& c : {Case{12, 3, 1, true}, Case{16, 4, 2, false}, Case{16, 4, 2, true}, Case{8, 4, 1, false}}) {
    MhaAttention<double> gqa(test_backend(), c.D, c.H, 5, 2, TpShard{}, c.Hkv);
    gqa.set_keep_probabilities(c.keep);
    check_attention_layer("gqa " + std::to_string(c.H) + "/" + std::to_string(c.Hkv), gqa, 2, 5, c.D,
                          [&](ParamTable& table, std::vector<double>&) {
                            ASSERT_EQ(table.find("attn.wk").shape, (std::vector<int64_t>{c.D, c.Hkv * c.D / c.H}));
                            ASSERT_EQ(table.find("attn.wv").shape, (std::vector<int64_t>{c.D, c.Hkv * c.D / c.H}));
                          });
  }
}

TEST(GradCheck, MultiHeadLatentAttention) {
  check_mla(true, MlaShape{3, 5, 2});
  check_mla(false, MlaShape{4, 3, 4});
  check_mla(true, MlaShape{3, 5, 2, true});
  check_mla(false, MlaShape{4, 3, 4, true});
  check_mla(true, MlaShape{3, 0, 2});
  check_mla(false, MlaShape{4, 0, 4, true});
}

// The whole model: d(mean token loss)/d(every parameter tensor).
void check_model(Recompute recompute, bool mla = false, int64_t kv_heads = 0) {
  ModelShape shape{13, 8, 2, 2, 12, kv_heads};
  const int64_t T = 5, B = 3;
  typename Model<double>::AttentionFactory attention = nullptr;
  if (mla)
    attention = [&](int64_t) -> std::unique_ptr<Attention<double>> {
      return std::make_unique<MlaAttention<double>>(test_backend(), shape.d_model, shape.heads, T, shape.layers,
                                                    MlaShape{3, 4, 2});
    };
  Model<double> model(
      test_backend(),
      {.shape = shape, .seq_len = T, .max_batch = B, .recompute = recompute, .attention_factory = attention});
  model.init_params(11);
  // Leave the near-linear regime; latent attention chains two projections per side, so less is enough (and
  // keeps the central differences' truncation error below the tolerance).
  const double scale_up = mla ? 3 : 5;
  for (int64_t i = 0; i < model.num_params(); ++i) model.params()[i] *= scale_up;
  std::vector<int32_t> tokens(B * (T + 1));
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = int32_t((i * 7 + 3) % shape.vocab);
  const double scale = 1.0 / double(B * T);
  model.zero_grads();
  model.forward(tokens.data(), B);
  model.backward(scale);
  std::vector<double> analytic(model.grads(), model.grads() + model.num_params());
  std::vector<double> params(model.params(), model.params() + model.num_params());
  for (const ParamSpec& spec : model.table().specs()) {
    std::vector<double> x(params.begin() + spec.offset, params.begin() + spec.offset + spec.numel);
    std::vector<double> g(analytic.begin() + spec.offset, analytic.begin() + spec.offset + spec.numel);
    auto objective = [&] {
      std::copy(x.begin(), x.end(), model.params() + spec.offset);
      return scale * model.forward(tokens.data(), B);
    };
    expect_gradient_matches("model " + spec.name, x, g, objective, 12);
    std::copy(x.begin(), x.end(), model.params() + spec.offset);
  }
}

TEST(GradCheck, WholeModel) { check_model(Recompute::None); }
TEST(GradCheck, WholeModelWithRecompute) { check_model(Recompute::Full); }
TEST(GradCheck, WholeModelWithSelectiveRecompute) { check_model(Recompute::Selective); }
TEST(GradCheck, WholeModelWithGroupedQueryAttention) {
  check_model(Recompute::None, false, 1);
  check_model(Recompute::Selective, false, 1);
}
TEST(GradCheck, WholeModelWithLatentAttention) {
  check_model(Recompute::None, true);
  check_model(Recompute::Selective, true);
}

// docs/design.md "Conventions": parameter gradients accumulate. Two backwards give twice the gradients, up to the
// rounding of one addition per element (BLAS may fold the old value in before or after its K-blocks).
TEST(GradientContract, BackwardTwiceIsTwiceTheGradients) {
  ModelShape shape{11, 8, 2, 2, 8};
  const int64_t T = 4, B = 2;
  Model<double> model(test_backend(), {.shape = shape, .seq_len = T, .max_batch = B});
  model.init_params(3);
  std::vector<int32_t> tokens(B * (T + 1));
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = int32_t((i * 5 + 1) % shape.vocab);
  model.zero_grads();
  model.forward(tokens.data(), B);
  model.backward(0.5);
  std::vector<double> once(model.grads(), model.grads() + model.num_params());
  model.forward(tokens.data(), B);
  model.backward(0.5);
  double max_abs = 0;
  for (double g : once) max_abs = std::max(max_abs, std::abs(g));
  ASSERT_GT(max_abs, 0.0);
  for (int64_t i = 0; i < model.num_params(); ++i)
    ASSERT_NEAR(model.grads()[i], 2 * once[i], 1e-14 * max_abs) << "parameter element " << i;
}

}  // namespace
}  // namespace moe
