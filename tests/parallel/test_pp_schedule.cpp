// Pipeline schedules as data (parallel/pp_schedule.h), without MPI: for 1..8 stages and 1..16 micro-batches
// every micro-batch is forwarded then backwarded exactly once on every stage, each send has its receive on
// the neighbouring stage (the same micro-batches in the same order), the schedule runs to the end with
// nonblocking sends and blocking receives, 1F1B keeps at most P - s micro-batches in flight on stage s, and
// its simulated bubble is (P - 1) / (m + P - 1).
#include <gtest/gtest.h>

#include <cmath>

#include "core/error.h"
#include "parallel/pp_schedule.h"

namespace moe {
namespace {

std::vector<int64_t> of_kind(const std::vector<PipeAction>& actions, PipeOp op) {
  std::vector<int64_t> mbs;
  for (const PipeAction& a : actions)
    if (a.op == op) mbs.push_back(a.micro_batch);
  return mbs;
}

void check_schedule(PipeSchedule schedule, int64_t P, int64_t m) {
  SCOPED_TRACE("stages " + std::to_string(P) + ", micro-batches " + std::to_string(m));
  for (int64_t s = 0; s < P; ++s) {
    const std::vector<PipeAction> a = pipeline_actions(schedule, P, s, m);
    std::vector<int64_t> forwarded_at(size_t(m), -1), backwarded_at(size_t(m), -1);
    for (size_t i = 0; i < a.size(); ++i) {
      if (a[i].op == PipeOp::Forward) {
        ASSERT_EQ(forwarded_at[size_t(a[i].micro_batch)], -1) << "forwarded twice";
        forwarded_at[size_t(a[i].micro_batch)] = int64_t(i);
      }
      if (a[i].op == PipeOp::Backward) {
        ASSERT_EQ(backwarded_at[size_t(a[i].micro_batch)], -1) << "backwarded twice";
        backwarded_at[size_t(a[i].micro_batch)] = int64_t(i);
      }
      // A receive comes right before the compute that needs it, a send right after the one that made it.
      if (a[i].op == PipeOp::RecvActivation) {
        EXPECT_EQ(a[i + 1], (PipeAction{PipeOp::Forward, a[i].micro_batch}));
      }
      if (a[i].op == PipeOp::SendGradient) {
        EXPECT_EQ(a[i - 1], (PipeAction{PipeOp::Backward, a[i].micro_batch}));
      }
    }
    for (int64_t mb = 0; mb < m; ++mb) {
      ASSERT_GE(forwarded_at[size_t(mb)], 0);
      EXPECT_LT(forwarded_at[size_t(mb)], backwarded_at[size_t(mb)]) << "micro-batch " << mb << ", stage " << s;
    }
    if (s == 0) {
      EXPECT_TRUE(of_kind(a, PipeOp::RecvActivation).empty() && of_kind(a, PipeOp::SendGradient).empty());
    }
    if (s == P - 1) {
      EXPECT_TRUE(of_kind(a, PipeOp::SendActivation).empty() && of_kind(a, PipeOp::RecvGradient).empty());
    }
    if (s + 1 < P) {  // what this stage sends is what the next receives, in the same order, and back
      const std::vector<PipeAction> b = pipeline_actions(schedule, P, s + 1, m);
      EXPECT_EQ(of_kind(a, PipeOp::SendActivation), of_kind(b, PipeOp::RecvActivation));
      EXPECT_EQ(of_kind(b, PipeOp::SendGradient), of_kind(a, PipeOp::RecvGradient));
    }
  }
}

TEST(PipeSchedule, EveryStageForwardsThenBackwardsEachMicroBatchAndSendsMatchReceives) {
  for (PipeSchedule schedule : {PipeSchedule::OneFOneB, PipeSchedule::GPipe})
    for (int64_t P = 1; P <= 8; ++P)
      for (int64_t m = 1; m <= 16; ++m) check_schedule(schedule, P, m);
}

TEST(PipeSchedule, OneFOneBRunsToTheEndWithBoundedActivationsAndTheKnownBubble) {
  for (int64_t P = 1; P <= 8; ++P)
    for (int64_t m = 1; m <= 16; ++m) {
      SCOPED_TRACE("stages " + std::to_string(P) + ", micro-batches " + std::to_string(m));
      std::vector<int64_t> peak;
      const double f = 1.0, b = 2.0;
      const double makespan = simulate_schedule(PipeSchedule::OneFOneB, P, m, f, b, &peak);
      ASSERT_GT(makespan, 0) << "deadlock";
      for (int64_t s = 0; s < P; ++s) EXPECT_LE(peak[size_t(s)], std::min(P - s, m)) << "stage " << s;
      EXPECT_EQ(peak[0], std::min(P, m));
      const double bubble = 1.0 - double(m) * (f + b) / makespan;
      EXPECT_NEAR(bubble, double(P - 1) / double(m + P - 1), 1e-12);
    }
}

// With each stage's own times (bench_pp simulates its measured ones): the slowest stage sets the pace, so in
// the steady state the step takes m times the slowest stage's forward and backward, plus the fill and drain.
TEST(PipeSchedule, UnequalStagesArePacedByTheSlowest) {
  EXPECT_EQ(simulate_schedule(PipeSchedule::OneFOneB, 8, {1.0, 1.0, 1.0}, {2.0, 2.0, 2.0}),
            simulate_schedule(PipeSchedule::OneFOneB, 3, 8, 1.0, 2.0));
  // Two stages, the last one half again as slow: it is never idle after its first forward.
  const double makespan = simulate_schedule(PipeSchedule::OneFOneB, 8, {1.0, 1.5}, {2.0, 3.0});
  EXPECT_DOUBLE_EQ(makespan, 1.0 + 8 * (1.5 + 3.0) + 2.0);
  EXPECT_GT(makespan, simulate_schedule(PipeSchedule::OneFOneB, 2, 8, 1.0, 2.0));
}

TEST(PipeSchedule, GPipeKeepsEveryMicroBatchInFlightOnTheFirstStage) {
  std::vector<int64_t> peak;
  ASSERT_GT(simulate_schedule(PipeSchedule::GPipe, 4, 8, 1.0, 2.0, &peak), 0);
  EXPECT_EQ(peak[0], 8);
}

TEST(PipeSchedule, DescribedAsOneLinePerStage) {
  EXPECT_EQ(describe_schedule(PipeSchedule::OneFOneB, 2, 3),
            "stage 0: F0 F1 B0 F2 B1 B2\nstage 1: F0 B0 F1 B1 F2 B2\n");
}

TEST(PipeStages, EvenlyOrByCountsAndRefusedWhenTheyDoNotFit) {
  using Ranges = std::vector<std::pair<int64_t, int64_t>>;
  EXPECT_EQ(stage_layers(8, 4), (Ranges{{0, 2}, {2, 4}, {4, 6}, {6, 8}}));
  EXPECT_EQ(stage_layers(5, 1), (Ranges{{0, 5}}));
  EXPECT_EQ(stage_layers(7, 3, {3, 3, 1}), (Ranges{{0, 3}, {3, 6}, {6, 7}}));
  EXPECT_THROW(stage_layers(7, 2), Error);             // 2 does not divide 7
  EXPECT_THROW(stage_layers(7, 2, {3, 3}), Error);     // sums to 6
  EXPECT_THROW(stage_layers(7, 3, {4, 3}), Error);     // two counts for three stages
  EXPECT_THROW(stage_layers(7, 3, {7, 0, 0}), Error);  // an empty stage
  try {
    stage_layers(7, 2);
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("parallel.pp_layers"), std::string::npos) << e.message();
  }
}

TEST(PipeSchedule, RefusesEmptyPipelines) {
  EXPECT_THROW(pipeline_actions(PipeSchedule::OneFOneB, 0, 0, 4), Error);
  EXPECT_THROW(pipeline_actions(PipeSchedule::OneFOneB, 2, 0, 0), Error);
  EXPECT_THROW(pipeline_actions(PipeSchedule::OneFOneB, 2, 2, 4), Error);
}

}  // namespace
}  // namespace moe
