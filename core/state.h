// What a component keeps across a checkpoint, declared by the component itself (docs/design.md "Checkpoints"):
// each stateful part (the model's parameters, the optimizer, an MoE layer's balancing bias, expert usage and
// capacity control, the per-expert clipper) lists its pieces in global coordinates, and the trainer collects
// the lists (launch/train/train_state.h) and hands them to the checkpoint library. A new stateful component
// implements Stateful and joins that list; nothing else names its tensors.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/dtype.h"
#include "core/params.h"

namespace moe {

// One piece of a component's state: a hyperslab of a global tensor (per axis a start and an extent) and, of
// the hyperslab's elements in row-major order, the range [begin, begin + count), in host memory.
struct StatePiece {
  std::string tensor;        // global name, e.g. "params/embed.weight", "moe/layers.0.ffn.balancing_bias"
  DType dtype = DType::F32;  // F32, F64 or I64
  std::vector<int64_t> global_shape, start, shape;
  int64_t begin = 0, count = 0;
  void* data = nullptr;  // this rank's elements: read by a save, written by a restore
  // The group whose members hold the piece alike (one of them writes it); None: this rank alone holds it.
  ParamGroup replicas = ParamGroup::None;

  // The whole tensor of `shape`.
  static StatePiece whole(std::string tensor, DType dtype, std::vector<int64_t> shape, void* data,
                          ParamGroup replicas) {
    return box(std::move(tensor), dtype, shape, std::vector<int64_t>(shape.size(), 0), shape, data, replicas);
  }
  // The whole hyperslab [start, start + shape) of a tensor of `global_shape`.
  static StatePiece box(std::string tensor, DType dtype, std::vector<int64_t> global_shape, std::vector<int64_t> start,
                        std::vector<int64_t> shape, void* data, ParamGroup replicas) {
    int64_t n = 1;
    for (const int64_t extent : shape) n *= extent;
    return {std::move(tensor), dtype, std::move(global_shape), std::move(start), std::move(shape), 0, n, data,
            replicas};
  }
  // This rank's block of parameter `spec` (its hyperslab in the global tensor), all of it.
  static StatePiece block(std::string tensor, DType dtype, const ParamSpec& spec, void* data, ParamGroup replicas) {
    return box(std::move(tensor), dtype, spec.global_shape(), spec.global_start(), spec.shape, data, replicas);
  }
};

enum class StateUse { Save, Restore };

class Stateful {
 public:
  virtual ~Stateful() = default;
  // Save: pieces whose data hold the values now, and keep holding them until the checkpoint's snapshot is
  // taken (Checkpointer::wait_snapshot). Restore: pieces whose data are where the loaded values go;
  // state_restored() then puts them in force. A component whose state the host cannot address (a GPU's
  // memory) stages host copies here: downloaded for a save, uploaded by state_restored.
  virtual std::vector<StatePiece> state_pieces(StateUse use) = 0;
  virtual void state_restored() {}
};

}  // namespace moe
