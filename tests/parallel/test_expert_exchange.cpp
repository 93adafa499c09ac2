// The MoE dispatcher's exchange over a communicator (CommunicatorExchange) and the dispatcher's start and
// finish forms, at any number of ranks (ctest runs 2, 3 and 4): rows that encode their source and expert
// land where the blocking form puts them, and combine is dispatch's adjoint, exactly; the exchange counts the
// seconds it holds its caller up.
#include <gtest/gtest.h>
#include <mpi.h>

#include <chrono>
#include <cstdint>
#include <numeric>
#include <thread>
#include <vector>

#include "core/backend/backend.h"
#include "core/moe/dispatcher.h"
#include "parallel/mpi_communicator.h"
#include "parallel/process_groups.h"
#include "tests/parallel/collective_checks.h"

namespace moe {
namespace {

using namespace ::moe::comm_test;

TEST(ExpertExchange, StartFinishTwoInFlightMatchTheBlockingForm) {
  auto world = MpiCommunicator::world();
  CommunicatorExchange exchange(*world);
  const int n = exchange.size(), me = exchange.rank();
  auto count_a = [](int src, int dst) { return int64_t{src == dst ? 0 : 3 + src * 2 + dst}; };
  auto count_b = [n](int src, int dst) { return int64_t{dst == n - 1 ? 40000 : (src + dst) % 2}; };
  struct Exchange {
    std::vector<int64_t> send_counts, recv_counts;
    std::vector<float> send, recv;
  };
  auto prepare = [&](auto count_of) {
    Exchange e;
    for (int r = 0; r < n; ++r) e.send_counts.push_back(count_of(me, r)), e.recv_counts.push_back(count_of(r, me));
    for (int dst = 0; dst < n; ++dst)
      for (int64_t k = 0; k < e.send_counts[dst]; ++k) e.send.push_back(alltoallv_value(me, dst, k));
    e.recv.assign(std::accumulate(e.recv_counts.begin(), e.recv_counts.end(), int64_t{0}), -1.0f);
    return e;
  };
  auto count_wrong = [&](const Exchange& e) {
    int64_t wrong = 0, offset = 0;
    for (int src = 0; src < n; ++src)
      for (int64_t k = 0; k < e.recv_counts[src]; ++k) wrong += e.recv[offset++] != alltoallv_value(src, me, k);
    return wrong;
  };
  Exchange a = prepare(count_a), b = prepare(count_b), blocking = prepare(count_b);
  auto handle_a = exchange.start(a.send.data(), a.send_counts.data(), a.recv.data(), a.recv_counts.data());
  auto handle_b = exchange.start(b.send.data(), b.send_counts.data(), b.recv.data(), b.recv_counts.data());
  exchange.finish(std::move(handle_b));
  exchange.finish(std::move(handle_a));
  exchange.exchange(blocking.send.data(), blocking.send_counts.data(), blocking.recv.data(),
                    blocking.recv_counts.data());
  EXPECT_NONE_WRONG(count_wrong(a) + count_wrong(b) + count_wrong(blocking) + (b.recv != blocking.recv));
}

// The exchange keeps the seconds its caller is held up in it (the exposed all-to-all): a rank whose peers
// start late waits about as long in the counts' exchange; the rows' and the counts' start and wait add to it;
// reset clears it.
TEST(ExpertExchange, CountsTheSecondsItHoldsTheCallerUp) {
  auto world = MpiCommunicator::world();
  CommunicatorExchange exchange(*world);
  const int n = exchange.size(), me = exchange.rank();
  EXPECT_EQ(exchange.blocked_seconds(), 0.0);
  world->barrier();
  if (me == 0) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  std::vector<int64_t> send(size_t(n), 1), recv(size_t(n), 0);
  exchange.exchange_counts(send.data(), recv.data(), 1);
  const double counts = exchange.blocked_seconds();
  if (me != 0) {
    EXPECT_GE(counts, 0.05) << "rank " << me << " waited for rank 0's late start";
  }
  EXPECT_GT(counts, 0.0);
  std::vector<float> rows_out(size_t(n), static_cast<float>(me)), rows_in(size_t(n), -1.0f);
  exchange.exchange(rows_out.data(), send.data(), rows_in.data(), recv.data());
  EXPECT_GT(exchange.blocked_seconds(), counts);
  for (int q = 0; q < n; ++q) EXPECT_EQ(rows_in[size_t(q)], float(q));
  // The counts' start and finish forms: what exchange_counts gives, and their time counted too.
  std::vector<int64_t> pairs_out, pairs_in(size_t(2 * n), -1), pairs_blocking(size_t(2 * n), -1);
  for (int q = 0; q < n; ++q) pairs_out.push_back(100 * me + q), pairs_out.push_back(-(100 * me + q));
  const double before = exchange.blocked_seconds();
  exchange.finish(exchange.start_counts(pairs_out.data(), pairs_in.data(), 2));
  EXPECT_GT(exchange.blocked_seconds(), before);
  exchange.exchange_counts(pairs_out.data(), pairs_blocking.data(), 2);
  EXPECT_EQ(pairs_in, pairs_blocking);
  for (int q = 0; q < n; ++q) EXPECT_EQ(pairs_in[size_t(2 * q)], 100 * q + me);
  exchange.reset_blocked_seconds();
  EXPECT_EQ(exchange.blocked_seconds(), 0.0);
}

// Rows this rank routes to global expert e: (me + 2 e) % 4 of them, zero for some (source, expert) pairs.
int64_t rows_for(int source, int64_t expert) { return (source + 2 * expert) % 4; }

constexpr int64_t kWidth = 3;

// Token-side value of row k (within its expert block) for expert e from source q, column c.
float token_value(int q, int64_t e, int64_t k, int64_t c) { return float(q * 100000 + e * 1000 + k * 10 + c); }

TEST(ExpertExchange, DispatcherStartFinishEqualsBlockingAndCombineIsItsAdjoint) {
  auto world = MpiCommunicator::world();
  CommunicatorExchange exchange(*world);
  const int n = exchange.size(), me = exchange.rank();
  const int64_t local = 2, experts = local * n;
  const auto backend = make_cpu_backend(1);
  const auto made = make_dispatcher<float>(DispatcherKind::AllToAll, *backend, experts, n);
  Dispatcher<float>& dispatcher = *made;
  dispatcher.set_exchange(&exchange);
  std::vector<int64_t> expert_offset(experts + 1, 0);
  for (int64_t e = 0; e < experts; ++e) expert_offset[e + 1] = expert_offset[e] + rows_for(me, e);
  ExchangePlan plan;
  dispatcher.plan(expert_offset, plan);
  const int64_t token_rows = expert_offset[experts];
  std::vector<float> tokens(token_rows * kWidth);
  for (int64_t e = 0; e < experts; ++e)
    for (int64_t k = 0; k < rows_for(me, e); ++k)
      for (int64_t c = 0; c < kWidth; ++c) tokens[(expert_offset[e] + k) * kWidth + c] = token_value(me, e, k, c);

  std::vector<float> blocking(plan.received * kWidth, -1.0f), started(plan.received * kWidth, -2.0f);
  dispatcher.dispatch(plan, tokens.data(), blocking.data(), kWidth);
  RowsInFlight<float> in_flight;
  dispatcher.start_dispatch(plan, tokens.data(), kWidth, in_flight);
  dispatcher.finish_dispatch(plan, in_flight, started.data(), kWidth);

  // Expert-major: for each local expert, the rows of source 0, then source 1, ..., in token order.
  int64_t wrong = blocking != started, row = 0;
  for (int64_t el = 0; el < local; ++el) {
    const int64_t e = me * local + el;
    for (int q = 0; q < n; ++q)
      for (int64_t k = 0; k < rows_for(q, e); ++k, ++row)
        for (int64_t c = 0; c < kWidth; ++c) wrong += started[row * kWidth + c] != token_value(q, e, k, c);
  }
  wrong += row != plan.received;

  // <dispatch(x), y> = <x, combine(y)>, combine through both forms.
  const std::vector<float> x = small_integers(token_rows * kWidth, me, 11);
  const std::vector<float> y = small_integers(plan.received * kWidth, me, 12);
  std::vector<float> dispatched(plan.received * kWidth), combined(token_rows * kWidth),
      combined_blocking(token_rows * kWidth);
  dispatcher.dispatch(plan, x.data(), dispatched.data(), kWidth);
  dispatcher.start_combine(plan, y.data(), combined.data(), kWidth, in_flight);
  dispatcher.finish_combine(plan, in_flight, kWidth);
  dispatcher.combine(plan, y.data(), combined_blocking.data(), kWidth);
  wrong += combined != combined_blocking;
  EXPECT_NONE_WRONG(wrong);
  EXPECT_EQ(sum_over_world(dot(dispatched, y)), sum_over_world(dot(x, combined)));
}

}  // namespace
}  // namespace moe
