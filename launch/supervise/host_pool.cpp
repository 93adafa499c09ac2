// The job's hosts and its spares; lost hosts replaced by spares with the same layout.
#include "launch/supervise/host_pool.h"

#include <algorithm>

namespace moe {

HostPool split_hosts(const std::vector<HostSlots>& hosts, int64_t np) {
  HostPool pool;
  int64_t filled = 0;
  for (const HostSlots& h : hosts) {
    if (filled < np) {
      pool.active.push_back(h);
      filled += h.slots;
    } else {
      pool.spares.push_back(h);
    }
  }
  return pool;
}

std::vector<Replacement> replace_lost_hosts(HostPool* pool, const std::map<std::string, std::string>& lost,
                                            std::vector<std::string>* unreplaced) {
  auto& spares = pool->spares;
  spares.erase(std::remove_if(spares.begin(), spares.end(), [&](const HostSlots& h) { return lost.count(h.name); }),
               spares.end());
  std::vector<Replacement> done;
  for (HostSlots& h : pool->active) {
    if (!lost.count(h.name)) continue;
    const auto spare =
        std::find_if(spares.begin(), spares.end(), [&](const HostSlots& s) { return s.slots >= h.slots; });
    if (spare == spares.end()) {
      unreplaced->push_back(h.name);
      continue;
    }
    done.push_back({h.name, spare->name, h.slots});
    h.name = spare->name;  // its place and its slot count: the ranks land where they were
    spares.erase(spare);
  }
  return done;
}

}  // namespace moe
