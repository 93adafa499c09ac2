// Parameter table bookkeeping and layout-independent initialisation.
#include "core/params.h"

#include <algorithm>

#include "core/error.h"
#include "core/philox.h"

namespace moe {

const char* param_role_name(ParamRole role) {
  switch (role) {
    case ParamRole::Embedding:
      return "embedding";
    case ParamRole::Dense:
      return "dense";
    case ParamRole::Norm:
      return "norm";
    case ParamRole::Router:
      return "router";
    case ParamRole::Expert:
      return "expert";
    case ParamRole::Output:
      return "output";
  }
  return "?";
}

const char* param_group_name(ParamGroup group) {
  switch (group) {
    case ParamGroup::None:
      return "none";
    case ParamGroup::DataParallel:
      return "dp";
    case ParamGroup::ExpertParallel:
      return "ep";
    case ParamGroup::ExpertDataParallel:
      return "edp";
    case ParamGroup::TensorParallel:
      return "tp";
    case ParamGroup::ExpertTensorParallel:
      return "etp";
    case ParamGroup::TensorDataParallel:
      return "tp x dp";
    case ParamGroup::World:
      return "world";
    case ParamGroup::ExpertTensorDataParallel:
      return "etp x edp";
  }
  return "?";
}

int64_t ParamSpec::global_index(int64_t local) const {
  if (!is_split()) return local;
  // Unravel in the block, shift the split axes, ravel in the global tensor.
  const std::vector<int64_t> global = global_shape(), start = global_start();
  int64_t index = 0, rest = local, block = numel;
  for (size_t k = 0; k < shape.size(); ++k) {
    block /= shape[k];
    index = index * global[k] + rest / block + start[k];
    rest %= block;
  }
  return index;
}

std::pair<size_t, int64_t> ParamSpec::part_of(int64_t g) const {
  if (parts.empty()) return {0, g};
  // The global shape (..., P, F): row g / F of the (..., P) rows is part (g / F) % P of row (g / F) / P of the part.
  const int64_t F = global_shape().back(), P = int64_t(parts.size()), row = g / F;
  return {size_t(row % P), (row / P) * F + g % F};
}

void ParamSpec::sync_axis0_short_form() {
  if (global_rows > 0 && split.axis < 0)
    split = {0, global_rows, shard_offset, expert() ? ParamGroup::ExpertParallel : ParamGroup::None};
  if (split.axis == 0) global_rows = split.global_size, shard_offset = split.offset;
}

namespace {

// Whether `s` (of a tensor whose block has `shape`) is no split or a block inside the tensor on its axis.
bool inside(const Split& s, const std::vector<int64_t>& shape) {
  const size_t axis = size_t(s.axis);
  return s.axis < 0 || (axis < shape.size() && s.offset >= 0 && s.offset + shape[axis] <= s.global_size);
}

}  // namespace

void ParamTable::add(ParamSpec spec) {
  MOE_CHECK(!contains(spec.name), "parameter '" << spec.name << "' added twice");
  spec.sync_axis0_short_form();
  if (spec.replicas == ParamGroup::None)
    spec.replicas = spec.expert()                                 ? ParamGroup::ExpertDataParallel
                    : spec.split_over(ParamGroup::TensorParallel) ? ParamGroup::DataParallel
                                                                  : ParamGroup::TensorDataParallel;
  MOE_CHECK(inside(spec.split, spec.shape) && inside(spec.split2, spec.shape),
            "parameter '" << spec.name << "': its block is outside the tensor on a split axis");
  MOE_CHECK(spec.split2.axis < 0 || (spec.split.axis >= 0 && spec.split2.axis != spec.split.axis),
            "parameter '" << spec.name << "': a second split needs a first one, on another axis");
  const int stacked = int(spec.shape.size()) - 2;
  MOE_CHECK(spec.parts.empty() || (stacked >= 0 && spec.shape[size_t(stacked)] == int64_t(spec.parts.size()) &&
                                   spec.split.axis != stacked && spec.split2.axis != stacked),
            "parameter '" << spec.name << "': its " << spec.parts.size()
                          << " parts are stacked whole on its second-to-last axis");
  int64_t n = 1;
  for (int64_t d : spec.shape) n *= d;
  spec.numel = n;
  if (spec.expert()) {
    spec.offset = dense_numel_ + expert_numel_;
    expert_numel_ += n;
  } else {
    spec.offset = dense_numel_;
    dense_numel_ += n;
    for (ParamSpec& s : specs_)  // the expert region moves up
      if (s.expert()) s.offset += n;
  }
  specs_.push_back(std::move(spec));
}

void ParamTable::mark_partial_over_tp(const std::function<bool(const ParamSpec&)>& which) {
  for (ParamSpec& s : specs_)
    if (which(s)) s.partial_over_tp = true;
}

bool ParamTable::contains(const std::string& name) const {
  for (const ParamSpec& s : specs_)
    if (s.name == name) return true;
  return false;
}

const ParamSpec& ParamTable::find(const std::string& name) const {
  for (const ParamSpec& s : specs_)
    if (s.name == name) return s;
  MOE_FAIL("no parameter named '" << name << "'");
}

namespace {

// ParamInit::Normal: element i of the global tensor draws counter (i, 0) of the stream of its name (of its part's
// name and index in the part for a stacked tensor), so a shard draws exactly its own elements. A block's rows along
// its last axis are contiguous in the global tensor too. Each element is a pure function of its index, so the rows
// are split among threads (a Mixtral-sized layer has over a billion elements) with the same result.
template <typename T>
void initialize_normal(const ParamSpec& s, T* p, uint64_t seed) {
  std::vector<RngStream> streams;
  for (size_t k = 0; k < std::max<size_t>(1, s.parts.size()); ++k) streams.emplace_back(seed, "init." + s.part_name(k));
  const int64_t row = s.shape.empty() ? 1 : s.shape.back();
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < s.numel; r += row) {
    const auto [part, index] = s.part_of(s.global_index(r));  // a row lies in one part
    for (int64_t i = 0; i < row; ++i) p[r + i] = T(s.init_std * streams[part].normal(uint64_t(index + i)));
  }
}

}  // namespace

template <typename T>
void ParamTable::initialize(T* params, uint64_t seed) const {
  for (const ParamSpec& s : specs_) {
    T* p = params + s.offset;
    switch (s.init) {
      case ParamInit::Ones:
        for (int64_t i = 0; i < s.numel; ++i) p[i] = T(1);
        break;
      case ParamInit::Zeros:
        for (int64_t i = 0; i < s.numel; ++i) p[i] = T(0);
        break;
      case ParamInit::Normal:
        initialize_normal(s, p, seed);
        break;
    }
  }
}

template void ParamTable::initialize<float>(float*, uint64_t) const;
template void ParamTable::initialize<double>(double*, uint64_t) const;

}  // namespace moe
