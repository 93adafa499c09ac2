// cuDNN's fused causal attention through its backend graph API (cudnn_attention.h).
#include <cudnn.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/backend/cuda/cudnn_attention.h"
#include "core/error.h"

namespace moe::cuda {
namespace {

// What cuDNN refused, with its status: caught where a plan is built (the shape is then unsupported).
struct CudnnRefused : std::runtime_error {
  using std::runtime_error::runtime_error;
};

void check(cudnnStatus_t status, const char* what) {
  if (status == CUDNN_STATUS_SUCCESS) return;
  char detail[512] = {};
  cudnnGetLastErrorString(detail, sizeof(detail));
  throw CudnnRefused(std::string(what) + ": " + cudnnGetErrorString(status) +
                     (detail[0] ? std::string(" (") + detail + ")" : ""));
}

// One backend descriptor, destroyed with its owner.
class Descriptor {
 public:
  explicit Descriptor(cudnnBackendDescriptorType_t type) {
    check(cudnnBackendCreateDescriptor(type, &d_), "cudnnBackendCreateDescriptor");
  }
  ~Descriptor() {
    if (d_) cudnnBackendDestroyDescriptor(d_);
  }
  Descriptor(const Descriptor&) = delete;
  Descriptor& operator=(const Descriptor&) = delete;
  cudnnBackendDescriptor_t get() const { return d_; }
  template <typename V>
  void set(cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type, int64_t count, const V* values) {
    check(cudnnBackendSetAttribute(d_, name, type, count, values), "cudnnBackendSetAttribute");
  }
  void set(cudnnBackendAttributeName_t name, const Descriptor& other) {
    cudnnBackendDescriptor_t raw = other.get();
    set(name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &raw);
  }
  void finalize() { check(cudnnBackendFinalize(d_), "cudnnBackendFinalize"); }

 private:
  cudnnBackendDescriptor_t d_ = nullptr;
};

cudnnDataType_t data_type(GraphType t) {
  switch (t) {
    case GraphType::Bf16:
      return CUDNN_DATA_BFLOAT16;
    case GraphType::Fp32:
      return CUDNN_DATA_FLOAT;
    case GraphType::Int32:
      return CUDNN_DATA_INT32;
    case GraphType::Bool:
      return CUDNN_DATA_BOOLEAN;
  }
  return CUDNN_DATA_FLOAT;
}

cudnnPointwiseMode_t pointwise_mode(PointwiseMode m) {
  switch (m) {
    case PointwiseMode::Add:
      return CUDNN_POINTWISE_ADD;
    case PointwiseMode::Sub:
      return CUDNN_POINTWISE_SUB;
    case PointwiseMode::Mul:
      return CUDNN_POINTWISE_MUL;
    case PointwiseMode::Div:
      return CUDNN_POINTWISE_DIV;
    case PointwiseMode::Exp:
      return CUDNN_POINTWISE_EXP;
    case PointwiseMode::Log:
      return CUDNN_POINTWISE_LOG;
    case PointwiseMode::Identity:
      return CUDNN_POINTWISE_IDENTITY;
    case PointwiseMode::GenIndex:
      return CUDNN_POINTWISE_GEN_INDEX;
    case PointwiseMode::CmpGe:
      return CUDNN_POINTWISE_CMP_GE;
    case PointwiseMode::BinarySelect:
      return CUDNN_POINTWISE_BINARY_SELECT;
  }
  return CUDNN_POINTWISE_IDENTITY;
}

std::unique_ptr<Descriptor> make_tensor(const GraphTensor& t) {
  auto d = std::make_unique<Descriptor>(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
  const cudnnDataType_t type = data_type(t.type);
  const int64_t alignment = 16;
  d->set(CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type);
  d->set(CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, t.dims.data());
  d->set(CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, t.strides.data());
  d->set(CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &t.uid);
  d->set(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &alignment);
  d->set(CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &t.is_virtual);
  if (t.by_value) d->set(CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &t.by_value);
  d->finalize();
  return d;
}

// Descriptors of one graph, kept alive with its plan.
struct GraphDescriptors {
  std::map<int64_t, std::unique_ptr<Descriptor>> tensors;
  std::vector<std::unique_ptr<Descriptor>> parts, ops;
  const Descriptor& tensor(int64_t uid) const { return *tensors.at(uid); }
};

void add_pointwise(GraphDescriptors& g, const GraphOp& op, Descriptor& operation) {
  auto pw = std::make_unique<Descriptor>(CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
  const cudnnPointwiseMode_t mode = pointwise_mode(op.pointwise);
  const cudnnDataType_t precision = data_type(op.compute);
  pw->set(CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode);
  pw->set(CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &precision);
  if (op.axis >= 0) pw->set(CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &op.axis);
  pw->finalize();
  operation.set(CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, *pw);
  operation.set(CUDNN_ATTR_OPERATION_POINTWISE_XDESC, g.tensor(op.inputs[0]));
  if (op.inputs.size() > 1) operation.set(CUDNN_ATTR_OPERATION_POINTWISE_BDESC, g.tensor(op.inputs[1]));
  if (op.inputs.size() > 2) operation.set(CUDNN_ATTR_OPERATION_POINTWISE_TDESC, g.tensor(op.inputs[2]));
  operation.set(CUDNN_ATTR_OPERATION_POINTWISE_YDESC, g.tensor(op.output));
  g.parts.push_back(std::move(pw));
}

void add_reduction(GraphDescriptors& g, const GraphOp& op, Descriptor& operation) {
  auto r = std::make_unique<Descriptor>(CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
  const cudnnReduceTensorOp_t mode =
      op.reduction == ReductionMode::Max ? CUDNN_REDUCE_TENSOR_MAX : CUDNN_REDUCE_TENSOR_ADD;
  const cudnnDataType_t precision = data_type(op.compute);
  r->set(CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &mode);
  r->set(CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &precision);
  r->finalize();
  operation.set(CUDNN_ATTR_OPERATION_REDUCTION_XDESC, g.tensor(op.inputs[0]));
  operation.set(CUDNN_ATTR_OPERATION_REDUCTION_YDESC, g.tensor(op.output));
  operation.set(CUDNN_ATTR_OPERATION_REDUCTION_DESC, *r);
  g.parts.push_back(std::move(r));
}

void add_matmul(GraphDescriptors& g, const GraphOp& op, Descriptor& operation) {
  auto m = std::make_unique<Descriptor>(CUDNN_BACKEND_MATMUL_DESCRIPTOR);
  const cudnnDataType_t precision = data_type(op.compute);
  m->set(CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &precision);
  m->finalize();
  operation.set(CUDNN_ATTR_OPERATION_MATMUL_ADESC, g.tensor(op.inputs[0]));
  operation.set(CUDNN_ATTR_OPERATION_MATMUL_BDESC, g.tensor(op.inputs[1]));
  operation.set(CUDNN_ATTR_OPERATION_MATMUL_CDESC, g.tensor(op.output));
  operation.set(CUDNN_ATTR_OPERATION_MATMUL_DESC, *m);
  g.parts.push_back(std::move(m));
}

cudnnBackendDescriptorType_t operation_type(GraphOpKind kind) {
  switch (kind) {
    case GraphOpKind::Matmul:
      return CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR;
    case GraphOpKind::Pointwise:
      return CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR;
    case GraphOpKind::Reduction:
      return CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR;
    case GraphOpKind::Reshape:
      return CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR;
  }
  return CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR;
}

// Every tensor and operation of the graph as finalized backend descriptors.
GraphDescriptors describe(const AttentionGraph& graph) {
  GraphDescriptors g;
  for (const GraphTensor& t : graph.tensors) g.tensors[t.uid] = make_tensor(t);
  for (const GraphOp& op : graph.ops) {
    auto operation = std::make_unique<Descriptor>(operation_type(op.kind));
    switch (op.kind) {
      case GraphOpKind::Matmul:
        add_matmul(g, op, *operation);
        break;
      case GraphOpKind::Pointwise:
        add_pointwise(g, op, *operation);
        break;
      case GraphOpKind::Reduction:
        add_reduction(g, op, *operation);
        break;
      case GraphOpKind::Reshape:
        operation->set(CUDNN_ATTR_OPERATION_RESHAPE_XDESC, g.tensor(op.inputs[0]));
        operation->set(CUDNN_ATTR_OPERATION_RESHAPE_YDESC, g.tensor(op.output));
        break;
    }
    operation->finalize();
    g.ops.push_back(std::move(operation));
  }
  return g;
}

}  // namespace

// A graph with the execution plan cuDNN's heuristics chose for it, and the host values of its scalars.
struct CudnnAttention::Plan {
  AttentionGraph graph;
  GraphDescriptors descriptors;
  std::unique_ptr<Descriptor> operation_graph, plan;
  int64_t cudnn_workspace = 0;
};

struct CudnnAttention::Plans {
  bool supported = false;
  std::unique_ptr<Plan> forward, backward;
};

namespace {

// The engine configurations heuristics `mode` proposes for the graph, best first.
std::vector<std::unique_ptr<Descriptor>> engine_configs(const Descriptor& graph, cudnnBackendHeurMode_t mode) {
  Descriptor heuristics(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
  heuristics.set(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph);
  heuristics.set(CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode);
  heuristics.finalize();
  int64_t count = 0;
  check(cudnnBackendGetAttribute(heuristics.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0,
                                 &count, nullptr),
        "engine heuristics: count");
  std::vector<std::unique_ptr<Descriptor>> configs;
  std::vector<cudnnBackendDescriptor_t> raw;
  for (int64_t i = 0; i < count; ++i) {
    configs.push_back(std::make_unique<Descriptor>(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR));
    raw.push_back(configs.back()->get());
  }
  int64_t got = 0;
  if (count > 0)
    check(cudnnBackendGetAttribute(heuristics.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                                   count, &got, raw.data()),
          "engine heuristics: results");
  configs.resize(size_t(std::min(got, count)));
  return configs;
}

// The first engine configuration of heuristics mode A, then of the fallback list, that makes a plan; the last
// refusal is the one reported when none does.
void choose_plan(cudnnHandle_t handle, CudnnAttention::Plan& p) {
  std::string last = "heuristics proposed no engine";
  for (cudnnBackendHeurMode_t mode : {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK}) {
    try {
      for (const auto& config : engine_configs(*p.operation_graph, mode)) {
        auto plan = std::make_unique<Descriptor>(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
        plan->set(CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle);
        plan->set(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, *config);
        const cudnnStatus_t status = cudnnBackendFinalize(plan->get());
        if (status != CUDNN_STATUS_SUCCESS) {
          last = std::string("execution plan: ") + cudnnGetErrorString(status);
          continue;
        }
        int64_t bytes = 0;
        check(cudnnBackendGetAttribute(plan->get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1,
                                       nullptr, &bytes),
              "execution plan: workspace size");
        p.plan = std::move(plan), p.cudnn_workspace = bytes;
        return;
      }
    } catch (const CudnnRefused& e) {
      last = e.what();
    }
  }
  throw CudnnRefused("no engine runs this graph on this device; last: " + last);
}

std::unique_ptr<CudnnAttention::Plan> build_plan(cudnnHandle_t handle, AttentionGraph graph) {
  auto p = std::make_unique<CudnnAttention::Plan>();
  p->graph = std::move(graph);
  p->descriptors = describe(p->graph);
  std::vector<cudnnBackendDescriptor_t> ops;
  for (const auto& op : p->descriptors.ops) ops.push_back(op->get());
  p->operation_graph = std::make_unique<Descriptor>(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
  p->operation_graph->set(CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, int64_t(ops.size()),
                          ops.data());
  p->operation_graph->set(CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle);
  p->operation_graph->finalize();
  choose_plan(handle, *p);
  return p;
}

// A masked score: -inf, or the lowest float before cuDNN 9.10 (as cudnn-frontend chooses).
float masked_score() {
  return cudnnGetVersion() < 91000 ? std::numeric_limits<float>::lowest() : -std::numeric_limits<float>::infinity();
}

// Once per shape and reason.
void say_refused_once(const AttentionPlanKey& s, const std::string& why) {
  static std::set<std::string> said;
  const std::string line = "moe: cuDNN refused fused attention for B " + std::to_string(s.B) + " T " +
                           std::to_string(s.T) + " H " + std::to_string(s.H) + " Dh " + std::to_string(s.Dh) + " (" +
                           why + "); plain attention instead\n";
  if (said.insert(line).second) std::fputs(line.c_str(), stderr);
}

}  // namespace

CudnnAttention::CudnnAttention(cudaStream_t stream, CachingAllocator& allocator, bool deterministic)
    : stream_(stream), allocator_(allocator), deterministic_(deterministic) {}

CudnnAttention::~CudnnAttention() {
  plans_.clear();
  if (handle_) cudnnDestroy(static_cast<cudnnHandle_t>(handle_));
}

CudnnAttention::Plans& CudnnAttention::plans_of(const AttentionPlanKey& shape) {
  auto& slot = plans_[shape];
  if (slot) return *slot;
  slot = std::make_unique<Plans>();
  try {
    if (!handle_) {
      cudnnHandle_t h = nullptr;
      check(cudnnCreate(&h), "cudnnCreate");
      handle_ = h;
      check(cudnnSetStream(h, stream_), "cudnnSetStream");
    }
    const auto h = static_cast<cudnnHandle_t>(handle_);
    AttentionGraphShape s{shape.B, shape.T, shape.H, shape.Dh};
    s.scale = float(1.0 / std::sqrt(double(shape.Dh)));
    s.masked = masked_score();
    s.deterministic = deterministic_;
    slot->forward = build_plan(h, attention_forward_graph(s));
    slot->backward = build_plan(h, attention_backward_graph(s));
    slot->supported = true;
  } catch (const CudnnRefused& e) {
    say_refused_once(shape, e.what());
    slot->forward.reset(), slot->backward.reset();
  }
  return *slot;
}

bool CudnnAttention::supported(const AttentionPlanKey& shape) { return plans_of(shape).supported; }

// One execution: the bound tensors, the scalars by host pointer, the workspace tensors and cuDNN's own
// workspace in one allocation (zeroed where the graph says).
void CudnnAttention::execute(Plan& p, const std::map<int64_t, const void*>& bound) {
  const int64_t own = p.graph.workspace_bytes();
  void* space = allocator_.allocate(size_t(std::max<int64_t>(own + p.cudnn_workspace, 1)));
  std::vector<int64_t> uids;
  std::vector<void*> pointers;
  for (const auto& [uid, ptr] : bound) uids.push_back(uid), pointers.push_back(const_cast<void*>(ptr));
  for (const GraphTensor& t : p.graph.tensors)
    if (t.by_value) uids.push_back(t.uid), pointers.push_back(const_cast<float*>(&t.value));
  for (const AttentionGraph::WorkspaceTensor& w : p.graph.workspace) {
    char* at = static_cast<char*>(space) + p.graph.offset_of(w.uid);
    if (w.zeroed && cudaMemsetAsync(at, 0, size_t(w.bytes), stream_) != cudaSuccess)
      MOE_RUN_FAILED("cudaMemsetAsync of fused attention's workspace: " << cudaGetErrorString(cudaGetLastError()));
    uids.push_back(w.uid), pointers.push_back(at);
  }
  void* cudnn_space = static_cast<char*>(space) + own;
  try {
    Descriptor pack(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
    pack.set(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, int64_t(uids.size()), uids.data());
    pack.set(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, int64_t(pointers.size()), pointers.data());
    pack.set(CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &cudnn_space);
    pack.finalize();
    check(cudnnBackendExecute(static_cast<cudnnHandle_t>(handle_), p.plan->get(), pack.get()), "cudnnBackendExecute");
  } catch (const CudnnRefused& e) {
    allocator_.free(space);
    MOE_RUN_FAILED("fused attention: " << e.what());
  }
  allocator_.free(space);  // reuse is ordered on the stream
}

void CudnnAttention::forward(const AttentionPlanKey& shape, const void* q, const void* k, const void* v, void* o,
                             float* stats) {
  Plans& plans = plans_of(shape);
  MOE_CHECK(plans.supported, "fused attention called for a shape cuDNN refused");
  execute(*plans.forward, {{kUidQ, q}, {kUidK, k}, {kUidV, v}, {kUidO, o}, {kUidStats, stats}});
}

void CudnnAttention::backward(const AttentionPlanKey& shape, const void* q, const void* k, const void* v, const void* o,
                              const float* stats, const void* dout, void* dq, void* dk, void* dv) {
  Plans& plans = plans_of(shape);
  MOE_CHECK(plans.supported, "fused attention called for a shape cuDNN refused");
  execute(*plans.backward, {{kUidQ, q},
                            {kUidK, k},
                            {kUidV, v},
                            {kUidO, o},
                            {kUidStats, stats},
                            {kUidDO, dout},
                            {kUidDQ, dq},
                            {kUidDK, dk},
                            {kUidDV, dv}});
}

}  // namespace moe::cuda
