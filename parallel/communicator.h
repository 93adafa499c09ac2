// The communicator seam (DESIGN.md "Communicator"): collectives over a group of ranks. MPI implements
// it for host memory (mpi_communicator.cpp); NCCL will implement it for device memory. Counts are in
// elements; displacements of the v-forms are the prefix sums of the counts. Nonblocking forms return a
// request that must be waited on before the buffers are touched. Errors throw moe::Error naming the
// operation, the rank and the host.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace moe {

class Request {
 public:
  virtual ~Request() = default;
  virtual bool test() = 0;  // true when complete (progresses the operation)
  virtual void wait() = 0;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string name() const = 0;  // e.g. "dp", for messages

  virtual void allreduce_sum(float* data, int64_t count) = 0;
  virtual void allreduce_sum(double* data, int64_t count) = 0;
  virtual void allreduce_sum(int64_t* data, int64_t count) = 0;
  virtual std::unique_ptr<Request> iallreduce_sum(float* data, int64_t count) = 0;
  // recv (count) = sum over ranks of send[rank * count, (rank + 1) * count).
  virtual void reduce_scatter_sum(const float* send, float* recv, int64_t count) = 0;
  virtual std::unique_ptr<Request> ireduce_scatter_sum(const float* send, float* recv, int64_t count) = 0;
  // recv (size * count) = the concatenation of every rank's send (count).
  virtual void allgather(const float* send, float* recv, int64_t count) = 0;
  virtual void allgather(const int64_t* send, int64_t* recv, int64_t count) = 0;
  // recv[r * count ...] = what rank r sent to this rank (send[this * count ...] on rank r).
  virtual void alltoall(const int64_t* send, int64_t* recv, int64_t count) = 0;
  // send_counts[r] elements of send go to rank r (in rank order); recv_counts[r] arrive from rank r.
  virtual void alltoallv(const float* send, const int64_t* send_counts, float* recv, const int64_t* recv_counts) = 0;
  virtual void send(const float* data, int64_t count, int peer, int tag) = 0;
  virtual void recv(float* data, int64_t count, int peer, int tag) = 0;
  // Sends send_bytes bytes to `dest` while receiving recv_bytes bytes from `source` (both sides must agree
  // on the sizes: exchange them first). Deadlock-free for rings.
  virtual void sendrecv_bytes(const void* send, int64_t send_bytes, int dest, void* recv, int64_t recv_bytes,
                              int source, int tag) = 0;
  virtual void broadcast(float* data, int64_t count, int root) = 0;
  virtual void broadcast(int64_t* data, int64_t count, int root) = 0;
  virtual void barrier() = 0;
};

}  // namespace moe
