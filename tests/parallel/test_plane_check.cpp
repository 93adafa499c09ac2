// The checks behind training as on GPUs, on the CPU (core/backend/memory_check.h, parallel/plane_check.h): the
// memory-checking backend knows its live buffers, its copies refuse a pointer on the wrong side, it computes
// what the CPU backend computes; a data-plane communicator refuses host memory and a control-plane one
// backend memory, naming the operation, the group and the plane.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/backend/memory_check.h"
#include "core/error.h"
#include "parallel/plane_check.h"
#include "parallel/self_communicator.h"

namespace moe {
namespace {

TEST(MemoryCheckBackend, KnowsItsLiveBuffersAndRefusesCopiesFromTheWrongSide) {
  const auto backend = make_memory_check_backend(1);
  EXPECT_FALSE(backend->memory_is_host());
  std::vector<float> host(8, 1.5f);
  const float* first = nullptr;
  {
    Buffer b = backend->allocate(DType::F32, 8);
    first = b.data<float>();
    EXPECT_TRUE(backend->owns(first, 32));
    EXPECT_TRUE(backend->owns(first + 4, 16));
    EXPECT_FALSE(backend->owns(first + 4, 20)) << "runs past the buffer";
    EXPECT_TRUE(backend->touches(first + 7, 64));
    EXPECT_FALSE(backend->owns(host.data(), 4));
    EXPECT_FALSE(backend->touches(host.data(), 32));
    backend->copy_to_device(b.data<float>(), host.data(), 8);
    EXPECT_EQ(backend->download<float>(b), host);
    EXPECT_THROW(backend->copy_to_device(host.data(), b.data<float>(), 8), Error) << "host as the destination";
    EXPECT_THROW(backend->copy_to_host(b.data<float>(), host.data(), 8), Error) << "host as the source";
    EXPECT_THROW(backend->copy(host.data(), b.data<float>(), 32), Error);
    EXPECT_EQ(backend->allocated_bytes(), 32);
  }
  EXPECT_FALSE(backend->owns(first, 4)) << "freed";
  backend->synchronize();  // the storage goes back in stream order, after the work queued before the free
  EXPECT_EQ(backend->allocated_bytes(), 0);
}

TEST(MemoryCheckBackend, ComputesWhatTheCpuBackendComputes) {
  const auto checked = make_memory_check_backend(1);
  const auto cpu = make_cpu_backend(1);
  const std::vector<float> x = {1, -2, 3, 0.5f, 4, -1};
  Buffer a = checked->upload(x), b = cpu->upload(x);
  EXPECT_EQ(checked->ops<float>().sum_squares(a.data<float>(), 6), cpu->ops<float>().sum_squares(b.data<float>(), 6));
}

TEST(PlaneCheck, DataPlaneCarriesBackendMemoryOnly) {
  const auto backend = make_memory_check_backend(1);
  SelfCommunicator self("dp");
  const auto data = make_plane_check(Plane::Data, self, memory_view(*backend));
  Buffer rows = backend->allocate(DType::F32, 4), received = backend->allocate(DType::F32, 4);
  data->allreduce_sum(rows.data<float>(), 4);
  const int64_t counts[] = {4};
  data->ialltoallv(rows.data<float>(), counts, received.data<float>(), counts)->wait();
  std::vector<float> host(4);
  try {
    data->allreduce_sum(host.data(), 4);
    ADD_FAILURE() << "host memory on the data plane";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("all-reduce of 16 bytes"), std::string::npos) << m;
    EXPECT_NE(m.find("data plane of group 'dp'"), std::string::npos) << m;
  }
  EXPECT_THROW(data->allgather(host.data(), received.data<float>(), 4), Error);
}

TEST(PlaneCheck, ControlPlaneCarriesHostMemoryOnly) {
  const auto backend = make_memory_check_backend(1);
  const auto control =
      make_plane_check(Plane::Control, std::make_unique<SelfCommunicator>("ep"), memory_view(*backend));
  EXPECT_EQ(control->name(), "ep");
  std::vector<int64_t> counts(2, 3), received(2);
  control->alltoall(counts.data(), received.data(), 2);
  EXPECT_EQ(received, counts);
  Buffer rows = backend->allocate(DType::F32, 4);
  try {
    control->allreduce_sum(rows.data<float>(), 4);
    ADD_FAILURE() << "backend memory on the control plane";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("control plane of group 'ep'"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace moe
