// The communicator of a group of one: every collective is a copy or nothing. A single process started
// without mpirun trains through the same code as a multi-rank job, over these; on the CUDA backend a
// data-plane group of one is one of these copying through the backend (no NCCL communicator for it).
#pragma once

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>

#include "core/backend/backend.h"
#include "core/error.h"
#include "parallel/communicator.h"

namespace moe {

class SelfCommunicator final : public Communicator {
 public:
  // With a backend its copies are the backend's (for buffers in its memory: a data-plane group of one).
  explicit SelfCommunicator(std::string name, Backend* backend = nullptr) : name_(std::move(name)), backend_(backend) {}
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string name() const override { return name_; }

  MOE_COMMUNICATOR_CONVENIENCE_FORMS;
  void allreduce_sum(void*, int64_t, DType) override {}
  std::unique_ptr<Request> iallreduce_sum(void*, int64_t, DType) override { return std::make_unique<Done>(); }
  void reduce_scatter_sum(const void* send, void* recv, int64_t count, DType dtype) override {
    copy(send, recv, count, dtype);
  }
  std::unique_ptr<Request> ireduce_scatter_sum(const void* send, void* recv, int64_t count, DType dtype) override {
    copy(send, recv, count, dtype);
    return std::make_unique<Done>();
  }
  void allgather(const void* send, void* recv, int64_t count, DType dtype) override { copy(send, recv, count, dtype); }
  void alltoall(const void* send, void* recv, int64_t count, DType dtype) override { copy(send, recv, count, dtype); }
  void alltoallv(const void* send, const int64_t* send_counts, void* recv, const int64_t* recv_counts,
                 DType dtype) override {
    MOE_CHECK(send_counts[0] == recv_counts[0],
              "alltoallv with itself: " << send_counts[0] << " sent, " << recv_counts[0] << " expected");
    copy(send, recv, send_counts[0], dtype);
  }
  std::unique_ptr<Request> ialltoallv(const void* send, const int64_t* send_counts, void* recv,
                                      const int64_t* recv_counts, DType dtype) override {
    alltoallv(send, send_counts, recv, recv_counts, dtype);
    return std::make_unique<Done>();
  }
  // A group of one has no peer (sending to oneself would need a matching receive in flight).
  void send(const void*, int64_t, DType, int, int) override { MOE_FAIL("send on a group of one (" << name_ << ")"); }
  void recv(void*, int64_t, DType, int, int) override { MOE_FAIL("recv on a group of one (" << name_ << ")"); }
  std::unique_ptr<Request> isend(const void*, int64_t, DType, int, int) override {
    MOE_FAIL("isend on a group of one (" << name_ << ")");
  }
  std::unique_ptr<Request> irecv(void*, int64_t, DType, int, int) override {
    MOE_FAIL("irecv on a group of one (" << name_ << ")");
  }
  void sendrecv_bytes(const void* send, int64_t send_bytes, int, void* recv, int64_t recv_bytes, int, int) override {
    MOE_CHECK(send_bytes == recv_bytes,
              "sendrecv with itself: " << send_bytes << " bytes sent, " << recv_bytes << " expected");
    copy(send, recv, send_bytes, DType::U8);
  }
  void broadcast(void*, int64_t, DType, int) override {}
  void barrier() override {}

 private:
  struct Done final : Request {
    bool test() override { return true; }
    void wait() override {}
  };
  void copy(const void* from, void* to, int64_t count, DType dtype) {
    if (count <= 0 || from == to) return;
    const size_t bytes = static_cast<size_t>(count) * dtype_size(dtype);
    if (backend_)
      backend_->copy(to, from, bytes);
    else
      std::memcpy(to, from, bytes);
  }
  std::string name_;
  Backend* backend_ = nullptr;
};

}  // namespace moe
