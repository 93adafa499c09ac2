// Interleaved 1F1B as data (parallel/pp_schedule.h), without MPI: for 2..6 stages, 2..4 chunks and micro-batch
// counts that are multiples of the stages, every (micro-batch, chunk) is forwarded then backwarded exactly once
// on every stage, what virtual stage v sends is what v + 1 (activations) or v - 1 (gradients) receives in the
// same order, the schedule runs to the end with nonblocking sends and blocking receives, its simulated bubble
// is (P - 1) / (V m + P - 1), at most the plain schedule's,
// one chunk gives plain 1F1B, messages between two ranks match in issue order (NCCL has no tags), and what it
// cannot run is refused naming parallel.vpp.
#include <gtest/gtest.h>

#include <map>
#include <tuple>

#include "core/error.h"
#include "parallel/pipeline.h"
#include "parallel/pp_schedule.h"

namespace moe {
namespace {

// The micro-batches of the actions of `op` on `chunk`, in order.
std::vector<int64_t> of_kind(const std::vector<PipeAction>& actions, PipeOp op, int64_t chunk) {
  std::vector<int64_t> mbs;
  for (const PipeAction& a : actions)
    if (a.op == op && a.chunk == chunk) mbs.push_back(a.micro_batch);
  return mbs;
}

void check_interleaved(int64_t P, int64_t V, int64_t m) {
  SCOPED_TRACE("stages " + std::to_string(P) + ", chunks " + std::to_string(V) + ", micro-batches " +
               std::to_string(m));
  std::vector<std::vector<PipeAction>> actions;
  for (int64_t s = 0; s < P; ++s) actions.push_back(pipeline_actions(PipeSchedule::OneFOneB, P, s, m, V));
  for (int64_t s = 0; s < P; ++s) {
    const std::vector<PipeAction>& a = actions[size_t(s)];
    std::map<std::pair<int64_t, int64_t>, size_t> forwarded, backwarded;  // (mb, chunk) -> index
    for (size_t i = 0; i < a.size(); ++i) {
      ASSERT_TRUE(a[i].chunk >= 0 && a[i].chunk < V);
      const std::pair<int64_t, int64_t> unit{a[i].micro_batch, a[i].chunk};
      if (a[i].op == PipeOp::Forward) {
        ASSERT_TRUE(forwarded.emplace(unit, i).second) << "forwarded twice";
      }
      if (a[i].op == PipeOp::Backward) {
        ASSERT_TRUE(backwarded.emplace(unit, i).second) << "backwarded twice";
      }
      if (a[i].op == PipeOp::RecvActivation) {
        EXPECT_EQ(a[i + 1], (PipeAction{PipeOp::Forward, a[i].micro_batch, a[i].chunk}));
      }
      if (a[i].op == PipeOp::RecvGradient) {
        EXPECT_EQ(a[i + 1], (PipeAction{PipeOp::Backward, a[i].micro_batch, a[i].chunk}));
      }
    }
    ASSERT_EQ(forwarded.size(), size_t(m * V));
    ASSERT_EQ(backwarded.size(), size_t(m * V));
    for (const auto& [unit, at] : forwarded) EXPECT_LT(at, backwarded.at(unit)) << unit.first << "." << unit.second;
  }
  // Virtual stage v = c * P + s: the first receives no activation, the last no gradient; each send has its
  // receive on the neighbouring virtual stage, in the same order.
  for (int64_t v = 0; v < P * V; ++v) {
    const std::vector<PipeAction>& a = actions[size_t(v % P)];
    const int64_t c = v / P;
    if (v == 0) {
      EXPECT_TRUE(of_kind(a, PipeOp::RecvActivation, c).empty() && of_kind(a, PipeOp::SendGradient, c).empty());
    }
    if (v == P * V - 1) {
      EXPECT_TRUE(of_kind(a, PipeOp::SendActivation, c).empty() && of_kind(a, PipeOp::RecvGradient, c).empty());
      continue;
    }
    const std::vector<PipeAction>& b = actions[size_t((v + 1) % P)];
    const int64_t d = (v + 1) / P;
    EXPECT_EQ(of_kind(a, PipeOp::SendActivation, c), of_kind(b, PipeOp::RecvActivation, d)) << "virtual stage " << v;
    EXPECT_EQ(of_kind(b, PipeOp::SendGradient, d), of_kind(a, PipeOp::RecvGradient, c)) << "virtual stage " << v;
    EXPECT_EQ(of_kind(a, PipeOp::SendActivation, c).size(), size_t(m));
  }
  EXPECT_GT(simulate_schedule(PipeSchedule::OneFOneB, P, m, 1.0, 2.0, nullptr, V), 0) << "deadlock";
}

// NCCL has no tags: between two ranks, messages match in the order they were issued. So what rank a sends to
// rank b (kind, micro-batch, receiving virtual stage) is, in order, what b receives from a, though with two
// stages activations and gradients share each direction.
void check_order_per_rank_pair(int64_t P, int64_t V, int64_t m) {
  using Message = std::tuple<int, int64_t, int64_t>;  // gradient?, micro-batch, receiving virtual stage
  std::map<std::pair<int64_t, int64_t>, std::vector<Message>> sent, received;  // by (from, to)
  for (int64_t s = 0; s < P; ++s)
    for (const PipeAction& a : pipeline_actions(PipeSchedule::OneFOneB, P, s, m, V)) {
      const int64_t v = virtual_stage(P, s, a.chunk);
      const int64_t up = (v + 1) % P, down = (v + P - 1) % P;
      if (a.op == PipeOp::SendActivation) sent[{s, up}].emplace_back(0, a.micro_batch, v + 1);
      if (a.op == PipeOp::SendGradient) sent[{s, down}].emplace_back(1, a.micro_batch, v - 1);
      if (a.op == PipeOp::RecvActivation) received[{down, s}].emplace_back(0, a.micro_batch, v);
      if (a.op == PipeOp::RecvGradient) received[{up, s}].emplace_back(1, a.micro_batch, v);
    }
  EXPECT_EQ(sent, received) << "stages " << P << ", chunks " << V << ", micro-batches " << m;
}

TEST(InterleavedSchedule, MessagesBetweenTwoRanksMatchInOrder) {
  for (int64_t P = 2; P <= 6; ++P)
    for (int64_t V = 1; V <= 4; ++V)
      for (int64_t m = P; m <= 4 * P; m += P) check_order_per_rank_pair(P, V, m);
}

TEST(InterleavedSchedule, EveryChunkForwardsThenBackwardsEachMicroBatchAndSendsMatchReceives) {
  for (int64_t P = 2; P <= 6; ++P)
    for (int64_t V = 2; V <= 4; ++V)
      for (int64_t m = P; m <= 4 * P; m += P) check_interleaved(P, V, m);
}

// Each chunk takes 1 / V of the stage's time, so the fill and the drain are P - 1 chunk times, not stage times.
TEST(InterleavedSchedule, BubbleShrinksByTheChunks) {
  for (int64_t P = 2; P <= 6; ++P)
    for (int64_t V = 1; V <= 4; ++V)
      for (int64_t m = P; m <= 4 * P; m += P) {
        SCOPED_TRACE("stages " + std::to_string(P) + ", chunks " + std::to_string(V) + ", micro-batches " +
                     std::to_string(m));
        const double f = 1.0 / double(V), b = 2.0 / double(V);
        const double makespan = simulate_schedule(PipeSchedule::OneFOneB, P, m, f, b, nullptr, V);
        ASSERT_GT(makespan, 0);
        const double bubble = 1.0 - double(m * V) * (f + b) / makespan;
        const double plain = double(P - 1) / double(m + P - 1);
        EXPECT_LE(bubble, plain + 1e-12);
        EXPECT_NEAR(bubble, double(P - 1) / double(V * m + P - 1), 1e-12);
      }
}

TEST(InterleavedSchedule, OneChunkIsPlainOneFOneB) {
  for (int64_t P = 1; P <= 6; ++P)
    for (int64_t m = 1; m <= 12; ++m)
      for (int64_t s = 0; s < P; ++s) {
        const std::vector<PipeAction> a = pipeline_actions(PipeSchedule::OneFOneB, P, s, m, 1);
        EXPECT_EQ(a, pipeline_actions(PipeSchedule::OneFOneB, P, s, m));
        for (const PipeAction& x : a) EXPECT_EQ(x.chunk, 0);
      }
}

TEST(InterleavedSchedule, DescribedWithTheChunks) {
  EXPECT_EQ(describe_schedule(PipeSchedule::OneFOneB, 2, 2, 2),
            "stage 0: F0.0 F1.0 F0.1 F1.1 B0.1 B1.1 B0.0 B1.0\n"
            "stage 1: F0.0 F1.0 F0.1 F1.1 B0.1 B1.1 B0.0 B1.0\n");
  // Four micro-batches: stage 0 warms up with (P - 1) * 2 + (V - 1) * P = 4 forwards, stage 1 with 2.
  EXPECT_EQ(describe_schedule(PipeSchedule::OneFOneB, 2, 4, 2),
            "stage 0: F0.0 F1.0 F0.1 F1.1 F2.0 B0.1 F3.0 B1.1 F2.1 B0.0 F3.1 B1.0 B2.1 B3.1 B2.0 B3.0\n"
            "stage 1: F0.0 F1.0 F0.1 B0.1 F1.1 B1.1 F2.0 B0.0 F3.0 B1.0 F2.1 B2.1 F3.1 B3.1 B2.0 B3.0\n");
}

// The slots a chunk needs: the most of its micro-batches in flight at once, never more than m.
TEST(InterleavedSchedule, SlotsPerChunk) {
  for (int64_t P = 2; P <= 4; ++P)
    for (int64_t V = 2; V <= 3; ++V)
      for (int64_t m = P; m <= 3 * P; m += P)
        for (int64_t s = 0; s < P; ++s) {
          int64_t total = 0;
          for (int64_t c = 0; c < V; ++c) {
            const int64_t slots = pipeline_slots(PipeSchedule::OneFOneB, P, s, m, V, c);
            EXPECT_TRUE(slots >= 1 && slots <= m) << P << " " << V << " " << m << " " << s << " " << c;
            total += slots;
          }
          std::vector<int64_t> peak;
          ASSERT_GT(simulate_schedule(PipeSchedule::OneFOneB, P, m, 1.0, 2.0, &peak, V), 0);
          EXPECT_LE(peak[size_t(s)], total);
        }
}

TEST(InterleavedSchedule, RefusedWhereItCannotRun) {
  const auto refused = [](PipeSchedule schedule, int64_t P, int64_t m, int64_t V) {
    try {
      pipeline_actions(schedule, P, 0, m, V);
    } catch (const Error& e) {
      return e.message().find("parallel.vpp") != std::string::npos;
    }
    return false;
  };
  EXPECT_TRUE(refused(PipeSchedule::OneFOneB, 2, 4, 0));  // no chunk
  EXPECT_TRUE(refused(PipeSchedule::GPipe, 2, 4, 2));     // interleaving is a 1F1B
  EXPECT_TRUE(refused(PipeSchedule::OneFOneB, 1, 4, 2));  // one stage
  EXPECT_TRUE(refused(PipeSchedule::OneFOneB, 2, 3, 2));  // 3 micro-batches, not a multiple of 2 stages
  EXPECT_TRUE(refused(PipeSchedule::OneFOneB, 4, 6, 2));
  EXPECT_FALSE(refused(PipeSchedule::OneFOneB, 4, 8, 2));
}

}  // namespace
}  // namespace moe
