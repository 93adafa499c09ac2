// The plane-checking communicators (see plane_check.h).
#include "parallel/plane_check.h"

#include <numeric>

#include "core/error.h"

namespace moe {
namespace {

class PlaneCheck final : public Communicator {
 public:
  PlaneCheck(Plane plane, Communicator& inner, std::unique_ptr<Communicator> owned, BackendMemoryView memory)
      : plane_(plane), inner_(inner), owned_(std::move(owned)), memory_(std::move(memory)) {}
  MOE_COMMUNICATOR_CONVENIENCE_FORMS;
  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  std::string name() const override { return inner_.name(); }

  void allreduce_sum(void* data, int64_t count, DType dtype) override {
    inner_.allreduce_sum(check("all-reduce", data, count, dtype), count, dtype);
  }
  std::unique_ptr<Request> iallreduce_sum(void* data, int64_t count, DType dtype) override {
    return inner_.iallreduce_sum(check("all-reduce", data, count, dtype), count, dtype);
  }
  void reduce_scatter_sum(const void* send, void* recv, int64_t count, DType dtype) override {
    const char* op = "reduce-scatter";
    inner_.reduce_scatter_sum(check(op, send, count * size(), dtype), check(op, recv, count, dtype), count, dtype);
  }
  std::unique_ptr<Request> ireduce_scatter_sum(const void* send, void* recv, int64_t count, DType dtype) override {
    const char* op = "reduce-scatter";
    return inner_.ireduce_scatter_sum(check(op, send, count * size(), dtype), check(op, recv, count, dtype), count,
                                      dtype);
  }
  void allgather(const void* send, void* recv, int64_t count, DType dtype) override {
    const char* op = "all-gather";
    inner_.allgather(check(op, send, count, dtype), check(op, recv, count * size(), dtype), count, dtype);
  }
  void alltoall(const void* send, void* recv, int64_t count, DType dtype) override {
    const char* op = "all-to-all";
    inner_.alltoall(check(op, send, count * size(), dtype), check(op, recv, count * size(), dtype), count, dtype);
  }
  void alltoallv(const void* send, const int64_t* send_counts, void* recv, const int64_t* recv_counts,
                 DType dtype) override {
    const char* op = "all-to-all-v";
    inner_.alltoallv(check(op, send, total(send_counts), dtype), send_counts,
                     check(op, recv, total(recv_counts), dtype), recv_counts, dtype);
  }
  std::unique_ptr<Request> ialltoallv(const void* send, const int64_t* send_counts, void* recv,
                                      const int64_t* recv_counts, DType dtype) override {
    const char* op = "all-to-all-v";
    return inner_.ialltoallv(check(op, send, total(send_counts), dtype), send_counts,
                             check(op, recv, total(recv_counts), dtype), recv_counts, dtype);
  }
  void send(const void* data, int64_t count, DType dtype, int peer, int tag) override {
    inner_.send(check("send", data, count, dtype), count, dtype, peer, tag);
  }
  void recv(void* data, int64_t count, DType dtype, int peer, int tag) override {
    inner_.recv(check("receive", data, count, dtype), count, dtype, peer, tag);
  }
  std::unique_ptr<Request> isend(const void* data, int64_t count, DType dtype, int peer, int tag) override {
    return inner_.isend(check("send", data, count, dtype), count, dtype, peer, tag);
  }
  std::unique_ptr<Request> irecv(void* data, int64_t count, DType dtype, int peer, int tag) override {
    return inner_.irecv(check("receive", data, count, dtype), count, dtype, peer, tag);
  }
  void sendrecv_bytes(const void* send, int64_t send_bytes, int dest, void* recv, int64_t recv_bytes, int source,
                      int tag) override {
    const char* op = "send-receive";
    inner_.sendrecv_bytes(check(op, send, send_bytes, DType::U8), send_bytes, dest,
                          check(op, recv, recv_bytes, DType::U8), recv_bytes, source, tag);
  }
  void broadcast(void* data, int64_t count, DType dtype, int root) override {
    inner_.broadcast(check("broadcast", data, count, dtype), count, dtype, root);
  }
  void barrier() override { inner_.barrier(); }

 private:
  // The pointer to pass on: on the data plane the storage behind backend memory (what a device's own engines
  // reach), on the control plane the host memory itself.
  void* check(const char* what, const void* p, int64_t count, DType dtype) const {
    const size_t bytes = size_t(count) * dtype_size(dtype);
    if (bytes == 0) return const_cast<void*>(p);
    const bool ok = plane_ == Plane::Data ? memory_.in_backend(p, bytes) : !memory_.touches_backend(p, bytes);
    MOE_CHECK(ok, what << " of " << bytes << " bytes at " << p << " on the "
                       << (plane_ == Plane::Data ? "data" : "control") << " plane of group '" << name() << "': "
                       << (plane_ == Plane::Data ? "not backend memory (the data plane moves device memory)"
                                                 : "backend memory (the control plane moves host memory)"));
    if (plane_ == Plane::Control || !memory_.storage) return const_cast<void*>(p);
    return memory_.storage(p, bytes, what);
  }
  int64_t total(const int64_t* counts) const { return std::accumulate(counts, counts + size(), int64_t(0)); }

  Plane plane_;
  Communicator& inner_;
  std::unique_ptr<Communicator> owned_;
  BackendMemoryView memory_;
};

}  // namespace

BackendMemoryView memory_view(MemoryCheckBackend& backend) {
  MemoryCheckBackend* b = &backend;
  return {[b](const void* p, size_t n) { return b->owns(p, n); },
          [b](const void* p, size_t n) { return b->touches(p, n); },
          [b](const void* p, size_t n, const char* what) { return b->storage(p, n, what); }};
}

std::unique_ptr<Communicator> make_plane_check(Plane plane, Communicator& inner, BackendMemoryView memory) {
  return std::make_unique<PlaneCheck>(plane, inner, nullptr, std::move(memory));
}

std::unique_ptr<Communicator> make_plane_check(Plane plane, std::unique_ptr<Communicator> inner,
                                               BackendMemoryView memory) {
  Communicator& ref = *inner;
  return std::make_unique<PlaneCheck>(plane, ref, std::move(inner), std::move(memory));
}

}  // namespace moe
