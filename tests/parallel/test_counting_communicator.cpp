// CountingCommunicator (parallel/counting_communicator.h) over the world: every call reaches the wrapped
// communicator with its arguments (results compared with == on inputs that encode their source, as in
// test_collectives.cpp), and each kind's calls and bytes are exactly what the header defines, counted
// at the call (a nonblocking form before its request completes), with no other kind touched.
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <numeric>
#include <vector>

#include "parallel/counting_communicator.h"
#include "parallel/mpi_communicator.h"
#include "tests/parallel/collective_checks.h"

namespace moe {
namespace {

using namespace ::moe::comm_test;

// Exactly one call of `kind` with `bytes` so far, and nothing else counted.
void expect_only(const CountingCommunicator& c, CommKind kind, int64_t bytes) {
  for (int k = 0; k < kCommKinds; ++k) {
    const CommCount& got = c.count(CommKind(k));
    const bool this_kind = CommKind(k) == kind;
    EXPECT_EQ(got.calls, this_kind ? 1 : 0) << comm_kind_name(CommKind(k));
    EXPECT_EQ(got.bytes, this_kind ? bytes : 0) << comm_kind_name(CommKind(k));
  }
  EXPECT_EQ(c.calls(), 1);
}

TEST(CountingCommunicator, ForwardsRankSizeAndName) {
  auto world = MpiCommunicator::world();
  CountingCommunicator counting(*world);
  EXPECT_EQ(counting.rank(), world->rank());
  EXPECT_EQ(counting.size(), world->size());
  EXPECT_EQ(counting.name(), world->name());
  EXPECT_EQ(counting.calls(), 0);
  EXPECT_EQ(counting.bytes_sent(), 0);
}

TEST(CountingCommunicator, AllreduceInBothForms) {
  auto world = MpiCommunicator::world();
  const int n = world->size(), me = world->rank();
  for (const bool nonblocking : {false, true}) {
    CountingCommunicator counting(*world);
    std::vector<double> data(7);
    for (int64_t i = 0; i < 7; ++i) data[size_t(i)] = encode(me, i);
    if (nonblocking) {
      auto request = counting.iallreduce_sum(data.data(), 7);
      expect_only(counting, CommKind::Iallreduce, 7 * 8);  // counted when started
      request->wait();
    } else {
      counting.allreduce_sum(data.data(), 7);
      expect_only(counting, CommKind::Allreduce, 7 * 8);
    }
    int64_t wrong = 0;
    for (int64_t i = 0; i < 7; ++i) wrong += data[size_t(i)] != 1000.0 * (n * (n - 1) / 2) + double(n * i);
    EXPECT_NONE_WRONG(wrong);
    EXPECT_EQ(counting.bytes_sent(), 7 * 8);
  }
}

TEST(CountingCommunicator, ReduceScatterCountsItsWholeInput) {
  auto world = MpiCommunicator::world();
  const int n = world->size(), me = world->rank();
  const int64_t count = 5;
  for (const bool nonblocking : {false, true}) {
    CountingCommunicator counting(*world);
    std::vector<float> send(size_t(n * count)), recv(size_t(count), -1);
    for (int64_t i = 0; i < n * count; ++i) send[size_t(i)] = encode(me, i);
    if (nonblocking) {
      auto request = counting.ireduce_scatter_sum(send.data(), recv.data(), count);
      expect_only(counting, CommKind::IreduceScatter, n * count * 4);
      request->wait();
    } else {
      counting.reduce_scatter_sum(send.data(), recv.data(), count);
      expect_only(counting, CommKind::ReduceScatter, n * count * 4);
    }
    int64_t wrong = 0;
    for (int64_t i = 0; i < count; ++i)
      wrong += recv[size_t(i)] != float(1000 * (n * (n - 1) / 2) + n * (me * count + i));
    EXPECT_NONE_WRONG(wrong);
  }
}

TEST(CountingCommunicator, AllgatherCountsItsOwnBlock) {
  auto world = MpiCommunicator::world();
  const int n = world->size(), me = world->rank();
  CountingCommunicator counting(*world);
  std::vector<int32_t> send(3), recv(size_t(3 * n), -1);
  for (int64_t i = 0; i < 3; ++i) send[size_t(i)] = me * 1000 + int32_t(i);
  counting.allgather(send.data(), recv.data(), 3);
  expect_only(counting, CommKind::Allgather, 3 * 4);
  int64_t wrong = 0;
  for (int r = 0; r < n; ++r)
    for (int64_t i = 0; i < 3; ++i) wrong += recv[size_t(r * 3 + i)] != r * 1000 + int32_t(i);
  EXPECT_NONE_WRONG(wrong);
}

TEST(CountingCommunicator, AlltoallCountsABlockForEveryRank) {
  auto world = MpiCommunicator::world();
  const int n = world->size(), me = world->rank();
  CountingCommunicator counting(*world);
  std::vector<int64_t> send(size_t(2 * n)), recv(size_t(2 * n), -1);
  for (int r = 0; r < n; ++r)
    for (int64_t k = 0; k < 2; ++k) send[size_t(r * 2 + k)] = int64_t(alltoallv_value(me, r, k));
  counting.alltoall(send.data(), recv.data(), 2);
  expect_only(counting, CommKind::Alltoall, 2 * n * 8);
  int64_t wrong = 0;
  for (int r = 0; r < n; ++r)
    for (int64_t k = 0; k < 2; ++k) wrong += recv[size_t(r * 2 + k)] != int64_t(alltoallv_value(r, me, k));
  EXPECT_NONE_WRONG(wrong);
}

TEST(CountingCommunicator, AlltoallvCountsTheSumOfSendCountsInBothForms) {
  auto world = MpiCommunicator::world();
  const int n = world->size(), me = world->rank();
  auto count_of = [](int src, int dst) { return int64_t{(src + 2 * dst) % 3 + src}; };
  std::vector<int64_t> send_counts(static_cast<size_t>(n)), recv_counts(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) send_counts[size_t(r)] = count_of(me, r), recv_counts[size_t(r)] = count_of(r, me);
  const int64_t sent = std::accumulate(send_counts.begin(), send_counts.end(), int64_t{0});
  std::vector<float> send;
  for (int r = 0; r < n; ++r)
    for (int64_t k = 0; k < send_counts[size_t(r)]; ++k) send.push_back(alltoallv_value(me, r, k));
  for (const bool nonblocking : {false, true}) {
    CountingCommunicator counting(*world);
    std::vector<float> recv(size_t(std::accumulate(recv_counts.begin(), recv_counts.end(), int64_t{0})), -1);
    if (nonblocking) {
      auto request = counting.ialltoallv(send.data(), send_counts.data(), recv.data(), recv_counts.data());
      expect_only(counting, CommKind::Ialltoallv, sent * 4);
      request->wait();
    } else {
      counting.alltoallv(send.data(), send_counts.data(), recv.data(), recv_counts.data());
      expect_only(counting, CommKind::Alltoallv, sent * 4);
    }
    int64_t wrong = 0, at = 0;
    for (int r = 0; r < n; ++r)
      for (int64_t k = 0; k < recv_counts[size_t(r)]; ++k) wrong += recv[size_t(at++)] != alltoallv_value(r, me, k);
    EXPECT_NONE_WRONG(wrong);
  }
}

// Around a ring: to the next rank, from the previous one. Blocking: even ranks send first, odd ranks
// receive first, so no rank waits on a send nobody receives.
TEST(CountingCommunicator, BlockingSendAndRecvRing) {
  auto world = MpiCommunicator::world();
  const int n = world->size(), me = world->rank(), next = (me + 1) % n, previous = (me + n - 1) % n;
  CountingCommunicator counting(*world);
  std::vector<float> out(6), in(6, -1);
  for (int64_t k = 0; k < 6; ++k) out[size_t(k)] = alltoallv_value(me, next, k);
  if (me % 2 == 0) counting.send(out.data(), 6, next, 5);
  counting.recv(in.data(), 6, previous, 5);
  if (me % 2 == 1) counting.send(out.data(), 6, next, 5);
  EXPECT_EQ(counting.count(CommKind::Send).calls, 1);
  EXPECT_EQ(counting.count(CommKind::Send).bytes, 6 * 4);
  EXPECT_EQ(counting.count(CommKind::Recv).calls, 1);
  EXPECT_EQ(counting.count(CommKind::Recv).bytes, 6 * 4);  // received
  EXPECT_EQ(counting.calls(), 2);
  EXPECT_EQ(counting.bytes_sent(), 6 * 4) << "a receive's bytes are not sent";
  int64_t wrong = 0;
  for (int64_t k = 0; k < 6; ++k) wrong += in[size_t(k)] != alltoallv_value(previous, me, k);
  EXPECT_NONE_WRONG(wrong);
}

TEST(CountingCommunicator, NonblockingSendAndRecvRing) {
  auto world = MpiCommunicator::world();
  const int n = world->size(), me = world->rank(), next = (me + 1) % n, previous = (me + n - 1) % n;
  CountingCommunicator counting(*world);
  std::vector<double> out(4), in(4, -1);
  for (int64_t k = 0; k < 4; ++k) out[size_t(k)] = alltoallv_value(me, next, k);
  auto received = counting.irecv(in.data(), 4, previous, 6);
  auto sent = counting.isend(out.data(), 4, next, 6);
  EXPECT_EQ(counting.count(CommKind::Irecv).calls, 1);
  EXPECT_EQ(counting.count(CommKind::Irecv).bytes, 4 * 8);
  EXPECT_EQ(counting.count(CommKind::Isend).calls, 1);
  EXPECT_EQ(counting.count(CommKind::Isend).bytes, 4 * 8);
  EXPECT_EQ(counting.calls(), 2);
  EXPECT_EQ(counting.bytes_sent(), 4 * 8);
  received->wait();
  sent->wait();
  int64_t wrong = 0;
  for (int64_t k = 0; k < 4; ++k) wrong += in[size_t(k)] != alltoallv_value(previous, me, k);
  EXPECT_NONE_WRONG(wrong);
}

TEST(CountingCommunicator, SendrecvBytesCountsWhatItSends) {
  auto world = MpiCommunicator::world();
  const int n = world->size(), me = world->rank(), next = (me + 1) % n, previous = (me + n - 1) % n;
  CountingCommunicator counting(*world);
  // Every rank sends 3 + its rank bytes; it receives what its previous rank sends.
  std::vector<uint8_t> out(size_t(3 + me)), in(size_t(3 + previous), 0);
  for (size_t k = 0; k < out.size(); ++k) out[k] = uint8_t(me * 10 + int(k));
  counting.sendrecv_bytes(out.data(), int64_t(out.size()), next, in.data(), int64_t(in.size()), previous, 7);
  expect_only(counting, CommKind::Sendrecv, 3 + me);
  int64_t wrong = 0;
  for (size_t k = 0; k < in.size(); ++k) wrong += in[k] != uint8_t(previous * 10 + int(k));
  EXPECT_NONE_WRONG(wrong);
}

TEST(CountingCommunicator, BroadcastCountsOnTheRootOnly) {
  auto world = MpiCommunicator::world();
  const int n = world->size(), me = world->rank(), root = n - 1;
  CountingCommunicator counting(*world);
  std::vector<int32_t> data(9);
  for (int64_t i = 0; i < 9; ++i) data[size_t(i)] = me * 1000 + int32_t(i);
  counting.broadcast(data.data(), 9, root);
  expect_only(counting, CommKind::Broadcast, me == root ? 9 * 4 : 0);
  int64_t wrong = 0;
  for (int64_t i = 0; i < 9; ++i) wrong += data[size_t(i)] != root * 1000 + int32_t(i);
  EXPECT_NONE_WRONG(wrong);
}

TEST(CountingCommunicator, BarrierIsACallOfNoBytes) {
  auto world = MpiCommunicator::world();
  CountingCommunicator counting(*world);
  counting.barrier();
  expect_only(counting, CommKind::Barrier, 0);
}

// Counts add up over calls and kinds, and reset() starts again from zero.
TEST(CountingCommunicator, AccumulatesAndResets) {
  auto world = MpiCommunicator::world();
  const int n = world->size();
  CountingCommunicator counting(*world);
  std::vector<float> a(10, 1.0f), b(size_t(10 * n));
  counting.allreduce_sum(a.data(), 10);
  counting.allreduce_sum(a.data(), 4);
  counting.allgather(a.data(), b.data(), 10);
  EXPECT_EQ(counting.count(CommKind::Allreduce).calls, 2);
  EXPECT_EQ(counting.count(CommKind::Allreduce).bytes, 14 * 4);
  EXPECT_EQ(counting.count(CommKind::Allgather).bytes, 10 * 4);
  EXPECT_EQ(counting.calls(), 3);
  EXPECT_EQ(counting.bytes_sent(), 24 * 4);
  counting.reset();
  EXPECT_EQ(counting.calls(), 0);
  EXPECT_EQ(counting.bytes_sent(), 0);
  EXPECT_EQ(counting.count(CommKind::Allreduce).calls, 0);
}

}  // namespace
}  // namespace moe
