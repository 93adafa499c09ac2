// The NCCL communicator's host-side plan, without a GPU: the all-to-all-v as one point-to-point transfer per
// peer at the seam's displacements (prefix sums of the counts), every block moved exactly once across the
// ranks, and the refusal of a CPU backend's buffers. Where there is a GPU (the device check runs this program),
// the NCCL communicator of one rank on it: every collective, the all-to-all-v and held sends and receives
// issued as one group, ordered with the backend's stream; and a data-plane group of one copying through the
// backend.
#include <gtest/gtest.h>

#include <vector>

#include "core/backend/backend.h"
#include "core/backend/cuda_backend.h"
#include "core/error.h"
#include "parallel/nccl_communicator.h"
#include "parallel/nccl_plan.h"
#include "parallel/self_communicator.h"

namespace moe {
namespace {

TEST(NcclPlan, AllToAllVIsOneTransferPerPeerAtThePrefixSums) {
  const std::vector<int64_t> send = {2, 0, 3, 1}, recv = {1, 0, 4, 2};
  const std::vector<PeerTransfer> plan = alltoallv_plan(2, 4, send.data(), recv.data());
  // Starting with itself (rank 2), then 3, 0; rank 1 moves nothing either way.
  ASSERT_EQ(plan.size(), 3u);
  EXPECT_EQ(plan[0].peer, 2);
  EXPECT_EQ(plan[0].send_offset, 2);
  EXPECT_EQ(plan[0].send_count, 3);
  EXPECT_EQ(plan[0].recv_offset, 1);
  EXPECT_EQ(plan[0].recv_count, 4);
  EXPECT_EQ(plan[1].peer, 3);
  EXPECT_EQ(plan[1].send_offset, 5);
  EXPECT_EQ(plan[1].recv_offset, 5);
  EXPECT_EQ(plan[2].peer, 0);
  EXPECT_EQ(plan[2].send_offset, 0);
  EXPECT_EQ(plan[2].recv_count, 1);
}

// Every rank's plan together: what q sends to r is what r expects from q, at matching sizes.
TEST(NcclPlan, SendsAndReceivesOfEveryPairMatch) {
  const int size = 5;
  auto count = [](int from, int to) { return int64_t((from * 7 + to * 3) % 4); };  // some zero
  std::vector<std::vector<PeerTransfer>> plans;
  for (int r = 0; r < size; ++r) {
    std::vector<int64_t> send(size), recv(size);
    for (int q = 0; q < size; ++q) send[size_t(q)] = count(r, q), recv[size_t(q)] = count(q, r);
    plans.push_back(alltoallv_plan(r, size, send.data(), recv.data()));
  }
  for (int r = 0; r < size; ++r)
    for (const PeerTransfer& t : plans[size_t(r)]) {
      EXPECT_EQ(t.send_count, count(r, t.peer));
      EXPECT_EQ(t.recv_count, count(t.peer, r));
      EXPECT_TRUE(t.send_count > 0 || t.recv_count > 0);
    }
  const std::vector<int64_t> bad = {1, -1};
  EXPECT_THROW(alltoallv_plan(0, 2, bad.data(), bad.data()), Error);
}

TEST(NcclCommunicator, RefusesBuffersThatAreNotOnACudaBackend) {
  const std::unique_ptr<Backend> cpu = make_cpu_backend(1);
  SelfCommunicator control("dp");
  EXPECT_THROW(make_nccl_communicator(control, *cpu), Error);
}

std::vector<float> iota(int64_t n, float first) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = first + float(i);
  return v;
}

// NCCL over a group of one on the device: what each operation gives is what the seam defines for one rank.
TEST(NcclCommunicator, OneRankOnTheDevice) {
  if (!nccl_built() || cuda_device_count() == 0) GTEST_SKIP() << "needs NCCL and a CUDA device";
  const std::unique_ptr<Backend> gpu = make_cuda_backend(0);
  SelfCommunicator control("one");
  const std::unique_ptr<Communicator> nccl = make_nccl_communicator(control, *gpu);
  ASSERT_EQ(nccl->size(), 1);
  const int64_t n = 1000;
  const std::vector<float> x = iota(n, 1.0f);
  Buffer a = gpu->upload(x), b = gpu->allocate(DType::F32, n), c = gpu->allocate(DType::F32, n);
  nccl->allreduce_sum(a.data<float>(), n);
  EXPECT_EQ(gpu->download<float>(a), x) << "all-reduce over one rank";
  nccl->ireduce_scatter_sum(a.data<float>(), b.data<float>(), n)->wait();
  EXPECT_EQ(gpu->download<float>(b), x) << "reduce-scatter";
  nccl->allgather(a.data<float>(), c.data<float>(), n);
  EXPECT_EQ(gpu->download<float>(c), x) << "all-gather";
  const int64_t counts[] = {n};
  gpu->ops<float>().fill(b.data<float>(), 0.0f, n);
  nccl->ialltoallv(a.data<float>(), counts, b.data<float>(), counts)->wait();
  EXPECT_EQ(gpu->download<float>(b), x) << "all-to-all-v (its own block: a copy)";
  // A send and a receive to itself, held until the receive is waited for, then one group.
  gpu->ops<float>().fill(c.data<float>(), 0.0f, n);
  std::unique_ptr<Request> sent = nccl->isend(a.data<float>(), n, 0, 0);
  nccl->recv(c.data<float>(), n, 0, 0);
  sent->wait();
  EXPECT_EQ(gpu->download<float>(c), x) << "send and receive as one group";
  // Compute queued before a collective is ordered before it.
  gpu->ops<float>().scale(a.data<float>(), 2.0f, n);
  nccl->ialltoallv(a.data<float>(), counts, b.data<float>(), counts)->wait();
  std::vector<float> doubled = x;
  for (float& v : doubled) v *= 2.0f;
  EXPECT_EQ(gpu->download<float>(b), doubled) << "the scaling queued before it";
  nccl->barrier();
}

TEST(SelfCommunicator, ADataPlaneGroupOfOneCopiesThroughItsBackend) {
  const std::unique_ptr<Backend> backend = cuda_device_count() > 0 ? make_cuda_backend(0) : make_cpu_backend(1);
  SelfCommunicator one("ep", backend.get());
  const std::vector<float> x = iota(64, -3.0f);
  Buffer a = backend->upload(x), b = backend->allocate(DType::F32, 64);
  const int64_t counts[] = {64};
  one.ialltoallv(a.data<float>(), counts, b.data<float>(), counts)->wait();
  EXPECT_EQ(backend->download<float>(b), x);
  backend->ops<float>().fill(b.data<float>(), 0.0f, 64);
  one.allgather(a.data<float>(), b.data<float>(), 64);
  EXPECT_EQ(backend->download<float>(b), x);
}

}  // namespace
}  // namespace moe
