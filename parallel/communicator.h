// The communicator seam (docs/design.md "The seams, and which part calls which"): collectives and point-to-point
// transfers over a group of ranks, on typed buffers (pointer, count, DType). MPI implements it for host memory
// (mpi_communicator.h, the control plane), NCCL for a CUDA backend's memory (nccl_communicator.h, the data plane;
// process_groups.h DataPlane), and a group of one copies (self_communicator.h). Decorators wrap one and pass every
// call on: the flight recorder (flight_recorder.h), the plane check (plane_check.h), the traffic counter
// (counting_communicator.h). Counts are in elements; displacements of the v-forms are the prefix sums of the
// counts; count arrays are read before the call returns. Nonblocking forms return a request that must complete
// (wait, or test until true) before their buffers are touched; on NCCL completing orders the backend's compute
// stream after the transfer rather than blocking the host (nccl_communicator.h). A data-plane communicator
// (process_groups.h DataPlane) takes backend memory after the backend's work queued before the call, so its
// callers do not wait for the backend first: NCCL's stream follows the compute stream; over the CPU backend that
// work has run when its call returns; over the memory-checking backend the plane check runs the backend's queue
// before MPI reads the storage (plane_check.h), as NCCL's stream order would, and no host wait of a GPU run. A receive
// expects exactly `count` elements: MPI throws when the message differs, NCCL cannot see the count sent and ignores
// tags (transfers between a pair match in the order issued). Errors throw moe::Error naming the operation and the
// communicator: MPI's as program errors (exit 1) with the host and world rank, NCCL's as RunFailed (a peer or the
// device ended the run; core/backend/cuda/cuda_check.h).
//
// Reductions sum. bf16 sums accumulate each pair in fp32 and round to bf16 (round to nearest even), so
// they depend on the reduction order like any low-precision sum; prefer fp32 for gradient sync.
// The typed convenience forms below name the DType from the C++ type (core/dtype.h dtype_of: float, double, bf16,
// int32_t, int64_t, uint8_t).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "core/dtype.h"

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

  // ---- the interface: typed buffers
  virtual void allreduce_sum(void* data, int64_t count, DType dtype) = 0;
  virtual std::unique_ptr<Request> iallreduce_sum(void* data, int64_t count, DType dtype) = 0;
  // recv (count) = sum over ranks of send[rank * count, (rank + 1) * count).
  virtual void reduce_scatter_sum(const void* send, void* recv, int64_t count, DType dtype) = 0;
  virtual std::unique_ptr<Request> ireduce_scatter_sum(const void* send, void* recv, int64_t count, DType dtype) = 0;
  // recv (size * count) = the concatenation of every rank's send (count).
  virtual void allgather(const void* send, void* recv, int64_t count, DType dtype) = 0;
  // recv[r * count ...] = what rank r sent to this rank (send[this * count ...] on rank r).
  virtual void alltoall(const void* send, void* recv, int64_t count, DType dtype) = 0;
  // send_counts[r] elements of send go to rank r (in rank order); recv_counts[r] arrive from rank r.
  virtual void alltoallv(const void* send, const int64_t* send_counts, void* recv, const int64_t* recv_counts,
                         DType dtype) = 0;
  virtual std::unique_ptr<Request> ialltoallv(const void* send, const int64_t* send_counts, void* recv,
                                              const int64_t* recv_counts, DType dtype) = 0;
  // Point to point: peer is a rank of this communicator. A receive expects exactly `count` elements and
  // throws when the message differs (at the receive, or at its request's completion).
  virtual void send(const void* data, int64_t count, DType dtype, int peer, int tag) = 0;
  virtual void recv(void* data, int64_t count, DType dtype, int peer, int tag) = 0;
  virtual std::unique_ptr<Request> isend(const void* data, int64_t count, DType dtype, int peer, int tag) = 0;
  virtual std::unique_ptr<Request> irecv(void* data, int64_t count, DType dtype, int peer, int tag) = 0;
  // Sends send_bytes bytes to `dest` while receiving recv_bytes bytes from `source` (both sides must agree
  // on the sizes: exchange them first). Deadlock-free for rings.
  virtual void sendrecv_bytes(const void* send, int64_t send_bytes, int dest, void* recv, int64_t recv_bytes,
                              int source, int tag) = 0;
  virtual void broadcast(void* data, int64_t count, DType dtype, int root) = 0;
  virtual void barrier() = 0;

  // ---- typed convenience: the DType follows from T
  template <typename T>
  void allreduce_sum(T* data, int64_t count) {
    allreduce_sum(data, count, dtype_of<T>());
  }
  template <typename T>
  std::unique_ptr<Request> iallreduce_sum(T* data, int64_t count) {
    return iallreduce_sum(data, count, dtype_of<T>());
  }
  template <typename T>
  void reduce_scatter_sum(const T* send, T* recv, int64_t count) {
    reduce_scatter_sum(send, recv, count, dtype_of<T>());
  }
  template <typename T>
  std::unique_ptr<Request> ireduce_scatter_sum(const T* send, T* recv, int64_t count) {
    return ireduce_scatter_sum(send, recv, count, dtype_of<T>());
  }
  template <typename T>
  void allgather(const T* send, T* recv, int64_t count) {
    allgather(send, recv, count, dtype_of<T>());
  }
  template <typename T>
  void alltoall(const T* send, T* recv, int64_t count) {
    alltoall(send, recv, count, dtype_of<T>());
  }
  template <typename T>
  void alltoallv(const T* send, const int64_t* send_counts, T* recv, const int64_t* recv_counts) {
    alltoallv(send, send_counts, recv, recv_counts, dtype_of<T>());
  }
  template <typename T>
  std::unique_ptr<Request> ialltoallv(const T* send, const int64_t* send_counts, T* recv, const int64_t* recv_counts) {
    return ialltoallv(send, send_counts, recv, recv_counts, dtype_of<T>());
  }
  template <typename T>
  void send(const T* data, int64_t count, int peer, int tag) {
    send(data, count, dtype_of<T>(), peer, tag);
  }
  template <typename T>
  void recv(T* data, int64_t count, int peer, int tag) {
    recv(data, count, dtype_of<T>(), peer, tag);
  }
  template <typename T>
  std::unique_ptr<Request> isend(const T* data, int64_t count, int peer, int tag) {
    return isend(data, count, dtype_of<T>(), peer, tag);
  }
  template <typename T>
  std::unique_ptr<Request> irecv(T* data, int64_t count, int peer, int tag) {
    return irecv(data, count, dtype_of<T>(), peer, tag);
  }
  template <typename T>
  void broadcast(T* data, int64_t count, int root) {
    broadcast(data, count, dtype_of<T>(), root);
  }
};

// Implementations override the typed-buffer forms; this brings the convenience forms back into their
// scope (a derived class's override would hide the base's overloads of the same name).
#define MOE_COMMUNICATOR_CONVENIENCE_FORMS \
  using Communicator::allreduce_sum;       \
  using Communicator::iallreduce_sum;      \
  using Communicator::reduce_scatter_sum;  \
  using Communicator::ireduce_scatter_sum; \
  using Communicator::allgather;           \
  using Communicator::alltoall;            \
  using Communicator::alltoallv;           \
  using Communicator::ialltoallv;          \
  using Communicator::send;                \
  using Communicator::recv;                \
  using Communicator::isend;               \
  using Communicator::irecv;               \
  using Communicator::broadcast

}  // namespace moe
