// Balancing the bytes a replica group writes.
#include "checkpoint/writers.h"

#include <algorithm>
#include <numeric>

namespace moe::ckpt {

std::vector<int> assign_writers(const std::vector<std::pair<std::string, int64_t>>& items, int members) {
  std::vector<size_t> order(items.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    if (items[a].second != items[b].second) return items[a].second > items[b].second;
    return items[a].first < items[b].first;
  });
  std::vector<int64_t> load(size_t(std::max(members, 1)), 0);
  std::vector<int> writer(items.size(), 0);
  for (size_t i : order) {
    const auto least = std::min_element(load.begin(), load.end());  // the first of the least loaded
    writer[i] = int(least - load.begin());
    *least += items[i].second;
  }
  return writer;
}

}  // namespace moe::ckpt
