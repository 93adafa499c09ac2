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

void ParamTable::add(ParamSpec spec) {
  MOE_CHECK(!contains(spec.name), "parameter '" << spec.name << "' added twice");
  MOE_CHECK(spec.global_rows == 0 || (!spec.shape.empty() && spec.shard_offset + spec.shape[0] <= spec.global_rows),
            "parameter '" << spec.name << "': shard outside its global rows");
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
        const int64_t base = s.global_rows > 0 ? s.shard_offset * (s.numel / s.shape[0]) : 0;
        for (int64_t i = 0; i < s.numel; ++i) p[i] = T(s.init_std * rng.normal(uint64_t(base + i)));
        break;
      }
    }
  }
}

template void ParamTable::initialize<float>(float*, uint64_t) const;
template void ParamTable::initialize<double>(double*, uint64_t) const;

}  // namespace moe
