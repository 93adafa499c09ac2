// Fused causal attention on cuDNN's backend graph API (cudnn_graph.h): the graphs of attention_graph.h turned
// into backend descriptors, an execution plan per shape from cuDNN's heuristics (built once, kept), and their
// execution on the backend's stream with workspace from its caching allocator. Operands are bf16 in device
// memory, in the (B, T, H*Dh) layout of core/backend/ops.h; the statistics fp32 (B, H, T). The CUDA backend
// converts fp32 storage to and from bf16 around these calls (cuda_backend.cu).
//
// Where cuDNN refuses a graph (no engine for it, not on this device, any error while building) the shape is
// marked unsupported and the refusal said once on stderr with cuDNN's status; the layers then keep the plain
// attention (as everywhere with train.fused_attention = "off", when the backend never asks cuDNN). The backward
// is the deterministic form (attention_graph.h), as the backend's other ops are, unless train.fused_attention is
// "nondeterministic": the form that accumulates dQ with atomic adds (less workspace, bits vary from run to run).
#pragma once

#include <cuda_runtime.h>

#include <map>
#include <memory>

#include "core/backend/cuda/attention_graph.h"
#include "core/backend/cuda/caching_allocator.h"

namespace moe::cuda {

class CudnnAttention {
 public:
  CudnnAttention(cudaStream_t stream, CachingAllocator& allocator, bool deterministic);
  ~CudnnAttention();
  CudnnAttention(const CudnnAttention&) = delete;
  CudnnAttention& operator=(const CudnnAttention&) = delete;

  // Builds the forward and backward plans for the shape once; false where cuDNN refused either.
  bool supported(const AttentionPlanKey& shape);
  // q, k, v, o: bf16 (B, T, H*Dh); stats: fp32 (B, H, T). After supported(shape) said yes.
  void forward(const AttentionPlanKey& shape, const void* q, const void* k, const void* v, void* o, float* stats);
  // dq, dk, dv written (bf16).
  void backward(const AttentionPlanKey& shape, const void* q, const void* k, const void* v, const void* o,
                const float* stats, const void* dout, void* dq, void* dk, void* dv);

  struct Plan;  // cudnn_attention.cu

 private:
  struct Plans;
  Plans& plans_of(const AttentionPlanKey& shape);
  void execute(Plan& plan, const std::map<int64_t, const void*>& bound);

  cudaStream_t stream_;
  CachingAllocator& allocator_;
  void* handle_ = nullptr;  // cudnnHandle_t, made at the first use
  bool deterministic_ = true;
  std::map<AttentionPlanKey, std::unique_ptr<Plans>> plans_;
};

}  // namespace moe::cuda
