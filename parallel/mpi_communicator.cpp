// The MPI communicator (mpi_communicator.h): every collective of the Communicator seam over an MPI_Comm,
// each call checked with CHECK_MPI, each count checked to fit MPI's int counts before any MPI call.
#include "parallel/mpi_communicator.h"

#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <utility>
#include <vector>

#include "core/dtype.h"

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
// released while MPI may still touch them. It owns what MPI reads until completion (the int counts and
// displacements of a v-form), and for a receive the count it expects, checked when it completes.
class MpiRequest final : public Request {
 public:
  MpiRequest(MPI_Request request, std::string what, std::vector<int> keep_alive = {})
      : request_(request), what_(std::move(what)), keep_alive_(std::move(keep_alive)) {}
  ~MpiRequest() override {
    if (request_ == MPI_REQUEST_NULL || !mpi_running()) return;
    const int code = MPI_Wait(&request_, MPI_STATUS_IGNORE);
    // A destructor cannot throw: say it, since the caller dropped the request without waiting.
    if (code != MPI_SUCCESS)
      std::cerr << "moe: MPI " << what_ << " failed while its request was destroyed, on " << detail::mpi_location()
                << ": " << detail::mpi_error_string(code) << "\n";
  }
  // A receive: on completion, the message must hold exactly `count` elements of `type`.
  void expect_received(MPI_Datatype type, int count) {
    receive_type_ = type;
    receive_count_ = count;
  }
  bool test() override {
    if (request_ == MPI_REQUEST_NULL) return true;  // MPI_Test and MPI_Wait set it to null on completion
    int done = 0;
    MPI_Status status;
    CHECK_MPI(MPI_Test(&request_, &done, &status), what_ << " (test)");
    if (done) check_received(status);
    return done != 0;
  }
  void wait() override {
    if (request_ == MPI_REQUEST_NULL) return;
    MPI_Status status;
    CHECK_MPI(MPI_Wait(&request_, &status), what_ << " (wait)");
    check_received(status);
  }

 private:
  void check_received(const MPI_Status& status) {
    if (receive_count_ < 0) return;
    int received = 0;
    CHECK_MPI(MPI_Get_count(&status, receive_type_, &received), what_ << " (count of the message received)");
    const int expected = receive_count_;
    receive_count_ = -1;  // checked once
    // A shorter message is no MPI error, but here it means the two sides disagree on the size.
    MOE_CHECK(received == expected, what_ << ": expected " << expected << " elements, the peer sent " << received);
  }

  MPI_Request request_;
  std::string what_;
  std::vector<int> keep_alive_;
  MPI_Datatype receive_type_ = MPI_DATATYPE_NULL;
  int receive_count_ = -1;  // -1: not a receive
};

// bf16 as its 16-bit storage: moved as MPI_UINT16_T, summed by the user-defined operation below with
// core/dtype.h's conversions (each pair added in fp32, rounded to nearest even).
void bf16_sum(void* in, void* inout, int* length, MPI_Datatype*) {
  const auto* a = static_cast<const bf16*>(in);
  auto* b = static_cast<bf16*>(inout);
  for (int i = 0; i < *length; ++i) b[i] = float_to_bf16(bf16_to_float(a[i]) + bf16_to_float(b[i]));
}

// Created on first use (MPI is running then: a communicator exists); MPI_Finalize releases it.
MPI_Op bf16_sum_op() {
  static const MPI_Op op = [] {
    MPI_Op created = MPI_OP_NULL;
    CHECK_MPI(MPI_Op_create(&bf16_sum, /*commute=*/1, &created), "creation of the bf16 sum operation");
    return created;
  }();
  return op;
}

MPI_Datatype mpi_type(DType dtype) {
  switch (dtype) {
    case DType::F32:
      return MPI_FLOAT;
    case DType::BF16:
      return MPI_UINT16_T;
    case DType::F64:
      return MPI_DOUBLE;
    case DType::I32:
      return MPI_INT32_T;
    case DType::I64:
      return MPI_INT64_T;
    case DType::U8:
      return MPI_UINT8_T;
  }
  MOE_FAIL("unknown DType " << int(dtype));
}

MPI_Op sum_op(DType dtype) { return dtype == DType::BF16 ? bf16_sum_op() : MPI_SUM; }

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

std::string MpiCommunicator::describe(const char* op, DType dtype) const {
  return describe((std::string(op) + "(" + dtype_name(dtype) + ")").c_str());
}

int MpiCommunicator::int_count(int64_t count, const char* op, DType dtype) const {
  MOE_CHECK(count >= 0 && count <= INT_MAX, describe(op, dtype)
                                                << ": count " << count << " is negative or exceeds MPI's int counts ("
                                                << INT_MAX << " elements); split the buffer into smaller pieces");
  return static_cast<int>(count);
}

// ---- all-reduce, reduce-scatter

void MpiCommunicator::allreduce_sum(void* data, int64_t count, DType dtype) {
  const char* op = "allreduce_sum";
  const int n = int_count(count, op, dtype);
  CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, data, n, mpi_type(dtype), sum_op(dtype), comm_),
            describe(op, dtype) << " of " << n << " elements");
}

std::unique_ptr<Request> MpiCommunicator::iallreduce_sum(void* data, int64_t count, DType dtype) {
  const char* op = "iallreduce_sum";
  const int n = int_count(count, op, dtype);
  MPI_Request request = MPI_REQUEST_NULL;
  std::string what = describe(op, dtype) + " of " + std::to_string(n) + " elements";
  CHECK_MPI(MPI_Iallreduce(MPI_IN_PLACE, data, n, mpi_type(dtype), sum_op(dtype), comm_, &request), what);
  return std::make_unique<MpiRequest>(request, std::move(what));
}

void MpiCommunicator::reduce_scatter_sum(const void* send, void* recv, int64_t count, DType dtype) {
  const char* op = "reduce_scatter_sum";
  const int n = int_count(count, op, dtype);
  MOE_CHECK(n == 0 || send != recv, describe(op, dtype) << ": send and recv must be different buffers");
  CHECK_MPI(MPI_Reduce_scatter_block(send, recv, n, mpi_type(dtype), sum_op(dtype), comm_),
            describe(op, dtype) << " of " << n << " elements per rank");
}

std::unique_ptr<Request> MpiCommunicator::ireduce_scatter_sum(const void* send, void* recv, int64_t count,
                                                              DType dtype) {
  const char* op = "ireduce_scatter_sum";
  const int n = int_count(count, op, dtype);
  MOE_CHECK(n == 0 || send != recv, describe(op, dtype) << ": send and recv must be different buffers");
  MPI_Request request = MPI_REQUEST_NULL;
  std::string what = describe(op, dtype) + " of " + std::to_string(n) + " elements per rank";
  CHECK_MPI(MPI_Ireduce_scatter_block(send, recv, n, mpi_type(dtype), sum_op(dtype), comm_, &request), what);
  return std::make_unique<MpiRequest>(request, std::move(what));
}

// ---- all-gather, all-to-all

void MpiCommunicator::allgather(const void* send, void* recv, int64_t count, DType dtype) {
  const char* op = "allgather";
  const int n = int_count(count, op, dtype);
  MOE_CHECK(n == 0 || send != recv, describe(op, dtype) << ": send and recv must be different buffers");
  const MPI_Datatype type = mpi_type(dtype);
  CHECK_MPI(MPI_Allgather(send, n, type, recv, n, type, comm_), describe(op, dtype)
                                                                    << " of " << n << " elements per rank");
}

void MpiCommunicator::alltoall(const void* send, void* recv, int64_t count, DType dtype) {
  const char* op = "alltoall";
  const int n = int_count(count, op, dtype);
  MOE_CHECK(n == 0 || send != recv, describe(op, dtype) << ": send and recv must be different buffers");
  const MPI_Datatype type = mpi_type(dtype);
  CHECK_MPI(MPI_Alltoall(send, n, type, recv, n, type, comm_), describe(op, dtype)
                                                                   << " of " << n << " elements per rank");
}

std::vector<int> MpiCommunicator::alltoallv_layout(const int64_t* send_counts, const int64_t* recv_counts,
                                                   const char* op, DType dtype) const {
  // MPI's v-forms take int counts and int displacements: every count and every prefix sum must fit.
  std::vector<int> layout(4 * static_cast<size_t>(size_));
  int* send_counts_int = layout.data();
  int* send_displacements = send_counts_int + size_;
  int* recv_counts_int = send_displacements + size_;
  int* recv_displacements = recv_counts_int + size_;
  int64_t send_total = 0, recv_total = 0;
  for (int peer = 0; peer < size_; ++peer) {
    MOE_CHECK(send_counts[peer] >= 0 && recv_counts[peer] >= 0,
              describe(op, dtype) << ": negative count for peer " << peer << " (send " << send_counts[peer] << ", recv "
                                  << recv_counts[peer] << ")");
    MOE_CHECK(send_total + send_counts[peer] <= INT_MAX,
              describe(op, dtype) << ": send count " << send_counts[peer] << " to peer " << peer << " after "
                                  << send_total << " elements exceeds MPI's int counts and displacements (" << INT_MAX
                                  << " elements); split the exchange into smaller pieces");
    MOE_CHECK(recv_total + recv_counts[peer] <= INT_MAX,
              describe(op, dtype) << ": recv count " << recv_counts[peer] << " from peer " << peer << " after "
                                  << recv_total << " elements exceeds MPI's int counts and displacements (" << INT_MAX
                                  << " elements); split the exchange into smaller pieces");
    send_counts_int[peer] = static_cast<int>(send_counts[peer]);
    send_displacements[peer] = static_cast<int>(send_total);
    recv_counts_int[peer] = static_cast<int>(recv_counts[peer]);
    recv_displacements[peer] = static_cast<int>(recv_total);
    send_total += send_counts[peer];
    recv_total += recv_counts[peer];
  }
  return layout;
}

namespace {

// "(sending S, receiving R elements)" of an all-to-all-v layout, for messages.
std::string alltoallv_totals(const std::vector<int>& layout, int size) {
  int64_t send_total = 0, recv_total = 0;
  for (int peer = 0; peer < size; ++peer) send_total += layout[peer], recv_total += layout[2 * size + peer];
  return " (sending " + std::to_string(send_total) + ", receiving " + std::to_string(recv_total) + " elements)";
}

bool alltoallv_moves_data(const std::vector<int>& layout, int size) {
  int64_t send_total = 0, recv_total = 0;
  for (int peer = 0; peer < size; ++peer) send_total += layout[peer], recv_total += layout[2 * size + peer];
  return send_total != 0 && recv_total != 0;
}

}  // namespace

void MpiCommunicator::alltoallv(const void* send, const int64_t* send_counts, void* recv, const int64_t* recv_counts,
                                DType dtype) {
  const char* op = "alltoallv";
  const std::vector<int> layout = alltoallv_layout(send_counts, recv_counts, op, dtype);
  MOE_CHECK(!alltoallv_moves_data(layout, size_) || send != recv, describe(op, dtype)
                                                                      << ": send and recv must be different buffers");
  const int* l = layout.data();
  const MPI_Datatype type = mpi_type(dtype);
  CHECK_MPI(MPI_Alltoallv(send, l, l + size_, type, recv, l + 2 * size_, l + 3 * size_, type, comm_),
            describe(op, dtype) << alltoallv_totals(layout, size_));
}

std::unique_ptr<Request> MpiCommunicator::ialltoallv(const void* send, const int64_t* send_counts, void* recv,
                                                     const int64_t* recv_counts, DType dtype) {
  const char* op = "ialltoallv";
  std::vector<int> layout = alltoallv_layout(send_counts, recv_counts, op, dtype);
  MOE_CHECK(!alltoallv_moves_data(layout, size_) || send != recv, describe(op, dtype)
                                                                      << ": send and recv must be different buffers");
  const int* l = layout.data();
  const MPI_Datatype type = mpi_type(dtype);
  MPI_Request request = MPI_REQUEST_NULL;
  std::string what = describe(op, dtype) + alltoallv_totals(layout, size_);
  CHECK_MPI(MPI_Ialltoallv(send, l, l + size_, type, recv, l + 2 * size_, l + 3 * size_, type, comm_, &request), what);
  // MPI reads the counts and displacements until completion: the request keeps them (a moved vector keeps
  // its storage).
  return std::make_unique<MpiRequest>(request, std::move(what), std::move(layout));
}

// ---- point to point

void MpiCommunicator::send(const void* data, int64_t count, DType dtype, int peer, int tag) {
  const int n = int_count(count, "send", dtype);
  CHECK_MPI(MPI_Send(data, n, mpi_type(dtype), peer, tag, comm_),
            describe("send", dtype) << " of " << n << " elements to peer " << peer << " with tag " << tag);
}

void MpiCommunicator::recv(void* data, int64_t count, DType dtype, int peer, int tag) {
  const int n = int_count(count, "recv", dtype);
  const MPI_Datatype type = mpi_type(dtype);
  MPI_Status status;
  CHECK_MPI(MPI_Recv(data, n, type, peer, tag, comm_, &status),
            describe("recv", dtype) << " of " << n << " elements from peer " << peer << " with tag " << tag);
  int received = 0;
  CHECK_MPI(MPI_Get_count(&status, type, &received), describe("recv", dtype) << " (count of the message received)");
  // A shorter message is no MPI error, but here it means the two sides disagree on the size.
  MOE_CHECK(received == n, describe("recv", dtype) << " from peer " << peer << " with tag " << tag << ": expected " << n
                                                   << " elements, the peer sent " << received);
}

std::unique_ptr<Request> MpiCommunicator::isend(const void* data, int64_t count, DType dtype, int peer, int tag) {
  const int n = int_count(count, "isend", dtype);
  MPI_Request request = MPI_REQUEST_NULL;
  std::string what = describe("isend", dtype) + " of " + std::to_string(n) + " elements to peer " +
                     std::to_string(peer) + " with tag " + std::to_string(tag);
  CHECK_MPI(MPI_Isend(data, n, mpi_type(dtype), peer, tag, comm_, &request), what);
  return std::make_unique<MpiRequest>(request, std::move(what));
}

std::unique_ptr<Request> MpiCommunicator::irecv(void* data, int64_t count, DType dtype, int peer, int tag) {
  const int n = int_count(count, "irecv", dtype);
  const MPI_Datatype type = mpi_type(dtype);
  MPI_Request request = MPI_REQUEST_NULL;
  std::string what = describe("irecv", dtype) + " of " + std::to_string(n) + " elements from peer " +
                     std::to_string(peer) + " with tag " + std::to_string(tag);
  CHECK_MPI(MPI_Irecv(data, n, type, peer, tag, comm_, &request), what);
  auto pending = std::make_unique<MpiRequest>(request, std::move(what));
  pending->expect_received(type, n);
  return pending;
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

// ---- broadcast, barrier

void MpiCommunicator::broadcast(void* data, int64_t count, DType dtype, int root) {
  const int n = int_count(count, "broadcast", dtype);
  CHECK_MPI(MPI_Bcast(data, n, mpi_type(dtype), root, comm_), describe("broadcast", dtype)
                                                                  << " of " << n << " elements from root " << root);
}

void MpiCommunicator::barrier() { CHECK_MPI(MPI_Barrier(comm_), describe("barrier")); }

}  // namespace moe
