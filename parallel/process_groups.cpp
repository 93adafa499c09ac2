// Building the process groups from the rank grid.
#include "parallel/process_groups.h"

#include "core/error.h"
#include "parallel/mpi_communicator.h"
#include "parallel/self_communicator.h"

namespace moe {

ProcessGroups make_process_groups(std::unique_ptr<Communicator> world, const RankGrid& grid) {
  MOE_CHECK(world->size() == grid.sizes().world,
            "process groups of a grid for " << grid.sizes().world << " ranks over a world of " << world->size());
  ProcessGroups g{grid, world->rank(), grid.coords(world->rank())};
  auto* mpi = dynamic_cast<MpiCommunicator*>(world.get());
  auto make = [&](GroupKind kind, const char* name) -> std::unique_ptr<Communicator> {
    if (!mpi) return std::make_unique<SelfCommunicator>(name);
    // Every rank calls split for every kind (it is collective), colour = the group's id, key = the rank.
    return mpi->split(grid.group_id(g.rank, kind), g.rank, name);
  };
  g.dp = make(GroupKind::Dp, "dp");
  g.ep = make(GroupKind::Ep, "ep");
  g.edp = make(GroupKind::Edp, "edp");
  g.tp = make(GroupKind::Tp, "tp");
  g.pp = make(GroupKind::Pp, "pp");
  g.etp = make(GroupKind::Etp, "etp");
  g.mp = make(GroupKind::Mp, "mp");
  g.prev_stage = grid.pipeline_neighbor(g.rank, -1);
  g.next_stage = grid.pipeline_neighbor(g.rank, +1);
  g.world = std::move(world);
  attach_data_plane(g, nullptr);
  return g;
}

void attach_data_plane(ProcessGroups& groups, const DataCommunicatorFactory& make) {
  DataPlane plane;
  auto pick = [&](Communicator& control) {
    std::unique_ptr<Communicator> made = make ? make(control) : nullptr;
    if (!made) return &control;
    plane.owned.push_back(std::move(made));
    return plane.owned.back().get();
  };
  plane.dp = pick(*groups.dp);
  plane.ep = pick(*groups.ep);
  plane.edp = pick(*groups.edp);
  plane.tp = pick(*groups.tp);
  plane.pp = pick(*groups.pp);
  plane.etp = pick(*groups.etp);
  groups.data = std::move(plane);
}

}  // namespace moe
