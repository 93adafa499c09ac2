// The communicator's nonblocking forms (isend/irecv, ialltoallv) and its typed buffers (every DType,
// bf16 included), at any number of ranks (ctest runs 2, 3 and 4), in the style of test_collectives.cpp:
// inputs encode their source, results compared with ==, wrong elements counted over MPI_COMM_WORLD.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "core/error.h"
#include "parallel/mpi_communicator.h"
#include "tests/parallel/collective_checks.h"

namespace moe {
namespace {

using namespace ::moe::comm_test;

// ---- all-to-all-v, nonblocking

TEST(Nonblocking, IalltoallvMixedZeroAndVeryUnevenCounts) {
  auto world = MpiCommunicator::world();
  const int n = world->size();
  int64_t wrong = 0;
  const std::vector<std::function<int64_t(int, int)>> patterns = {
      [](int src, int dst) { return int64_t{(src + 2 * dst) % 4}; },
      [](int, int) { return int64_t{0}; },
      [n](int src, int dst) { return int64_t{src == 0 && dst == n - 1 ? 777 : 0}; },
      [](int src, int dst) { return int64_t{src == 1 || dst == 0 ? 0 : 5 + src + dst}; },
      [](int src, int dst) { return int64_t{src == dst ? 90000 : 3000 + 7 * src + dst}; },  // past the eager limit
  };
  for (const auto& count_of : patterns) wrong += check_alltoallv(*world, count_of, Mode::Nonblocking);
  EXPECT_NONE_WRONG(wrong);
}

// Two exchanges in flight at once on the same communicator, waited in the reverse order; the counts
// they were started with are gone before either completes.
TEST(Nonblocking, TwoIalltoallvInFlightWaitedInReverse) {
  auto world = MpiCommunicator::world();
  const int n = world->size(), me = world->rank();
  auto count_a = [](int src, int dst) { return int64_t{src == dst ? 0 : 20000 + src}; };
  auto count_b = [](int src, int dst) { return int64_t{(src * 3 + dst) % 4}; };
  auto start = [&](const std::function<int64_t(int, int)>& count_of, std::vector<float>& send,
                   std::vector<float>& recv) {
    std::vector<int64_t> send_counts(n), recv_counts(n);
    for (int r = 0; r < n; ++r) send_counts[r] = count_of(me, r), recv_counts[r] = count_of(r, me);
    for (int dst = 0; dst < n; ++dst)
      for (int64_t k = 0; k < send_counts[dst]; ++k) send.push_back(alltoallv_value(me, dst, k));
    recv.assign(std::accumulate(recv_counts.begin(), recv_counts.end(), int64_t{0}), -1.0f);
    return world->ialltoallv(send.data(), send_counts.data(), recv.data(), recv_counts.data());
  };
  auto count_wrong = [&](const std::function<int64_t(int, int)>& count_of, const std::vector<float>& recv) {
    int64_t wrong = 0, offset = 0;
    for (int src = 0; src < n; ++src)
      for (int64_t k = 0; k < count_of(src, me); ++k) wrong += recv[offset++] != alltoallv_value(src, me, k);
    return wrong + (offset != int64_t(recv.size()));
  };
  std::vector<float> send_a, recv_a, send_b, recv_b;
  auto request_a = start(count_a, send_a, recv_a);
  auto request_b = start(count_b, send_b, recv_b);
  request_b->wait();
  request_a->wait();
  EXPECT_NONE_WRONG(count_wrong(count_a, recv_a) + count_wrong(count_b, recv_b));
}

TEST(Adjoint, IalltoallvAndIalltoallvWithCountsSwapped) {
  auto world = MpiCommunicator::world();
  const int n = world->size(), me = world->rank();
  auto count_of = [](int src, int dst) { return int64_t{src == 0 ? 0 : (5 * src + 3 * dst) % 7}; };
  std::vector<int64_t> send_counts(n), recv_counts(n);
  for (int r = 0; r < n; ++r) send_counts[r] = count_of(me, r), recv_counts[r] = count_of(r, me);
  const int64_t send_total = std::accumulate(send_counts.begin(), send_counts.end(), int64_t{0});
  const int64_t recv_total = std::accumulate(recv_counts.begin(), recv_counts.end(), int64_t{0});
  const std::vector<float> x = small_integers(send_total, me, 9), y = small_integers(recv_total, me, 10);
  std::vector<float> forward(recv_total), backward(send_total);
  auto forward_request = world->ialltoallv(x.data(), send_counts.data(), forward.data(), recv_counts.data());
  auto backward_request = world->ialltoallv(y.data(), recv_counts.data(), backward.data(), send_counts.data());
  forward_request->wait();
  backward_request->wait();
  EXPECT_EQ(sum_over_world(dot(forward, y)), sum_over_world(dot(x, backward)));
}

// ---- point to point, nonblocking

// Every ordered pair (self included) exchanges count_of(src, dst) elements at once: receives posted
// first, then sends, then every request waited on. Zero counts and one large message included.
int64_t check_all_pairs(MpiCommunicator& comm, const std::function<int64_t(int, int)>& count_of) {
  const int n = comm.size(), me = comm.rank();
  std::vector<std::vector<float>> in(n), out(n);
  std::vector<std::unique_ptr<Request>> requests;
  for (int src = 0; src < n; ++src) {
    in[src].assign(count_of(src, me), -1.0f);
    requests.push_back(comm.irecv(in[src].data(), int64_t(in[src].size()), src, 21));
  }
  for (int dst = 0; dst < n; ++dst) {
    for (int64_t k = 0; k < count_of(me, dst); ++k) out[dst].push_back(alltoallv_value(me, dst, k));
    requests.push_back(comm.isend(out[dst].data(), int64_t(out[dst].size()), dst, 21));
  }
  for (auto& request : requests) request->wait();
  int64_t wrong = 0;
  for (int src = 0; src < n; ++src)
    for (int64_t k = 0; k < int64_t(in[src].size()); ++k) wrong += in[src][k] != alltoallv_value(src, me, k);
  return wrong;
}

TEST(PointToPoint, IsendIrecvEveryPairUnevenAndZero) {
  auto world = MpiCommunicator::world();
  const int n = world->size();
  int64_t wrong = 0;
  wrong += check_all_pairs(*world, [](int src, int dst) { return int64_t{(2 * src + dst) % 3}; });
  wrong += check_all_pairs(*world, [n](int src, int dst) { return int64_t{src == n - 1 && dst == 0 ? 60000 : 0}; });
  wrong += check_all_pairs(*world, [](int src, int dst) { return int64_t{src == dst ? 0 : 1 + 1000 * src + dst}; });
  EXPECT_NONE_WRONG(wrong);
}

// A ring in both directions (tags tell them apart where prev == next), polled with test() to completion.
TEST(PointToPoint, IsendIrecvRingBothDirectionsPolled) {
  auto world = MpiCommunicator::world();
  const int n = world->size(), me = world->rank();
  const int next = (me + 1) % n, prev = (me + n - 1) % n;
  const int64_t count = 50000;  // rendezvous protocol
  std::vector<float> to_next(count), to_prev(count), from_prev(count, -1.0f), from_next(count, -1.0f);
  for (int64_t i = 0; i < count; ++i) to_next[i] = encode(me, i % 1000), to_prev[i] = -encode(me, i % 1000);
  std::vector<std::unique_ptr<Request>> requests;
  requests.push_back(world->irecv(from_prev.data(), count, prev, 1));
  requests.push_back(world->irecv(from_next.data(), count, next, 2));
  requests.push_back(world->isend(to_next.data(), count, next, 1));
  requests.push_back(world->isend(to_prev.data(), count, prev, 2));
  for (bool all_done = false; !all_done;) {
    all_done = true;
    for (auto& request : requests) all_done = request->test() && all_done;
  }
  int64_t wrong = 0;
  for (int64_t i = 0; i < count; ++i)
    wrong += (from_prev[i] != encode(prev, i % 1000)) + (from_next[i] != -encode(next, i % 1000));
  EXPECT_NONE_WRONG(wrong);
}

TEST(PointToPoint, IrecvOfShorterMessageThrowsAtWait) {
  auto world = MpiCommunicator::world();
  const int me = world->rank();
  std::vector<float> data(5, 1.0f);
  if (me == 0) world->isend(data.data(), 3, 1, 12)->wait();
  if (me == 1) {
    auto request = world->irecv(data.data(), 5, 0, 12);
    try {
      request->wait();
      ADD_FAILURE() << "irecv of 3 elements where 5 were expected did not throw";
    } catch (const Error& e) {
      for (const char* part : {"irecv(f32)", "'world'", "expected 5 elements, the peer sent 3"})
        EXPECT_NE(e.message().find(part), std::string::npos) << "missing '" << part << "' in: " << e.message();
    }
  }
  world->barrier();
}

// ---- every DType through the typed-buffer interface

// A value exact in every DType: bf16 holds integers up to 256 exactly, so its values stay below it and
// still encode the source, the destination and (modulo 16) the index.
int64_t value_of(DType dtype, int src, int dst, int64_t k) {
  if (dtype == DType::BF16) return src * 64 + dst * 16 + k % 16;
  if (dtype == DType::I64) return (int64_t{src} << 40) + (int64_t{dst} << 20) + k;  // beyond 32 bits
  return src * 1000000 + dst * 100000 + k;
}

void store(DType dtype, void* buffer, int64_t i, int64_t value) {
  switch (dtype) {
    case DType::F32:
      static_cast<float*>(buffer)[i] = static_cast<float>(value);
      return;
    case DType::BF16: {
      const float f = static_cast<float>(value);  // an integer below 257: its upper 16 bits are exact
      uint32_t bits;
      std::memcpy(&bits, &f, 4);
      static_cast<uint16_t*>(buffer)[i] = static_cast<uint16_t>(bits >> 16);
      return;
    }
    case DType::F64:
      static_cast<double*>(buffer)[i] = static_cast<double>(value);
      return;
    case DType::I32:
      static_cast<int32_t*>(buffer)[i] = static_cast<int32_t>(value);
      return;
    case DType::I64:
      static_cast<int64_t*>(buffer)[i] = value;
      return;
    case DType::U8:
      static_cast<uint8_t*>(buffer)[i] = static_cast<uint8_t>(value);
      return;
  }
}

int64_t load(DType dtype, const void* buffer, int64_t i) {
  switch (dtype) {
    case DType::F32:
      return static_cast<int64_t>(static_cast<const float*>(buffer)[i]);
    case DType::BF16: {
      const uint32_t bits = uint32_t{static_cast<const uint16_t*>(buffer)[i]} << 16;
      float f;
      std::memcpy(&f, &bits, 4);
      return static_cast<int64_t>(f);
    }
    case DType::F64:
      return static_cast<int64_t>(static_cast<const double*>(buffer)[i]);
    case DType::I32:
      return static_cast<const int32_t*>(buffer)[i];
    case DType::I64:
      return static_cast<const int64_t*>(buffer)[i];
    case DType::U8:
      return static_cast<const uint8_t*>(buffer)[i];
  }
  return -1;
}

class Typed : public ::testing::TestWithParam<DType> {
 protected:
  std::vector<char> buffer(int64_t count) const { return std::vector<char>(count * dtype_size(GetParam()) + 1, 0); }
};

TEST_P(Typed, AllreduceAndIallreduceSum) {
  const DType dtype = GetParam();
  auto world = MpiCommunicator::world();
  const int n = world->size(), me = world->rank();
  const int64_t count = 23;
  auto blocking = buffer(count), nonblocking = buffer(count);
  for (int64_t i = 0; i < count; ++i) {
    store(dtype, blocking.data(), i, me * 8 + i % 8);  // sums stay below 256: exact in bf16
    store(dtype, nonblocking.data(), i, me * 8 + i % 8);
  }
  world->allreduce_sum(blocking.data(), count, dtype);
  world->iallreduce_sum(nonblocking.data(), count, dtype)->wait();
  int64_t wrong = 0;
  for (int64_t i = 0; i < count; ++i) {
    const int64_t expected = 8 * (n * (n - 1) / 2) + n * (i % 8);
    wrong += (load(dtype, blocking.data(), i) != expected) + (load(dtype, nonblocking.data(), i) != expected);
  }
  EXPECT_NONE_WRONG(wrong);
}

TEST_P(Typed, AllgatherAlltoallvBroadcastAndPointToPoint) {
  const DType dtype = GetParam();
  auto world = MpiCommunicator::world();
  const int n = world->size(), me = world->rank();
  const int next = (me + 1) % n, prev = (me + n - 1) % n;
  auto count_of = [](int src, int dst) { return int64_t{(src + 3 * dst) % 5}; };
  std::vector<int64_t> send_counts(n), recv_counts(n);
  for (int r = 0; r < n; ++r) send_counts[r] = count_of(me, r), recv_counts[r] = count_of(r, me);
  const int64_t send_total = std::accumulate(send_counts.begin(), send_counts.end(), int64_t{0});
  const int64_t recv_total = std::accumulate(recv_counts.begin(), recv_counts.end(), int64_t{0});
  auto send = buffer(send_total), recv = buffer(recv_total);
  for (int dst = 0, i = 0; dst < n; ++dst)
    for (int64_t k = 0; k < send_counts[dst]; ++k) store(dtype, send.data(), i++, value_of(dtype, me, dst, k));
  world->alltoallv(send.data(), send_counts.data(), recv.data(), recv_counts.data(), dtype);
  int64_t wrong = 0;
  for (int src = 0, i = 0; src < n; ++src)
    for (int64_t k = 0; k < recv_counts[src]; ++k)
      wrong += load(dtype, recv.data(), i++) != value_of(dtype, src, me, k);

  const int64_t count = 7;
  auto mine = buffer(count), gathered = buffer(n * count), from_prev = buffer(count), broadcast = buffer(count);
  for (int64_t k = 0; k < count; ++k) store(dtype, mine.data(), k, value_of(dtype, me, 0, k));
  world->allgather(mine.data(), gathered.data(), count, dtype);
  auto receive = world->irecv(from_prev.data(), count, dtype, prev, 5);
  auto sent = world->isend(mine.data(), count, dtype, next, 5);
  if (me == n - 1) broadcast = mine;
  world->broadcast(broadcast.data(), count, dtype, n - 1);
  receive->wait();
  sent->wait();
  for (int64_t k = 0; k < count; ++k) {
    for (int r = 0; r < n; ++r) wrong += load(dtype, gathered.data(), r * count + k) != value_of(dtype, r, 0, k);
    wrong += load(dtype, from_prev.data(), k) != value_of(dtype, prev, 0, k);
    wrong += load(dtype, broadcast.data(), k) != value_of(dtype, n - 1, 0, k);
  }
  EXPECT_NONE_WRONG(wrong);
}

INSTANTIATE_TEST_SUITE_P(EveryDType, Typed,
                         ::testing::Values(DType::F32, DType::BF16, DType::F64, DType::I32, DType::I64),
                         [](const ::testing::TestParamInfo<DType>& info) { return dtype_name(info.param); });

// bf16 sums accumulate in fp32 and round to nearest even: 256 + 1 is a tie between 256 and 258 and
// rounds to 256 (even); 256 + 3 = 259 rounds up to 260. Two ranks, so the order cannot matter.
TEST(Bf16, SumRoundsToNearestEven) {
  auto world = MpiCommunicator::world();
  const int me = world->rank();
  auto pair = world->split(me < 2 ? 0 : -1, me, "first_two");
  int64_t wrong = 0;
  if (pair) {
    std::vector<char> data(2 * sizeof(uint16_t));
    store(DType::BF16, data.data(), 0, me == 0 ? 256 : 1);
    store(DType::BF16, data.data(), 1, me == 0 ? 256 : 3);
    pair->allreduce_sum(data.data(), 2, DType::BF16);
    wrong += (load(DType::BF16, data.data(), 0) != 256) + (load(DType::BF16, data.data(), 1) != 260);
  }
  EXPECT_NONE_WRONG(wrong);
}

}  // namespace
}  // namespace moe
