// The parameter table: every parameter is a named spec (global shape, role, weight decay, init, how it is
// split), and one flat buffer each for parameters, gradients and optimizer state is carved from it by
// offset. Data-parallel buckets, ZeRO shards and checkpoint entries are slices of this table; nothing
// picks a tensor by index. Initialisation is a pure function of (seed, name, global element index), so a
// shard initialised as its slice of the full tensor equals the serial run's (MODEL.md "Init").
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace moe {

enum class ParamRole { Embedding, Dense, Norm, Router, Expert, Output };
const char* param_role_name(ParamRole role);

enum class ParamInit { Normal, Ones, Zeros };

struct ParamSpec {
  std::string name;             // global name, e.g. "layers.3.attn.wq"
  std::vector<int64_t> shape;   // global shape
  ParamRole role = ParamRole::Dense;
  bool weight_decay = true;
  ParamInit init = ParamInit::Normal;
  double init_std = 0.02;       // for ParamInit::Normal
  int64_t offset = 0;           // into the flat buffers (set by ParamTable::add)
  int64_t numel = 0;
};

class ParamTable {
 public:
  // Appends a spec; returns its offset in the flat buffers. Names must be unique.
  int64_t add(ParamSpec spec);
  const ParamSpec& find(const std::string& name) const;  // throws if absent
  bool contains(const std::string& name) const;
  const std::vector<ParamSpec>& specs() const { return specs_; }
  int64_t numel() const { return numel_; }

  // Fills params (numel() values) from the counter-based generator keyed by (seed, spec name).
  template <typename T>
  void initialize(T* params, uint64_t seed) const;

 private:
  std::vector<ParamSpec> specs_;
  int64_t numel_ = 0;
};

}  // namespace moe
