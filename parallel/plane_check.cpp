// The plane-checking communicators (see plane_check.h).
#include "parallel/plane_check.h"

#include <numeric>

#include "core/error.h"

namespace moe {
namespace {

class PlaneCheck final : public Communicator {
 public:
  PlaneCheck(Plane plane, Communicator& inner, std::unique_ptr<Communicator> owned,
             std::function<bool(const void*, size_t)> in_backend,
             std::function<bool(const void*, size_t)> touches_backend)
      : plane_(plane),
        inner_(inner),
        owned_(std::move(owned)),
        in_backend_(std::move(in_backend)),
        touches_backend_(std::move(touches_backend)) {}
  MOE_COMMUNICATOR_CONVENIENCE_FORMS;
  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  std::string name() const override { return inner_.name(); }

  void allreduce_sum(void* data, int64_t count, DType dtype) override {
    check("all-reduce", data, count, dtype);
    inner_.allreduce_sum(data, count, dtype);
  }
  std::unique_ptr<Request> iallreduce_sum(void* data, int64_t count, DType dtype) override {
    check("all-reduce", data, count, dtype);
    return inner_.iallreduce_sum(data, count, dtype);
  }
  void reduce_scatter_sum(const void* send, void* recv, int64_t count, DType dtype) override {
    check("reduce-scatter", send, count * size(), dtype), check("reduce-scatter", recv, count, dtype);
    inner_.reduce_scatter_sum(send, recv, count, dtype);
  }
  std::unique_ptr<Request> ireduce_scatter_sum(const void* send, void* recv, int64_t count, DType dtype) override {
    check("reduce-scatter", send, count * size(), dtype), check("reduce-scatter", recv, count, dtype);
    return inner_.ireduce_scatter_sum(send, recv, count, dtype);
  }
  void allgather(const void* send, void* recv, int64_t count, DType dtype) override {
    check("all-gather", send, count, dtype), check("all-gather", recv, count * size(), dtype);
    inner_.allgather(send, recv, count, dtype);
  }
  void alltoall(const void* send, void* recv, int64_t count, DType dtype) override {
    check("all-to-all", send, count * size(), dtype), check("all-to-all", recv, count * size(), dtype);
    inner_.alltoall(send, recv, count, dtype);
  }
  void alltoallv(const void* send, const int64_t* send_counts, void* recv, const int64_t* recv_counts,
                 DType dtype) override {
    check_v(send, send_counts, recv, recv_counts, dtype);
    inner_.alltoallv(send, send_counts, recv, recv_counts, dtype);
  }
  std::unique_ptr<Request> ialltoallv(const void* send, const int64_t* send_counts, void* recv,
                                      const int64_t* recv_counts, DType dtype) override {
    check_v(send, send_counts, recv, recv_counts, dtype);
    return inner_.ialltoallv(send, send_counts, recv, recv_counts, dtype);
  }
  void send(const void* data, int64_t count, DType dtype, int peer, int tag) override {
    check("send", data, count, dtype);
    inner_.send(data, count, dtype, peer, tag);
  }
  void recv(void* data, int64_t count, DType dtype, int peer, int tag) override {
    check("receive", data, count, dtype);
    inner_.recv(data, count, dtype, peer, tag);
  }
  std::unique_ptr<Request> isend(const void* data, int64_t count, DType dtype, int peer, int tag) override {
    check("send", data, count, dtype);
    return inner_.isend(data, count, dtype, peer, tag);
  }
  std::unique_ptr<Request> irecv(void* data, int64_t count, DType dtype, int peer, int tag) override {
    check("receive", data, count, dtype);
    return inner_.irecv(data, count, dtype, peer, tag);
  }
  void sendrecv_bytes(const void* send, int64_t send_bytes, int dest, void* recv, int64_t recv_bytes, int source,
                      int tag) override {
    check("send-receive", send, send_bytes, DType::U8), check("send-receive", recv, recv_bytes, DType::U8);
    inner_.sendrecv_bytes(send, send_bytes, dest, recv, recv_bytes, source, tag);
  }
  void broadcast(void* data, int64_t count, DType dtype, int root) override {
    check("broadcast", data, count, dtype);
    inner_.broadcast(data, count, dtype, root);
  }
  void barrier() override { inner_.barrier(); }

 private:
  void check(const char* what, const void* p, int64_t count, DType dtype) const {
    const size_t bytes = size_t(count) * dtype_size(dtype);
    if (bytes == 0) return;
    const bool ok = plane_ == Plane::Data ? in_backend_(p, bytes) : !touches_backend_(p, bytes);
    MOE_CHECK(ok, what << " of " << bytes << " bytes at " << p << " on the "
                       << (plane_ == Plane::Data ? "data" : "control") << " plane of group '" << name() << "': "
                       << (plane_ == Plane::Data ? "not backend memory (the data plane moves device memory)"
                                                 : "backend memory (the control plane moves host memory)"));
  }
  void check_v(const void* send, const int64_t* send_counts, void* recv, const int64_t* recv_counts,
               DType dtype) const {
    const int64_t sent = std::accumulate(send_counts, send_counts + size(), int64_t(0));
    const int64_t received = std::accumulate(recv_counts, recv_counts + size(), int64_t(0));
    check("all-to-all-v", send, sent, dtype), check("all-to-all-v", recv, received, dtype);
  }

  Plane plane_;
  Communicator& inner_;
  std::unique_ptr<Communicator> owned_;
  std::function<bool(const void*, size_t)> in_backend_, touches_backend_;
};

}  // namespace

std::unique_ptr<Communicator> make_plane_check(Plane plane, Communicator& inner,
                                               std::function<bool(const void*, size_t)> in_backend,
                                               std::function<bool(const void*, size_t)> touches_backend) {
  return std::make_unique<PlaneCheck>(plane, inner, nullptr, std::move(in_backend), std::move(touches_backend));
}

std::unique_ptr<Communicator> make_plane_check(Plane plane, std::unique_ptr<Communicator> inner,
                                               std::function<bool(const void*, size_t)> in_backend,
                                               std::function<bool(const void*, size_t)> touches_backend) {
  Communicator& ref = *inner;
  return std::make_unique<PlaneCheck>(plane, ref, std::move(inner), std::move(in_backend), std::move(touches_backend));
}

}  // namespace moe
