// The parameter table: every parameter is a named spec (global shape, role, weight decay, init, how it is
// split), and one flat buffer each for parameters, gradients and optimizer state is carved from it by
// offset. Data-parallel buckets, ZeRO shards and checkpoint entries are slices of this table; nothing
// picks a tensor by index. Initialisation is a pure function of (seed, name, global element index), so a
// shard initialised as its slice of the full tensor equals the serial run's (docs/model.md "Init").
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace moe {

enum class ParamRole { Embedding, Dense, Norm, Router, Expert, Output };
const char* param_role_name(ParamRole role);

enum class ParamInit { Normal, Ones, Zeros };

// The groups of the rank grid a parameter is split across or replicated over (docs/parallel.md).
// TensorDataParallel: the tp x dp ranks of one pipeline stage (a tensor every one of them holds whole).
// World: every rank of the job (the optimizer step, which every stage holds alike).
// ExpertTensorDataParallel: the etp x edp ranks of a stage holding the same experts (whole, or every block of
// their hidden width).
enum class ParamGroup {
  None,
  DataParallel,
  ExpertParallel,
  ExpertDataParallel,
  TensorParallel,
  ExpertTensorParallel,
  TensorDataParallel,
  ExpertTensorDataParallel,
  World
};
const char* param_group_name(ParamGroup group);

// How a tensor is split: this rank holds [offset, offset + shape[axis]) of axis `axis` of the global
// tensor, whose size on that axis is global_size, and every other axis whole; the other members of
// `group` hold the other blocks. axis -1: not split (the rank holds the whole tensor).
struct Split {
  int axis = -1;
  int64_t global_size = 0;
  int64_t offset = 0;
  ParamGroup group = ParamGroup::None;
};

struct ParamSpec {
  std::string name;            // global name, e.g. "layers.3.attn.wq"
  std::vector<int64_t> shape;  // global shape
  ParamRole role = ParamRole::Dense;
  bool weight_decay = true;
  ParamInit init = ParamInit::Normal;
  double init_std = 0.02;  // for ParamInit::Normal
  // Axis-0 sharding, the short form of split {0, global_rows, shard_offset, ExpertParallel}: this rank
  // holds [shard_offset, shard_offset + shape[0]) of axis 0, of global size global_rows (0: not sharded).
  // Expert tensors are sharded this way over the expert-parallel group. ParamTable::add keeps both forms
  // in step: an axis-0 split sets these two, and these two set the split.
  int64_t global_rows = 0;
  int64_t shard_offset = 0;
  int64_t offset = 0;  // into the flat buffers (set by ParamTable::add)
  int64_t numel = 0;
  Split split;   // how the tensor is split (set from global_rows when that is given)
  Split split2;  // a second axis split, on an axis other than split's (axis -1: none; needs split)
  // The group whose members hold identical copies (None: set by ParamTable::add from the role and split:
  // expert tensors the expert-data-parallel group, a tensor split over the tensor-parallel group the
  // data-parallel group, every other the tp x dp ranks of the stage). A checkpoint writes each replicated
  // tensor once, by one member of this group.
  ParamGroup replicas = ParamGroup::None;
  // A tensor every tensor-parallel rank holds whole but uses on its own tokens only (norm gains under
  // sequence parallelism, the router and shared experts of an MoE layer whose routing group is split over
  // the tp ranks): each rank's gradient is a partial sum, summed over the tp group before the optimizer
  // (Megatron-Core's sequence_parallel parameters).
  bool partial_over_tp = false;
  // A tensor of parts stacked on its second-to-last axis (extent parts.size()): the gated MLPs' w13, whose part 0
  // is W1 and part 1 W3, each row [W1 row | W3 row] so that x W1 and x W3 are one GEMM. Part j is initialised as
  // the tensor named parts[j] would be (the stream of that name, its index in the part's global shape, which lacks
  // the stacked axis), so that the values do not depend on the stacking; checkpoints that hold the parts by their
  // names load into it (checkpoint/stacked.h).
  std::vector<std::string> parts;

  bool expert() const { return role == ParamRole::Expert; }
  bool is_split() const { return split.axis >= 0 || split2.axis >= 0; }
  std::vector<int64_t> global_shape() const {
    std::vector<int64_t> g = shape;
    for (const Split* s : {&split, &split2})
      if (s->axis >= 0) g[size_t(s->axis)] = s->global_size;
    return g;
  }
  // Where this rank's block starts in the global tensor, per axis (the hyperslab's start).
  std::vector<int64_t> global_start() const {
    std::vector<int64_t> start(shape.size(), 0);
    for (const Split* s : {&split, &split2})
      if (s->axis >= 0) start[size_t(s->axis)] = s->offset;
    return start;
  }
  // The row-major index in the global tensor of element `local` of this rank's block.
  int64_t global_index(int64_t local) const;
  // Of element g of the global tensor: the part it belongs to and its index in the part's global shape (a tensor
  // of no parts: {0, g}). The name its values are drawn by is parts[part] (name without parts).
  std::pair<size_t, int64_t> part_of(int64_t g) const;
  const std::string& part_name(size_t part) const { return parts.empty() ? name : parts[part]; }
  // Whether either split is over `group`.
  bool split_over(ParamGroup group) const {
    return (split.axis >= 0 && split.group == group) || (split2.axis >= 0 && split2.group == group);
  }
  // Sets split from the axis-0 short form when only that is given, and the short form from an axis-0 split
  // (ParamTable::add does this; a spec about to get a second split needs its first one set).
  void sync_axis0_short_form();
};

// Which block of a tensor-parallel split a layer holds: block `rank` of `size` (the default: all of it).
struct TpShard {
  int64_t size = 1, rank = 0;
  // Block `rank` of `n` split into `size` equal blocks: its offset (n must be a multiple of size).
  int64_t block(int64_t n) const { return n / size; }
  int64_t offset(int64_t n) const { return rank * (n / size); }
  // The split of axis `axis` of global size n over the tensor-parallel group (none when size is 1).
  Split split(int axis, int64_t n) const {
    return size == 1 ? Split{} : Split{axis, n, offset(n), ParamGroup::TensorParallel};
  }
  // The shard's block of the whole tensor `whole`: its columns (axis 1, column-parallel) or rows (axis 0,
  // row-parallel), with the split that says so, over `group` (ExpertTensorParallel for expert tensors).
  // When `whole` is already split (an expert tensor's axis 0 over the expert-parallel group) this is its
  // second split: `whole` is then a block of the global tensor already, and the new split is split2.
  ParamSpec block_of(ParamSpec whole, int axis, ParamGroup group = ParamGroup::TensorParallel) const {
    const int64_t n = whole.shape[size_t(axis)];
    whole.shape[size_t(axis)] = block(n);
    Split s = split(axis, n);
    if (s.axis >= 0) s.group = group;
    whole.sync_axis0_short_form();
    (whole.split.axis >= 0 ? whole.split2 : whole.split) = s;
    return whole;
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

  // Marks the tensors `which` selects as partial_over_tp.
  void mark_partial_over_tp(const std::function<bool(const ParamSpec&)>& which);

  // Fills params (numel() values) from the counter-based generator keyed by (seed, spec name).
  template <typename T>
  void initialize(T* params, uint64_t seed) const;

 private:
  std::vector<ParamSpec> specs_;
  int64_t dense_numel_ = 0, expert_numel_ = 0;
};

}  // namespace moe
