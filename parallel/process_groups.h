// Every communicator a rank needs, built once from the rank grid and handed explicitly to the modules
// that use them (no globals): the world; tp, pp, dp and model-parallel (tp x pp) groups of dense layers;
// etp, ep and edp groups of expert layers; and the pipeline neighbours. A communicator's rank is the
// rank's coordinate in that group (RankGrid::group lists the members in that order).
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
  std::unique_ptr<Communicator> world = nullptr;
  std::unique_ptr<Communicator> dp = nullptr;   // dense gradients, losses and metrics
  std::unique_ptr<Communicator> ep = nullptr;   // the MoE all-to-all
  std::unique_ptr<Communicator> edp = nullptr;  // expert gradients
  std::unique_ptr<Communicator> tp = nullptr;   // tensor-parallel activations (all-reduce, all-gather, reduce-scatter)
  std::unique_ptr<Communicator> pp = nullptr;   // pipeline activations and their gradients (point to point)
  std::unique_ptr<Communicator> etp = nullptr;  // expert tensor parallelism inside one expert
  std::unique_ptr<Communicator> mp = nullptr;   // tp x pp: one model replica (its shards' global norms)
  // World ranks of the previous and next pipeline stage (same tp and dp), -1 at the first and last stage.
  // In the pp communicator they are ranks coords.pp - 1 and coords.pp + 1.
  int64_t prev_stage = -1, next_stage = -1;
};

// world: an MpiCommunicator (any other communicator: a single process, every group of size one).
ProcessGroups make_process_groups(std::unique_ptr<Communicator> world, const RankGrid& grid);

// The MoE dispatcher's all-to-all over a communicator (the ep group): counts with a blocking all-to-all,
// rows with the nonblocking all-to-all-v, so that start returns while rows travel.
class CommunicatorExchange final : public ExpertExchange {
 public:
  explicit CommunicatorExchange(Communicator& comm) : comm_(comm) {}
  int size() const override { return comm_.size(); }
  int rank() const override { return comm_.rank(); }
  void exchange_counts(const int64_t* send, int64_t* recv, int64_t n) override { comm_.alltoall(send, recv, n); }
  std::unique_ptr<ExchangeHandle> start(const float* send, const int64_t* send_counts, float* recv,
                                        const int64_t* recv_counts) override {
    return std::make_unique<RequestHandle>(comm_.ialltoallv(send, send_counts, recv, recv_counts));
  }

 private:
  struct RequestHandle final : ExchangeHandle {
    explicit RequestHandle(std::unique_ptr<Request> r) : request(std::move(r)) {}
    void wait() override { request->wait(); }
    std::unique_ptr<Request> request;  // destroying it waits
  };
  Communicator& comm_;
};

// The MoE layer's collectives over the ranks sharing a routing group (the tp group).
class CommunicatorTokenGroup final : public TokenGroup {
 public:
  explicit CommunicatorTokenGroup(Communicator& comm) : comm_(comm) {}
  int size() const override { return comm_.size(); }
  int rank() const override { return comm_.rank(); }
  void allgather(const float* local, float* full, int64_t count) override { comm_.allgather(local, full, count); }
  void allgather(const double* local, double* full, int64_t count) override { comm_.allgather(local, full, count); }
  void allreduce_sum(float* data, int64_t count) override { comm_.allreduce_sum(data, count); }
  void allreduce_sum(double* data, int64_t count) override { comm_.allreduce_sum(data, count); }

 private:
  Communicator& comm_;
};

}  // namespace moe
