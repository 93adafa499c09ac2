// The MoE layer on every backend against the CPU's: for the same parameters and inputs, the same experts
// chosen, the same assignments dropped, rerouted or sent to the dense fallback, the same statistics, and outputs
// and gradients within fp32 reduction-order tolerance (docs/model.md: routing is a pure function of the
// scores, which are computed in double from fp32 logits; Gumbel noise comes from the same Philox streams).
// Without a GPU the other backend is the strict CPU device; bench/device_check.sh runs it on a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "core/backend/cuda_backend.h"
#include "core/backend/memory_check.h"
#include "core/moe_layer.h"
#include "core/params.h"
#include "core/philox.h"

namespace moe {
namespace {

// One layer with its parameters, gradients, activations and scratch in one backend's memory.
struct Layer {
  Backend& backend;
  MoeLayer<float> moe;
  ParamTable table;
  Buffer params, grads, acts, scratch;
  Layer(Backend& b, const MoeSettings& s, const std::vector<float>& host_params, int64_t N) : backend(b), moe(b, s) {
    moe.register_params(table, "moe");
    params = b.upload(host_params);
    grads = b.allocate(DType::F32, table.numel());
    moe.bind(table, params.data<float>(), grads.data<float>());
    acts = b.allocate(DType::F32, moe.activation_size(N));
    scratch = b.allocate(DType::F32, moe.scratch_size(N));
  }
};

struct Outcome {
  std::vector<int32_t> selected, assigned;
  std::vector<SlotFate> fate;
  RouterStepStats stats;
  std::vector<float> y, dx, grads;
};

Outcome run(Backend& b, const MoeSettings& s, const std::vector<float>& params, const std::vector<float>& x,
            const std::vector<float>& dy, int64_t N) {
  Layer l(b, s, params, N);
  FfnContext ctx;
  ctx.training = true, ctx.seed = 11, ctx.step = 4, ctx.router_loss_scale = 0.5;
  l.moe.set_context(ctx);
  l.moe.reset_stats();
  Buffer bx = b.upload(x), bdy = b.upload(dy), by = b.allocate(DType::F32, int64_t(x.size())),
         bdx = b.allocate(DType::F32, int64_t(x.size()));
  l.moe.forward(bx.data<float>(), by.data<float>(), l.acts.data<float>(), N);
  l.moe.backward(bx.data<float>(), bdy.data<float>(), bdx.data<float>(), l.acts.data<float>(), l.scratch.data<float>(),
                 N);
  Outcome o;
  o.selected = l.moe.selected_expert(), o.assigned = l.moe.assigned_expert(), o.fate = l.moe.slot_fate();
  o.stats = *l.moe.router_stats();
  o.y = b.download<float>(by), o.dx = b.download<float>(bdx), o.grads = b.download<float>(l.grads);
  return o;
}

double relative_error(const std::vector<float>& got, const std::vector<float>& ref) {
  double err = 0, scale = 0;
  for (size_t i = 0; i < ref.size(); ++i)
    err = std::max(err, double(std::abs(got[i] - ref[i]))), scale = std::max(scale, double(std::abs(ref[i])));
  return err / (scale + 1e-30);
}

// Routing is a pure function of the logits, but an fp32 GEMM on another backend sums in another order, so a
// near-tie at a top-k or capacity boundary could flip (docs/gpu.md, review finding 21). The test's router weights
// and inputs are therefore quantised so that every logit is exact in fp32 whatever the order: x = a / 16 and
// Wg = b / 64 with integers |a|, |b| <= 32 make each product a multiple of 2^-10 of magnitude <= 1, and every
// partial sum of D = 64 of them a multiple of 2^-10 of magnitude <= 2^6, which fp32's 24 bits hold exactly. What
// remains differs between backends by a few ulps of double (the Gumbel noise's log, the scores' exp), far below any gap
// the noise leaves between two experts or two tokens' scores.
constexpr double kInputStep = 1.0 / 16, kRouterStep = 1.0 / 64;
float quantised(double v, double step) { return float(std::clamp(std::nearbyint(v / step), -32.0, 32.0) * step); }

TEST(MoeAcrossBackends, QuantisedRouterInputsGiveExactLogitsInAnySummationOrder) {
  const int64_t D = 64, E = 8, N = 512;
  const RngStream rng(5, "moe backends");
  std::vector<double> x(size_t(N * D)), w(size_t(D * E));
  for (size_t i = 0; i < x.size(); ++i) x[i] = quantised(rng.normal(i, 0), kInputStep);
  for (size_t i = 0; i < w.size(); ++i) w[i] = quantised(0.02 * 8 * rng.normal(i, 2), kRouterStep);
  // Every partial sum, in any order, is a sum of a subset of the products: bounded by the sum of their magnitudes,
  // and a multiple of the products' grid.
  const double grid = kInputStep * kRouterStep;
  for (int64_t n = 0; n < N; ++n)
    for (int64_t e = 0; e < E; ++e) {
      double magnitude = 0;
      for (int64_t d = 0; d < D; ++d) {
        const double product = x[size_t(n * D + d)] * w[size_t(d * E + e)];
        ASSERT_EQ(product / grid, std::nearbyint(product / grid));
        magnitude += std::abs(product);
      }
      ASSERT_LT(magnitude / grid, double(1 << 24)) << "token " << n << ", expert " << e;
    }
}

TEST(MoeAcrossBackends, RoutesIdenticallyAndComputesWithinTolerance) {
  // Without a device the strict CPU device stands in (core/backend/memory_check.h), so that the test itself runs
  // here before a GPU runs it.
  const std::unique_ptr<Backend> cpu = make_cpu_backend(0),
                                 cuda = cuda_device_count() > 0 ? make_cuda_backend(0) : make_memory_check_backend(0);
  for (Overflow overflow : {Overflow::Drop, Overflow::Reroute, Overflow::Dense, Overflow::RerouteDense}) {
    MoeSettings s;
    s.d_model = 64, s.num_experts = 8, s.top_k = 2, s.expert_hidden = 96, s.layers_total = 4, s.shared_experts = 1;
    s.fallback_hidden = 32, s.noise = RouterNoise::Gumbel, s.capacity_factor = 0.75, s.overflow = overflow;
    s.coef_aux = 0.01, s.coef_z = 0.001, s.coef_entropy = 0.01;
    const int64_t N = 512;
    ParamTable table;
    MoeLayer<float>(*cpu, s).register_params(table, "moe");
    std::vector<float> params(size_t(table.numel()));
    table.initialize(params.data(), 3);
    const RngStream rng(5, "moe backends");
    // The router's weights and the inputs quantised as the test above proves exact.
    const ParamSpec& router = table.find("moe.router.weight");
    for (int64_t i = 0; i < router.numel; ++i)
      params[size_t(router.offset + i)] = quantised(0.02 * 8 * rng.normal(uint64_t(i), 2), kRouterStep);
    std::vector<float> x(size_t(N * s.d_model)), dy(x.size());
    for (size_t i = 0; i < x.size(); ++i)
      x[i] = quantised(rng.normal(i, 0), kInputStep), dy[i] = float(rng.normal(i, 1));
    const Outcome ref = run(*cpu, s, params, x, dy, N), got = run(*cuda, s, params, x, dy, N);
    SCOPED_TRACE("overflow " + std::to_string(int(overflow)));
    EXPECT_EQ(got.selected, ref.selected);
    EXPECT_EQ(got.assigned, ref.assigned);
    EXPECT_TRUE(got.fate == ref.fate);
    EXPECT_EQ(got.stats.tokens_per_expert, ref.stats.tokens_per_expert);
    EXPECT_EQ(got.stats.dropped, ref.stats.dropped);
    EXPECT_EQ(got.stats.rerouted, ref.stats.rerouted);
    EXPECT_EQ(got.stats.fallback, ref.stats.fallback);
    // The statistics, which the backend's plan counts from its offsets and counts, are the slots' fates.
    for (const Outcome* o : {&ref, &got}) {
      const auto fates = [&](SlotFate f) { return int64_t(std::count(o->fate.begin(), o->fate.end(), f)); };
      EXPECT_EQ(o->stats.dropped, fates(SlotFate::Dropped));
      EXPECT_EQ(o->stats.rerouted, fates(SlotFate::Rerouted));
      EXPECT_EQ(o->stats.fallback, fates(SlotFate::Fallback));
    }
    EXPECT_GT(ref.stats.dropped + ref.stats.rerouted + ref.stats.fallback, 0) << "capacity 0.75 overflows";
    EXPECT_NEAR(got.stats.aux, ref.stats.aux, 1e-5 * std::max(1.0, std::abs(ref.stats.aux)));
    // fp32 sums of up to d_model + expert_hidden terms in another order.
    EXPECT_LE(relative_error(got.y, ref.y), 1e-5);
    EXPECT_LE(relative_error(got.dx, ref.dx), 1e-5);
    EXPECT_LE(relative_error(got.grads, ref.grads), 1e-5);
  }
}

}  // namespace
}  // namespace moe
