// What `moe launch --hostfile` does with its hosts before every start and restart: probes every host of the job and
// every spare at once (launch/supervise/host_probe.h); leaves out each host that fails, at once, naming it and the
// reason; gives a lost host's place to a spare with the same layout (launch/supervise/host_pool.h); without a spare,
// shrinks the job when fault.shrink allows and the config fits the smaller world, else says why the job cannot go on.
// The decisions come back as events.log entries, in order; the supervisor logs them and acts.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "launch/supervise/host_pool.h"
#include "launch/supervise/host_probe.h"

namespace moe {

struct Config;

struct PoolCheck {
  std::vector<nlohmann::json> events;  // "probe", then "host_lost", "host_replaced", "shrink", "cannot_replace"
  bool changed = false;                // the job's hosts (or np) changed: a new hostfile is needed
  std::string give_up;                 // non-empty: a lost host could not be replaced, and why
};

PoolCheck check_pool(HostPool* pool, int64_t* np, const ProbeSpec& spec, const Config& config, int64_t attempt);

}  // namespace moe
