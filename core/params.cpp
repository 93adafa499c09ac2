// Parameter table bookkeeping and layout-independent initialisation.
#include "core/params.h"

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
  }
  return "?";
}

int64_t ParamSpec::global_index(int64_t local) const {
  if (!is_split()) return local;
  // Unravel in the block, shift the split axis, ravel in the global tensor.
  int64_t index = 0, rest = local, block = numel, global = 1;
  for (int64_t d : global_shape()) global *= d;
  for (size_t k = 0; k < shape.size(); ++k) {
    block /= shape[k];
    global /= k == size_t(split.axis) ? split.global_size : shape[k];
    const int64_t i = rest / block + (k == size_t(split.axis) ? split.offset : 0);
    rest %= block;
    index += i * global;
  }
  return index;
}

void ParamTable::add(ParamSpec spec) {
  MOE_CHECK(!contains(spec.name), "parameter '" << spec.name << "' added twice");
  if (spec.global_rows > 0 && !spec.is_split())
    spec.split = {0, spec.global_rows, spec.shard_offset,
                  spec.expert() ? ParamGroup::ExpertParallel : ParamGroup::None};
  if (spec.split.axis == 0) spec.global_rows = spec.split.global_size, spec.shard_offset = spec.split.offset;
  if (spec.replicas == ParamGroup::None)
    spec.replicas = spec.expert()                                    ? ParamGroup::ExpertDataParallel
                    : spec.split.group == ParamGroup::TensorParallel ? ParamGroup::DataParallel
                                                                     : ParamGroup::TensorDataParallel;
  const size_t axis = size_t(spec.split.axis);
  MOE_CHECK(!spec.is_split() || (axis < spec.shape.size() && spec.split.offset >= 0 &&
                                 spec.split.offset + spec.shape[axis] <= spec.split.global_size),
            "parameter '" << spec.name << "': its block is outside the tensor on the split axis");
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
      case ParamInit::Normal: {
        const RngStream rng(seed, "init." + s.name);
        // Element i of the global tensor draws counter (i, 0): a shard draws exactly its own elements.
        if (s.split.axis > 0) {
          for (int64_t i = 0; i < s.numel; ++i) p[i] = T(s.init_std * rng.normal(uint64_t(s.global_index(i))));
          break;
        }
        const int64_t base = s.is_split() ? s.split.offset * (s.numel / s.shape[0]) : 0;
        for (int64_t i = 0; i < s.numel; ++i) p[i] = T(s.init_std * rng.normal(uint64_t(base + i)));
        break;
      }
    }
  }
}

template void ParamTable::initialize<float>(float*, uint64_t) const;
template void ParamTable::initialize<double>(double*, uint64_t) const;

}  // namespace moe
