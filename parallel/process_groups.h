// Every communicator a rank needs, built once from the rank grid and handed explicitly to the modules
// that use them (no globals): the world, the data-parallel group of dense layers, and the expert-parallel
// and expert-data-parallel groups of expert layers. Tensor and pipeline groups join them when those land.
#pragma once

#include <memory>

#include "core/expert_exchange.h"
#include "parallel/communicator.h"
#include "parallel/rank_grid.h"

namespace moe {

struct ProcessGroups {
  RankGrid grid;
  int64_t rank = 0;
  RankCoords coords;
  std::unique_ptr<Communicator> world;
  std::unique_ptr<Communicator> dp;   // dense gradients, losses and metrics
  std::unique_ptr<Communicator> ep;   // the MoE all-to-all
  std::unique_ptr<Communicator> edp;  // expert gradients
};

// world: an MpiCommunicator (any other communicator: a single process, every group of size one).
ProcessGroups make_process_groups(std::unique_ptr<Communicator> world, const RankGrid& grid);

// The MoE dispatcher's all-to-all over a communicator (counts first, then rows).
class CommunicatorExchange final : public ExpertExchange {
 public:
  explicit CommunicatorExchange(Communicator& comm) : comm_(comm) {}
  int size() const override { return comm_.size(); }
  int rank() const override { return comm_.rank(); }
  void exchange_counts(const int64_t* send, int64_t* recv, int64_t n) override { comm_.alltoall(send, recv, n); }
  void exchange(const float* send, const int64_t* send_counts, float* recv, const int64_t* recv_counts) override {
    comm_.alltoallv(send, send_counts, recv, recv_counts);
  }

 private:
  Communicator& comm_;
};

}  // namespace moe
