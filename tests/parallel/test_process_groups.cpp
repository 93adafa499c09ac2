// The process groups (make_process_groups) under mpirun with 8 ranks, for several layouts of the rank
// grid: every communicator holds exactly the ranks the pure function (RankGrid::group) lists, in that
// order; every rank of the world agrees on every rank's groups; an all-reduce over each group sums
// exactly its members' contributions; the pipeline neighbours exchange over the pp group.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdint>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "parallel/mpi_communicator.h"
#include "parallel/process_groups.h"
#include "parallel/self_communicator.h"
#include "tests/parallel/collective_checks.h"

namespace moe {
namespace {

using namespace ::moe::comm_test;

struct Layout {
  int64_t tp, pp, dp, ep, etp;
};

std::string describe(const Layout& l) {
  return "tp " + std::to_string(l.tp) + " pp " + std::to_string(l.pp) + " dp " + std::to_string(l.dp) + " ep " +
         std::to_string(l.ep) + " etp " + std::to_string(l.etp);
}

// Every layout of 8 ranks the tests cover (dp 0: auto).
const std::vector<Layout> kLayouts = {
    {2, 2, 2, 1, 1}, {2, 2, 2, 2, 1}, {2, 1, 4, 2, 2}, {1, 2, 4, 2, 1}, {1, 1, 8, 4, 1},
    {4, 1, 2, 2, 1}, {1, 8, 1, 1, 1}, {8, 1, 1, 4, 2}, {2, 4, 0, 2, 1}, {1, 2, 0, 4, 1},
};

std::vector<std::pair<GroupKind, Communicator*>> groups_of(const ProcessGroups& g) {
  return {{GroupKind::Tp, g.tp.get()},   {GroupKind::Pp, g.pp.get()}, {GroupKind::Dp, g.dp.get()},
          {GroupKind::Etp, g.etp.get()}, {GroupKind::Ep, g.ep.get()}, {GroupKind::Edp, g.edp.get()},
          {GroupKind::Mp, g.mp.get()}};
}

// This rank's wrong facts about one group: size, rank, members in order (gathered over the group
// itself), what every other world rank believes its group is, and a sum over the group.
int64_t check_group(const ProcessGroups& g, GroupKind kind, Communicator& comm, const std::string& where) {
  const RankGrid& grid = g.grid;
  const int64_t world = grid.sizes().world, me = g.rank;
  const std::vector<int64_t> expected = grid.group(me, kind);
  const int64_t size = int64_t(expected.size());
  int64_t wrong = 0;
  wrong += comm.size() != size;
  int64_t position = 0;
  while (position < size && expected[position] != me) ++position;
  wrong += comm.rank() != position;
  EXPECT_EQ(comm.size(), size) << where;
  EXPECT_EQ(comm.rank(), position) << where;
  if (comm.size() != size) return wrong;  // the same on every member: no collective is left half-made

  // Members in communicator order, as this group sees them.
  std::vector<int64_t> members(size, -1);
  comm.allgather(&me, members.data(), 1);
  wrong += members != expected;
  EXPECT_EQ(members, expected) << where;

  // Every world rank's view of its own group, gathered everywhere: each must be what the grid says.
  std::vector<int64_t> views(world * size, -1);
  MPI_Allgather(members.data(), int(size), MPI_INT64_T, views.data(), int(size), MPI_INT64_T, MPI_COMM_WORLD);
  for (int64_t r = 0; r < world; ++r) {
    const std::vector<int64_t> view(views.begin() + r * size, views.begin() + (r + 1) * size);
    wrong += view != grid.group(r, kind);
  }

  // Sums: one bit per member (the membership, exactly) and values that encode the world rank.
  int64_t mask = int64_t{1} << me;
  comm.allreduce_sum(&mask, 1);
  int64_t expected_mask = 0, rank_sum = 0;
  for (int64_t m : expected) expected_mask |= int64_t{1} << m, rank_sum += m;
  wrong += mask != expected_mask;
  std::vector<float> values(5);
  for (int64_t i = 0; i < 5; ++i) values[i] = encode(int(me), i);
  comm.allreduce_sum(values.data(), 5);
  for (int64_t i = 0; i < 5; ++i) wrong += values[i] != static_cast<float>(1000 * rank_sum + size * i);
  return wrong;
}

TEST(ProcessGroups, EveryGroupOfEveryLayoutHoldsTheGridsRanks) {
  int world_size = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world_size);
  ASSERT_EQ(world_size, 8) << "this test lays out 8 ranks";
  for (const Layout& l : kLayouts) {
    const RankGrid grid(GridSizes{8, l.tp, l.pp, l.dp, l.ep, l.etp}, /*num_experts=*/8);
    const ProcessGroups g = make_process_groups(MpiCommunicator::world(), grid);
    const RankCoords expected = grid.coords(g.rank);
    EXPECT_EQ(std::make_tuple(g.coords.tp, g.coords.dp, g.coords.pp, g.coords.etp, g.coords.ep, g.coords.edp),
              std::make_tuple(expected.tp, expected.dp, expected.pp, expected.etp, expected.ep, expected.edp));
    EXPECT_EQ(g.world->size(), 8);
    int64_t wrong = 0;
    for (const auto& [kind, comm] : groups_of(g)) {
      const std::string where = describe(l) + ", group " + group_kind_name(kind) + ", rank " + std::to_string(g.rank);
      ASSERT_NE(comm, nullptr) << where;
      wrong += check_group(g, kind, *comm, where);
    }
    EXPECT_EQ(sum_over_world(wrong), 0) << "wrong facts summed over ranks, " << describe(l);
  }
}

// Each stage sends to the next over the pp group (its rank there is the stage) and receives from the
// previous one; what arrives names the sender's world rank, which must be prev_stage.
TEST(ProcessGroups, PipelineNeighboursExchangeOverThePpGroup) {
  for (const Layout& l : kLayouts) {
    const RankGrid grid(GridSizes{8, l.tp, l.pp, l.dp, l.ep, l.etp}, /*num_experts=*/8);
    const ProcessGroups g = make_process_groups(MpiCommunicator::world(), grid);
    const int stage = int(g.coords.pp), stages = int(grid.sizes().pp);
    int64_t wrong = 0;
    wrong += g.prev_stage != (stage > 0 ? grid.rank_of(g.coords.tp, g.coords.dp, stage - 1) : -1);
    wrong += g.next_stage != (stage + 1 < stages ? grid.rank_of(g.coords.tp, g.coords.dp, stage + 1) : -1);
    const int64_t me = g.rank;
    int64_t from_prev = -1, from_next = -1;
    std::vector<std::unique_ptr<Request>> requests;
    if (g.prev_stage >= 0) {
      requests.push_back(g.pp->irecv(&from_prev, 1, stage - 1, 3));
      requests.push_back(g.pp->isend(&me, 1, stage - 1, 4));  // activations forward, gradients back
    }
    if (g.next_stage >= 0) {
      requests.push_back(g.pp->irecv(&from_next, 1, stage + 1, 4));
      requests.push_back(g.pp->isend(&me, 1, stage + 1, 3));
    }
    for (auto& request : requests) request->wait();
    wrong += from_prev != g.prev_stage;
    wrong += from_next != g.next_stage;
    EXPECT_EQ(sum_over_world(wrong), 0) << "wrong facts summed over ranks, " << describe(l);
  }
}

// Without MPI (a single process), every group is a communicator of one and there is no neighbour.
TEST(ProcessGroups, SingleProcessGroupsAreGroupsOfOne) {
  const RankGrid grid(GridSizes{1, 1, 1, 0, 1, 1});
  const ProcessGroups g = make_process_groups(std::make_unique<SelfCommunicator>("world"), grid);
  for (const auto& [kind, comm] : groups_of(g)) {
    ASSERT_NE(comm, nullptr) << group_kind_name(kind);
    EXPECT_EQ(comm->size(), 1) << group_kind_name(kind);
    EXPECT_EQ(comm->name(), group_kind_name(kind));
  }
  EXPECT_EQ(g.prev_stage, -1);
  EXPECT_EQ(g.next_stage, -1);
}

}  // namespace
}  // namespace moe
