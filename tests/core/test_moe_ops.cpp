// The op conformance suite, MoE and optimizer ops: grouped GEMM, Gumbel noise, row softmax and sigmoid,
// row top-k (with the router's tie rule), gather, scatter-add, combine, row dots, the router's backward (gate
// weights, losses and scores, against the CPU reference in double), the dispatch plan's capacity, reroute, fallback
// rows and permutation and a part of it (exact), the AdamW update.
// Every backend, fp32 and fp64, data through the backend's buffers, against references written
// from the definitions in double; index results (top-k) compare exactly.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <numeric>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "tests/core/conformance.h"

namespace moe::conformance {
namespace {

template <typename T>
void grouped_gemm_cases(Backend& b) {
  const int64_t G = int64_t(kExpertOffsets.size()) - 1, rows = kExpertOffsets.back(), N = 24, K = 17;
  for (int mode = 0; mode < 3; ++mode) {  // A B, A B^T, A^T B (weight gradients)
    const bool ta = mode == 2, tb = mode == 1;
    const auto A = randn(rows * K, "gA"), B = randn(ta ? rows * N : G * K * N, "gB");
    const auto C = randn(ta ? G * K * N : rows * N, "gC");
    std::vector<double> ref = C;
    for (int64_t g = 0; g < G; ++g)
      for (int64_t r = kExpertOffsets[size_t(g)]; r < kExpertOffsets[size_t(g + 1)]; ++r)
        for (int64_t i = 0; i < (ta ? K : 1); ++i)
          for (int64_t n = 0; n < N; ++n) {
            if (!ta) {  // C[r, n] = 0.5 sum_k A[r, k] B_g[k, n] + 0.25 C[r, n]
              double s = 0;
              for (int64_t k = 0; k < K; ++k)
                s += A[size_t(r * K + k)] * B[size_t(g * K * N + (tb ? n * K + k : k * N + n))];
              ref[size_t(r * N + n)] = 0.5 * s + 0.25 * C[size_t(r * N + n)];
            } else {  // C_g[i, n] accumulates 0.5 A[r, i] B[r, n] (beta applied below)
              ref[size_t(g * K * N + i * N + n)] += 0.5 * A[size_t(r * K + i)] * B[size_t(r * N + n)];
            }
          }
    if (ta)  // beta 0.25 on groups that have rows; empty groups are skipped, their C untouched
      for (int64_t g = 0; g < G; ++g)
        if (kExpertOffsets[size_t(g + 1)] > kExpertOffsets[size_t(g)])
          for (int64_t i = 0; i < K * N; ++i) ref[size_t(g * K * N + i)] -= 0.75 * C[size_t(g * K * N + i)];
    Buffer a = put<T>(b, A), bb = put<T>(b, B), c = put<T>(b, C);
    b.ops<T>().grouped_gemm({.trans_a = ta,
                             .trans_b = tb,
                             .groups = G,
                             .row_offset = kExpertOffsets.data(),
                             .N = N,
                             .K = K,
                             .alpha = T(0.5),
                             .A = a.data<T>(),
                             .B = bb.data<T>(),
                             .beta = T(0.25),
                             .C = c.data<T>()});
    expect_close<T>("grouped gemm mode " + std::to_string(mode), get<T>(b, c), ref, ta ? 21 : K);
  }
}

TEST_P(Conformance, GroupedGemm) {
  grouped_gemm_cases<float>(backend());
  grouped_gemm_cases<double>(backend());
}

// The routed experts' SwiGLU MLPs, forward and backward, over the same expert blocks, against the reference in
// double; the weight gradients accumulate onto what is there.
template <typename T>
void expert_mlp_cases(Backend& b) {
  Backend& r = reference();
  const int64_t G = int64_t(kExpertOffsets.size()) - 1, rows = kExpertOffsets.back(), D = 12, F = 20;
  const auto X = randn(rows * D, "mx"), DY = randn(rows * D, "mdy"), W13 = randn(G * D * 2 * F, "w13", 0.3),
             W2 = randn(G * F * D, "w2", 0.3), DW13 = randn(G * D * 2 * F, "dw13"), DW2 = randn(G * F * D, "dw");
  auto run = [&](Backend& be, auto zero) {
    using U = decltype(zero);
    constexpr DType t = dtype_of<U>();
    Buffer x = put<U>(be, X), dy = put<U>(be, DY), w13 = put<U>(be, W13), w2 = put<U>(be, W2);
    Buffer dw13 = put<U>(be, DW13), dw2 = put<U>(be, DW2);
    Buffer ab = be.allocate(t, rows * 2 * F), h = be.allocate(t, rows * F), y = be.allocate(t, rows * D),
           dh = be.allocate(t, rows * F), dab = be.allocate(t, rows * 2 * F), dx = be.allocate(t, rows * D);
    const typename Ops<U>::ExpertMlp e{
        G, kExpertOffsets.data(), D, F, w13.data<U>(), w2.data<U>(), dw13.data<U>(), dw2.data<U>()};
    Ops<U>& o = be.ops<U>();
    o.expert_mlp_forward(e, x.data<U>(), ab.data<U>(), h.data<U>(), y.data<U>());
    o.expert_mlp_backward(e, x.data<U>(), ab.data<U>(), h.data<U>(), dy.data<U>(), dh.data<U>(), dab.data<U>(),
                          dx.data<U>());
    return std::array<std::vector<double>, 5>{get<U>(be, h), get<U>(be, y), get<U>(be, dx), get<U>(be, dw13),
                                              get<U>(be, dw2)};
  };
  const auto got = run(b, T(0)), ref = run(r, 0.0);
  const char* names[5] = {"expert mlp h", "expert mlp y", "expert mlp dx", "expert mlp dw13", "expert mlp dw2"};
  const int64_t lengths[5] = {D, F, 2 * F, 21, 21};  // the longest reduction behind each
  for (int i = 0; i < 5; ++i) expect_close<T>(names[i], got[size_t(i)], ref[size_t(i)], lengths[i]);
}

TEST_P(Conformance, ExpertMlp) {
  expert_mlp_cases<float>(backend());
  expert_mlp_cases<double>(backend());
}

TEST_P(Conformance, GumbelNoiseIsThePhiloxStream) {
  const RngStream rng(7, "moe.router.gumbel.layer1");
  const int64_t n = 1000;
  Buffer out = backend().allocate(DType::F64, n);
  backend().ops<float>().gumbel_noise(rng.key, 3, 500, out.data<double>(), n);
  const std::vector<double> got = backend().download<double>(out);
  const bool reference_backend = GetParam().name == "cpu";
  for (int64_t i = 0; i < n; ++i) {
    const double want = rng.gumbel(3, uint64_t(500 + i));
    if (reference_backend) {
      ASSERT_EQ(got[size_t(i)], want) << i;
    } else {
      ASSERT_LE(std::abs(got[size_t(i)] - want), gumbel_agreement_bound(want)) << i << ": " << got[size_t(i)];
    }
  }
}

// The bound covers a log that is 2 ulp off in either direction at each of the two logs (CUDA's double log against
// glibc's), over the Philox stream and the uniforms where -log(-log(u)) is most sensitive (u near 0, near 1 and
// near 1/e, where the outer log's argument is 1), and is tight enough to see anything more.
double shifted(double x, int ulps) {
  for (int i = 0; i < std::abs(ulps); ++i) x = std::nextafter(x, ulps > 0 ? INFINITY : -INFINITY);
  return x;
}

TEST(GumbelAgreement, BoundCoversTwoUlpInEachLog) {
  const RngStream rng(11, "moe.router.gumbel.layer0");
  std::vector<double> uniforms = {
      std::ldexp(1.0, -53),     1e-300,  0.5, std::exp(-1.0), std::nextafter(std::exp(-1.0), 1.0),
      1 - std::ldexp(1.0, -53), 1 - 1e-9};
  for (uint64_t i = 0; i < 20000; ++i) uniforms.push_back(rng.uniform(1, i));
  for (double u : uniforms) {
    const double exact = -std::log(-std::log(u));
    for (int inner = -2; inner <= 2; ++inner)
      for (int outer = -2; outer <= 2; ++outer) {
        const double g = shifted(-std::log(-shifted(std::log(u), inner)), outer);
        ASSERT_LE(std::abs(g - exact), gumbel_agreement_bound(exact)) << "u " << u << ", " << inner << ", " << outer;
      }
    EXPECT_LT(gumbel_agreement_bound(exact), 1e-14 * std::max(1.0, std::abs(exact)));
  }
}

template <typename T>
void score_cases(Backend& b) {
  const int64_t N = 13, E = 7;
  const double tau = 0.7;
  const auto Z = randn(N * E, "z", 3.0), noise = randn(N * E, "noise");
  std::vector<double> soft(size_t(N * E)), sig(size_t(N * E));
  for (int64_t n = 0; n < N; ++n) {
    double m = -INFINITY, s = 0;
    std::vector<double> z(static_cast<size_t>(E));
    for (int64_t e = 0; e < E; ++e) z[size_t(e)] = (double(T(Z[size_t(n * E + e)])) + noise[size_t(n * E + e)]) / tau;
    for (double v : z) m = std::max(m, v);
    for (double v : z) s += std::exp(v - m);
    for (int64_t e = 0; e < E; ++e) {
      soft[size_t(n * E + e)] = std::exp(z[size_t(e)] - m) / s;
      sig[size_t(n * E + e)] = 1.0 / (1.0 + std::exp(-z[size_t(e)]));
    }
  }
  Buffer z = put<T>(b, Z), nz = b.upload(noise), p = b.allocate(dtype_of<T>(), N * E);
  b.ops<T>().softmax_rows(z.data<T>(), nz.data<double>(), tau, p.data<T>(), N, E);
  expect_close<T>("softmax rows", get<T>(b, p), soft, 1);
  b.ops<T>().sigmoid_rows(z.data<T>(), nz.data<double>(), tau, p.data<T>(), N, E);
  expect_close<T>("sigmoid rows", get<T>(b, p), sig, 1);
}

TEST_P(Conformance, RowScores) {
  score_cases<float>(backend());
  score_cases<double>(backend());
}

// Brute force: a stable sort of the usable columns by key descending (ties keep the lower column).
std::vector<int32_t> reference_topk(const std::vector<double>& p, const std::vector<float>& bias,
                                    const std::vector<uint8_t>& mask, int64_t N, int64_t E, int64_t K) {
  std::vector<int32_t> out;
  for (int64_t n = 0; n < N; ++n) {
    std::vector<int32_t> cols;
    for (int32_t e = 0; e < E; ++e)
      if (mask.empty() || !mask[size_t(e)]) cols.push_back(e);
    auto key = [&](int32_t e) { return p[size_t(n * E + e)] + (bias.empty() ? 0.0 : double(bias[size_t(e)])); };
    std::stable_sort(cols.begin(), cols.end(), [&](int32_t a, int32_t c) { return key(a) > key(c); });
    for (int64_t j = 0; j < K; ++j) out.push_back(j < int64_t(cols.size()) ? cols[size_t(j)] : -1);
  }
  return out;
}

template <typename T>
void topk_cases(Backend& b) {
  const int64_t N = 29, E = 9;
  // Values on a coarse grid so that ties are common; every row exact in T.
  std::vector<double> P(static_cast<size_t>(N * E));
  const RngStream rng(3, "topk");
  for (int64_t i = 0; i < N * E; ++i) P[size_t(i)] = double(rng.below(4, uint64_t(i))) * 0.25;
  const std::vector<float> bias = {0.0f, 0.25f, 0.0f, -0.25f, 0.0f, 0.0f, 0.5f, 0.0f, 0.25f};
  const std::vector<uint8_t> mask = {0, 0, 1, 0, 0, 1, 0, 0, 1};
  Buffer p = put<T>(b, P), bs = b.upload(bias), mk = b.upload(mask);
  // K up to 8 by insertion (8: more than a masked row has), E by a partial sort.
  for (int64_t K : {int64_t(1), int64_t(3), int64_t(8), E}) {
    Buffer idx = b.allocate(DType::I32, N * K);
    b.ops<T>().topk_rows(p.data<T>(), nullptr, nullptr, idx.data<int32_t>(), N, E, K);
    EXPECT_EQ(b.download<int32_t>(idx), reference_topk(P, {}, {}, N, E, K)) << "plain, K " << K;
    b.ops<T>().topk_rows(p.data<T>(), bs.data<float>(), mk.data<uint8_t>(), idx.data<int32_t>(), N, E, K);
    EXPECT_EQ(b.download<int32_t>(idx), reference_topk(P, bias, mask, N, E, K)) << "biased and masked, K " << K;
  }
}

TEST_P(Conformance, RowTopKBreaksTiesToTheLowerIndex) {
  topk_cases<float>(backend());
  topk_cases<double>(backend());
}

template <typename T>
void row_move_cases(Backend& b) {
  const int64_t rows = 11, D = 70, N = 6, K = 2;
  const auto src = randn(rows * D, "src"), base = randn(N * D, "base"), scale = randn(rows, "scale");
  const std::vector<int32_t> index = {3, 0, 5, -1, 2, 2, 4, 1, 0, 5, 3};       // rows -> tokens in [0, N)
  const std::vector<int32_t> pick = {4, 9, -1, 0, 10, 10, 7, 3, 1, -1, 2, 6};  // (N, K) -> rows
  const auto weight = randn(N * K, "weight");
  std::vector<double> gathered(size_t(rows * D), 0.0), scattered = base, combined(size_t(N * D), 0.0);
  std::vector<double> dots(size_t(rows), 0.0);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t d = 0; d < D; ++d) {
      const int32_t i = index[size_t(r)];
      if (i < 0) continue;
      gathered[size_t(r * D + d)] = scale[size_t(r)] * base[size_t(i * D + d)];
      scattered[size_t(i * D + d)] += scale[size_t(r)] * src[size_t(r * D + d)];
      dots[size_t(r)] += base[size_t(i * D + d)] * src[size_t(r * D + d)];
    }
  for (int64_t s = 0; s < N * K; ++s)
    if (pick[size_t(s)] >= 0)
      for (int64_t d = 0; d < D; ++d)
        combined[size_t((s / K) * D + d)] += weight[size_t(s)] * src[size_t(pick[size_t(s)] * D + d)];
  Ops<T>& o = b.ops<T>();
  Buffer bs = put<T>(b, src), bb = put<T>(b, base), sc = put<T>(b, scale), w = put<T>(b, weight);
  Buffer ix = put_index(b, index), pk = put_index(b, pick), out = b.allocate(dtype_of<T>(), rows * D);
  o.gather_rows(bb.data<T>(), ix.data<int32_t>(), sc.data<T>(), out.data<T>(), rows, D);
  expect_close<T>("gather rows", get<T>(b, out), gathered, 1);
  Buffer acc = put<T>(b, base);
  o.scatter_add_rows(bs.data<T>(), ix.data<int32_t>(), sc.data<T>(), acc.data<T>(), rows, D);
  expect_close<T>("scatter-add rows", get<T>(b, acc), scattered, 3);
  Buffer comb = put<T>(b, base);  // overwritten: accumulate = false
  o.combine_rows(bs.data<T>(), pk.data<int32_t>(), w.data<T>(), comb.data<T>(), N, K, D, false);
  expect_close<T>("combine rows", get<T>(b, comb), combined, K);
  Buffer dot = b.allocate(dtype_of<T>(), rows);
  std::vector<int32_t> safe = index;
  for (int32_t& i : safe) i = std::max(i, 0);
  for (int64_t r = 0; r < rows; ++r)
    if (index[size_t(r)] < 0)
      for (int64_t d = 0; d < D; ++d) dots[size_t(r)] += base[size_t(d)] * src[size_t(r * D + d)];
  Buffer sx = put_index(b, safe);
  o.row_dots(bb.data<T>(), sx.data<int32_t>(), bs.data<T>(), dot.data<T>(), rows, D);
  expect_close<T>("row dots", get<T>(b, dot), dots, D);
}

TEST_P(Conformance, GatherScatterCombine) {
  row_move_cases<float>(backend());
  row_move_cases<double>(backend());
}

template <typename T>
void adamw_cases(Backend& b) {
  const int64_t n = 1000;
  const auto P = randn(n, "p"), G = randn(n, "g", 0.1), M = randn(n, "m", 0.01);
  auto V = randn(n, "v", 0.001);
  for (double& v : V) v = v * v;
  const typename Ops<T>::AdamWStep s{T(0.9), T(0.95), T(0.01), T(1.3), T(1e-8), T(0.001)};
  std::vector<double> p = P, m = M, v = V;
  for (int64_t i = 0; i < n; ++i) {
    const double g = double(T(G[size_t(i)]));
    m[size_t(i)] = double(s.beta1) * M[size_t(i)] + (1 - double(s.beta1)) * g;
    v[size_t(i)] = double(s.beta2) * V[size_t(i)] + (1 - double(s.beta2)) * g * g;
    p[size_t(i)] -= double(s.decay) * p[size_t(i)];
    p[size_t(i)] -= double(s.step_size) * m[size_t(i)] / (std::sqrt(v[size_t(i)] * double(s.inv_bc2)) + double(s.eps));
  }
  Buffer bp = put<T>(b, P), bg = put<T>(b, G), bm = put<T>(b, M), bv = put<T>(b, V);
  b.ops<T>().adamw_update(bp.data<T>(), bg.data<T>(), bm.data<T>(), bv.data<T>(), n, s);
  expect_close<T>("adamw params", get<T>(b, bp), p, 4);
  expect_close<T>("adamw first moment", get<T>(b, bm), m, 2);
  expect_close<T>("adamw second moment", get<T>(b, bv), v, 2);
}

TEST_P(Conformance, AdamWUpdate) {
  adamw_cases<float>(backend());
  adamw_cases<double>(backend());
}

// ---- The router's backward: each op on the backend in T against the CPU reference in double ------------

// Router-shaped inputs: scores a softmax of the logits (positive, rows summing to 1), K selections per row with
// some empty (-1), the gate weights and denominators of renormalised rows, every third one clamped.
struct RouterCase {
  static constexpr int64_t N = 37, E = 9, K = 3;
  std::vector<double> logits, scores, dp, dz, dw, gate, denom, f, noise;
  std::vector<int32_t> selected;
  std::vector<uint8_t> clamped;
  RouterCase() : logits(randn(N * E, "rz", 2.0)), dp(randn(N * E, "rdp")), dz(randn(N * E, "rdz")) {
    dw = randn(N * K, "rdw"), noise = randn(N * E, "rnoise"), f = randn(E, "rf", 0.1);
    for (double& v : f) v = std::abs(v);
    for (int64_t n = 0; n < N; ++n) {
      double m = -INFINITY, s = 0;
      for (int64_t e = 0; e < E; ++e) m = std::max(m, logits[size_t(n * E + e)]);
      for (int64_t e = 0; e < E; ++e) s += std::exp(logits[size_t(n * E + e)] - m);
      for (int64_t e = 0; e < E; ++e) scores.push_back(std::exp(logits[size_t(n * E + e)] - m) / s);
      double sum = 0;
      for (int64_t j = 0; j < K; ++j) {
        const int32_t e = (n + j * 4) % 5 == 4 ? -1 : int32_t((n * 7 + j * 2) % E);  // distinct within a row
        selected.push_back(e);
        if (e >= 0) sum += scores[size_t(n * E + e)];
      }
      clamped.push_back(n % 3 == 0);
      denom.push_back(n % 3 == 0 ? 1e-6 : sum);
      for (int64_t j = 0; j < K; ++j) {
        const int32_t e = selected[size_t(n * K + j)];
        gate.push_back(e >= 0 ? scores[size_t(n * E + e)] / denom.back() : 0.0);
      }
    }
  }
};

// Runs `op` on backend b in T over the case's buffers and returns dp, dz and the temperature's gradient.
template <typename T, typename Op>
std::vector<std::vector<double>> router_run(Backend& b, const RouterCase& c, Op op) {
  Buffer z = put<T>(b, c.logits), p = put<T>(b, c.scores), dp = put<T>(b, c.dp), dz = put<T>(b, c.dz);
  Buffer dw = put<T>(b, c.dw), gate = put<T>(b, c.gate), denom = put<T>(b, c.denom), f = put<T>(b, c.f);
  Buffer sel = put_index(b, c.selected), cl = b.upload(c.clamped), noise = b.upload(c.noise);
  Buffer tau_grad = b.upload(std::vector<double>{0.0});
  op(b.ops<T>(), z.data<T>(), p.data<T>(), dp.data<T>(), dz.data<T>(), dw.data<T>(), gate.data<T>(), denom.data<T>(),
     f.data<T>(), sel.data<int32_t>(), cl.data<uint8_t>(), noise.data<double>(), tau_grad.data<double>());
  return {get<T>(b, dp), get<T>(b, dz), b.download<double>(tau_grad)};
}

// Each of dp, dz and the temperature's gradient of `op` on the backend in T within bounds of the reference's.
template <typename T, typename Op>
void router_compare(Backend& b, const std::string& what, Op op) {
  const RouterCase c;
  const auto ref = router_run<double>(reference(), c, op), got = router_run<T>(b, c, op);
  expect_close<T>(what + " dp", got[0], ref[0], RouterCase::N);
  expect_close<T>(what + " dz", got[1], ref[1], RouterCase::N);
  expect_close<T>(what + " d log tau", got[2], ref[2], RouterCase::N * RouterCase::E);
}

template <typename T>
void router_backward_cases(Backend& b) {
  constexpr int64_t N = RouterCase::N, E = RouterCase::E, K = RouterCase::K;
  for (bool renormalised : {false, true})
    router_compare<T>(
        b, renormalised ? "renormalised gates" : "raw gates",
        [&](auto& o, auto, auto, auto* dp, auto, auto* dw, auto* gate, auto* denom, auto, auto* sel, auto* cl, auto,
            auto) { o.gate_backward(gate, sel, dw, denom, cl, renormalised, dp, N, K, E); });
  for (bool warming : {false, true}) {
    const typename Ops<T>::RouterLossGrad c{0.5, 0.01, 0.001, 0.02, 0.3, 0.12, 0.05, warming};
    router_compare<T>(
        b, warming ? "router losses (warm-up)" : "router losses",
        [&](auto& o, auto* z, auto* p, auto* dp, auto* dz, auto, auto, auto, auto* f, auto, auto, auto, auto) {
          using U = std::remove_pointer_t<decltype(dp)>;
          const typename Ops<U>::RouterLossGrad cu{c.scale,      c.coef_aux,    c.coef_z,      c.coef_entropy,
                                                   c.coef_death, c.death_floor, c.coef_warmup, c.warming};
          o.router_loss_backward(z, p, f, cu, dp, dz, N, E);
        });
  }
  for (bool sigmoid : {false, true})
    for (bool learned : {false, true})
      router_compare<T>(b,
                        std::string(sigmoid ? "sigmoid" : "softmax") + (learned ? " scores, learned tau" : " scores"),
                        [&](auto& o, auto* z, auto* p, auto* dp, auto* dz, auto, auto, auto, auto, auto, auto,
                            auto* noise, auto* tau_grad) {
                          o.score_backward(p, dp, 0.7, sigmoid, learned ? z : nullptr, learned ? noise : nullptr, 5, 20,
                                           learned ? tau_grad : nullptr, dz, N, E);
                        });
}

TEST_P(Conformance, RouterBackward) {
  router_backward_cases<float>(backend());
  router_backward_cases<double>(backend());
}

// The router's forward after the scores: the selection and its gate weights (raw and renormalised, a preference
// row cut short by masked experts, a clamped sum), the top-k fractions (exact) and the losses' sums, against the
// same arithmetic on the host and the reference in double.
template <typename T>
void router_forward_cases(Backend& b) {
  const int64_t N = 23, E = 9, K = 3, W = E;
  std::vector<double> scores = randn(N * E, "rp");
  for (double& v : scores) v = 1.0 / (1.0 + std::exp(-3 * v));
  for (int64_t e = 0; e < E; ++e) scores[size_t(5 * E + e)] = 1e-9;  // row 5: a sum under the floor
  std::vector<int32_t> preference(static_cast<size_t>(N * W));
  for (int64_t n = 0; n < N; ++n)
    for (int64_t j = 0; j < W; ++j)  // a permutation per row; rows 7 and 8 cut short after one and two experts
      preference[size_t(n * W + j)] = (n == 7 && j > 0) || (n == 8 && j > 1) ? -1 : int32_t((n * 5 + j * 4) % E);
  const auto logits = randn(N * E, "rz", 3.0);
  Buffer p = put<T>(b, scores), pref = put_index(b, preference), z = put<T>(b, logits);
  for (const bool renorm : {false, true}) {
    Buffer sel = b.allocate(DType::I32, N * K), ss = b.allocate(dtype_of<T>(), N * K),
           gate = b.allocate(dtype_of<T>(), N * K), denom = b.allocate(dtype_of<T>(), N), cl = b.allocate(DType::U8, N);
    b.ops<T>().gate_weights(p.data<T>(), pref.data<int32_t>(), W, renorm, sel.data<int32_t>(), ss.data<T>(),
                            gate.data<T>(), denom.data<T>(), cl.data<uint8_t>(), N, E, K);
    const std::vector<int32_t> got_sel = b.download<int32_t>(sel);
    const std::vector<uint8_t> got_cl = b.download<uint8_t>(cl);
    std::vector<double> want_ss, want_gate, want_denom;
    for (int64_t n = 0; n < N; ++n) {
      double sum = 0;
      for (int64_t j = 0; j < K; ++j) {
        const int32_t e = preference[size_t(n * W + j)];
        ASSERT_EQ(got_sel[size_t(n * K + j)], e) << "token " << n << " choice " << j;
        want_ss.push_back(e >= 0 ? double(T(scores[size_t(n * E + e)])) : 0.0);
        if (e >= 0) sum += double(T(scores[size_t(n * E + e)]));
      }
      const bool clamp = renorm && sum < 1e-6;
      EXPECT_EQ(got_cl[size_t(n)], clamp ? 1 : 0) << "token " << n;
      want_denom.push_back(renorm ? double(T(clamp ? 1e-6 : sum)) : 1.0);
      for (int64_t j = 0; j < K; ++j) want_gate.push_back(want_ss[size_t(n * K + j)] / want_denom.back());
    }
    EXPECT_EQ(get<T>(b, ss), want_ss) << "selected scores";
    expect_close<T>(renorm ? "renormalised gate weights" : "raw gate weights", get<T>(b, gate), want_gate, K);
    expect_close<T>("gate denominators", get<T>(b, denom), want_denom, K);
  }
  std::vector<int32_t> top(static_cast<size_t>(N * K));
  std::vector<double> want_f(static_cast<size_t>(E), 0.0);
  for (size_t i = 0; i < top.size(); ++i) top[i] = int32_t((i * i + 3) % size_t(E)), want_f[size_t(top[i])] += 1;
  for (double& f : want_f) f = double(T(T(f) / T(double(N * K))));
  Buffer t = put_index(b, top), f = b.allocate(dtype_of<T>(), E);
  b.ops<T>().expert_fractions(t.data<int32_t>(), f.data<T>(), N, K, E);
  EXPECT_EQ(get<T>(b, f), want_f) << "top-k fractions";
  Backend& r = reference();
  Buffer rp = put<double>(r, scores), rz = put<double>(r, logits);
  Buffer sums = b.allocate(DType::F64, E + 2), rsums = r.allocate(DType::F64, E + 2);
  b.ops<T>().router_loss_sums(z.data<T>(), p.data<T>(), sums.data<double>(), N, E);
  r.ops<double>().router_loss_sums(rz.data<double>(), rp.data<double>(), rsums.data<double>(), N, E);
  expect_close<T>("router losses' sums", b.download<double>(sums), r.download<double>(rsums), N * E);
}

TEST_P(Conformance, RouterForward) {
  router_forward_cases<float>(backend());
  router_forward_cases<double>(backend());
}

// The dispatch plan from its definition: slot s keeps its expert when fewer than `capacity` slots of that expert
// come before it in priority order (by_score: higher score, ties to the lower slot; else the lower slot).
std::vector<int32_t> reference_keep(const std::vector<int32_t>& selected, const std::vector<double>& score,
                                    bool by_score, int64_t capacity) {
  const size_t M = selected.size();
  std::vector<int32_t> assigned(M, -1);
  for (size_t s = 0; s < M; ++s) {
    if (selected[s] < 0) continue;
    int64_t before = 0;
    for (size_t t = 0; t < M; ++t)
      before += selected[t] == selected[s] && (by_score && score[t] != score[s] ? score[t] > score[s] : t < s);
    if (before < capacity) assigned[s] = selected[s];
  }
  return assigned;
}

// One part [lo, hi) of the permutation (a rank's tokens of a split routing group), from its definition: the part's
// own slots permuted by expert, slots in order, renumbered from lo. Empty, whole, leading, trailing and middle parts.
template <typename T>
void restrict_permutation_cases(Backend& b, const Buffer& off, const Buffer& perm, const std::vector<int32_t>& kept,
                                int64_t M, int64_t E, const std::string& what) {
  const std::vector<std::pair<int64_t, int64_t>> parts = {{0, 0}, {0, M}, {0, M / 2}, {M / 2, M}, {M / 3, 2 * M / 3}};
  for (const auto& [lo, hi] : parts) {
    std::vector<int64_t> want_off(size_t(E + 1), 0);
    std::vector<int32_t> want_perm, want_row(size_t(hi - lo), -1);
    for (int64_t e = 0; e < E; ++e) {
      for (int64_t s = lo; s < hi; ++s)
        if (kept[size_t(s)] == e)
          want_row[size_t(s - lo)] = int32_t(want_perm.size()), want_perm.push_back(int32_t(s - lo));
      want_off[size_t(e + 1)] = int64_t(want_perm.size());
    }
    want_perm.resize(size_t(hi - lo), -1);
    // Poisoned outputs: every entry must be written.
    Buffer part_off = b.upload(std::vector<int64_t>(size_t(E + 1), 77));
    Buffer part_perm = b.upload(std::vector<int32_t>(size_t(std::max<int64_t>(hi - lo, 1)), 77));
    Buffer part_row = b.upload(std::vector<int32_t>(size_t(std::max<int64_t>(hi - lo, 1)), 77));
    b.ops<T>().restrict_permutation(off.data<int64_t>(), perm.data<int32_t>(), lo, hi, part_off.data<int64_t>(),
                                    part_perm.data<int32_t>(), part_row.data<int32_t>(), M, E);
    const std::string part = what + " part [" + std::to_string(lo) + ", " + std::to_string(hi) + ")";
    EXPECT_EQ(b.download<int64_t>(part_off), want_off) << part;
    std::vector<int32_t> got_perm = b.download<int32_t>(part_perm), got_row = b.download<int32_t>(part_row);
    got_perm.resize(size_t(hi - lo)), got_row.resize(size_t(hi - lo));
    EXPECT_EQ(got_perm, want_perm) << part;
    EXPECT_EQ(got_row, want_row) << part;
  }
}

template <typename T>
void dispatch_plan_cases(Backend& b) {
  const int64_t E = 6;
  for (const int64_t M : {int64_t(0), int64_t(1), int64_t(37), int64_t(300)}) {
    std::vector<int32_t> selected(static_cast<size_t>(M));
    std::vector<double> score(static_cast<size_t>(M));
    for (int64_t s = 0; s < M; ++s) {  // expert 4 never chosen; every 7th slot empty; scores tie often, +-0 too
      const int32_t h = int32_t((s * 5 + s / 3) % 5);
      selected[size_t(s)] = s % 7 == 3 ? -1 : h == 4 ? 5 : h;
      score[size_t(s)] = s % 11 == 0 ? (s % 2 ? -0.0 : 0.0) : double(T(double((s * 13) % 9) / 8.0));
    }
    Buffer sel = put_index(b, selected), sc = put<T>(b, score);
    Buffer kept = b.allocate(DType::I32, M), off = b.allocate(DType::I64, E + 1);
    Buffer perm = b.allocate(DType::I32, M), row = b.allocate(DType::I32, M);
    Buffer token = b.allocate(DType::I32, M), gate = b.allocate(dtype_of<T>(), M);
    for (const bool by_score : {true, false})
      for (const int64_t C : {int64_t(0), int64_t(1), int64_t(9), int64_t(INT64_MAX)}) {
        const std::string what =
            "M " + std::to_string(M) + (by_score ? " by score" : " by position") + " capacity " + std::to_string(C);
        const std::vector<int32_t> want = reference_keep(selected, score, by_score, C);
        b.ops<T>().capacity_keep(sel.data<int32_t>(), sc.data<T>(), by_score, C, kept.data<int32_t>(), M, E);
        ASSERT_EQ(b.download<int32_t>(kept), want) << what;
        std::vector<int64_t> want_off(size_t(E + 1), 0);
        std::vector<int32_t> want_perm, want_row(static_cast<size_t>(M), -1);
        for (int64_t e = 0; e < E; ++e) {
          for (int64_t s = 0; s < M; ++s)
            if (want[size_t(s)] == e) want_row[size_t(s)] = int32_t(want_perm.size()), want_perm.push_back(int32_t(s));
          want_off[size_t(e + 1)] = int64_t(want_perm.size());
        }
        want_perm.resize(size_t(M), -1);
        b.ops<T>().permute_by_expert(kept.data<int32_t>(), off.data<int64_t>(), perm.data<int32_t>(),
                                     row.data<int32_t>(), M, E);
        EXPECT_EQ(b.download<int64_t>(off), want_off) << what;
        EXPECT_EQ(b.download<int32_t>(perm), want_perm) << what;
        EXPECT_EQ(b.download<int32_t>(row), want_row) << what;
        restrict_permutation_cases<T>(b, off, perm, want, M, E, what);
        // Each permuted row's token and gate weight (the scores stand for the gate weights), K of 1 to 3.
        for (const int64_t K : {int64_t(1), int64_t(2), int64_t(3)}) {
          std::vector<int32_t> want_token(static_cast<size_t>(M), -1);
          std::vector<T> want_gate(static_cast<size_t>(M), T(0));
          for (int64_t r = 0; r < M; ++r)
            if (want_perm[size_t(r)] >= 0)
              want_token[size_t(r)] = want_perm[size_t(r)] / int32_t(K),
              want_gate[size_t(r)] = T(score[size_t(want_perm[size_t(r)])]);
          b.ops<T>().permuted_rows(perm.data<int32_t>(), sc.data<T>(), K, token.data<int32_t>(), gate.data<T>(), M);
          EXPECT_EQ(b.download<int32_t>(token), want_token) << what << " K " << K;
          EXPECT_EQ(b.download<T>(gate), want_gate) << what << " K " << K;
        }
      }
  }
}

TEST_P(Conformance, DispatchPlanCapacityAndPermutation) {  // its parts, the permuted rows' tokens and gates
  dispatch_plan_cases<float>(backend());
  dispatch_plan_cases<double>(backend());
}

// Preference rows of N tokens over E = 6 experts, best first: expert 4 masked (never in a row), two tokens of three
// preferring experts 0 then 1 or 3 (so that those overflow while others have room), every 5th token with a single
// usable expert, -1 after the last; and scores (N K) that tie often, +-0 too.
struct Preferences {
  int64_t N, K, W = 6;
  std::vector<int32_t> rows;
  std::vector<double> score;
};
Preferences preferences(int64_t N, int64_t K) {
  Preferences p{N, K};
  p.rows.assign(size_t(N * p.W), -1);
  p.score.resize(size_t(N * K));
  for (int64_t n = 0; n < N; ++n) {
    std::vector<int32_t> usable = {0, 1, 2, 3, 5};
    std::rotate(usable.begin(), usable.begin() + (n % 3 == 0 ? (n / 3) % 5 : 0), usable.end());
    if (n % 3 == 1) std::swap(usable[1], usable[3]);
    const int64_t length = n % 5 == 2 ? 1 : 5;
    for (int64_t c = 0; c < length; ++c) p.rows[size_t(n * p.W + c)] = usable[size_t(c)];
  }
  for (int64_t s = 0; s < N * K; ++s)
    p.score[size_t(s)] = s % 11 == 0 ? (s % 2 ? -0.0 : 0.0) : double(float(double((s * 7) % 5) / 4.0));
  return p;
}

std::vector<int32_t> selected_of(const Preferences& p) {
  std::vector<int32_t> selected(size_t(p.N * p.K));
  for (int64_t s = 0; s < p.N * p.K; ++s) selected[size_t(s)] = p.rows[size_t((s / p.K) * p.W + s % p.K)];
  return selected;
}

// Reroute from its definition: the overflowed slots (selected, unassigned) in priority order, one after another,
// each to the first expert down its row with room that its token neither selected nor was assigned.
int64_t reference_reroute(const Preferences& p, bool by_score, int64_t capacity, std::vector<int32_t>& assigned) {
  const std::vector<int32_t> selected = selected_of(p);
  std::vector<int64_t> load(6, 0);
  std::vector<int32_t> order;
  for (int64_t s = 0; s < p.N * p.K; ++s) {
    if (assigned[size_t(s)] >= 0) ++load[size_t(assigned[size_t(s)])];
    if (selected[size_t(s)] >= 0 && assigned[size_t(s)] < 0) order.push_back(int32_t(s));
  }
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    const double x = p.score[size_t(a)], y = p.score[size_t(b)];
    return by_score && x != y ? x > y : a < b;
  });
  int64_t moved = 0;
  for (const int32_t s : order) {
    const int64_t n = s / p.K;
    for (int64_t c = 0; c < p.W; ++c) {
      const int32_t e = p.rows[size_t(n * p.W + c)];
      if (e < 0) break;
      bool taken = load[size_t(e)] >= capacity;
      for (int64_t j = 0; j < p.K; ++j)
        taken |= assigned[size_t(n * p.K + j)] == e || selected[size_t(n * p.K + j)] == e;
      if (taken) continue;
      assigned[size_t(s)] = e, ++load[size_t(e)], ++moved;
      break;
    }
  }
  return moved;
}

template <typename T>
void reroute_cases(Backend& b) {
  for (const int64_t N : {int64_t(0), int64_t(1), int64_t(23), int64_t(150)})
    for (const int64_t K : {int64_t(1), int64_t(2), int64_t(3)}) {
      const Preferences p = preferences(N, K);
      const int64_t M = N * K;
      const std::vector<int32_t> selected = selected_of(p);
      Buffer rows = put_index(b, p.rows), sc = put<T>(b, p.score), sel = put_index(b, selected);
      Buffer kept = b.allocate(DType::I32, M), count = b.allocate(DType::I64, 1);
      for (const bool by_score : {true, false})
        for (const int64_t C : {int64_t(0), int64_t(1), int64_t(4), int64_t(40), int64_t(INT64_MAX)}) {
          const std::string what = "N " + std::to_string(N) + " K " + std::to_string(K) +
                                   (by_score ? " by score" : " by position") + " capacity " + std::to_string(C);
          std::vector<int32_t> want = reference_keep(selected, p.score, by_score, C);
          const int64_t moved = reference_reroute(p, by_score, C, want);
          b.ops<T>().capacity_keep(sel.data<int32_t>(), sc.data<T>(), by_score, C, kept.data<int32_t>(), M, 6);
          b.ops<T>().reroute_overflow(rows.data<int32_t>(), p.W, sc.data<T>(), by_score, C, kept.data<int32_t>(),
                                      count.data<int64_t>(), N, K, 6);
          ASSERT_EQ(b.download<int32_t>(kept), want) << what;
          EXPECT_EQ(b.download<int64_t>(count), std::vector<int64_t>{moved}) << what;
          if (N == 150 && C == 40) {
            EXPECT_GT(moved, 0) << what << ": a case that reroutes";
          }
        }
    }
}

TEST_P(Conformance, DispatchPlanReroute) {
  reroute_cases<float>(backend());
  reroute_cases<double>(backend());
}

// The fallback's rows from their definition, over every slot that is selected and not assigned.
template <typename T>
void fallback_rows_cases(Backend& b) {
  for (const int64_t N : {int64_t(0), int64_t(1), int64_t(23), int64_t(150)})
    for (const int64_t K : {int64_t(1), int64_t(2), int64_t(3)}) {
      const Preferences p = preferences(N, K);
      const int64_t M = N * K;
      const std::vector<int32_t> selected = selected_of(p);
      const std::vector<double> gate = randn(M, "fallback gate");
      Buffer sel = put_index(b, selected), g = put<T>(b, gate);
      Buffer token = b.allocate(DType::I32, N), weight = b.allocate(dtype_of<T>(), N);
      Buffer source = b.allocate(DType::I32, M), slot = b.allocate(DType::I32, M);
      Buffer count = b.allocate(DType::I64, 2);
      for (const int64_t C : {int64_t(0), int64_t(2), int64_t(INT64_MAX)}) {
        const std::string what =
            "N " + std::to_string(N) + " K " + std::to_string(K) + " capacity " + std::to_string(C);
        const std::vector<int32_t> assigned = reference_keep(selected, p.score, true, C);
        std::vector<int32_t> want_token(size_t(N), -1), want_source(size_t(M), -1), want_slot(size_t(M), -1);
        std::vector<T> want_weight(size_t(N), T(0));
        int64_t tokens = 0, slots = 0;
        for (int64_t n = 0; n < N; ++n) {
          double w = 0;
          bool any = false;
          for (int64_t j = 0; j < K; ++j) {
            const int64_t s = n * K + j;
            if (selected[size_t(s)] < 0 || assigned[size_t(s)] >= 0) continue;
            w += double(T(gate[size_t(s)])), any = true;
            want_source[size_t(slots)] = int32_t(tokens), want_slot[size_t(slots++)] = int32_t(s);
          }
          if (any) want_token[size_t(tokens)] = int32_t(n), want_weight[size_t(tokens++)] = T(w);
        }
        Buffer a = put_index(b, assigned);
        b.ops<T>().fallback_rows(sel.data<int32_t>(), a.data<int32_t>(), g.data<T>(), K, token.data<int32_t>(),
                                 weight.data<T>(), source.data<int32_t>(), slot.data<int32_t>(), count.data<int64_t>(),
                                 N);
        EXPECT_EQ(b.download<int64_t>(count), (std::vector<int64_t>{tokens, slots})) << what;
        EXPECT_EQ(b.download<int32_t>(token), want_token) << what;
        EXPECT_EQ(b.download<T>(weight), want_weight) << what;
        EXPECT_EQ(b.download<int32_t>(source), want_source) << what;
        EXPECT_EQ(b.download<int32_t>(slot), want_slot) << what;
        if (N == 150 && K > 1 && C == 2) {
          EXPECT_GT(slots, tokens) << what << ": tokens with several fallback slots";
        }
      }
    }
}

TEST_P(Conformance, DispatchPlanFallbackRows) {
  fallback_rows_cases<float>(backend());
  fallback_rows_cases<double>(backend());
}

INSTANTIATE_TEST_SUITE_P(Backends, Conformance, ::testing::ValuesIn(backends()),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace moe::conformance

namespace moe {
namespace {
// Philox-4x32-10 against the known-answer vectors of its authors (Random123's kat_vectors): every backend's
// random numbers (Gumbel noise, dropout masks, data order) rest on it.
TEST(Philox, KnownAnswerVectors) {
  EXPECT_EQ(philox4x32_10({0, 0, 0, 0}, {0, 0}),
            (Philox4x32Counter{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}));
  EXPECT_EQ(philox4x32_10({~0u, ~0u, ~0u, ~0u}, {~0u, ~0u}),
            (Philox4x32Counter{0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}));
  EXPECT_EQ(philox4x32_10({0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}, {0xa4093822u, 0x299f31d0u}),
            (Philox4x32Counter{0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}));
}
}  // namespace
}  // namespace moe
