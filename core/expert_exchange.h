// The communication seam of the MoE dispatchers: an all-to-all over the expert-parallel group, counts
// first, then rows; and the all-gather and reduce-scatter of equal blocks of rows of the all-gather dispatcher. core
// declares it; parallel/ implements it over a Communicator. A layer without one (one expert-parallel rank) exchanges
// with itself. The exchanges of counts and of rows have start and finish forms, so a caller can compute (e.g. the
// shared experts) while they travel.
#pragma once

#include <cstdint>
#include <memory>

namespace moe {

// An exchange of rows in flight. Destroying a handle that was not waited on waits.
class ExchangeHandle {
 public:
  virtual ~ExchangeHandle() = default;
  virtual void wait() = 0;
};

class ExpertExchange {
 public:
  virtual ~ExpertExchange() = default;
  virtual int size() const = 0;
  virtual int rank() const = 0;
  // recv[q * n + i] = what rank q sent to this rank as its send[rank * n + i]; host memory.
  virtual void exchange_counts(const int64_t* send, int64_t* recv, int64_t n) = 0;
  // exchange_counts in two halves: recv must stay untouched until finish. This default exchanges at once
  // and returns null (nothing in flight).
  virtual std::unique_ptr<ExchangeHandle> start_counts(const int64_t* send, int64_t* recv, int64_t n) {
    exchange_counts(send, recv, n);
    return nullptr;
  }
  // Starts the exchange of rows: send_counts[q] floats of send go to rank q, in rank order; recv_counts[q]
  // floats arrive from q; send and recv are backend memory, the counts host memory. The count arrays are read
  // before start returns; send and recv must stay untouched until finish (on a GPU finish orders the
  // backend's later work after the exchange without blocking the host).
  virtual std::unique_ptr<ExchangeHandle> start(const float* send, const int64_t* send_counts, float* recv,
                                                const int64_t* recv_counts) = 0;
  // The all-gather of rows: recv (size * count floats) = every rank's send (count floats), in rank order;
  // backend memory, untouched until the handle is waited for (null: complete on return).
  virtual std::unique_ptr<ExchangeHandle> start_allgather(const float* send, float* recv, int64_t count) = 0;
  // The reduce-scatter of rows: recv (count floats) = the sum over the ranks of their send's block `rank`
  // (send: size * count floats); backend memory, untouched until the handle is waited for.
  virtual std::unique_ptr<ExchangeHandle> start_reduce_scatter(const float* send, float* recv, int64_t count) = 0;
  // Waits for a started exchange: recv is complete and send may be reused.
  void finish(std::unique_ptr<ExchangeHandle> handle) {
    if (handle) handle->wait();
  }
  // Blocking: start, then finish.
  void exchange(const float* send, const int64_t* send_counts, float* recv, const int64_t* recv_counts) {
    finish(start(send, send_counts, recv, recv_counts));
  }
};

// The ranks that share one routing group (the tensor-parallel group): each holds a block of its tokens
// and all-gathers the per-token router rows, so every one of them routes the whole group and capacity, drops
// and losses are those of the unsplit group; or, when the experts' hidden width is split over them, each
// holds every token and sums its partial gate-weight gradients with the others'. core declares it; parallel/
// implements it over a Communicator.
class TokenGroup {
 public:
  virtual ~TokenGroup() = default;
  virtual int size() const = 0;
  virtual int rank() const = 0;
  // full (size * count) = every rank's local (count), in rank order; both in backend memory.
  virtual void allgather(const float* local, float* full, int64_t count) = 0;
  virtual void allgather(const double* local, double* full, int64_t count) = 0;
  // data (count) = the sum over the ranks of their data, in place, in backend memory.
  virtual void allreduce_sum(float* data, int64_t count) = 0;
  virtual void allreduce_sum(double* data, int64_t count) = 0;
};

}  // namespace moe
