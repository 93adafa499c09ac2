// The hosts of a job and its spares, and lost hosts replaced by spares. The job's hosts are the first hosts of the
// hostfile whose slots take --np ranks, slot by slot in the hostfile's order (as mpirun fills them); the hosts
// after them are spares. A lost host's place goes to the first spare with at least its slots, which takes its
// position and its slot count, so that every rank lands where it was (the same layout, the run continues bit for
// bit). Not here: deciding that a host is lost (launch/supervise/host_probe.h) or acting on it
// (launch/supervise/supervisor.cpp).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "launch/supervise/supervisor.h"

namespace moe {

struct HostPool {
  std::vector<HostSlots> active;  // where the ranks go, in order
  std::vector<HostSlots> spares;  // in order
};

HostPool split_hosts(const std::vector<HostSlots>& hosts, int64_t np);

struct Replacement {
  std::string host, by;
  int64_t slots = 0;
};
// Leaves out every host of `lost` (host -> reason): an active host is replaced by the first spare with at least its
// slots; a lost spare is dropped. Active hosts that no spare could replace are left in place and listed in
// `unreplaced`.
std::vector<Replacement> replace_lost_hosts(HostPool* pool, const std::map<std::string, std::string>& lost,
                                            std::vector<std::string>* unreplaced);

}  // namespace moe
