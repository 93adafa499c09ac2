// The cuDNN graphs of fused attention as plain data (core/backend/cuda/attention_graph.h), without a GPU: their
// shape (uids, the bound tensors over the (B, T, H*Dh) layout, the mask, the workspace), and a small interpreter
// that runs each graph in double, op by op with each tensor's dims and strides as cuDNN reads them, against the
// CPU backend's fused attention. So the plan handed to cuDNN is known to compute causal attention and its
// gradients before any device runs it.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <limits>
#include <map>
#include <set>
#include <vector>

#include "core/backend/backend.h"
#include "core/backend/cuda/attention_graph.h"
#include "core/sizes.h"
#include "tests/core/grad_check.h"

namespace moe::cuda {
namespace {

using Index = std::array<int64_t, 4>;

// Every tensor's memory, addressed by its strides; bound tensors hold the caller's arrays.
class Interpreter {
 public:
  explicit Interpreter(const AttentionGraph& g) : g_(g) {
    for (const GraphTensor& t : g.tensors) {
      int64_t size = 1;
      for (int d = 0; d < 4; ++d) size += (t.dims[size_t(d)] - 1) * t.strides[size_t(d)];
      memory_[t.uid].assign(size_t(size), t.by_value ? double(t.value) : 0.0);
    }
  }
  std::vector<double>& memory(int64_t uid) { return memory_.at(uid); }
  void run() {
    for (const GraphOp& op : g_.ops) run(op);
  }

 private:
  double& at(int64_t uid, const Index& i) {
    const GraphTensor& t = g_.tensor(uid);
    int64_t offset = 0;
    for (int d = 0; d < 4; ++d) offset += (t.dims[size_t(d)] == 1 ? 0 : i[size_t(d)]) * t.strides[size_t(d)];
    return memory_.at(uid)[size_t(offset)];
  }
  template <typename F>
  static void each(const Index& dims, F f) {
    Index i{};
    for (i[0] = 0; i[0] < dims[0]; ++i[0])
      for (i[1] = 0; i[1] < dims[1]; ++i[1])
        for (i[2] = 0; i[2] < dims[2]; ++i[2])
          for (i[3] = 0; i[3] < dims[3]; ++i[3]) f(i);
  }
  void run(const GraphOp& op) {
    const GraphTensor& y = g_.tensor(op.output);
    switch (op.kind) {
      case GraphOpKind::Matmul: {
        const int64_t K = g_.tensor(op.inputs[0]).dims[3];
        each(y.dims, [&](const Index& i) {
          double s = 0;
          for (int64_t k = 0; k < K; ++k)
            s += at(op.inputs[0], {i[0], i[1], i[2], k}) * at(op.inputs[1], {i[0], i[1], k, i[3]});
          at(op.output, i) = s;
        });
        break;
      }
      case GraphOpKind::Pointwise:
        each(y.dims, [&](const Index& i) { at(op.output, i) = pointwise(op, i); });
        break;
      case GraphOpKind::Reduction: {
        const bool max = op.reduction == ReductionMode::Max;
        each(y.dims, [&](const Index& i) { at(op.output, i) = max ? -INFINITY : 0.0; });
        each(g_.tensor(op.inputs[0]).dims, [&](const Index& i) {
          double& out = at(op.output, i);
          const double x = at(op.inputs[0], i);
          out = max ? std::max(out, x) : out + x;
        });
        break;
      }
      case GraphOpKind::Reshape:  // the same memory read through other strides
        memory_.at(op.output) = memory_.at(op.inputs[0]);
        break;
    }
  }
  double pointwise(const GraphOp& op, const Index& i) {
    const auto in = [&](size_t k) { return at(op.inputs[k], i); };
    switch (op.pointwise) {
      case PointwiseMode::Add:
        return in(0) + in(1);
      case PointwiseMode::Sub:
        return in(0) - in(1);
      case PointwiseMode::Mul:
        return in(0) * in(1);
      case PointwiseMode::Div:
        return in(0) / in(1);
      case PointwiseMode::Exp:
        return std::exp(in(0));
      case PointwiseMode::Log:
        return std::log(in(0));
      case PointwiseMode::Identity:
        return in(0);
      case PointwiseMode::GenIndex:
        return double(i[size_t(op.axis)]);
      case PointwiseMode::CmpGe:
        return in(0) >= in(1) ? 1.0 : 0.0;
      case PointwiseMode::BinarySelect:
        return in(2) != 0 ? in(0) : in(1);
    }
    return 0;
  }

  const AttentionGraph& g_;
  std::map<int64_t, std::vector<double>> memory_;
};

const AttentionGraphShape kShape{2, 5, 3, 4, 0.5f, -std::numeric_limits<float>::infinity()};

// Uids unique; each op's inputs exist and, when virtual, were made by an earlier op; each virtual tensor made once.
void expect_well_formed(const AttentionGraph& g) {
  std::set<int64_t> uids, made;
  for (const GraphTensor& t : g.tensors) EXPECT_TRUE(uids.insert(t.uid).second) << "uid " << t.uid << " twice";
  for (const GraphOp& op : g.ops) {
    for (int64_t in : op.inputs) {
      ASSERT_TRUE(uids.count(in)) << "input " << in;
      if (g.tensor(in).is_virtual) {
        EXPECT_TRUE(made.count(in)) << "virtual " << in << " read before it is made";
      }
    }
    EXPECT_TRUE(made.insert(op.output).second) << "tensor " << op.output << " made twice";
  }
  for (const GraphTensor& t : g.tensors)
    if (t.is_virtual) {
      EXPECT_TRUE(made.count(t.uid)) << "virtual " << t.uid << " never made";
    }
}

TEST(AttentionGraph, BoundTensorsViewTheRowMajorLayout) {
  const AttentionGraph g = attention_forward_graph(kShape);
  expect_well_formed(g);
  const int64_t B = kShape.B, T = kShape.T, H = kShape.H, Dh = kShape.Dh;
  // q's (b, h, t, d) is element (b, t, h Dh + d) of (B, T, H*Dh); k enters as its transpose (b, h, d, t).
  const GraphTensor& q = g.tensor(kUidQ);
  EXPECT_EQ(q.dims, (Index{B, H, T, Dh}));
  EXPECT_EQ(q.strides, (Index{T * H * Dh, Dh, H * Dh, 1}));
  EXPECT_EQ(g.tensor(kUidK).dims, (Index{B, H, Dh, T}));
  EXPECT_EQ(g.tensor(kUidK).strides, (Index{T * H * Dh, Dh, 1, H * Dh}));
  EXPECT_EQ(g.tensor(kUidStats).dims, (Index{B, H, T, 1}));
  EXPECT_EQ(g.tensor(kUidStats).type, GraphType::Fp32);
  for (int64_t uid : {kUidQ, kUidK, kUidV, kUidO}) {
    EXPECT_FALSE(g.tensor(uid).is_virtual);
    EXPECT_EQ(g.tensor(uid).type, GraphType::Bf16);
  }
  // The mask: row and column indices generated over the scores, row >= column keeps a score.
  int gen = 0, select = 0;
  for (const GraphOp& op : g.ops) {
    gen += op.pointwise == PointwiseMode::GenIndex && op.kind == GraphOpKind::Pointwise;
    select += op.pointwise == PointwiseMode::BinarySelect && op.kind == GraphOpKind::Pointwise;
  }
  EXPECT_EQ(gen, 2);
  EXPECT_EQ(select, 1);
  EXPECT_TRUE(g.workspace.empty());
}

TEST(AttentionGraph, BackwardKeepsItsFp32PartsInAlignedWorkspace) {
  AttentionGraphShape accumulating = kShape;
  accumulating.deterministic = false;
  const AttentionGraph deterministic = attention_backward_graph(kShape);
  expect_well_formed(deterministic);
  ASSERT_EQ(deterministic.workspace.size(), 1u);  // D only: dQ written by its product directly
  EXPECT_EQ(deterministic.workspace[0].uid, kUidRowSum);
  const AttentionGraph g = attention_backward_graph(accumulating);
  expect_well_formed(g);
  ASSERT_EQ(g.workspace.size(), 2u);
  EXPECT_EQ(g.offset_of(kUidRowSum), 0);
  EXPECT_EQ(g.offset_of(kUidDQAccum) % 256, 0);
  EXPECT_GE(g.offset_of(kUidDQAccum), kShape.B * kShape.H * kShape.T * 4);
  EXPECT_EQ(g.workspace_bytes() % 256, 0);
  for (const auto& w : g.workspace) EXPECT_EQ(w.zeroed, w.uid == kUidDQAccum);
  EXPECT_EQ(g.tensor(kUidDQAccum).type, GraphType::Fp32);
  EXPECT_FALSE(g.tensor(kUidDQAccum).is_virtual);
}

// The graphs' workspace is what core/sizes.h declares for the memory estimate: none in the forward, the row sums
// and, accumulating, dQ in the backward, each padded to 256 bytes (shapes whose sizes are not multiples of 256).
TEST(AttentionGraph, WorkspaceIsWhatTheSizingDeclares) {
  for (const AttentionGraphShape& base : {kShape, AttentionGraphShape{3, 5, 3, 8, 0.35f, -1e30f, true}})
    for (const bool deterministic : {true, false}) {
      AttentionGraphShape s = base;
      s.deterministic = deterministic;
      const sizes::FusedAttentionShape a{double(s.B), double(s.T), double(s.H), double(s.Dh), deterministic};
      EXPECT_EQ(attention_forward_graph(s).workspace_bytes(), 0);
      EXPECT_EQ(attention_backward_graph(s).workspace_bytes(), int64_t(sizes::attention_backward_graph_bytes(a)))
          << "B " << s.B << " T " << s.T << " deterministic " << deterministic;
    }
}

// The compute type cudnn-frontend's SDPA nodes give each op: every matmul, reduction and arithmetic pointwise in
// fp32 (the flash engines refuse a matmul computing in anything else), generated indices in int32, the mask's
// comparison in bool. The interpreter below ignores compute types, so only this test sees them.
GraphType frontend_compute(const GraphOp& op) {
  if (op.kind != GraphOpKind::Pointwise) return GraphType::Fp32;
  if (op.pointwise == PointwiseMode::GenIndex) return GraphType::Int32;
  if (op.pointwise == PointwiseMode::CmpGe) return GraphType::Bool;
  return GraphType::Fp32;
}

TEST(AttentionGraph, EveryOpComputesInTheTypeTheFrontendGivesIt) {
  AttentionGraphShape accumulating = kShape, large{4, 4096, 32, 128, 0.088f, -1e30f};
  accumulating.deterministic = false;
  const struct {
    const char* name;
    AttentionGraph graph;
    int matmuls;  // forward: Q K^T, P V; backward: Q K^T, dV, dP, dK, dQ
  } graphs[] = {{"forward", attention_forward_graph(kShape), 2},
                {"forward at Mixtral's shape", attention_forward_graph(large), 2},
                {"deterministic backward", attention_backward_graph(kShape), 5},
                {"accumulating backward", attention_backward_graph(accumulating), 5},
                {"backward at Mixtral's shape", attention_backward_graph(large), 5}};
  for (const auto& [name, g, expected_matmuls] : graphs) {
    int matmuls = 0;
    for (size_t i = 0; i < g.ops.size(); ++i) {
      const GraphOp& op = g.ops[i];
      matmuls += op.kind == GraphOpKind::Matmul;
      EXPECT_EQ(int(op.compute), int(frontend_compute(op))) << name << ", op " << i << " (kind " << int(op.kind) << ")";
      if (op.kind == GraphOpKind::Matmul) {
        EXPECT_EQ(op.compute, GraphType::Fp32) << name << ", matmul op " << i;
      }
    }
    EXPECT_EQ(matmuls, expected_matmuls) << name;
  }
}

TEST(AttentionGraph, PlanKeysOrderByShape) {
  const AttentionPlanKey a{1, 128, 4, 64}, b{1, 128, 4, 128}, c{2, 128, 4, 64};
  EXPECT_TRUE(a < b && a < c && !(b < a));
  EXPECT_EQ(a, (AttentionPlanKey{1, 128, 4, 64}));
  std::map<AttentionPlanKey, int> cache{{a, 1}, {b, 2}, {c, 3}};
  EXPECT_EQ(cache.at(AttentionPlanKey{1, 128, 4, 128}), 2);
}

// Both graphs, interpreted in double, compute the CPU backend's fused attention (its reference).
TEST(AttentionGraph, InterpretedGraphsComputeFusedAttention) {
  const int64_t B = kShape.B, T = kShape.T, H = kShape.H, Dh = kShape.Dh, n = B * T * H * Dh;
  AttentionGraphShape s = kShape;
  s.scale = float(1.0 / std::sqrt(double(Dh)));
  auto q = testing::random_vector(n, 8, "q"), k = testing::random_vector(n, 8, "k"),
       v = testing::random_vector(n, 8, "v"), dout = testing::random_vector(n, 8, "dout");
  auto cpu = make_cpu_backend(1);
  Ops<double>& o = cpu->ops<double>();
  std::vector<double> out(n), stats(B * H * T), dq(n), dk(n), dv(n);
  o.attention_forward_fused(
      {.shape = {B, T, H, Dh}, .q = q.data(), .k = k.data(), .v = v.data(), .out = out.data(), .stats = stats.data()});
  o.attention_backward_fused({.shape = {B, T, H, Dh},
                              .q = q.data(),
                              .k = k.data(),
                              .v = v.data(),
                              .out = out.data(),
                              .stats = stats.data(),
                              .dout = dout.data(),
                              .dq = dq.data(),
                              .dk = dk.data(),
                              .dv = dv.data()});
  const double tolerance = 1e-6;  // the scale is a float in the graph
  const AttentionGraph forward = attention_forward_graph(s);
  Interpreter f(forward);
  f.memory(kUidQ) = q, f.memory(kUidK) = k, f.memory(kUidV) = v;
  f.run();
  for (int64_t i = 0; i < n; ++i) EXPECT_NEAR(f.memory(kUidO)[size_t(i)], out[size_t(i)], tolerance) << "o " << i;
  for (int64_t i = 0; i < B * H * T; ++i)
    EXPECT_NEAR(f.memory(kUidStats)[size_t(i)], stats[size_t(i)], tolerance) << "stats " << i;
  for (bool deterministic : {true, false}) {
    s.deterministic = deterministic;
    const AttentionGraph backward = attention_backward_graph(s);
    Interpreter b(backward);
    b.memory(kUidQ) = q, b.memory(kUidK) = k, b.memory(kUidV) = v, b.memory(kUidO) = out;
    b.memory(kUidStats) = stats, b.memory(kUidDO) = dout;
    b.run();
    for (int64_t i = 0; i < n; ++i) {
      EXPECT_NEAR(b.memory(kUidDQ)[size_t(i)], dq[size_t(i)], tolerance) << "dq " << i << " " << deterministic;
      EXPECT_NEAR(b.memory(kUidDK)[size_t(i)], dk[size_t(i)], tolerance) << "dk " << i << " " << deterministic;
      EXPECT_NEAR(b.memory(kUidDV)[size_t(i)], dv[size_t(i)], tolerance) << "dv " << i << " " << deterministic;
    }
  }
}

}  // namespace
}  // namespace moe::cuda
