// The MoE layer: finite-difference gradient checks (fp64) through router, experts, shared experts and
// fallback with each loss term on and off; routing properties on random inputs; each router loss
// against an independent straightforward computation.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <set>
#include <vector>

#include "core/model.h"
#include "core/moe/dispatcher.h"
#include "core/moe_layer.h"
#include "grad_check.h"
#include "tests/core/test_backend.h"

namespace moe {
namespace {

using testing::dot;
using testing::expect_gradient_matches;
using testing::random_vector;

struct Harness {
  std::unique_ptr<MoeLayer<double>> layer;
  ParamTable table;
  std::vector<double> params, grads, acts;
  Harness(const MoeSettings& s, int64_t N, uint64_t seed, double weight_scale = 10.0) {
    layer = std::make_unique<MoeLayer<double>>(test_backend(), s);
    layer->register_params(table, "moe");
    params.assign(table.numel(), 0.0);
    grads.assign(table.numel(), 0.0);
    table.initialize(params.data(), seed);
    for (double& p : params) p *= weight_scale;  // O(1) router logits and expert activations
    layer->bind(table, params.data(), grads.data());
    acts.assign(layer->activation_size(N), 0.0);
  }
};

MoeSettings base_settings() {
  MoeSettings s;
  s.d_model = 6, s.num_experts = 4, s.top_k = 2, s.expert_hidden = 5, s.layers_total = 2;
  s.fallback_hidden = 3;
  return s;
}

// J = sum(y * r) + rs * router losses; checks d J / d (x, every parameter).
void check_gradients(const MoeSettings& s, const std::string& what, double rs = 0.5) {
  const int64_t N = 9, D = s.d_model;
  Harness h(s, N, 17);
  FfnContext ctx;
  ctx.training = true, ctx.seed = 5, ctx.step = 3, ctx.router_loss_scale = rs;
  h.layer->set_context(ctx);
  auto x = random_vector(N * D, 3, "x");
  const auto r = random_vector(N * D, 3, "r");
  std::vector<double> y(N * D), dx(N * D);
  auto objective = [&] {
    h.layer->forward(x.data(), y.data(), h.acts.data(), N);
    return dot(r, y.data()) + rs * h.layer->last_router_loss();
  };
  objective();
  h.layer->backward(x.data(), r.data(), dx.data(), h.acts.data(), nullptr, N);
  expect_gradient_matches(what + " dx", x, dx, objective, 54);
  for (const ParamSpec& spec : h.table.specs()) {
    std::vector<double> p(h.params.begin() + spec.offset, h.params.begin() + spec.offset + spec.numel);
    std::vector<double> g(h.grads.begin() + spec.offset, h.grads.begin() + spec.offset + spec.numel);
    auto obj = [&] {
      std::copy(p.begin(), p.end(), h.params.begin() + spec.offset);
      return objective();
    };
    expect_gradient_matches(what + " " + spec.name, p, g, obj, 30);
    std::copy(p.begin(), p.end(), h.params.begin() + spec.offset);
  }
}

MoeSettings with_losses(MoeSettings s) {
  s.coef_aux = 0.3, s.coef_z = 0.05, s.coef_entropy = 0.2, s.coef_death = 0.7, s.death_floor = 0.3;
  return s;
}

TEST(MoeGradCheck, SoftmaxTop2) { check_gradients(base_settings(), "softmax k2"); }
TEST(MoeGradCheck, SoftmaxTop2Losses) { check_gradients(with_losses(base_settings()), "softmax k2 losses"); }
TEST(MoeGradCheck, SoftmaxTop1Losses) {
  MoeSettings s = with_losses(base_settings());
  s.top_k = 1;
  check_gradients(s, "softmax k1 losses");
}
TEST(MoeGradCheck, SigmoidTop2Losses) {
  MoeSettings s = with_losses(base_settings());
  s.score = RouterScore::Sigmoid;
  check_gradients(s, "sigmoid k2 losses");
}
TEST(MoeGradCheck, SigmoidTop1) {
  MoeSettings s = base_settings();
  s.score = RouterScore::Sigmoid, s.top_k = 1;
  check_gradients(s, "sigmoid k1");
}
TEST(MoeGradCheck, GumbelNoiseTemperatureSharedExperts) {
  MoeSettings s = with_losses(base_settings());
  s.noise = RouterNoise::Gumbel, s.tau = 0.7, s.shared_experts = 2;
  check_gradients(s, "gumbel tau shared");
}
TEST(MoeGradCheck, CapacityDrop) {
  MoeSettings s = with_losses(base_settings());
  s.capacity_factor = 0.6;
  check_gradients(s, "capacity drop");
}
TEST(MoeGradCheck, CapacityReroute) {
  MoeSettings s = base_settings();
  s.capacity_factor = 0.8, s.overflow = Overflow::Reroute, s.drop_policy = DropPolicy::Position;
  check_gradients(s, "capacity reroute");
}
TEST(MoeGradCheck, CapacityDenseFallback) {
  MoeSettings s = with_losses(base_settings());
  s.capacity_factor = 0.6, s.overflow = Overflow::Dense;
  check_gradients(s, "capacity dense");
}
TEST(MoeGradCheck, CapacityRerouteThenDense) {
  MoeSettings s = with_losses(base_settings());
  s.capacity_factor = 0.5, s.overflow = Overflow::RerouteDense;
  check_gradients(s, "capacity reroute then dense");
}
// d/d(log tau) through the scores (and the noise, drawn again in backward) for both score functions.
TEST(MoeGradCheck, LearnedTemperature) {
  MoeSettings s = with_losses(base_settings());
  s.noise = RouterNoise::Gumbel, s.tau = 0.7, s.tau_learned = true, s.shared_experts = 1;
  check_gradients(s, "learned tau softmax");
  s.score = RouterScore::Sigmoid, s.capacity_factor = 0.6, s.overflow = Overflow::RerouteDense;
  check_gradients(s, "learned tau sigmoid cascade");
}
// The warm-up term (step 3 of 10 warm-up steps) beside the other losses, softmax and sigmoid.
TEST(MoeGradCheck, RouterWarmup) {
  MoeSettings s = with_losses(base_settings());
  s.coef_warmup = 0.5, s.warmup_steps = 10;
  check_gradients(s, "warm-up softmax");
  s.score = RouterScore::Sigmoid, s.noise = RouterNoise::Gumbel;
  check_gradients(s, "warm-up sigmoid gumbel");
}
TEST(MoeGradCheck, NoRenormalisation) {
  MoeSettings s = base_settings();
  s.normalize = false;
  check_gradients(s, "no renormalisation");
}

// ---- Routing properties on random inputs -------------------------------------------------------

struct Routed {
  std::vector<int32_t> selected, assigned;
  std::vector<SlotFate> fate;
  std::vector<double> gate, y;
  int64_t capacity;
};

Routed run(const MoeSettings& s, int64_t N, uint64_t seed, bool training = true, int64_t step = 0,
           const std::vector<float>* bias = nullptr) {
  Harness h(s, N, seed);
  if (bias) h.layer->balancing_bias() = *bias;
  FfnContext ctx;
  ctx.training = training, ctx.seed = 9, ctx.step = step;
  h.layer->set_context(ctx);
  const auto x = random_vector(N * s.d_model, seed, "x");
  Routed r;
  r.y.assign(N * s.d_model, 0.0);
  h.layer->forward(x.data(), r.y.data(), h.acts.data(), N);
  r.selected = h.layer->selected_expert(), r.assigned = h.layer->assigned_expert(), r.fate = h.layer->slot_fate();
  r.gate = h.layer->gate_weight(), r.capacity = h.layer->capacity(N);
  return r;
}

MoeSettings routing_settings(Overflow overflow, DropPolicy policy, double cf) {
  MoeSettings s;
  s.d_model = 8, s.num_experts = 6, s.top_k = 2, s.expert_hidden = 4, s.fallback_hidden = 4;
  s.overflow = overflow, s.drop_policy = policy, s.capacity_factor = cf;
  return s;
}

// One rank's dispatch and combine: a copy between two buffers, nothing at all where both sides are the same memory
// (the MoE layer's forward and backward then run on one buffer; the gradient checks above run that way).
TEST(MoeDispatch, OneRankMovesNothingWithinTheSameMemory) {
  Backend& b = test_backend();
  for (DispatcherKind kind : {DispatcherKind::AllToAll, DispatcherKind::AllGather}) {
    auto d = make_dispatcher<double>(kind, b, 4, 1);
    ExchangePlan p;
    d->plan({0, 2, 3, 3, 6}, p);
    ASSERT_EQ(p.received, 6) << d->name();
    const int64_t W = 3;
    const std::vector<double> rows = random_vector(6 * W, 7, "rows");
    Buffer a = b.upload(rows), c = b.upload(std::vector<double>(6 * W, 0.0));
    d->dispatch(p, a.data<double>(), a.data<double>(), W);
    d->combine(p, a.data<double>(), a.data<double>(), W);
    EXPECT_EQ(b.download<double>(a), rows) << d->name() << ": in place";
    d->dispatch(p, a.data<double>(), c.data<double>(), W);
    EXPECT_EQ(b.download<double>(c), rows) << d->name() << ": dispatch between buffers";
    d->combine(p, c.data<double>(), a.data<double>(), W);
    EXPECT_EQ(b.download<double>(a), rows) << d->name() << ": combine between buffers";
  }
}

TEST(MoeRouting, NoExpertAboveCapacityAndRerouteRules) {
  for (Overflow o : {Overflow::Drop, Overflow::Reroute, Overflow::Dense})
    for (DropPolicy p : {DropPolicy::Probs, DropPolicy::Position})
      for (uint64_t seed = 1; seed <= 20; ++seed) {
        const int64_t N = 40, K = 2;
        const Routed r = run(routing_settings(o, p, 0.75), N, seed);
        std::vector<int64_t> load(6, 0);
        for (int64_t slot = 0; slot < N * K; ++slot)
          if (r.assigned[slot] >= 0) ++load[r.assigned[slot]];
        for (int64_t e = 0; e < 6; ++e) ASSERT_LE(load[e], r.capacity) << "expert " << e;
        for (int64_t n = 0; n < N; ++n) {  // never twice to a token
          if (r.assigned[n * K] >= 0 && r.assigned[n * K + 1] >= 0) {
            ASSERT_NE(r.assigned[n * K], r.assigned[n * K + 1]);
          }
        }
        for (int64_t slot = 0; slot < N * K; ++slot) {
          const SlotFate f = r.fate[slot];
          if (o == Overflow::Drop) {
            ASSERT_TRUE(f == SlotFate::Kept || f == SlotFate::Dropped);
          }
          if (o == Overflow::Dense) {
            ASSERT_TRUE(f == SlotFate::Kept || f == SlotFate::Fallback);
          }
          if (f == SlotFate::Rerouted) {
            ASSERT_NE(r.assigned[slot], r.selected[slot]);
          }
          if (f == SlotFate::Kept) {
            ASSERT_EQ(r.assigned[slot], r.selected[slot]);
          }
        }
      }
}

TEST(MoeRouting, DenseFallbackTakesExactlyTheOverflow) {
  for (uint64_t seed = 1; seed <= 10; ++seed) {
    const Routed drop = run(routing_settings(Overflow::Drop, DropPolicy::Probs, 0.5), 30, seed);
    const Routed dense = run(routing_settings(Overflow::Dense, DropPolicy::Probs, 0.5), 30, seed);
    int64_t overflowed = 0;
    for (size_t slot = 0; slot < drop.fate.size(); ++slot) {
      EXPECT_EQ(drop.fate[slot] == SlotFate::Dropped, dense.fate[slot] == SlotFate::Fallback) << slot;
      overflowed += drop.fate[slot] == SlotFate::Dropped;
    }
    EXPECT_GT(overflowed, 0);
  }
}

TEST(MoeRouting, ProbsPolicyKeepsTheHighestScoresPositionTheEarliestTokens) {
  for (uint64_t seed = 1; seed <= 10; ++seed) {
    const int64_t N = 30, K = 2;
    const Routed r = run(routing_settings(Overflow::Drop, DropPolicy::Probs, 0.5), N, seed);
    // Gate weights are p / sum(selected p) per token, so compare raw p through the harness again.
    Harness h(routing_settings(Overflow::Drop, DropPolicy::Probs, 0.5), N, seed);
    FfnContext ctx;
    ctx.seed = 9;
    h.layer->set_context(ctx);
    const auto x = random_vector(N * 8, seed, "x");
    std::vector<double> y(N * 8);
    h.layer->forward(x.data(), y.data(), h.acts.data(), N);
    const double* scores = h.acts.data() + N * 6;  // acts: logits (N,E) then scores (N,E)
    for (int64_t e = 0; e < 6; ++e) {
      double min_kept = 2, max_dropped = -1;
      for (int64_t slot = 0; slot < N * K; ++slot) {
        if (r.selected[slot] != e) continue;
        const double p = scores[(slot / K) * 6 + e];
        if (r.fate[slot] == SlotFate::Kept) min_kept = std::min(min_kept, p);
        if (r.fate[slot] == SlotFate::Dropped) max_dropped = std::max(max_dropped, p);
      }
      EXPECT_GE(min_kept, max_dropped) << "expert " << e;
    }
    const Routed pos = run(routing_settings(Overflow::Drop, DropPolicy::Position, 0.5), N, seed);
    for (int64_t e = 0; e < 6; ++e) {
      int64_t last_kept = -1, first_dropped = N * K;
      for (int64_t slot = 0; slot < N * K; ++slot) {
        if (pos.selected[slot] != e) continue;
        if (pos.fate[slot] == SlotFate::Kept) last_kept = std::max(last_kept, slot);
        if (pos.fate[slot] == SlotFate::Dropped) first_dropped = std::min(first_dropped, slot);
      }
      EXPECT_LT(last_kept, first_dropped) << "expert " << e;
    }
  }
}

// The cascade ["reroute", "dense"] decides exactly what reroute alone does, except that what reroute alone
// drops goes to the dense fallback instead; nothing is dropped.
TEST(MoeRouting, CascadeReroutesThenSendsTheRestToTheFallback) {
  int64_t fallback = 0, rerouted = 0;
  for (DropPolicy p : {DropPolicy::Probs, DropPolicy::Position})
    for (uint64_t seed = 1; seed <= 10; ++seed) {
      const Routed alone = run(routing_settings(Overflow::Reroute, p, 0.4), 40, seed);
      const Routed cascade = run(routing_settings(Overflow::RerouteDense, p, 0.4), 40, seed);
      ASSERT_EQ(alone.selected, cascade.selected);
      ASSERT_EQ(alone.assigned, cascade.assigned);
      for (size_t i = 0; i < alone.fate.size(); ++i) {
        const SlotFate want = alone.fate[i] == SlotFate::Dropped ? SlotFate::Fallback : alone.fate[i];
        ASSERT_EQ(cascade.fate[i], want) << "slot " << i;
        fallback += cascade.fate[i] == SlotFate::Fallback, rerouted += cascade.fate[i] == SlotFate::Rerouted;
      }
    }
  EXPECT_GT(fallback, 0);
  EXPECT_GT(rerouted, 0);
}

// A learned temperature starts at settings.tau, moves with its parameter, and is clamped to [tau_min,
// tau_max] with no gradient there.
TEST(MoeRouting, LearnedTemperatureFollowsItsParameterWithinTheClamp) {
  MoeSettings s = with_losses(base_settings());
  s.tau = 0.5, s.tau_learned = true, s.tau_min = 0.2, s.tau_max = 2.0;
  const int64_t N = 6;
  Harness h(s, N, 3);
  const int64_t at = h.table.find("moe.tau.log_ratio").offset;
  EXPECT_EQ(h.layer->tau(), 0.5);
  h.params[at] = std::log(3.0);  // 1.5
  EXPECT_NEAR(h.layer->tau(), 1.5, 1e-15);
  h.params[at] = std::log(10.0);  // 5, clamped to 2
  EXPECT_EQ(h.layer->tau(), 2.0);
  FfnContext ctx;
  h.layer->set_context(ctx);
  const auto x = random_vector(N * s.d_model, 3, "x"), dy = random_vector(N * s.d_model, 4, "dy");
  std::vector<double> y(N * s.d_model), dx(N * s.d_model);
  h.layer->forward(x.data(), y.data(), h.acts.data(), N);
  h.layer->backward(x.data(), dy.data(), dx.data(), h.acts.data(), nullptr, N);
  EXPECT_EQ(h.grads[at], 0.0);
  h.params[at] = 0;
  h.layer->forward(x.data(), y.data(), h.acts.data(), N);
  h.layer->backward(x.data(), dy.data(), dx.data(), h.acts.data(), nullptr, N);
  EXPECT_NE(h.grads[at], 0.0);
}

TEST(MoeRouting, DroplessDropsNothing) {
  for (uint64_t seed = 1; seed <= 10; ++seed) {
    const Routed r = run(routing_settings(Overflow::Drop, DropPolicy::Probs, 0.0), 50, seed);
    for (SlotFate f : r.fate) ASSERT_EQ(f, SlotFate::Kept);
  }
}

TEST(MoeRouting, BiasSelectsButNeverWeights) {
  MoeSettings s = routing_settings(Overflow::Drop, DropPolicy::Probs, 0.0);
  s.top_k = 1;
  const int64_t N = 20;
  const Routed plain = run(s, N, 4);
  const std::vector<float> bias = {0, 0, 0, 5.0f, 0, 0};  // expert 3 wins every selection
  const Routed biased = run(s, N, 4, true, 0, &bias);
  Harness h(s, N, 4);
  FfnContext ctx;
  ctx.seed = 9;
  h.layer->set_context(ctx);
  const auto x = random_vector(N * 8, 4, "x");
  std::vector<double> y(N * 8);
  h.layer->forward(x.data(), y.data(), h.acts.data(), N);
  const double* scores = h.acts.data() + N * 6;
  int64_t changed = 0;
  for (int64_t n = 0; n < N; ++n) {
    EXPECT_EQ(biased.selected[n], 3);
    changed += plain.selected[n] != 3;
    EXPECT_DOUBLE_EQ(biased.gate[n], scores[n * 6 + 3]);  // the score, not score + bias
  }
  EXPECT_GT(changed, 0);
}

TEST(MoeRouting, EvaluationIsDeterministicAndNoiseOnlyInTraining) {
  MoeSettings s = routing_settings(Overflow::Drop, DropPolicy::Probs, 0.0);
  s.noise = RouterNoise::Gumbel, s.expert_dropout = 0.3;
  const Routed e1 = run(s, 30, 6, false, 1), e2 = run(s, 30, 6, false, 7);
  EXPECT_EQ(e1.y, e2.y);
  EXPECT_EQ(e1.selected, e2.selected);
  const Routed t1 = run(s, 30, 6, true, 1), t1b = run(s, 30, 6, true, 1), t2 = run(s, 30, 6, true, 2);
  EXPECT_EQ(t1.y, t1b.y);  // same step: same noise
  EXPECT_NE(t1.selected, t2.selected);
}

TEST(MoeRouting, ExpertDropoutMasksWholeExpertsPerStep) {
  MoeSettings s = routing_settings(Overflow::Drop, DropPolicy::Probs, 0.0);
  s.expert_dropout = 0.5;
  int64_t steps_with_mask = 0;
  for (int64_t step = 0; step < 20; ++step) {
    const Routed r = run(s, 30, 3, true, step);
    std::set<int32_t> used(r.selected.begin(), r.selected.end());
    used.erase(-1);
    steps_with_mask += used.size() < 6;
    const Routed again = run(s, 30, 3, true, step);
    EXPECT_EQ(r.selected, again.selected);
  }
  EXPECT_GT(steps_with_mask, 5);
}

// ---- Router losses against a straightforward computation -------------------------------------

TEST(MoeLosses, MatchIndependentComputation) {
  MoeSettings s = with_losses(base_settings());
  s.score = RouterScore::Softmax;
  const int64_t N = 7, E = s.num_experts, K = s.top_k, D = s.d_model;
  Harness h(s, N, 2);
  FfnContext ctx;
  ctx.training = false;  // no noise: p = softmax(z)
  h.layer->set_context(ctx);
  const auto x = random_vector(N * D, 2, "x");
  std::vector<double> y(N * D);
  h.layer->forward(x.data(), y.data(), h.acts.data(), N);
  const double* Wg = h.params.data() + h.table.find("moe.router.weight").offset;
  double aux_f[8] = {}, P[8] = {}, zl = 0, H = 0;
  for (int64_t n = 0; n < N; ++n) {
    std::vector<double> z(E), p(E);
    for (int64_t e = 0; e < E; ++e)
      for (int64_t d = 0; d < D; ++d) z[e] += x[n * D + d] * Wg[d * E + e];
    double m = *std::max_element(z.begin(), z.end()), sum = 0;
    for (int64_t e = 0; e < E; ++e) sum += std::exp(z[e] - m);
    for (int64_t e = 0; e < E; ++e) p[e] = std::exp(z[e] - m) / sum, P[e] += p[e] / N, H -= p[e] * std::log(p[e]) / N;
    zl += std::pow(m + std::log(sum), 2) / N;
    std::vector<int> idx(E);
    for (int e = 0; e < E; ++e) idx[e] = e;
    std::sort(idx.begin(), idx.end(), [&](int a, int b) { return p[a] > p[b]; });
    for (int64_t j = 0; j < K; ++j) aux_f[idx[j]] += 1.0 / double(N * K);
  }
  double aux = 0, death = 0;
  for (int64_t e = 0; e < E; ++e) aux += aux_f[e] * P[e], death += std::max(0.0, s.death_floor - P[e]);
  const double expected = s.coef_aux * E * aux + s.coef_z * zl - s.coef_entropy * H + s.coef_death * death;
  EXPECT_NEAR(h.layer->last_router_loss(), expected, 1e-12);
  // Uniform routing gives aux = coef_aux exactly (the loss's minimum, as Switch defines it).
  EXPECT_GT(s.coef_aux * E * aux, 0.0);
}

// The warm-up term against its definition, KL(uniform || P / sum P) with P the mean scores; absent once the
// warm-up steps are done and at evaluation.
TEST(MoeLosses, WarmupIsKlFromUniformOnlyDuringTheWarmupSteps) {
  MoeSettings s = base_settings();
  s.coef_warmup = 0.3, s.warmup_steps = 5, s.score = RouterScore::Sigmoid;
  const int64_t N = 7, E = s.num_experts, D = s.d_model;
  Harness h(s, N, 2);
  const auto x = random_vector(N * D, 2, "x");
  std::vector<double> y(N * D);
  const double* Wg = h.params.data() + h.table.find("moe.router.weight").offset;
  std::vector<double> P(E, 0.0);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t e = 0; e < E; ++e) {
      double z = 0;
      for (int64_t d = 0; d < D; ++d) z += x[n * D + d] * Wg[d * E + e];
      P[e] += 1.0 / (1.0 + std::exp(-z)) / double(N);
    }
  double S = 0, kl = 0;
  for (double p : P) S += p;
  for (double p : P) kl += (1.0 / double(E)) * std::log((1.0 / double(E)) / (p / S));
  for (int64_t step : {0, 4, 5, 9}) {
    FfnContext ctx;
    ctx.step = step;
    h.layer->set_context(ctx);
    h.layer->forward(x.data(), y.data(), h.acts.data(), N);
    EXPECT_NEAR(h.layer->last_router_loss(), step < 5 ? 0.3 * kl : 0.0, 1e-12) << "step " << step;
  }
  FfnContext eval;
  eval.training = false;
  h.layer->set_context(eval);
  h.layer->forward(x.data(), y.data(), h.acts.data(), N);
  EXPECT_EQ(h.layer->last_router_loss(), 0.0);
}

// The directions docs/config.md states, by gradient descent on the router alone: a positive entropy
// coefficient raises the mean routing entropy and a negative one lowers it; the death penalty raises the
// mean probability of the experts under the floor (and so lowers itself); the warm-up term evens the mean
// probabilities out.
struct RouterDescent {
  Harness h;
  std::vector<double> x, y, dy, dx;
  int64_t N;
  RouterDescent(const MoeSettings& s, int64_t n) : h(s, n, 8), x(random_vector(n * s.d_model, 8, "x")), N(n) {
    y.assign(size_t(N * s.d_model), 0.0), dy = y, dx = y;
    FfnContext ctx;
    ctx.step = 0;
    h.layer->set_context(ctx);
  }
  // The router losses now, then after `steps` steps of plain gradient descent on the router weight.
  std::pair<double, double> descend(int steps, double lr) {
    const int64_t at = h.table.find("moe.router.weight").offset, n = h.table.find("moe.router.weight").numel;
    h.layer->forward(x.data(), y.data(), h.acts.data(), N);
    const double before = h.layer->last_router_loss();
    for (int i = 0; i < steps; ++i) {
      std::fill(h.grads.begin(), h.grads.end(), 0.0);
      h.layer->forward(x.data(), y.data(), h.acts.data(), N);
      h.layer->backward(x.data(), dy.data(), dx.data(), h.acts.data(), nullptr, N);
      for (int64_t j = 0; j < n; ++j) h.params[at + j] -= lr * h.grads[at + j];
    }
    h.layer->forward(x.data(), y.data(), h.acts.data(), N);
    return {before, h.layer->last_router_loss()};
  }
  // Mean routing entropy of the last forward, from the scores it saved (after logits).
  double entropy() const {
    const int64_t E = h.layer->settings().num_experts;
    double H = 0;
    for (int64_t i = 0; i < N * E; ++i) {
      const double p = h.acts[N * E + i];
      H -= p * std::log(p) / double(N);
    }
    return H;
  }
};

TEST(MoeLossDirection, EntropyCoefficientSignSpreadsOrSharpensRouting) {
  for (double coef : {1.0, -1.0}) {
    MoeSettings s = base_settings();
    s.coef_entropy = coef;
    RouterDescent d(s, 12);
    d.descend(0, 0.0);
    const double before = d.entropy();
    d.descend(20, 0.5);
    const double after = d.entropy();
    if (coef > 0)
      EXPECT_GT(after, before + 1e-3) << "a positive moe.loss.entropy spreads routing";
    else
      EXPECT_LT(after, before - 1e-3) << "a negative moe.loss.entropy sharpens routing";
  }
}

TEST(MoeLossDirection, DeathPenaltyRaisesTheMeanProbabilityOfDyingExperts) {
  MoeSettings s = base_settings();
  s.coef_death = 1.0, s.death_floor = 0.24;  // some of the 4 mean probabilities start under 0.24
  RouterDescent d(s, 12);
  const auto [before, after] = d.descend(20, 0.2);
  EXPECT_GT(before, 0.0);
  EXPECT_LT(after, 0.5 * before);
}

TEST(MoeLossDirection, WarmupEvensOutTheMeanProbabilities) {
  MoeSettings s = base_settings();
  s.coef_warmup = 1.0, s.warmup_steps = 1;
  RouterDescent d(s, 12);
  const auto [before, after] = d.descend(20, 0.5);
  EXPECT_GT(before, 0.0);
  EXPECT_LT(after, 0.5 * before);
}

TEST(MoeLosses, AuxIsCoefWhenRoutingIsUniform) {
  MoeSettings s = base_settings();
  s.coef_aux = 0.01, s.top_k = 1;
  const int64_t N = 8;
  Harness h(s, N, 2, 0.0);  // zero weights: uniform scores
  FfnContext ctx;
  h.layer->set_context(ctx);
  std::vector<double> x(N * s.d_model, 1.0), y(N * s.d_model);
  h.layer->forward(x.data(), y.data(), h.acts.data(), N);
  // Every token picks expert 0 (ties to the lower index): f = (1,0,0,0), P = 1/4 each: aux = 0.01 * 4 * 1/4.
  EXPECT_NEAR(h.layer->last_router_loss(), 0.01, 1e-15);
}

// ---- Inside the model ----------------------------------------------------------------------------

TEST(MoeModel, WholeModelGradientAndRecomputeCountsOnce) {
  MoeSettings s = with_losses(base_settings());
  s.d_model = 8, s.layers_total = 2, s.capacity_factor = 1.0, s.noise = RouterNoise::Gumbel;
  const ModelShape shape{13, 8, 2, 2, 12};
  const int64_t T = 5, B = 2;
  for (Recompute rc : {Recompute::None, Recompute::Full}) {
    const auto ffn = [&](int64_t l) -> std::unique_ptr<FeedForward<double>> {
      if (l == 1) {
        MoeSettings ls = s;
        ls.layer = l;
        return std::make_unique<MoeLayer<double>>(test_backend(), ls);
      }
      return std::make_unique<DenseMlp<double>>(test_backend(), 8, 12, 2);
    };
    Model<double> model(test_backend(),
                        {.shape = shape, .seq_len = T, .max_batch = B, .recompute = rc, .ffn_factory = ffn});
    model.init_params(3);
    for (int64_t i = 0; i < model.num_params(); ++i) model.params()[i] *= 5;
    std::vector<int32_t> tokens(B * (T + 1));
    for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = int32_t((i * 7 + 2) % 13);
    const double scale = 1.0 / (B * T), rs = 0.5;
    model.set_context(true, 4, 0, rs, 11);
    model.zero_grads();
    model.forward(tokens.data(), B);
    model.backward(scale);
    auto* stats = model.ffn(1).router_stats();
    ASSERT_NE(stats, nullptr);
    EXPECT_EQ(stats->tokens, B * T);  // the recompute did not count again
    EXPECT_EQ(stats->groups, 1);
    std::vector<double> analytic(model.grads(), model.grads() + model.num_params());
    for (const ParamSpec& spec : model.table().specs()) {
      std::vector<double> p(model.params() + spec.offset, model.params() + spec.offset + spec.numel);
      std::vector<double> g(analytic.begin() + spec.offset, analytic.begin() + spec.offset + spec.numel);
      auto objective = [&] {
        std::copy(p.begin(), p.end(), model.params() + spec.offset);
        const double lm = model.forward(tokens.data(), B);
        return scale * lm + rs * model.last_router_loss();
      };
      expect_gradient_matches("moe model " + spec.name, p, g, objective, 10);
      std::copy(p.begin(), p.end(), model.params() + spec.offset);
    }
  }
}

// The layer's GEMM precision (ModelOptions::precision through FeedForward::set_precision) reaches its experts and
// its dense fallback but not its router: under bf16 GEMMs the router's logits and scores are the fp32 layer's bit
// for bit, the output is not.
TEST(MoePrecision, ExpertsFollowTheLayerPrecisionTheRouterStaysFp32) {
  const MoeSettings s = base_settings();
  const int64_t N = 12, D = s.d_model, E = s.num_experts;
  Harness fp32(s, N, 7), bf16(s, N, 7);
  bf16.layer->set_precision(GemmPrecision::Bf16);
  const auto x = random_vector(N * D, 4, "x");
  std::vector<double> y32(size_t(N * D)), y16(size_t(N * D));
  fp32.layer->forward(x.data(), y32.data(), fp32.acts.data(), N);
  bf16.layer->forward(x.data(), y16.data(), bf16.acts.data(), N);
  const std::vector<double> routed32(fp32.acts.begin(), fp32.acts.begin() + 2 * N * E);
  EXPECT_EQ(std::vector<double>(bf16.acts.begin(), bf16.acts.begin() + 2 * N * E), routed32) << "logits, scores";
  EXPECT_NE(y16, y32) << "the experts' GEMMs read rounded operands";
}

TEST(MoeBias, UpdateFollowsSignOfDeficit) {
  MoeLayer<float> layer(test_backend(), [] {
    MoeSettings s;
    s.d_model = 4, s.num_experts = 4, s.top_k = 1, s.expert_hidden = 4;
    return s;
  }());
  layer.update_balancing_bias({10, 2, 4, 4}, 0.5);  // mean 5
  EXPECT_EQ(layer.balancing_bias(), (std::vector<float>{-0.5f, 0.5f, 0.5f, 0.5f}));
  layer.update_balancing_bias({5, 5, 5, 5}, 0.5);
  EXPECT_EQ(layer.balancing_bias(), (std::vector<float>{-0.5f, 0.5f, 0.5f, 0.5f}));
}

// The proportional rule against its definition: b = decay * b + rate * u, u = min(mean / max(c, 1), 10) - 1,
// 0 inside the dead band.
TEST(MoeBias, ProportionalRuleWithDecayAndDeadBand) {
  MoeLayer<float> layer(test_backend(), [] {
    MoeSettings s;
    s.d_model = 4, s.num_experts = 5, s.top_k = 1, s.expert_hidden = 4;
    return s;
  }());
  const BiasBalance balance{0.1, BiasRule::Proportional, 0.9, 0.1};
  const std::vector<int64_t> counts = {10, 0, 19, 20, 1};  // mean 10
  layer.balancing_bias() = {1.0f, 1.0f, 1.0f, 1.0f, 1.0f};
  layer.update_balancing_bias(counts, balance);
  const double u[5] = {0.0, 9.0, 10.0 / 19.0 - 1.0, -0.5, 9.0};  // 10/0 counts as 10/1; 10/1 - 1 = 9
  for (size_t e = 0; e < 5; ++e) EXPECT_EQ(layer.balancing_bias()[e], float(0.9 * 1.0 + 0.1 * u[e])) << "expert " << e;
  // A ratio in the dead band moves nothing but the decay.
  layer.balancing_bias() = {0.5f, 0.5f, 0.5f, 0.5f, 0.5f};
  layer.update_balancing_bias({20, 21, 19, 20, 20}, balance);
  for (float b : layer.balancing_bias()) EXPECT_EQ(b, float(0.9 * 0.5));
}

// Adaptive capacity's decision against its rule, step by step.
TEST(AdaptiveCapacity, RaisesAfterAWindowAboveLowersAfterAWindowBelowWithinTheRange) {
  const CapacityAuto a{1.0, 1.3, 0.01, 0.001, 3, 0.2};
  CapacityControl c{1.0, 0, 0};
  c = next_capacity(c, 0.05, a), c = next_capacity(c, 0.05, a);
  EXPECT_EQ(c.factor, 1.0);
  EXPECT_EQ(c.above, 2);
  c = next_capacity(c, 0.005, a);  // between the thresholds: the run ends
  EXPECT_EQ(c.above, 0);
  for (int i = 0; i < 3; ++i) c = next_capacity(c, 0.05, a);
  EXPECT_DOUBLE_EQ(c.factor, 1.2);
  for (int i = 0; i < 3; ++i) c = next_capacity(c, 0.05, a);
  EXPECT_DOUBLE_EQ(c.factor, 1.3);  // clamped at max
  for (int i = 0; i < 2; ++i) c = next_capacity(c, 0.0, a);
  EXPECT_DOUBLE_EQ(c.factor, 1.3);
  c = next_capacity(c, 0.0, a);
  EXPECT_DOUBLE_EQ(c.factor, 1.3 - 0.2);
  for (int i = 0; i < 6; ++i) c = next_capacity(c, 0.0, a);
  EXPECT_DOUBLE_EQ(c.factor, 1.0);  // clamped at min
}

// The layer applies the factor it is given: its capacity follows.
TEST(AdaptiveCapacity, TheLayersCapacityFollowsItsControl) {
  MoeSettings s = base_settings();
  s.capacity_factor = 1.0;
  MoeLayer<double> layer(test_backend(), s);
  EXPECT_EQ(layer.capacity(16), 8);  // ceil(2 * 16 / 4 * 1.0)
  layer.capacity_control().factor = 1.5;
  layer.apply_capacity_control();
  EXPECT_EQ(layer.capacity(16), 12);
}

}  // namespace
}  // namespace moe
