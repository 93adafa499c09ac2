// Naming a hang from the ranks' flight records.
#include "launch/supervise/hang_report.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <set>

namespace moe {
using json = nlohmann::json;

namespace {

// The members of `rank`'s group named `label` ("ep", "ep.data", "world"), ascending; empty when unknown.
std::vector<int64_t> members_of(const RankGrid& grid, const std::string& label, int64_t rank) {
  const std::string kind = label.substr(0, label.find('.'));
  if (kind == "world") {
    std::vector<int64_t> all(size_t(grid.sizes().world));
    for (size_t r = 0; r < all.size(); ++r) all[r] = int64_t(r);
    return all;
  }
  for (GroupKind k :
       {GroupKind::Tp, GroupKind::Dp, GroupKind::Pp, GroupKind::Etp, GroupKind::Ep, GroupKind::Edp, GroupKind::Mp})
    if (kind == group_kind_name(k)) return grid.group(rank, k);
  return {};
}

// The group's number among the groups of its kind, in the order of their first ranks.
int64_t group_index(const RankGrid& grid, const std::string& label, int64_t first_member) {
  std::set<int64_t> firsts;
  for (int64_t r = 0; r < grid.sizes().world; ++r) firsts.insert(members_of(grid, label, r).front());
  return int64_t(std::distance(firsts.begin(), firsts.find(first_member)));
}

std::optional<FlightGroupState> record_of(const std::map<int64_t, RankFlight>& ranks, int64_t rank,
                                          const std::string& label) {
  const auto it = ranks.find(rank);
  if (it == ranks.end()) return std::nullopt;
  for (const FlightGroupState& g : it->second.flight.groups)
    if (g.group == label) return g;
  return std::nullopt;
}

std::string seconds_text(double s) {
  char text[32];
  std::snprintf(text, sizeof text, "%.0f s", std::max(0.0, std::round(s)));
  return text;
}

std::string host_of(const std::map<int64_t, RankFlight>& ranks, int64_t rank) {
  const auto it = ranks.find(rank);
  return it == ranks.end() ? std::string("(never heard)") : it->second.host;
}

// "ranks 4-7 on host mh3, rank 9 on host mh4".
std::string ranks_on_hosts(const std::map<int64_t, RankFlight>& ranks, const std::vector<int64_t>& list) {
  std::vector<std::pair<std::string, std::vector<int64_t>>> by_host;
  for (int64_t r : list) {
    const std::string host = host_of(ranks, r);
    auto it = std::find_if(by_host.begin(), by_host.end(), [&](const auto& h) { return h.first == host; });
    if (it == by_host.end())
      by_host.push_back({host, {r}});
    else
      it->second.push_back(r);
  }
  std::string text;
  for (const auto& [host, rs] : by_host) text += (text.empty() ? "" : ", ") + rank_list_text(rs) + " on host " + host;
  return text;
}

std::string state_text(const FlightGroupState& g, double heard_ago_s) {
  return g.op + " #" + std::to_string(g.seq) +
         (g.waiting ? " (waiting " + seconds_text(g.age_s + heard_ago_s) + ")" : " (finished)");
}

// The finding of one group in which some rank waits.
json group_finding(const RankGrid& grid, const std::map<int64_t, RankFlight>& ranks, const std::string& label,
                   const std::vector<int64_t>& members) {
  int64_t target = 0;
  for (int64_t m : members)
    if (const auto g = record_of(ranks, m, label)) target = std::max(target, g->seq);
  std::vector<int64_t> waiting, finished, not_entered, waiting_earlier;
  std::set<std::string> ops_at_target;
  std::string op;
  double waiting_s = 0;
  json ops = json::array();
  for (int64_t m : members) {
    const auto g = record_of(ranks, m, label);
    const double ago = ranks.count(m) ? ranks.at(m).heard_ago_s : 0.0;
    ops.push_back(g ? json{{"rank", m}, {"op", g->op}, {"seq", g->seq}, {"waiting", g->waiting}}
                    : json{{"rank", m}, {"op", nullptr}});
    if (!g || g->seq < target) {
      (g && g->waiting ? waiting_earlier : not_entered).push_back(m);
      continue;
    }
    ops_at_target.insert(g->op);
    if (op.empty() || g->waiting) op = g->op;
    (g->waiting ? waiting : finished).push_back(m);
    if (g->waiting) waiting_s = std::max(waiting_s, g->age_s + ago);
  }
  std::vector<std::string> not_entered_hosts;
  for (int64_t r : not_entered)
    if (std::find(not_entered_hosts.begin(), not_entered_hosts.end(), host_of(ranks, r)) == not_entered_hosts.end())
      not_entered_hosts.push_back(host_of(ranks, r));
  const bool mismatch = ops_at_target.size() > 1 || (!waiting_earlier.empty() && !waiting.empty());
  const std::string name = label + " group " + std::to_string(group_index(grid, label, members.front()));
  std::string summary;
  if (mismatch) {
    summary = name + ": collective mismatch, the ranks are in different collectives:";
    for (int64_t m : members)
      if (const auto g = record_of(ranks, m, label))
        summary += " rank " + std::to_string(m) + " in " + state_text(*g, ranks.at(m).heard_ago_s) + ";";
    if (!not_entered.empty()) summary += " " + ranks_on_hosts(ranks, not_entered) + " in none of them;";
    summary.pop_back();
  } else {
    summary = name + ", " + op + " #" + std::to_string(target) + ": ";
    if (!not_entered.empty()) summary += ranks_on_hosts(ranks, not_entered) + " never entered it; ";
    summary += rank_list_text(waiting) + (waiting.size() == 1 ? " waits" : " wait") + " in it since " +
               seconds_text(waiting_s);
    if (!finished.empty()) summary += "; " + rank_list_text(finished) + " finished it";
    if (not_entered.empty() && finished.empty())
      summary += " (every rank of the group is in it: stuck inside the operation, in a peer's library or link)";
  }
  return {{"group", label},
          {"group_index", group_index(grid, label, members.front())},
          {"ranks", members},
          {"op", op},
          {"seq", target},
          {"mismatch", mismatch},
          {"waiting", waiting},
          {"waiting_s", waiting_s},
          {"not_entered", not_entered},
          {"not_entered_hosts", not_entered_hosts},
          {"finished", finished},
          {"ops", ops},
          {"summary", summary}};
}

// A rank waiting in a point-to-point operation, and what its peer is in.
json peer_finding(const RankGrid& grid, const std::map<int64_t, RankFlight>& ranks, int64_t rank,
                  const FlightPeerState& p) {
  const std::vector<int64_t> members = members_of(grid, p.group, rank);
  const int64_t peer = p.peer >= 0 && p.peer < int64_t(members.size()) ? members[size_t(p.peer)] : -1;
  std::string peer_state = "never heard";
  if (const auto it = ranks.find(peer); it != ranks.end()) {
    peer_state = "in no communication";
    for (const FlightGroupState& g : it->second.flight.groups)
      if (g.waiting) peer_state = "in " + g.group + " " + state_text(g, it->second.heard_ago_s);
    for (const FlightPeerState& q : it->second.flight.p2p) peer_state = "in " + q.group + " " + q.op;
  }
  const std::string name = p.group + " group " + std::to_string(group_index(grid, p.group, members.front()));
  return {{"group", p.group},
          {"group_index", group_index(grid, p.group, members.front())},
          {"op", p.op},
          {"rank", rank},
          {"peer", peer},
          {"waiting_s", p.age_s + ranks.at(rank).heard_ago_s},
          {"mismatch", false},
          {"summary", name + ": rank " + std::to_string(rank) + " waits in " + p.op + " with rank " +
                          std::to_string(peer) + " since " + seconds_text(p.age_s + ranks.at(rank).heard_ago_s) +
                          "; rank " + std::to_string(peer) + " is " + peer_state}};
}

}  // namespace

std::string rank_list_text(const std::vector<int64_t>& ranks) {
  std::vector<int64_t> sorted = ranks;
  std::sort(sorted.begin(), sorted.end());
  std::string text;
  for (size_t i = 0; i < sorted.size();) {
    size_t j = i;
    while (j + 1 < sorted.size() && sorted[j + 1] == sorted[j] + 1) ++j;
    text += (text.empty() ? "" : ", ") + std::to_string(sorted[i]) + (j > i ? "-" + std::to_string(sorted[j]) : "");
    i = j + 1;
  }
  return (sorted.size() == 1 ? "rank " : "ranks ") + text;
}

std::vector<int64_t> hang_suspects(const std::vector<json>& findings) {
  std::set<int64_t> absent, present;
  for (const json& f : findings) {
    for (const json& r : f.value("not_entered", json::array())) absent.insert(r.get<int64_t>());
    for (const json& r : f.value("waiting", json::array())) present.insert(r.get<int64_t>());
    if (f.contains("rank")) present.insert(f["rank"].get<int64_t>());  // a point-to-point wait
  }
  std::vector<int64_t> out;
  for (int64_t r : absent)
    if (!present.count(r)) out.push_back(r);
  return out;
}

std::vector<json> hang_findings(const RankGrid& grid, const std::map<int64_t, RankFlight>& ranks) {
  std::vector<json> findings;
  std::set<std::pair<std::string, int64_t>> done;  // (group, first member)
  for (const auto& [rank, r] : ranks) {
    for (const FlightGroupState& g : r.flight.groups) {
      if (!g.waiting) continue;
      const std::vector<int64_t> members = members_of(grid, g.group, rank);
      if (members.empty() || !done.insert({g.group, members.front()}).second) continue;
      findings.push_back(group_finding(grid, ranks, g.group, members));
    }
    for (const FlightPeerState& p : r.flight.p2p)
      if (!members_of(grid, p.group, rank).empty()) findings.push_back(peer_finding(grid, ranks, rank, p));
  }
  std::stable_sort(findings.begin(), findings.end(), [](const json& a, const json& b) {
    if (a["mismatch"] != b["mismatch"]) return a["mismatch"].get<bool>();
    return a["waiting_s"].get<double>() > b["waiting_s"].get<double>();
  });
  return findings;
}

}  // namespace moe
