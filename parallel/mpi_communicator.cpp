// The MPI communicator (mpi_communicator.h): every collective of the Communicator seam over an MPI_Comm,
// each call checked with CHECK_MPI, each count checked to fit MPI's int counts before any MPI call.
#include "parallel/mpi_communicator.h"

#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <iostream>
#include <utility>
#include <vector>

namespace moe {
namespace detail {

std::string mpi_error_string(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS) return "MPI error code " + std::to_string(code);
  return std::string(text, length) + " (MPI error code " + std::to_string(code) + ")";
}

std::string mpi_location() {
  static const std::string host = [] {
    char name[256] = {};
    if (gethostname(name, sizeof(name) - 1) != 0) return std::string("unknown host");
    return std::string(name);
  }();
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (!initialized || finalized) return "host " + host + " (MPI not running)";
  int world_rank = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  return "host " + host + ", world rank " + std::to_string(world_rank);
}

}  // namespace detail

namespace {

bool mpi_running() {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  return initialized && !finalized;
}

void finalize_at_exit() { MpiCommunicator::finalize(); }

// A nonblocking operation in flight. Destroying it waits, so the buffers it reads and writes are never
// released while MPI may still touch them.
class MpiRequest final : public Request {
 public:
  MpiRequest(MPI_Request request, std::string what) : request_(request), what_(std::move(what)) {}
  ~MpiRequest() override {
    if (request_ == MPI_REQUEST_NULL || !mpi_running()) return;
    const int code = MPI_Wait(&request_, MPI_STATUS_IGNORE);
    // A destructor cannot throw: say it, since the caller dropped the request without waiting.
    if (code != MPI_SUCCESS)
      std::cerr << "moe: MPI " << what_ << " failed while its request was destroyed, on " << detail::mpi_location()
                << ": " << detail::mpi_error_string(code) << "\n";
  }
  bool test() override {
    if (request_ == MPI_REQUEST_NULL) return true;  // MPI_Test and MPI_Wait set it to null on completion
    int done = 0;
    CHECK_MPI(MPI_Test(&request_, &done, MPI_STATUS_IGNORE), what_ << " (test)");
    return done != 0;
  }
  void wait() override {
    if (request_ == MPI_REQUEST_NULL) return;
    CHECK_MPI(MPI_Wait(&request_, MPI_STATUS_IGNORE), what_ << " (wait)");
  }

 private:
  MPI_Request request_;
  std::string what_;
};

}  // namespace

void MpiCommunicator::initialize(int* argc, char*** argv) {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (finalized) MOE_FAIL("MPI initialize called after MPI was finalised: MPI cannot be started twice in one process");
  if (initialized) return;
  int provided = 0;
  CHECK_MPI(MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided), "initialize (MPI_Init_thread)");
  // Errors during start-up abort (MPI's default); from here on they come back as codes and throw.
  CHECK_MPI(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN), "initialize (set error handler)");
  MOE_CHECK(provided >= MPI_THREAD_FUNNELED, "MPI provides thread level " << provided << ", below MPI_THREAD_FUNNELED ("
                                                                          << MPI_THREAD_FUNNELED
                                                                          << "): use an MPI built with thread support");
  std::atexit(finalize_at_exit);
}

void MpiCommunicator::finalize() {
  if (!mpi_running()) return;
  MPI_Finalize();
}

void MpiCommunicator::abort(int exit_code) {
  if (mpi_running()) MPI_Abort(MPI_COMM_WORLD, exit_code);
  std::_Exit(exit_code);  // MPI not running, or MPI_Abort returned: end this process at least
}

bool MpiCommunicator::launched_by_mpirun() {
  // OpenMPI sets OMPI_COMM_WORLD_SIZE; PMIx launchers (OpenMPI, srun) PMIX_RANK; MPICH's Hydra PMI_RANK.
  return std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr || std::getenv("PMIX_RANK") != nullptr ||
         std::getenv("PMI_RANK") != nullptr;
}

std::unique_ptr<MpiCommunicator> MpiCommunicator::world() {
  MOE_CHECK(mpi_running(), "MpiCommunicator::world() needs MPI running: call MpiCommunicator::initialize first");
  return std::unique_ptr<MpiCommunicator>(new MpiCommunicator(MPI_COMM_WORLD, "world", /*owning=*/false));
}

MpiCommunicator::MpiCommunicator(MPI_Comm comm, std::string name, bool owning)
    : comm_(comm), name_(std::move(name)), owning_(owning) {
  CHECK_MPI(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN), "set error handler on communicator '" << name_ << "'");
  CHECK_MPI(MPI_Comm_rank(comm_, &rank_), "rank of communicator '" << name_ << "'");
  CHECK_MPI(MPI_Comm_size(comm_, &size_), "size of communicator '" << name_ << "'");
}

MpiCommunicator::~MpiCommunicator() {
  // After MPI_Finalize the handle is already gone with MPI; freeing it then is an error.
  if (owning_ && comm_ != MPI_COMM_NULL && comm_ != MPI_COMM_WORLD && mpi_running()) MPI_Comm_free(&comm_);
}

std::unique_ptr<MpiCommunicator> MpiCommunicator::split(int64_t color, int64_t key, const std::string& name) const {
  MOE_CHECK(color < INT_MAX, "split of communicator '" << name_ << "' into '" << name << "': color " << color
                                                       << " does not fit MPI's int colors");
  MOE_CHECK(key >= INT_MIN && key <= INT_MAX, "split of communicator '" << name_ << "' into '" << name << "': key "
                                                                        << key << " does not fit MPI's int keys");
  const int mpi_color = color < 0 ? MPI_UNDEFINED : static_cast<int>(color);
  MPI_Comm sub = MPI_COMM_NULL;
  CHECK_MPI(MPI_Comm_split(comm_, mpi_color, static_cast<int>(key), &sub),
            describe("split") << " into '" << name << "' (color " << color << ", key " << key << ")");
  if (sub == MPI_COMM_NULL) return nullptr;
  return std::unique_ptr<MpiCommunicator>(new MpiCommunicator(sub, name, /*owning=*/true));
}

std::string MpiCommunicator::describe(const char* op) const {
  return std::string(op) + " on communicator '" + name_ + "' (rank " + std::to_string(rank_) + " of " +
         std::to_string(size_) + ")";
}

int MpiCommunicator::int_count(int64_t count, const char* op) const {
  MOE_CHECK(count >= 0 && count <= INT_MAX, describe(op)
                                                << ": count " << count << " is negative or exceeds MPI's int counts ("
                                                << INT_MAX << " elements); split the buffer into smaller pieces");
  return static_cast<int>(count);
}

// ---- all-reduce

void MpiCommunicator::allreduce_sum(void* data, int64_t count, MPI_Datatype type, const char* op) {
  const int n = int_count(count, op);
  CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, data, n, type, MPI_SUM, comm_), describe(op) << " of " << n << " elements");
}
void MpiCommunicator::allreduce_sum(float* data, int64_t count) {
  allreduce_sum(data, count, MPI_FLOAT, "allreduce_sum(float)");
}
void MpiCommunicator::allreduce_sum(double* data, int64_t count) {
  allreduce_sum(data, count, MPI_DOUBLE, "allreduce_sum(double)");
}
void MpiCommunicator::allreduce_sum(int64_t* data, int64_t count) {
  allreduce_sum(data, count, MPI_INT64_T, "allreduce_sum(int64)");
}

std::unique_ptr<Request> MpiCommunicator::iallreduce_sum(float* data, int64_t count) {
  const char* op = "iallreduce_sum(float)";
  const int n = int_count(count, op);
  MPI_Request request = MPI_REQUEST_NULL;
  std::string what = describe(op) + " of " + std::to_string(n) + " elements";
  CHECK_MPI(MPI_Iallreduce(MPI_IN_PLACE, data, n, MPI_FLOAT, MPI_SUM, comm_, &request), what);
  return std::make_unique<MpiRequest>(request, std::move(what));
}

// ---- reduce-scatter

void MpiCommunicator::reduce_scatter_sum(const float* send, float* recv, int64_t count) {
  const char* op = "reduce_scatter_sum";
  const int n = int_count(count, op);
  MOE_CHECK(n == 0 || send != recv, describe(op) << ": send and recv must be different buffers");
  CHECK_MPI(MPI_Reduce_scatter_block(send, recv, n, MPI_FLOAT, MPI_SUM, comm_),
            describe(op) << " of " << n << " elements per rank");
}

std::unique_ptr<Request> MpiCommunicator::ireduce_scatter_sum(const float* send, float* recv, int64_t count) {
  const char* op = "ireduce_scatter_sum";
  const int n = int_count(count, op);
  MOE_CHECK(n == 0 || send != recv, describe(op) << ": send and recv must be different buffers");
  MPI_Request request = MPI_REQUEST_NULL;
  std::string what = describe(op) + " of " + std::to_string(n) + " elements per rank";
  CHECK_MPI(MPI_Ireduce_scatter_block(send, recv, n, MPI_FLOAT, MPI_SUM, comm_, &request), what);
  return std::make_unique<MpiRequest>(request, std::move(what));
}

// ---- all-gather, all-to-all

void MpiCommunicator::allgather(const void* send, void* recv, int64_t count, MPI_Datatype type, const char* op) {
  const int n = int_count(count, op);
  MOE_CHECK(n == 0 || send != recv, describe(op) << ": send and recv must be different buffers");
  CHECK_MPI(MPI_Allgather(send, n, type, recv, n, type, comm_), describe(op) << " of " << n << " elements per rank");
}
void MpiCommunicator::allgather(const float* send, float* recv, int64_t count) {
  allgather(send, recv, count, MPI_FLOAT, "allgather(float)");
}
void MpiCommunicator::allgather(const int64_t* send, int64_t* recv, int64_t count) {
  allgather(send, recv, count, MPI_INT64_T, "allgather(int64)");
}

void MpiCommunicator::alltoall(const int64_t* send, int64_t* recv, int64_t count) {
  const char* op = "alltoall(int64)";
  const int n = int_count(count, op);
  MOE_CHECK(n == 0 || send != recv, describe(op) << ": send and recv must be different buffers");
  CHECK_MPI(MPI_Alltoall(send, n, MPI_INT64_T, recv, n, MPI_INT64_T, comm_),
            describe(op) << " of " << n << " elements per rank");
}

void MpiCommunicator::alltoallv(const float* send, const int64_t* send_counts, float* recv,
                                const int64_t* recv_counts) {
  const char* op = "alltoallv";
  // MPI's v-forms take int counts and int displacements: every count and every prefix sum must fit.
  std::vector<int> counts_and_displacements(4 * static_cast<size_t>(size_));
  int* send_counts_int = counts_and_displacements.data();
  int* send_displacements = send_counts_int + size_;
  int* recv_counts_int = send_displacements + size_;
  int* recv_displacements = recv_counts_int + size_;
  int64_t send_total = 0, recv_total = 0;
  for (int peer = 0; peer < size_; ++peer) {
    MOE_CHECK(send_counts[peer] >= 0 && recv_counts[peer] >= 0, describe(op) << ": negative count for peer " << peer
                                                                             << " (send " << send_counts[peer]
                                                                             << ", recv " << recv_counts[peer] << ")");
    MOE_CHECK(send_total + send_counts[peer] <= INT_MAX,
              describe(op) << ": send count " << send_counts[peer] << " to peer " << peer << " after " << send_total
                           << " elements exceeds MPI's int counts and displacements (" << INT_MAX
                           << " elements); split the exchange into smaller pieces");
    MOE_CHECK(recv_total + recv_counts[peer] <= INT_MAX,
              describe(op) << ": recv count " << recv_counts[peer] << " from peer " << peer << " after " << recv_total
                           << " elements exceeds MPI's int counts and displacements (" << INT_MAX
                           << " elements); split the exchange into smaller pieces");
    send_counts_int[peer] = static_cast<int>(send_counts[peer]);
    send_displacements[peer] = static_cast<int>(send_total);
    recv_counts_int[peer] = static_cast<int>(recv_counts[peer]);
    recv_displacements[peer] = static_cast<int>(recv_total);
    send_total += send_counts[peer];
    recv_total += recv_counts[peer];
  }
  MOE_CHECK(send_total == 0 || recv_total == 0 || send != recv, describe(op)
                                                                    << ": send and recv must be different buffers");
  CHECK_MPI(MPI_Alltoallv(send, send_counts_int, send_displacements, MPI_FLOAT, recv, recv_counts_int,
                          recv_displacements, MPI_FLOAT, comm_),
            describe(op) << " (sending " << send_total << ", receiving " << recv_total << " elements)");
}

// ---- point to point, broadcast, barrier

void MpiCommunicator::send(const float* data, int64_t count, int peer, int tag) {
  const int n = int_count(count, "send");
  CHECK_MPI(MPI_Send(data, n, MPI_FLOAT, peer, tag, comm_),
            describe("send") << " of " << n << " elements to peer " << peer << " with tag " << tag);
}

void MpiCommunicator::recv(float* data, int64_t count, int peer, int tag) {
  const int n = int_count(count, "recv");
  MPI_Status status;
  CHECK_MPI(MPI_Recv(data, n, MPI_FLOAT, peer, tag, comm_, &status),
            describe("recv") << " of " << n << " elements from peer " << peer << " with tag " << tag);
  int received = 0;
  CHECK_MPI(MPI_Get_count(&status, MPI_FLOAT, &received), describe("recv") << " (count of the message received)");
  // A shorter message is no MPI error, but here it means the two sides disagree on the size.
  MOE_CHECK(received == n, describe("recv") << " from peer " << peer << " with tag " << tag << ": expected " << n
                                            << " elements, the peer sent " << received);
}

void MpiCommunicator::sendrecv_bytes(const void* send, int64_t send_bytes, int dest, void* recv, int64_t recv_bytes,
                                     int source, int tag) {
  // In pieces of at most 1 GiB: MPI counts are ints.
  constexpr int64_t kPiece = int64_t(1) << 30;
  int64_t sent = 0, received = 0;
  const char* out = static_cast<const char*>(send);
  char* in = static_cast<char*>(recv);
  while (sent < send_bytes || received < recv_bytes) {
    const int n_out = int(std::min(kPiece, send_bytes - sent)), n_in = int(std::min(kPiece, recv_bytes - received));
    CHECK_MPI(MPI_Sendrecv(out + sent, n_out, MPI_BYTE, dest, tag, in + received, n_in, MPI_BYTE, source, tag, comm_,
                           MPI_STATUS_IGNORE),
              describe("sendrecv") << " of " << n_out << " bytes to " << dest << " and " << n_in << " from " << source);
    sent += n_out, received += n_in;
  }
}

void MpiCommunicator::broadcast(void* data, int64_t count, MPI_Datatype type, int root, const char* op) {
  const int n = int_count(count, op);
  CHECK_MPI(MPI_Bcast(data, n, type, root, comm_), describe(op) << " of " << n << " elements from root " << root);
}
void MpiCommunicator::broadcast(float* data, int64_t count, int root) {
  broadcast(data, count, MPI_FLOAT, root, "broadcast(float)");
}
void MpiCommunicator::broadcast(int64_t* data, int64_t count, int root) {
  broadcast(data, count, MPI_INT64_T, root, "broadcast(int64)");
}

void MpiCommunicator::barrier() { CHECK_MPI(MPI_Barrier(comm_), describe("barrier")); }

}  // namespace moe
