// The communicator of a group of one: every collective is a copy or nothing. A single process started
// without mpirun trains through the same code as a multi-rank job, over these.
#pragma once

#include <algorithm>
#include <string>

#include "core/error.h"
#include "parallel/communicator.h"

namespace moe {

class SelfCommunicator final : public Communicator {
 public:
  explicit SelfCommunicator(std::string name) : name_(std::move(name)) {}
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string name() const override { return name_; }

  void allreduce_sum(float*, int64_t) override {}
  void allreduce_sum(double*, int64_t) override {}
  void allreduce_sum(int64_t*, int64_t) override {}
  std::unique_ptr<Request> iallreduce_sum(float*, int64_t) override { return std::make_unique<Done>(); }
  void reduce_scatter_sum(const float* send, float* recv, int64_t count) override { std::copy_n(send, count, recv); }
  std::unique_ptr<Request> ireduce_scatter_sum(const float* send, float* recv, int64_t count) override {
    std::copy_n(send, count, recv);
    return std::make_unique<Done>();
  }
  void allgather(const float* send, float* recv, int64_t count) override { std::copy_n(send, count, recv); }
  void allgather(const int64_t* send, int64_t* recv, int64_t count) override { std::copy_n(send, count, recv); }
  void alltoall(const int64_t* send, int64_t* recv, int64_t count) override { std::copy_n(send, count, recv); }
  void alltoallv(const float* send, const int64_t* send_counts, float* recv, const int64_t* recv_counts) override {
    MOE_CHECK(send_counts[0] == recv_counts[0],
              "alltoallv with itself: " << send_counts[0] << " sent, " << recv_counts[0] << " expected");
    std::copy_n(send, send_counts[0], recv);
  }
  void send(const float*, int64_t, int, int) override { MOE_FAIL("send on a group of one (" << name_ << ")"); }
  void recv(float*, int64_t, int, int) override { MOE_FAIL("recv on a group of one (" << name_ << ")"); }
  void sendrecv_bytes(const void* send, int64_t send_bytes, int, void* recv, int64_t recv_bytes, int, int) override {
    MOE_CHECK(send_bytes == recv_bytes,
              "sendrecv with itself: " << send_bytes << " bytes sent, " << recv_bytes << " expected");
    std::copy_n(static_cast<const char*>(send), send_bytes, static_cast<char*>(recv));
  }
  void broadcast(float*, int64_t, int) override {}
  void broadcast(int64_t*, int64_t, int) override {}
  void barrier() override {}

 private:
  struct Done final : Request {
    bool test() override { return true; }
    void wait() override {}
  };
  std::string name_;
};

}  // namespace moe
