// Legacy W1 and W3 pieces as slabs of the stacked W13: see stacked.h.
#include "checkpoint/stacked.h"

#include <map>
#include <string>
#include <utility>
#include <vector>

namespace moe::ckpt {
namespace {

// The slab of part `index` of a (..., 2, F) tensor that the part's slab `s` of (..., F) is.
Slab in_stacked(const Slab& s, int64_t index) {
  Slab out = s;
  const auto at = [](std::vector<int64_t>& v, int64_t value) { v.insert(v.end() - 1, value); };
  at(out.global_shape, 2), at(out.start, index), at(out.shape, 1);
  return out;
}

}  // namespace

std::optional<StackedPart> stacked_part(const std::string& tensor) {
  for (const auto& [suffix, index] : {std::pair<std::string, int64_t>{".w1", 0}, {".w3", 1}})
    if (tensor.size() > suffix.size() && tensor.compare(tensor.size() - suffix.size(), suffix.size(), suffix) == 0)
      return StackedPart{tensor.substr(0, tensor.size() - suffix.size()) + ".w13", index};
  return std::nullopt;
}

void stack_legacy_parts(Manifest& m) {
  // The stacked tensors whose two parts are both stored, alike in dtype and global shape (of their first pieces).
  std::map<std::string, std::map<int64_t, std::pair<DType, std::vector<int64_t>>>> parts;
  for (const FileEntry& f : m.files)
    for (const DatasetEntry& d : f.datasets)
      if (const auto p = stacked_part(d.tensor); p && d.global_shape().size() >= 2)
        parts[p->stacked].try_emplace(p->index, d.dtype, d.global_shape());
  auto pair = [&](const std::string& stacked) {
    const auto it = parts.find(stacked);
    return it != parts.end() && it->second.size() == 2 && it->second.at(0) == it->second.at(1);
  };
  for (FileEntry& f : m.files)
    for (DatasetEntry& d : f.datasets)
      if (const auto p = stacked_part(d.tensor); p && pair(p->stacked))
        d.tensor = p->stacked, d.slab = in_stacked(d.slab, p->index);
}

}  // namespace moe::ckpt
