// Building the process groups from the rank grid.
#include "parallel/process_groups.h"

#include "parallel/mpi_communicator.h"
#include "parallel/self_communicator.h"

namespace moe {

ProcessGroups make_process_groups(std::unique_ptr<Communicator> world, const RankGrid& grid) {
  ProcessGroups g{grid, world->rank(), grid.coords(world->rank()), nullptr, nullptr, nullptr, nullptr};
  auto* mpi = dynamic_cast<MpiCommunicator*>(world.get());
  auto make = [&](GroupKind kind, const char* name) -> std::unique_ptr<Communicator> {
    if (!mpi) return std::make_unique<SelfCommunicator>(name);
    // Every rank calls split for every kind (it is collective), colour = the group's id, key = the rank.
    return mpi->split(grid.group_id(g.rank, kind), g.rank, name);
  };
  g.dp = make(GroupKind::Dp, "dp");
  g.ep = make(GroupKind::Ep, "ep");
  g.edp = make(GroupKind::Edp, "edp");
  g.world = std::move(world);
  return g;
}

}  // namespace moe
