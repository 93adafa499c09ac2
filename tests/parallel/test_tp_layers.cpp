// Tensor-parallel layers (parallel/tp_layers.h) in a whole model, in double precision: a model split over
// the tensor-parallel group (the world: 2 or 4 ranks), with and without sequence parallelism, gives the
// serial model's loss, router losses and routing, and after the trainer's sum of partial gradients over
// tp, the serial model's gradients block by block; its backward matches central differences of the
// distributed forward. The MoE layer is the stressed one (capacity dropping with reroute or the dense
// fallback, Gumbel noise, a shared expert, every router loss), its routing group split over the tp ranks.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "../core/moe_test_settings.h"
#include "core/model.h"
#include "core/moe_layer.h"
#include "parallel/mpi_communicator.h"
#include "parallel/process_groups.h"
#include "parallel/self_communicator.h"
#include "parallel/tp_layers.h"

namespace moe {
namespace {

const ModelShape kShape{256, 16, 2, 4, 24};  // vocab, d_model, layers, heads, ffn_hidden
// Grouped-query attention: 8 heads reading 4 key/value heads, so at tp 4 a rank's 2 query heads read its 1.
const ModelShape kGqaShape{256, 16, 2, 8, 24, 4};
constexpr int64_t kSeq = 8, kBatch = 2;

struct Built {
  std::unique_ptr<Model<double>> model;
  std::unique_ptr<CommunicatorTokenGroup> gather;
};

// Layer 0 dense, layer 1 MoE; over `tp` (one rank: the serial model). expert_tp: the MoE layer's experts,
// shared expert and fallback split by hidden width over tp, instead of its routing group by tokens.
Built build(Backend& backend, Communicator& tp, bool sequence_parallel, Overflow overflow,
            RecomputeSpec recompute = Recompute::None, bool expert_tp = false, const ModelShape& shape = kShape) {
  const TpContext ctx{&tp, sequence_parallel};
  const int64_t expert_ranks = expert_tp ? tp.size() : 1;
  const MoeSettingsOf moe = [overflow, expert_ranks](int64_t l) -> std::optional<MoeSettings> {
    if (l == 0) return std::nullopt;
    MoeSettings s = test::stressed_moe_settings(kShape, l);
    s.overflow = overflow, s.fallback_hidden = 8;
    s.expert_tp = expert_ranks;
    return s;
  };
  Built b;
  // Two micro-batch slots (the tests use the first), so that full recompute's one shared set saves memory.
  b.model = std::make_unique<Model<double>>(
      backend, ModelOptions<double>{.shape = shape,
                                    .seq_len = kSeq,
                                    .max_batch = kBatch,
                                    .recompute = recompute,
                                    .ffn_factory = tp_ffn_factory<double>(backend, ctx, shape, moe),
                                    .num_slots = 2,
                                    .attention_factory = tp_attention_factory<double>(backend, ctx, shape, kSeq),
                                    .tp = tensor_parallel_layout<double>(backend, ctx, shape)});
  b.gather = std::make_unique<CommunicatorTokenGroup>(tp);
  moe_layer_of(b.model->ffn(1))->set_token_group(b.gather.get());
  b.model->init_params(11);
  b.model->set_context(true, 3, 0, 0.5, 5);
  return b;
}

std::vector<int32_t> tokens() {
  std::vector<int32_t> t(size_t(kBatch * (kSeq + 1)));
  for (size_t i = 0; i < t.size(); ++i) t[i] = int32_t((i * 37 + 11) % 256);
  return t;
}

// Gradients as the trainer has them before the optimizer: partial ones summed over tp; expert tensors whole
// on every rank (each rank's tokens) summed too, as the expert-data-parallel reduction does (blocks of their
// hidden width are not: each rank holds its own).
void finish_gradients(Model<double>& m, Communicator& tp) {
  reduce_partial_over_tp(m.table(), m.grads(), tp);
  for (const ParamSpec& spec : m.table().specs())
    if (spec.expert() && spec.split2.axis < 0) tp.allreduce_sum(m.grads() + spec.offset, spec.numel);
}

void check_against_serial(bool sequence_parallel, Overflow overflow, bool expert_tp = false,
                          const ModelShape& shape = kShape) {
  auto tp = MpiCommunicator::world();
  const std::unique_ptr<Backend> backend = make_cpu_backend(1);
  SelfCommunicator one("tp");
  Built serial = build(*backend, one, false, overflow, Recompute::None, false, shape),
        split = build(*backend, *tp, sequence_parallel, overflow, Recompute::None, expert_tp, shape);
  const std::vector<int32_t> t = tokens();
  const double want = serial.model->forward(t.data(), kBatch), got = split.model->forward(t.data(), kBatch);
  EXPECT_NEAR(got, want, 1e-11 * std::abs(want));
  EXPECT_NEAR(split.model->last_router_loss(), serial.model->last_router_loss(), 1e-12);
  const auto& a = *moe_layer_of(serial.model->ffn(1))->router_stats();
  const auto& b = *moe_layer_of(split.model->ffn(1))->router_stats();
  EXPECT_EQ(a.tokens_per_expert, b.tokens_per_expert);
  EXPECT_EQ(a.dropped, b.dropped);
  EXPECT_EQ(a.rerouted, b.rerouted);
  EXPECT_EQ(a.fallback, b.fallback);
  EXPECT_GT(a.dropped + a.rerouted + a.fallback, 0) << "capacity must overflow for the test to mean something";
  serial.model->zero_grads(), split.model->zero_grads();
  serial.model->backward(0.01), split.model->backward(0.01);
  finish_gradients(*split.model, *tp);
  for (const ParamSpec& spec : split.model->table().specs()) {
    const ParamSpec& whole = serial.model->table().find(spec.name);
    double diff = 0, norm = 0;
    for (int64_t i = 0; i < spec.numel; ++i) {
      const double g = split.model->grads()[spec.offset + i],
                   w = serial.model->grads()[whole.offset + spec.global_index(i)];
      diff += (g - w) * (g - w), norm += w * w;
    }
    EXPECT_LE(std::sqrt(diff), 1e-10 * (1 + std::sqrt(norm))) << spec.name << " on rank " << tp->rank();
  }
}

TEST(TensorParallelModel, SequenceParallelEqualsSerial) { check_against_serial(true, Overflow::Reroute); }
TEST(TensorParallelModel, WithoutSequenceParallelismEqualsSerial) { check_against_serial(false, Overflow::Reroute); }
TEST(TensorParallelModel, DenseFallbackEqualsSerial) { check_against_serial(true, Overflow::Dense); }
// Dropped overflow: the split group plans on the backend (Ops::restrict_permutation takes this rank's part).
TEST(TensorParallelModel, CapacityDroppingPlannedOnTheBackendEqualsSerial) {
  check_against_serial(true, Overflow::Drop);
  check_against_serial(false, Overflow::Drop);
  check_against_serial(true, Overflow::Drop, true);
}
// Each rank's query heads read the key/value heads it holds: Wk, Wv split by key/value heads.
TEST(TensorParallelModel, GroupedQueryAttentionEqualsSerial) {
  check_against_serial(true, Overflow::Reroute, false, kGqaShape);
  check_against_serial(false, Overflow::Dense, false, kGqaShape);
}
TEST(TensorParallelModel, ExpertsSplitByHiddenWidthEqualSerial) {
  check_against_serial(true, Overflow::Reroute, true);
  check_against_serial(false, Overflow::Dense, true);
}

// One MoE layer whose routing group is split over the tp ranks, forwarded one at a time, against the same layer
// over the whole group: the routing it keeps (read back on demand where the backend planned) is the whole group's
// selection and its own tokens' slots of the whole plan, the experts that compute them and their fates; dropped
// overflow plans on the backend (Ops::restrict_permutation), rerouting and the dense fallback on the host
// (restrict_plan).
TEST(TensorParallelMoe, SplitGroupKeepsItsPartOfTheWholePlan) {
  auto tp = MpiCommunicator::world();
  const std::unique_ptr<Backend> backend = make_cpu_backend(1);
  const int64_t P = tp->size(), n = 6, G = n * P, D = kShape.d_model, K = 2;
  CommunicatorTokenGroup group(*tp);
  for (const Overflow overflow : {Overflow::Drop, Overflow::Reroute, Overflow::Dense}) {
    MoeSettings s = test::stressed_moe_settings(kShape, 1);
    s.overflow = overflow, s.fallback_hidden = 8;
    MoeSettings own = s;
    own.token_shards = P, own.token_shard = tp->rank();
    MoeLayer<double> whole(*backend, s), split(*backend, own);
    split.set_token_group(&group);
    ParamTable tw, ts;
    whole.register_params(tw, "moe"), split.register_params(ts, "moe");
    std::vector<double> pw(size_t(tw.numel())), gw(pw.size()), ps(size_t(ts.numel())), gs(ps.size());
    tw.initialize(pw.data(), 7), ts.initialize(ps.data(), 7);
    for (std::vector<double>* p : {&pw, &ps})
      for (double& v : *p) v *= 8;  // routing far from uniform
    whole.bind(tw, pw.data(), gw.data()), split.bind(ts, ps.data(), gs.data());
    FfnContext ctx;
    ctx.training = true, ctx.seed = 5, ctx.step = 3, ctx.router_loss_scale = 0.5;
    whole.set_context(ctx), split.set_context(ctx);
    std::vector<double> x(size_t(G * D)), y(x.size()), ys(size_t(n * D));
    for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(double(i) * 0.7);
    std::vector<double> aw(size_t(whole.activation_size(G))), as(size_t(split.activation_size(n)));
    whole.forward(x.data(), y.data(), aw.data(), G);
    split.forward(x.data() + tp->rank() * n * D, ys.data(), as.data(), n);
    const std::string what = "overflow " + std::to_string(int(overflow)) + " rank " + std::to_string(tp->rank());
    EXPECT_EQ(split.selected_expert(), whole.selected_expert()) << what;
    const auto own_part = [&](const auto& all) {
      const auto first = all.begin() + std::ptrdiff_t(tp->rank() * n * K);
      return std::vector(first, first + std::ptrdiff_t(n * K));
    };
    ASSERT_EQ(whole.assigned_expert().size(), size_t(G * K)) << what;
    EXPECT_EQ(split.assigned_expert(), own_part(whole.assigned_expert())) << what;
    EXPECT_EQ(split.slot_fate(), own_part(whole.slot_fate())) << what;
    EXPECT_NE(std::count(whole.slot_fate().begin(), whole.slot_fate().end(), SlotFate::Kept), G * K)
        << what << ": capacity must overflow for the test to mean something";
  }
}

// Recompute at tp 2 and 4 (docs/design.md): selective, full, and full of the first layer only give the
// gradients of keeping everything bit for bit, and keep less activation memory than it (full of every layer
// the least).
TEST(TensorParallelModel, RecomputeModesGiveBitwiseEqualGradients) {
  auto tp = MpiCommunicator::world();
  const std::unique_ptr<Backend> backend = make_cpu_backend(1);
  const std::vector<int32_t> t = tokens();
  auto gradients = [&](Model<double>& m) {
    m.forward(t.data(), kBatch);
    m.zero_grads();
    m.backward(0.01);
    return std::vector<double>(m.grads(), m.grads() + m.num_params());
  };
  for (bool sequence_parallel : {true, false}) {
    Built none = build(*backend, *tp, sequence_parallel, Overflow::Reroute);
    const std::vector<double> want = gradients(*none.model);
    const int64_t kept = none.model->activation_bytes();
    int64_t least = kept;
    for (const RecomputeSpec& spec :
         {RecomputeSpec(Recompute::Selective), RecomputeSpec(Recompute::Full, 1), RecomputeSpec(Recompute::Full)}) {
      Built b = build(*backend, *tp, sequence_parallel, Overflow::Reroute, spec);
      const std::vector<double> got = gradients(*b.model);
      ASSERT_EQ(got.size(), want.size());
      EXPECT_EQ(0, std::memcmp(got.data(), want.data(), want.size() * sizeof(double)))
          << "recompute mode " << int(spec.mode) << " of " << spec.layers << " layers, sequence parallel "
          << sequence_parallel << ", rank " << tp->rank();
      EXPECT_LT(b.model->activation_bytes(), kept) << "recompute mode " << int(spec.mode) << " of " << spec.layers;
      least = std::min(least, b.model->activation_bytes());
      if (spec.mode == Recompute::Full && spec.layers < 0) {
        EXPECT_EQ(b.model->activation_bytes(), least);
      }
    }
  }
}

// d(loss)/d(w) of a few elements of the model's kinds of tensor (blocks of split ones, replicated ones)
// against central differences of the distributed forward.
TEST(TensorParallelModel, BackwardMatchesFiniteDifferences) {
  auto tp = MpiCommunicator::world();
  const std::unique_ptr<Backend> backend = make_cpu_backend(1);
  Built b = build(*backend, *tp, true, Overflow::Drop);
  Model<double>& m = *b.model;
  const std::vector<int32_t> t = tokens();
  const double scale = 1.0 / double(kBatch * kSeq);
  m.forward(t.data(), kBatch);
  m.zero_grads();
  m.backward(scale);
  finish_gradients(m, *tp);
  for (const char* name : {"embed.weight", "layers.0.attn.wq", "layers.0.attn.wo", "layers.0.ffn.w13",
                           "layers.0.ffn.w2", "layers.1.attn_norm.gain", "layers.1.ffn.router.weight", "head.weight"}) {
    const ParamSpec& spec = m.table().find(name);
    for (int64_t i = 0; i < spec.numel; i += spec.numel / 3 + 1) {
      // A block's element: its owner perturbs it (each rank's turn in order); a replicated tensor's:
      // every rank its copy. Every rank then runs the distributed forward.
      const bool split = spec.split.group == ParamGroup::TensorParallel;
      double numeric = 0;
      for (int owner = 0; owner < (split ? tp->size() : 1); ++owner) {
        const bool mine = !split || owner == tp->rank();
        double* w = m.params() + spec.offset + i;
        const double keep = *w, h = 1e-5;
        double loss[2];
        for (int side = 0; side < 2; ++side) {
          if (mine) *w = keep + (side ? -h : h);
          loss[side] = m.forward(t.data(), kBatch) * scale + m.last_router_loss() * 0.5;
        }
        if (mine) *w = keep;
        const double d = (loss[0] - loss[1]) / (2 * h);
        if (mine) numeric = d;
      }
      const double analytic = m.grads()[spec.offset + i];
      EXPECT_NEAR(analytic, numeric, 1e-6 * (1 + std::abs(numeric))) << name << "[" << i << "] rank " << tp->rank();
    }
  }
}

}  // namespace
}  // namespace moe
