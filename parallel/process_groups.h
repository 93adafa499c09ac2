// Every communicator a rank needs, built once from the rank grid and handed explicitly to the modules
// that use them (no globals): the world; tp, pp, dp and model-parallel (tp x pp) groups of dense layers;
// etp, ep and edp groups of expert layers; and the pipeline neighbours. A communicator's rank is the
// rank's coordinate in that group (RankGrid::group lists the members in that order).
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <vector>

#include "core/expert_exchange.h"
#include "parallel/communicator.h"
#include "parallel/rank_grid.h"

namespace moe {

// The communicators that move backend memory, per group: the data plane. Gradient buckets (dp, edp), the
// expert all-to-all's rows (ep), the router logits of a routing group (tp) and the pipeline's activations
// (pp) go here; host memory (losses, counts, norms, metrics, checkpoint pieces) stays on the groups
// themselves, the control plane (MPI). Where the host addresses backend memory (the CPU backend) each is the
// group's own communicator; on the CUDA backend an NCCL communicator over the same ranks.
struct DataPlane {
  Communicator* dp = nullptr;
  Communicator* ep = nullptr;
  Communicator* edp = nullptr;
  Communicator* tp = nullptr;
  Communicator* pp = nullptr;
  Communicator* etp = nullptr;
  std::vector<std::unique_ptr<Communicator>> owned;  // the ones made for it
};

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
  DataPlane data;  // the groups' own communicators unless attach_data_plane replaced them
};

// world: an MpiCommunicator (any other communicator: a single process, every group of size one).
ProcessGroups make_process_groups(std::unique_ptr<Communicator> world, const RankGrid& grid);

// Makes the data-plane communicator of one group from its control-plane one (collective over it), or
// returns nullptr to use the group's own.
using DataCommunicatorFactory = std::function<std::unique_ptr<Communicator>(Communicator& control)>;
// Sets groups.data from `make`, called for dp, ep, edp, tp, pp, etp in that order on every rank.
void attach_data_plane(ProcessGroups& groups, const DataCommunicatorFactory& make);

// The MoE dispatchers' exchange over the ep group: counts (host memory) over its control-plane
// communicator with an all-to-all (blocking, or the nonblocking all-to-all-v of equal blocks), rows (backend
// memory) over its data-plane one with the nonblocking all-to-all-v (or the all-gather and the nonblocking
// reduce-scatter), so that the start forms return while
// counts or rows travel. It keeps the seconds its caller was held up in it (the counts' exchange, each start
// and each wait): the exposed all-to-all time, what overlap did not hide.
class CommunicatorExchange final : public ExpertExchange {
 public:
  explicit CommunicatorExchange(Communicator& comm) : CommunicatorExchange(comm, comm) {}
  CommunicatorExchange(Communicator& control, Communicator& data) : control_(control), data_(data) {}
  int size() const override { return control_.size(); }
  int rank() const override { return control_.rank(); }
  void exchange_counts(const int64_t* send, int64_t* recv, int64_t n) override {
    const Timer timer(blocked_s_);
    control_.alltoall(send, recv, n);
  }
  std::unique_ptr<ExchangeHandle> start_counts(const int64_t* send, int64_t* recv, int64_t n) override {
    const Timer timer(blocked_s_);
    const std::vector<int64_t> counts(size_t(control_.size()), n);  // read before ialltoallv returns
    return std::make_unique<RequestHandle>(control_.ialltoallv(send, counts.data(), recv, counts.data()), blocked_s_);
  }
  std::unique_ptr<ExchangeHandle> start(const float* send, const int64_t* send_counts, float* recv,
                                        const int64_t* recv_counts) override {
    const Timer timer(blocked_s_);
    return std::make_unique<RequestHandle>(data_.ialltoallv(send, send_counts, recv, recv_counts), blocked_s_);
  }
  // The communicators have no nonblocking all-gather: this one completes before it returns.
  std::unique_ptr<ExchangeHandle> start_allgather(const float* send, float* recv, int64_t count) override {
    const Timer timer(blocked_s_);
    data_.allgather(send, recv, count);
    return nullptr;
  }
  std::unique_ptr<ExchangeHandle> start_reduce_scatter(const float* send, float* recv, int64_t count) override {
    const Timer timer(blocked_s_);
    return std::make_unique<RequestHandle>(data_.ireduce_scatter_sum(send, recv, count), blocked_s_);
  }
  // Seconds held up in the exchange since the last reset.
  double blocked_seconds() const { return blocked_s_; }
  void reset_blocked_seconds() { blocked_s_ = 0; }

 private:
  // Adds the seconds of its scope to `total`.
  struct Timer {
    explicit Timer(double& t) : total(t) {}
    ~Timer() { total += std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count(); }
    Timer(const Timer&) = delete;
    Timer& operator=(const Timer&) = delete;
    double& total;
    std::chrono::steady_clock::time_point begin = std::chrono::steady_clock::now();
  };
  struct RequestHandle final : ExchangeHandle {
    RequestHandle(std::unique_ptr<Request> r, double& blocked) : request(std::move(r)), blocked_s(blocked) {}
    void wait() override {
      const Timer timer(blocked_s);
      request->wait();
    }
    std::unique_ptr<Request> request;  // destroying it waits
    double& blocked_s;
  };
  Communicator& control_;
  Communicator& data_;
  double blocked_s_ = 0;
};

// The MoE layer's collectives over the ranks sharing a routing group (the tp group): the all-gather of
// router rows moves backend memory (data plane), the sum of gate-weight gradients host memory (control plane).
class CommunicatorTokenGroup final : public TokenGroup {
 public:
  explicit CommunicatorTokenGroup(Communicator& comm) : CommunicatorTokenGroup(comm, comm) {}
  CommunicatorTokenGroup(Communicator& control, Communicator& data) : control_(control), data_(data) {}
  int size() const override { return control_.size(); }
  int rank() const override { return control_.rank(); }
  void allgather(const float* local, float* full, int64_t count) override { data_.allgather(local, full, count); }
  void allgather(const double* local, double* full, int64_t count) override { data_.allgather(local, full, count); }
  void allreduce_sum(float* data, int64_t count) override { data_.allreduce_sum(data, count); }
  void allreduce_sum(double* data, int64_t count) override { data_.allreduce_sum(data, count); }

 private:
  Communicator& control_;
  Communicator& data_;
};

}  // namespace moe
