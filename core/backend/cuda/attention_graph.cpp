// The fused attention graphs of attention_graph.h, op by op as cudnn-frontend's composite SDPA forward and
// backward nodes emit them for causal attention without dropout or bias.
#include "core/backend/cuda/attention_graph.h"

#include "core/error.h"
#include "core/sizes.h"

namespace moe::cuda {
namespace {

using Dims = std::array<int64_t, 4>;

// Appends tensors and operations; intermediates get fresh uids after the bound ones.
class GraphBuilder {
 public:
  explicit GraphBuilder(const AttentionGraphShape& s) : s_(s) {}

  // A bound tensor (q, k, v, o, ... : not virtual).
  int64_t bound(int64_t uid, GraphType type, Dims dims, Dims strides) {
    g_.tensors.push_back({uid, type, dims, strides, false, false, 0});
    return uid;
  }
  int64_t scalar(float value) {
    g_.tensors.push_back({next_++, GraphType::Fp32, {1, 1, 1, 1}, {1, 1, 1, 1}, false, true, value});
    return g_.tensors.back().uid;
  }
  int64_t intermediate(GraphType type, Dims dims, Dims strides) {
    g_.tensors.push_back({next_++, type, dims, strides, true, false, 0});
    return g_.tensors.back().uid;
  }
  // The (B, H, T, T) scores' shape, packed, and the transposed view of it.
  int64_t scores(GraphType type = GraphType::Fp32) { return intermediate(type, scores_dims(), scores_strides()); }
  int64_t scores_transposed(GraphType type) {
    return intermediate(type, scores_dims(), {s_.H * s_.T * s_.T, s_.T * s_.T, 1, s_.T});
  }
  // One value per row: (B, H, T, 1), packed.
  int64_t rows(GraphType type = GraphType::Fp32) { return intermediate(type, rows_dims(), rows_strides()); }
  Dims scores_dims() const { return {s_.B, s_.H, s_.T, s_.T}; }
  Dims scores_strides() const { return {s_.H * s_.T * s_.T, s_.T * s_.T, s_.T, 1}; }
  Dims rows_dims() const { return {s_.B, s_.H, s_.T, 1}; }
  Dims rows_strides() const { return {s_.H * s_.T, s_.T, 1, 1}; }
  // (B, H, T, Dh) over the (B, T, H*Dh) layout, and its transpose (B, H, Dh, T).
  Dims heads_dims() const { return {s_.B, s_.H, s_.T, s_.Dh}; }
  Dims heads_strides() const { return {s_.T * s_.H * s_.Dh, s_.Dh, s_.H * s_.Dh, 1}; }
  Dims heads_t_dims() const { return {s_.B, s_.H, s_.Dh, s_.T}; }
  Dims heads_t_strides() const { return {s_.T * s_.H * s_.Dh, s_.Dh, 1, s_.H * s_.Dh}; }

  // Designated initialisers only: a positional `{}` would value-initialise a member (compute = Bf16, the enum's
  // zero) instead of taking its default, and cuDNN's fused engines refuse a matmul that does not compute in fp32.
  void matmul(int64_t a, int64_t b, int64_t c) {
    g_.ops.push_back({.kind = GraphOpKind::Matmul, .compute = GraphType::Fp32, .inputs = {a, b}, .output = c});
  }
  void pointwise(PointwiseMode mode, std::vector<int64_t> in, int64_t out, GraphType compute = GraphType::Fp32,
                 int64_t axis = -1) {
    g_.ops.push_back({.kind = GraphOpKind::Pointwise,
                      .pointwise = mode,
                      .compute = compute,
                      .axis = axis,
                      .inputs = std::move(in),
                      .output = out});
  }
  void reduction(ReductionMode mode, int64_t x, int64_t y) {
    g_.ops.push_back(
        {.kind = GraphOpKind::Reduction, .reduction = mode, .compute = GraphType::Fp32, .inputs = {x}, .output = y});
  }
  void reshape(int64_t x, int64_t y) {
    g_.ops.push_back({.kind = GraphOpKind::Reshape, .compute = GraphType::Fp32, .inputs = {x}, .output = y});
  }

  // x (scores) where row >= column, else the masked value: the causal mask as generated indices.
  int64_t causal_mask(int64_t x) {
    const int64_t row = intermediate(GraphType::Int32, scores_dims(), scores_strides());
    pointwise(PointwiseMode::GenIndex, {x}, row, GraphType::Int32, 2);
    const int64_t col = intermediate(GraphType::Int32, scores_dims(), scores_strides());
    pointwise(PointwiseMode::GenIndex, {x}, col, GraphType::Int32, 3);
    const int64_t keep = intermediate(GraphType::Bool, scores_dims(), scores_strides());
    pointwise(PointwiseMode::CmpGe, {row, col}, keep, GraphType::Bool);
    const int64_t y = scores();
    pointwise(PointwiseMode::BinarySelect, {x, scalar(s_.masked), keep}, y);
    return y;
  }

  void workspace(int64_t uid, int64_t bytes, bool zeroed) { g_.workspace.push_back({uid, bytes, zeroed}); }
  AttentionGraph take() { return std::move(g_); }
  const AttentionGraphShape& shape() const { return s_; }

 private:
  AttentionGraphShape s_;
  AttentionGraph g_;
  int64_t next_ = kUidFirstScalar;
};

void check_shape(const AttentionGraphShape& s) {
  MOE_CHECK(s.B > 0 && s.T > 0 && s.H > 0 && s.Dh > 0,
            "fused attention shape B " << s.B << " T " << s.T << " H " << s.H << " Dh " << s.Dh);
}

}  // namespace

const GraphTensor& AttentionGraph::tensor(int64_t uid) const {
  for (const GraphTensor& t : tensors)
    if (t.uid == uid) return t;
  MOE_RUN_FAILED("attention graph has no tensor " << uid);
}

int64_t AttentionGraph::workspace_bytes() const {
  int64_t total = 0;
  for (const WorkspaceTensor& w : workspace) total += int64_t(sizes::attention_graph_tensor_bytes(double(w.bytes)));
  return total;
}

int64_t AttentionGraph::offset_of(int64_t uid) const {
  int64_t offset = 0;
  for (const WorkspaceTensor& w : workspace) {
    if (w.uid == uid) return offset;
    offset += int64_t(sizes::attention_graph_tensor_bytes(double(w.bytes)));
  }
  MOE_RUN_FAILED("attention graph has no workspace tensor " << uid);
}

AttentionGraph attention_forward_graph(const AttentionGraphShape& s) {
  check_shape(s);
  GraphBuilder g(s);
  const int64_t q = g.bound(kUidQ, GraphType::Bf16, g.heads_dims(), g.heads_strides());
  const int64_t kt = g.bound(kUidK, GraphType::Bf16, g.heads_t_dims(), g.heads_t_strides());
  const int64_t v = g.bound(kUidV, GraphType::Bf16, g.heads_dims(), g.heads_strides());
  const int64_t o = g.bound(kUidO, GraphType::Bf16, g.heads_dims(), g.heads_strides());
  const int64_t stats = g.bound(kUidStats, GraphType::Fp32, g.rows_dims(), g.rows_strides());
  const int64_t scores = g.scores();
  g.matmul(q, kt, scores);
  const int64_t scaled = g.scores();
  g.pointwise(PointwiseMode::Mul, {scores, g.scalar(s.scale)}, scaled);
  const int64_t masked = g.causal_mask(scaled);
  // The softmax with its statistics: max, exp(x - max), sum; stats = max + log(sum); P = exp / sum.
  const int64_t max = g.rows();
  g.reduction(ReductionMode::Max, masked, max);
  const int64_t shifted = g.scores();
  g.pointwise(PointwiseMode::Sub, {masked, max}, shifted);
  const int64_t exp = g.scores();
  g.pointwise(PointwiseMode::Exp, {shifted}, exp);
  const int64_t sum = g.rows();
  g.reduction(ReductionMode::Add, exp, sum);
  const int64_t log = g.rows();
  g.pointwise(PointwiseMode::Log, {sum}, log);
  g.pointwise(PointwiseMode::Add, {max, log}, stats);
  const int64_t p = g.scores(GraphType::Bf16);
  g.pointwise(PointwiseMode::Div, {exp, sum}, p);
  g.matmul(p, v, o);
  return g.take();
}

AttentionGraph attention_backward_graph(const AttentionGraphShape& s) {
  check_shape(s);
  GraphBuilder g(s);
  const int64_t q = g.bound(kUidQ, GraphType::Bf16, g.heads_dims(), g.heads_strides());
  const int64_t kt = g.bound(kUidK, GraphType::Bf16, g.heads_t_dims(), g.heads_t_strides());
  const int64_t vt = g.bound(kUidV, GraphType::Bf16, g.heads_t_dims(), g.heads_t_strides());
  const int64_t o = g.bound(kUidO, GraphType::Bf16, g.heads_dims(), g.heads_strides());
  const int64_t stats = g.bound(kUidStats, GraphType::Fp32, g.rows_dims(), g.rows_strides());
  const int64_t dout = g.bound(kUidDO, GraphType::Bf16, g.heads_dims(), g.heads_strides());
  const int64_t dq = g.bound(kUidDQ, GraphType::Bf16, g.heads_dims(), g.heads_strides());
  const int64_t dk = g.bound(kUidDK, GraphType::Bf16, g.heads_dims(), g.heads_strides());
  const int64_t dv = g.bound(kUidDV, GraphType::Bf16, g.heads_dims(), g.heads_strides());
  // D = rowsum(dO * O), kept in fp32 workspace (times 1: the frontend's dropout scale, absent here).
  const int64_t product = g.intermediate(GraphType::Fp32, g.heads_dims(), g.heads_strides());
  g.pointwise(PointwiseMode::Mul, {dout, o}, product);
  const int64_t dot = g.rows();
  g.reduction(ReductionMode::Add, product, dot);
  const int64_t row_sum = g.bound(kUidRowSum, GraphType::Fp32, g.rows_dims(), g.rows_strides());
  g.pointwise(PointwiseMode::Mul, {dot, g.scalar(1.0f)}, row_sum);
  g.workspace(kUidRowSum, int64_t(sizes::attention_row_sum_bytes(double(s.B), double(s.T), double(s.H))), false);
  // P = exp(scale Q K^T - stats) under the mask.
  const int64_t scores = g.scores();
  g.matmul(q, kt, scores);
  const int64_t scaled = g.scores();
  g.pointwise(PointwiseMode::Mul, {scores, g.scalar(s.scale)}, scaled);
  const int64_t shifted = g.scores();
  g.pointwise(PointwiseMode::Sub, {scaled, stats}, shifted);
  const int64_t masked = g.causal_mask(shifted);
  const int64_t p = g.scores();
  g.pointwise(PointwiseMode::Exp, {masked}, p);
  // dV = P^T dO.
  const int64_t p_t = g.scores_transposed(GraphType::Bf16);
  g.reshape(p, p_t);
  g.matmul(p_t, dout, dv);
  // dS = P (dO V^T - D) scale.
  const int64_t dp = g.scores();
  g.matmul(dout, vt, dp);
  const int64_t centred = g.scores();
  g.pointwise(PointwiseMode::Sub, {dp, row_sum}, centred);
  const int64_t ds_unscaled = g.scores();
  g.pointwise(PointwiseMode::Mul, {centred, p}, ds_unscaled);
  const int64_t ds = g.scores();
  g.pointwise(PointwiseMode::Mul, {ds_unscaled, g.scalar(s.scale)}, ds);
  // dK = dS^T Q.
  const int64_t ds_t = g.scores_transposed(GraphType::Bf16);
  g.reshape(ds, ds_t);
  g.matmul(ds_t, q, dk);
  // dQ = dS K, K being K^T's transpose view; directly, or accumulated in fp32 workspace, then written.
  const int64_t k = g.intermediate(GraphType::Bf16, g.heads_dims(), g.heads_strides());
  g.reshape(kt, k);
  if (s.deterministic) {
    g.matmul(ds, k, dq);
    return g.take();
  }
  const int64_t accum = g.bound(kUidDQAccum, GraphType::Fp32, g.heads_dims(),
                                {s.H * s.T * s.Dh, s.T * s.Dh, s.Dh, 1});  // packed (B, H, T, Dh)
  g.matmul(ds, k, accum);
  g.workspace(kUidDQAccum,
              int64_t(sizes::attention_dq_accum_bytes(double(s.B), double(s.T), double(s.H), double(s.Dh))), true);
  g.pointwise(PointwiseMode::Identity, {accum}, dq);
  return g.take();
}

}  // namespace moe::cuda
