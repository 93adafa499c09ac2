// The NCCL communicator (see parallel/nccl_communicator.h).
#include "parallel/nccl_communicator.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstring>
#include <functional>
#include <memory>
#include <vector>

#include "core/backend/cuda/cuda_check.h"
#include "core/backend/cuda/host_wait.h"
#include "core/backend/cuda_backend.h"
#include "core/error.h"
#include "parallel/nccl_plan.h"

namespace moe {
namespace {

ncclDataType_t nccl_type(DType dtype) {
  switch (dtype) {
    case DType::F32:
      return ncclFloat32;
    case DType::BF16:
      return ncclBfloat16;
    case DType::F64:
      return ncclFloat64;
    case DType::I32:
      return ncclInt32;
    case DType::I64:
      return ncclInt64;
    case DType::U8:
      return ncclUint8;
  }
  MOE_FAIL("no NCCL type for dtype " << int(dtype));
}

// Side work on the backend's memory (cuda_begin_side_work): begun when a request is made, ended once the compute
// stream is ordered after it, so that the buffers it reads or writes are not handed out again before.
class SideWork {
 public:
  explicit SideWork(Backend& backend) : backend_(backend), ticket_(cuda_begin_side_work(backend)) {}
  ~SideWork() { end(); }
  SideWork(const SideWork&) = delete;
  SideWork& operator=(const SideWork&) = delete;
  void end() noexcept {
    if (ticket_ == 0) return;
    try {
      cuda_end_side_work(backend_, ticket_);
    } catch (const std::exception&) {  // a ticket of this backend's allocator ends once: never here
    }
    ticket_ = 0;
  }

 private:
  Backend& backend_;
  uint64_t ticket_;
};

// Work on the communicator's stream, done when its event is: wait() orders the compute stream after it.
class NcclRequest final : public Request {
 public:
  // check: the communicator's look at NCCL's asynchronous errors, while a test finds the work running.
  NcclRequest(cudaStream_t compute, cudaEvent_t done, Backend& backend, std::function<void()> check)
      : compute_(compute), done_(done), side_work_(backend), check_(std::move(check)) {}
  ~NcclRequest() override {
    if (!waited_) cudaStreamWaitEvent(compute_, done_, 0);
    side_work_.end();
    cudaEventDestroy(done_);
  }
  bool test() override {
    const cudaError_t status = cudaEventQuery(done_);
    if (status == cudaErrorNotReady) {
      check_();
      return false;
    }
    MOE_CUDA_CHECK(status);
    wait();
    return true;
  }
  void wait() override {
    if (!waited_) MOE_CUDA_CHECK(cudaStreamWaitEvent(compute_, done_, 0));
    waited_ = true;
    side_work_.end();
  }

 private:
  cudaStream_t compute_;
  cudaEvent_t done_;
  SideWork side_work_;
  std::function<void()> check_;
  bool waited_ = false;
};

// Point-to-point transfers issued but not yet handed to NCCL: they go to NCCL together, as one group, when
// one of their requests is tested or waited for, or before any other operation of the communicator. So a
// send followed by a receive runs as one group, as Megatron-Core batches a pipeline stage's send and
// receive: NCCL's sends and receives issued one by one on a stream block it until the peer's matching call
// runs, and two neighbours that each send first would wait for each other.
struct PendingBatch {
  struct Transfer {
    bool send = false;
    void* data = nullptr;
    size_t count = 0;
    ncclDataType_t type = ncclFloat32;
    int peer = 0;
  };
  std::vector<Transfer> transfers;
  cudaEvent_t done = nullptr;  // recorded when the batch is issued
  ~PendingBatch() {
    if (done) cudaEventDestroy(done);
  }
};

class NcclCommunicator;

// A send or receive of a batch: the batch is issued when the request is first tested or waited for.
class NcclTransferRequest final : public Request {
 public:
  NcclTransferRequest(NcclCommunicator& comm, std::shared_ptr<PendingBatch> batch, Backend& backend)
      : comm_(comm), batch_(std::move(batch)), side_work_(backend) {}
  ~NcclTransferRequest() override;
  bool test() override;
  void wait() override;

 private:
  NcclCommunicator& comm_;
  std::shared_ptr<PendingBatch> batch_;
  SideWork side_work_;
  bool waited_ = false;
};

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(Communicator& control, Backend& backend);
  ~NcclCommunicator() override;
  MOE_COMMUNICATOR_CONVENIENCE_FORMS;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return name_; }

  void allreduce_sum(void* data, int64_t count, DType dtype) override { iallreduce_sum(data, count, dtype)->wait(); }
  std::unique_ptr<Request> iallreduce_sum(void* data, int64_t count, DType dtype) override {
    return enqueue("all-reduce", [&](cudaStream_t s) {
      return ncclAllReduce(data, data, size_t(count), nccl_type(dtype), ncclSum, comm_, s);
    });
  }
  void reduce_scatter_sum(const void* send, void* recv, int64_t count, DType dtype) override {
    ireduce_scatter_sum(send, recv, count, dtype)->wait();
  }
  std::unique_ptr<Request> ireduce_scatter_sum(const void* send, void* recv, int64_t count, DType dtype) override {
    return enqueue("reduce-scatter", [&](cudaStream_t s) {
      return ncclReduceScatter(send, recv, size_t(count), nccl_type(dtype), ncclSum, comm_, s);
    });
  }
  void allgather(const void* send, void* recv, int64_t count, DType dtype) override {
    enqueue("all-gather", [&](cudaStream_t s) {
      return ncclAllGather(send, recv, size_t(count), nccl_type(dtype), comm_, s);
    })->wait();
  }
  void alltoall(const void* send, void* recv, int64_t count, DType dtype) override {
    const std::vector<int64_t> counts(size_t(size_), count);
    alltoallv(send, counts.data(), recv, counts.data(), dtype);
  }
  void alltoallv(const void* send, const int64_t* send_counts, void* recv, const int64_t* recv_counts,
                 DType dtype) override {
    ialltoallv(send, send_counts, recv, recv_counts, dtype)->wait();
  }
  std::unique_ptr<Request> ialltoallv(const void* send, const int64_t* send_counts, void* recv,
                                      const int64_t* recv_counts, DType dtype) override;
  void send(const void* data, int64_t count, DType dtype, int peer, int tag) override {
    isend(data, count, dtype, peer, tag)->wait();
  }
  void recv(void* data, int64_t count, DType dtype, int peer, int tag) override {
    irecv(data, count, dtype, peer, tag)->wait();
  }
  std::unique_ptr<Request> isend(const void* data, int64_t count, DType dtype, int peer, int) override {
    return defer(true, const_cast<void*>(data), count, dtype, peer);
  }
  std::unique_ptr<Request> irecv(void* data, int64_t count, DType dtype, int peer, int) override {
    return defer(false, data, count, dtype, peer);
  }
  void sendrecv_bytes(const void* send, int64_t send_bytes, int dest, void* recv, int64_t recv_bytes, int source,
                      int) override;
  void broadcast(void* data, int64_t count, DType dtype, int root) override {
    enqueue("broadcast", [&](cudaStream_t s) {
      return ncclBroadcast(data, data, size_t(count), nccl_type(dtype), root, comm_, s);
    })->wait();
  }
  // Every rank's queued work, communication and compute, done; then the ranks meet on the control plane.
  void barrier() override {
    flush();
    wait_for(compute_);
    wait_for(stream_);
    control_.barrier();
  }

 private:
  friend class NcclTransferRequest;
  // NCCL reports a failure inside a running collective (a peer that died, a network error) only through
  // ncclCommGetAsyncError: the communicator is then aborted, so that its kernels end, and the wait that asked
  // fails naming it. Run between the polls of every host wait for this communicator's or the backend's stream.
  void check_async_error();
  // A host wait for `stream` that checks for NCCL's asynchronous errors while it polls.
  void wait_for(cudaStream_t stream) {
    auto done = [&] {
      const cudaError_t status = cudaStreamQuery(stream);
      if (status == cudaErrorNotReady) return false;
      MOE_CUDA_CHECK(status);
      return true;
    };
    cuda::wait_polling(done, [&] { check_async_error(); });
  }
  // Issues the pending point-to-point transfers as one NCCL group (nothing when there are none).
  void flush();
  cudaStream_t compute_stream() const { return compute_; }
  std::unique_ptr<Request> defer(bool send, void* data, int64_t count, DType dtype, int peer) {
    if (!pending_) pending_ = std::make_shared<PendingBatch>();
    pending_->transfers.push_back({send, data, size_t(count), nccl_type(dtype), peer});
    return std::make_unique<NcclTransferRequest>(*this, pending_, backend_);
  }
  // After the compute stream's queued work, the communicator's stream runs what follows.
  void follow_compute() {
    MOE_CUDA_CHECK(cudaEventRecord(ready_, compute_));
    MOE_CUDA_CHECK(cudaStreamWaitEvent(stream_, ready_, 0));
  }
  // Runs `issue` on the communicator's stream after the compute stream's queued work and after the pending
  // transfers; the request completes with it.
  template <typename Issue>
  std::unique_ptr<Request> enqueue(const char* what, Issue issue) {
    flush();
    follow_compute();
    check_async_error();
    MOE_NCCL_CHECK(issue(stream_), what << " on communicator '" << name_ << "'");
    cudaEvent_t done = nullptr;
    MOE_CUDA_CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
    MOE_CUDA_CHECK(cudaEventRecord(done, stream_));
    return std::make_unique<NcclRequest>(compute_, done, backend_, [this] { check_async_error(); });
  }

  Communicator& control_;
  Backend& backend_;
  uint64_t watch_ = 0;  // check_async_error among the backend's host waits
  cudaStream_t compute_ = nullptr, stream_ = nullptr;
  cudaEvent_t ready_ = nullptr;
  std::shared_ptr<PendingBatch> pending_;  // transfers not yet issued
  ncclComm_t comm_ = nullptr;
  int rank_ = 0, size_ = 1;
  std::string name_;
};

NcclCommunicator::NcclCommunicator(Communicator& control, Backend& backend)
    : control_(control),
      backend_(backend),
      compute_(static_cast<cudaStream_t>(cuda_stream_of(backend))),
      rank_(control.rank()),
      size_(control.size()),
      name_(control.name()) {
  ncclUniqueId id;
  std::memset(&id, 0, sizeof id);
  if (rank_ == 0) MOE_NCCL_CHECK(ncclGetUniqueId(&id), "unique id for '" << name_ << "'");
  control.broadcast(reinterpret_cast<uint8_t*>(&id), int64_t(sizeof id), 0);
  MOE_NCCL_CHECK(ncclCommInitRank(&comm_, size_, id, rank_), "init of '" << name_ << "' (rank " << rank_ << ")");
  MOE_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  MOE_CUDA_CHECK(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming));
  watch_ = cuda_watch(backend_, [this] { check_async_error(); });
}

NcclCommunicator::~NcclCommunicator() {
  cuda_unwatch(backend_, watch_);
  try {
    flush();
    wait_for(stream_);
  } catch (const std::exception&) {  // a destructor does not throw; the job is failing already
  }
  if (comm_) ncclCommDestroy(comm_);  // null once aborted
  cudaStreamSynchronize(stream_);     // an aborted communicator's kernels end
  cudaEventDestroy(ready_);
  cudaStreamDestroy(stream_);
}

void NcclCommunicator::check_async_error() {
  if (!comm_) MOE_RUN_FAILED("NCCL communicator '" << name_ << "' was aborted after an asynchronous error");
  ncclResult_t async = ncclSuccess;
  MOE_NCCL_CHECK(ncclCommGetAsyncError(comm_, &async), "error query on communicator '" << name_ << "'");
  if (async == ncclSuccess || async == ncclInProgress) return;
  ncclCommAbort(comm_);
  comm_ = nullptr;
  MOE_RUN_FAILED("NCCL communicator '" << name_ << "' (rank " << rank_ << " of " << size_
                                       << ") failed while its work ran: " << ncclGetErrorString(async)
                                       << " (a peer may have died or lost its network); communicator aborted");
}

void NcclCommunicator::flush() {
  if (!pending_) return;
  check_async_error();
  const std::shared_ptr<PendingBatch> batch = std::move(pending_);
  pending_.reset();
  follow_compute();
  ncclResult_t status = ncclGroupStart();
  for (const PendingBatch::Transfer& t : batch->transfers) {
    if (status != ncclSuccess) break;
    status = t.send ? ncclSend(t.data, t.count, t.type, t.peer, comm_, stream_)
                    : ncclRecv(t.data, t.count, t.type, t.peer, comm_, stream_);
  }
  const ncclResult_t end = ncclGroupEnd();
  MOE_NCCL_CHECK(status != ncclSuccess ? status : end, batch->transfers.size()
                                                           << " sends and receives on communicator '" << name_ << "'");
  MOE_CUDA_CHECK(cudaEventCreateWithFlags(&batch->done, cudaEventDisableTiming));
  MOE_CUDA_CHECK(cudaEventRecord(batch->done, stream_));
}

NcclTransferRequest::~NcclTransferRequest() {
  if (waited_) return;
  try {
    wait();  // destroying a request waits for it
  } catch (const std::exception&) {
  }
}

bool NcclTransferRequest::test() {
  if (!batch_->done) comm_.flush();
  const cudaError_t status = cudaEventQuery(batch_->done);
  if (status == cudaErrorNotReady) {
    comm_.check_async_error();
    return false;
  }
  MOE_CUDA_CHECK(status);
  wait();
  return true;
}

void NcclTransferRequest::wait() {
  if (waited_) return;
  if (!batch_->done) comm_.flush();
  MOE_CUDA_CHECK(cudaStreamWaitEvent(comm_.compute_stream(), batch_->done, 0));
  waited_ = true;
  side_work_.end();
}

// One NCCL group of sends and receives, one pair per peer (nccl_plan.h); this rank's own block is a copy.
std::unique_ptr<Request> NcclCommunicator::ialltoallv(const void* send, const int64_t* send_counts, void* recv,
                                                      const int64_t* recv_counts, DType dtype) {
  const std::vector<PeerTransfer> plan = alltoallv_plan(rank_, size_, send_counts, recv_counts);
  MOE_CHECK(send_counts[rank_] == recv_counts[rank_], "all-to-all-v on '" << name_ << "': " << send_counts[rank_]
                                                                          << " elements sent to itself, "
                                                                          << recv_counts[rank_] << " expected");
  const size_t bytes = dtype_size(dtype);
  const auto* from = static_cast<const char*>(send);
  auto* to = static_cast<char*>(recv);
  return enqueue("all-to-all-v", [&](cudaStream_t s) {
    ncclResult_t status = ncclGroupStart();
    for (const PeerTransfer& t : plan) {
      if (status != ncclSuccess) break;
      if (t.peer == rank_) {
        if (t.send_count > 0 &&
            cudaMemcpyAsync(to + t.recv_offset * int64_t(bytes), from + t.send_offset * int64_t(bytes),
                            size_t(t.send_count) * bytes, cudaMemcpyDeviceToDevice, s) != cudaSuccess)
          status = ncclUnhandledCudaError;
        continue;
      }
      if (t.send_count > 0)
        status =
            ncclSend(from + t.send_offset * int64_t(bytes), size_t(t.send_count), nccl_type(dtype), t.peer, comm_, s);
      if (status == ncclSuccess && t.recv_count > 0)
        status =
            ncclRecv(to + t.recv_offset * int64_t(bytes), size_t(t.recv_count), nccl_type(dtype), t.peer, comm_, s);
    }
    const ncclResult_t end = ncclGroupEnd();
    return status != ncclSuccess ? status : end;
  });
}

void NcclCommunicator::sendrecv_bytes(const void* send, int64_t send_bytes, int dest, void* recv, int64_t recv_bytes,
                                      int source, int) {
  enqueue("send-receive", [&](cudaStream_t s) {
    ncclResult_t status = ncclGroupStart();
    if (status == ncclSuccess && send_bytes > 0) status = ncclSend(send, size_t(send_bytes), ncclUint8, dest, comm_, s);
    if (status == ncclSuccess && recv_bytes > 0)
      status = ncclRecv(recv, size_t(recv_bytes), ncclUint8, source, comm_, s);
    const ncclResult_t end = ncclGroupEnd();
    return status != ncclSuccess ? status : end;
  })->wait();
}

}  // namespace

bool nccl_built() { return true; }

std::unique_ptr<Communicator> make_nccl_communicator(Communicator& control, Backend& backend) {
  return std::make_unique<NcclCommunicator>(control, backend);
}

}  // namespace moe
