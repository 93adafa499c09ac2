// The dispatchers against each other (core/moe/dispatcher.h, docs/parallel.md "Dispatchers") at any number of
// ranks (ctest runs 2 and 4), on the memory-checking backend with plane-checked communicators (backend memory
// only over the data plane, host memory only over the control plane): for the same routing, the all-gather
// dispatcher's plan gives the experts the same blocks as the all-to-all's, its dispatch the same rows bit for bit,
// its combine (a reduce-scatter over -0.0 elsewhere) every token's rows back bit for bit (-0.0, infinities and
// NaN included), blocking and start/finish forms alike; with every expert fed (dropless), with experts and
// ranks that receive nothing (capacity drops), and with a rank that routes nothing at all.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "core/backend/memory_check.h"
#include "core/moe/dispatcher.h"
#include "parallel/mpi_communicator.h"
#include "parallel/plane_check.h"
#include "parallel/process_groups.h"
#include "tests/parallel/collective_checks.h"

namespace moe {
namespace {

using namespace ::moe::comm_test;

constexpr int64_t kWidth = 3;

// Rows source `q` routes to global expert `e`.
using RowsFor = std::function<int64_t(int q, int64_t e)>;

// The bits of a float, so that -0.0 and NaN compare as what they are.
uint32_t bits(float v) {
  uint32_t b;
  std::memcpy(&b, &v, sizeof b);
  return b;
}

// Wrong elements summed over the ranks: none.
void expect_none_wrong(int64_t wrong, const std::string& what) {
  EXPECT_EQ(sum_over_world(wrong), 0) << what << ": wrong elements, summed over ranks (this rank: " << wrong << ")";
}

int64_t differing_bits(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return 1;
  int64_t wrong = 0;
  for (size_t i = 0; i < a.size(); ++i) wrong += bits(a[i]) != bits(b[i]);
  return wrong;
}

// Token-side values of `rows` rows: distinct per rank and row, with a -0.0, an infinity and a NaN among them.
std::vector<float> token_values(int me, int64_t rows, int salt) {
  std::vector<float> v(size_t(rows * kWidth));
  for (size_t i = 0; i < v.size(); ++i) v[i] = float(me * 100000 + salt * 10000 + int64_t(i)) * 0.25f - 7.0f;
  if (v.size() > 2) v[0] = -0.0f, v[1] = std::numeric_limits<float>::infinity(), v[2] = std::nanf("7");
  return v;
}

struct Side {
  ExchangePlan plan;
  std::vector<float> expert_rows, expert_rows_started, token_rows, token_rows_started;
};

// Plans, dispatches `tokens` and combines `outputs` (per this rank's expert rows: generated when empty) with one
// dispatcher, through the blocking and the start/finish forms.
Side run(MemoryCheckBackend& backend, ExpertExchange& exchange, DispatcherKind kind, int64_t experts,
         const std::vector<int64_t>& expert_offset, const std::vector<float>& tokens, int salt) {
  const auto dispatcher = make_dispatcher<float>(kind, backend, experts, exchange.size());
  dispatcher->set_exchange(&exchange);
  Side s;
  dispatcher->finish_plan(dispatcher->start_plan(expert_offset, s.plan), s.plan);
  const int64_t M = expert_offset.back(), R = s.plan.received;
  Buffer x = backend.upload(tokens), xe = backend.allocate(DType::F32, R * kWidth),
         xe2 = backend.allocate(DType::F32, R * kWidth);
  dispatcher->dispatch(s.plan, x.data<float>(), xe.data<float>(), kWidth);
  RowsInFlight<float> in_flight;
  dispatcher->start_dispatch(s.plan, x.data<float>(), kWidth, in_flight);
  dispatcher->finish_dispatch(s.plan, in_flight, xe2.data<float>(), kWidth);
  s.expert_rows = backend.download<float>(xe), s.expert_rows_started = backend.download<float>(xe2);

  // The experts' outputs: a function of the rank and the row's place among the expert rows, like an expert's.
  Buffer ye = backend.upload(token_values(exchange.rank(), R, salt)), y = backend.allocate(DType::F32, M * kWidth),
         y2 = backend.allocate(DType::F32, M * kWidth);
  dispatcher->combine(s.plan, ye.data<float>(), y.data<float>(), kWidth);
  dispatcher->start_combine(s.plan, ye.data<float>(), y2.data<float>(), kWidth, in_flight);
  dispatcher->finish_combine(s.plan, in_flight, kWidth);
  s.token_rows = backend.download<float>(y), s.token_rows_started = backend.download<float>(y2);
  return s;
}

// Both dispatchers over one routing: the same plan for the experts, the same rows both ways.
void check_against_each_other(const RowsFor& rows_for, const std::string& what) {
  auto world = MpiCommunicator::world();
  const auto backend = make_memory_check_backend(1);
  const auto data = make_plane_check(Plane::Data, *world, memory_view(*backend));
  const auto control = make_plane_check(Plane::Control, *world, memory_view(*backend));
  CommunicatorExchange exchange(*control, *data);
  const int n = exchange.size(), me = exchange.rank();
  const int64_t local = 2, experts = local * n;
  std::vector<int64_t> expert_offset(size_t(experts + 1), 0);
  for (int64_t e = 0; e < experts; ++e) expert_offset[e + 1] = expert_offset[e] + rows_for(me, e);
  const std::vector<float> tokens = token_values(me, expert_offset.back(), 1);

  const Side a = run(*backend, exchange, DispatcherKind::AllToAll, experts, expert_offset, tokens, 2);
  const Side g = run(*backend, exchange, DispatcherKind::AllGather, experts, expert_offset, tokens, 2);
  int64_t wrong = a.plan.received != g.plan.received || a.plan.local_offset != g.plan.local_offset ||
                  a.plan.recv_count != g.plan.recv_count || a.plan.token_rows != g.plan.token_rows;
  // Rows for expert el from source q, in token order, expert-major.
  int64_t expected_received = 0;
  for (int q = 0; q < n; ++q)
    for (int64_t el = 0; el < local; ++el) expected_received += rows_for(q, me * local + el);
  wrong += g.plan.received != expected_received;
  wrong += differing_bits(a.expert_rows, g.expert_rows) + differing_bits(g.expert_rows, g.expert_rows_started);
  wrong += differing_bits(a.token_rows, g.token_rows) + differing_bits(g.token_rows, g.token_rows_started);
  wrong += differing_bits(a.expert_rows, a.expert_rows_started) + differing_bits(a.token_rows, a.token_rows_started);
  expect_none_wrong(wrong, what);

  // Round trip: the rows dispatched, combined back unchanged, are the tokens' own (every row has one expert).
  const auto dispatcher = make_dispatcher<float>(DispatcherKind::AllGather, *backend, experts, n);
  dispatcher->set_exchange(&exchange);
  Buffer xe = backend->upload(g.expert_rows), back = backend->allocate(DType::F32, expert_offset.back() * kWidth);
  dispatcher->combine(g.plan, xe.data<float>(), back.data<float>(), kWidth);
  expect_none_wrong(differing_bits(backend->download<float>(back), tokens), what + ": round trip");
}

TEST(Dispatchers, EachKindIsTheDispatcherItsConfigValueNames) {
  const auto backend = make_memory_check_backend(1);
  EXPECT_STREQ(make_dispatcher<float>(DispatcherKind::AllToAll, *backend, 4, 2)->name(), "alltoall");
  EXPECT_STREQ(make_dispatcher<float>(DispatcherKind::AllGather, *backend, 4, 2)->name(), "allgather");
  EXPECT_FALSE(make_dispatcher<double>(DispatcherKind::AllGather, *backend, 4, 2)->ready()) << "no exchange yet";
  EXPECT_TRUE(make_dispatcher<double>(DispatcherKind::AllGather, *backend, 4, 1)->ready()) << "one rank needs none";
}

TEST(Dispatchers, DroplessEveryExpertFedFromEverySource) {
  check_against_each_other([](int q, int64_t e) { return int64_t(1 + (q + 3 * e) % 4); }, "dropless");
}

// Capacity drops: some (source, expert) pairs send nothing, and every expert of the last rank is empty.
TEST(Dispatchers, DropsLeaveExpertsAndRanksEmpty) {
  const int n = MpiCommunicator::world()->size();
  check_against_each_other([n](int q, int64_t e) { return e >= 2 * (n - 1) ? int64_t(0) : int64_t((q + 2 * e) % 3); },
                           "drops");
}

// One rank routes nothing at all (its block is all padding), another most of the rows.
TEST(Dispatchers, ARankWithoutRowsAndASkewedOne) {
  check_against_each_other([](int q, int64_t e) { return q == 0 ? int64_t(0) : q == 1 ? 7 + e : e % 2; }, "skewed");
}

// Nothing routed anywhere: both dispatchers move nothing.
TEST(Dispatchers, NothingRouted) {
  check_against_each_other([](int, int64_t) { return int64_t(0); }, "nothing");
}

}  // namespace
}  // namespace moe
