// Legacy W1 and W3 pieces as slabs of the stacked W13: see stacked.h.
#include "checkpoint/stacked.h"

#include <map>
#include <string>

namespace moe::ckpt {
namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() > suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// The slab of part `index` of a (..., 2, F) tensor that the part's slab `s` of (..., F) is.
Slab in_stacked(const Slab& s, int64_t index) {
  Slab out = s;
  const auto at = [](std::vector<int64_t>& v, int64_t value) { v.insert(v.end() - 1, value); };
  at(out.global_shape, 2), at(out.start, index), at(out.shape, 1);
  return out;
}

}  // namespace

void stack_legacy_parts(Manifest& m) {
  // The parts each prefix has, with the dtype and global shape of their first piece (a pair must agree).
  std::map<std::string, std::map<int64_t, const DatasetEntry*>> parts;
  for (const FileEntry& f : m.files)
    for (const DatasetEntry& d : f.datasets)
      for (const auto& [suffix, index] : {std::pair<std::string, int64_t>{".w1", 0}, {".w3", 1}})
        if (ends_with(d.tensor, suffix) && d.global_shape().size() >= 2)
          parts[d.tensor.substr(0, d.tensor.size() - suffix.size())].try_emplace(index, &d);
  std::map<std::string, bool> pair;
  for (const auto& [prefix, found] : parts)
    pair[prefix] = found.size() == 2 && found.at(0)->dtype == found.at(1)->dtype &&
                   found.at(0)->global_shape() == found.at(1)->global_shape();
  for (FileEntry& f : m.files)
    for (DatasetEntry& d : f.datasets)
      for (const auto& [suffix, index] : {std::pair<std::string, int64_t>{".w1", 0}, {".w3", 1}}) {
        if (!ends_with(d.tensor, suffix)) continue;
        const std::string prefix = d.tensor.substr(0, d.tensor.size() - suffix.size());
        if (!pair.count(prefix) || !pair[prefix]) continue;
        d.tensor = prefix + ".w13", d.slab = in_stacked(d.slab, index);
      }
}

}  // namespace moe::ckpt
