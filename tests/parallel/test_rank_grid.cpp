// The rank grid, exhaustively: every combination of sizes for worlds of 1..16 ranks is either refused (and
// then truly does not fit) or yields coordinates and groups with the Megatron-Core folding. No MPI.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <iostream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "core/error.h"
#include "parallel/rank_grid.h"

namespace moe {
namespace {

using Ranks = std::vector<int64_t>;

constexpr GroupKind kAllKinds[] = {GroupKind::Tp, GroupKind::Dp,  GroupKind::Pp,   GroupKind::Etp,
                                   GroupKind::Ep, GroupKind::Edp, GroupKind::TpDp, GroupKind::Mp};

std::vector<int64_t> divisors(int64_t n) {
  std::vector<int64_t> out;
  for (int64_t d = 1; d <= n; ++d)
    if (n % d == 0) out.push_back(d);
  return out;
}

std::string describe(const GridSizes& s, int64_t num_experts) {
  std::ostringstream o;
  o << "world " << s.world << " tp " << s.tp << " pp " << s.pp << " dp " << s.dp << " ep " << s.ep << " etp " << s.etp
    << " num_experts " << num_experts;
  return o.str();
}

// The message of the BadInput error the constructor throws ("" when it does not throw).
std::string refusal(const GridSizes& s, int64_t num_experts) {
  try {
    RankGrid grid(s, num_experts);
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::BadInput) << e.message();
    return e.message().empty() ? "(empty message)" : e.message();
  }
  return "";
}

bool names_world_size(const std::string& message, int64_t world) {
  return std::regex_search(message, std::regex("world size (is )?" + std::to_string(world) + "\\b"));
}

// The numbers listed after `lead` ("parallel.ep can be one of 1, 2, 4").
std::vector<int64_t> listed_after(const std::string& message, const std::string& lead) {
  std::vector<int64_t> out;
  const size_t at = message.find(lead);
  if (at == std::string::npos) return out;
  std::istringstream in(message.substr(at + lead.size()));
  int64_t value;
  while (in >> value) {
    out.push_back(value);
    if (in.peek() != ',') break;
    in.ignore(1);
  }
  return out;
}

template <typename F>
void expect_internal_error(F&& f, const std::string& what) {
  try {
    f();
    ADD_FAILURE() << what << ": no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Internal) << what << ": " << e.message();
  }
}

struct Expected {
  int64_t dp = -1;  // resolved; -1 when the sizes do not fit
  int64_t edp = -1;
  bool dense_fits = false, expert_fits = false, experts_divide = false;
};

// The conditions, written out independently of the implementation.
Expected expected_fit(const GridSizes& s, int64_t num_experts) {
  Expected x;
  if (s.dp == 0) {
    if (s.world % (s.tp * s.pp) == 0) x.dp = s.world / (s.tp * s.pp);
  } else {
    x.dp = s.dp;
  }
  x.dense_fits = x.dp > 0 && s.tp * s.pp * x.dp == s.world;
  x.expert_fits = x.dense_fits && (s.tp * x.dp) % (s.etp * s.ep) == 0;
  if (x.expert_fits) x.edp = s.tp * x.dp / (s.etp * s.ep);
  x.experts_divide = x.expert_fits && (num_experts == 0 || num_experts % s.ep == 0);
  return x;
}

int64_t size_of(const RankGrid& g, GroupKind kind) {
  const GridSizes& s = g.sizes();
  switch (kind) {
    case GroupKind::Tp:
      return s.tp;
    case GroupKind::Dp:
      return s.dp;
    case GroupKind::Pp:
      return s.pp;
    case GroupKind::Etp:
      return s.etp;
    case GroupKind::Ep:
      return s.ep;
    case GroupKind::Edp:
      return g.edp();
    case GroupKind::TpDp:
      return s.tp * s.dp;
    case GroupKind::Mp:
      return s.tp * s.pp;
  }
  return -1;
}

int64_t coordinate_of(const RankGrid& g, const RankCoords& c, GroupKind kind) {
  switch (kind) {
    case GroupKind::Tp:
      return c.tp;
    case GroupKind::Dp:
      return c.dp;
    case GroupKind::Pp:
      return c.pp;
    case GroupKind::Etp:
      return c.etp;
    case GroupKind::Ep:
      return c.ep;
    case GroupKind::Edp:
      return c.edp;
    case GroupKind::TpDp:
      return c.tp + g.sizes().tp * c.dp;
    case GroupKind::Mp:
      return c.tp + g.sizes().tp * c.pp;
  }
  return -1;
}

// The coordinates a group's members share: every other coordinate of the kind's decomposition (Pp: of both).
std::vector<int64_t> shared_key(const RankCoords& c, GroupKind kind) {
  switch (kind) {
    case GroupKind::Tp:
      return {c.dp, c.pp};
    case GroupKind::Dp:
      return {c.tp, c.pp};
    case GroupKind::Pp:
      return {c.tp, c.dp, c.etp, c.ep, c.edp};
    case GroupKind::Etp:
      return {c.ep, c.edp, c.pp};
    case GroupKind::Ep:
      return {c.etp, c.edp, c.pp};
    case GroupKind::Edp:
      return {c.etp, c.ep, c.pp};
    case GroupKind::TpDp:
      return {c.pp};
    case GroupKind::Mp:
      return {c.dp};
  }
  return {};
}

bool contains_all(const Ranks& outer, const Ranks& inner) {
  return std::includes(outer.begin(), outer.end(), inner.begin(), inner.end());
}

// Every rank's coordinates: in range, folding back to the rank, distinct (into `coords`).
void check_coords(const RankGrid& grid, const std::string& where, std::vector<RankCoords>& coords) {
  const GridSizes& s = grid.sizes();
  const int64_t world = s.world, edp = grid.edp();
  std::set<std::tuple<int64_t, int64_t, int64_t>> dense_seen;
  coords.assign(static_cast<size_t>(world), RankCoords{});
  for (int64_t r = 0; r < world; ++r) {
    const RankCoords c = grid.coords(r);
    coords[static_cast<size_t>(r)] = c;
    ASSERT_TRUE(c.tp >= 0 && c.tp < s.tp && c.dp >= 0 && c.dp < s.dp && c.pp >= 0 && c.pp < s.pp) << where;
    ASSERT_TRUE(c.etp >= 0 && c.etp < s.etp && c.ep >= 0 && c.ep < s.ep && c.edp >= 0 && c.edp < edp) << where;
    ASSERT_EQ(c.tp + s.tp * (c.dp + s.dp * c.pp), r) << where;
    ASSERT_EQ(c.etp + s.etp * (c.ep + s.ep * (c.edp + edp * c.pp)), r) << where;
    ASSERT_EQ(grid.rank_of(c.tp, c.dp, c.pp), r) << where;
    dense_seen.insert({c.tp, c.dp, c.pp});
  }
  ASSERT_EQ(static_cast<int64_t>(dense_seen.size()), world) << where;
  std::set<std::tuple<int64_t, int64_t, int64_t, int64_t>> expert_full;
  for (const RankCoords& c : coords) expert_full.insert({c.etp, c.ep, c.edp, c.pp});
  ASSERT_EQ(static_cast<int64_t>(expert_full.size()), world) << where;
}

// Every kind of group: sorted members sharing the kind's key, one id per group, the groups partitioning
// the ranks.
void check_groups(const RankGrid& grid, const std::string& where, const std::vector<RankCoords>& coords) {
  const int64_t world = grid.sizes().world;
  for (GroupKind kind : kAllKinds) {
    const std::string at = where + " kind " + group_kind_name(kind);
    const int64_t size = size_of(grid, kind);
    std::map<int64_t, Ranks> by_id;
    for (int64_t r = 0; r < world; ++r) {
      const Ranks g = grid.group(r, kind);
      ASSERT_EQ(static_cast<int64_t>(g.size()), size) << at << " rank " << r;
      ASSERT_TRUE(std::is_sorted(g.begin(), g.end()) && std::adjacent_find(g.begin(), g.end()) == g.end())
          << at << " rank " << r;
      ASSERT_TRUE(g.front() >= 0 && g.back() < world) << at;
      const RankCoords& c = coords[static_cast<size_t>(r)];
      ASSERT_EQ(g[static_cast<size_t>(coordinate_of(grid, c, kind))], r) << at << " rank " << r;
      const int64_t id = grid.group_id(r, kind);
      for (int64_t m : g) {
        const RankCoords& cm = coords[static_cast<size_t>(m)];
        ASSERT_EQ(shared_key(cm, kind), shared_key(c, kind)) << at << " rank " << r << " member " << m;
        ASSERT_EQ(grid.group(m, kind), g) << at << " rank " << r << " member " << m;
        ASSERT_EQ(grid.group_id(m, kind), id) << at << " rank " << r << " member " << m;
      }
      // One id, one group: a second group with the same id would fail here.
      auto [it, inserted] = by_id.emplace(id, g);
      if (!inserted) {
        ASSERT_EQ(it->second, g) << at << " id " << id;
      }
    }
    // The groups partition the ranks.
    ASSERT_EQ(static_cast<int64_t>(by_id.size()), world / size) << at;
    std::vector<int> hits(static_cast<size_t>(world), 0);
    for (const auto& [id, g] : by_id)
      for (int64_t m : g) ++hits[static_cast<size_t>(m)];
    for (int64_t r = 0; r < world; ++r) ASSERT_EQ(hits[static_cast<size_t>(r)], 1) << at << " rank " << r;
  }
}

// How the dense and expert groups nest inside a pipeline stage, and Megatron's layout when nothing is
// tensor-parallel.
void check_nesting(const RankGrid& grid, const std::string& where, const std::vector<RankCoords>& coords) {
  const GridSizes& s = grid.sizes();
  const int64_t world = s.world, edp = grid.edp();
  for (int64_t r = 0; r < world; ++r) {
    const RankCoords& c = coords[static_cast<size_t>(r)];
    const Ranks stage = grid.group(r, GroupKind::TpDp);
    ASSERT_EQ(stage.front(), c.pp * s.tp * s.dp) << where;
    ASSERT_TRUE(contains_all(stage, grid.group(r, GroupKind::Ep))) << where << " rank " << r;
    ASSERT_TRUE(contains_all(stage, grid.group(r, GroupKind::Edp))) << where << " rank " << r;
    ASSERT_TRUE(contains_all(stage, grid.group(r, GroupKind::Etp))) << where << " rank " << r;
    for (int64_t m : grid.group(r, GroupKind::Edp)) {
      ASSERT_EQ(coords[static_cast<size_t>(m)].ep, c.ep) << where << " rank " << r << " member " << m;
      ASSERT_EQ(coords[static_cast<size_t>(m)].etp, c.etp) << where << " rank " << r << " member " << m;
    }
    if (s.tp == s.etp) {
      // Same tensor split for dense and expert layers: the expert groups subdivide the dense dp group, so
      // expert gradients sync over a subset of the ranks that sync dense gradients.
      const Ranks dp_group = grid.group(r, GroupKind::Dp);
      ASSERT_EQ(grid.group(r, GroupKind::Etp), grid.group(r, GroupKind::Tp)) << where;
      ASSERT_TRUE(contains_all(dp_group, grid.group(r, GroupKind::Ep))) << where << " rank " << r;
      ASSERT_TRUE(contains_all(dp_group, grid.group(r, GroupKind::Edp))) << where << " rank " << r;
      ASSERT_EQ(c.dp, c.ep + s.ep * c.edp) << where << " rank " << r;
    }
    if (s.tp == 1 && s.etp == 1) {
      // Megatron's layout: expert-parallel groups are runs of ep consecutive ranks, expert-data-parallel
      // groups stride by ep within the stage.
      Ranks ep_run, edp_strided;
      for (int64_t i = 0; i < s.ep; ++i) ep_run.push_back(r - r % s.ep + i);
      for (int64_t i = 0; i < edp; ++i) edp_strided.push_back(stage.front() + r % s.ep + i * s.ep);
      ASSERT_EQ(grid.group(r, GroupKind::Ep), ep_run) << where << " rank " << r;
      ASSERT_EQ(grid.group(r, GroupKind::Edp), edp_strided) << where << " rank " << r;
    }
  }
}

// Pipeline neighbours: the same tp and dp (and so the same expert coordinates) one stage away, none
// beyond the first and last stage; each is a member of the rank's pp group.
void check_pipeline_neighbors(const RankGrid& grid, const std::string& where, const std::vector<RankCoords>& coords) {
  const GridSizes& s = grid.sizes();
  for (int64_t r = 0; r < s.world; ++r) {
    const RankCoords& c = coords[static_cast<size_t>(r)];
    const Ranks pp_group = grid.group(r, GroupKind::Pp);
    for (int64_t offset : {int64_t{-1}, int64_t{1}}) {
      const int64_t neighbor = grid.pipeline_neighbor(r, offset);
      const int64_t stage = c.pp + offset;
      if (stage < 0 || stage >= s.pp) {
        ASSERT_EQ(neighbor, -1) << where << " rank " << r << " offset " << offset;
        continue;
      }
      ASSERT_EQ(neighbor, pp_group[static_cast<size_t>(stage)]) << where << " rank " << r << " offset " << offset;
      const RankCoords& cn = coords[static_cast<size_t>(neighbor)];
      ASSERT_EQ(std::make_tuple(cn.tp, cn.dp, cn.pp, cn.etp, cn.ep, cn.edp),
                std::make_tuple(c.tp, c.dp, stage, c.etp, c.ep, c.edp))
          << where << " rank " << r << " offset " << offset;
      ASSERT_EQ(grid.pipeline_neighbor(neighbor, -offset), r) << where << " rank " << r << " offset " << offset;
    }
  }
}

// Every property of an accepted grid; `where` names the configuration in failures. A failed assertion in
// one part ends the check.
void check_grid(const RankGrid& grid, const std::string& where) {
  const GridSizes& s = grid.sizes();
  const int64_t world = s.world;
  std::vector<RankCoords> coords;
  check_coords(grid, where, coords);
  for (const auto& part : {check_groups, check_nesting, check_pipeline_neighbors}) {
    if (::testing::Test::HasFatalFailure()) return;
    part(grid, where, coords);
  }
  if (::testing::Test::HasFatalFailure()) return;
  expect_internal_error([&] { grid.coords(-1); }, where + " coords(-1)");
  expect_internal_error([&] { grid.coords(world); }, where + " coords(world)");
  expect_internal_error([&] { grid.group(world, GroupKind::Tp); }, where + " group(world)");
  expect_internal_error([&] { grid.group_id(-1, GroupKind::Ep); }, where + " group_id(-1)");
  expect_internal_error([&] { grid.rank_of(s.tp, 0, 0); }, where + " rank_of(tp, 0, 0)");
  expect_internal_error([&] { grid.rank_of(0, 0, s.pp); }, where + " rank_of(0, 0, pp)");
}

// Every refused configuration's message names the keys of the condition that failed and the world size,
// and the values it offers in their place do fit.
void check_refusal(const GridSizes& s, int64_t num_experts, const Expected& x, const std::string& message,
                   const std::string& where) {
  ASSERT_TRUE(names_world_size(message, s.world)) << where << ": " << message;
  std::vector<std::string> keys;
  if (!x.dense_fits) {
    keys = {"parallel.tp", "parallel.pp", "parallel.dp"};
    if (s.dp != 0) {
      ASSERT_NE(message.find("mpirun -np " + std::to_string(s.tp * s.pp * s.dp)), std::string::npos)
          << where << ": " << message;
    }
    if (s.world % (s.tp * s.pp) == 0) {
      ASSERT_NE(message.find("parallel.dp to " + std::to_string(s.world / (s.tp * s.pp))), std::string::npos)
          << where << ": " << message;
    }
  } else if (!x.expert_fits) {
    keys = {"parallel.ep", "parallel.expert_tp", "parallel.tp", "parallel.dp"};
    ASSERT_NE(
        message.find("parallel.expert_tp * parallel.ep = " + std::to_string(s.etp) + " * " + std::to_string(s.ep)),
        std::string::npos)
        << where << ": " << message;
  } else {
    keys = {"moe.num_experts", "parallel.ep"};
    ASSERT_NE(message.find("moe.num_experts = " + std::to_string(num_experts)), std::string::npos) << where;
    ASSERT_NE(message.find("parallel.ep = " + std::to_string(s.ep)), std::string::npos) << where;
  }
  for (const std::string& key : keys)
    ASSERT_NE(message.find(key), std::string::npos) << where << ": " << key << " not in: " << message;
  for (int64_t ep : listed_after(message, "parallel.ep can be one of ")) {
    GridSizes fixed = s;
    fixed.ep = ep;
    ASSERT_EQ(refusal(fixed, num_experts), "") << where << ": suggested parallel.ep " << ep << " in: " << message;
  }
}

TEST(RankGrid, ExhaustiveUpToSixteenRanks) {
  int64_t accepted = 0, refused = 0;
  for (int64_t world = 1; world <= 16; ++world) {
    const std::vector<int64_t> ds = divisors(world);
    std::vector<int64_t> dps = ds;
    dps.insert(dps.begin(), 0);  // "auto"
    for (int64_t tp : ds)
      for (int64_t pp : ds)
        for (int64_t dp : dps)
          for (int64_t ep : ds)
            for (int64_t etp : ds)
              for (int64_t num_experts : {0, 8, 12}) {
                GridSizes s;
                s.world = world;
                s.tp = tp;
                s.pp = pp;
                s.dp = dp;
                s.ep = ep;
                s.etp = etp;
                const std::string where = describe(s, num_experts);
                const Expected x = expected_fit(s, num_experts);
                const std::string message = refusal(s, num_experts);
                ASSERT_EQ(message.empty(), x.experts_divide) << where << ": " << message;
                if (!x.experts_divide) {
                  check_refusal(s, num_experts, x, message, where);
                  if (HasFatalFailure()) return;
                  ++refused;
                  continue;
                }
                const RankGrid grid(s, num_experts);
                ASSERT_EQ(grid.sizes().dp, x.dp) << where;
                ASSERT_EQ(grid.edp(), x.edp) << where;
                ASSERT_EQ(grid.sizes().world, world) << where;
                if (num_experts > 0) {
                  ASSERT_EQ(grid.experts_per_rank(num_experts) * ep, num_experts) << where;
                }
                check_grid(grid, where);
                if (HasFatalFailure()) return;
                ++accepted;
              }
  }
  RecordProperty("accepted", static_cast<int>(accepted));
  RecordProperty("refused", static_cast<int>(refused));
  std::cout << "rank grid: " << accepted << " configurations accepted and checked, " << refused << " refused\n";
  EXPECT_GT(accepted, 1000);
  EXPECT_GT(refused, 1000);
}

RankGrid make_grid(int64_t world, int64_t tp, int64_t pp, int64_t dp, int64_t ep, int64_t etp,
                   int64_t num_experts = 0) {
  GridSizes s;
  s.world = world;
  s.tp = tp;
  s.pp = pp;
  s.dp = dp;
  s.ep = ep;
  s.etp = etp;
  return RankGrid(s, num_experts);
}

std::vector<Ranks> all_groups(const RankGrid& grid, GroupKind kind) {
  std::map<int64_t, Ranks> by_id;
  for (int64_t r = 0; r < grid.sizes().world; ++r) by_id.emplace(grid.group_id(r, kind), grid.group(r, kind));
  std::vector<Ranks> out;
  for (auto& [id, g] : by_id) out.push_back(g);
  std::sort(out.begin(), out.end());
  return out;
}

TEST(RankGrid, PureExpertParallelEightRanks) {
  // world 8, dp 8, ep 4: experts split over runs of 4 consecutive ranks, replicated across the two runs.
  const RankGrid grid = make_grid(8, 1, 1, 8, 4, 1, 8);
  EXPECT_EQ(grid.edp(), 2);
  EXPECT_EQ(all_groups(grid, GroupKind::Ep), (std::vector<Ranks>{{0, 1, 2, 3}, {4, 5, 6, 7}}));
  EXPECT_EQ(all_groups(grid, GroupKind::Edp), (std::vector<Ranks>{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(all_groups(grid, GroupKind::Dp), (std::vector<Ranks>{{0, 1, 2, 3, 4, 5, 6, 7}}));
  EXPECT_EQ(all_groups(grid, GroupKind::Tp).size(), 8u);
  EXPECT_EQ(grid.experts_per_rank(8), 2);
  const RankCoords c = grid.coords(6);
  EXPECT_EQ(c.dp, 6);
  EXPECT_EQ(c.ep, 2);
  EXPECT_EQ(c.edp, 1);
}

TEST(RankGrid, TensorTwoDataFourExpertTwo) {
  // world 8, tp 2, dp 4, ep 2, etp 1: edp = 2 * 4 / (1 * 2) = 4.
  //   dense:  rank = tp + 2 * dp        -> tp groups {0,1},{2,3},{4,5},{6,7}; dp groups {0,2,4,6},{1,3,5,7}
  //   expert: rank = ep + 2 * edp       -> ep groups {0,1},{2,3},{4,5},{6,7}; edp groups {0,2,4,6},{1,3,5,7}
  // The expert layers run untensored: the two ranks of a tp pair hold different experts.
  const RankGrid grid = make_grid(8, 2, 1, 4, 2, 1);
  EXPECT_EQ(grid.edp(), 4);
  const std::vector<Ranks> pairs = {{0, 1}, {2, 3}, {4, 5}, {6, 7}};
  const std::vector<Ranks> strided = {{0, 2, 4, 6}, {1, 3, 5, 7}};
  EXPECT_EQ(all_groups(grid, GroupKind::Tp), pairs);
  EXPECT_EQ(all_groups(grid, GroupKind::Dp), strided);
  EXPECT_EQ(all_groups(grid, GroupKind::Ep), pairs);
  EXPECT_EQ(all_groups(grid, GroupKind::Edp), strided);
  EXPECT_EQ(all_groups(grid, GroupKind::Etp).size(), 8u);
  EXPECT_EQ(all_groups(grid, GroupKind::Pp).size(), 8u);
  const RankCoords c = grid.coords(5);
  EXPECT_EQ(std::make_tuple(c.tp, c.dp, c.pp), std::make_tuple(1, 2, 0));
  EXPECT_EQ(std::make_tuple(c.etp, c.ep, c.edp), std::make_tuple(0, 1, 2));
  EXPECT_EQ(grid.rank_of(1, 2, 0), 5);
}

TEST(RankGrid, ExpertTensorTwo) {
  // world 8, tp 2, dp 4, ep 2, etp 2: edp = 2; expert rank = etp + 2 * (ep + 2 * edp).
  const RankGrid grid = make_grid(8, 2, 1, 4, 2, 2);
  EXPECT_EQ(grid.edp(), 2);
  EXPECT_EQ(all_groups(grid, GroupKind::Etp), (std::vector<Ranks>{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(all_groups(grid, GroupKind::Ep), (std::vector<Ranks>{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(all_groups(grid, GroupKind::Edp), (std::vector<Ranks>{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  const RankCoords c = grid.coords(6);
  EXPECT_EQ(std::make_tuple(c.etp, c.ep, c.edp), std::make_tuple(0, 1, 1));
}

TEST(RankGrid, TwoPipelineStages) {
  // world 16, tp 2, pp 2, dp 4, ep 4, etp 1: stages {0..7} and {8..15}, edp 2.
  const RankGrid grid = make_grid(16, 2, 2, 0, 4, 1, 8);
  EXPECT_EQ(grid.sizes().dp, 4);
  EXPECT_EQ(grid.edp(), 2);
  EXPECT_EQ(all_groups(grid, GroupKind::TpDp),
            (std::vector<Ranks>{{0, 1, 2, 3, 4, 5, 6, 7}, {8, 9, 10, 11, 12, 13, 14, 15}}));
  EXPECT_EQ(grid.group(3, GroupKind::Pp), (Ranks{3, 11}));
  EXPECT_EQ(grid.group(9, GroupKind::Ep), (Ranks{8, 9, 10, 11}));
  EXPECT_EQ(grid.group(9, GroupKind::Edp), (Ranks{9, 13}));
  EXPECT_EQ(grid.group(9, GroupKind::Dp), (Ranks{9, 11, 13, 15}));
  EXPECT_EQ(grid.group(9, GroupKind::Tp), (Ranks{8, 9}));
  // Model parallel (tp x pp): the ranks with dp coordinate 0 of both stages, tp fastest.
  EXPECT_EQ(grid.group(9, GroupKind::Mp), (Ranks{0, 1, 8, 9}));
  EXPECT_EQ(grid.group(11, GroupKind::Mp), (Ranks{2, 3, 10, 11}));
  EXPECT_EQ(grid.pipeline_neighbor(3, 1), 11);
  EXPECT_EQ(grid.pipeline_neighbor(11, -1), 3);
  EXPECT_EQ(grid.pipeline_neighbor(11, 1), -1);
  EXPECT_EQ(grid.pipeline_neighbor(3, -1), -1);
  EXPECT_EQ(grid.coords(13).pp, 1);
  EXPECT_EQ(grid.rank_of(1, 2, 1), 13);
  // The group id is usable as an MPI_Comm_split colour: one value per group.
  EXPECT_EQ(grid.group_id(9, GroupKind::Edp), grid.group_id(13, GroupKind::Edp));
  EXPECT_NE(grid.group_id(9, GroupKind::Edp), grid.group_id(12, GroupKind::Edp));
  // Every rank's coordinates: the table of docs/parallel.md "The rank grid".
  const std::vector<int64_t> tp = {0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1};
  const std::vector<int64_t> dp = {0, 0, 1, 1, 2, 2, 3, 3, 0, 0, 1, 1, 2, 2, 3, 3};
  const std::vector<int64_t> pp = {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1};
  const std::vector<int64_t> ep = {0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3};
  const std::vector<int64_t> edp = {0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1};
  for (int64_t r = 0; r < 16; ++r) {
    const RankCoords c = grid.coords(r);
    const size_t i = size_t(r);
    EXPECT_EQ(std::vector<int64_t>({c.tp, c.dp, c.pp, c.ep, c.edp, c.etp}),
              std::vector<int64_t>({tp[i], dp[i], pp[i], ep[i], edp[i], 0}))
        << "rank " << r;
  }
}

TEST(RankGrid, SingleRank) {
  const RankGrid grid = make_grid(1, 1, 1, 0, 1, 1, 12);
  EXPECT_EQ(grid.sizes().dp, 1);
  EXPECT_EQ(grid.edp(), 1);
  for (GroupKind kind : kAllKinds) EXPECT_EQ(grid.group(0, kind), (Ranks{0})) << group_kind_name(kind);
}

TEST(RankGrid, RefusalMessagesSayWhatFits) {
  auto message = [](int64_t world, int64_t tp, int64_t pp, int64_t dp, int64_t ep, int64_t etp,
                    int64_t num_experts = 0) {
    GridSizes s;
    s.world = world;
    s.tp = tp;
    s.pp = pp;
    s.dp = dp;
    s.ep = ep;
    s.etp = etp;
    return refusal(s, num_experts);
  };
  auto has = [](const std::string& text, const std::string& part) {
    return testing::AssertionResult(text.find(part) != std::string::npos) << "'" << part << "' not in: " << text;
  };
  EXPECT_TRUE(has(message(4, 2, 1, 3, 1, 1),
                  "parallel.tp * parallel.pp * parallel.dp = 2 * 1 * 3 = 6, but the world size is 4; "
                  "use mpirun -np 6 or set parallel.dp to 2 or \"auto\""));
  const std::string odd_tp = message(6, 4, 1, 2, 1, 1);
  EXPECT_TRUE(has(odd_tp, "= 4 * 1 * 2 = 8, but the world size is 6; use mpirun -np 8"));
  EXPECT_TRUE(has(odd_tp, "parallel.tp and parallel.pp whose product is one of 1, 2, 3, 6"));
  const std::string auto_dp = message(4, 3, 1, 0, 1, 1);
  EXPECT_TRUE(has(auto_dp, "parallel.dp = \"auto\" needs parallel.tp * parallel.pp = 3 * 1 = 3"));
  EXPECT_TRUE(has(auto_dp, "world size 4"));
  EXPECT_TRUE(has(auto_dp, "mpirun -np 3"));
  // A tensor-parallel size that does not divide the world, with dp "auto" or given: each names every key
  // of the product and the world size.
  for (const std::string& text : {message(3, 2, 1, 0, 1, 1), message(3, 2, 1, 1, 1, 1), message(3, 2, 1, 2, 1, 2)})
    for (const char* part : {"parallel.tp", "parallel.pp", "parallel.dp", "world size"}) EXPECT_TRUE(has(text, part));
  const std::string ep3 = message(8, 1, 1, 8, 3, 1);
  EXPECT_TRUE(has(ep3,
                  "parallel.expert_tp * parallel.ep = 1 * 3 = 3 does not divide "
                  "parallel.tp * parallel.dp = 1 * 8 = 8"));
  EXPECT_TRUE(has(ep3, "world size 8"));
  EXPECT_TRUE(has(ep3, "parallel.ep can be one of 1, 2, 4, 8"));
  EXPECT_TRUE(has(message(8, 1, 1, 8, 3, 1, 12), "parallel.ep can be one of 1, 2, 4"));
  EXPECT_TRUE(has(message(8, 2, 1, 4, 1, 3), "parallel.expert_tp can be one of 1, 2, 4, 8"));
  const std::string experts = message(16, 1, 1, 16, 8, 1, 12);
  EXPECT_TRUE(has(experts, "moe.num_experts = 12 is not divisible by parallel.ep = 8 (world size 16)"));
  EXPECT_TRUE(has(experts, "parallel.ep can be one of 1, 2, 4"));
  EXPECT_TRUE(has(message(4, 0, 1, 0, 1, 1), "parallel.tp = 0"));
  EXPECT_TRUE(has(message(4, 1, -2, 0, 1, 1), "parallel.pp = -2"));
  EXPECT_TRUE(has(message(4, 1, 1, -1, 1, 1), "parallel.dp = -1"));
  EXPECT_TRUE(has(message(4, 1, 1, 0, 0, 1), "parallel.ep = 0"));
  EXPECT_TRUE(has(message(4, 1, 1, 0, 1, 0), "parallel.expert_tp = 0"));
  EXPECT_TRUE(has(message(4, 1, 1, 0, 1, 1, -3), "moe.num_experts = -3"));
  EXPECT_TRUE(has(message(0, 1, 1, 0, 1, 1), "world size 0"));
  // Sizes past the world size get the message of the product they break; absurd ones are refused
  // before any product could overflow.
  EXPECT_TRUE(has(message(4, 1, 1, 5, 1, 1),
                  "= 1 * 1 * 5 = 5, but the world size is 4; use mpirun -np 5 or set "
                  "parallel.dp to 4"));
  EXPECT_TRUE(has(message(4, 1, 1, 0, 8, 1), "parallel.expert_tp * parallel.ep = 1 * 8 = 8 does not divide"));
  const int64_t huge = int64_t{1} << 40, int_max = 2147483647;
  EXPECT_TRUE(has(message(4, huge, huge, huge, 1, 1), "parallel.tp = 1099511627776 is out of range"));
  EXPECT_TRUE(has(message(4, int_max, int_max, int_max, int_max, int_max),
                  "= 2147483647 * 2147483647 * 2147483647 = 9903520300447984150353281023, but the world size is 4"));
  EXPECT_TRUE(has(message(4, 1, 1, 0, int_max, int_max), "= 2147483647 * 2147483647 = 4611686014132420609"));
  for (const std::string& text : {message(4, 0, 1, 0, 1, 1), message(4, 1, 1, 5, 1, 1), message(4, 1, 1, 0, 8, 1),
                                  message(4, huge, 1, 0, 1, 1), message(4, 1, 1, 0, 1, 1, -3)})
    EXPECT_TRUE(names_world_size(text, 4)) << text;
}

}  // namespace
}  // namespace moe
