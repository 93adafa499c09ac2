// Probing the job's hosts and spares before a start, and replacing or shrinking away the lost ones.
#include "launch/supervise/host_check.h"

#include <algorithm>
#include <map>
#include <set>

#include "core/error.h"
#include "launch/config/config.h"

namespace moe {

using json = nlohmann::json;

namespace {

// No spare for `host`: shrink to the hosts without it when fault.shrink allows and the config fits.
bool shrink_without(HostPool* pool, int64_t* np, const std::string& host, const Config& config, PoolCheck* check) {
  std::string why = "fault.shrink is false";
  if (config.fault.shrink) {
    if (auto plan = plan_shrink(pool->active, host, 2, *np, config, &why)) {
      check->events.push_back(
          {{"event", "shrink"}, {"host", host}, {"np", plan->np}, {"was", *np}, {"reason", "lost"}});
      pool->active = plan->hosts;
      *np = plan->np;
      check->changed = true;
      return true;
    }
  }
  check->events.push_back({{"event", "cannot_replace"}, {"host", host}, {"reason", "no spare host left; " + why}});
  check->give_up = "host " + host + " is lost and no spare host is left to take its place (" + why +
                   "); add spare hosts to the hostfile, beyond those --np fills, or set fault.shrink = true";
  return false;
}

// A partition: hosts that passed the probe but do not reach each other. While two such hosts remain, the one that
// reaches the fewest others (the later one in `names`' order on a tie: the job's first hosts are kept) is lost.
void leave_out_partitioned(const std::vector<HostProbe>& probes, const std::vector<std::string>& names,
                           std::map<std::string, std::string>* lost) {
  std::map<std::string, std::set<std::string>> cut;  // both directions
  for (const HostProbe& p : probes)
    for (const std::string& peer : p.unreachable_peers)
      if (p.ok && !lost->count(p.host) && !lost->count(peer)) cut[p.host].insert(peer), cut[peer].insert(p.host);
  for (;;) {
    std::string worst;
    for (const std::string& h : names)
      if (cut.count(h) && !cut[h].empty() && (worst.empty() || cut[h].size() >= cut[worst].size())) worst = h;
    if (worst.empty()) return;
    std::string peers;
    for (const std::string& peer : cut[worst]) peers += (peers.empty() ? "" : ", ") + peer;
    std::string errors;
    for (const HostProbe& p : probes)
      if (p.host == worst && !p.peer_errors.empty()) errors = ": " + p.peer_errors;
    (*lost)[worst] = "cannot reach " + peers + " (a partition between the hosts" + errors + ")";
    for (const std::string& peer : cut[worst]) cut[peer].erase(worst);
    cut.erase(worst);
  }
}

}  // namespace

PoolCheck check_pool(HostPool* pool, int64_t* np, const ProbeSpec& spec, const Config& config, int64_t attempt) {
  PoolCheck check;
  std::vector<std::string> names;
  for (const auto* list : {&pool->active, &pool->spares})
    for (const HostSlots& h : *list) names.push_back(h.name);
  const std::vector<HostProbe> probes = probe_hosts(names, spec);
  std::map<std::string, std::string> lost;
  double longest = 0;
  for (const HostProbe& p : probes) {
    longest = std::max(longest, p.seconds);
    if (!p.ok) lost[p.host] = p.reason;
  }
  leave_out_partitioned(probes, names, &lost);
  for (const HostProbe& p : probes) {
    if (!lost.count(p.host)) continue;
    const bool active =
        std::any_of(pool->active.begin(), pool->active.end(), [&](const HostSlots& h) { return h.name == p.host; });
    check.events.push_back({{"event", "host_lost"},
                            {"host", p.host},
                            {"role", active ? "job" : "spare"},
                            {"reason", lost[p.host]},
                            {"probe_s", p.seconds},
                            {"attempt", attempt}});
  }
  check.events.insert(check.events.begin(), json{{"event", "probe"},
                                                 {"attempt", attempt},
                                                 {"hosts", names.size()},
                                                 {"lost", lost.size()},
                                                 {"seconds", longest}});
  if (lost.empty()) return check;
  std::vector<std::string> unreplaced;
  for (const Replacement& r : replace_lost_hosts(pool, lost, &unreplaced)) {
    check.events.push_back(
        {{"event", "host_replaced"}, {"host", r.host}, {"by", r.by}, {"slots", r.slots}, {"reason", lost[r.host]}});
    check.changed = true;
  }
  for (const std::string& host : unreplaced)
    if (!shrink_without(pool, np, host, config, &check)) break;
  return check;
}

}  // namespace moe
