// The cuDNN graphs of fused causal attention as plain data: tensors (uid, type, dims, strides) and operations
// (matmul, pointwise, reduction, reshape) in the order cuDNN's backend API receives them, the way
// cudnn-frontend's composite SDPA nodes lower to it (its causal mask: generated row and column indices,
// row >= col selects the score, else the masked value). cudnn_attention.cu turns a graph into backend
// descriptors; here it is host code without CUDA types, so the plan is tested without a GPU.
//
// Layouts (core/backend/ops.h): q, k, v, o and their gradients are (B, T, H*Dh) row-major in bf16, seen by
// cuDNN as (B, H, T, Dh) with strides (T H Dh, Dh, H Dh, 1); k and v enter as their transposes (B, H, Dh, T)
// by swapping the last two strides; the statistics are fp32 (B, H, T, 1), packed.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

namespace moe::cuda {

enum class GraphType : uint8_t { Bf16, Fp32, Int32, Bool };
enum class GraphOpKind : uint8_t { Matmul, Pointwise, Reduction, Reshape };
enum class PointwiseMode : uint8_t { Add, Sub, Mul, Div, Exp, Log, Identity, GenIndex, CmpGe, BinarySelect };
enum class ReductionMode : uint8_t { Add, Max };

struct GraphTensor {
  int64_t uid = 0;
  GraphType type = GraphType::Fp32;
  std::array<int64_t, 4> dims{}, strides{};
  bool is_virtual = true;  // an intermediate cuDNN keeps to itself
  bool by_value = false;   // a scalar handed over by host pointer at execution
  float value = 0;         // that scalar
};

struct GraphOp {
  GraphOpKind kind = GraphOpKind::Pointwise;
  PointwiseMode pointwise = PointwiseMode::Identity;
  ReductionMode reduction = ReductionMode::Add;
  GraphType compute = GraphType::Fp32;  // math precision
  int64_t axis = -1;                    // GenIndex: the dimension whose index is generated
  std::vector<int64_t> inputs;          // uids: matmul (A, B); pointwise (x[, b[, t]]); reduction, reshape (x)
  int64_t output = 0;
};

// The tensors the caller binds by uid at execution (the rest are virtual or scalars the graph holds).
enum AttentionUid : int64_t {
  kUidQ = 1,
  kUidK,
  kUidV,
  kUidO,
  kUidStats,
  kUidDO,
  kUidDQ,
  kUidDK,
  kUidDV,
  kUidRowSum,      // backward: D_i = dO_i . O_i in fp32, workspace
  kUidDQAccum,     // backward: dQ accumulated in fp32, workspace set to zero first
  kUidFirstScalar  // scalars and intermediates follow
};

struct AttentionGraphShape {
  int64_t B = 0, T = 0, H = 0, Dh = 0;
  float scale = 0;   // 1 / sqrt(Dh)
  float masked = 0;  // the value a masked score takes (-inf, or the lowest float for cuDNN before 9.10)
  // Backward: dQ = dS K written directly (cuDNN keeps dS in its workspace, B H T T bf16, and the result does not
  // depend on scheduling: a run repeats bit for bit), or accumulated in fp32 workspace across key blocks
  // (atomic adds: faster, less workspace, the order of the sums varies). cudnn-frontend's
  // is_deterministic_algorithm chooses the same way.
  bool deterministic = true;
};

struct AttentionGraph {
  std::vector<GraphTensor> tensors;
  std::vector<GraphOp> ops;
  // Non-virtual tensors that live in the caller's workspace (uid, bytes, zero before each execution).
  struct WorkspaceTensor {
    int64_t uid;
    int64_t bytes;
    bool zeroed;
  };
  std::vector<WorkspaceTensor> workspace;
  const GraphTensor& tensor(int64_t uid) const;
  // Bytes of workspace tensors, each at a 256-byte aligned offset; offset_of gives each one's place.
  int64_t workspace_bytes() const;
  int64_t offset_of(int64_t uid) const;
};

// S = scale Q K^T, the causal mask, softmax with its statistics (max + log of the sum: the log-sum-exp), O = P V.
AttentionGraph attention_forward_graph(const AttentionGraphShape& s);
// D = rowsum(dO * O); P = exp(scale Q K^T - stats) under the mask; dV = P^T dO; dS = P (dO V^T - D) scale;
// dK = dS^T Q; dQ = dS K (deterministic: directly; else accumulated in fp32, then written in bf16).
AttentionGraph attention_backward_graph(const AttentionGraphShape& s);

// The shape a built plan is kept for.
struct AttentionPlanKey {
  int64_t B = 0, T = 0, H = 0, Dh = 0;
  bool operator<(const AttentionPlanKey& o) const {
    return std::array<int64_t, 4>{B, T, H, Dh} < std::array<int64_t, 4>{o.B, o.T, o.H, o.Dh};
  }
  bool operator==(const AttentionPlanKey& o) const = default;
};

}  // namespace moe::cuda
