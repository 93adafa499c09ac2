// The MPI communicator: the Communicator seam (communicator.h) over an MPI_Comm, for host memory.
// Not here: device memory (NCCL), the rank grid's arithmetic (rank_grid.h), and the decision to exit or
// abort the job on an error (the program's entry point decides; this throws moe::Error).
//
// Threads: MPI is initialised with MPI_THREAD_FUNNELED, so only the thread that called initialize()
// may call into a communicator or a request. Every MPI call is checked: communicators use
// MPI_ERRORS_RETURN, and a failure throws moe::Error naming the operation, the communicator, the rank,
// the host and MPI's own error string.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "parallel/communicator.h"

namespace moe {
namespace detail {
std::string mpi_error_string(int code);
// "host H, world rank R" of this process, for messages (valid before and after MPI is running).
std::string mpi_location();
}  // namespace detail
}  // namespace moe

// Checks an MPI call that returned an error code. `what` is a stream expression naming the operation and
// the communicator, e.g. "alltoallv on communicator 'ep' (rank 1 of 4)".
#define CHECK_MPI(call, what)                                                               \
  do {                                                                                      \
    const int moe_mpi_code_ = (call);                                                       \
    if (moe_mpi_code_ != MPI_SUCCESS)                                                       \
      MOE_FAIL("MPI " << what << " failed on " << ::moe::detail::mpi_location() << ": "     \
                      << ::moe::detail::mpi_error_string(moe_mpi_code_) << " [" #call "]"); \
  } while (0)

namespace moe {

class MpiCommunicator final : public Communicator {
 public:
  // MPI_Init_thread(FUNNELED) once; later calls do nothing. Registers finalize() to run at exit.
  // Throws when MPI was already finalised (it cannot be started twice in one process).
  static void initialize(int* argc, char*** argv);
  // Ends MPI when it is running; idempotent. Communicators freed after this only forget their handle.
  static void finalize();
  // Ends every rank of the job with exit_code (MPI_Abort on MPI_COMM_WORLD): for the entry point when one
  // rank fails while others may be blocked in a collective, where a plain exit would leave them hanging.
  [[noreturn]] static void abort(int exit_code);
  // True when this process was started by mpirun (OpenMPI or PMIx environment), so the program should
  // initialise MPI; false for a plain single-process run.
  static bool launched_by_mpirun();
  // Every process; wraps MPI_COMM_WORLD without owning it. Requires initialize().
  static std::unique_ptr<MpiCommunicator> world();

  ~MpiCommunicator() override;
  MpiCommunicator(const MpiCommunicator&) = delete;
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;

  // Collective over this communicator (MPI_Comm_split): ranks with the same color form one new
  // communicator, ordered by key (ties by rank here). A negative color means "in no group": that rank
  // gets nullptr. Every rank of this communicator must call it.
  std::unique_ptr<MpiCommunicator> split(int64_t color, int64_t key, const std::string& name) const;
  MPI_Comm handle() const { return comm_; }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return name_; }

  MOE_COMMUNICATOR_CONVENIENCE_FORMS;
  void allreduce_sum(void* data, int64_t count, DType dtype) override;
  std::unique_ptr<Request> iallreduce_sum(void* data, int64_t count, DType dtype) override;
  void reduce_scatter_sum(const void* send, void* recv, int64_t count, DType dtype) override;
  std::unique_ptr<Request> ireduce_scatter_sum(const void* send, void* recv, int64_t count, DType dtype) override;
  void allgather(const void* send, void* recv, int64_t count, DType dtype) override;
  void alltoall(const void* send, void* recv, int64_t count, DType dtype) override;
  void alltoallv(const void* send, const int64_t* send_counts, void* recv, const int64_t* recv_counts,
                 DType dtype) override;
  std::unique_ptr<Request> ialltoallv(const void* send, const int64_t* send_counts, void* recv,
                                      const int64_t* recv_counts, DType dtype) override;
  void send(const void* data, int64_t count, DType dtype, int peer, int tag) override;
  void recv(void* data, int64_t count, DType dtype, int peer, int tag) override;
  std::unique_ptr<Request> isend(const void* data, int64_t count, DType dtype, int peer, int tag) override;
  std::unique_ptr<Request> irecv(void* data, int64_t count, DType dtype, int peer, int tag) override;
  void sendrecv_bytes(const void* send, int64_t send_bytes, int dest, void* recv, int64_t recv_bytes, int source,
                      int tag) override;
  void broadcast(void* data, int64_t count, DType dtype, int root) override;
  void barrier() override;

 private:
  MpiCommunicator(MPI_Comm comm, std::string name, bool owning);
  // "op(dtype) on communicator 'name' (rank r of n)", for messages.
  std::string describe(const char* op, DType dtype) const;
  std::string describe(const char* op) const;
  // count as an MPI int count; throws naming op when it is negative or does not fit.
  int int_count(int64_t count, const char* op, DType dtype) const;
  // The counts and displacements of an all-to-all-v as MPI ints: send counts, send displacements, receive
  // counts, receive displacements, `size` each. Throws before any communication when one does not fit.
  std::vector<int> alltoallv_layout(const int64_t* send_counts, const int64_t* recv_counts, const char* op,
                                    DType dtype) const;

  MPI_Comm comm_ = MPI_COMM_NULL;
  std::string name_;
  bool owning_ = false;
  int rank_ = 0;
  int size_ = 0;
};

}  // namespace moe
