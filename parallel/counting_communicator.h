// A Communicator decorator that counts, per kind of call, the calls and the bytes this rank passes, and
// forwards every call to the communicator it wraps unchanged (nonblocking forms return the wrapped one's
// request). For benchmarks and tests that compare the traffic of a layer with its analytic count
// (bench/bench_tp.cpp); not a profiler: it times nothing and sees nothing below the seam (MPI's own
// algorithm, how many hops a byte takes).
//
// Bytes are the payload of the call as the caller passes it, counted on each rank when the call is made
// (for a nonblocking form: when it starts):
//
//   allreduce_sum, iallreduce_sum            count x element size (the buffer this rank contributes)
//   reduce_scatter_sum, ireduce_scatter_sum  count x element size x group size (its whole input, one block
//                                            of `count` per rank; it receives one block)
//   allgather                                count x element size (its own block; it receives group size of them)
//   alltoall                                 count x element size x group size (a block for every rank)
//   alltoallv, ialltoallv                    the sum of send_counts x element size
//   send, isend                              count x element size
//   sendrecv_bytes                           send_bytes
//   broadcast                                count x element size on the root, 0 on the others
//   barrier                                  0
//   recv, irecv                              count x element size *received*; the only kinds whose bytes are
//                                            not sent, so bytes_sent() leaves them out
//
// A rank's own share is included where the call has one (its block of an all-to-all, its block of the
// reduce-scatter's input): the counts are of what the caller hands over, not of what leaves the process.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>

#include "parallel/communicator.h"

namespace moe {

enum class CommKind : int {
  Allreduce,
  Iallreduce,
  ReduceScatter,
  IreduceScatter,
  Allgather,
  Alltoall,
  Alltoallv,
  Ialltoallv,
  Send,
  Recv,
  Isend,
  Irecv,
  Sendrecv,
  Broadcast,
  Barrier,
};
inline constexpr int kCommKinds = int(CommKind::Barrier) + 1;

// The method's name in communicator.h, for tables and JSON keys.
inline const char* comm_kind_name(CommKind kind) {
  static constexpr const char* kNames[kCommKinds] = {"allreduce_sum",
                                                     "iallreduce_sum",
                                                     "reduce_scatter_sum",
                                                     "ireduce_scatter_sum",
                                                     "allgather",
                                                     "alltoall",
                                                     "alltoallv",
                                                     "ialltoallv",
                                                     "send",
                                                     "recv",
                                                     "isend",
                                                     "irecv",
                                                     "sendrecv_bytes",
                                                     "broadcast",
                                                     "barrier"};
  return kNames[int(kind)];
}

struct CommCount {
  int64_t calls = 0;
  int64_t bytes = 0;  // as defined above for the kind
};

class CountingCommunicator final : public Communicator {
 public:
  // `inner` must outlive this object.
  explicit CountingCommunicator(Communicator& inner) : inner_(inner) {}

  const CommCount& count(CommKind kind) const { return counts_[size_t(kind)]; }
  // Bytes of every kind but recv and irecv (whose bytes are received); calls of every kind.
  int64_t bytes_sent() const {
    int64_t total = 0;
    for (int k = 0; k < kCommKinds; ++k)
      if (CommKind(k) != CommKind::Recv && CommKind(k) != CommKind::Irecv) total += counts_[size_t(k)].bytes;
    return total;
  }
  int64_t calls() const {
    int64_t total = 0;
    for (const CommCount& c : counts_) total += c.calls;
    return total;
  }
  void reset() { counts_ = {}; }

  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  std::string name() const override { return inner_.name(); }

  MOE_COMMUNICATOR_CONVENIENCE_FORMS;
  void allreduce_sum(void* data, int64_t count, DType dtype) override {
    add(CommKind::Allreduce, count, dtype);
    inner_.allreduce_sum(data, count, dtype);
  }
  std::unique_ptr<Request> iallreduce_sum(void* data, int64_t count, DType dtype) override {
    add(CommKind::Iallreduce, count, dtype);
    return inner_.iallreduce_sum(data, count, dtype);
  }
  void reduce_scatter_sum(const void* send, void* recv, int64_t count, DType dtype) override {
    add(CommKind::ReduceScatter, count * inner_.size(), dtype);
    inner_.reduce_scatter_sum(send, recv, count, dtype);
  }
  std::unique_ptr<Request> ireduce_scatter_sum(const void* send, void* recv, int64_t count, DType dtype) override {
    add(CommKind::IreduceScatter, count * inner_.size(), dtype);
    return inner_.ireduce_scatter_sum(send, recv, count, dtype);
  }
  void allgather(const void* send, void* recv, int64_t count, DType dtype) override {
    add(CommKind::Allgather, count, dtype);
    inner_.allgather(send, recv, count, dtype);
  }
  void alltoall(const void* send, void* recv, int64_t count, DType dtype) override {
    add(CommKind::Alltoall, count * inner_.size(), dtype);
    inner_.alltoall(send, recv, count, dtype);
  }
  void alltoallv(const void* send, const int64_t* send_counts, void* recv, const int64_t* recv_counts,
                 DType dtype) override {
    add(CommKind::Alltoallv, total(send_counts), dtype);
    inner_.alltoallv(send, send_counts, recv, recv_counts, dtype);
  }
  std::unique_ptr<Request> ialltoallv(const void* send, const int64_t* send_counts, void* recv,
                                      const int64_t* recv_counts, DType dtype) override {
    add(CommKind::Ialltoallv, total(send_counts), dtype);
    return inner_.ialltoallv(send, send_counts, recv, recv_counts, dtype);
  }
  void send(const void* data, int64_t count, DType dtype, int peer, int tag) override {
    add(CommKind::Send, count, dtype);
    inner_.send(data, count, dtype, peer, tag);
  }
  void recv(void* data, int64_t count, DType dtype, int peer, int tag) override {
    add(CommKind::Recv, count, dtype);
    inner_.recv(data, count, dtype, peer, tag);
  }
  std::unique_ptr<Request> isend(const void* data, int64_t count, DType dtype, int peer, int tag) override {
    add(CommKind::Isend, count, dtype);
    return inner_.isend(data, count, dtype, peer, tag);
  }
  std::unique_ptr<Request> irecv(void* data, int64_t count, DType dtype, int peer, int tag) override {
    add(CommKind::Irecv, count, dtype);
    return inner_.irecv(data, count, dtype, peer, tag);
  }
  void sendrecv_bytes(const void* send, int64_t send_bytes, int dest, void* recv, int64_t recv_bytes, int source,
                      int tag) override {
    add(CommKind::Sendrecv, send_bytes, DType::U8);
    inner_.sendrecv_bytes(send, send_bytes, dest, recv, recv_bytes, source, tag);
  }
  void broadcast(void* data, int64_t count, DType dtype, int root) override {
    add(CommKind::Broadcast, inner_.rank() == root ? count : 0, dtype);
    inner_.broadcast(data, count, dtype, root);
  }
  void barrier() override {
    add(CommKind::Barrier, 0, DType::U8);
    inner_.barrier();
  }

 private:
  void add(CommKind kind, int64_t elements, DType dtype) {
    CommCount& c = counts_[size_t(kind)];
    c.calls += 1;
    c.bytes += elements * int64_t(dtype_size(dtype));
  }
  int64_t total(const int64_t* counts) const {
    int64_t n = 0;
    for (int r = 0; r < inner_.size(); ++r) n += counts[r];
    return n;
  }

  Communicator& inner_;
  std::array<CommCount, kCommKinds> counts_{};
};

}  // namespace moe
