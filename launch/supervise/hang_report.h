// Naming a hang from the ranks' flight records (parallel/flight_recorder.h), as the supervisor last heard them in
// their heartbeats. For every group (of the rank grid: dp, ep, tp, ...) in which some rank waits in a collective,
// it compares the group's ranks' records and says:
//   - the collective (the highest sequence number reached in the group), the ranks waiting in it and since when,
//     and the ranks that never entered it (their last collective of the group is an earlier one, or they sent
//     no record) with their hosts: "ep group 1, alltoall #412: ranks 4-7 on host mh3 never entered it; ranks 0-3
//     wait in it since 31 s";
//   - a mismatch when the ranks are in different collectives: different operations at the same sequence number,
//     or a rank waiting in an earlier collective while others wait in a later one;
//   - a rank waiting in a point-to-point operation, and what its peer is doing.
// Not judged: which rank's library or link is at fault when every rank of a group waits in the same collective
// (that finding says so).
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "parallel/flight_recorder.h"
#include "parallel/rank_grid.h"

namespace moe {

struct RankFlight {
  std::string host;
  FlightSummary flight;
  double heard_ago_s = 0;  // since the beat that carried `flight`
};

// Each finding: {"group", "group_index", "ranks", "op", "seq", "mismatch", "waiting", "waiting_s", "not_entered",
// "not_entered_hosts", "finished", "ops", "summary"}; mismatches first, then the longest waits. `ranks` holds the
// ranks heard (world rank -> their state); a rank of a group missing from it has no record.
std::vector<nlohmann::json> hang_findings(const RankGrid& grid, const std::map<int64_t, RankFlight>& ranks);

// The ranks the findings point at: named as never entering a collective and waiting in none (of the findings'
// collectives): where the others wait for them, they are elsewhere (computing, frozen, in I/O). Ascending.
std::vector<int64_t> hang_suspects(const std::vector<nlohmann::json>& findings);

// "rank 3", "ranks 0-3", "ranks 0, 2, 5-6".
std::string rank_list_text(const std::vector<int64_t>& ranks);

}  // namespace moe
