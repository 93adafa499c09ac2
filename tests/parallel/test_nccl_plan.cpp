// The NCCL communicator's host-side plan, without a GPU: the all-to-all-v as one point-to-point transfer per
// peer at the seam's displacements (prefix sums of the counts), every block moved exactly once across the
// ranks, and the refusal of a CPU backend's buffers.
#include <gtest/gtest.h>

#include <vector>

#include "core/backend/backend.h"
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

}  // namespace
}  // namespace moe
