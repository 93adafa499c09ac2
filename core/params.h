// The parameter table: every parameter is a named spec (global shape, role, weight decay, init, how it is
// split), and one flat buffer each for parameters, gradients and optimizer state is carved from it by
// offset. Data-parallel buckets, ZeRO shards and checkpoint entries are slices of this table; nothing
// picks a tensor by index. Initialisation is a pure function of (seed, name, global element index), so a
// shard initialised as its slice of the full tensor equals the serial run's (MODEL.md "Init").
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace moe {

enum class ParamRole { Embedding, Dense, Norm, Router, Expert, Output };
const char* param_role_name(ParamRole role);

enum class ParamInit { Normal, Ones, Zeros };

struct ParamSpec {
  std::string name;            // global name, e.g. "layers.3.attn.wq"
  std::vector<int64_t> shape;  // global shape
  ParamRole role = ParamRole::Dense;
  bool weight_decay = true;
  ParamInit init = ParamInit::Normal;
  double init_std = 0.02;  // for ParamInit::Normal
  // Sharding: this rank holds the slice [shard_offset, shard_offset + shape[0]) of axis 0 of a tensor whose
  // global axis-0 size is global_rows (0: not sharded, the rank holds the whole tensor). Expert tensors
  // are sharded this way over the expert-parallel group.
  int64_t global_rows = 0;
  int64_t shard_offset = 0;
  int64_t offset = 0;  // into the flat buffers (set by ParamTable::add)
  int64_t numel = 0;

  bool expert() const { return role == ParamRole::Expert; }
  std::vector<int64_t> global_shape() const {
    std::vector<int64_t> g = shape;
    if (global_rows > 0) g[0] = global_rows;
    return g;
  }
};

// The flat buffers have two regions, each contiguous and in registration order: every non-expert
// tensor first (gradients reduced over the data-parallel group), then every expert tensor (reduced over
// the expert-data-parallel group). Offsets stay valid while tensors are added.
class ParamTable {
 public:
  // Appends a spec. Names must be unique.
  void add(ParamSpec spec);
  const ParamSpec& find(const std::string& name) const;  // throws if absent
  bool contains(const std::string& name) const;
  const std::vector<ParamSpec>& specs() const { return specs_; }
  int64_t numel() const { return dense_numel_ + expert_numel_; }
  int64_t dense_numel() const { return dense_numel_; }    // region [0, dense_numel)
  int64_t expert_numel() const { return expert_numel_; }  // region [dense_numel, numel)

  // The tensor `name` inside a flat buffer carved by this table (parameters, gradients, moments).
  template <typename T>
  TensorView<T> view(T* buffer, const std::string& name) const {
    const ParamSpec& s = find(name);
    return {buffer + s.offset, s.shape};
  }

  // Fills params (numel() values) from the counter-based generator keyed by (seed, spec name).
  template <typename T>
  void initialize(T* params, uint64_t seed) const;

 private:
  std::vector<ParamSpec> specs_;
  int64_t dense_numel_ = 0, expert_numel_ = 0;
};

}  // namespace moe
