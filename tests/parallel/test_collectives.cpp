// The MPI communicator's collectives at any number of ranks (ctest runs 2, 3 and 4). Inputs encode where
// they came from (value = source rank * 1000 + index, exact in float), results are compared with ==, and
// the count of wrong elements is all-reduced over raw MPI_COMM_WORLD, so every rank reaches the same
// verdict and a collective is never checked only by itself. Also: the adjoint property of each
// forward/backward pair, exactly, and the errors' messages. No test returns early before a collective
// another rank is still making: a failure is an EXPECT, never a hang.
#include <gtest/gtest.h>
#include <mpi.h>
#include <unistd.h>

#include <chrono>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "parallel/mpi_communicator.h"
#include "tests/parallel/collective_checks.h"

namespace moe {
namespace {

using namespace ::moe::comm_test;

std::string this_host() {
  char name[256] = {};
  gethostname(name, sizeof(name) - 1);
  return name;
}

TEST(Mpi, LaunchedByMpirunAndWorld) {
  EXPECT_TRUE(MpiCommunicator::launched_by_mpirun());
  auto world = MpiCommunicator::world();
  int rank = 0, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  EXPECT_EQ(world->rank(), rank);
  EXPECT_EQ(world->size(), size);
  EXPECT_EQ(world->name(), "world");
  EXPECT_EQ(world->handle(), MPI_COMM_WORLD);
  MpiCommunicator::initialize(nullptr, nullptr);  // idempotent
}

TEST(Collectives, AllreduceFloatDoubleInt64) {
  auto world = MpiCommunicator::world();
  const int n = world->size(), me = world->rank();
  const int64_t count = 37;
  std::vector<float> f(count);
  std::vector<double> d(count);
  std::vector<int64_t> l(count);
  for (int64_t i = 0; i < count; ++i) {
    f[i] = encode(me, i);
    d[i] = me * 1000.0 + i + 0.5;
    l[i] = (int64_t{me} << 40) + i;  // beyond 32 bits: the int64 path must not truncate
  }
  world->allreduce_sum(f.data(), count);
  world->allreduce_sum(d.data(), count);
  world->allreduce_sum(l.data(), count);
  int64_t wrong = 0;
  const int64_t rank_sum = int64_t{n} * (n - 1) / 2;
  for (int64_t i = 0; i < count; ++i) {
    wrong += f[i] != static_cast<float>(1000 * rank_sum + n * i);
    wrong += d[i] != 1000.0 * rank_sum + n * (i + 0.5);
    wrong += l[i] != (rank_sum << 40) + n * i;
  }
  world->allreduce_sum(f.data(), 0);  // empty: a no-op, never an error
  EXPECT_NONE_WRONG(wrong);
}

TEST(Collectives, IallreduceTestWaitAndDestroy) {
  auto world = MpiCommunicator::world();
  const int n = world->size(), me = world->rank();
  const int64_t count = 20000;  // past the eager limit of shared memory
  auto expected = [&](int64_t i) { return static_cast<float>(1000 * (n * (n - 1) / 2) + n * (i % 1000)); };
  auto fill = [&](std::vector<float>& v) {
    for (int64_t i = 0; i < count; ++i) v[i] = encode(me, i % 1000);
  };
  auto count_wrong = [&](const std::vector<float>& v) {
    int64_t wrong = 0;
    for (int64_t i = 0; i < count; ++i) wrong += v[i] != expected(i);
    return wrong;
  };
  std::vector<float> a(count), b(count), c(count);
  fill(a);
  fill(b);
  fill(c);
  // test() until done, then wait() on a finished request is a no-op.
  auto request_a = world->iallreduce_sum(a.data(), count);
  int64_t polls = 0;
  while (!request_a->test()) ++polls;
  EXPECT_TRUE(request_a->test());
  request_a->wait();
  // Two in flight at once, waited in the reverse order.
  auto request_b = world->iallreduce_sum(b.data(), count);
  {
    auto request_c = world->iallreduce_sum(c.data(), count);
    // Dropped without wait(): its destructor waits, so c is complete after this scope.
  }
  request_b->wait();
  EXPECT_NONE_WRONG(count_wrong(a) + count_wrong(b) + count_wrong(c));
  EXPECT_GE(polls, 0);
}

TEST(Collectives, ReduceScatterBlockingAndNonblocking) {
  auto world = MpiCommunicator::world();
  const int n = world->size(), me = world->rank();
  const int64_t count = 41;
  std::vector<float> send(n * count);
  for (int64_t j = 0; j < n * count; ++j) send[j] = encode(me, j);
  std::vector<float> recv_blocking(count, -1.0f), recv_nonblocking(count + 1, -1.0f);
  world->reduce_scatter_sum(send.data(), recv_blocking.data(), count);
  auto request = world->ireduce_scatter_sum(send.data(), recv_nonblocking.data(), count);
  while (!request->test()) {
  }
  request->wait();
  int64_t wrong = 0;
  for (int64_t i = 0; i < count; ++i) {
    // sum over ranks r of r * 1000 + (me * count + i)
    const float expected = static_cast<float>(1000 * (n * (n - 1) / 2) + n * (me * count + i));
    wrong += recv_blocking[i] != expected;
    wrong += recv_nonblocking[i] != expected;
  }
  wrong += recv_nonblocking[count] != -1.0f;  // nothing written past the end
  EXPECT_NONE_WRONG(wrong);
}

TEST(Collectives, AllgatherFloatAndInt64) {
  auto world = MpiCommunicator::world();
  const int n = world->size(), me = world->rank();
  const int64_t count = 29;
  std::vector<float> send_f(count);
  std::vector<int64_t> send_l(count);
  for (int64_t i = 0; i < count; ++i) {
    send_f[i] = encode(me, i);
    send_l[i] = (int64_t{me} << 36) + i;
  }
  std::vector<float> recv_f(n * count, -1.0f);
  std::vector<int64_t> recv_l(n * count, -1);
  world->allgather(send_f.data(), recv_f.data(), count);
  world->allgather(send_l.data(), recv_l.data(), count);
  int64_t wrong = 0;
  for (int r = 0; r < n; ++r)
    for (int64_t i = 0; i < count; ++i) {
      wrong += recv_f[r * count + i] != encode(r, i);
      wrong += recv_l[r * count + i] != (int64_t{r} << 36) + i;
    }
  EXPECT_NONE_WRONG(wrong);
}

TEST(Collectives, AlltoallOfCounts) {
  auto world = MpiCommunicator::world();
  const int n = world->size(), me = world->rank();
  const int64_t count = 3;
  std::vector<int64_t> send(n * count), recv(n * count, -1);
  for (int64_t j = 0; j < n * count; ++j) send[j] = me * 1000 + j;
  world->alltoall(send.data(), recv.data(), count);
  int64_t wrong = 0;
  for (int r = 0; r < n; ++r)
    for (int64_t k = 0; k < count; ++k) wrong += recv[r * count + k] != r * 1000 + me * count + k;
  EXPECT_NONE_WRONG(wrong);
}

TEST(Collectives, AlltoallvMixedAndZeroCounts) {
  auto world = MpiCommunicator::world();
  int64_t wrong = 0;
  wrong += check_alltoallv(*world, [](int src, int dst) { return int64_t{(src + 2 * dst) % 4}; });
  wrong += check_alltoallv(*world, [](int, int) { return int64_t{0}; });
  EXPECT_NONE_WRONG(wrong);
}

TEST(Collectives, AlltoallvVeryUneven) {
  auto world = MpiCommunicator::world();
  const int n = world->size();
  int64_t wrong = 0;
  // Rank 0 sends everything to the last rank: the others send nothing, all but the last receive nothing.
  wrong += check_alltoallv(*world, [n](int src, int dst) { return int64_t{src == 0 && dst == n - 1 ? 777 : 0}; });
  // Rank 1 sends nothing and rank 0 receives nothing; the rest exchange, self included.
  wrong += check_alltoallv(*world, [](int src, int dst) { return int64_t{src == 1 || dst == 0 ? 0 : 5 + src + dst}; });
  // Large segments (past the eager limit), one of them far larger than the rest.
  wrong += check_alltoallv(*world, [](int src, int dst) { return int64_t{src == dst ? 90000 : 3000 + 7 * src + dst}; });
  EXPECT_NONE_WRONG(wrong);
}

TEST(Collectives, SendRecvRing) {
  auto world = MpiCommunicator::world();
  const int n = world->size(), me = world->rank();
  const int next = (me + 1) % n, prev = (me + n - 1) % n;
  const int64_t count = 50000;  // rendezvous protocol: a blocking send waits for its receive
  std::vector<float> out(count), in(count, -1.0f);
  for (int64_t i = 0; i < count; ++i) out[i] = static_cast<float>(me * 100000 + i);
  // Odd ranks receive first, so the blocking ring cannot deadlock at any size.
  if (me % 2 == 1) {
    world->recv(in.data(), count, prev, 7);
    world->send(out.data(), count, next, 7);
  } else {
    world->send(out.data(), count, next, 7);
    world->recv(in.data(), count, prev, 7);
  }
  int64_t wrong = 0;
  for (int64_t i = 0; i < count; ++i) wrong += in[i] != static_cast<float>(prev * 100000 + i);
  EXPECT_NONE_WRONG(wrong);
}

TEST(Collectives, RecvOfShorterMessageThrows) {
  auto world = MpiCommunicator::world();
  const int me = world->rank();
  std::vector<float> data(5, 1.0f);
  if (me == 0) world->send(data.data(), 3, 1, 11);
  if (me == 1) {
    try {
      world->recv(data.data(), 5, 0, 11);
      ADD_FAILURE() << "recv of 3 elements where 5 were expected did not throw";
    } catch (const Error& e) {
      EXPECT_NE(e.message().find("expected 5 elements, the peer sent 3"), std::string::npos) << e.message();
    }
  }
  world->barrier();
}

TEST(Collectives, BroadcastFromEveryRoot) {
  auto world = MpiCommunicator::world();
  const int n = world->size(), me = world->rank();
  const int64_t count = 23;
  int64_t wrong = 0;
  for (int root = 0; root < n; ++root) {
    std::vector<float> f(count, -1.0f);
    std::vector<int64_t> l(count, -1);
    if (me == root)
      for (int64_t i = 0; i < count; ++i) {
        f[i] = encode(root, i);
        l[i] = (int64_t{root} << 40) + i;
      }
    world->broadcast(f.data(), count, root);
    world->broadcast(l.data(), count, root);
    for (int64_t i = 0; i < count; ++i) {
      wrong += f[i] != encode(root, i);
      wrong += l[i] != (int64_t{root} << 40) + i;
    }
  }
  EXPECT_NONE_WRONG(wrong);
}

// Every rank writes a file, the last rank late; after the barrier every rank must see every file. A
// barrier that did not wait would let the early ranks look before the late one wrote.
TEST(Collectives, BarrierOrdersSideEffects) {
  auto world = MpiCommunicator::world();
  const int n = world->size(), me = world->rank();
  char host[MPI_MAX_PROCESSOR_NAME] = {};
  int host_length = 0;
  MPI_Get_processor_name(host, &host_length);
  std::vector<char> hosts(static_cast<size_t>(n) * MPI_MAX_PROCESSOR_NAME);
  MPI_Allgather(host, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, hosts.data(), MPI_MAX_PROCESSOR_NAME, MPI_CHAR, MPI_COMM_WORLD);
  bool one_host = true;
  for (int r = 0; r < n; ++r) one_host = one_host && std::string(&hosts[r * MPI_MAX_PROCESSOR_NAME]) == host;
  if (!one_host) GTEST_SKIP() << "ranks on several hosts share no directory";  // the same on every rank

  char dir[256] = {};
  if (me == 0) {
    std::snprintf(dir, sizeof(dir), "%s/moe_barrier_XXXXXX", std::filesystem::temp_directory_path().c_str());
    if (mkdtemp(dir) == nullptr) dir[0] = '\0';
  }
  MPI_Bcast(dir, sizeof(dir), MPI_CHAR, 0, MPI_COMM_WORLD);
  EXPECT_NE(dir[0], '\0') << "could not create a temporary directory";
  int64_t missing = 0;
  for (int round = 0; round < 3 && dir[0] != '\0'; ++round) {
    if (me == n - 1) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    std::ofstream(std::string(dir) + "/" + std::to_string(round) + "_" + std::to_string(me)) << me;
    world->barrier();
    for (int r = 0; r < n; ++r)
      missing += !std::filesystem::exists(std::string(dir) + "/" + std::to_string(round) + "_" + std::to_string(r));
  }
  world->barrier();  // everyone has looked before rank 0 removes the files
  if (me == 0 && dir[0] != '\0') std::filesystem::remove_all(dir);
  EXPECT_NONE_WRONG(missing);
}

TEST(Collectives, SplitEvenOddRunsConcurrently) {
  auto world = MpiCommunicator::world();
  const int n = world->size(), me = world->rank();
  auto parity = world->split(me % 2, me, "parity");
  EXPECT_EQ(parity->name(), "parity");
  const int group_size = (n - me % 2 + 1) / 2;  // ranks of my parity
  EXPECT_EQ(parity->size(), group_size);
  EXPECT_EQ(parity->rank(), me / 2);
  int64_t wrong = 0;

  // The same collectives on both groups at once, a nonblocking one on world in flight meanwhile.
  const int64_t count = 17;
  std::vector<float> over_world(count);
  for (int64_t i = 0; i < count; ++i) over_world[i] = encode(me, i);
  auto world_request = world->iallreduce_sum(over_world.data(), count);

  std::vector<float> f(count);
  for (int64_t i = 0; i < count; ++i) f[i] = encode(me, i);
  parity->allreduce_sum(f.data(), count);
  int64_t group_rank_sum = 0;  // world ranks of my parity
  for (int r = me % 2; r < n; r += 2) group_rank_sum += r;
  for (int64_t i = 0; i < count; ++i) wrong += f[i] != static_cast<float>(1000 * group_rank_sum + group_size * i);

  std::vector<int64_t> gathered(group_size, -1);
  const int64_t my_world_rank = me;
  parity->allgather(&my_world_rank, gathered.data(), 1);
  for (int g = 0; g < group_size; ++g) wrong += gathered[g] != 2 * g + me % 2;

  wrong += check_alltoallv(*parity, [](int src, int dst) { return int64_t{1 + src + 2 * dst}; });
  parity->barrier();

  world_request->wait();
  for (int64_t i = 0; i < count; ++i) wrong += over_world[i] != static_cast<float>(1000 * (n * (n - 1) / 2) + n * i);
  EXPECT_NONE_WRONG(wrong);
}

TEST(Collectives, SplitKeysOrderAndNegativeColorLeavesOut) {
  auto world = MpiCommunicator::world();
  const int n = world->size(), me = world->rank();
  auto reversed = world->split(0, -me, "reversed");
  EXPECT_EQ(reversed->rank(), n - 1 - me);
  auto without_zero = world->split(me == 0 ? -1 : 0, me, "without_zero");
  int64_t wrong = 0;
  if (me == 0) {
    EXPECT_EQ(without_zero, nullptr);
  } else if (without_zero == nullptr) {
    ADD_FAILURE() << "rank " << me << " got no communicator";
  } else {
    EXPECT_EQ(without_zero->size(), n - 1);
    EXPECT_EQ(without_zero->rank(), me - 1);
    std::vector<float> x = {encode(me, 0)};
    without_zero->allreduce_sum(x.data(), 1);
    wrong += x[0] != static_cast<float>(1000 * (n * (n - 1) / 2));
  }
  EXPECT_NONE_WRONG(wrong);
}

// ---- Adjoint pairs: <forward(x), y> = <x, backward(y)>, summed over ranks, exactly.

TEST(Adjoint, AllgatherAndReduceScatter) {
  auto world = MpiCommunicator::world();
  const int n = world->size(), me = world->rank();
  const int64_t count = 11;
  const std::vector<float> x = small_integers(count, me, 1);
  const std::vector<float> y = small_integers(n * count, me, 2);
  std::vector<float> gathered(n * count), scattered(count), scattered_nonblocking(count);
  world->allgather(x.data(), gathered.data(), count);
  world->reduce_scatter_sum(y.data(), scattered.data(), count);
  world->ireduce_scatter_sum(y.data(), scattered_nonblocking.data(), count)->wait();
  const int64_t forward = sum_over_world(dot(gathered, y));
  EXPECT_EQ(forward, sum_over_world(dot(x, scattered)));
  EXPECT_EQ(forward, sum_over_world(dot(x, scattered_nonblocking)));
}

TEST(Adjoint, AlltoallvAndAlltoallvWithCountsSwapped) {
  auto world = MpiCommunicator::world();
  const int n = world->size(), me = world->rank();
  auto count_of = [](int src, int dst) { return int64_t{(3 * src + dst) % 5}; };  // zeros included
  std::vector<int64_t> send_counts(n), recv_counts(n);
  for (int r = 0; r < n; ++r) {
    send_counts[r] = count_of(me, r);
    recv_counts[r] = count_of(r, me);
  }
  const int64_t send_total = std::accumulate(send_counts.begin(), send_counts.end(), int64_t{0});
  const int64_t recv_total = std::accumulate(recv_counts.begin(), recv_counts.end(), int64_t{0});
  const std::vector<float> x = small_integers(send_total, me, 3);
  const std::vector<float> y = small_integers(recv_total, me, 4);
  std::vector<float> forward(recv_total), backward(send_total);
  world->alltoallv(x.data(), send_counts.data(), forward.data(), recv_counts.data());
  world->alltoallv(y.data(), recv_counts.data(), backward.data(), send_counts.data());
  EXPECT_EQ(sum_over_world(dot(forward, y)), sum_over_world(dot(x, backward)));
}

// Broadcast from the root copies x_root everywhere; its adjoint sums every rank's y onto the root.
TEST(Adjoint, BroadcastAndSumToRoot) {
  auto world = MpiCommunicator::world();
  const int n = world->size(), me = world->rank();
  const int64_t count = 13;
  for (int root = 0; root < n; ++root) {
    const std::vector<float> x = small_integers(count, me, 5);  // only the root's counts
    const std::vector<float> y = small_integers(count, me, 6);
    std::vector<float> copied = x, summed = y;
    world->broadcast(copied.data(), count, root);
    world->allreduce_sum(summed.data(), count);
    const int64_t backward = me == root ? dot(x, summed) : 0;
    EXPECT_EQ(sum_over_world(dot(copied, y)), sum_over_world(backward)) << "root " << root;
  }
}

// All-reduce is its own adjoint: <allreduce(x), y> = <x, allreduce(y)>.
TEST(Adjoint, AllreduceIsSelfAdjoint) {
  auto world = MpiCommunicator::world();
  const int me = world->rank();
  const int64_t count = 19;
  const std::vector<float> x = small_integers(count, me, 7), y = small_integers(count, me, 8);
  std::vector<float> reduced_x = x, reduced_y = y;
  world->allreduce_sum(reduced_x.data(), count);
  world->iallreduce_sum(reduced_y.data(), count)->wait();
  EXPECT_EQ(sum_over_world(dot(reduced_x, y)), sum_over_world(dot(x, reduced_y)));
}

// ---- Errors name the operation, the communicator, the rank and the host.

TEST(Errors, AlltoallvCountBeyondIntThrowsBeforeAnyCommunication) {
  auto world = MpiCommunicator::world();
  const int n = world->size();
  std::vector<int64_t> send_counts(n, 0), recv_counts(n, 0);
  send_counts[n - 1] = int64_t{3000000000};
  float dummy = 0.0f;
  try {
    world->alltoallv(&dummy, send_counts.data(), &dummy, recv_counts.data());
    ADD_FAILURE() << "alltoallv with a count beyond INT_MAX did not throw";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Internal);
    for (const char* part : {"alltoallv", "'world'", "3000000000", "peer"})
      EXPECT_NE(e.message().find(part), std::string::npos) << "missing '" << part << "' in: " << e.message();
  }
  try {
    world->allreduce_sum(&dummy, -1);
    ADD_FAILURE() << "allreduce_sum of -1 elements did not throw";
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("allreduce_sum"), std::string::npos) << e.message();
  }
}

TEST(Errors, CheckMpiNamesOperationCommunicatorRankHostAndMpiError) {
  auto world = MpiCommunicator::world();
  const int n = world->size(), me = world->rank();
  float value = 1.0f;
  // A peer beyond the communicator: MPI rejects it locally on every rank, so no rank waits for another.
  try {
    world->send(&value, 1, n, 0);
    ADD_FAILURE() << "send to rank " << n << " of " << n << " did not throw";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Internal);
    const std::string rank_text = "rank " + std::to_string(me) + " of " + std::to_string(n);
    for (const std::string& part : {std::string("MPI send"), std::string("'world'"), rank_text, "host " + this_host(),
                                    std::string("MPI_ERR_RANK")})
      EXPECT_NE(e.message().find(part), std::string::npos) << "missing '" << part << "' in: " << e.message();
  }
  auto parity = world->split(me % 2, me, "parity");
  try {
    parity->broadcast(&value, 1, parity->size());
    ADD_FAILURE() << "broadcast from root " << parity->size() << " did not throw";
  } catch (const Error& e) {
    for (const char* part : {"broadcast(f32)", "'parity'", "MPI_ERR_ROOT"})
      EXPECT_NE(e.message().find(part), std::string::npos) << "missing '" << part << "' in: " << e.message();
  }
  world->barrier();  // the communicators still work after a returned error
}

}  // namespace
}  // namespace moe
